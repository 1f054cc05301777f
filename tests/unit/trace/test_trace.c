/* The trace parser and store (src/trace/trace.c): the shipped trace against
 * an independent read of it (cJSON straight, line by line), malformed lines
 * refused naming the line and leaving nothing behind, programmatic appends
 * checked and copied, and a request's tokens against its blocks'. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier/error.h"
#include "kvtier/trace.h"

#define TRACE KVT_SOURCE_DIR "/data/mooncake_synthetic_trace.jsonl"

Test(trace, the_shipped_trace_as_read_line_by_line) {
    kvt_trace_t t;
    char err[256] = "";
    cr_assert_eq(kvt_trace_load(TRACE, &t, err, sizeof(err)), KVT_OK, "%s", err);
    FILE *f = fopen(TRACE, "r");
    cr_assert(f);
    static char line[1 << 20];
    size_t n = 0;
    uint64_t tokens = 0;
    uint32_t most = 0;
    while (fgets(line, sizeof(line), f)) {
        cJSON *o = cJSON_Parse(line);
        cr_assert(o, "line %zu", n + 1);
        cr_assert_lt(n, t.n);
        const kvt_trace_req_t *r = &t.req[n];
        cr_assert_eq(r->input_length, (uint64_t)cJSON_GetObjectItem(o, "input_length")->valuedouble);
        cr_assert_eq(r->output_length, (uint64_t)cJSON_GetObjectItem(o, "output_length")->valuedouble);
        cr_assert_eq(r->timestamp_ms, (uint64_t)cJSON_GetObjectItem(o, "timestamp")->valuedouble);
        cJSON *ids = cJSON_GetObjectItem(o, "hash_ids");
        cr_assert_eq(r->nblocks, (uint32_t)cJSON_GetArraySize(ids));
        for (uint32_t i = 0; i < r->nblocks; i++)
            cr_assert_eq(r->hash_ids[i], (uint32_t)cJSON_GetArrayItem(ids, (int)i)->valuedouble, "line %zu id %u", n + 1, i);
        tokens += r->input_length;
        if (r->nblocks > most) most = r->nblocks;
        cJSON_Delete(o);
        n++;
    }
    fclose(f);
    cr_assert_eq(t.n, n);
    cr_assert_eq(t.input_tokens, tokens);
    cr_assert_eq(t.max_blocks, most);
    kvt_trace_free(&t);
    cr_assert(t.n == 0 && t.req == NULL && t.input_tokens == 0);
    kvt_trace_free(NULL);
}

/* A file of `text`, loaded: its rc, and err. */
static int load_text(const char *text, char *err, size_t errlen, kvt_trace_t *t) {
    FILE *f = fmemopen((void *)text, strlen(text), "r");
    cr_assert(f);
    int rc = kvt_trace_load_stream(f, "t.jsonl", t, err, errlen);
    fclose(f);
    return rc;
}

