/* The extent allocator: free extents indexed twice, by size and by address.
 *
 * A free extent is a maximal run of free pages [start, start+len). The
 * allocator keeps two ordered sets (B+trees of packed uint64 keys, u64set.c):
 *
 *   by_size: (len << 32 | start)   best fit = first key >= (n << 32)
 *                                  largest  = last key, then predecessors
 *   by_addr: (start << 32 | len)   neighbours of a freed run, and the check
 *                                  that a freed page is really reserved
 *
 * Reserving n = 5 from a pool with free extents [2,4) [6,12) [14,15):
 *
 *   pages     0 1 2 3 4 5 6 7 8 9 10 11 12 13 14
 *   before    # # . . # # . . . . .  .  #  #  .     by_size: (1,14) (2,2) (6,6)
 *   reserve 5             ^^^^^^^^^                 best fit: (6,6), front
 *   after     # # . . # # # # # # #  .  #  #  .     by_size: (1,11) (1,14) (2,2)
 *
 * Freeing [6,11) again finds the extent starting at 11 (by_addr lower bound)
 * and the one ending at 6 (its predecessor), merges, and is back to the
 * "before" picture: frees always coalesce, so no two free extents touch.
 *
 * Invariants (kvt_extalloc_check): extents inside [0, N), disjoint and never
 * adjacent; by_size and by_addr hold exactly the same extents; free_pages is
 * their sum.
 *
 * Cost: a reserve of k runs is O(k log E) (a cursor walks down by_size, and
 * each taken extent is erased from both sets); a free is O(log E) per run.
 * Nothing is proportional to N or to the run lengths. Memory is about 12 bytes
 * per free extent per set at the usual B+tree fill.
 *
 * Atomicity: every call validates and plans before it changes anything, and
 * reserves from the node pool, up front, every node its inserts can need; so a
 * call either succeeds or fails with the allocator as it was.
 */
#include <stdlib.h>
#include <string.h>

#include "../core/abi-int.h"
#include "kvtier/alloc.h"
#include "kvtier/error.h"
#include "../core/mem-int.h"
#include "../core/u64set-int.h"
#include "alloc-int.h"

/* Spare nodes kept between calls, so that calls do not reach malloc: at least
 * SPARE_KEEP, and up to 1/16 of the live nodes (a free of many runs sets
 * aside room for all its inserts, then uses little of it; a reserve that
 * takes many extents gives their nodes back). */
#define SPARE_KEEP 64
#define SPARE_KEEP_FRACTION 16

struct kvt_extalloc {
    uint64_t pages;
    uint64_t free_pages;
    kvt__nodepool_t pool;
    kvt__u64set_t by_size;
    kvt__u64set_t by_addr;
    uint64_t reserves, reserve_failures, frees, runs_reserved;
};

static inline uint64_t size_key(uint64_t start, uint64_t len) { return len << 32 | start; }
static inline uint64_t addr_key(uint64_t start, uint64_t len) { return start << 32 | len; }
static inline uint32_t key_hi(uint64_t k) { return (uint32_t)(k >> 32); }
static inline uint32_t key_lo(uint64_t k) { return (uint32_t)k; }

static void trim_spare(kvt_extalloc_t *a) {
    size_t keep = a->pool.live / SPARE_KEEP_FRACTION;
    kvt__nodepool_trim(&a->pool, keep > SPARE_KEEP ? keep : SPARE_KEEP);
}

static int reserve_nodes(kvt_extalloc_t *a, size_t size_inserts, size_t addr_inserts) {
    return kvt__nodepool_reserve(&a->pool, kvt__u64set_insert_bound(&a->by_size, size_inserts) +
                                               kvt__u64set_insert_bound(&a->by_addr, addr_inserts));
}

/* The steps below cannot fail: nodes were reserved and keys validated. */
static void add_extent(kvt_extalloc_t *a, uint64_t start, uint64_t len) {
    kvt__u64set_insert(&a->by_size, size_key(start, len));
    kvt__u64set_insert(&a->by_addr, addr_key(start, len));
}

static void remove_extent(kvt_extalloc_t *a, uint64_t start, uint64_t len) {
    kvt__u64set_erase(&a->by_size, size_key(start, len));
    kvt__u64set_erase(&a->by_addr, addr_key(start, len));
}

/* Turns free extent [start, start+len) into [nstart, nstart+nlen), where the
 * new extent covers no other extent's start (so by_addr's order holds). */
static void reshape_extent(kvt_extalloc_t *a, uint64_t start, uint64_t len, uint64_t nstart,
                           uint64_t nlen) {
    kvt__u64set_erase(&a->by_size, size_key(start, len));
    kvt__u64set_insert(&a->by_size, size_key(nstart, nlen));
    kvt__u64set_replace(&a->by_addr, addr_key(start, len), addr_key(nstart, nlen));
}

