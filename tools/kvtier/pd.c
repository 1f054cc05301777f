/* kvtier pd — prefill/decode hand-off: a CP prefill group of C rank
 * processes sends each request's KV to a decode process over the network
 * (docs/pd.md).
 *
 *   coordinator ----------------------------------------------------------+
 *     | control block (shared anonymous mapping): ports, results, stop    |
 *     +-- fork --> decode: pool tier + page server (data, 127.0.0.1:P1)   |
 *     |                    control listener (127.0.0.1:P2)                |
 *     +-- fork --> prefill rank r (r < C):                                |
 *                  lane tier (its own pages) --engine--> tcp tier (decode) |
 *
 * Per request (hand-off) h of n pages, every rank:
 *   1. fills the pages it owns (page j is rank j mod C's) from the page hashes
 *   2. REQ{h, n} on its control connection; decode reserves n destination
 *      pages (contiguous runs where it can) on the first REQ of h, and answers
 *      every rank with the same DST{h, pages}
 *   3. sends its pages with the transfer engine (runs merged where the
 *      destination runs allow; batches capped), which completes when the
 *      decode's page server has acknowledged every byte
 *   4. DONE{h, r}
 * Decode completes h when every rank's DONE arrived: it checks every page
 * byte for byte, and only then would its cache see them (here: they are
 * counted and released). A rank that vanishes fails the hand-offs it had not
 * finished; their pages are discarded. Straggler: per rank, the median time
 * from a hand-off's first REQ to its DONE over the last --window hand-offs;
 * a rank whose median exceeds --straggler-factor x the median of all ranks
 * is flagged (a rank's time: from its REQ to its DONE, i.e. its sending).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "util.h"
#include "commands.h"
#include "kvtier/alloc.h"
#include "kvtier/error.h"
#include "kvtier/net.h"
#include "kvtier/radix.h"
#include "kvtier/stats.h"
#include "kvtier/tier.h"
#include "kvtier/xfer.h"
#include "group.h"
#include "net/wire.h"
#include "replay.h"
#include "trace.h"

#define MAX_RANKS 32
#define MAX_LIVE 256 /* hand-offs decode tracks at once */
#define MAX_DELAY_MS 600000u /* --delay-rank: 10 minutes at most per hand-off */

/* ---- control messages -------------------------------------------------------- */

enum { MSG_HELLO = 1, MSG_REQ = 2, MSG_DST = 3, MSG_DONE = 4 };

/* A hello is {HELLO, rank, 0, token, PD_VERSION, PD_MAGIC}: the token is the
 * group's secret (random, in the control block), so that a stranger on the
 * control port cannot take a rank's place. A goodbye is {HELLO, rank,
 * UINT64_MAX, ...}. */
#define PD_MAGIC 0x6470766b /* "kvpd" */
#define PD_VERSION 2
#define HELLO_TIMEOUT_MS 2000 /* a control peer that has not said hello by then is dropped */
#define MAX_PENDING 128       /* control connections awaiting their hello at once */

typedef struct msg {
    uint32_t type, rank;
    uint64_t handoff, npages;
    int32_t status, pad;
} msg_t;

/* ---- the control block ------------------------------------------------------- */

typedef struct rank_out {
    _Atomic uint64_t pos; /* the hand-off this rank is on */
    uint64_t bytes, runs, pages, batches, failed, handoffs, released, busy_ns;
    kvt_hist_t e2e; /* batch submit to acknowledged, over every decode generation */
    uint64_t p50, p90, p99, p999, max; /* batch end to end, ns */
    double gbps;
    char err[160];
} rank_out_t;

typedef struct ctl {
    _Atomic int stop;
    _Atomic int decode_lost; /* decode died and is not restarted: nothing to wait for */
    _Atomic uint32_t data_port, ctl_port;
    _Atomic uint32_t gen; /* decode's generation: restarts so far */
    uint64_t token;       /* the group's secret, in every rank's hello */
    uint64_t resume_from; /* after a restart: the first hand-off every rank can still deliver */
    uint64_t total;       /* hand-offs in the run (requests of at least one page per rank) */
    rank_out_t rank[MAX_RANKS];
    /* decode's results */
    uint64_t handoffs, mismatches, bytes, first_failed, vanished_rank_plus1;
    uint64_t straggler_flags[MAX_RANKS];
    double straggler_factor[MAX_RANKS];
    kvt_hist_t handoff_ns;
    uint64_t last_lander[MAX_RANKS];
    char decode_err[200];
    /* peers decode turned away, over every generation */
    uint64_t data_refused, data_bad, data_silent, ctl_bad;
    char data_last_error[128], ctl_last_error[128];
} ctl_t;

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

static const char *const TRANSPORTS[] = {"tcp", "ucx", NULL};
static const char *const STATS_FORMATS[] = {"none", "table", "json", "prom", NULL}; /* index - 1 = kvt_fmt_t */

/* Pages of request i that are handed off. */
static uint64_t handoff_pages(const trace_t *t, uint64_t i, const pd_opts_t *o) {
    uint64_t n = t->req[i].input_length / o->page_tokens;
    return n < o->max_pages ? n : o->max_pages;
}

static void page_hashes(const trace_t *t, uint64_t i, const pd_opts_t *o, int32_t *tok, kvt_hash128_t *h, uint64_t n) {
    const trace_req_t *q = &t->req[i];
    for (uint32_t b = 0; b < q->nblocks; b++) trace_block_tokens(q->hash_ids[b], tok + (size_t)b * TRACE_BLOCK_TOKENS);
    kvt_page_hash_chain(0, tok, n, (uint32_t)o->page_tokens, h);
}

static int listen_any(uint16_t *port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    return kvt__tcp_listen(&a, port);
}
/* Adds an engine's statistics (lane -> decode) to a rank's. */
static void collect(rank_out_t *out, kvt_xfer_t *x) {
    kvt_xfer_stats_t st = {.size = sizeof(st)};
    if (x == NULL || kvt_xfer_stats(x, 0, 1, &st) != KVT_OK) return;
    out->bytes += st.bytes;
    out->runs += st.runs;
    out->pages += st.pages;
    out->batches += st.batches;
    out->busy_ns += st.busy_ns;
    kvt_hist_merge(&out->e2e, &st.e2e_ns);
}

/* ---- decode -------------------------------------------------------------------- */

typedef struct live {
    bool used;
    bool failed; /* a tombstone: its pages stay reserved until no rank can still write them */
    uint64_t id, npages, t_first, done_mask;
    uint64_t t_req[MAX_RANKS], t_done[MAX_RANKS];
    uint32_t *dst;
    kvt_run_t *runs;
    size_t nruns;
} live_t;

typedef struct decode {
    const pd_opts_t *o;
    const trace_t *t;
    ctl_t *ctl;
    kvt_tier_t *pool;
    kvt_net_server_t *srv;
    kvt_extalloc_t *alloc;
    live_t live[MAX_LIVE];
    int fd[MAX_RANKS];
    bool dead[MAX_RANKS];
    msg_t waiting[MAX_RANKS]; /* a REQ that found no room, per rank (type 0: none) */
    uint64_t *lat;            /* [rank][window]: a ring of per-rank hand-off latencies */
    uint64_t nlat;
    int32_t *tok;
    kvt_hash128_t *h;
    uint8_t *buf;
    uint32_t C, layers;
    uint64_t layer_bytes;
} decode_t;

static live_t *find_live(decode_t *d, uint64_t id) {
    for (int i = 0; i < MAX_LIVE; i++)
        if (d->live[i].used && d->live[i].id == id) return &d->live[i];
    return NULL;
}

static void release(decode_t *d, live_t *l) {
    kvt_extalloc_free(d->alloc, l->runs, l->nruns);
    free(l->dst);
    free(l->runs);
    memset(l, 0, sizeof(*l));
}

