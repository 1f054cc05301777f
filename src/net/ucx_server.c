/* The page server over UCX (UCP active messages); see src/sock/ucx-int.h for
 * the message ids. One progress thread owns the UCP worker: it accepts
 * connection requests, answers hellos, and receives runs — eager ones are
 * copied into the tier in the handler, rendezvous ones are received straight
 * into place with ucp_am_recv_data_nbx — acknowledging each run once its
 * bytes are in the tier. The thread sleeps on the worker's event fd when
 * there is nothing to progress. Built only with UCX (KVT_HAVE_UCX).
 *
 * Endpoints: one per connection, in slots[] with what the server knows of it
 * (the thread's alone: every callback runs in its ucp_worker_progress). A
 * run is taken only from an endpoint whose hello was accepted, as the tcp
 * server reads runs only after one; an endpoint whose peer went away is
 * closed and its slot given to the next connection. As on TCP, a peer is
 * given 5 s to have its hello accepted (one that says nothing, or is
 * refused, is closed then), and with the table full a new connection takes
 * the slot of the oldest still without one: peers that connect and say
 * nothing cannot keep a writer out. */
#include <string.h>

#include "kvtier/error.h"
#include "kvtier/net.h"
#include "kvtier/stats.h"
#include "net-int.h"

#ifdef KVT_HAVE_UCX
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "../core/mem-int.h"
#include "../sock/ucx-int.h"
#include "../sock/wire.h"

#define MAX_EPS 256
#define HELLO_NS 5000000000ull /* a connection's time to have its hello accepted */

/* An endpoint and what the server knows of it. */
typedef struct slot {
    ucp_ep_h ep;
    bool accepted;  /* said a hello the server took */
    bool heard;     /* said a hello, whatever the verdict */
    bool gone;      /* its peer went away, or it is to be closed: closed by the progress thread */
    uint64_t since; /* when it connected */
} slot_t;

typedef struct ucx_server {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_listener_h listener;
    slot_t slots[MAX_EPS];
    int neps, ngone;
    ucp_ep_h evicted[MAX_EPS]; /* endpoints taken out of the table for a newcomer, to close */
    int nevicted;
    int efd;
    pthread_t th;
    _Atomic bool stop; /* set by stop; the progress thread polls it */
} ucx_server_t;

bool kvt_net_ucx_built(void) { return true; }

/* An acknowledgement in flight: its header must live until it is sent. */
typedef struct ack {
    uint64_t len;
} ack_t;

static void ack_sent(void *request, ucs_status_t status, void *user_data) {
    (void)status;
    free(user_data);
    ucp_request_free(request);
}

static void send_ack(ucp_ep_h ep, uint64_t len) {
    ack_t *a = malloc(sizeof(*a));
    if (a == NULL) return;
    a->len = len;
    /* with the reply flag: the writer matches it to its endpoint of now (a closed one's stays there) */
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                                             UCP_OP_ATTR_FIELD_FLAGS,
                             .cb.send = ack_sent, .user_data = a, .flags = UCP_AM_SEND_FLAG_REPLY};
    ucs_status_ptr_t r = ucp_am_send_nbx(ep, KVT_UCX_AM_ACK, a, sizeof(*a), NULL, 0, &p);
    if (r == NULL || UCS_PTR_IS_ERR(r)) free(a); /* done at once, or failed (the peer is gone) */
}

typedef struct pending {
    ucp_ep_h ep;
    uint64_t len;
    kvt_net_server_t *s;
} pending_t;

static void rndv_done(void *request, ucs_status_t status, size_t length, void *user_data) {
    pending_t *p = user_data;
    (void)length;
    if (status == UCS_OK) {
        kvt__net_count(p->s, p->len);
        send_ack(p->ep, p->len);
    }
    free(p);
    ucp_request_free(request);
}

static int ep_index(const ucx_server_t *u, ucp_ep_h ep) {
    for (int i = 0; i < u->neps; i++)
        if (u->slots[i].ep == ep) return i;
    return -1;
}

static ucs_status_t on_hello(void *arg, const void *header, size_t header_length, void *data, size_t length,
                             const ucp_am_recv_param_t *param) {
    kvt_net_server_t *s = arg;
    (void)data;
    (void)length;
    kvt__wire_reply_t *r = malloc(sizeof(*r));
    if (r == NULL || !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
        free(r);
        return UCS_OK;
    }
    kvt__wire_hello_t h = {0}; /* UCX's header is not aligned: copy it out */
    memcpy(&h, header, header_length < sizeof(h) ? header_length : sizeof(h));
    kvt__net_check_hello(s, &h, header_length, r); /* any verdict is replied: the writer fails at once */
    ucx_server_t *u = s->ucx;
    int i = ep_index(u, param->reply_ep);
    if (i >= 0) {
        u->slots[i].accepted = r->status == 0;
        if (!u->slots[i].heard) {
            u->slots[i].heard = true;
            pthread_mutex_lock(&s->mu);
            s->st.awaiting_hello--;
            pthread_mutex_unlock(&s->mu);
        }
    }
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                                             UCP_OP_ATTR_FIELD_FLAGS,
                             .cb.send = ack_sent, .user_data = r, .flags = UCP_AM_SEND_FLAG_REPLY};
    ucs_status_ptr_t q = ucp_am_send_nbx(param->reply_ep, KVT_UCX_AM_REPLY, r, sizeof(*r), NULL, 0, &p);
    if (q == NULL || UCS_PTR_IS_ERR(q)) free(r);
    return UCS_OK;
}

