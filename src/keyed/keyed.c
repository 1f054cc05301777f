/* The keyed page cache: host pages found by a 128-bit key (kvtier/keyed.h
 * gives the contract; this is the structure behind it).
 *
 * Every present key is one entry of a dense array; two indexes point into it,
 * and an extent allocator owns the page space:
 *
 *   slots: entry index + 1, 0 empty    ents: dense, one per key
 *   +---+---+---+---+---+---+          +--------------------------------+
 *   | 0 | 3 | 0 | 1 | 4 | 2 | ...      | 0  key A  PENDING       page 7 |
 *   +---+---+---+---+---+---+          | 1  key B  READY  s=5  heap 1   |
 *                                      | 2  key C  READY  s=2  heap 0   |
 *   heap: evictable entries, min first | 3  key D  READY  pins 2        |
 *   +---+---+                          +--------------------------------+
 *   | 2 | 1 |   C before B; A (pending) and D (pinned) are not in it
 *   +---+---+
 *
 *   extent allocator: pages [0, N); a page is reserved iff a key or the
 *   loose list (pages of failed stores not yet given back) holds it.
 *
 * A failed store does not give its page to the allocator at once: a free may
 * need memory, and complete_store cannot fail; the page waits on the loose
 * list for the next prepare_store (or reset). Removing an entry moves the
 * last one into its place, and that one's slot and heap position follow.
 *
 * Invariants (kvt_keyed_check recomputes them): the table holds exactly the
 * entries, each reachable from its home slot; an entry is in the heap iff it
 * is READY with no pins, and heap[e.heap] is e; the heap is ordered; the
 * counters (pending, pinned) match the entries; the pages of the entries and
 * the loose list are distinct and reserved, and the allocator's free pages
 * are N - keys - loose. The work arrays have room for what the calls that
 * cannot fail will add: the heap for every entry, the loose list for a failed
 * store of every pending key, the event array for a store event per pending
 * key and a removal per key.
 *
 * prepare_store does all that can fail before it changes anything: it grows
 * the arrays, adds the new keys to the table (taken out again on failure),
 * marks the protected entries, pops the keys to evict (pushed back on
 * failure), and makes one allocator call, which is all or nothing itself. To
 * make it one call, the new keys take the recycled pages first (the loose
 * list, then the evicted keys' pages) and only the rest from the allocator
 * (a reserve), or the recycled pages they do not need go back (a free).
 *
 * ARC (keyed.h) rides on the two classes the hybrid cache's policies use:
 * T1 is class 0 and T2 class 1, each a heap whose scores the cache hands out
 * from a clock (a key placed most recent gets the next tick, so a heap's
 * order is its list's recency order); B1 and B2 are exact LRU sets of the
 * keys' 64-bit fingerprints (core/lru.c), as vLLM's ghosts are ordered dicts
 * that forget their oldest. A victim's ghost takes it before the new keys
 * leave the ghosts, as vLLM's evict runs before its inserts (a full ghost
 * forgets another key then).
 *
 * Cost: lookup, page, touch, pin, unpin and complete_store are O(1) expected
 * per key (one probe), plus O(log E) when a key enters or leaves the heap;
 * prepare_store is O(n + p + (k + p) log E + allocator) for n keys, p
 * protected and k evicted; reset is O(K log K).
 */
#include <string.h>

#include "kvtier/error.h"
#include "kvtier/keyed.h"
#include "../core/abi-int.h"
#include "../core/check-int.h"
#include "../core/lru-int.h"
#include "../core/mem-int.h"
#include "../core/mix-int.h"
#include "keyed-int.h"

enum { WHY_EVICTED = 0, WHY_FAILED = 1, WHY_RESET = 2, WHY_REMOVED = 3 };

#define ARC_T2 (UINT64_C(1) << 63) /* class 1, T2, under ARC; the clock below it */

static void free_ghosts(kvt__ghost_t *g) {
    if (g == NULL) return;
    for (int k = 0; k < 2; k++) kvt__ghost_fini(&g[k]);
    kvt__free(g, 2 * sizeof(*g));
}

