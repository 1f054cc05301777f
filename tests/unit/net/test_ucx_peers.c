/* The UCX page server against peers that do not follow the protocol,
 * spoken with UCP directly (src/sock/ucx-int.h's message ids): a stranger
 * that sends runs without a hello, or after a refused one, writes nothing
 * (eager and rendezvous sizes) and gets no acknowledgement; endpoints that
 * come and go do not use up the server (a rank still connects after 300).
 * Skipped where the build has no UCX. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier/error.h"
#include "kvtier/net.h"
#include "kvtier/testing.h"
#include "kvtier/tier.h"
#include "kvtier/xfer.h"

#ifdef KVT_HAVE_UCX
#include <arpa/inet.h>

#include "core/clock-int.h"
#include "sock/ucx-int.h"
#include "sock/wire.h"

#define PAGES 8
#define LB (1u << 20) /* a page of one layer: a run of it goes by rendezvous */

static ucp_context_h ctx;
static ucp_worker_h wk;
static int acks, replies;
static int32_t verdict;

static ucs_status_t on_ack(void *arg, const void *h, size_t hl, void *d, size_t l, const ucp_am_recv_param_t *p) {
    (void)arg, (void)h, (void)hl, (void)d, (void)l, (void)p;
    acks++;
    return UCS_OK;
}

static ucs_status_t on_reply(void *arg, const void *h, size_t hl, void *d, size_t l, const ucp_am_recv_param_t *p) {
    (void)arg, (void)d, (void)l, (void)p;
    kvt__wire_reply_t r;
    memcpy(&r, h, hl < sizeof(r) ? hl : sizeof(r));
    verdict = r.status;
    replies++;
    return UCS_OK;
}

static void peer_init(void) {
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("UCX_TLS", "tcp,self", 1);
    cr_assert_eq(kvt__ucx_worker(&ctx, &wk, UCS_THREAD_MODE_SINGLE), KVT_OK);
    cr_assert_eq(kvt__ucx_on(wk, KVT_UCX_AM_ACK, on_ack, NULL), KVT_OK);
    cr_assert_eq(kvt__ucx_on(wk, KVT_UCX_AM_REPLY, on_reply, NULL), KVT_OK);
}

static void ignore_error(void *a, ucp_ep_h ep, ucs_status_t st) { (void)a, (void)ep, (void)st; }

static ucp_ep_h peer_connect(uint16_t port) {
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    ucp_ep_params_t p = {.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                                       UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER,
                         .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
                         .sockaddr = {(struct sockaddr *)&sa, sizeof(sa)},
                         .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                         .err_handler = {ignore_error, NULL}};
    ucp_ep_h ep;
    cr_assert_eq(ucp_ep_create(wk, &p, &ep), UCS_OK);
    return ep;
}

/* Sends one active message and progresses until it is out (or failed). */
static ucs_status_t send_am(ucp_ep_h ep, unsigned id, const void *hdr, size_t hl, const void *data, size_t len) {
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_AM_SEND_FLAG_REPLY};
    ucs_status_ptr_t r = ucp_am_send_nbx(ep, id, hdr, hl, data, len, &p);
    if (r == NULL) return UCS_OK;
    if (UCS_PTR_IS_ERR(r)) return UCS_PTR_STATUS(r);
    ucs_status_t st;
    uint64_t t0 = kvt_now_ns();
    while ((st = ucp_request_check_status(r)) == UCS_INPROGRESS && kvt_now_ns() - t0 < 10000000000ull) ucp_worker_progress(wk);
    ucp_request_free(r);
    return st;
}

static void progress_ms(unsigned ms) {
    uint64_t t0 = kvt_now_ns();
    while (kvt_now_ns() - t0 < ms * 1000000ull) ucp_worker_progress(wk);
}

static bool all_zero(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i]) return false;
    return true;
}

