/* The ghost: keys of pages that recently left the cache, so that a page
 * coming back can be recognised as seen before. Semantically a FIFO window of
 * the last ~cap pages added (an entry taken out, or added again, leaves its
 * old place); the question it answers is membership, and ARC also asks how
 * many pages it holds (`live`).
 *
 * An entry is a page (a ghost of pages: s2lru's, the L3 tier's own puts) or,
 * in a ghost of runs (arc's), up to run_max consecutive pages of a node that
 * left together: keyed by its first page's key, with its length and a check
 * of 11 bits of its last page's key beside it (aux, an array of 16 bits an
 * entry apart from the table, touched only by such ghosts). Page keys are
 * chained over the path (radix-int.h), so the walk of a request coming back
 * that finds the run at its page k and whose page k + length - 1 passes the
 * check holds the whole run (but for one chance in 2048 that a request that
 * diverged inside the run passes): it takes it in one lookup, not one a page.
 *
 *        a node's tail leaves:  pages 40 .. 75 of the sequence
 *        entries (run_max 16):  [40 .. 55] [56 .. 71] [72 .. 75], added last first
 *        a request back:        its walk finds [40 ..] at page 40, checks page 55's key,
 *                               takes 16 pages; then [56 ..] at 56, and so on
 *
 * So arc's ghosts make an add a run and a lookup a run where ghosts of
 * pages would make one a page (docs/policies.md counts both on the default
 * replay). The price: a request
 * that ends or diverges inside a run takes none of it, where a ghost of
 * pages would take its leading pages (docs/policies.md: the hit rates that
 * moves).
 *
 * Age is counted in epochs, a clock instead of a FIFO of full keys. Pages
 * added are numbered from 0 and page i falls in epoch i / len; after n pages,
 * an entry whose last page was page i is remembered while (n - 1) / len -
 * i / len < E, with E = min(112, cap) epochs of len = 2 cap / (2E - 1) pages
 * each (rounded; 1 when cap <= 112). So a page is remembered for between
 * (E - 1) len + 1 and E len pages added (itself included), cap on average:
 * the window forgets its oldest entries an epoch (~cap / 112 pages) at a
 * time, and for cap <= 112 it is the exact FIFO of pages. A run is added
 * as its pages, the epochs it crosses begun as it goes, and keeps the epoch
 * of its last.
 *
 * Keys live in a cuckoo table of buckets of one cache line, 16 entries of 32
 * bits: a 24-bit fingerprint and the tag of the epoch of its add (the
 * epoch's number mod 256). A key has two buckets, b1 from its hash and
 * b2 = (h(fingerprint) - b1) mod buckets, so that an entry can move between
 * its two knowing only its fingerprint. A bucket keeps its entries by field,
 * so that one SSE2 instruction reads all 16 tags:
 *
 *   bucket b:  tag[16] (8 bits) | fingerprint low[16] (16 bits) | high[16] (8 bits)
 *   entry w live  <=>  low[w] != 0 and (tag now - tag[w]) mod 256 < E
 *
 * One look at a bucket compares all 16 entries in a dozen instructions.
 * As each epoch begins, its oldest leaves the window and 1/128 of the table
 * is swept of expired entries, so that no entry is still there 112 + 128 =
 * 240 epochs after its own, before its tag comes round again (256). `live` is
 * exact: a count per tag of the live pages holding it, the leaving epoch's
 * count subtracted as it leaves (and of entries, `entries`, which the table's
 * growth goes by).
 *
 * A key goes to its first bucket b1 while that has room; only when b1 is full
 * does it (or a key the cuckoo moves out of b1) go to the second, and b1's
 * spill bit is set (a bitmap, a bit a bucket: 16 KiB for 1.8 M keys, in the
 * caches). While b1's bit is clear its keys are all in b1, so a lookup or an
 * add reads one line; with the bit set, both (the two loads issued at once,
 * about one miss). Nothing clears a bit, so the load a table is sized for
 * sets how many read two lines: sized for 12 keys a bucket, few of `arc`'s
 * ghost-0 buckets have spilled by the end of the page-16 replay, many more
 * at 14; at 10 almost none spill, for more memory (docs/policies.md).
 * In a long run nearly every bucket spills in the end; an exact count of
 * the keys away from their b1, instead of the bit, costs more bookkeeping
 * than the lines it saves. An add prefetches its lines
 * and goes in 16 adds later (a ring of pending adds), so that an eviction round's
 * adds overlap their misses; any read applies the ring first. An add takes a free or expired entry of b1,
 * else of b2; with both full of live keys it moves a live key to its other
 * bucket (cuckoo), at most 256 moves; the table is sized for 12 keys a bucket
 * when full (75 %, far under the ~99 % where two-choice 16-way cuckoo tables
 * start to fail), where that always succeeds in practice (a failure forgets a
 * key early, counted in `overflows`).
 *
 * A table of 4,096 buckets (256 KiB) or more grows as it fills: it starts at
 * a quarter of its size, n0 buckets, and doubles in place when its live
 * entries reach 12 a bucket, twice. At level j a key's bucket is its place among the
 * n0, times 2^j, plus the top j of two "grow bits" of its fingerprint; a
 * doubling sends each entry from bucket b to 2b or 2b + 1 by its next grow
 * bit, a pass down the table with no key needed (grow()). So a ghost that
 * never fills (a short run; a cache larger than its traffic's pages) touches
 * a quarter or a half of the memory, and keeps its lines in fewer caches. A
 * ghost of runs starts at a sixteenth and may double four times
 * (RUN_GROW_LEVELS): sized for a page an entry, it holds ~16 pages an entry
 * at the defaults, so a quarter would be four times the lines it fills; at a
 * sixteenth `arc`'s tables end the default replay below their first doubling
 * (docs/policies.md), and an add on cold caches misses fewer lines. Its grow bits
 * are four, so a full table's chance of a false "present" is 16, not 4, times
 * the one below; one that has not doubled (the defaults') keeps the one below.
 *
 * Fingerprints are 24 bits of the key, odd (a free entry's low part is 0), so
 * a lookup of an absent key at full load answers "present" (a page taken for
 * seen before) with a chance of 2 x 12 x 2^-23 = 2.9e-6 in a table that does
 * not grow. In one that has doubled j times, the entries of a bucket share
 * its j grow bits with the keys looked up there (their place implies them):
 * 2^j x that, 1.1e-5 at full size; less, as a lookup reads the second bucket
 * only where the first has spilled (ghost/false_presents_are_rare counts them).
 *
 * Memory: a bucket (64 bytes) per 12 entries, 5.3 bytes an entry, on huge
 * pages (every access is random: 4 KiB pages would miss the TLB too), plus
 * 2 KiB of counts; a ghost of runs, 2.7 bytes more an entry for aux. The
 * table is sized for cap entries (a run can be one page), reserves its full
 * size and faults in what it uses: arc's ghosts at the defaults, ~16 pages a
 * run, stay in their first quarter. An exact FIFO of (32-bit fingerprint,
 * 32-bit add number) entries with a bit per add would take 9.1 bytes a key:
 * the epoch tags halve the table, and the ghosts' adds and lookups wait on
 * its lines (docs/performance.md, *Where the time goes*).
 */
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "ghost-int.h"
#include "kvtier/error.h"
#include "check-int.h"
#include "mem-int.h"

