/* L2 `shm`: a POSIX shared-memory segment the processes of a node share.
 *
 *   /dev/shm/<name>:
 *   +-----------+--------------------------+--------------------------------+
 *   | header 4K | checksums (pages x 8 B)  | pages (geometry's layout)      |
 *   +-----------+--------------------------+--------------------------------+
 *
 * The creator builds the segment under a private name (<name>.<pid>.tmp),
 * fills the header, sets `ready` (release), locks it if asked, and only then
 * publishes it under its name with link(2), which fails if the name exists:
 * a segment under a kvtier name is therefore always complete, and two
 * creators never both win. (A creator killed before publishing leaves its
 * .tmp name behind; the next creator with that pid removes it.) Attachers check magic, `ready` (acquire), that the creator is alive
 * and the geometry is theirs. The creator unlinks the name when it destroys
 * its tier; attached mappings stay valid until unmapped.
 *
 * Stale segments: a name that already exists is examined, not reused. If it
 * is a kvtier segment whose creator is dead — its pid gone, or reused by a
 * process that started at a different time (the start time from
 * /proc/<pid>/stat is in the header) — it is replaced atomically by
 * rename(2) under flock(2) on the stale segment (info.replaced_stale); the
 * creator's destroy unlinks the name only while it is still its segment. A live creator's segment gives KVT_EEXIST; anything
 * that is not a kvtier segment is left alone (KVT_EEXIST).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvtier/error.h"
#include "tier-int.h"
#include "../core/mem-int.h"

#define SHM_MAGIC 0x6b76746965727331ull /* "kvtiers1" */
#define SHM_HEADER 4096u

typedef struct shm_header {
    uint64_t magic;
    uint32_t version;
    _Atomic uint32_t ready;
    int32_t creator_pid;
    uint32_t checksum;
    uint64_t creator_start; /* /proc/<pid>/stat field 22 */
    uint64_t pages, layer_bytes;
    uint32_t layers, layout;
    uint64_t sums_off, data_off, total;
} shm_header_t;

typedef struct shm_state {
    shm_header_t *hdr;
    uint64_t total;
    bool creator;
    ino_t ino; /* the creator's segment: the name is unlinked only while it is still this one */
} shm_state_t;

static shm_state_t *state(const kvt_tier_t *t) { return (shm_state_t *)t->impl; }

/* The start time of a process (clock ticks since boot), 0 when unknown. */
static uint64_t proc_start(int pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    if (p == NULL) return 0;
    unsigned long long v = 0;
    /* fields after the name: 3 state ... 22 starttime */
    int field = 2;
    for (char *s = p + 1; *s && field < 22; s++)
        if (*s == ' ') {
            field++;
            if (field == 22) sscanf(s + 1, "%llu", &v);
        }
    return v;
}

static bool alive(int pid, uint64_t start) {
    if (pid <= 0) return false;
    if (kill(pid, 0) != 0 && errno == ESRCH) return false;
    uint64_t now = proc_start(pid);
    return start == 0 || now == 0 || now == start;
}

static uint64_t layout_total(const kvt_tier_t *t, uint64_t *sums_off, uint64_t *data_off) {
    uint64_t sums = (t->cfg.flags & KVT_TIER_CHECKSUM) ? t->cfg.geom.pages * sizeof(uint64_t) : 0;
    *sums_off = SHM_HEADER;
    *data_off = SHM_HEADER + ((sums + 4095) & ~4095ull);
    return *data_off + t->bytes;
}

/* Whether the segment open at fd is a dead creator's kvtier segment (1), or
 * live or not kvtier's (0). */
static int stale_fd(int fd) {
    struct stat sb;
    int verdict = 0;
    if (fstat(fd, &sb) == 0 && (size_t)sb.st_size >= SHM_HEADER) {
        shm_header_t *h = mmap(NULL, sizeof(shm_header_t), PROT_READ, MAP_SHARED, fd, 0);
        if (h != MAP_FAILED) {
            if (h->magic == SHM_MAGIC && atomic_load_explicit(&h->ready, memory_order_acquire) == 1)
                verdict = !alive(h->creator_pid, h->creator_start);
            munmap(h, sizeof(shm_header_t));
        }
    }
    return verdict;
}

/* Publishes the finished segment tmp under name. A stale segment there is
 * replaced with rename(2) while holding flock on it, after checking the name
 * still refers to the locked segment: of two processes replacing the same
 * stale segment, the second finds the first one's live segment and gets
 * KVT_EEXIST. */
