/* kvtier replay on a hybrid model (--model with window or state groups, or
 * --groups): the trace through kvt_hybrid at each L1 size, beside the two
 * ways a cache that knows no groups could hold the same model in the same
 * bytes — every layer kept as full attention (the radix cache, the model's
 * all-full bytes per token), and state checkpoints at request ends only.
 *
 * With a store (--l3 URL) the full groups' pages go to it through the radix
 * cache's own L3 (replay_l3.c), and each window or state group's pieces as
 * objects of their own (kvt_hybrid_set_l3), put and got on this thread as
 * the cache's moves say; --instances N runs N such processes on the one
 * store (replay_fleet.c).
 *
 * With --data the full groups' pages are real bytes (replay_data.c, on the
 * hybrid cache's radix cache) and so are the pieces (replay_pieces.c): the
 * moves run as they are handed out, and the store's objects are the
 * pages' and pieces' bytes instead of stand-ins. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <xxhash.h>

#include "kvtier/error.h"
#include "kvtier/hybrid.h"
#include "kvtier/radix.h"
#include "kvtier/stats.h"
#include "replay_data.h"
#include "replay_hybrid.h"
#include "replay_pieces.h"
#include "replay_run.h"

typedef struct {
    kvt_hybrid_stats_t st;
    kvt_hybrid_group_bytes_t gb[KVT_MODEL_MAX_GROUPS];
    double wall_s;
    uint64_t nreq;
    uint64_t moves, outstanding_most; /* --copy-lag: moves run, and most outstanding at once */
    /* --l3 URL: hits a piece of which the store did not serve (gone, refused by its checksum), counted
     * as none, and their tokens; the full groups' L3 hit tokens that another instance put */
    uint64_t hits_unserved, unserved_tokens, cross_instance_hit_tokens;
    l3_result_t full_store, piece_store; /* the full groups' store, and the pieces' (their groups' summed) */
    data_result_t full_data;             /* --data: the full groups' pages */
    pieces_data_result_t piece_data;     /* and the pieces' */
    soak_t soak;
    uint64_t digest; /* --digest: kvt_hybrid_digest at the end */
} hyb_result_t;

/* --l3 URL: the pieces' side of the store. Each window or state group's
 * pieces are objects under a model identity of their own (a group's piece
 * never answers for another's): stand-ins of L3_STANDIN_BYTES as the full
 * pages are (replay_l3.h), put and got here; or with --data the pieces'
 * bytes, which kvtier's data plane (replay_pieces.c) puts from their L2
 * slots and gets straight into their L1 slots, through a store on each tier. */
#define PIECE_BATCH 64 /* keys per store call; the stand-in tier's pages (a get's pages are distinct) */
typedef struct {
    kvt_store_t *s[KVT_MODEL_MAX_GROUPS];   /* exists and put; without --data, get too */
    kvt_store_t *get[KVT_MODEL_MAX_GROUPS]; /* --data: get, into the L1 tier */
    kvt_tier_t *standin;
    bool open;                              /* the stores are */
    pieces_data_t *data;                    /* --data */
} pieces_t;

static kvt_hash128_t hash_of(kvt_key128_t k) { return (kvt_hash128_t){k.lo, k.hi}; }

/* Runs the puts into and gets from the store among mv[0..n), in order, a
 * run of the same group and direction in one call; ok[i] whether each
 * landed (a move between the cache's own tiers moves no bytes here). */
static void store_run(pieces_t *p, const kvt_hybrid_move_t *mv, size_t n, uint8_t *ok) {
    kvt_store_page_t pg[PIECE_BATCH];
    uint8_t res[PIECE_BATCH];
    size_t at[PIECE_BATCH], k = 0;
    for (size_t i = 0; i <= n; i++) {
        bool get = i < n && mv[i].src_tier == 3, put = i < n && mv[i].dst_tier == 3;
        if (i < n) ok[i] = 1;
        if (i < n && !get && !put) continue;
        const kvt_hybrid_move_t *f = k ? &mv[at[0]] : NULL;
        if (f && (i == n || k == PIECE_BATCH || mv[i].group != f->group || get != (f->src_tier == 3))) {
            int rc = kvt_store_run(p->s[f->group], f->src_tier == 3 ? KVT_STORE_GET : KVT_STORE_PUT, pg, k, res, NULL);
            for (size_t j = 0; j < k; j++) ok[at[j]] = (rc == KVT_OK || rc == KVT_EIO) && res[j] == KVT_STORE_OK;
            k = 0;
        }
        if (i < n) {
            pg[k] = (kvt_store_page_t){hash_of(mv[i].key), (uint32_t)k};
            at[k++] = i;
        }
    }
}

/* The model identity of a run's objects: the preset or a hash of the
 * --groups text, the run's kept points (runs that keep other checkpoints
 * never see each other's objects), and whose: the full groups' (g < 0) or
 * group g's pieces. */
