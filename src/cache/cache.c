/* The cache: tiers, admission, planned eviction, copies.
 *
 * A request's life (kvt_cache_admit):
 *
 *   match     longest cached prefix: L1 pages, then pages only in L2
 *   lock      the matched node and its ancestors (nothing of it is evicted)
 *   plan      one L1 allocation for the L2 pages to load and the new pages;
 *             if it would leave less than half the free-room target, evict
 *             back to the full target (an eviction round)
 *   load      L2 -> L1 copies for the L2 part, sources pinned; waited for
 *   insert    the new pages below the match, in L1
 *   back up   write_through_selective: the pages of nodes that just reached
 *             N hits; write_through: the new pages, at kvt_cache_commit
 *
 * L1 eviction, one page at a time from the victim set's first node (its last
 * L1 page):
 *
 *        has an L2 copy?  -- yes -->  drop the L1 copy (the page lives in L2)
 *               | no
 *        last page of a leaf, and not write_back?  -- yes --> free it
 *               | no
 *        back it up (with the node's other pages lacking a copy, one batch;
 *        L2 room planned the same way), wait for it, drop the L1 copy
 *
 * L2 eviction: a leaf's page that lives only in L2 (freed), else an L2 copy of
 * a page that is still in L1 (a shadow: the page just loses its backup).
 *
 * Copies are submitted as operations and complete later; kvt_cache_poll
 * applies completions on this thread. Without a data plane each copy
 * completes at once (page ids only). With one (kvt_cache_attach), copies are
 * queued per direction and handed to the transfer engine as batches when the
 * cache polls or waits; workers never touch the tree. Waiting is for what a
 * step needs (its loads; an evicted page's backup), and an eviction round
 * starts by letting the backups in flight land, so decisions do not depend
 * on copy timing.
 *
 * Freed page ids go to a buffer first and back to their allocator at the end
 * of the round; a free that fails for lack of memory keeps them in the
 * buffer for the next round, so no page is ever lost.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache-int.h"
#include "kvtier/error.h"
#include "../core/check-int.h"
#include "../core/mem-int.h"

#define DONE_CAP 256

void kvt_cache_config_default(kvt_cache_config_t *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->size = sizeof(*cfg);
    cfg->page_tokens = 16;
    cfg->l1_pages = 65536;
    cfg->l2_pages = 262144;
    cfg->l1_lanes = 1;
    cfg->l1_free_room = 0.05;
    cfg->l2_free_room = 0.05;
    cfg->policy = KVT_POLICY_DEFAULT;
    cfg->write_policy = KVT_WRITE_THROUGH;
    cfg->write_through_hits = 2;
}

/* ---- id buffers -------------------------------------------------------------- */

static int idbuf_init(kvt__idbuf_t *b, uint64_t cap) {
    b->n = 0;
    b->cap = cap ? cap : 1;
    b->id = kvt__malloc(b->cap * sizeof(uint32_t));
    return b->id ? KVT_OK : KVT_ENOMEM;
}

static void idbuf_fini(kvt__idbuf_t *b) {
    kvt__free(b->id, b->cap * sizeof(uint32_t));
    b->id = NULL;
}

/* The running digest: order-sensitive, so two caches fed the same calls
 * agree on it only if they made the same decisions (CP ranks compare it). */
static void fold(kvt_cache_t *c, uint64_t v) { c->digest = (c->digest ^ v) * 0x100000001b3ull + 0x9e37; }

static void give_back_l1(kvt_cache_t *c, uint32_t id) {
    fold(c, 1ull << 40 | id);
    c->l1_back.id[c->l1_back.n++] = id;
    c->l1_free++;
}

static void forget_corrupt(kvt_cache_t *c, uint32_t l2);
static void note_corrupt(kvt_cache_t *c, uint32_t l2);

static void give_back_l2(kvt_cache_t *c, uint32_t id) {
    fold(c, 2ull << 40 | id);
    if (c->ncorrupt) forget_corrupt(c, id);
    if (c->cp.l2_freed) c->cp.l2_freed(c->cp.arg, id);
    c->l2_back.id[c->l2_back.n++] = id;
    c->l2_free++;
}

static int cmp_u32(const void *x, const void *y) {
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    return (a > b) - (a < b);
}

