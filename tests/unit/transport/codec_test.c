/* Unit tests for transport/frame.c and transport/codec.c.
 *
 * Frames: a sealed frame parses back; a partial frame asks for more; a zero or
 * oversized length, a flipped payload bit and a wrong HELLO length are errors.
 * Codec: every Raft message type round-trips field by field; entry payloads
 * (empty, small, large) come back byte-exact, large ones without a second copy;
 * a snapshot cut into chunks reassembles; every malformed input (garbage, no
 * body, zero ids, gaps in entry indexes, unknown entry types, a snapshot without
 * meta, too many voters, a hostile allocation amplifier, every truncation)
 * decodes to TK_EPROTO, never a crash. */
#include <check.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "base/alloc.h"
#include "base/blob.h"
#include "base/err.h"
#include "tests/check_run.h"
#include "transport/transport_internal.h"

static void fill(uint8_t *p, size_t n, uint64_t seed)
{
    uint64_t x = seed | 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        p[i] = (uint8_t)((x * 0x2545F4914F6CDD1DULL) >> 56);
    }
}

/* ---- frames ---- */

START_TEST(test_frame_roundtrip_and_partial)
{
    uint8_t buf[64];
    uint8_t *payload = buf + FRAME_HEADER_BYTES;
    payload[0] = FRAME_KIND_RAFT;
    fill(payload + 1, 20, 7);
    frame__seal(buf, payload, 21);
    const uint8_t *p = NULL;
    uint32_t plen = 0;
    size_t consumed = 0;
    ck_assert_int_eq(
        frame__parse(buf, FRAME_HEADER_BYTES + 21, 1024, &p, &plen, &consumed), 1);
    ck_assert_ptr_eq(p, payload);
    ck_assert_uint_eq(plen, 21);
    ck_assert_uint_eq(consumed, FRAME_HEADER_BYTES + 21);
    for (size_t cut = 0; cut < FRAME_HEADER_BYTES + 21; cut++) {
        ck_assert_int_eq(frame__parse(buf, cut, 1024, &p, &plen, &consumed), 0);
        ck_assert_uint_ge(consumed, cut + 1);
    }
}
END_TEST

START_TEST(test_frame_rejects_bad_length_and_crc)
{
    uint8_t buf[64] = {0};
    const uint8_t *p;
    uint32_t plen;
    size_t consumed;
    /* length 0 */
    ck_assert_int_eq(frame__parse(buf, 16, 1024, &p, &plen, &consumed), TK_ETOOBIG);
    /* oversized: length 2000 with a 1024 limit, known from the header alone */
    buf[0] = 0xd0;
    buf[1] = 0x07;
    ck_assert_int_eq(frame__parse(buf, 8, 1024, &p, &plen, &consumed), TK_ETOOBIG);
    /* huge */
    memset(buf, 0xff, 4);
    ck_assert_int_eq(frame__parse(buf, 8, 1024, &p, &plen, &consumed), TK_ETOOBIG);
    /* a flipped payload bit */
    uint8_t *payload = buf + FRAME_HEADER_BYTES;
    payload[0] = FRAME_KIND_RAFT;
    fill(payload + 1, 30, 9);
    frame__seal(buf, payload, 31);
    payload[17] ^= 0x10;
    ck_assert_int_eq(frame__parse(buf, 39, 1024, &p, &plen, &consumed), TK_ECORRUPT);
    /* a flipped CRC bit */
    payload[17] ^= 0x10;
    buf[5] ^= 1;
    ck_assert_int_eq(frame__parse(buf, 39, 1024, &p, &plen, &consumed), TK_ECORRUPT);
}
END_TEST

START_TEST(test_frame_hello_roundtrip)
{
    uint8_t buf[128];
    struct frame_hello in = {.cluster_id = 0xC1u, .node_id = 3, .flags = 1};
    memset(in.nonce, 0xab, sizeof(in.nonce));
    memset(in.proof, 0xcd, sizeof(in.proof));
    size_t n = frame__hello_write(buf, &in);
    ck_assert_uint_eq(n, FRAME_HEADER_BYTES + 1 + FRAME_HELLO_BYTES);
    const uint8_t *p;
    uint32_t plen;
    size_t consumed;
    ck_assert_int_eq(frame__parse(buf, n, 1024, &p, &plen, &consumed), 1);
    ck_assert_uint_eq(p[0], FRAME_KIND_HELLO);
    struct frame_hello h;
    ck_assert_int_eq(frame__hello_decode(p + 1, plen - 1, &h), 0);
    ck_assert_uint_eq(h.magic, FRAME_HELLO_MAGIC);
    ck_assert_uint_eq(h.version, FRAME_HELLO_VERSION);
    ck_assert_uint_eq(h.cluster_id, 0xC1u);
    ck_assert_uint_eq(h.node_id, 3);
    ck_assert_uint_eq(h.flags, 1);
    ck_assert_int_eq(memcmp(h.nonce, in.nonce, sizeof(h.nonce)), 0);
    ck_assert_int_eq(memcmp(h.proof, in.proof, sizeof(h.proof)), 0);
    ck_assert_int_eq(frame__hello_decode(p + 1, plen - 2, &h), TK_EPROTO);
    ck_assert_int_eq(frame__hello_decode(p + 1, 0, &h), TK_EPROTO);
}
END_TEST

