/* kvtier replay with an L3 store: a dir store and real Redis (standalone and a
 * six-node cluster, started here on 127.0.0.1), every page served checked
 * byte for byte (--data --verify). Two runs over one store; a fleet of two
 * instances sharing it; and the faults: the store down from the start,
 * objects overwritten or truncated behind the store's back, Redis at its
 * maxmemory, a full filesystem, a master killed mid-run, slots resharded
 * during a run. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/json.h"
#include "common/redis.h"
#include "common/run.h"

#define TRACE KVT_SOURCE_DIR "/data/mooncake_synthetic_trace.jsonl"
/* 256-byte pages; both tiers evict within the first 300 requests */
#define SHAPE "--l1-pages", "2048", "--l2-pages", "4096", "--bytes-per-token", "16", "--data", "--verify", "--json"
#define SHARE "--l3-write-policy", "write_through", "--prefetch-policy", "wait_complete"

static char dir_[128], url_[160];
static redis_srv_t S;
static redis_cluster_t C;

static void setup(void) {
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp"; /* tmpfs: many small files */
    snprintf(dir_, sizeof(dir_), "%s/kvt-e2e-l3-%d", base, (int)getpid());
    snprintf(url_, sizeof(url_), "dir:%s", dir_);
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *f) {
    (void)st, (void)flag, (void)f;
    return remove(path), 0;
}

/* The store's root and everything below it (fan-out folders, objects). */
static void rm_tree(const char *dir) { nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

static void teardown(void) {
    redis_stop(&S);
    cluster_stop(&C);
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "umount %s 2>/dev/null", dir_); /* the full-filesystem test's, if it failed mounted */
    if (system(cmd)) {}
    rm_tree(dir_);
}

TestSuite(replay_l3, .init = setup, .fini = teardown, .timeout = 240);

static const cJSON *obj(const cJSON *o, const char *k) {
    const cJSON *x = cJSON_GetObjectItem(o, k);
    cr_assert_not_null(x, "no \"%s\" in the output", k);
    return x;
}

/* The figures every run with --verify must show. */
static void all_right(const cJSON *j) {
    const cJSON *d = obj(j, "data");
    cr_assert_eq(num(d, "mismatches"), 0, "pages served with the wrong bytes");
    cr_assert_eq(num(d, "integrity_failures"), 0);
    const cJSON *st = cJSON_GetObjectItem(obj(j, "l3"), "store");
    const cJSON *g = st ? cJSON_GetObjectItem(st, "get") : NULL;
    if (g) cr_assert_eq(num(g, "keys"), num(g, "hits") + num(g, "misses") + num(g, "bad_objects") + num(g, "failures"));
}

static cJSON *replay(run_result_t *r, const char *const *argv) {
    *r = run_argv(argv);
    cr_assert_eq(r->status, 0, "kvtier replay failed: %s", r->err);
    return json_of(r);
}

Test(replay_l3, a_second_run_finds_what_the_first_stored) {
    run_result_t a, b, c;
#define ROOM "--l1-pages", "4096", "--l2-pages", "8192" /* room for all of request 1 (2510 pages) */
    cJSON *ja = replay(&a, (const char *const[]){NULL, "replay", TRACE, "--limit", "300", SHAPE, SHARE, ROOM, "--l3", url_, NULL});
    all_right(ja);
    cr_assert_gt(sub(ja, "puts", "l3"), 0);
    /* request 1 again, on a cold L1 and L2: every page of it from L3, put by the first run */
    cJSON *jb = replay(&b, (const char *const[]){NULL, "replay", TRACE, "--limit", "1", SHAPE, SHARE, ROOM, "--l3", url_, NULL});
    all_right(jb);
    double tokens = num(jb, "input_tokens"), whole = tokens - (double)((uint64_t)tokens % 16);
    cr_assert_eq(sub(jb, "hit_tokens", "l3"), whole, "request 1: %.0f of its %.0f tokens from L3", sub(jb, "hit_tokens", "l3"), whole);
    cr_assert_eq(sub(jb, "foreign_hit_tokens", "l3"), whole, "this process put none of them");
    cr_assert_eq(num(obj(obj(jb, "l3"), "prefetch"), "complete"), 1);
    /* and the whole run again: more hits than the first time, all of them right */
    cJSON *jc = replay(&c, (const char *const[]){NULL, "replay", TRACE, "--limit", "300", SHAPE, SHARE, ROOM, "--l3", url_, NULL});
    all_right(jc);
    cr_assert_gt(num(jc, "hit_rate"), num(ja, "hit_rate") + 0.2, "%.4f then %.4f", num(ja, "hit_rate"), num(jc, "hit_rate"));
    cJSON_Delete(ja), cJSON_Delete(jb), cJSON_Delete(jc);
    run_free(&a), run_free(&b), run_free(&c);
}

