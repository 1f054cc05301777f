/* The redis backend: Redis standalone (redis://HOST:PORT) and Redis Cluster
 * (redis-cluster://H:P[,H:P...]) through hiredis, one code path.
 *
 *   batch of n keys
 *     round: group the pending keys by target node (cluster: the slot map;
 *            after a redirection: the node it named, with ASKING for ASK)
 *            append every command to its node's connection  (pipelining)
 *            read every reply, node by node          (one round trip each)
 *              value / OK / integer   -> the key's result
 *              MOVED                  -> retry there; reload the slot map
 *              ASK                    -> retry there after ASKING
 *              TRYAGAIN, CLUSTERDOWN, LOADING, a lost connection
 *                                     -> retry after a backoff (map reloaded)
 *              other errors (OOM ...) -> FAILED, logged
 *     up to cfg.retries rounds; keys still pending then are FAILED
 *
 * Each worker thread has its own connections (hiredis contexts are not
 * thread-safe), opened on first use and dropped on any I/O error or timeout
 * (every connect, send and receive has cfg.timeout_ms). The slot map is
 * shared and replaced whole under a mutex, by whichever worker saw it stale.
 * Keys are "kvt:<32 hex>"; objects are the store's bytes as the value. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>

#include <hiredis/hiredis.h>

#include "../core/mem-int.h"
#include "../core/sigpipe-int.h"
#include "cluster-int.h"
#include "kvtier/error.h"
#include "store-int.h"

#define MAX_SEEDS 16
#define KEYLEN 36 /* "kvt:" + 32 hex */

typedef struct rbe {
    kvt_store_t *s;
    bool cluster;
    kvt__rnode_t seeds[MAX_SEEDS];
    unsigned nseeds;
    pthread_mutex_t mu;
    kvt__slotmap_t *map; /* cluster: under mu */
    uint64_t map_gen;
    _Atomic uint64_t down_until; /* a store found down: batches fail at once until then (ns) */
} rbe_t;

/* A batch that reached no node at all marks the store down for DOWN_NS:
 * the batches meanwhile fail at once instead of each spending its retries
 * (a cache keeps serving from L1/L2 without a queue of doomed calls); the
 * first batch after it probes again. */
#define DOWN_NS 1000000000ull

typedef struct rconn {
    char host[256];
    int port;
    redisContext *c;
    size_t unflushed; /* bytes of puts appended since the output buffer was last written out */
} rconn_t;

/* A batch of puts is written out every FLUSH_BYTES as it is appended, not
 * all at once when the replies are read: hiredis writes its output buffer
 * from the front and moves the rest down after every partial write, so one
 * buffer of a whole batch (32 MiB for 32 pages of 1 MiB) costs copies
 * quadratic in its size. */
#define FLUSH_BYTES (1u << 20)

/* Writes out what is appended. An error stays in the context and is met by
 * the next redisGetReply, which drops the connection and retries the keys. */
static void flush_out(rconn_t *c) {
    int done = 0;
    while (!done && redisBufferWrite(c->c, &done) == REDIS_OK) {
    }
    c->unflushed = 0;
}

typedef struct rworker {
    rconn_t conn[KVT__MAX_NODES + MAX_SEEDS];
    unsigned n;
    /* per-key state of the batch in progress */
    size_t cap;
    uint16_t *tnode; /* index into conn */
    uint8_t *asking, *pending;
    kvt__slotmap_t *map; /* a private copy, refreshed from the shared one */
    uint64_t map_gen;
} rworker_t;

static struct timeval tv_of(uint32_t ms) { return (struct timeval){.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000}; }

