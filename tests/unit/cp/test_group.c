/* The CP group protocol (include/kvtier/cp.h) without the command: ranks
 * as forked processes (each its own process, as in a real group) or as
 * several handles in one process, joined by name; the parameters checked
 * field by field; stale, foreign and live segments; digests against a
 * plain array; ranks that never join or die; nothing left in /dev/shm. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvtier/cp.h"
#include "kvtier/error.h"

/* A group name of this process's own (/dev/shm is shared with other tests). */
static const char *group_name(const char *what) {
    static char names[16][64];
    static int next;
    char *n = names[next++ % 16];
    snprintf(n, 64, "kvt-ut-%d-%s", (int)getpid(), what);
    return n;
}

static bool segment_exists(const char *name, const char *suffix) {
    char seg[96], path[128];
    cr_assert_eq(kvt_cp_group_segment(name, suffix, seg, sizeof(seg)), KVT_OK);
    snprintf(path, sizeof(path), "/dev/shm%s", seg);
    struct stat st;
    return stat(path, &st) == 0;
}

static kvt_cp_group_config_t config(const char *name, uint32_t rank, uint32_t ranks) {
    return (kvt_cp_group_config_t){.size = sizeof(kvt_cp_group_config_t), .name = name, .rank = rank, .ranks = ranks,
                                   .l1_pages = 8 * ranks, .l2_pages = 100, .page_tokens = 16, .layers = 2,
                                   .layer_bytes = 64, .layout = 0, .requests = 20, .tag = 7, .timeout_ms = 5000,
                                   .wait_ms = 5000};
}

static kvt_cp_group_t *join_ok(const kvt_cp_group_config_t *c) {
    kvt_cp_group_t *g = NULL;
    const char *why = NULL;
    int rc = kvt_cp_group_join(&g, c, &why);
    cr_assert_eq(rc, KVT_OK, "rank %u: %s: %s", c->rank, kvt_err_name(rc), why ? why : "");
    return g;
}

/* The digest of request i on rank r in the model: all equal, except rank
 * `odd` from request `from` on. */
static uint64_t model_digest(uint32_t r, uint64_t i, uint32_t odd, uint64_t from) {
    return (i + 1) * 0x9e3779b97f4a7c15ull + (r == odd && i + 1 >= from ? 1 : 0);
}

/* One rank of a forked group: joins, steps n requests, finishes with a
 * result naming itself, rank 0 checks the others' results and digests. */
static int forked_rank(const char *name, uint32_t r, uint32_t C, uint64_t n) {
    kvt_cp_group_config_t c = config(name, r, C);
    kvt_cp_group_t *g = NULL;
    const char *why;
    if (kvt_cp_group_join(&g, &c, &why) != KVT_OK) return 10;
    if (kvt_cp_group_wait_joined(g) != KVT_OK) return 11;
    for (uint64_t i = 0; i < n; i++) {
        if (kvt_cp_group_filled(g, i) != KVT_OK) return 12;
        if (kvt_cp_group_step(g, i, model_digest(r, i, UINT32_MAX, 0)) != KVT_OK) return 13;
    }
    uint64_t first = 99, mine[4] = {r, r * 10, r * 100, n};
    if (kvt_cp_group_check_digests(g, n, &first) != KVT_OK || first != 0) return 14;
    if (kvt_cp_group_finish(g, mine, sizeof(mine)) != KVT_OK) return 15;
    for (uint32_t k = 0; r == 0 && k < C; k++) {
        uint64_t got[4];
        if (kvt_cp_group_result(g, k, got, sizeof(got)) != KVT_OK) return 16;
        if (got[0] != k || got[1] != k * 10 || got[2] != k * 100 || got[3] != n) return 17;
    }
    kvt_cp_group_info_t info = {.size = sizeof(info)};
    kvt_cp_group_info(g, &info);
    if (info.creator != (r == 0) || info.stopped) return 18;
    return kvt_cp_group_leave(g, &why) == KVT_OK ? 0 : 19;
}

