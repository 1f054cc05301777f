/* Test helper: serving engines' KV buffers, modelled from their tensor shapes
 * alone, for the engine tier's tests.
 *
 * model_loc() says where element (layer, kv, block, slot, head, dim) of an
 * engine's tensors is — which buffer, which byte — by indexing the tensor
 * shape the engine declares (vLLM's [2, blocks, block, heads, dim] per layer,
 * SGLang's k_buffer[layer] [slots, heads, dim], ...), with no use of the
 * tier's planes. model_lofs() says where the element sits in a page's layer
 * as tier.h defines the logical order (plane 0's piece, then plane 1's).
 * Every byte of an element gets a value hashed from its coordinates.
 *
 * describe() is the other side: the kvt_tier_engine_t an integrator would
 * write for that engine (the snippets of docs/engine.md).
 */
#ifndef KVTIER_TESTS_ENGINE_MODEL_H
#define KVTIER_TESTS_ENGINE_MODEL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier/tier.h"

#define EM_MAXL 8
#define EM_MAXBUF (2 * EM_MAXL)

typedef enum em_kind {
    EM_VLLM_FA,     /* per layer [2, blocks, bs, heads, kdim]: K plane, V plane */
    EM_FLASHINFER,  /* per layer [blocks, 2, bs, heads, kdim]: one plane (K then V per block) */
    EM_FLASHINFER2, /* the same memory described as two planes, page stride 2x the piece */
    EM_SGLANG,      /* per layer k_buffer [blocks*bs, heads, kdim], v_buffer [blocks*bs, heads, vdim] */
    EM_MLA,         /* one tensor [layers, blocks, bs, kdim] (kdim = kv_lora_rank + rope_dim): one base + layer stride */
    EM_PADDED,      /* per layer K [blocks][bs*heads*kdim + kpad], V [blocks][bs*heads*vdim + vpad] */
    EM_PAGE_MAJOR,  /* one tensor [blocks, layers, 2, bs, heads, kdim]: a block is one block of memory */
    EM_KIND_COUNT
} em_kind_t;

typedef struct em_shape {
    const char *name;
    em_kind_t kind;
    uint32_t layers, blocks, bs, heads, kdim, vdim, esz, kpad, vpad;
} em_shape_t;

typedef struct em_mem {
    uint8_t *buf[EM_MAXBUF];
    size_t len[EM_MAXBUF];
    unsigned n;
} em_mem_t;

static const em_shape_t EM_SHAPES[EM_KIND_COUNT] = {
    {"vllm_fa", EM_VLLM_FA, 3, 12, 4, 2, 8, 8, 2, 0, 0},
    {"flashinfer", EM_FLASHINFER, 3, 12, 4, 2, 8, 8, 2, 0, 0},
    {"flashinfer_2planes", EM_FLASHINFER2, 3, 12, 4, 2, 8, 8, 2, 0, 0},
    {"sglang", EM_SGLANG, 3, 12, 4, 2, 8, 4, 2, 0, 0}, /* V's head dim differs from K's */
    {"mla", EM_MLA, 3, 12, 4, 1, 20, 0, 2, 0, 0},     /* kv_lora_rank 16 + rope_dim 4 */
    {"padded", EM_PADDED, 3, 12, 4, 2, 8, 6, 2, 40, 24},
    {"page_major", EM_PAGE_MAJOR, 3, 12, 4, 2, 8, 8, 2, 0, 0},
};

static inline bool em_has_v(const em_shape_t *s) { return s->kind != EM_MLA; }
static inline uint32_t em_dim(const em_shape_t *s, int kv) {
    return kv && (s->kind == EM_SGLANG || s->kind == EM_PADDED) ? s->vdim : s->kdim;
}
/* Bytes of one block's K (kv 0) or V (kv 1) in one layer. */
static inline size_t em_piece(const em_shape_t *s, int kv) {
    return (size_t)s->bs * s->heads * em_dim(s, kv) * s->esz;
}
static inline size_t em_layer_bytes(const em_shape_t *s) {
    return em_piece(s, 0) + (em_has_v(s) ? em_piece(s, 1) : 0);
}

