/* The ghost: hashes of pages that recently left the cache, so that a page
 * coming back can be recognised as seen before. Semantically a FIFO of the
 * last `cap` keys added (a key taken out, or added again, leaves its old
 * place); the question it answers is membership, and ARC also asks how many
 * keys it holds (`live`).
 *
 * Instead of a ring of keys and an index into it, a key's age is its add
 * number: a key is remembered while at most `cap` keys were added since it
 * was (itself included), so the FIFO's end needs no bookkeeping at all. Keys
 * live in a cuckoo table of buckets of one cache line, 8 entries of (32-bit
 * fingerprint, 32-bit add number); a key has two buckets, b1 from its hash
 * and b2 = (h(fingerprint) - b1) mod buckets, so an entry can move between
 * its two knowing only its fingerprint:
 *
 *   bucket b:  [fp|seq][fp|seq][0][fp|seq] ... 8 entries, 64 bytes
 *   entry live  <=>  fp matches and  now - seq <= cap      (now: adds so far)
 *
 * A lookup reads both lines (both loads issued at once, so it costs about one
 * miss). An add prefetches its lines and goes in 16 adds later (a ring of
 * pending adds), so that an eviction round's adds overlap their misses; any
 * read applies the ring first. An add takes a free or expired entry of either
 * bucket; with both full of live keys it moves a live key to its other bucket
 * (cuckoo), at most 256 moves; the table is sized for 7 keys a bucket when
 * full (87.5 %, well under the ~98 % where two-choice 8-way cuckoo tables
 * start to fail), where that always succeeds in practice (a failure forgets
 * the oldest key early, counted in `overflows`, and is the one way this
 * differs from an exact FIFO). `live` is exact: a bitmap over the last `cap`
 * add numbers marks those taken out (or replaced, or forgotten early) while in
 * the window, so live = keys added in the window - marks.
 *
 * A false "present" needs the fingerprint and one of two bucket numbers to
 * match, ~50 bits of a 64-bit hash: about one in 10^9 lookups. Add numbers
 * are 32 bits; a sweep every 2^30 adds clears expired entries, so no stored
 * number is ever 2^31 adds old (cap <= 2^29).
 *
 * Memory: a bucket (64 bytes) per 7 keys, 9.1 bytes a key, on huge pages
 * (every access is random: 4 KiB pages would miss the TLB too), and one bit
 * per key of the window; the ring-and-index ghost it replaced took 24-40.
 * Every operation reads two cache lines in parallel; O(1) expected.
 */
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "cache-int.h"
#include "kvtier/error.h"
#include "../core/mem-int.h"

#define WAYS 8
#define KEYS_PER_BUCKET 7 /* the table's load when full: 7 of 8 entries */
#define GHOST_CAP_MAX (1u << 29)
#define SWEEP_EVERY (1ull << 30)
#define KICKS_MAX 256
#define ALIGN (2u << 20) /* a huge page */

static inline uint64_t mix(uint64_t k) {
    k ^= k >> 29;
    k *= 0xbf58476d1ce4e5b9ull;
    return k ^ (k >> 32);
}
static inline uint32_t fp_of(uint64_t key) { return (uint32_t)(key >> 32) | 1u; } /* never 0: 0 is an empty entry */
static inline uint64_t *bucket(const kvt__ghost_t *g, size_t b) { return g->table + b * WAYS; }
/* x's place in [0, nb): the high half of x * nb (no division, any nb). */
static inline size_t reduce(uint64_t x, size_t nb) { return (size_t)(((unsigned __int128)x * nb) >> 64); }
static inline size_t b1_of(const kvt__ghost_t *g, uint64_t key) { return reduce(mix(key), g->nb); }
/* The other bucket of a fingerprint in bucket b: (h(fp) - b) mod nb, an
 * involution (alt(alt(b)) = b), so a key moved by the cuckoo can go back. */
static inline size_t alt_of(const kvt__ghost_t *g, size_t b, uint32_t fp) {
    size_t h = reduce(mix(fp * 0x9e3779b97f4a7c15ull), g->nb);
    return h >= b ? h - b : h + g->nb - b;
}
/* Adds since e was added (>= 1 between adds); e is remembered while that is <= cap. */
static inline uint32_t age_of(const kvt__ghost_t *g, uint64_t e) { return (uint32_t)g->now - (uint32_t)e; }
static inline bool live(const kvt__ghost_t *g, uint64_t e) { return e != 0 && age_of(g, e) - 1u < g->cap; }

