/* Parts of a store that cannot serve, against real servers
 * (tests/common/redis.h), checked on the store's counters, never on time:
 *
 *  - a redis:// store does not follow a redirection: a cluster node's MOVED
 *    to another (reachable) server is a failure, counted, and that server is
 *    never contacted;
 *  - a redis-cluster:// store sent by MOVED to a node that cannot be
 *    reached marks that node down: its keys fail at once in the batches
 *    that follow (no rounds of retries, no map reload per batch) while the
 *    other keys are served;
 *  - a three-master cluster with one master killed: the live masters' keys
 *    are served byte for byte in every batch, the dead one's fail, and the
 *    batches do not spend retries on it; with the server's default
 *    cluster-require-full-coverage (every live master answers CLUSTERDOWN
 *    once the cluster is down) the batches fail at once too.
 *
 * The MOVED cases need a node that names an address nobody serves. Real
 * Redis is made to: a one-node cluster started from a nodes.conf written
 * here, which lists a second master at 127.0.0.1:<a free port>; with a node
 * timeout of a minute that master is never judged failing during the test,
 * so the cluster stays up and the node answers MOVED for its slots. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <unistd.h>

#include "common/redis.h"
#include "helpers.h"

static senv_t E;
static redis_srv_t A, B;
static redis_cluster_t C;

static void teardown(void) {
    senv_fini(&E);
    redis_stop(&A);
    redis_stop(&B);
    cluster_stop(&C);
}

TestSuite(store_down, .fini = teardown, .timeout = 60);

#define ID_A "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define ID_F "ffffffffffffffffffffffffffffffffffffffff"

/* Node A alone in a cluster whose nodes.conf names a second master F at
 * 127.0.0.1:fport; A serves a_slots ("0-16383", "0-8191"), F the rest. */
static void start_a(int fport, const char *a_slots, const char *f_slots) {
    cr_assert_eq(redis_prepare(&A), 0);
    char conf[200];
    snprintf(conf, sizeof(conf), "%s/nodes.conf", A.dir);
    FILE *f = fopen(conf, "w");
    cr_assert_not_null(f);
    fprintf(f, ID_A " 127.0.0.1:%d@%d myself,master - 0 0 1 connected %s\n", A.port, A.port + 10000, a_slots);
    fprintf(f, ID_F " 127.0.0.1:%d@%d master - 0 0 2 connected %s\n", fport, fport + 10000, f_slots);
    fprintf(f, "vars currentEpoch 2 lastVoteEpoch 0\n");
    fclose(f);
    const char *extra[] = {"--cluster-node-timeout", "60000", NULL};
    cr_assert_eq(redis_launch(&A, true, extra), 0, "redis-server did not start from %s", conf);
    bool ok = false;
    for (int t = 0; t < 1000 && !(ok = redis_reply_has_(A.port, "CLUSTER INFO", "cluster_state:ok")); t++) redis_sleep_ms(10);
    cr_assert(ok, "the one-node cluster did not come up");
}

static unsigned slot_of(int port, const kvt_hash128_t *h) {
    char hex[33];
    kvt_store_key(E.store, h, hex);
    redisReply *r = redis_cmd(port, "CLUSTER KEYSLOT kvt:%s", hex);
    cr_assert(r && r->type == REDIS_REPLY_INTEGER);
    unsigned s = (unsigned)r->integer;
    freeReplyObject(r);
    return s;
}

static long long stat_of(int port, const char *field) {
    redisReply *r = redis_cmd(port, "INFO stats");
    cr_assert(r && r->type == REDIS_REPLY_STRING);
    const char *at = strstr(r->str, field);
    long long v = at ? atoll(at + strlen(field) + 1) : -1;
    freeReplyObject(r);
    return v;
}

/* A redis:// store on a cluster node: keys of the node's slots are served,
 * keys it redirects (MOVED to B, a live server) fail, counted, with a
 * message; B sees no connection from the store. */
Test(store_down, standalone_does_not_follow_moved) {
    cr_assert_eq(redis_start(&B, NULL), 0);
    start_a(B.port, "0-8191", "8192-16383");
    senv_init(&E, 64, 1, 1024, KVT_LAYOUT_PAGE_FIRST);
    char u[64];
    snprintf(u, sizeof(u), "redis://127.0.0.1:%d", A.port);
    cr_assert_eq(senv_open(&E, u), KVT_OK, "%s", kvt_store_last_error(NULL));
    long long conns = stat_of(B.port, "total_connections_received");
    kvt_store_page_t p[32];
    pages_of(p, 32, 100, 0);
    fill(&E, 100, 0, 32);
    bool mine[32];
    size_t n_mine = 0;
    for (int i = 0; i < 32; i++) n_mine += mine[i] = slot_of(A.port, &p[i].hash) <= 8191;
    cr_assert(n_mine > 0 && n_mine < 32);
    sres_t r = run_op(E.store, kvt_store_put, p, 32);
    for (int i = 0; i < 32; i++) cr_assert_eq(r.r[i], mine[i] ? KVT_STORE_OK : KVT_STORE_FAILED, "put %d", i);
    r = run_op(E.store, kvt_store_exists, p, 32);
    for (int i = 0; i < 32; i++) cr_assert_eq(r.r[i], mine[i] ? KVT_STORE_OK : KVT_STORE_FAILED, "exists %d", i);
    kvt_store_stats_t st = sstats(E.store, KVT_STORE_PUT);
    cr_assert_eq(st.failures, 32 - n_mine);
    cr_assert_eq(st.moved, 0u, "a redirection was followed");
    cr_assert_eq(sstats(E.store, KVT_STORE_EXISTS).moved, 0u);
    cr_assert(strstr(kvt_store_last_error(E.store), "MOVED") != NULL, "%s", kvt_store_last_error(E.store));
    cr_assert_eq(stat_of(B.port, "total_connections_received"), conns + 1, "the store connected to the server MOVED named");
}

