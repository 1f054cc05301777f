/* kvtier replay on a hybrid model (replay_hybrid.c). */
#ifndef KVTIER_TOOLS_REPLAY_HYBRID_H
#define KVTIER_TOOLS_REPLAY_HYBRID_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier/model.h"
#include "replay.h"
#include "replay_l3.h"
#include "trace.h"

typedef struct hybrid_opts {
    const char *name; /* the preset, or the --groups text */
    kvt_layer_group_t groups[KVT_MODEL_MAX_GROUPS];
    uint32_t ngroups;
    uint32_t every; /* --checkpoint-every */
    double state_share, window_weight; /* --state-share, --window-weight: kvt_hybrid_config_split */
    double l3_window_weight;           /* --l3-window-weight: the L3's alone (kvt_hybrid_config_split_tier) */
    uint64_t copy_lag;                 /* --copy-lag: the pieces' copies land this many requests late; 0: none */
    uint32_t full_layers;              /* --data: the layers a full groups' page is cut into (replay_hybrid_sizes) */
} hybrid_opts_t;

/* The checks of a hybrid replay that need no trace, after the groups are
 * known: each tier's bytes (l1[0..n), --l2-pages, --l3-pages pages of the
 * all-full model) fit 64 bits, and --layers splits the full groups' pages
 * (h->full_layers: --layers, else the full groups' layers where they
 * split the bytes evenly, else 1). -1 after printing why. */
int replay_hybrid_sizes(cli_t *c, const opts_t *o, const l3_opts_t *l3, hybrid_opts_t *h, const uint64_t *l1, size_t n);

/* Replays t at each L1 size l1[0..n) (pages of the model held as all-full
 * attention, o->bpt bytes per token; UNBOUNDED: every page of the trace)
 * through the hybrid cache, the same with state checkpoints at request ends
 * only, and the radix cache at o->bpt; prints a table or JSON (and
 * --plot). -1 after printing why. */
int replay_hybrid(const kvt_trace_t *t, const opts_t *o, const l3_opts_t *l3, const hybrid_opts_t *h, const uint64_t *l1,
                  size_t n, const char *trace_name, double parse_s);

#endif
