/* Log compaction and the KV's tier-down jobs (DESIGN "Ring-log KV state
 * machine"): once enough entries are applied past the last snapshot, the KV
 * tiers down to the applied index, its cold tier becomes the snapshot, and
 * the log is compacted behind it, keeping a trailing window for followers
 * that are only a little behind.
 *
 * None of the heavy work stalls the loop: the KV's tier-down job (the LMDB
 * transaction and reading the snapshot stream) runs on libuv's thread pool
 * while the loop goes on replicating and applying, and its result is
 * published in O(1) (the snapshot stream arrives as a blob, built on the pool
 * thread, whose descriptor that thread saves too; the old blob is freed there
 * as well); the released pages' index entries
 * then go DRAIN_STEP at a time and
 * the log is compacted COMPACT_STEP entries at a time, one step per loop turn. The same
 * job moves the ring's oldest pages to LMDB when the ring is over its budget.
 *
 * A snapshot is usually read beside the tier-downs instead (reader_*): the
 * cold tier as the last tier-down committed it, through its own LMDB read
 * view, while later tier-downs write.
 *
 * Invariants: at most one job, one snapshot read and one store compaction in
 * flight (n->tier.job until completed, n->tier.reader, n->tier.compacting);
 * each on the pool counts as an open handle (n->loop.handles_open), so the
 * node is not freed under it.
 *
 * Loop thread, except tier_work (a pool thread). Called by node.c (each turn,
 * at boot, before installing a snapshot), node_install.c and node_recover.c;
 * calls node_backup.c (each turn) and node_status.c on failures. */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/err.h"
#include "base/log.h"
#include "base/nice.h"
#include "base/sync.h"
#include "kv/kv.h"
#include "node/node_internal.h"
#include "store/store.h"

#define COMPACT_STEP 8192
#define DRAIN_STEP 4096
#define TIER_NICE 5
#define BIG_PREFILL_BYTES ((size_t)16 << 20) /* big_blobs_turn */
#define BIG_IDLE_NS (10ull * 1000 * 1000 * 1000)
/* A snapshot read (reader_*) of a big state, and freeing its blob: nothing
 * waits for either, so they take only what the busy threads leave (nice 19:
 * about 1.5 % of a core against each busy one). At nice 5 a read of the whole
 * state at 10M keys (1.2 GB, seconds of CPU on each node at about the same
 * time) was in every steady step whose write p99.9 passed 25 ms. Below
 * READ_NICE_BYTES (a read well under a second) they stay at TIER_NICE. */
#define READ_NICE 19
#define READ_NICE_BYTES (64u << 20)

/* ... and it sleeps READ_PACE times the CPU time it uses (tk_pace_cpu; the
 * node option snapshot_read_pace): even at nice 19, three nodes reading
 * their whole state at once on a 2-core VM were in every steady step whose
 * write p99.9 passed 25 ms at 3M keys (the same load with the tier-downs
 * and no snapshots had none; docs/history/benchmarks-scale.md). */
#define READ_PACE 3

static int read_nice(size_t bytes)
{
    return bytes >= READ_NICE_BYTES ? READ_NICE : TIER_NICE;
}

/* The job's thread, after a snapshot job: saves its descriptor, so that the
 * loop does not wait for that LMDB commit. Saved before the core takes the
 * snapshot: the descriptor names a state the cold tier holds durably
 * already (the job committed it), as after a crash between the two. */
static void save_descriptor(struct node *n)
{
    struct raft_snapshot_meta meta = {.config = n->tier.config};
    n->tier.saved = false;
    if (!n->tier.snapshot || !kv_tier_snapshot_at(n->tier.job, &meta.index, &meta.term))
        return;
    n->tier.save_rc = store_save_snapshot(n->store, &meta);
    n->tier.saved = true;
}

/* A pool thread about to run a tier-down or a snapshot read yields the CPU
 * to the loops (`nice`: TIER_NICE, about a quarter of a core against a busy
 * loop; READ_NICE, only where it can come back: base/nice.h), so that it
 * cannot delay heartbeats on a machine with fewer cores than busy threads;
 * libuv's pool threads inherit the name of the loop that started them.
 * Returns the value to give back (tk_nice_leave). */
static int background_enter(int nice)
{
    pthread_setname_np(pthread_self(), "tk-tier");
    return tk_nice_enter(nice, TIER_NICE);
}

static void tier_work(uv_work_t *w)
{
    struct node *n = w->data;
    int was = background_enter(TIER_NICE);
    kv_tier_run_paced(n->tier.job);
    save_descriptor(n);
    if (n->tier.descriptor)
        tk_blob_spares_drop(); /* as reader_work's */
    tk_nice_leave(was);
    atomic_store_explicit(&n->tier.ran, true, memory_order_release);
}

/* One node__run_on_pool job: fn(arg) on a pool thread, or cancel_fn(arg)
 * on the loop when it never ran. */
struct pool_job {
    uv_work_t work;
    struct node *n;
    void (*fn)(void *);
    void (*cancel_fn)(void *);
    void *arg;
    int nice;
    bool ran;
};

static void pool_job_run(uv_work_t *w)
{
    struct pool_job *j = w->data;
    int was = background_enter(j->nice);
    j->fn(j->arg);
    j->ran = true;
    tk_nice_leave(was);
}

