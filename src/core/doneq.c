/* The queue of finished batches (doneq-int.h). */
#include "doneq-int.h"

#include <string.h>

#include "clock-int.h"

static void *batch_of(const kvt__doneq_t *q, kvt__doneq_link_t *l) { return (char *)l - q->link_off; }

void kvt__doneq_init(kvt__doneq_t *q, size_t link_off, size_t rec_off, size_t rec_size, void (*free_batch)(void *)) {
    memset(q, 0, sizeof(*q));
    q->link_off = link_off;
    q->rec_off = rec_off;
    q->rec_size = rec_size;
    q->free_batch = free_batch;
    pthread_mutex_init(&q->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&q->cv, &ca);
    pthread_condattr_destroy(&ca);
}

static void free_list(kvt__doneq_t *q, kvt__doneq_link_t *l) {
    while (l) {
        kvt__doneq_link_t *next = l->next;
        q->free_batch(batch_of(q, l));
        l = next;
    }
}

void kvt__doneq_fini(kvt__doneq_t *q) {
    free_list(q, q->head);
    free_list(q, q->retired);
    q->head = q->tail = q->retired = NULL;
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
}

void kvt__doneq_submitted(kvt__doneq_t *q) {
    pthread_mutex_lock(&q->mu);
    q->pending++;
    pthread_mutex_unlock(&q->mu);
}

void kvt__doneq_push(kvt__doneq_t *q, void *batch) {
    kvt__doneq_link_t *l = (kvt__doneq_link_t *)((char *)batch + q->link_off);
    pthread_mutex_lock(&q->mu);
    l->next = NULL;
    if (q->tail) q->tail->next = l;
    else q->head = l;
    q->tail = l;
    q->landed++;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

size_t kvt__doneq_poll(kvt__doneq_t *q, void *out, size_t max, uint64_t timeout_ns) {
    pthread_mutex_lock(&q->mu);
    free_list(q, q->retired);
    q->retired = NULL;
    if (q->head == NULL && timeout_ns > 0 && max > 0) {
        struct timespec ts = kvt__deadline(timeout_ns);
        while (q->head == NULL)
            if (pthread_cond_timedwait(&q->cv, &q->mu, &ts) != 0) break;
    }
    size_t k = 0;
    for (; k < max && q->head; k++) {
        kvt__doneq_link_t *l = q->head;
        q->head = l->next;
        if (q->head == NULL) q->tail = NULL;
        memcpy((char *)out + k * q->rec_size, (char *)batch_of(q, l) + q->rec_off, q->rec_size);
        l->next = q->retired;
        q->retired = l;
        q->pending--;
        q->landed--;
    }
    pthread_mutex_unlock(&q->mu);
    return k;
}

uint64_t kvt__doneq_pending(kvt__doneq_t *q) {
    pthread_mutex_lock(&q->mu);
    uint64_t n = q->pending;
    pthread_mutex_unlock(&q->mu);
    return n;
}

void kvt__doneq_wait_landed(kvt__doneq_t *q) {
    pthread_mutex_lock(&q->mu);
    while (q->landed < q->pending) pthread_cond_wait(&q->cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
}
