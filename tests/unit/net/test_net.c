/* The tcp tier and the page server on 127.0.0.1: bytes land where the
 * engine says (checked against a byte-array model), a wrong geometry is
 * refused with a message, and garbage on the socket closes that connection
 * and nothing else. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>

#include "kvtier/testing.h"
#include "kvtier/rng.h"
#include "kvtier/error.h"
#include "kvtier/net.h"
#include "kvtier/tier.h"
#include "kvtier/xfer.h"
#include "sock/wire.h"

#define PAGES 96
#define LAYERS 2
#define LB 1000

typedef struct env {
    kvt_tier_t *src, *dst, *remote;
    kvt_net_server_t *srv;
    kvt_xfer_t *x;
    char addr[64];
} env_t;

static void env_init_tr(env_t *e, kvt_net_transport_t tr, kvt_layout_t src_layout, kvt_layout_t dst_layout, uint32_t streams,
                        uint64_t max_batch) {
    memset(e, 0, sizeof(*e));
    kvt_tier_config_t c = {.size = sizeof(c), .kind = KVT_TIER_ARENA, .name = "prefill", .geom = {PAGES, LAYERS, LB, src_layout}};
    cr_assert_eq(kvt_tier_create(&e->src, &c), KVT_OK);
    c.name = "decode";
    c.geom.layout = dst_layout;
    cr_assert_eq(kvt_tier_create(&e->dst, &c), KVT_OK);
    cr_assert_eq(kvt_net_server_create(&e->srv, tr, e->dst, "127.0.0.1", 0), KVT_OK);
    snprintf(e->addr, sizeof(e->addr), "127.0.0.1:%u", kvt_net_server_port(e->srv));
    c = (kvt_tier_config_t){.size = sizeof(c), .kind = tr == KVT_NET_UCX ? KVT_TIER_UCX : KVT_TIER_TCP, .name = e->addr, .streams = streams,
                            .geom = {PAGES, LAYERS, LB, dst_layout}};
    cr_assert_eq(kvt_tier_create(&e->remote, &c), KVT_OK);
    cr_assert_null(kvt_tier_addr(e->remote, 0, 0), "a remote tier has no local address");
    kvt_tier_t *tiers[2] = {e->src, e->remote};
    kvt_xfer_config_t xc;
    kvt_xfer_config_default(&xc);
    xc.max_batch_bytes = max_batch;
    xc.threads = 2;
    cr_assert_eq(kvt_xfer_create(&e->x, &xc, tiers, 2), KVT_OK);
}

static void env_init(env_t *e, kvt_layout_t src_layout, kvt_layout_t dst_layout, uint32_t streams, uint64_t max_batch) {
    env_init_tr(e, KVT_NET_TCP, src_layout, dst_layout, streams, max_batch);
}

/* UCX over loopback TCP, as the tests everywhere can run it. */
static void ucx_env(void) {
    if (!kvt_net_ucx_built()) cr_skip_test("this build has no UCX");
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("UCX_TLS", "tcp,self", 1);
}

static void env_fini(env_t *e) {
    kvt_xfer_destroy(e->x);
    kvt_net_server_destroy(e->srv);
    kvt_tier_destroy(e->remote);
    kvt_tier_destroy(e->src);
    kvt_tier_destroy(e->dst);
}

static int one_batch(env_t *e, const kvt_xfer_copy_t *cp, size_t n) {
    cr_assert_eq(kvt_xfer_submit(e->x, 0, 1, cp, n, 0, NULL), KVT_OK);
    kvt_xfer_done_t d;
    cr_assert_eq(kvt_xfer_poll(e->x, &d, 1, 10000000000ull), 1);
    return d.status;
}

/* Random batches (distinct destinations) in every layout pair, 1 and 4 streams:
 * every destination page holds its source page, every other page is untouched. */