static void pool_job_after(uv_work_t *w, int status)
{
    struct pool_job *j = w->data;
    struct node *n = j->n;
    (void)status;
    if (!j->ran && j->cancel_fn != NULL) /* cancelled (closing): not run */
        j->cancel_fn(j->arg);
    tk_free(j);
    node__handle_gone(n);
}

void node__run_on_pool(struct node *n, void (*fn)(void *), void (*cancel_fn)(void *),
                       void *arg, int nice)
{
    struct pool_job *j = tk_malloc(sizeof(*j));
    *j = (struct pool_job){
        .n = n, .fn = fn, .cancel_fn = cancel_fn, .arg = arg, .nice = nice};
    j->work.data = j;
    if (uv_queue_work(n->loop.uv, &j->work, pool_job_run, pool_job_after) == 0) {
        node__handle_opened(n);
        return;
    }
    tk_free(j);
    if (cancel_fn != NULL)
        cancel_fn(arg);
}

void node__free_on_pool(struct node *n, void (*free_fn)(void *), void *arg, int nice)
{
    node__run_on_pool(n, free_fn, free_fn, arg, nice);
}

void node__tier_mark(struct node *n, uint64_t index)
{
    struct node_tier *t = &n->tier;
    if (t->marks == NULL)
        t->marks = tk_malloc(NODE_MARKS * sizeof(*t->marks));
    t->marks[t->mark_head] =
        (struct node_mark){.index = index, .bytes = t->applied_bytes};
    t->mark_head = (t->mark_head + 1) % NODE_MARKS;
    uint64_t every = n->o.snapshot_bytes / 64;
    if (every == 0 || every > NODE_MARK_BYTES)
        every = NODE_MARK_BYTES;
    t->next_mark_index = index + NODE_MARK_ENTRIES;
    t->next_mark_bytes = t->applied_bytes + every;
    if (t->n_marks < NODE_MARKS)
        t->n_marks++;
}

/* The k-th newest mark (k < n_marks). */
static const struct node_mark *mark_back(const struct node_tier *t, uint32_t k)
{
    return &t->marks[(t->mark_head + NODE_MARKS - 1 - k) % NODE_MARKS];
}

/* The trailing window's start from the marks, never reading an entry: the
 * old entries' blobs are cold memory, and reading 10,000 of them took up to
 * 9.5 ms of a snapshot's turn at 1.5M keys. The bytes after `index` are
 * bounded above by the first mark at or past it (or by every byte applied),
 * so the window kept is at most `budget` bytes; it may stop short by one
 * mark's spacing (NODE_MARK_ENTRIES entries, or 1/64 of the budget). When
 * every mark fits, the window is the whole log if the oldest mark's entry is
 * gone from it (`whole`: boot marks the entry before the log's first, with 0
 * bytes). False if the marks do not reach back far enough (the ring of marks
 * wrapped, or an install reset the log behind them): the caller reads the
 * entries. */
static bool goal_from_marks(const struct node_tier *t, uint64_t index, uint64_t floor,
                            uint64_t budget, bool whole, uint64_t *goal)
{
    uint64_t upper = t->applied_bytes; /* >= the bytes up to index */
    uint32_t k = 0;
    while (k < t->n_marks && mark_back(t, k)->index >= index) {
        upper = mark_back(t, k)->bytes;
        k++;
    }
    uint64_t keep = index; /* the window (keep, index] fits so far */
    for (; k < t->n_marks; k++) {
        const struct node_mark *m = mark_back(t, k);
        if (upper - m->bytes > budget) { /* (m, index] may not fit */
            *goal = keep;
            return true;
        }
        if (m->index <= floor) { /* (floor, index] fits */
            *goal = floor;
            return true;
        }
        keep = m->index;
    }
    *goal = floor;
    return whole;
}

/* The last index to compact after a snapshot at `index`: the trailing window
 * keeps trailing_entries entries behind it, but at most snapshot_bytes bytes
 * of them (when set), so that big entries (a client writing 1 MiB values)
 * cannot make the core hold trailing_entries of them in memory (issue 19).
 * From the marks (goal_from_marks); else at most trailing_entries pointer
 * reads, on the loop, once per snapshot. */
static uint64_t trailing_goal(struct node *n, uint64_t index)
{
    uint64_t goal = index > n->o.trailing_entries ? index - n->o.trailing_entries : 0;
    uint64_t bytes = 0, budget = n->o.snapshot_bytes;
    uint64_t from_marks;
    const struct node_tier *t = &n->tier;
    bool whole = t->n_marks > 0 &&
                 raft_entry_at(n->raft, mark_back(t, t->n_marks - 1)->index) == NULL;
    if (budget != 0 && goal_from_marks(t, index, goal, budget, whole, &from_marks)) {
        goal = from_marks;
        budget = 0;
    }
    for (uint64_t i = index; budget != 0 && i > goal; i--) {
        const struct raft_entry *e = raft_entry_at(n->raft, i);
        if (e == NULL)
            break;
        n->m.metrics.trailing_reads++;
        bytes += e->data != NULL ? e->data->len : 0;
        if (bytes > budget) {
            goal = i; /* entry i would take the window past its bytes */
            break;
        }
    }
    return goal > n->tier.compact_goal ? goal : n->tier.compact_goal;
}

static void blob_unref(void *b)
{
    tk_blob_unref(b);
}

/* Drops our reference to `b` on the thread pool: its last one frees up to
 * GBs of pages. */
