/* libFuzzer target for the TCP transport's handshake and peer input in the
 * authenticated configuration: the real transport/tcp.c with a cluster token,
 * on a libuv loop in this process, over real loopback TCP.
 *
 * Once: a loop and a transport, node 1 of cluster PF_CLUSTER with the token
 * pf_token, listening on 127.0.0.1 (port 0); members 2..4 may dial it, and
 * it dials peer 5 at a socket this harness listens on. The harness runs the
 * loop itself (uv_run NOWAIT between polls of its own sockets) and ends every
 * connection with a half-close, after which node 1 must close it within
 * PF_WAIT_MS. The first input byte picks a mode ((byte & 7) % 5); the rest
 * is the input:
 *   0 stranger: the bytes go as they are to a new connection to node 1. It
 *     may deliver nothing: recv and forward are never called;
 *   1 member: the harness does the handshake as node 2 with the token (HELLO,
 *     checks node 1's HELLO proof 'A', AUTH 'D', checks the WELCOME's 'W'),
 *     then sends the bytes as the rest of the stream (frames). Node 1 must
 *     welcome it, and every message delivered has from 2 and to 1, every
 *     forward comes from 2 (spoofed ids are dropped);
 *   2 tamper: that handshake with the bytes XORed into the dialer's HELLO
 *     body (104 bytes, re-sealed) and then its AUTH proof (32), the proofs
 *     made over the HELLO as it was (a change on the way, or a member's
 *     handshake replayed under another id). A Raft message and a forward
 *     follow the AUTH at once. Unless the bytes change nothing a proof covers
 *     (all zero, or only the dialer HELLO's proof field, which counts as
 *     zeros), no WELCOME comes back and nothing is delivered; otherwise the
 *     WELCOME, the message and the forward all arrive;
 *   3 impostor: the harness answers node 1's dial of peer 5 without the
 *     token: it reads node 1's HELLO and writes the bytes as the reply (issue
 *     49's forged refusal). Node 1 never takes peer 5 as up and never reports
 *     a refusal (callbacks.peer, callbacks.refused);
 *   4 no token: the harness sends a correct HELLO as node 2 without knowing
 *     the token, checks node 1's HELLO, then sends the bytes where the AUTH
 *     goes. Nothing is delivered, and node 1 says nothing more (a verdict
 *     comes only after a proof that checks).
 * With bit 3 of the first byte set (every mode but 2), the harness first
 * fixes the CRC of every whole frame in the bytes (walking their length
 * fields), so that mutated frames get past the CRC check to the handshake and
 * the codec behind it.
 * A broken oracle abort()s with a line saying which; ASan and UBSan watch
 * the rest. PEER_FUZZ_SEEDS=DIR makes the target write its seed corpus (valid
 * handshakes, RAFT/FORWARD/PING frames, spoofed ids, the forged refusal) to
 * DIR and exit; PEER_FUZZ_LOG=1 keeps the transport's log lines.
 *
 * Built and run by tests/fuzz/run_fuzz.sh (target peer_fuzz) with clang
 * -fsanitize=fuzzer. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "base/blob.h"
#include "base/clock.h"
#include "base/log.h"
#include "transport/transport_internal.h"

#define PF_ID 1
#define PF_MEMBER 2
#define PF_PEER 5 /* dialed by node 1; the harness answers for it */
#define PF_CLUSTER 0xC1u
#define PF_WAIT_MS 5000 /* the longest the harness waits for node 1 */
#define PF_TIMEOUT_MS 1000
#define HELLO_FRAME (FRAME_HEADER_BYTES + 1 + FRAME_HELLO_BYTES)
#define PROOF_FRAME (FRAME_HEADER_BYTES + 1 + FRAME_PROOF_BYTES)
#define TAMPER_BYTES (FRAME_HELLO_BYTES + FRAME_PROOF_BYTES)
#define PF_SEAL 8u /* in the first byte: fix the frames' CRCs */

enum pf_mode {
    PF_STRANGER,
    PF_MEMBER_MODE,
    PF_TAMPER,
    PF_IMPOSTOR,
    PF_NO_TOKEN,
    PF_MODES
};

