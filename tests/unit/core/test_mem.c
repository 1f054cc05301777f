#include <criterion/criterion.h>

#include "core/mem-int.h"
#include "kvtier/error.h"
#include "kvtier/mem.h"

Test(mem, counts_bytes_and_injects_failures) {
    kvt_mem_stats_t a = {.size = sizeof(a)}, b = {.size = sizeof(b)};
    cr_assert_eq(kvt_mem_stats(&a), KVT_OK);
    void *p = kvt__malloc(100), *q = kvt__calloc(10, 30);
    void *r = kvt__realloc(p, 100, 1000);
    cr_assert(q && r);
    kvt_mem_stats(&b);
    cr_assert_eq(b.live_bytes - a.live_bytes, 1300);
    cr_assert_eq(b.allocs - a.allocs, 2);
    kvt__free(r, 1000);
    kvt__free(q, 300);
    kvt_mem_stats(&b);
    cr_assert_eq(b.live_bytes, a.live_bytes);
    cr_assert_geq(b.peak_bytes, a.live_bytes + 1300);

    kvt__mem_fail_nth(3);
    void *x1 = kvt__malloc(8), *x2 = kvt__malloc(8), *x3 = kvt__malloc(8), *x4 = kvt__malloc(8);
    cr_assert(x1 && x2 && !x3 && x4, "only the third allocation fails");
    cr_assert(kvt__mem_fail_fired());
    cr_assert_eq(kvt__mem_attempts(), 4);
    kvt__free(x1, 8);
    kvt__free(x2, 8);
    kvt__free(x4, 8);
    kvt__mem_fail_nth(0);
    cr_assert_null(kvt__calloc(SIZE_MAX / 2, 4), "overflowing calloc fails");
}

static size_t g_custom;
static void *my_malloc(void *ctx, size_t n) { (void)ctx; g_custom += n; return malloc(n); }
static void *my_realloc(void *ctx, void *p, size_t o, size_t n) { (void)ctx; g_custom += n - o; return realloc(p, n); }
static void my_free(void *ctx, void *p, size_t n) { (void)ctx; g_custom -= n; free(p); }

Test(mem, custom_allocator) {
    kvt_allocator_t bad = {sizeof(bad), my_malloc, NULL, my_free, NULL};
    cr_assert_eq(kvt_set_allocator(&bad), KVT_EINVAL);
    kvt_allocator_t unsized = {0, my_malloc, my_realloc, my_free, NULL};
    cr_assert_eq(kvt_set_allocator(&unsized), KVT_EINVAL, "no size");
    kvt_allocator_t good = {sizeof(good), my_malloc, my_realloc, my_free, NULL};
    cr_assert_eq(kvt_set_allocator(&good), KVT_OK);
    void *p = kvt__malloc(64);
    cr_assert_eq(g_custom, 64);
    kvt__free(p, 64);
    cr_assert_eq(g_custom, 0);
    cr_assert_eq(kvt_set_allocator(NULL), KVT_OK);
    p = kvt__malloc(64);
    cr_assert_eq(g_custom, 0, "libc again");
    kvt__free(p, 64);
}
