/* The data-plane stress test, shared by the unit suite (Criterion) and the
 * ThreadSanitizer run (tests/tsan/, a plain program: Criterion's runner does
 * not start under TSan).
 *
 * A cache with real tiers (arena L1, host L2 with checksums) on a transfer
 * engine whose copies complete in random order, after random delays, some
 * failing; random admissions from a few prefix families (so nodes split),
 * held and uncommitted requests, releases, polls, restore_room, syncs, and
 * L2 pages corrupted behind the cache's back. After every step:
 *
 *   - kvt_cache_check (tree, allocators, in-flight accounting);
 *   - every page of a held request is in L1 with its content (locked pages
 *     stay readable);
 *   - every page the tree says is in L1, or has a valid L2 copy, holds the
 *     content its page hash determines (an L2 copy we corrupted must not be
 *     in L1 unless the load was refused: a corrupt page is never served).
 *
 * Content model: page content is kvt_pattern_fill(page hash, layer) — a
 * function of the prefix alone, independent of the code under test.
 */
#ifndef KVT_TESTS_STRESS_H
#define KVT_TESTS_STRESS_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache-int.h"
#include "kvtier/testing.h"
#include "kvtier/rng.h"
#include "kvtier/cache.h"
#include "kvtier/error.h"
#include "kvtier/tier.h"
#include "kvtier/xfer.h"

#define ST_PT 4          /* tokens per page */
#define ST_MAXP 12       /* pages per request */
#define ST_HELD 3
#define ST_CORRUPT 64

typedef struct stress_counts {
    uint64_t steps, admits, splits, loads, backups, failed, corrupt_refused, corrupt_dropped, evicted, shadows;
} stress_counts_t;

typedef struct stress {
    kvt_rng_t rng;
    kvt_tier_t *tier[2];
    kvt_xfer_t *xf;
    kvt_cache_t *c;
    uint32_t layers;
    uint64_t layer_bytes;
    uint8_t *buf;
    kvt_cache_req_t held[ST_HELD];
    uint32_t held_ids[ST_HELD][ST_MAXP];
    kvt_hash128_t held_hash[ST_HELD][ST_MAXP];
    int nheld;
    struct { uint32_t l2; kvt_hash128_t h; } corrupt[ST_CORRUPT];
    int ncorrupt;
    char err[256];
} stress_t;

#define ST_FAIL(s, ...) (snprintf((s)->err, sizeof((s)->err), __VA_ARGS__), -1)

static bool st_page_ok(stress_t *s, int tier, uint32_t id, const kvt_hash128_t *h) {
    return kvt_tier_pattern_check(s->tier[tier], id, h->lo, h->hi, s->buf);
}

static bool st_is_corrupt(const stress_t *s, uint32_t l2, const kvt_hash128_t *h) {
    for (int i = 0; i < s->ncorrupt; i++)
        if (s->corrupt[i].l2 == l2 && s->corrupt[i].h.lo == h->lo && s->corrupt[i].h.hi == h->hi) return true;
    return false;
}

/* A request: family f's tokens, diverging from the family at page `div`. */
static uint32_t st_request(stress_t *s, int32_t *tok) {
    uint32_t fam = (uint32_t)kvt_rng_below(&s->rng, 5), n = 1 + (uint32_t)kvt_rng_below(&s->rng, ST_MAXP);
    uint32_t div = (uint32_t)kvt_rng_below(&s->rng, n + 1), salt = (uint32_t)kvt_rng_below(&s->rng, 4);
    for (uint32_t i = 0; i < n * ST_PT; i++) tok[i] = (int32_t)(fam * 100000 + (i / ST_PT >= div ? salt * 1000 + 500 : 0) + i);
    return n;
}

/* Every resident copy holds its content. */
static int st_check_tree(stress_t *s) {
    kvt_radix_t *r = s->c->tree;
    for (kvt_rnode_t *x = kvt__radix_first(r); x; x = kvt__radix_next(r, x))
        for (uint32_t i = 0; i < x->npages; i++) {
            kvt_hash128_t h;
            if (kvt_radix_page_hash(r, x, i, &h) != KVT_OK) return ST_FAIL(s, "page hash: out of memory");
            const kvt_page_t *pg = &x->pages[i];
            if (i < x->n_l1 && !st_page_ok(s, 0, pg->l1, &h)) return ST_FAIL(s, "L1 page %u holds the wrong bytes", pg->l1);
            if (kvt__page_in_l2(pg) && !st_is_corrupt(s, pg->l2, &h) && !st_page_ok(s, 1, pg->l2, &h))
                return ST_FAIL(s, "L2 page %u holds the wrong bytes (node page %u of %u, n_l1 %u, l1 %u, flags %u, sum %s)", pg->l2, i, x->npages, x->n_l1, pg->l1, pg->flags, kvt_tier_page_sum(s->tier[1], pg->l2) == kvt_tier_sums(s->tier[1])[pg->l2] ? "ok" : "bad");
        }
    return 0;
}

