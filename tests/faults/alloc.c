/* Fault campaign: an allocation failure at every allocation site of a replay
 * scenario (docs/reliability.md, "Fault campaigns").
 *
 *   faults-alloc [--trace FILE] [--requests N] [--per-site K] [--seed S] [--verbose]
 *
 * The scenario is a replay of the first N requests of a Mooncake trace (the
 * shipped one by default) through the whole stack an engine runs: an arena
 * L1 and a checksummed host L2 holding real bytes, the transfer engine with
 * two workers, a dir store as L3 (a fresh directory per run), the cache with
 * prefetches (wait_complete), admissions, commits, requests held across
 * others, releases, polls, restore_room and a final sync. New pages get the
 * content model's bytes (kvt_tier_pattern_fill of their page hash); every
 * page served (an L1 hit, a load from L2 or L3) is checked against it.
 *
 * Pass 1 runs it with no fault and records every allocation site (the
 * return address of the kvt__malloc / calloc / realloc / pooled call, as the
 * library's test hook reports it; named with dladdr) and how often each is
 * reached. Then, for every site, one run per chosen occurrence (the first,
 * the last, and K-2 more drawn from the seed) fails exactly that allocation.
 * In each run:
 *
 *   - a public call that fails returns KVT_ENOMEM, and only when the
 *     injected failure fired in it; then nothing changed (the cache's
 *     decision digest, its counters, the tree's shape; an admission or
 *     prefetch may keep the evictions it made, as cache.h says, and nothing
 *     else), and the same call made again succeeds;
 *   - kvt_cache_check passes after every call; every served page holds its
 *     content; a failure the library absorbed (a copy or a store batch that
 *     failed, an admission with fewer pages) is counted, not an error;
 *   - a failure while building the stack is refused with KVT_ENOMEM and
 *     leaves nothing behind;
 *   - at the end, after everything is destroyed, no byte is live: neither by
 *     kvtier's own count (kvt_mem_stats) nor by this program's allocator
 *     (kvt_set_allocator), which counts every block it hands out.
 *
 * Exit 0 when no run broke a rule; the summary line says how many sites,
 * runs, injected failures and refusals there were. */

#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/mem-int.h"
#include "kvtier/testing.h"
#include "kvtier/cache.h"
#include "kvtier/error.h"
#include "kvtier/mem.h"
#include "kvtier/radix.h"
#include "kvtier/rng.h"
#include "kvtier/store.h"
#include "kvtier/tier.h"
#include "kvtier/xfer.h"
#include "kvtier/trace.h"

#define PT 256        /* tokens per page */
#define MAX_BLOCKS 24 /* a request's first 24 blocks of 512 tokens: 48 pages */
#define MAX_PAGES (MAX_BLOCKS * KVT_TRACE_BLOCK_TOKENS / PT)
#define L1_PAGES 128
#define L2_PAGES 512
#define LAYERS 2
#define LAYER_BYTES 64
#define HELD 2
#define MAX_SITES 4096

/* ---- an allocator that counts what it hands out (the independent leak check) */

static _Atomic int64_t g_blocks, g_bytes;

static void *count_malloc(void *ctx, size_t n) {
    (void)ctx;
    void *p = malloc(n);
    if (p) atomic_fetch_add(&g_blocks, 1), atomic_fetch_add(&g_bytes, (int64_t)n);
    return p;
}
static void *count_realloc(void *ctx, void *p, size_t o, size_t n) {
    (void)ctx;
    void *q = realloc(p, n);
    if (q) atomic_fetch_add(&g_bytes, (int64_t)n - (int64_t)o);
    return q;
}
static void count_free(void *ctx, void *p, size_t n) {
    (void)ctx;
    atomic_fetch_sub(&g_blocks, 1);
    atomic_fetch_sub(&g_bytes, (int64_t)n);
    free(p);
}

/* ---- sites: the library's hook records them (pass 1) or fails one (later) */

typedef struct site {
    const void *addr;
    uint64_t hits;               /* attempts in the fault-free run */
    uint64_t runs, fired, refused, absorbed, setup, unreached;
} site_t;

static struct {
    pthread_mutex_t mu;
    site_t site[MAX_SITES];
    int nsites;
    /* the armed fault: fail attempt number `occ` at `addr` */
    const void *addr;
    uint64_t occ, seen;
    bool recording;
} H = {.mu = PTHREAD_MUTEX_INITIALIZER};

