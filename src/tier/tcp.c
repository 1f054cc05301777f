/* The `tcp` tier: another process's tier, written over TCP (src/sock/wire.h).
 *
 * Each transfer worker opens its own `streams` connections (a copy context)
 * and says hello on each; the server refuses a geometry that is not its
 * own. A copy deals the item's spans over the connections, and on every
 * connection keeps sending while the acknowledgements come back, so many
 * page runs are in flight at once and the link, not the round trip, bounds
 * throughput:
 *
 *   conn 0:  [hdr|run 0 bytes][hdr|run 3 bytes] ...   <- ack ack
 *   conn 1:  [hdr|run 1 bytes][hdr|run 4 bytes] ...   <- ack
 *   conn 2:  [hdr|run 2 bytes] ...                    <- ack
 *
 * A span longer than the server takes in one run (KVT_WIRE_MAX_DATA) goes
 * as several. Each ack carries its run's length and answers the oldest run
 * of its connection not yet answered: one of another length is a confused
 * peer. The copy returns when every run is acknowledged (the bytes are in
 * the peer's memory), or KVT_EIO when a connection fails or makes no
 * progress for KVT_WIRE_STALL_MS (the worker's connections are then
 * reopened for its next copy).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "kvtier/error.h"
#include "../core/error-int.h"
#include "kvtier/stats.h"
#include "tier-int.h"
#include "../core/mem-int.h"
#include "../sock/wire.h"

#define MAX_STREAMS 64

/* A place in a connection's runs: span `span` (every stride-th of the
 * copy's), from byte `part` of it. */
typedef struct cursor {
    size_t span;
    uint64_t part;
} cursor_t;

typedef struct conn {
    int fd;
    cursor_t send;    /* the run being sent */
    size_t off;       /* bytes of it sent (header first) */
    cursor_t ack;     /* the oldest run not yet acknowledged */
    size_t unacked;   /* runs sent, not yet acknowledged */
    uint8_t ack_buf[8];
    size_t ack_got;
} conn_t;

typedef struct tcp_ctx {
    uint32_t n;
    conn_t c[MAX_STREAMS];
} tcp_ctx_t;

static uint32_t streams_of(const kvt_tier_t *t) {
    uint32_t s = t->cfg.streams ? t->cfg.streams : 4;
    return s > MAX_STREAMS ? MAX_STREAMS : s;
}

static int tcp_open(kvt_tier_t *t) {
    t->base = NULL; /* nothing local: the pages are the peer's */
    return KVT_OK;
}

static void tcp_close(kvt_tier_t *t) { (void)t; }

static void close_all(tcp_ctx_t *x) {
    for (uint32_t i = 0; i < x->n; i++)
        if (x->c[i].fd >= 0) close(x->c[i].fd);
    x->n = 0;
}

/* Connects and says hello on every stream. */
static int connect_all(kvt_tier_t *t, tcp_ctx_t *x) {
    const kvt_geom_t *g = &t->cfg.geom;
    kvt__wire_hello_t h = {KVT_WIRE_MAGIC, KVT_WIRE_VERSION, (uint32_t)g->layout, g->layers, 0, g->pages, g->layer_bytes,
                           t->cfg.token};
    uint32_t want = streams_of(t);
    for (x->n = 0; x->n < want; x->n++) {
        conn_t *c = &x->c[x->n];
        memset(c, 0, sizeof(*c));
        c->fd = kvt__tcp_connect(t->name);
        kvt__wire_reply_t r;
        int rc = KVT_EIO; /* no connection, or no reply */
        uint64_t by = kvt_now_ns() + KVT_WIRE_STALL_NS; /* a port that takes the hello and never answers */
        if (c->fd >= 0 && kvt__write_by(c->fd, &h, sizeof(h), by, NULL) == 0 && kvt__read_by(c->fd, &r, sizeof(r), by, NULL) == 0)
            rc = r.status == KVT_OK ? KVT_OK : kvt__err_known(r.status) ? r.status : KVT_EIO; /* the server's verdict */
        if (rc != KVT_OK) {
            if (c->fd >= 0) close(c->fd);
            close_all(x);
            return rc;
        }
    }
    return KVT_OK;
}

static int tcp_ctx_open(kvt_tier_t *t, void **out) {
    tcp_ctx_t *x = KVT_NEW(tcp_ctx_t);
    if (x == NULL) return KVT_ENOMEM;
    int rc = connect_all(t, x);
    if (rc != KVT_OK) {
        KVT_DELETE(x);
        return rc;
    }
    *out = x;
    return KVT_OK;
}

static void tcp_ctx_close(kvt_tier_t *t, void *ctx) {
    (void)t;
    close_all(ctx);
    KVT_DELETE((tcp_ctx_t *)ctx);
}

