/* Log-linear latency histogram.
 *
 *   value        bucket index                        width
 *   0..127       v                                   1
 *   >= 128       e = msb(v) - 6;  e*64 + (v >> e)    2^e   (v >> e in [64, 128))
 *
 * So each power of two above 127 has 64 buckets of equal width, and a bucket
 * is never wider than 1/64 of the values in it: the middle of the bucket is
 * within 1/128 (0.8 %) of any value in it.
 */
#include <math.h>
#include <string.h>
#include <time.h>

#include "kvtier/stats.h"

uint64_t kvt_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#define HALF (1u << KVT_HIST_SUB_BITS)

void kvt_hist_init(kvt_hist_t *h) {
    memset(h, 0, sizeof(*h));
    h->min = UINT64_MAX;
}

unsigned kvt_hist_bucket_of(uint64_t v) {
    if (v < 2 * HALF) return (unsigned)v;
    unsigned msb = 63u - (unsigned)__builtin_clzll(v);
    if (msb >= KVT_HIST_MAX_LOG2) return KVT_HIST_BUCKETS - 1;
    unsigned e = msb - KVT_HIST_SUB_BITS;
    return e * HALF + (unsigned)(v >> e);
}

void kvt_hist_bucket_range(unsigned b, uint64_t *lo, uint64_t *hi) {
    if (b >= KVT_HIST_BUCKETS) b = KVT_HIST_BUCKETS - 1; /* (the last bucket's: a shift past 63 otherwise) */
    if (b < 2 * HALF) {
        *lo = *hi = b;
        return;
    }
    unsigned e = b / HALF - 1;
    uint64_t m = b - e * HALF;
    *lo = m << e;
    *hi = *lo + ((uint64_t)1 << e) - 1;
}

void kvt_hist_record(kvt_hist_t *h, uint64_t v) {
    h->bucket[kvt_hist_bucket_of(v)]++;
    h->count++;
    h->sum = h->sum > UINT64_MAX - v ? UINT64_MAX : h->sum + v; /* saturates (stats.h) */
    if (v < h->min) h->min = v;
    if (v > h->max) h->max = v;
}

void kvt_hist_merge(kvt_hist_t *dst, const kvt_hist_t *src) {
    for (unsigned i = 0; i < KVT_HIST_BUCKETS; i++) dst->bucket[i] += src->bucket[i];
    dst->count += src->count;
    dst->sum = dst->sum > UINT64_MAX - src->sum ? UINT64_MAX : dst->sum + src->sum;
    if (src->min < dst->min) dst->min = src->min;
    if (src->max > dst->max) dst->max = src->max;
}

uint64_t kvt_hist_percentile(const kvt_hist_t *h, double q) {
    if (h->count == 0) return 0;
    if (!(q > 0)) return h->min;
    if (q >= 1) return h->max;
    uint64_t rank = (uint64_t)ceil(q * (double)h->count);
    if (rank < 1) rank = 1;
    uint64_t seen = 0;
    for (unsigned b = 0; b < KVT_HIST_BUCKETS; b++) {
        seen += h->bucket[b];
        if (seen >= rank) {
            uint64_t lo, hi;
            kvt_hist_bucket_range(b, &lo, &hi);
            uint64_t mid = lo + (hi - lo) / 2;
            if (mid < h->min) mid = h->min;
            if (mid > h->max) mid = h->max;
            return mid;
        }
    }
    return h->max;
}

double kvt_hist_mean(const kvt_hist_t *h) { return h->count ? (double)h->sum / (double)h->count : 0.0; }
