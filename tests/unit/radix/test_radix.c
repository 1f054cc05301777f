/* The radix tree against a brute-force model.
 *
 * The model is a flat list of the pages in the cache, each named by its whole
 * prefix (namespace + every token from the start of the sequence), with the
 * state that page must have. A match is the longest k such that the first k
 * pages of the query are in the list, found by comparing tokens; nothing in
 * the model knows about nodes, splits or heaps. Random matches (which split
 * nodes), inserts, evictions from every victim set, backups and loads that
 * complete in random order, locks and unlocks run against both; after every
 * step kvt_radix_check() passes and every model page is found in the tree
 * (through its page ids) with the same prefix and the same state.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <xxhash.h>

#include "kvtier/rng.h"
#include "kvtier/error.h"
#include "core/mem-int.h"
#include "radix/radix-impl.h"
#include "radix/radix-int.h"

#define PT 2       /* tokens per page: small, so that prefixes collide */
#define ALPHA 3    /* token alphabet */
#define MAXP 12    /* pages per sequence */
#define IDS 4096   /* L1 and L2 page id spaces */

typedef struct mpage {
    uint32_t ns, k;           /* the page is page k-1 of its prefix */
    int32_t tok[MAXP * PT];   /* the prefix's tokens */
    kvt_page_t st;
    bool used;
} mpage_t;

typedef struct model {
    mpage_t p[IDS];
    uint32_t n;
    bool l1_used[IDS], l2_used[IDS];
} model_t;

static mpage_t *mfind(model_t *m, uint32_t ns, const int32_t *tok, uint32_t k) {
    for (uint32_t i = 0; i < m->n; i++)
        if (m->p[i].used && m->p[i].ns == ns && m->p[i].k == k && memcmp(m->p[i].tok, tok, k * PT * sizeof(int32_t)) == 0)
            return &m->p[i];
    return NULL;
}

static mpage_t *madd(model_t *m, uint32_t ns, const int32_t *tok, uint32_t k) {
    uint32_t i = 0;
    while (i < m->n && m->p[i].used) i++;
    if (i == m->n) m->n++;
    mpage_t *p = &m->p[i];
    memset(p, 0, sizeof(*p));
    p->used = true;
    p->ns = ns;
    p->k = k;
    memcpy(p->tok, tok, k * PT * sizeof(int32_t));
    return p;
}

static bool in_l1(const kvt_page_t *s) { return s->l1 != KVT_NO_PAGE && !(s->flags & KVT_PAGE_H2D); }

/* Longest cached prefix, and its leading L1 pages, by brute force. */
static void mmatch(model_t *m, uint32_t ns, const int32_t *q, uint32_t n, uint32_t *pages, uint32_t *l1) {
    uint32_t k = 0, a = 0;
    bool l1run = true;
    while (k < n) {
        mpage_t *p = mfind(m, ns, q, k + 1);
        if (p == NULL) break;
        k++;
        if (l1run && in_l1(&p->st)) a++;
        else l1run = false;
    }
    *pages = k;
    *l1 = a;
}

static uint32_t take_id(bool *used, kvt_rng_t *rng) {
    uint32_t id;
    do id = (uint32_t)kvt_rng_below(rng, IDS);
    while (used[id]);
    used[id] = true;
    return id;
}

static uint64_t lru(void *ctx, const kvt_rnode_t *n, kvt__vset_t set) {
    (void)ctx;
    (void)set;
    return n->last_access;
}

/* The model page behind tree page (n, idx): rebuild the prefix from the tree. */
static mpage_t *model_of(model_t *m, kvt_radix_t *r, kvt_rnode_t *n, uint32_t idx) {
    int32_t tok[MAXP * PT + 64];
    uint32_t k = idx + 1;
    for (kvt_rnode_t *x = n->parent; x != kvt__radix_root(r); x = x->parent) k += x->npages;
    cr_assert_leq(k, MAXP, "a prefix longer than any inserted sequence");
    uint32_t end = k;
    for (kvt_rnode_t *x = n; x != kvt__radix_root(r); x = x->parent) {
        uint32_t take = x == n ? idx + 1 : x->npages;
        end -= take;
        memcpy(tok + end * PT, x->tokens, take * PT * sizeof(int32_t));
    }
    return mfind(m, n->ns, tok, k);
}

/* The page key of a model page, from its prefix's tokens by the chain that
 * radix-int.h documents: mix(ns + K), then key x G + XXH3-64(page) per page,
 * mix being splitmix64's finaliser and G the odd golden-ratio constant. */
static uint64_t splitmix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static uint64_t mkey(const mpage_t *p) {
    uint64_t k = splitmix(p->ns + 0x6b767469657231ull);
    for (uint32_t i = 0; i < p->k; i++) k = k * 0x9e3779b97f4a7c15ull + XXH3_64bits(p->tok + i * PT, PT * sizeof(int32_t));
    return k;
}

/* Every tree page is the model page of its prefix, in the same state, once;
 * the reverse maps find a page by id exactly while a copy of it is in flight
 * (a load: its L1 id; a backup: its L2 id), and give no other. */
