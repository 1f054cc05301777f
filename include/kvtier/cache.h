/* kvtier — the cache: policy over the prefix tree and the page allocators.
 *
 * Tiers: L1 (GPU memory, pages from a lane allocator), L2 (host memory,
 * pages from an extent allocator; l2_pages = 0 runs L1 alone) and, behind L2,
 * an optional L3 store (kvt_cache_attach_store, below; or a model of one,
 * l3_pages). A
 * request is admitted with kvt_cache_admit: its longest cached prefix is
 * matched and locked, the part of it that lives only in L2 is loaded back
 * into L1, and pages for the rest are allocated and inserted. It is released
 * with kvt_cache_release.
 *
 * Free room (planned eviction). Each tier keeps a free-room target, a
 * fraction of the tier. An allocation of n pages that would leave fewer than
 * half the target free starts an eviction round, and the round evicts until
 * n + target pages are free — back to the target, not just the deficit, so
 * that the next allocations find room without evicting again. (Were rounds
 * to start as soon as free room fell below the target, every allocation
 * would start one: the gap between the two levels is what batches them.)
 * Target 0 is the deficit-only mode. kvt_cache_restore_room runs a round
 * between engine steps, ahead of demand.
 *
 * Eviction. L1 takes its victim's last L1 page: a page with an L2 copy just
 * drops its L1 copy (it lives on in L2); a page without one is backed up
 * first under write_back (and whenever pages below it live only in L2), and
 * freed under write_through and write_through_selective. L2 evicts pages that
 * live only in L2 first, then L2 copies of pages still in L1, so L2 never
 * fills with shadows of L1. Nothing locked, pinned or in flight is evicted.
 *
 * Copies. Backups (L1 -> L2) and loads (L2 -> L1) are operations that
 * complete later: the pages involved are marked in flight, and the
 * completion, applied by kvt_cache_poll on the caller's thread, makes them
 * resident. Without a data plane a copy completes at once (page ids only).
 * With one (kvt_cache_attach) copies are batches on the transfer engine,
 * running on its workers while the caller goes on; the tree is only ever
 * touched by the caller's thread, in the calls below. What waits:
 *
 *   admit      for the loads of its own request (its pages must be in L1
 *              before it runs); backups and other work go on meanwhile
 *   eviction   for the backup of a page it must back up to evict it
 *              (write_back; or, under any policy, a page with pages below
 *              that live only in L2); a round first lets the backups in
 *              flight land, so that residency decisions never depend on
 *              copy timing (the same calls give the same hit rates with or
 *              without bytes)
 *   sync       for everything in flight
 *
 * The new pages of an admitted request hold no KV until the engine has run
 * its forward pass: kvt_cache_commit (or release) says they do, and only then
 * does write_through back them up. On a GPU "ran" means finished: kvtier's
 * copies run on streams of their own, ordered after nothing of the engine's,
 * so an engine that launches its forward pass asynchronously synchronizes
 * (its stream, or an event after the pass) before commit or release, and
 * before it reuses the pages a release let go.
 *
 * Threads: a cache belongs to one thread (its owner, usually the engine's
 * scheduler thread): every kvt_cache_* call on it runs there. The transfer
 * engine it is attached to runs copies on its own workers, which never touch
 * the tree; their completions reach the tree only through kvt_cache_poll
 * (and the calls that wait), on the owner thread. Different caches are
 * independent.
 */
#ifndef KVTIER_CACHE_H
#define KVTIER_CACHE_H

#include "kvtier/export.h"

#include <stdbool.h>
#include <stdint.h>

#include "kvtier/radix.h"
#include "kvtier/store.h"
#include "kvtier/tier.h"
#include "kvtier/xfer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* X(enum, name, description) */
#define KVT_POLICY_LIST(X)                                                                   \
    X(KVT_POLICY_LRU, "lru", "least recently used node first")                             \
    X(KVT_POLICY_LFU, "lfu", "fewest hits first, then least recently used")                \
    X(KVT_POLICY_FIFO, "fifo", "oldest node first")                                         \
    X(KVT_POLICY_PRIORITY, "priority", "lowest request priority first, then LRU")          \
    X(KVT_POLICY_SLRU, "slru", "segmented LRU: probation before protected (hit twice)")         \
    X(KVT_POLICY_S2LRU, "s2lru", "second-hit LRU: pages seen once go before pages seen again, LRU within each") \
    X(KVT_POLICY_ARC, "arc", "adaptive: seen-once and seen-again pages share the cache by a learnt split (ARC)")

