/* kvtier replay as a user runs it, on the shipped Mooncake trace. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/json.h"
#include "common/run.h"
#include "kvtier/cache.h"

#define TRACE KVT_SOURCE_DIR "/data/mooncake_synthetic_trace.jsonl"
#define RUN(...) run_argv((const char *const[]){NULL, "replay", __VA_ARGS__, NULL})


/* The second row of the reference table (data/README.md). */
Test(replay, reference_lru_hit_rates, .timeout = 120) {
    run_result_t r = RUN(TRACE, "--page-tokens", "512", "--sweep", "2000,6000,20000,unbounded", "--l2-pages", "0",
                         "--policy", "lru", "--l1-free-room", "0", "--json");
    cJSON *o = json_of(&r);
    const double want[] = {0.1527, 0.3266, 0.5928, 0.6504};
    cJSON *sw = cJSON_GetObjectItem(o, "sweep");
    cr_assert_eq(cJSON_GetArraySize(sw), 4);
    for (int i = 0; i < 4; i++) {
        double got = num(cJSON_GetArrayItem(sw, i), "hit_rate");
        cr_assert(fabs(got - want[i]) <= 0.002, "capacity %d: hit rate %.4f, reference %.4f", i, got, want[i]);
    }
    cr_assert_eq(num(cJSON_GetArrayItem(sw, 0), "requests"), 3993);
    cr_assert_eq(num(cJSON_GetArrayItem(sw, 0), "input_tokens"), 61194628);
    cJSON_Delete(o);
    run_free(&r);
}

/* The default policy against LRU on the same trace: >= 5 % better at 6,000
 * pages, and nowhere worse by more than 0.005. */
Test(replay, default_policy_beats_lru, .timeout = 120) {
    run_result_t a = RUN(TRACE, "--page-tokens", "512", "--sweep", "2000,6000,20000", "--l2-pages", "0", "--policy",
                         "lru", "--l1-free-room", "0", "--json");
    run_result_t b = RUN(TRACE, "--page-tokens", "512", "--sweep", "2000,6000,20000", "--l2-pages", "0",
                         "--l1-free-room", "0", "--json");
    cJSON *oa = json_of(&a), *ob = json_of(&b);
    for (int i = 0; i < 3; i++) {
        cJSON *la = cJSON_GetArrayItem(cJSON_GetObjectItem(oa, "sweep"), i);
        cJSON *lb = cJSON_GetArrayItem(cJSON_GetObjectItem(ob, "sweep"), i);
        double lru = num(la, "hit_rate"), def = num(lb, "hit_rate");
        cr_assert_str_neq(cJSON_GetObjectItem(lb, "policy")->valuestring, "lru");
        cr_assert_geq(def, lru - 0.005, "capacity %d: default %.4f, lru %.4f", i, def, lru);
        if (i == 1) cr_assert_geq(def / lru, 1.05, "at 6,000 pages: default %.4f, lru %.4f", def, lru);
    }
    cJSON_Delete(oa);
    cJSON_Delete(ob);
    run_free(&a);
    run_free(&b);
}

/* Planned eviction: at the default free-room targets, L1 eviction rounds per
 * 1,000 allocations are at least 3x fewer than deficit-only (page 16). */
Test(replay, free_room_batches_evictions, .timeout = 120) {
    run_result_t a = RUN(TRACE, "--l1-free-room", "0", "--l2-free-room", "0", "--json");
    run_result_t b = RUN(TRACE, "--json");
    cJSON *oa = json_of(&a), *ob = json_of(&b);
    double deficit = sub(oa, "evict_calls_per_1k_allocs", "l1"), planned = sub(ob, "evict_calls_per_1k_allocs", "l1");
    fprintf(stderr, "evict rounds per 1k allocations: %.1f deficit-only, %.1f planned; hit rate %.4f vs %.4f\n", deficit,
            planned, num(oa, "hit_rate"), num(ob, "hit_rate"));
    cr_assert_geq(deficit, 3 * planned, "deficit-only %.1f, planned %.1f", deficit, planned);
    cr_assert_eq(num(ob, "page_tokens"), 16);
    cJSON_Delete(oa);
    cJSON_Delete(ob);
    run_free(&a);
    run_free(&b);
}

