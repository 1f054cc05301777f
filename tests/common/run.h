/* Test helper: run a command, capture its exit status, stdout and stderr. */
#ifndef KVTIER_TESTS_RUN_H
#define KVTIER_TESTS_RUN_H

#include <criterion/criterion.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

typedef struct run_result {
    int status; /* exit code, or 128 + signal */
    char *out;
    char *err;
} run_result_t;

static char *slurp_fd(int fd) {
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    ssize_t r;
    lseek(fd, 0, SEEK_SET);
    while ((r = read(fd, buf + n, cap - n - 1)) > 0) {
        n += (size_t)r;
        if (cap - n < 2) buf = realloc(buf, cap *= 2);
    }
    buf[n] = 0;
    return buf;
}

/* The kvtier binary under test: $KVTIER_BIN, else the one built with the tests. */
static const char *kvtier_bin(void) {
    const char *b = getenv("KVTIER_BIN");
    return b && *b ? b : KVT_CLI_PATH;
}

/* kvtier-test: the command with its test-only options and environment hooks
 * (--copy-faults, --l3-delay, KVT_PD_*, KVT_CP_*), linked with the testing
 * library; $KVTIER_TEST_BIN, else the one built with the tests. */
/* The file at path is a PNG (what --plot writes); removes it. */
static inline void assert_png_and_remove(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "the PNG was written");
    unsigned char magic[4] = {0};
    cr_assert_eq(fread(magic, 1, 4, f), 4);
    fclose(f);
    cr_assert(magic[1] == 'P' && magic[2] == 'N' && magic[3] == 'G', "%s is not a PNG", path);
    unlink(path);
}

/* Under tests/run_suite --sanitize: a test that only measures a figure on
 * the whole trace skips itself there (its paths run sanitized elsewhere). */
static inline int kvt_sanitized_run(void) { return getenv("KVTIER_SANITIZED") != NULL; }

static inline const char *kvtier_test_bin(void) {
    const char *b = getenv("KVTIER_TEST_BIN");
    return b && *b ? b : KVT_CLI_TEST_PATH;
}

/* Runs argv (argv[0] == NULL means the kvtier binary). */
static run_result_t run_argv(const char *const *argv) {
    run_result_t res = {0};
    char outp[] = "/tmp/kvt-out-XXXXXX", errp[] = "/tmp/kvt-err-XXXXXX";
    int ofd = mkstemp(outp), efd = mkstemp(errp);
    unlink(outp);
    unlink(errp);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, ofd, 1);
    posix_spawn_file_actions_adddup2(&fa, efd, 2);
    const char *args[64];
    int n = 0;
    args[n++] = argv[0] ? argv[0] : kvtier_bin();
    for (int i = 1; argv[i] && n < 63; i++) args[n++] = argv[i];
    args[n] = NULL;
    pid_t pid;
    int rc = posix_spawn(&pid, args[0], &fa, NULL, (char *const *)args, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        res.status = -1;
    } else {
        int st;
        waitpid(pid, &st, 0);
        res.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    res.out = slurp_fd(ofd);
    res.err = slurp_fd(efd);
    close(ofd);
    close(efd);
    return res;
}

static void run_free(run_result_t *r) {
    free(r->out);
    free(r->err);
}

#ifdef CRITERION_H_
/* Runs argv (as run_argv) and asserts that it exits with `status` (2: a flag
 * or value refused, 1: a failure) and says `needle` on stderr. */
static inline void expect_refused(const char *const *argv, int status, const char *needle) {
    run_result_t r = run_argv(argv);
    cr_assert_eq(r.status, status, "%s %s: exit %d, not %d: %s", argv[1], argv[2] ? argv[2] : "", r.status, status, r.err);
    cr_assert(strstr(r.err, needle), "%s %s: no \"%s\" in: %s", argv[1], argv[2] ? argv[2] : "", needle, r.err);
    run_free(&r);
}
#endif

#endif
