/* The page-granular radix prefix tree.
 *
 * A node holds an edge of whole pages: npages * page_tokens token ids, and for
 * each page its state (L1 page, L2 page, in-flight flags). Children hang off
 * a node by their first page; a child map (childmap.c) finds a child from
 * (parent, namespace, first page) in O(1) expected. The root holds no pages.
 *
 * Splitting. A match that ends inside a node splits it at that page boundary,
 * so that every node's pages share one history (hits, last access, locks):
 *
 *   before:  (root) --[A B C D E]--> ...         match of A B C
 *   after:   (root) --[A B C]--> (H) --[D E]--> ...
 *
 * The head H is a new node that takes the first pages, their states and
 * hashes, and the node's place under its parent; the old node keeps the tail,
 * its children and its identity. Per-page state moves with its page, so a
 * page's state does not depend on how often its node was split.
 *
 * Residency. Along every path, the pages resident in L1 come first and the
 * pages that live only in L2 ("host-only") after them; pages in neither are
 * not in the tree. Within a node: pages [0, n_l1) are in L1 (each may also
 * have an L2 copy: a "shadow"), pages [n_l1, npages) only in L2. A page moving
 * L1 -> L2 at the L1 frontier:
 *
 *   [A B C | D]  n_l1 = 3     drop L1 of C (it has an L2 copy)
 *   [A B | C D]  n_l1 = 2     C is now host-only; a later match loads it back
 *
 * Invariants (kvt_radix_check): n_l1, n_shadow, pin, nchildren and
 * l1_children equal what the pages and children say; residency is as above;
 * a child holds L1 pages only if its parent's pages are all in L1; lock counts
 * are at least the sum of the children's; the child map holds exactly the
 * tree's edges; the reverse maps give back the (node, index) of every page
 * they track (track(): a copy in flight, a suspect copy) and hold no other;
 * no page id is held twice; every eligible node is in its victim heap, at a
 * valid heap position.
 *
 * Cost: a match is O(pages matched) token comparisons plus one child-map
 * lookup per node; insert O(pages inserted); a split O(pages of the split
 * node); lock/unlock O(depth in nodes); every page-state change O(log n) for
 * the victim heaps.
 */
#include <stdlib.h>
#include <string.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "kvtier/error.h"
#include "radix-impl.h"
#include "../core/check-int.h"
#include "../core/mem-int.h"
#include "../core/mix-int.h"

void *kvt__radix_alloc(kvt_radix_t *r, size_t size) {
    void *p = kvt__malloc(size);
    if (p) r->bytes += (int64_t)size;
    return p;
}

void kvt__radix_free(kvt_radix_t *r, void *p, size_t size) {
    if (p == NULL) return;
    r->bytes -= (int64_t)size;
    kvt__free(p, size);
}

kvt_hash128_t kvt_page_hash(const kvt_hash128_t *prev, uint32_t ns, const int32_t *tokens, uint32_t page_tokens) {
    _Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "hash input is hashed as little-endian memory");
    kvt_hash128_t zero = {0, 0}, p = prev ? *prev : zero;
    size_t tb = (size_t)page_tokens * sizeof(int32_t);
    XXH128_hash_t h;
    /* The same bytes either way (XXH3's streaming and one-shot forms agree): pages of up to 256
     * tokens are laid out once and hashed in one call, not through the streaming state (576
     * bytes to reset and two updates for a 64-byte page). */
    uint8_t buf[20 + 256 * sizeof(int32_t)];
    if (page_tokens <= 256) {
        memcpy(buf, &p.lo, 8);
        memcpy(buf + 8, &p.hi, 8);
        memcpy(buf + 16, &ns, 4);
        memcpy(buf + 20, tokens, tb);
        h = XXH3_128bits(buf, 20 + tb);
    } else {
        XXH3_state_t st;
        memcpy(buf, &p.lo, 8);
        memcpy(buf + 8, &p.hi, 8);
        memcpy(buf + 16, &ns, 4);
        XXH3_128bits_reset(&st);
        XXH3_128bits_update(&st, buf, 20);
        XXH3_128bits_update(&st, tokens, tb);
        h = XXH3_128bits_digest(&st);
    }
    return (kvt_hash128_t){h.low64, h.high64};
}

/* A step of the page-key chain (radix-int.h): the key before, times G (odd), plus the page's digest. */
static inline uint64_t key_step(uint64_t prev, uint64_t digest) { return prev * 0x9e3779b97f4a7c15ull + digest; }

static uint64_t page_digest(const kvt_radix_t *r, const int32_t *page) {
    return XXH3_64bits(page, r->page_tokens * sizeof(int32_t));
}

/* ---- nodes ---------------------------------------------------------------- */

/* A node's arrays, sized for cap pages, back to the pool (any may be NULL). */
static void arrays_free(kvt_radix_t *r, int32_t *tokens, kvt_page_t *pages, uint64_t *key, kvt_hash128_t *hash,
                        uint32_t cap) {
    kvt__pool_free(r, tokens, (size_t)cap * r->page_tokens * sizeof(int32_t));
    kvt__pool_free(r, pages, (size_t)cap * sizeof(kvt_page_t));
    kvt__pool_free(r, key, (size_t)cap * sizeof(uint64_t));
    kvt__pool_free(r, hash, (size_t)cap * sizeof(kvt_hash128_t));
}

