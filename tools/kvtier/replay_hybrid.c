/* kvtier replay on a hybrid model (--model with window or state groups, or
 * --groups): the trace through kvt_hybrid at each L1 size, beside the two
 * ways a cache that knows no groups could hold the same model in the same
 * bytes — every layer kept as full attention (the radix cache, the model's
 * all-full bytes per token), and state checkpoints at request ends only. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kvtier/error.h"
#include "kvtier/hybrid.h"
#include "kvtier/radix.h"
#include "kvtier/stats.h"
#include "replay_hybrid.h"
#include "replay_run.h"

typedef struct {
    kvt_hybrid_stats_t st;
    kvt_hybrid_group_bytes_t gb[KVT_MODEL_MAX_GROUPS];
    double wall_s;
    uint64_t moves, outstanding_most; /* --copy-lag: moves run, and most outstanding at once */
} hyb_result_t;

/* --copy-lag: the engine's copies (async_moves), each reported landed lag
 * requests after it was handed out; an admission's own loads are waited
 * for, the oldest copies first, as an engine waits before it computes. */
typedef struct {
    kvt_hybrid_move_t *mv;
    uint64_t *at; /* the request that took it */
    size_t head, n, cap;
    uint8_t *ok;
} lag_t;

static void lag_free(lag_t *q) {
    free(q->mv);
    free(q->at);
    free(q->ok);
}

static int lag_take(kvt_hybrid_t *c, lag_t *q, uint64_t now) {
    for (size_t want; (want = kvt_hybrid_moves(c)) > 0;) {
        if (q->head > 0 && q->head >= q->n / 2) { /* the reported half goes: the queue holds what is in flight */
            memmove(q->mv, q->mv + q->head, (q->n - q->head) * sizeof(*q->mv));
            memmove(q->at, q->at + q->head, (q->n - q->head) * sizeof(*q->at));
            q->n -= q->head;
            q->head = 0;
        }
        if (q->n + want > q->cap) {
            size_t cap = q->cap ? q->cap : 1024;
            while (cap < q->n + want) cap *= 2;
            kvt_hybrid_move_t *mv = realloc(q->mv, cap * sizeof(*mv));
            if (mv) q->mv = mv;
            uint64_t *at = realloc(q->at, cap * sizeof(*at));
            if (at) q->at = at;
            uint8_t *ok = realloc(q->ok, cap);
            if (ok) q->ok = ok;
            if (!mv || !at || !ok) return KVT_ENOMEM;
            memset(q->ok, 1, cap);
            q->cap = cap;
        }
        size_t got = kvt_hybrid_take_moves(c, q->mv + q->n, want);
        for (size_t i = 0; i < got; i++) q->at[q->n + i] = now;
        q->n += got;
    }
    return KVT_OK;
}

/* Reports the oldest copies, those taken by request upto or before. */
static int lag_report(kvt_hybrid_t *c, lag_t *q, uint64_t upto, hyb_result_t *out) {
    size_t k = q->head;
    while (k < q->n && q->at[k] <= upto) k++;
    if (k == q->head) return KVT_OK;
    int rc = kvt_hybrid_moves_done(c, q->mv + q->head, k - q->head, q->ok);
    out->moves += k - q->head;
    q->head = k;
    return rc;
}

static double frac(uint64_t x, uint64_t of) { return of ? (double)x / (double)of : 0; }

/* The bytes of one tier: pages of the all-full model. */
static uint64_t tier_bytes(const opts_t *o, uint64_t pages) { return pages * o->page_tokens * o->bpt; }

/* --l1-pages unbounded: every page of the trace. */
static uint64_t l1_of(const kvt_trace_t *t, const opts_t *o, uint64_t l1) {
    if (l1 != UNBOUNDED) return l1;
    uint64_t n = o->limit && o->limit < t->n ? o->limit : t->n, p = 0;
    for (uint64_t i = 0; i < n; i++) p += t->req[i].input_length / o->page_tokens;
    return p ? p : 1;
}

