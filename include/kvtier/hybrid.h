/* kvtier — the hybrid cache: prefix reuse for models whose layers keep
 * different things (model.h, layer groups; docs/hybrid.md).
 *
 * The full groups' pages live in a radix cache (cache.h) with all its tiers,
 * policies and free-room planning. Each window group and each state group
 * has slots of its own in each tier: window pages (its bytes per token x
 * page_tokens) and state checkpoints (its checkpoint bytes), found by key —
 * the chained page hash (radix.h) of the page, or of the last page before
 * the checkpoint — in a keyed cache per group and tier (keyed.h), which
 * gives the slot ids and the eviction order, and the same free-room
 * planning (below).
 *
 * Free room. L1's and L2's pieces keep cache.l1_free_room and l2_free_room
 * of their slots free, as the tree keeps its pages (cache.h, Free room):
 * when a tier's free slots fall below half its target, a round evicts back
 * to the target, in the policy's order. The rounds run at release, between
 * requests, so that the next admissions' loads find free slots: under
 * write_back, the copies down of what L1 evicts are then off the hits'
 * path (stats: round_evictions, and admit_evictions for what an admission
 * still had to evict). A store that finds too few free slots evicts its
 * deficit. A round's victim the tier below lacks goes down first under
 * write_back (with async_moves it keeps its slot until the copy lands).
 *
 * The match rule. With page_tokens P, a request whose full groups match m
 * pages can continue every group from n pages when
 *
 *   n <= m,
 *   each window group (window W) has the pages covering [nP - W, nP):
 *     pages floor(max(0, nP - W) / P) .. n - 1, each in some tier, and
 *   each state group has a checkpoint at exactly n (n = 0 needs none).
 *
 * The cache serves the longest such n, searching back from m:
 *
 *   page       0    1    2    3    4    5    6          P = 16, W = 32
 *   full      [##] [##] [##] [##] [##] [##] [##]        m = 7
 *   window         [##] [##]      [##] [##]            n = 6 needs pages 4, 5: yes
 *   state          ^1             ^4                   ... and a checkpoint at 6: no
 *                                                       n = 4 needs 2, 3: no (3 absent)
 *   n = 3? window 1, 2: yes; checkpoint at 3: no. n = 2 needs 0, 1: no (0 absent): n = 0
 *   (the checkpoint at 1 is no use: its window needs page 0).
 *
 * What a request leaves behind (kvt_hybrid_release). The points where a later
 * request's hit can stop are its end (its last whole page), its branch point
 * (m, where it left the pages the tree had, when it ran past it) and every
 * checkpoint_every pages. Each state group keeps a checkpoint at each such
 * point the request ran through. Each window group keeps every page the
 * request computed; the pages within W tokens before a point are the
 * needed class, the rest the spare class, which every tier evicts first (a
 * hit that stops elsewhere can still load them while they last).
 *
 * Eviction order, beyond the spare class: cache.policy's, as the tree
 * orders its pages. A hit counts for every piece of its path (the window
 * pages and checkpoints below n), as for every node of a matched prefix.
 *   lru       the least recently stored or used piece first (a hit
 *             refreshes every piece of its path)
 *   lfu       the fewest hits first (counted to 255), then lru
 *   fifo      the first stored first: a refresh does not move a piece
 *   priority  the lowest priority first: the highest of the requests that
 *             stored the piece or hit its path, within [-128, 127] (the
 *             tree keeps 24 bits); then lru
 *   s2lru, arc  in L1, two classes: a piece a hit has used (the window
 *             pages before n, the checkpoint at n) is seen again, for good,
 *             and the pieces never used go first while they hold more than
 *             a share of L1's slots: none under s2lru; under arc a share
 *             learnt as ARC learns it, from the pieces a hit of the full
 *             groups' m needed and found in no tier that L1's ghosts
 *             remember losing (more room for the class that lost them);
 *             lru within a class, and in L2
 *   slru      in L1, a piece whose path two hits have counted is seen
 *             again; the pieces seen once go first; the seen-again ones
 *             hold at most 80 % of L1's slots, the least recent of them
 *             seen once again past it; lru within a class, and in L2
 * A piece's hit count, priority and (fifo) first store go with it between
 * L1 and L2. L3 keeps its pieces in lru order under every policy, as the
 * tree's L3 keeps its pages. Among equals the deeper piece goes first.
 *
 * Tiers. A group's slots have the full groups' tiers: L1 and, with
 * cache.l2_pages, L2 and, with cache.l3_pages (the modeled store), L3, or
 * the engine's own store as L3 (kvt_hybrid_set_l3). A
 * piece goes down as the cache's write policy says: write_through stores it
 * in L2 when it is stored in L1, write_back when L1 evicts it; likewise L2 to
 * L3 by l3_write_policy (write_through_selective is refused for the hybrid
 * slots: a window page or a checkpoint has no hit count). A hit loads the
 * pieces it needs into L1 (from the shallowest tier holding each); while the
 * request runs they are pinned there.
 *
 * This cache keeps metadata (slot ids, keys, residency): the engine owns
 * the bytes and copies them as the calls say, as with the keyed cache, or
 * kvtier's data plane does (kvt_hybrid_plane, at the end).
 *
 * Threads: one owner thread, as the radix cache.
 */
