/* The ghost (src/core/ghost.c) against the window it stands for: an array of
 * every entry in add order (a page, or a run of pages: its first key, its
 * length and its last key), an entry remembered while it was not taken out or
 * replaced by a later add of its first key, and while fewer than E epochs of
 * len pages began after the one of its last page: after N pages added, the
 * entry whose last page was page i is in the window while
 * (N - 1) / len - i / len < E, with E = min(112, cap) and
 * len = round(2 cap / (2E - 1)) (1 when cap <= 112: the exact FIFO of the
 * last cap pages). A ghost of runs takes a run only when the last key it is
 * shown agrees with the run's in the low 11 bits (its check). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "core/ghost-int.h"
#include "kvtier/error.h"
#include "kvtier/rng.h"

#define CHECK_MASK 0x7ffu /* the 11 bits of a run's last key that a ghost of runs keeps */

typedef struct {
    size_t *first, *last; /* by entry, in add order: its first and last key (numbers in the test's key set) */
    uint32_t *pages;      /* ... its length */
    size_t *end;          /* ... the number of its last page among all pages added */
    bool *gone;           /* ... taken out, or replaced by a later add of its first key */
    long *latest;         /* by key number: the latest entry it was the first key of, or -1 */
    size_t n, npages;     /* entries and pages added so far */
    size_t epochs, len;
} fifo_t;

static void model_init(fifo_t *m, size_t cap, size_t keyspace, size_t entries) {
    m->first = calloc(entries, sizeof(size_t));
    m->last = calloc(entries, sizeof(size_t));
    m->pages = calloc(entries, sizeof(uint32_t));
    m->end = calloc(entries, sizeof(size_t));
    m->gone = calloc(entries, sizeof(bool));
    m->latest = malloc(keyspace * sizeof(long));
    for (size_t i = 0; i < keyspace; i++) m->latest[i] = -1;
    m->n = m->npages = 0;
    m->epochs = cap < 112 ? cap : 112;
    m->len = cap <= 112 ? 1 : (size_t)((2.0 * (double)cap) / (2.0 * 112 - 1) + 0.5);
}

static void model_fini(fifo_t *m) {
    free(m->first);
    free(m->last);
    free(m->pages);
    free(m->end);
    free(m->gone);
    free(m->latest);
}

static bool in_window(const fifo_t *m, size_t i) { return (m->npages - 1) / m->len - m->end[i] / m->len < m->epochs; }

/* The entry remembered with first key id, or -1: its latest, if still in the window and not taken out. */
static long model_find(const fifo_t *m, size_t id) {
    long i = m->latest[id];
    return i >= 0 && in_window(m, (size_t)i) && !m->gone[i] ? i : -1;
}

static void model_add(fifo_t *m, size_t first, size_t last, uint32_t pages) {
    long at = model_find(m, first);
    if (at >= 0) m->gone[at] = true;
    m->latest[first] = (long)m->n;
    m->first[m->n] = first;
    m->last[m->n] = last;
    m->pages[m->n] = pages;
    m->npages += pages;
    m->end[m->n++] = m->npages - 1;
}

/* k pages as kvt__ghost_add_keys adds them: runs of run_max from the first, the last run first. */
static void model_add_keys(fifo_t *m, const size_t *ids, size_t k, size_t run_max) {
    size_t runs = (k + run_max - 1) / run_max;
    for (size_t r = runs; r-- > 0;) {
        size_t at = r * run_max, n = k - at < run_max ? k - at : run_max;
        model_add(m, ids[at], ids[at + n - 1], (uint32_t)n);
    }
}

/* The pages remembered; *entries: the entries that hold them. */
static size_t model_live(const fifo_t *m, size_t *entries) {
    size_t live = 0;
    *entries = 0;
    for (size_t i = m->n; i-- > 0 && in_window(m, i);) {
        live += m->gone[i] ? 0 : m->pages[i];
        *entries += !m->gone[i];
    }
    return live;
}

/* The ghost's fingerprint of a key (ghost.c): 24 bits of it, odd. */
static uint32_t fp_of(uint64_t key) { return (uint32_t)(key >> 40) | 1u; }

/* n keys with n different fingerprints (splitmix64 of small ids, skipping
 * those whose fingerprint is taken), so that the window is exactly what the
 * ghost answers: two keys sharing a fingerprint and a bucket are one key to
 * it, the false "present" that ghost/false_presents_are_rare measures. */
