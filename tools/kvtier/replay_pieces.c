#include "replay_pieces.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier/error.h"
#include "kvtier/testing.h"
#include "kvtier/xfer.h"

#define L1 0
#define L2 1

typedef struct {
    kvt_tier_t *tier[2]; /* NULL for a full group */
    kvt_xfer_t *xf;
    uint64_t bytes;      /* one piece */
} group_data_t;

struct pieces_data {
    group_data_t g[KVT_MODEL_MAX_GROUPS];
    kvt_layer_group_t groups[KVT_MODEL_MAX_GROUPS];
    uint32_t ngroups, P;
    uint8_t *buf; /* the largest piece */
    kvt_xfer_copy_t *copies;
    size_t *at;   /* copies[i] is the move at[i] */
    size_t cap;
    uint64_t *slots; /* a hit's pieces of one group */
    size_t slots_cap;
    pieces_data_result_t r;
};

/* A piece's content: the pattern of its key, told apart by group. */
static uint64_t seed_lo(uint64_t lo, uint32_t g) { return lo ^ (0x9e3779b97f4a7c15ULL * (g + 1)); }

int pieces_data_open(pieces_data_t **out, const kvt_hybrid_config_t *cfg, uint32_t page_tokens, uint32_t threads,
                     double faults) {
    pieces_data_t *d = calloc(1, sizeof(*d));
    if (d == NULL) {
        fprintf(stderr, "kvtier replay: out of memory\n");
        return -1;
    }
    d->ngroups = cfg->ngroups;
    d->P = page_tokens;
    memcpy(d->groups, cfg->groups, sizeof(d->groups));
    uint64_t most = 0;
    int rc = KVT_OK;
    const char *what = "";
    for (uint32_t g = 0; g < cfg->ngroups && rc == KVT_OK; g++) {
        const kvt_layer_group_t *gr = &cfg->groups[g];
        if (gr->kind == KVT_GROUP_FULL) continue;
        group_data_t *x = &d->g[g];
        x->bytes = gr->kind == KVT_GROUP_STATE ? gr->bytes : gr->bytes * page_tokens;
        if (x->bytes > most) most = x->bytes;
        kvt_tier_config_t tc = {.size = sizeof(tc), .kind = KVT_TIER_ARENA, .name = "pieces-l1",
                                .geom = {cfg->l1_slots[g], 1, x->bytes, KVT_LAYOUT_PAGE_FIRST}};
        what = "an L1 tier (arena)";
        rc = kvt_tier_create(&x->tier[L1], &tc);
        if (rc == KVT_OK) {
            tc = (kvt_tier_config_t){.size = sizeof(tc), .kind = KVT_TIER_HOST, .name = "pieces-l2",
                                     .flags = KVT_TIER_HUGE | KVT_TIER_CHECKSUM,
                                     .geom = {cfg->l2_slots[g], 1, x->bytes, KVT_LAYOUT_PAGE_FIRST}};
            what = "an L2 tier (host)";
            rc = kvt_tier_create(&x->tier[L2], &tc);
        }
        if (rc == KVT_OK) {
            kvt_xfer_config_t xc;
            kvt_xfer_config_default(&xc);
            xc.threads = threads;
            what = "a transfer engine";
            rc = kvt_xfer_create(&x->xf, &xc, x->tier, 2);
        }
#ifdef KVT_TESTING /* --copy-faults */
        if (rc == KVT_OK && faults > 0) {
            kvt_xfer_faults_t f = {.size = sizeof(f), .fail_p = faults, .delay_p = faults, .delay_max_ns = 1000000,
                                   .seed = 2 + g};
            what = "the fault injection";
            rc = kvt_xfer_set_faults(x->xf, &f);
        }
#else
        (void)faults;
#endif
        if (rc != KVT_OK) fprintf(stderr, "kvtier replay: --data: group %u's pieces: cannot create %s: %s\n", g, what,
                                  kvt_strerror(rc));
    }
    if (rc == KVT_OK && (d->buf = malloc(most ? most : 1)) == NULL) {
        fprintf(stderr, "kvtier replay: out of memory\n");
        rc = KVT_ENOMEM;
    }
    if (rc != KVT_OK) {
        pieces_data_close(d);
        return -1;
    }
    *out = d;
    return 0;
}

kvt_tier_t *pieces_data_tier(pieces_data_t *d, uint32_t g, int t) { return d->g[g].tier[t - 1]; }

static bool grow(pieces_data_t *d, size_t n) {
    if (n <= d->cap) return true;
    kvt_xfer_copy_t *c = realloc(d->copies, n * sizeof(*c));
    if (c) d->copies = c;
    size_t *at = realloc(d->at, n * sizeof(*at));
    if (at) d->at = at;
    if (c && at) d->cap = n;
    return c && at;
}

