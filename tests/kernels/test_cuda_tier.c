/* The L1 `cuda` tier on a real GPU: bytes through cudaMalloc memory and the
 * transfer engine's stream copies (cudaMemcpyBatchAsync on CUDA 13), in both
 * layouts and both directions, checked against the content model
 * (kvt_pattern_fill), and the cache's data plane with a cuda L1. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdlib.h>

#include "kvtier/testing.h"
#include "kvtier/cache.h"
#include "kvtier/error.h"
#include "kvtier/tier.h"
#include "kvtier/xfer.h"
#include "tier/cuda-copy-int.h" /* kvt__cuda_kernel_spans */

#define PAGES 256
#define LAYERS 4
#define LB 4096

/* flags: the L1's copy way (0: by the spans' sizes; KVT_TIER_COPY_DMA; KVT_TIER_COPY_KERNEL). */
static void roundtrip(kvt_layout_t l1_layout, kvt_layout_t l2_layout, uint32_t threads, uint32_t flags) {
    kvt_tier_t *t[3];
    uint64_t kernel0 = kvt__cuda_kernel_spans();
    kvt_tier_config_t c = {.size = sizeof(c), .kind = KVT_TIER_CUDA, .name = "gpu", .flags = flags,
                           .geom = {PAGES, LAYERS, LB, l1_layout}};
    cr_assert_eq(kvt_tier_create(&t[0], &c), KVT_OK, "cudaMalloc");
    c = (kvt_tier_config_t){.size = sizeof(c), .kind = KVT_TIER_HOST, .name = "host", .flags = KVT_TIER_CHECKSUM,
                            .geom = {PAGES, LAYERS, LB, l2_layout}};
    cr_assert_eq(kvt_tier_create(&t[1], &c), KVT_OK);
    c.name = "host2";
    cr_assert_eq(kvt_tier_create(&t[2], &c), KVT_OK);
    kvt_xfer_config_t xc;
    kvt_xfer_config_default(&xc);
    xc.threads = threads;
    xc.max_batch_bytes = 16 * LAYERS * LB;
    kvt_xfer_t *x;
    cr_assert_eq(kvt_xfer_create(&x, &xc, t, 3), KVT_OK);
    uint8_t *buf = malloc(LB);
    /* host -> GPU in runs and scattered pages, then GPU -> another host tier */
    for (uint32_t p = 0; p < PAGES; p++)
        for (uint32_t l = 0; l < LAYERS; l++) {
            kvt_pattern_fill(kvt_tier_addr(t[1], p, l), LB, p, 77, l);
        }
    kvt_xfer_copy_t cp[PAGES];
    for (uint32_t p = 0; p < PAGES; p++) cp[p] = (kvt_xfer_copy_t){p, p < PAGES / 2 ? p : (PAGES - 1 - p) + PAGES / 2};
    kvt_xfer_done_t d;
    /* sums for the source pages, so that the H2D check passes */
    uint64_t *sums = kvt_tier_sums(t[1]);
    for (uint32_t p = 0; p < PAGES; p++) sums[p] = kvt_tier_page_sum(t[1], p);
    cr_assert_eq(kvt_xfer_submit(x, 1, 0, cp, PAGES, 1, NULL), KVT_OK);
    cr_assert_eq(kvt_xfer_poll(x, &d, 1, 10000000000ull), 1);
    cr_assert_eq(d.status, KVT_OK);
    for (uint32_t p = 0; p < PAGES; p++) {
        uint32_t dst = cp[p].dst_page;
        for (uint32_t l = 0; l < LAYERS; l++) {
            cr_assert_eq(kvt_tier_read(t[0], dst, l, buf), KVT_OK);
            cr_assert(kvt_pattern_check(buf, LB, p, 77, l), "GPU page %u layer %u", dst, l);
        }
    }
    for (uint32_t p = 0; p < PAGES; p++) cp[p] = (kvt_xfer_copy_t){p, p};
    cr_assert_eq(kvt_xfer_submit(x, 0, 2, cp, PAGES, 2, NULL), KVT_OK);
    cr_assert_eq(kvt_xfer_poll(x, &d, 1, 10000000000ull), 1);
    cr_assert_eq(d.status, KVT_OK);
    for (uint32_t p = 0; p < PAGES; p++) {
        uint32_t src = p < PAGES / 2 ? p : (PAGES - 1 - p) + PAGES / 2; /* the host page that went to GPU page p */
        for (uint32_t l = 0; l < LAYERS; l++)
            cr_assert(kvt_pattern_check(kvt_tier_addr(t[2], p, l), LB, src, 77, l), "host page %u layer %u", p, l);
        cr_assert_eq(kvt_tier_sums(t[2])[p], kvt_tier_page_sum(t[2], p));
    }
    kvt_xfer_stats_t st = {.size = sizeof(st)};
    cr_assert_eq(kvt_xfer_stats(x, 1, 0, &st), KVT_OK);
    cr_assert_eq(st.pages, PAGES);
    uint64_t by_kernel = kvt__cuda_kernel_spans() - kernel0;
    fprintf(stderr, "cuda tier %s/%s, %s: H2D %.2f GB/s, %" PRIu64 " runs for %d pages, %" PRIu64 " spans by the kernel\n",
            kvt_layout_name(l1_layout), kvt_layout_name(l2_layout),
            flags & KVT_TIER_COPY_DMA ? "dma" : flags & KVT_TIER_COPY_KERNEL ? "kernel" : "auto", st.gbps, st.runs, PAGES,
            by_kernel);
    if (flags & KVT_TIER_COPY_DMA) cr_assert_eq(by_kernel, 0, "KVT_TIER_COPY_DMA: no span by the kernel");
    else cr_assert_gt(by_kernel, 0, "batches of 4 KiB spans go to the kernel");
    free(buf);
    kvt_xfer_destroy(x);
    for (int i = 0; i < 3; i++) kvt_tier_destroy(t[i]);
}

