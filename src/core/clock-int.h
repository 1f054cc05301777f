/* Internal: waiting on the library's clock (kvt_now_ns, CLOCK_MONOTONIC).
 * Condition variables that wait with a deadline are created on the
 * monotonic clock (pthread_condattr_setclock), and the deadline comes from
 * here, so a wall-clock step never shortens or stretches a poll. */
#ifndef KVTIER_CORE_CLOCK_INT_H
#define KVTIER_CORE_CLOCK_INT_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "kvtier/stats.h"

/* The absolute CLOCK_MONOTONIC time timeout_ns from now, capped so that a
 * huge timeout (UINT64_MAX: "for ever") cannot overflow. */
static inline struct timespec kvt__deadline(uint64_t timeout_ns) {
    uint64_t now = kvt_now_ns(), cap = UINT64_MAX / 2;
    uint64_t until = timeout_ns > cap - now ? cap : now + timeout_ns;
    return (struct timespec){.tv_sec = (time_t)(until / 1000000000ull), .tv_nsec = (long)(until % 1000000000ull)};
}

#endif