static uint64_t *distinct_keys(size_t n) {
    uint64_t *key = calloc(n, sizeof(uint64_t)), state = 0;
    uint8_t *seen = calloc(1u << 21, 1); /* a bit per 24-bit fingerprint */
    for (size_t i = 0; i < n;) {
        uint64_t k = kvt_splitmix64(&state);
        uint32_t f = fp_of(k);
        if (seen[f / 8] & (1u << (f % 8))) continue;
        seen[f / 8] |= (uint8_t)(1u << (f % 8));
        key[i++] = k;
    }
    free(seen);
    return key;
}

/* The run the ghost remembers at key (by a probe, as the walk looks): its length, 0 for none;
 * with take, taken out when `last` passes its check. *taken: whether it was. */
static uint32_t look_run(kvt__ghost_t *g, uint64_t key, bool take, uint64_t last, bool *taken) {
    kvt__ghost_probe_t p;
    kvt__ghost_settle(g);
    kvt__ghost_probe(g, key, &p);
    uint32_t n = kvt__ghost_run(g, &p);
    *taken = take && n > 0 && kvt__ghost_take_run(g, &p, last);
    return n;
}

/* Adds (pages, or a node's pages as runs of up to run_max), takes and lookups of keys from a set
 * of `keyspace`, each answer against the model; the table must have doubled `levels` times by
 * the end. A ghost of pages is asked by key (has, take) as well as by probe. */
static void run(size_t cap, unsigned run_max, size_t keyspace, size_t ops, uint64_t seed, unsigned levels) {
    kvt__ghost_t g;
    uint64_t *keys = distinct_keys(keyspace);
    cr_assert_eq(kvt__ghost_init(&g, cap, run_max), KVT_OK);
    fifo_t m;
    size_t most = 3 * run_max; /* pages an add at most */
    model_init(&m, cap, keyspace, ops * most);
    cr_assert_eq(g.epochs, m.epochs, "cap %zu: %u epochs, the model says %zu", cap, g.epochs, m.epochs);
    cr_assert_eq(g.len, m.len, "cap %zu: epochs of %zu pages, the model says %zu", cap, g.len, m.len);
    kvt_rng_t r;
    kvt_rng_seed(&r, seed);
    size_t adds = 0, takes = 0, hits = 0, refused = 0, ids[3 * KVT__GHOST_RUN_MAX];
    /* the model counts what it holds by a pass over its window: every 97 ops, but in a large
     * window (10,000 or more pages) every 997, so that the pass stays a fraction of the test */
    size_t check_every = cap < 10000 ? 97 : 997;
    uint64_t run_keys[3 * KVT__GHOST_RUN_MAX];
    for (size_t op = 0; op < ops; op++) {
        /* keys from a small set, so that they come back (as page keys do) */
        size_t id = kvt_rng_below(&r, keyspace);
        uint64_t key = keys[id];
        unsigned what = (unsigned)kvt_rng_below(&r, 10);
        long at = model_find(&m, id);
        if (what < 5) { /* add: one page, or (a third of them) a node's run of pages */
            size_t k = what == 4 ? 1 + kvt_rng_below(&r, most) : 1;
            ids[0] = id;
            for (size_t i = 1; i < k; i++) ids[i] = kvt_rng_below(&r, keyspace);
            for (size_t i = 0; i < k; i++) run_keys[i] = keys[ids[i]];
            model_add_keys(&m, ids, k, run_max);
            if (k == 1 && what == 3)
                kvt__ghost_add(&g, key);
            else
                kvt__ghost_add_keys(&g, run_keys, k);
            adds++;
        } else if (what < 8) { /* take: by the probe and its run, shown its last key or another */
            size_t last = at >= 0 && kvt_rng_below(&r, 4) ? m.last[at] : kvt_rng_below(&r, keyspace);
            bool model_takes = at >= 0 && ((keys[last] ^ keys[m.last[at]]) & CHECK_MASK) == 0, taken;
            if (run_max == 1) { /* a page is its own last page: shown no other */
                last = id;
                model_takes = at >= 0;
            }
            if (run_max == 1 && what == 7) {
                taken = kvt__ghost_take(&g, key);
            } else {
                uint32_t n = look_run(&g, key, true, keys[last], &taken);
                cr_assert_eq(n, at >= 0 ? m.pages[at] : 0, "op %zu (seed %llu): a run of %u pages, the FIFO says %u", op,
                             (unsigned long long)seed, n, at >= 0 ? m.pages[at] : 0);
            }
            cr_assert_eq(taken, model_takes, "op %zu (seed %llu): take %s, the FIFO says %s", op, (unsigned long long)seed,
                         taken ? "took it" : "did not", model_takes ? "take" : "do not");
            if (model_takes) m.gone[at] = true, hits++;
            refused += at >= 0 && !model_takes;
            takes++;
        } else {
            bool unused;
            if (run_max == 1) cr_assert_eq(kvt__ghost_has(&g, key), at >= 0, "op %zu (seed %llu): has", op, (unsigned long long)seed);
            cr_assert_eq(look_run(&g, key, false, 0, &unused), at >= 0 ? m.pages[at] : 0, "op %zu (seed %llu): run", op,
                         (unsigned long long)seed);
        }
        if (op % check_every == 0 || op == ops - 1) {
            size_t entries, live = model_live(&m, &entries);
            cr_assert_eq(kvt__ghost_live(&g), live, "op %zu (seed %llu): live %zu pages, the FIFO holds %zu", op,
                         (unsigned long long)seed, kvt__ghost_live(&g), live);
            cr_assert_eq(g.entries, entries, "op %zu (seed %llu): %zu entries, the FIFO holds %zu", op,
                         (unsigned long long)seed, g.entries, entries);
        }
    }
    (void)kvt__ghost_live(&g); /* applies queued adds */
    cr_assert_eq(g.overflows, 0);
    cr_assert_eq(g.level, levels, "cap %zu: the table grew %u times, %u expected", cap, g.level, levels);
    if (run_max > 1) cr_assert(refused > 0 && refused < takes, "the check refused %zu of %zu takes", refused, takes);
    printf("ghost cap=%zu run_max=%u keys=%zu ops=%zu seed=%llu: %zu adds (%zu entries, %zu pages), %zu takes (%zu "
           "taken, %zu refused by the check), live %zu pages, %zu buckets (%u doublings)\n",
           cap, run_max, keyspace, ops, (unsigned long long)seed, adds, m.n, m.npages, takes, hits, refused,
           kvt__ghost_live(&g), g.nb, g.level);
    kvt__ghost_fini(&g);
    model_fini(&m);
    free(keys);
}

