/* kvtier replay — replays a request trace through the cache and reports what
 * each tier would have served. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <xxhash.h>

#include "cli.h"
#include "commands.h"
#include "kvtier/alloc.h"
#include "kvtier/cache.h"
#include "kvtier/error.h"
#include "kvtier/hybrid.h"
#include "kvtier/mem.h"
#include "kvtier/model.h"
#include "kvtier/radix.h"
#include "kvtier/stats.h"
#include "replay.h"
#include "replay_data.h"
#include "replay_hybrid.h"
#include "replay_l3.h"
#include "replay_run.h"
#include "trace.h"

#define MAX_SWEEP 32
#define MAX_ROWS 48

static const char *model_names[16], *policy_names[KVT_POLICY_COUNT_ + 1];
static const char *const WRITE_POLICIES[] = {"write_through", "write_through_selective", "write_back", NULL};
static const char *const FORMATS[] = {"none", "table", "json", "prom", NULL}; /* index - 1 = kvt_fmt_t */
static const char *const LAYOUTS[] = {"page_first", "layer_first", NULL};     /* index = kvt_layout_t */

static double now_s(void) { return (double)kvt_now_ns() / 1e9; }
static double seconds_between(struct timeval a, struct timeval b) {
    return (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_usec - a.tv_usec) / 1e6;
}

static void progress(uint64_t done, uint64_t total, bool show) {
    if (!show || (done % 64 != 0 && done != total)) return;
    int w = 40, fill = (int)((double)w * (double)done / (double)total);
    fprintf(stderr, "\r[%.*s%*s] %" PRIu64 "/%" PRIu64, fill, "########################################", w - fill,
            "", done, total);
    if (done == total) fputs("\r\033[K", stderr);
}

uint64_t replay_trace_pages(const kvt_trace_t *t, uint64_t n, uint64_t pt) {
    uint64_t p = 0;
    for (uint64_t i = 0; i < n; i++) p += t->req[i].input_length / pt;
    return p ? p : 1;
}

/* The cache's and the tree's counters, through the one emitter, to stderr. */
static int emit_stats(const result_t *res, kvt_fmt_t fmt, replay_data_t *data, replay_l3_t *l3) {
    kvt_emitter_t *e;
    int rc = kvt_emitter_create(&e, fmt, "kvtier");
    if (rc != KVT_OK) return rc;
    kvt_emit_begin(e, "cache");
    KVT_EMIT_STATS(e, &res->cs, KVT_CACHE_STATS_FIELDS);
    kvt_emit_end(e);
    kvt_emit_begin(e, "tree");
    KVT_EMIT_STATS(e, &res->rs, KVT_RADIX_STATS_FIELDS);
    kvt_emit_end(e);
    if (data) replay_data_emit(data, e);
    if (l3) {
        kvt_emit_begin(e, "l3");
        replay_l3_emit(l3, e);
        kvt_emit_end(e);
    }
    rc = kvt_emitter_write(e, stderr);
    if (rc != KVT_OK) fprintf(stderr, "kvtier replay: --stats: %s\n", kvt_strerror(rc));
    kvt_emitter_destroy(e);
    return rc;
}

/* A --groups description goes by a hash of its text, as the hybrid replay's
 * identity (replay_hybrid.c): a store's model name holds 127 characters. */
const char *replay_model_name(const opts_t *o, char *buf, size_t cap) {
    if (!o->bytes_per_token && o->groups && (strlen(o->groups) >= 24 || strchr(o->groups, ':'))) {
        snprintf(buf, cap, "groups-%016llx", (unsigned long long)XXH3_64bits(o->groups, strlen(o->groups)));
        return buf;
    }
    if (!o->bytes_per_token) return o->groups ? o->groups : kvt_model_at((unsigned)o->model)->name;
    snprintf(buf, cap, "bpt-%" PRIu64, o->bytes_per_token);
    return buf;
}

/* What the process holds now: resident memory (/proc/self/statm), open file
 * descriptors (/proc/self/fd), threads (/proc/self/task), kvtier's live
 * bytes. */
static uint64_t entries(const char *dir) {
    DIR *d = opendir(dir);
    uint64_t n = 0;
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) n += e->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

static void soak_sample(soak_sample_t *s, kvt_cache_t *c, uint64_t pass, uint64_t requests, double at_s) {
    *s = (soak_sample_t){.pass = pass, .requests = requests, .at_s = at_s};
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long size, rss;
    if (f && fscanf(f, "%llu %llu", &size, &rss) == 2) s->rss_kb = rss * (uint64_t)sysconf(_SC_PAGESIZE) / 1024;
    if (f) fclose(f);
    s->fds = entries("/proc/self/fd") - 1; /* the one opendir holds */
    s->threads = entries("/proc/self/task");
    kvt_mem_stats_t ms = {.size = sizeof(ms)};
    kvt_mem_stats(&ms);
    s->live_bytes = ms.live_bytes;
    kvt_radix_stats_t rs = {.size = sizeof(rs)};
    kvt_radix_stats(kvt_cache_tree(c), &rs);
    s->pool_idle_bytes = rs.pool_free_bytes;
}

/* Request k's tokens into buf; its token count. */
static uint64_t request_tokens(const kvt_trace_t *t, uint32_t k, int32_t *buf) {
    const kvt_trace_req_t *r = &t->req[k];
    for (uint32_t b = 0; b < r->nblocks; b++) kvt_trace_block_tokens(r->hash_ids[b], buf + (size_t)b * KVT_TRACE_BLOCK_TOKENS);
    return r->input_length;
}

