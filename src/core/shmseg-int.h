/* Named POSIX shared-memory segments that are complete before they are
 * visible, replaced when their creator is dead, and unlinked only by their
 * creator: what the shm tier (src/tier/shm.c) and the CP group's control
 * segment (src/cp/group.c) are built on.
 *
 *   /dev/shm/<name>:
 *   +---------------------------------------+--------------------------------+
 *   | kvt__seg_head_t: magic, kind, ready,  | what the kind puts there       |
 *   | creator pid + start time, total bytes | (filled by init before ready)  |
 *   +---------------------------------------+--------------------------------+
 *
 *   create:  shm_open(<name>.<pid>.<n>.tmp, O_EXCL) -> ftruncate -> mmap
 *            -> head + init(base) -> ready = 1 (release)
 *            -> link(tmp, name)          fails if the name exists: then
 *               the segment there is examined under flock(2):
 *                 a kvtier segment of this kind whose creator is dead
 *                 (pid gone, a zombie, or a pid reused by a process that
 *                 started at another time)  -> replaced by rename(2)
 *                 anything else (a live creator's segment, a foreign file,
 *                 another kind)             -> KVT_EEXIST, left alone
 *            -> unlink(tmp)
 *   attach:  map the whole file; magic, kind, ready (acquire), creator alive,
 *            size = total, else KVT_ENOENT (not there yet, or stale)
 *   close:   unmap; the creator unlinks the name only while it still names
 *            the inode it created (a replacement by a later creator, or a
 *            foreign file put there since, is never removed)
 *
 * A creator killed between shm_open and link leaves its .tmp name; the next
 * creator of that name, and kvt__seg_remove_stale, remove it once its pid
 * runs no process.
 */
#ifndef KVTIER_SHMSEG_INT_H
#define KVTIER_SHMSEG_INT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define KVT__SEG_MAGIC 0x6b76747365673031ull /* "kvtseg01" */
#define KVT__SEG_NAME_MAX 80                 /* "/name", without the .<pid>.<n>.tmp suffix */
/* The kinds of segment (kvt__seg_head_t.kind). */
#define KVT__SEG_KIND_TIER 0x74696572u /* "tier": an shm tier (src/tier/shm.c) */
#define KVT__SEG_KIND_CP 0x63706772u   /* "cpgr": a CP group's control segment (src/cp/group.c) */

/* The first bytes of every kvtier segment. */
typedef struct kvt__seg_head {
    uint64_t magic;          /* KVT__SEG_MAGIC */
    uint32_t kind;           /* what follows: a tag of its owner */
    _Atomic uint32_t ready;  /* 1 once complete */
    int32_t creator_pid;
    uint32_t version;        /* of what follows */
    uint64_t creator_start;  /* /proc/<pid>/stat field 22 */
    uint64_t total;          /* bytes of the segment */
} kvt__seg_head_t;

typedef struct kvt__seg {
    void *base;              /* the mapping; starts with the head */
    uint64_t total;
    bool creator;
    bool replaced_stale;     /* create: a dead creator's segment was replaced */
    ino_t ino;               /* the creator's inode */
    char name[KVT__SEG_NAME_MAX + 1];
} kvt__seg_t;

/* Creates segment name ("/x", at most KVT__SEG_NAME_MAX bytes) of total
 * bytes (>= sizeof(kvt__seg_head_t)). init(base, arg), optional, fills what
 * follows the head before anyone can see it; its error fails the create.
 * KVT_EEXIST (a live creator's segment, or not a kvtier segment of this
 * kind: left alone), KVT_EINVAL (bad name), KVT_ENOMEM, KVT_EIO, or init's
 * error; nothing is left behind on failure. */
int kvt__seg_create(kvt__seg_t *s, const char *name, uint32_t kind, uint32_t version, uint64_t total,
                    int (*init)(void *base, void *arg), void *arg);
/* Maps an existing segment of this kind. KVT_ENOENT: no such name, not a
 * finished kvtier segment of this kind, or its creator is dead; KVT_EINVAL
 * (bad name, or another version); KVT_ENOMEM; nothing mapped on failure. */
int kvt__seg_attach(kvt__seg_t *s, const char *name, uint32_t kind, uint32_t version);
/* Unmaps; the creator unlinks the name if it still names its segment. */
void kvt__seg_close(kvt__seg_t *s);
/* Unlinks name if it holds a finished kvtier segment of this kind whose
 * creator is dead (what a launcher does after its group crashed), and the
 * unfinished ones of creators gone (<name>.<pid>[.<n>].tmp). How many removed (0:
 * absent, live, or not kvtier's). */
int kvt__seg_remove_stale(const char *name, uint32_t kind);

/* The start time of a process (clock ticks since boot), 0 when unknown. */
uint64_t kvt__proc_start(int pid);
/* Whether the process pid that started at start (0: unknown) still runs;
 * a zombie does not. */
bool kvt__proc_alive(int pid, uint64_t start);

#endif
