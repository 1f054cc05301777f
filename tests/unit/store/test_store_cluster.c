/* The redis backend on a real six-node Redis Cluster (three masters, three
 * replicas, tests/common/redis.h): batches split across nodes, ASK and
 * MOVED while a slot moves, a master killed and its replica followed. The
 * cluster is stopped in .fini, pass or fail. */
#include <criterion/criterion.h>
#include <unistd.h>
#include <stdio.h>

#include "common/redis.h"
#include "helpers.h"

static senv_t E;
static redis_cluster_t C;

static void teardown(void) {
    senv_fini(&E);
    cluster_stop(&C);
}

TestSuite(store_cluster, .fini = teardown, .timeout = 60);

static void start(void) {
    cr_assert_eq(cluster_start(&C), 0, "the cluster did not come up (see %s/create.log)", C.n[0].dir);
}

/* The port of the master serving slot, from CLUSTER SLOTS of a live node. */
static int master_of(unsigned slot) {
    for (int i = 0; i < CLUSTER_NODES; i++) {
        if (C.n[i].pid == 0) continue;
        redisReply *r = redis_cmd(C.n[i].port, "CLUSTER SLOTS");
        if (r == NULL) continue;
        int port = -1;
        for (size_t k = 0; r->type == REDIS_REPLY_ARRAY && k < r->elements; k++) {
            redisReply *e = r->element[k];
            if ((unsigned)e->element[0]->integer <= slot && slot <= (unsigned)e->element[1]->integer)
                port = (int)e->element[2]->element[1]->integer;
        }
        freeReplyObject(r);
        return port;
    }
    return -1;
}

static void node_id(int port, char id[64]) {
    redisReply *r = redis_cmd(port, "CLUSTER MYID");
    cr_assert(r && r->type == REDIS_REPLY_STRING);
    snprintf(id, 64, "%s", r->str);
    freeReplyObject(r);
}

static int node_of_port(int port) {
    for (int i = 0; i < CLUSTER_NODES; i++)
        if (C.n[i].port == port) return i;
    return -1;
}

/* The slot of a page's key, as the cluster itself computes it (CLUSTER
 * KEYSLOT): a model independent of the client's CRC16. */
static unsigned slot_of(const kvt_hash128_t *h, char hex[33]) {
    kvt_store_key(E.store, h, hex);
    redisReply *r = NULL;
    for (int i = 0; i < CLUSTER_NODES && !(r && r->type == REDIS_REPLY_INTEGER); i++) { /* any live node answers */
        if (r) freeReplyObject(r);
        r = redis_cmd(C.n[i].port, "CLUSTER KEYSLOT kvt:%s", hex);
    }
    cr_assert(r && r->type == REDIS_REPLY_INTEGER, "CLUSTER KEYSLOT: %s", r && r->str ? r->str : "no reply");
    unsigned slot = (unsigned)r->integer;
    freeReplyObject(r);
    return slot;
}

static void ok_cmd(int port, const char *what, redisReply *r) {
    cr_assert(r && r->type != REDIS_REPLY_ERROR, "%d: %s: %s", port, what, r ? r->str : "no reply");
    freeReplyObject(r);
}

