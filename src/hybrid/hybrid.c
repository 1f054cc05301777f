/* The hybrid cache (kvtier/hybrid.h gives the contract and the match rule):
 * a radix cache for the full groups and, for each window or state group, one
 * keyed cache per tier whose pages are the group's slots in that tier.
 *
 *   group      L1              L2              L3 (modeled; or the engine's store, kvt_hybrid_set_l3)
 *   full       radix cache: its own L1, L2 and L3 (cache.h)
 *   window g   keyed [g][0]    keyed [g][1]    keyed [g][2]     key: H(page)
 *   state  g   keyed [g][0]    keyed [g][1]    keyed [g][2]     key: H(last page before the point)
 *
 * A piece (window page or checkpoint) may sit in several tiers at once, as a
 * radix page may have an L1 copy and an L2 copy. Scores order each keyed
 * cache's evictions (score_of): the needed class above the spare one, then
 * what the cache's policy weighs, then the clock of the request that stored
 * or used the piece (a hit refreshes its whole path, as the radix cache
 * refreshes a matched prefix), then the shallower piece above the deeper.
 * The policy's part follows the tree's (policy.c): lfu the hits on the
 * piece's path, priority its requests' highest priority, fifo the clock of
 * its first store; under s2lru and arc the pieces in L1 a hit has used are
 * a second class (seen again), which the pieces never used go before:
 * always under s2lru; under arc while they hold more than a share learnt
 * from the pieces' own misses (missed), as the tree learns its own; under
 * slru the pieces hit twice, at most 80 % of L1's slots.
 *
 * Cost: an admission looks up at most m pieces per window group (each page
 * once, memoised) and m + 1 per state group, per tier; a release stores the
 * pages it ran over and its kept points' checkpoints. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../core/abi-int.h"
#include "../core/check-int.h"
#include "../core/mem-int.h"
#include "../core/mix-int.h"
#include "kvtier/alloc.h"
#include "kvtier/error.h"
#include "kvtier/hybrid.h"
#include "kvtier/keyed.h"
#include "kvtier/radix.h"
#include "../keyed/keyed-int.h"
#include "hybrid-int.h"

/* A piece's score, high bits first (score_of, and the policy's part):
 *   63      NEEDED  within the window of a kept point: the spare pages go first
 *   62      SEEN    L1's second class: s2lru, arc (a hit used it), slru (two hits)
 *   54..61  RANK    lfu: hits on its path, to 255; priority: the highest of its
 *                   requests' priorities, + 128, within [-128, 127]
 *   16..53  CLOCK   the request that last stored or used it (fifo: first stored)
 *    2..15  DEPTH   16383 - its page (to 16383): deeper pieces first
 *    0..1   USES    slru: hits on its path, to 3 (below the depth: orders ties only)
 * RANK and USES (and under fifo CLOCK and DEPTH) are the piece's own: they
 * go with it between L1 and L2 and a refresh keeps them (h->carry). L3
 * orders its pieces by recency alone, as the tree's L3 orders its pages
 * (l3.c). */
#define NEEDED (1ull << 63)
#define SEEN (1ull << 62)
#define RANK_SHIFT 54
#define RANK_MAX 255ull
#define CLOCK_SHIFT 16
#define DEPTH_SHIFT 2
#define DEPTH_MAX 16383ull
#define USES 3ull
#define RANK (RANK_MAX << RANK_SHIFT)
#define CLOCK (((1ull << 38) - 1) << CLOCK_SHIFT)
#define CLOCK_AND_DEPTH (CLOCK | DEPTH_MAX << DEPTH_SHIFT)
#define SLRU_SHARE 0.8 /* slru: the seen-again pieces' most of L1's slots, as the tree's protected share */

#define G KVT_MODEL_MAX_GROUPS
#define MEMO_UNKNOWN (-2)

/* Where a piece stored in a tier comes from: the engine (the request
 * computed it: slot is the page index, or the point of a checkpoint), or a
 * tier's slot. */
typedef struct src {
    uint32_t tier; /* KVT_HYBRID_ENGINE, or 1, 2, 3 */
    uint32_t pinned; /* async_moves: the piece is pinned in tier until the copy is reported */
    uint64_t slot;
} src_t;

/* What an admitted request holds: its L1 pieces (pinned, or with
 * async_moves waiting for their copy to land), and what release checks the
 * tokens against. */
typedef struct pins {
    uint64_t npages, n, m;
    uint32_t ns;
    int32_t prio;
    kvt_hash128_t last; /* the chained hash of its last whole page */
    uint32_t count[G];
    kvt_key128_t *keys[G];
    uint8_t *wait[G]; /* wait[g][i]: keys[g][i] is still on its way to L1 (not pinned yet) */
    uint32_t nwait;   /* pieces waiting */
    int failed;       /* a piece's copy into L1 was reported failed */
    struct pins *prev, *next; /* the live requests (async_moves: a landing piece finds its waiters) */
    uint64_t id;              /* the admission's number, never reused: kvt_hybrid_req_t.priv_ */
    size_t bytes;     /* of this allocation */
} pins_t;

/* Numbers every admission of the process (pins_t.id). */
static _Atomic uint64_t admissions;

struct kvt_hybrid {
    kvt_hybrid_config_t cfg;
    kvt_cache_t *cache;
    uint32_t P;
    uint64_t slot_bytes[G];
    uint64_t seen;    /* what a hit's use adds in L1: SEEN under s2lru and arc, else 0 */
    uint64_t classes; /* L1's class bit: SEEN under s2lru, arc and slru, else 0 */
    uint64_t carry;   /* the policy's part of a score (above) */
    kvt_keyed_t *kc[G][3]; /* NULL for full groups and absent tiers */
    uint64_t room[G][2];     /* L1's and L2's free-room targets in slots (restore_room) */
    uint64_t leaving[G][2];  /* async_moves: a round's victims whose copy down is in flight */
    uint64_t clock, live;
    kvt_hybrid_stats_t st;
    kvt_hybrid_move_t *moves; /* cfg.moves: the copies the engine owes, in order, until taken */
    size_t nmoves, mvcap;
    /* async_moves: every move recorded and not yet reported. Until then its
     * destination is pending in its tier, its source (src_pinned) pinned in
     * its own, and a move into a slot a copy down still reads waits for it. */
    kvt__pendtab_t pt;
    pins_t *live_reqs;
    kvt_hybrid_probe_fn probe; /* an L3 outside the cache (kvt_hybrid_set_l3): asked what it holds */
    void *probe_arg;
    bool driven; /* a data plane runs the moves (kvt__hybrid_drive) */

    /* scratch, grown as needed */
    kvt_hash128_t *hash;
    size_t hcap;
    int8_t *memo; /* [g * mstride + i]: piece_tier of group g's piece i, or MEMO_UNKNOWN */
    bool searching; /* the match rule is asking (piece_tier asks the outside L3 ahead) */
    bool in_probe;  /* the outside L3's probe or the plane's write runs: calls that change the cache are refused */
    size_t mcap, mstride;
    kvt_key128_t *keys, *prot;
    uint64_t *scores;
    src_t *srcs;
    size_t kcap, prcap, scap, srcap;
};

/* A piece's eviction score but the policy's part: its class, then the clock
 * of the request that last stored or used it, then deeper pieces first (as
 * the radix cache takes a path's tail pages first), so that a path's pieces
 * go from its end and the windows before its branch points stay whole. */
static uint64_t score_of(const kvt_hybrid_t *h, int needed, uint64_t page) {
    uint64_t depth = DEPTH_MAX - (page < DEPTH_MAX ? page : DEPTH_MAX);
    return (needed ? NEEDED : 0) | h->clock << CLOCK_SHIFT | depth << DEPTH_SHIFT;
}

/* The policy's part of a piece a request of priority prio computes. */
static uint64_t born(const kvt_hybrid_t *h, int32_t prio) {
    if (h->cfg.cache.policy != KVT_POLICY_PRIORITY) return 0;
    int64_t r = (int64_t)prio + 128;
    return (uint64_t)(r < 0 ? 0 : r > (int64_t)RANK_MAX ? (int64_t)RANK_MAX : r) << RANK_SHIFT;
}

/* A score computed now (score_of, and SEEN where a hit uses the piece in
 * L1) with the policy's part the piece already has (old). */
static uint64_t carried(const kvt_hybrid_t *h, uint64_t fresh, uint64_t old) {
    return (fresh & ~h->carry) | (old & h->carry);
}

/* What L3 keeps of score s: no class, no rank, the clock of now under fifo. */
static uint64_t recency_only(const kvt_hybrid_t *h, uint64_t s) {
    s &= ~(SEEN | RANK | USES);
    return h->cfg.cache.policy == KVT_POLICY_FIFO ? (s & ~CLOCK) | h->clock << CLOCK_SHIFT : s;
}

/* The score of a piece evicted with score old, in the tier below: the
 * least recent there (not needed, the deepest), its policy part kept. */
static uint64_t down_score(const kvt_hybrid_t *h, uint64_t old) { return carried(h, h->clock << CLOCK_SHIFT, old); }

/* Score s after a hit on the piece's path by a request of priority prio,
 * as the tree's on_hit counts a matched node's (class_bit: its tier's). */
