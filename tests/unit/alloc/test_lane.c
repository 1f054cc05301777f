/* The lane allocator against a model built from per-lane plain arrays. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>

#include "core/mem-int.h"
#include "kvtier/rng.h"
#include "kvtier/alloc.h"
#include "kvtier/error.h"
#include "model.h"

typedef struct lane_model {
    uint32_t lanes, next;
    uint64_t pages;
    model_t *lane;
} lane_model_t;

static void lm_init(lane_model_t *lm, uint64_t pages, uint32_t lanes) {
    lm->lanes = lanes;
    lm->next = 0;
    lm->pages = pages;
    lm->lane = calloc(lanes, sizeof(model_t));
    for (uint32_t l = 0; l < lanes; l++) model_init(&lm->lane[l], (pages - l + lanes - 1) / lanes);
}

static void lm_fini(lane_model_t *lm) {
    for (uint32_t l = 0; l < lm->lanes; l++) model_fini(&lm->lane[l]);
    free(lm->lane);
}

/* The rule of alloc.h, by brute force: rotation shares; a short lane's
 * deficit goes to the next lanes in rotation with room; each lane reserves
 * its share by the extent rule; pages are dealt in rotation over the lanes
 * that still have some of their share. */
static int lm_reserve(lane_model_t *lm, uint64_t n, uint32_t *out) {
    uint64_t share[64] = {0}, total = 0, deficit = 0;
    for (uint64_t i = 0; i < n; i++) share[(lm->next + i) % lm->lanes]++;
    for (uint32_t j = 0; j < lm->lanes; j++) {
        uint32_t l = (lm->next + j) % lm->lanes;
        total += lm->lane[l].free;
        if (share[l] > lm->lane[l].free) deficit += share[l] - lm->lane[l].free, share[l] = lm->lane[l].free;
    }
    if (total < n) return KVT_ENOSPC;
    for (uint32_t j = 0; j < lm->lanes; j++) {
        uint32_t l = (lm->next + j) % lm->lanes;
        while (deficit > 0 && share[l] < lm->lane[l].free) share[l]++, deficit--;
    }
    uint32_t *local[64];
    uint64_t used[64] = {0};
    kvt_run_t *runs = malloc((n + 1) * sizeof(kvt_run_t));
    for (uint32_t l = 0; l < lm->lanes; l++) {
        local[l] = malloc((share[l] + 1) * sizeof(uint32_t));
        if (share[l] == 0) continue;
        size_t k = 0;
        cr_assert_eq(model_reserve(&lm->lane[l], share[l], runs, share[l], &k), KVT_OK);
        uint64_t m = 0;
        for (size_t r = 0; r < k; r++)
            for (uint32_t j = 0; j < runs[r].len; j++) local[l][m++] = runs[r].start + j;
    }
    uint32_t l = lm->next;
    for (uint64_t i = 0; i < n; l = (l + 1) % lm->lanes)
        if (used[l] < share[l]) out[i++] = local[l][used[l]++] * lm->lanes + l;
    for (uint32_t k = 0; k < lm->lanes; k++) free(local[k]);
    free(runs);
    lm->next = (uint32_t)((lm->next + n) % lm->lanes);
    return KVT_OK;
}

static void lm_free(lane_model_t *lm, const uint32_t *pages, size_t n) {
    for (size_t i = 0; i < n; i++) {
        model_t *m = &lm->lane[pages[i] % lm->lanes];
        cr_assert(m->used[pages[i] / lm->lanes], "model: page %u not reserved", pages[i]);
        m->used[pages[i] / lm->lanes] = 0;
        m->free++;
    }
}

typedef struct alloc_rec {
    uint32_t *p;
    size_t n;
} alloc_rec_t;