Test(store_cluster, batches_split_across_nodes) {
    start();
    senv_init(&E, 128, 2, 8192, KVT_LAYOUT_PAGE_FIRST);
    cr_assert_eq(senv_open(&E, C.url), KVT_OK, "%s", kvt_store_last_error(NULL));
    cr_assert_str_eq(kvt_store_backend(E.store), "redis-cluster");
    /* the model: which master each key's slot says */
    kvt_store_page_t p[64];
    pages_of(p, 64, 1000, 0);
    int masters[3] = {0}, nm = 0;
    for (int i = 0; i < 64; i++) {
        char hex[33];
        int m = master_of(slot_of(&p[i].hash, hex));
        bool seen = false;
        for (int j = 0; j < nm; j++) seen |= masters[j] == m;
        if (!seen) masters[nm++] = m;
    }
    cr_assert_eq(nm, 3, "64 keys should land on all three masters");
    roundtrip(&E, 64);
    kvt_store_stats_t st = sstats(E.store, KVT_STORE_PUT);
    cr_assert_eq(st.round_trips, 3u, "one pipelined round trip per master");
    cr_assert_eq(st.moved + st.ask, 0u);
    /* exists on the caller's thread: a round trip per master, the workers' count */
    bool stored[24];
    for (int i = 0; i < 24; i++) stored[i] = true;
    fill(&E, 1000, 0, 64);
    cr_assert_eq(run_op(E.store, kvt_store_put, p, 64).count, 64u);
    uint64_t rt = sstats(E.store, KVT_STORE_EXISTS).round_trips;
    size_t c = 0;
    cr_assert_eq(kvt_store_exists_leading(E.store, p, 64, &c), KVT_OK);
    cr_assert_eq(c, 64u);
    cr_assert_eq(sstats(E.store, KVT_STORE_EXISTS).round_trips - rt, 3u);
    kvt_store_page_t chain[24];
    for (int i = 0; i < 24; i++) {
        chain[i] = p[i];
        if (i % 5 == 3) chain[i].hash.hi ^= 1, stored[i] = false; /* a key never put */
    }
    exists_leading_matches(&E, chain, stored, 24);
    /* every key is on the master its slot names (the independent model) */
    fill(&E, 1000, 0, 8);
    cr_assert_eq(run_op(E.store, kvt_store_put, p, 8).count, 8u);
    for (int i = 0; i < 8; i++) {
        char hex[33];
        int m = master_of(slot_of(&p[i].hash, hex));
        redisReply *r = redis_cmd(m, "STRLEN kvt:%s", hex);
        cr_assert(r && r->type == REDIS_REPLY_INTEGER);
        cr_assert_eq((uint64_t)r->integer, kvt_store_object_bytes(E.store), "key %d is not on its slot's master", i);
        freeReplyObject(r);
    }
}

/* A slot moves from A to B: ASK while it migrates, MOVED after. */
Test(store_cluster, ask_and_moved_while_a_slot_moves) {
    start();
    senv_init(&E, 64, 2, 4096, KVT_LAYOUT_PAGE_FIRST);
    cr_assert_eq(senv_open(&E, C.url), KVT_OK, "%s", kvt_store_last_error(NULL));
    kvt_store_page_t p[16];
    pages_of(p, 16, 70, 0);
    fill(&E, 70, 0, 16);
    cr_assert_eq(run_op(E.store, kvt_store_put, p, 16).count, 16u);
    char hex[33], ida[64], idb[64];
    unsigned slot = slot_of(&p[0].hash, hex);
    int a = master_of(slot), b = -1;
    for (unsigned s = 0; s < 16384 && b < 0; s += 97)
        if (master_of(s) != a) b = master_of(s);
    cr_assert(a > 0 && b > 0);
    node_id(a, ida);
    node_id(b, idb);
    ok_cmd(b, "importing", redis_cmd(b, "CLUSTER SETSLOT %u IMPORTING %s", slot, ida));
    ok_cmd(a, "migrating", redis_cmd(a, "CLUSTER SETSLOT %u MIGRATING %s", slot, idb));
    char key[40];
    snprintf(key, sizeof(key), "kvt:%s", hex);
    ok_cmd(a, "migrate", redis_cmd(a, "MIGRATE 127.0.0.1 %d %s 0 5000", b, key));
    /* migrating: A answers ASK for the key it no longer has */
    kvt_store_page_t q = {.hash = p[0].hash, .page = 40};
    wipe(&E, 40, 1);
    cr_assert_eq(run_op(E.store, kvt_store_get, &q, 1).r[0], KVT_STORE_OK);
    cr_assert(check(&E, 70, 40));
    kvt_store_stats_t st = sstats(E.store, KVT_STORE_GET);
    cr_assert_geq(st.ask, 1u);
    cr_assert_eq(st.moved, 0u);
    /* exists on the caller's thread: the script at A meets a key A no longer
     * serves and fails, and the pipelined path follows the ASK: nothing is
     * counted absent that is there */
    bool stored[16];
    for (int i = 0; i < 16; i++) stored[i] = true;
    exists_leading_matches(&E, p, stored, 16);
    cr_assert_geq(sstats(E.store, KVT_STORE_EXISTS).ask, 1u);
    /* the slot is B's now, everywhere; our map still says A: MOVED */
    for (int i = 0; i < CLUSTER_NODES; i++)
        if (C.n[i].pid) {
            redisReply *r = redis_cmd(C.n[i].port, "CLUSTER SETSLOT %u NODE %s", slot, idb);
            if (r) freeReplyObject(r);
        }
    wipe(&E, 40, 1);
    cr_assert_eq(run_op(E.store, kvt_store_get, &q, 1).r[0], KVT_STORE_OK);
    cr_assert(check(&E, 70, 40));
    st = sstats(E.store, KVT_STORE_GET);
    cr_assert_geq(st.moved, 1u);
    cr_assert_geq(st.map_refreshes, 1u);
    /* and everything else is still served, byte for byte */
    kvt_store_page_t all[16];
    pages_of(all, 16, 70, 20);
    wipe(&E, 20, 16);
    sres_t r = run_op(E.store, kvt_store_get, all, 16);
    cr_assert_eq(r.count, 16u);
    for (int i = 0; i < 16; i++) cr_assert(check(&E, 70 + (uint64_t)i, 20 + (uint32_t)i));
    cr_assert_eq(sstats(E.store, KVT_STORE_GET).failures, 0u);
    (void)node_of_port;
}

