/* The engine tier: memory the caller owns, described as planes. Its tier API
 * (addresses, read/write gather and scatter, page sums, the content pattern)
 * against a model that indexes each engine's tensor shape (tests/common/
 * engine_model.h), every KVT_EINVAL case, allocation failures, and that the
 * tier never frees (nor touches the padding of) the caller's memory. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/engine_model.h"
#include "core/mem-int.h"
#include "kvtier/testing.h"
#include "kvtier/error.h"
#include "kvtier/mem.h"
#include "kvtier/tier.h"
#include "tier/tier-int.h"

static kvt_tier_t *make_engine(const em_shape_t *sh, em_mem_t *m, em_ptrs_t *pp, uint32_t flags) {
    kvt_tier_engine_t e;
    describe(sh, m, pp, &e);
    kvt_tier_config_t c = em_config(sh, &e);
    c.flags = flags;
    kvt_tier_t *t = NULL;
    int rc = kvt_tier_create(&t, &c);
    cr_assert_eq(rc, KVT_OK, "%s: %s", sh->name, kvt_err_name(rc));
    memset(pp, 0xee, sizeof(*pp)); /* the tier kept its own copy of the pointers */
    return t;
}

/* The logical (page b, layer l) the model says, from the engine's bytes. */
static void model_layer(const em_shape_t *sh, const em_mem_t *m, uint32_t b, uint32_t l, uint8_t *out) {
    EM_FOR_BYTES(sh, ll, kv, s, h, d, i) {
        if (ll != l) continue;
        unsigned buf;
        size_t off;
        model_loc(sh, l, kv, b, s, h, d, &buf, &off);
        out[model_lofs(sh, kv, s, h, d) + i] = m->buf[buf][off + i];
    }
}

static void *model_addr(const em_shape_t *sh, const em_mem_t *m, uint32_t l, int kv, uint32_t b) {
    unsigned buf;
    size_t off;
    model_loc(sh, l, kv, b, 0, 0, 0, &buf, &off);
    return m->buf[buf] + off;
}

Test(engine, geometry_and_addresses_match_the_model) {
    for (int k = 0; k < EM_KIND_COUNT; k++) {
        const em_shape_t *sh = &EM_SHAPES[k];
        em_mem_t m;
        em_ptrs_t pp;
        em_alloc(sh, &m, 0);
        kvt_tier_t *t = make_engine(sh, &m, &pp, 0);
        const kvt_geom_t *g = kvt_tier_geom(t);
        cr_assert_eq(g->layer_bytes, em_layer_bytes(sh), "%s", sh->name);
        cr_assert_eq(g->layers, sh->layers);
        cr_assert_eq(g->pages, sh->blocks);
        cr_assert_eq(kvt_tier_kind(t), KVT_TIER_ENGINE);
        cr_assert_str_eq(kvt_tier_kind_name(KVT_TIER_ENGINE), "engine");
        cr_assert(kvt_tier_host_visible(t));
        uint32_t planes = (sh->kind == EM_FLASHINFER || sh->kind == EM_MLA || sh->kind == EM_PAGE_MAJOR) ? 1 : 2;
        cr_assert_eq(kvt_tier_planes(t), planes, "%s", sh->name);
        kvt_tier_info_t info = {.size = sizeof(info)};
        cr_assert_eq(kvt_tier_info(t, &info), KVT_OK);
        cr_assert_eq(info.bytes, (uint64_t)sh->blocks * sh->layers * em_layer_bytes(sh));
        for (uint32_t b = 0; b < sh->blocks; b++)
            for (uint32_t l = 0; l < sh->layers; l++) {
                cr_assert_eq(kvt_tier_addr(t, b, l), model_addr(sh, &m, l, 0, b), "%s b %u l %u", sh->name, b, l);
                cr_assert_eq(kvt_tier_plane_addr(t, 0, b, l), model_addr(sh, &m, l, 0, b));
                if (planes == 2) cr_assert_eq(kvt_tier_plane_addr(t, 1, b, l), model_addr(sh, &m, l, 1, b), "%s V", sh->name);
                cr_assert_null(kvt_tier_plane_addr(t, planes, b, l));
            }
        cr_assert_null(kvt_tier_addr(t, sh->blocks, 0));
        cr_assert_null(kvt_tier_addr(t, 0, sh->layers));
        cr_assert_null(kvt_tier_plane_addr(NULL, 0, 0, 0));
        kvt_tier_destroy(t);
        em_free(&m);
    }
    cr_assert_eq(kvt_tier_planes(NULL), 0);
}