/* The moves of group g from tier src to dst (0-based) as one batch on the
 * group's engine, waited for; ok[] of each set by the batch's status. */
static void copy_batch(pieces_data_t *d, uint32_t g, int src, int dst, const kvt_hybrid_move_t *mv, size_t n,
                       uint8_t *ok) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (mv[i].group == g && mv[i].src_tier == (uint32_t)src + 1 && mv[i].dst_tier == (uint32_t)dst + 1) {
            d->copies[k] = (kvt_xfer_copy_t){(uint32_t)mv[i].src_slot, (uint32_t)mv[i].dst_slot};
            d->at[k++] = i;
        }
    if (k == 0) return;
    group_data_t *x = &d->g[g];
    int status = kvt_xfer_submit(x->xf, (unsigned)src, (unsigned)dst, d->copies, k, 0, NULL);
    if (status == KVT_OK) {
        kvt_xfer_done_t done;
        while (kvt_xfer_poll(x->xf, &done, 1, UINT64_MAX) != 1) {}
        status = done.status;
    }
    if (status == KVT_ECORRUPT) d->r.corrupt++;
    for (size_t j = 0; j < k; j++) {
        ok[d->at[j]] = status == KVT_OK;
        if (status != KVT_OK) d->r.failed++;
        else if (dst == L2) d->r.down_bytes += x->bytes;
        else d->r.up_bytes += x->bytes;
    }
}

void pieces_data_run(pieces_data_t *d, const kvt_hybrid_move_t *mv, size_t n, uint8_t *ok) {
    if (!grow(d, n)) abort(); /* a few bytes per move handed out */
    for (size_t i = 0; i < n; i++) {
        const kvt_hybrid_move_t *m = &mv[i];
        if (m->src_tier != KVT_HYBRID_ENGINE) continue;
        /* what the request computed goes to L1 (hybrid.h) */
        ok[i] = m->dst_tier == 1 &&
                kvt_tier_pattern_fill(d->g[m->group].tier[L1], m->dst_slot, seed_lo(m->key.lo, m->group), m->key.hi,
                                      d->buf) == KVT_OK;
        d->r.filled += ok[i];
    }
    for (uint32_t g = 0; g < d->ngroups; g++) {
        if (d->g[g].xf == NULL) continue;
        copy_batch(d, g, L1, L2, mv, n, ok);
        copy_batch(d, g, L2, L1, mv, n, ok);
    }
}

void pieces_data_verify(pieces_data_t *d, const kvt_hybrid_t *c, const kvt_hybrid_req_t *req, const kvt_hash128_t *hash) {
    uint64_t n = req->hit_pages;
    if (n == 0) return;
    for (uint32_t g = 0; g < d->ngroups; g++) {
        const kvt_layer_group_t *gr = &d->groups[g];
        if (gr->kind == KVT_GROUP_FULL) continue;
        /* the pieces n needs (hybrid.h, the match rule): a checkpoint after page n - 1, or the window's pages */
        uint64_t nP = n * d->P, first = gr->kind == KVT_GROUP_STATE ? n - 1
                                      : nP > gr->window ? (nP - gr->window) / d->P : 0;
        size_t k = 0;
        int rc = kvt_hybrid_slots(c, req, g, d->slots, d->slots_cap, &k);
        if (rc == KVT_ERANGE) {
            uint64_t *s = realloc(d->slots, k * sizeof(*s));
            if (s == NULL) abort(); /* a window's pages */
            d->slots = s;
            d->slots_cap = k;
            rc = kvt_hybrid_slots(c, req, g, d->slots, d->slots_cap, &k);
        }
        if (rc != KVT_OK) continue; /* a piece that did not reach L1: the hit is recomputed */
        for (size_t i = 0; i < k; i++, d->r.verified++) {
            const kvt_hash128_t *h = &hash[first + i];
            if (kvt_tier_pattern_check(d->g[g].tier[L1], d->slots[i], seed_lo(h->lo, g), h->hi, d->buf)) continue;
            if (d->r.mismatches++ < 5)
                fprintf(stderr, "kvtier replay: --verify: group %u's %s (L1 slot %" PRIu64 ") differs from its content\n",
                        g, gr->kind == KVT_GROUP_STATE ? "checkpoint" : "window page", d->slots[i]);
        }
    }
}

void pieces_data_result(pieces_data_t *d, pieces_data_result_t *r) { *r = d->r; }

void pieces_data_close(pieces_data_t *d) {
    if (d == NULL) return;
    for (uint32_t g = 0; g < KVT_MODEL_MAX_GROUPS; g++) {
        kvt_xfer_destroy(d->g[g].xf);
        kvt_tier_destroy(d->g[g].tier[L1]);
        kvt_tier_destroy(d->g[g].tier[L2]);
    }
    free(d->buf);
    free(d->copies);
    free(d->at);
    free(d->slots);
    free(d);
}
