/* The decision digest's fold (copies.c, cache-int.h): one term per value,
 * a multiply-xorshift of the value and its place in the sequence, and the
 * digest their sum. No term waits on another, so a run of them is a sum of
 * independent products: fold.c adds those of an array of page ids eight at a
 * time where the CPU has AVX-512, each term the same 64 bits as here. */
#ifndef KVTIER_FOLD_INT_H
#define KVTIER_FOLD_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvtier/radix.h"

#define KVT__FOLD_PLACE 0x9e3779b97f4a7c15ull /* the place's multiplier (odd: places map one to one) */
#define KVT__FOLD_MUL 0xbf58476d1ce4e5b9ull   /* splitmix64's first multiplier */

/* The term of value v at place i. */
static inline uint64_t kvt__fold_term(uint64_t v, uint64_t i) {
    uint64_t x = (v ^ i * KVT__FOLD_PLACE) * KVT__FOLD_MUL;
    return x ^ x >> 31;
}

/* The ways to sum an array's terms: one term at a time, or eight (AVX-512F
 * and DQ: vpmullq). The widest this CPU has is picked once, before main. */
typedef enum { KVT__FOLD_SCALAR, KVT__FOLD_AVX512 } kvt__fold_way_t;

/* The sum of the terms of tag | ids[j] at place n + j, j < k (mod 2^64). */
uint64_t kvt__fold_ids_sum(uint64_t tag, const uint32_t *ids, size_t k, uint64_t n);
/* The same, the way asked for (tests): false, *sum untouched, when this CPU lacks it. */
bool kvt__fold_ids_sum_way(kvt__fold_way_t way, uint64_t tag, const uint32_t *ids, size_t k, uint64_t n, uint64_t *sum);

/* A run of backups, the last page first (copies.c): the sum of the terms of
 * tag ^ pages[p].l1 << 20 ^ l2[p] at place n + k - 1 - p, p < k (mod 2^64). */
uint64_t kvt__fold_backups_sum(uint64_t tag, const kvt_page_t *pages, const uint32_t *l2, size_t k, uint64_t n);
bool kvt__fold_backups_sum_way(kvt__fold_way_t way, uint64_t tag, const kvt_page_t *pages, const uint32_t *l2, size_t k,
                               uint64_t n, uint64_t *sum);

#endif
