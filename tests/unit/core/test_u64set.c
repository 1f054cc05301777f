/* The B+tree ordered set against a sorted-array model. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>

#include "core/mem-int.h"
#include "kvtier/rng.h"
#include "core/u64set-int.h"
#include "kvtier/error.h"

typedef struct sorted {
    uint64_t *k;
    size_t n;
} sorted_t;

static size_t s_lower(const sorted_t *s, uint64_t key) { /* first index >= key, by linear scan */
    size_t i = 0;
    while (i < s->n && s->k[i] < key) i++;
    return i;
}

static int s_insert(sorted_t *s, uint64_t key) {
    size_t i = s_lower(s, key);
    if (i < s->n && s->k[i] == key) return KVT_EEXIST;
    memmove(&s->k[i + 1], &s->k[i], (s->n - i) * sizeof(uint64_t));
    s->k[i] = key;
    s->n++;
    return KVT_OK;
}

static int s_erase(sorted_t *s, uint64_t key) {
    size_t i = s_lower(s, key);
    if (i >= s->n || s->k[i] != key) return KVT_ENOENT;
    memmove(&s->k[i], &s->k[i + 1], (s->n - i - 1) * sizeof(uint64_t));
    s->n--;
    return KVT_OK;
}

static void assert_same(const kvt__u64set_t *t, const sorted_t *s, const char *ctx) {
    const char *why = NULL;
    cr_assert_eq(kvt__u64set_check(t, &why), KVT_OK, "%s: check: %s", ctx, why);
    cr_assert_eq(t->count, s->n, "%s: count", ctx);
    kvt__u64cur_t c;
    size_t i = 0;
    for (bool ok = kvt__u64set_first(t, &c); ok; ok = kvt__u64cur_next(&c), i++)
        cr_assert_eq(kvt__u64cur_key(&c), s->k[i], "%s: key %zu", ctx, i);
    cr_assert_eq(i, s->n);
    i = s->n;
    for (bool ok = kvt__u64set_last(t, &c); ok; ok = kvt__u64cur_prev(&c))
        cr_assert_eq(kvt__u64cur_key(&c), s->k[--i], "%s: backwards", ctx);
    cr_assert_eq(i, 0);
}

static void set_fuzz(uint64_t keyspace, int ops, uint64_t seed) {
    fprintf(stderr, "u64set fuzz: keyspace=%" PRIu64 " seed=%" PRIu64 "\n", keyspace, seed);
    kvt_rng_t rng;
    kvt_rng_seed(&rng, seed);
    kvt__nodepool_t pool;
    kvt__nodepool_init(&pool);
    kvt__u64set_t t;
    kvt__u64set_init(&t, &pool);
    sorted_t s = {calloc((size_t)ops + 1, sizeof(uint64_t)), 0};
    char ctx[96];
    for (int op = 0; op < ops; op++) {
        snprintf(ctx, sizeof(ctx), "seed %" PRIu64 " op %d", seed, op);
        uint64_t key = kvt_rng_below(&rng, keyspace), d = kvt_rng_below(&rng, 100);
        /* grow, then shrink, then grow: exercises splits and merges */
        int phase = (op / (ops / 6 + 1)) % 2;
        if (d < (phase ? 30u : 60u)) {
            cr_assert_eq(kvt__u64set_insert(&t, key), s_insert(&s, key), "%s: insert %" PRIu64, ctx, key);
        } else if (d < 90) {
            if (s.n && kvt_rng_below(&rng, 2)) key = s.k[kvt_rng_below(&rng, s.n)];
            cr_assert_eq(kvt__u64set_erase(&t, key), s_erase(&s, key), "%s: erase %" PRIu64, ctx, key);
        } else if (d < 95 && s.n > 0) { /* replace a key by another in the same gap */
            size_t i = (size_t)kvt_rng_below(&rng, s.n);
            uint64_t lo = i > 0 ? s.k[i - 1] + 1 : 0, hi = i + 1 < s.n ? s.k[i + 1] - 1 : keyspace - 1;
            uint64_t nk = lo + kvt_rng_below(&rng, hi - lo + 1);
            cr_assert_eq(kvt__u64set_replace(&t, s.k[i], nk), KVT_OK, "%s: replace", ctx);
            s.k[i] = nk;
        } else { /* lookups */
            kvt__u64cur_t c;
            size_t i = s_lower(&s, key);
            bool ok = kvt__u64set_lower_bound(&t, key, &c);
            cr_assert_eq(ok, i < s.n, "%s: lower_bound found", ctx);
            if (ok) cr_assert_eq(kvt__u64cur_key(&c), s.k[i], "%s: lower_bound", ctx);
            ok = kvt__u64set_last_below(&t, key, &c);
            cr_assert_eq(ok, i > 0, "%s: last_below found", ctx);
            if (ok) cr_assert_eq(kvt__u64cur_key(&c), s.k[i - 1], "%s: last_below", ctx);
            cr_assert_eq(kvt__u64set_contains(&t, key), i < s.n && s.k[i] == key);
        }
        if (op % 1000 == 0) assert_same(&t, &s, ctx);
    }
    assert_same(&t, &s, "end");
    kvt__u64set_fini(&t);
    cr_assert_eq(pool.live, 0, "every node went back to the pool");
    kvt__nodepool_fini(&pool);
    free(s.k);
}

