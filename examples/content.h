/* Page content for the examples: bytes derived from a page hash and a
 * layer, standing in for the KV a forward pass writes, so that a page read
 * back (from another tier, another thread, another process) can be checked.
 * Written and read through the public tier calls, layer by layer; scratch
 * holds one layer of a page. */
#ifndef KVTIER_EXAMPLES_CONTENT_H
#define KVTIER_EXAMPLES_CONTENT_H

#include <stdbool.h>
#include <stdint.h>

#include <kvtier/kvtier.h>

static void content_of(unsigned char *buf, uint64_t n, uint64_t lo, uint64_t hi, uint32_t layer) {
    uint64_t x = lo ^ (hi * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)layer << 56);
    for (uint64_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull; /* an LCG: any fixed function will do */
        buf[i] = (unsigned char)(x >> 56);
    }
}

/* Writes page's content into tier t: KVT_OK or kvt_tier_write's error. */
static int content_fill(kvt_tier_t *t, uint64_t page, uint64_t lo, uint64_t hi, unsigned char *scratch) {
    const kvt_geom_t *g = kvt_tier_geom(t);
    int rc = KVT_OK;
    for (uint32_t l = 0; l < g->layers && rc == KVT_OK; l++) {
        content_of(scratch, g->layer_bytes, lo, hi, l);
        rc = kvt_tier_write(t, page, l, scratch);
    }
    return rc;
}

/* True when page of tier t holds the content of (lo, hi). */
static bool content_check(const kvt_tier_t *t, uint64_t page, uint64_t lo, uint64_t hi, unsigned char *scratch) {
    const kvt_geom_t *g = kvt_tier_geom(t);
    for (uint32_t l = 0; l < g->layers; l++) {
        if (kvt_tier_read(t, page, l, scratch) != KVT_OK) return false;
        uint64_t x = lo ^ (hi * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)l << 56);
        for (uint64_t i = 0; i < g->layer_bytes; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            if (scratch[i] != (unsigned char)(x >> 56)) return false;
        }
    }
    return true;
}

#endif