static int st_check(stress_t *s) {
    const char *why;
    if (kvt_cache_check(s->c, &why) != KVT_OK) return ST_FAIL(s, "check: %s", why);
    for (int k = 0; k < s->nheld; k++)
        for (uint64_t j = 0; j < s->held[k].pages; j++)
            if (!st_page_ok(s, 0, s->held_ids[k][j], &s->held_hash[k][j]))
                return ST_FAIL(s, "held request %d: page %" PRIu64 " (L1 %u) is not readable", k, j, s->held_ids[k][j]);
    return st_check_tree(s);
}

static int st_admit(stress_t *s, stress_counts_t *n) {
    int32_t tok[ST_MAXP * ST_PT];
    uint32_t np = st_request(s, tok);
    int k = s->nheld;
    kvt_cache_req_t *req = &s->held[k];
    if (kvt_cache_admit(s->c, 0, tok, (uint64_t)np * ST_PT, 0, s->held_ids[k], req) != KVT_OK)
        return ST_FAIL(s, "admit failed");
    kvt_page_hash_chain(0, tok, req->pages, ST_PT, s->held_hash[k]);
    /* what it was served must be its content (a corrupt L2 page is never served) */
    for (uint64_t j = 0; j < req->pages - req->new_pages; j++)
        if (!st_page_ok(s, 0, s->held_ids[k][j], &s->held_hash[k][j]))
            return ST_FAIL(s, "served page %" PRIu64 " (L1 %u, %s) holds the wrong bytes", j, s->held_ids[k][j],
                           j < req->l1_hit_pages ? "an L1 hit" : "loaded");
    /* the forward pass: new pages get their KV */
    for (uint64_t j = req->pages - req->new_pages; j < req->pages; j++)
        kvt_tier_pattern_fill(s->tier[0], s->held_ids[k][j], s->held_hash[k][j].lo, s->held_hash[k][j].hi, s->buf);
    n->admits++;
    if (kvt_rng_below(&s->rng, 3) != 0) kvt_cache_commit(s->c, req);
    s->nheld++;
    return 0;
}

static void st_release(stress_t *s, int k) {
    kvt_cache_release(s->c, &s->held[k]);
    s->nheld--;
    s->held[k] = s->held[s->nheld];
    memcpy(s->held_ids[k], s->held_ids[s->nheld], sizeof(s->held_ids[k]));
    memcpy(s->held_hash[k], s->held_hash[s->nheld], sizeof(s->held_hash[k]));
}

/* Flips a byte of a host-only page's L2 copy (none in flight). */
static void st_corrupt(stress_t *s) {
    if (s->ncorrupt == ST_CORRUPT) return;
    kvt_radix_t *r = s->c->tree;
    for (kvt_rnode_t *x = kvt__radix_first(r); x; x = kvt__radix_next(r, x))
        for (uint32_t i = x->n_l1; i < x->npages; i++) {
            const kvt_page_t *pg = &x->pages[i];
            if (!kvt__page_in_l2(pg) || pg->l1 != KVT_NO_PAGE) continue;
            kvt_hash128_t h;
            if (kvt_radix_page_hash(r, x, i, &h) != KVT_OK || st_is_corrupt(s, pg->l2, &h)) continue;
            uint8_t *p = kvt_tier_addr(s->tier[1], pg->l2, s->layers - 1);
            p[s->layer_bytes / 2] ^= 0x40;
            s->corrupt[s->ncorrupt].l2 = pg->l2;
            s->corrupt[s->ncorrupt++].h = h;
            return;
        }
}

static void st_fini(stress_t *s) {
    while (s->nheld > 0) st_release(s, s->nheld - 1);
    kvt_cache_destroy(s->c);
    kvt_xfer_destroy(s->xf);
    kvt_tier_destroy(s->tier[0]);
    kvt_tier_destroy(s->tier[1]);
    free(s->buf);
}

