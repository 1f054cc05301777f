/* Planned eviction: room in L1 and L2, made against free-room targets.
 *
 * An allocation of n pages that would leave fewer than the floor (half the
 * target) free starts a round, which evicts until n + target pages are free.
 * A round starts by letting the backups in flight land, so that decisions
 * do not depend on copy timing.
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
 * Nothing locked, pinned or in flight is evicted.
 *
 * Runs: the pages one eviction at a time would take from a victim in a row
 * go in one call of the tree, so that the victim sets are settled once a run,
 * not once a page: a leaf's tail pages in L1 only (drop_tail_run_l1), a
 * node's last L1 pages whose L2 copies have landed (drop_l1_run), a leaf's
 * tail pages only in L2 (evict_l2). The same pages, in the same order.
 *
 * Cost: O(pages evicted x log nodes) a round (the victim sets are heaps).
 */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cache-int.h"
#include "kvtier/error.h"
#include "../core/check-int.h"
#include "../core/mem-int.h"

/* ---- L2 ---------------------------------------------------------------------- */

/* The last page of leaf v, living only in L2, leaves the cache (v is freed
 * with its last page). */
static void trim_l2_tail(kvt_cache_t *c, kvt_rnode_t *v, bool may_put) {
    if (may_put && c->l3.flags && c->cfg.l3_write_policy == KVT_WRITE_BACK) kvt__l3_put(c, v, v->npages - 1); /* on to L3 */
    kvt__policy_on_trim(c, v, 1);
    kvt_page_t pg = kvt__radix_trim(c->tree, v);
    kvt__cache_give_back_l2(c, pg.l2);
    if (pg.l1 != KVT_NO_PAGE) kvt__cache_give_back_l1(c, pg.l1); /* loaded, but stranded below a page not in L1 */
    c->st.dropped_pages++;
}

/* Evicts up to max (>= 1) L2 pages: the host-only tail pages of the first
 * host victim (one at a time when each goes on to L3 first), else shadows of
 * the first shadow victim, tail first, as many as it has (the same pages, in
 * the same order, as one eviction at a time: trimming a host-only tail page
 * leaves the victim first among the host victims while it has another, and
 * dropping a shadow changes neither the victim's score nor whether a
 * host-only page exists). A run goes in one tree call, its ids straight into
 * the give-back buffer: a node's arrays shrink once for the run, not once
 * for every part of it. Returns how many; 0 when nothing in L2 may go. */
static uint64_t evict_l2(kvt_cache_t *c, uint64_t max) {
    bool put = c->l3.flags && c->cfg.l3_write_policy == KVT_WRITE_BACK; /* each goes on to L3 first: its only copy */
    uint32_t most = max < UINT32_MAX ? (uint32_t)max : UINT32_MAX;
    kvt_rnode_t *v = kvt__radix_victim(c->tree, KVT_VSET_L2_HOST);
    if (v) { /* a leaf's page that lives only in L2 leaves the cache */
        /* the pages that may go in one call: below its L1 prefix, not loaded (a stranded load has an L1
         * copy), no copy in flight; their ids read in the same pass, straight into the give-back buffer */
        bool suspect = false;
        uint32_t m = put ? 0 : kvt__radix_l2_tail(v, most, kvt__cache_l2_back_end(c), &suspect);
        if (m == 0) { /* each goes on to L3 first, or the tail page is a stranded load */
            trim_l2_tail(c, v, true);
            return 1;
        }
        kvt__policy_on_trim(c, v, m);
        kvt__radix_cut_l2_tail(c->tree, v, m, suspect); /* (v may be gone) */
        kvt__cache_gave_back_l2(c, m);
        c->st.dropped_pages += m;
        return m;
    }
    v = kvt__radix_victim(c->tree, KVT_VSET_L2_SHADOW);
    if (v == NULL) return 0;
    if (!put) {
        uint32_t k = kvt__radix_drop_shadows(c->tree, v, most, kvt__cache_l2_back_end(c));
        kvt__cache_gave_back_l2(c, k);
        c->st.shadows_reclaimed += k;
        return k;
    }
    uint64_t got = 0;
    for (; got < max && v->n_shadow > 0; got++) {
        kvt__l3_put(c, v, kvt__radix_last_shadow(v)); /* the shadow kvt__radix_drop_shadows takes next */
        kvt__cache_gave_back_l2(c, kvt__radix_drop_shadows(c->tree, v, 1, kvt__cache_l2_back_end(c)));
    }
    c->st.shadows_reclaimed += got;
    return got;
}

