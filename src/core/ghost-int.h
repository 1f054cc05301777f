/* Internal: a ghost, the memory of keys that left a cache (ghost.c) — the
 * cache's s2lru and arc policies remember evicted pages in one, and its third
 * tier the pages it put. Approximate by design: a key is remembered by a
 * fingerprint for a bounded window of adds (ghost.c's essay). */
#ifndef KVTIER_CORE_GHOST_INT_H
#define KVTIER_CORE_GHOST_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The ghost of pages that left the cache (ghost.c): of single pages, or of
 * runs of a node's consecutive pages (an entry a run: its first page's key,
 * its length and a check of its last page's key). */
#define KVT__GHOST_PEND 16
#define KVT__GHOST_RUN_MAX 32 /* pages a run at most (its length fits 5 bits of an entry's aux) */
typedef struct kvt__ghost_pend {
    uint32_t fp, b1; /* a queued add: its fingerprint and first bucket, computed as it was queued ... */
    uint16_t aux;    /* ... and its run's length - 1 and check (0 in a ghost of pages) */
} kvt__ghost_pend_t;
typedef struct kvt__ghost {
    struct kvt__ghost_bucket *table; /* cuckoo buckets of 16 entries (a cache line): fingerprint and epoch tag (ghost.c) */
    void *raw, *aux_raw; /* the table's and aux's allocations (kvt__malloc_huge) */
    uint64_t *spill;    /* a bit a bucket: some key whose first bucket it is may be in its second (ghost.c) */
    uint16_t *aux;      /* a ghost of runs: an entry's run length - 1 and check, at bucket * 16 + way; else NULL */
    size_t cap, nb;     /* pages remembered (<= 2^29); buckets in use now (n0 << level) */
    size_t n0, nb_max;  /* buckets at level 0; at the last level, reserved (>= cap / 12: 12 of 16 entries in use when full) */
    unsigned run_max;   /* pages an entry at most: 1, a ghost of pages; up to KVT__GHOST_RUN_MAX */
    unsigned level, levels; /* the table doubles as it fills, levels times (0 for a small one) */
    unsigned grow_mask, grow_shift; /* the grow bits used so far: ((fp >> 1) & grow_mask) >> grow_shift */
    uint8_t now16[16], last16[16]; /* the current tag, and epochs - 1, in each byte (for one SSE2 load) */
    size_t grow_at;     /* live entries (queued adds counted) at which it doubles next: 12 a bucket in use */
    unsigned epochs;    /* the window in epochs: min(112, cap) ... */
    size_t len, fill;   /* ... of len pages each (2 cap / (2 epochs - 1), rounded); pages added in the current one */
    uint8_t tag;        /* the current epoch's tag (its number mod 256) */
    size_t sweep_at;    /* the next bucket the sweep clears of expired entries ... */
    size_t sweep_step;  /* ... sweep_step of them as each epoch begins (the table every 128 epochs) */
    size_t live;        /* pages remembered now */
    size_t entries;     /* entries remembered now (live, in a ghost of pages) */
    uint32_t count[256]; /* live pages by tag */
    uint32_t ecount[256]; /* live entries by tag */
    uint64_t overflows; /* entries forgotten early: no room within the cuckoo moves */
    uint64_t added;     /* adds so far (a probe is good until the next) */
    unsigned npend;     /* adds queued (their buckets prefetched), applied before any read ... */
    unsigned head;      /* ... in order from pend[head], a ring: each is applied KVT__GHOST_PEND adds later */
    kvt__ghost_pend_t pend[KVT__GHOST_PEND];
} kvt__ghost_t;

/* cap 0: a ghost that remembers nothing; run_max 1: a ghost of pages. */
int kvt__ghost_init(kvt__ghost_t *g, size_t cap, unsigned run_max);
void kvt__ghost_fini(kvt__ghost_t *g);
void kvt__ghost_add(kvt__ghost_t *g, uint64_t key); /* one page */
/* The k pages of keys[0 .. k - 1], a node's consecutive pages leaving it,
 * as runs of run_max pages from keys[0] on (the last one shorter), added the
 * last run first (a ghost of pages: keys[k - 1], ..., keys[0]). */
void kvt__ghost_add_keys(kvt__ghost_t *g, const uint64_t *keys, size_t k);
/* A ghost of pages: key's page, taken out (true when it was remembered) or looked up. */
bool kvt__ghost_take(kvt__ghost_t *g, uint64_t key);
bool kvt__ghost_has(const kvt__ghost_t *g, uint64_t key);
void kvt__ghost_settle(kvt__ghost_t *g); /* applies the queued adds (every read does it first) */
static inline size_t kvt__ghost_live(const kvt__ghost_t *g) { /* pages remembered now */
    if (g->npend) kvt__ghost_settle((kvt__ghost_t *)g); /* (the representation changes, not what it holds) */
    return g->live;
}
/* A lookup, its key's place (fingerprint and buckets) computed once: the
 * protected-prefix walk looks a run up and takes it out by the same probe.
 * A probe is good until the next add (asserted), on a ghost with no add
 * queued (kvt__ghost_settle). */
typedef struct kvt__ghost_probe {
    uint64_t added;      /* g->added when it was made */
    uint32_t fp, b1, b2; /* fingerprint, first bucket, second (when the first has spilled; else UINT32_MAX) */
    uint32_t at;         /* kvt__ghost_run: the run's entry, bucket * 16 + way (UINT32_MAX: none) */
} kvt__ghost_probe_t;
void kvt__ghost_probe(const kvt__ghost_t *g, uint64_t key, kvt__ghost_probe_t *p);
/* The run remembered that begins with the probe's key: its length in pages,
 * 0 when there is none (the probe keeps where it is). */
uint32_t kvt__ghost_run(const kvt__ghost_t *g, kvt__ghost_probe_t *p);
/* Takes out the run kvt__ghost_run found, when `last` (the key of its last
 * page, as the caller's pages have it) passes its check: true then. In a
 * ghost of pages a run is its one page, and last is its key. */
bool kvt__ghost_take_run(kvt__ghost_t *g, const kvt__ghost_probe_t *p, uint64_t last);

#endif
