/* One replay run (kvtier replay): the cache, and its data plane and L3 when
 * asked for, fed the trace's requests in order; what it measured. Shared by
 * a single run, a sweep, and the instances of a fleet (replay_fleet.c). */
#ifndef KVTIER_TOOLS_REPLAY_RUN_H
#define KVTIER_TOOLS_REPLAY_RUN_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "kvtier/cache.h"
#include "kvtier/radix.h"
#include "replay.h"
#include "replay_data.h"
#include "replay_l3.h"
#include "trace.h"

/* What a long-running replay holds, sampled after a pass (--soak). */
typedef struct soak_sample {
    uint64_t pass, requests;
    double at_s;
    uint64_t rss_kb, fds, threads;
    int64_t live_bytes; /* kvt_mem_stats: kvtier's own structures */
    uint64_t pool_idle_bytes; /* of them, held by the tree's node pool and not in use (it keeps its peak) */
} soak_sample_t;

/* The passes of a replay, and (--soak) what the process held after the
 * first, the first to end past half the soak's time (by then the tree's node
 * pool has met its peak: it keeps what it held) and the last. */
typedef struct soak {
    uint64_t passes; /* times the trace was replayed (1 without --soak) */
    soak_sample_t first, middle, last;
} soak_t;

typedef struct result {
    uint64_t l1_pages, l2_pages; /* the run's caches', all of them (a fleet's: every instance's) */
    uint64_t nreq;      /* requests replayed */
    kvt_cache_stats_t cs;
    kvt_radix_stats_t rs;
    uint64_t digest; /* kvt_cache_digest at the end: the cache's decisions, in order */
    double wall_s;
    double wall_user_s, wall_sys_s; /* the process's CPU time during wall_s (getrusage): user, kernel */
    uint64_t wall_faults;  /* page faults during wall_s (minor + major) */
    double tokens_s;    /* of it, the driver's: building the requests' token arrays (trace_block_tokens) */
    data_result_t data; /* --data */
    l3_result_t l3;     /* --l3 URL */
    soak_t soak;
} result_t;

/* Replays the requests reqs[0..nreqs) of t (all of them, up to --limit,
 * when reqs is NULL) on a fresh cache of l1_pages L1 pages. -1 after
 * printing why; -2 for a bad --l3 URL. */
int replay_run_one(const kvt_trace_t *t, const opts_t *o, const l3_opts_t *l, uint64_t l1_pages, const uint32_t *reqs,
                   uint64_t nreqs, result_t *res);

/* --instances N: N processes, each a replay_run_one over its share of the
 * trace, all on the one --l3 store. each[N] gets every instance's result,
 * *total their sum. -1 after printing why. */
int replay_fleet(const kvt_trace_t *t, const opts_t *o, const l3_opts_t *l, result_t *each, result_t *total);
/* The fleet's mechanism, for any kind of run: N processes (N <= 64), the
 * n requests of t dealt by replay_route; each runs run(arg, its requests,
 * their number, its result of size bytes, zeroed) and sends the result back
 * into each[i] (N x size bytes). -1 after printing why. */
typedef int (*replay_instance_fn)(void *arg, const uint32_t *reqs, uint64_t n, void *result);
int replay_instances(const kvt_trace_t *t, uint64_t n, uint32_t instances, replay_instance_fn run, void *arg, void *each,
                     size_t size);
/* The instance request i goes to (the documented rule: sessions, dealt round
 * robin). route[n]; returns the number of sessions. */
uint64_t replay_route(const kvt_trace_t *t, uint64_t n, uint32_t instances, uint32_t *route);

/* A pass of the trace is over after `requests` requests, `at_s` seconds
 * into the run, on the cache c (the hybrid cache's radix cache for a hybrid
 * model): counted, and with --soak sampled. True when --soak's time asks
 * for another pass. */
bool replay_soak_pass(soak_t *s, const opts_t *o, kvt_cache_t *c, uint64_t requests, double at_s);
/* --soak's figures: x's object "soak". */
void replay_soak_json(cJSON *x, const soak_t *s, const opts_t *o);
/* --soak's figures: a line of the table. */
void replay_soak_print(const soak_t *s);

/* s's counts added to d's (latencies merged). */
void replay_store_add(kvt_store_stats_t *d, const kvt_store_stats_t *s);
/* A store's figures as x's object name: url, backend, per operation its
 * counts and latency percentiles. */
void replay_store_json(cJSON *x, const char *name, const l3_result_t *l);
/* Pages requests [0, n) of t could occupy: an L1 of this size never evicts. */
uint64_t replay_trace_pages(const kvt_trace_t *t, uint64_t n, uint64_t page_tokens);

#endif
