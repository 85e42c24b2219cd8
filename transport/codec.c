/* The codec: struct raft_message <-> tierkv.RaftMessage (proto/tierkv.proto).
 *
 * The only code in tierkv that knows protobuf-c for Raft messages. Encoding
 * builds the protobuf-c structs in reusable scratch memory, pointing at the
 * caller's payload bytes, and packs them once. Decoding unpacks with an arena
 * allocator: small allocations are bumped out of chunks kept between messages
 * (no malloc per field), and allocations of CODEC_BLOB_MIN bytes or more, which
 * are the bytes fields worth sharing, are made as tk_blobs so the decoded
 * entries reference them instead of copying again. The arena is capped per
 * message (CODEC_ARENA_RATIO x the input + CODEC_ARENA_SLACK) so a hostile frame
 * cannot make the decoder allocate without bound.
 *
 * Every check on decoded input returns TK_EPROTO; nothing here asserts on bytes
 * from the network. Encoder and decoder objects are owned by one thread. */
#include <stddef.h>
#include <string.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/blob.h"
#include "base/err.h"
#include "transport/transport_internal.h"

#define CODEC_BLOB_MIN 256u
#define CODEC_CHUNK_BYTES (64u << 10)
#define CODEC_ARENA_RATIO 16u
#define CODEC_ARENA_SLACK (64u << 10)

_Static_assert((int)TIERKV__ENTRY__TYPE__CONFIG == (int)RAFT_ENTRY_CONFIG,
               "entry types map one to one");
_Static_assert(TIERKV__RAFT_MESSAGE__BODY_READ_INDEX_RESP == RAFT_MSG_READ_INDEX_RESP + 3,
               "body case = raft_msg_type + 3");

/* ---- Encoding ---- */

/* Upper bounds of packed sizes, every varint at its 10-byte maximum:
 * a scalar field is a 1-byte tag plus 10; a length-delimited one a 1-byte tag,
 * a 10-byte length and its contents. Checked against protobuf-c's exact size
 * with all-ones values in tests/unit/transport/codec_test.c. */
#define BOUND_FIELD 11u
#define BOUND_ENVELOPE (3u * BOUND_FIELD + BOUND_FIELD) /* from, to, term, body */
#define BOUND_SMALL_BODY (5u * BOUND_FIELD)             /* at most 5 scalars */
#define BOUND_ENTRY (BOUND_FIELD + 5u * BOUND_FIELD)    /* header, 4 scalars, data */
#define BOUND_META                                                                       \
    (BOUND_FIELD + 2u * BOUND_FIELD + 2u * BOUND_FIELD +                                 \
     RAFT_VOTERS_MAX * 10u)                            /* index, term, voters */
#define BOUND_SNAPSHOT (BOUND_META + 4u * BOUND_FIELD) /* offset, done, total, data */

void codec__enc_init(struct codec_enc *e)
{
    memset(e, 0, sizeof(*e));
}

void codec__enc_destroy(struct codec_enc *e)
{
    tk_free(e->ents);
    tk_free(e->ent_ptrs);
    memset(e, 0, sizeof(*e));
}

static void enc_meta(struct codec_enc *e, const struct raft_snapshot_meta *meta)
{
    tierkv__snapshot_meta__init(&e->meta);
    tierkv__configuration__init(&e->config);
    e->meta.index = meta->index;
    e->meta.term = meta->term;
    memcpy(e->voters, meta->config.voters, sizeof(e->voters));
    e->config.n_voters = meta->config.n_voters;
    e->config.voters = e->voters;
    memcpy(e->learners, meta->config.learners, sizeof(e->learners));
    e->config.n_learners = meta->config.n_learners;
    e->config.learners = e->learners;
    e->meta.config = &e->config;
}

/* Fills e->body.append from `a`, pointing at the entries' payloads (no copy).
 * The entry arrays grow only when a message has more entries than any before.
 * Returns what the entries add to the packed size bound. */
