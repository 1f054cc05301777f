/* kvtier bench alloc — the extent allocator against a scan baseline.
 *
 * 1. Build a fragmented pool with a fixed seed: `random` frees single pages
 *    at random from a full pool, `mixed` frees holes of random lengths, `churn`
 *    runs random reserves and frees of random sizes; each stops at the target
 *    free fraction. A byte map (1 = reserved) mirrors the pool.
 * 2. For each size n: `ops` steps, each freeing the reservation made `window`
 *    steps earlier and reserving n pages; every reserve and free is timed.
 *    All outstanding reservations are then freed, which restores the pool.
 * 3. The scan baseline replays the same steps on a copy of the byte map, for
 *    the first `scan-ops` steps (and within a time budget):
 *    - `scan`: the same contiguous-preferred answer found by linear passes over
 *      the byte map (best fit needs the whole map; the multi-run case a second
 *      pass). Its answers must equal ours, step by step: `scan_mismatches`.
 *    - `first_fit_scan`: the weaker answer most scan allocators give, the first
 *      run of n free pages (address order when none is long enough).
 * Latencies go through kvt_hist (0.8 % buckets); speedup_p50 = scan p50 /
 * reserve p50.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "commands.h"
#include "util.h"
#include "kvtier/rng.h"
#include "kvtier/alloc.h"
#include "kvtier/error.h"
#include "kvtier/stats.h"

enum { PAT_RANDOM, PAT_MIXED, PAT_CHURN };
static const char *const PATTERNS[] = {"random", "mixed", "churn", NULL};
static const char *const FORMATS[] = {"table", "json", "prom", NULL};

#define MAX_SIZES 16
#define MAX_HOLE 4096 /* mixed and churn sizes are log-uniform in [1, MAX_HOLE] */
#define BENCH_BYTES_PER_PAGE 16

typedef struct params {
    uint64_t pages, page_bytes, ops, seed, scan_ops, window;
    double fragment, scan_budget_s;
    int pattern;
    uint64_t sizes[MAX_SIZES];
    size_t nsizes;
    bool json;
    int stats_fmt; /* -1: none */
} params_t;

typedef struct result {
    uint64_t size;
    kvt_hist_t reserve, free_run, scan, ff_scan;
    uint64_t runs_total, reserved_ok, failures, scan_steps, scan_mismatches;
    uint64_t ff_runs_total, ff_ok;
} result_t;


static void die_on(int rc, const char *what) {
    if (rc == KVT_OK) return;
    fprintf(stderr, "kvtier bench alloc: %s: %s\n", what, kvt_strerror(rc));
    exit(1);
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (p == NULL) {
        fprintf(stderr, "kvtier bench alloc: out of memory (%zu x %zu bytes)\n", n, size);
        exit(1);
    }
    return p;
}

static void mark(uint8_t *map, const kvt_run_t *runs, size_t k, uint8_t v) {
    for (size_t i = 0; i < k; i++) memset(map + runs[i].start, v, runs[i].len);
}

static uint64_t log_uniform(kvt_rng_t *rng, uint64_t max) {
    uint64_t v = (uint64_t)exp(kvt_rng_unit(rng) * log((double)max + 1));
    return v < 1 ? 1 : v > max ? max : v;
}

/* ---- building the fragmented pool ---- */

static void build_random(kvt_extalloc_t *a, uint8_t *map, const params_t *p, kvt_rng_t *rng) {
    die_on(kvt_extalloc_reserve_at(a, (kvt_run_t){0, (uint32_t)p->pages}), "reserve pool");
    memset(map, 1, p->pages);
    uint64_t target = (uint64_t)(p->fragment * (double)p->pages), freed = 0;
    while (freed < target) {
        uint64_t pg = kvt_rng_below(rng, p->pages);
        if (!map[pg]) continue;
        die_on(kvt_extalloc_free(a, &(kvt_run_t){(uint32_t)pg, 1}, 1), "free");
        map[pg] = 0;
        freed++;
    }
}

