/* The PD sender (include/kvtier/pd.h): one prefill rank's side.
 *
 *   link (one per decode generation)
 *     control socket --HELLO--> receiver, <--WELCOME (geometry, generation,
 *                                                      resume_from)
 *     remote tier (tcp/ucx, the pool's geometry) <- transfer engine <- src
 *
 *   begin(h, n):   REQ{h, n}  --> <-- DST{h, status, n pages}
 *   send(h, cps):  engine batch src -> pool, waited for; DONE{h, status} -->
 *   finish:        BYE -->
 *
 * The link breaks when a control read or write fails (decode gone); the
 * statistics of each dead link's engine are kept, so a rank's figures span
 * every generation. Calls block; one thread at a time. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../core/abi-int.h"
#include "kvtier/error.h"
#include "../core/mem-int.h"
#include "../sock/wire.h"
#include "pd-int.h"

struct kvt_pd_sender {
    kvt_pd_sender_config_t cfg;
    char host[64];
    int cfd;
    bool linked;
    uint32_t gen;
    uint64_t resume_from;
    kvt_tier_t *remote;
    kvt_xfer_t *x;
    kvt_pd_rank_stats_t st; /* the handoffs/failed counters, and every dead link's engine figures */
    /* The hand-off begun last and not yet sent, and its pages (sorted): a send
     * names it and only those pages, so it never writes pages decode gave
     * another hand-off (which may be the caller's already). */
    bool begun;
    uint64_t begun_h;
    uint32_t *begun_dst;
    size_t begun_n, begun_cap;
};

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* The engine's lane -> pool figures into st. */
static void add_engine(kvt_pd_rank_stats_t *st, kvt_xfer_t *x) {
    kvt_xfer_stats_t xs = {.size = sizeof(xs)};
    if (x == NULL || kvt_xfer_stats(x, 0, 1, &xs) != KVT_OK) return;
    st->bytes += xs.bytes;
    st->runs += xs.runs;
    st->pages += xs.pages;
    st->batches += xs.batches;
    st->busy_ns += xs.busy_ns;
    kvt_hist_merge(&st->batch_ns, &xs.e2e_ns);
}

static void unlink_all(kvt_pd_sender_t *s) {
    if (s->cfd >= 0) close(s->cfd);
    s->cfd = -1;
    s->linked = false;
    s->begun = false; /* its pages were another decode's (or a lost link's) */
    add_engine(&s->st, s->x);
    kvt_xfer_destroy(s->x); /* waits for nothing: the batches in flight have failed or landed */
    kvt_tier_destroy(s->remote);
    s->x = NULL;
    s->remote = NULL;
}

/* How long a control message to decode may take to leave: the welcome's
 * timeout (a receiver that stops reading is gone by then). */
static kvt__pd_by_t bound(const kvt_pd_sender_t *s) {
    return (kvt__pd_by_t){kvt_now_ns() + s->cfg.welcome_timeout_ms * 1000000ull, NULL};
}

/* The receiver's WELCOME within the timeout: ETIMEDOUT when nothing came,
 * EIO when it was dropped or left it half sent. */
static int await_welcome(kvt_pd_sender_t *s, kvt__pd_welcome_t *w) {
    kvt__pd_by_t by = bound(s);
    struct pollfd pf = {s->cfd, POLLIN, 0};
    int n = poll(&pf, 1, (int)s->cfg.welcome_timeout_ms);
    if (n == 0) return KVT_ETIMEDOUT;
    unsigned type;
    if (n < 0 || kvt__pd_recv(s->cfd, 1u << KVT_PD_WELCOME, &type, w, by) != 0) return KVT_EIO;
    return KVT_OK;
}