Test(net, runs_land_in_place, .timeout = 60) {
    uint64_t seed = 7;
    fprintf(stderr, "net: seed=%" PRIu64 "\n", seed);
    kvt_rng_t rng;
    kvt_rng_seed(&rng, seed);
    for (int sl = 0; sl < 2; sl++)
        for (int dl = 0; dl < 2; dl++)
            for (uint32_t streams = 1; streams <= 4; streams += 3) {
                env_t e;
                env_init(&e, (kvt_layout_t)sl, (kvt_layout_t)dl, streams, 3 * LAYERS * LB);
                uint8_t *model = calloc(PAGES, LAYERS * LB); /* the decode tier, page-major in the model */
                for (uint32_t p = 0; p < PAGES; p++)
                    for (uint32_t l = 0; l < LAYERS; l++) kvt_pattern_fill(kvt_tier_addr(e.src, p, l), LB, p, 1, l);
                for (int round = 0; round < 6; round++) {
                    kvt_xfer_copy_t cp[PAGES];
                    uint8_t used[PAGES] = {0};
                    size_t n = 1 + kvt_rng_below(&rng, PAGES - 1);
                    for (size_t i = 0; i < n; i++) {
                        uint32_t d;
                        do d = (uint32_t)kvt_rng_below(&rng, PAGES);
                        while (used[d]);
                        used[d] = 1;
                        uint32_t s = round % 2 ? d : (uint32_t)kvt_rng_below(&rng, PAGES); /* runs, or scattered */
                        cp[i] = (kvt_xfer_copy_t){s, d};
                        for (uint32_t l = 0; l < LAYERS; l++)
                            memcpy(model + ((size_t)d * LAYERS + l) * LB, kvt_tier_addr(e.src, s, l), LB);
                    }
                    cr_assert_eq(one_batch(&e, cp, n), KVT_OK);
                    for (uint32_t p = 0; p < PAGES; p++)
                        for (uint32_t l = 0; l < LAYERS; l++)
                            cr_assert(memcmp(kvt_tier_addr(e.dst, p, l), model + ((size_t)p * LAYERS + l) * LB, LB) == 0,
                                      "layouts %d/%d streams %u round %d: page %u layer %u", sl, dl, streams, round, p, l);
                }
                kvt_net_server_stats_t st = {.size = sizeof(st)};
                kvt_net_server_stats(e.srv, &st);
                cr_assert_geq(st.connections, streams, "each worker's streams connected");
                cr_assert_eq(st.bad_peers + st.refused, 0);
                free(model);
                env_fini(&e);
            }
}

/* A writer whose geometry is not the server's: refused with a message (the
 * batch fails with KVT_EINVAL); the server goes on serving a good writer. */
static void wrong_geometry(kvt_net_transport_t tr) {
    env_t e;
    env_init_tr(&e, tr, KVT_LAYOUT_PAGE_FIRST, KVT_LAYOUT_PAGE_FIRST, 1, 1 << 20);
    kvt_tier_t *wrong, *src2;
    kvt_tier_config_t c = {.size = sizeof(c), .kind = tr == KVT_NET_UCX ? KVT_TIER_UCX : KVT_TIER_TCP, .name = e.addr,
                           .geom = {PAGES, LAYERS, LB + 8, KVT_LAYOUT_PAGE_FIRST}};
    cr_assert_eq(kvt_tier_create(&wrong, &c), KVT_OK);
    kvt_tier_config_t sc = {.size = sizeof(sc), .kind = KVT_TIER_ARENA, .geom = {PAGES, LAYERS, LB + 8, KVT_LAYOUT_PAGE_FIRST}};
    cr_assert_eq(kvt_tier_create(&src2, &sc), KVT_OK);
    kvt_tier_t *tiers[2] = {src2, wrong};
    kvt_xfer_config_t xc;
    kvt_xfer_config_default(&xc);
    kvt_xfer_t *x;
    cr_assert_eq(kvt_xfer_create(&x, &xc, tiers, 2), KVT_OK);
    kvt_xfer_copy_t cp = {0, 0};
    cr_assert_eq(kvt_xfer_submit(x, 1, 0, &cp, 1, 0, NULL), KVT_EINVAL, "a peer's tier is written, never read");
    cr_assert_eq(kvt_xfer_pending(x), 0u);
    cr_assert_eq(kvt_xfer_submit(x, 0, 1, &cp, 1, 0, NULL), KVT_OK);
    kvt_xfer_done_t d;
    cr_assert_eq(kvt_xfer_poll(x, &d, 1, 30000000000ull), 1);
    cr_assert_eq(d.status, KVT_EINVAL, "the server's verdict reaches the batch: %s", kvt_err_name(d.status));
    kvt_net_server_stats_t st = {.size = sizeof(st)};
    kvt_net_server_stats(e.srv, &st);
    cr_assert_eq(st.refused, 1);
    cr_assert(strstr(st.last_error, "geometry differs"), "%s", st.last_error);
    kvt_xfer_destroy(x);
    kvt_tier_destroy(wrong);
    kvt_tier_destroy(src2);
    kvt_pattern_fill(kvt_tier_addr(e.src, 3, 0), LB, 4, 4, 0);
    kvt_xfer_copy_t ok = {3, 5};
    cr_assert_eq(one_batch(&e, &ok, 1), KVT_OK);
    cr_assert(kvt_pattern_check(kvt_tier_addr(e.dst, 5, 0), LB, 4, 4, 0));
    env_fini(&e);
}

