/* kvtier — tiers: the memory behind L1 and L2.
 *
 * A tier is `pages` pages of `page_bytes` each, laid out one of two ways:
 *
 *   page_first   one page is one contiguous object:
 *                [p0: l0 l1 .. lL-1][p1: l0 l1 ..] ...
 *                a run of k pages is one copy of k * page_bytes
 *   layer_first  layer-major, as an engine's per-layer KV buffers are:
 *                [l0: p0 p1 .. pN-1][l1: p0 p1 ..] ...
 *                a run of k pages is `layers` copies of k * layer_bytes
 *
 * page_bytes = layers x layer_bytes. Backends (one file each under src/tier/,
 * behind one table of functions):
 *
 *   arena  L1: host memory standing in for GPU memory (any machine)
 *   cuda   L1: cudaMalloc memory; copies with cudaMemcpyAsync on a stream per
 *          worker, completion by events (only when built with CUDA)
 *   host   L2: anonymous memory, huge pages when the system has them
 *          (MAP_HUGETLB, else transparent huge pages), optionally locked
 *   shm    L2: POSIX shared memory a node's processes share: created by one
 *          (who unlinks it when done), attached by name by the others. A
 *          segment left by a dead creator is detected and replaced. Its
 *          pages are given at creation (posix_fallocate): a /dev/shm too
 *          small refuses the create (KVT_ENOMEM), never a write later.
 *   tcp    another process's tier, written over TCP (include/kvtier/net.h
 *          serves the other end): each transfer worker opens `streams`
 *          connections and keeps page runs in flight on all of them; a copy
 *          completes when the peer has acknowledged every byte in place.
 *          Write-only, and no local address (kvt_tier_addr is NULL).
 *   ucx    the same over UCX active messages (UCP), which brings RDMA,
 *          shared memory and TCP from one library (only when built with
 *          UCX; KVT_ENOTSUP otherwise).
 *   engine memory a serving engine allocated and keeps owning (its
 *          per-layer K and V tensors, its MLA latents), host or CUDA device,
 *          described by the caller (kvt_tier_engine_t below); the tier only
 *          addresses it and never frees it.
 *
 * Engine tiers: planes. An engine rarely keeps a page's layer in one block:
 * vLLM keeps K and V apart, SGLang keeps a k_buffer and a v_buffer per
 * layer (V's head dim may differ), MLA keeps one latent plane. An engine
 * tier is 1..KVT_TIER_MAX_PLANES (4) planes; plane i gives, per layer, a base
 * (an array of `layers` pointers, or one base + a layer stride), the bytes of
 * one page in one layer (its piece) and the stride between pages (>= the
 * piece: padding between pages is never read or written):
 *
 *   plane 0 (K), layer l:  [p0 K][pad][p1 K][pad] ...   layer_base0[l] + p * page_stride0
 *   plane 1 (V), layer l:  [p0 V][p1 V] ...             layer_base1[l] + p * page_stride1
 *
 *   logical page p:  [l0: K V][l1: K V] ... [lL-1: K V]   layer_bytes = K piece + V piece
 *
 * Logically page p of layer l is the concatenation plane 0's piece, plane
 * 1's piece, ... in plane order: that is the byte order the page has in a
 * kvtier host tier, in kvt_tier_read/write, in kvt_tier_page_sum and hence in
 * L3 objects. An engine tier's geometry has layer_bytes = the sum of its
 * pieces (0 in the config: computed); its layout field is not read (the
 * tier reports page_first). Every
 * other tier is the special case of one plane (page_first: page stride
 * page_bytes, layer stride layer_bytes; layer_first: page stride
 * layer_bytes, layer stride pages x layer_bytes), which is how the transfer
 * engine coalesces runs between any two tiers: a run of k pages is one span
 * wherever both sides are contiguous over it (see docs/engine.md).
 *
 * With KVT_TIER_CHECKSUM a host tier keeps one XXH3-64 per page (in the
 * segment itself for shm), written by the transfer engine when a page lands
 * there and checked when it is read back.
 *
 * A backend knows bytes and addresses, never trees or policies.
 *
 * Threads: create and destroy on one thread, with no copy in flight on the
 * tier. The queries (geometry, kind, name, addresses, info, sums) read what
 * create fixed: any thread, concurrently. kvt_tier_read/write and the
 * pattern calls copy bytes with no lock: concurrent calls on different pages
 * are fine, on the same page they race as any memcpy would. The transfer
 * engine's workers copy through the same tiers (xfer.h says who owns a page
 * while its copy is in flight).
 */