static void identity(char *buf, size_t cap, const hybrid_opts_t *h, uint32_t every, bool branches, int g) {
    char name[40], whose[24] = "full";
    if (strlen(h->name) < 24 && !strchr(h->name, ':')) snprintf(name, sizeof(name), "%s", h->name);
    else {
        snprintf(name, sizeof(name), "groups-%016llx", (unsigned long long)XXH3_64bits(h->name, strlen(h->name)));
    }
    if (g >= 0) snprintf(whose, sizeof(whose), "group-%d", g);
    snprintf(buf, cap, "%s/kept-every-%u%s/%s", name, every, branches ? "-branches" : "", whose);
}

/* Opens group g's store for every window or state group; -1 after printing why. */
static int pieces_open(pieces_t *p, const l3_opts_t *l3, const hybrid_opts_t *h, uint32_t every, bool branches,
                       uint32_t page_tokens) {
    kvt_tier_config_t tc = {.size = sizeof(tc), .kind = KVT_TIER_HOST, .name = "l3-pieces-standin",
                            .geom = {PIECE_BATCH, 1, L3_STANDIN_BYTES, KVT_LAYOUT_PAGE_FIRST}};
    int rc = p->data ? KVT_OK : kvt_tier_create(&p->standin, &tc);
    for (uint32_t g = 0; g < h->ngroups && rc == KVT_OK; g++) {
        if (h->groups[g].kind == KVT_GROUP_FULL) continue;
        char model[128];
        identity(model, sizeof(model), h, every, branches, (int)g);
        kvt_store_config_t sc;
        kvt_store_config_default(&sc);
        sc.tier = p->data ? pieces_data_tier(p->data, g, 2) : p->standin;
        sc.model = model;
        sc.page_tokens = page_tokens;
        if (!p->data) sc.threads = 1; /* every call runs on this thread: kvt_store_run */
        rc = kvt_store_open(&p->s[g], l3->url, &sc);
        if (rc == KVT_OK && p->data) {
            sc.tier = pieces_data_tier(p->data, g, 1);
            rc = kvt_store_open(&p->get[g], l3->url, &sc);
        }
    }
    if (rc != KVT_OK) fprintf(stderr, "kvtier replay: --l3: the pieces' store: %s\n", kvt_store_last_error(NULL));
    p->open = rc == KVT_OK;
    return rc == KVT_OK ? 0 : -1;
}

/* The pieces' stores' figures, their groups' summed. */
static void pieces_result(const pieces_t *p, l3_result_t *res) {
    memset(res, 0, sizeof(*res));
    for (uint32_t g = 0; g < KVT_MODEL_MAX_GROUPS; g++) {
        if (p->s[g] == NULL) continue;
        res->store = true;
        snprintf(res->url, sizeof(res->url), "%s", kvt_store_url(p->s[g]));
        snprintf(res->backend, sizeof(res->backend), "%s", kvt_store_backend(p->s[g]));
        for (int op = 0; op < KVT_STORE_OP_COUNT_; op++)
            for (int i = 0; i < 2; i++) {
                kvt_store_t *s = i ? p->get[g] : p->s[g];
                kvt_store_stats_t st = {.size = sizeof(st)};
                if (s && kvt_store_stats(s, (kvt_store_op_t)op, &st) == KVT_OK) replay_store_add(&res->op[op], &st);
            }
    }
}

/* After the cache is destroyed: the stores, then the tiers they read. */
static void pieces_close(pieces_t *p) {
    for (uint32_t g = 0; g < KVT_MODEL_MAX_GROUPS; g++) {
        kvt_store_close(p->s[g]);
        kvt_store_close(p->get[g]);
    }
    kvt_tier_destroy(p->standin);
    pieces_data_close(p->data);
}

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

/* Takes the moves ready; those to and from a store (pieces, NULL: none) run
 * now, the others land when reported. */
static int lag_take(kvt_hybrid_t *c, lag_t *q, uint64_t now, pieces_t *pieces) {
    for (size_t want; (want = kvt_hybrid_moves(c)) > 0;) {
        if (q->head > 0 && q->head >= q->n / 2) { /* the reported half goes: the queue holds what is in flight */
            memmove(q->mv, q->mv + q->head, (q->n - q->head) * sizeof(*q->mv));
            memmove(q->at, q->at + q->head, (q->n - q->head) * sizeof(*q->at));
            memmove(q->ok, q->ok + q->head, q->n - q->head);
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
            q->cap = cap;
        }
        size_t got = kvt_hybrid_take_moves(c, q->mv + q->n, want);
        for (size_t i = 0; i < got; i++) q->at[q->n + i] = now;
        memset(q->ok + q->n, 1, got);
        if (pieces) store_run(pieces, q->mv + q->n, got, q->ok + q->n);
        q->n += got;
    }
    return KVT_OK;
}

/* Reports the oldest copies, those taken by request upto or before. */
static int lag_report(kvt_hybrid_t *c, lag_t *q, uint64_t upto, hyb_result_t *out) {
    size_t k = q->head;
    while (k < q->n && q->at[k] <= upto) k++;
    if (k == q->head) return KVT_OK;
    int rc = kvt_hybrid_moves_done(c, q->mv + q->head, k - q->head, q->ok + q->head);
    out->moves += k - q->head;
    q->head = k;
    return rc;
}