#ifndef KVTIER_HYBRID_H
#define KVTIER_HYBRID_H

#include "kvtier/export.h"

#include <stdbool.h>
#include <stdint.h>

#include "kvtier/cache.h"
#include "kvtier/keyed.h"
#include "kvtier/model.h"
#include "kvtier/store.h"
#include "kvtier/tier.h"
#include "kvtier/xfer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvt_hybrid kvt_hybrid_t;

typedef struct kvt_hybrid_config {
    uint32_t size;          /* sizeof(kvt_hybrid_config_t), set by the caller */
    uint32_t ngroups;       /* 1 .. KVT_MODEL_MAX_GROUPS */
    kvt_layer_group_t groups[KVT_MODEL_MAX_GROUPS]; /* at least one full; full groups share the radix pages */
    kvt_cache_config_t cache; /* the full groups' cache; l1/l2/l3_pages count full pages */
    /* Slots of group g (window or state; 0 for full groups) per tier: L1
     * >= 1; L2 when cache.l2_pages, L3 when cache.l3_pages (>= 1), else 0. */
    uint64_t l1_slots[KVT_MODEL_MAX_GROUPS];
    uint64_t l2_slots[KVT_MODEL_MAX_GROUPS];
    uint64_t l3_slots[KVT_MODEL_MAX_GROUPS];
    uint32_t checkpoint_every; /* a kept point every this many pages; 0: none */
    bool checkpoint_ends;      /* a request's end is a kept point (default true) */
    bool checkpoint_branches;  /* its branch point is a kept point (default true) */
    bool moves;                /* record the copies the engine owes (kvt_hybrid_take_moves); default off */
    bool async_moves;          /* with moves: the engine runs the moves taken in any order, at once, and
                                * reports each (kvt_hybrid_moves_done); default off: in order, done when run */
} kvt_hybrid_config_t;

/* The default split (kvt_hybrid_config_default): the state groups' share
 * of each tier, and the weight of a window group's bytes per token: an
 * eighth without an L3; with one, the whole in L1 and L2 and a quarter in
 * L3. What measured best on the Mooncake trace (docs/hybrid.md). */
#define KVT_HYBRID_STATE_SHARE 0.25
#define KVT_HYBRID_WINDOW_WEIGHT 0.125
#define KVT_HYBRID_WINDOW_WEIGHT_OVER_L3 1.0
#define KVT_HYBRID_L3_WINDOW_WEIGHT 0.25

/* Fills cfg for groups[0..ngroups) with the radix cache's defaults
 * (kvt_cache_config_default) at page_tokens, and splits each tier's bytes
 * (l1_bytes, l2_bytes, l3_bytes; 0: no such tier, L1 > 0) between the
 * groups: the state groups take KVT_HYBRID_STATE_SHARE (in proportion to
 * their checkpoint bytes), the full and window groups the rest, in
 * proportion to their bytes per token, a window group's weighed by
 * KVT_HYBRID_WINDOW_WEIGHT (it needs only the pages before kept points),
 * or with an L3 by KVT_HYBRID_WINDOW_WEIGHT_OVER_L3 in L1 and L2 and
 * KVT_HYBRID_L3_WINDOW_WEIGHT in L3 (the long tail's full pages come back
 * from L3, and L1 and L2 hold the window pages that continue them). Kept
 * points at ends and branch points (checkpoint_every 0). The split and the
 * points are what measured best on the Mooncake trace (docs/hybrid.md).
 * KVT_EINVAL for bad groups (kvt_hybrid_create's checks) or a tier too small
 * for one page or slot of each group. */
