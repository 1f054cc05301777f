/* kvtier bench xfer — L1 <-> L2 copy throughput through the transfer engine,
 * against a plain memcpy of the same bytes as one block in the same run.
 *
 * For each page size: an L1 and an L2 host tier of total/page_bytes pages
 * each. L1 is an arena tier, or an engine tier over a buffer the bench owns
 * as a serving engine would: `engine_kv` laid out like SGLang's pools (per
 * layer a k_buffer and a v_buffer, one page = consecutive slots of each: two
 * planes, K half and V half of a layer), `engine_mla` like an MLA latent
 * pool (one [layers, pages, ...] tensor: one plane, one base + layer stride). The contiguous pattern copies page i to page i (one run: what
 * the allocator's contiguous reservations give); the scattered pattern
 * copies page i to a random permutation of the pages (no two pages form a
 * run: what page-at-a-time allocation gives). Each figure is the median of
 * --reps runs, engine and the references interleaved so drift hits all
 * alike; the engine's time is submit to the last completion, sorting and
 * merging included.
 *
 * Two references copy the same bytes as one block on one thread: glibc's
 * memcpy (`ratio` is against it) and a streaming-store copy written here,
 * apart from the library's own (non-temporal AVX or SSE2 stores, then
 * sfence), the better of one stream of lines and four side by side in each
 * repetition (machines differ on which is faster: src/xfer/copy.c). The
 * better of the two medians is the machine's single-thread copy
 * limit, `best_gbps`; `best_ratio` is the engine against it.
 * `best_ratio_paired` is the median over repetitions of the engine against
 * the better reference of the same repetition (the four copies run back to
 * back; the reference, the best of three, leans a little high): on a shared
 * machine a burst of someone else's memory traffic then slows both sides of
 * a ratio, where it moves only one of three medians. `copy_streams` is how
 * the library streams a long copy on this machine (kvt_xfer_copy_streams).
 *
 * --cpus pins the bench to those CPUs before any worker starts (workers
 * inherit the mask). With one CPU the engine's worker copies on the core the
 * references copied on while the submitting thread sleeps in poll: on a VM
 * whose virtual CPUs the host serves unevenly, that takes the difference
 * between two cores out of a one-worker ratio (docs/performance.md, *Which
 * core copies*). */
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define STREAM_X86 1
#endif

#include <cjson/cJSON.h>

#include "cli.h"
#include "util.h"
#include "commands.h"
#include "kvtier/error.h"
#include "kvtier/tier.h"
#include "kvtier/xfer.h"

#define MAX_SIZES 16
#define MAX_REPS 64
#define MAX_CPUS 64

static const char *const LAYOUTS[] = {"page_first", "layer_first", "both", NULL};
static const char *const PATTERNS[] = {"contiguous", "scattered", "both", NULL};
static const char *const DIRS[] = {"d2h", "h2d"};
static const char *const CUDA_COPIES[] = {"auto", "dma", "kernel", NULL};
static const uint32_t CUDA_COPY_FLAGS[] = {0, KVT_TIER_COPY_DMA, KVT_TIER_COPY_KERNEL};
static const char *const L1S[] = {"arena", "engine_kv", "engine_mla", "all", "cuda", NULL};
#define NL1 3     /* "all": the three host L1s */
#define L1_CUDA 4 /* GPU memory (a build with CUDA, a machine with a GPU): only when asked for by name */

typedef struct params {
    uint64_t sizes[MAX_SIZES];
    size_t nsizes;
    uint64_t total_mb, threads, reps, layers, seed;
    uint64_t cpus[MAX_CPUS]; /* --cpus; ncpus 0: not pinned */
    size_t ncpus;
    int layout, pattern; /* indices; 2 = both */
    int l1;              /* index of L1S; NL1 = all */
    int cuda_copy;       /* index of CUDA_COPIES: a cuda L1's copy way */
    bool json, checksum;
} params_t;

typedef struct result {
    uint64_t page_bytes;
    int l1, layout, pattern, dir;
    double gbps, memcpy_gbps, stream_gbps, runs_per_page, p99_ms;
    double gbps_min, gbps_max;
    double paired, paired_min, paired_max; /* engine / the better reference of the same repetition */
} result_t;