/* l1_pages UNBOUNDED: every group's L1 holds every page (and checkpoint) of
 * the trace. */
static int run_hybrid(const kvt_trace_t *t, const opts_t *o, const l3_opts_t *l3, const hybrid_opts_t *h, uint64_t l1_pages,
                      uint32_t every, bool branches, hyb_result_t *out) {
    kvt_hybrid_config_t cfg;
    uint64_t all = l1_of(t, o, UNBOUNDED);
    uint64_t b1 = tier_bytes(o, l1_of(t, o, l1_pages)), b2 = tier_bytes(o, o->l2_pages), b3 = tier_bytes(o, l3->pages);
    int rc = kvt_hybrid_config_default(&cfg, h->groups, h->ngroups, (uint32_t)o->page_tokens, b1, b2, b3);
    if (rc == KVT_OK) rc = kvt_hybrid_config_split(&cfg, b1, b2, b3, h->state_share, h->window_weight);
    if (rc == KVT_OK && b3) rc = kvt_hybrid_config_split_tier(&cfg, 3, b3, h->state_share, h->l3_window_weight);
    if (rc != KVT_OK) {
        fprintf(stderr, "kvtier replay: L1 %.2f GB, L2 %.2f GB, L3 %.2f GB: a tier cannot hold one page or checkpoint of each "
                        "group\n", (double)b1 / 1e9, (double)b2 / 1e9, (double)b3 / 1e9);
        return -1;
    }
    kvt_cache_config_t base;
    replay_cache_config(o, cfg.cache.l1_pages, &base);
    replay_l3_config(l3, &base);
    base.l2_pages = cfg.cache.l2_pages;
    base.l3_pages = cfg.cache.l3_pages;
    cfg.cache = base;
    /* the slots have no hit counts: a selective write is a plain one for them */
    if (cfg.cache.write_policy == KVT_WRITE_THROUGH_SELECTIVE) cfg.cache.write_policy = KVT_WRITE_THROUGH;
    if (cfg.cache.l3_write_policy == KVT_WRITE_THROUGH_SELECTIVE) cfg.cache.l3_write_policy = KVT_WRITE_THROUGH;
    cfg.checkpoint_every = every;
    cfg.checkpoint_branches = branches;
    cfg.moves = cfg.async_moves = h->copy_lag > 0;
    if (l1_pages == UNBOUNDED) {
        cfg.cache.l1_pages = all;
        for (uint32_t g = 0; g < h->ngroups; g++)
            if (h->groups[g].kind != KVT_GROUP_FULL) cfg.l1_slots[g] = all;
    }
    kvt_hybrid_t *c;
    if ((rc = kvt_hybrid_create(&c, &cfg)) != KVT_OK) {
        fprintf(stderr, "kvtier replay: cannot create the hybrid cache: %s\n", kvt_strerror(rc));
        return -1;
    }
    uint64_t n = o->limit && o->limit < t->n ? o->limit : t->n, lag = h->copy_lag;
    int32_t *tok = malloc((size_t)t->max_blocks * KVT_TRACE_BLOCK_TOKENS * sizeof(int32_t));
    rc = tok ? KVT_OK : KVT_ENOMEM;
    lag_t q = {0};
    memset(out, 0, sizeof(*out));
    double t0 = (double)kvt_now_ns() / 1e9;
    for (uint64_t i = 0; i < n && rc == KVT_OK; i++) {
        const kvt_trace_req_t *r = &t->req[i];
        for (uint32_t b = 0; b < r->nblocks; b++) kvt_trace_block_tokens(r->hash_ids[b], tok + (size_t)b * KVT_TRACE_BLOCK_TOKENS);
        kvt_hybrid_req_t req;
        uint64_t pf = 0; /* a modeled L3: the full groups' pages there are prefetched, as the radix replay's are */
        if (l3->pages) rc = kvt_cache_prefetch(kvt_hybrid_cache(c), 0, tok, r->input_length, &pf);
        if (rc == KVT_OK) rc = kvt_hybrid_admit_prefetched(c, pf, 0, tok, r->input_length, 0, NULL, &req);
        if (rc == KVT_OK && lag) rc = lag_take(c, &q, i);
        while (rc == KVT_OK && lag && kvt_hybrid_ready(c, &req) == KVT_EAGAIN) { /* its loads, and what is before them */
            rc = lag_report(c, &q, q.at[q.head], out);
            if (rc == KVT_OK) rc = lag_take(c, &q, i);
        }
        if (rc == KVT_OK) rc = kvt_hybrid_release(c, 0, tok, r->input_length, &req);
        if (rc == KVT_OK && lag) {
            rc = lag_take(c, &q, i);
            if (rc == KVT_OK && i >= lag) rc = lag_report(c, &q, i - lag, out);
            if (rc == KVT_OK) rc = lag_take(c, &q, i);
            size_t now = kvt_hybrid_moves_outstanding(c);
            if (now > out->outstanding_most) out->outstanding_most = now;
        }
        if (rc == KVT_OK && o->check_every && (i + 1) % o->check_every == 0) {
            const char *why;
            if (kvt_hybrid_check(c, &why) != KVT_OK) {
                fprintf(stderr, "kvtier replay: check failed after request %" PRIu64 ": %s\n", i + 1, why);
                rc = KVT_ECORRUPT;
            }
        }
        if (rc != KVT_OK && rc != KVT_ECORRUPT)
            fprintf(stderr, "kvtier replay: request %" PRIu64 ": %s\n", i + 1, kvt_strerror(rc));
    }
    while (rc == KVT_OK && lag && (q.head < q.n || kvt_hybrid_moves(c))) { /* the copies still in flight land */
        rc = lag_report(c, &q, UINT64_MAX, out);
        if (rc == KVT_OK) rc = lag_take(c, &q, n);
    }
    lag_free(&q);
    out->wall_s = (double)kvt_now_ns() / 1e9 - t0;
    out->st.size = sizeof(out->st);
    kvt_hybrid_stats(c, &out->st);
    for (uint32_t g = 0; g < h->ngroups; g++) kvt_hybrid_group_bytes(c, g, &out->gb[g]);
    free(tok);
    kvt_hybrid_destroy(c);
    return rc == KVT_OK ? 0 : -1;
}