static void blob_drop(struct node *n, struct tk_blob *b)
{
    if (b != NULL)
        node__free_on_pool(n, blob_unref, b, read_nice(b->len));
}

static void dropped_free(void *log)
{
    raft_dropped_free(log);
    tk_free(log);
}

/* A log that a snapshot from the leader replaced (raft_take_dropped), freed
 * on the thread pool: up to snapshot_entries + trailing_entries entries. */
void node__drop_replaced_log(struct node *n)
{
    struct raft_dropped log;
    if (!raft_take_dropped(n->raft, &log))
        return;
    n->m.metrics.replaced_log_entries += log.n;
    struct raft_dropped *held = tk_malloc(sizeof(*held));
    *held = log;
    node__free_on_pool(n, dropped_free, held, TIER_NICE);
}

/* A snapshot stream is ready (a tier job's or a reader's): give it to the
 * core, save its descriptor (unless its thread did: `saved`, `save_rc`),
 * and aim the log's compaction behind it. t0: when its work began; t_done,
 * t_published: when its after-work began and the KV was published. */
static void snapshot_taken(struct node *n, struct kv_tier_result *res,
                           const struct raft_config *config, bool saved, int save_rc,
                           uint64_t t0, uint64_t t_done, uint64_t t_published)
{
    struct raft_snapshot_meta meta = {
        .index = res->index, .term = res->term, .config = *config};
    /* Built on the pool thread: no copy. NULL: a descriptor only (the state
     * is read out when something needs it: descriptor_turn). */
    struct tk_blob *blob = res->stream;
    if (blob == NULL && meta.index <= n->tier.snap_index)
        return; /* a descriptor adds nothing there (and would drop the data) */
    size_t len = blob != NULL ? blob->len : 0;
    struct tk_blob *old = n->tier.blob; /* the core's, so its last reference */
    n->tier.blob = blob;
    n->tier.blob_index = meta.index;
    n->tier.blob_term = meta.term;
    n->tier.blob_at = 0; /* reader_complete: a stream read on demand */
    uint64_t t_set = node__mono_ns();
    int rc = raft_snapshot_set(n->raft, &meta, blob);
    t_set = node__mono_ns() - t_set;
    blob_drop(n, old);
    if (rc != 0) {
        TK_LOG(TK_LOG_WARN, n->o.id, raft_term(n->raft),
               "snapshot at %llu refused by the core: %s", (unsigned long long)meta.index,
               tk_strerror(rc));
        n->tier.snap_index = meta.index; /* try again a full interval later */
        return;
    }
    rc = saved ? save_rc : store_save_snapshot(n->store, &meta);
    if (rc != 0) {
        node__fail(n, rc, "save snapshot");
        return;
    }
    n->tier.snap_index = meta.index;
    n->m.metrics.snapshots++;
    if (blob == NULL)
        n->m.metrics.snapshot_descriptors++;
    uint64_t t_goal = node__mono_ns();
    n->tier.compact_goal = trailing_goal(n, meta.index);
    t_goal = node__mono_ns() - t_goal;
    uint64_t on_loop = node__mono_ns() - t_done;
    uint64_t cpu = node__thread_cpu_ns() - n->tier.cpu_done;
    uint64_t wait = tk_thread_wait_ns() - n->tier.wait_done;
    n->m.metrics.snapshot_loop_ns += on_loop;
    /* Wall time on the loop, the loop thread's CPU time in it and its time
     * runnable waiting for a core: where the cores are all busy, the first
     * is mostly the last (what is left is I/O, locks, or the machine not
     * running the guest). */
    char what[48];
    if (blob != NULL)
        snprintf(what, sizeof(what), "%zu bytes", len);
    else
        snprintf(what, sizeof(what), "a descriptor only");
    TK_LOG(
        TK_LOG_INFO, n->o.id, raft_term(n->raft),
        "snapshot at %llu (%s): %llu ms in all, %llu us of it on the loop "
        "(KV publish %llu us, core %llu us, trailing window %llu us; %llu us on the CPU, "
        "%llu us waiting for a core)",
        (unsigned long long)meta.index, what,
        (unsigned long long)((node__mono_ns() - t0) / 1000000),
        (unsigned long long)(on_loop / 1000),
        (unsigned long long)((t_published - t_done) / 1000),
        (unsigned long long)(t_set / 1000), (unsigned long long)(t_goal / 1000),
        (unsigned long long)(cpu / 1000), (unsigned long long)(wait / 1000));
}

/* Loop thread, once the job has run: publish it in the KV (the released
 * index entries go later, a slice per turn: drain_step), then take the
 * snapshot (unless `discard`: an installed snapshot is replacing it). */
