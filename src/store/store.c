/* The store's front (see include/kvtier/store.h for the contract).
 *
 *   submit (any thread)                 workers (cfg.threads)
 *   -------------------                 ---------------------
 *   check pages, copy the batch,        take a batch from the queue
 *   keys (bytes and hex)          -->   backend run (own connections):
 *   push on the queue                     put: the tier page's bytes where they
 *                                              lie + header (gathered I/O)
 *                                         get: object -> checked -> tier page
 *   poll (one thread)                   stats, done queue
 *   <-- done queue <------------------
 *
 *   kvt_store_run (any thread): the same checks, then the backend's run on
 *   the caller's thread with the store's context for callers (here_mu: one
 *   caller at a time), stats; no queue, no done queue.
 *
 * A batch is one allocation (the struct, its pages, keys and results);
 * it is freed by the poll after the one that returned it (so `pages` and
 * `results` stay valid until the next poll), or by close.
 *
 * Invariants: a batch is on exactly one of {the queue, a worker, the done
 * queue, the retired list}; the done queue (core/doneq-int.h) counts batches
 * submitted and not yet polled; the op's inflight gauge counts those not yet
 * completed. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "../core/clock-int.h"
#include "../core/doneq-int.h"
#include "../core/abi-int.h"
#include "../core/mem-int.h"
#include "../core/sigpipe-int.h"
#include "../core/sum-int.h"
#include "kvtier/error.h"
#include "kvtier/store.h"
#include "store-int.h"

typedef struct sbatch sbatch_t;
struct sbatch {
    kvt_store_done_t done;
    sbatch_t *next;          /* its work queue */
    kvt__doneq_link_t link;  /* the done queue, then the retired list */
    kvt_store_page_t *pages;
    char (*hex)[33];
    uint8_t (*key)[16];
    uint8_t *results;
    size_t alloc_bytes;
    uint64_t t_submit;
};

typedef struct opstats {
    pthread_mutex_t mu;
    kvt_store_stats_t st;
} opstats_t;

/* What a worker needs for a batch: its backend context and two buffers.
 * Whatever it lacks (an allocation or a connection that failed) it asks for
 * again before each batch, so one failure fails the batch at hand, not the
 * worker's every later one. */
typedef struct wctx {
    void *w;
    int wrc; /* worker_open's result: w is valid when KVT_OK */
    void *scratch;
    struct iovec *iov;
    size_t iov_bytes;
} wctx_t;

struct kvt_store {
    kvt_store_config_t cfg;
    _Atomic uint32_t delay_us; /* before every batch a worker runs (kvt__store_set_delay) */
    kvt__store_clock_fn clock; /* NULL: CLOCK_REALTIME (kvt__store_set_clock) */
    void *clock_arg;
    char model[128], ns[128];
    char url[1024];
    const kvt__store_ops_t *ops;
    void *be;
    uint32_t layers;
    uint64_t layer_bytes, page_bytes, object_bytes;
    uint32_t tier_pages;
    uint8_t ident[16];
    /* queue */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* two queues: reads (exists, get) before writes (put, remove), so that
     * what an admission waits for never queues behind backups */
    sbatch_t *head, *tail, *whead, *wtail;
    bool stop;
    kvt__doneq_t done; /* finished batches, to poll */
    _Atomic uint64_t next_ticket;
    pthread_t *th;
    unsigned nth;
    opstats_t ops_st[KVT_STORE_OP_COUNT_];
    /* the backend context for batches on the caller's thread (kvt_store_run,
     * kvt_store_exists_leading on a server): one caller at a time */
    pthread_mutex_t here_mu;
    wctx_t here;
    /* messages */
    pthread_mutex_t log_mu;
    char last[512];
    unsigned logged;
};

/* ---- errors and messages --------------------------------------------------------- */

static _Thread_local char open_error[512];
static _Thread_local char last_copy[512];

void kvt__store_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(open_error, sizeof(open_error), fmt, ap);
    va_end(ap);
}

void kvt__store_log(kvt_store_t *s, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&s->log_mu);
    memcpy(s->last, msg, sizeof(msg));
    unsigned k = s->logged++;
    pthread_mutex_unlock(&s->log_mu);
    if (s->cfg.log) s->cfg.log(s->cfg.log_arg, msg);
    else if (k < 16) fprintf(stderr, "kvtier store %s: %s%s\n", s->url, msg, k == 15 ? " (further messages are only counted)" : "");
}

const char *kvt_store_last_error(const kvt_store_t *s) {
    if (s == NULL) return open_error;
    pthread_mutex_lock((pthread_mutex_t *)&s->log_mu);
    memcpy(last_copy, s->last, sizeof(last_copy));
    pthread_mutex_unlock((pthread_mutex_t *)&s->log_mu);
    return last_copy;
}

const char *kvt_store_url(const kvt_store_t *s) { return s ? s->url : ""; }

char *kvt_store_url_redact(const char *url, char *out, size_t cap) {
    if (out == NULL || cap == 0) return out;
    out[0] = 0;
    if (url == NULL) return out;
    /* Any scheme, known or mistyped (rediss://, Redis://, redis:/): a message about a URL the store could not
     * parse must not print its password either. A dir: path may hold '@' and holds no credentials. */
    if (strncmp(url, "dir:", 4) == 0) return snprintf(out, cap, "%s", url), out;
    const char *sep = strstr(url, "://"), *rest = sep ? sep + 3 : url;
    const char *colon1 = strchr(url, ':'), *at1 = strchr(url, '@');
    if (sep == NULL && colon1 && (at1 == NULL || colon1 < at1)) rest = colon1 + 1 + strspn(colon1 + 1, "/"); /* SCHEME: */
    const char *at = strrchr(rest, '@'); /* a host holds no '@': the last one ends the credentials */
    const char *colon = at ? memchr(rest, ':', (size_t)(at - rest)) : NULL;
    if (at == NULL) snprintf(out, cap, "%s", url);                             /* no credentials in it */
    else if (colon) snprintf(out, cap, "%.*s:***%s", (int)(colon - url), url, at); /* USER:*** */
    else snprintf(out, cap, "%.*s***%s", (int)(rest - url), url, at);          /* a bare word may be a password */
    return out;
}
const char *kvt_store_backend(const kvt_store_t *s) { return s ? s->ops->name : ""; }
kvt_tier_t *kvt_store_tier(const kvt_store_t *s) { return s ? s->cfg.tier : NULL; }