/* The table's alignment: a huge page for a table of 2 MiB or more, a cache line otherwise. */
static size_t align_of(size_t bytes) { return bytes >= ALIGN ? ALIGN : 64; }

int kvt__ghost_init(kvt__ghost_t *g, size_t cap) {
    memset(g, 0, sizeof(*g));
    if (cap == 0) return KVT_OK;
    if (cap > GHOST_CAP_MAX) cap = GHOST_CAP_MAX;
    size_t nb = (cap + KEYS_PER_BUCKET - 1) / KEYS_PER_BUCKET;
    if (nb < 2) nb = 2;
    g->cap = cap;
    g->nb = nb; /* set first: kvt__ghost_fini frees by these sizes */
    size_t bytes = nb * WAYS * sizeof(uint64_t), align = align_of(bytes);
    g->raw = kvt__malloc(bytes + align);
    g->taken = kvt__calloc((cap + 63) / 64, sizeof(uint64_t));
    if (g->raw == NULL || g->taken == NULL) {
        kvt__ghost_fini(g);
        return KVT_ENOMEM;
    }
    /* one bucket, one cache line; a large table on huge pages (each lookup is a random access: with
     * 4 KiB pages it would miss the TLB too), asked for before the memset touches it */
    g->table = (uint64_t *)(((uintptr_t)g->raw + align - 1) & ~(uintptr_t)(align - 1));
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (bytes >= ALIGN) (void)madvise(g->table, bytes, MADV_HUGEPAGE);
#endif
    memset(g->table, 0, bytes);
    return KVT_OK;
}

void kvt__ghost_fini(kvt__ghost_t *g) {
    if (g->cap) {
        size_t bytes = g->nb * WAYS * sizeof(uint64_t);
        kvt__free(g->raw, bytes + align_of(bytes));
        kvt__free(g->taken, (g->cap + 63) / 64 * sizeof(uint64_t));
    }
    memset(g, 0, sizeof(*g));
}

/* Marks live entry e as gone from the window (taken, replaced or forgotten early). */
static inline void mark_taken(kvt__ghost_t *g, uint64_t e) {
    uint32_t age = age_of(g, e); /* in [0, cap] (0: the key being added): its add number is now - age, its bit (pos - age) mod cap */
    uint64_t bit = g->pos >= age ? g->pos - age : g->pos + g->cap - age;
    g->taken[bit / 64] |= 1ull << (bit % 64);
    g->marks++;
}

static inline void count_live(kvt__ghost_t *g) { g->live = (g->now < g->cap ? g->now : g->cap) - g->marks; }

/* The live entry of fingerprint fp in buckets b1, b2 (a key's), or NULL. */
static uint64_t *find_in(const kvt__ghost_t *g, uint32_t fp, size_t b1, size_t b2) {
    uint64_t *x = bucket(g, b1), *y = bucket(g, b2);
    __builtin_prefetch(y); /* the two misses overlap */
    for (int w = 0; w < WAYS; w++)
        if ((uint32_t)(x[w] >> 32) == fp && live(g, x[w])) return &x[w];
    for (int w = 0; w < WAYS; w++)
        if ((uint32_t)(y[w] >> 32) == fp && live(g, y[w])) return &y[w];
    return NULL;
}

/* The live entry of key, or NULL. */
static uint64_t *find(const kvt__ghost_t *g, uint64_t key) {
    uint32_t fp = fp_of(key);
    size_t b1 = b1_of(g, key);
    return find_in(g, fp, b1, alt_of(g, b1, fp));
}

static void add_now(kvt__ghost_t *g, uint64_t key);

/* Makes the oldest queued add. */
static void apply_oldest(kvt__ghost_t *g) {
    add_now(g, g->pend[g->head]);
    g->head = (g->head + 1) % KVT__GHOST_PEND;
    g->npend--;
}

/* Applies the adds queued by kvt__ghost_add, in order. Reads of the ghost
 * (has, take, live) call it first, so the queue is invisible but for speed:
 * the same calls give the same answers. (It changes the representation, not
 * what the ghost holds: hence the casts from const in the readers.) */
static void flush(kvt__ghost_t *g) {
    while (g->npend) apply_oldest(g);
}

bool kvt__ghost_has(const kvt__ghost_t *g, uint64_t key) {
    if (g->cap == 0) return false;
    if (g->npend) flush((kvt__ghost_t *)g);
    return find(g, key) != NULL;
}

