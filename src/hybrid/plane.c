/* kvtier's data plane for the hybrid cache's pieces (hybrid.h,
 * kvt_hybrid_plane): the moves the cache hands out, sorted into batches by
 * group and kind, run on the groups' transfer engines and stores (and the
 * engine's write for what a request computed), each batch reported to the
 * cache when it completes.
 *
 * The moves a take hands out are safe to run at once, in any order
 * (hybrid.h, async_moves): so every batch of a take starts at once, and
 * nothing here orders one batch after another. A take's moves live in one
 * block, allocated before the take so that a move taken always has a batch
 * to run in and a place to be reported from; the block goes when its last
 * batch has been reported. */
#include <stdlib.h>
#include <string.h>

#include "../core/abi-int.h"
#include "../core/mem-int.h"
#include "../cache/cache-int.h"
#include "../xfer/xfer-int.h"
#include "hybrid-int.h"
#include "kvtier/error.h"
#include "kvtier/hybrid.h"
#include "kvtier/stats.h"
#include "kvtier/store.h"
#include "kvtier/tier.h"
#include "kvtier/xfer.h"

#define G KVT_MODEL_MAX_GROUPS
#define TAKE_MAX 1024   /* moves per take */
#define POLL_MAX 16     /* completions per poll of a source */
#define WAIT_NS 200000  /* the longest wait on one source while others may complete */
#define PROBE_BATCH 64  /* keys per exists call */

/* A move's kind: who runs it. */
enum { K_WRITE, K_DOWN, K_UP, K_PUT, K_GET, K_BAD, K_COUNT };
enum { B_FREE, B_NEW, B_FLIGHT, B_LANDED };

typedef struct take {
    size_t cap, n, open; /* room, moves, batches not yet reported */
    kvt_hybrid_move_t *mv;
    uint8_t *ok;
    kvt_xfer_copy_t *copies;
    kvt_store_page_t *pages;
} take_t;

typedef struct {
    take_t *t;
    size_t at, n; /* its moves: t->mv[at .. at + n) */
    uint64_t ticket; /* its engine's or store's, with its index as the user: a completion is its by both */
    uint32_t group, kind;
    uint8_t state;
} batch_t;

struct kvt_hybrid_plane {
    kvt_hybrid_t *h;
    kvt_hybrid_plane_config_t cfg;
    uint64_t bytes[G]; /* a piece of group g */
    uint32_t ngroups;
    bool store;
    kvt_store_t *put[G]; /* the probe's stores */
    batch_t *b;
    uint32_t nb, cap;
    size_t flight;            /* moves in batches started and not landed */
    uint32_t src_flight[G][K_COUNT]; /* batches in flight per source */
    bool in_write;                   /* the engine's write callback runs: the plane's calls are refused */
    kvt_hybrid_plane_stats_t st;
};

static size_t take_bytes(size_t k) {
    return sizeof(take_t) + k * (sizeof(kvt_hybrid_move_t) + 1 + sizeof(kvt_xfer_copy_t) + sizeof(kvt_store_page_t));
}

static take_t *take_new(size_t k) {
    take_t *t = kvt__malloc(take_bytes(k));
    if (t == NULL) return NULL;
    t->cap = k;
    t->n = t->open = 0;
    t->mv = (kvt_hybrid_move_t *)(t + 1);
    t->copies = (kvt_xfer_copy_t *)(t->mv + k);
    t->pages = (kvt_store_page_t *)(t->copies + k);
    t->ok = (uint8_t *)(t->pages + k);
    return t;
}

static void take_free(take_t *t) { kvt__free(t, take_bytes(t->cap)); }

static uint32_t kind_of(const kvt_hybrid_move_t *m) {
    if (m->src_tier == KVT_HYBRID_ENGINE) return m->dst_tier == 1 ? K_WRITE : K_BAD;
    if (m->src_tier == 1 && m->dst_tier == 2) return K_DOWN;
    if (m->src_tier == 2 && m->dst_tier == 1) return K_UP;
    if (m->src_tier == 2 && m->dst_tier == 3 && m->dst_slot == UINT64_MAX) return K_PUT;
    if (m->src_tier == 3 && m->dst_tier == 1 && m->src_slot == UINT64_MAX) return K_GET;
    return K_BAD; /* a modeled L3 (refused at create) */
}