/* ---- codec ---- */

/* Encodes m (whole, or the given snapshot chunk) into a new buffer. */
static uint8_t *encode(const struct raft_message *m, uint64_t off, size_t chunk,
                       size_t *len)
{
    struct codec_enc e;
    codec__enc_init(&e);
    size_t bound;
    ck_assert_int_eq(codec__enc_prepare(&e, m, off, chunk, &bound), 0);
    uint8_t *buf = malloc(bound);
    *len = codec__enc_pack(&e, buf);
    ck_assert_uint_le(*len, bound);
    ck_assert_uint_eq(*len, codec__enc_size(&e));
    codec__enc_destroy(&e);
    return buf;
}

static void check_same(const struct raft_message *a, const struct raft_message *b)
{
    ck_assert_uint_eq(a->type, b->type);
    ck_assert_uint_eq(a->from, b->from);
    ck_assert_uint_eq(a->to, b->to);
    ck_assert_uint_eq(a->term, b->term);
    switch (a->type) {
    case RAFT_MSG_VOTE:
        ck_assert_uint_eq(a->u.vote.last_log_index, b->u.vote.last_log_index);
        ck_assert_uint_eq(a->u.vote.last_log_term, b->u.vote.last_log_term);
        ck_assert_int_eq(a->u.vote.pre_vote, b->u.vote.pre_vote);
        ck_assert_int_eq(a->u.vote.transfer, b->u.vote.transfer);
        break;
    case RAFT_MSG_VOTE_RESP:
        ck_assert_int_eq(a->u.vote_resp.pre_vote, b->u.vote_resp.pre_vote);
        ck_assert_int_eq(a->u.vote_resp.granted, b->u.vote_resp.granted);
        break;
    case RAFT_MSG_APPEND:
        ck_assert_uint_eq(a->u.append.prev_index, b->u.append.prev_index);
        ck_assert_uint_eq(a->u.append.prev_term, b->u.append.prev_term);
        ck_assert_uint_eq(a->u.append.commit, b->u.append.commit);
        ck_assert_uint_eq(a->u.append.read_ctx, b->u.append.read_ctx);
        ck_assert_uint_eq(a->u.append.n_entries, b->u.append.n_entries);
        for (uint32_t i = 0; i < a->u.append.n_entries; i++) {
            const struct raft_entry *x = &a->u.append.entries[i];
            const struct raft_entry *y = &b->u.append.entries[i];
            ck_assert_uint_eq(x->term, y->term);
            ck_assert_uint_eq(x->index, y->index);
            ck_assert_uint_eq(x->time_ms, y->time_ms);
            ck_assert_uint_eq(x->type, y->type);
            size_t xl = x->data ? x->data->len : 0;
            size_t yl = y->data ? y->data->len : 0;
            ck_assert_uint_eq(xl, yl);
            if (xl)
                ck_assert_mem_eq(x->data->data, y->data->data, xl);
        }
        break;
    case RAFT_MSG_APPEND_RESP:
        ck_assert_int_eq(a->u.append_resp.reject, b->u.append_resp.reject);
        ck_assert_uint_eq(a->u.append_resp.index, b->u.append_resp.index);
        ck_assert_uint_eq(a->u.append_resp.conflict_index,
                          b->u.append_resp.conflict_index);
        ck_assert_uint_eq(a->u.append_resp.conflict_term, b->u.append_resp.conflict_term);
        ck_assert_uint_eq(a->u.append_resp.read_ctx, b->u.append_resp.read_ctx);
        break;
    case RAFT_MSG_SNAPSHOT: {
        const struct raft_msg_snapshot *x = &a->u.snapshot, *y = &b->u.snapshot;
        ck_assert_uint_eq(x->meta.index, y->meta.index);
        ck_assert_uint_eq(x->meta.term, y->meta.term);
        ck_assert_uint_eq(x->meta.config.n_voters, y->meta.config.n_voters);
        for (uint32_t i = 0; i < x->meta.config.n_voters; i++)
            ck_assert_uint_eq(x->meta.config.voters[i], y->meta.config.voters[i]);
        ck_assert_uint_eq(x->meta.config.n_learners, y->meta.config.n_learners);
        for (uint32_t i = 0; i < x->meta.config.n_learners; i++)
            ck_assert_uint_eq(x->meta.config.learners[i], y->meta.config.learners[i]);
        ck_assert_uint_eq(x->offset, y->offset);
        ck_assert_int_eq(x->done, y->done);
        size_t xl = x->data ? x->data->len : 0;
        size_t yl = y->data ? y->data->len : 0;
        ck_assert_uint_eq(xl, yl);
        if (xl)
            ck_assert_mem_eq(x->data->data, y->data->data, xl);
        break;
    }
    case RAFT_MSG_TIMEOUT_NOW:
        break;
    case RAFT_MSG_READ_INDEX:
    case RAFT_MSG_READ_INDEX_RESP:
        ck_assert_uint_eq(a->u.read_index.ctx, b->u.read_index.ctx);
        ck_assert_uint_eq(a->u.read_index.index, b->u.read_index.index);
        ck_assert_int_eq(a->u.read_index.reject, b->u.read_index.reject);
        break;
    default:
        ck_abort_msg("unexpected type %d", a->type);
    }
}

