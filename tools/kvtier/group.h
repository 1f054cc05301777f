/* Process groups of the kvtier command (cp, pd): forked children watched by
 * the coordinator, which stops the whole group when one dies or when it is
 * itself signalled, so that it can always clean up after them. */
#ifndef KVTIER_TOOLS_GROUP_H
#define KVTIER_TOOLS_GROUP_H

#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct child {
    pid_t pid;
    int status;
    bool exited;
} child_t;

/* SIGINT, SIGTERM, SIGHUP to the coordinator are noted (group_watch acts on
 * them) instead of killing it; a child (right after fork) puts the defaults
 * back and asks for SIGTERM when the coordinator dies, however it dies. */
void group_catch_signals(void);
void group_child_signals(void);

/* Waits for the n children. The first to die abnormally stops the group,
 * grace_ns later (time for the others to notice, report it and finish what
 * does not need the dead one): *stop is set, the others get SIGTERM, and
 * SIGKILL two seconds after that. Returns the
 * index of the first that died (*why: its wait status), -2 when a signal
 * stopped the coordinator (*why: the signal), or -1. revive (optional) may
 * replace a child that died (it updates ch[idx] and returns true); the group
 * then goes on. */
int group_watch(child_t *ch, uint32_t n, _Atomic int *stop, int *why, uint64_t grace_ns,
                bool (*revive)(void *arg, uint32_t idx, int status), void *arg);

#endif
