/* 64-bit mixing: splitmix64's output function (Steele, Lea and Flood; the
 * same as kvtier/rng.h's generator, which the library's lower layers do not
 * include). Bijective; every output bit depends on every input bit. */
#ifndef KVTIER_MIX_INT_H
#define KVTIER_MIX_INT_H

#include <stdint.h>

/* The finaliser alone. */
static inline uint64_t kvt__mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* One splitmix64 step from state z: the golden-ratio increment, then the finaliser. */
static inline uint64_t kvt__splitmix64(uint64_t z) { return kvt__mix64(z + 0x9e3779b97f4a7c15ull); }

#endif
