/* kvtier — the L3 store: page objects in a directory or in Redis (standalone
 * or Redis Cluster), keyed by the chained page hash plus a model identity.
 *
 * A store is opened from a URL:
 *
 *   dir:PATH[,max=SIZE]              one file per page under PATH (the embedded
 *                                    default; PATH holds no ','); SIZE: digits,
 *                                    in bytes, with an optional K/M/G/T (powers
 *                                    of 1024: "64G"), counted as the filesystem
 *                                    charges (each file's blocks, at least its
 *                                    length); 0 or absent: no limit
 *   redis://HOST:PORT                one Redis server
 *   redis-cluster://H:P[,H:P...]     a Redis Cluster, found from any seed node
 *
 * Either Redis form may put credentials before the nodes, percent-encoded:
 * redis://USER:PASSWORD@HOST:PORT (an ACL user), redis://:PASSWORD@... (the
 * default user, requirepass); without them the environment's
 * KVT_REDIS_USER and KVT_REDIS_PASSWORD are used (a URL with USER@ and no
 * password takes KVT_REDIS_PASSWORD). Every connection, to a seed, a node
 * of the slot map or a redirection's, sends AUTH first. The password is
 * never printed: messages and kvt_store_url show the URL with *** for it.
 *
 * Keys. A page's key is 16 bytes, XXH3-128 over, in this order:
 *
 *   identity digest (16)   XXH3-128 of the text "kvtier-l3-id/1;model=<name>;
 *                          page_tokens=<n>;layers=<n>;layer_bytes=<n>;
 *                          dtype_bytes=<n>;tp=<rank>/<size>;cp=<rank>/<size>;
 *                          ns=<namespace>"
 *   page hash (16)         the chained page hash (radix.h: kvt_page_hash_chain),
 *                          lo then hi, little-endian: it already covers the
 *                          tokens of the whole prefix and the radix namespace
 *                          (LoRA id, cache salt)
 *
 * so two models, geometries, dtypes, shards or namespaces never share an
 * object. Its text form, 32 lower-case hex digits, names the Redis key
 * ("kvt:<hex>") and the file ("PATH/<h0h1>/<hex>").
 *
 * Objects (format version 2). The page's bytes page-first (layer 0's bytes,
 * layer 1's, ...: the logical order of tier.h, whatever the tier's layout),
 * P = layers x layer_bytes of them, then an 80-byte header at offset P:
 *
 *   offset  size  field
 *   0       P     the payload
 *   P+0     4     magic "KVT3"
 *   P+4     2     version (2)
 *   P+6     2     header bytes (80)
 *   P+8     4     layers
 *   P+12    4     page_tokens
 *   P+16    8     layer_bytes
 *   P+24    8     payload bytes (P)
 *   P+32    16    identity digest
 *   P+48    16    key
 *   P+64    8     XXH3-64 of the payload
 *   P+72    8     XXH3-64 of bytes P..P+72 (the header itself)
 *
 * all little-endian; P + 80 bytes in all (kvt_store_object_bytes). The
 * payload starts the object so that a file read into a page-aligned tier
 * page is a copy aligned on both sides. Version 1 (the header first, the
 * payload at offset 80, the same length) is not read: such an object is a
 * bad object (a miss, logged as version 1) until the page is put again.
 * A get checks the object's length (first: it says where the header is),
 * every header field against what this store expects for that key, and the
 * payload checksum:
 * an object that fails any check is a miss, counted as a bad object and
 * logged (the reason and the key), and never served. Objects read into
 * memory first (redis; a dir get into a tier without host addresses) are
 * checked before a byte reaches the tier; a dir get into a host tier reads
 * the file straight into the page (one copy less) and checks it there,
 * zeroing the page when the object is refused. Either way a refused
 * object's bytes are never left in a tier page.
 *
 * Calls. Batch calls only, asynchronous: exists, get, put, remove each take n
 * page hashes (and, for get and put, the host-tier page each goes to or comes
 * from) and return at once; worker threads run the batch against the
 * backend; kvt_store_poll reports it, with a result per key. exists reports
 * per key too, and `count`, the number of leading keys present (a prefix
 * match stops at the first absent page). A store that is down, times out or
 * is full makes misses (get), failed puts, counted; nothing is retried
 * forever: every network call has a timeout, every redirection loop a bound.
 *
 * Order: reads (exists, get) are taken before writes (put, remove) that
 * were queued earlier, so that what an admission waits for never queues
 * behind backups; a key's get is ordered after its put only once the put has
 * been polled.
 *
 * Threading: submit calls, stats, emit and last_error may be called from any
 * thread; poll from one thread at a time (the results it returns stay valid
 * until the next poll). A put reads its tier pages and a get writes them on a
 * worker thread between submit and the poll that reports the batch: the pages
 * belong to the store until then (the cache keeps them reserved).
 */
