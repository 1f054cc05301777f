/* u64set: an ordered set of uint64 keys as a B+tree.
 *
 * Keys live only in leaves; inner nodes hold separators. Every node is 512
 * bytes (8 cache lines): a leaf holds up to 63 keys, an inner node up to 31
 * separators and 32 children. A set of a million keys is 3-4 levels deep and
 * costs 10-12 bytes per key at the typical 2/3 fill.
 *
 *                    [ 40 | 90 ]                    inner: separators
 *                  /      |      \
 *        [3 17 25]  [40 52 61 77]  [90 95]          leaves: keys
 *
 * Invariants (checked by kvt__u64set_check):
 *  - keys are strictly increasing inside every node;
 *  - for separator s[i] of an inner node: every key under child i is < s[i]
 *    and every key under child i+1 is >= s[i] (a separator need not be a key:
 *    erase and replace leave them where they still separate correctly);
 *  - all leaves are at the same depth;
 *  - every node but the root is at least half full (31 keys / 15 separators);
 *    an inner root has at least one separator.
 *
 * Cost: insert, erase, lower_bound and replace touch one root-to-leaf path,
 * O(log n); next/prev are O(1) amortised. Insert splits full nodes bottom-up and
 * takes every node it needs from the pool before it changes anything, so a
 * failed insert leaves the set as it was. Erase borrows from or merges with a
 * sibling and never allocates.
 */
#include "u64set-int.h"

#include <string.h>

#include "kvtier/error.h"
#include "mem-int.h"

#define LEAF_CAP 63
#define INNER_CAP 31 /* separators; children = separators + 1 */
#define LEAF_MIN (LEAF_CAP / 2)
#define INNER_MIN (INNER_CAP / 2)

struct kvt__u64node {
    uint16_t n; /* keys (leaf) or separators (inner) */
    uint16_t leaf;
    uint32_t pad_;
    union {
        uint64_t key[LEAF_CAP];
        struct {
            uint64_t sep[INNER_CAP];
            kvt__u64node_t *child[INNER_CAP + 1];
        } in;
        kvt__u64node_t *next_spare;
    } u;
};

_Static_assert(sizeof(kvt__u64node_t) == KVT_U64SET_NODE_BYTES, "u64set node size");

/* ---- node pool ---------------------------------------------------------- */

void kvt__nodepool_init(kvt__nodepool_t *pool) { memset(pool, 0, sizeof(*pool)); }

void kvt__nodepool_fini(kvt__nodepool_t *pool) { kvt__nodepool_trim(pool, 0); }

int kvt__nodepool_reserve(kvt__nodepool_t *pool, size_t n) {
    size_t added = 0;
    while (pool->nspare < n) {
        kvt__u64node_t *nd = kvt__malloc(sizeof(*nd));
        if (nd == NULL) {
            while (added--) { /* give back what this call took */
                kvt__u64node_t *x = pool->spare;
                pool->spare = x->u.next_spare;
                pool->nspare--;
                kvt__free(x, sizeof(*x));
            }
            return KVT_ENOMEM;
        }
        nd->u.next_spare = pool->spare;
        pool->spare = nd;
        pool->nspare++;
        added++;
    }
    return KVT_OK;
}

void kvt__nodepool_trim(kvt__nodepool_t *pool, size_t keep) {
    while (pool->nspare > keep) {
        kvt__u64node_t *x = pool->spare;
        pool->spare = x->u.next_spare;
        pool->nspare--;
        kvt__free(x, sizeof(*x));
    }
}

size_t kvt__nodepool_bytes(const kvt__nodepool_t *pool) {
    return (pool->live + pool->nspare) * sizeof(kvt__u64node_t);
}

/* Takes a spare node; the caller has reserved it. */
static kvt__u64node_t *node_take(kvt__nodepool_t *pool, int leaf) {
    kvt__u64node_t *nd = pool->spare;
    pool->spare = nd->u.next_spare;
    pool->nspare--;
    pool->live++;
    nd->n = 0;
    nd->leaf = (uint16_t)leaf;
    nd->pad_ = 0;
    return nd;
}

static void node_give(kvt__nodepool_t *pool, kvt__u64node_t *nd) {
    nd->u.next_spare = pool->spare;
    pool->spare = nd;
    pool->nspare++;
    pool->live--;
}

