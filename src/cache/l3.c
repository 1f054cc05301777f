/* The cache's third tier: L2 -> L3 backups under a write policy, L3 -> L2
 * prefetches finished by admission under a prefetch policy.
 *
 * L3 is a store (kvt_cache_attach_store: calls complete later, on its
 * workers) or, for metadata-only runs, a model of one (cfg.l3_pages: an exact
 * LRU set of page hashes whose calls complete at once). Pages are named by
 * their chained page hash (radix.h); the store adds the model identity.
 *
 *   put        a page valid in L2 is queued (its L2 page marked busy) and
 *              handed to the store at the next poll; the store's answer
 *              clears busy and, when acknowledged, remembers the hash as
 *              known to be in L3 (l3.own, FIFO). An L2 page given back while
 *              busy (evicted, or write_back: evicted, hence the put) is
 *              deferred: it returns to the allocator when the answer comes.
 *
 *   prefetch   at arrival: the pages past the L1+L2 match, their hashes
 *              chained from the match; the leading known ones need no exists
 *              call, the rest are looked up in exists windows that double
 *              while every key is present (32, 64, ... 1024: a miss costs one
 *              small call); then L2 pages are taken for what the store has and
 *              fetched in batches of PF_CHUNK (get: the store checks every
 *              object before it lands; a failure is a miss). L2 pages whose
 *              puts are in flight come back when the store answers: a
 *              prefetch that found too little room takes more as they do
 *              (in an order set by the prefetch policy: advance()), and gives
 *              up the rest only when none is out (under write_back into L3
 *              the room a prefetch makes by evicting L2 pages is exactly
 *              such pages):
 *
 *                  LOOKUP --exists answered--> READY --L2 pages, gets--> FETCHING --last get--> DONE
 *
 *   finish     at admission (kvt_cache_admit_prefetched), under the policy:
 *              best_effort takes what has arrived, wait_complete waits for
 *              DONE, timeout waits until the deadline; the leading pages that
 *              arrived join the tree below the match as pages only in L2
 *              (marked fresh: an L3 hit when admission loads them into L1);
 *              the rest goes back (pages still being fetched: deferred).
 *
 * Only the cache's thread runs this; the store's workers never touch the
 * tree or the pages' state here.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache-int.h"
#include "kvtier/error.h"
#include "kvtier/stats.h"
#include "../core/check-int.h"
#include "../core/mem-int.h"
#include "../xfer/xfer-int.h"

#define PF_CHUNK 32             /* pages a get batch, and the first exists window */
#define PF_PROBE_MAX 1024       /* the largest exists window */
#define PF_MAX_PAGES (1u << 20) /* pages one prefetch may fetch */
#define PF_USER_SHIFT 21        /* a batch's user tag: prefetch id << shift | first page index */
#define PUTQ_CAP 256            /* puts queued before they are handed to the store */
#define WAIT_NS 20000000ull     /* one wait for a store answer; callers loop */

enum { PF_LOOKUP, PF_READY, PF_FETCHING, PF_DONE };
enum { RES_ASKED = 0, RES_OK = 1, RES_GONE = 2 };

struct kvt__pf {
    uint64_t id;
    uint32_t ns;
    uint64_t first;        /* the request's page index of the first page wanted (the match then) */
    uint64_t want;         /* pages past the match */
    uint64_t found;        /* leading pages the store has (known + exists); cut to `taken` when no more L2 room comes */
    uint64_t taken;        /* leading pages given an L2 page and asked for, <= found */
    uint64_t returned;     /* l3.l2_returned when it last took pages */
    uint64_t arrived;      /* leading pages that landed in L2 */
    uint64_t ntokens;      /* the request's tokens (the timeout) */
    uint64_t start_ns;
    uint64_t probe;        /* LOOKUP: pages asked so far (the window in flight ends here) */
    uint32_t out;          /* store calls in flight */
    uint8_t phase;
    kvt_rnode_t *node;     /* the match it follows, locked until it is over (its pages stay) */
    kvt_hash128_t *hash;   /* want */
    uint32_t *l2;          /* want: the page's L2 page while the prefetch holds it, else KVT_NO_PAGE */
    uint8_t *res;          /* want: RES_* */
    size_t bytes;
};

