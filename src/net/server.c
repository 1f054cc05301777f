/* The page server (include/kvtier/net.h): an accept thread, and a thread per
 * connection that reads the hello, then runs straight into the tier.
 *
 * Destroy shuts every socket down (which wakes the threads blocked on them)
 * and joins them. Connections are kept in a list; a connection's thread
 * marks it finished, and the accept thread reaps finished ones. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../core/abi-int.h"
#include "kvtier/error.h"
#include "kvtier/net.h"
#include "kvtier/stats.h"
#include "../core/mem-int.h"
#include "net-int.h"
#include "../sock/wire.h"

typedef struct sconn {
    struct sconn *next;
    kvt_net_server_t *s;
    int fd;
    pthread_t th;
    bool finished; /* under s->mu */
    bool greeting; /* not yet through its hello; under s->mu */
    int writer;    /* the writer its hello named (-1: none); under s->mu */
} sconn_t;

/* Connections in their hello at once: past it the oldest is closed, so
 * that peers that connect and say nothing (a thread and a descriptor each
 * for up to 5 s) cannot keep a rank out, as on decode's control port. */
#define MAX_GREETING 128

void kvt__net_note(kvt_net_server_t *s, uint64_t *counter, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&s->mu);
    if (counter) (*counter)++;
    vsnprintf(s->st.last_error, sizeof(s->st.last_error), fmt, ap);
    pthread_mutex_unlock(&s->mu);
    va_end(ap);
}

void kvt__net_count(kvt_net_server_t *s, uint64_t len) {
    pthread_mutex_lock(&s->mu);
    s->st.runs++;
    s->st.bytes += len;
    pthread_mutex_unlock(&s->mu);
}

int kvt_net_server_set_token(kvt_net_server_t *s, uint64_t token) {
    if (s == NULL) return KVT_EINVAL;
    atomic_store(&s->token, token);
    return KVT_OK;
}

void kvt__net_set_writers(kvt_net_server_t *s, uint32_t n) { atomic_store(&s->writers, n); }

/* The writer a token names: 0..writers-1, -1 for the group's own token (or
 * none asked), -2 for a token the server does not take. */
static int writer_of(kvt_net_server_t *s, uint64_t t) {
    uint64_t token = atomic_load(&s->token);
    if (token == 0 || t == token) return -1;
    for (uint32_t w = 0, n = atomic_load(&s->writers); w < n; w++)
        if (t == kvt__wire_writer_token(token, w)) return (int)w;
    return -2;
}

int kvt__net_check_hello(kvt_net_server_t *s, const kvt__wire_hello_t *h, size_t len, kvt__wire_reply_t *r) {
    const kvt_geom_t *g = &s->geom;
    *r = (kvt__wire_reply_t){KVT_OK, "ok"};
    if (len != sizeof(*h) || h->magic != KVT_WIRE_MAGIC) {
        r->status = KVT_EINVAL;
        snprintf(r->message, sizeof(r->message), "not a kvtier peer");
        kvt__net_note(s, &s->st.bad_peers, "not a kvtier peer (bad hello)");
        return -1;
    }
    if (h->version != KVT_WIRE_VERSION) { /* a kvtier of another release: told why */
        r->status = KVT_EINVAL;
        snprintf(r->message, sizeof(r->message), "wire version %u; this server speaks %u", h->version, KVT_WIRE_VERSION);
        kvt__net_note(s, &s->st.refused, "a peer of %s", r->message);
        return 1;
    }
    if (writer_of(s, h->token) == -2) {
        r->status = KVT_EINVAL;
        snprintf(r->message, sizeof(r->message), "refused: not this server's token");
        kvt__net_note(s, &s->st.refused, "a peer without this server's token: refused");
        return 1;
    }
    if (h->pages != g->pages || h->layers != g->layers || h->layer_bytes != g->layer_bytes || h->layout != (uint32_t)g->layout) {
        r->status = KVT_EINVAL;
        snprintf(r->message, sizeof(r->message), "geometry differs: peer %llu pages x %u layers x %llu B, here %llu x %u x %llu",
                 (unsigned long long)h->pages, h->layers, (unsigned long long)h->layer_bytes, (unsigned long long)g->pages,
                 g->layers, (unsigned long long)g->layer_bytes);
        kvt__net_note(s, &s->st.refused, "%s", r->message);
        return 1;
    }
    return 0;
}

bool kvt__net_run_ok(const kvt_net_server_t *s, const kvt__wire_data_t *d) {
    return d->len > 0 && d->len <= KVT_WIRE_MAX_DATA && d->off <= s->bytes && d->len <= s->bytes - d->off;
}