static double hyb_rate(const hyb_result_t *r) { return frac(r->st.hit_tokens, r->st.tokens); }
static double hyb_bpt(const hyb_result_t *r) { return frac(r->st.l1_bytes + r->st.l2_bytes, r->st.cached_tokens); }
static double full_rate(const result_t *r) {
    return frac(r->cs.l1_hit_tokens + r->cs.l2_hit_tokens + r->cs.l3_hit_tokens, r->cs.tokens);
}
static double full_bpt(const result_t *r, const opts_t *o) {
    uint64_t used = (r->l1_pages - r->cs.l1_free) + (o->l2_pages ? o->l2_pages - r->cs.l2_free : 0);
    return frac(used * o->page_tokens * o->bpt, r->rs.pages * o->page_tokens);
}

static cJSON *hyb_json(const hyb_result_t *r, const hybrid_opts_t *h) {
    cJSON *x = cJSON_CreateObject();
    cJSON_AddNumberToObject(x, "hit_rate", hyb_rate(r));
    cJSON_AddNumberToObject(x, "l1_hit_rate", frac(r->st.l1_hit_tokens, r->st.tokens));
    cJSON_AddNumberToObject(x, "l2_hit_rate", frac(r->st.l2_hit_tokens, r->st.tokens));
    cJSON_AddNumberToObject(x, "l3_hit_rate", frac(r->st.l3_hit_tokens, r->st.tokens));
    cJSON_AddNumberToObject(x, "full_groups_hit_rate", frac(r->st.full_hit_tokens, r->st.tokens));
    cJSON_AddNumberToObject(x, "bytes_per_cached_token", hyb_bpt(r));
    cJSON_AddNumberToObject(x, "wall_s", r->wall_s);
    if (h->copy_lag) {
        cJSON_AddNumberToObject(x, "moves", (double)r->moves);
        cJSON_AddNumberToObject(x, "moves_outstanding_most", (double)r->outstanding_most);
    }
    cJSON *st = cJSON_AddObjectToObject(x, "stats");
#define J_(name, kind, help) cJSON_AddNumberToObject(st, #name, (double)r->st.name);
    KVT_HYBRID_STATS_FIELDS(J_)
#undef J_
    cJSON *groups = cJSON_AddArrayToObject(x, "groups");
    for (uint32_t g = 0; g < h->ngroups; g++) {
        cJSON *y = cJSON_CreateObject();
        cJSON_AddStringToObject(y, "kind", kvt_group_kind_name((kvt_group_kind_t)h->groups[g].kind));
        cJSON_AddNumberToObject(y, "l1_bytes", (double)r->gb[g].bytes[0]);
        cJSON_AddNumberToObject(y, "l2_bytes", (double)r->gb[g].bytes[1]);
        cJSON_AddNumberToObject(y, "l3_bytes", (double)r->gb[g].bytes[2]);
        cJSON_AddItemToArray(groups, y);
    }
    return x;
}