static site_t *site_of(const void *addr) {
    for (int i = 0; i < H.nsites; i++)
        if (H.site[i].addr == addr) return &H.site[i];
    if (H.nsites == MAX_SITES) return NULL;
    H.site[H.nsites] = (site_t){.addr = addr};
    return &H.site[H.nsites++];
}

static int hook(void *arg, const void *site) {
    (void)arg;
    int fail = 0;
    pthread_mutex_lock(&H.mu);
    if (H.recording) {
        site_t *s = site_of(site);
        if (s) s->hits++;
    } else if (site == H.addr && ++H.seen == H.occ) {
        fail = 1;
    }
    pthread_mutex_unlock(&H.mu);
    return fail;
}

/* The function (and line) of a site: dladdr for exported functions,
 * addr2line (binutils) for static ones. */
static const char *site_name(const void *addr, char *buf, size_t cap) {
    Dl_info di;
    if (!dladdr(addr, &di)) {
        snprintf(buf, cap, "%p", addr);
        return buf;
    }
    char cmd[640], fn[256] = "", line[256] = "";
    uintptr_t off = (uintptr_t)addr - (uintptr_t)di.dli_fbase - 1; /* the call, not the return */
    snprintf(cmd, sizeof(cmd), "addr2line -f -e '%s' 0x%" PRIxPTR " 2>/dev/null", di.dli_fname, off);
    FILE *p = popen(cmd, "r");
    if (p) {
        if (fgets(fn, sizeof(fn), p) && fgets(line, sizeof(line), p)) {
            fn[strcspn(fn, "\n")] = 0;
            line[strcspn(line, "\n")] = 0;
        }
        pclose(p);
    }
    const char *base = strrchr(line, '/');
    if (fn[0] && fn[0] != '?')
        snprintf(buf, cap, "%s (%s)", fn, base ? base + 1 : line);
    else if (di.dli_sname)
        snprintf(buf, cap, "%s+0x%tx", di.dli_sname, (const char *)addr - (const char *)di.dli_saddr);
    else
        snprintf(buf, cap, "%p", addr);
    return buf;
}

/* ---- one run of the scenario */

typedef struct rig {
    kvt_tier_t *tier[2];
    kvt_xfer_t *xf;
    kvt_store_t *store;
    kvt_cache_t *c;
    char dir[64];
} rig_t;

typedef struct outcome {
    int fired;     /* the armed failure happened */
    int refused;   /* a public call returned KVT_ENOMEM for it (checked, retried) */
    int setup;     /* building the stack failed for it (checked: nothing left) */
    int violations;
    uint64_t hits, loads, l3_hits, served_checked;
} outcome_t;

static const kvt_trace_t *g_trace;
static uint64_t g_requests = 200;
static int g_verbose;
static char g_ctx[160]; /* the run, for messages */

static void violation(outcome_t *o, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "faults-alloc: %s: ", g_ctx);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    o->violations++;
}

static _Atomic uint64_t g_store_msgs; /* the store's messages (failed batches), counted */

static void store_log(void *arg, const char *msg) {
    (void)arg;
    if (g_verbose) fprintf(stderr, "  store: %s\n", msg);
    atomic_fetch_add(&g_store_msgs, 1);
}

static void stack_destroy(rig_t *s) {
    kvt_cache_destroy(s->c);
    kvt_store_close(s->store);
    kvt_xfer_destroy(s->xf);
    kvt_tier_destroy(s->tier[0]);
    kvt_tier_destroy(s->tier[1]);
    if (s->dir[0]) {
        char cmd[96];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", s->dir);
        if (system(cmd) != 0) fprintf(stderr, "faults-alloc: could not remove %s\n", s->dir);
    }
    memset(s, 0, sizeof(*s));
}