static uint64_t hit(const kvt_hybrid_t *h, uint64_t s, int32_t prio, uint64_t class_bit) {
    switch (h->cfg.cache.policy) {
    case KVT_POLICY_LFU:
        return (s & RANK) == RANK ? s : s + (1ull << RANK_SHIFT);
    case KVT_POLICY_PRIORITY: {
        uint64_t r = born(h, prio);
        return r > (s & RANK) ? (s & ~RANK) | r : s;
    }
    case KVT_POLICY_SLRU:
        if ((s & USES) != USES) s++;
        return (s & USES) >= 2 ? s | class_bit : s;
    default:
        return s;
    }
}

/* ---- create / destroy ---------------------------------------------------------- */

void kvt_hybrid_destroy(kvt_hybrid_t *h) {
    if (h == NULL) return;
    for (pins_t *p = h->live_reqs, *next; p; p = next) { /* requests never released */
        next = p->next;
        kvt__free(p, p->bytes);
    }
    kvt_cache_destroy(h->cache);
    for (uint32_t g = 0; g < G; g++)
        for (int t = 0; t < 3; t++) kvt_keyed_destroy(h->kc[g][t]);
    kvt__free(h->hash, h->hcap * sizeof(*h->hash));
    kvt__free(h->memo, h->mcap);
    kvt__free(h->keys, h->kcap * sizeof(*h->keys));
    kvt__free(h->prot, h->prcap * sizeof(*h->prot));
    kvt__free(h->scores, h->scap * sizeof(*h->scores));
    kvt__free(h->srcs, h->srcap * sizeof(*h->srcs));
    kvt__free(h->moves, h->mvcap * sizeof(*h->moves));
    kvt__pend_free(&h->pt);
    KVT_DELETE(h);
}

int kvt_hybrid_create(kvt_hybrid_t **out, const kvt_hybrid_config_t *cfg) {
    if (out == NULL || cfg == NULL) return KVT_EINVAL;
    kvt_hybrid_config_t c;
    memset(&c, 0, sizeof(c));
    c.checkpoint_ends = c.checkpoint_branches = true;
    if (kvt__abi_in(&c, sizeof(c), cfg) != KVT_OK || !kvt__hybrid_config_ok(&c)) return KVT_EINVAL;
    kvt_hybrid_t *h = KVT_NEW(kvt_hybrid_t);
    if (h == NULL) return KVT_ENOMEM;
    h->cfg = c;
    int rc = kvt_cache_create(&h->cache, &c.cache);
    if (rc != KVT_OK) {
        KVT_DELETE(h);
        return rc;
    }
    h->P = c.cache.page_tokens ? c.cache.page_tokens : 16;
    /* The two classes of s2lru, arc and slru, for L1's pieces: one a hit has
     * used (slru: twice) is seen again, for good (slru: while the share
     * holds); one evicted and stored again comes back seen once (missed says
     * why); under arc L1 learns how much room the seen-once get. L2 and L3
     * have no classes, only the ranks of lfu and priority and fifo's order:
     * they hold what L1 let go and the long tail, and classes there (fixed,
     * or learnt as in L1) lost hits wherever an L3 was below
     * (docs/hybrid.md). */
    h->seen = c.cache.policy == KVT_POLICY_S2LRU || c.cache.policy == KVT_POLICY_ARC ? SEEN : 0;
    h->classes = h->seen || c.cache.policy == KVT_POLICY_SLRU ? SEEN : 0;
    h->carry = RANK | USES | (c.cache.policy == KVT_POLICY_FIFO ? CLOCK_AND_DEPTH : 0);
    const uint64_t *slots[3] = {c.l1_slots, c.l2_slots, c.l3_slots};
    for (uint32_t g = 0; g < c.ngroups && rc == KVT_OK; g++) {
        if (c.groups[g].kind == KVT_GROUP_FULL) continue;
        h->slot_bytes[g] = kvt__hybrid_slot_bytes(&c.groups[g], h->P);
        for (int t = 0; t < 3 && rc == KVT_OK; t++) {
            if (slots[t][g] == 0) continue;
            /* free room 0 in the keyed cache: a store evicts the deficit only, so each slot it frees
             * is the slot of one of its new keys (keyed.h, Pages), which is what orders the moves
             * (store_in); the free-room target is kept by rounds instead (restore_room) */
            kvt_keyed_config_t kc = {.size = sizeof(kc), .pages = slots[t][g], .free_room = 0};
            rc = kvt_keyed_create(&h->kc[g][t], &kc);
            if (rc == KVT_OK && c.cache.decision_digest) kvt__keyed_keep_digest(h->kc[g][t]);
            if (rc == KVT_OK && h->classes && t == 0)
                rc = kvt__keyed_set_classes(h->kc[g][t], SEEN, c.cache.policy == KVT_POLICY_ARC);
            double room = t == 0 ? c.cache.l1_free_room : c.cache.l2_free_room;
            if (t < 2) h->room[g][t] = (uint64_t)(room * (double)slots[t][g]);
            if (rc == KVT_OK && c.cache.policy == KVT_POLICY_SLRU && t == 0)
                kvt__keyed_set_class1_cap(h->kc[g][t], (size_t)(SLRU_SHARE * (double)slots[t][g]));
        }
    }
    if (rc != KVT_OK) {
        kvt_hybrid_destroy(h);
        return rc;
    }
    h->st.size = sizeof(h->st);
    *out = h;
    return KVT_OK;
}

kvt_cache_t *kvt_hybrid_cache(kvt_hybrid_t *h) { return h ? h->cache : NULL; }

uint64_t kvt_hybrid_digest(const kvt_hybrid_t *h) {
    if (h == NULL || !h->cfg.cache.decision_digest) return 0;
    uint64_t d = kvt_cache_digest(h->cache);
    for (uint32_t g = 0; g < h->cfg.ngroups; g++)
        for (int t = 0; t < 3; t++)
            if (h->kc[g][t]) d = kvt__mix64(d ^ kvt__mix64(kvt__keyed_digest(h->kc[g][t]) + (uint64_t)(g * 3 + t)));
    return d;
}

const kvt_hybrid_config_t *kvt__hybrid_cfg(const kvt_hybrid_t *h) { return &h->cfg; }
int kvt__hybrid_live(const kvt_hybrid_t *h) { return h->live != 0; }
bool kvt__hybrid_calling_out(kvt_hybrid_t *h, bool on) {
    bool was = h->in_probe;
    h->in_probe = on;
    return was;
}
kvt_keyed_t *kvt__hybrid_keyed(kvt_hybrid_t *h, uint32_t g, int t) {
    return g < h->cfg.ngroups && t >= 0 && t < 3 ? h->kc[g][t] : NULL;
}
int kvt__hybrid_has_l3(const kvt_hybrid_t *h) { return h->probe != NULL; }
void kvt__hybrid_drive(kvt_hybrid_t *h, bool on) { h->driven = on; }
void kvt__hybrid_drop_l3(kvt_hybrid_t *h) {
    h->probe = NULL;
    h->probe_arg = NULL;
}

/* ---- scratch ------------------------------------------------------------------- */

/* Room for n keys in keys, prot, scores and srcs. */
static int keys_room(kvt_hybrid_t *h, size_t n) {
    if (kvt__grow((void **)&h->keys, &h->kcap, n, sizeof(*h->keys)) != KVT_OK ||
        kvt__grow((void **)&h->prot, &h->prcap, n, sizeof(*h->prot)) != KVT_OK ||
        kvt__grow((void **)&h->scores, &h->scap, n, sizeof(*h->scores)) != KVT_OK ||
        kvt__grow((void **)&h->srcs, &h->srcap, n, sizeof(*h->srcs)) != KVT_OK)
        return KVT_ENOMEM;
    return KVT_OK;
}

static kvt_key128_t key_of(kvt_hash128_t x) { return (kvt_key128_t){x.hi, x.lo}; }

/* Refreshes the pieces of keys[0..n) that tier t of group g holds: each
 * takes its score computed now (fresh) with its own policy part and class
 * (a piece seen again stays so, as the tree's protected pages do), and,
 * when the refresh is a hit on its path by a request of priority prio, what
 * the policy counts for a hit. */
static void refresh(const kvt_hybrid_t *h, uint32_t g, int t, const kvt_key128_t *keys, const uint64_t *fresh,
                    size_t n, int on_hit, int32_t prio) {
    kvt_keyed_t *k = h->kc[g][t];
    for (size_t j = 0; j < n; j++) {
        uint32_t i = kvt__keyed_find(k, keys[j]);
        if (i == UINT32_MAX) continue;
        if (t == 2) { /* recency alone */
            kvt__keyed_rescore(k, i, recency_only(h, fresh[j]));
            continue;
        }
        uint64_t old = k->ents[i].score, s = carried(h, fresh[j], old) | (old & k->class_bit);
        kvt__keyed_rescore(k, i, on_hit ? hit(h, s, prio, k->class_bit) : s);
    }
    kvt__keyed_demote(k); /* slru: past the share, the least recent seen-again pieces are seen once again */
}

/* ---- moving pieces between tiers ----------------------------------------------- */

static kvt_write_policy_t down_policy(const kvt_hybrid_t *h, int t) {
    return t == 0 ? h->cfg.cache.write_policy : h->cfg.cache.l3_write_policy;
}

