/* The redis backend against a real redis-server (tests/common/redis.h):
 * round trips byte for byte, wrong objects refused, maxmemory, a server
 * that goes away. Every server is stopped in .fini, pass or fail. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>

#include "common/proc.h"
#include "common/redis.h"
#include "helpers.h"

static senv_t E;
static redis_srv_t S;
static char url[128];

static void teardown(void) {
    senv_fini(&E);
    redis_stop(&S);
}

static void start(const char *const *extra) {
    cr_assert_eq(redis_start(&S, extra), 0, "redis-server did not start");
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d", S.port);
}

TestSuite(store_redis, .fini = teardown);

Test(store_redis, roundtrip) {
    start(NULL);
    senv_init(&E, 128, 4, 4096, KVT_LAYOUT_LAYER_FIRST);
    cr_assert_eq(senv_open(&E, url), KVT_OK, "%s", kvt_store_last_error(NULL));
    cr_assert_str_eq(kvt_store_backend(E.store), "redis");
    roundtrip(&E, 64);
    kvt_store_stats_t st = sstats(E.store, KVT_STORE_PUT);
    cr_assert_eq(st.calls, 1u);
    cr_assert_eq(st.round_trips, 1u, "one pipelined round trip for a batch on one node");
    cr_assert_gt(st.latency_ns.count, 0u);
}

/* exists on the caller's thread (its own connection, one pipelined round
 * trip) counts what the workers' exists counts, over every sub-range of a
 * chain with holes; with the server gone it counts nothing and says why. */
Test(store_redis, exists_leading_is_the_batch_exists_count) {
    start(NULL);
    senv_init(&E, 32, 1, 256, KVT_LAYOUT_PAGE_FIRST);
    E.cfg.retries = 1;
    cr_assert_eq(senv_open(&E, url), KVT_OK);
    kvt_store_page_t p[24];
    bool stored[24];
    put_with_holes(&E, p, 24, 900, stored);
    exists_leading_matches(&E, p, stored, 24);
    uint64_t rt = sstats(E.store, KVT_STORE_EXISTS).round_trips;
    size_t c = 99;
    cr_assert_eq(kvt_store_exists_leading(E.store, p, 24, &c), KVT_OK);
    cr_assert_eq(c, 5u);
    cr_assert_eq(sstats(E.store, KVT_STORE_EXISTS).round_trips - rt, 1u, "24 keys, one round trip");
    redis_stop(&S);
    cr_assert_eq(kvt_store_exists_leading(E.store, p, 4, &c), KVT_OK);
    cr_assert_eq(c, 0u, "a store that is down holds nothing");
    cr_assert(strstr(kvt_store_last_error(E.store), "failed") != NULL, "%s", kvt_store_last_error(E.store));
    cr_assert_eq(kvt_store_exists_leading(E.store, p, 0, &c), KVT_EINVAL);
}

/* A server that stops answering (SIGSTOP): the script's wait runs out,
 * the node is marked down and the call fails without asking again (one
 * round trip, not the script's and then the pipelined path's: each waits
 * the whole timeout). */
Test(store_redis, exists_leading_waits_for_a_silent_server_once) {
    start(NULL);
    senv_init(&E, 8, 1, 256, KVT_LAYOUT_PAGE_FIRST);
    E.cfg.timeout_ms = 300;
    cr_assert_eq(senv_open(&E, url), KVT_OK);
    kvt_store_page_t p[4];
    bool stored[4];
    put_with_holes(&E, p, 4, 100, stored);
    size_t c = 99;
    cr_assert_eq(kvt_store_exists_leading(E.store, p, 4, &c), KVT_OK); /* connected, the script known */
    cr_assert_eq(kill(S.pid, SIGSTOP), 0);
    uint64_t rt = sstats(E.store, KVT_STORE_EXISTS).round_trips;
    cr_assert_eq(kvt_store_exists_leading(E.store, p, 4, &c), KVT_OK);
    uint64_t asked = sstats(E.store, KVT_STORE_EXISTS).round_trips - rt;
    cr_assert_eq(kill(S.pid, SIGCONT), 0);
    cr_assert_eq(c, 0u, "a silent server holds nothing");
    cr_assert_eq(asked, 1u, "the silent server was asked %llu times", (unsigned long long)asked);
}

/* Key p's value, written behind the store's back: n zero bytes. */
static void set_zeros(const kvt_store_page_t *p, size_t n) {
    char hex[33];
    kvt_store_key(E.store, &p->hash, hex);
    char *junk = calloc(1, n);
    redisReply *r = redis_cmd(S.port, "SET kvt:%s %b", hex, junk, n);
    cr_assert(r && r->type == REDIS_REPLY_STATUS);
    freeReplyObject(r);
    free(junk);
}

