/* kvtier replay on hybrid models (docs/hybrid.md), on the shipped trace:
 * known figures where the answer is known (an unbounded cache keeps every
 * window page, so the hybrid cache is the all-full cache), the documented
 * orderings, and the flags' errors. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/json.h"
#include "common/run.h"

#define TRACE KVT_SOURCE_DIR "/data/mooncake_synthetic_trace.jsonl"
#define RUN(...) run_argv((const char *const[]){NULL, "replay", __VA_ARGS__, NULL})

static cJSON *run_of(cJSON *o, int i, const char *what) {
    cJSON *x = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "runs"), i), what);
    cr_assert_not_null(x, "runs[%d].%s", i, what);
    return x;
}

/* Nothing evicted: every window page a request ran over is kept, so every
 * full-group match continues the window group too: the same hits as the
 * radix cache holding every layer, and the same bytes per token. */
Test(replay_hybrid, unbounded_window_model_is_the_all_full_cache, .timeout = 120) {
    run_result_t r = RUN(TRACE, "--model", "gemma-3-like", "--l1-pages", "unbounded", "--l2-pages", "0", "--limit",
                         "600", "--json");
    cJSON *o = json_of(&r);
    cJSON *h = run_of(o, 0, "hybrid"), *f = run_of(o, 0, "every_layer_full");
    cr_assert_gt(num(h, "hit_rate"), 0.1);
    cr_assert_eq(num(h, "hit_rate"), num(f, "hit_rate"), "hybrid %.6f, all full %.6f", num(h, "hit_rate"),
                 num(f, "hit_rate"));
    cr_assert_eq(num(h, "bytes_per_cached_token"), 507904, "10 x 8 KiB full + 52 x 8 KiB window per token");
    cr_assert_eq(num(o, "all_full_bytes_per_token"), 507904);
    cr_assert_eq(num(cJSON_GetObjectItem(h, "stats"), "window_short_tokens"), 0);
    cJSON_Delete(o);
    run_free(&r);
}

/* At the same bytes the hybrid cache holds more of the trace than a cache
 * that keeps every layer as full attention (the figures of docs/hybrid.md). */
Test(replay_hybrid, hybrid_presets_beat_every_layer_full_at_the_same_bytes, .timeout = 300) {
    if (kvt_sanitized_run()) cr_skip_test("a figure on the whole trace: the plain run holds it");
    static const char *const MODELS[] = {"gemma-3-like", "qwen3-next-like", "nemotron-h-like"};
    for (int m = 0; m < 3; m++) {
        run_result_t r = RUN(TRACE, "--model", MODELS[m], "--l1-pages", "16384", "--l2-pages", "0", "--json");
        cJSON *o = json_of(&r);
        cJSON *h = run_of(o, 0, "hybrid"), *f = run_of(o, 0, "every_layer_full");
        double hr = num(h, "hit_rate"), fr = num(f, "hit_rate");
        cr_assert_geq(hr, 1.1 * fr, "%s: hybrid %.4f, all full %.4f", MODELS[m], hr, fr);
        cr_assert_lt(num(h, "bytes_per_cached_token"), 0.5 * num(f, "bytes_per_cached_token"), "%s", MODELS[m]);
        cr_assert_leq(hr, num(h, "full_groups_hit_rate"), "%s: n <= m", MODELS[m]);
        if (m > 0) { /* state at request ends only finds far fewer points to continue from */
            double ends = num(run_of(o, 0, "state_at_ends_only"), "hit_rate");
            cr_assert_lt(ends, 0.5 * hr, "%s: ends only %.4f, hybrid %.4f", MODELS[m], ends, hr);
        }
        cJSON_Delete(o);
        run_free(&r);
    }
}

/* A modeled L3 below small L1 and L2 tiers: both groups' pieces and the
 * full pages go down to it and come back (the hits it serves are counted
 * apart, and add up with L1's and L2's to the hits; the full groups match
 * far more than the same L1 and L2 alone hold), every check of the cache
 * holds along the way. An L1 that holds everything never asks it. */
