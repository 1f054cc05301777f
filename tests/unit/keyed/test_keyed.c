/* The keyed page cache against its plain-array model (model.h), and the
 * contract's corners: refusals, protection, the free-room target, bad
 * configurations, and failed allocations at every site. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/mem-int.h"
#include "kvtier/error.h"
#include "kvtier/keyed.h"
#include "kvtier/rng.h"
#include "keyed/keyed-int.h"
#include "model.h"

#define CLASS_BIT (1ull << 62) /* the hybrid cache's: below the top bit, so that scores order across it too */

static kvt_keyed_t *make_policy(uint64_t pages, double free_room, int events, uint32_t policy) {
    kvt_keyed_config_t cfg = {
        .size = sizeof(cfg), .events = (uint32_t)events, .pages = pages, .free_room = free_room, .policy = policy};
    kvt_keyed_t *c = NULL;
    cr_assert_eq(kvt_keyed_create(&c, &cfg), KVT_OK);
    return c;
}

static kvt_keyed_t *make(uint64_t pages, double free_room, int events) {
    return make_policy(pages, free_room, events, KVT_KEYED_SCORES);
}

static int key_eq(kvt_key128_t a, kvt_key128_t b) { return a.hi == b.hi && a.lo == b.lo; }

static void assert_check(const kvt_keyed_t *c, const char *ctx) {
    const char *why = NULL;
    int rc = kvt_keyed_check(c, &why);
    cr_assert_eq(rc, KVT_OK, "%s: check: %s (%s)", ctx, kvt_err_name(rc), why ? why : "-");
}