/* Every pair of layouts, each of the three copy ways: the same bytes. */
Test(kernels, cuda_tier_copies_in_every_layout, .timeout = 120) {
    cr_assert(kvt_tier_cuda_built());
    const uint32_t ways[] = {0, KVT_TIER_COPY_DMA, KVT_TIER_COPY_KERNEL};
    for (int w = 0; w < 3; w++)
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 2; b++) roundtrip((kvt_layout_t)a, (kvt_layout_t)b, 1 + (uint32_t)a, ways[w]);
}

/* Spans the kernel's 16-byte path cannot take (odd lengths and offsets):
 * copied a byte a lane, the same bytes as by DMA, the guards around each left
 * alone. An engine-style tier over a cuda tier's memory, pieces of 4,099
 * bytes at odd strides, to and from a host tier. */
Test(kernels, unaligned_spans_by_the_kernel, .timeout = 120) {
    enum { N = 64, PIECE = 4099, STRIDE = 4099 + 13 };
    for (int way = 0; way < 2; way++) {
        kvt_tier_t *owner;
        kvt_tier_config_t c = {.size = sizeof(c), .kind = KVT_TIER_CUDA, .name = "owner", .geom = {1, 1, 8 + (uint64_t)N * STRIDE, KVT_LAYOUT_PAGE_FIRST}};
        cr_assert_eq(kvt_tier_create(&owner, &c), KVT_OK, "cudaMalloc");
        uint8_t *dev = kvt_tier_addr(owner, 0, 0);
        kvt_tier_engine_t e = {.size = sizeof(e), .planes = 1, .device = true,
                               .plane = {{.base = dev + 3, .piece_bytes = PIECE, .page_stride = STRIDE}}};
        kvt_tier_t *t[2];
        c = (kvt_tier_config_t){.size = sizeof(c), .kind = KVT_TIER_ENGINE, .name = "engine", .engine = &e,
                                .flags = way ? KVT_TIER_COPY_KERNEL : KVT_TIER_COPY_DMA, .geom = {N, 1, 0, KVT_LAYOUT_PAGE_FIRST}};
        cr_assert_eq(kvt_tier_create(&t[0], &c), KVT_OK);
        c = (kvt_tier_config_t){.size = sizeof(c), .kind = KVT_TIER_HOST, .name = "host", .geom = {N, 1, PIECE, KVT_LAYOUT_PAGE_FIRST}};
        cr_assert_eq(kvt_tier_create(&t[1], &c), KVT_OK);
        kvt_xfer_config_t xc;
        kvt_xfer_config_default(&xc);
        kvt_xfer_t *x;
        cr_assert_eq(kvt_xfer_create(&x, &xc, t, 2), KVT_OK);
        uint8_t *zero = calloc(1, 8 + (size_t)N * STRIDE), *back = malloc(8 + (size_t)N * STRIDE);
        cr_assert_eq(kvt_tier_write(owner, 0, 0, zero), KVT_OK); /* guards and gaps: zero */
        for (uint32_t p = 0; p < N; p++) kvt_pattern_fill(kvt_tier_addr(t[1], p, 0), PIECE, p, 9, 0);
        kvt_xfer_copy_t cp[N];
        for (uint32_t p = 0; p < N; p++) cp[p] = (kvt_xfer_copy_t){p, (p * 37) % N}; /* scattered */
        uint64_t k0 = kvt__cuda_kernel_spans();
        kvt_xfer_done_t d;
        cr_assert_eq(kvt_xfer_submit(x, 1, 0, cp, N, 1, NULL), KVT_OK);
        cr_assert_eq(kvt_xfer_poll(x, &d, 1, 10000000000ull), 1);
        cr_assert_eq(d.status, KVT_OK);
        cr_assert_eq(kvt__cuda_kernel_spans() - k0, way ? (uint64_t)N : 0, "the way asked for");
        cr_assert_eq(kvt_tier_read(owner, 0, 0, back), KVT_OK);
        for (uint32_t p = 0; p < N; p++) {
            uint32_t at = (p * 37) % N;
            cr_assert(kvt_pattern_check(back + 3 + (size_t)at * STRIDE, PIECE, p, 9, 0), "%s: piece %u", way ? "kernel" : "dma", at);
            for (uint32_t g = PIECE; g < STRIDE && 3 + (size_t)at * STRIDE + g < 8 + (size_t)N * STRIDE; g++)
                cr_assert_eq(back[3 + (size_t)at * STRIDE + g], 0, "%s: a gap byte after piece %u written", way ? "kernel" : "dma", at);
        }
        cr_assert_eq(back[0] | back[1] | back[2], 0, "the guard before the first piece");
        /* and back: device -> host, into a cleared host tier */
        memset(kvt_tier_addr(t[1], 0, 0), 0, (size_t)N * PIECE);
        for (uint32_t p = 0; p < N; p++) cp[p] = (kvt_xfer_copy_t){(p * 37) % N, p};
        cr_assert_eq(kvt_xfer_submit(x, 0, 1, cp, N, 2, NULL), KVT_OK);
        cr_assert_eq(kvt_xfer_poll(x, &d, 1, 10000000000ull), 1);
        cr_assert_eq(d.status, KVT_OK);
        for (uint32_t p = 0; p < N; p++)
            cr_assert(kvt_pattern_check(kvt_tier_addr(t[1], p, 0), PIECE, p, 9, 0), "%s: back, page %u", way ? "kernel" : "dma", p);
        free(zero);
        free(back);
        kvt_xfer_destroy(x);
        kvt_tier_destroy(t[0]);
        kvt_tier_destroy(t[1]);
        kvt_tier_destroy(owner);
    }
}