Test(ucx_peers, runs_without_an_accepted_hello_write_nothing, .timeout = 60) {
    if (!kvt_net_ucx_built()) cr_skip_test("this build has no UCX");
    peer_init();
    kvt_tier_t *pool;
    kvt_tier_config_t c = {.size = sizeof(c), .kind = KVT_TIER_ARENA, .geom = {PAGES, 1, LB, KVT_LAYOUT_PAGE_FIRST}};
    cr_assert_eq(kvt_tier_create(&pool, &c), KVT_OK);
    memset(kvt_tier_addr(pool, 0, 0), 0, (size_t)PAGES * LB);
    kvt_net_server_t *srv;
    cr_assert_eq(kvt_net_server_create(&srv, KVT_NET_UCX, pool, "127.0.0.1", 0), KVT_OK);
    cr_assert_eq(kvt_net_server_set_token(srv, 0x5eed), KVT_OK);
    uint8_t *run = malloc(LB);
    memset(run, 0xcc, LB);
    /* no hello at all; then a hello with the wrong token (refused), then runs */
    for (int round = 0; round < 2; round++) {
        ucp_ep_h ep = peer_connect(kvt_net_server_port(srv));
        if (round == 1) {
            kvt__wire_hello_t h = {KVT_WIRE_MAGIC, KVT_WIRE_VERSION, KVT_LAYOUT_PAGE_FIRST, 1, 0, PAGES, LB, 0x1234};
            replies = 0;
            cr_assert_eq(send_am(ep, KVT_UCX_AM_HELLO, &h, sizeof(h), NULL, 0), UCS_OK);
            for (int i = 0; i < 5000 && !replies; i++) progress_ms(1);
            cr_assert(replies == 1 && verdict == KVT_EINVAL, "the wrong token's hello: %d replies, verdict %d", replies, verdict);
        }
        acks = 0;
        kvt__wire_data_t small = {2 * (uint64_t)LB, 512}, big = {3 * (uint64_t)LB, LB};
        send_am(ep, KVT_UCX_AM_DATA, &small, sizeof(small), run, small.len); /* eager: dropped */
        send_am(ep, KVT_UCX_AM_DATA, &big, sizeof(big), run, big.len);       /* rendezvous: refused */
        progress_ms(300);
        cr_assert_eq(acks, 0, "round %d: a stranger's run was acknowledged", round);
        cr_assert(all_zero(kvt_tier_addr(pool, 0, 0), (size_t)PAGES * LB), "round %d: a stranger wrote into the pool", round);
        kvt__ucx_close_ep(wk, ep);
    }
    kvt_net_server_stats_t st = {.size = sizeof(st)};
    kvt_net_server_stats(srv, &st);
    cr_assert_geq(st.bad_peers, 2, "%s", st.last_error);
    cr_assert(strstr(st.last_error, "accepted hello") != NULL, "%s", st.last_error);
    free(run);
    kvt_net_server_destroy(srv);
    kvt_tier_destroy(pool);
    kvt__ucx_fini(ctx, wk);
}

/* A UCX page server over a pool, and a writer's tier and engine to it. */
typedef struct rig {
    kvt_tier_t *pool, *src, *remote;
    kvt_net_server_t *srv;
    kvt_xfer_t *x;
} rig_t;

static void rig_open(rig_t *r, uint64_t token) {
    memset(r, 0, sizeof(*r));
    peer_init();
    kvt_tier_config_t c = {.size = sizeof(c), .kind = KVT_TIER_ARENA, .geom = {PAGES, 1, 4096, KVT_LAYOUT_PAGE_FIRST}};
    cr_assert_eq(kvt_tier_create(&r->pool, &c), KVT_OK);
    cr_assert_eq(kvt_tier_create(&r->src, &c), KVT_OK);
    cr_assert_eq(kvt_net_server_create(&r->srv, KVT_NET_UCX, r->pool, "127.0.0.1", 0), KVT_OK);
    cr_assert_eq(kvt_net_server_set_token(r->srv, token), KVT_OK);
}

/* The writer copies a page: its status, the pool page checked when KVT_OK.
 * This process's own peers are progressed meanwhile. */
