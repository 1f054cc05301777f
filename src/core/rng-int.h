/* A small deterministic PRNG (xoshiro256**, seeded by splitmix64) for
 * workloads, benchmarks and tests: the same seed gives the same stream on every
 * machine. Not for anything that needs unpredictability. */
#ifndef KVTIER_RNG_INT_H
#define KVTIER_RNG_INT_H

#include <stdint.h>

typedef struct kvt__rng {
    uint64_t s[4];
} kvt__rng_t;

static inline uint64_t kvt__splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline void kvt__rng_seed(kvt__rng_t *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = kvt__splitmix64(&seed);
}

static inline uint64_t kvt__rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t kvt__rng_next(kvt__rng_t *r) {
    uint64_t *s = r->s, out = kvt__rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = kvt__rotl(s[3], 45);
    return out;
}

/* Uniform in [0, n), n > 0 (Lemire's multiply-shift; the bias is below 2^-32
 * for the n used here). */
static inline uint64_t kvt__rng_below(kvt__rng_t *r, uint64_t n) {
    return (uint64_t)(((unsigned __int128)kvt__rng_next(r) * n) >> 64);
}

/* Uniform in [0, 1). */
static inline double kvt__rng_unit(kvt__rng_t *r) { return (double)(kvt__rng_next(r) >> 11) * 0x1.0p-53; }

#endif
