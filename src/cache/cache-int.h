/* Private to the cache module: the cache struct, shared by cache.c
 * (lifetime, stats, check), admit.c, evict.c, copies.c and policy.c
 * (eviction order), and what each offers the others. */
#ifndef KVTIER_CACHE_INT_H
#define KVTIER_CACHE_INT_H

#include "kvtier/alloc.h"
#include "kvtier/cache.h"
#include "kvtier/store.h"
#include "kvtier/xfer.h"
#include "../core/ghost-int.h"
#include "../core/lru-int.h"
#include "../radix/radix-int.h"
#include "fold-int.h"

typedef enum { OP_BACKUP, OP_LOAD } op_kind_t;

#define KVT__CACHE_DONE_CAP 256 /* completions applied per poll round */

typedef struct kvt__op {
    uint8_t kind;
    uint8_t ok;
    uint32_t l1, l2;
} kvt__op_t;

/* Per L2 page, what the third tier knows of it (kvt_cache.l3.flags). */
#define KVT__L3_FRESH 0x1   /* arrived from L3 and not yet served: an L3 hit when first loaded */
#define KVT__L3_FOREIGN 0x2 /* ... and this cache did not put it */
#define KVT__L3_BUSY 0x4    /* a store call reads or writes the page */
#define KVT__L3_DEFER 0x8   /* given back while busy: back to the allocator when the call completes */
#define KVT__L3_STORED 0x10 /* L3 holds this page (it came from there, or its put was acknowledged) */

typedef struct kvt__pf kvt__pf_t; /* a prefetch (l3.c) */

#define KVT__CORRUPT_MAX 64

/* Page ids on their way back to an allocator (appending never fails: room
 * for every page of the tier is set aside at creation). */
typedef struct kvt__idbuf {
    uint32_t *id;
    size_t n, cap;
} kvt__idbuf_t;

/* The cache's policy state (policy.c): what the eviction policy keeps
 * beyond each node's own fields. */
typedef struct kvt__cache_policy {
    uint64_t slru_pages;   /* pages of SLRU-protected nodes */
    kvt__ghost_t ghost[2]; /* s2lru: [0] pages that left the cache; arc: [c] left from class c */
    uint64_t cls_pages[2]; /* s2lru, arc: pages in the tree by class (0: seen once) */
    double arc_p;          /* arc: the target share of class 0, in pages */
} kvt__cache_policy_t;

/* The data plane (copies.c, kvt_cache_attach): the copies the cache's
 * decisions make, handed to a transfer engine; without one (xf NULL) they
 * complete at once. */
typedef struct kvt__cache_copies {
    kvt_xfer_t *xf;
    unsigned xf_l1, xf_l2;         /* the engine's indices of the L1 and L2 tiers */
    kvt_tier_t *l1_tier, *l2_tier; /* the L1 and L2 tiers */
    /* Another data plane beside this one (the hybrid cache's, for its
     * pieces): attach refuses an engine or tier it uses (taken(taken_by,
     * obj)), attach_store a store it uses or one of its stores' identities
     * (store_taken) */
    bool (*taken)(const void *taken_by, const void *obj);
    bool (*store_taken)(const void *taken_by, kvt_store_t *s);
    const void *taken_by;
    kvt_xfer_copy_t *pend[2];      /* copies not yet handed to the engine, by op_kind_t (tier pages) */
    size_t npend[2], pend_cap;
    kvt__op_t *done;               /* completed copies not yet applied */
    size_t ndone, done_cap;
    uint64_t inflight[2];          /* copies submitted and not applied, by op_kind_t */
    uint64_t backup_seq;           /* backups started */
    uint64_t fail_every, submitted; /* test hook: every fail_every-th copy fails */
} kvt__cache_copies_t;

/* The third tier (l3.c): a store (kvt_cache_attach_store) or a model. */
typedef struct kvt__cache_l3 {
    kvt_store_t *store;
    kvt__lru_t model;              /* cfg.l3_pages > 0: the modeled store */
    kvt__ghost_t own;              /* store: hashes of this cache's acknowledged puts */
    uint8_t *flags;                /* per L2 page: KVT__L3_* (NULL without L3) */
    uint64_t l2_deferred;          /* L2 pages given back while a store call holds them */
    uint64_t l2_returned;          /* deferred L2 pages that have gone back: a short prefetch looks again */
    kvt_store_page_t *q;           /* puts not yet handed to the store */
    size_t nq;
    kvt__pf_t **pf;                /* prefetches started and not finished, oldest first */
    size_t npf, pf_cap;
    uint64_t next_pf;
    uint64_t calls;                /* store calls in flight */
    bool no_wait;                  /* taking L2 pages for prefetches: what is free now, no waiting */
} kvt__cache_l3_t;

