/* kvtier — statistics: latency histograms and one emitter for every format.
 *
 * Histogram: log-linear buckets over nanoseconds, HDR-style. Values below 128
 * have a bucket each; above, every power of two is cut into 64 buckets, so a
 * reported percentile (the middle of its bucket) is within 0.8 % of the true
 * sample. Range 0 ns .. 2^40 ns (18 minutes); larger values land in the top
 * bucket and still set `max` exactly. Recording is O(1) and allocation-free;
 * merging is a bucket-wise sum, so per-thread histograms combine exactly.
 *
 * Emitter: modules describe their statistics once (sections, counters,
 * gauges, histograms) and the emitter writes them as an aligned table, as JSON
 * (through cJSON) or as Prometheus text exposition.
 *
 * Prometheus text keeps Prometheus's conventions (promtool check metrics
 * passes), so it renames what the table and JSON show: sections become name
 * prefixes ("kvtier_cache_..."); a counter gets `_total`; a counter or gauge
 * named `..._ns` becomes `..._seconds` with its value in seconds; a histogram
 * (always ns) becomes `TYPE histogram` named `..._seconds` (`_ns` replaced,
 * else appended), with cumulative `_bucket{le}` lines at the fixed 1-2-5 set
 * 1e-06 .. 1000 seconds and +Inf, `_sum` in seconds and `_count`. A bucket
 * line counts only samples whose log-linear bucket lies wholly <= le, so a
 * sample within 1/64 (1.6 %) below an le may count from the next one up.
 *
 * Threads: a histogram has no lock (record on one thread, or one histogram
 * per thread and merge them); an emitter is built and written on one thread.
 * kvt_now_ns: any thread.
 */
#ifndef KVTIER_STATS_H
#define KVTIER_STATS_H

#include "kvtier/export.h"

#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_HIST_SUB_BITS 6 /* 64 buckets per power of two */
#define KVT_HIST_MAX_LOG2 40
#define KVT_HIST_BUCKETS ((KVT_HIST_MAX_LOG2 - KVT_HIST_SUB_BITS + 1) << KVT_HIST_SUB_BITS)

typedef struct kvt_hist {
    uint64_t count;
    uint64_t sum; /* saturates at UINT64_MAX (584 years of nanoseconds) */
    uint64_t min; /* UINT64_MAX while empty */
    uint64_t max;
    uint64_t bucket[KVT_HIST_BUCKETS];
} kvt_hist_t;

/* Monotonic nanoseconds (CLOCK_MONOTONIC): the clock every kvtier latency
 * is measured with. Any thread. */
KVT_API uint64_t kvt_now_ns(void);

KVT_API void kvt_hist_init(kvt_hist_t *h);
KVT_API void kvt_hist_record(kvt_hist_t *h, uint64_t v);
KVT_API void kvt_hist_merge(kvt_hist_t *dst, const kvt_hist_t *src);
/* The nearest-rank q-quantile (q in [0, 1]): the sample of rank ceil(q*count),
 * to bucket precision, clamped to [min, max]; 0 for an empty histogram.
 * q = 1 gives max exactly, q = 0 min exactly. */
KVT_API uint64_t kvt_hist_percentile(const kvt_hist_t *h, double q);
KVT_API double kvt_hist_mean(const kvt_hist_t *h);

/* Bucket of a value and the value range [lo, hi] a bucket stands for (a
 * bucket past the last: the last's). */
KVT_API unsigned kvt_hist_bucket_of(uint64_t v);
KVT_API void kvt_hist_bucket_range(unsigned b, uint64_t *lo, uint64_t *hi);

/* ---- emitter ---- */

typedef enum kvt_fmt {
    KVT_FMT_TABLE = 0,
    KVT_FMT_JSON = 1,
    KVT_FMT_PROM = 2
} kvt_fmt_t;

/* "table", "json" or "prom" -> *fmt; KVT_EINVAL otherwise. */
KVT_API int kvt_fmt_parse(const char *s, kvt_fmt_t *fmt);

typedef struct kvt_emitter kvt_emitter_t;

/* `prefix` names the whole tree (Prometheus metric prefix, e.g. "kvtier";
 * for KVT_FMT_PROM it must not start with a digit). KVT_EINVAL, KVT_ENOMEM. */
KVT_API int kvt_emitter_create(kvt_emitter_t **out, kvt_fmt_t fmt, const char *prefix);
KVT_API void kvt_emitter_destroy(kvt_emitter_t *e);

/* Building calls. They record into the emitter; a failure to allocate is
 * remembered and reported by kvt_emitter_write, so callers need not check
 * every call. Names must be [a-z0-9_], at most 63 characters. */
KVT_API void kvt_emit_begin(kvt_emitter_t *e, const char *section);
KVT_API void kvt_emit_end(kvt_emitter_t *e);
KVT_API void kvt_emit_counter(kvt_emitter_t *e, const char *name, uint64_t v, const char *help);
KVT_API void kvt_emit_gauge(kvt_emitter_t *e, const char *name, double v, const char *help);
/* A latency histogram in ns: count, p50, p90, p99, p999, max in the table,
 * and the mean too in JSON; buckets in seconds in Prometheus text (see the
 * top). */
KVT_API void kvt_emit_hist(kvt_emitter_t *e, const char *name, const kvt_hist_t *h, const char *help);

/* Writes everything recorded: counters and histograms' counts and
 * percentiles as exact integers in every format, gauges as the shortest
 * text that reads back as the double (integers as integers), with '.' as
 * the decimal point whatever the locale. KVT_ENOMEM if a building call (or
 * the writer) failed to allocate; KVT_EINVAL, nothing written, for
 * unbalanced begin/end, a bad name, two entries of one section with the same
 * name, or, in Prometheus text, two entries that name the same metric
 * family; KVT_EIO. */
KVT_API int kvt_emitter_write(kvt_emitter_t *e, FILE *f);

/* Emits every field of a stats struct described by an X-macro list of
 * X(field, KIND, help), KIND being COUNTER or GAUGE (see alloc.h):
 *     KVT_EMIT_STATS(e, &st, KVT_EXTALLOC_STATS_FIELDS);  */
#define KVT_EMIT_FIELD_COUNTER(e, st, f, help) kvt_emit_counter((e), #f, (uint64_t)(st)->f, (help))
#define KVT_EMIT_FIELD_GAUGE(e, st, f, help) kvt_emit_gauge((e), #f, (double)(st)->f, (help))
#define KVT_EMIT_STATS(e, st, LIST)                   \
    do {                                              \
        kvt_emitter_t *kvt_emit_e_ = (e);             \
        const __typeof__(*(st)) *kvt_emit_st_ = (st); \
        LIST(KVT_EMIT_STATS_ONE_)                     \
    } while (0)
#define KVT_EMIT_STATS_ONE_(f, kind, help) KVT_EMIT_FIELD_##kind(kvt_emit_e_, kvt_emit_st_, f, help);

#ifdef __cplusplus
}
#endif
#endif
