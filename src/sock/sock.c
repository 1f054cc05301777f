/* Socket helpers (src/sock/wire.h): whole reads and writes, addresses,
 * listening and connecting on TCP. The bottom of the network stack: the tcp
 * tier, the page server and the PD hand-off use them; they use nothing of
 * kvtier but the error codes. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvtier/error.h"
#include "kvtier/stats.h"
#include "wire.h"

int kvt__read_full(int fd, void *buf, size_t len) {
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t r = read(fd, p, len);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        len -= (size_t)r;
    }
    return 0;
}

/* Waits for fd to be ready (events) in slices of at most 100 ms, watching
 * the deadline and *halt between them: 0 ready, -1 given up. */
static int wait_ready(int fd, short events, uint64_t deadline_ns, const _Atomic(bool) *halt) {
    for (;;) {
        if (halt && atomic_load(halt)) return -1;
        uint64_t now = kvt_now_ns(), slice = 100000000ull;
        if (deadline_ns && now >= deadline_ns) return -1;
        if (deadline_ns && deadline_ns - now < slice) slice = deadline_ns - now;
        struct pollfd pf = {fd, events, 0};
        int n = poll(&pf, 1, (int)((slice + 999999) / 1000000));
        if (n > 0) return 0; /* readable, writable, or an error the next call reports */
        if (n < 0 && errno != EINTR) return -1;
    }
}

int kvt__read_by(int fd, void *buf, size_t len, uint64_t deadline_ns, const _Atomic(bool) *halt) {
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t r = recv(fd, p, len, MSG_DONTWAIT);
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (wait_ready(fd, POLLIN, deadline_ns, halt) != 0) return -1;
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        len -= (size_t)r;
    }
    return 0;
}

int kvt__write_by(int fd, const void *buf, size_t len, uint64_t deadline_ns, const _Atomic(bool) *halt) {
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t w = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (wait_ready(fd, POLLOUT, deadline_ns, halt) != 0) return -1;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

int kvt__write_full(int fd, const void *buf, size_t len) {
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t w = send(fd, p, len, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

int kvt__parse_addr(const char *addr, struct sockaddr_in *sa) {
    char host[64];
    const char *colon = addr ? strrchr(addr, ':') : NULL;
    if (colon == NULL || (size_t)(colon - addr) >= sizeof(host)) return -1;
    char *end;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (colon[1] < '0' || colon[1] > '9' || *end != '\0' || port > 65535) return -1; /* digits only: no blank, no sign */
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    *sa = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    return inet_pton(AF_INET, host, &sa->sin_addr) == 1 ? 0 : -1;
}

int kvt__tcp_listen(const struct sockaddr_in *a, uint16_t *port) {
    struct sockaddr_in b = *a;
    socklen_t len = sizeof(b);
    int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(fd, (struct sockaddr *)&b, sizeof(b)) != 0 || listen(fd, 64) != 0 ||
        getsockname(fd, (struct sockaddr *)&b, &len) != 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    *port = ntohs(b.sin_port);
    return fd;
}

/* Non-blocking, so that a peer whose SYNs go unanswered (a full accept
 * queue, a dropped route, a dead host) is given up at the deadline, not
 * after the kernel's retries (over two minutes), and a signal does not fail
 * it. */
int kvt__tcp_connect(const char *addr) {
    struct sockaddr_in sa;
    if (kvt__parse_addr(addr, &sa) != 0) return -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    int err = 0;
    socklen_t elen = sizeof(err);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 &&
        (errno != EINPROGRESS || wait_ready(fd, POLLOUT, kvt_now_ns() + KVT_WIRE_STALL_NS, NULL) != 0 ||
         getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0 || err != 0)) {
        close(fd);
        return -1;
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) { /* the callers' reads and writes block */
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}
