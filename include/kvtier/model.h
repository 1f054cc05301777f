/* kvtier — model presets: how many bytes of KV cache a token takes, and
 * which kinds of layers keep it.
 *
 * MHA/GQA: 2 (K and V) x layers x kv_heads x head_dim x dtype bytes.
 * MLA (DeepSeek-V3/R1): layers x (latent + rope dims) x dtype bytes.
 *
 * Layer groups. A hybrid model (Gemma 3, Qwen3-Next, Nemotron-H, Jamba) mixes
 * layers that keep different things (docs/hybrid.md):
 *
 *   full       every token's KV, for ever (plain attention): pages
 *   window:W   every token's KV, but a new token looks back over the last W
 *              tokens only (sliding-window attention): pages, of which a
 *              prefix of n tokens needs those covering [n - W, n)
 *   state      a fixed-size recurrent state per sequence (Mamba, linear
 *              attention): the state after token n continues from n, and
 *              nothing else does; kept as checkpoints at page boundaries
 *
 * A preset's kvt_model_t describes it as if every layer were full attention
 * (bytes_per_token: what a cache that knows no groups keeps per token);
 * kvt_model_groups gives its groups. A model with no hybrid layers is one
 * full group of all its layers.
 *
 * Threads: read-only presets and pure functions; any thread.
 */
#ifndef KVTIER_MODEL_H
#define KVTIER_MODEL_H

#include "kvtier/export.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvt_model {
    const char *name;
    const char *describe;
    uint32_t layers;
    uint32_t kv_heads;   /* 0 for MLA */
    uint32_t head_dim;   /* MLA: latent + rope dims */
    uint32_t dtype_bytes;
    uint64_t bytes_per_token; /* all layers */
} kvt_model_t;

typedef enum kvt_group_kind {
    KVT_GROUP_FULL = 0,
    KVT_GROUP_WINDOW = 1,
    KVT_GROUP_STATE = 2,
    KVT_GROUP_KIND_COUNT_
} kvt_group_kind_t;

#define KVT_MODEL_MAX_GROUPS 8

/* One group of layers of the same kind (frozen: docs/abi.md). */
typedef struct kvt_layer_group {
    uint32_t kind;   /* kvt_group_kind_t */
    uint32_t layers; /* >= 1 */
    uint32_t window; /* window: W, tokens a new token looks back over (>= 1); else 0 */
    uint32_t reserved_; /* 0 */
    uint64_t bytes;  /* full, window: KV bytes per token over the group's layers;
                      * state: bytes of one checkpoint (every layer's state) */
} kvt_layer_group_t;

KVT_API const char *kvt_group_kind_name(kvt_group_kind_t k);

/* The preset called name, or NULL. */
KVT_API const kvt_model_t *kvt_model_find(const char *name);
/* Preset i (0..), or NULL past the last. */
KVT_API const kvt_model_t *kvt_model_at(unsigned i);

/* The layer groups of preset m into out[0..cap): *n is how many it has (a
 * model without hybrid layers: one full group). KVT_EINVAL for a model
 * that is not a preset or a NULL pointer, KVT_ERANGE when cap is short (*n
 * set, out untouched). */
KVT_API int kvt_model_groups(const kvt_model_t *m, kvt_layer_group_t *out, uint32_t cap, uint32_t *n);

/* Layer groups from text: a preset's name, or groups separated by commas,
 *
 *   full:LAYERS:BYTES          BYTES of KV per token per layer
 *   window:W:LAYERS:BYTES      the same, for a window of W tokens
 *   state:LAYERS:BYTES         BYTES of recurrent state per layer
 *
 * e.g. "full:10:8192,window:1024:52:8192". Groups of the same kind (and
 * window) may repeat. KVT_EINVAL when the text is neither; then *bad (when
 * not NULL) is the index of the first group refused (0 for an unknown
 * name) and out is untouched. At least one group must be full (the prefix
 * tree holds its pages): without one, *bad is the number of groups.
 * KVT_ERANGE past cap (or KVT_MODEL_MAX_GROUPS) groups. */
KVT_API int kvt_model_parse_groups(const char *text, kvt_layer_group_t *out, uint32_t cap, uint32_t *n, uint32_t *bad);

#ifdef __cplusplus
}
#endif
#endif
