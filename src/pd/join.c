/* The receiver's join phase: who may take a rank's slot.
 *
 *   control port --accept--> pending[<= 128], each with its own 2 s deadline
 *        read without blocking until 32 bytes: header + HELLO{rank, C, token}
 *        ok ----------------> fd[rank] (taken once), WELCOME sent
 *        anything else -----> dropped: counted, the reason kept
 *
 * A peer that says nothing in time, closes first, sends anything but a whole
 * hello of this version, lacks the token, names a wrong group size or a rank
 * outside the group, or names a rank whose slot is taken is dropped; the real
 * ranks join past any number of them. The phase ends when every rank has
 * joined (the silent peers left are dropped then, and the listener closed),
 * at the join deadline, or when the receiver stops. Runs on the control
 * thread; r->mu is held except while waiting in poll. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "kvtier/stats.h"
#include "kvtier/error.h"
#include "pd-int.h"

typedef struct pending {
    int fd;
    uint64_t deadline;
    size_t got;
    uint8_t buf[sizeof(kvt__pd_hdr_t) + sizeof(kvt__pd_hello_t)];
} pending_t;


static void drop(kvt_pd_receiver_t *r, int fd, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void drop(kvt_pd_receiver_t *r, int fd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->st.control_last_error, sizeof(r->st.control_last_error), fmt, ap);
    va_end(ap);
    r->st.control_bad_peers++;
    close(fd);
}

static int welcome(kvt_pd_receiver_t *r, int fd) {
    const kvt_geom_t *g = kvt_tier_geom(r->cfg.pool);
    kvt__pd_welcome_t w = {g->pages, g->layer_bytes, g->layers, (uint32_t)g->layout, r->cfg.generation, 0, r->cfg.resume_from};
    return kvt__pd_send(fd, KVT_PD_WELCOME, &w, NULL, 0, kvt__pd_bound(r));
}

/* A whole hello from p: a rank's slot, taken once; anything else drops it. */
static void on_hello(kvt_pd_receiver_t *r, pending_t *p) {
    kvt__pd_hdr_t h;
    kvt__pd_hello_t m;
    memcpy(&h, p->buf, sizeof(h));
    memcpy(&m, p->buf + sizeof(h), sizeof(m));
    if (h.magic != KVT_PD_MAGIC) return drop(r, p->fd, "control port: not a kvtier pd hello (magic %08x)", h.magic);
    if (h.version != KVT_PD_VERSION)
        return drop(r, p->fd, "control port: a pd hello of protocol version %u (this decode speaks %u)", h.version, KVT_PD_VERSION);
    if (!kvt__pd_header_ok(&h, 1u << KVT_PD_HELLO))
        return drop(r, p->fd, "control port: not a kvtier pd hello (message type %u, length %u)", h.type, h.length);
    if (m.token != r->cfg.token) return drop(r, p->fd, "control port: a hello for rank %u without the group's token", m.rank);
    if (m.ranks != r->cfg.ranks || m.rank >= r->cfg.ranks)
        return drop(r, p->fd, "control port: a hello for rank %u of %u (the group has %u)", m.rank, m.ranks, r->cfg.ranks);
    if (r->fd[m.rank] >= 0 || r->dead[m.rank] || r->finished[m.rank])
        return drop(r, p->fd, "control port: rank %u said hello twice", m.rank);
    int fl = fcntl(p->fd, F_GETFL), one = 1; /* replies are small and awaited: never hold them back */
    if (fl < 0 || fcntl(p->fd, F_SETFL, fl & ~O_NONBLOCK) != 0 ||
        setsockopt(p->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0 || welcome(r, p->fd) != 0)
        return drop(r, p->fd, "control port: rank %u: cannot set up its socket", m.rank);
    r->fd[m.rank] = p->fd;
    r->st.joined++;
}

/* Reads what p sent; true when p is finished with (joined or dropped). */
static bool read_pending(kvt_pd_receiver_t *r, pending_t *p) {
    ssize_t n = recv(p->fd, p->buf + p->got, sizeof(p->buf) - p->got, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        drop(r, p->fd, "control port: a peer closed before its hello");
        return true;
    }
    if (n > 0 && (p->got += (size_t)n) == sizeof(p->buf)) {
        on_hello(r, p);
        return true;
    }
    return false;
}

static void accept_one(kvt_pd_receiver_t *r, pending_t *pend, uint32_t *np, uint64_t now) {
    int fd = accept4(r->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    if (*np == KVT_PD_MAX_PENDING) { /* the oldest goes, not the newcomer: silent peers cannot keep a rank out */
        uint32_t old = 0;
        for (uint32_t i = 1; i < *np; i++)
            if (pend[i].deadline < pend[old].deadline) old = i;
        drop(r, pend[old].fd, "control port: more than %d peers awaiting their hello: the oldest dropped", KVT_PD_MAX_PENDING);
        pend[old] = pend[--*np];
    }
    pend[(*np)++] = (pending_t){.fd = fd, .deadline = now + KVT_PD_HELLO_TIMEOUT_MS * 1000000ull};
}

int kvt__pd_join(kvt_pd_receiver_t *r) {
    pending_t pend[KVT_PD_MAX_PENDING];
    uint32_t np = 0, C = r->cfg.ranks;
    uint64_t deadline = r->t_create + r->cfg.join_timeout_ms * 1000000ull;
    int rc = KVT_ETIMEDOUT;
    pthread_mutex_lock(&r->mu);
    while (!r->stopping && r->st.joined < C) {
        struct pollfd pf[KVT_PD_MAX_PENDING + 2];
        pf[0] = (struct pollfd){r->lfd, POLLIN, 0};
        pf[1] = (struct pollfd){r->wakefd, POLLIN, 0};
        for (uint32_t i = 0; i < np; i++) pf[i + 2] = (struct pollfd){pend[i].fd, POLLIN, 0};
        pthread_mutex_unlock(&r->mu);
        int n = poll(pf, np + 2, 50);
        pthread_mutex_lock(&r->mu);
        uint64_t now = kvt_now_ns();
        if (r->stopping || now > deadline) break;
        for (uint32_t i = np; i-- > 0;) { /* backwards: a finished entry takes the last one's place */
            bool done = n > 0 && pf[i + 2].revents && read_pending(r, &pend[i]);
            if (!done && now > pend[i].deadline) {
                drop(r, pend[i].fd, "control port: a peer said no hello within %d ms", KVT_PD_HELLO_TIMEOUT_MS);
                done = true;
            }
            if (done) pend[i] = pend[--np];
        }
        if (n > 0 && (pf[0].revents & POLLIN)) accept_one(r, pend, &np, now);
    }
    if (r->st.joined == C) rc = KVT_OK;
    for (uint32_t i = 0; i < np; i++) /* the group is complete (or failed): the silent ones go */
        drop(r, pend[i].fd, "control port: a peer still without a hello when the group was complete");
    close(r->lfd);
    r->lfd = -1;
    pthread_mutex_unlock(&r->mu);
    return rc;
}