static void assert_stats_eq(const kvt_keyed_stats_t *a, const kvt_keyed_stats_t *b, const char *ctx) {
#define CMP_(name, kind, help) \
    cr_assert_eq(a->name, b->name, "%s: stat " #name " is %" PRIu64 ", want %" PRIu64, ctx, a->name, b->name);
    KVT_KEYED_STATS_FIELDS(CMP_)
#undef CMP_
}

/* ---- the model fuzz ---- */

typedef struct fz {
    kvt_keyed_t *c;
    km_t m;
    kvt_rng_t rng;
    char ctx[160];
    uint64_t grew; /* misses that moved the target up */
} fz_t;

/* Everything observable: each key's state and page (the lookups are counted
 * on both sides), pages distinct and in range, the stats, check(). */
static void compare(fz_t *f) {
    uint8_t *held = calloc(f->m.pages, 1);
    for (size_t k = 0; k < f->m.nk; k++) {
        kvt_key128_t key = f->m.key[k];
        uint64_t page = UINT64_MAX;
        int rc = kvt_keyed_page(f->c, key, &page);
        cr_assert_eq(kvt_keyed_lookup(f->c, key), km_lookup(&f->m, k), "%s: key %zu's state", f->ctx, k);
        if (f->m.state[k] == KM_ABSENT) {
            cr_assert_eq(rc, KVT_ENOENT, "%s: key %zu should be absent", f->ctx, k);
            continue;
        }
        cr_assert_eq(rc, KVT_OK, "%s: key %zu should be present", f->ctx, k);
        cr_assert_eq(page, f->m.page[k], "%s: key %zu has page %" PRIu64 ", want %u", f->ctx, k, page, f->m.page[k]);
        cr_assert(page < f->m.pages && !held[page], "%s: page %" PRIu64 " out of range or held twice", f->ctx, page);
        held[page] = 1;
    }
    free(held);
    kvt_keyed_stats_t got = {.size = sizeof(got)}, want = km_stats(&f->m);
    cr_assert_eq(kvt_keyed_stats(f->c, &got), KVT_OK);
    assert_stats_eq(&got, &want, f->ctx);
    assert_check(f->c, f->ctx);
}

static size_t pick(fz_t *f, int state) { /* a key in that state if there is one, else any */
    size_t start = kvt_rng_below(&f->rng, f->m.nk);
    for (size_t d = 0; d < f->m.nk; d++) {
        size_t k = (start + d) % f->m.nk;
        if (f->m.state[k] == state && (state != KM_READY || kvt_rng_below(&f->rng, 2) || f->m.pins[k])) return k;
    }
    return start;
}

static uint64_t score(fz_t *f) {
    uint64_t r = kvt_rng_below(&f->rng, 16);
    uint64_t s = r < 12 ? r : UINT64_MAX - (r - 12); /* many ties, and the top of the range */
    if (f->m.class_bit && s < 12 && kvt_rng_below(&f->rng, 2)) s |= f->m.class_bit; /* both classes, each with ties */
    return s;
}

static void keys_of(const fz_t *f, const size_t *ks, size_t n, kvt_key128_t *out) {
    for (size_t i = 0; i < n; i++) out[i] = f->m.key[ks[i]];
}

static void op_prepare(fz_t *f) {
    size_t ks[8], prot[4], n = kvt_rng_below(&f->rng, 7), np = kvt_rng_below(&f->rng, 4), nv = 0, mv = 0, mvict[64];
    uint64_t sc[8], pages[8], mpages[8];
    kvt_key128_t keys[8] = {{0, 0}}, pk[4] = {{0, 0}}, ev[64];
    for (size_t i = 0; i < n; i++) ks[i] = kvt_rng_below(&f->rng, 3) ? kvt_rng_below(&f->rng, f->m.nk) : pick(f, KM_PENDING), sc[i] = score(f);
    for (size_t j = 0; j < np; j++) prot[j] = kvt_rng_below(&f->rng, 2) ? pick(f, KM_READY) : kvt_rng_below(&f->rng, f->m.nk);
    size_t cap = kvt_rng_below(&f->rng, 8) ? n + f->m.room : kvt_rng_below(&f->rng, 3);
    keys_of(f, ks, n, keys);
    keys_of(f, prot, np, pk);
    int want = km_prepare(&f->m, ks, sc, n, prot, np, cap, mpages, mvict, &mv);
    int got = kvt_keyed_prepare_store(f->c, keys, sc, n, pk, np, pages, ev, cap, &nv);
    cr_assert_eq(got, want, "%s: prepare_store returned %s, want %s", f->ctx, kvt_err_name(got), kvt_err_name(want));
    cr_assert_eq(nv, mv, "%s: %zu evicted, want %zu", f->ctx, nv, mv);
    for (size_t v = 0; v < nv; v++)
        cr_assert(key_eq(ev[v], f->m.key[mvict[v]]), "%s: eviction %zu is not key %zu", f->ctx, v, mvict[v]);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(pages[i], want == KVT_OK ? mpages[i] : UINT64_MAX, "%s: pages[%zu]", f->ctx, i);
}

static void op_complete(fz_t *f) {
    size_t ks[6], n = 1 + kvt_rng_below(&f->rng, 5);
    kvt_key128_t keys[6];
    for (size_t i = 0; i < n; i++) ks[i] = kvt_rng_below(&f->rng, 5) ? pick(f, KM_PENDING) : kvt_rng_below(&f->rng, f->m.nk);
    int ok = kvt_rng_below(&f->rng, 5) != 0;
    keys_of(f, ks, n, keys);
    km_complete(&f->m, ks, n, ok);
    kvt_keyed_complete_store(f->c, keys, n, ok);
}

static void op_pin(fz_t *f) {
    size_t ks[4], n = 1 + kvt_rng_below(&f->rng, 3);
    uint64_t pages[4], mpages[4];
    kvt_key128_t keys[4];
    for (size_t i = 0; i < n; i++) ks[i] = kvt_rng_below(&f->rng, 4) ? pick(f, KM_READY) : kvt_rng_below(&f->rng, f->m.nk);
    keys_of(f, ks, n, keys);
    int want = km_pin(&f->m, ks, n, mpages), got = kvt_keyed_pin(f->c, keys, n, pages);
    cr_assert_eq(got, want, "%s: pin returned %s, want %s", f->ctx, kvt_err_name(got), kvt_err_name(want));
    for (size_t i = 0; want == KVT_OK && i < n; i++) cr_assert_eq(pages[i], mpages[i], "%s: pinned page %zu", f->ctx, i);
}

static void op_unpin(fz_t *f) {
    size_t ks[4], n = 1 + kvt_rng_below(&f->rng, 3);
    kvt_key128_t keys[4];
    for (size_t i = 0; i < n; i++) {
        size_t k = pick(f, KM_READY);
        for (size_t d = 0; d < f->m.nk && !f->m.pins[k]; d++) k = (k + 1) % f->m.nk;
        ks[i] = kvt_rng_below(&f->rng, 8) ? k : kvt_rng_below(&f->rng, f->m.nk);
    }
    keys_of(f, ks, n, keys);
    int want = km_unpin(&f->m, ks, n), got = kvt_keyed_unpin(f->c, keys, n);
    cr_assert_eq(got, want, "%s: unpin returned %s, want %s", f->ctx, kvt_err_name(got), kvt_err_name(want));
}

static void op_touch(fz_t *f) {
    size_t ks[4], n = 1 + kvt_rng_below(&f->rng, 3);
    uint64_t sc[4];
    kvt_key128_t keys[4];
    for (size_t i = 0; i < n; i++) ks[i] = kvt_rng_below(&f->rng, f->m.nk), sc[i] = score(f);
    keys_of(f, ks, n, keys);
    km_touch(&f->m, ks, sc, n);
    kvt_keyed_touch(f->c, keys, sc, n);
    size_t cnt1 = 0;
    for (size_t k = 0; k < f->m.nk; k++) cnt1 += f->m.state[k] != KM_ABSENT && km_class(&f->m, k);
    cr_assert_eq(f->c->ncls1, cnt1, "%s: %zu keys of class 1, want %zu", f->ctx, f->c->ncls1, cnt1);
}

static void op_remove(fz_t *f) {
    size_t ks[5], n = 1 + kvt_rng_below(&f->rng, 4), got;
    kvt_key128_t keys[5];
    for (size_t i = 0; i < n; i++) ks[i] = kvt_rng_below(&f->rng, 3) ? pick(f, KM_READY) : kvt_rng_below(&f->rng, f->m.nk);
    keys_of(f, ks, n, keys);
    size_t want = km_remove(&f->m, ks, n);
    cr_assert_eq(kvt_keyed_remove(f->c, keys, n, &got), KVT_OK, "%s", f->ctx);
    cr_assert_eq(got, want, "%s: %zu keys removed, want %zu", f->ctx, got, want);
}

/* A round of a caller's free-room planning: the next victims evicted but
 * those the caller keeps (here: by a bit of the key, on or off per round). */
static int keep_odd(void *arg, kvt_key128_t key) { return arg != NULL && (key.lo >> 7 & 1); }

static void op_round(fz_t *f) {
    size_t k = kvt_rng_below(&f->rng, 5), want[4], n = 0, gone[4];
    int keeping = (int)kvt_rng_below(&f->rng, 2);
    kvt_key128_t got[4];
    uint64_t sc[4], pages[4];
    uint8_t kept[4];
    size_t nw = km_next_victims(&f->m, k, want);
    uint64_t wsc[4], wpages[4];
    for (size_t i = 0; i < nw; i++) {
        wsc[i] = f->m.score[want[i]], wpages[i] = f->m.page[want[i]];
        if (!keep_odd(keeping ? f : NULL, f->m.key[want[i]])) gone[n++] = want[i];
    }
    km_evict(&f->m, gone, n);
    size_t ng = kvt__keyed_evict_next(f->c, k, keep_odd, keeping ? f : NULL, got, sc, pages, kept);
    cr_assert_eq(ng, nw, "%s: %zu victims, want %zu", f->ctx, ng, nw);
    for (size_t i = 0; i < ng; i++) {
        cr_assert(key_eq(got[i], f->m.key[want[i]]), "%s: victim %zu is not key %zu", f->ctx, i, want[i]);
        cr_assert(sc[i] == wsc[i] && pages[i] == wpages[i], "%s: victim %zu's score or page", f->ctx, i);
        cr_assert_eq(kept[i], keep_odd(keeping ? f : NULL, got[i]), "%s: victim %zu kept", f->ctx, i);
    }
}

static void op_take(fz_t *f, size_t cap) {
    kvt_keyed_event_t got[16], want[16];
    size_t nw = km_take(&f->m, want, cap), ng = kvt_keyed_take_events(f->c, got, cap);
    cr_assert_eq(ng, nw, "%s: %zu events taken, want %zu", f->ctx, ng, nw);
    for (size_t i = 0; i < ng; i++)
        cr_assert(key_eq(got[i].key, want[i].key) && got[i].kind == want[i].kind && got[i].why == want[i].why,
                  "%s: event %zu is (%u, %u), want (%u, %u)", f->ctx, i, got[i].kind, got[i].why, want[i].kind, want[i].why);
}

/* Adaptive classes: a miss of a key (one recently evicted, or any). The
 * target it learns is the cache's (kvt__keyed_missed's arithmetic has its
 * own test); the model then evicts by it. */
static void op_missed(fz_t *f) {
    size_t k = pick(f, KM_ABSENT);
    double before = f->c->target0;
    kvt__keyed_missed(f->c, f->m.key[k]);
    f->grew += f->c->target0 > before;
    cr_assert(f->c->target0 >= 0 && f->c->target0 <= (double)f->m.pages, "%s: target %g", f->ctx, f->c->target0);
    f->m.target0 = f->c->target0;
}

/* ARC's hooks on a few keys (absent ones too: their ghosts), and its state
 * against the model's: the target exactly (the same arithmetic), the ghosts'
 * sizes. */
static void op_arc(fz_t *f, uint64_t r) {
    size_t ks[6], n = 1 + kvt_rng_below(&f->rng, 5);
    uint8_t flags[6];
    kvt_key128_t keys[6];
    for (size_t i = 0; i < n; i++) {
        ks[i] = kvt_rng_below(&f->rng, 2) ? pick(f, KM_ABSENT) : kvt_rng_below(&f->rng, f->m.nk);
        flags[i] = (uint8_t)kvt_rng_below(&f->rng, 3);
    }
    keys_of(f, ks, n, keys);
    if (r % 3 == 0) {
        km_arc_touch(&f->m, ks, n);
        cr_assert_eq(kvt_keyed_arc_touch(f->c, keys, n), KVT_OK, "%s", f->ctx);
    } else if (r % 3 == 1) {
        km_arc_missed(&f->m, ks, n);
        cr_assert_eq(kvt_keyed_arc_missed(f->c, keys, n), KVT_OK, "%s", f->ctx);
    } else {
        km_arc_finish(&f->m, ks, flags, n);
        cr_assert_eq(kvt_keyed_arc_finish(f->c, keys, flags, n), KVT_OK, "%s", f->ctx);
    }
    f->grew += f->c->target0 > 0;
}

static void compare_arc(const fz_t *f) {
    cr_assert(f->c->target0 == f->m.target, "%s: target %.17g, want %.17g", f->ctx, f->c->target0, f->m.target);
    for (int g = 0; g < 2; g++)
        cr_assert_eq(kvt__lru_size(&f->c->arc_ghost[g]), f->m.nb[g], "%s: ghost %d holds %zu, want %zu", f->ctx, g,
                     kvt__lru_size(&f->c->arc_ghost[g]), f->m.nb[g]);
    cr_assert_eq(f->c->ncls1, f->m.nt[1], "%s: %zu keys in T2, want %zu", f->ctx, f->c->ncls1, f->m.nt[1]);
}

/* Settles everything in flight (so that a reset can succeed), then resets. */
static void op_reset(fz_t *f) {
    if (kvt_rng_below(&f->rng, 2)) {
        for (size_t k = 0; k < f->m.nk; k++) {
            size_t one[1] = {k};
            kvt_key128_t key = f->m.key[k];
            int ok = (int)kvt_rng_below(&f->rng, 2);
            km_complete(&f->m, one, 1, ok);
            kvt_keyed_complete_store(f->c, &key, 1, ok);
            while (f->m.pins[k]) {
                cr_assert_eq(km_unpin(&f->m, one, 1), KVT_OK);
                cr_assert_eq(kvt_keyed_unpin(f->c, &key, 1), KVT_OK);
            }
        }
    }
    int want = km_reset(&f->m), got = kvt_keyed_reset(f->c);
    cr_assert_eq(got, want, "%s: reset returned %s, want %s", f->ctx, kvt_err_name(got), kvt_err_name(want));
}

/* classes: 0 one class, 1 two with target 0 (s2lru), 2 two learning it
 * (arc), 3 two with target 0 and class 1 capped at half the pages (slru), 4
 * the policy KVT_KEYED_ARC (vLLM's ARC). */
static void fuzz(uint64_t pages, size_t nk, double room, uint64_t ops, uint64_t seed, int classes) {
    fz_t f = {.grew = 0};
    kvt_rng_seed(&f.rng, seed);
    int events = seed % 4 != 3;
    f.c = make_policy(pages, room, events, classes == 4 ? KVT_KEYED_ARC : KVT_KEYED_SCORES);
    km_init(&f.m, pages, room, events, nk);
    f.m.arc = classes == 4;
    if (classes && classes < 4) {
        cr_assert_eq(kvt__keyed_set_classes(f.c, CLASS_BIT, classes == 2), KVT_OK);
        f.m.class_bit = CLASS_BIT;
    }
    if (classes == 3) {
        f.m.cap1 = (size_t)(pages / 2);
        kvt__keyed_set_class1_cap(f.c, f.m.cap1);
    }
    uint64_t tally[8] = {0};
    for (uint64_t op = 0; op < ops; op++) {
        uint64_t r = kvt_rng_below(&f.rng, 1000);
        snprintf(f.ctx, sizeof(f.ctx), "pages %" PRIu64 " seed %" PRIu64 " op %" PRIu64 " (r %" PRIu64 ")", pages, seed, op, r);
        if (r < 320) op_prepare(&f);
        else if (r < 550) op_complete(&f);
        else if (r < 660) op_pin(&f);
        else if (r < 780) op_unpin(&f);
        else if (r < 850 && classes == 2 && r % 2) op_missed(&f);
        else if (r < 850 && classes == 4) op_arc(&f, r);
        else if (r < 850) op_touch(&f);
        else if (r < 880) op_remove(&f);
        else if (r < 900 && classes == 4) op_touch(&f); /* (does nothing under ARC) */
        else if (r < 900) op_round(&f);
        else if (r < 990) op_take(&f, kvt_rng_below(&f.rng, 10));
        else op_reset(&f);
        tally[r < 320 ? 0 : r < 550 ? 1 : r < 660 ? 2 : r < 780 ? 3 : r < 880 ? 4 : r < 990 ? 5 : 6]++;
        compare(&f);
        if (classes == 4) compare_arc(&f);
    }
    op_take(&f, 16);
    kvt_keyed_stats_t st = {.size = sizeof(st)};
    kvt_keyed_stats(f.c, &st);
    fprintf(stderr,
            "keyed fuzz: classes=%d pages=%" PRIu64 " keys=%zu free_room=%.2f events=%d ops=%" PRIu64 " seed=%" PRIu64
            ": %" PRIu64 " prepared, %" PRIu64 " refusals, %" PRIu64 " evictions, %" PRIu64 " failed stores, %" PRIu64
            " loads, %" PRIu64 " resets tried\n",
            classes, pages, nk, room, events, ops, seed, st.stores_prepared, st.store_refusals, st.evictions, st.stores_failed,
            st.loads, tally[6]);
    if (classes == 2) {
        fprintf(stderr, "  learnt target %.2f of %" PRIu64 " pages, %" PRIu64 " class-0 misses taken\n", f.c->target0,
                pages, f.grew);
        cr_assert_gt(f.grew, 0, "seed %" PRIu64 ": no miss moved the target up", seed);
    }
    if (classes == 3) cr_assert_gt(f.m.demoted, 0, "seed %" PRIu64 ": the cap on class 1 never demoted", seed);
    if (classes == 4) {
        fprintf(stderr, "  ARC: target %.2f, T1 %zu, T2 %zu, B1 %zu, B2 %zu; %" PRIu64 " hooks left a target above 0\n",
                f.m.target, f.m.nt[0], f.m.nt[1], f.m.nb[0], f.m.nb[1], f.grew);
        cr_assert_gt(f.grew, 0, "seed %" PRIu64 ": no ghost ever moved the target", seed);
    }
    cr_assert(st.store_refusals > 0 && st.evictions > 0 && st.stores_failed > 0 && st.loads > 0 && st.removed > 0,
              "seed %" PRIu64 ": the run missed a path", seed);
    km_fini(&f.m);
    kvt_keyed_destroy(f.c);
}

static uint64_t base_seed(void) {
    const char *fixed = getenv("KVT_TEST_SEED"); /* a failing seed, run again */
    return fixed ? strtoull(fixed, NULL, 0) : 20250611;
}

Test(keyed, model_fuzz, .timeout = 300) {
    static const struct {
        uint64_t pages;
        size_t nk;
        double room;
    } cfgs[] = {{1, 5, 0}, {2, 7, 0}, {3, 9, 0.5}, {5, 12, 0.25}, {8, 20, 0.3}, {16, 40, 0.1}, {31, 64, 0.7}};
    uint64_t seed = base_seed();
    for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++)
        fuzz(cfgs[i].pages, cfgs[i].nk, cfgs[i].room, 20000, seed + i, 0);
}