int replay_run_one(const kvt_trace_t *t, const opts_t *o, const l3_opts_t *l, uint64_t l1_pages, const uint32_t *reqs,
                   uint64_t nreqs, result_t *res) {
    uint64_t n = reqs ? nreqs : o->limit && o->limit < t->n ? o->limit : t->n;
    kvt_cache_config_t cfg;
    replay_cache_config(o, l1_pages == UNBOUNDED ? replay_trace_pages(t, reqs ? t->n : n, o->page_tokens) : l1_pages, &cfg);
    replay_l3_config(l, &cfg);
    /* remember every put: then "from another instance" is exact (a page this instance never put) */
    if (l->url) cfg.l3_known = replay_trace_pages(t, t->n, o->page_tokens);
    if (cfg.l1_pages > KVT_ALLOC_MAX_PAGES) {
        fprintf(stderr, "kvtier replay: --l1-pages: %" PRIu64 " pages is more than %u\n", cfg.l1_pages, KVT_ALLOC_MAX_PAGES);
        return -1;
    }
    kvt_cache_t *c;
    const char *refused = NULL;
    int rc = kvt_cache_config_check(&cfg, &refused);
    if (rc == KVT_OK) rc = kvt_cache_create(&c, &cfg);
    if (rc != KVT_OK) {
        fprintf(stderr, "kvtier replay: cannot create the cache: %s%s%s\n", kvt_strerror(rc), refused ? ": " : "",
                refused ? refused : "");
        return -1;
    }
    replay_data_t *data = NULL;
    replay_l3_t *l3 = NULL;
    char mbuf[64];
    if (o->data) {
        data_opts_t dopt = {o->page_tokens, cfg.l1_pages, cfg.l2_pages, o->layers, o->bpt / o->layers * o->page_tokens,
                            (kvt_layout_t)o->layout, (uint32_t)o->threads, o->verify, o->copy_faults};
        if (replay_data_open(&data, c, &dopt) != 0) {
            kvt_cache_destroy(c);
            return -1;
        }
    }
    int orc = replay_l3_open(&l3, l, c, data ? replay_data_l2(data) : NULL, cfg.l2_pages, o->page_tokens,
                             replay_model_name(o, mbuf, sizeof(mbuf)), &res->l3);
    if (orc != 0) {
        kvt_cache_destroy(c);
        replay_data_close(data);
        return orc;
    }
    /* prefetches: the next `ahead` requests are prefetched while one is admitted */
    uint64_t ahead = replay_l3_on(l) ? l->ahead : 0, next = 0;
    size_t max_tokens = (size_t)t->max_blocks * KVT_TRACE_BLOCK_TOKENS;
    /* a request's tokens are built once, when it is prefetched (or admitted without L3), and kept in a
     * ring of ahead + 1 buffers until its admission */
    size_t ring = (size_t)ahead + 1;
    int32_t *tokens = malloc(ring * max_tokens * sizeof(int32_t));
    uint64_t *pf = calloc(ring, sizeof(uint64_t)), *len = calloc(ring, sizeof(uint64_t));
    uint32_t *l1_ids = data ? malloc((max_tokens / o->page_tokens + 1) * sizeof(uint32_t)) : NULL;
    if (tokens == NULL || pf == NULL || len == NULL || (data && l1_ids == NULL)) {
        fprintf(stderr, "kvtier replay: out of memory\n");
        rc = KVT_ENOMEM;
    }
    bool show = isatty(2) && !o->json && reqs == NULL && o->soak_s <= 0;
    struct rusage u0;
    getrusage(RUSAGE_SELF, &u0);
    double t0 = now_s();
    /* --soak: pass after pass of the same n requests (request i is i mod n of the trace) */
    uint64_t total = n;
    res->soak.passes = 0;
    res->tokens_s = 0;
    for (uint64_t i = 0; i < total && rc == KVT_OK; i++) {
        for (; next < total && next <= i + ahead && rc == KVT_OK; next++) { /* requests arriving: built, prefetched */
            size_t k = next % ring;
            int32_t *tk = tokens + k * max_tokens;
            double tb = now_s();
            len[k] = request_tokens(t, reqs ? reqs[next % n] : (uint32_t)(next % n), tk);
            res->tokens_s += now_s() - tb;
            pf[k] = 0;
            if (replay_l3_on(l)) rc = kvt_cache_prefetch(c, 0, tk, len[k], &pf[k]);
        }
        size_t k = i % ring;
        int32_t *tk = tokens + k * max_tokens;
        kvt_cache_req_t req;
        if (rc == KVT_OK) rc = kvt_cache_admit_prefetched(c, pf[k], 0, tk, len[k], 0, l1_ids, &req);
        if (rc != KVT_OK) {
            fprintf(stderr, "kvtier replay: request %" PRIu64 ": %s\n", (reqs ? reqs[i % n] : i % n) + 1, kvt_strerror(rc));
            break;
        }
        if (data) replay_data_request(data, tk, &req, l1_ids); /* the forward pass: its pages get their KV */
        kvt_cache_commit(c, &req);
        kvt_cache_release(c, &req);
        if (o->check_every && (i + 1) % o->check_every == 0) {
            const char *why;
            if (kvt_cache_check(c, &why) != KVT_OK) {
                fprintf(stderr, "kvtier replay: check failed after request %" PRIu64 ": %s\n", i + 1, why);
                rc = KVT_ECORRUPT;
            }
        }
        progress(i + 1, n, show);
        if ((i + 1) % n == 0 && rc == KVT_OK && replay_soak_pass(&res->soak, o, c, i + 1, now_s() - t0)) total += n;
    }
    kvt_cache_sync(c); /* the copies and store calls in flight */
    if (data) replay_data_result(data, c, &res->data);
    res->wall_s = now_s() - t0;
    struct rusage u1;
    getrusage(RUSAGE_SELF, &u1);
    res->wall_faults = (uint64_t)(u1.ru_minflt - u0.ru_minflt) + (uint64_t)(u1.ru_majflt - u0.ru_majflt);
    res->wall_user_s = seconds_between(u0.ru_utime, u1.ru_utime);
    res->wall_sys_s = seconds_between(u0.ru_stime, u1.ru_stime);
    res->l1_pages = cfg.l1_pages;
    res->l2_pages = cfg.l2_pages;
    res->nreq = total;
    res->cs.size = sizeof(res->cs);
    res->rs.size = sizeof(res->rs);
    kvt_cache_stats(c, &res->cs);
    kvt_radix_stats(kvt_cache_tree(c), &res->rs);
    res->digest = kvt_cache_digest(c);
    replay_l3_result(l3, &res->l3);
    if (o->stats > 0 && emit_stats(res, (kvt_fmt_t)(o->stats - 1), data, l3) != KVT_OK && rc == KVT_OK) rc = KVT_EIO;
    free(tokens);
    free(pf);
    free(len);
    free(l1_ids);
    kvt_cache_destroy(c);
    replay_l3_close(l3);
    replay_data_close(data);
    return rc == KVT_OK ? 0 : -1;
}

/* ---- output ---- */

static double hit_rate(const result_t *r) {
    return r->cs.tokens ? (double)(r->cs.l1_hit_tokens + r->cs.l2_hit_tokens + r->cs.l3_hit_tokens) / (double)r->cs.tokens : 0;
}

static double frac(uint64_t x, uint64_t of) { return of ? (double)x / (double)of : 0; }

static double per_1k(uint64_t x, uint64_t allocs) { return allocs ? 1000.0 * (double)x / (double)allocs : 0; }

static double gb(uint64_t pages, const opts_t *o, uint64_t bpt) { return (double)pages * (double)o->page_tokens * (double)bpt / 1e9; }

/* name: {"l1": a, "l2": b} */
static void add_tiers(cJSON *x, const char *name, double a, double b) {
    cJSON *h = cJSON_AddObjectToObject(x, name);
    cJSON_AddNumberToObject(h, "l1", a);
    cJSON_AddNumberToObject(h, "l2", b);
}

/* One direction's transfer figures. */
static void xfer_json(cJSON *x, const char *name, const kvt_xfer_stats_t *st) {
    cJSON *d = cJSON_AddObjectToObject(x, name);
    cJSON_AddNumberToObject(d, "bytes", (double)st->bytes);
    cJSON_AddNumberToObject(d, "batches", (double)st->batches);
    cJSON_AddNumberToObject(d, "pages", (double)st->pages);
    cJSON_AddNumberToObject(d, "runs", (double)st->runs);
    cJSON_AddNumberToObject(d, "failures", (double)st->failures);
    cJSON_AddNumberToObject(d, "gbps", st->gbps);
    static const double q[] = {0.5, 0.9, 0.99, 0.999, 1};
    static const char *const qn[] = {"p50", "p90", "p99", "p999", "max"};
    cJSON *e = cJSON_AddObjectToObject(d, "e2e_us");
    for (int i = 0; i < 5; i++) cJSON_AddNumberToObject(e, qn[i], (double)kvt_hist_percentile(&st->e2e_ns, q[i]) / 1e3);
}

static void data_json(cJSON *x, const result_t *r) {
    cJSON *d = cJSON_AddObjectToObject(x, "data");
    replay_data_json(d, &r->data);
    cJSON_AddNumberToObject(d, "failed_copies", (double)r->cs.failed_copies);
    cJSON_AddNumberToObject(d, "integrity_failures", (double)r->cs.integrity_failures);
    xfer_json(d, "d2h", &r->data.d2h);
    xfer_json(d, "h2d", &r->data.h2d);
}

static void sample_json(cJSON *x, const char *name, const soak_sample_t *s) {
    cJSON *d = cJSON_AddObjectToObject(x, name);
    cJSON_AddNumberToObject(d, "pass", (double)s->pass);
    cJSON_AddNumberToObject(d, "requests", (double)s->requests);
    cJSON_AddNumberToObject(d, "at_s", s->at_s);
    cJSON_AddNumberToObject(d, "rss_kb", (double)s->rss_kb);
    cJSON_AddNumberToObject(d, "fds", (double)s->fds);
    cJSON_AddNumberToObject(d, "threads", (double)s->threads);
    cJSON_AddNumberToObject(d, "live_bytes", (double)s->live_bytes);
    cJSON_AddNumberToObject(d, "pool_idle_bytes", (double)s->pool_idle_bytes);
}

bool replay_soak_pass(soak_t *s, const opts_t *o, kvt_cache_t *c, uint64_t requests, double at_s) {
    s->passes++;
    if (o->soak_s <= 0) return false;
    soak_sample_t x; /* what the process holds, and another pass while there is time */
    soak_sample(&x, c, s->passes, requests, at_s);
    if (s->passes == 1) s->first = x;
    if (s->passes == 1 || s->middle.at_s < o->soak_s / 2) s->middle = x;
    s->last = x;
    return at_s < o->soak_s;
}