/* Builds the stack; KVT_OK, or the first failure's code with nothing left. */
static int stack_create(rig_t *s) {
    memset(s, 0, sizeof(*s));
    /* a tmpfs where there is one: the store's files cost no disk */
    snprintf(s->dir, sizeof(s->dir), "%s/kvtier-faults-XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    if (mkdtemp(s->dir) == NULL) {
        fprintf(stderr, "faults-alloc: mkdtemp: %s\n", strerror(errno));
        exit(2);
    }
    kvt_tier_config_t tc = {.size = sizeof(tc), .kind = KVT_TIER_ARENA, .name = "l1",
                            .geom = {L1_PAGES, LAYERS, LAYER_BYTES, KVT_LAYOUT_PAGE_FIRST}};
    int rc = kvt_tier_create(&s->tier[0], &tc);
    if (rc == KVT_OK) {
        tc = (kvt_tier_config_t){.size = sizeof(tc), .kind = KVT_TIER_HOST, .name = "l2", .flags = KVT_TIER_CHECKSUM,
                                 .geom = {L2_PAGES, LAYERS, LAYER_BYTES, KVT_LAYOUT_PAGE_FIRST}};
        rc = kvt_tier_create(&s->tier[1], &tc);
    }
    if (rc == KVT_OK) {
        kvt_xfer_config_t xc;
        kvt_xfer_config_default(&xc);
        xc.threads = 2;
        rc = kvt_xfer_create(&s->xf, &xc, s->tier, 2);
    }
    if (rc == KVT_OK) {
        kvt_store_config_t sc;
        kvt_store_config_default(&sc);
        sc.tier = s->tier[1];
        sc.model = "faults";
        sc.page_tokens = PT;
        sc.log = store_log;
        char url[96];
        snprintf(url, sizeof(url), "dir:%s", s->dir);
        rc = kvt_store_open(&s->store, url, &sc);
    }
    if (rc == KVT_OK) {
        kvt_cache_config_t cc;
        kvt_cache_config_default(&cc);
        cc.page_tokens = PT;
        cc.l1_pages = L1_PAGES;
        cc.l2_pages = L2_PAGES;
        cc.prefetch_policy = KVT_PREFETCH_WAIT_COMPLETE;
        cc.l3_write_policy = KVT_WRITE_THROUGH;
        cc.decision_digest = true; /* a failed call must leave it as it was */
        rc = kvt_cache_create(&s->c, &cc);
    }
    if (rc == KVT_OK) rc = kvt_cache_attach(s->c, s->xf, s->tier[0], 0, s->tier[1], 1);
    if (rc == KVT_OK) rc = kvt_cache_attach_store(s->c, s->store);
    if (rc != KVT_OK) stack_destroy(s);
    return rc;
}

/* What "nothing changed" compares. */
typedef struct snap {
    uint64_t digest, prefetches;
    kvt_cache_stats_t cs;
    kvt_radix_stats_t rs;
} snap_t;

static void take(kvt_cache_t *c, snap_t *s) {
    s->digest = kvt_cache_digest(c);
    s->prefetches = kvt_cache_prefetches(c);
    s->cs = (kvt_cache_stats_t){.size = sizeof(s->cs)};
    kvt_cache_stats(c, &s->cs);
    s->rs = (kvt_radix_stats_t){.size = sizeof(s->rs)};
    kvt_radix_stats(kvt_cache_tree(c), &s->rs);
}