static int rig_copy(rig_t *r, uint64_t token) {
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", kvt_net_server_port(r->srv));
    kvt_tier_config_t c = {.size = sizeof(c), .kind = KVT_TIER_UCX, .name = addr, .token = token,
                           .geom = {PAGES, 1, 4096, KVT_LAYOUT_PAGE_FIRST}};
    cr_assert_eq(kvt_tier_create(&r->remote, &c), KVT_OK);
    kvt_tier_t *tiers[2] = {r->src, r->remote};
    kvt_xfer_config_t xc;
    kvt_xfer_config_default(&xc);
    cr_assert_eq(kvt_xfer_create(&r->x, &xc, tiers, 2), KVT_OK);
    kvt_pattern_fill(kvt_tier_addr(r->src, 1, 0), 4096, 1, 7, 0);
    kvt_xfer_copy_t cp = {1, 5};
    cr_assert_eq(kvt_xfer_submit(r->x, 0, 1, &cp, 1, 0, NULL), KVT_OK);
    kvt_xfer_done_t d = {0};
    uint64_t t0 = kvt_now_ns();
    int got = 0;
    while (!got && kvt_now_ns() - t0 < 30000000000ull) {
        progress_ms(5);
        got = kvt_xfer_poll(r->x, &d, 1, 0);
    }
    cr_assert_eq(got, 1);
    if (d.status == KVT_OK) cr_assert(kvt_pattern_check(kvt_tier_addr(r->pool, 5, 0), 4096, 1, 7, 0));
    return d.status;
}

static void rig_close(rig_t *r) {
    kvt_xfer_destroy(r->x);
    kvt_tier_destroy(r->remote);
    kvt_net_server_destroy(r->srv);
    kvt_tier_destroy(r->src);
    kvt_tier_destroy(r->pool);
    kvt__ucx_fini(ctx, wk);
}

Test(ucx_peers, endpoints_that_come_and_go_do_not_use_up_the_server, .timeout = 120) {
    if (!kvt_net_ucx_built()) cr_skip_test("this build has no UCX");
    rig_t r;
    rig_open(&r, 0);
    for (int i = 0; i < 300; i++) { /* more than the server's endpoint table holds */
        ucp_ep_h ep = peer_connect(kvt_net_server_port(r.srv));
        ucp_request_param_t fp = {0};
        ucs_status_ptr_t q = ucp_ep_flush_nbx(ep, &fp);
        if (UCS_PTR_IS_PTR(q)) {
            while (ucp_request_check_status(q) == UCS_INPROGRESS) ucp_worker_progress(wk);
            ucp_request_free(q);
        }
        kvt__ucx_close_ep(wk, ep);
    }
    cr_assert_eq(rig_copy(&r, 0), KVT_OK, "a rank could not connect after 300 endpoints came and went");
    rig_close(&r);
}

/* 256 peers that connect and say nothing (the table's size) kept every
 * writer out for as long as they stayed, token or not: a writer now takes
 * the oldest one's slot at once, and each is closed 5 s after it came. */
Test(ucx_peers, silent_peers_cannot_keep_a_writer_out, .timeout = 120) {
    if (!kvt_net_ucx_built()) cr_skip_test("this build has no UCX");
    rig_t r;
    rig_open(&r, 0x5eed);
    enum { SILENT = 256 };
    ucp_ep_h *eps = calloc(SILENT, sizeof(*eps));
    for (int i = 0; i < SILENT; i++) eps[i] = peer_connect(kvt_net_server_port(r.srv));
    kvt_net_server_stats_t st = {.size = sizeof(st)};
    uint64_t t0 = kvt_now_ns();
    do { /* the server sees them all */
        progress_ms(10);
        kvt_net_server_stats(r.srv, &st);
    } while (st.connections < SILENT && kvt_now_ns() - t0 < 4000000000ull);
    cr_assert_eq(st.connections, SILENT);
    cr_assert_eq(st.awaiting_hello, SILENT);
    cr_assert_eq(rig_copy(&r, 0x5eed), KVT_OK, "a writer kept out by %d silent peers", SILENT);
    cr_assert_lt(kvt_now_ns() - t0, 4500000000ull, "in at once, not when the silent ones timed out");
    do {
        progress_ms(50);
        kvt_net_server_stats(r.srv, &st);
    } while (st.awaiting_hello > 0 && kvt_now_ns() - t0 < 20000000000ull);
    cr_assert_eq(st.awaiting_hello, 0, "each silent peer closed after 5 s");
    cr_assert_eq(st.bad_peers, SILENT, "%s", st.last_error);
    for (int i = 0; i < SILENT; i++) kvt__ucx_close_ep(wk, eps[i]);
    free(eps);
    rig_close(&r);
}
#else
Test(ucx_peers, runs_without_an_accepted_hello_write_nothing) { cr_skip_test("this build has no UCX"); }
#endif
