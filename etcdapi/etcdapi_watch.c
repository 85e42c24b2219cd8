/* etcd's Watch service: one bidirectional gRPC stream (grpc.h, streams)
 * carries many watches, each created, canceled or asked for progress by a
 * WatchRequest, each answered by WatchResponses tagged with its watch_id.
 *
 * Events come from the KV's change log (kv_sm_events_read), as the HTTP
 * gateway's watches (gateway/api_watch.c) do: a watch follows the log from
 * its next revision; no LMDB transaction is held for it. A start_revision
 * the log no longer holds gets etcd's answer: created, then a response with
 * compact_revision (the log's first revision - 1) and canceled (clients
 * report ErrCompacted). A follower's log holds what it applied.
 *
 * Passes: when the node applied entries (etcdapi__watch_applied) a pass is
 * scheduled (at most every WATCH_PASS_MIN_MS); it visits every stream, and
 * each watch behind the applied index reads at most WATCH_EVENTS_PER_MSG
 * events and WATCH_MSG_BYTES of keys and values (whole revisions) into one
 * WatchResponse. Budgets:
 *   - per stream: what grpc.c queues for it (grpc_config.stream_out_max);
 *     when it does not take the next message the stream is blocked; a
 *     stream blocked for WATCH_STALL_MS is cut (RESOURCE_EXHAUSTED, its
 *     watches gone: clientv3 reconnects and resumes from its last revision);
 *   - per pass, over all watches: WATCH_TURN_BYTES sent and
 *     WATCH_TURN_SCANNED events looked at; the rest wait for a later pass,
 *     which waits WATCH_DUTY_WAIT times as long as this one took;
 *   - in all: streams hold at most WATCH_TOTAL_QUEUED bytes not yet taken
 *     by their clients (past it, the one holding the most is cut), and at
 *     most WATCH_PER_STREAM_MAX watches per stream, WATCH_TOTAL_MAX in all
 *     (a create past either is answered created and canceled with a
 *     reason).
 * A pass reads the change log under the node's state lock (etcdapi__
 * state_enter), for as long as its budget allows.
 * The API's loop thread only. Called by etcdapi.c (stream hooks, node
 * hooks); calls grpc.c, etcdapi_reply.c (headers), the kv change log. */
#include <string.h>
#include <uv.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/err.h"
#include "etcdapi/etcdapi_internal.h"
#include "kv/kv.h"

#define WATCH_PASS_MIN_MS 5
#define WATCH_RETRY_MS 20
#define WATCH_TICK_MS 1000
#define WATCH_EVENTS_PER_MSG 1000
#define WATCH_MSG_BYTES (1u << 20)
#define WATCH_TURN_BYTES (512u << 10)
#define WATCH_TURN_SCANNED 200000
#define WATCH_DUTY_WAIT 3
#define WATCH_STALL_MS 10000
#define WATCH_TOTAL_QUEUED (64u << 20)
#define WATCH_PER_STREAM_MAX 1024
#define WATCH_TOTAL_MAX 16384
/* progress_notify: a watch that sent nothing for this long gets a progress
 * response (etcd's default interval is 10 minutes; a shorter one is
 * allowed and cheap here). */
#define WATCH_PROGRESS_MS 5000
/* fragment: a revision whose events come to more than this (keys, values,
 * previous values and 64 bytes each) goes as several responses of at most
 * about this, fragment set on all but the last (clientv3 joins them). */
#define WATCH_FRAG_BYTES (1u << 20)

struct ewatch {
    struct ewatch *next;
    int64_t id;
    uint8_t *key, *end; /* end NULL: the one key; end_len 0: no upper bound */
    size_t key_len, end_len;
    bool single;
    bool prev_kv, no_put, no_delete, progress_notify;
    bool fragment;      /* the client takes a revision split (fragment) */
    uint32_t frag_skip; /* events of revision next_rev already sent in
                           fragments (0: none) */
    uint64_t next_rev;
    uint64_t last_sent_ms;
};

