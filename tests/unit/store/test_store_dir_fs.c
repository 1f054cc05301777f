/* The dir backend and what the filesystem may hold at an object's path:
 * a FIFO, a directory, a symbolic link to a FIFO are no objects (a get
 * refuses them as bad objects without blocking, exists does not report
 * them, a put replaces what rename can replace and counts what it cannot);
 * dir: URLs whose path is empty; and max= counted in what the filesystem
 * charges for each file (st_blocks), the model being stat(2) of the files. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"

static senv_t E;
static char root[64];
static char url[160];

static void setup(void) {
    snprintf(root, sizeof(root), "/tmp/kvt-store-dirfs-XXXXXX");
    cr_assert_not_null(mkdtemp(root));
    snprintf(url, sizeof(url), "dir:%s", root);
}

static void teardown(void) {
    senv_fini(&E);
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "umount %s/small 2>/dev/null", root); /* max_bounds_a_small_tmpfs's, if it failed mounted */
    if (system(cmd)) {}
    rmtree(root);
}

/* A get that blocked on a FIFO would never be reported: the timeout fails it. */
TestSuite(store_dir_fs, .init = setup, .fini = teardown, .timeout = 30);

static void path_of(const kvt_hash128_t *h, char *out, size_t cap) {
    char hex[33];
    kvt_store_key(E.store, h, hex);
    snprintf(out, cap, "%s/%.2s/%s", root, hex, hex);
}

/* What the filesystem charges for a file: its blocks, at least its length. */
static uint64_t charged(const char *path) {
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "%s", path);
    uint64_t b = (uint64_t)st.st_blocks * 512;
    return b > (uint64_t)st.st_size ? b : (uint64_t)st.st_size;
}

/* Keys 0..4 put; then 1 and 2 become FIFOs, 3 a directory, 4 a symbolic
 * link to a FIFO. exists sees only 0; a get serves 0 and refuses the rest
 * as bad objects (never blocking, the pages left zero); a put replaces the
 * FIFOs and the link, cannot replace the directory (a failure, counted),
 * and after it everything but 3 is served byte for byte. */
