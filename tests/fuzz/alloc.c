/* The extent allocator and the lane allocator (src/alloc/) against plain
 * page arrays: the input is a sequence of operations.
 *
 *   extent (first byte even): reserve(n, max_runs), reserve_contiguous,
 *     reserve_at, free of a held allocation (whole, a part of it, or a run
 *     that is not reserved, out of range, empty or listed twice), against
 *     tests/unit/alloc/model.h, the allocation rule by brute force: the same
 *     result code and the same runs, in order, for every call; after every
 *     call kvt_extalloc_check, and the free extents and stats of the model.
 *   lane (first byte odd): reserve and free against one page array per
 *     lane: the call fails exactly when fewer pages are free, the pages are
 *     distinct, free before and in range, per-lane free counts agree, and
 *     kvt_laneal_check holds after every call. */
#include "fuzz.h"
#include "kvtier/alloc.h"
#include "unit/alloc/model.h"

#define MAXN 1024
#define HELD 32

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet();
    return 0;
}

typedef struct held {
    kvt_run_t runs[64];
    size_t n;
} held_t;

static void ext_agree(kvt_extalloc_t *a, const model_t *m) {
    const char *why = NULL;
    FZ_ASSERT(kvt_extalloc_check(a, &why) == KVT_OK, "check: %s", why);
    static kvt_run_t got[MAXN], want[MAXN];
    size_t ng = kvt_extalloc_free_extents(a, got, MAXN), nw = model_runs(m, want);
    FZ_ASSERT(ng == nw && memcmp(got, want, ng * sizeof(kvt_run_t)) == 0, "free extents: %zu, the model %zu", ng, nw);
    kvt_extalloc_stats_t st = {.size = sizeof(st)};
    kvt_extalloc_stats(a, &st);
    uint64_t big = 0;
    for (size_t i = 0; i < nw; i++) big = want[i].len > big ? want[i].len : big;
    FZ_ASSERT(st.free_pages == m->free && st.free_extents == nw && st.largest_free_run == big, "stats");
}

static void extent(fz_t *f) {
    uint64_t n = 1 + fz_below(f, MAXN);
    kvt_extalloc_t *a;
    FZ_ASSERT(kvt_extalloc_create(&a, n) == KVT_OK, "create %llu", (unsigned long long)n);
    model_t m;
    model_init(&m, n);
    static held_t held[HELD];
    int nheld = 0;
    while (fz_more(f)) {
        uint8_t op = fz_u8(f) % 8;
        kvt_run_t got[64], want[64];
        size_t ng = 0, nw = 0;
        if (op <= 2 && nheld < HELD) { /* reserve */
            uint64_t k = fz_below(f, 4) == 0 ? fz_below(f, (uint32_t)n + 2) : 1 + fz_below(f, 16);
            size_t max = fz_below(f, 9);
            int rg = kvt_extalloc_reserve(a, k, got, max, &ng), rw = model_reserve(&m, k, want, max, &nw);
            FZ_ASSERT(rg == rw, "reserve(%llu, %zu): %s, the model %s", (unsigned long long)k, max, kvt_err_name(rg), kvt_err_name(rw));
            if (rg == KVT_OK) {
                FZ_ASSERT(ng == nw && memcmp(got, want, ng * sizeof(kvt_run_t)) == 0, "reserve(%llu): other runs", (unsigned long long)k);
                memcpy(held[nheld].runs, got, ng * sizeof(kvt_run_t));
                held[nheld++].n = ng;
            }
        } else if (op == 3 && nheld < HELD) { /* contiguous */
            uint64_t k = 1 + fz_below(f, 32);
            kvt_run_t r;
            int rg = kvt_extalloc_reserve_contiguous(a, k, &r), rw = model_reserve(&m, k, want, 1, &nw);
            FZ_ASSERT(rg == rw, "contiguous(%llu): %s, the model %s", (unsigned long long)k, kvt_err_name(rg), kvt_err_name(rw));
            if (rg == KVT_OK) {
                FZ_ASSERT(r.start == want[0].start && r.len == want[0].len, "contiguous: another run");
                held[nheld].runs[0] = r;
                held[nheld++].n = 1;
            }
        } else if (op == 4 && nheld < HELD) { /* at */
            kvt_run_t r = {fz_below(f, (uint32_t)n + 4), fz_below(f, 24)};
            int rg = kvt_extalloc_reserve_at(a, r), rw = model_reserve_at(&m, r);
            FZ_ASSERT(rg == rw, "reserve_at(%u, %u): %s, the model %s", r.start, r.len, kvt_err_name(rg), kvt_err_name(rw));
            if (rg == KVT_OK) held[nheld].runs[0] = r, held[nheld++].n = 1;
        } else if (op <= 6 && nheld > 0) { /* free a held allocation, or a piece of one */
            int i = (int)fz_below(f, (uint32_t)nheld);
            held_t *h = &held[i];
            bool part = op == 6;
            kvt_run_t runs[64];
            size_t k = h->n;
            memcpy(runs, h->runs, k * sizeof(kvt_run_t));
            if (part) { /* the first run's first pages */
                runs[0].len = 1 + fz_below(f, runs[0].len);
                k = 1;
            }
            int rg = kvt_extalloc_free(a, runs, k), rw = model_free(&m, runs, k);
            FZ_ASSERT(rg == rw, "free: %s, the model %s", kvt_err_name(rg), kvt_err_name(rw));
            if (rg == KVT_OK && part && runs[0].len < h->runs[0].len) {
                h->runs[0].start += runs[0].len;
                h->runs[0].len -= runs[0].len;
            } else if (rg == KVT_OK) {
                held[i] = held[--nheld];
            }
        } else { /* a bad free: random runs */
            kvt_run_t runs[3];
            size_t k = fz_below(f, 4);
            for (size_t i = 0; i < k; i++) runs[i] = (kvt_run_t){fz_below(f, (uint32_t)n + 4), fz_below(f, 8)};
            int rw = k == 0 ? KVT_EINVAL : model_free(&m, runs, k);
            int rg = kvt_extalloc_free(a, k ? runs : NULL, k);
            /* the model checks one fault at a time: with several (overlapping runs of pages not reserved)
             * either code is right, and all or nothing holds either way */
            FZ_ASSERT(rg == rw || (fz_kvt_err(rg) && fz_kvt_err(rw)), "bad free: %s, the model %s", kvt_err_name(rg), kvt_err_name(rw));
            if (rg == KVT_OK) { /* those pages are free now: forget the held runs that overlap them (all or nothing) */
                for (int i = 0; i < nheld; i++)
                    for (size_t j = 0; j < held[i].n; j++)
                        for (size_t q = 0; q < k; q++)
                            if (runs[q].start < held[i].runs[j].start + held[i].runs[j].len &&
                                held[i].runs[j].start < runs[q].start + runs[q].len) {
                                /* re-reserve the rest of that allocation's pages as single pages, the simplest bookkeeping */
                                kvt_run_t r = held[i].runs[j];
                                for (uint32_t p = r.start; p < r.start + r.len; p++)
                                    if (m.used[p] && nheld < HELD) {
                                        held[nheld].runs[0] = (kvt_run_t){p, 1};
                                        held[nheld++].n = 1;
                                    }
                                held[i].runs[j].len = 0;
                            }
                for (int i = 0; i < nheld; i++) { /* drop emptied runs */
                    size_t w = 0;
                    for (size_t j = 0; j < held[i].n; j++)
                        if (held[i].runs[j].len) held[i].runs[w++] = held[i].runs[j];
                    held[i].n = w;
                    if (w == 0) held[i--] = held[--nheld];
                }
            }
        }
        ext_agree(a, &m);
    }
    kvt_extalloc_destroy(a);
    model_fini(&m);
}

