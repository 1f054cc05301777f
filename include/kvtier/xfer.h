/* kvtier — the transfer engine: page copies between tiers, coalesced into
 * runs, run on worker threads, measured.
 *
 * A batch is a list of page copies from one tier to another. The engine sorts
 * it by destination page and merges runs where source and destination both
 * advance by one:
 *
 *   copies (src->dst)  7->40  8->41  9->42  3->43  4->44  12->50
 *   runs               [7..9]->[40..42]   [3..4]->[43..44]   [12]->[50]
 *   copies made        both page_first: one per run (3)
 *                      both layer_first: one per run per layer (3 x layers)
 *                      mixed layouts: one per page per layer (6 x layers)
 *                      an engine tier (tier.h): one per layer and plane piece
 *                      where both sides' pages are back to back in it, else
 *                      per page too (docs/engine.md has the table)
 *
 * A batch is cut into work items of at most max_batch_bytes and
 * max_batch_copies each (an item of one page where a page is larger);
 * items go to the queue of their destination tier, served by that queue's
 * own workers, so one slow destination does not hold the others. Submit
 * returns at once. A batch completes when its last item is done, after
 * every byte is in place (device copies are waited for), and is then
 * reported by kvt_xfer_poll (and the optional callback). A failed copy
 * fails its batch (one status per batch), whose items not yet started are
 * skipped; the caller decides what that means for residency — the engine
 * only moves bytes.
 *
 * Host copies into a tier that is not read back soon (and any past 8 MiB)
 * use non-temporal stores. How a long one goes (one stream of cache lines,
 * or four side by side) is what this machine does faster: kvt_xfer_create
 * times both once per process, a few milliseconds, and
 * kvt_xfer_copy_streams says which it keeps; KVT_COPY_STREAMS=1 or 4 in the
 * environment decides instead (docs/performance.md, *Four streams of
 * lines*).
 *
 * Integrity: when a tier keeps checksums (KVT_TIER_CHECKSUM) and the engine's
 * `checksum` option is on, a page landing in that tier gets its XXH3-64
 * recorded, and a page read from it is verified first: a mismatch fails the
 * batch with KVT_ECORRUPT before anything is copied.
 *
 * Threading: submit, stats (and the testing library's kvt_xfer_set_faults,
 * kvtier/testing.h) may be called from any thread;
 * poll from one thread at a time (the copies it returns stay valid until the
 * next poll, from whichever thread). The callback runs on a worker thread,
 * just before the batch becomes pollable — so everything it does happens
 * before the caller can see the completion — and must not call the engine.
 */
#ifndef KVTIER_XFER_H
#define KVTIER_XFER_H

#include "kvtier/export.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvtier/stats.h"
#include "kvtier/tier.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_XFER_MAX_TIERS 8

typedef struct kvt_xfer kvt_xfer_t;

typedef struct kvt_xfer_copy {
    uint32_t src_page, dst_page;
} kvt_xfer_copy_t;

typedef struct kvt_xfer_done {
    uint64_t ticket;
    uint64_t user;              /* as given to submit */
    /* KVT_OK; KVT_ECORRUPT (a source page's checksum failed: bad_page);
     * KVT_EIO (a copy failed); KVT_ENOMEM (a worker's copy context or
     * connection could not be made); with a tcp or ucx tier also KVT_EINVAL
     * (the peer refused the connection: another version, token or
     * geometry). */
    int status;
    uint32_t src, dst;          /* tier indices */
    const kvt_xfer_copy_t *copies; /* the batch, sorted by destination page; valid until the next poll */
    size_t n;
    uint64_t bad_page;          /* KVT_ECORRUPT: a source page whose checksum failed */
} kvt_xfer_done_t;

typedef void (*kvt_xfer_cb)(void *arg, const kvt_xfer_done_t *done);

typedef struct kvt_xfer_config {
    uint32_t size;              /* sizeof(kvt_xfer_config_t) */
    uint32_t threads;           /* workers per destination queue, 1..64 (default 1) */
    uint64_t max_batch_bytes;   /* bytes per work item (default 64 MiB) */
    uint32_t max_batch_copies;  /* copies per work item (default 4096) */
    bool checksum;              /* record and verify page checksums (default true) */
    kvt_xfer_cb on_done;        /* optional; runs on a worker thread */
    void *arg;
} kvt_xfer_config_t;

KVT_API void kvt_xfer_config_default(kvt_xfer_config_t *cfg);

