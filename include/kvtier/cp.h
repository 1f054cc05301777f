/* kvtier — context-parallel (CP) shared KV: owner lanes and slot translation.
 *
 * Under CP size C the KV pages of one sequence are spread over the C ranks
 * of a node: logical page p is owned by lane (rank) p mod C and sits at local
 * page p div C of that lane. With R pages per rank and P slots (tokens) per
 * page, slot s is at
 *
 *   page  = s div P          offset = s mod P
 *   owner = page mod C       local  = page div C
 *
 * and has two addresses:
 *
 *   read view   (owner x R + local) x P + offset   all lanes, rank-major: what
 *                                                  the I/O rank reads to back
 *                                                  up every page
 *   write view  local x P + offset                 the owner's own shard
 *
 *   C = 4, P = 64, R = 8:  slot 64 -> page 1, owner 1, local 0
 *                          -> read slot (1 x 8 + 0) x 64 = 512, write slot 0
 *
 *   read view:  | lane 0: R pages | lane 1: R pages | lane 2 | lane 3 |
 *   logical:      0  4  8 ...       1  5  9 ...       2 ...    3 ...
 *
 * Padding slots (KVT_CP_PAD, what an engine puts in unused positions of a
 * batch) pass through every translation unchanged and are owned by no rank.
 */
#ifndef KVTIER_CP_H
#define KVTIER_CP_H

#include "kvtier/export.h"

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvtier/alloc.h"
#include "kvtier/cache.h"
#include "kvtier/tier.h"
#include "kvtier/xfer.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_CP_PAD UINT64_MAX

typedef struct kvt_cp_layout {
    uint32_t ranks;          /* C >= 1 */
    uint64_t pages_per_rank; /* R >= 1 */
    uint64_t slots_per_page; /* P >= 1 */
} kvt_cp_layout_t;

/* KVT_EINVAL for a zero or an overflowing size (C x R x P must fit 64 bits),
 * named in *why (why may be NULL), as every kvtier check() does. */
KVT_API int kvt_cp_layout_check(const kvt_cp_layout_t *l, const char **why);

static inline uint64_t kvt_cp_page(const kvt_cp_layout_t *l, uint64_t s) { return s == KVT_CP_PAD ? KVT_CP_PAD : s / l->slots_per_page; }
static inline uint64_t kvt_cp_offset(const kvt_cp_layout_t *l, uint64_t s) { return s == KVT_CP_PAD ? KVT_CP_PAD : s % l->slots_per_page; }
/* Owner lane and local page of a logical page. */
static inline uint32_t kvt_cp_owner(const kvt_cp_layout_t *l, uint64_t page) { return kvt_lane_of(page, l->ranks); }
static inline uint64_t kvt_cp_local(const kvt_cp_layout_t *l, uint64_t page) { return kvt_lane_local(page, l->ranks); }
/* The read-view page of a logical page: owner x R + local. */
static inline uint64_t kvt_cp_read_page(const kvt_cp_layout_t *l, uint64_t page) {
    return page == KVT_CP_PAD ? KVT_CP_PAD : kvt_lane_major(page, l->ranks, l->pages_per_rank);
}

/* Slot translation; KVT_CP_PAD passes through. A slot is below C x R x P
 * or KVT_CP_PAD: these run per slot on an engine's path and check nothing
 * else (a slot past the layout maps to one inside it). */
KVT_API uint64_t kvt_cp_read_slot(const kvt_cp_layout_t *l, uint64_t s);
KVT_API uint64_t kvt_cp_write_slot(const kvt_cp_layout_t *l, uint64_t s);
KVT_API bool kvt_cp_owns(const kvt_cp_layout_t *l, uint32_t rank, uint64_t s);
/* mask[i] = kvt_cp_owns(rank, slots[i]); returns how many are owned. */
KVT_API size_t kvt_cp_owned_mask(const kvt_cp_layout_t *l, uint32_t rank, const uint64_t *slots, size_t n, uint8_t *mask);

/* A host page and a logical device page. */
typedef struct kvt_cp_pair {
    uint64_t host, device;
} kvt_cp_pair_t;

