/* Maintenance.Snapshot (docs/etcd-compat.md): the node's backup file, the
 * bytes GET /v1/snapshot?local and `tierkv snapshot save --local` give
 * (kv/backup.h: header, snapshot stream, SHA-256 trailer), sent as a server
 * stream of SnapshotResponse chunks.
 *
 * The call: the client sends one (empty) SnapshotRequest and ends its half.
 * The node then hands over a snapshot stream (node_backup_start, the Raft
 * snapshot path: a blob the node already holds, or one its thread pool makes);
 * kv_backup_seal walks and hashes it on the thread pool (never on the loop),
 * and the file goes out in chunks of SNAP_CHUNK bytes, each sent only while
 * the stream's queue holds under SNAP_QUEUE_MAX and grpc_stream_room allows
 * it; a uv_check handle (after each loop turn's I/O, where the client's
 * reads free room) sends the next ones, and a timer every SNAP_WATCHDOG_MS
 * makes sure a turn comes (a stalled or gone client is seen even when
 * nothing else wakes the loop, as at a stop). So a snapshot stream holds at most
 * its reference on the snapshot blob and about SNAP_QUEUE_MAX of queued
 * answers, and sends at most SNAP_QUEUE_MAX a loop turn. A client that takes
 * nothing for SNAP_STALL_MS is cut (grpc.c's write_timeout closes a
 * connection that takes nothing at all); a client that leaves ends it (seen
 * by grpc_call_gone each turn: having ended its half, it gets no second
 * on_stream_end), and its memory goes then or, when the node's backup
 * callback or the seal job is still owed, when that comes. At most
 * SNAPSHOTS_MAX at once per node.
 *
 * etcdctl 3.6 (client/v3/snapshot SaveWithVersion) refuses a snapshot whose
 * size is not 32 modulo 512 (its sign of etcd's SHA-256 appended to a bolt
 * file of whole pages); it does not check the hash. So zero bytes follow the
 * backup file, 0 to 511 of them, to make the size 32 modulo 512. The saved
 * file is the backup file then those zeros (the header's stream size tells
 * where the backup ends). remaining_bytes is etcd's: the bytes still to
 * come after this message, padding included (the size is known before the
 * first message). Every message carries the header of the snapshot's point in
 * time (revision: its applied index), the first also `version` "3.6.0".
 *
 * Called by etcdapi.c's stream table; calls the node, kv/backup.c and
 * grpc.c. Loop thread only (but seal_run, on the thread pool). */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <uv.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/blob.h"
#include "base/clock.h"
#include "base/err.h"
#include "etcdapi/etcdapi_internal.h"
#include "kv/backup.h"

#define SNAPSHOTS_MAX 2
#define SNAP_CHUNK (64u * 1024u)
#define SNAP_QUEUE_MAX (1024u * 1024u)
#define SNAP_STALL_MS 30000u
#define SNAP_WATCHDOG_MS 100u
#define SNAP_ALIGN 512u
#define SNAP_ALIGN_REST 32u /* etcd's SHA-256 after whole pages */
#define GRPC_PREFIX_BYTES 5

enum snap_phase { SNAP_ASKED, SNAP_BACKUP, SNAP_SEAL, SNAP_SEND };

struct snapstream {
    const struct estream_ops *ops; /* first: etcdapi.c dispatches on it */
    struct etcdapi *e;
    struct grpc_call *call; /* NULL once finished */
    enum snap_phase phase;
    bool owed;    /* the node's backup callback or the seal job is to come:
                     it frees the stream once finished */
    bool sending; /* inside grpc_stream_send, whose flush may end the stream */
    uv_check_t check;
    uv_timer_t watchdog; /* SEND: wakes the loop when nothing else does */
    int handles_open;
    uv_work_t work;
    struct tk_blob *stream; /* the snapshot stream (a reference) */
    int ready_status;       /* the node's backup callback's, bounced */
    struct tk_blob *ready_stream;
    uint64_t cluster_id, created_ms;
    uint8_t hdr[KV_BACKUP_HEADER_BYTES];
    uint8_t tr[KV_BACKUP_TRAILER_BYTES];
    struct kv_backup_info info;
    int seal_rc;
    char err[160];
    uint64_t total, sent; /* the file's bytes with its padding; sent so far */
    size_t chunk;         /* the blob bytes of the message being filled */
    uint8_t rhdr[64];     /* the packed ResponseHeader */
    size_t rhdr_len;
    size_t last_queued;
    uint64_t progress_ms;
};

static void on_handle_closed(uv_handle_t *h)
{
    struct snapstream *ss = h->data;
    if (--ss->handles_open == 0)
        tk_free(ss);
}

