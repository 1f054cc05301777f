/* The keyed page cache's state and its two indexes (index.c): the hash table
 * from key to entry and the eviction heap over entries. keyed.c holds the
 * structure's essay. */
#ifndef KVTIER_KEYED_INT_H
#define KVTIER_KEYED_INT_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier/alloc.h"
#include "kvtier/keyed.h"
#include "../core/ghost-int.h"
#include "../core/lru-int.h"
#include "../core/mix-int.h"

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
    /* heap[k][0..nheap[k]): the evictable entries of class k, a min-heap by
     * (score, hi, lo). One class (heap 0) unless class_bit is set
     * (kvt__keyed_set_classes). */
    uint32_t *heap[2];
    size_t nents, ecap, nheap[2], hcap[2]; /* hcap[k] >= ecap for each class in use: a key made
                                            * evictable never needs room */
    uint64_t class_bit; /* a score with this bit is class 1; 0: one class */
    double target0;     /* two classes: class 0 goes first while it holds more keys than this */
    size_t ncls1;       /* keys of class 1 */
    size_t cap1;        /* two classes: past this many class-1 keys a refresh demotes the first (SIZE_MAX: none) */
    kvt__ghost_t *ghost; /* adaptive: [k] the keys class k lost to eviction, from which target0 is
                          * learnt as ARC learns p; NULL: target0 stays 0 */
    /* cfg.policy KVT_KEYED_ARC (keyed.h): T1 is class 0, T2 class 1, each in
     * the order of scores the cache gives (clock: each key placed most recent
     * gets the next); arc_ghost[k], exact and in recency order, is B1 or B2;
     * target0 is the target. */
    int arc;
    uint64_t clock;
    kvt__lru_t arc_ghost[2];

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
    int digest_on;   /* kvt__keyed_keep_digest */
    uint64_t digest; /* every key stored or taken out (and why), and the page each new key got, in order */
};

/* An entry's class: its heap. */
static inline unsigned kvt__kentry_class(const kvt_keyed_t *c, const kvt__kentry_t *e) {
    return (e->score & c->class_bit) != 0;
}

static inline size_t kvt__keyed_evictable(const kvt_keyed_t *c) { return c->nheap[0] + c->nheap[1]; }

/* The eviction order within a class: (score, hi, lo) ascending. */
static inline int kvt__kentry_less(const kvt__kentry_t *a, const kvt__kentry_t *b) {
    if (a->score != b->score) return a->score < b->score;
    if (a->key.hi != b->key.hi) return a->key.hi < b->key.hi;
    return a->key.lo < b->key.lo;
}

static inline int kvt__key_eq(kvt_key128_t a, kvt_key128_t b) { return a.hi == b.hi && a.lo == b.lo; }

/* A key's 64-bit fingerprint in the ghosts. */
static inline uint64_t kvt__keyed_ghost_key(kvt_key128_t k) { return k.hi ^ kvt__mix64(k.lo); }

/* A running hash of the cache's decisions (the hybrid cache's decision
 * digest, kvt_hybrid_digest): every page a new key got, every key stored or
 * taken out and why, in order. Kept from this call on (an empty cache: the
 * hybrid cache calls it at create); 0 while not kept. */
void kvt__keyed_keep_digest(kvt_keyed_t *c);
static inline uint64_t kvt__keyed_digest(const kvt_keyed_t *c) { return c->digest; }


/* Pages of failed stores the next prepare_store's new keys take before the
 * evicted keys' pages (keyed.h, Pages): with it a caller tells which new key
 * took which victim's page. */
static inline size_t kvt__keyed_loose(const kvt_keyed_t *c) { return c->nloose; }

