/* Named shared-memory segments (src/core/shmseg-int.h has the protocol). */
#include "shmseg-int.h"

#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvtier/error.h"

/* Field 3 (state) and 22 (starttime) of /proc/<pid>/stat; false when unreadable. */
static bool proc_stat(int pid, char *state, uint64_t *start) {
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) return false;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    if (p == NULL || p[1] != ' ') return false;
    *state = p[2];
    unsigned long long v = 0;
    int field = 2;
    for (char *s = p + 1; *s && field < 22; s++)
        if (*s == ' ' && ++field == 22) sscanf(s + 1, "%llu", &v);
    *start = v;
    return true;
}

uint64_t kvt__proc_start(int pid) {
    char state;
    uint64_t start;
    return proc_stat(pid, &state, &start) ? start : 0;
}

bool kvt__proc_alive(int pid, uint64_t start) {
    if (pid <= 0) return false;
    if (kill(pid, 0) != 0 && errno == ESRCH) return false;
    char state;
    uint64_t now;
    if (!proc_stat(pid, &state, &now)) return true; /* cannot tell: assume it runs */
    if (state == 'Z' || state == 'X') return false;
    return start == 0 || now == 0 || now == start;
}

static bool name_ok(const char *name) {
    size_t n = name ? strlen(name) : 0;
    return n >= 2 && n <= KVT__SEG_NAME_MAX && name[0] == '/' && strchr(name + 1, '/') == NULL;
}

/* Whether the file open at fd is a finished kvtier segment (a regular file
 * with its head, ready); its kind and creator to *kind, *pid, *start. */
static bool finished_segment(int fd, uint32_t *kind, int32_t *pid, uint64_t *start) {
    struct stat sb;
    bool finished = false;
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && (size_t)sb.st_size >= sizeof(kvt__seg_head_t)) {
        kvt__seg_head_t *h = mmap(NULL, sizeof(*h), PROT_READ, MAP_SHARED, fd, 0);
        if (h != MAP_FAILED) {
            finished = h->magic == KVT__SEG_MAGIC && atomic_load_explicit(&h->ready, memory_order_acquire) == 1;
            *kind = h->kind, *pid = h->creator_pid, *start = h->creator_start;
            munmap(h, sizeof(*h));
        }
    }
    return finished;
}

/* Whether the segment open at fd is a finished kvtier segment of this kind
 * whose creator is dead. */
static bool stale_fd(int fd, uint32_t kind) {
    uint32_t k;
    int32_t pid;
    uint64_t start;
    return finished_segment(fd, &k, &pid, &start) && k == kind && !kvt__proc_alive(pid, start);
}

/* Runs act on the segment at name while holding flock on it and after
 * checking that the name still refers to the locked file. 1 when act ran
 * and returned true, 0 when the segment is not stale, -1 when the name
 * vanished or changed meanwhile (try again), -2 on another error. */
static int under_lock(const char *path, uint32_t kind, bool (*act)(const char *path, void *arg), void *arg) {
    /* /dev/shm is everyone's: a FIFO under the name would block an open
     * without O_NONBLOCK for ever, a link lead elsewhere; neither is a
     * segment (0: not stale, left alone). */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    if (fd < 0) return errno == ENOENT ? -1 : errno == ELOOP ? 0 : -2;
    struct stat held, named;
    int rc = -2;
    if (fstat(fd, &held) == 0 && !S_ISREG(held.st_mode)) rc = 0;
    else if (flock(fd, LOCK_EX) == 0 && fstat(fd, &held) == 0) {
        if (stat(path, &named) != 0 || named.st_ino != held.st_ino) rc = -1;
        else if (!stale_fd(fd, kind)) rc = 0;
        else rc = act(path, arg) ? 1 : -2;
    }
    close(fd); /* drops the lock */
    return rc;
}

static bool rename_over(const char *path, void *from) { return rename((const char *)from, path) == 0; }
static bool unlink_it(const char *path, void *unused) {
    (void)unused;
    return unlink(path) == 0;
}

/* Publishes the finished segment at tmp under name: link(2), or rename(2)
 * over a stale segment. Of two processes replacing the same stale segment,
 * the second finds the first one's live segment and gets KVT_EEXIST. */
static int publish(kvt__seg_t *s, const char *tmp, uint32_t kind) {
    char from[160], to[160];
    snprintf(from, sizeof(from), "/dev/shm%s", tmp);
    snprintf(to, sizeof(to), "/dev/shm%s", s->name);
    for (int attempt = 0; attempt < 4; attempt++) {
        if (link(from, to) == 0) return KVT_OK;
        if (errno != EEXIST) return KVT_EIO;
        int rc = under_lock(to, kind, rename_over, from);
        if (rc == 1) {
            s->replaced_stale = true;
            return KVT_OK;
        }
        if (rc == 0) return KVT_EEXIST;
        if (rc == -2) return KVT_EIO;
    }
    return KVT_EEXIST;
}

/* Whether the file at path is a finished segment whose creator runs: a
 * segment whose name only looks like a temporary one (a tier suffix may be
 * "a.9.tmp"). FIFOs and links are not opened through (false). */
static bool live_segment(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    if (fd < 0) return false;
    uint32_t kind;
    int32_t pid;
    uint64_t start;
    bool live = finished_segment(fd, &kind, &pid, &start) && kvt__proc_alive(pid, start);
    close(fd);
    return live;
}

/* Removes name's unfinished segments (<name>.<pid>[.<n>].tmp) whose creator is
 * gone: one killed between shm_open and link leaves one, which holds its
 * memory until removed. A pid that runs again (another process took its
 * number) keeps its file: it may be that process's. So does a finished
 * segment whose creator runs, named so by its user. Returns how many. */
