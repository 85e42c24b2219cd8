/* Unit tests for the wire schema (proto/tierkv.proto) through protobuf-c.
 *
 * Every Raft message body round-trips inside the RaftMessage envelope with its
 * fields intact; the encoding of each body is pinned byte for byte, because
 * field numbers are forever; a buffer cut inside the body never decodes; and
 * entry payloads (binary, empty, large) come back exactly. The schema mirrors
 * raft/raft.h, so the enum values and the oneof numbering are checked against
 * the C definitions at compile time. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "raft/raft.h"
#include "tests/check_run.h"
#include "tierkv.pb-c.h"

/* The codec maps these one to one; a renumbering on either side breaks it. */
_Static_assert((int)TIERKV__ENTRY__TYPE__NORMAL == (int)RAFT_ENTRY_NORMAL,
               "entry type NORMAL");
_Static_assert((int)TIERKV__ENTRY__TYPE__NOOP == (int)RAFT_ENTRY_NOOP, "entry type NOOP");
_Static_assert((int)TIERKV__ENTRY__TYPE__CONFIG == (int)RAFT_ENTRY_CONFIG,
               "entry type CONFIG");
#define BODY_OF(t) ((int)(t) + 3) /* oneof field number = enum raft_msg_type + 3 */
_Static_assert(TIERKV__RAFT_MESSAGE__BODY_VOTE == BODY_OF(RAFT_MSG_VOTE), "vote");
_Static_assert(TIERKV__RAFT_MESSAGE__BODY_VOTE_RESP == BODY_OF(RAFT_MSG_VOTE_RESP),
               "vote_resp");
_Static_assert(TIERKV__RAFT_MESSAGE__BODY_APPEND == BODY_OF(RAFT_MSG_APPEND), "append");
_Static_assert(TIERKV__RAFT_MESSAGE__BODY_APPEND_RESP == BODY_OF(RAFT_MSG_APPEND_RESP),
               "append_resp");
_Static_assert(TIERKV__RAFT_MESSAGE__BODY_SNAPSHOT == BODY_OF(RAFT_MSG_SNAPSHOT),
               "snapshot");
_Static_assert(TIERKV__RAFT_MESSAGE__BODY_TIMEOUT_NOW == BODY_OF(RAFT_MSG_TIMEOUT_NOW),
               "timeout_now");
_Static_assert(TIERKV__RAFT_MESSAGE__BODY_READ_INDEX == BODY_OF(RAFT_MSG_READ_INDEX),
               "read_index");
_Static_assert(TIERKV__RAFT_MESSAGE__BODY_READ_INDEX_RESP ==
                   BODY_OF(RAFT_MSG_READ_INDEX_RESP),
               "read_index_resp");

/* The bodies, indexed by loop tests as _i. */
static const Tierkv__RaftMessage__BodyCase bodies[] = {
    TIERKV__RAFT_MESSAGE__BODY_VOTE,       TIERKV__RAFT_MESSAGE__BODY_VOTE_RESP,
    TIERKV__RAFT_MESSAGE__BODY_APPEND,     TIERKV__RAFT_MESSAGE__BODY_APPEND_RESP,
    TIERKV__RAFT_MESSAGE__BODY_SNAPSHOT,   TIERKV__RAFT_MESSAGE__BODY_TIMEOUT_NOW,
    TIERKV__RAFT_MESSAGE__BODY_READ_INDEX, TIERKV__RAFT_MESSAGE__BODY_READ_INDEX_RESP,
};
#define N_BODIES ((int)(sizeof(bodies) / sizeof(bodies[0])))

/* Deterministic filler bytes (xorshift64*), so a failure replays. */
static void fill_bytes(uint8_t *p, size_t n, uint64_t seed)
{
    uint64_t x = seed | 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        p[i] = (uint8_t)((x * 0x2545F4914F6CDD1DULL) >> 56);
    }
}

