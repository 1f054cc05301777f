/* kvtier — page allocators.
 *
 * Extent allocator (kvt_extalloc): pages [0, N) of one tier, handed out as
 * runs of consecutive pages with contiguous-preferred reservation:
 *   - one run when any free extent holds n pages: the best fit (smallest such
 *     extent), the lowest address among equals, taken from its front;
 *   - otherwise the largest free extents first, whole (among equal lengths the
 *     higher address first), until what is left fits one extent, which is then
 *     best-fitted as above. Largest-first gives the fewest runs possible.
 * No call scans the pool: reserve and free cost O(log E) per run, E being the
 * number of free extents, at any fragmentation. Metadata grows with E, not N
 * (about 12 bytes per free extent per index, two indexes), and is reported.
 * Deterministic: the same sequence of calls gives the same pages on every
 * instance, which lets CP ranks share one host segment without broadcasting.
 *
 * Lane allocator (kvt_laneal): the L1 page space of a CP group of C owner
 * lanes. Logical page p belongs to lane p mod C at local page p div C. An
 * allocation spreads its pages over the lanes in rotation (page i of a request
 * goes to lane (start + i) mod C; the next request starts where this one
 * stopped) and keeps each lane's share contiguous where it can (one extent
 * allocator per lane). Under balanced load (requests freed whole, in order)
 * on lanes of equal size (C divides N) the lanes' free counts stay within one
 * page of each other. C = 1 is a plain extent allocator.
 *
 * Every function says what a failure leaves behind: "nothing changed" means
 * that the allocator's state and statistics are as before the call, but for
 * the count of failures itself (reserve_failures, which counts the call);
 * output buffers may have been written, and spare metadata nodes set aside
 * may stay.
 *
 * Threads: an allocator has no lock. Its calls, the queries included, run
 * on one thread at a time (the cache's owner thread, in kvtier); different
 * allocators are independent.
 */
#ifndef KVTIER_ALLOC_H
#define KVTIER_ALLOC_H

#include "kvtier/export.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Pools hold at most this many pages (page ids are uint32). */
#define KVT_ALLOC_MAX_PAGES UINT32_MAX

typedef struct kvt_run {
    uint32_t start; /* first page */
    uint32_t len;   /* pages, >= 1 */
} kvt_run_t;

/* ---- extent allocator ---------------------------------------------------- */

typedef struct kvt_extalloc kvt_extalloc_t;

/* X(field, KIND, help): one list makes the struct and every printer. */
#define KVT_EXTALLOC_STATS_FIELDS(X)                                                       \
    X(pages, GAUGE, "pages in the pool")                                                   \
    X(free_pages, GAUGE, "free pages")                                                     \
    X(free_extents, GAUGE, "maximal runs of free pages")                                   \
    X(largest_free_run, GAUGE, "pages in the largest free extent")                         \
    X(metadata_bytes, GAUGE, "bytes the allocator holds for itself, spare nodes included") \
    X(reserves, COUNTER, "successful reserve calls of any kind")                           \
    X(reserve_failures, COUNTER, "failed reserves: no pages, runs or memory; a taken page")   \
    X(frees, COUNTER, "successful free calls")                                             \
    X(runs_reserved, COUNTER, "runs handed out by reserve calls")

typedef struct kvt_extalloc_stats {
    uint32_t size; /* sizeof(kvt_extalloc_stats_t), set by the caller */
#define KVT_STATS_FIELD_(name, kind, help) uint64_t name;
    KVT_EXTALLOC_STATS_FIELDS(KVT_STATS_FIELD_)
#undef KVT_STATS_FIELD_
} kvt_extalloc_stats_t;

/* Creates an allocator over pages [0, npages), all free.
 * KVT_EINVAL if npages is 0 or above KVT_ALLOC_MAX_PAGES; KVT_ENOMEM. */
KVT_API int kvt_extalloc_create(kvt_extalloc_t **out, uint64_t npages);
KVT_API void kvt_extalloc_destroy(kvt_extalloc_t *a);

/* Reserves n pages as at most max_runs runs, written to runs[0..*nruns) in the
 * order they were chosen. Fails with nothing changed:
 * KVT_EINVAL (n or max_runs is 0, or a NULL pointer), KVT_ENOSPC (fewer than n
 * pages free), KVT_EFRAG (more than max_runs runs would be needed), KVT_ENOMEM. */
KVT_API int kvt_extalloc_reserve(kvt_extalloc_t *a, uint64_t n, kvt_run_t *runs, size_t max_runs,
                         size_t *nruns);

/* Exactly one run of n pages (best fit, lowest address), or a failure with
 * nothing changed: KVT_EINVAL, KVT_ENOSPC (not enough free pages), KVT_EFRAG
 * (enough pages, but no free extent holds n), KVT_ENOMEM. */
KVT_API int kvt_extalloc_reserve_contiguous(kvt_extalloc_t *a, uint64_t n, kvt_run_t *run);

/* Reserves exactly the pages of `run`. Nothing changed on KVT_EINVAL (empty
 * run), KVT_ERANGE (beyond N), KVT_ERESERVED (a page of it is reserved),
 * KVT_ENOMEM. */
KVT_API int kvt_extalloc_reserve_at(kvt_extalloc_t *a, kvt_run_t run);

/* Frees the pages of runs[0..nruns), merging them with free neighbours. All or
 * nothing: KVT_EINVAL (an empty run, NULL, or two runs that overlap),
 * KVT_ERANGE (beyond N), KVT_ENOTRESV (a page that is not reserved),
 * KVT_ENOMEM leave everything as it was. */