static const uint8_t pf_token[] = "peer-fuzz-cluster-token-0123456789";
#define PF_TOKEN_LEN (sizeof(pf_token) - 1)

static struct {
    uv_loop_t loop;
    struct transport *t;
    uint16_t port;   /* node 1's */
    int peer_fd;     /* peer 5's listening socket */
    bool deliver_ok; /* recv and forward may be called (an authenticated member) */
    unsigned recvs, forwards;
    unsigned long runs[PF_MODES];
    unsigned long welcomed, delivered, dials_answered;
} g;

static void die(const char *why)
{
    fprintf(stderr, "peer_fuzz: %s\n", why);
    abort();
}

/* ---- Node 1's callbacks: the delivery oracles ---- */

static void on_recv(struct transport *t, const struct raft_message *m, void *data)
{
    (void)t;
    (void)data;
    if (!g.deliver_ok)
        die("a message was delivered from a connection that did not authenticate");
    if (m->from != PF_MEMBER || m->to != PF_ID)
        die("a message with spoofed ids was delivered");
    g.recvs++;
}

static void on_forward(struct transport *t, uint64_t from, const uint8_t *buf, size_t len,
                       void *data)
{
    (void)t;
    (void)buf;
    (void)len;
    (void)data;
    if (!g.deliver_ok)
        die("forwarded bytes were delivered from a connection that did not authenticate");
    if (from != PF_MEMBER)
        die("forwarded bytes were delivered under another id");
    g.forwards++;
}

static void on_peer(struct transport *t, uint64_t id, bool up, void *data)
{
    (void)t;
    (void)id;
    (void)data;
    if (up)
        die("peer 5 is up, but no one answering for it knows the token");
}

static void on_refused(struct transport *t, uint64_t by, void *data)
{
    (void)t;
    (void)by;
    (void)data;
    die("a refusal was acted on, but no one answering for peer 5 knows the token");
}

static bool on_member(struct transport *t, uint64_t id, void *data)
{
    (void)t;
    (void)data;
    return id >= 2 && id <= 4;
}

static bool on_incarnation(struct transport *t, uint64_t id, const uint8_t *inc,
                           void *data)
{
    (void)t;
    (void)id;
    (void)inc;
    (void)data;
    return true;
}

/* ---- Sockets, with the loop run in between ---- */

/* Runs the loop until `fd` shows one of `events` or `deadline` passes.
 * Returns the events seen, 0 at the deadline. */
static short pump(int fd, short events, uint64_t deadline)
{
    for (;;) {
        uv_run(&g.loop, UV_RUN_NOWAIT);
        struct pollfd p[2] = {{.fd = fd, .events = events},
                              {.fd = uv_backend_fd(&g.loop), .events = POLLIN}};
        uint64_t now = tk_mono_ms();
        if (now >= deadline) {
            (void)poll(p, 1, 0);
            return p[0].revents;
        }
        int wait = uv_backend_timeout(&g.loop);
        if (wait < 0 || wait > 10)
            wait = 10;
        if ((uint64_t)wait > deadline - now)
            wait = (int)(deadline - now);
        if (poll(p, 2, wait) > 0 && p[0].revents != 0)
            return p[0].revents;
    }
}

static bool would_block(void)
{
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}

/* Writes all of buf; false when the connection ended first. */
static bool write_all(int fd, const uint8_t *buf, size_t len)
{
    uint64_t deadline = tk_mono_ms() + PF_WAIT_MS;
    while (len > 0) {
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
        if (n > 0) {
            buf += n;
            len -= (size_t)n;
        } else if (n < 0 && would_block()) {
            if (pump(fd, POLLOUT, deadline) == 0)
                die("node 1 read nothing for 5 s");
        } else {
            return false;
        }
    }
    return true;
}

/* Reads exactly len bytes; returns fewer when the connection ended first. */
static size_t read_all(int fd, uint8_t *buf, size_t len)
{
    uint64_t deadline = tk_mono_ms() + PF_WAIT_MS;
    size_t got = 0;
    while (got < len) {
        ssize_t n = recv(fd, buf + got, len - got, 0);
        if (n > 0) {
            got += (size_t)n;
        } else if (n < 0 && would_block()) {
            if (pump(fd, POLLIN, deadline) == 0)
                die("node 1 neither answered nor closed for 5 s");
        } else {
            break;
        }
    }
    return got;
}

