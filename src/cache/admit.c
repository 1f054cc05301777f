/* Admission: a request's life (kvt_cache_admit), one step a function:
 *
 *   match and lock   longest cached prefix: L1 pages, then pages only in L2;
 *                    the matched node and its ancestors are locked
 *   reserve          one L1 allocation for the L2 pages to load and the new
 *                    pages; if it would leave less than half the free-room
 *                    target, evict back to the full target (evict.c)
 *   load             L2 -> L1 copies for the L2 part, sources pinned; waited
 *                    for (the request needs its pages)
 *   insert           the new pages below the match, in L1
 *   fill the result  the usable prefix, the L1 ids, the counters
 *
 * Backups: write_through_selective backs up the pages of nodes that just
 * reached N hits (at admit); write_through backs up the new pages at
 * kvt_cache_commit, once the forward pass has written them.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache-int.h"
#include "kvtier/error.h"
#include "../core/check-int.h"
#include "../core/mem-int.h"


/* ---- admission --------------------------------------------------------------------- */

/* Leading pages in L1 on the path from the root to `end`. */
static uint64_t l1_prefix(kvt_cache_t *c, kvt_rnode_t *end) {
    uint64_t k = 0;
    for (kvt_rnode_t *x = end; x != kvt__radix_root(c->tree); x = x->parent) k += x->n_l1;
    return k;
}

/* Pages past the L1 prefix along the path to `end` that have no L1 page yet
 * (the others were loaded before, and wait for the pages above them). */
static uint64_t pages_to_load(kvt_cache_t *c, kvt_rnode_t *end) {
    uint64_t k = 0;
    for (kvt_rnode_t *x = end; x != kvt__radix_root(c->tree) && x->n_l1 < x->npages; x = x->parent)
        for (uint32_t i = x->n_l1; i < x->npages; i++) k += x->pages[i].l1 == KVT_NO_PAGE;
    return k;
}

/* Loads the matched pages that have no L1 page (they follow the L1 prefix
 * along the path to x) into the L1 pages ids[*j..), top-down: the pages
 * above x first. Recursion depth: the nodes past the L1 prefix. */
static void load_path(kvt_cache_t *c, kvt_rnode_t *x, const uint32_t *ids, uint64_t *j, uint64_t from_l3[2]) {
    if (x == kvt__radix_root(c->tree) || x->n_l1 == x->npages) return; /* all above are in L1 too */
    load_path(c, x->parent, ids, j, from_l3);
    for (uint32_t i = x->n_l1; i < x->npages; i++) {
        if (x->pages[i].l1 != KVT_NO_PAGE) continue;
        if (c->l3.flags) { /* a page prefetched from L3, served for the first time */
            unsigned f = kvt__l3_served(c, x->pages[i].l2);
            from_l3[0] += (f & KVT__L3_FRESH) != 0;
            from_l3[1] += (f & KVT__L3_FOREIGN) != 0;
        }
        kvt__radix_begin_load(c->tree, x, i, ids[*j]);
        kvt__cache_submit(c, OP_LOAD, ids[*j], x->pages[i].l2);
        c->st.loads++;
        (*j)++;
    }
}

/* load_path when copies are made at once (kvt__cache_backups_at_once, and
 * so no L3): the same loads, in the same order, a node at a time. */
static void load_path_at_once(kvt_cache_t *c, kvt_rnode_t *x, const uint32_t *ids, uint64_t *j) {
    if (x == kvt__radix_root(c->tree) || x->n_l1 == x->npages) return;
    load_path_at_once(c, x->parent, ids, j);
    uint32_t k = kvt__cache_load_node_at_once(c, x, ids + *j);
    c->st.loads += k;
    *j += k;
}

/* A load on the path to `end` failed: pages below it that did load cannot
 * join the L1 prefix (nothing above them will load now), so their L1 pages
 * go back rather than sit where no eviction reaches them. */
static void unstrand(kvt_cache_t *c, kvt_rnode_t *end) {
    for (kvt_rnode_t *x = end; x != kvt__radix_root(c->tree) && x->n_l1 < x->npages; x = x->parent)
        for (uint32_t i = x->n_l1; i < x->npages; i++)
            if (x->pages[i].l1 != KVT_NO_PAGE && !(x->pages[i].flags & KVT_PAGE_H2D))
                kvt__cache_give_back_l1(c, kvt__radix_unload(c->tree, x, i));
}

