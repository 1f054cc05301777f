/* A cache over two tiers with real bytes: the smallest complete use of
 * libkvtier. It admits a request, writes its KV (here: content derived from
 * its page hashes, standing in for the forward pass), pushes it out of L1
 * with other requests, admits it again, and checks that the pages that came
 * back from L2 hold exactly what was written.
 *
 *   cc cache_basic.c $(pkg-config --cflags --libs kvtier) -o cache_basic
 *
 * Exit 0 and "ok" when every reused page is right. */
#include <stdio.h>
#include <stdlib.h>

#include <kvtier/kvtier.h>

#include "content.h"

#define PAGE_TOKENS 16
#define L1_PAGES 64
#define L2_PAGES 256
#define LAYERS 4
#define LAYER_BYTES 512 /* bytes of one page in one layer */

static int fail(const char *what, int rc) {
    fprintf(stderr, "cache_basic: %s: %s\n", what, kvt_strerror(rc));
    return 1;
}

/* Tokens of request r: requests share nothing but what their ids share. */
static void tokens_of(int r, int32_t *tok, size_t n) {
    for (size_t i = 0; i < n; i++) tok[i] = (int32_t)(r * 100000 + (int)i);
}

int main(void) {
    kvt_tier_t *l1 = NULL, *l2 = NULL;
    kvt_tier_config_t t1 = {.size = sizeof(t1), .kind = KVT_TIER_ARENA, .name = "l1",
                            .geom = {L1_PAGES, LAYERS, LAYER_BYTES, KVT_LAYOUT_LAYER_FIRST}};
    kvt_tier_config_t t2 = {.size = sizeof(t2), .kind = KVT_TIER_HOST, .name = "l2", .flags = KVT_TIER_CHECKSUM,
                            .geom = {L2_PAGES, LAYERS, LAYER_BYTES, KVT_LAYOUT_PAGE_FIRST}};
    int rc;
    if ((rc = kvt_tier_create(&l1, &t1)) != KVT_OK) return fail("L1 tier", rc);
    if ((rc = kvt_tier_create(&l2, &t2)) != KVT_OK) return fail("L2 tier", rc);
    kvt_xfer_config_t xc;
    kvt_xfer_config_default(&xc);
    kvt_xfer_t *x = NULL;
    kvt_tier_t *tiers[2] = {l1, l2};
    if ((rc = kvt_xfer_create(&x, &xc, tiers, 2)) != KVT_OK) return fail("transfer engine", rc);
    kvt_cache_config_t cc;
    kvt_cache_config_default(&cc);
    cc.page_tokens = PAGE_TOKENS;
    cc.l1_pages = L1_PAGES;
    cc.l2_pages = L2_PAGES;
    kvt_cache_t *c = NULL;
    if ((rc = kvt_cache_create(&c, &cc)) != KVT_OK) return fail("cache", rc);
    if ((rc = kvt_cache_attach(c, x, l1, 0, l2, 1)) != KVT_OK) return fail("attach", rc);

    enum { PAGES = 8, NTOK = PAGES * PAGE_TOKENS };
    int32_t tok[NTOK];
    uint32_t ids[PAGES];
    kvt_hash128_t h[PAGES];
    unsigned char scratch[LAYER_BYTES];
    int bad = 0;
    for (int r = 0; r < 12; r++) { /* request 0 first, then 11 others: L1 holds 8 requests */
        tokens_of(r, tok, NTOK);
        kvt_cache_req_t req;
        if ((rc = kvt_cache_admit(c, 0, tok, NTOK, 0, ids, &req)) != KVT_OK) return fail("admit", rc);
        kvt_page_hash_chain(0, tok, req.pages, PAGE_TOKENS, h);
        for (uint64_t j = req.l1_hit_pages + req.l2_hit_pages; j < req.pages; j++) /* the forward pass */
            content_fill(l1, ids[j], h[j].lo, h[j].hi, scratch);
        kvt_cache_commit(c, &req);
        kvt_cache_release(c, &req);
    }
    tokens_of(0, tok, NTOK); /* request 0 again: it comes back from L2 */
    kvt_cache_req_t req;
    if ((rc = kvt_cache_admit(c, 0, tok, NTOK, 0, ids, &req)) != KVT_OK) return fail("admit", rc);
    kvt_page_hash_chain(0, tok, req.pages, PAGE_TOKENS, h);
    for (uint64_t j = 0; j < req.l1_hit_pages + req.l2_hit_pages; j++)
        bad += !content_check(l1, ids[j], h[j].lo, h[j].hi, scratch);
    uint64_t hits = req.l1_hit_pages + req.l2_hit_pages, from_l2 = req.l2_hit_pages;
    kvt_cache_release(c, &req);
    kvt_cache_sync(c);
    kvt_cache_destroy(c);
    kvt_xfer_destroy(x);
    kvt_tier_destroy(l2);
    kvt_tier_destroy(l1);
    printf("kvtier %s: %llu of %d pages reused (%llu from L2), %d wrong\n", kvt_version_string(),
           (unsigned long long)hits, PAGES, (unsigned long long)from_l2, bad);
    if (bad || from_l2 == 0) return 1;
    puts("ok");
    return 0;
}