#define WAYS 16
#define KEYS_PER_BUCKET 12 /* the table's load when full: 12 of 16 entries */
#define EPOCHS 112         /* the window, in epochs (fewer when cap is smaller) */
#define SWEEP_EPOCHS 128   /* the whole table is swept this often: 112 + 128 < 256 tags */
#define GHOST_CAP_MAX (1u << 29) /* so that bucket numbers fit 32 bits */
#define KICKS_MAX 256
#define ALL_WAYS ((1u << WAYS) - 1)
#define GROW_LEVELS 2          /* a large table starts at a quarter of its size and doubles twice ... */
#define RUN_GROW_LEVELS 4      /* (a ghost of runs: at a sixteenth, four times) */
#define GROW_MIN_BUCKETS 4096  /* ... when it is 256 KiB or more (a smaller one is allocated whole) */
#define KEYS_AHEAD_RUNS 4      /* an add of runs fetches the keys of the run this many ahead */
#define CHECK_BITS 11          /* an entry's aux: its run's length - 1 above 11 bits of its last page's key */
#define CHECK_MASK ((1u << CHECK_BITS) - 1)
_Static_assert(KVT__GHOST_RUN_MAX << CHECK_BITS <= 0x10000, "a run's length and check fit 16 bits");

/* A bucket, one cache line, its 16 entries by field: entry w is
 * (hi[w] << 16 | lo[w], tag[w]); lo is odd in a used entry, 0 in a free one.
 * By field, one SSE2 instruction reads 16 tags or 8 fingerprint halves. */
struct kvt__ghost_bucket {
    _Alignas(64) uint8_t tag[WAYS]; /* aligned, so that a copy on the stack loads like the table */
    uint16_t lo[WAYS];
    uint8_t hi[WAYS];
};
typedef struct kvt__ghost_bucket bucket_t;
_Static_assert(sizeof(bucket_t) == 64, "a bucket is a cache line");

