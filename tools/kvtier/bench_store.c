/* kvtier bench store — L3 put and get throughput and batch latency through
 * the store (include/kvtier/store.h), against a plain baseline of the same
 * bytes in the same run:
 *
 *   redis://   a pipelined hiredis SET / GET loop on one connection
 *              (authenticated as the store's are), batch
 *              by batch, values of the object's size (header + page); the
 *              SETs written out every MiB as they are appended, as the
 *              store does (hiredis moves the rest of its output buffer down
 *              after every partial write: a whole batch of 1 MiB values in
 *              one buffer runs at a third of the speed)
 *   dir:       files of the object's size under ROOT/bench-baseline, named
 *              and fanned out as the store's objects are (<h0h1>/<hex>:
 *              the store's layout, not its overhead). A put is open/write/close
 *              of a temporary file and a rename over the final name, a get
 *              open/read/close. The rename is not optional work: it is what
 *              makes a put crash-safe (a reader sees the old object, the
 *              new one or none), the semantics the store must have, so the
 *              baseline does it too; a baseline that overwrote files in
 *              place would measure something the store may not do. No
 *              fsync on either side. The folders stay after the run, as
 *              the store's do, so both trees age alike on a root used
 *              again (on ext4 a root's history moves put speed by up to 2x).
 *              Values are read into and written from page-aligned memory,
 *              a slot per page rounded up to 4 KiB, as the store's tier
 *              pages are: the plain copy at its best.
 *   redis-cluster://  no baseline (a raw cluster client is what the store
 *              is); baseline_gbps and ratio are null ("-" in the table)
 *
 * The store runs with one worker thread and one batch in flight at a time,
 * as the baseline does, so the ratio is the cost of the store's work:
 * object headers built and checked, XXH3-64 over every payload byte, keys
 * hashed, the hand-off to the worker and back. Each figure is the median of --reps runs,
 * store and baseline interleaved, which one goes first alternating from one
 * run to the next; on dir every run starts after a syncfs of the root, so
 * no run pays for the writeback of the one before it. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <hiredis/hiredis.h>

#include "cli.h"
#include "commands.h"
#include "kvtier/error.h"
#include "kvtier/testing.h"
#include "kvtier/store.h"
#include "kvtier/tier.h"
#include "util.h"

#define MAX_SIZES 8
#define MAX_REPS 32

typedef struct bres {
    uint64_t page_bytes;
    int op; /* 0 put, 1 get */
    double gbps, base_gbps, p50_ms, p99_ms;
} bres_t;

typedef struct base {
    int kind; /* 0 none, 1 redis, 2 dir */
    redisContext *rc;
    char dir[900];
    int dirfd; /* dir: the root, for syncfs */
    kvt_store_t *s; /* dir: names files as the store does */
    char why[512];  /* what the last failed batch met */
} base_t;

static int base_kind(const char *url) { return strncmp(url, "redis://", 8) == 0 ? 1 : strncmp(url, "dir:", 4) == 0 ? 2 : 0; }

static const char *base_what(int kind) {
    switch (kind) {
    case 1: return "pipelined hiredis SET/GET on one connection, values of the object's size, SETs written out every MiB";
    case 2: return "files of the object's size, named and fanned out as the store's objects: put = write a temporary file + "
                   "rename over the name (the store's crash-safe put), get = open/read/close; page-aligned memory; no fsync; syncfs before every run";
    default: return "none";
    }
}

/* %XX decoded into out (cap bytes); -1 for a bad escape or no room. */
static int unescape(const char *p, size_t len, char *out, size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < len; i++, k++) {
        unsigned v;
        if (k + 1 >= cap) return -1;
        if (p[i] != '%') out[k] = p[i];
        else if (i + 2 < len && sscanf(p + i + 1, "%2x", &v) == 1 && v) out[k] = (char)v, i += 2;
        else return -1;
    }
    out[k] = 0;
    return 0;
}

/* The baseline's connection to redis://[USER[:PASSWORD]@]HOST:PORT,
 * authenticated as the store's are (the URL's credentials, else
 * KVT_REDIS_USER and KVT_REDIS_PASSWORD). */