static int by_batch(const void *a, const void *b) {
    const kvt_hybrid_move_t *x = a, *y = b;
    uint64_t kx = (uint64_t)x->group << 8 | kind_of(x), ky = (uint64_t)y->group << 8 | kind_of(y);
    return kx < ky ? -1 : kx > ky;
}

static kvt_hash128_t hash_of(kvt_key128_t k) { return (kvt_hash128_t){k.lo, k.hi}; }

int kvt_hybrid_store_probe(void *stores, uint32_t g, const kvt_key128_t *keys, size_t n, uint8_t *present) {
    kvt_store_t *const *s = stores;
    if (s == NULL || g >= G || s[g] == NULL || (n && (keys == NULL || present == NULL))) return -1;
    kvt_store_page_t pg[PROBE_BATCH];
    uint8_t res[PROBE_BATCH];
    for (size_t at = 0; at < n; at += PROBE_BATCH) {
        size_t k = n - at < PROBE_BATCH ? n - at : PROBE_BATCH;
        for (size_t i = 0; i < k; i++) pg[i] = (kvt_store_page_t){hash_of(keys[at + i]), 0};
        int rc = kvt_store_run(s[g], KVT_STORE_EXISTS, pg, k, res, NULL);
        if (rc != KVT_OK && rc != KVT_EIO) return -1;
        for (size_t i = 0; i < k; i++) present[at + i] = res[i] == KVT_STORE_OK;
    }
    return 0;
}

/* ---- create, destroy -------------------------------------------------------- */

/* The object key a store gives one fixed page hash: equal exactly when two
 * stores share a model identity (and geometry: store.h). */
static void identity_of(kvt_store_t *s, char hex[33]) {
    const kvt_hash128_t h = {0x6b767469657221ull, 0x706c616e65ull};
    kvt_store_key(s, &h, hex);
}

static int group_ok(const kvt_hybrid_config_t *hc, uint32_t g, const kvt_hybrid_plane_group_t *x, uint64_t bytes,
                    bool store) {
    if (x->xfer == NULL || x->l1 == NULL || x->l1 == x->l2 || hc->l3_slots[g]) return 0;
    /* the checks below look at the tiers, the copies go by the indexes: one and the same */
    if (kvt__xfer_tier(x->xfer, x->l1_index) != x->l1 || (x->l2 && kvt__xfer_tier(x->xfer, x->l2_index) != x->l2))
        return 0;
    const kvt_geom_t *g1 = kvt_tier_geom(x->l1), *g2 = x->l2 ? kvt_tier_geom(x->l2) : NULL;
    if (g1->pages < hc->l1_slots[g] || kvt_geom_page_bytes(g1) != bytes) return 0;
    if (hc->l2_slots[g] && (g2 == NULL || g2->pages < hc->l2_slots[g] || kvt_geom_page_bytes(g2) != bytes)) return 0;
    if (store != (x->put != NULL) || store != (x->get != NULL)) return 0;
    /* batches already on them are someone else's: their completions would be taken for the plane's */
    if (kvt_xfer_pending(x->xfer) || (store && (kvt_store_pending(x->put) || kvt_store_pending(x->get)))) return 0;
    if (!store) return 1;
    if (kvt_tier_sums(x->l2) && !kvt__xfer_checksums(x->xfer)) return 0; /* every put refused: no sums in L2 */
    char a[33], b[33];
    identity_of(x->put, a);
    identity_of(x->get, b);
    return kvt_store_tier(x->put) == x->l2 && kvt_store_tier(x->get) == x->l1 && strcmp(a, b) == 0 &&
           strcmp(kvt_store_url(x->put), kvt_store_url(x->get)) == 0; /* one L3: what is put is what is got */
}