/* A node with room for cap pages, or NULL. Reserves its place in the heaps. */
static kvt_rnode_t *node_new(kvt_radix_t *r, uint32_t cap) {
    if (kvt__vheap_reserve(r, r->nodes + 1) != KVT_OK) return NULL;
    kvt_rnode_t *n = kvt__radix_alloc(r, sizeof(*n));
    if (n == NULL) return NULL;
    memset(n, 0, sizeof(*n));
    n->tokens = kvt__pool_alloc(r, (size_t)cap * r->page_tokens * sizeof(int32_t));
    n->pages = kvt__pool_alloc(r, (size_t)cap * sizeof(kvt_page_t));
    if (r->page_keys) n->key = kvt__pool_alloc(r, (size_t)cap * sizeof(uint64_t));
    if (n->tokens == NULL || n->pages == NULL || (r->page_keys && n->key == NULL)) {
        arrays_free(r, n->tokens, n->pages, n->key, NULL, cap);
        kvt__radix_free(r, n, sizeof(*n));
        return NULL;
    }
    n->cap = cap;
    for (int s = 0; s < KVT_VSET_COUNT; s++) n->heap_pos[s] = -1;
    return n;
}

static void node_free(kvt_radix_t *r, kvt_rnode_t *n) {
    arrays_free(r, n->tokens, n->pages, n->key, n->hash, n->cap);
    kvt__radix_free(r, n, sizeof(*n));
}

/* Moves n's pages [from, from + count) (and its hashes among them) to fresh
 * blocks of cap >= count pages (move_arrays: of count), giving the old ones
 * back; false, with nothing changed, when there is no memory for them. The
 * caller sets npages and nhash. */
static bool move_arrays_to(kvt_radix_t *r, kvt_rnode_t *n, uint32_t from, uint32_t count, uint32_t cap) {
    size_t tb = (size_t)r->page_tokens * sizeof(int32_t);
    int32_t *t = kvt__pool_alloc(r, cap * tb);
    kvt_page_t *p = kvt__pool_alloc(r, (size_t)cap * sizeof(kvt_page_t));
    uint64_t *k = n->key ? kvt__pool_alloc(r, (size_t)cap * sizeof(uint64_t)) : NULL;
    kvt_hash128_t *h = n->hash ? kvt__pool_alloc(r, (size_t)cap * sizeof(kvt_hash128_t)) : NULL;
    if (t == NULL || p == NULL || (n->key && k == NULL) || (n->hash && h == NULL)) {
        arrays_free(r, t, p, k, h, cap);
        return false;
    }
    uint32_t nh = n->nhash > from ? n->nhash - from : 0;
    memcpy(t, n->tokens + (size_t)from * r->page_tokens, count * tb);
    memcpy(p, n->pages + from, (size_t)count * sizeof(kvt_page_t));
    if (k) memcpy(k, n->key + from, (size_t)count * sizeof(uint64_t));
    if (h) memcpy(h, n->hash + from, (size_t)(nh < count ? nh : count) * sizeof(kvt_hash128_t));
    arrays_free(r, n->tokens, n->pages, n->key, n->hash, n->cap);
    n->tokens = t;
    n->pages = p;
    n->key = k;
    n->hash = h;
    n->cap = cap;
    return true;
}
static bool move_arrays(kvt_radix_t *r, kvt_rnode_t *n, uint32_t from, uint32_t count) {
    return move_arrays_to(r, n, from, count, count);
}

/* A node whose arrays are at most half used (its tail trimmed away) moves
 * them to blocks of its size, so that the pool can give the rest to other
 * nodes: each page is copied at most about once per halving, O(1) a trimmed
 * page amortised. Without memory for the smaller blocks the node keeps what
 * it has (nothing changes). */
static void shrink(kvt_radix_t *r, kvt_rnode_t *n) {
    if (n->npages > 0 && n->npages <= n->cap / 2) (void)move_arrays(r, n, 0, n->npages);
}

static void link_child(kvt_rnode_t *parent, kvt_rnode_t *c) {
    c->parent = parent;
    c->prev_sibling = NULL;
    c->next_sibling = parent->first_child;
    if (parent->first_child) parent->first_child->prev_sibling = c;
    parent->first_child = c;
    parent->nchildren++;
}

static void unlink_child(kvt_rnode_t *c) {
    kvt_rnode_t *p = c->parent;
    if (c->prev_sibling) c->prev_sibling->next_sibling = c->next_sibling;
    else p->first_child = c->next_sibling;
    if (c->next_sibling) c->next_sibling->prev_sibling = c->prev_sibling;
    c->prev_sibling = c->next_sibling = NULL;
    p->nchildren--;
}

/* The reverse maps hold the pages that must be found by id: an L1 id while
 * its page loads (H2D), an L2 id while its page backs up (D2H) or while its
 * copy is suspect (a load found it corrupt); every other entry is empty.
 * (Page ids are found by id only for those: a copy's completion, a suspect
 * copy's purge. Keeping every page in them would cost a random store per
 * page on every insert, drop, trim, backup and load.) */
static void track(kvt_radix_t *r, kvt_rnode_t *n, uint32_t idx) {
    const kvt_page_t *p = &n->pages[idx];
    if (p->flags & KVT_PAGE_H2D) r->l1map[p->l1] = (kvt__pageref_t){n, idx};
    if (p->flags & (KVT_PAGE_D2H | KVT_PAGE_SUSPECT)) r->l2map[p->l2] = (kvt__pageref_t){n, idx};
}

