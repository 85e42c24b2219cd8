/* xoshiro256** 1.0 (Blackman and Vigna, 2018), seeded by splitmix64.
 *
 * The four state words are the first four splitmix64 outputs from the seed,
 * as the authors recommend; splitmix64 never yields an all-zero state from
 * four consecutive outputs. Bounded draws use rejection sampling (as OpenBSD's
 * arc4random_uniform does) so there is no modulo bias, and doubles take the
 * top 53 bits. Pure integer arithmetic: identical on every machine. */
#include "base/prng.h"

#include "base/assert.h"

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

void tk_prng_seed(struct tk_prng *p, uint64_t seed)
{
    uint64_t sm = seed;
    for (int i = 0; i < 4; i++)
        p->s[i] = splitmix64(&sm);
}

uint64_t tk_prng_next(struct tk_prng *p)
{
    uint64_t *s = p->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint64_t tk_prng_below(struct tk_prng *p, uint64_t n)
{
    if (n == 0)
        return 0;
    /* 2^64 mod n: draws below it would make the low residues likelier.
     * Fewer than half of all draws are rejected, whatever n is. */
    uint64_t threshold = (0 - n) % n;
    for (;;) {
        uint64_t r = tk_prng_next(p);
        if (r >= threshold)
            return r % n;
    }
}

uint64_t tk_prng_range(struct tk_prng *p, uint64_t lo, uint64_t hi)
{
    TK_ASSERT(lo <= hi);
    uint64_t span = hi - lo;
    if (span == UINT64_MAX)
        return tk_prng_next(p);
    return lo + tk_prng_below(p, span + 1);
}

double tk_prng_double(struct tk_prng *p)
{
    return (double)(tk_prng_next(p) >> 11) * 0x1.0p-53;
}

int tk_prng_chance(struct tk_prng *p, double prob)
{
    if (!(prob > 0.0)) /* also NaN */
        return 0;
    if (prob >= 1.0)
        return 1;
    return tk_prng_double(p) < prob;
}