static void tier_complete(struct node *n, bool discard)
{
    struct kv_tier_job *j = n->tier.job;
    n->tier.job = NULL;
    n->tier.t_done = node__mono_ns();
    n->tier.cpu_done = node__thread_cpu_ns();
    n->tier.wait_done = tk_thread_wait_ns();
    struct kv_tier_result res;
    int rc = kv_sm_tier_publish(n->sm, j, &res);
    n->tier.t_published = node__mono_ns();
    if (rc != 0) {
        node__fail(n, rc, "tier-down");
        return;
    }
    if (res.paced_slices != 0)
        TK_LOG(
            TK_LOG_DEBUG, n->o.id, raft_term(n->raft),
            "tier-down in %llu ms: its commit wrote %llu slices of 4 MiB out in %llu ms "
            "and slept %llu ms between them",
            (unsigned long long)((n->tier.t_done - n->tier.t0) / 1000000),
            (unsigned long long)res.paced_slices,
            (unsigned long long)(res.paced_write_ns / 1000000),
            (unsigned long long)(res.paced_slept_ns / 1000000));
    if (res.read_slept_ns != 0)
        TK_LOG(TK_LOG_DEBUG, n->o.id, raft_term(n->raft),
               "snapshot job's read at %llu: %llu ms of CPU, %llu ms asleep",
               (unsigned long long)res.index,
               (unsigned long long)(res.read_cpu_ns / 1000000),
               (unsigned long long)(res.read_slept_ns / 1000000));
    if (res.stream == NULL && !n->tier.descriptor)
        return;
    if (!n->tier.snapshot || discard || n->loop.closing || n->persist.failed) {
        tk_blob_unref(res.stream);
        return;
    }
    snapshot_taken(n, &res, &n->tier.config, n->tier.saved, n->tier.save_rc, n->tier.t0,
                   n->tier.t_done, n->tier.t_published);
}

static void tier_after(uv_work_t *w, int status)
{
    struct node *n = w->data;
    (void)status;
    n->tier.busy = false;
    uint64_t t0 = node__mono_ns();
    if (n->tier.job != NULL)
        tier_complete(n, n->install.parked); /* a parked install replaces it */
    node__turn_add(n, NODE_PH_TIER, node__mono_ns() - t0);
    node__kick(n);
    node__handle_gone(n);
}

/* A snapshot read beside the tier-down jobs: the cold tier as the last
 * tier-down committed it is read into a blob on the thread pool through its
 * own LMDB read view (kv_sm_snapshot_cold), while further tier-downs write.
 * A snapshot job (tier-down then read, one job) used to hold the tier-downs
 * back for its whole read: 25 s at 8M keys, and the ring filled, holding
 * applying for seconds. */
struct node_snap_read {
    uv_work_t work;
    struct node *n;
    struct kv_snap *snap;
    struct tk_blob *stream;
    struct raft_snapshot_meta meta; /* index, term from the view; config */
    bool read;                      /* false: save the descriptor only */
    uint64_t t0;
    int rc, save_rc;
    int nice; /* background_enter's: read_nice of the last snapshot */
    atomic_bool ran;
    atomic_bool stop;  /* an install or the node's stop: end the read early */
    atomic_bool hurry; /* reader_raise, after READ_PACE_NS: no more pacing */
    struct tk_cpu_pace pace;
    atomic_int tid; /* its pool thread while it reads at READ_NICE, else 0 */
    bool raised;    /* reader_raise moved it back to TIER_NICE */
};

static void reader_work(uv_work_t *w)
{
    struct node_snap_read *r = w->data;
    int was = background_enter(r->nice); /* it reads the whole state: seconds */
    if (r->nice > TIER_NICE)
        atomic_store(&r->tid, tk_nice_tid());
    if (r->read)
        r->rc = kv_snap_read_all(r->snap, &r->stream, &r->stop, &r->pace);
    /* The descriptor names a state the cold tier holds durably already. */
    if (r->rc == 0 && !atomic_load(&r->stop))
        r->save_rc = store_save_snapshot(r->n->store, &r->meta);
    /* Snapshots are descriptors now: a stream is read only for a follower
     * far behind or a backup, so a spare mapping from the last full read
     * (401 MiB at 10M keys, from the read at 1.6M) would be memory held for
     * nothing. (The stream a descriptor replaces may park one after this:
     * the next descriptor drops that.) */
    if (!r->read)
        tk_blob_spares_drop();
    atomic_store(&r->tid, 0);
    tk_nice_leave(was);
    atomic_store_explicit(&r->ran, true, memory_order_release);
}

/* A read at READ_NICE gets what the busy threads leave, which on a machine
 * with no idle core is next to nothing: the log behind the last snapshot
 * (memory) would grow for as long. After READ_NICE_NS it goes on at
 * TIER_NICE. (Should the read end between the load of its thread and the
 * call, the pool thread keeps TIER_NICE, the tier-downs' own.) */
#define READ_NICE_NS (30ull * 1000 * 1000 * 1000)

/* The read stays paced (READ_PACE) at TIER_NICE: paced, it takes at most a
 * quarter of a core whatever its nice. At 10M keys (a 1.5 GB stream, about
 * 10 s of CPU: 40 s paced) dropping the pacing with the nice at 30 s ran the
 * rest of the read at full speed at nice 5, the case READ_NICE is for. The
 * pacing ends after READ_PACE_NS, a bound on the log behind the last
 * snapshot. */
#define READ_PACE_NS (120ull * 1000 * 1000 * 1000)

static void reader_raise(struct node *n, struct node_snap_read *r)
{
    uint64_t age = node__mono_ns() - r->t0;
    if (age >= READ_PACE_NS)
        atomic_store(&r->hurry, true);
    if (r->raised || age < READ_NICE_NS)
        return;
    int tid = atomic_load(&r->tid);
    if (tid == 0)
        return;
    r->raised = true;
    if (tk_nice_set(tid, TIER_NICE) == 0)
        TK_LOG(TK_LOG_INFO, n->o.id, raft_term(n->raft),
               "snapshot read at %llu still going after %llu s at nice %d: on at nice %d",
               (unsigned long long)r->meta.index,
               (unsigned long long)(READ_NICE_NS / 1000000000), r->nice, TIER_NICE);
}