/* Pieces go below tier t: to a keyed tier, or to the outside L3. */
static int has_below(const kvt_hybrid_t *h, uint32_t g, int t) {
    return t + 1 < 3 && (h->kc[g][t + 1] != NULL || (t + 1 == 2 && h->probe != NULL));
}

/* Records a copy of key from `from` into slot of tier t; with async_moves
 * it waits for the outstanding move `after` (PEND_NONE: none) to land
 * before it is handed out. */
static void record(kvt_hybrid_t *h, uint32_t g, src_t from, int t, uint64_t slot, kvt_key128_t key, uint32_t after) {
    if (!h->cfg.moves) return;
    kvt_hybrid_move_t m = {g, from.tier, (uint32_t)t + 1, 0, from.slot, slot, key};
    if (!h->cfg.async_moves) {
        KVT_ASSERT(h->nmoves < h->mvcap); /* reserved by the outermost store (moves_room) */
        h->moves[h->nmoves++] = m;
        return;
    }
    uint32_t i = kvt__pend_add(&h->pt, &m, (int)from.pinned, after != PEND_NONE);
    if (after != PEND_NONE) h->pt.e[after].waiter = i;
}

/* Room for the moves one store of n pieces can make: each tier a fill per
 * piece and a demotion per piece it evicts, write-through or write-back. */
static int moves_room(kvt_hybrid_t *h, size_t n) {
    if (!h->cfg.moves) return KVT_OK;
    if (h->cfg.async_moves) return kvt__pend_reserve(&h->pt, 6 * n + 6);
    return kvt__grow((void **)&h->moves, &h->mvcap, h->nmoves + 6 * n + 6, sizeof(*h->moves));
}

/* The outstanding copy of group g's key out of slot `slot` of tier t
 * (0-based) into the tier below, or PEND_NONE. */
static uint32_t copy_down(const kvt_hybrid_t *h, uint32_t g, int t, uint64_t slot, kvt_key128_t key) {
    for (uint32_t i = kvt__pend_chain(&h->pt, g, (uint32_t)t + 2, key); i != PEND_NONE; i = h->pt.e[i].next) {
        const kvt_hybrid_move_t *m = &h->pt.e[i].m;
        if (m->group == g && m->dst_tier == (uint32_t)t + 2 && kvt__key_eq(m->key, key) &&
            m->src_tier == (uint32_t)t + 1 && m->src_slot == slot)
            return i;
    }
    return PEND_NONE;
}

static void send_down(kvt_hybrid_t *h, uint32_t g, int t, const kvt_key128_t *keys, const uint64_t *scores, size_t n,
                      kvt_key128_t *dk, uint64_t *ds, src_t *dsrc);

/* Stores keys[0..n) (scored, from src[0..n)) in tier t of group g, never
 * evicting prot[0..np). What tier t evicts goes down under write_back,
 * what it stores under write_through. In order, the moves come out as the
 * engine must run them: a slot's old piece leaves (and, below, whatever
 * its arrival evicts) before its new piece arrives; a piece arrives in tier
 * t before it is copied to t + 1. With async_moves the same order is kept
 * by waiting instead (hybrid.h): a new piece's move waits for the copy out
 * of its slot, and a new piece goes down when its copy lands
 * (kvt_hybrid_moves_done). KVT_ENOSPC / KVT_ENOMEM with tier t unchanged
 * (the caller unpins the sources it pinned). keys, scores and src may be
 * the caller's scratch: they are read before any call below reuses it. */
static int store_in(kvt_hybrid_t *h, uint32_t g, int t, const kvt_key128_t *keys, const uint64_t *scores,
                    const src_t *src, size_t n, const kvt_key128_t *prot, size_t np) {
    kvt_keyed_t *k = h->kc[g][t];
    if (n && k == NULL && t == 2 && h->probe) { /* the outside L3: the engine puts, the store keeps its own room */
        for (size_t i = 0; i < n; i++) record(h, g, src[i], t, UINT64_MAX, keys[i], PEND_NONE);
        return KVT_OK;
    }
    if (k == NULL || n == 0) return KVT_OK;
    /* this call's own: the pages and victims, what goes down, and what each new key waits for */
    size_t bytes = n * (2 * sizeof(kvt_key128_t) + 4 * sizeof(uint64_t) + sizeof(src_t) + sizeof(size_t) +
                        sizeof(uint32_t));
    unsigned char *work = kvt__malloc(bytes);
    if (work == NULL) return KVT_ENOMEM;
    kvt_key128_t *dk = (kvt_key128_t *)work, *evicted = dk + n;
    uint64_t *ds = (uint64_t *)(evicted + n), *pages = ds + n, *own = pages + n, *evs = own + n;
    src_t *dsrc = (src_t *)(evs + n);
    size_t *taker = (size_t *)(dsrc + n);
    uint32_t *after = (uint32_t *)(taker + n);
    size_t nev = 0, loose = kvt__keyed_loose(k); /* free room 0: at most one victim per new key */
    if (t > 0) { /* below L1, no classes; L3 recency alone */
        for (size_t i = 0; i < n; i++) own[i] = t == 2 ? recency_only(h, scores[i]) : scores[i] & ~SEEN;
        scores = own;
    }
    int rc = kvt__keyed_prepare_scored(k, keys, scores, n, prot, np, pages, evicted, evs, n, &nev);
    if (rc != KVT_OK) {
        kvt__free(work, bytes);
        return rc;
    }
    int async = h->cfg.async_moves, below = has_below(h, g, t);
    if (!async) kvt_keyed_complete_store(k, keys, n, 1);
    for (size_t i = 0; i < n; i++) after[i] = PEND_NONE;
    if (nev && below && down_policy(h, t) == KVT_WRITE_BACK) {
        /* the new keys take the failed stores' pages first, then the victims' in eviction order
         * (keyed.h, Pages): victim j leaves the slot of new key taker[j] before that key arrives */
        size_t j = 0, x = 0;
        for (size_t i = 0; i < n && j < nev; i++)
            if (pages[i] != UINT64_MAX && x++ >= loose) {
                dk[j] = evicted[j];
                ds[j] = down_score(h, evs[j]);
                dsrc[j] = (src_t){(uint32_t)t + 1, 0, pages[i]};
                taker[j++] = i;
            }
        KVT_ASSERT(j == nev);
        if (store_in(h, g, t + 1, dk, ds, dsrc, nev, NULL, 0) != KVT_OK) h->st.pieces_refused += nev;
        else if (async)
            for (j = 0; j < nev; j++) after[taker[j]] = copy_down(h, g, t, pages[taker[j]], dk[j]);
    }
    for (size_t i = 0; i < n; i++)
        if (pages[i] != UINT64_MAX) record(h, g, src[i], t, pages[i], keys[i], after[i]);
    if (below && down_policy(h, t) == KVT_WRITE_THROUGH && async) {
        send_down(h, g, t, keys, scores, n, dk, ds, dsrc); /* the new keys go when they land */
    } else if (below && down_policy(h, t) == KVT_WRITE_THROUGH) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            uint64_t slot = pages[i];
            if (slot == UINT64_MAX && kvt_keyed_page(k, keys[i], &slot) != KVT_OK) continue;
            dk[m] = keys[i];
            ds[m] = scores[i];
            dsrc[m++] = (src_t){(uint32_t)t + 1, 0, slot};
        }
        if (store_in(h, g, t + 1, dk, ds, dsrc, m, NULL, 0) != KVT_OK) h->st.pieces_refused += m;
    }
    kvt__free(work, bytes);
    return KVT_OK;
}

/* async_moves: the pieces of keys[0..n) ready in tier t of group g that the
 * tier below lacks go down now, each pinned here while it is copied (a
 * pending one goes when it lands). dk, ds, dsrc: scratch for n. */
static void send_down(kvt_hybrid_t *h, uint32_t g, int t, const kvt_key128_t *keys, const uint64_t *scores, size_t n,
                      kvt_key128_t *dk, uint64_t *ds, src_t *dsrc) {
    kvt_keyed_t *k = h->kc[g][t], *below = h->kc[g][t + 1];
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t e = kvt__keyed_find(k, keys[i]);
        if (e == UINT32_MAX || k->ents[e].state != KVT__KEYED_READY) continue;
        if (below && kvt__keyed_find(below, keys[i]) != UINT32_MAX) continue; /* there, or on its way */
        dsrc[m] = (src_t){(uint32_t)t + 1, 1, 0};
        if (kvt_keyed_pin(k, &keys[i], 1, &dsrc[m].slot) != KVT_OK) abort(); /* ready: cannot fail */
        dk[m] = keys[i];
        ds[m++] = scores[i];
    }
    if (store_in(h, g, t + 1, dk, ds, dsrc, m, NULL, 0) != KVT_OK) {
        h->st.pieces_refused += m;
        if (m && kvt_keyed_unpin(k, dk, m) != KVT_OK) abort();
    }
}

/* Tier t of group g (a round's, for kvt__keyed_evict_next's keep). */
typedef struct {
    const kvt_hybrid_t *h;
    uint32_t g;
    int t;
} tier_ref_t;

/* Whether a round's victim in tier r goes down first: under write_back,
 * when the tier below lacks it (neither there nor on its way). */
static int goes_down(const tier_ref_t *r, kvt_key128_t key) {
    const kvt_keyed_t *below = r->h->kc[r->g][r->t + 1];
    return has_below(r->h, r->g, r->t) && down_policy(r->h, r->t) == KVT_WRITE_BACK &&
           (below == NULL || kvt__keyed_find(below, key) == UINT32_MAX);
}

