/* kvtier bench pd — the hand-off path's throughput against one plain
 * socket's, in the same run: one process sends `total` bytes of pages to
 * another through the transfer engine and a `tcp` tier (runs coalesced,
 * several streams, acknowledged in place), and, interleaved with it, one
 * plain socket streams the same bytes between two processes (read into
 * memory, one acknowledgement at the end). ratio = engine / raw, medians of
 * --reps runs. The raw loop is one connection whatever --streams: the ratio
 * says what the hand-off path makes of the transport against its simplest
 * use, not against as many sockets. The pages are checked where they
 * landed once the runs are over. */
#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "util.h"
#include "commands.h"
#include "kvtier/error.h"
#include "kvtier/net.h"
#include "kvtier/tier.h"
#include "kvtier/xfer.h"

#define MAX_REPS 32

static const char *const TRANSPORTS[] = {"tcp", "ucx", NULL};

/* Word w of page p as the sender fills it and the receiver checks it: each
 * page its own, so a page landed in the wrong place is seen. */
static uint64_t page_word(uint64_t p, uint64_t w) { return (p + 1) * 0x9e3779b97f4a7c15ull ^ w * 0xbf58476d1ce4e5b9ull; }

/* Pages of pb bytes at base that differ from what the sender filled. */
static uint64_t wrong_pages(const uint8_t *base, uint64_t pages, uint64_t pb) {
    uint64_t bad = 0;
    for (uint64_t p = 0; p < pages; p++)
        for (uint64_t w = 0; w * 8 + 8 <= pb; w++) {
            uint64_t v;
            memcpy(&v, base + p * pb + w * 8, 8);
            if (v != page_word(p, w)) {
                bad++;
                break;
            }
        }
    return bad;
}

/* A child serving `pages` pages until its stdin pipe closes; *port set.
 * Then it checks what landed (outside every clock): exit 3 when a page is
 * not the sender's. */
static pid_t page_receiver(int transport, uint64_t pages, uint64_t pb, uint16_t *port, int *keep) {
    int p[2], q[2];
    if (pipe(p) != 0 || pipe(q) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        close(q[1]);
        kvt_tier_t *t;
        kvt_net_server_t *s = NULL;
        kvt_tier_config_t c = {.size = sizeof(c), .kind = KVT_TIER_ARENA, .name = "decode", .geom = {pages, 1, pb, KVT_LAYOUT_PAGE_FIRST}};
        uint16_t pt = 0;
        if (kvt_tier_create(&t, &c) == KVT_OK) {
            memset(kvt_tier_addr(t, 0, 0), 0, pages * pb); /* faulted in, like the raw receiver's buffer; before serving */
            if (kvt_net_server_create(&s, (kvt_net_transport_t)transport, t, "127.0.0.1", 0) == KVT_OK) pt = kvt_net_server_port(s);
        }
        if (write(p[1], &pt, sizeof(pt)) != (ssize_t)sizeof(pt) || pt == 0) _exit(1);
        char b;
        while (read(q[0], &b, 1) > 0) {
        }
        kvt_net_server_destroy(s);
#ifdef KVT_TESTING
        if (getenv("KVT_BENCH_PD_SPOIL")) memset(kvt_tier_addr(t, pages / 2, 0), 0, 8); /* a page gone wrong: seen? */
#endif
        uint64_t bad = wrong_pages(kvt_tier_addr(t, 0, 0), pages, pb);
        if (bad) fprintf(stderr, "kvtier bench pd: %" PRIu64 " of %" PRIu64 " pages landed wrong\n", bad, pages);
        _exit(bad ? 3 : 0);
    }
    close(p[1]);
    close(q[0]);
    *keep = q[1];
    if (pid < 0 || read(p[0], port, sizeof(*port)) != (ssize_t)sizeof(*port) || *port == 0) pid = -1;
    close(p[0]);
    return pid;
}

/* The baseline's own socket code: plain POSIX, nothing of kvtier's (a
 * baseline that shared the measured code would measure nothing). */
static int raw_send_all(int fd, const void *p, size_t n) {
    for (const char *c = p; n > 0;) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w <= 0) return -1;
        c += w, n -= (size_t)w;
    }
    return 0;
}

static int raw_recv_all(int fd, void *p, size_t n) {
    for (char *c = p; n > 0;) {
        ssize_t r = recv(fd, c, n, MSG_WAITALL);
        if (r <= 0) return -1;
        c += r, n -= (size_t)r;
    }
    return 0;
}

static int raw_connect(uint16_t port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) == 0)
        return fd;
    if (fd >= 0) close(fd);
    return -1;
}