#ifndef KVTIER_STORE_H
#define KVTIER_STORE_H

#include "kvtier/export.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvtier/radix.h"
#include "kvtier/stats.h"
#include "kvtier/tier.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvt_store kvt_store_t;

typedef enum kvt_store_op {
    KVT_STORE_EXISTS = 0,
    KVT_STORE_GET = 1,
    KVT_STORE_PUT = 2,
    KVT_STORE_REMOVE = 3,
    KVT_STORE_OP_COUNT_
} kvt_store_op_t;

KVT_API const char *kvt_store_op_name(kvt_store_op_t op); /* "exists", "get", "put", "remove" */

/* Per-key results (kvt_store_done_t.results). */
typedef enum kvt_store_result {
    KVT_STORE_OK = 0,      /* exists: present; get: served into the tier; put: stored; remove: removed */
    KVT_STORE_MISS = 1,    /* exists, get, remove: no such object (redis: a remove sent again after its
                              connection broke may find gone what its first send removed) */
    KVT_STORE_BAD = 2,     /* get: an object failed its checks (a miss, counted as a bad object) */
    KVT_STORE_FAILED = 3   /* the store failed this key: down, timed out, full, refused (a miss for get) */
} kvt_store_result_t;

typedef struct kvt_store_config {
    uint32_t size;            /* sizeof(kvt_store_config_t) */
    /* The host tier get writes into and put reads from (may be NULL for a
     * store used only for exists and remove). Must outlive the store. */
    kvt_tier_t *tier;
    /* The model identity (see the key scheme above). */
    const char *model;        /* model name, required, 1..127 characters without ";", e.g. "llama-3-70b" */
    uint32_t page_tokens;     /* >= 1, required */
    uint32_t layers;          /* 0: the tier's */
    uint64_t layer_bytes;     /* 0: the tier's */
    uint32_t dtype_bytes;     /* default 2 */
    uint32_t tp_rank, tp_size; /* the TP shard this instance holds (default 0 of 1) */
    uint32_t cp_rank, cp_size; /* the CP shard (default 0 of 1) */
    const char *ns;           /* namespace: a deployment or tenant sharing one store (default "default") */
    /* Mechanism. */
    uint32_t threads;         /* worker threads, 1..64 (default 2); each has its own connections */
    uint32_t timeout_ms;      /* every network call: connect, send, receive, and each reply whole; dir:, a wait for
                               * descriptors (default 2000) */
    uint32_t retries;         /* per key: redirections, TRYAGAIN, reconnects (default 8); a node that
                               * cannot be reached or says it is down is not retried: it is left
                               * alone for a second, its keys failing at once */
    /* Messages (bad objects, a node lost, a store down): called on a worker
     * thread; NULL: the first 16 go to stderr, the rest are only counted. */
    void (*log)(void *arg, const char *msg);
    void *log_arg;
} kvt_store_config_t;

KVT_API void kvt_store_config_default(kvt_store_config_t *cfg);

/* Opens the store at url (see the top) and connects to it (redis: AUTH when
 * credentials are given, then a PING; redis-cluster: the slot map from
 * CLUSTER SHARDS of the first seed that answers; dir: creates PATH if
 * needed and rebuilds the LRU index from the files there). Errors, nothing
 * left behind (and kvt_store_last_error(NULL) names what was wrong):
 * KVT_EINVAL (a malformed URL: unknown scheme, no path, an unknown dir
 * option, a bad host:port, a bad max=, bad credentials; a bad config: no
 * model, zero page_tokens, geometry that differs from the tier's, a tier
 * that is not a page-addressable one), KVT_EIO (unreachable: connection
 * refused or timed out, AUTH failed or wanted, not a cluster, a directory
 * that cannot be created), KVT_ENOMEM. */
KVT_API int kvt_store_open(kvt_store_t **out, const char *url, const kvt_store_config_t *cfg);
/* Reads url as kvt_store_open reads it, reaching no server and creating
 * nothing: KVT_OK, or KVT_EINVAL for a malformed URL (the same causes as
 * open's, kvt_store_last_error(NULL) naming it), KVT_ENOMEM. A URL that
 * passes may still be refused by open for what only opening finds. */
KVT_API int kvt_store_url_check(const char *url);
/* Waits for the batches in flight, then closes. Completions not polled are
 * dropped. */