struct wstream {
    const struct estream_ops *ops; /* first: etcdapi.c dispatches on it */
    struct etcdapi *e;
    struct grpc_call *call;
    struct wstream *prev, *next;
    struct ewatch *watches;
    uint32_t n_watches;
    int64_t next_id;
    uint64_t blocked_since_ms; /* 0: its last message was taken */
    bool dead;                 /* ended during a walk of the streams: freed after it */
};

struct etcdapi_watch {
    struct etcdapi *e;
    uv_timer_t pass, tick;
    bool pass_due, started;
    uint64_t pass_ms, quiet_until_ms;
    struct wstream *streams;
    uint32_t n_streams, n_watches;
    size_t turn_bytes, turn_scanned;
    uint64_t cut, compacted;
    int closing; /* timers not closed yet (etcdapi__watch_stop) */
    /* Walking the streams (a pass, a tick): a stream ended meanwhile stays
     * linked, dead, until the walk ends (reap). Sending to one stream can
     * end another: grpc.c's flush may close it, and its end is told. */
    int walking;
    uint32_t n_dead;
};

/* ---- one message's events --------------------------------------------------- */

struct wev {
    int type; /* mvccpb Event type: 0 put, 1 delete */
    uint64_t revision, version, create;
    size_t key_off, key_len, val_off, val_len;
    bool has_prev;
    size_t prev_off, prev_len;
    uint64_t prev_version, prev_create, prev_mod;
};

struct collect {
    const struct ewatch *w;
    struct wev *ev;
    size_t n, cap;
    uint8_t *bytes;
    size_t len, bytes_cap;
    size_t scanned;
};

static size_t put_bytes(struct collect *c, const uint8_t *p, size_t len)
{
    if (c->len + len > c->bytes_cap) {
        size_t cap = c->bytes_cap ? c->bytes_cap : 4096;
        while (cap < c->len + len)
            cap *= 2;
        c->bytes = tk_realloc(c->bytes, cap);
        c->bytes_cap = cap;
    }
    size_t off = c->len;
    if (len > 0)
        memcpy(c->bytes + off, p, len);
    c->len += len;
    return off;
}

static bool matches(const struct ewatch *w, const uint8_t *k, size_t len)
{
    size_t n = len < w->key_len ? len : w->key_len;
    int c = memcmp(k, w->key, n);
    if (w->single)
        return len == w->key_len && c == 0;
    if (c < 0 || (c == 0 && len < w->key_len))
        return false;
    if (w->end_len == 0)
        return true;
    n = len < w->end_len ? len : w->end_len;
    c = memcmp(k, w->end, n);
    return c < 0 || (c == 0 && len < w->end_len);
}

static void on_event(const struct kv_event *ev, void *data)
{
    struct collect *c = data;
    const struct ewatch *w = c->w;
    c->scanned++;
    if (ev->key_len > 0 && ev->key[0] == 0x01)
        return; /* the node's own records (members, client URLs), as Range's */
    bool put = ev->type == KV_EVENT_PUT;
    if ((put && w->no_put) || (!put && w->no_delete) || !matches(w, ev->key, ev->key_len))
        return;
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 16;
        c->ev = tk_realloc(c->ev, c->cap * sizeof(*c->ev));
    }
    struct wev *e = &c->ev[c->n++];
    memset(e, 0, sizeof(*e));
    e->type = put ? 0 : 1;
    e->revision = ev->revision;
    e->version = ev->version;
    e->create = ev->create_revision;
    e->key_len = ev->key_len;
    e->key_off = put_bytes(c, ev->key, ev->key_len);
    e->val_len = put ? ev->value_len : 0;
    e->val_off = put_bytes(c, ev->value, e->val_len);
    if (w->prev_kv && ev->has_prev) {
        e->has_prev = true;
        e->prev_len = ev->prev_value_len;
        e->prev_off = put_bytes(c, ev->prev_value, ev->prev_value_len);
        e->prev_version = ev->prev_version;
        e->prev_create = ev->prev_create_revision;
        e->prev_mod = ev->prev_mod_revision;
    }
}

static void collect_free(struct collect *c)
{
    tk_free(c->ev);
    tk_free(c->bytes);
}

