/* The hybrid cache against independent models: the match rule against a
 * brute-force scan of every n, and the cache's hits over a random workload
 * against a model that keeps plain sets of what each request left behind
 * (hybrid.h's rules, written out again), with the cache's check after every
 * call. Also the layer-group descriptions (model.h) and bad configurations. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier/error.h"
#include "kvtier/hybrid.h"
#include "kvtier/radix.h"
#include "kvtier/rng.h"
#include "hybrid/hybrid-int.h"
#include "keyed/keyed-int.h"
#include "unit/hybrid/requests.h"

/* ---- the match rule, brute force ------------------------------------------------ */

/* n continues every group: each condition of hybrid.h checked directly. */
static int continues(const kvt_layer_group_t *g, uint32_t ng, uint32_t P, uint64_t n, const uint8_t *const *present) {
    for (uint32_t k = 0; k < ng; k++) {
        if (g[k].kind == KVT_GROUP_STATE && n > 0 && !present[k][n]) return 0;
        if (g[k].kind != KVT_GROUP_WINDOW) continue;
        for (uint64_t tok = 0; tok < n * P; tok++) /* every token of the last W before nP: its page */
            if (tok + g[k].window >= n * P && !present[k][tok / P]) return 0;
    }
    return 1;
}

static uint64_t brute(const kvt_layer_group_t *g, uint32_t ng, uint32_t P, uint64_t m, const uint8_t *const *present) {
    for (uint64_t n = m;; n--)
        if (continues(g, ng, P, n, present) || n == 0) return n;
}

Test(hybrid_rule, longest_is_the_brute_force_scan) {
    kvt_rng_t r;
    uint64_t seed = 0x5eed1;
    kvt_rng_seed(&r, seed);
    for (int trial = 0; trial < 4000; trial++) {
        uint32_t P = 1 + (uint32_t)kvt_rng_below(&r, 8), ng = 1 + (uint32_t)kvt_rng_below(&r, 4);
        uint64_t m = kvt_rng_below(&r, 40);
        kvt_layer_group_t g[4];
        uint8_t bits[4][48];
        const uint8_t *present[4];
        double p = 0.5 + 0.5 * kvt_rng_unit(&r);
        for (uint32_t k = 0; k < ng; k++) {
            uint32_t kind = k == 0 ? KVT_GROUP_FULL : (uint32_t)kvt_rng_below(&r, 3);
            g[k] = (kvt_layer_group_t){kind, 1, kind == KVT_GROUP_WINDOW ? 1 + (uint32_t)kvt_rng_below(&r, 4 * P + 3) : 0, 0, 1};
            for (int i = 0; i < 48; i++) bits[k][i] = kvt_rng_unit(&r) < p;
            present[k] = kind == KVT_GROUP_FULL ? NULL : bits[k];
        }
        uint64_t want = brute(g, ng, P, m, present), got = kvt_hybrid_longest(g, ng, P, m, present);
        cr_assert_eq(got, want, "seed %" PRIx64 " trial %d: longest %" PRIu64 ", brute force %" PRIu64, seed, trial, got,
                     want);
    }
}

/* ---- the cache against a model of what requests leave behind --------------------- */

#define MAXSET 20000
typedef struct {
    kvt_hash128_t h[MAXSET];
    size_t n;
} set_t;

static int set_has(const set_t *s, kvt_hash128_t x) {
    for (size_t i = 0; i < s->n; i++)
        if (s->h[i].lo == x.lo && s->h[i].hi == x.hi) return 1;
    return 0;
}

static void set_add(set_t *s, kvt_hash128_t x) {
    if (set_has(s, x)) return;
    cr_assert_lt(s->n, MAXSET);
    s->h[s->n++] = x;
}

typedef struct {
    set_t full, piece[KVT_MODEL_MAX_GROUPS];
} model_t;

typedef struct {
    uint32_t P, every;
    int policy; /* write policy L1 -> L2 */
    uint64_t l1_slots; /* small: pieces must reach L2 and come back */
    uint64_t l2_slots, l3_slots; /* 0: L2 never evicts, no L3 */
    uint32_t abort_one_in;       /* 0: every request runs; k: about one in k is aborted instead */
} setup_t;

static kvt_hybrid_t *make(const kvt_layer_group_t *g, uint32_t ng, const setup_t *su) {
    kvt_hybrid_config_t cfg;
    cr_assert_eq(kvt_hybrid_config_default(&cfg, g, ng, su->P, 1 << 30, 1 << 30, su->l3_slots ? 1 << 30 : 0), KVT_OK);
    cfg.cache.l1_pages = 1 << 14; /* the full pages never leave the tree: the model's m is every page seen */
    cfg.cache.l2_pages = 1 << 14;
    cfg.cache.write_policy = (kvt_write_policy_t)su->policy;
    cfg.cache.l3_write_policy = (kvt_write_policy_t)su->policy;
    cfg.checkpoint_every = su->every;
    cfg.cache.decision_digest = true; /* kept everywhere: a failed call must leave it as it was */
    for (uint32_t k = 0; k < ng; k++)
        if (g[k].kind != KVT_GROUP_FULL) {
            cfg.l1_slots[k] = su->l1_slots;
            cfg.l2_slots[k] = su->l2_slots ? su->l2_slots : 1 << 16; /* never evicts */
            cfg.l3_slots[k] = su->l3_slots;
        }
    kvt_hybrid_t *h = NULL;
    cr_assert_eq(kvt_hybrid_create(&h, &cfg), KVT_OK);
    return h;
}

static void check(kvt_hybrid_t *h, const char *ctx) {
    const char *why = NULL;
    int rc = kvt_hybrid_check(h, &why);
    cr_assert_eq(rc, KVT_OK, "%s: check: %s (%s)", ctx, kvt_err_name(rc), why ? why : "-");
}


static void run_model(const kvt_layer_group_t *g, uint32_t ng, const setup_t *su, uint64_t seed, int requests) {
    kvt_hybrid_t *h = make(g, ng, su);
    model_t *mo = calloc(1, sizeof(*mo));
    int32_t *tok = malloc(64 * 1024 * sizeof(*tok)), *prev = malloc(64 * 1024 * sizeof(*prev));
    kvt_hash128_t *hash = malloc(4096 * sizeof(*hash));
    uint8_t *bits[KVT_MODEL_MAX_GROUPS];
    for (uint32_t k = 0; k < ng; k++) bits[k] = calloc(4096, 1);
    kvt_rng_t r;
    kvt_rng_seed(&r, seed);
    uint64_t nprev = 0, hits = 0, aborted = 0;
    const uint32_t P = su->P;
    for (int q = 0; q < requests; q++) {
        uint64_t nt = next_request(&r, tok, prev, nprev, P), np = nt / P;
        kvt_page_hash_chain(0, tok, np, P, hash);
        uint64_t m = 0;
        while (m < np && set_has(&mo->full, hash[m])) m++;
        const uint8_t *present[KVT_MODEL_MAX_GROUPS];
        for (uint32_t k = 0; k < ng; k++) {
            present[k] = g[k].kind == KVT_GROUP_FULL ? NULL : bits[k];
            for (uint64_t i = 0; i <= np; i++) {
                if (g[k].kind == KVT_GROUP_WINDOW) bits[k][i] = i < np && set_has(&mo->piece[k], hash[i]);
                if (g[k].kind == KVT_GROUP_STATE) bits[k][i] = i > 0 && set_has(&mo->piece[k], hash[i - 1]);
            }
        }
        uint64_t want = brute(g, ng, P, m, present);

        kvt_hybrid_req_t req;
        cr_assert_eq(kvt_hybrid_admit(h, 0, tok, nt, 0, NULL, &req), KVT_OK);
        cr_assert_eq(req.full_hit_pages, m, "seed %" PRIx64 " request %d: full match %" PRIu64 ", model %" PRIu64, seed,
                     q, req.full_hit_pages, m);
        cr_assert_eq(req.hit_pages, want, "seed %" PRIx64 " request %d: hit %" PRIu64 " pages, model %" PRIu64 " (m %" PRIu64 ")",
                     seed, q, req.hit_pages, want, m);
        cr_assert_eq(req.hit_tier == 0, want == 0);
        hits += want;
        check(h, "admit");
        if (su->abort_one_in && kvt_rng_below(&r, su->abort_one_in) == 0) { /* its forward pass failed: it leaves */
            cr_assert_eq(kvt_hybrid_abort(h, &req), KVT_OK);           /* nothing behind, the next one shares */
            cr_assert_eq(kvt_hybrid_abort(h, &req), KVT_EINVAL, "aborted twice"); /* its prefix all the same */
            check(h, "abort");
            aborted++;
            memcpy(prev, tok, nt * sizeof(*tok));
            nprev = nt;
            continue;
        }
        cr_assert_eq(kvt_hybrid_release(h, 0, tok, nt, &req), KVT_OK);
        check(h, "release");

        /* what the request left behind, as hybrid.h says */
        for (uint64_t i = 0; i < np; i++) set_add(&mo->full, hash[i]);
        for (uint32_t k = 0; k < ng; k++) {
            if (g[k].kind == KVT_GROUP_WINDOW)
                for (uint64_t i = want; i < np; i++) set_add(&mo->piece[k], hash[i]);
            if (g[k].kind == KVT_GROUP_STATE)
                for (uint64_t c = want + 1; c <= np; c++)
                    if ((su->every && c % su->every == 0) || c == np || (want < m && c == m))
                        set_add(&mo->piece[k], hash[c - 1]);
        }
        memcpy(prev, tok, nt * sizeof(*tok));
        nprev = nt;
    }
    kvt_hybrid_stats_t st = {.size = sizeof(st)};
    cr_assert_eq(kvt_hybrid_stats(h, &st), KVT_OK);
    cr_assert_eq(st.hit_tokens, hits * P);
    cr_assert_eq(st.aborted, aborted);
    if (su->abort_one_in) cr_assert_gt(aborted, 0);
    if (su->l3_slots) cr_assert_gt(st.l3_hit_tokens, 0, "seed %" PRIx64 ": no hit needed L3", seed);
    else cr_assert_eq(st.l3_hit_tokens, 0);
    cr_assert_eq(st.l1_hit_tokens + st.l2_hit_tokens + st.l3_hit_tokens, st.hit_tokens);
    cr_assert_gt(hits, 0, "seed %" PRIx64 ": the workload never hit", seed);
    for (uint32_t k = 0; k < ng; k++) free(bits[k]);
    free(hash);
    free(prev);
    free(tok);
    free(mo);
    kvt_hybrid_destroy(h);
}

static const kvt_layer_group_t WINDOW_ONLY[] = {{KVT_GROUP_FULL, 2, 0, 0, 64}, {KVT_GROUP_WINDOW, 4, 24, 0, 128}};
static const kvt_layer_group_t STATE_ONLY[] = {{KVT_GROUP_FULL, 1, 0, 0, 64}, {KVT_GROUP_STATE, 3, 0, 0, 4096}};
static const kvt_layer_group_t ALL_THREE[] = {
    {KVT_GROUP_FULL, 1, 0, 0, 64}, {KVT_GROUP_WINDOW, 2, 9, 0, 64}, {KVT_GROUP_STATE, 2, 0, 0, 1000},
    {KVT_GROUP_WINDOW, 1, 40, 0, 32}};

Test(hybrid_model, window_groups_match_the_model) {
    setup_t su = {.P = 4, .every = 0, .policy = KVT_WRITE_THROUGH, .l1_slots = 1 << 16};
    run_model(WINDOW_ONLY, 2, &su, 11, 300);
}

Test(hybrid_model, state_groups_match_the_model) {
    setup_t su = {.P = 4, .every = 3, .policy = KVT_WRITE_THROUGH, .l1_slots = 1 << 16};
    run_model(STATE_ONLY, 2, &su, 12, 300);
    su.every = 0; /* ends and branch points only */
    run_model(STATE_ONLY, 2, &su, 13, 300);
}

Test(hybrid_model, every_kind_at_once_matches_the_model) {
    setup_t su = {.P = 8, .every = 2, .policy = KVT_WRITE_THROUGH, .l1_slots = 1 << 16};
    run_model(ALL_THREE, 4, &su, 14, 300);
}

/* L1 slots so few that pieces must leave L1 and be loaded back: a piece
 * that reaches L2 (at store under write_through, at eviction under
 * write_back) is never lost, so the model still holds. */
Test(hybrid_model, pieces_evicted_from_l1_come_back_from_l2) {
    for (int policy = KVT_WRITE_THROUGH; policy <= KVT_WRITE_BACK; policy += KVT_WRITE_BACK) {
        setup_t su = {.P = 4, .every = 3, .policy = policy, .l1_slots = 40};
        run_model(ALL_THREE, 4, &su, 15 + (uint64_t)policy, 300);
    }
}

/* L1 and L2 slots so few that pieces reach L3 (under either L3 write
 * policy) and come back from it: still the model. */
Test(hybrid_model, pieces_evicted_from_l2_come_back_from_l3) {
    for (int policy = KVT_WRITE_THROUGH; policy <= KVT_WRITE_BACK; policy += KVT_WRITE_BACK) {
        setup_t su = {.P = 4, .every = 3, .policy = policy, .l1_slots = 30, .l2_slots = 50, .l3_slots = 1 << 16};
        run_model(ALL_THREE, 4, &su, 17 + (uint64_t)policy, 300);
    }
}

/* Requests whose forward pass failed are aborted: the model takes nothing
 * from them (no full page, no piece), so a later request that shares their
 * prefix hits only what the requests that ran left, from whichever tier. */
