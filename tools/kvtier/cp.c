/* kvtier cp — a context-parallel group of C rank processes sharing one
 * node's KV (DESIGN.md §6, docs/cp.md).
 *
 *   coordinator (this process)
 *     |  control block  (shared anonymous mapping: progress, landed backups,
 *     |                  digests, results)
 *     |  L1 lanes       (shared arena: C lanes of R pages, rank-major = the
 *     |                  read view; rank r writes only lane r)
 *     +-- fork --> rank 0 (I/O rank): creates the L2 segment (POSIX shm),
 *     |                               makes every backup of the group
 *     +-- fork --> rank 1..C-1:       attach the L2 segment by name
 *
 * Every rank replays the same requests through its own cache (C owner lanes
 * in L1, the same L2 allocator state), so all make the same decisions and
 * agree on every page id without talking. Each rank writes the new pages it
 * owns and loads back only the pages it owns, into its own lane; rank 0
 * backs up every page, reading the other lanes. What has to be ordered
 * across processes, and nothing else, waits on the control block:
 *
 *   rank r loads a page                after rank 0's backup it depends on has
 *                                      landed (landed[] per L2 page, set by
 *                                      rank 0's transfer workers)
 *   rank r rewrites its L1 page        after rank 0 has copied out its old
 *                                      content
 *   rank 0 backs up a page             after its owner has written it (the
 *                                      owner's `filled` count; in an engine
 *                                      the forward pass's own collectives
 *                                      order this)
 *   rank 0 reuses an L2 page           after every rank has finished the
 *                                      request that freed it (`done`)
 *
 * After every request each rank folds its cache's decision digest into a
 * table; rank 0 compares the table at the end (and every --digest-every
 * requests, waiting for the others there) and names the first request at
 * which the ranks disagreed. The coordinator watches the ranks: one that
 * dies stops the group within a few seconds, and the L2 segment is unlinked
 * whatever happened.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "util.h"
#include "commands.h"
#include "kvtier/cp.h"
#include "kvtier/error.h"
#include "kvtier/radix.h"
#include "kvtier/tier.h"
#include "kvtier/xfer.h"
#include "group.h"
#include "replay.h"

#define MAX_RANKS 64
#define WAIT_LIMIT_NS (60ull * 1000000000ull) /* a wait this long means a stuck group */
#define L1_TIER 0
#define L2_TIER 1

enum { RUNNING = 0, FINISHED = 1, FAILED = 2 };

typedef struct rank_slot {
    _Atomic uint64_t filled; /* requests whose pages this rank has written */
    _Atomic uint64_t done;   /* requests this rank has finished */
    _Atomic int state;
    uint64_t owned_pages, dealt_pages, l1_hit_pages, loads, load_bytes, backups, backup_bytes, verified, mismatches;
    uint64_t tokens, hit_tokens, l1_hit_tokens;
    uint64_t wait_ns, digest;
    char err[320];
} rank_slot_t;

typedef struct ctl {
    _Atomic int stop;
    _Atomic int l2_created; /* rank 0 created the L2 segment: l2_dev, l2_ino name it */
    uint64_t l2_dev, l2_ino;
    uint32_t ranks;
    uint64_t nreq, l2_pages;
    uint64_t divergence; /* rank 0: first request (1-based) at which digests differ, 0: none */
    rank_slot_t slot[MAX_RANKS];
} ctl_t;

/* What the control block holds after the header. */
typedef struct group {
    ctl_t *ctl;
    size_t ctl_bytes;
    _Atomic uint64_t *landed; /* per L2 page: the sequence number of the last backup that landed there */
    uint64_t *digests;        /* [rank][request] */
    char l2_name[64];
    kvt_tier_t *l1;           /* the lanes (shared arena), or NULL without --data */
    kvt_cp_layout_t lay;      /* C, R, page tokens */
} group_t;

/* One rank's private state. */
typedef struct rank {
    group_t *g;
    const opts_t *o;
    const trace_t *t;
    uint32_t r, C;
    uint64_t R, n, cur;
    rank_slot_t *me;
    kvt_tier_t *l2;
    kvt_xfer_t *x;
    kvt_cache_t *c;
    uint64_t *seq_of_l2;     /* the last backup into each L2 page (every rank tracks all) */
    uint32_t *last_l2_of_l1; /* the last backup out of each L1 page: its L2 page ... */
    uint64_t *last_seq_of_l1; /* ... and sequence number */
    uint64_t *filled_req;    /* rank 0: the request that wrote each L1 page */
    uint64_t *freed_req;     /* rank 0: the request that freed each L2 page */
    uint8_t *buf;
    uint64_t layer_bytes;
    uint32_t layers;
    uint64_t digest_every;
} rank_t;