KVT_API int kvt_extalloc_free(kvt_extalloc_t *a, const kvt_run_t *runs, size_t nruns);

/* True when page is free (false for pages >= N). O(log E). */
KVT_API bool kvt_extalloc_is_free(const kvt_extalloc_t *a, uint64_t page);

/* Writes up to cap free extents in address order to out; returns how many
 * there are in all (which may exceed cap). */
KVT_API size_t kvt_extalloc_free_extents(const kvt_extalloc_t *a, kvt_run_t *out, size_t cap);

/* Fills *st as far as st->size reaches (the ABI rule, version.h). KVT_EINVAL if st is NULL. */
KVT_API int kvt_extalloc_stats(const kvt_extalloc_t *a, kvt_extalloc_stats_t *st);

/* Recomputes every counter and invariant from scratch: extents ordered,
 * disjoint, never adjacent, inside [0, N); both indexes hold the same extents;
 * the free-page count matches. KVT_ECORRUPT on a violation, naming it in
 * *why (why may be NULL), as every kvtier check() does. */
KVT_API int kvt_extalloc_check(const kvt_extalloc_t *a, const char **why);

/* ---- lane allocator ------------------------------------------------------ */

typedef struct kvt_laneal kvt_laneal_t;

#define KVT_LANEAL_STATS_FIELDS(X)                                               \
    X(lanes, GAUGE, "owner lanes (C)")                                           \
    X(pages, GAUGE, "logical pages over all lanes")                              \
    X(free_pages, GAUGE, "free pages over all lanes")                            \
    X(lane_free_min, GAUGE, "fewest free pages on one lane")                     \
    X(lane_free_max, GAUGE, "most free pages on one lane")                       \
    X(next_lane, GAUGE, "lane where the next allocation starts")                 \
    X(metadata_bytes, GAUGE, "bytes the allocator holds for itself")             \
    X(reserves, COUNTER, "successful reserve calls")                             \
    X(reserve_failures, COUNTER, "reserve calls that failed")                    \
    X(frees, COUNTER, "successful free calls")

typedef struct kvt_laneal_stats {
    uint32_t size; /* sizeof(kvt_laneal_stats_t), set by the caller */
#define KVT_STATS_FIELD_(name, kind, help) uint64_t name;
    KVT_LANEAL_STATS_FIELDS(KVT_STATS_FIELD_)
#undef KVT_STATS_FIELD_
} kvt_laneal_stats_t;

/* Creates C = lanes owner lanes over logical pages [0, npages). Lane l holds
 * the logical pages p < npages with p mod C == l. KVT_EINVAL when lanes is 0,
 * npages < lanes or npages > KVT_ALLOC_MAX_PAGES; KVT_ENOMEM. */
KVT_API int kvt_laneal_create(kvt_laneal_t **out, uint64_t npages, uint32_t lanes);
KVT_API void kvt_laneal_destroy(kvt_laneal_t *la);

/* Reserves n logical pages, written to pages[0..n) in request order: page i is
 * on lane (next_lane + i) mod C. When a lane is short of its share, the next
 * lanes in rotation with room take the difference (and the dealing skips the
 * lanes whose share is used up). Nothing changed (spare metadata may be kept)
 * on KVT_EINVAL (n is 0 or a NULL pointer), KVT_ENOSPC (fewer than n pages
 * free in all lanes), KVT_ENOMEM. */
KVT_API int kvt_laneal_reserve(kvt_laneal_t *la, uint64_t n, uint32_t *pages);

/* Frees n logical pages. All or nothing: KVT_EINVAL (NULL, n is 0, or a page
 * listed twice), KVT_ERANGE, KVT_ENOTRESV, KVT_ENOMEM. */
KVT_API int kvt_laneal_free(kvt_laneal_t *la, const uint32_t *pages, size_t n);

/* Free pages of one lane (0 for a lane >= C). */
KVT_API uint64_t kvt_laneal_lane_free(const kvt_laneal_t *la, uint32_t lane);
/* Pages one lane has been dealt by every reserve so far (0 for a lane >= C). */
KVT_API uint64_t kvt_laneal_lane_dealt(const kvt_laneal_t *la, uint32_t lane);

KVT_API int kvt_laneal_stats(const kvt_laneal_t *la, kvt_laneal_stats_t *st);
KVT_API int kvt_laneal_check(const kvt_laneal_t *la, const char **why);

/* The lane mapping, the one place it is written (cp.h and the cache use
 * it): logical page p under C lanes of R pages each has owner lane p mod C
 * and local page p div C; lane-major ("rank-major", the read view) it is
 * page owner x R + local, and back. */
static inline uint32_t kvt_lane_of(uint64_t p, uint32_t lanes) { return (uint32_t)(p % lanes); }
/* The pages of lane l when npages pages are dealt to lanes lanes so. */
static inline uint64_t kvt_lane_pages(uint64_t npages, uint32_t lanes, uint32_t l) {
    return (npages - l + lanes - 1) / lanes;
}
static inline uint64_t kvt_lane_local(uint64_t p, uint32_t lanes) { return p / lanes; }
static inline uint64_t kvt_lane_major(uint64_t p, uint32_t lanes, uint64_t per_lane) {
    return kvt_lane_of(p, lanes) * per_lane + kvt_lane_local(p, lanes);
}
static inline uint64_t kvt_lane_logical(uint64_t q, uint32_t lanes, uint64_t per_lane) {
    return (q % per_lane) * lanes + q / per_lane;
}

#ifdef __cplusplus
}
#endif
#endif
