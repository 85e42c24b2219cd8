/* The memory volume: the store interface with entries and metadata in memory.
 *
 * A struct store_mem_volume plays the disk: it outlives the stores opened on
 * it, so tests and the probe can close and reopen a node, and
 * store_mem_volume_crash() drops what was written but not synced, as power
 * loss would. Entries hold references on the caller's immutable payload blobs
 * (no copies); reads hand out new references. `synced` is the number of
 * entries (from the volume's first) a sync has covered; truncation lowers it.
 * Each sync may sleep mem_sync_latency_us to model a device: that sleep is the
 * device's latency, not a wait for another thread.
 *
 * The volume's mutex is the backend's index lock: readers and the writer take
 * it for each operation. */
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/err.h"
#include "store/store_internal.h"

struct store_mem_volume {
    pthread_mutex_t mu;
    bool open;
    struct raft_entry *mem; /* the allocation: cap entries */
    size_t head;            /* compacted slots at its front */
    struct raft_entry *e;   /* mem + head: e[0] has index `first` */
    size_t n, cap;
    size_t synced;  /* e[0..synced) survive a crash */
    uint64_t first; /* index of e[0] (the log's first index) */
    uint64_t bytes; /* payload bytes of e[0..n) */
    uint64_t prev_term;
    struct store_meta_state meta;
};

struct store_mem_volume *store_mem_volume_new(void)
{
    struct store_mem_volume *v = tk_calloc(1, sizeof(*v));
    pthread_mutex_init(&v->mu, NULL);
    v->first = 1;
    return v;
}

/* Moves the live entries to the front of a new array of cap entries (cap >=
 * v->n). The caller holds v->mu. */
static void regrow(struct store_mem_volume *v, size_t cap)
{
    struct raft_entry *mem = tk_malloc(cap * sizeof(*mem));
    if (v->n > 0)
        memcpy(mem, v->e, v->n * sizeof(*v->e));
    tk_free(v->mem);
    v->mem = mem;
    v->e = mem;
    v->head = 0;
    v->cap = cap;
}

void store_mem_volume_reserve(struct store_mem_volume *v, size_t cap)
{
    pthread_mutex_lock(&v->mu);
    if (cap > v->cap)
        regrow(v, cap);
    pthread_mutex_unlock(&v->mu);
}

static void drop_from(struct store_mem_volume *v, size_t k)
{
    for (size_t i = k; i < v->n; i++) {
        v->bytes -= v->e[i].data != NULL ? v->e[i].data->len : 0;
        tk_blob_unref(v->e[i].data);
    }
    if (k < v->n)
        v->n = k;
    if (v->synced > v->n)
        v->synced = v->n;
}

void store_mem_volume_free(struct store_mem_volume *v)
{
    if (v == NULL)
        return;
    TK_ASSERT(!v->open);
    drop_from(v, 0);
    tk_free(v->mem);
    pthread_mutex_destroy(&v->mu);
    tk_free(v);
}

void store_mem_volume_crash(struct store_mem_volume *v)
{
    pthread_mutex_lock(&v->mu);
    TK_ASSERT(!v->open);
    drop_from(v, v->synced);
    pthread_mutex_unlock(&v->mu);
}

static struct store_mem_volume *vol(struct store *s)
{
    return s->be;
}

static int mem_write(struct store *s, const struct store__span *spans, size_t nspans)
{
    struct store_mem_volume *v = vol(s);
    pthread_mutex_lock(&v->mu);
    uint64_t lo = spans[0].e[0].index;
    TK_ASSERT(lo >= v->first);
    TK_ASSERT(lo <= v->first + v->n);
    drop_from(v, (size_t)(lo - v->first));
    size_t total = 0;
    for (size_t i = 0; i < nspans; i++)
        total += spans[i].n;
    if (v->head + v->n + total > v->cap) {
        /* Move the live entries to the front or grow, either way leaving
         * half the array free: amortized O(1) per entry. */
        if (v->n + total <= v->cap / 2) {
            memmove(v->mem, v->e, v->n * sizeof(*v->e));
        } else {
            size_t cap = v->cap ? v->cap : 64;
            while (cap < 2 * (v->n + total))
                cap *= 2;
            regrow(v, cap);
        }
        v->head = 0;
        v->e = v->mem;
    }
    for (size_t i = 0; i < nspans; i++) {
        for (size_t j = 0; j < spans[i].n; j++) {
            struct raft_entry *d = &v->e[v->n++];
            *d = spans[i].e[j];
            TK_ASSERT(d->index == v->first + v->n - 1);
            d->data = tk_blob_ref(spans[i].e[j].data);
            v->bytes += d->data != NULL ? d->data->len : 0;
        }
    }
    pthread_mutex_unlock(&v->mu);
    return 0;
}