Test(hybrid_model, aborted_requests_leave_nothing_behind) {
    for (int policy = KVT_WRITE_THROUGH; policy <= KVT_WRITE_BACK; policy += KVT_WRITE_BACK) {
        setup_t su = {.P = 4, .every = 3, .policy = policy, .l1_slots = 1 << 16, .abort_one_in = 3};
        run_model(ALL_THREE, 4, &su, 19 + (uint64_t)policy, 300);
        su.l1_slots = 30, su.l2_slots = 50, su.l3_slots = 1 << 16;
        run_model(ALL_THREE, 4, &su, 21 + (uint64_t)policy, 300);
    }
}

/* ---- bounded tiers: the check holds, and hits come from the tier that has them ---- */

Test(hybrid_bounded, small_tiers_keep_every_invariant) {
    kvt_hybrid_config_t cfg;
    const uint32_t P = 4;
    cr_assert_eq(kvt_hybrid_config_default(&cfg, ALL_THREE, 4, P, 64 * 1024, 256 * 1024, 0), KVT_OK);
    kvt_hybrid_t *h = NULL;
    cr_assert_eq(kvt_hybrid_create(&h, &cfg), KVT_OK);
    int32_t *tok = malloc(64 * 1024 * sizeof(*tok)), *prev = malloc(64 * 1024 * sizeof(*prev));
    kvt_rng_t r;
    kvt_rng_seed(&r, 21);
    uint64_t nprev = 0;
    kvt_hybrid_req_t live[3];
    uint64_t livelen[3];
    int32_t *livetok[3];
    for (int i = 0; i < 3; i++) livetok[i] = malloc(64 * 1024 * sizeof(int32_t));
    int nlive = 0;
    for (int q = 0; q < 600; q++) {
        uint64_t nt = next_request(&r, tok, prev, nprev, P);
        kvt_hybrid_req_t req;
        cr_assert_eq(kvt_hybrid_admit(h, 0, tok, nt, 0, NULL, &req), KVT_OK);
        cr_assert_leq(req.hit_pages, req.full_hit_pages);
        check(h, "admit");
        if (nlive == 3) { /* up to three requests run at once: their pieces stay pinned */
            int v = (int)kvt_rng_below(&r, 3);
            cr_assert_eq(kvt_hybrid_release(h, 0, livetok[v], livelen[v], &live[v]), KVT_OK);
            check(h, "release");
            live[v] = req;
            memcpy(livetok[v], tok, nt * sizeof(*tok));
            livelen[v] = nt;
        } else {
            live[nlive] = req;
            memcpy(livetok[nlive], tok, nt * sizeof(*tok));
            livelen[nlive++] = nt;
        }
        memcpy(prev, tok, nt * sizeof(*tok));
        nprev = nt;
    }
    for (int i = 0; i < nlive; i++) cr_assert_eq(kvt_hybrid_release(h, 0, livetok[i], livelen[i], &live[i]), KVT_OK);
    check(h, "end");
    kvt_hybrid_stats_t st = {.size = sizeof(st)};
    kvt_hybrid_stats(h, &st);
    cr_assert_gt(st.l2_hit_tokens, 0, "no hit needed L2: the tiers are not small enough to test it");
    cr_assert_gt(st.hit_tokens, 0);
    cr_assert_eq(st.l1_hit_tokens + st.l2_hit_tokens + st.l3_hit_tokens, st.hit_tokens);
    for (int i = 0; i < 3; i++) free(livetok[i]);
    free(tok);
    free(prev);
    kvt_hybrid_destroy(h);
}

/* Without hybrid groups the hybrid cache is the radix cache: n = m. */
Test(hybrid_bounded, one_full_group_is_the_radix_cache) {
    static const kvt_layer_group_t FULL[] = {{KVT_GROUP_FULL, 4, 0, 0, 256}};
    setup_t su = {.P = 4, .every = 0, .policy = KVT_WRITE_THROUGH, .l1_slots = 0};
    kvt_hybrid_t *h = make(FULL, 1, &su);
    int32_t *tok = malloc(64 * 1024 * sizeof(*tok)), *prev = malloc(64 * 1024 * sizeof(*prev));
    kvt_rng_t r;
    kvt_rng_seed(&r, 31);
    uint64_t nprev = 0;
    for (int q = 0; q < 200; q++) {
        uint64_t nt = next_request(&r, tok, prev, nprev, 4);
        kvt_hybrid_req_t req;
        cr_assert_eq(kvt_hybrid_admit(h, 0, tok, nt, 0, NULL, &req), KVT_OK);
        cr_assert_eq(req.hit_pages, req.full_hit_pages);
        cr_assert_eq(kvt_hybrid_release(h, 0, tok, nt, &req), KVT_OK);
        memcpy(prev, tok, nt * sizeof(*tok));
        nprev = nt;
    }
    free(tok);
    free(prev);
    kvt_hybrid_destroy(h);
}

/* The decision digest: caches fed the same calls agree on it after every
 * call; one whose pieces went otherwise (checkpoints every 2 pages) differs
 * although its full groups decided alike (their radix digest is the same:
 * the pieces' decisions are in the digest); none is kept without
 * cache.decision_digest, and keeping it changes no counter. */
Test(hybrid_bounded, the_digest_follows_every_pieces_decision) {
    const uint32_t P = 4;
    kvt_hybrid_config_t cfg;
    cr_assert_eq(kvt_hybrid_config_default(&cfg, ALL_THREE, 4, P, 1 << 30, 1 << 30, 0), KVT_OK);
    kvt_hybrid_t *h[4];
    for (int i = 0; i < 4; i++) {
        cfg.cache.l1_pages = cfg.cache.l2_pages = 1 << 14;
        cfg.cache.write_policy = KVT_WRITE_BACK;
        cfg.cache.decision_digest = i < 3;
        cfg.checkpoint_every = i == 2 ? 2 : 0;
        for (uint32_t k = 1; k < 4; k++) cfg.l1_slots[k] = 24, cfg.l2_slots[k] = 64, cfg.l3_slots[k] = 0; /* small: L2 serves too */
        cr_assert_eq(kvt_hybrid_create(&h[i], &cfg), KVT_OK);
    }
    int32_t *tok = malloc(64 * 1024 * sizeof(*tok)), *prev = malloc(64 * 1024 * sizeof(*prev));
    kvt_rng_t r;
    kvt_rng_seed(&r, 41);
    uint64_t nprev = 0, changes = 0, last = 0;
    for (int q = 0; q < 300; q++) {
        uint64_t nt = next_request(&r, tok, prev, nprev, P);
        for (int i = 0; i < 4; i++) {
            kvt_hybrid_req_t req;
            cr_assert_eq(kvt_hybrid_admit(h[i], 0, tok, nt, 0, NULL, &req), KVT_OK);
            cr_assert_eq(kvt_hybrid_release(h[i], 0, tok, nt, &req), KVT_OK);
        }
        cr_assert_eq(kvt_hybrid_digest(h[0]), kvt_hybrid_digest(h[1]), "request %d", q);
        cr_assert_eq(kvt_hybrid_digest(h[3]), 0u, "not kept");
        changes += kvt_hybrid_digest(h[0]) != last;
        last = kvt_hybrid_digest(h[0]);
        memcpy(prev, tok, nt * sizeof(*tok));
        nprev = nt;
    }
    cr_assert_gt(changes, 250u, "every request stores pieces: %" PRIu64 " of 300 changed it", changes);
    cr_assert_eq(kvt_cache_digest(kvt_hybrid_cache(h[0])), kvt_cache_digest(kvt_hybrid_cache(h[2])), "the full groups alike");
    cr_assert_neq(kvt_hybrid_digest(h[0]), kvt_hybrid_digest(h[2]), "the pieces not");
    kvt_hybrid_stats_t a = {.size = sizeof(a)};
    kvt_hybrid_stats(h[0], &a);
    cr_assert_gt(a.l2_hit_tokens, 0, "pieces went to L2 and back: their slots in the digest were reused");
    kvt_hybrid_stats_t d = {.size = sizeof(d)};
    kvt_hybrid_stats(h[3], &d);
#define SAME_(f, kind, help) cr_assert_eq(a.f, d.f, "keeping the digest decides nothing: " #f);
    KVT_HYBRID_STATS_FIELDS(SAME_)
#undef SAME_
    for (int i = 0; i < 4; i++) kvt_hybrid_destroy(h[i]);
    free(tok);
    free(prev);
}

Test(hybrid_bounded, release_with_other_tokens_is_refused_and_changes_nothing) {
    setup_t su = {.P = 4, .every = 0, .policy = KVT_WRITE_THROUGH, .l1_slots = 1 << 10};
    kvt_hybrid_t *h = make(ALL_THREE, 4, &su);
    int32_t a[40], b[40];
    for (int i = 0; i < 40; i++) a[i] = i, b[i] = i + (i == 39);
    kvt_hybrid_req_t req;
    cr_assert_eq(kvt_hybrid_admit(h, 0, a, 40, 0, NULL, &req), KVT_OK);
    cr_assert_eq(kvt_hybrid_release(h, 0, b, 40, &req), KVT_EINVAL);
    cr_assert_eq(kvt_hybrid_release(h, 0, a, 36, &req), KVT_EINVAL);
    cr_assert_eq(kvt_hybrid_release(h, 1, a, 40, &req), KVT_EINVAL);
    check(h, "refused release");
    /* another cache's request, and a copy of one released, are refused, not followed (they crashed) */
    kvt_hybrid_t *other = make(ALL_THREE, 4, &su);
    kvt_hybrid_req_t theirs, copy = req;
    cr_assert_eq(kvt_hybrid_admit(other, 0, a, 40, 0, NULL, &theirs), KVT_OK);
    cr_assert_eq(kvt_hybrid_release(h, 0, a, 40, &theirs), KVT_EINVAL, "another cache's request");
    cr_assert_eq(kvt_hybrid_ready(h, &theirs), KVT_EINVAL);
    check(h, "another cache's request");
    cr_assert_eq(kvt_hybrid_release(other, 0, a, 40, &theirs), KVT_OK);
    kvt_hybrid_destroy(other);
    cr_assert_eq(kvt_hybrid_release(h, 0, a, 40, &req), KVT_OK);
    cr_assert_eq(kvt_hybrid_release(h, 0, a, 40, &req), KVT_EINVAL, "released twice");
    size_t n;
    uint64_t slots[64];
    cr_assert_eq(kvt_hybrid_ready(h, &copy), KVT_EINVAL, "a copy of a released request");
    cr_assert_eq(kvt_hybrid_slots(h, &copy, 1, slots, 64, &n), KVT_EINVAL);
    cr_assert_eq(kvt_hybrid_release(h, 0, a, 40, &copy), KVT_EINVAL);
    check(h, "end");
    kvt_hybrid_destroy(h);
}

/* ---- configurations and model descriptions ---------------------------------------- */

Test(hybrid_config, bad_configurations_are_refused) {
    kvt_hybrid_config_t good, c;
    cr_assert_eq(kvt_hybrid_config_default(&good, ALL_THREE, 4, 16, 1 << 30, 1 << 30, 0), KVT_OK);
    cr_assert_eq(kvt_hybrid_config_default(&c, ALL_THREE, 4, (1u << 20) + 1, 1 << 30, 1 << 30, 0), KVT_EINVAL,
                 "a page size the cache refuses");
    kvt_hybrid_t *h = NULL;
    cr_assert_eq(kvt_hybrid_create(&h, &good), KVT_OK);
    kvt_hybrid_destroy(h);
    h = NULL;
    c = good, c.groups[0].kind = KVT_GROUP_WINDOW; /* a window without a window, and no full group */
    cr_assert_eq(kvt_hybrid_create(&h, &c), KVT_EINVAL);
    c = good, c.groups[1].window = 0;
    cr_assert_eq(kvt_hybrid_create(&h, &c), KVT_EINVAL);
    c = good, c.groups[2].bytes = 0;
    cr_assert_eq(kvt_hybrid_create(&h, &c), KVT_EINVAL);
    c = good, c.l1_slots[0] = 5; /* slots for a full group */
    cr_assert_eq(kvt_hybrid_create(&h, &c), KVT_EINVAL);
    c = good, c.l2_slots[1] = 0; /* L2 present, the group has none */
    cr_assert_eq(kvt_hybrid_create(&h, &c), KVT_EINVAL);
    c = good, c.l3_slots[1] = 7; /* no L3 */
    cr_assert_eq(kvt_hybrid_create(&h, &c), KVT_EINVAL);
    c = good, c.cache.write_policy = KVT_WRITE_THROUGH_SELECTIVE;
    cr_assert_eq(kvt_hybrid_create(&h, &c), KVT_EINVAL);
    c = good, c.ngroups = 0;
    cr_assert_eq(kvt_hybrid_create(&h, &c), KVT_EINVAL);
    c = good, c.groups[1].bytes = UINT64_MAX / 8; /* a window page of 16 tokens past 2^64 bytes: the counters wrapped */
    cr_assert_eq(kvt_hybrid_create(&h, &c), KVT_EINVAL);
    cr_assert_eq(kvt_hybrid_piece_bytes(&c.groups[1], 16), UINT64_MAX, "saturated, not wrapped");
    c = good, c.groups[0].bytes = UINT64_MAX / 16 / 2; /* a full page fits; a tier of them does not */
    cr_assert_eq(kvt_hybrid_create(&h, &c), KVT_EINVAL);
    /* each group's tier fits in 64 bits, the tier's bytes over the groups do not (stats' l1_bytes wrapped to 0) */
    c = good, c.ngroups = 2, c.cache.l1_pages = 2, c.cache.l2_pages = 0, c.l1_slots[1] = 2;
    memset(c.l2_slots, 0, sizeof(c.l2_slots));
    c.l1_slots[2] = c.l1_slots[3] = 0;
    c.groups[0].bytes = c.groups[1].bytes = UINT64_C(1) << 58; /* 2 x 2^62-byte pages or slots: 2^63 a group */
    cr_assert_eq(kvt_hybrid_create(&h, &c), KVT_EINVAL);
    c.groups[1].bytes = UINT64_C(1) << 57;
    cr_assert_eq(kvt_hybrid_create(&h, &c), KVT_OK, "2^63 + 2^62 bytes fit");
    kvt_hybrid_destroy(h);
    cr_assert_eq(kvt_hybrid_config_default(&c, ALL_THREE, 4, 16, 1024, 0, 0), KVT_EINVAL, "1 KiB holds no checkpoint");
}

