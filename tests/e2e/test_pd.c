/* kvtier pd over tcp on 127.0.0.1: hand-offs complete and verify, every
 * rank sends, a delayed rank is named the straggler, a killed rank fails the
 * hand-offs that needed it and nothing is left running. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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
    /* the requests too short to give each of the 4 ranks a page (64 tokens) are counted, not lost */
    FILE *f = fopen(TRACE, "r");
    char line[1 << 16];
    int short_ = 0;
    for (int i = 0; i < 60 && fgets(line, sizeof(line), f); i++) {
        cJSON *q = cJSON_Parse(line);
        short_ += num(q, "input_length") / 64 < 4;
        cJSON_Delete(q);
    }
    fclose(f);
    cr_assert_eq(num(o, "too_short"), short_);
    cr_assert_eq(num(o, "requests") + num(o, "too_short") + num(o, "not_attempted"), 60);
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
    run_result_t r = run_argv((const char *const[]){kvtier_test_bin(), "pd", "--ranks", "4", "--transport", transport, TRACE, "--requests",
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
        {(const char *const[]){NULL, "pd", "--ranks", "8", "--max-pages", "4", NULL},
         "--max-pages: 4 is fewer than --ranks (8): a hand-off gives every rank at least one page"},
        {(const char *const[]){NULL, "pd", "--delay-rank", "1:99999999999999999999", NULL}, "MS <= 600000"},
        {(const char *const[]){NULL, "pd", "--delay-rank", "1:600001", NULL}, "MS <= 600000"},
        {(const char *const[]){NULL, "pd", "--delay-rank", "1: 5", NULL}, "expected R:MS"},
        {(const char *const[]){NULL, "pd", "--delay-rank", "-1:5", NULL}, "expected R:MS"},
        /* a 48.8 TiB pool: refused up front with the numbers, not "set-up failed" */
        {(const char *const[]){NULL, "pd", "--ranks", "2", TRACE, "--page-tokens", "512", "--bytes-per-token", "1048576",
                               "--decode-pages", "100000", NULL},
         "--decode-pages: 50129.0 GiB of pages (decode's 100000 + 2 ranks' lanes of 129 pages of 524288.0 KiB) is more "
         "than 60% of this machine's"},
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
    run_result_t r = run_argv((const char *const[]){kvtier_test_bin(), "pd", "--ranks", "4", TRACE, "--requests", "65",
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

/* Bad peers on both of decode's ports, queued before any rank can connect
 * (KVT_PD_TEST_PEERS makes decode open them against itself, so they are
 * first in line: no race to win). Before the fix the first silent control
 * connection blocked decode's read of its hello for good. The real ranks
 * join past them, every hand-off completes, and every bad peer is reported:
 * on stderr, in --json and in --stats. */
Test(pd, bad_peers_are_turned_away_and_shown, .timeout = 60) {
    setenv("KVT_PD_TEST_PEERS", "stall:50,rank0,garbage,data-garbage,data-geometry,data-huge,data-outside,data-wrap,data-stall:5", 1);
    run_result_t r = run_argv((const char *const[]){kvtier_test_bin(), "pd", "--ranks", "4", TRACE, "--requests", "40", "--json", NULL});
    run_result_t s = run_argv((const char *const[]){kvtier_test_bin(), "pd", "--ranks", "2", TRACE, "--requests", "10", "--stats", "json", NULL});
    unsetenv("KVT_PD_TEST_PEERS");
    cJSON *o = json_of(&r);
    cr_assert_eq(num(o, "failed"), 0, "%s", r.err);
    cr_assert_eq(num(o, "not_attempted"), 0);
    cr_assert_eq(num(o, "mismatches"), 0);
    cJSON *bp = cJSON_GetObjectItem(o, "bad_peers");
    cr_assert(cJSON_IsObject(bp), "%s", r.out);
    cr_assert_eq(num(bp, "control_dropped"), 52, "50 silent, a rank 0 without the token, garbage");
    cr_assert_eq(num(bp, "data_refused"), 1, "the wrong geometry");
    cr_assert_eq(num(bp, "data_malformed"), 4, "garbage, 2^40 bytes, outside the pool, a wrapping offset");
    cr_assert_eq(num(bp, "data_silent"), 5, "silent at the end");
    cr_assert(strstr(r.err, "decode turned peers away: data port 1 hellos refused, 4 malformed or silent, 5 still silent"
                            " at the end"), "%s", r.err);
    cr_assert(strstr(r.err, "control port 52 dropped"), "%s", r.err);
    cr_assert_eq(s.status, 0, "%s", s.err);
    cr_assert(strstr(s.err, "\"control_bad_peers\":\t52") || strstr(s.err, "\"control_bad_peers\": 52"), "--stats: %s", s.err);
    cJSON_Delete(o);
    run_free(&r);
    run_free(&s);
}

/* Peers cut off mid-message (the stall campaign of tests/faults/run): half a
 * hello on the control port, half a hello and half a page on the data port,
 * then silence. The ranks join past them, every hand-off lands byte for
 * byte, and they are reported. Before the data port asked for the group's
 * token, a stranger's half page landed in a page of a hand-off in flight
 * (found by tests/faults/run stall: 1 page mismatched in 25 runs). */
Test(pd, half_messages_do_not_stop_the_handoffs, .timeout = 60) {
    setenv("KVT_PD_TEST_PEERS", "half:3,data-half-hello:2,data-half:2", 1);
    run_result_t r = run_argv((const char *const[]){kvtier_test_bin(), "pd", "--ranks", "3", TRACE, "--requests", "40", "--json", NULL});
    unsetenv("KVT_PD_TEST_PEERS");
    cJSON *o = json_of(&r);
    cr_assert_eq(num(o, "failed"), 0, "%s", r.err);
    cr_assert_eq(num(o, "not_attempted"), 0);
    cr_assert_eq(num(o, "mismatches"), 0);
    cJSON *bp = cJSON_GetObjectItem(o, "bad_peers");
    cr_assert_eq(num(bp, "control_dropped"), 3, "three half hellos: %s", r.err);
    cr_assert_eq(num(bp, "data_silent"), 2, "the half hellos on the data port: %s", r.err);
    cr_assert_eq(num(bp, "data_refused"), 2, "the half pages of peers without the token, refused at their hello");
    cJSON_Delete(o);
    run_free(&r);
}

/* Silent control peers time out (HELLO_TIMEOUT_MS, 2 s) while the group
 * forms: decode holds its ports back from the ranks for 2.5 s. */
Test(pd, silent_control_peers_time_out, .timeout = 60) {
    setenv("KVT_PD_TEST_PEERS", "stall:3,hold:2500", 1);
    run_result_t r = run_argv((const char *const[]){kvtier_test_bin(), "pd", "--ranks", "2", TRACE, "--requests", "10", "--json", NULL});
    unsetenv("KVT_PD_TEST_PEERS");
    cJSON *o = json_of(&r);
    cJSON *bp = cJSON_GetObjectItem(o, "bad_peers");
    cr_assert_eq(num(bp, "control_dropped"), 3);
    cr_assert_str_eq(cJSON_GetObjectItem(bp, "control_last_error")->valuestring,
                     "control port: a peer said no hello within 2000 ms");
    cr_assert_eq(num(o, "failed"), 0);
    cJSON_Delete(o);
    run_free(&r);
}

/* A decode that dies with no restart to come: the ranks stop waiting at
 * once and say why themselves (before the coordinator's grace ends), and
 * hand-offs never attempted are not counted as failed. */
Test(pd, dead_decode_without_restart_ends_fast_and_counts_right, .timeout = 60) {
    setenv("KVT_PD_DECODE_KILL", "10", 1);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    run_result_t r = run_argv((const char *const[]){kvtier_test_bin(), "pd", "--ranks", "4", TRACE, "--requests", "66", NULL});
    clock_gettime(CLOCK_MONOTONIC, &t1);
    unsetenv("KVT_PD_DECODE_KILL");
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    cr_assert_eq(r.status, 1, "%s", r.err);
    cr_assert_lt(s, 4.5, "ended in %.1f s: the ranks did not wait out the 5 s grace", s);
    cr_assert(strstr(r.err, "and is not restarted; its pages released"), "the ranks say why: %s", r.err);
    unsigned long long done = 0, failed = 0, never = 0;
    const char *line = strstr(r.err, "decode died (signal 9, Killed); ");
    cr_assert_not_null(line, "%s", r.err);
    cr_assert_eq(sscanf(line, "decode died (signal 9, Killed); %llu hand-offs completed, %llu failed, %llu not attempted",
                        &done, &failed, &never), 3, "%s", line);
    cr_assert_eq(done, 10);
    cr_assert_gt(never, 0, "the hand-offs after the furthest rank were never attempted: %s", line);
    cr_assert_lt(failed, 43 - 10 - never + 1, "%s", line);
    cr_assert_eq(processes_with("--requests 66"), 0, "nothing left running");
    run_free(&r);
}

/* With --decode-restarts, a run that lost hand-offs ends saying why it failed. */
Test(pd, a_failed_run_says_why_last, .timeout = 60) {
    setenv("KVT_PD_DECODE_KILL", "10", 1);
    run_result_t r = run_argv((const char *const[]){kvtier_test_bin(), "pd", "--ranks", "4", TRACE, "--requests", "67",
                                                    "--decode-restarts", "1", NULL});
    unsetenv("KVT_PD_DECODE_KILL");
    cr_assert_eq(r.status, 1, "%s", r.err);
    size_t n = strlen(r.err);
    while (n > 0 && r.err[n - 1] == '\n') n--;
    const char *last = r.err + n;
    while (last > r.err && last[-1] != '\n') last--;
    cr_assert_eq(strncmp(last, "kvtier pd: failed: ", 19), 0, "the last line says why: %s", last);
    cr_assert(strstr(last, "lost with a decode that died"), "%s", last);
    run_free(&r);
}

/* The ranks and decode die with their coordinator, even on SIGKILL. */
Test(pd, ranks_die_with_their_coordinator, .timeout = 60) {
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        execl(kvtier_bin(), "kvtier", "pd", "--ranks", "2", TRACE, "--requests", "401", "--delay-rank", "1:50", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 200 && processes_with("--requests 401") < 4; i++) usleep(10000); /* coordinator, decode, 2 ranks */
    cr_assert_eq(processes_with("--requests 401"), 4, "the group is running");
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    int left = 1;
    for (int i = 0; i < 300 && (left = processes_with("--requests 401")) > 0; i++) usleep(10000);
    cr_assert_eq(left, 0, "no process of the group runs on as an orphan");
}