static void lane_fuzz(uint64_t pages, uint32_t lanes, int ops, uint64_t seed) {
    fprintf(stderr, "lane fuzz: pages=%" PRIu64 " lanes=%u seed=%" PRIu64 "\n", pages, lanes, seed);
    kvt_rng_t rng;
    kvt_rng_seed(&rng, seed);
    kvt_laneal_t *la;
    cr_assert_eq(kvt_laneal_create(&la, pages, lanes), KVT_OK);
    lane_model_t lm;
    lm_init(&lm, pages, lanes);
    alloc_rec_t *live = calloc((size_t)ops + 1, sizeof(*live));
    size_t nlive = 0;
    uint32_t *got = malloc(pages * sizeof(uint32_t)), *want = malloc(pages * sizeof(uint32_t));
    for (int op = 0; op < ops; op++) {
        if (kvt_rng_below(&rng, 100) < 55 || nlive == 0) {
            uint64_t n = 1 + kvt_rng_below(&rng, pages / 6 + 1);
            int rg = kvt_laneal_reserve(la, n, got);
            int rw = lm_reserve(&lm, n, want);
            cr_assert_eq(rg, rw, "seed %" PRIu64 " op %d: reserve(%" PRIu64 ") %s, model %s", seed, op, n,
                         kvt_err_name(rg), kvt_err_name(rw));
            if (rg == KVT_OK) {
                cr_assert(memcmp(got, want, n * sizeof(uint32_t)) == 0, "seed %" PRIu64 " op %d: pages differ", seed, op);
                live[nlive].p = malloc(n * sizeof(uint32_t));
                memcpy(live[nlive].p, got, n * sizeof(uint32_t));
                live[nlive++].n = n;
            }
        } else {
            size_t i = (size_t)kvt_rng_below(&rng, nlive);
            size_t n = live[i].n;
            if (n > 1 && kvt_rng_below(&rng, 3) == 0) { /* free part of it */
                size_t cut = 1 + (size_t)kvt_rng_below(&rng, n - 1);
                cr_assert_eq(kvt_laneal_free(la, live[i].p + cut, n - cut), KVT_OK);
                lm_free(&lm, live[i].p + cut, n - cut);
                live[i].n = cut;
            } else {
                if (kvt_rng_below(&rng, 3) == 0) /* tail first, as an eviction gives a node's pages back */
                    for (size_t a = 0, b = n - 1; a < b; a++, b--) {
                        uint32_t x = live[i].p[a];
                        live[i].p[a] = live[i].p[b];
                        live[i].p[b] = x;
                    }
                cr_assert_eq(kvt_laneal_free(la, live[i].p, n), KVT_OK);
                lm_free(&lm, live[i].p, n);
                free(live[i].p);
                live[i] = live[--nlive];
            }
        }
        if (op % 50 == 0) {
            cr_assert_eq(kvt_laneal_check(la, NULL), KVT_OK);
            for (uint32_t l = 0; l < lanes; l++) cr_assert_eq(kvt_laneal_lane_free(la, l), lm.lane[l].free);
        }
    }
    for (size_t i = 0; i < nlive; i++) free(live[i].p);
    free(live);
    free(got);
    free(want);
    lm_fini(&lm);
    kvt_laneal_destroy(la);
}

Test(lane, model_fuzz, .timeout = 300) {
    lane_fuzz(1000, 1, 20000, 11);
    lane_fuzz(1000, 4, 20000, 12);
    lane_fuzz(1003, 4, 20000, 13); /* lanes of unequal size */
    lane_fuzz(777, 3, 20000, 14);
    lane_fuzz(4096, 8, 10000, 15);
}

/* C = 4, pages 0..: page p on lane p % 4 at local p / 4 (docs/cp.md, Layout). */
Test(lane, rotation_example) {
    kvt_laneal_t *la;
    cr_assert_eq(kvt_laneal_create(&la, 64, 4), KVT_OK);
    uint32_t p[16];
    cr_assert_eq(kvt_laneal_reserve(la, 3, p), KVT_OK); /* lanes 0,1,2: local 0 */
    cr_assert(p[0] == 0 && p[1] == 1 && p[2] == 2);
    cr_assert_eq(kvt_laneal_reserve(la, 6, p), KVT_OK); /* lanes 3,0,1,2,3,0 */
    uint32_t want[] = {3, 4, 5, 6, 7, 8};
    cr_assert(memcmp(p, want, sizeof(want)) == 0, "got %u %u %u %u %u %u", p[0], p[1], p[2], p[3], p[4], p[5]);
    kvt_laneal_stats_t st = {.size = sizeof(st)};
    kvt_laneal_stats(la, &st);
    cr_assert_eq(st.next_lane, 1);
    cr_assert_eq(st.free_pages, 64 - 9);
    cr_assert_eq(st.lane_free_max - st.lane_free_min, 1);
    cr_assert_eq(kvt_laneal_free(la, (uint32_t[]){8, 8}, 2), KVT_EINVAL); /* listed twice */
    cr_assert_eq(kvt_laneal_free(la, (uint32_t[]){9}, 1), KVT_ENOTRESV);
    cr_assert_eq(kvt_laneal_free(la, (uint32_t[]){64}, 1), KVT_ERANGE);
    kvt_laneal_stats(la, &st);
    cr_assert_eq(st.free_pages, 64 - 9, "failed frees changed nothing");
    kvt_laneal_destroy(la);
}