Test(hybrid_config, the_default_split_spends_each_tier_once) {
    const kvt_model_t *m = kvt_model_find("qwen3-next-like");
    kvt_layer_group_t g[KVT_MODEL_MAX_GROUPS];
    uint32_t n;
    cr_assert_eq(kvt_model_groups(m, g, KVT_MODEL_MAX_GROUPS, &n), KVT_OK);
    const uint64_t bytes = 80ull << 30;
    kvt_hybrid_config_t c;
    cr_assert_eq(kvt_hybrid_config_default(&c, g, n, 16, bytes, 0, 0), KVT_OK);
    double used = (double)c.cache.l1_pages * (double)g[0].bytes * 16 + (double)c.l1_slots[1] * (double)g[1].bytes;
    cr_assert(used <= (double)bytes && used > 0.99 * (double)bytes, "the split uses %.0f of %" PRIu64 " bytes", used,
              bytes);
    cr_assert(c.l1_slots[1] * g[1].bytes <= bytes / 4 + g[1].bytes, "state takes a quarter");
}

/* The default weighs a window group by an eighth without an L3, and with
 * one by the whole in L1 and L2 and a quarter in L3 (hybrid.h): the slots
 * of explicit splits at those weights. */
Test(hybrid_config, the_default_window_weight_depends_on_an_l3) {
    kvt_layer_group_t g[KVT_MODEL_MAX_GROUPS];
    uint32_t n;
    cr_assert_eq(kvt_model_groups(kvt_model_find("gemma-3-like"), g, KVT_MODEL_MAX_GROUPS, &n), KVT_OK);
    const uint64_t b1 = 40ull << 30, b2 = 80ull << 30, b3 = 1ull << 40;
    kvt_hybrid_config_t d, want;
    cr_assert_eq(kvt_hybrid_config_default(&d, g, n, 16, b1, b2, 0), KVT_OK);
    want = d;
    cr_assert_eq(kvt_hybrid_config_split(&want, b1, b2, 0, 0.25, 0.125), KVT_OK);
    cr_assert(d.l1_slots[1] == want.l1_slots[1] && d.l2_slots[1] == want.l2_slots[1] && d.l1_slots[1] > 0);
    cr_assert_eq(kvt_hybrid_config_default(&d, g, n, 16, b1, b2, b3), KVT_OK);
    want = d;
    cr_assert_eq(kvt_hybrid_config_split(&want, b1, b2, b3, 0.25, 1.0), KVT_OK);
    cr_assert(d.l1_slots[1] == want.l1_slots[1] && d.l2_slots[1] == want.l2_slots[1] &&
                  d.cache.l1_pages == want.cache.l1_pages,
              "with an L3, L1 and L2 weigh the window group as much as the full one");
    cr_assert_eq(kvt_hybrid_config_split_tier(&want, 3, b3, 0.25, 0.25), KVT_OK);
    cr_assert(d.l3_slots[1] == want.l3_slots[1] && d.cache.l3_pages == want.cache.l3_pages, "and L3 by a quarter");
}

/* One tier split again leaves the others as they were and gives that tier
 * what a whole split at its weight gives it; a bad call changes nothing. */
Test(hybrid_config, one_tier_split_alone) {
    const kvt_model_t *m = kvt_model_find("gemma-3-like");
    kvt_layer_group_t g[KVT_MODEL_MAX_GROUPS];
    uint32_t n;
    cr_assert_eq(kvt_model_groups(m, g, KVT_MODEL_MAX_GROUPS, &n), KVT_OK);
    const uint64_t b1 = 8ull << 30, b2 = 32ull << 30, b3 = 512ull << 30;
    kvt_hybrid_config_t c, whole, before;
    cr_assert_eq(kvt_hybrid_config_default(&c, g, n, 16, b1, b2, b3), KVT_OK);
    whole = c;
    cr_assert_eq(kvt_hybrid_config_split(&whole, b1, b2, b3, 0.25, 0.5), KVT_OK);
    before = c;
    cr_assert_eq(kvt_hybrid_config_split_tier(&c, 3, b3, 0.25, 0.5), KVT_OK);
    cr_assert_eq(c.cache.l3_pages, whole.cache.l3_pages);
    cr_assert_eq(memcmp(c.l3_slots, whole.l3_slots, sizeof(c.l3_slots)), 0);
    cr_assert_eq(c.cache.l1_pages, before.cache.l1_pages);
    cr_assert_eq(c.cache.l2_pages, before.cache.l2_pages);
    cr_assert_eq(memcmp(c.l1_slots, before.l1_slots, sizeof(c.l1_slots)), 0);
    cr_assert_eq(memcmp(c.l2_slots, before.l2_slots, sizeof(c.l2_slots)), 0);
    cr_assert_gt(c.l3_slots[1], before.l3_slots[1], "a heavier window weight gives the window group more of L3");
    before = c;
    cr_assert_eq(kvt_hybrid_config_split_tier(&c, 0, b1, 0.25, 0.5), KVT_EINVAL, "no tier 0");
    cr_assert_eq(kvt_hybrid_config_split_tier(&c, 4, b1, 0.25, 0.5), KVT_EINVAL, "no tier 4");
    cr_assert_eq(kvt_hybrid_config_split_tier(&c, 1, 0, 0.25, 0.5), KVT_EINVAL, "an L1 of no bytes");
    cr_assert_eq(kvt_hybrid_config_split_tier(&c, 2, 0, 0.25, 0.5), KVT_EINVAL, "L3 left without an L2");
    cr_assert_eq(kvt_hybrid_config_split_tier(&c, 3, b3, 0.25, 0), KVT_EINVAL, "a weight of 0");
    cr_assert_eq(kvt_hybrid_config_split_tier(&c, 3, 1024, 0.25, 0.5), KVT_EINVAL, "1 KiB holds no page");
    cr_assert_eq(memcmp(&c, &before, sizeof(c)), 0, "a refused split changes nothing");
    cr_assert_eq(kvt_hybrid_config_split_tier(&c, 3, 0, 0.25, 0.5), KVT_OK, "L3 of no bytes: none");
    cr_assert_eq(c.cache.l3_pages, 0);
    cr_assert_eq(c.l3_slots[1], 0);
}

/* ---- the pieces' eviction order under the cache's policy ------------------------- */

/* Requests of two pages (one root each, at a priority) whose window (two
 * pages) needs both; the full pages all stay, so whether a request hits
 * says whether its window pieces were kept. */
typedef struct {
    int32_t root, prio;
} rq_t;

static uint64_t hit_pages(kvt_hybrid_t *h, rq_t q, uint32_t *tier) {
    int32_t tok[8];
    for (int i = 0; i < 8; i++) tok[i] = q.root * 100 + i;
    kvt_hybrid_req_t rq;
    cr_assert_eq(kvt_hybrid_admit(h, 0, tok, 8, q.prio, NULL, &rq), KVT_OK);
    cr_assert_eq(kvt_hybrid_release(h, 0, tok, 8, &rq), KVT_OK);
    check(h, "two-page request");
    if (tier) *tier = rq.hit_tier;
    return rq.hit_pages;
}

#define A(p) {1, p}
#define B(p) {2, p}
#define C(p) {3, p}
#define D(p) {4, p}
#define ANY UINT64_MAX
enum { NPOL = 7 };
static const kvt_policy_t POLICIES[NPOL] = {KVT_POLICY_LRU, KVT_POLICY_S2LRU, KVT_POLICY_ARC, KVT_POLICY_LFU,
                                            KVT_POLICY_FIFO, KVT_POLICY_PRIORITY, KVT_POLICY_SLRU};

/* A sequence run under every policy: the warm requests, then the probes,
 * whose hit pages (or with `tiers` the tier they hit from) each policy must
 * give (want[policy][probe], in POLICIES' order; ANY: not checked), worked
 * out by hand from the policy's rule (policy.c's, which hybrid.c follows
 * for the pieces). */
typedef struct {
    const char *what;
    int tiers;
    uint64_t l1, l2;            /* window slots; l2 > 0: an L2 below */
    kvt_write_policy_t write;   /* L1's write policy, with an L2 */
    rq_t warm[8], probe[3];
    size_t nwarm, nprobe;
    uint64_t want[NPOL][3];
} order_case_t;

static const order_case_t ORDER_CASES[] = {
    /* four L1 slots: A twice (a hit uses A's pieces), B, then C evicts two pieces.
     *   lru, fifo, priority (all 0), slru (A hit once)  C evicts A's, the oldest; A's return evicts B's
     *   s2lru, lfu  C evicts B's (seen once, no hits) and B's return evicts C's: A stays
     *   arc  as s2lru until B misses pieces its class-0 ghost remembers: the seen-once
     *        share grows to B's two, and B's return evicts A's */
    {"A A B C | B C A", 0, 4, 0, KVT_WRITE_THROUGH, {A(0), A(0), B(0), C(0)}, {B(0), C(0), A(0)}, 4, 3,
     {{2, 2, 0}, {0, 0, 2}, {0, 2, 0}, {0, 0, 2}, {2, 2, 0}, {2, 2, 0}, {2, 2, 0}}},
    /* A at priority 5, B hit twice: only priority has C evict B's (the lower priority) */
    {"A5 B B B C | B A", 0, 4, 0, KVT_WRITE_THROUGH, {A(5), B(0), B(0), B(0), C(0)}, {B(0), A(0)}, 5, 2,
     {{2, 0}, {2, 0}, {2, 0}, {2, 0}, {2, 0}, {0, 2}, {2, 0}}},
    /* the same, A's priority raised by a hit */
    {"A A5 B B B C | B A", 0, 4, 0, KVT_WRITE_THROUGH, {A(0), A(5), B(0), B(0), B(0), C(0)}, {B(0), A(0)}, 6, 2,
     {{2, 0}, {2, 0}, {2, 0}, {2, 0}, {2, 0}, {0, 2}, {2, 0}}},
    /* A hit twice, B once: lfu (fewer hits) and slru (A protected at its second hit) have C
     * evict B's; the others A's, the older (s2lru and arc: both seen again) */
    {"A A A B B C | B A", 0, 4, 0, KVT_WRITE_THROUGH, {A(0), A(0), A(0), B(0), B(0), C(0)}, {B(0), A(0)}, 6, 2,
     {{2, 0}, {2, 0}, {2, 0}, {0, 2}, {2, 0}, {2, 0}, {0, 2}}},
    /* A hit after B is stored: fifo alone has C evict A's (stored first), and A's return B's */
    {"A B A C | A B", 0, 4, 0, KVT_WRITE_THROUGH, {A(0), B(0), A(0), C(0)}, {A(0), B(0)}, 4, 2,
     {{2, 0}, {2, 0}, {2, 0}, {2, 0}, {0, 0}, {2, 0}, {2, 0}}},
    /* two L1 slots over four in L2 (write-through): A twice, B, then C's store evicts from
     * L2. No classes below L1: A's pieces leave L2 first (the oldest), though a hit used
     * them, but under lfu, whose hit count goes down with them (B's go: no hits) */
    {"L2 write_through: A A B C | B A", 0, 2, 4, KVT_WRITE_THROUGH, {A(0), A(0), B(0), C(0)}, {B(0), A(0)}, 4, 2,
     {{2, 0}, {2, 0}, {2, 0}, {0, 2}, {2, 0}, {2, 0}, {2, 0}}},
    /* the same, write-back: what L1 evicts goes down with its hit count (A's, at B's
     * store); C and D push B's and C's down, and L2 evicts A's, the first down, but under
     * lfu B's (no hits) */
    {"L2 write_back: A A B C D | B A", 0, 2, 4, KVT_WRITE_BACK, {A(0), A(0), B(0), C(0), D(0)}, {B(0), A(0)}, 5, 2,
     {{2, 0}, {2, 0}, {2, 0}, {0, 2}, {2, 0}, {2, 0}, {2, 0}}},
    /* lfu, the tier A hits from: A hit once, B twice; C evicts A's from L1; A hits from L2
     * and comes up with its count (now 2, as B's); D evicts B's, the older: A hits in L1 */
    {"lfu, L1 4, L2 8: A A B B B C A D | A", 1, 4, 8, KVT_WRITE_THROUGH,
     {A(0), A(0), B(0), B(0), B(0), C(0), A(0), D(0)}, {A(0)}, 8, 1,
     {{ANY}, {ANY}, {ANY}, {1}, {ANY}, {ANY}, {ANY}}},
};

static void order_case(const order_case_t *oc, int pol) {
    static const kvt_layer_group_t g[] = {{KVT_GROUP_FULL, 1, 0, 0, 64}, {KVT_GROUP_WINDOW, 1, 8, 0, 64}};
    kvt_hybrid_config_t cfg;
    cr_assert_eq(kvt_hybrid_config_default(&cfg, g, 2, 4, 1 << 20, oc->l2 ? 1 << 20 : 0, 0), KVT_OK);
    cfg.cache.l1_pages = 1 << 10; /* the full pages all stay */
    if (oc->l2) cfg.cache.l2_pages = 1 << 10;
    cfg.cache.policy = POLICIES[pol];
    cfg.cache.write_policy = oc->write;
    cfg.l1_slots[1] = oc->l1;
    cfg.l2_slots[1] = oc->l2;
    kvt_hybrid_t *h = NULL;
    cr_assert_eq(kvt_hybrid_create(&h, &cfg), KVT_OK);
    for (size_t i = 0; i < oc->nwarm; i++) hit_pages(h, oc->warm[i], NULL);
    for (size_t i = 0; i < oc->nprobe; i++) {
        uint32_t tier;
        uint64_t got = hit_pages(h, oc->probe[i], &tier);
        if (oc->tiers) got = tier;
        if (oc->want[pol][i] == ANY) continue;
        cr_assert_eq(got, oc->want[pol][i], "%s under %s: probe %zu hit %" PRIu64 " %s, want %" PRIu64, oc->what,
                     kvt_policy_name(POLICIES[pol]), i, got, oc->tiers ? "(tier)" : "pages", oc->want[pol][i]);
    }
    kvt_hybrid_destroy(h);
}

