/* Traces: the Mooncake JSONL parser and the built-in synthetic workload. */
#include "trace.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kvtier/rng.h"

void trace_free(trace_t *t) {
    for (size_t i = 0; i < t->n; i++) free(t->req[i].hash_ids);
    free(t->req);
    memset(t, 0, sizeof(*t));
}

static int push(trace_t *t, const trace_req_t *r) {
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 1024;
        trace_req_t *nr = realloc(t->req, cap * sizeof(*nr));
        if (nr == NULL) return -1;
        t->req = nr;
        t->cap = cap;
    }
    t->req[t->n++] = *r;
    t->input_tokens += r->input_length;
    if (r->nblocks > t->max_blocks) t->max_blocks = r->nblocks;
    return 0;
}

/* ---- Mooncake JSONL ---- */

static int line_error(char *err, size_t errlen, const char *path, size_t line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int line_error(char *err, size_t errlen, const char *path, size_t line, const char *fmt, ...) {
    int n = snprintf(err, errlen, "%s:%zu: ", path, line);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < errlen) vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

/* A JSON number that is a whole number in [0, max]. */
static int whole(const cJSON *v, double max, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= max) || floor(d) != d) return -1;
    *out = (uint64_t)d;
    return 0;
}

/* The deepest nesting of arrays and objects in text, strings skipped: cJSON
 * refuses past CJSON_NESTING_LIMIT, and "not valid JSON" would be wrong. */
static size_t nesting(const char *text, size_t len) {
    size_t depth = 0, deepest = 0;
    bool in_string = false;
    for (size_t i = 0; i < len; i++) {
        char ch = text[i];
        if (in_string) {
            if (ch == '\\') i++;
            else if (ch == '"') in_string = false;
        } else if (ch == '"') {
            in_string = true;
        } else if (ch == '[' || ch == '{') {
            if (++depth > deepest) deepest = depth;
        } else if ((ch == ']' || ch == '}') && depth > 0) {
            depth--;
        }
    }
    return deepest;
}

/* The first key of object o that appears twice, or NULL. Objects of a trace
 * have a handful of keys: a quadratic look is cheapest. */
static const char *duplicate_key(const cJSON *o) {
    for (const cJSON *a = o->child; a; a = a->next)
        for (const cJSON *b = a->next; b; b = b->next)
            if (a->string && b->string && strcmp(a->string, b->string) == 0) return a->string;
    return NULL;
}

int trace_parse_line(const char *path, size_t lineno, const char *text, size_t len, trace_req_t *r, char *err,
                      size_t errlen) {
    size_t depth = nesting(text, len);
    if (depth > CJSON_NESTING_LIMIT)
        return line_error(err, errlen, path, lineno, "JSON nested %zu levels deep; at most %d are read", depth,
                          CJSON_NESTING_LIMIT);
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    int rc = -1;
    if (o == NULL) {
        size_t col = end && end >= text ? (size_t)(end - text) + 1 : 1;
        return line_error(err, errlen, path, lineno, "not valid JSON (near column %zu)", col);
    }
    /* One object a line: anything after it (a second object of a trace that
     * lost its newlines, garbage, a NUL byte) would otherwise be dropped. */
    size_t used = end && end >= text ? (size_t)(end - text) : len;
    while (used < len && (text[used] == ' ' || text[used] == '\t')) used++;
    if (used < len) {
        cJSON_Delete(o);
        if (text[used] == 0) return line_error(err, errlen, path, lineno, "a NUL byte at column %zu", used + 1);
        return line_error(err, errlen, path, lineno, "content after the JSON object at column %zu (one object a line)",
                          used + 1);
    }
    const char *dup = cJSON_IsObject(o) ? duplicate_key(o) : NULL;
    if (dup) {
        line_error(err, errlen, path, lineno, "duplicate key \"%.40s\"", dup);
        cJSON_Delete(o);
        return -1;
    }
    memset(r, 0, sizeof(*r));
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(o, "hash_ids");
    const cJSON *il = cJSON_GetObjectItemCaseSensitive(o, "input_length");
    const cJSON *ol = cJSON_GetObjectItemCaseSensitive(o, "output_length");
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(o, "timestamp");
    if (!cJSON_IsObject(o)) {
        line_error(err, errlen, path, lineno, "expected a JSON object");
    } else if (ids == NULL) {
        line_error(err, errlen, path, lineno, "missing \"hash_ids\"");
    } else if (!cJSON_IsArray(ids) || cJSON_GetArraySize(ids) == 0) {
        line_error(err, errlen, path, lineno, "\"hash_ids\" must be a non-empty array of block ids");
    } else if (il == NULL) {
        line_error(err, errlen, path, lineno, "missing \"input_length\"");
    } else if (whole(il, 1e12, &r->input_length) || r->input_length == 0) {
        line_error(err, errlen, path, lineno, "\"input_length\" must be a positive integer");
    } else if (ol && whole(ol, 1e12, &r->output_length)) {
        line_error(err, errlen, path, lineno, "\"output_length\" must be a non-negative integer");
    } else if (ts && whole(ts, 1e15, &r->timestamp_ms)) {
        line_error(err, errlen, path, lineno, "\"timestamp\" must be a non-negative integer (ms)");
    } else {
        int n = cJSON_GetArraySize(ids);
        uint64_t lo = (uint64_t)(n - 1) * TRACE_BLOCK_TOKENS, hi = (uint64_t)n * TRACE_BLOCK_TOKENS;
        if (r->input_length <= lo || r->input_length > hi) {
            line_error(err, errlen, path, lineno,
                       "\"input_length\" %llu does not fit %d blocks of %d tokens (needs %llu < length <= %llu)",
                       (unsigned long long)r->input_length, n, TRACE_BLOCK_TOKENS, (unsigned long long)lo,
                       (unsigned long long)hi);
        } else if ((r->hash_ids = malloc((size_t)n * sizeof(uint32_t))) == NULL) {
            line_error(err, errlen, path, lineno, "out of memory");
        } else {
            int i = 0;
            const cJSON *v;
            rc = 0;
            cJSON_ArrayForEach(v, ids) {
                uint64_t id;
                if (whole(v, 4294967295.0, &id)) {
                    rc = line_error(err, errlen, path, lineno,
                                    "\"hash_ids\"[%d] must be an integer in [0, 4294967295]", i);
                    break;
                }
                r->hash_ids[i++] = (uint32_t)id;
            }
            r->nblocks = (uint32_t)n;
            if (rc) {
                free(r->hash_ids);
                r->hash_ids = NULL;
            }
        }
    }
    cJSON_Delete(o);
    return rc;
}

