/* The dir backend: one file per object under a root, the embedded L3.
 *
 *   ROOT/3f/3fa2...(32 hex)          an object (payload + header)
 *   ROOT/3f/.tmp.h<host>.<pid>.<n>.<hex>  a put in progress
 *
 * Fan-out: 256 directories by the key's first byte, made when a process
 * first opens the root (make_fanout).
 * One level: two levels make 65,536 folders, which a new store's puts
 * create one or two at a time for as long as most puts land in a new
 * folder, and a mkdir costs several puts; while a create in a folder of
 * 65,536 files costs what it costs in an empty one (ext4's directories are
 * hashed), and 16 M objects are 65,536 a folder (docs/store.md has the
 * figures). A put writes a temporary file in the object's directory
 * and renames it over the final name: rename is atomic, so a reader sees the
 * old object, the new one or none, never part of one; a process that dies
 * mid-write leaves only a temporary file, which no reader opens, and which
 * an open removes: its own machine's and PID namespace's (<host>, kvt__dir_tmp_tag)
 * once its pid is gone, another's (a pid means nothing there: another
 * host on NFS, another container) once it is an hour old. Any number of
 * processes may share a root. What survives anyway (a file truncated or overwritten behind
 * our back) fails the object checks of store.c. Only a regular file is an
 * object: anything else at an object's path (a FIFO, a directory, a socket,
 * a device, a symbolic link, which is not followed) is opened non-blocking
 * and refused after an fstat, so no get waits on it, nor reads outside the
 * root; a put renames over what rename replaces (a
 * FIFO, a link) and fails, counted, on a directory it cannot.
 *
 * Capacity (max=SIZE): this process keeps an index of the objects it knows
 * (key -> the bytes the filesystem charges for the file: its blocks, at
 * least its length; in LRU order), rebuilt at open from the files' times
 * (a get sets the file's access time, so the order survives restarts); a
 * put that takes the known bytes over max evicts least recently used
 * objects (unlink) until they fit, and an object over max alone fails its
 * put (kept, it would leave the root over max); the fan-out directories
 * (made at the root's first open in the process: make_fanout) are
 * not counted.
 * One index a root and process: every store the process opens on a root
 * (the same directory, however spelled: a store for each model, a put store
 * beside a get store) shares it, so their puts count against one limit, the
 * smallest max they were opened with, and a get through one keeps an object
 * another put. With several processes on one root each enforces the limit
 * over what it has seen (its own puts and gets, and the files present at its
 * first open), so the root may exceed max by what the others wrote since.
 *
 * Cost: exists is an lstat, get an open+fstat+readv (the page straight into
 * the tier from file offset 0, page-aligned on both sides, then the header;
 * checked there) + a futimens on the first get after a put and then at
 * most once a second (written once the batch is reported: dir_after), put
 * a create+writev (the page from the tier's memory, then the header)+fstat
 * + rename, remove an unlink; the index is a hash table with O(1) updates. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "../core/clock-int.h"
#include "../core/mem-int.h"
#include "kvtier/error.h"
#include "store-int.h"

#define NIL UINT32_MAX

typedef struct ent {
    char hex[33];
    uint64_t bytes;
    uint32_t hnext, prev, next; /* hash chain; LRU list (head = most recent): the order is the time */
    uint32_t atime_s;           /* the second the file's access time was last set to; 0: not since it was written */
} ent_t;

typedef struct dirbe dirbe_t;

/* A root's index, shared by the process's stores on it (roots, below). */
typedef struct dirroot {
    struct dirroot *next; /* the registry's list */
    dev_t dev;
    ino_t ino;
    pid_t pid;
    dirbe_t *stores;      /* the stores open on it, linked by their next */
    uint64_t max;         /* the smallest nonzero max of those stores; 0: no limit */
    pthread_mutex_t mu;
    ent_t *e;
    uint32_t n, cap, free_head;
    uint32_t *bucket;
    uint32_t nbuckets;
    uint32_t head, tail, live;
    uint64_t bytes;
    _Atomic uint64_t tmpseq; /* temporary files' names: one sequence for every store writing the root */
    char tag[17];            /* kvt__dir_tmp_tag: this machine and PID namespace */
} dirroot_t;

struct dirbe {
    kvt_store_t *s;
    char root[900];
    uint64_t max; /* as this store was opened with */
    dirroot_t *r;
    dirbe_t *next; /* the root's other stores */
};

/* The process's roots, by device and inode; under roots_mu, which is taken
 * only at open and close. */
static pthread_mutex_t roots_mu = PTHREAD_MUTEX_INITIALIZER;
static dirroot_t *roots;

/* ---- the index --------------------------------------------------------------------- */

static uint32_t hash_hex(const char *hex, uint32_t nb) {
    uint32_t h = 0;
    for (int i = 0; i < 8; i++) h = h << 4 | (uint32_t)(hex[i] <= '9' ? hex[i] - '0' : hex[i] - 'a' + 10);
    return h & (nb - 1);
}