Test(hybrid_policy, the_pieces_follow_the_caches_policy) {
    for (size_t c = 0; c < sizeof(ORDER_CASES) / sizeof(ORDER_CASES[0]); c++)
        for (int pol = 0; pol < NPOL; pol++) order_case(&ORDER_CASES[c], pol);
}

Test(model_groups, presets_and_descriptions) {
    kvt_layer_group_t g[KVT_MODEL_MAX_GROUPS];
    uint32_t n = 0, bad = 99;
    const kvt_model_t *gemma = kvt_model_find("gemma-3-like");
    cr_assert_not_null(gemma);
    cr_assert_eq(kvt_model_groups(gemma, g, KVT_MODEL_MAX_GROUPS, &n), KVT_OK);
    cr_assert_eq(n, 2);
    cr_assert_eq(g[0].kind, KVT_GROUP_FULL);
    cr_assert_eq(g[0].layers + g[1].layers, gemma->layers, "the groups hold every layer");
    cr_assert_eq(g[1].window, 1024);
    cr_assert_eq(g[0].bytes + g[1].bytes, gemma->bytes_per_token, "as all-full: the same bytes per token");
    for (unsigned i = 0; kvt_model_at(i); i++) { /* every preset's groups hold its layers */
        const kvt_model_t *m = kvt_model_at(i);
        cr_assert_eq(kvt_model_groups(m, g, KVT_MODEL_MAX_GROUPS, &n), KVT_OK);
        uint32_t layers = 0;
        for (uint32_t k = 0; k < n; k++) layers += g[k].layers;
        cr_assert_eq(layers, m->layers, "%s", m->name);
    }
    cr_assert_eq(kvt_model_groups(gemma, g, 1, &n), KVT_ERANGE);
    cr_assert_eq(n, 2);
    kvt_model_t copy = *gemma;
    cr_assert_eq(kvt_model_groups(&copy, g, 8, &n), KVT_EINVAL, "not a preset");

    cr_assert_eq(kvt_model_parse_groups("full:10:8192,window:1024:52:8192,state:3:100", g, 8, &n, &bad), KVT_OK);
    cr_assert_eq(n, 3);
    cr_assert_eq(g[1].kind, KVT_GROUP_WINDOW);
    cr_assert_eq(g[1].window, 1024);
    cr_assert_eq(g[1].bytes, 52ull * 8192);
    cr_assert_eq(g[2].bytes, 300);
    cr_assert_eq(kvt_model_parse_groups("nemotron-h-like", g, 8, &n, &bad), KVT_OK);
    cr_assert_eq(g[1].kind, KVT_GROUP_STATE);
    static const struct {
        const char *text;
        uint32_t bad;
    } BAD[] = {{"", 0}, {"llama", 0}, {"full:10", 0}, {"full:0:5", 0}, {"full:1:5,window:0:1:5", 1},
               {"full:1:5,window:8:1:5:", 1}, {"full:1:5,", 1}, {"window:8:1:5", 1}, {"full:1:5,state:1:x", 1},
               {"full:1:99999999999999999999999", 0}, {"full:1:5,,state:1:1", 1}};
    for (size_t i = 0; i < sizeof(BAD) / sizeof(BAD[0]); i++) {
        kvt_layer_group_t keep = g[0];
        cr_assert_eq(kvt_model_parse_groups(BAD[i].text, g, 8, &n, &bad), KVT_EINVAL, "'%s' accepted", BAD[i].text);
        cr_assert_eq(bad, BAD[i].bad, "'%s': group %u named, want %u", BAD[i].text, bad, BAD[i].bad);
        cr_assert_eq(memcmp(&keep, &g[0], sizeof(keep)), 0, "'%s' wrote out", BAD[i].text);
    }
    cr_assert_eq(kvt_model_parse_groups("full:1:1,full:1:1,full:1:1,full:1:1,full:1:1,full:1:1,full:1:1,full:1:1,full:1:1",
                                        g, 8, &n, &bad), KVT_ERANGE);
}

/* ---- failed allocations ------------------------------------------------------------ */

#include "core/mem-int.h"

/* Each allocation of create, admit and release failed in turn: create
 * leaves nothing behind; admit fails with nothing changed or serves a hit
 * with its pieces in L1 (never a piece it could not pin); release lets the
 * request go whatever fails; the check holds after every call, and the cache
 * serves the next requests. */
Test(hybrid_alloc, every_allocation_failure_leaves_a_consistent_cache) {
    setup_t su = {.P = 4, .every = 2, .policy = KVT_WRITE_BACK, .l1_slots = 24, .l2_slots = 40, .l3_slots = 1 << 10};
    for (uint64_t nth = 1;; nth++) {
        kvt__mem_fail_nth(nth);
        kvt_hybrid_config_t cfg;
        kvt_hybrid_t *h = NULL;
        cr_assert_eq(kvt_hybrid_config_default(&cfg, ALL_THREE, 4, 4, 1 << 30, 1 << 30, 1 << 30), KVT_OK);
        int rc = kvt_hybrid_create(&h, &cfg);
        int fired = kvt__mem_fail_fired();
        kvt__mem_fail_nth(0);
        if (!fired) {
            kvt_hybrid_destroy(h);
            break;
        }
        cr_assert(rc == KVT_ENOMEM && h == NULL, "create, allocation %" PRIu64 ": %s", nth, kvt_err_name(rc));
    }
    int32_t *tok = malloc(4096 * sizeof(*tok)), *prev = malloc(4096 * sizeof(*prev));
    int failures = 0;
    for (uint64_t nth = 1; nth < 400; nth++) {
        kvt_hybrid_t *h = make(ALL_THREE, 4, &su);
        kvt_rng_t r;
        kvt_rng_seed(&r, 41);
        uint64_t nprev = 0;
        for (int q = 0; q < 30; q++) { /* warm: pieces in every tier */
            uint64_t nt = next_request(&r, tok, prev, nprev, 4);
            kvt_hybrid_req_t req;
            cr_assert_eq(kvt_hybrid_admit(h, 0, tok, nt, 0, NULL, &req), KVT_OK);
            cr_assert_eq(kvt_hybrid_release(h, 0, tok, nt, &req), KVT_OK);
            memcpy(prev, tok, nt * sizeof(*tok));
            nprev = nt;
        }
        uint64_t nt = next_request(&r, tok, prev, nprev, 4);
        kvt_hybrid_stats_t before = {.size = sizeof(before)}, after = {.size = sizeof(after)};
        kvt_hybrid_stats(h, &before);
        uint64_t digest = kvt_hybrid_digest(h);
        kvt_hybrid_req_t req;
        kvt__mem_fail_nth(nth);
        int rc = kvt_hybrid_admit(h, 0, tok, nt, 0, NULL, &req);
        if (rc == KVT_OK) rc = kvt_hybrid_release(h, 0, tok, nt, &req) == KVT_OK ? KVT_OK : 1;
        int fired = kvt__mem_fail_fired();
        kvt__mem_fail_nth(0);
        failures += fired;
        if (rc == KVT_ENOMEM) { /* admit refused: nothing counted */
            kvt_hybrid_stats(h, &after);
            cr_assert_eq(after.requests, before.requests, "allocation %" PRIu64, nth);
            cr_assert_eq(kvt_hybrid_digest(h), digest, "allocation %" PRIu64 ": a decision made", nth);
        }
        check(h, "after the failure");
        for (int q = 0; q < 5; q++) { /* and it goes on */
            kvt_hybrid_req_t more;
            cr_assert_eq(kvt_hybrid_admit(h, 0, tok, nt, 0, NULL, &more), KVT_OK);
            cr_assert_eq(kvt_hybrid_release(h, 0, tok, nt, &more), KVT_OK);
        }
        check(h, "after more requests");
        kvt_hybrid_destroy(h);
        if (!fired) break;
    }
    cr_assert_gt(failures, 3, "the admission and release allocate");
    free(tok);
    free(prev);
}

/* ---- the bytes: the engine runs the moves ------------------------------------------- */

/* The first page of the window before n pages, as hybrid.h says it. */
static uint64_t first_needed(const kvt_layer_group_t *g, uint32_t P, uint64_t n) {
    return n * P > g->window ? (n * P - g->window) / P : 0;
}

/* What a slot holds: the tag of the piece written there (0: nothing yet). */
static uint64_t tag_of(kvt_key128_t k) { return (k.hi ^ (k.lo * 0x9E3779B97F4A7C15ull)) | 1; }

typedef struct {
    uint64_t *slot[KVT_MODEL_MAX_GROUPS][3];
    uint64_t loads_from[4]; /* moves into L1 by source tier */
} bytes_t;

/* Runs the moves as an engine would, checking each source holds the piece the
 * move names (a move run out of order would copy another piece's bytes). */
static void run_moves(kvt_hybrid_t *h, bytes_t *b, const kvt_hash128_t *hash, uint64_t np) {
    kvt_hybrid_move_t mv[64];
    for (size_t k; (k = kvt_hybrid_take_moves(h, mv, 64)) > 0;)
        for (size_t i = 0; i < k; i++) {
            const kvt_hybrid_move_t *m = &mv[i];
            cr_assert(m->dst_tier >= 1 && m->dst_tier <= 3 && m->src_tier <= 3);
            uint64_t v;
            if (m->src_tier == KVT_HYBRID_ENGINE) { /* the request's own page or point: its key is its hash */
                uint64_t page = ALL_THREE[m->group].kind == KVT_GROUP_STATE ? m->src_slot - 1 : m->src_slot;
                cr_assert_lt(page, np);
                cr_assert(m->key.hi == hash[page].hi && m->key.lo == hash[page].lo, "an engine move names another key");
                v = tag_of(m->key);
            } else {
                v = b->slot[m->group][m->src_tier - 1][m->src_slot];
                cr_assert_eq(v, tag_of(m->key), "group %u: L%u slot %" PRIu64 " does not hold the piece moved from it",
                             m->group, m->src_tier, m->src_slot);
            }
            if (m->dst_tier == 1) b->loads_from[m->src_tier]++;
            b->slot[m->group][m->dst_tier - 1][m->dst_slot] = v;
        }
}

Test(hybrid_bytes, the_moves_put_every_needed_piece_in_its_l1_slot) {
    for (int policy = KVT_WRITE_THROUGH; policy <= KVT_WRITE_BACK; policy += KVT_WRITE_BACK) {
        const uint32_t P = 4;
        kvt_hybrid_config_t cfg;
        cr_assert_eq(kvt_hybrid_config_default(&cfg, ALL_THREE, 4, P, 1 << 30, 1 << 30, 1 << 30), KVT_OK);
        cfg.cache.l1_pages = cfg.cache.l2_pages = cfg.cache.l3_pages = 1 << 14;
        cfg.cache.write_policy = cfg.cache.l3_write_policy = (kvt_write_policy_t)policy;
        cfg.checkpoint_every = 3;
        cfg.moves = true;
        cfg.cache.l1_free_room = cfg.cache.l2_free_room = 0.2; /* rounds of 8 and 12 slots */
        const uint64_t slots[3] = {40, 60, 120};
        bytes_t b = {0};
        for (uint32_t g = 1; g < 4; g++)
            for (int t = 0; t < 3; t++) {
                (t == 0 ? cfg.l1_slots : t == 1 ? cfg.l2_slots : cfg.l3_slots)[g] = slots[t];
                b.slot[g][t] = calloc(slots[t], sizeof(uint64_t));
            }
        kvt_hybrid_t *h = NULL;
        cr_assert_eq(kvt_hybrid_create(&h, &cfg), KVT_OK);
        int32_t *tok = malloc(64 * 1024 * sizeof(*tok)), *prev = malloc(64 * 1024 * sizeof(*prev));
        kvt_hash128_t *hash = malloc(4096 * sizeof(*hash));
        kvt_rng_t r;
        kvt_rng_seed(&r, 51 + (uint64_t)policy);
        uint64_t nprev = 0, hits = 0;
        for (int q = 0; q < 400; q++) {
            uint64_t nt = next_request(&r, tok, prev, nprev, P), np = nt / P;
            kvt_page_hash_chain(0, tok, np, P, hash);
            kvt_hybrid_req_t req;
            cr_assert_eq(kvt_hybrid_admit(h, 0, tok, nt, 0, NULL, &req), KVT_OK);
            run_moves(h, &b, hash, np);
            uint64_t n = req.hit_pages;
            hits += n > 0;
            for (uint32_t g = 1; g < 4; g++) { /* each piece the hit needs, in its L1 slot */
                uint64_t s[64];
                size_t k;
                cr_assert_eq(kvt_hybrid_slots(h, &req, g, s, 64, &k), KVT_OK);
                uint64_t first = ALL_THREE[g].kind == KVT_GROUP_STATE ? n - 1 : first_needed(&ALL_THREE[g], P, n);
                cr_assert_eq(k, n == 0 ? 0 : ALL_THREE[g].kind == KVT_GROUP_STATE ? 1 : n - first);
                for (size_t i = 0; i < k; i++)
                    cr_assert_eq(b.slot[g][0][s[i]], tag_of((kvt_key128_t){hash[first + i].hi, hash[first + i].lo}),
                                 "policy %d request %d group %u: piece %zu of the hit is not in its L1 slot", policy, q,
                                 g, i);
            }
            cr_assert_eq(kvt_hybrid_release(h, 0, tok, nt, &req), KVT_OK);
            run_moves(h, &b, hash, np);
            check(h, "release");
            memcpy(prev, tok, nt * sizeof(*tok));
            nprev = nt;
        }
        cr_assert_gt(hits, 20);
        cr_assert_gt(b.loads_from[2], 0, "policy %d: no piece came back from L2", policy);
        cr_assert_gt(b.loads_from[3], 0, "policy %d: no piece came back from L3", policy);
        kvt_hybrid_stats_t st = {.size = sizeof(st)};
        kvt_hybrid_stats(h, &st);
        cr_assert_gt(st.round_evictions, 0, "policy %d: free-room rounds ran", policy);
        kvt_hybrid_destroy(h);
        for (uint32_t g = 1; g < 4; g++)
            for (int t = 0; t < 3; t++) free(b.slot[g][t]);
        free(hash);
        free(tok);
        free(prev);
    }
}