/* Half-closes `fd`, waits for node 1 to close its side (the end of every
 * exchange: what node 1 does with the bytes is done by then), and closes it
 * with a reset (no TIME_WAIT left behind). */
static size_t finish(int fd)
{
    size_t got = 0;
    (void)shutdown(fd, SHUT_WR);
    uint64_t deadline = tk_mono_ms() + PF_WAIT_MS;
    uint8_t sink[4096];
    for (;;) {
        ssize_t n = recv(fd, sink, sizeof(sink), 0);
        if (n == 0 || (n < 0 && !would_block()))
            break;
        if (n > 0)
            got += (size_t)n;
        if (n < 0 && pump(fd, POLLIN, deadline) == 0)
            die("node 1 did not close a half-closed connection within 5 s");
    }
    struct linger l = {.l_onoff = 1, .l_linger = 0};
    (void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    close(fd);
    for (int i = 0; i < 4; i++) /* node 1's close callbacks */
        uv_run(&g.loop, UV_RUN_NOWAIT);
    return got;
}

static int dial_node1(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        die("socket failed");
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(g.port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        if (errno != EINPROGRESS)
            die(strerror(errno));
        if ((pump(fd, POLLOUT, tk_mono_ms() + PF_WAIT_MS) & POLLOUT) == 0)
            die("cannot connect to node 1");
        int err = 0;
        socklen_t len = sizeof(err);
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0)
            die("cannot connect to node 1");
    }
    return fd;
}

/* ---- Frames ---- */

static size_t frame_of(uint8_t *out, uint8_t kind, const void *body, size_t len)
{
    out[FRAME_HEADER_BYTES] = kind;
    if (len > 0)
        memcpy(out + FRAME_HEADER_BYTES + 1, body, len);
    frame__seal(out, out + FRAME_HEADER_BYTES, (uint32_t)(1 + len));
    return FRAME_HEADER_BYTES + 1 + len;
}

static size_t msg_frame(const struct raft_message *m, uint64_t off, size_t chunk,
                        uint8_t *out)
{
    struct codec_enc e;
    codec__enc_init(&e);
    size_t size;
    if (codec__enc_prepare(&e, m, off, chunk, &size) != 0)
        die("cannot encode a seed message");
    out[FRAME_HEADER_BYTES] = FRAME_KIND_RAFT;
    size = codec__enc_pack(&e, out + FRAME_HEADER_BYTES + 1);
    frame__seal(out, out + FRAME_HEADER_BYTES, (uint32_t)(1 + size));
    codec__enc_destroy(&e);
    return FRAME_HEADER_BYTES + 1 + size;
}

static size_t hello_of(uint8_t *out, uint64_t node, uint16_t flags)
{
    struct frame_hello h = {.cluster_id = PF_CLUSTER, .node_id = node, .flags = flags};
    memset(h.nonce, 0x5a, sizeof(h.nonce));
    memset(h.incarnation, 0x17, sizeof(h.incarnation));
    return frame__hello_write(out, &h);
}

/* Node 1's HELLO frame in `in`: checks what it says (not its proof). */
static void check_node1_hello(const uint8_t *in, struct frame_hello *h)
{
    const uint8_t *p;
    uint32_t plen;
    size_t used;
    if (frame__parse(in, HELLO_FRAME, 1 + FRAME_HELLO_BYTES, &p, &plen, &used) != 1 ||
        p[0] != FRAME_KIND_HELLO || frame__hello_decode(p + 1, plen - 1, h) != 0)
        die("node 1's first frame is not a HELLO");
    if (h->magic != FRAME_HELLO_MAGIC || h->version != FRAME_HELLO_VERSION ||
        h->node_id != PF_ID || h->cluster_id != PF_CLUSTER ||
        h->flags != FRAME_HELLO_F_TOKEN)
        die("node 1's HELLO says the wrong thing");
}

/* ---- Modes ---- */

/* The dialer's handshake as node 2 with the token, with `mask`
 * (TAMPER_BYTES, or NULL) XORed into the HELLO body and the AUTH proof, and
 * `after` written right behind the AUTH. Returns the verdict's frame kind (0:
 * none came); *w_ok tells whether it is a WELCOME with the proof 'W' of the
 * untampered handshake. */