static void build_mixed(kvt_extalloc_t *a, uint8_t *map, const params_t *p, kvt_rng_t *rng) {
    die_on(kvt_extalloc_reserve_at(a, (kvt_run_t){0, (uint32_t)p->pages}), "reserve pool");
    memset(map, 1, p->pages);
    uint64_t target = (uint64_t)(p->fragment * (double)p->pages), freed = 0;
    while (freed < target) {
        uint64_t len = log_uniform(rng, MAX_HOLE);
        if (len > p->pages) len = p->pages;
        uint64_t start = kvt_rng_below(rng, p->pages - len + 1);
        /* free the reserved pieces of [start, start+len), up to the target */
        for (uint64_t q = start; q < start + len && freed < target;) {
            if (!map[q]) {
                q++;
                continue;
            }
            uint64_t e = q;
            while (e < start + len && map[e] && freed + (e - q) < target) e++;
            die_on(kvt_extalloc_free(a, &(kvt_run_t){(uint32_t)q, (uint32_t)(e - q)}, 1), "free");
            memset(map + q, 0, e - q);
            freed += e - q;
            q = e;
        }
    }
}

typedef struct live {
    kvt_run_t *runs;
    size_t k;
} live_t;

/* Frees one of the n live allocations, at random; the pages it gave back. */
static uint64_t free_one(kvt_extalloc_t *a, uint8_t *map, live_t *lv, size_t *n, kvt_rng_t *rng) {
    size_t i = (size_t)kvt_rng_below(rng, *n);
    uint64_t pages = 0;
    die_on(kvt_extalloc_free(a, lv[i].runs, lv[i].k), "free");
    mark(map, lv[i].runs, lv[i].k, 0);
    for (size_t r = 0; r < lv[i].k; r++) pages += lv[i].runs[r].len;
    free(lv[i].runs);
    lv[i] = lv[--*n];
    return pages;
}

static void build_churn(kvt_extalloc_t *a, uint8_t *map, const params_t *p, kvt_rng_t *rng) {
    size_t cap = 1024, n = 0;
    live_t *lv = xcalloc(cap, sizeof(*lv));
    kvt_run_t *tmp = xcalloc(MAX_HOLE, sizeof(kvt_run_t));
    uint64_t target_free = (uint64_t)(p->fragment * (double)p->pages), free_pages = p->pages;
    uint64_t steps = p->pages / 64 + 100000, done = 0;
    /* Fill to the target, then alternate around it for `steps` more ops. */
    while (free_pages > target_free || done < steps) {
        if (free_pages > target_free || n == 0) {
            uint64_t sz = log_uniform(rng, MAX_HOLE);
            size_t k;
            if (sz > free_pages) sz = free_pages; /* (>= 1: the pool is not full while it is above the target or empty) */
            die_on(kvt_extalloc_reserve(a, sz, tmp, MAX_HOLE, &k), "reserve");
            if (n == cap) {
                lv = realloc(lv, (cap *= 2) * sizeof(*lv));
                if (lv == NULL) die_on(KVT_ENOMEM, "churn");
            }
            lv[n].runs = xcalloc(k, sizeof(kvt_run_t));
            memcpy(lv[n].runs, tmp, k * sizeof(kvt_run_t));
            lv[n].k = k;
            mark(map, tmp, k, 1);
            free_pages -= sz;
            n++;
        } else {
            free_pages += free_one(a, map, lv, &n, rng);
        }
        if (free_pages <= target_free) done++;
    }
    /* The last reserve may have taken up to MAX_HOLE pages below the target (all of a small pool):
     * give back whole allocations until the target is free again. */
    while (free_pages < target_free && n > 0) free_pages += free_one(a, map, lv, &n, rng);
    for (size_t i = 0; i < n; i++) free(lv[i].runs);
    free(lv);
    free(tmp);
}

/* ---- the scan baselines ---- */

/* Contiguous-preferred reserve over a byte map, same answer as kvt_extalloc:
 * best fit (lowest address on ties); else whole runs largest first (higher
 * address first among equals) and a best fit for the rest. Returns the number
 * of runs, 0 when fewer than n pages are free. `hist` has room for n counts. */