/* write_through_selective: back up the L1 pages of nodes on the path that
 * have reached the hit threshold and lack a backup (a backup that found no
 * L2 room, or was reclaimed, is made again on the node's next hit). */
static void selective_backups(kvt_cache_t *c, kvt_rnode_t *end) {
    for (kvt_rnode_t *x = end; x != kvt__radix_root(c->tree); x = x->parent) {
        if (x->hits < c->cfg.write_through_hits || x->n_shadow == x->n_l1) continue; /* cold, or backed up */
        for (uint32_t i = 0; i < x->n_l1; i++)
            if (x->pages[i].l2 == KVT_NO_PAGE && !kvt__cache_backup(c, x, i)) return;
    }
}

/* The last m pages of x that lack an L2 copy. */
static uint64_t lacking_copies(const kvt_rnode_t *x, uint32_t m) {
    uint64_t k = 0;
    for (uint32_t i = x->npages - m; i < x->npages; i++) k += x->pages[i].l2 == KVT_NO_PAGE;
    return k;
}

/* write_through: backs up the `count` pages that end at node `last` (the
 * new pages of one admission, in one or two nodes) that lack a copy. When L2
 * has room for only some, the leading ones get it. Pages go tail first, the
 * q-th from the top of those lacking a copy taking l2[q]; a node's pages
 * that lack one lie in runs (nearly always one: new pages have no copy),
 * found by a second read only when some page has a copy, and, made at once,
 * backed up a run a call. */
static void write_through(kvt_cache_t *c, kvt_rnode_t *last, uint64_t count) {
    uint64_t need = 0, j = count;
    for (kvt_rnode_t *x = last; j > 0; x = x->parent) {
        uint32_t m = j < x->npages ? (uint32_t)j : x->npages;
        need += lacking_copies(x, m);
        j -= m;
    }
    uint32_t *l2 = c->scratch + c->scratch_cap / 2;
    uint64_t got = kvt__cache_take_l2(c, need, l2);
    bool at_once = kvt__cache_backups_at_once(c), /* page ids only: each backup is done as it is made */
        none = need == count; /* none has a copy: each node's part is one run, not read again */
    j = count;
    for (kvt_rnode_t *x = last; j > 0 && need > 0; x = x->parent) {
        uint32_t m = j < x->npages ? (uint32_t)j : x->npages, end = x->npages - m, i = x->npages;
        j -= m;
        while (i > end) {
            if (!none && x->pages[i - 1].l2 != KVT_NO_PAGE) { /* has a copy */
                i--;
                continue;
            }
            uint32_t hi = i;
            if (none) i = end;
            while (i > end && x->pages[i - 1].l2 == KVT_NO_PAGE) i--;
            need -= hi - i; /* pages i .. hi - 1 lack a copy: page p is the (need + p - i)-th, backed up below got */
            if (need >= got) continue;
            uint32_t top = got - need < hi - i ? i + (uint32_t)(got - need) : hi;
            if (at_once) {
                kvt__cache_back_up_run_at_once(c, x, i, top - i, l2 + need);
                continue;
            }
            for (uint32_t p = top; p-- > i;) {
                kvt__radix_begin_backup(c->tree, x, p, l2[need + (p - i)]);
                kvt__cache_submit(c, OP_BACKUP, x->pages[p].l1, l2[need + (p - i)]);
            }
        }
    }
    c->st.backups += got;
}

/* Inserts npages new pages below `at`: one node, or two when the policy
 * protects only the leading ones. Returns the deepest new node, or NULL (no
 * memory) with the pages' ids not inserted from *inserted on. */
static kvt_rnode_t *insert_pages(kvt_cache_t *c, kvt_rnode_t *at, uint32_t children, uint32_t ns,
                                 const int32_t *tokens, uint64_t npages, const uint32_t *ids, int32_t priority,
                                 uint64_t *inserted) {
    uint64_t prot = kvt__policy_protected_prefix(c, at, children, ns, tokens, npages), done = 0;
    kvt_rnode_t *n = at;
    while (done < npages) {
        uint64_t k = done < prot ? prot - done : npages - done;
        kvt_rnode_t *nn;
        if (kvt__radix_insert(c->tree, n, ns, tokens + done * c->cfg.page_tokens, k, ids + done, c->clock, priority,
                              &nn) != KVT_OK)
            break;
        kvt__policy_on_insert(c, nn, done < prot);
        n = nn;
        done += k;
    }
    *inserted = done;
    return done ? n : NULL;
}