/* A get batch whose replies mix values with misses and wrong-sized objects:
 * hiredis parses those, reading ahead into the next values, which then
 * start in its buffer and end on the socket. Pages larger than hiredis's
 * read size, pieces per layer (a layer-first tier) and more bytes than the
 * window of values asked at once, so that every way a value is split is
 * met; each page against the model. */
Test(store_redis, values_misses_and_wrong_sizes_in_one_get) {
    start(NULL);
    senv_init(&E, 96, 4, 32768, KVT_LAYOUT_LAYER_FIRST); /* 128 KiB pages in 4 pieces, more than a get's window */
    cr_assert_eq(senv_open(&E, url), KVT_OK);
    enum { N = 40 };
    kvt_store_page_t p[N], q[N];
    pages_of(p, N, 700, 0);
    pages_of(q, N, 700, 48);
    fill(&E, 700, 0, N);
    uint8_t want[N];
    for (int i = 0; i < N; i++) {
        want[i] = i % 5 == 1 ? KVT_STORE_MISS : i % 7 == 3 ? KVT_STORE_BAD : KVT_STORE_OK;
        if (want[i] == KVT_STORE_MISS) continue;
        cr_assert_eq(run_op(E.store, kvt_store_put, &p[i], 1).count, 1u);
        if (want[i] == KVT_STORE_BAD) /* a short object (hiredis) or the right size, garbled (in place) */
            set_zeros(&p[i], i % 2 ? 100 : kvt_store_object_bytes(E.store));
    }
    for (int round = 0; round < 3; round++) {
        fill(&E, 99, 48, N); /* not what any key holds */
        sres_t r = run_op(E.store, kvt_store_get, q, N);
        for (int i = 0; i < N; i++) {
            cr_assert_eq(r.r[i], want[i], "key %d: result %d, expected %d", i, r.r[i], want[i]);
            if (want[i] == KVT_STORE_OK) cr_assert(check(&E, 700 + (uint64_t)i, 48 + (uint32_t)i), "key %d: page differs", i);
            if (want[i] == KVT_STORE_BAD) cr_assert(!check(&E, 700 + (uint64_t)i, 48 + (uint32_t)i));
        }
    }
    cr_assert_eq(sstats(E.store, KVT_STORE_GET).reconnects, 0u, "the replies were read in step");
}

/* A value longer than an object is refused unread, and the connection it
 * came on is dropped: whatever followed it there is out of step. Small
 * objects after a miss (which hiredis parses, reading ahead), so that the
 * refused value and the replies after it are in hiredis's buffer: they were
 * handed to the next keys (each its predecessor's, refused as another
 * key's object). The keys after it are asked again and served. */
Test(store_redis, a_value_longer_than_an_object_after_a_miss) {
    start(NULL);
    senv_init(&E, 32, 1, 1024, KVT_LAYOUT_PAGE_FIRST);
    E.cfg.threads = 1; /* every batch on one connection */
    cr_assert_eq(senv_open(&E, url), KVT_OK);
    enum { N = 12 };
    kvt_store_page_t p[N], q[N];
    pages_of(p, N, 800, 0);
    pages_of(q, N, 800, 16);
    put_filled(&E, p, N, 800);
    char hex[33];
    kvt_store_key(E.store, &p[1].hash, hex);
    freeReplyObject(redis_cmd(S.port, "DEL kvt:%s", hex));
    set_zeros(&p[2], kvt_store_object_bytes(E.store) + 1);
    for (int round = 0; round < 2; round++) {
        fill(&E, 99, 16, N);
        sres_t g = run_op(E.store, kvt_store_get, q, N);
        for (int i = 0; i < N; i++) {
            uint8_t want = i == 1 ? KVT_STORE_MISS : i == 2 ? KVT_STORE_BAD : KVT_STORE_OK;
            cr_assert_eq(g.r[i], want, "round %d key %d: result %d, expected %d", round, i, g.r[i], want);
            if (want == KVT_STORE_OK) cr_assert(check(&E, 800 + (uint64_t)i, 16 + (uint32_t)i), "key %d: page differs", i);
        }
    }
    kvt_store_stats_t st = sstats(E.store, KVT_STORE_GET);
    cr_assert_eq(st.bad_objects, 2u, "only the long value is a bad object (%llu)", (unsigned long long)st.bad_objects);
    cr_assert_eq(st.failures, 0u);
    sres_t e = run_op(E.store, kvt_store_exists, p + 3, N - 3);
    cr_assert_eq(e.count, (size_t)N - 3, "the store was marked down");
    /* the long value last in its batch: its connection is dropped then, not met by the next batch */
    kvt_store_page_t last[2] = {q[0], q[2]};
    sres_t g = run_op(E.store, kvt_store_get, last, 2);
    cr_assert(g.r[0] == KVT_STORE_OK && g.r[1] == KVT_STORE_BAD);
    uint64_t reconnects = sstats(E.store, KVT_STORE_GET).reconnects;
    g = run_op(E.store, kvt_store_get, q + 3, N - 3);
    cr_assert_eq(g.count, (size_t)N - 3);
    cr_assert_eq(sstats(E.store, KVT_STORE_GET).reconnects, reconnects, "the next batch met the refused connection");
}

