/* The ABI rule for structs with a `size` field (src/core/abi-int.h): an
 * older, smaller struct gets the defaults for what it does not know; a
 * newer, larger one is accepted only with a zero tail; statistics are
 * written only as far as the caller's struct reaches. Checked through the
 * public calls, against what the full-size calls give. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier/kvtier.h"

/* A program built when kvt_cache_config_t ended after l2_pages. */
Test(abi, older_smaller_config_takes_the_defaults) {
    unsigned char buf[sizeof(kvt_cache_config_t) + 16];
    memset(buf, 0xFF, sizeof(buf)); /* what lies past the old struct is not the library's to read */
    kvt_cache_config_t old;
    memset(&old, 0, sizeof(old));
    old.size = (uint32_t)offsetof(kvt_cache_config_t, l1_lanes);
    old.page_tokens = 16;
    old.l1_pages = 1000;
    old.l2_pages = 0;
    memcpy(buf, &old, old.size);
    kvt_cache_t *c = NULL;
    cr_assert_eq(kvt_cache_create(&c, (const kvt_cache_config_t *)(void *)buf), KVT_OK);
    kvt_cache_stats_t st = {.size = sizeof(st)};
    cr_assert_eq(kvt_cache_stats(c, &st), KVT_OK);
    kvt_cache_config_t def;
    kvt_cache_config_default(&def);
    cr_assert_eq(st.l1_target, (uint64_t)(1000 * def.l1_free_room + 0.5), "the default free room: %llu",
                 (unsigned long long)st.l1_target);
    int32_t tok[64];
    for (int i = 0; i < 64; i++) tok[i] = i;
    kvt_cache_req_t req;
    cr_assert_eq(kvt_cache_admit(c, 0, tok, 64, 0, NULL, &req), KVT_OK, "one lane (the default) works");
    cr_assert_eq(req.new_pages, 4);
    kvt_cache_release(c, &req);
    kvt_cache_destroy(c);
}

/* A program built against a newer header: a zero tail is fine, a set field is not. */
Test(abi, newer_larger_config_needs_a_zero_tail) {
    struct {
        kvt_cache_config_t cfg;
        uint64_t future[2];
    } big;
    memset(&big, 0, sizeof(big));
    kvt_cache_config_default(&big.cfg);
    big.cfg.l1_pages = 100;
    big.cfg.l2_pages = 0;
    big.cfg.size = sizeof(big);
    kvt_cache_t *c = NULL;
    cr_assert_eq(kvt_cache_create(&c, &big.cfg), KVT_OK);
    kvt_cache_destroy(c);
    big.future[1] = 7;
    c = NULL;
    cr_assert_eq(kvt_cache_create(&c, &big.cfg), KVT_EINVAL);
    cr_assert_null(c, "nothing made");
    big.cfg.size = 2; /* not even the size field */
    big.future[1] = 0;
    cr_assert_eq(kvt_cache_create(&c, &big.cfg), KVT_EINVAL);
}

/* Statistics into an older, smaller struct: exactly the fields it has. */
Test(abi, stats_fill_only_what_the_caller_has) {
    kvt_extalloc_t *a;
    cr_assert_eq(kvt_extalloc_create(&a, 1000), KVT_OK);
    kvt_run_t runs[4];
    size_t n;
    cr_assert_eq(kvt_extalloc_reserve(a, 10, runs, 4, &n), KVT_OK);
    kvt_extalloc_stats_t full = {.size = sizeof(full)};
    cr_assert_eq(kvt_extalloc_stats(a, &full), KVT_OK);
    unsigned char buf[sizeof(kvt_extalloc_stats_t)];
    memset(buf, 0xAB, sizeof(buf));
    uint32_t size = (uint32_t)offsetof(kvt_extalloc_stats_t, free_extents);
    memcpy(buf, &size, sizeof(size));
    cr_assert_eq(kvt_extalloc_stats(a, (kvt_extalloc_stats_t *)(void *)buf), KVT_OK);
    cr_assert_eq(memcmp(buf + sizeof(uint32_t), (unsigned char *)&full + sizeof(uint32_t), size - sizeof(uint32_t)), 0,
                 "the fields it has are the full call's");
    for (size_t i = size; i < sizeof(buf); i++) cr_assert_eq(buf[i], 0xAB, "byte %zu past its struct written", i);
    uint32_t kept;
    memcpy(&kept, buf, sizeof(kept));
    cr_assert_eq(kept, size, "its size is kept");
    kvt_extalloc_destroy(a);
}

/* ---- the other half of the rule: frozen structs ---------------------------------- */

/* Every struct of the public headers without a leading `size` (arrays'
 * elements, events, requests, embedded parts) keeps its layout for the life
 * of a soname (docs/abi.md). Their sizes on LP64 for the soname below: one
 * that changes fails here until the soname changes (version.h's minor
 * before 1.0, its major after) and the table is recorded anew. */