static void lane(fz_t *f) {
    uint32_t C = 1 + fz_below(f, 8);
    uint64_t n = C + fz_below(f, MAXN);
    kvt_laneal_t *la;
    FZ_ASSERT(kvt_laneal_create(&la, n, C) == KVT_OK, "create");
    static uint8_t used[MAXN + 8];
    memset(used, 0, sizeof(used));
    uint64_t nfree = n;
    static uint32_t held[HELD][64];
    uint32_t held_n[HELD];
    int nheld = 0;
    while (fz_more(f)) {
        uint8_t op = fz_u8(f) % 4;
        if (op <= 1 && nheld < HELD) {
            uint32_t k = 1 + fz_below(f, 64), *p = held[nheld];
            int rc = kvt_laneal_reserve(la, k, p);
            FZ_ASSERT((rc == KVT_ENOSPC) == (k > nfree) && (rc == KVT_OK || rc == KVT_ENOSPC), "reserve(%u) with %llu free: %s",
                      k, (unsigned long long)nfree, kvt_err_name(rc));
            if (rc == KVT_OK) {
                for (uint32_t i = 0; i < k; i++) {
                    FZ_ASSERT(p[i] < n && !used[p[i]], "page %u handed out twice or out of range", p[i]);
                    used[p[i]] = 1;
                }
                nfree -= k;
                held_n[nheld++] = k;
            }
        } else if (op == 2 && nheld > 0) {
            int i = (int)fz_below(f, (uint32_t)nheld);
            FZ_ASSERT(kvt_laneal_free(la, held[i], held_n[i]) == KVT_OK, "free");
            for (uint32_t j = 0; j < held_n[i]; j++) used[held[i][j]] = 0;
            nfree += held_n[i];
            memcpy(held[i], held[nheld - 1], sizeof(held[i]));
            held_n[i] = held_n[--nheld];
        } else { /* a bad free: a page not reserved, out of range, or twice */
            uint32_t p[2] = {fz_below(f, (uint32_t)n + 4), 0};
            size_t k = 1 + fz_below(f, 2);
            p[1] = p[0];
            bool bad = p[0] >= n || !used[p[0]] || k == 2;
            int rc = kvt_laneal_free(la, p, k);
            FZ_ASSERT(bad ? fz_kvt_err(rc) : rc == KVT_OK, "free of page %u (x%zu): %s", p[0], k, kvt_err_name(rc));
            if (rc == KVT_OK) { /* it was held: forget it */
                used[p[0]] = 0;
                nfree++;
                for (int i = 0; i < nheld; i++)
                    for (uint32_t j = 0; j < held_n[i]; j++)
                        if (held[i][j] == p[0]) held[i][j] = held[i][--held_n[i]], j = held_n[i];
                for (int i = 0; i < nheld; i++)
                    if (held_n[i] == 0) memcpy(held[i], held[nheld - 1], sizeof(held[i])), held_n[i] = held_n[--nheld], i--;
            }
        }
        const char *why = NULL;
        FZ_ASSERT(kvt_laneal_check(la, &why) == KVT_OK, "check: %s", why);
        for (uint32_t l = 0; l < C; l++) {
            uint64_t want = 0;
            for (uint64_t p = l; p < n; p += C) want += !used[p];
            FZ_ASSERT(kvt_laneal_lane_free(la, l) == want, "lane %u: %llu free, the model %llu", l,
                      (unsigned long long)kvt_laneal_lane_free(la, l), (unsigned long long)want);
        }
    }
    kvt_laneal_destroy(la);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0 || size > 4096) return 0;
    fz_t f = fz_of(data + 1, size - 1);
    if (data[0] & 1) lane(&f);
    else extent(&f);
    return 0;
}