/* Storage for one sample message of every kind; the envelope points into it. */
struct sample {
    Tierkv__RaftMessage msg;
    Tierkv__RequestVote vote;
    Tierkv__RequestVoteResponse vote_resp;
    Tierkv__AppendEntries append;
    Tierkv__Entry entry[4];
    Tierkv__Entry *entry_ptr[4];
    uint8_t payload[3][300];
    Tierkv__AppendEntriesResponse append_resp;
    Tierkv__InstallSnapshot snapshot;
    Tierkv__SnapshotMeta meta;
    Tierkv__Configuration config;
    uint64_t voters[RAFT_VOTERS_MAX];
    uint8_t chunk[1000];
    Tierkv__TimeoutNow timeout_now;
    Tierkv__ReadIndex read_index;
    Tierkv__ReadIndexResponse read_index_resp;
};

/* Fills `s` with a message whose body is `body`. Values are chosen to be
 * distinct per field and to include multi-byte varints and the extremes. */
static void sample_init(struct sample *s, Tierkv__RaftMessage__BodyCase body)
{
    memset(s, 0, sizeof(*s));
    tierkv__raft_message__init(&s->msg);
    s->msg.from = 3;
    s->msg.to = UINT64_MAX;
    s->msg.term = 1234567;
    s->msg.body_case = body;

    switch (body) {
    case TIERKV__RAFT_MESSAGE__BODY_VOTE:
        tierkv__request_vote__init(&s->vote);
        s->vote.last_log_index = 900001;
        s->vote.last_log_term = 1234566;
        s->vote.pre_vote = 1;
        s->vote.transfer = 1;
        s->msg.vote = &s->vote;
        break;
    case TIERKV__RAFT_MESSAGE__BODY_VOTE_RESP:
        tierkv__request_vote_response__init(&s->vote_resp);
        s->vote_resp.pre_vote = 1;
        s->vote_resp.granted = 1;
        s->msg.vote_resp = &s->vote_resp;
        break;
    case TIERKV__RAFT_MESSAGE__BODY_APPEND:
        tierkv__append_entries__init(&s->append);
        s->append.prev_index = 41;
        s->append.prev_term = 7;
        s->append.commit = 40;
        s->append.read_ctx = UINT64_MAX - 1;
        for (int i = 0; i < 4; i++) {
            Tierkv__Entry *e = &s->entry[i];
            tierkv__entry__init(e);
            e->term = 1234567;
            e->index = 42 + (uint64_t)i;
            e->time_ms = 1700000000123ULL + (uint64_t)i;
            e->type = i == 0 ? TIERKV__ENTRY__TYPE__NOOP : TIERKV__ENTRY__TYPE__NORMAL;
            if (i > 0) {
                fill_bytes(s->payload[i - 1], sizeof(s->payload[i - 1]), (uint64_t)i);
                e->data.data = s->payload[i - 1];
                e->data.len = sizeof(s->payload[i - 1]) - (size_t)i;
            }
            s->entry_ptr[i] = e;
        }
        s->append.n_entries = 4;
        s->append.entries = s->entry_ptr;
        s->msg.append = &s->append;
        break;
    case TIERKV__RAFT_MESSAGE__BODY_APPEND_RESP:
        tierkv__append_entries_response__init(&s->append_resp);
        s->append_resp.reject = 1;
        s->append_resp.index = 77;
        s->append_resp.conflict_index = 60;
        s->append_resp.conflict_term = 5;
        s->append_resp.read_ctx = 99;
        s->msg.append_resp = &s->append_resp;
        break;
    case TIERKV__RAFT_MESSAGE__BODY_SNAPSHOT:
        tierkv__configuration__init(&s->config);
        for (int i = 0; i < RAFT_VOTERS_MAX; i++)
            s->voters[i] =
                i == RAFT_VOTERS_MAX - 1 ? UINT64_MAX : (uint64_t)(i + 1) * 1000;
        s->config.n_voters = RAFT_VOTERS_MAX;
        s->config.voters = s->voters;
        tierkv__snapshot_meta__init(&s->meta);
        s->meta.index = 5000;
        s->meta.term = 12;
        s->meta.config = &s->config;
        tierkv__install_snapshot__init(&s->snapshot);
        s->snapshot.meta = &s->meta;
        s->snapshot.offset = 1u << 20;
        s->snapshot.done = 1;
        fill_bytes(s->chunk, sizeof(s->chunk), 77);
        s->snapshot.data.data = s->chunk;
        s->snapshot.data.len = sizeof(s->chunk);
        s->msg.snapshot = &s->snapshot;
        break;
    case TIERKV__RAFT_MESSAGE__BODY_TIMEOUT_NOW:
        tierkv__timeout_now__init(&s->timeout_now);
        s->msg.timeout_now = &s->timeout_now;
        break;
    case TIERKV__RAFT_MESSAGE__BODY_READ_INDEX:
        tierkv__read_index__init(&s->read_index);
        s->read_index.ctx = 0xdeadbeefcafeULL;
        s->msg.read_index = &s->read_index;
        break;
    case TIERKV__RAFT_MESSAGE__BODY_READ_INDEX_RESP:
        tierkv__read_index_response__init(&s->read_index_resp);
        s->read_index_resp.ctx = 0xdeadbeefcafeULL;
        s->read_index_resp.index = 4242;
        s->read_index_resp.reject = 0;
        s->msg.read_index_resp = &s->read_index_resp;
        break;
    default:
        ck_abort_msg("unknown body %d", (int)body);
    }
}