Test(trace, malformed_lines_are_named_and_leave_nothing) {
    const char *ok = "{\"timestamp\": 5, \"input_length\": 600, \"output_length\": 9, \"hash_ids\": [1, 2]}\n";
    static const struct {
        const char *line;
        const char *says;
    } bad[] = {
        {"{\"input_length\": 600, \"hash_ids\": [1, 2]", "not valid JSON"},
        {"[1, 2]", "expected a JSON object"},
        {"{\"input_length\": 600}", "missing \"hash_ids\""},
        {"{\"input_length\": 600, \"hash_ids\": []}", "non-empty array"},
        {"{\"hash_ids\": [1]}", "missing \"input_length\""},
        {"{\"input_length\": 0, \"hash_ids\": [1]}", "positive integer"},
        {"{\"input_length\": 1.5, \"hash_ids\": [1]}", "positive integer"},
        {"{\"input_length\": 513, \"hash_ids\": [1]}", "does not fit 1 blocks"},
        {"{\"input_length\": 512, \"hash_ids\": [1, 2]}", "does not fit 2 blocks"},
        {"{\"input_length\": 5, \"output_length\": -1, \"hash_ids\": [1]}", "\"output_length\""},
        {"{\"input_length\": 5, \"timestamp\": \"x\", \"hash_ids\": [1]}", "\"timestamp\""},
        {"{\"input_length\": 600, \"hash_ids\": [1, 4294967296]}", "\"hash_ids\"[1]"},
        {"{\"input_length\": 5, \"hash_ids\": [1], \"hash_ids\": [2]}", "duplicate key \"hash_ids\""},
        {"{\"input_length\": 5, \"hash_ids\": [1]} {\"input_length\": 5, \"hash_ids\": [1]}", "content after the JSON object"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char text[512], err[256] = "";
        snprintf(text, sizeof(text), "%s\n%s\n%s", ok, bad[i].line, ok); /* line 1 good, a blank line 2, line 3 bad */
        kvt_trace_t t;
        memset(&t, 0x5a, sizeof(t));
        cr_assert_eq(load_text(text, err, sizeof(err), &t), KVT_EPARSE, "case %zu: %s", i, bad[i].line);
        cr_assert(strncmp(err, "t.jsonl:3: ", 11) == 0, "case %zu names the line: %s", i, err);
        cr_assert(strstr(err, bad[i].says), "case %zu: '%s' does not say '%s'", i, err, bad[i].says);
        cr_assert(t.n == 0 && t.req == NULL, "case %zu: a refused trace is empty", i);
        /* the same line alone, appended to a trace that keeps what it had */
        kvt_trace_t one = {0};
        cr_assert_eq(kvt_trace_parse_line(&one, "x", 1, ok, strlen(ok) - 1, err, sizeof(err)), KVT_OK, "%s", err);
        cr_assert_eq(kvt_trace_parse_line(&one, "x", 7, bad[i].line, strlen(bad[i].line), NULL, 0), KVT_EPARSE);
        cr_assert_eq(one.n, 1);
        kvt_trace_free(&one);
    }
    char err[256];
    kvt_trace_t t;
    cr_assert_eq(load_text("\n  \n", err, sizeof(err), &t), KVT_EPARSE);
    cr_assert(strstr(err, "no requests"), "%s", err);
    cr_assert_eq(kvt_trace_load("/nonexistent/trace.jsonl", &t, err, sizeof(err)), KVT_EIO);
    cr_assert(strstr(err, "/nonexistent/trace.jsonl: No such file"), "%s", err);
    cr_assert_eq(kvt_trace_load("/nonexistent/trace.jsonl", &t, NULL, 0), KVT_EIO, "no message asked for");
    cr_assert_eq(kvt_trace_load(NULL, &t, err, sizeof(err)), KVT_EINVAL);
}

Test(trace, appends_are_checked_and_copied) {
    kvt_trace_t t = {0};
    uint32_t ids[3] = {7, 8, 9};
    kvt_trace_req_t r = {.timestamp_ms = 1, .input_length = 1100, .output_length = 3, .hash_ids = ids, .nblocks = 3};
    cr_assert_eq(kvt_trace_append(&t, &r), KVT_OK);
    ids[0] = 99; /* the trace keeps its own copy */
    cr_assert_eq(t.req[0].hash_ids[0], 7);
    kvt_trace_req_t wrong[] = {
        {.input_length = 1100, .hash_ids = ids, .nblocks = 0},
        {.input_length = 1025, .hash_ids = ids, .nblocks = 2},
        {.input_length = 1024, .hash_ids = ids, .nblocks = 3},
        {.input_length = 0, .hash_ids = ids, .nblocks = 1},
        {.input_length = 100, .hash_ids = NULL, .nblocks = 1},
    };
    for (size_t i = 0; i < sizeof(wrong) / sizeof(wrong[0]); i++) {
        cr_assert_eq(kvt_trace_append(&t, &wrong[i]), KVT_EINVAL, "case %zu", i);
        cr_assert(t.n == 1 && t.input_tokens == 1100 && t.max_blocks == 3, "case %zu changed the trace", i);
    }
    kvt_trace_free(&t);
}

Test(trace, a_requests_tokens_are_its_blocks_cut_to_its_length) {
    uint32_t ids[3] = {5, 1u << 31, 77};
    int32_t block[KVT_TRACE_BLOCK_TOKENS], want[3 * KVT_TRACE_BLOCK_TOKENS], got[3 * KVT_TRACE_BLOCK_TOKENS + 1];
    for (int b = 0; b < 3; b++) {
        kvt_trace_block_tokens(ids[b], block);
        memcpy(want + b * KVT_TRACE_BLOCK_TOKENS, block, sizeof(block));
    }
    for (uint64_t len = 1025; len <= 1536; len += 73) {
        kvt_trace_req_t r = {.input_length = len, .hash_ids = ids, .nblocks = 3};
        memset(got, 0x7f, sizeof(got));
        kvt_trace_request_tokens(&r, got);
        cr_assert(memcmp(got, want, len * sizeof(int32_t)) == 0, "length %lu", (unsigned long)len);
        cr_assert_eq(got[len], 0x7f7f7f7f, "length %lu: wrote past the request", (unsigned long)len);
    }
}

/* What strict JSON refuses and cJSON took (it skips every byte up to 0x20,
 * reads 007 and 5., takes any bytes in a string and cuts a key at \u0000):
 * each line refused, naming what and its column, counted from the line's
 * first byte, blanks included. Lengths are given: one line holds a NUL. */
Test(trace, what_strict_json_refuses_is_named_with_its_column) {
#define L(s) s, sizeof(s) - 1
    static const struct {
        const char *line;
        size_t len;
        const char *says;
        size_t col; /* 0: not checked */
    } bad[] = {
        {L("{\"input_length\": 5,\x00"" \"hash_ids\": [1]}"), "a NUL byte", 20},
        {L("\x01""{\"input_length\": 5, \"hash_ids\": [1]}"), "a control byte", 1},
        {L("{\"input_length\": 5, \"hash_ids\":\x0b""[1]}"), "a control byte", 32},
        {L("{\"input_length\": 5, \"x\x01""\": 1, \"hash_ids\": [1]}"), "a control character inside a string", 23},
        {L("{\"input_length\": 5, \"\xff""\": 1, \"hash_ids\": [1]}"), "not UTF-8", 22},
        {L("{\"input_length\": 5, \"\xc0""\xaf""\": 1, \"hash_ids\": [1]}"), "not UTF-8", 22},       /* overlong */
        {L("{\"input_length\": 5, \"\xed""\xa0""\x80""\": 1, \"hash_ids\": [1]}"), "not UTF-8", 22}, /* surrogate */
        {L("{\"input_length\": 005, \"hash_ids\": [1]}"), "a malformed number", 18},
        {L("{\"input_length\": 5., \"hash_ids\": [1]}"), "a malformed number", 18},
        {L("{\"input_length\": 5, \"hash_ids\": [1e]}"), "a malformed number", 34},
        {L("{\"input_length\": 5, \"hash_ids\": [-01]}"), "a malformed number", 34},
        /* not whole, but a double rounds them to whole ones: refused, not rounded into a request */
        {L("{\"input_length\": 0.99999999999999999, \"hash_ids\": [1]}"), "not whole but reads as one", 18},
        {L("{\"input_length\": 512.00000000000001, \"hash_ids\": [1, 2, 3, 4, 5]}"), "not whole but reads as one", 18},
        {L("{\"input_length\": 5, \"hash_ids\": [1e-400]}"), "not whole but reads as one", 34},
        {L("{\"input_length\": 5, \"hash_ids\": [4294967295.0000001]}"), "not whole but reads as one", 34},
        {L("{\"input_length\": 5, \"hash_ids\": [1], \"x\": 123456789012345678.5e-1}"), "not whole but reads as one", 43},
        {L("{\"input_length\": 5, \"timestamp\\u0000x\": 7, \"hash_ids\": [1]}"), "\\u0000 in a string", 31},
        {L("{\"input_length\": 5, \"timestamp\\u00zzx\": 7, \"hash_ids\": [1]}"), "an invalid \\u escape", 31},
        {L("{\"input_length\": 5, \"a\\qb\": 7, \"hash_ids\": [1]}"), "an invalid escape", 23},
        {L("        {\"input_length\": 005, \"hash_ids\": [1]}"), "a malformed number", 26},
        {L("  {\"input_length\": 5, \"hash_ids\": [1]} x"), "content after the JSON object", 40},
        {L("\xef""\xbb""\xbf""{\"input_length\": 5, \"hash_ids\": [1]}"), "a byte-order mark", 1}, /* not line 1 */
    };
#undef L
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kvt_trace_t t = {0};
        char err[256] = "", col[32];
        cr_assert_eq(kvt_trace_parse_line(&t, "x", 2, bad[i].line, bad[i].len, err, sizeof(err)), KVT_EPARSE,
                     "case %zu", i);
        cr_assert(strncmp(err, "x:2: ", 5) == 0 && strstr(err, bad[i].says), "case %zu: '%s' does not say '%s'", i,
                  err, bad[i].says);
        snprintf(col, sizeof(col), "column %zu", bad[i].col);
        cr_assert(bad[i].col == 0 || strstr(err, col), "case %zu: '%s' does not say '%s'", i, err, col);
        cr_assert_eq(t.n, 0);
    }
    /* what strict JSON takes: a byte-order mark starting the file, UTF-8 in strings, numbers in any
     * of JSON's forms */
    char err[256] = "";
    kvt_trace_t t;
    cr_assert_eq(load_text("\xef\xbb\xbf{\"input_length\": 6e2, \"hash_ids\": [1, 2], \"n\xc3\xbc\": \"\xe6\x97\xa5\"}\n"
                           "{\"input_length\": 1.0E+1, \"timestamp\": 0, \"hash_ids\": [0]}\n"
                           "{\"input_length\": 6250e-1, \"timestamp\": 2.50e1, \"hash_ids\": [-0.0, 7.000], \"x\": 0.5, \"y\": 1e-300}\n",
                           err, sizeof(err), &t),
                 KVT_OK, "%s", err);
    cr_assert(t.n == 3 && t.req[0].input_length == 600 && t.req[1].input_length == 10);
    cr_assert(t.req[2].input_length == 625 && t.req[2].timestamp_ms == 25 && t.req[2].hash_ids[1] == 7);
    kvt_trace_free(&t);
}

/* Duplicate keys among many: found (sorted, past 16 keys), and 80,000 keys
 * on a line are looked through within the timeout (pair by pair: 12 s). */
Test(trace, duplicate_keys_among_many_are_found, .timeout = 6) {
    const size_t nkeys = 80000;
    char *line = malloc(nkeys * 16 + 64), err[256] = "";
    for (int dup = 0; dup < 2; dup++) {
        size_t n = (size_t)sprintf(line, "{\"input_length\": 5, \"hash_ids\": [1]");
        for (size_t k = 0; k < nkeys; k++) n += (size_t)sprintf(line + n, ", \"k%zu\": 0", dup && k == nkeys - 1 ? 7 : k);
        n += (size_t)sprintf(line + n, "}");
        kvt_trace_t t = {0};
        int rc = kvt_trace_parse_line(&t, "x", 1, line, n, err, sizeof(err));
        if (dup) cr_assert(rc == KVT_EPARSE && strstr(err, "duplicate key \"k7\""), "%s", err);
        else cr_assert_eq(rc, KVT_OK, "%s", err);
        kvt_trace_free(&t);
    }
    free(line);
}