/* ---- pages and their marks ---------------------------------------------------------- */

static uint64_t key_of(const kvt_hash128_t *h) { return h->lo; }

/* Whether L3 is known to hold the page: the model's own set, or this cache's
 * acknowledged puts. */
static bool known(const kvt_cache_t *c, const kvt_hash128_t *h) {
    return c->l3.store ? kvt__ghost_has(&c->l3.own, key_of(h)) : kvt__lru_has(&c->l3.model, key_of(h));
}

bool kvt__l3_hold(kvt_cache_t *c, uint32_t l2) {
    if (c->l3.flags[l2] & KVT__L3_BUSY) {
        KVT_ASSERT(!(c->l3.flags[l2] & KVT__L3_DEFER));
        c->l3.flags[l2] = KVT__L3_BUSY | KVT__L3_DEFER;
        c->l3.l2_deferred++;
        return true;
    }
    c->l3.flags[l2] = 0;
    return false;
}

unsigned kvt__l3_served(kvt_cache_t *c, uint32_t l2) {
    unsigned f = c->l3.flags[l2] & (KVT__L3_FRESH | KVT__L3_FOREIGN);
    c->l3.flags[l2] &= (uint8_t)~(KVT__L3_FRESH | KVT__L3_FOREIGN);
    return f;
}

/* A store call let go of an L2 page: a deferred one goes back now. */
static void release(kvt_cache_t *c, uint32_t l2) {
    KVT_ASSERT(c->l3.flags[l2] & KVT__L3_BUSY);
    c->l3.flags[l2] &= (uint8_t)~KVT__L3_BUSY;
    if (c->l3.flags[l2] & KVT__L3_DEFER) {
        c->l3.flags[l2] = 0;
        c->l3.l2_deferred--;
        c->l3.l2_returned++;
        c->l2_back.id[c->l2_back.n++] = l2; /* counted free when it was given back */
    }
}

/* ---- puts ---------------------------------------------------------------------------- */

static void flush_puts(kvt_cache_t *c) {
    if (c->l3.nq == 0) return;
    if (kvt_store_put(c->l3.store, c->l3.q, c->l3.nq, 0, NULL) == KVT_OK) {
        c->l3.calls++;
    } else { /* refused (no memory): nothing was queued, so nothing is held */
        for (size_t i = 0; i < c->l3.nq; i++) release(c, c->l3.q[i].page);
        c->st.l3_put_failures += c->l3.nq;
    }
    c->l3.nq = 0;
}

void kvt__l3_put(kvt_cache_t *c, kvt_rnode_t *n, uint32_t idx) {
    const kvt_page_t *pg = &n->pages[idx];
    KVT_ASSERT(kvt__page_in_l2(pg));
    kvt_hash128_t h;
    if (kvt__radix_page_hash(c->tree, n, idx, &h) != KVT_OK) return; /* no memory for the hashes: not put */
    if ((c->l3.flags[pg->l2] & (KVT__L3_BUSY | KVT__L3_STORED)) || known(c, &h)) {
        c->st.l3_puts_skipped++;
        return;
    }
    if (c->l3.store == NULL) { /* the model: stored at once */
        c->st.l3_evictions += kvt__lru_put(&c->l3.model, key_of(&h));
        c->st.l3_puts++;
        return;
    }
    c->l3.flags[pg->l2] |= KVT__L3_BUSY;
    c->l3.q[c->l3.nq++] = (kvt_store_page_t){h, pg->l2};
    if (c->l3.nq == PUTQ_CAP) flush_puts(c);
}

void kvt__l3_selective(kvt_cache_t *c, kvt_rnode_t *end) {
    for (kvt_rnode_t *x = end; x != kvt__radix_root(c->tree); x = x->parent) {
        if (x->hits < c->cfg.l3_write_hits) continue;
        for (uint32_t i = 0; i < x->npages; i++)
            if (kvt__page_in_l2(&x->pages[i])) kvt__l3_put(c, x, i);
    }
}

/* ---- prefetches ----------------------------------------------------------------------- */