KVT_API void kvt_store_close(kvt_store_t *s);

/* The reason for the last failure of open (s == NULL: this thread's last
 * open) or the store's last logged message; "" when none. The text stays
 * valid until the next call on the same thread. */
KVT_API const char *kvt_store_last_error(const kvt_store_t *s);
/* The URL the store was opened with, its password replaced by *** (see
 * kvt_store_url_redact), and the backend name ("dir", "redis",
 * "redis-cluster"). */
KVT_API const char *kvt_store_url(const kvt_store_t *s);
/* url with the password of its credentials (redis://USER:PASSWORD@...)
 * replaced by ***, into out (cap bytes, NUL-terminated, cut short if it
 * must be: never into the password); credentials of one word (PASSWORD@)
 * all replaced. Any scheme but dir: is read so, a mistyped one too
 * (rediss://, Redis://, redis:/); other URLs as they are. Returns out. */
KVT_API char *kvt_store_url_redact(const char *url, char *out, size_t cap);
KVT_API const char *kvt_store_backend(const kvt_store_t *s);
/* The host tier get writes into and put reads from (NULL: none). */
KVT_API kvt_tier_t *kvt_store_tier(const kvt_store_t *s);

/* The key of a page hash under this store's identity (see the top); hex
 * (optional) gets the 32 hex digits and a NUL. */
KVT_API kvt_hash128_t kvt_store_key(const kvt_store_t *s, const kvt_hash128_t *page_hash, char hex[33]);
/* Object bytes: header + payload. */
KVT_API uint64_t kvt_store_object_bytes(const kvt_store_t *s);

/* A batch's keys: the page hash, and for get and put the tier page. */
typedef struct kvt_store_page {
    kvt_hash128_t hash;
    uint32_t page;
} kvt_store_page_t;

typedef struct kvt_store_done {
    uint64_t ticket;
    uint64_t user;                  /* as given to submit */
    kvt_store_op_t op;
    int status;                     /* KVT_OK, or KVT_EIO when some key FAILED */
    size_t n;
    const kvt_store_page_t *pages;  /* the batch as submitted; valid until the next poll */
    const uint8_t *results;         /* n kvt_store_result_t; valid until the next poll */
    size_t count;                   /* exists: leading keys present; others: keys with KVT_STORE_OK */
    uint64_t latency_ns;            /* submit -> complete */
} kvt_store_done_t;

/* Queue a batch of n >= 1 keys. *ticket (optional) identifies it. On failure
 * nothing is queued and nothing will complete: KVT_EINVAL (n == 0, a page
 * out of the tier's range or no tier for get/put, a page twice in one get),
 * KVT_ENOMEM. The tier pages of a get or put belong to the store until the
 * batch is polled. */
KVT_API int kvt_store_exists(kvt_store_t *s, const kvt_store_page_t *pages, size_t n, uint64_t user, uint64_t *ticket);
KVT_API int kvt_store_get(kvt_store_t *s, const kvt_store_page_t *pages, size_t n, uint64_t user, uint64_t *ticket);
KVT_API int kvt_store_put(kvt_store_t *s, const kvt_store_page_t *pages, size_t n, uint64_t user, uint64_t *ticket);
KVT_API int kvt_store_remove(kvt_store_t *s, const kvt_store_page_t *pages, size_t n, uint64_t user, uint64_t *ticket);

/* A batch on the caller's thread, returned when it is done: results (n
 * bytes, the caller's) get a kvt_store_result_t per key, *count (may be
 * NULL) what kvt_store_done_t.count says. Through a backend context the
 * store keeps for callers, one caller at a time (the workers keep theirs):
 * no worker's wake-up and no poll, which on a small batch (a page or two
 * from a local directory, a round trip to Redis) cost as much as the
 * batch. The tier pages are the store's until it returns. KVT_OK; KVT_EIO
 * when a key FAILED (its result says so); KVT_EINVAL for what the
 * asynchronous calls refuse (and results NULL), nothing done; KVT_ENOMEM.
 * Counted in the op's stats like a queued batch. */
KVT_API int kvt_store_run(kvt_store_t *s, kvt_store_op_t op, const kvt_store_page_t *pages, size_t n, uint8_t *results,
                          size_t *count);

