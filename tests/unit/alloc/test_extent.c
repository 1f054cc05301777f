/* The extent allocator against the plain-array model (model.h). */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "core/mem-int.h"
#include "kvtier/rng.h"
#include "kvtier/alloc.h"
#include "kvtier/error.h"
#include "kvtier/mem.h"
#include "model.h"

/* Runs the test holds: pages it reserved and has not freed. */
typedef struct held {
    kvt_run_t *r;
    size_t n, cap;
} held_t;

static void held_push(held_t *h, kvt_run_t r) {
    if (h->n == h->cap) h->r = realloc(h->r, (h->cap = h->cap ? h->cap * 2 : 64) * sizeof(kvt_run_t));
    h->r[h->n++] = r;
}

static kvt_run_t held_take(held_t *h, size_t i) {
    kvt_run_t r = h->r[i];
    h->r[i] = h->r[--h->n];
    return r;
}

static void assert_same_state(kvt_extalloc_t *a, const model_t *m, const char *ctx) {
    static kvt_run_t want[1 << 16], got[1 << 16];
    size_t nw = model_runs(m, want);
    size_t ng = kvt_extalloc_free_extents(a, got, 1 << 16);
    cr_assert_eq(ng, nw, "%s: %zu free extents, model has %zu", ctx, ng, nw);
    for (size_t i = 0; i < nw; i++)
        cr_assert(got[i].start == want[i].start && got[i].len == want[i].len,
                  "%s: extent %zu is [%u,+%u), model [%u,+%u)", ctx, i, got[i].start, got[i].len, want[i].start,
                  want[i].len);
    kvt_extalloc_stats_t st = {.size = sizeof(st)};
    cr_assert_eq(kvt_extalloc_stats(a, &st), KVT_OK);
    cr_assert_eq(st.free_pages, m->free, "%s: free pages", ctx);
    cr_assert_eq(st.free_extents, nw, "%s: free extents", ctx);
    uint64_t largest = 0;
    for (size_t i = 0; i < nw; i++)
        if (want[i].len > largest) largest = want[i].len;
    cr_assert_eq(st.largest_free_run, largest, "%s: largest free run", ctx);
    cr_assert_eq(kvt_extalloc_check(a, NULL), KVT_OK, "%s: check", ctx);
}

static uint64_t log_uniform(kvt_rng_t *rng, uint64_t max) {
    uint64_t v = (uint64_t)exp(kvt_rng_unit(rng) * log((double)max + 1));
    return v < 1 ? 1 : v > max ? max : v;
}

/* One randomized run: `ops` operations on a pool of `pages`, every result
 * compared with the model. */
