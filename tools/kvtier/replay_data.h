/* kvtier replay --data: real pages behind the replay's cache.
 *
 * L1 is an `arena` tier, L2 a `host` tier with checksums; copies run on the
 * transfer engine. Each new L1 page is filled with content derived from its
 * page hash and layer (kvt_pattern_fill) before it is committed; with
 * --verify every page a request gets from L1 or loads back from L2 is
 * compared byte for byte with that content. */
#ifndef KVTIER_TOOLS_REPLAY_DATA_H
#define KVTIER_TOOLS_REPLAY_DATA_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "kvtier/cache.h"
#include "kvtier/stats.h"
#include "kvtier/tier.h"
#include "kvtier/xfer.h"

typedef struct data_opts {
    uint64_t page_tokens, l1_pages, l2_pages;
    uint32_t layers;
    uint64_t layer_bytes; /* per page */
    kvt_layout_t layout;
    uint32_t threads;
    bool verify;
    double faults; /* each copy fails with this probability, and is delayed up to 1 ms with it */
} data_opts_t;

typedef struct data_result {
    uint64_t page_bytes;
    uint32_t layers;     /* a page's cut */
    kvt_layout_t layout; /* and how the tiers lay the pieces out */
    uint64_t filled_pages, verified_hits, verified_loads, mismatches;
    kvt_xfer_stats_t d2h, h2d;
} data_result_t;

typedef struct replay_data replay_data_t;

/* Creates the tiers and the engine and attaches them to c. Prints the reason
 * and returns -1 on failure. */
int replay_data_open(replay_data_t **out, kvt_cache_t *c, const data_opts_t *o);
/* After admit (l1_ids from it): checks the pages the request got, fills its
 * new pages. tokens are the request's. */
void replay_data_request(replay_data_t *d, const int32_t *tokens, const kvt_cache_req_t *req, const uint32_t *l1_ids);
/* Waits for the copies in flight, then reads the figures. */
void replay_data_result(replay_data_t *d, kvt_cache_t *c, data_result_t *r);
void replay_data_emit(replay_data_t *d, kvt_emitter_t *e);
/* r's pages into the JSON object d: page_bytes, filled_pages, verified_hits,
 * verified_loads, mismatches. */
void replay_data_json(cJSON *d, const data_result_t *r);
/* The L2 tier (the L3 store reads and writes its pages). */
kvt_tier_t *replay_data_l2(replay_data_t *d);
/* Call after the cache is destroyed. */
void replay_data_close(replay_data_t *d);

#endif
