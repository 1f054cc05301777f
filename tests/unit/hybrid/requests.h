/* The hybrid suites' random workload (test_hybrid.c, test_plane.c). */
#ifndef KVTIER_TESTS_UNIT_HYBRID_REQUESTS_H
#define KVTIER_TESTS_UNIT_HYBRID_REQUESTS_H

#include <stdint.h>
#include <string.h>

#include "kvtier/rng.h"

/* Requests over a few shared roots: a root's prefix cut anywhere, then a
 * tail of its own; some extend the previous request (a next turn). */
static uint64_t next_request(kvt_rng_t *r, int32_t *tok, const int32_t *prev, uint64_t nprev, uint32_t P) {
    uint64_t n = 0;
    if (nprev && kvt_rng_below(r, 3) == 0) {
        memcpy(tok, prev, nprev * sizeof(*tok));
        n = nprev;
    } else {
        uint64_t root = kvt_rng_below(r, 4), cut = kvt_rng_below(r, 12 * P);
        for (; n < cut; n++) tok[n] = (int32_t)(root * 100000 + n);
    }
    uint64_t tail = 1 + kvt_rng_below(r, 6 * P);
    for (uint64_t i = 0; i < tail; i++) tok[n++] = (int32_t)(1000000 + kvt_rng_below(r, 1 << 20));
    return n;
}

#endif
