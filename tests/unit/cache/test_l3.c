/* The cache's third tier.
 *
 * The oracle: with L2 and L3 written through (every committed page reaches
 * L2, then L3) and an L3 that never evicts, a request's hits over all three
 * tiers are exactly the longest prefix of it that any earlier request
 * committed, whatever L1 and L2 evicted meanwhile. The oracle keeps that set
 * of prefixes itself (XXH3 of the token prefix, not the cache's page hash).
 * The same holds for write_back to L3 (a page reaches L3 when L2 lets it go).
 * With a real dir store and a data plane, every page served is also checked
 * byte for byte. Then: two caches sharing a store, the prefetch policies on a
 * slow store, pages held while a store call is in flight, bad calls. */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "kvtier/cache.h"
#include "kvtier/error.h"
#include "kvtier/rng.h"
#include "kvtier/stats.h"
#include "kvtier/store.h"
#include "kvtier/testing.h"
#include "kvtier/tier.h"
#include "kvtier/xfer.h"
#include "cache/cache-int.h"

#define PT 4
#define MAXP 48
#define DOCS 6
#define DOCP 40

/* ---- the exact LRU set against a list ---------------------------------------------------- */

Test(l3, lru_against_a_list) {
    enum { CAP = 37, KEYS = 120 };
    kvt__lru_t l;
    cr_assert_eq(kvt__lru_init(&l, CAP), KVT_OK);
    uint64_t list[CAP]; /* most recent first */
    size_t n = 0;
    kvt_rng_t rng;
    kvt_rng_seed(&rng, 7);
    for (int step = 0; step < 200000; step++) {
        uint64_t key = kvt_rng_below(&rng, KEYS) * 0x9e3779b97f4a7c15ull, op = kvt_rng_below(&rng, 4);
        size_t at = n;
        for (size_t i = 0; i < n; i++)
            if (list[i] == key) at = i;
        bool present = at < n;
        cr_assert_eq(kvt__lru_has(&l, key), present);
        if (op == 0) { /* touch */
            cr_assert_eq(kvt__lru_touch(&l, key), present);
            if (present) memmove(list + 1, list, at * sizeof(uint64_t)), list[0] = key;
        } else if (op == 3) {
            cr_assert_eq(kvt__lru_remove(&l, key), present);
            if (present) memmove(list + at, list + at + 1, (--n - at) * sizeof(uint64_t));
        } else { /* put */
            bool evicts = !present && n == CAP;
            cr_assert_eq(kvt__lru_put(&l, key), evicts);
            if (present) memmove(list + 1, list, at * sizeof(uint64_t));
            else memmove(list + 1, list, (evicts ? n - 1 : n++) * sizeof(uint64_t));
            list[0] = key;
        }
        cr_assert_eq(l.n, n);
    }
    /* the list order is the set's order */
    size_t i = 0;
    for (uint32_t s = l.head; s != UINT32_MAX; s = l.next[s]) cr_assert_eq(l.key[s], list[i++]);
    cr_assert_eq(i, n);
    kvt__lru_fini(&l);
}

/* ---- requests and the oracle --------------------------------------------------------------- */

typedef struct gen {
    int32_t doc[DOCS][DOCP * PT];
    int32_t tok[64 * PT]; /* MAXP pages, or the 64 of the slow-store tests */
    uint64_t npages;
    int32_t next_token;
    kvt_rng_t rng;
} gen_t;

static void gen_init(gen_t *g, uint64_t seed) {
    kvt_rng_seed(&g->rng, seed);
    g->next_token = 1;
    for (int d = 0; d < DOCS; d++)
        for (int i = 0; i < DOCP * PT; i++) g->doc[d][i] = g->next_token++;
}

/* A document's prefix, then a few pages of its own. */
static void gen_next(gen_t *g) {
    int d = (int)kvt_rng_below(&g->rng, DOCS);
    uint64_t pre = 1 + kvt_rng_below(&g->rng, DOCP), own = kvt_rng_below(&g->rng, MAXP - DOCP + 1);
    memcpy(g->tok, g->doc[d], pre * PT * sizeof(int32_t));
    for (uint64_t i = pre * PT; i < (pre + own) * PT; i++) g->tok[i] = g->next_token++;
    g->npages = pre + own;
}

typedef struct oracle {
    uint64_t *set; /* XXH3 of committed token prefixes, open addressing */
    size_t cap;
} oracle_t;

static uint64_t prefix_key(const int32_t *tok, uint64_t pages) {
    return XXH3_64bits(tok, pages * PT * sizeof(int32_t)) | 1;
}

static bool oracle_has(const oracle_t *o, uint64_t k) {
    for (size_t i = k % o->cap; o->set[i]; i = (i + 1) % o->cap)
        if (o->set[i] == k) return true;
    return false;
}

static void oracle_add(oracle_t *o, const int32_t *tok, uint64_t pages) {
    for (uint64_t p = 1; p <= pages; p++) {
        uint64_t k = prefix_key(tok, p);
        if (oracle_has(o, k)) continue;
        size_t i = k % o->cap;
        while (o->set[i]) i = (i + 1) % o->cap;
        o->set[i] = k;
    }
}