/* Whether store s is one of the plane's stores or shares an identity with
 * one (a piece's object would answer for a full page of the same chained
 * hash): what kvt_cache_attach_store asks when it comes second. */
static bool plane_store_taken(const void *plane, kvt_store_t *s) {
    const kvt_hybrid_plane_t *p = plane;
    char a[33], b[33];
    identity_of(s, a);
    for (uint32_t g = 0; g < p->ngroups; g++) {
        const kvt_hybrid_plane_group_t *x = &p->cfg.groups[g];
        if (x->put == NULL) continue;
        if (s == x->put || s == x->get) return true;
        identity_of(x->put, b);
        if (strcmp(a, b) == 0) return true;
    }
    return false;
}

/* No two groups share a tier (a slot of one group would be another's) or a
 * store identity (a group's object would answer for another's), nor an
 * engine or tier with the full groups' data plane (kvt_cache_attach: a slot
 * would be a page; attached after the plane, the cache asks plane_uses),
 * nor a store or identity with their L3 (kvt_cache_attach_store: window page
 * i and full page i have one chained hash, so one object under one
 * identity; attached after the plane, the cache asks plane_store_taken); a
 * full group is given nothing (its pages are the radix cache's). */
static int groups_apart(kvt_hybrid_t *h, const kvt_hybrid_config_t *hc, const kvt_hybrid_plane_config_t *cfg) {
    const kvt__cache_copies_t *dp = &kvt_hybrid_cache(h)->dp;
    kvt_store_t *full = kvt_hybrid_cache(h)->l3.store;
    char fid[33];
    if (full) identity_of(full, fid);
    for (uint32_t g = 0; g < hc->ngroups; g++) {
        const kvt_hybrid_plane_group_t *x = &cfg->groups[g];
        if (kvt_hybrid_piece_bytes(&hc->groups[g], hc->cache.page_tokens) == 0) {
            if (x->xfer || x->l1 || x->l2 || x->put || x->get) return 0;
            continue;
        }
        if (dp->xf && (x->xfer == dp->xf || x->l1 == dp->l1_tier || x->l1 == dp->l2_tier || x->l2 == dp->l1_tier ||
                       x->l2 == dp->l2_tier))
            return 0; /* one engine: each side would take the other's completions */
        if (full && x->put) {
            char a[33];
            identity_of(x->put, a);
            if (x->put == full || x->get == full || strcmp(a, fid) == 0) return 0;
        }
        for (uint32_t k = 0; k < g; k++) {
            const kvt_hybrid_plane_group_t *y = &cfg->groups[k];
            if (y->l1 == NULL) continue; /* a full group */
            if (x->l1 == y->l1 || x->l1 == y->l2 || (x->l2 && (x->l2 == y->l1 || x->l2 == y->l2))) return 0;
            if (x->put == NULL) continue;
            char a[33], b[33];
            identity_of(x->put, a);
            identity_of(y->put, b);
            if (strcmp(a, b) == 0) return 0;
        }
    }
    return 1;
}

/* Whether obj is an engine or tier of one of the plane's groups. */
static bool plane_uses(const void *plane, const void *obj) {
    const kvt_hybrid_plane_t *p = plane;
    for (uint32_t g = 0; g < p->ngroups; g++) {
        const kvt_hybrid_plane_group_t *x = &p->cfg.groups[g];
        if (x->xfer && (obj == x->xfer || obj == x->l1 || obj == x->l2)) return true;
    }
    return false;
}