/* Two classes (keyed-int.h): the target 0 of s2lru, one learnt from
 * misses, which the model takes from the cache after each, and slru's cap
 * on class 1. */
Test(keyed, model_fuzz_two_classes, .timeout = 300) {
    static const struct {
        uint64_t pages;
        size_t nk;
        double room;
    } cfgs[] = {{2, 7, 0}, {5, 12, 0.25}, {8, 20, 0}, {16, 40, 0.1}, {30, 64, 0.5}};
    uint64_t seed = base_seed() + 100;
    for (int classes = 1; classes <= 3; classes++)
        for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++)
            fuzz(cfgs[i].pages, cfgs[i].nk, cfgs[i].room, 20000, seed + 10 * (uint64_t)classes + i, classes);
}

/* The policy KVT_KEYED_ARC against the model's transcription of vLLM's ARC
 * policy (model.h): every victim, page, event and counter, the target and
 * the ghosts, after every call. */
Test(keyed, model_fuzz_arc, .timeout = 300) {
    static const struct {
        uint64_t pages;
        size_t nk;
    } cfgs[] = {{1, 5}, {2, 7}, {3, 9}, {5, 12}, {8, 20}, {16, 40}, {31, 64}};
    uint64_t seed = base_seed() + 200;
    for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++) fuzz(cfgs[i].pages, cfgs[i].nk, 0, 20000, seed + i, 4);
}

/* ---- targeted tests ---- */

static kvt_key128_t K(size_t i) { return km_key_of(i); }

/* Stores keys[0..n) (scores given) and completes them ok. */
static void store_ready(kvt_keyed_t *c, const size_t *ids, const uint64_t *scores, size_t n) {
    kvt_key128_t *keys = malloc(n * sizeof(*keys)), *ev = malloc((n + 64) * sizeof(*ev));
    uint64_t *pages = malloc(n * sizeof(*pages));
    size_t nv;
    for (size_t i = 0; i < n; i++) keys[i] = K(ids[i]);
    cr_assert_eq(kvt_keyed_prepare_store(c, keys, scores, n, NULL, 0, pages, ev, n + 64, &nv), KVT_OK);
    kvt_keyed_complete_store(c, keys, n, 1);
    free(keys), free(ev), free(pages);
}

static void store_range(kvt_keyed_t *c, size_t first, size_t n, uint64_t (*score_of)(size_t)) {
    size_t *ids = malloc(n * sizeof(*ids));
    uint64_t *sc = malloc(n * sizeof(*sc));
    for (size_t i = 0; i < n; i++) ids[i] = first + i, sc[i] = score_of(first + i);
    store_ready(c, ids, sc, n);
    free(ids), free(sc);
}

static uint64_t score_is_id(size_t i) { return i; }
static uint64_t score_mod7(size_t i) { return i % 7; }

/* Everything a caller can see, for keys 0..nk). */
typedef struct snap {
    kvt_keyed_stats_t pre, post; /* before and after the snapshot's own lookups */
    size_t nk;
    int *state, *prc;
    uint64_t *page;
    kvt_keyed_event_t ev[1024];
    size_t nev;
} snap_t;

static snap_t take_snap(kvt_keyed_t *c, size_t nk) {
    snap_t s = {.pre.size = sizeof(s.pre), .post.size = sizeof(s.post), .nk = nk};
    s.state = calloc(nk, sizeof(int));
    s.prc = calloc(nk, sizeof(int));
    s.page = calloc(nk, sizeof(uint64_t));
    kvt_keyed_stats(c, &s.pre);
    for (size_t k = 0; k < nk; k++) {
        s.state[k] = kvt_keyed_lookup(c, K(k));
        s.prc[k] = kvt_keyed_page(c, K(k), &s.page[k]);
    }
    kvt_keyed_stats(c, &s.post);
    s.nev = kvt_keyed_take_events(c, s.ev, 1024);
    return s;
}

static void free_snap(snap_t *s) { free(s->state), free(s->prc), free(s->page); }