size_t kvt__u64set_insert_bound(const kvt__u64set_t *s, size_t inserts) {
    if (inserts == 0) return 0;
    uint64_t keys = s->count + inserts;
    size_t h = 1;
    /* a tree of height h+1 holds at least 2 * LEAF_MIN * (INNER_MIN + 1)^(h-1) keys */
    for (uint64_t min_keys = 2 * LEAF_MIN; min_keys <= keys && h < KVT_U64SET_MAX_HEIGHT;
         min_keys *= INNER_MIN + 1)
        h++;
    /* Every node but the root is at least half full, after each insert and erase (splits halve
     * full nodes, erases borrow or merge): at most keys / LEAF_MIN leaves, and above them a
     * (INNER_MIN + 1)-th as many a level, h levels. */
    uint64_t whole = keys / LEAF_MIN + keys / (LEAF_MIN * INNER_MIN) + h + 2, each = (uint64_t)inserts * (h + 1);
    return (size_t)(each < whole ? each : whole);
}

/* ---- search helpers ----------------------------------------------------- */

/* First index i in a[0..n) with a[i] >= key. */
static inline unsigned lower_idx(const uint64_t *a, unsigned n, uint64_t key) {
    unsigned lo = 0, hi = n;
    while (lo < hi) {
        unsigned mid = (lo + hi) >> 1;
        if (a[mid] < key) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Child to descend into for key: the number of separators <= key. */
static inline unsigned child_idx(const kvt__u64node_t *nd, uint64_t key) {
    unsigned lo = 0, hi = nd->n;
    while (lo < hi) {
        unsigned mid = (lo + hi) >> 1;
        if (nd->u.in.sep[mid] <= key) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Descends towards key, filling cur->node/idx for inner levels; returns the
 * leaf depth. The leaf index is left for the caller. */
static unsigned descend(const kvt__u64set_t *s, uint64_t key, kvt__u64cur_t *cur) {
    kvt__u64node_t *nd = s->root;
    unsigned d = 0;
    for (; !nd->leaf; d++) {
        unsigned i = child_idx(nd, key);
        cur->node[d] = nd;
        cur->idx[d] = (uint16_t)i;
        nd = nd->u.in.child[i];
    }
    cur->node[d] = nd;
    return d;
}

/* ---- set ---------------------------------------------------------------- */

void kvt__u64set_init(kvt__u64set_t *s, kvt__nodepool_t *pool) {
    memset(s, 0, sizeof(*s));
    s->pool = pool;
}

static void free_subtree(kvt__nodepool_t *pool, kvt__u64node_t *nd) {
    if (!nd->leaf)
        for (unsigned i = 0; i <= nd->n; i++) free_subtree(pool, nd->u.in.child[i]);
    node_give(pool, nd);
}

void kvt__u64set_fini(kvt__u64set_t *s) {
    if (s->root) free_subtree(s->pool, s->root);
    s->root = NULL;
    s->height = 0;
    s->count = 0;
}

bool kvt__u64set_contains(const kvt__u64set_t *s, uint64_t key) {
    kvt__u64cur_t cur;
    return kvt__u64set_lower_bound(s, key, &cur) && kvt__u64cur_key(&cur) == key;
}

int kvt__u64set_insert(kvt__u64set_t *s, uint64_t key) {
    if (s->root == NULL) {
        if (kvt__nodepool_reserve(s->pool, 1) != KVT_OK) return KVT_ENOMEM;
        s->root = node_take(s->pool, 1);
        s->root->u.key[0] = key;
        s->root->n = 1;
        s->height = 1;
        s->count = 1;
        return KVT_OK;
    }
    kvt__u64cur_t path;
    unsigned d = descend(s, key, &path);
    kvt__u64node_t *leaf = path.node[d];
    unsigned pos = lower_idx(leaf->u.key, leaf->n, key);
    if (pos < leaf->n && leaf->u.key[pos] == key) return KVT_EEXIST;

    if (leaf->n < LEAF_CAP) {
        memmove(&leaf->u.key[pos + 1], &leaf->u.key[pos], (leaf->n - pos) * sizeof(uint64_t));
        leaf->u.key[pos] = key;
        leaf->n++;
        s->count++;
        return KVT_OK;
    }

    /* Count the nodes the splits will need before touching anything. */
    size_t need = 1;
    int lvl = (int)d - 1;
    while (lvl >= 0 && path.node[lvl]->n == INNER_CAP) {
        need++;
        lvl--;
    }
    if (lvl < 0) need++; /* new root */
    if (kvt__nodepool_reserve(s->pool, need) != KVT_OK) return KVT_ENOMEM;

    /* Split the leaf: 64 keys, 32 each side. */
    uint64_t tmp[LEAF_CAP + 1];
    memcpy(tmp, leaf->u.key, pos * sizeof(uint64_t));
    tmp[pos] = key;
    memcpy(&tmp[pos + 1], &leaf->u.key[pos], (LEAF_CAP - pos) * sizeof(uint64_t));
    kvt__u64node_t *right = node_take(s->pool, 1);
    unsigned left_n = (LEAF_CAP + 1) / 2;
    leaf->n = (uint16_t)left_n;
    memcpy(leaf->u.key, tmp, left_n * sizeof(uint64_t));
    right->n = (uint16_t)(LEAF_CAP + 1 - left_n);
    memcpy(right->u.key, &tmp[left_n], right->n * sizeof(uint64_t));
    uint64_t up_key = right->u.key[0];
    kvt__u64node_t *up_child = right;
    s->count++;

    /* Push (up_key, up_child) into the parents, splitting full ones. */
    for (lvl = (int)d - 1; lvl >= 0; lvl--) {
        kvt__u64node_t *p = path.node[lvl];
        unsigned ci = path.idx[lvl];
        if (p->n < INNER_CAP) {
            memmove(&p->u.in.sep[ci + 1], &p->u.in.sep[ci], (p->n - ci) * sizeof(uint64_t));
            memmove(&p->u.in.child[ci + 2], &p->u.in.child[ci + 1], (p->n - ci) * sizeof(void *));
            p->u.in.sep[ci] = up_key;
            p->u.in.child[ci + 1] = up_child;
            p->n++;
            return KVT_OK;
        }
        uint64_t seps[INNER_CAP + 1];
        kvt__u64node_t *kids[INNER_CAP + 2];
        memcpy(seps, p->u.in.sep, ci * sizeof(uint64_t));
        seps[ci] = up_key;
        memcpy(&seps[ci + 1], &p->u.in.sep[ci], (INNER_CAP - ci) * sizeof(uint64_t));
        memcpy(kids, p->u.in.child, (ci + 1) * sizeof(void *));
        kids[ci + 1] = up_child;
        memcpy(&kids[ci + 2], &p->u.in.child[ci + 1], (INNER_CAP - ci) * sizeof(void *));
        /* 32 separators: 16 stay left, 1 goes up, 15 go right. */
        unsigned ln = (INNER_CAP + 1) / 2;
        kvt__u64node_t *r = node_take(s->pool, 0);
        p->n = (uint16_t)ln;
        memcpy(p->u.in.sep, seps, ln * sizeof(uint64_t));
        memcpy(p->u.in.child, kids, (ln + 1) * sizeof(void *));
        r->n = (uint16_t)(INNER_CAP - ln);
        memcpy(r->u.in.sep, &seps[ln + 1], r->n * sizeof(uint64_t));
        memcpy(r->u.in.child, &kids[ln + 1], (r->n + 1u) * sizeof(void *));
        up_key = seps[ln];
        up_child = r;
    }
    kvt__u64node_t *root = node_take(s->pool, 0);
    root->n = 1;
    root->u.in.sep[0] = up_key;
    root->u.in.child[0] = s->root;
    root->u.in.child[1] = up_child;
    s->root = root;
    s->height++;
    return KVT_OK;
}

static unsigned leaf_level(const kvt__u64cur_t *cur) { return cur->set->height - 1; }

/* Removes separator k and child k+1 of inner node p. */
static void inner_remove(kvt__u64node_t *p, unsigned k) {
    memmove(&p->u.in.sep[k], &p->u.in.sep[k + 1], (p->n - k - 1) * sizeof(uint64_t));
    memmove(&p->u.in.child[k + 1], &p->u.in.child[k + 2], (p->n - k - 1) * sizeof(void *));
    p->n--;
}

/* Leaf `nd`, child ci of p, is below LEAF_MIN: borrow or merge. */
static void fix_leaf(kvt__nodepool_t *pool, kvt__u64node_t *p, unsigned ci) {
    kvt__u64node_t *nd = p->u.in.child[ci];
    kvt__u64node_t *l = ci > 0 ? p->u.in.child[ci - 1] : NULL;
    kvt__u64node_t *r = ci < p->n ? p->u.in.child[ci + 1] : NULL;
    if (l && l->n > LEAF_MIN) {
        memmove(&nd->u.key[1], &nd->u.key[0], nd->n * sizeof(uint64_t));
        nd->u.key[0] = l->u.key[--l->n];
        nd->n++;
        p->u.in.sep[ci - 1] = nd->u.key[0];
    } else if (r && r->n > LEAF_MIN) {
        nd->u.key[nd->n++] = r->u.key[0];
        memmove(&r->u.key[0], &r->u.key[1], (r->n - 1u) * sizeof(uint64_t));
        r->n--;
        p->u.in.sep[ci] = r->u.key[0];
    } else if (l) { /* merge nd into l */
        memcpy(&l->u.key[l->n], nd->u.key, nd->n * sizeof(uint64_t));
        l->n = (uint16_t)(l->n + nd->n);
        inner_remove(p, ci - 1);
        node_give(pool, nd);
    } else { /* merge r into nd */
        memcpy(&nd->u.key[nd->n], r->u.key, r->n * sizeof(uint64_t));
        nd->n = (uint16_t)(nd->n + r->n);
        inner_remove(p, ci);
        node_give(pool, r);
    }
}

/* Inner node `nd`, child ci of p, is below INNER_MIN: rotate or merge. */
static void fix_inner(kvt__nodepool_t *pool, kvt__u64node_t *p, unsigned ci) {
    kvt__u64node_t *nd = p->u.in.child[ci];
    kvt__u64node_t *l = ci > 0 ? p->u.in.child[ci - 1] : NULL;
    kvt__u64node_t *r = ci < p->n ? p->u.in.child[ci + 1] : NULL;
    if (l && l->n > INNER_MIN) {
        memmove(&nd->u.in.sep[1], &nd->u.in.sep[0], nd->n * sizeof(uint64_t));
        memmove(&nd->u.in.child[1], &nd->u.in.child[0], (nd->n + 1u) * sizeof(void *));
        nd->u.in.sep[0] = p->u.in.sep[ci - 1];
        nd->u.in.child[0] = l->u.in.child[l->n];
        nd->n++;
        p->u.in.sep[ci - 1] = l->u.in.sep[l->n - 1];
        l->n--;
    } else if (r && r->n > INNER_MIN) {
        nd->u.in.sep[nd->n] = p->u.in.sep[ci];
        nd->u.in.child[nd->n + 1] = r->u.in.child[0];
        nd->n++;
        p->u.in.sep[ci] = r->u.in.sep[0];
        memmove(&r->u.in.sep[0], &r->u.in.sep[1], (r->n - 1u) * sizeof(uint64_t));
        memmove(&r->u.in.child[0], &r->u.in.child[1], r->n * sizeof(void *));
        r->n--;
    } else {
        kvt__u64node_t *a = l ? l : nd, *b = l ? nd : r;
        unsigned k = l ? ci - 1 : ci; /* separator between a and b */
        a->u.in.sep[a->n] = p->u.in.sep[k];
        memcpy(&a->u.in.sep[a->n + 1], b->u.in.sep, b->n * sizeof(uint64_t));
        memcpy(&a->u.in.child[a->n + 1], b->u.in.child, (b->n + 1u) * sizeof(void *));
        a->n = (uint16_t)(a->n + 1 + b->n);
        inner_remove(p, k);
        node_give(pool, b);
    }
}

/* Removes key pos of the leaf at depth d of path, then restores the fill
 * bottom-up along the path. */
static void erase_path(kvt__u64set_t *s, kvt__u64cur_t *path, unsigned d, unsigned pos) {
    kvt__u64node_t *leaf = path->node[d];
    memmove(&leaf->u.key[pos], &leaf->u.key[pos + 1], (leaf->n - pos - 1u) * sizeof(uint64_t));
    leaf->n--;
    s->count--;

    if (d == 0) { /* the root is this leaf */
        if (leaf->n == 0) {
            node_give(s->pool, leaf);
            s->root = NULL;
            s->height = 0;
        }
        return;
    }
    if (leaf->n < LEAF_MIN) fix_leaf(s->pool, path->node[d - 1], path->idx[d - 1]);
    for (int lvl = (int)d - 1; lvl >= 1; lvl--) {
        if (path->node[lvl]->n >= INNER_MIN) break;
        fix_inner(s->pool, path->node[lvl - 1], path->idx[lvl - 1]);
    }
    if (!s->root->leaf && s->root->n == 0) { /* collapse a one-child root */
        kvt__u64node_t *old = s->root;
        s->root = old->u.in.child[0];
        s->height--;
        node_give(s->pool, old);
    }
}

/* The path to key: its leaf's depth in *d and its place there in *pos;
 * false when key is absent. */
static bool locate(const kvt__u64set_t *s, uint64_t key, kvt__u64cur_t *path, unsigned *d, unsigned *pos) {
    if (s->root == NULL) return false;
    *d = descend(s, key, path);
    const kvt__u64node_t *leaf = path->node[*d];
    *pos = lower_idx(leaf->u.key, leaf->n, key);
    return *pos < leaf->n && leaf->u.key[*pos] == key;
}

int kvt__u64set_erase(kvt__u64set_t *s, uint64_t key) {
    kvt__u64cur_t path;
    unsigned d, pos;
    if (!locate(s, key, &path, &d, &pos)) return KVT_ENOENT;
    erase_path(s, &path, d, pos);
    return KVT_OK;
}

void kvt__u64set_erase_at(kvt__u64set_t *s, kvt__u64cur_t *cur) {
    unsigned d = leaf_level(cur);
    cur->valid = false;
    erase_path(s, cur, d, cur->idx[d]);
}

int kvt__u64set_replace(kvt__u64set_t *s, uint64_t old, uint64_t new_key) {
    kvt__u64cur_t path;
    unsigned d, pos;
    if (!locate(s, old, &path, &d, &pos)) return KVT_ENOENT;
    kvt__u64node_t *leaf = path.node[d];
    if (new_key == old) return KVT_OK;
    if ((pos > 0 && leaf->u.key[pos - 1] >= new_key) ||
        (pos + 1u < leaf->n && leaf->u.key[pos + 1] <= new_key) ||
        (new_key > old && new_key == UINT64_MAX))
        return KVT_EINVAL;
    leaf->u.key[pos] = new_key;
    /* Keep each level's bounding separators valid for the new key. With no key
     * between old and new, moving a bound to the new key separates the same
     * subtrees. */
    for (unsigned lvl = 0; lvl < d; lvl++) {
        kvt__u64node_t *p = path.node[lvl];
        unsigned ci = path.idx[lvl];
        if (new_key < old && ci > 0 && p->u.in.sep[ci - 1] > new_key) p->u.in.sep[ci - 1] = new_key;
        if (new_key > old && ci < p->n && p->u.in.sep[ci] <= new_key) p->u.in.sep[ci] = new_key + 1;
    }
    return KVT_OK;
}

/* ---- cursors ------------------------------------------------------------ */

uint64_t kvt__u64cur_key(const kvt__u64cur_t *cur) {
    unsigned d = leaf_level(cur);
    return cur->node[d]->u.key[cur->idx[d]];
}

/* Descends from level d (node already set) along the first (or last) children. */
static void descend_edge(kvt__u64cur_t *cur, unsigned d, int last) {
    kvt__u64node_t *nd = cur->node[d];
    while (!nd->leaf) {
        unsigned i = last ? nd->n : 0;
        cur->idx[d] = (uint16_t)i;
        nd = nd->u.in.child[i];
        cur->node[++d] = nd;
    }
    cur->idx[d] = (uint16_t)(last ? nd->n - 1 : 0);
}

bool kvt__u64cur_next(kvt__u64cur_t *cur) {
    if (!cur->valid) return false;
    int d = (int)leaf_level(cur);
    if (cur->idx[d] + 1u < cur->node[d]->n) {
        cur->idx[d]++;
        return true;
    }
    for (d--; d >= 0; d--) {
        if (cur->idx[d] < cur->node[d]->n) {
            cur->idx[d]++;
            cur->node[d + 1] = cur->node[d]->u.in.child[cur->idx[d]];
            descend_edge(cur, (unsigned)d + 1, 0);
            return true;
        }
    }
    cur->valid = false;
    return false;
}

bool kvt__u64cur_prev(kvt__u64cur_t *cur) {
    if (!cur->valid) return false;
    int d = (int)leaf_level(cur);
    if (cur->idx[d] > 0) {
        cur->idx[d]--;
        return true;
    }
    for (d--; d >= 0; d--) {
        if (cur->idx[d] > 0) {
            cur->idx[d]--;
            cur->node[d + 1] = cur->node[d]->u.in.child[cur->idx[d]];
            descend_edge(cur, (unsigned)d + 1, 1);
            return true;
        }
    }
    cur->valid = false;
    return false;
}

bool kvt__u64set_lower_bound(const kvt__u64set_t *s, uint64_t key, kvt__u64cur_t *cur) {
    cur->set = s;
    cur->valid = false;
    if (s->root == NULL) return false;
    unsigned d = descend(s, key, cur);
    kvt__u64node_t *leaf = cur->node[d];
    unsigned pos = lower_idx(leaf->u.key, leaf->n, key);
    cur->valid = true;
    if (pos < leaf->n) {
        cur->idx[d] = (uint16_t)pos;
        return true;
    }
    cur->idx[d] = (uint16_t)(leaf->n - 1);
    return kvt__u64cur_next(cur);
}

bool kvt__u64set_last_below(const kvt__u64set_t *s, uint64_t key, kvt__u64cur_t *cur) {
    if (kvt__u64set_lower_bound(s, key, cur)) return kvt__u64cur_prev(cur);
    return kvt__u64set_last(s, cur);
}

bool kvt__u64set_first(const kvt__u64set_t *s, kvt__u64cur_t *cur) {
    cur->set = s;
    cur->valid = s->root != NULL;
    if (cur->valid) {
        cur->node[0] = s->root;
        descend_edge(cur, 0, 0);
    }
    return cur->valid;
}

bool kvt__u64set_last(const kvt__u64set_t *s, kvt__u64cur_t *cur) {
    cur->set = s;
    cur->valid = s->root != NULL;
    if (cur->valid) {
        cur->node[0] = s->root;
        descend_edge(cur, 0, 1);
    }
    return cur->valid;
}

/* ---- check -------------------------------------------------------------- */

typedef struct check_ctx {
    size_t keys, nodes;
    const char *why;
} check_ctx_t;

/* Keys under nd must lie in [lo, hi) (has_lo/has_hi say whether bounded). */
static int check_node(const kvt__u64node_t *nd, unsigned depth, unsigned height, int is_root,
                      uint64_t lo, int has_lo, uint64_t hi, int has_hi, check_ctx_t *cx) {
    cx->nodes++;
    if ((depth == height - 1) != (nd->leaf != 0)) return cx->why = "leaf at wrong depth", -1;
    unsigned cap = nd->leaf ? LEAF_CAP : INNER_CAP, min = nd->leaf ? LEAF_MIN : INNER_MIN;
    if (nd->n > cap) return cx->why = "node over capacity", -1;
    if (is_root ? nd->n < 1 : nd->n < min) return cx->why = "node under minimum fill", -1;
    const uint64_t *a = nd->leaf ? nd->u.key : nd->u.in.sep;
    for (unsigned i = 0; i < nd->n; i++) {
        if (i > 0 && a[i - 1] >= a[i]) return cx->why = "keys out of order", -1;
        if ((has_lo && a[i] < lo) || (has_hi && a[i] >= hi)) return cx->why = "key outside its separators", -1;
    }
    if (nd->leaf) {
        cx->keys += nd->n;
        return 0;
    }
    for (unsigned i = 0; i <= nd->n; i++) {
        uint64_t clo = i > 0 ? a[i - 1] : lo, chi = i < nd->n ? a[i] : hi;
        int chl = i > 0 ? 1 : has_lo, chh = i < nd->n ? 1 : has_hi;
        if (check_node(nd->u.in.child[i], depth + 1, height, 0, clo, chl, chi, chh, cx)) return -1;
    }
    return 0;
}

int kvt__u64set_check(const kvt__u64set_t *s, const char **why) {
    check_ctx_t cx = {0, 0, NULL};
    if (s->root == NULL) {
        if (s->height != 0 || s->count != 0) cx.why = "empty set with height or count";
    } else if (s->height == 0 || s->height > KVT_U64SET_MAX_HEIGHT) {
        cx.why = "bad height";
    } else if (check_node(s->root, 0, s->height, 1, 0, 0, 0, 0, &cx) == 0 && cx.keys != s->count) {
        cx.why = "count differs from keys";
    }
    if (why) *why = cx.why;
    return cx.why ? KVT_ECORRUPT : KVT_OK;
}