Test(net, wrong_geometry_is_refused, .timeout = 30) { wrong_geometry(KVT_NET_TCP); }

/* A server given a token takes only writers that carry it (PD decode's pool
 * takes bytes from its group's ranks only): a tier without it, or with
 * another, fails its batch with the server's verdict and writes nothing;
 * one with it lands its run. */
static void token(kvt_net_transport_t tr) {
    env_t e;
    env_init_tr(&e, tr, KVT_LAYOUT_PAGE_FIRST, KVT_LAYOUT_PAGE_FIRST, 2, 1 << 20);
    cr_assert_eq(kvt_net_server_set_token(e.srv, 0x5eed), KVT_OK);
    cr_assert_eq(kvt_net_server_set_token(NULL, 1), KVT_EINVAL);
    kvt_pattern_fill(kvt_tier_addr(e.src, 1, 0), LB, 6, 6, 0);
    memset(kvt_tier_addr(e.dst, 2, 0), 0, LB);
    kvt_xfer_copy_t cp = {1, 2};
    cr_assert_eq(one_batch(&e, &cp, 1), KVT_EINVAL, "no token: refused");
    kvt_net_server_stats_t st = {.size = sizeof(st)};
    kvt_net_server_stats(e.srv, &st);
    cr_assert_geq(st.refused, 1);
    cr_assert(strstr(st.last_error, "token"), "%s", st.last_error);
    cr_assert_eq(st.bytes, 0, "nothing written");
    for (uint64_t tok = 0x5eec; tok <= 0x5eed; tok++) { /* another token, then the server's */
        kvt_xfer_destroy(e.x);
        kvt_tier_destroy(e.remote);
        kvt_tier_config_t c = {.size = sizeof(c), .kind = tr == KVT_NET_UCX ? KVT_TIER_UCX : KVT_TIER_TCP, .name = e.addr,
                               .streams = 2, .geom = {PAGES, LAYERS, LB, KVT_LAYOUT_PAGE_FIRST}, .token = tok};
        cr_assert_eq(kvt_tier_create(&e.remote, &c), KVT_OK);
        kvt_tier_t *tiers[2] = {e.src, e.remote};
        kvt_xfer_config_t xc;
        kvt_xfer_config_default(&xc);
        cr_assert_eq(kvt_xfer_create(&e.x, &xc, tiers, 2), KVT_OK);
        cr_assert_eq(one_batch(&e, &cp, 1), tok == 0x5eed ? KVT_OK : KVT_EINVAL, "token %llx", (unsigned long long)tok);
    }
    cr_assert(kvt_pattern_check(kvt_tier_addr(e.dst, 2, 0), LB, 6, 6, 0), "the writer with the token landed its page");
    env_fini(&e);
}

Test(net, a_token_keeps_strangers_out, .timeout = 30) { token(KVT_NET_TCP); }
Test(net, ucx_a_token_keeps_strangers_out, .timeout = 60) {
    ucx_env();
    token(KVT_NET_UCX);
}

/* Garbage and a run past the tier: each connection is closed; a kvtier of
 * another wire version is told why; the server keeps serving. */