/* Spreads a key over the buckets: one multiply, not core/mix-int.h's
 * three-deep finaliser, since a page key's bits are mixed already (its
 * XXH3-64s); this only folds the high bits into the low. */
static inline uint64_t mix(uint64_t k) {
    k ^= k >> 29;
    k *= 0xbf58476d1ce4e5b9ull;
    return k ^ (k >> 32);
}
static inline uint32_t fp_of(uint64_t key) { return (uint32_t)(key >> 40) | 1u; } /* 24 bits, odd: never a free entry's */
static inline bucket_t *bucket(const kvt__ghost_t *g, size_t b) { return g->table + b; }
/* x's place in [0, nb): the high half of x * nb (no division, any nb). */
static inline size_t reduce(uint64_t x, size_t nb) { return (size_t)(((unsigned __int128)x * nb) >> 64); }
/* The fingerprint's bits that a growing table has used so far: at level j,
 * the top j of its `levels` grow bits (bits 1.. of the fingerprint). */
static inline size_t grown_bits(const kvt__ghost_t *g, uint32_t fp) { return ((fp >> 1) & g->grow_mask) >> g->grow_shift; }
/* A key's first bucket: its place among the n0 buckets of level 0, refined
 * by one grow bit a doubling (b at level j is buckets 2b, 2b + 1 at j + 1). */
static inline size_t b1_of(const kvt__ghost_t *g, uint64_t key, uint32_t fp) {
    return (reduce(mix(key), g->n0) << g->level) + grown_bits(g, fp);
}
/* The other bucket of a fingerprint in bucket b: (h(fp) - b) mod nb, an
 * involution (alt(alt(b)) = b), so a key moved by the cuckoo can go back.
 * h doubles with the table, plus twice the grow bit, h' = 2h + 2x: then the
 * pair {b1, b2} becomes {2 b1 + x, 2 b2 + x}, so that an entry moves from b to
 * 2b + x whichever of its two buckets it is in. */
static inline size_t alt_of(const kvt__ghost_t *g, size_t b, uint32_t fp) {
    size_t h = (reduce(mix(fp * 0x9e3779b97f4a7c15ull), g->n0) << g->level) + 2 * grown_bits(g, fp);
    h = h >= g->nb ? h - g->nb : h; /* both terms are below nb */
    return h >= b ? h - b : h + g->nb - b;
}

/* An entry's aux (a ghost of runs): its run's length - 1, and the check,
 * the low CHECK_BITS of its last page's key (a run of one page: of its key).
 * A ghost of pages keeps none: its entries read as aux 0, a page. */
static inline uint16_t aux_of(uint32_t pages, uint64_t last) { return (uint16_t)((pages - 1) << CHECK_BITS | (last & CHECK_MASK)); }
static inline uint32_t pages_in(uint32_t aux) { return (aux >> CHECK_BITS) + 1; }
static inline size_t aux_at(const kvt__ghost_t *g, const bucket_t *x, unsigned w) { return (size_t)(x - g->table) * WAYS + w; }

/* An entry as one word, (aux << 32 | fingerprint << 8 | tag), to move it around. */
static inline uint64_t get(const kvt__ghost_t *g, const bucket_t *x, unsigned w) {
    uint64_t e = ((uint32_t)x->hi[w] << 16 | x->lo[w]) << 8 | x->tag[w];
    return g->aux ? e | (uint64_t)g->aux[aux_at(g, x, w)] << 32 : e;
}
static inline void set(kvt__ghost_t *g, bucket_t *x, unsigned w, uint64_t e) {
    x->tag[w] = (uint8_t)e;
    x->lo[w] = (uint16_t)(e >> 8);
    x->hi[w] = (uint8_t)(e >> 24);
    if (g->aux) g->aux[aux_at(g, x, w)] = (uint16_t)(e >> 32);
}
static inline uint32_t fp_in(uint64_t e) { return (uint32_t)e >> 8; }
static inline uint8_t tag_in(uint64_t e) { return (uint8_t)e; }
static inline uint32_t pages_of(uint64_t e) { return pages_in((uint32_t)(e >> 32)); }

/* What one look at bucket x tells: which of its 16 entries are live (used,
 * and fewer than `epochs` epochs begun since their own), and which of those
 * hold fingerprint fp (bit w: entry w). With SSE2 (every x86-64) that is a
 * dozen instructions for the 16; elsewhere, a plain loop. */
typedef struct {
    unsigned live, match;
} look_t;