typedef enum kvt_policy {
#define KVT_POLICY_ENUM_(e, name, desc) e,
    KVT_POLICY_LIST(KVT_POLICY_ENUM_)
#undef KVT_POLICY_ENUM_
    KVT_POLICY_COUNT_
} kvt_policy_t;

/* The default eviction order. */
#define KVT_POLICY_DEFAULT KVT_POLICY_ARC

typedef enum kvt_write_policy {
    KVT_WRITE_THROUGH = 0,           /* back up every page when its request commits (kvt_cache_commit) */
    KVT_WRITE_THROUGH_SELECTIVE = 1, /* back up a node's pages once it has been hit N times */
    KVT_WRITE_BACK = 2,              /* back up a page when L1 evicts it */
    KVT_WRITE_POLICY_COUNT_
} kvt_write_policy_t;

/* How an admission finishes the prefetch started when its request arrived
 * (L3 -> L2, see kvt_cache_prefetch). */
typedef enum kvt_prefetch_policy {
    KVT_PREFETCH_BEST_EFFORT = 0,   /* use what has arrived; never wait */
    KVT_PREFETCH_WAIT_COMPLETE = 1, /* wait for every page the store has (each store call has its timeout) */
    KVT_PREFETCH_TIMEOUT = 2,       /* wait until base + per_1024_tokens x tokens/1024 (capped) after arrival */
    KVT_PREFETCH_POLICY_COUNT_
} kvt_prefetch_policy_t;

/* What became of a request's prefetch (kvt_cache_req_t.prefetch). */
typedef enum kvt_prefetch_outcome {
    KVT_PREFETCH_NONE = 0,      /* none was started (no L3, below the threshold, nothing in L3) */
    KVT_PREFETCH_COMPLETE = 1,  /* every page the store had arrived before admission */
    KVT_PREFETCH_PARTIAL = 2,   /* best_effort: admission took what had arrived, the rest was revoked */
    KVT_PREFETCH_TIMED_OUT = 3, /* timeout: the wait ran out; what had arrived was used, the rest revoked */
    KVT_PREFETCH_REVOKED = 4,   /* best_effort with nothing arrived yet, or cancelled: all of it revoked */
    KVT_PREFETCH_OUTCOME_COUNT_
} kvt_prefetch_outcome_t;

KVT_API const char *kvt_prefetch_policy_name(kvt_prefetch_policy_t p);
KVT_API int kvt_prefetch_policy_parse(const char *s, kvt_prefetch_policy_t *p); /* KVT_EINVAL if unknown */
KVT_API const char *kvt_prefetch_outcome_name(kvt_prefetch_outcome_t o);

KVT_API const char *kvt_policy_name(kvt_policy_t p);
KVT_API const char *kvt_policy_describe(kvt_policy_t p);
KVT_API int kvt_policy_parse(const char *s, kvt_policy_t *p);      /* KVT_EINVAL if unknown */
KVT_API const char *kvt_write_policy_name(kvt_write_policy_t w);
KVT_API int kvt_write_policy_parse(const char *s, kvt_write_policy_t *w);