#ifndef KVTIER_TIER_H
#define KVTIER_TIER_H

#include "kvtier/export.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvtier/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvt_layout {
    KVT_LAYOUT_PAGE_FIRST = 0,
    KVT_LAYOUT_LAYER_FIRST = 1
} kvt_layout_t;

KVT_API const char *kvt_layout_name(kvt_layout_t l);
KVT_API int kvt_layout_parse(const char *s, kvt_layout_t *l); /* "page_first" | "layer_first"; KVT_EINVAL */

typedef struct kvt_geom {
    uint64_t pages;
    uint32_t layers;      /* >= 1 */
    uint64_t layer_bytes; /* bytes of one page in one layer, >= 1 */
    kvt_layout_t layout;
} kvt_geom_t;

static inline uint64_t kvt_geom_page_bytes(const kvt_geom_t *g) { return g->layers * g->layer_bytes; }
/* Byte offset of (page, layer) from the tier's base. */
static inline uint64_t kvt_geom_offset(const kvt_geom_t *g, uint64_t page, uint32_t layer) {
    return g->layout == KVT_LAYOUT_PAGE_FIRST ? page * kvt_geom_page_bytes(g) + layer * g->layer_bytes
                                              : (uint64_t)layer * g->pages * g->layer_bytes + page * g->layer_bytes;
}

/* The geometry of `pages` pages of page_tokens tokens of a model:
 * layers = the model's layers, layer_bytes = bytes_per_token / layers x
 * page_tokens. KVT_EINVAL (nothing set) for zero sizes or an overflow. */
KVT_API int kvt_geom_from_model(kvt_geom_t *g, const kvt_model_t *m, uint32_t page_tokens, uint64_t pages,
                        kvt_layout_t layout);

typedef enum kvt_tier_kind {
    KVT_TIER_ARENA = 0,
    KVT_TIER_CUDA = 1,
    KVT_TIER_HOST = 2,
    KVT_TIER_SHM = 3,
    KVT_TIER_TCP = 4,
    KVT_TIER_UCX = 5,
    KVT_TIER_ENGINE = 6,
    KVT_TIER_KIND_COUNT_
} kvt_tier_kind_t;

KVT_API const char *kvt_tier_kind_name(kvt_tier_kind_t k);

/* Flags */
#define KVT_TIER_HUGE 0x1     /* host: try huge pages (MAP_HUGETLB, then THP advice) */
#define KVT_TIER_LOCK 0x2     /* host, shm: mlock the memory; failing to is an error (KVT_EAGAIN) */
#define KVT_TIER_CHECKSUM 0x4 /* host, shm: keep an XXH3-64 per page */
#define KVT_TIER_ATTACH 0x8   /* shm: attach to an existing segment instead of creating one */
#define KVT_TIER_SHARED 0x10  /* arena: a shared mapping: processes forked afterwards share its pages */
#define KVT_TIER_REGISTER 0x20 /* engine (host memory): a transfer engine with a device tier registers the
                                 planes' memory for DMA, as it does host tiers (memory already pinned by
                                 the caller is left as it is) */
