/* The radix tree through the cache (src/radix/, src/cache/) against a
 * brute-force prefix model: the input is a stream of requests over one
 * L1 tier under LRU (first byte: capacity, free room, namespace use).
 *
 * A request reuses a prefix of one of the last 16 requests and extends it
 * with tokens from a small alphabet (so prefixes are shared, nodes split at
 * every page boundary and merge back under eviction); some carry a partial
 * last page, some a second namespace. The model is the unit suite's LRU
 * simulator (tests/unit/cache/test_cache.c): the cache holds the set of
 * page prefixes a plain LRU over leaf pages would, found by comparing token
 * arrays. After every request: the hit pages and the pages cached equal the
 * model's, a match of any earlier request finds exactly the model's
 * prefix, and kvt_cache_check and kvt_radix_check hold. */
#include <math.h>

#include "fuzz.h"
#include "kvtier/cache.h"
#include "kvtier/radix.h"

#define PT 4
#define MAXP 16
#define RING 16
#define MPAGES 512

typedef struct lpage {
    int32_t tok[MAXP * PT];
    uint32_t ns, k;
    uint64_t last, born;
    bool used;
} lpage_t;

typedef struct lru_model {
    lpage_t p[MPAGES];
    uint32_t n, present;
    uint64_t cap, target, born;
} lru_model_t;

static lru_model_t M;

static bool same_prefix(const lpage_t *p, uint32_t ns, const int32_t *q, uint32_t k) {
    return p->ns == ns && p->k <= k && memcmp(p->tok, q, p->k * PT * sizeof(int32_t)) == 0;
}

static lpage_t *lfind(uint32_t ns, const int32_t *q, uint32_t k) {
    for (uint32_t i = 0; i < M.n; i++)
        if (M.p[i].used && M.p[i].k == k && same_prefix(&M.p[i], ns, q, k)) return &M.p[i];
    return NULL;
}

static bool lleaf(const lpage_t *p) {
    for (uint32_t i = 0; i < M.n; i++)
        if (M.p[i].used && M.p[i].k == p->k + 1 && same_prefix(p, M.p[i].ns, M.p[i].tok, p->k)) return false;
    return true;
}

/* Pages of q (n) cached in the model, from the start. */
static uint32_t lmatch(uint32_t ns, const int32_t *q, uint32_t n) {
    uint32_t hit = 0;
    while (hit < n && lfind(ns, q, hit + 1)) hit++;
    return hit;
}