static size_t enc_append(struct codec_enc *e, const struct raft_msg_append *a)
{
    Tierkv__AppendEntries *pa = &e->body.append;
    tierkv__append_entries__init(pa);
    pa->prev_index = a->prev_index;
    pa->prev_term = a->prev_term;
    pa->commit = a->commit;
    pa->read_ctx = a->read_ctx;
    if (a->n_entries > e->ents_cap) {
        size_t cap = e->ents_cap ? e->ents_cap : 16;
        while (cap < a->n_entries)
            cap *= 2;
        e->ents = tk_realloc(e->ents, cap * sizeof(*e->ents));
        e->ent_ptrs = tk_realloc(e->ent_ptrs, cap * sizeof(*e->ent_ptrs));
        e->ents_cap = cap;
    }
    size_t bound = (size_t)a->n_entries * BOUND_ENTRY;
    for (uint32_t i = 0; i < a->n_entries; i++) {
        const struct raft_entry *src = &a->entries[i];
        Tierkv__Entry *pe = &e->ents[i];
        tierkv__entry__init(pe);
        pe->term = src->term;
        pe->index = src->index;
        pe->time_ms = src->time_ms;
        pe->type = (Tierkv__Entry__Type)src->type;
        if (src->data != NULL) {
            pe->data.len = src->data->len;
            pe->data.data = src->data->data;
            bound += src->data->len;
        }
        e->ent_ptrs[i] = pe;
    }
    pa->n_entries = a->n_entries;
    pa->entries = a->n_entries ? e->ent_ptrs : NULL;
    return bound;
}

/* Fills e->body.snapshot with the chunk [offset, offset + chunk_len) of the
 * snapshot's data. Returns TK_EINVAL for a chunk outside the data or a
 * configuration that does not fit. */
static int enc_snapshot(struct codec_enc *e, const struct raft_msg_snapshot *s,
                        uint64_t offset, size_t chunk_len)
{
    size_t total = s->data ? s->data->len : 0;
    if (s->meta.config.n_voters > RAFT_VOTERS_MAX ||
        s->meta.config.n_learners > RAFT_LEARNERS_MAX)
        return TK_EINVAL;
    if (offset > total || chunk_len > total - offset)
        return TK_EINVAL;
    tierkv__install_snapshot__init(&e->body.snapshot);
    enc_meta(e, &s->meta);
    e->body.snapshot.meta = &e->meta;
    e->body.snapshot.offset = offset;
    e->body.snapshot.done = offset + chunk_len == total;
    e->body.snapshot.total = total;
    if (chunk_len != 0) {
        e->body.snapshot.data.len = chunk_len;
        e->body.snapshot.data.data = s->data->data + offset;
    }
    return 0;
}

int codec__enc_prepare(struct codec_enc *e, const struct raft_message *m, uint64_t offset,
                       size_t chunk_len, size_t *size)
{
    Tierkv__RaftMessage *pm = &e->msg;
    size_t bound = BOUND_ENVELOPE + BOUND_SMALL_BODY;
    tierkv__raft_message__init(pm);
    pm->from = m->from;
    pm->to = m->to;
    pm->term = m->term;
    switch (m->type) {
    case RAFT_MSG_VOTE:
        tierkv__request_vote__init(&e->body.vote);
        e->body.vote.last_log_index = m->u.vote.last_log_index;
        e->body.vote.last_log_term = m->u.vote.last_log_term;
        e->body.vote.pre_vote = m->u.vote.pre_vote;
        e->body.vote.transfer = m->u.vote.transfer;
        pm->vote = &e->body.vote;
        break;
    case RAFT_MSG_VOTE_RESP:
        tierkv__request_vote_response__init(&e->body.vote_resp);
        e->body.vote_resp.pre_vote = m->u.vote_resp.pre_vote;
        e->body.vote_resp.granted = m->u.vote_resp.granted;
        pm->vote_resp = &e->body.vote_resp;
        break;
    case RAFT_MSG_APPEND:
        bound += enc_append(e, &m->u.append);
        pm->append = &e->body.append;
        break;
    case RAFT_MSG_APPEND_RESP:
        tierkv__append_entries_response__init(&e->body.append_resp);
        e->body.append_resp.reject = m->u.append_resp.reject;
        e->body.append_resp.index = m->u.append_resp.index;
        e->body.append_resp.conflict_index = m->u.append_resp.conflict_index;
        e->body.append_resp.conflict_term = m->u.append_resp.conflict_term;
        e->body.append_resp.read_ctx = m->u.append_resp.read_ctx;
        pm->append_resp = &e->body.append_resp;
        break;
    case RAFT_MSG_SNAPSHOT:
        if (enc_snapshot(e, &m->u.snapshot, offset, chunk_len) != 0)
            return TK_EINVAL;
        pm->snapshot = &e->body.snapshot;
        bound += BOUND_SNAPSHOT + chunk_len;
        break;
    case RAFT_MSG_TIMEOUT_NOW:
        tierkv__timeout_now__init(&e->body.timeout_now);
        pm->timeout_now = &e->body.timeout_now;
        break;
    case RAFT_MSG_READ_INDEX:
        tierkv__read_index__init(&e->body.read_index);
        e->body.read_index.ctx = m->u.read_index.ctx;
        pm->read_index = &e->body.read_index;
        break;
    case RAFT_MSG_READ_INDEX_RESP:
        tierkv__read_index_response__init(&e->body.read_index_resp);
        e->body.read_index_resp.ctx = m->u.read_index.ctx;
        e->body.read_index_resp.index = m->u.read_index.index;
        e->body.read_index_resp.reject = m->u.read_index.reject;
        pm->read_index_resp = &e->body.read_index_resp;
        break;
    default:
        return TK_EINVAL;
    }
    pm->body_case = (Tierkv__RaftMessage__BodyCase)(m->type + 3);
    *size = bound;
    return 0;
}

