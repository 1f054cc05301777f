/* kvtier — the page-granular radix prefix tree.
 *
 * Keys are int32 token ids in a namespace (a LoRA adapter, a cache salt):
 * sequences in different namespaces never share pages. Edges are whole pages
 * of page_tokens tokens and nodes split only at page boundaries. For every
 * page the tree records where it lives (an L1 page, an L2 page, or both),
 * whether a copy is in flight, and, when a store asks, its chained 128-bit
 * hash. The cache module drives the tree (include/kvtier/cache.h); this
 * header is the tree's read-only face: statistics, checks, page hashes.
 *
 * Threads: a tree has no lock; every call on one tree, the read-only ones
 * (stats, check) included, runs on one thread at a time (the cache's
 * owner thread). The page hash functions are pure: any thread.
 */
#ifndef KVTIER_RADIX_H
#define KVTIER_RADIX_H

#include "kvtier/export.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_NO_PAGE UINT32_MAX

/* Page flags */
#define KVT_PAGE_D2H 0x1 /* an L1 -> L2 backup is in flight: l2 is reserved, not yet valid */
#define KVT_PAGE_H2D 0x2 /* an L2 -> L1 load is in flight: l1 is reserved, l2 is pinned */
#define KVT_PAGE_SUSPECT 0x4 /* a load found the L2 copy corrupt: it stays findable by its id until it is dropped */

typedef struct kvt_page {
    uint32_t l1;   /* L1 page id or KVT_NO_PAGE */
    uint32_t l2;   /* L2 page id or KVT_NO_PAGE */
    uint32_t flags;
} kvt_page_t;

typedef struct kvt_hash128 {
    uint64_t lo, hi;
} kvt_hash128_t;

typedef struct kvt_radix kvt_radix_t;
typedef struct kvt_rnode kvt_rnode_t;

/* The chained page hash: XXH3-128 over the previous page's hash (zero for a
 * sequence's first page), the namespace (4 bytes) and the page's tokens
 * (4 bytes each), all little-endian. The same tokens give the same hash in
 * every process; it is the key under which L3 stores a page. */
KVT_API kvt_hash128_t kvt_page_hash(const kvt_hash128_t *prev, uint32_t ns, const int32_t *tokens, uint32_t page_tokens);
/* The chained hashes of a sequence's first npages pages into out[0..npages). */
KVT_API void kvt_page_hash_chain(uint32_t ns, const int32_t *tokens, uint64_t npages, uint32_t page_tokens, kvt_hash128_t *out);

#define KVT_RADIX_STATS_FIELDS(X)                                                   \
    X(nodes, GAUGE, "tree nodes, the root excluded")                              \
    X(pages, GAUGE, "pages in the tree")                                          \
    X(l1_pages, GAUGE, "pages resident in L1")                                    \
    X(l2_pages, GAUGE, "pages with a valid L2 copy")                              \
    X(shadow_pages, GAUGE, "pages in L1 that also have an L2 copy")              \
    X(host_only_pages, GAUGE, "pages only in L2")                                 \
    X(inflight_pages, GAUGE, "pages with a backup or a load in flight")           \
    X(locked_nodes, GAUGE, "nodes held by a request")                             \
    X(l1_victims, GAUGE, "nodes whose tail L1 page may be evicted")              \
    X(l2_host_victims, GAUGE, "leaves whose tail page lives only in L2")         \
    X(l2_shadow_victims, GAUGE, "nodes holding reclaimable L2 copies of L1 pages") \
    X(splits, COUNTER, "node splits")                                             \
    X(metadata_bytes, GAUGE, "bytes the tree holds: nodes, tokens, page states, maps")                  \
    X(pool_free_bytes, GAUGE, "of them, held by the node-array pool and not in use: its free lists and the rest of its last chunk")

typedef struct kvt_radix_stats {
    uint32_t size; /* sizeof(kvt_radix_stats_t), set by the caller */
#define KVT_STATS_FIELD_(name, kind, help) uint64_t name;
    KVT_RADIX_STATS_FIELDS(KVT_STATS_FIELD_)
#undef KVT_STATS_FIELD_
} kvt_radix_stats_t;

/* O(nodes + pages): the counters are recomputed by walking the tree. */
KVT_API int kvt_radix_stats(const kvt_radix_t *r, kvt_radix_stats_t *st);

/* Recomputes every counter and invariant from scratch: page states against
 * the per-node counters, residency is prefix-closed (L1 pages above, pages
 * only in L2 below), lock counts against the locks below, the child map, the
 * reverse page maps, victim-set membership and heap order. KVT_ECORRUPT on a
 * violation; *why (when non-NULL) names it. */
KVT_API int kvt_radix_check(const kvt_radix_t *r, const char **why);

/* The chained hash of page idx of node n, computing (and keeping) the hashes
 * of the pages before it as needed. KVT_EINVAL (also for a node of another
 * tree), KVT_ENOMEM. */
KVT_API int kvt_radix_page_hash(kvt_radix_t *r, kvt_rnode_t *n, uint32_t idx, kvt_hash128_t *out);

#ifdef __cplusplus
}
#endif
#endif