static uint64_t oracle_prefix(const oracle_t *o, const int32_t *tok, uint64_t pages) {
    uint64_t p = 0;
    while (p < pages && oracle_has(o, prefix_key(tok, p + 1))) p++;
    return p;
}

static void small_config(kvt_cache_config_t *cfg) {
    kvt_cache_config_default(cfg);
    cfg->page_tokens = PT;
    cfg->l1_pages = 200;
    cfg->l2_pages = 120;
    cfg->policy = KVT_POLICY_LRU;
    cfg->prefetch_threshold = 0;
    cfg->l3_write_policy = KVT_WRITE_THROUGH; /* every committed page reaches the store: the oracle's premise */
}

static void check(kvt_cache_t *c) {
    const char *why = NULL;
    cr_assert_eq(kvt_cache_check(c, &why), KVT_OK, "%s", why ? why : "");
}

/* One request through prefetch, admission, commit, release; the hits. */
static uint64_t one_request(kvt_cache_t *c, gen_t *g, kvt_cache_req_t *req, uint32_t *l1_ids) {
    uint64_t id;
    cr_assert_eq(kvt_cache_prefetch(c, 0, g->tok, g->npages * PT, &id), KVT_OK);
    cr_assert_eq(kvt_cache_admit_prefetched(c, id, 0, g->tok, g->npages * PT, 0, l1_ids, req), KVT_OK);
    return req->l1_hit_pages + req->l2_hit_pages + req->l3_hit_pages;
}

static void oracle_run(kvt_write_policy_t l3_policy) {
    kvt_cache_config_t cfg;
    small_config(&cfg);
    cfg.l3_pages = 1u << 20; /* never evicts */
    cfg.l3_write_policy = l3_policy;
    kvt_cache_t *c;
    cr_assert_eq(kvt_cache_create(&c, &cfg), KVT_OK);
    oracle_t o = {calloc(1 << 16, sizeof(uint64_t)), 1 << 16};
    gen_t g;
    gen_init(&g, 11 + l3_policy);
    uint64_t l3 = 0;
    for (int r = 0; r < 3000; r++) {
        gen_next(&g);
        kvt_cache_req_t req;
        uint64_t hits = one_request(c, &g, &req, NULL), want = oracle_prefix(&o, g.tok, g.npages);
        cr_assert_eq(hits, want, "request %d: %" PRIu64 " pages hit (L1 %" PRIu64 ", L2 %" PRIu64 ", L3 %" PRIu64
                                 "), the oracle says %" PRIu64, r, hits, req.l1_hit_pages, req.l2_hit_pages, req.l3_hit_pages, want);
        cr_assert_eq(req.pages, g.npages, "L1 is big enough for every request");
        l3 += req.l3_hit_pages;
        kvt_cache_release(c, &req);
        oracle_add(&o, g.tok, req.pages);
        if (r % 97 == 0) check(c);
    }
    check(c);
    kvt_cache_stats_t st = {.size = sizeof(st)};
    kvt_cache_stats(c, &st);
    cr_assert_gt(l3, 1000, "the run must reach L3 often (%" PRIu64 " pages)", l3);
    cr_assert_eq(st.l3_hit_tokens, l3 * PT);
    cr_assert_eq(st.l3_foreign_hit_tokens, 0, "the model has one writer");
    cr_assert_gt(st.l2_evicted_pages, 1000, "L2 must evict for L3 to matter");
    if (l3_policy == KVT_WRITE_BACK) /* a page goes to L3 only as it leaves L2 */
        cr_assert_leq(st.l3_puts, st.l2_evicted_pages);
    free(o.set);
    kvt_cache_destroy(c);
}

Test(l3, model_hits_are_the_committed_prefix_write_through) { oracle_run(KVT_WRITE_THROUGH); }
Test(l3, model_hits_are_the_committed_prefix_write_back) { oracle_run(KVT_WRITE_BACK); }

Test(l3, model_selective_puts_only_hit_nodes) {
    kvt_cache_config_t cfg;
    small_config(&cfg);
    cfg.l3_pages = 1u << 20;
    cfg.l3_write_policy = KVT_WRITE_THROUGH_SELECTIVE;
    cfg.l3_write_hits = 3;
    kvt_cache_t *c;
    cr_assert_eq(kvt_cache_create(&c, &cfg), KVT_OK);
    oracle_t o = {calloc(1 << 16, sizeof(uint64_t)), 1 << 16};
    gen_t g;
    gen_init(&g, 5);
    uint64_t l3 = 0;
    for (int r = 0; r < 2000; r++) {
        gen_next(&g);
        kvt_cache_req_t req;
        uint64_t hits = one_request(c, &g, &req, NULL);
        cr_assert_leq(hits, oracle_prefix(&o, g.tok, g.npages), "request %d: more hits than ever committed", r);
        l3 += req.l3_hit_pages;
        kvt_cache_release(c, &req);
        oracle_add(&o, g.tok, req.pages);
    }
    check(c);
    kvt_cache_stats_t st = {.size = sizeof(st)};
    kvt_cache_stats(c, &st);
    cr_assert_gt(l3, 0);
    /* the requests' own pages (never matched again) never reach L3: fewer puts than pages committed */
    cr_assert_lt(st.l3_puts, st.backups);
    free(o.set);
    kvt_cache_destroy(c);
}

