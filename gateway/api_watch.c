/* GET /v1/watch: the change log (kv_sm_events_read) streamed to a client.
 *
 * A watcher follows this node's change log from its next revision: NDJSON
 * (one event object a line) or, for Accept: text/event-stream, Server-Sent
 * Events (one message per revision, id = the revision, an event a data
 * line). It reads the ring only on the loop, when the node has applied
 * entries (api__watch_applied schedules one pass over every watcher for the
 * next loop turn) or when its own timer fires; each pass passes at most
 * WATCH_EVENTS_PER_PASS events and whole revisions, written in one chunk, so
 * a revision is never split. Nothing waits for a watcher: a watcher whose
 * client has not taken gw->cfg.watch_buffer_bytes of what was written is
 * cancelled with a final {"error":{"code":"lagging","resume_revision":R}}; a
 * watcher the ring has moved past gets {"error":{"code":"compacted",
 * "compact_revision":C}} (410 before the stream began). A follower's ring
 * holds only what it applied, so it never sends more. No LMDB transaction is
 * held for a watcher: the ring is memory, read under the node's state lock
 * (api__state_enter), let go before anything is sent. The gateway's loop
 * only. Called by api.c
 * and metrics.c (api__watch_pending);
 * calls api_auth.c (the user may read the range), api_reply.c, http.c, json.c,
 * node_kv. */
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/err.h"
#include "gateway/gateway_internal.h"

#define WATCH_EVENTS_PER_PASS 1024
#define WATCH_FULL_POLL_MS 10
#define WATCH_PASS_MIN_MS 5
#define WATCH_SHARED_MAX 4096
/* Bytes written to watchers in one loop turn, over all of them (about 10 ms
 * of formatting, copying and page faults on this VM): past it the rest wait,
 * so a thousand watchers cannot make one long turn. */
#define WATCH_TURN_BYTES (512u << 10)
/* And after a pass that spent it, the next pass waits twice as long as that
 * one took: watches get at most a third of the loop while they have more to
 * send than it can take, the rest goes to Raft and the other clients. */
#define WATCH_DUTY_WAIT 3
/* A watch cut for lagging: its last bytes (the error frame) get this long to
 * go out, then its connection closes and frees what it held. */
#define WATCH_CUT_GRACE_MS 2000

struct watcher {
    struct watcher *prev, *next;
    struct gateway *gw;
    struct http_request *http;
    uv_timer_t timer; /* progress frames (and a pass after a full one) */
    uint8_t *start, *end;
    size_t start_len, end_len;
    int kind; /* W_KEY, W_PREFIX, W_RANGE */
    uint64_t next_rev;
    uint64_t progress_ms, last_write_ms;
    bool prev_kv, sse, b64;
    bool ended, busy, gone;
    bool cut;               /* ended for lagging: its connection closes soon after */
    uint64_t open_rev;      /* SSE: the revision whose message is open (0: none) */
    uint64_t full_since_ms; /* its buffer full, events waiting, since (0: not) */
    size_t full_pending;    /* the bytes pending then */
    uint64_t timer_period_ms;
    bool synced; /* takes this pass's shared events (api__watch_run) */
    struct jbuf out;
};

enum { W_KEY, W_PREFIX, W_RANGE };

/* What this loop turn may still write to watchers (WATCH_TURN_BYTES). */
static size_t turn_room(struct gateway *gw)
{
    uint64_t now = uv_now(gw->loop);
    if (now < gw->watch_quiet_until_ms)
        return 0; /* the duty cycle's wait (api__watch_run) */
    if (now != gw->watch_turn_ms) {
        gw->watch_turn_ms = now;
        gw->watch_turn_bytes = 0;
    }
    return gw->watch_turn_bytes < WATCH_TURN_BYTES
               ? WATCH_TURN_BYTES - gw->watch_turn_bytes
               : 0;
}

/* ---- matching and formatting ---------------------------------------------- */