/* One sample of each type; `buf` holds payload bytes of the append entries. */
static struct raft_entry sample_ents[4];

static void sample(int type, struct raft_message *m)
{
    memset(m, 0, sizeof(*m));
    m->type = (uint8_t)type;
    m->from = 1;
    m->to = 0xFFFFFFFFFFFFFFFFull;
    m->term = 12345678901ull;
    switch (type) {
    case RAFT_MSG_VOTE:
        m->u.vote = (struct raft_msg_vote){
            .last_log_index = 77, .last_log_term = 5, .pre_vote = true, .transfer = true};
        break;
    case RAFT_MSG_VOTE_RESP:
        m->u.vote_resp = (struct raft_msg_vote_resp){.pre_vote = true, .granted = true};
        break;
    case RAFT_MSG_APPEND: {
        static uint8_t big[5000];
        fill(big, sizeof(big), 3);
        sample_ents[0] = (struct raft_entry){.term = 4,
                                             .index = 101,
                                             .time_ms = 1700000000000ull,
                                             .type = RAFT_ENTRY_NOOP,
                                             .data = NULL};
        sample_ents[1] = (struct raft_entry){.term = 5,
                                             .index = 102,
                                             .time_ms = 1,
                                             .type = RAFT_ENTRY_NORMAL,
                                             .data = tk_blob_copy("hello", 5)};
        sample_ents[2] = (struct raft_entry){.term = 5,
                                             .index = 103,
                                             .time_ms = 2,
                                             .type = RAFT_ENTRY_NORMAL,
                                             .data = tk_blob_copy(big, sizeof(big))};
        sample_ents[3] = (struct raft_entry){.term = 5,
                                             .index = 104,
                                             .time_ms = 3,
                                             .type = RAFT_ENTRY_CONFIG,
                                             .data = tk_blob_copy("\0\1\2", 3)};
        m->u.append = (struct raft_msg_append){.prev_index = 100,
                                               .prev_term = 4,
                                               .commit = 99,
                                               .read_ctx = 42,
                                               .n_entries = 4,
                                               .entries = sample_ents};
        break;
    }
    case RAFT_MSG_APPEND_RESP:
        m->u.append_resp = (struct raft_msg_append_resp){.reject = true,
                                                         .index = 9,
                                                         .conflict_index = 7,
                                                         .conflict_term = 3,
                                                         .read_ctx = 11};
        break;
    case RAFT_MSG_SNAPSHOT: {
        uint8_t data[3000];
        fill(data, sizeof(data), 5);
        m->u.snapshot.meta.index = 500;
        m->u.snapshot.meta.term = 6;
        m->u.snapshot.meta.config.n_voters = 3;
        m->u.snapshot.meta.config.voters[0] = 1;
        m->u.snapshot.meta.config.voters[1] = 2;
        m->u.snapshot.meta.config.voters[2] = 0xFFFFFFFFFFull;
        m->u.snapshot.meta.config.n_learners = 2; /* the learners travel too */
        m->u.snapshot.meta.config.learners[0] = 7;
        m->u.snapshot.meta.config.learners[1] = 9;
        m->u.snapshot.done = true;
        m->u.snapshot.data = tk_blob_copy(data, sizeof(data));
        break;
    }
    case RAFT_MSG_TIMEOUT_NOW:
        break;
    case RAFT_MSG_READ_INDEX:
        m->u.read_index.ctx = 999;
        break;
    case RAFT_MSG_READ_INDEX_RESP:
        m->u.read_index =
            (struct raft_msg_read_index){.ctx = 998, .index = 77, .reject = true};
        break;
    }
}

static void sample_free(struct raft_message *m)
{
    if (m->type == RAFT_MSG_APPEND)
        for (uint32_t i = 0; i < m->u.append.n_entries; i++)
            tk_blob_unref(m->u.append.entries[i].data);
    if (m->type == RAFT_MSG_SNAPSHOT)
        tk_blob_unref(m->u.snapshot.data);
}