/* Balanced load: requests of random sizes, freed whole in arrival order, on
 * lanes of equal size. Per-lane free counts stay within one page of each
 * other throughout. */
Test(lane, balanced_load_keeps_lanes_within_one) {
    for (uint32_t lanes = 2; lanes <= 8; lanes++) {
        kvt_laneal_t *la;
        cr_assert_eq(kvt_laneal_create(&la, 1024 * lanes, lanes), KVT_OK);
        kvt_rng_t rng;
        kvt_rng_seed(&rng, lanes);
        alloc_rec_t q[64];
        size_t head = 0, tail = 0;
        for (int op = 0; op < 20000; op++) {
            if (tail - head < 64 && kvt_rng_below(&rng, 2)) {
                uint64_t n = 1 + kvt_rng_below(&rng, 300);
                uint32_t *p = malloc(n * sizeof(uint32_t));
                if (kvt_laneal_reserve(la, n, p) == KVT_OK) q[tail++ % 64] = (alloc_rec_t){p, n};
                else free(p);
            } else if (tail > head) {
                alloc_rec_t r = q[head++ % 64];
                cr_assert_eq(kvt_laneal_free(la, r.p, r.n), KVT_OK);
                free(r.p);
            }
            kvt_laneal_stats_t st = {.size = sizeof(st)};
            kvt_laneal_stats(la, &st);
            cr_assert_leq(st.lane_free_max - st.lane_free_min, 1, "C=%u op %d: lanes %" PRIu64 "..%" PRIu64, lanes,
                          op, st.lane_free_min, st.lane_free_max);
        }
        while (tail > head) free(q[head++ % 64].p);
        kvt_laneal_destroy(la);
    }
}

/* C = 1 is a plain extent allocator: the same pages, call for call. */
Test(lane, one_lane_is_an_extent_allocator) {
    kvt_laneal_t *la;
    kvt_extalloc_t *a;
    cr_assert_eq(kvt_laneal_create(&la, 3000, 1), KVT_OK);
    cr_assert_eq(kvt_extalloc_create(&a, 3000), KVT_OK);
    kvt_rng_t rng;
    kvt_rng_seed(&rng, 5);
    uint32_t p[400];
    kvt_run_t r[400];
    for (int op = 0; op < 3000; op++) {
        uint64_t n = 1 + kvt_rng_below(&rng, 200);
        size_t k;
        int x = kvt_laneal_reserve(la, n, p), y = kvt_extalloc_reserve(a, n, r, 400, &k);
        cr_assert_eq(x, y);
        if (x != KVT_OK) break;
        size_t pos = 0;
        for (size_t i = 0; i < k; i++)
            for (uint32_t j = 0; j < r[i].len; j++) cr_assert_eq(p[pos++], r[i].start + j);
        if (op % 3 == 0) { /* free the first half of the pages of this request */
            cr_assert_eq(kvt_laneal_free(la, p, n / 2 + 1), KVT_OK);
            uint32_t pos2 = 0;
            for (size_t i = 0; i < k && pos2 < n / 2 + 1; i++) {
                uint32_t len = r[i].len < n / 2 + 1 - pos2 ? r[i].len : (uint32_t)(n / 2 + 1 - pos2);
                cr_assert_eq(kvt_extalloc_free(a, &(kvt_run_t){r[i].start, len}, 1), KVT_OK);
                pos2 += len;
            }
        }
    }
    kvt_laneal_destroy(la);
    kvt_extalloc_destroy(a);
}