/* After a refused call: nothing changed, but (evicting) the evictions. */
static void unchanged(outcome_t *o, const char *call, const snap_t *a, const snap_t *b, bool evicting) {
    const kvt_cache_stats_t *x = &a->cs, *y = &b->cs;
    bool evicted = y->l1_evicted_pages != x->l1_evicted_pages || y->l2_evicted_pages != x->l2_evicted_pages ||
                   y->dropped_pages != x->dropped_pages || y->shadows_reclaimed != x->shadows_reclaimed ||
                   y->forced_backups != x->forced_backups;
    if (evicted && !evicting) violation(o, "%s failed and evicted pages", call);
#define SAME(f)                                                                                              \
    if (x->f != y->f) violation(o, "%s failed but changed " #f ": %" PRIu64 " -> %" PRIu64, call, x->f, y->f)
    SAME(requests);
    SAME(tokens);
    SAME(l1_hit_tokens);
    SAME(l2_hit_tokens);
    SAME(l3_hit_tokens);
    SAME(loads);
    SAME(prefetches);
    SAME(l3_get_calls);
    SAME(l3_puts);
#undef SAME
    if (a->prefetches != b->prefetches) violation(o, "%s failed but changed the prefetches in progress", call);
    if (a->rs.locked_nodes != b->rs.locked_nodes) violation(o, "%s failed but changed the locked nodes", call);
    if (b->rs.pages > a->rs.pages) violation(o, "%s failed but added pages to the tree", call);
    if (!evicted && (a->digest != b->digest || a->rs.pages != b->rs.pages || a->rs.nodes != b->rs.nodes))
        violation(o, "%s failed but changed the cache's decisions (digest, pages or nodes)", call);
}

static void check(outcome_t *o, rig_t *s, const char *after) {
    const char *why = NULL;
    if (kvt_cache_check(s->c, &why) != KVT_OK) violation(o, "check after %s: %s", after, why);
}

/* Runs call (an expression assigning rc) once; a failure must be the
 * injected one, changing nothing; then once more, which must succeed. */
#define CALL(name, evicting, expr)                                                                           \
    do {                                                                                                     \
        snap_t before_, after_;                                                                              \
        take(s.c, &before_);                                                                                 \
        int fired_ = kvt__mem_fail_fired();                                                                  \
        rc = (expr);                                                                                         \
        if (rc != KVT_OK) {                                                                                  \
            if (rc != KVT_ENOMEM || kvt__mem_fail_fired() == fired_)                                         \
                violation(&o, "%s: %s without an injected failure", name, kvt_err_name(rc));                 \
            o.refused++;                                                                                     \
            take(s.c, &after_);                                                                              \
            unchanged(&o, name, &before_, &after_, evicting);                                                \
            check(&o, &s, name);                                                                             \
            rc = (expr);                                                                                     \
            if (rc != KVT_OK) violation(&o, "%s again: %s", name, kvt_err_name(rc));               \
        }                                                                                                    \
        check(&o, &s, name);                                                                                 \
    } while (0)

static uint32_t request_tokens(uint64_t i, int32_t *tok) {
    const kvt_trace_req_t *r = &g_trace->req[i % g_trace->n];
    uint32_t nb = r->nblocks < MAX_BLOCKS ? r->nblocks : MAX_BLOCKS;
    for (uint32_t b = 0; b < nb; b++) kvt_trace_block_tokens(r->hash_ids[b], tok + (size_t)b * KVT_TRACE_BLOCK_TOKENS);
    return nb * KVT_TRACE_BLOCK_TOKENS;
}

typedef struct held {
    kvt_cache_req_t req;
    uint32_t ids[MAX_PAGES];
    kvt_hash128_t hash[MAX_PAGES];
} held_t;

/* The held request's pages hold their content (locked pages stay put). */
static void check_pages(outcome_t *o, rig_t *s, const held_t *h, uint64_t from, uint64_t to, uint8_t *buf) {
    for (uint64_t j = from; j < to; j++) {
        o->served_checked++;
        if (!kvt_tier_pattern_check(s->tier[0], h->ids[j], h->hash[j].lo, h->hash[j].hi, buf))
            violation(o, "page %" PRIu64 " of a request (L1 page %u) does not hold its content", j, h->ids[j]);
    }
}

static int poll_rc(kvt_cache_t *c) {
    int n = kvt_cache_poll(c);
    return n < 0 ? n : KVT_OK;
}

static void scenario(outcome_t *out) {
    outcome_t o = {0};
    rig_t s;
    int rc = stack_create(&s);
    if (rc != KVT_OK) {
        if (rc != KVT_ENOMEM || !kvt__mem_fail_fired())
            violation(&o, "building the stack: %s without an injected failure", kvt_err_name(rc));
        o.setup = 1;
        o.fired = kvt__mem_fail_fired();
        *out = o;
        return;
    }
    static int32_t tok[MAX_BLOCKS * KVT_TRACE_BLOCK_TOKENS];
    static held_t held[HELD];
    static uint8_t buf[LAYER_BYTES];
    int nheld = 0;
    for (uint64_t i = 0; i < g_requests; i++) {
        uint32_t n = request_tokens(i, tok);
        uint64_t id = 0;
        CALL("kvt_cache_prefetch", true, kvt_cache_prefetch(s.c, 0, tok, n, &id));
        if (nheld == HELD) {
            CALL("kvt_cache_release", false, kvt_cache_release(s.c, &held[0].req));
            memmove(&held[0], &held[1], sizeof(held_t) * (HELD - 1));
            nheld--;
        }
        held_t *h = &held[nheld];
        CALL("kvt_cache_admit_prefetched", true,
             kvt_cache_admit_prefetched(s.c, id, 0, tok, n, 0, h->ids, &h->req));
        if (rc != KVT_OK) {
            if (id) kvt_cache_prefetch_cancel(s.c, id);
            continue;
        }
        nheld++;
        kvt_page_hash_chain(0, tok, h->req.pages, PT, h->hash);
        uint64_t old = h->req.pages - h->req.new_pages;
        check_pages(&o, &s, h, 0, old, buf);
        for (uint64_t j = old; j < h->req.pages; j++)
            kvt_tier_pattern_fill(s.tier[0], h->ids[j], h->hash[j].lo, h->hash[j].hi, buf);
        o.hits += h->req.l1_hit_pages;
        o.loads += h->req.l2_hit_pages;
        o.l3_hits += h->req.l3_hit_pages;
        CALL("kvt_cache_commit", false, kvt_cache_commit(s.c, &h->req));
        for (int k = 0; k < nheld; k++) check_pages(&o, &s, &held[k], 0, held[k].req.pages, buf);
        CALL("kvt_cache_poll", false, poll_rc(s.c));
        if (i % 8 == 7) CALL("kvt_cache_restore_room", false, (kvt_cache_restore_room(s.c), KVT_OK));
    }
    for (int k = 0; k < nheld; k++) CALL("kvt_cache_release", false, kvt_cache_release(s.c, &held[k].req));
    CALL("kvt_cache_sync", false, kvt_cache_sync(s.c));
    o.fired = kvt__mem_fail_fired();
    stack_destroy(&s);
    *out = o;
}

/* One run with the fault armed at (addr, occ); addr NULL: none. */
static void run_one(const void *addr, uint64_t occ, outcome_t *o) {
    pthread_mutex_lock(&H.mu);
    H.addr = addr;
    H.occ = occ;
    H.seen = 0;
    pthread_mutex_unlock(&H.mu);
    kvt__mem_fail_nth(0); /* resets the fired flag */
    scenario(o);
    kvt_mem_stats_t ms = {.size = sizeof(ms)};
    kvt_mem_stats(&ms);
    if (ms.live_bytes != 0) violation(o, "%" PRId64 " bytes still live (kvt_mem_stats) after everything was destroyed", ms.live_bytes);
    if (atomic_load(&g_blocks) != 0 || atomic_load(&g_bytes) != 0)
        violation(o, "the allocator still has %" PRId64 " blocks (%" PRId64 " bytes) out", atomic_load(&g_blocks),
                  atomic_load(&g_bytes));
}

/* The trace, in this program's own memory: kvtier's must hold nothing live
 * between runs (its count is checked after each), and the allocator is set
 * only while it holds nothing. */
static int load_trace(const char *path, kvt_trace_t *out) {
    kvt_trace_t t;
    char err[256];
    if (kvt_trace_load(path, &t, err, sizeof(err)) != KVT_OK) {
        fprintf(stderr, "faults-alloc: %s\n", err);
        return -1;
    }
    *out = t;
    out->req = malloc(t.n * sizeof(kvt_trace_req_t));
    for (size_t i = 0; out->req && i < t.n; i++) {
        out->req[i] = t.req[i];
        out->req[i].hash_ids = malloc(t.req[i].nblocks * sizeof(uint32_t));
        if (out->req[i].hash_ids == NULL) abort();
        memcpy(out->req[i].hash_ids, t.req[i].hash_ids, t.req[i].nblocks * sizeof(uint32_t));
    }
    if (out->req == NULL) abort();
    out->cap = t.n;
    kvt_trace_free(&t);
    return 0;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void usage(FILE *f) {
    fprintf(f, "usage: faults-alloc [--trace FILE] [--requests N] [--per-site K] [--seed S] [--verbose]\n"
               "  --trace     Mooncake JSONL trace (default: the shipped data/mooncake_synthetic_trace.jsonl)\n"
               "  --requests  requests of the scenario, 1..100000 (default 200)\n"
               "  --per-site  occurrences of each site to fail, 1..1000 (default 3: first, last, one drawn)\n"
               "  --seed      draws the other occurrences (default 1)\n");
}

int main(int argc, char **argv) {
    const char *path = KVT_SOURCE_DIR "/data/mooncake_synthetic_trace.jsonl";
    uint64_t per_site = 3, seed = 1;
    static const struct option lo[] = {{"trace", 1, 0, 't'}, {"requests", 1, 0, 'r'}, {"per-site", 1, 0, 'k'},
                                       {"seed", 1, 0, 's'},  {"verbose", 0, 0, 'v'},  {"help", 0, 0, 'h'},
                                       {0, 0, 0, 0}};
    for (int ch; (ch = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        char *end = NULL;
        unsigned long long v = optarg ? strtoull(optarg, &end, 10) : 0;
        bool bad = optarg && (*optarg == '\0' || *end != '\0');
        switch (ch) {
        case 't': path = optarg; break;
        case 'r':
            if (bad || v < 1 || v > 100000) { fprintf(stderr, "faults-alloc: --requests: 1..100000\n"); return 2; }
            g_requests = v;
            break;
        case 'k':
            if (bad || v < 1 || v > 1000) { fprintf(stderr, "faults-alloc: --per-site: 1..1000\n"); return 2; }
            per_site = v;
            break;
        case 's':
            if (bad) { fprintf(stderr, "faults-alloc: --seed: a number\n"); return 2; }
            seed = v;
            break;
        case 'v': g_verbose = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind != argc) { usage(stderr); return 2; }
    static kvt_trace_t t;
    if (load_trace(path, &t) != 0) return 2;
    g_trace = &t;
    kvt_allocator_t a = {sizeof(a), count_malloc, count_realloc, count_free, NULL};
    if (kvt_set_allocator(&a) != KVT_OK) return 2;
    kvt__mem_set_hook(hook, NULL);

    /* pass 1: the sites, fault-free (and the scenario itself must pass) */
    outcome_t base;
    snprintf(g_ctx, sizeof(g_ctx), "fault-free run");
    H.recording = true;
    run_one(NULL, 0, &base);
    H.recording = false;
    if (base.violations) return 1;
    uint64_t attempts = 0;
    for (int i = 0; i < H.nsites; i++) attempts += H.site[i].hits;
    printf("faults-alloc: scenario: %" PRIu64 " requests of %s; fault-free: %" PRIu64 " L1 hit pages, %" PRIu64
           " loaded from L2, %" PRIu64 " from L3, %" PRIu64 " served pages checked; %" PRIu64
           " allocations at %d sites\n",
           g_requests, path, base.hits, base.loads, base.l3_hits, base.served_checked, attempts, H.nsites);

    kvt_rng_t rng;
    kvt_rng_seed(&rng, seed);
    uint64_t runs = 0, fired = 0, refused = 0, setup = 0, absorbed = 0, violations = 0;
    int nsites = H.nsites;
    for (int i = 0; i < nsites; i++) {
        site_t *st = &H.site[i];
        uint64_t occ[1000], k = 0;
        occ[k++] = 1;
        if (st->hits > 1 && per_site > 1) occ[k++] = st->hits;
        while (k < per_site && k < st->hits) {
            uint64_t v = 2 + kvt_rng_next(&rng) % (st->hits > 2 ? st->hits - 2 : 1);
            bool dup = false;
            for (uint64_t j = 0; j < k; j++) dup |= occ[j] == v;
            if (!dup) occ[k++] = v;
            else if (st->hits <= per_site) break;
        }
        qsort(occ, k, sizeof(occ[0]), cmp_u64);
        char name[128];
        site_name(st->addr, name, sizeof(name));
        for (uint64_t j = 0; j < k; j++) {
            snprintf(g_ctx, sizeof(g_ctx), "site %s, occurrence %" PRIu64 " of %" PRIu64, name, occ[j], st->hits);
            outcome_t o;
            run_one(st->addr, occ[j], &o);
            runs++;
            st->runs++;
            st->fired += o.fired != 0;
            st->refused += o.refused;
            st->setup += o.setup;
            st->absorbed += o.fired && !o.refused && !o.setup;
            st->unreached += !o.fired;
            fired += o.fired != 0;
            absorbed += o.fired && !o.refused && !o.setup;
            refused += (uint64_t)o.refused;
            setup += (uint64_t)o.setup;
            violations += (uint64_t)o.violations;
        }
        if (g_verbose)
            printf("  %-58s hits %7" PRIu64 "  runs %3" PRIu64 "  fired %3" PRIu64 "  refused %3" PRIu64
                   "  absorbed %3" PRIu64 "  setup %3" PRIu64 "  unreached %3" PRIu64 "\n",
                   name, st->hits, st->runs, st->fired, st->refused, st->absorbed, st->setup, st->unreached);
    }
    kvt__mem_set_hook(NULL, NULL);
    printf("faults-alloc: %d sites, %" PRIu64 " runs, %" PRIu64 " injected failures: %" PRIu64
           " refused by a public call (nothing changed, the call made again succeeded), %" PRIu64
           " refused while building the stack (nothing left), %" PRIu64 " absorbed (%" PRIu64
           " store messages); %" PRIu64 " violations\n",
           nsites, runs, fired, refused, setup, absorbed, atomic_load(&g_store_msgs), violations);
    for (size_t i = 0; i < t.n; i++) free(t.req[i].hash_ids);
    free(t.req);
    return violations ? 1 : 0;
}