KVT_API int kvt_hybrid_config_default(kvt_hybrid_config_t *cfg, const kvt_layer_group_t *groups, uint32_t ngroups,
                                      uint32_t page_tokens, uint64_t l1_bytes, uint64_t l2_bytes, uint64_t l3_bytes);
/* Splits each tier's bytes again, for cfg's groups and page_tokens: the
 * state groups take state_share (0, 1) when there are any, the others the
 * rest in proportion to bytes per token, a window group's weighed by
 * window_weight (0, 16]. Sets cache.l1/l2/l3_pages and the slots (a tier of
 * 0 bytes: none; L3 needs L2). KVT_EINVAL, cfg unchanged, for bad values or
 * a tier too small for one page or slot of each group. */
KVT_API int kvt_hybrid_config_split(kvt_hybrid_config_t *cfg, uint64_t l1_bytes, uint64_t l2_bytes, uint64_t l3_bytes,
                                    double state_share, double window_weight);
/* kvt_hybrid_config_split for one tier (1: L1, 2: L2, 3: L3) alone, the
 * others as they are: a tier may weigh the window groups otherwise (a large
 * L3 keeps the window pages that the smaller tiers above let go). Bytes 0:
 * no such tier (not for L1; an L3 needs an L2). KVT_EINVAL, cfg unchanged,
 * as kvt_hybrid_config_split. */
KVT_API int kvt_hybrid_config_split_tier(kvt_hybrid_config_t *cfg, uint32_t tier, uint64_t bytes, double state_share,
                                         double window_weight);

/* KVT_EINVAL, nothing allocated, for a bad config: groups (a kind out of
 * range, layers or bytes 0, a window group's window 0, another's nonzero,
 * reserved_ set, no full group, a page or slot or a tier of them past
 * 2^64 - 1 bytes), slots against the tiers, a write policy
 * the slots refuse, async_moves without moves; and whatever
 * kvt_cache_create refuses. KVT_ENOMEM. */
KVT_API int kvt_hybrid_create(kvt_hybrid_t **out, const kvt_hybrid_config_t *cfg);
/* Also frees what requests admitted and never released held. */
KVT_API void kvt_hybrid_destroy(kvt_hybrid_t *h);

/* An admitted request (frozen: docs/abi.md). */
typedef struct kvt_hybrid_req {
    kvt_cache_req_t full;    /* the full groups' request (cache.h) */
    uint64_t hit_pages;      /* n: pages every group continues from */
    uint64_t full_hit_pages; /* m: pages the full groups matched (>= n) */
    uint32_t hit_tier;       /* the deepest tier a piece of the hit came from: 1, 2, 3; 0: no hit */
    uint32_t short_by;       /* n < m because of: 0 nothing, 1 a window page, 2 a checkpoint, 3 room in L1 */
    void *priv_;             /* the cache's: which admission this is (a copy kept past its release is refused) */
} kvt_hybrid_req_t;

/* Admits a request (kvt_cache_admit's arguments): the full groups' match m,
 * then the longest n <= m the match rule allows; the window pages and the
 * checkpoint n needs are loaded into L1 (stored there from the shallowest
 * tier that has each) and pinned. When they cannot all be had in L1 (its
 * slots pinned by running requests), n is 0 (short_by 3). l1_ids: as
 * kvt_cache_admit. A failure changes nothing but the evictions made:
 * KVT_EINVAL, KVT_ENOMEM. */
KVT_API int kvt_hybrid_admit(kvt_hybrid_t *h, uint32_t ns, const int32_t *tokens, uint64_t ntokens, int32_t priority,
                             uint32_t *l1_ids, kvt_hybrid_req_t *req);
/* The request ran over tokens [nP, ntokens) (the same tokens as admitted):
 * releases the full groups' request, unpins its pieces and stores what it
 * leaves behind (above). KVT_EINVAL for a request not admitted here or
 * tokens that are not its own (nothing changed); KVT_ENOMEM (the request
 * is released, some pieces may not be stored). */
KVT_API int kvt_hybrid_release(kvt_hybrid_t *h, uint32_t ns, const int32_t *tokens, uint64_t ntokens,
                               kvt_hybrid_req_t *req);
