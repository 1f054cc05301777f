/* The layering of README.md's Layout, checked from the sources'
 * #include lines by scripts/check-layers: no module uses one above it, tier
 * and net form no cycle (tier uses the socket layer, net uses tier through
 * its public header only), and the command includes public headers only (it
 * is built without -I src). A planted edge makes it fail. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/run.h"

Test(layers, the_library_includes_only_downwards, .timeout = 60) {
    run_result_t r = run_argv((const char *const[]){KVT_SOURCE_DIR "/scripts/check-layers", "--tools", NULL});
    cr_assert_eq(r.status, 0, "%s%s", r.out, r.err);
    cr_assert(strstr(r.out, "check-layers: 0 refused edge(s)"), "%s", r.out);
    run_free(&r);
}

/* The checker can fail: a copy of the tree with tier including net's internals. */
Test(layers, a_planted_upward_edge_is_refused, .timeout = 60) {
    char dir[] = "/tmp/kvt-layers-XXXXXX", cmd[1024];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(cmd, sizeof(cmd),
             "set -e; mkdir -p '%s/scripts' '%s/src'; cp '%s/scripts/check-layers' '%s/scripts/'; cp -r '%s/src/.' '%s/src/'; "
             "echo '#include \"../net/net-int.h\"' >> '%s/src/tier/tier.c'; '%s/scripts/check-layers' || echo \"exit $?\"; rm -rf '%s'",
             dir, dir, KVT_SOURCE_DIR, dir, KVT_SOURCE_DIR, dir, dir, dir, dir);
    run_result_t r = run_argv((const char *const[]){"/bin/sh", "-c", cmd, NULL});
    cr_assert(strstr(r.out, "tier -> net internals (../net/net-int.h)"), "%s%s", r.out, r.err);
    cr_assert(strstr(r.out, "exit 1"), "%s", r.out);
    run_free(&r);
}

/* No library module may include the testing library's header: its hooks
 * stay out of libkvtier (a planted include in the transfer engine). */
Test(layers, the_library_including_the_testing_header_is_refused, .timeout = 60) {
    char dir[] = "/tmp/kvt-layers-XXXXXX", cmd[1024];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(cmd, sizeof(cmd),
             "set -e; mkdir -p '%s/scripts' '%s/src'; cp '%s/scripts/check-layers' '%s/scripts/'; cp -r '%s/src/.' '%s/src/'; "
             "echo '#include \"kvtier/testing.h\"' >> '%s/src/xfer/xfer.c'; '%s/scripts/check-layers' || echo \"exit $?\"; rm -rf '%s'",
             dir, dir, KVT_SOURCE_DIR, dir, KVT_SOURCE_DIR, dir, dir, dir, dir);
    run_result_t r = run_argv((const char *const[]){"/bin/sh", "-c", cmd, NULL});
    cr_assert(strstr(r.out, "xfer -> testing (kvtier/testing.h)"), "%s%s", r.out, r.err);
    cr_assert(strstr(r.out, "exit 1"), "%s", r.out);
    run_free(&r);
}