Test(cp_group, ranks_in_their_own_processes_join_by_name) {
    const char *name = group_name("fork");
    const uint32_t C = 4;
    pid_t pid[4];
    for (uint32_t r = C; r-- > 0;) { /* the others start before rank 0 and wait for it */
        if ((pid[r] = fork()) == 0) _exit(forked_rank(name, r, C, 20));
        if (r == C - 1) usleep(20000);
    }
    for (uint32_t r = 0; r < C; r++) {
        int st;
        cr_assert_eq(waitpid(pid[r], &st, 0), pid[r]);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %u: status %#x", r, st);
    }
    cr_assert_not(segment_exists(name, "ctl"), "the creator unlinked the control segment");
}

/* Every parameter that must agree is refused by name when it does not, and
 * the refusal stops the group: rank 0, waiting for the others, fails at once
 * with the reason instead of with KVT_ETIMEDOUT at its join timeout. */
Test(cp_group, a_parameter_that_differs_is_refused_naming_the_field) {
    const char *fields[] = {"ranks", "l1_pages", "l2_pages", "page_tokens", "layers", "layer_bytes", "layout", "requests", "tag"};
    for (size_t f = 0; f < sizeof(fields) / sizeof(fields[0]); f++) {
        const char *name = group_name(fields[f]);
        kvt_cp_group_config_t c0 = config(name, 0, 2);
        kvt_cp_group_t *g0 = join_ok(&c0);
        kvt_cp_group_config_t c = config(name, 1, 2);
        switch (f) {
        case 0: c.ranks = 3, c.l1_pages = 48; break;
        case 1: c.l1_pages = 32; break;
        case 2: c.l2_pages = 200; break;
        case 3: c.page_tokens = 64; break;
        case 4: c.layers = 3; break;
        case 5: c.layer_bytes = 128; break;
        case 6: c.layout = 1; break;
        case 7: c.requests = 21; break;
        case 8: c.tag = 8; break;
        }
        kvt_cp_group_t *g = NULL;
        const char *why = NULL;
        int rc = kvt_cp_group_join(&g, &c, &why);
        cr_assert_eq(rc, KVT_EINVAL, "%s: %s", fields[f], kvt_err_name(rc));
        cr_assert_null(g);
        char want[64];
        snprintf(want, sizeof(want), "its %s is ", fields[f]);
        cr_assert(why && strstr(why, want), "%s: %s", fields[f], why ? why : "(none)");
        /* rank 0 hears it from its wait, naming the field (not KVT_ETIMEDOUT at its timeout) */
        cr_assert_eq(kvt_cp_group_wait_joined(g0), KVT_EIO, "%s", fields[f]);
        const char *said = kvt_cp_group_why(g0);
        cr_assert(said && strstr(said, want) && strstr(said, "refused by group"), "%s: %s", fields[f], said ? said : "(none)");
        kvt_cp_group_info_t info = {.size = sizeof(info)};
        kvt_cp_group_info(g0, &info);
        cr_assert(info.stopped, "%s", fields[f]);
        kvt_cp_group_leave(g0, NULL);
        cr_assert_not(segment_exists(name, "ctl"));
    }
    /* a rank whose number is taken is refused and stops nothing: the group goes on */
    const char *name = group_name("taken");
    kvt_cp_group_config_t c0 = config(name, 0, 2), c1 = config(name, 1, 2);
    kvt_cp_group_t *g0 = join_ok(&c0), *g1 = join_ok(&c1), *g = NULL;
    const char *why = NULL;
    cr_assert_eq(kvt_cp_group_join(&g, &c1, &why), KVT_EEXIST);
    cr_assert(strstr(why, "is taken by pid"), "%s", why);
    cr_assert_eq(kvt_cp_group_wait_joined(g0), KVT_OK);
    cr_assert_eq(kvt_cp_group_wait_joined(g1), KVT_OK);
    /* ... and so is one whose number is taken and whose parameters differ (another job that picked the
     * same name): it is refused and stops nothing */
    kvt_cp_group_config_t other = config(name, 1, 2);
    other.l2_pages = 99;
    cr_assert_eq(kvt_cp_group_join(&g, &other, &why), KVT_EINVAL);
    cr_assert(strstr(why, "l2_pages"), "%s", why);
    cr_assert_eq(kvt_cp_group_wait_joined(g0), KVT_OK);
    cr_assert_eq(kvt_cp_group_wait_joined(g1), KVT_OK);
    kvt_cp_group_info_t info = {.size = sizeof(info)};
    kvt_cp_group_info(g0, &info);
    cr_assert_not(info.stopped, "a stray with the same name stopped a running group");
    cr_assert_eq(kvt_cp_group_leave(g1, NULL), KVT_OK);
    cr_assert_eq(kvt_cp_group_leave(g0, NULL), KVT_OK);
    cr_assert_not(segment_exists(name, "ctl"));
}

