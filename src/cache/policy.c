/* Eviction order. The tree keeps its victim sets ordered by the score this
 * file gives each node (lower goes first; ties go to the older node); a
 * policy is a score, plus whatever state it keeps to compute it.
 *
 *   lru       last access
 *   lfu       hits, then last access
 *   fifo      creation
 *   priority  the highest priority of the requests that made or matched
 *             the node, then last access
 *   slru      segment (probation before protected), then last access. A node
 *             matched a second time is promoted to the protected segment;
 *             protected nodes hold at most 80 % of the cache's pages, and a
 *             promotion that overflows that demotes the least recently used
 *             protected nodes to probation (the tree's POLICY set orders the
 *             protected nodes by last access for this).
 *   s2lru     second-hit LRU: class (seen once before seen again), then last
 *             access. A page is "seen again" (protected, for good) when it is
 *             matched while cached; when it comes back while a ghost of
 *             recently evicted pages still remembers its page key; or
 *             when it extends a sequence whose cached end had no children (a
 *             conversation's next turn). The ghost holds 4 x the cache's
 *             pages, FIFO. On the Mooncake trace, reuse after a first reuse
 *             is likely (0.85) and reuse of a page seen once much less so
 *             (0.45) at any age up to ~1000 requests, while LRU at 6,000 pages
 *             keeps a page only ~200 requests: putting once-seen pages first
 *             is the win, and the ghost lets a page earn its second sighting
 *             even after an eviction. See docs/policies.md.
 *   arc       the same two classes, sharing the cache by a split learnt as
 *             ARC learns it (Megiddo & Modha, FAST'03): class 0 gets a
 *             target of p pages; L1 evicts from class 0 while it holds more
 *             than p, else from class 1 (each class LRU, in its own victim
 *             set). Two ghosts remember the pages each class lost, in
 *             runs of up to 16 of a node's pages (ghost.c): a page
 *             coming back through class 0's ghost says class 0 was too
 *             small (p grows by max(1, |B1|/|B0|)), through class 1's ghost
 *             that class 1 was (p shrinks by max(1, |B0|/|B1|)); a run
 *             moves p as its pages would one by one. Either way
 *             the page comes back protected; a matched page is protected;
 *             unlike s2lru, a continuation is not. Where seen-once pages are
 *             mostly dead (the Mooncake trace) p stays small and arc acts
 *             like s2lru; where they come back soon (a chat's next turn) p
 *             grows and it acts like LRU.
 */
#include <string.h>

#include "cache-int.h"
#include "kvtier/error.h"
#include "../core/mem-int.h"

#define LOW40 ((1ull << 40) - 1)
#define SLRU_PROTECTED_SHARE 0.8
#define PROTECTED 1ull           /* policy[0] bit: s2lru and arc's class 1 */
#define S2LRU_GHOST_FACTOR 4     /* s2lru ghost entries per cached page */
#define ARC_GHOST_FACTOR 2       /* arc: entries per cached page, each ghost */
#define GHOST_MAX (1u << 22)
#define ARC_RUN_PAGES 16        /* arc: pages a ghost entry at most (a run of a node's pages; s2lru: 1) */

static const char *const NAMES[] = {
#define KVT_POLICY_NAME_(e, name, desc) name,
    KVT_POLICY_LIST(KVT_POLICY_NAME_)
#undef KVT_POLICY_NAME_
};
static const char *const DESCS[] = {
#define KVT_POLICY_DESC_(e, name, desc) desc,
    KVT_POLICY_LIST(KVT_POLICY_DESC_)
#undef KVT_POLICY_DESC_
};
static const char *const WRITE_NAMES[] = {"write_through", "write_through_selective", "write_back"};

const char *kvt_policy_name(kvt_policy_t p) { return (unsigned)p < KVT_POLICY_COUNT_ ? NAMES[p] : "unknown"; }
const char *kvt_policy_describe(kvt_policy_t p) { return (unsigned)p < KVT_POLICY_COUNT_ ? DESCS[p] : "unknown"; }

int kvt_policy_parse(const char *s, kvt_policy_t *p) {
    for (int i = 0; s && p && i < KVT_POLICY_COUNT_; i++)
        if (strcmp(s, NAMES[i]) == 0) return *p = (kvt_policy_t)i, KVT_OK;
    return KVT_EINVAL;
}

