/* kvtier pd over tcp on 127.0.0.1: hand-offs complete and verify, every
 * rank sends, a delayed rank is named the straggler, a killed rank fails the
 * hand-offs that needed it and nothing is left running. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdio.h>

#include "common/json.h"
#include "common/proc.h"
#include "common/prom.h"
#include "common/run.h"

#define TRACE KVT_SOURCE_DIR "/data/mooncake_synthetic_trace.jsonl"


static void handoffs(const char *transport) {
    run_result_t r = run_argv((const char *const[]){NULL, "pd", "--ranks", "4", "--transport", transport, TRACE, "--requests",
                                                    "60", "--json", NULL});
    cJSON *o = json_of(&r);
    cr_assert_eq(num(o, "ranks"), 4);
    cr_assert_str_eq(cJSON_GetObjectItem(o, "transport")->valuestring, transport);
    cr_assert_gt(num(o, "requests"), 30, "hand-offs completed");
    cr_assert_eq(num(o, "mismatches"), 0);
    cr_assert_eq(num(o, "failed"), 0);
    cr_assert_gt(num(o, "bytes"), 0);
    cJSON *per = cJSON_GetObjectItem(o, "per_rank"), *e;
    double bytes = 0;
    cJSON_ArrayForEach(e, per) {
        cr_assert_gt(num(e, "bytes"), 0, "rank %.0f sent", num(e, "rank"));
        cr_assert_gt(num(e, "gbps"), 0);
        cr_assert_geq(num(e, "p99_ms"), 0);
        cr_assert_leq(num(e, "runs"), num(e, "pages"));
        /* a rank's share of a hand-off lands in as many runs as decode's reservation has (usually one) */
        cr_assert_geq(num(e, "runs"), num(e, "batches"));
        cr_assert_lt(num(e, "runs"), num(e, "pages") / 4, "coalesced: %.0f runs for %.0f pages", num(e, "runs"), num(e, "pages"));
        bytes += num(e, "bytes");
    }
    cr_assert_eq(bytes, num(o, "bytes"), "decode received what the ranks sent");
    cr_assert_geq(sub(o, "handoff_ms", "max"), sub(o, "handoff_ms", "p50"));
    cJSON_Delete(o);
    run_free(&r);
}

/* UCX over loopback: UCX_NET_DEVICES=lo, tcp in UCX_TLS (its connection set-up needs it here). */
static bool ucx(void) {
    run_result_t v = run_argv((const char *const[]){NULL, "version", NULL});
    bool built = strstr(v.out, "ucx: yes") != NULL;
    run_free(&v);
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("UCX_TLS", "tcp,self", 1);
    return built;
}

Test(pd, handoffs_complete_and_verify, .timeout = 120) { handoffs("tcp"); }

Test(pd, handoffs_over_ucx, .timeout = 120) {
    if (!ucx()) cr_skip_test("this build has no UCX");
    handoffs("ucx");
}

static void straggler(const char *transport) {
    run_result_t r = run_argv((const char *const[]){NULL, "pd", "--ranks", "4", "--transport", transport, TRACE, "--requests",
                                                    "40", "--window", "8", "--delay-rank", "2:50", "--json", NULL});
    cJSON *o = json_of(&r);
    cJSON *s = cJSON_GetObjectItem(o, "straggler");
    cr_assert(cJSON_IsObject(s), "a straggler is named: %s", r.out);
    cr_assert_eq(num(s, "rank"), 2);
    cr_assert_gt(num(s, "factor"), 3);
    cr_assert_geq(sub(o, "handoff_ms", "p50"), 50, "the delay sets the hand-off time");
    cr_assert_eq(num(o, "mismatches"), 0);
    cJSON_Delete(o);
    run_free(&r);
}

Test(pd, delayed_rank_is_the_straggler, .timeout = 120) { straggler("tcp"); }

Test(pd, delayed_rank_is_the_straggler_over_ucx, .timeout = 120) {
    if (!ucx()) cr_skip_test("this build has no UCX");
    straggler("ucx");
}