static bool matches(const struct watcher *w, const uint8_t *k, size_t len)
{
    switch (w->kind) {
    case W_KEY:
        return len == w->start_len && memcmp(k, w->start, len) == 0;
    case W_PREFIX:
        return len >= w->start_len && memcmp(k, w->start, w->start_len) == 0;
    default: {
        size_t n = len < w->start_len ? len : w->start_len;
        int c = memcmp(k, w->start, n);
        if (c < 0 || (c == 0 && len < w->start_len))
            return false;
        if (w->end_len == 0)
            return true;
        n = len < w->end_len ? len : w->end_len;
        c = memcmp(k, w->end, n);
        return c < 0 || (c == 0 && len < w->end_len);
    }
    }
}

static void put_bytes(struct jbuf *b, const char *name, const char *enc_name,
                      const uint8_t *p, size_t len, bool b64)
{
    jbuf_printf(b, ",\"%s\":", name);
    if (!b64 && json_utf8_valid(p, len)) {
        jbuf_jstr(b, p, len);
    } else {
        jbuf_jb64(b, p, len);
        jbuf_printf(b, ",\"%s\":\"base64\"", enc_name);
    }
}

static const char *type_name(int type)
{
    return type == KV_EVENT_PUT ? "put" : type == KV_EVENT_EXPIRE ? "expire" : "delete";
}

static void put_event(struct watcher *w, const struct kv_event *ev)
{
    struct jbuf *b = &w->out;
    if (w->sse) {
        if (w->open_rev != ev->revision) {
            if (w->open_rev != 0)
                jbuf_printf(b, "id: %llu\n\n", (unsigned long long)w->open_rev);
            w->open_rev = ev->revision;
        }
        jbuf_adds(b, "data: ");
    }
    jbuf_printf(b, "{\"revision\":%llu,\"type\":\"%s\"", (unsigned long long)ev->revision,
                type_name(ev->type));
    put_bytes(b, "key", "key_encoding", ev->key, ev->key_len, w->b64);
    if (ev->type == KV_EVENT_PUT) {
        put_bytes(b, "value", "encoding", ev->value, ev->value_len, w->b64);
        jbuf_printf(b, ",\"version\":%llu,\"create_revision\":%llu",
                    (unsigned long long)ev->version,
                    (unsigned long long)ev->create_revision);
    }
    if (w->prev_kv && ev->has_prev) {
        jbuf_adds(b, ",\"prev\":{\"version\":");
        jbuf_printf(b, "%llu,\"create_revision\":%llu,\"mod_revision\":%llu",
                    (unsigned long long)ev->prev_version,
                    (unsigned long long)ev->prev_create_revision,
                    (unsigned long long)ev->prev_mod_revision);
        put_bytes(b, "value", "encoding", ev->prev_value, ev->prev_value_len, w->b64);
        jbuf_adds(b, "}");
    }
    jbuf_adds(b, "}\n");
}

static void on_event(const struct kv_event *ev, void *data)
{
    struct watcher *w = data;
    if (matches(w, ev->key, ev->key_len))
        put_event(w, ev);
}

/* ---- the stream ------------------------------------------------------------ */

static void on_timer_closed(uv_handle_t *h)
{
    struct watcher *w = h->data;
    jbuf_free(&w->out);
    tk_free(w->start);
    tk_free(w->end);
    tk_free(w);
}

/* Ends the stream (the request may be freed) and frees the watcher. */
static void watch_end(struct watcher *w)
{
    if (w->ended)
        return;
    w->ended = true;
    bool cut = w->cut;
    struct gateway *gw = w->gw;
    if (w->prev)
        w->prev->next = w->next;
    else
        gw->watchers = w->next;
    if (w->next)
        w->next->prev = w->prev;
    if (--gw->n_watchers == 0 && gw->own_loop && !gw->stopping)
        node_client_want_applied(gw->node, false); /* no wake-up per apply */
    if (cut)
        http_stream_end_within(w->http, WATCH_CUT_GRACE_MS);
    else
        http_stream_end(w->http);
    w->http = NULL;
    uv_close((uv_handle_t *)&w->timer, on_timer_closed);
}