int kvt_keyed_create(kvt_keyed_t **out, const kvt_keyed_config_t *cfg) {
    if (out == NULL || cfg == NULL) return KVT_EINVAL;
    kvt_keyed_config_t k = {.size = sizeof(k)};
    if (kvt__abi_in(&k, sizeof(k), cfg) != KVT_OK) return KVT_EINVAL;
    if (k.pages == 0 || k.pages > KVT_ALLOC_MAX_PAGES || !(k.free_room >= 0 && k.free_room < 1)) return KVT_EINVAL;
    if (k.policy > KVT_KEYED_ARC || k.reserved != 0) return KVT_EINVAL;
    if (k.policy == KVT_KEYED_ARC && (k.free_room != 0 || k.pages >= UINT32_MAX)) return KVT_EINVAL;
    kvt_keyed_t *c = KVT_NEW(kvt_keyed_t);
    if (c == NULL) return KVT_ENOMEM;
    if (kvt_extalloc_create(&c->alloc, k.pages) != KVT_OK) {
        KVT_DELETE(c);
        return KVT_ENOMEM;
    }
    c->pages = k.pages;
    double room = k.free_room * (double)k.pages; /* ceil, as Python's math.ceil(free_room * pages) */
    c->room = (uint64_t)room;
    if ((double)c->room < room) c->room++;
    c->events_on = k.events != 0;
    c->cap1 = SIZE_MAX;
    if (k.policy == KVT_KEYED_ARC) { /* T1 and T2 as the two classes; B1 and B2 of `pages` keys each */
        if (kvt__keyed_set_classes(c, ARC_T2, 0) != KVT_OK || kvt__lru_init(&c->arc_ghost[0], k.pages) != KVT_OK ||
            kvt__lru_init(&c->arc_ghost[1], k.pages) != KVT_OK) {
            kvt_keyed_destroy(c);
            return KVT_ENOMEM;
        }
        c->arc = 1;
    }
    *out = c;
    return KVT_OK;
}

void kvt_keyed_destroy(kvt_keyed_t *c) {
    if (c == NULL) return;
    kvt_extalloc_destroy(c->alloc);
    kvt__free(c->ents, c->ecap * sizeof(*c->ents));
    for (int k = 0; k < 2; k++) kvt__free(c->heap[k], c->hcap[k] * sizeof(uint32_t));
    free_ghosts(c->ghost);
    for (int k = 0; k < 2; k++) kvt__lru_fini(&c->arc_ghost[k]);
    kvt__free(c->slots, c->tcap * sizeof(*c->slots));
    kvt__free(c->loose, c->lcap * sizeof(*c->loose));
    kvt__free(c->ev, c->evcap * sizeof(*c->ev));
    kvt__free(c->pops, c->popcap * sizeof(*c->pops));
    kvt__free(c->runs, c->runcap * sizeof(*c->runs));
    KVT_DELETE(c);
}

int kvt_keyed_lookup(kvt_keyed_t *c, kvt_key128_t key) {
    if (c == NULL) return KVT_EINVAL;
    c->lookups++;
    uint32_t i = kvt__keyed_find(c, key);
    if (i == UINT32_MAX) return KVT_KEYED_MISS;
    if (c->ents[i].state == KVT__KEYED_PENDING) return KVT_KEYED_PENDING;
    c->hits++;
    return KVT_KEYED_HIT;
}

int kvt_keyed_page(const kvt_keyed_t *c, kvt_key128_t key, uint64_t *page) {
    if (c == NULL || page == NULL) return KVT_EINVAL;
    uint32_t i = kvt__keyed_find(c, key);
    if (i == UINT32_MAX) return KVT_ENOENT;
    *page = c->ents[i].page;
    return KVT_OK;
}

/* One decision into the digest: a key and a word (its event, or its page). */
static inline void fold(kvt_keyed_t *c, kvt_key128_t key, uint64_t word) {
    c->digest = kvt__mix64(c->digest ^ kvt__mix64(key.hi ^ kvt__mix64(key.lo ^ word)));
}

void kvt__keyed_keep_digest(kvt_keyed_t *c) { c->digest_on = true; }

/* An evicted entry joins its class's ghost (adaptive classes, or ARC). */
static void remember(kvt_keyed_t *c, const kvt__kentry_t *e) {
    unsigned k = kvt__kentry_class(c, e);
    if (c->ghost) kvt__ghost_add(&c->ghost[k], kvt__keyed_ghost_key(e->key));
    if (c->arc) kvt__lru_put(&c->arc_ghost[k], kvt__keyed_ghost_key(e->key));
}

static void record(kvt_keyed_t *c, kvt_key128_t key, uint32_t kind, uint32_t why) {
    if (c->digest_on) fold(c, key, (uint64_t)kind << 32 | why);
    if (!c->events_on) return;
    KVT_ASSERT(c->nev < c->evcap);
    c->ev[c->nev++] = (kvt_keyed_event_t){.key = key, .kind = kind, .why = why};
}

/* ---- prepare_store ---- */