/* ---- an L3 outside the cache ----------------------------------------------------- */

/* The engine's store: what it was given, by group and key (a plain list). */
typedef struct {
    struct {
        uint32_t g;
        kvt_key128_t k;
        uint64_t tag;
    } e[8192];
    size_t n;
    uint64_t probes, calls; /* keys asked; calls */
} outside_t;

static uint64_t *outside_find(outside_t *o, uint32_t g, kvt_key128_t k) {
    for (size_t i = 0; i < o->n; i++)
        if (o->e[i].g == g && o->e[i].k.hi == k.hi && o->e[i].k.lo == k.lo) return &o->e[i].tag;
    return NULL;
}

static int outside_probe(void *arg, uint32_t g, const kvt_key128_t *keys, size_t n, uint8_t *present) {
    outside_t *o = arg;
    o->probes += n;
    o->calls++;
    cr_assert(n >= 1 && n <= 64, "a probe of %zu keys", n);
    for (size_t i = 0; i < n; i++) present[i] = outside_find(o, g, keys[i]) != NULL;
    return 0;
}

/* L1 and L2 slots so few that a hit's pieces must come back from the store
 * outside; every piece a load names was put there first, and every hit's
 * pieces land in their L1 slots. */
Test(hybrid_outside, pieces_come_back_from_the_engines_store) {
    for (int policy = KVT_WRITE_THROUGH; policy <= KVT_WRITE_BACK; policy += KVT_WRITE_BACK) {
        const uint32_t P = 4;
        kvt_hybrid_config_t cfg;
        cr_assert_eq(kvt_hybrid_config_default(&cfg, ALL_THREE, 4, P, 1 << 30, 1 << 30, 0), KVT_OK);
        cfg.cache.l1_pages = cfg.cache.l2_pages = 1 << 14;
        cfg.cache.write_policy = cfg.cache.l3_write_policy = (kvt_write_policy_t)policy;
        cfg.checkpoint_every = 3;
        cfg.moves = true;
        bytes_t b = {0};
        for (uint32_t g = 1; g < 4; g++) {
            cfg.l1_slots[g] = 30;
            cfg.l2_slots[g] = 40;
            b.slot[g][0] = calloc(30, sizeof(uint64_t));
            b.slot[g][1] = calloc(40, sizeof(uint64_t));
        }
        kvt_hybrid_t *h = NULL;
        cr_assert_eq(kvt_hybrid_create(&h, &cfg), KVT_OK);
        outside_t *o = calloc(1, sizeof(*o));
        cr_assert_eq(kvt_hybrid_set_l3(h, outside_probe, o), KVT_OK);
        int32_t *tok = malloc(64 * 1024 * sizeof(*tok)), *prev = malloc(64 * 1024 * sizeof(*prev));
        kvt_hash128_t *hash = malloc(4096 * sizeof(*hash));
        kvt_rng_t r;
        kvt_rng_seed(&r, 61 + (uint64_t)policy);
        uint64_t nprev = 0, from_outside = 0, puts = 0;
        for (int q = 0; q < 400; q++) {
            uint64_t nt = next_request(&r, tok, prev, nprev, P), np = nt / P;
            kvt_page_hash_chain(0, tok, np, P, hash);
            kvt_hybrid_req_t req;
            cr_assert_eq(kvt_hybrid_admit(h, 0, tok, nt, 0, NULL, &req), KVT_OK);
            for (int phase = 0; phase < 2; phase++) {
                kvt_hybrid_move_t mv[64];
                for (size_t k; (k = kvt_hybrid_take_moves(h, mv, 64)) > 0;)
                    for (size_t i = 0; i < k; i++) {
                        const kvt_hybrid_move_t *m = &mv[i];
                        uint64_t v;
                        if (m->src_tier == 3) { /* a get by key */
                            cr_assert_eq(m->src_slot, UINT64_MAX);
                            uint64_t *t = outside_find(o, m->group, m->key);
                            cr_assert_not_null(t, "group %u: a load from a store that never had the piece", m->group);
                            v = *t;
                            from_outside++;
                        } else if (m->src_tier == KVT_HYBRID_ENGINE) {
                            v = tag_of(m->key);
                        } else {
                            v = b.slot[m->group][m->src_tier - 1][m->src_slot];
                            cr_assert_eq(v, tag_of(m->key), "L%u slot %" PRIu64 " does not hold its piece", m->src_tier,
                                         m->src_slot);
                        }
                        if (m->dst_tier == 3) { /* a put by key */
                            cr_assert_eq(m->dst_slot, UINT64_MAX);
                            uint64_t *t = outside_find(o, m->group, m->key);
                            if (t == NULL) {
                                cr_assert_lt(o->n, 8192);
                                o->e[o->n].g = m->group;
                                o->e[o->n].k = m->key;
                                t = &o->e[o->n++].tag;
                            }
                            *t = v;
                            puts++;
                        } else {
                            b.slot[m->group][m->dst_tier - 1][m->dst_slot] = v;
                        }
                    }
                if (phase == 0) {
                    uint64_t n = req.hit_pages;
                    for (uint32_t g = 1; g < 4; g++) {
                        uint64_t s[64];
                        size_t k;
                        cr_assert_eq(kvt_hybrid_slots(h, &req, g, s, 64, &k), KVT_OK);
                        uint64_t first = ALL_THREE[g].kind == KVT_GROUP_STATE ? n - 1 : first_needed(&ALL_THREE[g], P, n);
                        for (size_t i = 0; i < k; i++)
                            cr_assert_eq(b.slot[g][0][s[i]],
                                         tag_of((kvt_key128_t){hash[first + i].hi, hash[first + i].lo}),
                                         "request %d group %u: piece %zu not in its L1 slot", q, g, i);
                    }
                    cr_assert_eq(kvt_hybrid_release(h, 0, tok, nt, &req), KVT_OK);
                }
            }
            check(h, "release");
            memcpy(prev, tok, nt * sizeof(*tok));
            nprev = nt;
        }
        cr_assert_gt(puts, 0);
        cr_assert_gt(from_outside, 0, "policy %d: no piece came back from the store outside", policy);
        cr_assert_gt(o->probes, 0);
        fprintf(stderr, "hybrid outside L3, policy %d: %" PRIu64 " pieces asked in %" PRIu64 " calls, %" PRIu64
                " loaded from it\n", policy, o->probes, o->calls, from_outside);
        cr_assert_lt(o->calls * 2, o->probes, "the pieces an admission asks for go in few calls");
        kvt_hybrid_stats_t st = {.size = sizeof(st)};
        kvt_hybrid_stats(h, &st);
        cr_assert_gt(st.l3_hit_tokens, 0);
        kvt_hybrid_destroy(h);
        for (uint32_t g = 1; g < 4; g++) {
            free(b.slot[g][0]);
            free(b.slot[g][1]);
        }
        free(o);
        free(hash);
        free(tok);
        free(prev);
    }
}

Test(hybrid_outside, set_l3_is_refused_where_it_cannot_be) {
    kvt_hybrid_config_t cfg;
    cr_assert_eq(kvt_hybrid_config_default(&cfg, ALL_THREE, 4, 4, 1 << 30, 1 << 30, 1 << 30), KVT_OK);
    kvt_hybrid_t *h = NULL;
    cr_assert_eq(kvt_hybrid_create(&h, &cfg), KVT_OK);
    outside_t *o = calloc(1, sizeof(*o));
    cr_assert_eq(kvt_hybrid_set_l3(h, outside_probe, o), KVT_EINVAL, "a modeled L3 already");
    kvt_hybrid_destroy(h);
    cr_assert_eq(kvt_hybrid_config_default(&cfg, ALL_THREE, 4, 4, 1 << 30, 0, 0), KVT_OK);
    cr_assert_eq(kvt_hybrid_create(&h, &cfg), KVT_OK);
    cr_assert_eq(kvt_hybrid_set_l3(h, outside_probe, o), KVT_EINVAL, "no L2 to put from");
    kvt_hybrid_destroy(h);
    cr_assert_eq(kvt_hybrid_config_default(&cfg, ALL_THREE, 4, 4, 1 << 30, 1 << 30, 0), KVT_OK);
    cr_assert_eq(kvt_hybrid_create(&h, &cfg), KVT_OK);
    int32_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    kvt_hybrid_req_t req;
    cr_assert_eq(kvt_hybrid_admit(h, 0, t, 8, 0, NULL, &req), KVT_OK);
    cr_assert_eq(kvt_hybrid_set_l3(h, outside_probe, o), KVT_EINVAL, "a request is live");
    cr_assert_eq(kvt_hybrid_release(h, 0, t, 8, &req), KVT_OK);
    cr_assert_eq(kvt_hybrid_set_l3(h, outside_probe, o), KVT_OK);
    kvt_hybrid_destroy(h);
    /* write_through_selective selects by hit counts, which a piece has not: no piece went down (create refuses it
     * with a modeled L3) */
    cfg.cache.l3_write_policy = KVT_WRITE_THROUGH_SELECTIVE;
    cr_assert_eq(kvt_hybrid_create(&h, &cfg), KVT_OK);
    cr_assert_eq(kvt_hybrid_set_l3(h, outside_probe, o), KVT_EINVAL, "a policy no piece goes down under");
    cr_assert_eq(kvt_hybrid_set_l3(h, NULL, NULL), KVT_OK, "no L3 for the pieces: nothing to refuse");
    kvt_hybrid_destroy(h);
    free(o);
}

/* ---- moves that complete out of order (async_moves) ------------------------------- */

#define POISON 0xBADull

/* The engine: slot arrays per group and tier, the moves it took and has not
 * reported, and what it saw. A move runs when it is reported, which is the
 * same as at any time since it was taken only if no two outstanding moves
 * touch one slot in a way that conflicts: take_all checks that. */
/* A released request whose computed bytes the engine keeps: some of its
 * moves from the engine wait for a slot (kvt_hybrid_engine_waiting). */
typedef struct {
    kvt_key128_t keys[1024];
    size_t n;
} held_t;

typedef struct {
    bytes_t b;
    outside_t *o; /* the store outside, or NULL */
    kvt_hybrid_move_t out[4096];
    size_t nout;
    uint64_t ran, failed, waited_most, held_most;
    held_t held[64]; /* released requests kept */
    size_t nheld;
    const held_t *releasing; /* the request being released: its bytes are still there */
    int keeps_all;           /* the engine never lets go of what requests computed */
} engine_t;

static int holds(const held_t *r, kvt_key128_t k) {
    for (size_t i = 0; r && i < r->n; i++)
        if (r->keys[i].hi == k.hi && r->keys[i].lo == k.lo) return 1;
    return 0;
}

static int slot_read(const kvt_hybrid_move_t *m, uint32_t *t, uint64_t *s) {
    *t = m->src_tier;
    *s = m->src_slot;
    return m->src_tier != KVT_HYBRID_ENGINE && m->src_slot != UINT64_MAX;
}

static int slot_written(const kvt_hybrid_move_t *m, uint32_t *t, uint64_t *s) {
    *t = m->dst_tier;
    *s = m->dst_slot;
    return m->dst_slot != UINT64_MAX;
}

static void take_all(kvt_hybrid_t *h, engine_t *e) {
    kvt_hybrid_move_t mv[64];
    for (size_t k; (k = kvt_hybrid_take_moves(h, mv, 64)) > 0;)
        for (size_t i = 0; i < k; i++) {
            const kvt_hybrid_move_t *x = &mv[i];
            if (x->src_tier == KVT_HYBRID_ENGINE && !e->keeps_all) { /* what a request computed: still there */
                int kept = holds(e->releasing, x->key);
                for (size_t j = 0; j < e->nheld && !kept; j++) kept = holds(&e->held[j], x->key);
                cr_assert(kept, "group %u: a move from a request whose bytes the engine let go", x->group);
            }
            uint32_t xt, yt;
            uint64_t xs, ys;
            int xw = slot_written(x, &xt, &xs);
            for (size_t j = 0; j < e->nout && xw; j++) {
                const kvt_hybrid_move_t *y = &e->out[j];
                if (y->group != x->group) continue;
                cr_assert(!(slot_written(y, &yt, &ys) && yt == xt && ys == xs),
                          "two moves outstanding write group %u L%u slot %" PRIu64, x->group, xt, xs);
                cr_assert(!(slot_read(y, &yt, &ys) && yt == xt && ys == xs),
                          "a move writes group %u L%u slot %" PRIu64 " while another reads it", x->group, xt, xs);
            }
            int xr = slot_read(x, &xt, &xs);
            for (size_t j = 0; j < e->nout && xr; j++) {
                const kvt_hybrid_move_t *y = &e->out[j];
                cr_assert(!(y->group == x->group && slot_written(y, &yt, &ys) && yt == xt && ys == xs),
                          "a move reads group %u L%u slot %" PRIu64 " while another writes it", x->group, xt, xs);
            }
            cr_assert_lt(e->nout, 4096);
            e->out[e->nout++] = *x;
        }
    uint64_t waiting = kvt_hybrid_moves_outstanding(h) - e->nout;
    if (waiting > e->waited_most) e->waited_most = waiting;
    for (size_t j = 0; j < e->nheld;) /* let go of what no move waits for */
        if (kvt_hybrid_engine_waiting(h, e->held[j].keys, e->held[j].n) == 0) e->held[j] = e->held[--e->nheld];
        else j++;
}