size_t codec__enc_size(struct codec_enc *e)
{
    return tierkv__raft_message__get_packed_size(&e->msg);
}

size_t codec__enc_pack(struct codec_enc *e, uint8_t *out)
{
    return tierkv__raft_message__pack(&e->msg, out);
}

size_t codec__enc_pack_to(struct codec_enc *e, ProtobufCBuffer *buf)
{
    return tierkv__raft_message__pack_to_buffer(&e->msg, buf);
}

/* ---- The decoding arena ---- */

struct codec_arena_chunk {
    struct codec_arena_chunk *next;
    size_t size, used;
    _Alignas(16) uint8_t mem[];
};

static void *arena_alloc(void *data, size_t size)
{
    struct codec_dec *d = data;
    if (size > d->limit)
        return NULL;
    size = size == 0 ? 16 : (size + 15) & ~(size_t)15;
    if (size > d->limit - d->used)
        return NULL; /* protobuf-c turns this into a failed unpack */
    d->used += size;
    if (size >= CODEC_BLOB_MIN) {
        if (d->n_blobs == d->blobs_cap) {
            d->blobs_cap = d->blobs_cap ? 2 * d->blobs_cap : 16;
            d->blobs = tk_realloc(d->blobs, d->blobs_cap * sizeof(*d->blobs));
        }
        struct tk_blob *b = tk_blob_new(size);
        d->blobs[d->n_blobs++] = b;
        return b->data;
    }
    struct codec_arena_chunk *c = d->cur;
    while (c != NULL && c->size - c->used < size)
        c = c->next;
    if (c == NULL) {
        c = tk_malloc(sizeof(*c) + CODEC_CHUNK_BYTES);
        c->size = CODEC_CHUNK_BYTES;
        c->used = 0;
        c->next = d->chunks;
        d->chunks = c;
    }
    d->cur = c;
    void *p = c->mem + c->used;
    c->used += size;
    return p;
}

static void arena_free(void *data, void *ptr)
{
    (void)data;
    (void)ptr; /* everything goes at once in codec__dec_release */
}

void codec__dec_init(struct codec_dec *d)
{
    memset(d, 0, sizeof(*d));
}

void codec__dec_release(struct codec_dec *d)
{
    for (size_t i = 0; i < d->n_blobs; i++)
        tk_blob_unref(d->blobs[i]);
    d->n_blobs = 0;
    d->blob_cursor = 0;
    for (size_t i = 0; i < d->n_ents; i++)
        tk_blob_unref(d->ents[i].data);
    d->n_ents = 0;
    tk_blob_unref(d->snap_data);
    d->snap_data = NULL;
    for (struct codec_arena_chunk *c = d->chunks; c != NULL; c = c->next)
        c->used = 0;
    d->cur = d->chunks;
    d->used = 0;
    d->pb = NULL;
}

void codec__dec_destroy(struct codec_dec *d)
{
    codec__dec_release(d);
    struct codec_arena_chunk *c = d->chunks;
    while (c != NULL) {
        struct codec_arena_chunk *next = c->next;
        tk_free(c);
        c = next;
    }
    tk_free(d->blobs);
    tk_free(d->ents);
    memset(d, 0, sizeof(*d));
}

/* A reference to bytes protobuf-c unpacked: the arena's blob when the bytes
 * were allocated as one (allocations happen in field order, so a cursor finds
 * it), else a copy. NULL for empty bytes. */
