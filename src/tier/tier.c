/* Tiers: the common part (validation, geometry, addresses, checksums) and
 * dispatch to the backends (one file each). */
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "../core/abi-int.h"
#include "../core/sum-int.h"
#include "kvtier/error.h"
#include "tier-int.h"
#include "../core/mem-int.h"
#include "../sock/wire.h"

static const char *const LAYOUTS[] = {"page_first", "layer_first"};
static const char *const KINDS[] = {"arena", "cuda", "host", "shm", "tcp", "ucx", "engine"};

const char *kvt_layout_name(kvt_layout_t l) { return (unsigned)l < 2 ? LAYOUTS[l] : "?"; }

int kvt_layout_parse(const char *s, kvt_layout_t *l) {
    for (unsigned i = 0; s && l && i < 2; i++)
        if (strcmp(s, LAYOUTS[i]) == 0) return *l = (kvt_layout_t)i, KVT_OK;
    return KVT_EINVAL;
}

const char *kvt_tier_kind_name(kvt_tier_kind_t k) { return (unsigned)k < KVT_TIER_KIND_COUNT_ ? KINDS[k] : "?"; }

int kvt_geom_from_model(kvt_geom_t *g, const kvt_model_t *m, uint32_t page_tokens, uint64_t pages,
                        kvt_layout_t layout) {
    if (g == NULL || m == NULL || m->layers == 0 || page_tokens == 0 || pages == 0 ||
        m->bytes_per_token % m->layers != 0 || (unsigned)layout > KVT_LAYOUT_LAYER_FIRST)
        return KVT_EINVAL;
    uint64_t lb = m->bytes_per_token / m->layers;
    if (lb == 0 || lb > UINT64_MAX / page_tokens || lb * page_tokens > UINT64_MAX / m->layers / pages)
        return KVT_EINVAL;
    *g = (kvt_geom_t){pages, m->layers, lb * page_tokens, layout};
    return KVT_OK;
}

static const kvt__tier_ops_t *ops_of(const kvt_tier_config_t *cfg) {
    switch (cfg->kind) {
    case KVT_TIER_ARENA: return &kvt__tier_arena_ops;
    case KVT_TIER_CUDA: return &kvt__tier_cuda_ops;
    case KVT_TIER_HOST: return &kvt__tier_host_ops;
    case KVT_TIER_SHM: return &kvt__tier_shm_ops;
    case KVT_TIER_TCP: return &kvt__tier_tcp_ops;
    case KVT_TIER_UCX: return &kvt__tier_ucx_ops;
    case KVT_TIER_ENGINE: return cfg->engine && cfg->engine->device ? &kvt__tier_engine_cuda_ops : &kvt__tier_engine_ops;
    default: return NULL;
    }
}

static bool geom_ok(const kvt_geom_t *g) {
    if (g->pages == 0 || g->pages > UINT32_MAX || g->layers == 0 || g->layer_bytes == 0 ||
        (unsigned)g->layout > KVT_LAYOUT_LAYER_FIRST)
        return false;
    /* the whole tier must be addressable: pages * layers * layer_bytes < 2^62 */
    return g->layer_bytes <= (1ull << 62) / g->layers / g->pages;
}

/* Planes, contiguity and DMA regions, once the backend has opened t. An
 * ordinary tier is one plane over its geometry; an engine tier's planes come
 * from engine.c. */
static void derive(kvt_tier_t *t) {
    const kvt_geom_t *g = &t->cfg.geom;
    if (t->cfg.kind != KVT_TIER_ENGINE) {
        bool pf = g->layout == KVT_LAYOUT_PAGE_FIRST;
        t->remote = t->base == NULL;
        t->nplanes = 1;
        t->planes[0] = (kvt__plane_t){.origin = (uintptr_t)t->base,
                                      .layer_stride = pf ? g->layer_bytes : g->pages * g->layer_bytes,
                                      .page_stride = pf ? kvt_geom_page_bytes(g) : g->layer_bytes,
                                      .piece = g->layer_bytes};
        t->planes[0].extent = (g->pages - 1) * t->planes[0].page_stride + g->layer_bytes;
        if (t->base && t->ops->host_visible) {
            t->region1 = (kvt__region_t){t->base, t->bytes};
            t->regions = &t->region1;
            t->nregions = 1;
        }
    }
    bool block = true;
    for (uint32_t i = 0; i + 1 < t->nplanes; i++) {
        const kvt__plane_t *a = &t->planes[i], *b = &t->planes[i + 1];
        bool f = a->page_stride == b->page_stride;
        for (uint32_t l = 0; f && l < g->layers; l++) f = kvt__plane_at(b, 0, l) == kvt__plane_at(a, 0, l) + a->piece;
        t->fuse[i] = f;
        block = block && f;
    }
    for (uint32_t l = 0; block && l + 1 < g->layers; l++)
        block = kvt__plane_at(&t->planes[0], 0, l + 1) == kvt__plane_at(&t->planes[0], 0, l) + g->layer_bytes;
    t->page_block = block;
}

