/* The digest's folds of id arrays (src/cache/fold.c), each way this CPU has,
 * against the fold's definition written out here term by term: the term of
 * value v at place i is x ^ (x >> 31), x = (v ^ i G) M mod 2^64, and an
 * array's fold the sum of its terms mod 2^64. The wide way must give the same
 * 64 bits as the definition for every length (whole groups of eight, and the
 * rest), place (the places' products wrap past 2^64) and alignment. A run
 * of backups folds tag ^ l1 << 20 ^ l2 of its pages, the last page first
 * (its l1 from the tree's page states, three words a page). */
#include <criterion/criterion.h>
#include <stdint.h>

#include "cache/fold-int.h"
#include "kvtier/rng.h"

static uint64_t model(uint64_t tag, const uint32_t *ids, size_t k, uint64_t n) {
    uint64_t sum = 0;
    for (size_t j = 0; j < k; j++) {
        uint64_t place = n + j, x = ((tag | ids[j]) ^ place * 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull;
        sum += x ^ (x >> 31);
    }
    return sum;
}

Test(fold, every_way_sums_as_the_definition) {
    enum { CAP = 300 };
    uint32_t ids[CAP + 3];
    kvt_rng_t rng;
    kvt_rng_seed(&rng, 11);
    for (size_t i = 0; i < CAP + 3; i++) ids[i] = (uint32_t)kvt_rng_next(&rng);
    ids[5] = 0;
    ids[6] = UINT32_MAX;
    const uint64_t tags[] = {0, 1ull << 40, 2ull << 40, 5ull << 40};
    const uint64_t places[] = {0, 1, 12345, UINT64_MAX - 4, (uint64_t)1 << 63};
    unsigned ran[2] = {0, 0};
    for (int way = KVT__FOLD_SCALAR; way <= KVT__FOLD_AVX512; way++)
        for (size_t t = 0; t < sizeof(tags) / sizeof(tags[0]); t++)
            for (size_t p = 0; p < sizeof(places) / sizeof(places[0]); p++)
                for (size_t off = 0; off < 4; off++) /* the array's alignment */
                    for (size_t k = 0; k <= CAP; k += k < 40 ? 1 : 37) {
                        uint64_t want = model(tags[t], ids + off, k, places[p]), got = ~want;
                        if (!kvt__fold_ids_sum_way((kvt__fold_way_t)way, tags[t], ids + off, k, places[p], &got)) {
                            cr_assert_eq(got, ~want, "a way this CPU lacks leaves the sum alone");
                            continue;
                        }
                        ran[way]++;
                        cr_assert_eq(got, want, "way %d, tag %zu, place %zu, offset %zu, %zu ids", way, t, p, off, k);
                        cr_assert_eq(kvt__fold_ids_sum(tags[t], ids + off, k, places[p]), want);
                    }
    cr_assert_gt(ran[KVT__FOLD_SCALAR], 0);
    cr_log_info("fold ways run: scalar %u, avx512 %u (0: this CPU lacks AVX-512DQ)", ran[0], ran[1]);
}

static uint64_t backups_model(uint64_t tag, const kvt_page_t *pages, const uint32_t *l2, size_t k, uint64_t n) {
    uint64_t sum = 0;
    for (size_t j = 0; j < k; j++) { /* the j-th term is page k - 1 - j's */
        size_t p = k - 1 - j;
        uint64_t v = tag ^ (uint64_t)pages[p].l1 << 20 ^ l2[p];
        uint64_t x = (v ^ (n + j) * 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull;
        sum += x ^ (x >> 31);
    }
    return sum;
}

Test(fold, backups_every_way_sum_as_the_definition) {
    enum { CAP = 300 };
    kvt_page_t pages[CAP + 3];
    uint32_t l2[CAP + 3];
    kvt_rng_t rng;
    kvt_rng_seed(&rng, 12);
    for (size_t i = 0; i < CAP + 3; i++) {
        uint64_t r = kvt_rng_next(&rng);
        pages[i] = (kvt_page_t){(uint32_t)r, (uint32_t)(r >> 32), (uint32_t)i}; /* l2 and flags are not folded */
        l2[i] = (uint32_t)kvt_rng_next(&rng);
    }
    pages[4].l1 = UINT32_MAX;
    l2[4] = UINT32_MAX;
    const uint64_t tags[] = {0, 3ull << 40, 4ull << 40};
    const uint64_t places[] = {0, 9, UINT64_MAX - 20, (uint64_t)1 << 63};
    unsigned ran[2] = {0, 0};
    for (int way = KVT__FOLD_SCALAR; way <= KVT__FOLD_AVX512; way++)
        for (size_t t = 0; t < sizeof(tags) / sizeof(tags[0]); t++)
            for (size_t p = 0; p < sizeof(places) / sizeof(places[0]); p++)
                for (size_t off = 0; off < 4; off++)
                    for (size_t k = 0; k <= CAP; k += k < 40 ? 1 : 37) {
                        uint64_t want = backups_model(tags[t], pages + off, l2 + (3 - off), k, places[p]), got = ~want;
                        if (!kvt__fold_backups_sum_way((kvt__fold_way_t)way, tags[t], pages + off, l2 + (3 - off), k,
                                                       places[p], &got)) {
                            cr_assert_eq(got, ~want);
                            continue;
                        }
                        ran[way]++;
                        cr_assert_eq(got, want, "way %d, tag %zu, place %zu, offset %zu, %zu pages", way, t, p, off, k);
                        cr_assert_eq(kvt__fold_backups_sum(tags[t], pages + off, l2 + (3 - off), k, places[p]), want);
                    }
    cr_assert_gt(ran[KVT__FOLD_SCALAR], 0);
    cr_log_info("backup fold ways run: scalar %u, avx512 %u", ran[0], ran[1]);
}

Test(fold, the_sum_splits_at_any_point) {
    /* folding an array in two parts, the second at its place, gives the whole: what the cache
     * relies on when one round's ids are folded in several calls */
    uint32_t ids[100];
    for (uint32_t i = 0; i < 100; i++) ids[i] = i * 2654435761u;
    uint64_t whole = kvt__fold_ids_sum(1ull << 40, ids, 100, 77);
    cr_assert_eq(whole, model(1ull << 40, ids, 100, 77));
    for (size_t cut = 0; cut <= 100; cut++)
        cr_assert_eq(kvt__fold_ids_sum(1ull << 40, ids, cut, 77) + kvt__fold_ids_sum(1ull << 40, ids + cut, 100 - cut, 77 + cut),
                     whole, "cut at %zu", cut);
}