static redisContext *connect_to(const char *host, int port, uint32_t ms, char *why, size_t cap) {
    struct timeval tv = tv_of(ms);
    redisContext *c = redisConnectWithTimeout(host, port, tv);
    if (c && c->reader) kvt__redis_cap_reader(c->reader);
    if (c == NULL || c->err) {
        snprintf(why, cap, "%.200s:%d unreachable: %s", host, port, c ? c->errstr : "out of memory");
        if (c) redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    return c;
}

/* ---- the slot map ---------------------------------------------------------------- */

/* CLUSTER SHARDS from the first node that answers (the map's nodes, then the
 * seeds). KVT_OK with *out set; else the reason in why. */
static int load_map(rbe_t *b, const kvt__slotmap_t *old, kvt__slotmap_t *out, char *why, size_t cap) {
    kvt__rnode_t cand[KVT__MAX_NODES + MAX_SEEDS];
    unsigned nc = 0;
    for (unsigned i = 0; old && i < old->nnodes; i++) cand[nc++] = old->nodes[i];
    for (unsigned i = 0; i < b->nseeds; i++) cand[nc++] = b->seeds[i];
    snprintf(why, cap, "no node answered");
    for (unsigned i = 0; i < nc; i++) {
        redisContext *c = connect_to(cand[i].host, cand[i].port, kvt__store_timeout_ms(b->s), why, cap);
        if (c == NULL) continue;
        redisReply *r = redisCommand(c, "CLUSTER SHARDS");
        int rc = KVT_EIO;
        if (r == NULL) snprintf(why, cap, "%.200s:%d: %s", cand[i].host, cand[i].port, c->errstr);
        else if (r->type == REDIS_REPLY_ERROR)
            snprintf(why, cap, "%.200s:%d: CLUSTER SHARDS: %.200s (not a Redis 7 cluster node?)", cand[i].host, cand[i].port, r->str);
        else if (kvt__slotmap_parse(r, out) != KVT_OK)
            snprintf(why, cap, "%.200s:%d: CLUSTER SHARDS: no slot served by an online master", cand[i].host, cand[i].port);
        else rc = KVT_OK;
        if (r) freeReplyObject(r);
        redisFree(c);
        if (rc == KVT_OK) return KVT_OK;
    }
    return KVT_EIO;
}

static void refresh_map(rbe_t *b, rworker_t *w, kvt__sreq_t *req) {
    kvt__slotmap_t *nm = kvt__malloc(sizeof(*nm));
    if (nm == NULL) return;
    char why[512];
    req->cnt.map_refreshes++;
    if (load_map(b, w->map, nm, why, sizeof(why)) != KVT_OK) {
        kvt__store_log(b->s, "cluster slot map reload failed: %s", why);
        kvt__free(nm, sizeof(*nm));
        return;
    }
    pthread_mutex_lock(&b->mu);
    kvt__slotmap_t *old = b->map;
    b->map = nm;
    b->map_gen++;
    pthread_mutex_unlock(&b->mu);
    kvt__free(old, sizeof(*old));
}

/* The worker's copy of the shared map, when it changed. */
static void sync_map(rbe_t *b, rworker_t *w) {
    pthread_mutex_lock(&b->mu);
    if (b->map && w->map_gen != b->map_gen) {
        memcpy(w->map, b->map, sizeof(*w->map));
        w->map_gen = b->map_gen;
    }
    pthread_mutex_unlock(&b->mu);
}

/* ---- connections ---------------------------------------------------------------------- */

static int conn_index(rworker_t *w, const char *host, int port) {
    for (unsigned i = 0; i < w->n; i++)
        if (w->conn[i].port == port && strcmp(w->conn[i].host, host) == 0) return (int)i;
    if (w->n == sizeof(w->conn) / sizeof(w->conn[0])) { /* full: reuse a closed slot */
        for (unsigned i = 0; i < w->n; i++)
            if (w->conn[i].c == NULL) {
                snprintf(w->conn[i].host, sizeof(w->conn[i].host), "%s", host);
                w->conn[i].port = port;
                return (int)i;
            }
        return -1;
    }
    rconn_t *c = &w->conn[w->n];
    snprintf(c->host, sizeof(c->host), "%s", host);
    c->port = port;
    c->c = NULL;
    return (int)w->n++;
}

static void drop(rconn_t *c) {
    if (c->c) redisFree(c->c);
    c->c = NULL;
    c->unflushed = 0;
}

/* ---- one batch ------------------------------------------------------------------------- */

static int grow(rworker_t *w, size_t n) {
    if (n <= w->cap) return KVT_OK;
    size_t nc = n < 64 ? 64 : n;
    uint16_t *t = kvt__malloc(nc * sizeof(uint16_t));
    uint8_t *a = kvt__malloc(nc), *p = kvt__malloc(nc);
    if (!t || !a || !p) {
        kvt__free(t, nc * sizeof(uint16_t)), kvt__free(a, nc), kvt__free(p, nc);
        return KVT_ENOMEM;
    }
    kvt__free(w->tnode, w->cap * sizeof(uint16_t)), kvt__free(w->asking, w->cap), kvt__free(w->pending, w->cap);
    w->tnode = t, w->asking = a, w->pending = p, w->cap = nc;
    return KVT_OK;
}

static void key_name(const kvt__sreq_t *req, size_t i, char out[KEYLEN + 1]) {
    memcpy(out, "kvt:", 4);
    memcpy(out + 4, req->hex[i], 33);
}

/* Where key i goes when no redirection names a node: -1 when nowhere. */
static int route(rbe_t *b, rworker_t *w, const kvt__sreq_t *req, size_t i) {
    if (!b->cluster) return conn_index(w, b->seeds[0].host, b->seeds[0].port);
    char k[KEYLEN + 1];
    key_name(req, i, k);
    uint16_t n = w->map->slot[kvt_store_cluster_slot(k, KEYLEN)];
    if (n == KVT__NO_NODE) return -1;
    return conn_index(w, w->map->nodes[n].host, w->map->nodes[n].port);
}

/* SET key object, the object appended piece by piece to the connection's
 * output buffer (the RESP bulk string written out here): the page is copied
 * once, from the tier into hiredis's buffer, never into an object first. */
static int append_set(redisContext *c, const char k[KEYLEN + 1], const struct iovec *v, size_t nv, size_t ob) {
    char pre[96];
    int len = snprintf(pre, sizeof(pre), "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%zu\r\n", KEYLEN, k, ob);
    if (redisAppendFormattedCommand(c, pre, (size_t)len) != REDIS_OK) return -1;
    for (size_t j = 0; j < nv; j++)
        if (redisAppendFormattedCommand(c, v[j].iov_base, v[j].iov_len) != REDIS_OK) return -1;
    return redisAppendFormattedCommand(c, "\r\n", 2) == REDIS_OK ? 0 : -1;
}

/* 0, -1 (the connection is unusable: drop it), -2 (the tier page could not
 * be read: nothing was appended). */
static int append(rworker_t *w, kvt__sreq_t *req, size_t i, redisContext *c) {
    char k[KEYLEN + 1];
    key_name(req, i, k);
    struct iovec *v = NULL;
    size_t nv = 0;
    if (req->op == KVT_STORE_PUT && (nv = kvt__store_put_iov(req, i, &v)) == 0) return -2; /* before ASKING: nothing half-sent */
    if (w->asking[i] == 1 && redisAppendCommand(c, "ASKING") != REDIS_OK) return -1;
    switch (req->op) {
    case KVT_STORE_EXISTS: return redisAppendCommand(c, "EXISTS %b", k, (size_t)KEYLEN) == REDIS_OK ? 0 : -1;
    case KVT_STORE_GET: return redisAppendCommand(c, "GET %b", k, (size_t)KEYLEN) == REDIS_OK ? 0 : -1;
    case KVT_STORE_REMOVE: return redisAppendCommand(c, "DEL %b", k, (size_t)KEYLEN) == REDIS_OK ? 0 : -1;
    case KVT_STORE_PUT: return append_set(c, k, v, nv, (size_t)kvt__store_object_bytes(req->s));
    default: return -1;
    }
}

enum { R_DONE, R_RETRY, R_RETRY_REFRESH };

static bool prefix(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

/* One reply for key i; returns what to do with it. */
static int handle(rbe_t *b, rworker_t *w, kvt__sreq_t *req, size_t i, redisReply *r, const rconn_t *from) {
    if (r->type == REDIS_REPLY_ERROR) {
        bool ask;
        unsigned slot;
        char host[256];
        int port;
        if (kvt_store_parse_redirect(r->str, &ask, &slot, host, sizeof(host), &port) == KVT_OK) {
            int ci = conn_index(w, host, port);
            if (ci < 0) return R_RETRY_REFRESH;
            w->tnode[i] = (uint16_t)ci;
            w->asking[i] = ask ? 1 : 2;
            if (ask) req->cnt.ask++;
            else req->cnt.moved++;
            return ask ? R_RETRY : R_RETRY_REFRESH;
        }
        if (prefix(r->str, "TRYAGAIN") || prefix(r->str, "LOADING") || prefix(r->str, "MASTERDOWN")) {
            req->cnt.tryagain++;
            return R_RETRY;
        }
        if (prefix(r->str, "CLUSTERDOWN")) {
            req->cnt.tryagain++;
            return R_RETRY_REFRESH;
        }
        req->results[i] = KVT_STORE_FAILED;
        kvt__store_log(b->s, "%s %s at %s:%d: %s", kvt_store_op_name(req->op), req->hex[i], from->host, from->port, r->str);
        return R_DONE;
    }
    switch (req->op) {
    case KVT_STORE_EXISTS:
    case KVT_STORE_REMOVE:
        req->results[i] = r->type == REDIS_REPLY_INTEGER && r->integer > 0 ? KVT_STORE_OK : KVT_STORE_MISS;
        break;
    case KVT_STORE_GET:
        if (r->type == REDIS_REPLY_STRING) kvt__store_deliver(req, i, r->str, r->len);
        else req->results[i] = KVT_STORE_MISS;
        break;
    case KVT_STORE_PUT:
        if (r->type == REDIS_REPLY_STATUS) {
            req->results[i] = KVT_STORE_OK;
            req->cnt.bytes += kvt__store_object_bytes(req->s);
        } else {
            req->results[i] = KVT_STORE_FAILED;
        }
        break;
    default: req->results[i] = KVT_STORE_FAILED;
    }
    return R_DONE;
}

static void sleep_ms(unsigned ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void redis_run(void *be, void *wp, kvt__sreq_t *req) {
    rbe_t *b = be;
    rworker_t *w = wp;
    size_t n = req->n;
    if (grow(w, n) != KVT_OK) {
        memset(req->results, KVT_STORE_FAILED, n);
        return;
    }
    uint64_t now = kvt_now_ns(), until = atomic_load(&b->down_until);
    if (now < until) {
        memset(req->results, KVT_STORE_FAILED, n);
        kvt__store_log(req->s, "%s: %zu keys failed: the store is down (next try in %llu ms)", kvt_store_op_name(req->op), n,
                       (unsigned long long)((until - now) / 1000000));
        return;
    }
    if (b->cluster) sync_map(b, w);
    bool answered = false;
    for (size_t i = 0; i < n; i++) {
        w->pending[i] = 1;
        w->asking[i] = 0;
        int ci = route(b, w, req, i);
        w->tnode[i] = ci < 0 ? UINT16_MAX : (uint16_t)ci;
    }
    char why[512] = "";
    uint32_t retries = kvt__store_retries(req->s);
    for (uint32_t round = 0;; round++) {
        bool any = false, refresh = false, backoff = false;
        bool sent[KVT__MAX_NODES + MAX_SEEDS] = {false}, tried[KVT__MAX_NODES + MAX_SEEDS] = {false};
        /* send: every pending key to its node */
        for (size_t i = 0; i < n; i++) {
            if (!w->pending[i]) continue;
            any = true;
            if (w->tnode[i] == UINT16_MAX) { /* no node serves its slot now */
                refresh = backoff = true;
                continue;
            }
            rconn_t *c = &w->conn[w->tnode[i]];
            if (c->c == NULL && !tried[w->tnode[i]]) {
                tried[w->tnode[i]] = true; /* one connect per node per round */
                c->c = connect_to(c->host, c->port, kvt__store_timeout_ms(req->s), why, sizeof(why));
            }
            if (c->c == NULL) { /* down: retry (a failover may move its slots) */
                refresh = backoff = true;
                continue;
            }
            int a = append(w, req, i, c->c);
            if (a == -2) { /* logged */
                req->results[i] = KVT_STORE_FAILED;
                w->pending[i] = 0;
                continue;
            }
            if (a != 0) {
                snprintf(why, sizeof(why), "%.200s:%d: %s", c->host, c->port, c->c->errstr);
                drop(c);
                refresh = backoff = true;
                continue;
            }
            w->pending[i] = 2; /* sent this round */
            sent[w->tnode[i]] = true;
            if (req->op == KVT_STORE_PUT && (c->unflushed += (size_t)kvt__store_object_bytes(req->s)) >= FLUSH_BYTES) flush_out(c);
        }
        if (!any) break;
        /* receive: node by node, replies in the order sent */
        for (unsigned ci = 0; ci < w->n; ci++) {
            if (!sent[ci]) continue;
            rconn_t *c = &w->conn[ci];
            req->cnt.round_trips++;
            for (size_t i = 0; i < n; i++) {
                if (w->pending[i] != 2 || w->tnode[i] != ci) continue;
                redisReply *r = NULL;
                if (c->c && w->asking[i] == 1) { /* the ASKING reply */
                    if (redisGetReply(c->c, (void **)&r) != REDIS_OK) r = NULL;
                    if (r) freeReplyObject(r);
                    r = NULL;
                }
                if (c->c == NULL || redisGetReply(c->c, (void **)&r) != REDIS_OK || r == NULL) {
                    if (c->c) {
                        snprintf(why, sizeof(why), "%.200s:%d: %s", c->host, c->port, c->c->errstr);
                        drop(c);
                        req->cnt.reconnects++;
                    }
                    w->pending[i] = 1;
                    w->asking[i] = 0;
                    refresh = backoff = true;
                    continue;
                }
                answered = true;
                w->asking[i] = 0;
                int what = handle(b, w, req, i, r, c); /* a redirection sets asking: 1 ASK, 2 MOVED */
                freeReplyObject(r);
                if (what == R_DONE) w->pending[i] = 0;
                else {
                    w->pending[i] = 1;
                    if (what == R_RETRY_REFRESH) refresh = true;
                    if (w->asking[i] == 0) backoff = true; /* TRYAGAIN, CLUSTERDOWN: give it time */
                }
            }
        }
        bool left = false;
        for (size_t i = 0; i < n; i++) left |= w->pending[i] != 0;
        if (!left) break;
        if (round >= retries) {
            size_t failed = 0;
            for (size_t i = 0; i < n; i++)
                if (w->pending[i]) req->results[i] = KVT_STORE_FAILED, failed++;
            kvt__store_log(req->s, "%s: %zu of %zu keys failed after %u retries%s%s", kvt_store_op_name(req->op), failed, n,
                           retries, why[0] ? ": " : "", why);
            if (!answered) atomic_store(&b->down_until, kvt_now_ns() + DOWN_NS);
            break;
        }
        if (backoff) sleep_ms(round < 5 ? 10u << round : 200u);
        if (refresh && b->cluster) {
            refresh_map(b, w, req);
            sync_map(b, w);
        }
        /* keys not redirected go where the (new) map says */
        for (size_t i = 0; i < n; i++) {
            if (w->pending[i] != 1 || w->asking[i]) continue;
            if (w->tnode[i] != UINT16_MAX && !refresh) continue;
            if (!b->cluster) continue;
            int ci = route(b, w, req, i);
            w->tnode[i] = ci < 0 ? UINT16_MAX : (uint16_t)ci;
        }
    }
}

/* ---- open / close ---------------------------------------------------------------------- */

static int parse_nodes(rbe_t *b, const char *spec, const char *url_scheme) {
    const char *p = spec;
    if (*p == 0) return kvt__store_error("malformed store URL '%s%s': no HOST:PORT", url_scheme, spec), KVT_EINVAL;
    while (*p) {
        size_t len = strcspn(p, ",");
        if (b->nseeds == MAX_SEEDS) return kvt__store_error("malformed store URL: more than %d nodes", MAX_SEEDS), KVT_EINVAL;
        kvt__rnode_t *nd = &b->seeds[b->nseeds];
        if (kvt__parse_hostport(p, len, nd->host, sizeof(nd->host), &nd->port) != KVT_OK)
            return kvt__store_error("malformed store URL '%s%.300s': '%.*s' is not HOST:PORT (port 1..65535)", url_scheme, spec,
                                    (int)(len > 200 ? 200 : len), p),
                   KVT_EINVAL;
        b->nseeds++;
        p += len;
        if (*p == ',') {
            p++;
            if (*p == 0) return kvt__store_error("malformed store URL '%s%s': trailing ','", url_scheme, spec), KVT_EINVAL;
        }
    }
    if (!b->cluster && b->nseeds != 1)
        return kvt__store_error("malformed store URL 'redis://%s': one HOST:PORT (use redis-cluster:// for several)", spec), KVT_EINVAL;
    return KVT_OK;
}

static void close_be(void *be) {
    rbe_t *b = be;
    pthread_mutex_destroy(&b->mu);
    kvt__free(b->map, sizeof(*b->map));
    KVT_DELETE(b);
}

static int open_common(kvt_store_t *s, const char *spec, void **out, bool cluster) {
    const char *scheme = cluster ? "redis-cluster://" : "redis://";
    rbe_t *b = KVT_NEW(rbe_t);
    if (b == NULL) return kvt__store_error("out of memory"), KVT_ENOMEM;
    b->s = s;
    b->cluster = cluster;
    pthread_mutex_init(&b->mu, NULL);
    int rc = parse_nodes(b, spec, scheme);
    char why[512];
    kvt__sigpipe_t sp; /* the caller's thread talks to Redis here: a peer gone is an error, not a signal */
    kvt__sigpipe_hold(&sp);
    if (rc == KVT_OK && !cluster) {
        redisContext *c = connect_to(b->seeds[0].host, b->seeds[0].port, kvt__store_timeout_ms(s), why, sizeof(why));
        redisReply *r = c ? redisCommand(c, "PING") : NULL;
        if (c && r == NULL) snprintf(why, sizeof(why), "%.200s:%d: %s", b->seeds[0].host, b->seeds[0].port, c->errstr);
        else if (r && r->type == REDIS_REPLY_ERROR) snprintf(why, sizeof(why), "%.200s:%d: PING: %s", b->seeds[0].host, b->seeds[0].port, r->str);
        if (r == NULL || r->type == REDIS_REPLY_ERROR) rc = KVT_EIO, kvt__store_error("store %s%s: %s", scheme, spec, why);
        if (r) freeReplyObject(r);
        if (c) redisFree(c);
    }
    if (rc == KVT_OK && cluster) {
        b->map = kvt__malloc(sizeof(*b->map));
        if (b->map == NULL) rc = KVT_ENOMEM, kvt__store_error("out of memory");
        else if (load_map(b, NULL, b->map, why, sizeof(why)) != KVT_OK) rc = KVT_EIO, kvt__store_error("store %s%s: %s", scheme, spec, why);
        else b->map_gen = 1;
    }
    kvt__sigpipe_release(&sp);
    if (rc != KVT_OK) {
        close_be(b);
        return rc;
    }
    *out = b;
    return KVT_OK;
}

static int open_redis(kvt_store_t *s, const char *spec, void **out) { return open_common(s, spec, out, false); }
static int open_cluster(kvt_store_t *s, const char *spec, void **out) { return open_common(s, spec, out, true); }

static int worker_open(void *be, void **out) {
    rbe_t *b = be;
    rworker_t *w = KVT_NEW(rworker_t);
    if (w == NULL) return KVT_ENOMEM;
    if (b->cluster && (w->map = kvt__malloc(sizeof(*w->map))) == NULL) {
        KVT_DELETE(w);
        return KVT_ENOMEM;
    }
    *out = w;
    return KVT_OK;
}

static void worker_close(void *be, void *wp) {
    rbe_t *b = be;
    rworker_t *w = wp;
    for (unsigned i = 0; i < w->n; i++) drop(&w->conn[i]);
    if (b->cluster) kvt__free(w->map, sizeof(*w->map));
    kvt__free(w->tnode, w->cap * sizeof(uint16_t)), kvt__free(w->asking, w->cap), kvt__free(w->pending, w->cap);
    KVT_DELETE(w);
}

const kvt__store_ops_t kvt__store_redis_ops = {
    .name = "redis", .open = open_redis, .close = close_be, .worker_open = worker_open, .worker_close = worker_close, .run = redis_run,
};
const kvt__store_ops_t kvt__store_cluster_ops = {
    .name = "redis-cluster", .open = open_cluster, .close = close_be, .worker_open = worker_open, .worker_close = worker_close, .run = redis_run,
};