/* The host -> device pairs rank must load: only the pages it owns, device
 * pages in its write view (local pages). Padding is skipped. Returns the
 * count written to out (room for n). */
KVT_API size_t kvt_cp_select_loads(const kvt_cp_layout_t *l, uint32_t rank, const kvt_cp_pair_t *pairs, size_t n,
                           kvt_cp_pair_t *out);
/* The device -> host pairs the I/O rank backs up: every page, device pages
 * in the read view; padding passes through. Returns n. */
KVT_API size_t kvt_cp_select_backups(const kvt_cp_layout_t *l, const kvt_cp_pair_t *pairs, size_t n, kvt_cp_pair_t *out);

/* ---- the group: C rank processes started by anyone, joined by name ------------
 *
 * A CP group is C processes (a fork, torchrun, MPI, a shell loop) that run
 * the same deterministic cache over one node's tiers (docs/cp.md). Rank 0
 * creates the group's named control segment /dev/shm/<name>-ctl, the others
 * attach it by name; it carries every ordering that crosses processes (rank
 * 0's backups landed per L2 page, each rank's `filled` and `done`), each
 * rank's pid, state, error text and result, and the digest table the ranks
 * agree through. The calls of one rank, in order:
 *
 *   kvt_cp_group_join          rank 0 creates, the others attach (waiting
 *                              for rank 0 up to timeout_ms); parameters
 *                              that differ from the group's are refused
 *                              (and stop the group)
 *   kvt_cp_group_open_tier     the shared tiers: rank 0 creates
 *                              /dev/shm/<name>-<suffix>, the others attach
 *   kvt_cp_group_wait_joined   every rank has joined (names those that did not)
 *   kvt_cp_group_xfer_config   before kvt_xfer_create: rank 0's transfer
 *                              workers publish the backups that landed
 *   kvt_cp_group_attach        kvt_cache_attach_cp with the group's hooks
 *   per request i:  kvt_cache_admit -> kvt_cp_group_admitted -> write this
 *                   rank's pages -> kvt_cp_group_filled -> commit, release
 *                   -> kvt_cp_group_step(i, kvt_cache_digest ...)
 *   kvt_cp_group_check_digests (any time, any rank; the first divergence)
 *   kvt_cp_group_finish        publishes this rank's result; rank 0 waits
 *                              for every rank's (kvt_cp_group_result)
 *   (destroy the cache, the engine and the tiers)
 *   kvt_cp_group_leave         rank 0 waits for the others and unlinks
 *
 * Every wait is bounded (wait_ms) and says what it waited for; a rank that
 * dies (its pid and start time are in its slot) is found by the ranks
 * waiting on it, and by every rank's step, within ~50 ms, and stops the
 * group naming it. Any failure stops the whole group: later calls of every
 * rank return KVT_EIO and kvt_cp_group_why says who stopped it and why.
 *
 * Threads: one thread of each rank makes the calls; the hooks run on the
 * cache's thread, the transfer callback on the engine's workers;
 * kvt_cp_group_fail may be called from any thread. */

#define KVT_CP_MAX_RANKS 256
#define KVT_CP_NAME_MAX 48         /* [A-Za-z0-9._-], segments /dev/shm/<name>-ctl, -l1, -l2 ... */
#define KVT_CP_RESULT_BYTES 256    /* a rank's published result */

typedef struct kvt_cp_group kvt_cp_group_t;

typedef struct kvt_cp_group_config {
    uint32_t size;        /* sizeof(kvt_cp_group_config_t) */
    const char *name;     /* the group */
    uint32_t rank;        /* this process, < ranks: rank 0 creates and is the I/O rank */
    uint32_t ranks;       /* C, 1 .. KVT_CP_MAX_RANKS */
    /* what every rank must agree on (a rank that differs is refused, naming the field) */
    uint64_t l1_pages;    /* the group's L1 pages, every lane (a multiple of ranks) */
    uint64_t l2_pages;
    uint32_t page_tokens;
    uint32_t layers;
    uint64_t layer_bytes; /* bytes of a page in one layer (0: no data plane) */
    uint32_t layout;      /* kvt_layout_t */
    uint64_t requests;    /* rows of the digest table */
    uint64_t tag;         /* anything else that must agree: a hash of the engine's options */
    /* limits */
    uint32_t timeout_ms;  /* joining, attaching and waiting for the others to join (0: 20000) */
    uint32_t wait_ms;     /* one ordering wait (0: 60000) */
    const volatile sig_atomic_t *cancel; /* optional: a flag (a signal handler's) that ends a join's wait (KVT_EIO) */
} kvt_cp_group_config_t;