/* The cache: the tree and the tiers' page ids with their free-room planning
 * (evict.c) here; each other concern in its own part. */
struct kvt_cache {
    kvt_cache_config_t cfg;
    kvt_radix_t *tree;
    kvt_laneal_t *l1;
    kvt_extalloc_t *l2; /* NULL without an L2 tier */
    uint64_t clock;
    uint64_t held;                 /* requests admitted and not released */
    uint64_t l1_free, l2_free;     /* free pages, counting those in the buffers below */
    uint64_t l1_target, l2_target; /* free-room targets, pages: a round evicts back to n + target */
    uint64_t l1_floor, l2_floor;   /* ... and starts when an allocation would leave fewer free */
    kvt__idbuf_t l1_back, l2_back;
    kvt_run_t *l2_runs;            /* room for l2_back as runs */
    uint32_t *scratch;             /* page ids for one admission */
    size_t scratch_cap;
    uint64_t lane_pages;           /* L1 pages per lane (R) */
    uint32_t corrupt[KVT__CORRUPT_MAX]; /* L2 pages a load found corrupt, to drop (evict.c) */
    size_t ncorrupt;
    kvt__cache_policy_t pol;
    kvt__cache_copies_t dp;
    kvt_cache_cp_t cp;             /* CP group member (kvt_cache_attach_cp); cp.size 0: a single process */
    kvt__cache_l3_t l3;
    struct {
        uint64_t sum; /* the decision digest: a running hash of ids taken, given back and copied ... */
        uint64_t n;   /* ... and how many values it has folded (copies.c) */
    } dg;
    kvt_cache_stats_t st;
};

/* Test hook: from now on every n-th copy completes with a failure (0: none). */
void kvt__cache_fail_copies(kvt_cache_t *c, uint64_t n);

/* copies.c */
/* Folds v into the decision digest: order-sensitive, so two caches fed the
 * same calls agree on it only if they made the same decisions (CP ranks
 * compare it). Inline: a fold per page id taken or given back. The digest is
 * the sum of one term per value, a multiply-xorshift of the value and its
 * place in the sequence (fold-int.h): the place keeps the order, and no term
 * waits on the one before (a chain such as (d ^ v) x P + C would put a
 * multiply's latency on every page id). Only a cache made with
 * cfg.decision_digest folds: the folds are a term per page id, and only CP
 * groups and tests read the digest. */
static inline bool kvt__cache_folds(const kvt_cache_t *c) { return c->cfg.decision_digest; }
static inline void kvt__cache_fold(kvt_cache_t *c, uint64_t v) {
    if (kvt__cache_folds(c)) c->dg.sum += kvt__fold_term(v, c->dg.n++);
}
/* A run of folds with the sums in registers: begin, fold each value in order, end. */
typedef struct {
    uint64_t sum, n;
} kvt__folds_t;
static inline kvt__folds_t kvt__folds_begin(const kvt_cache_t *c) { return (kvt__folds_t){0, c->dg.n}; }
static inline void kvt__folds_add(kvt__folds_t *f, uint64_t v) { f->sum += kvt__fold_term(v, f->n++); }
static inline void kvt__folds_end(kvt_cache_t *c, kvt__folds_t f) {
    c->dg.sum += f.sum;
    c->dg.n = f.n;
}
/* Folds tag | ids[i] for each of k ids, in order (fold.c: eight at a time where it can). */
static inline void kvt__cache_fold_ids(kvt_cache_t *c, uint64_t tag, const uint32_t *ids, size_t k) {
    if (!kvt__cache_folds(c)) return;
    c->dg.sum += kvt__fold_ids_sum(tag, ids, k, c->dg.n);
    c->dg.n += k;
}
/* A page id goes back to its allocator at the next flush. */
void kvt__cache_give_back_l1(kvt_cache_t *c, uint32_t id);
/* The end of the buffer of L1 ids given back, where k ids may be written;
 * then kvt__cache_gave_back_l1(c, k) gives them back (as k
 * kvt__cache_give_back_l1 calls). */