Test(store_dir_fs, non_regular_files_are_no_objects) {
    senv_init(&E, 16, 1, 1024, KVT_LAYOUT_PAGE_FIRST);
    cr_assert_eq(senv_open(&E, url), KVT_OK, "%s", kvt_store_last_error(NULL));
    kvt_store_page_t p[5], q[5];
    put_filled(&E, p, 5, 300);
    pages_of(q, 5, 300, 8);
    char path[5][300], fifo[300];
    for (int i = 0; i < 5; i++) path_of(&p[i].hash, path[i], sizeof(path[i]));
    for (int i = 1; i <= 2; i++) {
        cr_assert_eq(unlink(path[i]), 0);
        cr_assert_eq(mkfifo(path[i], 0644), 0);
    }
    cr_assert_eq(unlink(path[3]), 0);
    cr_assert_eq(mkdir(path[3], 0755), 0);
    snprintf(fifo, sizeof(fifo), "%s/a-fifo", root);
    cr_assert_eq(mkfifo(fifo, 0644), 0);
    cr_assert_eq(unlink(path[4]), 0);
    cr_assert_eq(symlink(fifo, path[4]), 0);

    sres_t r = run_op(E.store, kvt_store_exists, p, 5);
    for (int i = 0; i < 5; i++) cr_assert_eq(r.r[i], i == 0 ? KVT_STORE_OK : KVT_STORE_MISS, "exists %d", i);
    wipe(&E, 8, 5);
    r = run_op(E.store, kvt_store_get, q, 5);
    cr_assert_eq(r.count, 1u);
    cr_assert(check(&E, 300, 8));
    for (int i = 1; i < 5; i++) {
        cr_assert_eq(r.r[i], KVT_STORE_BAD, "get %d: %d", i, r.r[i]);
        cr_assert(!check(&E, 300 + (uint64_t)i, 8 + (uint32_t)i));
        const uint8_t *a = kvt_tier_addr(E.tier, 8 + (uint32_t)i, 0);
        for (int b = 0; b < 1024; b++) cr_assert_eq(a[b], 0, "page %d byte %d written", i, b);
    }
    kvt_store_stats_t st = sstats(E.store, KVT_STORE_GET);
    cr_assert_eq(st.bad_objects, 4u);
    cr_assert_eq(st.failures, 0u);
    cr_assert(strstr(kvt_store_last_error(E.store), "not a regular file") != NULL, "%s", kvt_store_last_error(E.store));

    r = run_op(E.store, kvt_store_put, p, 5);
    for (int i = 0; i < 5; i++) cr_assert_eq(r.r[i], i == 3 ? KVT_STORE_FAILED : KVT_STORE_OK, "put %d", i);
    cr_assert_eq(sstats(E.store, KVT_STORE_PUT).failures, 1u);
    cr_assert(strstr(kvt_store_last_error(E.store), "directory") != NULL, "%s", kvt_store_last_error(E.store));
    struct stat sb;
    cr_assert_eq(lstat(path[3], &sb), 0);
    cr_assert(S_ISDIR(sb.st_mode), "the directory is left where it is");
    for (int i = 0; i < 5; i++)
        if (i != 3) cr_assert(lstat(path[i], &sb) == 0 && S_ISREG(sb.st_mode), "object %d is a file again", i);
    r = run_op(E.store, kvt_store_exists, p, 5);
    for (int i = 0; i < 5; i++) cr_assert_eq(r.r[i], i == 3 ? KVT_STORE_MISS : KVT_STORE_OK, "exists %d after the put", i);
    wipe(&E, 8, 5);
    r = run_op(E.store, kvt_store_get, q, 5);
    for (int i = 0; i < 5; i++)
        if (i != 3) cr_assert(r.r[i] == KVT_STORE_OK && check(&E, 300 + (uint64_t)i, 8 + (uint32_t)i), "object %d served", i);
    cr_assert_eq(r.r[3], KVT_STORE_BAD);
}

/* An object that cannot be looked at (here its fan-out folder is a link to
 * itself: ELOOP) is a failure for exists, as for a get, not a miss: the
 * store cannot say the key is absent. exists_leading stops at it, counted
 * as a failure, not a miss; the object stays in the store's count. */
Test(store_dir_fs, an_unreadable_path_is_a_failure_not_a_miss) {
    senv_init(&E, 16, 1, 1024, KVT_LAYOUT_PAGE_FIRST);
    cr_assert_eq(senv_open(&E, url), KVT_OK, "%s", kvt_store_last_error(NULL));
    kvt_store_page_t p[3];
    put_filled(&E, p, 3, 400);
    char path[3][300], dir[300], away[320];
    for (int i = 0; i < 3; i++) path_of(&p[i].hash, path[i], sizeof(path[i]));
    snprintf(dir, sizeof(dir), "%.*s", (int)(strrchr(path[1], '/') - path[1]), path[1]);
    cr_assert(strncmp(path[0], dir, strlen(dir)) != 0 && strncmp(path[2], dir, strlen(dir)) != 0, "keys share a folder");
    snprintf(away, sizeof(away), "%s.away", dir);
    cr_assert_eq(rename(dir, away), 0);
    cr_assert_eq(symlink(dir, dir), 0);
    sres_t r = run_op(E.store, kvt_store_exists, p, 3);
    cr_assert_eq(r.r[0], KVT_STORE_OK);
    cr_assert_eq(r.r[1], KVT_STORE_FAILED, "exists of a path that cannot be looked at: %d", r.r[1]);
    cr_assert_eq(r.r[2], KVT_STORE_OK);
    cr_assert_eq(sstats(E.store, KVT_STORE_EXISTS).failures, 1u);
    r = run_op(E.store, kvt_store_get, p, 3);
    cr_assert_eq(r.r[1], KVT_STORE_FAILED, "get: %d", r.r[1]);
    cr_assert_eq(sstats(E.store, KVT_STORE_GET).stored_objects, 3u, "a failed get dropped the object from the count");
    kvt_store_stats_t before = sstats(E.store, KVT_STORE_EXISTS);
    size_t lead = 9;
    cr_assert_eq(kvt_store_exists_leading(E.store, p, 3, &lead), KVT_OK);
    cr_assert_eq(lead, 1u);
    kvt_store_stats_t after = sstats(E.store, KVT_STORE_EXISTS);
    cr_assert_eq(after.failures - before.failures, 1u);
    cr_assert_eq(after.misses, before.misses, "a key that could not be looked at counted as a miss");
}

