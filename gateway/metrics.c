/* GET /metrics: Prometheus text format (version 0.0.4), and the per-route
 * request counters behind it. Called by api.c (the route table and every
 * response's accounting); reads the node (node_status, node_metrics,
 * node_latency, copied under its state lock) and the HTTP server's stats. On the
 * gateway's loop thread.
 *
 * Every metric is one row of `metric_table` below, in output order: its
 * name, type, help and how to read its value. Names are a public interface
 * (docs/operations.md, dashboards): never rename one. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/blob.h"
#include "gateway/gateway_internal.h"
#include "node/node_mem.h"
#include "raft/raft.h"

/* ---- per-route counters ------------------------------------------------- */

/* 0: unused; the last slot counts every other status. */
static const int status_codes[GW_STATUS_SLOTS] = {100, 200, 400, 404, 405, 408, 409,
                                                  411, 413, 414, 415, 431, 500, 501,
                                                  503, 504, 505, 0,   0,   0};

static const char *const route_names[ROUTE_COUNT] = {
#define X(id, name, method, pattern, handler, query, flags) [ROUTE_##id] = name,
    GW_ROUTES(X)
#undef X
        [ROUTE_OTHER] = "other",
};

static int status_slot(int status)
{
    for (int i = 0; i < GW_STATUS_SLOTS; i++)
        if (status_codes[i] == status)
            return i;
    return GW_STATUS_SLOTS - 1; /* "other" */
}

void api__metrics_count(struct gateway *gw, int route, int status, uint64_t ns)
{
    TK_ASSERT(route >= 0);
    TK_ASSERT(route < ROUTE_COUNT);
    gw->requests[route][status_slot(status)]++;
    tk_hist_record(&gw->latency[route], ns);
}

/* ---- histograms --------------------------------------------------------- */

/* Prometheus histograms from the node's base/hist.h histograms.
 *
 * A base histogram has 64 log-linear buckets per power of two; /metrics shows
 * it with the fixed `le` bounds below. The count at `le` = x is the number of
 * samples in the base buckets up to and including the one that holds x: a
 * sample is taken at its base bucket's lower bound, at most 1/64 (1.6 %) below
 * its value, so one just above x may be counted at x. Bounds under 128 are
 * exact (the base buckets there hold one value each). */
static const double lat_le_s[] = {10e-6, 25e-6,  50e-6, 100e-6, 250e-6, 500e-6,
                                  1e-3,  2.5e-3, 5e-3,  10e-3,  25e-3,  50e-3,
                                  0.1,   0.25,   0.5,   1.0};
static const double batch_le[] = {1,   2,   4,   8,    16,   32,  64,
                                  128, 256, 512, 1024, 2048, 4096};
#define LAT_LE_N (sizeof(lat_le_s) / sizeof(lat_le_s[0]))
#define BATCH_LE_N (sizeof(batch_le) / sizeof(batch_le[0]))

/* The base bucket holding each bound, found once by recording the bound into
 * a scratch histogram: hist.c keeps its layout to itself. */
static unsigned lat_le_bucket[LAT_LE_N];
static unsigned batch_le_bucket[BATCH_LE_N];
static uv_once_t le_once = UV_ONCE_INIT;

static unsigned base_bucket_of(struct tk_hist *scratch, uint64_t v)
{
    tk_hist_init(scratch);
    tk_hist_record(scratch, v);
    for (unsigned i = 0; i < TK_HIST_BUCKETS; i++)
        if (scratch->buckets[i] != 0)
            return i;
    TK_UNREACHABLE();
}

static void le_buckets_init(void)
{
    struct tk_hist *scratch = tk_malloc(sizeof(*scratch));
    for (size_t i = 0; i < LAT_LE_N; i++) {
        lat_le_bucket[i] = base_bucket_of(scratch, (uint64_t)(lat_le_s[i] * 1e9 + 0.5));
        TK_ASSERT(i == 0 || lat_le_bucket[i] > lat_le_bucket[i - 1]);
    }
    for (size_t i = 0; i < BATCH_LE_N; i++) {
        batch_le_bucket[i] = base_bucket_of(scratch, (uint64_t)batch_le[i]);
        TK_ASSERT(i == 0 || batch_le_bucket[i] > batch_le_bucket[i - 1]);
    }
    tk_free(scratch);
}

/* `h` as a Prometheus histogram (after its HELP and TYPE): cumulative _bucket{le} counts,
 * +Inf, _sum and _count; `scale` converts the base unit (1e-9: nanoseconds to seconds).
 */
