/* The cache: tiers, admission, planned eviction, copies.
 *
 * One concept a file:
 *
 *   cache.c   configuration, create/destroy, statistics and check()
 *   admit.c   a request's life: match and lock, reserve, load, insert,
 *             fill the result; commit, release
 *   evict.c   planned eviction of L1 and L2 against their free-room
 *             targets, backups made to evict, corrupt L2 copies
 *   copies.c  copies as operations: queued, handed to the transfer engine,
 *             completed on this thread by kvt_cache_poll; pages going back
 *             to their allocators; the decision digest
 *
 * Only the caller's thread touches the tree (include/kvtier/cache.h says
 * which calls are whose); transfer workers never do.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache-int.h"
#include "kvtier/error.h"
#include "../core/check-int.h"
#include "../core/abi-int.h"
#include "../core/mem-int.h"


void kvt_cache_config_default(kvt_cache_config_t *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->size = sizeof(*cfg);
    cfg->page_tokens = 16;
    cfg->l1_pages = 65536;
    cfg->l2_pages = 262144;
    cfg->l1_lanes = 1;
    cfg->l1_free_room = 0.05;
    cfg->l2_free_room = 0.05;
    cfg->policy = KVT_POLICY_DEFAULT;
    cfg->write_policy = KVT_WRITE_THROUGH;
    cfg->write_through_hits = 2;
    cfg->l3_write_policy = KVT_WRITE_BACK; /* L3 as the victim tier of L2: least store traffic */
    cfg->l3_write_hits = 2;
    cfg->prefetch_policy = KVT_PREFETCH_BEST_EFFORT;
    cfg->prefetch_threshold = 256;
    cfg->prefetch_timeout_s = 2.0;
    cfg->prefetch_timeout_per_1024_s = 0.1;
    cfg->prefetch_timeout_max_s = 30.0;
}

/* A wait in seconds: finite, in [0, 1 day]. */
static bool seconds_ok(double s) { return s >= 0 && s <= 86400; }

/* ---- id buffers -------------------------------------------------------------- */

static int idbuf_init(kvt__idbuf_t *b, uint64_t cap) {
    b->n = 0;
    b->cap = cap ? cap : 1;
    b->id = kvt__malloc(b->cap * sizeof(uint32_t));
    return b->id ? KVT_OK : KVT_ENOMEM;
}

static void idbuf_fini(kvt__idbuf_t *b) {
    kvt__free(b->id, b->cap * sizeof(uint32_t));
    b->id = NULL;
}


/* ---- create / destroy ------------------------------------------------------------ */

/* The first field of cfg (a full-size config) out of range, with its range; NULL when none is. */
static const char *config_refused(const kvt_cache_config_t *cfg) {
    return cfg->page_tokens == 0 || cfg->page_tokens > (1u << 20)            ? "page_tokens: 1 to 2^20"
           : cfg->l1_pages == 0 || cfg->l1_pages > KVT_ALLOC_MAX_PAGES        ? "l1_pages: 1 to 2^32-1"
           : cfg->l2_pages > KVT_ALLOC_MAX_PAGES                              ? "l2_pages: 0 to 2^32-1"
           : cfg->l1_lanes == 0 || cfg->l1_lanes > cfg->l1_pages              ? "l1_lanes: 1 to l1_pages"
           : !(cfg->l1_free_room >= 0 && cfg->l1_free_room <= 0.5)            ? "l1_free_room: 0 to 0.5"
           : !(cfg->l2_free_room >= 0 && cfg->l2_free_room <= 0.5)            ? "l2_free_room: 0 to 0.5"
           : (unsigned)cfg->policy >= KVT_POLICY_COUNT_                       ? "policy: not a kvt_policy_t"
           : (unsigned)cfg->write_policy >= KVT_WRITE_POLICY_COUNT_           ? "write_policy: not a kvt_write_policy_t"
           : cfg->write_through_hits == 0                                     ? "write_through_hits: at least 1"
           : cfg->l3_pages >= UINT32_MAX                                      ? "l3_pages: 0 to 2^32-2"
           : cfg->l3_pages && cfg->l2_pages == 0                              ? "l3_pages: a modeled L3 needs an L2 (l2_pages > 0)"
           : (unsigned)cfg->l3_write_policy >= KVT_WRITE_POLICY_COUNT_        ? "l3_write_policy: not a kvt_write_policy_t"
           : cfg->l3_write_hits == 0                                          ? "l3_write_hits: at least 1"
           : (unsigned)cfg->prefetch_policy >= KVT_PREFETCH_POLICY_COUNT_     ? "prefetch_policy: not a kvt_prefetch_policy_t"
           : !seconds_ok(cfg->prefetch_timeout_s)                             ? "prefetch_timeout_s: 0 to 86400"
           : !seconds_ok(cfg->prefetch_timeout_per_1024_s)                    ? "prefetch_timeout_per_1024_s: 0 to 86400"
           : !seconds_ok(cfg->prefetch_timeout_max_s)                         ? "prefetch_timeout_max_s: 0 to 86400"
                                                                              : NULL;
}

