/* Every eviction policy against an independent model of what
 * docs/policies.md and src/cache/policy.c's essay promise, page for page, on
 * one tier: the hits and new pages of every request; every 16 requests the
 * whole cached set, with each page's hits, recency, creation, priority,
 * class and segment; after every request, for arc its target p (bit for bit)
 * and for arc and s2lru the pages each ghost remembers. Some requests stay
 * admitted for a while: nothing they hold may go.
 *
 * The model keeps plain arrays scanned linearly: pages (tokens, the page
 * before, the node), nodes (the attributes a policy reads, copied to the head
 * when a match splits one: docs/cache.md), and ghosts as lists of entries in
 * the order they were added. A ghost remembers what ghost.c's essay defines:
 * entries of pages (s2lru) or of runs of up to 16 of a node's pages that left
 * in one eviction call (arc: docs/policies.md, Runs), an entry's age counted
 * in epochs of `len` pages, the window `epochs` epochs. Not modelled: the
 * table's 24-bit fingerprints and its cuckoo overflows, whose rare false
 * presents and early forgets would show here as a disagreement. Two streams:
 * random requests in two namespaces that share prefixes, come back whole and
 * continue each other; and the Mooncake trace (data/), each hash id a page.
 *
 * Where the published algorithms leave a choice or arc departs from Megiddo
 * and Modha's, the model does what the documentation states: ties go to the
 * node created (or split off) first (src/radix/vset.c); a node slru demotes
 * keeps its last access (docs/policies.md's table); and arc's departures
 * listed in docs/policies.md, "Where arc departs from the paper". */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "kvtier/cache.h"
#include "kvtier/error.h"
#include "kvtier/rng.h"
#include "cache/cache-int.h"
#include "core/mix-int.h"
#include "radix/radix-int.h"

#define PT 4           /* tokens a page */
#define MAXP 48        /* pages a request at most */
#define TRACE_PAGES 8  /* the trace's requests: their first pages */
#define TRACE_REQS 3993
#define POOL 640       /* pages the model holds at most: the largest cache tested */
#define NODES 32768    /* nodes the model ever makes in one run */
#define GMAX 8192      /* entries a model ghost holds at most */
#define RUN 16         /* arc: pages a ghost entry at most */
#define CHECK 0x7ffull /* arc: the bits of a run's last page key its entry keeps */

/* ---- the model ------------------------------------------------------------ */

typedef struct mnode {
    uint64_t seq;           /* the tie-break: created, or split off, first */
    uint64_t hits, last, created;
    int32_t prio;
    uint32_t npages;
    bool cls1, slru;        /* s2lru/arc: seen again; slru: in the protected segment */
} mnode_t;

typedef struct mpage {
    int32_t tok[PT];
    int32_t parent;         /* the page before it; -1 for a first page */
    uint32_t ns;            /* its namespace (a LoRA, a cache salt): a path of its own */
    uint32_t kids;          /* cached pages that extend it by one */
    uint32_t node;
    uint64_t key;           /* its page key (radix-int.h): what the ghosts remember */
    uint64_t path;          /* a hash of its tokens and all before, to find it in the cache */
    uint32_t lock;          /* requests holding it: the one being admitted, if it matched it; held ones */
    bool used;
} mpage_t;

typedef struct gentry {
    uint64_t key, last;     /* its first and last page's keys */
    uint64_t epoch;         /* the epoch of its last page */
    uint32_t pages;         /* 0: taken out, or replaced */
    uint64_t older;         /* the previous entry added whose key shares its chain (+ 1; 0: none) */
} gentry_t;

/* Entries in the order they were added, entry i at e[i % GMAX]; those before
 * head have expired. To find a key without reading every entry, the entries
 * of keys alike in their low bits are chained newest first from chain[]. */
typedef struct mghost {
    gentry_t e[GMAX];
    uint64_t chain[GMAX];   /* the newest entry of each chain (+ 1; 0: none) */
    uint64_t head, n;       /* entries [head, n) may be live */
    uint64_t added, live;   /* pages ever added; pages its entries hold */
    uint64_t len, epochs;   /* an epoch's pages; the window, in epochs */
} mghost_t;

typedef struct model {
    kvt_policy_t pol;
    uint64_t cap, target, present;
    mpage_t p[POOL];
    uint32_t np;
    mnode_t node[NODES];
    uint32_t nn;
    mghost_t g[2];
    double arc_p;
    /* the eviction call being made: its node, the class it asked first, its pages' keys deepest first */
    int64_t call_node;
    int call_first, call_next;
    uint64_t call_key[POOL];
    uint32_t ncall;
    /* what the run exercised: pages back through a ghost (of them, through ghost 1, and in
     * runs of more than one page), pages of s2lru continuations, slru demotions, arc's largest p */
    uint64_t back, back1, back_runs, cont, demoted;
    double p_max;
} model_t;