static void fuzz(uint64_t pages, uint64_t ops, uint64_t seed) {
    fprintf(stderr, "extent fuzz: pages=%" PRIu64 " ops=%" PRIu64 " seed=%" PRIu64 "\n", pages, ops, seed);
    kvt_rng_t rng;
    kvt_rng_seed(&rng, seed);
    kvt_extalloc_t *a;
    cr_assert_eq(kvt_extalloc_create(&a, pages), KVT_OK);
    model_t m;
    model_init(&m, pages);
    held_t held = {0};
    kvt_run_t got[256], want[256];
    char ctx[128];
    uint64_t ok = 0, multi = 0, enospc = 0, efrag = 0;
    double free_sum = 0;

    for (uint64_t op = 0; op < ops; op++) {
        snprintf(ctx, sizeof(ctx), "seed %" PRIu64 " op %" PRIu64, seed, op);
        /* Occupancy follows a slow wave between 10 % and 90 % free, so every
         * fill level (and the cliff at both ends) is visited many times. */
        double target = 0.5 + 0.4 * sin((double)op / 2000.0), free_frac = (double)m.free / (double)pages;
        free_sum += free_frac;
        uint64_t dice = kvt_rng_below(&rng, 100);
        bool want_reserve = kvt_rng_below(&rng, 100) < (free_frac > target ? 85u : 15u);
        if (dice < 80) dice = want_reserve ? 0 : 60; /* reserve or free */
        else dice = dice - 80 + 40;                  /* 40..59: the other calls */
        if (dice < 40) { /* reserve */
            uint64_t n = log_uniform(&rng, pages / 8 + 1);
            size_t max_runs = kvt_rng_below(&rng, 4) == 0 ? 1 + kvt_rng_below(&rng, 3) : 256;
            size_t kg = 0, kw = 0;
            int rg = kvt_extalloc_reserve(a, n, got, max_runs, &kg);
            int rw = model_reserve(&m, n, want, max_runs, &kw);
            cr_assert_eq(rg, rw, "%s: reserve(%" PRIu64 ", %zu) returned %s, model %s", ctx, n, max_runs,
                         kvt_err_name(rg), kvt_err_name(rw));
            ok += rg == KVT_OK;
            multi += rg == KVT_OK && kg > 1;
            enospc += rg == KVT_ENOSPC;
            efrag += rg == KVT_EFRAG;
            if (rg == KVT_OK) {
                cr_assert_eq(kg, kw, "%s: %zu runs, model %zu", ctx, kg, kw);
                for (size_t i = 0; i < kg; i++) {
                    cr_assert(got[i].start == want[i].start && got[i].len == want[i].len,
                              "%s: run %zu [%u,+%u), model [%u,+%u)", ctx, i, got[i].start, got[i].len,
                              want[i].start, want[i].len);
                    held_push(&held, got[i]);
                }
            }
        } else if (dice < 46) { /* reserve_contiguous */
            uint64_t n = log_uniform(&rng, pages / 8 + 1);
            size_t kw = 0;
            int rg = kvt_extalloc_reserve_contiguous(a, n, got);
            int rw = model_reserve(&m, n, want, 1, &kw);
            cr_assert_eq(rg, rw, "%s: reserve_contiguous(%" PRIu64 ")", ctx, n);
            if (rg == KVT_OK) {
                cr_assert(got[0].start == want[0].start && got[0].len == n, "%s", ctx);
                held_push(&held, got[0]);
            }
        } else if (dice < 52) { /* reserve_at, often on reserved pages */
            uint64_t len = log_uniform(&rng, 64);
            uint64_t start = kvt_rng_below(&rng, pages);
            if (start + len > pages && kvt_rng_below(&rng, 2)) len = pages - start;
            kvt_run_t r = {(uint32_t)start, (uint32_t)len};
            int rg = kvt_extalloc_reserve_at(a, r);
            int rw = model_reserve_at(&m, r);
            cr_assert_eq(rg, rw, "%s: reserve_at([%u,+%u)) %s, model %s", ctx, r.start, r.len, kvt_err_name(rg),
                         kvt_err_name(rw));
            if (rg == KVT_OK) held_push(&held, r);
        } else if (dice >= 60 && held.n > 0) { /* free 1-8 held runs, maybe pieces of them */
            size_t k = 1 + (size_t)kvt_rng_below(&rng, 8);
            size_t nf = 0;
            for (size_t i = 0; i < k && held.n > 0; i++) {
                kvt_run_t r = held_take(&held, (size_t)kvt_rng_below(&rng, held.n));
                if (r.len > 1 && kvt_rng_below(&rng, 3) == 0) { /* free a middle piece, keep the ends */
                    uint32_t a0 = (uint32_t)kvt_rng_below(&rng, r.len);
                    uint32_t b0 = a0 + 1 + (uint32_t)kvt_rng_below(&rng, r.len - a0);
                    if (a0 > 0) held_push(&held, (kvt_run_t){r.start, a0});
                    if (b0 < r.len) held_push(&held, (kvt_run_t){r.start + b0, r.len - b0});
                    r = (kvt_run_t){r.start + a0, b0 - a0};
                }
                got[nf++] = r;
            }
            int rg = kvt_extalloc_free(a, got, nf);
            int rw = model_free(&m, got, nf);
            cr_assert_eq(rg, KVT_OK, "%s: free of held runs: %s", ctx, kvt_err_name(rg));
            cr_assert_eq(rw, KVT_OK, "%s: model free", ctx);
        } else if (dice < 60) { /* an invalid free: must fail and change nothing */
            kvt_run_t bad[3];
            size_t nb = 1;
            int fault = (int)kvt_rng_below(&rng, 4);
            if (fault == 0) bad[0] = (kvt_run_t){(uint32_t)kvt_rng_below(&rng, pages), 0};
            else if (fault == 1) bad[0] = (kvt_run_t){(uint32_t)(pages - 1), 2};
            else if (fault == 2 && m.free > 0) { /* a range containing a free page */
                uint64_t p;
                do p = kvt_rng_below(&rng, pages);
                while (m.used[p]);
                uint64_t lo = p > 3 ? p - 3 : 0;
                bad[0] = (kvt_run_t){(uint32_t)lo, (uint32_t)(p - lo + 1)};
            } else if (held.n > 0) { /* the same held run twice */
                bad[0] = bad[1] = held.r[kvt_rng_below(&rng, held.n)];
                nb = 2;
            } else {
                continue;
            }
            int rg = kvt_extalloc_free(a, bad, nb);
            int rw = model_free(&m, bad, nb);
            cr_assert_neq(rw, KVT_OK, "%s: the model accepted a bad free", ctx);
            cr_assert_eq(rg, rw, "%s: bad free (fault %d) gave %s, model %s", ctx, fault, kvt_err_name(rg),
                         kvt_err_name(rw));
        }
        kvt_extalloc_stats_t st = {.size = sizeof(st)};
        kvt_extalloc_stats(a, &st);
        cr_assert_eq(st.free_pages, m.free, "%s: free pages", ctx);
        if (op % 97 == 0) assert_same_state(a, &m, ctx);
    }
    assert_same_state(a, &m, "end");
    fprintf(stderr, "extent fuzz seed %" PRIu64 ": %" PRIu64 " reserves ok (%" PRIu64 " multi-run), %" PRIu64
            " ENOSPC, %" PRIu64 " EFRAG; mean free %.2f\n", seed, ok, multi, enospc, efrag, free_sum / (double)ops);
    cr_assert(ok > ops / 10 && multi > 0 && enospc > 0 && efrag > 0, "the workload reached every outcome");
    free(held.r);
    model_fini(&m);
    kvt_extalloc_destroy(a);
}