/* The cache's data plane over an L1 of kind `l1_kind`: 400 requests of 9
 * families of 4-15 pages (a footprint of up to 135 pages: over L1's 64, within
 * L1 + L2's 160, so pages leave L1 for L2 and come back). Every page a request
 * finds is checked byte for byte in L1 (from the GPU, for a cuda L1); the hits
 * in each tier are returned. */
typedef struct { uint64_t l1_hits, l2_loads; } cache_run_t;

static cache_run_t cache_run(kvt_tier_kind_t l1_kind) {
    enum { L1 = 64, L2 = 96, PT = 4, FAMILIES = 9 };
    kvt_tier_t *t[2];
    kvt_tier_config_t c = {.size = sizeof(c), .kind = l1_kind, .name = "l1", .geom = {L1, 2, 256, KVT_LAYOUT_LAYER_FIRST}};
    cr_assert_eq(kvt_tier_create(&t[0], &c), KVT_OK);
    c = (kvt_tier_config_t){.size = sizeof(c), .kind = KVT_TIER_HOST, .name = "l2", .flags = KVT_TIER_CHECKSUM,
                            .geom = {L2, 2, 256, KVT_LAYOUT_PAGE_FIRST}};
    cr_assert_eq(kvt_tier_create(&t[1], &c), KVT_OK);
    kvt_xfer_config_t xc;
    kvt_xfer_config_default(&xc);
    kvt_xfer_t *x;
    cr_assert_eq(kvt_xfer_create(&x, &xc, t, 2), KVT_OK);
    kvt_cache_config_t cc;
    kvt_cache_config_default(&cc);
    cc.page_tokens = PT;
    cc.l1_pages = L1;
    cc.l2_pages = L2;
    kvt_cache_t *cache;
    cr_assert_eq(kvt_cache_create(&cache, &cc), KVT_OK);
    cr_assert_eq(kvt_cache_attach(cache, x, t[0], 0, t[1], 1), KVT_OK);
    int32_t tok[16 * PT];
    uint32_t ids[16];
    uint8_t buf[256];
    cache_run_t out = {0, 0};
    for (int r = 0; r < 400; r++) {
        uint32_t fam = (uint32_t)(r * 7 % FAMILIES), n = 4 + (uint32_t)(r % 12);
        for (uint32_t i = 0; i < n * PT; i++) tok[i] = (int32_t)(fam * 1000 + i);
        kvt_cache_req_t req;
        cr_assert_eq(kvt_cache_admit(cache, 0, tok, n * PT, 0, ids, &req), KVT_OK);
        kvt_hash128_t h[16];
        kvt_page_hash_chain(0, tok, req.pages, PT, h);
        for (uint64_t j = 0; j < req.pages; j++) {
            if (j < req.pages - req.new_pages)
                cr_assert(kvt_tier_pattern_check(t[0], ids[j], h[j].lo, h[j].hi, buf), "%s L1: request %d page %" PRIu64,
                          kvt_tier_kind_name(l1_kind), r, j);
            else
                cr_assert_eq(kvt_tier_pattern_fill(t[0], ids[j], h[j].lo, h[j].hi, buf), KVT_OK);
        }
        out.l2_loads += req.l2_hit_pages;
        out.l1_hits += req.pages - req.new_pages - req.l2_hit_pages;
        cr_assert_eq(kvt_cache_release(cache, &req), KVT_OK);
    }
    const char *why;
    cr_assert_eq(kvt_cache_check(cache, &why), KVT_OK, "%s", why);
    kvt_cache_destroy(cache);
    kvt_xfer_destroy(x);
    kvt_tier_destroy(t[0]);
    kvt_tier_destroy(t[1]);
    return out;
}

