#include "../core/abi-int.h"
#include "mem-int.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "kvtier/error.h"
#include "kvtier/mem.h"

static void *libc_malloc(void *ctx, size_t size) { (void)ctx; return malloc(size); }
static void *libc_realloc(void *ctx, void *p, size_t o, size_t n) { (void)ctx; (void)o; return realloc(p, n); }
static void libc_free(void *ctx, void *p, size_t size) { (void)ctx; (void)size; free(p); }

static kvt_allocator_t g_alloc = {sizeof(kvt_allocator_t), libc_malloc, libc_realloc, libc_free, NULL};

static _Atomic uint64_t g_allocs, g_frees, g_failed;
static _Atomic int64_t g_live, g_peak;
/* fault injection: g_fail_left counts down; the allocation that takes it to 0 fails */
static _Atomic uint64_t g_fail_left, g_attempts;
static _Atomic int g_fail_fired;
/* fault injection by site (tests/faults/): asked about every allocation */
static kvt__mem_hook_fn g_hook;
static void *g_hook_arg;

int kvt_set_allocator(const kvt_allocator_t *a) {
    if (a == NULL) {
        g_alloc = (kvt_allocator_t){sizeof(kvt_allocator_t), libc_malloc, libc_realloc, libc_free, NULL};
        return KVT_OK;
    }
    kvt_allocator_t full = {.size = sizeof(full)};
    if (kvt__abi_in(&full, sizeof(full), a) != KVT_OK || !full.malloc_fn || !full.realloc_fn || !full.free_fn)
        return KVT_EINVAL;
    g_alloc = full;
    return KVT_OK;
}

int kvt_mem_stats(kvt_mem_stats_t *out) {
    if (out == NULL) return KVT_EINVAL;
    kvt_mem_stats_t full = {.size = sizeof(full)}, *st = &full;
    st->allocs = atomic_load_explicit(&g_allocs, memory_order_relaxed);
    st->frees = atomic_load_explicit(&g_frees, memory_order_relaxed);
    st->failed = atomic_load_explicit(&g_failed, memory_order_relaxed);
    st->live_bytes = atomic_load_explicit(&g_live, memory_order_relaxed);
    st->peak_bytes = atomic_load_explicit(&g_peak, memory_order_relaxed);
    return kvt__abi_out(out, st, sizeof(*st));
}

void kvt__mem_fail_nth(uint64_t nth) {
    atomic_store(&g_attempts, 0);
    atomic_store(&g_fail_fired, 0);
    atomic_store(&g_fail_left, nth);
}

void kvt__mem_set_hook(kvt__mem_hook_fn fn, void *arg) {
    g_hook_arg = arg;
    g_hook = fn;
}

uint64_t kvt__mem_attempts(void) { return atomic_load(&g_attempts); }
int kvt__mem_fail_fired(void) { return atomic_load(&g_fail_fired); }

/* True when this allocation, made by the code at `site`, must fail by
 * injection. */
static int inject_failure(const void *site) {
    atomic_fetch_add_explicit(&g_attempts, 1, memory_order_relaxed);
    if (g_hook != NULL && g_hook(g_hook_arg, site)) {
        atomic_store(&g_fail_fired, 1);
        return 1;
    }
    uint64_t left = atomic_load_explicit(&g_fail_left, memory_order_relaxed);
    while (left != 0) {
        if (atomic_compare_exchange_weak(&g_fail_left, &left, left - 1)) {
            if (left == 1) {
                atomic_store(&g_fail_fired, 1);
                return 1;
            }
            return 0;
        }
    }
    return 0;
}

int kvt__mem_pooled_fails(void) { return inject_failure(__builtin_return_address(0)); }

static void account_alloc(int64_t delta) {
    int64_t live = atomic_fetch_add_explicit(&g_live, delta, memory_order_relaxed) + delta;
    int64_t peak = atomic_load_explicit(&g_peak, memory_order_relaxed);
    while (live > peak && !atomic_compare_exchange_weak(&g_peak, &peak, live)) {
    }
}

static void *malloc_at(size_t size, const void *site) {
    if (size == 0) size = 1;
    void *p = inject_failure(site) ? NULL : g_alloc.malloc_fn(g_alloc.ctx, size);
    if (p == NULL) {
        atomic_fetch_add_explicit(&g_failed, 1, memory_order_relaxed);
        return NULL;
    }
    atomic_fetch_add_explicit(&g_allocs, 1, memory_order_relaxed);
    account_alloc((int64_t)size);
    return p;
}

void *kvt__malloc(size_t size) { return malloc_at(size, __builtin_return_address(0)); }

static size_t huge_align(size_t n) { return n >= KVT__HUGE_PAGE ? KVT__HUGE_PAGE : 64; }

void *kvt__malloc_huge(size_t n, void **raw) {
    size_t align = huge_align(n);
    *raw = n > SIZE_MAX - align ? NULL : malloc_at(n + align, __builtin_return_address(0));
    if (*raw == NULL) return NULL;
    void *p = (void *)(((uintptr_t)*raw + align - 1) & ~(uintptr_t)(align - 1));
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (align == KVT__HUGE_PAGE) (void)madvise(p, n, MADV_HUGEPAGE); /* a hint: without THP, 4 KiB pages */
#endif
    return p;
}

void kvt__free_huge(void *raw, size_t n) { kvt__free(raw, n + huge_align(n)); }

void *kvt__calloc(size_t n, size_t size) {
    if (size != 0 && n > SIZE_MAX / size) {
        atomic_fetch_add_explicit(&g_failed, 1, memory_order_relaxed);
        return NULL;
    }
    void *p = malloc_at(n * size, __builtin_return_address(0));
    if (p) memset(p, 0, n * size);
    return p;
}

void *kvt__realloc(void *p, size_t old_size, size_t new_size) {
    const void *site = __builtin_return_address(0);
    if (p == NULL) return malloc_at(new_size, site);
    if (new_size == 0) new_size = 1;
    if (old_size == 0) old_size = 1;
    void *q = inject_failure(site) ? NULL : g_alloc.realloc_fn(g_alloc.ctx, p, old_size, new_size);
    if (q == NULL) {
        atomic_fetch_add_explicit(&g_failed, 1, memory_order_relaxed);
        return NULL; /* p is untouched, as with realloc */
    }
    account_alloc((int64_t)new_size - (int64_t)old_size);
    return q;
}

void kvt__free(void *p, size_t size) {
    if (p == NULL) return;
    if (size == 0) size = 1;
    atomic_fetch_add_explicit(&g_frees, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&g_live, -(int64_t)size, memory_order_relaxed);
    g_alloc.free_fn(g_alloc.ctx, p, size);
}
