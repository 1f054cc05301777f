/* kvtier cp: a CP group of rank processes on the shipped trace. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
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
/* Many short ranks on two cores: a rank finishes, leaves and exits while
 * another looks at it. The watch once read "joined" before and "gone"
 * after and stopped the group for a rank that had finished well (every
 * rank then left quietly and the group exited 1 with no word): in about a
 * third of these runs. */
Test(cp, ranks_that_finish_are_never_taken_for_dead, .timeout = 120) {
    for (int i = 0; i < 12; i++) {
        run_result_t r = run_argv((const char *const[]){NULL, "cp", "--ranks", "64", "--l1-pages", "64", "--l2-pages",
                                                        "64", "--requests", "3", NULL});
        cr_assert_eq(r.status, 0, "run %d: exit %d: %s", i, r.status, r.err);
        run_free(&r);
    }
}

Test(cp, killed_rank, .timeout = 120) {
    setenv("KVT_CP_KILL", "2:400", 1);
    double t0 = seconds();
    run_result_t g = run_argv((const char *const[]){kvtier_test_bin(), "cp", "--ranks", "4", TRACE, SHAPE, "--data", "--bytes-per-token",
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
    run_result_t end = run_argv((const char *const[]){kvtier_test_bin(), "cp", "--ranks", "4", TRACE, SHAPE, "--limit", "600", NULL});
    run_result_t early = run_argv((const char *const[]){kvtier_test_bin(), "cp", "--ranks", "4", TRACE, SHAPE, "--limit", "600",
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
        {(const char *const[]){NULL, "cp", "--l1-pages", "unbounded", NULL}, "'unbounded' is not an integer in [1, "},
        {(const char *const[]){NULL, "cp", "--sweep", "1,2", NULL}, "--sweep"},
        {(const char *const[]){NULL, "cp", "--verify", NULL}, "--verify: needs --data"},
        {(const char *const[]){NULL, "cp", TRACE, "--requests", "5", NULL}, "--requests: shapes the built-in synthetic workload"},
        {(const char *const[]){NULL, "cp", "--threads", "4", NULL}, "--threads: needs --data"},
        {(const char *const[]){NULL, "cp", "--ranks", "2", "--rank", "1", "--group", "a/b", NULL}, "--group: 'a/b' is not a group name"},
        {(const char *const[]){NULL, "cp", "--model", "gemma-3-like", NULL}, "--model: gemma-3-like has window or state layers"},
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
    char want[320];
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

/* ---- ranks started independently (no common parent kvtier) ---- */

typedef struct spawned {
    pid_t pid;
    int ofd, efd;
} spawned_t;

/* Starts `bin cp --ranks C --rank r --group name` + args without waiting (bin: kvtier or
 * kvtier-test, for the environment's test hooks). */
static spawned_t spawn_rank_of(const char *bin, uint32_t C, uint32_t r, const char *name, const char *const *args) {
    char outp[] = "/tmp/kvt-out-XXXXXX", errp[] = "/tmp/kvt-err-XXXXXX", ranks[16], rank[16];
    spawned_t s = {.ofd = mkstemp(outp), .efd = mkstemp(errp)};
    unlink(outp);
    unlink(errp);
    snprintf(ranks, sizeof(ranks), "%u", C);
    snprintf(rank, sizeof(rank), "%u", r);
    const char *argv[64] = {bin, "cp", "--ranks", ranks, "--rank", rank, "--group", name};
    int n = 8;
    for (int i = 0; args[i] && n < 63; i++) argv[n++] = args[i];
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, s.ofd, 1);
    posix_spawn_file_actions_adddup2(&fa, s.efd, 2);
    cr_assert_eq(posix_spawn(&s.pid, argv[0], &fa, NULL, (char *const *)argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    return s;
}

static spawned_t spawn_rank(uint32_t C, uint32_t r, const char *name, const char *const *args) {
    return spawn_rank_of(kvtier_bin(), C, r, name, args);
}

static run_result_t wait_rank(spawned_t *s) {
    int st;
    waitpid(s->pid, &st, 0);
    run_result_t r = {.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), .out = slurp_fd(s->ofd),
                      .err = slurp_fd(s->efd)};
    close(s->ofd);
    close(s->efd);
    return r;
}

/* Any segment of group name left in /dev/shm. */
static int group_segments(const char *name) {
    DIR *d = opendir("/dev/shm");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) n += strncmp(e->d_name, name, strlen(name)) == 0;
    if (d) closedir(d);
    return n;
}

#define INDEPENDENT_ARGS TRACE, SHAPE, "--write-policy", "write_back", "--data", "--verify", "--bytes-per-token", "64", "--json"

/* Four ranks started one by one, as a shell loop would, agree with the
 * forked group on everything the group decides, and each prints its own. */
Test(cp, independent_ranks_agree_with_the_forked_group, .timeout = 300) {
    char name[64];
    snprintf(name, sizeof(name), "kvt-e2e-%d-ind", (int)getpid());
    const char *const args[] = {INDEPENDENT_ARGS, NULL};
    spawned_t s[4];
    for (uint32_t r = 4; r-- > 0;) s[r] = spawn_rank(4, r, name, args); /* rank 0 last: the others wait for it */
    run_result_t res[4];
    for (int r = 0; r < 4; r++) res[r] = wait_rank(&s[r]);
    run_result_t f = run_argv((const char *const[]){NULL, "cp", "--ranks", "4", INDEPENDENT_ARGS, NULL});
    cJSON *g = json_of(&res[0]), *fg = json_of(&f);
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(g, "digests_agree")), "%s", res[0].err);
    cr_assert_eq(num(g, "mismatches"), 0);
    cr_assert_eq(num(g, "requests"), 3993);
    cr_assert_eq(num(g, "hit_rate"), num(fg, "hit_rate"), "independent %.6f, forked %.6f", num(g, "hit_rate"),
                 num(fg, "hit_rate"));
    for (int k = 0; k < 4; k++) {
        const char *arrays[] = {"backups_by_rank", "loads_by_rank"};
        for (int a = 0; a < 2; a++)
            cr_assert_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(g, arrays[a]), k)->valuedouble,
                         cJSON_GetArrayItem(cJSON_GetObjectItem(fg, arrays[a]), k)->valuedouble, "%s[%d]", arrays[a], k);
        cJSON *pi = cJSON_GetArrayItem(cJSON_GetObjectItem(g, "per_rank"), k), *pf = cJSON_GetArrayItem(cJSON_GetObjectItem(fg, "per_rank"), k);
        cr_assert_eq(num(pi, "dealt_pages"), num(pf, "dealt_pages"), "rank %d", k);
        cr_assert_eq(num(pi, "verified"), num(pi, "loads"), "rank %d checked every load", k);
    }
    for (int r = 1; r < 4; r++) { /* each rank's own result */
        cJSON *o = json_of(&res[r]);
        cr_assert_eq(num(o, "rank"), r);
        cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(o, "digests_agree")));
        cr_assert_eq(num(o, "mismatches"), 0);
        cr_assert_eq(num(o, "hit_rate"), num(g, "hit_rate"));
        cr_assert_eq(num(o, "loads"), cJSON_GetArrayItem(cJSON_GetObjectItem(g, "loads_by_rank"), r)->valuedouble);
        cJSON_Delete(o);
    }
    cr_assert_eq(group_segments(name), 0, "no segment left in /dev/shm");
    cr_assert_eq(cp_segments(), 0);
    fprintf(stderr, "cp independent: hit rate %.4f (forked %.4f), wall %.2f s (forked %.2f s)\n", num(g, "hit_rate"),
            num(fg, "hit_rate"), num(g, "wall_s"), num(fg, "wall_s"));
    cJSON_Delete(g);
    cJSON_Delete(fg);
    for (int r = 0; r < 4; r++) run_free(&res[r]);
    run_free(&f);
}