/* The buffers the engine allocates, by their tensor shapes. */
static inline void em_sizes(const em_shape_t *s, em_mem_t *m) {
    size_t e = s->esz, hk = (size_t)s->heads * s->kdim, hv = (size_t)s->heads * em_dim(s, 1);
    size_t slots = (size_t)s->blocks * s->bs;
    memset(m, 0, sizeof(*m));
    switch (s->kind) {
    case EM_VLLM_FA:
    case EM_FLASHINFER:
    case EM_FLASHINFER2:
        m->n = s->layers;
        for (unsigned l = 0; l < m->n; l++) m->len[l] = 2 * slots * hk * e;
        break;
    case EM_SGLANG:
        m->n = 2 * s->layers;
        for (unsigned l = 0; l < s->layers; l++) m->len[2 * l] = slots * hk * e, m->len[2 * l + 1] = slots * hv * e;
        break;
    case EM_MLA:
        m->n = 1;
        m->len[0] = (size_t)s->layers * slots * hk * e;
        break;
    case EM_PADDED:
        m->n = 2 * s->layers;
        for (unsigned l = 0; l < s->layers; l++)
            m->len[2 * l] = s->blocks * (s->bs * hk * e + s->kpad), m->len[2 * l + 1] = s->blocks * (s->bs * hv * e + s->vpad);
        break;
    case EM_PAGE_MAJOR:
        m->n = 1;
        m->len[0] = (size_t)s->blocks * s->layers * 2 * s->bs * hk * e;
        break;
    default: abort();
    }
}

/* Allocates the engine's buffers, every byte `fill` (padding included). */
static inline void em_alloc(const em_shape_t *s, em_mem_t *m, uint8_t fill) {
    em_sizes(s, m);
    for (unsigned i = 0; i < m->n; i++) {
        m->buf[i] = malloc(m->len[i]);
        memset(m->buf[i], fill, m->len[i]);
    }
}

static inline void em_free(em_mem_t *m) {
    for (unsigned i = 0; i < m->n; i++) free(m->buf[i]);
    memset(m, 0, sizeof(*m));
}

/* Where element (l, kv, b, s, h, d) of the engine's tensors starts: buffer
 * *buf, byte *off. Row-major indexing of each engine's declared shape. */
static inline void model_loc(const em_shape_t *sh, uint32_t l, int kv, uint32_t b, uint32_t s, uint32_t h, uint32_t d,
                      unsigned *buf, size_t *off) {
    size_t e = sh->esz, B = sh->blocks, S = sh->bs, H = sh->heads, D = em_dim(sh, kv), L = sh->layers;
    size_t slot = (size_t)b * S + s;
    switch (sh->kind) {
    case EM_VLLM_FA: /* [2, B, S, H, D] */
        *buf = l;
        *off = ((((kv * B + b) * S + s) * H + h) * D + d) * e;
        return;
    case EM_FLASHINFER: /* [B, 2, S, H, D] */
    case EM_FLASHINFER2:
        *buf = l;
        *off = ((((b * 2 + kv) * S + s) * H + h) * D + d) * e;
        return;
    case EM_SGLANG: /* k_buffer[l], v_buffer[l]: [B*S, H, D] */
        *buf = 2 * l + (unsigned)kv;
        *off = ((slot * H + h) * D + d) * e;
        return;
    case EM_MLA: /* [L, B, S, D] */
        *buf = 0;
        *off = (((l * B + b) * S + s) * D + d) * e;
        return;
    case EM_PADDED: /* [B][S*H*D*e + pad] */
        *buf = 2 * l + (unsigned)kv;
        *off = b * (S * H * D * e + (kv ? sh->vpad : sh->kpad)) + ((s * H + h) * D + d) * e;
        return;
    case EM_PAGE_MAJOR: /* [B, L, 2, S, H, D] */
        *buf = 0;
        *off = (((((b * L + l) * 2 + kv) * S + s) * H + h) * D + d) * e;
        return;
    default: abort();
    }
}

/* Where the element sits in the logical (page, layer): K's [S, H, D], then V's. */
static inline size_t model_lofs(const em_shape_t *sh, int kv, uint32_t s, uint32_t h, uint32_t d) {
    size_t e = sh->esz, D = em_dim(sh, kv);
    return (kv ? em_piece(sh, 0) : 0) + (((size_t)s * sh->heads + h) * D + d) * e;
}

/* The value of byte i of element (l, kv, b, s, h, d); salt tells fills apart. */
static inline uint8_t model_byte(uint64_t salt, uint32_t l, int kv, uint32_t b, uint32_t s, uint32_t h, uint32_t d, uint32_t i) {
    uint64_t z = salt ^ ((uint64_t)l << 56) ^ ((uint64_t)kv << 52) ^ ((uint64_t)b << 36) ^ ((uint64_t)s << 24) ^
                 ((uint64_t)h << 16) ^ ((uint64_t)d << 4) ^ i;
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (uint8_t)(z ^ (z >> 31));
}

