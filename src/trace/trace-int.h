/* Internal to the trace module: the ways of computing a block's tokens
 * (tokens.c), for the tests, which check every way this machine has. */
#ifndef KVTIER_TRACE_INT_H
#define KVTIER_TRACE_INT_H

#include <stdbool.h>
#include <stdint.h>

typedef enum kvt__trace_tokens_way {
    KVT__TRACE_TOKENS_SPLIT,  /* scalar, one multiply a token: any machine */
    KVT__TRACE_TOKENS_SSE41,  /* the split, 4 tokens at a time: x86-64 with SSE4.1 */
    KVT__TRACE_TOKENS_AVX512, /* the split, 8 tokens at a time: x86-64 with AVX-512 */
    KVT__TRACE_TOKENS_WAYS_
} kvt__trace_tokens_way_t;

/* Block id's tokens computed `way`; false (out untouched) when this machine
 * or build does not have that way. */
bool kvt__trace_block_tokens_way(kvt__trace_tokens_way_t way, uint32_t id, int32_t *out);

#endif