/* read gathers the planes in logical order; write scatters them and leaves
 * every other byte (other blocks, other layers, padding) alone. */
/* The layout field of an engine tier's geometry is not read, whatever it
 * holds (an adapter that leaves it unset): the tier reports page_first. */
Test(engine, the_layout_field_is_not_read) {
    const em_shape_t *sh = &EM_SHAPES[0];
    em_mem_t m;
    em_ptrs_t pp;
    em_alloc(sh, &m, 0);
    for (unsigned layout = 0; layout < 8; layout++) {
        kvt_tier_engine_t e;
        describe(sh, &m, &pp, &e);
        kvt_tier_config_t c = em_config(sh, &e);
        c.geom.layout = (kvt_layout_t)layout;
        kvt_tier_t *t = NULL;
        cr_assert_eq(kvt_tier_create(&t, &c), KVT_OK, "layout %u", layout);
        cr_assert_eq(kvt_tier_geom(t)->layout, KVT_LAYOUT_PAGE_FIRST);
        kvt_tier_destroy(t);
    }
    em_free(&m);
}

Test(engine, read_gathers_write_scatters_byte_for_byte) {
    for (int k = 0; k < EM_KIND_COUNT; k++) {
        const em_shape_t *sh = &EM_SHAPES[k];
        em_mem_t m, want;
        em_ptrs_t pp;
        em_alloc(sh, &m, 0x3c);
        for (uint32_t b = 0; b < sh->blocks; b++) em_fill_block(sh, &m, b, b, 1);
        kvt_tier_t *t = make_engine(sh, &m, &pp, 0);
        size_t lb = em_layer_bytes(sh);
        uint8_t *got = malloc(lb), *exp = malloc(lb);
        for (uint32_t b = 0; b < sh->blocks; b++)
            for (uint32_t l = 0; l < sh->layers; l++) {
                memset(got, 0, lb);
                cr_assert_eq(kvt_tier_read(t, b, l, got), KVT_OK);
                model_layer(sh, &m, b, l, exp);
                cr_assert(memcmp(got, exp, lb) == 0, "%s: read block %u layer %u", sh->name, b, l);
            }
        /* write block b's content as block (b * 5 + 2) % blocks's, salt 2; model the same */
        em_alloc(sh, &want, 0);
        for (unsigned i = 0; i < m.n; i++) memcpy(want.buf[i], m.buf[i], m.len[i]);
        em_mem_t src;
        em_alloc(sh, &src, 0);
        for (uint32_t b = 0; b < sh->blocks; b += 2) {
            uint32_t as = (b * 5 + 2) % sh->blocks;
            em_fill_block(sh, &src, b, as, 2);
            em_fill_block(sh, &want, b, as, 2);
            for (uint32_t l = 0; l < sh->layers; l++) {
                model_layer(sh, &src, b, l, exp);
                cr_assert_eq(kvt_tier_write(t, b, l, exp), KVT_OK);
            }
        }
        for (unsigned i = 0; i < m.n; i++)
            cr_assert(memcmp(m.buf[i], want.buf[i], m.len[i]) == 0, "%s: buffer %u after writes", sh->name, i);
        cr_assert_eq(kvt_tier_write(t, sh->blocks, 0, exp), KVT_ERANGE);
        cr_assert_eq(kvt_tier_read(t, 0, sh->layers, got), KVT_ERANGE);
        cr_assert_eq(kvt_tier_read(t, 0, 0, NULL), KVT_ERANGE);
        kvt_tier_destroy(t);
        free(got);
        free(exp);
        em_free(&m);
        em_free(&want);
        em_free(&src);
    }
}

/* page_sum is XXH3 of the logical page (layers in order, planes in order)
 * the model builds; the whole-page pattern goes through read and write. */