static bool two_classes(const model_t *m) { return m->pol == KVT_POLICY_ARC || m->pol == KVT_POLICY_S2LRU; }

/* ghost.c's window: E = min(112, cap) epochs of len = 2 cap / (2E - 1) pages, to the nearest. */
static void ghost_reset(mghost_t *g, uint64_t cap) {
    memset(g, 0, sizeof(*g));
    g->epochs = cap < 112 ? cap : 112;
    g->len = cap <= 112 ? 1 : (2 * 2 * cap + (2 * g->epochs - 1)) / (2 * (2 * g->epochs - 1));
}

static void ghost_forget(mghost_t *g, gentry_t *e) {
    g->live -= e->pages;
    e->pages = 0;
}

/* Entries leave when E epochs have begun since their own. */
static void ghost_expire(mghost_t *g) {
    for (; g->head < g->n; g->head++) {
        gentry_t *e = &g->e[g->head % GMAX];
        if (e->pages > 0 && (g->added - 1) / g->len - e->epoch < g->epochs) break;
        ghost_forget(g, e);
    }
}

static uint64_t ghost_pages(mghost_t *g) {
    ghost_expire(g);
    return g->live;
}

/* The live entry of key, or NULL. */
static gentry_t *ghost_find(mghost_t *g, uint64_t key) {
    ghost_expire(g);
    for (uint64_t i = g->chain[key % GMAX]; i > g->head; i = g->e[(i - 1) % GMAX].older) {
        gentry_t *e = &g->e[(i - 1) % GMAX];
        if (e->key == key && e->pages > 0) return e;
    }
    return NULL;
}

/* A key has one entry: a newer one replaces it. */
static void ghost_add(mghost_t *g, uint64_t key, uint64_t last, uint32_t pages) {
    gentry_t *old = ghost_find(g, key);
    if (old) ghost_forget(g, old);
    g->added += pages;
    ghost_expire(g);
    cr_assert_lt(g->n - g->head, GMAX);
    g->e[g->n % GMAX] = (gentry_t){key, last, (g->added - 1) / g->len, pages, g->chain[key % GMAX]};
    g->chain[key % GMAX] = ++g->n;
    g->live += pages;
}

/* The entry of key[k] when the new pages k .. n - 1 hold its whole run (its
 * last page's key agreeing in the bits the entry keeps): taken out, its
 * length returned; else 0. */
static uint32_t ghost_take(mghost_t *g, const uint64_t *key, uint64_t k, uint64_t n) {
    gentry_t *e = ghost_find(g, key[k]);
    if (e == NULL) return 0;
    uint32_t pages = e->pages;
    if (pages > n - k || (e->last & CHECK) != (key[k + pages - 1] & CHECK)) return 0;
    ghost_forget(g, e);
    return pages;
}

static void model_reset(model_t *m, kvt_policy_t pol, uint64_t cap, double room) {
    memset(m, 0, sizeof(*m));
    m->pol = pol;
    m->cap = cap;
    m->target = (uint64_t)ceil(room * (double)cap);
    m->call_node = -1;
    ghost_reset(&m->g[0], pol == KVT_POLICY_S2LRU ? 4 * cap : pol == KVT_POLICY_ARC ? 2 * cap : 0);
    ghost_reset(&m->g[1], pol == KVT_POLICY_ARC ? 2 * cap : 0);
}

static uint64_t path_step(uint64_t before, const int32_t *tok) { return XXH3_64bits_withSeed(tok, PT * sizeof(int32_t), before); }

/* The key before a namespace's first page (radix-int.h). */
static uint64_t key_seed(uint32_t ns) { return kvt__splitmix64((uint64_t)ns + 0x6b767469657231ull); }

static int32_t find_child(const model_t *m, uint32_t ns, int32_t parent, const int32_t *tok) {
    for (uint32_t i = 0; i < m->np; i++)
        if (m->p[i].used && m->p[i].ns == ns && m->p[i].parent == parent && memcmp(m->p[i].tok, tok, sizeof(m->p[i].tok)) == 0)
            return (int32_t)i;
    return -1;
}

static uint64_t pages_where(const model_t *m, bool slru, bool cls1) {
    uint64_t k = 0;
    for (uint32_t i = 0; i < m->np; i++) {
        const mnode_t *x = &m->node[m->p[i].node];
        if (m->p[i].used && (slru ? x->slru : x->cls1 == cls1)) k++;
    }
    return k;
}

static uint32_t new_node(model_t *m, mnode_t init) {
    cr_assert_lt(m->nn, NODES);
    init.seq = m->nn;
    m->node[m->nn] = init;
    return m->nn++;
}