static int mem_sync(struct store *s)
{
    struct store_mem_volume *v = vol(s);
    uint32_t us = s->opts.mem_sync_latency_us;
    if (us > 0) {
        struct timespec ts = {.tv_sec = us / 1000000,
                              .tv_nsec = (long)(us % 1000000) * 1000};
        nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&v->mu);
    v->synced = v->n;
    pthread_mutex_unlock(&v->mu);
    return 0;
}

static int mem_truncate(struct store *s, uint64_t index)
{
    struct store_mem_volume *v = vol(s);
    pthread_mutex_lock(&v->mu);
    drop_from(v, (size_t)(index - v->first));
    pthread_mutex_unlock(&v->mu);
    return 0;
}

/* The log now starts after (index, term), in memory and in the meta. The
 * caller holds v->mu. */
static void log_starts_after(struct store_mem_volume *v, uint64_t index, uint64_t term)
{
    v->first = index + 1;
    v->prev_term = term;
    v->meta.has_log_start = true;
    v->meta.log_first = v->first;
    v->meta.log_prev_term = term;
}

static int mem_compact(struct store *s, uint64_t index, uint64_t term)
{
    struct store_mem_volume *v = vol(s);
    pthread_mutex_lock(&v->mu);
    size_t k = (size_t)(index + 1 - v->first);
    TK_ASSERT(k <= v->n);
    for (size_t i = 0; i < k; i++) {
        v->bytes -= v->e[i].data != NULL ? v->e[i].data->len : 0;
        tk_blob_unref(v->e[i].data);
    }
    /* O(k): the survivors stay where they are. */
    v->head += k;
    v->e += k;
    v->n -= k;
    v->synced = v->synced > k ? v->synced - k : 0;
    log_starts_after(v, index, term);
    pthread_mutex_unlock(&v->mu);
    return 0;
}

static int mem_reset(struct store *s, uint64_t index, uint64_t term)
{
    struct store_mem_volume *v = vol(s);
    pthread_mutex_lock(&v->mu);
    drop_from(v, 0);
    log_starts_after(v, index, term);
    pthread_mutex_unlock(&v->mu);
    return 0;
}

static void mem_bounds(struct store *s, uint64_t *first, uint64_t *last)
{
    struct store_mem_volume *v = vol(s);
    pthread_mutex_lock(&v->mu);
    *first = v->first;
    *last = v->first + v->n - 1;
    pthread_mutex_unlock(&v->mu);
}

static uint64_t mem_log_bytes(struct store *s)
{
    struct store_mem_volume *v = vol(s);
    pthread_mutex_lock(&v->mu);
    uint64_t b = v->bytes + v->n * sizeof(*v->e);
    pthread_mutex_unlock(&v->mu);
    return b;
}

static int mem_term_at(struct store *s, uint64_t index, uint64_t *term)
{
    struct store_mem_volume *v = vol(s);
    int rc = 0;
    *term = 0;
    pthread_mutex_lock(&v->mu);
    if (index + 1 < v->first)
        rc = TK_ECOMPACTED;
    else if (index >= v->first + v->n)
        rc = TK_EUNAVAIL;
    else if (index + 1 == v->first)
        *term = v->prev_term;
    else
        *term = v->e[index - v->first].term;
    pthread_mutex_unlock(&v->mu);
    return rc;
}