/* ---- sending ------------------------------------------------------------------ */

static void fill_packed(uint8_t *out, size_t len, const void *arg)
{
    size_t n = protobuf_c_message_pack(arg, out);
    TK_ASSERT(n == len);
}

/* Packs and queues r: 0, TK_EBUSY (not taken: try later), TK_ETOOBIG or
 * TK_ESHUTDOWN. */
static int send_resp(struct wstream *ws, Etcdserverpb__WatchResponse *r, uint64_t rev)
{
    Etcdserverpb__ResponseHeader h = ETCDSERVERPB__RESPONSE_HEADER__INIT;
    etcdapi__header(ws->e, rev, &h);
    r->header = &h;
    size_t len = protobuf_c_message_get_packed_size(&r->base);
    int rc = grpc_stream_send(ws->call, len, fill_packed, &r->base);
    if (rc == 0)
        ws->e->watch->turn_bytes += len;
    return rc;
}

/* A control answer (created, canceled, progress): 0 or the error. */
static int send_ctl(struct wstream *ws, int64_t id, bool created, bool canceled,
                    int64_t compact, const char *reason, uint64_t rev)
{
    Etcdserverpb__WatchResponse r = ETCDSERVERPB__WATCH_RESPONSE__INIT;
    r.watch_id = id;
    r.created = created;
    r.canceled = canceled;
    r.compact_revision = compact;
    r.cancel_reason = (char *)(reason ? reason : "");
    return send_resp(ws, &r, rev);
}

/* Events as a WatchResponse for w (a fragment: more of their revision
 * follows). */
static int send_events(struct wstream *ws, const struct ewatch *w, struct collect *c,
                       bool fragment)
{
    Mvccpb__Event *ev = tk_calloc(c->n, sizeof(*ev));
    Mvccpb__Event **evp = tk_calloc(c->n, sizeof(*evp));
    Mvccpb__KeyValue *kv = tk_calloc(2 * c->n, sizeof(*kv));
    for (size_t i = 0; i < c->n; i++) {
        const struct wev *x = &c->ev[i];
        mvccpb__event__init(&ev[i]);
        Mvccpb__KeyValue *k = &kv[2 * i], *p = &kv[2 * i + 1];
        mvccpb__key_value__init(k);
        ev[i].type = x->type == 0 ? MVCCPB__EVENT__EVENT_TYPE__PUT
                                  : MVCCPB__EVENT__EVENT_TYPE__DELETE;
        k->key.data = c->bytes + x->key_off;
        k->key.len = x->key_len;
        k->mod_revision = (int64_t)x->revision;
        if (x->type == 0) {
            k->value.data = c->bytes + x->val_off;
            k->value.len = x->val_len;
            k->version = (int64_t)x->version;
            k->create_revision = (int64_t)x->create;
        }
        ev[i].kv = k;
        if (x->has_prev) {
            mvccpb__key_value__init(p);
            p->key = k->key;
            p->value.data = c->bytes + x->prev_off;
            p->value.len = x->prev_len;
            p->version = (int64_t)x->prev_version;
            p->create_revision = (int64_t)x->prev_create;
            p->mod_revision = (int64_t)x->prev_mod;
            ev[i].prev_kv = p;
        }
        evp[i] = &ev[i];
    }
    Etcdserverpb__WatchResponse r = ETCDSERVERPB__WATCH_RESPONSE__INIT;
    r.watch_id = w->id;
    r.events = evp;
    r.n_events = c->n;
    r.fragment = fragment;
    int rc = send_resp(ws, &r, c->ev[c->n - 1].revision);
    tk_free(kv);
    tk_free(evp);
    tk_free(ev);
    return rc;
}

static size_t event_bytes(const struct wev *x)
{
    return x->key_len + x->val_len + x->prev_len + 64;
}

/* A fragmenting watch whose read is over WATCH_FRAG_BYTES (or that is in
 * the middle of a revision): the next piece of the first revision read,
 * from frag_skip on, of at most WATCH_FRAG_BYTES (one event at least).
 * Sets *next to the revision after it once its last piece is queued. */
