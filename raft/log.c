/* The in-memory Raft log after the latest snapshot.
 *
 * Entries live in one array, contiguous, so a range of the log is one pointer
 * (a ready's entries, an AppendEntries batch). Appending moves the live window
 * to the front of the array or grows it (doubling) only when the tail is full,
 * so appends are amortised O(1) and steady state allocates nothing. Every entry
 * holds one reference on its payload blob; truncation and compaction drop it. */
#include <string.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/err.h"
#include "raft/raft_internal.h"

void raft__log_init(struct raft__log *l)
{
    memset(l, 0, sizeof(*l));
}

void raft__log_free(struct raft__log *l)
{
    for (size_t i = 0; i < l->n; i++)
        tk_blob_unref(l->ents[l->head + i].data);
    tk_array_free(l->ents, l->cap * sizeof(*l->ents));
    memset(l, 0, sizeof(*l));
}

uint64_t raft__log_last_index(const struct raft__log *l)
{
    return l->base_index + l->n;
}

uint64_t raft__log_last_term(const struct raft__log *l)
{
    return l->n == 0 ? l->base_term : l->ents[l->head + l->n - 1].term;
}

int raft__log_term(const struct raft__log *l, uint64_t index, uint64_t *term)
{
    *term = 0;
    if (index == l->base_index) {
        *term = l->base_term;
        return 0;
    }
    if (index < l->base_index)
        return TK_ECOMPACTED;
    if (index > l->base_index + l->n)
        return TK_EUNAVAIL;
    *term = l->ents[l->head + (index - l->base_index - 1)].term;
    return 0;
}

uint64_t raft__log_term_or0(const struct raft__log *l, uint64_t index)
{
    uint64_t t;
    return raft__log_term(l, index, &t) == 0 ? t : 0;
}

struct raft_entry *raft__log_at(const struct raft__log *l, uint64_t index)
{
    if (index <= l->base_index || index > l->base_index + l->n)
        return NULL;
    return &l->ents[l->head + (index - l->base_index - 1)];
}

void raft__log_append(struct raft__log *l, const struct raft_entry *e, size_t n)
{
    if (n == 0)
        return;
    TK_ASSERT(e[0].index == raft__log_last_index(l) + 1);
    if (l->head + l->n + n > l->cap) {
        /* Move the live entries to the front or grow, either way leaving half
         * the array free: amortized O(1), and no memmove per append when the
         * log stays near the array's size. */
        if (l->n + n <= l->cap / 2) {
            size_t head;
            l->ents = tk_array_shift(l->ents, l->cap * sizeof(*l->ents), sizeof(*l->ents),
                                     l->head, l->n, &head);
            l->head = head;
        }
        if (l->head + l->n + n > l->cap) {
            size_t cap = l->cap ? l->cap : 64;
            while (cap < 2 * (l->n + n) || cap < l->head + l->n + n)
                cap *= 2;
            raft__log_reserve(l, cap); /* cap > l->cap here */
        }
    }
    for (size_t i = 0; i < n; i++) {
        struct raft_entry *d = &l->ents[l->head + l->n + i];
        *d = e[i];
        d->data = tk_blob_ref(e[i].data);
    }
    l->n += n;
}

/* Grows the array without copying it: from TK_ARRAY_MAPPED_MIN a mapping of
 * its own, moved by remapping its pages (tk_array_grow), and the live
 * entries keep their offset (head). A malloc and a copy of 1.6M entries held
 * every node's loop 136-160 ms of CPU at once at 5.6M keys. */
void raft__log_reserve(struct raft__log *l, size_t cap)
{
    if (cap <= l->cap)
        return;
    l->ents = tk_array_grow(l->ents, l->cap * sizeof(*l->ents), cap * sizeof(*l->ents));
    l->cap = cap;
}

void raft__log_truncate(struct raft__log *l, uint64_t index)
{
    TK_ASSERT(index > l->base_index);
    uint64_t last = raft__log_last_index(l);
    if (index > last)
        return;
    size_t keep = (size_t)(index - l->base_index - 1);
    for (size_t i = keep; i < l->n; i++)
        tk_blob_unref(l->ents[l->head + i].data);
    l->n = keep;
}

size_t raft__log_compact(struct raft__log *l, uint64_t index, struct tk_blob **out)
{
    if (index <= l->base_index)
        return 0;
    TK_ASSERT(index <= raft__log_last_index(l));
    size_t drop = (size_t)(index - l->base_index);
    uint64_t term = l->ents[l->head + drop - 1].term;
    for (size_t i = 0; i < drop; i++) {
        if (out != NULL)
            out[i] = l->ents[l->head + i].data; /* the caller's reference now */
        else
            tk_blob_unref(l->ents[l->head + i].data);
    }
    l->head += drop;
    l->n -= drop;
    l->base_index = index;
    l->base_term = term;
    if (l->n == 0)
        l->head = 0;
    return drop;
}

void raft__log_reset_into(struct raft__log *l, uint64_t index, uint64_t term,
                          struct raft__log *keep)
{
    if (l->n > 0 && keep->ents == NULL) {
        *keep = *l;
        raft__log_init(l);
        raft__log_reserve(l, keep->cap); /* the room it had, without its pages */
    }
    raft__log_reset(l, index, term);
}

void raft__log_reset(struct raft__log *l, uint64_t index, uint64_t term)
{
    for (size_t i = 0; i < l->n; i++)
        tk_blob_unref(l->ents[l->head + i].data);
    l->head = 0;
    l->n = 0;
    l->base_index = index;
    l->base_term = term;
}