#ifdef STREAM_X86
/* n a multiple of 64, as `ways` ways of n / ways bytes (whole lines) side by
 * side: a line of each way in turn, then the lines past the ways one by one. */
__attribute__((target("avx"))) static void stream_avx(uint8_t *d, const uint8_t *s, size_t n, size_t ways) {
    size_t way = n / ways / 64 * 64;
    for (size_t i = 0; i < way; i += 64)
        for (size_t j = 0; j < ways; j++) {
            size_t o = j * way + i;
            _mm256_stream_si256((__m256i *)(d + o), _mm256_loadu_si256((const __m256i *)(s + o)));
            _mm256_stream_si256((__m256i *)(d + o + 32), _mm256_loadu_si256((const __m256i *)(s + o + 32)));
        }
    for (size_t o = ways * way; o < n; o += 64) {
        _mm256_stream_si256((__m256i *)(d + o), _mm256_loadu_si256((const __m256i *)(s + o)));
        _mm256_stream_si256((__m256i *)(d + o + 32), _mm256_loadu_si256((const __m256i *)(s + o + 32)));
    }
}

static void stream_sse2(uint8_t *d, const uint8_t *s, size_t n, size_t ways) {
    size_t way = n / ways / 64 * 64;
    for (size_t i = 0; i < way; i += 64)
        for (size_t j = 0; j < ways; j++)
            for (size_t o = j * way + i, k = 0; k < 64; k += 16)
                _mm_stream_si128((__m128i *)(d + o + k), _mm_loadu_si128((const __m128i *)(s + o + k)));
    for (size_t o = ways * way; o < n; o += 16) _mm_stream_si128((__m128i *)(d + o), _mm_loadu_si128((const __m128i *)(s + o)));
}
#endif

/* The streaming reference: the destination 64-aligned, whole lines streamed
 * as `ways` ways side by side (on some machines one core streaming four
 * sequences of lines keeps more DRAM rows busy than one; on others it runs
 * at a third of one's speed: src/xfer/copy.c), the ragged ends by memcpy;
 * memcpy where there are no streaming stores. */
static void stream_copy(void *dst, const void *src, size_t n, size_t ways) {
#ifdef STREAM_X86
    uint8_t *d = dst;
    const uint8_t *s = src;
    size_t head = (size_t)(-(uintptr_t)d & 63);
    if (n < head + 64) {
        memcpy(d, s, n);
        return;
    }
    memcpy(d, s, head);
    size_t body = (n - head) & ~(size_t)63;
    if (__builtin_cpu_supports("avx")) stream_avx(d + head, s + head, body, ways);
    else stream_sse2(d + head, s + head, body, ways);
    memcpy(d + head + body, s + head + body, n - head - body);
    _mm_sfence();
#else
    (void)ways;
    memcpy(dst, src, n);
#endif
}

/* One engine run: a single batch of every page; returns seconds. */
static double engine_run(kvt_xfer_t *x, unsigned src, unsigned dst, const kvt_xfer_copy_t *copies, uint64_t n) {
    uint64_t t0 = now_ns();
    if (kvt_xfer_submit(x, src, dst, copies, n, 0, NULL) != KVT_OK) return -1;
    kvt_xfer_done_t d;
    int got;
    while ((got = kvt_xfer_poll(x, &d, 1, 1000000000ull)) == 0) {
    }
    double s = (double)(now_ns() - t0) / 1e9;
    return got == 1 && d.status == KVT_OK ? s : -1;
}

/* The bytes, outside the clock (a fast copy of the wrong bytes is no
 * figure): one more run of the copies, then every copy's destination
 * (page, layer) read back against its source. For d2h the source L1 pages
 * are first given contents of their own (distinct per page and layer), so
 * that a page copied to the wrong place is caught; h2d then reads back what
 * d2h put in L2 (through the engine: checksums valid). The number of
 * (page, layer) pieces that differ, or -1 when a copy failed. */
