/* kvtier replay --data on a hybrid model: real bytes for the window pages
 * and checkpoints (the full groups' pages are replay_data.c's, on the
 * hybrid cache's radix cache).
 *
 * Each window or state group g has an L1 tier (arena) of its L1 slots and an
 * L2 tier (host memory, checksums) of its L2 slots, a page per piece (a
 * window page: the group's bytes per token x page_tokens; a checkpoint: its
 * bytes), and a transfer engine of its own between the two. The cache's
 * moves (kvt_hybrid_take_moves, async_moves) run as it hands them out:
 *
 *   from the engine   the piece's content is written into its L1 slot:
 *                     kvt_pattern_fill seeded by its key and group, so that
 *                     a piece of another group or position never passes
 *   L1 <-> L2         a batch per group and direction on the group's
 *                     engine, which checks L2's checksums on the way up
 *   L3 (a store)      puts read the L2 slot, gets write the L1 slot (the
 *                     store checks each object): replay_hybrid.c runs them
 *
 * With --verify every piece an admission's hit has in L1 is compared with
 * its content before the request runs. A modeled L3 (--l3-pages) holds no
 * bytes: refused with --data. */
#ifndef KVTIER_TOOLS_REPLAY_PIECES_H
#define KVTIER_TOOLS_REPLAY_PIECES_H

#include <stdbool.h>
#include <stdint.h>

#include "kvtier/hybrid.h"
#include "kvtier/radix.h"
#include "kvtier/stats.h"
#include "kvtier/tier.h"

typedef struct pieces_data_result {
    uint64_t filled;             /* pieces written from what a request computed */
    uint64_t verified, mismatches; /* pieces of hits checked in L1, and those that differed */
    uint64_t failed;             /* moves between L1 and L2 that failed (fault injection, a checksum) */
    uint64_t corrupt;            /* of those, batches refused by an L2 checksum */
    uint64_t down_bytes, up_bytes; /* L1 -> L2, L2 -> L1 */
} pieces_data_result_t;

typedef struct pieces_data pieces_data_t;

/* The tiers and engines for cfg's window and state groups (cfg as given to
 * kvt_hybrid_create; cfg->cache.l3_pages must be 0). faults: each copy
 * fails with this probability (kvtier-test only). Prints why and returns -1
 * on failure. */
int pieces_data_open(pieces_data_t **out, const kvt_hybrid_config_t *cfg, uint32_t page_tokens, uint32_t threads,
                     double faults);
/* Group g's tier t (1: L1, 2: L2), where a store's gets and puts go. */
kvt_tier_t *pieces_data_tier(pieces_data_t *d, uint32_t g, int t);
/* Runs the moves mv[0..n) handed out together (they are safe to run at
 * once) that stay within L1 and L2, and waits for them: ok[i] whether each
 * landed. The store's moves are left as they are. */
void pieces_data_run(pieces_data_t *d, const kvt_hybrid_move_t *mv, size_t n, uint8_t *ok);
/* --verify: compares the pieces req's hit has in L1 with their content;
 * hash: the chained page hashes of the request's pages. */
void pieces_data_verify(pieces_data_t *d, const kvt_hybrid_t *c, const kvt_hybrid_req_t *req, const kvt_hash128_t *hash);
void pieces_data_result(pieces_data_t *d, pieces_data_result_t *r);
void pieces_data_close(pieces_data_t *d);

#endif