Test(u64set, model_fuzz, .timeout = 300) {
    set_fuzz(64, 50000, 1);       /* tiny: root leaf, split and collapse */
    set_fuzz(5000, 100000, 2);    /* two to three levels */
    set_fuzz(UINT64_MAX, 100000, 3);
}

Test(u64set, replace_rejects_out_of_order_and_missing) {
    kvt__nodepool_t pool;
    kvt__nodepool_init(&pool);
    kvt__u64set_t t;
    kvt__u64set_init(&t, &pool);
    for (uint64_t k = 0; k < 1000; k += 10) cr_assert_eq(kvt__u64set_insert(&t, k), KVT_OK);
    cr_assert_eq(kvt__u64set_replace(&t, 15, 16), KVT_ENOENT);
    cr_assert_eq(kvt__u64set_replace(&t, 20, 30), KVT_EINVAL); /* 30 exists */
    cr_assert_eq(kvt__u64set_replace(&t, 20, 35), KVT_EINVAL); /* past 30 */
    cr_assert_eq(kvt__u64set_replace(&t, 20, 11), KVT_OK);
    cr_assert_eq(kvt__u64set_check(&t, NULL), KVT_OK);
    kvt__u64set_fini(&t);
    kvt__nodepool_fini(&pool);
}

/* A failed insert (no node to split into) leaves the set as it was. */
Test(u64set, failed_insert_changes_nothing) {
    kvt__nodepool_t pool;
    kvt__nodepool_init(&pool);
    kvt__u64set_t t;
    kvt__u64set_init(&t, &pool);
    int failures = 0;
    for (uint64_t k = 0; k < 20000; k++) {
        kvt__mem_fail_nth(1);
        int rc = kvt__u64set_insert(&t, k * 7919 % 20011);
        int fired = kvt__mem_fail_fired();
        kvt__mem_fail_nth(0);
        if (rc == KVT_ENOMEM) {
            cr_assert(fired);
            failures++;
            cr_assert_eq(t.count, k, "count unchanged");
            cr_assert(!kvt__u64set_contains(&t, k * 7919 % 20011));
            cr_assert_eq(kvt__u64set_check(&t, NULL), KVT_OK);
            cr_assert_eq(kvt__u64set_insert(&t, k * 7919 % 20011), KVT_OK);
        }
    }
    cr_assert_gt(failures, 100, "splits were exercised");
    kvt__u64set_fini(&t);
    kvt__nodepool_fini(&pool);
}

/* erase_at removes the key a cursor stands on, wherever the cursor got there
 * (lower_bound inside a leaf or past its end, last, prev across leaves). */