/* ---- a real store: dir, with bytes -------------------------------------------------------------- */

typedef struct denv {
    kvt_tier_t *tier[2];
    kvt_xfer_t *xf;
    kvt_store_t *store;
    kvt_cache_t *c;
    uint8_t buf[256];
} denv_t;

static char root_dir[64];

static void rm_root(void) {
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", root_dir);
    cr_assert_eq(system(cmd), 0);
}

/* A directory of this test's own: a name from the process id could be one a
 * failed test left behind (ids wrap at 32768 on many machines). */
static void setup_root(void) {
    snprintf(root_dir, sizeof(root_dir), "/tmp/kvt-l3-XXXXXX");
    cr_assert_not_null(mkdtemp(root_dir), "mkdtemp: %s", strerror(errno));
}

static void quiet(void *arg, const char *msg) { (void)arg, (void)msg; }

static void denv_open(denv_t *e, const kvt_cache_config_t *cfg, uint32_t delay_us) {
    memset(e, 0, sizeof(*e));
    kvt_tier_config_t tc = {.size = sizeof(tc), .kind = KVT_TIER_ARENA, .geom = {cfg->l1_pages, 1, sizeof(e->buf), KVT_LAYOUT_PAGE_FIRST}};
    cr_assert_eq(kvt_tier_create(&e->tier[0], &tc), KVT_OK);
    tc.kind = KVT_TIER_HOST;
    tc.geom.pages = cfg->l2_pages;
    cr_assert_eq(kvt_tier_create(&e->tier[1], &tc), KVT_OK);
    kvt_xfer_config_t xc;
    kvt_xfer_config_default(&xc);
    xc.threads = 1;
    cr_assert_eq(kvt_xfer_create(&e->xf, &xc, e->tier, 2), KVT_OK);
    kvt_store_config_t sc;
    kvt_store_config_default(&sc);
    sc.tier = e->tier[1];
    sc.model = "l3-test";
    sc.page_tokens = PT;
    sc.log = quiet;
    char url[128];
    snprintf(url, sizeof(url), "dir:%s", root_dir);
    cr_assert_eq(kvt_store_open(&e->store, url, &sc), KVT_OK, "%s", kvt_store_last_error(NULL));
    cr_assert_eq(kvt_store_set_delay(e->store, delay_us), KVT_OK);
    cr_assert_eq(kvt_cache_create(&e->c, cfg), KVT_OK);
    /* indices that name the other tier, or none, are refused (copies would move L2's bytes over L1), changing nothing */
    cr_assert_eq(kvt_cache_attach(e->c, e->xf, e->tier[0], 1, e->tier[1], 0), KVT_EINVAL);
    cr_assert_eq(kvt_cache_attach(e->c, e->xf, e->tier[0], 0, e->tier[1], 5), KVT_EINVAL);
    cr_assert_eq(kvt_cache_attach(e->c, e->xf, e->tier[0], 0, e->tier[1], 1), KVT_OK);
    cr_assert_eq(kvt_cache_attach_store(e->c, e->store), KVT_OK);
}

static void denv_close(denv_t *e) {
    kvt_cache_destroy(e->c);
    kvt_store_close(e->store);
    kvt_xfer_destroy(e->xf);
    kvt_tier_destroy(e->tier[0]);
    kvt_tier_destroy(e->tier[1]);
}

/* A data plane whose L2 is not the attached store's tier is refused (the
 * store put its own tier's bytes, not those the backups wrote: wrong KV in
 * L3, served to every instance), as is one beside a modeled L3 (its hits
 * loaded pages no one had fetched); nothing changes, the right one attaches. */