Test(ghost, agrees_with_a_fifo_small) { run(40, 1, 120, 20000, 1, 0); }
Test(ghost, agrees_with_a_fifo_wrapping_many_times) { run(1000, 1, 2500, 60000, 2, 0); }
Test(ghost, agrees_with_a_fifo_mostly_new_keys) { run(3000, 1, 40000, 40000, 3, 0); }
/* 100,000 keys: 8,334 buckets, a table that starts at 2,084 and doubles as
 * its live keys pass 12 a bucket (25,008, then 50,016), while the window
 * wraps and keys come back: every answer across both doublings agrees. */
Test(ghost, agrees_with_a_fifo_while_it_grows) { run(100000, 1, 300000, 900000, 4, 2); }

/* A ghost of runs: the window counts pages (a run of 16 spans epochs when
 * they are short: cap 40 is the exact FIFO of the last 40 pages), an entry
 * is a run, taken whole when its check passes. */
Test(ghost, runs_agree_with_a_fifo_small) { run(40, 16, 120, 20000, 5, 0); }
Test(ghost, runs_agree_with_a_fifo_wrapping_many_times) { run(3000, 16, 2500, 60000, 6, 0); }
Test(ghost, runs_of_two_agree_with_a_fifo) { run(2000, 2, 9000, 60000, 7, 0); }
/* 400,000 pages: 33,334 buckets, a ghost of runs starting at a sixteenth,
 * 2,084; it doubles as its live entries (not pages) pass 12 a bucket
 * (25,008, 50,016, 100,032, then 200,064). Runs of at most 4 pages (adds of
 * 1..12 pages) keep ~140,000 entries in a window of ~250,000 live pages
 * here: it doubles three times, the runs carried across each. */
Test(ghost, runs_agree_with_a_fifo_while_it_grows) { run(400000, 4, 300000, 900000, 8, 3); }

/* A table that never fills keeps to its first quarter: a ghost of 1 M keys
 * holding 20,000 has not doubled, and answers for all of them. */
Test(ghost, a_ghost_that_never_fills_stays_small) {
    kvt__ghost_t g;
    cr_assert_eq(kvt__ghost_init(&g, 1u << 20, 1), KVT_OK);
    cr_assert_eq(g.levels, 2);
    cr_assert_eq(g.nb, g.nb_max / 4);
    uint64_t state = 11, first = state;
    for (int i = 0; i < 20000; i++) kvt__ghost_add(&g, kvt_splitmix64(&state));
    cr_assert_eq(kvt__ghost_live(&g), 20000);
    cr_assert_eq(g.level, 0);
    for (int i = 0; i < 20000; i++) cr_assert(kvt__ghost_has(&g, kvt_splitmix64(&first)), "key %d forgotten", i);
    kvt__ghost_fini(&g);
}

