/* The cache's copies (backups L1 -> L2, loads L2 -> L1) as operations.
 *
 * A copy is submitted as an operation and completes later; kvt_cache_poll
 * applies completions on this thread. Without a data plane each copy
 * completes at once (page ids only): queued as done, applied at the next
 * poll; a commit's write-through backups, the bulk of them, skip the queue
 * (kvt__cache_back_up_run_at_once) unless copies are failed by a test or pages go
 * on to L3. With one (kvt_cache_attach), copies are
 * queued per direction and handed to the transfer engine as batches when the
 * cache polls or waits; workers never touch the tree. Waiting is for what a
 * step needs (its loads; an evicted page's backup).
 *
 *   submit --> pend[kind] --flush_copies--> engine batch --worker--> done
 *                                                                     |
 *   tree updated (resident, or failed: nothing moves) <--apply-- poll
 *
 * Freed page ids go to a buffer first and back to their allocator at the end
 * of the round (kvt__cache_flush); a free that fails for lack of memory keeps
 * them in the buffer for the next round, so no page is ever lost.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/abi-int.h"
#include "cache-int.h"
#include "kvtier/error.h"
#include "../core/check-int.h"
#include "../core/mem-int.h"
#include "../xfer/xfer-int.h"


uint32_t *kvt__cache_l1_back_end(kvt_cache_t *c) { return &c->l1_back.id[c->l1_back.n]; }

void kvt__cache_gave_back_l1(kvt_cache_t *c, uint32_t k) {
    kvt__cache_fold_ids(c, 1ull << 40, &c->l1_back.id[c->l1_back.n], k);
    c->l1_back.n += k;
    c->l1_free += k;
}

void kvt__cache_give_back_l1(kvt_cache_t *c, uint32_t id) {
    *kvt__cache_l1_back_end(c) = id;
    kvt__cache_gave_back_l1(c, 1);
}

uint32_t *kvt__cache_l2_back_end(kvt_cache_t *c) { return &c->l2_back.id[c->l2_back.n]; }

void kvt__cache_gave_back_l2(kvt_cache_t *c, uint32_t k) {
    uint32_t *ids = kvt__cache_l2_back_end(c);
    if (c->ncorrupt == 0 && c->cp.l2_freed == NULL && c->l3.flags == NULL) { /* the loop below, with no hook to call */
        kvt__cache_fold_ids(c, 2ull << 40, ids, k);
        c->l2_back.n += k;
        c->l2_free += k;
        return;
    }
    uint32_t kept = 0; /* the ids that go back now, kept in place */
    for (uint32_t i = 0; i < k; i++) {
        uint32_t id = ids[i];
        kvt__cache_fold(c, 2ull << 40 | id);
        if (c->ncorrupt) kvt__cache_forget_corrupt(c, id);
        if (c->cp.l2_freed) c->cp.l2_freed(c->cp.arg, id);
        c->l2_free++;
        if (c->l3.flags && kvt__l3_hold(c, id)) continue; /* a store call reads or writes it: back when it completes */
        ids[kept++] = id;
    }
    c->l2_back.n += kept;
}

void kvt__cache_give_back_l2(kvt_cache_t *c, uint32_t id) {
    *kvt__cache_l2_back_end(c) = id;
    kvt__cache_gave_back_l2(c, 1);
}

/* The end of the ids from i on that go on from `first` by `step` (+1 or -1):
 * id[j] = first + step (j - i), that is id[j] - step j the same for all. */
static inline size_t run_end(const uint32_t *id, size_t i, size_t n, uint64_t first, int64_t step) {
    uint64_t d = (uint64_t)step, want = first - d * i; /* (mod 2^64, like every sum here) */
    while (i < n && id[i] - d * i == want) i++;
    return i;
}

