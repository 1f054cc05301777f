/* kvtier replay --data --verify on the shipped trace: real bytes through
 * both tiers, every page that comes back checked, and the same hit rates as
 * the id-only replay of the same configuration. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <stdio.h>

#include "common/json.h"
#include "common/prom.h"
#include "common/run.h"

#define TRACE KVT_SOURCE_DIR "/data/mooncake_synthetic_trace.jsonl"
/* Small tiers: both evict, pages load back, and L2 reclaims shadows under
 * every write policy (write_through needs L2 > L1 - its shadows - and a wide
 * L2 free room, or it never both loads and reclaims). */
#define SHAPE "--page-tokens", "64", "--l1-pages", "4096", "--l2-pages", "3000", "--l2-free-room", "0.5"


static void same_hits(const char *policy) {
    run_result_t a = run_argv((const char *const[]){NULL, "replay", TRACE, SHAPE, "--write-policy", policy, "--json", NULL});
    run_result_t b = run_argv((const char *const[]){NULL, "replay", TRACE, SHAPE, "--write-policy", policy, "--data",
                                                    "--verify", "--bytes-per-token", "16", "--json", NULL});
    cJSON *ids = json_of(&a), *data = json_of(&b);
    cr_assert_eq(num(ids, "hit_rate"), num(data, "hit_rate"), "%s: hit rate %.6f without bytes, %.6f with", policy,
                 num(ids, "hit_rate"), num(data, "hit_rate"));
    const char *same[] = {"hit_tokens", "evicted_pages"};
    for (int i = 0; i < 2; i++)
        for (int t = 0; t < 2; t++)
            cr_assert_eq(sub(ids, same[i], t ? "l2" : "l1"), sub(data, same[i], t ? "l2" : "l1"), "%s: %s", policy, same[i]);
    const char *eq[] = {"loads", "backups", "shadows_reclaimed", "dropped_pages"};
    for (int i = 0; i < 4; i++) cr_assert_eq(num(ids, eq[i]), num(data, eq[i]), "%s: %s", policy, eq[i]);
    /* the configuration does what it is for */
    cr_assert_gt(sub(data, "evicted_pages", "l1"), 0, "%s", policy);
    cr_assert_gt(sub(data, "evicted_pages", "l2"), 0, "%s", policy);
    cr_assert_gt(num(data, "loads"), 0, "%s", policy);
    cr_assert_gt(num(data, "shadows_reclaimed"), 0, "%s", policy);
    /* and every byte that came back was right */
    const cJSON *d = cJSON_GetObjectItem(data, "data");
    cr_assert_eq(num(d, "mismatches"), 0, "%s", policy);
    cr_assert_eq(num(d, "failed_copies"), 0, "%s", policy);
    cr_assert_eq(num(d, "verified_loads"), num(data, "loads"), "%s: every load verified", policy);
    cr_assert_eq(sub(d, "h2d", "pages"), num(data, "loads"), "%s: one page copied per load", policy);
    cr_assert_eq(sub(d, "d2h", "pages"), num(data, "backups"), "%s: one page copied per backup", policy);
    cr_assert_eq(sub(d, "d2h", "bytes"), num(data, "backups") * num(d, "page_bytes"), "%s", policy);
    cr_assert_eq(num(d, "page_bytes"), 16 * 64);
    fprintf(stderr, "replay --data %s: hit rate %.4f, %.0f loads verified, %.0f shadows reclaimed, d2h %.2f pages/run\n",
            policy, num(data, "hit_rate"), num(d, "verified_loads"), num(data, "shadows_reclaimed"),
            sub(d, "d2h", "pages") / sub(d, "d2h", "runs"));
    cJSON_Delete(ids);
    cJSON_Delete(data);
    run_free(&a);
    run_free(&b);
}

Test(replay_data, write_through, .timeout = 300) { same_hits("write_through"); }
Test(replay_data, write_through_selective, .timeout = 300) { same_hits("write_through_selective"); }
Test(replay_data, write_back, .timeout = 300) { same_hits("write_back"); }

/* layer_first tiers (a page is `layers` strided pieces) on the same shape. */
Test(replay_data, layer_first, .timeout = 300) {
    run_result_t r = run_argv((const char *const[]){NULL, "replay", TRACE, SHAPE, "--data", "--verify", "--bytes-per-token",
                                                    "64", "--layers", "8", "--layout", "layer_first", "--json", NULL});
    cJSON *o = json_of(&r);
    const cJSON *d = cJSON_GetObjectItem(o, "data");
    cr_assert_str_eq(cJSON_GetObjectItem(d, "layout")->valuestring, "layer_first");
    cr_assert_eq(num(d, "page_bytes"), 64 * 64);
    cr_assert_eq(num(d, "mismatches"), 0);
    cr_assert_gt(num(d, "verified_hits"), 0);
    cJSON_Delete(o);
    run_free(&r);
}

/* A model preset sets the page geometry: qwen3-8b is 36 layers x 8 KV heads
 * x 128 x bf16 x (K, V) = 144 KiB per token. */
Test(replay_data, model_preset_geometry) {
    run_result_t r = run_argv((const char *const[]){NULL, "replay", "--requests", "5", "--model", "qwen3-8b", "--page-tokens",
                                                    "1", "--l1-pages", "64", "--l2-pages", "128", "--data", "--verify",
                                                    "--json", NULL});
    cJSON *o = json_of(&r);
    const cJSON *d = cJSON_GetObjectItem(o, "data");
    cr_assert_eq(num(d, "page_bytes"), 36.0 * 8 * 128 * 2 * 2);
    cr_assert_eq(num(d, "mismatches"), 0);
    cJSON_Delete(o);
    run_free(&r);
}