static uint32_t idx_find(dirroot_t *d, const char *hex) {
    for (uint32_t i = d->bucket[hash_hex(hex, d->nbuckets)]; i != NIL; i = d->e[i].hnext)
        if (memcmp(d->e[i].hex, hex, 32) == 0) return i;
    return NIL;
}

static void lru_unlink(dirroot_t *d, uint32_t i) {
    ent_t *x = &d->e[i];
    if (x->prev != NIL) d->e[x->prev].next = x->next;
    else d->head = x->next;
    if (x->next != NIL) d->e[x->next].prev = x->prev;
    else d->tail = x->prev;
}

static void lru_front(dirroot_t *d, uint32_t i) {
    ent_t *x = &d->e[i];
    x->prev = NIL;
    x->next = d->head;
    if (d->head != NIL) d->e[d->head].prev = i;
    d->head = i;
    if (d->tail == NIL) d->tail = i;
}

static int idx_grow(dirroot_t *d) {
    uint32_t ncap = d->cap ? d->cap * 2 : 1024;
    ent_t *ne = kvt__realloc(d->e, (size_t)d->cap * sizeof(ent_t), (size_t)ncap * sizeof(ent_t));
    if (ne == NULL) return KVT_ENOMEM;
    d->e = ne;
    d->cap = ncap;
    if (ncap > d->nbuckets) {
        uint32_t nb = ncap;
        uint32_t *b = kvt__malloc((size_t)nb * sizeof(uint32_t));
        if (b == NULL) return KVT_ENOMEM;
        for (uint32_t i = 0; i < nb; i++) b[i] = NIL;
        for (uint32_t i = 0; i < d->n; i++) {
            if (d->e[i].hex[0] == 0) continue;
            uint32_t h = hash_hex(d->e[i].hex, nb);
            d->e[i].hnext = b[h];
            b[h] = i;
        }
        kvt__free(d->bucket, (size_t)d->nbuckets * sizeof(uint32_t));
        d->bucket = b;
        d->nbuckets = nb;
    }
    return KVT_OK;
}

/* Insert or refresh (to the front); bytes updated; *slot (optional) gets
 * the entry (NIL when it could not be inserted). */
static int idx_touch(dirroot_t *d, const char *hex, uint64_t bytes, uint32_t *slot) {
    uint32_t i = idx_find(d, hex);
    if (slot) *slot = i;
    if (i != NIL) {
        d->bytes += bytes - d->e[i].bytes;
        d->e[i].bytes = bytes;
        lru_unlink(d, i);
        lru_front(d, i);
        return KVT_OK;
    }
    if (d->free_head != NIL) {
        i = d->free_head;
        d->free_head = d->e[i].hnext;
    } else {
        if (d->n == d->cap && idx_grow(d) != KVT_OK) return KVT_ENOMEM;
        i = d->n++;
    }
    ent_t *x = &d->e[i];
    memcpy(x->hex, hex, 33);
    x->bytes = bytes;
    x->atime_s = 0;
    if (slot) *slot = i;
    uint32_t h = hash_hex(hex, d->nbuckets);
    x->hnext = d->bucket[h];
    d->bucket[h] = i;
    lru_front(d, i);
    d->live++;
    d->bytes += bytes;
    return KVT_OK;
}

static void idx_drop(dirroot_t *d, const char *hex) {
    uint32_t h = hash_hex(hex, d->nbuckets), *pp = &d->bucket[h];
    while (*pp != NIL && memcmp(d->e[*pp].hex, hex, 32) != 0) pp = &d->e[*pp].hnext;
    if (*pp == NIL) return;
    uint32_t i = *pp;
    *pp = d->e[i].hnext;
    lru_unlink(d, i);
    d->bytes -= d->e[i].bytes;
    d->live--;
    d->e[i].hex[0] = 0;
    d->e[i].hnext = d->free_head;
    d->free_head = i;
}

/* ---- paths ---------------------------------------------------------------------------- */

static void obj_path(const char *root, const char *hex, char *out, size_t cap) {
    snprintf(out, cap, "%s/%.2s/%s", root, hex, hex);
}

static int mkdir_p(char *path) {
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        int rc = mkdir(path, 0755);
        *p = '/';
        if (rc != 0 && errno != EEXIST) return -1;
    }
    return mkdir(path, 0755) == 0 || errno == EEXIST ? 0 : -1;
}

static bool is_hex32(const char *n) {
    for (int i = 0; i < 32; i++)
        if (!((n[i] >= '0' && n[i] <= '9') || (n[i] >= 'a' && n[i] <= 'f'))) return false;
    return n[32] == 0;
}