/* A symbolic link at an object's path is no object, wherever it points: a
 * valid object moved out of the root and linked back, or a file outside
 * it. exists does not report it, a get refuses it as a bad object without
 * reading through it (the page left zero), an open does not index it. */
Test(store_dir_fs, a_link_is_not_followed) {
    senv_init(&E, 16, 1, 1024, KVT_LAYOUT_PAGE_FIRST);
    cr_assert_eq(senv_open(&E, url), KVT_OK, "%s", kvt_store_last_error(NULL));
    kvt_store_page_t p[3], q[3];
    put_filled(&E, p, 3, 500);
    pages_of(q, 3, 500, 8);
    char path[3][300], out[2][300];
    for (int i = 0; i < 3; i++) path_of(&p[i].hash, path[i], sizeof(path[i]));
    snprintf(out[0], sizeof(out[0]), "%s.outside", root);
    cr_assert_eq(rename(path[1], out[0]), 0);
    cr_assert_eq(symlink(out[0], path[1]), 0);
    snprintf(out[1], sizeof(out[1]), "/etc/passwd");
    cr_assert_eq(unlink(path[2]), 0);
    cr_assert_eq(symlink(out[1], path[2]), 0);
    sres_t r = run_op(E.store, kvt_store_exists, p, 3);
    cr_assert(r.r[0] == KVT_STORE_OK && r.r[1] == KVT_STORE_MISS && r.r[2] == KVT_STORE_MISS, "exists %d %d %d", r.r[0],
              r.r[1], r.r[2]);
    wipe(&E, 8, 3);
    r = run_op(E.store, kvt_store_get, q, 3);
    cr_assert_eq(r.r[0], KVT_STORE_OK);
    for (int i = 1; i < 3; i++) {
        cr_assert_eq(r.r[i], KVT_STORE_BAD, "get %d through a link: %d", i, r.r[i]);
        const uint8_t *a = kvt_tier_addr(E.tier, 8 + (uint32_t)i, 0);
        for (int b = 0; b < 1024; b++) cr_assert_eq(a[b], 0, "page %d byte %d written", i, b);
    }
    cr_assert(strstr(kvt_store_last_error(E.store), "a symbolic link") != NULL, "%s", kvt_store_last_error(E.store));
    kvt_store_close(E.store);
    E.store = NULL;
    cr_assert_eq(senv_open(&E, url), KVT_OK);
    cr_assert_eq(sstats(E.store, KVT_STORE_GET).stored_objects, 1u, "an open indexed a link");
    unlink(out[0]);
}

/* A file this process may not read (another user's, mode 0600) is there:
 * exists and a get fail on it, not a miss, and it stays in the count. Run
 * as nobody in a child (root reads anything); skipped where that cannot be. */