int kvt_extalloc_create(kvt_extalloc_t **out, uint64_t npages) {
    if (out == NULL || npages == 0 || npages > KVT_ALLOC_MAX_PAGES) return KVT_EINVAL;
    kvt_extalloc_t *a = KVT_NEW(kvt_extalloc_t);
    if (a == NULL) return KVT_ENOMEM;
    a->pages = npages;
    kvt__nodepool_init(&a->pool);
    kvt__u64set_init(&a->by_size, &a->pool);
    kvt__u64set_init(&a->by_addr, &a->pool);
    if (reserve_nodes(a, 1, 1) != KVT_OK) {
        KVT_DELETE(a);
        return KVT_ENOMEM;
    }
    add_extent(a, 0, npages);
    a->free_pages = npages;
    *out = a;
    return KVT_OK;
}

void kvt_extalloc_destroy(kvt_extalloc_t *a) {
    if (a == NULL) return;
    kvt__u64set_fini(&a->by_size);
    kvt__u64set_fini(&a->by_addr);
    kvt__nodepool_fini(&a->pool);
    KVT_DELETE(a);
}

/* Takes the first n pages of free extent (start, len). */
static void take_front(kvt_extalloc_t *a, uint64_t start, uint64_t len, uint64_t n) {
    if (n == len) remove_extent(a, start, len);
    else reshape_extent(a, start, len, start + n, len - n);
}

/* take_front for the extent under cur, a cursor of by_size: its size key is
 * erased where the cursor stands, without a second descent. */
static void take_front_at(kvt_extalloc_t *a, kvt__u64cur_t *cur, uint64_t start, uint64_t len, uint64_t n) {
    kvt__u64set_erase_at(&a->by_size, cur);
    if (n == len) {
        kvt__u64set_erase(&a->by_addr, addr_key(start, len));
        return;
    }
    kvt__u64set_insert(&a->by_size, size_key(start + n, len - n));
    kvt__u64set_replace(&a->by_addr, addr_key(start, len), addr_key(start + n, len - n));
}

static int fail_reserve(kvt_extalloc_t *a, int err) {
    if (err != KVT_EINVAL) a->reserve_failures++;
    return err;
}

int kvt_extalloc_reserve(kvt_extalloc_t *a, uint64_t n, kvt_run_t *runs, size_t max_runs,
                         size_t *nruns) {
    if (a == NULL || runs == NULL || nruns == NULL || n == 0 || max_runs == 0) return KVT_EINVAL;
    if (n > a->free_pages) return fail_reserve(a, KVT_ENOSPC);

    kvt__u64cur_t cur;
    size_t k = 0;
    uint64_t rest = n;
    if (!kvt__u64set_lower_bound(&a->by_size, size_key(0, n), &cur)) {
        /* Plan: whole extents, largest first, while each is smaller than what
         * is left. The walk ends when an extent can hold the rest. */
        kvt__u64set_last(&a->by_size, &cur);
        for (;;) {
            uint64_t key = kvt__u64cur_key(&cur);
            if (key_hi(key) >= rest) break;
            if (k + 1 >= max_runs) return fail_reserve(a, KVT_EFRAG);
            runs[k++] = (kvt_run_t){key_lo(key), key_hi(key)};
            rest -= key_hi(key);
            kvt__u64cur_prev(&cur); /* free_pages >= n: an extent remains */
        }
        /* Best fit for the rest; it lies below every extent taken above. */
        kvt__u64set_lower_bound(&a->by_size, size_key(0, rest), &cur);
    }
    uint64_t fit = kvt__u64cur_key(&cur);
    if (reserve_nodes(a, 1, 0) != KVT_OK) return fail_reserve(a, KVT_ENOMEM);

    /* The best fit first, while the cursor still holds its path in by_size. */
    take_front_at(a, &cur, key_lo(fit), key_hi(fit), rest);
    for (size_t i = 0; i < k; i++) remove_extent(a, runs[i].start, runs[i].len);
    runs[k++] = (kvt_run_t){key_lo(fit), (uint32_t)rest};
    *nruns = k;
    a->free_pages -= n;
    a->reserves++;
    a->runs_reserved += k;
    if (k > 1) trim_spare(a);
    return KVT_OK;
}

int kvt_extalloc_reserve_contiguous(kvt_extalloc_t *a, uint64_t n, kvt_run_t *run) {
    size_t k;
    return kvt_extalloc_reserve(a, n, run, 1, &k);
}

/* The free extent with the greatest start <= p (in *start, *len); true when
 * it contains p. */
static bool extent_at(const kvt_extalloc_t *a, uint64_t p, uint64_t *start, uint64_t *len) {
    kvt__u64cur_t cur;
    if (!kvt__u64set_last_below(&a->by_addr, (p + 1) << 32, &cur)) return false;
    uint64_t key = kvt__u64cur_key(&cur);
    *start = key_hi(key);
    *len = key_lo(key);
    return p < *start + *len;
}