/* ---- create / destroy ---------------------------------------------------- */

int kvt__radix_create(kvt_radix_t **out, const kvt__radix_config_t *cfg) {
    if (out == NULL || cfg == NULL || cfg->page_tokens == 0 || cfg->score == NULL || cfg->l1_pages == 0 ||
        cfg->l1_pages > UINT32_MAX || cfg->l2_pages > UINT32_MAX)
        return KVT_EINVAL;
    kvt_radix_t *r = KVT_NEW(kvt_radix_t);
    if (r == NULL) return KVT_ENOMEM;
    r->bytes = sizeof(*r);
    r->page_tokens = cfg->page_tokens;
    r->page_keys = cfg->page_keys;
    r->l1_pages = cfg->l1_pages;
    r->l2_pages = cfg->l2_pages;
    r->score = cfg->score;
    r->score_ctx = cfg->score_ctx;
    r->next_seq = 1; /* the root is seq 0 */
    for (int s = 0; s < KVT_VSET_COUNT; s++) r->root.heap_pos[s] = -1;
    r->l1map = kvt__radix_alloc(r, r->l1_pages * sizeof(kvt__pageref_t));
    r->l2map = kvt__radix_alloc(r, (r->l2_pages ? r->l2_pages : 1) * sizeof(kvt__pageref_t));
    r->held = kvt__radix_alloc(r, kvt__radix_held_words(r) * sizeof(uint64_t));
    if (r->l1map == NULL || r->l2map == NULL || r->held == NULL || kvt__cm_reserve(r, 1) != KVT_OK) {
        kvt__radix_destroy(r);
        return KVT_ENOMEM;
    }
    memset(r->l1map, 0, r->l1_pages * sizeof(kvt__pageref_t));
    memset(r->l2map, 0, (r->l2_pages ? r->l2_pages : 1) * sizeof(kvt__pageref_t));
    *out = r;
    return KVT_OK;
}

void kvt__radix_destroy(kvt_radix_t *r) {
    if (r == NULL) return;
    /* free every node, iteratively, children first */
    kvt_rnode_t *n = r->root.first_child;
    while (n) {
        if (n->first_child) {
            n = n->first_child;
            continue;
        }
        kvt_rnode_t *p = n->parent;
        unlink_child(n);
        node_free(r, n);
        n = p == &r->root ? r->root.first_child : p;
    }
    kvt__cm_fini(r);
    kvt__vheap_fini(r);
    kvt__pool_fini(r);
    kvt__radix_free(r, r->l1map, r->l1_pages * sizeof(kvt__pageref_t));
    kvt__radix_free(r, r->l2map, (r->l2_pages ? r->l2_pages : 1) * sizeof(kvt__pageref_t));
    kvt__radix_free(r, r->held, kvt__radix_held_words(r) * sizeof(uint64_t));
    KVT_DELETE(r);
}

kvt_rnode_t *kvt__radix_root(kvt_radix_t *r) { return &r->root; }

/* ---- split ----------------------------------------------------------------- */

/* Splits c after its first k pages (0 < k < npages); *head is the new node.
 *
 * The head is copied into new blocks of its size and the tail stays in c's
 * arrays (moved down, or to blocks of its size where that halves them).
 * (Copying only the shorter part, a head longer than the tail keeping c's
 * arrays, made no measurable difference to the replay: docs/performance.md,
 * *Tricks measured side by side*.) */
static int split(kvt_radix_t *r, kvt_rnode_t *c, uint32_t k, kvt_rnode_t **head) {
    uint32_t pt = r->page_tokens, tail = c->npages - k;
    uint32_t hk = c->nhash < k ? c->nhash : k, tk = c->nhash > k ? c->nhash - k : 0; /* hashes of each part */
    if (kvt__cm_reserve(r, 1) != KVT_OK) return KVT_ENOMEM;
    kvt_rnode_t *h = node_new(r, k);
    if (h == NULL) return KVT_ENOMEM;
    if (hk > 0) {
        h->hash = kvt__pool_alloc(r, (size_t)h->cap * sizeof(kvt_hash128_t));
        if (h->hash == NULL) {
            node_free(r, h);
            return KVT_ENOMEM;
        }
        memcpy(h->hash, c->hash, hk * sizeof(kvt_hash128_t));
    }
    memcpy(h->tokens, c->tokens, (size_t)k * pt * sizeof(int32_t));
    memcpy(h->pages, c->pages, k * sizeof(kvt_page_t));
    if (c->key) memcpy(h->key, c->key, k * sizeof(uint64_t));
    if (tail > c->cap / 2 || !move_arrays(r, c, k, tail)) {
        memmove(c->tokens, c->tokens + (size_t)k * pt, (size_t)tail * pt * sizeof(int32_t));
        memmove(c->pages, c->pages + k, tail * sizeof(kvt_page_t));
        if (c->key) memmove(c->key, c->key + k, tail * sizeof(uint64_t));
        if (tk > 0) memmove(c->hash, c->hash + k, tk * sizeof(kvt_hash128_t));
    }
    h->npages = k;
    h->nhash = hk;
    h->n_l1 = c->n_l1 < k ? c->n_l1 : k;
    h->shadow_top = c->shadow_top < k ? c->shadow_top : k;
    for (uint32_t i = 0; i < k; i++) {
        if (i < h->n_l1 && kvt__page_in_l2(&h->pages[i])) h->n_shadow++;
        if (h->pages[i].flags & KVT_PAGE_H2D) h->pin++;
    }
    h->ns = c->ns;
    h->lock = c->lock;
    h->priority = c->priority;
    h->hits = c->hits;
    h->last_access = c->last_access;
    h->created = c->created;
    h->policy = c->policy;
    h->digest = c->digest;
    h->seq = r->next_seq++;
    c->nhash = tk;
    c->npages = tail;
    c->n_l1 = c->n_l1 > k ? c->n_l1 - k : 0;
    c->shadow_top = c->shadow_top > k ? c->shadow_top - k : 0;
    c->n_shadow -= h->n_shadow;
    c->pin -= h->pin;
    uint64_t old_h = kvt__cm_hash(c->parent, c->ns, c->digest);
    c->digest = page_digest(r, c->tokens);
    /* relink: parent -> h -> c */
    kvt_rnode_t *p = c->parent;
    unlink_child(c);
    link_child(p, h);
    link_child(h, c);
    h->l1_children = c->n_l1 > 0;
    kvt__cm_replace(r, old_h, c, h);
    kvt__cm_insert(r, kvt__cm_hash(h, c->ns, c->digest), c);
    for (uint32_t i = 0; i < h->npages; i++)
        if (h->pages[i].flags) track(r, h, i);
    for (uint32_t i = 0; i < c->npages; i++)
        if (c->pages[i].flags) track(r, c, i);
    r->nodes++;
    r->splits++;
    kvt__vheap_refresh(r, h);
    kvt__vheap_refresh(r, c);
    *head = h;
    return KVT_OK;
}