static int send_fragment(struct wstream *ws, struct ewatch *w, struct collect *c,
                         uint64_t *next)
{
    uint64_t rev = c->ev[0].revision;
    size_t end = 0;
    while (end < c->n && c->ev[end].revision == rev)
        end++;
    size_t i = w->frag_skip < end ? w->frag_skip : 0, j = i, sum = 0;
    while (j < end && (j == i || sum + event_bytes(&c->ev[j]) <= WATCH_FRAG_BYTES))
        sum += event_bytes(&c->ev[j++]);
    struct collect part = *c;
    part.ev = c->ev + i;
    part.n = j - i;
    int rc = send_events(ws, w, &part, j < end);
    if (rc != 0)
        return rc;
    w->frag_skip = j < end ? (uint32_t)j : 0;
    *next = j < end ? rev : rev + 1;
    return 0;
}

static bool needs_fragments(const struct ewatch *w, const struct collect *c)
{
    if (!w->fragment)
        return false;
    if (w->frag_skip > 0)
        return true;
    size_t sum = 0;
    for (size_t i = 0; i < c->n; i++)
        sum += event_bytes(&c->ev[i]);
    return sum > WATCH_FRAG_BYTES;
}

/* ---- streams and watches ------------------------------------------------------- */

static void watch_free(struct ewatch *w)
{
    tk_free(w->key);
    tk_free(w->end);
    tk_free(w);
}

static void watch_remove(struct wstream *ws, struct ewatch *w)
{
    struct ewatch **pp = &ws->watches;
    while (*pp != w)
        pp = &(*pp)->next;
    *pp = w->next;
    ws->n_watches--;
    ws->e->watch->n_watches--;
    watch_free(w);
}

/* Ends the stream (the call is finished and freed by grpc.c). */
static void stream_unlink(struct etcdapi_watch *W, struct wstream *ws)
{
    if (ws->prev)
        ws->prev->next = ws->next;
    else
        W->streams = ws->next;
    if (ws->next)
        ws->next->prev = ws->prev;
    tk_free(ws);
}

/* Frees the streams that ended during a walk. At most n_streams + n_dead. */
static void reap(struct etcdapi_watch *W)
{
    struct wstream *next;
    for (struct wstream *ws = W->streams; ws != NULL && W->n_dead > 0; ws = next) {
        next = ws->next;
        if (ws->dead) {
            W->n_dead--;
            stream_unlink(W, ws);
        }
    }
}

static void stream_end(struct wstream *ws, int code, const char *msg, bool drop)
{
    struct etcdapi_watch *W = ws->e->watch;
    TK_ASSERT(!ws->dead);
    while (ws->watches != NULL)
        watch_remove(ws, ws->watches);
    if (--W->n_streams == 0 && ws->e->own_loop)
        node_client_want_applied(ws->e->node, false); /* no wake-up per apply */
    struct grpc_call *call = ws->call;
    ws->call = NULL;
    ws->dead = true;
    if (W->walking > 0)
        W->n_dead++; /* freed by reap, after the walk */
    else
        stream_unlink(W, ws);
    if (drop) /* last: it may end other streams (grpc.c's flush) */
        grpc_stream_abort(call, code, "%s", msg);
    else
        grpc_stream_finish(call, code, "%s", msg);
}

static void cut(struct wstream *ws, const char *why)
{
    ws->e->watch->cut++;
    stream_end(ws, GRPC_RESOURCE_EXHAUSTED, why, true);
}

enum { STEP_OK, STEP_BLOCKED, STEP_BUDGET };