/* Another process writes garbage over the header after the ranks joined:
 * its offsets (which every slot access once went through), its stop word,
 * a reason with no end. The ranks read their slots where the join placed
 * them, the reason only as far as it can be, and stop, saying so. */
Test(cp_group, garbage_in_the_header_after_the_join_reads_nothing_outside) {
    const char *name = group_name("garbage");
    kvt_cp_group_config_t c0 = config(name, 0, 2), c1 = config(name, 1, 2);
    kvt_cp_group_t *g0 = join_ok(&c0), *g1 = join_ok(&c1);
    char seg[96], path[128];
    cr_assert_eq(kvt_cp_group_segment(name, "ctl", seg, sizeof(seg)), KVT_OK);
    snprintf(path, sizeof(path), "/dev/shm%s", seg);
    int fd = open(path, O_RDWR);
    cr_assert_geq(fd, 0);
    uint8_t *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    cr_assert_neq(m, MAP_FAILED);
    size_t from = 64; /* past the segment's own head (kind, version, creator), into the group's fields */
    memset(m + from, 'A', 4096 - from);
    munmap(m, 4096);
    close(fd);
    cr_assert_eq(kvt_cp_group_wait_joined(g0), KVT_EIO);
    const char *said = kvt_cp_group_why(g0);
    cr_assert(said && strlen(said) < 640 && strstr(said, "the group stopped"), "%s", said ? said : "(none)");
    kvt_cp_group_info_t info = {.size = sizeof(info)};
    cr_assert_eq(kvt_cp_group_info(g1, &info), KVT_OK);
    kvt_cp_group_leave(g1, NULL);
    kvt_cp_group_leave(g0, NULL);
    cr_assert_not(segment_exists(name, "ctl"));
}

Test(cp_group, bad_configs) {
    kvt_cp_group_config_t c = config("x", 0, 2);
    kvt_cp_group_t *g = (kvt_cp_group_t *)1;
    const char *why;
    const char *bad_names[] = {"", "a/b", "with space", "0123456789012345678901234567890123456789012345678"};
    for (size_t i = 0; i < 4; i++) {
        c.name = bad_names[i];
        cr_assert_eq(kvt_cp_group_join(&g, &c, &why), KVT_EINVAL, "name '%s'", bad_names[i]);
        cr_assert_null(g);
    }
    c = config("x", 2, 2);
    cr_assert_eq(kvt_cp_group_join(&g, &c, &why), KVT_EINVAL, "rank >= ranks");
    c = config("x", 0, 3), c.l1_pages = 10;
    cr_assert_eq(kvt_cp_group_join(&g, &c, &why), KVT_EINVAL, "l1_pages not a multiple of ranks");
}

/* A dead rank 0's control segment is stale: attachers wait for a new rank
 * 0 (and name it when none comes), which replaces it. */