/* A child reading `bytes` per round from one socket, acknowledging each. */
static pid_t raw_receiver(uint64_t bytes, uint16_t *port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof(a);
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(lfd, 1) != 0 ||
        getsockname(lfd, (struct sockaddr *)&a, &alen) != 0) {
        if (lfd >= 0) close(lfd);
        return -1;
    }
    *port = ntohs(a.sin_port);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = accept(lfd, NULL, NULL);
        uint8_t *buf = malloc(bytes);
        if (buf) memset(buf, 0, bytes); /* faulted in, as the page receiver's tier is after its first run */
        char ack = 1;
        while (fd >= 0 && buf && raw_recv_all(fd, buf, bytes) == 0 && raw_send_all(fd, &ack, 1) == 0) {
        }
        _exit(0);
    }
    close(lfd);
    return pid;
}

int cmd_bench_pd(int argc, char **argv) {
    uint64_t pb = 65536, total_mb = 256, streams = 4, reps = 5;
    int transport = 0;
    bool json = false;
    const cli_opt_t table[] = {
        {"transport", OPT_CHOICE, &transport, 0, 0, 0, 0, TRANSPORTS, NULL, 0, "how pages travel"},
        {"page-bytes", OPT_U64, &pb, 512, 1u << 30, 0, 0, NULL, NULL, 0, "bytes per page"},
        {"total-mb", OPT_U64, &total_mb, 1, 1 << 16, 0, 0, NULL, NULL, 0, "MiB per run"},
        {"streams", OPT_U64, &streams, 1, 64, 0, 0, NULL, NULL, 0, "connections of the hand-off path"},
        {"reps", OPT_U64, &reps, 1, MAX_REPS, 0, 0, NULL, NULL, 0, "runs of each (the median is reported)"},
        {"json", OPT_FLAG, &json, 0, 0, 0, 0, NULL, NULL, 0, "print one JSON object"},
        {NULL, 0, NULL, 0, 0, 0, 0, NULL, NULL, 0, NULL},
    };
    cli_t c;
    cli_init(&c, "kvtier bench pd", argc, argv);
    const char *path;
    int prc = cli_parse_table(&c, table, "usage: kvtier bench pd [--transport tcp] [--page-bytes B] [--total-mb M] [--json]\n", &path);
    if (prc) return prc > 0 ? 0 : 2;
    if (path) return cli_unknown(&c), 2;
    if (transport == KVT_NET_UCX && !kvt_net_ucx_built()) {
        c.flag = "--transport";
        return cli_usage(&c, "ucx: this build has no UCX (install libucx-dev and rebuild)");
    }
    uint64_t pages = total_mb * 1048576ull / pb, bytes = pages * pb;
    if (pages == 0) {
        c.flag = "--page-bytes";
        return cli_usage(&c, "larger than --total-mb");
    }
    double mem = cli_machine_memory(); /* the sender's pages, the receiver's, the raw loop's buffer and its receiver's */
    if (4.0 * (double)bytes > 0.6 * mem) {
        c.flag = "--total-mb";
        return cli_usage(&c, "%" PRIu64 " MiB a run needs 4 x that (both sides of both loops): more than 60%% of this "
                             "machine's %.1f GiB", total_mb, mem / 1073741824.0);
    }
    if (cli_parse_only) return 0;
    uint16_t port = 0, raw_port = 0;
    int keep = -1;
    pid_t rx = page_receiver(transport, pages, pb, &port, &keep), raw = raw_receiver(bytes, &raw_port);
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
    kvt_tier_t *t[2] = {NULL, NULL};
    kvt_tier_config_t sc = {.size = sizeof(sc), .kind = KVT_TIER_ARENA, .name = "prefill", .geom = {pages, 1, pb, KVT_LAYOUT_PAGE_FIRST}};
    kvt_tier_config_t rc_ = {.size = sizeof(rc_), .kind = transport == KVT_NET_UCX ? KVT_TIER_UCX : KVT_TIER_TCP, .name = addr, .streams = (uint32_t)streams,
                             .geom = {pages, 1, pb, KVT_LAYOUT_PAGE_FIRST}};
    kvt_xfer_t *x = NULL;
    kvt_xfer_config_t xc;
    kvt_xfer_config_default(&xc);
    xc.max_batch_bytes = 16ull << 20;
    kvt_xfer_copy_t *cp = malloc(pages * sizeof(*cp));
    uint8_t *buf = malloc(bytes);
    int rfd = raw > 0 ? raw_connect(raw_port) : -1;
    int rc = rx > 0 && raw > 0 && rfd >= 0 && cp && buf ? KVT_OK : KVT_EIO;
    if (cp == NULL || buf == NULL)
        fprintf(stderr, "kvtier bench pd: out of memory for %" PRIu64 " MiB of pages\n", total_mb), rc = KVT_ENOMEM;
    else if (rx <= 0 || raw <= 0)
        fprintf(stderr, "kvtier bench pd: could not start the receivers\n");
    else if (rfd < 0)
        fprintf(stderr, "kvtier bench pd: could not connect to the raw loop's receiver\n");
    if (rc == KVT_OK) rc = kvt_tier_create(&t[0], &sc);
    if (rc == KVT_OK) rc = kvt_tier_create(&t[1], &rc_);
    if (rc == KVT_OK) rc = kvt_xfer_create(&x, &xc, t, 2);
    double eng[MAX_REPS], rawg[MAX_REPS];
    if (rc == KVT_OK) {
        uint8_t *src = kvt_tier_addr(t[0], 0, 0);
        for (uint64_t p = 0; p < pages; p++)
            for (uint64_t w = 0; w * 8 + 8 <= pb; w++) {
                uint64_t v = page_word(p, w);
                memcpy(src + p * pb + w * 8, &v, 8);
            }
        memset(buf, 0xa5, bytes);
        for (uint64_t i = 0; i < pages; i++) cp[i] = (kvt_xfer_copy_t){(uint32_t)i, (uint32_t)i};
    }
    for (uint64_t r = 0; r < reps && rc == KVT_OK; r++) {
        uint64_t t0 = now_ns();
        kvt_xfer_done_t d;
        rc = kvt_xfer_submit(x, 0, 1, cp, pages, 0, NULL);
        while (rc == KVT_OK && kvt_xfer_poll(x, &d, 1, 1000000000ull) == 0) {
        }
        if (rc == KVT_OK) rc = d.status;
        eng[r] = (double)bytes / (double)(now_ns() - t0);
        t0 = now_ns();
        char ack;
        if (rc == KVT_OK && (raw_send_all(rfd, buf, bytes) != 0 || raw_recv_all(rfd, &ack, 1) != 0)) rc = KVT_EIO;
        rawg[r] = (double)bytes / (double)(now_ns() - t0);
    }
    if (rfd >= 0) close(rfd);
    kvt_xfer_destroy(x);
    kvt_tier_destroy(t[1]);
    kvt_tier_destroy(t[0]);
    if (keep >= 0) close(keep);
    int rx_status = 0;
    if (rx > 0) waitpid(rx, &rx_status, 0);
    if (rc == KVT_OK && rx > 0 && !(WIFEXITED(rx_status) && WEXITSTATUS(rx_status) == 0)) rc = KVT_ECORRUPT; /* it said which */
    if (raw > 0) waitpid(raw, NULL, 0);
    free(cp);
    free(buf);
    if (rc != KVT_OK) {
        fprintf(stderr, "kvtier bench pd: %s\n", kvt_strerror(rc));
        return 1;
    }
    double g = median_of(eng, reps), rg = median_of(rawg, reps); /* sorted: [0] and [reps-1] are the extremes */
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "transport", TRANSPORTS[transport]);
        cJSON_AddNumberToObject(o, "page_bytes", (double)pb);
        cJSON_AddNumberToObject(o, "total_mb", (double)total_mb);
        cJSON_AddNumberToObject(o, "bytes", (double)bytes); /* a run's: whole pages of --total-mb */
        cJSON_AddNumberToObject(o, "streams", (double)streams);
        cJSON_AddNumberToObject(o, "reps", (double)reps);
        cJSON_AddNumberToObject(o, "gbps", g);
        cJSON_AddNumberToObject(o, "raw_tcp_gbps", rg);
        cJSON_AddNumberToObject(o, "ratio", rg > 0 ? g / rg : 0);
        cJSON_AddNumberToObject(o, "gbps_min", eng[0]);
        cJSON_AddNumberToObject(o, "gbps_max", eng[reps - 1]);
        cli_print_json(o);
    } else {
        printf("kvtier bench pd: %s, %" PRIu64 " pages of %" PRIu64 " B (%.1f MiB), %" PRIu64 " streams, median of %" PRIu64
               ": hand-off %.2f GB/s, raw socket %.2f GB/s, ratio %.3f\n",
               TRANSPORTS[transport], pages, pb, (double)bytes / 1048576.0, streams, reps, g, rg, rg > 0 ? g / rg : 0);
    }
    return 0;
}