const char *kvt_store_op_name(kvt_store_op_t op) {
    static const char *names[] = {"exists", "get", "put", "remove"};
    return (unsigned)op < KVT_STORE_OP_COUNT_ ? names[op] : "?";
}

uint64_t kvt__store_object_bytes(const kvt_store_t *s) { return s->object_bytes; }
uint64_t kvt_store_object_bytes(const kvt_store_t *s) { return s ? s->object_bytes : 0; }
uint32_t kvt__store_timeout_ms(const kvt_store_t *s) { return s->cfg.timeout_ms; }
uint32_t kvt__store_retries(const kvt_store_t *s) { return s->cfg.retries; }

int kvt__store_set_delay(kvt_store_t *s, uint32_t us) {
    if (s == NULL || us > 10000000) return KVT_EINVAL;
    atomic_store_explicit(&s->delay_us, us, memory_order_relaxed);
    return KVT_OK;
}

void kvt__store_set_clock(kvt_store_t *s, kvt__store_clock_fn fn, void *arg) {
    s->clock = fn;
    s->clock_arg = arg;
}

bool kvt__store_clock_set(const kvt_store_t *s) { return s->clock != NULL; }

struct timespec kvt__store_now(const kvt_store_t *s) {
    struct timespec ts;
    if (s->clock == NULL) {
        clock_gettime(CLOCK_REALTIME, &ts);
        return ts;
    }
    uint64_t ns = s->clock(s->clock_arg);
    return (struct timespec){.tv_sec = (time_t)(ns / 1000000000ull), .tv_nsec = (long)(ns % 1000000000ull)};
}

int kvt__store_parse_size(const char *p, size_t len, uint64_t *out, const char **why) {
    static const char *form = "digits, then K, M, G or T (powers of 1024)", *big = "more than 2^64-1 bytes";
    size_t i = 0;
    uint64_t v = 0;
    for (; i < len && p[i] >= '0' && p[i] <= '9'; i++) {
        unsigned d = (unsigned)(p[i] - '0');
        if (v > (UINT64_MAX - d) / 10) return *why = big, KVT_EINVAL;
        v = v * 10 + d;
    }
    unsigned shift = 0;
    if (i > 0 && i < len) {
        switch (p[i++]) {
        case 'K': case 'k': shift = 10; break;
        case 'M': case 'm': shift = 20; break;
        case 'G': case 'g': shift = 30; break;
        case 'T': case 't': shift = 40; break;
        default: i = 0;
        }
    }
    if (i == 0 || i != len) return *why = form, KVT_EINVAL;
    if (v > UINT64_MAX >> shift) return *why = big, KVT_EINVAL;
    *out = v << shift;
    return KVT_OK;
}

/* ---- keys and objects ------------------------------------------------------------- */