/* The score a victim is chosen by, lower first (policy.c's table), then seq. */
static void score(const model_t *m, const mnode_t *x, uint64_t s[3]) {
    s[0] = 0, s[1] = x->last, s[2] = x->seq;
    switch (m->pol) {
    case KVT_POLICY_LFU: s[0] = x->hits < 0xffffff ? x->hits : 0xffffff; break;
    case KVT_POLICY_FIFO: s[1] = x->created; break;
    case KVT_POLICY_PRIORITY: s[0] = (uint64_t)((int64_t)x->prio + (1 << 23)); break;
    case KVT_POLICY_SLRU: s[0] = x->slru; break;
    case KVT_POLICY_S2LRU: s[0] = x->cls1; break;
    default: break;
    }
}

/* The frontier page (cached, nothing cached below it, not held) that goes
 * first; arc: of class cls only. -1 when there is none. */
static int32_t victim(const model_t *m, int cls) {
    int32_t best = -1;
    uint64_t bs[3] = {0, 0, 0}, s[3];
    for (uint32_t i = 0; i < m->np; i++) {
        const mpage_t *pg = &m->p[i];
        if (!pg->used || pg->kids > 0 || pg->lock > 0) continue;
        if (m->pol == KVT_POLICY_ARC && m->node[pg->node].cls1 != (cls == 1)) continue;
        score(m, &m->node[pg->node], s);
        if (best < 0 || s[0] < bs[0] || (s[0] == bs[0] && (s[1] < bs[1] || (s[1] == bs[1] && s[2] < bs[2])))) {
            best = (int32_t)i;
            memcpy(bs, s, sizeof(bs));
        }
    }
    return best;
}

/* The pages one eviction call took go into the ghost of their class (s2lru:
 * its one ghost), as entries of up to RUN pages counted from the shallowest,
 * the deepest entry added first (arc); page by page, deepest first (s2lru). */
static void end_call(model_t *m) {
    if (m->ncall == 0) return;
    uint32_t k = m->ncall;
    uint64_t key[POOL]; /* shallowest first */
    for (uint32_t i = 0; i < k; i++) key[i] = m->call_key[k - 1 - i];
    if (m->pol == KVT_POLICY_ARC) {
        mghost_t *g = &m->g[m->node[m->call_node].cls1];
        for (uint32_t at = (k - 1) / RUN * RUN;; at -= RUN) {
            uint32_t n = k - at < RUN ? k - at : RUN;
            ghost_add(g, key[at], key[at + n - 1], n);
            if (at == 0) break;
        }
    } else if (m->pol == KVT_POLICY_S2LRU) {
        for (uint32_t i = k; i-- > 0;) ghost_add(&m->g[0], key[i], key[i], 1);
    }
    m->ncall = 0;
    m->call_node = -1;
}

/* arc: which class L1 asks first (1 when class 0 holds no more than p). */
static int first_class(const model_t *m) {
    return m->pol == KVT_POLICY_ARC && (double)pages_where(m, false, false) <= m->arc_p ? 1 : 0;
}

/* Page v leaves. A call goes on while it takes the next page up the same
 * node and the class asked first has not changed. */
static void evict(model_t *m, int32_t v, int first) {
    mpage_t *pg = &m->p[v];
    if (m->ncall > 0 && !(m->call_node == pg->node && m->call_next == v && m->call_first == first)) end_call(m);
    if (m->ncall == 0) m->call_node = pg->node, m->call_first = first;
    m->call_key[m->ncall++] = pg->key;
    m->call_next = pg->parent;
    pg->used = false;
    if (pg->parent >= 0) m->p[pg->parent].kids--;
    m->node[pg->node].npages--;
    m->present--;
}

/* slru: a promotion that takes the protected segment past 80 % of the cache
 * demotes its least recently used nodes. */
static void slru_demote(model_t *m) {
    uint64_t cap = m->cap * 4 / 5;
    while (pages_where(m, true, false) > cap) {
        mnode_t *v = NULL;
        for (uint32_t i = 0; i < m->nn; i++) {
            mnode_t *x = &m->node[i];
            if (x->slru && x->npages > 0 && (v == NULL || x->last < v->last || (x->last == v->last && x->seq < v->seq))) v = x;
        }
        v->slru = false;
        m->demoted++;
    }
}

/* arc: a run of n pages came back through ghost `from`: p moves as ARC moves
 * it for each page in turn, by max(1, |other ghost| / |ghost from|) (the page
 * still counted in its ghost), toward class `from`, within [0, cap]. */
static void arc_adapt(model_t *m, int from, uint32_t n) {
    double other = (double)ghost_pages(&m->g[!from]), left = (double)ghost_pages(&m->g[from]), cap = (double)m->cap;
    for (uint32_t j = 0; j < n; j++) {
        double d = other / (left + (double)(n - j));
        if (d < 1) d = 1;
        m->arc_p = from == 0 ? fmin(cap, m->arc_p + d) : fmax(0, m->arc_p - d);
    }
}