/* Two instances sharing one store, against the same two without it. */
static void fleet(const char *url) {
    run_result_t a, b;
    cJSON *ja = replay(&a, (const char *const[]){NULL, "replay", TRACE, "--limit", "300", SHAPE, SHARE, "--instances",
                                                 "2", "--l3", url, NULL});
    cJSON *jb = replay(&b, (const char *const[]){NULL, "replay", TRACE, "--limit", "300", SHAPE, "--instances", "2", NULL});
    const cJSON *inst = obj(ja, "instances");
    cr_assert_eq(cJSON_GetArraySize(inst), 2);
    double l3 = 0, cross = 0, reqs = 0;
    for (int i = 0; i < 2; i++) {
        const cJSON *x = cJSON_GetArrayItem(inst, i);
        all_right(x);
        l3 += sub(x, "hit_tokens", "l3");
        cross += num(x, "cross_instance_hit_tokens");
        reqs += num(x, "requests_replayed");
    }
    cr_assert_eq(reqs, 300, "every request went to one instance");
    for (int t = 1; t <= 2; t++) { /* the totals are the caches' sums, L2 as L1 */
        const char *pages = t == 1 ? "l1_pages" : "l2_pages";
        cr_assert_eq(num(ja, pages), num(cJSON_GetArrayItem(inst, 0), pages) + num(cJSON_GetArrayItem(inst, 1), pages),
                     "%s", pages);
    }
    cr_assert_eq(sub(ja, "hit_tokens", "l3"), l3, "the total is the instances' sum");
    cr_assert_eq(num(ja, "cross_instance_hit_tokens"), cross);
    cr_assert_gt(cross, 0, "no instance found a page the other put");
    cr_assert_gt(num(ja, "hit_rate"), num(jb, "hit_rate"), "the shared store must add hits: %.4f with, %.4f without",
                 num(ja, "hit_rate"), num(jb, "hit_rate"));
    cJSON_Delete(ja), cJSON_Delete(jb);
    run_free(&a), run_free(&b);
}

Test(replay_l3, two_instances_share_a_dir_store) { fleet(url_); }

Test(replay_l3, two_instances_share_a_redis_cluster) {
    cr_assert_eq(cluster_start(&C), 0, "cannot start a Redis Cluster (redis-server, redis-cli)");
    fleet(C.url);
}

Test(replay_l3, the_store_down_from_the_start_leaves_l1_and_l2_serving) {
    char url[64];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d", redis_free_port());
    run_result_t a, b;
    cJSON *ja = replay(&a, (const char *const[]){NULL, "replay", TRACE, "--limit", "100", SHAPE, "--l3", url, NULL});
    cJSON *jb = replay(&b, (const char *const[]){NULL, "replay", TRACE, "--limit", "100", SHAPE, NULL});
    cr_assert(strstr(a.err, "unreachable") && strstr(a.err, "going on without L3"), "no clear message: %s", a.err);
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(obj(ja, "l3"), "down")));
    cr_assert_eq(sub(ja, "hit_tokens", "l3"), 0);
    cr_assert_eq(sub(ja, "hit_tokens", "l1"), sub(jb, "hit_tokens", "l1"), "L1 serves as without a store");
    cr_assert_eq(sub(ja, "hit_tokens", "l2"), sub(jb, "hit_tokens", "l2"));
    all_right(ja);
    cJSON_Delete(ja), cJSON_Delete(jb);
    run_free(&a), run_free(&b);
}

/* Under the default write_back into L3 and wait_complete, a real store
 * serves what the modeled one that never evicts serves: every page L2 let
 * go is put, and a prefetch waits for all the store has. A put still in
 * flight when a later request asks costs a little (0.99 of the model on an
 * idle 2-core VM; more on a loaded one, hence the bound). The pages a
 * prefetch evicts from a full L2 for its own come back only when their puts
 * land; a prefetch that took only what was free at once got 0.58 of the
 * model here. */