static struct tk_blob *adopt_bytes(struct codec_dec *d, const ProtobufCBinaryData *bd)
{
    if (bd->len == 0)
        return NULL;
    for (size_t i = d->blob_cursor; i < d->n_blobs; i++) {
        if (d->blobs[i]->data == bd->data) {
            struct tk_blob *b = tk_blob_ref(d->blobs[i]);
            b->len = bd->len; /* the allocation was rounded up */
            d->blob_cursor = i + 1;
            return b;
        }
    }
    return tk_blob_copy(bd->data, bd->len);
}

/* Whether `id` is already a voter or learner of `c` (codec.c calls no raft
 * code: the fuzzer builds it alone). */
static bool member_of(const struct raft_config *c, uint64_t id)
{
    for (uint32_t i = 0; i < c->n_voters; i++)
        if (c->voters[i] == id)
            return true;
    for (uint32_t i = 0; i < c->n_learners; i++)
        if (c->learners[i] == id)
            return true;
    return false;
}

static int dec_meta(const Tierkv__SnapshotMeta *pm, struct raft_snapshot_meta *out)
{
    if (pm == NULL || pm->config == NULL)
        return TK_EPROTO;
    const Tierkv__Configuration *c = pm->config;
    if (c->n_voters == 0 || c->n_voters > RAFT_VOTERS_MAX ||
        c->n_learners > RAFT_LEARNERS_MAX)
        return TK_EPROTO;
    memset(out, 0, sizeof(*out));
    out->index = pm->index;
    out->term = pm->term;
    out->config.n_voters = (uint32_t)c->n_voters;
    for (size_t i = 0; i < c->n_voters; i++) {
        if (c->voters[i] == RAFT_NONE)
            return TK_EPROTO;
        out->config.voters[i] = c->voters[i];
    }
    out->config.n_learners = (uint32_t)c->n_learners;
    for (size_t i = 0; i < c->n_learners; i++) {
        if (c->learners[i] == RAFT_NONE || member_of(&out->config, c->learners[i]))
            return TK_EPROTO;
        out->config.learners[i] = c->learners[i];
    }
    return 0;
}

/* Fills `a` from an unpacked AppendEntries. The entries are d->ents (grown
 * only for a message with more entries than any before) and reference the
 * arena's blobs. Returns TK_EPROTO if the entries do not follow prev_index
 * one by one or have an unknown type; the caller then releases `d`, which
 * drops the references taken so far (d->n_ents counts them). */
static int dec_append(struct codec_dec *d, const Tierkv__AppendEntries *pa,
                      struct raft_msg_append *a)
{
    a->prev_index = pa->prev_index;
    a->prev_term = pa->prev_term;
    a->commit = pa->commit;
    a->read_ctx = pa->read_ctx;
    if (pa->n_entries > UINT32_MAX)
        return TK_EPROTO;
    if (pa->n_entries > d->ents_cap) {
        size_t cap = d->ents_cap ? d->ents_cap : 16;
        while (cap < pa->n_entries)
            cap *= 2;
        d->ents = tk_realloc(d->ents, cap * sizeof(*d->ents));
        d->ents_cap = cap;
    }
    for (size_t i = 0; i < pa->n_entries; i++) {
        const Tierkv__Entry *pe = pa->entries[i];
        if (pa->prev_index > UINT64_MAX - 1 - i || pe->index != pa->prev_index + 1 + i)
            return TK_EPROTO;
        if ((unsigned)pe->type > RAFT_ENTRY_CONFIG)
            return TK_EPROTO;
        struct raft_entry *en = &d->ents[i];
        en->term = pe->term;
        en->index = pe->index;
        en->time_ms = pe->time_ms;
        en->type = (uint8_t)pe->type;
        en->data = adopt_bytes(d, &pe->data);
        d->n_ents = i + 1;
    }
    a->n_entries = (uint32_t)pa->n_entries;
    a->entries = pa->n_entries ? d->ents : NULL;
    return 0;
}

static int dec_snapshot(struct codec_dec *d, const Tierkv__InstallSnapshot *ps,
                        struct raft_msg_snapshot *out)
{
    if (dec_meta(ps->meta, &out->meta) != 0)
        return TK_EPROTO;
    out->offset = ps->offset;
    out->done = ps->done;
    out->total = ps->total;
    d->snap_data = adopt_bytes(d, &ps->data);
    out->data = d->snap_data;
    return 0;
}

