/* libFuzzer target for the transport's decoders: transport/frame.c and
 * transport/codec.c, the code that reads bytes from the network.
 *
 * The first input byte picks a mode; the rest is the input:
 *   even: the bytes are a RaftMessage body, given straight to codec__decode
 *         (no CRC in the way, so the fuzzer reaches the protobuf paths);
 *   odd:  the bytes are a stream of frames, parsed as a connection would
 *         (frame__parse, HELLO decoding, codec__decode, snapshot reassembly).
 * Oracle: besides the sanitizers, every message that decodes must re-encode
 * and decode again to the same type, ids, term and entry count, and a decode
 * must never return anything but 0 or TK_EPROTO.
 *
 * These are pure functions here; the real TCP transport that calls them (its
 * handshake with a cluster token, and an authenticated peer's stream) is
 * fuzzed over loopback by peer_fuzz.c.
 *
 * Built and run by tests/fuzz/run_fuzz.sh with clang -fsanitize=fuzzer. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/blob.h"
#include "base/err.h"
#include "transport/transport_internal.h"

#define FUZZ_FRAME_MAX (256u << 10)

static void check(int cond)
{
    if (!cond)
        abort();
}

static void roundtrip(const struct raft_message *m)
{
    struct codec_enc e;
    codec__enc_init(&e);
    size_t chunk =
        m->type == RAFT_MSG_SNAPSHOT && m->u.snapshot.data ? m->u.snapshot.data->len : 0;
    size_t size;
    int rc = codec__enc_prepare(&e, m, 0, chunk, &size);
    check(rc == 0);
    uint8_t *buf = malloc(size);
    size_t bound = size;
    size = codec__enc_pack(&e, buf);
    check(size <= bound);
    struct codec_dec d;
    codec__dec_init(&d);
    struct raft_message again;
    rc = codec__decode(&d, buf, size, &again);
    check(rc == 0);
    check(again.type == m->type);
    check(again.from == m->from);
    check(again.to == m->to);
    check(again.term == m->term);
    if (m->type == RAFT_MSG_APPEND)
        check(again.u.append.n_entries == m->u.append.n_entries);
    codec__dec_release(&d);
    codec__dec_destroy(&d);
    codec__enc_destroy(&e);
    free(buf);
}

static void body(struct codec_dec *d, struct codec_snap *s, const uint8_t *p, size_t n)
{
    struct raft_message m;
    int rc = codec__decode(d, p, n, &m);
    check(rc == 0 || rc == TK_EPROTO);
    if (rc != 0)
        return;
    roundtrip(&m);
    if (m.type == RAFT_MSG_SNAPSHOT && s != NULL) {
        struct raft_message whole;
        rc = codec__snap_feed(s, &m, &whole);
        check(rc == 0 || rc == 1 || rc == TK_EPROTO || rc == TK_ETOOBIG);
        if (rc == 1)
            tk_blob_unref(whole.u.snapshot.data);
    }
    codec__dec_release(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t mode = data[0];
    data++;
    size--;
    struct codec_dec d;
    codec__dec_init(&d);
    if ((mode & 1) == 0) {
        body(&d, NULL, data, size);
    } else {
        struct codec_snap s;
        codec__snap_init(&s, 1u << 20);
        size_t off = 0;
        for (;;) {
            const uint8_t *payload;
            uint32_t plen;
            size_t consumed;
            int rc = frame__parse(data + off, size - off, FUZZ_FRAME_MAX, &payload, &plen,
                                  &consumed);
            check(rc == 0 || rc == 1 || rc == TK_ETOOBIG || rc == TK_ECORRUPT);
            if (rc != 1)
                break;
            check(consumed == FRAME_HEADER_BYTES + plen);
            check(plen >= 1);
            off += consumed;
            if (payload[0] == FRAME_KIND_HELLO) {
                struct frame_hello h;
                rc = frame__hello_decode(payload + 1, plen - 1, &h);
                check(rc == 0 || rc == TK_EPROTO);
            } else if (payload[0] == FRAME_KIND_RAFT) {
                body(&d, &s, payload + 1, plen - 1);
            }
        }
        codec__snap_destroy(&s);
    }
    codec__dec_destroy(&d);
    return 0;
}
