/* kvtier — the command-line tool. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "kvtier/net.h"
#include "kvtier/version.h"
#include "kvtier/tier.h"


static void usage(FILE *f) {
    fputs("usage: kvtier <command> [options]\n"
          "\n"
          "commands:\n"
          "  replay        replay a request trace through the tiered cache (the main job)\n"
          "  cp            a context-parallel group of rank processes sharing one node's KV\n"
          "  pd            prefill/decode hand-off: a prefill CP group sends KV to a decode process\n"
          "  bench alloc   page-allocator microbenchmark against a scan baseline\n"
          "  bench xfer    L1 <-> L2 copy throughput of the transfer engine against memcpy\n"
          "  bench pd      hand-off throughput over the network against a raw socket\n"
          "  bench store   L3 store put/get throughput against plain files or a plain hiredis loop\n"
          "  version       print the version\n"
          "  help          this text\n"
          "\n"
          "Run 'kvtier <command> --help' for a command's options.\n",
          f);
}

/* Output that could not be written (a full disk, a closed file) fails the
 * command, whatever it computed. */
static int written(int rc) {
    if (fflush(stdout) == 0 && !ferror(stdout)) return rc;
    fprintf(stderr, "kvtier: the output could not be written: %s\n", strerror(errno));
    return rc ? rc : 1;
}

static int run(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    bool help = strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0;
    if (help && argc == 3) { /* kvtier help CMD: CMD's help */
        static const char *const cmds[] = {"replay", "cp", "pd", "bench"};
        for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
            if (strcmp(argv[2], cmds[i]) == 0) {
                char *again[] = {argv[0], argv[2], "--help", NULL};
                return run(3, again);
            }
        static const char *const plain[] = {"help", "--help", "-h", "version"}; /* no help of their own: the usage */
        bool known = false;
        for (size_t i = 0; i < sizeof(plain) / sizeof(plain[0]); i++) known |= strcmp(argv[2], plain[i]) == 0;
        if (!known) return fprintf(stderr, "kvtier help: unknown command '%s' (commands: replay, cp, pd, bench, version, help)\n", argv[2]), 2;
    }
    if (help) {
        if (argc > 3) return fprintf(stderr, "kvtier help: one command at most (kvtier help replay)\n"), 2;
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        if (argc > 2) return fprintf(stderr, "kvtier %s: takes no arguments\n", cmd), 2;
        printf("kvtier %s\n", kvt_version_string());
        return 0;
    }
    if (strcmp(cmd, "replay") == 0) return cmd_replay(argc - 2, argv + 2);
    if (strcmp(cmd, "cp") == 0) return cmd_cp(argc - 2, argv + 2);
    if (strcmp(cmd, "pd") == 0) return cmd_pd(argc - 2, argv + 2);
    if (strcmp(cmd, "bench") == 0) {
        if (argc >= 3 && strcmp(argv[2], "alloc") == 0) return cmd_bench_alloc(argc - 3, argv + 3);
        if (argc >= 3 && strcmp(argv[2], "xfer") == 0) return cmd_bench_xfer(argc - 3, argv + 3);
        if (argc >= 3 && strcmp(argv[2], "pd") == 0) return cmd_bench_pd(argc - 3, argv + 3);
        if (argc >= 3 && strcmp(argv[2], "store") == 0) return cmd_bench_store(argc - 3, argv + 3);
        if (argc == 3 && (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0))
            return puts("usage: kvtier bench alloc|xfer|pd|store [options]   (kvtier bench NAME --help: its options)"), 0;
        fprintf(stderr, "kvtier bench: expected a benchmark name: alloc, xfer, pd, store\n");
        return 2;
    }
    fprintf(stderr, "kvtier: unknown command '%s' (commands: replay, cp, pd, bench, version, help)\n", cmd);
    return 2;
}

int main(int argc, char **argv) { return written(run(argc, argv)); }