/* async_moves: such a victim stays until its copy lands. */
static int stays_for_copy(void *arg, kvt_key128_t key) { return goes_down(arg, key); }

/* Free-room planning for the pieces, as the cache's for its pages (cache.h,
 * Free room): when tier t of group g (L1 or L2) has fewer free slots than
 * half its target (cache.l1_free_room or l2_free_room of its slots), a
 * round evicts back to the target, in the policy's order. It runs at
 * release, between requests, so that the next admissions' loads find their
 * slots free: under write_back the copies down are then off the hit's
 * path. A victim the tier below lacks goes down first under write_back: in
 * order, its copy is recorded before its slot can be written again; with
 * async_moves it stays, pinned, until the copy lands (kvt_hybrid_moves_done
 * evicts it then; leaving counts those, so that the next round does not
 * take more for them). A victim the tier below cannot take is evicted
 * anyway, as a store's would be. Out of memory, the round is skipped: a
 * store evicts for its deficit. */
static void restore_room(kvt_hybrid_t *h, uint32_t g, int t) {
    kvt_keyed_t *k = h->kc[g][t];
    uint64_t target = h->room[g][t], free = k ? k->pages - k->nents + h->leaving[g][t] : 0;
    if (k == NULL || 2 * free >= target) return;
    size_t want = (size_t)(target - free), nd = 0;
    size_t bytes = want * (2 * sizeof(kvt_key128_t) + 3 * sizeof(uint64_t) + sizeof(src_t) + 1);
    unsigned char *work = kvt__malloc(bytes);
    if (work == NULL || moves_room(h, want) != KVT_OK) {
        kvt__free(work, bytes);
        return;
    }
    kvt_key128_t *vk = (kvt_key128_t *)work, *dk = vk + want;
    uint64_t *vs = (uint64_t *)(dk + want), *ds = vs + want, *pages = ds + want;
    src_t *dsrc = (src_t *)(pages + want);
    uint8_t *kept = (uint8_t *)(dsrc + want);
    int async = h->cfg.async_moves;
    tier_ref_t r = {h, g, t};
    size_t n = kvt__keyed_evict_next(k, want, async ? stays_for_copy : NULL, &r, vk, vs, pages, kept);
    for (size_t i = 0; i < n; i++) {
        h->st.round_evictions += !kept[i];
        if (!kept[i] && !goes_down(&r, vk[i])) continue;
        dk[nd] = vk[i];
        ds[nd] = down_score(h, vs[i]);
        dsrc[nd++] = (src_t){(uint32_t)t + 1, kept[i], pages[i]};
    }
    int rc = store_in(h, g, t + 1, dk, ds, dsrc, nd, NULL, 0); /* (touches no tier above t + 1) */
    if (rc != KVT_OK) h->st.pieces_refused += nd;
    for (size_t i = 0; i < nd && async; i++) { /* the kept: pinned until the copy lands, or out now */
        size_t gone = 0;
        if (rc != KVT_OK) {
            if (kvt__keyed_evict(k, &dk[i], 1, &gone) == KVT_OK) h->st.round_evictions += gone;
            continue;
        }
        if (kvt_keyed_pin(k, &dk[i], 1, NULL) != KVT_OK) abort(); /* the copy's (src_pinned): kept ready */
        uint32_t e = copy_down(h, g, t, dsrc[i].slot, dk[i]);
        KVT_ASSERT(e != PEND_NONE);
        h->pt.e[e].evict_src = 1;
        h->leaving[g][t]++;
    }
    kvt__free(work, bytes);
}

/* The shallowest of the cache's own tiers (0, 1, 2) holding key in group
 * g, or -1. */
static int own_tier(const kvt_hybrid_t *h, uint32_t g, kvt_key128_t key) {
    for (int t = 0; t < 3; t++) {
        if (h->kc[g][t] == NULL) continue;
        int r = kvt_keyed_lookup(h->kc[g][t], key); /* pending in L1: on its way (async_moves) */
        if (r == KVT_KEYED_HIT || (t == 0 && r == KVT_KEYED_PENDING)) return t;
    }
    return -1;
}

/* Group g's piece i's key (window page i, or the checkpoint after i pages). */
static kvt_key128_t piece_key(const kvt_hybrid_t *h, uint32_t g, uint64_t i) {
    return key_of(h->hash[h->cfg.groups[g].kind == KVT_GROUP_STATE ? i - 1 : i]);
}

/* Fills the memo of group g's pieces from i down to span of them: each one
 * not known yet gets its own tier, else the outside L3's answer, all of
 * these asked in one call (a round trip). While the match rule searches,
 * span is PROBE_BATCH: it walks down (a window's pages from the top, a state
 * group's checkpoints from m), so the pieces below the one it asks about are
 * the ones it may ask about next. */
#define PROBE_BATCH 64
static void resolve_down(kvt_hybrid_t *h, uint32_t g, uint64_t i, uint64_t span) {
    uint64_t lo = h->cfg.groups[g].kind == KVT_GROUP_STATE ? 1 : 0, end = i + 1 > span ? i + 1 - span : 0;
    if (end < lo) end = lo;
    kvt_key128_t keys[PROBE_BATCH];
    uint64_t at[PROBE_BATCH];
    uint8_t there[PROBE_BATCH];
    size_t k = 0;
    for (uint64_t j = i + 1; j-- > end;) {
        int8_t *m = &h->memo[(size_t)g * h->mstride + j];
        if (*m != MEMO_UNKNOWN) continue;
        kvt_key128_t key = piece_key(h, g, j);
        if ((*m = (int8_t)own_tier(h, g, key)) >= 0) continue;
        keys[k] = key;
        at[k++] = j;
    }
    memset(there, 0, k);
    if (k && h->probe) {
        h->in_probe = true;
        if (h->probe(h->probe_arg, g, keys, k, there) != 0) memset(there, 0, k);
        h->in_probe = false;
    }
    for (size_t x = 0; x < k; x++) h->memo[(size_t)g * h->mstride + at[x]] = there[x] ? 2 : -1;
}

/* The tier of group g's piece i (window page i, or the checkpoint after i
 * pages), asked once per admission: the match rule and the loads ask for
 * the same pieces. -1: in no tier. */
static int piece_tier(kvt_hybrid_t *h, uint32_t g, uint64_t i) {
    int8_t *m = &h->memo[(size_t)g * h->mstride + i];
    if (*m == MEMO_UNKNOWN) {
        if (h->cfg.groups[g].kind == KVT_GROUP_STATE && i == 0) *m = 0; /* (the empty prefix's state) */
        else resolve_down(h, g, i, h->searching ? PROBE_BATCH : 1);
    }
    return *m;
}

static int have_cache(void *ctx, uint32_t g, uint64_t i) { return piece_tier(ctx, g, i) >= 0; }

/* The keys group g needs to continue from n pages, into h->keys; returns
 * how many. */
static size_t needed_keys(kvt_hybrid_t *h, uint32_t g, uint64_t n, kvt_key128_t *out) {
    const kvt_layer_group_t *gr = &h->cfg.groups[g];
    if (n == 0) return 0;
    if (gr->kind == KVT_GROUP_STATE) {
        out[0] = key_of(h->hash[n - 1]);
        return 1;
    }
    size_t k = 0;
    for (uint64_t i = kvt__hybrid_first_needed(gr, h->P, n); i < n; i++) out[k++] = key_of(h->hash[i]);
    return k;
}

/* ---- admit --------------------------------------------------------------------- */

static int hashes(kvt_hybrid_t *h, uint32_t ns, const int32_t *tokens, uint64_t npages) {
    if (kvt__grow((void **)&h->hash, &h->hcap, npages + 1, sizeof(*h->hash)) != KVT_OK) return KVT_ENOMEM;
    kvt_page_hash_chain(ns, tokens, npages, h->P, h->hash);
    return KVT_OK;
}

static void free_pins(pins_t *p) {
    if (p) kvt__free(p, p->bytes);
}

/* Most pieces a request of npages pages can pin in group g. */
static size_t pin_bound(const kvt_hybrid_t *h, uint32_t g, uint64_t npages) {
    const kvt_layer_group_t *gr = &h->cfg.groups[g];
    if (gr->kind == KVT_GROUP_FULL) return 0;
    if (gr->kind == KVT_GROUP_STATE) return 1;
    uint64_t w = gr->window / h->P + 1;
    return (size_t)(w < npages ? w : npages);
}

/* A request's record, with room for whatever it may pin; NULL: no memory. */
static pins_t *new_pins(kvt_hybrid_t *h, uint64_t npages) {
    size_t total = 0;
    for (uint32_t g = 0; g < h->cfg.ngroups; g++) total += pin_bound(h, g, npages);
    size_t bytes = sizeof(pins_t) + total * (sizeof(kvt_key128_t) + 1);
    pins_t *p = kvt__calloc(1, bytes);
    if (p == NULL || keys_room(h, total + 1) != KVT_OK) {
        kvt__free(p, bytes);
        return NULL;
    }
    p->bytes = bytes;
    kvt_key128_t *next = (kvt_key128_t *)(p + 1);
    uint8_t *wait = (uint8_t *)(next + total);
    for (uint32_t g = 0; g < h->cfg.ngroups; g++) {
        p->keys[g] = next;
        p->wait[g] = wait;
        next += pin_bound(h, g, npages);
        wait += pin_bound(h, g, npages);
    }
    return p;
}