Test(replay_hybrid, a_modeled_l3_below_small_tiers, .timeout = 120) {
    run_result_t r = RUN(TRACE, "--model", "qwen3-next-like", "--l1-pages", "2048", "--l2-pages", "4096", "--l3-pages",
                         "400000", "--limit", "600", "--check-every", "100", "--json");
    cJSON *o = json_of(&r);
    cJSON *h = run_of(o, 0, "hybrid");
    double hit = num(h, "hit_rate"), l3 = num(h, "l3_hit_rate"), full = num(h, "full_groups_hit_rate");
    cr_assert_gt(l3, 0.5 * hit, "L3 served %.4f of %.4f", l3, hit);
    cr_assert(fabs(num(h, "l1_hit_rate") + num(h, "l2_hit_rate") + l3 - hit) < 1e-9);
    cJSON *g;
    cJSON_ArrayForEach(g, cJSON_GetObjectItem(h, "groups")) cr_assert_gt(num(g, "l3_bytes"), 0, "a group with nothing in L3");
    cr_assert_gt(num(run_of(o, 0, "every_layer_full"), "hit_rate"), 0, "the all-full cache has the same L3");
    cJSON_Delete(o);
    run_free(&r);
    run_result_t n = RUN(TRACE, "--model", "qwen3-next-like", "--l1-pages", "2048", "--l2-pages", "4096", "--limit", "600",
                         "--json");
    o = json_of(&n);
    double without = num(run_of(o, 0, "hybrid"), "hit_rate");
    cr_assert_gt(hit, 5 * without, "with L3 %.4f, without %.4f", hit, without);
    double full_without = num(run_of(o, 0, "hybrid"), "full_groups_hit_rate");
    cr_assert_gt(full, 5 * full_without, "the full pages came back from L3: matched %.4f with it, %.4f without", full,
                 full_without);
    cJSON_Delete(o);
    run_free(&n);
    run_result_t u = RUN(TRACE, "--model", "qwen3-next-like", "--l1-pages", "unbounded", "--l2-pages", "4096", "--l3-pages",
                         "100000", "--limit", "300", "--json");
    o = json_of(&u);
    cr_assert_eq(num(run_of(o, 0, "hybrid"), "l3_hit_rate"), 0);
    cJSON_Delete(o);
    run_free(&u);
}

/* --l3-window-weight splits the L3 alone: in an L3 the trace fills, the
 * window group holds more with it, L1 the same; without an L3 it is
 * refused. The defaults depend on an L3. */
Test(replay_hybrid, the_l3_splits_with_its_own_window_weight, .timeout = 120) {
    double l1_window[2], l3_window[2];
    const char *weights[2] = {"0.125", "0.5"};
    for (int i = 0; i < 2; i++) {
        run_result_t r = RUN(TRACE, "--model", "gemma-3-like", "--l1-pages", "512", "--l2-pages", "1024", "--l3-pages",
                             "4096", "--l3-window-weight", weights[i], "--limit", "150", "--json");
        cJSON *o = json_of(&r);
        cr_assert_eq(num(o, "l3_window_weight"), atof(weights[i]));
        cJSON *window = cJSON_GetArrayItem(cJSON_GetObjectItem(run_of(o, 0, "hybrid"), "groups"), 1);
        l1_window[i] = num(window, "l1_bytes");
        l3_window[i] = num(window, "l3_bytes");
        cJSON_Delete(o);
        run_free(&r);
    }
    cr_assert_eq(l1_window[0], l1_window[1], "L1's split does not change");
    cr_assert_gt(l3_window[1], 1.5 * l3_window[0], "the window group's L3 bytes: %.0f at 0.125, %.0f at 0.5", l3_window[0],
                 l3_window[1]);
    /* by default (hybrid.h): an eighth without an L3; with one, the whole above it and a quarter in it */
    run_result_t d3 = RUN(TRACE, "--model", "gemma-3-like", "--l1-pages", "512", "--l2-pages", "1024", "--l3-pages",
                          "4096", "--limit", "20", "--json"),
                 d0 = RUN(TRACE, "--model", "gemma-3-like", "--l1-pages", "512", "--l2-pages", "1024", "--limit", "20",
                          "--json");
    cJSON *o3 = json_of(&d3), *o0 = json_of(&d0);
    cr_assert(num(o3, "window_weight") == 1.0 && num(o3, "l3_window_weight") == 0.25);
    cr_assert(num(o0, "window_weight") == 0.125 && num(o0, "l3_window_weight") == 0.125);
    cJSON_Delete(o3), cJSON_Delete(o0);
    run_free(&d3), run_free(&d0);
    run_result_t bad = RUN(TRACE, "--model", "gemma-3-like", "--l3-window-weight", "0.5", "--limit", "10");
    cr_assert_eq(bad.status, 2);
    cr_assert(strstr(bad.err, "--l3-window-weight: needs a modeled L3") != NULL, "%s", bad.err);
    run_free(&bad);
}