/* Pages of the new ones that come back protected: s2lru's continuation of a
 * sequence end that had no children, else the leading runs the ghosts
 * remember (ghost 0 asked first). */
static uint64_t protected_prefix(model_t *m, uint32_t ns, int32_t at, uint32_t at_kids, const int32_t *q, uint64_t ins) {
    if (!two_classes(m)) return 0;
    if (m->pol == KVT_POLICY_S2LRU && at >= 0 && at_kids == 0) return m->cont += ins, ins;
    uint64_t key[MAXP], before = at >= 0 ? m->p[at].key : key_seed(ns);
    for (uint64_t i = 0; i < ins; i++) key[i] = before = before * 0x9e3779b97f4a7c15ull + XXH3_64bits(q + i * PT, PT * sizeof(int32_t));
    uint64_t k = 0;
    while (k < ins) {
        int from = 0;
        uint32_t n = ghost_take(&m->g[0], key, k, ins);
        if (n == 0 && m->pol == KVT_POLICY_ARC) n = ghost_take(&m->g[1], key, k, ins), from = 1;
        if (n == 0) break;
        if (m->pol == KVT_POLICY_ARC) arc_adapt(m, from, n);
        m->back += n;
        m->back1 += from == 1 ? n : 0;
        m->back_runs += n > 1 ? n : 0;
        m->p_max = fmax(m->p_max, m->arc_p);
        k += n;
    }
    return k;
}

/* One request of n pages at time t: returns its hit pages, and in *ins the
 * pages it added; got[] receives its pages cached now, root first (hit +
 * *ins of them). */
static uint32_t model_admit(model_t *m, uint32_t ns, const int32_t *q, uint32_t n, int32_t prio, uint64_t t, uint64_t *ins,
                            int32_t *got) {
    int32_t path[MAXP];
    uint32_t hit = 0;
    for (int32_t at = -1; hit < n && (at = find_child(m, ns, at, q + hit * PT)) >= 0;) path[hit++] = at;
    int32_t end = hit ? path[hit - 1] : -1;
    if (hit) { /* a match ending inside a node splits it: the head is a new node */
        uint32_t old = m->p[end].node;
        bool inside = false;
        for (uint32_t i = 0; i < m->np; i++) inside |= m->p[i].used && m->p[i].parent == end && m->p[i].node == old;
        if (inside) {
            uint32_t h = new_node(m, m->node[old]);
            m->node[h].npages = 0;
            for (int32_t x = end; x >= 0 && m->p[x].node == old; x = m->p[x].parent) {
                m->p[x].node = h;
                m->node[h].npages++;
                m->node[old].npages--;
            }
        }
    }
    for (uint32_t i = 0; i < hit; i++) m->p[path[i]].lock++;
    for (uint32_t i = 0; i < hit; i++) { /* each matched node once; it has the highest priority of its requests */
        mnode_t *x = &m->node[m->p[path[i]].node];
        if (i > 0 && m->p[path[i]].node == m->p[path[i - 1]].node) continue;
        x->hits++;
        x->last = t;
        x->prio = x->prio > prio ? x->prio : prio;
    }
    for (uint32_t i = hit; i-- > 0;) { /* the policy hears of each hit node, deepest first */
        if (i > 0 && m->p[path[i]].node == m->p[path[i - 1]].node) continue;
        mnode_t *x = &m->node[m->p[path[i]].node];
        if (two_classes(m)) x->cls1 = true;
        if (m->pol == KVT_POLICY_SLRU && !x->slru && x->hits >= 2) {
            x->slru = true;
            slru_demote(m);
        }
    }
    uint32_t at_kids = hit ? m->p[end].kids : 0;
    uint64_t need = n - hit;
    if (need > 0 && 2 * (m->cap - m->present) < 2 * need + m->target) { /* under half the target: a round, to need + target free */
        while (m->cap - m->present < need + m->target) {
            int first = first_class(m);
            int32_t v = victim(m, first);
            if (v < 0 && m->pol == KVT_POLICY_ARC) v = victim(m, !first);
            if (v < 0) break;
            evict(m, v, first);
        }
        end_call(m);
    }
    uint64_t room = m->cap - m->present;
    *ins = need < room ? need : room;
    uint64_t prot = protected_prefix(m, ns, end, at_kids, q + hit * PT, *ins);
    int32_t parent = end;
    uint32_t node = 0;
    for (uint64_t i = 0; i < *ins; i++) {
        if (i == 0 || i == prot) node = new_node(m, (mnode_t){.last = t, .created = t, .prio = prio, .cls1 = i < prot});
        uint32_t j = 0;
        while (j < m->np && m->p[j].used) j++;
        if (j == m->np) m->np++;
        cr_assert_leq(m->np, POOL);
        mpage_t *pg = &m->p[j];
        *pg = (mpage_t){.parent = parent, .ns = ns, .node = node, .used = true};
        memcpy(pg->tok, q + (hit + i) * PT, sizeof(pg->tok));
        const mpage_t *up = parent >= 0 ? &m->p[parent] : NULL;
        pg->key = (up ? up->key : key_seed(ns)) * 0x9e3779b97f4a7c15ull + XXH3_64bits(pg->tok, sizeof(pg->tok));
        pg->path = path_step(up ? up->path : ns, pg->tok);
        if (up) m->p[parent].kids++;
        m->node[node].npages++;
        m->present++;
        parent = (int32_t)j;
        got[hit + i] = (int32_t)j;
    }
    for (uint32_t i = 0; i < hit; i++) m->p[path[i]].lock--;
    memcpy(got, path, hit * sizeof(int32_t));
    return hit;
}