void replay_soak_json(cJSON *x, const soak_t *s, const opts_t *o) {
    cJSON *d = cJSON_AddObjectToObject(x, "soak");
    cJSON_AddNumberToObject(d, "seconds", o->soak_s);
    cJSON_AddNumberToObject(d, "passes", (double)s->passes);
    cJSON_AddNumberToObject(d, "copy_faults", o->copy_faults);
    sample_json(d, "first", &s->first);
    sample_json(d, "middle", &s->middle);
    sample_json(d, "last", &s->last);
}

void replay_soak_print(const soak_t *s) {
    printf("  soak: %" PRIu64 " passes; after pass:", s->passes);
    const soak_sample_t *at[3] = {&s->first, &s->middle, &s->last};
    for (int k = 0; k < 3 && (k == 0 || at[k]->pass > at[k - 1]->pass); k++)
        printf("%s %" PRIu64 " (%.1f s) resident %.1f MiB, %" PRIu64 " descriptors, %" PRIu64 " threads, kvtier %.1f MiB (%.1f in use)",
               k ? ";" : "", at[k]->pass, at[k]->at_s, (double)at[k]->rss_kb / 1024, at[k]->fds, at[k]->threads,
               (double)at[k]->live_bytes / 1048576, (double)(at[k]->live_bytes - (int64_t)at[k]->pool_idle_bytes) / 1048576);
    putchar('\n');
}

/* The store's figures: per operation calls, keys, hits, misses, bad
 * objects, failures, redirections, latency percentiles. */
void replay_store_json(cJSON *x, const char *name, const l3_result_t *l) {
    cJSON *d = cJSON_AddObjectToObject(x, name);
    cJSON_AddStringToObject(d, "url", l->url);
    cJSON_AddStringToObject(d, "backend", l->backend);
    static const double q[] = {0.5, 0.9, 0.99, 0.999, 1};
    static const char *const qn[] = {"p50", "p90", "p99", "p999", "max"};
    for (int op = 0; op < KVT_STORE_OP_COUNT_; op++) {
        const kvt_store_stats_t *st = &l->op[op];
        if (st->calls == 0) continue;
        cJSON *o = cJSON_AddObjectToObject(d, kvt_store_op_name((kvt_store_op_t)op));
        CLI_JSON_FIELDS(o, st, KVT_STORE_STATS_FIELDS);
        cJSON *lat = cJSON_AddObjectToObject(o, "latency_us");
        for (int i = 0; i < 5; i++) cJSON_AddNumberToObject(lat, qn[i], (double)kvt_hist_percentile(&st->latency_ns, q[i]) / 1e3);
    }
}

static void l3_json(cJSON *x, const result_t *r, const l3_opts_t *l) {
    const kvt_cache_stats_t *s = &r->cs;
    cJSON *d = cJSON_AddObjectToObject(x, "l3");
    cJSON_AddStringToObject(d, "kind", l->url ? "store" : "model");
    if (l->pages) cJSON_AddNumberToObject(d, "pages", (double)l->pages);
    cJSON_AddStringToObject(d, "write_policy", kvt_write_policy_name((kvt_write_policy_t)l->write_policy));
    cJSON_AddStringToObject(d, "prefetch_policy", kvt_prefetch_policy_name((kvt_prefetch_policy_t)l->prefetch_policy));
    cJSON_AddNumberToObject(d, "prefetch_ahead", (double)l->ahead);
    cJSON_AddNumberToObject(d, "prefetch_threshold", (double)l->threshold);
    cJSON_AddNumberToObject(d, "delay_ms", (double)l->delay_ms);
    cJSON_AddNumberToObject(d, "exists_calls_per_request", frac(s->l3_exists_calls, s->requests));
    cJSON_AddNumberToObject(d, "round_trips_per_request", frac(s->l3_exists_calls + s->l3_get_calls, s->requests));
    cJSON *p = cJSON_AddObjectToObject(d, "prefetch");
    cJSON_AddNumberToObject(p, "started", (double)s->prefetches);
    cJSON_AddNumberToObject(p, "complete", (double)s->prefetch_complete);
    cJSON_AddNumberToObject(p, "partial", (double)s->prefetch_partial);
    cJSON_AddNumberToObject(p, "timed_out", (double)s->prefetch_timed_out);
    cJSON_AddNumberToObject(p, "revoked", (double)s->prefetch_revoked);
    cJSON_AddNumberToObject(p, "wait_ms", (double)s->prefetch_wait_micros / 1e3);
    cJSON_AddNumberToObject(p, "wait_max_ms", (double)s->prefetch_wait_max_micros / 1e3);
    if (r->l3.store) replay_store_json(d, "store", &r->l3);
    if (r->l3.down) {
        cJSON_AddBoolToObject(d, "down", true);
        cJSON_AddStringToObject(d, "error", r->l3.why);
    }
}

static cJSON *result_json(const result_t *r, const opts_t *o, const l3_opts_t *l, uint64_t bpt) {
    const kvt_cache_stats_t *s = &r->cs;
    cJSON *x = cJSON_CreateObject();
    /* every cache counter and gauge from the list --stats emits (l1_X, l2_X pair up as "X") */
    CLI_JSON_STATS(x, s, KVT_CACHE_STATS_FIELDS);
    /* and what is derived from them */
    cJSON_AddNumberToObject(x, "input_tokens", (double)s->tokens);
    cJSON_AddNumberToObject(x, "hit_rate", hit_rate(r));
    add_tiers(x, "evict_calls_per_1k_allocs", per_1k(s->l1_evict_calls, s->l1_allocs), per_1k(s->l2_evict_calls, s->l2_allocs));
    cJSON_AddNumberToObject(x, "page_tokens", (double)o->page_tokens);
    cJSON_AddNumberToObject(x, "l1_pages", (double)r->l1_pages);
    cJSON_AddNumberToObject(x, "l2_pages", (double)r->l2_pages);
    cJSON_AddNumberToObject(x, "l1_gb", gb(r->l1_pages, o, bpt));
    cJSON_AddNumberToObject(x, "l2_gb", gb(r->l2_pages, o, bpt));
    cJSON_AddNumberToObject(x, "bytes_per_token", (double)bpt);
    cJSON_AddStringToObject(x, "policy", kvt_policy_name((kvt_policy_t)o->policy));
    cJSON_AddStringToObject(x, "write_policy", WRITE_POLICIES[o->write_policy]);
    cJSON_AddNumberToObject(x, "l1_free_room", o->l1_room);
    cJSON_AddNumberToObject(x, "l2_free_room", o->l2_room);
    cJSON_AddNumberToObject(x, "tree_nodes", (double)r->rs.nodes);
    cJSON_AddNumberToObject(x, "tree_pages", (double)r->rs.pages);
    if (o->digest) {
        char digest[17];
        snprintf(digest, sizeof(digest), "%016" PRIx64, r->digest);
        cJSON_AddStringToObject(x, "decision_digest", digest); /* equal in two runs only if every page id went the same way */
    }
    cJSON_AddNumberToObject(x, "wall_s", r->wall_s);
    cJSON_AddNumberToObject(x, "requests_per_s", r->wall_s > 0 ? (double)s->requests / r->wall_s : 0);
    cJSON_AddNumberToObject(x, "tokens_s", r->tokens_s); /* the part of wall_s that made the token arrays */
    cJSON_AddNumberToObject(x, "user_s", r->wall_user_s); /* the process's CPU time during wall_s: user ... */
    cJSON_AddNumberToObject(x, "sys_s", r->wall_sys_s);   /* ... and kernel (mostly first touches of memory) */
    cJSON_AddNumberToObject(x, "page_faults", (double)r->wall_faults); /* page faults during wall_s */
    if (o->data) data_json(x, r);
    if (replay_l3_on(l)) l3_json(x, r, l);
    if (o->soak_s > 0) replay_soak_json(x, &r->soak, o);
    return x;
}