/* ---- match ----------------------------------------------------------------- */

/* How many leading pages of a and b (n pages each) are equal. Long equal runs
 * are the common case (a prefix hit), so they are compared SAME_RUN pages at a
 * time, one memcmp each; the page that differs is then found page by page. */
#define SAME_RUN 16
static uint64_t same_pages(const int32_t *a, const int32_t *b, uint64_t n, uint32_t pt) {
    size_t pbytes = pt * sizeof(int32_t);
    uint64_t k = 0;
    while (k + SAME_RUN <= n && memcmp(a + k * pt, b + k * pt, SAME_RUN * pbytes) == 0) k += SAME_RUN;
    while (k < n && memcmp(a + k * pt, b + k * pt, pbytes) == 0) k++;
    return k;
}

int kvt__radix_match(kvt_radix_t *r, uint32_t ns, const int32_t *tokens, uint64_t npages, uint64_t clock,
                     kvt__match_t *m) {
    uint32_t pt = r->page_tokens;
    kvt_rnode_t *n = &r->root;
    uint64_t done = 0;
    while (done < npages) {
        const int32_t *page = tokens + done * pt;
        kvt_rnode_t *c = kvt__cm_find(r, kvt__cm_hash(n, ns, page_digest(r, page)), n, ns, page);
        if (c == NULL) break;
        uint64_t lim = npages - done < c->npages ? npages - done : c->npages;
        uint32_t k = 1 + (uint32_t)same_pages(c->tokens + pt, page + pt, lim - 1, pt); /* the child map compared the first */
        if (k < c->npages) {
            int rc = split(r, c, k, &c);
            if (rc != KVT_OK) return rc;
        }
        n = c;
        done += k;
    }
    m->node = n;
    m->pages = done;
    m->l1_pages = 0;
    for (kvt_rnode_t *x = n; x != &r->root; x = x->parent) {
        m->l1_pages += x->n_l1; /* residency is prefix-closed: the sum is the L1 prefix */
        if (clock) {
            x->hits++;
            x->last_access = clock;
            kvt__vheap_refresh(r, x);
        }
    }
    return KVT_OK;
}

/* ---- insert ---------------------------------------------------------------- */

/* A new node of npages pages below `at`, resident in L1 at l1_ids or, when
 * l1_ids is NULL, only in L2 at l2_ids. */
static int insert_node(kvt_radix_t *r, kvt_rnode_t *at, uint32_t ns, const int32_t *tokens, uint64_t npages,
                       const uint32_t *l1_ids, const uint32_t *l2_ids,
                       uint64_t clock, int32_t priority, kvt_rnode_t **out) {
    if (npages == 0 || npages > UINT32_MAX || (at != &r->root && at->ns != ns)) return KVT_EINVAL;
    uint64_t digest = page_digest(r, tokens), h = kvt__cm_hash(at, ns, digest);
    if (kvt__cm_find(r, h, at, ns, tokens)) return KVT_EEXIST;
    if (kvt__cm_reserve(r, 1) != KVT_OK) return KVT_ENOMEM;
    kvt_rnode_t *n = node_new(r, (uint32_t)npages);
    if (n == NULL) return KVT_ENOMEM;
    if (n->key) { /* the first page's digest is the child map's */
        n->key[0] = key_step(kvt__radix_key_below(r, at, ns), digest);
        kvt__radix_keys(r, n->key[0], tokens + r->page_tokens, npages - 1, n->key + 1);
    }
    memcpy(n->tokens, tokens, (size_t)npages * r->page_tokens * sizeof(int32_t));
    for (uint32_t i = 0; i < npages; i++) {
        if (l1_ids) {
            KVT_ASSERT(l1_ids[i] < r->l1_pages && r->l1map[l1_ids[i]].node == NULL);
            n->pages[i] = (kvt_page_t){l1_ids[i], KVT_NO_PAGE, 0};
        } else {
            KVT_ASSERT(l2_ids[i] < r->l2_pages && r->l2map[l2_ids[i]].node == NULL);
            n->pages[i] = (kvt_page_t){KVT_NO_PAGE, l2_ids[i], 0};
        }
    }
    n->npages = (uint32_t)npages;
    n->n_l1 = l1_ids ? (uint32_t)npages : 0;
    n->ns = ns;
    n->priority = priority;
    n->last_access = n->created = clock;
    n->digest = digest;
    n->seq = r->next_seq++;
    link_child(at, n);
    if (l1_ids) at->l1_children++;
    kvt__cm_insert(r, h, n); /* (new pages have nothing in flight: none is tracked) */
    r->nodes++;
    kvt__vheap_refresh(r, n);
    kvt__vheap_refresh(r, at);
    *out = n;
    return KVT_OK;
}