static size_t scan_best_fit(const uint8_t *map, uint64_t npages, uint64_t n, kvt_run_t *out, uint64_t *hist) {
    uint64_t best = 0, best_len = 0, total = 0;
    memset(hist, 0, n * sizeof(uint64_t));
    for (uint64_t pg = 0; pg < npages;) {
        if (map[pg]) {
            pg++;
            continue;
        }
        uint64_t q = pg;
        while (q < npages && !map[q]) q++;
        uint64_t len = q - pg;
        total += len;
        if (len == n) { /* no fit can be tighter, nor one lower among the tightest: done */
            out[0] = (kvt_run_t){(uint32_t)pg, (uint32_t)n};
            return 1;
        }
        if (len > n) {
            if (best_len == 0 || len < best_len) best = pg, best_len = len;
        } else {
            hist[len]++;
        }
        pg = q;
    }
    if (best_len) {
        out[0] = (kvt_run_t){(uint32_t)best, (uint32_t)n};
        return 1;
    }
    if (total < n) return 0;
    /* Plan by length, longest first: take whole runs while each is shorter
     * than what is left; stop at the first length that could hold the rest.
     * hist[L] becomes the number of runs of length L taken whole. */
    uint64_t rest = n, stop_len = 0;
    for (uint64_t len = n - 1; len >= 1 && stop_len == 0; len--) {
        uint64_t take = 0;
        while (take < hist[len] && len < rest) take++, rest -= len;
        if (take < hist[len]) stop_len = len;
        hist[len] = take;
    }
    /* The rest goes to the shortest run that holds it: a length in
     * [rest, stop_len), untouched so far, or else stop_len itself. */
    uint64_t fit_len = stop_len;
    for (uint64_t len = rest; len < stop_len; len++)
        if (hist[len] > 0) {
            fit_len = len;
            break;
        }
    for (uint64_t len = 1; len < stop_len; len++) hist[len] = 0;
    /* Second pass, backwards: the highest-address runs of each taken length,
     * then the lowest-address run of fit_len that is left. */
    size_t k = 0;
    uint64_t fit_start = UINT64_MAX;
    for (uint64_t pg = npages; pg > 0;) {
        if (map[pg - 1]) {
            pg--;
            continue;
        }
        uint64_t q = pg;
        while (q > 0 && !map[q - 1]) q--;
        uint64_t len = pg - q;
        if (hist[len] > 0) {
            out[k++] = (kvt_run_t){(uint32_t)q, (uint32_t)len};
            hist[len]--;
        } else if (len == fit_len) {
            fit_start = q; /* going backwards, the last one seen is the lowest */
        }
        pg = q;
    }
    /* Order as the allocator reports: taken runs by (len, start) descending. */
    for (size_t i = 1; i < k; i++)
        for (size_t j = i; j > 0 && (out[j].len > out[j - 1].len ||
                                     (out[j].len == out[j - 1].len && out[j].start > out[j - 1].start)); j--) {
            kvt_run_t t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
    out[k++] = (kvt_run_t){(uint32_t)fit_start, (uint32_t)rest};
    return k;
}

/* First fit: the first free run of n pages; when none is that long, free
 * pages in address order. Returns the number of runs, 0 when not enough. */
static size_t scan_first_fit(const uint8_t *map, uint64_t npages, uint64_t n, kvt_run_t *out) {
    for (uint64_t pg = 0; pg < npages;) {
        if (map[pg]) {
            pg++;
            continue;
        }
        uint64_t q = pg;
        while (q < npages && !map[q] && q - pg < n) q++;
        if (q - pg == n) {
            out[0] = (kvt_run_t){(uint32_t)pg, (uint32_t)n};
            return 1;
        }
        pg = q;
    }
    size_t k = 0;
    uint64_t rest = n;
    for (uint64_t pg = 0; pg < npages && rest > 0;) {
        if (map[pg]) {
            pg++;
            continue;
        }
        uint64_t q = pg;
        while (q < npages && !map[q] && q - pg < rest) q++;
        out[k++] = (kvt_run_t){(uint32_t)pg, (uint32_t)(q - pg)};
        rest -= q - pg;
        pg = q;
    }
    return rest == 0 ? k : 0;
}

/* ---- the timed runs ---- */

typedef struct ring {
    kvt_run_t *runs; /* window slots of n runs each */
    size_t *k;
} ring_t;

static void run_size(kvt_extalloc_t *a, const uint8_t *map0, const params_t *p, result_t *res) {
    uint64_t n = res->size, W = p->window;
    uint64_t nscan = p->scan_ops < p->ops ? p->scan_ops : p->ops;
    ring_t ring = {xcalloc(W * n, sizeof(kvt_run_t)), xcalloc(W, sizeof(size_t))};
    kvt_run_t *want = xcalloc(nscan * n + 1, sizeof(kvt_run_t)); /* our answers for the scan check */
    size_t *want_k = xcalloc(nscan + 1, sizeof(size_t));

    for (uint64_t s = 0; s < p->ops; s++) {
        kvt_run_t *slot = &ring.runs[(s % W) * n];
        size_t *k = &ring.k[s % W];
        if (s >= W && *k) {
            uint64_t t0 = now_ns();
            int rc = kvt_extalloc_free(a, slot, *k);
            uint64_t t1 = now_ns();
            die_on(rc, "free");
            kvt_hist_record(&res->free_run, (t1 - t0) / *k);
        }
        uint64_t t0 = now_ns();
        int rc = kvt_extalloc_reserve(a, n, slot, n, k);
        uint64_t t1 = now_ns();
        if (rc == KVT_OK) {
            kvt_hist_record(&res->reserve, t1 - t0);
            res->runs_total += *k;
            res->reserved_ok++;
        } else {
            *k = 0;
            res->failures++;
        }
        if (s < nscan) {
            memcpy(&want[s * n], slot, *k * sizeof(kvt_run_t));
            want_k[s] = *k;
        }
    }
    for (uint64_t i = 0; i < W; i++) /* restore the pool */
        if (i < p->ops && ring.k[i]) die_on(kvt_extalloc_free(a, &ring.runs[i * n], ring.k[i]), "free");

    /* The baselines replay the same steps on copies of the byte map. */
    uint8_t *map = xcalloc(p->pages, 1);
    uint64_t *hist = xcalloc(n, sizeof(uint64_t));
    for (int variant = 0; variant < 2; variant++) {
        memcpy(map, map0, p->pages);
        memset(ring.k, 0, W * sizeof(size_t));
        uint64_t started = now_ns();
        for (uint64_t s = 0; s < nscan; s++) {
            if (s > 0 && (double)(now_ns() - started) > p->scan_budget_s * 1e9) break;
            kvt_run_t *slot = &ring.runs[(s % W) * n];
            size_t *k = &ring.k[s % W];
            if (s >= W) mark(map, slot, *k, 0);
            uint64_t t0 = now_ns();
            *k = variant == 0 ? scan_best_fit(map, p->pages, n, slot, hist) : scan_first_fit(map, p->pages, n, slot);
            uint64_t t1 = now_ns();
            mark(map, slot, *k, 1);
            if (variant == 0) {
                kvt_hist_record(&res->scan, t1 - t0);
                res->scan_steps++;
                if (*k != want_k[s] || memcmp(slot, &want[s * n], *k * sizeof(kvt_run_t)) != 0)
                    res->scan_mismatches++;
            } else {
                kvt_hist_record(&res->ff_scan, t1 - t0);
                res->ff_runs_total += *k;
                res->ff_ok += *k > 0;
            }
        }
    }
    free(hist);
    free(map);
    free(want_k);
    free(want);
    free(ring.k);
    free(ring.runs);
}

/* ---- output ---- */

static cJSON *pct_json(const kvt_hist_t *h) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "p50", (double)kvt_hist_percentile(h, 0.50));
    cJSON_AddNumberToObject(o, "p90", (double)kvt_hist_percentile(h, 0.90));
    cJSON_AddNumberToObject(o, "p99", (double)kvt_hist_percentile(h, 0.99));
    cJSON_AddNumberToObject(o, "p999", (double)kvt_hist_percentile(h, 0.999));
    cJSON_AddNumberToObject(o, "max", (double)(h->count ? h->max : 0));
    return o;
}