int codec__decode(struct codec_dec *d, const uint8_t *buf, size_t len,
                  struct raft_message *out)
{
    TK_ASSERT(d->pb == NULL); /* the previous message was released */
    ProtobufCAllocator alloc = {
        .alloc = arena_alloc, .free = arena_free, .allocator_data = d};
    d->limit = len > (SIZE_MAX - CODEC_ARENA_SLACK) / CODEC_ARENA_RATIO
                   ? SIZE_MAX
                   : len * CODEC_ARENA_RATIO + CODEC_ARENA_SLACK;
    Tierkv__RaftMessage *pm = tierkv__raft_message__unpack(&alloc, len, buf);
    if (pm == NULL) {
        codec__dec_release(d);
        return TK_EPROTO;
    }
    d->pb = pm;
    memset(out, 0, sizeof(*out));
    out->from = pm->from;
    out->to = pm->to;
    out->term = pm->term;
    if (pm->from == RAFT_NONE || pm->to == RAFT_NONE)
        goto bad;
    switch (pm->body_case) {
    case TIERKV__RAFT_MESSAGE__BODY_VOTE:
        out->u.vote.last_log_index = pm->vote->last_log_index;
        out->u.vote.last_log_term = pm->vote->last_log_term;
        out->u.vote.pre_vote = pm->vote->pre_vote;
        out->u.vote.transfer = pm->vote->transfer;
        break;
    case TIERKV__RAFT_MESSAGE__BODY_VOTE_RESP:
        out->u.vote_resp.pre_vote = pm->vote_resp->pre_vote;
        out->u.vote_resp.granted = pm->vote_resp->granted;
        break;
    case TIERKV__RAFT_MESSAGE__BODY_APPEND:
        if (dec_append(d, pm->append, &out->u.append) != 0)
            goto bad;
        break;
    case TIERKV__RAFT_MESSAGE__BODY_APPEND_RESP:
        out->u.append_resp.reject = pm->append_resp->reject;
        out->u.append_resp.index = pm->append_resp->index;
        out->u.append_resp.conflict_index = pm->append_resp->conflict_index;
        out->u.append_resp.conflict_term = pm->append_resp->conflict_term;
        out->u.append_resp.read_ctx = pm->append_resp->read_ctx;
        break;
    case TIERKV__RAFT_MESSAGE__BODY_SNAPSHOT:
        if (dec_snapshot(d, pm->snapshot, &out->u.snapshot) != 0)
            goto bad;
        break;
    case TIERKV__RAFT_MESSAGE__BODY_TIMEOUT_NOW:
        break;
    case TIERKV__RAFT_MESSAGE__BODY_READ_INDEX:
        out->u.read_index.ctx = pm->read_index->ctx;
        break;
    case TIERKV__RAFT_MESSAGE__BODY_READ_INDEX_RESP:
        out->u.read_index.ctx = pm->read_index_resp->ctx;
        out->u.read_index.index = pm->read_index_resp->index;
        out->u.read_index.reject = pm->read_index_resp->reject;
        break;
    default:
        goto bad; /* no body: an unknown message type from a newer sender */
    }
    out->type = (uint8_t)(pm->body_case - 3);
    return 0;
bad:
    codec__dec_release(d);
    return TK_EPROTO;
}

/* ---- Snapshot reassembly ---- */

void codec__snap_init(struct codec_snap *s, uint64_t max_bytes)
{
    memset(s, 0, sizeof(*s));
    s->max = max_bytes;
}

void codec__snap_destroy(struct codec_snap *s)
{
    tk_free(s->buf);
    tk_blob_unref(s->blob);
    memset(s, 0, sizeof(*s));
}

static bool meta_equal(const struct raft_snapshot_meta *a,
                       const struct raft_snapshot_meta *b)
{
    if (a->index != b->index || a->term != b->term ||
        a->config.n_voters != b->config.n_voters ||
        a->config.n_learners != b->config.n_learners)
        return false;
    return memcmp(a->config.voters, b->config.voters,
                  a->config.n_voters * sizeof(a->config.voters[0])) == 0 &&
           memcmp(a->config.learners, b->config.learners,
                  a->config.n_learners * sizeof(a->config.learners[0])) == 0;
}

uint64_t codec__snap_need(const struct codec_snap *s, const struct raft_msg_snapshot *c)
{
    uint64_t n = c->data ? c->data->len : 0;
    return (c->offset == 0 ? 0 : s->len) + n;
}

