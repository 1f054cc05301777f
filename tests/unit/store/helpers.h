/* Shared by the store tests: a host tier, a store over it, and batch calls
 * made synchronous (submit, then poll until that batch is reported). */
#ifndef KVTIER_TESTS_STORE_HELPERS_H
#define KVTIER_TESTS_STORE_HELPERS_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier/testing.h"
#include "kvtier/error.h"
#include "kvtier/store.h"
#include "kvtier/tier.h"

#define MAXK 256

typedef struct senv {
    kvt_tier_t *tier;
    kvt_store_t *store;
    kvt_store_config_t cfg;
    void *scratch;
    uint64_t layer_bytes;
} senv_t;

typedef struct sres {
    int status;
    size_t n, count;
    uint8_t r[MAXK];
} sres_t;

/* Messages are checked through kvt_store_last_error, not printed. */
static inline void quiet_log(void *arg, const char *msg) { (void)arg, (void)msg; }

/* Removes a test's directory tree. */
static inline void rmtree(const char *p) {
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", p);
    if (system(cmd) != 0) fprintf(stderr, "rm -rf %s failed\n", p);
}

static inline kvt_tier_t *make_tier(uint64_t pages, uint32_t layers, uint64_t layer_bytes, kvt_layout_t layout) {
    kvt_tier_config_t tc = {.size = sizeof(tc), .kind = KVT_TIER_HOST,
                            .geom = {.pages = pages, .layers = layers, .layer_bytes = layer_bytes, .layout = layout}};
    kvt_tier_t *t = NULL;
    cr_assert_eq(kvt_tier_create(&t, &tc), KVT_OK);
    return t;
}

/* A tier of `pages` pages and a config for it (model "test-model", 16 tokens a page). */
static inline void senv_init(senv_t *e, uint64_t pages, uint32_t layers, uint64_t layer_bytes, kvt_layout_t layout) {
    memset(e, 0, sizeof(*e));
    e->tier = make_tier(pages, layers, layer_bytes, layout);
    e->layer_bytes = layer_bytes;
    e->scratch = malloc(layer_bytes);
    kvt_store_config_default(&e->cfg);
    e->cfg.tier = e->tier;
    e->cfg.model = "test-model";
    e->cfg.page_tokens = 16;
    e->cfg.timeout_ms = 1000;
    e->cfg.log = quiet_log;
}

static inline int senv_open(senv_t *e, const char *url) { return kvt_store_open(&e->store, url, &e->cfg); }

static inline void senv_fini(senv_t *e) {
    if (e->store) kvt_store_close(e->store);
    if (e->tier) kvt_tier_destroy(e->tier);
    free(e->scratch);
    memset(e, 0, sizeof(*e));
}

static inline kvt_hash128_t hkey(uint64_t i) { return (kvt_hash128_t){.lo = 0x9e3779b97f4a7c15ull * (i + 1), .hi = i ^ 0xabcdefull}; }

/* Pages i0..i0+n with hashes hkey(h0 + i) on tier pages p0 + i. */
static inline void pages_of(kvt_store_page_t *p, size_t n, uint64_t h0, uint32_t p0) {
    for (size_t i = 0; i < n; i++) p[i] = (kvt_store_page_t){.hash = hkey(h0 + i), .page = p0 + (uint32_t)i};
}

typedef int (*sop_fn)(kvt_store_t *, const kvt_store_page_t *, size_t, uint64_t, uint64_t *);

static inline sres_t run_op(kvt_store_t *s, sop_fn fn, const kvt_store_page_t *p, size_t n) {
    sres_t out = {0};
    uint64_t t;
    cr_assert_eq(fn(s, p, n, 42, &t), KVT_OK);
    kvt_store_done_t d;
    int k = kvt_store_poll(s, &d, 1, 60ull * 1000000000ull);
    cr_assert_eq(k, 1, "batch not reported");
    cr_assert_eq(d.ticket, t);
    cr_assert_eq(d.user, 42u);
    cr_assert_eq(d.n, n);
    out.status = d.status;
    out.n = d.n;
    out.count = d.count;
    memcpy(out.r, d.results, n < MAXK ? n : MAXK);
    return out;
}

/* Fill tier pages p..p+n with the pattern of hkey(h0 + i). */
static inline void fill(senv_t *e, uint64_t h0, uint32_t p0, size_t n) {
    for (size_t i = 0; i < n; i++) {
        kvt_hash128_t h = hkey(h0 + i);
        cr_assert_eq(kvt_tier_pattern_fill(e->tier, p0 + i, h.lo, h.hi, e->scratch), KVT_OK);
    }
}

