#include <string.h>

#include "kvtier/error.h"
#include "kvtier/model.h"

#define GQA(l, h, d, b) (2ull * (l) * (h) * (d) * (b))
#define MLA(l, d, b) (1ull * (l) * (d) * (b))

/* The hybrid presets' shapes, per layer, from their public configurations:
 *
 *   Gemma-3-27B    62 layers, every sixth global (10), the others a 1024-token
 *                  window; 16 KV heads x 128, bf16: 8 KiB per token per layer.
 *   Qwen3-Next-80B 48 layers, 3 Gated DeltaNet : 1 attention (12, 2 KV heads
 *                  x 256, bf16: 2 KiB). A DeltaNet layer's state: 32 value
 *                  heads x 128 x 128 (1 MiB bf16) + its convolution (3 x 8192
 *                  channels, 48 KiB).
 *   Nemotron-H-8B  24 Mamba-2 layers + 4 attention layers (8 KV heads x 128,
 *                  bf16: 4 KiB; its MLP layers keep nothing). A Mamba-2
 *                  layer's state: 128 heads x 64 x 128 (2 MiB bf16) + its
 *                  convolution (3 x 10240 channels, 60 KiB).
 *
 * As kvt_model_t (every layer full attention) they keep each layer's KV at
 * the attention layers' width. */
#define GEMMA_LAYER (16ull * 128 * 2 * 2)
#define QNEXT_LAYER (2ull * 256 * 2 * 2)
#define QNEXT_STATE (32ull * 128 * 128 * 2 + 3ull * 8192 * 2)
#define NEMO_LAYER (8ull * 128 * 2 * 2)
#define NEMO_STATE (128ull * 64 * 128 * 2 + 3ull * 10240 * 2)

static const kvt_model_t MODELS[] = {
    {"llama-3-70b", "Llama-3-70B, GQA 80 layers x 8 KV heads x 128, bf16", 80, 8, 128, 2, GQA(80, 8, 128, 2)},
    {"llama-3-8b", "Llama-3-8B, GQA 32 layers x 8 KV heads x 128, bf16", 32, 8, 128, 2, GQA(32, 8, 128, 2)},
    {"qwen3-8b", "Qwen3-8B, GQA 36 layers x 8 KV heads x 128, bf16", 36, 8, 128, 2, GQA(36, 8, 128, 2)},
    {"qwen3-32b", "Qwen3-32B, GQA 64 layers x 8 KV heads x 128, bf16", 64, 8, 128, 2, GQA(64, 8, 128, 2)},
    {"deepseek-v3", "DeepSeek-V3/R1, MLA 61 layers x (512 latent + 64 rope), bf16", 61, 0, 576, 2, MLA(61, 576, 2)},
    {"gemma-3-like", "Gemma-3-27B-like: 52 sliding-window layers (1024 tokens) : 10 full, 16 KV heads x 128, bf16", 62,
     16, 128, 2, GQA(62, 16, 128, 2)},
    {"qwen3-next-like", "Qwen3-Next-80B-like: 36 linear-attention (Gated DeltaNet) layers : 12 full, 2 KV heads x 256, bf16",
     48, 2, 256, 2, GQA(48, 2, 256, 2)},
    {"nemotron-h-like", "Nemotron-H-8B-like: 24 Mamba-2 layers + 4 attention layers, 8 KV heads x 128, bf16", 28, 8, 128,
     2, GQA(28, 8, 128, 2)},
};
#define NMODELS (sizeof(MODELS) / sizeof(MODELS[0]))

typedef struct {
    uint32_t n; /* 0: one full group of every layer */
    kvt_layer_group_t g[3];
} groups_t;

static const groups_t GROUPS[NMODELS] = {
    {0, {{0}}}, {0, {{0}}}, {0, {{0}}}, {0, {{0}}}, {0, {{0}}},
    {2, {{KVT_GROUP_FULL, 10, 0, 0, 10 * GEMMA_LAYER}, {KVT_GROUP_WINDOW, 52, 1024, 0, 52 * GEMMA_LAYER}}},
    {2, {{KVT_GROUP_FULL, 12, 0, 0, 12 * QNEXT_LAYER}, {KVT_GROUP_STATE, 36, 0, 0, 36 * QNEXT_STATE}}},
    {2, {{KVT_GROUP_FULL, 4, 0, 0, 4 * NEMO_LAYER}, {KVT_GROUP_STATE, 24, 0, 0, 24 * NEMO_STATE}}},
};