int trace_load(const char *path, trace_t *t, char *err, size_t errlen) {
    memset(t, 0, sizeof(*t));
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    int rc = trace_load_stream(f, path, t, err, errlen);
    fclose(f);
    return rc;
}

int trace_load_stream(FILE *f, const char *path, trace_t *t, char *err, size_t errlen) {
    memset(t, 0, sizeof(*t));
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    ssize_t len;
    int rc = 0;
    while (rc == 0 && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        size_t k = (size_t)len;
        while (k > 0 && (line[k - 1] == '\n' || line[k - 1] == '\r' || line[k - 1] == ' ' || line[k - 1] == '\t')) k--;
        size_t s = 0;
        while (s < k && (line[s] == ' ' || line[s] == '\t')) s++;
        if (s == k) continue; /* blank line */
        trace_req_t r;
        rc = trace_parse_line(path, lineno, line + s, k - s, &r, err, errlen);
        if (rc == 0 && push(t, &r) != 0) {
            free(r.hash_ids);
            rc = line_error(err, errlen, path, lineno, "out of memory");
        }
    }
    if (rc == 0 && ferror(f)) rc = -1, snprintf(err, errlen, "%s: read error", path);
    if (rc == 0 && t->n == 0) rc = -1, snprintf(err, errlen, "%s: no requests in the file", path);
    free(line);
    if (rc) trace_free(t);
    return rc;
}

/* ---- the built-in workload ---- */

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
int workload_generate(const workload_params_t *p, trace_t *t) {
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
        trace_req_t r = {0};
        r.nblocks = s->n + user;
        r.hash_ids = malloc(r.nblocks * sizeof(uint32_t));
        if (r.hash_ids == NULL) {
            rc = -1;
            break;
        }
        memcpy(r.hash_ids, s->ids, s->n * sizeof(uint32_t));
        for (uint32_t j = 0; j < user; j++) r.hash_ids[s->n + j] = next_id++;
        r.input_length = (uint64_t)r.nblocks * TRACE_BLOCK_TOKENS - kvt_rng_below(&rng, TRACE_BLOCK_TOKENS);
        r.output_length = 16 + kvt_rng_below(&rng, 1024);
        clock_ms += kvt_rng_below(&rng, 200);
        r.timestamp_ms = clock_ms;
        if (push(t, &r) != 0) {
            free(r.hash_ids);
            rc = -1;
            break;
        }
        /* the turn's full blocks and the answer join the history */
        for (uint32_t j = s->n; j < r.nblocks - 1 && rc == 0; j++) rc = sess_push(s, r.hash_ids[j]);
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
    if (rc) trace_free(t);
    return rc;
}
