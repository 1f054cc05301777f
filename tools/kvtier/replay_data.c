#include "replay_data.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "kvtier/error.h"
#include "kvtier/testing.h"
#include "kvtier/radix.h"

#define L1 0
#define L2 1

struct replay_data {
    data_opts_t o;
    kvt_tier_t *tier[2];
    kvt_xfer_t *xf;
    uint8_t *buf;            /* one layer of one page */
    kvt_hash128_t *hash;     /* page hashes of the current request */
    uint64_t hash_cap;
    uint64_t filled, verified_hits, verified_loads, mismatches;
};

int replay_data_open(replay_data_t **out, kvt_cache_t *c, const data_opts_t *o) {
    replay_data_t *d = calloc(1, sizeof(*d));
    if (d == NULL || (d->buf = malloc(o->layer_bytes)) == NULL) {
        free(d);
        fprintf(stderr, "kvtier replay: out of memory\n");
        return -1;
    }
    d->o = *o;
    kvt_tier_config_t tc = {.size = sizeof(tc), .kind = KVT_TIER_ARENA, .name = "l1",
                            .geom = {o->l1_pages, o->layers, o->layer_bytes, o->layout}};
    int rc = kvt_tier_create(&d->tier[L1], &tc);
    const char *what = "L1 (arena)";
    if (rc == KVT_OK) {
        tc = (kvt_tier_config_t){.size = sizeof(tc), .kind = KVT_TIER_HOST, .name = "l2",
                                 .flags = KVT_TIER_HUGE | KVT_TIER_CHECKSUM,
                                 .geom = {o->l2_pages, o->layers, o->layer_bytes, o->layout}};
        rc = kvt_tier_create(&d->tier[L2], &tc);
        what = "L2 (host)";
    }
    if (rc == KVT_OK) {
        kvt_xfer_config_t xc;
        kvt_xfer_config_default(&xc);
        xc.threads = o->threads;
        rc = kvt_xfer_create(&d->xf, &xc, d->tier, 2);
        what = "the transfer engine";
    }
#ifdef KVT_TESTING /* --copy-faults */
    if (rc == KVT_OK && o->faults > 0) {
        kvt_xfer_faults_t f = {.size = sizeof(f), .fail_p = o->faults, .delay_p = o->faults, .delay_max_ns = 1000000, .seed = 1};
        rc = kvt_xfer_set_faults(d->xf, &f);
        what = "the fault injection";
    }
#endif
    if (rc == KVT_OK) {
        rc = kvt_cache_attach(c, d->xf, d->tier[L1], L1, d->tier[L2], L2);
        what = "the data plane";
    }
    if (rc != KVT_OK) {
        fprintf(stderr, "kvtier replay: --data: cannot create %s: %s\n", what, kvt_strerror(rc));
        replay_data_close(d);
        return -1;
    }
    *out = d;
    return 0;
}

void replay_data_request(replay_data_t *d, const int32_t *tokens, const kvt_cache_req_t *req, const uint32_t *l1_ids) {
    if (req->pages > d->hash_cap) {
        kvt_hash128_t *h = realloc(d->hash, req->pages * sizeof(*h));
        if (h == NULL) abort(); /* a few bytes per page of one request */
        d->hash = h;
        d->hash_cap = req->pages;
    }
    kvt_page_hash_chain(0, tokens, req->pages, (uint32_t)d->o.page_tokens, d->hash);
    uint64_t old = req->pages - req->new_pages;
    for (uint64_t j = 0; d->o.verify && j < old; j++) {
        bool loaded = j >= req->l1_hit_pages;
        if (!kvt_tier_pattern_check(d->tier[L1], l1_ids[j], d->hash[j].lo, d->hash[j].hi, d->buf)) {
            if (d->mismatches++ < 5)
                fprintf(stderr, "kvtier replay: --verify: page %" PRIu64 " (L1 page %u, %s) differs from its content\n",
                        j, l1_ids[j], loaded ? "loaded from L2" : "an L1 hit");
        }
        if (loaded) d->verified_loads++;
        else d->verified_hits++;
    }
    for (uint64_t j = old; j < req->pages; j++, d->filled++)
        kvt_tier_pattern_fill(d->tier[L1], l1_ids[j], d->hash[j].lo, d->hash[j].hi, d->buf);
}

void replay_data_result(replay_data_t *d, kvt_cache_t *c, data_result_t *r) {
    kvt_cache_sync(c);
    r->page_bytes = (uint64_t)d->o.layers * d->o.layer_bytes;
    r->layers = d->o.layers;
    r->layout = d->o.layout;
    r->filled_pages = d->filled;
    r->verified_hits = d->verified_hits;
    r->verified_loads = d->verified_loads;
    r->mismatches = d->mismatches;
    r->d2h.size = r->h2d.size = sizeof(r->d2h);
    kvt_xfer_stats(d->xf, L1, L2, &r->d2h);
    kvt_xfer_stats(d->xf, L2, L1, &r->h2d);
}

void replay_data_json(cJSON *d, const data_result_t *r) {
    cJSON_AddNumberToObject(d, "page_bytes", (double)r->page_bytes);
    cJSON_AddNumberToObject(d, "layers", (double)r->layers);
    cJSON_AddStringToObject(d, "layout", kvt_layout_name(r->layout));
    cJSON_AddNumberToObject(d, "filled_pages", (double)r->filled_pages);
    cJSON_AddNumberToObject(d, "verified_hits", (double)r->verified_hits);
    cJSON_AddNumberToObject(d, "verified_loads", (double)r->verified_loads);
    cJSON_AddNumberToObject(d, "mismatches", (double)r->mismatches);
}

void replay_data_emit(replay_data_t *d, kvt_emitter_t *e) {
    kvt_emit_begin(e, "xfer");
    kvt_xfer_emit(d->xf, e);
    kvt_emit_end(e);
}

kvt_tier_t *replay_data_l2(replay_data_t *d) { return d->tier[L2]; }

void replay_data_close(replay_data_t *d) {
    if (d == NULL) return;
    kvt_xfer_destroy(d->xf);
    kvt_tier_destroy(d->tier[L1]);
    kvt_tier_destroy(d->tier[L2]);
    free(d->buf);
    free(d->hash);
    free(d);
}