static int remove_dead_tmps(const char *name) {
    DIR *d = opendir("/dev/shm");
    if (d == NULL) return 0;
    size_t len = strlen(name + 1);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        const char *f = e->d_name, *dot = f + len;
        if (strncmp(f, name + 1, len) != 0 || *dot != '.') continue;
        char *end;
        long pid = strtol(dot + 1, &end, 10);
        if (end == dot + 1 || pid <= 0 || pid > INT32_MAX) continue;
        if (*end == '.' && end[1] >= '0' && end[1] <= '9') (void)strtoul(end + 1, &end, 10); /* .<n>, or none */
        if (strcmp(end, ".tmp") != 0) continue;
        char path[sizeof(e->d_name) + 16];
        snprintf(path, sizeof(path), "/dev/shm/%s", f);
        if (kill((pid_t)pid, 0) != 0 && errno == ESRCH && !live_segment(path)) n += unlink(path) == 0;
    }
    closedir(d);
    return n;
}

int kvt__seg_create(kvt__seg_t *s, const char *name, uint32_t kind, uint32_t version, uint64_t total,
                    int (*init)(void *base, void *arg), void *arg) {
    if (!name_ok(name) || total < sizeof(kvt__seg_head_t)) return KVT_EINVAL;
    *s = (kvt__seg_t){0};
    snprintf(s->name, sizeof(s->name), "%s", name);
    /* The temporary name is this call's alone (two threads may create one
     * name at once: each publishes its own file, and one gets KVT_EEXIST). */
    static _Atomic unsigned calls;
    char tmp[128];
    snprintf(tmp, sizeof(tmp), "%s.%d.%u.tmp", name, (int)getpid(), atomic_fetch_add(&calls, 1));
    remove_dead_tmps(name);
    int fd = shm_open(tmp, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 && errno == EEXIST) { /* a leftover of a dead process that had our pid: no call of ours has this name */
        shm_unlink(tmp);
        fd = shm_open(tmp, O_RDWR | O_CREAT | O_EXCL, 0600);
    }
    if (fd < 0) return KVT_EIO;
    struct stat sb;
    int rc = KVT_ENOMEM;
    /* The pages are given now: /dev/shm's sizing (a container's 64 MiB) refuses them here, not with a SIGBUS
     * at the first write past its room, in the middle of serving. */
    if (ftruncate(fd, (off_t)total) == 0 && posix_fallocate(fd, 0, (off_t)total) == 0 && fstat(fd, &sb) == 0) {
        void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p != MAP_FAILED) s->base = p, s->total = total, s->ino = sb.st_ino, rc = KVT_OK;
    }
    close(fd);
    if (rc == KVT_OK) {
        kvt__seg_head_t *h = s->base;
        h->magic = KVT__SEG_MAGIC;
        h->kind = kind;
        h->version = version;
        h->creator_pid = (int32_t)getpid();
        h->creator_start = kvt__proc_start(getpid());
        h->total = total;
        if (init) rc = init(s->base, arg);
        if (rc == KVT_OK) {
            atomic_store_explicit(&h->ready, 1, memory_order_release);
            rc = publish(s, tmp, kind);
        }
        if (rc != KVT_OK) munmap(s->base, s->total); /* also drops an mlock init made */
    }
    shm_unlink(tmp);
    if (rc != KVT_OK) {
        *s = (kvt__seg_t){0};
        return rc;
    }
    s->creator = true;
    return KVT_OK;
}

int kvt__seg_attach(kvt__seg_t *s, const char *name, uint32_t kind, uint32_t version) {
    if (!name_ok(name)) return KVT_EINVAL;
    *s = (kvt__seg_t){0};
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) return errno == ENOENT ? KVT_ENOENT : KVT_EIO;
    struct stat sb;
    int rc = fstat(fd, &sb) == 0 && (size_t)sb.st_size >= sizeof(kvt__seg_head_t) ? KVT_OK : KVT_ENOENT;
    void *p = MAP_FAILED;
    if (rc == KVT_OK && (p = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED)
        rc = KVT_ENOMEM;
    close(fd);
    if (rc != KVT_OK) return rc;
    kvt__seg_head_t *h = p;
    if (h->magic != KVT__SEG_MAGIC || h->kind != kind || atomic_load_explicit(&h->ready, memory_order_acquire) != 1 ||
        h->total != (uint64_t)sb.st_size || !kvt__proc_alive(h->creator_pid, h->creator_start))
        rc = KVT_ENOENT;
    else if (h->version != version)
        rc = KVT_EINVAL;
    if (rc != KVT_OK) {
        munmap(p, (size_t)sb.st_size);
        return rc;
    }
    s->base = p;
    s->total = (uint64_t)sb.st_size;
    snprintf(s->name, sizeof(s->name), "%s", name);
    return KVT_OK;
}

void kvt__seg_close(kvt__seg_t *s) {
    if (s->base == NULL) return;
    munmap(s->base, s->total);
    char path[128];
    struct stat sb;
    snprintf(path, sizeof(path), "/dev/shm%s", s->name);
    if (s->creator && stat(path, &sb) == 0 && sb.st_ino == s->ino) shm_unlink(s->name);
    *s = (kvt__seg_t){0};
}

int kvt__seg_remove_stale(const char *name, uint32_t kind) {
    if (!name_ok(name)) return 0;
    char path[128];
    snprintf(path, sizeof(path), "/dev/shm%s", name);
    int n = remove_dead_tmps(name);
    for (int attempt = 0; attempt < 4; attempt++) {
        int rc = under_lock(path, kind, unlink_it, NULL);
        if (rc != -1) return n + (rc == 1);
    }
    return n;
}
