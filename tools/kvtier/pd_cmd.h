/* kvtier pd, the command's own parts (docs/pd.md): the options, the control
 * block the coordinator shares with its forked decode and ranks, and the
 * three files that use them:
 *   pd.c        options, launching and watching the processes, the summary
 *   pd_proc.c   the decode process (a kvt_pd_receiver, the page check) and a
 *               rank process (a kvt_pd_sender), with the test hooks
 *   pd_print.c  the table, --json and --stats
 * The protocol itself is the library's (include/kvtier/pd.h). */
#ifndef KVTIER_TOOLS_PD_CMD_H
#define KVTIER_TOOLS_PD_CMD_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "kvtier/pd.h"
#include "trace.h"

#define MAX_RANKS KVT_PD_MAX_RANKS

typedef struct pd_opts {
    uint64_t ranks, requests, seed, limit, page_tokens, bytes_per_token, decode_pages, streams, max_pages;
    uint64_t window, timeout_ms, decode_restarts;
    double straggler_factor;
    int transport;
    const char *delay;
    bool json;
    int stats; /* 0: none; else kvt_fmt_t + 1 */
    unsigned delay_rank;
    uint64_t delay_ms;
} pd_opts_t;

typedef struct rank_out {
    _Atomic uint64_t pos;   /* the hand-off this rank is on */
    kvt_pd_rank_stats_t st; /* its sender's figures, at its end */
    char err[160];
} rank_out_t;

/* Shared (an anonymous mapping) by the coordinator, decode and the ranks. */
typedef struct ctl {
    _Atomic int stop;
    _Atomic int decode_lost; /* decode died and is not restarted: nothing to wait for */
    _Atomic uint32_t data_port, ctl_port;
    _Atomic uint32_t gen; /* decode's generation: restarts so far */
    uint64_t token;       /* the group's secret, in every rank's hello */
    uint64_t resume_from; /* after a restart: the first hand-off every rank can still deliver */
    uint64_t total;       /* hand-offs in the run (requests of at least one page per rank) */
    uint64_t mismatches;  /* decode's page check, every generation */
    uint64_t checked;     /* hand-offs decode checked (completed), every generation */
    rank_out_t rank[MAX_RANKS];
    kvt_pd_stats_t past; /* the receivers of the generations before, merged */
    kvt_pd_stats_t cur;  /* the current receiver's latest snapshot */
    char decode_err[200];
} ctl_t;

/* The run's figures once the group has ended. */
typedef struct pd_result {
    kvt_pd_stats_t all; /* every generation and every rank's sender, merged */
    uint64_t completed, failed, not_attempted, released; /* completed: checked by decode */
    uint64_t too_short; /* requests of fewer pages than ranks: not handed off */
    uint32_t restarts;
    double wall;
} pd_result_t;

extern const char *const PD_TRANSPORTS[];

/* Pages of request i that are handed off. */
uint64_t pd_handoff_pages(const kvt_trace_t *t, uint64_t i, const pd_opts_t *o);
int pd_decode(const pd_opts_t *o, const kvt_trace_t *t, ctl_t *ctl);
int pd_rank(uint32_t r, const pd_opts_t *o, const kvt_trace_t *t, ctl_t *ctl, uint64_t nreq);
void pd_print(const pd_result_t *res, const ctl_t *c, const pd_opts_t *o);
void pd_emit(const pd_result_t *res, const ctl_t *c, const pd_opts_t *o);
/* Bad peers decode turned away, on stderr (nothing when there were none). */
void pd_report_bad_peers(const kvt_pd_stats_t *a);
/* Process dead (0: decode, else rank dead - 1) ended the run: who, how, and the counts. */
void pd_report_death(const pd_result_t *res, int dead, int why, uint64_t mismatches);

#endif