/* tiers[0..ntiers) are the engine's tiers, named by their index in calls.
 * They must outlive the engine, be at least two, and share one geometry
 * (layers and layer_bytes; their page counts may differ). When a device tier
 * is among them, host tiers (and engine tiers on host memory with
 * KVT_TIER_REGISTER) are registered with it for DMA. KVT_EINVAL (also:
 * max_batch_copies below one page's copies between two of the tiers; one
 * tier given twice; KVT_COPY_STREAMS set to other than 1 or 4), KVT_ENOMEM,
 * KVT_EIO (threads). */
KVT_API int kvt_xfer_create(kvt_xfer_t **out, const kvt_xfer_config_t *cfg, kvt_tier_t *const *tiers, unsigned ntiers);

/* How this process streams a long host copy: 1 (one stream of cache lines)
 * or 4 (four side by side), timed on the first call here or the first
 * kvt_xfer_create, whichever comes first (the essay above). */
KVT_API unsigned kvt_xfer_copy_streams(void);
/* Waits for every batch in flight, then stops the workers. Completions not
 * polled are dropped. */
KVT_API void kvt_xfer_destroy(kvt_xfer_t *x);

/* Queues a batch of n >= 1 copies from tier src to tier dst (src != dst).
 * *ticket (optional) identifies it in the completion. On failure nothing is
 * queued and nothing will complete: KVT_EINVAL (tier or page out of range, a
 * destination page twice, a source that is a peer's tier: tcp and ucx are
 * written only, and only from host memory: not from a GPU tier), KVT_ENOMEM. The pages belong to the engine until
 * the batch is reported complete. */
KVT_API int kvt_xfer_submit(kvt_xfer_t *x, unsigned src, unsigned dst, const kvt_xfer_copy_t *copies, size_t n,
                    uint64_t user, uint64_t *ticket);
/* Takes up to max completed batches into out, waiting up to timeout_ns for
 * the first (0: do not wait). Returns how many (>= 0) or KVT_EINVAL. */
KVT_API int kvt_xfer_poll(kvt_xfer_t *x, kvt_xfer_done_t *out, size_t max, uint64_t timeout_ns);
/* Batches submitted and not yet taken by poll. */
KVT_API uint64_t kvt_xfer_pending(kvt_xfer_t *x);

/* Statistics per (source, destination) tier pair. */
#define KVT_XFER_STATS_FIELDS(X)                                                    \
    X(batches, COUNTER, "batches completed")                                      \
    X(failures, COUNTER, "batches that failed")                                   \
    X(corrupt, COUNTER, "batches failed by a checksum mismatch")                  \
    X(pages, COUNTER, "pages copied")                                             \
    X(runs, COUNTER, "runs the pages coalesced into")                             \
    X(copies, COUNTER, "contiguous copies made (per run, run x layer or page x layer)") \
    X(items, COUNTER, "work items run (batches cut by the byte and copy caps)")   \
    X(bytes, COUNTER, "bytes copied")                                             \
    X(busy_ns, COUNTER, "time workers spent copying the batches completed")      \
    X(inflight_batches, GAUGE, "batches submitted and not completed")             \
    X(inflight_bytes, GAUGE, "bytes of the batches in flight")

typedef struct kvt_xfer_stats {
    uint32_t size; /* sizeof(kvt_xfer_stats_t), set by the caller */
    uint32_t src, dst;
#define KVT_STATS_FIELD_(name, kind, help) uint64_t name;
    KVT_XFER_STATS_FIELDS(KVT_STATS_FIELD_)
#undef KVT_STATS_FIELD_
    double gbps;        /* bytes / busy_ns: one worker's copy throughput while copying (the engine's
                         * is up to `threads` times this, when its workers copy at once) */
    kvt_hist_t queue_ns; /* submit -> a worker starts the item */
    kvt_hist_t copy_ns;  /* the item's copies */
    kvt_hist_t e2e_ns;   /* submit -> the batch completes */
} kvt_xfer_stats_t;

/* A snapshot of the statistics of pair src -> dst (two tiers: no copy goes
 * from a tier to itself). KVT_EINVAL. */
KVT_API int kvt_xfer_stats(kvt_xfer_t *x, unsigned src, unsigned dst, kvt_xfer_stats_t *st);
/* Emits a section "<src>_to_<dst>" per pair that has seen traffic: each
 * tier by its name in [a-z0-9_] (its first 24 characters), and its index
 * after it where two tiers' would be the same ("host0_to_host1"); every
 * tier's index where two pairs' sections would still be one ("_to_" in a
 * name: "a_to_b0_to_c1", "a2_to_b_to_c3"). */
KVT_API void kvt_xfer_emit(kvt_xfer_t *x, kvt_emitter_t *e);

#ifdef __cplusplus
}
#endif
#endif
