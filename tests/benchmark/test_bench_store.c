/* Smoke-sized kvtier bench store: on dir and on a real redis-server, it
 * runs, prints every (page size, op) with both figures and the ratio, and
 * leaves nothing in the store. Speed is reported, not asserted. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <dirent.h>

#include "common/redis.h"
#include "common/run.h"

static redis_srv_t S;
static void teardown(void) { redis_stop(&S); }

static void check_results(const char *out) {
    cJSON *o = cJSON_Parse(out), *x;
    cr_assert_not_null(o, "%s", out);
    cJSON *res = cJSON_GetObjectItem(o, "results");
    cr_assert_eq(cJSON_GetArraySize(res), 4, "2 sizes x put, get");
    int puts = 0;
    cJSON_ArrayForEach(x, res) {
        const char *op = cJSON_GetObjectItem(x, "op")->valuestring;
        puts += strcmp(op, "put") == 0;
        cr_assert(strcmp(op, "put") == 0 || strcmp(op, "get") == 0);
        double pb = cJSON_GetObjectItem(x, "page_bytes")->valuedouble;
        cr_assert(pb == 4096 || pb == 65536);
        cr_assert_gt(cJSON_GetObjectItem(x, "gbps")->valuedouble, 0);
        cr_assert_gt(cJSON_GetObjectItem(x, "baseline_gbps")->valuedouble, 0);
        cr_assert_gt(cJSON_GetObjectItem(x, "ratio")->valuedouble, 0);
    }
    cr_assert_eq(puts, 2);
    fprintf(stderr, "%s\n", out);
    cJSON_Delete(o);
}

Test(bench_store, dir_smoke, .timeout = 120) {
    char root[] = "/tmp/kvt-bench-store-XXXXXX", url[128];
    cr_assert_not_null(mkdtemp(root));
    snprintf(url, sizeof(url), "dir:%s", root);
    run_result_t r = run_argv((const char *const[]){NULL, "bench", "store", "--l3", url, "--page-bytes", "4096,65536",
                                                    "--total-mb", "2", "--reps", "2", "--json", NULL});
    cr_assert_eq(r.status, 0, "%s", r.err);
    check_results(r.out);
    run_free(&r);
    /* nothing left but empty fan-out folders */
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "test -z \"$(find %s -type f)\" && rm -rf %s", root, root);
    cr_assert_eq(system(cmd), 0, "bench store left files in %s", root);
}

Test(bench_store, redis_smoke, .timeout = 120, .fini = teardown) {
    cr_assert_eq(redis_start(&S, NULL), 0);
    char url[128];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d", S.port);
    run_result_t r = run_argv((const char *const[]){NULL, "bench", "store", "--l3", url, "--page-bytes", "4096,65536",
                                                    "--total-mb", "2", "--reps", "2", "--json", NULL});
    cr_assert_eq(r.status, 0, "%s", r.err);
    check_results(r.out);
    run_free(&r);
    redisReply *d = redis_cmd(S.port, "DBSIZE");
    cr_assert(d && d->type == REDIS_REPLY_INTEGER);
    cr_assert_eq(d->integer, 0, "bench store left keys behind");
    freeReplyObject(d);
}

Test(bench_store, bad_input) {
    run_result_t r = run_argv((const char *const[]){NULL, "bench", "store", NULL});
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "--l3") && strstr(r.err, "required"), "%s", r.err);
    run_free(&r);
    expect_refused((const char *const[]){NULL, "bench", "store", "--l3", "redis://nohostport", NULL},
                   2, "--l3: malformed store URL 'redis://nohostport'");
    expect_refused((const char *const[]){NULL, "bench", "store", "--l3", "http://x", NULL}, 2, "unknown scheme");
    expect_refused((const char *const[]){NULL, "bench", "store", "--l3", "dir:/tmp/x,max=1x", NULL}, 2, "bad max=");
    expect_refused((const char *const[]){NULL, "bench", "store", "--l3", "dir:/tmp/x", "--page-bytes", "65536,", NULL},
                   2, "'65536,' ends with ','");
    expect_refused((const char *const[]){NULL, "bench", "store", "--l3", "dir:/tmp/x", "--page-bytes", "4194304",
                                         "--total-mb", "1", NULL},
                   2, "a page of 4194304 bytes is more than --total-mb 1 MiB");
    expect_refused((const char *const[]){NULL, "bench", "store", "--l3", "dir:/tmp/x", "--page-bytes", "12x", NULL},
                   2, "not a page size");
}