/* One admission on its way through the steps. */
typedef struct admission {
    uint32_t ns;
    const int32_t *tokens;
    uint64_t npages;
    int32_t priority;
    kvt__match_t m;     /* the match: its node stays locked until another holds the request */
    uint32_t children;  /* the matched node's children when matched (policy.c) */
    uint64_t cont;      /* matched pages to load back (the L2 part) */
    uint64_t room;      /* L1 pages reserved: cont for the loads, then the new ones */
    uint64_t loaded;    /* matched pages that came back from L2 */
    uint64_t from_l3[2]; /* ... of the loads, pages prefetched from L3, and of those, not put by us */
    uint64_t ins;       /* new pages inserted */
    uint32_t *ids;      /* the reserved L1 pages (the cache's scratch) */
    kvt_rnode_t *held;  /* the node the request holds locked */
} admission_t;

/* Step 1: the longest cached prefix, counted as hits and locked. */
static int match_and_lock(kvt_cache_t *c, admission_t *a) {
    if (c->ncorrupt) kvt__cache_purge_corrupt(c);
    int rc = kvt__radix_match(c->tree, a->ns, a->tokens, a->npages, c->clock + 1, &a->m);
    if (rc != KVT_OK) return rc;
    c->clock++;
    for (kvt_rnode_t *x = a->m.node; x != kvt__radix_root(c->tree); x = x->parent) kvt__policy_on_hit(c, x, a->priority);
    kvt__radix_lock(c->tree, a->m.node, +1);
    a->children = a->m.node->nchildren;
    a->held = a->m.node;
    return KVT_OK;
}

/* Step 2: one L1 reservation for the loads and the new pages, room planned
 * first. The L2 part loads whole or not at all; what finds no room stays
 * uncached (counted). */
static void reserve(kvt_cache_t *c, admission_t *a) {
    a->cont = pages_to_load(c, a->m.node);
    uint64_t need = a->cont + a->npages - a->m.pages;
    if (need > 0) kvt__cache_plan_l1(c, need);
    if (kvt__cache_flush(c) != KVT_OK) need = 0; /* no memory to return pages: take nothing new */
    uint64_t room = need <= c->l1_free ? need : c->l1_free;
    if (room < a->cont) room = 0;
    if (room < need) c->st.l1_alloc_failures++;
    a->ids = c->scratch;
    if (room > 0 && kvt_laneal_reserve(c->l1, room, a->ids) != KVT_OK) {
        c->st.l1_alloc_failures++;
        room = 0;
    }
    if (room == 0) a->cont = 0;
    c->l1_free -= room;
    kvt__cache_fold_ids(c, 5ull << 40, a->ids, room);
    a->room = room;
    a->ins = room > a->cont ? room - a->cont : 0;
}

/* Step 3: the L2 part back into L1, waited for. A failed load lets nothing
 * below it in: the pages reserved for the new part go back. */
static void load(kvt_cache_t *c, admission_t *a) {
    uint64_t used = 0;
    if (a->cont && kvt__cache_backups_at_once(c)) { /* page ids only: each load is done as it is made */
        kvt__cache_wait_kind(c, OP_LOAD); /* (completions queued before them land first, as the wait below would apply them) */
        load_path_at_once(c, a->m.node, a->ids, &used);
    } else {
        if (a->cont) load_path(c, a->m.node, a->ids, &used, a->from_l3);
        kvt__cache_wait_kind(c, OP_LOAD);
    }
    a->loaded = l1_prefix(c, a->m.node) - a->m.l1_pages;
    /* pages from L3 sit below the others (prefetches insert below the match): a failed load loses them first */
    uint64_t lost = a->cont - a->loaded;
    a->from_l3[0] = a->from_l3[0] > lost ? a->from_l3[0] - lost : 0;
    if (a->from_l3[1] > a->from_l3[0]) a->from_l3[1] = a->from_l3[0];
    if (a->m.l1_pages + a->loaded >= a->m.pages) return;
    unstrand(c, a->m.node);
    if (a->ins > 0) {
        for (uint64_t i = 0; i < a->ins; i++) kvt__cache_give_back_l1(c, a->ids[a->cont + i]);
        a->ins = 0;
        c->st.l1_alloc_failures++;
    }
}

