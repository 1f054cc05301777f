/* A CP group (include/kvtier/cp.h, docs/cp.md): C rank processes, started
 * by anyone, that join one named control segment.
 *
 *   /dev/shm/<name>-ctl   created by rank 0 (complete before visible, a dead
 *                         creator's replaced: src/core/shmseg-int.h)
 *   +--------------------+-------------------+------------------+-------------------+
 *   | header (4 KiB)     | slot[0..C) 1 KiB  | landed[l2_pages] | digests[C][reqs]  |
 *   |  segment head      |  pid, start time  |  u64 per L2 page:|  u64: rank r's    |
 *   |  parameters: ranks,|  state           |  the sequence    |  digest after     |
 *   |  l1/l2 pages, page |  filled, done     |  number of the   |  request i        |
 *   |  tokens, layers,   |  wait time        |  last backup     |                   |
 *   |  layer bytes,      |  error text       |  that landed     |                   |
 *   |  layout, requests, |  result (256 B)   |  there           |                   |
 *   |  tag; stop, who,   |                   |                  |                   |
 *   |  why; divergence   |                   |                  |                   |
 *   +--------------------+-------------------+------------------+-------------------+
 *   /dev/shm/<name>-l1, -l2 ...   the shared tiers (shm tier), also rank 0's
 *
 * A slot is claimed by compare-and-swap of its pid (0 -> pid); the start time
 * is written before the state becomes JOINED (release), so whoever sees a
 * joined slot can tell the process from a later one with its pid. A slot's
 * owner writes everything in it; the only other writer is rank 0's transfer
 * workers (landed[]) and whoever stops the group (the header's stop, who,
 * why: the first to swap stop 0 -> 1 writes who and why, then stores 2).
 *
 * Every rank runs the same cache on the same calls, so all number their
 * backups 1, 2, ... alike and free the same L2 pages at the same requests:
 * each rank keeps, privately, the sequence number of the last backup into
 * each L2 page and out of each L1 page, the request that wrote each L1 page
 * and the one that freed each L2 page. The four cross-process orderings
 * then wait on shared counters only:
 *
 *   a load of L2 page h        landed[h] >= the backup that filled h
 *   rewriting L1 page p        the backup of p's old content has landed
 *   rank 0 backing up p        p's owner: filled > the request that wrote p
 *   rank 0 reusing L2 page h   every rank: done >= the request that freed h
 *
 * A wait spins, then sleeps 20 us; it ends when its condition holds, when
 * the group stops (KVT_EIO), after wait_ms (KVT_ETIMEDOUT, saying what it
 * waited for), or when a rank it waits on is dead: a joined rank whose pid
 * is gone, a zombie or another process (checked every 50 ms; steps check
 * every rank the same way). Cost: O(1) per hook and per step, O(C) per
 * liveness check, O(C x n) per digest comparison.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvtier/cp.h"
#include "kvtier/stats.h"
#include "kvtier/error.h"
#include "../core/abi-int.h"
#include "../core/mem-int.h"
#include "../core/shmseg-int.h"
#include "../cache/cache-int.h"

#define CP_VERSION 1u
#define HEADER_BYTES 4096u
#define SLOT_BYTES 1024u
#define DEFAULT_TIMEOUT_MS 20000u
#define DEFAULT_WAIT_MS 60000u
#define WATCH_NS 50000000ull /* liveness checks at most this often */

enum { FREE = 0, JOINED = 1, FINISHED = 2, FAILED = 3, LEFT = 4 };

typedef struct header {
    kvt__seg_head_t seg;
    uint32_t ranks, page_tokens, layers, layout;
    uint64_t l1_pages, l2_pages, layer_bytes, requests, tag;
    uint64_t slots_off, landed_off, digests_off;
    _Atomic uint32_t stop;       /* 0 running; 1 who/why being written; 2 stopped */
    _Atomic int32_t stopped_by;
    _Atomic uint64_t divergence;
    char why[512];
} header_t;

typedef struct slot {
    _Atomic int32_t pid;
    _Atomic uint32_t state;
    uint64_t start;
    _Atomic uint64_t filled, done, wait_ns, waits;
    uint32_t result_len;
    char err[512];
    uint8_t result[KVT_CP_RESULT_BYTES];
} slot_t;

_Static_assert(sizeof(header_t) <= HEADER_BYTES, "the header fits its page");
_Static_assert(sizeof(slot_t) <= SLOT_BYTES, "a slot fits its kilobyte");

struct kvt_cp_group {
    kvt__seg_t seg;
    header_t *h;
    /* the segment's parts, placed once from the offsets checked at join: the
     * header's copies are another process's to write, never read again */
    uint8_t *slots;
    _Atomic uint64_t *landed;
    uint64_t *digests;
    char name[KVT_CP_NAME_MAX + 1];
    uint32_t rank, C;
    uint64_t l1n, l2n, requests; /* this rank's config: l2n at least 1, its tables' size ... */
    uint64_t l2_pages;            /* ... the L2 pages as configured (0: none) */
    uint64_t timeout_ns, wait_limit_ns, joined_at, next_watch;
    uint64_t cur; /* the request in progress: how many steps were made */
    /* this rank's private view of the orderings */
    uint64_t *seq_of_l2, *freed_req;       /* per L2 page */
    uint32_t *last_l2_of_l1;              /* per L1 page: the last backup out of it ... */
    uint64_t *last_seq_of_l1, *filled_req; /* ... its number; the request that wrote the page */
    unsigned l1_index;
    kvt_xfer_cb prev_done;
    void *prev_arg;
    const kvt_cp_group_config_t *creating; /* rank 0, while it builds the segment */
    char why[640];
};

static _Thread_local char t_why[640];


static void pause_us(long us) {
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}

/* Truncating copy of a message. */
static void copy_text(char *dst, size_t n, const char *src) {
    size_t len = strnlen(src, n - 1);
    memcpy(dst, src, len);
    dst[len] = '\0';
}

