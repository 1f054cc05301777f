/* The Criterion suites' main: Criterion's own, plus a default timeout for
 * every test that sets none (as libuv's runner has), so that a test that
 * hangs fails on its own instead of holding the run until CI kills it.
 * KVTIER_TEST_TIMEOUT (seconds, 300 unless set; 0: none) is the default, as
 * for the python suite. Criterion 2.4's --timeout cannot serve: it applies
 * only to tests that already have a timeout of their own.
 *
 * Criterion 2.4's runner process leaks 48 bytes when it runs workers in
 * parallel, which would fail every sanitized run; a suppression cannot single
 * it out (every test's stack passes through libcriterion), so the runner
 * checks no leaks and its workers, each a test (BoxFort names its shared map
 * in their BXFI_MAP), check theirs. */
#include <criterion/criterion.h>
#include <criterion/internal/ordered-set.h>
#include <stdlib.h>

int __lsan_is_turned_off(void);
int __lsan_is_turned_off(void) { return getenv("BXFI_MAP") == NULL; }

static double default_timeout(void) {
    const char *s = getenv("KVTIER_TEST_TIMEOUT");
    char *end = NULL;
    double t = s && *s ? strtod(s, &end) : 300;
    return s && *s && (*end != '\0' || !(t >= 0)) ? 300 : t;
}

static void set_timeouts(struct criterion_suite_set *suite, double t) {
    if (suite->suite.data && suite->suite.data->timeout > 0) return; /* the suite's own default */
    FOREACH_SET(struct criterion_test *test, suite->tests) {
        if (test->data && test->data->timeout == 0) test->data->timeout = t;
    }
}

int main(int argc, char *argv[]) {
    struct criterion_test_set *tests = criterion_initialize();
    double t = default_timeout();
    if (t > 0) {
        FOREACH_SET(struct criterion_suite_set *suite, tests->suites) { set_timeouts(suite, t); }
    }
    int result = 0;
    if (criterion_handle_args(argc, argv, true)) result = !criterion_run_all_tests(tests);
    criterion_finalize(tests);
    return result;
}
