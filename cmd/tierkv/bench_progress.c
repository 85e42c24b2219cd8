/* The live progress line of `tierkv bench`: see bench_progress.h. */
#include "cmd/tierkv/bench_progress.h"

#include <inttypes.h>
#include <stdio.h>

#define SUB_BITS 3 /* 8 buckets per power of two */
#define SUB (1u << SUB_BITS)

size_t bench_live_bucket(uint64_t ns)
{
    if (ns < SUB)
        return (size_t)ns;
    unsigned msb = 63u - (unsigned)__builtin_clzll(ns);
    size_t b =
        (size_t)(msb - SUB_BITS + 1) * SUB + ((ns >> (msb - SUB_BITS)) & (SUB - 1));
    return b < BENCH_LIVE_BUCKETS ? b : BENCH_LIVE_BUCKETS - 1;
}

uint64_t bench_live_bucket_max(size_t b)
{
    if (b < SUB)
        return b;
    unsigned msb = (unsigned)(b / SUB) + SUB_BITS - 1;
    uint64_t lo = (1ull << msb) | ((uint64_t)(b % SUB) << (msb - SUB_BITS));
    return lo + (1ull << (msb - SUB_BITS)) - 1;
}

void bench_live_note(struct bench_live *l, uint64_t ns)
{
    atomic_fetch_add_explicit(&l->lat[bench_live_bucket(ns)], 1, memory_order_relaxed);
}

uint64_t bench_live_p99(const struct bench_live *first, size_t n, size_t stride,
                        struct bench_live_view *v)
{
    uint64_t cur[BENCH_LIVE_BUCKETS] = {0}, total = 0;
    for (size_t i = 0; i < n; i++) {
        const struct bench_live *l =
            (const struct bench_live *)((const char *)first + i * stride);
        for (size_t b = 0; b < BENCH_LIVE_BUCKETS; b++)
            cur[b] += atomic_load_explicit(&l->lat[b], memory_order_relaxed);
    }
    for (size_t b = 0; b < BENCH_LIVE_BUCKETS; b++) {
        uint64_t d = cur[b] - v->prev[b];
        v->prev[b] = cur[b];
        cur[b] = d;
        total += d;
    }
    if (total == 0)
        return 0;
    uint64_t want = total - total / 100, seen = 0; /* the 99th percentile's rank */
    for (size_t b = 0; b < BENCH_LIVE_BUCKETS; b++) {
        seen += cur[b];
        if (seen >= want)
            return bench_live_bucket_max(b);
    }
    return bench_live_bucket_max(BENCH_LIVE_BUCKETS - 1);
}

void bench_progress_format(char *buf, size_t cap, const char *phase, double elapsed_s,
                           double duration_s, double ops_per_s, uint64_t p99_ns,
                           uint64_t ops, uint64_t errors)
{
    char p99[32] = "-";
    if (p99_ns > 0)
        snprintf(p99, sizeof(p99), "%.3f", (double)p99_ns / 1e6);
    snprintf(buf, cap,
             "\r\033[K[%s %5.1fs/%.0fs] %10.0f ops/s  p99 %8s ms  %10" PRIu64
             " ops  %" PRIu64 " errors",
             phase, elapsed_s, duration_s, ops_per_s, p99, ops, errors);
}