/* What one prepare_store does, worked out before it changes anything. */
typedef struct plan {
    size_t base;  /* the first new entry (the new keys are ents[base..base+m)) */
    size_t m;     /* new keys */
    size_t k;     /* keys to evict */
    size_t nprot; /* evictable entries marked protected */
    size_t aside; /* protected entries popped on the way to the k-th */
    size_t popped; /* entries out of the heap, in pops[0..popped) */
} plan_t;

static size_t count_absent(const kvt_keyed_t *c, const kvt_key128_t *keys, size_t n) {
    size_t u = 0;
    for (size_t i = 0; i < n; i++) u += kvt__keyed_find(c, keys[i]) == UINT32_MAX;
    return u;
}

/* Adds the absent keys of keys[] as PENDING entries, at most `limit`;
 * pages[i] is the new key's ordinal or UINT64_MAX. KVT_ENOSPC past limit. */
static int add_new(kvt_keyed_t *c, const kvt_key128_t *keys, const uint64_t *scores, size_t n, size_t limit,
                   uint64_t *pages, plan_t *p) {
    for (size_t i = 0; i < n; i++) {
        pages[i] = UINT64_MAX;
        if (kvt__keyed_find(c, keys[i]) != UINT32_MAX) continue;
        if (p->m == limit) return KVT_ENOSPC;
        kvt__keyed_add(c, keys[i], c->arc ? ++c->clock : scores[i]); /* (ARC: T1's most recent, in order) */
        pages[i] = p->m++;
    }
    return KVT_OK;
}

/* Marks (on) or unmarks the protected entries; returns how many evictable
 * ones it newly marked. */
static size_t mark_protect(kvt_keyed_t *c, const kvt_key128_t *protect, size_t np, int on) {
    size_t marked = 0;
    for (size_t j = 0; j < np; j++) {
        uint32_t i = kvt__keyed_find(c, protect[j]);
        if (i == UINT32_MAX) continue;
        kvt__kentry_t *e = &c->ents[i];
        if (!on) e->mark = 0;
        else if (e->heap != KVT__KEYED_NOWHERE && !e->mark) {
            e->mark = 1;
            marked++;
        }
    }
    return marked;
}

/* Takes back what prepare_store did: popped entries, marks, new entries. */
static void undo(kvt_keyed_t *c, const kvt_key128_t *protect, size_t np, const plan_t *p, uint64_t *pages, size_t n) {
    for (size_t j = 0; j < p->popped; j++) kvt__heap_push(c, c->pops[j]);
    mark_protect(c, protect, np, 0);
    while (c->nents > p->base) kvt__keyed_remove(c, (uint32_t)c->nents - 1);
    for (size_t i = 0; i < n; i++) pages[i] = UINT64_MAX;
}

/* Room for everything the commit and later calls that cannot fail will add. */
static int grow_work(kvt_keyed_t *c, const plan_t *p) {
    size_t recycled = c->nloose + p->k, moved = p->m > recycled ? p->m - recycled : recycled - p->m;
    if (c->events_on &&
        kvt__grow((void **)&c->ev, &c->evcap, c->nev + c->pending + c->nents + p->m, sizeof(*c->ev)))
        return KVT_ENOMEM;
    if (kvt__grow((void **)&c->loose, &c->lcap, c->pending + p->m, sizeof(*c->loose)) ||
        kvt__grow((void **)&c->pops, &c->popcap, p->k ? p->k + p->nprot : 0, sizeof(*c->pops)) ||
        kvt__grow((void **)&c->runs, &c->runcap, moved, sizeof(*c->runs)))
        return KVT_ENOMEM;
    return KVT_OK;
}

/* The next evictable entry in eviction order, taken out of its heap; cnt0:
 * the class-0 keys present, which the target weighs (two classes only). */
static uint32_t pop_next(kvt_keyed_t *c, size_t cnt0) {
    unsigned k = 0;
    if (c->arc) { /* T1 while it holds at least int(target) keys, as vLLM compares them */
        k = cnt0 < (size_t)c->target0;
        if (c->nheap[k] == 0) k = !k;
    } else if (c->class_bit) {
        k = c->nheap[1] > 0 && (c->nheap[0] == 0 || cnt0 <= c->target0);
    }
    return kvt__heap_pop(c, k);
}

/* Pops the k first unprotected evictable entries into pops[0..k), and the
 * protected ones met on the way after them. */