static kvt__pf_t *pf_find(kvt_cache_t *c, uint64_t id, size_t *at) {
    for (size_t i = 0; i < c->l3.npf; i++)
        if (c->l3.pf[i]->id == id) {
            if (at) *at = i;
            return c->l3.pf[i];
        }
    return NULL;
}

static kvt__pf_t *pf_new(kvt_cache_t *c, uint64_t want) {
    if (c->l3.npf == c->l3.pf_cap) {
        size_t cap = c->l3.pf_cap ? 2 * c->l3.pf_cap : 16;
        kvt__pf_t **p = kvt__realloc(c->l3.pf, c->l3.pf_cap * sizeof(*p), cap * sizeof(*p));
        if (p == NULL) return NULL;
        c->l3.pf = p;
        c->l3.pf_cap = cap;
    }
    size_t bytes = sizeof(kvt__pf_t) + want * (sizeof(kvt_hash128_t) + sizeof(uint32_t) + 1);
    kvt__pf_t *pf = kvt__calloc(1, bytes);
    if (pf == NULL) return NULL;
    pf->bytes = bytes;
    pf->hash = (kvt_hash128_t *)(pf + 1);
    pf->l2 = (uint32_t *)(pf->hash + want);
    pf->res = (uint8_t *)(pf->l2 + want);
    for (uint64_t j = 0; j < want; j++) pf->l2[j] = KVT_NO_PAGE;
    pf->want = want;
    pf->id = ++c->l3.next_pf;
    c->l3.pf[c->l3.npf++] = pf;
    return pf;
}

/* Gives back the L2 pages the prefetch still holds from page `from` on. */
static void pf_drop_pages(kvt_cache_t *c, kvt__pf_t *pf, uint64_t from) {
    for (uint64_t j = from; j < pf->want; j++)
        if (pf->l2[j] != KVT_NO_PAGE) {
            kvt__cache_give_back_l2(c, pf->l2[j]);
            pf->l2[j] = KVT_NO_PAGE;
        }
}

static void pf_free(kvt_cache_t *c, kvt__pf_t *pf) {
    size_t at;
    if (pf->node) kvt__radix_lock(c->tree, pf->node, -1);
    if (pf_find(c, pf->id, &at)) { /* the others keep their order */
        memmove(&c->l3.pf[at], &c->l3.pf[at + 1], (c->l3.npf - at - 1) * sizeof(*c->l3.pf));
        c->l3.npf--;
    }
    kvt__free(pf, pf->bytes);
}

/* A prefetch is over when no get is out and every page the store has has
 * been asked for (or the room for the rest will not come). */
static void pf_settle(kvt__pf_t *pf) {
    if (pf->out == 0 && pf->taken == pf->found) pf->phase = PF_DONE;
}

/* READY, or FETCHING short of room: L2 pages for the next pages the store
 * has, then their gets, in batches. Never waits: what the store's puts still
 * hold comes back at a later poll, and the prefetch takes it then. */
static void pf_fetch(kvt_cache_t *c, kvt__pf_t *pf) {
    pf->phase = PF_FETCHING;
    uint64_t from = pf->taken;
    c->l3.no_wait = true;
    uint64_t got = pf->found > from ? kvt__cache_take_l2(c, pf->found - from, pf->l2 + from) : 0;
    c->l3.no_wait = false;
    pf->taken += got;
    pf->returned = c->l3.l2_returned;
    if (pf->taken < pf->found && c->l3.l2_deferred == 0) pf->found = pf->taken; /* no room is on its way */
    c->st.prefetch_pages += got;
    kvt_store_page_t batch[PF_CHUNK];
    for (uint64_t j0 = from; j0 < pf->taken; j0 += PF_CHUNK) {
        size_t k = pf->taken - j0 < PF_CHUNK ? (size_t)(pf->taken - j0) : PF_CHUNK;
        for (size_t i = 0; i < k; i++) {
            batch[i] = (kvt_store_page_t){pf->hash[j0 + i], pf->l2[j0 + i]};
            c->l3.flags[pf->l2[j0 + i]] |= KVT__L3_BUSY;
        }
        if (kvt_store_get(c->l3.store, batch, k, pf->id << PF_USER_SHIFT | j0, NULL) == KVT_OK) {
            pf->out++;
            c->l3.calls++;
            c->st.l3_get_calls++;
            continue;
        }
        for (size_t i = 0; i < k; i++) { /* refused: these pages do not come */
            release(c, pf->l2[j0 + i]);
            pf->res[j0 + i] = RES_GONE;
        }
    }
    pf_settle(pf);
}