/* b, taken after a call that should have changed nothing since a (but
 * `refusals` refusals), shows the same cache. */
static void assert_unchanged(const snap_t *a, const snap_t *b, uint64_t refusals, const char *ctx) {
    kvt_keyed_stats_t want = a->post;
    want.store_refusals += refusals;
    assert_stats_eq(&b->pre, &want, ctx);
    for (size_t k = 0; k < a->nk; k++) {
        cr_assert_eq(b->state[k], a->state[k], "%s: key %zu's state changed", ctx, k);
        cr_assert_eq(b->prc[k], a->prc[k], "%s: key %zu's presence changed", ctx, k);
        if (a->prc[k] == KVT_OK) cr_assert_eq(b->page[k], a->page[k], "%s: key %zu's page changed", ctx, k);
    }
    cr_assert_eq(b->nev, 0, "%s: the call recorded %zu events", ctx, b->nev);
}

static int prepare(kvt_keyed_t *c, const size_t *ids, size_t n, const size_t *prot, size_t np, size_t cap,
                   uint64_t *pages, size_t *evicted_ids, size_t *nv) {
    kvt_key128_t keys[64] = {{0, 0}}, pk[64] = {{0, 0}}, ev[64];
    uint64_t sc[64];
    for (size_t i = 0; i < n; i++) keys[i] = K(ids[i]), sc[i] = 100 + ids[i];
    for (size_t j = 0; j < np; j++) pk[j] = K(prot[j]);
    int rc = kvt_keyed_prepare_store(c, keys, sc, n, pk, np, pages, ev, cap, nv);
    for (size_t v = 0; rc == KVT_OK && v < *nv; v++) {
        evicted_ids[v] = SIZE_MAX;
        for (size_t k = 0; k < 4096 && evicted_ids[v] == SIZE_MAX; k++)
            if (key_eq(ev[v], K(k))) evicted_ids[v] = k;
    }
    return rc;
}

static kvt_keyed_t *six_ready(void) {
    kvt_keyed_t *c = make(6, 0, 1);
    size_t ids[6] = {0, 1, 2, 3, 4, 5};
    uint64_t sc[6] = {5, 3, 1, 4, 0, 2}; /* eviction order: 4 2 5 1 3 0 */
    store_ready(c, ids, sc, 6);
    kvt_key128_t pin[3] = {K(1), K(3), K(3)};
    cr_assert_eq(kvt_keyed_pin(c, pin, 3, NULL), KVT_OK);
    return c;
}

/* ARC's arithmetic for the learnt target (keyed-int.h): evictions fill the
 * ghost of the class each key left, a miss a ghost remembers moves the
 * target by max(1, |other ghost| / |its ghost|) toward that class and
 * forgets the key, and the eviction order follows the target. */
Test(keyed, two_classes_learn_the_target_as_arc) {
    kvt_keyed_t *c = make(4, 0, 1);
    cr_assert_eq(kvt__keyed_set_classes(c, CLASS_BIT, 1), KVT_OK);
    size_t old[4] = {0, 1, 2, 3}, fresh[4] = {4, 5, 6, 7};
    uint64_t olds[4] = {1, CLASS_BIT | 2, CLASS_BIT | 3, CLASS_BIT | 4}, fresh_s[4] = {5, 6, 7, 8};
    store_ready(c, old, olds, 4);
    kvt_key128_t keys[4], ev[8];
    uint64_t pages[4];
    size_t nv;
    for (size_t i = 0; i < 4; i++) keys[i] = K(fresh[i]);
    cr_assert_eq(kvt_keyed_prepare_store(c, keys, fresh_s, 4, NULL, 0, pages, ev, 8, &nv), KVT_OK);
    kvt_keyed_complete_store(c, keys, 4, 1);
    /* target 0: the one class-0 key first (1 > 0), then class 1 in its order */
    cr_assert_eq(nv, 4);
    for (size_t v = 0; v < 4; v++) cr_assert(key_eq(ev[v], K(v)), "eviction %zu is not key %zu", v, v);
    cr_assert_eq(c->target0, 0);
    kvt__keyed_missed(c, K(0)); /* in class 0's ghost (1 key), class 1's holds 3: up by 3 */
    cr_assert_eq(c->target0, 3);
    kvt__keyed_missed(c, K(0)); /* forgotten: no move */
    cr_assert_eq(c->target0, 3);
    kvt__keyed_missed(c, K(1)); /* class 1's ghost (3 keys), class 0's now empty: down by 1 */
    cr_assert_eq(c->target0, 2);
    kvt__keyed_missed(c, K(9)); /* never seen */
    cr_assert_eq(c->target0, 2);
    /* keys 4..7 present, all class 0: two class-1 keys evict two of them (class 1 has none to give) */
    uint64_t two_s[2] = {CLASS_BIT | 1, CLASS_BIT | 2}, ten_s[1] = {9};
    keys[0] = K(8), keys[1] = K(9);
    cr_assert_eq(kvt_keyed_prepare_store(c, keys, two_s, 2, NULL, 0, pages, ev, 8, &nv), KVT_OK);
    cr_assert(nv == 2 && key_eq(ev[0], K(4)) && key_eq(ev[1], K(5)));
    kvt_keyed_complete_store(c, keys, 2, 1);
    /* two class-0 keys present, not more than the target 2: class 1 gives way (s2lru would take key 6) */
    keys[0] = K(10);
    cr_assert_eq(kvt_keyed_prepare_store(c, keys, ten_s, 1, NULL, 0, pages, ev, 8, &nv), KVT_OK);
    cr_assert(nv == 1 && key_eq(ev[0], K(8)), "the target let class 0 keep its two");
    kvt_keyed_complete_store(c, keys, 1, 1);
    /* ghosts: class 0 {4, 5}, class 1 {2, 3, 8}: up by 3/2, then by 3/1, held at 4 pages */
    kvt__keyed_missed(c, K(4));
    cr_assert_eq(c->target0, 3.5);
    kvt__keyed_missed(c, K(5));
    cr_assert_eq(c->target0, 4, "the target stays within [0, pages]");
    assert_check(c, "two classes");
    kvt_keyed_destroy(c);
}

Test(keyed, refusal_changes_nothing) {
    kvt_keyed_t *c = six_ready(), *ref = six_ready();
    snap_t a = take_snap(ref, 12); /* (takes ref's events) */
    free_snap(&a);
    a = take_snap(c, 12);
    size_t ids[5] = {6, 7, 6, 8, 9}, prot[3] = {0, 2, 11}, ev[8], nv = 99;
    uint64_t pages[5];
    /* 4 new keys, no free page, 2 evictable outside protect (4 and 5) */
    cr_assert_eq(prepare(c, ids, 5, prot, 3, 16, pages, ev, &nv), KVT_ENOSPC);
    cr_assert_eq(nv, 0);
    for (size_t i = 0; i < 5; i++) cr_assert_eq(pages[i], UINT64_MAX);
    snap_t b = take_snap(c, 12);
    assert_unchanged(&a, &b, 1, "ENOSPC");
    /* too little room for what would be evicted: KVT_ERANGE, no refusal */
    free_snap(&a), a = b;
    cr_assert_eq(prepare(c, ids, 2, NULL, 0, 1, pages, ev, &nv), KVT_ERANGE);
    b = take_snap(c, 12);
    assert_unchanged(&a, &b, 0, "ERANGE");
    assert_check(c, "refused");
    /* the eviction order is as it was: the same store on a twin that saw no refusal */
    size_t ev2[8], nv2;
    uint64_t pages2[3];
    cr_assert_eq(prepare(c, ids, 3, NULL, 0, 8, pages, ev, &nv), KVT_OK);
    cr_assert_eq(prepare(ref, ids, 3, NULL, 0, 8, pages2, ev2, &nv2), KVT_OK);
    cr_assert_eq(nv, 2);
    cr_assert_eq(nv2, 2);
    cr_assert(ev[0] == 4 && ev[1] == 2 && ev2[0] == 4 && ev2[1] == 2, "evicted %zu %zu and %zu %zu", ev[0], ev[1], ev2[0], ev2[1]);
    cr_assert(pages[0] == pages2[0] && pages[1] == pages2[1] && pages[2] == UINT64_MAX);
    free_snap(&a), free_snap(&b);
    kvt_keyed_destroy(c), kvt_keyed_destroy(ref);
}

