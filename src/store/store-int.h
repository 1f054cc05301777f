/* The store's front (store.c) and its backends (dir.c, redis.c): one small
 * table of functions per backend. The front owns keys, objects, the queue,
 * the workers, poll and statistics; a backend moves whole objects by name.
 *
 * A worker takes a batch, fills a kvt__sreq_t and calls the backend's run
 * with its own per-worker context (a backend's connections are not shared
 * between threads). run sets every results[i]: for a get through
 * kvt__store_deliver (which checks an object read into memory and copies it
 * into the tier) or kvt__store_deliver_in_place (an object read straight
 * into the tier page, checked there); a put writes the pieces of
 * kvt__store_put_iov (the page straight from the tier's memory, then the
 * header: no copy of the page is made to build an object). */
#ifndef KVTIER_STORE_INT_H
#define KVTIER_STORE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "kvtier/store.h"

/* The object header, after the payload (so a payload read or written at
 * file offset 0 lands page-aligned in the tier page). */
#define KVT__STORE_HDR 80
#define KVT__STORE_MAGIC "KVT3"
#define KVT__STORE_VERSION 2

typedef struct kvt__scount {
    uint64_t bytes, round_trips, moved, ask, tryagain, reconnects, map_refreshes, evictions;
} kvt__scount_t;

typedef struct kvt__sreq {
    kvt_store_t *s;
    kvt_store_op_t op;
    size_t n;
    const char (*hex)[33];   /* key i in hex (names, messages) */
    const uint8_t (*key)[16]; /* key i (object headers) */
    uint8_t *results;        /* n kvt_store_result_t, to fill */
    kvt__scount_t cnt;       /* the backend's counters for this batch */
    void *scratch;           /* object_bytes of worker memory */
    struct iovec *iov;       /* layers + 3 entries of worker memory (the pieces below, and two for the backend) */
    uint8_t hdr[KVT__STORE_HDR]; /* the header of the object being moved */
    const kvt_store_page_t *pages;
    /* exists for its leading count only (kvt_store_exists_leading): the
     * results after the first MISS need not be asked, and are left MISS */
    bool leading;
} kvt__sreq_t;

typedef struct kvt__store_ops {
    const char *name;
    /* spec: the URL after "scheme:" (dir: "PATH[,max=SIZE]"; redis: after
     * "//"). KVT_EINVAL / KVT_EIO / KVT_ENOMEM with kvt__store_error set. */
    int (*open)(kvt_store_t *s, const char *spec, void **be);
    /* spec parsed as open parses it, reaching and creating nothing:
     * KVT_EINVAL / KVT_ENOMEM with kvt__store_error set (s: its url only) */
    int (*check)(kvt_store_t *s, const char *spec);
    void (*close)(void *be);
    int (*worker_open)(void *be, void **w);
    void (*worker_close)(void *be, void *w);
    void (*run)(void *be, void *w, kvt__sreq_t *req);
    /* after the batch run has been reported: bookkeeping kept off the
     * caller's wait (may be NULL) */
    void (*after)(void *be, void *w);
    /* stored bytes and objects, when the backend knows (may be NULL) */
    void (*usage)(void *be, uint64_t *bytes, uint64_t *objects);
    /* the object named hex is present, checked on the caller's thread; NULL
     * for a backend whose exists must ask a server (kvt_store_exists_leading) */
    uint8_t (*exists_here)(void *be, const char *hex); /* KVT_STORE_OK, _MISS or _FAILED */
} kvt__store_ops_t;

extern const kvt__store_ops_t kvt__store_dir_ops;
extern const kvt__store_ops_t kvt__store_redis_ops;
extern const kvt__store_ops_t kvt__store_cluster_ops;

/* Object i of a put as pieces, in order: the page page-first, straight
 * from the tier (adjacent layers merged: a page-first page is one piece)
 * or, for a tier without host addresses, gathered into scratch; then
 * req->hdr (the header, its payload checksum computed over the tier's
 * memory).
 * *iov (req->iov: the caller may consume it, e.g. on a partial write,
 * and has room for two more pieces, e.g. a protocol's framing before and
 * after) gets the pieces; returns their number (>= 2), or 0, logged, when the tier
 * page could not be read or failed the tier's own checksum
 * (KVT_TIER_CHECKSUM: a corrupt host page never reaches L3). */