/* Lets go of an admitted request whose forward pass did not run, or failed:
 * the full groups' request is aborted (kvt_cache_abort: its new pages leave
 * the cache) and its pieces are unpinned; nothing is stored for it, since
 * the engine computed none of it. What its hit matched or loaded stays
 * cached, as after a release. Full pages that requests admitted after it
 * (and released) left below its new pages leave with them, as
 * kvt_cache_abort says. KVT_EBUSY, nothing changed, while another request
 * matched its new pages and is still admitted (abort or release that one
 * first), or a page below them is in flight. KVT_EINVAL as release. */
KVT_API int kvt_hybrid_abort(kvt_hybrid_t *h, kvt_hybrid_req_t *req);

/* The bytes. The engine owns every slot's bytes (one buffer per group and
 * tier, slot-indexed) and makes them follow the metadata by running, in
 * order, the moves each call records (cfg.moves): a piece copied from a
 * slot of one tier to a slot of another, or written by the engine from
 * what the request computed. The order is safe as given: a slot's old piece
 * leaves before its new one arrives, and a piece is in a tier before it is
 * copied on from there. After an admission's moves, the pieces its hit
 * needs are at kvt_hybrid_slots in L1; after a release's, what it left
 * behind is where the cache says: a slot a store or a round frees is written
 * again only by a move that comes after the copy out of it. */
#define KVT_HYBRID_ENGINE 0 /* a move's source: the request itself */

typedef struct kvt_hybrid_move { /* frozen */
    uint32_t group;
    uint32_t src_tier; /* KVT_HYBRID_ENGINE, or 1 (L1), 2 (L2), 3 (L3) */
    uint32_t dst_tier; /* 1, 2, 3 */
    uint32_t reserved_;
    uint64_t src_slot; /* a slot of src_tier; from the engine: the window page's index in the request,
                        * or the checkpoint's point (the state after that many pages) */
    uint64_t dst_slot;
    kvt_key128_t key; /* the piece: its chained page hash */
} kvt_hybrid_move_t;

/* Moves that complete out of order (cfg.async_moves), as a transfer engine
 * with several threads or streams runs them. The pending-backup rules of the
 * radix cache hold for the pieces:
 *
 *  - a piece whose copy into a tier is in flight is pending there: it is no
 *    source for another copy and is not evicted; a piece pending in L1 counts
 *    for the match rule (it is on its way), one pending in L2 or L3 does not;
 *  - a piece a copy reads is pinned in its tier until the copy is reported,
 *    so its slot is not given to another piece meanwhile;
 *  - a piece goes on down (write_through) when its copy into the tier above
 *    is reported done, never before;
 *  - a piece evicted under write_back is copied down from its slot, and the
 *    move of the piece that takes the slot is handed out only when that copy
 *    is reported: kvt_hybrid_take_moves hands out moves that are safe to run
 *    at the same time, in any order. So a move from the engine (what a
 *    request computed) can come out after the release that recorded it: the
 *    engine keeps those bytes while kvt_hybrid_engine_waiting says so;
 *  - a copy reported failed leaves its piece absent from that tier (a miss,
 *    never served); an admitted request whose piece failed to reach L1 is
 *    told so by kvt_hybrid_ready, and the engine recomputes what it cannot
 *    continue from (kvt_hybrid_longest over the pieces it has).
 *
 * The engine reports every move it took, with the move as taken and
 * ok[i] nonzero for a copy that landed, on the cache's thread as every call
 * (its copy threads or stream callbacks hand the reports over). KVT_EINVAL, nothing changed, for a
 * cache without async_moves, or a move not taken and not yet reported
 * (each may appear once), or while a data plane runs the moves
 * (kvt_hybrid_plane_create); KVT_ENOMEM, nothing changed. Pieces a reported
 * copy would send on down but no tier below has room for are counted in
 * pieces_refused. Cost: O(moves outstanding) per move reported. */
KVT_API int kvt_hybrid_moves_done(kvt_hybrid_t *h, const kvt_hybrid_move_t *moves, size_t n, const uint8_t *ok);
/* Whether req's pieces are in L1 (cfg.async_moves): KVT_OK, every one
 * landed and pinned (also with no async moves); KVT_EAGAIN, a copy into L1
 * is still in flight; KVT_EIO, one was reported failed (the others that
 * landed stay pinned until release). KVT_EINVAL. */
KVT_API int kvt_hybrid_ready(const kvt_hybrid_t *h, const kvt_hybrid_req_t *req);
/* Moves taken and not yet reported, and moves waiting for a slot's copy
 * down before they are handed out (cfg.async_moves; 0 otherwise). */
