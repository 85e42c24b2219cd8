/* A log-linear latency histogram: fixed memory, O(1) record, mergeable.
 *
 * Values are unsigned 64-bit (nanoseconds by convention). Buckets are exact
 * below 2^TK_HIST_SUB_BITS and then have TK_HIST_SUB buckets per power of two,
 * so a reported percentile is within 1/TK_HIST_SUB (about 1.6 %) of the true
 * value. Not thread-safe: keep one per thread and merge. */
#ifndef TK_BASE_HIST_H
#define TK_BASE_HIST_H

#include <stdint.h>

#define TK_HIST_SUB_BITS 6
#define TK_HIST_SUB (1u << TK_HIST_SUB_BITS)
#define TK_HIST_BUCKETS ((64 - TK_HIST_SUB_BITS + 1) * TK_HIST_SUB)

struct tk_hist {
    uint64_t count;
    uint64_t sum;
    uint64_t min;
    uint64_t max;
    uint64_t buckets[TK_HIST_BUCKETS];
};

void tk_hist_init(struct tk_hist *h);
void tk_hist_record(struct tk_hist *h, uint64_t value);
/* dst += src. */
void tk_hist_merge(struct tk_hist *dst, const struct tk_hist *src);
/* The value at quantile q in [0, 1] (0.5 = p50, 0.999 = p99.9); 0 if empty.
 * q = 1 returns the exact max. */
uint64_t tk_hist_quantile(const struct tk_hist *h, double q);
double tk_hist_mean(const struct tk_hist *h);
/* How many samples were over `value`: those in the buckets that start above
 * it. A sample in `value`'s own bucket does not count, so this is within one
 * bucket (< 1/TK_HIST_SUB relative) of the exact count; exact below
 * 2 * TK_HIST_SUB. */
uint64_t tk_hist_count_over(const struct tk_hist *h, uint64_t value);

#endif
