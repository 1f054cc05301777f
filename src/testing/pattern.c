/* The page content model (kvtier/testing.h): a page's bytes are a function
 * of its page hash and layer, so any reader can check a page it never
 * wrote. Public tier calls only: the command compiles this file too. */
#include "kvtier/error.h"
#include "kvtier/testing.h"

#include <string.h>

/* splitmix64 (Steele, Lea and Flood), spelled out here: the content model
 * is a format the tests and the command agree on, not the library's mixer. */
static uint64_t splitmix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t pattern_seed(uint64_t lo, uint64_t hi, uint32_t layer) {
    return lo ^ ((hi << 17) | (hi >> 47)) ^ ((uint64_t)layer << 48);
}

void kvt_pattern_fill(void *buf, size_t len, uint64_t hash_lo, uint64_t hash_hi, uint32_t layer) {
    uint64_t seed = pattern_seed(hash_lo, hash_hi, layer);
    uint8_t *p = buf;
    size_t words = len / 8;
    for (size_t i = 0; i < words; i++) {
        uint64_t w = splitmix64(seed ^ i);
        memcpy(p + 8 * i, &w, 8);
    }
    if (len % 8) {
        uint64_t w = splitmix64(seed ^ words);
        memcpy(p + 8 * words, &w, len % 8);
    }
}

bool kvt_pattern_check(const void *buf, size_t len, uint64_t hash_lo, uint64_t hash_hi, uint32_t layer) {
    uint64_t seed = pattern_seed(hash_lo, hash_hi, layer);
    const uint8_t *p = buf;
    size_t words = len / 8;
    for (size_t i = 0; i < words; i++) {
        uint64_t w;
        memcpy(&w, p + 8 * i, 8);
        if (w != splitmix64(seed ^ i)) return false;
    }
    if (len % 8) {
        uint64_t w = splitmix64(seed ^ words);
        return memcmp(&w, p + 8 * words, len % 8) == 0;
    }
    return true;
}

int kvt_tier_pattern_fill(kvt_tier_t *t, uint64_t page, uint64_t hash_lo, uint64_t hash_hi, void *scratch) {
    const kvt_geom_t *g = t ? kvt_tier_geom(t) : NULL;
    if (g == NULL) return KVT_EINVAL;
    int rc = KVT_OK;
    for (uint32_t l = 0; l < g->layers && rc == KVT_OK; l++) {
        kvt_pattern_fill(scratch, g->layer_bytes, hash_lo, hash_hi, l);
        rc = kvt_tier_write(t, page, l, scratch);
    }
    return rc;
}

bool kvt_tier_pattern_check(const kvt_tier_t *t, uint64_t page, uint64_t hash_lo, uint64_t hash_hi, void *scratch) {
    const kvt_geom_t *g = t ? kvt_tier_geom(t) : NULL;
    if (g == NULL) return false;
    for (uint32_t l = 0; l < g->layers; l++)
        if (kvt_tier_read(t, page, l, scratch) != KVT_OK ||
            !kvt_pattern_check(scratch, g->layer_bytes, hash_lo, hash_hi, l))
            return false;
    return true;
}