/* Runs one copy as the engine would: its source must hold the piece it
 * names; a failed copy into a slot leaves garbage there. Returns whether it
 * landed (a get of what the store outside does not hold fails). */
static int run_one(engine_t *e, const kvt_hybrid_move_t *m, int good) {
    uint64_t v = tag_of(m->key);
    if (m->src_tier == 3 && m->src_slot == UINT64_MAX) { /* a get from the store outside */
        uint64_t *t = outside_find(e->o, m->group, m->key);
        good = good && t != NULL; /* put failed, or not reported yet when it was probed */
        if (t) v = *t;
    } else if (m->src_tier != KVT_HYBRID_ENGINE) {
        v = e->b.slot[m->group][m->src_tier - 1][m->src_slot];
        cr_assert_eq(v, tag_of(m->key), "group %u: L%u slot %" PRIu64 " does not hold the piece moved from it",
                     m->group, m->src_tier, m->src_slot);
    }
    if (m->dst_slot != UINT64_MAX) {
        e->b.slot[m->group][m->dst_tier - 1][m->dst_slot] = good ? v : POISON;
    } else if (good) { /* a put by key */
        uint64_t *t = outside_find(e->o, m->group, m->key);
        if (t == NULL) {
            cr_assert_lt(e->o->n, 8192);
            e->o->e[e->o->n].g = m->group;
            e->o->e[e->o->n].k = m->key;
            t = &e->o->e[e->o->n++].tag;
        }
        *t = v;
    }
    e->ran++;
    e->failed += !good;
    return good;
}

/* Runs about half the outstanding moves (all with everything), in a random
 * order, one in fail_in failing, and reports them in one call. */
static void run_some(kvt_hybrid_t *h, engine_t *e, kvt_rng_t *r, int everything, uint32_t fail_in) {
    kvt_hybrid_move_t done[4096];
    uint8_t ok[4096];
    size_t nd = 0;
    for (size_t i = 0; i < e->nout;) {
        if (!everything && kvt_rng_below(r, 2)) {
            i++;
            continue;
        }
        size_t pick = i + kvt_rng_below(r, e->nout - i); /* a random one of the rest */
        done[nd] = e->out[pick];
        e->out[pick] = e->out[--e->nout];
        ok[nd] = (uint8_t)run_one(e, &done[nd], kvt_rng_below(r, fail_in) != 0);
        nd++;
    }
    cr_assert_eq(kvt_hybrid_moves_done(h, done, nd, ok), KVT_OK);
}

/* A small cache with async_moves (write policy `policy` both ways) and an
 * engine over 64-slot arrays that keeps what requests computed. */
static kvt_hybrid_t *small_async(int policy, engine_t **out) {
    kvt_hybrid_config_t cfg;
    cr_assert_eq(kvt_hybrid_config_default(&cfg, ALL_THREE, 4, 4, 1 << 30, 1 << 30, 1 << 30), KVT_OK);
    cfg.cache.l1_pages = cfg.cache.l2_pages = cfg.cache.l3_pages = 1 << 12;
    cfg.cache.write_policy = cfg.cache.l3_write_policy = (kvt_write_policy_t)policy;
    cfg.checkpoint_every = 2;
    cfg.moves = cfg.async_moves = true;
    for (uint32_t g = 1; g < 4; g++) cfg.l1_slots[g] = 16, cfg.l2_slots[g] = 24, cfg.l3_slots[g] = 64;
    kvt_hybrid_t *h = NULL;
    cr_assert_eq(kvt_hybrid_create(&h, &cfg), KVT_OK);
    engine_t *e = calloc(1, sizeof(*e));
    e->keeps_all = 1;
    for (uint32_t g = 1; g < 4; g++)
        for (int t = 0; t < 3; t++) e->b.slot[g][t] = calloc(64, sizeof(uint64_t));
    *out = e;
    return h;
}

static void free_engine(engine_t *e) {
    for (uint32_t g = 1; g < 4; g++)
        for (int t = 0; t < 3; t++) free(e->b.slot[g][t]);
    free(e->o);
    free(e);
}

/* The engine runs every move until req's pieces are in L1 (req NULL: until
 * none is outstanding). */
static void settle(kvt_hybrid_t *h, engine_t *e, kvt_rng_t *r, const kvt_hybrid_req_t *req) {
    take_all(h, e);
    for (int round = 0; req ? kvt_hybrid_ready(h, req) == KVT_EAGAIN : kvt_hybrid_moves_outstanding(h) > 0; round++) {
        cr_assert_lt(round, 64, "the moves never drain");
        run_some(h, e, r, 1, 1u << 30);
        take_all(h, e);
    }
}

typedef struct {
    int32_t tok[4096];
    kvt_hash128_t hash[1024];
    uint64_t nt, np;
    kvt_hybrid_req_t req;
    int live;
} live_t;

/* Releases request x and takes its moves; the engine keeps what x computed
 * while a move from it waits for a slot. */
static void release_kept(kvt_hybrid_t *h, engine_t *e, live_t *x) {
    cr_assert_eq(kvt_hybrid_release(h, 0, x->tok, x->nt, &x->req), KVT_OK);
    x->live = 0;
    held_t *mine = calloc(1, sizeof(*mine));
    for (uint64_t i = 0; i < x->np; i++) mine->keys[mine->n++] = (kvt_key128_t){x->hash[i].hi, x->hash[i].lo};
    e->releasing = mine;
    take_all(h, e);
    e->releasing = NULL;
    if (kvt_hybrid_engine_waiting(h, mine->keys, mine->n)) {
        cr_assert_lt(e->nheld, 64);
        e->held[e->nheld++] = *mine;
        if (e->nheld > e->held_most) e->held_most = e->nheld;
    }
    free(mine);
}

/* Every piece of a ready request's hit holds its own bytes in its L1 slot. */
static void pieces_in_place(kvt_hybrid_t *h, engine_t *e, live_t *q, uint32_t P, const char *ctx) {
    uint64_t n = q->req.hit_pages;
    for (uint32_t g = 1; g < 4; g++) {
        uint64_t s[64];
        size_t k;
        cr_assert_eq(kvt_hybrid_slots(h, &q->req, g, s, 64, &k), KVT_OK);
        uint64_t first = ALL_THREE[g].kind == KVT_GROUP_STATE ? n - 1 : first_needed(&ALL_THREE[g], P, n);
        for (size_t i = 0; i < k; i++)
            cr_assert_eq(e->b.slot[g][0][s[i]], tag_of((kvt_key128_t){q->hash[first + i].hi, q->hash[first + i].lo}),
                         "%s group %u: piece %zu of a ready hit is not in its L1 slot", ctx, g, i);
    }
}

/* Up to three requests live at once, the engine running half its moves at
 * a time in a random order, some failing: every move handed out is safe
 * beside the others outstanding, every ready hit finds its pieces in its L1
 * slots, a hit whose piece failed is told so, and the cache's check holds
 * after every call. */
static void run_async(int policy, int outside, uint64_t seed) {
    const uint32_t P = 4;
    char ctx[64];
    kvt_hybrid_config_t cfg;
    cr_assert_eq(kvt_hybrid_config_default(&cfg, ALL_THREE, 4, P, 1 << 30, 1 << 30, outside ? 0 : 1 << 30), KVT_OK);
    cfg.cache.l1_pages = cfg.cache.l2_pages = 1 << 14;
    if (!outside) cfg.cache.l3_pages = 1 << 14;
    cfg.cache.write_policy = cfg.cache.l3_write_policy = (kvt_write_policy_t)policy;
    cfg.checkpoint_every = 3;
    cfg.moves = cfg.async_moves = true;
    cfg.cache.l1_free_room = cfg.cache.l2_free_room = 0.2; /* rounds of 8 and 12 slots: their copies in flight */
    const uint64_t slots[3] = {40, 60, 120};
    engine_t *e = calloc(1, sizeof(*e));
    for (uint32_t g = 1; g < 4; g++)
        for (int t = 0; t < (outside ? 2 : 3); t++) {
            (t == 0 ? cfg.l1_slots : t == 1 ? cfg.l2_slots : cfg.l3_slots)[g] = slots[t];
            e->b.slot[g][t] = calloc(slots[t], sizeof(uint64_t));
        }
    kvt_hybrid_t *h = NULL;
    cr_assert_eq(kvt_hybrid_create(&h, &cfg), KVT_OK);
    if (outside) {
        e->o = calloc(1, sizeof(*e->o));
        cr_assert_eq(kvt_hybrid_set_l3(h, outside_probe, e->o), KVT_OK);
    }
    live_t *q = calloc(3, sizeof(*q));
    int32_t *prev = malloc(4096 * sizeof(*prev));
    kvt_rng_t r;
    kvt_rng_seed(&r, seed);
    uint64_t nprev = 0, admitted = 0, waited = 0, failed_hits = 0, ready_hits = 0, aborted = 0;
    for (int step = 0; step < 1500; step++) {
        snprintf(ctx, sizeof(ctx), "policy %d outside %d step %d", policy, outside, step);
        uint32_t slot = (uint32_t)kvt_rng_below(&r, 3);
        live_t *x = &q[slot];
        if (!x->live) { /* admit */
            do x->nt = next_request(&r, x->tok, prev, nprev, P);
            while (x->nt > 4096 - 64);
            x->np = x->nt / P;
            kvt_page_hash_chain(0, x->tok, x->np, P, x->hash);
            cr_assert_eq(kvt_hybrid_admit(h, 0, x->tok, x->nt, 0, NULL, &x->req), KVT_OK);
            x->live = 1;
            admitted++;
            memcpy(prev, x->tok, x->nt * sizeof(*prev));
            nprev = x->nt;
            take_all(h, e);
            run_some(h, e, &r, 0, 12); /* the engine copies as requests come, not only when one waits */
            take_all(h, e);
            check(h, ctx);
            continue;
        }
        int rc = kvt_hybrid_ready(h, &x->req);
        if (rc == KVT_EAGAIN) {
            waited++;
            if (kvt_rng_below(&r, 20) != 0) { /* mostly: the engine runs some copies; now and then the request goes */
                run_some(h, e, &r, 0, 12);
                take_all(h, e);
                check(h, ctx);
                continue;
            }
            aborted++;
        } else if (rc == KVT_EIO) {
            size_t k;
            uint64_t s[64];
            cr_assert_eq(kvt_hybrid_slots(h, &x->req, 2, s, 64, &k), KVT_EIO);
            failed_hits++;
        } else {
            cr_assert_eq(rc, KVT_OK, "%s: ready %s", ctx, kvt_err_name(rc));
            pieces_in_place(h, e, x, P, ctx);
            ready_hits += x->req.hit_pages > 0;
        }
        release_kept(h, e, x);
        check(h, ctx);
    }
    for (int i = 0; i < 3; i++)
        if (q[i].live) release_kept(h, e, &q[i]);
    for (int round = 0; kvt_hybrid_moves_outstanding(h) || kvt_hybrid_moves(h); round++) {
        cr_assert_lt(round, 64, "the moves never drain");
        take_all(h, e);
        run_some(h, e, &r, 1, 12);
        check(h, "drain");
    }
    kvt_hybrid_stats_t st = {.size = sizeof(st)};
    kvt_hybrid_stats(h, &st);
    fprintf(stderr, "hybrid async, policy %d outside %d: %" PRIu64 " requests, %" PRIu64 " hits ready, %" PRIu64
            " waited, %" PRIu64 " failed, %" PRIu64 " aborted waiting; %" PRIu64 " moves run, %" PRIu64
            " failed, up to %" PRIu64 " waiting for a slot, up to %" PRIu64 " released requests kept; %" PRIu64
            " pieces evicted by rounds, %" PRIu64 " for admissions\n", policy,
            outside, admitted, ready_hits, waited, failed_hits, aborted, e->ran, e->failed, e->waited_most,
            e->held_most, st.round_evictions, st.admit_evictions);
    cr_assert_gt(st.round_evictions, 0, "free-room rounds ran");
    cr_assert_gt(ready_hits, 50);
    cr_assert_gt(waited, 50, "requests waited for their pieces");
    cr_assert_gt(failed_hits, 0, "a failed copy reached a request");
    cr_assert_eq(st.moves_failed, e->failed);
    cr_assert_gt(e->b.loads_from[2] + st.l2_hit_tokens, 0);
    if (policy == KVT_WRITE_BACK) {
        cr_assert_gt(e->waited_most, 0, "a move waited for its slot's copy down");
        cr_assert_gt(e->held_most, 0, "a released request's move waited");
    }
    kvt_hybrid_destroy(h);
    free_engine(e);
    free(q);
    free(prev);
}

Test(hybrid_async, out_of_order_moves_keep_every_slot_safe) {
    run_async(KVT_WRITE_THROUGH, 0, 71);
    run_async(KVT_WRITE_BACK, 0, 72);
}

Test(hybrid_async, out_of_order_moves_with_the_engines_store) {
    run_async(KVT_WRITE_THROUGH, 1, 73);
    run_async(KVT_WRITE_BACK, 1, 74);
}