static void histogram(struct jbuf *b, const char *name, const struct tk_hist *h,
                      const double *le, const unsigned *le_bucket, size_t n_le,
                      double scale)
{
    uint64_t cum = 0;
    unsigned next = 0;
    for (size_t i = 0; i < n_le; i++) {
        for (; next <= le_bucket[i]; next++)
            cum += h->buckets[next];
        jbuf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, le[i],
                    (unsigned long long)cum);
    }
    jbuf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name,
                (unsigned long long)h->count, name, (double)h->sum * scale, name,
                (unsigned long long)h->count);
}

/* ---- the table ---------------------------------------------------------- */

/* What one /metrics answer reads, taken once. */
struct snapshot {
    struct node_status st;
    struct node_metrics m;
    struct http_stats http;
    const struct node_latency *lat;
    struct node_latency lat_copy;
    const struct gateway *gw;
    uint64_t auth_denied; /* gw->auth_denied */
    /* Bodies decoded on the thread pool (api_offload.c). */
    uint64_t offloaded, offload_waiting, offload_running, body_values_by_ref;
    uint64_t admit_waiting, admit_waited, admit_inflight;
    /* Watches (api_watch.c) and the change log they read. */
    uint64_t watchers, watch_lagging, watch_compacted;
    uint64_t watch_pending, watch_over_total, watch_turn_full;
    uint64_t events_held, events_bytes, events_evicted;
    /* The process's memory (node/node_mem.h) and owners outside node_metrics. */
    struct node_mem_stats mem;
    uint64_t mem_raft_log; /* live small blobs + the log array's entries */
    uint64_t mem_snapshot; /* mapped blobs in use (snapshot streams) */
};

enum metric_kind {
    MK_VALUE,    /* one uint64_t of struct snapshot, at `off` */
    MK_ROLE,     /* one line per Raft role, 1 for the current one */
    MK_LATENCY,  /* a struct node_latency histogram at `off`, in seconds */
    MK_SIZE,     /* the same, a count (batch_le bounds) */
    MK_REQUESTS, /* requests by route and status */
    MK_DURATION, /* request latency quantiles by route */
    MK_SECONDS,  /* one uint64_t of struct snapshot in nanoseconds, in seconds */
    MK_TURN_MAX, /* node_metrics.loop_turn_max_ns by phase, in seconds */
    MK_MEMORY,   /* bytes by owner (node_metrics.mem_*, kv_ring_bytes) */
    MK_RSS,      /* the process's resident bytes by kind (node_mem_stats) */
};

struct metric_desc {
    const char *name;
    const char *type;
    const char *help;
    enum metric_kind kind;
    size_t off;
};

#define SNAP(field) offsetof(struct snapshot, field)
#define LAT(field) offsetof(struct node_latency, field)