static int64_t verify(kvt_xfer_t *x, kvt_tier_t *const *t, unsigned src, unsigned dst, const kvt_xfer_copy_t *copies,
                      uint64_t n) {
    const kvt_geom_t *g = kvt_tier_geom(t[src]);
    uint64_t *a = malloc(g->layer_bytes + 8), *b = malloc(g->layer_bytes + 8);
    int64_t bad = a && b ? 0 : -1;
    for (uint64_t i = 0; i < n && bad == 0 && src == 0; i++)
        for (uint32_t l = 0; l < g->layers && bad == 0; l++) {
            for (uint64_t w = 0; w * 8 < g->layer_bytes; w++) a[w] = (copies[i].src_page * 0x9e3779b97f4a7c15ull) ^ (l * 0xbf58476d1ce4e5b9ull) ^ w;
            if (kvt_tier_write(t[src], copies[i].src_page, l, a) != KVT_OK) bad = -1;
        }
    if (bad == 0 && engine_run(x, src, dst, copies, n) < 0) bad = -1;
#ifdef KVT_TESTING
    if (bad == 0 && getenv("KVT_BENCH_XFER_SPOIL")) { /* one piece as a copy gone wrong leaves it: the check must see it */
        memset(b, 0, g->layer_bytes);
        kvt_tier_write(t[dst], copies[n / 2].dst_page, 0, b);
    }
#endif
    for (uint64_t i = 0; i < n && bad >= 0; i++)
        for (uint32_t l = 0; l < g->layers && bad >= 0; l++) {
            if (kvt_tier_read(t[src], copies[i].src_page, l, a) != KVT_OK || kvt_tier_read(t[dst], copies[i].dst_page, l, b) != KVT_OK)
                bad = -1;
            else if (memcmp(a, b, g->layer_bytes) != 0)
                bad++;
        }
    free(a);
    free(b);
    return bad;
}

/* The engine's own buffer for an engine L1 (kind 1: K/V planes, 2: one
 * MLA plane), and the description of it. The bench owns the memory; the
 * tier only addresses it. */
typedef struct engine_buf {
    uint8_t *mem;
    size_t bytes;
    void **layer_ptrs[2];
    kvt_tier_engine_t e;
} engine_buf_t;

static int engine_buf_make(engine_buf_t *eb, int kind, const kvt_geom_t *g) {
    memset(eb, 0, sizeof(*eb));
    eb->e.size = sizeof(eb->e);
    eb->bytes = g->pages * g->layers * g->layer_bytes;
    if (posix_memalign((void **)&eb->mem, 2u << 20, eb->bytes) != 0) return KVT_ENOMEM;
    if (kind == 2) { /* [layers, pages, page_tokens, latent + rope] */
        eb->e.planes = 1;
        eb->e.plane[0] = (kvt_tier_plane_t){.base = eb->mem, .layer_stride = g->pages * g->layer_bytes,
                                            .piece_bytes = g->layer_bytes, .page_stride = g->layer_bytes};
        return KVT_OK;
    }
    /* SGLang: k_buffer[l] then v_buffer[l], each [pages * page_tokens, heads, dim]; V's half may differ from K's */
    uint64_t k = g->layer_bytes / 2, v = g->layer_bytes - k;
    for (int i = 0; i < 2; i++) {
        eb->layer_ptrs[i] = calloc(g->layers, sizeof(void *));
        if (eb->layer_ptrs[i] == NULL) return KVT_ENOMEM;
    }
    for (uint32_t l = 0; l < g->layers; l++) {
        eb->layer_ptrs[0][l] = eb->mem + (size_t)l * g->pages * k;
        eb->layer_ptrs[1][l] = eb->mem + (size_t)g->layers * g->pages * k + (size_t)l * g->pages * v;
    }
    eb->e.planes = 2;
    eb->e.plane[0] = (kvt_tier_plane_t){.layer_base = eb->layer_ptrs[0], .piece_bytes = k, .page_stride = k};
    eb->e.plane[1] = (kvt_tier_plane_t){.layer_base = eb->layer_ptrs[1], .piece_bytes = v, .page_stride = v};
    return KVT_OK;
}

static void engine_buf_free(engine_buf_t *eb) {
    free(eb->mem);
    free(eb->layer_ptrs[0]);
    free(eb->layer_ptrs[1]);
}

