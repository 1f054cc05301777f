/* kvtier — PD hand-off: a prefill CP group of C ranks hands a request's KV
 * pages to a decode instance (docs/pd.md).
 *
 *   prefill rank r (sender)                      decode (receiver)
 *   kvt_pd_sender_create  -- HELLO{r, C, token} -->  control port: token checked,
 *                         <-- WELCOME{geometry,      slot r taken once
 *                                 generation}
 *   kvt_pd_sender_begin   -- REQ{h, n}        -->  first REQ of h: n pool pages
 *                         <-- DST{h, n pages}      reserved (extent allocator,
 *                                                  contiguous-preferred; rank
 *                                                  s's share consecutive)
 *   kvt_pd_sender_send    == runs (tcp/ucx)   ==>  page server: into the pool
 *                         -- DONE{h, status}  -->  all C DONEs: hand-off complete
 *                                                  kvt_pd_receiver_poll reports it
 *                                                  with its page list; the caller
 *                                                  owns the pages until
 *                                                  kvt_pd_receiver_release
 *   kvt_pd_sender_finish  -- BYE              -->
 *
 * Every rank sends the pages it owns (page j of a hand-off is rank j mod C's),
 * so the hand-off lands when the slowest rank's pages do; the receiver keeps
 * per-rank latencies and names the straggler in its statistics.
 *
 * Faults. A rank whose control connection closes without BYE has vanished:
 * every hand-off still missing its DONE fails (only those), and a failed
 * hand-off's pages stay reserved (a tombstone) until no rank can still write
 * them; it is then reported (KVT_PD_EV_FAILED, with its pages) and the caller
 * releases it like a completed one. After that, as after a rank's goodbye,
 * no new hand-off is accepted (the group can never complete one), and the
 * data port refuses the rank that left. If the ranks do not all join within
 * join_timeout_ms, those that did are disconnected (their next call fails
 * with KVT_EIO). Nothing moving for timeout_ms fails the
 * hand-offs in flight. A decode that dies is replaced by a new receiver with
 * the next `generation` and a `resume_from`: the senders reconnect
 * (kvt_pd_sender_reconnect) and hand-offs below resume_from are refused.
 *
 * Threads. The receiver runs its control loop on a thread of its own. poll
 * is called from one thread at a time; release, stats and the port queries
 * may be called from any thread, concurrently with poll; create and destroy
 * on the owning thread, not concurrently with the others. A
 * sender is used by one thread at a time (its calls block: begin until decode
 * answers, send until decode acknowledged every byte).
 */
#ifndef KVTIER_PD_H
#define KVTIER_PD_H

#include "kvtier/export.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvtier/net.h"
#include "kvtier/stats.h"
#include "kvtier/tier.h"
#include "kvtier/xfer.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_PD_MAX_RANKS 32

/* ---- statistics ------------------------------------------------------------------ */

/* Per rank. The sender fills the sender's fields (kvt_pd_sender_stats), the
 * receiver its own (kvt_pd_receiver_stats); kvt_pd_rank_stats_merge puts the
 * two halves (or two generations) together. X(field, KIND, help). */
#define KVT_PD_RANK_STATS_FIELDS(X)                                                        \
    X(handoffs, COUNTER, "hand-offs this rank delivered (sender)")                         \
    X(failed, COUNTER, "hand-offs this rank could not deliver (sender)")                   \
    X(released_pages, COUNTER, "its pages of hand-offs lost with a broken link (sender)")  \
    X(bytes, COUNTER, "bytes sent to decode (sender)")                                     \
    X(runs, COUNTER, "runs the pages coalesced into (sender)")                             \
    X(pages, COUNTER, "pages sent (sender)")                                               \
    X(batches, COUNTER, "batches, one per hand-off (sender)")                              \
    X(busy_ns, COUNTER, "time the transfer engine spent sending (sender)")                 \
    X(landed_last, COUNTER, "hand-offs whose last pages were this rank's (receiver)")      \
    X(straggler_flags, COUNTER, "hand-offs after which it was the straggler (receiver)")   \
    X(median_ns, GAUGE, "median REQ-to-DONE time over the window (receiver)")

