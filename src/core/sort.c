/* Radix sort of page ids (see sort-int.h). */
#include "sort-int.h"

#include <string.h>

#define KVT__SORT_DEFINE(NAME, T)                                                           \
    void NAME(T *keys, T *tmp, size_t n, unsigned bits) {                                   \
        size_t i = 1;                                                                       \
        while (i < n && keys[i - 1] <= keys[i]) i++;                                        \
        if (i >= n) return;                                                                 \
        if (n <= 32) {                                                                      \
            for (; i < n; i++) {                                                            \
                T k = keys[i];                                                              \
                size_t j = i;                                                               \
                for (; j > 0 && keys[j - 1] > k; j--) keys[j] = keys[j - 1];                \
                keys[j] = k;                                                                \
            }                                                                               \
            return;                                                                         \
        }                                                                                   \
        enum { DIGIT = 11, BUCKETS = 1u << DIGIT };                                         \
        size_t count[BUCKETS];                                                              \
        T *src = keys, *dst = tmp;                                                          \
        for (unsigned shift = 0; shift < bits; shift += DIGIT) {                            \
            memset(count, 0, sizeof(count));                                                \
            for (i = 0; i < n; i++) count[(src[i] >> shift) & (BUCKETS - 1)]++;             \
            size_t sum = 0;                                                                 \
            for (unsigned b = 0; b < BUCKETS; b++) {                                        \
                size_t c = count[b];                                                        \
                count[b] = sum;                                                             \
                sum += c;                                                                   \
            }                                                                               \
            for (i = 0; i < n; i++) dst[count[(src[i] >> shift) & (BUCKETS - 1)]++] = src[i]; \
            T *t = src;                                                                     \
            src = dst;                                                                      \
            dst = t;                                                                        \
        }                                                                                   \
        if (src != keys) memcpy(keys, src, n * sizeof(T));                                  \
    }

KVT__SORT_DEFINE(kvt__sort_u64, uint64_t)
KVT__SORT_DEFINE(kvt__sort_u32, uint32_t)