static const struct metric_desc metric_table[] = {
    {"tierkv_raft_term", "gauge", "Current Raft term.", MK_VALUE, SNAP(st.term)},
    {"tierkv_raft_leader_id", "gauge", "Id of the known leader (0: none).", MK_VALUE,
     SNAP(st.leader)},
    {"tierkv_raft_role", "gauge", "1 for this node's current role.", MK_ROLE, 0},
    {"tierkv_raft_commit_index", "gauge", "Highest committed log index.", MK_VALUE,
     SNAP(st.commit)},
    {"tierkv_raft_applied_index", "gauge", "Highest applied log index.", MK_VALUE,
     SNAP(st.applied)},
    {"tierkv_raft_last_index", "gauge", "Last log index.", MK_VALUE, SNAP(st.last_index)},
    {"tierkv_raft_snapshot_index", "gauge", "Index of the latest snapshot.", MK_VALUE,
     SNAP(st.snapshot_index)},
    {"tierkv_proposals_total", "counter", "Writes proposed by this node.", MK_VALUE,
     SNAP(m.proposals)},
    {"tierkv_proposal_batches_total", "counter",
     "Proposal batches (proposals/batches = mean batch size).", MK_VALUE,
     SNAP(m.batches)},
    {"tierkv_forwarded_total", "counter", "Writes forwarded to the leader.", MK_VALUE,
     SNAP(m.forwarded)},
    {"tierkv_gate_held_total", "counter",
     "Large writes (32 KiB or more) the leader held until the large entries "
     "before them had been applied and persisted by every voter keeping up.",
     MK_VALUE, SNAP(m.gate_held_total)},
    {"tierkv_gate_refused_total", "counter",
     "Large writes refused (503) with 256 MiB of them held already.", MK_VALUE,
     SNAP(m.gate_refused)},
    {"tierkv_gate_rests_total", "counter",
     "Times the pipeline was kept free of large entries for as long as the last "
     "ones took, smaller writes having been proposed meanwhile.",
     MK_VALUE, SNAP(m.gate_rests)},
    {"tierkv_gate_held", "gauge", "Large writes held by the leader's gate now.", MK_VALUE,
     SNAP(m.gate_held)},
    {"tierkv_member_refused_total", "counter",
     "Raft handshakes refused: a member id presenting another data directory (an "
     "amnesiac), or a stranger (removed, or dropped by --force-new-cluster).",
     MK_VALUE, SNAP(m.members_refused)},
    {"tierkv_reads_total", "counter", "Reads served.", MK_VALUE, SNAP(m.reads)},
    {"tierkv_read_index_total", "counter",
     "Linearizable reads that asked for a read index.", MK_VALUE, SNAP(m.read_index)},
    {"tierkv_read_index_rounds_total", "counter",
     "ReadIndex heartbeat rounds this node started as leader; one round "
     "confirms every read waiting for it.",
     MK_VALUE, SNAP(m.read_index_rounds)},
    {"tierkv_raft_acks_merged_total", "counter",
     "Append acks this node, as a follower, folded into the next ack to the "
     "leader (the appends of a loop turn answered by one message).",
     MK_VALUE, SNAP(m.acks_merged)},
    {"tierkv_applied_entries_total", "counter", "Entries applied.", MK_VALUE,
     SNAP(m.applied_entries)},
    {"tierkv_snapshots_total", "counter", "Snapshots taken.", MK_VALUE,
     SNAP(m.snapshots)},
    {"tierkv_snapshot_installs_total", "counter", "Snapshots installed.", MK_VALUE,
     SNAP(m.installs)},
    {"tierkv_snapshot_reads_total", "counter",
     "Snapshots read out of the cold tier beside the tier-downs, when a follower or a "
     "backup needed the stream of a large state.",
     MK_VALUE, SNAP(m.snapshot_reads)},
    {"tierkv_snapshot_descriptors_total", "counter",
     "Snapshots taken as a descriptor only (a large state: the log is compacted behind "
     "the cold tier's durable state, which is read out only when needed).",
     MK_VALUE, SNAP(m.snapshot_descriptors)},
    {"tierkv_snapshot_trailing_reads_total", "counter",
     "Log entries read on the loop to find a snapshot's trailing window (the marks of "
     "the bytes applied did not reach back).",
     MK_VALUE, SNAP(m.trailing_reads)},
    {"tierkv_snapshot_replaced_log_entries_total", "counter",
     "Log entries that snapshots from the leader replaced, freed on the thread pool.",
     MK_VALUE, SNAP(m.replaced_log_entries)},
    {"tierkv_snapshot_installs_dropped_total", "counter",
     "Newer snapshots from the leader dropped while one was being installed "
     "(the leader sends again).",
     MK_VALUE, SNAP(m.installs_dropped)},
    {"tierkv_snapshot_installs_parked_total", "counter",
     "Snapshots from the leader parked until the tier work in flight ended.", MK_VALUE,
     SNAP(m.installs_parked)},
    {"tierkv_snapshot_install_deferred_appends_total", "counter",
     "Batches of log entries that arrived during a snapshot install and were "
     "appended after it, instead of the loop waiting for it.",
     MK_VALUE, SNAP(m.installs_deferred)},
    {"tierkv_snapshots_refused_total", "counter",
     "Snapshots from a leader refused as bad input (checksum or structure), before "
     "any install step.",
     MK_VALUE, SNAP(m.snapshots_refused)},
    {"tierkv_raft_terms_refused_total", "counter",
     "Raft messages refused for their term: past the ceiling (2^62) or more than 2^32 "
     "above this node's.",
     MK_VALUE, SNAP(m.terms_refused)},
    {"tierkv_store_syncs_total", "counter", "Log store fsyncs.", MK_VALUE,
     SNAP(m.store_syncs)},
    {"tierkv_store_segments_recycled_total", "counter",
     "Compacted log segments kept as the next segment instead of deleted.", MK_VALUE,
     SNAP(m.store_recycled)},
    {"tierkv_store_appends_total", "counter",
     "Append requests the log store's thread completed.", MK_VALUE,
     SNAP(m.store_appends)},
    {"tierkv_store_wakeups_total", "counter",
     "Times a producer woke the log store's thread (only when it slept).", MK_VALUE,
     SNAP(m.store_wakeups)},
    {"tierkv_loop_wakeups_total", "counter",
     "Wake-ups of the node's loop by other threads (storage completions, requests, "
     "stops).",
     MK_VALUE, SNAP(m.loop_wakeups)},
    {"tierkv_store_appended_bytes_total", "counter",
     "Payload bytes appended to the Raft log since the node started.", MK_VALUE,
     SNAP(m.store_bytes)},
    {"tierkv_kv_ring_bytes", "gauge",
     "Bytes of ring pages the state machine's hot tier holds in memory.", MK_VALUE,
     SNAP(m.kv_ring_bytes)},
    {"tierkv_kv_hot_keys", "gauge", "Keys in the state machine's hot index.", MK_VALUE,
     SNAP(m.kv_hot_keys)},
    {"tierkv_kv_cold_keys", "gauge", "Keys in the state machine's cold tier (LMDB).",
     MK_VALUE, SNAP(m.kv_cold_keys)},
    {"tierkv_kv_cold_bytes", "gauge", "Bytes of the cold tier's LMDB data file in use.",
     MK_VALUE, SNAP(m.kv_cold_bytes)},
    {"tierkv_store_log_bytes", "gauge",
     "Bytes of records in the Raft log (segment files are preallocated, so "
     "the disk holds up to one segment more).",
     MK_VALUE, SNAP(m.store_log_bytes)},
    {"tierkv_kv_tier_downs_total", "counter",
     "Tier-down transactions (ring pages moved to the cold tier).", MK_VALUE,
     SNAP(m.kv_tier_downs)},
    {"tierkv_kv_writeback_paced_total", "counter",
     "Tier-down commits whose writeback was paced (--kv-writeback-pace).", MK_VALUE,
     SNAP(m.kv_paced_syncs)},
    {"tierkv_kv_writeback_paced_seconds_total", "counter",
     "Time paced tier-down commits slept between the slices they wrote out.", MK_SECONDS,
     SNAP(m.kv_paced_slept_ns)},
    {"tierkv_kv_bad_records_total", "counter",
     "Ring records that failed their check on read (served from the cold tier).",
     MK_VALUE, SNAP(m.kv_bad_records)},
    {"tierkv_transport_sent_bytes_total", "counter", "Raft transport bytes sent.",
     MK_VALUE, SNAP(m.net_bytes_sent)},
    {"tierkv_transport_received_bytes_total", "counter", "Raft transport bytes received.",
     MK_VALUE, SNAP(m.net_bytes_received)},
    {"tierkv_transport_reconnects_total", "counter", "Raft transport reconnects.",
     MK_VALUE, SNAP(m.net_reconnects)},
    {"tierkv_transport_auth_failures_total", "counter",
     "Raft handshakes refused: a wrong or missing token proof, a failed TLS handshake, "
     "a certificate not naming the claimed node, or an id that is not a member.",
     MK_VALUE, SNAP(m.net_auth_failed)},
    {"tierkv_transport_spoofed_total", "counter",
     "Raft messages dropped: their sender is not the connection's authenticated id.",
     MK_VALUE, SNAP(m.net_spoofed)},
    {"tierkv_transport_bad_connections_total", "counter",
     "Raft connections closed for bad input, a bad handshake or a missed deadline.",
     MK_VALUE, SNAP(m.net_conns_bad)},
    {"tierkv_transport_pending_evicted_total", "counter",
     "Unauthenticated Raft connections closed to make room for newer ones.", MK_VALUE,
     SNAP(m.net_pending_evicted)},
    {"tierkv_transport_idle_closed_total", "counter",
     "Authenticated inbound Raft connections closed past the idle deadline.", MK_VALUE,
     SNAP(m.net_conns_idle)},
    {"tierkv_transport_snapshots_dropped_total", "counter",
     "Snapshot reassemblies dropped (deadline or memory bound).", MK_VALUE,
     SNAP(m.net_snapshots_dropped)},
    {"tierkv_transport_reads_paused_total", "counter",
     "Raft connections' reads put off to the next loop turn (over 2 MiB read in one).",
     MK_VALUE, SNAP(m.net_reads_paused)},
    {"tierkv_transport_snapshot_faulted_ahead_bytes_total", "counter",
     "Bytes of big snapshots being received faulted in on the thread pool ahead of "
     "their chunks (the loop then copies into pages already there).",
     MK_VALUE, SNAP(m.net_snapshot_faulted_ahead)},
    {"tierkv_transport_snapshot_fault_waits_total", "counter",
     "Times a connection's reads waited for the pages ahead of a big snapshot's "
     "chunks to be faulted in (the loop does not zero them itself).",
     MK_VALUE, SNAP(m.net_snapshot_fault_waits)},
    {"tierkv_http_tls_failures_total", "counter",
     "HTTPS connections closed for a failed TLS handshake or a bad record.", MK_VALUE,
     SNAP(http.tls_failed)},
    {"tierkv_http_bodies_offloaded_total", "counter",
     "Write bodies of 32 KiB or more decoded on the thread pool instead of the loop.",
     MK_VALUE, SNAP(offloaded)},
    {"tierkv_http_body_values_by_reference_total", "counter",
     "Values of 1 KiB or more in JSON write bodies taken from the body's bytes "
     "(checked, not parsed by jansson).",
     MK_VALUE, SNAP(body_values_by_ref)},
    {"tierkv_http_bodies_offload_waiting", "gauge",
     "Such bodies waiting for one of the gateway's 2 decoding slots.", MK_VALUE,
     SNAP(offload_waiting)},
    {"tierkv_http_bodies_offload_running", "gauge", "Such bodies being decoded now.",
     MK_VALUE, SNAP(offload_running)},
    {"tierkv_http_bodies_admit_waiting", "gauge",
     "Such writes built and waiting for the large writes in flight to end.", MK_VALUE,
     SNAP(admit_waiting)},
    {"tierkv_http_bodies_admit_waited_total", "counter",
     "Such writes that had to wait for the large writes in flight to end.", MK_VALUE,
     SNAP(admit_waited)},
    {"tierkv_http_bodies_admit_inflight_bytes", "gauge",
     "Bytes of such writes submitted and not yet answered (4 MiB, or one write).",
     MK_VALUE, SNAP(admit_inflight)},
    {"tierkv_http_auth_denied_total", "counter",
     "Requests answered 401 or 403 (--auth-file).", MK_VALUE, SNAP(auth_denied)},
    {"tierkv_http_connections", "gauge", "Open HTTP connections.", MK_VALUE,
     SNAP(http.conns_open)},
    {"tierkv_http_connections_accepted_total", "counter", "HTTP connections accepted.",
     MK_VALUE, SNAP(http.conns_accepted)},
    {"tierkv_http_connections_rejected_total", "counter",
     "HTTP connections refused over the connection limit.", MK_VALUE,
     SNAP(http.conns_rejected)},
    {"tierkv_http_timeouts_total", "counter",
     "HTTP connections cut for slow headers or body, or responses not read in time.",
     MK_VALUE, SNAP(http.conns_timed_out)},
    {"tierkv_http_connections_evicted_total", "counter",
     "Idle HTTP connections closed to make room at the connection limit.", MK_VALUE,
     SNAP(http.conns_evicted)},
    {"tierkv_http_overloaded_total", "counter",
     "Requests answered 503 overloaded (--max-memory-bytes).", MK_VALUE,
     SNAP(http.overloaded)},
    {"tierkv_http_held_bytes", "gauge",
     "Request bodies and responses held by the HTTP server now.", MK_VALUE,
     SNAP(http.mem_bytes)},
    {"tierkv_http_reads_paused_total", "counter",
     "Times an HTTP connection's reads waited for the next loop turn: the "
     "turn's read budget (4 MiB over all connections) was spent.",
     MK_VALUE, SNAP(http.reads_paused)},
    {"tierkv_http_bad_requests_total", "counter",
     "Requests answered 400, 408, 413, 414 or 431.", MK_VALUE, SNAP(http.bad_requests)},
    {"tierkv_http_tls_handshakes", "gauge",
     "HTTPS handshakes in progress now (each holds one of --max-tls-handshakes slots).",
     MK_VALUE, SNAP(http.tls_handshakes)},
    {"tierkv_http_tls_refused_total", "counter",
     "HTTPS connections closed as accepted: --max-tls-handshakes in progress, or "
     "--max-tls-handshakes-per-addr from the client's address.",
     MK_VALUE, SNAP(http.tls_refused)},
    {"tierkv_http_tls_handshake_timeouts_total", "counter",
     "HTTPS handshakes cut at their deadline (--header-timeout-ms).", MK_VALUE,
     SNAP(http.tls_handshake_timeouts)},
    {"tierkv_http_accepts_deferred_total", "counter",
     "HTTP connections left in the listen queue for the next loop turn (64 "
     "accepted per turn).",
     MK_VALUE, SNAP(http.accepts_deferred)},
    {"tierkv_http_discarded_bytes_total", "counter",
     "Bytes read from HTTP clients and dropped: after a final error answer (a "
     "lingering close) or from refused connections.",
     MK_VALUE, SNAP(http.discarded_bytes)},
    {"tierkv_http_mem_trims_total", "counter",
     "malloc_trim(0) calls after an HTTPS handshake storm (the freed sessions' "
     "memory given back).",
     MK_VALUE, SNAP(http.mem_trims)},
    {"tierkv_http_requests_put_off_total", "counter",
     "Requests with a large body (64 KiB or more) handed over in a later loop turn: "
     "the turn's share (--max-body-bytes of them) was spent.",
     MK_VALUE, SNAP(http.requests_put_off)},
    {"tierkv_http_closes_deferred_total", "counter",
     "HTTP connections whose client left, closed in a later loop turn: at most 256 "
     "are closed a turn.",
     MK_VALUE, SNAP(http.closes_deferred)},
    {"tierkv_http_conns_parked_total", "counter",
     "Idle HTTP connections (1 s with nothing in flight) moved off the loop's epoll set "
     "into the server's own, which wakes at most 256 of them a loop turn.",
     MK_VALUE, SNAP(http.conns_parked)},
    {"tierkv_http_conns_unparked_total", "counter",
     "Parked connections taken back when readable (a request, or the client left).",
     MK_VALUE, SNAP(http.conns_unparked)},
    {"tierkv_http_conns_parked", "gauge", "HTTP connections parked now.", MK_VALUE,
     SNAP(http.conns_parked_now)},
    {"tierkv_store_append_seconds", "histogram",
     "Log append latency, handed to storage to durable (fsync included).", MK_LATENCY,
     LAT(append)},
    {"tierkv_store_fsync_seconds", "histogram",
     "Duration of one log sync (fdatasync of the segments written).", MK_LATENCY,
     LAT(fsync)},
    {"tierkv_apply_seconds", "histogram", "Time to apply one batch of committed entries.",
     MK_LATENCY, LAT(apply)},
    {"tierkv_proposal_batch_size", "histogram", "Entries per proposal batch.", MK_SIZE,
     LAT(batch_size)},
    {"tierkv_loop_turn_seconds", "histogram",
     "One turn of the node's loop (every callback; without the wait for events).",
     MK_LATENCY, LAT(loop_turn)},
    {"tierkv_loop_turn_max_seconds", "gauge",
     "The longest loop turn so far, by the phase most of it went to.", MK_TURN_MAX, 0},
    {"tierkv_loop_turn_max_cpu_seconds", "gauge",
     "The loop thread's CPU time in the longest loop turn so far (a lower bound, low "
     "by under 1 ms).",
     MK_SECONDS, SNAP(m.loop_turn_max_cpu_ns)},
    {"tierkv_loop_turns_held_total", "counter",
     "Loop turns longer than half the election timeout that held the CPU for 20 ms "
     "or more.",
     MK_VALUE, SNAP(m.loop_turns_held)},
    {"tierkv_loop_turn_held_max_seconds", "gauge",
     "The longest loop turn that held the CPU for 20 ms or more (0: none).", MK_SECONDS,
     SNAP(m.loop_turn_held_max_ns)},
    {"tierkv_snapshot_loop_seconds_total", "counter",
     "Loop time spent publishing snapshots (the rest runs off the loop).", MK_SECONDS,
     SNAP(m.snapshot_loop_ns)},
    {"tierkv_kv_tier_drain_seconds_total", "counter",
     "Loop time spent dropping released index entries after tier-downs (in slices).",
     MK_SECONDS, SNAP(m.tier_drain_ns)},
    {"tierkv_kv_tier_drain_max_seconds", "gauge",
     "The longest single slice of dropping released index entries.", MK_SECONDS,
     SNAP(m.tier_drain_max_ns)},
    {"tierkv_apply_holds_total", "counter",
     "Times applying was held because the KV ring passed 1.5 times its budget "
     "(writes faster than tier-downs; the loop goes on meanwhile).",
     MK_VALUE, SNAP(m.apply_holds)},
    {"tierkv_apply_held_seconds_total", "counter",
     "Time applying was held for the KV ring, in all.", MK_SECONDS,
     SNAP(m.apply_held_ns)},
    {"tierkv_memory_bytes", "gauge",
     "Memory by owner: hot index, ordered view, ring, sessions, LMDB map and its "
     "resident part.",
     MK_MEMORY, 0},
    {"tierkv_memory_budget_bytes", "gauge",
     "The node's memory budget (--memory-budget; docs/operations.md).", MK_VALUE,
     SNAP(mem.budget)},
    {"tierkv_process_resident_bytes", "gauge",
     "The process's resident memory by kind (RssAnon, RssFile, RssShmem).", MK_RSS, 0},
    {"tierkv_memory_heap_free_bytes", "gauge",
     "Free bytes glibc's arenas hold (mallinfo2 fordblks): address space, resident "
     "only where once written and not yet trimmed.",
     MK_VALUE, SNAP(mem.heap_free)},
    {"tierkv_memory_trims_total", "counter",
     "malloc_trim(0) calls by the memory trimmer after bursts.", MK_VALUE,
     SNAP(mem.trims)},
    {"tierkv_memory_trim_seconds_max", "gauge",
     "The longest malloc_trim(0) call by the trimmer (on its own thread).", MK_SECONDS,
     SNAP(mem.trim_ns_max)},
    {"tierkv_http_requests_total", "counter", "HTTP requests by route and status.",
     MK_REQUESTS, 0},
    {"tierkv_watchers", "gauge", "Watches open on this node.", MK_VALUE, SNAP(watchers)},
    {"tierkv_watch_cancelled_lagging_total", "counter",
     "Watches ended because their client fell behind (lagging).", MK_VALUE,
     SNAP(watch_lagging)},
    {"tierkv_watch_pending_bytes", "gauge",
     "Bytes written to watches that their clients have not taken (at most "
     "watch_total_bytes, 64 MiB).",
     MK_VALUE, SNAP(watch_pending)},
    {"tierkv_watch_cancelled_over_total_total", "counter",
     "Watches cancelled (lagging) because all watches together held more than "
     "watch_total_bytes; also counted in tierkv_watch_cancelled_lagging_total.",
     MK_VALUE, SNAP(watch_over_total)},
    {"tierkv_watch_turn_full_total", "counter",
     "Watch passes put off: the turn's 512 KiB for watches was spent, or the "
     "wait after a pass that spent it (watches take at most a quarter of the loop).",
     MK_VALUE, SNAP(watch_turn_full)},
    {"tierkv_watch_compacted_total", "counter",
     "Watches refused or ended because their revision left the change log.", MK_VALUE,
     SNAP(watch_compacted)},
    {"tierkv_watch_events", "gauge", "Events the change log holds.", MK_VALUE,
     SNAP(events_held)},
    {"tierkv_watch_events_bytes", "gauge", "Bytes the change log holds.", MK_VALUE,
     SNAP(events_bytes)},
    {"tierkv_watch_events_evicted_total", "counter",
     "Events dropped from the change log to make room.", MK_VALUE, SNAP(events_evicted)},
    {"tierkv_http_request_duration_seconds", "summary",
     "HTTP request latency, receipt of the full request to response queued.", MK_DURATION,
     0},
};