static slot_t *slot(const kvt_cp_group_t *g, uint32_t r) { return (slot_t *)(g->slots + (size_t)r * SLOT_BYTES); }

/* ---- stopping and liveness ---------------------------------------------------------- */

/* The first caller's reason becomes the group's. Any thread. */
static void stop_group(kvt_cp_group_t *g, uint32_t by, const char *why) {
    uint32_t running = 0;
    if (!atomic_compare_exchange_strong(&g->h->stop, &running, 1)) return;
    copy_text(g->h->why, sizeof(g->h->why), why);
    atomic_store(&g->h->stopped_by, (int32_t)by);
    atomic_store_explicit(&g->h->stop, 2, memory_order_release);
}

/* This rank failed (its own thread): g->why, its slot, and the group. */
static int fail_self(kvt_cp_group_t *g, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail_self(kvt_cp_group_t *g, int rc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->why, sizeof(g->why), fmt, ap);
    va_end(ap);
    slot_t *me = slot(g, g->rank);
    copy_text(me->err, sizeof(me->err), g->why);
    uint32_t joined = JOINED;
    atomic_compare_exchange_strong(&me->state, &joined, FAILED);
    stop_group(g, g->rank, g->why);
    return rc;
}

/* A call refused, the group going on: g->why says why (the handle's own
 * text, which no call reads: a const handle's refusal writes it too). */
static int refuse(const kvt_cp_group_t *g, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int refuse(const kvt_cp_group_t *g, int rc, const char *fmt, ...) {
    kvt_cp_group_t *w = (kvt_cp_group_t *)g;
    int n = snprintf(w->why, sizeof(w->why), "rank %u: ", g->rank);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof(w->why)) vsnprintf(w->why + n, sizeof(w->why) - (size_t)n, fmt, ap);
    va_end(ap);
    return rc;
}

/* True once the group has stopped; g->why then says who stopped it. */
static bool stopped(kvt_cp_group_t *g) {
    uint32_t s = atomic_load_explicit(&g->h->stop, memory_order_acquire);
    if (s == 0) return false;
    for (int i = 0; i < 1000 && s == 1; i++, pause_us(10)) s = atomic_load_explicit(&g->h->stop, memory_order_acquire);
    int32_t by = s == 2 ? atomic_load(&g->h->stopped_by) : -1;
    if (by == (int32_t)g->rank && g->why[0]) return true; /* our own failure: g->why says it */
    snprintf(g->why, sizeof(g->why), "rank %u: the group stopped: %.*s", g->rank, (int)sizeof(g->h->why),
             s == 2 ? g->h->why : "(no reason given)"); /* (bounded: another process wrote it) */
    return true;
}

/* A joined rank that is no longer running (one that finished, failed or
 * left may go). The state is read again once the process is found gone: a
 * rank finishes, leaves and exits between the first read and the check,
 * and then its last state is what the second read sees. */
static bool dead(const kvt_cp_group_t *g, uint32_t r) {
    slot_t *s = slot(g, r);
    if (atomic_load_explicit(&s->state, memory_order_acquire) != JOINED) return false;
    if (kvt__proc_alive(atomic_load(&s->pid), s->start)) return false;
    return atomic_load_explicit(&s->state, memory_order_acquire) == JOINED;
}

/* Checks rank watch (or every rank, watch < 0) for death, at most every
 * WATCH_NS; a dead rank stops the group, named. KVT_EIO then. */
static int watch_ranks(kvt_cp_group_t *g, int watch, uint64_t now) {
    if (now < g->next_watch) return KVT_OK;
    g->next_watch = now + WATCH_NS;
    for (uint32_t r = watch < 0 ? 0 : (uint32_t)watch; r < g->C && (watch < 0 || r == (uint32_t)watch); r++) {
        if (r == g->rank || !dead(g, r)) continue;
        char text[200];
        snprintf(text, sizeof(text), "rank %u (pid %d) died, having done %" PRIu64 " requests", r,
                 (int)atomic_load(&slot(g, r)->pid), atomic_load(&slot(g, r)->done));
        stop_group(g, r, text);
        stopped(g);
        return KVT_EIO;
    }
    return KVT_OK;
}

/* ---- waits ------------------------------------------------------------------------- */

typedef bool (*cond_fn)(const kvt_cp_group_t *g, uint64_t a, uint64_t b);

static bool landed_cond(const kvt_cp_group_t *g, uint64_t l2, uint64_t seq) {
    return atomic_load_explicit(&g->landed[l2], memory_order_acquire) >= seq;
}

static bool filled_cond(const kvt_cp_group_t *g, uint64_t owner, uint64_t req) {
    return atomic_load_explicit(&slot(g, (uint32_t)owner)->filled, memory_order_acquire) > req;
}

static bool all_done_cond(const kvt_cp_group_t *g, uint64_t req, uint64_t unused) {
    (void)unused;
    for (uint32_t r = 0; r < g->C; r++)
        if (atomic_load_explicit(&slot(g, r)->done, memory_order_acquire) < req) return false;
    return true;
}

/* Waits for cond, watching rank watch (every rank: < 0) for death. */
static int wait_for(kvt_cp_group_t *g, cond_fn cond, uint64_t a, uint64_t b, int watch, const char *what) {
    if (cond(g, a, b)) return KVT_OK;
    uint64_t t0 = kvt_now_ns();
    for (unsigned spin = 0; !cond(g, a, b); spin++) {
        if (stopped(g)) return KVT_EIO;
        if (spin > 64) pause_us(20);
        if ((spin & 255) != 0) continue;
        uint64_t now = kvt_now_ns();
        if (watch_ranks(g, watch, now) != KVT_OK) return KVT_EIO;
        if (now - t0 > g->wait_limit_ns) {
            char on[24] = "every rank";
            if (watch >= 0) snprintf(on, sizeof(on), "rank %d", watch);
            return fail_self(g, KVT_ETIMEDOUT, "rank %u: waited %" PRIu64 " ms on %s for %s (%" PRIu64 ", %" PRIu64
                             ") at request %" PRIu64, g->rank, g->wait_limit_ns / 1000000, on, what, a, b, g->cur + 1);
        }
    }
    slot_t *me = slot(g, g->rank);
    atomic_fetch_add(&me->wait_ns, kvt_now_ns() - t0);
    atomic_fetch_add(&me->waits, 1);
    return KVT_OK;
}

