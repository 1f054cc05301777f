/* The emitter's three formats, compared with hand-written expected text. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/emit.h"
#include "core/mem-int.h"
#include "kvtier/rng.h"
#include "kvtier/alloc.h"
#include "kvtier/error.h"
#include "kvtier/stats.h"

static char *render(kvt_fmt_t fmt, int *rc_out) {
    kvt_emitter_t *e;
    cr_assert_eq(kvt_emitter_create(&e, fmt, "kvtier"), KVT_OK);
    kvt_hist_t h;
    kvt_hist_init(&h);
    for (uint64_t v = 1; v <= 100; v++) kvt_hist_record(&h, v); /* p50 = 50, p99 = 99 exactly */
    kvt_emit_begin(e, "alloc");
    kvt_emit_counter(e, "reserves", 42, "successful reserve calls");
    kvt_emit_gauge(e, "free_pages", 7.5, "free pages");
    kvt_emit_end(e);
    kvt_emit_hist(e, "latency_ns", &h, "latency");
    return emit_text(e, rc_out);
}

Test(emitter, table) {
    int rc;
    char *s = render(KVT_FMT_TABLE, &rc);
    cr_assert_eq(rc, KVT_OK);
    cr_assert_str_eq(s,
                     "alloc\n"
                     "  reserves                                       42\n"
                     "  free_pages                                    7.5\n"
                     "latency_ns                                      100  p50 50  p90 90  p99 99  p999 100  max 100\n");
    free(s);
}

/* Prometheus conventions: counters end in _total, ns become seconds, a
 * histogram is cumulative buckets. Every sample (1..100 ns) is below 1 us. */
Test(emitter, prometheus) {
    int rc;
    char *s = render(KVT_FMT_PROM, &rc);
    cr_assert_eq(rc, KVT_OK);
    cr_assert_str_eq(s,
                     "# HELP kvtier_alloc_reserves_total successful reserve calls\n"
                     "# TYPE kvtier_alloc_reserves_total counter\n"
                     "kvtier_alloc_reserves_total 42\n"
                     "# HELP kvtier_alloc_free_pages free pages\n"
                     "# TYPE kvtier_alloc_free_pages gauge\n"
                     "kvtier_alloc_free_pages 7.5\n"
                     "# HELP kvtier_latency_seconds latency\n"
                     "# TYPE kvtier_latency_seconds histogram\n"
                     "kvtier_latency_seconds_bucket{le=\"1e-06\"} 100\n"
                     "kvtier_latency_seconds_bucket{le=\"2e-06\"} 100\n"
                     "kvtier_latency_seconds_bucket{le=\"5e-06\"} 100\n"
                     "kvtier_latency_seconds_bucket{le=\"1e-05\"} 100\n"
                     "kvtier_latency_seconds_bucket{le=\"2e-05\"} 100\n"
                     "kvtier_latency_seconds_bucket{le=\"5e-05\"} 100\n"
                     "kvtier_latency_seconds_bucket{le=\"0.0001\"} 100\n"
                     "kvtier_latency_seconds_bucket{le=\"0.0002\"} 100\n"
                     "kvtier_latency_seconds_bucket{le=\"0.0005\"} 100\n"
                     "kvtier_latency_seconds_bucket{le=\"0.001\"} 100\n"
                     "kvtier_latency_seconds_bucket{le=\"0.002\"} 100\n"
                     "kvtier_latency_seconds_bucket{le=\"0.005\"} 100\n"
                     "kvtier_latency_seconds_bucket{le=\"0.01\"} 100\n"
                     "kvtier_latency_seconds_bucket{le=\"0.02\"} 100\n"
                     "kvtier_latency_seconds_bucket{le=\"0.05\"} 100\n"
                     "kvtier_latency_seconds_bucket{le=\"0.1\"} 100\n"
                     "kvtier_latency_seconds_bucket{le=\"0.2\"} 100\n"
                     "kvtier_latency_seconds_bucket{le=\"0.5\"} 100\n"
                     "kvtier_latency_seconds_bucket{le=\"1\"} 100\n"
                     "kvtier_latency_seconds_bucket{le=\"2\"} 100\n"
                     "kvtier_latency_seconds_bucket{le=\"5\"} 100\n"
                     "kvtier_latency_seconds_bucket{le=\"10\"} 100\n"
                     "kvtier_latency_seconds_bucket{le=\"20\"} 100\n"
                     "kvtier_latency_seconds_bucket{le=\"50\"} 100\n"
                     "kvtier_latency_seconds_bucket{le=\"100\"} 100\n"
                     "kvtier_latency_seconds_bucket{le=\"200\"} 100\n"
                     "kvtier_latency_seconds_bucket{le=\"500\"} 100\n"
                     "kvtier_latency_seconds_bucket{le=\"1000\"} 100\n"
                     "kvtier_latency_seconds_bucket{le=\"+Inf\"} 100\n"
                     "kvtier_latency_seconds_sum 0.00000505\n"
                     "kvtier_latency_seconds_count 100\n");
    free(s);
}