/* Plans room for n L2 pages: when the allocation would leave fewer than the
 * floor (half the target) free, one eviction round brings free room back to
 * n + target. The gap between floor and target is what batches rounds: a
 * round makes room for the next allocations too. */
bool kvt__cache_plan_l2_to(kvt_cache_t *c, uint64_t n, uint64_t floor) {
    if (c->l2_free >= n + floor) return false;
    kvt__cache_wait_kind(c, OP_BACKUP); /* landed backups make shadows reclaimable: decisions never depend on copy timing */
    c->st.l2_evict_calls++;
    while (c->l2_free < n + c->l2_target) {
        uint64_t got = evict_l2(c, n + c->l2_target - c->l2_free);
        if (got == 0) {
            c->st.l2_room_misses++;
            break;
        }
        c->st.l2_evicted_pages += got;
    }
    return true;
}

static void plan_l2(kvt_cache_t *c, uint64_t n) {
    c->st.l2_allocs++;
    if (kvt__cache_plan_l2_to(c, n, c->l2_floor)) c->st.l2_allocs_evicting++;
}

/* Reserves up to n L2 pages (after planning); ids in out. Returns how many. */
uint64_t kvt__cache_take_l2(kvt_cache_t *c, uint64_t n, uint32_t *out) {
    if (c->l2 == NULL || n == 0) return 0;
    plan_l2(c, n);
    if (kvt__cache_flush(c) != KVT_OK) return 0;
    if (c->l3.l2_deferred && !c->l3.no_wait) kvt__l3_wait_room(c, n); /* pages a store call holds come back soon */
    if (n > c->l2_free - c->l3.l2_deferred) n = c->l2_free - c->l3.l2_deferred;
    if (n == 0) return 0;
    kvt_run_t *runs = c->l2_runs; /* flush is done with it; room for every L2 page */
    size_t k = 0;
    if (kvt_extalloc_reserve(c->l2, n, runs, n, &k) != KVT_OK) {
        c->st.l2_alloc_failures++;
        return 0;
    }
    uint64_t j = 0;
    for (size_t i = 0; i < k; i++) { /* a run's bounds in locals: the stores to out could alias runs[] */
        uint32_t start = runs[i].start, len = runs[i].len;
        for (uint32_t p = 0; p < len; p++) out[j++] = start + p;
    }
    kvt__cache_fold_ids(c, 4ull << 40, out, n);
    c->l2_free -= n;
    return n;
}

