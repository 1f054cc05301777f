/* Victim sets: for each kind of eviction, the nodes that may give a page
 * now, in a binary min-heap by (score, seq). The cache's policy supplies the
 * score; the tree decides membership from the node's state:
 *
 *   L1         the node's tail L1 page is an L1 frontier: no child holds L1
 *              pages, the page has no backup in flight, nothing is locked or
 *              pinned; L1 holds the nodes of vclass 0, L1_HI those of vclass
 *              1 (a policy may keep two classes apart)
 *   L2_HOST    a leaf whose tail page lives only in L2
 *   L2_SHADOW  the node holds L2 copies of pages that are still in L1
 *   POLICY     nodes the cache's policy marked, ordered by its score (SLRU's
 *              protected segment), whatever their state
 *
 * Each node remembers its position in each heap, so joining, leaving and
 * moving are O(log n) and the next victim is O(1). Heaps are sized to the
 * node count when nodes are created, so these updates never allocate.
 */
#include "kvtier/error.h"
#include "radix-impl.h"

static bool eligible(const kvt_rnode_t *n, kvt__vset_t set) {
    if (n->npages == 0 || n->lock || n->pin) return false;
    switch (set) {
    case KVT_VSET_L1:
    case KVT_VSET_L1_HI:
        return n->n_l1 > 0 && n->l1_children == 0 && !(n->pages[n->n_l1 - 1].flags & KVT_PAGE_D2H) &&
               (n->policy.vclass != 0) == (set == KVT_VSET_L1_HI);
    case KVT_VSET_L2_HOST: return n->nchildren == 0 && n->npages > n->n_l1;
    case KVT_VSET_L2_SHADOW: return n->n_shadow > 0;
    default: return false;
    }
}

bool kvt__vset_member(const kvt_rnode_t *n, kvt__vset_t set) {
    if (set == KVT_VSET_POLICY) return n->npages > 0 && n->policy.set;
    return eligible(n, set);
}

bool kvt__vheap_less(const kvt_rnode_t *a, const kvt_rnode_t *b, kvt__vset_t set) {
    return a->score[set] < b->score[set] || (a->score[set] == b->score[set] && a->seq < b->seq);
}

int kvt__vheap_reserve(kvt_radix_t *r, size_t n) {
    for (int s = 0; s < KVT_VSET_COUNT; s++) {
        kvt__vheap_t *h = &r->heap[s];
        if (h->cap >= n) continue;
        size_t cap = h->cap ? h->cap : 64;
        while (cap < n) cap *= 2;
        kvt_rnode_t **a = kvt__radix_alloc(r, cap * sizeof(*a));
        if (a == NULL) return KVT_ENOMEM;
        for (size_t i = 0; i < h->n; i++) a[i] = h->a[i];
        kvt__radix_free(r, h->a, h->cap * sizeof(*a));
        h->a = a;
        h->cap = cap;
    }
    return KVT_OK;
}

static void put(kvt__vheap_t *h, size_t i, kvt_rnode_t *n, kvt__vset_t s) {
    h->a[i] = n;
    n->heap_pos[s] = (int32_t)i;
}

static void sift_up(kvt__vheap_t *h, size_t i, kvt__vset_t s) {
    kvt_rnode_t *n = h->a[i];
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!kvt__vheap_less(n, h->a[p], s)) break;
        put(h, i, h->a[p], s);
        i = p;
    }
    put(h, i, n, s);
}

static void sift_down(kvt__vheap_t *h, size_t i, kvt__vset_t s) {
    kvt_rnode_t *n = h->a[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && kvt__vheap_less(h->a[c + 1], h->a[c], s)) c++;
        if (!kvt__vheap_less(h->a[c], n, s)) break;
        put(h, i, h->a[c], s);
        i = c;
    }
    put(h, i, n, s);
}

static void heap_remove(kvt__vheap_t *h, kvt_rnode_t *n, kvt__vset_t s) {
    size_t i = (size_t)n->heap_pos[s];
    n->heap_pos[s] = -1;
    kvt_rnode_t *last = h->a[--h->n];
    if (i == h->n) return;
    put(h, i, last, s);
    sift_up(h, i, s);
    sift_down(h, (size_t)last->heap_pos[s], s);
}

void kvt__vheap_refresh(kvt_radix_t *r, kvt_rnode_t *n) {
    if (n == &r->root) return;
    for (int si = 0; si < KVT_VSET_COUNT; si++) {
        kvt__vset_t s = (kvt__vset_t)si;
        kvt__vheap_t *h = &r->heap[s];
        bool in = n->heap_pos[s] >= 0;
        if (!kvt__vset_member(n, s)) {
            if (in) heap_remove(h, n, s);
            continue;
        }
        uint64_t score = r->score(r->score_ctx, n, s);
        if (!in) {
            n->score[s] = score;
            h->n++;
            put(h, h->n - 1, n, s);
            sift_up(h, h->n - 1, s);
        } else if (score != n->score[s]) {
            n->score[s] = score;
            sift_up(h, (size_t)n->heap_pos[s], s);
            sift_down(h, (size_t)n->heap_pos[s], s);
        }
    }
}

/* (Made at once: deferring it to the next change of another node, so that
 * a run of page changes on one node cost one update, measured no faster:
 * docs/performance.md, *Tricks measured side by side*.) */
void kvt__vheap_membership(kvt_radix_t *r, kvt_rnode_t *n) {
    if (n == &r->root) return;
    for (int si = 0; si < KVT_VSET_COUNT; si++) {
        kvt__vset_t s = (kvt__vset_t)si;
        bool in = n->heap_pos[s] >= 0, member = kvt__vset_member(n, s);
        if (in == member) continue;
        kvt__vheap_t *h = &r->heap[s];
        if (in) {
            heap_remove(h, n, s);
            continue;
        }
        n->score[s] = r->score(r->score_ctx, n, s);
        h->n++;
        put(h, h->n - 1, n, s);
        sift_up(h, h->n - 1, s);
    }
}

void kvt__vheap_remove_all(kvt_radix_t *r, kvt_rnode_t *n) {
    for (int s = 0; s < KVT_VSET_COUNT; s++)
        if (n->heap_pos[s] >= 0) heap_remove(&r->heap[s], n, (kvt__vset_t)s);
}

void kvt__vheap_fini(kvt_radix_t *r) {
    for (int s = 0; s < KVT_VSET_COUNT; s++) {
        kvt__radix_free(r, r->heap[s].a, r->heap[s].cap * sizeof(kvt_rnode_t *));
        r->heap[s] = (kvt__vheap_t){0};
    }
}

kvt_rnode_t *kvt__radix_victim(const kvt_radix_t *r, kvt__vset_t set) {
    return r->heap[set].n ? r->heap[set].a[0] : NULL;
}