static void print_l3(const result_t *r, const l3_opts_t *l) {
    const kvt_cache_stats_t *s = &r->cs;
    if (r->l3.down) {
        printf("  L3 %s: down from the start (%s): L1 and L2 served alone\n", r->l3.url, r->l3.why);
        return;
    }
    if (l->url) printf("  L3 %s (%s)", r->l3.url, r->l3.backend);
    else printf("  L3 modeled: %" PRIu64 " pages (LRU)", l->pages);
    printf(", %s; prefetch %s, %" PRIu64 " ahead, threshold %" PRIu64 " tokens%s\n",
           kvt_write_policy_name((kvt_write_policy_t)l->write_policy),
           kvt_prefetch_policy_name((kvt_prefetch_policy_t)l->prefetch_policy), l->ahead, l->threshold,
           l->delay_ms ? " (store delayed)" : "");
    printf("  L3: %" PRIu64 " hit tokens, %" PRIu64 " of them from pages this instance did not put; %" PRIu64
           " pages put (%" PRIu64 " failed, %" PRIu64 " already there)\n",
           s->l3_hit_tokens, s->l3_foreign_hit_tokens, s->l3_puts, s->l3_put_failures, s->l3_puts_skipped);
    printf("  prefetch: %" PRIu64 " started (%" PRIu64 " below the threshold): %" PRIu64 " complete, %" PRIu64
           " partial, %" PRIu64 " timed out, %" PRIu64 " revoked; %" PRIu64 " pages found, %" PRIu64
           " arrived in time; %.2f exists calls and %.2f round trips a request; waited %.1f ms (longest %.1f ms)\n",
           s->prefetches, s->prefetch_below_threshold, s->prefetch_complete, s->prefetch_partial, s->prefetch_timed_out,
           s->prefetch_revoked, s->prefetch_pages, s->prefetch_arrived_pages, frac(s->l3_exists_calls, s->requests),
           frac(s->l3_exists_calls + s->l3_get_calls, s->requests), (double)s->prefetch_wait_micros / 1e3,
           (double)s->prefetch_wait_max_micros / 1e3);
    const kvt_store_stats_t *g = &r->l3.op[KVT_STORE_GET];
    if (r->l3.store && g->calls)
        printf("  store gets: %" PRIu64 " keys, %" PRIu64 " misses, %" PRIu64 " refused objects, %" PRIu64
               " failed; latency p50 %.1f us, p99 %.1f us\n",
               g->keys, g->misses, g->bad_objects, g->failures, (double)kvt_hist_percentile(&g->latency_ns, 0.5) / 1e3,
               (double)kvt_hist_percentile(&g->latency_ns, 0.99) / 1e3);
}

static void print_summary(const result_t *r, const opts_t *o, const l3_opts_t *l, uint64_t bpt, const char *model) {
    const kvt_cache_stats_t *s = &r->cs;
    double tok = s->tokens ? (double)s->tokens : 1;
    printf("  model %s: %.1f KiB of KV per token, %.2f MiB per page of %" PRIu64 " tokens\n", model,
           (double)bpt / 1024, (double)bpt * (double)o->page_tokens / 1048576, o->page_tokens);
    printf("  L1 %" PRIu64 " pages (%.1f GB), L2 %" PRIu64 " pages (%.1f GB); policy %s, %s; free room %.0f%% / %.0f%%\n",
           r->l1_pages, gb(r->l1_pages, o, bpt), r->l2_pages, gb(r->l2_pages, o, bpt),
           kvt_policy_name((kvt_policy_t)o->policy), WRITE_POLICIES[o->write_policy], 100 * o->l1_room, 100 * o->l2_room);
    printf("  hit rate %.4f   L1 %.4f (%" PRIu64 " tokens, %.1f GB)   L2 %.4f (%" PRIu64 " tokens, %.1f GB)", hit_rate(r),
           (double)s->l1_hit_tokens / tok, s->l1_hit_tokens, (double)s->l1_hit_tokens * (double)bpt / 1e9,
           (double)s->l2_hit_tokens / tok, s->l2_hit_tokens, (double)s->l2_hit_tokens * (double)bpt / 1e9);
    if (replay_l3_on(l))
        printf("   L3 %.4f (%" PRIu64 " tokens, %.1f GB)", (double)s->l3_hit_tokens / tok, s->l3_hit_tokens,
               (double)s->l3_hit_tokens * (double)bpt / 1e9);
    putchar('\n');
    printf("  L1: %" PRIu64 " allocations, %" PRIu64 " evicted (%.1f eviction rounds per 1000), %" PRIu64
           " pages evicted, %" PRIu64 " short of room\n",
           s->l1_allocs, s->l1_allocs_evicting, per_1k(s->l1_evict_calls, s->l1_allocs), s->l1_evicted_pages,
           s->l1_alloc_failures);
    printf("  L2: %" PRIu64 " allocations, %" PRIu64 " evicted (%.1f eviction rounds per 1000), %" PRIu64
           " pages evicted, %" PRIu64 " short of room\n",
           s->l2_allocs, s->l2_allocs_evicting, per_1k(s->l2_evict_calls, s->l2_allocs), s->l2_evicted_pages,
           s->l2_alloc_failures);
    printf("  copies: %" PRIu64 " backups (%" PRIu64 " forced), %" PRIu64 " loads; %" PRIu64
           " shadows reclaimed; %" PRIu64 " pages left the cache\n",
           s->backups, s->forced_backups, s->loads, s->shadows_reclaimed, s->dropped_pages);
    if (replay_l3_on(l)) print_l3(r, l);
    printf("  tree: %" PRIu64 " nodes, %" PRIu64 " pages, %.1f MB of metadata\n", r->rs.nodes, r->rs.pages,
           (double)r->rs.metadata_bytes / 1e6);
    printf("  %" PRIu64 " requests in %.3f s: %.0f requests/s\n", s->requests, r->wall_s,
           r->wall_s > 0 ? (double)s->requests / r->wall_s : 0);
    if (o->digest) printf("  decision digest %016" PRIx64 "\n", r->digest);
    if (o->soak_s > 0) replay_soak_print(&r->soak);
    if (!o->data) return;
    const data_result_t *d = &r->data;
    printf("  data: %.1f KiB pages (%s), %" PRIu64 " filled; verified %" PRIu64 " L1 hits and %" PRIu64
           " loads: %" PRIu64 " mismatches; %" PRIu64 " failed copies, %" PRIu64 " checksum failures\n",
           (double)d->page_bytes / 1024, LAYOUTS[o->layout], d->filled_pages, d->verified_hits, d->verified_loads,
           d->mismatches, s->failed_copies, s->integrity_failures);
    const kvt_xfer_stats_t *x[2] = {&d->d2h, &d->h2d};
    for (int i = 0; i < 2; i++)
        printf("  %s: %.3f GB in %" PRIu64 " batches, %.2f pages per run, %.2f GB/s copying; latency p50 %.1f us, "
               "p99 %.1f us, p999 %.1f us, max %.1f us\n",
               i ? "H2D (L2 -> L1)" : "D2H (L1 -> L2)", (double)x[i]->bytes / 1e9, x[i]->batches,
               x[i]->runs ? (double)x[i]->pages / (double)x[i]->runs : 0, x[i]->gbps,
               (double)kvt_hist_percentile(&x[i]->e2e_ns, 0.5) / 1e3, (double)kvt_hist_percentile(&x[i]->e2e_ns, 0.99) / 1e3,
               (double)kvt_hist_percentile(&x[i]->e2e_ns, 0.999) / 1e3, (double)kvt_hist_percentile(&x[i]->e2e_ns, 1) / 1e3);
}

/* s as a gnuplot string: single-quoted, a quote in it doubled (gnuplot's
 * rule; nothing else is special there), so that a path or title is only
 * ever text. Control characters were refused with the path. */
static void gp_string(FILE *g, const char *s) {
    fputc('\'', g);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', g);
        fputc(*s, g);
    }
    fputc('\'', g);
}

/* gnuplot's own output goes nowhere: it draws to the file, and on stdout
 * (where it would put the image when the file cannot be written) it would
 * break --json; its messages still reach stderr. */
FILE *replay_plot_open(const char *path, const char *title, const char *xlabel, const char *ylabel) {
    FILE *g = popen("gnuplot >/dev/null", "w");
    if (g == NULL) return NULL;
    fputs("set terminal png size 900,560\nset output ", g);
    gp_string(g, path);
    fputs("\nset title ", g);
    gp_string(g, title);
    fprintf(g, "\nset xlabel '%s (log scale)'\nset logscale x\nset ylabel '%s'\nset yrange [0:1]\nset grid\n"
               "set key left top\n", xlabel, ylabel);
    return g;
}

