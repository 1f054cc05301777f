/* The options of every kvtier command (tools/kvtier/): the input is a
 * command (its first byte) and its arguments (the rest, split at NUL
 * bytes); arguments of the form KVT_NAME=VALUE are set in the environment
 * instead, which the options tables read. cli_parse_only makes each
 * command return once its options are parsed and checked: nothing is read,
 * opened, forked or measured.
 *
 * A command must exit 0 (accepted, or --help) or 2 (refused, with its
 * message) and never crash, leak or read outside its arguments. */
#include "cli.h"
#include "commands.h"
#include "fuzz.h"

#define MAX_ARGS 48

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet();
    cli_parse_only = true;
    return 0;
}

typedef int (*cmd_fn)(int argc, char **argv);
static const cmd_fn CMDS[] = {cmd_replay, cmd_cp, cmd_pd, cmd_bench_alloc, cmd_bench_xfer, cmd_bench_pd, cmd_bench_store};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    cmd_fn cmd = CMDS[data[0] % (sizeof(CMDS) / sizeof(CMDS[0]))];
    /* the arguments: a copy, so that every one ends with a NUL of its own */
    char *buf = malloc(size);
    memcpy(buf, data + 1, size - 1);
    buf[size - 1] = 0;
    char *argv[MAX_ARGS + 1], *env[MAX_ARGS];
    int argc = 0, nenv = 0;
    for (char *p = buf; p < buf + size && argc < MAX_ARGS; p += strlen(p) + 1) {
        char *eq = strchr(p, '=');
        if (strncmp(p, "KVT_", 4) == 0 && eq && nenv < MAX_ARGS) {
            *eq = 0;
            if (setenv(p, eq + 1, 1) == 0) env[nenv++] = p;
            continue;
        }
        argv[argc++] = p;
    }
    argv[argc] = NULL;
    int rc = cmd(argc, argv);
    for (int i = 0; i < nenv; i++) unsetenv(env[i]);
    FZ_ASSERT(rc == 0 || rc == 2, "exit code %d", rc);
    free(buf);
    return 0;
}