/* --copy-lag: the pieces' copies are moves reported a few requests late
 * (async_moves), the cache's check holding every 50 requests, and every
 * move handed out reported by the end. */
Test(replay_hybrid, copies_that_land_late, .timeout = 120) {
    run_result_t r = RUN(TRACE, "--model", "gemma-3-like", "--l1-pages", "2048", "--l2-pages", "4096", "--copy-lag", "3",
                         "--limit", "400", "--check-every", "50", "--json");
    cJSON *o = json_of(&r);
    cr_assert_eq(num(o, "copy_lag"), 3);
    cJSON *h = run_of(o, 0, "hybrid");
    cr_assert_gt(num(h, "moves"), 1000);
    cr_assert_gt(num(h, "moves_outstanding_most"), 0);
    cr_assert_gt(num(h, "hit_rate"), 0);
    cJSON_Delete(o);
    run_free(&r);
}

Test(replay_hybrid, groups_from_text_and_their_errors, .timeout = 60) {
    run_result_t r = RUN(TRACE, "--groups", "full:4:4096,state:24:2158592", "--l1-pages", "4096", "--limit", "300",
                         "--json");
    cJSON *o = json_of(&r);
    cr_assert_str_eq(cJSON_GetObjectItem(o, "model")->valuestring, "full:4:4096,state:24:2158592");
    cr_assert_eq(num(o, "all_full_bytes_per_token"), 4 * 4096 + 24 * 4096, "each state layer at the full layers' width");
    cJSON_Delete(o);
    run_free(&r); /* the flags' errors: replay::bad_flags_say_what_is_allowed */
}

Test(replay_hybrid, sweep_table_and_plot, .timeout = 120) {
    char png[64];
    snprintf(png, sizeof(png), "/tmp/kvt-hybrid-test-%d.png", (int)getpid());
    unlink(png);
    run_result_t r = RUN(TRACE, "--model", "qwen3-next-like", "--sweep", "256,1024", "--l2-pages", "0", "--limit",
                         "200", "--plot", png);
    if (access("/usr/bin/gnuplot", X_OK) != 0) {
        cr_assert_eq(r.status, 1);
    } else {
        cr_assert_eq(r.status, 0, "%s", r.err);
        assert_png_and_remove(png);
    }
    cr_assert_not_null(strstr(r.out, "ends only"), "the table: %s", r.out);
    run_free(&r);
}

/* --digest: two runs of one configuration agree on the hybrid cache's
 * decision digest, another policy's run does not, and without the flag
 * there is none. */
Test(replay_hybrid, the_decision_digest_names_the_runs_decisions, .timeout = 120) {
#define SMALL TRACE, "--model", "nemotron-h-like", "--l1-pages", "512", "--l2-pages", "1024", "--limit", "400", "--json"
    run_result_t r[4] = {RUN(SMALL, "--digest"), RUN(SMALL, "--digest"), RUN(SMALL, "--digest", "--policy", "lru"),
                         RUN(SMALL)};
#undef SMALL
    const char *d[4];
    cJSON *o[4];
    for (int i = 0; i < 4; i++) {
        o[i] = json_of(&r[i]);
        const cJSON *x = cJSON_GetObjectItem(run_of(o[i], 0, "hybrid"), "decision_digest");
        cr_assert_eq(x != NULL, i < 3, "run %d: %s", i, x ? "a digest" : "none");
        d[i] = x ? cJSON_GetStringValue(x) : NULL;
    }
    cr_assert_eq(strlen(d[0]), 16u, "%s", d[0]);
    cr_assert_str_eq(d[0], d[1]);
    cr_assert_str_neq(d[0], d[2], "arc and lru decided alike?");
    for (int i = 0; i < 4; i++) cJSON_Delete(o[i]), run_free(&r[i]);
}