static void compare(model_t *m, kvt_radix_t *r, const char *ctx) {
    const char *why = NULL;
    cr_assert_eq(kvt_radix_check(r, &why), KVT_OK, "%s: check: %s", ctx, why);
    kvt_radix_stats_t st = {.size = sizeof(st)};
    kvt_radix_stats(r, &st);
    uint32_t pages = 0, tree_pages = 0;
    for (uint32_t i = 0; i < m->n; i++) pages += m->p[i].used;
    static bool seen[IDS];
    cr_assert_leq(m->n, sizeof(seen));
    memset(seen, 0, m->n);
    for (kvt_rnode_t *n = kvt__radix_first(r); n; n = kvt__radix_next(r, n))
        for (uint32_t idx = 0; idx < n->npages; idx++, tree_pages++) {
            mpage_t *p = model_of(m, r, n, idx);
            cr_assert(p && p->used && !seen[p - m->p], "%s: a tree page is not a model page, or is one twice", ctx);
            seen[p - m->p] = true;
            const kvt_page_t *t = &n->pages[idx];
            cr_assert(t->l1 == p->st.l1 && t->l2 == p->st.l2 && t->flags == p->st.flags,
                      "%s: page state (%u,%u,%u), model (%u,%u,%u)", ctx, t->l1, t->l2, t->flags, p->st.l1, p->st.l2, p->st.flags);
            if (n->key) cr_assert_eq(kvt__radix_page_key(n, idx), mkey(p), "%s: a page key is not its prefix's", ctx);
            kvt_rnode_t *x;
            uint32_t xi;
            bool loading = p->st.flags & KVT_PAGE_H2D, backing_up = p->st.flags & KVT_PAGE_D2H;
            cr_assert_eq(p->st.l1 != KVT_NO_PAGE && kvt__radix_locate_l1(r, p->st.l1, &x, &xi), loading,
                         "%s: the L1 map %s a page %s loading", ctx, loading ? "lost" : "keeps", loading ? "" : "not");
            if (loading) cr_assert(x == n && xi == idx, "%s: the L1 map gives another place", ctx);
            cr_assert_eq(p->st.l2 != KVT_NO_PAGE && kvt__radix_locate_l2(r, p->st.l2, &x, &xi), backing_up,
                         "%s: the L2 map %s a page %s backed up", ctx, backing_up ? "lost" : "keeps", backing_up ? "" : "not");
            if (backing_up) cr_assert(x == n && xi == idx, "%s: the L2 map gives another place", ctx);
        }
    cr_assert_eq(tree_pages, pages, "%s: %u pages in the tree, %u in the model", ctx, tree_pages, pages);
    cr_assert_eq(st.pages, pages, "%s: %" PRIu64 " pages in the tree, %u in the model", ctx, st.pages, pages);
}

/* A model page is a leaf when no other page extends its prefix. */
static bool mleaf(model_t *m, const mpage_t *p) {
    for (uint32_t i = 0; i < m->n; i++)
        if (m->p[i].used && m->p[i].ns == p->ns && m->p[i].k == p->k + 1 &&
            memcmp(m->p[i].tok, p->tok, p->k * PT * sizeof(int32_t)) == 0)
            return false;
    return true;
}

/* A run call's length: any of the run's (up to MAXP), and the model's pages
 * of v from page top down, one for each (every one of them must have one). */
static uint32_t run_length(kvt_rng_t *rng, uint32_t run) { return 1 + (uint32_t)kvt_rng_below(rng, run < MAXP ? run : MAXP); }
static void model_run(model_t *m, kvt_radix_t *r, kvt_rnode_t *v, uint32_t top, uint32_t k, mpage_t **mp, const char *ctx) {
    for (uint32_t i = 0; i < k; i++) {
        mp[i] = model_of(m, r, v, top - i);
        cr_assert_not_null(mp[i], "%s: page %u of the run is not the model's", ctx, top - i);
    }
}

typedef struct op { bool load; uint32_t id; } op_t;

