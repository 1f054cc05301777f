/* The done queue (core/doneq-int.h) against what its contract says: records
 * handed out in the order pushed, a batch freed by the poll after the one
 * that handed it out (or by fini), the counts of pending and landed batches,
 * a poll that waits for a push from another thread, and one that times out. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/doneq-int.h"
#include "kvtier/rng.h"

typedef struct rec {
    uint64_t id, tag;
} rec_t;

typedef struct batch {
    uint32_t pad; /* the link and record anywhere in a batch */
    kvt__doneq_link_t link;
    rec_t rec;
} batch_t;

#define MAXB 4096
static int freed[MAXB]; /* times each batch was freed */

static void free_batch(void *p) {
    batch_t *b = p;
    freed[b->rec.id]++;
    free(b);
}

static batch_t *make(uint64_t id) {
    batch_t *b = calloc(1, sizeof(*b));
    cr_assert(b);
    b->rec = (rec_t){id, id * 7 + 1};
    return b;
}

static void init(kvt__doneq_t *q) {
    memset(freed, 0, sizeof(freed));
    kvt__doneq_init(q, offsetof(batch_t, link), offsetof(batch_t, rec), sizeof(rec_t), free_batch);
}

/* Random submits, pushes (a batch with a worker is pushed in any order) and
 * polls, against lists of ids: pushed order, handed out, retired. */
Test(doneq, against_lists_of_ids) {
    kvt_rng_t rng;
    kvt_rng_seed(&rng, 11);
    kvt__doneq_t q;
    init(&q);
    uint64_t with_worker[MAXB], nw = 0, queued[MAXB], qh = 0, qt = 0, last_out[MAXB], nlast = 0, next = 0;
    for (int step = 0; step < 20000; step++) {
        int what = (int)kvt_rng_below(&rng, 3);
        if (what == 0 && next < MAXB) { /* submit */
            kvt__doneq_submitted(&q);
            with_worker[nw++] = next++;
        } else if (what == 1 && nw > 0) { /* a worker finishes one, any of them */
            size_t i = (size_t)kvt_rng_below(&rng, nw);
            uint64_t id = with_worker[i];
            with_worker[i] = with_worker[--nw];
            kvt__doneq_push(&q, make(id));
            queued[qt++] = id;
        } else { /* poll up to max */
            size_t max = (size_t)kvt_rng_below(&rng, 5);
            rec_t out[4];
            size_t k = kvt__doneq_poll(&q, out, max, 0);
            for (size_t j = 0; j < nlast; j++)
                cr_assert_eq(freed[last_out[j]], 1, "batch %" PRIu64 " handed out is freed by the next poll", last_out[j]);
            size_t want = qt - qh < max ? qt - qh : max;
            cr_assert_eq(k, want);
            nlast = 0;
            for (size_t j = 0; j < k; j++) {
                cr_assert_eq(out[j].id, queued[qh], "records in the order pushed");
                cr_assert_eq(out[j].tag, queued[qh] * 7 + 1);
                cr_assert_eq(freed[queued[qh]], 0, "not freed while its record may be read");
                last_out[nlast++] = queued[qh++];
            }
        }
        cr_assert_eq(kvt__doneq_pending(&q), nw + (qt - qh), "pending: with a worker or queued");
        cr_assert_eq(q.landed, qt - qh);
    }
    while (nw > 0) kvt__doneq_push(&q, make(with_worker[--nw]));
    kvt__doneq_fini(&q);
    for (uint64_t id = 0; id < next; id++) cr_assert_eq(freed[id], 1, "batch %" PRIu64 " freed once", id);
}

static void *push_later(void *arg) {
    kvt__doneq_t *q = arg;
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    kvt__doneq_push(q, make(5));
    return NULL;
}

Test(doneq, a_poll_waits_for_a_push_and_times_out_without_one) {
    kvt__doneq_t q;
    init(&q);
    rec_t out[2];
    cr_assert_eq(kvt__doneq_poll(&q, out, 2, 1000 * 1000), 0, "nothing pushed: empty after the timeout");
    kvt__doneq_submitted(&q);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, push_later, &q), 0);
    cr_assert_eq(kvt__doneq_poll(&q, out, 2, UINT64_MAX), 1, "woken by the push");
    cr_assert_eq(out[0].id, 5);
    pthread_join(th, NULL);
    cr_assert_eq(kvt__doneq_pending(&q), 0);
    kvt__doneq_submitted(&q);
    cr_assert_eq(pthread_create(&th, NULL, push_later, &q), 0);
    kvt__doneq_wait_landed(&q); /* returns once the push is in */
    cr_assert_eq(q.landed, 1);
    pthread_join(th, NULL);
    kvt__doneq_fini(&q);
    cr_assert_eq(freed[5], 2, "both batches freed: the polled one by fini, the landed one too");
}