KVT_API size_t kvt_hybrid_moves_outstanding(const kvt_hybrid_t *h);
/* Moves from the engine, of pieces keyed by keys[0..n) (a released
 * request's chained page hashes), not handed out yet: while any is, the
 * engine keeps what that request computed (async_moves; 0 otherwise).
 * O(n x moves outstanding). */
KVT_API size_t kvt_hybrid_engine_waiting(const kvt_hybrid_t *h, const kvt_key128_t *keys, size_t n);

/* Copies up to cap of the moves recorded, oldest first, into out and
 * forgets them; returns how many. With async_moves, those that are safe to
 * run now (above), each to be reported with kvt_hybrid_moves_done. None
 * while a data plane runs the moves (kvt_hybrid_plane_create). */
KVT_API size_t kvt_hybrid_take_moves(kvt_hybrid_t *h, kvt_hybrid_move_t *out, size_t cap);
/* Moves recorded and not yet taken (with async_moves: ready to be taken). */
KVT_API size_t kvt_hybrid_moves(const kvt_hybrid_t *h);
/* The L1 slots of the pieces group g needs for req's hit, pinned until it
 * is released: window pages floor(max(0, nP - W) / P) .. n - 1 in order, or
 * the checkpoint at n; *n their number (0 for a full group or no hit).
 * KVT_ERANGE when cap is short (*n set), KVT_EIO when one of them failed to
 * reach L1, KVT_EAGAIN while one is on its way there (kvt_hybrid_ready),
 * KVT_EINVAL. */
KVT_API int kvt_hybrid_slots(const kvt_hybrid_t *h, const kvt_hybrid_req_t *req, uint32_t g, uint64_t *slots,
                             size_t cap, size_t *n);

/* An L3 outside the cache: the engine's own store (a kvtier store over
 * Redis, a shared directory), which other instances put pieces in too. The
 * cache asks probe which of keys[0..n) of group g it holds (present[i]
 * nonzero; a nonzero return: none), when a piece is in neither L1 nor L2
 * (n at most 64: while the match rule searches, with the pieces below the
 * one it asks about, which it may ask about next),
 * and records the moves to and from it by key: a piece put (dst_tier 3,
 * dst_slot UINT64_MAX) under l3_write_policy, and a piece of a hit loaded
 * from it (src_tier 3, src_slot UINT64_MAX). The store keeps its own room.
 * A piece a load does not find after all (evicted, refused by its
 * checksum) leaves the engine a hit it cannot use: it cuts it back with
 * kvt_hybrid_longest, as for any piece it finds bad. The full groups'
 * pages reach other instances through the radix cache's own L3
 * (kvt_cache_attach_store on kvt_hybrid_cache, and
 * kvt_hybrid_admit_prefetched). Needs an L2 and no modeled L3 for the
 * pieces (l3_slots 0), an l3_write_policy other than
 * write_through_selective, no request admitted and no data plane (which
 * sets its own); KVT_EINVAL otherwise. NULL probe: no L3 for the pieces. The
 * probe runs in the middle of an admission: while it runs, calls that
 * change the cache (admit, release, moves_done, set_l3) return KVT_EBUSY
 * and take_moves hands out none. */
typedef int (*kvt_hybrid_probe_fn)(void *arg, uint32_t group, const kvt_key128_t *keys, size_t n, uint8_t *present);
KVT_API int kvt_hybrid_set_l3(kvt_hybrid_t *h, kvt_hybrid_probe_fn probe, void *arg);
/* A probe over kvtier stores (store.h), one per group: arg is a
 * kvt_store_t *[KVT_MODEL_MAX_GROUPS], asked with exists on the caller's
 * thread (kvt_store_run), the keys as page hashes; nonzero when the store
 * fails the call. */
KVT_API int kvt_hybrid_store_probe(void *stores, uint32_t group, const kvt_key128_t *keys, size_t n, uint8_t *present);

/* kvt_hybrid_admit, finishing the full groups' prefetch id first
 * (kvt_cache_prefetch on kvt_hybrid_cache; 0: none): their L3 pages count
 * in the match. */
KVT_API int kvt_hybrid_admit_prefetched(kvt_hybrid_t *h, uint64_t id, uint32_t ns, const int32_t *tokens,
                                        uint64_t ntokens, int32_t priority, uint32_t *l1_ids, kvt_hybrid_req_t *req);