/* A batch of puts of several MiB (each page written from the tier as it is
 * appended), still one round trip, served back byte for byte. */
Test(store_redis, batch_of_mebibytes) {
    start(NULL);
    senv_init(&E, 96, 4, 16384, KVT_LAYOUT_LAYER_FIRST); /* 64 KiB pages */
    cr_assert_eq(senv_open(&E, url), KVT_OK, "%s", kvt_store_last_error(NULL));
    kvt_store_page_t p[48], q[48];
    pages_of(p, 48, 500, 0);
    pages_of(q, 48, 500, 48);
    fill(&E, 500, 0, 48);
    wipe(&E, 48, 48);
    sres_t r = run_op(E.store, kvt_store_put, p, 48); /* 3 MiB */
    cr_assert_eq(r.count, 48u);
    cr_assert_eq(sstats(E.store, KVT_STORE_PUT).round_trips, 1u);
    r = run_op(E.store, kvt_store_get, q, 48);
    cr_assert_eq(r.count, 48u);
    for (uint32_t i = 0; i < 48; i++) cr_assert(check(&E, 500 + i, 48 + i), "page %u differs from what was put", i);
    redisReply *d = redis_cmd(S.port, "DBSIZE");
    cr_assert(d && d->type == REDIS_REPLY_INTEGER && d->integer == 48);
    freeReplyObject(d);
}

/* Garbage, another key's object and a truncated one under our key. */
Test(store_redis, wrong_objects_refused) {
    start(NULL);
    senv_init(&E, 8, 2, 1024, KVT_LAYOUT_PAGE_FIRST);
    cr_assert_eq(senv_open(&E, url), KVT_OK);
    kvt_store_page_t p[2];
    put_filled(&E, p, 2, 10);
    char a[33], b[33];
    kvt_store_key(E.store, &p[0].hash, a);
    kvt_store_key(E.store, &p[1].hash, b);
    redisReply *r = redis_cmd(S.port, "GET kvt:%s", b);
    cr_assert(r && r->type == REDIS_REPLY_STRING);
    size_t ob = kvt_store_object_bytes(E.store);
    cr_assert_eq((size_t)r->len, ob);
    char *other = malloc(ob);
    memcpy(other, r->str, ob);
    freeReplyObject(r);
    const char *junk = "this is not a kvtier object at all, not even close to one ...........................";
    struct {
        const char *bytes;
        size_t n;
    } bad[] = {{junk, strlen(junk)}, {other, ob}, {other, ob / 2}};
    kvt_store_page_t q = {.hash = p[0].hash, .page = 5};
    for (int k = 0; k < 3; k++) {
        r = redis_cmd(S.port, "SET kvt:%s %b", a, bad[k].bytes, bad[k].n);
        cr_assert(r && r->type == REDIS_REPLY_STATUS);
        freeReplyObject(r);
        wipe(&E, 5, 1);
        cr_assert_eq(run_op(E.store, kvt_store_get, &q, 1).r[0], KVT_STORE_BAD, "case %d served", k);
        cr_assert(!check(&E, 10, 5));
    }
    cr_assert_eq(sstats(E.store, KVT_STORE_GET).bad_objects, 3u);
    free(other);
}

