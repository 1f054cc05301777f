/* `engine`: memory a serving engine allocated and keeps owning, as a tier.
 *
 * The caller describes its KV buffers as planes (tier.h's essay): per plane
 * a base per layer (or one base and a layer stride), the bytes of one page
 * in one layer, and the stride between pages. The tier copies the
 * description — the per-layer pointer arrays too, so the caller's arrays
 * need not outlive kvt_tier_create — and from then on only computes
 * addresses. It never maps, locks, registers or frees the memory itself;
 * destroying the tier frees the copy of the description and nothing else.
 *
 *   vLLM FlashAttention, layer l: one tensor [2, blocks, block, heads, dim]
 *     plane 0 (K): layer_base[l] = kv[l],              piece = block*heads*dim*esz, stride = piece
 *     plane 1 (V): layer_base[l] = kv[l] + blocks*piece, same piece and stride
 *
 * Host memory copies with memcpy (the host ops); device memory (device =
 * true) through the cuda backend's copy, a stream per transfer worker, as the
 * cuda tier's (cuda.c holds those ops). With KVT_TIER_REGISTER the regions
 * the planes span (per layer, merged where they touch) are what a transfer
 * engine registers with its device tier.
 */
#include <stdlib.h>
#include <string.h>

#include "kvtier/error.h"
#include "tier-int.h"
#include "../core/mem-int.h"

typedef struct engine_state {
    uintptr_t *layers[KVT_TIER_MAX_PLANES]; /* copies of the per-layer pointers */
    kvt__region_t *regions;
    size_t nregions;
    uint32_t nlayers;
} engine_state_t;

/* Whether a + b overflows an address. */
static bool addr_overflows(uintptr_t a, uint64_t b) { return b > (uint64_t)(UINTPTR_MAX - a); }

/* Validates one plane over `pages` pages of `layers` layers; *extent: the
 * bytes one layer of it spans. */
static bool plane_ok(const kvt_tier_plane_t *p, uint64_t pages, uint32_t layers, uint64_t *extent) {
    if ((p->layer_base == NULL) == (p->base == NULL) || p->piece_bytes == 0 || p->page_stride < p->piece_bytes)
        return false;
    if (pages > 1 && p->page_stride > (UINT64_MAX - p->piece_bytes) / (pages - 1)) return false;
    uint64_t ext = (pages - 1) * p->page_stride + p->piece_bytes;
    if (p->layer_base) {
        for (uint32_t l = 0; l < layers; l++)
            if (p->layer_base[l] == NULL || addr_overflows((uintptr_t)p->layer_base[l], ext)) return false;
    } else {
        if (layers > 1 && (p->layer_stride == 0 || p->layer_stride > (UINT64_MAX - ext) / (layers - 1))) return false;
        if (addr_overflows((uintptr_t)p->base, (uint64_t)(layers - 1) * p->layer_stride + ext)) return false;
    }
    *extent = ext;
    return true;
}

int kvt__engine_check(const kvt_tier_config_t *cfg, uint64_t *layer_bytes) {
    const kvt_tier_engine_t *e = cfg->engine;
    const kvt_geom_t *g = &cfg->geom;
    if (e == NULL || e->planes == 0 || e->planes > KVT_TIER_MAX_PLANES || g->pages == 0 || g->layers == 0)
        return KVT_EINVAL;
    if ((cfg->flags & KVT_TIER_REGISTER) && e->device) return KVT_EINVAL;
    uint64_t sum = 0, ext;
    for (uint32_t i = 0; i < e->planes; i++) {
        if (!plane_ok(&e->plane[i], g->pages, g->layers, &ext)) return KVT_EINVAL;
        if (e->plane[i].piece_bytes > UINT64_MAX - sum) return KVT_EINVAL;
        sum += e->plane[i].piece_bytes;
    }
    if (g->layer_bytes != 0 && g->layer_bytes != sum) return KVT_EINVAL;
    *layer_bytes = sum;
    return KVT_OK;
}

static int cmp_region(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)((const kvt__region_t *)a)->p, y = (uintptr_t)((const kvt__region_t *)b)->p;
    return (x > y) - (x < y);
}