/* Copies that land at once (a store's, run as they are taken; and at the
 * end of a run, those still in flight): every move taken and reported, and
 * those it lets out (a slot's new piece after its old one's copy down, a
 * piece going on down), until none is outstanding. */
static int lag_drain(kvt_hybrid_t *c, lag_t *q, uint64_t now, pieces_t *pieces, hyb_result_t *out) {
    int rc = lag_take(c, q, now, pieces);
    while (rc == KVT_OK && q->head < q->n) {
        rc = lag_report(c, q, UINT64_MAX, out);
        if (rc == KVT_OK) rc = lag_take(c, q, now, pieces);
    }
    return rc;
}

static double frac(uint64_t x, uint64_t of) { return of ? (double)x / (double)of : 0; }

/* The bytes of one tier: pages of the all-full model. */
static uint64_t tier_bytes(const opts_t *o, uint64_t pages) { return pages * o->page_tokens * o->bpt; }
/* Whether tier_bytes of pages fits 64 bits (checked once per run, before any use). */
static bool tier_fits(const opts_t *o, uint64_t pages) {
    uint64_t b;
    return !__builtin_mul_overflow(pages, o->page_tokens, &b) && !__builtin_mul_overflow(b, o->bpt, &b);
}

int replay_hybrid_sizes(cli_t *c, const opts_t *o, const l3_opts_t *l3, hybrid_opts_t *h, const uint64_t *l1, size_t n) {
    const char *over = NULL;
    uint64_t bad = 0;
    for (size_t i = 0; i < n && !over; i++)
        if (l1[i] != UNBOUNDED && !tier_fits(o, l1[i])) over = n > 1 ? "--sweep" : "--l1-pages", bad = l1[i];
    if (!over && !tier_fits(o, o->l2_pages)) over = "--l2-pages", bad = o->l2_pages;
    if (!over && !tier_fits(o, l3->pages)) over = "--l3-pages", bad = l3->pages;
    if (over) {
        c->flag = over;
        return cli_error(c, "%" PRIu64 " pages of %" PRIu64 " tokens of %" PRIu64 " bytes (the model as all-full "
                            "attention) would hold more than 2^64 bytes", bad, o->page_tokens, o->bpt);
    }
    uint64_t bytes = 0, layers = 0;
    for (uint32_t g = 0; g < h->ngroups; g++)
        if (h->groups[g].kind == KVT_GROUP_FULL) bytes += h->groups[g].bytes, layers += h->groups[g].layers;
    if (o->layers_opt == 0) {
        h->full_layers = layers <= UINT32_MAX && bytes % layers == 0 ? (uint32_t)layers : 1;
    } else if (bytes % o->layers_opt != 0) {
        c->flag = "--layers";
        return cli_error(c, "the full groups' %" PRIu64 " bytes a token do not split into %" PRIu64 " layers", bytes,
                         o->layers_opt);
    } else {
        h->full_layers = (uint32_t)o->layers_opt;
    }
    return 0;
}

/* --l1-pages unbounded: every page of the trace. */
static uint64_t l1_of(const kvt_trace_t *t, const opts_t *o, uint64_t l1) {
    if (l1 != UNBOUNDED) return l1;
    return replay_trace_pages(t, o->limit && o->limit < t->n ? o->limit : t->n, o->page_tokens);
}

/* One run's setting: the sizes, and the kept points (every N pages, and
 * branch points: both off for the ends-only run). */
typedef struct {
    const kvt_trace_t *t;
    const opts_t *o;
    const l3_opts_t *l3;
    const hybrid_opts_t *h;
    uint64_t l1_pages; /* UNBOUNDED: every group's L1 holds every page (and checkpoint) of the trace */
    uint32_t every;
    bool branches;
} hyb_run_t;

/* The requests reqs[0..nreqs) of the trace (all of them, up to --limit, for
 * reqs NULL) through a fresh hybrid cache. -1 after printing why. */