/* Loop thread, once the read ran: give the snapshot to the core (unless
 * `discard`, or stopping); the reader is then done. */
static void reader_complete(struct node *n, struct node_snap_read *r, bool discard)
{
    n->tier.reader = NULL;
    uint64_t t_done = node__mono_ns();
    if (r->pace.factor != 0)
        TK_LOG(TK_LOG_DEBUG, n->o.id, raft_term(n->raft),
               "snapshot read at %llu: %llu ms of CPU, %llu ms asleep (pace %u)",
               (unsigned long long)r->meta.index,
               (unsigned long long)(r->pace.cpu_ns / 1000000),
               (unsigned long long)(r->pace.slept_ns / 1000000), r->pace.factor);
    n->tier.cpu_done = node__thread_cpu_ns();
    n->tier.wait_done = tk_thread_wait_ns();
    kv_snap_close(r->snap);
    r->snap = NULL;
    if (r->rc != 0 && !discard && !n->loop.closing && !atomic_load(&r->stop)) {
        node__fail(n, r->rc, "snapshot read");
    } else if (r->rc == 0 && !discard && !n->loop.closing && !n->persist.failed &&
               (r->meta.index > n->tier.snap_index ||
                (r->read && r->meta.index == n->tier.snap_index))) {
        struct kv_tier_result res = {
            .index = r->meta.index, .term = r->meta.term, .stream = r->stream};
        r->stream = NULL; /* snapshot_taken takes it */
        snapshot_taken(n, &res, &r->meta.config, true, r->save_rc, r->t0, t_done, t_done);
        if (r->read && n->tier.blob_index == r->meta.index) {
            n->m.metrics.snapshot_reads++;
            n->tier.blob_at = node__mono_ns();
        }
    }
    tk_blob_unref(r->stream);
    r->stream = NULL;
}

static void reader_after(uv_work_t *w, int status)
{
    struct node_snap_read *r = w->data;
    struct node *n = r->n;
    uint64_t t0 = node__mono_ns();
    if (status == UV_ECANCELED)
        kv_snap_close(r->snap); /* reader_wait took it back before it ran */
    else if (n->tier.reader == r)
        reader_complete(n, r, n->install.parked);
    tk_blob_unref(r->stream);
    tk_free(r);
    node__turn_add(n, NODE_PH_SNAPSHOT, node__mono_ns() - t0);
    node__kick(n);
    node__handle_gone(n);
}

/* Starts reading the cold tier as it is now (its durable index is past the
 * last snapshot, or at it for a `read` of a descriptor-only one); without
 * `read`, only saves its descriptor (descriptor_turn). An `urgent` read (a
 * follower waits for it) goes at full speed at TIER_NICE: at 10M keys the
 * paced read at nice 19 made a catch-up take 89 s instead of 12. False if
 * it could not. */
static bool reader_start(struct node *n, bool read, bool urgent)
{
    struct node_snap_read *r = tk_calloc(1, sizeof(*r));
    r->n = n;
    r->t0 = node__mono_ns();
    if (kv_sm_snapshot_cold(n->sm, &r->snap) != 0) {
        tk_free(r);
        return false;
    }
    r->meta.index = kv_snap_index(r->snap);
    r->meta.term = kv_snap_term(r->snap);
    if (r->meta.index < n->tier.snap_index ||
        (r->meta.index == n->tier.snap_index && !read) ||
        raft_config_at(n->raft, r->meta.index, &r->meta.config) != 0) {
        kv_snap_close(r->snap);
        tk_free(r);
        return false;
    }
    r->read = read;
    r->nice = read && !urgent ? read_nice(kv_sm_cold_bytes(n->sm)) : TIER_NICE;
    atomic_init(&r->ran, false);
    atomic_init(&r->stop, false);
    atomic_init(&r->hurry, false);
    atomic_init(&r->tid, 0);
    int pace = n->o.snapshot_read_pace;
    r->pace.factor = !read || urgent ? 0
                     : pace == 0     ? READ_PACE
                     : pace > 0      ? (unsigned)pace
                                     : 0;
    r->pace.hurry = &r->hurry;
    r->work.data = r;
    if (uv_queue_work(n->loop.uv, &r->work, reader_work, reader_after) != 0) {
        kv_snap_close(r->snap);
        tk_free(r);
        return false;
    }
    n->tier.reader = r;
    n->tier.snap_bytes = 0; /* what was applied so far: in this one or the next */
    node__handle_opened(n);
    return true;
}

/* Waits out a reader in flight (before an install: it holds a read view of
 * the cold tier the install replaces) and drops its snapshot. Its after-work
 * callback later finds it no longer current (or cancelled) and frees it. */
