/* Smoke-sized runs of kvtier bench alloc, one per pattern: the benchmark
 * runs, its scan baseline agrees with the allocator, and the pool it built
 * is the one asked for. Speed is reported by the benchmark, not asserted. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <unistd.h>

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

/* A size no reservation can take is said in the table (it showed zeros
 * and a 0x speedup as if measured), and the pool's free fraction is shown. */
Test(bench_alloc, failed_reservations_are_shown, .timeout = 60) {
    run_result_t r = run_argv((const char *const[]){NULL, "bench", "alloc", "--pages", "2048", "--fragment", "0.01",
                                                    "--sizes", "1024", "--ops", "100", "--scan-ops", "2",
                                                    "--scan-budget-s", "0.1", NULL});
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.out, "every reservation of 1024 pages failed: the pool has 20 free"), "%s", r.out);
    cr_assert_not_null(strstr(r.out, "fragment 0.01 (0.01 free)"), "%s", r.out);
    run_free(&r);
}

/* A pool whose metadata cannot fit is refused up front (64 GiB at 16 bytes a page). */
Test(bench_alloc, too_large_a_pool_is_refused) {
    double mem = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (0.6 * mem >= 4294967295.0 * 16) cr_skip_test("this machine holds such a pool");
    expect_refused((const char *const[]){NULL, "bench", "alloc", "--pages", "4294967295", NULL}, 2,
                   "--pages: 4294967295 pages need up to 64.0 GiB");
}

Test(bench_alloc, an_empty_list_element_is_refused) {
    expect_refused((const char *const[]){NULL, "bench", "alloc", "--sizes", "1,,8", NULL}, 2, "an element is empty");
    expect_refused((const char *const[]){NULL, "bench", "alloc", "--sizes", "1,8,", NULL}, 2, "an element is empty");
}