static void pop_victims(kvt_keyed_t *c, plan_t *p) {
    size_t cnt0 = c->nents - c->ncls1; /* the class-0 keys before this store's new ones */
    for (size_t j = p->base; j < c->nents; j++) cnt0 -= kvt__kentry_class(c, &c->ents[j]) == 0;
    for (size_t j = 0; j < p->k;) {
        uint32_t i = pop_next(c, cnt0);
        if (c->ents[i].mark) {
            c->pops[p->k + p->aside++] = i;
            continue;
        }
        c->pops[j++] = i;
        cnt0 -= kvt__kentry_class(c, &c->ents[i]) == 0;
    }
    p->popped = p->k + p->aside;
}

/* The j-th recycled page: the loose list, then the evicted keys' pages. */
static uint32_t recycled_page(const kvt_keyed_t *c, size_t j) {
    return j < c->nloose ? c->loose[j] : c->ents[c->pops[j - c->nloose]].page;
}

/* The one allocator call: reserve what the recycled pages do not cover, or
 * free the recycled pages the new keys do not take. All or nothing. */
static int move_pages(kvt_keyed_t *c, const plan_t *p, size_t *nruns) {
    size_t recycled = c->nloose + p->k;
    *nruns = 0;
    if (p->m > recycled) return kvt_extalloc_reserve(c->alloc, p->m - recycled, c->runs, p->m - recycled, nruns);
    if (p->m == recycled) return KVT_OK;
    for (size_t j = p->m; j < recycled; j++) c->runs[j - p->m] = (kvt_run_t){recycled_page(c, j), 1};
    return kvt_extalloc_free(c->alloc, c->runs, recycled - p->m);
}

static void commit(kvt_keyed_t *c, const kvt_key128_t *protect, size_t np, const plan_t *p, size_t nruns,
                   uint64_t *pages, size_t n, kvt_key128_t *evicted, uint64_t *evscores) {
    for (size_t j = p->k; j < p->k + p->aside; j++) kvt__heap_push(c, c->pops[j]);
    mark_protect(c, protect, np, 0);
    size_t recycled = c->nloose + p->k, j = 0;
    for (; j < p->m && j < recycled; j++) c->ents[p->base + j].page = recycled_page(c, j);
    for (size_t r = 0; r < nruns; r++)
        for (uint32_t q = 0; q < c->runs[r].len; q++) c->ents[p->base + j++].page = c->runs[r].start + q;
    for (size_t i = 0; i < n; i++)
        if (pages[i] != UINT64_MAX) pages[i] = c->ents[p->base + pages[i]].page;
    if (c->digest_on)
        for (size_t i = 0; i < p->m; i++) fold(c, c->ents[p->base + i].key, UINT64_C(1) << 63 | c->ents[p->base + i].page);
    for (size_t v = 0; v < p->k; v++) {
        const kvt__kentry_t *e = &c->ents[c->pops[v]];
        evicted[v] = e->key;
        if (evscores) evscores[v] = e->score;
        record(c, evicted[v], KVT_KEYED_REMOVED, WHY_EVICTED);
        remember(c, e);
    }
    for (size_t v = 0; v < p->k; v++) kvt__keyed_remove(c, kvt__keyed_find(c, evicted[v]));
    if (c->arc) /* after the victims joined theirs, as vLLM inserts after it evicts */
        for (size_t i = 0; i < p->m; i++) {
            uint64_t g = kvt__keyed_ghost_key(c->ents[p->base + i].key);
            if (!kvt__lru_remove(&c->arc_ghost[0], g)) kvt__lru_remove(&c->arc_ghost[1], g);
        }
    c->nloose = 0;
    c->pending += p->m;
    c->stores_prepared += p->m;
    c->evictions += p->k;
}