Test(hybrid_async, bad_reports_are_refused_and_change_nothing) {
    kvt_hybrid_config_t cfg;
    cr_assert_eq(kvt_hybrid_config_default(&cfg, ALL_THREE, 4, 4, 1 << 30, 1 << 30, 0), KVT_OK);
    cfg.async_moves = true;
    kvt_hybrid_t *h = NULL;
    cr_assert_eq(kvt_hybrid_create(&h, &cfg), KVT_EINVAL, "async_moves without moves");
    cfg.moves = true;
    cr_assert_eq(kvt_hybrid_create(&h, &cfg), KVT_OK);
    int32_t t[16];
    for (int i = 0; i < 16; i++) t[i] = i;
    kvt_hybrid_req_t req;
    cr_assert_eq(kvt_hybrid_admit(h, 0, t, 16, 0, NULL, &req), KVT_OK);
    cr_assert_eq(kvt_hybrid_ready(h, &req), KVT_OK, "no hit: nothing to wait for");
    cr_assert_eq(kvt_hybrid_release(h, 0, t, 16, &req), KVT_OK);
    size_t queued = kvt_hybrid_moves(h);
    cr_assert_gt(queued, 0);
    kvt_hybrid_move_t mv[64];
    uint8_t ok[64] = {1, 1};
    cr_assert_eq(kvt_hybrid_moves_done(h, mv, 0, ok), KVT_OK);
    size_t k = kvt_hybrid_take_moves(h, mv, 1);
    cr_assert_eq(k, 1);
    kvt_hybrid_move_t twice[2] = {mv[0], mv[0]};
    cr_assert_eq(kvt_hybrid_moves_done(h, twice, 2, ok), KVT_EINVAL, "one move reported twice");
    kvt_hybrid_move_t other = mv[0];
    other.dst_slot ^= 1;
    kvt_hybrid_move_t mixed[2] = {mv[0], other};
    cr_assert_eq(kvt_hybrid_moves_done(h, mixed, 2, ok), KVT_EINVAL, "a move never taken");
    cr_assert_eq(kvt_hybrid_moves_done(h, mv, 1, NULL), KVT_EINVAL);
    cr_assert_eq(kvt_hybrid_moves_outstanding(h), 1, "nothing changed");
    check(h, "after refusals");
    cr_assert_eq(kvt_hybrid_moves_done(h, mv, 1, ok), KVT_OK);
    cr_assert_eq(kvt_hybrid_moves_done(h, mv, 1, ok), KVT_EINVAL, "reported already");
    cr_assert_eq(kvt_hybrid_moves_outstanding(h), 0);
    check(h, "after the report");
    kvt_hybrid_destroy(h);
    cr_assert_eq(kvt_hybrid_config_default(&cfg, ALL_THREE, 4, 4, 1 << 30, 1 << 30, 0), KVT_OK);
    cfg.moves = true;
    cr_assert_eq(kvt_hybrid_create(&h, &cfg), KVT_OK);
    cr_assert_eq(kvt_hybrid_moves_done(h, mv, 0, ok), KVT_EINVAL, "in-order moves are not reported");
    kvt_hybrid_destroy(h);
}

/* The same with async_moves, an engine reporting every move after each
 * call: admissions and releases that fail for memory leave the pending
 * pieces, the pinned sources and the outstanding moves consistent. */
Test(hybrid_alloc, every_allocation_failure_with_async_moves_leaves_a_consistent_cache) {
    int failures[2] = {0, 0};
    int32_t *tok = malloc(4096 * sizeof(*tok)), *prev = malloc(4096 * sizeof(*prev));
    for (uint64_t nth = 1, phase = 0; phase < 2 && nth < 400; nth++) { /* the nth allocation of admit, then release */
        engine_t *e;
        kvt_hybrid_t *h = small_async(KVT_WRITE_BACK, &e);
        kvt_rng_t r;
        kvt_rng_seed(&r, 47);
        uint64_t nprev = 0;
        for (int q = 0; q < 30; q++) { /* warm: pieces in every tier, some copies left in flight */
            uint64_t nt = next_request(&r, tok, prev, nprev, 4);
            kvt_hybrid_req_t req;
            cr_assert_eq(kvt_hybrid_admit(h, 0, tok, nt, 0, NULL, &req), KVT_OK);
            settle(h, e, &r, &req);
            cr_assert_eq(kvt_hybrid_release(h, 0, tok, nt, &req), KVT_OK);
            take_all(h, e);
            run_some(h, e, &r, 0, 1u << 30);
            take_all(h, e);
            memcpy(prev, tok, nt * sizeof(*tok));
            nprev = nt;
        }
        uint64_t nt = next_request(&r, tok, prev, nprev, 4);
        kvt_hybrid_req_t req;
        kvt__mem_fail_nth(phase == 0 ? nth : 0);
        int rc = kvt_hybrid_admit(h, 0, tok, nt, 0, NULL, &req), fired = kvt__mem_fail_fired();
        kvt__mem_fail_nth(0);
        if (rc == KVT_OK) { /* its loads land, then it goes (a release short of memory still lets it go) */
            settle(h, e, &r, &req);
            kvt__mem_fail_nth(phase == 1 ? nth : 0);
            rc = kvt_hybrid_release(h, 0, tok, nt, &req);
            fired |= kvt__mem_fail_fired();
            kvt__mem_fail_nth(0);
        }
        failures[phase] += fired;
        cr_assert(rc == KVT_OK || rc == KVT_ENOMEM, "phase %d allocation %" PRIu64 ": %s", (int)phase, nth,
                  kvt_err_name(rc));
        check(h, "after the failure");
        settle(h, e, &r, NULL);
        check(h, "drained");
        for (int q = 0; q < 5; q++) { /* and it goes on */
            kvt_hybrid_req_t more;
            cr_assert_eq(kvt_hybrid_admit(h, 0, tok, nt, 0, NULL, &more), KVT_OK);
            settle(h, e, &r, &more);
            cr_assert_eq(kvt_hybrid_ready(h, &more), KVT_OK);
            cr_assert_eq(kvt_hybrid_release(h, 0, tok, nt, &more), KVT_OK);
            settle(h, e, &r, NULL);
        }
        check(h, "after more requests");
        kvt_hybrid_destroy(h);
        free_engine(e);
        if (!fired) phase++, nth = 0;
    }
    cr_assert(failures[0] > 3 && failures[1] > 3, "the admission and the release allocate: %d, %d", failures[0],
              failures[1]);
    free(tok);
    free(prev);
}

/* A report whose pieces go on down (write_through) allocates: each failure
 * there leaves the report refused with nothing changed, or taken with the
 * pieces that found no room counted; the check holds and the moves drain. */
Test(hybrid_alloc, every_allocation_failure_in_a_report_leaves_a_consistent_cache) {
    int refused = 0, fired_any = 0;
    for (uint64_t nth = 1; nth < 200; nth++) {
        engine_t *e;
        kvt_hybrid_t *h = small_async(KVT_WRITE_THROUGH, &e);
        int32_t *tok = malloc(4096 * sizeof(*tok)), *prev = malloc(4096 * sizeof(*prev));
        kvt_rng_t r;
        kvt_rng_seed(&r, 43);
        uint64_t nprev = 0;
        for (int q = 0; q < 20; q++) {
            uint64_t nt = next_request(&r, tok, prev, nprev, 4);
            kvt_hybrid_req_t req;
            cr_assert_eq(kvt_hybrid_admit(h, 0, tok, nt, 0, NULL, &req), KVT_OK);
            take_all(h, e);
            run_some(h, e, &r, 1, 1u << 30);
            cr_assert_eq(kvt_hybrid_release(h, 0, tok, nt, &req), KVT_OK);
            take_all(h, e);
            if (q < 19) run_some(h, e, &r, 1, 1u << 30);
            memcpy(prev, tok, nt * sizeof(*tok));
            nprev = nt;
        }
        cr_assert_gt(e->nout, 0);
        size_t before = kvt_hybrid_moves_outstanding(h);
        uint8_t ok[4096];
        for (size_t i = 0; i < e->nout; i++) ok[i] = (uint8_t)run_one(e, &e->out[i], 1);
        kvt__mem_fail_nth(nth);
        int rc = kvt_hybrid_moves_done(h, e->out, e->nout, ok);
        int fired = kvt__mem_fail_fired();
        kvt__mem_fail_nth(0);
        fired_any |= fired;
        if (rc == KVT_ENOMEM) {
            refused++;
            cr_assert_eq(kvt_hybrid_moves_outstanding(h), before, "a refused report changed nothing");
            check(h, "after a refused report");
            cr_assert_eq(kvt_hybrid_moves_done(h, e->out, e->nout, ok), KVT_OK);
        } else {
            cr_assert_eq(rc, KVT_OK);
        }
        e->nout = 0;
        check(h, "after the report");
        settle(h, e, &r, NULL);
        check(h, "drained");
        kvt_hybrid_destroy(h);
        free_engine(e);
        free(tok);
        free(prev);
        if (!fired) break;
    }
    fprintf(stderr, "hybrid async report: %d refused for memory\n", refused);
    cr_assert(fired_any, "the report allocates");
}

/* check() holds L1's pins to the live requests' pieces while requests are
 * live too (it saw a stray pin only once none was): a pin that no request
 * holds, planted beside a live request that pins nothing, is found, and one
 * beside two requests that pin the same pieces. */
Test(hybrid_bounded, check_finds_a_pin_no_live_request_holds) {
    setup_t su = {.P = 4, .every = 0, .policy = KVT_WRITE_THROUGH, .l1_slots = 1 << 10};
    kvt_hybrid_t *h = make(ALL_THREE, 4, &su);
    int32_t a[40], b[40];
    for (int i = 0; i < 40; i++) a[i] = i, b[i] = 1000 + i;
    kvt_hybrid_req_t ra, rb;
    cr_assert_eq(kvt_hybrid_admit(h, 0, a, 40, 0, NULL, &ra), KVT_OK);
    cr_assert_eq(kvt_hybrid_release(h, 0, a, 40, &ra), KVT_OK); /* leaves its pieces in L1 */
    cr_assert_eq(kvt_hybrid_admit(h, 0, b, 40, 0, NULL, &rb), KVT_OK);
    cr_assert_eq(rb.hit_pages, 0, "pins nothing");
    check(h, "one live request");
    kvt_keyed_t *k = kvt__hybrid_keyed(h, 1, 0);
    cr_assert(k != NULL && k->nents > 0);
    kvt_key128_t key = k->ents[0].key;
    cr_assert_eq(kvt_keyed_pin(k, &key, 1, NULL), KVT_OK);
    const char *why = NULL;
    cr_assert_eq(kvt_hybrid_check(h, &why), KVT_ECORRUPT, "a pin no request holds (%s)", why ? why : "-");
    cr_assert_eq(kvt_keyed_unpin(k, &key, 1), KVT_OK);
    check(h, "unpinned");
    /* two live requests on one path pin its pieces twice: a third pin on one of them is found too */
    kvt_hybrid_req_t r1, r2;
    cr_assert_eq(kvt_hybrid_admit(h, 0, a, 40, 0, NULL, &r1), KVT_OK);
    cr_assert_eq(kvt_hybrid_admit(h, 0, a, 40, 0, NULL, &r2), KVT_OK);
    cr_assert_gt(r1.hit_pages, 0);
    check(h, "two requests on one path");
    size_t x = 0;
    while (x < k->nents && k->ents[x].pins != 2) x++;
    cr_assert_lt(x, k->nents, "a piece both requests pinned");
    key = k->ents[x].key;
    cr_assert_eq(kvt_keyed_pin(k, &key, 1, NULL), KVT_OK);
    cr_assert_eq(kvt_hybrid_check(h, &why), KVT_ECORRUPT, "a third pin on a shared piece (%s)", why ? why : "-");
    cr_assert_eq(kvt_keyed_unpin(k, &key, 1), KVT_OK);
    check(h, "unpinned again");
    cr_assert_eq(kvt_hybrid_release(h, 0, a, 40, &r1), KVT_OK);
    cr_assert_eq(kvt_hybrid_release(h, 0, a, 40, &r2), KVT_OK);
    cr_assert_eq(kvt_hybrid_release(h, 0, b, 40, &rb), KVT_OK);
    check(h, "end");
    kvt_hybrid_destroy(h);
}

/* ---- an engine that misuses the calls -------------------------------------------- */

static const kvt_layer_group_t FULL_AND_WINDOW[] = {{KVT_GROUP_FULL, 2, 0, 0, 64}, {KVT_GROUP_WINDOW, 2, 64, 0, 32}};

/* A release that runs short of memory for its moves falls back to storing
 * the needed pages alone: that store reserves room for its own moves. With
 * the engine holding many moves (the pending table nearly full), it wrote
 * past the table (entry UINT32_MAX). Each allocation of a 64-page release
 * fails in turn; the cache stays consistent and every move outstanding is
 * one the engine can report. A release that memory kept pieces out of (more
 * refused than the same release with memory to spare, nth = 0) says
 * KVT_ENOMEM. */
