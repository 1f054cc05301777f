/* kvtier replay --data on a hybrid model: real bytes for the window pages
 * and checkpoints (the full groups' pages are replay_data.c's, on the
 * hybrid cache's radix cache).
 *
 * Each window or state group g has an L1 tier (arena) of its L1 slots and an
 * L2 tier (host memory, checksums) of its L2 slots, a page per piece, and a
 * transfer engine of its own between the two; kvtier's data plane for the
 * pieces (kvt_hybrid_plane, hybrid.h) runs the cache's moves on them and on
 * the store (--l3 URL), and writes what a request computed into its L1 slot
 * through the callback here: content derived from the piece's key and group
 * (kvt_pattern_fill), so that a piece of another group or position never
 * passes. With --verify every piece an admission's hit has in L1 is
 * compared with its content before the request runs. A modeled L3
 * (--l3-pages) holds no bytes: refused with --data. */
#ifndef KVTIER_TOOLS_REPLAY_PIECES_H
#define KVTIER_TOOLS_REPLAY_PIECES_H

#include <stdbool.h>
#include <stdint.h>

#include "kvtier/hybrid.h"
#include "kvtier/radix.h"
#include "kvtier/store.h"

typedef struct pieces_data_result {
    uint64_t verified, mismatches; /* pieces of hits checked in L1, and those that differed */
    kvt_hybrid_plane_stats_t plane;
} pieces_data_result_t;

typedef struct pieces_data pieces_data_t;

/* The tiers and engines for cfg's window and state groups (cfg as given to
 * kvt_hybrid_create; no modeled L3 for them). faults: each copy fails with
 * this probability (kvtier-test only). Prints why and returns -1 on
 * failure. */
int pieces_data_open(pieces_data_t **out, const kvt_hybrid_config_t *cfg, uint32_t page_tokens, uint32_t threads,
                     double faults);
/* Group g's tier t (1: L1, 2: L2): a store's gets go to L1, its puts leave L2. */
kvt_tier_t *pieces_data_tier(pieces_data_t *d, uint32_t g, int t);
/* The data plane for c over the tiers, with the stores put[g] and get[g]
 * (NULL arrays: no store). Prints why and returns -1 on failure. */
int pieces_data_attach(pieces_data_t *d, kvt_hybrid_t *c, kvt_store_t *const *put, kvt_store_t *const *get);
kvt_hybrid_plane_t *pieces_data_plane(pieces_data_t *d);
/* --verify: compares the pieces req's hit has in L1 with their content;
 * hash: the chained page hashes of the hit's pages (req->hit_pages). */
void pieces_data_verify(pieces_data_t *d, const kvt_hybrid_t *c, const kvt_hybrid_req_t *req, const kvt_hash128_t *hash);
void pieces_data_result(pieces_data_t *d, pieces_data_result_t *r);
/* The plane goes (before the cache and the stores), then, with close, the
 * engines and tiers (after the stores). */
void pieces_data_detach(pieces_data_t *d);
void pieces_data_close(pieces_data_t *d);

#endif
