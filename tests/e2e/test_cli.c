/* The kvtier command as a user meets it: exit codes, messages, output. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>

#include "common/json.h"
#include "common/run.h"

#define RUN(...) run_argv((const char *const[]){NULL, __VA_ARGS__, NULL})

Test(cli, version_and_usage) {
    run_result_t r = RUN("version");
    cr_assert_eq(r.status, 0);
    cr_assert(strncmp(r.out, "kvtier ", 7) == 0, "got: %s", r.out);
    run_free(&r);
    r = run_argv((const char *const[]){NULL, NULL});
    cr_assert_eq(r.status, 2, "no command: usage and exit 2");
    cr_assert_not_null(strstr(r.err, "usage: kvtier"));
    run_free(&r);
    r = RUN("frobnicate");
    cr_assert_eq(r.status, 2);
    cr_assert_not_null(strstr(r.err, "unknown command 'frobnicate'"), "got: %s", r.err);
    run_free(&r);
    r = RUN("bench", "alloc", "--help");
    cr_assert_eq(r.status, 0);
    cr_assert_not_null(strstr(r.out, "--pattern random|mixed|churn"));
    run_free(&r);
    /* -h is every command's help too, never a trace's path */
    static const char *const cmds[][3] = {{"replay", "-h"}, {"cp", "-h"}, {"pd", "-h"}, {"bench", "xfer", "-h"}};
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
        r = run_argv((const char *const[]){NULL, cmds[i][0], cmds[i][1], cmds[i][2], NULL});
        cr_assert_eq(r.status, 0, "%s %s: exit %d (%s)", cmds[i][0], cmds[i][1], r.status, r.err);
        cr_assert_not_null(strstr(r.out, "usage: kvtier"), "%s: %s", cmds[i][0], r.out);
        run_free(&r);
    }
    r = RUN("help", "replay"); /* a command's help */
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.out, "usage: kvtier replay"), "%s", r.out);
    run_free(&r);
    static const char *const helps[][2] = {{"help", "--help"}, {"help", "help"}, {"help", "version"}, {"--help", "replay"},
                                           {"bench", "--help"}, {"help", "bench"}};
    for (size_t i = 0; i < sizeof(helps) / sizeof(helps[0]); i++) {
        r = run_argv((const char *const[]){NULL, helps[i][0], helps[i][1], NULL});
        cr_assert_eq(r.status, 0, "%s %s: exit %d (%s)", helps[i][0], helps[i][1], r.status, r.err);
        cr_assert_not_null(strstr(r.out, "usage: kvtier"), "%s %s: %s", helps[i][0], helps[i][1], r.out);
        run_free(&r);
    }
    r = RUN("help", "frobnicate");
    cr_assert_eq(r.status, 2);
    cr_assert_not_null(strstr(r.err, "unknown command 'frobnicate'"), "%s", r.err);
    run_free(&r);
    r = RUN("version", "extra"); /* an argument nothing reads is refused */
    cr_assert_eq(r.status, 2);
    cr_assert_not_null(strstr(r.err, "takes no arguments"), "%s", r.err);
    run_free(&r);
    r = RUN("pd", "data/mooncake_synthetic_trace.jsonl", "--seed", "7");
    cr_assert_eq(r.status, 2, "pd: --seed shapes the synthetic workload only");
    cr_assert_not_null(strstr(r.err, "--seed"), "%s", r.err);
    run_free(&r);
}

/* Each bad flag: exit 2, a message naming the flag and what is allowed, and
 * no benchmark output. */