#define FROZEN_SONAME "0.4"
#define F(t, n) {#t, sizeof(t), n}
static const struct {
    const char *name;
    size_t size, recorded;
} FROZEN[] = {
    F(kvt_run_t, 8),
    F(kvt_cache_req_t, 88),
    F(kvt_cp_layout_t, 24),
    F(kvt_cp_pair_t, 16),
    F(kvt_key128_t, 16),
    F(kvt_keyed_event_t, 24),
    F(kvt_model_t, 40),
    F(kvt_layer_group_t, 24),
    F(kvt_hybrid_req_t, 120),
    F(kvt_hybrid_group_bytes_t, 48),
    F(kvt_hybrid_move_t, 48),
    F(kvt_hybrid_plane_group_t, 48),
    F(kvt_pd_rank_stats_t, 18056),
    F(kvt_pd_event_t, 48),
    F(kvt_page_t, 12),
    F(kvt_hash128_t, 16),
    F(kvt_rng_t, 32),
    F(kvt_hist_t, 17952),
    F(kvt_store_page_t, 24),
    F(kvt_store_done_t, 64),
    F(kvt_geom_t, 32),
    F(kvt_tier_plane_t, 40),
    F(kvt_xfer_copy_t, 8),
    F(kvt_xfer_done_t, 56),
    F(kvt_trace_req_t, 40),
    F(kvt_trace_t, 40),
};
#define NFROZEN (sizeof(FROZEN) / sizeof(FROZEN[0]))

static void soname(char *out, size_t n) {
    if (KVT_VERSION_MAJOR == 0) snprintf(out, n, "0.%d", KVT_VERSION_MINOR);
    else snprintf(out, n, "%d", KVT_VERSION_MAJOR);
}

Test(abi, frozen_structs_keep_their_size_for_the_soname) {
    if (sizeof(void *) != 8) cr_skip_test("sizes recorded on LP64");
    char so[16];
    soname(so, sizeof(so));
    cr_assert_str_eq(so, FROZEN_SONAME, "the soname changed to %s: record the frozen sizes for it", so);
    for (size_t i = 0; i < NFROZEN; i++)
        cr_expect_eq(FROZEN[i].size, FROZEN[i].recorded,
                     "%s is %zu bytes, %zu under soname %s: a struct without `size` changes only with the soname",
                     FROZEN[i].name, FROZEN[i].size, FROZEN[i].recorded, so);
}

/* Reads include/kvtier/NAME, comments removed. */
static char *header_text(const char *name) {
    char path[512];
    snprintf(path, sizeof(path), "%s/include/kvtier/%s", KVT_SOURCE_DIR, name);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *s = calloc((size_t)n + 1, 1);
    cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    for (char *c = strstr(s, "/*"); c; c = strstr(c, "/*")) {
        char *e = strstr(c + 2, "*/");
        cr_assert_not_null(e, "%s: an unterminated comment", name);
        memset(c, ' ', (size_t)(e + 2 - c));
    }
    return s;
}

/* Each typedef'd struct of the public headers either starts with `uint32_t
 * size` or is in FROZEN, and FROZEN names only such structs: a new struct
 * comes under one half of the rule or the other. */
Test(abi, every_public_struct_is_sized_or_frozen) {
    char dirpath[512];
    snprintf(dirpath, sizeof(dirpath), "%s/include/kvtier", KVT_SOURCE_DIR);
    DIR *d = opendir(dirpath);
    cr_assert_not_null(d);
    bool seen[NFROZEN] = {0};
    unsigned sized = 0;
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        size_t len = strlen(de->d_name);
        if (len < 3 || strcmp(de->d_name + len - 2, ".h") != 0) continue;
        char *s = header_text(de->d_name);
        for (char *p = strstr(s, "typedef struct"); p; p = strstr(p + 1, "typedef struct")) {
            char *open = strchr(p, '{'), *semi = strchr(p, ';');
            if (open == NULL || (semi && semi < open)) continue; /* a declaration of an opaque handle */
            int depth = 1;
            char *c = open + 1;
            for (; *c && depth; c++) depth += (*c == '{') - (*c == '}');
            char name[128] = "";
            cr_assert_eq(sscanf(c, " %127[A-Za-z0-9_]", name), 1, "%s: a struct without a typedef name", de->d_name);
            char first[64] = "", second[64] = "";
            sscanf(open + 1, " %63s %63[A-Za-z0-9_]", first, second);
            if (strcmp(first, "uint32_t") == 0 && strcmp(second, "size") == 0) {
                sized++;
                continue;
            }
            size_t k = 0;
            while (k < NFROZEN && strcmp(FROZEN[k].name, name) != 0) k++;
            cr_expect_lt(k, NFROZEN, "%s (%s): neither starts with `uint32_t size` nor is frozen (FROZEN)", name,
                         de->d_name);
            if (k < NFROZEN) seen[k] = true;
        }
        free(s);
    }
    closedir(d);
    cr_assert_gt(sized, 15, "the sized structs were found too (%u)", sized);
    for (size_t k = 0; k < NFROZEN; k++)
        cr_expect(seen[k], "%s is in FROZEN but is no unsized struct of the public headers", FROZEN[k].name);
}