/* 1.2 million operations in all, over pool sizes from tiny to a few
 * thousand pages (small pools keep the model cheap and collisions common). */
Test(extent, model_fuzz_small, .timeout = 300) {
    fuzz(37, 200000, 1);
    fuzz(256, 200000, 2);
}
Test(extent, model_fuzz_medium, .timeout = 300) {
    fuzz(1000, 300000, 3);
    fuzz(4099, 200000, 4);
}
Test(extent, model_fuzz_more_seeds, .timeout = 300) {
    for (uint64_t seed = 100; seed < 110; seed++) fuzz(64 + seed * 13, 30000, seed);
}

Test(extent, best_fit_lowest_address_and_largest_first) {
    kvt_extalloc_t *a;
    cr_assert_eq(kvt_extalloc_create(&a, 20), KVT_OK);
    /* free extents after this: [2,4) [6,12) [14,15) [17,20) */
    kvt_run_t taken[] = {{0, 2}, {4, 2}, {12, 2}, {15, 2}};
    for (int i = 0; i < 4; i++) cr_assert_eq(kvt_extalloc_reserve_at(a, taken[i]), KVT_OK);
    kvt_run_t r[8];
    size_t k;
    /* n = 2: best fit is [2,4) (length 2), not the lower-addressed longer one */
    cr_assert_eq(kvt_extalloc_reserve(a, 2, r, 8, &k), KVT_OK);
    cr_assert(k == 1 && r[0].start == 2 && r[0].len == 2);
    /* n = 3: best fit [17,20) (length 3) over [6,12) */
    cr_assert_eq(kvt_extalloc_reserve(a, 3, r, 8, &k), KVT_OK);
    cr_assert(k == 1 && r[0].start == 17 && r[0].len == 3);
    /* n = 7 with [6,12) and [14,15) left: largest first, then the rest */
    cr_assert_eq(kvt_extalloc_reserve(a, 7, r, 1, &k), KVT_EFRAG);
    cr_assert_eq(kvt_extalloc_reserve(a, 8, r, 8, &k), KVT_ENOSPC);
    cr_assert_eq(kvt_extalloc_reserve(a, 7, r, 2, &k), KVT_OK);
    cr_assert(k == 2 && r[0].start == 6 && r[0].len == 6 && r[1].start == 14 && r[1].len == 1);
    kvt_extalloc_stats_t st = {.size = sizeof(st)};
    kvt_extalloc_stats(a, &st);
    cr_assert_eq(st.free_pages, 0);
    cr_assert_eq(st.reserve_failures, 2);
    /* freeing everything coalesces back to one extent */
    kvt_run_t all = {0, 20};
    cr_assert_eq(kvt_extalloc_free(a, &all, 1), KVT_OK);
    kvt_extalloc_stats(a, &st);
    cr_assert(st.free_extents == 1 && st.largest_free_run == 20);
    cr_assert_eq(kvt_extalloc_free(a, &all, 1), KVT_ENOTRESV);
    kvt_extalloc_destroy(a);
}