const char *kvt_write_policy_name(kvt_write_policy_t w) {
    return (unsigned)w < KVT_WRITE_POLICY_COUNT_ ? WRITE_NAMES[w] : "unknown";
}

int kvt_write_policy_parse(const char *s, kvt_write_policy_t *w) {
    for (int i = 0; s && w && i < KVT_WRITE_POLICY_COUNT_; i++)
        if (strcmp(s, WRITE_NAMES[i]) == 0) return *w = (kvt_write_policy_t)i, KVT_OK;
    return KVT_EINVAL;
}

static uint64_t with_recency(uint64_t major, const kvt_rnode_t *n) { return major << 40 | (n->last_access & LOW40); }

uint64_t kvt__policy_score(void *ctx, const kvt_rnode_t *n, kvt__vset_t set) {
    const kvt_cache_t *c = ctx;
    if (set == KVT_VSET_POLICY) return n->last_access; /* SLRU: protected nodes by recency */
    switch (c->cfg.policy) {
    case KVT_POLICY_LFU: return with_recency(n->hits < 0xffffff ? n->hits : 0xffffff, n);
    case KVT_POLICY_FIFO: return n->created;
    case KVT_POLICY_PRIORITY: {
        int64_t p = n->priority; /* int32 -> 24 bits, order kept up to +-2^23 */
        p = p < -(1 << 23) ? -(1 << 23) : p > (1 << 23) - 1 ? (1 << 23) - 1 : p;
        return with_recency((uint64_t)(p + (1 << 23)), n);
    }
    case KVT_POLICY_SLRU: return with_recency(n->policy.set ? 1 : 0, n);
    case KVT_POLICY_S2LRU: return with_recency(n->policy.word[0] & PROTECTED, n);
    case KVT_POLICY_ARC: /* classes apart in L1 (two sets); L2 as s2lru */
        return set == KVT_VSET_L1 || set == KVT_VSET_L1_HI ? n->last_access : with_recency(n->policy.word[0] & PROTECTED, n);
    case KVT_POLICY_LRU:
    default: return n->last_access;
    }
}

static void slru_demote_overflow(kvt_cache_t *c) {
    uint64_t cap = (uint64_t)(SLRU_PROTECTED_SHARE * (double)(c->cfg.l1_pages + c->cfg.l2_pages));
    kvt_rnode_t *v;
    while (c->pol.slru_pages > cap && (v = kvt__radix_victim(c->tree, KVT_VSET_POLICY)) != NULL) {
        v->policy.set = 0;
        c->pol.slru_pages -= v->npages;
        kvt__radix_rescore(c->tree, v);
    }
}

bool kvt__policy_needs_keys(kvt_policy_t p) { return p == KVT_POLICY_S2LRU || p == KVT_POLICY_ARC; }

static bool two_classes(const kvt_cache_t *c) { return kvt__policy_needs_keys(c->cfg.policy); }

static void protect(kvt_cache_t *c, kvt_rnode_t *n) {
    if (n->policy.word[0] & PROTECTED) return;
    n->policy.word[0] |= PROTECTED;
    n->policy.vclass = c->cfg.policy == KVT_POLICY_ARC;
    c->pol.cls_pages[0] -= n->npages;
    c->pol.cls_pages[1] += n->npages;
    kvt__radix_rescore(c->tree, n);
}

void kvt__policy_on_insert(kvt_cache_t *c, kvt_rnode_t *n, bool protected_) {
    if (!two_classes(c)) return;
    c->pol.cls_pages[0] += n->npages;
    if (protected_) protect(c, n);
}

void kvt__policy_on_hit(kvt_cache_t *c, kvt_rnode_t *n, int32_t priority) {
    if (priority > n->priority) { /* a prefix is worth what its most important user needs */
        n->priority = priority;
        if (c->cfg.policy == KVT_POLICY_PRIORITY) kvt__radix_rescore(c->tree, n);
    }
    if (two_classes(c)) {
        protect(c, n);
        return;
    }
    if (c->cfg.policy != KVT_POLICY_SLRU || n->policy.set || n->hits < 2) return;
    n->policy.set = 1;
    c->pol.slru_pages += n->npages;
    kvt__radix_rescore(c->tree, n);
    slru_demote_overflow(c);
}

/* The L1 victim set looked in first were class 0 to hold cls0 pages (arc: class 0 while it holds
 * more than its target). */