Test(l3, a_data_plane_must_agree_with_the_l3) {
    setup_root();
    kvt_cache_config_t cfg;
    small_config(&cfg);
    denv_t e;
    memset(&e, 0, sizeof(e));
    kvt_tier_config_t tc = {.size = sizeof(tc), .kind = KVT_TIER_ARENA, .geom = {cfg.l1_pages, 1, 64, KVT_LAYOUT_PAGE_FIRST}};
    kvt_tier_t *t[3];
    cr_assert_eq(kvt_tier_create(&t[0], &tc), KVT_OK);
    tc.kind = KVT_TIER_HOST;
    tc.geom.pages = cfg.l2_pages;
    cr_assert_eq(kvt_tier_create(&t[1], &tc), KVT_OK);
    cr_assert_eq(kvt_tier_create(&t[2], &tc), KVT_OK);
    kvt_xfer_config_t xc;
    kvt_xfer_config_default(&xc);
    xc.threads = 1;
    cr_assert_eq(kvt_xfer_create(&e.xf, &xc, t, 3), KVT_OK);
    kvt_store_config_t sc;
    kvt_store_config_default(&sc);
    sc.tier = t[1];
    sc.model = "l3-test";
    sc.page_tokens = PT;
    sc.log = quiet;
    char url[128];
    snprintf(url, sizeof(url), "dir:%s", root_dir);
    cr_assert_eq(kvt_store_open(&e.store, url, &sc), KVT_OK, "%s", kvt_store_last_error(NULL));
    cr_assert_eq(kvt_cache_create(&e.c, &cfg), KVT_OK);
    cr_assert_eq(kvt_cache_attach_store(e.c, e.store), KVT_OK);
    cr_assert_eq(kvt_cache_attach(e.c, e.xf, t[0], 0, t[2], 2), KVT_EINVAL, "L2 is not the store's tier");
    cr_assert_eq(kvt_cache_attach(e.c, e.xf, t[0], 0, t[1], 1), KVT_OK, "the failed attach changed nothing");
    kvt_cache_destroy(e.c);
    cfg.l3_pages = 1000;
    cr_assert_eq(kvt_cache_create(&e.c, &cfg), KVT_OK);
    cr_assert_eq(kvt_cache_attach(e.c, e.xf, t[0], 0, t[1], 1), KVT_EINVAL, "a modeled L3 holds no bytes");
    kvt_cache_destroy(e.c);
    kvt_store_close(e.store);
    kvt_xfer_destroy(e.xf);
    for (int i = 0; i < 3; i++) kvt_tier_destroy(t[i]);
    rm_root();
}

/* Fills the new pages, checks the old ones; the number of mismatches. */
static uint64_t forward(denv_t *e, const gen_t *g, const kvt_cache_req_t *req, const uint32_t *l1_ids) {
    kvt_hash128_t h[64];
    kvt_page_hash_chain(0, g->tok, req->pages, PT, h);
    uint64_t old = req->pages - req->new_pages, bad = 0;
    for (uint64_t j = 0; j < old; j++) bad += !kvt_tier_pattern_check(e->tier[0], l1_ids[j], h[j].lo, h[j].hi, e->buf);
    for (uint64_t j = old; j < req->pages; j++) kvt_tier_pattern_fill(e->tier[0], l1_ids[j], h[j].lo, h[j].hi, e->buf);
    return bad;
}

static void dir_run(bool sync_each) {
    setup_root();
    kvt_cache_config_t cfg;
    small_config(&cfg);
    cfg.prefetch_policy = KVT_PREFETCH_WAIT_COMPLETE;
    denv_t e;
    denv_open(&e, &cfg, 0);
    oracle_t o = {calloc(1 << 16, sizeof(uint64_t)), 1 << 16};
    gen_t g;
    gen_init(&g, 3);
    uint64_t l3 = 0, bad = 0;
    uint32_t l1_ids[MAXP];
    for (int r = 0; r < 800; r++) {
        gen_next(&g);
        kvt_cache_req_t req;
        uint64_t hits = one_request(e.c, &g, &req, l1_ids), want = oracle_prefix(&o, g.tok, g.npages);
        if (sync_each) cr_assert_eq(hits, want, "request %d: %" PRIu64 " pages hit, the oracle says %" PRIu64, r, hits, want);
        else cr_assert_leq(hits, want, "request %d", r);
        bad += forward(&e, &g, &req, l1_ids);
        l3 += req.l3_hit_pages;
        kvt_cache_release(e.c, &req);
        oracle_add(&o, g.tok, req.pages);
        if (sync_each) kvt_cache_sync(e.c); /* every put answered: L3 holds every committed page */
        if (r % 53 == 0) check(e.c);
    }
    kvt_cache_sync(e.c);
    check(e.c);
    cr_assert_eq(bad, 0, "%" PRIu64 " pages served with the wrong bytes", bad);
    cr_assert_gt(l3, 200, "%" PRIu64 " L3 pages", l3);
    kvt_store_stats_t ss = {.size = sizeof(ss)};
    kvt_store_stats(e.store, KVT_STORE_GET, &ss);
    cr_assert_eq(ss.bad_objects, 0);
    free(o.set);
    denv_close(&e);
    rm_root();
}

Test(l3, dir_store_hits_are_the_committed_prefix_and_bytes_match) { dir_run(true); }
Test(l3, dir_store_without_waiting_for_puts_never_serves_wrong_bytes) { dir_run(false); }

