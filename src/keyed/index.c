/* The keyed cache's two indexes over its dense entry array (keyed.c's essay
 * draws them): a hash table from key to entry, and the eviction heap.
 *
 * Table: open addressing with linear probing over a power-of-two array of
 * uint32 slots (entry index + 1; 0 is empty), at most half full, so a probe
 * sequence is short. A key sits in the first free slot at or after its home;
 * deletion shifts the later members of its cluster back (no tombstones), so
 * the invariant is plain: from a key's home to its slot no slot is empty.
 *
 * Heaps: a binary min-heap of entry indexes by (score, hi, lo) per class
 * (one unless kvt__keyed_set_classes), each entry holding its position in
 * its class's (entry.heap), so that a pinned or re-scored entry is erased or
 * moved in O(log E) without a search.
 */
#include <string.h>

#include "kvtier/error.h"
#include "../core/check-int.h"
#include "../core/mem-int.h"
#include "../core/mix-int.h"
#include "keyed-int.h"

size_t kvt__keyed_home(const kvt_keyed_t *c, kvt_key128_t key) {
    return (size_t)kvt__mix64(key.lo ^ kvt__splitmix64(key.hi)) & (c->tcap - 1);
}

size_t kvt__keyed_slot(const kvt_keyed_t *c, kvt_key128_t key) {
    if (c->tcap == 0) return SIZE_MAX;
    size_t mask = c->tcap - 1;
    for (size_t s = kvt__keyed_home(c, key);; s = (s + 1) & mask) {
        uint32_t v = c->slots[s];
        if (v == 0) return SIZE_MAX;
        if (kvt__key_eq(c->ents[v - 1].key, key)) return s;
    }
}

uint32_t kvt__keyed_find(const kvt_keyed_t *c, kvt_key128_t key) {
    size_t s = kvt__keyed_slot(c, key);
    return s == SIZE_MAX ? UINT32_MAX : c->slots[s] - 1;
}

static void table_put(kvt_keyed_t *c, uint32_t i) {
    size_t mask = c->tcap - 1, s = kvt__keyed_home(c, c->ents[i].key);
    while (c->slots[s] != 0) s = (s + 1) & mask;
    c->slots[s] = i + 1;
}

/* A table of tcap slots holding every entry; the old one is freed. */
static int table_rebuild(kvt_keyed_t *c, size_t tcap) {
    uint32_t *slots = kvt__calloc(tcap, sizeof(uint32_t));
    if (slots == NULL) return KVT_ENOMEM;
    kvt__free(c->slots, c->tcap * sizeof(uint32_t));
    c->slots = slots;
    c->tcap = tcap;
    for (size_t i = 0; i < c->nents; i++) table_put(c, (uint32_t)i);
    return KVT_OK;
}

int kvt__keyed_reserve_keys(kvt_keyed_t *c, size_t keys) {
    if (keys >= UINT32_MAX) return KVT_ENOMEM; /* entry indexes are uint32, UINT32_MAX is "none" */
    if (kvt__grow((void **)&c->ents, &c->ecap, keys, sizeof(kvt__kentry_t)) != KVT_OK) return KVT_ENOMEM;
    for (unsigned k = 0; k < (c->class_bit ? 2u : 1u); k++) /* either heap may hold every entry */
        if (c->hcap[k] < c->ecap) {
            uint32_t *h = kvt__realloc(c->heap[k], c->hcap[k] * sizeof(uint32_t), c->ecap * sizeof(uint32_t));
            if (h == NULL) return KVT_ENOMEM; /* (a heap grown before stays grown: room to spare) */
            c->heap[k] = h;
            c->hcap[k] = c->ecap;
        }
    size_t tcap = c->tcap < 16 ? 16 : c->tcap;
    while (tcap / 2 < keys) tcap *= 2;
    return tcap == c->tcap ? KVT_OK : table_rebuild(c, tcap);
}

uint32_t kvt__keyed_add(kvt_keyed_t *c, kvt_key128_t key, uint64_t score) {
    KVT_ASSERT(c->nents < c->ecap && (c->nents + 1) * 2 <= c->tcap);
    uint32_t i = (uint32_t)c->nents++;
    c->ents[i] = (kvt__kentry_t){.key = key, .score = score, .heap = KVT__KEYED_NOWHERE, .state = KVT__KEYED_PENDING};
    c->ncls1 += kvt__kentry_class(c, &c->ents[i]);
    table_put(c, i);
    return i;
}

