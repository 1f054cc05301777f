/* The PD receiver (include/kvtier/pd.h): decode's side of the hand-off.
 *
 * It serves the caller's pool tier with a page server (the data port) and
 * runs the control protocol (src/pd/wire.h) on a thread of its own:
 *
 *   control thread                         caller
 *   join (join.c): C hellos, WELCOMEs
 *   serve: REQ  -> reserve + DST            kvt_pd_receiver_poll
 *          DONE -> all C: COMPLETE event --> pages checked, used ...
 *          close without BYE: FAILED ...    kvt_pd_receiver_release
 *          wake (a release) -> waiting REQs <-- (pages back to the pool)
 *          every rank gone: END event
 *
 * A hand-off is a slot of `live` through its life:
 *
 *   FREE --first REQ--> OPEN --every DONE--> POSTED (COMPLETE) --release--> FREE
 *                        | a rank vanished, a failed send, the timeout
 *                        v
 *                      FAILED (tombstone) --no rank can write it--> POSTED (FAILED)
 *
 * Reservation: the extent allocator, contiguous-preferred; the dense page
 * list (page j at dst[j]) gives each rank's share (pages j = s mod C)
 * consecutive reserved pages, so that one rank's pages land as one run when
 * the reservation is one run. A REQ that finds no room (pool or slots) waits
 * and is answered after a DONE, a release or a rank leaving.
 *
 * Visibility: a COMPLETE event is posted after the page server's statistics
 * were read (its lock orders every acknowledged run before it), and taken
 * under r->mu, so the caller may read the pages once poll returns it.
 *
 * Cost: per message O(C + max_live) (a linear slot search; both are small).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../core/clock-int.h"
#include "kvtier/stats.h"
#include "../core/abi-int.h"
#include "../core/check-int.h"
#include "kvtier/error.h"
#include "../core/mem-int.h"
#include "../net/net-int.h"
#include "../sock/wire.h"
#include "pd-int.h"


static uint64_t all_ranks(const kvt_pd_receiver_t *r) { return r->cfg.ranks == 64 ? ~0ull : (1ull << r->cfg.ranks) - 1; }

/* Ranks that write nothing any more: vanished or said goodbye. */
static uint64_t gone_mask(const kvt_pd_receiver_t *r) {
    uint64_t m = 0;
    for (uint32_t s = 0; s < r->cfg.ranks; s++) m |= (uint64_t)(r->dead[s] || r->finished[s]) << s;
    return m;
}

static void post(kvt_pd_receiver_t *r, kvt_pd_event_t ev) {
    size_t cap = r->cfg.max_live + 1; /* one event per slot at most, and END */
    KVT_ASSERT(r->qlen < cap);
    r->q[(r->qhead + r->qlen) % cap] = ev;
    r->qlen++;
    pthread_cond_broadcast(&r->cv);
}

static void post_handoff(kvt_pd_receiver_t *r, kvt__pd_live_t *l, kvt_pd_event_type_t type) {
    l->state = LIVE_POSTED;
    post(r, (kvt_pd_event_t){type, l->id, type == KVT_PD_EV_FAILED ? l->fail_status : KVT_OK,
                             type == KVT_PD_EV_FAILED ? l->fail_rank : -1, l->reason, l->npages, l->dst});
}

static void note_failed(kvt_pd_receiver_t *r, uint64_t id) {
    if (!r->st.first_failed || id + 1 < r->st.first_failed) r->st.first_failed = id + 1;
}

static bool ended(const kvt_pd_receiver_t *r, uint64_t id) {
    uint32_t n = r->nended < KVT__PD_ENDED ? r->nended : KVT__PD_ENDED;
    for (uint32_t i = 0; i < n; i++)
        if (r->ended[i] == id) return true;
    return false;
}

static kvt__pd_live_t *find_live(kvt_pd_receiver_t *r, uint64_t id) {
    for (uint32_t i = 0; i < r->cfg.max_live; i++)
        if (r->live[i].state != LIVE_FREE && r->live[i].id == id) return &r->live[i];
    return NULL;
}