/* cuda, and engine tiers on device memory: how the transfer engine copies a batch of spans
 * between the GPU and host memory. Neither flag (the default): the SMs' copy kernel for a batch
 * of two or more spans averaging at most 256 KiB, the copy engines (DMA, cudaMemcpyBatchAsync)
 * for the rest; a copy engine pays a fixed cost a span, so scattered pages of a few KiB reach a
 * small part of the link by DMA and most of it by the kernel (docs/performance.md). The kernel only
 * ever touches host memory a transfer engine registered itself (KVT_TIER_REGISTER, host tiers):
 * a batch with any other host span goes by DMA. Both flags together: KVT_EINVAL. */
#define KVT_TIER_COPY_DMA 0x40    /* every batch by the copy engines */
#define KVT_TIER_COPY_KERNEL 0x80 /* every batch of two or more spans by the kernel, where it may */

/* Engine tiers: the caller's own memory, described plane by plane (see the
 * essay above). Planes must not overlap one another or themselves (not
 * checked: it cannot be, cheaply, for per-layer pointers). */
#define KVT_TIER_MAX_PLANES 4

typedef struct kvt_tier_plane {
    void *const *layer_base; /* `layers` pointers, one per layer; or NULL and: */
    void *base;              /*   layer l at base + l x layer_stride */
    uint64_t layer_stride;
    uint64_t piece_bytes;    /* bytes of one page in one layer in this plane, >= 1 */
    uint64_t page_stride;    /* bytes from page p to page p + 1, >= piece_bytes */
} kvt_tier_plane_t;

typedef struct kvt_tier_engine {
    uint32_t size;           /* sizeof(kvt_tier_engine_t) */
    uint32_t planes;         /* 1..KVT_TIER_MAX_PLANES */
    kvt_tier_plane_t plane[KVT_TIER_MAX_PLANES];
    bool device;             /* CUDA device pointers of device cfg.device (else host memory) */
} kvt_tier_engine_t;

#define KVT_TIER_NAME_MAX 63 /* bytes of a tier's name (shm, tcp and ucx names: 60) */

typedef struct kvt_tier_config {
    uint32_t size;         /* sizeof(kvt_tier_config_t) */
    kvt_tier_kind_t kind;
    kvt_geom_t geom;
    uint32_t flags;
    const char *name;      /* shm: the segment name ("/kvtier-l2"); tcp, ucx: the peer, "host:port";
                              others: a label (may be NULL); at most KVT_TIER_NAME_MAX bytes */
    int device;            /* cuda: the device ordinal */
    uint32_t streams;      /* tcp: connections per transfer worker (0: 4) */
    const kvt_tier_engine_t *engine; /* engine: the memory (copied at create; the pointer need not outlive it) */
    uint64_t token;        /* tcp, ucx: the token the page server asks for (kvt_net_server_set_token; 0: none) */
} kvt_tier_config_t;

typedef struct kvt_tier kvt_tier_t;

/* Creates (or, for shm with KVT_TIER_ATTACH, attaches) a tier. Errors, with
 * nothing left behind: KVT_EINVAL (bad geometry or flags; engine: no
 * description, 0 or more than KVT_TIER_MAX_PLANES planes, a NULL base or
 * layer pointer, both or neither of layer_base and base, a zero piece, a
 * page stride below the piece, a zero layer stride over several layers, an
 * address range or byte count that overflows, layer_bytes neither 0 nor the
 * sum of the pieces, KVT_TIER_REGISTER on device memory, device memory that
 * is not device cfg.device's (or managed); a KVT_TIER_COPY_ flag on a tier not
 * on device memory, or both of them; tcp and ucx: a name that is not an IPv4
 * "a.b.c.d:port"; a name over KVT_TIER_NAME_MAX bytes; shm attach: a segment
 * of another geometry), KVT_ENOMEM,
 * KVT_ENOTSUP (cuda, or an engine tier on device memory, in a build without
 * CUDA, or no device), KVT_EEXIST (shm:
 * the segment belongs to a live process), KVT_ENOENT (shm attach: no such
 * segment, or not ready), KVT_EAGAIN (KVT_TIER_LOCK: mlock refused), KVT_EIO. */