static void fail(rank_t *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(rank_t *k, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->me->err, sizeof(k->me->err), fmt, ap);
    va_end(ap);
    atomic_store(&k->me->state, FAILED);
    atomic_store(&k->g->ctl->stop, 1);
}

/* ---- ordering across processes ------------------------------------------------ */

typedef bool (*cond_fn)(rank_t *k, uint64_t a, uint64_t b);

static bool landed_cond(rank_t *k, uint64_t l2, uint64_t seq) {
    return atomic_load_explicit(&k->g->landed[l2], memory_order_acquire) >= seq;
}

static bool filled_cond(rank_t *k, uint64_t owner, uint64_t req) {
    return atomic_load_explicit(&k->g->ctl->slot[owner].filled, memory_order_acquire) > req;
}

static bool all_done_cond(rank_t *k, uint64_t req, uint64_t unused) {
    (void)unused;
    for (uint32_t r = 0; r < k->C; r++)
        if (atomic_load_explicit(&k->g->ctl->slot[r].done, memory_order_acquire) < req) return false;
    return true;
}

/* Waits for cond; KVT_EIO when the group stops, KVT_ETIMEDOUT after a minute. */
static int wait_for(rank_t *k, cond_fn cond, uint64_t a, uint64_t b, const char *what) {
    if (cond(k, a, b)) return KVT_OK;
    uint64_t t0 = now_ns();
    for (unsigned spin = 0;; spin++) {
        if (cond(k, a, b)) break;
        if (atomic_load(&k->g->ctl->stop)) return KVT_EIO;
        if (spin > 64) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
        if ((spin & 1023) == 0 && now_ns() - t0 > WAIT_LIMIT_NS) {
            fail(k, "rank %u: waited %llu s for %s (%" PRIu64 ", %" PRIu64 ") at request %" PRIu64, k->r,
                 WAIT_LIMIT_NS / 1000000000ull, what, a, b, k->cur + 1);
            return KVT_ETIMEDOUT;
        }
    }
    k->me->wait_ns += now_ns() - t0;
    return KVT_OK;
}

/* An L1 page may be rewritten once rank 0 has copied out its old content. */
static int wait_l1_free(rank_t *k, uint32_t l1) {
    uint64_t seq = k->last_seq_of_l1[l1];
    return seq ? wait_for(k, landed_cond, k->last_l2_of_l1[l1], seq, "the backup of an L1 page's old content") : KVT_OK;
}

static void on_backup_started(void *arg, uint32_t l1, uint32_t l2, uint64_t seq) {
    rank_t *k = arg;
    k->seq_of_l2[l2] = seq;
    k->last_l2_of_l1[l1] = l2;
    k->last_seq_of_l1[l1] = seq;
}

static void on_l2_freed(void *arg, uint32_t l2) {
    rank_t *k = arg;
    if (k->freed_req) k->freed_req[l2] = k->cur;
}

static int before_copy(void *arg, bool load, uint32_t l1, uint32_t l2, bool may_wait) {
    rank_t *k = arg;
    if (load) { /* into our lane: its source has landed, and the page's old content is out */
        if (!may_wait)
            return landed_cond(k, l2, k->seq_of_l2[l2]) &&
                           (!k->last_seq_of_l1[l1] || landed_cond(k, k->last_l2_of_l1[l1], k->last_seq_of_l1[l1]))
                       ? KVT_OK
                       : KVT_EAGAIN;
        int rc = wait_for(k, landed_cond, l2, k->seq_of_l2[l2], "rank 0's backup of a page to load");
        return rc == KVT_OK ? wait_l1_free(k, l1) : rc;
    }
    /* rank 0's backup: the owner wrote the page; nobody still needs what L2 held there */
    uint32_t owner = l1 % k->C;
    if (!may_wait)
        return filled_cond(k, owner, k->filled_req[l1]) && all_done_cond(k, k->freed_req[l2], 0) ? KVT_OK : KVT_EAGAIN;
    int rc = wait_for(k, filled_cond, owner, k->filled_req[l1], "a rank to write a page to back up");
    return rc == KVT_OK ? wait_for(k, all_done_cond, k->freed_req[l2], 0, "every rank to pass an L2 page's free") : rc;
}