/* The used entries of bucket x (live or expired), as a mask. */
static inline unsigned used_in(const bucket_t *x) {
#if defined(__SSE2__)
    const __m128i zero = _mm_setzero_si128();
    __m128i lo0 = _mm_load_si128((const __m128i *)(const void *)x->lo), lo1 = _mm_load_si128((const __m128i *)(const void *)(x->lo + 8));
    return ~(unsigned)_mm_movemask_epi8(_mm_packs_epi16(_mm_cmpeq_epi16(lo0, zero), _mm_cmpeq_epi16(lo1, zero))) & ALL_WAYS;
#else
    unsigned m = 0;
    for (unsigned w = 0; w < WAYS; w++) m |= (unsigned)(x->lo[w] != 0) << w;
    return m;
#endif
}

static inline look_t look(const kvt__ghost_t *g, const bucket_t *x, uint32_t fp) {
#if defined(__SSE2__)
    const __m128i zero = _mm_setzero_si128(), want_lo = _mm_set1_epi16((short)(uint16_t)fp);
    __m128i age = _mm_sub_epi8(_mm_loadu_si128((const __m128i *)(const void *)g->now16), _mm_load_si128((const __m128i *)(const void *)x->tag));
    __m128i last = _mm_loadu_si128((const __m128i *)(const void *)g->last16); /* live: age <= epochs - 1, unsigned */
    __m128i young = _mm_cmpeq_epi8(_mm_min_epu8(age, last), age);
    __m128i lo0 = _mm_load_si128((const __m128i *)(const void *)x->lo), lo1 = _mm_load_si128((const __m128i *)(const void *)(x->lo + 8));
    __m128i used = _mm_andnot_si128(_mm_packs_epi16(_mm_cmpeq_epi16(lo0, zero), _mm_cmpeq_epi16(lo1, zero)), young);
    __m128i same = _mm_and_si128(_mm_packs_epi16(_mm_cmpeq_epi16(lo0, want_lo), _mm_cmpeq_epi16(lo1, want_lo)),
                                 _mm_cmpeq_epi8(_mm_load_si128((const __m128i *)(const void *)x->hi), _mm_set1_epi8((char)(uint8_t)(fp >> 16))));
    return (look_t){(unsigned)_mm_movemask_epi8(used), (unsigned)_mm_movemask_epi8(_mm_and_si128(used, same))};
#else
    look_t l = {0, 0};
    for (unsigned w = 0; w < WAYS; w++) {
        unsigned a = x->lo[w] != 0 && (uint8_t)(g->tag - x->tag[w]) < g->epochs;
        l.live |= a << w;
        l.match |= (a & (((uint32_t)x->hi[w] << 16 | x->lo[w]) == fp)) << w;
    }
    return l;
#endif
}

/* What the table, the spill bits and aux reserve. */
static size_t table_bytes(const kvt__ghost_t *g) { return g->nb_max * sizeof(bucket_t); } /* reserved */
static size_t spill_bytes(const kvt__ghost_t *g) { return (g->nb_max + 63) / 64 * sizeof(uint64_t); }
static size_t aux_bytes(const kvt__ghost_t *g) { return g->nb_max * WAYS * sizeof(uint16_t); }

/* Bucket b's spill bit: set when a key whose first bucket is b goes to its
 * second (b had no room); a doubling gives both halves b's bit, and nothing
 * else clears it. While it is clear, no key of first bucket b is anywhere but in b,
 * so a lookup or an add reads that one line. */
static inline bool spilled(const kvt__ghost_t *g, size_t b) { return g->spill[b / 64] >> (b % 64) & 1; }
static inline void set_spilled(kvt__ghost_t *g, size_t b, bool on) {
    uint64_t bit = 1ull << (b % 64);
    g->spill[b / 64] = on ? g->spill[b / 64] | bit : g->spill[b / 64] & ~bit;
}

