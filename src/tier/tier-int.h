/* Private to the tier module and the transfer engine: the backend table.
 *
 * Each backend (arena.c, host.c, shm.c, cuda.c, tcp.c, ucx.c, engine.c) fills one kvt__tier_ops_t.
 * The transfer engine copies through the ops of the pair's "driver": the
 * device tier when one side is a device (it owns the streams), else plain
 * memcpy. A worker thread opens one context per device tier it copies with.
 */
#ifndef KVTIER_TIER_INT_H
#define KVTIER_TIER_INT_H

#include "kvtier/tier.h"

/* One contiguous copy. dst_off is the destination's byte offset in its tier
 * (what a remote tier, which has no local address, goes by). */
typedef struct kvt__span {
    void *dst;
    const void *src;
    size_t len;
    uint64_t dst_off;
} kvt__span_t;

typedef struct kvt__tier_ops {
    const char *name;
    bool host_visible;
    /* Maps t->base (and t->sums when asked); fills t->info. Nothing left on failure. */
    int (*open)(kvt_tier_t *t);
    void (*close)(kvt_tier_t *t);
    /* Host <-> tier bytes (synchronous). */
    int (*write)(kvt_tier_t *t, void *dst, const void *src, size_t len);
    int (*read)(const kvt_tier_t *t, void *dst, const void *src, size_t len);
    /* Device tiers only (NULL otherwise): a per-worker copy context, and a
     * batch of copies that returns once every byte is in place. */
    int (*ctx_open)(kvt_tier_t *t, void **ctx);
    void (*ctx_close)(kvt_tier_t *t, void *ctx);
    int (*copy)(kvt_tier_t *t, void *ctx, const kvt__span_t *spans, size_t n);
    /* Device tiers only: page-locks host memory for DMA (and undoes it). */
    int (*register_host)(kvt_tier_t *t, void *p, size_t len);
    void (*unregister_host)(kvt_tier_t *t, void *p);
} kvt__tier_ops_t;

/* Where a tier's bytes are, as planes (tier.h's essay): the piece of plane i
 * of (page, layer) starts at
 *     (layer ? layer[l] : origin + l * layer_stride) + page * page_stride
 * and holds bytes [lofs, lofs + piece) of the logical layer. Addresses are
 * integers: a remote tier (no local memory) has origin 0, so its "addresses"
 * are byte offsets in the peer's tier (what kvt__span_t.dst_off carries). */
typedef struct kvt__plane {
    const uintptr_t *layer; /* per-layer origins, or NULL */
    uintptr_t origin;
    uint64_t layer_stride, page_stride, piece, lofs;
    uint64_t extent;        /* bytes one layer of the plane spans: (pages - 1) * page_stride + piece */
} kvt__plane_t;

static inline uintptr_t kvt__plane_at(const kvt__plane_t *pl, uint64_t page, uint32_t layer) {
    return (pl->layer ? pl->layer[layer] : pl->origin + (uintptr_t)layer * pl->layer_stride) +
           (uintptr_t)(page * pl->page_stride);
}

/* A range of host memory the transfer engine registers with a device tier. */
typedef struct kvt__region {
    void *p;
    size_t len;
} kvt__region_t;

struct kvt_tier {
    kvt_tier_config_t cfg;
    char name[KVT_TIER_NAME_MAX + 1];
    const kvt__tier_ops_t *ops;
    uint8_t *base;      /* data (NULL for remote and engine tiers) */
    uint64_t *sums;     /* per-page checksums or NULL */
    uint64_t bytes;     /* data bytes (an engine tier: logical, pages x page_bytes) */
    void *impl;         /* backend state */
    kvt_tier_info_t info;
    /* set after open, for every kind */
    uint32_t nplanes;
    kvt__plane_t planes[KVT_TIER_MAX_PLANES];
    bool remote;        /* no local address: spans carry dst_off, not pointers */
    bool fuse[KVT_TIER_MAX_PLANES]; /* plane i + 1 starts where plane i's piece ends, every page and layer */
    bool page_block;    /* a whole page (every layer, every plane) is one block */
    const kvt__region_t *regions; /* host memory to register for DMA */
    size_t nregions;
    kvt__region_t region1; /* the one region of an ordinary host tier */
};

extern const kvt__tier_ops_t kvt__tier_arena_ops;
extern const kvt__tier_ops_t kvt__tier_host_ops;
extern const kvt__tier_ops_t kvt__tier_shm_ops;
extern const kvt__tier_ops_t kvt__tier_cuda_ops; /* a stub reporting KVT_ENOTSUP without CUDA */
extern const kvt__tier_ops_t kvt__tier_tcp_ops;
extern const kvt__tier_ops_t kvt__tier_ucx_ops; /* a stub reporting KVT_ENOTSUP without UCX */
extern const kvt__tier_ops_t kvt__tier_engine_ops;      /* engine.c: host memory */
extern const kvt__tier_ops_t kvt__tier_engine_cuda_ops; /* cuda.c: device memory (KVT_ENOTSUP without CUDA) */

/* engine.c: validates cfg->engine (KVT_EINVAL) and fills t's planes and
 * regions from it; kvt__engine_close frees what open allocated (never the
 * engine's memory). */
int kvt__engine_check(const kvt_tier_config_t *cfg, uint64_t *layer_bytes); /* before anything is allocated */
int kvt__engine_open(kvt_tier_t *t);
void kvt__engine_close(kvt_tier_t *t);

/* host.c: an anonymous mapping of len bytes (shared with processes forked
 * later when `shared`), huge pages when asked and possible; info records what
 * was obtained. NULL when mmap fails. */
void *kvt__map_anon(size_t len, bool huge, bool shared, kvt_tier_info_t *info);
void kvt__unmap(void *p, size_t len);
/* tier.c: write/read for host-visible backends (memcpy). */
int kvt__host_write(kvt_tier_t *t, void *dst, const void *src, size_t len);
int kvt__host_read(const kvt_tier_t *t, void *dst, const void *src, size_t len);

#endif