int kvt_hybrid_plane_create(kvt_hybrid_plane_t **out, kvt_hybrid_t *h, const kvt_hybrid_plane_config_t *given) {
    kvt_hybrid_plane_config_t c = {0}, *cfg = &c;
    if (out == NULL || h == NULL || given == NULL || kvt__abi_in(&c, sizeof(c), given) != KVT_OK || c.write == NULL)
        return KVT_EINVAL;
    const kvt_hybrid_config_t *hc = kvt__hybrid_cfg(h);
    /* a move the engine took and has not reported would never be; a second plane would take the first's */
    if (!hc->moves || !hc->async_moves || kvt__hybrid_live(h) || kvt_hybrid_moves_outstanding(h) ||
        kvt_hybrid_cache(h)->dp.taken_by)
        return KVT_EINVAL;
    bool store = false;
    for (uint32_t g = 0; g < hc->ngroups; g++) store |= cfg->groups[g].put || cfg->groups[g].get;
    if (!store && kvt__hybrid_has_l3(h)) return KVT_EINVAL; /* the engine's own L3: its moves would have no runner */
    for (uint32_t g = 0; g < hc->ngroups; g++) {
        uint64_t bytes = kvt_hybrid_piece_bytes(&hc->groups[g], hc->cache.page_tokens);
        if (bytes && !group_ok(hc, g, &cfg->groups[g], bytes, store)) return KVT_EINVAL;
    }
    if (!groups_apart(h, hc, cfg)) return KVT_EINVAL;
    kvt_hybrid_plane_t *p = kvt__calloc(1, sizeof(*p));
    if (p == NULL) return KVT_ENOMEM;
    p->h = h;
    p->cfg = *cfg;
    p->ngroups = hc->ngroups;
    p->store = store;
    for (uint32_t g = 0; g < hc->ngroups; g++) p->bytes[g] = kvt_hybrid_piece_bytes(&hc->groups[g], hc->cache.page_tokens);
    for (uint32_t g = 0; g < hc->ngroups; g++) p->put[g] = cfg->groups[g].put;
    int rc = store ? kvt_hybrid_set_l3(h, kvt_hybrid_store_probe, p->put) : KVT_OK;
    if (rc != KVT_OK) {
        kvt__free(p, sizeof(*p));
        return rc;
    }
    kvt__hybrid_drive(h, true);
    kvt__cache_copies_t *dp = &kvt_hybrid_cache(h)->dp;
    dp->taken = plane_uses;
    dp->store_taken = plane_store_taken;
    dp->taken_by = p;
    *out = p;
    return KVT_OK;
}

/* ---- batches ------------------------------------------------------------------ */

/* Room for a take's batches: at most one per group and kind. */
static int reserve(kvt_hybrid_plane_t *p) {
    uint32_t need = p->ngroups * K_COUNT, nfree = 0;
    for (uint32_t i = 0; i < p->nb && nfree < need; i++) nfree += p->b[i].state == B_FREE;
    if (nfree + (p->cap - p->nb) >= need) return KVT_OK;
    uint32_t cap = p->cap ? 2 * p->cap : 64;
    while (cap - p->nb < need) cap *= 2;
    batch_t *b = kvt__realloc(p->b, p->cap * sizeof(*b), cap * sizeof(*b));
    if (b == NULL) return KVT_ENOMEM;
    p->b = b;
    p->cap = cap;
    return KVT_OK;
}

static uint32_t batch_new(kvt_hybrid_plane_t *p) {
    for (uint32_t i = 0; i < p->nb; i++)
        if (p->b[i].state == B_FREE) return i;
    return p->nb++; /* reserved */
}

static void landed(kvt_hybrid_plane_t *p, batch_t *b) {
    b->state = B_LANDED;
    p->flight -= b->n;
    p->src_flight[b->group][b->kind]--;
}