Test(net, bad_peers_are_disconnected, .timeout = 30) {
    env_t e;
    env_init(&e, KVT_LAYOUT_PAGE_FIRST, KVT_LAYOUT_PAGE_FIRST, 1, 1 << 20);
    int fd = kvt__tcp_connect(e.addr);
    cr_assert_geq(fd, 0);
    char junk[64];
    memset(junk, 0x5a, sizeof(junk));
    cr_assert_eq(kvt__write_full(fd, junk, sizeof(junk)), 0);
    char b;
    cr_assert_leq(read(fd, &b, 1), 0, "closed on garbage");
    close(fd);

    fd = kvt__tcp_connect(e.addr);
    kvt__wire_hello_t h = {KVT_WIRE_MAGIC, KVT_WIRE_VERSION, KVT_LAYOUT_PAGE_FIRST, LAYERS, 0, PAGES, LB, 0};
    kvt__wire_reply_t r;
    cr_assert_eq(kvt__write_full(fd, &h, sizeof(h)), 0);
    cr_assert_eq(kvt__read_full(fd, &r, sizeof(r)), 0);
    cr_assert_eq(r.status, KVT_OK);
    kvt__wire_data_t past = {(uint64_t)PAGES * LAYERS * LB - 10, 100};
    cr_assert_eq(kvt__write_full(fd, &past, sizeof(past)), 0);
    cr_assert_leq(read(fd, &b, 1), 0, "closed on a run outside the tier");
    close(fd);

    fd = kvt__tcp_connect(e.addr); /* a kvtier of another wire version: refused, told why */
    h.version = KVT_WIRE_VERSION + 1;
    cr_assert_eq(kvt__write_full(fd, &h, sizeof(h)), 0);
    cr_assert_eq(kvt__read_full(fd, &r, sizeof(r)), 0);
    cr_assert_eq(r.status, KVT_EINVAL);
    cr_assert(strstr(r.message, "wire version") != NULL, "%s", r.message);
    close(fd);

    kvt_net_server_stats_t st = {.size = sizeof(st)};
    for (int i = 0; i < 100 && st.bad_peers < 2; i++) {
        usleep(10000);
        kvt_net_server_stats(e.srv, &st);
    }
    cr_assert_eq(st.bad_peers, 2, "%s", st.last_error);
    cr_assert_eq(st.refused, 1, "%s", st.last_error);
    kvt_pattern_fill(kvt_tier_addr(e.src, 1, 0), LB, 9, 9, 0);
    kvt_xfer_copy_t ok = {1, 2};
    cr_assert_eq(one_batch(&e, &ok, 1), KVT_OK);
    cr_assert(kvt_pattern_check(kvt_tier_addr(e.dst, 2, 0), LB, 9, 9, 0));
    env_fini(&e);
}

/* A server that goes away fails the batch (KVT_EIO), not the process. */
Test(net, a_vanished_server_fails_the_batch, .timeout = 60) {
    env_t e;
    env_init(&e, KVT_LAYOUT_PAGE_FIRST, KVT_LAYOUT_PAGE_FIRST, 2, 1 << 20);
    kvt_xfer_copy_t ok = {0, 0};
    cr_assert_eq(one_batch(&e, &ok, 1), KVT_OK);
    kvt_net_server_destroy(e.srv);
    e.srv = NULL;
    cr_assert_eq(one_batch(&e, &ok, 1), KVT_EIO);
    kvt_xfer_destroy(e.x);
    kvt_tier_destroy(e.remote);
    kvt_tier_destroy(e.src);
    kvt_tier_destroy(e.dst);
}