/* An L1 page may be rewritten once rank 0 has copied out its old content. */
static int wait_l1_free(kvt_cp_group_t *g, uint32_t l1) {
    uint64_t seq = g->last_seq_of_l1[l1];
    return seq ? wait_for(g, landed_cond, g->last_l2_of_l1[l1], seq, 0, "the backup of an L1 page's old content") : KVT_OK;
}

/* ---- the cache's hooks, rank 0's transfer callback ----------------------------------- */

/* (The pages are in range: attach took only a cache of the group's pages;
 * the checks keep a cache that bypassed it out of the tables.) */
static void on_backup_started(void *arg, uint32_t l1, uint32_t l2, uint64_t seq) {
    kvt_cp_group_t *g = arg;
    if (l1 >= g->l1n || l2 >= g->l2n) return;
    g->seq_of_l2[l2] = seq;
    g->last_l2_of_l1[l1] = l2;
    g->last_seq_of_l1[l1] = seq;
}

static void on_l2_freed(void *arg, uint32_t l2) {
    kvt_cp_group_t *g = arg;
    if (l2 >= g->l2n) return;
    g->freed_req[l2] = g->cur;
}

static int before_load(kvt_cp_group_t *g, uint32_t l1, uint32_t l2, bool may_wait) {
    if (!may_wait) /* its source has landed, and the page's old content is out */
        return landed_cond(g, l2, g->seq_of_l2[l2]) &&
                       (!g->last_seq_of_l1[l1] || landed_cond(g, g->last_l2_of_l1[l1], g->last_seq_of_l1[l1]))
                   ? KVT_OK
                   : KVT_EAGAIN;
    int rc = wait_for(g, landed_cond, l2, g->seq_of_l2[l2], 0, "rank 0's backup of a page to load");
    return rc == KVT_OK ? wait_l1_free(g, l1) : rc;
}

/* Rank 0's backup: the owner wrote the page; nobody still needs what L2 held. */
static int before_backup(kvt_cp_group_t *g, uint32_t l1, uint32_t l2, bool may_wait) {
    uint32_t owner = kvt_lane_of(l1, g->C);
    if (owner == g->rank && !filled_cond(g, owner, g->filled_req[l1])) { /* waiting would wait on this thread */
        if (stopped(g)) return KVT_EIO; /* a request let go after the group stopped: its reason stands */
        return fail_self(g, KVT_EINVAL, "rank %u: request %" PRIu64 " committed before kvt_cp_group_filled: its pages "
                         "cannot be backed up unwritten", g->rank, g->filled_req[l1]);
    }
    if (!may_wait)
        return filled_cond(g, owner, g->filled_req[l1]) && all_done_cond(g, g->freed_req[l2], 0) ? KVT_OK : KVT_EAGAIN;
    int rc = wait_for(g, filled_cond, owner, g->filled_req[l1], (int)owner, "a rank to write a page to back up");
    return rc == KVT_OK ? wait_for(g, all_done_cond, g->freed_req[l2], 0, -1, "every rank to pass an L2 page's free") : rc;
}

static int before_copy(void *arg, bool load, uint32_t l1, uint32_t l2, bool may_wait) {
    kvt_cp_group_t *g = arg;
    if (l1 >= g->l1n || l2 >= g->l2n) return KVT_ERANGE;
    return load ? before_load(g, l1, l2, may_wait) : before_backup(g, l1, l2, may_wait);
}

/* A backup batch that landed publishes its pages (a worker thread). */
static void on_done(void *arg, const kvt_xfer_done_t *d) {
    kvt_cp_group_t *g = arg;
    if (d->src == g->l1_index && d->status != KVT_OK) { /* the others count it done: the group can only diverge */
        char text[200];
        snprintf(text, sizeof(text), "rank 0: a backup batch failed (%s); the group cannot stay in agreement",
                 kvt_strerror(d->status));
        stop_group(g, g->rank, text);
    } else if (d->src == g->l1_index) {
        for (size_t i = 0; i < d->n; i++)
            if (d->copies[i].dst_page < g->l2n)
                atomic_store_explicit(&g->landed[d->copies[i].dst_page], g->seq_of_l2[d->copies[i].dst_page],
                                      memory_order_release);
    }
    if (g->prev_done) g->prev_done(g->prev_arg, d);
}

void kvt_cp_group_xfer_config(kvt_cp_group_t *g, kvt_xfer_config_t *xc, unsigned l1_index) {
    g->l1_index = l1_index;
    if (g->rank != 0 || xc->on_done == on_done) return; /* only rank 0 makes backups */
    g->prev_done = xc->on_done;
    g->prev_arg = xc->arg;
    xc->on_done = on_done;
    xc->arg = g;
}

void kvt_cp_group_hooks(kvt_cp_group_t *g, kvt_cache_cp_t *hooks) {
    *hooks = (kvt_cache_cp_t){.size = sizeof(*hooks), .rank = g->rank, .io_rank = g->rank == 0, .arg = g,
                              .backup_started = on_backup_started, .l2_freed = on_l2_freed, .before_copy = before_copy};
}

