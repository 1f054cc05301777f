/* Tiers: geometry against the layout formulas, every backend's bytes against
 * a plain per-(page, layer) model, page sums against XXH3 over bytes gathered
 * layer by layer, the test pattern against a byte-by-byte reimplementation of
 * its definition, and shm creation, attachment and stale-segment recovery. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/mem-int.h"
#include "kvtier/testing.h"
#include "kvtier/error.h"
#include "kvtier/mem.h"
#include "kvtier/model.h"
#include "kvtier/tier.h"

/* ---- models ---- */

/* The offset formulas of tier.h, written out. */
static uint64_t model_offset(uint64_t pages, uint32_t layers, uint64_t lb, kvt_layout_t lay, uint64_t page,
                             uint32_t layer) {
    if (lay == KVT_LAYOUT_PAGE_FIRST) return page * layers * lb + layer * lb;
    return layer * pages * lb + page * lb;
}

/* splitmix64 as published (Vigna): add the golden gamma, then mix. */
static uint64_t model_splitmix64(uint64_t x) {
    uint64_t z = x + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The pattern as tier.h defines it, byte by byte: word i is
 * splitmix64(lo ^ rotl(hi, 17) ^ layer << 48 ^ i), little-endian; the tail
 * takes the low bytes of the next word. */
static void model_pattern(uint8_t *buf, size_t len, uint64_t lo, uint64_t hi, uint32_t layer) {
    uint64_t rot = (hi << 17) | (hi >> 47);
    for (size_t b = 0; b < len; b++) {
        uint64_t w = model_splitmix64(lo ^ rot ^ ((uint64_t)layer << 48) ^ (uint64_t)(b / 8));
        buf[b] = (uint8_t)(w >> (8 * (b % 8)));
    }
}

/* The hash a test gives page p of a tier (salt tells tiers apart). */
static uint64_t hash_lo(uint64_t p, uint64_t salt) { return p * 0x9e3779b97f4a7c15ull + 1 + salt; }
static uint64_t hash_hi(uint64_t p, uint64_t salt) { return (p << 32) ^ 0x5555aaaa5555aaaaull ^ (salt * 7); }

/* ---- helpers ---- */

static kvt_tier_config_t config(kvt_tier_kind_t kind, uint64_t pages, uint32_t layers, uint64_t lb, kvt_layout_t lay,
                                uint32_t flags, const char *name) {
    kvt_tier_config_t c;
    memset(&c, 0, sizeof(c));
    c.size = sizeof(c);
    c.kind = kind;
    c.geom = (kvt_geom_t){pages, layers, lb, lay};
    c.flags = flags;
    c.name = name;
    return c;
}

static kvt_tier_t *make(kvt_tier_kind_t kind, uint64_t pages, uint32_t layers, uint64_t lb, kvt_layout_t lay,
                        uint32_t flags, const char *name) {
    kvt_tier_config_t c = config(kind, pages, layers, lb, lay, flags, name);
    kvt_tier_t *t = NULL;
    int rc = kvt_tier_create(&t, &c);
    cr_assert_eq(rc, KVT_OK, "create %s: %s", kvt_tier_kind_name(kind), kvt_err_name(rc));
    return t;
}

static char g_names[16][64];

/* A name unique to this process and test: "/kvtier-test-<pid>-<n>". */
static const char *shm_name(int n) {
    snprintf(g_names[n], sizeof(g_names[n]), "/kvtier-test-%d-%d", (int)getpid(), n);
    shm_unlink(g_names[n]); /* a leftover of an earlier crashed run with our pid */
    return g_names[n];
}

static bool shm_exists(const char *name) {
    char path[96];
    struct stat sb;
    snprintf(path, sizeof(path), "/dev/shm/%.80s", name + 1); /* kvtier names are at most 60 bytes */
    return stat(path, &sb) == 0;
}

/* Reads page p layer by layer into out (page_bytes). */
static void gather(const kvt_tier_t *t, uint64_t p, uint8_t *out) {
    const kvt_geom_t *g = kvt_tier_geom(t);
    for (uint32_t l = 0; l < g->layers; l++)
        cr_assert_eq(kvt_tier_read(t, p, l, out + l * g->layer_bytes), KVT_OK, "read page %" PRIu64 " layer %u", p, l);
}

/* Writes the pattern of every (page, layer), read it all back and checks it
 * three ways: kvt_pattern_check, the model's bytes, and the raw address the
 * layout formula gives. */
static void fill_and_check(kvt_tier_t *t, uint64_t salt) {
    const kvt_geom_t *g = kvt_tier_geom(t);
    size_t lb = (size_t)g->layer_bytes;
    uint8_t *buf = malloc(lb), *want = malloc(lb), *got = malloc(lb);
    for (uint64_t p = 0; p < g->pages; p++)
        for (uint32_t l = 0; l < g->layers; l++) {
            kvt_pattern_fill(buf, lb, hash_lo(p, salt), hash_hi(p, salt), l);
            cr_assert_eq(kvt_tier_write(t, p, l, buf), KVT_OK);
        }
    uint8_t *base = kvt_tier_addr(t, 0, 0);
    for (uint64_t p = 0; p < g->pages; p++)
        for (uint32_t l = 0; l < g->layers; l++) {
            memset(got, 0, lb);
            cr_assert_eq(kvt_tier_read(t, p, l, got), KVT_OK);
            cr_assert(kvt_pattern_check(got, lb, hash_lo(p, salt), hash_hi(p, salt), l), "page %" PRIu64 " layer %u", p, l);
            model_pattern(want, lb, hash_lo(p, salt), hash_hi(p, salt), l);
            cr_assert(memcmp(got, want, lb) == 0, "page %" PRIu64 " layer %u differs from the model", p, l);
            uint8_t *a = kvt_tier_addr(t, p, l);
            cr_assert_eq(a, base + model_offset(g->pages, g->layers, g->layer_bytes, g->layout, p, l));
            cr_assert(memcmp(a, want, lb) == 0);
        }
    free(buf);
    free(want);
    free(got);
}

static void check_ranges(kvt_tier_t *t) {
    const kvt_geom_t *g = kvt_tier_geom(t);
    uint8_t *buf = calloc(1, (size_t)g->layer_bytes);
    cr_assert_eq(kvt_tier_write(t, g->pages, 0, buf), KVT_ERANGE);
    cr_assert_eq(kvt_tier_write(t, 0, g->layers, buf), KVT_ERANGE);
    cr_assert_eq(kvt_tier_write(t, UINT64_MAX, 0, buf), KVT_ERANGE);
    cr_assert_eq(kvt_tier_write(t, 0, 0, NULL), KVT_ERANGE);
    cr_assert_eq(kvt_tier_read(t, g->pages, 0, buf), KVT_ERANGE);
    cr_assert_eq(kvt_tier_read(t, 0, g->layers, buf), KVT_ERANGE);
    cr_assert_eq(kvt_tier_read(t, 0, 0, NULL), KVT_ERANGE);
    cr_assert_null(kvt_tier_addr(t, g->pages, 0));
    cr_assert_null(kvt_tier_addr(t, 0, g->layers));
    cr_assert_null(kvt_tier_addr(t, UINT64_MAX, UINT32_MAX));
    cr_assert_not_null(kvt_tier_addr(t, g->pages - 1, g->layers - 1));
    free(buf);
}

/* ---- geometry ---- */

Test(tier, geom_offset_matches_formulas) {
    static const uint64_t lbs[] = {1, 3, 8, 40};
    for (int lay = 0; lay < 2; lay++)
        for (uint64_t pages = 1; pages <= 6; pages++)
            for (uint32_t layers = 1; layers <= 5; layers++)
                for (int k = 0; k < 4; k++) {
                    kvt_geom_t g = {pages, layers, lbs[k], (kvt_layout_t)lay};
                    uint64_t total = pages * layers * lbs[k];
                    uint8_t *cover = calloc(total, 1);
                    cr_assert_eq(kvt_geom_page_bytes(&g), layers * lbs[k]);
                    for (uint64_t p = 0; p < pages; p++)
                        for (uint32_t l = 0; l < layers; l++) {
                            uint64_t off = kvt_geom_offset(&g, p, l);
                            cr_assert_eq(off, model_offset(pages, layers, lbs[k], g.layout, p, l),
                                         "%s pages %" PRIu64 " layers %u lb %" PRIu64 " (%" PRIu64 ", %u)",
                                         kvt_layout_name(g.layout), pages, layers, lbs[k], p, l);
                            for (uint64_t b = 0; b < lbs[k]; b++) cover[off + b]++;
                        }
                    for (uint64_t b = 0; b < total; b++) cr_assert_eq(cover[b], 1, "the (page, layer) slots tile the tier");
                    free(cover);
                }
}

Test(tier, geom_from_model_llama_3_70b) {
    const kvt_model_t *m = kvt_model_find("llama-3-70b");
    cr_assert_not_null(m);
    cr_assert_eq(m->layers, 80);
    /* K and V, per layer, per token */
    uint64_t per_layer = 2ull * m->kv_heads * m->head_dim * m->dtype_bytes;
    cr_assert_eq(per_layer, 4096, "8 KV heads x 128 x bf16 x (K, V)");
    cr_assert_eq(m->bytes_per_token, per_layer * 80);
    for (int lay = 0; lay < 2; lay++) {
        kvt_geom_t g;
        cr_assert_eq(kvt_geom_from_model(&g, m, 16, 1000, (kvt_layout_t)lay), KVT_OK);
        cr_assert_eq(g.pages, 1000);
        cr_assert_eq(g.layers, 80);
        cr_assert_eq(g.layer_bytes, 4096 * 16);
        cr_assert_eq(g.layout, (kvt_layout_t)lay);
        cr_assert_eq(kvt_geom_page_bytes(&g), 80ull * 4096 * 16);
    }
}

Test(tier, geom_from_model_einval_sets_nothing) {
    const kvt_model_t *m = kvt_model_find("llama-3-70b");
    kvt_model_t zero_layers = *m, uneven = *m, tiny = *m;
    zero_layers.layers = 0;
    uneven.bytes_per_token = m->layers * 100 + 1; /* not a multiple of layers */
    tiny.bytes_per_token = 0;
    kvt_geom_t sentinel = {777, 7, 77, KVT_LAYOUT_LAYER_FIRST}, g = sentinel;
#define EXPECT_EINVAL(call)                                                   \
    do {                                                                      \
        g = sentinel;                                                         \
        cr_assert_eq((call), KVT_EINVAL, #call);                              \
        cr_assert(memcmp(&g, &sentinel, sizeof(g)) == 0, "%s set *g", #call); \
    } while (0)
    EXPECT_EINVAL(kvt_geom_from_model(&g, m, 0, 10, KVT_LAYOUT_PAGE_FIRST));
    EXPECT_EINVAL(kvt_geom_from_model(&g, m, 16, 0, KVT_LAYOUT_PAGE_FIRST));
    EXPECT_EINVAL(kvt_geom_from_model(&g, NULL, 16, 10, KVT_LAYOUT_PAGE_FIRST));
    EXPECT_EINVAL(kvt_geom_from_model(&g, &zero_layers, 16, 10, KVT_LAYOUT_PAGE_FIRST));
    EXPECT_EINVAL(kvt_geom_from_model(&g, &uneven, 16, 10, KVT_LAYOUT_PAGE_FIRST));
    EXPECT_EINVAL(kvt_geom_from_model(&g, &tiny, 16, 10, KVT_LAYOUT_PAGE_FIRST));
    EXPECT_EINVAL(kvt_geom_from_model(&g, m, 16, 10, (kvt_layout_t)2));
    EXPECT_EINVAL(kvt_geom_from_model(&g, m, 16, UINT64_MAX / 1000, KVT_LAYOUT_PAGE_FIRST)); /* overflows */
    EXPECT_EINVAL(kvt_geom_from_model(&g, m, UINT32_MAX, UINT64_MAX >> 20, KVT_LAYOUT_PAGE_FIRST));
#undef EXPECT_EINVAL
    cr_assert_eq(kvt_geom_from_model(NULL, m, 16, 10, KVT_LAYOUT_PAGE_FIRST), KVT_EINVAL);
}

Test(tier, layout_and_kind_names) {
    kvt_layout_t l = KVT_LAYOUT_PAGE_FIRST;
    cr_assert_eq(kvt_layout_parse("layer_first", &l), KVT_OK);
    cr_assert_eq(l, KVT_LAYOUT_LAYER_FIRST);
    cr_assert_eq(kvt_layout_parse("page_first", &l), KVT_OK);
    cr_assert_eq(l, KVT_LAYOUT_PAGE_FIRST);
    cr_assert_eq(kvt_layout_parse("page-first", &l), KVT_EINVAL);
    cr_assert_eq(kvt_layout_parse(NULL, &l), KVT_EINVAL);
    cr_assert_str_eq(kvt_layout_name(KVT_LAYOUT_LAYER_FIRST), "layer_first");
    cr_assert_str_eq(kvt_tier_kind_name(KVT_TIER_SHM), "shm");
    cr_assert_str_eq(kvt_tier_kind_name(KVT_TIER_KIND_COUNT_), "?");
}

/* ---- arena and host ---- */

Test(tier, arena_and_host_bytes_round_trip) {
    static const kvt_tier_kind_t kinds[] = {KVT_TIER_ARENA, KVT_TIER_HOST};
    static const struct { uint64_t pages; uint32_t layers; uint64_t lb; } geoms[] = {
        {1, 1, 1}, {7, 3, 40}, {16, 4, 37}, {33, 2, 64}, {5, 9, 13}};
    for (int k = 0; k < 2; k++)
        for (int lay = 0; lay < 2; lay++)
            for (size_t gi = 0; gi < sizeof(geoms) / sizeof(geoms[0]); gi++) {
                kvt_tier_t *t = make(kinds[k], geoms[gi].pages, geoms[gi].layers, geoms[gi].lb, (kvt_layout_t)lay, 0, NULL);
                cr_assert_eq(kvt_tier_kind(t), kinds[k]);
                cr_assert(kvt_tier_host_visible(t));
                cr_assert_str_eq(kvt_tier_name(t), kvt_tier_kind_name(kinds[k]), "the label defaults to the kind");
                kvt_tier_info_t info = {.size = sizeof(info)};
                cr_assert_eq(kvt_tier_info(t, &info), KVT_OK);
                cr_assert_eq(info.page_bytes, geoms[gi].layers * geoms[gi].lb);
                cr_assert_eq(info.bytes, geoms[gi].pages * geoms[gi].layers * geoms[gi].lb);
                fill_and_check(t, gi * 10 + (uint64_t)k);
                check_ranges(t);
                kvt_tier_destroy(t);
            }
}

Test(tier, host_flags_and_label) {
    kvt_tier_t *t = make(KVT_TIER_HOST, 8, 2, 4096, KVT_LAYOUT_PAGE_FIRST, KVT_TIER_HUGE | KVT_TIER_CHECKSUM, "l2-host");
    cr_assert_str_eq(kvt_tier_name(t), "l2-host");
    cr_assert_not_null(kvt_tier_sums(t));
    kvt_tier_info_t info = {.size = sizeof(info)};
    cr_assert_eq(kvt_tier_info(t, &info), KVT_OK);
    cr_assert_not(info.huge_pages && info.thp_advised, "one of the two, not both");
    cr_assert_not(info.creator);
    cr_assert_not(info.replaced_stale);
    info.size = 0;
    cr_assert_eq(kvt_tier_info(t, &info), KVT_EINVAL);
    fill_and_check(t, 3);
    kvt_tier_destroy(t);
    kvt_tier_destroy(NULL);
    /* locking: done and reported, or refused (a memlock limit) with nothing made */
    kvt_tier_config_t c = config(KVT_TIER_HOST, 4, 1, 4096, KVT_LAYOUT_PAGE_FIRST, KVT_TIER_LOCK, NULL);
    t = NULL;
    int rc = kvt_tier_create(&t, &c);
    cr_assert(rc == KVT_OK || rc == KVT_EAGAIN, "%s", kvt_err_name(rc));
    if (rc == KVT_OK) {
        info.size = sizeof(info);
        cr_assert_eq(kvt_tier_info(t, &info), KVT_OK);
        cr_assert(info.locked);
        fill_and_check(t, 4);
        kvt_tier_destroy(t);
    } else {
        cr_assert_null(t);
    }
}

Test(tier, checksum_flag_gives_sums) {
    kvt_tier_t *with = make(KVT_TIER_HOST, 9, 2, 8, KVT_LAYOUT_LAYER_FIRST, KVT_TIER_CHECKSUM, NULL);
    kvt_tier_t *without = make(KVT_TIER_HOST, 9, 2, 8, KVT_LAYOUT_LAYER_FIRST, 0, NULL);
    kvt_tier_t *arena = make(KVT_TIER_ARENA, 9, 2, 8, KVT_LAYOUT_LAYER_FIRST, 0, NULL);
    uint64_t *s = kvt_tier_sums(with);
    cr_assert_not_null(s);
    for (int p = 0; p < 9; p++) s[p] = (uint64_t)p * 3 + 1; /* all 9 entries are ours to write */
    for (int p = 0; p < 9; p++) cr_assert_eq(kvt_tier_sums(with)[p], (uint64_t)p * 3 + 1);
    cr_assert_null(kvt_tier_sums(without));
    cr_assert_null(kvt_tier_sums(arena));
    cr_assert_null(kvt_tier_sums(NULL));
    kvt_tier_destroy(with);
    kvt_tier_destroy(without);
    kvt_tier_destroy(arena);
}

Test(tier, bad_configs_einval) {
    kvt_tier_config_t good = config(KVT_TIER_HOST, 4, 2, 8, KVT_LAYOUT_PAGE_FIRST, 0, NULL);
    kvt_tier_t *sentinel = (kvt_tier_t *)(uintptr_t)0x1234, *t = sentinel;
    kvt_tier_config_t c;
#define EXPECT_BAD(mutate)                                                     \
    do {                                                                       \
        c = good;                                                              \
        mutate;                                                                \
        t = sentinel;                                                          \
        cr_assert_eq(kvt_tier_create(&t, &c), KVT_EINVAL, "%s", #mutate);     \
        cr_assert_eq(t, sentinel, "%s wrote *out", #mutate);                   \
    } while (0)
    EXPECT_BAD(c.geom.pages = 0);
    EXPECT_BAD(c.geom.layers = 0);
    EXPECT_BAD(c.geom.layer_bytes = 0);
    EXPECT_BAD(c.geom.layout = (kvt_layout_t)2);
    EXPECT_BAD(c.geom.pages = (uint64_t)UINT32_MAX + 1);
    EXPECT_BAD(c.geom.layer_bytes = 1ull << 62);
    EXPECT_BAD(c.kind = KVT_TIER_KIND_COUNT_);
    EXPECT_BAD(c.kind = (kvt_tier_kind_t)99);
    EXPECT_BAD(c.size = 2); /* smaller than the size field: older, smaller structs are fine (test_abi.c) */
    EXPECT_BAD(c.flags = 0x100);
    EXPECT_BAD(c.flags = KVT_TIER_ATTACH); /* shm only */
    EXPECT_BAD((c.kind = KVT_TIER_ARENA, c.flags = KVT_TIER_CHECKSUM));
    EXPECT_BAD((c.kind = KVT_TIER_ARENA, c.flags = KVT_TIER_HUGE));
    EXPECT_BAD((c.kind = KVT_TIER_ARENA, c.flags = KVT_TIER_LOCK));
    EXPECT_BAD((c.kind = KVT_TIER_CUDA, c.flags = KVT_TIER_CHECKSUM));
    EXPECT_BAD(c.flags = KVT_TIER_COPY_DMA); /* host memory: no copy way to choose */
    EXPECT_BAD((c.kind = KVT_TIER_ARENA, c.flags = KVT_TIER_COPY_KERNEL));
    EXPECT_BAD((c.kind = KVT_TIER_CUDA, c.flags = KVT_TIER_COPY_DMA | KVT_TIER_COPY_KERNEL)); /* one way or the other */
    EXPECT_BAD((c.kind = KVT_TIER_SHM, c.name = NULL));
    EXPECT_BAD((c.kind = KVT_TIER_SHM, c.name = "kvtier-no-slash"));
    EXPECT_BAD((c.kind = KVT_TIER_SHM, c.name = "/kvtier/inner"));
    EXPECT_BAD((c.kind = KVT_TIER_SHM,
                c.name = "/kvtier-a-name-that-is-much-too-long-for-a-segment-0123456789abcdef"));
    /* a label over KVT_TIER_NAME_MAX bytes (cut short it would name another tier, or end inside a character) */
    EXPECT_BAD(c.name = "a-label-of-64-bytes-0123456789abcdef0123456789abcdef0123456789ab");
#undef EXPECT_BAD
    c = good;
    c.name = "a-label-of-63-bytes-0123456789abcdef0123456789abcdef0123456789a";
    cr_assert_eq(strlen(c.name), KVT_TIER_NAME_MAX);
    cr_assert_eq(kvt_tier_create(&t, &c), KVT_OK);
    cr_assert_str_eq(kvt_tier_name(t), c.name);
    kvt_tier_destroy(t);
    cr_assert_eq(kvt_tier_create(NULL, &good), KVT_EINVAL);
    cr_assert_eq(kvt_tier_create(&t, NULL), KVT_EINVAL);
}

Test(tier, cuda_enotsup_without_cuda) {
    kvt_tier_config_t c = config(KVT_TIER_CUDA, 4, 2, 64, KVT_LAYOUT_LAYER_FIRST, 0, NULL);
    kvt_tier_t *t = NULL;
    int rc = kvt_tier_create(&t, &c);
    if (!kvt_tier_cuda_built()) {
        cr_assert_eq(rc, KVT_ENOTSUP, "%s", kvt_err_name(rc));
        cr_assert_null(t);
    } else if (rc == KVT_OK) { /* a GPU is here: its bytes must round-trip too */
        cr_assert_not(kvt_tier_host_visible(t));
        uint8_t in[64], out[64];
        kvt_pattern_fill(in, 64, 1, 2, 1);
        cr_assert_eq(kvt_tier_write(t, 3, 1, in), KVT_OK);
        cr_assert_eq(kvt_tier_read(t, 3, 1, out), KVT_OK);
        cr_assert(memcmp(in, out, 64) == 0);
        cr_assert_eq(kvt_tier_page_sum(t, 3), 0, "no page sums for device tiers");
        kvt_tier_destroy(t);
    } else {
        cr_assert_eq(rc, KVT_ENOTSUP, "no device: %s", kvt_err_name(rc));
    }
    c.device = -1;
    t = NULL;
    rc = kvt_tier_create(&t, &c);
    cr_assert_eq(rc, KVT_ENOTSUP, "device -1: %s", kvt_err_name(rc));
}

/* ---- page sums ---- */

static void check_page_sums(kvt_tier_t *t) {
    const kvt_geom_t *g = kvt_tier_geom(t);
    size_t pb = (size_t)kvt_geom_page_bytes(g);
    uint8_t *buf = malloc(pb);
    for (uint64_t p = 0; p < g->pages; p++) {
        gather(t, p, buf);
        cr_assert_eq(kvt_tier_page_sum(t, p), XXH3_64bits(buf, pb), "%s page %" PRIu64, kvt_layout_name(g->layout), p);
    }
    cr_assert_eq(kvt_tier_page_sum(t, g->pages), 0);
    cr_assert_eq(kvt_tier_page_sum(NULL, 0), 0);
    free(buf);
}

Test(tier, page_sum_is_xxh3_of_layers_in_order) {
    for (int lay = 0; lay < 2; lay++) {
        kvt_tier_t *a = make(KVT_TIER_ARENA, 11, 5, 24, (kvt_layout_t)lay, 0, NULL);
        kvt_tier_t *h = make(KVT_TIER_HOST, 11, 5, 24, (kvt_layout_t)lay, KVT_TIER_CHECKSUM, NULL);
        fill_and_check(a, 1);
        fill_and_check(h, 2);
        check_page_sums(a);
        check_page_sums(h);
        /* one byte changes the page's sum and no other page's */
        uint64_t before[11];
        for (int p = 0; p < 11; p++) before[p] = kvt_tier_page_sum(h, (uint64_t)p);
        ((uint8_t *)kvt_tier_addr(h, 6, 4))[23] ^= 1;
        for (int p = 0; p < 11; p++)
            cr_assert_eq(kvt_tier_page_sum(h, (uint64_t)p) != before[p], p == 6, "page %d", p);
        check_page_sums(h);
        kvt_tier_destroy(a);
        kvt_tier_destroy(h);
    }
}

/* ---- the pattern ---- */

Test(tier, pattern_matches_its_definition) {
    uint8_t got[80], want[80];
    for (size_t len = 0; len <= 80; len++)
        for (uint32_t layer = 0; layer < 3; layer++) {
            uint64_t lo = 0x0123456789abcdefull + len, hi = 0xfedcba9876543210ull ^ layer;
            memset(got, 0xee, sizeof(got));
            kvt_pattern_fill(got, len, lo, hi, layer);
            model_pattern(want, len, lo, hi, layer);
            cr_assert(memcmp(got, want, len) == 0, "len %zu layer %u", len, layer);
            for (size_t b = len; b < sizeof(got); b++) cr_assert_eq(got[b], 0xee, "fill wrote past len %zu", len);
            cr_assert(kvt_pattern_check(want, len, lo, hi, layer));
        }
}

Test(tier, pattern_check_rejects_any_flipped_byte) {
    enum { LEN = 37 };
    uint8_t buf[LEN], copy[LEN];
    uint64_t lo = 42, hi = 4242;
    kvt_pattern_fill(buf, LEN, lo, hi, 5);
    cr_assert(kvt_pattern_check(buf, LEN, lo, hi, 5));
    for (size_t i = 0; i < LEN; i++)
        for (int bit = 0; bit < 8; bit++) {
            memcpy(copy, buf, LEN);
            copy[i] ^= (uint8_t)(1u << bit);
            cr_assert_not(kvt_pattern_check(copy, LEN, lo, hi, 5), "byte %zu bit %d flipped", i, bit);
            copy[i] = (uint8_t)~buf[i];
            cr_assert_not(kvt_pattern_check(copy, LEN, lo, hi, 5), "byte %zu inverted", i);
        }
    cr_assert(kvt_pattern_check(buf, LEN, lo, hi, 5), "the original still passes");
    /* another layer, another hash: other content, and check says so */
    uint8_t other[LEN];
    kvt_pattern_fill(other, LEN, lo, hi, 6);
    cr_assert(memcmp(other, buf, LEN) != 0);
    cr_assert_not(kvt_pattern_check(buf, LEN, lo, hi, 6));
    kvt_pattern_fill(other, LEN, lo + 1, hi, 5);
    cr_assert(memcmp(other, buf, LEN) != 0);
    cr_assert_not(kvt_pattern_check(buf, LEN, lo + 1, hi, 5));
    kvt_pattern_fill(other, LEN, lo, hi + 1, 5);
    cr_assert(memcmp(other, buf, LEN) != 0);
    cr_assert_not(kvt_pattern_check(buf, LEN, lo, hi + 1, 5));
}

/* ---- shm ---- */

Test(tier, shm_create_attach_share_bytes) {
    const char *name = shm_name(0);
    for (int lay = 0; lay < 2; lay++) {
        for (int ck = 0; ck < 2; ck++) {
            uint32_t f = ck ? KVT_TIER_CHECKSUM : 0;
            kvt_tier_t *a = make(KVT_TIER_SHM, 12, 3, 40, (kvt_layout_t)lay, f, name);
            cr_assert(shm_exists(name));
            kvt_tier_t *b = make(KVT_TIER_SHM, 12, 3, 40, (kvt_layout_t)lay, f | KVT_TIER_ATTACH, name);
            kvt_tier_info_t ia = {.size = sizeof(ia)}, ib = {.size = sizeof(ib)};
            kvt_tier_info(a, &ia);
            kvt_tier_info(b, &ib);
            cr_assert(ia.creator);
            cr_assert_not(ib.creator);
            cr_assert_not(ia.replaced_stale);
            cr_assert_eq(kvt_tier_sums(a) != NULL, ck == 1);
            cr_assert_eq(kvt_tier_sums(b) != NULL, ck == 1);
            cr_assert_neq(kvt_tier_addr(a, 0, 0), kvt_tier_addr(b, 0, 0), "two mappings");
            fill_and_check(a, 7); /* written through the creator ... */
            uint8_t buf[40];
            for (uint64_t p = 0; p < 12; p++)
                for (uint32_t l = 0; l < 3; l++) { /* ... read through the attacher */
                    cr_assert_eq(kvt_tier_read(b, p, l, buf), KVT_OK);
                    cr_assert(kvt_pattern_check(buf, 40, hash_lo(p, 7), hash_hi(p, 7), l));
                }
            fill_and_check(b, 8); /* and the other way round */
            for (uint64_t p = 0; p < 12; p++)
                for (uint32_t l = 0; l < 3; l++) {
                    cr_assert_eq(kvt_tier_read(a, p, l, buf), KVT_OK);
                    cr_assert(kvt_pattern_check(buf, 40, hash_lo(p, 8), hash_hi(p, 8), l));
                }
            if (ck) {
                kvt_tier_sums(b)[5] = 0xabcdef;
                cr_assert_eq(kvt_tier_sums(a)[5], 0xabcdef, "the sums live in the segment");
            }
            check_page_sums(b);
            check_ranges(b);
            kvt_tier_destroy(a);
            cr_assert_not(shm_exists(name), "the creator's destroy unlinks %s", name);
            /* the attacher's mapping outlives the name */
            cr_assert_eq(kvt_tier_read(b, 11, 2, buf), KVT_OK);
            cr_assert(kvt_pattern_check(buf, 40, hash_lo(11, 8), hash_hi(11, 8), 2));
            kvt_tier_destroy(b);
            cr_assert_not(shm_exists(name));
        }
    }
}

Test(tier, shm_attach_errors) {
    const char *name = shm_name(1), *missing = shm_name(2);
    kvt_tier_t *t = NULL;
    kvt_tier_config_t c = config(KVT_TIER_SHM, 12, 3, 40, KVT_LAYOUT_PAGE_FIRST, KVT_TIER_ATTACH, missing);
    cr_assert_eq(kvt_tier_create(&t, &c), KVT_ENOENT);
    cr_assert_not(shm_exists(missing), "a failed attach creates nothing");

    kvt_tier_t *a = make(KVT_TIER_SHM, 12, 3, 40, KVT_LAYOUT_PAGE_FIRST, 0, name);
    fill_and_check(a, 1);
    kvt_tier_config_t bad[6];
    for (int i = 0; i < 6; i++) bad[i] = config(KVT_TIER_SHM, 12, 3, 40, KVT_LAYOUT_PAGE_FIRST, KVT_TIER_ATTACH, name);
    bad[0].geom.pages = 13;
    bad[1].geom.layers = 4;
    bad[2].geom.layer_bytes = 48;
    bad[3].geom.layout = KVT_LAYOUT_LAYER_FIRST;
    bad[4].flags |= KVT_TIER_CHECKSUM;
    bad[5].geom.pages = 6, bad[5].geom.layers = 6; /* the same bytes, another shape */
    for (int i = 0; i < 6; i++) {
        t = NULL;
        int rc = kvt_tier_create(&t, &bad[i]);
        cr_assert_eq(rc, KVT_EINVAL, "geometry %d: %s", i, kvt_err_name(rc));
        cr_assert_null(t);
    }
    /* a live tier holds the name */
    c = config(KVT_TIER_SHM, 12, 3, 40, KVT_LAYOUT_PAGE_FIRST, 0, name);
    cr_assert_eq(kvt_tier_create(&t, &c), KVT_EEXIST);
    c.geom.pages = 99;
    cr_assert_eq(kvt_tier_create(&t, &c), KVT_EEXIST);
    cr_assert(shm_exists(name), "the live segment is left alone");
    /* its bytes too */
    uint8_t buf[40];
    for (uint64_t p = 0; p < 12; p++)
        for (uint32_t l = 0; l < 3; l++) {
            cr_assert_eq(kvt_tier_read(a, p, l, buf), KVT_OK);
            cr_assert(kvt_pattern_check(buf, 40, hash_lo(p, 1), hash_hi(p, 1), l));
        }
    kvt_tier_destroy(a);
    cr_assert_not(shm_exists(name));
    c = config(KVT_TIER_SHM, 12, 3, 40, KVT_LAYOUT_PAGE_FIRST, KVT_TIER_ATTACH, name);
    cr_assert_eq(kvt_tier_create(&t, &c), KVT_ENOENT, "gone after the creator's destroy");
}

Test(tier, shm_stale_segment_replaced) {
    const char *name = shm_name(3);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        kvt_tier_config_t c = config(KVT_TIER_SHM, 12, 3, 40, KVT_LAYOUT_PAGE_FIRST, KVT_TIER_CHECKSUM, name);
        kvt_tier_t *t;
        if (kvt_tier_create(&t, &c) != KVT_OK) _exit(2);
        uint8_t buf[40];
        kvt_pattern_fill(buf, 40, 1, 1, 0);
        kvt_tier_write(t, 0, 0, buf);
        _exit(0); /* dies holding the name */
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child created the segment");
    cr_assert(shm_exists(name), "the dead child left %s behind", name);

    /* attaching to a dead creator's segment is refused */
    kvt_tier_t *t = NULL;
    kvt_tier_config_t c = config(KVT_TIER_SHM, 12, 3, 40, KVT_LAYOUT_PAGE_FIRST, KVT_TIER_CHECKSUM | KVT_TIER_ATTACH, name);
    cr_assert_eq(kvt_tier_create(&t, &c), KVT_ENOENT);

    /* another geometry, so the new segment cannot be the old one reused */
    t = make(KVT_TIER_SHM, 20, 2, 16, KVT_LAYOUT_LAYER_FIRST, 0, name);
    kvt_tier_info_t info = {.size = sizeof(info)};
    cr_assert_eq(kvt_tier_info(t, &info), KVT_OK);
    cr_assert(info.replaced_stale);
    cr_assert(info.creator);
    cr_assert_null(kvt_tier_sums(t));
    uint8_t zero[16] = {0}, buf[16];
    for (uint64_t p = 0; p < 20; p++)
        for (uint32_t l = 0; l < 2; l++) {
            cr_assert_eq(kvt_tier_read(t, p, l, buf), KVT_OK);
            cr_assert(memcmp(buf, zero, 16) == 0, "a fresh segment is zeroed");
        }
    fill_and_check(t, 4);
    kvt_tier_t *b = make(KVT_TIER_SHM, 20, 2, 16, KVT_LAYOUT_LAYER_FIRST, KVT_TIER_ATTACH, name);
    kvt_tier_destroy(b);
    kvt_tier_destroy(t);
    cr_assert_not(shm_exists(name), "destroy cleans the replacement");
}

/* In a /dev/shm of 8 MiB (a mount namespace of its own: a container's
 * small /dev/shm), an shm tier of 32 MiB is refused at creation with
 * nothing left there; it was created and then killed the process with
 * SIGBUS at its first write past the 8 MiB. One of 4 MiB is created and
 * every page written. 77: this process may not make the namespace. */
static int small_dev_shm(void) {
    if (unshare(CLONE_NEWNS) != 0 || mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=8m") != 0)
        return 77;
    kvt_tier_config_t c = {.size = sizeof(c), .kind = KVT_TIER_SHM, .name = "/kvt-small-shm",
                           .geom = {.pages = 128, .layers = 1, .layer_bytes = 256 << 10, .layout = KVT_LAYOUT_PAGE_FIRST}};
    kvt_tier_t *t = NULL;
    int rc = kvt_tier_create(&t, &c);
    if (rc != KVT_ENOMEM) return fprintf(stderr, "32 MiB: %s\n", kvt_err_name(rc)), 1;
    DIR *d = opendir("/dev/shm");
    for (struct dirent *e; d && (e = readdir(d)) != NULL;)
        if (e->d_name[0] != '.') return fprintf(stderr, "left behind: %s\n", e->d_name), 1;
    if (d) closedir(d);
    c.geom.pages = 16;
    if ((rc = kvt_tier_create(&t, &c)) != KVT_OK) return fprintf(stderr, "4 MiB: %s\n", kvt_err_name(rc)), 1;
    static uint8_t page[256 << 10];
    for (uint32_t p = 0; p < 16; p++) {
        memset(page, (int)p + 1, sizeof(page));
        if (kvt_tier_write(t, p, 0, page) != KVT_OK) return 1;
    }
    kvt_tier_destroy(t);
    return 0;
}

Test(tier, an_shm_tier_dev_shm_cannot_hold_is_refused_at_creation) {
    pid_t child = fork();
    cr_assert_geq(child, 0);
    if (child == 0) _exit(small_dev_shm());
    int status = 0;
    cr_assert_eq(waitpid(child, &status, 0), child);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 77) cr_skip_test("no mount namespace for this process (not root)");
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child: %s %d",
              WIFSIGNALED(status) ? "killed by signal" : "exit", WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
}

/* A live segment whose name only looks like another name's unfinished one
 * (<name>.<pid>.tmp, the pid dead) is left alone when that name is created
 * (the creator's clean-up removed it: a CP tier suffix "a.9.tmp" made rank 0
 * unlink its group's own tier); a real leftover of the dead pid goes. */
Test(tier, a_live_segment_named_like_a_leftover_is_kept) {
    pid_t dead = fork();
    cr_assert_geq(dead, 0);
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    const char *name = shm_name(9);
    char looks[96], leftover[128];
    snprintf(looks, sizeof(looks), "%s.%d.tmp", name, (int)dead);
    snprintf(leftover, sizeof(leftover), "/dev/shm%s.%d.7.tmp", name, (int)dead);
    kvt_tier_t *live = make(KVT_TIER_SHM, 4, 1, 64, KVT_LAYOUT_PAGE_FIRST, 0, looks);
    int fd = open(leftover, O_CREAT | O_RDWR, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, 1 << 16), 0);
    close(fd);
    kvt_tier_t *t = make(KVT_TIER_SHM, 4, 1, 64, KVT_LAYOUT_PAGE_FIRST, 0, name);
    cr_assert(shm_exists(looks), "the live segment %s was removed", looks);
    cr_assert_neq(access(leftover, F_OK), 0, "the dead pid's leftover is still there");
    kvt_tier_t *b = make(KVT_TIER_SHM, 4, 1, 64, KVT_LAYOUT_PAGE_FIRST, KVT_TIER_ATTACH, looks);
    kvt_tier_destroy(b);
    kvt_tier_destroy(t);
    kvt_tier_destroy(live);
    cr_assert_not(shm_exists(looks));
}

/* Anything under the name that is not a finished kvtier segment is someone
 * else's: never replaced (a kvtier creator publishes only finished segments). */
static void foreign_case(uint8_t byte, size_t len) {
    const char *name = shm_name(4);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    cr_assert_geq(fd, 0, "shm_open: %s", strerror(errno));
    uint8_t junk[8192];
    memset(junk, byte, sizeof(junk));
    cr_assert_eq(write(fd, junk, len), (ssize_t)len);
    close(fd);
    kvt_tier_t *t = NULL;
    kvt_tier_config_t c = config(KVT_TIER_SHM, 12, 3, 40, KVT_LAYOUT_PAGE_FIRST, 0, name);
    int rc = kvt_tier_create(&t, &c);
    cr_assert_eq(rc, KVT_EEXIST, "%zu bytes of %#x: %s", len, byte, kvt_err_name(rc));
    cr_assert_null(t);
    c.flags = KVT_TIER_ATTACH;
    rc = kvt_tier_create(&t, &c);
    cr_assert_eq(rc, KVT_ENOENT, "not a kvtier segment: %s", kvt_err_name(rc));
    cr_assert(shm_exists(name), "the foreign file is still there");
    fd = shm_open(name, O_RDONLY, 0);
    cr_assert_geq(fd, 0);
    uint8_t back[8192];
    cr_assert_eq(read(fd, back, sizeof(back)), (ssize_t)len);
    close(fd);
    cr_assert(memcmp(back, junk, len) == 0, "and untouched");
    cr_assert_eq(shm_unlink(name), 0);
}

Test(tier, shm_foreign_segment_left_alone) {
    foreign_case(0xab, 8192);
    foreign_case(0x00, 8192); /* zeros: not a kvtier header */
    foreign_case(0xab, 16);   /* shorter than a header */
    foreign_case(0x00, 0);    /* empty */
}

/* /dev/shm is everyone's: a FIFO under the name (which an open without
 * O_NONBLOCK waits on for ever) or a symbolic link (which leads elsewhere)
 * is not a segment: refused at once, left as it is, what it points at
 * untouched. */
Test(tier, shm_a_fifo_or_a_link_under_the_name_is_left_alone, .timeout = 30) {
    const char *name = shm_name(6), *target = shm_name(7);
    char path[96], to[96];
    snprintf(path, sizeof(path), "/dev/shm%s", name);
    snprintf(to, sizeof(to), "/dev/shm%s", target);
    kvt_tier_config_t c = config(KVT_TIER_SHM, 12, 3, 40, KVT_LAYOUT_PAGE_FIRST, 0, name);
    kvt_tier_t *t = NULL;
    cr_assert_eq(mkfifo(path, 0600), 0, "mkfifo: %s", strerror(errno));
    int rc = kvt_tier_create(&t, &c);
    cr_assert_eq(rc, KVT_EEXIST, "a FIFO under the name: %s", kvt_err_name(rc));
    struct stat sb;
    cr_assert(lstat(path, &sb) == 0 && S_ISFIFO(sb.st_mode), "the FIFO is still there");
    cr_assert_eq(unlink(path), 0);
    int fd = open(to, O_CREAT | O_EXCL | O_RDWR, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "theirs", 6), 6);
    close(fd);
    cr_assert_eq(symlink(to, path), 0);
    rc = kvt_tier_create(&t, &c);
    cr_assert_eq(rc, KVT_EEXIST, "a link under the name: %s", kvt_err_name(rc));
    cr_assert(lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode), "the link is still there");
    char back[8] = {0};
    fd = open(to, O_RDONLY);
    cr_assert(fd >= 0 && read(fd, back, sizeof(back)) == 6 && memcmp(back, "theirs", 6) == 0, "its target untouched");
    close(fd);
    unlink(path);
    unlink(to);
}

/* Two threads of one process create one name at once, over and over: one
 * gets the name and the other KVT_EEXIST; an attacher by name maps what
 * the creator wrote; a destroyed tier leaves no name behind. */
static kvt_tier_config_t g_same;
static pthread_barrier_t g_same_bar;
static void *create_same(void *out) {
    pthread_barrier_wait(&g_same_bar);
    kvt_tier_t **t = out;
    int rc = kvt_tier_create(t, &g_same);
    if (rc != KVT_OK) *t = NULL;
    return (void *)(intptr_t)rc;
}

Test(tier, shm_two_threads_create_one_name) {
    const char *name = shm_name(8);
    g_same = config(KVT_TIER_SHM, 4, 1, 4096, KVT_LAYOUT_PAGE_FIRST, 0, name);
    kvt_tier_config_t at = g_same;
    at.flags = KVT_TIER_ATTACH;
    uint8_t w[4096], r[4096];
    for (int round = 0; round < 1500; round++) {
        pthread_barrier_init(&g_same_bar, NULL, 2);
        pthread_t th[2];
        kvt_tier_t *t[2];
        void *rc[2];
        for (int k = 0; k < 2; k++) cr_assert_eq(pthread_create(&th[k], NULL, create_same, &t[k]), 0);
        for (int k = 0; k < 2; k++) pthread_join(th[k], &rc[k]);
        pthread_barrier_destroy(&g_same_bar);
        int won = 0;
        for (int k = 0; k < 2; k++) {
            int e = (int)(intptr_t)rc[k];
            cr_assert(e == KVT_OK || e == KVT_EEXIST, "round %d: %s", round, kvt_err_name(e));
            won += e == KVT_OK;
        }
        cr_assert_eq(won, 1, "round %d: %d threads got the name", round, won);
        for (int k = 0; k < 2; k++) {
            if (t[k] == NULL) continue;
            memset(w, 0x40 + k + 2 * (round % 64), sizeof(w));
            cr_assert_eq(kvt_tier_write(t[k], 1, 0, w), KVT_OK);
            kvt_tier_t *a = NULL;
            int e = kvt_tier_create(&a, &at); /* the name is this creator's while it lives */
            cr_assert_eq(e, KVT_OK, "round %d: thread %d created the tier, yet attaching its name: %s", round, k,
                         kvt_err_name(e));
            cr_assert_eq(kvt_tier_read(a, 1, 0, r), KVT_OK);
            cr_assert(memcmp(w, r, sizeof(w)) == 0, "round %d: an attacher maps memory the creator does not", round);
            kvt_tier_destroy(a);
            kvt_tier_destroy(t[k]);
        }
        cr_assert_not(shm_exists(name), "round %d: the name outlived its creator", round);
    }
}

/* ---- nothing left behind ---- */

static uint64_t live_bytes(void) {
    kvt_mem_stats_t st = {.size = sizeof(st)};
    kvt_mem_stats(&st);
    return st.live_bytes;
}

Test(tier, allocation_failure_leaves_nothing) {
    const char *name = shm_name(5);
    static const kvt_tier_kind_t kinds[] = {KVT_TIER_ARENA, KVT_TIER_HOST, KVT_TIER_SHM};
    for (int k = 0; k < 3; k++) {
        uint32_t flags = kinds[k] == KVT_TIER_ARENA ? 0 : KVT_TIER_CHECKSUM;
        kvt_tier_config_t c = config(kinds[k], 8, 2, 32, KVT_LAYOUT_PAGE_FIRST, flags, name);
        uint64_t before = live_bytes();
        int failures = 0;
        for (uint64_t nth = 1; nth < 10; nth++) {
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
            failures++;
            cr_assert_eq(rc, KVT_ENOMEM, "%s nth %" PRIu64 ": %s", kvt_tier_kind_name(kinds[k]), nth, kvt_err_name(rc));
            cr_assert_null(t);
            cr_assert_eq(live_bytes(), before, "%s nth %" PRIu64 " leaked", kvt_tier_kind_name(kinds[k]), nth);
            cr_assert_not(shm_exists(name), "nth %" PRIu64 " left the segment", nth);
        }
        cr_assert_geq(failures, 1);
        cr_assert_eq(live_bytes(), before);
        cr_assert_not(shm_exists(name));
    }
}

/* kvt_tier_pattern_fill/check: every layer of the page holds kvt_pattern_fill's
 * content at its own address (both layouts); a flipped byte in any layer, or
 * another hash, fails the check; neighbours are untouched. */
Test(tier, whole_page_pattern) {
    for (int lay = 0; lay < 2; lay++) {
        kvt_tier_t *t;
        kvt_tier_config_t c = config(KVT_TIER_ARENA, 6, 3, 40, (kvt_layout_t)lay, 0, NULL);
        cr_assert_eq(kvt_tier_create(&t, &c), KVT_OK);
        uint8_t scratch[40], want[40];
        cr_assert_eq(kvt_tier_pattern_fill(t, 4, 11, 22, scratch), KVT_OK);
        for (uint32_t l = 0; l < 3; l++) {
            kvt_pattern_fill(want, sizeof(want), 11, 22, l);
            cr_assert(memcmp(kvt_tier_addr(t, 4, l), want, sizeof(want)) == 0, "layout %d layer %u", lay, l);
            for (uint32_t p = 0; p < 6; p++)
                if (p != 4) cr_assert(kvt_tier_addr(t, p, l) && ((uint8_t *)kvt_tier_addr(t, p, l))[0] == 0, "page %u untouched", p);
        }
        cr_assert(kvt_tier_pattern_check(t, 4, 11, 22, scratch));
        cr_assert(!kvt_tier_pattern_check(t, 4, 11, 23, scratch));
        for (uint32_t l = 0; l < 3; l++) {
            ((uint8_t *)kvt_tier_addr(t, 4, l))[39] ^= 1;
            cr_assert(!kvt_tier_pattern_check(t, 4, 11, 22, scratch), "layer %u flipped", l);
            ((uint8_t *)kvt_tier_addr(t, 4, l))[39] ^= 1;
        }
        cr_assert_eq(kvt_tier_pattern_fill(t, 6, 1, 1, scratch), KVT_ERANGE);
        kvt_tier_destroy(t);
    }
}