/* The hello: the writer's geometry must be the tier's; c->writer its name. */
static bool greet(sconn_t *c) {
    kvt_net_server_t *s = c->s;
    int fd = c->fd, *writer = &c->writer;
    kvt__wire_hello_t h;
    kvt__wire_reply_t r;
    bool heard = kvt__read_by(fd, &h, sizeof(h), kvt_now_ns() + 5000000000ull, NULL) == 0; /* 5 s for all of it */
    pthread_mutex_lock(&s->mu);
    s->st.awaiting_hello--;
    if (c->greeting) s->greeting--, c->greeting = false;
    pthread_mutex_unlock(&s->mu);
    if (!heard) {
        bool stopping;
        pthread_mutex_lock(&s->mu);
        stopping = s->stopping;
        pthread_mutex_unlock(&s->mu);
        if (!stopping) kvt__net_note(s, &s->st.bad_peers, "a peer closed or sent no whole hello within 5 s (fd %d): closed", fd);
        return false;
    }
    int v = kvt__net_check_hello(s, &h, sizeof(h), &r);
    if (v < 0) return false; /* not ours: no reply, just close */
    if (v == 0) { /* named and checked against the barred in one step: kvt__net_bar's fence sees it */
        pthread_mutex_lock(&s->mu);
        int w = writer_of(s, h.token);
        bool barred = w >= 0 && (s->barred >> w & 1);
        *writer = barred ? -1 : w;
        pthread_mutex_unlock(&s->mu);
        if (barred) {
            r = (kvt__wire_reply_t){KVT_EINVAL, ""};
            snprintf(r.message, sizeof(r.message), "refused: writer %d has left its group", w);
            kvt__net_note(s, &s->st.refused, "writer %d, which left its group, came back: refused", w);
            v = 1;
        }
    }
    return kvt__write_full(fd, &r, sizeof(r)) == 0 && v == 0;
}

/* A writer that stops in the middle of a run (its header, its bytes, or
 * taking its ack) this long is gone: its thread and descriptor go back. */
static uint64_t stall_by(void) { return kvt_now_ns() + KVT_WIRE_STALL_NS; }

/* len bytes, the deadline renewed a MiB at a time (a 1 GiB run on a slow
 * link takes long, but never stalls): 0; 1 the peer closed or was shut
 * down; -1 it stalled. */
static int read_stalling(int fd, uint8_t *p, uint64_t len) {
    for (uint64_t at = 0; at < len;) {
        uint64_t piece = len - at < (1u << 20) ? len - at : (1u << 20), by = stall_by();
        if (kvt__read_by(fd, p + at, piece, by, NULL) != 0) return kvt_now_ns() >= by ? -1 : 1;
        at += piece;
    }
    return 0;
}

/* One writer's connection: its hello, then runs until it closes. Between
 * runs it may be idle for as long as it likes (a writer keeps its streams
 * open between copies; keepalive finds a peer host that went away). */
static void serve_conn(sconn_t *c) {
    kvt_net_server_t *s = c->s;
    int fd = c->fd;
    bool ok = greet(c);
    struct timeval none = {0, 0}; /* greeted: runs may be far apart */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof(none));
    if (!ok) return;
    for (;;) {
        kvt__wire_data_t d;
        if (kvt__read_full(fd, &d, 1) != 0) return; /* the writer is done (or gone) */
        int rc = read_stalling(fd, (uint8_t *)&d + 1, sizeof(d) - 1);
        if (rc != 0) {
            if (rc < 0) kvt__net_note(s, &s->st.bad_peers, "a run's header stalled %d s (fd %d); connection closed",
                                      KVT_WIRE_STALL_MS / 1000, fd);
            return;
        }
        if (!kvt__net_run_ok(s, &d)) {
            kvt__net_note(s, &s->st.bad_peers, "a run of %llu bytes at %llu (fd %d): %s; connection closed",
                          (unsigned long long)d.len, (unsigned long long)d.off, fd,
                          d.len == 0 ? "empty" : d.len > KVT_WIRE_MAX_DATA ? "over 1 GiB" : "past the end of the tier");
            return;
        }
        if ((rc = read_stalling(fd, s->base + d.off, d.len)) != 0) {
            if (rc < 0) kvt__net_note(s, &s->st.bad_peers, "a run of %llu bytes at %llu stalled %d s (fd %d); connection "
                                      "closed", (unsigned long long)d.len, (unsigned long long)d.off,
                                      KVT_WIRE_STALL_MS / 1000, fd);
            return;
        }
        /* counted before the ack: a reader that learns of the ack (through
         * whatever channel) and then reads the stats sees the bytes */
        kvt__net_count(s, d.len);
        uint64_t ack = d.len;
        if (kvt__write_by(fd, &ack, sizeof(ack), stall_by(), NULL) != 0) return;
    }
}

