/* The emitter's three formats, compared with hand-written expected text. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <stdio.h>

#include "core/mem-int.h"
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
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    *rc_out = kvt_emitter_write(e, f);
    fclose(f);
    kvt_emitter_destroy(e);
    return buf;
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

Test(emitter, prometheus) {
    int rc;
    char *s = render(KVT_FMT_PROM, &rc);
    cr_assert_eq(rc, KVT_OK);
    cr_assert_str_eq(s,
                     "# HELP kvtier_alloc_reserves successful reserve calls\n"
                     "# TYPE kvtier_alloc_reserves counter\n"
                     "kvtier_alloc_reserves 42\n"
                     "# HELP kvtier_alloc_free_pages free pages\n"
                     "# TYPE kvtier_alloc_free_pages gauge\n"
                     "kvtier_alloc_free_pages 7.5\n"
                     "# HELP kvtier_latency_ns latency\n"
                     "# TYPE kvtier_latency_ns summary\n"
                     "kvtier_latency_ns{quantile=\"0.5\"} 50\n"
                     "kvtier_latency_ns{quantile=\"0.9\"} 90\n"
                     "kvtier_latency_ns{quantile=\"0.99\"} 99\n"
                     "kvtier_latency_ns{quantile=\"0.999\"} 100\n"
                     "kvtier_latency_ns{quantile=\"1\"} 100\n"
                     "kvtier_latency_ns_sum 5050\n"
                     "kvtier_latency_ns_count 100\n");
    free(s);
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