typedef struct kvt_cache_config {
    uint32_t size;               /* sizeof(kvt_cache_config_t) */
    uint32_t page_tokens;        /* default 16 */
    uint64_t l1_pages;           /* > 0 */
    uint64_t l2_pages;           /* 0: no L2 tier */
    uint32_t l1_lanes;           /* CP owner lanes over L1 (default 1) */
    double l1_free_room;         /* fraction of L1 kept free, [0, 0.5]; default 0.05 */
    double l2_free_room;         /* fraction of L2 kept free, [0, 0.5]; default 0.05 */
    kvt_policy_t policy;         /* default KVT_POLICY_DEFAULT (arc) */
    kvt_write_policy_t write_policy;   /* default write_through */
    uint32_t write_through_hits; /* hits before write_through_selective backs up (default 2) */
    /* L3: a store (kvt_cache_attach_store) or, for metadata-only runs, a
     * model of one: an exact LRU set of l3_pages page hashes in this process
     * whose calls complete at once. Both need an L2 tier. */
    uint64_t l3_pages;           /* the model's capacity; 0: no model */
    kvt_write_policy_t l3_write_policy; /* L2 -> L3: write_through (a page is put when it lands in L2),
                                         * write_through_selective (when its node reaches l3_write_hits
                                         * hits), write_back (when L2 lets it go: evicted, or its L2
                                         * copy reclaimed); default write_back (the least store
                                         * traffic; write_through shares pages with other instances
                                         * soonest) */
    uint32_t l3_write_hits;      /* default 2 */
    kvt_prefetch_policy_t prefetch_policy; /* default best_effort */
    uint32_t prefetch_threshold; /* tokens past the L1+L2 match below which no prefetch starts (default 256) */
    double prefetch_timeout_s;   /* timeout policy: base (default 2.0 s) */
    double prefetch_timeout_per_1024_s; /* ... plus this per 1024 tokens of the request (default 0.1 s) */
    double prefetch_timeout_max_s;      /* ... at most (default 30 s) */
    uint64_t l3_known;           /* page hashes of this cache's acknowledged puts remembered (FIFO), so a
                                  * prefix known to be in L3 needs no exists call; 0: 4 x l2_pages, at
                                  * least 65536 */
    bool decision_digest;        /* keep kvt_cache_digest, a running hash of every decision: for CP groups
                                  * (their ranks compare it) and for checks that two runs decided alike.
                                  * Default off: it folds every page id taken or given back and every copy,
                                  * work a cache that nobody compares need not do */
} kvt_cache_config_t;

/* Fills the defaults: 16-token pages, 65536 L1 pages and 262144 L2 pages (a
 * Llama-3-70B node: 320 GiB of HBM and 1.25 TiB of DRAM for KV), 5 % free
 * room in each tier, arc, write_through. */
KVT_API void kvt_cache_config_default(kvt_cache_config_t *cfg);

typedef struct kvt_cache kvt_cache_t;

/* KVT_EINVAL when a field of cfg is out of range, naming the first in *why
 * (why may be NULL) as "field: its range"; KVT_OK. */
KVT_API int kvt_cache_config_check(const kvt_cache_config_t *cfg, const char **why);
/* KVT_EINVAL (with nothing allocated) when a field is out of range
 * (kvt_cache_config_check says which), KVT_ENOMEM. */
KVT_API int kvt_cache_create(kvt_cache_t **out, const kvt_cache_config_t *cfg);
KVT_API void kvt_cache_destroy(kvt_cache_t *c);

/* An admitted request. */
typedef struct kvt_cache_req {
    kvt_rnode_t *node;       /* the deepest node it holds (the tree's root when it holds no page) */
    uint64_t pages;          /* pages of the request now in the cache, in order */
    uint64_t l1_hit_pages;   /* matched pages that were in L1 */
    uint64_t l2_hit_pages;   /* matched pages loaded back from L2 */
    uint64_t new_pages;      /* pages allocated and inserted */
    uint64_t uncached_pages; /* full pages that found no room */
    bool committed;          /* its new pages were committed (kvt_cache_commit) */
    uint64_t l3_hit_pages;   /* matched pages that came from L3 (prefetched, then loaded into L1);
                              * not counted in l2_hit_pages */
    uint64_t l3_foreign_pages; /* ... of them, pages this cache did not put (another instance did) */
    kvt_prefetch_outcome_t prefetch; /* kvt_cache_admit_prefetched: what became of the prefetch */
    uint64_t prefetch_wait_ns; /* how long admission waited for it */
} kvt_cache_req_t;

/* Admits a request of ntokens tokens in namespace ns (only whole pages are
 * cached). When l1_ids is not NULL it receives the L1 page of each of the
 * first req->pages pages. Evictions it makes stay made; otherwise a failure
 * changes nothing: KVT_EINVAL, KVT_ENOMEM. */