Test(engine, page_sum_and_pattern) {
    for (int k = 0; k < EM_KIND_COUNT; k++) {
        const em_shape_t *sh = &EM_SHAPES[k];
        em_mem_t m;
        em_ptrs_t pp;
        em_alloc(sh, &m, 0x77);
        for (uint32_t b = 0; b < sh->blocks; b++) em_fill_block(sh, &m, b, b, 3);
        kvt_tier_t *t = make_engine(sh, &m, &pp, 0);
        size_t lb = em_layer_bytes(sh);
        uint8_t *page = malloc(lb * sh->layers);
        for (uint32_t b = 0; b < sh->blocks; b++) {
            for (uint32_t l = 0; l < sh->layers; l++) model_layer(sh, &m, b, l, page + l * lb);
            cr_assert_eq(kvt_tier_page_sum(t, b), XXH3_64bits(page, lb * sh->layers), "%s block %u", sh->name, b);
        }
        cr_assert_eq(kvt_tier_page_sum(t, sh->blocks), 0);
        for (uint32_t b = 0; b < sh->blocks; b++) cr_assert_eq(kvt_tier_pattern_fill(t, b, b, 9, page), KVT_OK);
        for (uint32_t b = 0; b < sh->blocks; b++) {
            cr_assert(kvt_tier_pattern_check(t, b, b, 9, page), "%s block %u", sh->name, b);
            cr_assert_not(kvt_tier_pattern_check(t, b, b + 1, 9, page));
            for (uint32_t l = 0; l < sh->layers; l++) { /* and the engine's own bytes hold it in the model's places */
                model_layer(sh, &m, b, l, page);
                cr_assert(kvt_pattern_check(page, lb, b, 9, l), "%s block %u layer %u", sh->name, b, l);
            }
        }
        kvt_tier_destroy(t);
        free(page);
        em_free(&m);
    }
}

/* Padding between pages is never read into a page nor written. */
Test(engine, padding_untouched) {
    const em_shape_t *sh = &EM_SHAPES[EM_PADDED];
    em_mem_t m;
    em_ptrs_t pp;
    em_alloc(sh, &m, 0xa5);
    kvt_tier_t *t = make_engine(sh, &m, &pp, 0);
    uint8_t *scratch = malloc(em_layer_bytes(sh));
    for (uint32_t b = 0; b < sh->blocks; b++) cr_assert_eq(kvt_tier_pattern_fill(t, b, b, 1, scratch), KVT_OK);
    for (unsigned i = 0; i < m.n; i++) {
        int kv = (int)(i % 2);
        size_t piece = em_piece(sh, kv), pad = kv ? sh->vpad : sh->kpad;
        for (uint32_t b = 0; b < sh->blocks; b++)
            for (size_t j = 0; j < pad; j++)
                cr_assert_eq(m.buf[i][b * (piece + pad) + piece + j], 0xa5, "buffer %u block %u pad byte %zu", i, b, j);
    }
    kvt_tier_destroy(t);
    free(scratch);
    em_free(&m);
}

/* The tier never frees the memory: after destroy it is the caller's, readable
 * and writable, and freed once by the caller (ASan would report a double free
 * or a use after free); the tier's own copy of the description is freed. */
static uint64_t live_bytes(void) {
    kvt_mem_stats_t s = {.size = sizeof(s)};
    kvt_mem_stats(&s);
    return s.live_bytes;
}

Test(engine, never_frees_the_callers_memory) {
    for (int k = 0; k < EM_KIND_COUNT; k++) {
        const em_shape_t *sh = &EM_SHAPES[k];
        uint64_t before = live_bytes();
        em_mem_t m;
        em_ptrs_t pp;
        em_alloc(sh, &m, 0x11);
        kvt_tier_t *t = make_engine(sh, &m, &pp, KVT_TIER_REGISTER);
        cr_assert_gt(live_bytes(), before);
        uint8_t *scratch = malloc(em_layer_bytes(sh));
        cr_assert_eq(kvt_tier_pattern_fill(t, 0, 1, 2, scratch), KVT_OK);
        kvt_tier_destroy(t);
        cr_assert_eq(live_bytes(), before, "%s: the tier freed all it allocated", sh->name);
        for (unsigned i = 0; i < m.n; i++) { /* still the caller's */
            memset(m.buf[i], 0x22, m.len[i]);
            cr_assert_eq(m.buf[i][m.len[i] - 1], 0x22);
        }
        free(scratch);
        em_free(&m);
    }
}

/* KVT_TIER_REGISTER: the ranges a transfer engine registers for DMA cover
 * every plane of every layer, merged where they touch (vLLM's K and V halves
 * of one tensor are one range per layer; MLA's one tensor is one range). */
