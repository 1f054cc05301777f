/* The redis backend: Redis standalone (redis://HOST:PORT) and Redis Cluster
 * (redis-cluster://H:P[,H:P...]) through hiredis, one code path; either with
 * [USER[:PASSWORD]@] before the nodes (or KVT_REDIS_USER, KVT_REDIS_PASSWORD)
 * for an AUTH on every connection.
 *
 *   batch of n keys
 *     round: group the pending keys by target node (cluster: the slot map;
 *            after a redirection: the node it named, with ASKING for ASK)
 *            a key whose node is down (below) or whose slot has no node is
 *            held back: it fails at once unless a reloaded map sends it to
 *            a node that is up
 *            append every command to its node's connection  (pipelining)
 *            read every reply, node by node          (one round trip each)
 *              value / OK / integer   -> the key's result
 *              MOVED                  -> retry there; reload the slot map
 *              ASK                    -> retry there after ASKING
 *                                        (standalone: neither is followed,
 *                                        the key FAILED)
 *              TRYAGAIN, a lost connection
 *                                     -> retry after a backoff (map reloaded)
 *              CLUSTERDOWN (the cluster is down), LOADING, MASTERDOWN,
 *              a connect that fails, a reply that times out
 *                                     -> the node is down; its keys held back
 *              a reply of the wrong type, other errors (OOM ...)
 *                                     -> FAILED, logged
 *     up to cfg.retries rounds; keys still pending then are FAILED and their
 *     nodes marked down
 *
 * A node down (shared by the workers, by host:port) is not contacted for
 * DOWN_NS: its keys fail at once, so a dead master, or one a MOVED names
 * that cannot be reached, costs a batch nothing beyond the first; the
 * first batch after DOWN_NS tries it again (one connect) and marks it down
 * again if it still fails. The slot map is reloaded at most once every
 * REFRESH_NS, which is how a failover is followed.
 *
 * Each worker thread has its own connections (hiredis contexts are not
 * thread-safe), opened on first use and dropped on any I/O error or timeout
 * (every connect, send and receive has cfg.timeout_ms). A reply, too, must
 * be whole within cfg.timeout_ms of the wait for it (a server answering a
 * byte at a time would otherwise hold a call as long as it likes), and may
 * bring at most read_cap() bytes (a server announcing a 10 GB value, or an
 * array of millions, is cut off, not buffered). The slot map is
 * shared and replaced whole under a mutex, by whichever worker saw it stale.
 * Keys are "kvt:<32 hex>"; objects are the store's bytes as the value.
 * The password is never printed: messages name the store by its redacted
 * URL (kvt_store_url_redact) and a node by host:port. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
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

#define MAX_HEALTH (KVT__MAX_NODES + MAX_SEEDS)

/* A node's state, shared by the workers: down (for reads, for writes)
 * until a time (ns; 0: up). An entry of a node up is given to another
 * node when the table is full (addresses change over a long life: new
 * pods, promoted replicas); gen tells a connection its entry moved on. */
typedef struct health {
    char host[256];
    int port;
    _Atomic uint32_t gen;
    _Atomic uint64_t down_until[2];
} health_t;

typedef struct rbe {
    kvt_store_t *s;
    bool cluster;
    kvt__rnode_t seeds[MAX_SEEDS];
    unsigned nseeds;
    char user[256], pass[512]; /* AUTH [user] pass on every connection; pass "": none */
    pthread_mutex_t mu;
    kvt__slotmap_t *map; /* cluster: under mu */
    uint64_t map_gen;
    _Atomic uint64_t map_at; /* when the map was last reloaded (ns) */
    health_t health[MAX_HEALTH]; /* entries added and reused under mu */
    unsigned nhealth, health_next; /* under mu; health_next: where a reuse looks first */
    _Atomic uint64_t down_until; /* a store found down: batches fail at once until then (ns) */
    _Atomic bool no_script;      /* the server refused LEADING_SCRIPT (an ACL without EVAL, scripts off) */
} rbe_t;

/* A node found down (or a batch that reached no node at all: the whole
 * store) is left alone for DOWN_NS: the batches meanwhile fail its keys at
 * once instead of each spending its retries (a cache keeps serving from
 * L1/L2 without a queue of doomed calls); the first batch after it tries
 * again. */
#define DOWN_NS 1000000000ull
/* The slot map is reloaded at most this often (a MOVED, a node down, a
 * slot with no node all ask for it; a failover is followed within it). */
#define REFRESH_NS 250000000ull

typedef struct rconn {
    char host[256];
    int port;
    int h;         /* its entry in rbe_t.health: hof() */
    uint32_t hgen; /* the entry's gen when it was this node's */
    redisContext *c;
    bool silent; /* c's error is one of ours (set_io_error): the peer said nothing in time */
    /* a get batch's window on this connection, this round: values asked and
     * not yet read, and where the keys waiting for room start */
    size_t asked, wait_from;
} rconn_t;

/* A get batch keeps at most this many bytes of values asked and not yet
 * read on a connection (and at least two values): Redis builds every reply
 * to a pipeline it has read in its own memory before the socket takes it,
 * so 128 pipelined 1 MiB GETs cost it 128 MiB of buffers to allocate and
 * copy; a window keeps the pipe full with a few. */
#define GET_WINDOW_BYTES (4u << 20)

/* Writes out what is appended. An error stays in the context and is met by
 * the next redisGetReply, which drops the connection and retries the keys. */
static void flush_out(rconn_t *c) {
    int done = 0;
    while (!done && redisBufferWrite(c->c, &done) == REDIS_OK) {
    }
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

/* When a reply (or a connect) waited for from now must be in. */
static uint64_t in_time(const kvt_store_t *s) { return kvt_now_ns() + (uint64_t)kvt__store_timeout_ms(s) * 1000000ull; }

/* The most a reply other than a value may bring: a CLUSTER SHARDS of every
 * node, with room to spare. */
#define SMALL_REPLY_CAP ((4u << 20) + (64u << 10))

/* The most a reply may bring: that, or an object and some (a value read
 * through hiredis). */
static size_t read_cap(const kvt_store_t *s) {
    uint64_t ob = kvt__store_object_bytes(s);
    return ob > (4u << 20) ? (size_t)ob + (64u << 10) : SMALL_REPLY_CAP;
}

static const char NO_REPLY[] = "no reply in time";

/* c failed: err's text in its errstr, as hiredis keeps its own errors, so
 * that every path that reads c->errstr says what happened. */
static int fail_ctx(redisContext *c, int err, const char *what) {
    c->err = REDIS_ERR_IO;
    snprintf(c->errstr, sizeof(c->errstr), "%s", what ? what : strerror(err));
    return REDIS_ERR;
}

/* redisGetReply with a deadline and a cap: hiredis reads as long as each
 * read brings a byte (every read is bounded by the timeout, the reply not)
 * and takes whatever a reply announces (a bulk string buffered whole, an
 * array's elements built as they come). A reply still incomplete at the
 * deadline fails as a timeout ("no reply in time"); one that has brought
 * more than cap bytes fails the connection. A context with an error gives
 * no reply, even one hiredis has buffered. */
static int get_reply(redisContext *c, uint64_t deadline, size_t cap, redisReply **out) {
    void *aux = NULL;
    *out = NULL;
    if (c->err) return REDIS_ERR; /* what is buffered may be out of step (a value refused unread): nothing more */
    if (redisGetReplyFromReader(c, &aux) != REDIS_OK) return REDIS_ERR;
    if (aux == NULL) {
        int done = 0;
        do {
            if (redisBufferWrite(c, &done) != REDIS_OK) return REDIS_ERR;
        } while (!done);
    }
    size_t fed = 0; /* what the reads brought: the reply, and what follows it */
    while (aux == NULL) {
        if (kvt_now_ns() >= deadline) return fail_ctx(c, EAGAIN, NO_REPLY);
        size_t before = c->reader->len; /* (the reader compacts its buffer only when a reply is taken) */
        if (redisBufferRead(c) != REDIS_OK)
            return c->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK) ? fail_ctx(c, EAGAIN, NO_REPLY) : REDIS_ERR;
        fed += c->reader->len - before;
        if (fed > cap) {
            char what[96];
            snprintf(what, sizeof(what), "a reply of more than %zu bytes (kvtier's largest is an object): cut off", cap);
            return fail_ctx(c, EMSGSIZE, what);
        }
        if (redisGetReplyFromReader(c, &aux) != REDIS_OK) return REDIS_ERR;
    }
    *out = aux;
    return REDIS_OK;
}