/* The full groups' cache (for its stats, tree and checks). */
KVT_API kvt_cache_t *kvt_hybrid_cache(kvt_hybrid_t *h);
/* The decision digest (kvt_cache_digest's, for the whole model): the full
 * groups' cache's, and for each window and state group and tier a running
 * hash of every slot a piece got and every piece stored or let go (and
 * why), in order. Hybrid caches fed the same calls agree on it exactly when
 * they made the same decisions. Kept only by a cache made with
 * cfg.cache.decision_digest; 0 for any other. */
KVT_API uint64_t kvt_hybrid_digest(const kvt_hybrid_t *h);

#define KVT_HYBRID_STATS_FIELDS(X)                                                                     \
    X(requests, COUNTER, "requests admitted")                                                           \
    X(tokens, COUNTER, "tokens of the admitted requests")                                               \
    X(hit_tokens, COUNTER, "tokens every group continued from (n pages)")                               \
    X(l1_hit_tokens, COUNTER, "hit tokens whose every piece was in L1")                                 \
    X(l2_hit_tokens, COUNTER, "hit tokens with a piece from L2 and none from L3")                       \
    X(l3_hit_tokens, COUNTER, "hit tokens with a piece from L3")                                        \
    X(full_hit_tokens, COUNTER, "tokens the full groups matched (m pages)")                            \
    X(window_short_tokens, COUNTER, "full-group hit tokens lost because a window page was missing")    \
    X(state_short_tokens, COUNTER, "full-group hit tokens lost because no checkpoint was at the point") \
    X(room_short_tokens, COUNTER, "hit tokens lost because L1 had no room for the pieces to load")     \
    X(pieces_loaded, COUNTER, "window pages and checkpoints loaded into L1 for a hit")                 \
    X(window_pages_stored, COUNTER, "window pages stored in L1 by requests that ran")                   \
    X(checkpoints_stored, COUNTER, "checkpoints stored in L1 by requests that ran")                    \
    X(pieces_refused, COUNTER, "pieces a tier had no room for (pinned slots)")                          \
    X(l1_bytes, GAUGE, "bytes held in L1: full pages, window pages and checkpoints")                    \
    X(l2_bytes, GAUGE, "bytes held in L2")                                                              \
    X(l3_bytes, GAUGE, "bytes held in L3 (the model)")                                                  \
    X(cached_tokens, GAUGE, "tokens of the full pages held in some tier (the tree's pages, or L3's)")   \
    X(moves_failed, COUNTER, "copies the engine reported failed (async_moves): the piece absent there")            \
    X(round_evictions, COUNTER, "pieces evicted by free-room rounds, at release")                                    \
    X(admit_evictions, COUNTER, "pieces L1 evicted for an admission's loads (write_back: copies the hit waits for)") \
    X(aborted, COUNTER, "requests aborted: their forward pass did not run, nothing stored for them")

typedef struct kvt_hybrid_stats {
    uint32_t size; /* sizeof(kvt_hybrid_stats_t), set by the caller */
#define KVT_STATS_FIELD_(name, kind, help) uint64_t name;
    KVT_HYBRID_STATS_FIELDS(KVT_STATS_FIELD_)
#undef KVT_STATS_FIELD_
} kvt_hybrid_stats_t;

KVT_API int kvt_hybrid_stats(const kvt_hybrid_t *h, kvt_hybrid_stats_t *st);

/* What group g holds in each tier (frozen). For a full group: its share of
 * the radix pages' bytes. */
typedef struct kvt_hybrid_group_bytes {
    uint64_t bytes[3]; /* L1, L2, L3 */
    uint64_t slots[3]; /* slots (pages or checkpoints) in use; full groups: the radix pages */
} kvt_hybrid_group_bytes_t;

/* KVT_EINVAL for g out of range. */
KVT_API int kvt_hybrid_group_bytes(const kvt_hybrid_t *h, uint32_t g, kvt_hybrid_group_bytes_t *out);

/* The full cache's check, each keyed cache's, and the hybrid's own: every
 * pinned piece belongs to a live request and is in L1. */
KVT_API int kvt_hybrid_check(kvt_hybrid_t *h, const char **why);

/* The match rule alone, for engines with their own residency. m: the full
 * groups' match in pages; present[g] for a window group: m bytes, page i
 * present (nonzero) or not; for a state group: m + 1 bytes, a checkpoint
 * after i pages; NULL for a full group. Returns the longest n <= m. */