/* What max= counts for a file: the blocks the filesystem charges for it
 * (an object of 1104 bytes takes 4 KiB on ext4 or tmpfs), at least its
 * length (a filesystem that stores small files inline reports none). */
static uint64_t charge(const struct stat *st) {
    uint64_t b = (uint64_t)st->st_blocks * 512;
    return b > (uint64_t)st->st_size ? b : (uint64_t)st->st_size;
}

static const char *kind_of(mode_t m) {
    return S_ISFIFO(m) ? "a FIFO" : S_ISDIR(m) ? "a directory" : S_ISSOCK(m) ? "a socket" : S_ISCHR(m) || S_ISBLK(m) ? "a device" : "not a file";
}

/* A temporary file a put left, whose writer is surely gone, is removed at
 * an open. Its pid tells only on the writer's own machine and in its own
 * PID namespace; elsewhere (another host on NFS, another container) a live
 * writer's pid may be free here, and a dead one's in use: such a file is
 * removed by its age alone, long past any put. On its own machine too the
 * age decides once it is that old (the dead writer's pid may be another
 * live process's by then). */
#define TMP_ABANDONED_S 3600

void kvt__dir_tmp_tag(char tag[17]) {
    char buf[256] = "";
    size_t n = 0;
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (f) {
        n = fread(buf, 1, 64, f);
        fclose(f);
    }
    struct stat ns;
    if (stat("/proc/self/ns/pid", &ns) == 0) {
        memcpy(buf + n, &ns.st_dev, sizeof(ns.st_dev));
        memcpy(buf + n + sizeof(ns.st_dev), &ns.st_ino, sizeof(ns.st_ino));
        n += sizeof(ns.st_dev) + sizeof(ns.st_ino);
    }
    if (gethostname(buf + n, 100) == 0) n += strnlen(buf + n, 100);
    snprintf(tag, 17, "%016llx", (unsigned long long)XXH3_64bits(buf, n));
}

typedef enum { TMP_NOT, TMP_OURS, TMP_FOREIGN } tmp_kind_t;

/* Whether n names a temporary file, and whose: ".tmp.h<tag>.<pid>.<n>.<hex>"
 * with this root's tag gives its pid; any other ".tmp." name is another
 * machine's or namespace's. (The 'h' keeps a reader that takes a pid right
 * after ".tmp." from reading one in this name.) */
static tmp_kind_t tmp_kind(const char *n, const char *tag, long *pid) {
    if (strncmp(n, ".tmp.", 5) != 0) return TMP_NOT;
    if (n[5] != 'h' || strncmp(n + 6, tag, 16) != 0 || n[22] != '.') return TMP_FOREIGN;
    char *end;
    *pid = strtol(n + 23, &end, 10);
    return *pid > 0 && *end == '.' ? TMP_OURS : TMP_FOREIGN;
}

typedef struct scanned {
    char hex[33];
    uint64_t bytes, t;
    uint32_t atime_s; /* the access time when the file was read since it was written, else 0 */
} scanned_t;

static int cmp_time(const void *a, const void *b) {
    const scanned_t *x = a, *y = b;
    return x->t < y->t ? -1 : x->t > y->t;
}

/* Rebuilds the index from the files under the root, oldest first. A
 * folder inside a fan-out folder is the two-level layout
 * (ROOT/3f/a2/<32 hex>): its objects are not read, and the open says so
 * once. */