Test(lane, failed_allocation_changes_nothing) {
    for (uint64_t nth = 1; nth < 200; nth++) {
        kvt_laneal_t *la;
        cr_assert_eq(kvt_laneal_create(&la, 4000, 4), KVT_OK);
        uint32_t p[1000];
        for (int i = 0; i < 50; i++) cr_assert_eq(kvt_laneal_reserve(la, 7, p), KVT_OK);
        uint32_t odd[200];
        size_t n = 0;
        for (uint32_t q = 1; q < 350; q += 2) odd[n++] = q;
        kvt_laneal_stats_t before = {.size = sizeof(before)}, after = {.size = sizeof(after)};
        kvt_laneal_stats(la, &before);
        kvt__mem_fail_nth(nth);
        int rc = kvt_laneal_free(la, odd, n);
        if (rc == KVT_OK) rc = kvt_laneal_reserve(la, 999, p);
        int fired = kvt__mem_fail_fired();
        kvt__mem_fail_nth(0);
        kvt_laneal_stats(la, &after);
        cr_assert_eq(kvt_laneal_check(la, NULL), KVT_OK);
        if (fired) {
            cr_assert_eq(rc, KVT_ENOMEM);
            /* the free, if it was the call that failed, left everything */
            if (after.frees == before.frees) cr_assert_eq(after.free_pages, before.free_pages);
            else cr_assert_eq(after.free_pages, before.free_pages + n, "the reserve failed and changed nothing");
            cr_assert_eq(after.next_lane, before.next_lane);
        }
        kvt_laneal_destroy(la);
        if (!fired) break;
    }
}

/* Lanes drift under a cache's eviction order: a short lane's share moves to
 * the next lanes, so an allocation fits whenever the pages are free. */
Test(lane, short_lane_spills_to_the_next) {
    kvt_laneal_t *la;
    cr_assert_eq(kvt_laneal_create(&la, 8, 2), KVT_OK); /* lane 0: logical 0,2,4,6; lane 1: 1,3,5,7 */
    uint32_t p[8];
    cr_assert_eq(kvt_laneal_reserve(la, 8, p), KVT_OK);
    cr_assert_eq(kvt_laneal_free(la, (uint32_t[]){3, 5, 7}, 3), KVT_OK); /* only lane 1 has room */
    cr_assert_eq(kvt_laneal_reserve(la, 3, p), KVT_OK, "three pages are free");
    cr_assert(p[0] == 3 && p[1] == 5 && p[2] == 7, "got %u %u %u", p[0], p[1], p[2]);
    cr_assert_eq(kvt_laneal_reserve(la, 1, p), KVT_ENOSPC);
    cr_assert_eq(kvt_laneal_check(la, NULL), KVT_OK);
    kvt_laneal_destroy(la);
}

Test(lane, bad_arguments) {
    kvt_laneal_t *la;
    cr_assert_eq(kvt_laneal_create(&la, 10, 0), KVT_EINVAL);
    cr_assert_eq(kvt_laneal_create(&la, 3, 4), KVT_EINVAL);
    cr_assert_eq(kvt_laneal_create(&la, 16, 4), KVT_OK);
    uint32_t p[32];
    cr_assert_eq(kvt_laneal_reserve(la, 0, p), KVT_EINVAL);
    cr_assert_eq(kvt_laneal_reserve(la, 17, p), KVT_ENOSPC);
    /* more pages than any pool has: ENOSPC, as for 17 (it sized a scratch by n first: ENOMEM) */
    cr_assert_eq(kvt_laneal_reserve(la, UINT64_C(1) << 62, p), KVT_ENOSPC);
    cr_assert_eq(kvt_laneal_reserve(la, 16, p), KVT_OK);
    cr_assert_eq(kvt_laneal_reserve(la, 1, p), KVT_ENOSPC);
    cr_assert_eq(kvt_laneal_lane_free(la, 9), 0);
    kvt_laneal_destroy(la);
}

/* Frees of many pages in random order (the sort that groups them by lane
 * runs its radix passes, not just the sorted fast path): every page comes
 * back once, a page listed twice in a large free is refused and changes
 * nothing, and the counts match a per-lane tally. */