int kvt__ghost_init(kvt__ghost_t *g, size_t cap, unsigned run_max) {
    memset(g, 0, sizeof(*g));
    if (cap == 0) return KVT_OK;
    if (cap > GHOST_CAP_MAX) cap = GHOST_CAP_MAX;
    size_t nb = (cap + KEYS_PER_BUCKET - 1) / KEYS_PER_BUCKET; /* for a page an entry, the most there can be */
    if (nb < 2) nb = 2;
    g->cap = cap;
    g->run_max = run_max < 1 ? 1 : run_max > KVT__GHOST_RUN_MAX ? KVT__GHOST_RUN_MAX : run_max;
    g->levels = nb < GROW_MIN_BUCKETS ? 0 : g->run_max > 1 ? RUN_GROW_LEVELS : GROW_LEVELS;
    g->n0 = (nb + (1u << g->levels) - 1) >> g->levels;
    g->nb_max = g->n0 << g->levels; /* set first: kvt__ghost_fini frees by these sizes */
    g->nb = g->n0;
    g->grow_at = g->levels ? KEYS_PER_BUCKET * g->nb : SIZE_MAX;
    g->grow_mask = (1u << g->levels) - 1;
    g->grow_shift = g->levels;
    g->epochs = cap < EPOCHS ? (unsigned)cap : EPOCHS;
    memset(g->last16, (int)(g->epochs - 1), sizeof(g->last16)); /* now16: tag 0 */
    /* len: the window's mean, epochs x len - len / 2, nearest cap (1 when cap <= EPOCHS: the exact FIFO) */
    g->len = cap <= EPOCHS ? 1 : (4 * cap + 2 * EPOCHS - 1) / (2 * (2 * EPOCHS - 1));
    g->sweep_step = (g->nb + SWEEP_EPOCHS - 1) / SWEEP_EPOCHS;
    /* one bucket, one cache line; a large table on huge pages (each lookup is a random access: with
     * 4 KiB pages it would miss the TLB too, and a growing table would fault in 4 KiB at a time). Only
     * level 0's buckets are touched: the rest of the reservation stays unfaulted until the table grows
     * into it. aux, read and written where the table is, the same. */
    g->table = kvt__malloc_huge(table_bytes(g), &g->raw);
    g->spill = kvt__calloc(1, spill_bytes(g));
    if (g->run_max > 1) g->aux = kvt__malloc_huge(aux_bytes(g), &g->aux_raw); /* read only where an entry is used */
    if (g->table == NULL || g->spill == NULL || (g->run_max > 1 && g->aux == NULL)) {
        kvt__ghost_fini(g);
        return KVT_ENOMEM;
    }
    memset(g->table, 0, g->nb * sizeof(bucket_t));
    return KVT_OK;
}

void kvt__ghost_fini(kvt__ghost_t *g) {
    if (g->cap) {
        kvt__free_huge(g->raw, table_bytes(g));
        kvt__free(g->spill, spill_bytes(g));
        kvt__free_huge(g->aux_raw, aux_bytes(g));
    }
    memset(g, 0, sizeof(*g));
}

/* Counts out a live entry of this tag and run length (forgotten, or left in hand by the cuckoo). */
static inline void count_out(kvt__ghost_t *g, uint8_t tag, uint32_t pages) {
    g->count[tag] -= pages;
    g->ecount[tag]--;
    g->live -= pages;
    g->entries--;
}

/* Forgets live entry w of x (taken, replaced or dropped by the cuckoo). */
static inline void forget(kvt__ghost_t *g, bucket_t *x, unsigned w) {
    count_out(g, x->tag[w], g->aux ? pages_in(g->aux[aux_at(g, x, w)]) : 1);
    x->lo[w] = 0;
}

/* A newer copy replaces the older one (a key has one live copy): the entry
 * of x that look l matched, if any, is forgotten and no longer live in l. */
static inline void drop_match(kvt__ghost_t *g, bucket_t *x, look_t *l) {
    if (!l->match) return;
    unsigned w = (unsigned)__builtin_ctz(l->match);
    forget(g, x, w);
    l->live &= ~(1u << w);
}

/* Where a key's live entry is: bucket x, entry w; x NULL when it has none. */
typedef struct {
    bucket_t *x;
    unsigned w;
} spot_t;

/* The key of fingerprint fp in bucket x, or else in y (its second bucket,
 * NULL when its first has not spilled). */
static spot_t find_at(const kvt__ghost_t *g, uint32_t fp, bucket_t *x, bucket_t *y) {
    look_t l = look(g, x, fp);
    if (l.match) return (spot_t){x, (unsigned)__builtin_ctz(l.match)};
    if (y == NULL) return (spot_t){NULL, 0};
    l = look(g, y, fp);
    return l.match ? (spot_t){y, (unsigned)__builtin_ctz(l.match)} : (spot_t){NULL, 0};
}
/* The key of fingerprint fp and first bucket b1: in b1, or in its second
 * bucket when b1 has spilled. */
static spot_t find_in(const kvt__ghost_t *g, uint32_t fp, size_t b1) {
    bucket_t *x = bucket(g, b1), *y = spilled(g, b1) ? bucket(g, alt_of(g, b1, fp)) : NULL;
    if (y) __builtin_prefetch(y); /* the two misses overlap */
    return find_at(g, fp, x, y);
}