static void put_le(uint8_t *p, uint64_t v, unsigned n) {
    for (unsigned i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_le(const uint8_t *p, unsigned n) {
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void key_bytes(const kvt_store_t *s, const kvt_hash128_t *h, uint8_t out[16]) {
    uint8_t in[32];
    memcpy(in, s->ident, 16);
    put_le(in + 16, h->lo, 8);
    put_le(in + 24, h->hi, 8);
    XXH128_hash_t k = XXH3_128bits(in, sizeof(in));
    put_le(out, k.low64, 8);
    put_le(out + 8, k.high64, 8);
}

static void to_hex(const uint8_t k[16], char hex[33]) {
    static const char d[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        hex[2 * i] = d[k[i] >> 4];
        hex[2 * i + 1] = d[k[i] & 15];
    }
    hex[32] = 0;
}

kvt_hash128_t kvt_store_key(const kvt_store_t *s, const kvt_hash128_t *page_hash, char hex[33]) {
    kvt_hash128_t r = {0, 0};
    if (s == NULL || page_hash == NULL) return r;
    uint8_t k[16];
    key_bytes(s, page_hash, k);
    if (hex) to_hex(k, hex);
    r.lo = get_le(k, 8);
    r.hi = get_le(k + 8, 8);
    return r;
}

static void make_header(const kvt_store_t *s, const uint8_t key[16], uint64_t payload_sum, uint8_t h[KVT__STORE_HDR]) {
    memset(h, 0, KVT__STORE_HDR);
    memcpy(h, KVT__STORE_MAGIC, 4);
    put_le(h + 4, KVT__STORE_VERSION, 2);
    put_le(h + 6, KVT__STORE_HDR, 2);
    put_le(h + 8, s->layers, 4);
    put_le(h + 12, s->cfg.page_tokens, 4);
    put_le(h + 16, s->layer_bytes, 8);
    put_le(h + 24, s->page_bytes, 8);
    memcpy(h + 32, s->ident, 16);
    memcpy(h + 48, key, 16);
    put_le(h + 64, payload_sum, 8);
    put_le(h + 72, XXH3_64bits(h, 72), 8);
}

/* Why an object's length and header are refused, or NULL. The header is
 * at the object's end, so the length comes first: h holds the header only
 * when the length is right. head: the object's first bytes (headn of
 * them), where a version 1 object kept its header. */
static const char *check_header(const kvt_store_t *s, const uint8_t key[16], const uint8_t *h, size_t len,
                                const uint8_t *head, size_t headn) {
    if (len != s->object_bytes) return len < s->object_bytes ? "truncated (shorter than an object)" : "longer than an object";
    if (memcmp(h, KVT__STORE_MAGIC, 4) != 0) {
        if (headn >= 6 && memcmp(head, KVT__STORE_MAGIC, 4) == 0 && get_le(head + 4, 2) == 1)
            return "object format version 1 (header first; this library reads version 2: a miss until the page is put again)";
        return "bad magic (not a kvtier object)";
    }
    if (get_le(h + 72, 8) != XXH3_64bits(h, 72)) return "header checksum mismatch";
    if (get_le(h + 4, 2) != KVT__STORE_VERSION || get_le(h + 6, 2) != KVT__STORE_HDR) return "unknown object version";
    if (get_le(h + 8, 4) != s->layers || get_le(h + 12, 4) != s->cfg.page_tokens || get_le(h + 16, 8) != s->layer_bytes ||
        get_le(h + 24, 8) != s->page_bytes)
        return "wrong geometry (layers, page_tokens or layer_bytes differ)";
    if (memcmp(h + 32, s->ident, 16) != 0) return "another model identity";
    if (memcmp(h + 48, key, 16) != 0) return "another key's object";
    return NULL;
}

const char *kvt__store_check_object(const kvt_store_t *s, const uint8_t key[16], const void *obj, size_t len) {
    const uint8_t *o = obj, *h = len == s->object_bytes ? o + s->page_bytes : o; /* the header: after the payload */
    const char *why = check_header(s, key, h, len, o, len);
    if (why == NULL && get_le(h + 64, 8) != kvt__sum(o, s->page_bytes)) why = "payload checksum mismatch";
    return why;
}

/* A tier page's bytes where they lie, page-first (layer 0, 1, ...), adjacent
 * layers merged: a page-first page is one piece, a layer-first page one per
 * layer. iov has room for s->layers; returns the pieces, 0 for a tier
 * without one host address per (page, layer) (cuda, an engine tier of
 * several planes: kvt_tier_read/write then gather and scatter). */
static size_t tier_pieces(const kvt_store_t *s, uint32_t page, struct iovec *iov) {
    kvt_tier_t *t = s->cfg.tier;
    if (!kvt_tier_host_visible(t) || kvt_tier_planes(t) != 1) return 0;
    size_t n = 0;
    for (uint32_t l = 0; l < s->layers; l++) {
        uint8_t *a = kvt_tier_addr(t, page, l);
        if (a == NULL) return 0;
        if (n > 0 && (uint8_t *)iov[n - 1].iov_base + iov[n - 1].iov_len == a) iov[n - 1].iov_len += s->layer_bytes;
        else iov[n++] = (struct iovec){.iov_base = a, .iov_len = s->layer_bytes};
    }
    return n;
}

/* XXH3-64 of the pieces as one byte string (core/sum-int.h: a get and a put
 * each hash every byte they move, at the CPU's widest vector unit). */
static uint64_t pieces_sum(const struct iovec *v, size_t n) {
    if (n == 1) return kvt__sum(v[0].iov_base, v[0].iov_len);
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    for (size_t k = 0; k < n; k++) kvt__sum_update(&st, v[k].iov_base, v[k].iov_len);
    return XXH3_64bits_digest(&st);
}

static int tier_to_buf(const kvt_store_t *s, uint32_t page, uint8_t *dst) {
    for (uint32_t l = 0; l < s->layers; l++) {
        int rc = kvt_tier_read(s->cfg.tier, page, l, dst + (uint64_t)l * s->layer_bytes);
        if (rc != KVT_OK) return rc;
    }
    return KVT_OK;
}

/* iov: worker memory for the pieces (s->layers entries). */
static int buf_to_tier(const kvt_store_t *s, uint32_t page, const uint8_t *src, struct iovec *iov) {
    size_t n = tier_pieces(s, page, iov);
    for (size_t k = 0; k < n; k++) {
        memcpy(iov[k].iov_base, src, iov[k].iov_len);
        src += iov[k].iov_len;
    }
    for (uint32_t l = 0; n == 0 && l < s->layers; l++) {
        int rc = kvt_tier_write(s->cfg.tier, page, l, src + (uint64_t)l * s->layer_bytes);
        if (rc != KVT_OK) return rc;
    }
    return KVT_OK;
}

size_t kvt__store_put_iov(kvt__sreq_t *req, size_t i, struct iovec **iov) {
    kvt_store_t *s = req->s;
    struct iovec *v = req->iov;
    size_t n = tier_pieces(s, req->pages[i].page, v);
    if (n == 0) {
        if (tier_to_buf(s, req->pages[i].page, req->scratch) != KVT_OK) {
            kvt__store_log(s, "put %s: cannot read tier page %u", req->hex[i], req->pages[i].page);
            return 0;
        }
        v[0] = (struct iovec){.iov_base = req->scratch, .iov_len = s->page_bytes};
        n = 1;
    }
    uint64_t sum = pieces_sum(v, n);
    const uint64_t *sums = kvt_tier_sums(s->cfg.tier);
    if (sums && sums[req->pages[i].page] != sum) { /* a corrupt host page never reaches L3 */
        kvt__store_log(s, "key %s: tier page %u failed its checksum; not stored", req->hex[i], req->pages[i].page);
        return 0;
    }
    make_header(s, req->key[i], sum, req->hdr);
    v[n] = (struct iovec){.iov_base = req->hdr, .iov_len = KVT__STORE_HDR}; /* after the payload */
    *iov = v;
    return n + 1;
}

void kvt__store_deliver(kvt__sreq_t *req, size_t i, const void *obj, size_t len) {
    kvt_store_t *s = req->s;
    if (obj == NULL) {
        req->results[i] = KVT_STORE_MISS;
        return;
    }
    const char *why = kvt__store_check_object(s, req->key[i], obj, len);
    if (why) {
        req->results[i] = KVT_STORE_BAD;
        kvt__store_log(s, "bad object for key %s (%zu bytes): %s; refused, counted as a miss", req->hex[i], len, why);
        return;
    }
    if (buf_to_tier(s, req->pages[i].page, obj, req->iov) != KVT_OK) {
        req->results[i] = KVT_STORE_FAILED;
        kvt__store_log(s, "key %s: could not write tier page %u", req->hex[i], req->pages[i].page);
        return;
    }
    /* a tier with checksums gets the page's: the payload checksum just verified is the same XXH3-64
     * over the layers in order (kvt_tier_page_sum), so a load from this page checks it as any other */
    uint64_t *sums = kvt_tier_sums(s->cfg.tier);
    if (sums) sums[req->pages[i].page] = get_le((const uint8_t *)obj + s->page_bytes + 64, 8);
    req->results[i] = KVT_STORE_OK;
    req->cnt.bytes += len;
}

size_t kvt__store_get_iov(kvt__sreq_t *req, size_t i, struct iovec **iov) {
    size_t n = tier_pieces(req->s, req->pages[i].page, req->iov);
    if (n == 0) return 0;
    req->iov[n] = (struct iovec){.iov_base = req->hdr, .iov_len = KVT__STORE_HDR};
    *iov = req->iov;
    return n + 1;
}

void kvt__store_deliver_in_place(kvt__sreq_t *req, size_t i, size_t len, int err) {
    kvt_store_t *s = req->s;
    struct iovec *v = req->iov;
    size_t n = tier_pieces(s, req->pages[i].page, v); /* afresh: the read consumed the pieces */
    const char *why = err ? NULL : check_header(s, req->key[i], req->hdr, len, v[0].iov_base, len < v[0].iov_len ? len : v[0].iov_len);
    if (err == 0 && why == NULL && get_le(req->hdr + 64, 8) != pieces_sum(v, n)) why = "payload checksum mismatch";
    if (err == 0 && why == NULL) {
        uint64_t *sums = kvt_tier_sums(s->cfg.tier); /* as kvt__store_deliver */
        if (sums) sums[req->pages[i].page] = get_le(req->hdr + 64, 8);
        req->results[i] = KVT_STORE_OK;
        req->cnt.bytes += len;
        return;
    }
    for (size_t k = 0; k < n; k++) memset(v[k].iov_base, 0, v[k].iov_len); /* never served, not even by mistake */
    if (err) {
        req->results[i] = KVT_STORE_FAILED;
        kvt__store_log(s, "get %s: read failed: %s", req->hex[i], strerror(err));
    } else {
        req->results[i] = KVT_STORE_BAD;
        kvt__store_log(s, "bad object for key %s (%zu bytes): %s; refused, counted as a miss", req->hex[i], len, why);
    }
}

/* ---- pieces ------------------------------------------------------------------------ */

size_t kvt__iov_advance(struct iovec **v, size_t n, size_t k) {
    while (k) {
        size_t step = k < (*v)->iov_len ? k : (*v)->iov_len;
        (*v)->iov_base = (uint8_t *)(*v)->iov_base + step;
        (*v)->iov_len -= step;
        k -= step;
        if ((*v)->iov_len == 0) (*v)++, n--;
    }
    return n;
}

int kvt__writev_all(int fd, struct iovec *v, size_t n) {
    while (n) {
        ssize_t k = writev(fd, v, n < IOV_MAX ? (int)n : IOV_MAX);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            if (k == 0) errno = EIO;
            return -1;
        }
        n = kvt__iov_advance(&v, n, (size_t)k);
    }
    return 0;
}

ssize_t kvt__readv_all(int fd, struct iovec *v, size_t n) { return kvt__readv_by(fd, v, n, UINT64_MAX); }

ssize_t kvt__readv_by(int fd, struct iovec *v, size_t n, uint64_t deadline) {
    size_t got = 0;
    while (n) {
        if (deadline != UINT64_MAX && kvt_now_ns() >= deadline) return errno = EAGAIN, -1;
        ssize_t k = readv(fd, v, n < IOV_MAX ? (int)n : IOV_MAX);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -1;
        if (k == 0) break;
        got += (size_t)k;
        n = kvt__iov_advance(&v, n, (size_t)k);
    }
    return (ssize_t)got;
}

/* ---- workers ------------------------------------------------------------------------ */

/* A batch's results in the op's statistics: *lead gets the leading keys
 * present, the return value the keys that were OK; queued: it went through
 * the queue (and counted as in flight). */
static uint64_t record(kvt_store_t *s, const kvt__sreq_t *req, uint64_t latency_ns, bool queued, size_t *lead) {
    uint64_t hits = 0, misses = 0, bad = 0, failed = 0;
    bool leading = true;
    *lead = 0;
    for (size_t i = 0; i < req->n; i++) {
        uint8_t r = req->results[i];
        hits += r == KVT_STORE_OK;
        misses += r == KVT_STORE_MISS;
        bad += r == KVT_STORE_BAD;
        failed += r == KVT_STORE_FAILED;
        if (leading && r == KVT_STORE_OK) ++*lead;
        else leading = false;
    }
    opstats_t *o = &s->ops_st[req->op];
    pthread_mutex_lock(&o->mu);
    kvt_store_stats_t *st = &o->st;
    st->calls++;
    st->keys += req->n;
    st->hits += hits;
    st->misses += misses;
    st->bad_objects += bad;
    st->failures += failed;
    st->bytes += req->cnt.bytes;
    st->round_trips += req->cnt.round_trips;
    st->moved += req->cnt.moved;
    st->ask += req->cnt.ask;
    st->tryagain += req->cnt.tryagain;
    st->reconnects += req->cnt.reconnects;
    st->map_refreshes += req->cnt.map_refreshes;
    st->evictions += req->cnt.evictions;
    if (queued) st->inflight--;
    kvt_hist_record(&st->latency_ns, latency_ns);
    pthread_mutex_unlock(&o->mu);
    return hits;
}

static void account(kvt_store_t *s, sbatch_t *b, const kvt__sreq_t *req, uint64_t t_end) {
    kvt_store_done_t *d = &b->done;
    size_t lead;
    uint64_t hits = record(s, req, t_end - b->t_submit, true, &lead);
    bool failed = memchr(b->results, KVT_STORE_FAILED, d->n) != NULL;
    d->count = d->op == KVT_STORE_EXISTS ? lead : hits;
    d->status = failed ? KVT_EIO : KVT_OK;
    d->latency_ns = t_end - b->t_submit;
}

/* The pieces of a page, a header and two for the backend (kvt__sreq_t.iov). */
static size_t wctx_iov_bytes(const kvt_store_t *s) { return ((size_t)s->layers + 3) * sizeof(struct iovec); }

/* A worker's backend context, and for an op that moves a page its buffers:
 * exists and remove need none, so a store of keys alone answers them
 * whatever its pages' size. */
static int wctx_ready(kvt_store_t *s, wctx_t *k, kvt_store_op_t op) {
    bool moves = op == KVT_STORE_GET || op == KVT_STORE_PUT;
    if (k->wrc != KVT_OK) k->wrc = s->ops->worker_open(s->be, &k->w);
    if (moves && k->scratch == NULL) k->scratch = kvt__malloc(s->object_bytes);
    if (moves && k->iov == NULL) k->iov = kvt__malloc(k->iov_bytes);
    if (k->wrc != KVT_OK) return k->wrc;
    return !moves || (k->scratch && k->iov) ? KVT_OK : KVT_ENOMEM;
}

/* A store far away (kvt__store_set_delay): its latency, before a batch. */
static void far_away(kvt_store_t *s) {
    uint32_t delay_us = atomic_load_explicit(&s->delay_us, memory_order_relaxed);
    if (delay_us == 0) return;
    struct timespec ts = {delay_us / 1000000, (long)(delay_us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

static void wctx_close(kvt_store_t *s, wctx_t *k) {
    kvt__free(k->scratch, s->object_bytes);
    kvt__free(k->iov, k->iov_bytes);
    if (k->wrc == KVT_OK) s->ops->worker_close(s->be, k->w);
    *k = (wctx_t){.wrc = KVT_EIO, .iov_bytes = k->iov_bytes};
}

static void *worker_main(void *arg) {
    kvt_store_t *s = arg;
    wctx_t k = {.wrc = KVT_EIO, .iov_bytes = wctx_iov_bytes(s)};
    kvt__sigpipe_t sp; /* hiredis writes with write(2): a peer gone is EPIPE, not the process's end */
    kvt__sigpipe_hold(&sp);
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (s->head == NULL && s->whead == NULL && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
        bool read = s->head != NULL;
        sbatch_t *b = read ? s->head : s->whead;
        if (b == NULL) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        if (read) {
            s->head = b->next;
            if (s->head == NULL) s->tail = NULL;
        } else {
            s->whead = b->next;
            if (s->whead == NULL) s->wtail = NULL;
        }
        pthread_mutex_unlock(&s->mu);

        far_away(s);
        int rc = wctx_ready(s, &k, b->done.op);
        kvt__sreq_t req = {.s = s, .op = b->done.op, .n = b->done.n, .hex = (const char(*)[33])b->hex,
                           .key = (const uint8_t(*)[16])b->key, .results = b->results, .scratch = k.scratch,
                           .iov = k.iov, .pages = b->pages};
        if (rc != KVT_OK) {
            memset(b->results, KVT_STORE_FAILED, b->done.n);
            kvt__store_log(s, "worker has no backend context or no memory for a page of %llu bytes (%s): %zu keys failed",
                           (unsigned long long)s->object_bytes, kvt_err_name(rc), b->done.n);
        } else {
            s->ops->run(s->be, k.w, &req);
        }
        account(s, b, &req, kvt_now_ns());
        kvt__doneq_push(&s->done, b);
        if (rc == KVT_OK && s->ops->after) s->ops->after(s->be, k.w); /* off the caller's wait */
        kvt__sigpipe_drain(&sp);
    }
    wctx_close(s, &k);
    kvt__sigpipe_release(&sp);
    return NULL;
}

/* ---- submit and poll ------------------------------------------------------------------ */

static void batch_free(void *p) {
    sbatch_t *b = p;
    kvt__free(b, b->alloc_bytes);
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static int distinct_pages(const kvt_store_page_t *pages, size_t n) {
    uint32_t stack[512], *v = n <= 512 ? stack : kvt__malloc(n * sizeof(uint32_t));
    if (v == NULL) return KVT_ENOMEM;
    for (size_t i = 0; i < n; i++) v[i] = pages[i].page;
    qsort(v, n, sizeof(*v), cmp_u32);
    int rc = KVT_OK;
    for (size_t i = 1; i < n && rc == KVT_OK; i++)
        if (v[i] == v[i - 1]) rc = KVT_EINVAL;
    if (v != stack) kvt__free(v, n * sizeof(uint32_t));
    return rc;
}

/* A batch's keys (bytes and hex) and its results before the backend runs:
 * FAILED, what a backend leaves unset. */
static void batch_keys(const kvt_store_t *s, const kvt_store_page_t *p, size_t n, uint8_t (*key)[16], char (*hex)[33],
                       uint8_t *results) {
    for (size_t i = 0; i < n; i++) {
        key_bytes(s, &p[i].hash, key[i]);
        to_hex(key[i], hex[i]);
    }
    memset(results, KVT_STORE_FAILED, n);
}

/* What every batch must be, queued or run on the caller's thread. */
static int check_batch(const kvt_store_t *s, kvt_store_op_t op, const kvt_store_page_t *pages, size_t n) {
    if (s == NULL || pages == NULL || n == 0 || n > (SIZE_MAX / 128) || (unsigned)op >= KVT_STORE_OP_COUNT_) return KVT_EINVAL;
    if (op == KVT_STORE_GET || op == KVT_STORE_PUT) {
        if (s->cfg.tier == NULL) return KVT_EINVAL;
        for (size_t i = 0; i < n; i++)
            if (pages[i].page >= s->tier_pages) return KVT_EINVAL;
    }
    if (op == KVT_STORE_GET && n > 1) return distinct_pages(pages, n); /* a page twice: two writers of one tier page */
    return KVT_OK;
}

static int submit(kvt_store_t *s, kvt_store_op_t op, const kvt_store_page_t *pages, size_t n, uint64_t user,
                  uint64_t *ticket) {
    int crc = check_batch(s, op, pages, n);
    if (crc != KVT_OK) return crc;
    size_t off_pages = (sizeof(sbatch_t) + 15) & ~(size_t)15;
    size_t off_hex = off_pages + n * sizeof(kvt_store_page_t);
    size_t off_key = off_hex + n * 33;
    size_t off_res = off_key + n * 16;
    size_t total = off_res + n;
    uint8_t *mem = kvt__malloc(total);
    if (mem == NULL) return KVT_ENOMEM;
    sbatch_t *b = (sbatch_t *)mem;
    memset(b, 0, sizeof(*b));
    b->alloc_bytes = total;
    b->pages = (kvt_store_page_t *)(mem + off_pages);
    b->hex = (char(*)[33])(mem + off_hex);
    b->key = (uint8_t(*)[16])(mem + off_key);
    b->results = mem + off_res;
    memcpy(b->pages, pages, n * sizeof(*pages));
    batch_keys(s, pages, n, b->key, b->hex, b->results);
    b->done.op = op;
    b->done.n = n;
    b->done.user = user;
    b->done.pages = b->pages;
    b->done.results = b->results;
    b->done.ticket = atomic_fetch_add(&s->next_ticket, 1);
    b->t_submit = kvt_now_ns();
    if (ticket) *ticket = b->done.ticket;
    pthread_mutex_lock(&s->ops_st[op].mu);
    s->ops_st[op].st.inflight++;
    pthread_mutex_unlock(&s->ops_st[op].mu);
    kvt__doneq_submitted(&s->done);
    pthread_mutex_lock(&s->mu);
    sbatch_t **head = op == KVT_STORE_EXISTS || op == KVT_STORE_GET ? &s->head : &s->whead;
    sbatch_t **tail = head == &s->head ? &s->tail : &s->wtail;
    if (*tail) (*tail)->next = b;
    else *head = b;
    *tail = b;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return KVT_OK;
}

int kvt_store_exists(kvt_store_t *s, const kvt_store_page_t *p, size_t n, uint64_t user, uint64_t *ticket) {
    return submit(s, KVT_STORE_EXISTS, p, n, user, ticket);
}

/* A batch through the backend's run on the caller's thread, with the
 * store's own context for callers (one caller at a time): a local check or
 * a round trip without a worker's wake-up and the caller's. results: n
 * bytes; *count as kvt_store_done_t's (leading: an exists for its leading
 * count only). */
static int run_here(kvt_store_t *s, kvt_store_op_t op, const kvt_store_page_t *p, size_t n, uint8_t *results, size_t *count,
                    bool leading) {
    size_t bytes = n * (33 + 16);
    uint8_t *mem = kvt__malloc(bytes);
    if (mem == NULL) return KVT_ENOMEM;
    char(*hex)[33] = (char(*)[33])mem;
    uint8_t(*key)[16] = (uint8_t(*)[16])(mem + n * 33);
    batch_keys(s, p, n, key, hex, results);
    uint64_t t0 = kvt_now_ns();
    pthread_mutex_lock(&s->here_mu);
    int rc = wctx_ready(s, &s->here, op);
    kvt__sreq_t req = {.s = s, .op = op, .n = n, .hex = (const char(*)[33])hex, .key = (const uint8_t(*)[16])key,
                       .results = results, .scratch = s->here.scratch, .iov = s->here.iov, .pages = p, .leading = leading};
    if (rc == KVT_OK) {
        kvt__sigpipe_t sp; /* as a worker: a peer gone is EPIPE */
        kvt__sigpipe_hold(&sp);
        far_away(s);
        s->ops->run(s->be, s->here.w, &req);
        if (s->ops->after) s->ops->after(s->be, s->here.w);
        kvt__sigpipe_release(&sp);
    } else {
        kvt__store_log(s, "%s on the caller's thread has no backend context (%s): %zu keys failed", kvt_store_op_name(op),
                       kvt_err_name(rc), n);
    }
    pthread_mutex_unlock(&s->here_mu);
    size_t lead;
    uint64_t hits = record(s, &req, kvt_now_ns() - t0, false, &lead);
    if (count) *count = op == KVT_STORE_EXISTS ? lead : (size_t)hits;
    kvt__free(mem, bytes);
    return memchr(results, KVT_STORE_FAILED, n) ? KVT_EIO : KVT_OK;
}

int kvt_store_run(kvt_store_t *s, kvt_store_op_t op, const kvt_store_page_t *p, size_t n, uint8_t *results, size_t *count) {
    int rc = check_batch(s, op, p, n);
    if (rc != KVT_OK || results == NULL) return rc != KVT_OK ? rc : KVT_EINVAL;
    return run_here(s, op, p, n, results, count, false);
}

int kvt_store_exists_leading(kvt_store_t *s, const kvt_store_page_t *p, size_t n, size_t *count) {
    if (s == NULL || p == NULL || n == 0 || n > SIZE_MAX / 64 || count == NULL) return KVT_EINVAL;
    if (s->ops->exists_here == NULL) {
        uint8_t stack[256], *results = n <= sizeof(stack) ? stack : kvt__malloc(n);
        if (results == NULL) return KVT_ENOMEM;
        int rc = run_here(s, KVT_STORE_EXISTS, p, n, results, count, true);
        if (results != stack) kvt__free(results, n);
        return rc == KVT_ENOMEM ? rc : KVT_OK; /* keys that failed are not present */
    }
    uint64_t t0 = kvt_now_ns();
    size_t lead = 0;
    uint8_t r = KVT_STORE_OK;
    for (; lead < n; lead++) {
        uint8_t key[16];
        char hex[33];
        key_bytes(s, &p[lead].hash, key);
        to_hex(key, hex);
        if ((r = s->ops->exists_here(s->be, hex)) != KVT_STORE_OK) break;
    }
    *count = lead;
    opstats_t *o = &s->ops_st[KVT_STORE_EXISTS];
    pthread_mutex_lock(&o->mu);
    o->st.calls++;
    o->st.keys += lead + (lead < n);
    o->st.hits += lead;
    o->st.misses += lead < n && r != KVT_STORE_FAILED;
    o->st.failures += lead < n && r == KVT_STORE_FAILED; /* not present to the caller, but not a miss */
    kvt_hist_record(&o->st.latency_ns, kvt_now_ns() - t0);
    pthread_mutex_unlock(&o->mu);
    return KVT_OK;
}
int kvt_store_get(kvt_store_t *s, const kvt_store_page_t *p, size_t n, uint64_t user, uint64_t *ticket) {
    return submit(s, KVT_STORE_GET, p, n, user, ticket);
}
int kvt_store_put(kvt_store_t *s, const kvt_store_page_t *p, size_t n, uint64_t user, uint64_t *ticket) {
    return submit(s, KVT_STORE_PUT, p, n, user, ticket);
}
int kvt_store_remove(kvt_store_t *s, const kvt_store_page_t *p, size_t n, uint64_t user, uint64_t *ticket) {
    return submit(s, KVT_STORE_REMOVE, p, n, user, ticket);
}

int kvt_store_poll(kvt_store_t *s, kvt_store_done_t *out, size_t max, uint64_t timeout_ns) {
    if (s == NULL || (out == NULL && max > 0)) return KVT_EINVAL;
    return (int)kvt__doneq_poll(&s->done, out, max, timeout_ns);
}

uint64_t kvt_store_pending(kvt_store_t *s) { return s ? kvt__doneq_pending(&s->done) : 0; }

/* ---- open and close ------------------------------------------------------------------ */

void kvt_store_config_default(kvt_store_config_t *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->size = sizeof(*cfg);
    cfg->dtype_bytes = 2;
    cfg->tp_size = 1;
    cfg->cp_size = 1;
    cfg->threads = 2;
    cfg->timeout_ms = 2000;
    cfg->retries = 8;
}

static int check_config(kvt_store_t *s) {
    kvt_store_config_t *c = &s->cfg;
    if (c->model == NULL || c->model[0] == 0 || strlen(c->model) >= sizeof(s->model))
        return kvt__store_error("config: a model name (1..127 characters) is required"), KVT_EINVAL;
    if (strchr(c->model, ';')) /* the identity's separator: a model "m;ns=x" could pose as model m's namespace x */
        return kvt__store_error("config: a model name may not hold ';' (got '%s')", c->model), KVT_EINVAL;
    const char *ns = c->ns ? c->ns : "default";
    if (strlen(ns) >= sizeof(s->ns)) return kvt__store_error("config: namespace longer than 127 characters"), KVT_EINVAL;
    snprintf(s->model, sizeof(s->model), "%s", c->model);
    snprintf(s->ns, sizeof(s->ns), "%s", ns);
    if (c->page_tokens == 0) return kvt__store_error("config: page_tokens must be >= 1"), KVT_EINVAL;
    if (c->threads < 1 || c->threads > 64) return kvt__store_error("config: threads must be 1..64 (got %u)", c->threads), KVT_EINVAL;
    if (c->tp_size == 0 || c->tp_rank >= c->tp_size || c->cp_size == 0 || c->cp_rank >= c->cp_size)
        return kvt__store_error("config: shard rank must be below its size (tp %u/%u, cp %u/%u)", c->tp_rank, c->tp_size,
                                c->cp_rank, c->cp_size),
               KVT_EINVAL;
    if (c->timeout_ms == 0) return kvt__store_error("config: timeout_ms must be >= 1"), KVT_EINVAL;
    s->layers = c->layers;
    s->layer_bytes = c->layer_bytes;
    if (c->tier) {
        const kvt_geom_t *g = kvt_tier_geom(c->tier);
        if (s->layers == 0) s->layers = g->layers;
        if (s->layer_bytes == 0) s->layer_bytes = g->layer_bytes;
        if (s->layers != g->layers || s->layer_bytes != g->layer_bytes)
            return kvt__store_error("config: geometry %u layers x %llu bytes differs from the tier's %u x %llu", s->layers,
                                    (unsigned long long)s->layer_bytes, g->layers, (unsigned long long)g->layer_bytes),
                   KVT_EINVAL;
        if (kvt_tier_planes(c->tier) == 0) return kvt__store_error("config: the tier has no local pages (a remote tier)"), KVT_EINVAL;
        s->tier_pages = g->pages > UINT32_MAX ? UINT32_MAX : (uint32_t)g->pages;
    }
    if (s->layers == 0 || s->layer_bytes == 0)
        return kvt__store_error("config: geometry needed: a tier, or layers and layer_bytes"), KVT_EINVAL;
    if (s->layer_bytes > (1ull << 40) / s->layers) return kvt__store_error("config: page too large"), KVT_EINVAL;
    s->page_bytes = (uint64_t)s->layers * s->layer_bytes;
    s->object_bytes = s->page_bytes + KVT__STORE_HDR;
    char id[512];
    snprintf(id, sizeof(id), "kvtier-l3-id/1;model=%s;page_tokens=%u;layers=%u;layer_bytes=%llu;dtype_bytes=%u;tp=%u/%u;cp=%u/%u;ns=%s",
             s->model, c->page_tokens, s->layers, (unsigned long long)s->layer_bytes, c->dtype_bytes, c->tp_rank, c->tp_size,
             c->cp_rank, c->cp_size, s->ns);
    XXH128_hash_t h = XXH3_128bits(id, strlen(id));
    put_le(s->ident, h.low64, 8);
    put_le(s->ident + 8, h.high64, 8);
    return KVT_OK;
}

static int pick_backend(const char *url, const kvt__store_ops_t **ops, const char **spec) {
    static const struct {
        const char *prefix;
        const kvt__store_ops_t *ops;
    } schemes[] = {{"dir:", &kvt__store_dir_ops}, {"redis://", &kvt__store_redis_ops}, {"redis-cluster://", &kvt__store_cluster_ops}};
    for (size_t i = 0; i < sizeof(schemes) / sizeof(schemes[0]); i++) {
        size_t k = strlen(schemes[i].prefix);
        if (strncmp(url, schemes[i].prefix, k) == 0) {
            *ops = schemes[i].ops;
            *spec = url + k;
            return KVT_OK;
        }
    }
    char shown[256];
    kvt__store_error("malformed store URL '%s': unknown scheme (expected dir:PATH[,max=SIZE], redis://HOST:PORT or "
                     "redis-cluster://H:P[,H:P...])", kvt_store_url_redact(url, shown, sizeof(shown)));
    return KVT_EINVAL;
}

static void destroy(kvt_store_t *s) {
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    kvt__doneq_fini(&s->done);
    pthread_mutex_destroy(&s->log_mu);
    pthread_mutex_destroy(&s->here_mu);
    for (int i = 0; i < KVT_STORE_OP_COUNT_; i++) pthread_mutex_destroy(&s->ops_st[i].mu);
    KVT_DELETE(s);
}

static void stop_workers(kvt_store_t *s) {
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    for (unsigned i = 0; i < s->nth; i++) pthread_join(s->th[i], NULL);
    kvt__free(s->th, s->cfg.threads * sizeof(pthread_t));
    s->th = NULL;
    s->nth = 0;
}

int kvt_store_url_check(const char *url) {
    open_error[0] = 0;
    if (url == NULL) return kvt__store_error("kvt_store_url_check: NULL argument"), KVT_EINVAL;
    kvt_store_t *s = KVT_NEW(kvt_store_t); /* what the backend's messages read: the URL, redacted */
    if (s == NULL) return kvt__store_error("out of memory"), KVT_ENOMEM;
    const char *spec = NULL;
    int rc = KVT_OK;
    if (strlen(url) >= sizeof(s->url)) rc = KVT_EINVAL, kvt__store_error("store URL longer than 1023 characters");
    if (rc == KVT_OK) rc = pick_backend(url, &s->ops, &spec);
    if (rc == KVT_OK) {
        kvt_store_url_redact(url, s->url, sizeof(s->url));
        rc = s->ops->check(s, spec);
    }
    KVT_DELETE(s);
    return rc;
}

int kvt_store_open(kvt_store_t **out, const char *url, const kvt_store_config_t *user) {
    open_error[0] = 0;
    if (out == NULL || url == NULL || user == NULL) return kvt__store_error("kvt_store_open: NULL argument"), KVT_EINVAL;
    *out = NULL;
    kvt_store_t *s = KVT_NEW(kvt_store_t);
    if (s == NULL) return kvt__store_error("out of memory"), KVT_ENOMEM;
    pthread_mutex_init(&s->mu, NULL);
    kvt__doneq_init(&s->done, offsetof(sbatch_t, link), offsetof(sbatch_t, done), sizeof(kvt_store_done_t), batch_free);
    pthread_cond_init(&s->cv, NULL);
    pthread_mutex_init(&s->log_mu, NULL);
    pthread_mutex_init(&s->here_mu, NULL);
    for (int i = 0; i < KVT_STORE_OP_COUNT_; i++) {
        pthread_mutex_init(&s->ops_st[i].mu, NULL);
        s->ops_st[i].st.size = sizeof(kvt_store_stats_t);
        s->ops_st[i].st.op = (kvt_store_op_t)i;
        kvt_hist_init(&s->ops_st[i].st.latency_ns);
    }
    kvt_store_config_default(&s->cfg);
    int rc = kvt__abi_in(&s->cfg, sizeof(s->cfg), user);
    if (rc != KVT_OK) kvt__store_error("config: bad size field, or fields this library does not know are set");
    const char *spec = NULL;
    if (rc == KVT_OK) rc = check_config(s);
    if (rc == KVT_OK && strlen(url) >= sizeof(s->url)) rc = KVT_EINVAL, kvt__store_error("store URL longer than 1023 characters");
    if (rc == KVT_OK) rc = pick_backend(url, &s->ops, &spec);
    if (rc == KVT_OK) {
        kvt_store_url_redact(url, s->url, sizeof(s->url)); /* what messages and kvt_store_url show */
        rc = s->ops->open(s, spec, &s->be);
    }
    if (rc != KVT_OK) {
        destroy(s);
        return rc;
    }
    s->here = (wctx_t){.wrc = KVT_EIO, .iov_bytes = wctx_iov_bytes(s)};
    s->th = kvt__calloc(s->cfg.threads, sizeof(pthread_t));
    if (s->th == NULL) rc = KVT_ENOMEM;
    for (unsigned i = 0; rc == KVT_OK && i < s->cfg.threads; i++) {
        if (pthread_create(&s->th[i], NULL, worker_main, s) != 0) rc = KVT_EIO;
        else s->nth++;
    }
    if (rc != KVT_OK) {
        kvt__store_error("could not start the store's worker threads");
        if (s->th) stop_workers(s);
        s->ops->close(s->be);
        destroy(s);
        return rc;
    }
    *out = s;
    return KVT_OK;
}

void kvt_store_close(kvt_store_t *s) {
    if (s == NULL) return;
    stop_workers(s); /* workers drain the queue before they exit */
    wctx_close(s, &s->here);
    s->ops->close(s->be);
    sbatch_t *lists[] = {s->head, s->whead}; /* (the done queue's: destroy) */
    for (int i = 0; i < 2; i++)
        while (lists[i]) {
            sbatch_t *b = lists[i];
            lists[i] = b->next;
            batch_free(b);
        }
    destroy(s);
}

/* ---- statistics ------------------------------------------------------------------------ */

int kvt_store_stats(kvt_store_t *s, kvt_store_op_t op, kvt_store_stats_t *out) {
    if (s == NULL || out == NULL || (unsigned)op >= KVT_STORE_OP_COUNT_) return KVT_EINVAL;
    kvt_store_stats_t st;
    pthread_mutex_lock(&s->ops_st[op].mu);
    st = s->ops_st[op].st;
    pthread_mutex_unlock(&s->ops_st[op].mu);
    st.size = sizeof(st);
    if (s->ops->usage) s->ops->usage(s->be, &st.stored_bytes, &st.stored_objects);
    return kvt__abi_out(out, &st, sizeof(st));
}

void kvt_store_emit(kvt_store_t *s, kvt_emitter_t *e) {
    for (int op = 0; s && op < KVT_STORE_OP_COUNT_; op++) {
        kvt_store_stats_t st = {.size = sizeof(st)};
        kvt_store_stats(s, (kvt_store_op_t)op, &st);
        if (st.calls == 0 && st.inflight == 0) continue;
        char name[32];
        snprintf(name, sizeof(name), "store_%s", kvt_store_op_name((kvt_store_op_t)op));
        kvt_emit_begin(e, name);
        KVT_EMIT_STATS(e, &st, KVT_STORE_STATS_FIELDS);
        kvt_emit_gauge(e, "stored_bytes", (double)st.stored_bytes, "bytes the filesystem charges for the objects this process knows of (dir)");
        kvt_emit_gauge(e, "stored_objects", (double)st.stored_objects, "objects this process knows of (dir)");
        kvt_emit_hist(e, "latency_ns", &st.latency_ns, "submit to batch completion");
        kvt_emit_end(e);
    }
}