static void reader_wait(struct node *n)
{
    struct node_snap_read *r = n->tier.reader;
    if (r == NULL)
        return;
    if (uv_cancel((uv_req_t *)&r->work) == 0) {
        /* Its view closes now (an install begins next, and needs none
         * open); reader_after (UV_ECANCELED) frees it. */
        n->tier.reader = NULL;
        kv_snap_close(r->snap);
        r->snap = NULL;
        return;
    }
    atomic_store(&r->stop, true); /* a read of seconds ends at its next chunk */
    while (!atomic_load_explicit(&r->ran, memory_order_acquire)) {
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
    reader_complete(n, r, true);
}

bool node__tier_idle(const struct node *n)
{
    return n->tier.job == NULL && !n->tier.busy && n->tier.reader == NULL &&
           !n->tier.compacting;
}

void node__tier_stop(struct node *n)
{
    if (n->sm != NULL)
        kv_sm_tier_hurry(n->sm); /* a paced commit stops sleeping */
    if (n->tier.reader != NULL)
        atomic_store(&n->tier.reader->stop, true);
}

/* Only for what cannot go on beside the job (installing a snapshot); its
 * after-work callback later finds nothing to do. */
void node__tier_wait(struct node *n, bool discard)
{
    kv_sm_tier_hurry(n->sm); /* a paced commit stops sleeping */
    reader_wait(n);
    /* A store compaction in flight ends first (an install resets the log). */
    while (n->tier.compacting &&
           !atomic_load_explicit(&n->tier.compact_ran, memory_order_acquire)) {
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
    if (n->tier.job == NULL)
        return;
    /* Not started yet (the pool may be busy with other work, such as DNS
     * lookups): take it back and run it here rather than wait for a thread. */
    if (n->tier.busy && uv_cancel((uv_req_t *)&n->tier.work) == 0) {
        kv_tier_run(n->tier.job);
        atomic_store_explicit(&n->tier.ran, true, memory_order_release);
    }
    while (!atomic_load_explicit(&n->tier.ran, memory_order_acquire)) {
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
    tier_complete(n, discard);
}

/* node__tier_start; a `descriptor` job is a snapshot job that reads no
 * stream (kv_sm_tier_start_durable). */
static void tier_start_job(struct node *n, bool snapshot, bool descriptor,
                           bool inline_run)
{
    struct kv_tier_job *j;
    int rc = descriptor ? kv_sm_tier_start_durable(n->sm, &j)
                        : kv_sm_tier_start(n->sm, snapshot, &j);
    if (rc != 0) {
        node__fail(n, rc, "tier-down");
        return;
    }
    if (j == NULL)
        return;
    n->tier.job = j;
    n->tier.snapshot = snapshot || descriptor;
    n->tier.descriptor = descriptor;
    if (n->tier.snapshot)
        n->tier.snap_bytes = 0; /* what was applied so far is in this snapshot */
    /* The configuration in force at the job's index (the applied index it
     * sealed at), not the newest one, which may be uncommitted and later
     * truncated: the descriptor is what a restart boots from. */
    if (raft_config_at(n->raft, kv_sm_applied_index(n->sm), &n->tier.config) != 0)
        n->tier.config = *raft_config(n->raft);
    n->tier.saved = false; /* an inline run saves it on the loop */
    n->tier.t0 = node__mono_ns();
    atomic_store(&n->tier.ran, false);
    if (!inline_run) {
        n->tier.work.data = n;
        if (uv_queue_work(n->loop.uv, &n->tier.work, tier_work, tier_after) == 0) {
            n->tier.busy = true;
            node__handle_opened(n);
            return;
        }
    }
    kv_tier_run(j);
    atomic_store(&n->tier.ran, true);
    tier_complete(n, false);
}

void node__tier_start(struct node *n, bool snapshot, bool inline_run)
{
    tier_start_job(n, snapshot, false, inline_run);
}

/* Drops the references compact_step took from the core's compacted entries. */
static void compact_free(struct node_tier *t)
{
    for (size_t i = 0; i < t->compact_n; i++)
        tk_blob_unref(t->compact_blobs[i]);
    t->compact_n = 0;
}

static void compact_run(uv_work_t *w)
{
    struct node *n = w->data;
    n->tier.compact_rc = store_compact(n->store, n->tier.compact_upto);
    compact_free(&n->tier);
    atomic_store_explicit(&n->tier.compact_ran, true, memory_order_release);
}

static void compact_after(uv_work_t *w, int status)
{
    struct node *n = w->data;
    n->tier.compacting = false;
    compact_free(&n->tier); /* a cancelled run (closing) left them */
    if (status == 0 && n->tier.compact_rc != 0 && !n->loop.closing)
        node__fail(n, n->tier.compact_rc, "compact");
    node__kick(n);
    node__handle_gone(n);
}

/* One bounded step of compaction towards compact_goal: dropping millions of
 * entries at once would hold the loop (and the memory volume's lock) for tens
 * of milliseconds. The core drops its entries here and hands over their
 * payloads, which are freed with the store's compaction on the thread pool
 * (freeing 8192 entries of 200 KiB took 50-70 ms of the loop's CPU; at 10M
 * keys, 8192 small ones took a 98 ms turn, waiting in free() for the
 * allocator's locks). The store (whose compaction commits its new start and
 * syncs the directory) goes one step at a time, so it may hold a step more
 * than the core. Nothing here reads an entry: their blobs are cold memory. */
static void compact_step(struct node *n)
{
    struct node_tier *t = &n->tier;
    if (t->compacting)
        return;
    uint64_t first = raft_first_index(n->raft);
    uint64_t upto = t->compact_goal;
    if (upto < first)
        return;
    if (upto - first >= COMPACT_STEP)
        upto = first + COMPACT_STEP - 1;
    if (upto > raft_stable_index(n->raft))
        upto = raft_stable_index(n->raft);
    if (upto < first)
        return;
    if (t->compact_blobs == NULL)
        t->compact_blobs = tk_malloc(COMPACT_STEP * sizeof(*t->compact_blobs));
    if (raft_compact_take(n->raft, upto, t->compact_blobs, &t->compact_n) != 0)
        return;
    t->compact_upto = upto;
    t->compact_work.data = n;
    atomic_store(&t->compact_ran, false);
    if (uv_queue_work(n->loop.uv, &t->compact_work, compact_run, compact_after) == 0) {
        t->compacting = true;
        node__handle_opened(n);
        return;
    }
    compact_free(t);
    int rc = store_compact(n->store, upto);
    if (rc != 0)
        node__fail(n, rc, "compact");
}

/* One bounded slice of a published tier-down's index drops (DRAIN_STEP
 * records: about a millisecond); true once nothing is left. */
static bool drain_step(struct node *n)
{
    uint64_t t0 = node__mono_ns();
    bool done = kv_sm_tier_drain(n->sm, DRAIN_STEP);
    uint64_t dt = node__mono_ns() - t0;
    n->m.metrics.tier_drain_ns += dt;
    if (dt > n->m.metrics.tier_drain_max_ns)
        n->m.metrics.tier_drain_max_ns = dt;
    if (!done)
        node__kick(n); /* the next slice on the next turn, without waiting */
    return done;
}

static void tier_turn(struct node *n);

static void big_cache_drop(void *arg)
{
    (void)arg;
    tk_blob_big_cache_drop();
}

static void big_prefill(void *arg)
{
    (void)arg;
    (void)tk_blob_big_prefill(BIG_PREFILL_BYTES);
}

/* Its job was cancelled (the loop closes): only ends the prefill asked for,
 * so that the next miss (another node of the process) asks again. */
static void big_prefill_cancel(void *arg)
{
    (void)arg;
    (void)tk_blob_big_prefill(0);
}

/* Big blobs (base/blob.c) keep their pages once freed, for the next ones: a
 * fresh page's first write costs about a hundred times a rewrite on a VM.
 * One that found none kept faulted its pages in on the loop: the next ones'
 * are written beforehand on the thread pool, BIG_PREFILL_BYTES a job. The
 * kept pages go back once no big blob was made for BIG_IDLE_NS. */
static void big_blobs_turn(struct node *n)
{
    if (tk_blob_big_prefill_wanted())
        node__run_on_pool(n, big_prefill, big_prefill_cancel, NULL, TIER_NICE);
    uint64_t now = node__mono_ns();
    if (now - n->tier.big_check_ns < BIG_IDLE_NS)
        return;
    n->tier.big_check_ns = now;
    uint64_t made = tk_blob_big_allocs();
    if (made == n->tier.big_allocs && tk_blob_big_cached_bytes() != 0)
        node__run_on_pool(n, big_cache_drop, NULL, NULL, TIER_NICE);
    n->tier.big_allocs = made;
}

/* Each loop turn: a step of compaction, a slice of a drain, and starting a
 * job when one is due; each claims its time in the turn's phases. */
void node__tier_turn(struct node *n)
{
    big_blobs_turn(n);
    if (node__installing(n))
        return; /* the install's swap closes the cold tier a job would use */
    uint64_t t0 = node__mono_ns();
    compact_step(n);
    uint64_t t1 = node__mono_ns();
    node__turn_add(n, NODE_PH_COMPACT, t1 - t0);
    bool drained = n->tier.busy || drain_step(n);
    uint64_t t2 = node__mono_ns();
    node__turn_add(n, NODE_PH_TIER, t2 - t1);
    node__backup_turn(n);
    if (!drained)
        return; /* no new job until the last one's pages are released */
    tier_turn(n);
    node__turn_add(n, NODE_PH_SNAPSHOT, node__mono_ns() - t2);
}

/* A ring past 1.5 times its budget (writes coming faster than tier-downs
 * move pages to LMDB): applying stops until a tier-down brings it back,
 * rather than the loop waiting for the job in flight (a wait of hundreds of
 * ms moved leadership) or apply tiering down inline at twice the budget
 * (hundreds of ms "in apply"). Heartbeats, votes, replication and commitment
 * go on; writes wait for their apply (or their deadline). The drain and the
 * next job go on each turn regardless (node__tier_turn); the job's
 * after-work callback kicks the loop, whose next turn releases the hold. */
void node__tier_hold(struct node *n)
{
    bool urgent = kv_sm_tier_urgent(n->sm);
    if (urgent == (n->tier.hold_since != 0))
        return;
    raft_hold_apply(n->raft, urgent);
    uint64_t now = node__mono_ns();
    if (urgent) {
        kv_sm_tier_hurry(n->sm); /* applying waits for the job: no pacing */
        n->tier.hold_since = now;
        n->m.metrics.apply_holds++;
        return;
    }
    uint64_t held = now - n->tier.hold_since;
    n->tier.hold_since = 0;
    n->m.metrics.apply_held_ns += held;
    TK_LOG(TK_LOG_INFO, n->o.id, raft_term(n->raft),
           "applying was held %llu ms: the KV ring passed 1.5 times its budget "
           "(writes faster than tier-downs; heartbeats went on)",
           (unsigned long long)(held / 1000000));
}

/* Flat cost as the data grows: a snapshot reads the whole state, so one is
 * not due before the payload applied since the last holds 1/SNAPSHOT_GROWTH
 * of that snapshot's size. Without it, a snapshot every 100k entries at 8M
 * keys read 1.2 GB per 100k writes, and the tier-downs (one job at a time)
 * fell so far behind that applying was held 2-6 s at a time. With it the
 * snapshot work per write stays about SNAPSHOT_GROWTH bytes read per byte
 * written, at any size; the log since the last snapshot (in memory) grows to
 * about 1/SNAPSHOT_GROWTH of the state. */
#define SNAPSHOT_GROWTH 8

/* Descriptor-only snapshots, for a large state: its LMDB file is
 * READER_RING_RATIO times the ring's budget or more (2 GB at 10M keys
 * against 64 MiB). A snapshot is then only its descriptor: the cold tier
 * holds the state at the last tier-down's index durably, which is all that
 * compacting the log behind it needs. The state is read out (reader_start,
 * paced and niced) only when something needs the stream: a follower behind
 * the log's start (raft_snapshot_wanted) or a backup. Reading the whole
 * state at every snapshot, on all three nodes at about the same index, was
 * what still held the steady state's writes at 3M and 10M keys, paced or
 * not (docs/history/benchmarks-scale.md). Below the ratio, a snapshot job (tier-down,
 * then the read, niced) costs the loops little: in the overload suite's 200
 * KiB forward burst (113 MB snapshots) a read beside the jobs made loop
 * turns late. */
#define READER_RING_RATIO 4

/* A stream read for a follower stays the core's snapshot for DATA_KEEP_NS
 * before a newer descriptor replaces it, so that a follower installing it
 * (11 s at 10M keys) finds the log after it still there rather than
 * needing another. */
#define DATA_KEEP_NS (60ull * 1000 * 1000 * 1000)

static bool state_big(const struct node *n)
{
    uint64_t ring = n->o.kv_ring_bytes ? n->o.kv_ring_bytes : (64u << 20);
    if (n->tier.blob != NULL && n->tier.blob->len >= READER_RING_RATIO * ring)
        return true;
    return kv_sm_cold_bytes(n->sm) >= READER_RING_RATIO * ring;
}

void node__tier_boot(struct node *n)
{
    if (raft_first_index(n->raft) <= 1 || state_big(n))
        return;
    /* The log was compacted: followers that need what is gone get a
     * snapshot of the state machine, so one must exist now. */
    n->tier.snap_index = 0;
    node__tier_start(n, true, true);
}

/* A large state's turn (`interval`: a snapshot is due by the entries or
 * bytes applied since the last). */
static void descriptor_turn(struct node *n, bool interval)
{
    struct node_tier *t = &n->tier;
    uint64_t durable = kv_sm_durable_index(n->sm);
    uint64_t backup = n->backups.wanted ? node__backup_target(n) : 0;
    bool fresh =
        t->blob != NULL && t->blob_at != 0 && node__mono_ns() - t->blob_at < DATA_KEEP_NS;
    if (t->reader == NULL && !(t->busy && t->snapshot)) {
        /* The stream, where it is wanted and the cold tier holds a state
         * at or past what is asked. */
        bool urgent = raft_snapshot_wanted(n->raft);
        bool read = urgent || (backup != 0 && durable >= backup);
        if (read && durable >= t->snap_index && reader_start(n, true, urgent)) {
            TK_LOG(TK_LOG_INFO, n->o.id, raft_term(n->raft),
                   "reading the state out at %llu for %s (the log starts at %llu)",
                   (unsigned long long)t->reader->meta.index,
                   urgent ? "a follower behind the log's start" : "a backup",
                   (unsigned long long)raft_first_index(n->raft));
            return;
        }
        /* The descriptor of the last tier-down's state. */
        if (interval && !fresh && durable > t->snap_index &&
            reader_start(n, false, false))
            return;
        /* Nothing tiered down since the last snapshot (or not as far as a
         * backup asks): a tier-down to the applied index first. */
        if (!t->busy && ((interval && !fresh) || (backup != 0 && durable < backup))) {
            tier_start_job(n, false, true, false);
            return;
        }
    }
    if (!t->busy && kv_sm_tier_wanted(n->sm))
        node__tier_start(n, false, false);
}

static void tier_turn(struct node *n)
{
    if (n->tier.reader != NULL)
        reader_raise(n, n->tier.reader);
    uint64_t applied = kv_sm_applied_index(n->sm);
    bool interval =
        (n->o.snapshot_entries != 0 &&
         applied >= n->tier.snap_index + n->o.snapshot_entries) ||
        (n->o.snapshot_bytes != 0 && n->tier.snap_bytes >= n->o.snapshot_bytes);
    bool wanted = raft_snapshot_wanted(n->raft) || n->backups.wanted;
    if ((interval || wanted || n->tier.reader != NULL) && state_big(n)) {
        descriptor_turn(n, interval);
        return;
    }
    bool grown =
        n->tier.blob == NULL || n->tier.snap_bytes >= n->tier.blob->len / SNAPSHOT_GROWTH;
    bool due = (grown && interval) || wanted;
    if (n->tier.busy)
        return;
    if (due && n->tier.reader == NULL)
        node__tier_start(n, true, false);
    else if (kv_sm_tier_wanted(n->sm))
        node__tier_start(n, false, false);
}