int kvt_tier_create(kvt_tier_t **out, const kvt_tier_config_t *user) {
    kvt_tier_config_t full = {.size = sizeof(full)};
    kvt_tier_engine_t engine = {.size = sizeof(engine)}; /* the caller's, at this library's size (open copies it) */
    const kvt_tier_config_t *cfg = &full;
    if (out == NULL || user == NULL || kvt__abi_in(&full, sizeof(full), user) != KVT_OK) return KVT_EINVAL;
    if (full.engine != NULL && kvt__abi_in(&engine, sizeof(engine), full.engine) != KVT_OK) return KVT_EINVAL;
    if (full.engine != NULL) full.engine = &engine;
    if (ops_of(cfg) == NULL) return KVT_EINVAL;
    if ((cfg->kind == KVT_TIER_ENGINE) != (cfg->engine != NULL)) return KVT_EINVAL;
    kvt_geom_t geom = cfg->geom;
    if (cfg->kind == KVT_TIER_ENGINE && kvt__engine_check(cfg, &geom.layer_bytes) != KVT_OK) return KVT_EINVAL;
    if (cfg->kind == KVT_TIER_ENGINE) geom.layout = KVT_LAYOUT_PAGE_FIRST; /* unused: the planes place the pieces */
    if (!geom_ok(&geom)) return KVT_EINVAL;
    uint32_t host_flags = KVT_TIER_HUGE | KVT_TIER_LOCK | KVT_TIER_CHECKSUM, copy_flags = KVT_TIER_COPY_DMA | KVT_TIER_COPY_KERNEL;
    uint32_t allowed = cfg->kind == KVT_TIER_SHM      ? host_flags | KVT_TIER_ATTACH
                       : cfg->kind == KVT_TIER_HOST   ? host_flags
                       : cfg->kind == KVT_TIER_ARENA  ? KVT_TIER_SHARED
                       : cfg->kind == KVT_TIER_CUDA   ? copy_flags
                       : cfg->kind == KVT_TIER_ENGINE ? KVT_TIER_REGISTER | (cfg->engine->device ? copy_flags : 0)
                                                      : 0;
    if (cfg->flags & ~allowed) return KVT_EINVAL;
    if ((cfg->flags & copy_flags) == copy_flags) return KVT_EINVAL; /* one way or the other */
    struct sockaddr_in peer; /* a peer's address is checked here, not at the first copy */
    if ((cfg->kind == KVT_TIER_TCP || cfg->kind == KVT_TIER_UCX) &&
        (cfg->name == NULL || strlen(cfg->name) > 60 || kvt__parse_addr(cfg->name, &peer) != 0))
        return KVT_EINVAL;
    if (cfg->kind == KVT_TIER_SHM && (cfg->name == NULL || cfg->name[0] != '/' || strlen(cfg->name) > 60 ||
                                      strchr(cfg->name + 1, '/') != NULL))
        return KVT_EINVAL;
    /* a label cut short would name another tier, or end inside a character */
    if (cfg->name != NULL && strlen(cfg->name) > KVT_TIER_NAME_MAX) return KVT_EINVAL;
    kvt_tier_t *t = KVT_NEW(kvt_tier_t);
    if (t == NULL) return KVT_ENOMEM;
    t->cfg = *cfg;
    t->cfg.size = sizeof(t->cfg);
    t->cfg.geom = geom;
    snprintf(t->name, sizeof(t->name), "%s", cfg->name ? cfg->name : KINDS[cfg->kind]);
    t->cfg.name = t->name;
    t->ops = ops_of(cfg);
    t->bytes = geom.pages * kvt_geom_page_bytes(&geom);
    t->info.size = sizeof(t->info);
    t->info.bytes = t->bytes;
    t->info.page_bytes = kvt_geom_page_bytes(&geom);
    int rc = t->ops->open(t);
    if (rc != KVT_OK) {
        KVT_DELETE(t);
        return rc;
    }
    derive(t);
    *out = t;
    return KVT_OK;
}