Test(hybrid_misuse, a_release_short_of_memory_for_its_moves_stores_within_its_room) {
    int32_t tok[256];
    int fired_any = 0, said = 0;
    uint64_t refused_with_memory = 0;
    for (uint64_t nth = 0; nth < 60; nth++) {
        kvt_hybrid_config_t cfg;
        cr_assert_eq(kvt_hybrid_config_default(&cfg, FULL_AND_WINDOW, 2, 4, 1 << 24, 0, 0), KVT_OK);
        cfg.l1_slots[1] = 4096;
        cfg.moves = cfg.async_moves = true;
        kvt_hybrid_t *h = NULL;
        cr_assert_eq(kvt_hybrid_create(&h, &cfg), KVT_OK);
        kvt_hybrid_req_t r;
        kvt_hybrid_move_t mv[512];
        for (int i = 0; i < 200 && kvt_hybrid_moves_outstanding(h) < 53; i++) { /* moves taken, none reported */
            for (int j = 0; j < 4; j++) tok[j] = 100000 + i * 4 + j;
            cr_assert_eq(kvt_hybrid_admit(h, 0, tok, 4, 0, NULL, &r), KVT_OK);
            cr_assert_eq(kvt_hybrid_release(h, 0, tok, 4, &r), KVT_OK);
            while (kvt_hybrid_take_moves(h, mv, 512) > 0) {}
        }
        for (int j = 0; j < 256; j++) tok[j] = j + 1;
        cr_assert_eq(kvt_hybrid_admit(h, 0, tok, 256, 0, NULL, &r), KVT_OK);
        kvt_hybrid_stats_t before = {.size = sizeof(before)}, after = {.size = sizeof(after)};
        kvt_hybrid_stats(h, &before);
        kvt__mem_fail_nth(nth);
        int rc = kvt_hybrid_release(h, 0, tok, 256, &r);
        int fired = kvt__mem_fail_fired();
        kvt__mem_fail_nth(0);
        kvt_hybrid_stats(h, &after);
        uint64_t refused = after.pieces_refused - before.pieces_refused;
        if (nth == 0) refused_with_memory = refused;
        fired_any += fired;
        said += rc == KVT_ENOMEM;
        cr_assert(rc == KVT_OK || rc == KVT_ENOMEM, "allocation %" PRIu64 ": %s", nth, kvt_err_name(rc));
        cr_assert(rc == KVT_ENOMEM || refused == refused_with_memory,
                  "allocation %" PRIu64 ": %" PRIu64 " pieces refused (%" PRIu64 " with memory), and OK", nth,
                  refused, refused_with_memory);
        check(h, "after a release short of memory");
        size_t n;
        while ((n = kvt_hybrid_take_moves(h, mv, 512)) > 0) { /* the engine reports everything */
            uint8_t ok[512];
            memset(ok, 1, n);
            cr_assert_eq(kvt_hybrid_moves_done(h, mv, n, ok), KVT_OK);
        }
        check(h, "after the moves");
        kvt_hybrid_destroy(h);
        if (nth && !fired) break;
    }
    cr_assert_gt(fired_any, 3);
    cr_assert_gt(said, 0);
}

/* A cache of ALL_THREE's groups, 4-token pages, the default split of 16 MiB
 * of L1 and of L2. */
static kvt_hybrid_t *every_kind_default(void) {
    kvt_hybrid_config_t cfg;
    cr_assert_eq(kvt_hybrid_config_default(&cfg, ALL_THREE, 4, 4, 1 << 24, 1 << 24, 0), KVT_OK);
    kvt_hybrid_t *h = NULL;
    cr_assert_eq(kvt_hybrid_create(&h, &cfg), KVT_OK);
    return h;
}

/* An engine that keeps a copy of a request's struct past its release: the
 * copy names that admission, never a later one, even when the same prompt
 * comes back and the new request's pins land where the old ones were. */
Test(hybrid_misuse, a_stale_copy_of_a_released_request_is_refused) {
    kvt_hybrid_t *h = every_kind_default();
    int32_t tok[32];
    for (int i = 0; i < 32; i++) tok[i] = i + 1;
    kvt_hybrid_req_t a, stale, b;
    for (int round = 0; round < 4; round++) {
        cr_assert_eq(kvt_hybrid_admit(h, 0, tok, 32, 0, NULL, &a), KVT_OK);
        stale = a;
        cr_assert_eq(kvt_hybrid_release(h, 0, tok, 32, &a), KVT_OK);
        cr_assert_eq(kvt_hybrid_admit(h, 0, tok, 32, 0, NULL, &b), KVT_OK);
        cr_assert_eq(kvt_hybrid_release(h, 0, tok, 32, &stale), KVT_EINVAL, "round %d: a stale copy released", round);
        cr_assert_eq(kvt_hybrid_ready(h, &stale), KVT_EINVAL);
        uint64_t slots[16];
        size_t n = 0;
        cr_assert_eq(kvt_hybrid_slots(h, &b, 1, slots, 16, &n), KVT_OK, "round %d: the live request lost", round);
        check(h, "the live request");
        cr_assert_eq(kvt_hybrid_release(h, 0, tok, 32, &b), KVT_OK);
    }
    kvt_hybrid_destroy(h);
}

/* A probe (the engine's outside L3) runs in the middle of an admission:
 * calls from it that would change the cache are refused, so the admission
 * finds what it remembered; a probe that reported moves from there left a
 * request waiting for ever, or aborted the admission. */
typedef struct {
    kvt_hybrid_t *h;
    kvt_hybrid_move_t held[64];
    size_t nheld;
    int calls, refused;
} reentry_t;

static int reentering_probe(void *arg, uint32_t g, const kvt_key128_t *keys, size_t n, uint8_t *present) {
    (void)g, (void)keys;
    reentry_t *e = arg;
    memset(present, 0, n);
    uint8_t ok[64] = {0};
    int32_t tok[4] = {9, 9, 9, 9};
    kvt_hybrid_req_t r;
    kvt_hybrid_move_t mv[4];
    e->calls++;
    e->refused += kvt_hybrid_moves_done(e->h, e->held, e->nheld, ok) == KVT_EBUSY;
    e->refused += kvt_hybrid_admit(e->h, 0, tok, 4, 0, NULL, &r) == KVT_EBUSY;
    e->refused += kvt_hybrid_release(e->h, 0, tok, 4, &r) == KVT_EBUSY;
    e->refused += kvt_hybrid_abort(e->h, &r) == KVT_EBUSY;
    e->refused += kvt_hybrid_set_l3(e->h, NULL, NULL) == KVT_EBUSY;
    e->refused += kvt_hybrid_take_moves(e->h, mv, 4) == 0;
    return 0;
}

Test(hybrid_misuse, a_probe_that_calls_the_cache_is_refused) {
    static const kvt_layer_group_t short_window[] = {{KVT_GROUP_FULL, 2, 0, 0, 64}, {KVT_GROUP_WINDOW, 2, 8, 0, 32}};
    kvt_hybrid_config_t cfg;
    cr_assert_eq(kvt_hybrid_config_default(&cfg, short_window, 2, 4, 1 << 24, 1 << 24, 0), KVT_OK);
    cfg.l1_slots[1] = 16, cfg.l2_slots[1] = 32;
    cfg.moves = cfg.async_moves = true;
    reentry_t e = {0};
    cr_assert_eq(kvt_hybrid_create(&e.h, &cfg), KVT_OK);
    cr_assert_eq(kvt_hybrid_set_l3(e.h, reentering_probe, &e), KVT_OK);
    int32_t tok[32];
    for (int i = 0; i < 32; i++) tok[i] = i + 7;
    kvt_hybrid_req_t a, b;
    cr_assert_eq(kvt_hybrid_admit(e.h, 0, tok, 32, 0, NULL, &a), KVT_OK);
    cr_assert_eq(kvt_hybrid_release(e.h, 0, tok, 32, &a), KVT_OK);
    kvt_hybrid_move_t mv[64];
    uint8_t ok[64];
    size_t n = kvt_hybrid_take_moves(e.h, mv, 64);
    for (size_t i = 0; i < n; i++) { /* window page 0's copy fails (the search asks the probe about it); 6 and 7 held */
        if (mv[i].src_tier == KVT_HYBRID_ENGINE && (mv[i].src_slot == 6 || mv[i].src_slot == 7)) {
            e.held[e.nheld++] = mv[i];
            continue;
        }
        ok[0] = mv[i].src_slot != 0;
        cr_assert_eq(kvt_hybrid_moves_done(e.h, &mv[i], 1, ok), KVT_OK);
    }
    while ((n = kvt_hybrid_take_moves(e.h, mv, 64)) > 0) {
        memset(ok, 1, n);
        cr_assert_eq(kvt_hybrid_moves_done(e.h, mv, n, ok), KVT_OK);
    }
    cr_assert_eq(e.nheld, 2);
    cr_assert_eq(kvt_hybrid_admit(e.h, 0, tok, 32, 0, NULL, &b), KVT_OK);
    cr_assert_gt(e.calls, 0, "the probe was asked");
    cr_assert_eq(e.refused, 6 * e.calls, "every call from the probe refused");
    check(e.h, "after an admission whose probe called the cache");
    memset(ok, 1, sizeof(ok));
    cr_assert_eq(kvt_hybrid_moves_done(e.h, e.held, e.nheld, ok), KVT_OK); /* now, outside the probe */
    for (int i = 0; i < 10 && kvt_hybrid_ready(e.h, &b) == KVT_EAGAIN; i++)
        while ((n = kvt_hybrid_take_moves(e.h, mv, 64)) > 0) {
            memset(ok, 1, n);
            cr_assert_eq(kvt_hybrid_moves_done(e.h, mv, n, ok), KVT_OK);
        }
    cr_assert_eq(kvt_hybrid_ready(e.h, &b), KVT_OK, "the request is served");
    cr_assert_eq(kvt_hybrid_release(e.h, 0, tok, 32, &b), KVT_OK);
    check(e.h, "after its release");
    kvt_hybrid_destroy(e.h);
}

/* Two requests of one prompt admitted at once: the second matched the
 * first's new pages, so the first cannot take them back (KVT_EBUSY,
 * nothing changed) until the second is aborted; then both leave nothing. */
Test(hybrid_misuse, an_abort_another_request_depends_on_is_refused_and_changes_nothing) {
    kvt_hybrid_t *h = every_kind_default();
    int32_t tok[64];
    for (int i = 0; i < 64; i++) tok[i] = i * 5 + 2;
    kvt_hybrid_req_t a, b, c;
    cr_assert_eq(kvt_hybrid_admit(h, 0, tok, 64, 0, NULL, &a), KVT_OK);
    cr_assert_eq(kvt_hybrid_admit(h, 0, tok, 64, 0, NULL, &b), KVT_OK);
    cr_assert_eq(b.full_hit_pages, 16, "the second matched the first's new pages");
    kvt_hybrid_stats_t before = {.size = sizeof(before)}, after = {.size = sizeof(after)};
    cr_assert_eq(kvt_hybrid_stats(h, &before), KVT_OK);
    uint64_t digest = kvt_hybrid_digest(h);
    cr_assert_eq(kvt_hybrid_abort(h, &a), KVT_EBUSY);
    cr_assert_eq(kvt_hybrid_stats(h, &after), KVT_OK);
    cr_assert(memcmp(&before, &after, sizeof(before)) == 0, "a refused abort changed the counters");
    cr_assert_eq(kvt_hybrid_digest(h), digest);
    cr_assert_eq(kvt_hybrid_ready(h, &a), KVT_OK, "a refused abort let go of the request");
    check(h, "refused abort");
    cr_assert_eq(kvt_hybrid_abort(h, &b), KVT_OK);
    cr_assert_eq(kvt_hybrid_abort(h, &a), KVT_OK);
    check(h, "both aborted");
    /* the prompt again: as in a cache that never saw the two */
    kvt_hybrid_t *fresh = every_kind_default();
    kvt_hybrid_req_t d;
    cr_assert_eq(kvt_hybrid_admit(h, 0, tok, 64, 0, NULL, &c), KVT_OK);
    cr_assert_eq(kvt_hybrid_admit(fresh, 0, tok, 64, 0, NULL, &d), KVT_OK);
    cr_assert_eq(c.full_hit_pages, d.full_hit_pages, "an aborted request's pages were served");
    cr_assert_eq(c.hit_pages, d.hit_pages);
    cr_assert_eq(kvt_hybrid_release(h, 0, tok, 64, &c), KVT_OK);
    cr_assert_eq(kvt_hybrid_release(fresh, 0, tok, 64, &d), KVT_OK);
    kvt_hybrid_stats_t twin = {.size = sizeof(twin)};
    cr_assert_eq(kvt_hybrid_stats(h, &after), KVT_OK);
    cr_assert_eq(kvt_hybrid_stats(fresh, &twin), KVT_OK);
    cr_assert_eq(after.aborted, 2);
    cr_assert_eq(after.window_pages_stored, twin.window_pages_stored, "the aborted requests stored pieces");
    cr_assert_eq(after.checkpoints_stored, twin.checkpoints_stored);
    cr_assert_eq(after.l1_bytes, twin.l1_bytes);
    cr_assert_eq(after.cached_tokens, twin.cached_tokens);
    for (uint32_t g = 0; g < 4; g++) {
        kvt_hybrid_group_bytes_t x, y;
        cr_assert_eq(kvt_hybrid_group_bytes(h, g, &x), KVT_OK);
        cr_assert_eq(kvt_hybrid_group_bytes(fresh, g, &y), KVT_OK);
        cr_assert(memcmp(&x, &y, sizeof(x)) == 0, "group %u holds other slots than the twin's", g);
    }
    check(h, "end");
    kvt_hybrid_destroy(fresh);
    kvt_hybrid_destroy(h);
}

/* Destroying a cache with requests still admitted frees what they held
 * (the sanitizer's leak check fails the suite otherwise). */
Test(hybrid_misuse, destroy_with_requests_admitted_frees_them) {
    kvt_hybrid_t *h = every_kind_default();
    int32_t tok[64];
    for (int i = 0; i < 64; i++) tok[i] = i * 3 + 1;
    kvt_hybrid_req_t r[3];
    for (int i = 0; i < 3; i++) cr_assert_eq(kvt_hybrid_admit(h, (uint32_t)i, tok, 64, 0, NULL, &r[i]), KVT_OK);
    kvt_hybrid_destroy(h);
}