static void put_requests(struct jbuf *b, const struct gateway *gw)
{
    for (int r = 0; r < ROUTE_COUNT; r++)
        for (int s = 0; s < GW_STATUS_SLOTS; s++)
            if (gw->requests[r][s]) {
                char code[16];
                if (status_codes[s])
                    snprintf(code, sizeof(code), "%d", status_codes[s]);
                else
                    snprintf(code, sizeof(code), "other");
                jbuf_printf(b,
                            "tierkv_http_requests_total{route=\"%s\",code=\"%s\"} %llu\n",
                            route_names[r], code, (unsigned long long)gw->requests[r][s]);
            }
}

static void put_durations(struct jbuf *b, const struct gateway *gw)
{
    static const double qs[] = {0.5, 0.9, 0.99, 0.999};
    for (int r = 0; r < ROUTE_COUNT; r++) {
        const struct tk_hist *h = &gw->latency[r];
        if (h->count == 0)
            continue;
        for (size_t i = 0; i < sizeof(qs) / sizeof(qs[0]); i++)
            jbuf_printf(
                b,
                "tierkv_http_request_duration_seconds{route=\"%s\",quantile=\"%g\"} "
                "%.6f\n",
                route_names[r], qs[i], (double)tk_hist_quantile(h, qs[i]) / 1e9);
        jbuf_printf(b, "tierkv_http_request_duration_seconds_sum{route=\"%s\"} %.6f\n",
                    route_names[r], (double)h->sum / 1e9);
        jbuf_printf(b, "tierkv_http_request_duration_seconds_count{route=\"%s\"} %llu\n",
                    route_names[r], (unsigned long long)h->count);
    }
}