Test(engine, register_regions_cover_the_planes) {
    for (int k = 0; k < EM_KIND_COUNT; k++) {
        const em_shape_t *sh = &EM_SHAPES[k];
        em_mem_t m;
        em_ptrs_t pp;
        em_alloc(sh, &m, 0);
        kvt_tier_t *t = make_engine(sh, &m, &pp, KVT_TIER_REGISTER);
        /* the model's view: every buffer is one range unless two happen to touch */
        size_t covered = 0;
        for (size_t r = 0; r < t->nregions; r++) {
            covered += t->regions[r].len;
            if (r) cr_assert_gt((uintptr_t)t->regions[r].p, (uintptr_t)t->regions[r - 1].p + t->regions[r - 1].len);
        }
        size_t want = 0;
        for (unsigned i = 0; i < m.n; i++) want += m.len[i];
        if (sh->kind == EM_PADDED) want -= sh->layers * (sh->kpad + sh->vpad); /* not the last pad of each buffer */
        cr_assert_eq(covered, want, "%s: %zu bytes in %zu regions", sh->name, covered, t->nregions);
        cr_assert_leq(t->nregions, m.n);
        kvt_tier_destroy(t);
        t = make_engine(sh, &m, &pp, 0);
        cr_assert_eq(t->nregions, 0, "no flag: nothing to register");
        kvt_tier_destroy(t);
        em_free(&m);
    }
}