/* exists on the caller's thread: *count is the number of leading keys
 * present (what a prefix match needs), without a worker's wake-up and the
 * caller's, which cost more than a local check or a round trip to a
 * server. dir: a check per key, stopping at the first key not present.
 * redis:, redis-cluster:: one script per node counting its leading keys,
 * all nodes asked at once (one round trip), through the store's own
 * connection for callers (one caller at a time; the workers keep theirs);
 * where the script is refused or a node is in doubt, every key asked in
 * one pipelined round trip per node, with the workers' retries and
 * redirections. A node that sends no reply in time is marked down, as a
 * worker marks it: the call waits one timeout, not two. Counted in the exists stats as one call. KVT_OK (a store
 * that is down counts nothing present), KVT_EINVAL (n == 0, a NULL
 * pointer), KVT_ENOMEM. */
KVT_API int kvt_store_exists_leading(kvt_store_t *s, const kvt_store_page_t *pages, size_t n, size_t *count);

/* Takes up to max completed batches into out, waiting up to timeout_ns for
 * the first (0: do not wait). Returns how many (>= 0) or KVT_EINVAL. */
KVT_API int kvt_store_poll(kvt_store_t *s, kvt_store_done_t *out, size_t max, uint64_t timeout_ns);
/* Batches submitted and not yet taken by poll. */
KVT_API uint64_t kvt_store_pending(kvt_store_t *s);

/* Statistics per operation. Keys are counted in exactly one of hits,
 * misses, bad_objects, failures (bad objects are misses to the caller but
 * counted apart). */
#define KVT_STORE_STATS_FIELDS(X)                                                   \
    X(calls, COUNTER, "batch calls completed")                                    \
    X(keys, COUNTER, "keys in them")                                              \
    X(bytes, COUNTER, "object bytes moved (get: served, put: stored)")            \
    X(hits, COUNTER, "keys found (exists, get), stored (put), removed (remove)")  \
    X(misses, COUNTER, "keys with no object")                                     \
    X(bad_objects, COUNTER, "objects refused: length, header, key or checksum")   \
    X(failures, COUNTER, "keys the store failed: down, timeout, full, refused")   \
    X(round_trips, COUNTER, "pipelined round trips to a node (redis)")            \
    X(moved, COUNTER, "MOVED redirections followed")                              \
    X(ask, COUNTER, "ASK redirections followed")                                  \
    X(tryagain, COUNTER, "TRYAGAIN, CLUSTERDOWN or LOADING replies retried")      \
    X(reconnects, COUNTER, "connections lost and retried")                        \
    X(map_refreshes, COUNTER, "cluster slot map reloads")                         \
    X(evictions, COUNTER, "objects evicted for capacity (dir, put)")              \
    X(inflight, GAUGE, "batches submitted and not completed")

typedef struct kvt_store_stats {
    uint32_t size; /* sizeof(kvt_store_stats_t), set by the caller */
    kvt_store_op_t op;
#define KVT_STATS_FIELD_(name, kind, help) uint64_t name;
    KVT_STORE_STATS_FIELDS(KVT_STATS_FIELD_)
#undef KVT_STATS_FIELD_
    uint64_t stored_bytes;   /* dir: what the filesystem charges for the objects this process knows of
                              * (each file's blocks, at least its length; what max= bounds; all ops report it) */
    uint64_t stored_objects; /* dir: objects this process knows of */
    kvt_hist_t latency_ns;   /* submit -> the batch completes */
} kvt_store_stats_t;

/* A snapshot of one operation's statistics. KVT_EINVAL. */
KVT_API int kvt_store_stats(kvt_store_t *s, kvt_store_op_t op, kvt_store_stats_t *st);
/* Emits a section "store_<op>" per operation that has seen calls. */
KVT_API void kvt_store_emit(kvt_store_t *s, kvt_emitter_t *e);

/* ---- helpers the backends and tests share (pure functions) ---- */

/* The Redis Cluster slot of a key: CRC16 (XMODEM) of the key, or of its
 * {hash tag} when it has a non-empty one, mod 16384. */
KVT_API uint16_t kvt_store_crc16(const void *buf, size_t len);
KVT_API unsigned kvt_store_cluster_slot(const char *key, size_t len);

/* A redirection reply of Redis Cluster: "MOVED <slot> <host>:<port>" or
 * "ASK <slot> <host>:<port>" (host may be an IPv6 address; the port is the
 * text after the last ':'; an empty host, ":<port>", is the node that sent
 * the reply, as Redis 7 says it when its endpoint is unknown: host ""). Fills *ask (true for ASK), *slot, host (cap
 * bytes, NUL-terminated) and *port. KVT_EPARSE for anything else. */
KVT_API int kvt_store_parse_redirect(const char *reply, bool *ask, unsigned *slot, char *host, size_t cap, int *port);

#ifdef __cplusplus
}
#endif
#endif