/* One watch's turn: one message of events from next_rev on. */
static int watch_step(struct wstream *ws, struct ewatch *w, uint64_t applied, bool *more)
{
    struct etcdapi_watch *W = ws->e->watch;
    struct kv_sm *sm = node_kv(ws->e->node);
    if (w->next_rev > applied)
        return STEP_OK;
    if (W->turn_bytes >= WATCH_TURN_BYTES || W->turn_scanned >= WATCH_TURN_SCANNED) {
        *more = true;
        return STEP_BUDGET;
    }
    size_t room = grpc_stream_room(ws->call);
    size_t bytes = room < WATCH_MSG_BYTES ? room : WATCH_MSG_BYTES;
    if (bytes < 1024)
        bytes = 1024; /* one revision at least; the send says whether it fits */
    struct collect c = {.w = w};
    uint64_t next = w->next_rev;
    int rc = kv_sm_events_read(sm, w->next_rev, WATCH_EVENTS_PER_MSG, bytes, on_event, &c,
                               &next);
    W->turn_scanned += c.scanned + 1;
    if (rc == TK_ECOMPACTED) {
        collect_free(&c);
        uint64_t first = kv_sm_events_first(sm);
        rc = send_ctl(ws, w->id, false, true, (int64_t)(first - 1),
                      "etcdserver: mvcc: required revision has been compacted", 0);
        if (ws->dead)
            return STEP_OK;
        if (rc == TK_EBUSY)
            return STEP_BLOCKED;
        W->compacted++;
        watch_remove(ws, w);
        return STEP_OK;
    }
    if (c.n > 0) {
        rc = needs_fragments(w, &c) ? send_fragment(ws, w, &c, &next)
                                    : send_events(ws, w, &c, false);
        collect_free(&c);
        if (ws->dead)
            return STEP_OK;
        if (rc == TK_EBUSY)
            return STEP_BLOCKED;
        if (rc == TK_ETOOBIG) {
            (void)send_ctl(ws, w->id, false, true, 0,
                           "tierkv: a revision's events are over the message limit", 0);
            if (!ws->dead)
                watch_remove(ws, w);
            return STEP_OK;
        }
        w->last_sent_ms = uv_now(ws->e->loop);
        ws->blocked_since_ms = 0;
    } else {
        collect_free(&c);
    }
    w->next_rev = next;
    if (w->next_rev <= applied)
        *more = true;
    return STEP_OK;
}

/* Every watch of the stream once. A stream its client has not taken a
 * message from for WATCH_STALL_MS is cut. False if it ended. */
static bool stream_pass(struct wstream *ws, uint64_t applied, uint64_t now, bool *more)
{
    struct ewatch *next;
    for (struct ewatch *w = ws->watches; w != NULL; w = next) {
        next = w->next;
        int rc = watch_step(ws, w, applied, more);
        if (ws->dead)
            return false;
        if (rc == STEP_BUDGET)
            return true;
        if (rc == STEP_BLOCKED) {
            *more = true;
            if (ws->blocked_since_ms == 0) {
                ws->blocked_since_ms = now;
            } else if (now - ws->blocked_since_ms >= WATCH_STALL_MS) {
                cut(ws, "tierkv: the watch stream's client took no events for 10 s "
                        "(lagging); watch again from the last revision seen");
                return false;
            }
            return true;
        }
    }
    return true;
}

static size_t stream_queued(const struct wstream *ws)
{
    return grpc_stream_queued(ws->call);
}

/* All streams together hold at most WATCH_TOTAL_QUEUED bytes their clients
 * have not taken: past it, the ones holding the most are cut. At most
 * n_streams cuts, each a walk of the streams. */
static void over_total(struct etcdapi_watch *W)
{
    size_t total = 0;
    for (struct wstream *ws = W->streams; ws != NULL; ws = ws->next)
        if (!ws->dead)
            total += stream_queued(ws);
    while (total > WATCH_TOTAL_QUEUED) {
        struct wstream *big = NULL;
        size_t most = 0;
        for (struct wstream *ws = W->streams; ws != NULL; ws = ws->next) {
            if (!ws->dead && stream_queued(ws) > most) {
                most = stream_queued(ws);
                big = ws;
            }
        }
        if (big == NULL)
            return;
        total -= most;
        cut(big, "tierkv: watch streams hold too many bytes their clients have not "
                 "taken (lagging); watch again from the last revision seen");
    }
}

static void schedule(struct etcdapi_watch *W, uint64_t wait_ms);

/* A streams list that starts at ws: the ones a spent budget left out go
 * first next time. */