/* Counts, limits and refusals; then the steps that can fail, then commit. */
static int prepare(kvt_keyed_t *c, const kvt_key128_t *keys, const uint64_t *scores, size_t n,
                   const kvt_key128_t *protect, size_t np, uint64_t *pages, kvt_key128_t *evicted, uint64_t *evscores,
                   size_t capacity, size_t *nevicted) {
    size_t u = count_absent(c, keys, n), freep = c->pages - c->nents; /* held by no key */
    size_t limit = freep + kvt__keyed_evictable(c); /* more new keys than this can never fit */
    plan_t p = {.base = c->nents};
    if (u > limit) u = limit;
    if (u > 0 && kvt__keyed_reserve_keys(c, c->nents + u) != KVT_OK) {
        for (size_t i = 0; i < n; i++) pages[i] = UINT64_MAX;
        return KVT_ENOMEM;
    }
    int rc = add_new(c, keys, scores, n, limit, pages, &p);
    p.nprot = mark_protect(c, protect, np, 1);
    size_t need = p.m > freep ? p.m - freep : 0, avail = kvt__keyed_evictable(c) - p.nprot;
    if (rc == KVT_OK && need > avail) rc = KVT_ENOSPC;
    if (rc == KVT_ENOSPC) c->store_refusals++;
    if (rc == KVT_OK) {
        p.k = need == 0 ? 0 : need + (c->room < avail - need ? c->room : avail - need);
        if (p.k > capacity) rc = KVT_ERANGE;
    }
    if (rc == KVT_OK) rc = grow_work(c, &p);
    size_t nruns = 0;
    if (rc == KVT_OK) {
        pop_victims(c, &p);
        rc = move_pages(c, &p, &nruns);
    }
    if (rc != KVT_OK) {
        undo(c, protect, np, &p, pages, n);
        return rc;
    }
    commit(c, protect, np, &p, nruns, pages, n, evicted, evscores);
    *nevicted = p.k;
    return KVT_OK;
}

int kvt__keyed_prepare_scored(kvt_keyed_t *c, const kvt_key128_t *keys, const uint64_t *scores, size_t n,
                              const kvt_key128_t *protect, size_t nprotect, uint64_t *pages, kvt_key128_t *evicted,
                              uint64_t *evscores, size_t capacity, size_t *nevicted) {
    if (c == NULL || nevicted == NULL || (n > 0 && (keys == NULL || (scores == NULL && !c->arc) || pages == NULL)) ||
        (nprotect > 0 && protect == NULL) || (capacity > 0 && evicted == NULL))
        return KVT_EINVAL;
    *nevicted = 0;
    return prepare(c, keys, scores, n, protect, nprotect, pages, evicted, evscores, capacity, nevicted);
}

int kvt_keyed_prepare_store(kvt_keyed_t *c, const kvt_key128_t *keys, const uint64_t *scores, size_t n,
                            const kvt_key128_t *protect, size_t nprotect, uint64_t *pages, kvt_key128_t *evicted,
                            size_t capacity, size_t *nevicted) {
    return kvt__keyed_prepare_scored(c, keys, scores, n, protect, nprotect, pages, evicted, NULL, capacity, nevicted);
}

/* ---- the rest of a key's life ---- */

void kvt_keyed_complete_store(kvt_keyed_t *c, const kvt_key128_t *keys, size_t n, int ok) {
    if (c == NULL || keys == NULL) return;
    for (size_t j = 0; j < n; j++) {
        uint32_t i = kvt__keyed_find(c, keys[j]);
        if (i == UINT32_MAX || c->ents[i].state != KVT__KEYED_PENDING) continue;
        c->pending--;
        if (ok) {
            c->ents[i].state = KVT__KEYED_READY;
            kvt__heap_push(c, i);
            record(c, keys[j], KVT_KEYED_STORED, 0);
            c->stores_completed++;
            continue;
        }
        KVT_ASSERT(c->nloose < c->lcap);
        c->loose[c->nloose++] = c->ents[i].page;
        kvt__keyed_remove(c, i);
        record(c, keys[j], KVT_KEYED_REMOVED, WHY_FAILED);
        c->stores_failed++;
    }
}

int kvt_keyed_pin(kvt_keyed_t *c, const kvt_key128_t *keys, size_t n, uint64_t *pages) {
    if (c == NULL || (n > 0 && keys == NULL)) return KVT_EINVAL;
    for (size_t j = 0; j < n; j++) {
        uint32_t i = kvt__keyed_find(c, keys[j]);
        if (i == UINT32_MAX) return KVT_ENOENT;
        if (c->ents[i].state != KVT__KEYED_READY) return KVT_EBUSY;
        if (n > UINT32_MAX - c->ents[i].pins) return KVT_ERANGE; /* (its count would wrap) */
    }
    for (size_t j = 0; j < n; j++) {
        uint32_t i = kvt__keyed_find(c, keys[j]);
        kvt__kentry_t *e = &c->ents[i];
        if (e->pins++ == 0) {
            kvt__heap_erase(c, i);
            c->pinned++;
        }
        if (pages) pages[j] = e->page;
    }
    c->loads += n;
    return KVT_OK;
}

