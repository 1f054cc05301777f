/* kvtier cp: a CP group of rank processes on the shipped trace. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <time.h>

#include "common/json.h"
#include "common/proc.h"
#include "common/run.h"

#define TRACE KVT_SOURCE_DIR "/data/mooncake_synthetic_trace.jsonl"
/* Small tiers: both evict and pages load back (the replay_data shape). */
#define SHAPE "--page-tokens", "64", "--l1-pages", "4096", "--l2-pages", "3000", "--l2-free-room", "0.5"

/* kvtier cp segments in /dev/shm whose group is gone (the name holds the
 * coordinator's pid; other tests' groups may be running meanwhile) */
static int cp_segments(void) {
    DIR *d = opendir("/dev/shm");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        int pid;
        if (sscanf(e->d_name, "kvtier-cp-%d-", &pid) == 1 && kill(pid, 0) != 0 && errno == ESRCH) n++;
    }
    if (d) closedir(d);
    return n;
}


static void group(const char *policy) {
    run_result_t g = run_argv((const char *const[]){NULL, "cp", "--ranks", "4", TRACE, SHAPE, "--write-policy", policy,
                                                    "--data", "--verify", "--bytes-per-token", "64", "--json", NULL});
    run_result_t r = run_argv((const char *const[]){NULL, "replay", TRACE, SHAPE, "--write-policy", policy, "--json", NULL});
    cJSON *o = json_of(&g), *one = json_of(&r);
    cr_assert_eq(num(o, "ranks"), 4);
    cr_assert_eq(num(o, "requests"), 3993);
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(o, "digests_agree")), "%s", policy);
    cr_assert_eq(num(o, "mismatches"), 0, "%s", policy);
    cr_assert_eq(num(o, "hit_rate"), num(one, "hit_rate"), "%s: the group's hit rate %.6f, one process %.6f", policy,
                 num(o, "hit_rate"), num(one, "hit_rate"));
    cJSON *b = cJSON_GetObjectItem(o, "backups_by_rank"), *l = cJSON_GetObjectItem(o, "loads_by_rank");
    cr_assert_eq(cJSON_GetArraySize(b), 4);
    cr_assert_eq(cJSON_GetArrayItem(b, 0)->valuedouble, num(one, "backups"), "rank 0 makes every backup");
    double loads = 0;
    for (int k = 0; k < 4; k++) {
        if (k > 0) cr_assert_eq(cJSON_GetArrayItem(b, k)->valuedouble, 0, "%s: rank %d backs up nothing", policy, k);
        cr_assert_gt(cJSON_GetArrayItem(l, k)->valuedouble, 0, "%s: rank %d loads", policy, k);
        loads += cJSON_GetArrayItem(l, k)->valuedouble;
    }
    cr_assert_eq(loads, num(one, "loads"), "%s: each page is loaded by exactly one rank", policy);
    cr_assert_leq(sub(o, "lane_pages", "max") - sub(o, "lane_pages", "min"), 1, "%s: lanes dealt within one page", policy);
    cJSON *per = cJSON_GetObjectItem(o, "per_rank");
    for (int k = 0; k < 4; k++)
        cr_assert_eq(num(cJSON_GetArrayItem(per, k), "verified"), cJSON_GetArrayItem(l, k)->valuedouble,
                     "every page rank %d loaded was checked", k);
    cr_assert_eq(cp_segments(), 0, "no segment left in /dev/shm");
    fprintf(stderr, "cp %s: hit rate %.4f, loads %.0f, backups %.0f, wall %.2f s\n", policy, num(o, "hit_rate"), loads,
            cJSON_GetArrayItem(b, 0)->valuedouble, num(o, "wall_s"));
    cJSON_Delete(o);
    cJSON_Delete(one);
    run_free(&g);
    run_free(&r);
}

Test(cp, write_through, .timeout = 300) { group("write_through"); }
Test(cp, write_back, .timeout = 300) { group("write_back"); }

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A rank killed mid-run: the group says which, exits non-zero in seconds,
 * and leaves no segment and no process behind. */
Test(cp, killed_rank, .timeout = 120) {
    setenv("KVT_CP_KILL", "2:400", 1);
    double t0 = seconds();
    run_result_t g = run_argv((const char *const[]){NULL, "cp", "--ranks", "4", TRACE, SHAPE, "--data", "--bytes-per-token",
                                                    "64", "--limit", "3217", NULL});
    double took = seconds() - t0;
    unsetenv("KVT_CP_KILL");
    cr_assert_eq(g.status, 1, "exit %d: %s", g.status, g.err);
    cr_assert(strstr(g.err, "rank 2 died (signal 9"), "%s", g.err);
    cr_assert_lt(took, 10, "stopped in %.1f s", took);
    cr_assert_eq(cp_segments(), 0, "no segment left in /dev/shm");
    cr_assert_eq(processes_with("--limit 3217"), 0, "no rank left running");
    run_free(&g);
}

