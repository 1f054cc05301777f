/* Flag parsing shared by the kvtier commands. Every parser prints a clear
 * message naming the flag and what is allowed, and returns -1 on bad input. */
#ifndef KVTIER_TOOLS_CLI_H
#define KVTIER_TOOLS_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>

typedef struct cli {
    const char *cmd; /* "kvtier bench alloc", for messages */
    int argc;
    char **argv;
    int i;           /* next argument */
    const char *flag;  /* the flag being parsed */
    const char *value; /* its value (from --flag=value or the next argument) */
    const char *inline_value;
    const struct cli_opt *table; /* cli_parse_table's, for messages: */
    uint64_t from_env;           /* bit i: table[i] was set by its environment variable */
    bool quiet;                  /* errors are not printed (--help's lenient reading of the environment) */
} cli_t;

void cli_init(cli_t *c, const char *cmd, int argc, char **argv);
/* Next argument: 1 with c->flag set for a flag ("--name"), 2 with c->value set
 * for a positional argument, 0 at the end. */
int cli_next(cli_t *c);
/* True when the current flag is `name` (without a value). */
bool cli_is(cli_t *c, const char *name);
/* The current flag as a switch: on alone, or as --flag=1|0|true|false|yes|no;
 * -1 (message printed) for another value. */
int cli_flag(cli_t *c, bool *out);
/* Takes the current flag's value; -1 (message printed) when it is missing. */
int cli_value(cli_t *c, const char **out);

/* Parse only: when set (the options fuzzer, tests/fuzz/cli.c), a command
 * returns 0 once its options are parsed and checked, before it reads a trace,
 * opens a store, forks or measures anything. Off in the command. */
extern bool cli_parse_only;

/* Prints "COMMAND: --FLAG: message" (the flag being parsed, if any) to stderr; -1. */
int cli_error(const cli_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same, returning 2: a command's exit status for a bad command line. */
int cli_usage(const cli_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prints a JSON object to stdout and frees it. */
void cli_print_json(cJSON *o);

int cli_u64(cli_t *c, uint64_t lo, uint64_t hi, uint64_t *out);
/* A decimal number of digits only (no blank, sign or suffix) that fits in 64
 * bits: 0, else -1. */
int cli_parse_u64(const char *s, uint64_t *out);
/* "A:B", both as cli_parse_u64: 0, else -1. */
int cli_parse_pair(const char *s, uint64_t *a, uint64_t *b);
/* One field of a stats X-macro list into a --json object, the same list
 * --stats emits: a field named l1_X, l2_X or l3_X becomes "X": {"l1": .., "l2": .., "l3": ..},
 * any other its own key. */
void cli_json_stat(cJSON *o, const char *name, double v);
#define CLI_JSON_STAT_(f, kind, help) cli_json_stat(cli_json_o_, #f, (double)cli_json_st_->f);
/* Every field of *st (described by LIST, e.g. KVT_CACHE_STATS_FIELDS) into o. */
#define CLI_JSON_STATS(o, st, LIST)                    \
    do {                                               \
        cJSON *cli_json_o_ = (o);                      \
        const __typeof__(*(st)) *cli_json_st_ = (st);  \
        LIST(CLI_JSON_STAT_)                           \
    } while (0)

/* The same without pairing: every field under its own name. */
#define CLI_JSON_FIELD_(f, kind, help) cJSON_AddNumberToObject(cli_json_o_, #f, (double)cli_json_st_->f);
#define CLI_JSON_FIELDS(o, st, LIST)                   \
    do {                                               \
        cJSON *cli_json_o_ = (o);                      \
        const __typeof__(*(st)) *cli_json_st_ = (st);  \
        LIST(CLI_JSON_FIELD_)                          \
    } while (0)

/* A test hook "A:B" from the environment variable `name`, parsed as
 * cli_parse_pair: true (and *a, *b set) when it is set and well formed. */
bool cli_env_pair(const char *name, uint64_t *a, uint64_t *b);

/* This machine's physical memory, bytes. */
double cli_machine_memory(void);
int cli_double(cli_t *c, double lo, double hi, bool lo_open, bool hi_open, double *out);
int cli_choice(cli_t *c, const char *const *choices, int *out);
/* Comma-separated unsigned integers in [lo, hi]; at most cap of them. */
int cli_u64_list(cli_t *c, uint64_t lo, uint64_t hi, uint64_t *out, size_t cap, size_t *n);
/* An unknown flag or an unexpected positional argument. */
int cli_unknown(const cli_t *c);
/* An option that would do nothing where it was given (its value changed from
 * the default, in a combination that never reads it), and what it needs. */
typedef struct cli_idle {
    const char *flag;
    bool set;
    const char *needs;
} cli_idle_t;
/* The first of rows[0..n) set on the command line: -1 after "FLAG: NEEDS";
 * else 0. A value an environment variable set is a default that does
 * nothing there, not refused. */
int cli_refuse_idle(cli_t *c, const cli_idle_t *rows, size_t n);
/* Whether flag ("--NAME") got its value from its environment variable. */
bool cli_from_env(const cli_t *c, const char *flag);

/* ---- options tables (STYLE.md habit 12) ----
 * One row per option: its flag (--NAME), its environment variable
 * (KVT_NAME, upper case, '-' -> '_'), its type, bounds and help. The
 * destination's value before parsing is the default; the environment
 * overrides it, the command line overrides both (its variable is then not
 * read). */
typedef enum { OPT_FLAG, OPT_U64, OPT_DOUBLE, OPT_CHOICE, OPT_TEXT } cli_opt_type_t;

typedef struct cli_opt {
    const char *name;
    cli_opt_type_t type;
    void *dst;                  /* bool, uint64_t, double, int (choice index), const char * */
    uint64_t lo, hi;            /* OPT_U64 bounds */
    double dlo, dhi;            /* OPT_DOUBLE bounds, closed */
    const char *const *choices; /* OPT_CHOICE, NULL-terminated */
    const char *word;           /* OPT_U64: a word also accepted (e.g. "unbounded") ... */
    uint64_t word_value;        /* ... and the value it stands for */
    const char *help;
} cli_opt_t;

/* Parses argv, then applies the KVT_* environment variables of the options
 * it did not give. Positional arguments go to *positional (at most one;
 * NULL when absent). Returns 0, 1 after printing help for --help (its
 * defaults the environment's values, a bad one skipped), or -1 after
 * printing an error. */
int cli_parse_table(cli_t *c, const cli_opt_t *opts, const char *usage, const char **positional);
void cli_print_table(FILE *f, const cli_opt_t *opts);

#endif
