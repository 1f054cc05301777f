/* Eviction order. The tree keeps its victim sets ordered by the score this
 * file gives each node (lower goes first; ties go to the older node); a
 * policy is a score, plus whatever state it keeps to compute it.
 *
 *   lru       last access
 *   lfu       hits, then last access
 *   fifo      creation
 *   priority  request priority, then last access
 *   slru      segment (probation before protected), then last access. A node
 *             matched a second time is promoted to the protected segment;
 *             protected nodes hold at most 80 % of L1's pages, and a
 *             promotion that overflows that demotes the least recently used
 *             protected nodes to probation (the tree's POLICY set orders the
 *             protected nodes by last access for this).
 */
#include <string.h>

#include "cache-int.h"
#include "kvtier/error.h"

#define LOW40 ((1ull << 40) - 1)
#define SLRU_PROTECTED_SHARE 0.8

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
    for (int i = 0; s && i < KVT_POLICY_COUNT_; i++)
        if (strcmp(s, NAMES[i]) == 0) return *p = (kvt_policy_t)i, KVT_OK;
    return KVT_EINVAL;
}

const char *kvt_write_policy_name(kvt_write_policy_t w) {
    return (unsigned)w < KVT_WRITE_POLICY_COUNT_ ? WRITE_NAMES[w] : "unknown";
}

int kvt_write_policy_parse(const char *s, kvt_write_policy_t *w) {
    for (int i = 0; s && i < KVT_WRITE_POLICY_COUNT_; i++)
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
    case KVT_POLICY_SLRU: return with_recency(n->policy_set ? 1 : 0, n);
    case KVT_POLICY_LRU:
    default: return n->last_access;
    }
}

static void slru_demote_overflow(kvt_cache_t *c) {
    uint64_t cap = (uint64_t)(SLRU_PROTECTED_SHARE * (double)c->cfg.l1_pages);
    kvt_rnode_t *v;
    while (c->slru_pages > cap && (v = kvt__radix_victim(c->tree, KVT_VSET_POLICY)) != NULL) {
        v->policy_set = 0;
        c->slru_pages -= v->npages;
        kvt__radix_rescore(c->tree, v);
    }
}

void kvt__policy_on_hit(kvt_cache_t *c, kvt_rnode_t *n) {
    if (c->cfg.policy != KVT_POLICY_SLRU || n->policy_set || n->hits < 2) return;
    n->policy_set = 1;
    c->slru_pages += n->npages;
    kvt__radix_rescore(c->tree, n);
    slru_demote_overflow(c);
}

void kvt__policy_on_trim(kvt_cache_t *c, kvt_rnode_t *n) {
    if (n->policy_set) c->slru_pages--;
}