uint64_t codec__snap_held(const struct codec_snap *s)
{
    return s->blob != NULL ? s->len : s->cap;
}

/* Drops the reassembly under way (a new one starts, or it failed). */
static void snap_stop(struct codec_snap *s)
{
    s->active = false;
    s->len = 0;
    s->total = 0;
    tk_blob_unref(s->blob);
    s->blob = NULL;
    if (s->buf == NULL)
        s->cap = 0;
}

/* Where the next n bytes go: the blob set aside for the announced total (at
 * the first chunk), or, from an older sender, a buffer grown by doubling.
 * NULL (the reassembly dropped) when the total cannot be set aside. */
/* The blob a snapshot of `total` bytes is reassembled in. A big one is a
 * mapping of its own with huge pages where the system gives them: from
 * malloc, its 4 KiB pages faulted in one at a time as chunks were copied
 * in, 8,192 faults and 180-200 ms of the loop's CPU per 32 MiB at 10M
 * keys; and its last unref gives the pages back a slice at a time. */
#define SNAP_MAP_BYTES (4u << 20)

static struct tk_blob *snap_blob(uint64_t total)
{
    if (total < SNAP_MAP_BYTES)
        return tk_blob_try_new((size_t)total);
    if (total > TK_BLOB_TRY_MAX)
        return NULL;
    struct tk_blob *b = tk_blob_map((size_t)total);
    if (b != NULL)
        b->len = (size_t)total; /* the only reference: filled in place */
    return b;
}

static uint8_t *snap_room(struct codec_snap *s, size_t n)
{
    if (s->total != 0) {
        if (s->blob == NULL) {
            if (s->buf != NULL) {
                tk_free(s->buf);
                s->buf = NULL;
            }
            /* The size is the peer's word: a failed allocation drops this
             * snapshot, it does not abort the node. Untouched pages cost
             * nothing, so the bytes held (charged) are those received. */
            s->blob = snap_blob(s->total);
            if (s->blob == NULL) {
                snap_stop(s);
                return NULL;
            }
            s->cap = s->total;
        }
        return s->blob->data;
    }
    if (s->len + n > s->cap) {
        size_t cap = s->cap ? s->cap : 64u << 10;
        while (cap < s->len + n)
            cap *= 2;
        s->buf = tk_realloc(s->buf, cap);
        s->cap = cap;
    }
    return s->buf;
}

int codec__snap_feed(struct codec_snap *s, const struct raft_message *chunk,
                     struct raft_message *whole)
{
    const struct raft_msg_snapshot *c = &chunk->u.snapshot;
    size_t n = c->data ? c->data->len : 0;
    if (c->offset == 0) {
        snap_stop(s);
        s->active = true;
        s->meta = c->meta;
        s->total = c->total;
    } else if (!s->active || c->offset != s->len || c->total != s->total ||
               !meta_equal(&s->meta, &c->meta)) {
        snap_stop(s);
        return TK_EPROTO;
    }
    if (n > s->max || s->len > s->max - n || s->total > s->max) {
        snap_stop(s);
        return TK_ETOOBIG;
    }
    if (s->total != 0 && (n > s->total - s->len || (c->done && s->len + n != s->total))) {
        snap_stop(s);
        return TK_EPROTO; /* the chunks do not add up to the size announced */
    }
    if (c->done && c->offset == 0) {
        /* One chunk: hand the decoded blob on without copying. */
        s->active = false;
        *whole = *chunk;
        whole->u.snapshot.data = tk_blob_ref(c->data);
        return 1;
    }
    uint8_t *dst = snap_room(s, n);
    if (dst == NULL)
        return TK_ETOOBIG;
    if (n != 0)
        memcpy(dst + s->len, c->data->data, n);
    s->len += n;
    if (!c->done)
        return 0;
    s->active = false;
    *whole = *chunk;
    whole->u.snapshot.offset = 0;
    if (s->blob != NULL) {
        whole->u.snapshot.data = s->blob; /* handed on whole: no copy */
        s->blob = NULL;
        s->cap = 0;
    } else {
        whole->u.snapshot.data = s->len ? tk_blob_copy(s->buf, s->len) : NULL;
        if (s->cap > (4u << 20)) { /* do not keep a big buffer between snapshots */
            tk_free(s->buf);
            s->buf = NULL;
            s->cap = 0;
        }
    }
    s->len = 0;
    s->total = 0;
    return 1;
}