typedef struct kvt_cp_group_info {
    uint32_t size;        /* sizeof(kvt_cp_group_info_t), set by the caller */
    uint32_t rank, ranks;
    bool creator;         /* this process created the control segment */
    bool replaced_stale;  /* ... over a dead creator's */
    bool stopped;         /* some failure stopped the group */
    int32_t stopped_by;   /* the rank whose failure (or death) stopped it, -1 */
    uint64_t divergence;  /* the first request (1-based) whose digests differ, 0: none found */
    uint64_t wait_ns;     /* this rank's time in ordering waits */
    uint64_t waits;       /* ... and how many had to wait */
} kvt_cp_group_info_t;

/* Joins group cfg->name as cfg->rank. Rank 0 creates the control segment
 * (a dead creator's is replaced; a live group's, or a file that is not a
 * kvtier segment, is left alone: KVT_EEXIST); the others attach it, waiting
 * up to timeout_ms for rank 0 (KVT_ETIMEDOUT), and are refused when a
 * parameter differs from the group's (KVT_EINVAL) or their rank is taken
 * (KVT_EEXIST). A rank refused for a parameter also stops the group with
 * that reason, so the ranks already joined fail at once (KVT_EIO from their
 * next wait) instead of at their join timeout: a launch with mismatched
 * ranks cannot finish. KVT_EINVAL for a bad config, KVT_ENOMEM. *why
 * (optional) says what failed in words, valid until this thread's next join
 * or leave. Apart from that stop, nothing is changed or left behind on
 * failure. */
KVT_API int kvt_cp_group_join(kvt_cp_group_t **out, const kvt_cp_group_config_t *cfg, const char **why);
/* Waits up to timeout_ms (from join) for every rank to join; KVT_ETIMEDOUT
 * names the ranks that did not, KVT_EIO when the group stopped. */
KVT_API int kvt_cp_group_wait_joined(kvt_cp_group_t *g);
/* A tier the group shares, the shm tier /dev/shm/<name>-<suffix>: rank 0
 * creates it from cfg (kind and name are the group's), the others attach it,
 * waiting for rank 0 up to timeout_ms. Errors stop the group with the
 * reason (kvt_cp_group_why): kvt_tier_create's, KVT_ETIMEDOUT, KVT_EIO;
 * except KVT_EINVAL for a suffix that is none (1 to 8 of [A-Za-z0-9._-],
 * not "ctl", the group's own segment), which changes nothing. */
KVT_API int kvt_cp_group_open_tier(kvt_cp_group_t *g, const char *suffix, const kvt_tier_config_t *cfg, kvt_tier_t **out);
/* Sets xc->on_done (keeping a callback already there, called after it) so
 * that rank 0's backups out of tier l1_index publish when they land. */
KVT_API void kvt_cp_group_xfer_config(kvt_cp_group_t *g, kvt_xfer_config_t *xc, unsigned l1_index);
/* The cache hooks of this rank (kvt_cache_attach_cp) ... */
KVT_API void kvt_cp_group_hooks(kvt_cp_group_t *g, kvt_cache_cp_t *hooks);
/* ... or attaching the cache with them: kvt_cache_attach_cp's errors, and
 * KVT_EINVAL for a cache whose l1_lanes, l1_pages or l2_pages are not the
 * group's ranks and pages (kvt_cp_group_why says); nothing changed on
 * failure. */
KVT_API int kvt_cp_group_attach(kvt_cp_group_t *g, kvt_cache_t *c, kvt_xfer_t *x, kvt_tier_t *l1, unsigned l1_index,
                        kvt_tier_t *l2, unsigned l2_index);

/* After kvt_cache_admit of the current request (l1_ids as it filled them):
 * records which L1 pages the request writes, and waits until rank 0 has
 * copied out the old content of those this rank writes (its own new pages).
 * KVT_EIO (stopped), KVT_ETIMEDOUT, KVT_ERANGE (a page id out of range),
 * KVT_EINVAL (no l1_ids for a request with pages to write). */
