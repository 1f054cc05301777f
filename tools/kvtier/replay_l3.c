#include "replay_l3.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier/error.h"
#include "kvtier/testing.h"

/* the choices, from the library's own names */
static const char *write_policies[KVT_WRITE_POLICY_COUNT_ + 1], *prefetch_policies[KVT_PREFETCH_POLICY_COUNT_ + 1];

struct replay_l3 {
    kvt_store_t *store;
    kvt_tier_t *standin; /* metadata-only runs */
};

void replay_l3_default(l3_opts_t *l) {
    kvt_cache_config_t d;
    kvt_cache_config_default(&d);
    kvt_store_config_t sd;
    kvt_store_config_default(&sd);
    *l = (l3_opts_t){.write_policy = d.l3_write_policy, .write_hits = d.l3_write_hits,
                     .prefetch_policy = d.prefetch_policy, .timeout_s = d.prefetch_timeout_s,
                     .per_1024_s = d.prefetch_timeout_per_1024_s, .max_s = d.prefetch_timeout_max_s,
                     .threshold = d.prefetch_threshold, .ahead = 4, .threads = sd.threads, .instances = 1};
}

size_t replay_l3_rows(l3_opts_t *l, cli_opt_t *t) {
    for (int i = 0; i < KVT_WRITE_POLICY_COUNT_; i++) write_policies[i] = kvt_write_policy_name((kvt_write_policy_t)i);
    for (int i = 0; i < KVT_PREFETCH_POLICY_COUNT_; i++) prefetch_policies[i] = kvt_prefetch_policy_name((kvt_prefetch_policy_t)i);
    const cli_opt_t rows[] = {
        {"l3", OPT_TEXT, &l->url, 0, 0, 0, 0, NULL, NULL, 0,
         "L3 store: dir:PATH[,max=SIZE] | redis://[USER:PASSWORD@]HOST:PORT | redis-cluster://[USER:PASSWORD@]H:P[,H:P...]"},
        {"l3-pages", OPT_U64, &l->pages, 0, UINT32_MAX - 1, 0, 0, NULL, NULL, 0,
         "a modeled L3 of N pages (an LRU in this process; metadata only, for fast sweeps)"},
        {"l3-write-policy", OPT_CHOICE, &l->write_policy, 0, 0, 0, 0, write_policies, NULL, 0,
         "when L2 pages are put to L3: as they land in L2, after N hits, or as L2 evicts them"},
        {"l3-write-hits", OPT_U64, &l->write_hits, 1, 1000000, 0, 0, NULL, NULL, 0, "hits before write_through_selective puts a node"},
        {"prefetch-policy", OPT_CHOICE, &l->prefetch_policy, 0, 0, 0, 0, prefetch_policies, NULL, 0,
         "how admission finishes a prefetch: use what arrived, wait for all, or wait up to the timeout"},
        {"prefetch-timeout", OPT_DOUBLE, &l->timeout_s, 0, 0, 0, 3600, NULL, NULL, 0, "timeout policy: base wait, seconds"},
        {"prefetch-timeout-per-1024", OPT_DOUBLE, &l->per_1024_s, 0, 0, 0, 3600, NULL, NULL, 0,
         "timeout policy: added per 1024 tokens of the request, seconds"},
        {"prefetch-timeout-max", OPT_DOUBLE, &l->max_s, 0, 0, 0, 3600, NULL, NULL, 0, "timeout policy: the longest wait, seconds"},
        {"prefetch-threshold", OPT_U64, &l->threshold, 0, 1u << 30, 0, 0, NULL, NULL, 0,
         "tokens past the L1+L2 match below which no prefetch starts"},
        {"prefetch-ahead", OPT_U64, &l->ahead, 0, 1024, 0, 0, NULL, NULL, 0,
         "prefetch the next N requests while one is admitted (the time prefetches get)"},
#ifdef KVT_TESTING /* kvtier-test only: the testing library's store delay */
        {"l3-delay", OPT_U64, &l->delay_ms, 0, 10000, 0, 0, NULL, NULL, 0, "latency injected into every store batch, ms"},
#endif
        {"l3-threads", OPT_U64, &l->threads, 1, 64, 0, 0, NULL, NULL, 0, "store worker threads"},
        {"instances", OPT_U64, &l->instances, 1, 64, 0, 0, NULL, NULL, 0,
         "run N instances (processes, each its own L1 and L2) sharing the L3 store"},
    };
    memcpy(t, rows, sizeof(rows));
    return sizeof(rows) / sizeof(rows[0]);
}

