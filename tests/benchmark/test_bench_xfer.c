/* Smoke-sized kvtier bench xfer: it runs, prints the fields the issue names
 * for every (page size, layout, pattern, direction), and coalesces what it
 * should (runs per page is a property of the pattern, not of speed). Speed
 * is reported by the benchmark, not asserted. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <math.h>

#include "common/run.h"

Test(bench_xfer, smoke, .timeout = 300) {
    run_result_t r = run_argv((const char *const[]){NULL, "bench", "xfer", "--total-mb", "16", "--reps", "3",
                                                    "--layout", "both", "--page-bytes", "4096,65536", "--json", NULL});
    cr_assert_eq(r.status, 0, "%s", r.err);
    cJSON *o = cJSON_Parse(r.out);
    cr_assert_not_null(o, "%s", r.out);
    cJSON *res = cJSON_GetObjectItem(o, "results"), *x;
    cr_assert_eq(cJSON_GetArraySize(res), 2 * 2 * 2 * 2, "sizes x layouts x patterns x directions");
    cJSON_ArrayForEach(x, res) {
        double pb = cJSON_GetObjectItem(x, "page_bytes")->valuedouble, pages = 16.0 * 1048576 / pb;
        const char *pattern = cJSON_GetObjectItem(x, "pattern")->valuestring;
        double rpp = cJSON_GetObjectItem(x, "runs_per_page")->valuedouble;
        cr_assert_gt(cJSON_GetObjectItem(x, "gbps")->valuedouble, 0);
        cr_assert_gt(cJSON_GetObjectItem(x, "memcpy_gbps")->valuedouble, 0);
        cr_assert_gt(cJSON_GetObjectItem(x, "ratio")->valuedouble, 0);
        cr_assert(cJSON_IsString(cJSON_GetObjectItem(x, "direction")) && cJSON_IsString(cJSON_GetObjectItem(x, "layout")));
        if (strcmp(pattern, "contiguous") == 0) /* one run, cut only at the 64 MiB item cap */
            cr_assert_eq(rpp, 1 / pages, "contiguous %.0f B: %g runs per page", pb, rpp);
        else /* a random permutation: a run only where two neighbours happen to stay neighbours */
            cr_assert_geq(rpp, 0.98, "scattered %.0f B: %g runs per page", pb, rpp);
    }
    fprintf(stderr, "%s\n", r.out);
    cJSON_Delete(o);
    run_free(&r);
}

Test(bench_xfer, bad_flags) {
    run_result_t r = run_argv((const char *const[]){NULL, "bench", "xfer", "--pattern", "zigzag", NULL});
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "contiguous|scattered|both"), "%s", r.err);
    run_free(&r);
    r = run_argv((const char *const[]){NULL, "bench", "xfer", "--layout", "layer_first", "--page-bytes", "4100", NULL});
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "not a multiple of --layers"), "%s", r.err);
    run_free(&r);
}