static spot_t find(const kvt__ghost_t *g, uint64_t key) {
    uint32_t fp = fp_of(key);
    return find_in(g, fp, b1_of(g, key, fp));
}

__attribute__((always_inline)) static inline void add_now(kvt__ghost_t *g, const kvt__ghost_pend_t *p);

/* Makes the oldest queued add. */
__attribute__((always_inline)) static inline void apply_oldest(kvt__ghost_t *g) {
    add_now(g, &g->pend[g->head]);
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
    return find(g, key).x != NULL;
}

void kvt__ghost_settle(kvt__ghost_t *g) { flush(g); }

bool kvt__ghost_take(kvt__ghost_t *g, uint64_t key) {
    if (g->cap == 0) return false;
    if (g->npend) flush(g);
    spot_t s = find(g, key);
    if (s.x == NULL) return false;
    forget(g, s.x, s.w);
    return true;
}

/* A free or expired entry of bucket x, or -1. */
static int room_in(const kvt__ghost_t *g, const bucket_t *x) {
    unsigned free_ = ~look(g, x, 0).live & ALL_WAYS;
    return free_ ? __builtin_ctz(free_) : -1;
}

/* A new epoch: the oldest leaves the window (its count with it), and the
 * sweep clears the next 1/128 of the table of expired entries, so that none
 * is still there when its tag comes round again. */
__attribute__((noinline)) static void next_epoch(kvt__ghost_t *g) {
    g->tag++;
    memset(g->now16, g->tag, sizeof(g->now16));
    g->fill = 0;
    uint8_t gone = (uint8_t)(g->tag - g->epochs);
    g->live -= g->count[gone];
    g->entries -= g->ecount[gone];
    g->count[gone] = 0;
    g->ecount[gone] = 0;
    size_t n = g->nb - g->sweep_at < g->sweep_step ? g->nb - g->sweep_at : g->sweep_step;
    for (size_t b = g->sweep_at; b < g->sweep_at + n; b++) {
        bucket_t *x = bucket(g, b);
        for (unsigned gone_ = used_in(x) & ~look(g, x, 0).live; gone_; gone_ &= gone_ - 1) x->lo[__builtin_ctz(gone_)] = 0;
    }
    g->sweep_at = g->sweep_at + n == g->nb ? 0 : g->sweep_at + n;
}

void kvt__ghost_probe(const kvt__ghost_t *g, uint64_t key, kvt__ghost_probe_t *p) {
    KVT_ASSERT(g->npend == 0);
    p->added = g->added;
    if (g->cap == 0) return;
    p->fp = fp_of(key);
    p->b1 = (uint32_t)b1_of(g, key, p->fp);
    p->b2 = spilled(g, p->b1) ? (uint32_t)alt_of(g, p->b1, p->fp) : UINT32_MAX;
}

uint32_t kvt__ghost_run(const kvt__ghost_t *g, kvt__ghost_probe_t *p) {
    KVT_ASSERT(g->npend == 0 && p->added == g->added); /* nothing added since: the probe's buckets are the key's */
    p->at = UINT32_MAX;
    if (g->cap == 0) return 0;
    spot_t s = find_at(g, p->fp, bucket(g, p->b1), p->b2 == UINT32_MAX ? NULL : bucket(g, p->b2));
    if (s.x == NULL) return 0;
    p->at = (uint32_t)aux_at(g, s.x, s.w);
    return g->aux ? pages_in(g->aux[p->at]) : 1;
}

bool kvt__ghost_take_run(kvt__ghost_t *g, const kvt__ghost_probe_t *p, uint64_t last) {
    KVT_ASSERT(g->npend == 0 && p->added == g->added && p->at != UINT32_MAX);
    if (g->aux && (g->aux[p->at] & CHECK_MASK) != (last & CHECK_MASK)) return false; /* the pages differ before its end */
    forget(g, bucket(g, p->at / WAYS), p->at % WAYS);
    return true;
}

/* Bucket x's entries whose fingerprint has bit `bit` set (bit w: entry w). */
static inline unsigned with_bit(const bucket_t *x, unsigned bit) {
#if defined(__SSE2__)
    const __m128i one = _mm_set1_epi16((short)(1u << bit));
    __m128i lo0 = _mm_load_si128((const __m128i *)(const void *)x->lo), lo1 = _mm_load_si128((const __m128i *)(const void *)(x->lo + 8));
    return (unsigned)_mm_movemask_epi8(_mm_packs_epi16(_mm_cmpeq_epi16(_mm_and_si128(lo0, one), one),
                                                       _mm_cmpeq_epi16(_mm_and_si128(lo1, one), one)));
#else
    unsigned m = 0;
    for (unsigned w = 0; w < WAYS; w++) m |= (unsigned)((x->lo[w] >> bit) & 1u) << w;
    return m;
#endif
}