/* Returns the buffered ids to the allocators. */
int kvt__cache_flush(kvt_cache_t *c) {
    int rc = KVT_OK;
    if (c->l1_back.n) {
        rc = kvt_laneal_free(c->l1, c->l1_back.id, c->l1_back.n);
        if (rc == KVT_OK) c->l1_back.n = 0;
    }
    if (c->l2_back.n && rc == KVT_OK) {
        /* ids as they came make runs: a node's pages leave tail first, its L2 ids mostly one run, so
         * an id extends the run before it at either end (one linear pass; the allocator sorts the
         * runs and merges neighbours, so no sort of the ids is needed first). A run that grows one
         * way goes on growing that way: its ids are found by run_end, not an id a three-way branch. */
        const uint32_t *id = c->l2_back.id;
        size_t n = c->l2_back.n, k = 0, i = 1;
        kvt_run_t *runs = c->l2_runs, r = {id[0], 1}; /* the run being built, in registers */
        while (i < n) {
            size_t e;
            if ((e = run_end(id, i, n, (uint64_t)r.start + r.len, 1)) > i) r.len += (uint32_t)(e - i);
            else if (r.start > 0 && (e = run_end(id, i, n, r.start - 1, -1)) > i) r.start -= (uint32_t)(e - i), r.len += (uint32_t)(e - i);
            else runs[k++] = r, r = (kvt_run_t){id[e++], 1};
            i = e;
        }
        runs[k++] = r;
        rc = kvt_extalloc_free(c->l2, runs, k);
        if (rc == KVT_OK) c->l2_back.n = 0;
    }
    return rc;
}

/* ---- copies ------------------------------------------------------------------ */

/* A copy's completion: the page becomes resident (or, when it failed, the
 * reserved page goes back and the page stays where it was). */
static void apply(kvt_cache_t *c, op_kind_t kind, uint32_t l1, uint32_t l2, bool ok) {
    kvt_rnode_t *n;
    uint32_t idx;
    c->dp.inflight[kind]--;
    if (!ok) c->st.failed_copies++;
    /* the page is still in the tree: nothing in flight leaves it */
    if (kind == OP_BACKUP) {
        bool found = kvt__radix_locate_l2(c->tree, l2, &n, &idx);
        KVT_ASSERT(found);
        if (!found) return;
        kvt__radix_end_backup(c->tree, n, idx, ok);
        if (!ok) kvt__cache_give_back_l2(c, l2);
        else if (c->l3.flags && c->cfg.l3_write_policy == KVT_WRITE_THROUGH) kvt__l3_put(c, n, idx); /* landed in L2 */
    } else {
        bool found = kvt__radix_locate_l1(c->tree, l1, &n, &idx);
        KVT_ASSERT(found);
        if (!found) return;
        kvt__radix_end_load(c->tree, n, idx, ok);
        if (!ok) kvt__cache_give_back_l1(c, l1);
    }
}

/* L1 page p of the cache is page (p mod C) x R + p div C of the L1 tier: all
 * lanes, rank-major (the CP read view; the identity for one lane). */
static uint32_t l1_tier_page(const kvt_cache_t *c, uint32_t p) {
    return (uint32_t)kvt_lane_major(p, c->cfg.l1_lanes, c->lane_pages);
}

static uint32_t l1_cache_page(const kvt_cache_t *c, uint32_t q) {
    return (uint32_t)kvt_lane_logical(q, c->cfg.l1_lanes, c->lane_pages);
}

/* The user tag of the cache's batches: the engine is the cache's alone, and
 * a completion that is not the cache's is a caller's mistake. */
static uint64_t xfer_tag(const kvt_cache_t *c, op_kind_t k) { return (uint64_t)(uintptr_t)c << 1 | (uint64_t)k; }

/* Hands the pending copies to the engine, one batch per direction. A batch
 * the engine refuses fails at once (its pages stay where they were). */
static void flush_copies(kvt_cache_t *c) {
    for (int k = 0; c->dp.xf && k < 2; k++) {
        if (c->dp.npend[k] == 0) continue;
        unsigned src = k == OP_BACKUP ? c->dp.xf_l1 : c->dp.xf_l2, dst = k == OP_BACKUP ? c->dp.xf_l2 : c->dp.xf_l1;
        if (kvt_xfer_submit(c->dp.xf, src, dst, c->dp.pend[k], c->dp.npend[k], xfer_tag(c, (op_kind_t)k), NULL) != KVT_OK)
            for (size_t i = 0; i < c->dp.npend[k]; i++) {
                const kvt_xfer_copy_t *cp = &c->dp.pend[k][i];
                apply(c, (op_kind_t)k, l1_cache_page(c, k == OP_BACKUP ? cp->src_page : cp->dst_page),
                      k == OP_BACKUP ? cp->dst_page : cp->src_page, false);
            }
        c->dp.npend[k] = 0;
    }
}