static char *render_prom(kvt_emitter_t *e) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_eq(kvt_emitter_write(e, f), KVT_OK);
    fclose(f);
    kvt_emitter_destroy(e);
    return buf;
}

/* Samples on both sides of the le boundaries, and counts worked out by hand:
 * 999 ns is in bucket [992, 999], so under 1e-06; 1000 ns is in [1000, 1007],
 * which straddles 1e-06, so it counts from 2e-06; 2 s is in a bucket
 * [1996488704, 2013265919] ns that straddles 2, so it counts from 5; 2000 s
 * is past the histogram's range (2^40 ns), so only under +Inf. */
Test(emitter, prometheus_histogram_and_units) {
    kvt_emitter_t *e;
    cr_assert_eq(kvt_emitter_create(&e, KVT_FMT_PROM, "kvtier"), KVT_OK);
    const uint64_t v[] = {0, 999, 1000, 1500, 30000, 3000000, 3000000, 3000000, 2000000000, 2000000000000};
    kvt_hist_t h;
    kvt_hist_init(&h);
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) kvt_hist_record(&h, v[i]);
    kvt_emit_begin(e, "xfer");
    kvt_emit_hist(e, "e2e_ns", &h, NULL);
    kvt_emit_counter(e, "busy_ns", 1500000000, NULL);
    kvt_emit_counter(e, "bytes", 4096, NULL);
    kvt_emit_gauge(e, "wait_ns", 2500, NULL);
    kvt_emit_gauge(e, "pages", 50000, NULL);
    kvt_emit_counter(e, "wait_micros", 2500001, NULL); /* µs: in seconds too */
    kvt_emit_gauge(e, "max_micros", 7, NULL);
    kvt_emit_end(e);
    char *s = render_prom(e);
    cr_assert_str_eq(s,
                     "# TYPE kvtier_xfer_e2e_seconds histogram\n"
                     "kvtier_xfer_e2e_seconds_bucket{le=\"1e-06\"} 2\n"
                     "kvtier_xfer_e2e_seconds_bucket{le=\"2e-06\"} 4\n"
                     "kvtier_xfer_e2e_seconds_bucket{le=\"5e-06\"} 4\n"
                     "kvtier_xfer_e2e_seconds_bucket{le=\"1e-05\"} 4\n"
                     "kvtier_xfer_e2e_seconds_bucket{le=\"2e-05\"} 4\n"
                     "kvtier_xfer_e2e_seconds_bucket{le=\"5e-05\"} 5\n"
                     "kvtier_xfer_e2e_seconds_bucket{le=\"0.0001\"} 5\n"
                     "kvtier_xfer_e2e_seconds_bucket{le=\"0.0002\"} 5\n"
                     "kvtier_xfer_e2e_seconds_bucket{le=\"0.0005\"} 5\n"
                     "kvtier_xfer_e2e_seconds_bucket{le=\"0.001\"} 5\n"
                     "kvtier_xfer_e2e_seconds_bucket{le=\"0.002\"} 5\n"
                     "kvtier_xfer_e2e_seconds_bucket{le=\"0.005\"} 8\n"
                     "kvtier_xfer_e2e_seconds_bucket{le=\"0.01\"} 8\n"
                     "kvtier_xfer_e2e_seconds_bucket{le=\"0.02\"} 8\n"
                     "kvtier_xfer_e2e_seconds_bucket{le=\"0.05\"} 8\n"
                     "kvtier_xfer_e2e_seconds_bucket{le=\"0.1\"} 8\n"
                     "kvtier_xfer_e2e_seconds_bucket{le=\"0.2\"} 8\n"
                     "kvtier_xfer_e2e_seconds_bucket{le=\"0.5\"} 8\n"
                     "kvtier_xfer_e2e_seconds_bucket{le=\"1\"} 8\n"
                     "kvtier_xfer_e2e_seconds_bucket{le=\"2\"} 8\n"
                     "kvtier_xfer_e2e_seconds_bucket{le=\"5\"} 9\n"
                     "kvtier_xfer_e2e_seconds_bucket{le=\"10\"} 9\n"
                     "kvtier_xfer_e2e_seconds_bucket{le=\"20\"} 9\n"
                     "kvtier_xfer_e2e_seconds_bucket{le=\"50\"} 9\n"
                     "kvtier_xfer_e2e_seconds_bucket{le=\"100\"} 9\n"
                     "kvtier_xfer_e2e_seconds_bucket{le=\"200\"} 9\n"
                     "kvtier_xfer_e2e_seconds_bucket{le=\"500\"} 9\n"
                     "kvtier_xfer_e2e_seconds_bucket{le=\"1000\"} 9\n"
                     "kvtier_xfer_e2e_seconds_bucket{le=\"+Inf\"} 10\n"
                     "kvtier_xfer_e2e_seconds_sum 2002.009033499\n"
                     "kvtier_xfer_e2e_seconds_count 10\n"
                     "# TYPE kvtier_xfer_busy_seconds_total counter\n"
                     "kvtier_xfer_busy_seconds_total 1.5\n"
                     "# TYPE kvtier_xfer_bytes_total counter\n"
                     "kvtier_xfer_bytes_total 4096\n"
                     "# TYPE kvtier_xfer_wait_seconds gauge\n"
                     "kvtier_xfer_wait_seconds 2.5e-06\n"
                     "# TYPE kvtier_xfer_pages gauge\n"
                     "kvtier_xfer_pages 50000\n"
                     "# TYPE kvtier_xfer_wait_seconds_total counter\n"
                     "kvtier_xfer_wait_seconds_total 2.500001\n"
                     "# TYPE kvtier_xfer_max_seconds gauge\n"
                     "kvtier_xfer_max_seconds 7e-06\n");
    free(s);
}