Test(extent, bad_arguments) {
    kvt_extalloc_t *a;
    cr_assert_eq(kvt_extalloc_create(&a, 0), KVT_EINVAL);
    cr_assert_eq(kvt_extalloc_create(&a, (uint64_t)UINT32_MAX + 1), KVT_EINVAL);
    cr_assert_eq(kvt_extalloc_create(NULL, 10), KVT_EINVAL);
    cr_assert_eq(kvt_extalloc_create(&a, 10), KVT_OK);
    kvt_run_t r[2];
    size_t k;
    cr_assert_eq(kvt_extalloc_reserve(a, 0, r, 2, &k), KVT_EINVAL);
    cr_assert_eq(kvt_extalloc_reserve(a, 1, r, 0, &k), KVT_EINVAL);
    cr_assert_eq(kvt_extalloc_reserve(a, 1, NULL, 1, &k), KVT_EINVAL);
    cr_assert_eq(kvt_extalloc_reserve_at(a, (kvt_run_t){9, 2}), KVT_ERANGE);
    cr_assert_eq(kvt_extalloc_reserve_at(a, (kvt_run_t){3, 0}), KVT_EINVAL);
    cr_assert_eq(kvt_extalloc_free(a, r, 0), KVT_EINVAL);
    cr_assert(!kvt_extalloc_is_free(a, 10));
    cr_assert(kvt_extalloc_is_free(a, 9));
    kvt_extalloc_stats_t st = {.size = 2}; /* smaller than its own size field (the ABI rule: tests/unit/core/test_abi.c) */
    cr_assert_eq(kvt_extalloc_stats(a, &st), KVT_EINVAL);
    kvt_extalloc_destroy(a);
}

/* Two instances fed the same calls hand out the same pages. */
Test(extent, deterministic) {
    kvt_extalloc_t *a, *b;
    cr_assert_eq(kvt_extalloc_create(&a, 5000), KVT_OK);
    cr_assert_eq(kvt_extalloc_create(&b, 5000), KVT_OK);
    kvt_rng_t rng;
    kvt_rng_seed(&rng, 7);
    held_t held = {0};
    kvt_run_t ra[64], rb[64];
    for (int op = 0; op < 50000; op++) {
        if (kvt_rng_below(&rng, 2) || held.n == 0) {
            uint64_t n = 1 + kvt_rng_below(&rng, 200);
            size_t ka = 0, kb = 0;
            int x = kvt_extalloc_reserve(a, n, ra, 64, &ka), y = kvt_extalloc_reserve(b, n, rb, 64, &kb);
            cr_assert_eq(x, y);
            cr_assert_eq(ka, kb);
            cr_assert(memcmp(ra, rb, ka * sizeof(kvt_run_t)) == 0, "op %d: instances disagree", op);
            for (size_t i = 0; i < ka; i++) held_push(&held, ra[i]);
        } else {
            kvt_run_t r = held_take(&held, (size_t)kvt_rng_below(&rng, held.n));
            cr_assert_eq(kvt_extalloc_free(a, &r, 1), KVT_OK);
            cr_assert_eq(kvt_extalloc_free(b, &r, 1), KVT_OK);
        }
    }
    free(held.r);
    kvt_extalloc_destroy(a);
    kvt_extalloc_destroy(b);
}

/* ---- failure injection: every allocation a call makes may fail; a failed
 * call must leave the allocator exactly as it was ---- */

typedef struct snapshot {
    kvt_run_t *ext;
    size_t n;
    kvt_extalloc_stats_t st;
} snapshot_t;