uint32_t *kvt__cache_l1_back_end(kvt_cache_t *c);
void kvt__cache_gave_back_l1(kvt_cache_t *c, uint32_t k);
/* The same for L2: the buffer's end, where k ids may be written, then
 * kvt__cache_gave_back_l2(c, k). */
uint32_t *kvt__cache_l2_back_end(kvt_cache_t *c);
void kvt__cache_gave_back_l2(kvt_cache_t *c, uint32_t k);
void kvt__cache_give_back_l2(kvt_cache_t *c, uint32_t id);
/* Returns the buffered ids to the allocators; KVT_ENOMEM keeps them buffered. */
int kvt__cache_flush(kvt_cache_t *c);
/* Queues a copy (OP_BACKUP: l1 -> l2; OP_LOAD: l2 -> l1); its pages are in flight. */
void kvt__cache_submit(kvt_cache_t *c, op_kind_t kind, uint32_t l1, uint32_t l2);
/* Whether a backup completes as it is made, nothing to see in between: no
 * data plane (page ids only), no injected copy failures, no L3 to put to. */
static inline bool kvt__cache_backups_at_once(const kvt_cache_t *c) {
    return c->dp.xf == NULL && c->dp.fail_every == 0 && c->l3.flags == NULL;
}
/* Backs up n's pages lo .. lo + k - 1 (k >= 1) into L2 pages l2[0 .. k - 1]
 * when kvt__cache_backups_at_once: what begin, submit and the completion's
 * apply would do for each, the last page first, in their order. */
void kvt__cache_back_up_run_at_once(kvt_cache_t *c, kvt_rnode_t *n, uint32_t lo, uint32_t k, const uint32_t *l2);
/* Loads n's pages past its L1 prefix that have no L1 page into L1 pages
 * l1[0 ..) when kvt__cache_backups_at_once and no completion is queued: what
 * begin, submit and the completion's apply would do for each, in page order.
 * Returns how many. */
uint32_t kvt__cache_load_node_at_once(kvt_cache_t *c, kvt_rnode_t *n, const uint32_t *l1);
/* Waits for every copy of a kind in flight, and applies them. */
void kvt__cache_wait_kind(kvt_cache_t *c, op_kind_t kind);
/* Waits for the backups of n's pages up to idx. */
void kvt__cache_wait_backups_upto(kvt_cache_t *c, kvt_rnode_t *n, uint32_t idx);

/* evict.c */
/* Evicts until n + floor L2 (L1) pages are free or nothing may go; true if it evicted. */
bool kvt__cache_plan_l2_to(kvt_cache_t *c, uint64_t n, uint64_t floor);
bool kvt__cache_plan_l1_to(kvt_cache_t *c, uint64_t n, uint64_t floor);
/* Room for n L1 pages under the free-room rule (a round if below the floor). */
void kvt__cache_plan_l1(kvt_cache_t *c, uint64_t n);
/* Up to n L2 pages (room planned first) into out; how many. */
uint64_t kvt__cache_take_l2(kvt_cache_t *c, uint64_t n, uint32_t *out);
/* Backs up page idx of n (and the pages before it lacking a copy); false when L2 has no room. */
bool kvt__cache_backup(kvt_cache_t *c, kvt_rnode_t *n, uint32_t idx);
/* L2 copies found corrupt: noted at load, dropped when nothing holds them. */
void kvt__cache_note_corrupt(kvt_cache_t *c, uint32_t l1, uint32_t l2); /* the load into l1 found l2 corrupt */
void kvt__cache_forget_corrupt(kvt_cache_t *c, uint32_t l2);
void kvt__cache_purge_corrupt(kvt_cache_t *c);
/* Nothing in x's subtree is held, pinned or in flight. */
bool kvt__cache_free_below(const kvt_rnode_t *x);
/* x's subtree (so free) leaves the cache: its L1 and L2 pages go back, the
 * policy keeps no ghost, nothing goes on to L3. Returns the pages. */
uint64_t kvt__cache_drop_subtree(kvt_cache_t *c, kvt_rnode_t *x);