/* ---- the whole cached set, page by page ------------------------------------ */

typedef struct rec {
    uint64_t path, hits, last, created;
    int32_t prio;
    uint8_t cls1, slru;
} rec_t;

static int rec_cmp(const void *a, const void *b) {
    uint64_t x = ((const rec_t *)a)->path, y = ((const rec_t *)b)->path;
    return x < y ? -1 : x > y;
}

static size_t cache_recs(kvt_cache_t *c, rec_t *out) {
    kvt_radix_t *tree = kvt_cache_tree(c);
    size_t k = 0;
    for (kvt_rnode_t *x = kvt__radix_first(tree); x; x = kvt__radix_next(tree, x)) {
        const kvt_rnode_t *up[MAXP];
        size_t d = 0;
        for (const kvt_rnode_t *a = x->parent; a && a != kvt__radix_root(tree); a = a->parent) up[d++] = a;
        uint64_t h = x->ns;
        while (d-- > 0)
            for (uint32_t i = 0; i < up[d]->npages; i++) h = path_step(h, up[d]->tokens + i * PT);
        cr_assert_eq(x->n_l1, x->npages, "one tier: every page in L1");
        for (uint32_t i = 0; i < x->npages; i++) {
            h = path_step(h, x->tokens + i * PT);
            cr_assert_lt(k, POOL);
            out[k++] = (rec_t){h, x->hits, x->last_access, x->created, x->priority, (uint8_t)(x->policy.word[0] & 1), x->policy.set};
        }
    }
    qsort(out, k, sizeof(rec_t), rec_cmp);
    return k;
}

static size_t model_recs(const model_t *m, rec_t *out) {
    size_t k = 0;
    for (uint32_t i = 0; i < m->np; i++) {
        if (!m->p[i].used) continue;
        const mnode_t *x = &m->node[m->p[i].node];
        out[k++] = (rec_t){m->p[i].path, x->hits, x->last, x->created, x->prio, x->cls1, x->slru};
    }
    qsort(out, k, sizeof(rec_t), rec_cmp);
    return k;
}

static void same_pages(kvt_cache_t *c, const model_t *m, const char *ctx, uint64_t t) {
    static rec_t a[POOL], b[POOL];
    size_t na = cache_recs(c, a), nb = model_recs(m, b);
    cr_assert_eq(na, nb, "%s request %" PRIu64 ": %zu pages cached, model %zu", ctx, t, na, nb);
    for (size_t i = 0; i < na; i++) {
        cr_assert_eq(a[i].path, b[i].path, "%s request %" PRIu64 ": the cached pages differ from the model's", ctx, t);
        cr_assert(a[i].hits == b[i].hits && a[i].last == b[i].last && a[i].created == b[i].created && a[i].prio == b[i].prio,
                  "%s request %" PRIu64 ": a page's hits/recency/creation/priority %" PRIu64 "/%" PRIu64 "/%" PRIu64 "/%d, model %" PRIu64
                  "/%" PRIu64 "/%" PRIu64 "/%d",
                  ctx, t, a[i].hits, a[i].last, a[i].created, a[i].prio, b[i].hits, b[i].last, b[i].created, b[i].prio);
        if (two_classes(m)) cr_assert_eq(a[i].cls1, b[i].cls1, "%s request %" PRIu64 ": a page's class differs", ctx, t);
        if (m->pol == KVT_POLICY_SLRU) cr_assert_eq(a[i].slru, b[i].slru, "%s request %" PRIu64 ": a page's segment differs", ctx, t);
    }
}

/* ---- the workloads ---------------------------------------------------------- */