static int run_hybrid(const hyb_run_t *a, const uint32_t *reqs, uint64_t nreqs, hyb_result_t *out) {
    const kvt_trace_t *t = a->t;
    const opts_t *o = a->o;
    const l3_opts_t *l3 = a->l3;
    const hybrid_opts_t *h = a->h;
    bool store = l3->url != NULL;
    kvt_hybrid_config_t cfg;
    uint64_t all = l1_of(t, o, UNBOUNDED), P = o->page_tokens;
    if (!tier_fits(o, all)) { /* (the options' sizes: replay_hybrid_sizes) */
        fprintf(stderr, "kvtier replay: the trace's %" PRIu64 " pages of %" PRIu64 " bytes would hold more than 2^64 "
                        "bytes\n", all, o->bpt * P);
        return -1;
    }
    uint64_t b1 = tier_bytes(o, l1_of(t, o, a->l1_pages)), b2 = tier_bytes(o, o->l2_pages),
             b3 = store ? 0 : tier_bytes(o, l3->pages); /* a store keeps its own room */
    int rc = kvt_hybrid_config_default(&cfg, h->groups, h->ngroups, (uint32_t)P, b1, b2, b3);
    if (rc == KVT_OK) rc = kvt_hybrid_config_split(&cfg, b1, b2, b3, h->state_share, h->window_weight);
    if (rc == KVT_OK && b3) rc = kvt_hybrid_config_split_tier(&cfg, 3, b3, h->state_share, h->l3_window_weight);
    if (rc != KVT_OK) {
        fprintf(stderr, "kvtier replay: L1 %.2f GB, L2 %.2f GB, L3 %.2f GB: a tier cannot hold one page or checkpoint of each "
                        "group (more --l1-pages, --l2-pages or --l3-pages, or another --state-share or --window-weight)\n",
                (double)b1 / 1e9, (double)b2 / 1e9, (double)b3 / 1e9);
        return -1;
    }
    kvt_cache_config_t base;
    replay_cache_config(o, cfg.cache.l1_pages, &base);
    replay_l3_config(l3, &base);
    base.l2_pages = cfg.cache.l2_pages;
    base.l3_pages = cfg.cache.l3_pages;
    /* remember every put: then "from another instance" is exact (a page this instance never put) */
    if (store) base.l3_known = replay_trace_pages(t, t->n, P);
    cfg.cache = base;
    /* the slots have no hit counts: a selective write is a plain one for them */
    if (cfg.cache.write_policy == KVT_WRITE_THROUGH_SELECTIVE) cfg.cache.write_policy = KVT_WRITE_THROUGH;
    if (cfg.cache.l3_write_policy == KVT_WRITE_THROUGH_SELECTIVE) cfg.cache.l3_write_policy = KVT_WRITE_THROUGH;
    cfg.checkpoint_every = a->every;
    cfg.checkpoint_branches = a->branches;
    /* a store's gets can fail, and so can --data's copies: the moves are reported, as an engine's copies are */
    bool moving = h->copy_lag > 0 || store || o->data;
    cfg.moves = cfg.async_moves = moving;
    if (a->l1_pages == UNBOUNDED) {
        cfg.cache.l1_pages = all;
        for (uint32_t g = 0; g < h->ngroups; g++)
            if (h->groups[g].kind != KVT_GROUP_FULL) cfg.l1_slots[g] = all;
    }
    kvt_hybrid_t *c;
    if ((rc = kvt_hybrid_create(&c, &cfg)) != KVT_OK) {
        fprintf(stderr, "kvtier replay: cannot create the hybrid cache: %s\n", kvt_strerror(rc));
        return -1;
    }
    memset(out, 0, sizeof(*out));
    replay_l3_t *full_store = NULL;
    replay_data_t *data = NULL;
    pieces_t pieces = {0};
    int orc = 0;
    if (o->data) {
        uint64_t full_bpt = 0; /* the full groups' bytes per token: their pages' */
        for (uint32_t g = 0; g < h->ngroups; g++)
            if (h->groups[g].kind == KVT_GROUP_FULL) full_bpt += h->groups[g].bytes;
        data_opts_t dopt = {P, cfg.cache.l1_pages, cfg.cache.l2_pages, h->full_layers, full_bpt * P / h->full_layers,
                            (kvt_layout_t)o->layout, (uint32_t)o->threads, o->verify, o->copy_faults};
        orc = replay_data_open(&data, kvt_hybrid_cache(c), &dopt);
        if (orc == 0) orc = pieces_data_open(&pieces.data, &cfg, (uint32_t)P, (uint32_t)o->threads, o->copy_faults);
    }
    if (store && orc == 0) {
        char model[128];
        identity(model, sizeof(model), h, a->every, a->branches, -1);
        orc = replay_l3_open(&full_store, l3, kvt_hybrid_cache(c), data ? replay_data_l2(data) : NULL, cfg.cache.l2_pages, P,
                             model, &out->full_store);
        if (orc == 0 && full_store) {
            orc = pieces_open(&pieces, l3, h, a->every, a->branches, (uint32_t)P);
            if (orc == 0 && !pieces.data && kvt_hybrid_set_l3(c, kvt_hybrid_store_probe, pieces.s) != KVT_OK) orc = -1;
        } else if (orc == 0 && !(h->copy_lag > 0 || o->data)) { /* a store down from the start: L1 and L2 serve, as
                                                                  * with no store (no moves) */
            kvt_hybrid_destroy(c);
            moving = false;
            cfg.moves = cfg.async_moves = false;
            if ((rc = kvt_hybrid_create(&c, &cfg)) != KVT_OK) { /* (nothing else is open: no --data, no store) */
                fprintf(stderr, "kvtier replay: cannot create the hybrid cache: %s\n", kvt_strerror(rc));
                return -1;
            }
        }
    }
    /* --data: the plane runs the moves, the store's too (it asks the store what it holds) */
    if (orc == 0 && pieces.data) orc = pieces_data_attach(pieces.data, c, pieces.s, pieces.get);
    kvt_hybrid_plane_t *plane = pieces.data ? pieces_data_plane(pieces.data) : NULL;
    pieces_t *ps = pieces.open ? &pieces : NULL; /* the pieces' stores (for the moves run here: stand-ins) */
    bool by_hand = moving && plane == NULL; /* the moves run here (stand-ins, --copy-lag) */
    if (orc != 0) {
        pieces_data_detach(pieces.data);
        kvt_hybrid_destroy(c);
        pieces_close(&pieces);
        replay_l3_close(full_store);
        replay_data_close(data);
        return -1;
    }
    uint64_t n = reqs ? nreqs : o->limit && o->limit < t->n ? o->limit : t->n, lag = h->copy_lag;
    /* the full groups' prefetches: with a store the next --prefetch-ahead requests are prefetched while
     * one is admitted (the radix replay's rule); a modeled L3 prefetches at admission */
    uint64_t ahead = store ? l3->ahead : 0, next = 0;
    size_t ring = (size_t)ahead + 1, max_tokens = (size_t)t->max_blocks * KVT_TRACE_BLOCK_TOKENS;
    int32_t *tokens = malloc(ring * max_tokens * sizeof(int32_t));
    uint64_t *pf = calloc(ring, sizeof(uint64_t)), *len = calloc(ring, sizeof(uint64_t));
    /* --data: the request's L1 pages and page hashes (the pieces' keys) */
    uint32_t *l1_ids = data ? malloc((max_tokens / P + 1) * sizeof(uint32_t)) : NULL;
    kvt_hash128_t *hash = data ? malloc((max_tokens / P + 1) * sizeof(kvt_hash128_t)) : NULL;
    rc = tokens && pf && len && (!data || (l1_ids && hash)) ? KVT_OK : KVT_ENOMEM;
    lag_t q = {0};
    double t0 = (double)kvt_now_ns() / 1e9;
    /* --soak: pass after pass of the same n requests (request i is i mod n of them) */
    uint64_t total = n;
    for (uint64_t i = 0; i < total && rc == KVT_OK; i++) {
        for (; next < total && next <= i + ahead && rc == KVT_OK; next++) { /* requests arriving */
            const kvt_trace_req_t *r = &t->req[reqs ? reqs[next % n] : next % n];
            size_t k = next % ring;
            for (uint32_t b = 0; b < r->nblocks; b++)
                kvt_trace_block_tokens(r->hash_ids[b], tokens + k * max_tokens + (size_t)b * KVT_TRACE_BLOCK_TOKENS);
            len[k] = r->input_length;
            pf[k] = 0;
            if (replay_l3_on(l3)) rc = kvt_cache_prefetch(kvt_hybrid_cache(c), 0, tokens + k * max_tokens, len[k], &pf[k]);
        }
        size_t k = i % ring;
        const int32_t *tok = tokens + k * max_tokens;
        kvt_hybrid_req_t req;
        if (rc == KVT_OK) rc = kvt_hybrid_admit_prefetched(c, pf[k], 0, tok, len[k], 0, l1_ids, &req);
        if (rc == KVT_OK && by_hand) rc = lag_take(c, &q, i, ps);
        while (rc == KVT_OK && by_hand && kvt_hybrid_ready(c, &req) == KVT_EAGAIN) { /* its loads, and what is before them */
            rc = lag_report(c, &q, q.at[q.head], out);
            if (rc == KVT_OK) rc = lag_take(c, &q, i, ps);
        }
        if (rc == KVT_OK && by_hand && lag == 0) rc = lag_drain(c, &q, i, ps, out);
        int ready = rc == KVT_OK ? plane ? kvt_hybrid_plane_wait(plane, &req) : kvt_hybrid_ready(c, &req) : rc;
        if (rc == KVT_OK && ready != KVT_OK && ready != KVT_EIO) rc = ready;
        bool served = rc == KVT_OK && ready == KVT_OK;
        if (rc == KVT_OK && !served) { /* a piece the store or a copy did not deliver: recomputed */
            out->hits_unserved++;
            out->unserved_tokens += req.hit_pages * P;
        }
        if (rc == KVT_OK && data) { /* the forward pass: what it reads is checked, what it computes written */
            if (served && o->verify && req.hit_pages) { /* the pieces' keys: the hit's page hashes */
                kvt_page_hash_chain(0, tok, req.hit_pages, (uint32_t)P, hash);
                pieces_data_verify(pieces.data, c, &req, hash);
            }
            replay_data_request(data, tok, &req.full, l1_ids);
        }
        if (rc == KVT_OK) rc = kvt_hybrid_release(c, 0, tok, len[k], &req);
        if (rc == KVT_OK && plane) rc = kvt_hybrid_plane_sync(plane); /* the decisions never wait on copy timing */
        if (rc == KVT_OK && by_hand) {
            rc = lag_take(c, &q, i, ps);
            if (rc == KVT_OK && i >= lag) rc = lag_report(c, &q, i - lag, out);
            if (rc == KVT_OK) rc = lag_take(c, &q, i, ps);
            if (rc == KVT_OK && lag == 0) rc = lag_drain(c, &q, i, ps, out);
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
            fprintf(stderr, "kvtier replay: request %" PRIu64 ": %s\n", (reqs ? reqs[i % n] : i % n) + 1, kvt_strerror(rc));
        if (rc == KVT_OK && (i + 1) % n == 0 &&
            replay_soak_pass(&out->soak, o, kvt_hybrid_cache(c), i + 1, (double)kvt_now_ns() / 1e9 - t0))
            total += n;
    }
    if (rc == KVT_OK && by_hand) rc = lag_drain(c, &q, total, ps, out); /* the copies still in flight land */
    if (rc == KVT_OK && plane) rc = kvt_hybrid_plane_sync(plane);
    kvt_cache_sync(kvt_hybrid_cache(c)); /* the full pages' store calls in flight */
    lag_free(&q);
    out->wall_s = (double)kvt_now_ns() / 1e9 - t0;
    out->nreq = total;
    out->st.size = sizeof(out->st);
    kvt_hybrid_stats(c, &out->st);
    out->digest = kvt_hybrid_digest(c);
    for (uint32_t g = 0; g < h->ngroups; g++) kvt_hybrid_group_bytes(c, g, &out->gb[g]);
    kvt_cache_stats_t cs = {.size = sizeof(cs)};
    kvt_cache_stats(kvt_hybrid_cache(c), &cs);
    out->cross_instance_hit_tokens = cs.l3_foreign_hit_tokens;
    replay_l3_result(full_store, &out->full_store);
    if (ps) pieces_result(ps, &out->piece_store);
    if (data) {
        replay_data_result(data, kvt_hybrid_cache(c), &out->full_data);
        pieces_data_result(pieces.data, &out->piece_data);
    }
    pieces_data_detach(pieces.data);
    free(tokens);
    free(pf);
    free(len);
    free(l1_ids);
    free(hash);
    kvt_hybrid_destroy(c);
    pieces_close(&pieces);
    replay_l3_close(full_store);
    replay_data_close(data);
    return rc == KVT_OK ? 0 : -1;
}

static int hyb_instance(void *arg, const uint32_t *reqs, uint64_t n, void *res) { return run_hybrid(arg, reqs, n, res); }

/* d += s: the instances of a fleet added up (wall and most outstanding: the largest). */
static void hyb_add(hyb_result_t *d, const hyb_result_t *s, uint32_t ngroups) {
#define ADD_(name, kind, help) d->st.name += s->st.name;
    KVT_HYBRID_STATS_FIELDS(ADD_)
#undef ADD_
    for (uint32_t g = 0; g < ngroups; g++)
        for (int t = 0; t < 3; t++) d->gb[g].bytes[t] += s->gb[g].bytes[t], d->gb[g].slots[t] += s->gb[g].slots[t];
    if (s->wall_s > d->wall_s) d->wall_s = s->wall_s;
    d->nreq += s->nreq;
    d->moves += s->moves;
    if (s->outstanding_most > d->outstanding_most) d->outstanding_most = s->outstanding_most;
    d->hits_unserved += s->hits_unserved;
    d->unserved_tokens += s->unserved_tokens;
    d->cross_instance_hit_tokens += s->cross_instance_hit_tokens;
    for (int op = 0; op < KVT_STORE_OP_COUNT_; op++) {
        replay_store_add(&d->full_store.op[op], &s->full_store.op[op]);
        replay_store_add(&d->piece_store.op[op], &s->piece_store.op[op]);
    }
    data_result_t *fd = &d->full_data;
    const data_result_t *fs = &s->full_data;
    fd->page_bytes = fs->page_bytes;
    fd->filled_pages += fs->filled_pages, fd->verified_hits += fs->verified_hits;
    fd->verified_loads += fs->verified_loads, fd->mismatches += fs->mismatches;
    pieces_data_result_t *pd = &d->piece_data;
    const pieces_data_result_t *pe = &s->piece_data;
    pd->verified += pe->verified, pd->mismatches += pe->mismatches;
#define ADD_PLANE_(name, kind, help) pd->plane.name += pe->plane.name;
    KVT_HYBRID_PLANE_STATS_FIELDS(ADD_PLANE_)
#undef ADD_PLANE_
}

/* A run alone, or (--instances N) as N processes whose results each[N] gets, total their sum. */
static int run_fleet(const hyb_run_t *a, hyb_result_t *total, hyb_result_t *each) {
    uint32_t ni = (uint32_t)a->l3->instances;
    if (ni <= 1) return run_hybrid(a, NULL, 0, total);
    uint64_t n = a->o->limit && a->o->limit < a->t->n ? a->o->limit : a->t->n;
    if (replay_instances(a->t, n, ni, hyb_instance, (void *)a, each, sizeof(*each)) != 0) return -1;
    *total = each[0];
    for (uint32_t i = 1; i < ni; i++) hyb_add(total, &each[i], a->h->ngroups);
    return 0;
}

/* A hit whose piece the store did not serve is none: the engine recomputes it. */
static double hyb_rate(const hyb_result_t *r) { return frac(r->st.hit_tokens - r->unserved_tokens, r->st.tokens); }
static double hyb_bpt(const hyb_result_t *r) { return frac(r->st.l1_bytes + r->st.l2_bytes, r->st.cached_tokens); }
static double full_rate(const result_t *r) {
    return frac(r->cs.l1_hit_tokens + r->cs.l2_hit_tokens + r->cs.l3_hit_tokens, r->cs.tokens);
}
/* r of one cache or a fleet's (its pages and free counts summed). */
static double full_bpt(const result_t *r, const opts_t *o) {
    uint64_t used = (r->l1_pages - r->cs.l1_free) + (r->l2_pages - r->cs.l2_free);
    return frac(used * o->page_tokens * o->bpt, r->rs.pages * o->page_tokens);
}

static cJSON *hyb_json(const hyb_result_t *r, const hybrid_opts_t *h, const opts_t *o) {
    cJSON *x = cJSON_CreateObject();
    cJSON_AddNumberToObject(x, "hit_rate", hyb_rate(r));
    cJSON_AddNumberToObject(x, "l1_hit_rate", frac(r->st.l1_hit_tokens, r->st.tokens));
    cJSON_AddNumberToObject(x, "l2_hit_rate", frac(r->st.l2_hit_tokens, r->st.tokens));
    cJSON_AddNumberToObject(x, "l3_hit_rate", frac(r->st.l3_hit_tokens, r->st.tokens));
    cJSON_AddNumberToObject(x, "full_groups_hit_rate", frac(r->st.full_hit_tokens, r->st.tokens));
    cJSON_AddNumberToObject(x, "bytes_per_cached_token", hyb_bpt(r));
    cJSON_AddNumberToObject(x, "wall_s", r->wall_s);
    cJSON_AddNumberToObject(x, "requests", (double)r->nreq);
    if (o->digest) {
        char digest[17];
        snprintf(digest, sizeof(digest), "%016" PRIx64, r->digest);
        cJSON_AddStringToObject(x, "decision_digest", digest); /* as the radix replay's: every slot and page alike */
    }
    if (o->soak_s > 0) replay_soak_json(x, &r->soak, o);
    if (h->copy_lag) {
        cJSON_AddNumberToObject(x, "moves", (double)r->moves);
        cJSON_AddNumberToObject(x, "moves_outstanding_most", (double)r->outstanding_most);
    }
    if (o->data) {
        cJSON *d = cJSON_AddObjectToObject(x, "data");
        replay_data_json(cJSON_AddObjectToObject(d, "full_pages"), &r->full_data);
        const pieces_data_result_t *p = &r->piece_data;
        cJSON *pp = cJSON_AddObjectToObject(d, "pieces");
        cJSON_AddNumberToObject(pp, "verified", (double)p->verified);
        cJSON_AddNumberToObject(pp, "mismatches", (double)p->mismatches);
#define J_PLANE_(name, kind, help) cJSON_AddNumberToObject(pp, #name, (double)p->plane.name);
        KVT_HYBRID_PLANE_STATS_FIELDS(J_PLANE_)
#undef J_PLANE_
        cJSON_AddNumberToObject(d, "hits_unserved", (double)r->hits_unserved);
    }
    if (r->full_store.store || r->full_store.down) {
        cJSON *d = cJSON_AddObjectToObject(x, "l3");
        cJSON_AddBoolToObject(d, "down", r->full_store.down);
        if (r->full_store.down) cJSON_AddStringToObject(d, "error", r->full_store.why); /* as the radix replay's */
        cJSON_AddNumberToObject(d, "hits_unserved", (double)r->hits_unserved);
        cJSON_AddNumberToObject(d, "unserved_hit_tokens", (double)r->unserved_tokens);
        cJSON_AddNumberToObject(d, "cross_instance_hit_tokens", (double)r->cross_instance_hit_tokens);
        if (r->full_store.store) replay_store_json(d, "full_pages", &r->full_store);
        if (r->piece_store.store) replay_store_json(d, "pieces", &r->piece_store);
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
    size_t ni = l3->instances > 1 ? (size_t)l3->instances : 0; /* --instances: n is 1 (no --sweep) */
    /* --soak: the hybrid cache alone (one cache: n is 1, ni 0), not the single-pass comparisons */
    bool compare = o->soak_s <= 0;
    hyb_result_t *hy = calloc(n, sizeof(*hy)), *ends = calloc(n, sizeof(*ends)), *each = calloc(2 * ni + 1, sizeof(*each));
    result_t *full = calloc(n + ni, sizeof(*full));
    int rc = hy && ends && full && each ? 0 : -1;
    for (size_t i = 0; i < n && rc == 0; i++) {
        hyb_run_t a = {t, o, l3, h, l1[i], h->every, true}, e = {t, o, l3, h, l1[i], 0, false};
        rc = run_fleet(&a, &hy[i], each);
        if (rc == 0 && has_state && compare) rc = run_fleet(&e, &ends[i], each + ni);
        if (rc == 0 && ni) rc = replay_fleet(t, o, l3, full + n, &full[i]);
        else if (rc == 0 && compare) rc = replay_run_one(t, o, l3, l1[i], NULL, 0, &full[i]);
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
            cJSON_AddItemToObject(x, "hybrid", hyb_json(&hy[i], h, o));
            if (has_state && compare) cJSON_AddItemToObject(x, "state_at_ends_only", hyb_json(&ends[i], h, o));
            if (compare) cJSON_AddItemToObject(x, "every_layer_full", full_json(&full[i], o));
            cJSON_AddItemToArray(arr, x);
        }
        if (ni) { /* the fleet: its totals above, each instance's hybrid run here */
            cJSON *inst = cJSON_AddArrayToObject(root, "instances");
            for (size_t i = 0; i < ni; i++) {
                cJSON *x = hyb_json(&each[i], h, o);
                cJSON_AddNumberToObject(x, "instance", (double)i);
                cJSON_AddNumberToObject(x, "requests_replayed", (double)each[i].nreq);
                cJSON_AddItemToArray(inst, x);
            }
        }
        cli_print_json(root);
    } else if (rc == 0) {
        char every[48] = "";
        if (h->every) snprintf(every, sizeof(every), " and every %u pages", h->every);
        printf("kvtier replay: %s: %zu requests, model %s, page %" PRIu64 " tokens, kept points at ends, branch points%s; "
               "state share %.3g, window weight %.3g\n",
               trace_name, (size_t)(o->limit && o->limit < t->n ? o->limit : t->n), h->name, o->page_tokens, every,
               h->state_share, h->window_weight);
        printf("%10s %10s | %9s %9s %11s | %9s %11s | %9s %11s\n", "L1 GB", "L2 GB", "hybrid", "(full)", "B/token",
               "ends only", "B/token", "all full", "B/token");
        for (size_t i = 0; i < n; i++) {
            /* no state group: no ends-only run; --soak: neither comparison */
            char ends_cols[32] = "        -           -", full_cols[32] = "        -           -";
            if (has_state && compare) snprintf(ends_cols, sizeof(ends_cols), "%9.4f %11.0f", hyb_rate(&ends[i]), hyb_bpt(&ends[i]));
            if (compare) snprintf(full_cols, sizeof(full_cols), "%9.4f %11.0f", full_rate(&full[i]), full_bpt(&full[i], o));
            printf("%10.1f %10.1f | %9.4f %9.4f %11.0f | %s | %s\n", (double)tier_bytes(o, l1[i]) / 1e9,
                   (double)tier_bytes(o, o->l2_pages) / 1e9, hyb_rate(&hy[i]), frac(hy[i].st.full_hit_tokens, hy[i].st.tokens),
                   hyb_bpt(&hy[i]), ends_cols, full_cols);
        }
        if (!compare) replay_soak_print(&hy[0].soak);
        for (size_t i = 0; o->digest && i < n; i++) /* the hybrid runs' (the comparisons' are in --json) */
            printf("  decision digest %016" PRIx64 " (L1 %.1f GB)\n", hy[i].digest, (double)tier_bytes(o, l1[i]) / 1e9);
        for (size_t i = 0; i < ni; i++)
            printf("  instance %zu: %" PRIu64 " requests, hybrid hit rate %.4f (L3 %.4f), %" PRIu64
                   " full-page L3 hit tokens another instance put\n", i, each[i].nreq, hyb_rate(&each[i]),
                   frac(each[i].st.l3_hit_tokens, each[i].st.tokens), each[i].cross_instance_hit_tokens);
        if (o->data) {
            const pieces_data_result_t *p = &hy[0].piece_data;
            const data_result_t *f = &hy[0].full_data;
            printf("  data: full pages %" PRIu64 " filled, %" PRIu64 " verified, %" PRIu64 " mismatches; pieces %" PRIu64
                   " written, %" PRIu64 " verified, %" PRIu64 " mismatches, %" PRIu64 " copies failed\n",
                   f->filled_pages, f->verified_hits + f->verified_loads, f->mismatches, p->plane.written, p->verified,
                   p->mismatches, p->plane.copy_failures + p->plane.write_failures);
        }
        const l3_result_t *ps = &hy[0].piece_store;
        if (ps->store)
            printf("  L3 %s: pieces put %" PRIu64 ", got %" PRIu64 " (%" PRIu64 " not served: %" PRIu64 " hits recomputed)\n",
                   ps->url, ps->op[KVT_STORE_PUT].hits, ps->op[KVT_STORE_GET].hits,
                   ps->op[KVT_STORE_GET].keys - ps->op[KVT_STORE_GET].hits, hy[0].hits_unserved);
    }
    for (size_t i = 0; rc == 0 && o->verify && i < n; i++) { /* the output is whole; the run failed */
        uint64_t bad = hy[i].full_data.mismatches + hy[i].piece_data.mismatches + ends[i].full_data.mismatches +
                       ends[i].piece_data.mismatches + full[i].data.mismatches;
        if (bad) {
            fprintf(stderr, "kvtier replay: --verify: %" PRIu64 " pages or pieces differed from their content\n", bad);
            rc = -1;
        }
    }
    if (rc == 0 && o->plot && plot(o->plot, h->name, l1, hy, has_state ? ends : hy, full, n, o) != 0) {
        fprintf(stderr, "kvtier replay: --plot: gnuplot failed or is not installed (apt-get install gnuplot-nox)\n");
        rc = -1;
    }
    free(l1b);
    free(each);
    free(hy);
    free(ends);
    free(full);
    return rc;
}
