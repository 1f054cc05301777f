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
/* A rank's result, one list: the struct, and its --json "per_rank" entry. */
#define CP_RESULT_FIELDS(X)                                             \
    X(owned_pages, GAUGE, "L1 pages of its lane in use at the end")     \
    X(dealt_pages, COUNTER, "L1 pages its lane was dealt")              \
    X(l1_hit_pages, COUNTER, "its pages that were L1 hits")             \
    X(loads, COUNTER, "its pages loaded back from L2")                  \
    X(load_bytes, COUNTER, "bytes it loaded")                           \
    X(backups, COUNTER, "backups it made (rank 0: all)")                \
    X(backup_bytes, COUNTER, "bytes it backed up")                      \
    X(verified, COUNTER, "loaded pages checked")                        \
    X(mismatches, COUNTER, "loaded pages that differed")                \
    X(tokens, COUNTER, "tokens admitted")                               \
    X(hit_tokens, COUNTER, "tokens served from L1 or L2")               \
    X(wait_ns, COUNTER, "time spent in cross-process waits")

typedef struct cp_result {
#define CP_RESULT_FIELD_(f, kind, help) uint64_t f;
    CP_RESULT_FIELDS(CP_RESULT_FIELD_)
#undef CP_RESULT_FIELD_
} cp_result_t;

/* This rank's result from its cache and group; l2_page_bytes 0 without data. */
void cp_result_fill(cp_result_t *me, const kvt_cache_t *c, const kvt_cp_group_t *g, uint32_t rank, uint64_t l2_page_bytes);

/* Rank 0: the group's table or --json from all[0..C); another rank: its own
 * line or --json from all[0]. divergence: the first request whose digests
 * differ (0: they agree). */
int cp_print(const opts_t *o, uint32_t rank, uint32_t C, uint64_t n, double wall, uint64_t divergence,
             const cp_result_t *all);

#define CP_QUIET 3 /* a forked rank's exit: stopped by another, or reported; the cause said why */

/* A rank failed (rc): the rank that caused it says why; one the group
 * stopped says so only when run alone. Returns the rank's exit status. */
int cp_print_failure(kvt_cp_group_t *g, uint32_t rank, int rc, bool forked, bool interrupted);
/* The coordinator's last word on its n forked ranks (group_watch's result:
 * the first that died and its status); returns its exit status. */
int cp_print_outcome(const child_t *ch, uint32_t n, int dead, int why);

#endif