static int scan(dirroot_t *x, const dirbe_t *d) {
    scanned_t *v = NULL;
    size_t nv = 0, cv = 0;
    int rc = KVT_OK;
    char p1[1200], p2[1500], old[1500] = "";
    DIR *r = opendir(d->root);
    if (r == NULL) return KVT_EIO;
    struct dirent *a;
    while (rc == KVT_OK && (a = readdir(r)) != NULL) {
        if (strlen(a->d_name) != 2 || a->d_name[0] == '.') continue;
        snprintf(p1, sizeof(p1), "%s/%s", d->root, a->d_name);
        DIR *s1 = opendir(p1);
        struct dirent *c;
        while (rc == KVT_OK && s1 && (c = readdir(s1)) != NULL) {
            snprintf(p2, sizeof(p2), "%s/%s", p1, c->d_name);
            long pid = 0;
            struct stat st;
            switch (tmp_kind(c->d_name, x->tag, &pid)) {
            case TMP_OURS: /* a put that died: removed once its writer is gone, or once it is too old to be
                            * a live put's (its pid may be another process's now) */
                if ((kill((pid_t)pid, 0) != 0 && errno == ESRCH) ||
                    (lstat(p2, &st) == 0 && st.st_mtim.tv_sec + TMP_ABANDONED_S < kvt__store_now(d->s).tv_sec))
                    unlink(p2);
                continue;
            case TMP_FOREIGN:
                if (lstat(p2, &st) == 0 && st.st_mtim.tv_sec + TMP_ABANDONED_S < kvt__store_now(d->s).tv_sec) unlink(p2);
                continue;
            case TMP_NOT: break;
            }
            /* lstat: a link is no object (a get does not follow it) */
            if (c->d_name[0] == '.' || lstat(p2, &st) != 0) continue;
            if (S_ISDIR(st.st_mode) && strlen(c->d_name) == 2 && old[0] == 0) snprintf(old, sizeof(old), "%s", p2);
            if (!is_hex32(c->d_name) || !S_ISREG(st.st_mode)) continue;
            if (nv == cv) {
                size_t nc = cv ? cv * 2 : 256;
                scanned_t *nvp = kvt__realloc(v, cv * sizeof(*v), nc * sizeof(*v));
                if (nvp == NULL) {
                    rc = KVT_ENOMEM;
                    break;
                }
                v = nvp;
                cv = nc;
            }
            memcpy(v[nv].hex, c->d_name, 33);
            v[nv].bytes = charge(&st);
            uint64_t ta = (uint64_t)st.st_atim.tv_sec * 1000000000ull + (uint64_t)st.st_atim.tv_nsec;
            uint64_t tm = (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec;
            v[nv].t = ta > tm ? ta : tm;
            v[nv].atime_s = ta > tm ? (uint32_t)st.st_atim.tv_sec : 0;
            nv++;
        }
        if (s1) closedir(s1);
    }
    if (old[0])
        kvt__store_log(d->s, "'%s' and folders like it hold objects of the two-level layout (ROOT/<2 hex>/<2 hex>/...): "
                             "not read (objects are ROOT/<2 hex>/<32 hex> now; remove those folders)", old);
    closedir(r);
    if (rc == KVT_OK && nv) {
        qsort(v, nv, sizeof(*v), cmp_time);
        for (size_t i = 0; i < nv && rc == KVT_OK; i++) { /* oldest first: the last touched heads the LRU list */
            uint32_t k;
            rc = idx_touch(x, v[i].hex, v[i].bytes, &k);
            if (rc == KVT_OK) x->e[k].atime_s = v[i].atime_s;
        }
    }
    kvt__free(v, cv * sizeof(*v));
    return rc;
}

static void unlink_entry(const dirbe_t *d, uint32_t i, kvt__sreq_t *req) {
    char hex[33], path[1100];
    memcpy(hex, d->r->e[i].hex, 33);
    obj_path(d->root, hex, path, sizeof(path));
    unlink(path);
    idx_drop(d->r, hex);
    if (req) req->cnt.evictions++;
}

/* Unlinks the files that alone take more than max (a file made behind our
 * back: a sparse one, an object of a store with a larger max): in LRU
 * order a recent one would go last, after every object that fits. At an
 * open, when the limit is set or lowered. Under the root's mu. */
static void evict_oversized(const dirbe_t *d) {
    dirroot_t *x = d->r;
    for (uint32_t i = x->head, next; x->max && i != NIL; i = next) {
        next = x->e[i].next;
        if (x->e[i].bytes > x->max) unlink_entry(d, i, NULL);
    }
}

/* Unlinks least recently used objects until the known bytes fit the root's
 * max (keeping `keep`, the object just written). Under the root's mu. */
static void evict(const dirbe_t *d, const char *keep, kvt__sreq_t *req) {
    dirroot_t *x = d->r;
    while (x->max && x->bytes > x->max && x->tail != NIL) {
        uint32_t i = x->tail;
        if (keep && memcmp(x->e[i].hex, keep, 32) == 0) {
            if (x->e[i].prev == NIL) break;
            i = x->e[i].prev;
        }
        unlink_entry(d, i, req);
    }
}

/* ---- open / close ---------------------------------------------------------------------- */

/* "PATH[,max=SIZE]": the path ends at the first ','; each option after it
 * is max=SIZE. KVT_EINVAL with the open error set. */
static int parse_spec(const char *spec, size_t *plen, uint64_t *max) {
    const char *comma = strchr(spec, ',');
    *plen = comma ? (size_t)(comma - spec) : strlen(spec);
    *max = 0;
    if (*plen == 0) return kvt__store_error("malformed store URL 'dir:%.200s': no path (expected dir:PATH[,max=SIZE])", spec), KVT_EINVAL;
    if (*plen >= 880) return kvt__store_error("malformed store URL: dir path longer than 879 characters"), KVT_EINVAL;
    for (const char *o = comma; o; o = strchr(o + 1, ',')) {
        const char *v = o + 1, *next = strchr(v, ','), *why = NULL;
        size_t len = next ? (size_t)(next - v) : strlen(v);
        if (len == 0) return kvt__store_error("malformed store URL 'dir:%.200s': empty option (a ',' with nothing after it)", spec), KVT_EINVAL;
        if (len < 4 || strncmp(v, "max=", 4) != 0)
            return kvt__store_error("malformed store URL 'dir:%.200s': unknown option '%.*s' (the only one is max=SIZE; a path "
                                    "holds no ',')", spec, (int)(len > 40 ? 40 : len), v),
                   KVT_EINVAL;
        if (o != comma) return kvt__store_error("malformed store URL 'dir:%.200s': max= given twice", spec), KVT_EINVAL;
        if (kvt__store_parse_size(v + 4, len - 4, max, &why) != KVT_OK)
            return kvt__store_error("malformed store URL 'dir:%.200s': bad max= '%.*s': %s", spec, (int)(len - 4 > 40 ? 40 : len - 4), v + 4, why),
                   KVT_EINVAL;
    }
    return KVT_OK;
}

static int dir_check(kvt_store_t *s, const char *spec) {
    (void)s;
    size_t plen;
    uint64_t max;
    return parse_spec(spec, &plen, &max);
}

static void root_free(dirroot_t *x) {
    pthread_mutex_destroy(&x->mu);
    kvt__free(x->e, (size_t)x->cap * sizeof(ent_t));
    kvt__free(x->bucket, (size_t)x->nbuckets * sizeof(uint32_t));
    KVT_DELETE(x);
}

/* The smallest nonzero max of the root's stores. Under roots_mu. */
static void root_limit(dirroot_t *x) {
    uint64_t m = 0;
    for (const dirbe_t *o = x->stores; o; o = o->next)
        if (o->max && (m == 0 || o->max < m)) m = o->max;
    pthread_mutex_lock(&x->mu);
    x->max = m;
    pthread_mutex_unlock(&x->mu);
}

/* The root's 256 fan-out folders, made once a process at its first open
 * rather than by the first put into each: a fresh store's first puts would
 * pay a mkdir each (docs/store.md, *dir*, has the figures). A folder that
 * cannot be made (a read-only root) is left to the put that needs it, which
 * says why. */
static void make_fanout(const char *root) {
    char path[1000];
    for (unsigned i = 0; i < 256; i++) {
        snprintf(path, sizeof(path), "%s/%02x", root, i);
        if (mkdir(path, 0755) != 0 && errno != EEXIST) return;
    }
}

/* A root's index, built from its files (scan) for its first store, d. */
static int root_new(dirroot_t **out, const dirbe_t *d, const struct stat *st) {
    dirroot_t *x = KVT_NEW(dirroot_t);
    if (x == NULL) return kvt__store_error("out of memory"), KVT_ENOMEM;
    x->dev = st->st_dev;
    x->ino = st->st_ino;
    x->pid = getpid();
    kvt__dir_tmp_tag(x->tag);
    x->head = x->tail = x->free_head = NIL;
    pthread_mutex_init(&x->mu, NULL);
    int rc = idx_grow(x);
    if (rc == KVT_OK) rc = scan(x, d);
    if (rc == KVT_OK) make_fanout(d->root);
    if (rc != KVT_OK) {
        kvt__store_error("dir store: cannot read '%s' (%s)", d->root, kvt_err_name(rc));
        root_free(x);
        return rc;
    }
    *out = x;
    return KVT_OK;
}

/* d joins its root's index, made by the first store on the root in this
 * process. A root is this process's only: a child forked after an open
 * builds its own (what it inherited may be mid-update). */
static int root_join(dirbe_t *d, const struct stat *st) {
    pthread_mutex_lock(&roots_mu);
    dirroot_t *x = roots;
    while (x && !(x->dev == st->st_dev && x->ino == st->st_ino && x->pid == getpid())) x = x->next;
    int rc = KVT_OK;
    if (x == NULL && (rc = root_new(&x, d, st)) == KVT_OK) {
        x->next = roots;
        roots = x;
    }
    if (rc == KVT_OK) {
        d->r = x;
        d->next = x->stores;
        x->stores = d;
        root_limit(x);
        pthread_mutex_lock(&x->mu);
        evict_oversized(d);
        evict(d, NULL, NULL); /* an open with a smaller max evicts down to it */
        pthread_mutex_unlock(&x->mu);
    }
    pthread_mutex_unlock(&roots_mu);
    return rc;
}

static void root_leave(dirbe_t *d) {
    dirroot_t *x = d->r;
    pthread_mutex_lock(&roots_mu);
    dirbe_t **pp = &x->stores;
    while (*pp != d) pp = &(*pp)->next;
    *pp = d->next;
    if (x->stores) {
        root_limit(x);
    } else {
        dirroot_t **rp = &roots;
        while (*rp != x) rp = &(*rp)->next;
        *rp = x->next;
        root_free(x);
    }
    pthread_mutex_unlock(&roots_mu);
}

static int dir_open(kvt_store_t *s, const char *spec, void **out) {
    size_t plen;
    uint64_t max;
    if (parse_spec(spec, &plen, &max) != KVT_OK) return KVT_EINVAL;
    dirbe_t *d = KVT_NEW(dirbe_t);
    if (d == NULL) return kvt__store_error("out of memory"), KVT_ENOMEM;
    d->s = s;
    memcpy(d->root, spec, plen);
    d->root[plen] = 0;
    while (plen > 1 && d->root[plen - 1] == '/') d->root[--plen] = 0;
    d->max = max;
    char tmp[900];
    memcpy(tmp, d->root, plen + 1);
    struct stat st;
    int rc = KVT_OK;
    char *abs = NULL;
    if (mkdir_p(tmp) != 0 || stat(d->root, &st) != 0) {
        kvt__store_error("dir store: cannot create '%s': %s", d->root, strerror(errno));
        rc = KVT_EIO;
    } else if ((abs = realpath(d->root, NULL)) == NULL || strlen(abs) >= sizeof(d->root)) {
        /* every path is built from the root: a relative one would follow the process's chdir away from
         * the tree whose identity, index and bound were taken here */
        kvt__store_error("dir store: '%s': %s", d->root, abs ? "its absolute path is too long" : strerror(errno));
        rc = abs ? KVT_EINVAL : KVT_EIO;
    } else {
        strcpy(d->root, abs); /* (it fits: checked above) */
    }
    free(abs);
    if (rc == KVT_OK) rc = root_join(d, &st);
    if (rc != KVT_OK) {
        KVT_DELETE(d);
        return rc;
    }
    *out = d;
    return KVT_OK;
}

static void dir_close(void *be) {
    dirbe_t *d = be;
    root_leave(d);
    KVT_DELETE(d);
}

/* A worker's gets keep their files open until the batch is reported, then
 * set the LRU times and close them (dir_after): an inode write less on the
 * caller's wait per get that sets one. held_files counts them over every
 * worker of the process, whose descriptors they take (open_fd). */
#define LATER_MAX 256
static atomic_size_t held_files;

typedef struct dwork {
    int fd[LATER_MAX];
    struct timespec when[LATER_MAX]; /* the access time to set: the store's clock at the get */
    size_t n;
} dwork_t;

static int dir_worker_open(void *be, void **w) {
    (void)be;
    *w = kvt__calloc(1, sizeof(dwork_t));
    return *w ? KVT_OK : KVT_ENOMEM;
}

static void dir_after(void *be, void *w) {
    (void)be;
    dwork_t *k = w;
    for (size_t i = 0; i < k->n; i++) {
        struct timespec ts[2] = {k->when[i], {0, UTIME_OMIT}};
        futimens(k->fd[i], ts);
        close(k->fd[i]);
    }
    atomic_fetch_sub(&held_files, k->n);
    k->n = 0;
}

static void dir_worker_close(void *be, void *w) {
    if (w) dir_after(be, w);
    kvt__free(w, sizeof(dwork_t));
}

static void dir_usage(void *be, uint64_t *bytes, uint64_t *objects) {
    dirroot_t *x = ((dirbe_t *)be)->r;
    pthread_mutex_lock(&x->mu);
    *bytes = x->bytes;
    *objects = x->live;
    pthread_mutex_unlock(&x->mu);
}

/* ---- the calls ------------------------------------------------------------------------- */

/* open(2). A process out of descriptors closes this worker's held files
 * and opens again; while it is still out and other workers hold files
 * (closed when their batches are reported), it waits for them, up to the
 * store's timeout_ms. The open fails when what takes the descriptors is not
 * the store's. */
static int open_fd(const kvt_store_t *s, dwork_t *w, const char *path, int flags, mode_t mode) {
    int fd = open(path, flags, mode);
    if (fd >= 0 || (errno != EMFILE && errno != ENFILE)) return fd;
    dir_after(NULL, w);
    const uint64_t until = kvt_now_ns() + (uint64_t)kvt__store_timeout_ms(s) * 1000000ull;
    for (;;) {
        fd = open(path, flags, mode);
        if (fd >= 0 || (errno != EMFILE && errno != ENFILE) || atomic_load(&held_files) == 0 || kvt_now_ns() >= until)
            return fd;
        const struct timespec pause = {0, 200000};
        nanosleep(&pause, NULL);
    }
}

static uint8_t do_put(dirbe_t *d, dwork_t *w, kvt__sreq_t *req, size_t i) {
    kvt_store_t *s = req->s;
    const char *hex = req->hex[i];
    uint64_t ob = kvt__store_object_bytes(s);
    struct iovec *v;
    size_t nv = kvt__store_put_iov(req, i, &v);
    if (nv == 0) return KVT_STORE_FAILED; /* logged */
    char dirp[1000], tmp[1100], fin[1100];
    snprintf(dirp, sizeof(dirp), "%s/%.2s", d->root, hex);
    snprintf(tmp, sizeof(tmp), "%s/.tmp.h%s.%ld.%llu.%s", dirp, d->r->tag, (long)getpid(),
             (unsigned long long)atomic_fetch_add(&d->r->tmpseq, 1), hex);
    obj_path(d->root, hex, fin, sizeof(fin));
    const int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
    int fd = open_fd(s, w, tmp, flags, 0644);
    if (fd < 0 && errno == ENOENT && mkdir_p(dirp) == 0) fd = open_fd(s, w, tmp, flags, 0644);
    if (fd < 0) {
        kvt__store_log(s, "put %s: cannot create '%s': %s", hex, tmp, strerror(errno));
        return KVT_STORE_FAILED;
    }
    int err = kvt__writev_all(fd, v, nv) != 0 ? errno : 0;
    if (err == 0 && kvt__store_clock_set(s)) { /* a stepped clock: the file's times are its, not the kernel's */
        struct timespec now = kvt__store_now(s), ts[2] = {now, now};
        if (futimens(fd, ts) != 0) err = errno;
    }
    struct stat st;
    if (err == 0 && fstat(fd, &st) != 0) err = errno;
    if (close(fd) != 0 && err == 0) err = errno;
    uint64_t max = 0;
    if (err == 0) { /* an object over max alone would evict every other and still not fit */
        pthread_mutex_lock(&d->r->mu);
        max = d->r->max;
        pthread_mutex_unlock(&d->r->mu);
        if (max && charge(&st) > max) err = EFBIG;
    }
    bool renaming = err == 0;
    if (err == 0 && rename(tmp, fin) != 0) err = errno;
    if (err) {
        unlink(tmp);
        if (err == EISDIR) /* rename replaces anything but a directory */
            kvt__store_log(s, "put %s: a directory is at '%s': not replaced", hex, fin);
        else if (err == EFBIG)
            kvt__store_log(s, "put %s: the object takes %" PRIu64 " bytes on disk, over the root's max=%" PRIu64 ": not kept",
                           hex, charge(&st), max);
        else
            kvt__store_log(s, "put %s: %s failed: %s", hex, renaming ? "rename" : "write", strerror(err));
        return KVT_STORE_FAILED;
    }
    req->cnt.bytes += ob;
    dirroot_t *x = d->r;
    pthread_mutex_lock(&x->mu);
    uint32_t k;
    if (idx_touch(x, hex, charge(&st), &k) == KVT_OK) x->e[k].atime_s = 0; /* a new file: not read since */
    evict(d, hex, req);
    pthread_mutex_unlock(&x->mu);
    return KVT_STORE_OK;
}

/* Opens what is at path for a get and fstats it: the fd, or -1 with *err.
 * O_NOATIME: the LRU time is set by the get; the kernel's own atime update
 * (relatime: the first read after a write) would be a second inode write
 * for the same get (EPERM on a file of another user: without). O_NONBLOCK:
 * a FIFO opens at once (to be refused) instead of waiting for a writer for
 * ever; a regular file's reads ignore it. O_NOFOLLOW: a link is refused
 * (ELOOP), never read through to a file outside the root. */
static int open_object(const kvt_store_t *s, dwork_t *w, const char *path, struct stat *st, int *err) {
    const int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW;
    int fd = open_fd(s, w, path, flags | O_NOATIME, 0);
    if (fd < 0 && errno == EPERM) fd = open_fd(s, w, path, flags, 0);
    if (fd >= 0 && fstat(fd, st) != 0) {
        *err = errno;
        close(fd);
        return -1;
    }
    if (fd < 0) *err = errno;
    return fd;
}

static void do_get(dirbe_t *d, dwork_t *w, kvt__sreq_t *req, size_t i) {
    const char *hex = req->hex[i];
    char path[1100];
    dirroot_t *x = d->r;
    obj_path(d->root, hex, path, sizeof(path));
    struct stat st;
    int err = 0, fd = open_object(req->s, w, path, &st, &err);
    struct stat l; /* ELOOP: the object is a link (O_NOFOLLOW), or a folder on the way loops */
    const char *odd = fd >= 0 ? (S_ISREG(st.st_mode) ? NULL : kind_of(st.st_mode))
                    : err == ENXIO ? "a socket"
                    : err == ELOOP && lstat(path, &l) == 0 && S_ISLNK(l.st_mode) ? "a symbolic link" : NULL;
    if (fd < 0 || odd) {
        bool gone = odd || err == ENOENT || err == ENOTDIR;
        if (odd) kvt__store_log(req->s, "bad object for key %s: not a regular file (%s); refused, counted as a miss", hex, odd);
        else if (err != ENOENT) kvt__store_log(req->s, "get %s: %s", hex, strerror(err));
        req->results[i] = odd ? KVT_STORE_BAD : err == ENOENT ? KVT_STORE_MISS : KVT_STORE_FAILED;
        if (fd >= 0) close(fd);
        if (gone) { /* evicted or removed, maybe by another process; or never an object. Not a file
                     * that could not be opened now (EACCES, EMFILE): it is there, and counts */
            pthread_mutex_lock(&x->mu);
            idx_drop(x, hex);
            pthread_mutex_unlock(&x->mu);
        }
        return;
    }
    /* The read says the length: one byte past an object's length is asked
     * for, so that a longer file shows as one. */
    uint64_t ob = kvt__store_object_bytes(req->s);
    uint8_t spare;
    struct iovec *v, one[2] = {{.iov_base = req->scratch, .iov_len = (size_t)ob}, {.iov_base = &spare, .iov_len = 1}};
    size_t nv = kvt__store_get_iov(req, i, &v);
    if (nv > 0) { /* a tier with addresses: read straight into the page, checked there */
        v[nv++] = one[1];
        ssize_t got = kvt__readv_all(fd, v, nv);
        kvt__store_deliver_in_place(req, i, got < 0 ? 0 : (size_t)got, got < 0 ? errno : 0);
    } else { /* through scratch, checked before a byte reaches the tier */
        ssize_t got = kvt__readv_all(fd, one, 2);
        if (got < 0) {
            kvt__store_log(req->s, "get %s: read failed: %s", hex, strerror(errno));
            req->results[i] = KVT_STORE_FAILED;
        } else {
            kvt__store_deliver(req, i, req->scratch, (size_t)got);
        }
    }
    bool set = false;
    struct timespec now = {0, 0};
    if (req->results[i] == KVT_STORE_OK) {
        /* the LRU order, for the next open: the file's access time set on
         * the first read since the object was written (as relatime would),
         * then at most once a second, which spares an inode write per get
         * of a page read again and again; the write itself once the batch
         * is reported (dir_after) */
        now = kvt__store_now(req->s);
        uint32_t now_s = (uint32_t)now.tv_sec, k;
        pthread_mutex_lock(&x->mu);
        set = idx_touch(x, hex, charge(&st), &k) != KVT_OK || x->e[k].atime_s != now_s;
        if (set && k != NIL) x->e[k].atime_s = now_s;
        pthread_mutex_unlock(&x->mu);
    }
    if (set && w->n < LATER_MAX) {
        w->fd[w->n] = fd;
        w->when[w->n++] = now;
        atomic_fetch_add(&held_files, 1);
        return;
    }
    struct timespec ts[2] = {now, {0, UTIME_OMIT}};
    if (set) futimens(fd, ts); /* more gets than the list holds: now */
    close(fd);
}

/* Only a regular file is an object (a link is not: a get does not follow
 * it); a path that cannot be looked at (EACCES, EIO), or a file this
 * process may not read, is a failure, as a get of it is, not a miss. The
 * mode bits answer for a file anyone may read (a put makes them so); else
 * the kernel is asked. */
static uint8_t dir_look(const dirbe_t *d, const char *hex) {
    char path[1100];
    struct stat st;
    obj_path(d->root, hex, path, sizeof(path));
    if (lstat(path, &st) != 0) return errno == ENOENT || errno == ENOTDIR ? KVT_STORE_MISS : KVT_STORE_FAILED;
    if (!S_ISREG(st.st_mode)) return KVT_STORE_MISS;
    return (st.st_mode & S_IROTH) || faccessat(AT_FDCWD, path, R_OK, AT_EACCESS) == 0 ? KVT_STORE_OK : KVT_STORE_FAILED;
}

static uint8_t dir_exists(void *be, const char *hex) { return dir_look(be, hex); }

static void dir_run(void *be, void *w, kvt__sreq_t *req) {
    dirbe_t *d = be;
    char path[1100];
    for (size_t i = 0; i < req->n; i++) {
        const char *hex = req->hex[i];
        switch (req->op) {
        case KVT_STORE_EXISTS: req->results[i] = dir_look(d, hex); break;
        case KVT_STORE_GET: do_get(d, w, req, i); break;
        case KVT_STORE_PUT: req->results[i] = do_put(d, w, req, i); break;
        case KVT_STORE_REMOVE:
            obj_path(d->root, hex, path, sizeof(path));
            req->results[i] = unlink(path) == 0 ? KVT_STORE_OK : errno == ENOENT ? KVT_STORE_MISS : KVT_STORE_FAILED;
            pthread_mutex_lock(&d->r->mu);
            idx_drop(d->r, hex);
            pthread_mutex_unlock(&d->r->mu);
            break;
        default: req->results[i] = KVT_STORE_FAILED;
        }
    }
}

const kvt__store_ops_t kvt__store_dir_ops = {
    .name = "dir",
    .open = dir_open,
    .check = dir_check,
    .close = dir_close,
    .worker_open = dir_worker_open,
    .worker_close = dir_worker_close,
    .run = dir_run,
    .exists_here = dir_exists,
    .after = dir_after,
    .usage = dir_usage,
};
