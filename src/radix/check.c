/* kvt_radix_check and kvt_radix_stats: both walk the whole tree and recompute
 * everything from the pages up. */
#include <string.h>

#include <xxhash.h>

#include "../core/abi-int.h"
#include "kvtier/error.h"
#include "radix-impl.h"

#define FAIL(msg) return (*why = (msg), KVT_ECORRUPT)

typedef struct walk {
    const kvt_radix_t *r;
    uint64_t nodes, l1_refs, l2_refs; /* pages the reverse maps track */
    uint64_t *held[2];                /* bitmaps (the tree's r->held): the L1 and L2 ids pages hold (each once) */
} walk_t;

/* Marks id held in bitmap b; false when it already was. */
static bool hold(uint64_t *b, uint32_t id) {
    uint64_t bit = 1ull << (id % 64);
    if (b[id / 64] & bit) return false;
    b[id / 64] |= bit;
    return true;
}

/* Checks one node against its pages and children; returns the sum of the
 * lock counts its own holders contribute (lock - sum of children's locks). */
static int check_node(walk_t *w, const kvt_rnode_t *n, const char **why) {
    const kvt_radix_t *r = w->r;
    const kvt_rnode_t *p = n->parent;
    uint32_t n_l1 = 0, shadow = 0, pin = 0, l1_children = 0, nchildren = 0;
    uint64_t child_locks = 0;
    if (n->npages == 0 || n->npages > n->cap) FAIL("node with no pages or over capacity");
    if (n->ns != p->ns && p != &r->root) FAIL("child in another namespace");
    while (n_l1 < n->npages && kvt__page_in_l1(&n->pages[n_l1])) n_l1++;
    if (p != &r->root && p->n_l1 < p->npages) n_l1 = 0; /* L1 pages below a page not in L1 do not count */
    if (n_l1 != n->n_l1) FAIL("n_l1 differs from the pages");
    for (uint32_t i = 0; i < n->npages; i++) {
        const kvt_page_t *pg = &n->pages[i];
        bool in_l1 = kvt__page_in_l1(pg), in_l2 = kvt__page_in_l2(pg);
        if (i < n_l1 && in_l2) shadow++;
        if (i < n_l1 && in_l2 && i >= n->shadow_top) FAIL("a shadow at or past shadow_top");
        if (pg->flags & KVT_PAGE_H2D) {
            pin++;
            if (pg->l1 == KVT_NO_PAGE || !in_l2) FAIL("load in flight without its L1 page or L2 source");
        }
        if ((pg->flags & KVT_PAGE_D2H) && (pg->l2 == KVT_NO_PAGE || i >= n_l1)) FAIL("backup in flight of a page not in L1");
        /* Past the L1 prefix every page has its L2 copy: it lives only in
         * L2, or is being loaded from it, or was loaded but waits for the
         * pages above it to finish loading. */
        if (i >= n_l1 && !in_l2) FAIL("page below the L1 prefix without an L2 copy");
        (void)in_l1;
        if (pg->l1 != KVT_NO_PAGE && (pg->l1 >= r->l1_pages || !hold(w->held[0], pg->l1))) FAIL("L1 page id out of range or held twice");
        if (pg->l2 != KVT_NO_PAGE && (pg->l2 >= r->l2_pages || !hold(w->held[1], pg->l2))) FAIL("L2 page id out of range or held twice");
        if (pg->flags & KVT_PAGE_H2D) { /* tracked: found by its L1 id */
            if (r->l1map[pg->l1].node != n || r->l1map[pg->l1].idx != i) FAIL("L1 reverse map does not give a loading page back");
            w->l1_refs++;
        }
        if ((pg->flags & KVT_PAGE_SUSPECT) && (pg->l2 == KVT_NO_PAGE || (pg->flags & KVT_PAGE_D2H))) FAIL("a suspect page without an L2 copy");
        if (pg->flags & (KVT_PAGE_D2H | KVT_PAGE_SUSPECT)) { /* tracked: found by its L2 id */
            if (r->l2map[pg->l2].node != n || r->l2map[pg->l2].idx != i)
                FAIL("L2 reverse map does not give a page being backed up, or a suspect one, back");
            w->l2_refs++;
        }
        if (pg->flags & ~(uint32_t)(KVT__PAGE_IN_FLIGHT | KVT_PAGE_SUSPECT)) FAIL("unknown page flag");
    }
    if (shadow != n->n_shadow) FAIL("n_shadow differs from the pages");
    if (pin != n->pin) FAIL("pin differs from the loads in flight");
    if (n->nhash > n->npages) FAIL("more hashes than pages");
    for (uint32_t i = 0; i < n->nhash; i++) {
        kvt_hash128_t prev = {0, 0};
        if (i > 0) prev = n->hash[i - 1];
        else if (p != &r->root) {
            if (p->nhash < p->npages) FAIL("a node has hashes but its parent does not");
            prev = p->hash[p->npages - 1];
        }
        kvt_hash128_t h = kvt_page_hash(&prev, n->ns, n->tokens + (size_t)i * r->page_tokens, r->page_tokens);
        if (h.lo != n->hash[i].lo || h.hi != n->hash[i].hi) FAIL("stale page hash");
    }
    if (r->page_keys != (n->key != NULL)) FAIL("page keys kept where the tree keeps none, or missing");
    for (uint32_t i = 0; n->key && i < n->npages; i++) {
        uint64_t prev = i > 0 ? n->key[i - 1] : kvt__radix_key_below(r, p, n->ns);
        if (n->key[i] != kvt__radix_key_next(r, prev, n->tokens + (size_t)i * r->page_tokens)) FAIL("stale page key");
    }
    if (n->digest != XXH3_64bits(n->tokens, r->page_tokens * sizeof(int32_t))) FAIL("stale first-page digest");
    if (kvt__cm_find(r, kvt__cm_hash(p, n->ns, n->digest), p, n->ns, n->tokens) != n)
        FAIL("the child map does not find the node");
    for (const kvt_rnode_t *c = n->first_child; c; c = c->next_sibling) {
        if (c->parent != n) FAIL("child with another parent");
        nchildren++;
        l1_children += c->n_l1 > 0;
        child_locks += c->lock;
        if (c->n_l1 > 0 && n->n_l1 < n->npages) FAIL("L1 pages below a page that is not in L1");
    }
    if (nchildren != n->nchildren || l1_children != n->l1_children) FAIL("child counts differ");
    if (n->lock < child_locks) FAIL("lock count below the children's");
    for (int s = 0; s < KVT_VSET_COUNT; s++) {
        bool want = kvt__vset_member(n, (kvt__vset_t)s), in = n->heap_pos[s] >= 0;
        if (want != in) FAIL("victim-set membership differs from the node's state");
        if (in) {
            const kvt__vheap_t *h = &r->heap[s];
            size_t i = (size_t)n->heap_pos[s];
            if (i >= h->n || h->a[i] != n) FAIL("heap position is wrong");
            if (i > 0 && kvt__vheap_less(n, h->a[(i - 1) / 2], (kvt__vset_t)s)) FAIL("heap order");
            if (n->score[s] != r->score(r->score_ctx, n, (kvt__vset_t)s)) FAIL("stale victim score");
        }
    }
    w->nodes++;
    return KVT_OK;
}