static ucs_status_t on_data(void *arg, const void *header, size_t header_length, void *data, size_t length,
                            const ucp_am_recv_param_t *param) {
    kvt_net_server_t *s = arg;
    ucx_server_t *u = s->ucx;
    kvt__wire_data_t dv = {0, 0}, *d = &dv; /* UCX's header is not aligned: copy it out */
    memcpy(&dv, header, header_length < sizeof(dv) ? header_length : sizeof(dv));
    bool rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
    int i = param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP ? ep_index(u, param->reply_ep) : -1;
    /* A refused run: a rendezvous one is refused to its sender (whose request fails); an eager one can
     * only be dropped (UCX aborts on an error from the handler of a message in several fragments) */
    const ucs_status_t refused = rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
    if (i < 0 || !u->slots[i].accepted) { /* a stranger's runs are not written, whatever they say */
        kvt__net_note(s, &s->st.bad_peers, "a run before an accepted hello over ucx: refused");
        return refused;
    }
    if (header_length != sizeof(*d) || d->len != length || !kvt__net_run_ok(s, d) ||
        !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
        kvt__net_note(s, &s->st.bad_peers, "a run outside the tier over ucx: refused");
        return refused;
    }
    if (!rndv) { /* eager: the bytes are here, for the handler's duration */
        memcpy(s->base + d->off, data, d->len);
        kvt__net_count(s, d->len);
        send_ack(param->reply_ep, d->len);
        return UCS_OK;
    }
    pending_t *p = malloc(sizeof(*p));
    if (p == NULL) return UCS_ERR_NO_MEMORY; /* refused: the sender's request fails */
    *p = (pending_t){param->reply_ep, d->len, s};
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                              .cb.recv_am = rndv_done, .user_data = p};
    ucs_status_ptr_t r = ucp_am_recv_data_nbx(u->worker, data, s->base + d->off, d->len, &rp);
    if (r == NULL) { /* received at once */
        kvt__net_count(s, d->len);
        send_ack(p->ep, p->len);
        free(p);
    } else if (UCS_PTR_IS_ERR(r)) {
        free(p);
    }
    return UCS_OK;
}

/* Endpoint i is to be closed (after this progress: not from a callback). */
static void mark_gone(kvt_net_server_t *s, int i) {
    ucx_server_t *u = s->ucx;
    if (u->slots[i].gone) return;
    u->slots[i].gone = true;
    u->ngone++;
    if (!u->slots[i].heard) { /* it will not say its hello now */
        u->slots[i].heard = true;
        pthread_mutex_lock(&s->mu);
        s->st.awaiting_hello--;
        pthread_mutex_unlock(&s->mu);
    }
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status) {
    kvt_net_server_t *s = arg;
    (void)status; /* a writer went away */
    int i = ep_index(s->ucx, ep);
    if (i >= 0) mark_gone(s, i);
}

/* Marks the endpoints whose 5 s went by without an accepted hello. */
static void expire_hellos(kvt_net_server_t *s) {
    ucx_server_t *u = s->ucx;
    uint64_t now = kvt_now_ns();
    for (int i = 0; i < u->neps; i++)
        if (!u->slots[i].accepted && !u->slots[i].gone && now - u->slots[i].since >= HELLO_NS) {
            if (!u->slots[i].heard)
                kvt__net_note(s, &s->st.bad_peers, "a peer sent no hello within 5 s over ucx: closed");
            mark_gone(s, i);
        }
}

/* Closes the endpoints whose peers went away, their slots given to the
 * others first (a close progresses the worker: callbacks meanwhile see a
 * table without them). */
static void close_gone(ucx_server_t *u) {
    ucp_ep_h gone[2 * MAX_EPS]; /* the table's gone and those evicted from it */
    int n = 0;
    for (int i = 0; i < u->neps;) {
        if (!u->slots[i].gone) {
            i++;
            continue;
        }
        gone[n++] = u->slots[i].ep;
        u->slots[i] = u->slots[--u->neps];
    }
    u->ngone = 0;
    for (int i = 0; i < u->nevicted; i++) gone[n++] = u->evicted[i];
    u->nevicted = 0;
    for (int i = 0; i < n; i++) kvt__ucx_close_ep(u->worker, gone[i]);
}

/* With the table full, the slot of the oldest endpoint without an
 * accepted hello, its endpoint set aside to be closed; -1 when every one
 * has one (writers: the newcomer is refused). */