/* The same over UCX: runs (eager and rendezvous sizes) land in place. */
Test(net, ucx_runs_land_in_place, .timeout = 60) {
    ucx_env();
    env_t e;
    env_init_tr(&e, KVT_NET_UCX, KVT_LAYOUT_PAGE_FIRST, KVT_LAYOUT_LAYER_FIRST, 1, 8 * LAYERS * LB);
    uint8_t *model = calloc(PAGES, LAYERS * LB);
    for (uint32_t p = 0; p < PAGES; p++)
        for (uint32_t l = 0; l < LAYERS; l++) kvt_pattern_fill(kvt_tier_addr(e.src, p, l), LB, p, 2, l);
    kvt_xfer_copy_t cp[PAGES];
    for (uint32_t i = 0; i < PAGES; i++) cp[i] = (kvt_xfer_copy_t){i, (i * 37) % PAGES}; /* scattered */
    for (uint32_t i = 0; i < PAGES; i++)
        for (uint32_t l = 0; l < LAYERS; l++)
            memcpy(model + ((size_t)cp[i].dst_page * LAYERS + l) * LB, kvt_tier_addr(e.src, cp[i].src_page, l), LB);
    cr_assert_eq(one_batch(&e, cp, PAGES), KVT_OK);
    for (uint32_t p = 0; p < PAGES; p++)
        for (uint32_t l = 0; l < LAYERS; l++)
            cr_assert(memcmp(kvt_tier_addr(e.dst, p, l), model + ((size_t)p * LAYERS + l) * LB, LB) == 0, "page %u layer %u", p, l);
    free(model);
    env_fini(&e);
    /* large runs (UCX's rendezvous protocol): one batch of 3 MiB pages */
    kvt_tier_t *a, *b, *r;
    kvt_net_server_t *srv;
    kvt_tier_config_t c = {.size = sizeof(c), .kind = KVT_TIER_ARENA, .geom = {4, 1, 3u << 20, KVT_LAYOUT_PAGE_FIRST}};
    cr_assert_eq(kvt_tier_create(&a, &c), KVT_OK);
    cr_assert_eq(kvt_tier_create(&b, &c), KVT_OK);
    cr_assert_eq(kvt_net_server_create(&srv, KVT_NET_UCX, b, "127.0.0.1", 0), KVT_OK);
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", kvt_net_server_port(srv));
    c.kind = KVT_TIER_UCX;
    c.name = addr;
    cr_assert_eq(kvt_tier_create(&r, &c), KVT_OK);
    for (uint32_t p = 0; p < 4; p++) kvt_pattern_fill(kvt_tier_addr(a, p, 0), 3u << 20, p, 3, 0);
    kvt_tier_t *tiers[2] = {a, r};
    kvt_xfer_config_t xc;
    kvt_xfer_config_default(&xc);
    xc.max_batch_bytes = 3u << 20; /* one page a copy */
    kvt_xfer_t *x;
    cr_assert_eq(kvt_xfer_create(&x, &xc, tiers, 2), KVT_OK);
    kvt_xfer_copy_t big[4] = {{0, 3}, {1, 2}, {2, 1}, {3, 0}};
    cr_assert_eq(kvt_xfer_submit(x, 0, 1, big, 4, 0, NULL), KVT_OK);
    kvt_xfer_done_t d;
    cr_assert_eq(kvt_xfer_poll(x, &d, 1, 30000000000ull), 1);
    cr_assert_eq(d.status, KVT_OK);
    for (uint32_t p = 0; p < 4; p++) cr_assert(kvt_pattern_check(kvt_tier_addr(b, 3 - p, 0), 3u << 20, p, 3, 0), "big page %u", p);
    kvt_xfer_destroy(x);
    kvt_net_server_destroy(srv);
    kvt_tier_destroy(r);
    kvt_tier_destroy(a);
    kvt_tier_destroy(b);
}

/* A UCX page server that goes away fails the copy; one started again on the
 * same port is written to by the next copy (the old code kept the writer's
 * failed endpoint: every later copy failed at once, for the Transfer's life). */