Test(keyed, protect_is_honoured) {
    kvt_keyed_t *c = make(4, 0, 1);
    size_t ids[4] = {0, 1, 2, 3}, ev[8], nv;
    uint64_t sc[4] = {1, 2, 3, 4}, old[4], pages[4];
    store_ready(c, ids, sc, 4);
    for (size_t k = 0; k < 4; k++) kvt_keyed_page(c, K(k), &old[k]);
    /* protect 0 and 2 (and an absent key, twice): 1 and 3 go, in that order */
    size_t prot[4] = {0, 2, 9, 0}, fresh[2] = {4, 5};
    cr_assert_eq(prepare(c, fresh, 2, prot, 4, 8, pages, ev, &nv), KVT_OK);
    cr_assert(nv == 2 && ev[0] == 1 && ev[1] == 3);
    cr_assert(pages[0] == old[1] && pages[1] == old[3], "the new keys take the evicted pages in eviction order");
    /* protected keys stay evictable, at their score */
    kvt_key128_t done[2] = {K(4), K(5)};
    kvt_keyed_complete_store(c, done, 2, 1);
    size_t one[1] = {6}, prot2[1] = {4};
    cr_assert_eq(prepare(c, one, 1, prot2, 1, 8, pages, ev, &nv), KVT_OK);
    cr_assert(nv == 1 && ev[0] == 0);
    /* protecting everything evictable refuses */
    kvt_keyed_complete_store(c, (kvt_key128_t[]){K(6)}, 1, 1);
    size_t all[4] = {2, 4, 5, 6}, seven[1] = {7};
    cr_assert_eq(prepare(c, seven, 1, all, 4, 8, pages, ev, &nv), KVT_ENOSPC);
    assert_check(c, "protect");
    kvt_keyed_destroy(c);
}

Test(keyed, free_room_evicts_down_to_the_target) {
    kvt_keyed_t *c = make(10, 0.3, 0); /* T = 3 */
    kvt_keyed_stats_t st = {.size = sizeof(st)};
    size_t ev[16], nv;
    uint64_t pages[8];
    store_range(c, 0, 10, score_is_id);
    size_t a[1] = {10};
    cr_assert_eq(prepare(c, a, 1, NULL, 0, 16, pages, ev, &nv), KVT_OK);
    cr_assert_eq(nv, 4, "1 needed + 3 for the free room");
    for (size_t v = 0; v < 4; v++) cr_assert_eq(ev[v], v);
    kvt_keyed_stats(c, &st);
    cr_assert_eq(st.free_pages, 3);
    size_t b[3] = {11, 12, 13}; /* fits: nothing evicted, whatever the room */
    cr_assert_eq(prepare(c, b, 3, NULL, 0, 16, pages, ev, &nv), KVT_OK);
    cr_assert_eq(nv, 0);
    size_t d[2] = {14, 15}; /* 6 evictable (4..9): 2 needed + 3 */
    cr_assert_eq(prepare(c, d, 2, NULL, 0, 16, pages, ev, &nv), KVT_OK);
    cr_assert(nv == 5 && ev[0] == 4 && ev[4] == 8);
    kvt_keyed_stats(c, &st);
    cr_assert_eq(st.free_pages, 3);
    /* the target is cut short by what is evictable: only key 9 is */
    size_t e[2] = {16, 17};
    cr_assert_eq(prepare(c, e, 2, NULL, 0, 16, pages, ev, &nv), KVT_OK); /* takes 2 of the 3 free */
    cr_assert_eq(nv, 0);
    size_t f[3] = {18, 19, 20}; /* 1 free, 2 needed, 1 evictable */
    cr_assert_eq(prepare(c, f, 3, NULL, 0, 16, pages, ev, &nv), KVT_ENOSPC);
    size_t g[1] = {18};
    cr_assert_eq(prepare(c, g, 1, NULL, 0, 16, pages, ev, &nv), KVT_OK);
    cr_assert_eq(nv, 0);
    size_t h[1] = {19};
    cr_assert_eq(prepare(c, h, 1, NULL, 0, 16, pages, ev, &nv), KVT_OK);
    cr_assert(nv == 1 && ev[0] == 9, "1 needed, and no more evictable");
    assert_check(c, "free room");
    kvt_keyed_destroy(c);
    /* 0.28 * 25 is 7.000000000000001 in double: T is 8, as Python's math.ceil(0.28 * 25) */
    c = make(25, 0.28, 0);
    store_range(c, 0, 25, score_is_id);
    a[0] = 30;
    cr_assert_eq(prepare(c, a, 1, NULL, 0, 16, pages, ev, &nv), KVT_OK);
    cr_assert_eq(nv, 9);
    kvt_keyed_stats(c, &st);
    cr_assert_eq(st.free_pages, 8);
    kvt_keyed_destroy(c);
}

Test(keyed, bad_configs_are_refused) {
    kvt_keyed_t *c = NULL;
    const kvt_keyed_config_t ok = {.size = sizeof(ok), .pages = 8};
    kvt_keyed_config_t cfg;
    cfg = ok, cfg.size = 0;
    cr_assert_eq(kvt_keyed_create(&c, &cfg), KVT_EINVAL);
    cfg = ok, cfg.size = 2;
    cr_assert_eq(kvt_keyed_create(&c, &cfg), KVT_EINVAL);
    uint64_t pagess[3] = {0, (uint64_t)1 << 32, UINT64_MAX};
    for (int i = 0; i < 3; i++) {
        cfg = ok, cfg.pages = pagess[i];
        cr_assert_eq(kvt_keyed_create(&c, &cfg), KVT_EINVAL, "pages %" PRIu64, pagess[i]);
    }
    double rooms[5] = {-0.01, 1.0, 1.5, NAN, INFINITY};
    for (int i = 0; i < 5; i++) {
        cfg = ok, cfg.free_room = rooms[i];
        cr_assert_eq(kvt_keyed_create(&c, &cfg), KVT_EINVAL, "free_room %g", rooms[i]);
    }
    struct { kvt_keyed_config_t cfg; uint64_t future; } big = {ok, 1}; /* a newer caller's field we cannot honour */
    big.cfg.size = sizeof(big);
    cr_assert_eq(kvt_keyed_create(&c, &big.cfg), KVT_EINVAL);
    big.future = 0;
    cr_assert_eq(kvt_keyed_create(&c, &big.cfg), KVT_OK);
    kvt_keyed_destroy(c);
    cr_assert_eq(kvt_keyed_create(NULL, &ok), KVT_EINVAL);
    cr_assert_eq(kvt_keyed_create(&c, NULL), KVT_EINVAL);
    cfg = ok, cfg.pages = ((uint64_t)1 << 32) - 1, cfg.free_room = 0.999;
    cr_assert_eq(kvt_keyed_create(&c, &cfg), KVT_OK);
    assert_check(c, "largest");
    kvt_keyed_destroy(c);
}

/* ARC's configuration and hooks refuse what they cannot do, changing
 * nothing; the scores' calls leave an ARC cache's order alone. */