/* Writes what w->out holds as one chunk. False if the watcher ended. */
static bool flush(struct watcher *w)
{
    if (w->out.len == 0)
        return true;
    w->busy = true;
    w->gw->watch_turn_bytes += w->out.len;
    int rc = http_stream_write(w->http, w->out.p, w->out.len);
    w->busy = false;
    w->out.len = 0;
    w->last_write_ms = uv_now(w->gw->loop);
    if (rc != 0 || w->gone) {
        watch_end(w);
        return false;
    }
    return true;
}

/* A final error frame, then the end. */
static void watch_fail(struct watcher *w, const char *code, const char *field,
                       uint64_t rev)
{
    w->out.len = 0;
    w->cut = strcmp(code, "lagging") == 0;
    if (w->sse)
        jbuf_adds(&w->out, "event: error\ndata: ");
    jbuf_printf(&w->out, "{\"error\":{\"code\":\"%s\",\"%s\":%llu}}\n%s", code, field,
                (unsigned long long)rev, w->sse ? "\n" : "");
    if (flush(w))
        watch_end(w);
}

static void on_gone(struct http_request *req, void *data)
{
    struct watcher *w = data;
    (void)req;
    if (w->busy)
        w->gone = true; /* flush ends it */
    else
        watch_end(w);
}

static void on_timer(uv_timer_t *t);

/* The watcher's timer: every WATCH_FULL_POLL_MS while its buffer is full,
 * else every progress_ms (or not at all). */
static void arm(struct watcher *w, bool full)
{
    uint64_t period = full ? WATCH_FULL_POLL_MS : w->progress_ms;
    if (period == w->timer_period_ms)
        return;
    w->timer_period_ms = period;
    if (period == 0)
        uv_timer_stop(&w->timer);
    else
        uv_timer_start(&w->timer, on_timer, period, period);
}

/* One pass: the events from next_rev on, at most WATCH_EVENTS_PER_PASS and
 * whole revisions, in one chunk. PASS_MORE if the ring holds more for it,
 * PASS_ENDED if the watch ended. */
enum { PASS_DONE, PASS_MORE, PASS_ENDED };
static int watch_pass(struct watcher *w)
{
    struct gateway *gw = w->gw;
    /* The change log is read under the node's state lock, let go before
     * anything is written to the client. */
    if (!api__state_enter(gw))
        return PASS_DONE; /* the node stops */
    struct kv_sm *sm = node_kv(gw->node);
    uint64_t applied = kv_sm_applied_index(sm);
    /* Events wait and its buffer is full: it waits for its client (polling
     * every WATCH_FULL_POLL_MS), and is lagging once the client took nothing
     * for watch_stall_ms. */
    if (http_stream_pending(w->http) >= gw->cfg.watch_buffer_bytes &&
        w->next_rev <= applied) {
        api__state_leave(gw, false);
        uint64_t now = uv_now(gw->loop);
        if (w->full_since_ms == 0 || http_stream_pending(w->http) < w->full_pending) {
            w->full_since_ms = now; /* full now, or the client took some */
            w->full_pending = http_stream_pending(w->http);
            arm(w, true);
        }
        if (now - w->full_since_ms < gw->cfg.watch_stall_ms)
            return PASS_DONE;
        gw->watch_lagging++;
        watch_fail(w, "lagging", "resume_revision", w->next_rev);
        return PASS_ENDED;
    }
    if (w->full_since_ms != 0) {
        w->full_since_ms = 0;
        arm(w, false);
    }
    size_t pending = http_stream_pending(w->http);
    size_t room =
        pending < gw->cfg.watch_buffer_bytes ? gw->cfg.watch_buffer_bytes - pending : 0;
    size_t turn = turn_room(gw);
    if (turn == 0 && room > 0 && w->next_rev <= applied) {
        api__state_leave(gw, false);
        gw->watch_turn_full++;
        return PASS_MORE; /* the turn's budget is spent: the next turn */
    }
    if (room > turn)
        room = turn;
    w->out.len = 0;
    w->open_rev = 0;
    /* Whole revisions until a pass's events or the room are used up (a
     * pass's chunk passes the bound by one revision at most). */
    uint64_t next = w->next_rev, first = 0;
    int rc = 0;
    if (room > 0 && next <= applied) {
        rc = kv_sm_events_read(sm, next, WATCH_EVENTS_PER_PASS, room, on_event, w, &next);
        if (rc != 0)
            first = kv_sm_events_first(sm);
    }
    api__state_leave(gw, false);
    if (rc != 0) {
        gw->watch_compacted++;
        watch_fail(w, "compacted", "compact_revision", first - 1);
        return PASS_ENDED;
    }
    if (w->sse && w->open_rev != 0)
        jbuf_printf(&w->out, "id: %llu\n\n", (unsigned long long)w->open_rev);
    if (next > w->next_rev)
        w->next_rev = next;
    if (!flush(w))
        return PASS_ENDED;
    return w->next_rev <= applied ? PASS_MORE : PASS_DONE;
}

