/* Private to the radix module: the tree struct, the child map and the victim
 * heaps, shared by radix.c, childmap.c, vset.c and check.c. */
#ifndef KVTIER_RADIX_IMPL_H
#define KVTIER_RADIX_IMPL_H

#include <stddef.h>

#include "radix-int.h"

/* Child map: (parent, namespace, first page) -> child, open addressing with
 * linear probing and backward-shift deletion. */
typedef struct kvt__cm_entry {
    uint64_t h;
    kvt_rnode_t *node; /* NULL: empty slot */
} kvt__cm_entry_t;

typedef struct kvt__childmap {
    kvt__cm_entry_t *e;
    size_t cap, n; /* cap is a power of two, or 0 */
} kvt__childmap_t;

typedef struct kvt__vheap {
    kvt_rnode_t **a;
    size_t n, cap;
} kvt__vheap_t;

typedef struct kvt__pageref {
    kvt_rnode_t *node; /* NULL: the page id is not in the tree */
    uint32_t idx;
} kvt__pageref_t;

/* The node-array pool (pool.c): classes of 16..64 bytes, then four per
 * doubling up to POOL_MAX (4 MiB): 4 + 16 x 4. */
#define KVT__POOL_CLASSES 68
typedef struct kvt__pool_chunk {
    void *m;  /* as kvt__malloc_huge gave it (its raw block) */
    size_t n; /* bytes carved from, from a 2 MiB boundary */
} kvt__pool_chunk_t;

typedef struct kvt__pool {
    kvt__pool_chunk_t *chunk;
    size_t nchunks, chunk_cap;
    char *bump, *end;                 /* the last chunk's uncarved part */
    void *free_[KVT__POOL_CLASSES];   /* freed blocks by class, linked through their first word */
    uint64_t nonempty[(KVT__POOL_CLASSES + 63) / 64]; /* bit c: free_[c] has a block */
    uint64_t held;                    /* bytes in chunks */
    uint64_t free_bytes;              /* bytes of the blocks on the free lists (by their class's size) */
} kvt__pool_t;

struct kvt_radix {
    uint32_t page_tokens;
    bool page_keys; /* nodes keep page keys */
    kvt_rnode_t root;
    uint64_t next_seq;
    uint64_t nodes, splits;
    int64_t bytes; /* everything the tree allocated */
    kvt__childmap_t cm;
    kvt__vheap_t heap[KVT_VSET_COUNT];
    kvt__pageref_t *l1map, *l2map;
    uint64_t l1_pages, l2_pages;
    uint64_t *held; /* kvt_radix_check's bitmaps of the L1 and L2 ids pages hold (each once), allocated
                     * with the tree so that a check needs no memory (kvt__radix_held reads them) */
    kvt__score_fn score;
    void *score_ctx;
    kvt__pool_t pool;
};

/* The words of r->held: L1's bits, then L2's from word l1_pages / 64 + 1. */
static inline size_t kvt__radix_held_words(const kvt_radix_t *r) { return (r->l1_pages + 63) / 64 + (r->l2_pages + 63) / 64 + 2; }
/* The bitmap of tier 1 (L1) or 2 (L2) in r->held. */
static inline uint64_t *kvt__radix_held_map(const kvt_radix_t *r, int tier) { return r->held + (tier == 1 ? 0 : r->l1_pages / 64 + 1); }

/* Memory through the hook, counted in r->bytes. */
void *kvt__radix_alloc(kvt_radix_t *r, size_t size);
void kvt__radix_free(kvt_radix_t *r, void *p, size_t size);

/* The capacity k single trims leave a node of npages (> k) pages in arrays
 * of cap, without trimming k times: a trim down to m pages shrinks the
 * arrays to m when m <= cap / 2, so the first shrink is at t = min(npages -
 * 1, cap / 2), if the cut reaches it, and each later one at half the
 * capacity before it. (A loop of a page at a time would be a serial chain
 * of a shift and a compare a page; the unit test radix/cap_after_trims
 * checks this against that loop on every cap up to 300.) npages <= cap / 2
 * is possible: a shrink that found no memory left the arrays as they were. */
static inline uint32_t kvt__cap_after_trims(uint32_t npages, uint32_t cap, uint32_t k) {
    uint32_t m = npages - k, t = npages - 1 < cap / 2 ? npages - 1 : cap / 2;
    if (t < m) return cap;
    for (cap = t; cap / 2 >= m;) cap /= 2;
    return cap;
}

/* Node arrays (tokens, page states, hashes) from the pool; NULL: no memory. */
void *kvt__pool_alloc(kvt_radix_t *r, size_t n);
void kvt__pool_free(kvt_radix_t *r, void *b, size_t n);
void kvt__pool_fini(kvt_radix_t *r);

uint64_t kvt__cm_hash(const kvt_rnode_t *parent, uint32_t ns, uint64_t digest);
int kvt__cm_reserve(kvt_radix_t *r, size_t extra); /* room for `extra` more entries */
void kvt__cm_insert(kvt_radix_t *r, uint64_t h, kvt_rnode_t *node);
kvt_rnode_t *kvt__cm_find(const kvt_radix_t *r, uint64_t h, const kvt_rnode_t *parent, uint32_t ns,
                          const int32_t *page);
void kvt__cm_replace(kvt_radix_t *r, uint64_t h, kvt_rnode_t *old, kvt_rnode_t *node);
void kvt__cm_remove(kvt_radix_t *r, uint64_t h, kvt_rnode_t *node);
void kvt__cm_fini(kvt_radix_t *r);

int kvt__vheap_reserve(kvt_radix_t *r, size_t n); /* every heap can hold n nodes */
void kvt__vheap_refresh(kvt_radix_t *r, kvt_rnode_t *n); /* membership and position in every set */
/* Membership only: after a change of page states, which no score depends on
 * (scores are node-level: recency, hits, class; kvt_radix_check verifies
 * them), so a node already in a set keeps its place. */
void kvt__vheap_membership(kvt_radix_t *r, kvt_rnode_t *n);
void kvt__vheap_remove_all(kvt_radix_t *r, kvt_rnode_t *n);
bool kvt__vheap_less(const kvt_rnode_t *a, const kvt_rnode_t *b, kvt__vset_t set);
void kvt__vheap_fini(kvt_radix_t *r);

#endif
