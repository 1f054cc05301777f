/* Engine tiers through the transfer engine, byte for byte.
 *
 * For each engine layout of tests/common/engine_model.h (vLLM FlashAttention,
 * FlashInfer as one plane and as two, SGLang with V's head dim unlike K's,
 * MLA with one base and a layer stride, padded page strides, a page-major
 * engine), over a page_first and a layer_first host tier, with contiguous and
 * scattered page lists:
 *
 *   1. every element of the engine's memory holds bytes hashed from its
 *      model coordinates (layer, kv, block, slot, head, dim, byte);
 *   2. engine -> host through kvt_xfer_submit/poll; every byte of the host
 *      tier is checked against an image built from the model alone (the
 *      element's logical offset in the page, the host layout's formula);
 *   3. host -> a second engine buffer (every byte, padding included, a
 *      sentinel) and every byte of it against the model: copied blocks hold
 *      the first buffer's elements, every other byte the sentinel;
 *   4. runs, copies and items against a model of the coalescing each pair
 *      must give (one span per layer where both sides are contiguous).
 *
 * Also: the copy cap cutting engine runs, and engine to engine across
 * layouts that cut a layer differently.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/engine_model.h"
#include "kvtier/rng.h"
#include "kvtier/error.h"
#include "kvtier/tier.h"
#include "kvtier/xfer.h"

#define HOST_PAGES 20
#define HOST_FILL 0x5c
#define ENGINE_FILL 0xe7

/* Offset of logical (page, layer) in a host tier, the formulas of tier.h. */
static size_t host_off(kvt_layout_t lay, size_t pages, size_t layers, size_t lb, size_t page, size_t layer) {
    return lay == KVT_LAYOUT_PAGE_FIRST ? (page * layers + layer) * lb : (layer * pages + page) * lb;
}

/* Sorted by destination, a copy joins the run before it when both pages
 * advance by one (xfer.h); returns the runs and their lengths. */
static size_t model_runs(const kvt_xfer_copy_t *c0, size_t n, uint32_t *len) {
    kvt_xfer_copy_t *c = malloc(n * sizeof(*c));
    memcpy(c, c0, n * sizeof(*c));
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && c[j - 1].dst_page > c[j].dst_page; j--) {
            kvt_xfer_copy_t t = c[j];
            c[j] = c[j - 1];
            c[j - 1] = t;
        }
    size_t runs = 0;
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && c[i].dst_page == c[i - 1].dst_page + 1 && c[i].src_page == c[i - 1].src_page + 1) len[runs - 1]++;
        else len[runs++] = 1;
    }
    free(c);
    return runs;
}

/* Spans a run of k pages takes between this engine and a host tier, either
 * way: one per layer where a layer's run is one block on both sides, one per
 * page where a page is one block on both, else one per page, layer and
 * piece the two sides do not share. */
static uint64_t model_spans(const em_shape_t *sh, kvt_layout_t host, uint64_t k) {
    uint64_t L = sh->layers;
    switch (sh->kind) {
    case EM_FLASHINFER:
    case EM_FLASHINFER2: /* K and V of a block together; blocks back to back */
    case EM_MLA:
        return host == KVT_LAYOUT_LAYER_FIRST ? L : k * L;
    case EM_PAGE_MAJOR: /* a block is [layers][K V]: the page_first order itself */
        return host == KVT_LAYOUT_PAGE_FIRST ? 1 : k * L;
    default: /* K and V apart (vLLM, SGLang), or padded */
        return 2 * k * L;
    }
}

typedef struct pair_env {
    const em_shape_t *sh;
    kvt_layout_t lay;
    em_mem_t m1, m2;
    em_ptrs_t p1, p2;
    kvt_tier_t *t[3]; /* engine 1, host, engine 2 */
    kvt_xfer_t *x;
    size_t lb;
} pair_env_t;

