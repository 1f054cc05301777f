/* Writes to a socket whose peer is gone raise SIGPIPE, whose default action
 * ends the process. kvtier's own sockets send with MSG_NOSIGNAL; hiredis
 * writes with write(2), so the threads that talk to Redis hold SIGPIPE
 * blocked while they do: the write then fails with EPIPE (hiredis reports
 * the connection lost, the store reconnects), and a SIGPIPE that the write
 * left pending is taken off again before the thread's mask is restored, so
 * the caller's own handling of SIGPIPE (none, SIG_IGN, a handler) never sees
 * one of ours. (Found by the soak: CLIENT KILL on the Redis L3 ended the
 * replay with SIGPIPE.) */
#ifndef KVTIER_SIGPIPE_INT_H
#define KVTIER_SIGPIPE_INT_H

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <time.h>

typedef struct kvt__sigpipe {
    sigset_t old;     /* the thread's mask before */
    bool was_pending; /* a SIGPIPE was pending already: not ours to take */
} kvt__sigpipe_t;

static inline sigset_t kvt__sigpipe_set(void) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    return set;
}

static inline bool kvt__sigpipe_pending(void) {
    sigset_t pend;
    sigemptyset(&pend);
    return sigpending(&pend) == 0 && sigismember(&pend, SIGPIPE) == 1;
}

static inline void kvt__sigpipe_hold(kvt__sigpipe_t *h) {
    sigset_t set = kvt__sigpipe_set();
    h->was_pending = kvt__sigpipe_pending();
    pthread_sigmask(SIG_BLOCK, &set, &h->old);
}

/* Takes a SIGPIPE our writes left pending (while held). */
static inline void kvt__sigpipe_drain(const kvt__sigpipe_t *h) {
    if (h->was_pending || !kvt__sigpipe_pending()) return;
    sigset_t set = kvt__sigpipe_set();
    struct timespec zero = {0, 0};
    (void)sigtimedwait(&set, NULL, &zero);
}

static inline void kvt__sigpipe_release(kvt__sigpipe_t *h) {
    kvt__sigpipe_drain(h);
    pthread_sigmask(SIG_SETMASK, &h->old, NULL);
}

#endif
