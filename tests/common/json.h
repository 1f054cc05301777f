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

#endif