/* Waits until master `port`'s replicas have its whole replication stream. */
static void wait_replicated(int port) {
    for (int t = 0; t < 500; t++) {
        redisReply *r = redis_cmd(port, "ROLE");
        bool done = false;
        if (r && r->type == REDIS_REPLY_ARRAY && r->elements >= 3 && r->element[2]->elements > 0) {
            long long off = r->element[1]->integer;
            done = true;
            for (size_t k = 0; k < r->element[2]->elements; k++)
                done &= atoll(r->element[2]->element[k]->element[2]->str) >= off;
        }
        if (r) freeReplyObject(r);
        if (done) return;
        redis_sleep_ms(10);
    }
    cr_assert_fail("replicas of %d did not catch up", port);
}

/* A master dies; its replica is promoted; the store follows and gets resume. */
Test(store_cluster, master_killed_replica_followed) {
    start();
    senv_init(&E, 128, 2, 4096, KVT_LAYOUT_PAGE_FIRST);
    E.cfg.retries = 4;
    E.cfg.timeout_ms = 500;
    cr_assert_eq(senv_open(&E, C.url), KVT_OK, "%s", kvt_store_last_error(NULL));
    kvt_store_page_t p[32];
    pages_of(p, 32, 900, 0);
    fill(&E, 900, 0, 32);
    cr_assert_eq(run_op(E.store, kvt_store_put, p, 32).count, 32u);
    char hex[33];
    int a = master_of(slot_of(&p[0].hash, hex));
    wait_replicated(a);
    redis_kill(&C.n[node_of_port(a)]);
    kvt_store_page_t q[32];
    pages_of(q, 32, 900, 40);
    uint64_t t0 = kvt_now_ns();
    size_t got = 0;
    int rounds = 0;
    while (kvt_now_ns() - t0 < 30ull * 1000000000ull) {
        wipe(&E, 40, 32);
        sres_t r = run_op(E.store, kvt_store_get, q, 32);
        rounds++;
        for (int i = 0; i < 32; i++) /* whatever is served is right */
            if (r.r[i] == KVT_STORE_OK) cr_assert(check(&E, 900 + (uint64_t)i, 40 + (uint32_t)i));
        cr_assert_eq(sstats(E.store, KVT_STORE_GET).bad_objects, 0u);
        got = r.count;
        if (got == 32) break;
    }
    cr_assert_eq(got, 32u, "gets did not resume after the failover (%d rounds)", rounds);
    kvt_store_stats_t st = sstats(E.store, KVT_STORE_GET);
    cr_assert_gt(st.reconnects + st.map_refreshes, 0u);
    /* the node asked may learn of the failover a moment after the store did */
    int now = master_of(slot_of(&p[0].hash, hex));
    for (int k = 0; k < 100 && (now <= 0 || now == a); k++) {
        usleep(100000);
        now = master_of(slot_of(&p[0].hash, hex));
    }
    cr_assert(now > 0 && now != a, "the slot should be served by the promoted replica (still %d)", now);
    /* and puts go to the new master */
    cr_assert_eq(run_op(E.store, kvt_store_put, p, 32).count, 32u);
}

