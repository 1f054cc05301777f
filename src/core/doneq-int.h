/* Internal: the queue of finished batches between an engine's workers and
 * its poll — the transfer engine's (xfer.c) and the store's (store.c).
 *
 * A batch carries a link and a record (the kvt_xfer_done_t or
 * kvt_store_done_t its poll hands out) at fixed offsets. It is counted when
 * submitted, pushed by the worker that finishes it, and handed out in the
 * order pushed: a poll copies up to max records out and keeps their batches
 * on a retired list until the next poll frees them, so that the pointers in
 * a record (pages, results, copies) stay valid until then.
 *
 * Invariants (under mu): every batch pushed and not yet polled is on the
 * list from head; `pending` counts batches submitted and not yet polled,
 * `landed` those of them pushed (pending - landed are still with a worker).
 * The wait uses the monotonic clock (clock-int.h). */
#ifndef KVTIER_CORE_DONEQ_INT_H
#define KVTIER_CORE_DONEQ_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvt__doneq_link {
    struct kvt__doneq_link *next;
} kvt__doneq_link_t;

typedef struct kvt__doneq {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* a push (monotonic clock) */
    kvt__doneq_link_t *head, *tail, *retired;
    uint64_t pending, landed;
    size_t link_off, rec_off, rec_size; /* where in a batch its link and record are; the record's size */
    void (*free_batch)(void *batch);
} kvt__doneq_t;

/* A queue of batches whose link is at link_off and record (rec_size bytes)
 * at rec_off, freed by free_batch. */
void kvt__doneq_init(kvt__doneq_t *q, size_t link_off, size_t rec_off, size_t rec_size, void (*free_batch)(void *));
/* Frees every batch still on the queue or retired, and the queue's lock.
 * The caller has stopped its workers. */
void kvt__doneq_fini(kvt__doneq_t *q);
/* A batch submitted: counted before a worker can see it. */
void kvt__doneq_submitted(kvt__doneq_t *q);
/* A batch finished: on the queue, and a waiting poll woken. */
void kvt__doneq_push(kvt__doneq_t *q, void *batch);
/* Frees the batches the previous poll handed out, then copies up to max
 * records into out (an array of records), waiting up to timeout_ns for the
 * first when none is there (0: no wait). Returns how many. */
size_t kvt__doneq_poll(kvt__doneq_t *q, void *out, size_t max, uint64_t timeout_ns);
/* Batches submitted and not yet polled. */
uint64_t kvt__doneq_pending(kvt__doneq_t *q);
/* Waits until every batch submitted has been pushed. */
void kvt__doneq_wait_landed(kvt__doneq_t *q);

#endif
