/* L2 `shm`: a POSIX shared-memory segment the processes of a node share.
 *
 *   /dev/shm/<name>:
 *   +-----------+--------------------------+--------------------------------+
 *   | header 4K | checksums (pages x 8 B)  | pages (geometry's layout)      |
 *   +-----------+--------------------------+--------------------------------+
 *
 * The segment is a kvtier named segment (src/core/shmseg-int.h): the creator
 * builds it under a private name, fills the header (the segment head, then
 * the geometry), locks it if asked, and only then publishes it under its
 * name with link(2), which fails if the name exists: a segment under a
 * kvtier name is therefore always complete, and two creators never both
 * win. Attachers check the head (magic, `ready`, that the creator is alive)
 * and that the geometry is theirs. The creator unlinks the name when it
 * destroys its tier, and only while the name is still its segment; attached
 * mappings stay valid until unmapped.
 *
 * Stale segments: a name that already exists is examined, not reused. If it
 * is a kvtier tier segment whose creator is dead — its pid gone, a zombie,
 * or reused by a process that started at a different time (the start time
 * from /proc/<pid>/stat is in the head) — it is replaced atomically by
 * rename(2) under flock(2) on the stale segment (info.replaced_stale). A
 * live creator's segment gives KVT_EEXIST; anything that is not a kvtier
 * tier segment is left alone (KVT_EEXIST).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "kvtier/error.h"
#include "tier-int.h"
#include "../core/mem-int.h"
#include "../core/shmseg-int.h"

#define SHM_KIND KVT__SEG_KIND_TIER
#define SHM_VERSION 2u
#define SHM_HEADER 4096u

typedef struct shm_header {
    kvt__seg_head_t seg;
    uint32_t checksum;
    uint32_t layers, layout;
    uint64_t pages, layer_bytes;
    uint64_t sums_off, data_off;
} shm_header_t;

typedef struct shm_state {
    kvt__seg_t seg;
} shm_state_t;

static shm_state_t *state(const kvt_tier_t *t) { return (shm_state_t *)t->impl; }
static shm_header_t *header(const shm_state_t *s) { return (shm_header_t *)s->seg.base; }

static uint64_t layout_total(const kvt_tier_t *t, uint64_t *sums_off, uint64_t *data_off) {
    uint64_t sums = (t->cfg.flags & KVT_TIER_CHECKSUM) ? t->cfg.geom.pages * sizeof(uint64_t) : 0;
    *sums_off = SHM_HEADER;
    *data_off = SHM_HEADER + ((sums + 4095) & ~4095ull);
    return *data_off + t->bytes;
}

/* Fills the geometry, and locks the memory before anyone can attach. */
static int init_segment(void *base, void *arg) {
    kvt_tier_t *t = arg;
    shm_header_t *h = base;
    h->checksum = (t->cfg.flags & KVT_TIER_CHECKSUM) != 0;
    h->pages = t->cfg.geom.pages;
    h->layer_bytes = t->cfg.geom.layer_bytes;
    h->layers = t->cfg.geom.layers;
    h->layout = t->cfg.geom.layout;
    layout_total(t, &h->sums_off, &h->data_off);
    if (!(t->cfg.flags & KVT_TIER_LOCK)) return KVT_OK;
    if (mlock(base, h->seg.total) != 0) return KVT_EAGAIN;
    t->info.locked = true;
    return KVT_OK;
}

static int create_segment(kvt_tier_t *t, shm_state_t *s) {
    uint64_t sums_off, data_off, total = layout_total(t, &sums_off, &data_off);
    int rc = kvt__seg_create(&s->seg, t->name, SHM_KIND, SHM_VERSION, total, init_segment, t);
    if (rc != KVT_OK) t->info.locked = false; /* the unmap dropped it */
    else t->info.replaced_stale = s->seg.replaced_stale;
    return rc;
}

static int attach_segment(kvt_tier_t *t, shm_state_t *s) {
    int rc = kvt__seg_attach(&s->seg, t->name, SHM_KIND, SHM_VERSION);
    if (rc != KVT_OK) return rc;
    const shm_header_t *h = header(s);
    uint64_t sums_off, data_off, total = layout_total(t, &sums_off, &data_off);
    if (h->pages != t->cfg.geom.pages || h->layer_bytes != t->cfg.geom.layer_bytes || h->layers != t->cfg.geom.layers ||
        h->layout != (uint32_t)t->cfg.geom.layout || h->checksum != ((t->cfg.flags & KVT_TIER_CHECKSUM) != 0) ||
        h->seg.total != total || h->sums_off != sums_off || h->data_off != data_off) { /* offsets: where pages are read and written */
        kvt__seg_close(&s->seg);
        return KVT_EINVAL;
    }
    return KVT_OK;
}

static int shm_tier_open(kvt_tier_t *t) {
    shm_state_t *s = KVT_NEW(shm_state_t);
    if (s == NULL) return KVT_ENOMEM;
    int rc = (t->cfg.flags & KVT_TIER_ATTACH) ? attach_segment(t, s) : create_segment(t, s);
    if (rc == KVT_OK && (t->cfg.flags & KVT_TIER_LOCK) && !t->info.locked) { /* an attacher locks its mapping */
        if (mlock(s->seg.base, s->seg.total) != 0) {
            kvt__seg_close(&s->seg);
            rc = KVT_EAGAIN;
        } else {
            t->info.locked = true;
        }
    }
    if (rc != KVT_OK) {
        KVT_DELETE(s);
        return rc;
    }
    /* The pages' places from this tier's own geometry, which the header was
     * found to match: the header is shared, and another process may rewrite
     * it after the check. */
    uint64_t sums_off, data_off;
    layout_total(t, &sums_off, &data_off);
    t->impl = s;
    t->base = (uint8_t *)s->seg.base + data_off;
    t->sums = (t->cfg.flags & KVT_TIER_CHECKSUM) ? (uint64_t *)((uint8_t *)s->seg.base + sums_off) : NULL;
    t->info.creator = s->seg.creator;
    return KVT_OK;
}

static void shm_tier_close(kvt_tier_t *t) {
    shm_state_t *s = state(t);
    if (t->info.locked) munlock(s->seg.base, s->seg.total);
    kvt__seg_close(&s->seg); /* the creator unlinks its own segment */
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