void kvt__net_serve_conn(kvt_net_server_t *s, int fd, int *writer) {
    sconn_t c = {.s = s, .fd = fd, .writer = -1}; /* (not counted among those greeting) */
    serve_conn(&c);
    if (writer) {
        pthread_mutex_lock(&s->mu);
        *writer = c.writer;
        pthread_mutex_unlock(&s->mu);
    }
}

static void *conn_main(void *arg) {
    sconn_t *c = arg;
    serve_conn(c);
    kvt_net_server_t *s = c->s;
    shutdown(c->fd, SHUT_RDWR);
    pthread_mutex_lock(&s->mu);
    c->finished = true;
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

void kvt__net_bar(kvt_net_server_t *s, int w) {
    pthread_mutex_lock(&s->mu);
    s->barred |= 1ull << w;
    pthread_mutex_unlock(&s->mu);
    kvt__net_fence(s, w);
}

void kvt__net_fence(kvt_net_server_t *s, int w) {
    if (s->tr != KVT_NET_TCP) return;
    for (int i = 0; i < 2000; i++) { /* a reading thread sees its socket shut at once: 2 s is far */
        bool open = false;
        pthread_mutex_lock(&s->mu);
        for (sconn_t *c = s->conns; c; c = c->next)
            if (c->writer == w && !c->finished) {
                if (i == 0) shutdown(c->fd, SHUT_RDWR); /* the fd stays open until reaped: not reused meanwhile */
                open = true;
            }
        pthread_mutex_unlock(&s->mu);
        if (!open) return;
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
}

/* Joins and frees finished connections (all of them when stopping). */
static void reap(kvt_net_server_t *s, bool all) {
    for (;;) {
        sconn_t *done = NULL;
        pthread_mutex_lock(&s->mu);
        for (sconn_t **p = &s->conns; *p; p = &(*p)->next)
            if ((*p)->finished || all) {
                done = *p;
                *p = done->next;
                break;
            }
        pthread_mutex_unlock(&s->mu);
        if (done == NULL) return;
        if (all) shutdown(done->fd, SHUT_RDWR);
        pthread_join(done->th, NULL);
        close(done->fd);
        KVT_DELETE(done);
    }
}

static void *accept_main(void *arg) {
    kvt_net_server_t *s = arg;
    for (;;) {
        struct pollfd pf = {s->lfd, POLLIN, 0};
        int ready = poll(&pf, 1, 1000); /* with no newcomer, finished connections' fds still go back within a second */
        int fd = ready > 0 ? accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC) : -1;
        if (ready == 0 || (ready < 0 && errno == EINTR)) errno = EINTR; /* (not an accept error: go round) */
        pthread_mutex_lock(&s->mu);
        bool stopping = s->stopping;
        pthread_mutex_unlock(&s->mu);
        if (stopping) {
            if (fd >= 0) close(fd);
            return NULL;
        }
        reap(s, false);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == ENOBUFS) { /* out of fds: wait, go on */
                kvt__net_note(s, NULL, "accept: out of descriptors or memory (errno %d); retrying", errno);
                struct timespec ts = {0, 10000000};
                nanosleep(&ts, NULL);
                continue;
            }
            if (errno != EINTR && errno != ECONNABORTED) { /* (accept(2): network errors are to be retried) */
                kvt__net_note(s, NULL, "accept: errno %d; retrying", errno);
                struct timespec ts = {0, 10000000};
                nanosleep(&ts, NULL);
            }
            continue;
        }
        struct timeval tv = {5, 0}; /* a peer that says nothing is not waited for long */
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        int one = 1; /* acks are small: never hold them back */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one)); /* an idle writer's host that went away */
        sconn_t *c = KVT_NEW(sconn_t);
        if (c == NULL) {
            close(fd);
            continue;
        }
        c->s = s;
        c->fd = fd;
        c->writer = -1;
        c->greeting = true;
        pthread_mutex_lock(&s->mu);
        if (s->greeting >= MAX_GREETING) { /* the oldest in its hello goes (the list is newest first) */
            sconn_t *oldest = NULL;
            for (sconn_t *o = s->conns; o; o = o->next)
                if (o->greeting) oldest = o;
            if (oldest) { /* its hello read ends now; the fd stays until reaped */
                shutdown(oldest->fd, SHUT_RDWR);
                oldest->greeting = false;
                s->greeting--;
            }
        }
        s->greeting++;
        s->st.connections++;
        s->st.awaiting_hello++;
        c->next = s->conns;
        s->conns = c;
        pthread_mutex_unlock(&s->mu);
        if (pthread_create(&c->th, NULL, conn_main, c) != 0) { /* no thread: no connection */
            pthread_mutex_lock(&s->mu);
            s->conns = c->next; /* still the head: only this thread adds */
            s->st.awaiting_hello--;
            s->greeting--;
            pthread_mutex_unlock(&s->mu);
            close(fd);
            KVT_DELETE(c);
        }
    }
}

