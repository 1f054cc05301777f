/* Internal pieces of the extent allocator, for allocators built on it (the
 * lane allocator must reserve and free over several extent allocators as one
 * all-or-nothing step: it validates and prepares every lane, then applies). */
#ifndef KVTIER_ALLOC_INT_H
#define KVTIER_ALLOC_INT_H

#include "kvtier/alloc.h"

/* Sets aside the metadata nodes one reserve can need; after it, a reserve
 * whose pages are free (n <= free pages, max_runs >= n) cannot fail. */
int kvt__extalloc_prepare_reserve(kvt_extalloc_t *a);

/* Validates runs sorted by start for a free: in range, not overlapping each
 * other, all reserved. Merges touching runs in place; *m is the merged count.
 * Changes nothing in the allocator. */
int kvt__extalloc_free_validate(const kvt_extalloc_t *a, kvt_run_t *sorted, size_t n, size_t *m);
/* Sets aside the nodes a free of m validated runs can need. */
int kvt__extalloc_free_prepare(kvt_extalloc_t *a, size_t m);
/* Frees validated, prepared runs; cannot fail. */
void kvt__extalloc_free_apply(kvt_extalloc_t *a, const kvt_run_t *merged, size_t m);

#endif