/* Runs `steps` steps from seed; 0, or -1 with s->err saying what broke. */
static int stress_run(uint64_t seed, int steps, stress_counts_t *n, char *err, size_t errcap) {
    static stress_t st;
    stress_t *s = &st;
    memset(s, 0, sizeof(*s));
    kvt_rng_seed(&s->rng, seed);
    s->layers = 1 + (uint32_t)kvt_rng_below(&s->rng, 3);
    s->layer_bytes = 8 + kvt_rng_below(&s->rng, 40); /* odd sizes too */
    s->buf = malloc(s->layer_bytes);
    uint64_t l1 = 48 + kvt_rng_below(&s->rng, 32), l2 = 32 + kvt_rng_below(&s->rng, 96);
    kvt_tier_config_t tc = {.size = sizeof(tc), .kind = KVT_TIER_ARENA, .name = "l1",
                            .geom = {l1, s->layers, s->layer_bytes, (kvt_layout_t)kvt_rng_below(&s->rng, 2)}};
    int rc = kvt_tier_create(&s->tier[0], &tc);
    tc.kind = KVT_TIER_HOST;
    tc.name = "l2";
    tc.flags = KVT_TIER_CHECKSUM;
    tc.geom.pages = l2;
    tc.geom.layout = (kvt_layout_t)kvt_rng_below(&s->rng, 2);
    if (rc == KVT_OK) rc = kvt_tier_create(&s->tier[1], &tc);
    kvt_xfer_config_t xc;
    kvt_xfer_config_default(&xc);
    xc.threads = 2;
    xc.max_batch_bytes = (1 + kvt_rng_below(&s->rng, 4)) * s->layers * s->layer_bytes; /* items of 1-4 pages */
    if (rc == KVT_OK) rc = kvt_xfer_create(&s->xf, &xc, s->tier, 2);
    kvt_xfer_faults_t f = {.size = sizeof(kvt_xfer_faults_t), .fail_p = 0.04, .delay_p = 0.3, .delay_max_ns = 300000, .seed = seed};
    if (rc == KVT_OK) rc = kvt_xfer_set_faults(s->xf, &f);
    kvt_cache_config_t cfg;
    kvt_cache_config_default(&cfg);
    cfg.page_tokens = ST_PT;
    cfg.l1_pages = l1;
    cfg.l2_pages = l2;
    cfg.policy = (kvt_policy_t)kvt_rng_below(&s->rng, KVT_POLICY_COUNT_);
    cfg.write_policy = (kvt_write_policy_t)kvt_rng_below(&s->rng, KVT_WRITE_POLICY_COUNT_);
    cfg.write_through_hits = 1 + (uint32_t)kvt_rng_below(&s->rng, 2);
    cfg.l1_free_room = 0.1 * (double)kvt_rng_below(&s->rng, 3);
    cfg.l2_free_room = 0.1 * (double)kvt_rng_below(&s->rng, 3);
    if (rc == KVT_OK) rc = kvt_cache_create(&s->c, &cfg);
    if (rc == KVT_OK) rc = kvt_cache_attach(s->c, s->xf, s->tier[0], 0, s->tier[1], 1);
    if (rc != KVT_OK || s->buf == NULL) {
        snprintf(err, errcap, "seed %" PRIu64 ": set-up failed: %s", seed, kvt_strerror(rc));
        return -1;
    }
    int res = 0;
    for (int t = 0; t < steps && res == 0; t++) {
        uint64_t op = kvt_rng_below(&s->rng, 100);
        if (op < 45 && s->nheld < ST_HELD) res = st_admit(s, n);
        else if (op < 75 && s->nheld > 0) st_release(s, (int)kvt_rng_below(&s->rng, (uint64_t)s->nheld));
        else if (op < 88) kvt_cache_poll(s->c);
        else if (op < 93) kvt_cache_restore_room(s->c);
        else if (op < 96) st_corrupt(s);
        else kvt_cache_sync(s->c);
        if (res == 0) res = st_check(s);
        if (res != 0) snprintf(err, errcap, "seed %" PRIu64 " step %d: %s", seed, t, s->err);
        n->steps++;
    }
    kvt_cache_sync(s->c);
    kvt_cache_stats_t cs = {.size = sizeof(cs)};
    kvt_cache_stats(s->c, &cs);
    kvt_radix_stats_t rs = {.size = sizeof(rs)};
    kvt_radix_stats(s->c->tree, &rs);
    n->splits += rs.splits;
    n->loads += cs.loads;
    n->backups += cs.backups;
    n->failed += cs.failed_copies;
    n->corrupt_refused += cs.integrity_failures;
    n->corrupt_dropped += cs.corrupt_dropped;
    n->evicted += cs.l1_evicted_pages + cs.l2_evicted_pages;
    n->shadows += cs.shadows_reclaimed;
    if (res == 0) res = st_check(s);
    st_fini(s);
    return res;
}

#endif