/* A command and its reply, within deadline; NULL with c->errstr set. */
static redisReply *ask_by(redisContext *c, uint64_t deadline, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = redisvAppendCommand(c, fmt, ap);
    va_end(ap);
    redisReply *r = NULL;
    if (rc == REDIS_OK) get_reply(c, deadline, SMALL_REPLY_CAP, &r);
    return r;
}

/* Connects and, with a password, authenticates; NULL with the reason in
 * why (the password never in it). */
static redisContext *connect_to(const rbe_t *b, const char *host, int port, char *why, size_t cap) {
    struct timeval tv = tv_of(kvt__store_timeout_ms(b->s));
    redisContext *c = redisConnectWithTimeout(host, port, tv);
    if (c == NULL || c->err || kvt__redis_cap_reader(c->reader) != KVT_OK) {
        snprintf(why, cap, "%.200s:%d unreachable: %s", host, port, c && c->err ? c->errstr : "out of memory");
        if (c) redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    if (b->pass[0] == 0) return c;
    uint64_t by = in_time(b->s);
    redisReply *r = b->user[0] ? ask_by(c, by, "AUTH %s %s", b->user, b->pass) : ask_by(c, by, "AUTH %s", b->pass);
    if (r == NULL || r->type == REDIS_REPLY_ERROR) {
        snprintf(why, cap, "%.120s:%d: AUTH%s%.60s%s failed: %.150s", host, port, b->user[0] ? " as user '" : "", b->user,
                 b->user[0] ? "'" : "", r ? r->str : c->errstr);
        if (r) freeReplyObject(r);
        redisFree(c);
        return NULL;
    }
    freeReplyObject(r);
    return c;
}

/* What to add to a NOAUTH reply: how a password is given. */
static const char *noauth_hint(const char *reply) {
    return strncmp(reply, "NOAUTH", 6) == 0 ? " (the server wants a password: [USER]:PASSWORD@ before the nodes in the URL, or "
                                              "KVT_REDIS_USER and KVT_REDIS_PASSWORD)"
                                            : "";
}

/* ---- nodes up and down -------------------------------------------------------------- */

/* The health entry of host:port (and its gen, when gen is not NULL):
 * found, added, or when the table is full another node's taken over: one
 * that is up, else the one whose down mark ends first (a mark lost costs
 * that node one more try; the node asked for now is the one in use). */
static int health_of(rbe_t *b, const char *host, int port, uint32_t *gen) {
    pthread_mutex_lock(&b->mu);
    int at = -1;
    unsigned n = b->nhealth;
    for (unsigned i = 0; i < n && at < 0; i++)
        if (b->health[i].port == port && strcmp(b->health[i].host, host) == 0) at = (int)i;
    if (at < 0 && n < MAX_HEALTH) at = (int)b->nhealth++;
    uint64_t soonest = UINT64_MAX;
    for (unsigned k = 0; at < 0 && k < n; k++) { /* full */
        unsigned i = (b->health_next + k) % n;
        uint64_t r = atomic_load(&b->health[i].down_until[0]), w = atomic_load(&b->health[i].down_until[1]);
        if ((r > w ? r : w) < soonest) soonest = r > w ? r : w, at = (int)i;
        if (soonest <= kvt_now_ns()) break; /* up: taken */
    }
    if (at >= 0 && (unsigned)at < n) b->health_next = (unsigned)at + 1;
    if (at >= 0 && (b->health[at].port != port || strcmp(b->health[at].host, host) != 0)) { /* new here */
        health_t *e = &b->health[at];
        snprintf(e->host, sizeof(e->host), "%s", host);
        e->port = port;
        atomic_store(&e->down_until[0], 0);
        atomic_store(&e->down_until[1], 0);
        atomic_fetch_add(&e->gen, 1);
    }
    if (at >= 0 && gen) *gen = atomic_load(&b->health[at].gen);
    pthread_mutex_unlock(&b->mu);
    return at;
}

/* The connection's health entry, looked up again when it went to another node. */
static int hof(rbe_t *b, rconn_t *c) {
    if (c->h < 0 || atomic_load(&b->health[c->h].gen) != c->hgen) c->h = health_of(b, c->host, c->port, &c->hgen);
    return c->h;
}

static bool is_down(rbe_t *b, int h, bool write, uint64_t now) {
    return h >= 0 && now < atomic_load(&b->health[h].down_until[write]);
}

/* Marks entry h down unless it went to another node since gen was read
 * (a full table gives entries over: the node that failed is the one meant). */
static void mark_down(rbe_t *b, int h, uint32_t gen, bool reads, bool writes) {
    if (h < 0) return;
    uint64_t until = kvt_now_ns() + DOWN_NS;
    pthread_mutex_lock(&b->mu);
    if (atomic_load(&b->health[h].gen) == gen) {
        if (reads) atomic_store(&b->health[h].down_until[0], until);
        if (writes) atomic_store(&b->health[h].down_until[1], until);
    }
    pthread_mutex_unlock(&b->mu);
}

/* Marks the node of connection c down. */
static void conn_down(rbe_t *b, rconn_t *c, bool reads, bool writes) {
    int h = hof(b, c); /* first: it may set c->hgen */
    mark_down(b, h, c->hgen, reads, writes);
}

static bool is_write(kvt_store_op_t op) { return op == KVT_STORE_PUT || op == KVT_STORE_REMOVE; }

/* ---- the slot map ---------------------------------------------------------------- */

/* CLUSTER SHARDS from the first node that answers (the map's nodes, then the
 * seeds, each once). Nodes down are skipped (one is tried when all are); a
 * node that refuses is marked down and the next asked; a node that does
 * not answer in time is marked down and ends the reload: a cluster whose
 * nodes accept and never answer costs a reload one timeout, not one a
 * node, and the next reload asks the nodes after it. KVT_OK with *out set;
 * else the reason in why. */
static int load_map(rbe_t *b, const kvt__slotmap_t *old, kvt__slotmap_t *out, char *why, size_t cap) {
    kvt__rnode_t all[MAX_HEALTH], cand[MAX_HEALTH];
    unsigned na = 0, nc = 0;
    for (unsigned i = 0; old && i < old->nnodes; i++) all[na++] = old->nodes[i];
    for (unsigned i = 0; i < b->nseeds; i++) {
        bool seen = false;
        for (unsigned j = 0; j < na && !seen; j++) seen = all[j].port == b->seeds[i].port && strcmp(all[j].host, b->seeds[i].host) == 0;
        if (!seen) all[na++] = b->seeds[i];
    }
    uint64_t now = kvt_now_ns();
    for (unsigned i = 0; i < na; i++)
        if (!is_down(b, health_of(b, all[i].host, all[i].port, NULL), false, now)) cand[nc++] = all[i];
    if (nc == 0 && na) cand[nc++] = all[0]; /* all down: one is asked again */
    snprintf(why, cap, "no node answered");
    for (unsigned i = 0; i < nc; i++) {
        uint32_t gen = 0;
        int h = health_of(b, cand[i].host, cand[i].port, &gen);
        uint64_t t0 = kvt_now_ns();
        redisContext *c = connect_to(b, cand[i].host, cand[i].port, why, cap);
        if (c == NULL) {
            mark_down(b, h, gen, true, true);
            if (kvt_now_ns() - t0 >= (uint64_t)kvt__store_timeout_ms(b->s) * 1000000ull) break; /* silent: the reload ends */
            continue;
        }
        redisReply *r = ask_by(c, in_time(b->s), "CLUSTER SHARDS");
        int rc = KVT_EIO;
        char reason[160];
        bool silent = r == NULL && strcmp(c->errstr, NO_REPLY) == 0;
        if (r == NULL) {
            snprintf(why, cap, "%.200s:%d: %s", cand[i].host, cand[i].port, c->errstr);
            mark_down(b, h, gen, true, true);
        } else if (r->type == REDIS_REPLY_ERROR) {
            snprintf(why, cap, "%.120s:%d: CLUSTER SHARDS: %.150s%s", cand[i].host, cand[i].port, r->str,
                     noauth_hint(r->str)[0] ? noauth_hint(r->str) : " (not a Redis 7 cluster node?)");
        } else if (kvt__slotmap_parse(r, out, reason, sizeof(reason)) != KVT_OK) {
            snprintf(why, cap, "%.200s:%d: CLUSTER SHARDS: %s", cand[i].host, cand[i].port, reason);
        } else {
            rc = KVT_OK;
        }
        if (r) freeReplyObject(r);
        redisFree(c);
        if (rc == KVT_OK) return KVT_OK;
        if (silent) break;
    }
    return KVT_EIO;
}

/* Reloads the shared map unless it was tried less than REFRESH_NS ago (by
 * any worker): 1 reloaded, 0 not tried, -1 no node answered. */
static int refresh_map(rbe_t *b, rworker_t *w, kvt__sreq_t *req) {
    uint64_t now = kvt_now_ns(), at = atomic_load(&b->map_at);
    if (at && now - at < REFRESH_NS) return 0;
    if (!atomic_compare_exchange_strong(&b->map_at, &at, now)) return 0; /* another worker is at it */
    kvt__slotmap_t *nm = kvt__malloc(sizeof(*nm));
    if (nm == NULL) return 0;
    char why[512];
    req->cnt.map_refreshes++;
    if (load_map(b, w->map, nm, why, sizeof(why)) != KVT_OK) {
        kvt__store_log(b->s, "cluster slot map reload failed: %s", why);
        kvt__free(nm, sizeof(*nm));
        return -1;
    }
    pthread_mutex_lock(&b->mu);
    kvt__slotmap_t *old = b->map;
    b->map = nm;
    b->map_gen++;
    pthread_mutex_unlock(&b->mu);
    kvt__free(old, sizeof(*old));
    return 1;
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

static int conn_index(rbe_t *b, rworker_t *w, const char *host, int port) {
    for (unsigned i = 0; i < w->n; i++)
        if (w->conn[i].port == port && strcmp(w->conn[i].host, host) == 0) return (int)i;
    rconn_t *c = NULL;
    if (w->n == sizeof(w->conn) / sizeof(w->conn[0])) { /* full: reuse a closed slot */
        for (unsigned i = 0; i < w->n && c == NULL; i++)
            if (w->conn[i].c == NULL) c = &w->conn[i];
        if (c == NULL) return -1;
    } else {
        c = &w->conn[w->n++];
        c->c = NULL;
        c->silent = false;
    }
    snprintf(c->host, sizeof(c->host), "%s", host);
    c->port = port;
    c->h = health_of(b, host, port, &c->hgen);
    return (int)(c - w->conn);
}

static void drop(rconn_t *c) {
    if (c->c) redisFree(c->c);
    c->c = NULL;
    c->silent = false;
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
    if (!b->cluster) return conn_index(b, w, b->seeds[0].host, b->seeds[0].port);
    char k[KEYLEN + 1];
    key_name(req, i, k);
    uint16_t n = w->map->slot[kvt_store_cluster_slot(k, KEYLEN)];
    if (n == KVT__NO_NODE) return -1;
    return conn_index(b, w, w->map->nodes[n].host, w->map->nodes[n].port);
}

/* ---- a page's bytes straight between the socket and the tier -------------------------- */

/* Through hiredis a 1 MiB GET reply is copied three times before it reaches
 * the tier page (into hiredis's read buffer, into a reply object, then by
 * kvt__store_deliver) and a SET's page once more into its output buffer;
 * at that size the copies are most of what the client does, on cores it
 * shares with the server. So the page's bytes bypass hiredis: a SET writes
 * the tier page with writev after whatever hiredis holds, and a GET whose
 * reply is a bulk string of the object's size is read from the socket into
 * the tier page and the header, then checked in place. hiredis still sends
 * every other command and parses every other reply (misses, errors,
 * redirections, a value of another size, a tier without host addresses). */

/* Marks the connection broken the way hiredis marks its own I/O errors, so
 * that the next redisGetReply fails and the usual path (timed_out, errstr,
 * drop, the keys sent again) takes it: err 0 is the peer's close. */
static void set_io_error(rconn_t *c, int err) {
    c->silent = err == EAGAIN || err == EWOULDBLOCK;
    c->c->err = err ? REDIS_ERR_IO : REDIS_ERR_EOF;
    snprintf(c->c->errstr, sizeof(c->c->errstr), "%s", c->silent ? NO_REPLY : err ? strerror(err) : "Server closed the connection");
}

/* SET key object: the command's head, then the tier page and the header
 * (v, nv pieces from kvt__store_put_iov, room for two more), then CRLF, in
 * one writev after what hiredis holds. A write that fails leaves its error
 * in the context, as hiredis's own writes do: the key's reply is then
 * never read and every key sent on the connection goes again. */
static void put_direct(rconn_t *c, const char k[KEYLEN + 1], struct iovec *v, size_t nv, size_t ob) {
    char pre[96];
    int len = snprintf(pre, sizeof(pre), "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%zu\r\n", KEYLEN, k, ob);
    flush_out(c);
    if (c->c->err) return;
    memmove(v + 1, v, nv * sizeof(*v));
    v[0] = (struct iovec){.iov_base = pre, .iov_len = (size_t)len};
    v[nv + 1] = (struct iovec){.iov_base = (void *)"\r\n", .iov_len = 2};
    if (kvt__writev_all(c->c->fd, v, nv + 2) != 0) set_io_error(c, errno);
}

/* The length of a bulk string's first line "$<digits>\r\n" at the start of
 * p (k bytes) and the value's length in *vlen; 0 when p does not start
 * with a whole one (a null "$-1", another reply, a line cut short). */
static size_t bulk_head(const char *p, size_t k, uint64_t *vlen) {
    size_t at = 1;
    uint64_t v = 0;
    if (k == 0 || p[0] != '$') return 0;
    for (; at < k && at <= 19 && p[at] >= '0' && p[at] <= '9'; at++) v = v * 10 + (uint64_t)(p[at] - '0');
    if (at == 1 || at + 1 >= k || p[at] != '\r' || p[at + 1] != '\n') return 0;
    *vlen = v;
    return at + 2;
}

/* Copies k bytes of src into the pieces at *v (n of them, consumed). */
static size_t iov_fill(struct iovec **v, size_t n, const char *src, size_t k) {
    for (size_t off = 0; off < k;) {
        size_t step = k - off < (*v)->iov_len ? k - off : (*v)->iov_len;
        memcpy((*v)->iov_base, src + off, step);
        off += step;
        n = kvt__iov_advance(v, n, step);
    }
    return n;
}

enum { D_NOT_TAKEN, D_DONE, D_LOST };

/* Reads key i's GET reply into the tier page when it is a value of the
 * object's size: D_DONE (results[i] set by kvt__store_deliver_in_place;
 * or a value longer than an object, refused unread: BAD, the connection's
 * error set, and the caller drops it); D_NOT_TAKEN, nothing consumed
 * (hiredis reads it); D_LOST, the connection
 * broke or lost step within the reply (its error set, the page zeroed).
 * The reply starts in what hiredis read ahead, if anything, then the
 * socket; the first line is peeked at, so a reply not taken is left whole. */
static int get_direct(rconn_t *c, kvt__sreq_t *req, size_t i, uint64_t deadline) {
    redisContext *rc = c->c;
    redisReader *rd = rc->reader;
    uint64_t ob = kvt__store_object_bytes(req->s), vlen = 0;
    flush_out(c); /* the GETs themselves */
    if (rc->err || rd->err) return D_NOT_TAKEN;
    char line[32];
    size_t ahead = rd->len - rd->pos, k;
    if (ahead) {
        k = ahead < sizeof(line) ? ahead : sizeof(line);
        memcpy(line, rd->buf + rd->pos, k);
    } else {
        ssize_t got;
        do got = recv(rc->fd, line, sizeof(line), MSG_PEEK);
        while (got < 0 && errno == EINTR);
        if (got <= 0) {
            set_io_error(c, got < 0 ? errno : 0);
            return D_LOST;
        }
        k = (size_t)got;
    }
    size_t head = bulk_head(line, k, &vlen);
    if (head && vlen > ob) { /* longer than any object: refused unread, not buffered (it may claim gigabytes) */
        req->results[i] = KVT_STORE_BAD;
        kvt__store_log(req->s, "bad object for key %s: a value of %llu bytes, an object is %llu: refused, the connection "
                               "to %s:%d dropped", req->hex[i], (unsigned long long)vlen, (unsigned long long)ob, c->host, c->port);
        set_io_error(c, EPROTO);
        return D_DONE;
    }
    struct iovec *v;
    size_t nv;
    if (head == 0 || vlen != ob || (nv = kvt__store_get_iov(req, i, &v)) == 0) return D_NOT_TAKEN;
    char crlf[2];
    v[nv++] = (struct iovec){.iov_base = crlf, .iov_len = 2};
    size_t want = ob + 2;
    int err = 0;
    if (ahead) { /* hiredis's read-ahead first, consumed from its buffer */
        size_t take = ahead - head < want ? ahead - head : want;
        nv = iov_fill(&v, nv, rd->buf + rd->pos + head, take);
        rd->pos += head + take;
        want -= take;
    } else {
        struct iovec h = {.iov_base = line, .iov_len = head};
        ssize_t got = kvt__readv_by(rc->fd, &h, 1, deadline); /* peeked: there */
        if (got != (ssize_t)head) err = got < 0 ? errno : EPIPE;
    }
    if (err == 0 && want) {
        ssize_t got = kvt__readv_by(rc->fd, v, nv, deadline);
        if (got < 0) err = errno;
        else if ((size_t)got != want) err = EPIPE; /* closed within the reply */
    }
    if (err == 0 && memcmp(crlf, "\r\n", 2) != 0) err = EPROTO;
    if (err) {
        kvt__store_deliver_in_place(req, i, 0, err); /* zeroes the page; the key is sent again */
        set_io_error(c, err == EPIPE ? 0 : err);
        if (err == EPIPE)
            snprintf(rc->errstr, sizeof(rc->errstr), "the server closed the connection within a value of %llu bytes",
                     (unsigned long long)ob);
        return D_LOST;
    }
    kvt__store_deliver_in_place(req, i, ob, 0);
    return D_DONE;
}

/* Appends key i's command (and ASKING before it, when asked); 0, or -1 when
 * the tier page of a put could not be read (logged; nothing appended). A
 * command hiredis fails to append (out of memory) or a page write that
 * fails leaves its error in the context: the first reply read on the
 * connection fails, and every key sent on it goes again. */
static int append(rworker_t *w, kvt__sreq_t *req, size_t i, rconn_t *c) {
    char k[KEYLEN + 1];
    key_name(req, i, k);
    struct iovec *v = NULL;
    size_t nv = 0;
    if (req->op == KVT_STORE_PUT && (nv = kvt__store_put_iov(req, i, &v)) == 0) return -1; /* before ASKING: nothing half-sent */
    if (w->asking[i] == 1) redisAppendCommand(c->c, "ASKING");
    switch (req->op) {
    case KVT_STORE_EXISTS: redisAppendCommand(c->c, "EXISTS %b", k, (size_t)KEYLEN); break;
    case KVT_STORE_GET: redisAppendCommand(c->c, "GET %b", k, (size_t)KEYLEN); break;
    case KVT_STORE_REMOVE: redisAppendCommand(c->c, "DEL %b", k, (size_t)KEYLEN); break;
    case KVT_STORE_PUT: put_direct(c, k, v, nv, (size_t)kvt__store_object_bytes(req->s)); break;
    default: break;
    }
    return 0;
}

/* What a reply asks for: done; sent again (after a backoff unless it is a
 * redirection; with the map reloaded); held back (its node is down). */
enum { R_DONE, R_RETRY, R_RETRY_REFRESH, R_HELD };
/* A key's state within a batch (rworker_t.pending); K_WAIT: a get routed
 * to a connection whose window is full, sent as replies are read. */
enum { K_DONE, K_SEND, K_SENT, K_HELD, K_WAIT };

static bool prefix(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

/* A redirection to host:port for key i: followed (cluster, a node not down)
 * or not (standalone: one server is the whole store; a node known down). */
static int redirect(rbe_t *b, rworker_t *w, kvt__sreq_t *req, size_t i, bool ask, const char *host, int port, const rconn_t *from,
                    const char *reply) {
    if (!b->cluster) {
        req->results[i] = KVT_STORE_FAILED;
        kvt__store_log(b->s, "%s %s at %s:%d: %s: not followed (a redis:// store is that one server; a cluster wants "
                             "redis-cluster://)", kvt_store_op_name(req->op), req->hex[i], from->host, from->port, reply);
        return R_DONE;
    }
    int ci = conn_index(b, w, host, port);
    if (ci < 0) return R_RETRY_REFRESH;
    w->tnode[i] = (uint16_t)ci;
    if (is_down(b, hof(b, &w->conn[ci]), is_write(req->op), kvt_now_ns())) return R_HELD;
    w->asking[i] = ask ? 1 : 2;
    if (ask) req->cnt.ask++;
    else req->cnt.moved++;
    return ask ? R_RETRY : R_RETRY_REFRESH;
}

/* One reply for key i; returns what to do with it. */
static int handle(rbe_t *b, rworker_t *w, kvt__sreq_t *req, size_t i, redisReply *r, rconn_t *from) {
    if (r->type == REDIS_REPLY_ERROR) {
        bool ask;
        unsigned slot;
        char host[256];
        int port;
        if (kvt_store_parse_redirect(r->str, &ask, &slot, host, sizeof(host), &port) == KVT_OK)
            return redirect(b, w, req, i, ask, host[0] ? host : from->host, port, from, r->str);
        if (prefix(r->str, "TRYAGAIN")) {
            req->cnt.tryagain++;
            return R_RETRY;
        }
        if (prefix(r->str, "CLUSTERDOWN Hash slot not served")) return R_HELD; /* the map may know a node for it */
        if (prefix(r->str, "CLUSTERDOWN") || prefix(r->str, "LOADING") || prefix(r->str, "MASTERDOWN")) {
            /* the node serves nothing now (reads still, when it says so) */
            bool reads = strstr(r->str, "only accepts read commands") == NULL;
            conn_down(b, from, reads, true);
            kvt__store_log(b->s, "%s:%d is down for %s (next try in %llu ms): %s", from->host, from->port,
                           reads ? "reads and writes" : "writes", DOWN_NS / 1000000, r->str);
            return R_HELD;
        }
        req->results[i] = KVT_STORE_FAILED;
        kvt__store_log(b->s, "%s %s at %s:%d: %s", kvt_store_op_name(req->op), req->hex[i], from->host, from->port, r->str);
        return R_DONE;
    }
    /* the reply each command has: EXISTS and DEL an integer, GET a value or nil, SET +OK; another is
     * not the answer to the question (a proxy in between, a server out of step): a failure, logged */
    bool right = false;
    switch (req->op) {
    case KVT_STORE_EXISTS:
    case KVT_STORE_REMOVE:
        if ((right = r->type == REDIS_REPLY_INTEGER)) req->results[i] = r->integer > 0 ? KVT_STORE_OK : KVT_STORE_MISS;
        break;
    case KVT_STORE_GET:
        if (r->type == REDIS_REPLY_STRING) kvt__store_deliver(req, i, r->str, r->len);
        else if (r->type == REDIS_REPLY_NIL) req->results[i] = KVT_STORE_MISS;
        right = r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_NIL;
        break;
    case KVT_STORE_PUT:
        if ((right = r->type == REDIS_REPLY_STATUS && strcmp(r->str, "OK") == 0)) {
            req->results[i] = KVT_STORE_OK;
            req->cnt.bytes += kvt__store_object_bytes(req->s);
        }
        break;
    default: break;
    }
    if (!right) {
        static const char *const types[] = {"?", "a value", "an array", "an integer", "nil", "a status", "an error"};
        req->results[i] = KVT_STORE_FAILED;
        kvt__store_log(b->s, "%s %s at %s:%d: the reply is %s%s%.40s, not the command's", kvt_store_op_name(req->op), req->hex[i],
                       from->host, from->port, r->type >= 1 && r->type <= 6 ? types[r->type] : "of an unknown type",
                       r->type == REDIS_REPLY_STATUS ? " " : "", r->type == REDIS_REPLY_STATUS ? r->str : "");
    }
    return R_DONE;
}

static void sleep_ms(unsigned ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* A receive that ran out of time (the node is there but silent), as
 * opposed to a connection the node closed. */
static bool timed_out(const rconn_t *c) {
    if (c->silent || strcmp(c->c->errstr, NO_REPLY) == 0) return true;
#ifdef REDIS_ERR_TIMEOUT
    if (c->c->err == REDIS_ERR_TIMEOUT) return true;
#endif
    return c->c->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK);
}

/* Sends every key in K_SEND to its node (connecting first where needed: a
 * node that cannot be reached is marked down); a key whose node is down or
 * unknown is held. sent[ci]: node ci got some; tried[ci]: it was connected
 * to (once a round, also when it has no health entry). */
static void send_round(rbe_t *b, rworker_t *w, kvt__sreq_t *req, bool *sent, bool *tried, char *why, size_t cap) {
    bool write = is_write(req->op);
    uint64_t now = kvt_now_ns(), ob = kvt__store_object_bytes(req->s);
    size_t window = ob >= GET_WINDOW_BYTES / 2 ? 2 : (size_t)(GET_WINDOW_BYTES / ob);
    for (size_t i = 0; i < req->n; i++) {
        if (w->pending[i] != K_SEND) continue;
        if (w->tnode[i] == UINT16_MAX) { /* no node serves its slot now */
            w->pending[i] = K_HELD;
            continue;
        }
        rconn_t *c = &w->conn[w->tnode[i]];
        if (is_down(b, hof(b, c), write, now)) {
            w->pending[i] = K_HELD;
            continue;
        }
        if (c->c == NULL && !tried[w->tnode[i]]) {
            tried[w->tnode[i]] = true;
            if ((c->c = connect_to(b, c->host, c->port, why, cap)) == NULL) conn_down(b, c, true, true);
        }
        if (c->c == NULL) {
            w->pending[i] = K_HELD;
            continue;
        }
        if (!sent[w->tnode[i]]) c->asked = 0, c->wait_from = SIZE_MAX;
        if (req->op == KVT_STORE_GET && c->asked >= window) {
            w->pending[i] = K_WAIT;
            if (c->wait_from == SIZE_MAX) c->wait_from = i;
            sent[w->tnode[i]] = true;
            continue;
        }
        c->asked++;
        if (append(w, req, i, c) != 0) { /* the tier page could not be read (logged) */
            req->results[i] = KVT_STORE_FAILED;
            w->pending[i] = K_DONE;
            continue;
        }
        w->pending[i] = K_SENT;
        sent[w->tnode[i]] = true;
    }
}

/* A reply read on c: the next get waiting for room there is sent. */
static void refill(rworker_t *w, kvt__sreq_t *req, unsigned ci) {
    rconn_t *c = &w->conn[ci];
    c->asked--;
    for (; c->c && c->wait_from < req->n; c->wait_from++) {
        size_t j = c->wait_from;
        if (w->pending[j] != K_WAIT || w->tnode[j] != ci) continue;
        append(w, req, j, c); /* a get: nothing to fail before the send */
        w->pending[j] = K_SENT;
        c->asked++;
        c->wait_from++;
        return;
    }
}

/* Reads node ci's replies, in the order sent (a get's window refilled as
 * they come); what waited for a window on a connection lost goes again. */
static void receive_node(rbe_t *b, rworker_t *w, kvt__sreq_t *req, unsigned ci, bool *answered, bool *refresh, bool *backoff,
                         char *why, size_t cap) {
    rconn_t *c = &w->conn[ci];
    size_t cap_bytes = read_cap(req->s);
    req->cnt.round_trips++;
    for (size_t i = 0; i < req->n; i++) {
        if (w->pending[i] != K_SENT || w->tnode[i] != ci) continue;
        redisReply *r = NULL;
        if (c->c && w->asking[i] == 1) { /* the ASKING reply */
            get_reply(c->c, in_time(req->s), cap_bytes, &r);
            if (r) freeReplyObject(r);
            r = NULL;
        }
        int direct = c->c && req->op == KVT_STORE_GET ? get_direct(c, req, i, in_time(req->s)) : D_NOT_TAKEN;
        if (direct == D_DONE) {
            if (c->c->err) { /* a value refused unread: what follows it on the connection is out of step */
                drop(c);
                req->cnt.reconnects++;
            }
            *answered = true;
            w->asking[i] = 0;
            w->pending[i] = K_DONE;
            refill(w, req, ci);
            continue;
        }
        if (c->c == NULL || direct == D_LOST || get_reply(c->c, in_time(req->s), cap_bytes, &r) != REDIS_OK || r == NULL) {
            bool silent = false;
            if (c->c) {
                silent = timed_out(c);
                snprintf(why, cap, "%.200s:%d: %s", c->host, c->port, silent ? NO_REPLY : c->c->errstr);
                drop(c);
                req->cnt.reconnects++;
                if (silent) conn_down(b, c, true, true); /* another try would wait as long again */
            }
            /* a node that said nothing in time is down: its keys are held (another node, if a reloaded map
             * names one, or a failure now); a connection lost otherwise is tried again after a backoff */
            w->pending[i] = silent ? K_HELD : K_SEND;
            w->asking[i] = 0;
            *refresh = true;
            *backoff |= !silent;
            continue;
        }
        *answered = true;
        w->asking[i] = 0;
        int what = handle(b, w, req, i, r, c); /* a redirection followed sets asking: 1 ASK, 2 MOVED */
        freeReplyObject(r);
        if (req->op == KVT_STORE_GET) refill(w, req, ci);
        if (what == R_DONE) w->pending[i] = K_DONE;
        else if (what == R_HELD) w->pending[i] = K_HELD, *refresh = true;
        else {
            w->pending[i] = K_SEND;
            if (what == R_RETRY_REFRESH) *refresh = true;
            if (w->asking[i] == 0) *backoff = true; /* TRYAGAIN, a lost connection: give it time */
        }
    }
    for (size_t i = 0; i < req->n; i++)
        if (w->pending[i] == K_WAIT && w->tnode[i] == ci) w->pending[i] = K_SEND;
}

/* Keys held back: where a map reloaded this round (refreshed) sends them to
 * a node that is up, they are sent again; the others fail now. Returns
 * how many failed; *last names a node they were held for. */
static size_t settle_held(rbe_t *b, rworker_t *w, kvt__sreq_t *req, bool refreshed, int *last) {
    size_t failed = 0;
    uint64_t now = kvt_now_ns();
    for (size_t i = 0; i < req->n; i++) {
        if (w->pending[i] != K_HELD) continue;
        if (refreshed) {
            int ci = route(b, w, req, i);
            if (ci >= 0 && !is_down(b, hof(b, &w->conn[ci]), is_write(req->op), now) && (unsigned)ci != w->tnode[i]) {
                w->tnode[i] = (uint16_t)ci;
                w->pending[i] = K_SEND;
                continue;
            }
        }
        if (w->tnode[i] != UINT16_MAX) *last = w->tnode[i];
        req->results[i] = KVT_STORE_FAILED;
        w->pending[i] = K_DONE;
        failed++;
    }
    return failed;
}

/* ---- a leading count in one command per node --------------------------------------------- */

/* The leading keys present, counted by the servers: one command per node
 * whose reply is one integer (its keys, in chain order, present before its
 * first absent one), where 128 pipelined EXISTS are 128 commands through a
 * server's one thread and 128 replies to parse, and keys after a miss are
 * not looked at. The chain's count is where the first node's first absent
 * key lies. The keys are the script's arguments, not declared keys: a
 * cluster node refuses declared keys of several slots, and a script may
 * touch any key its node serves (a key of a slot the node does not serve is
 * an error: the pipelined path then answers). EVAL rather than EVALSHA:
 * Redis keeps the script compiled by its digest, and no NOSCRIPT answer is
 * ever to be handled. */
#define LEADING_SCRIPT "for i, k in ipairs(ARGV) do if redis.call('EXISTS', k) == 0 then return i - 1 end end return #ARGV"

/* true when the batch is answered (results set); false leaves it whole to
 * the pipelined path, whose retries, redirections and down-marking then
 * apply: a node down, unknown or unreachable, a connection lost, an error
 * (a refused script is not asked for again: an ACL without scripting). */
static bool leading_by_script(rbe_t *b, rworker_t *w, kvt__sreq_t *req) {
    if (atomic_load(&b->no_script)) return false;
    unsigned used[KVT__MAX_NODES + MAX_SEEDS];
    size_t nused = 0, count[KVT__MAX_NODES + MAX_SEEDS] = {0};
    uint64_t now = kvt_now_ns();
    for (size_t i = 0; i < req->n; i++) {
        int ci = route(b, w, req, i);
        if (ci < 0 || is_down(b, hof(b, &w->conn[ci]), false, now)) return false;
        w->tnode[i] = (uint16_t)ci;
        if (count[ci]++ == 0) used[nused++] = (unsigned)ci;
    }
    char why[512];
    for (size_t u = 0; u < nused; u++) { /* every node connected before any is asked: no reply is left unread */
        rconn_t *c = &w->conn[used[u]];
        if (c->c == NULL && (c->c = connect_to(b, c->host, c->port, why, sizeof(why))) == NULL) return false;
    }
    for (size_t u = 0; u < nused; u++) {
        rconn_t *c = &w->conn[used[u]];
        char head[256];
        int len = snprintf(head, sizeof(head), "*%zu\r\n$4\r\nEVAL\r\n$%zu\r\n%s\r\n$1\r\n0\r\n", count[used[u]] + 3,
                           sizeof(LEADING_SCRIPT) - 1, LEADING_SCRIPT);
        redisAppendFormattedCommand(c->c, head, (size_t)len);
        for (size_t i = 0; i < req->n; i++) {
            if (w->tnode[i] != used[u]) continue;
            char k[KEYLEN + 16];
            int kl = snprintf(k, sizeof(k), "$%d\r\nkvt:%s\r\n", KEYLEN, req->hex[i]);
            redisAppendFormattedCommand(c->c, k, (size_t)kl);
        }
        flush_out(c); /* every node at work before the first reply is read */
    }
    size_t lead = req->n;
    bool done = true;
    for (size_t u = 0; u < nused; u++) {
        rconn_t *c = &w->conn[used[u]];
        redisReply *r = NULL;
        req->cnt.round_trips++;
        if (get_reply(c->c, in_time(req->s), read_cap(req->s), &r) != REDIS_OK || r == NULL) {
            bool silent = timed_out(c);
            drop(c);
            req->cnt.reconnects++;
            if (silent) conn_down(b, c, true, true); /* the pipelined path would wait as long again */
            done = false;
            continue;
        }
        if (r->type == REDIS_REPLY_INTEGER && r->integer >= 0 && (unsigned long long)r->integer <= count[used[u]]) {
            size_t seen = 0; /* the node's first absent key, in the chain */
            for (size_t i = 0; i < req->n && (long long)seen <= r->integer; i++)
                if (w->tnode[i] == used[u] && seen++ == (size_t)r->integer && i < lead) lead = i;
        } else {
            done = false;
            if (r->type == REDIS_REPLY_ERROR && (prefix(r->str, "NOPERM") || prefix(r->str, "ERR unknown command"))) {
                atomic_store(&b->no_script, true);
                kvt__store_log(b->s, "%s:%d refused the exists script (%s): exists asks key by key from now on", c->host,
                               c->port, r->str);
            }
        }
        freeReplyObject(r);
    }
    if (!done) return false;
    memset(req->results, KVT_STORE_OK, lead);
    memset(req->results + lead, KVT_STORE_MISS, req->n - lead);
    return true;
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
    if (req->leading && req->op == KVT_STORE_EXISTS && leading_by_script(b, w, req)) return;
    for (size_t i = 0; i < n; i++) {
        w->pending[i] = K_SEND;
        w->asking[i] = 0;
        int ci = route(b, w, req, i);
        w->tnode[i] = ci < 0 ? UINT16_MAX : (uint16_t)ci;
    }
    char why[512] = "";
    uint32_t retries = kvt__store_retries(req->s);
    bool answered = false, no_map = false, exhausted = false;
    size_t held = 0;
    int held_at = -1;
    for (uint32_t round = 0;; round++) {
        bool refresh = false, backoff = false, sent[KVT__MAX_NODES + MAX_SEEDS] = {false}, tried[KVT__MAX_NODES + MAX_SEEDS] = {false};
        send_round(b, w, req, sent, tried, why, sizeof(why));
        for (unsigned ci = 0; ci < w->n; ci++)
            if (sent[ci]) receive_node(b, w, req, ci, &answered, &refresh, &backoff, why, sizeof(why));
        bool any_held = false;
        for (size_t i = 0; i < n; i++) any_held |= w->pending[i] == K_HELD;
        uint64_t gen = w->map_gen;
        if ((refresh || any_held) && b->cluster) { /* the map may know better: a failover, a reshard */
            no_map |= refresh_map(b, w, req) < 0;
            sync_map(b, w);
        }
        if (any_held) held += settle_held(b, w, req, w->map_gen != gen, &held_at);
        bool left = false;
        for (size_t i = 0; i < n; i++) left |= w->pending[i] != K_DONE;
        if (!left) break;
        if (round >= retries) {
            size_t failed = 0;
            for (size_t i = 0; i < n; i++)
                if (w->pending[i] != K_DONE) {
                    req->results[i] = KVT_STORE_FAILED, failed++;
                    if (w->tnode[i] != UINT16_MAX) conn_down(b, &w->conn[w->tnode[i]], true, true); /* retried enough */
                }
            kvt__store_log(req->s, "%s: %zu of %zu keys failed after %u retries%s%s", kvt_store_op_name(req->op), failed, n,
                           retries, why[0] ? ": " : "", why);
            exhausted = true;
            break;
        }
        if (backoff) sleep_ms(round < 5 ? 10u << round : 200u);
        /* keys not redirected go where the (new) map says */
        for (size_t i = 0; b->cluster && i < n; i++) {
            if (w->pending[i] != K_SEND || w->asking[i]) continue;
            if (w->tnode[i] != UINT16_MAX && w->map_gen == gen) continue;
            int ci = route(b, w, req, i);
            w->tnode[i] = ci < 0 ? UINT16_MAX : (uint16_t)ci;
        }
    }
    if (held) {
        const rconn_t *c = held_at >= 0 ? &w->conn[held_at] : NULL;
        if (c) kvt__store_log(req->s, "%s: %zu of %zu keys failed at once: %s:%d is down%s%s", kvt_store_op_name(req->op), held, n,
                              c->host, c->port, why[0] ? ": " : "", why);
        else kvt__store_log(req->s, "%s: %zu of %zu keys failed at once: no node serves their slots", kvt_store_op_name(req->op), held, n);
    }
    /* nothing answered and nothing else to ask (standalone, or a cluster
     * whose every node failed a map reload): the whole store is down */
    if (!answered && (held || exhausted) && (!b->cluster || no_map)) atomic_store(&b->down_until, kvt_now_ns() + DOWN_NS);
}

/* ---- open / close ---------------------------------------------------------------------- */

/* A malformed URL, named by its redacted form (kvt_store_url). */
#define URL_ERROR(b, fmt, ...) (kvt__store_error("malformed store URL '%.300s': " fmt, kvt_store_url((b)->s), __VA_ARGS__), KVT_EINVAL)

static int parse_nodes(rbe_t *b, const char *spec) {
    const char *p = spec;
    if (*p == 0) return URL_ERROR(b, "%s", "no HOST:PORT");
    while (*p) {
        size_t len = strcspn(p, ",");
        if (b->nseeds == MAX_SEEDS) return URL_ERROR(b, "more than %d nodes", MAX_SEEDS);
        kvt__rnode_t *nd = &b->seeds[b->nseeds];
        if (kvt__parse_hostport(p, len, nd->host, sizeof(nd->host), &nd->port) != KVT_OK)
            return URL_ERROR(b, "'%.*s' is not HOST:PORT (port 1..65535)", (int)(len > 200 ? 200 : len), p);
        b->nseeds++;
        p += len;
        if (*p == ',') {
            p++;
            if (*p == 0) return URL_ERROR(b, "%s", "trailing ','");
        }
    }
    if (!b->cluster && b->nseeds != 1) return URL_ERROR(b, "%s", "one HOST:PORT (use redis-cluster:// for several)");
    return KVT_OK;
}

static int hexval(char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; }

/* Percent-decodes len bytes into out (cap bytes, NUL-terminated); -1 for
 * a '%' without two hex digits, an encoded NUL, or no room. */
static int pct_decode(const char *s, size_t len, char *out, size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        int c = (unsigned char)s[i];
        if (c == '%') {
            int hi = i + 2 < len ? hexval(s[i + 1]) : -1, lo = i + 2 < len ? hexval(s[i + 2]) : -1;
            if (hi < 0 || lo < 0 || (hi | lo) == 0) return -1;
            c = hi << 4 | lo;
            i += 2;
        }
        if (k + 1 >= cap) return -1;
        out[k++] = (char)c;
    }
    out[k] = 0;
    return 0;
}

/* [USER[:PASSWORD]@] before the nodes (percent-encoded; the last '@' ends
 * it: a host holds none); *nodes gets what follows. Without it, the
 * environment's KVT_REDIS_USER and KVT_REDIS_PASSWORD; a user given
 * without a password takes KVT_REDIS_PASSWORD. */
static int parse_creds(rbe_t *b, const char *spec, const char **nodes) {
    const char *at = strrchr(spec, '@'), *eu = getenv("KVT_REDIS_USER"), *ep = getenv("KVT_REDIS_PASSWORD");
    *nodes = at ? at + 1 : spec;
    if (at == spec) return URL_ERROR(b, "%s", "nothing before '@' (USER:PASSWORD@ or :PASSWORD@)");
    if (at) {
        const char *colon = memchr(spec, ':', (size_t)(at - spec));
        size_t ulen = colon ? (size_t)(colon - spec) : (size_t)(at - spec);
        if (pct_decode(spec, ulen, b->user, sizeof(b->user)) != 0 ||
            (colon && pct_decode(colon + 1, (size_t)(at - colon - 1), b->pass, sizeof(b->pass)) != 0))
            return URL_ERROR(b, "%s", "bad credentials (a '%' not followed by two hex digits, an encoded NUL, or too long)");
        if (colon && b->pass[0] == 0) return URL_ERROR(b, "%s", "an empty password");
    } else if (eu && eu[0] && snprintf(b->user, sizeof(b->user), "%s", eu) >= (int)sizeof(b->user)) {
        return kvt__store_error("KVT_REDIS_USER is longer than %zu bytes", sizeof(b->user) - 1), KVT_EINVAL;
    }
    if (b->pass[0] == 0 && (b->user[0] || !at) && ep && ep[0] && snprintf(b->pass, sizeof(b->pass), "%s", ep) >= (int)sizeof(b->pass))
        return kvt__store_error("KVT_REDIS_PASSWORD is longer than %zu bytes", sizeof(b->pass) - 1), KVT_EINVAL;
    if (b->user[0] && b->pass[0] == 0 && !at) return kvt__store_error("KVT_REDIS_USER is set, KVT_REDIS_PASSWORD is not"), KVT_EINVAL;
    if (b->user[0] && b->pass[0] == 0)
        return URL_ERROR(b, "user '%.100s' without a password (USER:PASSWORD@, or KVT_REDIS_PASSWORD)", b->user);
    return KVT_OK;
}

static void close_be(void *be) {
    rbe_t *b = be;
    explicit_bzero(b->pass, sizeof(b->pass));
    pthread_mutex_destroy(&b->mu);
    kvt__free(b->map, sizeof(*b->map));
    KVT_DELETE(b);
}

/* A backend with the URL's credentials and seeds, connected to nothing. */
static int parse_url(kvt_store_t *s, const char *spec, bool cluster, rbe_t **out) {
    rbe_t *b = KVT_NEW(rbe_t);
    if (b == NULL) return kvt__store_error("out of memory"), KVT_ENOMEM;
    b->s = s;
    b->cluster = cluster;
    pthread_mutex_init(&b->mu, NULL);
    const char *nodes = spec;
    int rc = parse_creds(b, spec, &nodes);
    if (rc == KVT_OK) rc = parse_nodes(b, nodes);
    *out = b;
    return rc;
}

static int check_redis(kvt_store_t *s, const char *spec, bool cluster) {
    rbe_t *b = NULL;
    int rc = parse_url(s, spec, cluster, &b);
    if (b) close_be(b);
    return rc;
}

static int open_common(kvt_store_t *s, const char *spec, void **out, bool cluster) {
    rbe_t *b = NULL;
    int rc = parse_url(s, spec, cluster, &b);
    if (b == NULL) return rc;
    char why[512];
    kvt__sigpipe_t sp; /* the caller's thread talks to Redis here: a peer gone is an error, not a signal */
    kvt__sigpipe_hold(&sp);
    if (rc == KVT_OK && !cluster) {
        const kvt__rnode_t *n = &b->seeds[0];
        redisContext *c = connect_to(b, n->host, n->port, why, sizeof(why));
        redisReply *r = c ? ask_by(c, in_time(s), "PING") : NULL;
        if (c && r == NULL) snprintf(why, sizeof(why), "%.200s:%d: %s", n->host, n->port, c->errstr);
        else if (r && r->type == REDIS_REPLY_ERROR) snprintf(why, sizeof(why), "%.200s:%d: PING: %.100s%s", n->host, n->port, r->str, noauth_hint(r->str));
        if (r == NULL || r->type == REDIS_REPLY_ERROR) rc = KVT_EIO, kvt__store_error("store %s: %s", kvt_store_url(s), why);
        if (r) freeReplyObject(r);
        if (c) redisFree(c);
    }
    if (rc == KVT_OK && cluster) {
        b->map = kvt__malloc(sizeof(*b->map));
        if (b->map == NULL) rc = KVT_ENOMEM, kvt__store_error("out of memory");
        else if (load_map(b, NULL, b->map, why, sizeof(why)) != KVT_OK)
            rc = KVT_EIO, kvt__store_error("store %s: %s", kvt_store_url(s), why);
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
static int check_one(kvt_store_t *s, const char *spec) { return check_redis(s, spec, false); }
static int check_cluster(kvt_store_t *s, const char *spec) { return check_redis(s, spec, true); }
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
    .name = "redis", .open = open_redis, .check = check_one, .close = close_be, .worker_open = worker_open, .worker_close = worker_close, .run = redis_run,
};
const kvt__store_ops_t kvt__store_cluster_ops = {
    .name = "redis-cluster", .open = open_cluster, .check = check_cluster, .close = close_be, .worker_open = worker_open, .worker_close = worker_close, .run = redis_run,
};