/* Rank 0's transfer workers: a backup batch that landed publishes its pages. */
static void on_done(void *arg, const kvt_xfer_done_t *d) {
    rank_t *k = arg;
    if (d->src != L1_TIER) return;
    if (d->status != KVT_OK) { /* the others count it done: the group can only diverge; stop it, saying why */
        atomic_store(&k->g->ctl->stop, 1);
        fprintf(stderr, "kvtier cp: rank 0: a backup batch failed (%s); the group cannot stay in agreement\n",
                kvt_strerror(d->status));
        return;
    }
    for (size_t i = 0; i < d->n; i++)
        atomic_store_explicit(&k->g->landed[d->copies[i].dst_page], k->seq_of_l2[d->copies[i].dst_page],
                              memory_order_release);
}

/* ---- a rank --------------------------------------------------------------------- */

/* The file behind a POSIX shm name. */
static int stat_segment(const char *name, struct stat *st) {
    char path[96];
    snprintf(path, sizeof(path), "/dev/shm%s", name);
    return stat(path, st);
}

static int open_l2(rank_t *k) {
    const opts_t *o = k->o;
    kvt_tier_config_t tc = {.size = sizeof(tc), .kind = KVT_TIER_SHM, .name = k->g->l2_name, .flags = KVT_TIER_CHECKSUM,
                            .geom = {o->l2_pages, k->layers, k->layer_bytes, (kvt_layout_t)o->layout}};
    if (k->r == 0) {
        int rc = kvt_tier_create(&k->l2, &tc);
        struct stat st;
        if (rc == KVT_OK && stat_segment(k->g->l2_name, &st) == 0) { /* what the coordinator may unlink */
            k->g->ctl->l2_dev = (uint64_t)st.st_dev;
            k->g->ctl->l2_ino = (uint64_t)st.st_ino;
            atomic_store(&k->g->ctl->l2_created, 1);
        }
        if (rc == KVT_EEXIST)
            fail(k, "rank 0: cannot create the L2 segment /dev/shm%s: the name is taken by a file that is not a kvtier "
                    "segment, or by a live process's segment; it was left alone (remove it, or run elsewhere)",
                 k->g->l2_name);
        else if (rc != KVT_OK)
            fail(k, "rank 0: cannot create the L2 segment /dev/shm%s: %s", k->g->l2_name, kvt_strerror(rc));
        return rc;
    }
    tc.flags |= KVT_TIER_ATTACH;
    uint64_t t0 = now_ns();
    for (;;) { /* rank 0 creates it */
        int rc = kvt_tier_create(&k->l2, &tc);
        if (rc == KVT_OK) return rc;
        if (rc != KVT_ENOENT) {
            fail(k, "rank %u: cannot attach the L2 segment /dev/shm%s: %s", k->r, k->g->l2_name, kvt_strerror(rc));
            return rc;
        }
        if (atomic_load(&k->g->ctl->stop)) return KVT_EIO; /* another rank failed, and said why */
        if (now_ns() - t0 > 20000000000ull) {
            fail(k, "rank %u: the L2 segment /dev/shm%s did not appear in 20 s", k->r, k->g->l2_name);
            return KVT_ETIMEDOUT;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

static int setup(rank_t *k) {
    const opts_t *o = k->o;
    size_t l1n = k->C * k->R, l2n = o->l2_pages ? o->l2_pages : 1;
    k->seq_of_l2 = calloc(l2n, sizeof(uint64_t));
    k->last_l2_of_l1 = calloc(l1n, sizeof(uint32_t));
    k->last_seq_of_l1 = calloc(l1n, sizeof(uint64_t));
    k->filled_req = calloc(l1n, sizeof(uint64_t));
    k->freed_req = calloc(l2n, sizeof(uint64_t));
    k->buf = malloc(k->layer_bytes ? k->layer_bytes : 1);
    if (!k->seq_of_l2 || !k->last_l2_of_l1 || !k->last_seq_of_l1 || !k->filled_req || !k->freed_req || !k->buf)
        return KVT_ENOMEM;
    kvt_cache_config_t cfg;
    replay_cache_config(o, l1n, &cfg);
    cfg.l1_lanes = k->C;
    int rc = kvt_cache_create(&k->c, &cfg);
    if (rc != KVT_OK || !o->data) return rc;
    if ((rc = open_l2(k)) != KVT_OK) return rc;
    kvt_tier_t *tiers[2] = {k->g->l1, k->l2};
    kvt_xfer_config_t xc;
    kvt_xfer_config_default(&xc);
    xc.threads = (uint32_t)o->threads;
    if (k->r == 0) {
        xc.on_done = on_done;
        xc.arg = k;
    }
    if ((rc = kvt_xfer_create(&k->x, &xc, tiers, 2)) != KVT_OK) return rc;
    kvt_cache_cp_t cp = {.size = sizeof(cp), .rank = k->r, .io_rank = k->r == 0, .arg = k,
                         .backup_started = on_backup_started, .l2_freed = on_l2_freed, .before_copy = before_copy};
    return kvt_cache_attach_cp(k->c, k->x, k->g->l1, L1_TIER, k->l2, L2_TIER, &cp);
}

/* The tier page of cache L1 page p: its lane's shard, rank-major. */
static uint64_t lane_page(const rank_t *k, uint32_t p) { return kvt_cp_read_page(&k->g->lay, p); }

/* The request's pages this rank owns: check what it loaded, write what is new. */
static int own_pages(rank_t *k, const int32_t *tok, const kvt_cache_req_t *req, const uint32_t *ids, kvt_hash128_t *h) {
    uint64_t old = req->pages - req->new_pages;
    if (k->o->data) kvt_page_hash_chain(0, tok, req->pages, (uint32_t)k->o->page_tokens, h); /* the content model */
    for (uint64_t j = 0; j < req->pages; j++) {
        if (j >= req->l1_hit_pages) k->filled_req[ids[j]] = k->cur; /* loaded or new: written at this request */
        if (ids[j] % k->C != k->r) continue;
        if (j < req->l1_hit_pages) {
            k->me->l1_hit_pages++;
            continue;
        }
        if (j < old) { /* loaded from L2 into our lane */
            k->me->loads++;
            if (!k->o->data) continue;
            k->me->load_bytes += k->layers * k->layer_bytes;
            if (k->o->verify && !kvt_tier_pattern_check(k->g->l1, lane_page(k, ids[j]), h[j].lo, h[j].hi, k->buf) &&
                k->me->mismatches++ < 3)
                fprintf(stderr, "kvtier cp: rank %u: request %" PRIu64 " page %" PRIu64 " (L1 %u) differs after its load\n",
                        k->r, k->cur + 1, j, ids[j]);
            k->me->verified += k->o->verify;
            continue;
        }
        if (!k->o->data) continue;
        int rc = wait_l1_free(k, ids[j]);
        if (rc != KVT_OK) return rc;
        kvt_tier_pattern_fill(k->g->l1, lane_page(k, ids[j]), h[j].lo, h[j].hi, k->buf); /* the forward pass */
    }
    return KVT_OK;
}

static uint64_t mix(uint64_t h, uint64_t v) { return (h ^ v) * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull; }

/* Rank 0: the first request (1-based) at which some rank's digest differs
 * from rank 0's, among the first n; 0 when they agree. */
static uint64_t first_divergence(const group_t *g, uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        for (uint32_t r = 1; r < g->ctl->ranks; r++)
            if (g->digests[(uint64_t)r * g->ctl->nreq + i] != g->digests[i]) return i + 1;
    return 0;
}

static int run_rank(rank_t *k) {
    const opts_t *o = k->o;
    int rc = setup(k);
    if (rc != KVT_OK) {
        if (atomic_load(&k->me->state) != FAILED && !atomic_load(&k->g->ctl->stop))
            fail(k, "rank %u: set-up failed: %s", k->r, kvt_strerror(rc));
        return 1; /* stopped by another rank's failure: that one says why */
    }
    size_t max_tokens = (size_t)k->t->max_blocks * TRACE_BLOCK_TOKENS;
    int32_t *tok = malloc(max_tokens * sizeof(int32_t));
    uint32_t *ids = malloc((max_tokens / o->page_tokens + 1) * sizeof(uint32_t));
    kvt_hash128_t *h = malloc((max_tokens / o->page_tokens + 1) * sizeof(kvt_hash128_t));
    if (!tok || !ids || !h) {
        fail(k, "rank %u: out of memory", k->r);
        return 1;
    }
    /* Test hooks: KVT_CP_KILL="R:N" kills rank R at request N; KVT_CP_DIVERGE="R:N"
     * makes rank R admit one extra request before request N (its decisions,
     * and so its digest, part from the others' there). */
    unsigned kill_rank = UINT32_MAX, div_rank = UINT32_MAX;
    unsigned long long kill_at = 0, div_at = 0;
    if (getenv("KVT_CP_KILL")) sscanf(getenv("KVT_CP_KILL"), "%u:%llu", &kill_rank, &kill_at);
    if (getenv("KVT_CP_DIVERGE")) sscanf(getenv("KVT_CP_DIVERGE"), "%u:%llu", &div_rank, &div_at);
    for (uint64_t i = 0; i < k->n && rc == KVT_OK; i++) {
        if (atomic_load(&k->g->ctl->stop)) return 1;
        if (k->r == kill_rank && i + 1 == kill_at) raise(SIGKILL);
        if (k->r == div_rank && i + 1 == div_at) {
            int32_t odd[64];
            for (int j = 0; j < 64; j++) odd[j] = -1 - j;
            kvt_cache_req_t extra;
            if (kvt_cache_admit(k->c, 0, odd, 64, 0, NULL, &extra) == KVT_OK) kvt_cache_release(k->c, &extra);
        }
        k->cur = i;
        const trace_req_t *q = &k->t->req[i];
        for (uint32_t b = 0; b < q->nblocks; b++) trace_block_tokens(q->hash_ids[b], tok + (size_t)b * TRACE_BLOCK_TOKENS);
        kvt_cache_req_t req;
        rc = kvt_cache_admit(k->c, 0, tok, q->input_length, 0, ids, &req);
        if (rc == KVT_OK) rc = own_pages(k, tok, &req, ids, h);
        atomic_store_explicit(&k->me->filled, i + 1, memory_order_release);
        if (rc == KVT_OK) rc = kvt_cache_commit(k->c, &req);
        kvt_cache_release(k->c, &req);
        uint64_t d = mix(mix(mix(kvt_cache_digest(k->c), i), req.pages), req.l1_hit_pages << 32 | req.l2_hit_pages);
        k->g->digests[(uint64_t)k->r * k->n + i] = d;
        atomic_store_explicit(&k->me->done, i + 1, memory_order_release);
        if (rc == KVT_OK && o->check_every && (i + 1) % o->check_every == 0) {
            const char *why;
            if (kvt_cache_check(k->c, &why) != KVT_OK) {
                fail(k, "rank %u: check failed after request %" PRIu64 ": %s", k->r, i + 1, why);
                return 1;
            }
        }
        if (rc == KVT_OK && k->r == 0 && k->digest_every && (i + 1) % k->digest_every == 0) {
            rc = wait_for(k, all_done_cond, i + 1, 0, "every rank to reach a digest check");
            if (rc == KVT_OK && (k->g->ctl->divergence = first_divergence(k->g, i + 1)) != 0) {
                fail(k, "rank 0: the ranks' digests differ from request %" PRIu64, k->g->ctl->divergence);
                return 1;
            }
        }
    }
    if (rc != KVT_OK) {
        if (atomic_load(&k->me->state) != FAILED) fail(k, "rank %u: request %" PRIu64 ": %s", k->r, k->cur + 1, kvt_strerror(rc));
        return 1;
    }
    kvt_cache_sync(k->c);
    kvt_cache_stats_t st = {.size = sizeof(st)};
    kvt_cache_stats(k->c, &st);
    k->me->owned_pages = kvt_cache_lane_pages(k->c, k->r);
    k->me->dealt_pages = kvt_cache_lane_dealt(k->c, k->r);
    k->me->tokens = st.tokens;
    k->me->hit_tokens = st.l1_hit_tokens + st.l2_hit_tokens;
    k->me->l1_hit_tokens = st.l1_hit_tokens;
    k->me->backups = k->r == 0 ? st.backups : 0; /* the I/O rank makes them all */
    k->me->backup_bytes = k->r == 0 && o->data ? st.backups * k->layers * k->layer_bytes : 0;
    k->me->digest = kvt_cache_digest(k->c);
    atomic_store(&k->me->state, FINISHED);
    if (k->r == 0) { /* the others must be done with L2 before the creator unlinks it */
        if (wait_for(k, all_done_cond, k->n, 0, "every rank to finish") != KVT_OK) return 1;
        k->g->ctl->divergence = first_divergence(k->g, k->n);
    }
    kvt_cache_destroy(k->c);
    kvt_xfer_destroy(k->x);
    kvt_tier_destroy(k->l2);
    return 0;
}

/* ---- the coordinator ------------------------------------------------------------- */

static int create_group(group_t *g, const opts_t *o, uint32_t C, uint64_t R, uint64_t n) {
    g->lay = (kvt_cp_layout_t){C, R, o->page_tokens};
    size_t head = (sizeof(ctl_t) + 63) & ~(size_t)63;
    size_t l2n = o->l2_pages ? o->l2_pages : 1;
    g->ctl_bytes = head + l2n * sizeof(uint64_t) + (size_t)C * n * sizeof(uint64_t);
    void *p = mmap(NULL, g->ctl_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return KVT_ENOMEM;
    g->ctl = p;
    g->ctl->ranks = C;
    g->ctl->nreq = n;
    g->ctl->l2_pages = o->l2_pages;
    g->landed = (_Atomic uint64_t *)((uint8_t *)p + head);
    g->digests = (uint64_t *)((uint8_t *)p + head + l2n * sizeof(uint64_t));
    snprintf(g->l2_name, sizeof(g->l2_name), "/kvtier-cp-%d-l2", (int)getpid());
    if (!o->data) return KVT_OK;
    kvt_tier_config_t tc = {.size = sizeof(tc), .kind = KVT_TIER_ARENA, .name = "l1", .flags = KVT_TIER_SHARED,
                            .geom = {C * R, o->layers, o->bpt / o->layers * o->page_tokens, (kvt_layout_t)o->layout}};
    return kvt_tier_create(&g->l1, &tc);
}

static void print_result(const group_t *g, const opts_t *o, uint64_t n, double wall, bool agree, uint64_t mism) {
    const ctl_t *ctl = g->ctl;
    uint32_t C = ctl->ranks;
    uint64_t lmin = UINT64_MAX, lmax = 0, rmin = UINT64_MAX, rmax = 0;
    for (uint32_t r = 0; r < C; r++) {
        const rank_slot_t *s = &ctl->slot[r];
        lmin = s->dealt_pages < lmin ? s->dealt_pages : lmin;
        lmax = s->dealt_pages > lmax ? s->dealt_pages : lmax;
        rmin = s->owned_pages < rmin ? s->owned_pages : rmin;
        rmax = s->owned_pages > rmax ? s->owned_pages : rmax;
    }
    double hit = ctl->slot[0].tokens ? (double)ctl->slot[0].hit_tokens / (double)ctl->slot[0].tokens : 0;
    if (o->json) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "ranks", C);
        cJSON_AddNumberToObject(x, "requests", (double)n);
        cJSON_AddNumberToObject(x, "hit_rate", hit);
        cJSON_AddBoolToObject(x, "digests_agree", agree);
        if (!agree) cJSON_AddNumberToObject(x, "first_divergence", (double)ctl->divergence);
        cJSON *lp = cJSON_AddObjectToObject(x, "lane_pages"); /* dealt by the allocator over the run */
        cJSON_AddNumberToObject(lp, "min", (double)lmin);
        cJSON_AddNumberToObject(lp, "max", (double)lmax);
        cJSON *lr = cJSON_AddObjectToObject(x, "lane_resident"); /* in use at the end */
        cJSON_AddNumberToObject(lr, "min", (double)rmin);
        cJSON_AddNumberToObject(lr, "max", (double)rmax);
        cJSON *b = cJSON_AddArrayToObject(x, "backups_by_rank"), *l = cJSON_AddArrayToObject(x, "loads_by_rank");
        cJSON *per = cJSON_AddArrayToObject(x, "per_rank");
        for (uint32_t r = 0; r < C; r++) {
            const rank_slot_t *s = &ctl->slot[r];
            cJSON_AddItemToArray(b, cJSON_CreateNumber((double)s->backups));
            cJSON_AddItemToArray(l, cJSON_CreateNumber((double)s->loads));
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "rank", r);
            cJSON_AddNumberToObject(e, "owned_pages", (double)s->owned_pages);
            cJSON_AddNumberToObject(e, "dealt_pages", (double)s->dealt_pages);
            cJSON_AddNumberToObject(e, "l1_hit_pages", (double)s->l1_hit_pages);
            cJSON_AddNumberToObject(e, "loads", (double)s->loads);
            cJSON_AddNumberToObject(e, "load_bytes", (double)s->load_bytes);
            cJSON_AddNumberToObject(e, "backup_bytes", (double)s->backup_bytes);
            cJSON_AddNumberToObject(e, "verified", (double)s->verified);
            cJSON_AddNumberToObject(e, "wait_s", (double)s->wait_ns / 1e9);
            cJSON_AddItemToArray(per, e);
        }
        cJSON_AddNumberToObject(x, "mismatches", (double)mism);
        cJSON_AddNumberToObject(x, "wall_s", wall);
        cli_print_json(x);
        return;
    }
    printf("kvtier cp: %u ranks, %" PRIu64 " requests in %.3f s; hit rate %.4f; digests %s\n", C, n, wall, hit,
           agree ? "agree" : "DISAGREE");
    printf("%6s %12s %12s %12s %10s %12s %12s %10s %9s\n", "rank", "pages dealt", "resident", "L1 hits", "loads",
           "load MB", "backups", "backup MB", "wait s");
    for (uint32_t r = 0; r < C; r++) {
        const rank_slot_t *s = &ctl->slot[r];
        printf("%6u %12" PRIu64 " %12" PRIu64 " %12" PRIu64 " %10" PRIu64 " %12.1f %12" PRIu64 " %10.1f %9.3f\n", r,
               s->dealt_pages, s->owned_pages, s->l1_hit_pages, s->loads, (double)s->load_bytes / 1e6, s->backups,
               (double)s->backup_bytes / 1e6, (double)s->wait_ns / 1e9);
    }
    printf("lane pages dealt min %" PRIu64 " max %" PRIu64 ", resident min %" PRIu64 " max %" PRIu64 "; %" PRIu64
           " mismatches\n",
           lmin, lmax, rmin, rmax, mism);
}

/* The L2 segment goes only if it is the one rank 0 created: a name that
 * rank 0 found taken (another program's file, a live group's segment) is
 * never unlinked. */
static void unlink_own_segment(const group_t *g) {
    struct stat st;
    if (atomic_load(&g->ctl->l2_created) && stat_segment(g->l2_name, &st) == 0 && (uint64_t)st.st_dev == g->ctl->l2_dev &&
        (uint64_t)st.st_ino == g->ctl->l2_ino)
        shm_unlink(g->l2_name);
}

static const char USAGE[] =
    "usage: kvtier cp --ranks C [TRACE.jsonl] [replay options]\n"
    "\n"
    "Runs a context-parallel group of C rank processes on this machine: every rank\n"
    "replays the same requests through its own cache, L1 split into C owner lanes\n"
    "(--l1-pages is the group's total), one shared L2 segment that rank 0 creates;\n"
    "rank 0 backs up every page, each rank loads only its own. The ranks' decision\n"
    "digests are compared at the end (and every --digest-every N requests).\n";

int cmd_cp(int argc, char **argv) {
    opts_t o;
    replay_opts_default(&o);
    o.threads = 1;
    uint64_t ranks = 4, digest_every = 0;
    cli_opt_t table[34];
    size_t n = 0, nrows = replay_option_rows(&o, table);
    for (size_t i = 0; i < nrows; i++) /* replay's, less what a group does not do */
        if (strcmp(table[i].name, "sweep") && strcmp(table[i].name, "plot") && strcmp(table[i].name, "stats"))
            table[n++] = table[i];
    table[n++] = (cli_opt_t){"ranks", OPT_U64, &ranks, 1, MAX_RANKS, 0, 0, NULL, NULL, 0, "rank processes in the group (CP size)"};
    table[n++] = (cli_opt_t){"digest-every", OPT_U64, &digest_every, 0, UINT64_MAX, 0, 0, NULL, NULL, 0,
                             "debug: rank 0 compares the ranks' digests every N requests (0: at the end only)"};
    table[n] = (cli_opt_t){NULL, 0, NULL, 0, 0, 0, 0, NULL, NULL, 0, NULL};
    cli_t c;
    cli_init(&c, "kvtier cp", argc, argv);
    const char *path;
    int prc = cli_parse_table(&c, table, USAGE, &path);
    if (prc) return prc > 0 ? 0 : 2;
    if (replay_opts_finish(&c, &o) != 0) return 2;
    c.flag = "--l1-pages";
    if (o.l1_pages == UNBOUNDED) return cli_error(&c, "needs a bound (the group's L1 pages)") ? 2 : 2;
    if (o.l1_pages % ranks != 0)
        return cli_error(&c, "%" PRIu64 " pages do not split into %" PRIu64 " lanes", o.l1_pages, ranks) ? 2 : 2;
    if (o.data && replay_check_data_size(&c, &o, &o.l1_pages, 1) != 0) return 2;

    trace_t t;
    double parse_s;
    if (replay_load("kvtier cp", path, &o, &t, &parse_s) != 0) return 1;
    uint64_t nreq = o.limit && o.limit < t.n ? o.limit : t.n;
    group_t g = {0};
    int rc = create_group(&g, &o, (uint32_t)ranks, o.l1_pages / ranks, nreq);
    if (rc != KVT_OK) {
        fprintf(stderr, "kvtier cp: cannot set up the group: %s\n", kvt_strerror(rc));
        trace_free(&t);
        return 1;
    }
    fflush(stdout);
    fflush(stderr);
    group_catch_signals();
    child_t ch[MAX_RANKS] = {{0}};
    uint64_t t0 = now_ns();
    for (uint32_t r = 0; r < ranks; r++) {
        pid_t pid = fork();
        if (pid == 0) {
            group_child_signals();
            rank_t k = {.g = &g, .o = &o, .t = &t, .r = r, .C = (uint32_t)ranks, .R = o.l1_pages / ranks, .n = nreq,
                        .me = &g.ctl->slot[r], .layers = o.layers, .layer_bytes = o.bpt / o.layers * o.page_tokens,
                        .digest_every = digest_every};
            int code = run_rank(&k);
            if (code && k.me->err[0]) fprintf(stderr, "kvtier cp: %s\n", k.me->err);
            _exit(code);
        }
        if (pid < 0) {
            atomic_store(&g.ctl->stop, 1);
            ranks = r; /* watch those started */
            rc = KVT_EIO;
            break;
        }
        ch[r].pid = pid;
    }
    int why = 0;
    int dead = group_watch(ch, (uint32_t)ranks, &g.ctl->stop, &why, 0, NULL, NULL);
    double wall = (double)(now_ns() - t0) / 1e9;
    unlink_own_segment(&g); /* rank 0 unlinks it; after a crash, nobody else will */
    int code = 0;
    if (rc != KVT_OK) {
        fprintf(stderr, "kvtier cp: could not start every rank\n");
        code = 1;
    } else if (dead == -2) {
        fprintf(stderr, "kvtier cp: stopped by signal %d; the ranks were stopped and the segment removed\n", why);
        code = 128 + why;
    } else if (dead >= 0 && g.ctl->divergence) { /* rank 0 stopped the group at a digest check (others exit first) */
        fprintf(stderr, "kvtier cp: the group stopped: the ranks disagree from request %" PRIu64 "\n", g.ctl->divergence);
        code = 1;
    } else if (dead >= 0) {
        if (WIFSIGNALED(why))
            fprintf(stderr, "kvtier cp: rank %d died (signal %d, %s); the group stopped\n", dead, WTERMSIG(why),
                    strsignal(WTERMSIG(why)));
        else
            fprintf(stderr, "kvtier cp: rank %d failed (exit %d); the group stopped\n", dead, WEXITSTATUS(why));
        code = 1;
    } else {
        uint64_t mism = 0;
        for (uint32_t r = 0; r < ranks; r++) mism += g.ctl->slot[r].mismatches;
        bool agree = g.ctl->divergence == 0;
        print_result(&g, &o, nreq, wall, agree, mism);
        if (!agree) fprintf(stderr, "kvtier cp: the ranks disagree from request %" PRIu64 "\n", g.ctl->divergence);
        code = agree && mism == 0 ? 0 : 1;
    }
    kvt_tier_destroy(g.l1);
    munmap(g.ctl, g.ctl_bytes);
    trace_free(&t);
    return code;
}