static void progress(struct watcher *w)
{
    if (!api__state_enter(w->gw))
        return; /* the node stops */
    uint64_t applied = kv_sm_applied_index(node_kv(w->gw->node));
    api__state_leave(w->gw, false);
    uint64_t rev = w->next_rev - 1 < applied ? w->next_rev - 1 : applied;
    w->out.len = 0;
    if (w->sse)
        jbuf_adds(&w->out, "event: progress\ndata: ");
    jbuf_printf(&w->out, "{\"progress\":{\"revision\":%llu}}\n", (unsigned long long)rev);
    if (w->sse)
        jbuf_printf(&w->out, "id: %llu\n\n", (unsigned long long)rev);
    (void)flush(w);
}

static void on_timer(uv_timer_t *t)
{
    struct watcher *w = t->data;
    if (w->ended)
        return;
    int rc = watch_pass(w);
    if (rc == PASS_ENDED)
        return;
    if (rc == PASS_MORE)
        api__watch_applied(w->gw);
    if (w->progress_ms > 0 && uv_now(w->gw->loop) - w->last_write_ms >= w->progress_ms)
        progress(w);
}

/* Passes start at most every WATCH_PASS_MIN_MS: under a stream of small
 * writes a pass then covers many applies, instead of visiting every watcher
 * after each (events reach a watcher at most that much later). */
void api__watch_applied(struct gateway *gw)
{
    if (gw->watchers != NULL && !gw->watch_pass_due) {
        gw->watch_pass_due = true;
        uint64_t since = uv_now(gw->loop) - gw->watch_pass_ms;
        uv_timer_start(&gw->watch_timer, api__watch_run,
                       since >= WATCH_PASS_MIN_MS ? 0 : WATCH_PASS_MIN_MS - since, 0);
    }
}

/* The events one pass shares among the watchers that are caught up: read
 * from the change log once, instead of once per watcher. The pointers stay
 * valid during the pass (nothing applies meanwhile). */
/* The events one pass shares among the watchers that are caught up: read
 * from the change log once, and matched against an index of those watchers
 * (a hash of their keys and prefixes, probed at each prefix length a
 * watcher has), so an event costs about its key's length plus its matches,
 * not one check per watcher. The event pointers stay valid during the pass
 * (nothing applies meanwhile). */
#define WIX_LENS_MAX 16 /* distinct prefix lengths indexed; the rest: linear */
#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

struct wix_ent {
    uint64_t h;
    struct watcher *w; /* NULL: empty */
};