static kvt_tier_t *engine_tier(const em_shape_t *sh, em_mem_t *m, em_ptrs_t *pp, const char *name) {
    kvt_tier_engine_t e;
    describe(sh, m, pp, &e);
    kvt_tier_config_t c = em_config(sh, &e);
    c.name = name;
    kvt_tier_t *t = NULL;
    int rc = kvt_tier_create(&t, &c);
    cr_assert_eq(rc, KVT_OK, "%s: %s", sh->name, kvt_err_name(rc));
    return t;
}

static void pe_init(pair_env_t *pe, const em_shape_t *sh, kvt_layout_t lay, uint32_t max_copies) {
    memset(pe, 0, sizeof(*pe));
    pe->sh = sh;
    pe->lay = lay;
    pe->lb = em_layer_bytes(sh);
    em_alloc(sh, &pe->m1, 0x01);
    em_alloc(sh, &pe->m2, ENGINE_FILL);
    for (uint32_t b = 0; b < sh->blocks; b++) em_fill_block(sh, &pe->m1, b, b, 42);
    pe->t[0] = engine_tier(sh, &pe->m1, &pe->p1, "engine");
    pe->t[2] = engine_tier(sh, &pe->m2, &pe->p2, "engine2");
    kvt_tier_config_t c;
    memset(&c, 0, sizeof(c));
    c.size = sizeof(c);
    c.kind = KVT_TIER_HOST;
    c.geom = (kvt_geom_t){HOST_PAGES, sh->layers, pe->lb, lay};
    c.name = "host";
    cr_assert_eq(kvt_tier_create(&pe->t[1], &c), KVT_OK);
    memset(kvt_tier_addr(pe->t[1], 0, 0), HOST_FILL, (size_t)HOST_PAGES * sh->layers * pe->lb);
    kvt_xfer_config_t xc;
    kvt_xfer_config_default(&xc);
    if (max_copies) xc.max_batch_copies = max_copies;
    int rc = kvt_xfer_create(&pe->x, &xc, pe->t, 3);
    cr_assert_eq(rc, KVT_OK, "%s", kvt_err_name(rc));
}

static void pe_fini(pair_env_t *pe) {
    kvt_xfer_destroy(pe->x);
    for (int i = 0; i < 3; i++) kvt_tier_destroy(pe->t[i]);
    em_free(&pe->m1);
    em_free(&pe->m2);
}

static void run_batch(pair_env_t *pe, unsigned src, unsigned dst, const kvt_xfer_copy_t *c, size_t n) {
    cr_assert_eq(kvt_xfer_submit(pe->x, src, dst, c, n, 7, NULL), KVT_OK);
    kvt_xfer_done_t d;
    cr_assert_eq(kvt_xfer_poll(pe->x, &d, 1, 10000000000ull), 1);
    cr_assert_eq(d.status, KVT_OK, "%s", kvt_err_name(d.status));
}

static void check_pair_stats(pair_env_t *pe, unsigned src, unsigned dst, const kvt_xfer_copy_t *c, size_t n,
                             const char *ctx) {
    uint32_t *len = calloc(n, sizeof(*len));
    size_t runs = model_runs(c, n, len);
    uint64_t spans = 0;
    for (size_t r = 0; r < runs; r++) spans += model_spans(pe->sh, pe->lay, len[r]);
    kvt_xfer_stats_t st = {.size = sizeof(st)};
    cr_assert_eq(kvt_xfer_stats(pe->x, src, dst, &st), KVT_OK);
    cr_assert_eq(st.batches, 1, "%s", ctx);
    cr_assert_eq(st.pages, n, "%s", ctx);
    cr_assert_eq(st.runs, runs, "%s: runs %" PRIu64 ", model %zu", ctx, st.runs, runs);
    cr_assert_eq(st.copies, spans, "%s: copies %" PRIu64 ", model %" PRIu64, ctx, st.copies, spans);
    cr_assert_eq(st.bytes, n * pe->sh->layers * pe->lb, "%s", ctx);
    cr_assert_geq(st.items, 1, "%s", ctx);
    free(len);
}