static snapshot_t snap(const kvt_extalloc_t *a) {
    snapshot_t s = {.st.size = sizeof(kvt_extalloc_stats_t)};
    size_t n = kvt_extalloc_free_extents(a, NULL, 0);
    s.ext = malloc((n + 1) * sizeof(kvt_run_t));
    s.n = kvt_extalloc_free_extents(a, s.ext, n);
    kvt_extalloc_stats(a, &s.st);
    return s;
}

static void assert_snap_eq(const snapshot_t *x, const snapshot_t *y, uint64_t nth) {
    cr_assert_eq(x->n, y->n, "failure at allocation %" PRIu64 " changed the extents", nth);
    cr_assert(memcmp(x->ext, y->ext, x->n * sizeof(kvt_run_t)) == 0, "failure at %" PRIu64 " changed extents", nth);
    cr_assert_eq(x->st.free_pages, y->st.free_pages);
    cr_assert_eq(x->st.reserves, y->st.reserves);
    cr_assert_eq(x->st.frees, y->st.frees);
    cr_assert_eq(x->st.runs_reserved, y->st.runs_reserved);
}

/* A pool of `pages` with every third page free: many extents, many nodes. */
static kvt_extalloc_t *fragmented(uint64_t pages) {
    kvt_extalloc_t *a;
    cr_assert_eq(kvt_extalloc_create(&a, pages), KVT_OK);
    cr_assert_eq(kvt_extalloc_reserve_at(a, (kvt_run_t){0, (uint32_t)pages}), KVT_OK);
    for (uint32_t p = 0; p < pages; p += 3) cr_assert_eq(kvt_extalloc_free(a, &(kvt_run_t){p, 1}, 1), KVT_OK);
    return a;
}

typedef int (*op_fn)(kvt_extalloc_t *a, void *arg);

/* Fails the 1st, 2nd, ... allocation of op until op runs without a failure
 * (every point up to 16, then every 37th: the later ones take the same paths). */
static void each_failure_point(op_fn op, void *arg, uint64_t pages) {
    for (uint64_t nth = 1;; nth += nth < 16 ? 1 : 37) {
        kvt_extalloc_t *a = fragmented(pages);
        snapshot_t before = snap(a);
        kvt__mem_fail_nth(nth);
        int rc = op(a, arg);
        int fired = kvt__mem_fail_fired();
        kvt__mem_fail_nth(0);
        if (fired) {
            cr_assert_eq(rc, KVT_ENOMEM, "allocation %" PRIu64 " failed but the call returned %s", nth, kvt_err_name(rc));
            snapshot_t after = snap(a);
            assert_snap_eq(&before, &after, nth);
            cr_assert_eq(kvt_extalloc_check(a, NULL), KVT_OK);
            free(after.ext);
        } else {
            cr_assert_eq(rc, KVT_OK, "with no failure the call returned %s", kvt_err_name(rc));
        }
        free(before.ext);
        kvt_extalloc_destroy(a);
        if (!fired) break;
        cr_assert_lt(nth, 100000);
    }
}

/* Free every other reserved page: hundreds of isolated runs in one call. */
static int op_free_many(kvt_extalloc_t *a, void *arg) {
    uint64_t pages = *(uint64_t *)arg;
    size_t n = 0;
    kvt_run_t *r = malloc(pages * sizeof(kvt_run_t));
    for (uint32_t p = 1; p < pages; p += 3) r[n++] = (kvt_run_t){p, 1};
    int rc = kvt_extalloc_free(a, r, n);
    free(r);
    return rc;
}

static int op_reserve_at_many(kvt_extalloc_t *a, void *arg) {
    int rc = KVT_OK;
    /* split a long free extent many times: each call may need new nodes */
    uint32_t pages = *(uint64_t *)arg;
    for (uint32_t p = 1; p < pages; p += 3) /* make the pool one free extent */
        if ((rc = kvt_extalloc_free(a, &(kvt_run_t){p, 2}, 1)) != KVT_OK) return rc;
    for (uint32_t p = 5; p < pages && rc == KVT_OK; p += 7) rc = kvt_extalloc_reserve_at(a, (kvt_run_t){p, 1});
    return rc;
}