static uint8_t member_handshake(int fd, const uint8_t *mask, const uint8_t *after,
                                size_t after_len, bool *w_ok)
{
    *w_ok = false;
    uint8_t hello[HELLO_FRAME];
    hello_of(hello, PF_MEMBER, FRAME_HELLO_F_TOKEN);
    uint8_t *sent = hello + FRAME_HEADER_BYTES + 1;
    uint8_t hello_d[FRAME_HELLO_BYTES];
    memcpy(hello_d, sent, sizeof(hello_d));
    if (mask != NULL) {
        for (size_t i = 0; i < FRAME_HELLO_BYTES; i++)
            sent[i] ^= mask[i];
        frame__seal(hello, hello + FRAME_HEADER_BYTES, 1 + FRAME_HELLO_BYTES);
    }
    if (!write_all(fd, hello, sizeof(hello)))
        return 0;
    uint8_t in[HELLO_FRAME];
    if (read_all(fd, in, sizeof(in)) != sizeof(in))
        return 0;
    struct frame_hello a;
    check_node1_hello(in, &a);
    uint8_t hello_a[FRAME_HELLO_BYTES];
    memcpy(hello_a, in + FRAME_HEADER_BYTES + 1, sizeof(hello_a));
    uint8_t want[FRAME_PROOF_BYTES];
    /* Node 1 proves itself over the HELLO it got. */
    if (auth__proof(pf_token, PF_TOKEN_LEN, 'A', sent, hello_a, want) != 0)
        die("auth__proof failed");
    if (!auth__equal(want, a.proof, sizeof(want)))
        die("node 1's HELLO proof does not check");
    uint8_t out[PROOF_FRAME + 256];
    uint8_t proof[FRAME_PROOF_BYTES];
    if (auth__proof(pf_token, PF_TOKEN_LEN, 'D', hello_d, hello_a, proof) != 0)
        die("auth__proof failed");
    for (size_t i = 0; mask != NULL && i < FRAME_PROOF_BYTES; i++)
        proof[i] ^= mask[FRAME_HELLO_BYTES + i];
    size_t n = frame__proof_write(out, FRAME_KIND_AUTH, proof);
    if (after_len > sizeof(out) - n)
        die("too much after the AUTH");
    if (after_len > 0)
        memcpy(out + n, after, after_len);
    if (!write_all(fd, out, n + after_len))
        return 0;
    if (read_all(fd, in, PROOF_FRAME) != PROOF_FRAME)
        return 0;
    const uint8_t *p;
    uint32_t plen;
    size_t used;
    if (frame__parse(in, PROOF_FRAME, 1 + FRAME_PROOF_BYTES, &p, &plen, &used) != 1)
        die("node 1's verdict is not a proof frame");
    if (auth__proof(pf_token, PF_TOKEN_LEN, 'W', hello_d, hello_a, want) != 0)
        die("auth__proof failed");
    *w_ok = p[0] == FRAME_KIND_WELCOME && auth__equal(want, p + 1, sizeof(want));
    return p[0];
}

static void run_stranger(const uint8_t *data, size_t size)
{
    if (size == 0)
        return; /* nothing to say (TCP_DEFER_ACCEPT would not even accept it) */
    g.deliver_ok = false;
    int fd = dial_node1();
    (void)write_all(fd, data, size);
    (void)finish(fd);
}

static void run_member(const uint8_t *data, size_t size)
{
    g.deliver_ok = true;
    int fd = dial_node1();
    bool w_ok;
    if (member_handshake(fd, NULL, NULL, 0, &w_ok) != FRAME_KIND_WELCOME || !w_ok)
        die("node 1 did not welcome member 2 with the right proof");
    g.welcomed++;
    (void)write_all(fd, data, size);
    (void)finish(fd);
    g.deliver_ok = false;
}