/* `redis-cli --cluster reshard` moves 1000 slots while gets run: every get
 * is served, byte for byte, through the MOVED (and, when a get meets a slot
 * mid-migration, ASK) paths; none fails. */
Test(store_cluster, reshard_during_gets) {
    start();
    senv_init(&E, 256, 1, 4096, KVT_LAYOUT_PAGE_FIRST);
    cr_assert_eq(senv_open(&E, C.url), KVT_OK, "%s", kvt_store_last_error(NULL));
    kvt_store_page_t p[128];
    pages_of(p, 128, 5000, 0);
    fill(&E, 5000, 0, 128);
    cr_assert_eq(run_op(E.store, kvt_store_put, p, 128).count, 128u);
    int a = master_of(0), b = master_of(16383);
    cr_assert(a > 0 && b > 0 && a != b);
    char ida[64], idb[64], from[8];
    node_id(a, ida);
    node_id(b, idb);
    snprintf(from, sizeof(from), "%d", a);
    char addr[32], log[200];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", a);
    snprintf(log, sizeof(log), "%s/reshard.log", C.n[0].dir);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1), dup2(fd, 2);
        execlp("redis-cli", "redis-cli", "--cluster", "reshard", addr, "--cluster-from", ida, "--cluster-to", idb,
               "--cluster-slots", "1000", "--cluster-yes", "--cluster-pipeline", "4", (char *)NULL);
        _exit(127);
    }
    kvt_store_page_t q[128];
    pages_of(q, 128, 5000, 128);
    int st = 0, rounds = 0;
    bool done = false;
    while (!done) {
        done = waitpid(pid, &st, WNOHANG) == pid;
        wipe(&E, 128, 128);
        sres_t r = run_op(E.store, kvt_store_get, q, 128);
        rounds++;
        cr_assert_eq(r.count, 128u, "round %d: %zu of 128 served", rounds, r.count);
        for (int i = 0; i < 128; i++) cr_assert(check(&E, 5000 + (uint64_t)i, 128 + (uint32_t)i));
    }
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "redis-cli --cluster reshard failed (see %s)", log);
    kvt_store_stats_t s = sstats(E.store, KVT_STORE_GET);
    cr_assert_eq(s.failures, 0u);
    cr_assert_eq(s.bad_objects, 0u);
    cr_assert_gt(s.moved, 0u, "no MOVED seen in %d rounds", rounds);
    fprintf(stderr, "reshard: %d rounds of 128 gets, moved %llu, ask %llu, map reloads %llu\n", rounds,
            (unsigned long long)s.moved, (unsigned long long)s.ask, (unsigned long long)s.map_refreshes);
    (void)from;
}

/* Every node killed: the batch fails (counted, a message), the next fails at
 * once (the store is known down), nothing is served. */
Test(store_cluster, whole_cluster_down) {
    start();
    senv_init(&E, 16, 1, 1024, KVT_LAYOUT_PAGE_FIRST);
    E.cfg.retries = 2;
    E.cfg.timeout_ms = 300;
    cr_assert_eq(senv_open(&E, C.url), KVT_OK, "%s", kvt_store_last_error(NULL));
    kvt_store_page_t p[8];
    pages_of(p, 8, 40, 0);
    fill(&E, 40, 0, 8);
    cr_assert_eq(run_op(E.store, kvt_store_put, p, 8).count, 8u);
    for (int i = 0; i < CLUSTER_NODES; i++) redis_kill(&C.n[i]);
    sres_t r = run_op(E.store, kvt_store_get, p, 8);
    cr_assert_eq(r.count, 0u);
    cr_assert_eq(r.status, KVT_EIO);
    /* known down: failed at once, not after its retries (the message names the path taken) */
    r = run_op(E.store, kvt_store_put, p, 8);
    cr_assert_eq(r.count, 0u);
    cr_assert(strstr(kvt_store_last_error(E.store), "the store is down") != NULL, "%s", kvt_store_last_error(E.store));
    cr_assert_eq(sstats(E.store, KVT_STORE_GET).failures, 8u);
    cr_assert_eq(sstats(E.store, KVT_STORE_PUT).failures, 8u);
}