int kvt_cp_group_attach(kvt_cp_group_t *g, kvt_cache_t *c, kvt_xfer_t *x, kvt_tier_t *l1, unsigned l1_index,
                        kvt_tier_t *l2, unsigned l2_index) {
    /* The group deals L1 pages to ranks by its rank count and sizes its
     * tables by its pages; a cache of other lanes or pages would decide
     * ownership otherwise, and the ranks would read each other's pages wrong.
     * The pages are this rank's own (the header's copies are another
     * process's to rewrite). */
    const kvt_cache_config_t *cc = c ? &c->cfg : NULL;
    if (cc && (cc->l1_lanes != g->C || cc->l1_pages != g->l1n || cc->l2_pages != g->l2_pages)) {
        snprintf(g->why, sizeof(g->why), "rank %u: a cache of %u lanes, %" PRIu64 " L1 and %" PRIu64 " L2 pages for group "
                 "%s of %u ranks, %" PRIu64 " and %" PRIu64 " pages", g->rank, cc->l1_lanes, cc->l1_pages, cc->l2_pages,
                 g->name, g->C, g->l1n, g->l2_pages);
        return KVT_EINVAL;
    }
    kvt_cache_cp_t hooks;
    kvt_cp_group_hooks(g, &hooks);
    g->l1_index = l1_index;
    return kvt_cache_attach_cp(c, x, l1, l1_index, l2, l2_index, &hooks);
}

/* ---- per request ------------------------------------------------------------------- */

int kvt_cp_group_admitted(kvt_cp_group_t *g, const kvt_cache_req_t *req, const uint32_t *l1_ids) {
    if (req->pages > req->l1_hit_pages && l1_ids == NULL)
        return refuse(g, KVT_EINVAL, "admitted: no l1_ids for a request with pages past its L1 hits");
    for (uint64_t j = req->l1_hit_pages; j < req->pages; j++)
        if (l1_ids[j] >= g->l1n)
            return refuse(g, KVT_ERANGE, "admitted: page %" PRIu64 " is L1 page %u, past the group's %" PRIu64, j,
                          l1_ids[j], g->l1n);
    for (uint64_t j = req->l1_hit_pages; j < req->pages; j++) g->filled_req[l1_ids[j]] = g->cur; /* loaded or new */
    for (uint64_t j = req->pages - req->new_pages; j < req->pages; j++) {
        if (kvt_lane_of(l1_ids[j], g->C) != g->rank) continue;
        int rc = wait_l1_free(g, l1_ids[j]);
        if (rc != KVT_OK) return rc;
    }
    return stopped(g) ? KVT_EIO : KVT_OK;
}

int kvt_cp_group_filled(kvt_cp_group_t *g, uint64_t i) {
    if (i != g->cur)
        return refuse(g, KVT_EINVAL, "filled(%" PRIu64 ") out of step: this rank is at request %" PRIu64, i, g->cur);
    atomic_store_explicit(&slot(g, g->rank)->filled, i + 1, memory_order_release);
    return KVT_OK;
}

int kvt_cp_group_step(kvt_cp_group_t *g, uint64_t i, uint64_t digest) {
    if (i != g->cur) return refuse(g, KVT_EINVAL, "step %" PRIu64 " out of step: this rank is at request %" PRIu64, i, g->cur);
    if (i >= g->requests) return refuse(g, KVT_ERANGE, "step %" PRIu64 " past the group's %" PRIu64 " requests", i, g->requests);
    /* the group over or a rank dead: nothing recorded (one stopping after
     * this test sees the step done, and the next call fails) */
    if (stopped(g) || watch_ranks(g, -1, kvt_now_ns()) != KVT_OK) return KVT_EIO;
    slot_t *me = slot(g, g->rank);
    g->digests[(uint64_t)g->rank * g->requests + i] = digest;
    if (atomic_load(&me->filled) < i + 1) atomic_store_explicit(&me->filled, i + 1, memory_order_release);
    atomic_store_explicit(&me->done, i + 1, memory_order_release);
    g->cur++;
    return KVT_OK;
}

int kvt_cp_group_check_digests(kvt_cp_group_t *g, uint64_t n, uint64_t *first_divergence) {
    if (n > g->requests)
        return refuse(g, KVT_ERANGE, "a digest check of %" PRIu64 " requests; the group has %" PRIu64, n, g->requests);
    if (n > g->cur) /* the wait would be on itself */
        return refuse(g, KVT_EINVAL, "a digest check of %" PRIu64 " requests; this rank has done %" PRIu64, n, g->cur);
    int rc = wait_for(g, all_done_cond, n, 0, -1, "every rank to reach a digest check");
    if (rc != KVT_OK) return rc;
    uint64_t first = 0;
    for (uint64_t i = 0; i < n && !first; i++)
        for (uint32_t r = 1; r < g->C; r++)
            if (g->digests[(uint64_t)r * g->requests + i] != g->digests[i]) first = i + 1;
    uint64_t was = atomic_load(&g->h->divergence);
    while (first && (was == 0 || first < was) && !atomic_compare_exchange_weak(&g->h->divergence, &was, first)) {}
    *first_divergence = first;
    return KVT_OK;
}

void kvt_cp_group_fail(kvt_cp_group_t *g, const char *why) {
    uint32_t joined = JOINED;
    atomic_compare_exchange_strong(&slot(g, g->rank)->state, &joined, FAILED);
    stop_group(g, g->rank, why ? why : "failed");
}

void kvt_cp_group_interrupt(kvt_cp_group_t *g, int sig) {
    if (g == NULL) return; /* still joining: config.cancel ends the join */
    uint32_t running = 0;
    if (!atomic_compare_exchange_strong(&g->h->stop, &running, 1)) return;
    char *p = g->h->why; /* no snprintf in a handler */
    const char *parts[] = {"rank ", NULL, " was interrupted by signal ", NULL};
    char r[12], s[12];
    parts[1] = r, parts[3] = s;
    for (int i = 0, v = (int)g->rank; i < 2; i++, v = sig) {
        char *d = i ? s : r, tmp[12];
        int n = 0;
        do tmp[n++] = (char)('0' + v % 10); while ((v /= 10) > 0 && n < 11);
        for (int j = 0; j < n; j++) d[j] = tmp[n - 1 - j];
        d[n] = '\0';
    }
    for (int i = 0; i < 4; i++)
        for (const char *q = parts[i]; *q; q++) *p++ = *q;
    *p = '\0';
    atomic_store(&g->h->stopped_by, (int32_t)g->rank);
    atomic_store_explicit(&g->h->stop, 2, memory_order_release);
}