Test(cp_group, a_dead_creators_segment_is_replaced) {
    const char *name = group_name("stale");
    pid_t pid = fork();
    if (pid == 0) {
        kvt_cp_group_config_t c = config(name, 0, 2);
        kvt_cp_group_t *g;
        _exit(kvt_cp_group_join(&g, &c, NULL) == KVT_OK ? 0 : 1); /* dies without leaving */
    }
    int st;
    waitpid(pid, &st, 0);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    cr_assert(segment_exists(name, "ctl"), "the dead rank 0 left its segment");
    kvt_cp_group_config_t c1 = config(name, 1, 2);
    c1.timeout_ms = 300;
    kvt_cp_group_t *g1 = NULL;
    const char *why = NULL;
    cr_assert_eq(kvt_cp_group_join(&g1, &c1, &why), KVT_ETIMEDOUT, "a dead group is not joined");
    cr_assert(strstr(why, "did not appear within 300 ms: rank 0 never joined"), "%s", why);
    kvt_cp_group_config_t c0 = config(name, 0, 2);
    kvt_cp_group_t *g0 = join_ok(&c0);
    kvt_cp_group_info_t info = {.size = sizeof(info)};
    cr_assert_eq(kvt_cp_group_info(g0, &info), KVT_OK);
    cr_assert(info.creator && info.replaced_stale);
    g1 = join_ok(&c1);
    cr_assert_eq(kvt_cp_group_leave(g1, NULL), KVT_OK);
    cr_assert_eq(kvt_cp_group_leave(g0, NULL), KVT_OK);
    cr_assert_not(segment_exists(name, "ctl"));
}

/* A live group's segment and another program's file are never touched. */
Test(cp_group, a_foreign_file_or_a_live_group_is_left_alone) {
    const char *name = group_name("foreign");
    char seg[96], path[128];
    kvt_cp_group_segment(name, "ctl", seg, sizeof(seg));
    snprintf(path, sizeof(path), "/dev/shm%s", seg);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs("not mine\n", f);
    fclose(f);
    kvt_cp_group_config_t c0 = config(name, 0, 2);
    kvt_cp_group_t *g = NULL;
    const char *why = NULL;
    cr_assert_eq(kvt_cp_group_join(&g, &c0, &why), KVT_EEXIST);
    cr_assert(strstr(why, seg) && strstr(why, "left alone"), "%s", why);
    cr_assert_eq(kvt_cp_group_remove_stale(name, (const char *const[]){"l1", "l2", NULL}), 0);
    char text[32] = {0};
    f = fopen(path, "r");
    cr_assert_not_null(f, "the file is still there");
    cr_assert_not_null(fgets(text, sizeof(text), f));
    fclose(f);
    cr_assert_str_eq(text, "not mine\n", "and unchanged");
    unlink(path);

    kvt_cp_group_t *live = join_ok(&c0);
    cr_assert_eq(kvt_cp_group_join(&g, &c0, &why), KVT_EEXIST, "a live group's segment");
    cr_assert_eq(kvt_cp_group_remove_stale(name, NULL), 0, "a live group is not stale");
    cr_assert(segment_exists(name, "ctl"));
    cr_assert_eq(kvt_cp_group_leave(live, NULL), KVT_OK);
    cr_assert_not(segment_exists(name, "ctl"));
}

/* The first divergence, against the model, for every position. */
Test(cp_group, digests_compared_and_the_first_divergence_found) {
    const char *name = group_name("digest");
    const uint32_t C = 3;
    const uint64_t n = 20;
    for (uint64_t from = 1; from <= n + 1; from += 4) { /* 21: no divergence */
        kvt_cp_group_t *g[3];
        for (uint32_t r = 0; r < C; r++) {
            kvt_cp_group_config_t c = config(name, r, C);
            g[r] = join_ok(&c);
        }
        uint32_t odd = (uint32_t)(from % 2 + 1);
        for (uint64_t i = 0; i < n; i++)
            for (uint32_t r = 0; r < C; r++) cr_assert_eq(kvt_cp_group_step(g[r], i, model_digest(r, i, odd, from)), KVT_OK);
        for (uint64_t upto = 0; upto <= n; upto += 5) {
            uint64_t want = from <= upto ? from : 0, first = 99;
            cr_assert_eq(kvt_cp_group_check_digests(g[upto % C], upto, &first), KVT_OK);
            cr_assert_eq(first, want, "diverging from %" PRIu64 ", first %" PRIu64 " requests: %" PRIu64, from, upto, first);
        }
        uint64_t first;
        cr_assert_eq(kvt_cp_group_check_digests(g[0], n + 1, &first), KVT_ERANGE);
        kvt_cp_group_info_t info = {.size = sizeof(info)};
        kvt_cp_group_info(g[1], &info);
        cr_assert_eq(info.divergence, from <= n ? from : 0);
        cr_assert_eq(kvt_cp_group_step(g[0], 5, 0), KVT_EINVAL, "out of order");
        for (uint32_t r = C; r-- > 0;) cr_assert_eq(kvt_cp_group_leave(g[r], NULL), KVT_OK);
    }
    cr_assert_not(segment_exists(name, "ctl"));
}

