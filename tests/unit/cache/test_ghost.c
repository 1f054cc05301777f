/* The ghost (src/cache/ghost.c) against the FIFO it stands for: an array of
 * every key in add order, a key remembered while at most cap keys were added
 * since (itself included) and it was not taken out or added again later. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "cache/cache-int.h"
#include "kvtier/error.h"
#include "kvtier/rng.h"

typedef struct {
    uint64_t *key;   /* every key added, in order */
    bool *gone;      /* taken out, or added again later */
    size_t n, cap;
} fifo_t;

/* The add number of key's remembered copy, or -1. Linear: obviously right. */
static long model_find(const fifo_t *m, uint64_t key) {
    size_t from = m->n > m->cap ? m->n - m->cap : 0;
    for (size_t i = m->n; i-- > from;)
        if (m->key[i] == key) return m->gone[i] ? -1 : (long)i;
    return -1;
}

static size_t model_live(const fifo_t *m) {
    size_t from = m->n > m->cap ? m->n - m->cap : 0, live = 0;
    for (size_t i = from; i < m->n; i++) live += !m->gone[i];
    return live;
}

static void run(size_t cap, size_t keyspace, size_t ops, uint64_t seed) {
    kvt__ghost_t g;
    cr_assert_eq(kvt__ghost_init(&g, cap), KVT_OK);
    fifo_t m = {calloc(ops, sizeof(uint64_t)), calloc(ops, sizeof(bool)), 0, cap};
    kvt_rng_t r;
    kvt_rng_seed(&r, seed);
    size_t adds = 0, takes = 0, hits = 0;
    for (size_t op = 0; op < ops; op++) {
        /* keys: splitmix64 of a small id, so that they come back (as page hashes do) */
        uint64_t id = kvt_rng_below(&r, keyspace), key = id;
        key = kvt_splitmix64(&key);
        unsigned what = (unsigned)kvt_rng_below(&r, 10);
        long at = model_find(&m, key);
        if (what < 5) { /* add */
            if (at >= 0) m.gone[at] = true;
            m.key[m.n++] = key;
            kvt__ghost_add(&g, key);
            adds++;
        } else if (what < 8) { /* take */
            bool got = kvt__ghost_take(&g, key);
            cr_assert_eq(got, at >= 0, "op %zu (seed %llu): take %s, the FIFO says %s", op, (unsigned long long)seed,
                         got ? "found" : "missed", at >= 0 ? "present" : "absent");
            if (at >= 0) m.gone[at] = true, hits++;
            takes++;
        } else {
            cr_assert_eq(kvt__ghost_has(&g, key), at >= 0, "op %zu (seed %llu): has", op, (unsigned long long)seed);
        }
        if (op % 97 == 0 || op == ops - 1)
            cr_assert_eq(kvt__ghost_live(&g), model_live(&m), "op %zu (seed %llu): live %zu, the FIFO holds %zu", op,
                         (unsigned long long)seed, kvt__ghost_live(&g), model_live(&m));
    }
    (void)kvt__ghost_live(&g); /* applies queued adds */
    cr_assert_eq(g.overflows, 0);
    printf("ghost cap=%zu keys=%zu ops=%zu seed=%llu: %zu adds, %zu takes (%zu found), live %zu\n", cap, keyspace, ops,
           (unsigned long long)seed, adds, takes, hits, kvt__ghost_live(&g));
    kvt__ghost_fini(&g);
    free(m.key);
    free(m.gone);
}

Test(ghost, agrees_with_a_fifo_small) { run(40, 120, 20000, 1); }
Test(ghost, agrees_with_a_fifo_wrapping_many_times) { run(1000, 2500, 60000, 2); }
Test(ghost, agrees_with_a_fifo_mostly_new_keys) { run(3000, 40000, 40000, 3); }

Test(ghost, empty_ghost_remembers_nothing) {
    kvt__ghost_t g;
    cr_assert_eq(kvt__ghost_init(&g, 0), KVT_OK);
    kvt__ghost_add(&g, 42);
    cr_assert(!kvt__ghost_has(&g, 42));
    cr_assert(!kvt__ghost_take(&g, 42));
    kvt__ghost_fini(&g);
}