static const char *const KINDS[] = {"full", "window", "state"};

const char *kvt_group_kind_name(kvt_group_kind_t k) { return (unsigned)k < KVT_GROUP_KIND_COUNT_ ? KINDS[k] : "?"; }

const kvt_model_t *kvt_model_find(const char *name) {
    for (unsigned i = 0; name && i < NMODELS; i++)
        if (strcmp(MODELS[i].name, name) == 0) return &MODELS[i];
    return NULL;
}

const kvt_model_t *kvt_model_at(unsigned i) { return i < NMODELS ? &MODELS[i] : NULL; }

int kvt_model_groups(const kvt_model_t *m, kvt_layer_group_t *out, uint32_t cap, uint32_t *n) {
    if (m == NULL || n == NULL || m < MODELS || m >= MODELS + NMODELS) return KVT_EINVAL;
    const groups_t *g = &GROUPS[m - MODELS];
    *n = g->n ? g->n : 1;
    if (*n > cap) return KVT_ERANGE;
    if (out == NULL) return KVT_EINVAL;
    if (g->n == 0) out[0] = (kvt_layer_group_t){KVT_GROUP_FULL, m->layers, 0, 0, m->bytes_per_token};
    else memcpy(out, g->g, g->n * sizeof(*out));
    return KVT_OK;
}

/* One decimal field of a group, 1 .. max, ending at ':' (more) or at the
 * group's end. */
static int field(const char **p, const char *end, int more, uint64_t max, uint64_t *v) {
    const char *s = *p;
    if (s >= end || *s < '0' || *s > '9') return -1;
    uint64_t x = 0;
    for (; s < end && *s >= '0' && *s <= '9'; s++) {
        if (x > (max - (uint64_t)(*s - '0')) / 10) return -1;
        x = x * 10 + (uint64_t)(*s - '0');
    }
    if (x == 0 || (more ? (s >= end || *s != ':') : s != end)) return -1;
    *p = s + more;
    *v = x;
    return 0;
}

static int parse_group(const char *s, const char *end, kvt_layer_group_t *g) {
    static const struct {
        const char *prefix;
        kvt_group_kind_t kind;
    } K[] = {{"full:", KVT_GROUP_FULL}, {"window:", KVT_GROUP_WINDOW}, {"state:", KVT_GROUP_STATE}};
    for (size_t k = 0; k < 3; k++) {
        size_t pl = strlen(K[k].prefix);
        if ((size_t)(end - s) <= pl || memcmp(s, K[k].prefix, pl) != 0) continue;
        const char *p = s + pl;
        uint64_t w = 0, layers, bytes;
        if (K[k].kind == KVT_GROUP_WINDOW && field(&p, end, 1, UINT32_MAX, &w) != 0) return -1;
        if (field(&p, end, 1, 1u << 16, &layers) != 0 || field(&p, end, 0, 1ull << 40, &bytes) != 0) return -1;
        *g = (kvt_layer_group_t){(uint32_t)K[k].kind, (uint32_t)layers, (uint32_t)w, 0, layers * bytes};
        return 0;
    }
    return -1;
}

int kvt_model_parse_groups(const char *text, kvt_layer_group_t *out, uint32_t cap, uint32_t *n, uint32_t *bad) {
    if (bad) *bad = 0;
    if (text == NULL || n == NULL || (out == NULL && cap)) return KVT_EINVAL;
    const kvt_model_t *m = kvt_model_find(text);
    if (m) return kvt_model_groups(m, out, cap, n);
    kvt_layer_group_t g[KVT_MODEL_MAX_GROUPS];
    uint32_t ng = 0, full = 0;
    for (const char *s = text;; ng++) {
        const char *end = strchr(s, ',');
        if (!end) end = s + strlen(s);
        if (ng == KVT_MODEL_MAX_GROUPS) return KVT_ERANGE;
        if (parse_group(s, end, &g[ng]) != 0) {
            if (bad) *bad = ng;
            return KVT_EINVAL;
        }
        full += g[ng].kind == KVT_GROUP_FULL;
        if (*end == '\0') break;
        s = end + 1;
    }
    ng++;
    if (full == 0) {
        if (bad) *bad = ng;
        return KVT_EINVAL;
    }
    *n = ng;
    if (ng > cap) return KVT_ERANGE;
    memcpy(out, g, ng * sizeof(*out));
    return KVT_OK;
}