static void run_tamper(const uint8_t *data, size_t size)
{
    uint8_t mask[TAMPER_BYTES] = {0};
    memcpy(mask, data, size < sizeof(mask) ? size : sizeof(mask));
    bool changed = false;
    for (size_t i = 0; i < sizeof(mask); i++)
        if (mask[i] != 0 &&
            (i < FRAME_HELLO_PROOF_OFF || i >= FRAME_HELLO_PROOF_OFF + FRAME_PROOF_BYTES))
            changed = true;
    /* What a member sends at once after its AUTH. */
    uint8_t after[256];
    struct raft_message m = {
        .type = RAFT_MSG_TIMEOUT_NOW, .from = PF_MEMBER, .to = PF_ID, .term = 3};
    size_t n = msg_frame(&m, 0, 0, after);
    n += frame_of(after + n, FRAME_KIND_FORWARD, "put k v", 7);
    g.deliver_ok = !changed;
    int fd = dial_node1();
    bool w_ok;
    uint8_t verdict = member_handshake(fd, mask, after, n, &w_ok);
    (void)finish(fd);
    g.deliver_ok = false;
    if (changed && verdict == FRAME_KIND_WELCOME)
        die("node 1 welcomed a handshake changed on the way");
    if (!changed && (verdict != FRAME_KIND_WELCOME || !w_ok))
        die("node 1 did not welcome member 2 with the right proof");
    if (!changed && (g.recvs != 1 || g.forwards != 1))
        die("node 1 did not deliver what member 2 sent after its AUTH");
    if (!changed)
        g.welcomed++;
}

/* Accepts node 1's dial of peer 5 and reads its HELLO; dials that node 1
 * gave up on meanwhile (closed in the listen queue) are skipped. */
static int accept_dial(void)
{
    uint64_t deadline = tk_mono_ms() + PF_WAIT_MS;
    for (;;) {
        int fd = accept4(g.peer_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (!would_block())
                die("accept failed");
            if (pump(g.peer_fd, POLLIN, deadline) == 0)
                die("node 1 did not dial peer 5 within 5 s");
            continue;
        }
        uint8_t in[HELLO_FRAME];
        if (read_all(fd, in, sizeof(in)) == sizeof(in)) {
            struct frame_hello h;
            check_node1_hello(in, &h);
            uint8_t probe;
            ssize_t n = recv(fd, &probe, 1, MSG_PEEK);
            if (n < 0 && would_block())
                return fd; /* alive, waiting for our reply */
        }
        close(fd);
    }
}

static void run_impostor(const uint8_t *data, size_t size)
{
    g.deliver_ok = false;
    int fd = accept_dial();
    g.dials_answered++;
    (void)write_all(fd, data, size);
    (void)finish(fd);
}

static void run_no_token(const uint8_t *data, size_t size)
{
    g.deliver_ok = false;
    int fd = dial_node1();
    uint8_t hello[HELLO_FRAME];
    hello_of(hello, PF_MEMBER, FRAME_HELLO_F_TOKEN);
    if (!write_all(fd, hello, sizeof(hello)))
        die("node 1 closed on a correct HELLO");
    uint8_t in[HELLO_FRAME];
    if (read_all(fd, in, sizeof(in)) != sizeof(in))
        die("node 1 did not answer a correct HELLO");
    struct frame_hello a;
    check_node1_hello(in, &a);
    uint8_t want[FRAME_PROOF_BYTES];
    if (auth__proof(pf_token, PF_TOKEN_LEN, 'A', hello + FRAME_HEADER_BYTES + 1,
                    in + FRAME_HEADER_BYTES + 1, want) != 0 ||
        !auth__equal(want, a.proof, sizeof(want)))
        die("node 1's HELLO proof does not check");
    (void)write_all(fd, data, size);
    if (finish(fd) != 0)
        die("node 1 answered a dialer that cannot know the token");
}

/* ---- Seeds ---- */

static const char *seed_dir;

static void put(const char *name, uint8_t mode, const uint8_t *p, size_t n)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", seed_dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fputc(mode, f) == EOF || fwrite(p, 1, n, f) != n || fclose(f) != 0)
        die("cannot write a seed");
    if (mode == PF_MEMBER_MODE) { /* the same frames where the AUTH goes */
        char twin[80];
        snprintf(twin, sizeof(twin), "no-token-%s", name + strlen("member-"));
        put(twin, PF_NO_TOKEN, p, n);
    }
    if (mode == PF_TAMPER || (mode & PF_SEAL) != 0)
        return;
    char sealed[80]; /* the same with PF_SEAL: a start for CRC-fixed mutations */
    snprintf(sealed, sizeof(sealed), "sealed-%s", name);
    put(sealed, (uint8_t)(mode | PF_SEAL), p, n);
}