int kvt__radix_insert(kvt_radix_t *r, kvt_rnode_t *at, uint32_t ns, const int32_t *tokens, uint64_t npages,
                      const uint32_t *l1_ids, uint64_t clock, int32_t priority, kvt_rnode_t **out) {
    if (at != &r->root && at->n_l1 != at->npages) return KVT_EINVAL;
    return insert_node(r, at, ns, tokens, npages, l1_ids, NULL, clock, priority, out);
}

int kvt__radix_insert_l2(kvt_radix_t *r, kvt_rnode_t *at, uint32_t ns, const int32_t *tokens, uint64_t npages,
                         const uint32_t *l2_ids, uint64_t clock, int32_t priority, kvt_rnode_t **out) {
    return insert_node(r, at, ns, tokens, npages, NULL, l2_ids, clock, priority, out);
}

/* ---- locks ----------------------------------------------------------------- */

void kvt__radix_lock(kvt_radix_t *r, kvt_rnode_t *node, int delta) {
    for (kvt_rnode_t *x = node; x != &r->root; x = x->parent) {
        KVT_ASSERT(delta > 0 || x->lock > 0);
        x->lock += (uint32_t)delta;
        if (x->lock == 0 || (delta > 0 && x->lock == 1)) kvt__vheap_refresh(r, x);
    }
}

/* ---- page states ------------------------------------------------------------ */

/* n's first L1 page count changed from or to 0: its parent's l1_children. */
static void l1_edge(kvt_radix_t *r, kvt_rnode_t *n, uint32_t before) {
    if ((before == 0) == (n->n_l1 == 0)) return;
    if (n->n_l1 == 0) n->parent->l1_children--;
    else n->parent->l1_children++;
    kvt__vheap_membership(r, n->parent);
}

uint32_t kvt__radix_drop_l1_tail(kvt_radix_t *r, kvt_rnode_t *n, uint32_t max, uint32_t *l1) {
    /* in locals: the stores below could alias n and r, which would otherwise be read again each page */
    uint32_t k = 0, lim = max < n->n_l1 ? max : n->n_l1;
    kvt_page_t *last = n->pages + n->n_l1 - 1;
    for (; k < lim; k++) {
        kvt_page_t *p = last - k;
        if (!kvt__page_in_l2(p)) break;
        l1[k] = p->l1;
        p->l1 = KVT_NO_PAGE;
    }
    if (k == 0) return 0;
    n->n_shadow -= k;
    n->n_l1 -= k;
    l1_edge(r, n, n->n_l1 + k);
    kvt__vheap_membership(r, n);
    return k;
}

uint32_t kvt__radix_drop_l1(kvt_radix_t *r, kvt_rnode_t *n) {
    uint32_t id = KVT_NO_PAGE, k = kvt__radix_drop_l1_tail(r, n, 1, &id);
    KVT_ASSERT(k == 1);
    (void)k;
    return id;
}

/* n, trimmed to no pages, leaves the tree. */
static void trimmed_away(kvt_radix_t *r, kvt_rnode_t *n) {
    kvt_rnode_t *parent = n->parent;
    kvt__vheap_remove_all(r, n);
    kvt__cm_remove(r, kvt__cm_hash(parent, n->ns, n->digest), n);
    unlink_child(n);
    node_free(r, n);
    r->nodes--;
    kvt__vheap_membership(r, parent);
}

kvt_page_t kvt__radix_trim(kvt_radix_t *r, kvt_rnode_t *n) {
    KVT_ASSERT(n->nchildren == 0 && n->npages > 0 && !(n->pages[n->npages - 1].flags & (KVT_PAGE_D2H | KVT_PAGE_H2D)));
    uint32_t idx = n->npages - 1;
    kvt_page_t pg = n->pages[idx];
    if (pg.flags & KVT_PAGE_SUSPECT) r->l2map[pg.l2].node = NULL;
    if (idx < n->n_l1) {
        if (kvt__page_in_l2(&pg)) n->n_shadow--;
        n->n_l1--;
        l1_edge(r, n, n->n_l1 + 1);
    }
    n->npages--;
    if (n->nhash > n->npages) n->nhash = n->npages;
    if (n->npages > 0) {
        shrink(r, n);
        kvt__vheap_membership(r, n);
    } else {
        trimmed_away(r, n);
    }
    return pg;
}

/* n's last k pages have left it (none tracked any more; L1 residency
 * already counted): n keeps the rest, in the arrays k kvt__radix_trim calls
 * would leave it (each halving where one would have shrunk them), or is freed. */
