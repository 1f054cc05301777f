/* kvtier — model presets: how many bytes of KV cache a token takes.
 *
 * MHA/GQA: 2 (K and V) x layers x kv_heads x head_dim x dtype bytes.
 * MLA (DeepSeek-V3/R1): layers x (latent + rope dims) x dtype bytes.
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

/* The preset called name, or NULL. */
KVT_API const kvt_model_t *kvt_model_find(const char *name);
/* Preset i (0..), or NULL past the last. */
KVT_API const kvt_model_t *kvt_model_at(unsigned i);

#ifdef __cplusplus
}
#endif
#endif