static uint32_t lru_admit(uint32_t ns, const int32_t *q, uint32_t n, uint64_t t) {
    uint32_t hit = 0;
    while (hit < n && lfind(ns, q, hit + 1)) lfind(ns, q, ++hit)->last = t;
    uint64_t need = n - hit;
    if (need > 0 && 2 * (M.cap - M.present) < 2 * need + M.target) { /* would leave under half the target */
        while (M.cap - M.present < need + M.target) {
            lpage_t *v = NULL; /* the least recently used leaf outside the matched prefix */
            for (uint32_t i = 0; i < M.n; i++) {
                lpage_t *p = &M.p[i];
                if (!p->used || (p->k <= hit && same_prefix(p, ns, q, hit)) || !lleaf(p)) continue;
                if (v == NULL || p->last < v->last || (p->last == v->last && p->born > v->born)) v = p;
            }
            if (v == NULL) break;
            v->used = false;
            M.present--;
        }
    }
    uint64_t room = M.cap - M.present;
    uint32_t ins = (uint32_t)(need < room ? need : room);
    for (uint32_t i = 0; i < ins; i++) {
        uint32_t j = 0;
        while (j < M.n && M.p[j].used) j++;
        if (j == M.n) M.n++;
        lpage_t *p = &M.p[j];
        p->used = true;
        p->ns = ns;
        p->k = hit + i + 1;
        memcpy(p->tok, q, p->k * PT * sizeof(int32_t));
        p->last = t;
        p->born = ++M.born;
        M.present++;
    }
    return hit;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0 || size > 4096) return 0;
    fz_t f = fz_of(data, size);
    uint8_t setup = fz_u8(&f);
    memset(&M, 0, sizeof(M));
    M.cap = 4 + (setup & 31) * 2;
    double room = (setup & 32) ? 0.1 : 0;
    M.target = (uint64_t)ceil(room * (double)M.cap);
    bool two_ns = setup & 64;
    kvt_cache_config_t cfg;
    kvt_cache_config_default(&cfg);
    cfg.page_tokens = PT;
    cfg.l1_pages = M.cap;
    cfg.l2_pages = 0;
    cfg.l1_free_room = room;
    cfg.policy = KVT_POLICY_LRU;
    cfg.write_policy = KVT_WRITE_THROUGH_SELECTIVE;
    kvt_cache_t *c;
    FZ_ASSERT(kvt_cache_create(&c, &cfg) == KVT_OK, "create");
    static int32_t ring[RING][MAXP * PT];
    static uint32_t ring_n[RING], ring_ns[RING];
    uint32_t nring = 0;
    int32_t q[MAXP * PT];
    for (uint64_t t = 1; fz_left(&f) >= 2 && t < 400; t++) {
        uint8_t a = fz_u8(&f), b = fz_u8(&f);
        uint32_t n = 1 + b % MAXP, keep = 0, ns = two_ns ? (a >> 7) : 0;
        if (nring > 0 && (a & 3) != 0) { /* extend an earlier request */
            uint32_t j = (a >> 2) % (nring < RING ? nring : RING);
            keep = (uint32_t)fz_below(&f, ring_n[j] + 1);
            if (keep > n) n = keep;
            memcpy(q, ring[j], keep * PT * sizeof(int32_t));
            ns = ring_ns[j];
        }
        for (uint32_t i = keep * PT; i < n * PT; i++) q[i] = (int32_t)(fz_u8(&f) % 3);
        uint32_t slot = nring++ % RING;
        memcpy(ring[slot], q, n * PT * sizeof(int32_t));
        ring_n[slot] = n, ring_ns[slot] = ns;
        kvt_cache_req_t req;
        uint64_t partial = b & 0x80 ? 1 + (b >> 4) % (PT - 1) : 0;
        int rc = kvt_cache_admit(c, ns, q, (uint64_t)n * PT + partial, 0, NULL, &req);
        FZ_ASSERT(rc == KVT_OK, "admit: %s", kvt_err_name(rc));
        uint32_t want = lru_admit(ns, q, n, t);
        FZ_ASSERT(req.l1_hit_pages == want, "request %llu: %llu hit pages, the model %u", (unsigned long long)t,
                  (unsigned long long)req.l1_hit_pages, want);
        FZ_ASSERT(kvt_cache_release(c, &req) == KVT_OK, "release");
        kvt_radix_stats_t rs = {.size = sizeof(rs)};
        kvt_radix_stats(kvt_cache_tree(c), &rs);
        FZ_ASSERT(rs.pages == M.present, "request %llu: %llu pages cached, the model %u", (unsigned long long)t,
                  (unsigned long long)rs.pages, M.present);
        const char *why = NULL;
        FZ_ASSERT(kvt_cache_check(c, &why) == KVT_OK, "cache check: %s", why);
        FZ_ASSERT(kvt_radix_check(kvt_cache_tree(c), &why) == KVT_OK, "radix check: %s", why);
    }
    /* every remembered request: the tree's match is the model's */
    for (uint32_t j = 0; j < (nring < RING ? nring : RING); j++) {
        kvt_cache_req_t req;
        uint32_t want = lmatch(ring_ns[j], ring[j], ring_n[j]);
        kvt_cache_stats_t before = {.size = sizeof(before)};
        kvt_cache_stats(c, &before);
        (void)before;
        FZ_ASSERT(kvt_cache_admit(c, ring_ns[j], ring[j], (uint64_t)ring_n[j] * PT, 0, NULL, &req) == KVT_OK, "admit");
        FZ_ASSERT(req.l1_hit_pages == want, "final match of request %u: %llu pages, the model %u", j,
                  (unsigned long long)req.l1_hit_pages, want);
        kvt_cache_release(c, &req);
        lru_admit(ring_ns[j], ring[j], ring_n[j], 1000 + j);
    }
    kvt_cache_destroy(c);
    return 0;
}