typedef struct kvt_pd_rank_stats {
#define KVT_STATS_FIELD_(name, kind, help) uint64_t name;
    KVT_PD_RANK_STATS_FIELDS(KVT_STATS_FIELD_)
#undef KVT_STATS_FIELD_
    double gbps;             /* bytes / busy_ns (sender) */
    double straggler_factor; /* its median over the group's, when last flagged (receiver) */
    kvt_hist_t batch_ns;     /* submit to acknowledged, per batch (sender) */
} kvt_pd_rank_stats_t;

/* The receiver's, for the whole group. */
#define KVT_PD_STATS_FIELDS(X)                                                                        \
    X(handoffs, COUNTER, "hand-offs completed")                                                       \
    X(failed, COUNTER, "hand-offs that failed at decode")                                            \
    X(refused, COUNTER, "requests refused (group broken, too large, lost with an earlier decode)")   \
    X(bytes, COUNTER, "bytes of completed hand-offs")                                                 \
    X(pages, COUNTER, "pages of completed hand-offs")                                                 \
    X(pool_pages, GAUGE, "pages of the pool")                                                         \
    X(free_pages, GAUGE, "pool pages free (neither in flight nor held by the caller)")                \
    X(joined, GAUGE, "ranks that joined")                                                             \
    X(vanished, COUNTER, "ranks whose connection closed without a goodbye")                          \
    X(data_refused_hellos, COUNTER, "data port: hellos refused (wrong version, token or geometry)")  \
    X(data_bad_peers, COUNTER, "data port: peers closed for malformed data or no hello")             \
    X(data_silent_peers, GAUGE, "data port: connections without a hello")                            \
    X(control_bad_peers, COUNTER, "control port: peers dropped (no hello in time, no token, garbage)")

typedef struct kvt_pd_stats {
    uint32_t size;  /* sizeof(kvt_pd_stats_t), set by the caller */
    uint32_t ranks; /* C: rank[0..C) are meaningful */
#define KVT_STATS_FIELD_(name, kind, help) uint64_t name;
    KVT_PD_STATS_FIELDS(KVT_STATS_FIELD_)
#undef KVT_STATS_FIELD_
    int32_t straggler;        /* the rank flagged most (the lowest among equals), -1 when none */
    double straggler_factor;  /* its latest factor */
    int32_t first_vanished;   /* the first rank that vanished, -1 when none */
    uint64_t first_failed;    /* the lowest hand-off that failed or was refused, plus 1 (0: none) */
    kvt_hist_t handoff_ns;    /* first REQ to last DONE */
    char data_last_error[128], control_last_error[128];
    kvt_pd_rank_stats_t rank[KVT_PD_MAX_RANKS];
} kvt_pd_stats_t;

/* Sets st to an empty snapshot for C ranks (st->size set by it). */
KVT_API void kvt_pd_stats_init(kvt_pd_stats_t *st, uint32_t ranks);
/* Adds src to dst: counters add, gauges take the larger, histograms merge,
 * the straggler is chosen again; last errors are src's where it has one. */
KVT_API void kvt_pd_stats_merge(kvt_pd_stats_t *dst, const kvt_pd_stats_t *src);
KVT_API void kvt_pd_rank_stats_merge(kvt_pd_rank_stats_t *dst, const kvt_pd_rank_stats_t *src);
/* Sections "rank<r>" (every rank field, gbps, batch_ns) and "decode" (every
 * field, straggler, handoff_ns). */
KVT_API void kvt_pd_stats_emit(const kvt_pd_stats_t *st, kvt_emitter_t *e);

/* ---- the decode side: receiver ---------------------------------------------------- */

typedef struct kvt_pd_receiver kvt_pd_receiver_t;

typedef struct kvt_pd_receiver_config {
    uint32_t size;                 /* sizeof(kvt_pd_receiver_config_t) */
    kvt_tier_t *pool;              /* the caller's host-visible tier the pages land in; must outlive the receiver */
    kvt_net_transport_t transport; /* how the senders' pages travel (the page server's transport) */
    const char *host;              /* listen address, IPv4 (NULL: 127.0.0.1) */
    uint16_t data_port, control_port; /* 0: any free port */
    uint32_t ranks;                /* C, 1..KVT_PD_MAX_RANKS */
    uint64_t token;                /* the group's secret, nonzero: hellos without it are dropped, on the control port and the
                                    * data port (a page server of token 0 takes any writer) */
    uint32_t generation;           /* decode restarts so far, told to every sender */
    uint64_t resume_from;          /* hand-offs below it are refused (lost with an earlier decode) */
    uint64_t timeout_ms;           /* no control message this long fails the hand-offs in flight (0: 10000) */
    uint64_t join_timeout_ms;      /* every rank must have joined by then (0: 20000) */
    uint32_t window;               /* hand-offs the straggler is judged over, >= 2 (0: 16) */
    double straggler_factor;       /* flagged above this many times the group's median (0: 3) */
    uint32_t max_live;             /* hand-offs in flight or held by the caller at once (0: 256) */
} kvt_pd_receiver_config_t;