static cJSON *full_json(const result_t *r, const opts_t *o) {
    cJSON *x = cJSON_CreateObject();
    cJSON_AddNumberToObject(x, "hit_rate", full_rate(r));
    cJSON_AddNumberToObject(x, "bytes_per_cached_token", full_bpt(r, o));
    cJSON_AddNumberToObject(x, "wall_s", r->wall_s);
    return x;
}

static int plot(const char *path, const char *model, const uint64_t *l1, const hyb_result_t *hy, const hyb_result_t *ends,
                const result_t *full, size_t n, const opts_t *o) {
    char title[200];
    snprintf(title, sizeof(title), "kvtier replay, %s: token hit rate vs L1 bytes", model);
    FILE *g = replay_plot_open(path, title, "L1 GB", "token hit rate");
    if (g == NULL) return -1;
    fputs("plot '-' using 1:2 with linespoints title 'hybrid (kvtier)', '-' using 1:2 with linespoints title "
          "'state at request ends only', '-' using 1:2 with linespoints title 'every layer as full attention'\n", g);
    for (int pass = 0; pass < 3; pass++) {
        for (size_t i = 0; i < n; i++)
            fprintf(g, "%.3f %.6f\n", (double)tier_bytes(o, l1[i]) / 1e9,
                    pass == 0 ? hyb_rate(&hy[i]) : pass == 1 ? hyb_rate(&ends[i]) : full_rate(&full[i]));
        fputs("e\n", g);
    }
    return pclose(g) == 0 ? 0 : -1;
}