/* ---- finishing --------------------------------------------------------------------- */

static bool all_finished_cond(const kvt_cp_group_t *g, uint64_t unused_a, uint64_t unused_b) {
    (void)unused_a, (void)unused_b;
    for (uint32_t r = 0; r < g->C; r++) {
        uint32_t s = atomic_load_explicit(&slot(g, r)->state, memory_order_acquire);
        if (s != FINISHED && s != LEFT) return false;
    }
    return true;
}

int kvt_cp_group_finish(kvt_cp_group_t *g, const void *result, size_t len) {
    if (len > KVT_CP_RESULT_BYTES || (len && result == NULL))
        return refuse(g, KVT_EINVAL, "a result of %zu bytes%s (at most %d)", len, result ? "" : " at NULL", KVT_CP_RESULT_BYTES);
    if (stopped(g)) return KVT_EIO;
    slot_t *me = slot(g, g->rank);
    if (len) memcpy(me->result, result, len);
    me->result_len = (uint32_t)len;
    uint32_t joined = JOINED;
    atomic_compare_exchange_strong_explicit(&me->state, &joined, FINISHED, memory_order_release, memory_order_relaxed);
    return g->rank == 0 ? wait_for(g, all_finished_cond, 0, 0, -1, "every rank to finish") : KVT_OK;
}

int kvt_cp_group_result(const kvt_cp_group_t *g, uint32_t rank, void *buf, size_t len) {
    if (rank >= g->C) return refuse(g, KVT_EINVAL, "the result of rank %u, of %u ranks", rank, g->C);
    if (len > KVT_CP_RESULT_BYTES) return refuse(g, KVT_EINVAL, "a result read of %zu bytes (at most %d)", len, KVT_CP_RESULT_BYTES);
    const slot_t *s = slot(g, rank);
    uint32_t st = atomic_load_explicit(&((slot_t *)s)->state, memory_order_acquire);
    if (st != FINISHED) return refuse(g, KVT_ENOENT, "rank %u has no result: it has not finished", rank);
    memset(buf, 0, len);
    memcpy(buf, s->result, len < s->result_len ? len : s->result_len);
    return KVT_OK;
}

/* ---- joining ----------------------------------------------------------------------- */

static bool name_ok(const char *name) {
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > KVT_CP_NAME_MAX) return false;
    for (size_t i = 0; i < n; i++) {
        char ch = name[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
              ch == '_' || ch == '-'))
            return false;
    }
    return true;
}

int kvt_cp_group_segment(const char *name, const char *suffix, char *buf, size_t len) {
    if (!name_ok(name) || !name_ok(suffix) || strlen(suffix) > 8) return KVT_EINVAL;
    return snprintf(buf, len, "/%s-%s", name, suffix) < (int)len ? KVT_OK : KVT_EINVAL;
}

static int say(int rc, const char **why, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int say(int rc, const char **why, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t_why, sizeof(t_why), fmt, ap);
    va_end(ap);
    if (why) *why = t_why;
    return rc;
}

static int check_config(const kvt_cp_group_config_t *cfg, const char **why) {
    if (!name_ok(cfg->name))
        return say(KVT_EINVAL, why, "the group name must be 1 to %d of [A-Za-z0-9._-]", KVT_CP_NAME_MAX);
    if (cfg->ranks == 0 || cfg->ranks > KVT_CP_MAX_RANKS || cfg->rank >= cfg->ranks)
        return say(KVT_EINVAL, why, "rank %u of %u ranks (at most %d)", cfg->rank, cfg->ranks, KVT_CP_MAX_RANKS);
    if (cfg->l1_pages == 0 || cfg->l1_pages % cfg->ranks || cfg->l1_pages > UINT32_MAX || cfg->l2_pages > UINT32_MAX)
        return say(KVT_EINVAL, why, "l1_pages must be a positive multiple of ranks; pages fit 32 bits");
    if (cfg->requests > (1ull << 36) / cfg->ranks) return say(KVT_EINVAL, why, "too many requests for the digest table");
    return KVT_OK;
}

static uint64_t segment_bytes(const kvt_cp_group_config_t *cfg, uint64_t *slots_off, uint64_t *landed_off,
                              uint64_t *digests_off) {
    uint64_t l2n = cfg->l2_pages ? cfg->l2_pages : 1;
    *slots_off = HEADER_BYTES;
    *landed_off = *slots_off + (uint64_t)cfg->ranks * SLOT_BYTES;
    *digests_off = *landed_off + l2n * sizeof(uint64_t);
    return *digests_off + (uint64_t)cfg->ranks * (cfg->requests ? cfg->requests : 1) * sizeof(uint64_t);
}

/* Places the segment's parts at the offsets the config gives (which the
 * header was checked to hold). */
static void place(kvt_cp_group_t *g, void *base, const kvt_cp_group_config_t *cfg) {
    uint64_t a, b, c;
    segment_bytes(cfg, &a, &b, &c);
    g->h = base;
    g->slots = (uint8_t *)base + a;
    g->landed = (_Atomic uint64_t *)((uint8_t *)base + b);
    g->digests = (uint64_t *)((uint8_t *)base + c);
}

/* Claims the rank's slot. */
static int claim_slot(kvt_cp_group_t *g, const char **why) {
    slot_t *s = slot(g, g->rank);
    int32_t none = 0, me = (int32_t)getpid();
    if (!atomic_compare_exchange_strong(&s->pid, &none, me))
        return say(KVT_EEXIST, why, "rank %u: rank %u of group %s is taken by pid %d (%s)", g->rank, g->rank, g->name,
                   (int)none, kvt__proc_alive(none, s->start) ? "running" : "dead");
    s->start = kvt__proc_start(me);
    atomic_store_explicit(&s->state, JOINED, memory_order_release);
    return KVT_OK;
}