Test(net, ucx_a_writer_connects_again_after_a_failed_copy, .timeout = 120) {
    ucx_env();
    setenv("UCX_CM_REUSEADDR", "y", 1); /* the new server binds the old one's port */
    env_t e;
    env_init_tr(&e, KVT_NET_UCX, KVT_LAYOUT_PAGE_FIRST, KVT_LAYOUT_PAGE_FIRST, 1, 1 << 20);
    uint16_t port = kvt_net_server_port(e.srv);
    kvt_pattern_fill(kvt_tier_addr(e.src, 1, 0), LB, 4, 4, 0);
    kvt_xfer_copy_t ok = {1, 2};
    cr_assert_eq(one_batch(&e, &ok, 1), KVT_OK);
    kvt_net_server_destroy(e.srv);
    e.srv = NULL;
    cr_assert_eq(one_batch(&e, &ok, 1), KVT_EIO);
    int rc = KVT_EIO;
    for (int i = 0; i < 50 && rc != KVT_OK; i++) { /* the port may take a moment to be free again */
        rc = kvt_net_server_create(&e.srv, KVT_NET_UCX, e.dst, "127.0.0.1", port);
        if (rc != KVT_OK) usleep(100000);
    }
    cr_assert_eq(rc, KVT_OK, "a server on port %u again", port);
    memset(kvt_tier_addr(e.dst, 2, 0), 0, LB);
    rc = one_batch(&e, &ok, 1);
    cr_assert_eq(rc, KVT_OK, "the writer connected again: %s", kvt_err_name(rc));
    cr_assert(kvt_pattern_check(kvt_tier_addr(e.dst, 2, 0), LB, 4, 4, 0));
    env_fini(&e);
}

Test(net, ucx_wrong_geometry_is_refused, .timeout = 60) {
    ucx_env();
    wrong_geometry(KVT_NET_UCX);
}

/* A peer's address is checked when its tier is made (IPv4 "a.b.c.d:port"),
 * not at the first copy, where tcp and ucx would fail it differently. */
Test(net, peer_tier_names_are_checked_at_create) {
    static const char *const bad[] = {"localhost:9", "127.0.0.1", "127.0.0.1:", "127.0.0.1:x", "127.0.0.1:65536",
                                      "127.0.0.1: 9", "[::1]:9", ":9"};
    for (int tr = 0; tr < 2; tr++)
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
            kvt_tier_t *t = NULL;
            kvt_tier_config_t c = {.size = sizeof(c), .kind = tr ? KVT_TIER_UCX : KVT_TIER_TCP, .name = bad[i],
                                   .geom = {8, 1, 4096, KVT_LAYOUT_PAGE_FIRST}};
            cr_assert_eq(kvt_tier_create(&t, &c), KVT_EINVAL, "%s", bad[i]);
            cr_assert_null(t);
        }
}

/* The page server takes only a tier the CPU can write as one region: not a
 * network tier, not an engine tier's planes. Through the public tier API. */
Test(net, serves_only_one_host_visible_region) {
    kvt_tier_t *remote = NULL, *eng = NULL, *arena = NULL;
    kvt_tier_config_t rc = {.size = sizeof(rc), .kind = KVT_TIER_TCP, .name = "127.0.0.1:9", .geom = {8, 1, 4096, KVT_LAYOUT_PAGE_FIRST}};
    cr_assert_eq(kvt_tier_create(&remote, &rc), KVT_OK);
    static uint8_t k[8 * 256], v[8 * 256];
    void *kl[1] = {k}, *vl[1] = {v};
    kvt_tier_engine_t e = {.size = sizeof(e), .planes = 2,
                           .plane = {{.layer_base = kl, .piece_bytes = 256, .page_stride = 256},
                                     {.layer_base = vl, .piece_bytes = 256, .page_stride = 256}}};
    kvt_tier_config_t ec = {.size = sizeof(ec), .kind = KVT_TIER_ENGINE, .engine = &e, .geom = {8, 1, 0, KVT_LAYOUT_PAGE_FIRST}};
    cr_assert_eq(kvt_tier_create(&eng, &ec), KVT_OK);
    kvt_tier_config_t ac = {.size = sizeof(ac), .kind = KVT_TIER_ARENA, .geom = {8, 1, 512, KVT_LAYOUT_PAGE_FIRST}};
    cr_assert_eq(kvt_tier_create(&arena, &ac), KVT_OK);
    kvt_net_server_t *s = NULL;
    cr_assert_eq(kvt_net_server_create(&s, KVT_NET_TCP, remote, "127.0.0.1", 0), KVT_EINVAL, "not host-visible");
    cr_assert_eq(kvt_net_server_create(&s, KVT_NET_TCP, eng, "127.0.0.1", 0), KVT_EINVAL, "two planes, not one region");
    kvt_tier_t *summed = NULL; /* runs land in place: its sums would be stale, every page arrived refused after */
    kvt_tier_config_t hc = {.size = sizeof(hc), .kind = KVT_TIER_HOST, .flags = KVT_TIER_CHECKSUM,
                            .geom = {8, 1, 512, KVT_LAYOUT_PAGE_FIRST}};
    cr_assert_eq(kvt_tier_create(&summed, &hc), KVT_OK);
    cr_assert_eq(kvt_net_server_create(&s, KVT_NET_TCP, summed, "127.0.0.1", 0), KVT_EINVAL, "per-page checksums");
    kvt_tier_destroy(summed);
    cr_assert_null(s);
    cr_assert_eq(kvt_net_server_create(&s, KVT_NET_TCP, arena, "127.0.0.1", 0), KVT_OK);
    kvt_net_server_destroy(s);
    kvt_tier_destroy(arena);
    kvt_tier_destroy(eng);
    kvt_tier_destroy(remote);
}