static kvt__vset_t l1_first_with(const kvt_cache_t *c, uint64_t cls0) {
    return c->cfg.policy == KVT_POLICY_ARC && (double)cls0 <= c->pol.arc_p ? KVT_VSET_L1_HI : KVT_VSET_L1;
}

void kvt__policy_on_drop(kvt_cache_t *c, kvt_rnode_t *n, uint32_t k) {
    if (n->policy.set) c->pol.slru_pages -= k;
    if (two_classes(c)) c->pol.cls_pages[(n->policy.word[0] & PROTECTED) != 0] -= k;
}

void kvt__policy_on_trim(kvt_cache_t *c, kvt_rnode_t *n, uint32_t k) {
    kvt__policy_on_drop(c, n, k);
    if (!two_classes(c)) return;
    unsigned cls = (n->policy.word[0] & PROTECTED) != 0;
    kvt__ghost_add_keys(&c->pol.ghost[c->cfg.policy == KVT_POLICY_ARC ? cls : 0], n->key + n->npages - k, k); /* tail first */
}

uint32_t kvt__policy_on_trim_tail(kvt_cache_t *c, kvt_rnode_t *n, uint32_t m, kvt__vset_t first) {
    /* what kvt__policy_l1_first would say after each page: it reads class 0's page count (kept
     * here as the pages go) and arc's target (which they do not move) */
    uint64_t drop0 = two_classes(c) && !(n->policy.word[0] & PROTECTED), k = 1, c0 = c->pol.cls_pages[0] - drop0;
    if (drop0 == 0) /* (lru and the others; a protected node) nothing the answer reads moves: it holds for all m or none */
        k = m > 1 && l1_first_with(c, c0) == first ? m : 1;
    else
        for (; k < m && l1_first_with(c, c0) == first; k++) c0 -= drop0;
    kvt__policy_on_trim(c, n, (uint32_t)k);
    return (uint32_t)k;
}

/* arc: a run of `pages` pages came back through ghost `from` (which holds
 * what is left after it): the target p moves as it would for each of them
 * taken alone, toward the class that lost it, by max(1, |other ghost| /
 * (|from| + 1)) a page, held within [0, cap]. */
static double arc_adapted(const kvt_cache_t *c, double p, unsigned from, uint32_t pages, double cap) {
    double left = (double)kvt__ghost_live(&c->pol.ghost[from]), other = (double)kvt__ghost_live(&c->pol.ghost[!from]);
    for (uint32_t j = 0; j < pages; j++) { /* after the run's page j + 1 is taken, from holds left + pages - 1 - j */
        double s = other / (left + (double)(pages - 1 - j) + 1);
        if (s < 1) s = 1;
        if (from == 0) p = p + s > cap ? cap : p + s;
        else p = p - s < 0 ? 0 : p - s;
    }
    return p;
}

/* The walk's page keys, computed as it needs them, in page order, in a ring
 * of the last KVT__GHOST_RUN_MAX (enough for a run's first and last). (The
 * insert computes them again: keeping them for it measured no faster,
 * docs/performance.md, *Tricks measured side by side*.) */
typedef struct {
    const kvt_radix_t *tree;
    const int32_t *tokens;
    uint64_t pt, n, last; /* page tokens; keys computed (of pages 0 .. n - 1); page n - 1's key (before the first: the key below it) */
    uint64_t ring[KVT__GHOST_RUN_MAX];
} walk_t;

static uint64_t walk_key(walk_t *w, uint64_t j) {
    for (; w->n <= j; w->n++)
        w->ring[w->n % KVT__GHOST_RUN_MAX] = w->last = kvt__radix_key_next(w->tree, w->last, w->tokens + w->n * w->pt);
    return w->ring[j % KVT__GHOST_RUN_MAX];
}

/* The run of ghost g that the new pages k .. npages - 1 begin with, taken
 * out when they hold all of it and their key at its end passes its check:
 * its length, or 0. */
static uint32_t take_run(kvt__ghost_t *g, kvt__ghost_probe_t *p, walk_t *w, uint64_t k, uint64_t npages) {
    uint32_t n = kvt__ghost_run(g, p);
    return n > 0 && n <= npages - k && kvt__ghost_take_run(g, p, walk_key(w, k + n - 1)) ? n : 0;
}