/* Bucket x with only the entries of mask `keep` used (the others freed). */
static inline void keep_only(bucket_t *x, unsigned keep) {
#if defined(__SSE2__)
    const __m128i way0 = _mm_set_epi16(128, 64, 32, 16, 8, 4, 2, 1), way8 = _mm_slli_epi16(way0, 8);
    __m128i k = _mm_set1_epi16((short)keep);
    __m128i *lo = (__m128i *)(void *)x->lo;
    _mm_store_si128(lo, _mm_and_si128(_mm_load_si128(lo), _mm_cmpeq_epi16(_mm_and_si128(k, way0), way0)));
    _mm_store_si128(lo + 1, _mm_and_si128(_mm_load_si128(lo + 1), _mm_cmpeq_epi16(_mm_and_si128(k, way8), way8)));
#else
    for (unsigned w = 0; w < WAYS; w++)
        if (!(keep >> w & 1u)) x->lo[w] = 0;
#endif
}

/* The table doubles in place: the live entries of bucket b go to buckets 2b
 * and 2b + 1 by the fingerprint's next grow bit (alt_of says why that keeps
 * every key's pair), each half a copy of b with the other half's entries and
 * the expired ones freed; from the top down, so that no bucket is written
 * before it is read. The sweep keeps its place (bucket s becomes 2s) and
 * doubles its step, so it still passes every bucket in SWEEP_EPOCHS epochs
 * (one more, by rounding, inside the 16 to spare). Each doubling touches
 * twice the table's memory: a ghost that never fills (a short run, a cache
 * larger than its traffic) never faults in the rest of its reservation. */
__attribute__((noinline)) static void grow(kvt__ghost_t *g) {
    unsigned bit = g->grow_shift; /* this doubling's grow bit: bits 1.. of the fingerprint, the top one first */
    for (size_t b = g->nb; b-- > 0;) {
        bucket_t from = *bucket(g, b), *half = bucket(g, 2 * b);
        unsigned live = look(g, &from, 0).live, up = with_bit(&from, bit);
        half[0] = from;
        half[1] = from;
        keep_only(&half[0], live & ~up);
        keep_only(&half[1], live & up);
        bool s = spilled(g, b); /* b's keys of first bucket b are in 2b or 2b + 1 now, and may have spilled from either */
        set_spilled(g, 2 * b, s);
        set_spilled(g, 2 * b + 1, s);
        if (g->aux) { /* each half's used entries keep their aux (2b >= b: read first) */
            uint16_t a[WAYS];
            memcpy(a, g->aux + b * WAYS, sizeof(a));
            memcpy(g->aux + 2 * b * WAYS, a, sizeof(a));
            memcpy(g->aux + (2 * b + 1) * WAYS, a, sizeof(a));
        }
    }
    g->level++;
    g->grow_shift--;
    g->nb *= 2;
    g->grow_at = g->level < g->levels ? KEYS_PER_BUCKET * g->nb : SIZE_MAX;
    g->sweep_at *= 2;
    g->sweep_step = (g->nb + SWEEP_EPOCHS - 1) / SWEEP_EPOCHS;
}

/* Queues the add: the key's first bucket (and its second, if the first has
 * spilled) is prefetched now and the add is
 * made KVT__GHOST_PEND adds later (a ring: each add goes in as a new one
 * comes, so every key's lines had as long to arrive), or when the ghost is
 * next read, so that the cache misses of a run of adds (an eviction round's
 * pages) overlap. */
__attribute__((always_inline)) static inline void add_one(kvt__ghost_t *g, uint64_t key, uint16_t aux) {
    g->added++;
    if (g->entries + g->npend >= g->grow_at) { /* KEYS_PER_BUCKET a bucket: the queue goes in at this size, then it doubles */
        flush(g);
        grow(g);
    }
    uint32_t fp = fp_of(key);
    size_t b1 = b1_of(g, key, fp);
    __builtin_prefetch(bucket(g, b1), 1);
    if (g->aux) __builtin_prefetch(g->aux + b1 * WAYS, 1);
    if (spilled(g, b1)) __builtin_prefetch(bucket(g, alt_of(g, b1, fp)), 1); /* else b2 is read only if b1 has no room */
    if (g->npend == KVT__GHOST_PEND) apply_oldest(g); /* prefetched KVT__GHOST_PEND adds ago */
    g->pend[(g->head + g->npend++) % KVT__GHOST_PEND] = (kvt__ghost_pend_t){fp, (uint32_t)b1, aux};
}