/* Random latencies, many of them within 2 % of a 1-2-5 boundary, against a
 * brute-force count of the samples: each bucket line lies between the samples
 * <= le*64/65 (whose bucket, at most 1/64 of its start wide, ends below le)
 * and the samples <= le; lines never decrease, +Inf is the count and the sum
 * is the samples' sum in seconds. */
Test(emitter, prometheus_buckets_against_the_samples) {
    enum { N = 20000 };
    static uint64_t v[N];
    for (uint64_t seed = 1; seed <= 3; seed++) {
        fprintf(stderr, "emitter prometheus buckets: seed %" PRIu64 "\n", seed);
        kvt_rng_t rng;
        kvt_rng_seed(&rng, seed);
        kvt_hist_t h;
        kvt_hist_init(&h);
        uint64_t sum = 0;
        for (int i = 0; i < N; i++) {
            if (kvt_rng_below(&rng, 2)) { /* log-uniform over 1 ns .. 1000 s */
                v[i] = (uint64_t)exp(kvt_rng_unit(&rng) * log(1e12));
            } else { /* near k * 10^d ns, k in 1, 2, 5, from 1 us to 1000 s */
                static const uint64_t k[] = {1, 2, 5};
                uint64_t b = k[kvt_rng_below(&rng, 3)] * (uint64_t)pow(10, 3 + (double)kvt_rng_below(&rng, 10));
                v[i] = b - b / 50 + kvt_rng_below(&rng, b / 25 + 1);
            }
            kvt_hist_record(&h, v[i]);
            sum += v[i];
        }
        kvt_emitter_t *e;
        cr_assert_eq(kvt_emitter_create(&e, KVT_FMT_PROM, "kvtier"), KVT_OK);
        kvt_emit_hist(e, "lat_ns", &h, NULL);
        char *s = render_prom(e);
        int lines = 0;
        unsigned long long prev = 0;
        for (char *p = strstr(s, "_bucket{le=\""); p; p = strstr(p + 1, "_bucket{le=\"")) {
            char le[32];
            unsigned long long got;
            cr_assert_eq(sscanf(p, "_bucket{le=\"%31[^\"]\"} %llu", le, &got), 2, "%.60s", p);
            cr_assert_geq(got, prev, "le=%s: buckets are cumulative", le);
            prev = got;
            lines++;
            if (strcmp(le, "+Inf") == 0) {
                cr_assert_eq(got, N);
                continue;
            }
            double le_ns = strtod(le, NULL) * 1e9;
            unsigned long long lo = 0, hi = 0;
            for (int i = 0; i < N; i++) {
                lo += (double)v[i] * 65 <= le_ns * 64;
                hi += (double)v[i] <= le_ns;
            }
            cr_assert(lo <= got && got <= hi, "le=%s: %llu not in [%llu, %llu] (seed %" PRIu64 ")", le, got, lo, hi, seed);
        }
        cr_assert_eq(lines, 29, "28 boundaries and +Inf");
        double got_sum, want = (double)sum / 1e9;
        cr_assert_eq(sscanf(strstr(s, "_sum "), "_sum %lf", &got_sum), 1);
        cr_assert_float_eq(got_sum, want, want * 1e-12);
        char count[64];
        snprintf(count, sizeof(count), "kvtier_lat_seconds_count %d\n", N);
        cr_assert_not_null(strstr(s, count));
        free(s);
    }
}