/* Applies the engine's completed batches, waiting up to timeout_ns for one. */
static int poll_engine(kvt_cache_t *c, uint64_t timeout_ns) {
    kvt_xfer_done_t d[16];
    int k = kvt_xfer_poll(c->dp.xf, d, 16, timeout_ns), applied = 0;
    for (int b = 0; b < k; b++) {
        op_kind_t kind = (op_kind_t)(d[b].user & 1);
        KVT_ASSERT(d[b].user == xfer_tag(c, kind));
        if (d[b].user != xfer_tag(c, kind)) continue;
        if (d[b].status == KVT_ECORRUPT) {
            c->st.integrity_failures++;
            for (size_t i = 0; kind == OP_LOAD && i < d[b].n; i++) /* the load that read it */
                if (d[b].copies[i].src_page == d[b].bad_page)
                    kvt__cache_note_corrupt(c, l1_cache_page(c, d[b].copies[i].dst_page), (uint32_t)d[b].bad_page);
        }
        for (size_t i = 0; i < d[b].n; i++, applied++) {
            const kvt_xfer_copy_t *cp = &d[b].copies[i];
            apply(c, kind, l1_cache_page(c, kind == OP_BACKUP ? cp->src_page : cp->dst_page),
                  kind == OP_BACKUP ? cp->dst_page : cp->src_page, d[b].status == KVT_OK);
        }
    }
    return applied;
}

#define WAIT_NS 100000000ull /* one wait; callers loop until what they wait for lands */

/* Applies the copies that completed at once (no data plane, or copies
 * another process of the CP group makes). */
static int apply_done(kvt_cache_t *c) {
    int applied = 0;
    for (size_t i = 0; i < c->dp.ndone; i++, applied++)
        apply(c, (op_kind_t)c->dp.done[i].kind, c->dp.done[i].l1, c->dp.done[i].l2, c->dp.done[i].ok);
    c->dp.ndone = 0;
    return applied;
}

int kvt_cache_poll(kvt_cache_t *c) {
    if (c == NULL) return KVT_EINVAL;
    int applied = apply_done(c);
    if (c->dp.xf) {
        flush_copies(c);
        for (int k; (k = poll_engine(c, 0)) > 0;) applied += k;
    }
    if (c->l3.store) kvt__l3_poll(c, 0, true);
    return applied;
}

/* Waits until no copy of this kind is in flight (others land meanwhile). */
void kvt__cache_wait_kind(kvt_cache_t *c, op_kind_t kind) {
    apply_done(c);
    if (c->dp.xf == NULL) return;
    flush_copies(c);
    while (c->dp.inflight[kind] > 0) poll_engine(c, WAIT_NS);
}

/* Waits for the backups of pages [0, idx] of n (and applies whatever lands):
 * all of them, not only idx's, so that the rest of the round sees them
 * landed whatever the copy timing. */
void kvt__cache_wait_backups_upto(kvt_cache_t *c, kvt_rnode_t *n, uint32_t idx) {
    apply_done(c);
    if (c->dp.xf == NULL) return;
    flush_copies(c);
    for (uint32_t i = 0; i <= idx; i++)
        while (n->pages[i].flags & KVT_PAGE_D2H) poll_engine(c, WAIT_NS);
}

int kvt_cache_sync(kvt_cache_t *c) {
    if (c == NULL) return KVT_EINVAL;
    kvt__cache_wait_kind(c, OP_BACKUP);
    kvt__cache_wait_kind(c, OP_LOAD);
    kvt__l3_sync(c);
    return KVT_OK;
}

/* Whether this process makes the copy: all of them, except in a CP group,
 * where the I/O rank makes every backup and each rank the loads into its own
 * lane; the others complete at once here (their owner makes them). */
static bool makes(const kvt_cache_t *c, op_kind_t kind, uint32_t l1) {
    if (c->dp.xf == NULL) return false;
    if (c->cp.size == 0) return true;
    return kind == OP_BACKUP ? c->cp.io_rank : kvt_lane_of(l1, c->cfg.l1_lanes) == c->cp.rank;
}