/* A rank that never comes is named by the others within the timeout; a
 * rank that dies is named by the survivors; nothing is left behind. */
Test(cp, independent_missing_or_dead_rank_is_named, .timeout = 120) {
    char name[64];
    snprintf(name, sizeof(name), "kvt-e2e-%d-miss", (int)getpid());
    const char *const args[] = {TRACE, "--page-tokens", "64", "--l1-pages", "512", "--l2-pages", "300", "--data",
                                "--bytes-per-token", "64", "--limit", "50", "--join-timeout-ms", "1500", NULL};
    double t0 = seconds();
    spawned_t s[3];
    for (uint32_t r = 0; r < 3; r++) s[r] = spawn_rank(4, r, name, args); /* rank 3 never starts */
    for (uint32_t r = 0; r < 3; r++) {
        run_result_t res = wait_rank(&s[r]);
        cr_assert_eq(res.status, 1, "rank %u: exit %d: %s", r, res.status, res.err);
        cr_assert(strstr(res.err, "rank 3 never joined group"), "rank %u: %s", r, res.err);
        run_free(&res);
    }
    cr_assert_lt(seconds() - t0, 10, "named in %.1f s", seconds() - t0);
    cr_assert_eq(group_segments(name), 0, "no segment left in /dev/shm");

    snprintf(name, sizeof(name), "kvt-e2e-%d-dead", (int)getpid());
    const char *const args2[] = {TRACE, SHAPE, "--data", "--bytes-per-token", "64", "--limit", "3217", NULL};
    setenv("KVT_CP_KILL", "2:400", 1);
    spawned_t d[4];
    for (uint32_t r = 0; r < 4; r++) d[r] = spawn_rank_of(kvtier_test_bin(), 4, r, name, args2);
    unsetenv("KVT_CP_KILL");
    for (uint32_t r = 0; r < 4; r++) {
        run_result_t res = wait_rank(&d[r]);
        if (r == 2) cr_assert_eq(res.status, 128 + SIGKILL);
        else cr_assert(res.status == 1 && strstr(res.err, "rank 2 (pid ") && strstr(res.err, ") died"), "rank %u: exit %d: %s", r, res.status, res.err);
        run_free(&res);
    }
    cr_assert_eq(group_segments(name), 0, "rank 0 removed the segments");
}