bool replay_l3_on(const l3_opts_t *l) { return l->url != NULL || l->pages > 0; }

int replay_l3_finish(cli_t *c, const l3_opts_t *l, bool sweep) {
    if (l->url && l->pages) {
        c->flag = "--l3-pages";
        return cli_error(c, "is a modeled L3: not with a store (--l3)");
    }
    if (l->url && kvt_store_url_check(l->url) == KVT_EINVAL) { /* before any work: the open would refuse it too */
        c->flag = "--l3";
        return cli_error(c, "%s", kvt_store_last_error(NULL));
    }
    if (l->url && sweep) {
        c->flag = "--sweep";
        return cli_error(c, "with a store (--l3) every run would see what the runs before it put: sweep a modeled L3 (--l3-pages N)");
    }
    if (l->instances > 1 && sweep) {
        c->flag = "--instances";
        return cli_error(c, "not with --sweep");
    }
    l3_opts_t d;
    replay_l3_default(&d);
    bool l3 = l->url || l->pages, timeout = l->prefetch_policy == KVT_PREFETCH_TIMEOUT;
    const cli_idle_t idle[] = {
        {"--l3-write-policy", l->write_policy != d.write_policy && !l3, "needs an L3 (--l3 URL or --l3-pages)"},
        {"--l3-write-hits", l->write_hits != d.write_hits && l->write_policy != KVT_WRITE_THROUGH_SELECTIVE,
         "only with --l3-write-policy write_through_selective"},
        {"--prefetch-policy", l->prefetch_policy != d.prefetch_policy && !l3, "needs an L3 (prefetches come from it)"},
        {"--prefetch-threshold", l->threshold != d.threshold && !l3, "needs an L3 (prefetches come from it)"},
        {"--prefetch-ahead", l->ahead != d.ahead && !l3, "needs an L3 (prefetches come from it)"},
        {"--prefetch-timeout", l->timeout_s != d.timeout_s && !timeout, "only with --prefetch-policy timeout"},
        {"--prefetch-timeout-per-1024", l->per_1024_s != d.per_1024_s && !timeout, "only with --prefetch-policy timeout"},
        {"--prefetch-timeout-max", l->max_s != d.max_s && !timeout, "only with --prefetch-policy timeout"},
        {"--l3-threads", l->threads != d.threads && !l->url, "needs a store (--l3 URL): its workers"},
    };
    if (cli_refuse_idle(c, idle, sizeof(idle) / sizeof(idle[0])) != 0) return -1;
    if (timeout && l->timeout_s > l->max_s) {
        c->flag = "--prefetch-timeout";
        return cli_error(c, "%g s is longer than --prefetch-timeout-max (%g s): the wait is capped below its base",
                         l->timeout_s, l->max_s);
    }
#ifdef KVT_TESTING
    if (l->delay_ms && l->url == NULL) {
        c->flag = "--l3-delay";
        return cli_error(c, "needs a store (--l3)");
    }
#endif
    return 0;
}

void replay_l3_config(const l3_opts_t *l, kvt_cache_config_t *cfg) {
    cfg->l3_pages = l->pages;
    cfg->l3_write_policy = (kvt_write_policy_t)l->write_policy;
    cfg->l3_write_hits = (uint32_t)l->write_hits;
    cfg->prefetch_policy = (kvt_prefetch_policy_t)l->prefetch_policy;
    cfg->prefetch_timeout_s = l->timeout_s;
    cfg->prefetch_timeout_per_1024_s = l->per_1024_s;
    cfg->prefetch_timeout_max_s = l->max_s;
    cfg->prefetch_threshold = (uint32_t)l->threshold;
}