START_TEST(test_codec_roundtrip_every_type)
{
    int type = _i;
    struct raft_message m, got;
    sample(type, &m);
    size_t chunk = type == RAFT_MSG_SNAPSHOT ? m.u.snapshot.data->len : 0;
    size_t len;
    uint8_t *buf = encode(&m, 0, chunk, &len);
    struct codec_dec d;
    codec__dec_init(&d);
    ck_assert_int_eq(codec__decode(&d, buf, len, &got), 0);
    check_same(&m, &got);
    codec__dec_release(&d);
    /* The decoder is reusable and gives the same answer again. */
    ck_assert_int_eq(codec__decode(&d, buf, len, &got), 0);
    check_same(&m, &got);
    codec__dec_release(&d);
    codec__dec_destroy(&d);
    free(buf);
    sample_free(&m);
}
END_TEST

START_TEST(test_codec_large_payload_is_adopted_not_copied_again)
{
    struct raft_message m, got;
    sample(RAFT_MSG_APPEND, &m);
    size_t len;
    uint8_t *buf = encode(&m, 0, 0, &len);
    struct codec_dec d;
    codec__dec_init(&d);
    struct tk_alloc_stats before, after;
    tk_alloc_stats(&before);
    ck_assert_int_eq(codec__decode(&d, buf, len, &got), 0);
    tk_alloc_stats(&after);
    /* The 5000-byte payload lives in an arena blob the entry references. */
    struct tk_blob *b = got.u.append.entries[2].data;
    ck_assert_ptr_eq(b, d.blobs[0]);
    ck_assert_uint_eq(b->len, 5000);
    /* Bytes allocated: the arena chunk, the blob, small copies; not two blobs. */
    ck_assert_uint_lt(after.bytes - before.bytes, (64u << 10) + 5000 + 2048);
    /* A receiver keeps a payload past release with its own reference. */
    struct tk_blob *kept = tk_blob_ref(b);
    codec__dec_release(&d);
    ck_assert_mem_eq(kept->data, sample_ents[2].data->data, 5000);
    tk_blob_unref(kept);
    codec__dec_destroy(&d);
    free(buf);
    sample_free(&m);
}
END_TEST

START_TEST(test_codec_snapshot_chunks_reassemble)
{
    struct raft_message m, got, whole;
    sample(RAFT_MSG_SNAPSHOT, &m);
    size_t total = m.u.snapshot.data->len; /* 3000 */
    struct codec_dec d;
    codec__dec_init(&d);
    struct codec_snap s;
    codec__snap_init(&s, 1 << 20);
    int rc = 0;
    for (size_t off = 0; off < total; off += 1024) {
        size_t n = total - off < 1024 ? total - off : 1024;
        size_t len;
        uint8_t *buf = encode(&m, off, n, &len);
        ck_assert_int_eq(codec__decode(&d, buf, len, &got), 0);
        ck_assert_uint_eq(got.u.snapshot.offset, off);
        rc = codec__snap_feed(&s, &got, &whole);
        ck_assert_int_eq(rc, off + n == total ? 1 : 0);
        codec__dec_release(&d);
        free(buf);
    }
    ck_assert_int_eq(rc, 1);
    check_same(&m, &whole);
    tk_blob_unref(whole.u.snapshot.data);

    /* A chunk that skips ahead is a protocol error, as is one with other meta. */
    size_t len;
    uint8_t *buf = encode(&m, 0, 1024, &len);
    ck_assert_int_eq(codec__decode(&d, buf, len, &got), 0);
    ck_assert_int_eq(codec__snap_feed(&s, &got, &whole), 0);
    codec__dec_release(&d);
    free(buf);
    buf = encode(&m, 2048, 952, &len);
    ck_assert_int_eq(codec__decode(&d, buf, len, &got), 0);
    ck_assert_int_eq(codec__snap_feed(&s, &got, &whole), TK_EPROTO);
    codec__dec_release(&d);
    free(buf);
    /* A middle chunk with no start is refused too. */
    buf = encode(&m, 1024, 1024, &len);
    ck_assert_int_eq(codec__decode(&d, buf, len, &got), 0);
    ck_assert_int_eq(codec__snap_feed(&s, &got, &whole), TK_EPROTO);
    codec__dec_release(&d);
    free(buf);
    codec__snap_destroy(&s);

    /* Past the size limit. */
    codec__snap_init(&s, 2000);
    buf = encode(&m, 0, total, &len);
    ck_assert_int_eq(codec__decode(&d, buf, len, &got), 0);
    ck_assert_int_eq(codec__snap_feed(&s, &got, &whole), TK_ETOOBIG);
    codec__dec_release(&d);
    free(buf);
    codec__snap_destroy(&s);
    codec__dec_destroy(&d);
    sample_free(&m);
}
END_TEST

/* Feeds the chunk [off, off + n) of m, encoded with `total` announced (the
 * encoder announces the data's length; an older sender announced nothing). */
static int feed_chunk(struct codec_dec *d, struct codec_snap *s,
                      const struct raft_message *m, uint64_t off, size_t n,
                      uint64_t total, struct raft_message *whole)
{
    struct codec_enc e;
    codec__enc_init(&e);
    size_t bound;
    ck_assert_int_eq(codec__enc_prepare(&e, m, off, n, &bound), 0);
    e.body.snapshot.total = total;
    uint8_t *buf = malloc(bound);
    size_t len = codec__enc_pack(&e, buf);
    codec__enc_destroy(&e);
    struct raft_message got;
    ck_assert_int_eq(codec__decode(d, buf, len, &got), 0);
    ck_assert_uint_eq(got.u.snapshot.total, total);
    int rc = codec__snap_feed(s, &got, whole);
    codec__dec_release(d);
    free(buf);
    return rc;
}

