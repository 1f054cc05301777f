/* The moves outstanding with async_moves (hybrid-int.h): entries in one
 * array with stable indexes and a free list, chained in hash buckets by
 * their destination (group, tier, key), and a ring of the moves to hand out
 * in the order they became ready. A report finds its move in O(1) expected,
 * however many are in flight (an engine with thousands of copies in flight
 * reports them by the thousand); the table's only O(entries) walks are the
 * checks'. */
#include <string.h>

#include "../core/check-int.h"
#include "../core/mem-int.h"
#include "../core/mix-int.h"
#include "kvtier/error.h"
#include "hybrid-int.h"

static uint32_t bucket_of(const kvt__pendtab_t *t, uint32_t group, uint32_t tier, kvt_key128_t key) {
    uint64_t h = kvt__mix64(key.hi ^ kvt__mix64(key.lo ^ ((uint64_t)group << 8 | tier)));
    return (uint32_t)h & (t->nb - 1);
}

void kvt__pend_free(kvt__pendtab_t *t) {
    kvt__free(t->e, (size_t)t->cap * sizeof(*t->e));
    kvt__free(t->bucket, (size_t)t->nb * sizeof(*t->bucket));
    kvt__free(t->queue, (size_t)t->cap * sizeof(*t->queue));
    memset(t, 0, sizeof(*t));
}

int kvt__pend_reserve(kvt__pendtab_t *t, size_t more) {
    size_t need = (size_t)t->live + more;
    if (need <= t->cap) return KVT_OK;
    if (need > UINT32_MAX / 4) return KVT_ENOMEM;
    uint32_t cap = t->cap ? t->cap : 64, nb = t->nb ? t->nb : 128;
    while (cap < need) cap *= 2;
    while (nb < 2 * cap) nb *= 2; /* load at most 1/2 */
    kvt__pend_t *e = kvt__malloc((size_t)cap * sizeof(*e));
    uint32_t *bucket = kvt__malloc((size_t)nb * sizeof(*bucket)), *queue = kvt__malloc((size_t)cap * sizeof(*queue));
    if (e == NULL || bucket == NULL || queue == NULL) {
        kvt__free(e, (size_t)cap * sizeof(*e));
        kvt__free(bucket, (size_t)nb * sizeof(*bucket));
        kvt__free(queue, (size_t)cap * sizeof(*queue));
        return KVT_ENOMEM;
    }
    if (t->cap) memcpy(e, t->e, (size_t)t->cap * sizeof(*e));
    for (uint32_t i = 0; i < t->qn; i++) queue[i] = t->queue[(t->qhead + i) % t->cap];
    kvt__pend_t *old = t->e;
    uint32_t oldcap = t->cap;
    if (oldcap == 0) t->free = PEND_NONE;
    kvt__free(t->bucket, (size_t)t->nb * sizeof(*t->bucket));
    kvt__free(t->queue, (size_t)t->cap * sizeof(*t->queue));
    t->e = e, t->bucket = bucket, t->queue = queue, t->nb = nb, t->qhead = 0;
    /* the new entries onto the free list, lowest first; then every live entry into its new bucket */
    for (uint32_t i = cap; i-- > oldcap;) {
        e[i].state = PEND_FREE;
        e[i].next = t->free;
        t->free = i;
    }
    for (uint32_t b = 0; b < nb; b++) bucket[b] = PEND_NONE;
    for (uint32_t i = 0; i < oldcap; i++) {
        if (e[i].state == PEND_FREE) continue;
        uint32_t b = bucket_of(t, e[i].m.group, e[i].m.dst_tier, e[i].m.key);
        e[i].next = bucket[b];
        bucket[b] = i;
    }
    kvt__free(old, (size_t)oldcap * sizeof(*old));
    t->cap = cap;
    return KVT_OK;
}

uint32_t kvt__pend_add(kvt__pendtab_t *t, const kvt_hybrid_move_t *m, int src_pinned, int waiting) {
    KVT_ASSERT(t->live < t->cap); /* reserved */
    uint32_t i = t->free;
    kvt__pend_t *e = &t->e[i];
    t->free = e->next;
    uint32_t b = bucket_of(t, m->group, m->dst_tier, m->key);
    *e = (kvt__pend_t){.m = *m, .next = t->bucket[b], .waiter = PEND_NONE, .state = PEND_WAITING,
                       .src_pinned = (uint8_t)src_pinned};
    t->bucket[b] = i;
    t->live++;
    if (!waiting) kvt__pend_ready(t, i);
    return i;
}