static void forget_live(kvt__pd_live_t *l) {
    kvt__free(l->dst, l->npages * sizeof(uint32_t));
    kvt__free(l->runs, l->npages * sizeof(kvt_run_t));
    memset(l, 0, sizeof(*l));
}

/* Gives l's pages back and clears it; KVT_ENOMEM (the allocator could not
 * take them back) leaves l as it was, to be freed again. */
static int free_live(kvt_pd_receiver_t *r, kvt__pd_live_t *l) {
    int rc = kvt_extalloc_free(r->alloc, l->runs, l->nruns);
    if (rc != KVT_OK) return rc;
    if (l->state == LIVE_POSTED) r->ended[r->nended++ % KVT__PD_ENDED] = l->id;
    forget_live(l);
    return KVT_OK;
}

/* A tombstone is reported once every rank has said DONE for it, been
 * refused it, or gone: until then a slow rank may still be writing it. */
static void maybe_post_failed(kvt_pd_receiver_t *r, kvt__pd_live_t *l) {
    if (l->state == LIVE_FAILED && (l->done_mask | l->quiet_mask | gone_mask(r)) == all_ranks(r))
        post_handoff(r, l, KVT_PD_EV_FAILED);
}

static void fail_handoff(kvt_pd_receiver_t *r, kvt__pd_live_t *l, uint32_t rank, kvt_pd_fail_reason_t why, int status) {
    if (l->state != LIVE_OPEN) return;
    l->state = LIVE_FAILED;
    l->fail_rank = (int32_t)rank;
    l->reason = why;
    l->fail_status = status;
    r->st.failed++;
    note_failed(r, l->id);
    maybe_post_failed(r, l);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static uint64_t median(uint64_t *v, size_t n) {
    qsort(v, n, sizeof(uint64_t), cmp_u64);
    return n ? v[n / 2] : 0;
}

/* After a completed hand-off: per rank, the median of its REQ-to-DONE
 * times over the window; the worst rank is flagged when its median is more
 * than straggler_factor x the median of the ranks' medians. */
static void straggler(kvt_pd_receiver_t *r, const kvt__pd_live_t *l) {
    uint64_t w = r->cfg.window, C = r->cfg.ranks;
    for (uint32_t s = 0; s < C; s++) r->lat[s * w + r->nlat % w] = l->t_done[s] - l->t_req[s];
    if (++r->nlat < w) return;
    uint64_t med[KVT_PD_MAX_RANKS], tmp[KVT_PD_MAX_WINDOW];
    for (uint32_t s = 0; s < C; s++) {
        memcpy(tmp, &r->lat[s * w], w * sizeof(uint64_t));
        med[s] = r->st.rank[s].median_ns = median(tmp, w);
    }
    memcpy(tmp, med, C * sizeof(uint64_t));
    uint64_t group = median(tmp, C);
    uint32_t worst = 0;
    for (uint32_t s = 1; s < C; s++)
        if (med[s] > med[worst]) worst = s;
    double f = group ? (double)med[worst] / (double)group : 0;
    if (f > r->cfg.straggler_factor) {
        r->st.rank[worst].straggler_flags++;
        r->st.rank[worst].straggler_factor = f;
    }
}

static void complete(kvt_pd_receiver_t *r, kvt__pd_live_t *l) {
    kvt_net_server_stats_t ss = {.size = sizeof(ss)};
    kvt_net_server_stats(r->srv, &ss); /* the runs every DONE vouched for are visible from here on */
    uint64_t last = 0;
    uint32_t lander = 0;
    for (uint32_t s = 0; s < r->cfg.ranks; s++)
        if (l->t_done[s] > last) last = l->t_done[s], lander = s;
    kvt_hist_record(&r->st.handoff_ns, last - l->t_first);
    r->st.rank[lander].landed_last++;
    r->st.handoffs++;
    r->st.pages += l->npages;
    r->st.bytes += l->npages * r->page_bytes;
    straggler(r, l);
    post_handoff(r, l, KVT_PD_EV_COMPLETE);
}

/* An answer that cannot be written in time (the rank stopped reading, or
 * left) leaves its stream cut mid-message: the connection is shut, and
 * the next poll finds the rank gone. */
static int send_dst(kvt_pd_receiver_t *r, uint32_t s, uint64_t id, const kvt__pd_live_t *l, int32_t status) {
    kvt__pd_op_t m = {id, l ? l->npages : 0, status, 0};
    bool pages = l && status == KVT_OK;
    if (kvt__pd_send(r->fd[s], KVT_PD_DST, &m, pages ? l->dst : NULL, pages ? l->npages * sizeof(uint32_t) : 0,
                     kvt__pd_bound(r)) == 0)
        return 0;
    shutdown(r->fd[s], SHUT_RDWR);
    return -1;
}

static int refuse(kvt_pd_receiver_t *r, uint32_t s, uint64_t id, int status) {
    r->st.refused++;
    if (status != KVT_ERANGE && status != KVT_EINVAL) note_failed(r, id);
    return send_dst(r, s, id, NULL, status);
}

/* Lays the reserved runs out as the dense page list: each rank's share
 * consecutive. */
static void lay_out(uint32_t *dst, uint32_t *flat, const kvt_run_t *runs, size_t k, uint64_t n, uint64_t C) {
    uint64_t f = 0;
    for (size_t i = 0; i < k; i++)
        for (uint32_t p = 0; p < runs[i].len; p++) flat[f++] = runs[i].start + p;
    for (uint64_t s = 0, off = 0; s < C; s++) {
        uint64_t share = kvt__pd_share(n, (uint32_t)C, (uint32_t)s);
        for (uint64_t q = 0; q < share; q++) dst[s + q * C] = flat[off + q];
        off += share;
    }
}

/* A new hand-off's slot and pages: KVT_OK, 1 (no room yet), KVT_ENOMEM. */
static int open_handoff(kvt_pd_receiver_t *r, const kvt__pd_op_t *m, kvt__pd_live_t **out) {
    kvt__pd_live_t *slot = NULL;
    for (uint32_t i = 0; i < r->cfg.max_live && slot == NULL; i++)
        if (r->live[i].state == LIVE_FREE) slot = &r->live[i];
    if (slot == NULL) return 1;
    uint64_t n = m->npages;
    kvt_run_t *runs = kvt__calloc(n, sizeof(kvt_run_t));
    uint32_t *dst = kvt__calloc(n, sizeof(uint32_t)), *flat = kvt__calloc(n, sizeof(uint32_t));
    size_t k = 0;
    int rc = runs && dst && flat ? kvt_extalloc_reserve(r->alloc, n, runs, n, &k) : KVT_ENOMEM;
    if (rc == KVT_OK) lay_out(dst, flat, runs, k, n, r->cfg.ranks);
    kvt__free(flat, n * sizeof(uint32_t));
    if (rc != KVT_OK) {
        kvt__free(runs, n * sizeof(kvt_run_t));
        kvt__free(dst, n * sizeof(uint32_t));
        return rc == KVT_ENOSPC ? 1 : KVT_ENOMEM;
    }
    *slot = (kvt__pd_live_t){.state = LIVE_OPEN, .id = m->handoff, .npages = n, .t_first = kvt_now_ns(), .dst = dst, .runs = runs, .nruns = k};
    *out = slot;
    return KVT_OK;
}

/* Whether a new hand-off can never complete: a rank is gone (vanished, or
 * said goodbye: it sends no share of a hand-off it has not begun). */
static bool group_broken(const kvt_pd_receiver_t *r) { return gone_mask(r) != 0; }

/* A REQ: the hand-off's destination pages (reserved on its first REQ).
 * 1 when it must wait for room; else 0 (answered) or -1 (cannot answer). */
static int on_req(kvt_pd_receiver_t *r, uint32_t s, const kvt__pd_op_t *m) {
    if (m->handoff < r->cfg.resume_from) return refuse(r, s, m->handoff, KVT_ENOENT);
    kvt__pd_live_t *l = find_live(r, m->handoff);
    if (l == NULL && ended(r, m->handoff)) return refuse(r, s, m->handoff, KVT_EIO); /* reported and released already */
    if (l == NULL && group_broken(r)) return refuse(r, s, m->handoff, KVT_EIO); /* nothing new can complete */
    if (l == NULL) {
        const kvt_geom_t *g = kvt_tier_geom(r->cfg.pool);
        if (m->npages == 0) return refuse(r, s, m->handoff, KVT_EINVAL);
        /* (a DST's page list must fit its header's 32-bit length: 2^30 pages and more would wrap it) */
        if (m->npages > g->pages || m->npages > (UINT32_MAX - sizeof(kvt__pd_op_t)) / sizeof(uint32_t))
            return refuse(r, s, m->handoff, KVT_ERANGE);
        int rc = open_handoff(r, m, &l);
        if (rc != KVT_OK) return rc == 1 ? 1 : refuse(r, s, m->handoff, rc);
    }
    if (m->npages != l->npages) { /* the ranks disagree on its size: this rank will not write it, nor can it complete */
        l->quiet_mask |= 1ull << s;
        fail_handoff(r, l, s, KVT_PD_FAIL_SEND, KVT_EINVAL);
        int rc = refuse(r, s, m->handoff, KVT_EINVAL);
        maybe_post_failed(r, l);
        return rc;
    }
    if (l->state != LIVE_OPEN) { /* failed already (or done): this rank need not send */
        l->quiet_mask |= 1ull << s;
        int rc = send_dst(r, s, m->handoff, NULL, KVT_EIO);
        maybe_post_failed(r, l);
        return rc;
    }
    if (!l->t_req[s]) l->t_req[s] = kvt_now_ns();
    return send_dst(r, s, m->handoff, l, KVT_OK);
}

/* false for a DONE of a hand-off not open, or open but for which the rank
 * was given no pages: it cannot have written its share (a rank out of
 * step). */
static bool on_done(kvt_pd_receiver_t *r, uint32_t s, const kvt__pd_op_t *m) {
    kvt__pd_live_t *l = find_live(r, m->handoff);
    if (l == NULL) return false; /* no hand-off of that id is open: the rank is out of step */
    if (l->state == LIVE_POSTED) return true;
    if (!l->t_req[s] && !(l->quiet_mask & (1ull << s))) return false;
    l->t_done[s] = kvt_now_ns();
    l->done_mask |= 1ull << s;
    if (m->status != KVT_OK) {
        /* its runs still in flight (in decode's socket buffers) land now or never: not in pages the
         * caller has been given back after FAILED. (Its tcp tier opens new streams for its next
         * send: it finds these closed.) */
        kvt__net_fence(r->srv, (int)s);
        fail_handoff(r, l, s, KVT_PD_FAIL_SEND, KVT_EIO);
    }
    if (l->state == LIVE_OPEN && l->done_mask == all_ranks(r)) complete(r, l);
    else maybe_post_failed(r, l); /* (posts only a tombstone, once) */
    return true;
}

/* REQs that found no room get another try. */
static void retry_waiting(kvt_pd_receiver_t *r) {
    for (uint32_t s = 0; s < r->cfg.ranks; s++)
        if (r->has_waiting[s] && r->fd[s] >= 0 && on_req(r, s, &r->waiting[s]) != 1) r->has_waiting[s] = false;
}

/* A rank's control connection closed: after a goodbye it is finished; else
 * it vanished. Either way every hand-off still missing its DONE fails (a
 * rank that said goodbye first will not send it either). */
static void on_gone(kvt_pd_receiver_t *r, uint32_t s, bool finished) {
    close(r->fd[s]);
    r->fd[s] = -1;
    r->has_waiting[s] = false;
    /* what it had in flight lands now or never: not after FAILED (a goodbye with a DONE missing too);
     * a data connection it opens later is refused (the pages are the caller's, or another hand-off's) */
    kvt__net_bar(r->srv, (int)s);
    if (finished) r->finished[s] = true;
    else {
        r->dead[s] = true;
        r->st.vanished++;
        if (r->st.first_vanished < 0) r->st.first_vanished = (int32_t)s;
    }
    for (uint32_t i = 0; i < r->cfg.max_live; i++) {
        kvt__pd_live_t *l = &r->live[i];
        if (l->state == LIVE_OPEN && !(l->done_mask & (1ull << s)))
            fail_handoff(r, l, s, finished ? KVT_PD_FAIL_BYE : KVT_PD_FAIL_VANISHED, KVT_EIO);
        maybe_post_failed(r, l); /* the gone rank writes nothing any more */
    }
    retry_waiting(r);
}

static void on_timeout(kvt_pd_receiver_t *r) {
    for (uint32_t i = 0; i < r->cfg.max_live; i++)
        for (uint32_t s = 0; s < r->cfg.ranks && r->live[i].state == LIVE_OPEN; s++)
            if (!(r->live[i].done_mask & (1ull << s))) fail_handoff(r, &r->live[i], s, KVT_PD_FAIL_TIMEOUT, KVT_ETIMEDOUT);
    retry_waiting(r);
}

/* What a joined rank may send. */
#define FROM_RANKS (1u << KVT_PD_REQ | 1u << KVT_PD_DONE | 1u << KVT_PD_BYE)

/* One message from rank s (its socket is readable). false when it left. */
static bool on_message(kvt_pd_receiver_t *r, uint32_t s) {
    unsigned type;
    kvt__pd_op_t m;
    if (kvt__pd_recv(r->fd[s], FROM_RANKS, &type, &m, kvt__pd_bound(r)) != 0) {
        on_gone(r, s, false);
        return false;
    }
    if (type == KVT_PD_BYE) {
        on_gone(r, s, true);
        return false;
    }
    if (type == KVT_PD_DONE) {
        if (!on_done(r, s, &m)) {
            on_gone(r, s, false);
            return false;
        }
        retry_waiting(r); /* room may have come free */
    } else if (on_req(r, s, &m) == 1) {
        r->waiting[s] = m;
        r->has_waiting[s] = true;
    }
    return true;
}

/* Whether rank s's next message is whole in its socket buffer, so that
 * reading it cannot wait: 1, 0 (not yet), -1 (the peer closed, or no
 * kvtier header: read, on_message drops the rank). Peeked, not read. */
static int whole(int fd) {
    uint8_t b[sizeof(kvt__pd_hdr_t) + sizeof(kvt__pd_op_t)];
    ssize_t n = recv(fd, b, sizeof(b), MSG_PEEK | MSG_DONTWAIT);
    if (n <= 0) return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
    if ((size_t)n < sizeof(kvt__pd_hdr_t)) return 0;
    kvt__pd_hdr_t h;
    memcpy(&h, b, sizeof(h));
    if (!kvt__pd_header_ok(&h, FROM_RANKS)) return -1;
    return (size_t)n >= sizeof(h) + h.length;
}

/* The control loop. A message is read only once it is whole (peeked), so
 * that a rank that stops mid-message holds up neither the other ranks nor
 * the caller's poll, release and stats (which take r->mu): its socket is
 * looked at again every 10 ms, and it is taken for gone once a message has
 * stayed partial for timeout_ms, or at once when its peer closes. */
static void serve(kvt_pd_receiver_t *r) {
    uint32_t C = r->cfg.ranks, open = C;
    uint64_t last_progress = kvt_now_ns(), partial_since[KVT_PD_MAX_RANKS] = {0};
    pthread_mutex_lock(&r->mu);
    while (open > 0 && !r->stopping) {
        struct pollfd pf[KVT_PD_MAX_RANKS + 1];
        bool partial = false;
        for (uint32_t s = 0; s < C; s++) {
            /* a partial one is looked at by the clock, or at once when its peer closes */
            pf[s] = (struct pollfd){r->fd[s], partial_since[s] ? POLLRDHUP : POLLIN, 0};
            partial |= partial_since[s] != 0;
        }
        pf[C] = (struct pollfd){r->wakefd, POLLIN, 0};
        pthread_mutex_unlock(&r->mu);
        int n = poll(pf, C + 1, partial ? 10 : 100);
        pthread_mutex_lock(&r->mu);
        if (r->stopping) break;
        if (n > 0 && (pf[C].revents & POLLIN)) { /* a release: pages came free */
            uint64_t v;
            if (read(r->wakefd, &v, sizeof(v)) < 0 && errno != EAGAIN) break;
            retry_waiting(r);
        }
        for (uint32_t s = 0; s < C; s++) {
            if (r->fd[s] < 0 || !(partial_since[s] || (n > 0 && (pf[s].revents & (POLLIN | POLLHUP | POLLERR))))) continue;
            int w = (pf[s].revents & (POLLHUP | POLLERR | POLLRDHUP)) ? -1 : whole(r->fd[s]);
            uint64_t now = kvt_now_ns();
            if (w == 0 && !partial_since[s]) partial_since[s] = now;
            if (w == 0 && now - partial_since[s] <= r->cfg.timeout_ms * 1000000ull) continue;
            partial_since[s] = 0;
            if (w == 0) { /* stopped mid-message */
                on_gone(r, s, false);
                open--;
                continue;
            }
            last_progress = now;
            if (!on_message(r, s)) open--;
        }
        if (kvt_now_ns() - last_progress > r->cfg.timeout_ms * 1000000ull) { /* nothing moved: the hand-offs in flight fail */
            on_timeout(r);
            last_progress = kvt_now_ns();
        }
    }
    pthread_mutex_unlock(&r->mu);
}

static void *control_main(void *arg) {
    kvt_pd_receiver_t *r = arg;
    int rc = kvt__pd_join(r);
    if (rc == KVT_OK) serve(r);
    pthread_mutex_lock(&r->mu);
    if (rc != KVT_OK) /* the join failed: the ranks that joined are told, not left waiting in begin */
        for (uint32_t s = 0; s < r->cfg.ranks; s++)
            if (r->fd[s] >= 0) shutdown(r->fd[s], SHUT_RDWR);
    post(r, (kvt_pd_event_t){.type = KVT_PD_EV_END, .status = r->stopping ? KVT_OK : rc, .rank = -1});
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* ---- the public calls ------------------------------------------------------------- */

static int fill_config(kvt_pd_receiver_config_t *c, const kvt_pd_receiver_config_t *in) {
    /* the ABI rule (src/core/abi-int.h), and the fields up to max_live are required */
    memset(c, 0, sizeof(*c));
    if (in == NULL || in->size < offsetof(kvt_pd_receiver_config_t, max_live) || kvt__abi_in(c, sizeof(*c), in) != KVT_OK) return KVT_EINVAL;
    if (c->host == NULL) c->host = "127.0.0.1";
    if (!c->timeout_ms) c->timeout_ms = 10000;
    if (!c->join_timeout_ms) c->join_timeout_ms = 20000;
    if (!c->window) c->window = 16;
    if (c->straggler_factor <= 0) c->straggler_factor = 3.0;
    if (!c->max_live) c->max_live = 256;
    if (c->pool == NULL || c->token == 0 || !kvt_tier_host_visible(c->pool) || kvt_tier_geom(c->pool)->pages > KVT_ALLOC_MAX_PAGES ||
        c->ranks == 0 || c->ranks > KVT_PD_MAX_RANKS || c->window < 2 || c->window > KVT_PD_MAX_WINDOW ||
        c->max_live > 1u << 20 || (unsigned)c->transport > KVT_NET_UCX)
        return KVT_EINVAL;
    return KVT_OK;
}

static int listen_control(kvt_pd_receiver_t *r) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(r->cfg.control_port)};
    if (inet_pton(AF_INET, r->cfg.host, &a.sin_addr) != 1) return KVT_EINVAL;
    r->lfd = kvt__tcp_listen(&a, &r->cport);
    return r->lfd >= 0 ? KVT_OK : KVT_EIO;
}