/* l3.c */
int kvt__l3_init(kvt_cache_t *c);     /* the model, at create (cfg.l3_pages) */
void kvt__l3_fini(kvt_cache_t *c);    /* waits for the store calls in flight */
static inline bool kvt__l3_on(const kvt_cache_t *c) { return c->l3.flags != NULL; }
/* Puts page idx of n (valid in L2) unless L3 is known to hold it. */
void kvt__l3_put(kvt_cache_t *c, kvt_rnode_t *n, uint32_t idx);
/* write_through_selective: puts the L2 pages of the nodes on the path to
 * `end` that have reached l3_write_hits. */
void kvt__l3_selective(kvt_cache_t *c, kvt_rnode_t *end);
/* An L2 page goes back: true when a store call holds it (it goes back to the
 * allocator when the call completes). */
bool kvt__l3_hold(kvt_cache_t *c, uint32_t l2);
/* An L2 page is being loaded into L1: its KVT__L3_FRESH | FOREIGN bits, cleared. */
unsigned kvt__l3_served(kvt_cache_t *c, uint32_t l2);
/* Hands queued puts to the store, applies its completions (waiting up to
 * timeout_ns for one), and, with advance, starts the fetches of prefetches
 * whose lookup is done (that takes L2 pages: not from inside an eviction). */
void kvt__l3_poll(kvt_cache_t *c, uint64_t timeout_ns, bool advance);
/* Waits until the allocator has n free L2 pages or no store call holds one. */
void kvt__l3_wait_room(kvt_cache_t *c, uint64_t n);
/* Waits for every store call in flight. */
void kvt__l3_sync(kvt_cache_t *c);
/* Finishes prefetch id for an admission of these tokens (inserting what
 * arrived into the tree as pages in L2); fills req's prefetch fields. */
int kvt__l3_finish(kvt_cache_t *c, uint64_t id, uint32_t ns, const int32_t *tokens, uint64_t ntokens,
                   int32_t priority, kvt_cache_req_t *req);
/* The L2 pages prefetches hold and those deferred; KVT_ECORRUPT (and *why)
 * when the deferred count differs from the pages marked. */
int kvt__l3_check(kvt_cache_t *c, uint64_t *held, uint64_t *deferred, const char **why);

/* policy.c */
/* The policy's ghosts are keyed by page keys: the tree keeps them (radix-int.h). */
bool kvt__policy_needs_keys(kvt_policy_t p);
uint64_t kvt__policy_score(void *ctx, const kvt_rnode_t *n, kvt__vset_t set);
/* A node was matched by a request of this priority (its hits and last access are already updated). */
void kvt__policy_on_hit(kvt_cache_t *c, kvt_rnode_t *n, int32_t priority);
/* n is about to lose its last k pages, the last first (and, with its last, to be freed). */
void kvt__policy_on_trim(kvt_cache_t *c, kvt_rnode_t *n, uint32_t k);
/* The same for pages that never held KV (an aborted request's): no ghost remembers them. */
void kvt__policy_on_drop(kvt_cache_t *c, kvt_rnode_t *n, uint32_t k);
/* n's last pages are about to leave, the last first: up to m (>= 1) of them,
 * while kvt__policy_l1_first stays `first` (asked before each page after the
 * first, as the pages leave). Returns how many (>= 1). */
uint32_t kvt__policy_on_trim_tail(kvt_cache_t *c, kvt_rnode_t *n, uint32_t m, kvt__vset_t first);
/* Of npages new pages about to go below `at` (which had `children` children
 * when matched), how many leading ones start protected. */
uint64_t kvt__policy_protected_prefix(kvt_cache_t *c, kvt_rnode_t *at, uint32_t children, uint32_t ns,
                                      const int32_t *tokens, uint64_t npages);
/* A new node's class (1: protected, seen again). */
void kvt__policy_on_insert(kvt_cache_t *c, kvt_rnode_t *n, bool protected_);
/* The next L1 victim, or NULL. */
kvt_rnode_t *kvt__policy_l1_victim(kvt_cache_t *c);
kvt__vset_t kvt__policy_l1_first(const kvt_cache_t *c); /* the L1 victim set looked in first */
/* Recounts the policy's own bookkeeping from the tree: KVT_ECORRUPT (and
 * *why) on a difference. */
int kvt__policy_check(kvt_cache_t *c, const char **why);
int kvt__policy_init(kvt_cache_t *c);
void kvt__policy_fini(kvt_cache_t *c);

#endif