/* One message of every type from 2 to 1 (a snapshot in three chunks) into
 * out; returns the bytes. */
static size_t all_messages(uint8_t *out, uint64_t from, uint64_t to, bool named)
{
    static const char *const names[RAFT_MSG_TYPE_COUNT] = {
        "none",     "vote",        "vote_resp",  "append",         "append_resp",
        "snapshot", "timeout_now", "read_index", "read_index_resp"};
    struct raft_entry ents[2] = {
        {.term = 2, .index = 11, .type = RAFT_ENTRY_NOOP},
        {.term = 2, .index = 12, .type = RAFT_ENTRY_NORMAL, .data = tk_blob_copy("v", 1)},
    };
    struct tk_blob *snap = tk_blob_new(2500);
    memset(snap->data, 's', snap->len);
    size_t total = 0;
    for (int type = RAFT_MSG_VOTE; type < RAFT_MSG_TYPE_COUNT; type++) {
        struct raft_message m = {
            .type = (uint8_t)type, .from = from, .to = to, .term = 2};
        size_t n = 0;
        if (type == RAFT_MSG_VOTE)
            m.u.vote = (struct raft_msg_vote){.last_log_index = 10, .last_log_term = 1};
        if (type == RAFT_MSG_APPEND)
            m.u.append = (struct raft_msg_append){.prev_index = 10,
                                                  .prev_term = 1,
                                                  .commit = 9,
                                                  .n_entries = 2,
                                                  .entries = ents};
        if (type == RAFT_MSG_READ_INDEX || type == RAFT_MSG_READ_INDEX_RESP)
            m.u.read_index = (struct raft_msg_read_index){.ctx = 7, .index = 9};
        if (type == RAFT_MSG_SNAPSHOT) {
            m.u.snapshot.meta = (struct raft_snapshot_meta){
                .index = 10, .term = 1, .config = {.n_voters = 3, .voters = {1, 2, 3}}};
            m.u.snapshot.data = snap;
            for (size_t off = 0; off < snap->len; off += 1000)
                n += msg_frame(&m, off, snap->len - off < 1000 ? snap->len - off : 1000,
                               out + total + n);
        } else {
            n = msg_frame(&m, 0, 0, out + total);
        }
        if (named) {
            char name[64];
            snprintf(name, sizeof(name), "member-%s", names[type]);
            put(name, PF_MEMBER_MODE, out + total, n);
        }
        total += n;
    }
    tk_blob_unref(ents[1].data);
    tk_blob_unref(snap);
    return total;
}