static int alloc_tables(kvt_pd_receiver_t *r) {
    r->live = kvt__calloc(r->cfg.max_live, sizeof(kvt__pd_live_t));
    r->q = kvt__calloc(r->cfg.max_live + 1, sizeof(kvt_pd_event_t));
    r->lat = kvt__calloc((size_t)r->cfg.ranks * r->cfg.window, sizeof(uint64_t));
    return r->live && r->q && r->lat ? KVT_OK : KVT_ENOMEM;
}

static void free_all(kvt_pd_receiver_t *r) {
    for (uint32_t s = 0; s < r->cfg.ranks; s++)
        if (r->fd[s] >= 0) close(r->fd[s]);
    for (uint32_t i = 0; i < r->npeers; i++) close(r->peers[i]);
    if (r->lfd >= 0) close(r->lfd);
    if (r->wakefd >= 0) close(r->wakefd);
    kvt_net_server_destroy(r->srv);
    for (uint32_t i = 0; r->live && i < r->cfg.max_live; i++)
        if (r->live[i].state != LIVE_FREE) forget_live(&r->live[i]); /* the pool goes with the allocator */
    kvt_extalloc_destroy(r->alloc);
    kvt__free(r->live, r->cfg.max_live * sizeof(kvt__pd_live_t));
    kvt__free(r->q, (r->cfg.max_live + 1) * sizeof(kvt_pd_event_t));
    kvt__free(r->lat, (size_t)r->cfg.ranks * r->cfg.window * sizeof(uint64_t));
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    KVT_DELETE(r);
}