Test(replay_l3, a_real_store_serves_what_the_model_serves) {
    cr_assert_eq(redis_start(&S, NULL), 0);
    char url[64];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d", S.port);
#define MODEL_RUN "--limit", "500", "--l1-pages", "4096", "--l2-pages", "8192", "--prefetch-policy", "wait_complete", \
                  "--check-every", "100", "--json"
    run_result_t a, b;
    cJSON *ja = replay(&a, (const char *const[]){NULL, "replay", TRACE, MODEL_RUN, "--l3", url, NULL});
    cJSON *jb = replay(&b, (const char *const[]){NULL, "replay", TRACE, MODEL_RUN, "--l3-pages", "4000000", NULL});
    double store = sub(ja, "hit_tokens", "l3"), model = sub(jb, "hit_tokens", "l3");
    cr_assert_gt(model, 0);
    cr_assert_geq(store, 0.85 * model, "L3 served %.0f tokens from Redis, %.0f from the model", store, model);
    cr_assert_leq(store, 1.02 * model, "L3 served %.0f tokens from Redis, %.0f from the model", store, model);
    cr_assert_eq(sub(ja, "misses", "l3"), 0, "nothing the store was asked for went missing");
    cJSON_Delete(ja), cJSON_Delete(jb);
    run_free(&a), run_free(&b);
}

/* A Redis password in the URL opens the store and is never printed: not in
 * --json, not in --stats prom, not in a message (a wrong one names AUTH). */
Test(replay_l3, a_redis_password_is_never_printed) {
    const char *extra[] = {"--requirepass", "kvt-s3cret-pw", NULL};
    cr_assert_eq(redis_start(&S, extra), 0);
    char good[96], wrong[96];
    snprintf(good, sizeof(good), "redis://:kvt-s3cret-pw@127.0.0.1:%d", S.port);
    snprintf(wrong, sizeof(wrong), "redis://:kvt-wrong-pw@127.0.0.1:%d", S.port);
    run_result_t a, b;
    cJSON *ja = replay(&a, (const char *const[]){NULL, "replay", TRACE, "--limit", "100", SHAPE, SHARE, "--stats", "prom", "--l3", good, NULL});
    cr_assert(!strstr(a.out, "s3cret") && !strstr(a.err, "s3cret"), "the password was printed:\n%s\n%s", a.out, a.err);
    const cJSON *st = obj(obj(ja, "l3"), "store");
    cr_assert(strstr(cJSON_GetStringValue(obj(st, "url")), ":***@") != NULL, "%s", cJSON_GetStringValue(obj(st, "url")));
    cr_assert_gt(num(obj(st, "put"), "hits"), 0);
    all_right(ja);
    cJSON *jb = replay(&b, (const char *const[]){NULL, "replay", TRACE, "--limit", "20", SHAPE, "--l3", wrong, NULL});
    cr_assert(strstr(b.err, "AUTH") && strstr(b.err, "going on without L3"), "%s", b.err);
    cr_assert(!strstr(b.out, "wrong-pw") && !strstr(b.err, "wrong-pw"), "the password was printed:\n%s\n%s", b.out, b.err);
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(obj(jb, "l3"), "down")));
    cJSON_Delete(ja), cJSON_Delete(jb);
    run_free(&a), run_free(&b);
}

Test(replay_l3, bad_urls_are_refused_and_nothing_is_written) {
    char sized[200];
    snprintf(sized, sizeof(sized), "%s,max=12Q", url_);
    const char *bad[] = {"redis://x", "dir:", "ftp://host:1", "redis-cluster://a:1,", sized};
    for (int i = 0; i < 5; i++) {
        run_result_t r = run_argv((const char *const[]){NULL, "replay", "--requests", "5", "--l3", bad[i], NULL});
        cr_assert_eq(r.status, 2, "%s: exit %d", bad[i], r.status);
        cr_assert(strstr(r.err, "malformed store URL"), "%s: %s", bad[i], r.err);
        cr_assert_eq(r.out[0], 0, "%s: printed a result", bad[i]);
        run_free(&r);
    }
    cr_assert_neq(access(dir_, F_OK), 0, "a refused URL created its directory");
}

/* Every object rewritten behind the store's back: garbage of the right
 * size, another key's object, or cut short. A get refuses each (counted),
 * none is served, and the pages are computed again. */
