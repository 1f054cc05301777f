/* The `ucx` tier: another process's tier, written with UCX active messages
 * (src/sock/ucx-int.h). The same contract as the `tcp` tier: each transfer
 * worker has its own UCP context, worker and endpoint (a copy context); a
 * copy sends every span as one DATA message (UCX picks eager or rendezvous,
 * and the server receives rendezvous data straight into place), keeps them
 * all in flight, and returns when every one is acknowledged. UCX brings
 * RDMA, shared memory and TCP from one library; which it uses is its
 * configuration's business (UCX_TLS, UCX_NET_DEVICES).
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

#define WAIT_NS (30ull * 1000000000ull)

typedef struct ucx_ctx {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_ep_h ep;
    volatile bool failed;  /* the endpoint reported an error */
    uint64_t acked;        /* ACKs received */
    int32_t reply;         /* hello verdict; 1 while none */
    kvt__wire_data_t *hdr; /* headers of the spans in flight */
    void **req;
    size_t cap;
} ucx_ctx_t;


static ucs_status_t on_reply(void *arg, const void *header, size_t header_length, void *data, size_t length,
                             const ucp_am_recv_param_t *param) {
    ucx_ctx_t *x = arg;
    (void)data;
    (void)length;
    (void)param;
    int32_t status = KVT_EIO; /* the header is not aligned: copy the field out */
    if (header_length == sizeof(kvt__wire_reply_t)) memcpy(&status, (const uint8_t *)header + offsetof(kvt__wire_reply_t, status), sizeof(status));
    x->reply = status;
    return UCS_OK;
}

static ucs_status_t on_ack(void *arg, const void *header, size_t header_length, void *data, size_t length,
                           const ucp_am_recv_param_t *param) {
    ucx_ctx_t *x = arg;
    (void)header;
    (void)header_length;
    (void)data;
    (void)length;
    (void)param;
    x->acked++;
    return UCS_OK;
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status) {
    ucx_ctx_t *x = arg;
    (void)ep;
    (void)status;
    x->failed = true;
}

/* Waits (progressing) until done() or the endpoint fails or time runs out. */
static bool progress_until(ucx_ctx_t *x, bool (*done)(ucx_ctx_t *, void *), void *arg) {
    uint64_t t0 = kvt_now_ns();
    while (!done(x, arg)) {
        if (x->failed || kvt_now_ns() - t0 > WAIT_NS) return false;
        if (ucp_worker_progress(x->worker) == 0) { /* idle: do not spin a shared core */
            struct timespec ts = {0, 5000};
            nanosleep(&ts, NULL);
        }
    }
    return true;
}

static bool replied(ucx_ctx_t *x, void *arg) {
    (void)arg;
    return x->reply != 1;
}

static void ctx_free(ucx_ctx_t *x) {
    if (x->ep) kvt__ucx_close_ep(x->worker, x->ep);
    kvt__ucx_fini(x->ctx, x->worker);
    kvt__free(x->hdr, x->cap * sizeof(*x->hdr));
    kvt__free(x->req, x->cap * sizeof(*x->req));
    KVT_DELETE(x);
}

static int ucx_ctx_open(kvt_tier_t *t, void **out) {
    struct sockaddr_in sa;
    if (kvt__parse_addr(t->name, &sa) != 0) return KVT_EINVAL;
    ucx_ctx_t *x = KVT_NEW(ucx_ctx_t);
    if (x == NULL) return KVT_ENOMEM;
    x->reply = 1;
    int rc = kvt__ucx_worker(&x->ctx, &x->worker, UCS_THREAD_MODE_SINGLE);
    if (rc == KVT_OK) rc = kvt__ucx_on(x->worker, KVT_UCX_AM_REPLY, on_reply, x);
    if (rc == KVT_OK) rc = kvt__ucx_on(x->worker, KVT_UCX_AM_ACK, on_ack, x);
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER,
                          .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
                          .sockaddr = {(const struct sockaddr *)&sa, sizeof(sa)},
                          .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                          .err_handler = {on_ep_error, x}};
    if (rc == KVT_OK && ucp_ep_create(x->worker, &ep, &x->ep) != UCS_OK) rc = KVT_EIO;
    if (rc == KVT_OK) { /* hello: the server checks our geometry */
        const kvt_geom_t *g = &t->cfg.geom;
        kvt__wire_hello_t mine = {KVT_WIRE_MAGIC, KVT_WIRE_VERSION, (uint32_t)g->layout, g->layers, 0, g->pages,
                                  g->layer_bytes, t->cfg.token};
        kvt__wire_hello_t *hh = kvt__malloc(sizeof(*hh)); /* lives until sent */
        if (hh == NULL) rc = KVT_ENOMEM;
        else *hh = mine;
        ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_AM_SEND_FLAG_REPLY};
        ucs_status_ptr_t r = rc == KVT_OK ? ucp_am_send_nbx(x->ep, KVT_UCX_AM_HELLO, hh, sizeof(*hh), NULL, 0, &p) : NULL;
        if (UCS_PTR_IS_ERR(r)) rc = KVT_EIO;
        if (rc == KVT_OK && !progress_until(x, replied, NULL)) rc = KVT_EIO;
        if (r && !UCS_PTR_IS_ERR(r)) {
            while (ucp_request_check_status(r) == UCS_INPROGRESS && !x->failed) ucp_worker_progress(x->worker);
            ucp_request_free(r);
        }
        kvt__free(hh, sizeof(*hh));
        if (rc == KVT_OK && x->reply != KVT_OK) rc = x->reply < 0 ? x->reply : KVT_EIO;
    }
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
    uint64_t acks;
    size_t n;
} want_t;

static bool all_done(ucx_ctx_t *x, void *arg) {
    want_t *w = arg;
    if (x->acked < w->acks) return false;
    for (size_t i = 0; i < w->n; i++)
        if (x->req[i] && ucp_request_check_status(x->req[i]) == UCS_INPROGRESS) return false;
    return true;
}

static int ucx_copy(kvt_tier_t *t, void *ctx, const kvt__span_t *spans, size_t n) {
    (void)t;
    ucx_ctx_t *x = ctx;
    if (x->failed) return KVT_EIO;
    if (n > x->cap) {
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
    }
    want_t w = {x->acked + n, n};
    int rc = KVT_OK;
    for (size_t i = 0; i < n; i++) {
        x->hdr[i] = (kvt__wire_data_t){spans[i].dst_off, spans[i].len};
        ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_AM_SEND_FLAG_REPLY};
        ucs_status_ptr_t r = ucp_am_send_nbx(x->ep, KVT_UCX_AM_DATA, &x->hdr[i], sizeof(x->hdr[i]), spans[i].src,
                                             spans[i].len, &p);
        x->req[i] = UCS_PTR_IS_ERR(r) ? NULL : r;
        if (UCS_PTR_IS_ERR(r)) rc = KVT_EIO;
    }
    if (rc == KVT_OK && !progress_until(x, all_done, &w)) rc = KVT_EIO;
    if (rc != KVT_OK) x->failed = true; /* late acks must not count for a later copy: this context is done */
    for (size_t i = 0; i < n; i++)
        if (x->req[i]) {
            if (rc != KVT_OK) ucp_request_cancel(x->worker, x->req[i]);
            while (ucp_request_check_status(x->req[i]) == UCS_INPROGRESS) ucp_worker_progress(x->worker);
            ucp_request_free(x->req[i]);
        }
    return rc;
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