struct watch_shared {
    struct kv_event ev[WATCH_SHARED_MAX];
    size_t n, bytes;
    uint64_t from, next;
    bool full; /* more than WATCH_SHARED_MAX: no sharing this pass */
    struct watcher **synced, **linear;
    size_t n_synced, n_linear, cap;
    struct wix_ent *tab;
    size_t mask;
    size_t lens[WIX_LENS_MAX], n_lens;
    bool has_key;
};

static void shared_cb(const struct kv_event *ev, void *data)
{
    struct watch_shared *sh = data;
    if (sh->n == WATCH_SHARED_MAX) {
        sh->full = true;
        return;
    }
    sh->ev[sh->n++] = *ev;
    sh->bytes += ev->key_len + ev->value_len + ev->prev_value_len;
}

static uint64_t fnv(const uint8_t *p, size_t len)
{
    uint64_t h = FNV_OFFSET;
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * FNV_PRIME;
    return h;
}

/* Can w take this pass's shared events? (Else watch_pass reads for it.) */
static bool shared_ok(const struct watcher *w, const struct watch_shared *sh)
{
    return !sh->full && w->next_rev == sh->from && w->full_since_ms == 0 &&
           http_stream_pending(w->http) + sh->bytes < w->gw->cfg.watch_buffer_bytes;
}

static bool add_len(struct watch_shared *sh, size_t len)
{
    size_t i = 0;
    while (i < sh->n_lens && sh->lens[i] < len)
        i++;
    if (i < sh->n_lens && sh->lens[i] == len)
        return true;
    if (sh->n_lens == WIX_LENS_MAX)
        return false;
    memmove(sh->lens + i + 1, sh->lens + i, (sh->n_lens - i) * sizeof(sh->lens[0]));
    sh->lens[i] = len;
    sh->n_lens++;
    return true;
}

/* Indexes the synced watchers: keys and prefixes hashed, ranges listed. */
static void index_build(struct watch_shared *sh)
{
    size_t cap = 16;
    while (cap < 2 * sh->n_synced)
        cap *= 2;
    if (sh->mask + 1 < cap) {
        tk_free(sh->tab);
        sh->tab = tk_malloc(cap * sizeof(*sh->tab));
        sh->mask = cap - 1;
    }
    memset(sh->tab, 0, (sh->mask + 1) * sizeof(*sh->tab));
    sh->n_lens = sh->n_linear = 0;
    sh->has_key = false;
    for (size_t i = 0; i < sh->n_synced; i++) {
        struct watcher *w = sh->synced[i];
        if (w->kind == W_RANGE || (w->kind == W_PREFIX && !add_len(sh, w->start_len))) {
            sh->linear[sh->n_linear++] = w;
            continue;
        }
        sh->has_key |= w->kind == W_KEY;
        uint64_t h = fnv(w->start, w->start_len);
        size_t j = h & sh->mask;
        while (sh->tab[j].w != NULL)
            j = (j + 1) & sh->mask;
        sh->tab[j] = (struct wix_ent){h, w};
    }
}

static void probe(const struct watch_shared *sh, uint64_t h, const struct kv_event *ev,
                  size_t len, int kind)
{
    for (size_t j = h & sh->mask; sh->tab[j].w != NULL; j = (j + 1) & sh->mask) {
        struct watcher *w = sh->tab[j].w;
        if (sh->tab[j].h == h && w->kind == kind && w->start_len == len &&
            memcmp(ev->key, w->start, len) == 0)
            put_event(w, ev);
    }
}

/* Passes ev to every synced watcher it matches. */
static void index_event(const struct watch_shared *sh, const struct kv_event *ev)
{
    uint64_t h = FNV_OFFSET;
    size_t li = 0;
    for (size_t len = 0;; len++) {
        while (li < sh->n_lens && sh->lens[li] < len)
            li++;
        if (li < sh->n_lens && sh->lens[li] == len)
            probe(sh, h, ev, len, W_PREFIX);
        if (len == ev->key_len)
            break;
        h = (h ^ ev->key[len]) * FNV_PRIME;
    }
    if (sh->has_key)
        probe(sh, h, ev, ev->key_len, W_KEY);
    for (size_t i = 0; i < sh->n_linear; i++)
        on_event(ev, sh->linear[i]);
}

