/* kvtier cp's output: the group's summary (rank 0) or one rank's own result. */
#ifndef KVTIER_TOOLS_CP_PRINT_H
#define KVTIER_TOOLS_CP_PRINT_H

#include <stdbool.h>
#include <stdint.h>

#include "group.h"
#include "kvtier/cache.h"
#include "kvtier/cp.h"
#include "replay.h"

/* What a rank publishes to the group at the end (kvt_cp_group_finish). */
typedef struct cp_result {
    uint64_t owned_pages, dealt_pages, l1_hit_pages, loads, load_bytes, backups, backup_bytes, verified, mismatches;
    uint64_t tokens, hit_tokens, wait_ns;
} cp_result_t;

/* This rank's result from its cache and group; l2_page_bytes 0 without data. */
void cp_result_fill(cp_result_t *me, const kvt_cache_t *c, const kvt_cp_group_t *g, uint32_t rank, uint64_t l2_page_bytes);

/* Rank 0: the group's table or --json from all[0..C); another rank: its own
 * line or --json from all[0]. divergence: the first request whose digests
 * differ (0: they agree). */
void cp_print(const opts_t *o, uint32_t rank, uint32_t C, uint64_t n, double wall, uint64_t divergence,
              const cp_result_t *all);

#define CP_QUIET 3 /* a forked rank's exit: stopped by another, or reported; the cause said why */

/* A rank failed (rc): the rank that caused it says why; one the group
 * stopped says so only when run alone. Returns the rank's exit status. */
int cp_print_failure(kvt_cp_group_t *g, uint32_t rank, int rc, bool forked, bool interrupted);
/* The coordinator's last word on its n forked ranks (group_watch's result:
 * the first that died and its status); returns its exit status. */
int cp_print_outcome(const child_t *ch, uint32_t n, int dead, int why);

#endif
