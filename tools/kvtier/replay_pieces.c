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
} group_data_t;

struct pieces_data {
    group_data_t g[KVT_MODEL_MAX_GROUPS];
    kvt_layer_group_t groups[KVT_MODEL_MAX_GROUPS];
    uint32_t ngroups, P;
    kvt_hybrid_plane_t *plane;
    uint8_t *buf;    /* the largest piece */
    uint64_t *slots; /* a hit's pieces of one group */
    size_t slots_cap;
    uint64_t verified, mismatches;
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
        uint64_t bytes = kvt_hybrid_piece_bytes(gr, page_tokens);
        if (bytes > most) most = bytes;
        kvt_tier_config_t tc = {.size = sizeof(tc), .kind = KVT_TIER_ARENA, .name = "pieces-l1",
                                .geom = {cfg->l1_slots[g], 1, bytes, KVT_LAYOUT_PAGE_FIRST}};
        what = "an L1 tier (arena)";
        rc = kvt_tier_create(&x->tier[L1], &tc);
        if (rc == KVT_OK) {
            tc = (kvt_tier_config_t){.size = sizeof(tc), .kind = KVT_TIER_HOST, .name = "pieces-l2",
                                     .flags = KVT_TIER_HUGE | KVT_TIER_CHECKSUM,
                                     .geom = {cfg->l2_slots[g], 1, bytes, KVT_LAYOUT_PAGE_FIRST}};
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

/* kvt_hybrid_write_fn: the forward pass's piece, into its L1 slot. */
static int write_piece(void *arg, const kvt_hybrid_move_t *m) {
    pieces_data_t *d = arg;
    return kvt_tier_pattern_fill(d->g[m->group].tier[L1], m->dst_slot, seed_lo(m->key.lo, m->group), m->key.hi, d->buf);
}

int pieces_data_attach(pieces_data_t *d, kvt_hybrid_t *c, kvt_store_t *const *put, kvt_store_t *const *get) {
    kvt_hybrid_plane_config_t pc = {.size = sizeof(pc), .write = write_piece, .arg = d};
    for (uint32_t g = 0; g < d->ngroups; g++) {
        if (d->g[g].xf == NULL) continue;
        pc.groups[g] = (kvt_hybrid_plane_group_t){d->g[g].xf, d->g[g].tier[L1], d->g[g].tier[L2], L1, L2,
                                                  put ? put[g] : NULL, get ? get[g] : NULL};
    }
    int rc = kvt_hybrid_plane_create(&d->plane, c, &pc);
    if (rc != KVT_OK) fprintf(stderr, "kvtier replay: --data: cannot create the pieces' data plane: %s\n", kvt_strerror(rc));
    return rc == KVT_OK ? 0 : -1;
}

kvt_hybrid_plane_t *pieces_data_plane(pieces_data_t *d) { return d->plane; }

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
        for (size_t i = 0; i < k; i++, d->verified++) {
            const kvt_hash128_t *h = &hash[first + i];
            if (kvt_tier_pattern_check(d->g[g].tier[L1], d->slots[i], seed_lo(h->lo, g), h->hi, d->buf)) continue;
            if (d->mismatches++ < 5)
                fprintf(stderr, "kvtier replay: --verify: group %u's %s (L1 slot %" PRIu64 ") differs from its content\n",
                        g, gr->kind == KVT_GROUP_STATE ? "checkpoint" : "window page", d->slots[i]);
        }
    }
}

void pieces_data_result(pieces_data_t *d, pieces_data_result_t *r) {
    r->verified = d->verified;
    r->mismatches = d->mismatches;
    r->plane.size = sizeof(r->plane);
    kvt_hybrid_plane_stats(d->plane, &r->plane);
}

void pieces_data_detach(pieces_data_t *d) {
    if (d == NULL) return;
    kvt_hybrid_plane_destroy(d->plane);
    d->plane = NULL;
}

void pieces_data_close(pieces_data_t *d) {
    if (d == NULL) return;
    pieces_data_detach(d);
    for (uint32_t g = 0; g < KVT_MODEL_MAX_GROUPS; g++) {
        kvt_xfer_destroy(d->g[g].xf);
        kvt_tier_destroy(d->g[g].tier[L1]);
        kvt_tier_destroy(d->g[g].tier[L2]);
    }
    free(d->buf);
    free(d->slots);
    free(d);
}
