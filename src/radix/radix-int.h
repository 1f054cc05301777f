/* The radix prefix tree, as the cache module sees it: node layout and the
 * mechanism operations. Policy (which victim, when to back up) lives in the
 * cache; the tree only keeps its invariants, its victim sets and their order
 * by a score the cache supplies. See radix.c for the structure. */
#ifndef KVTIER_RADIX_INT_H
#define KVTIER_RADIX_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "kvtier/radix.h"
#include "../core/check-int.h"

/* Victim sets kept incrementally, each a min-heap by (score, seq). */
typedef enum kvt__vset {
    KVT_VSET_L1 = 0,     /* nodes whose tail L1 page may leave L1 (vclass 0) */
    KVT_VSET_L1_HI,      /* the same, for nodes of vclass 1 */
    KVT_VSET_L2_HOST,    /* leaves whose tail page lives only in L2 */
    KVT_VSET_L2_SHADOW,  /* nodes holding L2 copies of pages still in L1 */
    KVT_VSET_POLICY,     /* nodes the policy marked (policy_set), for its own use */
    KVT_VSET_COUNT
} kvt__vset_t;

/* What the eviction policy keeps in a node (src/cache/policy.c): the tree
 * stores it and copies it to the head on a split, and reads only `set` and
 * `vclass` (which victim sets the node joins). */
typedef struct kvt__rnode_policy {
    uint64_t word[2]; /* the policy's own state (class bits, SLRU segment) */
    uint8_t set;      /* the node belongs to KVT_VSET_POLICY */
    uint8_t vclass;   /* which L1 victim set the node joins */
} kvt__rnode_policy_t;

struct kvt_rnode {
    kvt_rnode_t *parent;
    kvt_rnode_t *first_child, *next_sibling, *prev_sibling;
    int32_t *tokens;          /* npages * page_tokens */
    kvt_page_t *pages;        /* npages */
    kvt_hash128_t *hash;      /* lazily computed page hashes, [0, nhash) valid */
    uint64_t *key;            /* page keys, [0, npages) valid; NULL unless the tree keeps them */
    uint32_t npages, cap;     /* pages, and pages the arrays have room for */
    uint32_t n_l1;            /* leading pages resident in L1 (complete) */
    uint32_t n_shadow;        /* pages in [0, n_l1) with a valid L2 copy */
    uint32_t shadow_top;      /* no page of [0, n_l1) at or past it has a valid L2 copy (a bound: the
                               * L2 eviction's search for the last shadow starts here, not at n_l1) */
    uint32_t nchildren;
    uint32_t l1_children;     /* children with n_l1 > 0 */
    uint32_t lock;            /* requests holding this node or a descendant */
    uint32_t pin;             /* pages whose L2 copy is pinned by a load in flight */
    uint32_t ns;
    uint32_t nhash;
    int32_t priority;
    uint64_t digest;          /* XXH3-64 of the first page's tokens */
    uint64_t hits;            /* requests that matched this node */
    uint64_t last_access;     /* logical clock of the last match or insert */
    uint64_t created;         /* logical clock at creation */
    uint64_t seq;             /* unique creation number: the deterministic tie-break */
    int32_t heap_pos[KVT_VSET_COUNT];
    uint64_t score[KVT_VSET_COUNT];
    kvt__rnode_policy_t policy; /* the eviction policy's; the tree copies it to the head on a split */
};

/* Scores a node for a victim set (lower = evicted first). Called whenever a
 * node joins a set or its state changes. */
typedef uint64_t (*kvt__score_fn)(void *ctx, const kvt_rnode_t *n, kvt__vset_t set);

typedef struct kvt__radix_config {
    uint32_t page_tokens;
    uint64_t l1_pages, l2_pages; /* sizes of the page id spaces (reverse maps) */
    kvt__score_fn score;
    void *score_ctx;
    bool page_keys;              /* keep a page key for every page (kvt__radix_page_key) */
} kvt__radix_config_t;

int kvt__radix_create(kvt_radix_t **out, const kvt__radix_config_t *cfg);

/* Page keys: a 64-bit name for a page and every page before it on its path,
 * for the policy's ghosts (the page hash, kvt_radix_page_hash, names the same
 * thing in 128 bits for stores, but its chain is one XXH3-128 per page, each
 * waiting on the last). A key chains the page's own XXH3-64, which needs
 * nothing before it, through one multiply-add:
 *
 *   key(page i) = key(page i-1) x G + XXH3-64(tokens of page i)   (mod 2^64)
 *   key before the first page = mix(namespace + K)
 *
 * G is the odd golden-ratio constant, so a step is bijective in the key
 * before it: two paths that agree from a page on and differ before it never
 * share a key there (but for a 64-bit digest collision). The chain's serial
 * part is one multiply and one add a page (a splitmix64 step would put
 * three multiplies a page on it); the XXH3-64s, which mix, overlap. mix is
 * splitmix64's (core/mix-int.h). A tree made with page_keys computes them
 * as pages are inserted: O(1) to read. */
