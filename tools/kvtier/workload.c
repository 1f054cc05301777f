/* The built-in synthetic workload of `kvtier replay` (no trace file). */
#include "trace.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier/error.h"
#include "kvtier/rng.h"

void workload_default(workload_params_t *p) {
    p->requests = 4000;
    p->seed = 42;
    p->system_prompts = 24;
    p->zipf_s = 1.1;
}

/* Rank in [0, n) with P(k) ~ 1 / (k+1)^s, by inversion of the CDF. */
static uint32_t zipf(kvt_rng_t *rng, const double *cdf, uint32_t n) {
    double u = kvt_rng_unit(rng) * cdf[n - 1];
    uint32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (cdf[mid] < u) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

typedef struct session {
    uint32_t *ids; /* full blocks of the conversation so far */
    uint32_t n, cap;
    uint32_t turns_left;
} session_t;

static int sess_push(session_t *s, uint32_t id) {
    if (s->n == s->cap) {
        uint32_t cap = s->cap ? s->cap * 2 : 32;
        uint32_t *ids = realloc(s->ids, cap * sizeof(uint32_t));
        if (ids == NULL) return -1;
        s->ids = ids;
        s->cap = cap;
    }
    s->ids[s->n++] = id;
    return 0;
}

/* Sessions open over time and take turns in random order. A session starts
 * from one of the shared system prompts (Zipf popularity); each turn sends
 * its whole history plus 1-4 new blocks (the last one partial), and the
 * answer adds 0-2 blocks to the history. A session lasts 1-8 turns. */
int workload_generate(const workload_params_t *p, kvt_trace_t *t) {
    memset(t, 0, sizeof(*t));
    kvt_rng_t rng;
    kvt_rng_seed(&rng, p->seed);
    uint32_t next_id = 0, np = p->system_prompts ? p->system_prompts : 1;
    double *cdf = malloc(np * sizeof(double));
    uint32_t **prompt = calloc(np, sizeof(uint32_t *)), *plen = calloc(np, sizeof(uint32_t));
    session_t *live = calloc(64, sizeof(session_t));
    int rc = (cdf && prompt && plen && live) ? 0 : -1;
    for (uint32_t i = 0; i < np && rc == 0; i++) {
        cdf[i] = (i ? cdf[i - 1] : 0) + 1.0 / pow(i + 1.0, p->zipf_s);
        plen[i] = 1 + (uint32_t)kvt_rng_below(&rng, 8);
        prompt[i] = malloc(plen[i] * sizeof(uint32_t));
        if (prompt[i] == NULL) rc = -1;
        for (uint32_t j = 0; prompt[i] && j < plen[i]; j++) prompt[i][j] = next_id++;
    }
    uint32_t nlive = 0;
    uint64_t clock_ms = 0;
    for (uint64_t k = 0; k < p->requests && rc == 0; k++) {
        session_t *s;
        if (nlive == 0 || (nlive < 64 && kvt_rng_below(&rng, 100) < 30)) { /* a new session */
            s = &live[nlive++];
            memset(s, 0, sizeof(*s));
            uint32_t sp = zipf(&rng, cdf, np);
            for (uint32_t j = 0; j < plen[sp] && rc == 0; j++) rc = sess_push(s, prompt[sp][j]);
            s->turns_left = 1 + (uint32_t)kvt_rng_below(&rng, 8);
        } else {
            s = &live[kvt_rng_below(&rng, nlive)];
        }
        uint32_t user = 1 + (uint32_t)kvt_rng_below(&rng, 4);
        for (uint32_t j = 0; j < user && rc == 0; j++) rc = sess_push(s, next_id++); /* the turn: history + new blocks */
        if (rc) break;
        kvt_trace_req_t r = {.hash_ids = s->ids, .nblocks = s->n};
        r.input_length = (uint64_t)r.nblocks * KVT_TRACE_BLOCK_TOKENS - kvt_rng_below(&rng, KVT_TRACE_BLOCK_TOKENS);
        r.output_length = 16 + kvt_rng_below(&rng, 1024);
        clock_ms += kvt_rng_below(&rng, 200);
        r.timestamp_ms = clock_ms;
        if (kvt_trace_append(t, &r) != KVT_OK) { /* (copies the ids) */
            rc = -1;
            break;
        }
        s->n--; /* the turn's full blocks and the answer join the history; its last, partial one does not */
        uint32_t answer = (uint32_t)kvt_rng_below(&rng, 3);
        for (uint32_t j = 0; j < answer && rc == 0; j++) rc = sess_push(s, next_id++);
        if (--s->turns_left == 0) {
            free(s->ids);
            *s = live[--nlive];
        }
    }
    for (uint32_t i = 0; i < nlive; i++) free(live[i].ids);
    for (uint32_t i = 0; prompt && i < np; i++) free(prompt[i]);
    free(prompt);
    free(plen);
    free(cdf);
    free(live);
    if (rc) kvt_trace_free(t);
    return rc;
}
