/* The `ucx` tier: another process's tier, written with UCX active messages
 * (src/sock/ucx-int.h). The same contract as the `tcp` tier: each transfer
 * worker has its own UCP context, worker and endpoint (a copy context); a
 * copy sends every span as one DATA message (UCX picks eager or rendezvous,
 * and the server receives rendezvous data straight into place), keeps them
 * all in flight, and returns when every one is acknowledged. UCX brings
 * RDMA, shared memory and TCP from one library; which it uses is its
 * configuration's business (UCX_TLS, UCX_NET_DEVICES).
 *
 * As on tcp: a span over KVT_WIRE_MAX_DATA goes as several runs; a copy (or
 * a hello) with no progress for 30 s fails; an ack is checked (each one for
 * a run in flight, the lengths summing to the copy's). A failed copy closes
 * the endpoint by force, which ends the sends still in flight (a send UCX
 * cannot cancel otherwise: the copy never returns while one may still read
 * the caller's pages), and the next copy connects again.
 */
#include <string.h>

#include "kvtier/stats.h"
#include "kvtier/error.h"
#include "tier-int.h"

#ifdef KVT_HAVE_UCX
#include <arpa/inet.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../core/mem-int.h"
#include "../sock/ucx-int.h"
#include "../sock/wire.h"


typedef struct ucx_ctx {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_ep_h ep;           /* NULL: to connect at the next copy */
    volatile bool failed;  /* the endpoint reported an error, or a peer's ack made no sense */
    uint64_t acked;        /* ACKs received in this copy */
    uint64_t acked_bytes;  /* ... the lengths they carried */
    uint64_t runs;         /* runs of this copy (0 between copies: an ack then is for nothing) */
    int32_t reply;         /* hello verdict; 1 while none */
    kvt__wire_data_t *hdr; /* headers of the runs in flight */
    void **req;
    size_t cap;
} ucx_ctx_t;


/* Whether a message came over the endpoint of now: one a closed endpoint
 * left on the worker (a transport that delivers by interface, not by
 * connection) is no answer to this copy or hello. The server sends its
 * replies and acks with the reply endpoint. */
static bool from_peer(const ucx_ctx_t *x, const ucp_am_recv_param_t *param) {
    return x->ep && (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) && param->reply_ep == x->ep;
}

static ucs_status_t on_reply(void *arg, const void *header, size_t header_length, void *data, size_t length,
                             const ucp_am_recv_param_t *param) {
    ucx_ctx_t *x = arg;
    (void)data;
    (void)length;
    if (!from_peer(x, param)) return UCS_OK;
    int32_t status = KVT_EIO; /* the header is not aligned: copy the field out */
    if (header_length == sizeof(kvt__wire_reply_t)) memcpy(&status, (const uint8_t *)header + offsetof(kvt__wire_reply_t, status), sizeof(status));
    x->reply = status;
    return UCS_OK;
}

static ucs_status_t on_ack(void *arg, const void *header, size_t header_length, void *data, size_t length,
                           const ucp_am_recv_param_t *param) {
    ucx_ctx_t *x = arg;
    (void)data;
    (void)length;
    if (!from_peer(x, param)) return UCS_OK;
    uint64_t len = 0; /* the header is not aligned: copy it out */
    if (header_length == sizeof(len)) memcpy(&len, header, sizeof(len));
    if (header_length != sizeof(len) || x->acked >= x->runs) x->failed = true; /* an ack for nothing: a confused peer */
    x->acked++;
    x->acked_bytes += len;
    return UCS_OK;
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status) {
    ucx_ctx_t *x = arg;
    (void)status;
    if (ep == x->ep) x->failed = true; /* (not a closed endpoint's late word on a new one) */
}

/* Waits (progressing) until done() or the endpoint fails or no ack comes
 * for KVT_WIRE_STALL_NS. */
static bool progress_until(ucx_ctx_t *x, bool (*done)(ucx_ctx_t *, void *), void *arg) {
    uint64_t last = kvt_now_ns(), acked = x->acked;
    while (!done(x, arg)) {
        if (x->failed || kvt_now_ns() - last > KVT_WIRE_STALL_NS) return false;
        if (ucp_worker_progress(x->worker) == 0) { /* idle: do not spin a shared core */
            struct timespec ts = {0, 5000};
            nanosleep(&ts, NULL);
        }
        if (x->acked != acked) acked = x->acked, last = kvt_now_ns();
    }
    return true;
}

static bool replied(ucx_ctx_t *x, void *arg) {
    (void)arg;
    return x->reply != 1;
}