static void init_sync(kvt_pd_receiver_t *r) {
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&r->mu, NULL);
}

int kvt_pd_receiver_create(kvt_pd_receiver_t **out, const kvt_pd_receiver_config_t *cfg) {
    kvt_pd_receiver_config_t c;
    if (out == NULL || fill_config(&c, cfg) != KVT_OK) return KVT_EINVAL;
    kvt_pd_receiver_t *r = KVT_NEW(kvt_pd_receiver_t);
    if (r == NULL) return KVT_ENOMEM;
    r->cfg = c;
    r->lfd = r->wakefd = -1;
    for (uint32_t s = 0; s < KVT_PD_MAX_RANKS; s++) r->fd[s] = -1;
    const kvt_geom_t *g = kvt_tier_geom(c.pool);
    r->page_bytes = kvt_geom_page_bytes(g);
    kvt_pd_stats_init(&r->st, c.ranks);
    r->st.pool_pages = g->pages;
    init_sync(r);
    int rc = alloc_tables(r);
    if (rc == KVT_OK) rc = kvt_extalloc_create(&r->alloc, g->pages);
    if (rc == KVT_OK) rc = kvt_net_server_create(&r->srv, c.transport, c.pool, c.host, c.data_port);
    /* the pool takes bytes only from the group's ranks: before anyone knows the port */
    if (rc == KVT_OK) rc = kvt_net_server_set_token(r->srv, c.token);
    if (rc == KVT_OK) kvt__net_set_writers(r->srv, c.ranks); /* each rank's data connections known as its */
    if (rc == KVT_OK) rc = listen_control(r);
    if (rc == KVT_OK && (r->wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) rc = KVT_EIO;
    r->dport = r->srv ? kvt_net_server_port(r->srv) : 0;
    r->t_create = kvt_now_ns();
    if (rc == KVT_OK && pthread_create(&r->th, NULL, control_main, r) != 0) rc = KVT_EIO;
    if (rc != KVT_OK) {
        free_all(r);
        return rc;
    }
    *out = r;
    return KVT_OK;
}

static void wake(kvt_pd_receiver_t *r) {
    uint64_t one = 1;
    if (write(r->wakefd, &one, sizeof(one)) < 0) { /* full: a wake-up is pending anyway */
    }
}

void kvt_pd_receiver_destroy(kvt_pd_receiver_t *r) {
    if (r == NULL) return;
    atomic_store(&r->halt, true); /* a message in the middle of its bytes holds the lock: give it up */
    pthread_mutex_lock(&r->mu);
    r->stopping = true;
    pthread_mutex_unlock(&r->mu);
    wake(r);
    pthread_join(r->th, NULL);
    free_all(r);
}

uint16_t kvt_pd_receiver_data_port(const kvt_pd_receiver_t *r) { return r ? r->dport : 0; }
uint16_t kvt_pd_receiver_control_port(const kvt_pd_receiver_t *r) { return r ? r->cport : 0; }

int kvt_pd_receiver_poll(kvt_pd_receiver_t *r, kvt_pd_event_t *ev, size_t max, uint64_t timeout_ns) {
    if (r == NULL || (ev == NULL && max)) return KVT_EINVAL;
    struct timespec until = kvt__deadline(timeout_ns);
    size_t n = 0, cap = r->cfg.max_live + 1;
    pthread_mutex_lock(&r->mu);
    while (r->qlen == 0 && timeout_ns && pthread_cond_timedwait(&r->cv, &r->mu, &until) != ETIMEDOUT) {
    }
    for (; n < max && r->qlen > 0; n++, r->qlen--, r->qhead = (r->qhead + 1) % cap) ev[n] = r->q[r->qhead];
    pthread_mutex_unlock(&r->mu);
    return (int)n;
}

int kvt_pd_receiver_release(kvt_pd_receiver_t *r, uint64_t handoff) {
    if (r == NULL) return KVT_EINVAL;
    pthread_mutex_lock(&r->mu);
    kvt__pd_live_t *l = find_live(r, handoff);
    bool ok = l && l->state == LIVE_POSTED;
    for (size_t i = 0; ok && i < r->qlen; i++) /* still queued: not reported yet */
        if (r->q[(r->qhead + i) % (r->cfg.max_live + 1)].handoff == handoff &&
            r->q[(r->qhead + i) % (r->cfg.max_live + 1)].type != KVT_PD_EV_END)
            ok = false;
    int rc = ok ? free_live(r, l) : KVT_ENOENT;
    pthread_mutex_unlock(&r->mu);
    if (rc != KVT_OK) return rc;
    wake(r); /* a REQ may be waiting for these pages */
    return KVT_OK;
}

int kvt_pd_receiver_stats(kvt_pd_receiver_t *r, kvt_pd_stats_t *out) {
    if (r == NULL || out == NULL) return KVT_EINVAL;
    /* large (histograms): built off the stack, then copied as far as out reaches */
    kvt_pd_stats_t *st = KVT_NEW(kvt_pd_stats_t);
    if (st == NULL) return KVT_ENOMEM;
    kvt_net_server_stats_t ss = {.size = sizeof(ss)};
    kvt_extalloc_stats_t as = {.size = sizeof(as)};
    kvt_net_server_stats(r->srv, &ss);
    pthread_mutex_lock(&r->mu);
    kvt_extalloc_stats(r->alloc, &as);
    *st = r->st;
    pthread_mutex_unlock(&r->mu);
    st->free_pages = as.free_pages;
    st->data_refused_hellos = ss.refused;
    st->data_bad_peers = ss.bad_peers;
    st->data_silent_peers = ss.awaiting_hello;
    snprintf(st->data_last_error, sizeof(st->data_last_error), "%s", ss.last_error);
    kvt__pd_pick_straggler(st);
    st->size = sizeof(*st);
    int rc = kvt__abi_out(out, st, sizeof(*st));
    KVT_DELETE(st);
    return rc;
}
