/* The independent model of the keyed page cache: plain arrays indexed by a
 * small key number (state, score, pins, page of each key), eviction by a
 * linear scan for the smallest (score, hi, lo), and the extent allocator's
 * page rule from the allocator tests' brute-force model. It follows
 * kvtier/keyed.h's text, not src/keyed; with two classes (class_bit, the
 * hybrid cache's, keyed-int.h's text) the scan is over the class the target
 * picks. Under ARC (cfg.policy KVT_KEYED_ARC) the order is vLLM's ARC policy
 * written out again: T1, T2, B1 and B2 as arrays of key numbers, least
 * recent first, and the target. */
#ifndef KVTIER_TESTS_KEYED_MODEL_H
#define KVTIER_TESTS_KEYED_MODEL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier/error.h"
#include "kvtier/keyed.h"
#include "unit/alloc/model.h"

#define KM_KEYS 64
enum { KM_ABSENT = 0, KM_PENDING = 1, KM_READY = 2 };

typedef struct km {
    uint64_t pages, room;
    int events;
    size_t nk; /* keys 0..nk) */
    kvt_key128_t key[KM_KEYS];
    int state[KM_KEYS];
    uint64_t score[KM_KEYS];
    uint32_t pins[KM_KEYS];
    uint32_t page[KM_KEYS];
    model_t al;      /* the allocator's free pages */
    uint32_t *loose; /* pages of failed stores, in order */
    size_t nloose;
    kvt_keyed_event_t *ev; /* events not yet taken */
    size_t nev;
    kvt_keyed_stats_t st; /* the counters; gauges are computed */
    uint64_t class_bit;   /* two classes: a score with this bit is class 1 */
    double target0;       /* class 0 goes first while it holds more keys than this */
    size_t cap1;          /* two classes: a touch leaving more class-1 keys demotes the first (SIZE_MAX: none) */
    uint64_t demoted;     /* keys the cap moved to class 0 */
    int arc;              /* vLLM's ARC: */
    size_t t[2][KM_KEYS], nt[2]; /* T1 and T2, least recent first */
    size_t b[2][KM_KEYS + 1], nb[2]; /* B1 and B2 (room for one past `pages` before the trim) */
    double target;
} km_t;

/* ---- ARC's lists ---- */

static inline size_t km_find(const size_t *list, size_t n, size_t k) {
    for (size_t i = 0; i < n; i++)
        if (list[i] == k) return i;
    return SIZE_MAX;
}

static inline int km_take_out(size_t *list, size_t *n, size_t k) { /* true when it was there */
    size_t i = km_find(list, *n, k);
    if (i == SIZE_MAX) return 0;
    memmove(list + i, list + i + 1, (*n - i - 1) * sizeof(*list));
    (*n)--;
    return 1;
}

static inline void km_append(size_t *list, size_t *n, size_t k) { list[(*n)++] = k; }

/* vLLM's dict.move_to_end / t[key] = chunk: k (taken out if there) at the end. */
static inline void km_to_end(size_t *list, size_t *n, size_t k) {
    km_take_out(list, n, k);
    km_append(list, n, k);
}

/* _adapt_to_ghost_hit. */
static inline void km_arc_adapt(km_t *m, size_t k) {
    for (int g = 0; g < 2; g++) {
        if (km_find(m->b[g], m->nb[g], k) == SIZE_MAX) continue;
        double ratio = (double)m->nb[!g] / (double)m->nb[g], delta = ratio > 1 ? ratio : 1;
        if (g == 0) m->target = m->target + delta < (double)m->pages ? m->target + delta : (double)m->pages;
        else m->target = m->target - delta > 0 ? m->target - delta : 0;
        km_to_end(m->b[g], &m->nb[g], k);
        return;
    }
}

static inline void km_arc_touch(km_t *m, const size_t *ks, size_t n) {
    for (size_t j = n; j-- > 0;) {
        size_t k = ks[j];
        if (km_take_out(m->t[0], &m->nt[0], k)) km_append(m->t[m->state[k] == KM_READY], &m->nt[m->state[k] == KM_READY], k);
        else if (km_find(m->t[1], m->nt[1], k) != SIZE_MAX) km_to_end(m->t[1], &m->nt[1], k);
        else km_arc_adapt(m, k);
    }
}

