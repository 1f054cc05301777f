/* The data-plane stress test as a plain program, for ThreadSanitizer
 * (Criterion's runner does not start under TSan: Snaipe/Criterion#274).
 *
 *   tsan-stress [SEEDS [STEPS]]     exit 0 when every seed passes */
#include "common/stress.h"

int main(int argc, char **argv) {
    uint64_t seeds = argc > 1 ? strtoull(argv[1], NULL, 10) : 12;
    int steps = argc > 2 ? atoi(argv[2]) : 300;
    stress_counts_t n = {0};
    char err[512];
    for (uint64_t seed = 1; seed <= seeds; seed++) {
        if (stress_run(seed, steps, &n, err, sizeof(err)) != 0) {
            fprintf(stderr, "tsan-stress: FAILED: %s\n", err);
            return 1;
        }
    }
    printf("tsan-stress: %" PRIu64 " seeds x %d steps passed: %" PRIu64 " backups, %" PRIu64 " loads, %" PRIu64
           " failed copies, %" PRIu64 " corrupt loads refused\n",
           seeds, steps, n.backups, n.loads, n.failed, n.corrupt_refused);
    return 0;
}