static void put_memory(struct jbuf *b, const char *name, const struct snapshot *s)
{
    const struct node_metrics *m = &s->m;
    const struct {
        const char *owner;
        uint64_t v;
    } rows[] = {{"index", m->mem_index_bytes},
                {"view", m->mem_view_bytes},
                {"ring", m->kv_ring_bytes},
                {"sessions", m->mem_sessions_bytes},
                {"lmdb_mapped", m->mem_lmdb_mapped},
                {"lmdb_resident", m->mem_lmdb_resident},
                {"snapshot_spare", m->mem_snapshot_spare},
                {"blob_cache", m->mem_blob_cache},
                {"change_log", s->events_bytes},
                {"raft_log", s->mem_raft_log},
                {"http", s->http.mem_bytes},
                {"watch", s->watch_pending},
                {"snapshot", s->mem_snapshot}};
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        jbuf_printf(b, "%s{owner=\"%s\"} %llu\n", name, rows[i].owner,
                    (unsigned long long)rows[i].v);
}

/* One metric's lines after its HELP and TYPE. */
static void put_metric(struct jbuf *b, const struct metric_desc *d,
                       const struct snapshot *s)
{
    const struct tk_hist *h = (const struct tk_hist *)((const char *)s->lat + d->off);
    switch (d->kind) {
    case MK_VALUE: {
        uint64_t v;
        memcpy(&v, (const char *)s + d->off, sizeof(v));
        jbuf_printf(b, "%s %llu\n", d->name, (unsigned long long)v);
        break;
    }
    case MK_ROLE:
        for (int r = RAFT_FOLLOWER; r <= RAFT_LEADER; r++)
            jbuf_printf(b, "tierkv_raft_role{role=\"%s\"} %d\n", raft_role_name(r),
                        s->st.role == r);
        break;
    case MK_LATENCY:
        histogram(b, d->name, h, lat_le_s, lat_le_bucket, LAT_LE_N, 1e-9);
        break;
    case MK_SIZE:
        histogram(b, d->name, h, batch_le, batch_le_bucket, BATCH_LE_N, 1.0);
        break;
    case MK_REQUESTS:
        put_requests(b, s->gw);
        break;
    case MK_DURATION:
        put_durations(b, s->gw);
        break;
    case MK_SECONDS: {
        uint64_t v;
        memcpy(&v, (const char *)s + d->off, sizeof(v));
        jbuf_printf(b, "%s %.9f\n", d->name, (double)v / 1e9);
        break;
    }
    case MK_TURN_MAX:
        for (int i = 0; i < NODE_PH_N; i++)
            jbuf_printf(b, "%s{phase=\"%s\"} %.9f\n", d->name, node_turn_phase_name(i),
                        (double)s->m.loop_turn_max_ns[i] / 1e9);
        break;
    case MK_MEMORY:
        put_memory(b, d->name, s);
        break;
    case MK_RSS:
        jbuf_printf(
            b,
            "%s{kind=\"anon\"} %llu\n%s{kind=\"file\"} %llu\n%s{kind=\"shmem\"} %llu\n",
            d->name, (unsigned long long)s->mem.rss_anon, d->name,
            (unsigned long long)s->mem.rss_file, d->name,
            (unsigned long long)s->mem.rss_shmem);
        break;
    }
}

