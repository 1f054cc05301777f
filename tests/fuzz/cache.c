/* The cache with a data plane (src/cache/, src/xfer/) against the content
 * model of the data-plane stress test (tests/common/stress.h): the input is
 * the set-up (geometry, policy, write policy, free room, transfer faults)
 * and a sequence of operations — admissions of requests from a few prefix
 * families, commits, releases of held requests in any order, polls,
 * restore_room, syncs, and L2 pages corrupted behind the cache's back. The
 * transfer engine's two workers complete copies in any order, after delays,
 * and fail some (kvt_xfer_set_faults, seeded from the input).
 *
 * After every operation (st_check): kvt_cache_check; every page of a held
 * request is in L1 with its content; every page the tree says is in L1, or
 * has a valid L2 copy, holds the content its page hash determines (a
 * function of the prefix alone). Every page an admission serves (an L1 hit
 * or a load from L2) holds its content: a failed or corrupt copy is never
 * served. */
#include "common/stress.h"
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet();
    return 0;
}

static stress_t S;

/* A request from the input: family, length, divergence page and salt. */
static uint32_t request(fz_t *f, int32_t *tok) {
    uint8_t a = fz_u8(f), b = fz_u8(f);
    uint32_t fam = a % 5, n = 1 + (a >> 3) % ST_MAXP, div = b % (n + 1), salt = (b >> 4) % 4;
    for (uint32_t i = 0; i < n * ST_PT; i++) tok[i] = (int32_t)(fam * 100000 + (i / ST_PT >= div ? salt * 1000 + 500 : 0) + i);
    return n;
}

static void admit(stress_t *s, fz_t *f) {
    int32_t tok[ST_MAXP * ST_PT];
    uint32_t np = request(f, tok);
    int k = s->nheld;
    kvt_cache_req_t *req = &s->held[k];
    int rc = kvt_cache_admit(s->c, 0, tok, (uint64_t)np * ST_PT, 0, s->held_ids[k], req);
    FZ_ASSERT(rc == KVT_OK, "admit: %s", kvt_err_name(rc));
    kvt_page_hash_chain(0, tok, req->pages, ST_PT, s->held_hash[k]);
    for (uint64_t j = 0; j < req->pages - req->new_pages; j++)
        FZ_ASSERT(st_page_ok(s, 0, s->held_ids[k][j], &s->held_hash[k][j]), "served page %llu (L1 %u, %s) holds the wrong bytes",
                  (unsigned long long)j, s->held_ids[k][j], j < req->l1_hit_pages ? "an L1 hit" : "loaded");
    for (uint64_t j = req->pages - req->new_pages; j < req->pages; j++) /* the forward pass */
        kvt_tier_pattern_fill(s->tier[0], s->held_ids[k][j], s->held_hash[k][j].lo, s->held_hash[k][j].hi, s->buf);
    if (fz_u8(f) % 3 != 0) kvt_cache_commit(s->c, req);
    s->nheld++;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 8 || size > 2048) return 0;
    fz_t f = fz_of(data, size);
    stress_t *s = &S;
    memset(s, 0, sizeof(*s));
    uint8_t g0 = fz_u8(&f), g1 = fz_u8(&f), g2 = fz_u8(&f), g3 = fz_u8(&f);
    uint64_t seed = fz_u32(&f);
    s->layers = 1 + g0 % 3;
    s->layer_bytes = 8 + (g0 >> 2) % 40;
    s->buf = malloc(s->layer_bytes);
    uint64_t l1 = 16 + g1 % 48, l2 = 8 + (g1 >> 1) % 96;
    kvt_tier_config_t tc = {.size = sizeof(tc), .kind = KVT_TIER_ARENA, .name = "l1",
                            .geom = {l1, s->layers, s->layer_bytes, (kvt_layout_t)(g2 & 1)}};
    FZ_ASSERT(kvt_tier_create(&s->tier[0], &tc) == KVT_OK, "l1");
    tc.kind = KVT_TIER_HOST, tc.name = "l2", tc.flags = KVT_TIER_CHECKSUM, tc.geom.pages = l2;
    tc.geom.layout = (kvt_layout_t)((g2 >> 1) & 1);
    FZ_ASSERT(kvt_tier_create(&s->tier[1], &tc) == KVT_OK, "l2");
    kvt_xfer_config_t xc;
    kvt_xfer_config_default(&xc);
    xc.threads = 2;
    xc.max_batch_bytes = (1 + (g2 >> 2) % 4) * s->layers * s->layer_bytes;
    FZ_ASSERT(kvt_xfer_create(&s->xf, &xc, s->tier, 2) == KVT_OK, "xfer");
    kvt_xfer_faults_t fl = {.size = sizeof(kvt_xfer_faults_t), .fail_p = (g3 & 3) * 0.05, .delay_p = ((g3 >> 2) & 3) * 0.2, .delay_max_ns = 50000, .seed = seed};
    FZ_ASSERT(kvt_xfer_set_faults(s->xf, &fl) == KVT_OK, "faults");
    kvt_cache_config_t cfg;
    kvt_cache_config_default(&cfg);
    cfg.page_tokens = ST_PT;
    cfg.l1_pages = l1;
    cfg.l2_pages = l2;
    cfg.policy = (kvt_policy_t)((g3 >> 4) % KVT_POLICY_COUNT_);
    cfg.write_policy = (kvt_write_policy_t)((g2 >> 4) % KVT_WRITE_POLICY_COUNT_);
    cfg.write_through_hits = 1 + ((g2 >> 6) & 1);
    cfg.l1_free_room = 0.1 * (double)(g0 >> 6 & 1);
    cfg.l2_free_room = 0.1 * (double)(g0 >> 7 & 1);
    FZ_ASSERT(kvt_cache_create(&s->c, &cfg) == KVT_OK, "cache");
    FZ_ASSERT(kvt_cache_attach(s->c, s->xf, s->tier[0], 0, s->tier[1], 1) == KVT_OK, "attach");
    for (int t = 0; fz_more(&f) && t < 300; t++) {
        uint8_t op = fz_u8(&f) % 16;
        if (op < 7 && s->nheld < ST_HELD) admit(s, &f);
        else if (op < 11 && s->nheld > 0) st_release(s, (int)fz_below(&f, (uint32_t)s->nheld));
        else if (op < 13) kvt_cache_poll(s->c);
        else if (op == 13) kvt_cache_restore_room(s->c);
        else if (op == 14) st_corrupt(s);
        else kvt_cache_sync(s->c);
        FZ_ASSERT(st_check(s) == 0, "step %d (op %u): %s", t, op, s->err);
    }
    kvt_cache_sync(s->c);
    FZ_ASSERT(st_check(s) == 0, "after the last sync: %s", s->err);
    st_fini(s);
    return 0;
}