/* Who gets the room that comes back first depends on what admission will
 * do with it. Under wait_complete the oldest prefetch: its request is
 * admitted next and waits for every page, so a younger one taking the room
 * would only cut the head short. Under best_effort and timeout the youngest:
 * the head is admitted before gets started now can land, and what has not
 * landed is dropped, while the younger ones have the lead time (docs/store.md
 * has the figures). A prefetch short of room looks again only when a
 * deferred page has gone back since it last took some (the last one going
 * back is also when it learns that no more will). */
static void advance(kvt_cache_t *c) {
    bool oldest = c->cfg.prefetch_policy == KVT_PREFETCH_WAIT_COMPLETE;
    for (size_t j = 0; j < c->l3.npf; j++) {
        kvt__pf_t *pf = c->l3.pf[oldest ? j : c->l3.npf - 1 - j];
        if (pf->phase == PF_READY ||
            (pf->phase == PF_FETCHING && pf->taken < pf->found && pf->returned != c->l3.l2_returned))
            pf_fetch(c, pf);
    }
}

/* ---- store answers -------------------------------------------------------------------- */

static void on_put(kvt_cache_t *c, const kvt_store_done_t *d) {
    for (size_t i = 0; i < d->n; i++) {
        uint32_t l2 = d->pages[i].page;
        if (d->results[i] == KVT_STORE_OK && !(c->l3.flags[l2] & KVT__L3_DEFER)) c->l3.flags[l2] |= KVT__L3_STORED;
        release(c, l2);
        if (d->results[i] == KVT_STORE_OK) {
            kvt__ghost_add(&c->l3.own, key_of(&d->pages[i].hash));
            c->st.l3_puts++;
        } else {
            c->st.l3_put_failures++;
        }
    }
}

/* An exists window of n keys from page `from`: a prefix is looked up in
 * windows that double (32, 64, ... 1024 keys), each asked only when the one
 * before was all present, so a miss costs one small call however long the
 * request. false when the store refused it. */
static bool probe(kvt_cache_t *c, kvt__pf_t *pf, uint64_t from, uint64_t n) {
    kvt_store_page_t q[PF_PROBE_MAX];
    for (uint64_t j = 0; j < n; j++) q[j] = (kvt_store_page_t){pf->hash[from + j], 0};
    if (kvt_store_exists(c->l3.store, q, n, pf->id << PF_USER_SHIFT | from, NULL) != KVT_OK) return false;
    pf->probe = from + n;
    pf->out++;
    c->l3.calls++;
    c->st.l3_exists_calls++;
    return true;
}

static void on_exists(kvt_cache_t *c, const kvt_store_done_t *d) {
    kvt__pf_t *pf = pf_find(c, d->user >> PF_USER_SHIFT, NULL);
    if (pf == NULL) return; /* finished or cancelled meanwhile */
    pf->out--;
    pf->found += d->count;
    uint64_t next = 2 * d->n < PF_PROBE_MAX ? 2 * d->n : PF_PROBE_MAX;
    if (d->count == d->n && pf->probe < pf->want &&
        probe(c, pf, pf->probe, pf->want - pf->probe < next ? pf->want - pf->probe : next))
        return; /* all there: the next window */
    pf->phase = PF_READY;
}

