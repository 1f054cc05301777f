/* Smoke-sized kvtier bench xfer: it runs, prints the fields the issue names
 * for every (page size, layout, pattern, direction), and coalesces what it
 * should (runs per page is a property of the pattern, not of speed). Speed
 * is reported by the benchmark, not asserted. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <sched.h>

#include "common/run.h"

Test(bench_xfer, smoke, .timeout = 300) {
    run_result_t r = run_argv((const char *const[]){NULL, "bench", "xfer", "--total-mb", "16", "--reps", "3",
                                                    "--layout", "both", "--page-bytes", "4096,65536", "--json", NULL});
    cr_assert_eq(r.status, 0, "%s", r.err);
    cJSON *o = cJSON_Parse(r.out);
    cr_assert_not_null(o, "%s", r.out);
    cJSON *res = cJSON_GetObjectItem(o, "results"), *x;
    cr_assert_eq(cJSON_GetArraySize(res), 2 * 3 * 2 * 2 * 2, "sizes x L1 tiers x layouts x patterns x directions");
    int l1_seen[3] = {0, 0, 0};
    cJSON_ArrayForEach(x, res) {
        const char *l1 = cJSON_GetObjectItem(x, "l1")->valuestring;
        l1_seen[0] += strcmp(l1, "arena") == 0;
        l1_seen[1] += strcmp(l1, "engine_kv") == 0;
        l1_seen[2] += strcmp(l1, "engine_mla") == 0;
        double pb = cJSON_GetObjectItem(x, "page_bytes")->valuedouble, pages = 16.0 * 1048576 / pb;
        const char *pattern = cJSON_GetObjectItem(x, "pattern")->valuestring;
        double rpp = cJSON_GetObjectItem(x, "runs_per_page")->valuedouble;
        cr_assert_gt(cJSON_GetObjectItem(x, "gbps")->valuedouble, 0);
        cr_assert_gt(cJSON_GetObjectItem(x, "memcpy_gbps")->valuedouble, 0);
        cr_assert_gt(cJSON_GetObjectItem(x, "ratio")->valuedouble, 0);
        cr_assert(cJSON_IsString(cJSON_GetObjectItem(x, "direction")) && cJSON_IsString(cJSON_GetObjectItem(x, "layout")));
        /* engine_kv's K and V planes take 2 copies per page per layer against a host tier (8 layers
           layer_first, 1 page_first): a run is cut where its copies fill an item (4096) */
        double layers = strcmp(cJSON_GetObjectItem(x, "layout")->valuestring, "layer_first") == 0 ? 8 : 1;
        double per_item = strcmp(l1, "engine_kv") == 0 ? floor(4096 / (2 * layers)) : pages;
        if (strcmp(pattern, "contiguous") == 0) /* one run, cut only at the 64 MiB item cap (and the copy cap) */
            cr_assert_eq(rpp, ceil(pages / per_item) / pages, "contiguous %s %.0f B: %g runs per page", l1, pb, rpp);
        else /* a random permutation: a run only where two neighbours happen to stay neighbours */
            cr_assert_geq(rpp, 0.98, "scattered %.0f B: %g runs per page", pb, rpp);
    }
    for (int k = 0; k < 3; k++) cr_assert_eq(l1_seen[k], 2 * 2 * 2 * 2, "L1 tier %d: every size, layout, pattern, direction", k);
    fprintf(stderr, "%s\n", r.out);
    cJSON_Delete(o);
    run_free(&r);
}

/* The bench checks the bytes each direction moved, outside its clock: a
 * piece spoiled after the check's copy (kvtier-test's hook) fails the run. */
Test(bench_xfer, a_copy_gone_wrong_fails_the_run, .timeout = 120) {
    setenv("KVT_BENCH_XFER_SPOIL", "1", 1);
    run_result_t r = run_argv((const char *const[]){kvtier_test_bin(), "bench", "xfer", "--total-mb", "1", "--reps", "1",
                                                    "--page-bytes", "4096", "--l1", "arena", "--layout", "page_first",
                                                    "--pattern", "scattered", NULL});
    unsetenv("KVT_BENCH_XFER_SPOIL");
    cr_assert_neq(r.status, 0, "%s", r.out);
    cr_assert(strstr(r.err, "d2h of 256 pages of 4096 B: pieces came out wrong"), "%s", r.err);
    run_free(&r);
}