/* The creator's segment, before anyone sees it: the parameters and rank 0's slot. */
static int init_ctl(void *base, void *arg) {
    kvt_cp_group_t *g = arg;
    const kvt_cp_group_config_t *cfg = g->creating;
    header_t *h = base;
    h->ranks = cfg->ranks, h->page_tokens = cfg->page_tokens, h->layers = cfg->layers, h->layout = cfg->layout;
    h->l1_pages = cfg->l1_pages, h->l2_pages = cfg->l2_pages, h->layer_bytes = cfg->layer_bytes;
    h->requests = cfg->requests, h->tag = cfg->tag;
    segment_bytes(cfg, &h->slots_off, &h->landed_off, &h->digests_off);
    atomic_store(&h->stopped_by, -1);
    place(g, h, cfg);
    return claim_slot(g, NULL);
}

static int create_ctl(kvt_cp_group_t *g, const kvt_cp_group_config_t *cfg, const char *seg, const char **why) {
    uint64_t a, b, c, total = segment_bytes(cfg, &a, &b, &c);
    g->creating = cfg;
    int rc = kvt__seg_create(&g->seg, seg, KVT__SEG_KIND_CP, CP_VERSION, total, init_ctl, g);
    g->creating = NULL;
    if (rc == KVT_EEXIST)
        return say(rc, why, "rank 0: cannot create the control segment /dev/shm%s of group %s: the name is taken by a "
                            "live group's segment, or by a file that is not a kvtier segment; it was left alone", seg, g->name);
    if (rc != KVT_OK) return say(rc, why, "rank 0: cannot create the control segment /dev/shm%s: %s", seg, kvt_strerror(rc));
    return KVT_OK;
}

/* Whether slot r of the group (whose parameters differ from this rank's)
 * has a process: its slots where every group has them, when the segment
 * holds slot r. */
static bool rank_taken(const kvt_cp_group_t *g, uint32_t r) {
    const uint64_t off = HEADER_BYTES;
    if (g->h->slots_off != off || r >= g->h->ranks || off > g->seg.total || (uint64_t)(r + 1) * SLOT_BYTES > g->seg.total - off)
        return false;
    const slot_t *s = (const slot_t *)((const uint8_t *)g->h + off + (size_t)r * SLOT_BYTES);
    return atomic_load(&s->pid) != 0;
}

/* The first parameter in which the rank differs from the group. */
static int check_params(const kvt_cp_group_t *g, const kvt_cp_group_config_t *cfg, const char **why) {
    const header_t *h = g->h;
    struct {
        const char *name;
        uint64_t group, mine;
    } f[] = {{"ranks", h->ranks, cfg->ranks},
             {"l1_pages", h->l1_pages, cfg->l1_pages},
             {"l2_pages", h->l2_pages, cfg->l2_pages},
             {"page_tokens", h->page_tokens, cfg->page_tokens},
             {"layers", h->layers, cfg->layers},
             {"layer_bytes", h->layer_bytes, cfg->layer_bytes},
             {"layout", h->layout, cfg->layout},
             {"requests", h->requests, cfg->requests},
             {"tag", h->tag, cfg->tag}};
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
        if (f[i].group != f[i].mine)
            return say(KVT_EINVAL, why, "rank %u: refused by group %s: its %s is %" PRIu64 ", this rank's %" PRIu64,
                       cfg->rank, g->name, f[i].name, f[i].group, f[i].mine);
    return KVT_OK;
}

static int attach_ctl(kvt_cp_group_t *g, const kvt_cp_group_config_t *cfg, const char *seg, const char **why) {
    uint64_t t0 = kvt_now_ns();
    int rc;
    while ((rc = kvt__seg_attach(&g->seg, seg, KVT__SEG_KIND_CP, CP_VERSION)) == KVT_ENOENT) {
        if (cfg->cancel && *cfg->cancel)
            return say(KVT_EIO, why, "rank %u: interrupted while joining group %s", cfg->rank, g->name);
        if (kvt_now_ns() - t0 > g->timeout_ns)
            return say(KVT_ETIMEDOUT, why, "rank %u: the control segment /dev/shm%s of group %s did not appear within "
                       "%" PRIu64 " ms: rank 0 never joined", cfg->rank, seg, g->name, g->timeout_ns / 1000000);
        pause_us(1000);
    }
    if (rc != KVT_OK)
        return say(rc, why, "rank %u: cannot attach the control segment /dev/shm%s: %s%s", cfg->rank, seg, kvt_strerror(rc),
                   rc == KVT_EINVAL ? " (another kvtier version made it)" : "");
    g->h = g->seg.base;
    uint64_t a, b, c;
    /* A rank started with other parameters means the launch is wrong: the
     * group cannot finish, so every rank hears it now, not at its join
     * timeout; unless the rank is taken, when the stray is another job's
     * process that picked the same name and stops nothing. (A segment of
     * the wrong size or layout is not written to at all.) */
    if ((rc = check_params(g, cfg, why)) != KVT_OK) {
        if (!rank_taken(g, cfg->rank)) stop_group(g, cfg->rank, t_why);
    } else if (g->seg.total != segment_bytes(cfg, &a, &b, &c) || g->h->slots_off != a || g->h->landed_off != b ||
               g->h->digests_off != c) {
        rc = say(KVT_EINVAL, why, "rank %u: group %s's control segment has the wrong size or layout", cfg->rank, g->name);
    } else {
        place(g, g->seg.base, cfg); /* the offsets checked: from here on they are ours, not the header's */
    }
    if (rc == KVT_OK && atomic_load_explicit(&g->h->stop, memory_order_acquire) != 0) { /* it can never finish now */
        stopped(g);
        rc = say(KVT_EIO, why, "%s", g->why); /* refused before its slot is claimed: nothing written */
    }
    if (rc == KVT_OK) rc = claim_slot(g, why);
    if (rc != KVT_OK) kvt__seg_close(&g->seg);
    return rc;
}

