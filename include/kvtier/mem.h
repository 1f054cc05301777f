/* kvtier — the one allocation hook.
 *
 * Every byte kvtier allocates for its own structures goes through one internal
 * function, which counts it and routes it to the allocator installed here
 * (libc by default). An engine can plug its own allocator; tests use the same
 * path to count bytes and to make the Nth allocation fail.
 *
 * Threads: kvt_set_allocator before any kvtier object exists, on one thread
 * (it is not synchronised with allocations); the allocation counters are
 * atomic, so kvt_mem_stats may run on any thread at any time.
 */
#ifndef KVTIER_MEM_H
#define KVTIER_MEM_H

#include "kvtier/export.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvt_allocator {
    uint32_t size; /* sizeof(kvt_allocator_t) */
    void *(*malloc_fn)(void *ctx, size_t size);
    void *(*realloc_fn)(void *ctx, void *ptr, size_t old_size, size_t new_size);
    void (*free_fn)(void *ctx, void *ptr, size_t size);
    void *ctx;
} kvt_allocator_t;

/* Installs `a` (copied) for all later allocations; NULL restores libc.
 * Install before creating any kvtier object: memory is returned to the
 * allocator that gave it. Returns KVT_EINVAL (nothing changed) when a function
 * pointer is missing or the size is not one this library reads. */
KVT_API int kvt_set_allocator(const kvt_allocator_t *a);

typedef struct kvt_mem_stats {
    uint32_t size;        /* sizeof(kvt_mem_stats_t), set by the caller */
    uint64_t allocs;      /* successful allocations (a realloc is not one) */
    uint64_t frees;
    uint64_t failed;      /* allocations that returned NULL, injected or real */
    int64_t live_bytes;   /* requested bytes currently allocated */
    int64_t peak_bytes;
} kvt_mem_stats_t;

/* Fills *st (st->size must be set); KVT_EINVAL if the size is too small. */
KVT_API int kvt_mem_stats(kvt_mem_stats_t *st);

#ifdef __cplusplus
}
#endif
#endif