int kvt_keyed_unpin(kvt_keyed_t *c, const kvt_key128_t *keys, size_t n) {
    if (c == NULL || (n > 0 && keys == NULL)) return KVT_EINVAL;
    for (size_t j = 0; j < n; j++) { /* drop the pins, or put back those dropped */
        uint32_t i = kvt__keyed_find(c, keys[j]);
        if (i != UINT32_MAX && c->ents[i].pins > 0) {
            c->ents[i].pins--;
            continue;
        }
        while (j-- > 0) c->ents[kvt__keyed_find(c, keys[j])].pins++;
        return KVT_EINVAL;
    }
    for (size_t j = 0; j < n; j++) { /* then make the unpinned evictable */
        uint32_t i = kvt__keyed_find(c, keys[j]);
        if (c->ents[i].pins == 0 && c->ents[i].heap == KVT__KEYED_NOWHERE) {
            kvt__heap_push(c, i);
            c->pinned--;
        }
    }
    return KVT_OK;
}

void kvt__keyed_rescore(kvt_keyed_t *c, uint32_t i, uint64_t s) {
    kvt__kentry_t *e = &c->ents[i];
    unsigned from = kvt__kentry_class(c, e), heaped = e->heap != KVT__KEYED_NOWHERE;
    if (heaped && ((s & c->class_bit) != 0) != from) { /* to the other class's heap */
        kvt__heap_erase(c, i);
        e->score = s;
        kvt__heap_push(c, i);
    } else {
        e->score = s;
        if (heaped) kvt__heap_fix(c, i);
    }
    c->ncls1 += kvt__kentry_class(c, e);
    c->ncls1 -= from;
}

void kvt__keyed_demote(kvt_keyed_t *c) {
    while (c->ncls1 > c->cap1 && c->nheap[1] > 0) {
        uint32_t i = kvt__heap_pop(c, 1);
        c->ents[i].score &= ~c->class_bit;
        c->ncls1--;
        kvt__heap_push(c, i);
    }
}

void kvt__keyed_set_class1_cap(kvt_keyed_t *c, size_t cap1) { c->cap1 = cap1; }

void kvt_keyed_touch(kvt_keyed_t *c, const kvt_key128_t *keys, const uint64_t *scores, size_t n) {
    if (c == NULL || keys == NULL || scores == NULL || c->arc) return;
    for (size_t j = 0; j < n; j++) {
        uint32_t i = kvt__keyed_find(c, keys[j]);
        if (i != UINT32_MAX) kvt__keyed_rescore(c, i, scores[j]);
    }
    kvt__keyed_demote(c);
}

/* Entry i (ready, out of the heap) leaves: its page waits on the loose
 * list (room reserved), as a failed store's does; an eviction (why
 * WHY_EVICTED) is counted and remembered as prepare_store's are. */
static void take_out(kvt_keyed_t *c, uint32_t i, uint32_t why) {
    kvt_key128_t key = c->ents[i].key;
    if (why == WHY_EVICTED) {
        remember(c, &c->ents[i]);
        c->evictions++;
    }
    KVT_ASSERT(c->nloose < c->lcap);
    c->loose[c->nloose++] = c->ents[i].page;
    kvt__keyed_remove(c, i);
    record(c, key, KVT_KEYED_REMOVED, why);
}

/* Takes the ready, unpinned ones of keys[0..n) out (take_out); the loose
 * list's room is the only memory this needs. */
static int drop(kvt_keyed_t *c, const kvt_key128_t *keys, size_t n, uint32_t why, size_t *ndropped) {
    if (kvt__grow((void **)&c->loose, &c->lcap, c->nloose + c->pending + n, sizeof(*c->loose))) return KVT_ENOMEM;
    size_t k = 0;
    for (size_t j = 0; j < n; j++) {
        uint32_t i = kvt__keyed_find(c, keys[j]);
        if (i == UINT32_MAX || c->ents[i].state != KVT__KEYED_READY || c->ents[i].pins > 0) continue;
        kvt__heap_erase(c, i);
        take_out(c, i, why);
        k++;
    }
    *ndropped = k;
    return KVT_OK;
}

int kvt_keyed_remove(kvt_keyed_t *c, const kvt_key128_t *keys, size_t n, size_t *nremoved) {
    size_t k = 0;
    if (nremoved) *nremoved = 0;
    if (c == NULL || (n > 0 && keys == NULL)) return KVT_EINVAL;
    int rc = drop(c, keys, n, WHY_REMOVED, &k);
    c->removed += k;
    if (nremoved) *nremoved = k;
    return rc;
}

int kvt__keyed_evict(kvt_keyed_t *c, const kvt_key128_t *keys, size_t n, size_t *nevicted) {
    return drop(c, keys, n, WHY_EVICTED, nevicted);
}

