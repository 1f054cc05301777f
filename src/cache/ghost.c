/* The ghost: hashes of pages that recently left the cache, so that a page
 * coming back can be recognised as seen before.
 *
 * A FIFO ring of 64-bit keys (the page's chained hash) with an open-addressing
 * index of ring positions for membership. Adding to a full ring forgets the
 * oldest key. Removing a key (when its page comes back) deletes its index
 * entry and leaves the ring slot stale; a stale slot is skipped when the ring
 * reaches it. 16 bytes per entry; every operation O(1) expected.
 */
#include <string.h>

#include "cache-int.h"
#include "kvtier/error.h"
#include "../core/mem-int.h"

static size_t home(const kvt__ghost_t *g, uint64_t key) {
    key ^= key >> 29;
    key *= 0xbf58476d1ce4e5b9ull;
    return (size_t)(key ^ (key >> 32)) & g->mask;
}

int kvt__ghost_init(kvt__ghost_t *g, size_t cap) {
    memset(g, 0, sizeof(*g));
    if (cap == 0) return KVT_OK;
    size_t tsize = 16;
    while (tsize < 2 * cap) tsize *= 2;
    g->cap = cap;
    g->mask = tsize - 1; /* set first: kvt__ghost_fini frees by these sizes */
    g->ring = kvt__malloc(cap * sizeof(uint64_t));
    g->index = kvt__calloc(tsize, sizeof(uint64_t));
    if (g->ring == NULL || g->index == NULL) {
        kvt__ghost_fini(g);
        return KVT_ENOMEM;
    }
    return KVT_OK;
}

void kvt__ghost_fini(kvt__ghost_t *g) {
    kvt__free(g->ring, g->cap * sizeof(uint64_t));
    kvt__free(g->index, g->cap ? (g->mask + 1) * sizeof(uint64_t) : 0);
    memset(g, 0, sizeof(*g));
}

static inline uint64_t tag_of(uint64_t key) { return key & 0xffffffff00000000ull; }
static inline size_t pos_of(uint64_t entry) { return (size_t)(entry & 0xffffffffu) - 1; }

/* The index slot of key, or the empty slot where its probe ends. */
static size_t find(const kvt__ghost_t *g, uint64_t key) {
    size_t i = home(g, key);
    uint64_t tag = tag_of(key);
    while (g->index[i] && !(tag_of(g->index[i]) == tag && g->ring[pos_of(g->index[i])] == key)) i = (i + 1) & g->mask;
    return i;
}

static void unindex(kvt__ghost_t *g, size_t i) {
    g->index[i] = 0;
    for (size_t j = (i + 1) & g->mask; g->index[j]; j = (j + 1) & g->mask) {
        size_t h = home(g, g->ring[pos_of(g->index[j])]);
        if (((j - h) & g->mask) >= ((j - i) & g->mask)) {
            g->index[i] = g->index[j];
            g->index[j] = 0;
            i = j;
        }
    }
    g->live--;
}

bool kvt__ghost_take(kvt__ghost_t *g, uint64_t key) {
    if (g->cap == 0) return false;
    size_t i = find(g, key);
    if (g->index[i] == 0) return false;
    unindex(g, i);
    return true;
}

void kvt__ghost_add(kvt__ghost_t *g, uint64_t key) {
    if (g->cap == 0) return;
    if (g->n == g->cap) { /* forget the oldest, if it is still indexed at its slot */
        size_t i = find(g, g->ring[g->head]);
        if (g->index[i] && pos_of(g->index[i]) == g->head) unindex(g, i);
        g->head = (g->head + 1) % g->cap;
        g->n--;
    }
    size_t pos = (g->head + g->n) % g->cap, i = find(g, key);
    if (g->index[i] == 0) g->live++; /* else a newer copy replaces the older one */
    g->ring[pos] = key;
    g->index[i] = tag_of(key) | (uint64_t)(pos + 1);
    g->n++;
}

bool kvt__ghost_has(const kvt__ghost_t *g, uint64_t key) { return g->cap && g->index[find(g, key)] != 0; }