static double speedup(const result_t *r) {
    uint64_t ours = kvt_hist_percentile(&r->reserve, 0.5), scan = kvt_hist_percentile(&r->scan, 0.5);
    return ours && r->scan.count ? (double)scan / (double)ours : 0.0;
}

typedef struct pool_info {
    kvt_extalloc_stats_t st;
    double build_s;
    uint64_t timer_ns;
} pool_info_t;

static void print_json(const params_t *p, const pool_info_t *pi, const result_t *res) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "pages", (double)p->pages);
    cJSON_AddNumberToObject(o, "page_bytes", (double)p->page_bytes);
    cJSON_AddNumberToObject(o, "pool_gb", (double)p->pages * (double)p->page_bytes / 1e9);
    cJSON_AddNumberToObject(o, "fragment", p->fragment);
    cJSON_AddStringToObject(o, "pattern", PATTERNS[p->pattern]);
    cJSON_AddNumberToObject(o, "metadata_bytes_per_page", (double)pi->st.metadata_bytes / (double)p->pages);
    cJSON_AddNumberToObject(o, "metadata_bytes", (double)pi->st.metadata_bytes);
    cJSON_AddNumberToObject(o, "free_pages", (double)pi->st.free_pages);
    cJSON_AddNumberToObject(o, "free_extents", (double)pi->st.free_extents);
    cJSON_AddNumberToObject(o, "largest_free_run", (double)pi->st.largest_free_run);
    char seed[24]; /* exact: a double keeps 53 bits, and a seed rounded builds another pool */
    snprintf(seed, sizeof(seed), "%" PRIu64, p->seed);
    cJSON_AddRawToObject(o, "seed", seed);
    cJSON_AddNumberToObject(o, "ops", (double)p->ops);
    cJSON_AddNumberToObject(o, "window", (double)p->window);
    cJSON_AddNumberToObject(o, "build_s", pi->build_s);
    cJSON_AddNumberToObject(o, "timer_ns", (double)pi->timer_ns);
    cJSON *arr = cJSON_AddArrayToObject(o, "results");
    for (size_t i = 0; i < p->nsizes; i++) {
        const result_t *r = &res[i];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "size", (double)r->size);
        cJSON_AddItemToObject(x, "reserve_ns", pct_json(&r->reserve));
        cJSON_AddItemToObject(x, "free_ns", pct_json(&r->free_run));
        cJSON_AddNumberToObject(x, "runs_mean", r->reserved_ok ? (double)r->runs_total / (double)r->reserved_ok : 0);
        cJSON_AddNumberToObject(x, "reserve_failures", (double)r->failures);
        cJSON_AddItemToObject(x, "scan_ns", pct_json(&r->scan));
        cJSON_AddNumberToObject(x, "speedup_p50", speedup(r));
        cJSON_AddNumberToObject(x, "scan_steps", (double)r->scan_steps);
        cJSON_AddNumberToObject(x, "scan_mismatches", (double)r->scan_mismatches);
        cJSON_AddItemToObject(x, "first_fit_scan_ns", pct_json(&r->ff_scan));
        cJSON_AddNumberToObject(x, "first_fit_runs_mean", r->ff_ok ? (double)r->ff_runs_total / (double)r->ff_ok : 0);
        cJSON_AddItemToArray(arr, x);
    }
    cli_print_json(o);
}