static int op_reserve_big(kvt_extalloc_t *a, void *arg) {
    (void)arg;
    kvt_run_t r[4096];
    size_t k;
    return kvt_extalloc_reserve(a, 500, r, 4096, &k); /* 1000 single pages are free */
}

Test(extent, failed_allocation_changes_nothing, .timeout = 120) {
    uint64_t pages = 3000;
    each_failure_point(op_free_many, &pages, pages);
    each_failure_point(op_reserve_big, NULL, pages);
    /* op_reserve_at_many is a sequence of calls; each must be atomic */
    for (uint64_t nth = 1; nth < 400; nth += 7) {
        kvt_extalloc_t *a = fragmented(pages);
        kvt__mem_fail_nth(nth);
        int rc = op_reserve_at_many(a, &pages);
        kvt__mem_fail_nth(0);
        cr_assert(rc == KVT_OK || rc == KVT_ENOMEM);
        cr_assert_eq(kvt_extalloc_check(a, NULL), KVT_OK);
        kvt_extalloc_destroy(a);
    }
    /* create itself */
    for (uint64_t nth = 1; nth < 5; nth++) {
        kvt_extalloc_t *a = NULL;
        kvt__mem_fail_nth(nth);
        int rc = kvt_extalloc_create(&a, 100);
        kvt__mem_fail_nth(0);
        if (rc == KVT_OK) kvt_extalloc_destroy(a);
        else cr_assert_eq(rc, KVT_ENOMEM);
    }
}

/* The metadata figure is real memory: it tracks what the hook counted. */
Test(extent, metadata_bytes_match_the_allocation_hook) {
    kvt_mem_stats_t m0 = {.size = sizeof(m0)}, m1 = {.size = sizeof(m1)};
    kvt_mem_stats(&m0);
    kvt_extalloc_t *a = fragmented(100000);
    kvt_mem_stats(&m1);
    kvt_extalloc_stats_t st = {.size = sizeof(st)};
    kvt_extalloc_stats(a, &st);
    cr_assert_eq((int64_t)st.metadata_bytes, m1.live_bytes - m0.live_bytes);
    cr_assert_eq(st.free_extents, 33334);
    kvt_extalloc_destroy(a);
}

/* A free of many runs sets aside about the nodes the trees can hold, not a
 * split at every level of every run (100,000 runs: some 400 MB), and a
 * reserve that takes many extents gives their nodes back to the spare
 * count's bound. */
Test(extent, many_runs_cost_memory_in_proportion) {
    const size_t n = 100000;
    kvt_extalloc_t *a;
    cr_assert_eq(kvt_extalloc_create(&a, 3 * n), KVT_OK);
    cr_assert_eq(kvt_extalloc_reserve_at(a, (kvt_run_t){0, (uint32_t)(3 * n)}), KVT_OK);
    kvt_run_t *runs = malloc(n * sizeof(*runs));
    for (size_t i = 0; i < n; i++) runs[i] = (kvt_run_t){(uint32_t)(3 * i), 1};
    kvt_mem_stats_t m0 = {.size = sizeof(m0)}, m1 = {.size = sizeof(m1)};
    kvt_mem_stats(&m0);
    cr_assert_lt(m0.peak_bytes, m0.live_bytes + (32 << 20), "the peak below is this test's");
    cr_assert_eq(kvt_extalloc_free(a, runs, n), KVT_OK);
    kvt_mem_stats(&m1);
    cr_assert_lt(m1.peak_bytes - m0.live_bytes, 32 << 20, "%" PRId64 " bytes at the peak of the free",
                 m1.peak_bytes - m0.live_bytes);
    kvt_extalloc_stats_t st = {.size = sizeof(st)};
    kvt_extalloc_stats(a, &st);
    cr_assert_eq(st.free_extents, n);
    uint64_t held = st.metadata_bytes;
    size_t k;
    cr_assert_eq(kvt_extalloc_reserve(a, n, runs, n, &k), KVT_OK); /* every free extent: the trees empty */
    cr_assert_eq(k, n);
    kvt_extalloc_stats(a, &st);
    cr_assert_lt(st.metadata_bytes, held / 16, "%" PRIu64 " bytes kept of %" PRIu64, st.metadata_bytes, held);
    free(runs);
    kvt_extalloc_destroy(a);
}