/* The length of the run at cursor at, and the cursor moved past it. */
static uint64_t run_len(cursor_t *at, const kvt__span_t *spans, uint32_t stride) {
    uint64_t left = spans[at->span].len - at->part, len = left < KVT_WIRE_MAX_DATA ? left : KVT_WIRE_MAX_DATA;
    at->part += len;
    if (at->part == spans[at->span].len) at->span += stride, at->part = 0;
    return len;
}

/* Sends what connection c can take now; -1 on a broken connection. */
static int pump_send(conn_t *c, const kvt__span_t *spans, size_t n, uint32_t stride) {
    while (c->send.span < n) {
        const kvt__span_t *s = &spans[c->send.span];
        cursor_t after = c->send;
        uint64_t len = run_len(&after, spans, stride);
        kvt__wire_data_t hdr = {s->dst_off + c->send.part, len};
        struct iovec iov[2];
        int k = 0;
        if (c->off < sizeof(hdr)) iov[k++] = (struct iovec){(uint8_t *)&hdr + c->off, sizeof(hdr) - c->off};
        size_t body = c->off > sizeof(hdr) ? c->off - sizeof(hdr) : 0;
        iov[k++] = (struct iovec){(uint8_t *)s->src + c->send.part + body, len - body};
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)k};
        ssize_t w = sendmsg(c->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
        c->off += (size_t)w;
        if (c->off < sizeof(hdr) + len) return 0; /* the socket is full */
        c->off = 0;
        c->unacked++;
        c->send = after;
    }
    return 0;
}

static int pump_acks(conn_t *c, const kvt__span_t *spans, uint32_t stride) {
    for (;;) {
        ssize_t r = recv(c->fd, c->ack_buf + c->ack_got, sizeof(c->ack_buf) - c->ack_got, MSG_DONTWAIT);
        if (r < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
        if (r == 0) return -1;
        c->ack_got += (size_t)r;
        if (c->ack_got == sizeof(c->ack_buf)) {
            uint64_t acked;
            memcpy(&acked, c->ack_buf, sizeof(acked));
            c->ack_got = 0;
            if (c->unacked == 0 || acked != run_len(&c->ack, spans, stride)) return -1; /* a confused peer */
            c->unacked--;
        }
    }
}

/* Whether the server closed a stream since the last batch (decode cuts a
 * rank's streams when it reports a hand-off of that rank failed): between
 * batches a stream has nothing to read, so anything readable is its end. */
static bool any_closed(const tcp_ctx_t *x) {
    struct pollfd pf[MAX_STREAMS];
    for (uint32_t i = 0; i < x->n; i++) pf[i] = (struct pollfd){x->c[i].fd, POLLIN | POLLRDHUP, 0};
    return x->n && poll(pf, x->n, 0) > 0;
}

static int tcp_copy(kvt_tier_t *t, void *ctx, const kvt__span_t *spans, size_t n) {
    tcp_ctx_t *x = ctx;
    if (any_closed(x)) close_all(x); /* then reopened, not failed on the first write */
    if (x->n == 0) { /* reopen after a failure */
        int rc = connect_all(t, x);
        if (rc != KVT_OK) return rc;
    }
    for (uint32_t i = 0; i < x->n; i++) {
        x->c[i].send = x->c[i].ack = (cursor_t){i, 0};
        x->c[i].off = 0;
        x->c[i].unacked = 0;
        x->c[i].ack_got = 0;
    }
    struct pollfd pf[MAX_STREAMS];
    uint64_t by = kvt_now_ns() + KVT_WIRE_STALL_NS;
    for (;;) {
        bool busy = false;
        for (uint32_t i = 0; i < x->n; i++) {
            conn_t *c = &x->c[i];
            if (pump_send(c, spans, n, x->n) != 0 || pump_acks(c, spans, x->n) != 0) {
                close_all(x);
                return KVT_EIO;
            }
            pf[i] = (struct pollfd){c->fd, (short)(POLLIN | (c->send.span < n ? POLLOUT : 0)), 0};
            busy |= c->send.span < n || c->unacked > 0;
        }
        if (!busy) return KVT_OK;
        uint64_t now = kvt_now_ns();
        int ready = now < by ? poll(pf, x->n, (int)((by - now + 999999) / 1000000)) : 0;
        if (ready > 0) by = kvt_now_ns() + KVT_WIRE_STALL_NS; /* progress */
        else if (ready == 0 || errno != EINTR) { /* none for KVT_WIRE_STALL_MS: the peer is gone (a signal: again) */
            close_all(x);
            return KVT_EIO;
        }
    }
}

const kvt__tier_ops_t kvt__tier_tcp_ops = {
    .name = "tcp",
    .host_visible = false,
    .open = tcp_open,
    .close = tcp_close,
    .write = NULL,
    .read = NULL,
    .ctx_open = tcp_ctx_open,
    .ctx_close = tcp_ctx_close,
    .copy = tcp_copy,
};