static void print_table(const params_t *p, const pool_info_t *pi, const result_t *res) {
    printf("pool: %" PRIu64 " pages x %" PRIu64 " B = %.1f GB, pattern %s, fragment %.2f (%.2f free), seed %" PRIu64 "\n",
           p->pages, p->page_bytes, (double)p->pages * (double)p->page_bytes / 1e9, PATTERNS[p->pattern],
           p->fragment, (double)pi->st.free_pages / (double)p->pages, p->seed);
    printf("      %" PRIu64 " free pages in %" PRIu64 " extents, largest %" PRIu64 "; metadata %.2f B/page; built in %.2f s\n",
           pi->st.free_pages, pi->st.free_extents, pi->st.largest_free_run,
           (double)pi->st.metadata_bytes / (double)p->pages, pi->build_s);
    printf("%8s %10s %10s %10s %10s %10s %8s %12s %12s %10s %8s\n", "size", "resv p50", "resv p99", "resv p999",
           "free p50", "free p99", "runs", "scan p50", "1st-fit p50", "speedup", "failed");
    for (size_t i = 0; i < p->nsizes; i++) {
        const result_t *r = &res[i];
        printf("%8" PRIu64 " %10" PRIu64 " %10" PRIu64 " %10" PRIu64 " %10" PRIu64 " %10" PRIu64 " %8.2f %12" PRIu64
               " %12" PRIu64 " %9.0fx %8" PRIu64 "\n",
               r->size, kvt_hist_percentile(&r->reserve, .5), kvt_hist_percentile(&r->reserve, .99),
               kvt_hist_percentile(&r->reserve, .999), kvt_hist_percentile(&r->free_run, .5),
               kvt_hist_percentile(&r->free_run, .99),
               r->reserved_ok ? (double)r->runs_total / (double)r->reserved_ok : 0.0,
               kvt_hist_percentile(&r->scan, .5), kvt_hist_percentile(&r->ff_scan, .5), speedup(r), r->failures);
        if (r->failures == p->ops) /* nothing above was measured */
            printf("%8s every reservation of %" PRIu64 " pages failed: the pool has %" PRIu64 " free\n", "", r->size,
                   pi->st.free_pages);
    }
    printf("(ns; free per run; %" PRIu64 " ops per size, window %" PRIu64 "; timer overhead %" PRIu64 " ns)\n",
           p->ops, p->window, pi->timer_ns);
}