static redisContext *base_connect(const char *url) {
    char host[256], user[256] = "", pass[512] = "";
    const char *hp = url + 8, *at = strrchr(hp, '@');
    if (at) {
        const char *colon = memchr(hp, ':', (size_t)(at - hp));
        size_t ulen = colon ? (size_t)(colon - hp) : (size_t)(at - hp);
        if (unescape(hp, ulen, user, sizeof(user)) || (colon && unescape(colon + 1, (size_t)(at - colon - 1), pass, sizeof(pass)))) return NULL;
        hp = at + 1;
    } else if (getenv("KVT_REDIS_USER")) {
        snprintf(user, sizeof(user), "%s", getenv("KVT_REDIS_USER"));
    }
    if (!pass[0] && (user[0] || !at) && getenv("KVT_REDIS_PASSWORD")) snprintf(pass, sizeof(pass), "%s", getenv("KVT_REDIS_PASSWORD"));
    const char *colon = strrchr(hp, ':');
    uint64_t port;
    if (colon == NULL || (size_t)(colon - hp) >= sizeof(host) || cli_parse_u64(colon + 1, &port) != 0 || port == 0 || port > 65535) return NULL;
    memcpy(host, hp, (size_t)(colon - hp));
    host[colon - hp] = 0;
    struct timeval tv = {5, 0};
    redisContext *c = redisConnectWithTimeout(host, (int)port, tv);
    if (c == NULL || c->err) {
        if (c) redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    redisReply *r = !pass[0] ? NULL : user[0] ? redisCommand(c, "AUTH %s %s", user, pass) : redisCommand(c, "AUTH %s", pass);
    bool ok = !pass[0] || (r && r->type == REDIS_REPLY_STATUS);
    if (r) freeReplyObject(r);
    if (!ok) redisFree(c);
    return ok ? c : NULL;
}

static int base_open(base_t *b, const char *url, kvt_store_t *s) {
    memset(b, 0, sizeof(*b));
    b->dirfd = -1;
    b->s = s;
    if (base_kind(url) == 1) {
        if ((b->rc = base_connect(url)) == NULL) return -1;
        b->kind = 1;
    } else if (base_kind(url) == 2) {
        const char *p = url + 4, *comma = strstr(p, ",max=");
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        if (n + 20 >= sizeof(b->dir)) return -1;
        snprintf(b->dir, sizeof(b->dir), "%.*s/bench-baseline", (int)n, p);
        if (mkdir(b->dir, 0755) != 0 && errno != EEXIST) return -1;
        b->kind = 2;
        b->dirfd = open(b->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (b->dirfd < 0) return -1;
    }
    return 0;
}

static void base_close(base_t *b) {
    if (b->rc) redisFree(b->rc);
    if (b->dirfd >= 0) close(b->dirfd);
}

/* Before a timed run: the file system's dirty data written out, so that a
 * run does not pay for the writeback the previous one started. */
static void base_quiesce(const base_t *b) {
    if (b->kind == 2) syncfs(b->dirfd);
}

static kvt_hash128_t hash_of(uint64_t i) { return (kvt_hash128_t){.lo = i * 0x9e3779b97f4a7c15ull + 1, .hi = 0xbe4c5707e5ull ^ i}; }

/* dir: page i's file and its temporary name, ROOT/bench-baseline/<h0h1>/<hex>
 * (the process's own, as the store's are: one a killed run left behind
 * would refuse every later run's O_EXCL). */
static void base_path(const base_t *b, uint64_t i, char *path, size_t cap, char *tmp, size_t tcap) {
    char hex[33];
    kvt_hash128_t h = hash_of(i);
    kvt_store_key(b->s, &h, hex);
    snprintf(path, cap, "%s/%.2s/%s", b->dir, hex, hex);
    snprintf(tmp, tcap, "%s/%.2s/.tmp.%ld.%s", b->dir, hex, (long)getpid(), hex);
}

/* Says why a baseline batch failed (-1). */
static int base_failed(base_t *b, const char *what, const char *detail) {
    snprintf(b->why, sizeof(b->why), "%.320s: %.180s", what, detail);
    return -1;
}

/* One batch of the baseline: n values of len bytes at keys first..first+n,
 * from / into slot i of buf (n slots `stride` bytes apart, page-aligned as
 * the tier's pages are: a copy between page cache and memory that runs
 * misaligned costs up to a third of a read's speed at 1 MiB, and the
 * baseline is the plain read, at its best). */
static int base_batch(base_t *b, int op, uint64_t first, size_t n, uint8_t *buf, size_t stride, size_t len) {
    char key[64];
    if (b->kind == 1) {
        size_t unflushed = 0;
        for (size_t i = 0; i < n; i++) {
            int k = snprintf(key, sizeof(key), "kvtbase:%" PRIu64, first + i);
            const char *argv[3] = {op == 0 ? "SET" : "GET", key, (const char *)buf + i * stride};
            size_t lens[3] = {3, (size_t)k, len};
            if (redisAppendCommandArgv(b->rc, op == 0 ? 3 : 2, argv, lens) != REDIS_OK)
                return base_failed(b, "redis", b->rc->errstr);
            if (op == 0 && (unflushed += len) >= (1u << 20)) { /* written out as it goes, as the store does */
                int done = 0;
                while (!done)
                    if (redisBufferWrite(b->rc, &done) != REDIS_OK) return base_failed(b, "redis", b->rc->errstr);
                unflushed = 0;
            }
        }
        for (size_t i = 0; i < n; i++) {
            redisReply *r;
            if (redisGetReply(b->rc, (void **)&r) != REDIS_OK) return base_failed(b, "redis", b->rc->errstr);
            int bad = r->type == REDIS_REPLY_ERROR || (op == 1 && (r->type != REDIS_REPLY_STRING || (size_t)r->len != len));
            if (op == 1 && !bad) memcpy(buf + i * stride, r->str, len); /* the value lands in memory, as the store's does */
            if (bad) base_failed(b, "redis", r->type == REDIS_REPLY_ERROR ? r->str : "a reply of another size");
            freeReplyObject(r);
            if (bad) return -1;
        }
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        char path[1100], tmp[1100];
        base_path(b, first + i, path, sizeof(path), tmp, sizeof(tmp));
        int fd = op == 0 ? open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644) : open(path, O_RDONLY);
        if (fd < 0 && op == 0 && errno == ENOENT) { /* the fan-out folder, on first use (as the store) */
            char d[1100];
            snprintf(d, sizeof(d), "%s", path);
            *strrchr(d, '/') = 0;
            mkdir(d, 0755);
            fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
        }
        if (fd < 0) return base_failed(b, op == 0 ? tmp : path, strerror(errno));
        ssize_t k = op == 0 ? write(fd, buf + i * stride, len) : read(fd, buf + i * stride, len);
        int e = k < 0 ? errno : 0;
        if (close(fd) != 0 || k != (ssize_t)len || (op == 0 && rename(tmp, path) != 0)) {
            if (e == 0) e = errno;
            if (op == 0) unlink(tmp);
            return base_failed(b, path, k >= 0 && k != (ssize_t)len ? "short read or write" : strerror(e));
        }
    }
    return 0;
}

static void base_cleanup(base_t *b, uint64_t n) {
    char key[64], path[1100], tmp[1100];
    for (uint64_t i = 0; i < n; i++) {
        if (b->kind == 1) {
            snprintf(key, sizeof(key), "kvtbase:%" PRIu64, i);
            redisReply *r = redisCommand(b->rc, "DEL %s", key);
            if (r) freeReplyObject(r);
        } else if (b->kind == 2) {
            base_path(b, i, path, sizeof(path), tmp, sizeof(tmp));
            unlink(path); /* its fan-out folders stay, as the store's do: the next run meets the same tree on both sides */
        }
    }
}

/* One store run of `pages` pages in batches; latencies into h. Seconds, or < 0. */
static double store_run(kvt_store_t *s, int op, uint64_t pages, uint32_t batch, kvt_hist_t *h) {
    kvt_store_page_t p[1024];
    uint64_t t0 = now_ns();
    for (uint64_t first = 0; first < pages; first += batch) {
        size_t n = pages - first < batch ? (size_t)(pages - first) : batch;
        for (size_t i = 0; i < n; i++) p[i] = (kvt_store_page_t){.hash = hash_of(first + i), .page = (uint32_t)i};
        int rc = op == 0 ? kvt_store_put(s, p, n, 0, NULL) : kvt_store_get(s, p, n, 0, NULL);
        kvt_store_done_t d;
        if (rc != KVT_OK || kvt_store_poll(s, &d, 1, 60ull * 1000000000ull) != 1 || d.count != n) return -1;
        kvt_hist_record(h, d.latency_ns);
    }
    return (double)(now_ns() - t0) / 1e9;
}

static double base_run(base_t *b, int op, uint64_t pages, uint32_t batch, uint8_t *buf, size_t stride, size_t len) {
    uint64_t t0 = now_ns();
    for (uint64_t first = 0; first < pages; first += batch) {
        size_t n = pages - first < batch ? (size_t)(pages - first) : batch;
        if (base_batch(b, op, first, n, buf, stride, len) != 0) return -1;
    }
    return (double)(now_ns() - t0) / 1e9;
}

static int run_size(const char *url, uint64_t pb, uint64_t total_mb, uint32_t batch, uint64_t reps, bres_t out[2], char *err, size_t ecap) {
    uint64_t pages = total_mb * 1048576ull / pb; /* >= 1: the options' check */
    kvt_tier_config_t tc = {.size = sizeof(tc), .kind = KVT_TIER_HOST, .geom = {batch, 1, pb, KVT_LAYOUT_PAGE_FIRST}};
    kvt_tier_t *t = NULL;
    kvt_store_t *s = NULL;
    base_t b = {.kind = 0, .dirfd = -1};
    uint8_t *buf = NULL;
    int rc = kvt_tier_create(&t, &tc);
    if (rc != KVT_OK) return snprintf(err, ecap, "tier: %s", kvt_strerror(rc)), -1;
    kvt_store_config_t sc;
    kvt_store_config_default(&sc);
    sc.tier = t;
    sc.model = "kvtier-bench";
    sc.page_tokens = 16;
    sc.threads = 1;
    sc.timeout_ms = 10000;
    rc = kvt_store_open(&s, url, &sc);
    if (rc != KVT_OK) {
        snprintf(err, ecap, "%s", kvt_store_last_error(NULL));
        kvt_tier_destroy(t);
        return rc == KVT_EINVAL ? -2 : -1; /* a malformed URL is a bad flag */
    }
    size_t ob = (size_t)kvt_store_object_bytes(s), stride = (ob + 4095) & ~(size_t)4095;
    buf = aligned_alloc(4096, stride * batch);
    void *scratch = malloc(pb);
    int ret = buf && scratch && base_open(&b, url, s) == 0 ? 0 : -1;
    char shown[1024];
    if (ret) snprintf(err, ecap, "baseline: cannot reach %s", kvt_store_url_redact(url, shown, sizeof(shown)));
    for (uint32_t i = 0; ret == 0 && i < batch; i++) kvt_tier_pattern_fill(t, i, hash_of(i).lo, hash_of(i).hi, scratch);
    if (buf) memset(buf, 0x5a, stride * batch);
    double g[2][MAX_REPS], bg[2][MAX_REPS];
    kvt_hist_t h[2];
    kvt_hist_init(&h[0]);
    kvt_hist_init(&h[1]);
    double bytes = (double)pages * (double)pb;
    for (uint64_t r = 0; ret == 0 && r < reps; r++)
        for (int op = 0; op < 2 && ret == 0; op++) {
            double ts = 0, tb = 0;
            for (int k = 0; k < 2; k++) { /* store first on even runs, baseline first on odd ones */
                base_quiesce(&b);
                if ((k == 0) == (r % 2 == 0)) ts = store_run(s, op, pages, batch, &h[op]);
                else if (b.kind) tb = base_run(&b, op, pages, batch, buf, stride, ob);
            }
            if (ts <= 0 || tb < 0) {
                snprintf(err, ecap, "%s %s failed: %s", op ? "get" : "put", ts <= 0 ? "through the store" : "baseline",
                         ts <= 0 ? kvt_store_last_error(s) : b.why);
                ret = -1;
            }
            g[op][r] = bytes / 1e9 / ts;
            bg[op][r] = tb > 0 ? bytes / 1e9 / tb : 0;
        }
    /* what the last get batch brought back is what was put */
    uint64_t last_first = (pages - 1) / batch * batch;
    for (uint64_t i = last_first; ret == 0 && i < pages; i++)
        if (!kvt_tier_pattern_check(t, i - last_first, hash_of(i - last_first).lo, hash_of(i - last_first).hi, scratch))
            ret = -1, snprintf(err, ecap, "page %" PRIu64 " came back different", i);
    for (int op = 0; ret == 0 && op < 2; op++) {
        out[op] = (bres_t){.page_bytes = pb, .op = op, .gbps = median_of(g[op], reps), .base_gbps = median_of(bg[op], reps),
                           .p50_ms = (double)kvt_hist_percentile(&h[op], 0.5) / 1e6, .p99_ms = (double)kvt_hist_percentile(&h[op], 0.99) / 1e6};
    }
    /* leave nothing behind */
    kvt_store_page_t p[1024];
    for (uint64_t first = 0; first < pages; first += batch) {
        size_t n = pages - first < batch ? (size_t)(pages - first) : batch;
        for (size_t i = 0; i < n; i++) p[i] = (kvt_store_page_t){.hash = hash_of(first + i), .page = 0};
        kvt_store_done_t d;
        if (kvt_store_remove(s, p, n, 0, NULL) == KVT_OK) kvt_store_poll(s, &d, 1, 60ull * 1000000000ull);
    }
    base_cleanup(&b, pages);
    base_close(&b);
    kvt_store_close(s);
    kvt_tier_destroy(t);
    free(buf);
    free(scratch);
    return ret;
}

int cmd_bench_store(int argc, char **argv) {
    const char *url = NULL, *sizes_s = "65536,1048576";
    uint64_t total_mb = 64, batch = 32, reps = 3;
    bool json = false;
    const cli_opt_t table[] = {
        {"l3", OPT_TEXT, &url, 0, 0, 0, 0, NULL, NULL, 0, "the store: dir:PATH[,max=SIZE] | redis://[USER:PASSWORD@]HOST:PORT | redis-cluster://[USER:PASSWORD@]H:P[,H:P...]"},
        {"page-bytes", OPT_TEXT, &sizes_s, 0, 0, 0, 0, NULL, NULL, 0, "page sizes, comma-separated (bytes)"},
        {"total-mb", OPT_U64, &total_mb, 1, 1 << 14, 0, 0, NULL, NULL, 0, "MiB per operation per run"},
        {"batch", OPT_U64, &batch, 1, 1024, 0, 0, NULL, NULL, 0, "pages per batch call"},
        {"reps", OPT_U64, &reps, 1, MAX_REPS, 0, 0, NULL, NULL, 0, "runs of each (the median is reported)"},
        {"json", OPT_FLAG, &json, 0, 0, 0, 0, NULL, NULL, 0, "print one JSON object"},
        {NULL, 0, NULL, 0, 0, 0, 0, NULL, NULL, 0, NULL},
    };
    cli_t c;
    cli_init(&c, "kvtier bench store", argc, argv);
    const char *pos;
    int prc = cli_parse_table(&c, table, "usage: kvtier bench store --l3 URL [--page-bytes B,...] [--total-mb M] [--batch N] [--json]\n", &pos);
    if (prc) return prc > 0 ? 0 : 2;
    if (pos) return cli_unknown(&c), 2;
    c.flag = "--l3";
    if (url == NULL) return cli_usage(&c, "required (dir:PATH[,max=SIZE] | redis://HOST:PORT | redis-cluster://H:P[,H:P...])");
    uint64_t sizes[MAX_SIZES];
    size_t ns = 0;
    c.flag = "--page-bytes";
    for (const char *p = sizes_s; *p;) {
        char tok[32];
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof(tok) || ns == MAX_SIZES) return cli_usage(&c, "'%s': up to %d sizes, comma-separated", sizes_s, MAX_SIZES);
        memcpy(tok, p, len);
        tok[len] = 0;
        if (cli_parse_u64(tok, &sizes[ns]) != 0 || sizes[ns] < 64 || sizes[ns] > (256u << 20))
            return cli_usage(&c, "'%s' is not a page size in 64..268435456", tok);
        if (sizes[ns] > total_mb << 20)
            return cli_usage(&c, "a page of %" PRIu64 " bytes is more than --total-mb %" PRIu64 " MiB: no whole page to move", sizes[ns],
                             total_mb);
        ns++;
        p += len + (p[len] == ',');
        if (p[-1] == ',' && *p == '\0') return cli_usage(&c, "'%s' ends with ','", sizes_s);
    }
    if (cli_parse_only) return 0;
    bres_t res[2 * MAX_SIZES];
    char err[600] = "";
    for (size_t i = 0; i < ns; i++) {
        int rc = run_size(url, sizes[i], total_mb, (uint32_t)batch, reps, &res[2 * i], err, sizeof(err));
        if (rc != 0) {
            fprintf(stderr, "kvtier bench store: %s%s\n", rc == -2 ? "--l3: " : "", err);
            return rc == -2 ? 2 : 1;
        }
    }
    char shown[1024]; /* the URL as printed: never its password */
    kvt_store_url_redact(url, shown, sizeof(shown));
    if (json) {
        cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "results");
        cJSON_AddStringToObject(o, "l3", shown);
        cJSON_AddStringToObject(o, "baseline", base_what(base_kind(url)));
        cJSON_AddNumberToObject(o, "total_mb", (double)total_mb);
        cJSON_AddNumberToObject(o, "batch", (double)batch);
        cJSON_AddNumberToObject(o, "reps", (double)reps);
        cJSON_AddNumberToObject(o, "cpus", (double)sysconf(_SC_NPROCESSORS_ONLN));
        for (size_t i = 0; i < 2 * ns; i++) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddNumberToObject(x, "page_bytes", (double)res[i].page_bytes);
            cJSON_AddStringToObject(x, "op", res[i].op ? "get" : "put");
            cJSON_AddNumberToObject(x, "gbps", res[i].gbps);
            if (res[i].base_gbps > 0) {
                cJSON_AddNumberToObject(x, "baseline_gbps", res[i].base_gbps);
                cJSON_AddNumberToObject(x, "ratio", res[i].gbps / res[i].base_gbps);
            } else { /* no baseline (redis-cluster): nothing measured, not 0 */
                cJSON_AddNullToObject(x, "baseline_gbps");
                cJSON_AddNullToObject(x, "ratio");
            }
            cJSON_AddNumberToObject(x, "batch_p50_ms", res[i].p50_ms);
            cJSON_AddNumberToObject(x, "batch_p99_ms", res[i].p99_ms);
            cJSON_AddItemToArray(arr, x);
        }
        cli_print_json(o);
    } else {
        printf("kvtier bench store: %s, %" PRIu64 " MiB per op, batches of %" PRIu64 ", median of %" PRIu64 "\n", shown, total_mb, batch, reps);
        printf("baseline: %s\n", base_what(base_kind(url)));
        printf("%12s %4s %10s %14s %7s %12s %12s\n", "page_bytes", "op", "GB/s", "baseline GB/s", "ratio", "batch p50 ms", "batch p99 ms");
        for (size_t i = 0; i < 2 * ns; i++) {
            char base[16] = "-", ratio[16] = "-";
            if (res[i].base_gbps > 0) {
                snprintf(base, sizeof(base), "%.3f", res[i].base_gbps);
                snprintf(ratio, sizeof(ratio), "%.3f", res[i].gbps / res[i].base_gbps);
            }
            printf("%12" PRIu64 " %4s %10.3f %14s %7s %12.3f %12.3f\n", res[i].page_bytes, res[i].op ? "get" : "put", res[i].gbps,
                   base, ratio, res[i].p50_ms, res[i].p99_ms);
        }
    }
    return 0;
}