/* A server that acknowledges a run with another length (here before it has
 * read the run's bytes): the copy fails, not reported landed (any 8 bytes
 * counted as an ack). */
static int acker_lfd;
static uint64_t acker_says;

static void *acker(void *arg) {
    (void)arg;
    int fd = accept(acker_lfd, NULL, NULL);
    kvt__wire_hello_t h;
    kvt__wire_reply_t r = {KVT_OK, "ok"};
    kvt__wire_data_t d;
    if (fd >= 0 && kvt__read_full(fd, &h, sizeof(h)) == 0 && kvt__write_full(fd, &r, sizeof(r)) == 0 &&
        kvt__read_full(fd, &d, sizeof(d)) == 0)
        kvt__write_full(fd, &acker_says, sizeof(acker_says));
    usleep(200000);
    if (fd >= 0) close(fd);
    return NULL;
}

Test(net, an_ack_of_another_length_fails_the_copy, .timeout = 60) {
    for (int honest = 0; honest < 2; honest++) {
        struct sockaddr_in a = {.sin_family = AF_INET};
        inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
        uint16_t port;
        acker_lfd = kvt__tcp_listen(&a, &port);
        cr_assert_geq(acker_lfd, 0);
        acker_says = honest ? LB : 0xdeadbeef;
        pthread_t th;
        cr_assert_eq(pthread_create(&th, NULL, acker, NULL), 0);
        char addr[64];
        snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
        kvt_tier_t *src, *remote;
        kvt_tier_config_t c = {.size = sizeof(c), .kind = KVT_TIER_ARENA, .geom = {4, 1, LB, KVT_LAYOUT_PAGE_FIRST}};
        cr_assert_eq(kvt_tier_create(&src, &c), KVT_OK);
        c = (kvt_tier_config_t){.size = sizeof(c), .kind = KVT_TIER_TCP, .name = addr, .streams = 1,
                                .geom = {4, 1, LB, KVT_LAYOUT_PAGE_FIRST}};
        cr_assert_eq(kvt_tier_create(&remote, &c), KVT_OK);
        kvt_tier_t *tiers[2] = {src, remote};
        kvt_xfer_config_t xc;
        kvt_xfer_config_default(&xc);
        kvt_xfer_t *x;
        cr_assert_eq(kvt_xfer_create(&x, &xc, tiers, 2), KVT_OK);
        kvt_xfer_copy_t cp = {0, 1};
        cr_assert_eq(kvt_xfer_submit(x, 0, 1, &cp, 1, 0, NULL), KVT_OK);
        kvt_xfer_done_t d;
        cr_assert_eq(kvt_xfer_poll(x, &d, 1, 10000000000ull), 1);
        cr_assert_eq(d.status, honest ? KVT_OK : KVT_EIO, "ack %" PRIx64 " for a run of %d bytes", acker_says, LB);
        kvt_xfer_destroy(x);
        pthread_join(th, NULL);
        close(acker_lfd);
        kvt_tier_destroy(remote);
        kvt_tier_destroy(src);
    }
}