static uint64_t gone_mask(const decode_t *d) {
    uint64_t m = 0;
    for (uint32_t r = 0; r < d->C; r++) m |= (uint64_t)d->dead[r] << r;
    return m;
}

/* A failed hand-off's pages go back once every rank has either said DONE
 * for it or vanished: until then a slow rank may still be writing them. */
static void maybe_release(decode_t *d, live_t *l) {
    if (l->used && l->failed && (l->done_mask | gone_mask(d)) == (1ull << d->C) - 1) release(d, l);
}

static void fail_handoff(decode_t *d, live_t *l, int rank, const char *why) {
    if (l->failed) return;
    l->failed = true;
    if (!d->ctl->first_failed || l->id + 1 < d->ctl->first_failed) d->ctl->first_failed = l->id + 1;
    fprintf(stderr, "kvtier pd: decode: hand-off %" PRIu64 " failed: rank %d %s; its %" PRIu64 " pages are discarded\n",
            l->id + 1, rank, why, l->npages);
    maybe_release(d, l);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static uint64_t median(uint64_t *v, size_t n) {
    qsort(v, n, sizeof(uint64_t), cmp_u64);
    return n ? v[n / 2] : 0;
}

/* After a completed hand-off: the straggler over the window. */
static void straggler(decode_t *d, const live_t *l) {
    uint64_t w = d->o->window;
    for (uint32_t r = 0; r < d->C; r++) d->lat[r * w + d->nlat % w] = l->t_done[r] - l->t_req[r];
    if (++d->nlat < w) return;
    uint64_t med[MAX_RANKS], tmp[1024];
    for (uint32_t r = 0; r < d->C; r++) {
        memcpy(tmp, &d->lat[r * w], w * sizeof(uint64_t));
        med[r] = median(tmp, w);
    }
    memcpy(tmp, med, d->C * sizeof(uint64_t));
    uint64_t group = median(tmp, d->C);
    uint32_t worst = 0;
    for (uint32_t r = 1; r < d->C; r++)
        if (med[r] > med[worst]) worst = r;
    double f = group ? (double)med[worst] / (double)group : 0;
    if (f > d->o->straggler_factor) {
        d->ctl->straggler_flags[worst]++;
        d->ctl->straggler_factor[worst] = f;
    }
}

static void complete(decode_t *d, live_t *l) {
    kvt_net_server_stats_t ss = {.size = sizeof(ss)};
    kvt_net_server_stats(d->srv, &ss); /* the runs every DONE vouched for are visible from here on */
    page_hashes(d->t, l->id, d->o, d->tok, d->h, l->npages);
    uint64_t bad = 0;
    for (uint64_t j = 0; j < l->npages; j++) /* every page, byte for byte */
        bad += !kvt_tier_pattern_check(d->pool, l->dst[j], d->h[j].lo, d->h[j].hi, d->buf);
    d->ctl->mismatches += bad;
    uint64_t last = 0;
    uint32_t lander = 0;
    for (uint32_t r = 0; r < d->C; r++)
        if (l->t_done[r] > last) last = l->t_done[r], lander = r;
    kvt_hist_record(&d->ctl->handoff_ns, last - l->t_first);
    d->ctl->last_lander[lander]++;
    d->ctl->handoffs++;
    d->ctl->bytes += l->npages * d->layers * d->layer_bytes;
    const char *kill = getenv("KVT_PD_DECODE_KILL"); /* tests: the first decode dies after N hand-offs */
    if (kill && atomic_load(&d->ctl->gen) == 0 && d->ctl->handoffs == strtoull(kill, NULL, 10)) raise(SIGKILL);
    straggler(d, l);
    release(d, l); /* visible now; served and let go */
}

static int send_dst(decode_t *d, uint32_t r, const live_t *l, int32_t status) {
    msg_t m = {MSG_DST, r, l ? l->id : 0, l ? l->npages : 0, status, 0};
    if (kvt__write_full(d->fd[r], &m, sizeof(m)) != 0) return -1;
    return l && status == KVT_OK ? kvt__write_full(d->fd[r], l->dst, l->npages * sizeof(uint32_t)) : 0;
}

/* A REQ: the hand-off's destination pages (reserved on its first REQ). 1
 * when it must wait for room. */
static int on_req(decode_t *d, uint32_t r, const msg_t *m) {
    if (m->handoff < d->ctl->resume_from) return send_dst(d, r, NULL, KVT_EIO); /* lost with the previous decode */
    live_t *l = find_live(d, m->handoff);
    for (uint32_t s = 0; s < d->C && l == NULL; s++)
        if (d->dead[s]) { /* the group is broken: nothing new completes */
            if (!d->ctl->first_failed || m->handoff + 1 < d->ctl->first_failed) d->ctl->first_failed = m->handoff + 1;
            return send_dst(d, r, NULL, KVT_EIO);
        }
    if (l == NULL) {
        int slot = -1;
        for (int i = 0; i < MAX_LIVE && slot < 0; i++)
            if (!d->live[i].used) slot = i;
        if (m->npages == 0 || m->npages > d->o->decode_pages) return send_dst(d, r, NULL, KVT_EINVAL);
        kvt_run_t *runs = malloc(m->npages * sizeof(kvt_run_t));
        size_t k = 0;
        if (slot < 0 || runs == NULL || kvt_extalloc_reserve(d->alloc, m->npages, runs, m->npages, &k) != KVT_OK) {
            free(runs);
            return 1; /* no room yet: answered when a hand-off completes */
        }
        /* The decode's page list for the request is dense (page j at dst[j]);
         * each rank's share (pages j = r mod C) gets consecutive reserved
         * pages, so that one rank's pages land as one run. */
        uint32_t *dst = malloc(m->npages * sizeof(uint32_t)), *flat = malloc(m->npages * sizeof(uint32_t));
        if (dst == NULL || flat == NULL) {
            kvt_extalloc_free(d->alloc, runs, k);
            free(runs);
            free(dst);
            free(flat);
            return send_dst(d, r, NULL, KVT_ENOMEM);
        }
        uint64_t f = 0, C = d->C;
        for (size_t i = 0; i < k; i++)
            for (uint32_t p = 0; p < runs[i].len; p++) flat[f++] = runs[i].start + p;
        for (uint64_t r0 = 0, off = 0; r0 < C; r0++) {
            uint64_t share = m->npages / C + (r0 < m->npages % C);
            for (uint64_t q = 0; q < share; q++) dst[r0 + q * C] = flat[off + q];
            off += share;
        }
        free(flat);
        l = &d->live[slot];
        *l = (live_t){.used = true, .id = m->handoff, .npages = m->npages, .t_first = now_ns(), .dst = dst, .runs = runs, .nruns = k};
    }
    if (l->failed) return send_dst(d, r, NULL, KVT_EIO); /* failed already: this rank need not send */
    if (!l->t_req[r]) l->t_req[r] = now_ns();
    return send_dst(d, r, l, KVT_OK);
}

static void on_done(decode_t *d, uint32_t r, const msg_t *m) {
    live_t *l = find_live(d, m->handoff);
    if (l == NULL) return;
    l->t_done[r] = now_ns();
    l->done_mask |= 1ull << r;
    if (m->status != KVT_OK) fail_handoff(d, l, (int)r, "could not send its pages");
    if (l->failed) maybe_release(d, l);
    else if (l->done_mask == (1ull << d->C) - 1) complete(d, l);
}

/* REQs that found no room get another try (after pages came free). */
static void retry_waiting(decode_t *d) {
    for (uint32_t s = 0; s < d->C; s++)
        if (d->waiting[s].type == MSG_REQ && d->fd[s] >= 0 && on_req(d, s, &d->waiting[s]) != 1) d->waiting[s].type = 0;
}

/* A rank's control connection closed: if it had not said goodbye (all
 * requests done), every hand-off still missing its pages fails. */
static void on_gone(decode_t *d, uint32_t r, bool finished) {
    close(d->fd[r]);
    d->fd[r] = -1;
    if (finished) return;
    d->dead[r] = true;
    d->waiting[r].type = 0;
    if (!d->ctl->vanished_rank_plus1) d->ctl->vanished_rank_plus1 = r + 1;
    for (int i = 0; i < MAX_LIVE; i++) {
        live_t *l = &d->live[i];
        if (l->used && !(l->done_mask & (1ull << r))) fail_handoff(d, l, (int)r, "vanished");
        maybe_release(d, l); /* the dead rank writes nothing any more */
    }
    retry_waiting(d);
}

/* ---- decode: who may join ----------------------------------------------------------- */

static void ctl_drop(decode_t *d, int fd, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void ctl_drop(decode_t *d, int fd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->ctl->ctl_last_error, sizeof(d->ctl->ctl_last_error), fmt, ap);
    va_end(ap);
    d->ctl->ctl_bad++;
    close(fd);
}

/* The data port's bad peers (the page server counts them) into the control block. */
static void note_data_peers(decode_t *d) {
    kvt_net_server_stats_t ss = {.size = sizeof(ss)};
    if (kvt_net_server_stats(d->srv, &ss) != KVT_OK) return;
    d->ctl->data_refused += ss.refused;
    d->ctl->data_bad += ss.bad_peers;
    d->ctl->data_silent += ss.awaiting_hello;
    if (ss.last_error[0]) snprintf(d->ctl->data_last_error, sizeof(d->ctl->data_last_error), "%s", ss.last_error);
}

typedef struct pending {
    int fd;
    uint64_t deadline;
    size_t got;
    msg_t m;
} pending_t;

/* A whole hello from p: a rank's slot, taken once; anything else drops it. */
static void on_hello(decode_t *d, pending_t *p, uint32_t *joined) {
    const msg_t *m = &p->m;
    if (m->type != MSG_HELLO || (uint32_t)m->pad != PD_MAGIC || m->status != PD_VERSION)
        return ctl_drop(d, p->fd, "control port: not a kvtier pd hello (type %u)", m->type);
    if (m->npages != d->ctl->token) return ctl_drop(d, p->fd, "control port: a hello for rank %u without the group's token", m->rank);
    if (m->rank >= d->C) return ctl_drop(d, p->fd, "control port: a hello for rank %u of %u", m->rank, d->C);
    if (d->fd[m->rank] >= 0) return ctl_drop(d, p->fd, "control port: rank %u said hello twice", m->rank);
    int fl = fcntl(p->fd, F_GETFL);
    int one = 1; /* replies are small and awaited: never hold them back */
    if (fl < 0 || fcntl(p->fd, F_SETFL, fl & ~O_NONBLOCK) != 0 ||
        setsockopt(p->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0)
        return ctl_drop(d, p->fd, "control port: rank %u: cannot set up its socket", m->rank);
    d->fd[m->rank] = p->fd;
    (*joined)++;
}

/* Publishes the ports at publish_at; then every rank says hello on its
 * control connection, within 20 s of the start. Connections
 * are read without blocking, each with HELLO_TIMEOUT_MS to say hello, so a
 * peer that connects and stays silent (or sends garbage, or claims a rank
 * without the token) is dropped and counted while the real ranks join. */
static int accept_ranks(decode_t *d, int lfd, uint16_t dport, uint16_t cport, uint64_t publish_at) {
    pending_t pend[MAX_PENDING];
    uint32_t np = 0, joined = 0;
    uint64_t t0 = now_ns();
    bool published = false;
    while (joined < d->C) {
        if (!published && now_ns() >= publish_at) { /* the ranks may connect from here on */
            atomic_store(&d->ctl->data_port, dport);
            atomic_store(&d->ctl->ctl_port, cport);
            published = true;
        }
        struct pollfd pf[MAX_PENDING + 1];
        pf[0] = (struct pollfd){lfd, POLLIN, 0};
        for (uint32_t i = 0; i < np; i++) pf[i + 1] = (struct pollfd){pend[i].fd, POLLIN, 0};
        int n = poll(pf, np + 1, 50);
        uint64_t now = now_ns();
        if (atomic_load(&d->ctl->stop) || now - t0 > 20000000000ull) {
            snprintf(d->ctl->decode_err, sizeof(d->ctl->decode_err), "decode: %u of %u ranks connected in 20 s", joined, d->C);
            break;
        }
        for (uint32_t i = np; n > 0 && i-- > 0;) { /* backwards: a finished entry takes the last one's place */
            pending_t *p = &pend[i];
            bool done = false;
            if (pf[i + 1].revents) {
                ssize_t r = recv(p->fd, (uint8_t *)&p->m + p->got, sizeof(msg_t) - p->got, 0);
                if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
                    ctl_drop(d, p->fd, "control port: a peer closed before its hello"), done = true;
                else if (r > 0 && (p->got += (size_t)r) == sizeof(msg_t))
                    on_hello(d, p, &joined), done = true;
            }
            if (!done && now > p->deadline)
                ctl_drop(d, p->fd, "control port: a peer said no hello within %d ms", HELLO_TIMEOUT_MS), done = true;
            if (done) pend[i] = pend[--np];
        }
        for (uint32_t i = np; n <= 0 && i-- > 0;) /* quiet: only the deadlines */
            if (now > pend[i].deadline) {
                ctl_drop(d, pend[i].fd, "control port: a peer said no hello within %d ms", HELLO_TIMEOUT_MS);
                pend[i] = pend[--np];
            }
        if (n > 0 && (pf[0].revents & POLLIN)) {
            int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (fd >= 0 && np == MAX_PENDING) ctl_drop(d, fd, "control port: more than %d peers awaiting their hello", MAX_PENDING);
            else if (fd >= 0) pend[np++] = (pending_t){fd, now + HELLO_TIMEOUT_MS * 1000000ull, 0, {0}};
        }
    }
    for (uint32_t i = 0; i < np; i++) /* the group is complete (or failed): the silent ones go */
        ctl_drop(d, pend[i].fd, "control port: a peer still without a hello when the group was complete");
    return joined == d->C ? 0 : -1;
}

/* Tests only: KVT_PD_TEST_PEERS="stall:N,rank0,garbage,data-garbage,
 * data-geometry,data-huge,data-outside,data-wrap,data-stall:N,hold:MS"
 * makes decode itself open those bad peers against its own ports before
 * any rank can connect (so they are deterministically first in line), and
 * hold its ports back from the ranks for MS ms (so that silent peers time
 * out while the group forms). The data-port ones are waited for until the
 * page server has judged them. */
typedef struct test_peers {
    int fd[256];
    uint32_t n;
    uint64_t hold_ms;
} test_peers_t;

static int test_connect(test_peers_t *a, uint16_t port) {
    char addr[32];
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
    int fd = a->n < 256 ? kvt__tcp_connect(addr) : -1;
    if (fd >= 0) a->fd[a->n++] = fd;
    return fd;
}

static void test_peers(test_peers_t *a, decode_t *d, uint16_t dport, uint16_t cport) {
    const char *spec = getenv("KVT_PD_TEST_PEERS");
    if (spec == NULL) return;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", spec);
    uint64_t hold_ms = 0, judged = 0;
    uint64_t pb = d->o->bytes_per_token * d->o->page_tokens;
    kvt__wire_hello_t good = {KVT_WIRE_MAGIC, KVT_WIRE_VERSION, KVT_LAYOUT_PAGE_FIRST, 1, 0, d->o->decode_pages, pb};
    for (char *save = NULL, *w = strtok_r(buf, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
        uint64_t k = 1;
        char *colon = strchr(w, ':');
        if (colon) *colon = 0, k = strtoull(colon + 1, NULL, 10);
        for (uint64_t i = 0; i < k && strcmp(w, "hold") != 0; i++) {
            bool data = strncmp(w, "data-", 5) == 0;
            int fd = test_connect(a, data ? dport : cport);
            if (fd < 0) continue;
            uint8_t junk[64];
            memset(junk, 0xA5, sizeof(junk));
            kvt__wire_hello_t h = good;
            kvt__wire_data_t run = {0, pb};
            msg_t fake = {MSG_HELLO, 0, 0, d->ctl->token ^ 1, PD_VERSION, (int32_t)PD_MAGIC};
            if (strcmp(w, "rank0") == 0) kvt__write_full(fd, &fake, sizeof(fake));
            else if (strcmp(w, "garbage") == 0) kvt__write_full(fd, junk, sizeof(msg_t));
            else if (strcmp(w, "data-garbage") == 0) kvt__write_full(fd, junk, sizeof(kvt__wire_hello_t)), judged++;
            else if (strcmp(w, "data-geometry") == 0) h.layer_bytes++, kvt__write_full(fd, &h, sizeof(h)), judged++;
            else if (strncmp(w, "data-", 5) == 0 && strcmp(w, "data-stall") != 0) {
                if (strcmp(w, "data-huge") == 0) run.len = 1ull << 40;
                else if (strcmp(w, "data-outside") == 0) run.off = d->o->decode_pages * pb;
                else if (strcmp(w, "data-wrap") == 0) run.off = UINT64_MAX - 7, run.len = 4096;
                kvt__write_full(fd, &h, sizeof(h));
                kvt__write_full(fd, &run, sizeof(run));
                judged++;
            }
        }
        if (strcmp(w, "hold") == 0) hold_ms = k;
    }
    for (uint64_t t0 = now_ns(); now_ns() - t0 < 5000000000ull;) { /* the page server has judged them all */
        kvt_net_server_stats_t ss = {.size = sizeof(ss)};
        kvt_net_server_stats(d->srv, &ss);
        if (ss.refused + ss.bad_peers >= judged) break;
        usleep(1000);
    }
    a->hold_ms = hold_ms;
}

static void test_peers_close(test_peers_t *a) {
    for (uint32_t i = 0; i < a->n; i++) close(a->fd[i]);
    a->n = 0;
}

static int run_decode(decode_t *d) {
    const pd_opts_t *o = d->o;
    uint64_t pb = o->bytes_per_token * o->page_tokens;
    d->layers = 1;
    d->layer_bytes = pb;
    kvt_tier_config_t tc = {.size = sizeof(tc), .kind = KVT_TIER_ARENA, .name = "decode", .geom = {o->decode_pages, 1, pb, KVT_LAYOUT_PAGE_FIRST}};
    kvt_net_server_t *srv = NULL;
    uint16_t cport = 0;
    int lfd = -1;
    d->lat = calloc(d->C * o->window, sizeof(uint64_t));
    size_t maxtok = (size_t)d->t->max_blocks * TRACE_BLOCK_TOKENS;
    d->tok = malloc(maxtok * sizeof(int32_t));
    d->h = malloc((o->max_pages + 1) * sizeof(kvt_hash128_t));
    d->buf = malloc(pb);
    if (!d->lat || !d->tok || !d->h || !d->buf || kvt_tier_create(&d->pool, &tc) != KVT_OK ||
        kvt_extalloc_create(&d->alloc, o->decode_pages) != KVT_OK ||
        kvt_net_server_create(&srv, (kvt_net_transport_t)o->transport, d->pool, "127.0.0.1", 0) != KVT_OK || (lfd = listen_any(&cport)) < 0) {
        snprintf(d->ctl->decode_err, sizeof(d->ctl->decode_err), "decode: set-up failed");
        return 1;
    }
    d->srv = srv;
    for (uint32_t r = 0; r < d->C; r++) d->fd[r] = -1;
    test_peers_t adv = {.n = 0};
    test_peers(&adv, d, kvt_net_server_port(srv), cport); /* tests only: bad peers, queued before any rank */
    int arc = accept_ranks(d, lfd, kvt_net_server_port(srv), cport, now_ns() + adv.hold_ms * 1000000ull);
    close(lfd);
    if (arc != 0) {
        test_peers_close(&adv);
        return 1;
    }
    uint64_t last_progress = now_ns();
    for (uint32_t open = d->C; open > 0;) {
        struct pollfd pf[MAX_RANKS];
        for (uint32_t r = 0; r < d->C; r++) pf[r] = (struct pollfd){d->fd[r], POLLIN, 0};
        int n = poll(pf, d->C, 100);
        if (n <= 0 && atomic_load(&d->ctl->stop)) break; /* what was pending is handled first */
        for (uint32_t r = 0; r < d->C && n > 0; r++) {
            if (d->fd[r] < 0 || !(pf[r].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            msg_t m;
            if (kvt__read_full(d->fd[r], &m, sizeof(m)) != 0 || m.rank != r) {
                on_gone(d, r, false);
                open--;
                continue;
            }
            last_progress = now_ns();
            if (m.type == MSG_REQ) {
                int rc = on_req(d, r, &m);
                if (rc == 1) d->waiting[r] = m;
            } else if (m.type == MSG_DONE) {
                on_done(d, r, &m);
                retry_waiting(d); /* room may have come free */
            } else if (m.type == MSG_HELLO && m.handoff == UINT64_MAX) { /* goodbye: every request done */
                on_gone(d, r, true);
                open--;
            }
        }
        if (now_ns() - last_progress > o->timeout_ms * 1000000ull) { /* nothing moved: the hand-offs in flight fail */
            for (int i = 0; i < MAX_LIVE; i++)
                for (uint32_t r = 0; r < d->C && d->live[i].used && !d->live[i].failed; r++)
                    if (!(d->live[i].done_mask & (1ull << r)))
                        fail_handoff(d, &d->live[i], (int)r, "sent nothing for --timeout-ms (the first such rank)");
            retry_waiting(d);
            last_progress = now_ns();
        }
    }
    note_data_peers(d);
    test_peers_close(&adv);
    kvt_net_server_destroy(srv);
    kvt_extalloc_destroy(d->alloc);
    kvt_tier_destroy(d->pool);
    return 0;
}

/* ---- a prefill rank ------------------------------------------------------------ */

/* A rank's links to the decode of one generation: its control connection,
 * and its transfer engine writing decode's pool through a network tier. */
typedef struct link {
    int cfd;
    uint32_t gen;
    char addr[64];
    kvt_tier_t *remote;
    kvt_xfer_t *x;
} link_t;

static void unlink_decode(link_t *k) {
    if (k->cfd >= 0) close(k->cfd);
    k->cfd = -1;
    kvt_xfer_destroy(k->x); /* waits for nothing: the batches in flight have failed or landed */
    kvt_tier_destroy(k->remote);
    k->x = NULL;
    k->remote = NULL;
}

/* Connects to the decode of generation > after (0 for the first): waits for
 * it to publish its ports. 0, or -1 when the group stops or 20 s pass. */
static int link_decode(link_t *k, uint32_t r, const pd_opts_t *o, ctl_t *ctl, kvt_tier_t *lane, uint32_t after) {
    uint64_t t0 = now_ns(), pb = o->bytes_per_token * o->page_tokens;
    while (atomic_load(&ctl->ctl_port) == 0 || atomic_load(&ctl->gen) < after) {
        if (atomic_load(&ctl->stop) || atomic_load(&ctl->decode_lost) || now_ns() - t0 > 20000000000ull) return -1;
        usleep(1000);
    }
    k->gen = atomic_load(&ctl->gen);
    snprintf(k->addr, sizeof(k->addr), "127.0.0.1:%u", atomic_load(&ctl->data_port));
    char cport[64];
    snprintf(cport, sizeof(cport), "127.0.0.1:%u", atomic_load(&ctl->ctl_port));
    kvt_tier_config_t rc_ = {.size = sizeof(rc_), .kind = o->transport == KVT_NET_UCX ? KVT_TIER_UCX : KVT_TIER_TCP,
                             .name = k->addr, .streams = (uint32_t)o->streams,
                             .geom = {o->decode_pages, 1, pb, KVT_LAYOUT_PAGE_FIRST}};
    kvt_xfer_config_t xc;
    kvt_xfer_config_default(&xc);
    xc.max_batch_bytes = 16ull << 20;
    msg_t hello = {MSG_HELLO, r, 0, ctl->token, PD_VERSION, (int32_t)PD_MAGIC};
    kvt_tier_t *tiers[2] = {lane, NULL};
    k->cfd = kvt__tcp_connect(cport);
    if (k->cfd < 0 || kvt__write_full(k->cfd, &hello, sizeof(hello)) != 0 || kvt_tier_create(&k->remote, &rc_) != KVT_OK) {
        unlink_decode(k);
        return -1;
    }
    tiers[1] = k->remote;
    if (kvt_xfer_create(&k->x, &xc, tiers, 2) != KVT_OK) {
        unlink_decode(k);
        return -1;
    }
    return 0;
}

static int run_prefill(uint32_t r, const pd_opts_t *o, const trace_t *t, ctl_t *ctl, uint64_t nreq) {
    rank_out_t *out = &ctl->rank[r];
    uint64_t pb = o->bytes_per_token * o->page_tokens, lane = o->max_pages / o->ranks + 1;
    kvt_tier_t *lt = NULL;
    kvt_tier_config_t tc = {.size = sizeof(tc), .kind = KVT_TIER_ARENA, .name = "lane", .geom = {lane, 1, pb, KVT_LAYOUT_PAGE_FIRST}};
    link_t k = {.cfd = -1};
    size_t maxtok = (size_t)t->max_blocks * TRACE_BLOCK_TOKENS;
    int32_t *tok = malloc(maxtok * sizeof(int32_t));
    kvt_hash128_t *h = malloc((o->max_pages + 1) * sizeof(kvt_hash128_t));
    uint32_t *dst = malloc((o->max_pages + 1) * sizeof(uint32_t));
    kvt_xfer_copy_t *cp = malloc((lane + 1) * sizeof(kvt_xfer_copy_t));
    if (!tok || !h || !dst || !cp || kvt_tier_create(&lt, &tc) != KVT_OK || link_decode(&k, r, o, ctl, lt, 0) != 0) {
        snprintf(out->err, sizeof(out->err), "rank %u: set-up failed", r);
        return 1;
    }
    const char *kill = getenv("KVT_PD_KILL"); /* tests: "R:N" kills rank R in hand-off N */
    unsigned kill_rank = UINT32_MAX;
    unsigned long long kill_at = 0;
    if (kill) sscanf(kill, "%u:%llu", &kill_rank, &kill_at);
    int code = 0;
    uint64_t skip_to = 0;
    for (uint64_t i = 0; i < nreq && code == 0; i++) {
        if (atomic_load(&ctl->stop)) return 1;
        atomic_store(&out->pos, i);
        uint64_t n = handoff_pages(t, i, o);
        if (n < o->ranks) continue; /* too short to spread: not handed off */
        if (i < skip_to) { /* lost with the decode that died: some rank's share of it went there */
            out->failed++;
            continue;
        }
        page_hashes(t, i, o, tok, h, n);
        uint64_t np = 0; /* our pages of this hand-off, pinned in our lane until delivered */
        for (uint64_t j = r; j < n; j += o->ranks, np++) /* the forward pass: our pages into our lane */
            kvt_pattern_fill(kvt_tier_addr(lt, np, 0), pb, h[j].lo, h[j].hi, 0);
        msg_t req = {MSG_REQ, r, i, n, 0, 0}, rep = {0};
        int st = kvt__write_full(k.cfd, &req, sizeof(req)) == 0 && kvt__read_full(k.cfd, &rep, sizeof(rep)) == 0 ? KVT_OK : KVT_EIO;
        if (st == KVT_OK && rep.status != KVT_OK) { /* decode will not complete it */
            out->failed++;
            continue;
        }
        if (st == KVT_OK && kvt__read_full(k.cfd, dst, n * sizeof(uint32_t)) != 0) st = KVT_EIO;
        if (st == KVT_OK) {
            for (uint64_t j = r, q = 0; j < n; j += o->ranks, q++) cp[q] = (kvt_xfer_copy_t){(uint32_t)q, dst[j]};
            if (r == o->delay_rank && o->delay_ms) usleep((useconds_t)(o->delay_ms * 1000));
            if (r == kill_rank && i + 1 == kill_at) raise(SIGKILL);
            kvt_xfer_done_t dn;
            st = kvt_xfer_submit(k.x, 0, 1, cp, np, i, NULL);
            if (st == KVT_OK) {
                while (kvt_xfer_poll(k.x, &dn, 1, 1000000000ull) == 0)
                    if (atomic_load(&ctl->stop)) return 1;
                st = dn.status;
            }
            msg_t done = {MSG_DONE, r, i, np, st, 0};
            if (kvt__write_full(k.cfd, &done, sizeof(done)) != 0) st = KVT_EIO;
        }
        if (st == KVT_OK) {
            out->handoffs++;
            continue;
        }
        /* decode is gone (or its link broke): the hand-off fails and its pinned
         * pages are released; with a restarted decode, go on with the next */
        out->failed++;
        out->released += np;
        fprintf(stderr, "kvtier pd: rank %u: hand-off %" PRIu64 " lost with decode; %" PRIu64 " pinned pages released\n", r,
                i + 1, np);
        collect(out, k.x);
        unlink_decode(&k);
        if (link_decode(&k, r, o, ctl, lt, k.gen + 1) != 0) {
            snprintf(out->err, sizeof(out->err), "rank %u: decode went away at hand-off %" PRIu64 "%s; its pages released",
                     r, i + 1, atomic_load(&ctl->decode_lost) ? " and is not restarted" : " and no new one came in 20 s");
            code = 1;
        }
        skip_to = ctl->resume_from;
    }
    msg_t bye = {MSG_HELLO, r, UINT64_MAX, 0, 0, 0};
    if (code == 0) kvt__write_full(k.cfd, &bye, sizeof(bye));
    if (k.x) collect(out, k.x);
    out->gbps = out->busy_ns ? (double)out->bytes / (double)out->busy_ns : 0;
    out->p50 = kvt_hist_percentile(&out->e2e, 0.5);
    out->p90 = kvt_hist_percentile(&out->e2e, 0.9);
    out->p99 = kvt_hist_percentile(&out->e2e, 0.99);
    out->p999 = kvt_hist_percentile(&out->e2e, 0.999);
    out->max = kvt_hist_percentile(&out->e2e, 1);
    unlink_decode(&k);
    kvt_tier_destroy(lt);
    return code;
}

/* ---- the coordinator ------------------------------------------------------------- */

typedef struct pd_run {
    const pd_opts_t *o;
    const trace_t *t;
    ctl_t *ctl;
    uint64_t nreq, restarts_left;
} pd_run_t;

static pd_run_t g_pd;

/* Process p: decode (0) or prefill rank p - 1. */
static pid_t spawn(uint32_t p) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    group_child_signals();
    int code;
    ctl_t *ctl = g_pd.ctl;
    if (p == 0) {
        static decode_t d;
        d = (decode_t){.o = g_pd.o, .t = g_pd.t, .ctl = ctl, .C = (uint32_t)g_pd.o->ranks};
        code = run_decode(&d);
        if (code && ctl->decode_err[0]) fprintf(stderr, "kvtier pd: %s\n", ctl->decode_err);
    } else {
        code = run_prefill(p - 1, g_pd.o, g_pd.t, ctl, g_pd.nreq);
        if (code && ctl->rank[p - 1].err[0]) fprintf(stderr, "kvtier pd: %s\n", ctl->rank[p - 1].err);
    }
    _exit(code);
}

/* group_watch's hook: a decode that died is restarted (--decode-restarts);
 * the ranks reconnect to the new generation. */
static bool restart_decode(void *arg, uint32_t idx, int status) {
    child_t *ch = arg;
    if (idx != 0) return false;
    bool can = g_pd.restarts_left > 0 && !atomic_load(&g_pd.ctl->stop);
    for (uint32_t r = 1; r <= g_pd.o->ranks; r++)
        if (ch[r].exited) can = false; /* a new decode could never hear from every rank */
    if (!can) { /* the ranks stop waiting for one, and say so themselves */
        atomic_store(&g_pd.ctl->decode_lost, 1);
        return false;
    }
    g_pd.restarts_left--;
    uint64_t resume = 0; /* every hand-off up to the furthest rank's had a share at the dead decode */
    for (uint32_t r = 0; r < g_pd.o->ranks; r++) {
        uint64_t p = atomic_load(&g_pd.ctl->rank[r].pos) + 1;
        resume = p > resume ? p : resume;
    }
    g_pd.ctl->resume_from = resume;
    fprintf(stderr, "kvtier pd: decode died (%s %d); restarting it\n", WIFSIGNALED(status) ? "signal" : "exit",
            WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    atomic_store(&g_pd.ctl->ctl_port, 0);
    atomic_store(&g_pd.ctl->data_port, 0);
    atomic_fetch_add(&g_pd.ctl->gen, 1);
    pid_t pid = spawn(0);
    if (pid < 0) return false;
    ch[0] = (child_t){pid, 0, false};
    return true;
}

/* Hand-offs some rank started: every one up to the furthest rank's position
 * (set in the coordinator when the group has ended). The others were never
 * attempted, which is not the same as failed. */
static uint64_t g_attempted;

static void count_attempted(const ctl_t *c, const trace_t *t, const pd_opts_t *o, uint64_t nreq) {
    uint64_t furthest = 0;
    bool any = false;
    for (uint32_t r = 0; r < o->ranks; r++) {
        uint64_t p = atomic_load(&((ctl_t *)c)->rank[r].pos);
        if (p > furthest) furthest = p;
        any |= p > 0 || c->rank[r].handoffs || c->rank[r].failed;
    }
    g_attempted = 0;
    for (uint64_t i = 0; any && i < nreq && i <= furthest; i++) g_attempted += handoff_pages(t, i, o) >= o->ranks;
    if (g_attempted < c->handoffs) g_attempted = c->handoffs;
}

/* Hand-offs that were attempted and did not complete, for whatever reason. */
static uint64_t failed_total(const ctl_t *c) { return g_attempted > c->handoffs ? g_attempted - c->handoffs : 0; }
static uint64_t not_attempted(const ctl_t *c) { return c->total > g_attempted ? c->total - g_attempted : 0; }

/* Bad peers decode turned away, on stderr (nothing when there were none). */
static void report_bad_peers(const ctl_t *c) {
    if (c->data_refused + c->data_bad + c->data_silent + c->ctl_bad == 0) return;
    fprintf(stderr,
            "kvtier pd: decode turned peers away: data port %" PRIu64 " hellos refused, %" PRIu64 " malformed or silent, %" PRIu64
            " still silent at the end%s%s%s; control port %" PRIu64 " dropped%s%s%s\n",
            c->data_refused, c->data_bad, c->data_silent, c->data_last_error[0] ? " (last: " : "", c->data_last_error,
            c->data_last_error[0] ? ")" : "", c->ctl_bad, c->ctl_last_error[0] ? " (last: " : "", c->ctl_last_error,
            c->ctl_last_error[0] ? ")" : "");
}

static void print_pd(const ctl_t *c, const pd_opts_t *o, double wall) {
    uint32_t C = (uint32_t)o->ranks;
    int strag = -1;
    for (uint32_t r = 0; r < C; r++)
        if (c->straggler_flags[r] && (strag < 0 || c->straggler_flags[r] > c->straggler_flags[strag])) strag = (int)r;
    double gbps = wall > 0 ? (double)c->bytes / wall / 1e9 : 0;
    if (o->json) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "ranks", C);
        cJSON_AddStringToObject(x, "transport", TRANSPORTS[o->transport]);
        cJSON_AddNumberToObject(x, "requests", (double)c->handoffs);
        cJSON_AddNumberToObject(x, "bytes", (double)c->bytes);
        cJSON_AddNumberToObject(x, "gbps", gbps);
        cJSON *h = cJSON_AddObjectToObject(x, "handoff_ms");
        cJSON_AddNumberToObject(h, "p50", (double)kvt_hist_percentile(&c->handoff_ns, 0.5) / 1e6);
        cJSON_AddNumberToObject(h, "p99", (double)kvt_hist_percentile(&c->handoff_ns, 0.99) / 1e6);
        cJSON_AddNumberToObject(h, "max", (double)kvt_hist_percentile(&c->handoff_ns, 1) / 1e6);
        cJSON *per = cJSON_AddArrayToObject(x, "per_rank");
        for (uint32_t r = 0; r < C; r++) {
            const rank_out_t *q = &c->rank[r];
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "rank", r);
            cJSON_AddNumberToObject(e, "gbps", q->gbps);
            cJSON_AddNumberToObject(e, "p99_ms", (double)q->p99 / 1e6);
            cJSON_AddNumberToObject(e, "p50_ms", (double)q->p50 / 1e6);
            cJSON_AddNumberToObject(e, "max_ms", (double)q->max / 1e6);
            cJSON_AddNumberToObject(e, "bytes", (double)q->bytes);
            cJSON_AddNumberToObject(e, "runs", (double)q->runs);
            cJSON_AddNumberToObject(e, "pages", (double)q->pages);
            cJSON_AddNumberToObject(e, "batches", (double)q->batches);
            cJSON_AddNumberToObject(e, "landed_last", (double)c->last_lander[r]);
            cJSON_AddNumberToObject(e, "straggler_flags", (double)c->straggler_flags[r]);
            cJSON_AddItemToArray(per, e);
        }
        if (strag >= 0) {
            cJSON *s = cJSON_AddObjectToObject(x, "straggler");
            cJSON_AddNumberToObject(s, "rank", strag);
            cJSON_AddNumberToObject(s, "factor", c->straggler_factor[strag]);
        } else {
            cJSON_AddNullToObject(x, "straggler");
        }
        cJSON_AddNumberToObject(x, "mismatches", (double)c->mismatches);
        cJSON_AddNumberToObject(x, "failed", (double)(failed_total(c)));
        cJSON_AddNumberToObject(x, "not_attempted", (double)not_attempted(c));
        cJSON *bp = cJSON_AddObjectToObject(x, "bad_peers");
        cJSON_AddNumberToObject(bp, "data_refused", (double)c->data_refused);
        cJSON_AddNumberToObject(bp, "data_malformed", (double)c->data_bad);
        cJSON_AddNumberToObject(bp, "data_silent", (double)c->data_silent);
        cJSON_AddNumberToObject(bp, "control_dropped", (double)c->ctl_bad);
        cJSON_AddStringToObject(bp, "data_last_error", c->data_last_error);
        cJSON_AddStringToObject(bp, "control_last_error", c->ctl_last_error);
        cJSON_AddNumberToObject(x, "decode_restarts", (double)atomic_load(&((ctl_t *)c)->gen));
        uint64_t released = 0;
        for (uint32_t r = 0; r < C; r++) released += c->rank[r].released;
        cJSON_AddNumberToObject(x, "released_pages", (double)released);
        cJSON_AddNumberToObject(x, "wall_s", wall);
        cli_print_json(x);
        return;
    }
    printf("kvtier pd: %u prefill ranks -> decode over %s: %" PRIu64 " hand-offs, %.1f MB, %.2f GB/s; "
           "hand-off p50 %.2f ms p99 %.2f ms max %.2f ms; %" PRIu64 " mismatches, %" PRIu64 " failed, %" PRIu64
           " not attempted\n",
           C, TRANSPORTS[o->transport], c->handoffs, (double)c->bytes / 1e6, gbps,
           (double)kvt_hist_percentile(&c->handoff_ns, 0.5) / 1e6, (double)kvt_hist_percentile(&c->handoff_ns, 0.99) / 1e6,
           (double)kvt_hist_percentile(&c->handoff_ns, 1) / 1e6, c->mismatches, failed_total(c), not_attempted(c));
    if (atomic_load(&((ctl_t *)c)->gen)) {
        uint64_t released = 0;
        for (uint32_t r = 0; r < C; r++) released += c->rank[r].released;
        printf("decode restarted %u time(s); the ranks released %" PRIu64 " pinned pages of the hand-offs lost with it\n",
               atomic_load(&((ctl_t *)c)->gen), released);
    }
    printf("%6s %10s %8s %10s %9s %9s %9s %9s %9s %8s %8s\n", "rank", "MB", "runs", "pages", "GB/s", "p50 ms", "p90 ms",
           "p99 ms", "max ms", "last", "flagged");
    for (uint32_t r = 0; r < C; r++) {
        const rank_out_t *q = &c->rank[r];
        printf("%6u %10.1f %8" PRIu64 " %10" PRIu64 " %9.2f %9.3f %9.3f %9.3f %9.3f %8" PRIu64 " %8" PRIu64 "\n", r,
               (double)q->bytes / 1e6, q->runs, q->pages, q->gbps, (double)q->p50 / 1e6, (double)q->p90 / 1e6,
               (double)q->p99 / 1e6, (double)q->max / 1e6, c->last_lander[r], c->straggler_flags[r]);
    }
    if (strag >= 0) printf("straggler: rank %d (%.1fx the group's median)\n", strag, c->straggler_factor[strag]);
    else printf("straggler: none\n");
}

/* --stats: every rank's transfer figures and decode's, through the emitter. */
static void emit_pd(const ctl_t *c, const pd_opts_t *o) {
    kvt_emitter_t *e;
    if (kvt_emitter_create(&e, (kvt_fmt_t)(o->stats - 1), "kvtier_pd") != KVT_OK) return;
    for (uint32_t r = 0; r < o->ranks; r++) {
        const rank_out_t *q = &c->rank[r];
        char name[32];
        snprintf(name, sizeof(name), "rank%u", r);
        kvt_emit_begin(e, name);
        kvt_emit_counter(e, "bytes", q->bytes, "bytes sent to decode");
        kvt_emit_counter(e, "runs", q->runs, "runs the pages coalesced into");
        kvt_emit_counter(e, "pages", q->pages, "pages sent");
        kvt_emit_counter(e, "batches", q->batches, "batches (one per hand-off)");
        kvt_emit_counter(e, "handoffs", q->handoffs, "hand-offs this rank delivered");
        kvt_emit_counter(e, "failed", q->failed, "hand-offs this rank could not deliver");
        kvt_emit_counter(e, "released_pages", q->released, "pinned pages released after a lost hand-off");
        kvt_emit_counter(e, "landed_last", c->last_lander[r], "hand-offs whose last pages were this rank's");
        kvt_emit_counter(e, "straggler_flags", c->straggler_flags[r], "hand-offs after which it was the straggler");
        kvt_emit_gauge(e, "gbps", q->gbps, "GB/s while sending");
        kvt_emit_hist(e, "batch_ns", &q->e2e, "submit to acknowledged, per batch");
        kvt_emit_end(e);
    }
    kvt_emit_begin(e, "decode");
    kvt_emit_counter(e, "handoffs", c->handoffs, "hand-offs completed");
    kvt_emit_counter(e, "failed", failed_total(c), "hand-offs that did not complete");
    kvt_emit_counter(e, "mismatches", c->mismatches, "pages that differed from their content");
    kvt_emit_counter(e, "bytes", c->bytes, "bytes of completed hand-offs");
    kvt_emit_counter(e, "not_attempted", not_attempted(c), "hand-offs no rank started");
    kvt_emit_counter(e, "data_refused_hellos", c->data_refused, "data port: hellos refused (wrong geometry)");
    kvt_emit_counter(e, "data_bad_peers", c->data_bad, "data port: peers closed for malformed data or no hello");
    kvt_emit_gauge(e, "data_silent_peers", (double)c->data_silent, "data port: connections without a hello at the end");
    kvt_emit_counter(e, "control_bad_peers", c->ctl_bad, "control port: peers dropped (no hello in time, no token, garbage)");
    kvt_emit_hist(e, "handoff_ns", &c->handoff_ns, "first REQ to last DONE");
    kvt_emit_end(e);
    if (kvt_emitter_write(e, stderr) != KVT_OK) fprintf(stderr, "kvtier pd: --stats: could not write\n");
    kvt_emitter_destroy(e);
}

static const char USAGE[] =
    "usage: kvtier pd --ranks C [--transport tcp] [TRACE.jsonl] [options]\n"
    "\n"
    "Prefill/decode hand-off: a CP group of C prefill processes sends each request's\n"
    "pages (each rank the pages it owns) to a decode process over the network; decode\n"
    "checks every page and names the rank that lands last and the straggler.\n";

int cmd_pd(int argc, char **argv) {
    pd_opts_t o = {.ranks = 4, .requests = 200, .seed = 42, .page_tokens = 64, .bytes_per_token = 256, .decode_pages = 4096,
                   .streams = 4, .max_pages = 256, .window = 16, .timeout_ms = 10000, .straggler_factor = 3.0,
                   .delay_rank = UINT32_MAX};
    const cli_opt_t table[] = {
        {"ranks", OPT_U64, &o.ranks, 1, MAX_RANKS, 0, 0, NULL, NULL, 0, "prefill rank processes (CP size)"},
        {"transport", OPT_CHOICE, &o.transport, 0, 0, 0, 0, TRANSPORTS, NULL, 0, "how pages travel to decode"},
        {"requests", OPT_U64, &o.requests, 1, 10000000, 0, 0, NULL, NULL, 0, "hand-offs: the first N requests"},
        {"seed", OPT_U64, &o.seed, 0, UINT64_MAX, 0, 0, NULL, NULL, 0, "synthetic workload: seed"},
        {"page-tokens", OPT_U64, &o.page_tokens, 1, 512, 0, 0, NULL, NULL, 0, "tokens per page"},
        {"bytes-per-token", OPT_U64, &o.bytes_per_token, 1, 1u << 20, 0, 0, NULL, NULL, 0, "bytes of KV per token"},
        {"max-pages", OPT_U64, &o.max_pages, 1, 1u << 20, 0, 0, NULL, NULL, 0, "pages handed off per request at most"},
        {"decode-pages", OPT_U64, &o.decode_pages, 1, KVT_ALLOC_MAX_PAGES, 0, 0, NULL, NULL, 0, "decode's receive pool, pages"},
        {"streams", OPT_U64, &o.streams, 1, 64, 0, 0, NULL, NULL, 0, "connections per prefill rank"},
        {"window", OPT_U64, &o.window, 2, 1024, 0, 0, NULL, NULL, 0, "hand-offs over which the straggler is judged"},
        {"straggler-factor", OPT_DOUBLE, &o.straggler_factor, 0, 0, 1, 1000, NULL, NULL, 0, "a rank this many times the group's median latency is the straggler"},
        {"delay-rank", OPT_TEXT, &o.delay, 0, 0, 0, 0, NULL, NULL, 0, "R:MS: rank R waits MS ms before sending each hand-off"},
        {"timeout-ms", OPT_U64, &o.timeout_ms, 10, 3600000, 0, 0, NULL, NULL, 0, "a hand-off without progress this long fails"},
        {"decode-restarts", OPT_U64, &o.decode_restarts, 0, 100, 0, 0, NULL, NULL, 0, "restart a decode that dies, this many times"},
        {"json", OPT_FLAG, &o.json, 0, 0, 0, 0, NULL, NULL, 0, "print one JSON object"},
        {"stats", OPT_CHOICE, &o.stats, 0, 0, 0, 0, STATS_FORMATS, NULL, 0, "also write per-rank and decode statistics to stderr"},
        {NULL, 0, NULL, 0, 0, 0, 0, NULL, NULL, 0, NULL},
    };
    cli_t c;
    cli_init(&c, "kvtier pd", argc, argv);
    const char *path;
    int prc = cli_parse_table(&c, table, USAGE, &path);
    if (prc) return prc > 0 ? 0 : 2;
    if (o.transport == KVT_NET_UCX && !kvt_net_ucx_built()) {
        c.flag = "--transport";
        return cli_error(&c, "ucx: this build has no UCX (install libucx-dev and rebuild)") ? 2 : 2;
    }
    if (o.delay) {
        uint64_t rank, ms;
        c.flag = "--delay-rank";
        if (cli_parse_pair(o.delay, &rank, &ms) || rank >= o.ranks || ms > MAX_DELAY_MS)
            return cli_error(&c, "expected R:MS with R < --ranks (%" PRIu64 ") and MS <= %u, got '%s'", o.ranks,
                             MAX_DELAY_MS, o.delay) ? 2 : 2;
        o.delay_rank = (unsigned)rank;
        o.delay_ms = ms;
    }
    if (o.max_pages > o.decode_pages) {
        c.flag = "--decode-pages";
        return cli_error(&c, "must hold one hand-off (--max-pages %" PRIu64 ")", o.max_pages) ? 2 : 2;
    }
    /* decode's pool and every rank's lane, before anything is started */
    double pb = (double)o.bytes_per_token * (double)o.page_tokens, mem = cli_machine_memory();
    double need = pb * ((double)o.decode_pages + (double)o.ranks * (double)(o.max_pages / o.ranks + 1));
    if (need > 0.6 * mem) {
        c.flag = "--decode-pages";
        return cli_error(&c,
                         "%.1f GiB of pages (decode's %" PRIu64 " + %" PRIu64 " ranks' lanes of %" PRIu64
                         " pages of %.1f KiB) is more than 60%% of this machine's %.1f GiB; use fewer --decode-pages or "
                         "--max-pages, or a smaller --bytes-per-token or --page-tokens",
                         need / 1073741824.0, o.decode_pages, o.ranks, o.max_pages / o.ranks + 1, pb / 1024,
                         mem / 1073741824.0) ? 2 : 2;
    }
    opts_t ro;
    replay_opts_default(&ro);
    ro.requests = o.requests;
    ro.seed = o.seed;
    trace_t t;
    double parse_s;
    if (replay_load("kvtier pd", path, &ro, &t, &parse_s) != 0) return 1;
    uint64_t nreq = o.requests < t.n ? o.requests : t.n;
    ctl_t *ctl = mmap(NULL, sizeof(ctl_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (ctl == MAP_FAILED) {
        trace_free(&t);
        return 1;
    }
    if (getrandom(&ctl->token, sizeof(ctl->token), 0) != sizeof(ctl->token))
        ctl->token = now_ns() ^ ((uint64_t)getpid() << 32); /* no entropy: still not guessable by rank number */
    kvt_hist_init(&ctl->handoff_ns);
    for (uint32_t r = 0; r < MAX_RANKS; r++) kvt_hist_init(&ctl->rank[r].e2e);
    for (uint64_t i = 0; i < nreq; i++) ctl->total += handoff_pages(&t, i, &o) >= o.ranks;
    fflush(stdout);
    fflush(stderr);
    group_catch_signals();
    static child_t ch[MAX_RANKS + 1];
    memset(ch, 0, sizeof(ch));
    uint32_t nproc = (uint32_t)o.ranks + 1, started = 0; /* [0]: decode, [1 + r]: rank r */
    uint64_t t0 = now_ns();
    g_pd = (pd_run_t){&o, &t, ctl, nreq, o.decode_restarts};
    for (uint32_t p = 0; p < nproc; p++, started++) {
        pid_t pid = spawn(p);
        if (pid < 0) {
            atomic_store(&ctl->stop, 1);
            break;
        }
        ch[p].pid = pid;
    }
    int why = 0;
    /* a prefill rank's death fails the hand-offs that need it; decode goes on
     * serving the others, and the survivors finish (or are stopped in 5 s) */
    int dead = group_watch(ch, started, &ctl->stop, &why, 5000000000ull, restart_decode, ch);
    double wall = (double)(now_ns() - t0) / 1e9;
    count_attempted(ctl, &t, &o, nreq);
    report_bad_peers(ctl);
    int code = 0;
    if (started < nproc) {
        fprintf(stderr, "kvtier pd: could not start every process\n");
        code = 1;
    } else if (dead == -2) {
        fprintf(stderr, "kvtier pd: stopped by signal %d\n", why);
        code = 128 + why;
    } else if (dead >= 0) {
        const char *who = dead == 0 ? "decode" : "prefill rank";
        char name[32];
        snprintf(name, sizeof(name), dead == 0 ? "%s" : "%s %d", who, dead - 1);
        if (WIFSIGNALED(why)) fprintf(stderr, "kvtier pd: %s died (signal %d, %s)", name, WTERMSIG(why), strsignal(WTERMSIG(why)));
        else fprintf(stderr, "kvtier pd: %s failed (exit %d)", name, WEXITSTATUS(why));
        fprintf(stderr, "; %" PRIu64 " hand-offs completed, %" PRIu64 " failed, %" PRIu64 " not attempted", ctl->handoffs,
                failed_total(ctl), not_attempted(ctl));
        if (ctl->vanished_rank_plus1)
            fprintf(stderr, " (decode: rank %" PRIu64 " vanished, first failed hand-off %" PRIu64 ")",
                    ctl->vanished_rank_plus1 - 1, ctl->first_failed);
        fputc('\n', stderr);
        code = 1;
    } else {
        print_pd(ctl, &o, wall);
        if (o.stats > 0) emit_pd(ctl, &o);
        code = ctl->mismatches == 0 && failed_total(ctl) + not_attempted(ctl) == 0 ? 0 : 1;
        if (code) /* the last word says why the run failed */
            fprintf(stderr,
                    "kvtier pd: failed: %" PRIu64 " of %" PRIu64 " hand-offs did not complete (%" PRIu64 " failed, %" PRIu64
                    " not attempted%s), %" PRIu64 " pages mismatched\n",
                    failed_total(ctl) + not_attempted(ctl), ctl->total, failed_total(ctl), not_attempted(ctl),
                    atomic_load(&ctl->gen) ? "; lost with a decode that died" : "", ctl->mismatches);
    }
    munmap(ctl, sizeof(ctl_t));
    trace_free(&t);
    return code;
}