/* Packs into a new buffer; the caller frees it. */
static uint8_t *pack_msg(const Tierkv__RaftMessage *m, size_t *len)
{
    *len = tierkv__raft_message__get_packed_size(m);
    uint8_t *buf = malloc(*len ? *len : 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_uint_eq(tierkv__raft_message__pack(m, buf), *len);
    return buf;
}

static void check_bytes_eq(const ProtobufCBinaryData *a, const ProtobufCBinaryData *b)
{
    ck_assert_uint_eq(a->len, b->len);
    if (a->len > 0)
        ck_assert_mem_eq(a->data, b->data, a->len);
}

static void check_entry_eq(const Tierkv__Entry *a, const Tierkv__Entry *b)
{
    ck_assert_uint_eq(a->term, b->term);
    ck_assert_uint_eq(a->index, b->index);
    ck_assert_uint_eq(a->time_ms, b->time_ms);
    ck_assert_int_eq(a->type, b->type);
    check_bytes_eq(&a->data, &b->data);
}

/* Field-by-field equality of two envelopes (`want` built, `got` decoded). */
static void check_msg_eq(const Tierkv__RaftMessage *want, const Tierkv__RaftMessage *got)
{
    ck_assert_uint_eq(got->from, want->from);
    ck_assert_uint_eq(got->to, want->to);
    ck_assert_uint_eq(got->term, want->term);
    ck_assert_int_eq(got->body_case, want->body_case);

    switch (want->body_case) {
    case TIERKV__RAFT_MESSAGE__BODY_VOTE:
        ck_assert_ptr_nonnull(got->vote);
        ck_assert_uint_eq(got->vote->last_log_index, want->vote->last_log_index);
        ck_assert_uint_eq(got->vote->last_log_term, want->vote->last_log_term);
        ck_assert_int_eq(got->vote->pre_vote, want->vote->pre_vote);
        ck_assert_int_eq(got->vote->transfer, want->vote->transfer);
        break;
    case TIERKV__RAFT_MESSAGE__BODY_VOTE_RESP:
        ck_assert_ptr_nonnull(got->vote_resp);
        ck_assert_int_eq(got->vote_resp->pre_vote, want->vote_resp->pre_vote);
        ck_assert_int_eq(got->vote_resp->granted, want->vote_resp->granted);
        break;
    case TIERKV__RAFT_MESSAGE__BODY_APPEND:
        ck_assert_ptr_nonnull(got->append);
        ck_assert_uint_eq(got->append->prev_index, want->append->prev_index);
        ck_assert_uint_eq(got->append->prev_term, want->append->prev_term);
        ck_assert_uint_eq(got->append->commit, want->append->commit);
        ck_assert_uint_eq(got->append->read_ctx, want->append->read_ctx);
        ck_assert_uint_eq(got->append->n_entries, want->append->n_entries);
        for (size_t i = 0; i < want->append->n_entries; i++)
            check_entry_eq(want->append->entries[i], got->append->entries[i]);
        break;
    case TIERKV__RAFT_MESSAGE__BODY_APPEND_RESP:
        ck_assert_ptr_nonnull(got->append_resp);
        ck_assert_int_eq(got->append_resp->reject, want->append_resp->reject);
        ck_assert_uint_eq(got->append_resp->index, want->append_resp->index);
        ck_assert_uint_eq(got->append_resp->conflict_index,
                          want->append_resp->conflict_index);
        ck_assert_uint_eq(got->append_resp->conflict_term,
                          want->append_resp->conflict_term);
        ck_assert_uint_eq(got->append_resp->read_ctx, want->append_resp->read_ctx);
        break;
    case TIERKV__RAFT_MESSAGE__BODY_SNAPSHOT: {
        const Tierkv__InstallSnapshot *w = want->snapshot, *g = got->snapshot;
        ck_assert_ptr_nonnull(g);
        ck_assert_ptr_nonnull(g->meta);
        ck_assert_uint_eq(g->meta->index, w->meta->index);
        ck_assert_uint_eq(g->meta->term, w->meta->term);
        ck_assert_ptr_nonnull(g->meta->config);
        ck_assert_uint_eq(g->meta->config->n_voters, w->meta->config->n_voters);
        for (size_t i = 0; i < w->meta->config->n_voters; i++)
            ck_assert_uint_eq(g->meta->config->voters[i], w->meta->config->voters[i]);
        ck_assert_uint_eq(g->offset, w->offset);
        ck_assert_int_eq(g->done, w->done);
        check_bytes_eq(&g->data, &w->data);
        break;
    }
    case TIERKV__RAFT_MESSAGE__BODY_TIMEOUT_NOW:
        ck_assert_ptr_nonnull(got->timeout_now);
        break;
    case TIERKV__RAFT_MESSAGE__BODY_READ_INDEX:
        ck_assert_ptr_nonnull(got->read_index);
        ck_assert_uint_eq(got->read_index->ctx, want->read_index->ctx);
        break;
    case TIERKV__RAFT_MESSAGE__BODY_READ_INDEX_RESP:
        ck_assert_ptr_nonnull(got->read_index_resp);
        ck_assert_uint_eq(got->read_index_resp->ctx, want->read_index_resp->ctx);
        ck_assert_uint_eq(got->read_index_resp->index, want->read_index_resp->index);
        ck_assert_int_eq(got->read_index_resp->reject, want->read_index_resp->reject);
        break;
    default:
        ck_abort_msg("unexpected body %d", (int)want->body_case);
    }
}

/* The envelope's header (from, to, term) without a body: where the body starts. */
static size_t header_len(const Tierkv__RaftMessage *m)
{
    Tierkv__RaftMessage h = *m;
    h.body_case = TIERKV__RAFT_MESSAGE__BODY__NOT_SET;
    return tierkv__raft_message__get_packed_size(&h);
}

START_TEST(test_every_body_round_trips_field_by_field)
{
    struct sample *s = malloc(sizeof(*s));
    ck_assert_ptr_nonnull(s);
    sample_init(s, bodies[_i]);
    size_t len;
    uint8_t *buf = pack_msg(&s->msg, &len);

    Tierkv__RaftMessage *got = tierkv__raft_message__unpack(NULL, len, buf);
    ck_assert_ptr_nonnull(got);
    check_msg_eq(&s->msg, got);

    /* Encoding is canonical: what was decoded packs to the same bytes. */
    size_t len2;
    uint8_t *buf2 = pack_msg(got, &len2);
    ck_assert_uint_eq(len2, len);
    ck_assert_mem_eq(buf2, buf, len);

    free(buf2);
    tierkv__raft_message__free_unpacked(got, NULL);
    free(buf);
    free(s);
}
END_TEST

/* The body starts right after the header with tag (field << 3 | 2), where the
 * field number is enum raft_msg_type + 3; a renumbered oneof would change it. */
START_TEST(test_body_tag_follows_header)
{
    struct sample *s = malloc(sizeof(*s));
    ck_assert_ptr_nonnull(s);
    sample_init(s, bodies[_i]);
    size_t len;
    uint8_t *buf = pack_msg(&s->msg, &len);
    size_t h = header_len(&s->msg);
    ck_assert_uint_gt(len, h);
    ck_assert_uint_eq(buf[h], ((unsigned)bodies[_i] << 3) | 2u);
    free(buf);
    free(s);
}
END_TEST

/* Cutting the buffer anywhere inside the body (after its first byte, before
 * its last) must fail to decode rather than produce a partial message. */
START_TEST(test_truncated_body_fails_to_unpack)
{
    struct sample *s = malloc(sizeof(*s));
    ck_assert_ptr_nonnull(s);
    sample_init(s, bodies[_i]);
    size_t len;
    uint8_t *buf = pack_msg(&s->msg, &len);
    size_t h = header_len(&s->msg);
    for (size_t cut = h + 1; cut < len; cut++) {
        Tierkv__RaftMessage *got = tierkv__raft_message__unpack(NULL, cut, buf);
        if (got != NULL) {
            tierkv__raft_message__free_unpacked(got, NULL);
            ck_abort_msg("a %zu-byte prefix of %zu decoded", cut, len);
        }
    }
    free(buf);
    free(s);
}
END_TEST

/* A cut in the middle of the last entry's payload, on a bare AppendEntries. */
START_TEST(test_truncated_payload_fails_to_unpack)
{
    struct sample *s = malloc(sizeof(*s));
    ck_assert_ptr_nonnull(s);
    sample_init(s, TIERKV__RAFT_MESSAGE__BODY_APPEND);
    size_t len = tierkv__append_entries__get_packed_size(&s->append);
    uint8_t *buf = malloc(len);
    ck_assert_ptr_nonnull(buf);
    ck_assert_uint_eq(tierkv__append_entries__pack(&s->append, buf), len);

    ck_assert_ptr_null(tierkv__append_entries__unpack(NULL, len - 1, buf));
    ck_assert_ptr_null(tierkv__append_entries__unpack(NULL, len - 100, buf));

    Tierkv__AppendEntries *whole = tierkv__append_entries__unpack(NULL, len, buf);
    ck_assert_ptr_nonnull(whole);
    tierkv__append_entries__free_unpacked(whole, NULL);
    free(buf);
    free(s);
}
END_TEST

/* Payloads of every size class and every byte value come back exactly, in
 * order, with their entry metadata. */
START_TEST(test_append_entries_payloads_round_trip_exactly)
{
    enum { N = 6 };
    static const size_t sizes[N] = {0, 1, 256, 127, 128, 200000};
    Tierkv__Entry entries[N];
    Tierkv__Entry *ptrs[N];
    uint8_t *payloads[N];

    for (size_t i = 0; i < N; i++) {
        payloads[i] = malloc(sizes[i] ? sizes[i] : 1);
        ck_assert_ptr_nonnull(payloads[i]);
        if (i == 2) {
            for (size_t b = 0; b < 256; b++) /* every byte value, 0x00 included */
                payloads[i][b] = (uint8_t)b;
        } else {
            fill_bytes(payloads[i], sizes[i], 1000 + i);
        }
        tierkv__entry__init(&entries[i]);
        entries[i].term = 9;
        entries[i].index = 101 + i;
        entries[i].time_ms = 1700000000000ULL + i * 3;
        entries[i].type = TIERKV__ENTRY__TYPE__NORMAL;
        entries[i].data.data = sizes[i] ? payloads[i] : NULL;
        entries[i].data.len = sizes[i];
        ptrs[i] = &entries[i];
    }
    Tierkv__AppendEntries ae = TIERKV__APPEND_ENTRIES__INIT;
    ae.prev_index = 100;
    ae.prev_term = 8;
    ae.commit = 99;
    ae.n_entries = N;
    ae.entries = ptrs;
    Tierkv__RaftMessage m = TIERKV__RAFT_MESSAGE__INIT;
    m.from = 1;
    m.to = 2;
    m.term = 9;
    m.body_case = TIERKV__RAFT_MESSAGE__BODY_APPEND;
    m.append = &ae;

    size_t len;
    uint8_t *buf = pack_msg(&m, &len);
    Tierkv__RaftMessage *got = tierkv__raft_message__unpack(NULL, len, buf);
    ck_assert_ptr_nonnull(got);
    ck_assert_int_eq(got->body_case, TIERKV__RAFT_MESSAGE__BODY_APPEND);
    ck_assert_uint_eq(got->append->n_entries, N);
    for (size_t i = 0; i < N; i++) {
        const Tierkv__Entry *e = got->append->entries[i];
        ck_assert_uint_eq(e->index, ae.prev_index + 1 + i);
        check_entry_eq(&entries[i], e);
    }
    /* The decoded payloads are copies, not views into the wire buffer. */
    memset(buf, 0xa5, len);
    for (size_t i = 0; i < N; i++) {
        if (sizes[i] > 0)
            ck_assert_mem_eq(got->append->entries[i]->data.data, payloads[i], sizes[i]);
    }
    tierkv__raft_message__free_unpacked(got, NULL);
    free(buf);
    for (size_t i = 0; i < N; i++)
        free(payloads[i]);
}
END_TEST

static void check_packed(const ProtobufCMessage *m, const uint8_t *want, size_t want_len)
{
    uint8_t buf[64];
    ck_assert_uint_eq(protobuf_c_message_get_packed_size(m), want_len);
    ck_assert_uint_le(want_len, sizeof(buf));
    ck_assert_uint_eq(protobuf_c_message_pack(m, buf), want_len);
    if (want_len > 0)
        ck_assert_mem_eq(buf, want, want_len);
}

/* Field numbers are forever: these bytes are what every released node sends.
 * If this test fails, a field was renumbered or retyped; do not "fix" the test. */
START_TEST(test_wire_encoding_is_pinned)
{
    Tierkv__RequestVote v = TIERKV__REQUEST_VOTE__INIT;
    v.last_log_index = 5;
    v.last_log_term = 2;
    v.pre_vote = 1;
    v.transfer = 1;
    static const uint8_t v_bytes[] = {0x08, 0x05, 0x10, 0x02, 0x18, 0x01, 0x20, 0x01};
    check_packed(&v.base, v_bytes, sizeof(v_bytes));

    Tierkv__RaftMessage m = TIERKV__RAFT_MESSAGE__INIT;
    m.from = 1;
    m.to = 2;
    m.term = 3;
    m.body_case = TIERKV__RAFT_MESSAGE__BODY_VOTE;
    m.vote = &v;
    static const uint8_t m_bytes[] = {0x08, 0x01, 0x10, 0x02, 0x18, 0x03, 0x22, 0x08,
                                      0x08, 0x05, 0x10, 0x02, 0x18, 0x01, 0x20, 0x01};
    check_packed(&m.base, m_bytes, sizeof(m_bytes));

    Tierkv__RequestVoteResponse vr = TIERKV__REQUEST_VOTE_RESPONSE__INIT;
    vr.pre_vote = 1;
    vr.granted = 1;
    static const uint8_t vr_bytes[] = {0x08, 0x01, 0x10, 0x01};
    check_packed(&vr.base, vr_bytes, sizeof(vr_bytes));

    Tierkv__Entry e = TIERKV__ENTRY__INIT;
    e.term = 2;
    e.index = 7;
    e.time_ms = 1000;
    e.type = TIERKV__ENTRY__TYPE__CONFIG;
    uint8_t one = 0x61;
    e.data.data = &one;
    e.data.len = 1;
    static const uint8_t e_bytes[] = {0x08, 0x02, 0x10, 0x07, 0x18, 0xe8,
                                      0x07, 0x20, 0x02, 0x2a, 0x01, 0x61};
    check_packed(&e.base, e_bytes, sizeof(e_bytes));

    Tierkv__Entry *ep = &e;
    Tierkv__AppendEntries ae = TIERKV__APPEND_ENTRIES__INIT;
    ae.prev_index = 6;
    ae.prev_term = 2;
    ae.commit = 5;
    ae.read_ctx = 9;
    ae.n_entries = 1;
    ae.entries = &ep;
    static const uint8_t ae_bytes[] = {0x08, 0x06, 0x10, 0x02, 0x18, 0x05, 0x20, 0x09,
                                       0x2a, 0x0c, 0x08, 0x02, 0x10, 0x07, 0x18, 0xe8,
                                       0x07, 0x20, 0x02, 0x2a, 0x01, 0x61};
    check_packed(&ae.base, ae_bytes, sizeof(ae_bytes));

    Tierkv__AppendEntriesResponse ar = TIERKV__APPEND_ENTRIES_RESPONSE__INIT;
    ar.reject = 1;
    ar.index = 10;
    ar.conflict_index = 4;
    ar.conflict_term = 2;
    ar.read_ctx = 9;
    static const uint8_t ar_bytes[] = {0x08, 0x01, 0x10, 0x0a, 0x18,
                                       0x04, 0x20, 0x02, 0x28, 0x09};
    check_packed(&ar.base, ar_bytes, sizeof(ar_bytes));

    uint64_t voters[] = {1, 2, 3};
    Tierkv__Configuration c = TIERKV__CONFIGURATION__INIT;
    c.n_voters = 3;
    c.voters = voters;
    Tierkv__SnapshotMeta sm = TIERKV__SNAPSHOT_META__INIT;
    sm.index = 5;
    sm.term = 2;
    sm.config = &c;
    Tierkv__InstallSnapshot is = TIERKV__INSTALL_SNAPSHOT__INIT;
    is.meta = &sm;
    is.offset = 4096;
    is.done = 1;
    uint8_t ab[] = {0x61, 0x62};
    is.data.data = ab;
    is.data.len = 2;
    /* voters are packed (proto3 default): one length-delimited field. */
    static const uint8_t is_bytes[] = {0x0a, 0x0b, 0x08, 0x05, 0x10, 0x02, 0x1a, 0x05,
                                       0x0a, 0x03, 0x01, 0x02, 0x03, 0x10, 0x80, 0x20,
                                       0x18, 0x01, 0x22, 0x02, 0x61, 0x62};
    check_packed(&is.base, is_bytes, sizeof(is_bytes));

    Tierkv__TimeoutNow tn = TIERKV__TIMEOUT_NOW__INIT;
    check_packed(&tn.base, NULL, 0);
    Tierkv__RaftMessage mt = TIERKV__RAFT_MESSAGE__INIT;
    mt.from = 1;
    mt.to = 2;
    mt.term = 3;
    mt.body_case = TIERKV__RAFT_MESSAGE__BODY_TIMEOUT_NOW;
    mt.timeout_now = &tn;
    static const uint8_t mt_bytes[] = {0x08, 0x01, 0x10, 0x02, 0x18, 0x03, 0x4a, 0x00};
    check_packed(&mt.base, mt_bytes, sizeof(mt_bytes));

    Tierkv__ReadIndex ri = TIERKV__READ_INDEX__INIT;
    ri.ctx = 77;
    static const uint8_t ri_bytes[] = {0x08, 0x4d};
    check_packed(&ri.base, ri_bytes, sizeof(ri_bytes));

    Tierkv__ReadIndexResponse rr = TIERKV__READ_INDEX_RESPONSE__INIT;
    rr.ctx = 77;
    rr.index = 12;
    rr.reject = 1;
    static const uint8_t rr_bytes[] = {0x08, 0x4d, 0x10, 0x0c, 0x18, 0x01};
    check_packed(&rr.base, rr_bytes, sizeof(rr_bytes));
}
END_TEST

/* A newer sender may add fields; an old node must skip them and still read
 * every field it knows (this is why numbers are never reused). */
START_TEST(test_unknown_fields_are_skipped)
{
    static const uint8_t bytes[] = {
        0x08, 0x01, 0x10, 0x02, 0x18, 0x03,                   /* from, to, term */
        0x60, 0x07,                                           /* field 12, varint 7 */
        0x22, 0x08, 0x08, 0x05, 0x10, 0x02, 0x18, 0x01, 0x20, /* vote ...         */
        0x01,                                                 /* ... */
        0xa2, 0x06, 0x02, 0x78, 0x79,                         /* field 100, "xy" */
    };
    Tierkv__RaftMessage *got = tierkv__raft_message__unpack(NULL, sizeof(bytes), bytes);
    ck_assert_ptr_nonnull(got);
    ck_assert_uint_eq(got->from, 1);
    ck_assert_uint_eq(got->to, 2);
    ck_assert_uint_eq(got->term, 3);
    ck_assert_int_eq(got->body_case, TIERKV__RAFT_MESSAGE__BODY_VOTE);
    ck_assert_uint_eq(got->vote->last_log_index, 5);
    ck_assert_uint_eq(got->vote->last_log_term, 2);
    ck_assert_int_eq(got->vote->pre_vote, 1);
    ck_assert_int_eq(got->vote->transfer, 1);
    tierkv__raft_message__free_unpacked(got, NULL);
}
END_TEST

/* Bytes that are not a message are refused, not half-decoded. An empty buffer
 * is a valid envelope with no body, which the codec must reject itself. */
START_TEST(test_malformed_input_is_refused)
{
    static const uint8_t bad_wire_type[] = {0x0f, 0x01};  /* wire type 7 */
    static const uint8_t long_len[] = {0x22, 0x7f, 0x08}; /* body says 127 bytes */
    static const uint8_t bad_varint[] = {0x08, 0xff, 0xff, 0xff, 0xff, 0xff,
                                         0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    ck_assert_ptr_null(
        tierkv__raft_message__unpack(NULL, sizeof(bad_wire_type), bad_wire_type));
    ck_assert_ptr_null(tierkv__raft_message__unpack(NULL, sizeof(long_len), long_len));
    ck_assert_ptr_null(
        tierkv__raft_message__unpack(NULL, sizeof(bad_varint), bad_varint));

    Tierkv__RaftMessage *empty =
        tierkv__raft_message__unpack(NULL, 0, (const uint8_t *)"");
    ck_assert_ptr_nonnull(empty);
    ck_assert_int_eq(empty->body_case, TIERKV__RAFT_MESSAGE__BODY__NOT_SET);
    tierkv__raft_message__free_unpacked(empty, NULL);
}
END_TEST

/* A CONFIG entry carries a Configuration; the largest one fits and survives
 * the two levels of encoding. */
START_TEST(test_config_entry_carries_configuration)
{
    uint64_t voters[RAFT_VOTERS_MAX];
    for (int i = 0; i < RAFT_VOTERS_MAX; i++)
        voters[i] = UINT64_MAX - (uint64_t)i;
    Tierkv__Configuration c = TIERKV__CONFIGURATION__INIT;
    c.n_voters = RAFT_VOTERS_MAX;
    c.voters = voters;
    size_t clen = tierkv__configuration__get_packed_size(&c);
    uint8_t cbuf[256];
    ck_assert_uint_le(clen, sizeof(cbuf));
    ck_assert_uint_eq(tierkv__configuration__pack(&c, cbuf), clen);

    Tierkv__Entry e = TIERKV__ENTRY__INIT;
    e.term = 4;
    e.index = 1;
    e.type = TIERKV__ENTRY__TYPE__CONFIG;
    e.data.data = cbuf;
    e.data.len = clen;
    size_t elen = tierkv__entry__get_packed_size(&e);
    uint8_t ebuf[300];
    ck_assert_uint_le(elen, sizeof(ebuf));
    ck_assert_uint_eq(tierkv__entry__pack(&e, ebuf), elen);

    Tierkv__Entry *ge = tierkv__entry__unpack(NULL, elen, ebuf);
    ck_assert_ptr_nonnull(ge);
    check_entry_eq(&e, ge);
    Tierkv__Configuration *gc =
        tierkv__configuration__unpack(NULL, ge->data.len, ge->data.data);
    ck_assert_ptr_nonnull(gc);
    ck_assert_uint_eq(gc->n_voters, RAFT_VOTERS_MAX);
    for (int i = 0; i < RAFT_VOTERS_MAX; i++)
        ck_assert_uint_eq(gc->voters[i], voters[i]);
    tierkv__configuration__free_unpacked(gc, NULL);
    tierkv__entry__free_unpacked(ge, NULL);
}
END_TEST

static Suite *proto_suite(void)
{
    Suite *s = suite_create("proto");
    TCase *tc = tcase_create("wire");
    tcase_add_loop_test(tc, test_every_body_round_trips_field_by_field, 0, N_BODIES);
    tcase_add_loop_test(tc, test_body_tag_follows_header, 0, N_BODIES);
    tcase_add_loop_test(tc, test_truncated_body_fails_to_unpack, 0, N_BODIES);
    tcase_add_test(tc, test_truncated_payload_fails_to_unpack);
    tcase_add_test(tc, test_append_entries_payloads_round_trip_exactly);
    tcase_add_test(tc, test_wire_encoding_is_pinned);
    tcase_add_test(tc, test_unknown_fields_are_skipped);
    tcase_add_test(tc, test_malformed_input_is_refused);
    tcase_add_test(tc, test_config_entry_carries_configuration);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tk_check_run(srunner_create(proto_suite()));
}