/* A request's piece in L1 (pins_t.wait). */
enum { PIECE_PINNED = 0, PIECE_WAITING = 1, PIECE_FAILED = 2 };

/* Drops what request p holds in group g's L1: the pins of its pieces that
 * landed; those still on their way are no longer waited for. */
static void unpin_request(kvt_hybrid_t *h, pins_t *p, uint32_t g) {
    for (uint32_t i = 0; i < p->count[g]; i++) {
        if (p->wait[g][i] == PIECE_PINNED && kvt_keyed_unpin(h->kc[g][0], &p->keys[g][i], 1) != KVT_OK) abort();
        p->nwait -= p->wait[g][i] == PIECE_WAITING;
    }
    p->count[g] = 0;
}

/* Pins request p's group g pieces keys[g][0..count) in L1: those there now;
 * those whose copy into L1 is in flight (async_moves) when they land
 * (landed). */
static void pin_request(kvt_hybrid_t *h, pins_t *p, uint32_t g) {
    for (uint32_t i = 0; i < p->count[g]; i++) {
        int ready = kvt_keyed_pin(h->kc[g][0], &p->keys[g][i], 1, NULL) == KVT_OK;
        KVT_ASSERT(ready || h->cfg.async_moves); /* stored just now, protected */
        p->wait[g][i] = ready ? PIECE_PINNED : PIECE_WAITING;
        p->nwait += !ready;
    }
}

/* Loads the pieces n needs into L1 and pins them there, recording them in
 * p. The deepest tier a piece came from goes to *tier (0-based, -1 none).
 * KVT_ENOSPC (or KVT_ENOMEM) when L1 cannot take them: nothing pinned then.
 * With n = 0 it cannot fail. */
static int load_and_pin(kvt_hybrid_t *h, uint64_t n, pins_t *p, int *tier) {
    for (uint32_t g = 0; g < h->cfg.ngroups; g++) {
        if (!h->kc[g][0]) continue;
        size_t k = needed_keys(h, g, n, p->keys[g]), nl = 0;
        int state = h->cfg.groups[g].kind == KVT_GROUP_STATE;
        uint64_t first = state ? n : kvt__hybrid_first_needed(&h->cfg.groups[g], h->P, n);
        for (size_t i = 0; i < k; i++) {
            int t = piece_tier(h, g, first + i); /* the state group's one piece: the checkpoint at n */
            if (t > *tier) *tier = t;
            if (t > 0) { /* from below; pinned there while it is copied up, so that nothing this load
                          * pushes down takes its slot first */
                h->keys[nl] = p->keys[g][i];
                uint32_t e = t == 1 ? kvt__keyed_find(h->kc[g][t], p->keys[g][i]) : UINT32_MAX;
                uint64_t own = e != UINT32_MAX ? h->kc[g][t]->ents[e].score : born(h, p->prio); /* L3: as new */
                h->scores[nl] = carried(h, score_of(h, 1, first + i) | h->seen, own);
                /* pinned while copied (async_moves: until the copy is reported); the outside L3: by key */
                h->srcs[nl++] = (src_t){(uint32_t)t + 1, h->cfg.async_moves && h->kc[g][t], UINT64_MAX};
                if (h->kc[g][t] && kvt_keyed_pin(h->kc[g][t], &p->keys[g][i], 1, &h->srcs[nl - 1].slot) != KVT_OK)
                    abort();
            }
        }
        int rc = moves_room(h, nl);
        uint64_t evicted = h->kc[g][0]->evictions;
        if (rc == KVT_OK) rc = store_in(h, g, 0, h->keys, h->scores, h->srcs, nl, p->keys[g], k);
        h->st.admit_evictions += h->kc[g][0]->evictions - evicted;
        for (size_t i = 0; i < nl; i++) /* recorded with async_moves: pinned until reported */
            if (h->kc[g][h->srcs[i].tier - 1] && (rc != KVT_OK || !h->srcs[i].pinned))
                kvt_keyed_unpin(h->kc[g][h->srcs[i].tier - 1], &h->keys[i], 1);
        if (rc != KVT_OK) { /* unpin the groups done */
            for (uint32_t d = 0; d < g; d++) unpin_request(h, p, d);
            return rc;
        }
        h->st.pieces_loaded += nl;
        for (size_t i = 0; i < k; i++) h->scores[i] = score_of(h, 1, first + i) | h->seen; /* used: seen again */
        refresh(h, g, 0, p->keys[g], h->scores, k, 0, p->prio);
        p->count[g] = (uint32_t)k;
        pin_request(h, p, g);
    }
    return KVT_OK;
}

/* A hit refreshes every piece of its path in every tier, as the radix cache
 * refreshes the whole matched prefix: the pieces below n serve the other
 * requests that branch off this path. Each counts the hit, as each node of
 * a matched prefix does. */
static void touch_path(kvt_hybrid_t *h, uint64_t n, int32_t prio) {
    if (n == 0 || keys_room(h, (size_t)n) != KVT_OK) return;
    for (uint64_t i = 0; i < n; i++) {
        h->keys[i] = key_of(h->hash[i]);
        h->scores[i] = score_of(h, 1, i + 1); /* window page i; the checkpoint after i + 1 pages */
    }
    for (uint32_t g = 0; g < h->cfg.ngroups; g++)
        for (int t = 0; t < 3; t++)
            if (h->kc[g][t]) refresh(h, g, t, h->keys, h->scores, (size_t)n, 1, prio);
}

/* arc's misses for L1's pieces: those a hit of all m full pages needed (a
 * window's pages before m, the checkpoint at m) that the search found in no
 * tier. When L1's ghosts remember losing one, the class that lost it should
 * have held more: the hit would have been longer. (A piece a request
 * recomputes and stores again is not taken as a miss, nor promoted as ARC
 * promotes a page that comes back: most are pages no hit will need, and
 * counting them moved the share the wrong way; nor is a piece only L2 or L3
 * holds, which lost hits with an L3 below: docs/hybrid.md.) */
static void missed(kvt_hybrid_t *h, uint64_t m) {
    for (uint32_t g = 0; g < h->cfg.ngroups; g++) {
        if (!h->kc[g][0]) continue;
        int state = h->cfg.groups[g].kind == KVT_GROUP_STATE;
        uint64_t lo = state ? m : kvt__hybrid_first_needed(&h->cfg.groups[g], h->P, m), hi = state ? m + 1 : m;
        for (uint64_t i = lo; i < hi; i++)
            if (h->memo[(size_t)g * h->mstride + i] == -1) /* asked, and in no tier */
                kvt__keyed_missed(h->kc[g][0], piece_key(h, g, i));
    }
}

int kvt_hybrid_admit(kvt_hybrid_t *h, uint32_t ns, const int32_t *tokens, uint64_t ntokens, int32_t priority,
                     uint32_t *l1_ids, kvt_hybrid_req_t *req) {
    return kvt_hybrid_admit_prefetched(h, 0, ns, tokens, ntokens, priority, l1_ids, req);
}

int kvt_hybrid_set_l3(kvt_hybrid_t *h, kvt_hybrid_probe_fn probe, void *arg) {
    if (h && h->in_probe) return KVT_EBUSY;
    if (h == NULL || h->live || h->driven || h->cfg.cache.l2_pages == 0) return KVT_EINVAL;
    /* a piece has no hit count to select by: no piece would ever go down (as create refuses it for a modeled L3) */
    if (probe && h->cfg.cache.l3_write_policy == KVT_WRITE_THROUGH_SELECTIVE) return KVT_EINVAL;
    for (uint32_t g = 0; g < h->cfg.ngroups; g++)
        if (h->kc[g][2]) return KVT_EINVAL; /* a modeled L3 already */
    h->probe = probe;
    h->probe_arg = arg;
    return KVT_OK;
}