/* Visits every byte of every element of block b: f(arg, l, kv, s, h, d, i). */
#define EM_FOR_BYTES(sh, l, kv, s, h, d, i)                                              \
    for (uint32_t l = 0; l < (sh)->layers; l++)                                           \
        for (int kv = 0; kv < (em_has_v(sh) ? 2 : 1); kv++)                               \
            for (uint32_t s = 0; s < (sh)->bs; s++)                                       \
                for (uint32_t h = 0; h < (sh)->heads; h++)                                \
                    for (uint32_t d = 0; d < em_dim(sh, kv); d++)                         \
                        for (uint32_t i = 0; i < (sh)->esz; i++)

/* Writes the model's bytes of block b (as block `as`'s content) into m. */
static inline void em_fill_block(const em_shape_t *sh, em_mem_t *m, uint32_t b, uint32_t as, uint64_t salt) {
    EM_FOR_BYTES(sh, l, kv, s, h, d, i) {
        unsigned buf;
        size_t off;
        model_loc(sh, l, kv, b, s, h, d, &buf, &off);
        m->buf[buf][off + i] = model_byte(salt, l, kv, as, s, h, d, i);
    }
}

/* Per-layer pointer arrays describe() points into (the tier copies them). */
typedef struct em_ptrs {
    void *p[KVT_TIER_MAX_PLANES][EM_MAXL];
} em_ptrs_t;

/* The description an integrator writes for each engine (docs/engine.md). */
static inline void describe(const em_shape_t *sh, em_mem_t *m, em_ptrs_t *pp, kvt_tier_engine_t *e) {
    memset(e, 0, sizeof(*e));
    e->size = sizeof(*e);
    size_t k = em_piece(sh, 0), v = em_has_v(sh) ? em_piece(sh, 1) : 0;
    for (uint32_t l = 0; l < sh->layers; l++) {
        switch (sh->kind) {
        case EM_VLLM_FA:
            pp->p[0][l] = m->buf[l];
            pp->p[1][l] = m->buf[l] + (size_t)sh->blocks * k;
            break;
        case EM_FLASHINFER: pp->p[0][l] = m->buf[l]; break;
        case EM_FLASHINFER2:
            pp->p[0][l] = m->buf[l];
            pp->p[1][l] = m->buf[l] + k;
            break;
        case EM_SGLANG:
        case EM_PADDED:
            pp->p[0][l] = m->buf[2 * l];
            pp->p[1][l] = m->buf[2 * l + 1];
            break;
        default: break;
        }
    }
    switch (sh->kind) {
    case EM_VLLM_FA:
    case EM_SGLANG:
        e->planes = 2;
        e->plane[0] = (kvt_tier_plane_t){.layer_base = pp->p[0], .piece_bytes = k, .page_stride = k};
        e->plane[1] = (kvt_tier_plane_t){.layer_base = pp->p[1], .piece_bytes = v, .page_stride = v};
        break;
    case EM_FLASHINFER:
        e->planes = 1;
        e->plane[0] = (kvt_tier_plane_t){.layer_base = pp->p[0], .piece_bytes = k + v, .page_stride = k + v};
        break;
    case EM_FLASHINFER2:
        e->planes = 2;
        e->plane[0] = (kvt_tier_plane_t){.layer_base = pp->p[0], .piece_bytes = k, .page_stride = 2 * k};
        e->plane[1] = (kvt_tier_plane_t){.layer_base = pp->p[1], .piece_bytes = v, .page_stride = 2 * v};
        break;
    case EM_MLA:
        e->planes = 1;
        e->plane[0] = (kvt_tier_plane_t){.base = m->buf[0], .layer_stride = (uint64_t)sh->blocks * k,
                                         .piece_bytes = k, .page_stride = k};
        break;
    case EM_PADDED:
        e->planes = 2;
        e->plane[0] = (kvt_tier_plane_t){.layer_base = pp->p[0], .piece_bytes = k, .page_stride = k + sh->kpad};
        e->plane[1] = (kvt_tier_plane_t){.layer_base = pp->p[1], .piece_bytes = v, .page_stride = v + sh->vpad};
        break;
    case EM_PAGE_MAJOR:
        e->planes = 1;
        e->plane[0] = (kvt_tier_plane_t){.base = m->buf[0], .layer_stride = k + v, .piece_bytes = k + v,
                                         .page_stride = (uint64_t)sh->layers * (k + v)};
        break;
    default: abort();
    }
}

static inline kvt_tier_config_t em_config(const em_shape_t *sh, const kvt_tier_engine_t *e) {
    kvt_tier_config_t c;
    memset(&c, 0, sizeof(c));
    c.size = sizeof(c);
    c.kind = KVT_TIER_ENGINE;
    c.geom = (kvt_geom_t){sh->blocks, sh->layers, 0, KVT_LAYOUT_PAGE_FIRST}; /* layer_bytes 0: the sum of the pieces */
    c.engine = e;
    c.name = sh->name;
    return c;
}

#endif