/* A copy, as the digest records it when it is made. */
static uint64_t copy_value(op_kind_t kind, uint32_t l1, uint32_t l2) {
    return (uint64_t)(kind + 3) << 40 ^ (uint64_t)l1 << 20 ^ l2;
}
static void fold_copy(kvt_cache_t *c, op_kind_t kind, uint32_t l1, uint32_t l2) {
    kvt__cache_fold(c, copy_value(kind, l1, l2));
}

void kvt__cache_submit(kvt_cache_t *c, op_kind_t kind, uint32_t l1, uint32_t l2) {
    c->dp.inflight[kind]++;
    fold_copy(c, kind, l1, l2);
    if (kind == OP_BACKUP && c->cp.backup_started) c->cp.backup_started(c->cp.arg, l1, l2, ++c->dp.backup_seq);
    if (makes(c, kind, l1)) {
        if (c->cp.before_copy && c->cp.before_copy(c->cp.arg, kind == OP_LOAD, l1, l2, false) != KVT_OK) {
            flush_copies(c); /* nothing of ours may wait behind the hook's wait */
            int rc = c->cp.before_copy(c->cp.arg, kind == OP_LOAD, l1, l2, true);
            if (rc != KVT_OK) { /* the group failed: the copy fails here */
                if (c->dp.ndone == c->dp.done_cap) apply_done(c);
                c->dp.done[c->dp.ndone++] = (kvt__op_t){(uint8_t)kind, false, l1, l2};
                return;
            }
        }
        if (c->dp.npend[kind] == c->dp.pend_cap) flush_copies(c);
        uint32_t t1 = l1_tier_page(c, l1);
        c->dp.pend[kind][c->dp.npend[kind]++] = kind == OP_BACKUP ? (kvt_xfer_copy_t){t1, l2} : (kvt_xfer_copy_t){l2, t1};
        return;
    }
    if (c->dp.ndone == c->dp.done_cap) apply_done(c);
    bool ok = !(c->dp.fail_every && ++c->dp.submitted % c->dp.fail_every == 0);
    c->dp.done[c->dp.ndone++] = (kvt__op_t){(uint8_t)kind, ok, l1, l2};
}

void kvt__cache_back_up_run_at_once(kvt_cache_t *c, kvt_rnode_t *n, uint32_t lo, uint32_t k, const uint32_t *l2) {
    KVT_ASSERT(kvt__cache_backups_at_once(c) && k > 0);
    if (c->dp.ndone) apply_done(c); /* completions queued before them land first, as a poll would apply them */
    if (kvt__cache_folds(c)) { /* fold_copy of each, tail first: copy_value(OP_BACKUP, l1, l2) = tag ^ l1 << 20 ^ l2 (fold.c) */
        c->dg.sum += kvt__fold_backups_sum(copy_value(OP_BACKUP, 0, 0), n->pages + lo, l2, k, c->dg.n);
        c->dg.n += k;
    }
    kvt__radix_backups_done(c->tree, n, lo, k, l2);
}

uint32_t kvt__cache_load_node_at_once(kvt_cache_t *c, kvt_rnode_t *n, const uint32_t *l1) {
    KVT_ASSERT(kvt__cache_backups_at_once(c) && c->dp.ndone == 0);
    if (kvt__cache_folds(c)) {
        uint32_t j = 0;
        kvt__folds_t f = kvt__folds_begin(c); /* fold_copy of each, in page order */
        for (uint32_t i = n->n_l1; i < n->npages; i++)
            if (n->pages[i].l1 == KVT_NO_PAGE) kvt__folds_add(&f, copy_value(OP_LOAD, l1[j++], n->pages[i].l2));
        kvt__folds_end(c, f);
    }
    return kvt__radix_loads_done(c->tree, n, l1);
}

void kvt__cache_fail_copies(kvt_cache_t *c, uint64_t n) {
    c->dp.fail_every = n;
    c->dp.submitted = 0;
}