int kvt_cache_config_check(const kvt_cache_config_t *user, const char **why) {
    kvt_cache_config_t full;
    kvt_cache_config_default(&full);
    const char *w = user == NULL                                        ? "no config"
                    : kvt__abi_in(&full, sizeof(full), user) != KVT_OK ? "size: below 4, or bytes past this "
                                                                          "library's config are not 0"
                                                                        : config_refused(&full);
    if (why) *why = w;
    return w ? KVT_EINVAL : KVT_OK;
}

int kvt_cache_create(kvt_cache_t **out, const kvt_cache_config_t *user) {
    kvt_cache_config_t full, *cfg = &full;
    kvt_cache_config_default(&full);
    if (out == NULL || kvt_cache_config_check(user, NULL) != KVT_OK) return KVT_EINVAL;
    kvt__abi_in(&full, sizeof(full), user);
    kvt_cache_t *c = KVT_NEW(kvt_cache_t);
    if (c == NULL) return KVT_ENOMEM;
    c->cfg = *cfg;
    c->cfg.size = sizeof(c->cfg);
    c->l1_free = cfg->l1_pages;
    c->l2_free = cfg->l2_pages;
    c->l1_target = (uint64_t)ceil(cfg->l1_free_room * (double)cfg->l1_pages);
    c->l2_target = (uint64_t)ceil(cfg->l2_free_room * (double)cfg->l2_pages);
    c->l1_floor = (c->l1_target + 1) / 2; /* free < ceil(t/2) is free < t/2: "fewer than half" of an odd target too */
    c->l2_floor = (c->l2_target + 1) / 2;
    c->st.size = sizeof(c->st);
    kvt__radix_config_t rc = {cfg->page_tokens, cfg->l1_pages, cfg->l2_pages, kvt__policy_score, c,
                              kvt__policy_needs_keys(cfg->policy)};
    c->dp.done_cap = KVT__CACHE_DONE_CAP;
    c->scratch_cap = 2 * (cfg->l1_pages > cfg->l2_pages ? cfg->l1_pages : cfg->l2_pages);
    int err = kvt__radix_create(&c->tree, &rc);
    if (err == KVT_OK) err = kvt_laneal_create(&c->l1, cfg->l1_pages, cfg->l1_lanes);
    if (err == KVT_OK && cfg->l2_pages) err = kvt_extalloc_create(&c->l2, cfg->l2_pages);
    if (err == KVT_OK) err = idbuf_init(&c->l1_back, cfg->l1_pages);
    if (err == KVT_OK) err = idbuf_init(&c->l2_back, cfg->l2_pages);
    if (err == KVT_OK && (c->dp.done = kvt__malloc(c->dp.done_cap * sizeof(kvt__op_t))) == NULL) err = KVT_ENOMEM;
    if (err == KVT_OK && (c->scratch = kvt__malloc(c->scratch_cap * sizeof(uint32_t))) == NULL) err = KVT_ENOMEM;
    if (err == KVT_OK && (c->l2_runs = kvt__malloc((cfg->l2_pages + 1) * sizeof(kvt_run_t))) == NULL) err = KVT_ENOMEM;
    if (err == KVT_OK) err = kvt__policy_init(c);
    if (err == KVT_OK) err = kvt__l3_init(c);
    if (err != KVT_OK) {
        kvt_cache_destroy(c);
        return err;
    }
    *out = c;
    return KVT_OK;
}

void kvt_cache_destroy(kvt_cache_t *c) {
    if (c == NULL) return;
    if (c->dp.xf) kvt_cache_sync(c); /* the engine owns the pages in flight until they land */
    kvt__l3_fini(c);              /* ... and the store those of its calls */
    kvt__radix_destroy(c->tree);
    kvt_laneal_destroy(c->l1);
    kvt_extalloc_destroy(c->l2);
    idbuf_fini(&c->l1_back);
    idbuf_fini(&c->l2_back);
    kvt__free(c->dp.done, c->dp.done_cap * sizeof(kvt__op_t));
    kvt__free(c->scratch, c->scratch_cap * sizeof(uint32_t));
    kvt__free(c->l2_runs, (c->cfg.l2_pages + 1) * sizeof(kvt_run_t));
    kvt__policy_fini(c);
    for (int k = 0; k < 2; k++) kvt__free(c->dp.pend[k], c->dp.pend_cap * sizeof(kvt_xfer_copy_t));
    KVT_DELETE(c);
}

kvt_radix_t *kvt_cache_tree(kvt_cache_t *c) { return c ? c->tree : NULL; }
/* ---- stats and check ------------------------------------------------------------------ */

