/* The independent model of the extent allocator: a plain array of page
 * states, and the allocation rule of alloc.h computed by brute force over it.
 * Nothing here shares code with src/alloc. */
#ifndef KVTIER_TESTS_ALLOC_MODEL_H
#define KVTIER_TESTS_ALLOC_MODEL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier/alloc.h"
#include "kvtier/error.h"

typedef struct model {
    uint8_t *used; /* 1 = reserved */
    uint64_t n, free;
} model_t;

static inline void model_init(model_t *m, uint64_t n) {
    m->used = calloc(n, 1);
    m->n = n;
    m->free = n;
}

static inline void model_fini(model_t *m) { free(m->used); }

/* All free runs in address order; returns the count. */
static inline size_t model_runs(const model_t *m, kvt_run_t *out) {
    size_t k = 0;
    for (uint64_t p = 0; p < m->n;) {
        if (m->used[p]) {
            p++;
            continue;
        }
        uint64_t q = p;
        while (q < m->n && !m->used[q]) q++;
        out[k++] = (kvt_run_t){(uint32_t)p, (uint32_t)(q - p)};
        p = q;
    }
    return k;
}

/* The rule: the smallest free run holding n (lowest address among equals);
 * else whole runs by (length, address) descending while shorter than what is
 * left, then the same best fit for the rest. */
static inline int model_reserve(model_t *m, uint64_t n, kvt_run_t *out, size_t max_runs, size_t *nout) {
    if (n == 0 || max_runs == 0) return KVT_EINVAL;
    if (n > m->free) return KVT_ENOSPC;
    kvt_run_t *runs = malloc((m->n / 2 + 2) * sizeof(kvt_run_t));
    size_t nr = model_runs(m, runs);
    uint8_t *taken = calloc(nr + 1, 1);
    size_t k = 0;
    uint64_t rest = n;
    int rc = KVT_OK;
    for (;;) {
        /* best fit among runs not taken */
        size_t best = SIZE_MAX;
        for (size_t i = 0; i < nr; i++)
            if (!taken[i] && runs[i].len >= rest && (best == SIZE_MAX || runs[i].len < runs[best].len)) best = i;
        if (best != SIZE_MAX) {
            if (k + 1 > max_runs) rc = KVT_EFRAG;
            else out[k++] = (kvt_run_t){runs[best].start, (uint32_t)rest};
            break;
        }
        /* largest not taken; higher address among equals */
        size_t big = SIZE_MAX;
        for (size_t i = 0; i < nr; i++)
            if (!taken[i] && (big == SIZE_MAX || runs[i].len >= runs[big].len)) big = i;
        if (k + 1 > max_runs) {
            rc = KVT_EFRAG;
            break;
        }
        taken[big] = 1;
        out[k++] = runs[big];
        rest -= runs[big].len;
    }
    if (rc == KVT_OK) {
        for (size_t i = 0; i < k; i++) memset(m->used + out[i].start, 1, out[i].len);
        m->free -= n;
        *nout = k;
    }
    free(taken);
    free(runs);
    return rc;
}

static inline int model_reserve_at(model_t *m, kvt_run_t r) {
    if (r.len == 0) return KVT_EINVAL;
    if ((uint64_t)r.start + r.len > m->n) return KVT_ERANGE;
    for (uint64_t p = r.start; p < (uint64_t)r.start + r.len; p++)
        if (m->used[p]) return KVT_ERESERVED;
    memset(m->used + r.start, 1, r.len);
    m->free -= r.len;
    return KVT_OK;
}

/* Single-fault free validation: zero length, out of range, a free page, two
 * runs sharing a page. */
static inline int model_free(model_t *m, const kvt_run_t *runs, size_t k) {
    if (k == 0) return KVT_EINVAL;
    for (size_t i = 0; i < k; i++) {
        if (runs[i].len == 0) return KVT_EINVAL;
        if ((uint64_t)runs[i].start + runs[i].len > m->n) return KVT_ERANGE;
    }
    for (size_t i = 0; i < k; i++)
        for (uint64_t p = runs[i].start; p < (uint64_t)runs[i].start + runs[i].len; p++)
            if (!m->used[p]) return KVT_ENOTRESV;
    for (size_t i = 0; i < k; i++)
        for (size_t j = 0; j < i; j++)
            if (runs[i].start < runs[j].start + runs[j].len && runs[j].start < runs[i].start + runs[i].len)
                return KVT_EINVAL;
    for (size_t i = 0; i < k; i++) {
        memset(m->used + runs[i].start, 0, runs[i].len);
        m->free += runs[i].len;
    }
    return KVT_OK;
}

#endif
