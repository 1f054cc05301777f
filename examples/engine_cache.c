/* A cache whose L1 is the engine's own KV memory: an SGLang-style pool,
 * per layer a K buffer and a V buffer of [slots, heads, head_dim] that the
 * "engine" (this program) allocated and keeps owning. kvtier describes it as
 * an engine tier (two planes), backs its pages up to a host L2 tier, and
 * loads them back into the engine's buffers when a prefix returns. The
 * engine's forward pass is stood in for by writing each new page's K and V
 * from its page hash; after reuse every byte of the reused pages is compared
 * with what the forward pass wrote.
 *
 *   cc engine_cache.c $(pkg-config --cflags --libs kvtier) -o engine_cache
 *
 * The calls for one request, in order: kvt_cache_admit (match, lock, load
 * the L2 part into the engine's pages, allocate the rest), the forward pass
 * writes the new pages, kvt_cache_commit (their KV is real: write_through
 * backs them up), kvt_cache_release (the pages stay cached), and
 * kvt_cache_poll between steps (completions of copies in flight). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kvtier/kvtier.h>

#define LAYERS 4
#define PAGE 16 /* tokens (slots) per page */
#define HEADS 2
#define K_DIM 64
#define V_DIM 32 /* V's head dim may differ from K's */
#define ESZ 2    /* bf16 */
#define SLOTS (PAGE * 64)
#define KP (PAGE * HEADS * K_DIM * ESZ) /* K bytes of one page in one layer */
#define VP (PAGE * HEADS * V_DIM * ESZ)

/* What the forward pass writes into page `slot_page` of layer l for the page
 * whose hash is h: a byte function of (h, layer, plane, offset). */
static unsigned char kv_byte(kvt_hash128_t h, int l, int plane, size_t off) {
    uint64_t x = h.lo ^ (h.hi << 1) ^ ((uint64_t)l << 56) ^ ((uint64_t)plane << 48) ^ off;
    x ^= x >> 31;
    x *= 0x9e3779b97f4a7c15ull;
    return (unsigned char)(x >> 56);
}

static unsigned char *k_buf[LAYERS], *v_buf[LAYERS]; /* the engine's pool */

static void forward(uint32_t page, kvt_hash128_t h) {
    for (int l = 0; l < LAYERS; l++) {
        for (size_t i = 0; i < KP; i++) k_buf[l][(size_t)page * KP + i] = kv_byte(h, l, 0, i);
        for (size_t i = 0; i < VP; i++) v_buf[l][(size_t)page * VP + i] = kv_byte(h, l, 1, i);
    }
}

static int same(uint32_t page, kvt_hash128_t h) {
    for (int l = 0; l < LAYERS; l++) {
        for (size_t i = 0; i < KP; i++)
            if (k_buf[l][(size_t)page * KP + i] != kv_byte(h, l, 0, i)) return 0;
        for (size_t i = 0; i < VP; i++)
            if (v_buf[l][(size_t)page * VP + i] != kv_byte(h, l, 1, i)) return 0;
    }
    return 1;
}

static int fail(const char *what, int rc) {
    fprintf(stderr, "engine_cache: %s: %s\n", what, kvt_strerror(rc));
    return 1;
}