int kvt_cache_attach_cp(kvt_cache_t *c, kvt_xfer_t *x, kvt_tier_t *l1, unsigned l1_index, kvt_tier_t *l2,
                        unsigned l2_index, const kvt_cache_cp_t *user_cp) {
    kvt_cache_cp_t full = {.size = sizeof(full)}, *cp = user_cp ? &full : NULL;
    if (user_cp && kvt__abi_in(&full, sizeof(full), user_cp) != KVT_OK) return KVT_EINVAL;
    if (c == NULL || x == NULL || l1 == NULL || l1_index == l2_index || (c->l2 != NULL) != (l2 != NULL) ||
        kvt__xfer_tier(x, l1_index) != l1 || (l2 && kvt__xfer_tier(x, l2_index) != l2) || /* the indices name them */
        kvt_tier_geom(l1)->pages < c->cfg.l1_pages || (l2 && kvt_tier_geom(l2)->pages < c->cfg.l2_pages) ||
        c->cfg.l1_pages % c->cfg.l1_lanes != 0 || (cp && cp->rank >= c->cfg.l1_lanes))
        return KVT_EINVAL;
    /* a modeled L3 holds no bytes to load; a store reads its own tier, which must be the L2 the copies fill */
    if (c->cfg.l3_pages || (c->l3.store && kvt_store_tier(c->l3.store) != l2)) return KVT_EINVAL;
    if (c->l3.store && kvt_tier_sums(l2) && !kvt__xfer_checksums(x)) return KVT_EINVAL; /* every put refused */
    if (c->dp.taken && (c->dp.taken(c->dp.taken_by, x) || c->dp.taken(c->dp.taken_by, l1) ||
                        (l2 && c->dp.taken(c->dp.taken_by, l2))))
        return KVT_EINVAL; /* another data plane's engine or tier: its completions, or its slots over pages */
    /* busy: an engine with batches of someone else's would hand their completions to the cache */
    if (c->dp.xf || c->st.requests || c->dp.inflight[0] || c->dp.inflight[1] || kvt_xfer_pending(x)) return KVT_EBUSY;
    if (c->l2 == NULL) return KVT_EINVAL; /* without L2 there is nothing to copy */
    size_t cap = c->cfg.l1_pages < c->cfg.l2_pages ? c->cfg.l1_pages : c->cfg.l2_pages;
    for (int k = 0; k < 2; k++)
        if ((c->dp.pend[k] = kvt__malloc(cap * sizeof(kvt_xfer_copy_t))) == NULL) {
            kvt__free(c->dp.pend[0], cap * sizeof(kvt_xfer_copy_t));
            c->dp.pend[0] = NULL;
            return KVT_ENOMEM;
        }
    c->dp.pend_cap = cap;
    c->dp.xf = x;
    c->dp.l1_tier = l1;
    c->dp.l2_tier = l2;
    c->dp.xf_l1 = l1_index;
    c->dp.xf_l2 = l2_index;
    c->lane_pages = c->cfg.l1_pages / c->cfg.l1_lanes;
    if (cp) {
        c->cp = *cp;
        c->cp.size = sizeof(c->cp);
    }
    return KVT_OK;
}

int kvt_cache_attach(kvt_cache_t *c, kvt_xfer_t *x, kvt_tier_t *l1, unsigned l1_index, kvt_tier_t *l2,
                     unsigned l2_index) {
    return kvt_cache_attach_cp(c, x, l1, l1_index, l2, l2_index, NULL);
}

uint64_t kvt_cache_digest(const kvt_cache_t *c) { return c ? c->dg.sum : 0; }

uint64_t kvt_cache_lane_dealt(const kvt_cache_t *c, uint32_t lane) { return c ? kvt_laneal_lane_dealt(c->l1, lane) : 0; }

uint64_t kvt_cache_lane_pages(const kvt_cache_t *c, uint32_t lane) {
    if (c == NULL || lane >= c->cfg.l1_lanes) return 0;
    uint64_t size = kvt_lane_pages(c->cfg.l1_pages, c->cfg.l1_lanes, lane);
    uint64_t buffered = 0;
    for (size_t i = 0; i < c->l1_back.n; i++) buffered += kvt_lane_of(c->l1_back.id[i], c->cfg.l1_lanes) == lane;
    return size - kvt_laneal_lane_free(c->l1, lane) - buffered;
}

