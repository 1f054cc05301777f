/* Internal pieces of the extent allocator, for allocators built on it (the
 * lane allocator must reserve and free over several extent allocators as one
 * all-or-nothing step: it validates and prepares every lane, then applies). */
#ifndef KVTIER_ALLOC_INT_H
#define KVTIER_ALLOC_INT_H

#include "kvtier/alloc.h"

/* Sets aside the metadata nodes one reserve can need; after it, a reserve
 * whose pages are free (n <= free pages, max_runs >= n) cannot fail. */
int kvt__extalloc_prepare_reserve(kvt_extalloc_t *a);

/* One run of a free being planned, and the free extents next to it as they
 * were when the free was validated (len 0: none). */
typedef struct kvt__free_plan {
    kvt_run_t run;
    kvt_run_t left;  /* the free extent ending at run.start */
    kvt_run_t right; /* the free extent starting at run.start + run.len */
} kvt__free_plan_t;

/* Validates the sorted runs of plan[0..n) for a free: in range, not
 * overlapping each other, all reserved. Merges touching runs in place (*m is
 * the merged count) and fills in their free neighbours. Changes nothing in
 * the allocator. */
int kvt__extalloc_free_validate(const kvt_extalloc_t *a, kvt__free_plan_t *plan, size_t n, size_t *m);
/* Sets aside the nodes a free of m validated runs can need. */
int kvt__extalloc_free_prepare(kvt_extalloc_t *a, size_t m);
/* Frees validated, prepared runs; cannot fail. */
void kvt__extalloc_free_apply(kvt_extalloc_t *a, const kvt__free_plan_t *plan, size_t m);

#endif