static void cut_tail(kvt_radix_t *r, kvt_rnode_t *n, uint32_t k) {
    uint32_t m = n->npages - k, cap = m > 0 ? kvt__cap_after_trims(n->npages, n->cap, k) : n->cap;
    n->npages = m;
    if (n->nhash > m) n->nhash = m;
    if (m > 0) {
        if (cap < n->cap) (void)move_arrays_to(r, n, 0, m, cap);
        kvt__vheap_membership(r, n);
    } else {
        trimmed_away(r, n);
    }
}

uint32_t kvt__radix_trim_l1_tail(kvt_radix_t *r, kvt_rnode_t *n, uint32_t k, uint32_t *l1) {
    KVT_ASSERT(n->nchildren == 0 && k > 0 && k <= n->npages && n->n_l1 == n->npages);
    for (uint32_t i = 0; i < k; i++) {
        const kvt_page_t *p = &n->pages[n->npages - 1 - i];
        KVT_ASSERT(p->l2 == KVT_NO_PAGE && p->flags == 0);
        l1[i] = p->l1;
    }
    n->n_l1 -= k;
    l1_edge(r, n, n->n_l1 + k); /* (only when n goes: its last L1 page) */
    cut_tail(r, n, k);
    return k;
}

uint32_t kvt__radix_l2_tail(const kvt_rnode_t *n, uint32_t max, uint32_t *l2, bool *suspect) {
    uint32_t m = 0, most = n->npages - n->n_l1 < max ? n->npages - n->n_l1 : max;
    const kvt_page_t *last = n->pages + n->npages - 1; /* (bounds in locals: the stores to l2 could alias n) */
    uint32_t flags = 0;
    for (; m < most; m++) {
        const kvt_page_t *p = last - m;
        if (p->l1 != KVT_NO_PAGE || (p->flags & KVT__PAGE_IN_FLIGHT)) break;
        KVT_ASSERT(p->l2 != KVT_NO_PAGE);
        flags |= p->flags;
        l2[m] = p->l2;
    }
    *suspect = flags != 0;
    return m;
}

void kvt__radix_cut_l2_tail(kvt_radix_t *r, kvt_rnode_t *n, uint32_t k, bool suspect) {
    KVT_ASSERT(n->nchildren == 0 && k > 0 && k <= n->npages - n->n_l1);
    for (uint32_t i = 0; suspect && i < k; i++) {
        const kvt_page_t *p = &n->pages[n->npages - 1 - i];
        if (p->flags) r->l2map[p->l2].node = NULL; /* suspect: no longer tracked */
    }
    cut_tail(r, n, k);
}

/* p's L2 copy goes: if it was suspect, it is no longer tracked. */
static inline void untrack_l2(kvt_radix_t *r, kvt_page_t *p) {
    if (!(p->flags & KVT_PAGE_SUSPECT)) return;
    r->l2map[p->l2].node = NULL;
    p->flags &= ~(uint32_t)KVT_PAGE_SUSPECT;
}

void kvt__radix_suspect(kvt_radix_t *r, kvt_rnode_t *n, uint32_t idx) {
    kvt_page_t *p = &n->pages[idx];
    KVT_ASSERT(p->l2 != KVT_NO_PAGE && !(p->flags & KVT_PAGE_D2H));
    p->flags |= KVT_PAGE_SUSPECT;
    track(r, n, idx);
}

uint32_t kvt__radix_drop_l2(kvt_radix_t *r, kvt_rnode_t *n, uint32_t idx) {
    kvt_page_t *p = &n->pages[idx];
    KVT_ASSERT(idx < n->n_l1 && kvt__page_in_l2(p));
    uint32_t id = p->l2;
    untrack_l2(r, p);
    p->l2 = KVT_NO_PAGE;
    n->n_shadow--;
    kvt__vheap_membership(r, n);
    return id;
}

/* The last shadow below bound, + 1 (0: none). Shadows lie below the node's
 * bound, min(n_l1, shadow_top). */
static uint32_t shadow_below(const kvt_rnode_t *n, uint32_t bound) {
    while (bound > 0 && !kvt__page_in_l2(&n->pages[bound - 1])) bound--;
    return bound;
}
static uint32_t shadow_bound(const kvt_rnode_t *n) { return n->n_l1 < n->shadow_top ? n->n_l1 : n->shadow_top; }

uint32_t kvt__radix_last_shadow(const kvt_rnode_t *n) {
    uint32_t idx = shadow_below(n, shadow_bound(n));
    KVT_ASSERT(idx > 0);
    return idx - 1;
}

uint32_t kvt__radix_drop_shadows(kvt_radix_t *r, kvt_rnode_t *n, uint32_t max, uint32_t *l2) {
    uint32_t k = 0, idx = shadow_bound(n);
    for (; k < max && n->n_shadow > 0; k++) {
        /* the last shadow: searched down from the node's bound, which the search then lowers
         * (shadows go tail first, so each page is passed over once, not once per reclaim) */
        idx = shadow_below(n, idx);
        KVT_ASSERT(idx > 0);
        kvt_page_t *p = &n->pages[--idx];
        untrack_l2(r, p);
        l2[k] = p->l2;
        p->l2 = KVT_NO_PAGE;
        n->n_shadow--;
        n->shadow_top = idx;
    }
    if (k > 0) kvt__vheap_membership(r, n);
    return k;
}

/* A backup's two halves: L2 page l2 is the page's (reserved, or landed), and
 * the page's copy in L2 has landed. */