static int link_to(kvt_pd_sender_t *s, uint16_t dport, uint16_t cport, bool newer) {
    char addr[96];
    snprintf(addr, sizeof(addr), "%s:%u", s->host, cport);
    kvt__pd_hello_t h = {s->cfg.rank, s->cfg.ranks, s->cfg.token};
    kvt__pd_welcome_t w;
    s->cfd = kvt__tcp_connect(addr);
    if (s->cfd < 0 || kvt__pd_send(s->cfd, KVT_PD_HELLO, &h, NULL, 0, bound(s)) != 0) return KVT_EIO;
    int rc = await_welcome(s, &w);
    if (rc != KVT_OK) return rc;
    if (newer && w.generation <= s->gen) return KVT_EIO;
    s->gen = w.generation;
    s->resume_from = w.resume_from;
    snprintf(addr, sizeof(addr), "%s:%u", s->host, dport);
    kvt_tier_config_t tc = {.size = sizeof(tc), .kind = s->cfg.transport == KVT_NET_UCX ? KVT_TIER_UCX : KVT_TIER_TCP,
                            .name = addr, .streams = s->cfg.streams,
                            .token = kvt__wire_writer_token(s->cfg.token, s->cfg.rank), /* decode knows them as ours */
                            .geom = {w.pages, w.layers, w.layer_bytes, (kvt_layout_t)w.layout}};
    rc = kvt_tier_create(&s->remote, &tc); /* the tier copies its name */
    if (rc == KVT_EINVAL) return KVT_EIO; /* a welcome whose geometry no pool has: not a kvtier receiver */
    if (rc != KVT_OK) return rc;
    kvt_xfer_config_t xc;
    kvt_xfer_config_default(&xc);
    xc.max_batch_bytes = s->cfg.max_batch_bytes;
    kvt_tier_t *tiers[2] = {s->cfg.src, s->remote};
    rc = kvt_xfer_create(&s->x, &xc, tiers, 2);
    if (rc != KVT_OK) return rc;
    s->linked = true;
    return KVT_OK;
}

static int fill_config(kvt_pd_sender_config_t *c, const kvt_pd_sender_config_t *in) {
    /* the ABI rule (src/core/abi-int.h), and the fields up to streams are required */
    memset(c, 0, sizeof(*c));
    if (in == NULL || in->size < offsetof(kvt_pd_sender_config_t, streams) || kvt__abi_in(c, sizeof(*c), in) != KVT_OK) return KVT_EINVAL;
    if (!c->max_batch_bytes) c->max_batch_bytes = 16ull << 20;
    if (!c->welcome_timeout_ms) c->welcome_timeout_ms = 20000;
    if (c->welcome_timeout_ms > 3600000) c->welcome_timeout_ms = 3600000;
    /* the runs go out of the source's memory through the socket or UCX's host path: not a GPU's */
    if (c->src == NULL || !kvt_tier_host_visible(c->src) || c->ranks == 0 || c->ranks > KVT_PD_MAX_RANKS || c->rank >= c->ranks ||
        (unsigned)c->transport > KVT_NET_UCX || (c->host && strlen(c->host) >= 64))
        return KVT_EINVAL;
    return KVT_OK;
}

int kvt_pd_sender_create(kvt_pd_sender_t **out, const kvt_pd_sender_config_t *cfg) {
    kvt_pd_sender_config_t c;
    if (out == NULL || fill_config(&c, cfg) != KVT_OK) return KVT_EINVAL;
    kvt_pd_sender_t *s = KVT_NEW(kvt_pd_sender_t);
    if (s == NULL) return KVT_ENOMEM;
    s->cfg = c;
    s->cfd = -1;
    snprintf(s->host, sizeof(s->host), "%s", c.host ? c.host : "127.0.0.1");
    s->cfg.host = s->host;
    kvt_hist_init(&s->st.batch_ns);
    int rc = link_to(s, c.data_port, c.control_port, false);
    if (rc != KVT_OK) {
        unlink_all(s);
        KVT_DELETE(s);
        return rc;
    }
    *out = s;
    return KVT_OK;
}

void kvt_pd_sender_destroy(kvt_pd_sender_t *s) {
    if (s == NULL) return;
    unlink_all(s);
    kvt__free(s->begun_dst, s->begun_cap * sizeof(uint32_t));
    KVT_DELETE(s);
}

int kvt_pd_sender_reconnect(kvt_pd_sender_t *s, uint16_t data_port, uint16_t control_port) {
    if (s == NULL) return KVT_EINVAL;
    unlink_all(s);
    int rc = link_to(s, data_port, control_port, true);
    if (rc != KVT_OK) unlink_all(s);
    return rc;
}

/* This rank's share of n pages (pages j = rank mod C). */
static uint64_t share(const kvt_pd_sender_t *s, uint64_t n) { return kvt__pd_share(n, s->cfg.ranks, s->cfg.rank); }

/* A broken link: h is lost, and this rank's pages of it are the caller's again. */
static int broken(kvt_pd_sender_t *s, uint64_t npages) {
    s->linked = false;
    s->begun = false;
    s->st.failed++;
    s->st.released_pages += npages;
    return KVT_EIO;
}