/* A big snapshot (4 MiB or more announced) is reassembled in a mapping of
 * its own (huge pages where the system gives them): from malloc, its 4 KiB
 * pages faulted in one by one as chunks arrived, 180-200 ms of a follower's
 * loop per 32 MiB at 10M keys. The bytes are the same either way. */
START_TEST(test_codec_big_snapshot_reassembles_in_a_mapping)
{
    enum { TOTAL = 8 << 20, CHUNK = 1 << 20 };
    struct raft_message m, whole;
    sample(RAFT_MSG_SNAPSHOT, &m);
    tk_blob_unref(m.u.snapshot.data);
    m.u.snapshot.data = tk_blob_new(TOTAL);
    for (size_t i = 0; i < TOTAL; i++)
        m.u.snapshot.data->data[i] = (uint8_t)(i * 131 + i / 4096);
    struct codec_dec d;
    codec__dec_init(&d);
    struct codec_snap s;
    codec__snap_init(&s, 1u << 30);
    struct rusage r0, r1;
    getrusage(RUSAGE_SELF, &r0);
    for (size_t off = 0; off < TOTAL; off += CHUNK) {
        int rc = feed_chunk(&d, &s, &m, off, CHUNK, TOTAL, &whole);
        ck_assert_int_eq(rc, off + CHUNK == TOTAL ? 1 : 0);
        if (off == 0) /* a mapping: the refcount's top bit (base/blob.c) */
            ck_assert_uint_ne(atomic_load(&s.blob->refs) & (1u << 31), 0);
    }
    getrusage(RUSAGE_SELF, &r1);
    printf("an 8 MiB snapshot reassembled with %ld minor faults (4 KiB pages: 2048)\n",
           r1.ru_minflt - r0.ru_minflt);
    ck_assert_uint_eq(whole.u.snapshot.data->len, TOTAL);
    ck_assert_mem_eq(whole.u.snapshot.data->data, m.u.snapshot.data->data, TOTAL);
    tk_blob_unref(whole.u.snapshot.data);
    codec__snap_destroy(&s);
    codec__dec_destroy(&d);
    sample_free(&m);
}
END_TEST

/* With the size announced, the first chunk sets aside exactly that, and the
 * last hands that very blob on: no doubling, no final copy of the whole. */
START_TEST(test_codec_snapshot_total_reassembles_in_place)
{
    struct raft_message m, whole;
    sample(RAFT_MSG_SNAPSHOT, &m);
    size_t total = m.u.snapshot.data->len; /* 3000 */
    struct codec_dec d;
    codec__dec_init(&d);
    struct codec_snap s;
    codec__snap_init(&s, 1 << 20);
    ck_assert_uint_eq(codec__snap_need(&s, &(struct raft_msg_snapshot){.total = total}),
                      0);
    ck_assert_int_eq(feed_chunk(&d, &s, &m, 0, 1000, total, &whole), 0);
    struct tk_blob *set_aside = s.blob;
    ck_assert_ptr_nonnull(set_aside);
    ck_assert_uint_eq(set_aside->len, total);
    ck_assert_uint_eq(s.cap, total);
    ck_assert_uint_eq(codec__snap_held(&s), 1000); /* what arrived, not the total */
    ck_assert_int_eq(feed_chunk(&d, &s, &m, 1000, 1000, total, &whole), 0);
    ck_assert_ptr_eq(s.blob, set_aside);
    ck_assert_int_eq(feed_chunk(&d, &s, &m, 2000, 1000, total, &whole), 1);
    ck_assert_ptr_eq(whole.u.snapshot.data, set_aside);
    ck_assert_uint_eq(s.cap, 0);
    check_same(&m, &whole);
    tk_blob_unref(whole.u.snapshot.data);

    /* Chunks that do not add up to the total are refused: one past it, a
     * last chunk short of it, a total that changes midway. */
    ck_assert_int_eq(feed_chunk(&d, &s, &m, 0, 1000, 1500, &whole), 0);
    ck_assert_int_eq(feed_chunk(&d, &s, &m, 1000, 1000, 1500, &whole), TK_EPROTO);
    ck_assert_ptr_null(s.blob);
    ck_assert_int_eq(feed_chunk(&d, &s, &m, 0, 1000, 5000, &whole), 0);
    ck_assert_int_eq(feed_chunk(&d, &s, &m, 1000, 2000, 5000, &whole), TK_EPROTO);
    ck_assert_int_eq(feed_chunk(&d, &s, &m, 0, 1000, total, &whole), 0);
    ck_assert_int_eq(feed_chunk(&d, &s, &m, 1000, 1000, total + 1, &whole), TK_EPROTO);
    /* An announced total past the bound is refused before anything is set
     * aside. */
    codec__snap_destroy(&s);
    codec__snap_init(&s, 2000);
    ck_assert_int_eq(feed_chunk(&d, &s, &m, 0, 1000, total, &whole), TK_ETOOBIG);
    ck_assert_ptr_null(s.blob);
    codec__snap_destroy(&s);
    /* A total no allocation can give (the peer's word) drops the snapshot; it
     * does not abort the node. */
    codec__snap_init(&s, UINT64_MAX);
    ck_assert_int_eq(feed_chunk(&d, &s, &m, 0, 1000, UINT64_MAX - 64, &whole),
                     TK_ETOOBIG);
    ck_assert_ptr_null(s.blob);
    ck_assert(!s.active);
    codec__snap_destroy(&s);

    /* An older sender (no total): reassembled by doubling, then copied. */
    codec__snap_init(&s, 1 << 20);
    ck_assert_int_eq(feed_chunk(&d, &s, &m, 0, 1000, 0, &whole), 0);
    ck_assert_ptr_null(s.blob);
    ck_assert_int_eq(feed_chunk(&d, &s, &m, 1000, 1000, 0, &whole), 0);
    ck_assert_int_eq(feed_chunk(&d, &s, &m, 2000, 1000, 0, &whole), 1);
    check_same(&m, &whole);
    tk_blob_unref(whole.u.snapshot.data);
    codec__snap_destroy(&s);
    codec__dec_destroy(&d);
    sample_free(&m);
}
END_TEST