static int mem_read(struct store *s, uint64_t lo, uint64_t hi, uint64_t max_bytes,
                    struct raft_entry **out, size_t *n)
{
    struct store_mem_volume *v = vol(s);
    int rc = 0;
    pthread_mutex_lock(&v->mu);
    if (lo < v->first) {
        rc = TK_ECOMPACTED;
        goto out;
    }
    if (hi > v->first + v->n) {
        rc = TK_EUNAVAIL;
        goto out;
    }
    size_t count = (size_t)(hi - lo);
    if (count == 0)
        goto out;
    struct raft_entry *r = tk_malloc(count * sizeof(*r));
    uint64_t bytes = 0;
    size_t k = 0;
    while (k < count) {
        r[k] = v->e[lo - v->first + k];
        r[k].data = tk_blob_ref(r[k].data);
        bytes += r[k].data != NULL ? r[k].data->len : 0;
        k++;
        if (max_bytes != 0 && bytes >= max_bytes)
            break;
    }
    *out = r;
    *n = k;
out:
    pthread_mutex_unlock(&v->mu);
    if (rc != 0)
        store__err(s, rc, "read %llu..%llu: outside the log", (unsigned long long)lo,
                   (unsigned long long)hi);
    return rc;
}

static int mem_save_meta(struct store *s, const struct store_meta_state *st,
                         unsigned mask)
{
    struct store_mem_volume *v = vol(s);
    pthread_mutex_lock(&v->mu);
    if (mask & STORE_META_HARD_STATE)
        v->meta.hard_state = st->hard_state;
    if (mask & STORE_META_SNAPSHOT)
        v->meta.snapshot = st->snapshot;
    if (mask & STORE_META_PENDING)
        v->meta.pending = st->pending;
    if (mask & STORE_META_BOOTSTRAP) {
        v->meta.has_bootstrap = st->has_bootstrap;
        v->meta.bootstrap = st->bootstrap;
    }
    if (mask & STORE_META_IDS) {
        v->meta.cluster_id = st->cluster_id;
        v->meta.node_id = st->node_id;
        v->meta.has_incarnation = st->has_incarnation;
        memcpy(v->meta.incarnation, st->incarnation, sizeof(st->incarnation));
    }
    pthread_mutex_unlock(&v->mu);
    return 0;
}

static void mem_close(struct store *s)
{
    struct store_mem_volume *v = vol(s);
    pthread_mutex_lock(&v->mu);
    v->open = false;
    pthread_mutex_unlock(&v->mu);
}

static const struct store__ops mem_ops = {
    .write = mem_write,
    .sync = mem_sync,
    .truncate = mem_truncate,
    .compact = mem_compact,
    .reset = mem_reset,
    .idle = NULL,
    .bounds = mem_bounds,
    .log_bytes = mem_log_bytes,
    .term_at = mem_term_at,
    .read = mem_read,
    .save_meta = mem_save_meta,
    .close = mem_close,
};

int store_open_mem(struct store_mem_volume *v, const struct store_options *o,
                   struct store **out, struct store_boot *boot, char *errmsg,
                   size_t errmsg_len)
{
    pthread_mutex_lock(&v->mu);
    if (v->open) {
        pthread_mutex_unlock(&v->mu);
        return store__errbuf(errmsg, errmsg_len, TK_EBUSY,
                             "memory volume is already open");
    }
    v->open = true;
    pthread_mutex_unlock(&v->mu);
    struct store *s = store__alloc(o);
    s->ops = &mem_ops;
    s->be = v;
    s->inline_sync = s->opts.mem_sync_latency_us == 0;
    pthread_mutex_lock(&v->mu);
    s->meta = v->meta;
    pthread_mutex_unlock(&v->mu);
    int rc = store__start(s);
    if (rc != 0) {
        mem_close(s);
        store__free(s);
        return store__errbuf(errmsg, errmsg_len, rc, "cannot start the storage thread");
    }
    store__fill_boot(s, boot);
    *out = s;
    return 0;
}