/* Whether process pid maps a segment of group name. */
static bool maps_segment(pid_t pid, const char *name) {
    char path[64], line[512];
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    FILE *f = fopen(path, "r");
    bool found = false;
    while (f && !found && fgets(line, sizeof(line), f)) found = strstr(line, name) != NULL;
    if (f) fclose(f);
    return found;
}

/* A rank started with other parameters than the group's fails the whole
 * group at once, on every rank, naming the field: not after the join timeout
 * (a minute here; the test's own timeout is far below it). */
Test(cp, independent_mismatched_rank_fails_every_rank_at_once, .timeout = 30) {
    char name[64];
    snprintf(name, sizeof(name), "kvt-e2e-%d-odd", (int)getpid());
    const char *const args[] = {TRACE, "--page-tokens", "64", "--l1-pages", "513", "--l2-pages", "300", "--data",
                                "--bytes-per-token", "64", "--limit", "50", "--join-timeout-ms", "60000", NULL};
    const char *const odd[] = {TRACE, "--page-tokens", "64", "--l1-pages", "513", "--l2-pages", "400", "--data",
                               "--bytes-per-token", "64", "--limit", "50", "--join-timeout-ms", "60000", NULL};
    spawned_t s[3];
    s[0] = spawn_rank(3, 0, name, args);
    s[1] = spawn_rank(3, 1, name, args);
    /* rank 2 comes once rank 1 has attached the group (it maps the control
     * segment): a rank that arrives after the group has gone waits out its
     * join timeout, as it must, since nothing is left to tell it */
    bool attached = false;
    for (int i = 0; i < 2000 && !attached; i++, usleep(10000)) attached = maps_segment(s[1].pid, name);
    cr_assert(attached, "rank 1 never attached group %s", name);
    s[2] = spawn_rank(3, 2, name, odd);
    for (uint32_t r = 0; r < 3; r++) {
        run_result_t res = wait_rank(&s[r]);
        cr_assert_eq(res.status, 1, "rank %u: exit %d: %s", r, res.status, res.err);
        cr_assert(strstr(res.err, "refused by group") && strstr(res.err, "its l2_pages is 300, this rank's 400"),
                  "rank %u: %s", r, res.err);
        run_free(&res);
    }
    cr_assert_eq(group_segments(name), 0, "no segment left in /dev/shm");
}

/* Output that cannot be written fails the command, forked ranks too (the
 * rank that prints leaves by _exit, flushing nothing after it). */
Test(cp, unwritable_output_fails, .timeout = 120) {
    for (int json = 0; json < 2; json++) {
        char cmd[4096];
        snprintf(cmd, sizeof(cmd), "exec '%s' cp --requests 5 --ranks 2%s >/dev/full 2>/tmp/kvt-cp-full-%d.err",
                 kvtier_bin(), json ? " --json" : "", (int)getpid());
        int st = system(cmd);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "%s: status %d", cmd, st);
        char path[64];
        snprintf(path, sizeof(path), "/tmp/kvt-cp-full-%d.err", (int)getpid());
        int fd = open(path, O_RDONLY);
        char *err = slurp_fd(fd);
        close(fd);
        unlink(path);
        cr_assert_not_null(strstr(err, "the output could not be written"), "%s", err);
        free(err);
    }
}