static void radix_fuzz(uint64_t seed, int steps) {
    fprintf(stderr, "radix fuzz: seed=%" PRIu64 " steps=%d\n", seed, steps);
    static model_t m;
    memset(&m, 0, sizeof(m));
    kvt_rng_t rng;
    kvt_rng_seed(&rng, seed);
    kvt_radix_t *r;
    kvt__radix_config_t cfg = {PT, IDS, IDS, lru, NULL, seed % 2 == 1}; /* odd seeds keep page keys */
    cr_assert_eq(kvt__radix_create(&r, &cfg), KVT_OK);
    kvt_rnode_t *held[8];
    uint32_t nheld = 0;
    op_t inflight[64];
    uint32_t nin = 0;
    char ctx[96];
    uint64_t clock = 0;
    int32_t q[MAXP * PT];
    uint64_t cnt[11] = {0}; /* inserts, drop_l1, l1 trims, host trims, shadow drops, backups, loads, failed copies,
                               runs of L1 trims, runs of L1 drops, runs of host trims */
    for (int step = 0; step < steps; step++) {
        snprintf(ctx, sizeof(ctx), "seed %" PRIu64 " step %d", seed, step);
        uint64_t dice = kvt_rng_below(&rng, 100), live = 0;
        for (uint32_t i = 0; i < m.n; i++) live += m.p[i].used;
        if (dice < 30 && live > 300) dice = 45 + dice % 17; /* keep the tree small: evict instead */
        if (dice < 30) { /* match, maybe insert */
            uint32_t ns = (uint32_t)kvt_rng_below(&rng, 2), n = 1 + (uint32_t)kvt_rng_below(&rng, MAXP);
            for (uint32_t i = 0; i < n * PT; i++) q[i] = (int32_t)kvt_rng_below(&rng, ALPHA);
            uint32_t want_pages, want_l1;
            mmatch(&m, ns, q, n, &want_pages, &want_l1);
            kvt__match_t mt;
            cr_assert_eq(kvt__radix_match(r, ns, q, n, ++clock, &mt), KVT_OK);
            cr_assert_eq(mt.pages, want_pages, "%s: matched %" PRIu64 " pages, model %u", ctx, mt.pages, want_pages);
            cr_assert_eq(mt.l1_pages, want_l1, "%s: L1 prefix %" PRIu64 ", model %u", ctx, mt.l1_pages, want_l1);
            bool full_l1 = mt.l1_pages == mt.pages;
            if (mt.pages < n && full_l1 && kvt_rng_below(&rng, 3)) {
                uint32_t add = n - (uint32_t)mt.pages, ids[MAXP];
                for (uint32_t i = 0; i < add; i++) ids[i] = take_id(m.l1_used, &rng);
                kvt_rnode_t *nn;
                cr_assert_eq(kvt__radix_insert(r, mt.node, ns, q + mt.pages * PT, add, ids, clock, 0, &nn), KVT_OK, "%s", ctx);
                for (uint32_t i = 0; i < add; i++)
                    madd(&m, ns, q, (uint32_t)mt.pages + i + 1)->st = (kvt_page_t){ids[i], KVT_NO_PAGE, 0};
                cnt[0]++;
            } else if (mt.pages < n && !full_l1) {
                kvt_rnode_t *nn; /* inserting below pages that are not in L1 is refused */
                uint32_t id = 0;
                cr_assert_eq(kvt__radix_insert(r, mt.node, ns, q + mt.pages * PT, 1, &id, clock, 0, &nn), KVT_EINVAL);
            }
            if (mt.pages > 0 && nheld < 8 && kvt_rng_below(&rng, 4) == 0) {
                kvt__radix_lock(r, mt.node, +1);
                held[nheld++] = mt.node;
            }
        } else if (dice < 36 && nheld > 0) { /* unlock */
            uint32_t i = (uint32_t)kvt_rng_below(&rng, nheld);
            kvt__radix_lock(r, held[i], -1);
            held[i] = held[--nheld];
        } else if (dice < 54) { /* L1 eviction step */
            kvt_rnode_t *v = kvt__radix_victim(r, KVT_VSET_L1);
            if (v == NULL) continue;
            cr_assert_eq(v->lock, 0, "%s: a locked node is an L1 victim", ctx);
            uint32_t idx = v->n_l1 - 1;
            mpage_t *p = model_of(&m, r, v, idx);
            cr_assert_not_null(p);
            cr_assert(!(p->st.flags & KVT_PAGE_D2H), "%s: a page in flight is an L1 victim", ctx);
            if (p->st.l2 != KVT_NO_PAGE && kvt_rng_below(&rng, 2)) {
                uint32_t id = kvt__radix_drop_l1(r, v);
                cr_assert_eq(id, p->st.l1);
                m.l1_used[id] = false;
                p->st.l1 = KVT_NO_PAGE;
                cnt[1]++;
            } else if (p->st.l2 != KVT_NO_PAGE) {
                /* the run of tail L1 pages with a landed L2 copy, in one call: any length of it, or
                 * (asked for more) all of it, the call stopping at its end */
                uint32_t run = 0, got[MAXP];
                while (run < v->n_l1 && kvt__page_in_l2(&v->pages[v->n_l1 - 1 - run])) run++;
                bool past = kvt_rng_below(&rng, 4) == 0;
                uint32_t k = past ? run : run_length(&rng, run);
                mpage_t *mp[MAXP];
                model_run(&m, r, v, idx, k, mp, ctx);
                for (uint32_t i = 0; i < k; i++)
                    cr_assert(mp[i]->st.l2 != KVT_NO_PAGE && !(mp[i]->st.flags & KVT_PAGE_D2H), "%s", ctx);
                cr_assert_eq(kvt__radix_drop_l1_tail(r, v, past ? UINT32_MAX : k, got), k, "%s", ctx);
                for (uint32_t i = 0; i < k; i++) {
                    cr_assert_eq(got[i], mp[i]->st.l1, "%s: dropped page %u of %u", ctx, i, k);
                    m.l1_used[got[i]] = false;
                    mp[i]->st.l1 = KVT_NO_PAGE;
                }
                cnt[9]++;
            } else if (v->nchildren == 0 && idx == v->npages - 1 && p->st.flags == 0 && kvt_rng_below(&rng, 2)) {
                /* the tail run of pages in L1 only, in one call: any length of it */
                uint32_t run = 0, got[MAXP];
                while (run < v->npages && v->pages[v->npages - 1 - run].l2 == KVT_NO_PAGE &&
                       v->pages[v->npages - 1 - run].flags == 0)
                    run++;
                uint32_t k = run_length(&rng, run);
                mpage_t *mp[MAXP];
                model_run(&m, r, v, v->npages - 1, k, mp, ctx);
                cr_assert(mleaf(&m, mp[0]), "%s: trimming a page others extend", ctx);
                cr_assert_eq(kvt__radix_trim_l1_tail(r, v, k, got), k);
                for (uint32_t i = 0; i < k; i++) {
                    cr_assert_eq(got[i], mp[i]->st.l1, "%s: trimmed page %u of %u", ctx, i, k);
                    m.l1_used[got[i]] = false;
                    mp[i]->used = false;
                }
                cnt[8]++;
            } else if (v->nchildren == 0 && idx == v->npages - 1) {
                cnt[2]++;
                cr_assert(mleaf(&m, p), "%s: trimming a page others extend", ctx);
                kvt_page_t pg = kvt__radix_trim(r, v);
                cr_assert_eq(pg.l1, p->st.l1);
                m.l1_used[pg.l1] = false;
                p->used = false;
            }
        } else if (dice < 62) { /* L2 eviction step */
            kvt_rnode_t *v = kvt__radix_victim(r, KVT_VSET_L2_HOST);
            if (v) {
                cr_assert(v->lock == 0 && v->pin == 0 && v->nchildren == 0, "%s", ctx);
                mpage_t *p = model_of(&m, r, v, v->npages - 1);
                /* past the L1 prefix: only in L2, or loaded while a page above is not in L1 */
                cr_assert(p && kvt__page_in_l2(&p->st) && !(p->st.flags & KVT_PAGE_H2D) && mleaf(&m, p),
                          "%s: host victim is not a leaf page living in L2", ctx);
                uint32_t run = 0, got[MAXP];
                while (run < v->npages - v->n_l1 && v->pages[v->npages - 1 - run].l1 == KVT_NO_PAGE &&
                       v->pages[v->npages - 1 - run].flags == 0)
                    run++;
                if (run > 0 && kvt_rng_below(&rng, 2)) { /* the run of tail pages only in L2, in one call */
                    uint32_t k = run_length(&rng, run);
                    mpage_t *mp[MAXP];
                    model_run(&m, r, v, v->npages - 1, k, mp, ctx);
                    cr_assert(mleaf(&m, mp[0]), "%s: trimming a page others extend", ctx);
                    for (uint32_t i = 0; i < k; i++) cr_assert(mp[i]->st.l1 == KVT_NO_PAGE, "%s", ctx);
                    bool suspect = true;
                    cr_assert_eq(kvt__radix_l2_tail(v, k, got, &suspect), k);
                    cr_assert(!suspect, "%s: a page of the run marked suspect", ctx);
                    kvt__radix_cut_l2_tail(r, v, k, suspect);
                    for (uint32_t i = 0; i < k; i++) {
                        cr_assert_eq(got[i], mp[i]->st.l2, "%s: trimmed page %u of %u", ctx, i, k);
                        m.l2_used[got[i]] = false;
                        mp[i]->used = false;
                    }
                    cnt[10]++;
                } else {
                    kvt_page_t pg = kvt__radix_trim(r, v);
                    cr_assert(pg.l1 == p->st.l1 && pg.l2 == p->st.l2);
                    m.l2_used[pg.l2] = false;
                    if (pg.l1 != KVT_NO_PAGE) m.l1_used[pg.l1] = false;
                    p->used = false;
                    cnt[3]++;
                }
            } else if (kvt_rng_below(&rng, 3) == 0 && (v = kvt__radix_victim(r, KVT_VSET_L2_SHADOW)) != NULL) {
                uint32_t idx = v->n_l1;
                while (idx > 0 && !kvt__page_in_l2(&v->pages[idx - 1])) idx--;
                cr_assert_gt(idx, 0);
                mpage_t *p = model_of(&m, r, v, idx - 1);
                cr_assert(p && in_l1(&p->st) && p->st.l2 != KVT_NO_PAGE && !(p->st.flags & KVT_PAGE_D2H), "%s", ctx);
                uint32_t id = kvt__radix_drop_l2(r, v, idx - 1);
                m.l2_used[id] = false;
                p->st.l2 = KVT_NO_PAGE;
                cnt[4]++;
            }
        } else if (dice < 80 && nin < 64 && m.n > 0) { /* start a copy: half the time, a load */
            bool want_load = kvt_rng_below(&rng, 2), found = false;
            uint32_t i = (uint32_t)kvt_rng_below(&rng, m.n);
            for (uint32_t t = 0; t < m.n && !found; t++, i = (i + 1) % m.n)
                found = m.p[i].used && (m.p[i].st.l1 == KVT_NO_PAGE) == want_load;
            if (!found) continue;
            mpage_t *p = &m.p[(i + m.n - 1) % m.n];
            kvt_rnode_t *n;
            uint32_t idx;
            if (in_l1(&p->st) && p->st.l2 == KVT_NO_PAGE) {
                cr_assert(kvt__radix_search(r, 1, p->st.l1, &n, &idx));
                if (idx >= n->n_l1) continue; /* loaded but not yet part of the L1 prefix */
                p->st.l2 = take_id(m.l2_used, &rng);
                p->st.flags |= KVT_PAGE_D2H;
                kvt__radix_begin_backup(r, n, idx, p->st.l2);
                inflight[nin++] = (op_t){false, p->st.l2};
                cnt[5]++;
            } else if (p->st.l1 == KVT_NO_PAGE && p->st.l2 != KVT_NO_PAGE && !(p->st.flags & KVT_PAGE_D2H)) {
                cr_assert(kvt__radix_search(r, 2, p->st.l2, &n, &idx));
                p->st.l1 = take_id(m.l1_used, &rng);
                p->st.flags |= KVT_PAGE_H2D;
                kvt__radix_begin_load(r, n, idx, p->st.l1);
                inflight[nin++] = (op_t){true, p->st.l1};
                cnt[6]++;
            }
        } else if (nin > 0) { /* complete a copy, in any order, sometimes failing */
            uint32_t i = (uint32_t)kvt_rng_below(&rng, nin);
            op_t op = inflight[i];
            inflight[i] = inflight[--nin];
            bool ok = kvt_rng_below(&rng, 8) != 0;
            cnt[7] += !ok;
            kvt_rnode_t *n;
            uint32_t idx;
            if (op.load) {
                cr_assert(kvt__radix_locate_l1(r, op.id, &n, &idx));
                mpage_t *p = model_of(&m, r, n, idx);
                p->st.flags &= ~(uint32_t)KVT_PAGE_H2D;
                if (!ok) m.l1_used[p->st.l1] = false, p->st.l1 = KVT_NO_PAGE;
                kvt__radix_end_load(r, n, idx, ok);
            } else {
                cr_assert(kvt__radix_locate_l2(r, op.id, &n, &idx));
                mpage_t *p = model_of(&m, r, n, idx);
                p->st.flags &= ~(uint32_t)KVT_PAGE_D2H;
                if (!ok) m.l2_used[p->st.l2] = false, p->st.l2 = KVT_NO_PAGE;
                kvt__radix_end_backup(r, n, idx, ok);
            }
        }
        compare(&m, r, ctx);
    }
    kvt_radix_stats_t st = {.size = sizeof(st)};
    kvt_radix_stats(r, &st);
    fprintf(stderr, "radix fuzz seed %" PRIu64 ": %" PRIu64 " inserts, %" PRIu64 " splits, %" PRIu64 " L1 drops, %" PRIu64
            " L1 trims, %" PRIu64 " L2 trims, %" PRIu64 " shadow drops, %" PRIu64 " backups, %" PRIu64 " loads, %" PRIu64
            " failed copies, %" PRIu64 " runs of L1 trims, %" PRIu64 " runs of L1 drops, %" PRIu64
            " runs of L2 trims; %" PRIu64 " pages at the end\n",
            seed, cnt[0], st.splits, cnt[1], cnt[2], cnt[3], cnt[4], cnt[5], cnt[6], cnt[7], cnt[8], cnt[9], cnt[10], st.pages);
    for (int i = 0; i < 11; i++) cr_assert_gt(cnt[i], 0, "seed %" PRIu64 ": operation kind %d never ran", seed, i);
    cr_assert_gt(st.splits, 0);
    kvt__radix_destroy(r);
}