/* A rank whose decisions part from the others' is caught, with the request. */
Test(cp, diverging_rank, .timeout = 120) {
    setenv("KVT_CP_DIVERGE", "3:250", 1);
    run_result_t end = run_argv((const char *const[]){NULL, "cp", "--ranks", "4", TRACE, SHAPE, "--limit", "600", NULL});
    run_result_t early = run_argv((const char *const[]){NULL, "cp", "--ranks", "4", TRACE, SHAPE, "--limit", "600",
                                                        "--digest-every", "50", NULL});
    unsetenv("KVT_CP_DIVERGE");
    cr_assert_eq(end.status, 1);
    cr_assert(strstr(end.err, "disagree from request 250"), "%s", end.err);
    cr_assert(strstr(end.out, "digests DISAGREE"), "%s", end.out);
    cr_assert_eq(early.status, 1);
    cr_assert(strstr(early.err, "the group stopped: the ranks disagree from request 250"), "%s", early.err);
    run_free(&end);
    run_free(&early);
}

Test(cp, bad_flags) {
    struct {
        const char *const *argv;
        const char *want;
    } cases[] = {
        {(const char *const[]){NULL, "cp", "--ranks", "0", NULL}, "--ranks"},
        {(const char *const[]){NULL, "cp", "--ranks", "3", "--l1-pages", "1000", NULL}, "1000 pages do not split into 3 lanes"},
        {(const char *const[]){NULL, "cp", "--l1-pages", "unbounded", NULL}, "needs a bound"},
        {(const char *const[]){NULL, "cp", "--sweep", "1,2", NULL}, "--sweep"},
        {(const char *const[]){NULL, "cp", "--verify", NULL}, "--verify: needs --data"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        run_result_t r = run_argv(cases[i].argv);
        cr_assert_eq(r.status, 2, "case %zu: exit %d: %s", i, r.status, r.err);
        cr_assert(strstr(r.err, cases[i].want), "case %zu: '%s' not in: %s", i, cases[i].want, r.err);
        run_free(&r);
    }
}

/* A file of another program under the group's segment name is refused by
 * rank 0, which names it and says why, and is never deleted; the other ranks
 * do not claim to have timed out. (The shell execs kvtier, so $$ is the
 * coordinator's pid, which names the segment.) */
Test(cp, foreign_file_at_the_segment_name_is_left_alone, .timeout = 60) {
    run_result_t r = run_argv((const char *const[]){
        "/bin/bash", "-c",
        "f=/dev/shm/kvtier-cp-$$-l2; echo 'not mine' > $f; echo \"$f\" >&2; exec \"$0\" cp --ranks 2 \"$1\" --limit 50 "
        "--page-tokens 64 --l1-pages 512 --l2-pages 300 --data --bytes-per-token 64",
        kvtier_bin(), TRACE, NULL});
    char path[128] = {0};
    cr_assert_eq(sscanf(r.err, "%127s", path), 1, "%s", r.err);
    cr_assert_eq(r.status, 1, "exit %d: %s", r.status, r.err);
    char want[256];
    snprintf(want, sizeof(want), "rank 0: cannot create the L2 segment %s: the name is taken by a file that is not a kvtier segment", path);
    cr_assert(strstr(r.err, want), "rank 0 names the file and why: %s", r.err);
    cr_assert_null(strstr(r.err, "timed out"), "the stopped ranks do not say they timed out: %s", r.err);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "the other program's file is still there: %s", path);
    char text[32] = {0};
    cr_assert_not_null(fgets(text, sizeof(text), f));
    fclose(f);
    cr_assert_str_eq(text, "not mine\n", "and unchanged");
    unlink(path);
    run_free(&r);
}

/* The ranks die with their coordinator, even when it is killed with SIGKILL. */
Test(cp, ranks_die_with_their_coordinator, .timeout = 60) {
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        execl(kvtier_bin(), "kvtier", "cp", "--ranks", "2", TRACE, "--page-tokens", "16", "--l1-pages", "2048",
              "--l2-pages", "3000", "--digest-every", "1", "--limit", "3911", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 200 && processes_with("--limit 3911") < 3; i++) usleep(10000); /* coordinator + 2 ranks */
    cr_assert_eq(processes_with("--limit 3911"), 3, "the group is running");
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    int left = 1;
    for (int i = 0; i < 300 && (left = processes_with("--limit 3911")) > 0; i++) usleep(10000);
    cr_assert_eq(left, 0, "no rank runs on as an orphan");
}
