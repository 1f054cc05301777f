/* L2 `host`: private host memory for the host tier.
 *
 * An anonymous mapping. With KVT_TIER_HUGE it first asks for explicit huge
 * pages (MAP_HUGETLB, 2 MiB; only when the administrator reserved some), then
 * falls back to plain pages advised for transparent huge pages. With
 * KVT_TIER_LOCK the mapping is mlock'ed (resident, never swapped: what DMA
 * wants); a refusal is an error, not a silent downgrade. The per-page
 * checksums, when asked for, live in a second small mapping.
 */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#include "kvtier/error.h"
#include "tier-int.h"

#define HUGE_2M (2ull << 20)

void *kvt__map_anon(size_t len, bool huge, bool shared, kvt_tier_info_t *info) {
    void *p = MAP_FAILED;
    int share = shared ? MAP_SHARED : MAP_PRIVATE;
#ifdef MAP_HUGETLB
    if (huge && len % HUGE_2M == 0) {
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, share | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
        if (p != MAP_FAILED) info->huge_pages = true;
    }
#endif
    if (p == MAP_FAILED) p = mmap(NULL, len, PROT_READ | PROT_WRITE, share | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    if (huge && !info->huge_pages && madvise(p, len, MADV_HUGEPAGE) == 0) info->thp_advised = true;
#endif
    return p;
}

void kvt__unmap(void *p, size_t len) {
    if (p) munmap(p, len);
}

static size_t sums_bytes(const kvt_tier_t *t) { return t->cfg.geom.pages * sizeof(uint64_t); }

static int host_open(kvt_tier_t *t) {
    t->base = kvt__map_anon(t->bytes, t->cfg.flags & KVT_TIER_HUGE, false, &t->info);
    if (t->base == NULL) return KVT_ENOMEM;
    if (t->cfg.flags & KVT_TIER_CHECKSUM) {
        kvt_tier_info_t unused = {0};
        t->sums = kvt__map_anon(sums_bytes(t), false, false, &unused);
        if (t->sums == NULL) {
            kvt__unmap(t->base, t->bytes);
            return KVT_ENOMEM;
        }
    }
    if (t->cfg.flags & KVT_TIER_LOCK) {
        if (mlock(t->base, t->bytes) != 0) {
            kvt__unmap(t->sums, sums_bytes(t));
            kvt__unmap(t->base, t->bytes);
            return KVT_EAGAIN;
        }
        t->info.locked = true;
    }
    return KVT_OK;
}

static void host_close(kvt_tier_t *t) {
    if (t->info.locked) munlock(t->base, t->bytes);
    kvt__unmap(t->sums, sums_bytes(t));
    kvt__unmap(t->base, t->bytes);
}

const kvt__tier_ops_t kvt__tier_host_ops = {
    .name = "host",
    .host_visible = true,
    .open = host_open,
    .close = host_close,
    .write = kvt__host_write,
    .read = kvt__host_read,
};