/* --plot PATH: a file that can be written, checked before the run (which
 * may take long) and without creating it. */
static int plot_path_ok(cli_t *c, const char *path) {
    c->flag = "--plot";
    for (const char *p = path; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) return cli_error(c, "the path holds a control character");
    const char *slash = strrchr(path, '/');
    char dir[4096];
    snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash == path ? 1 : slash - path) : 1, slash ? path : ".");
    struct stat st;
    if (*path == 0 || (slash && slash[1] == 0) || (stat(path, &st) == 0 && S_ISDIR(st.st_mode)))
        return cli_error(c, "'%s' is a directory, not a PNG file's path", path);
    if (access(dir, W_OK | X_OK) != 0) return cli_error(c, "cannot write in '%s': %s", dir, strerror(errno));
    if (stat(path, &st) == 0 && access(path, W_OK) != 0) return cli_error(c, "cannot write '%s': %s", path, strerror(errno));
    return 0;
}

/* Each tier's hit rate, and all of them together, over the L1 capacities
 * of a sweep (a log-scaled axis). */
static int plot(const char *path, const result_t *res, size_t n, const char *policy, bool l3) {
    char head[160];
    snprintf(head, sizeof(head), "kvtier replay, policy %s: hit rate by tier vs L1 capacity", policy);
    FILE *g = replay_plot_open(path, head, "L1 pages", "hit rate");
    if (g == NULL) return -1;
    const char *title[] = {"all tiers", "L1", "L2", "L3"};
    int lines = l3 ? 4 : 3;
    fputs("plot", g);
    for (int i = 0; i < lines; i++) fprintf(g, "%s '-' using 1:2 with linespoints title '%s'", i ? "," : "", title[i]);
    fputc('\n', g);
    for (int pass = 0; pass < lines; pass++) {
        for (size_t i = 0; i < n; i++) {
            const kvt_cache_stats_t *s = &res[i].cs;
            uint64_t tier[] = {0, s->l1_hit_tokens, s->l2_hit_tokens, s->l3_hit_tokens};
            fprintf(g, "%" PRIu64 " %.6f\n", res[i].l1_pages, pass == 0 ? hit_rate(&res[i]) : frac(tier[pass], s->tokens));
        }
        fputs("e\n", g);
    }
    return pclose(g) == 0 ? 0 : -1;
}

/* --data maps (L1 + L2) x page bytes: refuse what this machine cannot hold. */
int replay_check_data_size(cli_t *c, const opts_t *o, const uint64_t *l1, size_t n) {
    c->flag = "--data";
    if (o->l2_pages == 0) return cli_error(c, "needs an L2 tier (--l2-pages > 0)");
    double mem = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    for (size_t i = 0; i < n; i++) {
        if (l1[i] == UNBOUNDED) return cli_error(c, "needs a bounded L1 (--l1-pages N)");
        double need = (double)(l1[i] + o->l2_pages) * (double)o->bpt * (double)o->page_tokens;
        if (need > 0.6 * mem)
            return cli_error(c, "%.1f GiB of pages (L1 %" PRIu64 " + L2 %" PRIu64 " pages of %.1f KiB) is more than 60%% of "
                                "this machine's %.1f GiB; use fewer pages or a smaller --bytes-per-token",
                             need / 1073741824.0, l1[i], o->l2_pages, (double)o->bpt * (double)o->page_tokens / 1024,
                             mem / 1073741824.0);
    }
    return 0;
}

static const char USAGE[] =
    "usage: kvtier replay [TRACE.jsonl] [options]\n"
    "\n"
    "Replays a Mooncake JSONL trace (each hash_id is a block of 512 tokens) through\n"
    "the tiered cache (L1, L2 and an optional L3) and reports the hits of each tier.\n"
    "Without TRACE it replays the built-in synthetic workload (--requests, --seed).\n"
    "Every option can also be set with the environment variable shown.\n";

void replay_opts_default(opts_t *o) {
    kvt_cache_config_t d;
    kvt_cache_config_default(&d);
    *o = (opts_t){.page_tokens = d.page_tokens, .l1_pages = d.l1_pages, .l2_pages = d.l2_pages,
                  .write_hits = d.write_through_hits, .requests = 4000, .seed = 42, .l1_room = d.l1_free_room,
                  .l2_room = d.l2_free_room, .model = 0, .policy = d.policy, .write_policy = d.write_policy, .stats = 0,
                  .threads = 2};
}

size_t replay_option_rows(opts_t *o, cli_opt_t *t) {
    unsigned nm = 0;
    for (; nm < 15 && kvt_model_at(nm); nm++) model_names[nm] = kvt_model_at(nm)->name;
    for (int i = 0; i < KVT_POLICY_COUNT_; i++) policy_names[i] = kvt_policy_name((kvt_policy_t)i);
    const cli_opt_t rows[] = {
        {"page-tokens", OPT_U64, &o->page_tokens, 1, 512, 0, 0, NULL, NULL, 0, "tokens per page"},
        {"l1-pages", OPT_U64, &o->l1_pages, 1, KVT_ALLOC_MAX_PAGES, 0, 0, NULL, "unbounded", UNBOUNDED, "L1 (GPU) capacity in pages"},
        {"l2-pages", OPT_U64, &o->l2_pages, 0, KVT_ALLOC_MAX_PAGES, 0, 0, NULL, NULL, 0, "L2 (host) capacity in pages; 0: no L2"},
        {"model", OPT_CHOICE, &o->model, 0, 0, 0, 0, model_names, NULL, 0, "model preset: bytes of KV per token"},
        {"bytes-per-token", OPT_U64, &o->bytes_per_token, 0, 1u << 30, 0, 0, NULL, NULL, 0, "bytes of KV per token (overrides --model)"},
        {"policy", OPT_CHOICE, &o->policy, 0, 0, 0, 0, policy_names, NULL, 0, "eviction order"},
        {"write-policy", OPT_CHOICE, &o->write_policy, 0, 0, 0, 0, WRITE_POLICIES, NULL, 0, "when L1 pages are backed up to L2"},
        {"write-through-hits", OPT_U64, &o->write_hits, 1, 1000000, 0, 0, NULL, NULL, 0, "hits before write_through_selective backs up"},
        {"l1-free-room", OPT_DOUBLE, &o->l1_room, 0, 0, 0, 0.5, NULL, NULL, 0, "fraction of L1 kept free; 0: evict the deficit only"},
        {"l2-free-room", OPT_DOUBLE, &o->l2_room, 0, 0, 0, 0.5, NULL, NULL, 0, "fraction of L2 kept free"},
        {"limit", OPT_U64, &o->limit, 0, UINT64_MAX, 0, 0, NULL, NULL, 0, "replay only the first N requests (0: all)"},
        {"sweep", OPT_TEXT, &o->sweep, 0, 0, 0, 0, NULL, NULL, 0, "comma-separated L1 capacities (pages or 'unbounded') to compare"},
        {"plot", OPT_TEXT, &o->plot, 0, 0, 0, 0, NULL, NULL, 0, "with --sweep: draw each tier's hit rate vs capacity (log scale) to this PNG (gnuplot)"},
        {"requests", OPT_U64, &o->requests, 1, 10000000, 0, 0, NULL, NULL, 0, "synthetic workload: requests"},
        {"seed", OPT_U64, &o->seed, 0, UINT64_MAX, 0, 0, NULL, NULL, 0, "synthetic workload: seed"},
        {"check-every", OPT_U64, &o->check_every, 0, UINT64_MAX, 0, 0, NULL, NULL, 0, "run the full consistency check every N requests (0: never)"},
        {"json", OPT_FLAG, &o->json, 0, 0, 0, 0, NULL, NULL, 0, "print one JSON object"},
        {"data", OPT_FLAG, &o->data, 0, 0, 0, 0, NULL, NULL, 0, "move real bytes: L1 arena, L2 host memory, the transfer engine"},
        {"verify", OPT_FLAG, &o->verify, 0, 0, 0, 0, NULL, NULL, 0, "with --data: check every page served from L1 or loaded from L2"},
        {"layout", OPT_CHOICE, &o->layout, 0, 0, 0, 0, LAYOUTS, NULL, 0, "with --data: how the tiers lay pages out"},
        {"layers", OPT_U64, &o->layers_opt, 0, 1024, 0, 0, NULL, NULL, 0, "with --data: layers a page is cut into (0: the model's; 1 with --bytes-per-token)"},
        {"threads", OPT_U64, &o->threads, 1, 64, 0, 0, NULL, NULL, 0, "with --data: transfer workers per destination tier"},
        {"stats", OPT_CHOICE, &o->stats, 0, 0, 0, 0, FORMATS, NULL, 0, "also write the cache's and the tree's counters to stderr"},
        {"soak", OPT_DOUBLE, &o->soak_s, 0, 0, 0, 864000, NULL, NULL, 0,
         "replay the trace again and again on the same cache for this many seconds (a burn-in); memory, descriptors and threads are sampled after the first pass, the first past half the time, and the last"},
#ifdef KVT_TESTING /* kvtier-test only: the testing library's copy faults */
        {"copy-faults", OPT_DOUBLE, &o->copy_faults, 0, 0, 0, 0.5, NULL, NULL, 0,
         "with --data: each copy fails with this probability, and is delayed (up to 1 ms) with it (fault injection)"},
#endif
    };
    size_t n = sizeof(rows) / sizeof(rows[0]);
    memcpy(t, rows, sizeof(rows));
    return n;
}