/* A redis-cluster:// store whose map says A serves every slot; then the
 * slots of half the keys are given to F, whose port is closed: A answers
 * MOVED to F. The first batch learns F is down; in the 20 after it, F's
 * keys fail at once (no MOVED round, no retries, the map reloaded a bounded
 * number of times) and A's are served. */
Test(store_down, moved_to_an_unreachable_node) {
    int fport = redis_free_port();
    start_a(fport, "0-16383", "");
    senv_init(&E, 64, 1, 1024, KVT_LAYOUT_PAGE_FIRST);
    char u[64];
    snprintf(u, sizeof(u), "redis-cluster://127.0.0.1:%d", A.port);
    cr_assert_eq(senv_open(&E, u), KVT_OK, "%s", kvt_store_last_error(NULL));
    kvt_store_page_t p[32];
    pages_of(p, 32, 200, 0);
    fill(&E, 200, 0, 32);
    bool to_f[32];
    size_t n_f = 0;
    for (int i = 0; i < 32; i++) {
        to_f[i] = i % 2 == 1;
        if (!to_f[i]) continue;
        redisReply *r = redis_cmd(A.port, "CLUSTER SETSLOT %u NODE " ID_F, slot_of(A.port, &p[i].hash));
        cr_assert(r && r->type == REDIS_REPLY_STATUS, "SETSLOT: %s", r ? r->str : "no reply");
        freeReplyObject(r);
    }
    for (int i = 0; i < 32; i++) { /* two keys may share a slot */
        bool f = false;
        for (int j = 0; j < 32; j++) f |= to_f[j] && slot_of(A.port, &p[j].hash) == slot_of(A.port, &p[i].hash);
        n_f += to_f[i] = f;
    }
    sres_t r = run_op(E.store, kvt_store_put, p, 32);
    for (int i = 0; i < 32; i++) cr_assert_eq(r.r[i], to_f[i] ? KVT_STORE_FAILED : KVT_STORE_OK, "put %d", i);
    kvt_store_stats_t first = sstats(E.store, KVT_STORE_PUT);
    cr_assert_geq(first.moved, 1u);
    for (int b = 0; b < 20; b++) {
        r = run_op(E.store, kvt_store_exists, p, 32);
        for (int i = 0; i < 32; i++)
            cr_assert_eq(r.r[i], to_f[i] ? KVT_STORE_FAILED : KVT_STORE_OK, "batch %d key %d: %d", b, i, r.r[i]);
    }
    kvt_store_stats_t st = sstats(E.store, KVT_STORE_EXISTS);
    fprintf(stderr, "store_down: MOVED to a closed port: first put moved %llu, map reloads %llu; 20 exists: moved %llu, "
                    "map reloads %llu, round trips %llu, failures %llu\n",
            (unsigned long long)first.moved, (unsigned long long)first.map_refreshes, (unsigned long long)st.moved,
            (unsigned long long)st.map_refreshes, (unsigned long long)st.round_trips, (unsigned long long)st.failures);
    cr_assert_eq(st.failures, 20 * n_f);
    cr_assert_leq(first.map_refreshes, 2u, "the first batch reloaded the map every round");
    cr_assert_leq(st.moved, n_f, "F's keys were sent to A again and again");
    cr_assert_leq(st.map_refreshes, 4u, "the map was reloaded for every batch");
    cr_assert_leq(st.round_trips, 20u + 2, "more than one round trip a batch");
}

/* Three masters, no replicas: the master of some keys is killed. */
static int owner_port(int live, unsigned slot) {
    int port = redis_slot_port(redis_cmd(live, "CLUSTER SLOTS"), slot);
    cr_assert_neq(port, -1, "no master for slot %u", slot);
    return port;
}

enum { NK = 96, BATCHES = 10 };