/* Closes the endpoint by force (its requests in flight end, canceled: UCX
 * reads none of their buffers after), then frees the requests r[0..n). */
static void disconnect(ucx_ctx_t *x, void **r, size_t n) {
    if (x->ep) kvt__ucx_close_ep(x->worker, x->ep);
    x->ep = NULL;
    for (size_t i = 0; i < n; i++)
        if (r[i]) {
            while (ucp_request_check_status(r[i]) == UCS_INPROGRESS) ucp_worker_progress(x->worker);
            ucp_request_free(r[i]);
            r[i] = NULL;
        }
}

static void ctx_free(ucx_ctx_t *x) {
    disconnect(x, NULL, 0);
    kvt__ucx_fini(x->ctx, x->worker);
    kvt__free(x->hdr, x->cap * sizeof(*x->hdr));
    kvt__free(x->req, x->cap * sizeof(*x->req));
    KVT_DELETE(x);
}

/* An endpoint to the peer, greeted: KVT_OK, or the server's verdict, or
 * KVT_EIO (no endpoint left then). */
static int connect_peer(kvt_tier_t *t, ucx_ctx_t *x) {
    struct sockaddr_in sa;
    if (kvt__parse_addr(t->name, &sa) != 0) return KVT_EINVAL;
    x->reply = 1;
    x->failed = false;
    int rc = KVT_OK;
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER,
                          .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
                          .sockaddr = {(const struct sockaddr *)&sa, sizeof(sa)},
                          .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                          .err_handler = {on_ep_error, x}};
    if (ucp_ep_create(x->worker, &ep, &x->ep) != UCS_OK) {
        x->ep = NULL;
        return KVT_EIO;
    }
    /* hello: the server checks our geometry */
    const kvt_geom_t *g = &t->cfg.geom;
    kvt__wire_hello_t hh = {KVT_WIRE_MAGIC, KVT_WIRE_VERSION, (uint32_t)g->layout, g->layers, 0, g->pages,
                            g->layer_bytes, t->cfg.token}; /* lives until sent: until disconnect at the latest */
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_AM_SEND_FLAG_REPLY};
    ucs_status_ptr_t r = ucp_am_send_nbx(x->ep, KVT_UCX_AM_HELLO, &hh, sizeof(hh), NULL, 0, &p);
    void *req = UCS_PTR_IS_ERR(r) ? NULL : r;
    if (UCS_PTR_IS_ERR(r) || !progress_until(x, replied, NULL)) rc = KVT_EIO;
    else if (x->reply != KVT_OK) rc = x->reply < 0 ? x->reply : KVT_EIO;
    if (req && rc == KVT_OK) { /* replied: the hello is out, or on its way out */
        while (ucp_request_check_status(req) == UCS_INPROGRESS && !x->failed) ucp_worker_progress(x->worker);
        if (ucp_request_check_status(req) == UCS_INPROGRESS) rc = KVT_EIO;
        else ucp_request_free(req), req = NULL;
    }
    if (rc != KVT_OK) disconnect(x, &req, 1);
    return rc;
}

static int ucx_ctx_open(kvt_tier_t *t, void **out) {
    struct sockaddr_in sa;
    if (kvt__parse_addr(t->name, &sa) != 0) return KVT_EINVAL;
    ucx_ctx_t *x = KVT_NEW(ucx_ctx_t);
    if (x == NULL) return KVT_ENOMEM;
    int rc = kvt__ucx_worker(&x->ctx, &x->worker, UCS_THREAD_MODE_SINGLE);
    if (rc == KVT_OK) rc = kvt__ucx_on(x->worker, KVT_UCX_AM_REPLY, on_reply, x);
    if (rc == KVT_OK) rc = kvt__ucx_on(x->worker, KVT_UCX_AM_ACK, on_ack, x);
    if (rc == KVT_OK) rc = connect_peer(t, x);
    if (rc != KVT_OK) {
        ctx_free(x);
        return rc;
    }
    *out = x;
    return KVT_OK;
}

static void ucx_ctx_close(kvt_tier_t *t, void *ctx) {
    (void)t;
    ctx_free(ctx);
}

typedef struct want {
    uint64_t runs, bytes;
    size_t n;
} want_t;

/* Every run sent and acknowledged, or a send failed (the server refused
 * it: no ack will come). */