int replay_opts_finish(cli_t *c, opts_t *o, const opts_t *d) {
    const kvt_model_t *model = kvt_model_at((unsigned)o->model);
    o->bpt = o->bytes_per_token ? o->bytes_per_token : model->bytes_per_token;
    o->layers = o->layers_opt ? (uint32_t)o->layers_opt : o->bytes_per_token ? 1 : model->layers;
    if ((o->groups == NULL || o->bytes_per_token) && o->bpt % o->layers != 0) { /* (else the groups' check) */
        c->flag = "--layers";
        return cli_error(c, "%" PRIu64 " bytes per token do not split into %u layers", o->bpt, o->layers);
    }
    if (o->verify && !o->data) {
        c->flag = "--verify";
        return cli_error(c, "needs --data");
    }
    const cli_idle_t idle[] = {
        {"--layout", o->layout != d->layout && !o->data, "needs --data (it lays out the tiers' bytes)"},
        {"--layers", o->layers_opt != 0 && !o->data, "needs --data (it cuts the tiers' pages)"},
        {"--threads", o->threads != d->threads && !o->data, "needs --data (the transfer engine's workers)"},
        {"--write-through-hits", o->write_hits != d->write_hits && o->write_policy != KVT_WRITE_THROUGH_SELECTIVE,
         "only with --write-policy write_through_selective"},
    };
    if (cli_refuse_idle(c, idle, sizeof(idle) / sizeof(idle[0])) != 0) return -1;
#ifdef KVT_TESTING
    if (o->copy_faults > 0 && !o->data) {
        c->flag = "--copy-faults";
        return cli_error(c, "needs --data");
    }
#endif
    return 0;
}

int replay_workload_ok(cli_t *c, const opts_t *o, const opts_t *d, const char *path) {
    const cli_idle_t idle[] = {
        {"--requests", path && o->requests != d->requests,
         "shapes the built-in synthetic workload: not with a trace (--limit takes its first N requests)"},
        {"--seed", path && o->seed != d->seed, "shapes the built-in synthetic workload: not with a trace"},
    };
    return cli_refuse_idle(c, idle, sizeof(idle) / sizeof(idle[0]));
}

int replay_load(const char *cmd, const char *path, const opts_t *o, kvt_trace_t *t, double *parse_s) {
    char err[512];
    double t0 = now_s();
    if (path) {
        if (kvt_trace_load(path, t, err, sizeof(err)) != 0) {
            fprintf(stderr, "%s: %s\n", cmd, err);
            return -1;
        }
    } else {
        workload_params_t wp;
        workload_default(&wp);
        wp.requests = o->requests;
        wp.seed = o->seed;
        if (workload_generate(&wp, t) != 0) {
            fprintf(stderr, "%s: out of memory building the workload\n", cmd);
            return -1;
        }
    }
    *parse_s = now_s() - t0;
    return 0;
}

void replay_cache_config(const opts_t *o, uint64_t l1_pages, kvt_cache_config_t *cfg) {
    kvt_cache_config_default(cfg);
    cfg->page_tokens = (uint32_t)o->page_tokens;
    cfg->l1_pages = l1_pages;
    cfg->l2_pages = o->l2_pages;
    cfg->l1_free_room = o->l1_room;
    cfg->l2_free_room = o->l2_room;
    cfg->policy = (kvt_policy_t)o->policy;
    cfg->write_policy = (kvt_write_policy_t)o->write_policy;
    cfg->write_through_hits = (uint32_t)o->write_hits;
    cfg->decision_digest = o->digest;
}

static bool hybrid_on(const hybrid_opts_t *h) {
    for (uint32_t g = 0; g < h->ngroups; g++)
        if (h->groups[g].kind != KVT_GROUP_FULL) return true;
    return false;
}

/* The layer groups: --groups, else the preset's. A hybrid model's replay
 * holds the model as all-full attention at o->bpt for the comparison: the groups' all-full bytes per token (each
 * state layer at its full groups' per-layer width) unless
 * --bytes-per-token says otherwise. -1 after printing why. */
#define GROUP_FORMS                                                                                                    \
    "full:LAYERS:BYTES, window:W:LAYERS:BYTES or state:LAYERS:BYTES (W 1..4294967295 tokens, LAYERS 1..65536, "       \
    "BYTES a layer and token 1..2^40)"

static int replay_groups(cli_t *c, opts_t *o, const char *text, hybrid_opts_t *h) {
    uint32_t bad = 0;
    int rc = text ? kvt_model_parse_groups(text, h->groups, KVT_MODEL_MAX_GROUPS, &h->ngroups, &bad)
                  : kvt_model_groups(kvt_model_at((unsigned)o->model), h->groups, KVT_MODEL_MAX_GROUPS, &h->ngroups);
    c->flag = "--groups";
    if (rc == KVT_ERANGE) return cli_error(c, "at most %d groups", KVT_MODEL_MAX_GROUPS);
    if (rc != KVT_OK) {
        if (bad >= 1 && strchr(text, ':')) {
            const char *s = text;
            for (uint32_t i = 0; i < bad && s; i++) s = strchr(s, ',') ? strchr(s, ',') + 1 : NULL;
            if (s != NULL && *s == '\0' && bad > 0)
                return cli_error(c, "'%s' ends with ',': group %u is empty", text, bad + 1);
            if (s == NULL || *s == '\0')
                return cli_error(c, "'%s' has no full group (the prefix tree holds the full groups' pages)", text);
            return cli_error(c, "group %u ('%.*s') is not %s", bad + 1, (int)strcspn(s, ","), s, GROUP_FORMS);
        }
        if (strchr(text, ':')) return cli_error(c, "group 1 ('%.*s') is not %s", (int)strcspn(text, ","), text, GROUP_FORMS);
        return cli_error(c, "'%s' is neither a preset (kvtier replay --help lists them) nor a group list", text);
    }
    if (text && !o->bytes_per_token) { /* the model's bytes per token and layers as all-full attention, as a preset's */
        uint64_t per_token = 0, full_layers = 0, full_bytes = 0, state_layers = 0, state_as_full = 0, layers = 0;
        bool over = false;
        for (uint32_t g = 0; g < h->ngroups; g++) {
            if (h->groups[g].kind != KVT_GROUP_STATE) over |= __builtin_add_overflow(per_token, h->groups[g].bytes, &per_token);
            else state_layers += h->groups[g].layers;
            if (h->groups[g].kind == KVT_GROUP_FULL) full_layers += h->groups[g].layers, full_bytes += h->groups[g].bytes;
            layers += h->groups[g].layers;
        }
        over |= __builtin_mul_overflow(state_layers, full_bytes / full_layers, &state_as_full) ||
                __builtin_add_overflow(per_token, state_as_full, &o->bpt) || o->bpt > UINT64_MAX / o->page_tokens;
        if (over) return cli_error(c, "'%s': a page of %" PRIu64 " tokens would hold more than 2^64 bytes", text, o->page_tokens);
        if (!o->layers_opt) /* its layers cut --data's pages, where they split the bytes evenly (else one cut) */
            o->layers = layers <= UINT32_MAX && o->bpt % layers == 0 ? (uint32_t)layers : 1;
        if (o->bpt % o->layers != 0) {
            c->flag = "--layers";
            return cli_error(c, "%" PRIu64 " bytes per token do not split into %u layers", o->bpt, o->layers);
        }
    }
    if (!hybrid_on(h)) return 0;
    if (o->stats) { /* it would write the all-full comparison's counters, unlabelled */
        c->flag = "--stats";
        return cli_error(c, "not with a hybrid model: its counters are in --json (runs[].hybrid.stats)");
    }
    return 0;
}