static void write_seeds(void)
{
    static uint8_t buf[1 << 16];
    static const uint8_t zero_proof[FRAME_PROOF_BYTES];
    size_t n = all_messages(buf, PF_MEMBER, PF_ID, true);
    n += frame_of(buf + n, FRAME_KIND_FORWARD, "put k v", 7);
    n += frame_of(buf + n, FRAME_KIND_PING, NULL, 0);
    put("member-all", PF_MEMBER_MODE, buf, n);
    put("member-forward", PF_MEMBER_MODE, buf, frame_of(buf, FRAME_KIND_FORWARD, "x", 1));
    put("member-ping", PF_MEMBER_MODE, buf, frame_of(buf, FRAME_KIND_PING, NULL, 0));
    put("member-spoofed-from", PF_MEMBER_MODE, buf, all_messages(buf, 3, PF_ID, false));
    put("member-spoofed-to", PF_MEMBER_MODE, buf, all_messages(buf, PF_MEMBER, 4, false));
    n = hello_of(buf, PF_MEMBER, FRAME_HELLO_F_TOKEN);
    put("member-second-hello", PF_MEMBER_MODE, buf, n);

    /* A stranger: HELLOs of every kind, with no AUTH, a zero one, or frames
     * where the AUTH should be. */
    size_t h = hello_of(buf, PF_MEMBER, FRAME_HELLO_F_TOKEN);
    put("stranger-hello", PF_STRANGER, buf, h);
    n = h + frame__proof_write(buf + h, FRAME_KIND_AUTH, zero_proof);
    n += all_messages(buf + n, PF_MEMBER, PF_ID, false);
    put("stranger-hello-auth-messages", PF_STRANGER, buf, n);
    n = h + all_messages(buf + h, PF_MEMBER, PF_ID, false);
    n += frame_of(buf + n, FRAME_KIND_FORWARD, "put k v", 7);
    put("stranger-hello-messages", PF_STRANGER, buf, n);
    n = h + frame_of(buf + h, FRAME_KIND_FORWARD, "put k v", 7);
    put("stranger-hello-forward", PF_STRANGER, buf, n);
    n = h + frame__proof_write(buf + h, FRAME_KIND_WELCOME, zero_proof);
    n += frame_of(buf + n, FRAME_KIND_PING, NULL, 0);
    put("stranger-hello-welcome", PF_STRANGER, buf, n);
    h = hello_of(buf, PF_MEMBER, 0);
    n = h + frame__proof_write(buf + h, FRAME_KIND_AUTH, zero_proof);
    n += all_messages(buf + n, PF_MEMBER, PF_ID, false);
    put("stranger-no-token", PF_STRANGER, buf, n);
    h = hello_of(buf, 9, FRAME_HELLO_F_TOKEN);
    n = h + frame__proof_write(buf + h, FRAME_KIND_AUTH, zero_proof);
    put("stranger-not-member", PF_STRANGER, buf, n);
    put("stranger-messages", PF_STRANGER, buf,
        all_messages(buf, PF_MEMBER, PF_ID, false));

    /* Tamper masks: none, one bit in each field of the HELLO, the AUTH. */
    static const struct {
        const char *name;
        size_t off;
    } flips[] = {{"tamper-magic", 0},
                 {"tamper-version", 4},
                 {"tamper-flags", 6},
                 {"tamper-cluster", 8},
                 {"tamper-node", 16},
                 {"tamper-nonce", 24},
                 {"tamper-proof-field", 56},
                 {"tamper-incarnation", 88},
                 {"tamper-auth", FRAME_HELLO_BYTES}};
    put("tamper-none", PF_TAMPER, buf, 0);
    for (size_t i = 0; i < sizeof(flips) / sizeof(flips[0]); i++) {
        memset(buf, 0, TAMPER_BYTES);
        buf[flips[i].off] = 1;
        put(flips[i].name, PF_TAMPER, buf, flips[i].off + 1);
    }

    /* An impostor answering node 1's dial: the forged refusal (a HELLO and
     * a REFUSE with zero proofs), a forged welcome, a refusal alone. */
    h = hello_of(buf, PF_PEER, FRAME_HELLO_F_TOKEN);
    n = h + frame__proof_write(buf + h, FRAME_KIND_REFUSE, zero_proof);
    put("impostor-refuse", PF_IMPOSTOR, buf, n);
    n = h + frame__proof_write(buf + h, FRAME_KIND_WELCOME, zero_proof);
    put("impostor-welcome", PF_IMPOSTOR, buf, n);
    h = hello_of(buf, PF_PEER, 0);
    n = h + frame__proof_write(buf + h, FRAME_KIND_REFUSE, zero_proof);
    put("impostor-no-token-refuse", PF_IMPOSTOR, buf, n);
    put("impostor-refuse-only", PF_IMPOSTOR, buf,
        frame__proof_write(buf, FRAME_KIND_REFUSE, zero_proof));
}

/* The CRC of every whole frame from the start of p[0..n) (PF_SEAL). */
static void seal_frames(uint8_t *p, size_t n)
{
    size_t off = 0;
    while (n - off >= FRAME_HEADER_BYTES) {
        const uint8_t *h = p + off;
        uint32_t len = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 |
                       (uint32_t)h[3] << 24;
        if (len == 0 || len > n - off - FRAME_HEADER_BYTES)
            break;
        frame__seal(p + off, p + off + FRAME_HEADER_BYTES, len);
        off += FRAME_HEADER_BYTES + len;
    }
}

/* ---- libFuzzer ---- */

