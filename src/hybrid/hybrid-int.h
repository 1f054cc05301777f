/* The hybrid cache's pure parts (groups.c), shared with hybrid.c: the match
 * rule over any residency, and the configuration's checks and splits. */
#ifndef KVTIER_HYBRID_INT_H
#define KVTIER_HYBRID_INT_H

#include <stddef.h>
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

/* A group's slot: a window page (bytes per token x P) or a checkpoint;
 * UINT64_MAX past 2^64 - 1 (a configuration refused by kvt__hybrid_config_ok). */
uint64_t kvt__hybrid_slot_bytes(const kvt_layer_group_t *g, uint32_t P);
/* The groups, slots and write policies of a configuration hold together. */
int kvt__hybrid_config_ok(const kvt_hybrid_config_t *c);

/* For the data plane (plane.c): the cache's configuration, and whether a
 * request is admitted. */
const kvt_hybrid_config_t *kvt__hybrid_cfg(const kvt_hybrid_t *h);
int kvt__hybrid_live(const kvt_hybrid_t *h);
/* The outside L3 goes (its probe with the plane that set it): pieces are no
 * longer looked for there. */
void kvt__hybrid_drop_l3(kvt_hybrid_t *h);
/* Whether it has one (kvt_hybrid_set_l3). */
int kvt__hybrid_has_l3(const kvt_hybrid_t *h);
/* The plane runs the moves from now on (on) or no more: while it does,
 * kvt_hybrid_take_moves hands out none, and kvt_hybrid_moves_done and
 * kvt_hybrid_set_l3 refuse, so that a move is never taken, reported or
 * rerouted behind its back; the plane takes and reports through these. */
void kvt__hybrid_drive(kvt_hybrid_t *h, bool on);
/* The plane's write callback runs (on) or no more: meanwhile the calls that
 * change the cache answer KVT_EBUSY, as while the L3's probe runs. Returns
 * what was before (to put back). */
bool kvt__hybrid_calling_out(kvt_hybrid_t *h, bool on);
size_t kvt__hybrid_take_moves(kvt_hybrid_t *h, kvt_hybrid_move_t *out, size_t cap);
int kvt__hybrid_moves_done(kvt_hybrid_t *h, const kvt_hybrid_move_t *moves, size_t n, const uint8_t *ok);
/* Group g's keyed cache of tier t (0-based), or NULL: for the unit tests
 * that plant a fault for kvt_hybrid_check to find. */
kvt_keyed_t *kvt__hybrid_keyed(kvt_hybrid_t *h, uint32_t g, int t);

/* The moves outstanding with async_moves (pending.c), from their record to
 * the engine's report: entries with stable indexes, found by destination
 * (group, dst_tier, key) through hash chains, and a ring of those ready to
 * hand out, in the order they became ready. */
enum { PEND_FREE = 0, PEND_WAITING = 1, PEND_QUEUED = 2, PEND_TAKEN = 3 };
#define PEND_NONE UINT32_MAX

typedef struct kvt__pend {
    kvt_hybrid_move_t m;
    uint32_t next;   /* the next entry of its chain (of the free list when free) */
    uint32_t waiter; /* the move into the slot this one copies out of, waiting for it to land; PEND_NONE */
    uint8_t state, src_pinned, seen;
    uint8_t evict_src; /* a round's copy down: the source leaves its tier when the copy lands */
} kvt__pend_t;

typedef struct kvt__pendtab {
    kvt__pend_t *e;
    uint32_t cap, live, free;
    uint32_t *bucket, nb;        /* chain heads; nb a power of two, at least 2 x cap */
    uint32_t *queue, qhead, qn; /* the ring of PEND_QUEUED entries, cap long */
} kvt__pendtab_t;

void kvt__pend_free(kvt__pendtab_t *t);
/* Room for `more` entries beside those live: KVT_ENOMEM changes nothing. */
int kvt__pend_reserve(kvt__pendtab_t *t, size_t more);
/* Adds m (room reserved): waiting, or queued to hand out. Its index. */
uint32_t kvt__pend_add(kvt__pendtab_t *t, const kvt_hybrid_move_t *m, int src_pinned, int waiting);
/* A waiting entry becomes ready to hand out. */
void kvt__pend_ready(kvt__pendtab_t *t, uint32_t i);
/* Hands out up to cap queued moves, oldest first; they become taken. */
size_t kvt__pend_take(kvt__pendtab_t *t, kvt_hybrid_move_t *out, size_t cap);
/* The entry of move m in that state with that seen mark, or PEND_NONE. */
uint32_t kvt__pend_find(const kvt__pendtab_t *t, const kvt_hybrid_move_t *m, int state, int seen);
/* The first entry of the chain that holds the moves into (group, dst_tier,
 * key) (others may share it: compare), or PEND_NONE; then e[i].next. */
uint32_t kvt__pend_chain(const kvt__pendtab_t *t, uint32_t group, uint32_t dst_tier, kvt_key128_t key);
void kvt__pend_remove(kvt__pendtab_t *t, uint32_t i);
/* The table's own invariants: NULL, or the first one broken. */
const char *kvt__pend_check(const kvt__pendtab_t *t);

#endif
