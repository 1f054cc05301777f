/* kvtier — a small deterministic PRNG (xoshiro256**, seeded by splitmix64)
 * for workloads, benchmarks and tests: the same seed gives the same stream
 * on every machine, so a workload named by its seed is reproducible
 * anywhere (the command's synthetic workload, the tests' randomised runs).
 * Not for anything that needs unpredictability. Header-only.
 *
 * Threads: a generator has no lock; one per thread. */
#ifndef KVTIER_RNG_H
#define KVTIER_RNG_H

#include <stdint.h>

typedef struct kvt__rng {
    uint64_t s[4];
} kvt_rng_t;

static inline uint64_t kvt_splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline void kvt_rng_seed(kvt_rng_t *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = kvt_splitmix64(&seed);
}

static inline uint64_t kvt_rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t kvt_rng_next(kvt_rng_t *r) {
    uint64_t *s = r->s, out = kvt_rotl64(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = kvt_rotl64(s[3], 45);
    return out;
}

/* Uniform in [0, n), n > 0 (Lemire's multiply-shift; the bias is below 2^-32
 * for the n used here). */
static inline uint64_t kvt_rng_below(kvt_rng_t *r, uint64_t n) {
    return (uint64_t)(((unsigned __int128)kvt_rng_next(r) * n) >> 64);
}

/* Uniform in [0, 1). */
static inline double kvt_rng_unit(kvt_rng_t *r) { return (double)(kvt_rng_next(r) >> 11) * 0x1.0p-53; }

#endif
