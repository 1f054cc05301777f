/* The trace parser (src/trace/trace.c): the input as a whole Mooncake
 * JSONL file (kvt_trace_load_stream, what `kvtier replay FILE` reads) and its
 * first line alone (kvt_trace_parse_line).
 *
 * Accepted requests must be what the format allows (a non-empty list of
 * block ids, an input length that fits them, the file's totals the sum of
 * its requests), and must round-trip: written back as JSON and parsed again
 * they are the same request. A refused input must say why. */
#include <inttypes.h>

#include "fuzz.h"
#include "kvtier/error.h"
#include "kvtier/trace.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet();
    return 0;
}

static void check_req(const kvt_trace_req_t *r) {
    FZ_ASSERT(r->nblocks > 0 && r->hash_ids != NULL, "an empty request was accepted");
    uint64_t lo = (uint64_t)(r->nblocks - 1) * KVT_TRACE_BLOCK_TOKENS, hi = (uint64_t)r->nblocks * KVT_TRACE_BLOCK_TOKENS;
    FZ_ASSERT(r->input_length > lo && r->input_length <= hi, "input_length %" PRIu64 " for %u blocks", r->input_length,
              r->nblocks);
    /* round trip */
    size_t cap = 128 + (size_t)r->nblocks * 12, k = 0;
    char *txt = malloc(cap);
    FZ_ASSERT(txt != NULL, "out of memory");
    k += (size_t)snprintf(txt + k, cap - k, "{\"timestamp\": %" PRIu64 ", \"input_length\": %" PRIu64
                          ", \"output_length\": %" PRIu64 ", \"hash_ids\": [", r->timestamp_ms, r->input_length,
                          r->output_length);
    for (uint32_t i = 0; i < r->nblocks; i++) k += (size_t)snprintf(txt + k, cap - k, "%s%u", i ? "," : "", r->hash_ids[i]);
    k += (size_t)snprintf(txt + k, cap - k, "]}");
    kvt_trace_t again = {0};
    char err[256];
    FZ_ASSERT(kvt_trace_parse_line(&again, "again", 1, txt, k, err, sizeof(err)) == KVT_OK && again.n == 1,
              "written back, refused: %s (%s)", err, txt);
    const kvt_trace_req_t b = again.req[0];
    FZ_ASSERT(b.nblocks == r->nblocks && b.input_length == r->input_length && b.output_length == r->output_length &&
                  b.timestamp_ms == r->timestamp_ms && memcmp(b.hash_ids, r->hash_ids, r->nblocks * sizeof(uint32_t)) == 0,
              "the request changed on a round trip: %s", txt);
    kvt_trace_free(&again);
    free(txt);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    /* the whole file */
    if (size > 0) {
        FILE *f = fmemopen((void *)data, size, "r");
        FZ_ASSERT(f != NULL, "fmemopen");
        kvt_trace_t t;
        err[0] = 0;
        int rc = kvt_trace_load_stream(f, "fuzz", &t, err, sizeof(err));
        fclose(f);
        if (rc == 0) {
            uint64_t tokens = 0;
            uint32_t most = 0;
            FZ_ASSERT(t.n > 0, "an empty trace was accepted");
            for (size_t i = 0; i < t.n; i++) {
                check_req(&t.req[i]);
                tokens += t.req[i].input_length;
                if (t.req[i].nblocks > most) most = t.req[i].nblocks;
            }
            FZ_ASSERT(tokens == t.input_tokens && most == t.max_blocks, "the trace's totals are not its requests'");
            kvt_trace_free(&t);
        } else {
            FZ_ASSERT((rc == KVT_EPARSE || rc == KVT_EIO) && err[0] != 0, "refused (%d) without a reason", rc);
            FZ_ASSERT(t.n == 0 && t.req == NULL, "a refused trace left requests behind");
        }
    }
    /* the first line alone */
    size_t len = 0;
    while (len < size && data[len] != '\n') len++;
    kvt_trace_t one = {0};
    err[0] = 0;
    if (kvt_trace_parse_line(&one, "fuzz", 1, (const char *)data, len, err, sizeof(err)) == KVT_OK) {
        FZ_ASSERT(one.n == 1, "a line accepted, %zu requests", one.n);
        check_req(&one.req[0]);
        kvt_trace_free(&one);
    } else {
        FZ_ASSERT(err[0] != 0 && one.n == 0, "a line refused without a reason, or left behind");
    }
    return 0;
}
