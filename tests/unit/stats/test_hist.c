/* The histogram against exact nearest-rank percentiles of sorted samples. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "kvtier/rng.h"
#include "kvtier/stats.h"

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static uint64_t exact(const uint64_t *sorted, size_t n, double q) {
    size_t rank = (size_t)ceil(q * (double)n);
    if (rank < 1) rank = 1;
    return sorted[rank - 1];
}

Test(hist, buckets_tile_the_range) {
    uint64_t prev_hi = 0;
    for (unsigned b = 0; b < KVT_HIST_BUCKETS; b++) {
        uint64_t lo, hi;
        kvt_hist_bucket_range(b, &lo, &hi);
        cr_assert_eq(lo, b == 0 ? 0 : prev_hi + 1, "bucket %u starts where %u ended", b, b - 1);
        cr_assert_geq(hi, lo);
        cr_assert_eq(kvt_hist_bucket_of(lo), b);
        cr_assert_eq(kvt_hist_bucket_of(hi), b);
        if (lo >= 128) cr_assert_leq((double)(hi - lo + 1), (double)lo / 64.0, "bucket %u too wide", b);
        prev_hi = hi;
    }
    cr_assert_eq(prev_hi, ((uint64_t)1 << KVT_HIST_MAX_LOG2) - 1);
    cr_assert_eq(kvt_hist_bucket_of(UINT64_MAX), KVT_HIST_BUCKETS - 1);
}

Test(hist, percentiles_within_one_percent) {
    static uint64_t v[200000];
    kvt_rng_t rng;
    for (uint64_t seed = 1; seed <= 4; seed++) {
        kvt_rng_seed(&rng, seed);
        size_t n = 1000 * seed * seed * 10;
        kvt_hist_t h;
        kvt_hist_init(&h);
        uint64_t sum = 0;
        for (size_t i = 0; i < n; i++) {
            /* log-uniform over 1 ns .. 100 s, plus a few exact small values */
            v[i] = seed == 1 ? kvt_rng_below(&rng, 300)
                             : (uint64_t)exp(kvt_rng_unit(&rng) * log(1e11));
            kvt_hist_record(&h, v[i]);
            sum += v[i];
        }
        qsort(v, n, sizeof(uint64_t), cmp_u64);
        cr_assert_eq(h.count, n);
        cr_assert_eq(h.sum, sum);
        cr_assert_eq(h.min, v[0]);
        cr_assert_eq(h.max, v[n - 1]);
        const double qs[] = {0.0, 0.001, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0};
        for (size_t i = 0; i < sizeof(qs) / sizeof(qs[0]); i++) {
            uint64_t want = exact(v, n, qs[i]), got = kvt_hist_percentile(&h, qs[i]);
            double err = fabs((double)got - (double)want) / (want ? (double)want : 1.0);
            cr_assert(want < 128 ? got == want : err <= 0.01, "seed %" PRIu64 " q=%g: got %" PRIu64 ", exact %" PRIu64,
                      seed, qs[i], got, want);
        }
    }
}

Test(hist, merge_equals_recording_everything) {
    kvt_hist_t a, b, all;
    kvt_hist_init(&a);
    kvt_hist_init(&b);
    kvt_hist_init(&all);
    kvt_rng_t rng;
    kvt_rng_seed(&rng, 9);
    for (int i = 0; i < 10000; i++) {
        uint64_t x = kvt_rng_below(&rng, 1000000);
        kvt_hist_record(i % 3 ? &a : &b, x);
        kvt_hist_record(&all, x);
    }
    kvt_hist_merge(&a, &b);
    cr_assert(memcmp(&a, &all, sizeof(a)) == 0);
    kvt_hist_t empty;
    kvt_hist_init(&empty);
    cr_assert_eq(kvt_hist_percentile(&empty, 0.5), 0);
    cr_assert_eq(kvt_hist_mean(&empty), 0.0);
}

/* A bucket past the last is the last (it shifted past 63 bits); the sum
 * saturates where it wrapped (UINT64_MAX + 2 read as a sum of 1, a mean of 0.5). */
Test(hist, a_bucket_past_the_last_and_a_sum_past_64_bits) {
    uint64_t lo, hi, llo, lhi;
    kvt_hist_bucket_range(5000, &lo, &hi);
    kvt_hist_bucket_range(KVT_HIST_BUCKETS - 1, &llo, &lhi);
    cr_assert(lo == llo && hi == lhi);
    kvt_hist_t h, g;
    kvt_hist_init(&h);
    kvt_hist_init(&g);
    kvt_hist_record(&h, UINT64_MAX);
    kvt_hist_record(&h, 2);
    cr_assert_eq(h.count, 2u);
    cr_assert_eq(h.sum, UINT64_MAX);
    kvt_hist_record(&g, 7);
    kvt_hist_merge(&g, &h);
    cr_assert_eq(g.sum, UINT64_MAX);
    cr_assert_eq(g.count, 3u);
}
