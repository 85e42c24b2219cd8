/* The trailing window behind a snapshot holds at most snapshot_bytes of
 * payload (node/node_tier.c, issue 19): a single node on a memory volume,
 * snapshots every 64 KiB of commands, trailing_entries 10000; after 200 writes
 * of 8 KiB (1.6 MB) the log held in memory (store_log_bytes of a memory
 * volume) comes down to the entries since the last snapshot and 64 KiB
 * behind it (within two entries), not the 10000 entries the entry count
 * alone would keep (all). */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/blob.h"
#include "kv.pb-c.h"
#include "node/node.h"
#include "tests/check_run.h"
#include "transport/transport.h"

#define VALUE (8u << 10)
#define WRITES 200
#define SNAP_BYTES (64u << 10)

static atomic_int done, failed;

static void write_done(struct node_req *req, int status, const struct kv_result *res,
                       void *data)
{
    (void)req;
    (void)data;
    if (status != 0 || res == NULL || res->code != 0)
        atomic_fetch_add(&failed, 1);
    atomic_fetch_add(&done, 1);
}

static struct tk_blob *put_cmd(int i)
{
    static uint8_t val[VALUE];
    char key[16];
    snprintf(key, sizeof(key), "k%03d", i);
    Kvpb__Put put = KVPB__PUT__INIT;
    put.key.data = (uint8_t *)key;
    put.key.len = strlen(key);
    put.value.data = val;
    put.value.len = sizeof(val);
    Kvpb__Command c = KVPB__COMMAND__INIT;
    c.cmd_case = KVPB__COMMAND__CMD_PUT;
    c.put = &put;
    struct tk_blob *b = tk_blob_new(kvpb__command__get_packed_size(&c));
    kvpb__command__pack(&c, b->data);
    return b;
}

/* Starts node 1 alone on `dir` (NULL: a memory volume), a snapshot every
 * `snap_entries` entries or SNAP_BYTES of commands, and waits for it to lead. */
static struct node *start_on(struct transport_inproc_hub *hub, const char *dir,
                             uint64_t snap_entries)
{
    struct node_options o;
    node_options_default(&o);
    o.id = 1;
    o.members.n_voters = 1;
    o.members.voters[0] = 1;
    o.hub = hub;
    o.data_dir = dir;
    o.kv_no_sync = true;
    o.snapshot_entries = snap_entries;
    o.snapshot_bytes = SNAP_BYTES;
    o.trailing_entries = 10000;
    struct node *n;
    ck_assert_int_eq(node_start(&o, &n), 0);
    struct node_status st = {0};
    for (int i = 0; i < 2000 && st.leader != 1; i++) {
        usleep(5000);
        node_status(n, &st);
    }
    ck_assert_uint_eq(st.leader, 1);
    return n;
}

/* Writes keys [from, to) one at a time, then waits (bounded) for the node
 * to have taken `snaps` snapshots since it started. */
static void write_and_snapshot(struct node *n, int from, int to, uint64_t snaps)
{
    static struct node_req reqs[WRITES];
    atomic_store(&done, 0);
    for (int i = from; i < to; i++) {
        reqs[i - from] = (struct node_req){
            .mode = NODE_MODE_APPLIED, .cmd = put_cmd(i), .write_cb = write_done};
        ck_assert_int_eq(node_submit(n, &reqs[i - from]), 0);
        while (atomic_load(&done) <= i - from)
            usleep(200);
    }
    ck_assert_int_eq(atomic_load(&failed), 0);
    struct node_metrics m = {0};
    for (int t = 0; t < 1000 && m.snapshots < snaps; t++) {
        usleep(10000);
        node_metrics(n, &m);
    }
    ck_assert_uint_ge(m.snapshots, snaps);
}

START_TEST(test_trailing_window_is_bounded_in_bytes)
{
    struct transport_inproc_hub *hub = transport_inproc_hub_new(3);
    struct node *n = start_on(hub, NULL, 1000000);
    write_and_snapshot(n, 0, WRITES, 0); /* one at a time: entries of one write */
    struct node_status st;
    /* Snapshots run in the background and the log is compacted in steps:
     * poll (bounded) for the log to come down to the entries since the last
     * snapshot (each VALUE bytes and a little) and a window of SNAP_BYTES (and
     * the entry that crosses it). The log's bytes are read from the store at
     * once, the snapshot index from the status the loop publishes, which can
     * lag a compaction behind a newer snapshot: poll until both bounds hold
     * (or time out and fail on the one that does not). */
    struct node_metrics m;
    uint64_t bound = 0, floor = 0;
    for (int t = 0; t < 1000; t++) {
        struct node_status after;
        node_status(n, &st);
        node_metrics(n, &m);
        node_status(n, &after); /* the same snapshot all along: m is its */
        bound = (st.applied - st.snapshot_index + 1) * (VALUE + 256) + SNAP_BYTES + VALUE;
        floor = (st.applied - st.snapshot_index) * VALUE + SNAP_BYTES - 2 * VALUE;
        if (st.snapshot_index > 0 && m.store_log_bytes <= bound &&
            m.store_log_bytes >= floor && after.snapshot_index == st.snapshot_index)
            break;
        usleep(10000);
    }
    printf("trailing window: %llu bytes of log held after %u writes of %u bytes "
           "(snapshot at %llu of %llu; bound %llu)\n",
           (unsigned long long)m.store_log_bytes, WRITES, VALUE,
           (unsigned long long)st.snapshot_index, (unsigned long long)st.applied,
           (unsigned long long)bound);
    fflush(stdout);
    ck_assert_uint_gt(st.snapshot_index, 0);
    ck_assert_uint_le(m.store_log_bytes, bound);
    /* ... and the window is there: compacting to the snapshot would also
     * pass the bound (node_tier.c finds the window from marks of the bytes
     * applied, a mark every 1/64 of snapshot_bytes here: every entry). */
    ck_assert_uint_ge(m.store_log_bytes, floor);
    node_stop(n);
    transport_inproc_hub_free(hub);
}
END_TEST

/* After a restart, the first snapshots find their trailing window from the
 * marks of the bytes applied, not by reading the log's entries on the loop:
 * the entries the state machine held already at boot are counted at boot
 * (node_recover.c). Snapshots every 4 entries of 8 KiB, a window of 64 KiB
 * (8 entries): the first snapshot after the restart needs marks from before
 * it. */
START_TEST(test_trailing_window_after_restart_reads_no_entry)
{
    char dir[] = "/tmp/tk-trailing-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    struct transport_inproc_hub *hub = transport_inproc_hub_new(3);
    struct node *n = start_on(hub, dir, 4);
    write_and_snapshot(n, 0, 40, 3);
    node_stop(n);
    n = start_on(hub, dir, 4);
    write_and_snapshot(n, 40, 60, 2);
    struct node_metrics m;
    node_metrics(n, &m);
    printf("after the restart: %llu snapshots, %llu log entries read for their "
           "trailing windows\n",
           (unsigned long long)m.snapshots, (unsigned long long)m.trailing_reads);
    fflush(stdout);
    ck_assert_uint_eq(m.trailing_reads, 0);
    node_stop(n);
    transport_inproc_hub_free(hub);
    char cmd[64];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("node_trailing");
    TCase *tc = tcase_create("trailing");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_trailing_window_is_bounded_in_bytes);
    tcase_add_test(tc, test_trailing_window_after_restart_reads_no_entry);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tk_check_run(srunner_create(suite()));
}