KVT_API int kvt_tier_create(kvt_tier_t **out, const kvt_tier_config_t *cfg);
/* Frees the memory (an engine tier's memory is the caller's: left as it is);
 * the creator of an shm segment unlinks it. */
KVT_API void kvt_tier_destroy(kvt_tier_t *t);

KVT_API const kvt_geom_t *kvt_tier_geom(const kvt_tier_t *t);
KVT_API kvt_tier_kind_t kvt_tier_kind(const kvt_tier_t *t);
KVT_API const char *kvt_tier_name(const kvt_tier_t *t);
/* True when the CPU may read and write the tier's bytes directly. */
KVT_API bool kvt_tier_host_visible(const kvt_tier_t *t);
/* Address of (page, layer): a host address for host-visible tiers, a device
 * address for cuda (and device engine tiers). NULL when out of range, or for a
 * remote tier. An engine tier with several planes has no one address for
 * (page, layer): this is plane 0's piece; kvt_tier_plane_addr names the others. */
KVT_API void *kvt_tier_addr(const kvt_tier_t *t, uint64_t page, uint32_t layer);
/* Planes of a tier: an engine tier's count, 1 for every other tier with a
 * local address, 0 for a remote one (or NULL). */
KVT_API uint32_t kvt_tier_planes(const kvt_tier_t *t);
/* Address of plane `plane`'s piece of (page, layer) (plane 0 of a one-plane
 * tier is kvt_tier_addr). NULL when out of range. */
KVT_API void *kvt_tier_plane_addr(const kvt_tier_t *t, uint32_t plane, uint64_t page, uint32_t layer);
/* Copies layer_bytes between the caller's host memory and (page, layer),
 * for every kind of tier with local pages (cuda: a synchronous copy; a
 * peer's tier, tcp or ucx, is KVT_ENOTSUP). An engine tier gathers
 * (read) or scatters (write) its planes' pieces in plane order, the logical
 * order of the essay. A write is bytes only: a checksummed tier keeps the
 * page's recorded sum (kvt_tier_sums), so a copy out of a page written this
 * way fails its check until the sum is set again (kvt_tier_page_sum) — the
 * way tests plant a stray write. KVT_ERANGE, KVT_EIO, KVT_ENOTSUP. */
KVT_API int kvt_tier_write(kvt_tier_t *t, uint64_t page, uint32_t layer, const void *src);
KVT_API int kvt_tier_read(const kvt_tier_t *t, uint64_t page, uint32_t layer, void *dst);
/* The per-page checksums (KVT_TIER_CHECKSUM), or NULL. */
KVT_API uint64_t *kvt_tier_sums(kvt_tier_t *t);
/* XXH3-64 of a page of a host-visible tier, layers in order (0 for others). */
KVT_API uint64_t kvt_tier_page_sum(const kvt_tier_t *t, uint64_t page);

typedef struct kvt_tier_info {
    uint32_t size;          /* sizeof(kvt_tier_info_t), set by the caller */
    uint64_t bytes;         /* data bytes mapped */
    uint64_t page_bytes;
    bool huge_pages;        /* MAP_HUGETLB succeeded */
    bool thp_advised;       /* plain pages with MADV_HUGEPAGE */
    bool locked;            /* mlock'ed */
    bool registered;        /* registered with the CUDA runtime for DMA */
    bool creator;           /* shm: this process created the segment */
    bool replaced_stale;    /* shm: a dead creator's segment was replaced */
} kvt_tier_info_t;

KVT_API int kvt_tier_info(const kvt_tier_t *t, kvt_tier_info_t *info);

/* True when this build has the cuda backend. */
KVT_API bool kvt_tier_cuda_built(void);

#ifdef __cplusplus
}
#endif
#endif
