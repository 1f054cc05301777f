/* A two-rank CP group on the library alone: the program forks itself into
 * rank 0 and rank 1 (an engine's ranks come from torchrun or a launcher the
 * same way: all a rank needs is the group's name, its rank and the size).
 * Both join the group by name, share one node's L1 lanes and one L2 segment,
 * and run the same cache on the same requests; each writes and loads only the
 * pages of its own lane, rank 0 backs up every page. At the end the ranks'
 * decision digests must agree and every page a rank loaded back must hold
 * what its forward pass wrote.
 *
 *   cc cp_group.c $(pkg-config --cflags --libs kvtier) -o cp_group
 *
 * A rank's calls in order: kvt_cp_group_join, kvt_cp_group_open_tier ("l1",
 * "l2"), kvt_cp_group_wait_joined, kvt_cp_group_xfer_config before
 * kvt_xfer_create, kvt_cp_group_attach; per request kvt_cache_admit,
 * kvt_cp_group_admitted, write its own pages, kvt_cp_group_filled, commit,
 * release, kvt_cp_group_step; then kvt_cp_group_check_digests,
 * kvt_cp_group_finish, kvt_cp_group_leave (rank 0 removes the segments). */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <kvtier/kvtier.h>

#include "content.h"

#define RANKS 2
#define PAGE 16
#define L1_PAGES 32 /* both lanes */
#define L2_PAGES 128
#define LAYERS 2
#define LB 512
#define REQUESTS 40
#define MAXP 12

/* Request i: one of 6 prefixes of 8 pages, then 0..3 pages of its own. */
static uint64_t tokens_of(uint64_t i, int32_t *tok) {
    uint64_t prefix = (i * 7) % 6, own = i % 4, n = (8 + own) * PAGE;
    for (uint64_t t = 0; t < n; t++) tok[t] = (int32_t)(t < 8 * PAGE ? prefix * 100000 + t : 1000000 + i * 1000 + t);
    return n;
}