typedef enum kvt_pd_event_type {
    KVT_PD_EV_COMPLETE = 1, /* every rank's pages are in; the caller owns the pages until release */
    KVT_PD_EV_FAILED = 2,   /* it will never complete; no rank writes its pages any more (a vanished rank's
                               data connections are cut first: docs/pd.md); release them */
    KVT_PD_EV_END = 3       /* the control loop ended: every rank said goodbye or vanished (status
                               KVT_OK), or not every rank joined in time (KVT_ETIMEDOUT) */
} kvt_pd_event_type_t;

typedef enum kvt_pd_fail_reason {
    KVT_PD_FAIL_NONE = 0,
    KVT_PD_FAIL_VANISHED = 1, /* `rank` vanished before its DONE */
    KVT_PD_FAIL_SEND = 2,     /* `rank` said DONE with a failed transfer, or asked for another size (`status`) */
    KVT_PD_FAIL_TIMEOUT = 3,  /* nothing moved for timeout_ms; `rank` is the first it waited for */
    KVT_PD_FAIL_BYE = 4       /* `rank` said goodbye before its DONE */
} kvt_pd_fail_reason_t;

typedef struct kvt_pd_event {
    kvt_pd_event_type_t type;
    uint64_t handoff;
    int status;                  /* FAILED: KVT_EIO or KVT_ETIMEDOUT; END: see above */
    int32_t rank;                /* FAILED: the rank that failed it */
    kvt_pd_fail_reason_t reason; /* FAILED */
    uint64_t npages;
    const uint32_t *pages;       /* page j of the hand-off is pool page pages[j]; valid until release */
} kvt_pd_event_t;

/* Listens on both ports and starts the control thread; the join deadline
 * runs from here. Errors, nothing left behind: KVT_EINVAL (no pool, a pool
 * that is not host-visible or keeps per-page checksums (kvt_net_server_create),
 * ranks out of range, a bad host), KVT_ENOMEM,
 * KVT_ENOTSUP (UCX not built), KVT_EIO (cannot listen or start a thread). */
KVT_API int kvt_pd_receiver_create(kvt_pd_receiver_t **out, const kvt_pd_receiver_config_t *cfg);
/* Stops the control thread and the page server and closes every connection.
 * Pages of events not released are simply forgotten (the pool is the caller's). */
KVT_API void kvt_pd_receiver_destroy(kvt_pd_receiver_t *r);
KVT_API uint16_t kvt_pd_receiver_data_port(const kvt_pd_receiver_t *r);
KVT_API uint16_t kvt_pd_receiver_control_port(const kvt_pd_receiver_t *r);

/* Takes up to max events, waiting up to timeout_ns for the first (0: do not
 * wait). Returns how many (>= 0) or KVT_EINVAL. A COMPLETE event's pages are
 * readable by the caller from the return on. */
KVT_API int kvt_pd_receiver_poll(kvt_pd_receiver_t *r, kvt_pd_event_t *ev, size_t max, uint64_t timeout_ns);
/* Gives a reported hand-off's pages back to the pool (a request waiting for
 * room may then be answered). KVT_ENOENT (not reported, or released already:
 * nothing changed), KVT_ENOMEM (the pool could not take them back: nothing
 * changed, release it again), KVT_EINVAL. */
KVT_API int kvt_pd_receiver_release(kvt_pd_receiver_t *r, uint64_t handoff);
/* A snapshot (st->size set by the caller). KVT_EINVAL, KVT_ENOMEM. */
KVT_API int kvt_pd_receiver_stats(kvt_pd_receiver_t *r, kvt_pd_stats_t *st);

/* ---- the prefill side: sender (one per rank) -------------------------------------- */

typedef struct kvt_pd_sender kvt_pd_sender_t;

