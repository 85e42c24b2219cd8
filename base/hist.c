/* Log-linear histogram.
 *
 * Bucket index of v: values below 2^(SUB_BITS+1) map to themselves (exact).
 * Above, with m the position of the highest set bit, the power-of-two range
 * [2^m, 2^(m+1)) is split into TK_HIST_SUB equal buckets of width
 * 2^(m-SUB_BITS): index = (m - SUB_BITS + 1) * SUB + the SUB_BITS bits below
 * the top bit. UINT64_MAX lands in the last bucket, TK_HIST_BUCKETS - 1. A
 * quantile reports the middle of its bucket, clamped to [min, max], so it is
 * within half a bucket width (< 1/TK_HIST_SUB relative) of the true sample. */
#include "base/hist.h"

#include <string.h>

#include "base/assert.h"

static unsigned bucket_of(uint64_t v)
{
    if (v < (2 * (uint64_t)TK_HIST_SUB))
        return (unsigned)v;
    unsigned msb = 63u - (unsigned)__builtin_clzll(v);
    unsigned shift = msb - TK_HIST_SUB_BITS;
    unsigned sub = (unsigned)(v >> shift) & (TK_HIST_SUB - 1);
    return (shift + 1) * TK_HIST_SUB + sub;
}

/* The smallest value in bucket `b`, and the bucket's width. */
static void bucket_bounds(unsigned b, uint64_t *lo, uint64_t *width)
{
    if (b < 2 * TK_HIST_SUB) {
        *lo = b;
        *width = 1;
        return;
    }
    unsigned shift = b / TK_HIST_SUB - 1;
    uint64_t sub = b % TK_HIST_SUB;
    *lo = (TK_HIST_SUB + sub) << shift;
    *width = (uint64_t)1 << shift;
}

void tk_hist_init(struct tk_hist *h)
{
    memset(h, 0, sizeof(*h));
    h->min = UINT64_MAX;
}

void tk_hist_record(struct tk_hist *h, uint64_t value)
{
    unsigned b = bucket_of(value);
    TK_ASSERT(b < TK_HIST_BUCKETS);
    h->buckets[b]++;
    h->count++;
    h->sum += value;
    if (value < h->min)
        h->min = value;
    if (value > h->max)
        h->max = value;
}

void tk_hist_merge(struct tk_hist *dst, const struct tk_hist *src)
{
    if (src->count == 0)
        return;
    for (unsigned i = 0; i < TK_HIST_BUCKETS; i++)
        dst->buckets[i] += src->buckets[i];
    dst->count += src->count;
    dst->sum += src->sum;
    if (src->min < dst->min)
        dst->min = src->min;
    if (src->max > dst->max)
        dst->max = src->max;
}

uint64_t tk_hist_quantile(const struct tk_hist *h, double q)
{
    if (h->count == 0)
        return 0;
    if (!(q > 0.0)) /* also NaN */
        return h->min;
    if (q >= 1.0)
        return h->max;
    /* The rank-th smallest sample, rank = ceil(q * count), 1-based. */
    double r = q * (double)h->count;
    uint64_t rank = (uint64_t)r;
    if ((double)rank < r)
        rank++;
    if (rank == 0)
        rank = 1;
    if (rank > h->count)
        rank = h->count;
    uint64_t seen = 0;
    for (unsigned b = 0; b < TK_HIST_BUCKETS; b++) {
        seen += h->buckets[b];
        if (seen >= rank) {
            uint64_t lo, width;
            bucket_bounds(b, &lo, &width);
            uint64_t v = lo + width / 2;
            if (v < h->min)
                v = h->min;
            if (v > h->max)
                v = h->max;
            return v;
        }
    }
    TK_UNREACHABLE();
}

double tk_hist_mean(const struct tk_hist *h)
{
    if (h->count == 0)
        return 0.0;
    return (double)h->sum / (double)h->count;
}

uint64_t tk_hist_count_over(const struct tk_hist *h, uint64_t value)
{
    uint64_t n = 0;
    for (unsigned b = bucket_of(value) + 1; b < TK_HIST_BUCKETS; b++)
        n += h->buckets[b];
    return n;
}