/* Pages of hashes hkey(h0 + i) on tier pages 0..n, filled with their patterns and put. */
static inline void put_filled(senv_t *e, kvt_store_page_t *p, size_t n, uint64_t h0) {
    pages_of(p, n, h0, 0);
    fill(e, h0, 0, n);
    cr_assert_eq(run_op(e->store, kvt_store_put, p, n).count, n);
}

static inline bool check(senv_t *e, uint64_t h, uint32_t page) {
    kvt_hash128_t k = hkey(h);
    return kvt_tier_pattern_check(e->tier, page, k.lo, k.hi, e->scratch);
}

/* Zero tier pages: a get must write them for a check to pass. */
static inline void wipe(senv_t *e, uint32_t p0, size_t n) {
    const kvt_geom_t *g = kvt_tier_geom(e->tier);
    for (size_t i = 0; i < n; i++)
        for (uint32_t l = 0; l < g->layers; l++) memset(kvt_tier_addr(e->tier, p0 + i, l), 0, g->layer_bytes);
}

static inline kvt_store_stats_t sstats(kvt_store_t *s, kvt_store_op_t op) {
    kvt_store_stats_t st = {.size = sizeof(st)};
    cr_assert_eq(kvt_store_stats(s, op, &st), KVT_OK);
    return st;
}

/* Keys hkey(h0 + i) on tier pages 0..n, filled; each put on its own except
 * the holes (every 7th from the 6th, and the 13th): stored[i] says which. */
static inline void put_with_holes(senv_t *e, kvt_store_page_t *p, size_t n, uint64_t h0, bool *stored) {
    pages_of(p, n, h0, 0);
    fill(e, h0, 0, n);
    for (size_t i = 0; i < n; i++) {
        stored[i] = i % 7 != 5 && i != 12;
        if (stored[i]) cr_assert_eq(run_op(e->store, kvt_store_put, &p[i], 1).count, 1u);
    }
}

/* kvt_store_run (the caller's thread) against the queued calls: put 12
 * pages from tier pages 0.., every other one by each; exists over them and
 * 4 never put; get each way into two other page ranges, byte for byte;
 * remove through run; a get of a page twice or out of range refused with
 * nothing done. Each run counted as one call of its op. */
static inline void run_matches_queued(senv_t *e, uint64_t h0) {
    kvt_store_page_t p[16], q[16], r2[16];
    pages_of(p, 16, h0, 0);
    fill(e, h0, 0, 16);
    uint64_t calls0 = sstats(e->store, KVT_STORE_PUT).calls;
    uint8_t res[16];
    size_t count = 99;
    for (int i = 0; i < 12; i += 2) {
        cr_assert_eq(kvt_store_run(e->store, KVT_STORE_PUT, &p[i], 1, res, &count), KVT_OK);
        cr_assert_eq(res[0], KVT_STORE_OK);
        cr_assert_eq(count, 1u);
        cr_assert_eq(run_op(e->store, kvt_store_put, &p[i + 1], 1).count, 1u);
    }
    cr_assert_eq(sstats(e->store, KVT_STORE_PUT).calls - calls0, 12u);
    memset(res, 0xee, sizeof(res));
    cr_assert_eq(kvt_store_run(e->store, KVT_STORE_EXISTS, p, 16, res, &count), KVT_OK);
    sres_t ex = run_op(e->store, kvt_store_exists, p, 16);
    cr_assert_eq(count, ex.count);
    cr_assert_eq(count, 12u);
    cr_assert_eq(memcmp(res, ex.r, 16), 0, "per-key results differ from the queued exists");
    pages_of(q, 12, h0, 16);
    pages_of(r2, 12, h0, 28);
    wipe(e, 16, 24);
    cr_assert_eq(kvt_store_run(e->store, KVT_STORE_GET, q, 12, res, &count), KVT_OK);
    cr_assert_eq(count, 12u);
    cr_assert_eq(run_op(e->store, kvt_store_get, r2, 12).count, 12u);
    for (uint32_t i = 0; i < 12; i++) {
        cr_assert(check(e, h0 + i, 16 + i), "page %u, got on the caller's thread, differs", i);
        cr_assert(check(e, h0 + i, 28 + i), "page %u, got by a worker, differs", i);
    }
    kvt_store_page_t twice[2] = {q[0], q[1]};
    twice[1].page = twice[0].page;
    memset(res, 0xee, sizeof(res));
    cr_assert_eq(kvt_store_run(e->store, KVT_STORE_GET, twice, 2, res, &count), KVT_EINVAL);
    kvt_store_page_t out = {.hash = q[0].hash, .page = 1u << 30};
    cr_assert_eq(kvt_store_run(e->store, KVT_STORE_GET, &out, 1, res, &count), KVT_EINVAL);
    cr_assert_eq(kvt_store_run(e->store, KVT_STORE_GET, q, 1, NULL, &count), KVT_EINVAL);
    cr_assert_eq(kvt_store_run(e->store, KVT_STORE_OP_COUNT_, q, 1, res, &count), KVT_EINVAL);
    cr_assert_eq(res[0], 0xee, "a refused call wrote a result");
    cr_assert_eq(kvt_store_run(e->store, KVT_STORE_REMOVE, p, 3, res, &count), KVT_OK);
    cr_assert_eq(count, 3u);
    cr_assert_eq(run_op(e->store, kvt_store_exists, p, 16).count, 0u);
    cr_assert_eq(run_op(e->store, kvt_store_exists, p + 3, 9).count, 9u);
}