static void rotate_to(struct etcdapi_watch *W, struct wstream *ws)
{
    if (ws == W->streams)
        return;
    struct wstream *tail = ws;
    while (tail->next != NULL)
        tail = tail->next;
    ws->prev->next = NULL;
    tail->next = W->streams;
    W->streams->prev = tail;
    ws->prev = NULL;
    W->streams = ws;
}

static void on_pass(uv_timer_t *t)
{
    struct etcdapi_watch *W = t->data;
    struct etcdapi *e = W->e;
    W->pass_due = false;
    if (e->stopping)
        return;
    uint64_t now = uv_now(e->loop), t0 = uv_hrtime();
    W->pass_ms = now;
    W->turn_bytes = W->turn_scanned = 0;
    W->walking++;
    over_total(W);
    /* The change log is read under the state lock for the whole pass (its
     * budget bounds it: WATCH_TURN_BYTES, WATCH_TURN_SCANNED). */
    if (!etcdapi__state_enter(e)) { /* the node stops */
        W->walking--;
        reap(W);
        return;
    }
    uint64_t applied = kv_sm_applied_index(node_kv(e->node));
    bool more = false;
    struct wstream *left_out = NULL, *next;
    for (struct wstream *ws = W->streams; ws != NULL; ws = next) {
        next = ws->next;
        if (ws->dead)
            continue;
        bool spent =
            W->turn_bytes >= WATCH_TURN_BYTES || W->turn_scanned >= WATCH_TURN_SCANNED;
        if (spent && left_out == NULL)
            left_out = ws;
        if (spent) {
            more = true;
            break;
        }
        (void)stream_pass(ws, applied, now, &more);
    }
    etcdapi__state_leave(e, false);
    if (left_out != NULL)
        rotate_to(W, left_out);
    W->walking--;
    reap(W);
    if (more) {
        uint64_t wait = WATCH_RETRY_MS;
        if (W->turn_bytes >= WATCH_TURN_BYTES || W->turn_scanned >= WATCH_TURN_SCANNED)
            wait = 1 + WATCH_DUTY_WAIT * ((uv_hrtime() - t0) / 1000000);
        schedule(W, wait);
    }
}

static void schedule(struct etcdapi_watch *W, uint64_t wait_ms)
{
    if (W->pass_due || W->streams == NULL || !W->started)
        return;
    W->pass_due = true;
    uv_timer_start(&W->pass, on_pass, wait_ms, 0);
}

void etcdapi__watch_applied(struct etcdapi *e)
{
    struct etcdapi_watch *W = e->watch;
    if (W == NULL || W->streams == NULL)
        return;
    uint64_t since = uv_now(e->loop) - W->pass_ms;
    schedule(W, since >= WATCH_PASS_MIN_MS ? 0 : WATCH_PASS_MIN_MS - since);
}

/* Once a second: progress for the watches that asked for it and sent
 * nothing for WATCH_PROGRESS_MS, and a pass for blocked streams. */
static void on_tick(uv_timer_t *t)
{
    struct etcdapi_watch *W = t->data;
    struct etcdapi *e = W->e;
    if (e->stopping || W->streams == NULL)
        return;
    uint64_t now = uv_now(e->loop);
    uint64_t applied = node_applied_index(e->node);
    bool any_blocked = false;
    W->walking++;
    for (struct wstream *ws = W->streams; ws != NULL; ws = ws->next) {
        any_blocked |= ws->blocked_since_ms != 0;
        struct ewatch *next;
        for (struct ewatch *w = ws->watches; w != NULL && !ws->dead; w = next) {
            next = w->next;
            if (!w->progress_notify || w->next_rev <= applied ||
                now - w->last_sent_ms < WATCH_PROGRESS_MS)
                continue;
            int rc = send_ctl(ws, w->id, false, false, 0, NULL, 0);
            if (ws->dead)
                break; /* the send's flush ended this stream */
            if (rc == 0)
                w->last_sent_ms = now;
        }
    }
    W->walking--;
    reap(W);
    if (any_blocked)
        schedule(W, 0);
}

