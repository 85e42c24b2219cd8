/* Writes the seed corpus of transport_fuzz into a directory: every Raft
 * message type as a bare body (mode byte 0) and as a framed stream (mode byte
 * 1) after a HELLO, plus a snapshot cut into three chunks. Run by hand when the
 * schema changes (see run_fuzz.sh for the build line; link it like the fuzzer,
 * without -fsanitize=fuzzer and with main). peer_fuzz.c writes its own seeds
 * (PEER_FUZZ_SEEDS=DIR; run_fuzz.sh does it before each run). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/blob.h"
#include "transport/transport_internal.h"

static const char *const type_names[RAFT_MSG_TYPE_COUNT] = {
    "none",     "vote",        "vote_resp",  "append",         "append_resp",
    "snapshot", "timeout_now", "read_index", "read_index_resp"};

static void put(const char *dir, const char *name, const uint8_t *p, size_t n)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(p, 1, n, f) != n)
        abort();
    fclose(f);
}

static size_t frame_msg(struct codec_enc *e, const struct raft_message *m, uint64_t off,
                        size_t chunk, uint8_t *out)
{
    size_t size;
    if (codec__enc_prepare(e, m, off, chunk, &size) != 0)
        abort();
    out[FRAME_HEADER_BYTES] = FRAME_KIND_RAFT;
    size = codec__enc_pack(e, out + FRAME_HEADER_BYTES + 1);
    frame__seal(out, out + FRAME_HEADER_BYTES, (uint32_t)(1 + size));
    return FRAME_HEADER_BYTES + 1 + size;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    static uint8_t buf[1 << 16];
    struct codec_enc e;
    codec__enc_init(&e);
    struct raft_entry ents[3] = {
        {.term = 2, .index = 11, .time_ms = 1700000000000ull, .type = RAFT_ENTRY_NOOP},
        {.term = 2,
         .index = 12,
         .type = RAFT_ENTRY_NORMAL,
         .data = tk_blob_copy("put k v", 7)},
        {.term = 2, .index = 13, .type = RAFT_ENTRY_NORMAL, .data = tk_blob_new(300)},
    };
    memset(ents[2].data->data, 'x', 300);
    struct tk_blob *snap = tk_blob_new(2500);
    memset(snap->data, 's', 2500);
    for (int type = RAFT_MSG_VOTE; type < RAFT_MSG_TYPE_COUNT; type++) {
        struct raft_message m = {.type = (uint8_t)type, .from = 1, .to = 2, .term = 2};
        size_t chunk = 0;
        switch (type) {
        case RAFT_MSG_VOTE:
            m.u.vote = (struct raft_msg_vote){
                .last_log_index = 10, .last_log_term = 1, .pre_vote = true};
            break;
        case RAFT_MSG_VOTE_RESP:
            m.u.vote_resp.granted = true;
            break;
        case RAFT_MSG_APPEND:
            m.u.append = (struct raft_msg_append){.prev_index = 10,
                                                  .prev_term = 1,
                                                  .commit = 9,
                                                  .read_ctx = 4,
                                                  .n_entries = 3,
                                                  .entries = ents};
            break;
        case RAFT_MSG_APPEND_RESP:
            m.u.append_resp = (struct raft_msg_append_resp){
                .reject = true, .index = 10, .conflict_index = 5, .conflict_term = 1};
            break;
        case RAFT_MSG_SNAPSHOT:
            m.u.snapshot.meta = (struct raft_snapshot_meta){
                .index = 10, .term = 1, .config = {.n_voters = 3, .voters = {1, 2, 3}}};
            m.u.snapshot.data = snap;
            m.u.snapshot.done = true;
            chunk = 1000;
            break;
        case RAFT_MSG_READ_INDEX:
        case RAFT_MSG_READ_INDEX_RESP:
            m.u.read_index = (struct raft_msg_read_index){.ctx = 77, .index = 9};
            break;
        default:
            break;
        }
        size_t size;
        if (codec__enc_prepare(&e, &m, 0, chunk ? chunk : 0, &size) != 0)
            abort();
        buf[0] = 0;
        size = codec__enc_pack(&e, buf + 1);
        char name[64];
        snprintf(name, sizeof(name), "body-%s", type_names[type]);
        put(argv[1], name, buf, 1 + size);

        size_t n = 1;
        buf[0] = 1;
        struct frame_hello h = {.cluster_id = 0xC1, .node_id = 1};
        n += frame__hello_write(buf + n, &h);
        if (type == RAFT_MSG_SNAPSHOT) {
            for (size_t off = 0; off < snap->len; off += 1000) {
                size_t c = snap->len - off < 1000 ? snap->len - off : 1000;
                n += frame_msg(&e, &m, off, c, buf + n);
            }
        } else {
            n += frame_msg(&e, &m, 0, 0, buf + n);
        }
        snprintf(name, sizeof(name), "stream-%s", type_names[type]);
        put(argv[1], name, buf, n);
    }
    for (int i = 1; i < 3; i++)
        tk_blob_unref(ents[i].data);
    tk_blob_unref(snap);
    codec__enc_destroy(&e);
    return 0;
}
