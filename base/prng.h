/* A seeded pseudo-random generator (xoshiro256**, seeded by splitmix64).
 *
 * Deterministic: the same seed gives the same sequence on every machine. This
 * is the only randomness tierkv code uses (never rand()); the raft core takes a
 * seed as input so simulations replay exactly. Not thread-safe: one per owner. */
#ifndef TK_BASE_PRNG_H
#define TK_BASE_PRNG_H

#include <stdint.h>

struct tk_prng {
    uint64_t s[4];
};

void tk_prng_seed(struct tk_prng *p, uint64_t seed);
uint64_t tk_prng_next(struct tk_prng *p);
/* Uniform in [0, n), without modulo bias. n == 0 returns 0. */
uint64_t tk_prng_below(struct tk_prng *p, uint64_t n);
/* Uniform in [lo, hi] inclusive; requires lo <= hi. */
uint64_t tk_prng_range(struct tk_prng *p, uint64_t lo, uint64_t hi);
/* Uniform in [0, 1). */
double tk_prng_double(struct tk_prng *p);
/* True with probability `prob` (0 never, 1 always). */
int tk_prng_chance(struct tk_prng *p, double prob);

#endif