/* maxmemory with noeviction: some puts fail, counted; what was stored is served. */
Test(store_redis, maxmemory_puts_fail_cleanly) {
    const char *extra[] = {"--maxmemory", "3mb", "--maxmemory-policy", "noeviction", NULL};
    start(extra);
    senv_init(&E, 128, 1, 64 * 1024, KVT_LAYOUT_PAGE_FIRST);
    cr_assert_eq(senv_open(&E, url), KVT_OK);
    kvt_store_page_t p[100];
    pages_of(p, 100, 500, 0);
    fill(&E, 500, 0, 100);
    size_t stored = 0;
    for (int b = 0; b < 10; b++) {
        sres_t r = run_op(E.store, kvt_store_put, p + b * 10, 10);
        stored += r.count;
        if (r.count < 10) cr_assert_eq(r.status, KVT_EIO);
    }
    kvt_store_stats_t st = sstats(E.store, KVT_STORE_PUT);
    cr_assert_gt(st.failures, 0u, "maxmemory never refused a put");
    fprintf(stderr, "store_redis: maxmemory 3mb: %zu of 100 puts of 64 KiB stored, %" PRIu64 " refused\n", stored,
            st.failures);
    cr_assert_eq(st.hits + st.failures, 100u);
    cr_assert(strstr(kvt_store_last_error(E.store), "OOM") != NULL, "%s", kvt_store_last_error(E.store));
    /* the stored ones come back whole: the exists leading run, then a get */
    sres_t ex = run_op(E.store, kvt_store_exists, p, 100);
    cr_assert_eq(ex.count, stored);
    kvt_store_page_t q[100];
    pages_of(q, stored, 500, 0);
    wipe(&E, 0, stored);
    cr_assert_eq(run_op(E.store, kvt_store_get, q, stored).count, stored);
    for (size_t i = 0; i < stored; i++) cr_assert(check(&E, 500 + i, (uint32_t)i));
}

/* The server dies: gets are misses (failures), puts fail, counted, with a message. */
Test(store_redis, store_down) {
    start(NULL);
    senv_init(&E, 16, 1, 1024, KVT_LAYOUT_PAGE_FIRST);
    E.cfg.retries = 2;
    E.cfg.timeout_ms = 300;
    cr_assert_eq(senv_open(&E, url), KVT_OK);
    kvt_store_page_t p[4];
    put_filled(&E, p, 4, 1);
    redis_kill(&S);
    sres_t r = run_op(E.store, kvt_store_get, p, 4);
    cr_assert_eq(r.count, 0u);
    cr_assert_eq(r.status, KVT_EIO);
    for (int i = 0; i < 4; i++) cr_assert_eq(r.r[i], KVT_STORE_FAILED);
    /* found down: the next batches fail at once, not after their retries (the message names the
     * path taken: "the store is down", not "failed after 2 retries"; no clock in the check) */
    r = run_op(E.store, kvt_store_put, p, 4);
    cr_assert_eq(r.count, 0u);
    cr_assert(strstr(kvt_store_last_error(E.store), "the store is down") != NULL, "%s", kvt_store_last_error(E.store));
    r = run_op(E.store, kvt_store_exists, p, 4);
    cr_assert_eq(r.count, 0u);
    cr_assert_eq(sstats(E.store, KVT_STORE_GET).failures, 4u);
    cr_assert_eq(sstats(E.store, KVT_STORE_PUT).failures, 4u);
    cr_assert(strstr(kvt_store_last_error(E.store), "failed") != NULL, "%s", kvt_store_last_error(E.store));
}

/* Back up after a restart on the same port: the store reconnects by itself. */
Test(store_redis, reconnects_after_restart) {
    start(NULL);
    senv_init(&E, 16, 1, 1024, KVT_LAYOUT_PAGE_FIRST);
    E.cfg.retries = 3;
    E.cfg.threads = 1; /* one connection, the one the restart breaks */
    cr_assert_eq(senv_open(&E, url), KVT_OK);
    kvt_store_page_t p[4];
    put_filled(&E, p, 4, 1);
    int port = S.port;
    redis_stop(&S);
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    /* same port again */
    redis_srv_t again;
    memset(&again, 0, sizeof(again));
    snprintf(again.dir, sizeof(again.dir), "/tmp/kvt-redis-XXXXXX");
    cr_assert_not_null(mkdtemp(again.dir));
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int nul = open("/dev/null", O_RDWR);
        dup2(nul, 1), dup2(nul, 2);
        execlp("redis-server", "redis-server", "--port", ps, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir",
               again.dir, (char *)NULL);
        _exit(127);
    }
    S = again;
    S.pid = pid;
    S.port = port;
    for (int i = 0; i < 300 && !redis_reply_has_(port, "PING", "PONG"); i++) redis_sleep_ms(10);
    sres_t r = run_op(E.store, kvt_store_put, p, 4);
    cr_assert_eq(r.count, 4u);
    cr_assert_gt(sstats(E.store, KVT_STORE_PUT).reconnects + sstats(E.store, KVT_STORE_GET).reconnects, 0u);
    cr_assert_eq(run_op(E.store, kvt_store_exists, p, 4).count, 4u);
}