Test(store_dir_fs, a_file_the_process_may_not_read_is_a_failure) {
    senv_init(&E, 16, 1, 1024, KVT_LAYOUT_PAGE_FIRST);
    cr_assert_eq(senv_open(&E, url), KVT_OK, "%s", kvt_store_last_error(NULL));
    kvt_store_page_t p[3];
    put_filled(&E, p, 3, 600);
    char path[300];
    path_of(&p[1].hash, path, sizeof(path));
    kvt_store_close(E.store);
    E.store = NULL;
    if (geteuid() != 0) cr_skip_test("needs root to become another user");
    cr_assert_eq(chmod(root, 0755), 0);
    cr_assert_eq(chmod(path, 0600), 0);
    pid_t pid = fork();
    if (pid == 0) {
        if (setgid(65534) != 0 || setuid(65534) != 0) _exit(77);
        senv_t c;
        senv_init(&c, 16, 1, 1024, KVT_LAYOUT_PAGE_FIRST);
        if (senv_open(&c, url) != KVT_OK) _exit(10);
        sres_t r = run_op(c.store, kvt_store_exists, p, 3);
        if (r.r[0] != KVT_STORE_OK || r.r[1] != KVT_STORE_FAILED || r.r[2] != KVT_STORE_OK) _exit(11);
        size_t lead = 9;
        if (kvt_store_exists_leading(c.store, p, 3, &lead) != KVT_OK || lead != 1) _exit(12);
        r = run_op(c.store, kvt_store_get, p, 3);
        if (r.r[0] != KVT_STORE_OK || r.r[1] != KVT_STORE_FAILED || r.r[2] != KVT_STORE_OK) _exit(13);
        if (sstats(c.store, KVT_STORE_GET).stored_objects != 3) _exit(14);
        senv_fini(&c);
        _exit(0);
    }
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77) cr_skip_test("cannot become nobody here");
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child failed at step %d (10 open, 11 exists, 12 leading, "
              "13 get, 14 the count)", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

/* A file at an object's name that alone takes more than max (a sparse
 * 1 GiB file, made behind the store's back, written last) is removed at
 * an open with max, alone: the objects that fit stay. In LRU order it
 * would go last, after every one of them. */
Test(store_dir_fs, a_file_over_max_alone_is_removed_alone_at_open) {
    senv_init(&E, 16, 1, 1024, KVT_LAYOUT_PAGE_FIRST);
    cr_assert_eq(senv_open(&E, url), KVT_OK, "%s", kvt_store_last_error(NULL));
    kvt_store_page_t p[6];
    put_filled(&E, p, 6, 700);
    char path[300];
    path_of(&p[5].hash, path, sizeof(path));
    uint64_t five = 0;
    for (int i = 0; i < 5; i++) {
        char o[300];
        path_of(&p[i].hash, o, sizeof(o));
        five += charged(o);
    }
    cr_assert_eq(truncate(path, 1ll << 30), 0);
    kvt_store_close(E.store);
    E.store = NULL;
    char u[300];
    snprintf(u, sizeof(u), "%s,max=%llu", url, (unsigned long long)(five + 4096));
    cr_assert_eq(senv_open(&E, u), KVT_OK, "%s", kvt_store_last_error(NULL));
    kvt_store_stats_t st = sstats(E.store, KVT_STORE_GET);
    cr_assert_eq(st.stored_objects, 5u, "%llu objects kept", (unsigned long long)st.stored_objects);
    cr_assert_neq(access(path, F_OK), 0, "the oversized file survived");
    cr_assert_eq(run_op(E.store, kvt_store_exists, p, 5).count, 5u, "objects that fit were removed");
}

/* Lets this process (a test's own) open `room` more descriptors, and no
 * more: the limit is what is open now plus room (open descriptors counted,
 * whatever their numbers). */
static void limit_descriptors(unsigned room) {
    int open_now = -1; /* the listing's own descriptor is not counted */
    DIR *fds = opendir("/proc/self/fd");
    cr_assert_not_null(fds);
    while (readdir(fds)) open_now++;
    closedir(fds);
    open_now -= 2; /* . and .. */
    struct rlimit rl;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    rl.rlim_cur = (rlim_t)open_now + room;
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
}

/* A batch of gets holds its files open until it is reported; a process
 * short of descriptors closes them and opens again, and the objects it
 * could not open stay counted. */
Test(store_dir_fs, gets_short_of_descriptors) {
    enum { N = 120 };
    senv_init(&E, N, 1, 256, KVT_LAYOUT_PAGE_FIRST);
    cr_assert_eq(senv_open(&E, url), KVT_OK, "%s", kvt_store_last_error(NULL));
    kvt_store_page_t p[N];
    put_filled(&E, p, N, 800);
    limit_descriptors(48);
    for (int round = 0; round < 3; round++) { /* the first gets set access times: each file held */
        wipe(&E, 0, N);
        sres_t r = run_op(E.store, kvt_store_get, p, N);
        cr_assert_eq(r.count, (size_t)N, "round %d: %zu of %d served", round, r.count, N);
        for (int i = 0; i < N; i++) cr_assert(check(&E, 800 + (uint64_t)i, (uint32_t)i));
        cr_assert_eq(sstats(E.store, KVT_STORE_GET).stored_objects, (uint64_t)N);
        sleep(round == 0); /* a second on: the next round sets the times again */
    }
}

/* The store's clock, a second on each round (kvt_store_set_clock): every
 * round's gets set the files' times, so they hold their files. */
static _Atomic uint64_t clock_ns = 1700000000ull * 1000000000ull;
static uint64_t stepped_clock(void *arg) {
    (void)arg;
    return atomic_load(&clock_ns);
}

/* Two workers short of descriptors: a batch's held files are closed just
 * after it is reported, while the next batch may already run on the other
 * worker. That worker waits for them instead of failing its gets. Rounds
 * of one batch back to back, and of two batches at once. */
Test(store_dir_fs, two_workers_short_of_descriptors) {
    enum { N = 24, ROUNDS = 400 };
    senv_init(&E, 2 * N, 1, 256, KVT_LAYOUT_PAGE_FIRST);
    E.cfg.threads = 2;
    E.cfg.timeout_ms = 30000; /* the wait for the other worker's files: never its bound on a loaded machine */
    cr_assert_eq(senv_open(&E, url), KVT_OK, "%s", kvt_store_last_error(NULL));
    cr_assert_eq(kvt_store_set_clock(E.store, stepped_clock, NULL), KVT_OK);
    kvt_store_page_t p[N], q[N];
    put_filled(&E, p, N, 900);
    pages_of(q, N, 900, N);
    limit_descriptors(N); /* room for exactly one round's files: what a round holds is all there is */
    for (int round = 0; round < ROUNDS; round++) {
        atomic_fetch_add(&clock_ns, 1000000000ull);
        if (round % 16 == 0) wipe(&E, N, N);
        int batches = round % 4 == 3 ? 2 : 1;
        uint64_t t;
        for (int b = 0; b < batches; b++)
            cr_assert_eq(kvt_store_get(E.store, q + b * N / 2, N / batches, (uint64_t)b, &t), KVT_OK);
        for (int b = 0; b < batches; b++) {
            kvt_store_done_t d;
            cr_assert_eq(kvt_store_poll(E.store, &d, 1, 60ull * 1000000000ull), 1);
            cr_assert_eq(d.count, d.n, "round %d: %zu of %zu served", round, d.count, d.n);
        }
        if (round % 16 == 0)
            for (int i = 0; i < N; i++) cr_assert(check(&E, 900 + (uint64_t)i, N + (uint32_t)i), "round %d key %d", round, i);
    }
    kvt_store_stats_t st = sstats(E.store, KVT_STORE_GET);
    cr_assert_eq(st.failures, 0u);
    cr_assert_eq(st.stored_objects, (uint64_t)N);
}

/* The 256 fan-out folders are made at the open, not by the first put into
 * each: an empty root holds them all, and nothing else, once opened. */
Test(store_dir_fs, the_fan_out_is_made_at_open) {
    senv_init(&E, 4, 1, 256, KVT_LAYOUT_PAGE_FIRST);
    cr_assert_eq(senv_open(&E, url), KVT_OK, "%s", kvt_store_last_error(NULL));
    int dirs = 0, others = 0;
    DIR *d = opendir(root);
    cr_assert_not_null(d);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.') continue;
        char path[400], name[3];
        snprintf(path, sizeof(path), "%s/%.255s", root, e->d_name);
        struct stat st;
        unsigned v;
        bool folder = lstat(path, &st) == 0 && S_ISDIR(st.st_mode) && strlen(e->d_name) == 2 &&
                      sscanf(e->d_name, "%2x", &v) == 1 && (snprintf(name, sizeof(name), "%02x", v), strcmp(name, e->d_name) == 0);
        dirs += folder;
        others += !folder;
    }
    closedir(d);
    cr_assert_eq(dirs, 256, "%d fan-out folders", dirs);
    cr_assert_eq(others, 0);
}