Test(engine, bad_descriptions_einval) {
    const em_shape_t *sh = &EM_SHAPES[EM_VLLM_FA];
    em_mem_t m;
    em_ptrs_t pp;
    em_alloc(sh, &m, 0);
    kvt_tier_engine_t good, e;
    describe(sh, &m, &pp, &good);
    void *with_null[EM_MAXL];
    memcpy(with_null, pp.p[1], sizeof(with_null));
    with_null[sh->layers - 1] = NULL;
    kvt_tier_config_t c;
    kvt_tier_t *sentinel = (kvt_tier_t *)(uintptr_t)0x1234, *t;
    uint64_t before = live_bytes();
#define EXPECT_BAD(mutate)                                                              \
    do {                                                                                \
        e = good;                                                                       \
        c = em_config(sh, &e);                                                          \
        mutate;                                                                         \
        t = sentinel;                                                                   \
        cr_assert_eq(kvt_tier_create(&t, &c), KVT_EINVAL, "%s", #mutate);              \
        cr_assert_eq(t, sentinel, "%s wrote *out", #mutate);                            \
        cr_assert_eq(live_bytes(), before, "%s left memory allocated", #mutate);        \
    } while (0)
    EXPECT_BAD(c.engine = NULL);
    EXPECT_BAD(c.kind = KVT_TIER_HOST); /* a description for another kind */
    EXPECT_BAD(e.size = 0); /* no size: not a description this library can read */
    EXPECT_BAD(e.size = 2);
    EXPECT_BAD(e.planes = 0);
    EXPECT_BAD(e.planes = KVT_TIER_MAX_PLANES + 1);
    EXPECT_BAD(e.plane[0].layer_base = NULL);                    /* neither base nor per-layer pointers */
    EXPECT_BAD(e.plane[1].base = m.buf[0]);                       /* both */
    EXPECT_BAD(e.plane[1].layer_base = (void *const *)with_null); /* a NULL layer pointer */
    EXPECT_BAD(e.plane[0].piece_bytes = 0);
    EXPECT_BAD(e.plane[1].page_stride = e.plane[1].piece_bytes - 1); /* stride below the piece */
    EXPECT_BAD(e.plane[0].page_stride = UINT64_MAX / 4);          /* pages x stride overflows */
    EXPECT_BAD((e.plane[0].piece_bytes = UINT64_MAX, e.plane[0].page_stride = UINT64_MAX)); /* address overflows */
    EXPECT_BAD(c.geom.layer_bytes = em_layer_bytes(sh) + 1);      /* neither 0 nor the sum */
    EXPECT_BAD(c.geom.pages = 0);
    EXPECT_BAD(c.geom.layers = 0);
    EXPECT_BAD(c.geom.pages = (uint64_t)UINT32_MAX + 1);
    EXPECT_BAD(c.flags = KVT_TIER_CHECKSUM);
    EXPECT_BAD(c.flags = KVT_TIER_HUGE);
    EXPECT_BAD((e.device = true, c.flags = KVT_TIER_REGISTER));   /* registering is for host memory */
    EXPECT_BAD(c.flags = KVT_TIER_COPY_KERNEL);                    /* a copy way is for device memory */
    EXPECT_BAD(c.flags = KVT_TIER_COPY_DMA);
    EXPECT_BAD((e.device = true, c.flags = KVT_TIER_COPY_DMA | KVT_TIER_COPY_KERNEL)); /* one way or the other */
    /* the one-base form */
    EXPECT_BAD((e.plane[0].layer_base = NULL, e.plane[0].base = m.buf[0], e.plane[0].layer_stride = 0)); /* layers alias */
    EXPECT_BAD((e.plane[0].layer_base = NULL, e.plane[0].base = m.buf[0], e.plane[0].layer_stride = UINT64_MAX / 2));
    EXPECT_BAD((e.plane[0].layer_base = NULL, e.plane[0].base = (void *)(UINTPTR_MAX - 64), e.plane[0].layer_stride = 1024));
    EXPECT_BAD((e.planes = 1, e.plane[0].layer_base = NULL, e.plane[0].base = m.buf[0], e.plane[0].layer_stride = 1,
                e.plane[0].piece_bytes = e.plane[0].page_stride = 1ull << 58)); /* pages x layer_bytes past 2^62 */
    EXPECT_BAD((e.planes = 2, e.plane[1].piece_bytes = e.plane[1].page_stride = UINT64_MAX - 8)); /* a piece past the address space */
#undef EXPECT_BAD
    /* one layer: a zero layer stride is fine; so is layer_bytes given as the sum */
    e = good;
    c = em_config(sh, &e);
    c.geom.layer_bytes = em_layer_bytes(sh);
    cr_assert_eq(kvt_tier_create(&t, &c), KVT_OK);
    kvt_tier_destroy(t);
    e = (kvt_tier_engine_t){.size = sizeof(e), .planes = 1, .plane = {{.base = m.buf[0], .piece_bytes = 64, .page_stride = 64}}};
    c = em_config(sh, &e);
    c.geom.layers = 1;
    cr_assert_eq(kvt_tier_create(&t, &c), KVT_OK);
    cr_assert_eq(kvt_tier_geom(t)->layer_bytes, 64);
    kvt_tier_destroy(t);
    em_free(&m);
}

Test(engine, device_memory_without_cuda_enotsup) {
    if (kvt_tier_cuda_built()) cr_skip_test("built with CUDA: the kernels suite covers device engine tiers");
    uint8_t buf[256];
    kvt_tier_engine_t e = {.size = sizeof(e), .planes = 1, .device = true, .plane = {{.base = buf, .layer_stride = 64, .piece_bytes = 16, .page_stride = 16}}};
    kvt_tier_config_t c;
    memset(&c, 0, sizeof(c));
    c.size = sizeof(c);
    c.kind = KVT_TIER_ENGINE;
    c.geom = (kvt_geom_t){4, 4, 0, KVT_LAYOUT_PAGE_FIRST};
    c.engine = &e;
    kvt_tier_t *t = (kvt_tier_t *)(uintptr_t)0x1234;
    uint64_t before = live_bytes();
    cr_assert_eq(kvt_tier_create(&t, &c), KVT_ENOTSUP);
    c.flags = KVT_TIER_COPY_KERNEL; /* a valid way: still no device */
    cr_assert_eq(kvt_tier_create(&t, &c), KVT_ENOTSUP);
    cr_assert_eq(t, (kvt_tier_t *)(uintptr_t)0x1234);
    cr_assert_eq(live_bytes(), before);
}

Test(engine, allocation_failure_leaves_nothing) {
    const em_shape_t *sh = &EM_SHAPES[EM_SGLANG];
    em_mem_t m;
    em_ptrs_t pp;
    em_alloc(sh, &m, 0);
    kvt_tier_engine_t e;
    describe(sh, &m, &pp, &e);
    kvt_tier_config_t c = em_config(sh, &e);
    c.flags = KVT_TIER_REGISTER;
    int fails = 0;
    for (uint64_t nth = 1; nth < 64; nth++) {
        uint64_t before = live_bytes();
        kvt_tier_t *t = NULL;
        kvt__mem_fail_nth(nth);
        int rc = kvt_tier_create(&t, &c);
        bool fired = kvt__mem_fail_fired();
        kvt__mem_fail_nth(0);
        if (!fired) {
            cr_assert_eq(rc, KVT_OK);
            kvt_tier_destroy(t);
            break;
        }
        fails++;
        cr_assert_eq(rc, KVT_ENOMEM, "allocation %" PRIu64 ": %s", nth, kvt_err_name(rc));
        cr_assert_null(t);
        cr_assert_eq(live_bytes(), before, "allocation %" PRIu64 " failed: nothing left", nth);
    }
    cr_assert_geq(fails, 4, "the tier, two pointer copies and the regions");
    em_free(&m);
}