Test(radix, model_fuzz, .timeout = 300) {
    for (uint64_t seed = 1; seed <= 12; seed++) radix_fuzz(seed, 4000);
}

/* A split carries each page's state: build a long node with distinct page
 * states, then split it page by page with matches of every length. */
/* The node-array pool reuses what it holds: blocks of sizes log-uniform
 * from 64 B to 256 KiB, 100 live at a time, 400,000 frees and allocations in
 * random order, each block filled with its number and checked when freed (no
 * two overlap). From a quarter of the way on, what the pool holds must not
 * grow by more than a chunk, and it may have carved at most three times the
 * most the blocks ever needed at once, plus a chunk (blocks split for small
 * arrays are not joined again). The first pool served a class
 * from the next two when its list was empty and never split a block, so a
 * block that served a smaller class went back to that smaller class's list
 * for good: under a steady mix of sizes it carved 16 MiB chunks without end
 * (a soak's live metadata: 51 -> 115 MiB in 600 s). (Under AddressSanitizer
 * every array is an allocation of its own: held stays 0.) */
Test(radix, pool_reuses_what_it_holds, .timeout = 120) {
    kvt_radix_t *r;
    kvt__radix_config_t cfg = {4, 64, 64, lru, NULL, false};
    cr_assert_eq(kvt__radix_create(&r, &cfg), KVT_OK);
#if defined(__SANITIZE_ADDRESS__)
    enum { LIVE = 100, OPS = 40000 }; /* no pool to wear out: the arrays' bounds are what is checked */
#else
    enum { LIVE = 100, OPS = 400000 };
#endif
    static uint8_t *blk[LIVE];
    static size_t len[LIVE];
    kvt_rng_t rng;
    kvt_rng_seed(&rng, 11);
    uint64_t live = 0, peak = 0, quarter = 0;
    for (int op = 0; op < OPS + LIVE; op++) {
        int k = op < LIVE ? op : (int)(kvt_rng_next(&rng) % LIVE);
        if (op >= LIVE) {
            for (size_t j = 0; j < len[k]; j += 61) cr_assert_eq(blk[k][j], (uint8_t)k, "block %d was written over", k);
            kvt__pool_free(r, blk[k], len[k]);
            live -= len[k];
        }
        len[k] = (size_t)exp2(6 + 12 * (double)(kvt_rng_next(&rng) >> 11) / 9007199254740992.0);
        blk[k] = kvt__pool_alloc(r, len[k]);
        cr_assert_not_null(blk[k]);
        memset(blk[k], (uint8_t)k, len[k]);
        live += len[k];
        if (live > peak) peak = live;
        if (op == OPS / 4) quarter = r->pool.held;
    }
    fprintf(stderr, "pool: peak %.1f MiB live; held %.1f MiB at a quarter, %.1f MiB at the end, %.1f MiB on the free lists\n",
            (double)peak / 1048576, (double)quarter / 1048576, (double)r->pool.held / 1048576,
            (double)r->pool.free_bytes / 1048576);
    cr_assert_leq(r->pool.held, quarter + (16u << 20), "held %" PRIu64 " at the end, %" PRIu64 " at a quarter",
                  r->pool.held, quarter);
    uint64_t carved = r->pool.held - (uint64_t)(r->pool.end - r->pool.bump); /* the last chunk's rest is not used yet */
    cr_assert_leq(carved, 3 * peak + (16u << 20), "carved %" PRIu64 " for a peak of %" PRIu64, carved, peak);
    for (int k = 0; k < LIVE; k++) kvt__pool_free(r, blk[k], len[k]);
    /* arrays over 2 MiB are classes 64-67: the first pool had 64 lists, and a free of one wrote past them */
    for (size_t n = (2u << 20) + 1; n <= (4u << 20); n += 1u << 20) {
        void *big = kvt__pool_alloc(r, n);
        cr_assert_not_null(big);
        uint64_t held = r->pool.held;
        kvt__pool_free(r, big, n);
        cr_assert_eq(r->pool.held, held, "a free of %zu bytes left the pool's count alone", n);
#if !defined(__SANITIZE_ADDRESS__)
        cr_assert_eq(kvt__pool_alloc(r, n), big, "and the block serves the next array of its class");
        kvt__pool_free(r, big, n);
#endif
    }
    kvt__radix_destroy(r);
}

