/* Bad peers a receiver opens against its own two ports
 * (kvt_pd_receiver_test_peers), so that they are first in line before any
 * rank knows the ports — no race to win.
 *
 *   control port: stall (connects, says nothing), rank0 (a hello for rank 0
 *                 without the token), garbage (32 bytes of 0xA5), half (a
 *                 hello's header and half its body, then silence)
 *   data port:    peers with the group's token that misbehave: data-garbage,
 *                 data-geometry (a page size off by one), data-huge (a run of
 *                 2^40 bytes), data-outside (a run past the pool), data-wrap
 *                 (an offset whose end wraps), data-stall, data-half-hello
 *                 (half a hello, then silence); and data-half, a peer
 *                 without it: a hello, a run of one page at page 0 and half
 *                 its bytes, then silence (refused at its hello: before the
 *                 data port asked for the token its half page landed in page
 *                 0 while hand-offs used it)
 *   hold:MS       only tells the caller to hold its ports back MS ms
 *
 * "word:N" opens N of them. The data-port ones are waited for (up to 5 s)
 * until the page server has judged them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvtier/stats.h"
#include "kvtier/error.h"
#include "kvtier/testing.h"
#include "../sock/wire.h"
#include "../pd/pd-int.h"

static int peer(kvt_pd_receiver_t *r, uint16_t port) {
    char addr[32];
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
    int fd = r->npeers < KVT_PD_MAX_TEST_PEERS ? kvt__tcp_connect(addr) : -1;
    if (fd >= 0) r->peers[r->npeers++] = fd;
    return fd;
}

/* One peer of kind w; 1 when the page server will judge it, 0, or -1 for a bad word. */
static int open_one(kvt_pd_receiver_t *r, const char *w) {
    static const char *const words[] = {"stall",         "rank0",     "garbage",   "half",
                                        "data-garbage",  "data-geometry", "data-huge", "data-outside",
                                        "data-wrap",     "data-stall",    "data-half-hello", "data-half",
                                        NULL};
    int k = 0;
    while (words[k] && strcmp(words[k], w) != 0) k++;
    if (words[k] == NULL) return -1;
    bool data = strncmp(w, "data-", 5) == 0;
    int fd = peer(r, data ? r->dport : r->cport);
    if (fd < 0) return 0;
    const kvt_geom_t *g = kvt_tier_geom(r->cfg.pool);
    kvt__wire_hello_t h = {KVT_WIRE_MAGIC, KVT_WIRE_VERSION, (uint32_t)g->layout, g->layers, 0, g->pages, g->layer_bytes,
                           r->cfg.token};
    kvt__wire_data_t run = {0, r->page_bytes};
    uint8_t junk[64];
    memset(junk, 0xA5, sizeof(junk));
    kvt__pd_hello_t fake = {0, r->cfg.ranks, r->cfg.token ^ 1};
    if (strcmp(w, "rank0") == 0) kvt__pd_send(fd, KVT_PD_HELLO, &fake, NULL, 0, KVT__PD_UNBOUND);
    if (strcmp(w, "garbage") == 0) kvt__write_full(fd, junk, sizeof(kvt__pd_hdr_t) + sizeof(kvt__pd_hello_t));
    if (strcmp(w, "half") == 0) {
        uint8_t msg[sizeof(kvt__pd_hdr_t) + sizeof(kvt__pd_hello_t)];
        kvt__pd_hdr_t hd = kvt__pd_header(KVT_PD_HELLO, sizeof(kvt__pd_hello_t));
        memcpy(msg, &hd, sizeof(hd));
        memcpy(msg + sizeof(hd), &fake, sizeof(fake));
        kvt__write_full(fd, msg, sizeof(hd) + sizeof(fake) / 2);
    }
    if (!data || strcmp(w, "data-stall") == 0) return 0;
    if (strcmp(w, "data-half-hello") == 0) return kvt__write_full(fd, &h, sizeof(h) / 2), 0;
    if (strcmp(w, "data-half") == 0) {
        h.token = ~r->cfg.token;
        size_t half = (size_t)(r->page_bytes / 2);
        uint8_t *bytes = calloc(1, half ? half : 1);
        kvt__write_full(fd, &h, sizeof(h));
        kvt__write_full(fd, &run, sizeof(run));
        if (bytes) kvt__write_full(fd, bytes, half);
        free(bytes);
        return 1; /* refused: judged */
    }
    if (strcmp(w, "data-garbage") == 0) return kvt__write_full(fd, junk, sizeof(h)), 1;
    if (strcmp(w, "data-geometry") == 0) return h.layer_bytes++, kvt__write_full(fd, &h, sizeof(h)), 1;
    if (strcmp(w, "data-huge") == 0) run.len = 1ull << 40;
    if (strcmp(w, "data-outside") == 0) run.off = g->pages * r->page_bytes;
    if (strcmp(w, "data-wrap") == 0) run.off = UINT64_MAX - 7, run.len = 4096;
    kvt__write_full(fd, &h, sizeof(h));
    kvt__write_full(fd, &run, sizeof(run));
    return 1;
}

static void await_judged(kvt_pd_receiver_t *r, uint64_t judged) {
    struct timespec ms = {0, 1000000};
    for (uint64_t t0 = kvt_now_ns(); kvt_now_ns() - t0 < 5000000000ull;) {
        kvt_net_server_stats_t ss = {.size = sizeof(ss)};
        kvt_net_server_stats(r->srv, &ss);
        if (ss.refused + ss.bad_peers >= judged) return;
        nanosleep(&ms, NULL);
    }
}

int kvt_pd_receiver_test_peers(kvt_pd_receiver_t *r, const char *spec, uint64_t *hold_ms) {
    if (r == NULL || spec == NULL) return KVT_EINVAL;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", spec);
    uint64_t judged = 0, hold = 0;
    int rc = KVT_OK;
    for (char *save = NULL, *w = strtok_r(buf, ",", &save); w && rc == KVT_OK; w = strtok_r(NULL, ",", &save)) {
        uint64_t k = 1;
        char *colon = strchr(w, ':');
        if (colon) *colon = 0, k = strtoull(colon + 1, NULL, 10);
        if (strcmp(w, "hold") == 0) {
            hold = k;
            continue;
        }
        for (uint64_t i = 0; i < k && rc == KVT_OK; i++) {
            int v = open_one(r, w);
            if (v < 0) rc = KVT_EINVAL;
            else judged += (uint64_t)v;
        }
    }
    await_judged(r, judged);
    if (hold_ms) *hold_ms = hold;
    return rc;
}