/* One case: `copies` (engine block -> host page) out, then back with the
 * pairs reversed into the second engine buffer. */
static void roundtrip(const em_shape_t *sh, kvt_layout_t lay, const kvt_xfer_copy_t *copies, size_t n, const char *pat) {
    char ctx[128];
    snprintf(ctx, sizeof(ctx), "%s %s %s", sh->name, kvt_layout_name(lay), pat);
    pair_env_t pe;
    pe_init(&pe, sh, lay, 0);
    run_batch(&pe, 0, 1, copies, n);
    check_pair_stats(&pe, 0, 1, copies, n, ctx);

    /* the host tier, every byte, against the model's image */
    size_t hbytes = (size_t)HOST_PAGES * sh->layers * pe.lb;
    uint8_t *want = malloc(hbytes);
    memset(want, HOST_FILL, hbytes);
    for (size_t c = 0; c < n; c++) {
        uint32_t b = copies[c].src_page, hp = copies[c].dst_page;
        EM_FOR_BYTES(sh, l, kv, s, h, d, i)
        want[host_off(lay, HOST_PAGES, sh->layers, pe.lb, hp, l) + model_lofs(sh, kv, s, h, d) + i] =
            model_byte(42, l, kv, b, s, h, d, i);
    }
    const uint8_t *host = kvt_tier_addr(pe.t[1], 0, 0);
    if (memcmp(host, want, hbytes) != 0) {
        size_t at = 0;
        while (host[at] == want[at]) at++;
        cr_assert_fail("%s: host byte %zu (page-layer piece %zu, offset %zu) is %#x, the model says %#x", ctx, at,
                       at / pe.lb, at % pe.lb, host[at], want[at]);
    }
    free(want);

    /* back: host page -> the engine block it came from, into the second buffer */
    kvt_xfer_copy_t *back = malloc(n * sizeof(*back));
    for (size_t c = 0; c < n; c++) back[c] = (kvt_xfer_copy_t){copies[c].dst_page, copies[c].src_page};
    run_batch(&pe, 1, 2, back, n);
    check_pair_stats(&pe, 1, 2, back, n, ctx);
    em_mem_t exp;
    em_alloc(sh, &exp, ENGINE_FILL);
    for (size_t c = 0; c < n; c++) em_fill_block(sh, &exp, copies[c].src_page, copies[c].src_page, 42);
    for (unsigned i = 0; i < exp.n; i++)
        if (memcmp(pe.m2.buf[i], exp.buf[i], exp.len[i]) != 0) {
            size_t at = 0;
            while (pe.m2.buf[i][at] == exp.buf[i][at]) at++;
            cr_assert_fail("%s: second engine buffer %u byte %zu is %#x, the model says %#x", ctx, i, at,
                           pe.m2.buf[i][at], exp.buf[i][at]);
        }
    /* the source engine buffer is as it was */
    em_mem_t orig;
    em_alloc(sh, &orig, 0x01);
    for (uint32_t b = 0; b < sh->blocks; b++) em_fill_block(sh, &orig, b, b, 42);
    for (unsigned i = 0; i < orig.n; i++) cr_assert(memcmp(pe.m1.buf[i], orig.buf[i], orig.len[i]) == 0, "%s: source", ctx);
    em_free(&orig);
    em_free(&exp);
    free(back);
    pe_fini(&pe);
}