static int rank_main(const char *name, uint32_t r) {
    const char *why = NULL;
    kvt_cp_group_config_t gc = {.size = sizeof(gc), .name = name, .rank = r, .ranks = RANKS, .l1_pages = L1_PAGES,
                                .l2_pages = L2_PAGES, .page_tokens = PAGE, .layers = LAYERS, .layer_bytes = LB,
                                .layout = KVT_LAYOUT_PAGE_FIRST, .requests = REQUESTS, .timeout_ms = 20000};
    kvt_cp_group_t *g = NULL;
    int rc = kvt_cp_group_join(&g, &gc, &why);
    if (rc != KVT_OK) return fprintf(stderr, "cp_group: rank %u: %s\n", r, why ? why : kvt_strerror(rc)), 1;
    kvt_tier_config_t l1c = {.size = sizeof(l1c), .geom = {L1_PAGES, LAYERS, LB, KVT_LAYOUT_PAGE_FIRST}};
    kvt_tier_config_t l2c = {.size = sizeof(l2c), .flags = KVT_TIER_CHECKSUM, .geom = {L2_PAGES, LAYERS, LB, KVT_LAYOUT_PAGE_FIRST}};
    kvt_tier_t *l1 = NULL, *l2 = NULL;
    kvt_cache_t *c = NULL;
    kvt_xfer_t *x = NULL;
    kvt_cache_config_t cc;
    kvt_cache_config_default(&cc);
    cc.page_tokens = PAGE, cc.l1_pages = L1_PAGES, cc.l2_pages = L2_PAGES, cc.l1_lanes = RANKS;
    cc.decision_digest = true; /* the ranks compare it */
    kvt_xfer_config_t xc;
    kvt_xfer_config_default(&xc);
    if (rc == KVT_OK) rc = kvt_cp_group_open_tier(g, "l1", &l1c, &l1);
    if (rc == KVT_OK) rc = kvt_cp_group_open_tier(g, "l2", &l2c, &l2);
    if (rc == KVT_OK) rc = kvt_cp_group_wait_joined(g);
    if (rc == KVT_OK) rc = kvt_cache_create(&c, &cc);
    if (rc == KVT_OK) kvt_cp_group_xfer_config(g, &xc, 0);
    if (rc == KVT_OK) rc = kvt_xfer_create(&x, &xc, (kvt_tier_t *[]){l1, l2}, 2);
    if (rc == KVT_OK) rc = kvt_cp_group_attach(g, c, x, l1, 0, l2, 1);
    kvt_cp_layout_t lay = {RANKS, L1_PAGES / RANKS, PAGE};
    int32_t tok[MAXP * PAGE];
    uint32_t ids[MAXP];
    kvt_hash128_t h[MAXP];
    unsigned char scratch[LB];
    uint64_t loads = 0, wrong = 0, divergence = 0;
    for (uint64_t i = 0; rc == KVT_OK && i < REQUESTS; i++) {
        uint64_t n = tokens_of(i, tok);
        kvt_cache_req_t req;
        if ((rc = kvt_cache_admit(c, 0, tok, n, 0, ids, &req)) != KVT_OK) break;
        rc = kvt_cp_group_admitted(g, &req, ids);
        kvt_page_hash_chain(0, tok, req.pages, PAGE, h);
        for (uint64_t j = 0; rc == KVT_OK && j < req.pages; j++) {
            if (kvt_cp_owner(&lay, ids[j]) != r) continue; /* another rank's lane */
            uint64_t p = kvt_cp_read_page(&lay, ids[j]);
            if (j >= req.l1_hit_pages && j < req.pages - req.new_pages) /* loaded back into our lane */
                loads++, wrong += !content_check(l1, p, h[j].lo, h[j].hi, scratch);
            else if (j >= req.pages - req.new_pages) /* the forward pass: our new pages */
                content_fill(l1, p, h[j].lo, h[j].hi, scratch);
        }
        if (rc == KVT_OK) rc = kvt_cp_group_filled(g, i);
        if (rc == KVT_OK) rc = kvt_cache_commit(c, &req);
        kvt_cache_release(c, &req);
        if (rc == KVT_OK) rc = kvt_cp_group_step(g, i, kvt_cache_digest(c) ^ i);
    }
    if (rc == KVT_OK) rc = kvt_cache_sync(c);
    if (rc == KVT_OK) rc = kvt_cp_group_check_digests(g, REQUESTS, &divergence);
    if (rc == KVT_OK) rc = kvt_cp_group_finish(g, &loads, sizeof(loads));
    uint64_t group_loads = 0; /* rank 0: every rank's loads, from their published results */
    for (uint32_t q = 0; rc == KVT_OK && r == 0 && q < RANKS; q++) {
        uint64_t v = 0;
        if ((rc = kvt_cp_group_result(g, q, &v, sizeof(v))) == KVT_OK) group_loads += v;
    }
    if (rc != KVT_OK) fprintf(stderr, "cp_group: rank %u: %s\n", r, kvt_cp_group_why(g));
    kvt_cache_destroy(c), kvt_xfer_destroy(x), kvt_tier_destroy(l1), kvt_tier_destroy(l2);
    int lrc = kvt_cp_group_leave(g, &why);
    printf("cp_group: rank %u: %llu pages loaded back, %llu wrong, digests %s\n", r, (unsigned long long)loads,
           (unsigned long long)wrong, divergence ? "DISAGREE" : "agree");
    fflush(stdout); /* the rank leaves with _exit */
    return rc != KVT_OK || lrc != KVT_OK || wrong || divergence || (r == 0 && group_loads == 0);
}

int main(void) {
    char name[64];
    snprintf(name, sizeof(name), "kvt-example-%d", (int)getpid());
    fflush(stdout);
    pid_t pid[RANKS];
    for (uint32_t r = 0; r < RANKS; r++)
        if ((pid[r] = fork()) == 0) _exit(rank_main(name, r));
    int bad = 0;
    for (uint32_t r = 0; r < RANKS; r++) {
        int st = 0;
        waitpid(pid[r], &st, 0);
        bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    }
    if (bad) return 1;
    puts("ok");
    return 0;
}
