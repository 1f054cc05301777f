/* Test helpers: the JSON a kvtier command printed, and its fields, failing
 * the test (with the command's stderr) when either is not there. */
#ifndef KVTIER_TESTS_JSON_H
#define KVTIER_TESTS_JSON_H

#include <cjson/cJSON.h>
#include <criterion/criterion.h>

#include "common/run.h"

/* The command's stdout as JSON; it must have exited 0. */
static inline cJSON *json_of(run_result_t *r) {
    cr_assert_eq(r->status, 0, "exit %d: %s", r->status, r->err);
    cJSON *o = cJSON_Parse(r->out);
    cr_assert_not_null(o, "not JSON: %s", r->out);
    return o;
}

static inline double num(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItem(o, k);
    cr_assert(cJSON_IsNumber(v), "field %s", k);
    return v->valuedouble;
}

/* o[k][k2] */
static inline double sub(const cJSON *o, const char *k, const char *k2) { return num(cJSON_GetObjectItem(o, k), k2); }

/* A --soak object s (kvtier replay) of at least min_passes passes that held
 * flat: samples after the first pass and the last, and from the middle of
 * the run to its end the same descriptors and threads, and kvtier's bytes
 * in use (live bytes less what the tree's node pool holds idle) no higher
 * but for the batches in flight when a sample is taken (a few KiB come and
 * go). The passes. */
static inline double soak_held_flat(const cJSON *s, double min_passes, const char *out) {
    double passes = num(s, "passes");
    cr_assert_geq(passes, min_passes, "%s", out);
    cr_assert_eq(sub(s, "first", "pass"), 1);
    cr_assert_eq(sub(s, "last", "pass"), passes);
    cr_assert_eq(sub(s, "last", "fds"), sub(s, "middle", "fds"));
    cr_assert_eq(sub(s, "last", "threads"), sub(s, "middle", "threads"));
    double use_mid = sub(s, "middle", "live_bytes") - sub(s, "middle", "pool_idle_bytes"),
           use_end = sub(s, "last", "live_bytes") - sub(s, "last", "pool_idle_bytes");
    cr_assert_leq(use_end, use_mid + 65536, "kvtier's bytes in use grew: %.0f -> %.0f", use_mid, use_end);
    return passes;
}

#endif