/* The size bound from codec__enc_prepare is never below the exact size, even
 * with every integer at its largest (10-byte varints) and every voter slot used. */
START_TEST(test_codec_size_bound_holds_at_the_extremes)
{
    struct raft_message m;
    sample(_i, &m);
    m.from = m.to = m.term = UINT64_MAX;
    switch (_i) {
    case RAFT_MSG_VOTE:
        m.u.vote.last_log_index = m.u.vote.last_log_term = UINT64_MAX;
        break;
    case RAFT_MSG_APPEND:
        m.u.append.prev_index = m.u.append.prev_term = UINT64_MAX;
        m.u.append.commit = m.u.append.read_ctx = UINT64_MAX;
        for (uint32_t i = 0; i < m.u.append.n_entries; i++) {
            sample_ents[i].term = sample_ents[i].index = UINT64_MAX;
            sample_ents[i].time_ms = UINT64_MAX;
            sample_ents[i].type = RAFT_ENTRY_CONFIG;
        }
        break;
    case RAFT_MSG_APPEND_RESP:
        m.u.append_resp = (struct raft_msg_append_resp){true, UINT64_MAX, UINT64_MAX,
                                                        UINT64_MAX, UINT64_MAX};
        break;
    case RAFT_MSG_SNAPSHOT:
        m.u.snapshot.meta.index = m.u.snapshot.meta.term = UINT64_MAX;
        m.u.snapshot.meta.config.n_voters = RAFT_VOTERS_MAX;
        for (int i = 0; i < RAFT_VOTERS_MAX; i++)
            m.u.snapshot.meta.config.voters[i] = UINT64_MAX - (uint64_t)i;
        break;
    case RAFT_MSG_READ_INDEX:
    case RAFT_MSG_READ_INDEX_RESP:
        m.u.read_index = (struct raft_msg_read_index){UINT64_MAX, UINT64_MAX, true};
        break;
    default:
        break;
    }
    struct codec_enc e;
    codec__enc_init(&e);
    size_t chunk = _i == RAFT_MSG_SNAPSHOT ? 1000 : 0;
    uint64_t off = _i == RAFT_MSG_SNAPSHOT ? 7 : 0; /* offset != 0 is encoded too */
    size_t bound;
    ck_assert_int_eq(codec__enc_prepare(&e, &m, off, chunk, &bound), 0);
    ck_assert_uint_ge(bound, codec__enc_size(&e));
    uint8_t *buf = malloc(bound);
    ck_assert_uint_eq(codec__enc_pack(&e, buf), codec__enc_size(&e));
    free(buf);
    codec__enc_destroy(&e);
    sample_free(&m);
}
END_TEST

START_TEST(test_codec_encode_rejects_bad_messages)
{
    struct codec_enc e;
    codec__enc_init(&e);
    struct raft_message m = {.type = RAFT_MSG_NONE, .from = 1, .to = 2};
    size_t len;
    ck_assert_int_eq(codec__enc_prepare(&e, &m, 0, 0, &len), TK_EINVAL);
    m.type = RAFT_MSG_TYPE_COUNT;
    ck_assert_int_eq(codec__enc_prepare(&e, &m, 0, 0, &len), TK_EINVAL);
    sample(RAFT_MSG_SNAPSHOT, &m);
    ck_assert_int_eq(codec__enc_prepare(&e, &m, 2000, 2000, &len), TK_EINVAL);
    m.u.snapshot.meta.config.n_voters = RAFT_VOTERS_MAX + 1;
    ck_assert_int_eq(codec__enc_prepare(&e, &m, 0, 10, &len), TK_EINVAL);
    sample_free(&m);
    codec__enc_destroy(&e);
}
END_TEST