/* A path is required, and ends at the first ',': what follows is options. */
Test(store_dir_fs, dir_url_with_an_empty_path_refused) {
    senv_init(&E, 4, 1, 256, KVT_LAYOUT_PAGE_FIRST);
    char cwd[512];
    cr_assert_not_null(getcwd(cwd, sizeof(cwd)));
    cr_assert_eq(chdir(root), 0); /* where a store named ',' would be made */
    struct {
        const char *url, *says;
    } cases[] = {{"dir:,", "no path"}, {"dir:,,", "no path"}, {"dir:,max=1K", "no path"}, {"dir:sub,", "empty option"},
                 {"dir:sub,size=1K", "unknown option"}, {"dir:sub,max=1K,", "empty option"},
                 {"dir:sub,max=1K,max=1G", "max= given twice"}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kvt_store_t *s = NULL;
        int rc = kvt_store_open(&s, cases[i].url, &E.cfg);
        if (s) kvt_store_close(s);
        cr_assert_eq(rc, KVT_EINVAL, "%s opened", cases[i].url);
        cr_assert(strstr(kvt_store_last_error(NULL), cases[i].says) != NULL, "%s: %s", cases[i].url, kvt_store_last_error(NULL));
    }
    cr_assert_neq(access(",", F_OK), 0, "a store named ',' was made");
    cr_assert_neq(access("sub", F_OK), 0, "a refused URL made its directory");
    cr_assert_eq(chdir(cwd), 0);
}

