/* Private to src/pd: the receiver's state (receiver.c; the testing
 * library's src/testing/testpeers.c opens its bad peers against it) and the
 * statistics helpers (stats.c). */
#ifndef KVTIER_PD_INT_H
#define KVTIER_PD_INT_H

#include <pthread.h>
#include <stdbool.h>

#include "kvtier/alloc.h"
#include "kvtier/pd.h"
#include "kvtier/stats.h"
#include "wire.h"

#define KVT_PD_MAX_PENDING 128     /* control connections awaiting their hello at once */
#define KVT_PD_HELLO_TIMEOUT_MS 2000 /* a control peer that has not said hello by then is dropped */
#define KVT_PD_MAX_WINDOW 1024
#define KVT_PD_MAX_TEST_PEERS 256

typedef enum { LIVE_FREE = 0, LIVE_OPEN, LIVE_FAILED, LIVE_POSTED } live_state_t;

/* One hand-off decode knows: reserved pages, who has asked and answered. */
typedef struct kvt__pd_live {
    live_state_t state;
    uint64_t id, npages, t_first;
    uint64_t done_mask;  /* ranks that said DONE */
    uint64_t quiet_mask; /* ranks refused a DST for it: they will not write it */
    uint64_t t_req[KVT_PD_MAX_RANKS], t_done[KVT_PD_MAX_RANKS];
    uint32_t *dst;
    kvt_run_t *runs;
    size_t nruns;
    int32_t fail_rank;
    int fail_status;
    kvt_pd_fail_reason_t reason;
} kvt__pd_live_t;

/* How many released hand-offs the receiver remembers: a rank's REQ for one
 * (a straggler after its hand-off failed and was released, a replay) would
 * otherwise open it again, and hold its pages for a hand-off the other
 * ranks never send. */
#define KVT__PD_ENDED 1024

struct kvt_pd_receiver {
    kvt_pd_receiver_config_t cfg; /* defaults filled in */
    kvt_net_server_t *srv;
    kvt_extalloc_t *alloc;
    int lfd, wakefd;
    uint16_t dport, cport;
    uint64_t page_bytes, t_create;
    pthread_t th;
    pthread_mutex_t mu; /* everything below */
    pthread_cond_t cv;  /* an event was posted */
    bool stopping;
    _Atomic(bool) halt;   /* destroy has begun: a control message being read or written is given up */
    kvt__pd_live_t *live; /* [max_live] */
    kvt_pd_event_t *q;    /* a ring of max_live + 1 */
    size_t qhead, qlen;
    int fd[KVT_PD_MAX_RANKS];
    bool dead[KVT_PD_MAX_RANKS], finished[KVT_PD_MAX_RANKS], has_waiting[KVT_PD_MAX_RANKS];
    kvt__pd_op_t waiting[KVT_PD_MAX_RANKS]; /* a REQ that found no room, per rank */
    uint64_t ended[KVT__PD_ENDED]; /* the last hand-offs released (a ring): a REQ for one is refused, not a new one */
    uint32_t nended;
    uint64_t *lat; /* [rank][window]: rings of per-rank hand-off latencies */
    uint64_t nlat;
    kvt_pd_stats_t st;
    int peers[KVT_PD_MAX_TEST_PEERS]; /* the testing library's bad peers (kvtier/testing.h), closed at destroy */
    uint32_t npeers;
};

/* How long one control message may take: the group's timeout, and no
 * longer than destroy waits. A rank that stops mid-message, or stops
 * reading its answers, is taken for gone by then. */
static inline kvt__pd_by_t kvt__pd_bound(kvt_pd_receiver_t *r) {
    return (kvt__pd_by_t){kvt_now_ns() + r->cfg.timeout_ms * 1000000ull, &r->halt};
}

/* join.c: until every rank joined; KVT_OK, else KVT_ETIMEDOUT (or stopped). */
int kvt__pd_join(kvt_pd_receiver_t *r);
/* stats.c: the straggler from the per-rank flags. */
void kvt__pd_pick_straggler(kvt_pd_stats_t *st);

#endif