static void free_group(kvt_cp_group_t *g) {
    kvt__free(g->seq_of_l2, g->l2n * sizeof(uint64_t));
    kvt__free(g->freed_req, g->l2n * sizeof(uint64_t));
    kvt__free(g->last_l2_of_l1, g->l1n * sizeof(uint32_t));
    kvt__free(g->last_seq_of_l1, g->l1n * sizeof(uint64_t));
    kvt__free(g->filled_req, g->l1n * sizeof(uint64_t));
    KVT_DELETE(g);
}

static kvt_cp_group_t *new_group(const kvt_cp_group_config_t *cfg) {
    kvt_cp_group_t *g = KVT_NEW(kvt_cp_group_t);
    if (g == NULL) return NULL;
    snprintf(g->name, sizeof(g->name), "%s", cfg->name);
    g->rank = cfg->rank, g->C = cfg->ranks, g->requests = cfg->requests;
    g->l1n = cfg->l1_pages, g->l2n = cfg->l2_pages ? cfg->l2_pages : 1, g->l2_pages = cfg->l2_pages;
    g->timeout_ns = (uint64_t)(cfg->timeout_ms ? cfg->timeout_ms : DEFAULT_TIMEOUT_MS) * 1000000ull;
    g->wait_limit_ns = (uint64_t)(cfg->wait_ms ? cfg->wait_ms : DEFAULT_WAIT_MS) * 1000000ull;
    g->seq_of_l2 = kvt__calloc(g->l2n, sizeof(uint64_t));
    g->freed_req = kvt__calloc(g->l2n, sizeof(uint64_t));
    g->last_l2_of_l1 = kvt__calloc(g->l1n, sizeof(uint32_t));
    g->last_seq_of_l1 = kvt__calloc(g->l1n, sizeof(uint64_t));
    g->filled_req = kvt__calloc(g->l1n, sizeof(uint64_t));
    if (!g->seq_of_l2 || !g->freed_req || !g->last_l2_of_l1 || !g->last_seq_of_l1 || !g->filled_req) {
        free_group(g);
        return NULL;
    }
    return g;
}

int kvt_cp_group_join(kvt_cp_group_t **out, const kvt_cp_group_config_t *user, const char **why) {
    *out = NULL;
    /* the ABI rule (src/core/abi-int.h); what the ranks must agree on, up to tag, is required */
    kvt_cp_group_config_t full = {.size = sizeof(full)}, *cfg = &full;
    if (user == NULL || user->size < offsetof(kvt_cp_group_config_t, timeout_ms) ||
        kvt__abi_in(&full, sizeof(full), user) != KVT_OK)
        return say(KVT_EINVAL, why, "no config, or one without the fields every rank must agree on (size)");
    int rc = check_config(cfg, why);
    if (rc != KVT_OK) return rc;
    char seg[KVT__SEG_NAME_MAX];
    kvt_cp_group_segment(cfg->name, "ctl", seg, sizeof(seg));
    kvt_cp_group_t *g = new_group(cfg);
    if (g == NULL) return say(KVT_ENOMEM, why, "rank %u: out of memory", cfg->rank);
    rc = cfg->rank == 0 ? create_ctl(g, cfg, seg, why) : attach_ctl(g, cfg, seg, why);
    if (rc != KVT_OK) {
        free_group(g);
        return rc;
    }
    g->joined_at = kvt_now_ns();
    *out = g;
    return KVT_OK;
}

int kvt_cp_group_wait_joined(kvt_cp_group_t *g) {
    for (;;) {
        char missing[400] = "";
        size_t len = 0, n = 0;
        for (uint32_t r = 0; r < g->C; r++)
            if (atomic_load_explicit(&slot(g, r)->state, memory_order_acquire) == FREE && len < sizeof(missing) - 16)
                len += (size_t)snprintf(missing + len, sizeof(missing) - len, "%s%u", n++ ? ", " : "", r);
        if (stopped(g)) return KVT_EIO;
        if (n == 0) return KVT_OK;
        uint64_t now = kvt_now_ns();
        if (watch_ranks(g, -1, now) != KVT_OK) return KVT_EIO;
        if (now - g->joined_at > g->timeout_ns)
            return fail_self(g, KVT_ETIMEDOUT, "rank %u: %s %s never joined group %s within %" PRIu64 " ms", g->rank,
                             n > 1 ? "ranks" : "rank", missing, g->name, g->timeout_ns / 1000000);
        pause_us(1000);
    }
}

/* ---- the shared tiers -------------------------------------------------------------- */