static inline void km_arc_missed(km_t *m, const size_t *ks, size_t n) {
    for (size_t j = n; j-- > 0;) km_arc_adapt(m, ks[j]);
}

static inline void km_arc_finish(km_t *m, const size_t *ks, const uint8_t *flags, size_t n) {
    for (size_t j = n; j-- > 0;) {
        size_t k = ks[j];
        int in1 = km_find(m->t[0], m->nt[0], k) != SIZE_MAX, in2 = km_find(m->t[1], m->nt[1], k) != SIZE_MAX;
        if (flags[j] == KVT_KEYED_ARC_STORED) {
            if (in1) km_to_end(m->t[0], &m->nt[0], k);
            else if (in2) km_to_end(m->t[1], &m->nt[1], k);
        } else if (flags[j] == KVT_KEYED_ARC_REUSED && (in1 || in2)) {
            km_take_out(m->t[0], &m->nt[0], k);
            km_to_end(m->t[1], &m->nt[1], k);
        }
    }
}

/* A key taken out of the cache (remove, a failed store, reset) leaves its list. */
static inline void km_arc_gone(km_t *m, size_t k) {
    if (m->arc && !km_take_out(m->t[0], &m->nt[0], k)) km_take_out(m->t[1], &m->nt[1], k);
}

/* Key i: hi from three values (two far apart, so that the unsigned order
 * matters), lo scrambled, so ties on score are broken by hi, then lo. */
static inline kvt_key128_t km_key_of(size_t i) {
    static const uint64_t his[3] = {0, 5, 0xF000000000000000ull};
    return (kvt_key128_t){his[i % 3], (uint64_t)(i + 1) * 0x9E3779B97F4A7C15ull};
}

static inline void km_init(km_t *m, uint64_t pages, double free_room, int events, size_t nk) {
    memset(m, 0, sizeof(*m));
    m->pages = pages;
    double r = free_room * (double)pages;
    m->room = (uint64_t)r + ((double)(uint64_t)r < r);
    m->events = events;
    m->nk = nk;
    m->cap1 = SIZE_MAX;
    for (size_t i = 0; i < nk; i++) m->key[i] = km_key_of(i);
    model_init(&m->al, pages);
    m->loose = malloc((pages + 1) * sizeof(uint32_t));
    m->ev = malloc(64 * sizeof(kvt_keyed_event_t));
}

static inline void km_fini(km_t *m) {
    model_fini(&m->al);
    free(m->loose);
    free(m->ev);
}

static inline void km_event(km_t *m, size_t k, uint32_t kind, uint32_t why) {
    if (!m->events) return;
    if ((m->nev & (m->nev - 1)) == 0 && m->nev >= 64) m->ev = realloc(m->ev, 2 * m->nev * sizeof(*m->ev));
    m->ev[m->nev++] = (kvt_keyed_event_t){m->key[k], kind, why};
}

static inline int km_less(const km_t *m, size_t a, size_t b) {
    if (m->score[a] != m->score[b]) return m->score[a] < m->score[b];
    if (m->key[a].hi != m->key[b].hi) return m->key[a].hi < m->key[b].hi;
    return m->key[a].lo < m->key[b].lo;
}

static inline size_t km_present(const km_t *m) {
    size_t n = 0;
    for (size_t k = 0; k < m->nk; k++) n += m->state[k] != KM_ABSENT;
    return n;
}

static inline kvt_keyed_stats_t km_stats(const km_t *m) {
    kvt_keyed_stats_t s = m->st;
    s.size = sizeof(s);
    s.pages = m->pages;
    s.keys = km_present(m);
    s.free_pages = m->pages - s.keys;
    s.pending = s.pinned = 0;
    for (size_t k = 0; k < m->nk; k++) {
        s.pending += m->state[k] == KM_PENDING;
        s.pinned += m->state[k] == KM_READY && m->pins[k] > 0;
    }
    return s;
}

static inline int km_class(const km_t *m, size_t k) {
    if (m->arc) return km_find(m->t[1], m->nt[1], k) != SIZE_MAX;
    return (m->score[k] & m->class_bit) != 0;
}