KVT_API int kvt_cp_group_admitted(kvt_cp_group_t *g, const kvt_cache_req_t *req, const uint32_t *l1_ids);
/* This rank has written its pages of request i (the current one). */
KVT_API int kvt_cp_group_filled(kvt_cp_group_t *g, uint64_t i);
/* Request i (0, 1, 2 ... in order) is done here; digest goes into the
 * table (row i < requests): kvt_cache_digest of a cache made with
 * cfg.decision_digest, or a hash of it (a cache made without it reports 0,
 * and ranks that all report 0 agree whatever they decide). KVT_EIO once the
 * group has stopped (a dead rank is found here too), KVT_ERANGE (i >=
 * requests), KVT_EINVAL out of
 * order; nothing changed on failure. */
KVT_API int kvt_cp_group_step(kvt_cp_group_t *g, uint64_t i, uint64_t digest);
/* Waits until every rank has done the first n requests and compares their
 * digests: *first_divergence = the first request (1-based) at which some
 * rank's digest differs from rank 0's, 0 when they agree (also kept for
 * kvt_cp_group_info). KVT_EIO, KVT_ETIMEDOUT, KVT_ERANGE (n > requests),
 * KVT_EINVAL (n > the requests this rank has stepped: it would wait on
 * itself; nothing changed). */
KVT_API int kvt_cp_group_check_digests(kvt_cp_group_t *g, uint64_t n, uint64_t *first_divergence);
/* This rank failed: stops the group with why (the first failure's reason
 * is the group's). Any thread. */
KVT_API void kvt_cp_group_fail(kvt_cp_group_t *g, const char *why);
/* The same from a signal handler (async-signal-safe): stops the group with
 * "rank R was interrupted by signal S", so that every rank, this one
 * included, unwinds through its calls (KVT_EIO) and leaves, and the creator
 * removes the segments. With g NULL (still joining) it does nothing: the
 * config's cancel flag ends a join. */
KVT_API void kvt_cp_group_interrupt(kvt_cp_group_t *g, int sig);
/* Publishes this rank's result (len <= KVT_CP_RESULT_BYTES) and marks it
 * finished; rank 0 then waits for every rank to finish. KVT_EIO,
 * KVT_ETIMEDOUT, KVT_EINVAL. */
KVT_API int kvt_cp_group_finish(kvt_cp_group_t *g, const void *result, size_t len);
/* A finished rank's result (len bytes). KVT_ENOENT when it has not
 * finished (one that failed, or left without finishing, never will),
 * KVT_EINVAL. */
KVT_API int kvt_cp_group_result(const kvt_cp_group_t *g, uint32_t rank, void *buf, size_t len);
/* Leaves and frees g. A rank that leaves still at work (neither finished
 * nor failed) stops the group, named: the others hear it at once rather
 * than at the end of a wait for it. Rank 0 first waits (timeout_ms) for
 * every rank that joined to finish, fail, leave or die, then unlinks the control segment
 * (only while the name is still its segment). KVT_ETIMEDOUT when some rank
 * was still running (named in *why); g is freed whatever it returns. */
KVT_API int kvt_cp_group_leave(kvt_cp_group_t *g, const char **why);

/* Why the last failing call of this rank failed ("" when none). */
KVT_API const char *kvt_cp_group_why(const kvt_cp_group_t *g);
KVT_API int kvt_cp_group_info(const kvt_cp_group_t *g, kvt_cp_group_info_t *info);
/* The name of segment suffix ("ctl", "l1" ...) of group name into buf. */
KVT_API int kvt_cp_group_segment(const char *name, const char *suffix, char *buf, size_t len);
/* Removes the segments of group name (its control segment and the tiers
 * named in suffixes, NULL-terminated) whose creator is dead, as a launcher
 * does after its group crashed; a live group's segments and foreign files
 * are left alone. Returns how many were removed. */
KVT_API int kvt_cp_group_remove_stale(const char *name, const char *const *suffixes);

#ifdef __cplusplus
}
#endif
#endif