/* Two entries that become one family would make the text unparseable. */
Test(emitter, prometheus_refuses_a_family_twice) {
    const char *pairs[][2] = {{"x", "x_total"}, {"busy_ns", "busy_seconds"}, {"y", "y"}};
    for (int i = 0; i < 3; i++) {
        kvt_emitter_t *e;
        cr_assert_eq(kvt_emitter_create(&e, KVT_FMT_PROM, "kvtier"), KVT_OK);
        kvt_emit_begin(e, "s");
        kvt_emit_counter(e, pairs[i][0], 1, NULL);
        if (i == 0) kvt_emit_gauge(e, pairs[i][1], 1, NULL);
        else kvt_emit_counter(e, pairs[i][1], 1, NULL);
        kvt_emit_end(e);
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        cr_assert_eq(kvt_emitter_write(e, f), KVT_EINVAL, "%s and %s", pairs[i][0], pairs[i][1]);
        fclose(f);
        cr_assert_eq(len, 0, "nothing written");
        free(buf);
        kvt_emitter_destroy(e);
    }
    /* a histogram's series named again by a gauge (lat_seconds_count twice: it was written, KVT_OK) */
    kvt_emitter_t *e;
    cr_assert_eq(kvt_emitter_create(&e, KVT_FMT_PROM, "kvt"), KVT_OK);
    kvt_hist_t h;
    kvt_hist_init(&h);
    kvt_hist_record(&h, 1000);
    kvt_emit_hist(e, "lat", &h, NULL);
    kvt_emit_gauge(e, "lat_seconds_count", 3, NULL);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_eq(kvt_emitter_write(e, f), KVT_EINVAL);
    fclose(f);
    cr_assert_eq(len, 0, "nothing written");
    free(buf);
    kvt_emitter_destroy(e);
    cr_assert_eq(kvt_emitter_create(&e, KVT_FMT_PROM, "9lives"), KVT_EINVAL, "not a metric name");
    cr_assert_eq(kvt_emitter_create(&e, KVT_FMT_JSON, "9lives"), KVT_OK);
    kvt_emitter_destroy(e);
}

Test(emitter, json) {
    int rc;
    char *s = render(KVT_FMT_JSON, &rc);
    cr_assert_eq(rc, KVT_OK);
    cJSON *o = cJSON_Parse(s);
    cr_assert_not_null(o, "valid JSON: %s", s);
    cJSON *alloc = cJSON_GetObjectItem(o, "alloc");
    cr_assert_eq(cJSON_GetObjectItem(alloc, "reserves")->valuedouble, 42);
    cr_assert_eq(cJSON_GetObjectItem(alloc, "free_pages")->valuedouble, 7.5);
    cJSON *lat = cJSON_GetObjectItem(o, "latency_ns");
    cr_assert_eq(cJSON_GetObjectItem(lat, "count")->valuedouble, 100);
    cr_assert_eq(cJSON_GetObjectItem(lat, "mean")->valuedouble, 50.5);
    cr_assert_eq(cJSON_GetObjectItem(lat, "p50")->valuedouble, 50);
    cr_assert_eq(cJSON_GetObjectItem(lat, "p99")->valuedouble, 99);
    cr_assert_eq(cJSON_GetObjectItem(lat, "max")->valuedouble, 100);
    cJSON_Delete(o);
    free(s);
}