Test(radix, splits_keep_page_state) {
    kvt_radix_t *r;
    kvt__radix_config_t cfg = {4, 64, 64, lru, NULL, true};
    cr_assert_eq(kvt__radix_create(&r, &cfg), KVT_OK);
    int32_t tok[16 * 4];
    for (int i = 0; i < 16 * 4; i++) tok[i] = i;
    uint32_t ids[16];
    for (uint32_t i = 0; i < 16; i++) ids[i] = 40 - i;
    kvt__match_t mt;
    cr_assert_eq(kvt__radix_match(r, 7, tok, 16, 1, &mt), KVT_OK);
    kvt_rnode_t *n;
    cr_assert_eq(kvt__radix_insert(r, mt.node, 7, tok, 16, ids, 1, 0, &n), KVT_OK);
    for (uint32_t i = 0; i < 16; i += 3) { /* some pages get L2 copies */
        kvt__radix_begin_backup(r, n, i, 63 - i);
        kvt__radix_end_backup(r, n, i, true);
    }
    kvt__radix_suspect(r, n, 3); /* two copies found corrupt: found by their L2 ids through every split */
    kvt__radix_suspect(r, n, 9);
    kvt_hash128_t before[16];
    uint64_t key[16];
    for (uint32_t i = 0; i < 16; i++) cr_assert_eq(kvt_radix_page_hash(r, n, i, &before[i]), KVT_OK);
    for (uint32_t i = 0; i < 16; i++) key[i] = kvt__radix_page_key(n, i);
    const uint32_t cuts[] = {9, 3, 12, 1, 6, 15, 2};
    for (size_t c = 0; c < sizeof(cuts) / sizeof(cuts[0]); c++) {
        cr_assert_eq(kvt__radix_match(r, 7, tok, cuts[c], 2 + c, &mt), KVT_OK);
        cr_assert_eq(mt.pages, cuts[c]);
        cr_assert_eq(kvt_radix_check(r, NULL), KVT_OK);
        for (uint32_t i = 0; i < 16; i++) {
            kvt_rnode_t *x;
            uint32_t idx;
            cr_assert(kvt__radix_search(r, 1, 40 - i, &x, &idx));
            cr_assert_eq(x->tokens[idx * 4], (int32_t)(i * 4), "page %u moved", i);
            cr_assert_eq(x->pages[idx].l2, i % 3 == 0 ? 63 - i : KVT_NO_PAGE, "page %u lost its L2 copy", i);
            kvt_hash128_t h;
            cr_assert_eq(kvt_radix_page_hash(r, x, idx, &h), KVT_OK);
            cr_assert(h.lo == before[i].lo && h.hi == before[i].hi, "page %u hash changed by a split", i);
            cr_assert_eq(kvt__radix_page_key(x, idx), key[i], "page %u key changed by a split", i);
            kvt_rnode_t *y;
            uint32_t yi;
            bool suspect = i == 3 || i == 9;
            cr_assert_eq(kvt__radix_locate_l2(r, 63 - i, &y, &yi), suspect, "page %u: the L2 map %s it", i, suspect ? "lost" : "keeps");
            cr_assert(!suspect || (y == x && yi == idx), "page %u: the L2 map gives another place", i);
            cr_assert_eq((x->pages[idx].flags & KVT_PAGE_SUSPECT) != 0, suspect);
        }
    }
    /* a suspect copy that goes (here as a shadow reclaimed) is no longer found, nor marked */
    kvt_rnode_t *x;
    uint32_t idx, l2[16];
    cr_assert(kvt__radix_search(r, 1, 40 - 9, &x, &idx));
    cr_assert_eq(kvt__radix_drop_shadows(r, x, 1, l2), 1);
    cr_assert_eq(l2[0], 63 - 9);
    cr_assert(!(x->pages[idx].flags & KVT_PAGE_SUSPECT) && !kvt__radix_locate_l2(r, 63 - 9, &x, &idx));
    cr_assert(kvt__radix_locate_l2(r, 63 - 3, &x, &idx));
    cr_assert_eq(kvt_radix_check(r, NULL), KVT_OK);
    kvt_radix_stats_t st = {.size = sizeof(st)};
    kvt_radix_stats(r, &st);
    cr_assert_eq(st.nodes, 8);
    cr_assert_eq(st.splits, 7);
    cr_assert_eq(st.shadow_pages, 5);
    kvt__radix_destroy(r);
}