void kvt_tier_destroy(kvt_tier_t *t) {
    if (t == NULL) return;
    t->ops->close(t);
    KVT_DELETE(t);
}

const kvt_geom_t *kvt_tier_geom(const kvt_tier_t *t) { return &t->cfg.geom; }
kvt_tier_kind_t kvt_tier_kind(const kvt_tier_t *t) { return t->cfg.kind; }
const char *kvt_tier_name(const kvt_tier_t *t) { return t->name; }
bool kvt_tier_host_visible(const kvt_tier_t *t) { return t->ops->host_visible; }
uint64_t *kvt_tier_sums(kvt_tier_t *t) { return t ? t->sums : NULL; }

uint32_t kvt_tier_planes(const kvt_tier_t *t) { return t == NULL || t->remote ? 0 : t->nplanes; }

void *kvt_tier_plane_addr(const kvt_tier_t *t, uint32_t plane, uint64_t page, uint32_t layer) {
    if (t == NULL || t->remote || plane >= t->nplanes || page >= t->cfg.geom.pages || layer >= t->cfg.geom.layers)
        return NULL;
    return (void *)kvt__plane_at(&t->planes[plane], page, layer);
}

void *kvt_tier_addr(const kvt_tier_t *t, uint64_t page, uint32_t layer) { return kvt_tier_plane_addr(t, 0, page, layer); }

/* Planes in order: layer_bytes of the caller's memory is their pieces end to end. */
int kvt_tier_write(kvt_tier_t *t, uint64_t page, uint32_t layer, const void *src) {
    if (t && t->remote) return KVT_ENOTSUP; /* a remote tier: only the transfer engine writes it */
    if (kvt_tier_addr(t, page, layer) == NULL || src == NULL) return KVT_ERANGE;
    int rc = KVT_OK;
    for (uint32_t i = 0; i < t->nplanes && rc == KVT_OK; i++)
        rc = t->ops->write(t, kvt_tier_plane_addr(t, i, page, layer), (const uint8_t *)src + t->planes[i].lofs,
                           t->planes[i].piece);
    return rc;
}

int kvt_tier_read(const kvt_tier_t *t, uint64_t page, uint32_t layer, void *dst) {
    if (t && t->remote) return KVT_ENOTSUP;
    if (kvt_tier_addr(t, page, layer) == NULL || dst == NULL) return KVT_ERANGE;
    int rc = KVT_OK;
    for (uint32_t i = 0; i < t->nplanes && rc == KVT_OK; i++)
        rc = t->ops->read(t, (uint8_t *)dst + t->planes[i].lofs, kvt_tier_plane_addr(t, i, page, layer),
                          t->planes[i].piece);
    return rc;
}

uint64_t kvt_tier_page_sum(const kvt_tier_t *t, uint64_t page) {
    if (t == NULL || !t->ops->host_visible || page >= t->cfg.geom.pages) return 0;
    const kvt_geom_t *g = &t->cfg.geom;
    if (t->page_block) return kvt__sum(kvt_tier_addr(t, page, 0), kvt_geom_page_bytes(g));
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    for (uint32_t l = 0; l < g->layers; l++)
        for (uint32_t i = 0; i < t->nplanes; i++)
            kvt__sum_update(&st, kvt_tier_plane_addr(t, i, page, l), t->planes[i].piece);
    return XXH3_64bits_digest(&st);
}

int kvt_tier_info(const kvt_tier_t *t, kvt_tier_info_t *info) {
    if (t == NULL || info == NULL) return KVT_EINVAL;
    kvt_tier_info_t full = t->info;
    full.size = sizeof(full);
    return kvt__abi_out(info, &full, sizeof(full));
}

int kvt__host_write(kvt_tier_t *t, void *dst, const void *src, size_t len) {
    (void)t;
    memcpy(dst, src, len);
    return KVT_OK;
}

int kvt__host_read(const kvt_tier_t *t, void *dst, const void *src, size_t len) {
    (void)t;
    memcpy(dst, src, len);
    return KVT_OK;
}