int kvt_hybrid_admit_prefetched(kvt_hybrid_t *h, uint64_t id, uint32_t ns, const int32_t *tokens, uint64_t ntokens,
                                int32_t priority, uint32_t *l1_ids, kvt_hybrid_req_t *req) {
    if (h == NULL || req == NULL || (tokens == NULL && ntokens)) return KVT_EINVAL;
    if (h->in_probe) return KVT_EBUSY;
    uint64_t npages = ntokens / h->P;
    if (hashes(h, ns, tokens, npages) != KVT_OK) return KVT_ENOMEM;
    h->mstride = (size_t)npages + 1;
    if (kvt__grow((void **)&h->memo, &h->mcap, h->mstride * G, 1) != KVT_OK) return KVT_ENOMEM;
    pins_t *p = new_pins(h, npages);
    if (p == NULL) return KVT_ENOMEM;
    kvt_hybrid_req_t r;
    memset(&r, 0, sizeof(r));
    int rc = kvt_cache_admit_prefetched(h->cache, id, ns, tokens, ntokens, priority, l1_ids, &r.full);
    if (rc != KVT_OK) {
        free_pins(p);
        return rc;
    }
    h->clock++;
    uint64_t m = r.full.l1_hit_pages + r.full.l2_hit_pages + r.full.l3_hit_pages;
    memset(h->memo, MEMO_UNKNOWN, h->mstride * G);
    h->searching = true; /* (its questions walk down: the outside L3 is asked ahead, resolve_down) */
    uint64_t n = kvt__hybrid_longest(h->cfg.groups, h->cfg.ngroups, h->P, m, have_cache, h, &r.short_by);
    h->searching = false;
    uint64_t n_rule = n; /* what the rule lost is counted as the rule's, even when room then loses the rest */
    uint32_t rule_short = r.short_by;
    if (n < m && h->cfg.cache.policy == KVT_POLICY_ARC) missed(h, m); /* (s2lru's share is fixed) */
    int tier = -1;
    p->prio = priority;
    if (load_and_pin(h, n, p, &tier) != KVT_OK) { /* the pieces do not fit in L1 beside the pinned ones */
        h->st.room_short_tokens += n * h->P;
        n = 0;
        r.short_by = SHORT_ROOM;
        tier = -1;
        load_and_pin(h, 0, p, &tier);
    }
    touch_path(h, n, priority);
    if (n > 0) { /* the full groups' part: L1 pages first, then L2's, then L3's */
        int ft = n <= r.full.l1_hit_pages ? 0 : n <= r.full.l1_hit_pages + r.full.l2_hit_pages ? 1 : 2;
        if (ft > tier) tier = ft;
    }
    p->npages = npages;
    p->n = n;
    p->m = m;
    p->ns = ns;
    if (npages) p->last = h->hash[npages - 1];
    r.hit_pages = n;
    r.full_hit_pages = m;
    r.hit_tier = n ? (uint32_t)tier + 1 : 0;
    p->id = atomic_fetch_add_explicit(&admissions, 1, memory_order_relaxed) + 1;
    r.priv_ = (void *)(uintptr_t)p->id;
    p->next = h->live_reqs;
    if (p->next) p->next->prev = p;
    h->live_reqs = p;
    h->live++;
    h->st.requests++;
    h->st.tokens += ntokens;
    h->st.hit_tokens += n * h->P;
    h->st.full_hit_tokens += m * h->P;
    if (n) *(tier == 0 ? &h->st.l1_hit_tokens : tier == 1 ? &h->st.l2_hit_tokens : &h->st.l3_hit_tokens) += n * h->P;
    if (rule_short == SHORT_WINDOW) h->st.window_short_tokens += (m - n_rule) * h->P;
    if (rule_short == SHORT_STATE) h->st.state_short_tokens += (m - n_rule) * h->P;
    *req = r;
    return KVT_OK;
}

/* ---- release ------------------------------------------------------------------- */

/* The kept points of a request that ran from n over npages, ascending, into
 * pts; returns how many. */
static size_t kept_points(const kvt_hybrid_t *h, const pins_t *p, uint64_t *pts) {
    size_t k = 0;
    uint64_t every = h->cfg.checkpoint_every, branch = h->cfg.checkpoint_branches && p->n < p->m ? p->m : 0;
    for (uint64_t c = p->n + 1; c <= p->npages; c++)
        if ((every && c % every == 0) || (h->cfg.checkpoint_ends && c == p->npages) || c == branch) pts[k++] = c;
    return k;
}

/* How many of keys[0..n) group g's L1 does not hold: the pieces a store of
 * them adds (the others it leaves as they are). */
static size_t absent(const kvt_hybrid_t *h, uint32_t g, const kvt_key128_t *keys, size_t n) {
    size_t a = 0;
    for (size_t i = 0; i < n; i++) a += kvt__keyed_find(h->kc[g][0], keys[i]) == UINT32_MAX;
    return a;
}

/* Stores, for window group g, pages [n, npages) (needed: within W tokens of
 * a kept point) and touches the needed ones it did not compute. KVT_ENOMEM
 * when memory, not room, kept some of them out (counted as refused). */
static int leave_window(kvt_hybrid_t *h, uint32_t g, const pins_t *p, const uint64_t *pts, size_t npts) {
    const kvt_layer_group_t *gr = &h->cfg.groups[g];
    uint64_t lo = npts ? kvt__hybrid_first_needed(gr, h->P, pts[0]) : p->n;
    if (lo > p->n) lo = p->n;
    size_t span = (size_t)(p->npages - lo);
    uint8_t *need = kvt__calloc(span ? span : 1, 1);
    if (need == NULL || keys_room(h, span + 1) != KVT_OK) {
        kvt__free(need, span ? span : 1);
        h->st.pieces_refused += p->npages - p->n;
        return KVT_ENOMEM;
    }
    for (size_t j = 0; j < npts; j++)
        for (uint64_t i = kvt__hybrid_first_needed(gr, h->P, pts[j]); i < pts[j]; i++) need[i - lo] = 1;
    size_t n = 0;
    for (uint64_t i = p->n; i < p->npages; i++) { /* needed ones first: kept when room runs short */
        if (!need[i - lo]) continue;
        h->keys[n] = key_of(h->hash[i]);
        h->srcs[n] = (src_t){.tier = KVT_HYBRID_ENGINE, .slot = i};
        h->scores[n++] = score_of(h, 1, i) | born(h, p->prio);
    }
    size_t nneed = n;
    for (uint64_t i = p->n; i < p->npages; i++) {
        if (need[i - lo]) continue;
        h->keys[n] = key_of(h->hash[i]);
        h->srcs[n] = (src_t){.tier = KVT_HYBRID_ENGINE, .slot = i};
        h->scores[n++] = score_of(h, 0, i) | born(h, p->prio);
    }
    memcpy(h->prot, h->keys, nneed * sizeof(*h->prot));
    size_t fresh_needed = absent(h, g, h->keys, nneed), stored = fresh_needed + absent(h, g, h->keys + nneed, n - nneed);
    int rc = moves_room(h, n), short_of_memory = 0;
    if (rc == KVT_OK) rc = store_in(h, g, 0, h->keys, h->scores, h->srcs, n, h->prot, nneed);
    if (rc != KVT_OK) { /* no room for the spare pages (or their moves): the needed ones alone */
        short_of_memory = rc == KVT_ENOMEM;
        h->st.pieces_refused += stored - fresh_needed;
        stored = fresh_needed;
        rc = moves_room(h, nneed);
        if (rc == KVT_OK) rc = store_in(h, g, 0, h->prot, h->scores, h->srcs, nneed, h->prot, nneed);
    }
    if (rc == KVT_OK) h->st.window_pages_stored += stored;
    else h->st.pieces_refused += fresh_needed;
    short_of_memory |= rc == KVT_ENOMEM;
    /* the needed pages before n (pinned by this request) and those it recomputed keep the needed class */
    size_t t = 0;
    for (uint64_t i = lo; i < p->npages; i++)
        if (need[i - lo]) {
            h->keys[t] = key_of(h->hash[i]);
            h->scores[t++] = score_of(h, 1, i);
        }
    for (int tier = 0; tier < 3; tier++)
        if (h->kc[g][tier]) refresh(h, g, tier, h->keys, h->scores, t, 0, p->prio);
    kvt__free(need, span ? span : 1);
    return short_of_memory ? KVT_ENOMEM : KVT_OK;
}

/* Stores state group g's checkpoints at the kept points (the last alone when
 * they do not all fit). KVT_ENOMEM as leave_window. */
static int leave_state(kvt_hybrid_t *h, uint32_t g, const pins_t *p, const uint64_t *pts, size_t npts) {
    for (size_t j = 0; j < npts; j++) {
        h->keys[j] = key_of(h->hash[pts[j] - 1]);
        h->srcs[j] = (src_t){.tier = KVT_HYBRID_ENGINE, .slot = pts[j]};
        h->scores[j] = score_of(h, 1, pts[j]) | born(h, p->prio);
    }
    size_t stored = absent(h, g, h->keys, npts);
    int rc = moves_room(h, npts), short_of_memory = 0;
    if (rc == KVT_OK) rc = store_in(h, g, 0, h->keys, h->scores, h->srcs, npts, NULL, 0);
    if (rc != KVT_OK && npts > 1) { /* no room for them all (or their moves): the last point alone */
        short_of_memory = rc == KVT_ENOMEM;
        size_t last = absent(h, g, h->keys + npts - 1, 1);
        h->st.pieces_refused += stored - last;
        stored = last;
        rc = moves_room(h, 1);
        if (rc == KVT_OK) rc = store_in(h, g, 0, h->keys + npts - 1, h->scores + npts - 1, h->srcs + npts - 1, 1, NULL, 0);
    }
    if (rc == KVT_OK) h->st.checkpoints_stored += stored;
    else h->st.pieces_refused += stored;
    short_of_memory |= rc == KVT_ENOMEM;
    return short_of_memory ? KVT_ENOMEM : KVT_OK;
}

/* The pins of a request admitted here and not released, or NULL: a
 * request of another cache, or a stale copy of one released, is found in no
 * list (its priv_ is the admission's number, which no other admission of
 * the process gets, even one whose pins come at the same address). */
static pins_t *live_pins(const kvt_hybrid_t *h, const kvt_hybrid_req_t *req) {
    if (h == NULL || req == NULL || req->priv_ == NULL) return NULL;
    pins_t *p = h->live_reqs;
    while (p && p->id != (uintptr_t)req->priv_) p = p->next;
    return p;
}

