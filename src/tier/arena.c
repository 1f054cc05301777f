/* L1 `arena`: host memory standing in for GPU memory, so the whole stack
 * (eviction, backups, loads, integrity) runs on any machine. An anonymous
 * mapping; copies are memcpy. */
#include <string.h>

#include "kvtier/error.h"
#include "tier-int.h"

static int arena_open(kvt_tier_t *t) {
    t->base = kvt__map_anon(t->bytes, false, t->cfg.flags & KVT_TIER_SHARED, &t->info);
    return t->base ? KVT_OK : KVT_ENOMEM;
}

static void arena_close(kvt_tier_t *t) { kvt__unmap(t->base, t->bytes); }

const kvt__tier_ops_t kvt__tier_arena_ops = {
    .name = "arena",
    .host_visible = true,
    .open = arena_open,
    .close = arena_close,
    .write = kvt__host_write,
    .read = kvt__host_read,
};
