/* Sorting page ids: the frees of a request's or an eviction round's pages,
 * which arrive nearly in order. Internal. */
#ifndef KVTIER_CORE_SORT_INT_H
#define KVTIER_CORE_SORT_INT_H

#include <stddef.h>
#include <stdint.h>

/* Sorts n keys below 2^bits in place (tmp: room for n more keys): a scan
 * returns at once when they are sorted already, insertion sort for n <= 32,
 * else a least-significant-digit radix sort of 11 bits a pass (two passes
 * below 4 M). No comparisons through function pointers, no allocation. */
void kvt__sort_u64(uint64_t *keys, uint64_t *tmp, size_t n, unsigned bits);
void kvt__sort_u32(uint32_t *keys, uint32_t *tmp, size_t n, unsigned bits);

/* Bits needed for values up to x (0 for 0). */
static inline unsigned kvt__bits_of(uint64_t x) { return x ? 64u - (unsigned)__builtin_clzll(x) : 0; }

#endif