size_t kvt__ghost_live(const kvt__ghost_t *g) {
    if (g->npend) flush((kvt__ghost_t *)g);
    return g->live;
}

bool kvt__ghost_take(kvt__ghost_t *g, uint64_t key) {
    if (g->cap == 0) return false;
    if (g->npend) flush(g);
    uint64_t *e = find(g, key);
    if (e == NULL) return false;
    mark_taken(g, *e);
    *e = 0;
    count_live(g);
    return true;
}

/* An entry this add may take: empty, or expired once this add counts. */
static inline bool reusable(const kvt__ghost_t *g, uint64_t e) { return e == 0 || age_of(g, e) >= g->cap; }

/* Clears every expired entry, so that no stored add number gets old enough
 * to alias (one pass over the table per 2^30 adds). */
static void sweep(kvt__ghost_t *g) {
    for (size_t i = 0; i < g->nb * WAYS; i++)
        if (g->table[i] && !live(g, g->table[i])) g->table[i] = 0;
}

/* A free or expired entry of bucket b, or NULL. */
static uint64_t *room_in(const kvt__ghost_t *g, size_t b) {
    uint64_t *x = bucket(g, b);
    for (int w = 0; w < WAYS; w++)
        if (reusable(g, x[w])) return &x[w];
    return NULL;
}

void kvt__ghost_prefetch(const kvt__ghost_t *g, uint64_t key) {
    if (g->cap == 0) return;
    size_t b1 = b1_of(g, key);
    __builtin_prefetch(bucket(g, b1));
    __builtin_prefetch(bucket(g, alt_of(g, b1, fp_of(key))));
}

/* Queues the add: the key's two buckets are prefetched now and the add is
 * made KVT__GHOST_PEND adds later (a ring: each add goes in as a new one
 * comes, so every key's lines had as long to arrive), or when the ghost is
 * next read, so that the cache misses of a run of adds (an eviction round's
 * pages) overlap. */
void kvt__ghost_add(kvt__ghost_t *g, uint64_t key) {
    if (g->cap == 0) return;
    size_t b1 = b1_of(g, key);
    __builtin_prefetch(bucket(g, b1), 1);
    __builtin_prefetch(bucket(g, alt_of(g, b1, fp_of(key))), 1);
    if (g->npend == KVT__GHOST_PEND) apply_oldest(g); /* prefetched KVT__GHOST_PEND adds ago */
    g->pend[(g->head + g->npend++) % KVT__GHOST_PEND] = key;
}

static void add_now(kvt__ghost_t *g, uint64_t key) {
    uint32_t fp = fp_of(key);
    size_t b1 = b1_of(g, key), b2 = alt_of(g, b1, fp);
    uint64_t *old = find_in(g, fp, b1, b2);
    if (old) { /* a newer copy replaces the older one */
        mark_taken(g, *old);
        *old = 0;
    }
    /* add number now - cap leaves the window with this add (its bit is the new key's) */
    if (g->now >= g->cap) {
        uint64_t bit = g->pos;
        if (g->taken[bit / 64] & (1ull << (bit % 64))) {
            g->taken[bit / 64] &= ~(1ull << (bit % 64));
            g->marks--;
        }
    }
    uint64_t carry = (uint64_t)fp << 32 | (uint32_t)g->now;
    uint64_t *slot = room_in(g, b1);
    if (!slot) slot = room_in(g, b2);
    if (slot) {
        *slot = carry;
    } else { /* both full of live keys: cuckoo moves, each key to its other bucket */
        size_t cur = b1;
        for (unsigned k = 0; k < KICKS_MAX && carry; k++) {
            uint64_t *x = &bucket(g, cur)[(k * 3 + (uint32_t)g->now) % WAYS];
            uint64_t moved = *x; /* live: cur had no room */
            *x = carry;
            carry = moved;
            cur = alt_of(g, cur, (uint32_t)(moved >> 32));
            if ((slot = room_in(g, cur)) != NULL) {
                *slot = carry;
                carry = 0;
            }
        }
        if (carry) { /* no room within the moves: the key left in hand is forgotten early */
            mark_taken(g, carry);
            g->overflows++;
        }
    }
    g->now++;
    if (++g->pos == g->cap) g->pos = 0;
    count_live(g);
    if (g->now % SWEEP_EVERY == 0) sweep(g);
}