static uint64_t timer_overhead(void) {
    kvt_hist_t h;
    kvt_hist_init(&h);
    for (int i = 0; i < 10000; i++) {
        uint64_t t0 = now_ns();
        kvt_hist_record(&h, now_ns() - t0);
    }
    return kvt_hist_percentile(&h, 0.5);
}

static const char USAGE[] =
    "usage: kvtier bench alloc [--pages 14000000] [--page-bytes 16384] [--fragment 0.5]\n"
    "                          [--pattern random|mixed|churn] [--sizes 1,8,64,512] [--ops 200000]\n"
    "                          [--window 16] [--scan-ops 50] [--scan-budget-s 2] [--seed 42]\n"
    "                          [--stats table|json|prom] [--json]\n";

static int parse(int argc, char **argv, params_t *p) {
    *p = (params_t){.pages = 14000000, .page_bytes = 16384, .ops = 200000, .seed = 42, .scan_ops = 50,
                    .window = 16, .fragment = 0.5, .scan_budget_s = 2.0, .pattern = PAT_RANDOM,
                    .sizes = {1, 8, 64, 512}, .nsizes = 4, .stats_fmt = -1};
    cli_t c;
    cli_init(&c, "kvtier bench alloc", argc, argv);
    int kind, rc = 0;
    while (rc == 0 && (kind = cli_next(&c)) != 0) {
        if (kind == 2) rc = cli_unknown(&c);
        else if (cli_is(&c, "--help")) return fputs(USAGE, stdout), 1;
        else if (cli_is(&c, "--pages")) rc = cli_u64(&c, 1024, KVT_ALLOC_MAX_PAGES, &p->pages);
        else if (cli_is(&c, "--page-bytes")) rc = cli_u64(&c, 1, (uint64_t)1 << 40, &p->page_bytes);
        else if (cli_is(&c, "--fragment")) rc = cli_double(&c, 0, 1, true, true, &p->fragment);
        else if (cli_is(&c, "--pattern")) rc = cli_choice(&c, PATTERNS, &p->pattern);
        else if (cli_is(&c, "--sizes")) rc = cli_u64_list(&c, 1, 1 << 20, p->sizes, MAX_SIZES, &p->nsizes);
        else if (cli_is(&c, "--ops")) rc = cli_u64(&c, 1, 1000000000, &p->ops);
        else if (cli_is(&c, "--window")) rc = cli_u64(&c, 1, 4096, &p->window);
        else if (cli_is(&c, "--scan-ops")) rc = cli_u64(&c, 0, 1000000, &p->scan_ops);
        else if (cli_is(&c, "--scan-budget-s")) rc = cli_double(&c, 0, 3600, false, false, &p->scan_budget_s);
        else if (cli_is(&c, "--seed")) rc = cli_u64(&c, 0, UINT64_MAX, &p->seed);
        else if (cli_is(&c, "--stats")) rc = cli_choice(&c, FORMATS, &p->stats_fmt);
        else if (cli_is(&c, "--json")) rc = cli_flag(&c, &p->json);
        else rc = cli_unknown(&c);
    }
    if (rc) return -1;
    c.flag = "--sizes";
    for (size_t i = 0; i < p->nsizes; i++)
        if (p->sizes[i] > p->pages) return cli_error(&c, "size %" PRIu64 " is larger than the pool (%" PRIu64 " pages)", p->sizes[i], p->pages);
    /* the scans' byte map and the allocator's extents: about 9 bytes a page together at the worst
     * (half the pool free in single pages, the resident set measured); BENCH_BYTES_PER_PAGE bounds it */
    double mem = cli_machine_memory();
    if ((double)p->pages * BENCH_BYTES_PER_PAGE > 0.6 * mem) {
        c.flag = "--pages";
        return cli_error(&c, "%" PRIu64 " pages need up to %.1f GiB (%d bytes a page): more than 60%% of this machine's %.1f GiB",
                         p->pages, (double)p->pages * BENCH_BYTES_PER_PAGE / 1073741824.0, BENCH_BYTES_PER_PAGE,
                         mem / 1073741824.0);
    }
    return 0;
}