Test(keyed, arc_refuses_what_it_cannot_do) {
    kvt_keyed_t *c = NULL;
    const kvt_keyed_config_t ok = {.size = sizeof(ok), .pages = 4, .policy = KVT_KEYED_ARC};
    kvt_keyed_config_t cfg;
    cfg = ok, cfg.policy = 2;
    cr_assert_eq(kvt_keyed_create(&c, &cfg), KVT_EINVAL, "an unknown policy");
    cfg = ok, cfg.reserved = 1;
    cr_assert_eq(kvt_keyed_create(&c, &cfg), KVT_EINVAL, "reserved set");
    cfg = ok, cfg.free_room = 0.25;
    cr_assert_eq(kvt_keyed_create(&c, &cfg), KVT_EINVAL, "ARC evicts on demand only");
    cfg = ok, cfg.pages = ((uint64_t)1 << 32) - 1;
    cr_assert_eq(kvt_keyed_create(&c, &cfg), KVT_EINVAL, "ARC's ghosts hold below 2^32 - 1 keys");

    kvt_keyed_t *s = make(4, 0, 0); /* the hooks are ARC's only */
    kvt_key128_t k[3] = {K(0), K(1), K(2)};
    uint8_t flags[3] = {KVT_KEYED_ARC_REUSED, 0, 3};
    cr_assert_eq(kvt_keyed_arc_touch(s, k, 1), KVT_EINVAL);
    cr_assert_eq(kvt_keyed_arc_missed(s, k, 1), KVT_EINVAL);
    cr_assert_eq(kvt_keyed_arc_finish(s, k, flags, 1), KVT_EINVAL);
    uint64_t pages[3];
    size_t nev = 0;
    cr_assert_eq(kvt_keyed_prepare_store(s, k, NULL, 1, NULL, 0, pages, NULL, 0, &nev), KVT_EINVAL, "scores are needed");
    kvt_keyed_destroy(s);

    c = make_policy(2, 0, 1, KVT_KEYED_ARC);
    cr_assert_eq(kvt_keyed_prepare_store(c, k, NULL, 2, NULL, 0, pages, NULL, 0, &nev), KVT_OK, "no scores under ARC");
    kvt_keyed_complete_store(c, k, 2, 1);
    cr_assert_eq(kvt_keyed_arc_finish(c, k, flags, 3), KVT_EINVAL, "flag 3");
    cr_assert_eq(c->ncls1, 0, "a refused finish moved nothing");
    cr_assert_eq(kvt_keyed_arc_touch(c, NULL, 1), KVT_EINVAL);
    cr_assert_eq(kvt_keyed_arc_touch(NULL, k, 1), KVT_EINVAL);
    cr_assert_eq(kvt_keyed_arc_touch(c, NULL, 0), KVT_OK);
    uint64_t sc[2] = {UINT64_MAX, UINT64_MAX};
    kvt_keyed_touch(c, k, sc, 2); /* nothing: K(0) is still T1's least recent, and goes first */
    kvt_key128_t ev[2];
    cr_assert_eq(kvt_keyed_prepare_store(c, &k[2], NULL, 1, NULL, 0, pages, ev, 2, &nev), KVT_OK);
    cr_assert(nev == 1 && key_eq(ev[0], K(0)), "T1's least recent goes first");
    kvt_keyed_complete_store(c, &k[2], 1, 1);
    cr_assert_eq(kvt_keyed_arc_missed(c, k, 1), KVT_OK); /* K(0) in B1: the target grows by 1 */
    cr_assert(c->target0 == 1.0, "target %g", c->target0);
    cr_assert_eq(kvt_keyed_reset(c), KVT_OK);
    cr_assert(c->target0 == 0 && kvt__lru_size(&c->arc_ghost[0]) == 0, "reset empties the ghosts, the target 0");
    assert_check(c, "arc");
    kvt_keyed_destroy(c);
}

/* The page rule of the header's essay, worked by hand. */
Test(keyed, pages_follow_the_documented_rule) {
    kvt_keyed_t *c = make(8, 0, 0);
    uint64_t pages[4];
    size_t ev[8], nv;
    size_t a[3] = {0, 1, 2}, b[2] = {3, 4}, d[2] = {5, 6}, e[3] = {7, 8, 9};
    cr_assert_eq(prepare(c, a, 3, NULL, 0, 0, pages, ev, &nv), KVT_OK);
    cr_assert(pages[0] == 0 && pages[1] == 1 && pages[2] == 2);
    cr_assert_eq(prepare(c, b, 2, NULL, 0, 0, pages, ev, &nv), KVT_OK);
    cr_assert(pages[0] == 3 && pages[1] == 4);
    kvt_key128_t ka[3] = {K(0), K(1), K(2)}, kb[2] = {K(3), K(4)};
    kvt_keyed_complete_store(c, &ka[1], 1, 0); /* page 1 is loose */
    kvt_keyed_complete_store(c, ka, 3, 1);
    kvt_keyed_complete_store(c, kb, 2, 1);
    cr_assert_eq(prepare(c, d, 2, NULL, 0, 0, pages, ev, &nv), KVT_OK);
    cr_assert(pages[0] == 1 && pages[1] == 5, "the loose page first, then a reserve: got %" PRIu64 " %" PRIu64, pages[0], pages[1]);
    kvt_key128_t kd[2] = {K(5), K(6)};
    kvt_keyed_complete_store(c, kd, 2, 1);
    /* free: 6 and 7; three new keys evict one (key 0, score 100): its page 0 first */
    cr_assert_eq(prepare(c, e, 3, NULL, 0, 4, pages, ev, &nv), KVT_OK);
    cr_assert(nv == 1 && ev[0] == 0);
    cr_assert(pages[0] == 0 && pages[1] == 6 && pages[2] == 7);
    assert_check(c, "rule");
    kvt_keyed_destroy(c);
}

Test(keyed, reset_removes_in_eviction_order) {
    kvt_keyed_t *c = make(6, 0, 1);
    size_t ids[5] = {0, 1, 2, 3, 4}, one[1] = {5}, ev[4], nv;
    uint64_t sc[5] = {7, 7, 2, 9, 0}, pages[1];
    kvt_keyed_event_t got[16];
    store_ready(c, ids, sc, 5);
    kvt_keyed_take_events(c, got, 16);
    cr_assert_eq(prepare(c, one, 1, NULL, 0, 0, pages, ev, &nv), KVT_OK);
    snap_t a = take_snap(c, 8);
    cr_assert_eq(kvt_keyed_reset(c), KVT_EBUSY, "a key is pending");
    snap_t b = take_snap(c, 8);
    assert_unchanged(&a, &b, 0, "reset while pending");
    kvt_keyed_complete_store(c, (kvt_key128_t[]){K(5)}, 1, 0); /* its page is loose; reset frees it too */
    cr_assert_eq(kvt_keyed_pin(c, (kvt_key128_t[]){K(3)}, 1, NULL), KVT_OK);
    cr_assert_eq(kvt_keyed_reset(c), KVT_EBUSY, "a key is pinned");
    cr_assert_eq(kvt_keyed_unpin(c, (kvt_key128_t[]){K(3)}, 1), KVT_OK);
    kvt_keyed_take_events(c, got, 16);
    cr_assert_eq(kvt_keyed_reset(c), KVT_OK);
    /* (score, hi, lo): 4 (0), 2 (2), then score 7: key 0 (hi 0) before key 1 (hi 5), then 3 */
    size_t want[5] = {4, 2, 0, 1, 3};
    cr_assert_eq(kvt_keyed_take_events(c, got, 16), 5);
    for (size_t i = 0; i < 5; i++)
        cr_assert(key_eq(got[i].key, K(want[i])) && got[i].kind == KVT_KEYED_REMOVED && got[i].why == 2, "event %zu", i);
    kvt_keyed_stats_t st = {.size = sizeof(st)};
    kvt_keyed_stats(c, &st);
    cr_assert(st.keys == 0 && st.free_pages == 6 && st.evictions == 0);
    assert_check(c, "reset");
    cr_assert_eq(prepare(c, one, 1, NULL, 0, 0, pages, ev, &nv), KVT_OK);
    cr_assert_eq(pages[0], 0, "a reset cache starts from page 0 again");
    free_snap(&a), free_snap(&b);
    kvt_keyed_destroy(c);
}

Test(keyed, events_and_argument_checks) {
    kvt_keyed_t *c = make(2, 0, 1);
    size_t ids[3] = {0, 1, 2}, ev[4], nv;
    uint64_t pages[3];
    kvt_keyed_event_t got[8];
    cr_assert_eq(prepare(c, ids, 2, NULL, 0, 0, pages, ev, &nv), KVT_OK);
    kvt_key128_t k10[2] = {K(1), K(0)};
    kvt_keyed_complete_store(c, k10, 2, 1); /* stored in the order of this call's keys */
    cr_assert_eq(prepare(c, &ids[2], 1, NULL, 0, 1, pages, ev, &nv), KVT_OK); /* evicts 0 (score 100) */
    kvt_keyed_complete_store(c, (kvt_key128_t[]){K(2)}, 1, 0);
    cr_assert_eq(kvt_keyed_take_events(c, got, 1), 1);
    cr_assert(key_eq(got[0].key, K(1)) && got[0].kind == KVT_KEYED_STORED);
    cr_assert_eq(kvt_keyed_take_events(c, got, 8), 3);
    cr_assert(key_eq(got[0].key, K(0)) && got[0].kind == KVT_KEYED_STORED);
    cr_assert(key_eq(got[1].key, K(0)) && got[1].kind == KVT_KEYED_REMOVED && got[1].why == 0);
    cr_assert(key_eq(got[2].key, K(2)) && got[2].kind == KVT_KEYED_REMOVED && got[2].why == 1);
    cr_assert_eq(kvt_keyed_take_events(c, got, 8), 0);
    /* pins: pending or absent keys refuse, and a repeated unpin beyond the pins */
    cr_assert_eq(kvt_keyed_pin(c, (kvt_key128_t[]){K(0)}, 1, pages), KVT_ENOENT);
    kvt_key128_t k11[2] = {K(1), K(1)};
    cr_assert_eq(kvt_keyed_pin(c, k11, 1, pages), KVT_OK);
    cr_assert_eq(kvt_keyed_unpin(c, k11, 2), KVT_EINVAL);
    cr_assert_eq(kvt_keyed_unpin(c, k11, 1), KVT_OK);
    cr_assert_eq(kvt_keyed_unpin(c, k11, 1), KVT_EINVAL);
    /* argument checks */
    size_t n0;
    cr_assert_eq(kvt_keyed_prepare_store(c, NULL, NULL, 1, NULL, 0, pages, NULL, 0, &n0), KVT_EINVAL);
    cr_assert_eq(kvt_keyed_prepare_store(c, NULL, NULL, 0, NULL, 0, NULL, NULL, 0, NULL), KVT_EINVAL);
    cr_assert_eq(kvt_keyed_prepare_store(c, NULL, NULL, 0, NULL, 1, NULL, NULL, 0, &n0), KVT_EINVAL);
    cr_assert_eq(kvt_keyed_prepare_store(c, NULL, NULL, 0, NULL, 0, NULL, NULL, 0, &n0), KVT_OK);
    cr_assert_eq(kvt_keyed_lookup(NULL, K(0)), KVT_EINVAL);
    cr_assert_eq(kvt_keyed_check(NULL, NULL), KVT_EINVAL);
    cr_assert_eq(kvt_keyed_stats(c, NULL), KVT_EINVAL);
    kvt_keyed_destroy(c);
    kvt_keyed_destroy(NULL);
}