Test(lane, large_frees_in_any_order) {
    static const uint32_t lane_counts[] = {1, 3, 7};
    for (size_t t = 0; t < sizeof(lane_counts) / sizeof(lane_counts[0]); t++) {
        uint32_t lanes = lane_counts[t];
        uint64_t pages = 50000 + t, seed = 100 + t;
        fprintf(stderr, "lane large frees: pages=%" PRIu64 " lanes=%u seed=%" PRIu64 "\n", pages, lanes, seed);
        kvt_laneal_t *la;
        cr_assert_eq(kvt_laneal_create(&la, pages, lanes), KVT_OK);
        uint32_t *p = malloc(pages * sizeof(uint32_t));
        for (uint64_t done = 0; done < pages;) {
            uint64_t n = pages - done < 7000 ? pages - done : 7000;
            cr_assert_eq(kvt_laneal_reserve(la, n, p + done), KVT_OK);
            done += n;
        }
        kvt_rng_t rng;
        kvt_rng_seed(&rng, seed);
        for (uint64_t i = pages - 1; i > 0; i--) { /* Fisher-Yates */
            uint64_t j = kvt_rng_below(&rng, i + 1);
            uint32_t x = p[i];
            p[i] = p[j];
            p[j] = x;
        }
        uint64_t tally[8] = {0};
        for (uint64_t done = 0; done < pages;) {
            uint64_t n = 1 + kvt_rng_below(&rng, 5000);
            if (n > pages - done) n = pages - done;
            if (n > 40) { /* the same page twice: refused, nothing freed */
                uint32_t keep = p[done + n - 1];
                p[done + n - 1] = p[done];
                cr_assert_eq(kvt_laneal_free(la, p + done, n), KVT_EINVAL);
                p[done + n - 1] = keep;
                for (uint32_t l = 0; l < lanes; l++) cr_assert_eq(kvt_laneal_lane_free(la, l), tally[l]);
            }
            cr_assert_eq(kvt_laneal_free(la, p + done, n), KVT_OK, "seed %" PRIu64 ": free of %" PRIu64, seed, n);
            for (uint64_t i = 0; i < n; i++) tally[p[done + i] % lanes]++;
            done += n;
            for (uint32_t l = 0; l < lanes; l++) cr_assert_eq(kvt_laneal_lane_free(la, l), tally[l]);
        }
        cr_assert_eq(kvt_laneal_check(la, NULL), KVT_OK);
        kvt_laneal_destroy(la);
        free(p);
    }
}

/* Reserve and free keep their work arrays between calls, up to 4 MiB: a
 * free of 300,000 pages (~12 MB of them) gives them back when it returns,
 * so the allocator's metadata is at most 4 MiB over a fresh one's; a free of
 * 1,000 keeps its arrays (the metadata stays above the fresh one's). */
Test(lane, work_arrays_are_kept_up_to_4_mib) {
    enum { PAGES = 400000 };
    kvt_laneal_t *la;
    cr_assert_eq(kvt_laneal_create(&la, PAGES, 4), KVT_OK);
    kvt_laneal_stats_t fresh = {.size = sizeof(fresh)}, st = {.size = sizeof(st)};
    kvt_laneal_stats(la, &fresh);
    uint32_t *p = malloc(300000 * sizeof(uint32_t));
    cr_assert_eq(kvt_laneal_reserve(la, 300000, p), KVT_OK);
    cr_assert_eq(kvt_laneal_free(la, p, 300000), KVT_OK);
    kvt_laneal_stats(la, &st);
    cr_assert_leq(st.metadata_bytes, fresh.metadata_bytes + (4u << 20), "%" PRIu64 " B of metadata after a large free",
                  st.metadata_bytes);
    cr_assert_eq(kvt_laneal_reserve(la, 1000, p), KVT_OK);
    cr_assert_eq(kvt_laneal_free(la, p, 1000), KVT_OK);
    kvt_laneal_stats(la, &st);
    cr_assert_gt(st.metadata_bytes, fresh.metadata_bytes + 1000 * 16, "a small call's work arrays are kept");
    cr_assert_eq(st.free_pages, PAGES);
    cr_assert_eq(kvt_laneal_check(la, NULL), KVT_OK);
    free(p);
    kvt_laneal_destroy(la);
}