/* Packs a hand-built protobuf message (to make inputs the encoder refuses). */
static uint8_t *pack_pb(const Tierkv__RaftMessage *pm, size_t *len)
{
    *len = tierkv__raft_message__get_packed_size(pm);
    uint8_t *buf = malloc(*len ? *len : 1);
    tierkv__raft_message__pack(pm, buf);
    return buf;
}

static int decode_rc(const uint8_t *buf, size_t len)
{
    struct codec_dec d;
    struct raft_message got;
    codec__dec_init(&d);
    int rc = codec__decode(&d, buf, len, &got);
    if (rc == 0)
        codec__dec_release(&d);
    codec__dec_destroy(&d);
    return rc;
}

START_TEST(test_codec_rejects_malformed)
{
    /* Garbage. */
    uint8_t junk[512];
    for (int seed = 1; seed < 200; seed++) {
        fill(junk, sizeof(junk), (uint64_t)seed);
        size_t n = (size_t)seed * 7 % sizeof(junk);
        int rc = decode_rc(junk, n);
        ck_assert(rc == 0 || rc == TK_EPROTO);
    }
    ck_assert_int_eq(decode_rc((const uint8_t *)"\xff\xff\xff", 3), TK_EPROTO);

    /* No body: what an unknown message type from a newer sender looks like. */
    Tierkv__RaftMessage pm = TIERKV__RAFT_MESSAGE__INIT;
    pm.from = 1;
    pm.to = 2;
    size_t len;
    uint8_t *buf = pack_pb(&pm, &len);
    ck_assert_int_eq(decode_rc(buf, len), TK_EPROTO);
    free(buf);
    /* An unknown field number 12 carrying a body is skipped: still no body. */
    uint8_t unknown[] = {0x08, 0x01, 0x10, 0x02, 0x62, 0x02, 0x08, 0x01};
    ck_assert_int_eq(decode_rc(unknown, sizeof(unknown)), TK_EPROTO);

    /* Zero ids. */
    Tierkv__TimeoutNow tn = TIERKV__TIMEOUT_NOW__INIT;
    pm.body_case = TIERKV__RAFT_MESSAGE__BODY_TIMEOUT_NOW;
    pm.timeout_now = &tn;
    buf = pack_pb(&pm, &len);
    ck_assert_int_eq(decode_rc(buf, len), 0); /* the control case is valid */
    free(buf);
    pm.from = 0;
    buf = pack_pb(&pm, &len);
    ck_assert_int_eq(decode_rc(buf, len), TK_EPROTO);
    free(buf);
    pm.from = 1;
    pm.to = 0;
    buf = pack_pb(&pm, &len);
    ck_assert_int_eq(decode_rc(buf, len), TK_EPROTO);
    free(buf);
    pm.to = 2;

    /* Entries with a gap, and with an unknown type. */
    Tierkv__Entry e1 = TIERKV__ENTRY__INIT, e2 = TIERKV__ENTRY__INIT;
    Tierkv__Entry *ents[] = {&e1, &e2};
    Tierkv__AppendEntries ae = TIERKV__APPEND_ENTRIES__INIT;
    ae.prev_index = 10;
    ae.n_entries = 2;
    ae.entries = ents;
    e1.index = 11;
    e2.index = 12;
    pm.body_case = TIERKV__RAFT_MESSAGE__BODY_APPEND;
    pm.append = &ae;
    buf = pack_pb(&pm, &len);
    ck_assert_int_eq(decode_rc(buf, len), 0);
    free(buf);
    e2.index = 13;
    buf = pack_pb(&pm, &len);
    ck_assert_int_eq(decode_rc(buf, len), TK_EPROTO);
    free(buf);
    e2.index = 12;
    e2.type = (Tierkv__Entry__Type)7;
    buf = pack_pb(&pm, &len);
    ck_assert_int_eq(decode_rc(buf, len), TK_EPROTO);
    free(buf);
    /* prev_index at the top of the range cannot be followed. */
    e2.type = TIERKV__ENTRY__TYPE__NORMAL;
    ae.prev_index = UINT64_MAX;
    e1.index = 0;
    buf = pack_pb(&pm, &len);
    ck_assert_int_eq(decode_rc(buf, len), TK_EPROTO);
    free(buf);

    /* Snapshot without meta, without config, with no voters, too many, a zero. */
    Tierkv__InstallSnapshot is = TIERKV__INSTALL_SNAPSHOT__INIT;
    pm.body_case = TIERKV__RAFT_MESSAGE__BODY_SNAPSHOT;
    pm.snapshot = &is;
    buf = pack_pb(&pm, &len);
    ck_assert_int_eq(decode_rc(buf, len), TK_EPROTO);
    free(buf);
    Tierkv__SnapshotMeta meta = TIERKV__SNAPSHOT_META__INIT;
    is.meta = &meta;
    buf = pack_pb(&pm, &len);
    ck_assert_int_eq(decode_rc(buf, len), TK_EPROTO);
    free(buf);
    Tierkv__Configuration cfg = TIERKV__CONFIGURATION__INIT;
    meta.config = &cfg;
    buf = pack_pb(&pm, &len);
    ck_assert_int_eq(decode_rc(buf, len), TK_EPROTO);
    free(buf);
    uint64_t voters[RAFT_VOTERS_MAX + 1];
    for (int i = 0; i <= RAFT_VOTERS_MAX; i++)
        voters[i] = (uint64_t)i + 1;
    cfg.voters = voters;
    cfg.n_voters = 3;
    buf = pack_pb(&pm, &len);
    ck_assert_int_eq(decode_rc(buf, len), 0);
    free(buf);
    cfg.n_voters = RAFT_VOTERS_MAX + 1;
    buf = pack_pb(&pm, &len);
    ck_assert_int_eq(decode_rc(buf, len), TK_EPROTO);
    free(buf);
    cfg.n_voters = 2;
    voters[1] = 0;
    buf = pack_pb(&pm, &len);
    ck_assert_int_eq(decode_rc(buf, len), TK_EPROTO);
    free(buf);
}
END_TEST