/* Found by the soak (tests/faults/soak): Redis dropping the store's
 * connections (CLIENT KILL) while a batch was being written ended the
 * process with SIGPIPE, hiredis writing with write(2) to the closed socket.
 * The store's threads hold SIGPIPE blocked: the write fails with EPIPE, the
 * key is retried on a new connection, and the process, here with SIGPIPE's
 * default action (the end of it), lives on. */
static atomic_bool killing;

static void *client_killer(void *arg) {
    int port = *(int *)arg;
    while (atomic_load(&killing)) {
        redisReply *r = redis_cmd(port, "CLIENT KILL TYPE normal");
        if (r) freeReplyObject(r);
        redis_sleep_ms(3);
    }
    return NULL;
}

Test(store_redis, a_dropped_connection_is_no_sigpipe, .timeout = 120) {
    signal(SIGPIPE, SIG_DFL);
    start(NULL);
    senv_init(&E, 128, 1, 98304, KVT_LAYOUT_PAGE_FIRST); /* 6 MiB a batch: gets through their window */
    E.cfg.threads = 1;
    cr_assert_eq(senv_open(&E, url), KVT_OK);
    kvt_store_page_t p[64], q[64];
    put_filled(&E, p, 64, 1);
    pages_of(q, 64, 1, 64);
    uint64_t stored = 0, served = 0;
    atomic_store(&killing, true);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, client_killer, &S.port), 0);
    for (int k = 0; k < 100; k++) {
        stored += run_op(E.store, kvt_store_put, p, 64).count;
        wipe(&E, 64, 64);
        sres_t g = run_op(E.store, kvt_store_get, q, 64); /* cut within a value, too: what is served is whole */
        for (uint32_t i = 0; i < 64; i++)
            if (g.r[i] == KVT_STORE_OK) {
                cr_assert(check(&E, 1 + i, 64 + i), "page %u served torn", i);
                served++;
            }
    }
    atomic_store(&killing, false);
    pthread_join(th, NULL);
    kvt_store_stats_t st = sstats(E.store, KVT_STORE_PUT);
    cr_assert_gt(st.reconnects, 0u, "the connection was dropped under the writes");
    fprintf(stderr, "store_redis: %" PRIu64 " of 6400 puts stored and %" PRIu64 " gets served while the connection was dropped "
                    "every 3 ms, %" PRIu64 " reconnects\n", stored, served, st.reconnects + sstats(E.store, KVT_STORE_GET).reconnects); /* (slow builds may store none: the store is known down meanwhile) */
    wipe(&E, 0, 64);
    /* dropped often enough, the store is known down for a second (failing at once): then served again */
    uint64_t t0 = kvt_now_ns();
    sres_t g = run_op(E.store, kvt_store_get, p, 64);
    int rounds = 1;
    while (g.count < 64 && kvt_now_ns() - t0 < 20ull * 1000000000ull) { /* a deadline, not a bound checked */
        redis_sleep_ms(100);
        g = run_op(E.store, kvt_store_get, p, 64);
        rounds++;
    }
    fprintf(stderr, "store_redis: served again after %d gets, %.2f s\n", rounds, (double)(kvt_now_ns() - t0) / 1e9);
    int miss = 0, bad = 0, failed = 0;
    for (int i = 0; i < 64; i++) miss += g.r[i] == KVT_STORE_MISS, bad += g.r[i] == KVT_STORE_BAD, failed += g.r[i] == KVT_STORE_FAILED;
    cr_assert_eq(g.count, 64u, "after %d gets: missing %d, bad %d, failed %d: %s", rounds, miss, bad, failed,
                 kvt_store_last_error(E.store));
    for (uint32_t i = 0; i < 64; i++) cr_assert(check(&E, 1 + i, i), "page %u", i);
}

Test(store_redis, cluster_url_on_a_standalone_server) {
    start(NULL);
    senv_init(&E, 4, 1, 64, KVT_LAYOUT_PAGE_FIRST);
    char u[128];
    snprintf(u, sizeof(u), "redis-cluster://127.0.0.1:%d", S.port);
    kvt_store_t *s = NULL;
    cr_assert_eq(kvt_store_open(&s, u, &E.cfg), KVT_EIO);
    cr_assert(strstr(kvt_store_last_error(NULL), "CLUSTER SHARDS") != NULL, "%s", kvt_store_last_error(NULL));
}

/* A batch on the caller's thread (kvt_store_run) does what a queued one does. */
Test(store_redis, run_on_the_callers_thread) {
    start(NULL);
    senv_init(&E, 48, 2, 512, KVT_LAYOUT_LAYER_FIRST);
    cr_assert_eq(senv_open(&E, url), KVT_OK);
    run_matches_queued(&E, 4000);
}