int kvt_cache_stats(const kvt_cache_t *c, kvt_cache_stats_t *st) {
    if (c == NULL || st == NULL) return KVT_EINVAL;
    kvt_cache_stats_t full = c->st;
    full.size = sizeof(full);
    full.l1_free = c->l1_free;
    full.l2_free = c->l2_free;
    full.l1_target = c->l1_target;
    full.l2_target = c->l2_target;
    full.l1_floor = c->l1_floor;
    full.l2_floor = c->l2_floor;
    full.l3_known_pages = c->l3.store ? kvt__ghost_live(&c->l3.own) : c->l3.model.n;
    return kvt__abi_out(st, &full, sizeof(full));
}

int kvt_cache_check(kvt_cache_t *c, const char **why) {
    const char *dummy;
    if (why == NULL) why = &dummy;
    *why = NULL;
    if (c == NULL) return KVT_EINVAL;
    int rc = kvt_radix_check(c->tree, why);
    if (rc != KVT_OK) return rc;
    kvt_radix_stats_t rs = {.size = sizeof(rs)};
    kvt_radix_stats(c->tree, &rs);
    kvt_laneal_stats_t ls = {.size = sizeof(ls)};
    kvt_laneal_stats(c->l1, &ls);
    if (kvt_laneal_check(c->l1, why) != KVT_OK) return KVT_ECORRUPT;
    /* every L1 id the tree holds is reserved, and nothing else is (the tree holds each id once, and
     * which it holds, kvt_radix_check found: kvt__radix_held); freed ids wait in l1_back */
    uint64_t l1_held = 0, l2_held = 0;
    for (size_t i = 0; i < c->l1_back.n; i++)
        if (kvt__radix_held(c->tree, 1, c->l1_back.id[i])) return *why = "a freed L1 page is in the tree", KVT_ECORRUPT;
    for (kvt_rnode_t *x = kvt__radix_first(c->tree); x; x = kvt__radix_next(c->tree, x))
        for (uint32_t i = 0; i < x->npages; i++) {
            uint32_t l2 = x->pages[i].l2;
            l1_held += x->pages[i].l1 != KVT_NO_PAGE;
            l2_held += l2 != KVT_NO_PAGE;
            if (l2 != KVT_NO_PAGE && (c->l2 == NULL || kvt_extalloc_is_free(c->l2, l2)))
                return *why = "an L2 page in the tree is free in its allocator, or there is no L2", KVT_ECORRUPT;
        }
    if (ls.free_pages + c->l1_back.n + l1_held != c->cfg.l1_pages) return *why = "L1 pages leaked or double-held", KVT_ECORRUPT;
    if (ls.free_pages + c->l1_back.n != c->l1_free) return *why = "L1 free count differs", KVT_ECORRUPT;
    if (c->l2) {
        kvt_extalloc_stats_t es = {.size = sizeof(es)};
        kvt_extalloc_stats(c->l2, &es);
        if (kvt_extalloc_check(c->l2, why) != KVT_OK) return KVT_ECORRUPT;
        uint64_t pf_held, deferred;
        if (kvt__l3_check(c, &pf_held, &deferred, why) != KVT_OK) return KVT_ECORRUPT;
        if (es.free_pages + c->l2_back.n + l2_held + pf_held + deferred != c->cfg.l2_pages)
            return *why = "L2 pages leaked or double-held", KVT_ECORRUPT;
        if (es.free_pages + c->l2_back.n + deferred != c->l2_free) return *why = "L2 free count differs", KVT_ECORRUPT;
    }
    /* the copies found corrupt are suspect pages of the tree, found by their ids */
    for (size_t i = 0; i < c->ncorrupt; i++) {
        kvt_rnode_t *n;
        uint32_t idx;
        if (!kvt__radix_locate_l2(c->tree, c->corrupt[i], &n, &idx) || !(n->pages[idx].flags & KVT_PAGE_SUSPECT))
            return *why = "a copy found corrupt is not a suspect page of the tree", KVT_ECORRUPT;
    }
    if (rs.locked_nodes > 0 && c->held == 0 && kvt_cache_prefetches(c) == 0) return *why = "nodes locked with no request held", KVT_ECORRUPT;
    uint64_t flagged[2] = {0, 0};
    for (kvt_rnode_t *x = kvt__radix_first(c->tree); x; x = kvt__radix_next(c->tree, x)) {
        for (uint32_t i = x->n_l1; i < x->npages && x->lock == 0; i++)
            if (x->pages[i].l1 != KVT_NO_PAGE)
                return *why = "an L1 page stranded past the L1 prefix of a node no request holds", KVT_ECORRUPT;
        for (uint32_t i = 0; i < x->npages; i++) {
            flagged[OP_BACKUP] += (x->pages[i].flags & KVT_PAGE_D2H) != 0;
            flagged[OP_LOAD] += (x->pages[i].flags & KVT_PAGE_H2D) != 0;
        }
    }
    /* every copy in flight is a page marked in flight, and the reverse */
    if (flagged[OP_BACKUP] != c->dp.inflight[OP_BACKUP] || flagged[OP_LOAD] != c->dp.inflight[OP_LOAD])
        return *why = "copies in flight differ from the pages marked in flight", KVT_ECORRUPT;
    return kvt__policy_check(c, why);
}