KVT_API int kvt_cache_admit(kvt_cache_t *c, uint32_t ns, const int32_t *tokens, uint64_t ntokens, int32_t priority,
                    uint32_t *l1_ids, kvt_cache_req_t *req);
/* The request's new pages now hold their KV (the forward pass wrote them):
 * write_through backs them up. Once per request; later calls do nothing.
 * Until then a later admission may match the pages, so an engine commits
 * before it admits a request that could share them. */
KVT_API int kvt_cache_commit(kvt_cache_t *c, kvt_cache_req_t *req);
/* Lets go of an admitted request's pages (they stay cached), committing
 * them first if that was not done. Every admitted request is released once;
 * KVT_EINVAL for one already released (release clears req->node). The
 * request is the struct admit filled, not a copy of it: a copy of a request
 * released is a dangling handle, as a freed pointer is (the tree's lock
 * counts are not per request, so it cannot be told from a live one). A
 * request of another cache is refused (KVT_EINVAL), by commit too. */
KVT_API int kvt_cache_release(kvt_cache_t *c, kvt_cache_req_t *req);
/* Lets go of an admitted request whose forward pass did not run, or failed:
 * its new pages hold no KV, so they leave the cache (their L1 pages go back
 * to the allocator, no backup is made, the policy keeps no ghost of them);
 * the pages it matched stay cached, as a release leaves them. A request
 * committed, or with no new pages, is released. Pages below its new pages
 * that requests admitted after it left (they matched its new pages before
 * it committed, against commit's rule, and were released: their KV was
 * computed over pages that hold none) leave with them. KVT_EBUSY, changing
 * nothing, while another request holds one of its new pages or pages below
 * them (abort that one first), or a page below is pinned or in flight (a
 * copy: again once it landed). KVT_EINVAL as release. */
KVT_API int kvt_cache_abort(kvt_cache_t *c, kvt_cache_req_t *req);
/* Applies the copies that have completed (without waiting); returns how
 * many (>= 0). */
KVT_API int kvt_cache_poll(kvt_cache_t *c);
/* Waits for every copy in flight and applies it. */
KVT_API int kvt_cache_sync(kvt_cache_t *c);

/* A member of a CP process group (docs/cp.md): every rank runs its own
 * cache on the same calls, so all make the same decisions; the I/O rank
 * makes every backup of the group, each rank the loads into its own lane
 * (L1 page p is on lane p mod l1_lanes); the copies another rank makes
 * complete at once here. The hooks let the group order what must be ordered
 * across processes (all optional; called on the cache's thread):
 *
 *   backup_started  every backup any rank starts, numbered 1, 2, ... in the
 *                   same order on every rank
 *   l2_freed        an L2 page went back to the allocator
 *   before_copy     a copy this process is about to make: with may_wait
 *                   false it returns KVT_EAGAIN if it would have to wait (the
 *                   cache then hands its queued copies to the engine and asks
 *                   again with may_wait true); another error fails the copy */
typedef struct kvt_cache_cp {
    uint32_t size;   /* sizeof(kvt_cache_cp_t) */
    uint32_t rank;   /* this process's lane, < l1_lanes */
    bool io_rank;    /* this process makes the group's backups */
    void *arg;
    void (*backup_started)(void *arg, uint32_t l1, uint32_t l2, uint64_t seq);
    void (*l2_freed)(void *arg, uint32_t l2);
    int (*before_copy)(void *arg, bool load, uint32_t l1, uint32_t l2, bool may_wait);
} kvt_cache_cp_t;

