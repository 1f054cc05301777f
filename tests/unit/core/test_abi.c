/* The ABI rule for structs with a `size` field (src/core/abi-int.h): an
 * older, smaller struct gets the defaults for what it does not know; a
 * newer, larger one is accepted only with a zero tail; statistics are
 * written only as far as the caller's struct reaches. Checked through the
 * public calls, against what the full-size calls give. */
#include <criterion/criterion.h>
#include <stddef.h>
#include <string.h>

#include "kvtier/alloc.h"
#include "kvtier/cache.h"
#include "kvtier/error.h"

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