/* Ranks that never join are named, within the timeout. */
Test(cp_group, a_rank_that_never_joins_is_named) {
    const char *name = group_name("missing");
    kvt_cp_group_config_t c0 = config(name, 0, 4), c1 = config(name, 1, 4);
    c0.timeout_ms = c1.timeout_ms = 300;
    kvt_cp_group_t *g0 = join_ok(&c0), *g1 = join_ok(&c1);
    cr_assert_eq(kvt_cp_group_wait_joined(g0), KVT_ETIMEDOUT);
    cr_assert(strstr(kvt_cp_group_why(g0), "ranks 2, 3 never joined group"), "%s", kvt_cp_group_why(g0));
    /* the group stopped: rank 1 hears why */
    cr_assert_eq(kvt_cp_group_wait_joined(g1), KVT_EIO);
    cr_assert(strstr(kvt_cp_group_why(g1), "rank 1: the group stopped: rank 0: ranks 2, 3 never joined"), "%s",
              kvt_cp_group_why(g1));
    kvt_cp_group_info_t info = {.size = sizeof(info)};
    kvt_cp_group_info(g1, &info);
    cr_assert(info.stopped && info.stopped_by == 0);
    cr_assert_eq(kvt_cp_group_leave(g1, NULL), KVT_OK);
    cr_assert_eq(kvt_cp_group_leave(g0, NULL), KVT_OK);
    cr_assert_not(segment_exists(name, "ctl"));
}

/* A rank that dies is found by the ranks that wait on it, and named. */
Test(cp_group, a_dead_rank_is_detected_and_named) {
    const char *name = group_name("dead");
    kvt_cp_group_config_t c0 = config(name, 0, 2);
    kvt_cp_group_t *g0 = join_ok(&c0);
    int go[2];
    cr_assert_eq(pipe(go), 0);
    pid_t pid = fork();
    if (pid == 0) {
        kvt_cp_group_config_t c1 = config(name, 1, 2);
        kvt_cp_group_t *g1;
        if (kvt_cp_group_join(&g1, &c1, NULL) != KVT_OK) _exit(1);
        for (uint64_t i = 0; i < 3; i++) kvt_cp_group_step(g1, i, 1);
        char b;
        close(go[1]);
        if (read(go[0], &b, 1) < 0) _exit(1); /* rank 0 has made its steps: no race with them */
        raise(SIGKILL); /* mid-run */
    }
    close(go[0]);
    cr_assert_eq(kvt_cp_group_wait_joined(g0), KVT_OK);
    for (uint64_t i = 0; i < 10; i++) cr_assert_eq(kvt_cp_group_step(g0, i, 1), KVT_OK);
    close(go[1]); /* now rank 1 dies */
    uint64_t first;
    int rc = kvt_cp_group_check_digests(g0, 10, &first); /* waits on rank 1's requests 4..10 */
    cr_assert_eq(rc, KVT_EIO, "%s", kvt_err_name(rc));
    char want[96];
    snprintf(want, sizeof(want), "rank 1 (pid %d) died, having done 3 requests", (int)pid);
    cr_assert(strstr(kvt_cp_group_why(g0), want), "%s", kvt_cp_group_why(g0));
    kvt_cp_group_info_t info = {.size = sizeof(info)};
    kvt_cp_group_info(g0, &info);
    cr_assert_eq(info.stopped_by, 1);
    cr_assert_eq(kvt_cp_group_step(g0, 10, 1), KVT_EIO, "the group stays stopped");
    cr_assert_eq(kvt_cp_group_leave(g0, NULL), KVT_OK, "a dead rank is not waited for");
    waitpid(pid, NULL, 0);
    cr_assert_not(segment_exists(name, "ctl"));
}