/* Random requests with shared prefixes: an earlier one (of the last `window`,
 * at most 256) cut short and extended, or continued from its end, or asked
 * again whole; or a fresh one. */
typedef struct stream {
    int32_t seq[256][MAXP * PT];
    uint32_t len[256], ns[256];
    uint32_t n, window;
    kvt_rng_t rng;
} stream_t;

static uint32_t random_request(stream_t *s, int32_t *out, int32_t *prio, uint32_t *ns) {
    uint32_t n = 1 + (uint32_t)kvt_rng_below(&s->rng, 48), keep = 0;
    *prio = (int32_t)kvt_rng_below(&s->rng, 4) - 1;
    *ns = kvt_rng_below(&s->rng, 4) == 0; /* the same tokens may come in another namespace */
    if (s->n > 0 && kvt_rng_below(&s->rng, 4) != 0) {
        uint32_t j = (s->n - 1 - (uint32_t)kvt_rng_below(&s->rng, s->n < s->window ? s->n : s->window)) % 256,
                 how = (uint32_t)kvt_rng_below(&s->rng, 4);
        keep = how == 0 ? s->len[j] : (uint32_t)kvt_rng_below(&s->rng, s->len[j] + 1);
        if (how == 1) n = s->len[j]; /* back whole */
        if (kvt_rng_below(&s->rng, 8) != 0) *ns = s->ns[j];
        if (keep > n) n = keep;
        memcpy(out, s->seq[j], keep * PT * sizeof(int32_t));
    }
    for (uint32_t i = keep * PT; i < n * PT; i++) out[i] = (int32_t)kvt_rng_below(&s->rng, 1 << 20);
    uint32_t slot = s->n % 256;
    memcpy(s->seq[slot], out, n * PT * sizeof(int32_t));
    s->len[slot] = n;
    s->ns[slot] = *ns;
    s->n++;
    return n;
}

/* The Mooncake trace, each hash id a page of PT tokens of its own; each
 * request cut to its first TRACE_PAGES pages (what its requests share is
 * mostly their leading blocks: cut so, the trace keeps 0.28 of LRU's hits at
 * 1,000 pages), so that the model's scans stay short. */
typedef struct trace {
    uint32_t *ids, *len;
    uint32_t n;
} model_trace_t;

static void load_trace(model_trace_t *tr, uint32_t limit) {
    FILE *f = fopen(KVT_SOURCE_DIR "/data/mooncake_synthetic_trace.jsonl", "r");
    cr_assert_not_null(f, "data/mooncake_synthetic_trace.jsonl");
    tr->ids = malloc((size_t)limit * TRACE_PAGES * sizeof(uint32_t));
    tr->len = malloc(limit * sizeof(uint32_t));
    cr_assert(tr->ids && tr->len);
    static char line[1 << 16];
    tr->n = 0;
    while (tr->n < limit && fgets(line, sizeof(line), f)) {
        cJSON *o = cJSON_Parse(line), *h = cJSON_GetObjectItem(o, "hash_ids");
        cr_assert(cJSON_IsArray(h), "trace line %u", tr->n + 1);
        uint32_t k = 0;
        cJSON *e;
        cJSON_ArrayForEach(e, h) if (k < TRACE_PAGES) tr->ids[(size_t)tr->n * TRACE_PAGES + k++] = (uint32_t)e->valuedouble;
        tr->len[tr->n++] = k;
        cJSON_Delete(o);
    }
    fclose(f);
    cr_assert_eq(tr->n, limit);
}

static uint32_t trace_request(const model_trace_t *tr, uint32_t i, int32_t *out, int32_t *prio) {
    uint32_t n = tr->len[i];
    for (uint32_t k = 0; k < n; k++)
        for (uint32_t j = 0; j < PT; j++) out[k * PT + j] = (int32_t)(tr->ids[(size_t)i * TRACE_PAGES + k] * PT + j);
    *prio = (int32_t)(i % 3); /* the trace has none: some, so that priority is not lru */
    return n;
}

/* ---- the comparison --------------------------------------------------------- */

static model_t g_model;

/* What the runs of one policy exercised, summed. */
static struct {
    uint64_t hits, back, back1, back_runs, cont, demoted;
    double p_max;
} g_ran;

/* Requests through a cache of `cap` pages and the model, compared as they go.
 * Returns the hit pages. */