/* A split copies the smaller part: a head longer than the tail keeps the
 * node's arrays and the tail moves, a shorter head moves and the tail stays.
 * Every cut of a node of 40 pages, and of one trimmed from 40 to 24 (its
 * arrays still of 40, so that a head that keeps them may fill half or less),
 * with some pages backed up and hashes computed for the first h pages (h =
 * 0, 1, 17, all), each on a fresh tree, against the node's pages as they
 * were: tokens, states, keys and the hashes computed so far stay with their
 * pages, both nodes' arrays hold at most twice their pages, and check()
 * passes. */
Test(radix, a_split_moves_the_smaller_part) {
    enum { N = 40, T = 4 };
    static int32_t tok[N * T];
    for (int i = 0; i < N * T; i++) tok[i] = 1000 + i * 3;
    uint32_t ids[N];
    for (uint32_t i = 0; i < N; i++) ids[i] = N - 1 - i;
    for (uint32_t M = N; M >= 24; M -= 16) {
        const uint32_t computed[] = {0, 1, 17, M};
        for (size_t hc = 0; hc < sizeof(computed) / sizeof(computed[0]); hc++)
            for (uint32_t cut = 1; cut < M; cut++) {
                kvt_radix_t *r;
                kvt__radix_config_t cfg = {T, N, N, lru, NULL, true};
                cr_assert_eq(kvt__radix_create(&r, &cfg), KVT_OK);
                kvt_rnode_t *n;
                cr_assert_eq(kvt__radix_insert(r, kvt__radix_root(r), 0, tok, N, ids, 1, 0, &n), KVT_OK);
                while (n->npages > M) (void)kvt__radix_trim(r, n);
                cr_assert_eq(n->cap, N);
                for (uint32_t i = 0; i < M; i += 4) {
                    kvt__radix_begin_backup(r, n, i, i);
                    kvt__radix_end_backup(r, n, i, true);
                }
                kvt_hash128_t want[N];
                kvt_page_hash_chain(0, tok, M, T, want);
                uint64_t key[N];
                for (uint32_t i = 0; i < M; i++) key[i] = kvt__radix_page_key(n, i);
                kvt_hash128_t h;
                if (computed[hc]) cr_assert_eq(kvt_radix_page_hash(r, n, computed[hc] - 1, &h), KVT_OK);
                kvt__match_t mt;
                cr_assert_eq(kvt__radix_match(r, 0, tok, cut, 2, &mt), KVT_OK);
                cr_assert_eq(mt.pages, cut);
                const char *why = NULL;
                cr_assert_eq(kvt_radix_check(r, &why), KVT_OK, "cut %u, %u hashes: %s", cut, computed[hc], why);
                kvt_rnode_t *head = mt.node, *tail = head->first_child;
                cr_assert(head->npages == cut && tail != NULL && tail->npages == M - cut && tail->parent == head);
                uint32_t hashed[2] = {computed[hc] < cut ? computed[hc] : cut, computed[hc] > cut ? computed[hc] - cut : 0};
                cr_assert(head->nhash == hashed[0] && tail->nhash == hashed[1], "cut %u, %u hashes: %u and %u kept", cut,
                          computed[hc], head->nhash, tail->nhash);
                for (int side = 0; side < 2; side++) {
                    kvt_rnode_t *x = side ? tail : head;
                    cr_assert(x->cap < 2 * x->npages || x->cap == x->npages, "cut %u: %u pages in arrays of %u", cut,
                              x->npages, x->cap);
                    for (uint32_t idx = 0; idx < x->npages; idx++) {
                        uint32_t i = side ? cut + idx : idx;
                        cr_assert_eq(memcmp(x->tokens + idx * T, tok + i * T, sizeof(int32_t) * T), 0,
                                     "cut %u: page %u's tokens", cut, i);
                        cr_assert(x->pages[idx].l1 == N - 1 - i && x->pages[idx].l2 == (i % 4 ? KVT_NO_PAGE : i),
                                  "cut %u: page %u's state", cut, i);
                        cr_assert_eq(kvt__radix_page_key(x, idx), key[i], "cut %u: page %u's key", cut, i);
                        if (idx < x->nhash)
                            cr_assert(x->hash[idx].lo == want[i].lo && x->hash[idx].hi == want[i].hi,
                                      "cut %u: page %u's hash", cut, i);
                    }
                }
                cr_assert_eq(kvt_radix_page_hash(r, tail, M - cut - 1, &h), KVT_OK); /* the rest, computed after */
                cr_assert(h.lo == want[M - 1].lo && h.hi == want[M - 1].hi);
                kvt__radix_destroy(r);
            }
    }
}