/* Attaches the data plane: from now on copies move bytes between tier l1
 * (engine index l1_index) and tier l2 (l2_index) on engine x, which the
 * cache then polls (the engine is the cache's alone: no one else submits to
 * it or polls it). The tiers hold at
 * least l1_pages / l2_pages pages; page i of the cache's L1 and L2 is page i
 * of the tier. Before the first admission; the engine and tiers outlive the
 * cache (kvt_cache_destroy waits for copies in flight). KVT_EINVAL (no L2
 * tier in the cache, tiers too small, an index that names another of the
 * engine's tiers or none, a modeled L3 (l3_pages: it holds no bytes), a
 * store attached whose tier is not l2, or, with a store, an engine without
 * its checksum option over a checksummed l2; on kvt_hybrid_cache, an engine
 * or tier of the hybrid cache's data plane, kvt_hybrid_plane), KVT_EBUSY (requests admitted
 * already; an engine with batches in flight or not polled, someone else's),
 * KVT_ENOMEM; nothing changed on failure. */
KVT_API int kvt_cache_attach(kvt_cache_t *c, kvt_xfer_t *x, kvt_tier_t *l1, unsigned l1_index, kvt_tier_t *l2,
                     unsigned l2_index);
/* The same for a member of a CP group (cp NULL: a single process). The L1
 * tier holds every lane, rank-major: L1 page p of the cache is tier page
 * (p mod C) x R + p div C, R = l1_pages / C (l1_pages a multiple of C). */
KVT_API int kvt_cache_attach_cp(kvt_cache_t *c, kvt_xfer_t *x, kvt_tier_t *l1, unsigned l1_index, kvt_tier_t *l2,
                        unsigned l2_index, const kvt_cache_cp_t *cp);
/* L3. Attaches a store (include/kvtier/store.h) as the cache's third tier:
 * the store's tier is the cache's L2 (page i of L2 is page i of the store's
 * tier, which holds at least l2_pages pages: the attached L2 tier when there
 * is a data plane, any host tier otherwise). The cache polls the store (no
 * one else may). Before the first admission; the store outlives the cache.
 * KVT_EINVAL (no L2, l3_pages set too, a CP member, the tier too small or not
 * the attached L2, a store of the hybrid cache's data plane over this cache
 * or one under the same identity: kvt_hybrid_plane_create; an attached
 * engine without its checksum option over a checksummed L2, whose pages the
 * store would then refuse to put, as kvt_cache_attach refuses it when it
 * comes second), KVT_EBUSY (requests admitted or prefetches started; a
 * store with batches in flight or not polled), KVT_ENOMEM; nothing changed
 * on failure.
 *
 * What L3 does:
 *   backup     L2 -> L3 under l3_write_policy; a page being put keeps its L2
 *              page until the store has answered (an L2 page freed meanwhile
 *              goes back to its allocator only then); a put acknowledged
 *              marks the page's hash as known to be in L3
 *   prefetch   kvt_cache_prefetch, when a request arrives: the pages past its
 *              L1+L2 match, if at least prefetch_threshold tokens, are looked
 *              up (known pages need no exists call), given L2 pages and
 *              fetched (get) in batches; the store checks each object and
 *              never serves one that fails (store.h). A prefetch never
 *              waits for room: it takes the L2 pages free now and, while
 *              pages it evicted are held by their puts, the rest as they
 *              come back (at kvt_cache_poll and admissions; under
 *              wait_complete to the oldest prefetch first, else to the
 *              youngest, which has the most time for its gets to land)
 *   admission  kvt_cache_admit_prefetched finishes it under prefetch_policy:
 *              the leading pages that arrived join the tree as pages in L2
 *              (then load into L1 like any L2 hit, counted as L3 hits); the
 *              rest is revoked (pages still being fetched go back when the
 *              store answers). A known page that the store no longer has is a
 *              miss that clears the mark.
 * A store that is down or slow costs misses and failed puts (counted in the
 * store's statistics and here), never a wrong page. */
KVT_API int kvt_cache_attach_store(kvt_cache_t *c, kvt_store_t *s);
/* Starts the prefetch of a request that just arrived (the same arguments its
 * admission will get). Its L1+L2 match stays locked (not evicted) until the
 * prefetch is over. *id: a handle for kvt_cache_admit_prefetched or
 * kvt_cache_prefetch_cancel, or 0 when none was started (no L3, below the
 * threshold, nothing of it in L3: then a plain admission does the same).
 * Making room for the pages may evict from L2. KVT_EINVAL, KVT_ENOMEM
 * (nothing started). */