/* Drops request p's pins and takes it off the live list (its record is
 * still the caller's to read, then free). */
static void let_go(kvt_hybrid_t *h, pins_t *p) {
    for (uint32_t g = 0; g < h->cfg.ngroups; g++) unpin_request(h, p, g);
    *(p->prev ? &p->prev->next : &h->live_reqs) = p->next;
    if (p->next) p->next->prev = p->prev;
    h->live--;
}

int kvt_hybrid_release(kvt_hybrid_t *h, uint32_t ns, const int32_t *tokens, uint64_t ntokens, kvt_hybrid_req_t *req) {
    if (h && h->in_probe) return KVT_EBUSY;
    pins_t *p = live_pins(h, req);
    if (p == NULL || (tokens == NULL && ntokens)) return KVT_EINVAL;
    uint64_t npages = ntokens / h->P;
    if (npages != p->npages || ns != p->ns) return KVT_EINVAL;
    if (hashes(h, ns, tokens, npages) != KVT_OK) return KVT_ENOMEM; /* never: its admission grew the buffer */
    if (npages && memcmp(&h->hash[npages - 1], &p->last, sizeof(p->last)) != 0) return KVT_EINVAL;
    int rc = kvt_cache_release(h->cache, &req->full);
    if (rc != KVT_OK) return rc;
    h->clock++;
    let_go(h, p);
    uint64_t *pts = kvt__malloc((size_t)(npages + 1) * sizeof(*pts));
    if (pts == NULL) rc = KVT_ENOMEM;
    size_t npts = pts ? kept_points(h, p, pts) : 0;
    for (uint32_t g = 0; g < h->cfg.ngroups && pts; g++) {
        if (h->kc[g][0] == NULL) continue;
        int left = KVT_ENOMEM;
        if (h->cfg.groups[g].kind == KVT_GROUP_WINDOW) left = leave_window(h, g, p, pts, npts);
        else if (keys_room(h, npts + 1) == KVT_OK) left = leave_state(h, g, p, pts, npts);
        else h->st.pieces_refused += npts;
        if (left != KVT_OK) rc = left;
        for (int t = 0; t < 2; t++) restore_room(h, g, t);
    }
    kvt__free(pts, (size_t)(npages + 1) * sizeof(*pts));
    free_pins(p);
    req->priv_ = NULL;
    return rc;
}

int kvt_hybrid_abort(kvt_hybrid_t *h, kvt_hybrid_req_t *req) {
    if (h && h->in_probe) return KVT_EBUSY;
    pins_t *p = live_pins(h, req);
    if (p == NULL) return KVT_EINVAL;
    int rc = kvt_cache_abort(h->cache, &req->full);
    if (rc != KVT_OK) return rc;
    let_go(h, p);
    for (uint32_t g = 0; g < h->cfg.ngroups; g++) /* the loads of its hit may have spent the free room */
        for (int t = 0; t < 2; t++) restore_room(h, g, t);
    free_pins(p);
    req->priv_ = NULL;
    h->st.aborted++;
    return KVT_OK;
}

/* ---- what the engine copies ------------------------------------------------------ */

size_t kvt_hybrid_take_moves(kvt_hybrid_t *h, kvt_hybrid_move_t *out, size_t cap) {
    return h == NULL || h->driven ? 0 : kvt__hybrid_take_moves(h, out, cap);
}

size_t kvt__hybrid_take_moves(kvt_hybrid_t *h, kvt_hybrid_move_t *out, size_t cap) {
    if (h == NULL || (out == NULL && cap) || h->in_probe) return 0;
    if (h->cfg.async_moves) return kvt__pend_take(&h->pt, out, cap);
    size_t k = h->nmoves < cap ? h->nmoves : cap;
    memcpy(out, h->moves, k * sizeof(*out));
    memmove(h->moves, h->moves + k, (h->nmoves - k) * sizeof(*h->moves));
    h->nmoves -= k;
    return k;
}

size_t kvt_hybrid_moves(const kvt_hybrid_t *h) { return h == NULL ? 0 : h->cfg.async_moves ? h->pt.qn : h->nmoves; }

size_t kvt_hybrid_moves_outstanding(const kvt_hybrid_t *h) { return h ? h->pt.live - h->pt.qn : 0; }

size_t kvt_hybrid_engine_waiting(const kvt_hybrid_t *h, const kvt_key128_t *keys, size_t n) {
    if (h == NULL || keys == NULL) return 0;
    size_t k = 0;
    for (size_t j = 0; j < n; j++)
        for (uint32_t g = 0; g < h->cfg.ngroups; g++) /* what the engine writes goes to L1 */
            for (uint32_t i = kvt__pend_chain(&h->pt, g, 1, keys[j]); i != PEND_NONE; i = h->pt.e[i].next) {
                const kvt__pend_t *e = &h->pt.e[i];
                k += e->m.group == g && e->m.dst_tier == 1 && e->m.src_tier == KVT_HYBRID_ENGINE &&
                     kvt__key_eq(e->m.key, keys[j]) && (e->state == PEND_WAITING || e->state == PEND_QUEUED);
            }
    return k;
}

/* The requests waiting for group g's key to land in L1 pin it, or learn
 * that it will not. */
static void meet_waiters(kvt_hybrid_t *h, uint32_t g, kvt_key128_t key, int ok) {
    for (pins_t *p = h->live_reqs; p; p = p->next)
        for (uint32_t i = 0; i < p->count[g] && p->nwait; i++) {
            if (p->wait[g][i] != PIECE_WAITING || !kvt__key_eq(p->keys[g][i], key)) continue;
            if (ok && kvt_keyed_pin(h->kc[g][0], &key, 1, NULL) != KVT_OK) abort(); /* just made ready */
            p->wait[g][i] = ok ? PIECE_PINNED : PIECE_FAILED;
            p->failed |= !ok;
            p->nwait--;
        }
}

/* Move m was reported: its piece is ready in its tier or absent there. In
 * L1 it meets the requests waiting for it; under write_through it goes on
 * down now, pinned here while it is copied. */
static void landed(kvt_hybrid_t *h, const kvt_hybrid_move_t *m, int ok) {
    uint32_t g = m->group;
    int t = (int)m->dst_tier - 1;
    kvt_keyed_t *k = h->kc[g][t];
    h->st.moves_failed += !ok;
    if (k == NULL || m->dst_slot == UINT64_MAX) return; /* a put into the outside L3 */
    kvt_keyed_complete_store(k, &m->key, 1, ok);
    if (t == 0) meet_waiters(h, g, m->key, ok);
    if (!ok || !has_below(h, g, t) || down_policy(h, t) != KVT_WRITE_THROUGH) return;
    uint64_t score = k->ents[kvt__keyed_find(k, m->key)].score, ds;
    kvt_key128_t dk;
    src_t dsrc;
    send_down(h, g, t, &m->key, &score, 1, &dk, &ds, &dsrc);
}

/* Clears the marks of moves[0..n) that the first pass of moves_done set. */
static void unsee(kvt_hybrid_t *h, const kvt_hybrid_move_t *moves, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t e = kvt__pend_find(&h->pt, &moves[i], PEND_TAKEN, 1);
        if (e != PEND_NONE) h->pt.e[e].seen = 0;
    }
}

int kvt_hybrid_moves_done(kvt_hybrid_t *h, const kvt_hybrid_move_t *moves, size_t n, const uint8_t *ok) {
    return h == NULL || h->driven ? KVT_EINVAL : kvt__hybrid_moves_done(h, moves, n, ok);
}

int kvt__hybrid_moves_done(kvt_hybrid_t *h, const kvt_hybrid_move_t *moves, size_t n, const uint8_t *ok) {
    if (h == NULL || !h->cfg.async_moves || ((moves == NULL || ok == NULL) && n)) return KVT_EINVAL;
    if (h->in_probe) return KVT_EBUSY;
    for (size_t i = 0; i < n; i++) { /* every one taken and not reported, once */
        uint32_t e = kvt__pend_find(&h->pt, &moves[i], PEND_TAKEN, 0);
        if (e == PEND_NONE) {
            unsee(h, moves, i);
            return KVT_EINVAL;
        }
        h->pt.e[e].seen = 1;
    }
    bool any_ok = false;
    for (size_t i = 0; i < n && !any_ok; i++) any_ok = ok[i] != 0;
    /* what the pieces going on down record: no growing below (a failed move records nothing, so a report
     * of failures alone cannot run short: what a data plane leaving short of memory relies on) */
    if (any_ok && moves_room(h, n) != KVT_OK) {
        unsee(h, moves, n);
        return KVT_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t e = kvt__pend_find(&h->pt, &moves[i], PEND_TAKEN, 1);
        kvt__pend_t d = h->pt.e[e];
        kvt__pend_remove(&h->pt, e);
        if (d.src_pinned && kvt_keyed_unpin(h->kc[d.m.group][d.m.src_tier - 1], &d.m.key, 1) != KVT_OK) abort();
        if (d.evict_src) { /* a round's victim, copied down, leaves now (unless the copy failed or it is held) */
            size_t gone = 0;
            h->leaving[d.m.group][d.m.src_tier - 1]--;
            if (ok[i] && kvt__keyed_evict(h->kc[d.m.group][d.m.src_tier - 1], &d.m.key, 1, &gone) == KVT_OK)
                h->st.round_evictions += gone;
        }
        landed(h, &d.m, ok[i] != 0);
        if (d.waiter != PEND_NONE) kvt__pend_ready(&h->pt, d.waiter); /* the move into the slot it left */
    }
    return KVT_OK;
}