static int bench_one(const params_t *p, uint64_t page_bytes, int l1, int layout, int pattern, result_t *out) {
    uint64_t pages = p->total_mb * 1048576ull / page_bytes;
    uint32_t layers = layout == KVT_LAYOUT_LAYER_FIRST ? (uint32_t)p->layers : 1;
    kvt_geom_t g = {pages, layers, page_bytes / layers, (kvt_layout_t)layout};
    kvt_tier_t *t[2] = {NULL, NULL};
    engine_buf_t eb = {0};
    kvt_tier_config_t c1 = {.size = sizeof(c1), .kind = KVT_TIER_ARENA, .geom = g, .name = "l1"};
    kvt_tier_config_t c2 = {.size = sizeof(c2), .kind = KVT_TIER_HOST, .geom = g, .name = "l2",
                            .flags = KVT_TIER_HUGE | (p->checksum ? KVT_TIER_CHECKSUM : 0)};
    kvt_xfer_t *x = NULL;
    kvt_xfer_config_t xc;
    kvt_xfer_config_default(&xc);
    xc.threads = (uint32_t)p->threads;
    xc.checksum = p->checksum;
    xc.max_batch_copies = xc.max_batch_copies < layers ? layers : xc.max_batch_copies;
    int rc = KVT_OK;
    bool device = l1 == L1_CUDA;
    kvt_tier_t *rt[2] = {NULL, NULL}; /* a device L1's reference: one page of every byte, one span */
    kvt_xfer_t *rx = NULL;
    if (device) c1.kind = KVT_TIER_CUDA, c1.flags = CUDA_COPY_FLAGS[p->cuda_copy];
    else if (l1 > 0) {
        rc = engine_buf_make(&eb, l1, &g);
        c1.kind = KVT_TIER_ENGINE;
        c1.engine = &eb.e;
    }
    if (rc == KVT_OK) rc = kvt_tier_create(&t[0], &c1);
    if (rc == KVT_OK) rc = kvt_tier_create(&t[1], &c2);
    if (rc == KVT_OK) rc = kvt_xfer_create(&x, &xc, t, 2);
    if (rc == KVT_OK && device) {
        kvt_tier_config_t r1 = c1, r2 = c2;
        r1.geom = r2.geom = (kvt_geom_t){1, 1, pages * page_bytes, KVT_LAYOUT_PAGE_FIRST};
        r1.name = "ref_l1";
        r1.flags = KVT_TIER_COPY_DMA; /* one span: the copy engines */
        r2.name = "ref_l2";
        r2.flags &= ~(uint32_t)KVT_TIER_CHECKSUM;
        kvt_xfer_config_t rc1 = xc;
        rc1.threads = 1;
        rc1.checksum = false;
        rc = kvt_tier_create(&rt[0], &r1);
        if (rc == KVT_OK) rc = kvt_tier_create(&rt[1], &r2);
        if (rc == KVT_OK) rc = kvt_xfer_create(&rx, &rc1, rt, 2);
    }
    kvt_xfer_copy_t *copies = malloc(pages * sizeof(*copies));
    if (rc == KVT_OK && copies == NULL) rc = KVT_ENOMEM;
    if (rc != KVT_OK) {
        fprintf(stderr, "kvtier bench xfer: cannot set up %" PRIu64 " pages of %" PRIu64 " B%s: %s\n", pages, page_bytes,
                device ? " in GPU memory (a build with CUDA and a GPU)" : "", kvt_strerror(rc));
        goto out;
    }
    uint8_t *b1 = device ? NULL : l1 > 0 ? eb.mem : kvt_tier_addr(t[0], 0, 0), *b2 = kvt_tier_addr(t[1], 0, 0); /* the baseline: one memcpy */
    uint64_t bytes = pages * page_bytes;
    if (b1) memset(b1, 0x5a, bytes); /* fault every page in before timing (GPU memory is resident) */
    memset(b2, 0xa5, bytes);
    if (device) memset(kvt_tier_addr(rt[1], 0, 0), 0xa5, bytes);
    const kvt_xfer_copy_t one = {0, 0};
    for (uint64_t i = 0; i < pages; i++) copies[i] = (kvt_xfer_copy_t){(uint32_t)i, (uint32_t)i};
    if (pattern == 1) { /* a random permutation of destinations: no runs */
        uint64_t s = p->seed ^ page_bytes;
        for (uint64_t i = pages; i > 1; i--) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            uint64_t j = (s >> 33) % i;
            uint32_t tmp = copies[i - 1].dst_page;
            copies[i - 1].dst_page = copies[j].dst_page;
            copies[j].dst_page = tmp;
        }
    }
    for (int dir = 0; dir < 2; dir++) {
        double eng[MAX_REPS], mc[MAX_REPS], nt[MAX_REPS], pr[MAX_REPS];
        unsigned src = dir == 0 ? 0 : 1, dst = 1 - src;
        if (dir == 1 && p->checksum) /* h2d verifies sums: make them valid first */
            if (engine_run(x, 0, 1, copies, pages) < 0) rc = KVT_EIO;
        for (uint64_t r = 0; r < p->reps && rc == KVT_OK; r++) {
            if (device) { /* the same bytes as one block, one span, through the same CUDA copy */
                double s = engine_run(rx, src, dst, &one, 1);
                if (s < 0) rc = KVT_EIO;
                mc[r] = (double)bytes / s / 1e9;
                nt[r] = 0;
            } else {
                uint64_t t0 = now_ns();
                memcpy(dir == 0 ? b2 : b1, dir == 0 ? b1 : b2, bytes);
                mc[r] = (double)bytes / (double)(now_ns() - t0);
                nt[r] = 0;
                for (size_t ways = 1; ways <= 4; ways += 3) { /* one stream, then four */
                    t0 = now_ns();
                    stream_copy(dir == 0 ? b2 : b1, dir == 0 ? b1 : b2, bytes, ways);
                    double gbps = (double)bytes / (double)(now_ns() - t0);
                    if (gbps > nt[r]) nt[r] = gbps;
                }
            }
            double s = engine_run(x, src, dst, copies, pages);
            if (s < 0) rc = KVT_EIO;
            eng[r] = (double)bytes / s / 1e9;
            pr[r] = eng[r] / (mc[r] > nt[r] ? mc[r] : nt[r]);
        }
        int64_t wrong = rc == KVT_OK ? verify(x, t, src, dst, copies, pages) : 0;
        if (rc == KVT_OK && wrong != 0) {
            fprintf(stderr, "kvtier bench xfer: %s of %" PRIu64 " pages of %" PRIu64 " B: %s\n", DIRS[dir], pages, page_bytes,
                    wrong < 0 ? "the check's copy or read failed" : "pieces came out wrong");
            rc = KVT_ECORRUPT;
        }
        if (rc != KVT_OK) {
            fprintf(stderr, "kvtier bench xfer: a copy failed\n");
            break;
        }
        kvt_xfer_stats_t st = {.size = sizeof(st)};
        kvt_xfer_stats(x, src, dst, &st);
        result_t *o = &out[dir];
        o->page_bytes = page_bytes;
        o->l1 = l1;
        o->layout = layout;
        o->pattern = pattern;
        o->dir = dir;
        o->paired = median_of(pr, p->reps);
        o->paired_min = pr[0];
        o->paired_max = pr[p->reps - 1];
        o->gbps = median_of(eng, p->reps);
        o->gbps_min = eng[0];
        o->gbps_max = eng[p->reps - 1];
        o->memcpy_gbps = median_of(mc, p->reps);
        o->stream_gbps = median_of(nt, p->reps);
        o->runs_per_page = st.pages ? (double)st.runs / (double)st.pages : 0;
        o->p99_ms = (double)kvt_hist_percentile(&st.copy_ns, 0.99) / 1e6;
    }
