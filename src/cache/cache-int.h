/* Private to the cache module: the cache struct, shared by cache.c (tiers,
 * admission, eviction) and policy.c (eviction order). */
#ifndef KVTIER_CACHE_INT_H
#define KVTIER_CACHE_INT_H

#include "kvtier/alloc.h"
#include "kvtier/cache.h"
#include "../radix/radix-int.h"

typedef enum { OP_BACKUP, OP_LOAD } op_kind_t;

typedef struct kvt__op {
    uint8_t kind;
    uint8_t ok;
    uint32_t l1, l2;
} kvt__op_t;

/* Page ids on their way back to an allocator (appending never fails: room
 * for every page of the tier is set aside at creation). */
typedef struct kvt__idbuf {
    uint32_t *id;
    size_t n, cap;
} kvt__idbuf_t;

struct kvt_cache {
    kvt_cache_config_t cfg;
    kvt_radix_t *tree;
    kvt_laneal_t *l1;
    kvt_extalloc_t *l2; /* NULL without an L2 tier */
    uint64_t clock;
    uint64_t l1_free, l2_free;     /* free pages, counting those in the buffers below */
    uint64_t l1_target, l2_target; /* free-room targets, pages */
    kvt__idbuf_t l1_back, l2_back;
    kvt_run_t *l2_runs;            /* room for l2_back as runs */
    kvt__op_t *done;               /* completed copies not yet applied */
    size_t ndone, done_cap;
    uint32_t *scratch;             /* page ids for one admission */
    size_t scratch_cap;
    uint64_t slru_pages;           /* pages of SLRU-protected nodes */
    uint64_t held;                 /* requests admitted and not released */
    uint64_t fail_every, submitted; /* test hook: every fail_every-th copy fails */
    kvt_cache_stats_t st;
};

/* Test hook: from now on every n-th copy completes with a failure (0: none). */
void kvt__cache_fail_copies(kvt_cache_t *c, uint64_t n);

/* policy.c */
uint64_t kvt__policy_score(void *ctx, const kvt_rnode_t *n, kvt__vset_t set);
/* A node was matched (its hits and last access are already updated). */
void kvt__policy_on_hit(kvt_cache_t *c, kvt_rnode_t *n);
/* n is about to lose its tail page (and, if it is the last, to be freed). */
void kvt__policy_on_trim(kvt_cache_t *c, kvt_rnode_t *n);

#endif