/* Empties slot s, shifting back the later members of its cluster that may
 * live there (their home is not in (s, j]). */
static void table_delete(kvt_keyed_t *c, size_t s) {
    size_t mask = c->tcap - 1;
    for (size_t j = (s + 1) & mask; c->slots[j] != 0; j = (j + 1) & mask) {
        size_t home = kvt__keyed_home(c, c->ents[c->slots[j] - 1].key);
        if (((j - home) & mask) >= ((j - s) & mask)) {
            c->slots[s] = c->slots[j];
            s = j;
        }
    }
    c->slots[s] = 0;
}

void kvt__keyed_remove(kvt_keyed_t *c, uint32_t i) {
    KVT_ASSERT(i < c->nents && c->ents[i].heap == KVT__KEYED_NOWHERE);
    table_delete(c, kvt__keyed_slot(c, c->ents[i].key));
    c->ncls1 -= kvt__kentry_class(c, &c->ents[i]);
    uint32_t last = (uint32_t)--c->nents;
    if (i == last) return;
    c->ents[i] = c->ents[last];
    c->slots[kvt__keyed_slot(c, c->ents[i].key)] = i + 1;
    if (c->ents[i].heap != KVT__KEYED_NOWHERE) c->heap[kvt__kentry_class(c, &c->ents[i])][c->ents[i].heap] = i;
}

/* ---- heaps ---- */

static int heap_less(const kvt_keyed_t *c, const uint32_t *h, size_t a, size_t b) {
    return kvt__kentry_less(&c->ents[h[a]], &c->ents[h[b]]);
}

static void heap_set(kvt_keyed_t *c, uint32_t *h, size_t pos, uint32_t i) {
    h[pos] = i;
    c->ents[i].heap = (uint32_t)pos;
}

static void sift_up(kvt_keyed_t *c, unsigned k, size_t pos) {
    uint32_t *h = c->heap[k], i = h[pos];
    while (pos > 0) {
        size_t up = (pos - 1) / 2;
        if (!kvt__kentry_less(&c->ents[i], &c->ents[h[up]])) break;
        heap_set(c, h, pos, h[up]);
        pos = up;
    }
    heap_set(c, h, pos, i);
}

static void sift_down(kvt_keyed_t *c, unsigned k, size_t pos) {
    uint32_t *h = c->heap[k], i = h[pos];
    size_t n = c->nheap[k];
    for (;;) {
        size_t l = 2 * pos + 1, m = pos;
        if (l >= n) break;
        m = l + 1 < n && heap_less(c, h, l + 1, l) ? l + 1 : l;
        if (!kvt__kentry_less(&c->ents[h[m]], &c->ents[i])) break;
        heap_set(c, h, pos, h[m]);
        pos = m;
    }
    heap_set(c, h, pos, i);
}

static void fix(kvt_keyed_t *c, unsigned k, size_t pos) {
    if (pos > 0 && heap_less(c, c->heap[k], pos, (pos - 1) / 2)) sift_up(c, k, pos);
    else sift_down(c, k, pos);
}

void kvt__heap_push(kvt_keyed_t *c, uint32_t i) {
    unsigned k = kvt__kentry_class(c, &c->ents[i]);
    KVT_ASSERT(c->nheap[k] < c->hcap[k] && c->ents[i].heap == KVT__KEYED_NOWHERE);
    c->heap[k][c->nheap[k]] = i;
    sift_up(c, k, c->nheap[k]++);
}

void kvt__heap_erase(kvt_keyed_t *c, uint32_t i) {
    unsigned k = kvt__kentry_class(c, &c->ents[i]);
    uint32_t *h = c->heap[k];
    size_t pos = c->ents[i].heap, last = --c->nheap[k];
    c->ents[i].heap = KVT__KEYED_NOWHERE;
    if (pos == last) return;
    heap_set(c, h, pos, h[last]);
    fix(c, k, pos);
}

uint32_t kvt__heap_pop(kvt_keyed_t *c, unsigned k) {
    uint32_t i = c->heap[k][0];
    kvt__heap_erase(c, i);
    return i;
}

void kvt__heap_fix(kvt_keyed_t *c, uint32_t i) { fix(c, kvt__kentry_class(c, &c->ents[i]), c->ents[i].heap); }