static int tcp_start(kvt_net_server_t *s, const struct sockaddr_in *a) {
    s->lfd = kvt__tcp_listen(a, &s->port);
    if (s->lfd >= 0 && pthread_create(&s->accept_th, NULL, accept_main, s) == 0) return KVT_OK;
    if (s->lfd >= 0) close(s->lfd);
    return KVT_EIO;
}

static void tcp_stop(kvt_net_server_t *s) {
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_mutex_unlock(&s->mu);
    shutdown(s->lfd, SHUT_RDWR); /* wakes accept */
    pthread_join(s->accept_th, NULL);
    close(s->lfd);
    reap(s, true);
}

const kvt__server_ops_t kvt__server_tcp_ops = {"tcp", tcp_start, tcp_stop};

/* The tier as one region of host memory, through its public API: refused
 * when the CPU cannot write it (a cuda tier), or when it is not one region
 * (an engine tier's planes, a network tier). */
static int tier_region(kvt_tier_t *t, uint8_t **base, uint64_t *bytes) {
    kvt_tier_info_t info = {.size = sizeof(info)};
    const kvt_geom_t *g = kvt_tier_geom(t);
    if (!kvt_tier_host_visible(t) || kvt_tier_kind(t) == KVT_TIER_ENGINE || kvt_tier_info(t, &info) != KVT_OK) return KVT_EINVAL;
    if (kvt_tier_sums(t)) return KVT_EINVAL; /* runs land straight in its pages: their sums would go stale */
    *base = kvt_tier_addr(t, 0, 0);
    *bytes = g->pages * kvt_geom_page_bytes(g);
    return *base != NULL && info.bytes >= *bytes ? KVT_OK : KVT_EINVAL;
}

int kvt_net_server_create(kvt_net_server_t **out, kvt_net_transport_t tr, kvt_tier_t *t, const char *host,
                          uint16_t port) {
    uint8_t *base;
    uint64_t bytes;
    if (out == NULL || t == NULL || host == NULL || (unsigned)tr > KVT_NET_UCX || tier_region(t, &base, &bytes) != KVT_OK)
        return KVT_EINVAL;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1) return KVT_EINVAL;
    if (tr == KVT_NET_UCX && !kvt_net_ucx_built()) return KVT_ENOTSUP;
    kvt_net_server_t *s = KVT_NEW(kvt_net_server_t);
    if (s == NULL) return KVT_ENOMEM;
    *s = (kvt_net_server_t){.t = t, .base = base, .bytes = bytes, .geom = *kvt_tier_geom(t), .tr = tr,
                            .ops = tr == KVT_NET_UCX ? &kvt__server_ucx_ops : &kvt__server_tcp_ops, .lfd = -1};
    s->st.size = sizeof(s->st);
    pthread_mutex_init(&s->mu, NULL);
    int rc = s->ops->start(s, &a);
    if (rc != KVT_OK) {
        pthread_mutex_destroy(&s->mu);
        KVT_DELETE(s);
        return rc;
    }
    *out = s;
    return KVT_OK;
}

uint16_t kvt_net_server_port(const kvt_net_server_t *s) { return s ? s->port : 0; }

void kvt_net_server_destroy(kvt_net_server_t *s) {
    if (s == NULL) return;
    s->ops->stop(s);
    pthread_mutex_destroy(&s->mu);
    KVT_DELETE(s);
}

int kvt_net_server_stats(kvt_net_server_t *s, kvt_net_server_stats_t *st) {
    if (s == NULL || st == NULL) return KVT_EINVAL;
    pthread_mutex_lock(&s->mu);
    kvt_net_server_stats_t full = s->st;
    pthread_mutex_unlock(&s->mu);
    full.size = sizeof(full);
    return kvt__abi_out(st, &full, sizeof(full));
}
