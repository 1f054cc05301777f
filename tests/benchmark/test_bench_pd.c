/* Smoke-sized kvtier bench pd: it runs and reports the fields the issue
 * names. Speed is reported by the benchmark, not asserted. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>

#include "common/json.h"
#include "common/run.h"

Test(bench_pd, smoke, .timeout = 120) {
    run_result_t r = run_argv((const char *const[]){NULL, "bench", "pd", "--total-mb", "16", "--reps", "3", "--json", NULL});
    cJSON *o = json_of(&r);
    cr_assert_gt(num(o, "gbps"), 0);
    cr_assert_gt(num(o, "raw_tcp_gbps"), 0);
    cr_assert_gt(num(o, "ratio"), 0);
    cr_assert_str_eq(cJSON_GetObjectItem(o, "transport")->valuestring, "tcp");
    fprintf(stderr, "%s\n", r.out);
    cJSON_Delete(o);
    run_free(&r);
}

/* A run that cannot fit is refused up front with the figures (it failed
 * with "input/output error"). */
Test(bench_pd, too_large_a_run_is_refused) {
    expect_refused((const char *const[]){NULL, "bench", "pd", "--total-mb", "65536", NULL}, 2,
                   "--total-mb: 65536 MiB a run needs 4 x that");
}

/* The pages that landed are checked against the sender's, outside the
 * clock: one spoiled in the receiver (kvtier-test's hook) fails the run. */
Test(bench_pd, a_page_landed_wrong_fails_the_run, .timeout = 120) {
    setenv("KVT_BENCH_PD_SPOIL", "1", 1);
    run_result_t r = run_argv((const char *const[]){kvtier_test_bin(), "bench", "pd", "--total-mb", "2", "--reps", "1", NULL});
    unsetenv("KVT_BENCH_PD_SPOIL");
    cr_assert_eq(r.status, 1, "%s", r.out);
    cr_assert(strstr(r.err, "1 of 32 pages landed wrong"), "%s", r.err);
    run_free(&r);
}