KVT_API uint64_t kvt_hybrid_longest(const kvt_layer_group_t *groups, uint32_t ngroups, uint32_t page_tokens,
                                    uint64_t m, const uint8_t *const *present);

/* ---- kvtier's data plane for the pieces ----------------------------------------
 *
 * kvt_hybrid_plane runs a cache's moves (cfg.moves and cfg.async_moves) on
 * kvtier's own parts, so that the engine only writes what its requests
 * compute and reads its hits in L1 (kvt_hybrid_slots). Each window or state
 * group g has:
 *
 *   tiers   l1 and l2 on a transfer engine (xfer.h) that is the plane's
 *           alone (no one else submits to or polls it; groups may share one); page i of a tier is
 *           slot i of that tier of the group, a page one piece
 *           (kvt_hybrid_piece_bytes), the tiers at least the cache's slots.
 *           An l2 with KVT_TIER_CHECKSUM (and the engine's checksum option)
 *           checks every piece read back from it: a piece that fails is a
 *           failed copy (KVT_ECORRUPT), a miss, never served.
 *   store   optionally, the cache's L3 (the plane sets it: kvt_hybrid_set_l3):
 *           `put`, a store over l2 (exists and put: what L2 sends down), and
 *           `get`, a store over l1 (get: a hit loads a piece from L3 straight
 *           into L1), opened on the same URL with the same identity, one
 *           identity per group so that no group's object answers for
 *           another's. The store checks each object it serves (store.h).
 *
 * What the engine computed: for each move from it (src_tier
 * KVT_HYBRID_ENGINE: window page src_slot of the request, or the checkpoint
 * after src_slot pages, into L1 slot dst_slot) the plane calls write(arg,
 * move), which returns 0 once the piece is in place there, nonzero when it
 * could not be written; it runs inside the plane's calls and must not call
 * the cache (the calls that change it, and the plane's poll, wait and sync,
 * answer KVT_EBUSY from there). Such a move can come after the request's release
 * (kvt_hybrid_engine_waiting says until when its bytes are needed).
 *
 * Copies run on the engines' and the stores' workers; kvt_hybrid_plane_poll
 * (and wait, sync) takes the moves the cache hands out, starts them, and
 * reports each batch to the cache as it completes (kvt_hybrid_moves_done),
 * on the cache's thread: every plane call runs there. While a plane is on
 * a cache no one else takes its moves (wait and sync answer KVT_EIO when
 * they would wait for a move the plane does not hold). */
typedef struct kvt_hybrid_plane kvt_hybrid_plane_t;

/* Bytes of one piece of group g: a window page (bytes per token x
 * page_tokens) or a checkpoint; 0 for a full group; UINT64_MAX past 2^64 - 1
 * (kvt_hybrid_create refuses a group whose pages or tiers do not fit 64 bits). */
KVT_API uint64_t kvt_hybrid_piece_bytes(const kvt_layer_group_t *g, uint32_t page_tokens);

typedef int (*kvt_hybrid_write_fn)(void *arg, const kvt_hybrid_move_t *m);

typedef struct kvt_hybrid_plane_group {
    kvt_xfer_t *xfer;           /* NULL for a full group; required for the others */
    kvt_tier_t *l1, *l2;        /* tiers of xfer, at indexes l1_index and l2_index */
    unsigned l1_index, l2_index;
    kvt_store_t *put, *get;     /* the L3: both or neither, for every window or state group alike */
} kvt_hybrid_plane_group_t;

typedef struct kvt_hybrid_plane_config {
    uint32_t size; /* sizeof(kvt_hybrid_plane_config_t), set by the caller */
    kvt_hybrid_plane_group_t groups[KVT_MODEL_MAX_GROUPS];
    kvt_hybrid_write_fn write; /* required */
    void *arg;
} kvt_hybrid_plane_config_t;