bool kvt_extalloc_is_free(const kvt_extalloc_t *a, uint64_t page) {
    uint64_t s, l;
    return a != NULL && page < a->pages && extent_at(a, page, &s, &l);
}

int kvt_extalloc_reserve_at(kvt_extalloc_t *a, kvt_run_t run) {
    if (a == NULL || run.len == 0) return KVT_EINVAL;
    uint64_t end = (uint64_t)run.start + run.len;
    if (end > a->pages) return KVT_ERANGE;
    uint64_t s, l;
    if (!extent_at(a, run.start, &s, &l) || end > s + l) return fail_reserve(a, KVT_ERESERVED);
    uint64_t left = run.start - s, right = s + l - end;
    if (reserve_nodes(a, 2, 1) != KVT_OK) return fail_reserve(a, KVT_ENOMEM);
    if (left == 0) {
        take_front(a, s, l, run.len);
    } else {
        reshape_extent(a, s, l, s, left);
        if (right) add_extent(a, end, right);
    }
    a->free_pages -= run.len;
    a->reserves++;
    a->runs_reserved++;
    return KVT_OK;
}

static int cmp_plan_start(const void *x, const void *y) {
    uint32_t a = ((const kvt__free_plan_t *)x)->run.start, b = ((const kvt__free_plan_t *)y)->run.start;
    return (a > b) - (a < b);
}

/* Sorts plan[0..n) by run start (only .run need be set). */
static void sort_plan(kvt__free_plan_t *plan, size_t n) {
    if (n > 48) {
        qsort(plan, n, sizeof(*plan), cmp_plan_start);
        return;
    }
    for (size_t i = 1; i < n; i++) { /* insertion sort: the usual short lists */
        kvt__free_plan_t x = plan[i];
        size_t j = i;
        for (; j > 0 && plan[j - 1].run.start > x.run.start; j--) plan[j] = plan[j - 1];
        plan[j] = x;
    }
}

static kvt_run_t key_run(uint64_t by_addr_key) { return (kvt_run_t){key_hi(by_addr_key), key_lo(by_addr_key)}; }

int kvt__extalloc_free_validate(const kvt_extalloc_t *a, kvt__free_plan_t *plan, size_t n, size_t *m) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) { /* shape: lengths, range, overlaps; merge touching runs */
        kvt_run_t r = plan[i].run;
        uint64_t prev_end = k > 0 ? (uint64_t)plan[k - 1].run.start + plan[k - 1].run.len : 0;
        if (r.len == 0) return KVT_EINVAL;
        if ((uint64_t)r.start + r.len > a->pages) return KVT_ERANGE;
        if (k > 0 && prev_end > r.start) return KVT_EINVAL; /* listed twice */
        if (k > 0 && prev_end == r.start) plan[k - 1].run.len += r.len;
        else plan[k++].run = r;
    }
    for (size_t i = 0; i < k; i++) { /* every page reserved; note the neighbours */
        kvt__free_plan_t *p = &plan[i];
        uint64_t start = p->run.start, end = start + p->run.len;
        kvt__u64cur_t cur;
        p->left = p->right = (kvt_run_t){0, 0};
        bool found = kvt__u64set_lower_bound(&a->by_addr, end << 32, &cur);
        if (found && key_hi(kvt__u64cur_key(&cur)) == end) p->right = key_run(kvt__u64cur_key(&cur));
        if (found ? kvt__u64cur_prev(&cur) : kvt__u64set_last(&a->by_addr, &cur)) {
            /* the last extent starting below end: it must end at or before start */
            kvt_run_t l = key_run(kvt__u64cur_key(&cur));
            uint64_t l_end = (uint64_t)l.start + l.len;
            if (l_end > start) return KVT_ENOTRESV;
            if (l_end == start) p->left = l;
        }
    }
    *m = k;
    return KVT_OK;
}

int kvt__extalloc_free_prepare(kvt_extalloc_t *a, size_t m) {
    return reserve_nodes(a, m, m) == KVT_OK ? KVT_OK : KVT_ENOMEM;
}