size_t kvt__store_put_iov(kvt__sreq_t *req, size_t i, struct iovec **iov);
/* Object i of a get as read from the store (len bytes, or NULL for none):
 * checks it, copies it into the tier page, sets results[i] (OK, MISS or BAD,
 * logging why) and counts its bytes. */
void kvt__store_deliver(kvt__sreq_t *req, size_t i, const void *obj, size_t len);
/* Where object i of a get can be read to in place: *iov (req->iov, the
 * caller's to consume, with room for one more piece after) gets the tier page's
 * pieces page-first, then req->hdr for the header, object_bytes in all.
 * Returns the number of pieces, or
 * 0 when the tier has no host addresses (read into scratch, then
 * kvt__store_deliver). */
size_t kvt__store_get_iov(kvt__sreq_t *req, size_t i, struct iovec **iov);
/* After a read of len bytes into kvt__store_get_iov's pieces (err: the
 * read's errno, 0 for none): checks the header and then the payload where
 * it lies, sets results[i] as kvt__store_deliver does (FAILED for err); a
 * page whose object is refused is zeroed, so a refused object is never
 * served. */
void kvt__store_deliver_in_place(kvt__sreq_t *req, size_t i, size_t len, int err);
/* Pieces of memory moved by a backend's system calls; each consumes the
 * pieces it was given. kvt__iov_advance: past the first k bytes of the n
 * pieces at *v, returning the pieces left. kvt__writev_all: every piece
 * written (IOV_MAX at a time, a partial write resumed), 0 or -1 with errno
 * set. kvt__readv_all: the pieces filled until they are full or the file
 * or connection ends; the bytes read, or -1 with errno set (EAGAIN: a
 * socket's receive timeout ran out). kvt__readv_by: the same until a
 * deadline (kvt_now_ns; UINT64_MAX: none), then -1 with EAGAIN: each read
 * is bounded by the socket's timeout, and a peer sending a byte at a time
 * would otherwise hold the call as long as it likes. */
size_t kvt__iov_advance(struct iovec **v, size_t n, size_t k);
int kvt__writev_all(int fd, struct iovec *v, size_t n);
ssize_t kvt__readv_all(int fd, struct iovec *v, size_t n);
ssize_t kvt__readv_by(int fd, struct iovec *v, size_t n, uint64_t deadline);

/* Why an object is refused, or NULL when it is valid for key. */
const char *kvt__store_check_object(const kvt_store_t *s, const uint8_t key[16], const void *obj, size_t len);

uint64_t kvt__store_object_bytes(const kvt_store_t *s);
uint32_t kvt__store_timeout_ms(const kvt_store_t *s);
uint32_t kvt__store_retries(const kvt_store_t *s);
/* Latency before every batch a worker runs from now on, microseconds (0:
 * none; at most 10 s, else KVT_EINVAL and nothing changed): a store far
 * away, for the testing library's kvt_store_set_delay (kvtier/testing.h). */
int kvt__store_set_delay(kvt_store_t *s, uint32_t us);
/* The wall clock the store keeps recency by (the dir store's file times):
 * CLOCK_REALTIME, or the function the testing library's kvt_store_set_clock
 * gave (nanoseconds since the epoch), so that a test of recency steps a
 * clock instead of sleeping across seconds. Set it before the store's
 * first call. */
typedef uint64_t (*kvt__store_clock_fn)(void *arg);
void kvt__store_set_clock(kvt_store_t *s, kvt__store_clock_fn fn, void *arg);
struct timespec kvt__store_now(const kvt_store_t *s);
bool kvt__store_clock_set(const kvt_store_t *s);

/* Sets the open error text (thread-local) — printf style. */
void kvt__store_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A message: the store's last message, and the log (rate-limited to stderr by default). */
void kvt__store_log(kvt_store_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A size: digits, then at most one of K, M, G, T (either case; powers of
 * 1024): "123", "64K", "2G". KVT_OK with *out set, or KVT_EINVAL with *out
 * untouched and *why saying what is wrong (not digits and a suffix, or
 * more than 2^64-1 bytes). */
int kvt__store_parse_size(const char *s, size_t len, uint64_t *out, const char **why);

/* The dir backend: 16 hex digits naming this machine's boot and this PID
 * namespace, the <host> of a put's temporary file (dir.c). */
void kvt__dir_tmp_tag(char tag[17]);

#endif
