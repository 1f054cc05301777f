#ifndef KVTIER_TOOLS_COMMANDS_H
#define KVTIER_TOOLS_COMMANDS_H

/* Each command gets the arguments after its name and returns the exit code. */
int cmd_bench_alloc(int argc, char **argv);
int cmd_bench_xfer(int argc, char **argv);
int cmd_bench_pd(int argc, char **argv);
int cmd_bench_store(int argc, char **argv);
int cmd_replay(int argc, char **argv);
int cmd_cp(int argc, char **argv);
int cmd_pd(int argc, char **argv);

#endif