/* Bad --data uses say what is allowed and exit 2. */
Test(replay_data, bad_flags) {
    struct {
        const char *const *argv;
        const char *want;
    } cases[] = {
        {(const char *const[]){NULL, "replay", "--verify", NULL}, "--verify: needs --data"},
        {(const char *const[]){NULL, "replay", "--data", "--l2-pages", "0", NULL}, "--data: needs an L2 tier"},
        {(const char *const[]){NULL, "replay", "--data", "--l1-pages", "unbounded", NULL}, "--data: needs a bounded L1"},
        {(const char *const[]){NULL, "replay", "--data", NULL}, "more than 60% of this machine"},
        {(const char *const[]){NULL, "replay", "--data", "--layout", "rows", NULL}, "page_first|layer_first"},
        {(const char *const[]){NULL, "replay", "--data", "--threads", "0", NULL}, "--threads"},
        {(const char *const[]){NULL, "replay", "--data", "--bytes-per-token", "100", "--layers", "8", NULL},
         "--layers: 100 bytes per token do not split into 8 layers"},
        {(const char *const[]){kvtier_test_bin(), "replay", "--copy-faults", "0.01", NULL}, "--copy-faults: needs --data"},
        {(const char *const[]){kvtier_test_bin(), "replay", "--data", "--copy-faults", "0.9", NULL}, "--copy-faults"},
        /* the installed command has no fault injection */
        {(const char *const[]){NULL, "replay", "--data", "--copy-faults", "0.01", NULL}, "--copy-faults"},
        {(const char *const[]){NULL, "replay", "--soak", "5", "--sweep", "100,200", NULL}, "--soak: one cache only"},
        {(const char *const[]){NULL, "replay", "--soak", "-1", NULL}, "--soak"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        run_result_t r = run_argv(cases[i].argv);
        cr_assert_eq(r.status, 2, "case %zu: exit %d: %s", i, r.status, r.err);
        cr_assert(strstr(r.err, cases[i].want), "case %zu: '%s' not in: %s", i, cases[i].want, r.err);
        run_free(&r);
    }
}

/* --soak replays pass after pass on one cache; with copy faults on, copies
 * fail and the pages still come back right. The samples are the process's
 * own (/proc/self): from the middle of the run to its end the same
 * descriptors and threads, and kvtier's bytes in use (live bytes less what
 * the tree's node pool holds idle) no higher (but for the batches in
 * flight); the pool itself at most a chunk more. Before the node pool split larger free blocks, they
 * grew by a 16 MiB chunk now and then without end. */
Test(replay_data, soak_passes_with_copy_faults, .timeout = 300) {
    run_result_t r = run_argv((const char *const[]){kvtier_test_bin(), "replay", TRACE, SHAPE, "--limit", "300", "--data", "--verify",
                                                    "--bytes-per-token", "16", "--copy-faults", "0.01", "--soak", "3",
                                                    "--json", NULL});
    cJSON *o = json_of(&r);
    const cJSON *s = cJSON_GetObjectItem(o, "soak"), *d = cJSON_GetObjectItem(o, "data");
    double passes = soak_held_flat(s, 3, r.out);
    cr_assert_eq(num(o, "requests"), 300 * passes, "every pass replays the 300 requests");
    cr_assert_gt(sub(s, "middle", "pass"), 1);
    cr_assert_geq(sub(s, "middle", "at_s"), 0.75, "the first pass past half the time");
    cr_assert_leq(sub(s, "last", "live_bytes"), sub(s, "middle", "live_bytes") + (16 << 20), "more than a pool chunk");
    cr_assert_gt(sub(s, "first", "rss_kb"), 0);
    cr_assert_gt(num(d, "failed_copies"), 0, "the faults were on");
    cr_assert_eq(num(d, "mismatches"), 0);
    cr_assert_gt(num(d, "verified_hits"), 0);
    cJSON_Delete(o);
    run_free(&r);
}

/* --stats prom on real transfers passes Prometheus's own linter: counters end
 * in _total, latencies are histograms in seconds, no family twice. */
Test(replay_data, stats_pass_promtool, .timeout = 300) {
    run_result_t r = run_argv((const char *const[]){NULL, "replay", TRACE, SHAPE, "--data", "--verify", "--bytes-per-token",
                                                    "16", "--json", "--stats", "prom", NULL});
    cr_assert_eq(r.status, 0, "%s", r.err);
    promtool_check(r.err, "replay --data --stats prom");
    const char *want[] = {"# TYPE kvtier_cache_requests_total counter\n", "# TYPE kvtier_tree_nodes gauge\n",
                          "# TYPE kvtier_xfer_l1_to_l2_bytes_total counter\n",
                          "# TYPE kvtier_xfer_l2_to_l1_busy_seconds_total counter\n",
                          "# TYPE kvtier_xfer_l2_to_l1_e2e_seconds histogram\n"};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        cr_assert_not_null(strstr(r.err, want[i]), "'%s' not in: %s", want[i], r.err);
    prom_check_histograms(r.err, "replay --data --stats prom");
    run_free(&r);
}