static int evict_oldest(kvt_net_server_t *s) {
    ucx_server_t *u = s->ucx;
    int old = -1;
    for (int i = 0; i < u->neps; i++)
        if (!u->slots[i].accepted && (old < 0 || u->slots[i].since < u->slots[old].since)) old = i;
    if (old < 0 || u->nevicted == MAX_EPS) return -1;
    if (!u->slots[old].heard) kvt__net_note(s, &s->st.bad_peers, "a peer without a hello made room for a newcomer over ucx");
    mark_gone(s, old); /* (its hello counted as not coming) */
    u->ngone--;        /* ... and it leaves the table here, not in close_gone */
    u->evicted[u->nevicted++] = u->slots[old].ep;
    u->slots[old] = u->slots[--u->neps];
    return old;
}

static void on_conn(ucp_conn_request_h req, void *arg) {
    kvt_net_server_t *s = arg;
    ucx_server_t *u = s->ucx;
    if (u->neps == MAX_EPS && evict_oldest(s) < 0) {
        kvt__net_note(s, &s->st.refused, "%d writers connected over ucx: a connection refused", MAX_EPS);
        ucp_listener_reject(u->listener, req);
        return;
    }
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLER,
                          .conn_request = req,
                          .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                          .err_handler = {on_ep_error, s}};
    ucp_ep_h h;
    if (ucp_ep_create(u->worker, &ep, &h) == UCS_OK) {
        u->slots[u->neps++] = (slot_t){.ep = h, .since = kvt_now_ns()};
        pthread_mutex_lock(&s->mu);
        s->st.connections++;
        s->st.awaiting_hello++;
        pthread_mutex_unlock(&s->mu);
    }
}

static void *progress_main(void *arg) {
    kvt_net_server_t *s = arg;
    ucx_server_t *u = s->ucx;
    uint64_t next_expiry = 0;
    while (!atomic_load(&u->stop)) {
        if (kvt_now_ns() >= next_expiry) {
            expire_hellos(s);
            next_expiry = kvt_now_ns() + 100000000ull;
        }
        if (u->ngone || u->nevicted) close_gone(u);
        if (ucp_worker_progress(u->worker)) continue;
        ucs_status_t st = ucp_worker_arm(u->worker);
        if (st == UCS_ERR_BUSY) continue;
        struct pollfd pf = {u->efd, POLLIN, 0};
        poll(&pf, 1, 50);
    }
    return NULL;
}

static int ucx_start(kvt_net_server_t *s, const struct sockaddr_in *a) {
    ucx_server_t *u = KVT_NEW(ucx_server_t);
    if (u == NULL) return KVT_ENOMEM;
    s->ucx = u;
    int rc = kvt__ucx_worker(&u->ctx, &u->worker, UCS_THREAD_MODE_SINGLE);
    if (rc == KVT_OK && ucp_worker_get_efd(u->worker, &u->efd) != UCS_OK) rc = KVT_EIO;
    if (rc == KVT_OK) rc = kvt__ucx_on(u->worker, KVT_UCX_AM_HELLO, on_hello, s);
    if (rc == KVT_OK) rc = kvt__ucx_on(u->worker, KVT_UCX_AM_DATA, on_data, s);
    ucp_listener_params_t lp = {.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
                                .sockaddr = {(const struct sockaddr *)a, sizeof(*a)},
                                .conn_handler = {on_conn, s}};
    if (rc == KVT_OK && ucp_listener_create(u->worker, &lp, &u->listener) != UCS_OK) rc = KVT_EIO;
    ucp_listener_attr_t la = {.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR};
    if (rc == KVT_OK && ucp_listener_query(u->listener, &la) != UCS_OK) rc = KVT_EIO;
    if (rc == KVT_OK) s->port = ntohs(((const struct sockaddr_in *)&la.sockaddr)->sin_port);
    if (rc == KVT_OK && pthread_create(&u->th, NULL, progress_main, s) != 0) rc = KVT_EIO;
    if (rc != KVT_OK) {
        if (u->listener) ucp_listener_destroy(u->listener);
        kvt__ucx_fini(u->ctx, u->worker);
        KVT_DELETE(u);
        s->ucx = NULL;
    }
    return rc;
}

static void ucx_stop(kvt_net_server_t *s) {
    ucx_server_t *u = s->ucx;
    atomic_store(&u->stop, true);
    ucp_worker_signal(u->worker);
    pthread_join(u->th, NULL);
    ucp_listener_destroy(u->listener); /* first: no newcomer evicts an endpoint being closed */
    for (int i = 0; i < u->neps; i++) kvt__ucx_close_ep(u->worker, u->slots[i].ep);
    for (int i = 0; i < u->nevicted; i++) kvt__ucx_close_ep(u->worker, u->evicted[i]);
    kvt__ucx_fini(u->ctx, u->worker);
    KVT_DELETE(u);
}

#else /* no UCX in this build */

bool kvt_net_ucx_built(void) { return false; }

static int ucx_start(kvt_net_server_t *s, const struct sockaddr_in *a) {
    (void)s;
    (void)a;
    return KVT_ENOTSUP;
}

static void ucx_stop(kvt_net_server_t *s) { (void)s; }
#endif

const kvt__server_ops_t kvt__server_ucx_ops = {"ucx", ucx_start, ucx_stop};