/* Starts batch b (its moves in t->mv[at..at+n), one group and kind). */
static void start(kvt_hybrid_plane_t *p, uint32_t id) {
    batch_t *b = &p->b[id];
    const kvt_hybrid_plane_group_t *x = &p->cfg.groups[b->group];
    kvt_hybrid_move_t *mv = b->t->mv + b->at;
    uint8_t *ok = b->t->ok + b->at;
    kvt_xfer_copy_t *cp = b->t->copies + b->at;
    kvt_store_page_t *pg = b->t->pages + b->at;
    int rc = KVT_EINVAL;
    p->st.batches++;
    p->flight += b->n;
    p->src_flight[b->group][b->kind]++;
    b->state = B_FLIGHT;
    switch (b->kind) {
    case K_WRITE: {
        bool was = kvt__hybrid_calling_out(p->h, true); /* a callback that calls back finds both busy */
        p->in_write = true;
        for (size_t i = 0; i < b->n; i++) {
            ok[i] = p->cfg.write(p->cfg.arg, &mv[i]) == 0;
            if (ok[i]) p->st.written++;
            else p->st.write_failures++;
        }
        p->in_write = false;
        kvt__hybrid_calling_out(p->h, was);
        landed(p, b);
        return;
    }
    case K_DOWN:
    case K_UP:
        for (size_t i = 0; i < b->n; i++) cp[i] = (kvt_xfer_copy_t){(uint32_t)mv[i].src_slot, (uint32_t)mv[i].dst_slot};
        rc = b->kind == K_DOWN ? kvt_xfer_submit(x->xfer, x->l1_index, x->l2_index, cp, b->n, id, &b->ticket)
                               : kvt_xfer_submit(x->xfer, x->l2_index, x->l1_index, cp, b->n, id, &b->ticket);
        break;
    case K_PUT:
    case K_GET:
        for (size_t i = 0; i < b->n; i++) {
            uint64_t slot = b->kind == K_PUT ? mv[i].src_slot : mv[i].dst_slot;
            pg[i] = (kvt_store_page_t){hash_of(mv[i].key), (uint32_t)slot};
        }
        rc = b->kind == K_PUT ? kvt_store_put(x->put, pg, b->n, id, &b->ticket)
                              : kvt_store_get(x->get, pg, b->n, id, &b->ticket);
        break;
    default:
        break;
    }
    if (rc == KVT_OK) return;
    memset(ok, 0, b->n); /* not started: failed */
    if (b->kind == K_DOWN || b->kind == K_UP) p->st.copy_failures += b->n;
    else if (b->kind == K_PUT) p->st.put_failures += b->n;
    else if (b->kind == K_GET) p->st.get_misses += b->n;
    landed(p, b);
}

/* Takes what the cache has ready and starts it; *did when something was. */
static int take(kvt_hybrid_plane_t *p, int *did) {
    for (size_t k; (k = kvt_hybrid_moves(p->h)) > 0;) {
        if (k > TAKE_MAX) k = TAKE_MAX;
        take_t *t;
        if (reserve(p) != KVT_OK || (t = take_new(k)) == NULL) return KVT_ENOMEM;
        t->n = kvt__hybrid_take_moves(p->h, t->mv, k);
        if (t->n == 0) { /* kvt_hybrid_moves counted none ready after all */
            take_free(t);
            break;
        }
        qsort(t->mv, t->n, sizeof(*t->mv), by_batch);
        uint32_t ids[G * K_COUNT], nids = 0;
        for (size_t at = 0, end; at < t->n; at = end) {
            uint32_t g = t->mv[at].group, kind = kind_of(&t->mv[at]);
            for (end = at + 1; end < t->n && t->mv[end].group == g && kind_of(&t->mv[end]) == kind;) end++;
            uint32_t id = batch_new(p);
            p->b[id] = (batch_t){.t = t, .at = at, .n = end - at, .group = g, .kind = kind, .state = B_NEW};
            ids[nids++] = id;
        }
        t->open = nids;
        for (uint32_t i = 0; i < nids; i++) start(p, ids[i]);
        *did = 1;
    }
    return KVT_OK;
}

/* Reports every landed batch to the cache. */
static int report(kvt_hybrid_plane_t *p, int *did) {
    for (uint32_t i = 0; i < p->nb; i++) {
        batch_t *b = &p->b[i];
        if (b->state != B_LANDED) continue;
        int rc = kvt__hybrid_moves_done(p->h, b->t->mv + b->at, b->n, b->t->ok + b->at);
        if (rc != KVT_OK) return rc; /* KVT_ENOMEM: it stays landed, reported next time */
        b->state = B_FREE;
        if (--b->t->open == 0) take_free(b->t);
        *did = 1;
    }
    while (p->nb && p->b[p->nb - 1].state == B_FREE) p->nb--;
    return KVT_OK;
}

