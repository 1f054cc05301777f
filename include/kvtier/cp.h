/* kvtier — context-parallel (CP) shared KV: owner lanes and slot translation.
 *
 * Under CP size C the KV pages of one sequence are spread over the C ranks
 * of a node: logical page p is owned by lane (rank) p mod C and sits at local
 * page p div C of that lane. With R pages per rank and P slots (tokens) per
 * page, slot s is at
 *
 *   page  = s div P          offset = s mod P
 *   owner = page mod C       local  = page div C
 *
 * and has two addresses:
 *
 *   read view   (owner x R + local) x P + offset   all lanes, rank-major: what
 *                                                  the I/O rank reads to back
 *                                                  up every page
 *   write view  local x P + offset                 the owner's own shard
 *
 *   C = 4, P = 64, R = 8:  slot 64 -> page 1, owner 1, local 0
 *                          -> read slot (1 x 8 + 0) x 64 = 512, write slot 0
 *
 *   read view:  | lane 0: R pages | lane 1: R pages | lane 2 | lane 3 |
 *   logical:      0  4  8 ...       1  5  9 ...       2 ...    3 ...
 *
 * Padding slots (KVT_CP_PAD, what an engine puts in unused positions of a
 * batch) pass through every translation unchanged and are owned by no rank.
 */
#ifndef KVTIER_CP_H
#define KVTIER_CP_H

#include "kvtier/export.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvtier/alloc.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_CP_PAD UINT64_MAX

typedef struct kvt_cp_layout {
    uint32_t ranks;          /* C >= 1 */
    uint64_t pages_per_rank; /* R >= 1 */
    uint64_t slots_per_page; /* P >= 1 */
} kvt_cp_layout_t;

/* KVT_EINVAL for a zero or an overflowing size (C x R x P must fit 64 bits). */
KVT_API int kvt_cp_layout_check(const kvt_cp_layout_t *l);

static inline uint64_t kvt_cp_page(const kvt_cp_layout_t *l, uint64_t s) { return s == KVT_CP_PAD ? KVT_CP_PAD : s / l->slots_per_page; }
static inline uint64_t kvt_cp_offset(const kvt_cp_layout_t *l, uint64_t s) { return s == KVT_CP_PAD ? KVT_CP_PAD : s % l->slots_per_page; }
/* Owner lane and local page of a logical page. */
static inline uint32_t kvt_cp_owner(const kvt_cp_layout_t *l, uint64_t page) { return kvt_lane_of(page, l->ranks); }
static inline uint64_t kvt_cp_local(const kvt_cp_layout_t *l, uint64_t page) { return kvt_lane_local(page, l->ranks); }
/* The read-view page of a logical page: owner x R + local. */
static inline uint64_t kvt_cp_read_page(const kvt_cp_layout_t *l, uint64_t page) {
    return page == KVT_CP_PAD ? KVT_CP_PAD : kvt_lane_major(page, l->ranks, l->pages_per_rank);
}

/* Slot translation; KVT_CP_PAD passes through. */
KVT_API uint64_t kvt_cp_read_slot(const kvt_cp_layout_t *l, uint64_t s);
KVT_API uint64_t kvt_cp_write_slot(const kvt_cp_layout_t *l, uint64_t s);
KVT_API bool kvt_cp_owns(const kvt_cp_layout_t *l, uint32_t rank, uint64_t s);
/* mask[i] = kvt_cp_owns(rank, slots[i]); returns how many are owned. */
KVT_API size_t kvt_cp_owned_mask(const kvt_cp_layout_t *l, uint32_t rank, const uint64_t *slots, size_t n, uint8_t *mask);

/* A host page and a logical device page. */
typedef struct kvt_cp_pair {
    uint64_t host, device;
} kvt_cp_pair_t;

/* The host -> device pairs rank must load: only the pages it owns, device
 * pages in its write view (local pages). Padding is skipped. Returns the
 * count written to out (room for n). */
KVT_API size_t kvt_cp_select_loads(const kvt_cp_layout_t *l, uint32_t rank, const kvt_cp_pair_t *pairs, size_t n,
                           kvt_cp_pair_t *out);
/* The device -> host pairs the I/O rank backs up: every page, device pages
 * in the read view; padding passes through. Returns n. */
KVT_API size_t kvt_cp_select_backups(const kvt_cp_layout_t *l, const kvt_cp_pair_t *pairs, size_t n, kvt_cp_pair_t *out);

#ifdef __cplusplus
}
#endif
#endif
