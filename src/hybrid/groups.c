/* The hybrid cache's pure parts: the match rule (hybrid.h) over any
 * residency, and the configuration's checks and default split. */
#include <string.h>

#include "kvtier/alloc.h"
#include "kvtier/error.h"
#include "hybrid-int.h"

#define G KVT_MODEL_MAX_GROUPS

/* ---- the match rule ------------------------------------------------------------ */

uint64_t kvt__hybrid_first_needed(const kvt_layer_group_t *g, uint32_t P, uint64_t n) {
    uint64_t end = n * P;
    return end > g->window ? (end - g->window) / P : 0;
}

/* The longest n <= m, and why it is shorter than m (the first check that
 * failed at m's level). have(g, i): window page i, or a checkpoint after i
 * pages, is present. Each window page is asked about at most once per n
 * reached from above, and a page found absent bounds n at once. */
uint64_t kvt__hybrid_longest(const kvt_layer_group_t *groups, uint32_t ngroups, uint32_t P, uint64_t m,
                             kvt__hybrid_have_fn have, void *ctx, uint32_t *why) {
    uint64_t n = m;
    *why = SHORT_NONE;
    while (n > 0) {
        int ok = 1;
        for (uint32_t g = 0; g < ngroups && ok; g++) {
            if (groups[g].kind != KVT_GROUP_WINDOW) continue;
            for (uint64_t i = n; i-- > kvt__hybrid_first_needed(&groups[g], P, n);)
                if (!have(ctx, g, i)) { /* every n' > i needs page i: n' <= i */
                    n = i;
                    ok = 0;
                    if (*why == SHORT_NONE) *why = SHORT_WINDOW;
                    break;
                }
        }
        if (!ok) continue;
        for (uint32_t g = 0; g < ngroups && ok; g++)
            if (groups[g].kind == KVT_GROUP_STATE && !have(ctx, g, n)) {
                n--;
                ok = 0;
                if (*why == SHORT_NONE) *why = SHORT_STATE;
            }
        if (ok) break;
    }
    return n;
}

typedef struct {
    const kvt_layer_group_t *groups;
    const uint8_t *const *present;
} arrays_t;

static int have_array(void *ctx, uint32_t g, uint64_t i) {
    const arrays_t *a = ctx;
    return a->present[g] && a->present[g][i] != 0;
}

uint64_t kvt_hybrid_longest(const kvt_layer_group_t *groups, uint32_t ngroups, uint32_t page_tokens, uint64_t m,
                            const uint8_t *const *present) {
    if (groups == NULL || present == NULL || page_tokens == 0 || ngroups > G) return 0;
    arrays_t a = {groups, present};
    uint32_t why;
    return kvt__hybrid_longest(groups, ngroups, page_tokens, m, have_array, &a, &why);
}

/* ---- config -------------------------------------------------------------------- */

static int groups_ok(const kvt_layer_group_t *g, uint32_t n) {
    if (g == NULL || n == 0 || n > G) return 0;
    uint32_t full = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (g[i].kind >= KVT_GROUP_KIND_COUNT_ || g[i].layers == 0 || g[i].bytes == 0 || g[i].reserved_ != 0) return 0;
        if ((g[i].kind == KVT_GROUP_WINDOW) != (g[i].window != 0)) return 0;
        full += g[i].kind == KVT_GROUP_FULL;
    }
    return full > 0;
}

uint64_t kvt__hybrid_slot_bytes(const kvt_layer_group_t *g, uint32_t P) {
    uint64_t b;
    if (g->kind == KVT_GROUP_STATE) return g->bytes;
    return __builtin_mul_overflow(g->bytes, (uint64_t)P, &b) ? UINT64_MAX : b;
}

uint64_t kvt_hybrid_piece_bytes(const kvt_layer_group_t *g, uint32_t page_tokens) {
    return g == NULL || g->kind == KVT_GROUP_FULL ? 0 : kvt__hybrid_slot_bytes(g, page_tokens);
}


/* Splits one tier's bytes (kvt_hybrid_config_split); the full groups get one
 * radix page count. */
static int split(const kvt_layer_group_t *g, uint32_t n, uint32_t P, uint64_t bytes, double state_share,
                 double window_weight, uint64_t *full_pages, uint64_t *slots) {
    double state_w = 0, token_w = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (g[i].kind == KVT_GROUP_STATE) state_w += (double)g[i].bytes;
        else token_w += (double)g[i].bytes * (g[i].kind == KVT_GROUP_WINDOW ? window_weight : 1.0);
    }
    double token_share = state_w > 0 ? 1 - state_share : 1.0, b = (double)bytes;
    /* the full groups' share, fb / token_w of the per-token bytes, in pages of fb x P bytes */
    double f = b * token_share / (token_w * P);
    if (f < 1) return KVT_EINVAL;
    *full_pages = f > KVT_ALLOC_MAX_PAGES ? KVT_ALLOC_MAX_PAGES : (uint64_t)f; /* (clamped before the cast) */
    for (uint32_t i = 0; i < n; i++) {
        slots[i] = 0;
        if (g[i].kind == KVT_GROUP_FULL) continue;
        double share = g[i].kind == KVT_GROUP_STATE ? (1 - token_share) * (double)g[i].bytes / state_w
                                                    : token_share * window_weight * (double)g[i].bytes / token_w;
        double s = b * share / (double)kvt__hybrid_slot_bytes(&g[i], P);
        if (s < 1) return KVT_EINVAL;
        slots[i] = s > KVT_ALLOC_MAX_PAGES ? KVT_ALLOC_MAX_PAGES : (uint64_t)s;
    }
    return KVT_OK;
}