int cmd_replay(int argc, char **argv) {
    opts_t o;
    replay_opts_default(&o);
    const opts_t defaults = o;
    l3_opts_t l3;
    replay_l3_default(&l3);
    cli_opt_t table[MAX_ROWS];
    size_t nrows = replay_option_rows(&o, table);
    table[nrows++] = (cli_opt_t){"digest", OPT_FLAG, &o.digest, 0, 0, 0, 0, NULL, NULL, 0,
                                 "keep the cache's decision digest and print it (decision_digest): two runs decided alike exactly when they agree on it"};
    const char *groups_text = NULL;
    uint64_t every = 0, copy_lag = 0;
    double state_share = KVT_HYBRID_STATE_SHARE, window_weight = 0, l3_window_weight = 0;
    table[nrows++] = (cli_opt_t){"groups", OPT_TEXT, &groups_text, 0, 0, 0, 0, NULL, NULL, 0,
                                 "the model's layer groups: a preset's name, or full:LAYERS:BYTES,window:W:LAYERS:BYTES,"
                                 "state:LAYERS:BYTES (BYTES per token per layer; per layer for state); default: --model's. "
                                 "With window or state groups the replay runs the hybrid cache (docs/hybrid.md)"};
    table[nrows++] = (cli_opt_t){"checkpoint-every", OPT_U64, &every, 0, 1u << 20, 0, 0, NULL, NULL, 0,
                                 "hybrid models: a kept point (state checkpoint) every N pages, beside request ends and "
                                 "branch points; 0: none"};
    table[nrows++] = (cli_opt_t){"state-share", OPT_DOUBLE, &state_share, 0, 0, 0.01, 0.99, NULL, NULL, 0,
                                 "hybrid models: the fraction of each tier's bytes for state checkpoints"};
    table[nrows++] = (cli_opt_t){"window-weight", OPT_DOUBLE, &window_weight, 0, 0, 0, 16, NULL, NULL, 0,
                                 "hybrid models: a window group's bytes per token count this much in the split; "
                                 "0: 0.125, or 1 with an L3 (hybrid.h)"};
    table[nrows++] = (cli_opt_t){"l3-window-weight", OPT_DOUBLE, &l3_window_weight, 0, 0, 0, 16, NULL, NULL, 0,
                                 "hybrid models: --window-weight for the L3's split alone; 0: --window-weight if "
                                 "given, else 0.25"};
    table[nrows++] = (cli_opt_t){"copy-lag", OPT_U64, &copy_lag, 0, 1u << 20, 0, 0, NULL, NULL, 0,
                                 "hybrid models: the window pages' and checkpoints' copies land this many requests "
                                 "after they are handed out (a request waits for its own loads); 0: at once"};
    nrows += replay_l3_rows(&l3, table + nrows);
    table[nrows] = (cli_opt_t){NULL, 0, NULL, 0, 0, 0, 0, NULL, NULL, 0, NULL};
    cli_t c;
    cli_init(&c, "kvtier replay", argc, argv);
    const char *path;
    int prc = cli_parse_table(&c, table, USAGE, &path);
    if (prc > 0) { /* after the options: what each policy does */
        fputs("\npolicies:\n", stdout);
        for (int i = 0; i < KVT_POLICY_COUNT_; i++)
            printf("  %-9s %s\n", kvt_policy_name((kvt_policy_t)i), kvt_policy_describe((kvt_policy_t)i));
    }
    if (prc) return prc > 0 ? 0 : 2;

    uint64_t sweep[MAX_SWEEP];
    size_t nsweep = 0;
    if (o.sweep) {
        char buf[512];
        c.flag = "--sweep";
        if (strlen(o.sweep) >= sizeof(buf))
            return cli_usage(&c, "a list of %zu characters: at most %zu", strlen(o.sweep), sizeof(buf) - 1);
        snprintf(buf, sizeof(buf), "%s", o.sweep);
        for (char *rest = buf, *tok; (tok = strsep(&rest, ",")) != NULL;) { /* (strtok would skip empty elements) */
            uint64_t v = 0;
            bool bad = cli_parse_u64(tok, &v) != 0;
            if (nsweep == MAX_SWEEP) return cli_usage(&c, "at most %d capacities", MAX_SWEEP);
            if (strcmp(tok, "unbounded") == 0) sweep[nsweep++] = UNBOUNDED;
            else if (bad || v == 0 || v > KVT_ALLOC_MAX_PAGES)
                return cli_usage(&c, "'%s' is not a capacity in [1, %u] or 'unbounded'", tok, KVT_ALLOC_MAX_PAGES);
            else sweep[nsweep++] = v;
        }
        if (nsweep == 0) return cli_usage(&c, "expected a comma-separated list of capacities");
    }
    if (nsweep && o.l1_pages != defaults.l1_pages && !cli_from_env(&c, "--l1-pages")) {
        c.flag = "--l1-pages";
        return cli_usage(&c, "not with --sweep: the sweep gives L1's sizes");
    }
    if (o.plot && !o.sweep) {
        c.flag = "--plot";
        cli_error(&c, "needs --sweep");
        return 2;
    }
    if (o.plot && plot_path_ok(&c, o.plot) != 0) return 2;

    if (groups_text && o.model != defaults.model) { /* --groups describes the model in full */
        if (cli_from_env(&c, "--groups") && !cli_from_env(&c, "--model")) {
            groups_text = NULL; /* the command line wins over the environment */
        } else if (!cli_from_env(&c, "--model")) {
            c.flag = "--model";
            return cli_usage(&c, "not with --groups: the groups describe the model in full");
        }
    }
    o.groups = groups_text; /* (its layers and bytes per token: replay_groups, below) */
    if (replay_opts_finish(&c, &o, &defaults) != 0 || replay_l3_finish(&c, &l3, nsweep > 0) != 0 ||
        replay_workload_ok(&c, &o, &defaults, path) != 0)
        return 2;
    if (o.soak_s > 0 && (nsweep || l3.instances > 1)) {
        c.flag = "--soak";
        return cli_usage(&c, "one cache only: not with --sweep or --instances");
    }
    if (o.stats && (nsweep || l3.instances > 1)) { /* one exposition a cache: a second HELP for every family */
        c.flag = "--stats";
        return cli_usage(&c, "one cache only: not with --sweep or --instances (their counters are in --json)");
    }
    if (o.data && copy_lag) {
        c.flag = "--copy-lag";
        return cli_usage(&c, "not with --data: the copies land when they do");
    }
    if (o.data && l3.pages) {
        c.flag = "--l3-pages";
        return cli_usage(&c, "not with --data: a modeled L3 holds no bytes (--l3 URL: a real store)");
    }
    if (replay_l3_on(&l3) && o.l2_pages == 0) {
        c.flag = l3.url ? "--l3" : "--l3-pages";
        return cli_usage(&c, "needs an L2 tier (--l2-pages > 0): pages reach L3 through L2");
    }
    if (l3_window_weight > 0 && l3.pages == 0) {
        c.flag = "--l3-window-weight";
        return cli_usage(&c, "needs a modeled L3 (--l3-pages) to split between the groups; a store (--l3 URL) keeps "
                             "its own room");
    }
    /* the weights 0 stand for hybrid.h's defaults, which depend on an L3 */
    double ww = window_weight > 0             ? window_weight
              : l3.pages || l3.url ? KVT_HYBRID_WINDOW_WEIGHT_OVER_L3
                                   : KVT_HYBRID_WINDOW_WEIGHT;
    double w3 = l3_window_weight > 0 ? l3_window_weight : window_weight > 0 || !l3.pages ? ww : KVT_HYBRID_L3_WINDOW_WEIGHT;
    hybrid_opts_t hyb = {.name = groups_text ? groups_text : kvt_model_at((unsigned)o.model)->name, .every = (uint32_t)every,
                         .state_share = state_share, .window_weight = ww, .l3_window_weight = w3, .copy_lag = copy_lag};
    if (replay_groups(&c, &o, groups_text, &hyb) != 0) return 2;
    if (!hybrid_on(&hyb)) { /* the options that only a hybrid model's replay reads */
        static const char ONLY[] = "only with a hybrid model (window or state groups: --groups, or a hybrid --model)";
        const cli_idle_t only[] = {
            {"--checkpoint-every", every != 0, ONLY},
            {"--state-share", state_share != KVT_HYBRID_STATE_SHARE, ONLY},
            {"--window-weight", window_weight != 0, ONLY},
            {"--l3-window-weight", l3_window_weight != 0, ONLY},
            {"--copy-lag", copy_lag != 0, ONLY},
        };
        if (cli_refuse_idle(&c, only, sizeof(only) / sizeof(only[0])) != 0) return 2;
    } else { /* ... and those that only some groups read */
        bool window = false, state = false;
        for (uint32_t g = 0; g < hyb.ngroups; g++)
            window |= hyb.groups[g].kind == KVT_GROUP_WINDOW, state |= hyb.groups[g].kind == KVT_GROUP_STATE;
        const cli_idle_t some[] = {
            {"--state-share", state_share != KVT_HYBRID_STATE_SHARE && !state, "only with a state group (the model has none)"},
            {"--window-weight", window_weight != 0 && !window, "only with a window group (the model has none)"},
            {"--l3-window-weight", l3_window_weight != 0 && !window, "only with a window group (the model has none)"},
        };
        if (cli_refuse_idle(&c, some, sizeof(some) / sizeof(some[0])) != 0) return 2;
        if (replay_hybrid_sizes(&c, &o, &l3, &hyb, nsweep ? sweep : &o.l1_pages, nsweep ? nsweep : 1) != 0) return 2;
    }
    uint64_t bpt = o.bpt;
    const char *model_name = o.bytes_per_token ? "(--bytes-per-token)" : o.groups ? o.groups : kvt_model_at((unsigned)o.model)->name;
    if (o.data && replay_check_data_size(&c, &o, nsweep ? sweep : &o.l1_pages, nsweep ? nsweep : 1) != 0) return 2;
    if (cli_parse_only) return 0;

    kvt_trace_t t;
    double parse_s;
    if (replay_load("kvtier replay", path, &o, &t, &parse_s) != 0) return 1;
    const char *name = path ? path : "built-in synthetic workload";

    if (hybrid_on(&hyb)) {
        int hrc = replay_hybrid(&t, &o, &l3, &hyb, nsweep ? sweep : &o.l1_pages, nsweep ? nsweep : 1, name, parse_s);
        kvt_trace_free(&t);
        return hrc == 0 ? 0 : 1;
    }
    size_t nrun = nsweep ? nsweep : 1, nfleet = l3.instances > 1 ? l3.instances : 0;
    result_t *res = calloc(nrun + nfleet, sizeof(result_t)), *each = res + 1;
    int rc = res ? 0 : -1;
    if (nfleet && rc == 0) rc = replay_fleet(&t, &o, &l3, each, &res[0]);
    for (size_t i = 0; i < nrun && rc == 0 && !nfleet; i++)
        rc = replay_run_one(&t, &o, &l3, nsweep ? sweep[i] : o.l1_pages, NULL, 0, &res[i]);
    if (rc == 0 && o.json) {
        cJSON *root = nsweep ? cJSON_CreateObject() : result_json(&res[0], &o, &l3, bpt);
        cJSON_AddStringToObject(root, "trace", name);
        cJSON_AddNumberToObject(root, "parse_s", parse_s);
        if (nsweep) {
            cJSON *arr = cJSON_AddArrayToObject(root, "sweep");
            for (size_t i = 0; i < nsweep; i++) cJSON_AddItemToArray(arr, result_json(&res[i], &o, &l3, bpt));
        }
        if (nfleet) { /* the fleet: totals above, each instance below */
            cJSON_AddNumberToObject(root, "cross_instance_hit_tokens", (double)res[0].cs.l3_foreign_hit_tokens);
            cJSON *arr = cJSON_AddArrayToObject(root, "instances");
            for (size_t i = 0; i < nfleet; i++) {
                cJSON *x = result_json(&each[i], &o, &l3, bpt);
                cJSON_AddNumberToObject(x, "instance", (double)i);
                cJSON_AddNumberToObject(x, "requests_replayed", (double)each[i].nreq);
                cJSON_AddNumberToObject(x, "cross_instance_hit_tokens", (double)each[i].cs.l3_foreign_hit_tokens);
                cJSON_AddItemToArray(arr, x);
            }
        }
        cli_print_json(root);
    } else if (rc == 0) {
        printf("kvtier replay: %s: %zu requests, %" PRIu64 " input tokens (read in %.3f s)\n", name, t.n,
               t.input_tokens, parse_s);
        if (nfleet) {
            char shown[1024]; /* the store's URL, never its password */
            kvt_store_url_redact(l3.url, shown, sizeof(shown));
            printf("  %zu instances %s%s; requests dealt by session (a turn that extends an earlier request "
                   "follows it), round robin\n", nfleet, l3.url ? "sharing " : "with no shared store", shown);
            for (size_t i = 0; i < nfleet; i++) {
                const kvt_cache_stats_t *s = &each[i].cs;
                printf("  instance %zu: %" PRIu64 " requests, hit rate %.4f (L1 %.4f, L2 %.4f, L3 %.4f), %" PRIu64
                       " L3 hit tokens from pages another instance put\n",
                       i, each[i].nreq, hit_rate(&each[i]), frac(s->l1_hit_tokens, s->tokens), frac(s->l2_hit_tokens, s->tokens),
                       frac(s->l3_hit_tokens, s->tokens), s->l3_foreign_hit_tokens);
            }
            printf("  all instances:\n");
        }
        if (!nsweep) {
            print_summary(&res[0], &o, &l3, bpt, model_name);
        } else {
            printf("  policy %s, %s, page %" PRIu64 " tokens, L2 %" PRIu64 " pages, free room %.0f%% / %.0f%%\n",
                   kvt_policy_name((kvt_policy_t)o.policy), WRITE_POLICIES[o.write_policy], o.page_tokens, o.l2_pages,
                   100 * o.l1_room, 100 * o.l2_room);
            printf("%12s %10s %9s %9s %9s %9s %14s %9s%s\n", "L1 pages", "L1 GB", "hit rate", "L1", "L2", "L3",
                   "evicts/1k alloc", "wall s", o.digest ? "  decision digest" : "");
            for (size_t i = 0; i < nsweep; i++) {
                const result_t *r = &res[i];
                char digest[24] = "";
                if (o.digest) snprintf(digest, sizeof(digest), "  %016" PRIx64, r->digest);
                printf("%12" PRIu64 " %10.1f %9.4f %9.4f %9.4f %9.4f %14.1f %9.3f%s\n", r->l1_pages, gb(r->l1_pages, &o, bpt),
                       hit_rate(r), frac(r->cs.l1_hit_tokens, r->cs.tokens), frac(r->cs.l2_hit_tokens, r->cs.tokens),
                       frac(r->cs.l3_hit_tokens, r->cs.tokens), per_1k(r->cs.l1_evict_calls, r->cs.l1_allocs), r->wall_s,
                       digest);
            }
        }
    }
    for (size_t i = 0; rc == 0 && o.verify && i < nrun; i++) /* the output is whole; the run failed */
        if (res[i].data.mismatches) {
            fprintf(stderr, "kvtier replay: --verify: %" PRIu64 " pages differed from their content\n", res[i].data.mismatches);
            rc = -1;
        }
    if (rc == 0 && o.plot && plot(o.plot, res, nsweep, kvt_policy_name((kvt_policy_t)o.policy), replay_l3_on(&l3)) != 0) {
        fprintf(stderr, "kvtier replay: --plot: gnuplot failed or is not installed (apt-get install gnuplot-nox)\n");
        rc = -1;
    }
    free(res);
    kvt_trace_free(&t);
    return rc == 0 ? 0 : rc == -2 ? 2 : 1;
}