/* A node trimmed to half its pages or fewer (or split so) moves its arrays to
 * blocks of its size: trim a 1,000-page node to 1 page, one page at a time,
 * and its capacity follows (at most twice its pages), every page left keeps
 * its tokens, state and key, and the tree's bytes in use (held less what its
 * pool holds free) fall with it. The first shrink is made to fail (no memory):
 * the trim still happens and the node keeps its arrays. */
static int fail_all(void *arg, const void *site) {
    (void)site;
    ++*(int *)arg;
    return 1;
}

Test(radix, trims_give_memory_back) {
    enum { N = 1000, T = 4 };
    kvt_radix_t *r;
    kvt__radix_config_t cfg = {T, N, N, lru, NULL, true};
    cr_assert_eq(kvt__radix_create(&r, &cfg), KVT_OK);
    static int32_t tok[N * T];
    static uint32_t ids[N];
    static uint64_t key[N];
    for (int i = 0; i < N * T; i++) tok[i] = i * 7 + 1;
    for (uint32_t i = 0; i < N; i++) ids[i] = i;
    kvt_rnode_t *n;
    cr_assert_eq(kvt__radix_insert(r, kvt__radix_root(r), 0, tok, N, ids, 1, 0, &n), KVT_OK);
    for (uint32_t i = 0; i < N; i++) key[i] = kvt__radix_page_key(n, i);
    kvt_hash128_t h0;
    cr_assert_eq(kvt_radix_page_hash(r, n, N / 3, &h0), KVT_OK); /* hashes computed for a third: they move too */
    kvt_radix_stats_t full = {.size = sizeof(full)}, now = {.size = sizeof(now)};
    kvt_radix_stats(r, &full);
    for (uint32_t left = N - 1; left >= 1; left--) {
        int refused = 0;
        if (left == N / 2) kvt__mem_set_hook(fail_all, &refused);
        kvt_page_t pg = kvt__radix_trim(r, n);
        if (left == N / 2) {
            kvt__mem_set_hook(NULL, NULL);
            (void)kvt__mem_fail_fired(); /* disarm */
            cr_assert_gt(refused, 0, "the shrink did not allocate");
            cr_assert_eq(n->cap, N, "a shrink without memory changed the node");
        }
        cr_assert_eq(pg.l1, left);
        cr_assert_eq(n->npages, left);
        cr_assert_leq(n->cap, 2 * left, "%u pages in arrays of %u", left, n->cap);
        if (left % 97 == 0 || left < 4) {
            const char *why = NULL;
            cr_assert_eq(kvt_radix_check(r, &why), KVT_OK, "%u pages: %s", left, why);
            for (uint32_t i = 0; i < left; i++) {
                cr_assert_eq(n->tokens[i * T], tok[i * T]);
                cr_assert_eq(n->pages[i].l1, i);
                cr_assert_eq(kvt__radix_page_key(n, i), key[i]);
            }
        }
    }
    kvt_hash128_t h;
    cr_assert_eq(kvt_radix_page_hash(r, n, 0, &h), KVT_OK);
    kvt_radix_stats(r, &now);
    uint64_t before = full.metadata_bytes - full.pool_free_bytes, after = now.metadata_bytes - now.pool_free_bytes;
    cr_assert_lt(after + N * (T * sizeof(int32_t) + sizeof(kvt_page_t)) * 9 / 10, before,
                 "tree bytes in use %" PRIu64 " -> %" PRIu64, before, after);
    kvt__radix_destroy(r);
}

/* The capacity of a cut of k pages in one step is the one k single trims
 * reach, halving (shrink) where they would: every cap up to 300, every page
 * count up to cap (below cap / 2 too: a shrink that found no memory), every
 * cut that leaves a page. */
Test(radix, cap_after_trims) {
    for (uint32_t cap = 1; cap <= 300; cap++)
        for (uint32_t npages = 1; npages <= cap; npages++)
            for (uint32_t k = 1; k < npages; k++) {
                uint32_t m = npages, want = cap;
                for (uint32_t i = 0; i < k; i++)
                    if (--m <= want / 2) want = m; /* kvt__radix_trim's shrink, m > 0 */
                uint32_t got = kvt__cap_after_trims(npages, cap, k);
                if (got != want) cr_assert_fail("cap %u, %u pages, cut %u: %u, single trims %u", cap, npages, k, got, want);
            }
}

/* A run of tail trims in one call leaves what as many single trims leave:
 * the same pages, keys and hashes, arrays of the same size (the halvings one
 * trim at a time would make, in one move), the same bytes in use, the L1 ids
 * tail first; the node goes with its last page. */