typedef struct kvt_pd_sender_config {
    uint32_t size;                 /* sizeof(kvt_pd_sender_config_t) */
    kvt_tier_t *src;               /* the caller's host-visible tier holding this rank's pages (a GPU's go by
                                    * host memory); must outlive the sender */
    kvt_net_transport_t transport;
    const char *host;              /* the receiver's IPv4 address (NULL: 127.0.0.1) */
    uint16_t data_port, control_port;
    uint32_t rank, ranks;          /* r < C */
    uint64_t token;
    uint32_t streams;              /* connections per engine worker to the page server (0: 4) */
    uint64_t max_batch_bytes;      /* engine work item cap (0: 16 MiB) */
    uint64_t welcome_timeout_ms;   /* how long to wait for the receiver's welcome (0: 20000) */
} kvt_pd_sender_config_t;

/* Connects to the receiver, says hello and waits for its welcome (which
 * gives the pool's geometry), then sets up a transfer engine from src to the
 * pool. Errors, nothing left behind: KVT_EINVAL (also a src the CPU cannot
 * read), KVT_ENOMEM, KVT_EIO (cannot
 * connect, or dropped: a wrong token, rank or group size), KVT_ETIMEDOUT. */
KVT_API int kvt_pd_sender_create(kvt_pd_sender_t **out, const kvt_pd_sender_config_t *cfg);
/* Closes the links without a goodbye (the receiver sees the rank vanish
 * unless kvt_pd_sender_finish said goodbye). */
KVT_API void kvt_pd_sender_destroy(kvt_pd_sender_t *s);
/* After a decode restart: drops the old links and joins the receiver at the
 * new ports, which must have a newer generation. The statistics carry over.
 * KVT_EIO (cannot connect, dropped, or not newer), KVT_ETIMEDOUT,
 * KVT_ENOMEM; the sender is then unlinked, and reconnect may be tried again. */
KVT_API int kvt_pd_sender_reconnect(kvt_pd_sender_t *s, uint16_t data_port, uint16_t control_port);
/* The destinations of hand-off h of n pages (all C ranks' pages): dst[j] is
 * the pool page for page j. Blocks while decode waits for room. A hand-off
 * id is used once: decode refuses one of the last 1,024 it released
 * (KVT_EIO), a straggler's or a replay's REQ. Errors:
 * KVT_EINVAL (n == 0, NULL); refused by decode with the link intact
 * (kvt_pd_sender_linked stays true): KVT_ERANGE (n is more than the pool
 * holds), KVT_ENOENT (h < the receiver's resume_from: lost with an earlier
 * decode), KVT_EIO (the group is broken, or h failed already); KVT_EIO with
 * the link broken (decode gone, or an answer no receiver gives: a page
 * outside the pool or twice). Each of those counts h as failed; KVT_EINVAL
 * and KVT_ENOMEM (before decode was asked) count nothing. */
KVT_API int kvt_pd_sender_begin(kvt_pd_sender_t *s, uint64_t h, uint64_t n, uint32_t *dst);
/* Sends this rank's pages of h (copies: src page -> dst page from begin)
 * through the transfer engine, waits until decode acknowledged every byte,
 * then says DONE (with the status). The source pages are the caller's again
 * on return. KVT_OK; KVT_EINVAL (nothing sent, nothing said: also for h
 * not the hand-off begun last and not yet sent, or a destination page not
 * in this rank's share of the list begin gave, dst[j] for j mod C == rank:
 * another rank's, or another hand-off's); the batch's error or
 * KVT_EIO (h counted failed; the link may be broken). */
KVT_API int kvt_pd_sender_send(kvt_pd_sender_t *s, uint64_t h, const kvt_xfer_copy_t *copies, size_t n);
/* Goodbye: every hand-off of this rank is done. KVT_EIO (not linked). */
KVT_API int kvt_pd_sender_finish(kvt_pd_sender_t *s);
/* False once the link to the receiver broke (until a reconnect succeeds). */
KVT_API bool kvt_pd_sender_linked(const kvt_pd_sender_t *s);
/* The generation of the receiver it is (or was last) joined to. */
KVT_API uint32_t kvt_pd_sender_generation(const kvt_pd_sender_t *s);
/* This rank's sender-side figures, over every generation. KVT_EINVAL. */
KVT_API int kvt_pd_sender_stats(kvt_pd_sender_t *s, kvt_pd_rank_stats_t *st);

#ifdef __cplusplus
}
#endif
#endif