/* Reads the events since the last pass once (sh->full if they are not all
 * there, or too many), and picks the watchers that can take them. Under the
 * node's state lock (the events are borrowed from the change log). */
static void shared_read(struct gateway *gw, struct watch_shared *sh)
{
    struct kv_sm *sm = node_kv(gw->node);
    uint64_t applied = kv_sm_applied_index(sm);
    sh->n = sh->bytes = sh->n_synced = 0;
    sh->full = false;
    sh->from = gw->watch_shared_next;
    if (sh->from < kv_sm_events_first(sm) ||
        kv_sm_events_read(sm, sh->from, WATCH_SHARED_MAX, 0, shared_cb, sh, &sh->next) !=
            0 ||
        sh->next <= applied)
        sh->full = true; /* each watcher reads for itself this time */
    gw->watch_shared_next = applied + 1;
    if (sh->cap < gw->n_watchers) {
        sh->cap = gw->n_watchers;
        sh->synced = tk_realloc(sh->synced, sh->cap * sizeof(*sh->synced));
        sh->linear = tk_realloc(sh->linear, sh->cap * sizeof(*sh->linear));
    }
    /* Each synced watcher may write up to about twice the events' bytes (JSON,
     * escapes) from the turn's budget; the ones past it read for themselves
     * on a later turn. */
    size_t each = 2 * sh->bytes + 256 * sh->n, room = turn_room(gw);
    for (struct watcher *w = gw->watchers; w != NULL; w = w->next) {
        w->synced = shared_ok(w, sh) && each <= room;
        if (w->synced) {
            room -= each;
            w->out.len = 0;
            w->open_rev = 0;
            sh->synced[sh->n_synced++] = w;
        }
    }
}

/* All watches together hold at most watch_total_bytes that their clients have
 * not taken: past it, the ones holding the most are cut (lagging) at once,
 * until the rest fit. */
static void over_total(struct gateway *gw)
{
    size_t total = api__watch_pending(gw);
    while (total > gw->cfg.watch_total_bytes) {
        struct watcher *big = NULL;
        size_t most = 0;
        for (struct watcher *w = gw->watchers; w != NULL; w = w->next) {
            size_t p = http_stream_pending(w->http);
            if (!w->ended && p > most) {
                most = p;
                big = w;
            }
        }
        if (big == NULL)
            return;
        total -= most;
        gw->watch_lagging++;
        gw->watch_over_total++;
        watch_fail(big, "lagging", "resume_revision", big->next_rev);
    }
}

/* The list starts at w: the watchers a spent turn budget left out come
 * first in the next pass. */
static void rotate_to(struct gateway *gw, struct watcher *w)
{
    if (w == gw->watchers)
        return;
    struct watcher *tail = w;
    while (tail->next != NULL)
        tail = tail->next;
    w->prev->next = NULL; /* the old head's run ends before w */
    tail->next = gw->watchers;
    gw->watchers->prev = tail;
    w->prev = NULL;
    gw->watchers = w;
}

/* The pass api__watch_applied scheduled: every watcher once, the caught-up
 * ones from the shared events through the index. One with more to read than
 * a pass takes goes on at its next pass. */
