/* Small helpers shared by the kvtier commands. */
#ifndef KVTIER_TOOLS_UTIL_H
#define KVTIER_TOOLS_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "kvtier/stats.h"

/* Monotonic nanoseconds: the library's clock. */
static inline uint64_t now_ns(void) { return kvt_now_ns(); }

static inline int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v and returns its median. */
static inline double median_of(double *v, size_t n) {
    qsort(v, n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#endif