out:
    free(copies);
    kvt_xfer_destroy(x);
    kvt_xfer_destroy(rx);
    for (int i = 0; i < 2; i++) kvt_tier_destroy(t[i]), kvt_tier_destroy(rt[i]);
    engine_buf_free(&eb); /* after the tier: the buffer is the bench's, as an engine's is */
    return rc == KVT_OK ? 0 : -1;
}

static const char USAGE[] =
    "usage: kvtier bench xfer [--page-bytes 4096,16384,65536,1048576] [--total-mb 1024]\n"
    "                         [--layout page_first|layer_first|both] [--pattern both|contiguous|scattered]\n"
    "                         [--l1 all|arena|engine_kv|engine_mla|cuda] [--cuda-copy auto|dma|kernel]\n"
    "                         [--threads 1] [--layers 8] [--reps 5] [--checksum] [--seed 42]\n"
    "                         [--cpus LIST] [--json]\n"
    "(the first of each choice and the numbers shown are the defaults)\n"
    "\n"
    "L1 <-> L2 (host) copies through the transfer engine against one memcpy and one\n"
    "streaming-store copy of the same bytes; ratio = engine GB/s / memcpy GB/s, vs best =\n"
    "engine GB/s / the better of the two, medians of --reps runs. L1 is an arena\n"
    "tier or an engine tier over the bench's own buffer: engine_kv like SGLang's K and V\n"
    "pools (two planes), engine_mla like an MLA latent pool (one plane); all: those\n"
    "three. cuda: GPU memory (cudaMalloc); its reference is the same bytes as one\n"
    "block through the same CUDA copy, the GPU link's limit (memcpy column; stream\n"
    "0); --cuda-copy (--l1 cuda only): its copies by the copy engines (dma), by the\n"
    "SMs' copy kernel (kernel), or by the spans' sizes (auto, the default). --cpus\n"
    "pins the bench and its workers to those CPUs (default: not pinned).\n";

