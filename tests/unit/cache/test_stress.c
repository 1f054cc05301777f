/* The data-plane stress test (tests/common/stress.h) over many seeds. */
#include <criterion/criterion.h>

#include "common/stress.h"

Test(stress, copies_in_random_order_with_faults, .timeout = 300) {
    stress_counts_t n = {0};
    char err[512];
    for (uint64_t seed = 1; seed <= 40; seed++) {
        fprintf(stderr, "stress: seed=%" PRIu64 "\n", seed);
        cr_assert_eq(stress_run(seed, 400, &n, err, sizeof(err)), 0, "%s", err);
    }
    fprintf(stderr,
            "stress: %" PRIu64 " steps, %" PRIu64 " admissions, %" PRIu64 " splits, %" PRIu64 " backups, %" PRIu64
            " loads, %" PRIu64 " failed copies, %" PRIu64 " corrupt loads refused, %" PRIu64 " corrupt copies dropped, %" PRIu64
            " evictions, %" PRIu64 " shadows reclaimed\n",
            n.steps, n.admits, n.splits, n.backups, n.loads, n.failed, n.corrupt_refused, n.corrupt_dropped, n.evicted,
            n.shadows);
    /* every kind of event the test exists for happened */
    cr_assert(n.splits > 0 && n.backups > 0 && n.loads > 0 && n.failed > 0 && n.corrupt_refused > 0 && n.corrupt_dropped > 0 && n.evicted > 0 &&
              n.shadows > 0);
}
