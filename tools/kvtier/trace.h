/* Request traces for kvtier replay: the Mooncake JSONL format, and the
 * built-in synthetic workload, both as a list of requests whose prompts are
 * chains of 512-token blocks named by hash ids. */
#ifndef KVTIER_TOOLS_TRACE_H
#define KVTIER_TOOLS_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#define TRACE_BLOCK_TOKENS 512

typedef struct trace_req {
    uint64_t timestamp_ms;
    uint64_t input_length;  /* tokens */
    uint64_t output_length;
    uint32_t *hash_ids;     /* ceil(input_length / 512) block ids */
    uint32_t nblocks;
} trace_req_t;

typedef struct trace {
    trace_req_t *req;
    size_t n, cap;
    uint64_t input_tokens;
    uint32_t max_blocks;
} trace_t;

/* Parses a Mooncake trace. On a malformed line, returns -1 with err set to
 * "PATH:LINE: what is wrong". */
int trace_load(const char *path, trace_t *t, char *err, size_t errlen);
/* The same from an open stream (name for messages): what trace_load reads
 * once it has opened the file. */
int trace_load_stream(FILE *f, const char *name, trace_t *t, char *err, size_t errlen);
/* One line of len bytes (no newline, blanks trimmed) into *r (r->hash_ids
 * allocated; free()): 0, or -1 with err set, nothing allocated. */
int trace_parse_line(const char *name, size_t lineno, const char *text, size_t len, trace_req_t *r, char *err,
                     size_t errlen);

typedef struct workload_params {
    uint64_t requests;
    uint64_t seed;
    uint32_t system_prompts;  /* shared system prompts, Zipf popularity */
    double zipf_s;
} workload_params_t;

void workload_default(workload_params_t *p);
/* The built-in workload: shared system prompts chosen by Zipf popularity,
 * multi-turn sessions whose turns extend their own history, seeded. */
int workload_generate(const workload_params_t *p, trace_t *t);

void trace_free(trace_t *t);

/* The 512 tokens of block `id`: a fixed function of the id, token j being
 * splitmix64(id << 9 | j) & 0x7fffffff (kvtier/rng.h); computed the fastest
 * way the machine has (trace_tokens.c). */
void trace_block_tokens(uint32_t id, int32_t *out);

/* The ways, each giving the same values; the tests check every way the
 * machine has. */
typedef enum trace_tokens_way {
    TRACE_TOKENS_SPLIT,  /* scalar, one multiply a token: any machine */
    TRACE_TOKENS_SSE41,  /* the split, 4 tokens at a time: x86-64 with SSE4.1 */
    TRACE_TOKENS_AVX512, /* the split, 8 tokens at a time: x86-64 with AVX-512 */
    TRACE_TOKENS_WAYS_
} trace_tokens_way_t;

/* Block id's tokens computed `way`; false (out untouched) when this machine
 * or build does not have that way. */
bool trace_block_tokens_way(trace_tokens_way_t way, uint32_t id, int32_t *out);

#endif