Test(cli, bad_flags_say_what_is_allowed) {
    static const struct { const char *args[4]; const char *msg; } cases[] = {
        {{"--pattern", "zigzag"}, "--pattern: 'zigzag' is not one of random|mixed|churn"},
        {{"--pages", "10"}, "--pages: '10' is not an integer in [1024, 4294967295]"},
        {{"--pages", "-5"}, "--pages: '-5' is not an integer in [1024, 4294967295]"},
        {{"--pages=12abc"}, "--pages: '12abc' is not an integer"},
        {{"--fragment", "1"}, "--fragment: '1' is not a number in (0, 1)"},
        {{"--fragment", "nan"}, "--fragment: 'nan' is not a number in (0, 1)"},
        {{"--sizes", "1,x"}, "--sizes: 'x' is not an integer in [1, 1048576]"},
        {{"--sizes", "1,,8"}, "--sizes: '1,,8': expected a comma-separated list of integers (an element is empty)"},
        {{"--sizes", "5000", "--pages", "2000"}, "--sizes: size 5000 is larger than the pool (2000 pages)"},
        {{"--stats", "xml"}, "--stats: 'xml' is not one of table|json|prom"},
        {{"--ops"}, "--ops: missing value"},
        {{"--bogus"}, "--bogus: unknown flag"},
        {{"stray"}, "unexpected argument 'stray'"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *argv[8] = {NULL, "bench", "alloc"};
        int n = 3;
        for (int j = 0; j < 4 && cases[i].args[j]; j++) argv[n++] = cases[i].args[j];
        argv[n] = NULL;
        run_result_t r = run_argv(argv);
        cr_assert_eq(r.status, 2, "case %zu: exit %d", i, r.status);
        cr_assert_not_null(strstr(r.err, cases[i].msg), "case %zu: stderr was: %s", i, r.err);
        cr_assert_str_eq(r.out, "", "case %zu: no output on a bad flag", i);
        run_free(&r);
    }
}

/* The JSON is one object with the documented fields, and its figures agree
 * with what the parameters imply. */
Test(cli, bench_alloc_json, .timeout = 120) {
    run_result_t r = RUN("bench", "alloc", "--pages", "50000", "--ops", "3000", "--scan-ops", "5", "--sizes",
                         "1,8,64,512", "--fragment", "0.25", "--json", "--stats", "prom");
    cr_assert_eq(r.status, 0, "stderr: %s", r.err);
    cJSON *o = cJSON_Parse(r.out);
    cr_assert_not_null(o, "stdout is JSON: %s", r.out);
    cr_assert_eq(num(o, "pages"), 50000);
    cr_assert_eq(num(o, "page_bytes"), 16384);
    cr_assert_float_eq(num(o, "pool_gb"), 50000.0 * 16384 / 1e9, 1e-9);
    cr_assert_eq(num(o, "fragment"), 0.25);
    cr_assert_str_eq(cJSON_GetObjectItem(o, "pattern")->valuestring, "random");
    cr_assert_eq(num(o, "free_pages"), 12500, "random pattern frees exactly fragment x pages");
    cr_assert_float_eq(num(o, "metadata_bytes_per_page"), num(o, "metadata_bytes") / 50000, 1e-9);
    cJSON *res = cJSON_GetObjectItem(o, "results");
    cr_assert_eq(cJSON_GetArraySize(res), 4);
    const double sizes[] = {1, 8, 64, 512};
    for (int i = 0; i < 4; i++) {
        cJSON *x = cJSON_GetArrayItem(res, i);
        cr_assert_eq(num(x, "size"), sizes[i]);
        cr_assert_eq(num(x, "scan_mismatches"), 0, "the scan baseline gave the same pages");
        cr_assert_eq(num(x, "scan_steps"), 5);
        cr_assert_eq(num(x, "reserve_failures"), 0);
        if (sizes[i] == 1) cr_assert_eq(num(x, "runs_mean"), 1);
        cr_assert_geq(num(x, "runs_mean"), 1);
        cr_assert_leq(num(x, "runs_mean"), sizes[i]);
        const char *hists[] = {"reserve_ns", "free_ns", "scan_ns", "first_fit_scan_ns"};
        for (int h = 0; h < 4; h++) {
            cJSON *p = cJSON_GetObjectItem(x, hists[h]);
            double p50 = num(p, "p50"), p90 = num(p, "p90"), p99 = num(p, "p99"), p999 = num(p, "p999"),
                   mx = num(p, "max");
            cr_assert(0 < p50 && p50 <= p90 && p90 <= p99 && p99 <= p999 && p999 <= mx, "%s ordered", hists[h]);
        }
        cr_assert_float_eq(num(x, "speedup_p50"),
                           num(cJSON_GetObjectItem(x, "scan_ns"), "p50") / num(cJSON_GetObjectItem(x, "reserve_ns"), "p50"),
                           1e-6);
    }
    cr_assert_not_null(strstr(r.err, "kvtier_extalloc_free_pages 12500"), "--stats prom on stderr: %s", r.err);
    cJSON_Delete(o);
    run_free(&r);
}