void api__watch_run(uv_timer_t *t)
{
    struct gateway *gw = t->data;
    gw->watch_pass_due = false;
    gw->watch_pass_ms = uv_now(gw->loop);
    uint64_t t0 = uv_hrtime();
    if (gw->watch_shared == NULL)
        gw->watch_shared = tk_calloc(1, sizeof(struct watch_shared));
    struct watch_shared *sh = gw->watch_shared;
    over_total(gw);
    /* The shared events are borrowed from the change log: read and written
     * into the synced watchers' buffers under the node's state lock, sent
     * after it. */
    if (!api__state_enter(gw))
        return; /* the node stops */
    shared_read(gw, sh);
    if (sh->n_synced > 0) {
        index_build(sh);
        for (size_t i = 0; i < sh->n; i++)
            index_event(sh, &sh->ev[i]);
    }
    api__state_leave(gw, false);
    bool more = false;
    struct watcher *left_out = NULL;
    for (struct watcher *w = gw->watchers, *next; w != NULL; w = next) {
        next = w->next;
        if (!w->synced && watch_pass(w) == PASS_MORE) {
            more = true;
            if (left_out == NULL && turn_room(gw) == 0)
                left_out = w;
        }
    }
    for (size_t i = 0; i < sh->n_synced; i++) {
        struct watcher *w = sh->synced[i];
        w->synced = false;
        if (w->ended)
            continue;
        if (w->sse && w->open_rev != 0)
            jbuf_printf(&w->out, "id: %llu\n\n", (unsigned long long)w->open_rev);
        w->next_rev = sh->next;
        (void)flush(w);
    }
    if (left_out != NULL && !left_out->ended && !left_out->synced)
        rotate_to(gw, left_out);
    if (more && !gw->watch_pass_due && gw->watchers != NULL) {
        /* A timer started at 0 from a timer callback runs in the same turn
         * (uv_now unchanged); after a spent budget, the duty cycle's wait. */
        uint64_t wait = 0;
        if (turn_room(gw) == 0) {
            uint64_t now = uv_now(gw->loop);
            uint64_t until = now + 1 + WATCH_DUTY_WAIT * ((uv_hrtime() - t0) / 1000000);
            if (until > gw->watch_quiet_until_ms)
                gw->watch_quiet_until_ms = until;
            wait = gw->watch_quiet_until_ms - now;
        }
        gw->watch_pass_due = true;
        uv_timer_start(&gw->watch_timer, api__watch_run, wait, 0);
    }
}

size_t api__watch_pending(struct gateway *gw)
{
    size_t total = 0;
    for (struct watcher *w = gw->watchers; w != NULL; w = w->next)
        total += http_stream_pending(w->http);
    return total;
}

void api__watch_stop(struct gateway *gw)
{
    while (gw->watchers != NULL)
        watch_end(gw->watchers);
    if (gw->watch_shared != NULL) {
        tk_free(gw->watch_shared->synced);
        tk_free(gw->watch_shared->linear);
        tk_free(gw->watch_shared->tab);
        tk_free(gw->watch_shared);
        gw->watch_shared = NULL;
    }
}

/* ---- the request ----------------------------------------------------------- */

static uint8_t *dup_q(const struct query *q, int qi, size_t *len)
{
    *len = q->len[qi];
    uint8_t *p = tk_malloc(*len + 1);
    memcpy(p, q->val[qi], *len + 1);
    return p;
}

/* The range: exactly one of key, prefix, or start (with an optional end). */
static int parse_range(struct api_req *req, const struct query *q, struct watcher *w)
{
    bool key = q->present & Q_KEY, prefix = q->present & Q_PREFIX;
    bool start = q->present & Q_START, end = q->present & Q_END;
    if ((int)key + (int)prefix + (int)(start || end) != 1) {
        api__bad(req, "a watch takes one of key=, prefix= or start=/end=");
        return TK_EINVAL;
    }
    if (key) {
        w->kind = W_KEY;
        w->start = dup_q(q, QI_KEY, &w->start_len);
        if (w->start_len == 0) {
            api__bad(req, "empty key");
            return TK_EINVAL;
        }
    } else if (prefix) {
        w->kind = W_PREFIX;
        w->start = dup_q(q, QI_PREFIX, &w->start_len);
    } else {
        w->kind = W_RANGE;
        w->start = start ? dup_q(q, QI_START, &w->start_len) : tk_calloc(1, 1);
        w->end = end ? dup_q(q, QI_END, &w->end_len) : NULL;
    }
    return 0;
}