/* The model: the same requests over a host (arena) L1. Where a page lives is
 * the cache's decision, not the tier's: a cuda L1 hits and loads exactly as
 * often, and pages do come back from L2 through the GPU copies. */
Test(kernels, cache_with_a_cuda_l1, .timeout = 120) {
    cache_run_t gpu = cache_run(KVT_TIER_CUDA), host = cache_run(KVT_TIER_ARENA);
    fprintf(stderr, "cache with a cuda L1: %" PRIu64 " L1 hits, %" PRIu64 " pages loaded from L2 (arena L1: %" PRIu64
                    ", %" PRIu64 ")\n", gpu.l1_hits, gpu.l2_loads, host.l1_hits, host.l2_loads);
    cr_assert_gt(gpu.l2_loads, 0, "some pages came back from L2 through the GPU copies");
    cr_assert_eq(gpu.l2_loads, host.l2_loads, "L2 loads: a cuda L1 %" PRIu64 ", an arena L1 %" PRIu64, gpu.l2_loads,
                 host.l2_loads);
    cr_assert_eq(gpu.l1_hits, host.l1_hits, "L1 hits: a cuda L1 %" PRIu64 ", an arena L1 %" PRIu64, gpu.l1_hits,
                 host.l1_hits);
}

/* An engine tier on device memory: GPU memory the "engine" owns (here a cuda
 * tier's cudaMalloc'ed block, so the test needs no CUDA runtime of its own),
 * described like vLLM's per-layer [2, blocks, ...] tensors, through the
 * cuda copies both ways against a page_first and a layer_first host tier,
 * checked with the content pattern page by page and layer by layer. */