void kvt__extalloc_free_apply(kvt_extalloc_t *a, const kvt__free_plan_t *plan, size_t m) {
    kvt_run_t made = {0, 0}; /* the extent the previous run ended up in */
    for (size_t i = 0; i < m; i++) {
        kvt_run_t r = plan[i].run, l = plan[i].left, rt = plan[i].right;
        /* Runs are sorted and never touch, so the only neighbour an earlier run
         * can have changed is the free extent between the two, now in `made`. */
        if (l.len && i > 0 && plan[i - 1].right.len && plan[i - 1].right.start == l.start) l = made;
        if (l.len && rt.len) {
            remove_extent(a, rt.start, rt.len);
            made = (kvt_run_t){l.start, l.len + r.len + rt.len};
            reshape_extent(a, l.start, l.len, made.start, made.len);
        } else if (l.len) {
            made = (kvt_run_t){l.start, l.len + r.len};
            reshape_extent(a, l.start, l.len, made.start, made.len);
        } else if (rt.len) {
            made = (kvt_run_t){r.start, r.len + rt.len};
            reshape_extent(a, rt.start, rt.len, made.start, made.len);
        } else {
            made = r;
            add_extent(a, r.start, r.len);
        }
        a->free_pages += r.len;
    }
    a->frees++;
    trim_spare(a);
}

int kvt__extalloc_prepare_reserve(kvt_extalloc_t *a) {
    return reserve_nodes(a, 1, 0) == KVT_OK ? KVT_OK : KVT_ENOMEM;
}

int kvt_extalloc_free(kvt_extalloc_t *a, const kvt_run_t *runs, size_t nruns) {
    if (a == NULL || runs == NULL || nruns == 0) return KVT_EINVAL;
    kvt__free_plan_t local[32], *plan = local;
    if (nruns > 32) {
        if (nruns > SIZE_MAX / sizeof(*plan)) return KVT_EINVAL;
        plan = kvt__malloc(nruns * sizeof(*plan));
        if (plan == NULL) return KVT_ENOMEM;
    }
    for (size_t i = 0; i < nruns; i++) plan[i].run = runs[i];
    sort_plan(plan, nruns);
    size_t m = 0;
    int rc = kvt__extalloc_free_validate(a, plan, nruns, &m);
    if (rc == KVT_OK) rc = kvt__extalloc_free_prepare(a, m);
    if (rc == KVT_OK) kvt__extalloc_free_apply(a, plan, m);
    if (plan != local) kvt__free(plan, nruns * sizeof(*plan));
    return rc;
}

size_t kvt_extalloc_free_extents(const kvt_extalloc_t *a, kvt_run_t *out, size_t cap) {
    if (a == NULL) return 0;
    kvt__u64cur_t cur;
    size_t i = 0;
    for (bool ok = kvt__u64set_first(&a->by_addr, &cur); ok && i < cap; ok = kvt__u64cur_next(&cur), i++) {
        uint64_t key = kvt__u64cur_key(&cur);
        out[i] = (kvt_run_t){key_hi(key), key_lo(key)};
    }
    return a->by_addr.count;
}

int kvt_extalloc_stats(const kvt_extalloc_t *a, kvt_extalloc_stats_t *out) {
    if (a == NULL || out == NULL) return KVT_EINVAL;
    kvt_extalloc_stats_t full = {.size = sizeof(full)}, *st = &full;
    kvt__u64cur_t cur;
    st->pages = a->pages;
    st->free_pages = a->free_pages;
    st->free_extents = a->by_addr.count;
    st->largest_free_run = kvt__u64set_last(&a->by_size, &cur) ? key_hi(kvt__u64cur_key(&cur)) : 0;
    st->metadata_bytes = sizeof(*a) + kvt__nodepool_bytes(&a->pool);
    st->reserves = a->reserves;
    st->reserve_failures = a->reserve_failures;
    st->frees = a->frees;
    st->runs_reserved = a->runs_reserved;
    return kvt__abi_out(out, st, sizeof(*st));
}

/* *why (when not NULL) names the first broken invariant, or is NULL. */
#define BROKEN(what) return (why ? *why = (what) : 0), KVT_ECORRUPT

int kvt_extalloc_check(const kvt_extalloc_t *a, const char **why) {
    if (why) *why = NULL;
    if (a == NULL) return KVT_EINVAL;
    if (kvt__u64set_check(&a->by_size, NULL) || kvt__u64set_check(&a->by_addr, NULL)) BROKEN("a free-extent index is malformed");
    if (a->by_size.count != a->by_addr.count) BROKEN("the two free-extent indexes differ in size");
    kvt__u64cur_t cur;
    uint64_t sum = 0, prev_end = 0;
    bool first = true;
    for (bool ok = kvt__u64set_first(&a->by_addr, &cur); ok; ok = kvt__u64cur_next(&cur)) {
        uint64_t key = kvt__u64cur_key(&cur), s = key_hi(key), l = key_lo(key);
        if (l == 0 || s + l > a->pages) BROKEN("a free extent is empty or outside the pool");
        if (!first && s <= prev_end) BROKEN("free extents overlap or are not coalesced");
        if (!kvt__u64set_contains(&a->by_size, size_key(s, l))) BROKEN("a free extent is missing from the size index");
        sum += l;
        prev_end = s + l;
        first = false;
    }
    if (sum != a->free_pages) BROKEN("the free-page count differs from the free extents");
    return KVT_OK;
}
#undef BROKEN