/* A ghost of runs is sized for a page an entry but holds up to 16 pages an
 * entry: it starts at a sixteenth (arc's, at the defaults, never leaves it).
 * 5,000 runs of 16 pages, 80,000 pages in 5,000 entries of its 5,462
 * buckets: not doubled, and every run is found whole at its first page. */
Test(ghost, a_ghost_of_runs_starts_at_a_sixteenth) {
    kvt__ghost_t g;
    cr_assert_eq(kvt__ghost_init(&g, 1u << 20, 16), KVT_OK);
    cr_assert_eq(g.levels, 4);
    cr_assert_eq(g.nb, g.nb_max / 16);
    uint64_t state = 12, *keys = malloc(5000 * 16 * sizeof(uint64_t));
    cr_assert_not_null(keys);
    for (int i = 0; i < 5000 * 16; i++) keys[i] = kvt_splitmix64(&state);
    for (int r = 0; r < 5000; r++) kvt__ghost_add_keys(&g, keys + 16 * r, 16);
    cr_assert_eq(kvt__ghost_live(&g), 80000);
    cr_assert_eq(g.level, 0);
    for (int r = 0; r < 5000; r++) {
        kvt__ghost_probe_t p;
        kvt__ghost_probe(&g, keys[16 * r], &p);
        cr_assert_eq(kvt__ghost_run(&g, &p), 16, "run %d forgotten", r);
    }
    kvt__ghost_fini(&g);
    free(keys);
}

/* A ghost at full load asked for keys never added: a false "present" needs
 * one of the ~24 live entries of the key's two buckets to have its 23 free
 * fingerprint bits, 2.9e-6 a lookup in a table that has not grown. This one
 * (1 M keys) has doubled twice: a bucket's entries and the lookup's key share
 * the 2 grow bits their place implies, so it is 4 x that, 1.1e-5 (ghost.c),
 * or less where a lookup skips an unspilled key's second bucket; 4 M lookups
 * expect ~48 at most. The same coincidence on an add makes the new key
 * replace an older one: the 1 M adds of distinct keys that fill it expect ~8
 * of those. */
Test(ghost, false_presents_are_rare) {
    kvt__ghost_t g;
    size_t cap = 1u << 20, lookups = 4u << 20, present = 0;
    cr_assert_eq(kvt__ghost_init(&g, cap, 1), KVT_OK);
    uint64_t state = 7;
    for (size_t i = 0; i < cap; i++) kvt__ghost_add(&g, kvt_splitmix64(&state));
    size_t merged = cap - kvt__ghost_live(&g);
    cr_assert_eq(g.level, 2, "the table doubled %u times", g.level);
    cr_assert(merged < 40, "%zu of %zu distinct keys taken for others", merged, cap);
    for (size_t i = 0; i < lookups; i++) present += kvt__ghost_has(&g, kvt_splitmix64(&state));
    double rate = (double)present / (double)lookups;
    printf("ghost at full load: %zu false presents in %zu lookups of absent keys (%.2g a lookup); %zu keys taken for "
           "others in %zu adds\n", present, lookups, rate, merged, cap);
    cr_assert(rate < 2.2e-5, "%zu false presents in %zu lookups: %.2g, more than 2 x the 1.1e-5 of the design", present,
              lookups, rate);
    cr_assert_eq(g.overflows, 0);
    kvt__ghost_fini(&g);
}

Test(ghost, empty_ghost_remembers_nothing) {
    kvt__ghost_t g;
    cr_assert_eq(kvt__ghost_init(&g, 0, 1), KVT_OK);
    kvt__ghost_add(&g, 42);
    cr_assert(!kvt__ghost_has(&g, 42));
    cr_assert(!kvt__ghost_take(&g, 42));
    cr_assert_eq(kvt__ghost_init(&g, 0, 16), KVT_OK);
    kvt__ghost_add_keys(&g, (const uint64_t[]){42, 43}, 2);
    kvt__ghost_probe_t p;
    kvt__ghost_probe(&g, 42, &p);
    cr_assert_eq(kvt__ghost_run(&g, &p), 0);
    kvt__ghost_fini(&g);
}