int main(void) {
    for (int l = 0; l < LAYERS; l++) {
        k_buf[l] = calloc(SLOTS, HEADS * K_DIM * ESZ);
        v_buf[l] = calloc(SLOTS, HEADS * V_DIM * ESZ);
        if (!k_buf[l] || !v_buf[l]) return fail("engine pool", KVT_ENOMEM);
    }
    void *kp[LAYERS], *vp[LAYERS];
    for (int l = 0; l < LAYERS; l++) kp[l] = k_buf[l], vp[l] = v_buf[l];
    kvt_tier_engine_t pool = {
        .size = sizeof(pool),
        .planes = 2,
        .plane = {{.layer_base = kp, .piece_bytes = KP, .page_stride = KP},
                  {.layer_base = vp, .piece_bytes = VP, .page_stride = VP}},
        .device = false, /* a GPU engine says true and passes device pointers */
    };
    uint64_t pages = SLOTS / PAGE;
    kvt_tier_config_t t1 = {.size = sizeof(t1), .kind = KVT_TIER_ENGINE, .name = "sglang-pool", .engine = &pool,
                            .geom = {pages, LAYERS, 0, KVT_LAYOUT_PAGE_FIRST}};
    kvt_tier_config_t t2 = {.size = sizeof(t2), .kind = KVT_TIER_HOST, .name = "l2", .flags = KVT_TIER_CHECKSUM,
                            .geom = {4 * pages, LAYERS, KP + VP, KVT_LAYOUT_PAGE_FIRST}};
    kvt_tier_t *l1 = NULL, *l2 = NULL;
    int rc;
    if ((rc = kvt_tier_create(&l1, &t1)) != KVT_OK) return fail("engine tier", rc);
    if ((rc = kvt_tier_create(&l2, &t2)) != KVT_OK) return fail("host tier", rc);
    kvt_xfer_config_t xc;
    kvt_xfer_config_default(&xc);
    kvt_xfer_t *x = NULL;
    kvt_tier_t *tiers[2] = {l1, l2};
    if ((rc = kvt_xfer_create(&x, &xc, tiers, 2)) != KVT_OK) return fail("transfer engine", rc);
    kvt_cache_config_t cc;
    kvt_cache_config_default(&cc);
    cc.page_tokens = PAGE;
    cc.l1_pages = pages;
    cc.l2_pages = 4 * pages;
    kvt_cache_t *c = NULL;
    if ((rc = kvt_cache_create(&c, &cc)) != KVT_OK) return fail("cache", rc);
    if ((rc = kvt_cache_attach(c, x, l1, 0, l2, 1)) != KVT_OK) return fail("attach", rc);

    enum { NPAGES = 12, NTOK = NPAGES * PAGE };
    int32_t tok[NTOK];
    uint32_t ids[NPAGES];
    kvt_hash128_t h[NPAGES];
    uint64_t reused = 0, from_l2 = 0, wrong = 0;
    for (int round = 0; round < 2; round++)
        for (int r = 0; r < 10; r++) { /* 10 prompts of 12 pages: more than the pool's 64 pages hold */
            for (int i = 0; i < NTOK; i++) tok[i] = r * 1000 + i;
            kvt_cache_req_t req;
            if ((rc = kvt_cache_admit(c, 0, tok, NTOK, 0, ids, &req)) != KVT_OK) return fail("admit", rc);
            kvt_page_hash_chain(0, tok, req.pages, PAGE, h);
            uint64_t hit = req.l1_hit_pages + req.l2_hit_pages;
            for (uint64_t j = 0; j < hit; j++) wrong += !same(ids[j], h[j]); /* reused KV, as the engine reads it */
            for (uint64_t j = hit; j < req.pages; j++) forward(ids[j], h[j]);
            kvt_cache_commit(c, &req);
            kvt_cache_release(c, &req);
            kvt_cache_poll(c);
            reused += hit;
            from_l2 += req.l2_hit_pages;
        }
    kvt_cache_sync(c);
    kvt_cache_destroy(c);
    kvt_xfer_destroy(x);
    kvt_tier_destroy(l2);
    kvt_tier_destroy(l1); /* the pool is still the engine's */
    printf("engine_cache: %llu pages reused (%llu loaded back into the engine's pool), %llu wrong\n",
           (unsigned long long)reused, (unsigned long long)from_l2, (unsigned long long)wrong);
    for (int l = 0; l < LAYERS; l++) free(k_buf[l]), free(v_buf[l]);
    if (wrong || from_l2 == 0) return 1;
    puts("ok");
    return 0;
}