int replay_l3_open(replay_l3_t **out, const l3_opts_t *l, kvt_cache_t *c, kvt_tier_t *l2, uint64_t l2_pages,
                   uint64_t page_tokens, const char *model, l3_result_t *down) {
    *out = NULL;
    memset(down, 0, sizeof(*down));
    if (l->url == NULL) return 0;
    replay_l3_t *r = calloc(1, sizeof(*r));
    if (r == NULL) return fprintf(stderr, "kvtier replay: out of memory\n"), -1;
    int rc = KVT_OK;
    if (l2 == NULL) {
        kvt_tier_config_t tc = {.size = sizeof(tc), .kind = KVT_TIER_HOST, .name = "l2-standin",
                                .geom = {l2_pages, 1, L3_STANDIN_BYTES, KVT_LAYOUT_PAGE_FIRST}};
        rc = kvt_tier_create(&r->standin, &tc);
        if (rc != KVT_OK) {
            fprintf(stderr, "kvtier replay: --l3: cannot create the stand-in L2 tier: %s\n", kvt_strerror(rc));
            free(r);
            return -1;
        }
        l2 = r->standin;
    }
    kvt_store_config_t sc;
    kvt_store_config_default(&sc);
    sc.tier = l2;
    sc.model = model;
    sc.page_tokens = (uint32_t)page_tokens;
    sc.threads = (uint32_t)l->threads;
    rc = kvt_store_open(&r->store, l->url, &sc);
#ifdef KVT_TESTING /* --l3-delay */
    if (rc == KVT_OK) rc = kvt_store_set_delay(r->store, (uint32_t)(l->delay_ms * 1000));
#endif
    char shown[1024]; /* the URL as printed: never its password */
    kvt_store_url_redact(l->url, shown, sizeof(shown));
    if (rc == KVT_EIO) { /* down: the cache serves from L1 and L2 */
        down->down = true;
        kvt_store_url_redact(l->url, down->url, sizeof(down->url));
        snprintf(down->why, sizeof(down->why), "%s", kvt_store_last_error(NULL));
        fprintf(stderr, "kvtier replay: --l3 %s: %s; going on without L3 (L1 and L2 serve)\n", shown, down->why);
        replay_l3_close(r);
        return 0;
    }
    if (rc != KVT_OK) {
        fprintf(stderr, "kvtier replay: --l3 %s: %s\n", shown, kvt_store_last_error(NULL));
        replay_l3_close(r);
        return rc == KVT_EINVAL ? -2 : -1; /* a malformed URL is a bad flag */
    }
    rc = kvt_cache_attach_store(c, r->store);
    if (rc != KVT_OK) {
        fprintf(stderr, "kvtier replay: --l3: cannot attach the store: %s\n", kvt_strerror(rc));
        replay_l3_close(r);
        return -1;
    }
    *out = r;
    return 0;
}

void replay_l3_result(replay_l3_t *r, l3_result_t *res) {
    if (r == NULL) return; /* res keeps what open said (down, or nothing) */
    memset(res, 0, sizeof(*res));
    res->store = true;
    snprintf(res->url, sizeof(res->url), "%s", kvt_store_url(r->store));
    snprintf(res->backend, sizeof(res->backend), "%s", kvt_store_backend(r->store));
    for (int op = 0; op < KVT_STORE_OP_COUNT_; op++) {
        res->op[op].size = sizeof(res->op[op]);
        kvt_store_stats(r->store, (kvt_store_op_t)op, &res->op[op]);
    }
}

void replay_l3_emit(replay_l3_t *r, kvt_emitter_t *e) {
    if (r) kvt_store_emit(r->store, e);
}

void replay_l3_close(replay_l3_t *r) {
    if (r == NULL) return;
    kvt_store_close(r->store);
    kvt_tier_destroy(r->standin);
    free(r);
}