static void snap_free(struct snapstream *ss)
{
    TK_ASSERT(ss->call == NULL);
    TK_ASSERT(!ss->owed);
    TK_ASSERT(ss->e->snapshots > 0);
    ss->e->snapshots--;
    tk_blob_unref(ss->stream);
    ss->stream = NULL;
    uv_close((uv_handle_t *)&ss->check, on_handle_closed);
    uv_close((uv_handle_t *)&ss->watchdog, on_handle_closed);
}

/* Ends the stream (once); frees it unless a callback is owed or a send is
 * on the stack (they free it after). */
static void snap_end(struct snapstream *ss, bool drop, int code, const char *msg)
{
    if (ss->call == NULL)
        return;
    struct grpc_call *call = ss->call;
    ss->call = NULL;
    uv_check_stop(&ss->check);
    uv_timer_stop(&ss->watchdog);
    if (drop)
        grpc_stream_abort(call, code, "%s", msg);
    else
        grpc_stream_finish(call, code, "%s", msg);
    if (!ss->owed && !ss->sending)
        snap_free(ss);
}

/* ---- the messages ------------------------------------------------------------ */

static size_t varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static uint8_t *put_varint(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static bool first_msg(const struct snapstream *ss)
{
    return ss->sent == 0;
}

/* SnapshotResponse{header = 1, remaining_bytes = 2, blob = 3, version = 4},
 * written by hand: the blob comes from the header, the stream, the trailer
 * and the padding without another copy. */
static size_t msg_len(const struct snapstream *ss, size_t chunk)
{
    uint64_t rest = ss->total - ss->sent - chunk;
    size_t n = 1 + varint_len(ss->rhdr_len) + ss->rhdr_len;
    if (rest > 0)
        n += 1 + varint_len(rest);
    n += 1 + varint_len(chunk) + chunk;
    if (first_msg(ss))
        n += 2 + sizeof(ETCD_API_VERSION) - 1;
    return n;
}

/* Copies the file's bytes [off, off + n): header, stream, trailer, zeros. */
static void file_copy(const struct snapstream *ss, uint64_t off, uint8_t *out, size_t n)
{
    const uint64_t H = KV_BACKUP_HEADER_BYTES, S = ss->stream->len;
    const uint64_t T = KV_BACKUP_TRAILER_BYTES;
    while (n > 0) {
        size_t k;
        if (off < H) {
            k = (size_t)(H - off) < n ? (size_t)(H - off) : n;
            memcpy(out, ss->hdr + off, k);
        } else if (off < H + S) {
            k = (size_t)(H + S - off) < n ? (size_t)(H + S - off) : n;
            memcpy(out, ss->stream->data + (off - H), k);
        } else if (off < H + S + T) {
            k = (size_t)(H + S + T - off) < n ? (size_t)(H + S + T - off) : n;
            memcpy(out, ss->tr + (off - H - S), k);
        } else {
            k = n;
            memset(out, 0, k);
        }
        out += k;
        off += k;
        n -= k;
    }
}

static void snap_fill(uint8_t *out, size_t len, const void *arg)
{
    const struct snapstream *ss = arg;
    uint8_t *p = out;
    uint64_t rest = ss->total - ss->sent - ss->chunk;
    *p++ = 0x0a; /* 1: header */
    p = put_varint(p, ss->rhdr_len);
    memcpy(p, ss->rhdr, ss->rhdr_len);
    p += ss->rhdr_len;
    if (rest > 0) {
        *p++ = 0x10; /* 2: remaining_bytes */
        p = put_varint(p, rest);
    }
    *p++ = 0x1a; /* 3: blob */
    p = put_varint(p, ss->chunk);
    file_copy(ss, ss->sent, p, ss->chunk);
    p += ss->chunk;
    if (first_msg(ss)) {
        *p++ = 0x22; /* 4: version */
        *p++ = (uint8_t)(sizeof(ETCD_API_VERSION) - 1);
        memcpy(p, ETCD_API_VERSION, sizeof(ETCD_API_VERSION) - 1);
        p += sizeof(ETCD_API_VERSION) - 1;
    }
    TK_ASSERT((size_t)(p - out) == len);
}

/* ---- sending ------------------------------------------------------------------ */

/* Queues chunks while the stream's queue is under SNAP_QUEUE_MAX and grpc.c
 * has room; finishes once the whole file is queued. */
static void snap_pump(struct snapstream *ss)
{
    /* A client that leaves after ending its half is told by no callback
     * (grpc.h: on_stream_end runs once): it is seen here, each turn. */
    if (grpc_call_gone(ss->call)) {
        snap_end(ss, false, GRPC_CANCELLED, "tierkv: the client left");
        return;
    }
    uint64_t now = tk_mono_ms();
    size_t queued = grpc_stream_queued(ss->call);
    if (queued < ss->last_queued)
        ss->progress_ms = now; /* the client took some */
    while (ss->sent < ss->total) {
        uint64_t left = ss->total - ss->sent;
        size_t chunk = left < SNAP_CHUNK ? (size_t)left : SNAP_CHUNK;
        size_t len = msg_len(ss, chunk);
        queued = grpc_stream_queued(ss->call);
        if (queued + GRPC_PREFIX_BYTES + len > SNAP_QUEUE_MAX ||
            grpc_stream_room(ss->call) < GRPC_PREFIX_BYTES + len)
            break;
        ss->chunk = chunk;
        ss->sending = true;
        int rc = grpc_stream_send(ss->call, len, snap_fill, ss);
        ss->sending = false;
        if (ss->call == NULL) { /* the connection failed in the send's flush */
            snap_free(ss);
            return;
        }
        if (rc == TK_EBUSY)
            break;
        if (rc == TK_ESHUTDOWN) { /* its connection closed in an earlier flush */
            snap_end(ss, false, GRPC_CANCELLED, "tierkv: the client left");
            return;
        }
        if (rc != 0) {
            snap_end(ss, false, GRPC_INTERNAL, "tierkv: the snapshot stream failed");
            return;
        }
        ss->sent += chunk;
        ss->progress_ms = now;
    }
    if (ss->sent == ss->total) {
        snap_end(ss, false, GRPC_OK, "");
        return;
    }
    ss->last_queued = grpc_stream_queued(ss->call);
    if (now - ss->progress_ms > SNAP_STALL_MS) {
        char msg[128];
        snprintf(msg, sizeof(msg),
                 "tierkv: the snapshot's client took nothing for %u s; retry",
                 SNAP_STALL_MS / 1000);
        snap_end(ss, true, GRPC_RESOURCE_EXHAUSTED, msg);
    }
}

static void on_check(uv_check_t *h)
{
    struct snapstream *ss = h->data;
    if (ss->call != NULL && ss->phase == SNAP_SEND)
        snap_pump(ss);
}

static void on_watchdog(uv_timer_t *t)
{
    struct snapstream *ss = t->data;
    if (ss->call != NULL && ss->phase == SNAP_SEND)
        snap_pump(ss);
}

/* ---- taking the backup ------------------------------------------------------ */

static void seal_run(uv_work_t *w)
{
    struct snapstream *ss = w->data;
    ss->seal_rc =
        kv_backup_seal(ss->stream->data, ss->stream->len, ss->cluster_id, ss->created_ms,
                       ss->hdr, ss->tr, &ss->info, ss->err, sizeof(ss->err));
}

static void seal_after(uv_work_t *w, int status)
{
    struct snapstream *ss = w->data;
    ss->owed = false;
    if (ss->call == NULL) { /* the client left meanwhile */
        snap_free(ss);
        return;
    }
    if (status != 0 || ss->seal_rc != 0) {
        /* A stream the node made that does not walk is a bug or bad memory. */
        char msg[224];
        snprintf(msg, sizeof(msg), "tierkv: the snapshot stream did not check out: %s",
                 status != 0 ? "cancelled" : ss->err);
        snap_end(ss, false, GRPC_INTERNAL, msg);
        return;
    }
    uint64_t file =
        KV_BACKUP_HEADER_BYTES + (uint64_t)ss->stream->len + KV_BACKUP_TRAILER_BYTES;
    uint64_t pad = (SNAP_ALIGN + SNAP_ALIGN_REST - file % SNAP_ALIGN) % SNAP_ALIGN;
    ss->total = file + pad;
    TK_ASSERT(ss->total % SNAP_ALIGN == SNAP_ALIGN_REST);
    Etcdserverpb__ResponseHeader h = ETCDSERVERPB__RESPONSE_HEADER__INIT;
    etcdapi__header(ss->e, ss->info.revision, &h);
    h.revision = (int64_t)ss->info.revision; /* the snapshot's point in time */
    ss->rhdr_len = etcdserverpb__response_header__get_packed_size(&h);
    TK_ASSERT(ss->rhdr_len <= sizeof(ss->rhdr));
    etcdserverpb__response_header__pack(&h, ss->rhdr);
    ss->phase = SNAP_SEND;
    ss->progress_ms = tk_mono_ms();
    uv_check_start(&ss->check, on_check);
    uv_timer_start(&ss->watchdog, on_watchdog, SNAP_WATCHDOG_MS, SNAP_WATCHDOG_MS);
    snap_pump(ss);
}

static void backup_go(struct snapstream *ss, int status, struct tk_blob *stream)
{
    ss->owed = false;
    if (status == 0)
        ss->stream = stream;
    if (ss->call == NULL) {
        snap_free(ss);
        return;
    }
    if (status == 0 && grpc_call_gone(ss->call)) {
        snap_end(ss, false, GRPC_CANCELLED, "tierkv: the client left");
        return;
    }
    if (status != 0) {
        snap_end(ss, false, GRPC_UNAVAILABLE,
                 status == TK_ESHUTDOWN ? "etcdserver: server stopped"
                                        : "tierkv: the node failed (storage or apply)");
        return;
    }
    ss->phase = SNAP_SEAL;
    ss->work.data = ss;
    if (uv_queue_work(ss->e->loop, &ss->work, seal_run, seal_after) != 0) {
        snap_end(ss, false, GRPC_UNAVAILABLE, "tierkv: cannot queue the snapshot's seal");
        return;
    }
    ss->owed = true;
}

static void backup_bounced(void *arg)
{
    struct snapstream *ss = arg;
    backup_go(ss, ss->ready_status, ss->ready_stream);
}

/* On the node's loop: the rest on the API's (etcdapi__bounce). */
static void backup_ready(int status, struct tk_blob *stream, uint64_t index,
                         uint64_t term, void *data)
{
    struct snapstream *ss = data;
    (void)index;
    (void)term;
    ss->ready_status = status;
    ss->ready_stream = stream;
    etcdapi__bounce(ss->e, backup_bounced, ss);
}

/* ---- the stream's hooks ------------------------------------------------------- */

static void snap_msg(struct grpc_call *call, const uint8_t *msg, size_t len)
{
    struct snapstream *ss = grpc_call_user(call);
    if (ss->phase != SNAP_ASKED) {
        snap_end(ss, true, GRPC_INVALID_ARGUMENT,
                 "tierkv: a Snapshot call takes one request");
        return;
    }
    /* SnapshotRequest has no fields, as StatusRequest: unpacked as one, so
     * that malformed bytes are refused. */
    Etcdserverpb__StatusRequest *rq =
        etcdapi__unpack(&etcdserverpb__status_request__descriptor, len, msg);
    if (rq == NULL) {
        snap_end(ss, false, GRPC_INVALID_ARGUMENT, "tierkv: a malformed SnapshotRequest");
        return;
    }
    etcdserverpb__status_request__free_unpacked(rq, NULL);
    ss->phase = SNAP_BACKUP;
    ss->cluster_id = node_cluster_id(ss->e->node);
    ss->created_ms = (uint64_t)time(NULL) * 1000; /* as GET /v1/snapshot */
    struct node_backup *h;
    int rc = TK_ESHUTDOWN;
    if (etcdapi__state_enter(ss->e)) {
        rc = node_backup_start(ss->e->node, backup_ready, ss, &h);
        etcdapi__state_leave(ss->e, rc == 0);
    }
    if (rc == 0) {
        ss->owed = true;
    } else if (rc == TK_EBUSY) {
        char m[160];
        snprintf(m, sizeof(m),
                 "tierkv: %d backups are being taken on this node (etcd and HTTP); "
                 "retry later",
                 NODE_BACKUPS_MAX);
        snap_end(ss, false, GRPC_RESOURCE_EXHAUSTED, m);
    } else {
        snap_end(ss, false, GRPC_UNAVAILABLE,
                 rc == TK_ESHUTDOWN ? "etcdserver: server stopped"
                                    : "tierkv: the node failed (storage or apply)");
    }
}

static void snap_stream_end(struct grpc_call *call, bool gone)
{
    struct snapstream *ss = grpc_call_user(call);
    if (gone)
        snap_end(ss, false, GRPC_CANCELLED, "tierkv: the client left");
    else if (ss->phase == SNAP_ASKED) /* ended its half without the request */
        snap_end(ss, false, GRPC_INVALID_ARGUMENT,
                 "tierkv: a Snapshot call needs its request");
    /* else the answer goes on */
}

static const struct estream_ops snapshot_ops = {.msg = snap_msg, .end = snap_stream_end};

void etcdapi__snapshot_open(struct etcdapi *e, struct grpc_call *call)
{
    if (e->snapshots >= SNAPSHOTS_MAX) {
        grpc_stream_finish(
            call, GRPC_RESOURCE_EXHAUSTED,
            "tierkv: %d snapshots are being sent by this node; retry later",
            SNAPSHOTS_MAX);
        return;
    }
    struct snapstream *ss = tk_calloc(1, sizeof(*ss));
    ss->ops = &snapshot_ops;
    ss->e = e;
    ss->call = call;
    ss->phase = SNAP_ASKED;
    uv_check_init(e->loop, &ss->check);
    uv_timer_init(e->loop, &ss->watchdog);
    ss->check.data = ss->watchdog.data = ss;
    ss->handles_open = 2;
    e->snapshots++;
    grpc_call_set_user(call, ss);
}