int kvt_hybrid_config_split_tier(kvt_hybrid_config_t *cfg, uint32_t tier, uint64_t bytes, double state_share,
                                 double window_weight) {
    if (cfg == NULL || !groups_ok(cfg->groups, cfg->ngroups) || tier < 1 || tier > 3 || (tier == 1 && bytes == 0) ||
        !(state_share > 0 && state_share < 1) || !(window_weight > 0 && window_weight <= 16))
        return KVT_EINVAL;
    kvt_hybrid_config_t c = *cfg;
    uint32_t P = c.cache.page_tokens ? c.cache.page_tokens : 16;
    uint64_t *pages = tier == 1 ? &c.cache.l1_pages : tier == 2 ? &c.cache.l2_pages : &c.cache.l3_pages;
    uint64_t *slots = tier == 1 ? c.l1_slots : tier == 2 ? c.l2_slots : c.l3_slots;
    *pages = 0;
    memset(slots, 0, sizeof(c.l1_slots));
    if (bytes && split(c.groups, c.ngroups, P, bytes, state_share, window_weight, pages, slots) != KVT_OK)
        return KVT_EINVAL;
    if (c.cache.l3_pages && !c.cache.l2_pages) return KVT_EINVAL; /* an L3 needs an L2 */
    *cfg = c;
    return KVT_OK;
}

int kvt_hybrid_config_split(kvt_hybrid_config_t *cfg, uint64_t l1_bytes, uint64_t l2_bytes, uint64_t l3_bytes,
                            double state_share, double window_weight) {
    if (cfg == NULL || (l3_bytes && !l2_bytes)) return KVT_EINVAL;
    kvt_hybrid_config_t c = *cfg;
    c.cache.l3_pages = 0; /* the old L3 would refuse an L2 of 0 bytes, split before the new L3 is */
    const uint64_t bytes[3] = {l1_bytes, l2_bytes, l3_bytes};
    for (uint32_t t = 1; t <= 3; t++)
        if (kvt_hybrid_config_split_tier(&c, t, bytes[t - 1], state_share, window_weight) != KVT_OK) return KVT_EINVAL;
    *cfg = c;
    return KVT_OK;
}

int kvt_hybrid_config_default(kvt_hybrid_config_t *cfg, const kvt_layer_group_t *groups, uint32_t ngroups,
                              uint32_t page_tokens, uint64_t l1_bytes, uint64_t l2_bytes, uint64_t l3_bytes) {
    if (cfg == NULL || !groups_ok(groups, ngroups) || page_tokens == 0 || page_tokens > (1u << 20) || l1_bytes == 0)
        return KVT_EINVAL; /* (page_tokens: the cache's range, kvt_cache_config_check) */
    kvt_hybrid_config_t c;
    memset(&c, 0, sizeof(c));
    c.size = sizeof(c);
    c.ngroups = ngroups;
    memcpy(c.groups, groups, ngroups * sizeof(*groups));
    kvt_cache_config_default(&c.cache);
    c.cache.page_tokens = page_tokens;
    double ww = l3_bytes ? KVT_HYBRID_WINDOW_WEIGHT_OVER_L3 : KVT_HYBRID_WINDOW_WEIGHT;
    if (kvt_hybrid_config_split(&c, l1_bytes, l2_bytes, l3_bytes, KVT_HYBRID_STATE_SHARE, ww) != KVT_OK ||
        (l3_bytes && kvt_hybrid_config_split_tier(&c, 3, l3_bytes, KVT_HYBRID_STATE_SHARE, KVT_HYBRID_L3_WINDOW_WEIGHT)))
        return KVT_EINVAL;
    c.checkpoint_every = 0;
    c.checkpoint_ends = true;
    c.checkpoint_branches = true;
    *cfg = c;
    return KVT_OK;
}

int kvt__hybrid_config_ok(const kvt_hybrid_config_t *c) {
    if (!groups_ok(c->groups, c->ngroups)) return 0;
    if (c->cache.write_policy == KVT_WRITE_THROUGH_SELECTIVE ||
        (c->cache.l3_pages && c->cache.l3_write_policy == KVT_WRITE_THROUGH_SELECTIVE))
        return 0;
    if (c->async_moves && !c->moves) return 0; /* nothing to report without moves */
    uint32_t P = c->cache.page_tokens ? c->cache.page_tokens : 16;
    uint64_t pages = c->cache.l1_pages > c->cache.l2_pages ? c->cache.l1_pages : c->cache.l2_pages, bytes;
    if (c->cache.l3_pages > pages) pages = c->cache.l3_pages;
    const uint64_t *slots[3] = {c->l1_slots, c->l2_slots, c->l3_slots};
    uint64_t tier_bytes[3] = {0, 0, 0};
    for (uint32_t g = 0; g < G; g++) {
        int full = g >= c->ngroups || c->groups[g].kind == KVT_GROUP_FULL;
        if (full && (c->l1_slots[g] | c->l2_slots[g] | c->l3_slots[g])) return 0;
        /* a page or slot, and each tier's bytes over every group, in 64 bits (the byte counters
         * would wrap) */
        uint64_t one = g < c->ngroups ? kvt__hybrid_slot_bytes(&c->groups[g], P) : 0;
        if (one == UINT64_MAX) return 0;
        for (int t = 0; t < 3 && g < c->ngroups; t++)
            if (__builtin_mul_overflow(one, full ? pages : slots[t][g], &bytes) ||
                __builtin_add_overflow(tier_bytes[t], bytes, &tier_bytes[t]))
                return 0;
        if (full) continue;
        if (c->l1_slots[g] == 0 || (c->l2_slots[g] != 0) != (c->cache.l2_pages != 0) ||
            (c->l3_slots[g] != 0) != (c->cache.l3_pages != 0))
            return 0;
    }
    return 1;
}