size_t kvt__keyed_evict_next(kvt_keyed_t *c, size_t k, int (*keep)(void *arg, kvt_key128_t key), void *arg,
                             kvt_key128_t *keys, uint64_t *scores, uint64_t *pages, uint8_t *kept) {
    if (k > kvt__keyed_evictable(c)) k = kvt__keyed_evictable(c);
    if (kvt__grow((void **)&c->loose, &c->lcap, c->nloose + c->pending + k, sizeof(*c->loose))) return 0;
    size_t cnt0 = c->nents - c->ncls1;
    for (size_t j = 0; j < k; j++) { /* in order, as prepare_store's victims */
        uint32_t i = pop_next(c, cnt0);
        kvt__kentry_t *e = &c->ents[i];
        cnt0 -= kvt__kentry_class(c, e) == 0;
        keys[j] = e->key, scores[j] = e->score, pages[j] = e->page;
        kept[j] = keep != NULL && keep(arg, e->key);
        if (!kept[j]) take_out(c, i, WHY_EVICTED); /* (a kept one: out of the heap until the others are taken) */
    }
    for (size_t j = 0; j < k; j++) /* (found again: a removal moves the last entry) */
        if (kept[j]) kvt__heap_push(c, kvt__keyed_find(c, keys[j]));
    return k;
}

int kvt_keyed_reset(kvt_keyed_t *c) {
    if (c == NULL) return KVT_EINVAL;
    if (c->pending > 0 || c->pinned > 0) return KVT_EBUSY;
    size_t nfree = c->nents + c->nloose;
    if (nfree > 0) { /* every key is in the heap: free its page and the loose ones */
        if (kvt__grow((void **)&c->runs, &c->runcap, nfree, sizeof(*c->runs))) return KVT_ENOMEM;
        for (size_t j = 0; j < c->nents; j++) c->runs[j] = (kvt_run_t){c->ents[j].page, 1};
        for (size_t j = 0; j < c->nloose; j++) c->runs[c->nents + j] = (kvt_run_t){c->loose[j], 1};
        if (kvt_extalloc_free(c->alloc, c->runs, nfree) != KVT_OK) return KVT_ENOMEM;
    }
    for (size_t cnt0 = c->nents - c->ncls1; kvt__keyed_evictable(c) > 0;) {
        uint32_t i = pop_next(c, cnt0);
        cnt0 -= kvt__kentry_class(c, &c->ents[i]) == 0;
        record(c, c->ents[i].key, KVT_KEYED_REMOVED, WHY_RESET);
    }
    c->ncls1 = 0;
    if (c->tcap) memset(c->slots, 0, c->tcap * sizeof(*c->slots));
    c->nents = 0;
    c->nloose = 0;
    if (c->arc) { /* vLLM's clear(): the ghosts and the target too */
        for (int k = 0; k < 2; k++) kvt__lru_clear(&c->arc_ghost[k]);
        c->target0 = 0;
    }
    return KVT_OK;
}

/* ARC's step: a key found in class `from`'s ghost (of `mine` keys, the
 * other's `other`) moves the target toward that class by max(1, other /
 * mine), within [0, pages]. Both ARCs take it: the policy's (exact ghosts)
 * and the hybrid cache's adaptive classes (kvt__keyed_missed). */
static void move_target(kvt_keyed_t *c, unsigned from, double mine, double other) {
    double d = other > mine ? other / mine : 1, t = from == 0 ? c->target0 + d : c->target0 - d;
    c->target0 = t < 0 ? 0 : t > (double)c->pages ? (double)c->pages : t;
}

/* ---- ARC's hooks (keyed.h) ---- */

/* A key of a ghost moves the target toward the list that lost it. */
static void arc_adapt(kvt_keyed_t *c, kvt_key128_t key) {
    uint64_t g = kvt__keyed_ghost_key(key);
    kvt__lru_t *b = c->arc_ghost;
    unsigned from = kvt__lru_touch(&b[0], g) ? 0 : kvt__lru_touch(&b[1], g) ? 1 : 2;
    if (from < 2) move_target(c, from, (double)kvt__lru_size(&b[from]), (double)kvt__lru_size(&b[!from]));
}

/* Entry i becomes the most recent of T2 (t2) or of T1. */
static void arc_place(kvt_keyed_t *c, uint32_t i, int t2) { kvt__keyed_rescore(c, i, ++c->clock | (t2 ? ARC_T2 : 0)); }