/* Counters are exact in JSON past 2^53 (and from 10^15, where cJSON's 15
 * digits first fell short: 6251171444815541 read back ...40); the table's
 * integral gauges are whole numbers, not 6 significant digits. */
Test(emitter, big_numbers_are_exact) {
    const uint64_t big[] = {6251171444815541ull, (1ull << 53) + 1, UINT64_MAX};
    kvt_emitter_t *e;
    cr_assert_eq(kvt_emitter_create(&e, KVT_FMT_JSON, "kvtier"), KVT_OK);
    kvt_hist_t h;
    kvt_hist_init(&h);
    kvt_hist_record(&h, big[0]);
    kvt_emit_counter(e, "a", big[0], NULL);
    kvt_emit_counter(e, "b", big[1], NULL);
    kvt_emit_counter(e, "c", big[2], NULL);
    kvt_emit_hist(e, "h", &h, NULL);
    int rc;
    char *s = emit_text(e, &rc);
    cr_assert_eq(rc, KVT_OK);
    char want[64];
    for (int i = 0; i < 3; i++) {
        snprintf(want, sizeof(want), "\"%c\":\t%" PRIu64 ",\n", 'a' + i, big[i]);
        cr_assert_not_null(strstr(s, want), "%s in %s", want, s);
    }
    snprintf(want, sizeof(want), "\"max\":\t%" PRIu64 "\n", big[0]);
    cr_assert_not_null(strstr(s, want), "%s in %s", want, s);
    cJSON *o = cJSON_Parse(s);
    cr_assert_not_null(o, "valid JSON: %s", s);
    cJSON_Delete(o);
    free(s);
    /* gauges: the shortest text that reads back as the double (cJSON's 15 digits read 0.7999999999999999
     * back as 0.8, and wrote 2^53 - 1 in 15 digits); NaN, which JSON has not, as null */
    cr_assert_eq(kvt_emitter_create(&e, KVT_FMT_JSON, "kvtier"), KVT_OK);
    kvt_emit_gauge(e, "g", 0.7999999999999999, NULL);
    kvt_emit_gauge(e, "h", 9007199254740991.0, NULL);
    kvt_emit_gauge(e, "n", NAN, NULL);
    s = emit_text(e, &rc);
    cr_assert_eq(rc, KVT_OK);
    cr_assert_not_null(strstr(s, "\"g\":\t0.7999999999999999,"), "%s", s);
    cr_assert_not_null(strstr(s, "\"h\":\t9007199254740991,"), "%s", s);
    cr_assert_not_null(strstr(s, "\"n\":\tnull"), "%s", s);
    o = cJSON_Parse(s);
    cr_assert_not_null(o, "valid JSON: %s", s);
    cr_assert_eq(cJSON_GetObjectItem(o, "g")->valuedouble, 0.7999999999999999);
    cJSON_Delete(o);
    free(s);
    cr_assert_eq(kvt_emitter_create(&e, KVT_FMT_TABLE, "kvtier"), KVT_OK);
    kvt_emit_gauge(e, "free", 1206643, NULL);
    kvt_emit_gauge(e, "bytes", 149778328, NULL);
    kvt_emit_gauge(e, "third", 1.0 / 3, NULL);
    s = emit_text(e, &rc);
    cr_assert_eq(rc, KVT_OK);
    cr_assert_str_eq(s,
                     "free                                        1206643\n"
                     "bytes                                     149778328\n"
                     "third                              0.3333333333333333\n");
    free(s);
}

/* Two entries of one section named alike: two keys of one JSON object (a
 * reader keeps one), one name twice in the table. Refused in every format,
 * nothing written; the same name in two sections is fine. */