Test(l3, two_caches_share_one_store) {
    setup_root();
    kvt_cache_config_t cfg;
    small_config(&cfg);
    cfg.prefetch_policy = KVT_PREFETCH_WAIT_COMPLETE;
    denv_t a, b;
    denv_open(&a, &cfg, 0);
    denv_open(&b, &cfg, 0);
    gen_t ga, gb;
    gen_init(&ga, 9);
    gen_init(&gb, 9); /* the same requests */
    uint32_t l1_ids[MAXP];
    uint64_t bad = 0;
    for (int r = 0; r < 60; r++) { /* a first: every page it commits reaches the store */
        gen_next(&ga);
        kvt_cache_req_t req;
        one_request(a.c, &ga, &req, l1_ids);
        bad += forward(&a, &ga, &req, l1_ids);
        kvt_cache_release(a.c, &req);
    }
    kvt_cache_sync(a.c);
    gen_next(&gb);
    kvt_cache_req_t req;
    one_request(b.c, &gb, &req, l1_ids); /* b's first request: all but what it never saw comes from a's pages */
    cr_assert_eq(req.l1_hit_pages + req.l2_hit_pages, 0);
    cr_assert_eq(req.l3_hit_pages, gb.npages, "a committed all of it");
    cr_assert_eq(req.l3_foreign_pages, req.l3_hit_pages, "b put none of it");
    bad += forward(&b, &gb, &req, l1_ids);
    kvt_cache_release(b.c, &req);
    cr_assert_eq(bad, 0);
    kvt_cache_stats_t st = {.size = sizeof(st)};
    kvt_cache_stats(b.c, &st);
    cr_assert_eq(st.l3_foreign_hit_tokens, gb.npages * PT);
    cr_assert_eq(st.l3_exists_calls, 1, "b knew none of it: one exists call");
    denv_close(&a);
    denv_close(&b);
    rm_root();
}

/* The store holds the npages pages of tok (put by a cache of its own). */
static void store_holds(const kvt_cache_config_t *cfg, const int32_t *tok, uint64_t npages) {
    gen_t g;
    gen_init(&g, 1);
    memcpy(g.tok, tok, npages * PT * sizeof(int32_t));
    g.npages = npages;
    denv_t w;
    denv_open(&w, cfg, 0);
    uint32_t l1_ids[64];
    kvt_cache_req_t req;
    cr_assert_eq(kvt_cache_admit(w.c, 0, tok, npages * PT, 0, l1_ids, &req), KVT_OK);
    cr_assert_eq(forward(&w, &g, &req, l1_ids), 0);
    kvt_cache_release(w.c, &req);
    kvt_cache_sync(w.c);
    denv_close(&w);
}

/* ---- prefetch policies on a slow store --------------------------------------------------------- */

/* Fills the store with one request of 64 pages, then admits it in a fresh
 * cache under `policy` against a store that takes delay_us a batch. */
static void slow_prefetch(kvt_prefetch_policy_t policy, double timeout_s, uint32_t delay_us, kvt_cache_req_t *out,
                          kvt_cache_stats_t *st) {
    kvt_cache_config_t cfg;
    small_config(&cfg);
    cfg.l1_pages = 160;
    cfg.l2_pages = 160;
    gen_t g;
    gen_init(&g, 1);
    int32_t tok[64 * PT];
    for (int i = 0; i < 64 * PT; i++) tok[i] = 1000000 + i;
    memcpy(g.tok, tok, sizeof(tok));
    g.npages = 64;
    store_holds(&cfg, tok, 64);
    cfg.prefetch_policy = policy;
    cfg.prefetch_timeout_s = timeout_s;
    cfg.prefetch_timeout_per_1024_s = 0;
    denv_t e;
    denv_open(&e, &cfg, delay_us);
    uint64_t id;
    uint32_t l1_ids[64];
    cr_assert_eq(kvt_cache_prefetch(e.c, 0, tok, 64 * PT, &id), KVT_OK);
    cr_assert_neq(id, 0);
    cr_assert_eq(kvt_cache_admit_prefetched(e.c, id, 0, tok, 64 * PT, 0, l1_ids, out), KVT_OK);
    check(e.c); /* pages still being fetched are held, deferred */
    cr_assert_eq(forward(&e, &g, out, l1_ids), 0);
    kvt_cache_release(e.c, out);
    kvt_cache_sync(e.c);
    check(e.c);
    st->size = sizeof(*st);
    kvt_cache_stats(e.c, st);
    cr_assert_eq(e.c->l3.l2_deferred, 0, "every page a store call held came back");
    denv_close(&e);
}

Test(l3, prefetch_policies_on_a_slow_store) {
    setup_root();
    kvt_cache_req_t be, wc, to;
    kvt_cache_stats_t sbe, swc, sto;
    slow_prefetch(KVT_PREFETCH_BEST_EFFORT, 0, 100000, &be, &sbe);
    slow_prefetch(KVT_PREFETCH_WAIT_COMPLETE, 0, 100000, &wc, &swc);
    slow_prefetch(KVT_PREFETCH_TIMEOUT, 0.05, 100000, &to, &sto);
    /* best_effort: an exists and two gets of 100 ms each are not back at once: nothing used (had it
     * waited, the pages would have arrived: the outcome says it did not, with no bound on the clock) */
    cr_assert_eq(be.prefetch, KVT_PREFETCH_REVOKED);
    cr_assert_eq(be.l3_hit_pages, 0);
    /* wait_complete: all of it, after at least the exists and one get */
    cr_assert_eq(wc.prefetch, KVT_PREFETCH_COMPLETE);
    cr_assert_eq(wc.l3_hit_pages, 64);
    cr_assert_geq(wc.prefetch_wait_ns, 150000000ull);
    cr_assert_eq(swc.prefetch_arrived_pages, 64);
    /* timeout at 50 ms: the wait ends at the deadline, not before; that it ends there and not when the
     * pages arrive (300 ms on) is the outcome: timed out, nothing used */
    cr_assert_eq(to.prefetch, KVT_PREFETCH_TIMED_OUT);
    cr_assert_eq(to.l3_hit_pages, 0);
    cr_assert_geq(to.prefetch_wait_ns, 45000000ull);
    cr_assert_geq(wc.l3_hit_pages, be.l3_hit_pages);
    cr_assert_eq(sto.prefetch_timed_out, 1);
    cr_assert_eq(sbe.prefetch_revoked, 1);
    rm_root();
}