/* The smallest evictable key of class cls (-1: any) not yet chosen nor
 * protected, or SIZE_MAX. */
static inline size_t km_min_of(const km_t *m, const uint8_t *skip, int cls) {
    size_t best = SIZE_MAX;
    for (size_t k = 0; k < m->nk; k++)
        if (m->state[k] == KM_READY && m->pins[k] == 0 && !skip[k] && (cls < 0 || km_class(m, k) == cls) &&
            (best == SIZE_MAX || km_less(m, k, best)))
            best = k;
    return best;
}

static inline size_t km_min_evictable(const km_t *m, const uint8_t *skip) { return km_min_of(m, skip, -1); }

/* The present keys of class 0. */
static inline size_t km_class0(const km_t *m) {
    if (m->arc) return m->nt[0];
    size_t n = 0;
    for (size_t k = 0; k < m->nk; k++) n += m->state[k] != KM_ABSENT && !km_class(m, k);
    return n;
}

/* The next victim: one class (the smallest evictable), or with two the
 * class the target picks while cnt0 class-0 keys are present, else the
 * other. */
static inline size_t km_next_victim(const km_t *m, const uint8_t *skip, size_t cnt0) {
    if (m->arc) { /* vLLM's evict: T1 while it holds int(target), then T2, then T1 */
        int order[3] = {cnt0 >= (size_t)m->target ? 0 : -1, 1, 0};
        for (int o = 0; o < 3; o++) {
            if (order[o] < 0) continue;
            const size_t *l = m->t[order[o]];
            for (size_t i = 0; i < m->nt[order[o]]; i++)
                if (m->state[l[i]] == KM_READY && m->pins[l[i]] == 0 && !skip[l[i]]) return l[i];
        }
        return SIZE_MAX;
    }
    if (!m->class_bit) return km_min_evictable(m, skip);
    int want = (double)cnt0 <= m->target0;
    size_t k = km_min_of(m, skip, want);
    return k != SIZE_MAX ? k : km_min_of(m, skip, !want);
}

