/* kvtier — request traces: the Mooncake JSONL format and its tokens.
 *
 * A Mooncake trace (FAST '25) is one JSON object a line:
 *
 *   {"timestamp": 27482, "input_length": 6955, "output_length": 52,
 *    "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59]}
 *
 * where each hash id names a block of 512 prompt tokens (the last one
 * partial): two requests that share their first k ids share their first k
 * blocks. The trace has no token ids, so kvtier gives each block fixed ones,
 * a function of its id alone (kvt_trace_block_tokens): the same in the
 * command, the library and the Python package, so that a replay through any
 * of them makes the same hits.
 *
 * A trace owns its requests and their ids; kvt_trace_free frees them.
 * Parsing is strict: a malformed line fails the whole load, and the message
 * names the file, the line and what is wrong; nothing is left allocated. */
#ifndef KVTIER_TRACE_H
#define KVTIER_TRACE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvtier/export.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_TRACE_BLOCK_TOKENS 512 /* tokens a hash id stands for */

/* One request (frozen layout: docs/abi.md). */
typedef struct kvt_trace_req {
    uint64_t timestamp_ms;  /* 0 when the line has none */
    uint64_t input_length;  /* prompt tokens, >= 1 */
    uint64_t output_length; /* 0 when the line has none */
    uint32_t *hash_ids;     /* nblocks = ceil(input_length / 512) block ids */
    uint32_t nblocks;
} kvt_trace_req_t;

/* A trace: its requests in file order (frozen layout). Zero it, or let a
 * load fill it. */
typedef struct kvt_trace {
    kvt_trace_req_t *req;
    size_t n, cap;
    uint64_t input_tokens; /* the requests' input_length summed */
    uint32_t max_blocks;   /* the longest request, in blocks */
} kvt_trace_t;

/* Loads a Mooncake trace into *t (overwritten: free a trace first). Blank
 * lines are skipped; a file with no request is refused. KVT_OK; KVT_EPARSE
 * with err = "PATH:LINE: what is wrong"; KVT_EIO when the file cannot be
 * opened or read (err says why); KVT_ENOMEM. On failure *t is empty. err
 * may be NULL (errlen 0). */
KVT_API int kvt_trace_load(const char *path, kvt_trace_t *t, char *err, size_t errlen);
/* The same from an open stream; name is what messages call it. */
KVT_API int kvt_trace_load_stream(FILE *f, const char *name, kvt_trace_t *t, char *err, size_t errlen);
/* Parses one line of len bytes (no newline; blanks around it are allowed)
 * and appends its request to *t. KVT_OK, or KVT_EPARSE / KVT_ENOMEM with
 * err = "NAME:LINENO: what is wrong" and *t unchanged. */
KVT_API int kvt_trace_parse_line(kvt_trace_t *t, const char *name, size_t lineno, const char *text, size_t len,
                                 char *err, size_t errlen);
/* Appends a copy of *r (its ids copied): KVT_OK, KVT_EINVAL when r is no
 * request (no blocks, ids NULL, or input_length outside
 * ((nblocks - 1) * 512, nblocks * 512]), or KVT_ENOMEM; *t unchanged on
 * failure. For traces built by a program. */
KVT_API int kvt_trace_append(kvt_trace_t *t, const kvt_trace_req_t *r);
/* Frees every request and zeroes *t. NULL is a no-op. */
KVT_API void kvt_trace_free(kvt_trace_t *t);

/* The 512 tokens of block id: token j is kvt_splitmix64(&x) & 0x7fffffff
 * with x = id << 9 | j (kvtier/rng.h). Computed the fastest way this CPU has
 * (AVX-512, SSE4.1 or scalar: docs/performance.md), each giving the same
 * values. */
KVT_API void kvt_trace_block_tokens(uint32_t id, int32_t *out);
/* A request's input_length tokens: its blocks' tokens, concatenated, cut to
 * its length. */
KVT_API void kvt_trace_request_tokens(const kvt_trace_req_t *r, int32_t *out);

#ifdef __cplusplus
}
#endif
#endif
