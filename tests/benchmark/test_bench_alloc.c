/* Smoke-sized runs of kvtier bench alloc, one per pattern: the benchmark
 * runs, its scan baseline agrees with the allocator, and the pool it built
 * is the one asked for. Speed is reported by the benchmark, not asserted. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <math.h>

#include "common/run.h"

static void smoke(const char *pattern) {
    run_result_t r = run_argv((const char *const[]){NULL, "bench", "alloc", "--pattern", pattern, "--pages", "300000",
                                                    "--ops", "20000", "--scan-ops", "10", "--json", NULL});
    cr_assert_eq(r.status, 0, "%s: %s", pattern, r.err);
    cJSON *o = cJSON_Parse(r.out);
    cr_assert_not_null(o);
    double free_pages = cJSON_GetObjectItem(o, "free_pages")->valuedouble;
    double frag = cJSON_GetObjectItem(o, "fragment")->valuedouble;
    if (strcmp(pattern, "churn") == 0) /* churn stops within one request of the target */
        cr_assert_leq(fabs(free_pages / 300000 - frag), 4096.0 / 300000, "%s: free fraction", pattern);
    else
        cr_assert_eq(free_pages, floor(frag * 300000), "%s: free pages", pattern);
    cr_assert_gt(cJSON_GetObjectItem(o, "metadata_bytes_per_page")->valuedouble, 0);
    cJSON *res = cJSON_GetObjectItem(o, "results");
    cJSON *x;
    cJSON_ArrayForEach(x, res) {
        cr_assert_eq(cJSON_GetObjectItem(x, "scan_mismatches")->valuedouble, 0, "%s", pattern);
        cr_assert_gt(cJSON_GetObjectItem(x, "scan_steps")->valuedouble, 0);
        cr_assert_gt(cJSON_GetObjectItem(cJSON_GetObjectItem(x, "reserve_ns"), "p50")->valuedouble, 0);
    }
    fprintf(stderr, "%s\n", r.out); /* the figures, for the log */
    cJSON_Delete(o);
    run_free(&r);
}

Test(bench_alloc, random, .timeout = 300) { smoke("random"); }
Test(bench_alloc, mixed, .timeout = 300) { smoke("mixed"); }
Test(bench_alloc, churn, .timeout = 300) { smoke("churn"); }