static void on_get(kvt_cache_t *c, const kvt_store_done_t *d) {
    kvt__pf_t *pf = pf_find(c, d->user >> PF_USER_SHIFT, NULL);
    uint64_t j0 = d->user & ((1ull << PF_USER_SHIFT) - 1);
    for (size_t i = 0; i < d->n; i++) {
        uint32_t l2 = d->pages[i].page;
        bool ok = d->results[i] == KVT_STORE_OK;
        if (pf && !(c->l3.flags[l2] & KVT__L3_DEFER)) { /* still the prefetch's page */
            pf->res[j0 + i] = ok ? RES_OK : RES_GONE;
            if (ok)
                c->l3.flags[l2] |= KVT__L3_FRESH | KVT__L3_STORED | (known(c, &d->pages[i].hash) ? 0 : KVT__L3_FOREIGN);
        }
        if (!ok) {
            c->st.l3_misses++;
            if (kvt__ghost_take(&c->l3.own, key_of(&d->pages[i].hash))) c->st.l3_stale_marks++; /* the store lost it */
        }
        release(c, l2);
    }
    if (pf == NULL) return;
    while (pf->arrived < pf->taken && pf->res[pf->arrived] == RES_OK) pf->arrived++;
    pf->out--;
    pf_settle(pf);
}

/* Applies the store's answers, waiting up to timeout_ns for the first. */
static int reap(kvt_cache_t *c, uint64_t timeout_ns) {
    if (c->l3.store == NULL || c->l3.calls == 0) return 0;
    kvt_store_done_t d[16];
    int k = kvt_store_poll(c->l3.store, d, 16, timeout_ns);
    for (int i = 0; i < k; i++) {
        c->l3.calls--;
        if (d[i].op == KVT_STORE_PUT) on_put(c, &d[i]);
        else if (d[i].op == KVT_STORE_EXISTS) on_exists(c, &d[i]);
        else if (d[i].op == KVT_STORE_GET) on_get(c, &d[i]);
    }
    return k > 0 ? k : 0;
}

void kvt__l3_poll(kvt_cache_t *c, uint64_t timeout_ns, bool advance_) {
    if (c->l3.store == NULL) return;
    flush_puts(c);
    if (reap(c, timeout_ns) > 0)
        while (reap(c, 0) > 0) {}
    if (advance_) advance(c);
}

void kvt__l3_wait_room(kvt_cache_t *c, uint64_t n) {
    while (c->l3.l2_deferred > 0 && c->l2_free - c->l3.l2_deferred < n && (c->l3.nq || c->l3.calls)) {
        flush_puts(c);
        reap(c, WAIT_NS);
        if (kvt__cache_flush(c) != KVT_OK) return;
    }
}

void kvt__l3_sync(kvt_cache_t *c) {
    if (c->l3.store == NULL) return;
    flush_puts(c);
    while (c->l3.calls) reap(c, WAIT_NS);
    kvt__cache_flush(c);
}

/* ---- the public calls ------------------------------------------------------------------- */