static void killed(const char *transport, const char *marker) {
    setenv("KVT_PD_KILL", "2:20", 1);
    run_result_t r = run_argv((const char *const[]){NULL, "pd", "--ranks", "4", "--transport", transport, TRACE, "--requests",
                                                    marker, NULL});
    unsetenv("KVT_PD_KILL");
    cr_assert_eq(r.status, 1, "exit %d: %s", r.status, r.err);
    cr_assert(strstr(r.err, "prefill rank 2 died (signal 9"), "%s", r.err);
    cr_assert(strstr(r.err, "rank 2 vanished"), "decode names the rank: %s", r.err);
    cr_assert(strstr(r.err, "hand-off 20 failed"), "the hand-off it was in: %s", r.err);
    char m[64];
    snprintf(m, sizeof(m), "--requests %s", marker);
    cr_assert_eq(processes_with(m), 0, "nothing left running");
    run_free(&r);
}

Test(pd, killed_rank_fails_its_handoffs, .timeout = 120) { killed("tcp", "63"); }

Test(pd, killed_rank_over_ucx, .timeout = 120) {
    if (!ucx()) cr_skip_test("this build has no UCX");
    killed("ucx", "64");
}

Test(pd, bad_flags) {
    struct {
        const char *const *argv;
        const char *want;
    } cases[] = {
        {(const char *const[]){NULL, "pd", "--transport", "rdma", NULL}, "tcp|ucx"},
        {(const char *const[]){NULL, "pd", "--delay-rank", "9:10", NULL}, "R < --ranks"},
        {(const char *const[]){NULL, "pd", "--delay-rank", "x", NULL}, "expected R:MS"},
        {(const char *const[]){NULL, "pd", "--max-pages", "100", "--decode-pages", "50", NULL}, "must hold one hand-off"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        run_result_t r = run_argv(cases[i].argv);
        cr_assert_eq(r.status, 2, "case %zu: exit %d: %s", i, r.status, r.err);
        cr_assert(strstr(r.err, cases[i].want), "case %zu: '%s' not in: %s", i, cases[i].want, r.err);
        run_free(&r);
    }
}

/* A decode that dies is restarted: the ranks release the pinned pages of the
 * hand-offs lost with it, reconnect, and the hand-offs after it complete. */
Test(pd, decode_restart, .timeout = 120) {
    setenv("KVT_PD_DECODE_KILL", "10", 1);
    run_result_t r = run_argv((const char *const[]){NULL, "pd", "--ranks", "4", TRACE, "--requests", "65",
                                                    "--decode-restarts", "1", "--json", NULL});
    unsetenv("KVT_PD_DECODE_KILL");
    cr_assert_eq(r.status, 1, "lost hand-offs make the run fail: exit %d: %s", r.status, r.err);
    cJSON *o = cJSON_Parse(r.out);
    cr_assert_not_null(o, "%s", r.out);
    cr_assert_eq(num(o, "decode_restarts"), 1);
    cr_assert_gt(num(o, "released_pages"), 0, "the ranks released the pinned pages");
    cr_assert_gt(num(o, "failed"), 0);
    cr_assert_gt(num(o, "requests"), 10, "hand-offs completed after the restart too");
    cr_assert_eq(num(o, "mismatches"), 0);
    cr_assert(strstr(r.err, "decode died (signal 9); restarting it"), "%s", r.err);
    cr_assert(strstr(r.err, "pinned pages released"), "%s", r.err);
    cr_assert_eq(processes_with("--requests 65"), 0, "nothing left running");
    cJSON_Delete(o);
    run_free(&r);
}

/* The statistics as Prometheus text: per rank and for decode. */
Test(pd, stats_as_prometheus_text, .timeout = 60) {
    run_result_t r = run_argv((const char *const[]){NULL, "pd", "--ranks", "2", TRACE, "--requests", "20", "--stats", "prom", NULL});
    cr_assert_eq(r.status, 0, "%s", r.err);
    const char *want[] = {"# TYPE kvtier_pd_rank0_bytes_total counter", "kvtier_pd_rank1_batch_seconds_bucket{le=\"+Inf\"} ",
                          "kvtier_pd_decode_handoffs_total ", "kvtier_pd_decode_handoff_seconds_count "};
    for (int i = 0; i < 4; i++) cr_assert(strstr(r.err, want[i]), "'%s' not in: %s", want[i], r.err);
    prom_check_histograms(r.err, "pd --stats prom");
    promtool_check(r.err, "pd --stats prom");
    run_free(&r);
}