static void every_pattern(const em_shape_t *sh, kvt_layout_t lay, uint64_t seed) {
    kvt_xfer_copy_t c[64];
    size_t n = 0;
    /* contiguous: two runs, blocks 1..7 -> host 3..9 and 8..11 -> host 14..17 */
    for (uint32_t b = 1; b < 8; b++) c[n++] = (kvt_xfer_copy_t){b, b + 2};
    for (uint32_t b = 8; b < 12; b++) c[n++] = (kvt_xfer_copy_t){b, b + 6};
    roundtrip(sh, lay, c, n, "contiguous");
    /* one run of every block */
    n = 0;
    for (uint32_t b = 0; b < sh->blocks; b++) c[n++] = (kvt_xfer_copy_t){b, b + 4};
    roundtrip(sh, lay, c, n, "one run");
    /* scattered: about 3/4 of the blocks, each to a random host page */
    kvt_rng_t r;
    kvt_rng_seed(&r, seed);
    fprintf(stderr, "xfer engine %s %s: seed=%" PRIu64 "\n", sh->name, kvt_layout_name(lay), seed);
    uint32_t perm[HOST_PAGES];
    for (uint32_t i = 0; i < HOST_PAGES; i++) perm[i] = i;
    for (uint32_t i = HOST_PAGES; i > 1; i--) {
        uint32_t j = (uint32_t)kvt_rng_below(&r, i), t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
    n = 0;
    for (uint32_t b = 0; b < sh->blocks; b++)
        if (kvt_rng_below(&r, 4) != 0) c[n++] = (kvt_xfer_copy_t){b, perm[b]};
    roundtrip(sh, lay, c, n, "scattered");
}

static void layout_case(em_kind_t k) {
    every_pattern(&EM_SHAPES[k], KVT_LAYOUT_PAGE_FIRST, 100 + (uint64_t)k);
    every_pattern(&EM_SHAPES[k], KVT_LAYOUT_LAYER_FIRST, 200 + (uint64_t)k);
}

Test(xfer_engine, vllm_flash_attention) { layout_case(EM_VLLM_FA); }
Test(xfer_engine, flashinfer_one_plane) { layout_case(EM_FLASHINFER); }
Test(xfer_engine, flashinfer_two_planes_fuse) { layout_case(EM_FLASHINFER2); }
Test(xfer_engine, sglang_v_head_dim_differs) { layout_case(EM_SGLANG); }
Test(xfer_engine, mla_one_base_layer_stride) { layout_case(EM_MLA); }
Test(xfer_engine, padded_page_strides) { layout_case(EM_PADDED); }
Test(xfer_engine, page_major_engine) { layout_case(EM_PAGE_MAJOR); }

/* Item cutting holds for engine pairs: with the copy cap at one page's
 * copies, every item is one page and the bytes are still right. */
Test(xfer_engine, copy_cap_cuts_engine_runs) {
    const em_shape_t *sh = &EM_SHAPES[EM_SGLANG];
    pair_env_t pe;
    uint32_t per_page = 2 * sh->layers;
    pe_init(&pe, sh, KVT_LAYOUT_LAYER_FIRST, per_page);
    kvt_xfer_copy_t c[12];
    for (uint32_t b = 0; b < 12; b++) c[b] = (kvt_xfer_copy_t){b, b};
    run_batch(&pe, 0, 1, c, 12);
    kvt_xfer_stats_t st = {.size = sizeof(st)};
    cr_assert_eq(kvt_xfer_stats(pe.x, 0, 1, &st), KVT_OK);
    cr_assert_eq(st.runs, 12, "runs are cut at one page");
    cr_assert_eq(st.items, 12);
    cr_assert_eq(st.copies, 12 * per_page);
    uint8_t *got = malloc(pe.lb), *exp = malloc(pe.lb);
    for (uint32_t b = 0; b < 12; b++)
        for (uint32_t l = 0; l < sh->layers; l++) {
            cr_assert_eq(kvt_tier_read(pe.t[1], b, l, got), KVT_OK);
            cr_assert_eq(kvt_tier_read(pe.t[0], b, l, exp), KVT_OK);
            cr_assert(memcmp(got, exp, pe.lb) == 0, "block %u layer %u", b, l);
        }
    free(got);
    free(exp);
    pe_fini(&pe);
    /* below one page's copies the engine refuses the pair */
    em_mem_t m;
    em_ptrs_t pp;
    em_alloc(sh, &m, 0);
    kvt_tier_t *t[2];
    t[0] = engine_tier(sh, &m, &pp, "engine");
    kvt_tier_config_t c2;
    memset(&c2, 0, sizeof(c2));
    c2.size = sizeof(c2);
    c2.kind = KVT_TIER_HOST;
    c2.geom = (kvt_geom_t){4, sh->layers, em_layer_bytes(sh), KVT_LAYOUT_LAYER_FIRST};
    cr_assert_eq(kvt_tier_create(&t[1], &c2), KVT_OK);
    kvt_xfer_config_t xc;
    kvt_xfer_config_default(&xc);
    xc.max_batch_copies = per_page - 1;
    kvt_xfer_t *x = (kvt_xfer_t *)(uintptr_t)0x1234;
    cr_assert_eq(kvt_xfer_create(&x, &xc, t, 2), KVT_EINVAL);
    cr_assert_eq(x, (kvt_xfer_t *)(uintptr_t)0x1234);
    kvt_tier_destroy(t[0]);
    kvt_tier_destroy(t[1]);
    em_free(&m);
}

/* Engine to engine, across layouts that cut a layer differently (vLLM's two
 * planes into FlashInfer's one, FlashInfer's fused pair into a page-major
 * engine, ...), both ways, scattered: the destination's every byte against
 * the model (the source's element bytes in the destination's places, the
 * sentinel everywhere else). */
Test(xfer_engine, engine_to_engine_across_layouts) {
    const em_kind_t pairs[][2] = {{EM_VLLM_FA, EM_FLASHINFER}, {EM_FLASHINFER2, EM_PAGE_MAJOR}, {EM_VLLM_FA, EM_PAGE_MAJOR},
                                  {EM_VLLM_FA, EM_FLASHINFER2}};
    for (size_t k = 0; k < sizeof(pairs) / sizeof(pairs[0]); k++)
        for (int dir = 0; dir < 2; dir++) {
            const em_shape_t *a = &EM_SHAPES[pairs[k][dir]], *b = &EM_SHAPES[pairs[k][1 - dir]];
            cr_assert_eq(em_layer_bytes(a), em_layer_bytes(b));
            em_mem_t ma, mb, exp;
            em_ptrs_t pa, pb;
            em_alloc(a, &ma, 0x01);
            em_alloc(b, &mb, ENGINE_FILL);
            em_alloc(b, &exp, ENGINE_FILL);
            for (uint32_t i = 0; i < a->blocks; i++) em_fill_block(a, &ma, i, i, 42);
            kvt_tier_t *t[2] = {engine_tier(a, &ma, &pa, "a"), engine_tier(b, &mb, &pb, "b")};
            kvt_xfer_config_t xc;
            kvt_xfer_config_default(&xc);
            kvt_xfer_t *x;
            cr_assert_eq(kvt_xfer_create(&x, &xc, t, 2), KVT_OK);
            kvt_xfer_copy_t c[12];
            size_t n = 0;
            for (uint32_t i = 0; i < a->blocks; i++)
                if (i % 3 != 1) c[n++] = (kvt_xfer_copy_t){i, (i * 5 + 3) % b->blocks}; /* 5 is prime to 12: distinct */
            cr_assert_eq(kvt_xfer_submit(x, 0, 1, c, n, 0, NULL), KVT_OK);
            kvt_xfer_done_t d;
            cr_assert_eq(kvt_xfer_poll(x, &d, 1, 10000000000ull), 1);
            cr_assert_eq(d.status, KVT_OK);
            for (size_t i = 0; i < n; i++) em_fill_block(b, &exp, c[i].dst_page, c[i].src_page, 42);
            for (unsigned i = 0; i < exp.n; i++)
                cr_assert(memcmp(mb.buf[i], exp.buf[i], exp.len[i]) == 0, "%s -> %s: buffer %u", a->name, b->name, i);
            kvt_xfer_destroy(x);
            kvt_tier_destroy(t[0]);
            kvt_tier_destroy(t[1]);
            em_free(&ma);
            em_free(&mb);
            em_free(&exp);
        }
}