/* max= counts what the filesystem charges: with room for 3 objects as
 * stat(2) sees them (a 1104-byte object takes a 4 KiB block on ext4 and
 * tmpfs), 6 puts keep 3, and the store's stored_bytes is the sum of
 * charged() over the files present. */
Test(store_dir_fs, max_counts_filesystem_blocks) {
    senv_init(&E, 8, 1, 1024, KVT_LAYOUT_PAGE_FIRST);
    char sub[128], u[200], path[300];
    snprintf(sub, sizeof(sub), "%s/probe", root);
    snprintf(u, sizeof(u), "dir:%s", sub);
    cr_assert_eq(senv_open(&E, u), KVT_OK);
    kvt_store_page_t p[6];
    put_filled(&E, p, 1, 700); /* in a root of its own: one object's charge, from stat(2) */
    char hex[33];
    kvt_store_key(E.store, &p[0].hash, hex);
    snprintf(path, sizeof(path), "%s/%.2s/%s", sub, hex, hex);
    uint64_t one = charged(path);
    uint64_t ob = kvt_store_object_bytes(E.store);
    fprintf(stderr, "store_dir_fs: an object of %llu bytes is charged %llu\n", (unsigned long long)ob, (unsigned long long)one);
    kvt_store_close(E.store);
    E.store = NULL;

    snprintf(u, sizeof(u), "%s,max=%llu", url, (unsigned long long)(3 * one + one / 2));
    cr_assert_eq(senv_open(&E, u), KVT_OK, "%s", kvt_store_last_error(NULL));
    pages_of(p, 6, 700, 0);
    fill(&E, 700, 0, 6);
    for (int i = 0; i < 6; i++) cr_assert_eq(run_op(E.store, kvt_store_put, &p[i], 1).count, 1u);
    kvt_store_stats_t st = sstats(E.store, KVT_STORE_PUT);
    sres_t r = run_op(E.store, kvt_store_exists, p, 6);
    uint64_t want = 0, present = 0;
    for (int i = 0; i < 6; i++) {
        path_of(&p[i].hash, path, sizeof(path));
        if (access(path, F_OK) == 0) want += charged(path), present++;
        cr_assert_eq(r.r[i] == KVT_STORE_OK, i >= 3, "object %d", i);
    }
    cr_assert_eq(present, 3u, "max=%llu (3.5 charged objects) kept %llu", (unsigned long long)(3 * one + one / 2),
                 (unsigned long long)present);
    cr_assert_eq(st.stored_objects, 3u);
    cr_assert_eq(st.stored_bytes, want);
    cr_assert_eq(st.evictions, 3u);
    /* reopened: the same count, from the files */
    kvt_store_close(E.store);
    E.store = NULL;
    cr_assert_eq(senv_open(&E, u), KVT_OK);
    st = sstats(E.store, KVT_STORE_GET);
    cr_assert_eq(st.stored_objects, 3u);
    cr_assert_eq(st.stored_bytes, want);
}