void kvt__ghost_add(kvt__ghost_t *g, uint64_t key) { kvt__ghost_add_keys(g, &key, 1); }

/* (In a ghost of pages, run_max 1, the runs are the pages, last first; their aux, length 1, is not kept.) */
void kvt__ghost_add_keys(kvt__ghost_t *g, const uint64_t *keys, size_t k) {
    if (g->cap == 0 || k == 0) return;
    size_t ahead = KEYS_AHEAD_RUNS * g->run_max; /* a node's keys leaving are cold: fetched runs ahead (both ends) */
    for (size_t at = (k - 1) / g->run_max * g->run_max;; at -= g->run_max) { /* the last run first */
        size_t n = k - at < g->run_max ? k - at : g->run_max;
        if (at >= ahead) {
            __builtin_prefetch(keys + at - ahead);
            __builtin_prefetch(keys + at - ahead + g->run_max - 1);
        }
        add_one(g, keys[at], aux_of((uint32_t)n, keys[at + n - 1]));
        if (at == 0) break;
    }
}

/* The rest of an add whose first bucket b1 has spilled or is full: b2 may
 * hold the key's older copy, or take the key; else cuckoo moves. The key is
 * counted already; lx is b1's look. */
__attribute__((noinline)) static void add_spilled(kvt__ghost_t *g, size_t b1, uint64_t carry, look_t lx, bool both) {
    uint32_t fp = fp_in(carry);
    bucket_t *x = bucket(g, b1), *y = bucket(g, alt_of(g, b1, fp));
    look_t ly = both ? look(g, y, fp) : (look_t){0, 0};
    if (!lx.match) drop_match(g, y, &ly); /* (b1's was dropped by add_now) */
    unsigned fx = ~lx.live & ALL_WAYS;
    if (fx) {
        set(g, x, (unsigned)__builtin_ctz(fx), carry);
        return;
    }
    /* b1 is full: the key goes to b2, or moves another there, so b1 spills */
    set_spilled(g, b1, true);
    if (!both) ly = look(g, y, fp); /* (no copy there: b1 had not spilled) */
    unsigned fy = ~ly.live & ALL_WAYS;
    if (fy) {
        set(g, y, (unsigned)__builtin_ctz(fy), carry);
        return;
    }
    /* both full of live keys: cuckoo moves, each key to its other bucket; a
     * bucket moved from spills (the key moved may be in its first) */
    size_t cur = b1;
    for (unsigned k = 0; k < KICKS_MAX; k++) {
        bucket_t *c = bucket(g, cur);
        set_spilled(g, cur, true);
        unsigned w = (k * 5 + (unsigned)g->fill) % WAYS;
        uint64_t moved = get(g, c, w); /* live: cur had no room */
        set(g, c, w, carry);
        carry = moved;
        cur = alt_of(g, cur, fp_in(moved));
        bucket_t *d = bucket(g, cur);
        int r = room_in(g, d);
        if (r >= 0) {
            set(g, d, (unsigned)r, carry);
            return;
        }
    }
    /* no room within the moves: the entry left in hand is forgotten early */
    count_out(g, tag_in(carry), pages_of(carry));
    g->overflows++;
}

/* An add from the queue. The common case, b1 not spilled and with room (or
 * holding the key's older copy), reads one line and is made here. */
static inline void add_now(kvt__ghost_t *g, const kvt__ghost_pend_t *p) {
    uint32_t fp = p->fp, pages = pages_in(p->aux);
    for (uint32_t n = pages;;) { /* the window counts pages: the run's take it through as many epochs; it has its last's */
        if (g->fill == g->len) next_epoch(g);
        size_t room = g->len - g->fill;
        if (n <= room) {
            g->fill += n;
            break;
        }
        g->fill = g->len;
        n -= (uint32_t)room;
    }
    bucket_t *x = bucket(g, p->b1);
    bool both = spilled(g, p->b1); /* else no copy of the key is in b2 */
    look_t lx = look(g, x, fp);
    drop_match(g, x, &lx);
    g->count[g->tag] += pages;
    g->ecount[g->tag]++;
    g->live += pages;
    g->entries++;
    uint64_t e = (uint64_t)p->aux << 32 | fp << 8 | g->tag;
    unsigned fx = ~lx.live & ALL_WAYS;
    if (!both && fx) {
        set(g, x, (unsigned)__builtin_ctz(fx), e);
        return;
    }
    add_spilled(g, p->b1, e, lx, both);
}