/* admit_prefetched with tokens other than the prefetch's is refused at
 * once, the prefetch left as it was: tokens that differ past the match
 * before any page arrived (they were taken, the prefetch consumed), and
 * tokens that differ inside the match it followed (read past its hashes),
 * neither after waiting for the store. Then the right tokens get it all. */
Test(l3, a_prefetch_is_finished_only_with_its_own_tokens) {
    setup_root();
    kvt_cache_config_t cfg;
    small_config(&cfg);
    cfg.prefetch_policy = KVT_PREFETCH_WAIT_COMPLETE;
    int32_t tok[32 * PT], other[32 * PT];
    for (int i = 0; i < 32 * PT; i++) tok[i] = 7000 + i;
    store_holds(&cfg, tok, 32);
    denv_t e;
    denv_open(&e, &cfg, 200000);
    kvt_cache_req_t req;
    cr_assert_eq(kvt_cache_admit(e.c, 0, tok, 8 * PT, 0, NULL, &req), KVT_OK); /* the first 8 pages cached */
    cr_assert_eq(kvt_cache_release(e.c, &req), KVT_OK);
    uint64_t id;
    cr_assert_eq(kvt_cache_prefetch(e.c, 0, tok, 32 * PT, &id), KVT_OK);
    cr_assert_neq(id, 0);
    const int differ[2] = {20, 2}; /* a page past the match; one inside it */
    for (int k = 0; k < 2; k++) {
        memcpy(other, tok, sizeof(tok));
        other[differ[k] * PT + 1] = -1;
        uint64_t t0 = kvt_now_ns();
        cr_assert_eq(kvt_cache_admit_prefetched(e.c, id, 0, other, 32 * PT, 0, NULL, &req), KVT_EINVAL,
                     "page %d differs", differ[k]);
        cr_assert_lt(kvt_now_ns() - t0, 150000000ull, "refused before waiting for the store (200 ms)");
        cr_assert_eq(kvt_cache_prefetches(e.c), 1, "the prefetch stays");
        check(e.c);
    }
    cr_assert_eq(kvt_cache_admit_prefetched(e.c, id, 0, tok, 32 * PT, 0, NULL, &req), KVT_OK);
    cr_assert_eq(req.prefetch, KVT_PREFETCH_COMPLETE);
    cr_assert_eq(req.l3_hit_pages, 24);
    cr_assert_eq(kvt_cache_release(e.c, &req), KVT_OK);
    check(e.c);
    denv_close(&e);
    rm_root();
}

Test(l3, cancel_holds_pages_until_the_store_answers) {
    setup_root();
    kvt_cache_config_t cfg;
    small_config(&cfg);
    int32_t tok[32 * PT];
    for (int i = 0; i < 32 * PT; i++) tok[i] = 5000 + i;
    store_holds(&cfg, tok, 32);
    denv_t e;
    denv_open(&e, &cfg, 200000);
    uint64_t id;
    cr_assert_eq(kvt_cache_prefetch(e.c, 0, tok, 32 * PT, &id), KVT_OK);
    /* wait until the exists is answered and the get is out */
    for (int i = 0; i < 100 && e.c->l2_free == cfg.l2_pages; i++) {
        usleep(10000);
        kvt_cache_poll(e.c);
    }
    cr_assert_eq(e.c->l2_free, cfg.l2_pages - 32, "the prefetch took L2 pages for the get");
    cr_assert_eq(kvt_cache_prefetch_cancel(e.c, id), KVT_OK);
    cr_assert_eq(kvt_cache_prefetch_cancel(e.c, id), KVT_EINVAL);
    cr_assert_eq(e.c->l3.l2_deferred, 32, "the get still writes them: they wait for its answer");
    check(e.c);
    kvt_extalloc_stats_t es = {.size = sizeof(es)};
    kvt_extalloc_stats(e.c->l2, &es);
    cr_assert_eq(es.free_pages, cfg.l2_pages - 32, "not back in the allocator yet");
    kvt_cache_sync(e.c);
    cr_assert_eq(e.c->l3.l2_deferred, 0);
    kvt_extalloc_stats(e.c->l2, &es);
    cr_assert_eq(es.free_pages, cfg.l2_pages);
    check(e.c);
    denv_close(&e);
    rm_root();
}

/* A cache whose L2 (130 pages) holds the 120 pages of a request b, none of
 * them put yet (write_back into L3), on a store that takes 20 ms a batch:
 * the puts are still out when a prefetch asks for room. */