/* Puts NK keys, kills the master of key 0; dead[i]: key i was on it. */
static int kill_a_master(bool dead[NK]) {
    kvt_store_page_t p[NK];
    put_filled(&E, p, NK, 3000);
    int port0 = owner_port(C.n[0].port, slot_of(C.n[0].port, &p[0].hash)), m = -1;
    for (int i = 0; i < 3; i++)
        if (C.n[i].port == port0) m = i;
    cr_assert_geq(m, 0);
    int live = C.n[(m + 1) % 3].port;
    size_t nd = 0;
    for (int i = 0; i < NK; i++) nd += dead[i] = owner_port(live, slot_of(live, &p[i].hash)) == port0;
    cr_assert(nd > 0 && nd < NK);
    redis_kill(&C.n[m]);
    return m;
}

/* cluster-require-full-coverage no (tests/common/redis.h's): the live
 * masters serve whatever the cluster's state. Every batch serves every
 * live key byte for byte and fails the dead ones; over 10 batches the
 * dead master costs a bounded number of map reloads and reconnects. */
Test(store_down, one_master_down_live_slots_served) {
    cr_assert_eq(cluster_start_opts(&C, 3, 0, NULL, NULL), 0, "the cluster did not come up (see %s/create.log)", C.n[0].dir);
    senv_init(&E, 2 * NK, 1, 1024, KVT_LAYOUT_PAGE_FIRST);
    cr_assert_eq(senv_open(&E, C.url), KVT_OK, "%s", kvt_store_last_error(NULL));
    bool dead[NK];
    kill_a_master(dead);
    kvt_store_page_t q[NK];
    pages_of(q, NK, 3000, NK);
    for (int b = 0; b < BATCHES; b++) {
        wipe(&E, NK, NK);
        sres_t r = run_op(E.store, kvt_store_get, q, NK);
        for (int i = 0; i < NK; i++) {
            cr_assert_eq(r.r[i], dead[i] ? KVT_STORE_FAILED : KVT_STORE_OK, "batch %d key %d: %d", b, i, r.r[i]);
            if (!dead[i]) cr_assert(check(&E, 3000 + (uint64_t)i, NK + (uint32_t)i));
        }
    }
    kvt_store_stats_t st = sstats(E.store, KVT_STORE_GET);
    fprintf(stderr, "store_down: one master of three killed, %d batches of %d gets: failures %llu, map reloads %llu, "
                    "reconnects %llu, retried replies %llu, round trips %llu\n",
            BATCHES, NK, (unsigned long long)st.failures, (unsigned long long)st.map_refreshes,
            (unsigned long long)st.reconnects, (unsigned long long)st.tryagain, (unsigned long long)st.round_trips);
    cr_assert_leq(st.map_refreshes, 4u, "the map was reloaded round after round");
    cr_assert_leq(st.reconnects, 4u);
    cr_assert_leq(st.round_trips, 2u * BATCHES + 4, "more than a round trip per live master per batch");
}

/* The server's default (cluster-require-full-coverage yes): once the
 * cluster is down every live master answers CLUSTERDOWN. The batches then
 * fail at once: no reply is retried round after round. */
Test(store_down, cluster_down_fails_fast) {
    const char *extra[] = {"--cluster-require-full-coverage", "yes", NULL};
    cr_assert_eq(cluster_start_opts(&C, 3, 0, extra, NULL), 0, "the cluster did not come up (see %s/create.log)", C.n[0].dir);
    senv_init(&E, 2 * NK, 1, 1024, KVT_LAYOUT_PAGE_FIRST);
    cr_assert_eq(senv_open(&E, C.url), KVT_OK, "%s", kvt_store_last_error(NULL));
    bool dead[NK];
    int m = kill_a_master(dead);
    int live = C.n[(m + 1) % 3].port;
    bool down = false;
    for (int t = 0; t < 1000 && !(down = redis_reply_has_(live, "CLUSTER INFO", "cluster_state:fail")); t++) redis_sleep_ms(10);
    cr_assert(down, "the cluster never went down");
    kvt_store_page_t q[NK];
    pages_of(q, NK, 3000, NK);
    for (int b = 0; b < BATCHES; b++) {
        sres_t r = run_op(E.store, kvt_store_get, q, NK);
        cr_assert_eq(r.count, 0u, "batch %d served %zu keys of a cluster that is down", b, r.count);
    }
    kvt_store_stats_t st = sstats(E.store, KVT_STORE_GET);
    fprintf(stderr, "store_down: cluster down (CLUSTERDOWN), %d batches of %d gets: failures %llu, retried replies %llu, "
                    "map reloads %llu, round trips %llu\n",
            BATCHES, NK, (unsigned long long)st.failures, (unsigned long long)st.tryagain, (unsigned long long)st.map_refreshes,
            (unsigned long long)st.round_trips);
    cr_assert_eq(st.failures, (uint64_t)BATCHES * NK);
    cr_assert_leq(st.tryagain, (uint64_t)NK, "CLUSTERDOWN replies retried round after round");
    cr_assert_leq(st.round_trips, 2u * BATCHES, "the down masters were asked again in every round");
    cr_assert_leq(st.map_refreshes, 4u);
}