Test(emitter, a_name_twice_in_a_section_is_refused) {
    for (int fmt = KVT_FMT_TABLE; fmt <= KVT_FMT_PROM; fmt++)
        for (int k = 0; k < 3; k++) {
            kvt_emitter_t *e;
            cr_assert_eq(kvt_emitter_create(&e, (kvt_fmt_t)fmt, "kvtier"), KVT_OK);
            kvt_emit_begin(e, "s");
            kvt_emit_counter(e, "x", 1, NULL);
            kvt_emit_end(e);
            kvt_emit_begin(e, "t");
            kvt_emit_counter(e, "x", 1, NULL); /* another section's x */
            kvt_emit_end(e);
            if (k == 0) kvt_emit_counter(e, "s", 2, NULL); /* beside the section s */
            else if (k == 1) {
                kvt_emit_begin(e, "s"); /* the section again */
                kvt_emit_end(e);
            }
            int rc;
            char *s = emit_text(e, &rc);
            cr_assert_eq(rc, k == 2 ? KVT_OK : KVT_EINVAL, "format %d, case %d: %s", fmt, k, s);
            if (k < 2) cr_assert_str_eq(s, "", "nothing written");
            free(s);
        }
}

Test(emitter, errors) {
    kvt_emitter_t *e;
    cr_assert_eq(kvt_emitter_create(&e, KVT_FMT_JSON, "Bad-Prefix"), KVT_EINVAL);
    cr_assert_eq(kvt_emitter_create(&e, (kvt_fmt_t)7, "kvtier"), KVT_EINVAL);
    cr_assert_eq(kvt_emitter_create(&e, KVT_FMT_TABLE, "kvtier"), KVT_OK);
    kvt_emit_begin(e, "open");
    cr_assert_eq(kvt_emitter_write(e, stderr), KVT_EINVAL, "unbalanced");
    kvt_emitter_destroy(e);
    cr_assert_eq(kvt_emitter_create(&e, KVT_FMT_TABLE, "kvtier"), KVT_OK);
    kvt_emit_counter(e, "Has Space", 1, NULL);
    cr_assert_eq(kvt_emitter_write(e, stderr), KVT_EINVAL, "bad name");
    kvt_emitter_destroy(e);
    cr_assert_eq(kvt_emitter_create(&e, KVT_FMT_TABLE, "kvtier"), KVT_OK);
    kvt__mem_fail_nth(1);
    kvt_emit_counter(e, "x", 1, "help");
    kvt__mem_fail_nth(0);
    cr_assert_eq(kvt_emitter_write(e, stderr), KVT_ENOMEM, "a failed building call surfaces at write");
    kvt_emitter_destroy(e);
    kvt_fmt_t fmt;
    cr_assert_eq(kvt_fmt_parse("prom", &fmt), KVT_OK);
    cr_assert_eq(fmt, KVT_FMT_PROM);
    cr_assert_eq(kvt_fmt_parse("yaml", &fmt), KVT_EINVAL);
}

/* The X-macro list emits every field of a stats struct under its own name. */
Test(emitter, stats_struct_from_its_field_list) {
    kvt_extalloc_t *a;
    cr_assert_eq(kvt_extalloc_create(&a, 1000), KVT_OK);
    kvt_extalloc_stats_t st = {.size = sizeof(st)};
    kvt_extalloc_stats(a, &st);
    kvt_emitter_t *e;
    cr_assert_eq(kvt_emitter_create(&e, KVT_FMT_JSON, "kvtier"), KVT_OK);
    KVT_EMIT_STATS(e, &st, KVT_EXTALLOC_STATS_FIELDS);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_eq(kvt_emitter_write(e, f), KVT_OK);
    fclose(f);
    cJSON *o = cJSON_Parse(buf);
    cr_assert_eq(cJSON_GetArraySize(o), 9);
    cr_assert_eq(cJSON_GetObjectItem(o, "pages")->valuedouble, 1000);
    cr_assert_eq(cJSON_GetObjectItem(o, "free_pages")->valuedouble, 1000);
    cr_assert_eq(cJSON_GetObjectItem(o, "largest_free_run")->valuedouble, 1000);
    cJSON_Delete(o);
    free(buf);
    kvt_emitter_destroy(e);
    kvt_extalloc_destroy(a);
}