/* A step that finds a rank dead records nothing: the same step is refused
 * again for that reason (KVT_EIO), never as out of order (it was recorded
 * before the death was looked for). */
Test(cp_group, a_step_that_finds_a_dead_rank_records_nothing) {
    const char *name = group_name("deadstep");
    kvt_cp_group_config_t c0 = config(name, 0, 2);
    kvt_cp_group_t *g0 = join_ok(&c0);
    pid_t pid = fork();
    if (pid == 0) {
        kvt_cp_group_config_t c1 = config(name, 1, 2);
        kvt_cp_group_t *g1;
        if (kvt_cp_group_join(&g1, &c1, NULL) != KVT_OK) _exit(1);
        raise(SIGKILL);
    }
    cr_assert_eq(kvt_cp_group_wait_joined(g0), KVT_OK);
    waitpid(pid, NULL, 0);
    int rc = KVT_OK;
    uint64_t i = 0;
    for (int tries = 0; tries < 400 && rc == KVT_OK; tries++) { /* ranks are looked at every WATCH_NS */
        rc = kvt_cp_group_step(g0, i, 1);
        if (rc == KVT_OK) i++;
        else break;
        usleep(5000);
    }
    cr_assert_eq(rc, KVT_EIO, "%s", kvt_err_name(rc));
    rc = kvt_cp_group_step(g0, i, 1);
    cr_assert_eq(rc, KVT_EIO, "the same step again: %s", kvt_err_name(rc));
    cr_assert(strstr(kvt_cp_group_why(g0), "rank 1"), "%s", kvt_cp_group_why(g0));
    cr_assert_eq(kvt_cp_group_leave(g0, NULL), KVT_OK);
}

/* The shared tiers: rank 0 creates, the others attach; a geometry that
 * differs is refused; a launcher removes what a dead group left, and only that. */
Test(cp_group, shared_tiers_and_what_a_dead_group_leaves) {
    const char *name = group_name("tiers");
    kvt_tier_config_t tc = {.size = sizeof(tc), .flags = KVT_TIER_CHECKSUM, .geom = {100, 2, 64, KVT_LAYOUT_PAGE_FIRST}};
    pid_t pid = fork();
    if (pid == 0) { /* a group whose ranks die: nobody leaves */
        kvt_cp_group_config_t c0 = config(name, 0, 2), c1 = config(name, 1, 2);
        kvt_cp_group_t *g0, *g1;
        kvt_tier_t *t0, *t1, *l1;
        if (kvt_cp_group_join(&g0, &c0, NULL) || kvt_cp_group_join(&g1, &c1, NULL)) _exit(1);
        if (kvt_cp_group_open_tier(g0, "l2", &tc, &t0) || kvt_cp_group_open_tier(g1, "l2", &tc, &t1)) _exit(2);
        if (kvt_cp_group_open_tier(g0, "l1", &tc, &l1)) _exit(3);
        kvt_tier_config_t other = tc;
        other.geom.pages = 99;
        kvt_tier_t *bad = NULL;
        if (kvt_cp_group_open_tier(g1, "l1", &other, &bad) != KVT_EINVAL) _exit(4);
        if (!strstr(kvt_cp_group_why(g1), "its geometry is not this rank's")) _exit(5);
        memset(kvt_tier_addr(t0, 5, 1), 0x5a, 64);
        _exit(((uint8_t *)kvt_tier_addr(t1, 5, 1))[63] == 0x5a ? 0 : 6); /* the same bytes */
    }
    int st;
    waitpid(pid, &st, 0);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %#x", st);
    cr_assert(segment_exists(name, "ctl") && segment_exists(name, "l1") && segment_exists(name, "l2"));
    cr_assert_eq(kvt_cp_group_remove_stale(name, (const char *const[]){"l1", "l2", NULL}), 3);
    cr_assert(!segment_exists(name, "ctl") && !segment_exists(name, "l1") && !segment_exists(name, "l2"));
}