static inline uint64_t kvt__radix_page_key(const kvt_rnode_t *n, uint32_t idx) {
    KVT_ASSERT(n->key != NULL && idx < n->npages);
    return n->key[idx];
}
/* The key before the first page below `at` in namespace ns (at's last page's
 * key, or the namespace's seed below the root), and the key of the page after
 * one keyed `prev`. */
uint64_t kvt__radix_key_below(const kvt_radix_t *r, const kvt_rnode_t *at, uint32_t ns);
uint64_t kvt__radix_key_next(const kvt_radix_t *r, uint64_t prev, const int32_t *page);
/* The keys of n pages of tokens in a row, the page before them keyed prev:
 * out[i] is page i's (kvt__radix_key_next page by page, in one loop). */
void kvt__radix_keys(const kvt_radix_t *r, uint64_t prev, const int32_t *tokens, size_t n, uint64_t *out);
/* kvt_radix_page_hash for a node of r's (not checked: O(1) when the pages
 * before it are hashed already). */
int kvt__radix_page_hash(kvt_radix_t *r, kvt_rnode_t *n, uint32_t idx, kvt_hash128_t *out);
void kvt__radix_destroy(kvt_radix_t *r);
kvt_rnode_t *kvt__radix_root(kvt_radix_t *r);

typedef struct kvt__match {
    kvt_rnode_t *node;    /* deepest node of the match (the root when nothing matched) */
    uint64_t pages;       /* matched pages */
    uint64_t l1_pages;    /* leading matched pages resident in L1 */
} kvt__match_t;

/* Walks the longest cached prefix of npages pages of tokens in namespace ns,
 * splitting the last node if the match ends inside it so that the match ends
 * on a node boundary. With clock != 0, every matched node counts a hit and
 * takes clock as its last access. KVT_ENOMEM (a split could not be made)
 * changes nothing. */
int kvt__radix_match(kvt_radix_t *r, uint32_t ns, const int32_t *tokens, uint64_t npages, uint64_t clock,
                     kvt__match_t *m);

/* Adds npages new pages below `at` (a match end whose pages are all in L1, or
 * the root), resident in L1 at l1_ids. *out is the new node. KVT_EINVAL when
 * `at` is not fully in L1, KVT_EEXIST when it already has a child with that
 * first page, KVT_ENOMEM. Nothing changed on failure. */
int kvt__radix_insert(kvt_radix_t *r, kvt_rnode_t *at, uint32_t ns, const int32_t *tokens, uint64_t npages,
                      const uint32_t *l1_ids, uint64_t clock, int32_t priority, kvt_rnode_t **out);

/* The same for npages pages that live only in L2, at l2_ids (pages fetched
 * from L3): `at` may be any node of namespace ns, since pages only in L2 may
 * sit below any page. KVT_EEXIST, KVT_ENOMEM, KVT_EINVAL; nothing changed
 * on failure. */
int kvt__radix_insert_l2(kvt_radix_t *r, kvt_rnode_t *at, uint32_t ns, const int32_t *tokens, uint64_t npages,
                         const uint32_t *l2_ids, uint64_t clock, int32_t priority, kvt_rnode_t **out);

/* Adds delta (+1 or -1) to the lock count of node and its ancestors. */
void kvt__radix_lock(kvt_radix_t *r, kvt_rnode_t *node, int delta);

/* Page state changes. idx is a page index in node. Each keeps the counters,
 * the reverse maps and the victim sets current. */
uint32_t kvt__radix_drop_l1(kvt_radix_t *r, kvt_rnode_t *n);           /* tail L1 page (with a landed L2
                                                                            copy) leaves L1; its id */
/* As kvt__radix_drop_l1 calls while n's tail L1 page has a landed L2 copy,
 * up to max: those last L1 pages of n leave L1 (they live on in L2); their L1
 * ids to l1, tail first. Returns how many (0: the tail L1 page has none). */
uint32_t kvt__radix_drop_l1_tail(kvt_radix_t *r, kvt_rnode_t *n, uint32_t max, uint32_t *l1);
kvt_page_t kvt__radix_trim(kvt_radix_t *r, kvt_rnode_t *n);            /* tail page leaves the tree (n has
                                                                            no children); frees n if empty */
/* As k kvt__radix_trim calls, for a leaf n whose pages are all in L1 and whose
 * last k pages are in L1 only, with nothing in flight: their L1 ids to l1,
 * tail first; returns k. n is freed with its last page. */
uint32_t kvt__radix_trim_l1_tail(kvt_radix_t *r, kvt_rnode_t *n, uint32_t k, uint32_t *l1);
/* As k kvt__radix_trim calls for a leaf n whose last k pages live only in
 * L2, in two steps, so that the pages are read once and the caller may act
 * between the count and the trim: how many of n's last pages, up to max, live
 * only in L2 (below its L1 prefix, not loaded, nothing in flight), their L2
 * ids to l2, tail first, and *suspect whether any is marked suspect; then the
 * trim of k of them, given that answer (n is freed with its last page). */