static uint64_t run_case(kvt_policy_t pol, uint64_t cap, double room, uint32_t window, uint64_t seed, const model_trace_t *tr,
                         uint32_t requests) {
    static stream_t s;
    static int32_t q[MAXP * PT];
    model_t *m = &g_model;
    model_reset(m, pol, cap, room);
    memset(&s, 0, sizeof(s));
    kvt_rng_seed(&s.rng, seed);
    s.window = window;
    char ctx[96];
    if (tr) snprintf(ctx, sizeof(ctx), "%s cap=%" PRIu64 " room=%.2f trace", kvt_policy_name(pol), cap, room);
    else snprintf(ctx, sizeof(ctx), "%s cap=%" PRIu64 " room=%.2f window=%u seed %" PRIu64, kvt_policy_name(pol), cap, room, window, seed);
    fprintf(stderr, "policy model: %s\n", ctx);
    kvt_cache_config_t cfg;
    kvt_cache_config_default(&cfg);
    cfg.page_tokens = PT;
    cfg.l1_pages = cap;
    cfg.l2_pages = 0;
    cfg.l1_free_room = room;
    cfg.l2_free_room = 0;
    cfg.policy = pol;
    cfg.write_policy = KVT_WRITE_THROUGH_SELECTIVE;
    kvt_cache_t *c;
    cr_assert_eq(kvt_cache_create(&c, &cfg), KVT_OK);
    uint64_t hits = 0, taken = 0;
    struct {
        kvt_cache_req_t req;
        int32_t page[MAXP];
        uint32_t n;
    } held[2]; /* every 5th request stays admitted for 10 more: nothing it holds may go */
    for (uint64_t t = 1; t <= requests; t++) {
        int32_t prio;
        uint32_t ns = 0, n = tr ? trace_request(tr, (uint32_t)(t - 1), q, &prio) : random_request(&s, q, &prio, &ns);
        kvt_cache_req_t req;
        cr_assert_eq(kvt_cache_admit(c, ns, q, (uint64_t)n * PT + kvt_rng_below(&s.rng, PT), prio, NULL, &req), KVT_OK);
        uint64_t ins, before = m->g[0].added + m->g[1].added;
        int32_t got[MAXP];
        uint32_t want = model_admit(m, ns, q, n, prio, t, &ins, got);
        cr_assert_eq(req.l1_hit_pages, want, "%s request %" PRIu64 ": %" PRIu64 " hit pages, model %u", ctx, t, req.l1_hit_pages, want);
        cr_assert_eq(req.new_pages, ins, "%s request %" PRIu64 ": %" PRIu64 " new pages, model %" PRIu64, ctx, t, req.new_pages, ins);
        if (t % 5 == 0) {
            int h = (int)(t / 5 % 2);
            if (t > 10) { /* request t - 10 goes */
                cr_assert_eq(kvt_cache_release(c, &held[h].req), KVT_OK);
                for (uint32_t i = 0; i < held[h].n; i++) m->p[held[h].page[i]].lock--;
            }
            held[h].req = req;
            held[h].n = want + (uint32_t)ins;
            memcpy(held[h].page, got, held[h].n * sizeof(int32_t));
            for (uint32_t i = 0; i < held[h].n; i++) m->p[got[i]].lock++;
        } else {
            cr_assert_eq(kvt_cache_release(c, &req), KVT_OK);
        }
        hits += want;
        taken += m->g[0].added + m->g[1].added - before;
        if (pol == KVT_POLICY_ARC)
            cr_assert(memcmp(&c->pol.arc_p, &m->arc_p, sizeof(double)) == 0, "%s request %" PRIu64 ": p %a, model %a", ctx, t, c->pol.arc_p,
                      m->arc_p);
        for (int i = 0; i < 2; i++)
            cr_assert_eq(kvt__ghost_live(&c->pol.ghost[i]), ghost_pages(&m->g[i]), "%s request %" PRIu64 ": ghost %d holds %zu pages, model %" PRIu64,
                         ctx, t, i, kvt__ghost_live(&c->pol.ghost[i]), ghost_pages(&m->g[i]));
        if (t % 16 == 0 || t == requests) same_pages(c, m, ctx, t);
    }
    for (uint64_t t = requests - requests % 5; t > requests - 10 && t > 0 && t % 5 == 0; t -= 5)
        cr_assert_eq(kvt_cache_release(c, &held[t / 5 % 2].req), KVT_OK);
    const char *why;
    cr_assert_eq(kvt_cache_check(c, &why), KVT_OK, "%s", why);
    fprintf(stderr,
            "policy model: %s: %" PRIu64 " hit pages, %" PRIu64 " pages into ghosts, %" PRIu64 " back (%" PRIu64 " through ghost 1, %" PRIu64
            " in runs), %" PRIu64 " continued, %" PRIu64 " demoted, p at most %.1f: all as the model's\n",
            ctx, hits, taken, m->back, m->back1, m->back_runs, m->cont, m->demoted, m->p_max);
    g_ran.hits += hits, g_ran.back += m->back, g_ran.back1 += m->back1, g_ran.back_runs += m->back_runs;
    g_ran.cont += m->cont, g_ran.demoted += m->demoted, g_ran.p_max = fmax(g_ran.p_max, m->p_max);
    kvt_cache_destroy(c);
    return hits;
}