/* Returns the buffered ids to the allocators. */
static int flush(kvt_cache_t *c) {
    int rc = KVT_OK;
    if (c->l1_back.n) {
        rc = kvt_laneal_free(c->l1, c->l1_back.id, c->l1_back.n);
        if (rc == KVT_OK) c->l1_back.n = 0;
    }
    if (c->l2_back.n && rc == KVT_OK) {
        /* sorted ids make runs: one free call, coalesced */
        qsort(c->l2_back.id, c->l2_back.n, sizeof(uint32_t), cmp_u32);
        size_t k = 0;
        kvt_run_t *runs = c->l2_runs;
        for (size_t i = 0; i < c->l2_back.n; i++) {
            if (k > 0 && runs[k - 1].start + runs[k - 1].len == c->l2_back.id[i]) runs[k - 1].len++;
            else runs[k++] = (kvt_run_t){c->l2_back.id[i], 1};
        }
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
    c->inflight[kind]--;
    if (!ok) c->st.failed_copies++;
    /* the page is still in the tree: nothing in flight leaves it */
    if (kind == OP_BACKUP) {
        bool found = kvt__radix_locate_l2(c->tree, l2, &n, &idx);
        KVT_ASSERT(found);
        if (!found) return;
        kvt__radix_end_backup(c->tree, n, idx, ok);
        if (!ok) give_back_l2(c, l2);
    } else {
        bool found = kvt__radix_locate_l1(c->tree, l1, &n, &idx);
        KVT_ASSERT(found);
        if (!found) return;
        kvt__radix_end_load(c->tree, n, idx, ok);
        if (!ok) give_back_l1(c, l1);
    }
}

/* L1 page p of the cache is page (p mod C) x R + p div C of the L1 tier: all
 * lanes, rank-major (the CP read view; the identity for one lane). */
static uint32_t l1_tier_page(const kvt_cache_t *c, uint32_t p) {
    uint32_t C = c->cfg.l1_lanes;
    return (uint32_t)((p % C) * c->lane_pages + p / C);
}

static uint32_t l1_cache_page(const kvt_cache_t *c, uint32_t q) {
    return (uint32_t)((q % c->lane_pages) * c->cfg.l1_lanes + q / c->lane_pages);
}

/* The user tag of the cache's batches: the engine is the cache's alone, and
 * a completion that is not the cache's is a caller's mistake. */
static uint64_t xfer_tag(const kvt_cache_t *c, op_kind_t k) { return (uint64_t)(uintptr_t)c << 1 | (uint64_t)k; }

/* Hands the pending copies to the engine, one batch per direction. A batch
 * the engine refuses fails at once (its pages stay where they were). */
static void flush_copies(kvt_cache_t *c) {
    for (int k = 0; c->xf && k < 2; k++) {
        if (c->npend[k] == 0) continue;
        unsigned src = k == OP_BACKUP ? c->xf_l1 : c->xf_l2, dst = k == OP_BACKUP ? c->xf_l2 : c->xf_l1;
        if (kvt_xfer_submit(c->xf, src, dst, c->pend[k], c->npend[k], xfer_tag(c, (op_kind_t)k), NULL) != KVT_OK)
            for (size_t i = 0; i < c->npend[k]; i++) {
                const kvt_xfer_copy_t *cp = &c->pend[k][i];
                apply(c, (op_kind_t)k, l1_cache_page(c, k == OP_BACKUP ? cp->src_page : cp->dst_page),
                      k == OP_BACKUP ? cp->dst_page : cp->src_page, false);
            }
        c->npend[k] = 0;
    }
}

/* Applies the engine's completed batches, waiting up to timeout_ns for one. */
static int poll_engine(kvt_cache_t *c, uint64_t timeout_ns) {
    kvt_xfer_done_t d[16];
    int k = kvt_xfer_poll(c->xf, d, 16, timeout_ns), applied = 0;
    for (int b = 0; b < k; b++) {
        op_kind_t kind = (op_kind_t)(d[b].user & 1);
        KVT_ASSERT(d[b].user == xfer_tag(c, kind));
        if (d[b].user != xfer_tag(c, kind)) continue;
        if (d[b].status == KVT_ECORRUPT) {
            c->st.integrity_failures++;
            if (kind == OP_LOAD) note_corrupt(c, (uint32_t)d[b].bad_page);
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
    for (size_t i = 0; i < c->ndone; i++, applied++)
        apply(c, (op_kind_t)c->done[i].kind, c->done[i].l1, c->done[i].l2, c->done[i].ok);
    c->ndone = 0;
    return applied;
}

int kvt_cache_poll(kvt_cache_t *c) {
    if (c == NULL) return KVT_EINVAL;
    int applied = apply_done(c);
    if (c->xf) {
        flush_copies(c);
        for (int k; (k = poll_engine(c, 0)) > 0;) applied += k;
    }
    return applied;
}

/* Waits until no copy of this kind is in flight (others land meanwhile). */
static void wait_kind(kvt_cache_t *c, op_kind_t kind) {
    apply_done(c);
    if (c->xf == NULL) return;
    flush_copies(c);
    while (c->inflight[kind] > 0) poll_engine(c, WAIT_NS);
}

/* Waits for the backups of pages [0, idx] of n (and applies whatever lands):
 * all of them, not only idx's, so that the rest of the round sees them
 * landed whatever the copy timing. */
static void wait_backups_upto(kvt_cache_t *c, kvt_rnode_t *n, uint32_t idx) {
    apply_done(c);
    if (c->xf == NULL) return;
    flush_copies(c);
    for (uint32_t i = 0; i <= idx; i++)
        while (n->pages[i].flags & KVT_PAGE_D2H) poll_engine(c, WAIT_NS);
}

int kvt_cache_sync(kvt_cache_t *c) {
    if (c == NULL) return KVT_EINVAL;
    wait_kind(c, OP_BACKUP);
    wait_kind(c, OP_LOAD);
    return KVT_OK;
}

/* Whether this process makes the copy: all of them, except in a CP group,
 * where the I/O rank makes every backup and each rank the loads into its own
 * lane; the others complete at once here (their owner makes them). */
static bool makes(const kvt_cache_t *c, op_kind_t kind, uint32_t l1) {
    if (c->xf == NULL) return false;
    if (c->cp.size == 0) return true;
    return kind == OP_BACKUP ? c->cp.io_rank : l1 % c->cfg.l1_lanes == c->cp.rank;
}

static void submit(kvt_cache_t *c, op_kind_t kind, uint32_t l1, uint32_t l2) {
    c->inflight[kind]++;
    fold(c, (uint64_t)(kind + 3) << 40 ^ (uint64_t)l1 << 20 ^ l2);
    if (kind == OP_BACKUP && c->cp.backup_started) c->cp.backup_started(c->cp.arg, l1, l2, ++c->backup_seq);
    if (makes(c, kind, l1)) {
        if (c->cp.before_copy && c->cp.before_copy(c->cp.arg, kind == OP_LOAD, l1, l2, false) != KVT_OK) {
            flush_copies(c); /* nothing of ours may wait behind the hook's wait */
            int rc = c->cp.before_copy(c->cp.arg, kind == OP_LOAD, l1, l2, true);
            if (rc != KVT_OK) { /* the group failed: the copy fails here */
                if (c->ndone == c->done_cap) apply_done(c);
                c->done[c->ndone++] = (kvt__op_t){(uint8_t)kind, false, l1, l2};
                return;
            }
        }
        if (c->npend[kind] == c->pend_cap) flush_copies(c);
        uint32_t t1 = l1_tier_page(c, l1);
        c->pend[kind][c->npend[kind]++] = kind == OP_BACKUP ? (kvt_xfer_copy_t){t1, l2} : (kvt_xfer_copy_t){l2, t1};
        return;
    }
    if (c->ndone == c->done_cap) apply_done(c);
    bool ok = !(c->fail_every && ++c->submitted % c->fail_every == 0);
    c->done[c->ndone++] = (kvt__op_t){(uint8_t)kind, ok, l1, l2};
}

void kvt__cache_fail_copies(kvt_cache_t *c, uint64_t n) {
    c->fail_every = n;
    c->submitted = 0;
}

int kvt_cache_attach_cp(kvt_cache_t *c, kvt_xfer_t *x, kvt_tier_t *l1, unsigned l1_index, kvt_tier_t *l2,
                        unsigned l2_index, const kvt_cache_cp_t *cp) {
    if (c == NULL || x == NULL || l1 == NULL || l1_index == l2_index || (c->l2 != NULL) != (l2 != NULL) ||
        kvt_tier_geom(l1)->pages < c->cfg.l1_pages || (l2 && kvt_tier_geom(l2)->pages < c->cfg.l2_pages) ||
        c->cfg.l1_pages % c->cfg.l1_lanes != 0 ||
        (cp && (cp->size < sizeof(*cp) || cp->rank >= c->cfg.l1_lanes)))
        return KVT_EINVAL;
    if (c->xf || c->st.requests || c->inflight[0] || c->inflight[1]) return KVT_EBUSY;
    if (c->l2 == NULL) return KVT_EINVAL; /* without L2 there is nothing to copy */
    size_t cap = c->cfg.l1_pages < c->cfg.l2_pages ? c->cfg.l1_pages : c->cfg.l2_pages;
    for (int k = 0; k < 2; k++)
        if ((c->pend[k] = kvt__malloc(cap * sizeof(kvt_xfer_copy_t))) == NULL) {
            kvt__free(c->pend[0], cap * sizeof(kvt_xfer_copy_t));
            c->pend[0] = NULL;
            return KVT_ENOMEM;
        }
    c->pend_cap = cap;
    c->xf = x;
    c->xf_l1 = l1_index;
    c->xf_l2 = l2_index;
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

uint64_t kvt_cache_digest(const kvt_cache_t *c) { return c ? c->digest : 0; }

uint64_t kvt_cache_lane_dealt(const kvt_cache_t *c, uint32_t lane) { return c ? kvt_laneal_lane_dealt(c->l1, lane) : 0; }

uint64_t kvt_cache_lane_pages(const kvt_cache_t *c, uint32_t lane) {
    if (c == NULL || lane >= c->cfg.l1_lanes) return 0;
    uint64_t size = (c->cfg.l1_pages - lane + c->cfg.l1_lanes - 1) / c->cfg.l1_lanes; /* the lane allocator's split */
    uint64_t buffered = 0;
    for (size_t i = 0; i < c->l1_back.n; i++) buffered += c->l1_back.id[i] % c->cfg.l1_lanes == lane;
    return size - kvt_laneal_lane_free(c->l1, lane) - buffered;
}

/* ---- L2 ---------------------------------------------------------------------- */

/* Evicts one L2 page; false when nothing in L2 may go. */
/* The last page of leaf v, living only in L2, leaves the cache (v is freed
 * with its last page). */
static void trim_l2_tail(kvt_cache_t *c, kvt_rnode_t *v) {
    kvt__policy_on_trim(c, v);
    kvt_page_t pg = kvt__radix_trim(c->tree, v);
    give_back_l2(c, pg.l2);
    if (pg.l1 != KVT_NO_PAGE) give_back_l1(c, pg.l1); /* loaded, but stranded below a page not in L1 */
    c->st.dropped_pages++;
}

static bool evict_one_l2(kvt_cache_t *c) {
    kvt_rnode_t *v = kvt__radix_victim(c->tree, KVT_VSET_L2_HOST);
    if (v) { /* a leaf's page that lives only in L2 leaves the cache */
        trim_l2_tail(c, v);
        return true;
    }
    v = kvt__radix_victim(c->tree, KVT_VSET_L2_SHADOW);
    if (v == NULL) return false;
    uint32_t idx = v->n_l1;
    while (idx > 0 && !kvt__page_in_l2(&v->pages[idx - 1])) idx--; /* the last shadow */
    give_back_l2(c, kvt__radix_drop_l2(c->tree, v, idx - 1));
    c->st.shadows_reclaimed++;
    return true;
}

/* Plans room for n L2 pages: when the allocation would leave fewer than the
 * floor (half the target) free, one eviction round brings free room back to
 * n + target. The gap between floor and target is what batches rounds: a
 * round makes room for the next allocations too. */
static bool plan_l2_to(kvt_cache_t *c, uint64_t n, uint64_t floor) {
    if (c->l2_free >= n + floor) return false;
    wait_kind(c, OP_BACKUP); /* landed backups make shadows reclaimable: decisions never depend on copy timing */
    c->st.l2_evict_calls++;
    while (c->l2_free < n + c->l2_target) {
        if (!evict_one_l2(c)) {
            c->st.l2_room_misses++;
            break;
        }
        c->st.l2_evicted_pages++;
    }
    return true;
}

static void plan_l2(kvt_cache_t *c, uint64_t n) {
    c->st.l2_allocs++;
    if (plan_l2_to(c, n, c->l2_floor)) c->st.l2_allocs_evicting++;
}

/* Reserves up to n L2 pages (after planning); ids in out. Returns how many. */
static uint64_t take_l2(kvt_cache_t *c, uint64_t n, uint32_t *out) {
    if (c->l2 == NULL || n == 0) return 0;
    plan_l2(c, n);
    if (flush(c) != KVT_OK) return 0;
    if (n > c->l2_free) n = c->l2_free;
    if (n == 0) return 0;
    kvt_run_t *runs = c->l2_runs; /* flush is done with it; room for every L2 page */
    size_t k = 0;
    if (kvt_extalloc_reserve(c->l2, n, runs, n, &k) != KVT_OK) {
        c->st.l2_alloc_failures++;
        return 0;
    }
    uint64_t j = 0;
    for (size_t i = 0; i < k; i++)
        for (uint32_t p = 0; p < runs[i].len; p++) out[j++] = runs[i].start + p;
    c->l2_free -= n;
    for (uint64_t i = 0; i < n; i++) fold(c, 4ull << 40 | out[i]);
    return n;
}

/* Backs up page idx of n (in L1, no L2 copy): false when L2 has no room. */
static bool backup(kvt_cache_t *c, kvt_rnode_t *n, uint32_t idx) {
    uint32_t l2;
    if (take_l2(c, 1, &l2) != 1) return false;
    kvt__radix_begin_backup(c->tree, n, idx, l2);
    submit(c, OP_BACKUP, n->pages[idx].l1, l2);
    c->st.backups++;
    return true;
}

/* Backs up, as one batch, the pages of n up to idx that are in L1 with no L2
 * copy and no backup in flight: the eviction of n's tail will need them all,
 * and one reservation in page order gives runs that coalesce. When L2 has
 * room for only some, the ones nearest the tail get it. Returns the pages
 * backed up; page idx is among them unless that is 0. */
static uint64_t backup_upto(kvt_cache_t *c, kvt_rnode_t *n, uint32_t idx) {
    uint64_t need = 0;
    for (uint32_t i = 0; i <= idx; i++) need += n->pages[i].l2 == KVT_NO_PAGE;
    uint32_t *l2 = c->scratch + c->scratch_cap / 2;
    uint64_t got = take_l2(c, need, l2), k = got;
    for (uint32_t i = idx + 1; i-- > 0 && k > 0;) {
        if (n->pages[i].l2 != KVT_NO_PAGE) continue;
        k--;
        kvt__radix_begin_backup(c->tree, n, i, l2[k]);
        submit(c, OP_BACKUP, n->pages[i].l1, l2[k]);
    }
    c->st.backups += got;
    return got;
}

/* ---- corrupt L2 copies -------------------------------------------------------------- */

/* A load refused because an L2 copy failed its checksum: that copy, and the
 * pages below it (which live only in L2 and are reachable only through it),
 * leave the cache at the next admission or restore_room that finds none of
 * them held, pinned or in flight. Until then loads through it keep failing
 * (and are counted), so it is never served. */
static void note_corrupt(kvt_cache_t *c, uint32_t l2) {
    for (size_t i = 0; i < c->ncorrupt; i++)
        if (c->corrupt[i] == l2) return;
    if (c->ncorrupt < KVT__CORRUPT_MAX) c->corrupt[c->ncorrupt++] = l2;
}

static void forget_corrupt(kvt_cache_t *c, uint32_t l2) {
    for (size_t i = 0; i < c->ncorrupt; i++)
        if (c->corrupt[i] == l2) {
            c->corrupt[i] = c->corrupt[--c->ncorrupt];
            return;
        }
}

/* Nothing at or below page idx of x is held, pinned or in flight. */
static bool free_below(const kvt_rnode_t *x, uint32_t idx) {
    if (x->lock || x->pin) return false;
    for (uint32_t i = idx; i < x->npages; i++)
        if (x->pages[i].flags) return false;
    for (const kvt_rnode_t *ch = x->first_child; ch; ch = ch->next_sibling)
        if (!free_below(ch, 0)) return false;
    return true;
}

/* Trims x's subtree, then x's pages down to `keep` (x is freed when keep is 0). */
static void trim_below(kvt_cache_t *c, kvt_rnode_t *x, uint32_t keep) {
    while (x->first_child) trim_below(c, x->first_child, 0);
    for (uint32_t k = x->npages - keep; k > 0; k--) trim_l2_tail(c, x);
}

static void purge_corrupt(kvt_cache_t *c) {
    for (size_t i = 0; i < c->ncorrupt;) {
        kvt_rnode_t *n;
        uint32_t idx, l2 = c->corrupt[i];
        bool found = kvt__radix_locate_l2(c->tree, l2, &n, &idx);
        KVT_ASSERT(found); /* forgotten when given back */
        if (!found || !free_below(n, idx) || idx < n->n_l1) {
            i++; /* held for now (idx < n_l1: loaded meanwhile, from a good copy? then it is not ours to judge) */
            continue;
        }
        c->st.corrupt_dropped++;
        trim_below(c, n, idx); /* gives l2 back, which forgets it: slot i now holds another */
    }
}

/* ---- L1 ---------------------------------------------------------------------- */

typedef enum { EVICTED, SKIPPED } evict_result_t;

/* v's last page, in L1 only and with nothing below it, leaves the cache. */
static evict_result_t drop_tail_l1(kvt_cache_t *c, kvt_rnode_t *v) {
    kvt__policy_on_trim(c, v);
    give_back_l1(c, kvt__radix_trim(c->tree, v).l1);
    c->st.dropped_pages++;
    return EVICTED;
}

static evict_result_t evict_one_l1(kvt_cache_t *c, kvt_rnode_t *v) {
    uint32_t idx = v->n_l1 - 1;
    kvt_page_t *pg = &v->pages[idx];
    if (!kvt__page_in_l2(pg)) {
        bool tail = v->nchildren == 0 && idx == v->npages - 1;
        if (tail && (c->cfg.write_policy != KVT_WRITE_BACK || c->l2 == NULL)) return drop_tail_l1(c, v);
        /* Back it up first: write_back, or pages below it live only in L2.
         * Without room in L2 a tail page is dropped; another must wait. */
        uint64_t got = c->l2 ? backup_upto(c, v, idx) : 0;
        if (got == 0) return tail ? drop_tail_l1(c, v) : SKIPPED;
        if (c->cfg.write_policy != KVT_WRITE_BACK) c->st.forced_backups += got;
        wait_backups_upto(c, v, idx); /* the eviction waits for its backups; other copies land meanwhile */
        pg = &v->pages[idx];
        if (!kvt__page_in_l2(pg)) return SKIPPED; /* the backup failed */
    }
    give_back_l1(c, kvt__radix_drop_l1(c->tree, v));
    return EVICTED;
}

/* Plans room for n L1 pages, as plan_l2. Nodes that cannot give a page now
 * are held aside (locked) for the round. */
static bool plan_l1_to(kvt_cache_t *c, uint64_t n, uint64_t floor) {
    if (c->l1_free >= n + floor) return false;
    wait_kind(c, OP_BACKUP); /* pages whose backup landed may simply drop their L1 copy */
    c->st.l1_evict_calls++;
    kvt_rnode_t *aside[16];
    size_t naside = 0;
    while (c->l1_free < n + c->l1_target) {
        kvt_rnode_t *v = kvt__policy_l1_victim(c);
        if (v == NULL || naside == sizeof(aside) / sizeof(aside[0])) {
            c->st.l1_room_misses++;
            break;
        }
        if (evict_one_l1(c, v) == SKIPPED) {
            kvt__radix_lock(c->tree, v, +1);
            aside[naside++] = v;
            continue;
        }
        c->st.l1_evicted_pages++;
    }
    while (naside > 0) kvt__radix_lock(c->tree, aside[--naside], -1);
    return true;
}

static void plan_l1(kvt_cache_t *c, uint64_t n) {
    c->st.l1_allocs++;
    if (plan_l1_to(c, n, c->l1_floor)) c->st.l1_allocs_evicting++;
}

/* ---- create / destroy ------------------------------------------------------------ */

int kvt_cache_create(kvt_cache_t **out, const kvt_cache_config_t *cfg) {
    if (out == NULL || cfg == NULL || cfg->size < sizeof(*cfg) || cfg->page_tokens == 0 ||
        cfg->page_tokens > (1u << 20) || cfg->l1_pages == 0 || cfg->l1_pages > KVT_ALLOC_MAX_PAGES ||
        cfg->l2_pages > KVT_ALLOC_MAX_PAGES || cfg->l1_lanes == 0 || cfg->l1_lanes > cfg->l1_pages ||
        !(cfg->l1_free_room >= 0 && cfg->l1_free_room <= 0.5) || !(cfg->l2_free_room >= 0 && cfg->l2_free_room <= 0.5) ||
        (unsigned)cfg->policy >= KVT_POLICY_COUNT_ || (unsigned)cfg->write_policy >= KVT_WRITE_POLICY_COUNT_ ||
        cfg->write_through_hits == 0)
        return KVT_EINVAL;
    kvt_cache_t *c = KVT_NEW(kvt_cache_t);
    if (c == NULL) return KVT_ENOMEM;
    c->cfg = *cfg;
    c->cfg.size = sizeof(c->cfg);
    c->l1_free = cfg->l1_pages;
    c->l2_free = cfg->l2_pages;
    c->l1_target = (uint64_t)ceil(cfg->l1_free_room * (double)cfg->l1_pages);
    c->l2_target = (uint64_t)ceil(cfg->l2_free_room * (double)cfg->l2_pages);
    c->l1_floor = c->l1_target / 2;
    c->l2_floor = c->l2_target / 2;
    c->st.size = sizeof(c->st);
    kvt__radix_config_t rc = {cfg->page_tokens, cfg->l1_pages, cfg->l2_pages, kvt__policy_score, c};
    c->done_cap = DONE_CAP;
    c->scratch_cap = 2 * (cfg->l1_pages > cfg->l2_pages ? cfg->l1_pages : cfg->l2_pages);
    int err = kvt__radix_create(&c->tree, &rc);
    if (err == KVT_OK) err = kvt_laneal_create(&c->l1, cfg->l1_pages, cfg->l1_lanes);
    if (err == KVT_OK && cfg->l2_pages) err = kvt_extalloc_create(&c->l2, cfg->l2_pages);
    if (err == KVT_OK) err = idbuf_init(&c->l1_back, cfg->l1_pages);
    if (err == KVT_OK) err = idbuf_init(&c->l2_back, cfg->l2_pages);
    if (err == KVT_OK && (c->done = kvt__malloc(c->done_cap * sizeof(kvt__op_t))) == NULL) err = KVT_ENOMEM;
    if (err == KVT_OK && (c->scratch = kvt__malloc(c->scratch_cap * sizeof(uint32_t))) == NULL) err = KVT_ENOMEM;
    if (err == KVT_OK && (c->l2_runs = kvt__malloc((cfg->l2_pages + 1) * sizeof(kvt_run_t))) == NULL) err = KVT_ENOMEM;
    if (err == KVT_OK) err = kvt__policy_init(c);
    if (err != KVT_OK) {
        kvt_cache_destroy(c);
        return err;
    }
    *out = c;
    return KVT_OK;
}

void kvt_cache_destroy(kvt_cache_t *c) {
    if (c == NULL) return;
    if (c->xf) kvt_cache_sync(c); /* the engine owns the pages in flight until they land */
    kvt__radix_destroy(c->tree);
    kvt_laneal_destroy(c->l1);
    kvt_extalloc_destroy(c->l2);
    idbuf_fini(&c->l1_back);
    idbuf_fini(&c->l2_back);
    kvt__free(c->done, c->done_cap * sizeof(kvt__op_t));
    kvt__free(c->scratch, c->scratch_cap * sizeof(uint32_t));
    kvt__free(c->l2_runs, (c->cfg.l2_pages + 1) * sizeof(kvt_run_t));
    kvt__policy_fini(c);
    for (int k = 0; k < 2; k++) kvt__free(c->pend[k], c->pend_cap * sizeof(kvt_xfer_copy_t));
    KVT_DELETE(c);
}

kvt_radix_t *kvt_cache_tree(kvt_cache_t *c) { return c ? c->tree : NULL; }

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
static void load_path(kvt_cache_t *c, kvt_rnode_t *x, const uint32_t *ids, uint64_t *j) {
    if (x == kvt__radix_root(c->tree) || x->n_l1 == x->npages) return; /* all above are in L1 too */
    load_path(c, x->parent, ids, j);
    for (uint32_t i = x->n_l1; i < x->npages; i++) {
        if (x->pages[i].l1 != KVT_NO_PAGE) continue;
        kvt__radix_begin_load(c->tree, x, i, ids[*j]);
        submit(c, OP_LOAD, ids[*j], x->pages[i].l2);
        c->st.loads++;
        (*j)++;
    }
}

/* A load on the path to `end` failed: pages below it that did load cannot
 * join the L1 prefix (nothing above them will load now), so their L1 pages
 * go back rather than sit where no eviction reaches them. */
static void unstrand(kvt_cache_t *c, kvt_rnode_t *end) {
    for (kvt_rnode_t *x = end; x != kvt__radix_root(c->tree) && x->n_l1 < x->npages; x = x->parent)
        for (uint32_t i = x->n_l1; i < x->npages; i++)
            if (x->pages[i].l1 != KVT_NO_PAGE && !(x->pages[i].flags & KVT_PAGE_H2D))
                give_back_l1(c, kvt__radix_unload(c->tree, x, i));
}

/* write_through_selective: back up the L1 pages of nodes on the path that
 * have reached the hit threshold and lack a backup (a backup that found no
 * L2 room, or was reclaimed, is made again on the node's next hit). */
static void selective_backups(kvt_cache_t *c, kvt_rnode_t *end) {
    for (kvt_rnode_t *x = end; x != kvt__radix_root(c->tree); x = x->parent) {
        if (x->hits < c->cfg.write_through_hits || x->n_shadow == x->n_l1) continue; /* cold, or backed up */
        for (uint32_t i = 0; i < x->n_l1; i++)
            if (x->pages[i].l2 == KVT_NO_PAGE && !backup(c, x, i)) return;
    }
}

/* write_through: backs up the `count` pages that end at node `last` (the
 * new pages of one admission, in one or two nodes) that lack a copy. When L2
 * has room for only some, the leading ones get it. */
static void write_through(kvt_cache_t *c, kvt_rnode_t *last, uint64_t count) {
    uint64_t need = 0, j = count;
    for (kvt_rnode_t *x = last; j > 0; x = x->parent)
        for (uint32_t i = x->npages; i-- > 0 && j > 0; j--) need += x->pages[i].l2 == KVT_NO_PAGE;
    uint32_t *l2 = c->scratch + c->scratch_cap / 2;
    uint64_t got = take_l2(c, need, l2);
    j = count;
    for (kvt_rnode_t *x = last; j > 0; x = x->parent)
        for (uint32_t i = x->npages; i-- > 0 && j > 0; j--) {
            if (x->pages[i].l2 != KVT_NO_PAGE) continue;
            if (--need >= got) continue; /* L2 had no room for the rest */
            kvt__radix_begin_backup(c->tree, x, i, l2[need]);
            submit(c, OP_BACKUP, x->pages[i].l1, l2[need]);
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

int kvt_cache_admit(kvt_cache_t *c, uint32_t ns, const int32_t *tokens, uint64_t ntokens, int32_t priority,
                    uint32_t *l1_ids, kvt_cache_req_t *req) {
    if (c == NULL || req == NULL || (tokens == NULL && ntokens > 0)) return KVT_EINVAL;
    uint32_t pt = c->cfg.page_tokens;
    uint64_t npages = ntokens / pt;
    memset(req, 0, sizeof(*req));
    if (c->ncorrupt) purge_corrupt(c);
    kvt__match_t m;
    int rc = kvt__radix_match(c->tree, ns, tokens, npages, c->clock + 1, &m);
    if (rc != KVT_OK) return rc;
    c->clock++;
    for (kvt_rnode_t *x = m.node; x != kvt__radix_root(c->tree); x = x->parent) kvt__policy_on_hit(c, x);
    kvt__radix_lock(c->tree, m.node, +1);
    uint32_t children = m.node->nchildren;

    uint64_t cont = pages_to_load(c, m.node), fresh = npages - m.pages, need = cont + fresh;
    if (need > 0) plan_l1(c, need);
    if (flush(c) != KVT_OK) need = 0; /* no memory to return pages: take nothing new */
    uint64_t room = need <= c->l1_free ? need : c->l1_free;
    if (room < cont) room = 0; /* the L2 part loads whole or not at all */
    if (room < need) c->st.l1_alloc_failures++;
    uint32_t *ids = c->scratch;
    if (room > 0 && kvt_laneal_reserve(c->l1, room, ids) != KVT_OK) {
        c->st.l1_alloc_failures++;
        room = 0;
    }
    if (room == 0) cont = 0;
    c->l1_free -= room;
    for (uint64_t i = 0; i < room; i++) fold(c, 5ull << 40 | ids[i]);
    kvt_rnode_t *held = m.node;
    uint64_t ins = room > cont ? room - cont : 0;
    uint64_t used = 0;
    if (cont) load_path(c, m.node, ids, &used);
    wait_kind(c, OP_LOAD); /* the request needs its pages: the loads land before admit returns */
    uint64_t loaded = l1_prefix(c, m.node) - m.l1_pages;
    if (m.l1_pages + loaded < m.pages) unstrand(c, m.node);
    if (ins > 0 && m.l1_pages + loaded < m.pages) { /* a load failed: nothing goes below it */
        for (uint64_t i = 0; i < ins; i++) give_back_l1(c, ids[cont + i]);
        ins = 0;
        c->st.l1_alloc_failures++;
    }
    kvt_rnode_t *nn = NULL;
    if (ins > 0) {
        uint64_t done;
        nn = insert_pages(c, m.node, children, ns, tokens + m.pages * pt, ins, ids + cont, priority, &done);
        if (done < ins) { /* no memory for a node: the rest goes back */
            for (uint64_t i = done; i < ins; i++) give_back_l1(c, ids[cont + i]);
            ins = done;
            c->st.l1_alloc_failures++;
        }
    }
    if (ins > 0) {
        kvt__radix_lock(c->tree, nn, +1);
        kvt__radix_lock(c->tree, m.node, -1);
        held = nn;
    }
    req->l2_hit_pages = loaded;
    req->new_pages = ins;
    if (c->cfg.write_policy == KVT_WRITE_THROUGH_SELECTIVE && c->l2) selective_backups(c, m.node);
    kvt_cache_poll(c);
    flush(c);
    req->committed = ins == 0;

    req->node = held;
    req->pages = l1_prefix(c, held); /* usable: the request's leading pages in L1 */
    req->l1_hit_pages = m.l1_pages;
    req->uncached_pages = npages - req->pages;
    if (l1_ids) { /* the request's first req->pages pages, root to leaf */
        uint64_t j = 0;
        for (kvt_rnode_t *x = held; x != kvt__radix_root(c->tree); x = x->parent) j += x->npages;
        for (kvt_rnode_t *x = held; x != kvt__radix_root(c->tree); x = x->parent)
            for (uint32_t i = x->npages; i-- > 0;)
                if (--j < req->pages) l1_ids[j] = x->pages[i].l1;
    }
    c->held++;
    c->st.requests++;
    c->st.tokens += ntokens;
    c->st.l1_hit_tokens += m.l1_pages * pt;
    c->st.l2_hit_tokens += req->l2_hit_pages * pt;
    return KVT_OK;
}

int kvt_cache_commit(kvt_cache_t *c, kvt_cache_req_t *req) {
    if (c == NULL || req == NULL || req->node == NULL) return KVT_EINVAL;
    if (req->committed) return KVT_OK;
    req->committed = true;
    if (c->cfg.write_policy == KVT_WRITE_THROUGH && c->l2) {
        write_through(c, req->node, req->new_pages);
        kvt_cache_poll(c);
        flush(c);
    }
    return KVT_OK;
}

int kvt_cache_release(kvt_cache_t *c, kvt_cache_req_t *req) {
    if (c == NULL || req == NULL || req->node == NULL || c->held == 0) return KVT_EINVAL;
    kvt_cache_commit(c, req);
    kvt__radix_lock(c->tree, req->node, -1);
    req->node = NULL;
    c->held--;
    return KVT_OK;
}

uint64_t kvt_cache_restore_room(kvt_cache_t *c) {
    if (c == NULL) return 0;
    if (c->ncorrupt) purge_corrupt(c);
    uint64_t before = c->st.l1_evicted_pages + c->st.l2_evicted_pages;
    if (c->l1_free < c->l1_target) plan_l1_to(c, 0, c->l1_target);
    if (c->l2 && c->l2_free < c->l2_target) plan_l2_to(c, 0, c->l2_target);
    kvt_cache_poll(c);
    flush(c);
    return c->st.l1_evicted_pages + c->st.l2_evicted_pages - before;
}

/* ---- stats and check ------------------------------------------------------------------ */

int kvt_cache_stats(const kvt_cache_t *c, kvt_cache_stats_t *st) {
    if (c == NULL || st == NULL || st->size < sizeof(*st)) return KVT_EINVAL;
    *st = c->st;
    st->size = sizeof(*st);
    st->l1_free = c->l1_free;
    st->l2_free = c->l2_free;
    st->l1_target = c->l1_target;
    st->l2_target = c->l2_target;
    st->l1_floor = c->l1_floor;
    st->l2_floor = c->l2_floor;
    return KVT_OK;
}

int kvt_cache_check(kvt_cache_t *c, const char **why) {
    const char *dummy;
    if (why == NULL) why = &dummy;
    *why = NULL;
    if (c == NULL) return KVT_EINVAL;
    int rc = kvt_radix_check(c->tree, why);
    if (rc != KVT_OK) return rc;
    kvt_radix_stats_t rs = {.size = sizeof(rs)};
    kvt_radix_stats(c->tree, &rs);
    kvt_laneal_stats_t ls = {.size = sizeof(ls)};
    kvt_laneal_stats(c->l1, &ls);
    if (kvt_laneal_check(c->l1) != KVT_OK) return *why = "L1 allocator check failed", KVT_ECORRUPT;
    /* every L1 id the tree holds is reserved, and nothing else is */
    uint64_t l1_held = 0, l2_held = 0;
    kvt_rnode_t *n;
    uint32_t idx;
    for (uint32_t id = 0; id < c->cfg.l1_pages; id++) l1_held += kvt__radix_locate_l1(c->tree, id, &n, &idx);
    for (uint32_t id = 0; id < c->cfg.l2_pages; id++) l2_held += kvt__radix_locate_l2(c->tree, id, &n, &idx);
    if (ls.free_pages + c->l1_back.n + l1_held != c->cfg.l1_pages) return *why = "L1 pages leaked or double-held", KVT_ECORRUPT;
    if (ls.free_pages + c->l1_back.n != c->l1_free) return *why = "L1 free count differs", KVT_ECORRUPT;
    for (size_t i = 0; i < c->l1_back.n; i++)
        if (kvt__radix_locate_l1(c->tree, c->l1_back.id[i], &n, &idx)) return *why = "a freed L1 page is in the tree", KVT_ECORRUPT;
    if (c->l2) {
        kvt_extalloc_stats_t es = {.size = sizeof(es)};
        kvt_extalloc_stats(c->l2, &es);
        if (kvt_extalloc_check(c->l2) != KVT_OK) return *why = "L2 allocator check failed", KVT_ECORRUPT;
        if (es.free_pages + c->l2_back.n + l2_held != c->cfg.l2_pages) return *why = "L2 pages leaked or double-held", KVT_ECORRUPT;
        if (es.free_pages + c->l2_back.n != c->l2_free) return *why = "L2 free count differs", KVT_ECORRUPT;
        for (uint32_t id = 0; id < c->cfg.l2_pages; id++)
            if (kvt__radix_locate_l2(c->tree, id, &n, &idx) && kvt_extalloc_is_free(c->l2, id))
                return *why = "an L2 page in the tree is free in its allocator", KVT_ECORRUPT;
    } else if (l2_held) {
        return *why = "L2 pages without an L2 tier", KVT_ECORRUPT;
    }
    if (rs.locked_nodes > 0 && c->held == 0) return *why = "nodes locked with no request held", KVT_ECORRUPT;
    uint64_t flagged[2] = {0, 0};
    for (kvt_rnode_t *x = kvt__radix_first(c->tree); x; x = kvt__radix_next(c->tree, x)) {
        for (uint32_t i = x->n_l1; i < x->npages && x->lock == 0; i++)
            if (x->pages[i].l1 != KVT_NO_PAGE)
                return *why = "an L1 page stranded past the L1 prefix of a node no request holds", KVT_ECORRUPT;
        for (uint32_t i = 0; i < x->npages; i++) {
            flagged[OP_BACKUP] += (x->pages[i].flags & KVT_PAGE_D2H) != 0;
            flagged[OP_LOAD] += (x->pages[i].flags & KVT_PAGE_H2D) != 0;
        }
    }
    /* every copy in flight is a page marked in flight, and the reverse */
    if (flagged[OP_BACKUP] != c->inflight[OP_BACKUP] || flagged[OP_LOAD] != c->inflight[OP_LOAD])
        return *why = "copies in flight differ from the pages marked in flight", KVT_ECORRUPT;
    return kvt__policy_check(c, why);
}