static void full_l2_open(denv_t *e, kvt_cache_config_t *cfg, kvt_prefetch_policy_t policy) {
    int32_t b[120 * PT];
    for (int i = 0; i < 120 * PT; i++) b[i] = 900000 + i;
    cfg->l3_write_policy = KVT_WRITE_BACK;
    cfg->prefetch_policy = policy;
    denv_open(e, cfg, 20000);
    kvt_cache_req_t req;
    cr_assert_eq(kvt_cache_admit(e->c, 0, b, 120 * PT, 0, NULL, &req), KVT_OK);
    kvt_cache_release(e->c, &req);
    kvt_cache_sync(e->c);
    kvt_cache_stats_t st = {.size = sizeof(st)};
    kvt_cache_stats(e->c, &st);
    cr_assert_eq(st.l3_puts, 0);
}

static void room_config(kvt_cache_config_t *cfg) {
    small_config(cfg);
    cfg->l1_pages = 160;
    cfg->l2_pages = 130; /* a prefetch takes at most half */
}

/* Admits the prefetch of tok's npages pages, checks the bytes of what
 * came; the L3 hit pages. */
static uint64_t admit_checked(denv_t *e, uint64_t id, const int32_t *tok, uint64_t npages, kvt_cache_req_t *req) {
    gen_t g;
    gen_init(&g, 1);
    memcpy(g.tok, tok, npages * PT * sizeof(int32_t));
    g.npages = npages;
    uint32_t l1_ids[64];
    cr_assert_eq(kvt_cache_admit_prefetched(e->c, id, 0, tok, npages * PT, 0, l1_ids, req), KVT_OK);
    cr_assert_eq(req->prefetch, KVT_PREFETCH_COMPLETE);
    cr_assert_eq(forward(e, &g, req, l1_ids), 0);
    check(e->c);
    return req->l3_hit_pages;
}

/* Under write_back into L3, the room a prefetch makes in a full L2 is pages
 * whose puts are in flight: they come back when the store answers, and the
 * prefetch takes them then. Waiting for it (wait_complete) gets every page
 * the store has, as with the model, where a put lands at once. */
Test(l3, a_prefetch_gets_the_room_its_evictions_free_once_their_puts_land) {
    setup_root();
    kvt_cache_config_t cfg;
    room_config(&cfg);
    int32_t a[64 * PT];
    for (int i = 0; i < 64 * PT; i++) a[i] = 7000 + i;
    store_holds(&cfg, a, 64);
    denv_t e;
    full_l2_open(&e, &cfg, KVT_PREFETCH_WAIT_COMPLETE);
    uint64_t id;
    kvt_cache_req_t req;
    cr_assert_eq(kvt_cache_prefetch(e.c, 0, a, 64 * PT, &id), KVT_OK);
    uint64_t hit = admit_checked(&e, id, a, 64, &req);
    cr_assert_eq(hit, 64, "%" PRIu64 " of the 64 pages the store has", hit);
    kvt_cache_release(e.c, &req);
    kvt_cache_sync(e.c);
    check(e.c);
    kvt_cache_stats_t st = {.size = sizeof(st)};
    kvt_cache_stats(e.c, &st);
    cr_assert_geq(st.l3_puts, 54, "the room was b's pages, put on their way out");
    cr_assert_eq(st.prefetch_pages, 64);
    cr_assert_eq(e.c->l3.l2_deferred, 0);
    denv_close(&e);
    rm_root();
}

/* Three prefetches short of room at once (each may take half of L2, so it
 * takes three to want more than L2 has), run until the store has answered
 * everything, then admitted oldest first. The two the room goes to first
 * (order[0], order[1]: 0 is the oldest) get all they asked for; the last
 * takes the rest and, once no page is behind a put any more and L2 has no
 * more to give (the others hold theirs), stops there: complete, short. */
enum { SHORT_N = 48 };