int kvt_cache_prefetch(kvt_cache_t *c, uint32_t ns, const int32_t *tokens, uint64_t ntokens, uint64_t *id) {
    if (c == NULL || id == NULL || (tokens == NULL && ntokens > 0)) return KVT_EINVAL;
    *id = 0;
    if (!kvt__l3_on(c)) return KVT_OK;
    uint32_t pt = c->cfg.page_tokens;
    uint64_t npages = ntokens / pt;
    kvt__match_t m;
    int rc = kvt__radix_match(c->tree, ns, tokens, npages, 0, &m); /* a look, not a hit */
    if (rc != KVT_OK) return rc;
    uint64_t want = npages - m.pages;
    if (want == 0) return KVT_OK;
    if (want * pt < c->cfg.prefetch_threshold) {
        c->st.prefetch_below_threshold++;
        return KVT_OK;
    }
    uint64_t cap = c->cfg.l2_pages / 2 < PF_MAX_PAGES ? c->cfg.l2_pages / 2 : PF_MAX_PAGES;
    if (want > cap) want = cap;
    if (want == 0) return KVT_OK;
    kvt__pf_t *pf = pf_new(c, want);
    if (pf == NULL) return KVT_ENOMEM;
    kvt_hash128_t prev = {0, 0};
    if (m.pages > 0 && (rc = kvt__radix_page_hash(c->tree, m.node, m.node->npages - 1, &prev)) != KVT_OK) {
        pf_free(c, pf);
        return rc;
    }
    for (uint64_t j = 0; j < want; j++)
        pf->hash[j] = kvt_page_hash(j ? &pf->hash[j - 1] : &prev, ns, tokens + (m.pages + j) * pt, pt);
    pf->ns = ns;
    pf->node = m.node;
    kvt__radix_lock(c->tree, m.node, +1); /* what it follows stays until admission */
    pf->first = m.pages;
    pf->ntokens = ntokens;
    pf->start_ns = kvt_now_ns();
    uint64_t k = 0;
    while (k < want && known(c, &pf->hash[k])) k++;
    c->st.l3_known_hits += k;
    if (c->l3.store == NULL) { /* the model answers at once: a get of the leading pages it holds */
        for (uint64_t j = 0; j < k; j++) kvt__lru_touch(&c->l3.model, key_of(&pf->hash[j]));
        if (k == 0) {
            pf_free(c, pf);
            return KVT_OK;
        }
        pf->found = pf->taken = kvt__cache_take_l2(c, k, pf->l2);
        for (uint64_t j = 0; j < pf->found; j++) {
            c->l3.flags[pf->l2[j]] |= KVT__L3_FRESH | KVT__L3_STORED;
            pf->res[j] = RES_OK;
        }
        c->st.prefetch_pages += pf->found;
        pf->arrived = pf->found;
        pf->phase = PF_DONE;
    } else {
        pf->found = k;
        pf->phase = PF_READY;
        if (k < want && probe(c, pf, k, want - k < PF_CHUNK ? want - k : PF_CHUNK)) /* the rest is looked up */
            pf->phase = PF_LOOKUP;
        if (pf->phase == PF_READY) pf_fetch(c, pf);
    }
    c->st.prefetches++;
    *id = pf->id;
    return KVT_OK;
}

/* The wait an admission gives the prefetch under the policy; done when the
 * prefetch is DONE or the wait is over. */
static uint64_t pf_wait(kvt_cache_t *c, kvt__pf_t *pf) {
    uint64_t t0 = kvt_now_ns(), deadline = UINT64_MAX;
    if (c->cfg.prefetch_policy == KVT_PREFETCH_BEST_EFFORT) {
        kvt__l3_poll(c, 0, true); /* what has arrived by now */
        return 0;
    }
    if (c->cfg.prefetch_policy == KVT_PREFETCH_TIMEOUT) {
        double s = c->cfg.prefetch_timeout_s + c->cfg.prefetch_timeout_per_1024_s * (double)pf->ntokens / 1024.0;
        if (s > c->cfg.prefetch_timeout_max_s) s = c->cfg.prefetch_timeout_max_s;
        deadline = pf->start_ns + (uint64_t)(s * 1e9);
    }
    for (;;) {
        uint64_t now = kvt_now_ns();
        if (pf->phase == PF_DONE || now >= deadline) return now - t0;
        uint64_t left = deadline - now;
        kvt__l3_poll(c, left < WAIT_NS ? left : WAIT_NS, true);
    }
}

/* Whether tokens are those pf was started with: the chained hash of its
 * last page, over every token before it, is the one it keeps. Checked before
 * the wait, whatever has arrived (the pages' own check below covers only
 * those, and only those past the match). */
static bool pf_same_tokens(const kvt__pf_t *pf, uint32_t ns, const int32_t *tokens, uint32_t pt) {
    kvt_hash128_t h = {0, 0};
    for (uint64_t j = 0; j < pf->first + pf->want; j++) h = kvt_page_hash(&h, ns, tokens + j * pt, pt);
    return h.lo == pf->hash[pf->want - 1].lo && h.hi == pf->hash[pf->want - 1].hi;
}