int kvt_pd_sender_begin(kvt_pd_sender_t *s, uint64_t h, uint64_t n, uint32_t *dst) {
    if (s == NULL || n == 0 || dst == NULL || n > UINT32_MAX) return KVT_EINVAL;
    if (!s->linked) return broken(s, share(s, n));
    if (h < s->resume_from) { /* lost with an earlier decode */
        s->st.failed++;
        return KVT_ENOENT;
    }
    bool fits = n <= kvt_tier_geom(s->remote)->pages; /* else decode refuses it: no room taken for it here */
    if (fits && n > s->begun_cap) { /* room to remember the pages, before decode reserves them */
        uint32_t *d = kvt__malloc(n * sizeof(uint32_t));
        if (d == NULL) return KVT_ENOMEM;
        kvt__free(s->begun_dst, s->begun_cap * sizeof(uint32_t));
        s->begun_dst = d;
        s->begun_cap = n;
    }
    s->begun = false;
    kvt__pd_op_t req = {h, n, 0, 0};
    int32_t status;
    if (kvt__pd_send(s->cfd, KVT_PD_REQ, &req, NULL, 0, bound(s)) != 0 || kvt__pd_recv_dst(s->cfd, h, n, dst, &status, s->cfg.welcome_timeout_ms * 1000000ull) != 0)
        return broken(s, share(s, n));
    if (status != KVT_OK) { /* decode will not complete it */
        s->st.failed++;
        return status;
    }
    if (!fits) return broken(s, share(s, n)); /* more pages than its pool holds: decode is not speaking the protocol */
    memcpy(s->begun_dst, dst, n * sizeof(uint32_t));
    qsort(s->begun_dst, n, sizeof(uint32_t), cmp_u32);
    for (uint64_t i = 0; i < n; i++) /* n distinct pages of the pool, or decode is not speaking the protocol */
        if (s->begun_dst[i] >= kvt_tier_geom(s->remote)->pages || (i && s->begun_dst[i] == s->begun_dst[i - 1])) return broken(s, share(s, n));
    size_t own = 0; /* what send takes: this rank's share, page j of h for j mod C == rank */
    for (uint64_t j = s->cfg.rank; j < n; j += s->cfg.ranks) s->begun_dst[own++] = dst[j];
    qsort(s->begun_dst, own, sizeof(uint32_t), cmp_u32);
    s->begun = true, s->begun_h = h, s->begun_n = own;
    return KVT_OK;
}

/* Whether every copy goes to a page of the hand-off h begun last. */
static bool to_begun(const kvt_pd_sender_t *s, uint64_t h, const kvt_xfer_copy_t *copies, size_t n) {
    if (!s->begun || h != s->begun_h) return false;
    for (size_t i = 0; i < n; i++)
        if (bsearch(&copies[i].dst_page, s->begun_dst, s->begun_n, sizeof(uint32_t), cmp_u32) == NULL) return false;
    return true;
}

int kvt_pd_sender_send(kvt_pd_sender_t *s, uint64_t h, const kvt_xfer_copy_t *copies, size_t n) {
    if (s == NULL || copies == NULL || n == 0) return KVT_EINVAL;
    if (!to_begun(s, h, copies, n)) return KVT_EINVAL; /* (begun only while linked: losing the link clears it) */
    int st = kvt_xfer_submit(s->x, 0, 1, copies, n, h, NULL);
    if (st == KVT_EINVAL) return st;
    s->begun = false; /* said DONE below, whatever the outcome */
    if (st == KVT_OK) {
        kvt_xfer_done_t dn;
        while (kvt_xfer_poll(s->x, &dn, 1, 1000000000ull) == 0) {
        }
        st = dn.status;
    }
    kvt__pd_op_t done = {h, n, st, 0};
    if (kvt__pd_send(s->cfd, KVT_PD_DONE, &done, NULL, 0, bound(s)) != 0) return broken(s, n);
    if (st != KVT_OK) {
        s->st.failed++;
        s->st.released_pages += n;
        return st;
    }
    s->st.handoffs++;
    return KVT_OK;
}

int kvt_pd_sender_finish(kvt_pd_sender_t *s) {
    if (s == NULL) return KVT_EINVAL;
    if (!s->linked || kvt__pd_send(s->cfd, KVT_PD_BYE, NULL, NULL, 0, bound(s)) != 0) return KVT_EIO;
    return KVT_OK;
}

bool kvt_pd_sender_linked(const kvt_pd_sender_t *s) { return s && s->linked; }
uint32_t kvt_pd_sender_generation(const kvt_pd_sender_t *s) { return s ? s->gen : 0; }

int kvt_pd_sender_stats(kvt_pd_sender_t *s, kvt_pd_rank_stats_t *st) {
    if (s == NULL || st == NULL) return KVT_EINVAL;
    *st = s->st;
    add_engine(st, s->x);
    st->gbps = st->busy_ns ? (double)st->bytes / (double)st->busy_ns : 0;
    return KVT_OK;
}