static inline kvt_page_t *give_l2(kvt_radix_t *r, kvt_rnode_t *n, uint32_t idx, uint32_t l2) {
    kvt_page_t *p = &n->pages[idx];
    KVT_ASSERT(idx < n->n_l1 && p->l2 == KVT_NO_PAGE && l2 < r->l2_pages && r->l2map[l2].node == NULL);
    (void)r;
    p->l2 = l2;
    return p;
}
static inline void shadows_landed(kvt_rnode_t *n, uint32_t lo, uint32_t k) { /* pages lo .. lo + k - 1 */
    n->n_shadow += k; /* a page being backed up stays in L1 until the backup ends */
    if (n->shadow_top < lo + k) n->shadow_top = lo + k;
}

void kvt__radix_begin_backup(kvt_radix_t *r, kvt_rnode_t *n, uint32_t idx, uint32_t l2) {
    give_l2(r, n, idx, l2)->flags |= KVT_PAGE_D2H;
    track(r, n, idx);
    kvt__vheap_membership(r, n);
}

void kvt__radix_end_backup(kvt_radix_t *r, kvt_rnode_t *n, uint32_t idx, bool ok) {
    kvt_page_t *p = &n->pages[idx];
    KVT_ASSERT(p->flags & KVT_PAGE_D2H);
    p->flags &= ~(uint32_t)KVT_PAGE_D2H;
    r->l2map[p->l2].node = NULL; /* landed or not, no longer in flight */
    if (ok) shadows_landed(n, idx, 1);
    else p->l2 = KVT_NO_PAGE;
    kvt__vheap_membership(r, n);
}

/* A backup that ends as it begins (the copy made at once): begin and end, with
 * no in-flight state between them. */
void kvt__radix_backups_done(kvt_radix_t *r, kvt_rnode_t *n, uint32_t lo, uint32_t k, const uint32_t *l2) {
    KVT_ASSERT(k > 0);
    for (uint32_t j = 0; j < k; j++) give_l2(r, n, lo + j, l2[j]);
    shadows_landed(n, lo, k);
    kvt__vheap_membership(r, n); /* once: the sets n belongs to depend on its final state only */
}

void kvt__radix_begin_load(kvt_radix_t *r, kvt_rnode_t *n, uint32_t idx, uint32_t l1) {
    kvt_page_t *p = &n->pages[idx];
    KVT_ASSERT(idx >= n->n_l1 && kvt__page_in_l2(p) && p->l1 == KVT_NO_PAGE && l1 < r->l1_pages);
    p->l1 = l1;
    p->flags |= KVT_PAGE_H2D;
    n->pin++;
    track(r, n, idx);
    kvt__vheap_membership(r, n);
}

/* Extends n's L1 prefix over pages whose loads have ended, if its parent is
 * all in L1; then its children's, and so on down. */
static void advance_l1(kvt_radix_t *r, kvt_rnode_t *n) {
    if (n->parent != &r->root && n->parent->n_l1 < n->parent->npages) return;
    uint32_t before = n->n_l1;
    while (n->n_l1 < n->npages && kvt__page_in_l1(&n->pages[n->n_l1])) {
        if (kvt__page_in_l2(&n->pages[n->n_l1])) {
            n->n_shadow++;
            if (n->shadow_top <= n->n_l1) n->shadow_top = n->n_l1 + 1;
        }
        n->n_l1++;
    }
    if (n->n_l1 == before) return;
    l1_edge(r, n, before);
    kvt__vheap_membership(r, n);
    if (n->n_l1 == n->npages)
        for (kvt_rnode_t *c = n->first_child; c; c = c->next_sibling) advance_l1(r, c);
}

uint32_t kvt__radix_loads_done(kvt_radix_t *r, kvt_rnode_t *n, const uint32_t *l1) {
    uint32_t j = 0;
    for (uint32_t i = n->n_l1; i < n->npages; i++) {
        kvt_page_t *p = &n->pages[i];
        if (p->l1 != KVT_NO_PAGE) continue; /* loaded before, stranded below a page not in L1 then */
        KVT_ASSERT(kvt__page_in_l2(p) && !(p->flags & KVT_PAGE_H2D) && l1[j] < r->l1_pages && r->l1map[l1[j]].node == NULL);
        p->l1 = l1[j++];
    }
    if (j == 0) return 0;
    advance_l1(r, n);
    kvt__vheap_membership(r, n); /* once: the sets n belongs to depend on its final state only */
    return j;
}

void kvt__radix_end_load(kvt_radix_t *r, kvt_rnode_t *n, uint32_t idx, bool ok) {
    kvt_page_t *p = &n->pages[idx];
    KVT_ASSERT(p->flags & KVT_PAGE_H2D);
    p->flags &= ~(uint32_t)KVT_PAGE_H2D;
    n->pin--;
    r->l1map[p->l1].node = NULL; /* loaded or not, no longer in flight */
    if (!ok) p->l1 = KVT_NO_PAGE;
    advance_l1(r, n);
    kvt__vheap_membership(r, n);
}

uint32_t kvt__radix_unload(kvt_radix_t *r, kvt_rnode_t *n, uint32_t idx) {
    kvt_page_t *p = &n->pages[idx];
    KVT_ASSERT(idx >= n->n_l1 && p->l1 != KVT_NO_PAGE && !(p->flags & KVT_PAGE_H2D));
    uint32_t id = p->l1;
    (void)r; /* (not tracked: nothing in flight) */
    p->l1 = KVT_NO_PAGE;
    return id; /* n_l1, the counters and the victim sets do not depend on it */
}