uint64_t kvt__policy_protected_prefix(kvt_cache_t *c, kvt_rnode_t *at, uint32_t children, uint32_t ns,
                                      const int32_t *tokens, uint64_t npages) {
    if (!two_classes(c)) return 0;
    kvt_rnode_t *root = kvt__radix_root(c->tree);
    /* s2lru: the next turn of a cached sequence starts protected. (arc learns
     * better without this: on chat traces, last turns never come back.) */
    if (c->cfg.policy == KVT_POLICY_S2LRU && at != root && children == 0) return npages;
    bool arc = c->cfg.policy == KVT_POLICY_ARC;
    /* Evicted pages left tail first: the remembered ones lead, run after run
     * (a document coming back): each is looked up in ghost 0, then (arc) in
     * ghost 1, and taken out when the new pages hold all of it. */
    kvt__ghost_settle(&c->pol.ghost[0]); /* the probes need the ghosts' queued adds made */
    if (arc) kvt__ghost_settle(&c->pol.ghost[1]);
    walk_t w = {.tree = c->tree, .tokens = tokens, .pt = c->cfg.page_tokens, .last = kvt__radix_key_below(c->tree, at, ns)};
    uint64_t k = 0;
    double p = c->pol.arc_p, cap = (double)(c->cfg.l1_pages + c->cfg.l2_pages);
    while (k < npages) {
        kvt__ghost_probe_t probe;
        uint64_t key = walk_key(&w, k);
        kvt__ghost_probe(&c->pol.ghost[0], key, &probe);
        uint32_t n = take_run(&c->pol.ghost[0], &probe, &w, k, npages), from = 0;
        if (n == 0 && arc) {
            kvt__ghost_probe(&c->pol.ghost[1], key, &probe);
            n = take_run(&c->pol.ghost[1], &probe, &w, k, npages);
            from = 1;
        }
        if (n == 0) break;
        if (arc) p = arc_adapted(c, p, from, n, cap);
        k += n;
    }
    if (arc) c->pol.arc_p = p;
    return k;
}

kvt__vset_t kvt__policy_l1_first(const kvt_cache_t *c) { return l1_first_with(c, c->pol.cls_pages[0]); }

kvt_rnode_t *kvt__policy_l1_victim(kvt_cache_t *c) {
    kvt__vset_t first = kvt__policy_l1_first(c), second = first == KVT_VSET_L1 ? KVT_VSET_L1_HI : KVT_VSET_L1;
    kvt_rnode_t *v = kvt__radix_victim(c->tree, first);
    return v ? v : kvt__radix_victim(c->tree, second);
}

int kvt__policy_check(kvt_cache_t *c, const char **why) {
    uint64_t prot = 0, cls[2] = {0, 0};
    for (kvt_rnode_t *x = kvt__radix_first(c->tree); x; x = kvt__radix_next(c->tree, x)) {
        if (x->policy.set) prot += x->npages;
        cls[(x->policy.word[0] & PROTECTED) != 0] += x->npages;
        if (x->policy.vclass != (c->cfg.policy == KVT_POLICY_ARC && (x->policy.word[0] & PROTECTED)))
            return *why = "a node in the wrong L1 victim class", KVT_ECORRUPT;
    }
    if (prot != c->pol.slru_pages) return *why = "SLRU protected page count differs", KVT_ECORRUPT;
    if (two_classes(c) && (cls[0] != c->pol.cls_pages[0] || cls[1] != c->pol.cls_pages[1]))
        return *why = "class page counts differ", KVT_ECORRUPT;
    return KVT_OK;
}

int kvt__policy_init(kvt_cache_t *c) {
    uint64_t pages = c->cfg.l1_pages + c->cfg.l2_pages, cap[2] = {0, 0};
    if (c->cfg.policy == KVT_POLICY_S2LRU) cap[0] = S2LRU_GHOST_FACTOR * pages;
    if (c->cfg.policy == KVT_POLICY_ARC) cap[0] = cap[1] = ARC_GHOST_FACTOR * pages;
    unsigned run = c->cfg.policy == KVT_POLICY_ARC ? ARC_RUN_PAGES : 1;
    for (int i = 0; i < 2; i++) {
        if (cap[i] > GHOST_MAX) cap[i] = GHOST_MAX;
        int rc = kvt__ghost_init(&c->pol.ghost[i], (size_t)cap[i], run);
        if (rc != KVT_OK) return rc;
    }
    return KVT_OK;
}

void kvt__policy_fini(kvt_cache_t *c) {
    kvt__ghost_fini(&c->pol.ghost[0]);
    kvt__ghost_fini(&c->pol.ghost[1]);
}