/* Step 4: the new pages below the match; the lock moves down to them. */
static void insert(kvt_cache_t *c, admission_t *a) {
    if (a->ins == 0) return;
    uint64_t done;
    kvt_rnode_t *nn = insert_pages(c, a->m.node, a->children, a->ns, a->tokens + a->m.pages * c->cfg.page_tokens, a->ins,
                                   a->ids + a->cont, a->priority, &done);
    if (done < a->ins) { /* no memory for a node: the rest goes back */
        for (uint64_t i = done; i < a->ins; i++) kvt__cache_give_back_l1(c, a->ids[a->cont + i]);
        a->ins = done;
        c->st.l1_alloc_failures++;
    }
    if (a->ins == 0) return;
    kvt__radix_lock(c->tree, nn, +1);
    kvt__radix_lock(c->tree, a->m.node, -1);
    a->held = nn;
}

/* Step 5: what the caller gets: the usable prefix (the request's leading
 * pages in L1), their L1 ids root to leaf, and the counters. */
static void fill_result(kvt_cache_t *c, const admission_t *a, uint64_t ntokens, uint32_t *l1_ids, kvt_cache_req_t *req) {
    uint32_t pt = c->cfg.page_tokens;
    req->l3_hit_pages = a->from_l3[0];
    req->l3_foreign_pages = a->from_l3[1];
    req->l2_hit_pages = a->loaded - a->from_l3[0];
    req->new_pages = a->ins;
    req->committed = a->ins == 0;
    req->node = a->held;
    req->pages = l1_prefix(c, a->held);
    req->l1_hit_pages = a->m.l1_pages;
    req->uncached_pages = a->npages - req->pages;
    if (l1_ids) {
        uint64_t j = 0;
        for (kvt_rnode_t *x = a->held; x != kvt__radix_root(c->tree); x = x->parent) j += x->npages;
        for (kvt_rnode_t *x = a->held; x != kvt__radix_root(c->tree); x = x->parent)
            for (uint32_t i = x->npages; i-- > 0;)
                if (--j < req->pages) l1_ids[j] = x->pages[i].l1;
    }
    c->held++;
    c->st.requests++;
    c->st.tokens += ntokens;
    c->st.l1_hit_tokens += a->m.l1_pages * pt;
    c->st.l2_hit_tokens += req->l2_hit_pages * pt;
    c->st.l3_hit_tokens += req->l3_hit_pages * pt;
    c->st.l3_foreign_hit_tokens += req->l3_foreign_pages * pt;
}

int kvt_cache_admit(kvt_cache_t *c, uint32_t ns, const int32_t *tokens, uint64_t ntokens, int32_t priority,
                    uint32_t *l1_ids, kvt_cache_req_t *req) {
    return kvt_cache_admit_prefetched(c, 0, ns, tokens, ntokens, priority, l1_ids, req);
}

int kvt_cache_admit_prefetched(kvt_cache_t *c, uint64_t id, uint32_t ns, const int32_t *tokens, uint64_t ntokens,
                               int32_t priority, uint32_t *l1_ids, kvt_cache_req_t *req) {
    if (c == NULL || req == NULL || (tokens == NULL && ntokens > 0)) return KVT_EINVAL;
    kvt_cache_req_t pre = {0};
    if (id != 0) { /* the prefetch first: what arrived joins the tree, then admission finds it in L2 */
        int rc = kvt__l3_finish(c, id, ns, tokens, ntokens, priority, &pre);
        if (rc != KVT_OK) return rc;
    }
    memset(req, 0, sizeof(*req));
    req->prefetch = pre.prefetch;
    req->prefetch_wait_ns = pre.prefetch_wait_ns;
    admission_t a = {.ns = ns, .tokens = tokens, .npages = ntokens / c->cfg.page_tokens, .priority = priority};
    int rc = match_and_lock(c, &a);
    if (rc != KVT_OK) return rc;
    reserve(c, &a);
    load(c, &a);
    insert(c, &a);
    if (c->cfg.write_policy == KVT_WRITE_THROUGH_SELECTIVE && c->l2) selective_backups(c, a.m.node);
    if (c->l3.flags && c->cfg.l3_write_policy == KVT_WRITE_THROUGH_SELECTIVE) kvt__l3_selective(c, a.m.node);
    kvt_cache_poll(c);
    kvt__cache_flush(c);
    fill_result(c, &a, ntokens, l1_ids, req);
    return KVT_OK;
}

/* Whether req's node is in c's tree: another cache's request is refused,
 * not followed (its lock walk never met this root). O(depth), as the lock
 * walk that follows. */