/* The case: max=512K on a 1 MiB tmpfs (skipped where mounting is
 * not allowed). Objects of 1104 bytes, 4 KiB each on tmpfs: the store
 * stays under max and no put fails for want of space. */
Test(store_dir_fs, max_bounds_a_small_tmpfs) {
    char mnt[128], cmd[300];
    snprintf(mnt, sizeof(mnt), "%s/small", root);
    cr_assert_eq(mkdir(mnt, 0755), 0);
    snprintf(cmd, sizeof(cmd), "mount -t tmpfs -o size=1m kvt-store-test %s 2>/dev/null", mnt);
    if (system(cmd) != 0) cr_skip_test("cannot mount a tmpfs here (needs root): skipped");
    senv_init(&E, 64, 1, 1024, KVT_LAYOUT_PAGE_FIRST);
    char u[200];
    snprintf(u, sizeof(u), "dir:%s,max=512K", mnt);
    int rc = senv_open(&E, u);
    uint64_t stored = 0, failed = 0, stored_bytes = 0;
    struct statvfs vfs = {0};
    if (rc == KVT_OK) {
        fill(&E, 0, 0, 64);
        for (int b = 0; b < 10; b++) { /* 640 objects: 2.5 MiB on this tmpfs */
            kvt_store_page_t p[64];
            for (int i = 0; i < 64; i++) p[i] = (kvt_store_page_t){.hash = hkey(10000 + (uint64_t)(b * 64 + i)), .page = (uint32_t)i};
            stored += run_op(E.store, kvt_store_put, p, 64).count;
        }
        kvt_store_stats_t st = sstats(E.store, KVT_STORE_PUT);
        failed = st.failures;
        stored_bytes = st.stored_bytes;
        statvfs(mnt, &vfs);
    }
    senv_fini(&E);
    snprintf(cmd, sizeof(cmd), "umount %s", mnt);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(rc, KVT_OK);
    uint64_t used = (uint64_t)(vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize;
    fprintf(stderr, "store_dir_fs: max=512K on a 1 MiB tmpfs: %llu puts stored, %llu failed, %llu bytes used\n",
            (unsigned long long)stored, (unsigned long long)failed, (unsigned long long)used);
    cr_assert_eq(failed, 0u, "the tmpfs filled under max=512K");
    cr_assert_eq(stored, 640u);
    cr_assert_leq(stored_bytes, 512u * 1024);
    cr_assert_leq(used, 512u * 1024 + 64 * 1024, "the tmpfs holds %llu bytes", (unsigned long long)used);
}