void kvt__radix_rescore(kvt_radix_t *r, kvt_rnode_t *n) { kvt__vheap_refresh(r, n); }

kvt_rnode_t *kvt__radix_first(kvt_radix_t *r) { return r->root.first_child; }

kvt_rnode_t *kvt__radix_next(kvt_radix_t *r, kvt_rnode_t *n) {
    if (n->first_child) return n->first_child;
    while (n != &r->root && n->next_sibling == NULL) n = n->parent;
    return n == &r->root ? NULL : n->next_sibling;
}

bool kvt__radix_locate_l1(const kvt_radix_t *r, uint32_t id, kvt_rnode_t **n, uint32_t *idx) {
    if (id >= r->l1_pages || r->l1map[id].node == NULL) return false;
    *n = r->l1map[id].node;
    *idx = r->l1map[id].idx;
    return true;
}

bool kvt__radix_locate_l2(const kvt_radix_t *r, uint32_t id, kvt_rnode_t **n, uint32_t *idx) {
    if (id >= r->l2_pages || r->l2map[id].node == NULL) return false;
    *n = r->l2map[id].node;
    *idx = r->l2map[id].idx;
    return true;
}

bool kvt__radix_search(kvt_radix_t *r, int tier, uint32_t id, kvt_rnode_t **n, uint32_t *idx) {
    for (kvt_rnode_t *x = kvt__radix_first(r); x; x = kvt__radix_next(r, x))
        for (uint32_t i = 0; i < x->npages; i++)
            if ((tier == 1 ? x->pages[i].l1 : x->pages[i].l2) == id) {
                *n = x;
                *idx = i;
                return true;
            }
    return false;
}

/* ---- page keys and hashes -------------------------------------------------- */

uint64_t kvt__radix_key_below(const kvt_radix_t *r, const kvt_rnode_t *at, uint32_t ns) {
    return at == &r->root ? kvt__splitmix64((uint64_t)ns + 0x6b767469657231ull) : kvt__radix_page_key(at, at->npages - 1);
}

uint64_t kvt__radix_key_next(const kvt_radix_t *r, uint64_t prev, const int32_t *page) {
    return key_step(prev, page_digest(r, page));
}

void kvt__radix_keys(const kvt_radix_t *r, uint64_t prev, const int32_t *tokens, size_t n, uint64_t *out) {
    for (size_t i = 0; i < n; i++) out[i] = prev = kvt__radix_key_next(r, prev, tokens + i * r->page_tokens);
}

/* Hashes of n's pages up to and including `upto`. */
static int ensure_hash(kvt_radix_t *r, kvt_rnode_t *n, uint32_t upto) {
    /* Ancestors first: find the highest node on the path whose hashes are
     * incomplete, then walk down. */
    kvt_rnode_t *chain[64];
    size_t depth = 0;
    for (kvt_rnode_t *x = n; x != &r->root && (x == n ? x->nhash <= upto : x->nhash < x->npages); x = x->parent) {
        if (depth == sizeof(chain) / sizeof(chain[0])) { /* very deep: finish the upper part first */
            int rc = ensure_hash(r, x, x->npages - 1);
            if (rc != KVT_OK) return rc;
            break;
        }
        chain[depth++] = x;
    }
    while (depth > 0) {
        kvt_rnode_t *x = chain[--depth];
        uint32_t last = x == n ? upto : x->npages - 1;
        if (x->hash == NULL) {
            x->hash = kvt__pool_alloc(r, (size_t)x->cap * sizeof(kvt_hash128_t));
            if (x->hash == NULL) return KVT_ENOMEM;
        }
        kvt_hash128_t prev = {0, 0};
        if (x->nhash > 0) prev = x->hash[x->nhash - 1];
        else if (x->parent != &r->root) prev = x->parent->hash[x->parent->npages - 1];
        for (uint32_t i = x->nhash; i <= last; i++) {
            x->hash[i] = kvt_page_hash(&prev, x->ns, x->tokens + (size_t)i * r->page_tokens, r->page_tokens);
            prev = x->hash[i];
        }
        x->nhash = last + 1;
    }
    return KVT_OK;
}

void kvt_page_hash_chain(uint32_t ns, const int32_t *tokens, uint64_t npages, uint32_t page_tokens, kvt_hash128_t *out) {
    for (uint64_t j = 0; j < npages; j++) out[j] = kvt_page_hash(j ? &out[j - 1] : NULL, ns, tokens + j * page_tokens, page_tokens);
}

int kvt__radix_page_hash(kvt_radix_t *r, kvt_rnode_t *n, uint32_t idx, kvt_hash128_t *out) {
    int rc = ensure_hash(r, n, idx);
    if (rc == KVT_OK) *out = n->hash[idx];
    return rc;
}

int kvt_radix_page_hash(kvt_radix_t *r, kvt_rnode_t *n, uint32_t idx, kvt_hash128_t *out) {
    if (r == NULL || n == NULL || out == NULL || n == &r->root || idx >= n->npages) return KVT_EINVAL;
    const kvt_rnode_t *x = n; /* another tree's node is refused, not hashed into this tree's pool: O(depth) */
    while (x->parent) x = x->parent;
    if (x != &r->root) return KVT_EINVAL;
    return kvt__radix_page_hash(r, n, idx, out);
}