/* check() after every one of the first 500 requests, under each write
 * policy, with tiers small enough to evict, load back and reclaim. */
Test(replay, consistent_after_every_request, .timeout = 600) {
    const char *wps[] = {"write_through", "write_through_selective", "write_back"};
    const char *sizes[][2] = {{"3000", "6000"}, {"6000", "3000"}};
    for (int w = 0; w < 3; w++)
        for (int s = 0; s < 2; s++) {
            run_result_t r = RUN(TRACE, "--page-tokens", "64", "--l1-pages", sizes[s][0], "--l2-pages", sizes[s][1],
                                 "--write-policy", wps[w], "--limit", "500", "--check-every", "1", "--json");
            cJSON *o = json_of(&r);
            cr_assert_eq(num(o, "requests"), 500);
            cr_assert_gt(sub(o, "evicted_pages", "l1"), 0);
            cJSON_Delete(o);
            run_free(&r);
        }
}

/* The summary names what the issue asks for. */
Test(replay, json_has_the_documented_fields, .timeout = 60) {
    run_result_t r = RUN(TRACE, "--limit", "200", "--json");
    cJSON *o = json_of(&r);
    const char *top[] = {"requests", "input_tokens", "hit_rate", "wall_s", "requests_per_s", "tokens_s", "backups", "loads",
                         "shadows_reclaimed", "l1_gb", "l2_gb", "bytes_per_token"};
    for (size_t i = 0; i < sizeof(top) / sizeof(top[0]); i++) cr_assert(cJSON_IsNumber(cJSON_GetObjectItem(o, top[i])), "%s", top[i]);
    /* the driver's share of the loop's time is a part of it */
    double wall = cJSON_GetObjectItem(o, "wall_s")->valuedouble, tok = cJSON_GetObjectItem(o, "tokens_s")->valuedouble;
    cr_assert(tok > 0 && tok <= wall, "tokens_s %g, wall_s %g", tok, wall);
    /* the CPU time is the loop's, not the process's (the trace was read before it): at most its
     * wall time, this replay being one thread (less 5 ms for the clocks' granularity) */
    double user = num(o, "user_s"), sys = num(o, "sys_s");
    cr_assert(user >= 0 && sys >= 0 && user + sys <= wall + 0.005, "user_s %g, sys_s %g, wall_s %g", user, sys, wall);
    cr_assert(cJSON_IsNumber(cJSON_GetObjectItem(o, "page_faults")) && num(o, "page_faults") >= 0);
    const char *pairs[] = {"hit_tokens", "evict_calls", "evicted_pages"};
    for (size_t i = 0; i < 3; i++) {
        sub(o, pairs[i], "l1");
        sub(o, pairs[i], "l2");
    }
    double rate = (sub(o, "hit_tokens", "l1") + sub(o, "hit_tokens", "l2")) / num(o, "input_tokens");
    cr_assert_float_eq(num(o, "hit_rate"), rate, 1e-9);
    cr_assert_eq(num(o, "bytes_per_token"), 327680, "llama-3-70b: 320 KiB per token");
    cJSON_Delete(o);
    run_free(&r);
}

/* --stats prom: the counters of the summary, as Prometheus text. */
Test(replay, stats_in_prometheus_text, .timeout = 60) {
    run_result_t r = RUN(TRACE, "--limit", "300", "--json", "--stats", "prom");
    cJSON *o = json_of(&r);
    char want[128];
    snprintf(want, sizeof(want), "kvtier_cache_requests_total 300\n");
    cr_assert_not_null(strstr(r.err, want), "%s", r.err);
    snprintf(want, sizeof(want), "kvtier_cache_l1_hit_tokens_total %.0f\n", sub(o, "hit_tokens", "l1"));
    cr_assert_not_null(strstr(r.err, want), "the same figure as the JSON: %s", want);
    cr_assert_not_null(strstr(r.err, "# TYPE kvtier_tree_nodes gauge"));
    cJSON_Delete(o);
    run_free(&r);
}