/* kvt_store_exists_leading on every sub-range of the n keys at p (stored[i]:
 * key i is in the store) against a plain scan for the first absent key and
 * against the workers' exists batch (its leading count); each call counted
 * as one exists call. */
static inline void exists_leading_matches(senv_t *e, const kvt_store_page_t *p, const bool *stored, size_t n) {
    uint64_t calls0 = sstats(e->store, KVT_STORE_EXISTS).calls;
    for (size_t from = 0; from < n; from++)
        for (size_t k = 1; from + k <= n; k++) {
            size_t want = 0;
            while (want < k && stored[from + want]) want++;
            size_t got = 99;
            cr_assert_eq(kvt_store_exists_leading(e->store, &p[from], k, &got), KVT_OK);
            cr_assert_eq(got, want, "keys %zu..%zu: %zu leading, a scan says %zu", from, from + k, got, want);
            cr_assert_eq(run_op(e->store, kvt_store_exists, &p[from], k).count, want);
        }
    cr_assert_eq(sstats(e->store, KVT_STORE_EXISTS).calls - calls0, (uint64_t)n * (n + 1), "each counted as one exists call");
}

/* Put n pages, get them back into other pages, byte for byte; exists and remove. */
static inline void roundtrip(senv_t *e, size_t n) {
    kvt_store_page_t p[MAXK], q[MAXK];
    pages_of(p, n, 1000, 0);
    pages_of(q, n, 1000, (uint32_t)n);
    fill(e, 1000, 0, n);
    wipe(e, (uint32_t)n, n);
    sres_t r = run_op(e->store, kvt_store_exists, p, n);
    cr_assert_eq(r.count, 0u);
    r = run_op(e->store, kvt_store_put, p, n);
    cr_assert_eq(r.status, KVT_OK);
    cr_assert_eq(r.count, n);
    r = run_op(e->store, kvt_store_exists, p, n);
    cr_assert_eq(r.count, n);
    r = run_op(e->store, kvt_store_get, q, n);
    cr_assert_eq(r.status, KVT_OK);
    cr_assert_eq(r.count, n);
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(r.r[i], KVT_STORE_OK);
        cr_assert(check(e, 1000 + i, (uint32_t)(n + i)), "page %zu differs from what was put", i);
    }
    kvt_store_stats_t st = sstats(e->store, KVT_STORE_GET);
    cr_assert_eq(st.hits, n);
    cr_assert_eq(st.bytes, n * kvt_store_object_bytes(e->store));
    /* remove the second half: exists counts the leading run */
    r = run_op(e->store, kvt_store_remove, p + n / 2, n - n / 2);
    cr_assert_eq(r.count, n - n / 2);
    r = run_op(e->store, kvt_store_exists, p, n);
    cr_assert_eq(r.count, n / 2);
    for (size_t i = 0; i < n; i++) cr_assert_eq(r.r[i], i < n / 2 ? KVT_STORE_OK : KVT_STORE_MISS);
    r = run_op(e->store, kvt_store_get, q, n);
    cr_assert_eq(r.count, n / 2);
    cr_assert_eq(r.status, KVT_OK);
    r = run_op(e->store, kvt_store_remove, p, n);
    cr_assert_eq(r.count, n / 2);
}

#endif
