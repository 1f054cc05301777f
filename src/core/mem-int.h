/* Internal allocation entry points: every allocation in kvtier calls these.
 * Sizes are passed to free and realloc so that byte counts are exact without a
 * per-block header. */
#ifndef KVTIER_MEM_INT_H
#define KVTIER_MEM_INT_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier/error.h"

void *kvt__malloc(size_t size);
void *kvt__calloc(size_t n, size_t size);          /* zeroed; overflow-checked */
void *kvt__realloc(void *p, size_t old_size, size_t new_size);
void kvt__free(void *p, size_t size);              /* NULL is a no-op */
/* A large table or arena touched all over (at random, or carved as it
 * grows): n bytes from a 2 MiB boundary, asked for transparent huge pages
 * (Linux: one fault and one TLB entry per 2 MiB), when n is 2 MiB or more;
 * a smaller n starts on a cache line. The allocator (malloc, or the
 * engine's) aligns only to 16 bytes, so the block is asked for with the
 * alignment as slack, at the caller's allocation site; the slack is never
 * touched. *raw is what kvt__free_huge takes back, with the same n. */
#define KVT__HUGE_PAGE ((size_t)2 << 20)
void *kvt__malloc_huge(size_t n, void **raw);
void kvt__free_huge(void *raw, size_t n); /* NULL is a no-op */

/* An allocation a module serves from its own pool (memory it already holds):
 * an allocation point all the same, counted and open to injected failure.
 * Nonzero: fail it. */
int kvt__mem_pooled_fails(void);

/* Test hook: the nth allocation from now (1 = the next one) fails; 0 disables.
 * Returns how many allocations have been attempted since the hook was armed. */
void kvt__mem_fail_nth(uint64_t nth);
uint64_t kvt__mem_attempts(void);
/* Test hook: true once the armed failure has fired (it then disarms). */
int kvt__mem_fail_fired(void);
/* Test hook (tests/faults/alloc.c): fn(arg, site) is asked about every
 * allocation attempt, on the allocating thread, with the return address of
 * the kvt__malloc / calloc / realloc / pooled_fails call (the allocation
 * site); nonzero fails the allocation (and sets kvt__mem_fail_fired). Set
 * it, or clear it (NULL), while no other thread allocates. */
typedef int (*kvt__mem_hook_fn)(void *arg, const void *site);
void kvt__mem_set_hook(kvt__mem_hook_fn fn, void *arg);

/* *p holds *cap elements of elem bytes: grown, by doubling, to hold need,
 * the contents kept. KVT_ENOMEM (also when the size would overflow) changes
 * nothing. Inline, so that where it is inlined (optimised builds) each
 * caller is its own allocation site for the fault campaigns. */
static inline int kvt__grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return KVT_OK;
    size_t n = *cap < 16 ? 16 : *cap;
    while (n < need) {
        if (n > SIZE_MAX / 2) return KVT_ENOMEM;
        n *= 2;
    }
    if (n > SIZE_MAX / elem) return KVT_ENOMEM;
    void *q = kvt__realloc(*p, *cap * elem, n * elem);
    if (q == NULL) return KVT_ENOMEM;
    *p = q;
    *cap = n;
    return KVT_OK;
}

#define KVT_NEW(type) ((type *)kvt__calloc(1, sizeof(type)))
#define KVT_DELETE(p) kvt__free((p), sizeof(*(p)))

#endif
