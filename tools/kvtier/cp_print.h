/* kvtier cp's output: the group's summary (rank 0) or one rank's own result. */
#ifndef KVTIER_TOOLS_CP_PRINT_H
#define KVTIER_TOOLS_CP_PRINT_H

#include <stdint.h>

#include "replay.h"

/* What a rank publishes to the group at the end (kvt_cp_group_finish). */
typedef struct cp_result {
    uint64_t owned_pages, dealt_pages, l1_hit_pages, loads, load_bytes, backups, backup_bytes, verified, mismatches;
    uint64_t tokens, hit_tokens, wait_ns;
} cp_result_t;

/* Rank 0: the group's table or --json from all[0..C); another rank: its own
 * line or --json from all[0]. divergence: the first request whose digests
 * differ (0: they agree). */
void cp_print(const opts_t *o, uint32_t rank, uint32_t C, uint64_t n, double wall, uint64_t divergence,
              const cp_result_t *all);

#endif
