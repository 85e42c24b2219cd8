/* The live progress line of `tierkv bench` (docs/cli.md): ops/s, p99 and errors
 * of the last second, on stderr when it is a terminal.
 *
 * Each worker thread records its latencies into its own struct bench_live
 * (relaxed atomic adds, no lock); the thread that draws the line sums the
 * workers' buckets and takes the difference from its previous sum, so the
 * p99 is that of the last interval. Buckets are log-linear (8 per power of
 * two): the live p99 is within 12.5% (the final table uses the exact
 * histograms). */
#ifndef TK_CLI_BENCH_PROGRESS_H
#define TK_CLI_BENCH_PROGRESS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define BENCH_LIVE_BUCKETS 320 /* up to 2^41 ns (36 min): far past any timeout */

struct bench_live {
    _Atomic uint64_t lat[BENCH_LIVE_BUCKETS];
};

/* The drawing thread's previous sums. Zero-initialised. */
struct bench_live_view {
    uint64_t prev[BENCH_LIVE_BUCKETS];
};

/* Notes one latency, in nanoseconds (any thread, on its own `l`). */
void bench_live_note(struct bench_live *l, uint64_t ns);

/* The bucket of `ns` and the largest latency a bucket holds (exposed for the
 * unit test). */
size_t bench_live_bucket(uint64_t ns);
uint64_t bench_live_bucket_max(size_t b);

/* The p99 (ns, the upper edge of its bucket) of what the `n` lives, `stride`
 * bytes apart, recorded since the previous call with `v`; 0 if nothing. */
uint64_t bench_live_p99(const struct bench_live *first, size_t n, size_t stride,
                        struct bench_live_view *v);

/* Formats the line (no newline; starts with "\r\033[K" to overwrite the
 * previous one): phase, elapsed/duration, ops/s, p99 (ms; "-" when 0), total
 * ops and errors. */
void bench_progress_format(char *buf, size_t cap, const char *phase, double elapsed_s,
                           double duration_s, double ops_per_s, uint64_t p99_ns,
                           uint64_t ops, uint64_t errors);

#endif