uint32_t kvt__radix_l2_tail(const kvt_rnode_t *n, uint32_t max, uint32_t *l2, bool *suspect);
void kvt__radix_cut_l2_tail(kvt_radix_t *r, kvt_rnode_t *n, uint32_t k, bool suspect);
uint32_t kvt__radix_drop_l2(kvt_radix_t *r, kvt_rnode_t *n, uint32_t idx); /* the page's L2 copy goes */
/* The L2 copies of up to max of n's shadows (pages in L1 with a landed copy)
 * go, the last first, as kvt__radix_drop_l2 of each would; their L2 ids to
 * l2. Returns how many. */
uint32_t kvt__radix_drop_shadows(kvt_radix_t *r, kvt_rnode_t *n, uint32_t max, uint32_t *l2);
uint32_t kvt__radix_last_shadow(const kvt_rnode_t *n); /* the page kvt__radix_drop_shadows takes next (n has one) */
void kvt__radix_begin_backup(kvt_radix_t *r, kvt_rnode_t *n, uint32_t idx, uint32_t l2);
void kvt__radix_end_backup(kvt_radix_t *r, kvt_rnode_t *n, uint32_t idx, bool ok); /* !ok: l2 dropped */
/* Begin + end, ok, of the backups of n's pages lo .. lo + k - 1 (k >= 1) into
 * L2 pages l2[0 .. k - 1]: as one page at a time, with one victim-set update. */
void kvt__radix_backups_done(kvt_radix_t *r, kvt_rnode_t *n, uint32_t lo, uint32_t k, const uint32_t *l2);
void kvt__radix_begin_load(kvt_radix_t *r, kvt_rnode_t *n, uint32_t idx, uint32_t l1);
void kvt__radix_end_load(kvt_radix_t *r, kvt_rnode_t *n, uint32_t idx, bool ok);    /* !ok: l1 dropped */
/* Begin + end, ok, of the loads of n's pages past its L1 prefix that have no
 * L1 page, in page order, into L1 pages l1[0 ..): as one page at a time,
 * with one advance of the L1 prefix and one victim-set update. Returns how
 * many. */
uint32_t kvt__radix_loads_done(kvt_radix_t *r, kvt_rnode_t *n, const uint32_t *l1);
/* A page past the L1 prefix that was loaded (its load ended) gives its L1
 * page back: used when a load above it failed. Returns the L1 id. */
uint32_t kvt__radix_unload(kvt_radix_t *r, kvt_rnode_t *n, uint32_t idx);

/* Re-reads the node's score and policy_set (after the cache changed its
 * policy data). */
void kvt__radix_rescore(kvt_radix_t *r, kvt_rnode_t *n);
/* The node with the lowest score in a set, or NULL. */
bool kvt__vset_member(const kvt_rnode_t *n, kvt__vset_t set); /* the node belongs to the set: eligible, or marked for POLICY */
kvt_rnode_t *kvt__radix_victim(const kvt_radix_t *r, kvt__vset_t set);

/* Pre-order walk: the first node (NULL for an empty tree), then the next. */
kvt_rnode_t *kvt__radix_first(kvt_radix_t *r);
kvt_rnode_t *kvt__radix_next(kvt_radix_t *r, kvt_rnode_t *n);

/* Where L1 page / L2 page `id` sits in the tree, in O(1), for the pages the
 * reverse maps track: an L1 page being loaded, an L2 page being backed up or
 * suspect. False for any other id (in the tree or not). */
bool kvt__radix_locate_l1(const kvt_radix_t *r, uint32_t id, kvt_rnode_t **n, uint32_t *idx);
bool kvt__radix_locate_l2(const kvt_radix_t *r, uint32_t id, kvt_rnode_t **n, uint32_t *idx);

/* Whether L1 (tier 1) or L2 (tier 2) page id is held by a page of the tree,
 * as the last kvt_radix_check found: valid after it returned KVT_OK, until
 * the tree changes. */
bool kvt__radix_held(const kvt_radix_t *r, int tier, uint32_t id);

/* The same for any page: a walk of the whole tree, O(pages) (checks, tests).
 * tier 1 or 2. */
bool kvt__radix_search(kvt_radix_t *r, int tier, uint32_t id, kvt_rnode_t **n, uint32_t *idx);

/* The L2 copy of page idx of n failed an integrity check: it is kept findable
 * by its L2 id (kvt__radix_locate_l2), through splits, until it is dropped. */
void kvt__radix_suspect(kvt_radix_t *r, kvt_rnode_t *n, uint32_t idx);

#define KVT__PAGE_IN_FLIGHT (KVT_PAGE_D2H | KVT_PAGE_H2D)

static inline bool kvt__page_in_l1(const kvt_page_t *p) {
    return p->l1 != KVT_NO_PAGE && !(p->flags & KVT_PAGE_H2D);
}
static inline bool kvt__page_in_l2(const kvt_page_t *p) {
    return p->l2 != KVT_NO_PAGE && !(p->flags & KVT_PAGE_D2H);
}

#endif