Test(radix, trim_runs_are_single_trims) {
    enum { N = 1000, T = 4 };
    static int32_t tok[N * T];
    static uint32_t ids[N], got[N];
    for (int i = 0; i < N * T; i++) tok[i] = i * 5 + 3;
    for (uint32_t i = 0; i < N; i++) ids[i] = i;
    kvt_radix_t *r[2];
    kvt_rnode_t *n[2];
    for (int t = 0; t < 2; t++) {
        kvt__radix_config_t cfg = {T, N, N, lru, NULL, true};
        cr_assert_eq(kvt__radix_create(&r[t], &cfg), KVT_OK);
        cr_assert_eq(kvt__radix_insert(r[t], kvt__radix_root(r[t]), 0, tok, N, ids, 1, 0, &n[t]), KVT_OK);
        kvt_hash128_t h;
        cr_assert_eq(kvt_radix_page_hash(r[t], n[t], N / 3, &h), KVT_OK);
    }
    kvt_rng_t rng;
    kvt_rng_seed(&rng, 7);
    uint32_t left = N, runs = 0;
    while (left > 0) {
        uint32_t k = 1 + (uint32_t)kvt_rng_below(&rng, left < 97 ? left : 97);
        cr_assert_eq(kvt__radix_trim_l1_tail(r[1], n[1], k, got), k);
        for (uint32_t i = 0; i < k; i++) {
            kvt_page_t pg = kvt__radix_trim(r[0], n[0]);
            cr_assert_eq(got[i], pg.l1, "run %u: id %u of %u", runs, i, k);
            cr_assert_eq(got[i], left - 1 - i);
        }
        left -= k;
        runs++;
        kvt_radix_stats_t s[2] = {{.size = sizeof(s[0])}, {.size = sizeof(s[1])}};
        for (int t = 0; t < 2; t++) {
            const char *why = NULL;
            cr_assert_eq(kvt_radix_check(r[t], &why), KVT_OK, "%u pages: %s", left, why);
            kvt_radix_stats(r[t], &s[t]);
        }
        cr_assert_eq(s[1].nodes, s[0].nodes);
        cr_assert_eq(s[1].metadata_bytes - s[1].pool_free_bytes, s[0].metadata_bytes - s[0].pool_free_bytes,
                     "%u pages: bytes in use differ", left);
        if (left == 0) break;
        cr_assert_eq(n[1]->npages, left);
        cr_assert_eq(n[1]->n_l1, left);
        cr_assert_eq(n[1]->cap, n[0]->cap, "%u pages: arrays of %u, single trims %u", left, n[1]->cap, n[0]->cap);
        cr_assert_eq(n[1]->nhash, n[0]->nhash);
        cr_assert_eq(memcmp(n[1]->tokens, n[0]->tokens, (size_t)left * T * sizeof(int32_t)), 0);
        cr_assert_eq(memcmp(n[1]->key, n[0]->key, (size_t)left * sizeof(uint64_t)), 0);
        cr_assert_eq(memcmp(n[1]->hash, n[0]->hash, (size_t)n[1]->nhash * sizeof(kvt_hash128_t)), 0);
    }
    cr_assert_gt(runs, 10);
    for (int t = 0; t < 2; t++) kvt__radix_destroy(r[t]);
}

/* Page keys at every page size, the 16-token pages' flattened loop among them
 * (the model fuzz above uses pages of PT tokens): the keys an insert stores
 * and those kvt__radix_keys gives, from any page on, are the chain written
 * out (mkey's), for a node under the root and one under it. */
Test(radix, page_keys_are_the_chain_at_every_page_size) {
    static int32_t tok[80 * 32];
    kvt_rng_t rng;
    kvt_rng_seed(&rng, 5);
    for (size_t i = 0; i < sizeof(tok) / sizeof(tok[0]); i++) tok[i] = (int32_t)kvt_rng_next(&rng);
    const uint32_t sizes[] = {1, 4, 15, 16, 17, 32};
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        uint32_t pt = sizes[s], ns = 3;
        kvt_radix_t *r;
        kvt__radix_config_t cfg = {pt, 256, 0, lru, NULL, true};
        cr_assert_eq(kvt__radix_create(&r, &cfg), KVT_OK);
        uint32_t ids[80];
        for (uint32_t i = 0; i < 80; i++) ids[i] = i;
        kvt_rnode_t *top, *below;
        cr_assert_eq(kvt__radix_insert(r, kvt__radix_root(r), ns, tok, 50, ids, 1, 0, &top), KVT_OK);
        cr_assert_eq(kvt__radix_insert(r, top, ns, tok + 50 * pt, 30, ids + 50, 1, 0, &below), KVT_OK);
        uint64_t want[80], k = splitmix(ns + 0x6b767469657231ull);
        for (uint32_t i = 0; i < 80; i++) want[i] = k = k * 0x9e3779b97f4a7c15ull + XXH3_64bits(tok + i * pt, pt * sizeof(int32_t));
        for (uint32_t i = 0; i < 80; i++)
            cr_assert_eq(i < 50 ? top->key[i] : below->key[i - 50], want[i], "page %u of %u tokens", i, pt);
        for (uint32_t from = 0; from < 80; from += 7) {
            uint64_t got[80];
            kvt__radix_keys(r, from ? want[from - 1] : splitmix(ns + 0x6b767469657231ull), tok + from * pt, 80 - from, got);
            cr_assert_eq(memcmp(got, want + from, (80 - from) * sizeof(uint64_t)), 0, "keys from page %u, %u tokens", from, pt);
        }
        cr_assert_eq(kvt_radix_check(r, NULL), KVT_OK);
        kvt__radix_destroy(r);
    }
}

/* kvt_radix_check finds a page id held twice (the reverse maps no longer
 * hold every page, so its walk's bitmaps do), in L1 and in L2, and a check
 * leaves the tree as it was. */
Test(radix, check_finds_an_id_held_twice) {
    kvt_radix_t *r;
    kvt__radix_config_t cfg = {4, 64, 64, lru, NULL, false};
    cr_assert_eq(kvt__radix_create(&r, &cfg), KVT_OK);
    int32_t tok[8 * 4];
    for (int i = 0; i < 8 * 4; i++) tok[i] = i;
    uint32_t ids[8] = {3, 9, 4, 60, 61, 0, 7, 12};
    kvt_rnode_t *n;
    cr_assert_eq(kvt__radix_insert(r, kvt__radix_root(r), 1, tok, 8, ids, 1, 0, &n), KVT_OK);
    kvt__radix_backups_done(r, n, 2, 3, (uint32_t[]){40, 41, 42});
    const char *why = NULL;
    cr_assert_eq(kvt_radix_check(r, &why), KVT_OK, "%s", why);
    cr_assert(kvt__radix_held(r, 1, 61) && !kvt__radix_held(r, 1, 62) && kvt__radix_held(r, 2, 42) && !kvt__radix_held(r, 2, 43));
    n->pages[6].l1 = 9; /* page 1's */
    cr_assert_eq(kvt_radix_check(r, &why), KVT_ECORRUPT);
    cr_assert_str_eq(why, "L1 page id out of range or held twice");
    n->pages[6].l1 = 7;
    n->pages[3].l2 = 40; /* page 2's */
    cr_assert_eq(kvt_radix_check(r, &why), KVT_ECORRUPT);
    cr_assert_str_eq(why, "L2 page id out of range or held twice");
    n->pages[3].l2 = 41;
    cr_assert_eq(kvt_radix_check(r, &why), KVT_OK, "%s", why);
    kvt__radix_destroy(r);
}