Test(replay_l3, objects_overwritten_or_truncated_are_refused) {
    run_result_t a, b;
    cJSON *ja = replay(&a, (const char *const[]){NULL, "replay", TRACE, "--limit", "1", SHAPE, SHARE, "--l3", url_, NULL});
    cJSON_Delete(ja);
    run_free(&a);
    char cmd[600];
    /* files in a stable order; i % 3: 0 garbage, 1 a copy of the first object (another key's), 2 half of itself */
    snprintf(cmd, sizeof(cmd),
             "cd %s && first=$(find . -type f ! -name '.*' | sort | head -1) && i=0 && "
             "for f in $(find . -type f ! -name '.*' | sort | tail -n +2); do "
             "  s=$(stat -c %%s \"$f\"); case $((i %% 3)) in "
             "  0) head -c \"$s\" /dev/urandom > \"$f\" ;; 1) cp \"$first\" \"$f\" ;; 2) truncate -s $((s / 2)) \"$f\" ;; esac; "
             "  i=$((i + 1)); done",
             dir_);
    cr_assert_eq(system(cmd), 0);
    cJSON *jb = replay(&b, (const char *const[]){NULL, "replay", TRACE, "--limit", "1", SHAPE, SHARE, "--l3", url_, NULL});
    all_right(jb);
    const cJSON *g = obj(obj(obj(jb, "l3"), "store"), "get");
    double pages = (double)((uint64_t)num(jb, "input_tokens") / 16);
    /* the first page (in file order) may be intact and found; every other that was asked for was refused */
    cr_assert_gt(num(g, "bad_objects"), 0);
    cr_assert_leq(sub(jb, "hit_tokens", "l3"), 16 * 1, "at most the one intact page leads the prefix");
    cr_assert_lt(num(g, "hits"), pages);
    cJSON_Delete(jb);
    run_free(&b);
}

Test(replay_l3, redis_at_maxmemory_fails_puts_cleanly) {
    const char *extra[] = {"--maxmemory", "2mb", "--maxmemory-policy", "noeviction", NULL};
    cr_assert_eq(redis_start(&S, extra), 0);
    char url[64];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d", S.port);
    run_result_t a;
    cJSON *ja = replay(&a, (const char *const[]){NULL, "replay", TRACE, "--limit", "200", SHAPE, SHARE, "--l3", url, NULL});
    all_right(ja);
    cr_assert_gt(sub(ja, "put_failures", "l3"), 0, "2 MB cannot hold every page");
    cr_assert_gt(sub(ja, "puts", "l3"), 0, "some fit");
    cr_assert_eq(num(obj(obj(obj(ja, "l3"), "store"), "put"), "failures"), sub(ja, "put_failures", "l3"));
    cJSON_Delete(ja);
    run_free(&a);
}

Test(replay_l3, a_full_filesystem_fails_puts_cleanly) {
    cr_assert_eq(mkdir(dir_, 0755), 0);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "mount -t tmpfs -o size=1m kvt-e2e-l3 %s 2>/dev/null", dir_);
    if (system(cmd) != 0) cr_skip_test("cannot mount a tmpfs here (needs root): skipped");
    run_result_t a;
    a = run_argv((const char *const[]){NULL, "replay", TRACE, "--limit", "200", SHAPE, SHARE, "--l3", url_, NULL});
    snprintf(cmd, sizeof(cmd), "umount %s", dir_);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(a.status, 0, "%s", a.err);
    cJSON *ja = json_of(&a);
    all_right(ja);
    cr_assert_gt(sub(ja, "put_failures", "l3"), 0);
    cr_assert_gt(sub(ja, "puts", "l3"), 0);
    cJSON_Delete(ja);
    run_free(&a);
}

/* ---- runs in the background while the cluster changes under them ---- */

typedef struct bg {
    pid_t pid;
    char out[160], err[160];
} bg_t;