/* ---- requests ------------------------------------------------------------------ */

static uint8_t *dup_bytes(const ProtobufCBinaryData *b)
{
    uint8_t *p = tk_malloc(b->len + 1);
    if (b->len > 0)
        memcpy(p, b->data, b->len);
    return p;
}

static void create_watch(struct wstream *ws, const Etcdserverpb__WatchCreateRequest *rq)
{
    struct etcdapi *e = ws->e;
    struct etcdapi_watch *W = e->watch;
    uint64_t applied = node_applied_index(e->node);
    int64_t id = rq->watch_id;
    if (id == 0) { /* 0 is "the server picks" (an explicit 0 too, as etcd's
                      AutoWatchID) */
        for (bool taken = true; taken;) {
            id = ws->next_id++;
            taken = false;
            for (struct ewatch *w = ws->watches; w != NULL; w = w->next)
                taken |= w->id == id;
        }
    }
    const char *why = NULL;
    if (id < 0)
        why = "etcdserver: invalid watch ID";
    for (struct ewatch *w = ws->watches; w != NULL && why == NULL; w = w->next)
        if (w->id == id)
            why = "etcdserver: duplicate watch ID";
    if (why == NULL && rq->key.len == 0 && rq->range_end.len == 0)
        why = "etcdserver: key is not provided";
    if (why == NULL &&
        (rq->key.len > e->cfg.key_max || rq->range_end.len > e->cfg.key_max))
        why = "etcdserver: request is too large";
    if (why == NULL && ws->n_watches >= WATCH_PER_STREAM_MAX)
        why = "tierkv: too many watches on this stream (1024)";
    if (why == NULL && W->n_watches >= WATCH_TOTAL_MAX)
        why = "tierkv: too many watches on this node (16384)";
    if (why != NULL) {
        (void)send_ctl(ws, id < 0 ? -1 : id, true, true, 0, why, 0);
        return;
    }
    struct ewatch *w = tk_calloc(1, sizeof(*w));
    w->id = id;
    w->key = dup_bytes(&rq->key);
    w->key_len = rq->key.len;
    if (rq->range_end.len == 0) {
        w->single = true;
    } else if (!(rq->range_end.len == 1 && rq->range_end.data[0] == 0)) {
        w->end = dup_bytes(&rq->range_end); /* "\0": from key on, no bound */
        w->end_len = rq->range_end.len;
    }
    w->prev_kv = rq->prev_kv;
    w->fragment = rq->fragment;
    w->progress_notify = rq->progress_notify;
    for (size_t i = 0; i < rq->n_filters; i++) {
        if (rq->filters[i] == ETCDSERVERPB__WATCH_CREATE_REQUEST__FILTER_TYPE__NOPUT)
            w->no_put = true;
        else if (rq->filters[i] ==
                 ETCDSERVERPB__WATCH_CREATE_REQUEST__FILTER_TYPE__NODELETE)
            w->no_delete = true;
    }
    w->next_rev = rq->start_revision > 0 ? (uint64_t)rq->start_revision : applied + 1;
    w->last_sent_ms = uv_now(e->loop);
    if (send_ctl(ws, id, true, false, 0, NULL, 0) != 0) {
        watch_free(w);
        cut(ws, "tierkv: the watch stream's client does not take its answers");
        return;
    }
    w->next = ws->watches;
    ws->watches = w;
    ws->n_watches++;
    W->n_watches++;
    etcdapi__watch_applied(e); /* history, or a compacted start, at once */
}

static void cancel_watch(struct wstream *ws, int64_t id)
{
    for (struct ewatch *w = ws->watches; w != NULL; w = w->next) {
        if (w->id == id) {
            watch_remove(ws, w);
            (void)send_ctl(ws, id, false, true, 0, NULL, 0);
            return;
        }
    }
    /* etcd answers an unknown id with nothing */
}

/* A progress request: every event up to the revision answered has been
 * sent (the lowest point any of the stream's watches reached), watch_id
 * -1 as etcd's broadcast progress. */