static int parse(int argc, char **argv, params_t *p) {
    *p = (params_t){.sizes = {4096, 16384, 65536, 1048576}, .nsizes = 4, .total_mb = 1024, .threads = 1,
                    .reps = 5, .layers = 8, .seed = 42, .layout = 0, .pattern = 2, .l1 = NL1};
    cli_t c;
    cli_init(&c, "kvtier bench xfer", argc, argv);
    int kind, rc = 0;
    while (rc == 0 && (kind = cli_next(&c)) != 0) {
        if (kind == 2) rc = cli_unknown(&c);
        else if (cli_is(&c, "--help")) return fputs(USAGE, stdout), 1;
        else if (cli_is(&c, "--page-bytes")) rc = cli_u64_list(&c, 64, 1ull << 30, p->sizes, MAX_SIZES, &p->nsizes);
        else if (cli_is(&c, "--total-mb")) rc = cli_u64(&c, 1, 1 << 20, &p->total_mb);
        else if (cli_is(&c, "--layout")) rc = cli_choice(&c, LAYOUTS, &p->layout);
        else if (cli_is(&c, "--pattern")) rc = cli_choice(&c, PATTERNS, &p->pattern);
        else if (cli_is(&c, "--l1")) rc = cli_choice(&c, L1S, &p->l1);
        else if (cli_is(&c, "--cuda-copy")) rc = cli_choice(&c, CUDA_COPIES, &p->cuda_copy);
        else if (cli_is(&c, "--threads")) rc = cli_u64(&c, 1, 64, &p->threads);
        else if (cli_is(&c, "--layers")) rc = cli_u64(&c, 1, 1024, &p->layers);
        else if (cli_is(&c, "--reps")) rc = cli_u64(&c, 1, MAX_REPS, &p->reps);
        else if (cli_is(&c, "--seed")) rc = cli_u64(&c, 0, UINT64_MAX, &p->seed);
        else if (cli_is(&c, "--cpus")) rc = cli_u64_list(&c, 0, CPU_SETSIZE - 1, p->cpus, MAX_CPUS, &p->ncpus);
        else if (cli_is(&c, "--checksum")) rc = cli_flag(&c, &p->checksum);
        else if (cli_is(&c, "--json")) rc = cli_flag(&c, &p->json);
        else rc = cli_unknown(&c);
    }
    if (rc) return -1;
    if (p->cuda_copy != 0 && p->l1 != L1_CUDA) {
        c.flag = "--cuda-copy";
        return cli_error(&c, "is for --l1 cuda (a GPU L1): the host L1s copy with the CPU");
    }
    if (p->layout == 0 && p->layers != 8) { /* (8: the default) */
        c.flag = "--layers";
        return cli_error(&c, "splits layer_first pages: with --layout layer_first or both (a page_first page is one span)");
    }
    c.flag = "--page-bytes";
    for (size_t i = 0; i < p->nsizes; i++) {
        if (p->sizes[i] > p->total_mb * 1048576ull)
            return cli_error(&c, "%" PRIu64 " B is more than --total-mb %" PRIu64, p->sizes[i], p->total_mb);
        if (p->layout != 0 && p->sizes[i] % p->layers)
            return cli_error(&c, "%" PRIu64 " B is not a multiple of --layers %" PRIu64 " (layer_first)", p->sizes[i], p->layers);
    }
    double mem = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (2.0 * (double)p->total_mb * 1048576.0 > 0.6 * mem) {
        c.flag = "--total-mb";
        return cli_error(&c, "two tiers of %" PRIu64 " MiB are more than 60%% of this machine's %.1f GiB", p->total_mb,
                         mem / 1073741824.0);
    }
    return 0;
}