/* Batch id, in flight on source `src` (an engine or a store) of its group
 * with that ticket: what a completion from src names; NULL for one that is
 * none of ours (a caller that broke the rule of hybrid.h and used the
 * source too). */
static batch_t *ours(kvt_hybrid_plane_t *p, uint64_t id, uint64_t ticket, const void *src) {
    if (id >= p->nb || p->b[id].state != B_FLIGHT || p->b[id].ticket != ticket) return NULL;
    batch_t *b = &p->b[id];
    const kvt_hybrid_plane_group_t *x = &p->cfg.groups[b->group];
    int copy = b->kind == K_DOWN || b->kind == K_UP;
    return (copy ? (const void *)x->xfer : b->kind == K_PUT ? (const void *)x->put : (const void *)x->get) == src ? b : NULL;
}

/* Completions of group g's engine, waiting up to timeout_ns for one. An
 * engine two groups share reports both's batches here. */
static int reap_xfer(kvt_hybrid_plane_t *p, uint32_t g, uint64_t timeout_ns) {
    kvt_xfer_done_t d[POLL_MAX];
    kvt_xfer_t *x = p->cfg.groups[g].xfer;
    int n = kvt_xfer_poll(x, d, POLL_MAX, timeout_ns);
    for (int j = 0; j < n; j++) {
        batch_t *b = ours(p, d[j].user, d[j].ticket, x);
        if (b == NULL) continue;
        g = b->group;
        int good = d[j].status == KVT_OK;
        memset(b->t->ok + b->at, good, b->n);
        uint64_t bytes = good ? b->n * p->bytes[g] : 0;
        if (!good) p->st.copy_failures += b->n;
        if (d[j].status == KVT_ECORRUPT) p->st.corrupt_batches++;
        if (b->kind == K_DOWN) p->st.copied_down += good ? b->n : 0, p->st.bytes_down += bytes;
        else p->st.copied_up += good ? b->n : 0, p->st.bytes_up += bytes;
        landed(p, b);
    }
    return n > 0;
}

/* Completions of group g's store (put or get), waiting up to timeout_ns for one. */
static int reap_store(kvt_hybrid_plane_t *p, uint32_t g, int get, uint64_t timeout_ns) {
    kvt_store_done_t d[POLL_MAX];
    const kvt_hybrid_plane_group_t *x = &p->cfg.groups[g];
    kvt_store_t *s = get ? x->get : x->put;
    int n = kvt_store_poll(s, d, POLL_MAX, timeout_ns);
    for (int j = 0; j < n; j++) {
        batch_t *b = ours(p, d[j].user, d[j].ticket, s);
        if (b == NULL) continue;
        for (size_t i = 0; i < b->n; i++) {
            int good = d[j].results[i] == KVT_STORE_OK;
            b->t->ok[b->at + i] = (uint8_t)good;
            if (get) p->st.got += good, p->st.get_misses += !good;
            else p->st.put += good, p->st.put_failures += !good;
            /* An object that failed its checks stays "present" to every probe of every instance, each hit
             * through it failing, and none stores that piece again (it was there): it goes. (A put racing
             * with the remove loses its object: a miss later, never wrong bytes.) */
            if (get && d[j].results[i] == KVT_STORE_BAD) {
                kvt_store_page_t bad = {b->t->pages[b->at + i].hash, 0};
                uint8_t res;
                (void)kvt_store_run(x->put, KVT_STORE_REMOVE, &bad, 1, &res, NULL);
            }
        }
        landed(p, b);
    }
    return n > 0;
}

/* Every source with batches in flight (a group's engine, its put store,
 * its get store), without waiting; or, with wait_ns, the first such
 * source, waiting up to wait_ns for it. */