static void progress(struct wstream *ws)
{
    uint64_t rev = node_applied_index(ws->e->node);
    for (struct ewatch *w = ws->watches; w != NULL; w = w->next)
        if (w->next_rev - 1 < rev)
            rev = w->next_rev - 1;
    Etcdserverpb__WatchResponse r = ETCDSERVERPB__WATCH_RESPONSE__INIT;
    r.watch_id = -1;
    Etcdserverpb__ResponseHeader h = ETCDSERVERPB__RESPONSE_HEADER__INIT;
    etcdapi__header(ws->e, 0, &h);
    h.revision = (int64_t)rev;
    r.header = &h;
    size_t len = protobuf_c_message_get_packed_size(&r.base);
    (void)grpc_stream_send(ws->call, len, fill_packed, &r.base);
}

static void on_msg(struct grpc_call *call, const uint8_t *msg, size_t len)
{
    struct wstream *ws = grpc_call_user(call);
    Etcdserverpb__WatchRequest *rq =
        etcdapi__unpack(&etcdserverpb__watch_request__descriptor, len, msg);
    if (rq == NULL) {
        stream_end(ws, GRPC_INVALID_ARGUMENT, "tierkv: a malformed WatchRequest", false);
        return;
    }
    switch (rq->request_union_case) {
    case ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CREATE_REQUEST:
        create_watch(ws, rq->create_request);
        break;
    case ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CANCEL_REQUEST:
        cancel_watch(ws, rq->cancel_request->watch_id);
        break;
    case ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_PROGRESS_REQUEST:
        progress(ws);
        break;
    default:
        break; /* an empty request: nothing, as etcd */
    }
    etcdserverpb__watch_request__free_unpacked(rq, NULL);
}

/* The client ended its half (its watches end: etcd's server returns when
 * its receive loop ends) or left. */
static void on_end(struct grpc_call *call, bool gone)
{
    (void)gone;
    stream_end(grpc_call_user(call), GRPC_OK, "", false);
}

static const struct estream_ops watch_ops = {.msg = on_msg, .end = on_end};

void etcdapi__watch_open(struct etcdapi *e, struct grpc_call *call)
{
    struct etcdapi_watch *W = e->watch;
    struct wstream *ws = tk_calloc(1, sizeof(*ws));
    ws->ops = &watch_ops;
    ws->e = e;
    ws->call = call;
    ws->next_id = 0;
    grpc_call_set_user(call, ws);
    if (e->stopping || W == NULL || !W->started) {
        tk_free(ws);
        grpc_stream_finish(call, GRPC_UNAVAILABLE, "etcdserver: server stopped");
        return;
    }
    ws->next = W->streams;
    if (W->streams)
        W->streams->prev = ws;
    W->streams = ws;
    if (W->n_streams++ == 0 && e->own_loop)
        node_client_want_applied(e->node, true); /* passes follow the applies */
}

/* ---- lifecycle ------------------------------------------------------------------ */

void etcdapi__watch_start(struct etcdapi *e)
{
    struct etcdapi_watch *W = tk_calloc(1, sizeof(*W));
    W->e = e;
    uv_timer_init(e->loop, &W->pass);
    W->pass.data = W;
    uv_timer_init(e->loop, &W->tick);
    W->tick.data = W;
    uv_timer_start(&W->tick, on_tick, WATCH_TICK_MS, WATCH_TICK_MS);
    W->started = true;
    e->watch = W;
}

static void on_timer_closed(uv_handle_t *h)
{
    struct etcdapi_watch *W = h->data;
    if (--W->closing == 0)
        tk_free(W);
}

/* After grpc_server_stop (every stream ended, gone). */
void etcdapi__watch_stop(struct etcdapi *e)
{
    struct etcdapi_watch *W = e->watch;
    if (W == NULL)
        return;
    while (W->streams != NULL)
        stream_end(W->streams, GRPC_UNAVAILABLE, "etcdserver: server stopped", false);
    W->started = false;
    e->watch = NULL;
    W->closing = 2;
    uv_close((uv_handle_t *)&W->pass, on_timer_closed);
    uv_close((uv_handle_t *)&W->tick, on_timer_closed);
}