/* Backs up page idx of n (in L1, no L2 copy): false when L2 has no room. */
bool kvt__cache_backup(kvt_cache_t *c, kvt_rnode_t *n, uint32_t idx) {
    uint32_t l2;
    if (kvt__cache_take_l2(c, 1, &l2) != 1) return false;
    kvt__radix_begin_backup(c->tree, n, idx, l2);
    kvt__cache_submit(c, OP_BACKUP, n->pages[idx].l1, l2);
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
    uint64_t got = kvt__cache_take_l2(c, need, l2), k = got;
    for (uint32_t i = idx + 1; i-- > 0 && k > 0;) {
        if (n->pages[i].l2 != KVT_NO_PAGE) continue;
        k--;
        kvt__radix_begin_backup(c->tree, n, i, l2[k]);
        kvt__cache_submit(c, OP_BACKUP, n->pages[i].l1, l2[k]);
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
void kvt__cache_note_corrupt(kvt_cache_t *c, uint32_t l1, uint32_t l2) {
    kvt_rnode_t *n;
    uint32_t idx;
    bool found = kvt__radix_locate_l1(c->tree, l1, &n, &idx); /* (its load is still in flight) */
    KVT_ASSERT(found && n->pages[idx].l2 == l2);
    if (!found || n->pages[idx].l2 != l2 || (n->pages[idx].flags & KVT_PAGE_SUSPECT)) return; /* (noted before) */
    if (c->ncorrupt == KVT__CORRUPT_MAX) return;
    kvt__radix_suspect(c->tree, n, idx); /* found by its L2 id from now on, through splits */
    c->corrupt[c->ncorrupt++] = l2;
}

void kvt__cache_forget_corrupt(kvt_cache_t *c, uint32_t l2) {
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
        if (x->pages[i].flags & KVT__PAGE_IN_FLIGHT) return false;
    for (const kvt_rnode_t *ch = x->first_child; ch; ch = ch->next_sibling)
        if (!free_below(ch, 0)) return false;
    return true;
}

/* Trims x's subtree, then x's pages down to `keep` (x is freed when keep is 0). */
static void trim_below(kvt_cache_t *c, kvt_rnode_t *x, uint32_t keep) {
    while (x->first_child) trim_below(c, x->first_child, 0);
    for (uint32_t k = x->npages - keep; k > 0; k--) trim_l2_tail(c, x, false); /* corrupt: never put */
}

bool kvt__cache_free_below(const kvt_rnode_t *x) { return free_below(x, 0); }

/* x's subtree leaves the cache, wherever its pages live (none held, pinned
 * or in flight: kvt__cache_free_below), leaf pages first; the policy keeps
 * no ghost of them, nothing goes on to L3. Returns the pages. */
uint64_t kvt__cache_drop_subtree(kvt_cache_t *c, kvt_rnode_t *x) {
    uint64_t n = 0;
    while (x->first_child) n += kvt__cache_drop_subtree(c, x->first_child);
    for (uint32_t k = x->npages; k-- > 0; n++) { /* (x is freed with its last page) */
        kvt__policy_on_drop(c, x, 1);
        kvt_page_t pg = kvt__radix_trim(c->tree, x);
        if (pg.l2 != KVT_NO_PAGE) kvt__cache_give_back_l2(c, pg.l2);
        if (pg.l1 != KVT_NO_PAGE) kvt__cache_give_back_l1(c, pg.l1);
        c->st.dropped_pages++;
    }
    return n;
}

void kvt__cache_purge_corrupt(kvt_cache_t *c) {
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
    kvt__policy_on_trim(c, v, 1);
    kvt__cache_give_back_l1(c, kvt__radix_trim(c->tree, v).l1);
    c->st.dropped_pages++;
    return EVICTED;
}

/* Up to max of v's tail pages leave the cache, as drop_tail_l1 one at a time
 * would take them from the victim set's first node: while v is a leaf whose
 * pages are all in L1, its tail page has no copy in L2 and nothing in flight,
 * and (after the first) the policy still asks set `first` for victims. The
 * tree trims them in one call, so a node's arrays are not halved page by page
 * on its way out. Returns how many left (0: drop_tail_l1's case is not v's). */
static uint64_t drop_tail_run_l1(kvt_cache_t *c, kvt_rnode_t *v, uint64_t max, kvt__vset_t first) {
    if (v->nchildren != 0 || v->n_l1 != v->npages || (c->cfg.write_policy == KVT_WRITE_BACK && c->l2 != NULL)) return 0;
    uint32_t m = 0; /* the tail pages in L1 only, with nothing in flight */
    for (uint32_t idx = v->npages; idx-- > 0 && m < max;) {
        const kvt_page_t *pg = &v->pages[idx];
        if (pg->l2 != KVT_NO_PAGE || pg->flags != 0) break;
        m++;
    }
    if (m == 0) return 0;
    uint32_t k = kvt__policy_on_trim_tail(c, v, m, first); /* as long as the policy still asks set `first` */
    kvt__radix_trim_l1_tail(c->tree, v, k, kvt__cache_l1_back_end(c)); /* (v may be gone) */
    kvt__cache_gave_back_l1(c, k);
    c->st.dropped_pages += k;
    return k;
}

/* Up to max of v's last L1 pages whose L2 copy has landed leave L1 (they
 * live on in L2), tail first, in one call: the pages evict_one_l1 would take
 * from v one at a time, since dropping an L1 copy moves neither v's score nor
 * the policy's choice of set, and v stays in its set while it has an L1 page
 * (a tail page with a backup in flight has no landed copy: the run stops
 * there). Returns how many (0: v's tail L1 page has no landed copy). */
static uint64_t drop_l1_run(kvt_cache_t *c, kvt_rnode_t *v, uint64_t max) {
    uint32_t m = kvt__radix_drop_l1_tail(c->tree, v, max < UINT32_MAX ? (uint32_t)max : UINT32_MAX, kvt__cache_l1_back_end(c));
    if (m > 0) kvt__cache_gave_back_l1(c, m);
    return m;
}

/* *plain: the page just left (no backup was made or waited for, so nothing
 * but v's own tail changed). */
static evict_result_t evict_one_l1(kvt_cache_t *c, kvt_rnode_t *v, bool *plain) {
    uint32_t idx = v->n_l1 - 1;
    kvt_page_t *pg = &v->pages[idx];
    *plain = true;
    if (!kvt__page_in_l2(pg)) {
        bool tail = v->nchildren == 0 && idx == v->npages - 1;
        if (tail && (c->cfg.write_policy != KVT_WRITE_BACK || c->l2 == NULL)) return drop_tail_l1(c, v);
        *plain = false;
        /* Back it up first: write_back, or pages below it live only in L2.
         * Without room in L2 a tail page is dropped; another must wait. */
        uint64_t got = c->l2 ? backup_upto(c, v, idx) : 0;
        if (got == 0) return tail ? drop_tail_l1(c, v) : SKIPPED;
        if (c->cfg.write_policy != KVT_WRITE_BACK) c->st.forced_backups += got;
        kvt__cache_wait_backups_upto(c, v, idx); /* the eviction waits for its backups; other copies land meanwhile */
        pg = &v->pages[idx];
        if (!kvt__page_in_l2(pg)) return SKIPPED; /* the backup failed */
    }
    kvt__cache_give_back_l1(c, kvt__radix_drop_l1(c->tree, v));
    return EVICTED;
}

/* Plans room for n L1 pages, as plan_l2. Nodes that cannot give a page now
 * are held aside (locked) for the round. */
bool kvt__cache_plan_l1_to(kvt_cache_t *c, uint64_t n, uint64_t floor) {
    if (c->l1_free >= n + floor) return false;
    kvt__cache_wait_kind(c, OP_BACKUP); /* pages whose backup landed may simply drop their L1 copy */
    c->st.l1_evict_calls++;
    kvt_rnode_t *aside[16];
    size_t naside = 0;
    while (c->l1_free < n + c->l1_target) {
        kvt_rnode_t *v = kvt__policy_l1_victim(c);
        if (v == NULL || naside == sizeof(aside) / sizeof(aside[0])) {
            c->st.l1_room_misses++;
            break;
        }
        kvt__vset_t first = kvt__policy_l1_first(c), set = v->policy.vclass ? KVT_VSET_L1_HI : KVT_VSET_L1;
        uint64_t want = n + c->l1_target - c->l1_free, got = drop_tail_run_l1(c, v, want, first);
        if (got == 0) got = drop_l1_run(c, v, want);
        if (got > 0) {
            c->st.l1_evicted_pages += got;
            continue;
        }
        bool plain, keeps = v->npages > 1; /* v is still a node after this eviction */
        if (evict_one_l1(c, v, &plain) == SKIPPED) {
            kvt__radix_lock(c->tree, v, +1);
            aside[naside++] = v;
            continue;
        }
        c->st.l1_evicted_pages++;
        /* The same victim again without asking the heaps, while only its own tail changed: it keeps
         * its score and its set, so it is still the first of them (the pages are those one eviction
         * at a time takes, in the same order). A trim frees a node only with its last page, and
         * its parent's L1 child count changes only when it has no L1 page left. */
        while (plain && keeps && c->l1_free < n + c->l1_target && v->n_l1 > 0 && kvt__policy_l1_first(c) == first &&
               kvt__vset_member(v, set)) {
            keeps = v->npages > 1;
            if (evict_one_l1(c, v, &plain) == SKIPPED) { /* as above */
                kvt__radix_lock(c->tree, v, +1);
                aside[naside++] = v;
                break;
            }
            c->st.l1_evicted_pages++;
        }
    }
    while (naside > 0) kvt__radix_lock(c->tree, aside[--naside], -1);
    return true;
}

void kvt__cache_plan_l1(kvt_cache_t *c, uint64_t n) {
    c->st.l1_allocs++;
    if (kvt__cache_plan_l1_to(c, n, c->l1_floor)) c->st.l1_allocs_evicting++;
}