void api__metrics(struct api_req *req, const struct query *q)
{
    struct gateway *gw = req->gw;
    (void)q;
    struct snapshot s = {.gw = gw, .auth_denied = gw->auth_denied};
    node_status(gw->node, &s.st);
    node_metrics(gw->node, &s.m);
    http_server_stats(gw->http, &s.http);
    /* The node's histograms and change log, copied under its state lock. */
    struct kv_events_stats es = {0};
    if (api__state_enter(gw)) {
        s.lat_copy = *node_latency(gw->node);
        kv_sm_events_stats(node_kv(gw->node), &es);
        api__state_leave(gw, false);
    }
    s.lat = &s.lat_copy;
    s.watchers = gw->n_watchers;
    s.offloaded = gw->offloaded;
    s.body_values_by_ref = gw->body_values_by_ref;
    s.offload_waiting = gw->offload_waiting;
    s.offload_running = gw->offload_running;
    s.admit_waiting = gw->admit_waiting;
    s.admit_waited = gw->admit_waited;
    s.admit_inflight = gw->admit_inflight;
    s.watch_lagging = gw->watch_lagging;
    s.watch_compacted = gw->watch_compacted;
    s.watch_pending = api__watch_pending(gw);
    s.watch_over_total = gw->watch_over_total;
    s.watch_turn_full = gw->watch_turn_full;
    s.events_held = es.count;
    s.events_bytes = es.bytes;
    s.events_evicted = es.evicted;
    node_mem_stats(&s.mem, true);
    s.mem_snapshot = tk_blob_map_live_bytes();
    s.mem_raft_log = tk_blob_live_small_bytes();
    if (s.st.last_index > s.st.snapshot_index)
        s.mem_raft_log +=
            (s.st.last_index - s.st.snapshot_index) * sizeof(struct raft_entry);
    uv_once(&le_once, le_buckets_init);
    struct jbuf b;
    jbuf_init(&b, 8192);
    for (size_t i = 0; i < sizeof(metric_table) / sizeof(metric_table[0]); i++) {
        const struct metric_desc *d = &metric_table[i];
        jbuf_printf(&b, "# HELP %s %s\n# TYPE %s %s\n", d->name, d->help, d->name,
                    d->type);
        put_metric(&b, d, &s);
    }
    http_respond(req->http, 200, "text/plain; version=0.0.4", NULL, b.p, b.len);
    jbuf_free(&b);
}
