#include <string.h>

#include "kvtier/model.h"

#define GQA(l, h, d, b) (2ull * (l) * (h) * (d) * (b))
#define MLA(l, d, b) (1ull * (l) * (d) * (b))

static const kvt_model_t MODELS[] = {
    {"llama-3-70b", "Llama-3-70B, GQA 80 layers x 8 KV heads x 128, bf16", 80, 8, 128, 2, GQA(80, 8, 128, 2)},
    {"llama-3-8b", "Llama-3-8B, GQA 32 layers x 8 KV heads x 128, bf16", 32, 8, 128, 2, GQA(32, 8, 128, 2)},
    {"qwen3-8b", "Qwen3-8B, GQA 36 layers x 8 KV heads x 128, bf16", 36, 8, 128, 2, GQA(36, 8, 128, 2)},
    {"qwen3-32b", "Qwen3-32B, GQA 64 layers x 8 KV heads x 128, bf16", 64, 8, 128, 2, GQA(64, 8, 128, 2)},
    {"deepseek-v3", "DeepSeek-V3/R1, MLA 61 layers x (512 latent + 64 rope), bf16", 61, 0, 576, 2, MLA(61, 576, 2)},
};

const kvt_model_t *kvt_model_find(const char *name) {
    for (unsigned i = 0; name && i < sizeof(MODELS) / sizeof(MODELS[0]); i++)
        if (strcmp(MODELS[i].name, name) == 0) return &MODELS[i];
    return NULL;
}

const kvt_model_t *kvt_model_at(unsigned i) { return i < sizeof(MODELS) / sizeof(MODELS[0]) ? &MODELS[i] : NULL; }