/* Pins this thread, and so the workers it starts, to --cpus: each must be
 * one this process may run on now. */
static int pin(const params_t *p) {
    if (p->ncpus == 0) return 0;
    cpu_set_t allowed, set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) CPU_ZERO(&allowed);
    for (size_t i = 0; i < p->ncpus; i++) {
        if (!CPU_ISSET((int)p->cpus[i], &allowed)) {
            char list[256] = "";
            size_t at = 0;
            for (int c = 0; c < CPU_SETSIZE && at < sizeof(list) - 16; c++)
                if (CPU_ISSET(c, &allowed)) at += (size_t)snprintf(list + at, sizeof(list) - at, at ? ",%d" : "%d", c);
            fprintf(stderr, "kvtier bench xfer: --cpus: CPU %" PRIu64 " is not one this process may run on (allowed: %s)\n",
                    p->cpus[i], list);
            return 2;
        }
        CPU_SET((int)p->cpus[i], &set);
    }
    if (sched_setaffinity(0, sizeof(set), &set) == 0) return 0;
    perror("kvtier bench xfer: --cpus");
    return 2;
}

/* The machine's single-thread copy limit for these bytes: the better reference. */
static double best_of(const result_t *r) { return r->memcpy_gbps > r->stream_gbps ? r->memcpy_gbps : r->stream_gbps; }