KVT_API int kvt_cache_prefetch(kvt_cache_t *c, uint32_t ns, const int32_t *tokens, uint64_t ntokens, uint64_t *id);
/* kvt_cache_admit, finishing prefetch `id` first (0: none; then this is
 * kvt_cache_admit). The tokens must be those the prefetch was started with:
 * KVT_EINVAL otherwise (or for an unknown id), with the prefetch left as it
 * was. The prefetch is over when this returns KVT_OK, and also when it
 * returns KVT_ENOMEM after finishing it (the admission's own match could
 * not split a node): what arrived stays cached in L2 when it found room in
 * the tree, and kvt_cache_prefetches says whether the prefetch is still
 * there to cancel. */
KVT_API int kvt_cache_admit_prefetched(kvt_cache_t *c, uint64_t id, uint32_t ns, const int32_t *tokens, uint64_t ntokens,
                                       int32_t priority, uint32_t *l1_ids, kvt_cache_req_t *req);
/* Drops a prefetch whose request will not be admitted (its pages go back).
 * KVT_EINVAL for an unknown id. */
KVT_API int kvt_cache_prefetch_cancel(kvt_cache_t *c, uint64_t id);
/* Prefetches started and not yet finished or cancelled. */
KVT_API uint64_t kvt_cache_prefetches(const kvt_cache_t *c);

/* A running hash of every page id the cache took or gave back and every copy
 * it started, in order: caches fed the same calls agree on it exactly when
 * they made the same decisions. Kept only by a cache made with
 * cfg.decision_digest; 0 for any other (and for one that has decided
 * nothing yet). */
KVT_API uint64_t kvt_cache_digest(const kvt_cache_t *c);
/* One owner lane's L1 pages: in use now, and dealt to it by every
 * allocation so far (0 for a lane out of range). */
KVT_API uint64_t kvt_cache_lane_pages(const kvt_cache_t *c, uint32_t lane);
KVT_API uint64_t kvt_cache_lane_dealt(const kvt_cache_t *c, uint32_t lane);
/* Evicts, in each tier, until its free-room target holds (the planner run
 * between engine steps). Returns the pages evicted. */
KVT_API uint64_t kvt_cache_restore_room(kvt_cache_t *c);