/* The ranges every (plane, layer) spans, sorted and merged where they touch
 * or overlap (vLLM's K and V halves of one tensor become one range). */
static int make_regions(kvt_tier_t *t, engine_state_t *st) {
    size_t n = (size_t)t->nplanes * t->cfg.geom.layers, k = 0;
    kvt__region_t *r = kvt__calloc(n, sizeof(*r));
    if (r == NULL) return KVT_ENOMEM;
    for (uint32_t i = 0; i < t->nplanes; i++)
        for (uint32_t l = 0; l < t->cfg.geom.layers; l++)
            r[k++] = (kvt__region_t){(void *)kvt__plane_at(&t->planes[i], 0, l), (size_t)t->planes[i].extent};
    qsort(r, n, sizeof(*r), cmp_region);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uintptr_t a = (uintptr_t)r[i].p;
        if (m > 0 && a <= (uintptr_t)r[m - 1].p + r[m - 1].len) {
            uintptr_t end = a + r[i].len, prev = (uintptr_t)r[m - 1].p + r[m - 1].len;
            if (end > prev) r[m - 1].len = (size_t)(end - (uintptr_t)r[m - 1].p);
        } else {
            r[m++] = r[i];
        }
    }
    st->regions = r;
    st->nregions = n; /* the allocation's size; m are used */
    t->regions = r;
    t->nregions = m;
    return KVT_OK;
}

static void free_state(engine_state_t *st) {
    for (uint32_t i = 0; i < KVT_TIER_MAX_PLANES; i++) kvt__free(st->layers[i], (size_t)st->nlayers * sizeof(uintptr_t));
    kvt__free(st->regions, st->nregions * sizeof(kvt__region_t));
    KVT_DELETE(st);
}

int kvt__engine_open(kvt_tier_t *t) {
    const kvt_tier_engine_t *e = t->cfg.engine;
    uint32_t layers = t->cfg.geom.layers;
    engine_state_t *st = KVT_NEW(engine_state_t);
    if (st == NULL) return KVT_ENOMEM;
    st->nlayers = layers;
    uint64_t lofs = 0;
    for (uint32_t i = 0; i < e->planes; i++) {
        const kvt_tier_plane_t *p = &e->plane[i];
        kvt__plane_t *q = &t->planes[i];
        *q = (kvt__plane_t){.page_stride = p->page_stride, .piece = p->piece_bytes, .lofs = lofs,
                            .extent = (t->cfg.geom.pages - 1) * p->page_stride + p->piece_bytes};
        if (p->layer_base) {
            st->layers[i] = kvt__malloc((size_t)layers * sizeof(uintptr_t));
            if (st->layers[i] == NULL) {
                free_state(st);
                return KVT_ENOMEM;
            }
            for (uint32_t l = 0; l < layers; l++) st->layers[i][l] = (uintptr_t)p->layer_base[l];
            q->layer = st->layers[i];
        } else {
            q->origin = (uintptr_t)p->base;
            q->layer_stride = p->layer_stride;
        }
        lofs += p->piece_bytes;
    }
    t->nplanes = e->planes;
    if ((t->cfg.flags & KVT_TIER_REGISTER) && make_regions(t, st) != KVT_OK) {
        free_state(st);
        t->nplanes = 0;
        return KVT_ENOMEM;
    }
    t->impl = st;
    t->cfg.engine = NULL; /* the caller's description need not outlive create: the planes are the copy */
    return KVT_OK;
}

void kvt__engine_close(kvt_tier_t *t) {
    if (t->impl) free_state(t->impl); /* the engine's memory is the engine's */
    t->impl = NULL;
}

static int engine_host_open(kvt_tier_t *t) {
    if (t->cfg.engine->device) return KVT_EINVAL; /* not reached: tier.c picks the cuda ops */
    return kvt__engine_open(t);
}

const kvt__tier_ops_t kvt__tier_engine_ops = {
    .name = "engine",
    .host_visible = true,
    .open = engine_host_open,
    .close = kvt__engine_close,
    .write = kvt__host_write,
    .read = kvt__host_read,
};