static void print(const params_t *p, const result_t *r, size_t n) {
    if (p->json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "total_mb", (double)p->total_mb);
        cJSON_AddNumberToObject(o, "threads", (double)p->threads);
        cJSON_AddNumberToObject(o, "copy_streams", (double)kvt_xfer_copy_streams());
        cJSON_AddNumberToObject(o, "reps", (double)p->reps);
        cJSON_AddNumberToObject(o, "layers", (double)p->layers);
        cJSON_AddStringToObject(o, "cuda_copy", CUDA_COPIES[p->cuda_copy]);
        cJSON_AddBoolToObject(o, "checksum", p->checksum);
        cJSON_AddNumberToObject(o, "cpus", (double)sysconf(_SC_NPROCESSORS_ONLN));
        cJSON *pinned = cJSON_AddArrayToObject(o, "pinned_cpus"); /* the mask read back; empty: not pinned */
        cpu_set_t set;
        if (p->ncpus && sched_getaffinity(0, sizeof(set), &set) == 0)
            for (int c = 0; c < CPU_SETSIZE; c++)
                if (CPU_ISSET(c, &set)) cJSON_AddItemToArray(pinned, cJSON_CreateNumber(c));
        cJSON *arr = cJSON_AddArrayToObject(o, "results");
        for (size_t i = 0; i < n; i++) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddNumberToObject(x, "page_bytes", (double)r[i].page_bytes);
            cJSON_AddStringToObject(x, "l1", L1S[r[i].l1]);
            cJSON_AddStringToObject(x, "layout", LAYOUTS[r[i].layout]);
            cJSON_AddNumberToObject(x, "layers", r[i].layout == KVT_LAYOUT_LAYER_FIRST ? (double)p->layers : 1);
            cJSON_AddStringToObject(x, "pattern", PATTERNS[r[i].pattern]);
            cJSON_AddStringToObject(x, "direction", DIRS[r[i].dir]);
            cJSON_AddNumberToObject(x, "gbps", r[i].gbps);
            cJSON_AddNumberToObject(x, "memcpy_gbps", r[i].memcpy_gbps);
            cJSON_AddNumberToObject(x, "ratio", r[i].memcpy_gbps > 0 ? r[i].gbps / r[i].memcpy_gbps : 0);
            cJSON_AddNumberToObject(x, "stream_gbps", r[i].stream_gbps);
            cJSON_AddNumberToObject(x, "best_gbps", best_of(&r[i]));
            cJSON_AddNumberToObject(x, "best_ratio", best_of(&r[i]) > 0 ? r[i].gbps / best_of(&r[i]) : 0);
            cJSON_AddNumberToObject(x, "best_ratio_paired", r[i].paired);
            cJSON_AddNumberToObject(x, "best_ratio_paired_min", r[i].paired_min);
            cJSON_AddNumberToObject(x, "best_ratio_paired_max", r[i].paired_max);
            cJSON_AddNumberToObject(x, "runs_per_page", r[i].runs_per_page);
            cJSON_AddNumberToObject(x, "gbps_min", r[i].gbps_min);
            cJSON_AddNumberToObject(x, "gbps_max", r[i].gbps_max);
            cJSON_AddNumberToObject(x, "item_p99_ms", r[i].p99_ms);
            cJSON_AddItemToArray(arr, x);
        }
        cli_print_json(o);
        return;
    }
    printf("kvtier bench xfer: %" PRIu64 " MiB per run, %" PRIu64 " worker(s) per destination, median of %" PRIu64
           " runs%s%s; long copies stream as %u stream(s) of lines\n",
           p->total_mb, p->threads, p->reps, p->checksum ? ", checksums on" : "", p->ncpus ? ", pinned (--cpus)" : "",
           kvt_xfer_copy_streams());
    printf("%10s %-10s %-11s %-10s %-4s %9s %9s %9s %7s %7s %10s\n", "page B", "l1", "layout", "pattern", "dir", "GB/s",
           "memcpy", "stream", "ratio", "vs best", "runs/page");
    for (size_t i = 0; i < n; i++)
        printf("%10" PRIu64 " %-10s %-11s %-10s %-4s %9.2f %9.2f %9.2f %7.3f %7.3f %10.4f\n", r[i].page_bytes, L1S[r[i].l1],
               LAYOUTS[r[i].layout], PATTERNS[r[i].pattern], DIRS[r[i].dir], r[i].gbps, r[i].memcpy_gbps, r[i].stream_gbps,
               r[i].memcpy_gbps > 0 ? r[i].gbps / r[i].memcpy_gbps : 0, best_of(&r[i]) > 0 ? r[i].gbps / best_of(&r[i]) : 0,
               r[i].runs_per_page);
}

int cmd_bench_xfer(int argc, char **argv) {
    params_t p;
    int rc = parse(argc, argv, &p);
    if (rc) return rc > 0 ? 0 : 2;
    if (cli_parse_only) return 0;
    if ((rc = pin(&p)) != 0) return rc;
    result_t *res = calloc(p.nsizes * NL1 * 2 * 2 * 2, sizeof(result_t));
    if (res == NULL) return 1;
    size_t n = 0;
    for (int l = 0; l < 2 && rc == 0; l++) {
        if (p.layout != 2 && p.layout != l) continue;
        for (int pat = 0; pat < 2 && rc == 0; pat++) {
            if (p.pattern != 2 && p.pattern != pat) continue;
            for (size_t i = 0; i < p.nsizes && rc == 0; i++)
                for (int k = 0; L1S[k] && rc == 0; k++) {
                    if (k == NL1 || (p.l1 == NL1 ? k > NL1 : p.l1 != k)) continue; /* all: the host L1s */
                    rc = bench_one(&p, p.sizes[i], k, l, pat, &res[n]);
                    n += 2;
                }
        }
    }
    if (rc == 0) print(&p, res, n);
    free(res);
    return rc == 0 ? 0 : 1;
}