void kvt__pend_ready(kvt__pendtab_t *t, uint32_t i) {
    KVT_ASSERT(t->e[i].state == PEND_WAITING && t->qn < t->cap);
    t->e[i].state = PEND_QUEUED;
    t->queue[(t->qhead + t->qn++) % t->cap] = i;
}

size_t kvt__pend_take(kvt__pendtab_t *t, kvt_hybrid_move_t *out, size_t cap) {
    size_t k = 0;
    for (; k < cap && t->qn; k++, t->qn--) {
        uint32_t i = t->queue[t->qhead];
        t->qhead = (t->qhead + 1) % t->cap;
        t->e[i].state = PEND_TAKEN;
        out[k] = t->e[i].m;
    }
    return k;
}

static int same_move(const kvt_hybrid_move_t *a, const kvt_hybrid_move_t *b) {
    return a->group == b->group && a->src_tier == b->src_tier && a->dst_tier == b->dst_tier &&
           a->src_slot == b->src_slot && a->dst_slot == b->dst_slot && a->key.hi == b->key.hi && a->key.lo == b->key.lo;
}

uint32_t kvt__pend_find(const kvt__pendtab_t *t, const kvt_hybrid_move_t *m, int state, int seen) {
    if (t->nb == 0) return PEND_NONE;
    for (uint32_t i = t->bucket[bucket_of(t, m->group, m->dst_tier, m->key)]; i != PEND_NONE; i = t->e[i].next)
        if (t->e[i].state == state && t->e[i].seen == seen && same_move(&t->e[i].m, m)) return i;
    return PEND_NONE;
}

uint32_t kvt__pend_chain(const kvt__pendtab_t *t, uint32_t group, uint32_t dst_tier, kvt_key128_t key) {
    return t->nb ? t->bucket[bucket_of(t, group, dst_tier, key)] : PEND_NONE;
}

void kvt__pend_remove(kvt__pendtab_t *t, uint32_t i) {
    kvt__pend_t *e = &t->e[i];
    uint32_t *p = &t->bucket[bucket_of(t, e->m.group, e->m.dst_tier, e->m.key)];
    while (*p != i) p = &t->e[*p].next;
    *p = e->next;
    e->state = PEND_FREE;
    e->next = t->free;
    t->free = i;
    t->live--;
}

const char *kvt__pend_check(const kvt__pendtab_t *t) {
    uint32_t live = 0, queued = 0, chained = 0, waiting = 0, waited_for = 0;
    for (uint32_t i = 0; i < t->cap; i++) {
        const kvt__pend_t *e = &t->e[i];
        if (e->state == PEND_FREE) continue;
        live++;
        queued += e->state == PEND_QUEUED;
        waiting += e->state == PEND_WAITING;
        waited_for += e->waiter != PEND_NONE;
        if (e->waiter != PEND_NONE && (e->waiter >= t->cap || t->e[e->waiter].state != PEND_WAITING))
            return "a move's waiter is not waiting";
    }
    for (uint32_t b = 0; b < t->nb; b++)
        for (uint32_t i = t->bucket[b]; i != PEND_NONE; i = t->e[i].next) {
            if (++chained > live || t->e[i].state == PEND_FREE) return "a bucket chains a free move";
            if (bucket_of(t, t->e[i].m.group, t->e[i].m.dst_tier, t->e[i].m.key) != b)
                return "a move is in another bucket";
        }
    for (uint32_t k = 0; k < t->qn; k++)
        if (t->e[t->queue[(t->qhead + k) % t->cap]].state != PEND_QUEUED) return "the ring holds a move not queued";
    if (live != t->live || chained != live) return "the count of moves outstanding is wrong";
    if (queued != t->qn) return "the count of moves to hand out is wrong";
    if (waiting != waited_for) return "a move waits for no move (or two for one)";
    return NULL;
}