START_TEST(test_codec_rejects_allocation_amplifier)
{
    /* 200k empty entries are 2 bytes each on the wire but ~80 bytes each
     * unpacked: the arena cap refuses the message instead of growing. */
    size_t n = 200000;
    size_t len = 4 + 2 * n;
    uint8_t *buf = malloc(len + 16);
    size_t p = 0;
    buf[p++] = 0x08; /* from = 1 */
    buf[p++] = 0x01;
    buf[p++] = 0x10; /* to = 2 */
    buf[p++] = 0x02;
    buf[p++] = 0x32; /* field 6 (append), length-delimited */
    size_t body = 2 * n;
    while (body >= 0x80) {
        buf[p++] = (uint8_t)(body | 0x80);
        body >>= 7;
    }
    buf[p++] = (uint8_t)body;
    for (size_t i = 0; i < n; i++) {
        buf[p++] = 0x2a; /* field 5 (entries), length 0 */
        buf[p++] = 0x00;
    }
    ck_assert_int_eq(decode_rc(buf, p), TK_EPROTO);
    free(buf);
}
END_TEST

START_TEST(test_codec_truncations_never_crash)
{
    struct raft_message m, got;
    sample(_i, &m);
    size_t chunk = _i == RAFT_MSG_SNAPSHOT ? m.u.snapshot.data->len : 0;
    size_t len;
    uint8_t *buf = encode(&m, 0, chunk, &len);
    struct codec_dec d;
    codec__dec_init(&d);
    int failures = 0;
    for (size_t cut = 0; cut < len; cut++) {
        uint8_t *copy = malloc(cut ? cut : 1); /* so ASan sees overreads */
        memcpy(copy, buf, cut);
        int rc = codec__decode(&d, copy, cut, &got);
        if (rc == 0)
            codec__dec_release(&d);
        else
            failures++;
        ck_assert(rc == 0 || rc == TK_EPROTO);
        free(copy);
    }
    /* Most cuts land inside a field and must fail. */
    ck_assert_int_gt(failures, 0);
    codec__dec_destroy(&d);
    free(buf);
    sample_free(&m);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("transport_codec");
    TCase *tc = tcase_create("frame");
    tcase_add_test(tc, test_frame_roundtrip_and_partial);
    tcase_add_test(tc, test_frame_rejects_bad_length_and_crc);
    tcase_add_test(tc, test_frame_hello_roundtrip);
    suite_add_tcase(s, tc);
    tc = tcase_create("codec");
    tcase_add_loop_test(tc, test_codec_roundtrip_every_type, RAFT_MSG_VOTE,
                        RAFT_MSG_TYPE_COUNT);
    tcase_add_test(tc, test_codec_large_payload_is_adopted_not_copied_again);
    tcase_add_test(tc, test_codec_snapshot_chunks_reassemble);
    tcase_add_test(tc, test_codec_snapshot_total_reassembles_in_place);
    tcase_add_test(tc, test_codec_big_snapshot_reassembles_in_a_mapping);
    tcase_add_loop_test(tc, test_codec_size_bound_holds_at_the_extremes, RAFT_MSG_VOTE,
                        RAFT_MSG_TYPE_COUNT);
    tcase_add_test(tc, test_codec_encode_rejects_bad_messages);
    tcase_add_test(tc, test_codec_rejects_malformed);
    tcase_add_test(tc, test_codec_rejects_allocation_amplifier);
    tcase_add_loop_test(tc, test_codec_truncations_never_crash, RAFT_MSG_VOTE,
                        RAFT_MSG_TYPE_COUNT);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tk_check_run(srunner_create(suite()));
}
