/* kvtier replay's third tier: --l3 URL (a real store), --l3-pages N (a
 * modeled one), the L3 write policy, the prefetch policy, and how the replay
 * gives prefetches time (--prefetch-ahead: the next N requests are
 * prefetched while the current one is admitted, as a serving engine starts
 * a prefetch when a request arrives and admits it a scheduling step later).
 *
 * With --data the store reads and writes the L2 tier's pages. Metadata-only
 * runs with a real store give it a stand-in L2 tier of 64-byte pages: the
 * store holds real objects (whose identity, which includes the geometry,
 * keeps them apart from full-size ones), so hit rates, exists calls and
 * cross-instance sharing are real while the bytes stay small. */
#ifndef KVTIER_TOOLS_REPLAY_L3_H
#define KVTIER_TOOLS_REPLAY_L3_H

#include <stdbool.h>
#include <stdint.h>

#include "cli.h"
#include "kvtier/cache.h"
#include "kvtier/stats.h"
#include "kvtier/store.h"
#include "kvtier/tier.h"

#define L3_STANDIN_BYTES 64 /* a metadata-only run's page, in the store */

typedef struct l3_opts {
    const char *url;        /* --l3 (NULL: none) */
    uint64_t pages;         /* --l3-pages: a modeled L3 */
    int write_policy;       /* --l3-write-policy (kvt_write_policy_t) */
    uint64_t write_hits;    /* --l3-write-hits */
    int prefetch_policy;    /* --prefetch-policy (kvt_prefetch_policy_t) */
    double timeout_s, per_1024_s, max_s;
    uint64_t threshold;     /* --prefetch-threshold, tokens */
    uint64_t ahead;         /* --prefetch-ahead, requests */
    uint64_t delay_ms;      /* --l3-delay (kvtier-test): injected per store batch */
    uint64_t threads;       /* --l3-threads: store workers */
    uint64_t instances;     /* --instances */
} l3_opts_t;

void replay_l3_default(l3_opts_t *l);
/* The L3 rows of the options table into t; how many. */
size_t replay_l3_rows(l3_opts_t *l, cli_opt_t *t);
/* Cross-flag checks (-1 after printing the error). */
int replay_l3_finish(cli_t *c, const l3_opts_t *l, bool sweep);
void replay_l3_config(const l3_opts_t *l, kvt_cache_config_t *cfg);
bool replay_l3_on(const l3_opts_t *l);

/* The store's figures, by operation. */
typedef struct l3_result {
    bool store;
    bool down;              /* the store could not be reached at start: L1 and L2 served alone */
    char why[256];
    char url[256], backend[32];
    kvt_store_stats_t op[KVT_STORE_OP_COUNT_];
} l3_result_t;

typedef struct replay_l3 replay_l3_t;

/* Opens the store of --l3 over tier l2 (NULL: a stand-in tier of l2_pages
 * pages) and attaches it to c. model names the model identity. Prints why
 * and returns -2 for a malformed URL, -1 for another failure; a store
 * that cannot be reached is not a failure: it says so, and the run goes on
 * with L1 and L2 alone (*out NULL, down set), as a serving engine would.
 * *out stays NULL when there is no --l3 URL. */
int replay_l3_open(replay_l3_t **out, const l3_opts_t *l, kvt_cache_t *c, kvt_tier_t *l2, uint64_t l2_pages,
                   uint64_t page_tokens, const char *model, l3_result_t *down);
void replay_l3_result(replay_l3_t *r, l3_result_t *res);
void replay_l3_emit(replay_l3_t *r, kvt_emitter_t *e);
/* After the cache is destroyed. */
void replay_l3_close(replay_l3_t *r);

#endif