static bool all_done(ucx_ctx_t *x, void *arg) {
    want_t *w = arg;
    bool sent = true;
    for (size_t i = 0; i < w->n; i++) {
        ucs_status_t st = x->req[i] ? ucp_request_check_status(x->req[i]) : UCS_OK;
        if (st == UCS_INPROGRESS) sent = false;
        else if (st != UCS_OK) return true;
    }
    return sent && x->acked >= w->runs;
}

/* Room for n runs' headers and requests. */
static int grow(ucx_ctx_t *x, size_t n) {
    if (n <= x->cap) return KVT_OK;
    kvt__wire_data_t *h = kvt__malloc(n * sizeof(*h));
    void **r = kvt__malloc(n * sizeof(*r));
    if (h == NULL || r == NULL) {
        kvt__free(h, n * sizeof(*h));
        kvt__free(r, n * sizeof(*r));
        return KVT_ENOMEM;
    }
    kvt__free(x->hdr, x->cap * sizeof(*x->hdr));
    kvt__free(x->req, x->cap * sizeof(*x->req));
    x->hdr = h;
    x->req = r;
    x->cap = n;
    return KVT_OK;
}

static int ucx_copy(kvt_tier_t *t, void *ctx, const kvt__span_t *spans, size_t n) {
    ucx_ctx_t *x = ctx;
    /* a peer gone since the last copy says so now (as a tcp stream's end): connect again, not fail */
    while (x->ep && ucp_worker_progress(x->worker) != 0) continue;
    if (x->ep && x->failed) disconnect(x, NULL, 0);
    if (x->ep == NULL) { /* the last copy failed, or the peer went away: connect again */
        int rc = connect_peer(t, x);
        if (rc != KVT_OK) return rc;
    }
    want_t w = {0, 0, 0};
    for (size_t i = 0; i < n; i++) w.runs += (spans[i].len + KVT_WIRE_MAX_DATA - 1) / KVT_WIRE_MAX_DATA;
    if (grow(x, w.runs) != KVT_OK) return KVT_ENOMEM;
    x->acked = x->acked_bytes = 0;
    x->runs = w.runs;
    int rc = KVT_OK;
    for (size_t i = 0; i < n; i++)
        for (uint64_t at = 0; at < spans[i].len; at += KVT_WIRE_MAX_DATA) {
            uint64_t len = spans[i].len - at < KVT_WIRE_MAX_DATA ? spans[i].len - at : KVT_WIRE_MAX_DATA;
            size_t k = w.n++;
            x->hdr[k] = (kvt__wire_data_t){spans[i].dst_off + at, len};
            w.bytes += len;
            ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_AM_SEND_FLAG_REPLY};
            ucs_status_ptr_t r = rc == KVT_OK ? ucp_am_send_nbx(x->ep, KVT_UCX_AM_DATA, &x->hdr[k], sizeof(x->hdr[k]),
                                                                (const uint8_t *)spans[i].src + at, len, &p)
                                              : NULL;
            x->req[k] = UCS_PTR_IS_ERR(r) ? NULL : r;
            if (UCS_PTR_IS_ERR(r)) rc = KVT_EIO;
        }
    if (rc == KVT_OK && !progress_until(x, all_done, &w)) rc = KVT_EIO;
    if (rc == KVT_OK && x->acked_bytes != w.bytes) rc = KVT_EIO; /* acks of other lengths: a confused peer */
    for (size_t i = 0; i < w.n && rc == KVT_OK; i++)
        if (x->req[i] && ucp_request_check_status(x->req[i]) != UCS_OK) rc = KVT_EIO; /* a send that failed */
    x->runs = 0;
    if (rc != KVT_OK) { /* late acks must not count for a later copy: this endpoint is done */
        disconnect(x, x->req, w.n);
        return rc;
    }
    for (size_t i = 0; i < w.n; i++)
        if (x->req[i]) ucp_request_free(x->req[i]);
    return KVT_OK;
}

static int ucx_open(kvt_tier_t *t) {
    t->base = NULL; /* nothing local: the pages are the peer's */
    return KVT_OK;
}

#else /* no UCX in this build */

static int ucx_open(kvt_tier_t *t) {
    (void)t;
    return KVT_ENOTSUP;
}
#endif

static void ucx_close(kvt_tier_t *t) { (void)t; }

const kvt__tier_ops_t kvt__tier_ucx_ops = {
    .name = "ucx",
    .host_visible = false,
    .open = ucx_open,
    .close = ucx_close,
#ifdef KVT_HAVE_UCX
    .ctx_open = ucx_ctx_open,
    .ctx_close = ucx_ctx_close,
    .copy = ucx_copy,
#endif
};