int replay_hybrid(const kvt_trace_t *t, const opts_t *o, const l3_opts_t *l3, const hybrid_opts_t *h, const uint64_t *l1,
                  size_t n, const char *trace_name, double parse_s) {
    bool has_state = false;
    for (uint32_t g = 0; g < h->ngroups; g++) has_state |= h->groups[g].kind == KVT_GROUP_STATE;
    hyb_result_t *hy = calloc(n, sizeof(*hy)), *ends = calloc(n, sizeof(*ends));
    result_t *full = calloc(n, sizeof(*full));
    int rc = hy && ends && full ? 0 : -1;
    for (size_t i = 0; i < n && rc == 0; i++) {
        rc = run_hybrid(t, o, l3, h, l1[i], h->every, true, &hy[i]);
        if (rc == 0 && has_state) rc = run_hybrid(t, o, l3, h, l1[i], 0, false, &ends[i]);
        if (rc == 0) rc = replay_run_one(t, o, l3, l1[i], NULL, 0, &full[i]);
    }
    uint64_t *l1b = malloc(n * sizeof(*l1b)); /* the sizes shown: unbounded as the trace's pages */
    for (size_t i = 0; l1b && i < n; i++) l1b[i] = l1_of(t, o, l1[i]);
    if (l1b == NULL) rc = -1;
    l1 = l1b;
    if (rc == 0 && o->json) {
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "trace", trace_name);
        cJSON_AddNumberToObject(root, "parse_s", parse_s);
        cJSON_AddStringToObject(root, "model", h->name);
        cJSON_AddNumberToObject(root, "page_tokens", (double)o->page_tokens);
        cJSON_AddNumberToObject(root, "checkpoint_every", h->every);
        cJSON_AddNumberToObject(root, "state_share", h->state_share);
        cJSON_AddNumberToObject(root, "window_weight", h->window_weight);
        cJSON_AddNumberToObject(root, "l3_window_weight", h->l3_window_weight);
        cJSON_AddNumberToObject(root, "copy_lag", (double)h->copy_lag);
        cJSON_AddNumberToObject(root, "all_full_bytes_per_token", (double)o->bpt);
        cJSON *arr = cJSON_AddArrayToObject(root, "runs");
        for (size_t i = 0; i < n; i++) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddNumberToObject(x, "l1_pages_all_full", (double)l1[i]);
            cJSON_AddNumberToObject(x, "l1_bytes", (double)tier_bytes(o, l1[i]));
            cJSON_AddNumberToObject(x, "l2_bytes", (double)tier_bytes(o, o->l2_pages));
            cJSON_AddNumberToObject(x, "l3_bytes", (double)tier_bytes(o, l3->pages));
            cJSON_AddItemToObject(x, "hybrid", hyb_json(&hy[i], h));
            if (has_state) cJSON_AddItemToObject(x, "state_at_ends_only", hyb_json(&ends[i], h));
            cJSON_AddItemToObject(x, "every_layer_full", full_json(&full[i], o));
            cJSON_AddItemToArray(arr, x);
        }
        cli_print_json(root);
    } else if (rc == 0) {
        char every[48] = "";
        if (h->every) snprintf(every, sizeof(every), " and every %u pages", h->every);
        printf("kvtier replay: %s: %zu requests, model %s, page %" PRIu64 " tokens, kept points at ends, branch points%s; "
               "state share %.3g, window weight %.3g\n",
               trace_name, t->n, h->name, o->page_tokens, every, h->state_share, h->window_weight);
        printf("%10s %10s | %9s %9s %11s | %9s %11s | %9s %11s\n", "L1 GB", "L2 GB", "hybrid", "(full)", "B/token",
               "ends only", "B/token", "all full", "B/token");
        for (size_t i = 0; i < n; i++)
            printf("%10.1f %10.1f | %9.4f %9.4f %11.0f | %9.4f %11.0f | %9.4f %11.0f\n",
                   (double)tier_bytes(o, l1[i]) / 1e9, (double)tier_bytes(o, o->l2_pages) / 1e9, hyb_rate(&hy[i]),
                   frac(hy[i].st.full_hit_tokens, hy[i].st.tokens), hyb_bpt(&hy[i]), has_state ? hyb_rate(&ends[i]) : 0,
                   has_state ? hyb_bpt(&ends[i]) : 0, full_rate(&full[i]), full_bpt(&full[i], o));
    }
    if (rc == 0 && o->plot && plot(o->plot, h->name, l1, hy, has_state ? ends : hy, full, n, o) != 0) {
        fprintf(stderr, "kvtier replay: --plot: gnuplot failed or is not installed (apt-get install gnuplot-nox)\n");
        rc = -1;
    }
    free(l1b);
    free(hy);
    free(ends);
    free(full);
    return rc;
}