int kvt__l3_finish(kvt_cache_t *c, uint64_t id, uint32_t ns, const int32_t *tokens, uint64_t ntokens,
                   int32_t priority, kvt_cache_req_t *req) {
    kvt__pf_t *pf = pf_find(c, id, NULL);
    uint32_t pt = c->cfg.page_tokens;
    if (pf == NULL || pf->ns != ns || ntokens / pt < pf->first + pf->want || !pf_same_tokens(pf, ns, tokens, pt))
        return KVT_EINVAL;
    uint64_t wait = pf_wait(c, pf);
    kvt_prefetch_outcome_t out = pf->phase == PF_DONE                             ? KVT_PREFETCH_COMPLETE
                                 : c->cfg.prefetch_policy == KVT_PREFETCH_TIMEOUT ? KVT_PREFETCH_TIMED_OUT
                                 : pf->arrived > 0                                ? KVT_PREFETCH_PARTIAL
                                                                                  : KVT_PREFETCH_REVOKED;
    /* where the pages that arrived join the tree: the match now */
    kvt__match_t m;
    int rc = kvt__radix_match(c->tree, ns, tokens, pf->first + pf->arrived, 0, &m);
    KVT_ASSERT(rc != KVT_OK || m.pages >= pf->first); /* what it follows is locked */
    if (rc == KVT_OK && m.pages < pf->first + pf->arrived) { /* (the pages' tokens: pf_same_tokens) */
        uint64_t skip = m.pages - pf->first, k = pf->arrived - skip;
        kvt_rnode_t *nn;
        rc = kvt__radix_insert_l2(c->tree, m.node, ns, tokens + m.pages * pt, k, pf->l2 + skip, c->clock, priority, &nn);
        if (rc == KVT_OK) {
            kvt__policy_on_insert(c, nn, false);
            for (uint64_t j = skip; j < pf->arrived; j++) pf->l2[j] = KVT_NO_PAGE; /* the tree's now */
        }
    }
    if (rc != KVT_OK && rc != KVT_ENOMEM) return rc; /* the prefetch stays as it was */
    pf_drop_pages(c, pf, 0); /* what was not used: arrived too late, already cached, or still on its way */
    c->st.prefetch_arrived_pages += pf->arrived;
    c->st.prefetch_complete += out == KVT_PREFETCH_COMPLETE;
    c->st.prefetch_partial += out == KVT_PREFETCH_PARTIAL;
    c->st.prefetch_timed_out += out == KVT_PREFETCH_TIMED_OUT;
    c->st.prefetch_revoked += out == KVT_PREFETCH_REVOKED;
    c->st.prefetch_wait_micros += wait / 1000;
    if (wait / 1000 > c->st.prefetch_wait_max_micros) c->st.prefetch_wait_max_micros = wait / 1000;
    req->prefetch = out;
    req->prefetch_wait_ns = wait;
    pf_free(c, pf);
    kvt__cache_flush(c);
    return KVT_OK;
}

int kvt_cache_prefetch_cancel(kvt_cache_t *c, uint64_t id) {
    kvt__pf_t *pf = c ? pf_find(c, id, NULL) : NULL;
    if (pf == NULL) return KVT_EINVAL;
    pf_drop_pages(c, pf, 0);
    c->st.prefetch_revoked++;
    pf_free(c, pf);
    kvt__cache_flush(c);
    return KVT_OK;
}

uint64_t kvt_cache_prefetches(const kvt_cache_t *c) { return c ? c->l3.npf : 0; }

/* ---- names ------------------------------------------------------------------------------ */

static const char *const PREFETCH_POLICIES[] = {"best_effort", "wait_complete", "timeout"};
static const char *const OUTCOMES[] = {"none", "complete", "partial", "timed_out", "revoked"};

const char *kvt_prefetch_policy_name(kvt_prefetch_policy_t p) {
    return (unsigned)p < KVT_PREFETCH_POLICY_COUNT_ ? PREFETCH_POLICIES[p] : "?";
}

int kvt_prefetch_policy_parse(const char *s, kvt_prefetch_policy_t *p) {
    for (int i = 0; s && p && i < KVT_PREFETCH_POLICY_COUNT_; i++)
        if (strcmp(s, PREFETCH_POLICIES[i]) == 0) return *p = (kvt_prefetch_policy_t)i, KVT_OK;
    return KVT_EINVAL;
}

const char *kvt_prefetch_outcome_name(kvt_prefetch_outcome_t o) {
    return (unsigned)o < KVT_PREFETCH_OUTCOME_COUNT_ ? OUTCOMES[o] : "?";
}