/* A rank interrupted by a signal stops the group; the others unwind. */
Test(cp_group, an_interrupted_rank_stops_the_group) {
    const char *name = group_name("intr");
    kvt_cp_group_config_t c0 = config(name, 0, 2), c1 = config(name, 1, 2);
    kvt_cp_group_t *g0 = join_ok(&c0), *g1 = join_ok(&c1);
    kvt_cp_group_interrupt(g1, SIGTERM);
    cr_assert_eq(kvt_cp_group_step(g0, 0, 1), KVT_EIO);
    cr_assert(strstr(kvt_cp_group_why(g0), "rank 1 was interrupted by signal 15"), "%s", kvt_cp_group_why(g0));
    cr_assert_eq(kvt_cp_group_finish(g1, NULL, 0), KVT_EIO);
    cr_assert_eq(kvt_cp_group_leave(g1, NULL), KVT_OK);
    cr_assert_eq(kvt_cp_group_leave(g0, NULL), KVT_OK);
    cr_assert_not(segment_exists(name, "ctl"));
}

/* A join waiting for rank 0 ends when the caller's cancel flag is set. */
Test(cp_group, a_cancelled_join_ends_at_once) {
    static volatile sig_atomic_t cancel = 1;
    kvt_cp_group_config_t c1 = config(group_name("cancel"), 1, 2);
    c1.cancel = &cancel;
    kvt_cp_group_t *g = NULL;
    const char *why = NULL;
    cr_assert_eq(kvt_cp_group_join(&g, &c1, &why), KVT_EIO);
    cr_assert(strstr(why, "interrupted while joining"), "%s", why);
    cr_assert_null(g);
}

/* Calls out of step change nothing and stop nothing: a digest check past
 * this rank's own requests (it would wait on itself), a tier named as the
 * group's control segment. A rank that leaves without finishing stops the
 * group, named: the others hear it at once (not at their wait's end), its
 * result is not there, and a rank that joins the stopped group is refused. */
Test(cp_group, calls_out_of_step_and_a_rank_that_leaves_early) {
    const char *name = group_name("early");
    kvt_cp_group_config_t c0 = config(name, 0, 3), c1 = config(name, 1, 3), c2 = config(name, 2, 3);
    kvt_cp_group_t *g0 = join_ok(&c0), *g1 = join_ok(&c1);
    uint64_t first = 99;
    cr_assert_eq(kvt_cp_group_step(g0, 0, 1), KVT_OK);
    cr_assert_eq(kvt_cp_group_check_digests(g0, 2, &first), KVT_EINVAL, "rank 0 has done 1 request, not 2");
    cr_assert_eq(first, 99u);
    cr_assert(strstr(kvt_cp_group_why(g0), "rank 0: a digest check of 2 requests; this rank has done 1"), "%s",
              kvt_cp_group_why(g0));
    /* each refusal says its own reason, not an earlier call's */
    cr_assert_eq(kvt_cp_group_step(g0, 5, 1), KVT_EINVAL);
    cr_assert(strstr(kvt_cp_group_why(g0), "step 5 out of step: this rank is at request 1"), "%s", kvt_cp_group_why(g0));
    cr_assert_eq(kvt_cp_group_filled(g0, 9), KVT_EINVAL);
    cr_assert(strstr(kvt_cp_group_why(g0), "filled(9) out of step"), "%s", kvt_cp_group_why(g0));
    cr_assert_eq(kvt_cp_group_check_digests(g0, 21, &first), KVT_ERANGE);
    cr_assert(strstr(kvt_cp_group_why(g0), "the group has 20"), "%s", kvt_cp_group_why(g0));
    char res[8];
    cr_assert_eq(kvt_cp_group_result(g0, 3, res, sizeof(res)), KVT_EINVAL);
    cr_assert(strstr(kvt_cp_group_why(g0), "the result of rank 3, of 3 ranks"), "%s", kvt_cp_group_why(g0));
    cr_assert_eq(kvt_cp_group_result(g0, 1, res, sizeof(res)), KVT_ENOENT);
    cr_assert(strstr(kvt_cp_group_why(g0), "rank 1 has no result"), "%s", kvt_cp_group_why(g0));
    cr_assert_eq(kvt_cp_group_finish(g0, NULL, 4), KVT_EINVAL);
    cr_assert(strstr(kvt_cp_group_why(g0), "a result of 4 bytes at NULL"), "%s", kvt_cp_group_why(g0));
    kvt_tier_config_t tc = {.size = sizeof(tc), .geom = {100, 2, 64, KVT_LAYOUT_PAGE_FIRST}};
    kvt_tier_t *t = NULL;
    cr_assert_eq(kvt_cp_group_open_tier(g0, "ctl", &tc, &t), KVT_EINVAL);
    cr_assert(strstr(kvt_cp_group_why(g0), "control segment"), "%s", kvt_cp_group_why(g0));
    kvt_cp_group_info_t info = {.size = sizeof(info)};
    kvt_cp_group_info(g0, &info);
    cr_assert_not(info.stopped, "a refused call stopped the group");

    cr_assert_eq(kvt_cp_group_leave(g1, NULL), KVT_OK); /* without finishing */
    cr_assert_eq(kvt_cp_group_step(g0, 1, 1), KVT_EIO);
    cr_assert(strstr(kvt_cp_group_why(g0), "rank 1 left group"), "%s", kvt_cp_group_why(g0));
    cr_assert_eq(kvt_cp_group_step(g0, 1, 1), KVT_EIO, "nothing recorded by the failed step: the same call fails alike");
    uint8_t buf[8];
    cr_assert_eq(kvt_cp_group_result(g0, 1, buf, sizeof(buf)), KVT_ENOENT, "a rank that left early has no result");
    kvt_cp_group_t *late = NULL;
    const char *why = NULL;
    cr_assert_eq(kvt_cp_group_join(&late, &c2, &why), KVT_EIO);
    cr_assert(why && strstr(why, "rank 1 left group"), "%s", why ? why : "");
    cr_assert_null(late);
    cr_assert_eq(kvt_cp_group_wait_joined(g0), KVT_EIO);
    cr_assert_eq(kvt_cp_group_leave(g0, NULL), KVT_OK);
    cr_assert_not(segment_exists(name, "ctl"));
}