static int reap(kvt_hybrid_plane_t *p, uint64_t wait_ns) {
    int did = 0;
    for (uint32_t g = 0; g < p->ngroups; g++)
        for (int src = 0; src < 3; src++) {
            const uint32_t *f = p->src_flight[g];
            if (!(src == 0 ? f[K_DOWN] + f[K_UP] : f[src == 1 ? K_PUT : K_GET])) continue;
            did |= src == 0 ? reap_xfer(p, g, wait_ns) : reap_store(p, g, src == 2, wait_ns);
            if (wait_ns) return did;
        }
    return did;
}

int kvt_hybrid_plane_poll(kvt_hybrid_plane_t *p, uint64_t timeout_ns) {
    if (p == NULL) return KVT_EINVAL;
    if (p->in_write) return KVT_EBUSY;
    uint64_t t0 = kvt_now_ns();
    for (;;) {
        int did = reap(p, 0);
        int rc = report(p, &did);
        if (rc == KVT_OK) rc = take(p, &did);
        if (rc != KVT_OK) return rc;
        if (did) continue;
        uint64_t spent = kvt_now_ns() - t0;
        if (p->flight == 0 || spent >= timeout_ns) return KVT_OK;
        uint64_t left = timeout_ns - spent;
        reap(p, left < WAIT_NS ? left : WAIT_NS);
    }
}

/* Nothing in flight and nothing to take while the cache still waits: a
 * move was taken by someone else, and no call here can finish it. */
static int stuck(const kvt_hybrid_plane_t *p) { return p->flight == 0 && kvt_hybrid_moves(p->h) == 0; }

int kvt_hybrid_plane_wait(kvt_hybrid_plane_t *p, const kvt_hybrid_req_t *req) {
    if (p == NULL || req == NULL) return KVT_EINVAL;
    if (p->in_write) return KVT_EBUSY;
    for (;;) {
        int rc = kvt_hybrid_ready(p->h, req);
        if (rc != KVT_EAGAIN) return rc;
        if ((rc = kvt_hybrid_plane_poll(p, WAIT_NS)) != KVT_OK) return rc;
        if (kvt_hybrid_ready(p->h, req) == KVT_EAGAIN && stuck(p)) return KVT_EIO;
    }
}

int kvt_hybrid_plane_sync(kvt_hybrid_plane_t *p) {
    if (p == NULL) return KVT_EINVAL;
    if (p->in_write) return KVT_EBUSY;
    for (;;) {
        int rc = kvt_hybrid_plane_poll(p, WAIT_NS);
        if (rc != KVT_OK) return rc;
        if (kvt_hybrid_moves_outstanding(p->h) == 0 && p->flight == 0) return KVT_OK;
        if (stuck(p)) return KVT_EIO;
    }
}

size_t kvt_hybrid_plane_in_flight(const kvt_hybrid_plane_t *p) { return p ? p->flight : 0; }

int kvt_hybrid_plane_stats(const kvt_hybrid_plane_t *p, kvt_hybrid_plane_stats_t *st) {
    if (p == NULL || st == NULL) return KVT_EINVAL;
    return kvt__abi_out(st, &p->st, sizeof(p->st));
}

void kvt_hybrid_plane_destroy(kvt_hybrid_plane_t *p) {
    if (p == NULL) return;
    while (p->flight) reap(p, WAIT_NS); /* the engines and stores write into batches until they land */
    int did = 0;
    if (report(p, &did) != KVT_OK) /* short of memory: what landed is reported failed (which needs none) */
        for (uint32_t i = 0; i < p->nb; i++)
            if (p->b[i].state == B_LANDED) memset(p->b[i].t->ok + p->b[i].at, 0, p->b[i].n);
    if (report(p, &did) != KVT_OK) abort(); /* cannot be: see kvt__hybrid_moves_done */
    kvt__hybrid_drive(p->h, false);
    kvt__cache_copies_t *dp = &kvt_hybrid_cache(p->h)->dp;
    dp->taken = NULL;
    dp->store_taken = NULL;
    dp->taken_by = NULL;
    if (p->store) kvt__hybrid_drop_l3(p->h); /* its probe is this plane's */
    kvt__free(p->b, p->cap * sizeof(*p->b));
    kvt__free(p, sizeof(*p));
}