/* prepare_store over key numbers; out: pages[n], victims[*nv]. */
static inline int km_prepare(km_t *m, const size_t *ks, const uint64_t *sc, size_t n, const size_t *prot,
                             size_t np, size_t cap, uint64_t *pages, size_t *victims, size_t *nv) {
    size_t newk[KM_KEYS], newpos[64], nnew = 0;
    uint8_t skip[KM_KEYS] = {0};
    *nv = 0;
    for (size_t i = 0; i < n; i++) {
        pages[i] = UINT64_MAX;
        newpos[i] = SIZE_MAX;
        int seen = m->state[ks[i]] != KM_ABSENT;
        for (size_t j = 0; j < nnew && !seen; j++) seen = newk[j] == ks[i];
        if (!seen) newpos[i] = nnew, newk[nnew++] = ks[i];
    }
    size_t freep = m->pages - km_present(m), need = nnew > freep ? nnew - freep : 0, avail = 0;
    for (size_t j = 0; j < np; j++) skip[prot[j]] = 1;
    for (size_t k = 0; k < m->nk; k++) avail += m->state[k] == KM_READY && m->pins[k] == 0 && !skip[k];
    if (need > avail) {
        m->st.store_refusals++;
        return KVT_ENOSPC;
    }
    size_t kk = need == 0 ? 0 : need + (m->room < avail - need ? m->room : avail - need);
    if (kk > cap) return KVT_ERANGE;
    uint32_t *got = malloc((m->nloose + kk + nnew + 1) * sizeof(uint32_t));
    size_t ng = 0, cnt0 = km_class0(m);
    for (size_t j = 0; j < m->nloose; j++) got[ng++] = m->loose[j];
    for (size_t v = 0; v < kk; v++) {
        size_t k = km_next_victim(m, skip, cnt0);
        cnt0 -= !km_class(m, k);
        victims[v] = k;
        skip[k] = 1;
        got[ng++] = m->page[k];
    }
    if (nnew > ng) { /* the rest from one reserve, runs in order */
        kvt_run_t *runs = malloc((nnew - ng) * sizeof(kvt_run_t));
        size_t nr = 0;
        if (model_reserve(&m->al, nnew - ng, runs, nnew - ng, &nr) != KVT_OK) abort();
        for (size_t r = 0; r < nr; r++)
            for (uint32_t q = 0; q < runs[r].len; q++) got[ng++] = runs[r].start + q;
        free(runs);
    } else if (ng > nnew) { /* the recycled pages not taken go back */
        kvt_run_t *runs = malloc((ng - nnew) * sizeof(kvt_run_t));
        for (size_t j = nnew; j < ng; j++) runs[j - nnew] = (kvt_run_t){got[j], 1};
        if (model_free(&m->al, runs, ng - nnew) != KVT_OK) abort();
        free(runs);
    }
    for (size_t v = 0; m->arc && v < kk; v++) { /* to their ghosts, which then forget past `pages` */
        int g = km_class(m, victims[v]);
        km_arc_gone(m, victims[v]);
        km_append(m->b[g], &m->nb[g], victims[v]);
        if (m->nb[g] > m->pages) km_take_out(m->b[g], &m->nb[g], m->b[g][0]);
    }
    for (size_t v = 0; v < kk; v++) {
        m->state[victims[v]] = KM_ABSENT;
        km_event(m, victims[v], KVT_KEYED_REMOVED, 0);
    }
    for (size_t i = 0; i < n; i++) {
        if (newpos[i] == SIZE_MAX) continue;
        size_t k = ks[i];
        m->state[k] = KM_PENDING;
        m->score[k] = sc[i];
        m->pins[k] = 0;
        m->page[k] = got[newpos[i]];
        pages[i] = got[newpos[i]];
        if (m->arc) {
            km_append(m->t[0], &m->nt[0], k);
            if (!km_take_out(m->b[0], &m->nb[0], k)) km_take_out(m->b[1], &m->nb[1], k);
        }
    }
    free(got);
    m->nloose = 0;
    m->st.stores_prepared += nnew;
    m->st.evictions += kk;
    *nv = kk;
    return KVT_OK;
}

static inline void km_complete(km_t *m, const size_t *ks, size_t n, int ok) {
    for (size_t i = 0; i < n; i++) {
        size_t k = ks[i];
        if (m->state[k] != KM_PENDING) continue;
        if (ok) {
            m->state[k] = KM_READY;
            km_event(m, k, KVT_KEYED_STORED, 0);
            m->st.stores_completed++;
        } else {
            m->state[k] = KM_ABSENT;
            km_arc_gone(m, k);
            m->loose[m->nloose++] = m->page[k];
            km_event(m, k, KVT_KEYED_REMOVED, 1);
            m->st.stores_failed++;
        }
    }
}

/* keyed.h: ready, unpinned keys go (their pages to the loose list, as a
 * failed store's), the rest are skipped; the event says why (3 removed, 0
 * evicted). */
static inline size_t km_drop(km_t *m, const size_t *ks, size_t n, uint32_t why) {
    size_t gone = 0;
    for (size_t i = 0; i < n; i++) {
        size_t k = ks[i];
        if (m->state[k] != KM_READY || m->pins[k] > 0) continue;
        m->state[k] = KM_ABSENT;
        km_arc_gone(m, k);
        m->loose[m->nloose++] = m->page[k];
        km_event(m, k, KVT_KEYED_REMOVED, why);
        gone++;
    }
    return gone;
}

static inline size_t km_remove(km_t *m, const size_t *ks, size_t n) {
    size_t gone = km_drop(m, ks, n, 3);
    m->st.removed += gone;
    return gone;
}

/* The first k victims in eviction order (the rounds of a caller's
 * free-room planning); returns how many. */
static inline size_t km_next_victims(const km_t *m, size_t k, size_t *out) {
    uint8_t skip[KM_KEYS] = {0};
    size_t n = 0, cnt0 = km_class0(m);
    for (size_t v; n < k && (v = km_next_victim(m, skip, cnt0)) != SIZE_MAX; n++) {
        cnt0 -= !km_class(m, v);
        skip[v] = 1;
        out[n] = v;
    }
    return n;
}