static void report(void)
{
    struct transport_stats s;
    transport_stats(g.t, &s);
    fprintf(
        stderr,
        "peer_fuzz: runs stranger %lu member %lu tamper %lu impostor %lu no-token %lu; "
        "welcomed %lu, dials answered %lu, messages delivered %llu, forwards %llu; "
        "node 1: conns_bad %llu auth_failed %llu msgs_spoofed %llu conns_failed %llu\n",
        g.runs[PF_STRANGER], g.runs[PF_MEMBER_MODE], g.runs[PF_TAMPER],
        g.runs[PF_IMPOSTOR], g.runs[PF_NO_TOKEN], g.welcomed, g.dials_answered,
        (unsigned long long)s.msgs_received, (unsigned long long)s.fwd_received,
        (unsigned long long)s.conns_bad, (unsigned long long)s.auth_failed,
        (unsigned long long)s.msgs_spoofed, (unsigned long long)s.conns_failed);
}

static void start(void)
{
    signal(SIGPIPE, SIG_IGN);
    if (getenv("PEER_FUZZ_LOG") == NULL)
        tk_log_set_level(TK_LOG_OFF);
    if (uv_loop_init(&g.loop) != 0)
        die("uv_loop_init failed");
    g.peer_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (g.peer_fd < 0 || bind(g.peer_fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        listen(g.peer_fd, 64) != 0 || getsockname(g.peer_fd, (struct sockaddr *)&a, &len))
        die("cannot listen for peer 5");

    struct transport_tcp_options o;
    transport_tcp_options_default(&o);
    o.id = PF_ID;
    o.cluster_id = PF_CLUSTER;
    o.listen_host = "127.0.0.1";
    o.listen_port = 0;
    o.peer_token = pf_token;
    o.peer_token_len = PF_TOKEN_LEN;
    /* Every exchange ends with a half-close that node 1 answers at once, so
     * these deadlines are only a backstop, kept clear of a loaded machine's
     * pauses (a correct member must never miss them). */
    o.handshake_timeout_ms = PF_TIMEOUT_MS;
    o.io_timeout_ms = PF_TIMEOUT_MS;
    o.backoff_min_ms = 1; /* peer 5 is redialed at once */
    o.backoff_max_ms = 1;
    /* Snapshots past SNAP_AHEAD (32 MiB) are faulted in ahead; the default
     * 16 GiB would let one chunk reserve more than the fuzzer's RSS limit. */
    o.snapshot_max = 48u << 20;
    o.seed = 1;
    memset(o.incarnation, 0x11, sizeof(o.incarnation));
    struct transport_callbacks cbs = {.recv = on_recv,
                                      .peer = on_peer,
                                      .forward = on_forward,
                                      .incarnation = on_incarnation,
                                      .refused = on_refused,
                                      .member = on_member};
    if (transport_tcp_new(&g.loop, &o, &cbs, &g.t) != 0)
        die("transport_tcp_new failed");
    g.port = transport_tcp_port(g.t);
    if (transport_tcp_add_peer(g.t, PF_PEER, "127.0.0.1", ntohs(a.sin_port)) != 0)
        die("transport_tcp_add_peer failed");
    atexit(report);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    seed_dir = getenv("PEER_FUZZ_SEEDS");
    if (seed_dir != NULL) {
        write_seeds();
        exit(0);
    }
    start();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    enum pf_mode mode = (enum pf_mode)((data[0] & 7) % PF_MODES);
    uint8_t *copy = NULL;
    if ((data[0] & PF_SEAL) != 0 && mode != PF_TAMPER && size > 1) {
        copy = malloc(size - 1);
        memcpy(copy, data + 1, size - 1);
        seal_frames(copy, size - 1);
    }
    data = copy != NULL ? copy : data + 1;
    size--;
    g.runs[mode]++;
    g.recvs = 0;
    g.forwards = 0;
    switch (mode) {
    case PF_STRANGER:
        run_stranger(data, size);
        break;
    case PF_MEMBER_MODE:
        run_member(data, size);
        break;
    case PF_TAMPER:
        run_tamper(data, size);
        break;
    case PF_IMPOSTOR:
        run_impostor(data, size);
        break;
    default:
        run_no_token(data, size);
        break;
    }
    g.delivered += g.recvs + g.forwards;
    free(copy);
    return 0;
}