/* ---- lifetime and check ------------------------------------------------------------------ */

static uint64_t known_cap(const kvt_cache_t *c) {
    if (c->cfg.l3_known) return c->cfg.l3_known;
    uint64_t k = 4 * c->cfg.l2_pages;
    return k < 65536 ? 65536 : k;
}

int kvt__l3_init(kvt_cache_t *c) {
    if (c->cfg.l3_pages == 0) return KVT_OK;
    int rc = kvt__lru_init(&c->l3.model, c->cfg.l3_pages);
    if (rc == KVT_OK && (c->l3.flags = kvt__calloc(c->cfg.l2_pages, 1)) == NULL) rc = KVT_ENOMEM;
    return rc;
}

int kvt_cache_attach_store(kvt_cache_t *c, kvt_store_t *s) {
    if (c == NULL || s == NULL || c->l2 == NULL || c->cfg.l3_pages || c->cp.size) return KVT_EINVAL;
    kvt_tier_t *t = kvt_store_tier(s);
    if (t == NULL || kvt_tier_geom(t)->pages < c->cfg.l2_pages || (c->dp.l2_tier && t != c->dp.l2_tier)) return KVT_EINVAL;
    if (c->dp.store_taken && c->dp.store_taken(c->dp.taken_by, s)) return KVT_EINVAL;
    if (c->dp.xf && kvt_tier_sums(t) && !kvt__xfer_checksums(c->dp.xf)) return KVT_EINVAL; /* every put refused */
    if (c->l3.store || c->st.requests || c->l3.npf || kvt_store_pending(s)) return KVT_EBUSY; /* pending: someone else's batches */
    uint8_t *f = kvt__calloc(c->cfg.l2_pages, 1);
    kvt_store_page_t *q = kvt__malloc(PUTQ_CAP * sizeof(*q));
    int rc = f && q ? kvt__ghost_init(&c->l3.own, known_cap(c), 1) : KVT_ENOMEM;
    if (rc != KVT_OK) {
        kvt__free(f, c->cfg.l2_pages);
        kvt__free(q, PUTQ_CAP * sizeof(*q));
        return rc;
    }
    c->l3.flags = f;
    c->l3.q = q;
    c->l3.store = s;
    return KVT_OK;
}

void kvt__l3_fini(kvt_cache_t *c) {
    kvt__l3_sync(c);
    while (c->l3.npf) pf_free(c, c->l3.pf[0]);
    kvt__free(c->l3.pf, c->l3.pf_cap * sizeof(*c->l3.pf));
    kvt__free(c->l3.q, c->l3.store ? PUTQ_CAP * sizeof(*c->l3.q) : 0);
    if (c->l3.flags) kvt__free(c->l3.flags, c->cfg.l2_pages);
    kvt__ghost_fini(&c->l3.own);
    kvt__lru_fini(&c->l3.model);
}

int kvt__l3_check(kvt_cache_t *c, uint64_t *held, uint64_t *deferred, const char **why) {
    *held = *deferred = 0;
    if (c->l3.flags == NULL) return KVT_OK;
    for (size_t i = 0; i < c->l3.npf; i++)
        for (uint64_t j = 0; j < c->l3.pf[i]->want; j++) *held += c->l3.pf[i]->l2[j] != KVT_NO_PAGE;
    uint64_t busy = 0;
    for (uint64_t id = 0; id < c->cfg.l2_pages; id++) {
        *deferred += (c->l3.flags[id] & KVT__L3_DEFER) != 0;
        busy += (c->l3.flags[id] & KVT__L3_BUSY) != 0;
        if ((c->l3.flags[id] & KVT__L3_DEFER) && !(c->l3.flags[id] & KVT__L3_BUSY))
            return *why = "an L2 page deferred with no store call holding it", KVT_ECORRUPT;
    }
    if (*deferred != c->l3.l2_deferred) return *why = "deferred L2 pages differ from the count", KVT_ECORRUPT;
    if (busy && c->l3.calls == 0 && c->l3.nq == 0) return *why = "L2 pages busy with no store call", KVT_ECORRUPT;
    return KVT_OK;
}
