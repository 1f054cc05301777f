/* kvt_keyed_check: every invariant of keyed.c's essay, recomputed. */
#include "kvtier/error.h"
#include "kvtier/keyed.h"
#include "../core/mem-int.h"
#include "../core/sort-int.h"
#include "keyed-int.h"

/* *why (when not NULL) names the first broken invariant. */
#define BROKEN(what) return (why ? *why = (what) : 0), KVT_ECORRUPT

static int check_entries(const kvt_keyed_t *c, const char **why) {
    if (c->nents > c->ecap || c->nents > c->hcap[0] || (c->class_bit && c->nents > c->hcap[1]))
        BROKEN("more entries than room");
    uint64_t pending = 0, pinned = 0, evictable[2] = {0, 0}, cls1 = 0;
    for (size_t i = 0; i < c->nents; i++) {
        const kvt__kentry_t *e = &c->ents[i];
        unsigned k = kvt__kentry_class(c, e);
        cls1 += k;
        if (e->mark) BROKEN("an entry is still marked protected");
        if (e->page >= c->pages) BROKEN("an entry's page is outside the pool");
        if (e->state == KVT__KEYED_PENDING) {
            if (e->pins || e->heap != KVT__KEYED_NOWHERE) BROKEN("a pending entry is pinned or evictable");
            pending++;
            continue;
        }
        if (e->state != KVT__KEYED_READY) BROKEN("an entry has no valid state");
        pinned += e->pins > 0;
        if ((e->pins == 0) != (e->heap != KVT__KEYED_NOWHERE)) BROKEN("an entry's heap membership disagrees with its pins");
        if (e->heap == KVT__KEYED_NOWHERE) continue;
        if (e->heap >= c->nheap[k] || c->heap[k][e->heap] != i) BROKEN("an entry's heap position is wrong");
        evictable[k]++;
    }
    if (pending != c->pending) BROKEN("the pending count differs from the entries");
    if (pinned != c->pinned) BROKEN("the pinned count differs from the entries");
    if (cls1 != c->ncls1) BROKEN("the class-1 count differs from the entries");
    if (evictable[0] != c->nheap[0] || evictable[1] != c->nheap[1])
        BROKEN("the heaps do not hold exactly the evictable entries of their classes");
    return KVT_OK;
}

static int check_heap(const kvt_keyed_t *c, const char **why) {
    for (unsigned k = 0; k < 2; k++) {
        const uint32_t *h = c->heap[k];
        for (size_t pos = 0; pos < c->nheap[k]; pos++) {
            uint32_t i = h[pos];
            if (i >= c->nents || c->ents[i].heap != pos) BROKEN("a heap slot's entry points elsewhere");
            if (pos > 0 && kvt__kentry_less(&c->ents[i], &c->ents[h[(pos - 1) / 2]])) BROKEN("the heap is out of order");
        }
    }
    return KVT_OK;
}

static int check_table(const kvt_keyed_t *c, const char **why) {
    if (c->tcap == 0) {
        if (c->nents) BROKEN("entries but no table");
        return KVT_OK;
    }
    if (c->tcap & (c->tcap - 1)) BROKEN("the table's size is not a power of two");
    if (c->nents * 2 > c->tcap) BROKEN("the table is more than half full");
    size_t used = 0;
    for (size_t s = 0; s < c->tcap; s++) {
        if (c->slots[s] > c->nents) BROKEN("a table slot points past the entries");
        used += c->slots[s] != 0;
    }
    if (used != c->nents) BROKEN("the table does not hold one slot per entry");
    for (size_t i = 0; i < c->nents; i++) /* found from its home: no gap before it, and no duplicate key */
        if (kvt__keyed_find(c, c->ents[i].key) != i) BROKEN("an entry is not found by its key");
    return KVT_OK;
}

/* The pages of the keys and the loose list: in range, distinct, reserved,
 * and the only reserved pages. */
static int check_pages(const kvt_keyed_t *c, const char **why) {
    if (kvt_extalloc_check(c->alloc, why) != KVT_OK) return KVT_ECORRUPT;
    kvt_extalloc_stats_t st = {.size = sizeof(st)};
    kvt_extalloc_stats(c->alloc, &st);
    size_t n = c->nents + c->nloose;
    if (st.free_pages + n != c->pages) BROKEN("the allocator's free pages are not the pages held by no key");
    if (n == 0) return KVT_OK;
    uint32_t *pg = kvt__malloc(2 * n * sizeof(uint32_t));
    if (pg == NULL) return KVT_ENOMEM;
    for (size_t i = 0; i < c->nents; i++) pg[i] = c->ents[i].page;
    for (size_t j = 0; j < c->nloose; j++) pg[c->nents + j] = c->loose[j];
    kvt__sort_u32(pg, pg + n, n, 32);
    const char *bad = NULL;
    for (size_t i = 0; i < n && !bad; i++) {
        if (pg[i] >= c->pages) bad = "a loose page is outside the pool";
        else if (i > 0 && pg[i] == pg[i - 1]) bad = "a page is held twice";
        else if (kvt_extalloc_is_free(c->alloc, pg[i])) bad = "a held page is free in the allocator";
    }
    kvt__free(pg, 2 * n * sizeof(uint32_t));
    if (bad) BROKEN(bad);
    return KVT_OK;
}

/* The room the calls that cannot fail rely on. */
static int check_room(const kvt_keyed_t *c, const char **why) {
    if (c->lcap < c->nloose + c->pending) BROKEN("no room to drop every pending key's page");
    if (c->nev > c->evcap) BROKEN("more events than room");
    if (c->events_on && c->evcap < c->nev + c->pending + c->nents) BROKEN("no room for the events the keys may make");
    if (!c->events_on && c->nev) BROKEN("events recorded while off");
    return KVT_OK;
}

/* ARC: the target in range, every score from the clock, and no present key
 * remembered by a ghost (a store takes its key out of them). */
static int check_arc(const kvt_keyed_t *c, const char **why) {
    if (!c->arc) return KVT_OK;
    if (!(c->target0 >= 0 && c->target0 <= (double)c->pages)) BROKEN("ARC's target is outside [0, pages]");
    if (c->room != 0 || c->ghost != NULL) BROKEN("ARC with free room or adaptive classes");
    for (size_t i = 0; i < c->nents; i++) {
        const kvt__kentry_t *e = &c->ents[i];
        if ((e->score & ~c->class_bit) == 0 || (e->score & ~c->class_bit) > c->clock)
            BROKEN("an ARC key's place is not from the cache's clock");
        uint64_t g = kvt__keyed_ghost_key(e->key);
        if (kvt__lru_has(&c->arc_ghost[0], g) || kvt__lru_has(&c->arc_ghost[1], g))
            BROKEN("a present key is in an ARC ghost");
    }
    return KVT_OK;
}

int kvt_keyed_check(const kvt_keyed_t *c, const char **why) {
    if (why) *why = NULL;
    if (c == NULL) return KVT_EINVAL;
    int rc;
    if ((rc = check_entries(c, why)) || (rc = check_heap(c, why)) || (rc = check_table(c, why)) ||
        (rc = check_pages(c, why)) || (rc = check_room(c, why)) || (rc = check_arc(c, why)))
        return rc;
    return KVT_OK;
}
#undef BROKEN