/* km_remove, counted as evictions, with eviction events. */
static inline size_t km_evict(km_t *m, const size_t *ks, size_t n) {
    size_t gone = km_drop(m, ks, n, 0);
    m->st.evictions += gone;
    return gone;
}

static inline int km_pin(km_t *m, const size_t *ks, size_t n, uint64_t *pages) {
    for (size_t i = 0; i < n; i++) {
        if (m->state[ks[i]] == KM_ABSENT) return KVT_ENOENT;
        if (m->state[ks[i]] == KM_PENDING) return KVT_EBUSY;
    }
    for (size_t i = 0; i < n; i++) {
        m->pins[ks[i]]++;
        pages[i] = m->page[ks[i]];
    }
    m->st.loads += n;
    return KVT_OK;
}

static inline int km_unpin(km_t *m, const size_t *ks, size_t n) {
    uint32_t want[KM_KEYS] = {0};
    for (size_t i = 0; i < n; i++)
        if (m->state[ks[i]] != KM_READY || ++want[ks[i]] > m->pins[ks[i]]) return KVT_EINVAL;
    for (size_t i = 0; i < n; i++) m->pins[ks[i]]--;
    return KVT_OK;
}

/* Then, with a class-1 cap (SLRU's protected segment), class 1's smallest
 * evictable keys lose the class bit while it holds more than cap1 keys. */
static inline void km_touch(km_t *m, const size_t *ks, const uint64_t *sc, size_t n) {
    if (m->arc) return; /* (ARC uses no scores) */
    for (size_t i = 0; i < n; i++)
        if (m->state[ks[i]] != KM_ABSENT) m->score[ks[i]] = sc[i];
    size_t cnt1 = 0;
    for (size_t k = 0; k < m->nk; k++) cnt1 += m->state[k] != KM_ABSENT && km_class(m, k);
    uint8_t none[KM_KEYS] = {0};
    for (size_t k; cnt1 > m->cap1 && (k = km_min_of(m, none, 1)) != SIZE_MAX; cnt1--, m->demoted++)
        m->score[k] &= ~m->class_bit;
}

static inline int km_reset(km_t *m) {
    for (size_t k = 0; k < m->nk; k++)
        if (m->state[k] == KM_PENDING || (m->state[k] == KM_READY && m->pins[k] > 0)) return KVT_EBUSY;
    kvt_run_t *runs = malloc((m->nk + m->nloose + 1) * sizeof(kvt_run_t));
    size_t nr = 0;
    uint8_t skip[KM_KEYS] = {0};
    size_t cnt0 = km_class0(m);
    for (size_t k; (k = km_next_victim(m, skip, cnt0)) != SIZE_MAX;) {
        cnt0 -= !km_class(m, k);
        skip[k] = 1;
        m->state[k] = KM_ABSENT;
        runs[nr++] = (kvt_run_t){m->page[k], 1};
        km_event(m, k, KVT_KEYED_REMOVED, 2);
    }
    for (size_t j = 0; j < m->nloose; j++) runs[nr++] = (kvt_run_t){m->loose[j], 1};
    if (nr > 0 && model_free(&m->al, runs, nr) != KVT_OK) abort();
    free(runs);
    m->nloose = 0;
    m->nt[0] = m->nt[1] = m->nb[0] = m->nb[1] = 0;
    m->target = 0;
    return KVT_OK;
}

static inline int km_lookup(km_t *m, size_t k) {
    m->st.lookups++;
    if (m->state[k] == KM_READY) m->st.hits++;
    return m->state[k] == KM_READY ? KVT_KEYED_HIT : m->state[k] == KM_PENDING ? KVT_KEYED_PENDING : KVT_KEYED_MISS;
}

/* Takes up to cap events, oldest first. */
static inline size_t km_take(km_t *m, kvt_keyed_event_t *out, size_t cap) {
    size_t k = cap < m->nev ? cap : m->nev;
    memcpy(out, m->ev, k * sizeof(*out));
    memmove(m->ev, m->ev + k, (m->nev - k) * sizeof(*m->ev));
    m->nev -= k;
    return k;
}

#endif