Test(u64set, erase_at_follows_the_cursor) {
    kvt_rng_t rng;
    kvt_rng_seed(&rng, 7);
    kvt__nodepool_t pool;
    kvt__nodepool_init(&pool);
    kvt__u64set_t t;
    kvt__u64set_init(&t, &pool);
    enum { N = 20000 };
    sorted_t s = {calloc(N, sizeof(uint64_t)), 0};
    while (s.n < N) {
        uint64_t key = kvt_rng_below(&rng, 1u << 30);
        cr_assert_eq(kvt__u64set_insert(&t, key), s_insert(&s, key));
    }
    char ctx[64];
    for (int op = 0; s.n > 0; op++) {
        snprintf(ctx, sizeof(ctx), "erase_at op %d", op);
        kvt__u64cur_t c;
        size_t i;
        uint64_t how = kvt_rng_below(&rng, 4);
        if (how == 0) {
            cr_assert(kvt__u64set_last(&t, &c));
            i = s.n - 1;
        } else {
            uint64_t key = kvt_rng_below(&rng, 1u << 30);
            i = s_lower(&s, key);
            if (i == s.n) continue;
            cr_assert(kvt__u64set_lower_bound(&t, key, &c));
            if (how == 1 && i > 0) { /* one step back, often into the previous leaf */
                cr_assert(kvt__u64cur_prev(&c));
                i--;
            }
        }
        cr_assert_eq(kvt__u64cur_key(&c), s.k[i], "%s: cursor", ctx);
        uint64_t key = s.k[i];
        kvt__u64set_erase_at(&t, &c);
        cr_assert_eq(s_erase(&s, key), KVT_OK);
        if (op % 500 == 0 || s.n < 200) assert_same(&t, &s, ctx);
    }
    assert_same(&t, &s, "empty");
    cr_assert_eq(pool.live, 0, "every node went back to the pool");
    kvt__u64set_fini(&t);
    kvt__nodepool_fini(&pool);
    free(s.k);
}

/* kvt__u64set_insert_bound suffices: batches of inserts with erases between
 * them, as the extent allocator's free makes (an erase and an insert a run
 * that joins a neighbour), never hold more nodes than the bound set aside
 * over the nodes live before the batch; and for a large batch it is near
 * what the tree holds, not a split at every level of every insert (a free of
 * a million runs set 6 GB aside). */
Test(u64set, the_insert_bound_suffices_and_is_tight_for_large_batches) {
    kvt__nodepool_t pool;
    kvt__nodepool_init(&pool);
    kvt__u64set_t s;
    kvt__u64set_init(&s, &pool);
    kvt_rng_t r;
    kvt_rng_seed(&r, 5);
    const size_t batches[] = {1, 7, 100, 5000, 200000};
    uint64_t next = 0;
    for (size_t b = 0; b < sizeof(batches) / sizeof(*batches); b++) {
        size_t n = batches[b], bound = kvt__u64set_insert_bound(&s, n), live0 = pool.live, peak = 0;
        cr_assert_eq(kvt__nodepool_reserve(&pool, bound), KVT_OK);
        for (size_t i = 0; i < n; i++) {
            if (s.count > 0 && kvt_rng_below(&r, 2)) { /* an extent reshaped: its smallest key goes */
                kvt__u64cur_t cur;
                cr_assert(kvt__u64set_first(&s, &cur));
                kvt__u64set_erase_at(&s, &cur);
            }
            cr_assert_eq(kvt__u64set_insert(&s, (next += 1 + kvt_rng_below(&r, 3))), KVT_OK);
            if (pool.live > live0 && pool.live - live0 > peak) peak = pool.live - live0;
        }
        cr_assert_leq(peak, bound, "batch of %zu: %zu nodes taken, %zu set aside", n, peak, bound);
        if (n >= 5000)
            cr_assert_lt(bound, n / 8, "batch of %zu: %zu nodes set aside (a split a level an insert: %zu)", n, bound,
                         n * (s.height + 1));
    }
    kvt__u64set_fini(&s);
    kvt__nodepool_fini(&pool);
}