/* ---- allocation failures ---- */

/* 200 pages, a quarter kept free: 190 ready keys (scores i mod 7), 5 of them
 * pinned, and 10 loose pages from failed stores. */
static kvt_keyed_t *setup_full(void) {
    kvt_keyed_t *c = make(200, 0.25, 1);
    store_range(c, 10, 190, score_mod7);
    kvt_key128_t k[10];
    uint64_t sc[10] = {0}, pages[10];
    size_t nv;
    for (size_t i = 0; i < 10; i++) k[i] = K(i);
    cr_assert_eq(kvt_keyed_prepare_store(c, k, sc, 10, NULL, 0, pages, NULL, 0, &nv), KVT_OK);
    kvt_keyed_complete_store(c, k, 10, 0);
    for (size_t i = 0; i < 5; i++) k[i] = K(20 + i);
    cr_assert_eq(kvt_keyed_pin(c, k, 5, NULL), KVT_OK);
    return c;
}

static kvt_keyed_t *setup_settled(void) {
    kvt_keyed_t *c = setup_full();
    kvt_key128_t k[5];
    for (size_t i = 0; i < 5; i++) k[i] = K(20 + i);
    cr_assert_eq(kvt_keyed_unpin(c, k, 5), KVT_OK);
    return c;
}

static kvt_keyed_t *setup_few(void) {
    kvt_keyed_t *c = make(200, 0, 1);
    store_range(c, 0, 20, score_mod7);
    return c;
}

typedef struct res {
    int rc;
    size_t nv, n; /* n: the keys of a prepare_store, whose pages[] a failure leaves UINT64_MAX */
    uint64_t pages[200];
    kvt_key128_t ev[200];
} res_t;

static void prepare_new(kvt_keyed_t *c, size_t first, size_t n, res_t *r) {
    kvt_key128_t k[200], prot[10];
    uint64_t sc[200];
    for (size_t i = 0; i < n; i++) k[i] = K(first + i), sc[i] = i % 5;
    for (size_t j = 0; j < 10; j++) prot[j] = K(30 + j);
    r->n = n;
    r->rc = kvt_keyed_prepare_store(c, k, sc, n, prot, 10, r->pages, r->ev, 200, &r->nv);
}

/* 60 new keys: 50 needed beyond the 10 loose pages, and 50 for the free
 * room; the 50 recycled pages left over go back (a free of 50 runs). */
static void op_evict(kvt_keyed_t *c, res_t *r) { prepare_new(c, 1000, 60, r); }
/* 150 new keys into a cache of 20: table, entries and events grow; a reserve. */
static void op_grow(kvt_keyed_t *c, res_t *r) { prepare_new(c, 1000, 150, r); }
static void op_reset_all(kvt_keyed_t *c, res_t *r) { r->rc = kvt_keyed_reset(c); }
/* 20 keys stored one call each: the loose list kept room for one page */
static kvt_keyed_t *setup_one_by_one(void) {
    kvt_keyed_t *c = make(200, 0, 1);
    for (size_t i = 0; i < 20; i++) {
        kvt_key128_t k = K(i);
        uint64_t sc = i, page;
        size_t nv;
        cr_assert_eq(kvt_keyed_prepare_store(c, &k, &sc, 1, NULL, 0, &page, NULL, 0, &nv), KVT_OK);
        kvt_keyed_complete_store(c, &k, 1, 1);
    }
    return c;
}

/* ARC, full of 200 keys, some used again (T2), a victim remembered */
static kvt_keyed_t *setup_arc_full(void) {
    kvt_keyed_t *c = make_policy(200, 0, 1, KVT_KEYED_ARC);
    store_range(c, 0, 200, score_mod7);
    kvt_key128_t k[40];
    uint8_t flags[40];
    for (size_t i = 0; i < 40; i++) k[i] = K(50 + i), flags[i] = KVT_KEYED_ARC_REUSED;
    cr_assert_eq(kvt_keyed_arc_finish(c, k, flags, 40), KVT_OK);
    return c;
}

/* all 20 and some absent keys: their pages need a loose list longer than it is */
static void op_remove_all(kvt_keyed_t *c, res_t *r) {
    kvt_key128_t k[30];
    for (size_t i = 0; i < 30; i++) k[i] = K(i);
    r->rc = kvt_keyed_remove(c, k, 30, &r->nv);
}

static void assert_same_result(const res_t *a, const res_t *b, const char *ctx) {
    cr_assert_eq(a->rc, b->rc, "%s", ctx);
    cr_assert_eq(a->nv, b->nv, "%s", ctx);
    cr_assert(memcmp(a->pages, b->pages, sizeof(a->pages)) == 0, "%s: pages differ", ctx);
    for (size_t v = 0; v < a->nv; v++) cr_assert(key_eq(a->ev[v], b->ev[v]), "%s: eviction %zu differs", ctx, v);
}

/* Fails the 1st, 2nd, ... allocation of op until it runs without one. Each
 * failure must leave the cache as it was, and the same op then does on it
 * what it does on a cache that never saw a failure. */
static void each_failure_point(kvt_keyed_t *(*setup)(void), void (*op)(kvt_keyed_t *, res_t *), const char *name) {
    static res_t want, got;
    memset(&want, 0, sizeof(want));
    kvt_keyed_t *ref = setup();
    snap_t r0 = take_snap(ref, 1200);
    op(ref, &want);
    cr_assert_eq(want.rc, KVT_OK, "%s: %s", name, kvt_err_name(want.rc));
    snap_t r1 = take_snap(ref, 1200);
    uint64_t nth = 1;
    for (;; nth++) {
        kvt_keyed_t *c = setup();
        snap_t a = take_snap(c, 1200);
        memset(&got, 0, sizeof(got));
        kvt__mem_fail_nth(nth);
        op(c, &got);
        int fired = kvt__mem_fail_fired();
        kvt__mem_fail_nth(0);
        char ctx[96];
        snprintf(ctx, sizeof(ctx), "%s, allocation %" PRIu64 " failed", name, nth);
        if (fired) {
            cr_assert_eq(got.rc, KVT_ENOMEM, "%s: returned %s", ctx, kvt_err_name(got.rc));
            cr_assert_eq(got.nv, 0, "%s: evicted", ctx);
            for (size_t i = 0; i < got.n; i++) cr_assert_eq(got.pages[i], UINT64_MAX, "%s: pages[%zu]", ctx, i);
            snap_t b = take_snap(c, 1200);
            assert_unchanged(&a, &b, 0, ctx);
            assert_check(c, ctx);
            free_snap(&b);
            memset(&got, 0, sizeof(got));
            op(c, &got);
        }
        assert_same_result(&got, &want, ctx);
        snap_t b = take_snap(c, 1200);
        for (size_t k = 0; k < 1200; k++)
            cr_assert(b.prc[k] == r1.prc[k] && b.page[k] == r1.page[k] && b.state[k] == r1.state[k], "%s: key %zu", ctx, k);
        cr_assert_eq(b.nev, r1.nev, "%s: events", ctx);
        assert_check(c, ctx);
        free_snap(&a), free_snap(&b);
        kvt_keyed_destroy(c);
        if (!fired) break;
        cr_assert_lt(nth, 1000);
    }
    fprintf(stderr, "keyed %s: %" PRIu64 " allocation sites failed in turn\n", name, nth - 1);
    cr_assert_gt(nth, 1, "%s allocated nothing: the test tests nothing", name);
    free_snap(&r0), free_snap(&r1);
    kvt_keyed_destroy(ref);
}