int kvt_cp_group_open_tier(kvt_cp_group_t *g, const char *suffix, const kvt_tier_config_t *cfg, kvt_tier_t **out) {
    *out = NULL;
    char seg[KVT__SEG_NAME_MAX], label[16];
    if (suffix && strcmp(suffix, "ctl") == 0) { /* the group's own control segment */
        snprintf(g->why, sizeof(g->why), "rank %u: tier suffix \"ctl\" is the group's control segment's", g->rank);
        return KVT_EINVAL;
    }
    if (kvt_cp_group_segment(g->name, suffix, seg, sizeof(seg)) != KVT_OK) {
        snprintf(g->why, sizeof(g->why), "rank %u: tier suffix \"%.40s\": 1 to 8 of [A-Za-z0-9._-]", g->rank,
                 suffix ? suffix : "(null)");
        return KVT_EINVAL;
    }
    size_t i = 0;
    for (; suffix[i] && i < sizeof(label) - 1; i++) label[i] = (char)(suffix[i] >= 'a' && suffix[i] <= 'z' ? suffix[i] - 32 : suffix[i]);
    label[i] = '\0';
    kvt_tier_config_t tc = {0}; /* the ABI rule: a caller's struct may be shorter or longer than ours */
    if (cfg == NULL || kvt__abi_in(&tc, sizeof(tc), cfg) != KVT_OK) {
        snprintf(g->why, sizeof(g->why), "rank %u: no tier config, or one of another ABI (size)", g->rank);
        return KVT_EINVAL;
    }
    tc.kind = KVT_TIER_SHM;
    tc.name = seg;
    if (g->rank == 0) {
        tc.flags &= ~(uint32_t)KVT_TIER_ATTACH;
        int rc = kvt_tier_create(out, &tc);
        if (rc == KVT_EEXIST)
            return fail_self(g, rc, "rank 0: cannot create the %s segment /dev/shm%s: the name is taken by a file that is "
                             "not a kvtier segment, or by a live process's segment; it was left alone (remove it, or run "
                             "elsewhere)", label, seg);
        return rc == KVT_OK ? rc : fail_self(g, rc, "rank 0: cannot create the %s segment /dev/shm%s: %s", label, seg, kvt_strerror(rc));
    }
    tc.flags |= KVT_TIER_ATTACH;
    uint64_t t0 = kvt_now_ns();
    for (;;) { /* rank 0 creates it */
        int rc = kvt_tier_create(out, &tc);
        if (rc == KVT_OK) return rc;
        if (rc != KVT_ENOENT)
            return fail_self(g, rc, "rank %u: cannot attach the %s segment /dev/shm%s: %s%s", g->rank, label, seg,
                             kvt_strerror(rc), rc == KVT_EINVAL ? " (its geometry is not this rank's)" : "");
        if (stopped(g)) return KVT_EIO; /* another rank failed, and said why */
        uint64_t now = kvt_now_ns();
        if (watch_ranks(g, 0, now) != KVT_OK) return KVT_EIO;
        if (now - t0 > g->timeout_ns)
            return fail_self(g, KVT_ETIMEDOUT, "rank %u: the %s segment /dev/shm%s did not appear within %" PRIu64 " ms",
                             g->rank, label, seg, g->timeout_ns / 1000000);
        pause_us(1000);
    }
}

/* ---- leaving ----------------------------------------------------------------------- */

/* Every other rank that joined has finished, failed, left or died. */
static bool others_gone(const kvt_cp_group_t *g, uint32_t *running) {
    for (uint32_t r = 0; r < g->C; r++) {
        if (r == g->rank || atomic_load_explicit(&slot(g, r)->state, memory_order_acquire) != JOINED) continue;
        if (!dead(g, r)) {
            *running = r;
            return false;
        }
    }
    return true;
}

int kvt_cp_group_leave(kvt_cp_group_t *g, const char **why) {
    if (g == NULL) return KVT_OK;
    int rc = KVT_OK;
    slot_t *me = slot(g, g->rank);
    uint32_t joined = JOINED; /* finished and failed ranks stay so: only one still at work leaves early */
    if (atomic_load(&g->h->stop) == 0 && atomic_load_explicit(&me->state, memory_order_acquire) == JOINED) {
        char text[200];
        snprintf(text, sizeof(text), "rank %u left group %s without finishing, having done %" PRIu64 " requests", g->rank,
                 g->name, atomic_load(&me->done));
        stop_group(g, g->rank, text); /* first: whoever waits on this rank hears why, not a timeout */
    }
    atomic_compare_exchange_strong_explicit(&me->state, &joined, LEFT, memory_order_release, memory_order_relaxed);
    if (g->seg.creator) {
        uint64_t t0 = kvt_now_ns();
        uint32_t running = 0;
        while (!others_gone(g, &running) && rc == KVT_OK) {
            if (kvt_now_ns() - t0 > g->timeout_ns)
                rc = say(KVT_ETIMEDOUT, why, "rank 0: left group %s after %" PRIu64 " ms while rank %u was still running",
                         g->name, g->timeout_ns / 1000000, running);
            pause_us(1000);
        }
    }
    kvt__seg_close(&g->seg); /* the creator unlinks the name while it is still its segment */
    free_group(g);
    return rc;
}

/* ---- reading ----------------------------------------------------------------------- */

const char *kvt_cp_group_why(const kvt_cp_group_t *g) { return g->why; }

int kvt_cp_group_info(const kvt_cp_group_t *g, kvt_cp_group_info_t *out) {
    if (out == NULL) return KVT_EINVAL;
    kvt_cp_group_info_t full, *info = &full;
    const slot_t *me = slot(g, g->rank);
    uint32_t s = atomic_load_explicit(&g->h->stop, memory_order_acquire);
    *info = (kvt_cp_group_info_t){.size = sizeof(*info), .rank = g->rank, .ranks = g->C, .creator = g->seg.creator,
                                  .replaced_stale = g->seg.replaced_stale, .stopped = s != 0,
                                  .stopped_by = s == 2 ? atomic_load(&g->h->stopped_by) : -1,
                                  .divergence = atomic_load(&g->h->divergence),
                                  .wait_ns = atomic_load(&((slot_t *)me)->wait_ns), .waits = atomic_load(&((slot_t *)me)->waits)};
    return kvt__abi_out(out, info, sizeof(*info));
}

int kvt_cp_group_remove_stale(const char *name, const char *const *suffixes) {
    char seg[KVT__SEG_NAME_MAX];
    int n = 0;
    if (kvt_cp_group_segment(name, "ctl", seg, sizeof(seg)) != KVT_OK) return KVT_EINVAL;
    n += kvt__seg_remove_stale(seg, KVT__SEG_KIND_CP);
    for (size_t i = 0; suffixes && suffixes[i]; i++)
        if (kvt_cp_group_segment(name, suffixes[i], seg, sizeof(seg)) == KVT_OK) n += kvt__seg_remove_stale(seg, KVT__SEG_KIND_TIER);
    return n;
}
