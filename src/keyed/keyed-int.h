/* The keyed page cache's state and its two indexes (index.c): the hash table
 * from key to entry and the eviction heap over entries. keyed.c holds the
 * structure's essay. */
#ifndef KVTIER_KEYED_INT_H
#define KVTIER_KEYED_INT_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier/alloc.h"
#include "kvtier/keyed.h"

#define KVT__KEYED_NOWHERE UINT32_MAX /* entry.heap of an entry not in the heap */

enum { KVT__KEYED_PENDING = 1, KVT__KEYED_READY = 2 };

/* One present key. Entries are dense: ents[0..nents) are the keys. */
typedef struct kvt__kentry {
    kvt_key128_t key;
    uint64_t score;
    uint32_t page;
    uint32_t pins;
    uint32_t heap;  /* its position in the heap, or KVT__KEYED_NOWHERE */
    uint8_t state;  /* KVT__KEYED_PENDING or _READY */
    uint8_t mark;   /* protected, for the length of one prepare_store */
    uint16_t pad_;
} kvt__kentry_t;

struct kvt_keyed {
    uint64_t pages, room; /* room: ceil(free_room * pages), the free-room target */
    int events_on;
    kvt_extalloc_t *alloc;

    kvt__kentry_t *ents; /* ents[0..nents): the keys; capacity ecap */
    uint32_t *heap;      /* heap[0..nheap): evictable entries, a min-heap by (score, hi, lo) */
    size_t nents, ecap, nheap, hcap; /* hcap >= ecap: a key made evictable never needs room */

    uint32_t *slots; /* open addressing, linear probing: entry index + 1, 0 empty */
    size_t tcap;     /* a power of two; load at most 1/2 */

    /* Pages of failed stores, held by no key until the next prepare_store
     * takes or frees them. Capacity >= nloose + pending, so that
     * complete_store cannot fail. */
    uint32_t *loose;
    size_t nloose, lcap;

    /* With events on: capacity >= nev + pending + nents (a store event for
     * each pending key, a removal for each key), so that only prepare_store
     * grows the array. */
    kvt_keyed_event_t *ev;
    size_t nev, evcap;

    uint32_t *pops; /* prepare_store's work: evicted entries, then set-aside protected ones */
    size_t popcap;
    kvt_run_t *runs; /* prepare_store's and reset's allocator runs */
    size_t runcap;

    uint64_t pending, pinned;
    uint64_t lookups, hits, stores_prepared, stores_completed, stores_failed, store_refusals, evictions, loads, removed;
};

/* The eviction order: (score, hi, lo) ascending. */
static inline int kvt__kentry_less(const kvt__kentry_t *a, const kvt__kentry_t *b) {
    if (a->score != b->score) return a->score < b->score;
    if (a->key.hi != b->key.hi) return a->key.hi < b->key.hi;
    return a->key.lo < b->key.lo;
}

static inline int kvt__key_eq(kvt_key128_t a, kvt_key128_t b) { return a.hi == b.hi && a.lo == b.lo; }

/* Capacity, grown by doubling; contents kept. KVT_ENOMEM changes nothing. */
int kvt__keyed_grow(void **p, size_t *cap, size_t need, size_t elem);

/* Pages of failed stores the next prepare_store's new keys take before the
 * evicted keys' pages (keyed.h, Pages): with it a caller tells which new key
 * took which victim's page. */
static inline size_t kvt__keyed_loose(const kvt_keyed_t *c) { return c->nloose; }

/* kvt_keyed_touch, but the bits of `keep` a key's score has stay set: a
 * caller's class that a refresh must not take away (the hybrid cache's
 * seen-again pieces). */
void kvt__keyed_touch_keep(kvt_keyed_t *c, const kvt_key128_t *keys, const uint64_t *scores, size_t n,
                           uint64_t keep);

/* ---- hash table ---- */
/* Room for `keys` keys (entries, heap and table); KVT_ENOMEM changes nothing. */
int kvt__keyed_reserve_keys(kvt_keyed_t *c, size_t keys);
/* The slot holding key, or SIZE_MAX. */
size_t kvt__keyed_slot(const kvt_keyed_t *c, kvt_key128_t key);
/* The entry of key, or UINT32_MAX. */
uint32_t kvt__keyed_find(const kvt_keyed_t *c, kvt_key128_t key);
/* Appends an entry for an absent key (room reserved); returns its index. */
uint32_t kvt__keyed_add(kvt_keyed_t *c, kvt_key128_t key, uint64_t score);
/* Removes entry i (not in the heap): the last entry moves into its place. */
void kvt__keyed_remove(kvt_keyed_t *c, uint32_t i);
/* The table's home slot for key. */
size_t kvt__keyed_home(const kvt_keyed_t *c, kvt_key128_t key);

/* ---- eviction heap ---- */
void kvt__heap_push(kvt_keyed_t *c, uint32_t i);
uint32_t kvt__heap_pop(kvt_keyed_t *c);
void kvt__heap_erase(kvt_keyed_t *c, uint32_t i);
/* Restores the order around entry i after its score changed. */
void kvt__heap_fix(kvt_keyed_t *c, uint32_t i);

#endif