/* Capacities from under a request's pages to most of the stream's working
 * set, with and without free room, and a stream that mostly asks again for
 * what it asked lately (which fills slru's protected segment); then the
 * trace. Each path the policy has must have run. */
static void matches_its_model(kvt_policy_t pol) {
    const struct { uint64_t cap; double room; uint32_t window; } cases[] = {
        {40, 0, 256}, {120, 0, 256}, {300, 0, 256}, {120, 0.1, 256}, {300, 0.05, 256}, {300, 0, 4}};
    memset(&g_ran, 0, sizeof(g_ran));
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        run_case(pol, cases[i].cap, cases[i].room, cases[i].window, 700 + i, NULL, 1000);
    cr_assert_gt(g_ran.hits, 5000, "the stream shares prefixes");
    static model_trace_t tr;
    if (tr.n == 0) load_trace(&tr, TRACE_REQS);
    uint64_t hits = run_case(pol, 300, 0, 0, 0, &tr, tr.n) + run_case(pol, 600, 0.05, 0, 0, &tr, tr.n);
    cr_assert_gt(hits, 2000, "the trace shares prefixes");
    if (pol == KVT_POLICY_S2LRU || pol == KVT_POLICY_ARC) cr_assert_gt(g_ran.back, 1000, "pages came back through a ghost");
    if (pol == KVT_POLICY_S2LRU) cr_assert_gt(g_ran.cont, 1000, "continuations started protected");
    if (pol == KVT_POLICY_ARC) {
        cr_assert(g_ran.back1 > 100 && g_ran.back_runs > 1000, "runs came back through both ghosts");
        cr_assert_gt(g_ran.p_max, 10, "p moved");
    }
    if (pol == KVT_POLICY_SLRU) cr_assert_gt(g_ran.demoted, 100, "protected nodes were demoted");
}

/* priority: a prefix created by a low-priority request and used since by a
 * high-priority one is kept as the high-priority one's: once the
 * low-priority continuation below it has gone, a low-priority leaf goes
 * before it. */
Test(policy_model, a_shared_prefix_has_its_highest_priority) {
    kvt_cache_config_t cfg;
    kvt_cache_config_default(&cfg);
    cfg.page_tokens = PT;
    cfg.l1_pages = 8;
    cfg.l2_pages = 0;
    cfg.l1_free_room = 0;
    cfg.policy = KVT_POLICY_PRIORITY;
    kvt_cache_t *c;
    cr_assert_eq(kvt_cache_create(&c, &cfg), KVT_OK);
    int32_t pa[4 * PT], x[4 * PT], y[2 * PT], z[2 * PT];
    for (int j = 0; j < 4 * PT; j++) pa[j] = j, x[j] = 100 + j;
    for (int j = 0; j < 2 * PT; j++) y[j] = 200 + j, z[j] = 300 + j;
    const struct { const int32_t *tok; uint32_t pages; int32_t prio; uint64_t hit; } steps[] = {
        {pa, 4, 0, 0}, /* the prefix P (pages 0-1) and its low-priority continuation (2-3) */
        {pa, 2, 5, 2}, /* P, for a high-priority request */
        {x, 4, 1, 0},  /* the cache is full */
        {y, 2, 1, 0},  /* the continuation goes, the lowest priority */
        {z, 2, 1, 0},  /* now x's tail, not P */
        {pa, 2, 5, 2}, /* P is still there */
    };
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        kvt_cache_req_t r;
        cr_assert_eq(kvt_cache_admit(c, 0, steps[i].tok, steps[i].pages * PT, steps[i].prio, NULL, &r), KVT_OK);
        cr_assert_eq(r.l1_hit_pages, steps[i].hit, "step %zu: %" PRIu64 " hit pages, want %" PRIu64, i, r.l1_hit_pages, steps[i].hit);
        cr_assert_eq(kvt_cache_release(c, &r), KVT_OK);
    }
    kvt_cache_destroy(c);
}

Test(policy_model, lru, .timeout = 120) { matches_its_model(KVT_POLICY_LRU); }
Test(policy_model, lfu, .timeout = 120) { matches_its_model(KVT_POLICY_LFU); }
Test(policy_model, fifo, .timeout = 120) { matches_its_model(KVT_POLICY_FIFO); }
Test(policy_model, priority, .timeout = 120) { matches_its_model(KVT_POLICY_PRIORITY); }
Test(policy_model, slru, .timeout = 120) { matches_its_model(KVT_POLICY_SLRU); }
Test(policy_model, s2lru, .timeout = 120) { matches_its_model(KVT_POLICY_S2LRU); }
Test(policy_model, arc, .timeout = 120) { matches_its_model(KVT_POLICY_ARC); }