static int publish(kvt_tier_t *t, const char *tmp) {
    char from[128], to[128];
    snprintf(from, sizeof(from), "/dev/shm%s", tmp);
    snprintf(to, sizeof(to), "/dev/shm%s", t->name);
    for (int attempt = 0; attempt < 4; attempt++) {
        if (link(from, to) == 0) return KVT_OK;
        if (errno != EEXIST) return KVT_EIO;
        int fd = open(to, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue; /* gone meanwhile: link again */
        struct stat held, named;
        int rc = KVT_EIO;
        bool again = false;
        if (flock(fd, LOCK_EX) == 0 && fstat(fd, &held) == 0) {
            if (stat(to, &named) != 0 || named.st_ino != held.st_ino) again = true; /* replaced meanwhile */
            else if (!stale_fd(fd)) rc = KVT_EEXIST;
            else if (rename(from, to) == 0) rc = KVT_OK, t->info.replaced_stale = true;
        }
        close(fd); /* drops the lock */
        if (!again) return rc;
    }
    return KVT_EEXIST;
}

static int map_fd(int fd, uint64_t total, shm_state_t *s) {
    void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return KVT_ENOMEM;
    s->hdr = p;
    s->total = total;
    return KVT_OK;
}

static int create_segment(kvt_tier_t *t, shm_state_t *s) {
    uint64_t sums_off, data_off, total = layout_total(t, &sums_off, &data_off);
    char tmp[96];
    snprintf(tmp, sizeof(tmp), "%s.%d.tmp", t->name, (int)getpid());
    shm_unlink(tmp); /* a leftover of a dead process that had our pid */
    int fd = shm_open(tmp, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) return KVT_EIO;
    struct stat sb;
    int rc = ftruncate(fd, (off_t)total) == 0 && fstat(fd, &sb) == 0 ? map_fd(fd, total, s) : KVT_ENOMEM;
    if (rc == KVT_OK) s->ino = sb.st_ino;
    close(fd);
    if (rc != KVT_OK) {
        shm_unlink(tmp);
        return rc;
    }
    shm_header_t *h = s->hdr;
    h->magic = SHM_MAGIC;
    h->version = 1;
    h->creator_pid = (int32_t)getpid();
    h->creator_start = proc_start(getpid());
    h->checksum = (t->cfg.flags & KVT_TIER_CHECKSUM) != 0;
    h->pages = t->cfg.geom.pages;
    h->layer_bytes = t->cfg.geom.layer_bytes;
    h->layers = t->cfg.geom.layers;
    h->layout = t->cfg.geom.layout;
    h->sums_off = sums_off;
    h->data_off = data_off;
    h->total = total;
    atomic_store_explicit(&h->ready, 1, memory_order_release);
    if ((t->cfg.flags & KVT_TIER_LOCK) && mlock(s->hdr, s->total) != 0) rc = KVT_EAGAIN; /* before anyone can attach */
    else if (t->cfg.flags & KVT_TIER_LOCK) t->info.locked = true;
    if (rc == KVT_OK) rc = publish(t, tmp);
    shm_unlink(tmp);
    if (rc != KVT_OK) {
        if (t->info.locked) munlock(s->hdr, s->total);
        t->info.locked = false;
        munmap(s->hdr, s->total);
        return rc;
    }
    s->creator = true;
    return KVT_OK;
}

static int attach_segment(kvt_tier_t *t, shm_state_t *s) {
    int fd = shm_open(t->name, O_RDWR, 0);
    if (fd < 0) return errno == ENOENT ? KVT_ENOENT : KVT_EIO;
    struct stat sb;
    int rc = KVT_OK;
    if (fstat(fd, &sb) != 0 || (size_t)sb.st_size < SHM_HEADER) rc = KVT_ENOENT;
    if (rc == KVT_OK) rc = map_fd(fd, (uint64_t)sb.st_size, s);
    close(fd);
    if (rc != KVT_OK) return rc;
    shm_header_t *h = s->hdr;
    uint64_t sums_off, data_off, total = layout_total(t, &sums_off, &data_off);
    if (h->magic != SHM_MAGIC || atomic_load_explicit(&h->ready, memory_order_acquire) != 1 ||
        !alive(h->creator_pid, h->creator_start))
        rc = KVT_ENOENT;
    else if (h->pages != t->cfg.geom.pages || h->layer_bytes != t->cfg.geom.layer_bytes ||
             h->layers != t->cfg.geom.layers || h->layout != (uint32_t)t->cfg.geom.layout ||
             h->checksum != ((t->cfg.flags & KVT_TIER_CHECKSUM) != 0) || h->total != total ||
             (uint64_t)sb.st_size != total)
        rc = KVT_EINVAL;
    if (rc != KVT_OK) munmap(s->hdr, s->total);
    return rc;
}

static int shm_tier_open(kvt_tier_t *t) {
    shm_state_t *s = KVT_NEW(shm_state_t);
    if (s == NULL) return KVT_ENOMEM;
    int rc = (t->cfg.flags & KVT_TIER_ATTACH) ? attach_segment(t, s) : create_segment(t, s);
    if (rc == KVT_OK && (t->cfg.flags & KVT_TIER_LOCK) && !t->info.locked) { /* an attacher locks its mapping */
        if (mlock(s->hdr, s->total) != 0) {
            munmap(s->hdr, s->total);
            rc = KVT_EAGAIN;
        } else {
            t->info.locked = true;
        }
    }
    if (rc != KVT_OK) {
        KVT_DELETE(s);
        return rc;
    }
    t->impl = s;
    t->base = (uint8_t *)s->hdr + s->hdr->data_off;
    t->sums = s->hdr->checksum ? (uint64_t *)((uint8_t *)s->hdr + s->hdr->sums_off) : NULL;
    t->info.creator = s->creator;
    return KVT_OK;
}

static void shm_tier_close(kvt_tier_t *t) {
    shm_state_t *s = state(t);
    if (t->info.locked) munlock(s->hdr, s->total);
    munmap(s->hdr, s->total);
    char path[128];
    struct stat sb;
    snprintf(path, sizeof(path), "/dev/shm%s", t->name);
    if (s->creator && stat(path, &sb) == 0 && sb.st_ino == s->ino) shm_unlink(t->name);
    KVT_DELETE(s);
}

const kvt__tier_ops_t kvt__tier_shm_ops = {
    .name = "shm",
    .host_visible = true,
    .open = shm_tier_open,
    .close = shm_tier_close,
    .write = kvt__host_write,
    .read = kvt__host_read,
};
