/* The hybrid cache's pure parts (groups.c), shared with hybrid.c: the match
 * rule over any residency, and the configuration's checks and splits. */
#ifndef KVTIER_HYBRID_INT_H
#define KVTIER_HYBRID_INT_H

#include <stdint.h>

#include "kvtier/hybrid.h"

/* Why a hit is shorter than the full groups' match (kvt_hybrid_req_t.short_by). */
enum { SHORT_NONE = 0, SHORT_WINDOW = 1, SHORT_STATE = 2, SHORT_ROOM = 3 };

/* The first page of window group g's window before n pages. */
uint64_t kvt__hybrid_first_needed(const kvt_layer_group_t *g, uint32_t P, uint64_t n);

/* have(ctx, g, i): window page i, or a checkpoint after i pages, is present. */
typedef int (*kvt__hybrid_have_fn)(void *ctx, uint32_t g, uint64_t i);
/* The longest n <= m every group continues from; *why the first check that
 * failed below m (SHORT_*). */
uint64_t kvt__hybrid_longest(const kvt_layer_group_t *groups, uint32_t ngroups, uint32_t P, uint64_t m,
                             kvt__hybrid_have_fn have, void *ctx, uint32_t *why);

/* A group's slot: a window page (bytes per token x P) or a checkpoint. */
uint64_t kvt__hybrid_slot_bytes(const kvt_layer_group_t *g, uint32_t P);
/* The groups, slots and write policies of a configuration hold together. */
int kvt__hybrid_config_ok(const kvt_hybrid_config_t *c);

#endif