/* The built-in workload: seeded, so the same seed gives the same figures. */
Test(replay, synthetic_workload_is_seeded, .timeout = 60) {
    run_result_t a = RUN("--requests", "800", "--seed", "7", "--l1-pages", "4000", "--json");
    run_result_t b = RUN("--requests", "800", "--seed", "7", "--l1-pages", "4000", "--json");
    run_result_t c = RUN("--requests", "800", "--seed", "8", "--l1-pages", "4000", "--json");
    cJSON *oa = json_of(&a), *ob = json_of(&b), *oc = json_of(&c);
    cr_assert_eq(num(oa, "hit_rate"), num(ob, "hit_rate"));
    cr_assert_eq(num(oa, "input_tokens"), num(ob, "input_tokens"));
    cr_assert_neq(num(oa, "input_tokens"), num(oc, "input_tokens"));
    cr_assert_gt(num(oa, "hit_rate"), 0.3, "sessions and system prompts share prefixes");
    cr_assert_str_eq(cJSON_GetObjectItem(oa, "trace")->valuestring, "built-in synthetic workload");
    cJSON_Delete(oa);
    cJSON_Delete(ob);
    cJSON_Delete(oc);
    run_free(&a);
    run_free(&b);
    run_free(&c);
}

static char *write_tmp(const char *text) {
    static char path[64];
    snprintf(path, sizeof(path), "/tmp/kvt-trace-XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

/* A malformed line stops the replay with file:line and what is wrong. */
Test(replay, bad_trace_lines_name_their_line) {
    const char *good = "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 3, \"hash_ids\": [1, 2]}\n";
    static const struct { const char *bad; const char *msg; } cases[] = {
        {"{\"input_length\": 600, \"hash_ids\": [1, 2]", "not valid JSON"},
        {"[1, 2, 3]", "expected a JSON object"},
        {"{\"input_length\": 600}", "missing \"hash_ids\""},
        {"{\"input_length\": 600, \"hash_ids\": []}", "\"hash_ids\" must be a non-empty array"},
        {"{\"hash_ids\": [1, 2]}", "missing \"input_length\""},
        {"{\"input_length\": -5, \"hash_ids\": [1]}", "\"input_length\" must be a positive integer"},
        {"{\"input_length\": 600.5, \"hash_ids\": [1, 2]}", "\"input_length\" must be a positive integer"},
        {"{\"input_length\": 2000, \"hash_ids\": [1, 2]}", "\"input_length\" 2000 does not fit 2 blocks of 512 tokens (needs 512 < length <= 1024)"},
        {"{\"input_length\": 600, \"hash_ids\": [1, -2]}", "\"hash_ids\"[1] must be an integer"},
        {"{\"input_length\": 600, \"hash_ids\": [1, \"x\"]}", "\"hash_ids\"[1] must be an integer"},
        {"{\"input_length\": 600, \"hash_ids\": [1, 2], \"timestamp\": \"soon\"}", "\"timestamp\" must be"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char text[1024];
        snprintf(text, sizeof(text), "%s%s%s\n%s", good, good, cases[i].bad, good); /* line 3 is bad */
        char *path = write_tmp(text);
        run_result_t r = RUN(path);
        char want[128];
        snprintf(want, sizeof(want), "%s:3: %s", path, cases[i].msg);
        cr_assert_eq(r.status, 1, "case %zu: exit %d", i, r.status);
        cr_assert_not_null(strstr(r.err, want), "case %zu: stderr: %s (want %s)", i, r.err, want);
        cr_assert_str_eq(r.out, "", "case %zu: no summary", i);
        unlink(path);
        run_free(&r);
    }
    char *path = write_tmp("\n\n");
    run_result_t r = RUN(path);
    cr_assert_eq(r.status, 1);
    cr_assert_not_null(strstr(r.err, "no requests"));
    unlink(path);
    run_free(&r);
    r = RUN("/nonexistent/trace.jsonl");
    cr_assert_eq(r.status, 1);
    cr_assert_not_null(strstr(r.err, "/nonexistent/trace.jsonl: No such file"), "%s", r.err);
    run_free(&r);
}

/* A line is one JSON object and nothing else: a trace that lost its newlines,
 * trailing garbage, a NUL byte, a repeated key or a nesting past cJSON's
 * limit are refused with file:line, never replayed short. */
Test(replay, trace_lines_hold_one_object_only) {
    const char *good = "{\"input_length\": 600, \"hash_ids\": [1, 2]}\n";
    static char deep[2400];
    size_t k = (size_t)snprintf(deep, sizeof(deep), "{\"input_length\": 5, \"hash_ids\": [1], \"x\": ");
    for (int i = 0; i < 1001; i++) deep[k++] = '[';
    for (int i = 0; i < 1001; i++) deep[k++] = ']';
    deep[k++] = '}';
    static const char nul_line[] = "{\"hash_ids\":[1],\"input_length\":5}\0{\"hash_ids\":[2],\"input_length\":5}";
    const struct { const char *bad; size_t len; const char *msg; } cases[] = {
        {"{\"hash_ids\":[1],\"input_length\":5}{\"hash_ids\":[2],\"input_length\":5}", 0,
         "content after the JSON object at column 34 (one object a line)"},
        {"{\"hash_ids\":[1],\"input_length\":5} trailing", 0, "content after the JSON object at column 35"},
        {nul_line, sizeof(nul_line) - 1, "a NUL byte at column 34"},
        {"{\"hash_ids\":[1],\"input_length\":5,\"hash_ids\":[7]}", 0, "duplicate key \"hash_ids\""},
        {deep, k, "JSON nested 1002 levels deep; at most 1000 are read"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        static char text[4096];
        size_t blen = cases[i].len ? cases[i].len : strlen(cases[i].bad), n = 0;
        memcpy(text + n, good, strlen(good)), n += strlen(good);
        memcpy(text + n, cases[i].bad, blen), n += blen; /* line 2 is bad */
        text[n++] = '\n';
        memcpy(text + n, good, strlen(good)), n += strlen(good);
        char path[] = "/tmp/kvt-trace-XXXXXX";
        int fd = mkstemp(path);
        cr_assert_geq(fd, 0);
        cr_assert_eq(write(fd, text, n), (ssize_t)n);
        close(fd);
        run_result_t r = RUN(path);
        char want[160];
        snprintf(want, sizeof(want), "%s:2: %s", path, cases[i].msg);
        cr_assert_eq(r.status, 1, "case %zu: exit %d (%s)", i, r.status, r.out);
        cr_assert_not_null(strstr(r.err, want), "case %zu: stderr: %s (want %s)", i, r.err, want);
        cr_assert_str_eq(r.out, "", "case %zu: no summary", i);
        unlink(path);
        run_free(&r);
    }
    /* 1000 levels is cJSON's limit, and valid */
    char ok[2400];
    size_t m = (size_t)snprintf(ok, sizeof(ok), "{\"input_length\": 5, \"hash_ids\": [1], \"x\": ");
    for (int i = 0; i < 999; i++) ok[m++] = '[';
    for (int i = 0; i < 999; i++) ok[m++] = ']';
    ok[m++] = '}', ok[m++] = '\n', ok[m] = 0;
    char *path = write_tmp(ok);
    run_result_t r = RUN(path, "--json");
    cr_assert_eq(r.status, 0, "%s", r.err);
    unlink(path);
    run_free(&r);
}

Test(replay, bad_flags_say_what_is_allowed) {
    static const struct { const char *args[6]; const char *msg; } cases[] = {
        {{"--policy", "mru"}, "--policy: 'mru' is not one of lru|lfu|fifo|priority|slru|s2lru|arc"},
        {{"--write-policy", "sometimes"}, "--write-policy: 'sometimes' is not one of write_through|write_through_selective|write_back"},
        {{"--l1-free-room", "0.9"}, "--l1-free-room: '0.9' is not a number in [0, 0.5]"},
        {{"--page-tokens", "0"}, "--page-tokens: '0' is not an integer in [1, 512]"},
        {{"--l1-pages", "lots"}, "--l1-pages: 'lots' is not an integer in [1, 4294967295] or 'unbounded'"},
        {{"--sweep", "100,abc"}, "--sweep: 'abc' is not a capacity"},
        {{"--sweep", "100, -1"}, "--sweep: ' -1' is not a capacity"},
        {{"--sweep", "10,,100"}, "--sweep: '' is not a capacity"},
        {{"--sweep", "10,"}, "--sweep: '' is not a capacity"},
        {{"--limit", " -1"}, "--limit: ' -1' is not an integer in"},
        {{"--limit", " 5"}, "--limit: ' 5' is not an integer in"},
        {{"--limit", "+5"}, "--limit: '+5' is not an integer in"},
        {{"--seed", "18446744073709551616"}, "--seed: '18446744073709551616' is not an integer in"},
        {{"--l1-free-room", " 0.1"}, "--l1-free-room: ' 0.1' is not a number in"},
        {{"--plot", "x.png"}, "--plot: needs --sweep"},
        {{"--model", "gpt-9"}, "--model: 'gpt-9' is not one of llama-3-70b|"},
        {{"--frobnicate"}, "--frobnicate: unknown flag"},
        {{"a.jsonl", "b.jsonl"}, "unexpected argument 'b.jsonl'"},
        {{"--groups", "full:1:5,window:0:1:5"}, "--groups: group 2 ('window:0:1:5') is not full:LAYERS:BYTES"},
        {{"--groups", "window:3:1:5"}, "--groups: 'window:3:1:5' has no full group"},
        {{"--groups", "llama"}, "--groups: 'llama' is neither a preset"},
        {{"--groups", "full:x"}, "--groups: group 1 ('full:x') is not"},
        {{"--data", "--l3-pages", "64"}, "--l3-pages: not with --data: a modeled L3 holds no bytes"},
        {{"--data", "--copy-lag", "2"}, "--copy-lag: not with --data"},
        {{"--sweep", "100,200", "--stats", "prom"}, "--stats: one cache only: not with --sweep or --instances"},
        {{"--model", "qwen3-next-like", "--l2-pages", "0", "--l3", "dir:/tmp"}, "--l3: needs an L2 tier"},
        {{"--model", "qwen3-next-like", "--l2-pages", "0", "--l3-pages", "64"}, "--l3-pages: needs an L2 tier"},
        {{"--checkpoint-every", "-1"}, "--checkpoint-every: '-1' is not an integer in"},
        {{"--checkpoint-every", "4"}, "--checkpoint-every: only with a hybrid model"},
        {{"--threads", "4"}, "--threads: needs --data"},
        {{"--layout", "layer_first"}, "--layout: needs --data"},
        {{"--layers", "4"}, "--layers: needs --data"},
        {{"--write-through-hits", "7"}, "--write-through-hits: only with --write-policy write_through_selective"},
        {{"--l3-pages", "64", "--l3-write-hits", "9"}, "--l3-write-hits: only with --l3-write-policy write_through_selective"},
        {{"--l3-write-policy", "write_through"}, "--l3-write-policy: needs an L3"},
        {{"--prefetch-policy", "wait_complete"}, "--prefetch-policy: needs an L3"},
        {{"--prefetch-ahead", "8"}, "--prefetch-ahead: needs an L3"},
        {{"--l3-pages", "64", "--prefetch-timeout", "10"}, "--prefetch-timeout: only with --prefetch-policy timeout"},
        {{"--l3-pages", "64", "--prefetch-policy", "timeout", "--prefetch-timeout-max", "1"},
         "--prefetch-timeout: 2 s is longer than --prefetch-timeout-max (1 s)"},
        {{"--l3-pages", "64", "--l3-threads", "4"}, "--l3-threads: needs a store (--l3 URL)"},
        {{TRACE, "--requests", "5"}, "--requests: shapes the built-in synthetic workload: not with a trace"},
        {{TRACE, "--seed", "5"}, "--seed: shapes the built-in synthetic workload"},
        {{"--model", "llama-3-8b", "--window-weight", "0.5"}, "--window-weight: only with a hybrid model"},
        {{"--groups", "full:2:64", "--copy-lag", "1"}, "--copy-lag: only with a hybrid model"},
        {{"--groups", "full:1:64,window:4:1:64,"}, "--groups: 'full:1:64,window:4:1:64,' ends with ',': group 3 is empty"},
        {{"--groups", "full:65536:1099511627776,state:65536:1099511627776", "--page-tokens", "512"},
         "--groups: 'full:65536:1099511627776,state:65536:1099511627776': a page of 512 tokens would hold more than 2^64"},
        {{"--model", "gemma-3-like", "--stats", "table"}, "--stats: not with a hybrid model"},
        {{"--l2-pages", "0", "--l3-pages", "64"}, "--l3-pages: needs an L2 tier (--l2-pages > 0)"},
        {{"--l2-pages", "0", "--l3", "dir:/tmp"}, "--l3: needs an L2 tier (--l2-pages > 0)"},
        {{"--l1-pages", "100", "--sweep", "10,20"}, "--l1-pages: not with --sweep"},
        {{"--model", "gemma-3-like", "--state-share", "0.3"}, "--state-share: only with a state group"},
        {{"--model", "qwen3-next-like", "--window-weight", "0.5"}, "--window-weight: only with a window group"},
        {{"--groups", "full:2:64", "--layers", "3", "--data"}, "--layers: 128 bytes per token do not split into 3 layers"},
        {{"--model", "gemma-3-like", "--l3", "bogus://x"}, "--l3: malformed store URL 'bogus://x': unknown scheme"},
        {{"--instances", "2", "--l3", "redis://x"}, "--l3: malformed store URL 'redis://x': 'x' is not HOST:PORT"},
        {{"--model", "deepseek-v3", "--groups", "full:1:10"}, "--model: not with --groups"},
        {{"--groups", "full:65536:1099511627776,window:4294967295:65536:1099511627776"},
         "--l1-pages: 65536 pages of 16 tokens of 144115188075855872 bytes (the model as all-full attention) would "
         "hold more than 2^64 bytes"},
        {{"--groups", "full:1:64,window:32:1:128", "--layers", "3", "--data"},
         "--layers: the full groups' 64 bytes a token do not split into 3 layers"},
        {{"--sweep", "64,128", "--plot", "/nonexistent-dir/p.png"}, "--plot: cannot write in '/nonexistent-dir'"},
        {{"--sweep", "64,128", "--plot", "/tmp"}, "--plot: '/tmp' is a directory"},
        {{"--sweep", "64,128", "--plot", "/tmp/a\nb.png"}, "--plot: the path holds a control character"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *argv[9] = {NULL, "replay"};
        int n = 2;
        for (int j = 0; j < 6 && cases[i].args[j]; j++) argv[n++] = cases[i].args[j];
        argv[n] = NULL;
        run_result_t r = run_argv(argv);
        cr_assert_eq(r.status, 2, "case %zu: exit %d", i, r.status);
        cr_assert_not_null(strstr(r.err, cases[i].msg), "case %zu: stderr: %s", i, r.err);
        run_free(&r);
    }
    /* the environment is validated the same way */
    setenv("KVT_L2_FREE_ROOM", "2", 1);
    run_result_t r = RUN("--limit", "1");
    unsetenv("KVT_L2_FREE_ROOM");
    cr_assert_eq(r.status, 2);
    cr_assert_not_null(strstr(r.err, "KVT_L2_FREE_ROOM: '2' is not a number in [0, 0.5]"), "%s", r.err);
    run_free(&r);
    setenv("KVT_LIMIT", " -1", 1); /* strtoull alone takes this for 2^64 - 1 */
    r = RUN("--requests", "1");
    unsetenv("KVT_LIMIT");
    cr_assert_eq(r.status, 2);
    cr_assert_not_null(strstr(r.err, "KVT_LIMIT: ' -1' is not an integer in"), "%s", r.err);
    run_free(&r);
    /* the command line wins over the environment, a bad value there included */
    setenv("KVT_L2_FREE_ROOM", "2", 1);
    r = RUN("--requests", "1", "--l2-free-room", "0.1");
    unsetenv("KVT_L2_FREE_ROOM");
    cr_assert_eq(r.status, 0, "%s", r.err);
    run_free(&r);
    setenv("KVT_GROUPS", "gemma-3-like", 1); /* ... and --model given there over groups from the environment */
    r = RUN("--requests", "1", "--model", "deepseek-v3");
    unsetenv("KVT_GROUPS");
    cr_assert(r.status == 0 && strstr(r.out, "model deepseek-v3"), "exit %d: %s%s", r.status, r.out, r.err);
    run_free(&r);
    /* --help shows the environment's values as the defaults, a bad one skipped */
    setenv("KVT_L1_PAGES", "7", 1);
    setenv("KVT_PAGE_TOKENS", "abc", 1);
    r = RUN("--help");
    unsetenv("KVT_PAGE_TOKENS");
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.out, "--l1-pages (7;"), "%s", r.out);
    run_free(&r);
    /* an exported value where it does nothing is a default, not refused (the command line's is) */
    r = RUN("--requests", "5", "--sweep", "64,128");
    unsetenv("KVT_L1_PAGES");
    cr_assert_eq(r.status, 0, "%s", r.err);
    run_free(&r);
    /* a refusal of what the environment set names the variable */
    setenv("KVT_LAYERS", "3", 1);
    r = RUN("--groups", "full:2:64", "--data", "--requests", "5");
    unsetenv("KVT_LAYERS");
    cr_assert_eq(r.status, 2);
    cr_assert_not_null(strstr(r.err, "--layers: (set by KVT_LAYERS) 128 bytes per token do not split into 3 layers"), "%s", r.err);
    run_free(&r);
    setenv("KVT_REQUESTS", "100", 1); /* ... and where it does nothing it is a default */
    r = RUN(TRACE, "--limit", "5");
    unsetenv("KVT_REQUESTS");
    cr_assert_eq(r.status, 0, "%s", r.err);
    run_free(&r);
    r = RUN("--help");
    cr_assert_eq(r.status, 0);
    cr_assert_not_null(strstr(r.out, "KVT_L1_FREE_ROOM"), "the options table names the variables");
    cr_assert_not_null(strstr(r.out, "arc       adaptive"), "and the policies: %s", r.out);
    run_free(&r);
}

/* --sweep with --plot draws the curve with gnuplot. */
Test(replay, sweep_plot_png, .timeout = 60) {
    char png[64]; /* this run's own: suites may run side by side */
    snprintf(png, sizeof(png), "/tmp/kvt-sweep-test-%d.png", (int)getpid());
    unlink(png);
    run_result_t r = RUN(TRACE, "--page-tokens", "512", "--sweep", "1000,4000", "--l2-pages", "0", "--limit", "1000",
                         "--plot", png);
    if (access("/usr/bin/gnuplot", X_OK) != 0) {
        cr_assert_eq(r.status, 1);
        cr_assert_not_null(strstr(r.err, "gnuplot"));
    } else {
        cr_assert_eq(r.status, 0, "%s", r.err);
        assert_png_and_remove(png);
    }
    cr_assert_not_null(strstr(r.out, "L1 pages"), "the sweep table: %s", r.out);
    run_free(&r);
}

/* The --plot path is only ever a file name to gnuplot (it was pasted into
 * gnuplot's script: a quote in it ran system()), gnuplot writes nothing to
 * stdout (--json stays JSON), and a --sweep longer than the command reads
 * is refused, not cut short. */
Test(replay, plot_path_is_a_name_and_json_stays_json, .timeout = 60) {
    if (access("/usr/bin/gnuplot", X_OK) != 0) cr_skip_test("no gnuplot (apt-get install gnuplot-nox)");
    char dir[64], png[256], planted[64];
    snprintf(dir, sizeof(dir), "/tmp/kvt-plot-test-%d", (int)getpid());
    snprintf(planted, sizeof(planted), "kvt-planted-%d", (int)getpid()); /* where gnuplot runs: this cwd */
    mkdir(dir, 0755);
    snprintf(png, sizeof(png), "%s/q'; system('touch %s'); set output 'x.png", dir, planted);
    run_result_t r = RUN(TRACE, "--sweep", "1000,4000", "--limit", "300", "--plot", png, "--json");
    cJSON_Delete(json_of(&r));
    run_free(&r);
    bool ran = access(planted, F_OK) == 0;
    unlink(planted);
    cr_assert_not(ran, "the path ran as gnuplot commands");
    assert_png_and_remove(png);
    rmdir(dir);
    char sweep[700] = "1000";
    while (strlen(sweep) < 600) strcat(sweep, ",1000");
    r = RUN(TRACE, "--sweep", sweep);
    cr_assert_eq(r.status, 2);
    cr_assert_not_null(strstr(r.err, "--sweep: a list of"), "%s", r.err);
    run_free(&r);
}

/* --json carries every field of the cache's stats list (the list --stats
 * emits): l1_X, l2_X and l3_X as "X": {"l1", "l2", "l3"}, the others under their names,
 * with the values --stats json gives for the same run. */
Test(replay, json_has_every_cache_stats_field, .timeout = 60) {
    run_result_t r = RUN(TRACE, "--limit", "300", "--json", "--stats", "json");
    cJSON *o = json_of(&r);
    cJSON *st = cJSON_Parse(r.err), *cache = cJSON_GetObjectItem(st, "cache");
    cr_assert_not_null(cache, "--stats json: %s", r.err);
    int fields = 0;
#define CHECK_FIELD(f, kind, help)                                                                              \
    do {                                                                                                        \
        const char *n = #f;                                                                                     \
        double want = num(cache, n);                                                                            \
        const char tier[3] = {'l', n[1], 0};                                                                    \
        double got = (n[0] == 'l' && n[2] == '_') ? sub(o, n + 3, tier) : num(o, n);                            \
        cr_assert_eq(got, want, "%s: --json %g, --stats %g", n, got, want);                                     \
        fields++;                                                                                               \
    } while (0);
    KVT_CACHE_STATS_FIELDS(CHECK_FIELD)
#undef CHECK_FIELD
    cr_assert_geq(fields, 30, "the whole list was checked");
    cJSON_Delete(st);
    cJSON_Delete(o);
    run_free(&r);
}

/* A directory for a trace says so; a first line holding only a byte-order
 * mark is a blank line, as one after the mark would be. */
Test(replay, trace_edges_read_as_they_are) {
    run_result_t r = RUN("/tmp");
    cr_assert_eq(r.status, 1);
    cr_assert_not_null(strstr(r.err, "/tmp:1: Is a directory"), "%s", r.err);
    run_free(&r);
    char path[64];
    snprintf(path, sizeof(path), "/tmp/kvt-bom-%d.jsonl", (int)getpid());
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs("\xEF\xBB\xBF\n{\"input_length\": 600, \"hash_ids\": [1, 2]}\n", f);
    fclose(f);
    r = RUN(path, "--l1-pages", "64");
    unlink(path);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.out, "1 requests, 600 input tokens"), "%s", r.out);
    run_free(&r);
}

/* A --groups description names the model in an L3 store by a hash of its
 * text, however long (a store's model name holds 127 characters). */
Test(replay, a_long_groups_text_names_its_store, .timeout = 120) {
    char dir[64], url[80];
    snprintf(dir, sizeof(dir), "/tmp/kvt-groups-%d", (int)getpid());
    snprintf(url, sizeof(url), "dir:%s", dir);
    const char *groups = "full:10000:100000,full:10000:100000,full:10000:100000,full:10000:100000,"
                         "full:10000:100000,full:10000:100000,full:10000:100000,full:10000:100000";
    run_result_t r = RUN("--groups", groups, "--requests", "5", "--l3", url);
    char rm[96];
    snprintf(rm, sizeof(rm), "rm -rf '%s'", dir);
    cr_assert_eq(system(rm), 0);
    cr_assert_eq(r.status, 0, "%s", r.err);
    run_free(&r);
}