Test(bench_xfer, bad_flags) {
    expect_refused((const char *const[]){NULL, "bench", "xfer", "--pattern", "zigzag", NULL},
                   2, "contiguous|scattered|both");
    expect_refused((const char *const[]){NULL, "bench", "xfer", "--l1", "gpu", NULL},
                   2, "arena|engine_kv|engine_mla|all");
    expect_refused((const char *const[]){NULL, "bench", "xfer", "--cuda-copy", "kernel", NULL}, /* a host L1 */
                   2, "--cuda-copy: is for --l1 cuda");
    expect_refused((const char *const[]){NULL, "bench", "xfer", "--cuda-copy", "sideways", "--l1", "cuda", NULL},
                   2, "auto|dma|kernel");
    expect_refused((const char *const[]){NULL, "bench", "xfer", "--layout", "layer_first", "--page-bytes", "4100", NULL},
                   2, "not a multiple of --layers");
    expect_refused((const char *const[]){NULL, "bench", "xfer", "--layers", "1024", NULL}, /* page_first: one span */
                   2, "--layers: splits layer_first pages");
}

/* --l1 cuda: where a GPU and a CUDA build are, rows of the cuda L1 against the
 * one-block reference (no streaming reference: 0), runs per page a property of
 * the pattern as for the host L1s; elsewhere exit 1 before any copy, naming GPU
 * memory (not a bad flag: 2). */
Test(bench_xfer, cuda_l1_runs_or_says_why, .timeout = 120) {
    run_result_t r = run_argv((const char *const[]){NULL, "bench", "xfer", "--l1", "cuda", "--total-mb", "8", "--reps", "2",
                                                    "--page-bytes", "65536", "--json", NULL});
    if (r.status != 0) {
        cr_assert_eq(r.status, 1, "%s", r.err);
        cr_assert(strstr(r.err, "in GPU memory (a build with CUDA and a GPU)"), "%s", r.err);
        cr_assert_eq(r.out[0], 0, "no results printed: %s", r.out);
        run_free(&r);
        return;
    }
    cJSON *o = cJSON_Parse(r.out), *x;
    cr_assert_not_null(o, "%s", r.out);
    cJSON *res = cJSON_GetObjectItem(o, "results");
    cr_assert_eq(cJSON_GetArraySize(res), 2 * 2, "patterns x directions");
    cJSON_ArrayForEach(x, res) {
        cr_assert_str_eq(cJSON_GetObjectItem(x, "l1")->valuestring, "cuda");
        cr_assert_gt(cJSON_GetObjectItem(x, "memcpy_gbps")->valuedouble, 0, "the one-block reference ran");
        cr_assert_eq(cJSON_GetObjectItem(x, "stream_gbps")->valuedouble, 0);
        double rpp = cJSON_GetObjectItem(x, "runs_per_page")->valuedouble;
        if (strcmp(cJSON_GetObjectItem(x, "pattern")->valuestring, "contiguous") == 0) cr_assert_eq(rpp, 1.0 / 128);
        else cr_assert_geq(rpp, 0.98);
    }
    cJSON_Delete(o);
    run_free(&r);
}

/* --cpus pins the run to CPUs this process may use (the JSON gives the mask
 * read back after pinning: one CPU, where the process may use more), and
 * refuses one it may not use, before any copy. */
Test(bench_xfer, cpus_pin_the_run, .timeout = 120) {
    cpu_set_t allowed;
    cr_assert_eq(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
    int first = -1, outside = -1;
    for (int c = 0; c < CPU_SETSIZE && (first < 0 || outside < 0); c++) {
        if (CPU_ISSET(c, &allowed) && first < 0) first = c;
        if (!CPU_ISSET(c, &allowed) && outside < 0) outside = c;
    }
    char one[16], bad[16];
    snprintf(one, sizeof(one), "%d", first);
    snprintf(bad, sizeof(bad), "%d", outside);
    run_result_t r = run_argv((const char *const[]){NULL, "bench", "xfer", "--total-mb", "4", "--reps", "1", "--l1", "arena",
                                                    "--pattern", "contiguous", "--page-bytes", "65536", "--cpus", one,
                                                    "--json", NULL});
    cr_assert_eq(r.status, 0, "%s", r.err);
    cJSON *o = cJSON_Parse(r.out), *pinned = cJSON_GetObjectItem(o, "pinned_cpus");
    cr_assert(cJSON_IsArray(pinned) && cJSON_GetArraySize(pinned) == 1, "%s", r.out);
    cr_assert_eq(cJSON_GetArrayItem(pinned, 0)->valueint, first);
    cJSON_Delete(o);
    run_free(&r);
    if (outside < 0) return; /* (every CPU there is may be used: none to refuse) */
    r = run_argv((const char *const[]){NULL, "bench", "xfer", "--cpus", bad, NULL});
    cr_assert_eq(r.status, 2);
    char allowed_first[48];
    snprintf(allowed_first, sizeof(allowed_first), "(allowed: %d", first);
    cr_assert(strstr(r.err, "is not one this process may run on") && strstr(r.err, allowed_first), "%s", r.err);
    cr_assert_eq(r.out[0], '\0', "nothing measured: %s", r.out);
    run_free(&r);
}
