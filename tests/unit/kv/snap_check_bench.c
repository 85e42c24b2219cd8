/* snap_check_bench: what kv_snap_check costs the node's loop (issue 49 item 5).
 *
 * node__install_check (node/node_install.c) runs kv_snap_check over a whole
 * InstallSnapshot stream on the loop thread before the core sees it. For each
 * N this builds a state machine of N keys ("key%010d", 100-byte values,
 * applied as puts, tiered down to LMDB as the sm does), reads its stream into
 * one blob as the node's snapshot job does (kv_sm_snapshot, kv_snap_read_all),
 * then times, RUNS times each and interleaved:
 *   check      kv_snap_check over the blob (must return 0 and the header's
 *              index);
 *   crc/rec    tk_crc32c called once per record, hopping by the records'
 *              lengths: the walk's CRC as it calls it, without its checks;
 *   crc whole  one tk_crc32c over every byte before the trailer's CRC (the
 *              floor: the bytes must be read once whatever is checked).
 * Each is timed in the thread's CPU time (the machine is shared: another
 * process's turn on the core is not the check's cost) and in wall time (what
 * the loop is held for); the median and the spread (min-max) are printed.
 *
 * The benchmark is no test: run it by hand, on a quiet machine. Usage:
 * kv_snap_check_bench [N ...] (default 100000 1000000). Memory: about 2.2x
 * the stream (the blob and the LMDB file's pages in the page cache); the
 * stream is about 154 bytes a key.
 *
 * kv_snap_check_bench --check (test kv-snap-check-spans, suite 'unit') is a
 * test instead: kv_snap_check folds the records into its CRC in spans of
 * 64 KiB, which kv-snapshot-bad's stream (a few KiB) never fills, so over a
 * stream of several spans the good stream must pass, and a flipped value
 * byte (a change only the CRC can see) in the first span, across the
 * spans and in the last record must each be refused as a checksum
 * mismatch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/blob.h"
#include "base/crc32c.h"
#include "base/endian.h"
#include "base/err.h"
#include "kv/kv.h"
#include "tests/unit/kv/kv_util.h"

#define RUNS 5
#define VALUE_BYTES 100
#define HDR 32
#define REC_HDR 9
#define TRAILER 13

enum { T_CHECK, T_CRC_REC, T_CRC_WHOLE, N_TIMED };
static const char *timed_names[N_TIMED] = {"check", "crc/rec", "crc whole"};

struct sample {
    double cpu_ms, wall_ms;
};

static double clock_ms(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median, min and max of n values (sorted in place). */
static void spread(double *v, int n, double *med, double *lo, double *hi)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    *med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    *lo = v[0];
    *hi = v[n - 1];
}

/* The CRC as the walk takes it: one call per record. */
static uint32_t crc_per_record(const uint8_t *p, size_t len)
{
    uint32_t crc = tk_crc32c(0, p, HDR);
    size_t off = HDR;
    while (off < len && p[off] != 0xFF) {
        size_t n = REC_HDR + (size_t)tk_get_be32(p + off + 1) + tk_get_be32(p + off + 5);
        crc = tk_crc32c(crc, p + off, n);
        off += n;
    }
    return tk_crc32c(crc, p + off, 9);
}

/* Applies n puts of "key%010d" with 100-byte values. */
static void fill(struct kvu *u, long n)
{
    char key[32], value[VALUE_BYTES + 1];
    memset(value, 'v', VALUE_BYTES);
    value[VALUE_BYTES] = '\0';
    for (long i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "key%010ld", i);
        memcpy(value, key, 13); /* values differ, as real ones do */
        int rc = kvu_put(u, key, value);
        if (rc != 0) {
            fprintf(stderr, "put %ld: %s\n", i, tk_strerror(rc));
            exit(1);
        }
    }
}

/* The --check test over n keys' stream in b: 0 or 1. */
static int check_spans(struct kvu *u, struct tk_blob *b, uint64_t want_index)
{
    uint64_t index = 0, term = 0;
    char why[128];
    int rc = kv_snap_check(u->sm, b->data, b->len, &index, &term, why, sizeof(why));
    if (rc != 0 || index != want_index) {
        fprintf(stderr, "FAIL: the good stream of %zu bytes: %s\n", b->len,
                rc != 0 ? why : "another index");
        return 1;
    }
    /* The last value byte of every 97th record and of the last one. */
    size_t off = HDR, last = 0, flips = 0;
    for (uint64_t i = 0; off < b->len && b->data[off] != 0xFF; i++) {
        size_t end = off + REC_HDR + tk_get_be32(b->data + off + 1) +
                     tk_get_be32(b->data + off + 5);
        last = end - 1;
        off = end;
        if (i % 97 != 0 && b->data[off] != 0xFF)
            continue;
        b->data[last] ^= 0x10;
        rc = kv_snap_check(u->sm, b->data, b->len, &index, &term, why, sizeof(why));
        b->data[last] ^= 0x10;
        if (rc != TK_ECORRUPT || strcmp(why, "checksum mismatch") != 0) {
            fprintf(stderr, "FAIL: byte %zu of %zu flipped: rc %d (%s)\n", last, b->len,
                    rc, rc != 0 ? why : "accepted");
            return 1;
        }
        flips++;
    }
    if (b->len < 4 * ((size_t)64 << 10) || flips < 8) {
        fprintf(stderr, "FAIL: a stream of %zu bytes, %zu flips: too few spans\n", b->len,
                flips);
        return 1;
    }
    printf("ok: a stream of %zu bytes passes, %zu flipped bytes refused\n", b->len,
           flips);
    return 0;
}