bool kvt__radix_held(const kvt_radix_t *r, int tier, uint32_t id) {
    return id < (tier == 1 ? r->l1_pages : r->l2_pages) && (kvt__radix_held_map(r, tier)[id / 64] >> (id % 64) & 1);
}

int kvt_radix_check(const kvt_radix_t *r, const char **why) {
    const char *dummy;
    if (why == NULL) why = &dummy;
    *why = NULL;
    if (r == NULL) return KVT_EINVAL;
    /* the bitmaps are the tree's (a check allocates nothing: it runs where memory is short too);
     * what they hold is not the tree's state, which the check leaves as it was */
    memset(r->held, 0, kvt__radix_held_words(r) * sizeof(uint64_t));
    walk_t w = {r, 0, 0, 0, {kvt__radix_held_map(r, 1), kvt__radix_held_map(r, 2)}};
    /* iterative pre-order walk */
    const kvt_rnode_t *n = r->root.first_child;
    uint32_t root_children = 0, root_l1 = 0;
    for (const kvt_rnode_t *c = r->root.first_child; c; c = c->next_sibling) {
        root_children++;
        root_l1 += c->n_l1 > 0;
    }
    if (root_children != r->root.nchildren || root_l1 != r->root.l1_children) FAIL("root child counts differ");
    while (n) {
        int rc = check_node(&w, n, why);
        if (rc != KVT_OK) return rc;
        if (n->first_child) {
            n = n->first_child;
            continue;
        }
        while (n != &r->root && n->next_sibling == NULL) n = n->parent;
        n = n == &r->root ? NULL : n->next_sibling;
    }
    if (w.nodes != r->nodes) FAIL("node count differs");
    if (r->cm.n != r->nodes) FAIL("child map size differs from the node count");
    uint64_t l1_refs = 0, l2_refs = 0;
    for (uint64_t i = 0; i < r->l1_pages; i++) l1_refs += r->l1map[i].node != NULL;
    for (uint64_t i = 0; i < r->l2_pages; i++) l2_refs += r->l2map[i].node != NULL;
    if (l1_refs != w.l1_refs || l2_refs != w.l2_refs) FAIL("reverse maps hold pages the tree does not track");
    for (int s = 0; s < KVT_VSET_COUNT; s++)
        for (size_t i = 0; i < r->heap[s].n; i++)
            if (r->heap[s].a[i]->heap_pos[s] != (int32_t)i) FAIL("heap entry with a wrong back-pointer");
    return KVT_OK;
}

int kvt_radix_stats(const kvt_radix_t *r, kvt_radix_stats_t *out) {
    if (r == NULL || out == NULL) return KVT_EINVAL;
    kvt_radix_stats_t full = {.size = sizeof(full)}, *st = &full;
    for (const kvt_rnode_t *n = r->root.first_child; n;) {
        st->nodes++;
        st->pages += n->npages;
        st->l1_pages += n->n_l1;
        st->shadow_pages += n->n_shadow;
        st->locked_nodes += n->lock > 0;
        for (uint32_t i = 0; i < n->npages; i++) {
            const kvt_page_t *pg = &n->pages[i];
            st->l2_pages += kvt__page_in_l2(pg);
            st->host_only_pages += i >= n->n_l1;
            st->inflight_pages += (pg->flags & (KVT_PAGE_D2H | KVT_PAGE_H2D)) != 0;
        }
        if (n->first_child) {
            n = n->first_child;
            continue;
        }
        while (n != &r->root && n->next_sibling == NULL) n = n->parent;
        n = n == &r->root ? NULL : n->next_sibling;
    }
    st->l1_victims = r->heap[KVT_VSET_L1].n + r->heap[KVT_VSET_L1_HI].n;
    st->l2_host_victims = r->heap[KVT_VSET_L2_HOST].n;
    st->l2_shadow_victims = r->heap[KVT_VSET_L2_SHADOW].n;
    st->splits = r->splits;
    st->metadata_bytes = (uint64_t)r->bytes;
    st->pool_free_bytes = r->pool.free_bytes + (uint64_t)(r->pool.end - r->pool.bump);
    return kvt__abi_out(out, st, sizeof(*st));
}