static void three_short_of_room(kvt_prefetch_policy_t policy, const int order[3]) {
    setup_root();
    kvt_cache_config_t cfg;
    room_config(&cfg);
    int32_t a[3][SHORT_N * PT];
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < SHORT_N * PT; i++) a[k][i] = 100000 * (k + 1) + i;
        store_holds(&cfg, a[k], SHORT_N);
    }
    denv_t e;
    full_l2_open(&e, &cfg, policy);
    uint64_t id[3];
    for (int k = 0; k < 3; k++) cr_assert_eq(kvt_cache_prefetch(e.c, 0, a[k], SHORT_N * PT, &id[k]), KVT_OK);
    for (int i = 0; i < 5000 && (e.c->l3.l2_deferred || e.c->l3.calls || e.c->l3.nq); i++) {
        usleep(2000);
        kvt_cache_poll(e.c); /* answers; then the prefetches take what came back */
    }
    cr_assert_eq(e.c->l3.calls, 0, "the store answered everything");
    check(e.c);
    kvt_cache_req_t r[3];
    uint64_t h[3];
    for (int k = 0; k < 3; k++) h[k] = admit_checked(&e, id[k], a[k], SHORT_N, &r[k]);
    cr_assert_eq(h[order[0]], SHORT_N, "prefetch %d, served first, got %" PRIu64 " of %d", order[0], h[order[0]], SHORT_N);
    cr_assert_eq(h[order[1]], SHORT_N, "prefetch %d, served next, got %" PRIu64 " of %d", order[1], h[order[1]], SHORT_N);
    cr_assert(h[order[2]] > 0 && h[order[2]] < SHORT_N, "prefetch %d, served last, got %" PRIu64, order[2], h[order[2]]);
    uint64_t sum = h[0] + h[1] + h[2];
    cr_assert_lt(sum, 3 * SHORT_N, "130 L2 pages cannot hold all three");
    kvt_cache_stats_t st = {.size = sizeof(st)};
    kvt_cache_stats(e.c, &st);
    cr_assert_eq(st.prefetch_pages, sum, "what each took is what it served");
    cr_assert_eq(st.prefetch_complete, 3);
    cr_assert_geq(st.l3_puts, sum - 10, "their room was b's pages, behind puts");
    for (int k = 0; k < 3; k++) kvt_cache_release(e.c, &r[k]);
    kvt_cache_sync(e.c);
    check(e.c);
    cr_assert_eq(e.c->l3.l2_deferred, 0);
    denv_close(&e);
    rm_root();
}

/* wait_complete: the oldest first (its request is admitted next and waits). */
Test(l3, under_wait_complete_the_room_goes_to_the_oldest_prefetch_first) {
    three_short_of_room(KVT_PREFETCH_WAIT_COMPLETE, (int[]){0, 1, 2});
}

/* best_effort: the youngest first (the head is admitted before a get
 * started now could land; the younger ones have the lead time). */
Test(l3, under_best_effort_the_room_goes_to_the_youngest_prefetch_first) {
    three_short_of_room(KVT_PREFETCH_BEST_EFFORT, (int[]){2, 1, 0});
}

Test(l3, bad_calls_change_nothing) {
    kvt_cache_config_t cfg;
    small_config(&cfg);
    kvt_cache_t *c;
    cfg.l3_pages = 100;
    cfg.l2_pages = 0;
    cr_assert_eq(kvt_cache_create(&c, &cfg), KVT_EINVAL, "a modeled L3 needs L2");
    small_config(&cfg);
    cfg.prefetch_policy = (kvt_prefetch_policy_t)3;
    cr_assert_eq(kvt_cache_create(&c, &cfg), KVT_EINVAL);
    small_config(&cfg);
    cfg.prefetch_timeout_s = -1;
    cr_assert_eq(kvt_cache_create(&c, &cfg), KVT_EINVAL);
    small_config(&cfg);
    cfg.l3_pages = 1000;
    cr_assert_eq(kvt_cache_create(&c, &cfg), KVT_OK);
    int32_t tok[8 * PT];
    for (int i = 0; i < 8 * PT; i++) tok[i] = i + 1;
    kvt_cache_req_t req;
    cr_assert_eq(kvt_cache_admit_prefetched(c, 42, 0, tok, 8 * PT, 0, NULL, &req), KVT_EINVAL, "no such prefetch");
    cr_assert_eq(kvt_cache_prefetch_cancel(c, 42), KVT_EINVAL);
    kvt_cache_stats_t st = {.size = sizeof(st)};
    kvt_cache_stats(c, &st);
    cr_assert_eq(st.requests, 0);
    uint64_t id;
    cr_assert_eq(kvt_cache_prefetch(c, 0, tok, 8 * PT, &id), KVT_OK);
    cr_assert_eq(id, 0, "L3 is empty: nothing to prefetch");
    cr_assert_eq(kvt_cache_admit(c, 0, tok, 8 * PT, 0, NULL, &req), KVT_OK);
    kvt_cache_release(c, &req);
    /* a store may not be attached beside the model */
    kvt_tier_config_t tc = {.size = sizeof(tc), .kind = KVT_TIER_HOST, .geom = {cfg.l2_pages, 1, 64, KVT_LAYOUT_PAGE_FIRST}};
    kvt_tier_t *t;
    cr_assert_eq(kvt_tier_create(&t, &tc), KVT_OK);
    setup_root();
    kvt_store_config_t sc;
    kvt_store_config_default(&sc);
    sc.tier = t;
    sc.model = "x";
    sc.page_tokens = PT;
    char url[128];
    snprintf(url, sizeof(url), "dir:%s", root_dir);
    kvt_store_t *s;
    cr_assert_eq(kvt_store_open(&s, url, &sc), KVT_OK);
    cr_assert_eq(kvt_cache_attach_store(c, s), KVT_EINVAL);
    kvt_cache_destroy(c);
    small_config(&cfg);
    cfg.l2_pages = 2 * cfg.l2_pages; /* more L2 than the store's tier has */
    cr_assert_eq(kvt_cache_create(&c, &cfg), KVT_OK);
    cr_assert_eq(kvt_cache_attach_store(c, s), KVT_EINVAL);
    kvt_cache_destroy(c);
    kvt_store_close(s);
    kvt_tier_destroy(t);
    rm_root();
}