/* Two classes, as s2lru and ARC keep them (the hybrid cache's pieces): a key
 * whose score has class_bit set is class 1 (seen again), the others class 0.
 * Each class is evicted in its own order; an eviction takes class 0 while
 * the class-0 keys present (before the store's new ones) outnumber target0,
 * else class 1 (the other class when the one chosen has no evictable key).
 * target0 is 0 (s2lru: seen once always first) unless `adaptive`: then it is
 * learnt as ARC learns p (Megiddo & Modha, FAST'03), from two ghosts of
 * 2 x pages keys that remember the keys each class lost to eviction, and
 * the caller's misses (kvt__keyed_missed). class_bit 0: one class, the
 * order of keyed.h. Set on an empty cache only: KVT_EBUSY otherwise,
 * KVT_ENOMEM; nothing changed then. */
int kvt__keyed_set_classes(kvt_keyed_t *c, uint64_t class_bit, int adaptive);
/* The caller wanted key and it was absent. A ghost that remembers it moves
 * the target toward the class that lost it, by max(1, |other ghost| / |its
 * ghost|) keys within [0, pages], as ARC moves p on a hit in B1 or B2, and
 * forgets it. Not adaptive: nothing. */
void kvt__keyed_missed(kvt_keyed_t *c, kvt_key128_t key);

/* Segmented LRU's cap on class 1 (two classes set): when refreshes leave
 * more than cap1 keys in class 1, kvt__keyed_demote moves its first
 * evictable keys to class 0, where they go by their score, as SLRU's
 * protected segment overflows into probation. SIZE_MAX: no cap. */
void kvt__keyed_set_class1_cap(kvt_keyed_t *c, size_t cap1);

/* Entry i's score becomes s (its class and heap position follow): the body
 * of kvt_keyed_touch, for a caller that computes a key's new score from its
 * old one (the hybrid cache's policies). Call kvt__keyed_demote after a
 * batch of them. */
void kvt__keyed_rescore(kvt_keyed_t *c, uint32_t i, uint64_t s);
/* With a class-1 cap: class 1's first evictable keys go to class 0 until it
 * holds at most cap1 keys or has no evictable one. */
void kvt__keyed_demote(kvt_keyed_t *c);

/* Free-room planning by the caller (the hybrid cache's rounds): takes the
 * first k evictable keys in the order the next evictions would take them,
 * into keys, scores and pages[0..k), and evicts them (counted, remembered
 * and reported as prepare_store's evictions; their pages wait on the loose
 * list, as a removed key's do) but those `keep` says to keep (kept[j] set),
 * which stay. Returns k, or fewer when fewer are evictable; 0 when out of
 * memory, with nothing changed. */
size_t kvt__keyed_evict_next(kvt_keyed_t *c, size_t k, int (*keep)(void *arg, kvt_key128_t key), void *arg,
                             kvt_key128_t *keys, uint64_t *scores, uint64_t *pages, uint8_t *kept);
/* kvt_keyed_remove, counted and remembered (the ghosts) as evictions, with
 * removal events that say evicted. KVT_ENOMEM changes nothing. */
int kvt__keyed_evict(kvt_keyed_t *c, const kvt_key128_t *keys, size_t n, size_t *nevicted);

/* kvt_keyed_prepare_store that also gives the evicted keys' scores
 * (evscores[0..*nevicted), NULL: not wanted): a caller that moves them to
 * another tier carries what the scores say about them. */
int kvt__keyed_prepare_scored(kvt_keyed_t *c, const kvt_key128_t *keys, const uint64_t *scores, size_t n,
                              const kvt_key128_t *protect, size_t nprotect, uint64_t *pages, kvt_key128_t *evicted,
                              uint64_t *evscores, size_t capacity, size_t *nevicted);

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
/* Entry i goes into, or leaves, the heap of its class (its score's). */
void kvt__heap_push(kvt_keyed_t *c, uint32_t i);
/* The smallest entry of class k's heap (not empty), taken out. */
uint32_t kvt__heap_pop(kvt_keyed_t *c, unsigned k);
void kvt__heap_erase(kvt_keyed_t *c, uint32_t i);
/* Restores the order around entry i after its score changed. */
void kvt__heap_fix(kvt_keyed_t *c, uint32_t i);

#endif