/* A plane for h, before its first admission; the engines, tiers and stores
 * outlive the plane, the plane outlives nothing of h's (destroy it first).
 * From then on the plane alone takes and reports h's moves
 * (kvt_hybrid_take_moves hands out none, kvt_hybrid_moves_done and
 * kvt_hybrid_set_l3 refuse) until it is destroyed. Groups may share an
 * engine, never a tier or a store identity. KVT_EINVAL (h without moves and
 * async_moves, or with a modeled L3 for the pieces, which holds no bytes;
 * requests admitted; moves the engine took and has not reported; a group's
 * tiers too small or of another piece size, l1 and l2 one tier, or a tier
 * another group's too, or an engine or tier of the full groups'
 * (kvt_cache_attach on kvt_hybrid_cache, which refuses the plane's in turn
 * when it comes second); an engine or store with batches on it already (someone
 * else's); anything given for a full group; l1_index or l2_index not the
 * index of l1 or l2 in xfer; with stores, an engine without its checksum
 * option over a checksummed l2 (its pages' sums never written, the store
 * would refuse every put); a store not over its tier, put and get on two
 * URLs or under two identities, a group's identity another's or the full
 * groups' store's (kvt_cache_attach_store: window page i and full page i
 * have one chained hash, so one object under one identity; the cache
 * refuses the plane's stores and identities in turn when it comes second),
 * or stores given for some groups only; stores under an l3_write_policy of
 * write_through_selective (kvt_hybrid_set_l3 refuses it); no stores on a
 * cache that has the engine's own L3 (kvt_hybrid_set_l3); a plane on h
 * already; no write),
 * KVT_ENOMEM; nothing changed on failure. An object a get finds bad (store.h)
 * is removed, so that the probes stop answering for it. */
KVT_API int kvt_hybrid_plane_create(kvt_hybrid_plane_t **out, kvt_hybrid_t *h, const kvt_hybrid_plane_config_t *cfg);
/* Waits for the copies in flight and reports them (short of memory, as
 * failed: their pieces misses, nothing left taken). h stays usable, its
 * moves the engine's again (kvt_hybrid_take_moves) and its L3 gone with the
 * plane's stores. */
KVT_API void kvt_hybrid_plane_destroy(kvt_hybrid_plane_t *p);
/* Takes the moves ready and starts them; reports the batches that have
 * completed, waiting up to timeout_ns for one while some is in flight and
 * none has; again until nothing more is ready. KVT_OK; KVT_ENOMEM (what
 * was started goes on; call again). */
KVT_API int kvt_hybrid_plane_poll(kvt_hybrid_plane_t *p, uint64_t timeout_ns);
/* Polls until req's pieces are in L1 or one of them failed:
 * kvt_hybrid_ready's answer, KVT_OK or KVT_EIO (KVT_ENOMEM). */
KVT_API int kvt_hybrid_plane_wait(kvt_hybrid_plane_t *p, const kvt_hybrid_req_t *req);
/* Polls until no move is outstanding: every copy landed and reported. */
KVT_API int kvt_hybrid_plane_sync(kvt_hybrid_plane_t *p);
/* Moves started and not yet reported. */
KVT_API size_t kvt_hybrid_plane_in_flight(const kvt_hybrid_plane_t *p);

#define KVT_HYBRID_PLANE_STATS_FIELDS(X)                                                            \
    X(written, COUNTER, "pieces the engine wrote into L1 (moves from a request)")                   \
    X(write_failures, COUNTER, "pieces the engine could not write")                                 \
    X(copied_down, COUNTER, "pieces copied L1 -> L2")                                               \
    X(copied_up, COUNTER, "pieces copied L2 -> L1")                                                 \
    X(copy_failures, COUNTER, "pieces whose copy between L1 and L2 failed")                         \
    X(corrupt_batches, COUNTER, "batches refused because a piece read from L2 failed its checksum") \
    X(bytes_down, COUNTER, "bytes copied L1 -> L2")                                                 \
    X(bytes_up, COUNTER, "bytes copied L2 -> L1")                                                   \
    X(put, COUNTER, "pieces put to the store")                                                      \
    X(put_failures, COUNTER, "puts the store failed")                                               \
    X(got, COUNTER, "pieces got from the store into L1")                                            \
    X(get_misses, COUNTER, "gets the store did not serve (gone, refused by its checks, failed)")    \
    X(batches, COUNTER, "batches started (copies, store calls, the engine's writes)")

typedef struct kvt_hybrid_plane_stats {
    uint32_t size; /* sizeof(kvt_hybrid_plane_stats_t), set by the caller */
#define KVT_STATS_FIELD_(name, kind, help) uint64_t name;
    KVT_HYBRID_PLANE_STATS_FIELDS(KVT_STATS_FIELD_)
#undef KVT_STATS_FIELD_
} kvt_hybrid_plane_stats_t;

KVT_API int kvt_hybrid_plane_stats(const kvt_hybrid_plane_t *p, kvt_hybrid_plane_stats_t *st);

#ifdef __cplusplus
}
#endif
#endif