/* A creator killed between making its segment and publishing it leaves
 * <segment>.<pid>.<n>.tmp (or <segment>.<pid>.tmp, also a creator's), holding
 * its memory: removed once its pid runs nothing, by remove_stale and by the
 * next creator; a live pid's kept. */
Test(cp_group, a_killed_creators_unfinished_segment_is_removed) {
    const char *name = group_name("tmp");
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    char seg[96], path[3][160];
    cr_assert_eq(kvt_cp_group_segment(name, "ctl", seg, sizeof(seg)), KVT_OK);
    pid_t pids[3] = {dead, getpid(), dead};
    for (int i = 0; i < 3; i++) {
        snprintf(path[i], sizeof(path[i]), i == 2 ? "/dev/shm%s.%d.17.tmp" : "/dev/shm%s.%d.tmp", seg, (int)pids[i]);
        int fd = open(path[i], O_CREAT | O_RDWR, 0600);
        cr_assert_geq(fd, 0);
        cr_assert_eq(ftruncate(fd, 1 << 20), 0);
        close(fd);
    }
    cr_assert_eq(kvt_cp_group_remove_stale(name, NULL), 2);
    cr_assert_neq(access(path[0], F_OK), 0, "the dead creator's unfinished segment is still there");
    cr_assert_neq(access(path[2], F_OK), 0, "the dead creator's numbered unfinished segment is still there");
    cr_assert_eq(access(path[1], F_OK), 0, "a live process's was removed");
    int fd = open(path[0], O_CREAT | O_RDWR, 0600); /* again, for the next creator to find */
    cr_assert_geq(fd, 0);
    close(fd);
    kvt_cp_group_config_t c0 = config(name, 0, 1);
    kvt_cp_group_t *g = join_ok(&c0);
    cr_assert_neq(access(path[0], F_OK), 0, "the next creator left it");
    cr_assert_eq(kvt_cp_group_leave(g, NULL), KVT_OK);
    unlink(path[1]);
}