static void bg_start(bg_t *b, const char *const *argv) {
    snprintf(b->out, sizeof(b->out), "%s.out", dir_);
    snprintf(b->err, sizeof(b->err), "%s.err", dir_);
    b->pid = fork();
    if (b->pid == 0) {
        int o = open(b->out, O_WRONLY | O_CREAT | O_TRUNC, 0644), e = open(b->err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(o, 1), dup2(e, 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
}

static cJSON *bg_wait(bg_t *b) {
    int st;
    waitpid(b->pid, &st, 0);
    run_result_t r = {0};
    int o = open(b->out, O_RDONLY), e = open(b->err, O_RDONLY);
    r.out = slurp_fd(o), r.err = slurp_fd(e);
    close(o), close(e);
    unlink(b->out), unlink(b->err);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the replay failed: %s", r.err);
    cJSON *j = json_of(&r);
    run_free(&r);
    return j;
}

static long long dbsize(int port) {
    redisReply *r = redis_cmd(port, "DBSIZE");
    long long n = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r) freeReplyObject(r);
    return n;
}

static int a_master(void) {
    for (int i = 0; i < CLUSTER_NODES; i++) {
        redisReply *r = redis_cmd(C.n[i].port, "ROLE");
        bool m = r && r->type == REDIS_REPLY_ARRAY && r->elements > 0 && strcmp(r->element[0]->str, "master") == 0;
        if (r) freeReplyObject(r);
        if (m) return i;
    }
    return -1;
}

#define BG_ARGS(url) \
    (const char *const[]){kvtier_test_bin(), "replay", TRACE, "--limit", "400", SHAPE, SHARE, "--l3-delay", "2", "--l3", url, NULL}

Test(replay_l3, a_master_killed_mid_run) {
    cr_assert_eq(cluster_start(&C), 0);
    bg_t b;
    bg_start(&b, BG_ARGS(C.url));
    int m = a_master();
    cr_assert_geq(m, 0);
    for (int t = 0; t < 3000 && dbsize(C.n[m].port) < 500; t++) redis_sleep_ms(10); /* the run is well under way */
    cr_assert_geq(dbsize(C.n[m].port), 500, "the replay put nothing on a master in 30 s");
    redis_kill(&C.n[m]);
    cJSON *j = bg_wait(&b);
    all_right(j); /* nothing wrong served */
    const cJSON *st = obj(obj(j, "l3"), "store");
    const cJSON *g = obj(st, "get"), *p = obj(st, "put");
    cr_assert_eq(num(g, "bad_objects"), 0);
    cr_assert_gt(num(p, "reconnects") + num(p, "map_refreshes") + num(g, "reconnects") + num(g, "map_refreshes"), 0,
                 "the client never noticed the failover");
    cr_assert_gt(sub(j, "hit_tokens", "l3"), 0);
    cJSON_Delete(j);
}

Test(replay_l3, slots_resharded_during_a_run) {
    cr_assert_eq(cluster_start(&C), 0);
    /* from CLUSTER NODES: the master that serves slot 0, and another master that serves slots (a
     * replica just started can still read "master" with none, before its REPLICATE is seen) */
    redisReply *r = redis_cmd(C.n[0].port, "CLUSTER NODES");
    cr_assert(r && r->type == REDIS_REPLY_STRING);
    char ida[64] = "", idb[64] = "";
    int from_port = 0;
    for (char *save = NULL, *line = strtok_r(r->str, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char id[64], addr[64], flags[64];
        int port = 0;
        if (sscanf(line, "%63s %63s %63s", id, addr, flags) != 3 || !strstr(flags, "master")) continue;
        char *colon = strrchr(strtok(addr, "@"), ':');
        if (colon) port = atoi(colon + 1);
        int fields = 0; /* id addr flags master ping pong epoch link [slot ...] */
        for (const char *c = line; *c;) {
            while (*c == ' ') c++;
            if (*c) fields++;
            while (*c && *c != ' ') c++;
        }
        if (fields < 9) continue; /* no slots */
        if (strstr(line, " 0-") && !ida[0]) snprintf(ida, sizeof(ida), "%s", id), from_port = port;
        else if (!idb[0]) snprintf(idb, sizeof(idb), "%s", id);
    }
    freeReplyObject(r);
    cr_assert(ida[0] && idb[0] && from_port > 0, "cannot find two masters");
    int from = -1;
    for (int i = 0; i < CLUSTER_NODES; i++)
        if (C.n[i].port == from_port) from = i;
    cr_assert_geq(from, 0);
    bg_t b;
    bg_start(&b, BG_ARGS(C.url));
    for (int t = 0; t < 3000 && dbsize(C.n[from].port) < 200; t++) redis_sleep_ms(10);
    char addr[32], cmd[600];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", C.n[from].port);
    snprintf(cmd, sizeof(cmd),
             "redis-cli --cluster reshard %s --cluster-from %s --cluster-to %s --cluster-slots 2000 --cluster-yes "
             "--cluster-pipeline 8 >%s/reshard.log 2>&1",
             addr, ida, idb, C.n[0].dir);
    if (system(cmd) != 0) {
        char log[700];
        snprintf(log, sizeof(log), "%s/reshard.log", C.n[0].dir);
        int fd = open(log, O_RDONLY);
        char *text = fd >= 0 ? slurp_fd(fd) : NULL;
        size_t n = text ? strlen(text) : 0;
        cr_assert_fail("redis-cli --cluster reshard failed; its log ends:\n%s", text ? text + (n > 1500 ? n - 1500 : 0) : "(none)");
    }
    cJSON *j = bg_wait(&b);
    all_right(j);
    const cJSON *st = obj(obj(j, "l3"), "store");
    const cJSON *g = obj(st, "get"), *p = obj(st, "put");
    double moved = num(g, "moved") + num(p, "moved"), ask = num(g, "ask") + num(p, "ask");
    cr_assert_gt(moved + ask, 0, "no redirection followed");
    cr_assert_eq(num(g, "failures"), 0, "a get failed during the move");
    cr_assert_eq(num(g, "bad_objects"), 0);
    fprintf(stderr, "reshard during a replay: moved %.0f, ask %.0f\n", moved, ask);
    cJSON_Delete(j);
}

/* ---- the fleet's processes ---- */

#include <signal.h>
#include <spawn.h>

#include "common/proc.h"
#include "kvtier/stats.h"

extern char **environ;

/* A fleet of two long instances (64 KiB pages, checked: tens of seconds),
 * started with its stderr in a file: its pid once the coordinator and both
 * instances run. */
static pid_t fleet_start(int *efd, const char *marker) {
    char errp[] = "/tmp/kvt-fleet-err-XXXXXX";
    *efd = mkstemp(errp);
    unlink(errp);
    const char *argv[] = {kvtier_bin(), "replay", TRACE, "--l1-pages", "1024", "--l2-pages", "2048", "--bytes-per-token",
                          "4096", "--data", "--verify", "--instances", "2", "--limit", marker, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, *efd, 2);
    pid_t pid;
    cr_assert_eq(posix_spawn(&pid, argv[0], &fa, NULL, (char *const *)argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    char m[32];
    snprintf(m, sizeof(m), "--limit %s", marker);
    for (int i = 0; i < 500 && processes_with(m) < 3; i++) usleep(10000);
    cr_assert_eq(processes_with(m), 3, "the coordinator and two instances run");
    return pid;
}

/* Its exit status once it ends (128 + the signal that killed it), its
 * stderr in *err; and no instance left running. */
static int fleet_end(pid_t pid, int efd, const char *marker, char **err) {
    int st;
    waitpid(pid, &st, 0);
    *err = slurp_fd(efd);
    close(efd);
    char m[32];
    snprintf(m, sizeof(m), "--limit %s", marker);
    int left = 1;
    for (int i = 0; i < 300 && (left = processes_with(m)) > 0; i++) usleep(10000);
    cr_assert_eq(left, 0, "no instance runs on");
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* SIGTERM or SIGINT to the coordinator stops the instances and it exits
 * 128 + the signal, saying so (it went on to the end and exited 0). */
Test(replay_fleet, a_signal_to_the_coordinator_stops_the_fleet, .timeout = 120) {
    static const int sigs[] = {SIGTERM, SIGINT};
    for (int i = 0; i < 2; i++) {
        int efd;
        pid_t pid = fleet_start(&efd, "3989");
        kill(pid, sigs[i]);
        char *err;
        int status = fleet_end(pid, efd, "3989", &err);
        cr_assert_eq(status, 128 + sigs[i], "exit %d: %s", status, err);
        cr_assert_not_null(strstr(err, "stopped by signal"), "%s", err);
        free(err);
    }
}

/* An instance killed stops the others at once, and the coordinator names
 * it and the signal (it waited for the instances before it in order). */
Test(replay_fleet, a_dead_instance_stops_the_fleet_at_once, .timeout = 120) {
    int efd;
    pid_t pid = fleet_start(&efd, "3988");
    char cmd[128], line[64] = {0};
    snprintf(cmd, sizeof(cmd), "pgrep -P %d | sort -n | tail -1", (int)pid);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(fgets(line, sizeof(line), p));
    pclose(p);
    uint64_t t0 = kvt_now_ns();
    kill((pid_t)atoi(line), SIGKILL);
    char *err;
    int status = fleet_end(pid, efd, "3988", &err);
    cr_assert_eq(status, 1, "exit %d: %s", status, err);
    cr_assert_not_null(strstr(err, "instance 1 died (signal 9"), "%s", err);
    cr_assert_lt(kvt_now_ns() - t0, 10000000000ull, "the other instance was stopped, not waited for");
    free(err);
}