/* Builds n keys and their stream; with `check`, runs the --check test, else
 * the benchmark. Returns 0 or 1 (a failed --check). */
static int bench(long n, bool check)
{
    struct kvu u;
    memset(&u, 0, sizeof(u));
    kvu_defaults(&u);
    u.cfg.map_bytes = (size_t)64 << 30; /* sparse */
    struct kv_config cfg = u.cfg;
    kvu_open(&u, &cfg);

    double t0 = clock_ms(CLOCK_MONOTONIC);
    fill(&u, n);
    double t1 = clock_ms(CLOCK_MONOTONIC);
    struct kv_snap *s;
    struct tk_blob *b;
    if (kv_sm_snapshot(u.sm, &s) != 0 || kv_snap_read_all(s, &b, NULL, NULL) != 0) {
        fprintf(stderr, "snapshot of %ld keys failed\n", n);
        exit(1);
    }
    uint64_t want_index = kv_snap_index(s);
    kv_snap_close(s);
    if (check) {
        int failed = check_spans(&u, b, want_index);
        tk_blob_unref(b);
        kvu_close(&u, true);
        return failed;
    }
    double t2 = clock_ms(CLOCK_MONOTONIC);
    uint64_t records = tk_get_be64(b->data + b->len - TRAILER + 1);
    uint32_t want_crc = tk_get_be32(b->data + b->len - 4);
    printf("N=%ld: built in %.1f s, stream of %zu bytes (%llu records, %.1f B each) "
           "read in %.1f s\n",
           n, (t1 - t0) / 1e3, b->len, (unsigned long long)records,
           (double)b->len / (double)records, (t2 - t1) / 1e3);

    struct sample smp[N_TIMED][RUNS];
    for (int r = 0; r < RUNS; r++) {
        for (int t = 0; t < N_TIMED; t++) {
            double c0 = clock_ms(CLOCK_THREAD_CPUTIME_ID), w0 = clock_ms(CLOCK_MONOTONIC);
            uint64_t index = 0, term = 0;
            char why[128];
            int rc = 0;
            uint32_t crc = want_crc;
            if (t == T_CHECK)
                rc =
                    kv_snap_check(u.sm, b->data, b->len, &index, &term, why, sizeof(why));
            else if (t == T_CRC_REC)
                crc = crc_per_record(b->data, b->len);
            else
                crc = tk_crc32c(0, b->data, b->len - 4);
            double w1 = clock_ms(CLOCK_MONOTONIC), c1 = clock_ms(CLOCK_THREAD_CPUTIME_ID);
            if (rc != 0 || (t == T_CHECK && index != want_index) || crc != want_crc) {
                fprintf(stderr, "%s failed: %s (rc %d, crc %08x, want %08x)\n",
                        timed_names[t], rc != 0 ? why : "wrong result", rc, crc,
                        want_crc);
                exit(1);
            }
            smp[t][r].cpu_ms = c1 - c0;
            smp[t][r].wall_ms = w1 - w0;
        }
    }
    printf("  %-10s %24s %24s %10s %10s\n", "", "cpu ms median (min-max)",
           "wall ms median (min-max)", "ns/record", "MB/s");
    for (int t = 0; t < N_TIMED; t++) {
        double cpu[RUNS], wall[RUNS], cm, cl, ch, wm, wl, wh;
        for (int r = 0; r < RUNS; r++) {
            cpu[r] = smp[t][r].cpu_ms;
            wall[r] = smp[t][r].wall_ms;
        }
        spread(cpu, RUNS, &cm, &cl, &ch);
        spread(wall, RUNS, &wm, &wl, &wh);
        char c[32], w[32];
        snprintf(c, sizeof(c), "%.1f (%.1f-%.1f)", cm, cl, ch);
        snprintf(w, sizeof(w), "%.1f (%.1f-%.1f)", wm, wl, wh);
        printf("  %-10s %24s %24s %10.1f %10.0f\n", timed_names[t], c, w,
               cm * 1e6 / (double)records, (double)b->len / 1e6 / (cm / 1e3));
    }
    fflush(stdout);
    tk_blob_unref(b);
    kvu_close(&u, true);
    return 0;
}

int main(int argc, char **argv)
{
    static const long defaults[] = {100000, 1000000};
    if (argc == 2 && strcmp(argv[1], "--check") == 0)
        return bench(3000, true); /* a stream of about 460 KB: 7 spans */
    if (argc < 2) {
        for (size_t i = 0; i < sizeof(defaults) / sizeof(defaults[0]); i++)
            bench(defaults[i], false);
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        char *end;
        long n = strtol(argv[i], &end, 10);
        if (*end != '\0' || n < 1) {
            fprintf(stderr, "usage: %s [N ...] (keys, each > 0)\n", argv[0]);
            return 2;
        }
        bench(n, false);
    }
    return 0;
}