#define KVT_CACHE_STATS_FIELDS(X)                                                                  \
    X(requests, COUNTER, "requests admitted")                                                    \
    X(tokens, COUNTER, "tokens of the admitted requests")                                        \
    X(l1_hit_tokens, COUNTER, "tokens served from L1")                                           \
    X(l2_hit_tokens, COUNTER, "tokens served from L2 (loaded back)")                             \
    X(l1_allocs, COUNTER, "L1 allocations")                                                      \
    X(l1_allocs_evicting, COUNTER, "L1 allocations that had to evict")                          \
    X(l1_evict_calls, COUNTER, "L1 eviction rounds")                                             \
    X(l1_evicted_pages, COUNTER, "pages that left L1")                                           \
    X(l1_alloc_failures, COUNTER, "L1 allocations that could not be met in full")               \
    X(l1_room_misses, COUNTER, "L1 eviction rounds that ended short of the free-room target")   \
    X(l2_allocs, COUNTER, "L2 allocations")                                                      \
    X(l2_allocs_evicting, COUNTER, "L2 allocations that had to evict")                          \
    X(l2_evict_calls, COUNTER, "L2 eviction rounds")                                             \
    X(l2_evicted_pages, COUNTER, "pages that left L2 (host-only pages and shadows)")             \
    X(l2_alloc_failures, COUNTER, "L2 allocations that could not be met in full")               \
    X(l2_room_misses, COUNTER, "L2 eviction rounds that ended short of the free-room target")   \
    X(backups, COUNTER, "L1 -> L2 backups started")                                              \
    X(forced_backups, COUNTER, "pages backed up to evict them because pages below lived only in L2") \
    X(loads, COUNTER, "L2 -> L1 loads started")                                                   \
    X(shadows_reclaimed, COUNTER, "L2 copies of L1 pages given up under L2 pressure")           \
    X(dropped_pages, COUNTER, "pages that left the cache")                                       \
    X(failed_copies, COUNTER, "copies that failed (the page stayed where it was)")              \
    X(integrity_failures, COUNTER, "load batches refused: an L2 page failed its checksum")      \
    X(corrupt_dropped, COUNTER, "L2 copies that failed their checksum dropped (with the pages below)") \
    X(l3_hit_tokens, COUNTER, "tokens served from L3 (prefetched into L2, loaded into L1)")       \
    X(l3_foreign_hit_tokens, COUNTER, "L3 hit tokens of pages this cache did not put (another instance)") \
    X(l3_puts, COUNTER, "L2 -> L3 pages put")                                                    \
    X(l3_put_failures, COUNTER, "pages the store failed to store")                               \
    X(l3_puts_skipped, COUNTER, "pages not put: already known to be in L3, or being put")        \
    X(l3_exists_calls, COUNTER, "exists calls made for prefetches")                               \
    X(l3_get_calls, COUNTER, "get calls made for prefetches")                                     \
    X(l3_known_hits, COUNTER, "prefetch pages known to be in L3 (no exists call needed)")        \
    X(l3_stale_marks, COUNTER, "pages known to be in L3 that the store no longer had (mark cleared)") \
    X(l3_misses, COUNTER, "prefetch pages a get did not serve (absent, refused, failed)")       \
    X(l3_evictions, COUNTER, "modeled L3: pages evicted for capacity")                           \
    X(prefetches, COUNTER, "prefetches started")                                                 \
    X(prefetch_below_threshold, COUNTER, "requests whose part past the match was below the threshold") \
    X(prefetch_pages, COUNTER, "pages prefetches found in L3")                                    \
    X(prefetch_arrived_pages, COUNTER, "prefetched pages that arrived by admission")             \
    X(prefetch_complete, COUNTER, "prefetches complete by admission")                            \
    X(prefetch_partial, COUNTER, "prefetches partly used (best_effort)")                          \
    X(prefetch_timed_out, COUNTER, "prefetches whose wait ran out (timeout)")                   \
    X(prefetch_revoked, COUNTER, "prefetches revoked: nothing usable, or cancelled")             \
    X(prefetch_wait_micros, COUNTER, "time admissions waited for prefetches, us")                    \
    X(prefetch_wait_max_micros, GAUGE, "the longest one admission waited, us")                       \
    X(l1_free, GAUGE, "free L1 pages")                                                           \
    X(l2_free, GAUGE, "free L2 pages")                                                           \
    X(l1_target, GAUGE, "L1 free-room target, pages")                                            \
    X(l2_target, GAUGE, "L2 free-room target, pages")                                            \
    X(l1_floor, GAUGE, "L1 free pages below which an allocation starts an eviction round")      \
    X(l2_floor, GAUGE, "L2 free pages below which an allocation starts an eviction round")           \
    X(l3_known_pages, GAUGE, "page hashes known to be in L3 (own puts remembered; the model's pages)") \
    X(aborted_pages, COUNTER, "new pages of aborted requests taken back, and the pages below them (no KV)")

typedef struct kvt_cache_stats {
    uint32_t size; /* sizeof(kvt_cache_stats_t), set by the caller */
#define KVT_STATS_FIELD_(name, kind, help) uint64_t name;
    KVT_CACHE_STATS_FIELDS(KVT_STATS_FIELD_)
#undef KVT_STATS_FIELD_
} kvt_cache_stats_t;

KVT_API int kvt_cache_stats(const kvt_cache_t *c, kvt_cache_stats_t *st);
/* The tree (for kvt_radix_stats, kvt_radix_check, page hashes). */
KVT_API kvt_radix_t *kvt_cache_tree(kvt_cache_t *c);
/* kvt_radix_check, then the cache's own accounting: every page id the tree
 * holds is reserved in its allocator and every reserved id is in the tree
 * (or on its way back to the allocator), free counts, lock counts of the
 * requests it knows. KVT_ECORRUPT; *why names the first violation. */
KVT_API int kvt_cache_check(kvt_cache_t *c, const char **why);

#ifdef __cplusplus
}
#endif
#endif