Test(keyed, failed_allocation_changes_nothing, .timeout = 120) {
    each_failure_point(setup_full, op_evict, "evicting prepare_store");
    each_failure_point(setup_few, op_grow, "growing prepare_store");
    each_failure_point(setup_settled, op_reset_all, "reset");
    each_failure_point(setup_one_by_one, op_remove_all, "remove");
    each_failure_point(setup_arc_full, op_evict, "ARC's evicting prepare_store");
    for (uint64_t nth = 1; nth < 16; nth++) {
        kvt_keyed_t *c = NULL;
        kvt_keyed_config_t cfg = {.size = sizeof(cfg), .pages = 100, .policy = nth % 2 ? KVT_KEYED_ARC : KVT_KEYED_SCORES};
        kvt__mem_fail_nth(nth);
        int rc = kvt_keyed_create(&c, &cfg);
        kvt__mem_fail_nth(0);
        cr_assert(rc == KVT_OK || rc == KVT_ENOMEM);
        if (rc == KVT_OK) assert_check(c, "created");
        kvt_keyed_destroy(c);
    }
    kvt_keyed_t *c = setup_full();
    kvt__mem_fail_nth(1);
    int rc = kvt_keyed_check(c, NULL);
    kvt__mem_fail_nth(0);
    cr_assert_eq(rc, KVT_ENOMEM);
    kvt_keyed_destroy(c);
}

/* complete_store, pin, unpin, touch and the queries never allocate: the room
 * they need was set aside by prepare_store. */
Test(keyed, calls_that_cannot_fail_do_not_allocate) {
    kvt_keyed_t *c = make(64, 0, 1);
    store_range(c, 0, 40, score_mod7);
    kvt_key128_t k[20];
    uint64_t sc[20], pages[20];
    size_t nv;
    for (size_t i = 0; i < 20; i++) k[i] = K(100 + i), sc[i] = i;
    cr_assert_eq(kvt_keyed_prepare_store(c, k, sc, 20, NULL, 0, pages, NULL, 0, &nv), KVT_OK);
    kvt__mem_fail_nth(1);
    kvt_keyed_complete_store(c, k, 10, 1);
    kvt_keyed_complete_store(c, k + 10, 10, 0);
    cr_assert_eq(kvt_keyed_pin(c, k, 10, pages), KVT_OK);
    kvt_keyed_touch(c, k, sc, 20);
    cr_assert_eq(kvt_keyed_unpin(c, k, 10), KVT_OK);
    cr_assert_eq(kvt_keyed_lookup(c, k[0]), KVT_KEYED_HIT);
    kvt_keyed_event_t ev[64];
    cr_assert_eq(kvt_keyed_take_events(c, ev, 64), 60);
    int fired = kvt__mem_fail_fired();
    kvt__mem_fail_nth(0);
    cr_assert_not(fired);
    assert_check(c, "no allocation");
    kvt_keyed_destroy(c);
    c = setup_arc_full(); /* ARC's hooks neither */
    uint8_t flags[20] = {0};
    for (size_t i = 0; i < 20; i++) k[i] = K(90 + i), flags[i] = (uint8_t)(i % 3);
    kvt__mem_fail_nth(1);
    cr_assert_eq(kvt_keyed_arc_touch(c, k, 20), KVT_OK);
    cr_assert_eq(kvt_keyed_arc_missed(c, k, 20), KVT_OK);
    cr_assert_eq(kvt_keyed_arc_finish(c, k, flags, 20), KVT_OK);
    fired = kvt__mem_fail_fired();
    kvt__mem_fail_nth(0);
    cr_assert_not(fired);
    assert_check(c, "ARC, no allocation");
    kvt_keyed_destroy(c);
}

/* remove: only ready, unpinned keys go, each with a removed event (why 3),
 * and their pages serve the next store. */
Test(keyed, remove_takes_ready_unpinned_keys) {
    kvt_keyed_t *c = make(4, 0, 1);
    kvt_key128_t k[4] = {K(0), K(1), K(2), K(3)};
    uint64_t sc[4] = {1, 2, 3, 4}, pages[4];
    size_t nv, n;
    cr_assert_eq(kvt_keyed_prepare_store(c, k, sc, 4, NULL, 0, pages, NULL, 0, &nv), KVT_OK);
    kvt_keyed_complete_store(c, k, 2, 1); /* K0, K1 ready; K2, K3 pending */
    cr_assert_eq(kvt_keyed_pin(c, &k[1], 1, NULL), KVT_OK);
    kvt_keyed_event_t ev[8];
    kvt_keyed_take_events(c, ev, 8);
    kvt_key128_t gone[5] = {K(3), K(1), K(0), K(0), K(9)}; /* pending, pinned, ready (twice), absent */
    cr_assert_eq(kvt_keyed_remove(c, gone, 5, &n), KVT_OK);
    cr_assert_eq(n, 1);
    cr_assert_eq(kvt_keyed_lookup(c, K(0)), KVT_KEYED_MISS);
    cr_assert_eq(kvt_keyed_lookup(c, K(1)), KVT_KEYED_HIT);
    cr_assert_eq(kvt_keyed_take_events(c, ev, 8), 1);
    cr_assert(key_eq(ev[0].key, K(0)) && ev[0].kind == KVT_KEYED_REMOVED && ev[0].why == 3);
    kvt_keyed_stats_t st = {.size = sizeof(st)};
    kvt_keyed_stats(c, &st);
    cr_assert(st.removed == 1 && st.keys == 3 && st.free_pages == 1 && st.evictions == 0);
    uint64_t p;
    kvt_key128_t k5 = K(5);
    cr_assert_eq(kvt_keyed_prepare_store(c, &k5, sc, 1, NULL, 0, &p, NULL, 0, &nv), KVT_OK);
    cr_assert_eq(p, pages[0], "the removed key's page is reused");
    cr_assert_eq(nv, 0);
    cr_assert_eq(kvt_keyed_remove(NULL, gone, 1, &n), KVT_EINVAL);
    cr_assert_eq(kvt_keyed_remove(c, NULL, 1, &n), KVT_EINVAL);
    cr_assert_eq(kvt_keyed_remove(c, NULL, 0, NULL), KVT_OK);
    assert_check(c, "after remove");
    kvt_keyed_destroy(c);
}

/* A key's pins are counted in 32 bits: a pin that would wrap the count
 * (which left the key outside the heap for good, never evicted, and reset
 * refused) is refused with nothing changed, also one a call repeats. */
Test(keyed, a_pin_count_that_would_wrap_is_refused) {
    kvt_keyed_t *c = make(4, 0.0, 0);
    kvt_key128_t k = {1, 2}, two[2] = {{1, 2}, {1, 2}};
    uint64_t pages[2];
    cr_assert_eq(kvt_keyed_prepare_store(c, &k, (uint64_t[]){5}, 1, NULL, 0, pages, NULL, 0, (size_t[]){0}), KVT_OK);
    kvt_keyed_complete_store(c, &k, 1, 1);
    cr_assert_eq(kvt_keyed_pin(c, &k, 1, pages), KVT_OK);
    uint32_t i = kvt__keyed_find(c, k);
    c->ents[i].pins = UINT32_MAX - 1; /* (as 2^32 - 2 pins would leave it) */
    cr_assert_eq(kvt_keyed_pin(c, two, 2, pages), KVT_ERANGE);
    cr_assert_eq(c->ents[i].pins, UINT32_MAX - 1, "nothing pinned");
    cr_assert_eq(kvt_keyed_pin(c, &k, 1, pages), KVT_OK);
    cr_assert_eq(kvt_keyed_pin(c, &k, 1, pages), KVT_ERANGE);
    const char *why = NULL;
    cr_assert_eq(kvt_keyed_check(c, &why), KVT_OK, "%s", why ? why : "");
    c->ents[i].pins = 1;
    cr_assert_eq(kvt_keyed_unpin(c, &k, 1), KVT_OK);
    cr_assert_eq(kvt_keyed_reset(c), KVT_OK);
    kvt_keyed_destroy(c);
}