int kvt_keyed_arc_touch(kvt_keyed_t *c, const kvt_key128_t *keys, size_t n) {
    if (c == NULL || !c->arc || (n > 0 && keys == NULL)) return KVT_EINVAL;
    for (size_t j = n; j-- > 0;) {
        uint32_t i = kvt__keyed_find(c, keys[j]);
        if (i == UINT32_MAX) arc_adapt(c, keys[j]);
        else arc_place(c, i, kvt__kentry_class(c, &c->ents[i]) || c->ents[i].state == KVT__KEYED_READY);
    }
    return KVT_OK;
}

int kvt_keyed_arc_missed(kvt_keyed_t *c, const kvt_key128_t *keys, size_t n) {
    if (c == NULL || !c->arc || (n > 0 && keys == NULL)) return KVT_EINVAL;
    for (size_t j = n; j-- > 0;) arc_adapt(c, keys[j]);
    return KVT_OK;
}

int kvt_keyed_arc_finish(kvt_keyed_t *c, const kvt_key128_t *keys, const uint8_t *flags, size_t n) {
    if (c == NULL || !c->arc || (n > 0 && (keys == NULL || flags == NULL))) return KVT_EINVAL;
    for (size_t j = 0; j < n; j++)
        if (flags[j] > KVT_KEYED_ARC_REUSED) return KVT_EINVAL;
    for (size_t j = n; j-- > 0;) {
        uint32_t i = flags[j] ? kvt__keyed_find(c, keys[j]) : UINT32_MAX;
        if (i != UINT32_MAX)
            arc_place(c, i, flags[j] == KVT_KEYED_ARC_REUSED || kvt__kentry_class(c, &c->ents[i]));
    }
    return KVT_OK;
}

void kvt__keyed_missed(kvt_keyed_t *c, kvt_key128_t key) {
    if (c->ghost == NULL) return;
    uint64_t g = kvt__keyed_ghost_key(key);
    unsigned from = kvt__ghost_take(&c->ghost[0], g) ? 0 : kvt__ghost_take(&c->ghost[1], g) ? 1 : 2;
    if (from == 2) return;
    /* ARC weighs the ghosts as they were with the key still in */
    move_target(c, from, (double)kvt__ghost_live(&c->ghost[from]) + 1, (double)kvt__ghost_live(&c->ghost[!from]));
}

int kvt__keyed_set_classes(kvt_keyed_t *c, uint64_t class_bit, int adaptive) {
    if (c->nents > 0 || c->nloose > 0) return KVT_EBUSY;
    if (class_bit && c->hcap[1] < c->hcap[0]) { /* heap 1 gets the room heap 0 has */
        uint32_t *h = kvt__realloc(c->heap[1], c->hcap[1] * sizeof(uint32_t), c->hcap[0] * sizeof(uint32_t));
        if (h == NULL) return KVT_ENOMEM;
        c->heap[1] = h;
        c->hcap[1] = c->hcap[0];
    }
    kvt__ghost_t *g = NULL;
    if (class_bit && adaptive) {
        g = kvt__calloc(2, sizeof(*g));
        if (g == NULL) return KVT_ENOMEM;
        for (int k = 0; k < 2; k++)
            if (kvt__ghost_init(&g[k], (size_t)(2 * c->pages), 1) != KVT_OK) {
                free_ghosts(g);
                return KVT_ENOMEM;
            }
    }
    free_ghosts(c->ghost);
    c->ghost = g;
    c->class_bit = class_bit;
    c->target0 = 0;
    return KVT_OK;
}

size_t kvt_keyed_take_events(kvt_keyed_t *c, kvt_keyed_event_t *out, size_t cap) {
    if (c == NULL || out == NULL) return 0;
    size_t k = cap < c->nev ? cap : c->nev;
    if (k == 0) return 0;
    memcpy(out, c->ev, k * sizeof(*out));
    memmove(c->ev, c->ev + k, (c->nev - k) * sizeof(*c->ev));
    c->nev -= k;
    return k;
}

int kvt_keyed_stats(const kvt_keyed_t *c, kvt_keyed_stats_t *out) {
    if (c == NULL || out == NULL) return KVT_EINVAL;
    kvt_keyed_stats_t st = {
        .size = sizeof(st),
        .pages = c->pages,
        .free_pages = c->pages - c->nents,
        .keys = c->nents,
        .pending = c->pending,
        .pinned = c->pinned,
        .lookups = c->lookups,
        .hits = c->hits,
        .stores_prepared = c->stores_prepared,
        .stores_completed = c->stores_completed,
        .stores_failed = c->stores_failed,
        .store_refusals = c->store_refusals,
        .evictions = c->evictions,
        .loads = c->loads,
        .removed = c->removed,
    };
    return kvt__abi_out(out, &st, sizeof(st));
}