static int parse_watch(struct api_req *req, const struct query *q, struct watcher *w)
{
    bool has;
    uint64_t v;
    if (parse_range(req, q, w) != 0 || api__parse_encoding(req, q) != 0 ||
        api__parse_flag(req, q, QI_PREV_KV, &w->prev_kv) != 0 ||
        api__query_u64(req, q, QI_PROGRESS, &has, &w->progress_ms) != 0 ||
        api__query_u64(req, q, QI_START_REV, &has, &v) != 0)
        return TK_EINVAL;
    if (api__auth_watch(req, w->start, w->start_len, w->end, w->end_len,
                        w->kind == W_PREFIX, w->kind == W_KEY) != 0)
        return TK_EINVAL;
    w->b64 = req->b64;
    w->next_rev = has ? v : 0;
    if (req->http->has_last_event_id) /* an SSE client resuming */
        w->next_rev = req->http->last_event_id + 1;
    if (w->progress_ms > 0 && w->progress_ms < 10) {
        api__bad(req, "progress_ms must be 0 (none) or at least 10");
        return TK_EINVAL;
    }
    return 0;
}

static void watch_free_unstarted(struct watcher *w)
{
    tk_free(w->start);
    tk_free(w->end);
    tk_free(w);
}

void api__watch(struct api_req *req, const struct query *q)
{
    struct gateway *gw = req->gw;
    struct watcher *w = tk_calloc(1, sizeof(*w));
    if (parse_watch(req, q, w) != 0) {
        watch_free_unstarted(w);
        return;
    }
    if (gw->n_watchers >= gw->cfg.watchers_max) {
        watch_free_unstarted(w);
        char ra[64];
        api__retry_after(gw, ra, sizeof(ra));
        http_respond_error(req->http, 503, "too_many_watchers", ra,
                           "this node serves %u watchers already", gw->cfg.watchers_max);
        return;
    }
    if (!api__state_enter(gw)) {
        watch_free_unstarted(w);
        api__respond_rc(req, TK_ESHUTDOWN);
        return;
    }
    struct kv_sm *sm = node_kv(gw->node);
    if (w->next_rev == 0)
        w->next_rev = kv_sm_applied_index(sm) + 1; /* from now on */
    uint64_t first = kv_sm_events_first(sm);
    api__state_leave(gw, false);
    if (w->next_rev < first) {
        watch_free_unstarted(w);
        gw->watch_compacted++;
        struct jbuf b;
        jbuf_init(&b, 256);
        jbuf_printf(&b,
                    "{\"error\":{\"code\":\"compacted\",\"compact_revision\":%llu,"
                    "\"message\":\"this node holds no events before revision %llu: read "
                    "the state, then watch from after it\"}}\n",
                    (unsigned long long)(first - 1), (unsigned long long)first);
        http_respond(req->http, 410, NULL, NULL, b.p, b.len);
        jbuf_free(&b);
        return;
    }
    w->gw = gw;
    w->http = req->http;
    w->sse = req->http->accept_sse;
    jbuf_init(&w->out, 4096);
    uv_timer_init(gw->loop, &w->timer);
    w->timer.data = w;
    w->next = gw->watchers;
    if (gw->watchers)
        gw->watchers->prev = w;
    gw->watchers = w;
    if (gw->n_watchers++ == 0 && gw->own_loop)
        node_client_want_applied(gw->node, true); /* passes follow the applies */
    w->last_write_ms = uv_now(gw->loop);
    http_stream_begin(req->http, 200,
                      w->sse ? "text/event-stream" : "application/x-ndjson", NULL,
                      on_gone, w);
    if (w->ended)
        return;
    arm(w, false);
    if (watch_pass(w) == PASS_MORE)
        api__watch_applied(gw);
}