static bool in_tree(kvt_cache_t *c, const kvt_cache_req_t *req) {
    const kvt_rnode_t *x = req->node;
    while (x->parent) x = x->parent;
    return x == kvt__radix_root(c->tree);
}

int kvt_cache_commit(kvt_cache_t *c, kvt_cache_req_t *req) {
    if (c == NULL || req == NULL || req->node == NULL || !in_tree(c, req)) return KVT_EINVAL;
    if (req->committed) return KVT_OK;
    req->committed = true;
    if (c->cfg.write_policy == KVT_WRITE_THROUGH && c->l2) {
        write_through(c, req->node, req->new_pages);
        kvt_cache_poll(c);
        kvt__cache_flush(c);
    }
    return KVT_OK;
}

int kvt_cache_release(kvt_cache_t *c, kvt_cache_req_t *req) {
    if (c == NULL || req == NULL || req->node == NULL || c->held == 0 || !in_tree(c, req)) return KVT_EINVAL;
    kvt_cache_commit(c, req);
    kvt__radix_lock(c->tree, req->node, -1);
    req->node = NULL;
    c->held--;
    return KVT_OK;
}

/* Whether the request's new pages can leave the tree: the nodes holding
 * them (its held node and those above it, new_pages pages in all) are a
 * chain that only this request holds, every page in L1 alone, nothing in
 * flight; and what hangs below them beside the chain, pages that requests
 * admitted after this one and released since left (they matched these
 * pages before this request committed, against commit's rule: their KV was
 * computed over pages that hold none), is held by no one, pinned by
 * nothing, with nothing in flight. True for every uncommitted request while
 * the engine keeps commit's rule (nothing below). */
static bool abortable(kvt_cache_t *c, const kvt_cache_req_t *req) {
    uint64_t left = req->new_pages;
    const kvt_rnode_t *chain = NULL; /* the chain's node below x */
    for (const kvt_rnode_t *x = req->node; left > 0; chain = x, x = x->parent) {
        if (x == kvt__radix_root(c->tree) || x->lock != 1 || x->npages > left || x->n_l1 != x->npages || x->pin)
            return false;
        for (uint32_t i = 0; i < x->npages; i++)
            if (x->pages[i].l2 != KVT_NO_PAGE || x->pages[i].flags) return false;
        for (const kvt_rnode_t *ch = x->first_child; ch; ch = ch->next_sibling)
            if (ch != chain && !kvt__cache_free_below(ch)) return false;
        left -= x->npages;
    }
    return true;
}

int kvt_cache_abort(kvt_cache_t *c, kvt_cache_req_t *req) {
    if (c == NULL || req == NULL || req->node == NULL || c->held == 0 || !in_tree(c, req)) return KVT_EINVAL;
    if (req->committed) return kvt_cache_release(c, req);
    if (!abortable(c, req)) return KVT_EBUSY;
    kvt__radix_lock(c->tree, req->node, -1);
    kvt_rnode_t *x = req->node;
    uint64_t below = 0;
    for (uint64_t left = req->new_pages; left > 0;) { /* leaf first: each node is a leaf when its turn comes */
        kvt_rnode_t *up = x->parent;
        uint32_t k = x->npages;
        while (x->first_child) below += kvt__cache_drop_subtree(c, x->first_child); /* (the chain's is gone) */
        kvt__policy_on_drop(c, x, k);
        kvt__radix_trim_l1_tail(c->tree, x, k, kvt__cache_l1_back_end(c)); /* (x is freed) */
        kvt__cache_gave_back_l1(c, k);
        left -= k;
        x = up;
    }
    c->st.aborted_pages += req->new_pages + below;
    req->node = NULL;
    c->held--;
    kvt__cache_flush(c);
    return KVT_OK;
}

uint64_t kvt_cache_restore_room(kvt_cache_t *c) {
    if (c == NULL) return 0;
    if (c->ncorrupt) kvt__cache_purge_corrupt(c);
    uint64_t before = c->st.l1_evicted_pages + c->st.l2_evicted_pages;
    if (c->l1_free < c->l1_target) kvt__cache_plan_l1_to(c, 0, c->l1_target);
    if (c->l2 && c->l2_free < c->l2_target) kvt__cache_plan_l2_to(c, 0, c->l2_target);
    kvt_cache_poll(c);
    kvt__cache_flush(c);
    return c->st.l1_evicted_pages + c->st.l2_evicted_pages - before;
}

