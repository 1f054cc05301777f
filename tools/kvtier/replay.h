/* kvtier replay's options, shared with the commands that replay a trace the
 * same way (kvtier cp). */
#ifndef KVTIER_TOOLS_REPLAY_H
#define KVTIER_TOOLS_REPLAY_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "cli.h"
#include "kvtier/cache.h"
#include "trace.h"

#define UNBOUNDED 0 /* --l1-pages unbounded: room for every page of the trace */

typedef struct opts {
    uint64_t page_tokens, l1_pages, l2_pages, bytes_per_token, limit, write_hits, requests, seed, check_every;
    double l1_room, l2_room;
    int model, policy, write_policy;
    const char *sweep, *plot;
    bool json, data, verify, digest;
    int stats; /* -1: none; else a kvt_fmt_t */
    int layout;
    uint64_t threads, layers_opt;
    uint64_t bpt;     /* bytes per token, from --bytes-per-token or the model */
    uint32_t layers;  /* the model's layers (1 with --bytes-per-token) */
    const char *groups; /* --groups: the model's name then, its layers and bytes per token the groups' */
    double soak_s;      /* --soak: repeat the trace on the same cache this long */
    double copy_faults; /* --copy-faults (kvtier-test): probability a copy fails, and that one is delayed */
} opts_t;

void replay_opts_default(opts_t *o);
/* The replay options table's rows into t (room for 32); returns how many. */
size_t replay_option_rows(opts_t *o, cli_opt_t *t);
/* After parsing: bytes per token and layers from the model; cross-flag
 * checks, and options changed from the command's defaults that would do
 * nothing (--threads without --data, ...). -1 after printing an error. */
int replay_opts_finish(cli_t *c, opts_t *o, const opts_t *defaults);
/* --requests and --seed shape the built-in workload: refused (-1, message
 * printed) with a trace at path. */
int replay_workload_ok(cli_t *c, const opts_t *o, const opts_t *defaults, const char *path);
/* --data on these L1 sizes fits this machine (-1 after printing why not). */
int replay_check_data_size(cli_t *c, const opts_t *o, const uint64_t *l1, size_t n);
/* The trace at path, or the built-in workload; prints why on failure (-1). */
int replay_load(const char *cmd, const char *path, const opts_t *o, kvt_trace_t *t, double *parse_s);
void replay_cache_config(const opts_t *o, uint64_t l1_pages, kvt_cache_config_t *cfg);
/* gnuplot drawing a PNG at path: title, a log-scaled x axis, y in [0, 1];
 * the caller writes the plot command and its data, then pcloses. NULL when
 * gnuplot cannot be started. */
FILE *replay_plot_open(const char *path, const char *title, const char *xlabel, const char *ylabel);
/* The model identity's name (the preset, --groups' text, or "bpt-N" with --bytes-per-token). */
const char *replay_model_name(const opts_t *o, char *buf, size_t cap);

#endif