Test(kernels, engine_tier_on_device_memory, .timeout = 120) {
    enum { BLOCKS = 64, EL = 4, PIECE = 2048 }; /* one block of K (or V) in one layer */
    kvt_tier_t *owner;
    kvt_tier_config_t c = {.size = sizeof(c), .kind = KVT_TIER_CUDA, .name = "owner",
                           .geom = {1, 1, (uint64_t)EL * 2 * BLOCKS * PIECE, KVT_LAYOUT_PAGE_FIRST}};
    cr_assert_eq(kvt_tier_create(&owner, &c), KVT_OK, "cudaMalloc");
    uint8_t *dev = kvt_tier_addr(owner, 0, 0);
    void *k[EL], *v[EL];
    for (int l = 0; l < EL; l++) {
        k[l] = dev + (size_t)l * 2 * BLOCKS * PIECE;
        v[l] = (uint8_t *)k[l] + (size_t)BLOCKS * PIECE;
    }
    kvt_tier_engine_t e = {.size = sizeof(e), .planes = 2, .device = true,
                           .plane = {{.layer_base = k, .piece_bytes = PIECE, .page_stride = PIECE},
                                     {.layer_base = v, .piece_bytes = PIECE, .page_stride = PIECE}}};
    for (int lay = 0; lay < 2; lay++) {
        kvt_tier_t *t[3];
        c = (kvt_tier_config_t){.size = sizeof(c), .kind = KVT_TIER_ENGINE, .name = "engine", .engine = &e,
                                .geom = {BLOCKS, EL, 0, KVT_LAYOUT_PAGE_FIRST}};
        cr_assert_eq(kvt_tier_create(&t[0], &c), KVT_OK);
        cr_assert_not(kvt_tier_host_visible(t[0]));
        c = (kvt_tier_config_t){.size = sizeof(c), .kind = KVT_TIER_HOST, .name = "host",
                                .geom = {BLOCKS, EL, 2 * PIECE, (kvt_layout_t)lay}};
        cr_assert_eq(kvt_tier_create(&t[1], &c), KVT_OK);
        c.name = "host2";
        cr_assert_eq(kvt_tier_create(&t[2], &c), KVT_OK);
        kvt_xfer_config_t xc;
        kvt_xfer_config_default(&xc);
        kvt_xfer_t *x;
        cr_assert_eq(kvt_xfer_create(&x, &xc, t, 3), KVT_OK);
        uint8_t buf[2 * PIECE];
        for (uint32_t p = 0; p < BLOCKS; p++)
            for (uint32_t l = 0; l < EL; l++) kvt_pattern_fill(kvt_tier_addr(t[1], p, l), 2 * PIECE, p, 5, l);
        kvt_xfer_copy_t cp[BLOCKS];
        for (uint32_t p = 0; p < BLOCKS; p++) cp[p] = (kvt_xfer_copy_t){p, p < BLOCKS / 2 ? p : (BLOCKS - 1 - p) + BLOCKS / 2};
        kvt_xfer_done_t d;
        cr_assert_eq(kvt_xfer_submit(x, 1, 0, cp, BLOCKS, 1, NULL), KVT_OK);
        cr_assert_eq(kvt_xfer_poll(x, &d, 1, 10000000000ull), 1);
        cr_assert_eq(d.status, KVT_OK);
        for (uint32_t p = 0; p < BLOCKS; p++)
            for (uint32_t l = 0; l < EL; l++) { /* through the tier (gathering K and V) and the planes' own addresses */
                cr_assert_eq(kvt_tier_read(t[0], cp[p].dst_page, l, buf), KVT_OK);
                cr_assert(kvt_pattern_check(buf, sizeof(buf), p, 5, l), "engine block %u layer %u", cp[p].dst_page, l);
                cr_assert_eq(kvt_tier_plane_addr(t[0], 1, cp[p].dst_page, l), (uint8_t *)v[l] + (size_t)cp[p].dst_page * PIECE);
            }
        for (uint32_t p = 0; p < BLOCKS; p++) cp[p] = (kvt_xfer_copy_t){p, p};
        cr_assert_eq(kvt_xfer_submit(x, 0, 2, cp, BLOCKS, 2, NULL), KVT_OK);
        cr_assert_eq(kvt_xfer_poll(x, &d, 1, 10000000000ull), 1);
        cr_assert_eq(d.status, KVT_OK);
        for (uint32_t p = 0; p < BLOCKS; p++) {
            uint32_t src = p < BLOCKS / 2 ? p : (BLOCKS - 1 - p) + BLOCKS / 2;
            for (uint32_t l = 0; l < EL; l++)
                cr_assert(kvt_pattern_check(kvt_tier_addr(t[2], p, l), 2 * PIECE, src, 5, l), "host page %u layer %u", p, l);
        }
        kvt_xfer_stats_t st = {.size = sizeof(st)};
        cr_assert_eq(kvt_xfer_stats(x, 0, 2, &st), KVT_OK);
        cr_assert_eq(st.copies, 2ull * BLOCKS * EL, "K and V apart: one copy per page, layer and plane");
        fprintf(stderr, "engine tier on device %s: D2H %.2f GB/s\n", kvt_layout_name((kvt_layout_t)lay), st.gbps);
        kvt_xfer_destroy(x);
        for (int i = 0; i < 3; i++) kvt_tier_destroy(t[i]);
    }
    kvt_tier_destroy(owner); /* the engine's memory: freed by its owner, after the engine tiers */
}