int kvt_hybrid_ready(const kvt_hybrid_t *h, const kvt_hybrid_req_t *req) {
    const pins_t *p = live_pins(h, req);
    if (p == NULL) return KVT_EINVAL;
    return p->failed ? KVT_EIO : p->nwait ? KVT_EAGAIN : KVT_OK;
}

int kvt_hybrid_slots(const kvt_hybrid_t *h, const kvt_hybrid_req_t *req, uint32_t g, uint64_t *slots, size_t cap,
                     size_t *n) {
    const pins_t *p = live_pins(h, req);
    if (p == NULL || n == NULL || g >= h->cfg.ngroups || (slots == NULL && cap)) return KVT_EINVAL;
    *n = p->count[g];
    if (p->count[g] > cap) return KVT_ERANGE;
    if (p->failed) return KVT_EIO;
    if (p->nwait) return KVT_EAGAIN; /* a slot whose piece is still on its way holds another's bytes */
    for (uint32_t i = 0; i < p->count[g]; i++)
        if (kvt_keyed_page(h->kc[g][0], p->keys[g][i], &slots[i]) != KVT_OK) return KVT_ECORRUPT;
    return KVT_OK;
}

/* ---- stats and checks ---------------------------------------------------------- */

static void keyed_used(const kvt_keyed_t *k, uint64_t *used) {
    kvt_keyed_stats_t ks = {.size = sizeof(ks)};
    *used = k && kvt_keyed_stats(k, &ks) == KVT_OK ? ks.pages - ks.free_pages : 0;
}

int kvt_hybrid_group_bytes(const kvt_hybrid_t *h, uint32_t g, kvt_hybrid_group_bytes_t *out) {
    if (h == NULL || out == NULL || g >= h->cfg.ngroups) return KVT_EINVAL;
    memset(out, 0, sizeof(*out));
    const kvt_layer_group_t *gr = &h->cfg.groups[g];
    if (gr->kind != KVT_GROUP_FULL) {
        for (int t = 0; t < 3; t++) {
            keyed_used(h->kc[g][t], &out->slots[t]);
            out->bytes[t] = out->slots[t] * h->slot_bytes[g];
        }
        return KVT_OK;
    }
    kvt_cache_stats_t cs = {.size = sizeof(cs)};
    kvt_cache_stats(h->cache, &cs);
    out->slots[0] = h->cfg.cache.l1_pages - cs.l1_free;
    out->slots[1] = h->cfg.cache.l2_pages ? h->cfg.cache.l2_pages - cs.l2_free : 0;
    out->slots[2] = h->cfg.cache.l3_pages ? cs.l3_known_pages : 0;
    for (int t = 0; t < 3; t++) out->bytes[t] = out->slots[t] * gr->bytes * h->P;
    return KVT_OK;
}

int kvt_hybrid_stats(const kvt_hybrid_t *h, kvt_hybrid_stats_t *st) {
    if (h == NULL || st == NULL) return KVT_EINVAL;
    kvt_hybrid_stats_t s = h->st;
    s.l1_bytes = s.l2_bytes = s.l3_bytes = 0;
    for (uint32_t g = 0; g < h->cfg.ngroups; g++) {
        kvt_hybrid_group_bytes_t b;
        kvt_hybrid_group_bytes(h, g, &b);
        s.l1_bytes += b.bytes[0];
        s.l2_bytes += b.bytes[1];
        s.l3_bytes += b.bytes[2];
    }
    kvt_radix_stats_t rs = {.size = sizeof(rs)};
    kvt_radix_stats(kvt_cache_tree(h->cache), &rs);
    s.cached_tokens = rs.pages * h->P;
    return kvt__abi_out(st, &s, sizeof(s));
}

/* Every pending piece is the destination of an outstanding move, every
 * pinned piece below L1 the source of one, and in L1 the pins are the live
 * requests' and the copies' (without async_moves no move is outstanding
 * between calls: the pins are the live requests' alone). */
static const char *check_pending(const kvt_hybrid_t *h, uint32_t g, int t, const kvt_keyed_stats_t *ks) {
    const kvt_keyed_t *k = h->kc[g][t];
    uint64_t arriving = 0, reading = 0, leaving = 0;
    for (uint32_t i = 0; i < h->pt.cap; i++) {
        const kvt__pend_t *e = &h->pt.e[i];
        if (e->state == PEND_FREE || e->m.group != g) continue;
        leaving += e->evict_src && e->m.src_tier == (uint32_t)t + 1;
        if (e->m.dst_tier == (uint32_t)t + 1 && e->m.dst_slot != UINT64_MAX) {
            arriving++;
            uint32_t x = kvt__keyed_find(k, e->m.key);
            if (x == UINT32_MAX || k->ents[x].state != KVT__KEYED_PENDING || k->ents[x].page != e->m.dst_slot)
                return "a move's destination is not pending in its slot";
        }
        if (e->src_pinned && e->m.src_tier == (uint32_t)t + 1) {
            reading++;
            uint32_t x = kvt__keyed_find(k, e->m.key);
            if (x == UINT32_MAX || k->ents[x].pins == 0 || k->ents[x].page != e->m.src_slot)
                return "a move's source is not pinned in its slot";
        }
    }
    if (arriving != ks->pending) return "a piece is pending with no move into it";
    if (t < 2 && leaving != h->leaving[g][t]) return "the count of a round's pieces leaving is wrong";
    uint64_t held = reading;
    for (const pins_t *p = h->live_reqs; p && t == 0; p = p->next)
        for (uint32_t i = 0; i < p->count[g]; i++) {
            uint32_t x = kvt__keyed_find(k, p->keys[g][i]);
            int state = x == UINT32_MAX ? 0 : k->ents[x].state;
            if (p->wait[g][i] == PIECE_WAITING && state != KVT__KEYED_PENDING)
                return "a request waits for a piece not on its way";
            if (p->wait[g][i] == PIECE_PINNED && (state != KVT__KEYED_READY || k->ents[x].pins == 0))
                return "a request's piece is not pinned in L1";
            held += p->wait[g][i] == PIECE_PINNED;
        }
    uint64_t pins = 0; /* every pin, not the pieces pinned: requests on one path pin its pieces each */
    for (size_t i = 0; i < k->nents; i++) pins += k->ents[i].pins;
    if (pins != held)
        return t ? "a piece is pinned below L1 with no copy reading it" : "a piece is pinned with no request or copy";
    return NULL;
}

int kvt_hybrid_check(kvt_hybrid_t *h, const char **why) {
    const char *w = NULL;
    if (why) *why = NULL;
    if (h == NULL) return KVT_EINVAL;
    int rc = kvt_cache_check(h->cache, &w);
    for (uint32_t g = 0; g < G && rc == KVT_OK; g++)
        for (int t = 0; t < 3 && rc == KVT_OK; t++) {
            if (h->kc[g][t] == NULL) continue;
            rc = kvt_keyed_check(h->kc[g][t], &w);
            kvt_keyed_stats_t ks = {.size = sizeof(ks)};
            kvt_keyed_stats(h->kc[g][t], &ks);
            if (rc != KVT_OK) break;
            const kvt_keyed_t *k = h->kc[g][t];
            if (k->class_bit != (t == 0 ? h->classes : 0)) rc = KVT_ECORRUPT, w = "a tier's pieces have the wrong classes";
            for (size_t i = 0; i < k->nents && rc == KVT_OK; i++) /* the class is L1's, under s2lru, arc and slru */
                if ((k->ents[i].score & SEEN) && (t > 0 || !h->classes))
                    rc = KVT_ECORRUPT, w = "a piece outside L1's classes is marked seen again";
            if (rc != KVT_OK) break;
            if (!h->cfg.async_moves) {
                if (ks.pending) rc = KVT_ECORRUPT, w = "a hybrid piece is pending outside a call";
                if (rc == KVT_OK && t > 0 && ks.pinned) rc = KVT_ECORRUPT, w = "a piece is pinned below L1";
                if (rc == KVT_OK && h->live == 0 && ks.pinned)
                    rc = KVT_ECORRUPT, w = "a piece is pinned with no live request";
            }
            if (rc == KVT_OK && (w = check_pending(h, g, t, &ks)) != NULL) rc = KVT_ECORRUPT;
        }
    uint64_t waiting = 0;
    for (const pins_t *p = h->live_reqs; p && rc == KVT_OK; p = p->next) {
        uint32_t nw = 0;
        for (uint32_t g = 0; g < h->cfg.ngroups; g++)
            for (uint32_t i = 0; i < p->count[g]; i++) nw += p->wait[g][i] == PIECE_WAITING;
        if (nw != p->nwait) rc = KVT_ECORRUPT, w = "a request's count of pieces on their way is wrong";
        waiting += nw;
    }
    if (rc == KVT_OK && (w = kvt__pend_check(&h->pt)) != NULL) rc = KVT_ECORRUPT;
    if (rc == KVT_OK && !h->cfg.async_moves && waiting) rc = KVT_ECORRUPT, w = "a request waits for a piece";
    if (why) *why = w;
    return rc;
}