int cmd_bench_alloc(int argc, char **argv) {
    params_t p;
    int rc = parse(argc, argv, &p);
    if (rc) return rc > 0 ? 0 : 2;
    if (cli_parse_only) return 0;

    kvt_extalloc_t *a;
    die_on(kvt_extalloc_create(&a, p.pages), "create allocator");
    uint8_t *map = xcalloc(p.pages, 1);
    kvt_rng_t rng;
    kvt_rng_seed(&rng, p.seed);
    uint64_t t0 = now_ns();
    switch (p.pattern) {
    case PAT_RANDOM: build_random(a, map, &p, &rng); break;
    case PAT_MIXED: build_mixed(a, map, &p, &rng); break;
    default: build_churn(a, map, &p, &rng); break;
    }
    pool_info_t pi = {.st.size = sizeof(kvt_extalloc_stats_t)};
    pi.build_s = (double)(now_ns() - t0) / 1e9;
    kvt_extalloc_stats(a, &pi.st);
    pi.timer_ns = timer_overhead();

    result_t *res = xcalloc(p.nsizes, sizeof(result_t));
    for (size_t i = 0; i < p.nsizes; i++) {
        res[i].size = p.sizes[i];
        kvt_hist_init(&res[i].reserve);
        kvt_hist_init(&res[i].free_run);
        kvt_hist_init(&res[i].scan);
        kvt_hist_init(&res[i].ff_scan);
        run_size(a, map, &p, &res[i]);
    }
    if (p.json) print_json(&p, &pi, res);
    else print_table(&p, &pi, res);

    if (p.stats_fmt >= 0) {
        kvt_extalloc_stats_t st = {.size = sizeof(st)};
        kvt_emitter_t *e;
        kvt_extalloc_stats(a, &st);
        die_on(kvt_emitter_create(&e, (kvt_fmt_t)p.stats_fmt, "kvtier"), "emitter");
        kvt_emit_begin(e, "extalloc");
        KVT_EMIT_STATS(e, &st, KVT_EXTALLOC_STATS_FIELDS);
        kvt_emit_end(e);
        die_on(kvt_emitter_write(e, stderr), "write stats");
        kvt_emitter_destroy(e);
    }
    int bad = 0;
    for (size_t i = 0; i < p.nsizes; i++) bad |= res[i].scan_mismatches != 0;
    if (bad) fprintf(stderr, "kvtier bench alloc: the scan baseline disagreed with the allocator\n");
    free(res);
    free(map);
    kvt_extalloc_destroy(a);
    return bad ? 1 : 0;
}
