/* The decision digest's folds of arrays of page ids (fold-int.h), the bulk of
 * the folds: every id taken from or given back to an allocator is one. A term
 * is a 64-bit multiply and a few cheap operations, and the terms are
 * independent, so with AVX-512DQ eight go through one vpmullq:
 *
 *   lane j (0..7):  x = ((tag | ids[i + j]) ^ (n + i + j) G) M;  sum_j += x ^ x >> 31
 *   after the loop: digest part = sum_0 + ... + sum_7, the last k mod 8 one at a time
 *
 * Addition mod 2^64 is associative, so the sum is the scalar loop's, bit for
 * bit (tests/unit/cache/test_fold.c checks both ways against the definition).
 * The places' products (n + i + j) G advance by 8 G a step, as the scalar loop's
 * by G (gcc makes that strength reduction there too). What it buys: eight
 * terms a multiply instruction, where a digest-keeping cache folds every
 * page id it takes or gives back. A run of backups made at once
 * (copies.c) folds its copies the same way, its l1 ids read from the tree's
 * page states. Where there is no AVX-512, the scalar loops run. */
#include <stddef.h>

#include "fold-int.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define KVT__FOLD_X86 1
#endif

static uint64_t sum_scalar(uint64_t tag, const uint32_t *ids, size_t k, uint64_t n) {
    uint64_t s = 0;
    for (size_t j = 0; j < k; j++) s += kvt__fold_term(tag | ids[j], n + j);
    return s;
}

static uint64_t backups_scalar(uint64_t tag, const kvt_page_t *pages, const uint32_t *l2, size_t k, uint64_t n) {
    uint64_t s = 0;
    for (size_t p = 0; p < k; p++) s += kvt__fold_term(tag ^ (uint64_t)pages[p].l1 << 20 ^ l2[p], n + (k - 1 - p));
    return s;
}

static bool have_avx512; /* set before main (pick_way); false where there is no x86 */

#ifdef KVT__FOLD_X86
/* The eight lanes' sum, mod 2^64. (Not _mm512_reduce_add_epi64: gcc 12 adds
 * the lanes as signed long long, and a sum past 2^63 is undefined behaviour
 * there, which UndefinedBehaviorSanitizer reports.) */
__attribute__((target("avx512f"))) static inline uint64_t lanes_sum(__m512i v) {
    uint64_t lane[8], s = 0;
    _mm512_storeu_si512((void *)lane, v);
    for (int j = 0; j < 8; j++) s += lane[j];
    return s;
}

/* Eight terms: of the values v at the places whose products with G are gp. */
__attribute__((target("avx512f,avx512dq"))) static inline __m512i terms8(__m512i v, __m512i gp) {
    __m512i x = _mm512_mullo_epi64(_mm512_xor_si512(v, gp), _mm512_set1_epi64((long long)KVT__FOLD_MUL));
    return _mm512_xor_si512(x, _mm512_srli_epi64(x, 31));
}

__attribute__((target("avx512f,avx512dq"))) static uint64_t sum_avx512(uint64_t tag, const uint32_t *ids, size_t k,
                                                                        uint64_t n) {
    const __m512i t = _mm512_set1_epi64((long long)tag), step = _mm512_set1_epi64((long long)(8 * KVT__FOLD_PLACE));
    __m512i place = _mm512_mullo_epi64(_mm512_add_epi64(_mm512_set1_epi64((long long)n), _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0)),
                                       _mm512_set1_epi64((long long)KVT__FOLD_PLACE));
    __m512i sum = _mm512_setzero_si512();
    size_t i = 0;
    for (; i + 8 <= k; i += 8) {
        __m512i v = _mm512_or_si512(_mm512_cvtepu32_epi64(_mm256_loadu_si256((const __m256i *)(const void *)(ids + i))), t);
        sum = _mm512_add_epi64(sum, terms8(v, place));
        place = _mm512_add_epi64(place, step);
    }
    return lanes_sum(sum) + sum_scalar(tag, ids + i, k - i, n + i);
}

/* A backup run's terms eight pages at a time: the pages' l1 fields, every
 * third word of the 24 that eight pages are, picked from two loads by one
 * permute; the places count down from the run's last page. */
__attribute__((target("avx512f,avx512dq"))) static uint64_t backups_avx512(uint64_t tag, const kvt_page_t *pages,
                                                                            const uint32_t *l2, size_t k, uint64_t n) {
    _Static_assert(sizeof(kvt_page_t) == 12 && offsetof(kvt_page_t, l1) == 0, "a page is three words, l1 first");
    const __m512i t = _mm512_set1_epi64((long long)tag);
    const __m512i every3 = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 21, 18, 15, 12, 9, 6, 3, 0);
    const __m512i step = _mm512_set1_epi64((long long)(8 * KVT__FOLD_PLACE));
    /* page p's place is n + k - 1 - p: lane j of the first eight, n + k - 1 - j */
    __m512i place = _mm512_mullo_epi64(_mm512_sub_epi64(_mm512_set1_epi64((long long)(n + k - 1)), _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0)),
                                       _mm512_set1_epi64((long long)KVT__FOLD_PLACE));
    __m512i sum = _mm512_setzero_si512();
    size_t p = 0;
    for (; p + 8 <= k; p += 8) {
        const uint32_t *w = &pages[p].l1; /* the 24 words of pages p .. p + 7 */
        __m512i lo16 = _mm512_loadu_si512((const void *)w), hi8 = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)(w + 16)));
        __m512i l1 = _mm512_cvtepu32_epi64(_mm512_castsi512_si256(_mm512_permutex2var_epi32(lo16, every3, hi8)));
        __m512i v = _mm512_xor_si512(_mm512_xor_si512(t, _mm512_slli_epi64(l1, 20)),
                                     _mm512_cvtepu32_epi64(_mm256_loadu_si256((const __m256i *)(const void *)(l2 + p))));
        sum = _mm512_add_epi64(sum, terms8(v, place));
        place = _mm512_sub_epi64(place, step);
    }
    return lanes_sum(sum) + backups_scalar(tag, pages + p, l2 + p, k - p, n);
}

/* before main, one thread: whether this machine has the wide way */
__attribute__((constructor)) static void pick_way(void) {
    __builtin_cpu_init();
    have_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
}
#endif

/* The two sums by the way asked for: wide (AVX-512), where compiled in, or scalar. */
static uint64_t ids_sum(bool wide, uint64_t tag, const uint32_t *ids, size_t k, uint64_t n) {
#ifdef KVT__FOLD_X86
    if (wide) return sum_avx512(tag, ids, k, n);
#endif
    (void)wide;
    return sum_scalar(tag, ids, k, n);
}
static uint64_t backups_sum(bool wide, uint64_t tag, const kvt_page_t *pages, const uint32_t *l2, size_t k, uint64_t n) {
#ifdef KVT__FOLD_X86
    if (wide) return backups_avx512(tag, pages, l2, k, n);
#endif
    (void)wide;
    return backups_scalar(tag, pages, l2, k, n);
}

/* Whether this CPU has the way (the scalar one, always). */
static bool has(kvt__fold_way_t way) { return way == KVT__FOLD_SCALAR || (way == KVT__FOLD_AVX512 && have_avx512); }

uint64_t kvt__fold_ids_sum(uint64_t tag, const uint32_t *ids, size_t k, uint64_t n) {
    return ids_sum(have_avx512 && k >= 8, tag, ids, k, n);
}

uint64_t kvt__fold_backups_sum(uint64_t tag, const kvt_page_t *pages, const uint32_t *l2, size_t k, uint64_t n) {
    return backups_sum(have_avx512 && k >= 8, tag, pages, l2, k, n);
}

bool kvt__fold_ids_sum_way(kvt__fold_way_t way, uint64_t tag, const uint32_t *ids, size_t k, uint64_t n, uint64_t *sum) {
    if (!has(way)) return false;
    *sum = ids_sum(way == KVT__FOLD_AVX512, tag, ids, k, n);
    return true;
}

bool kvt__fold_backups_sum_way(kvt__fold_way_t way, uint64_t tag, const kvt_page_t *pages, const uint32_t *l2, size_t k,
                               uint64_t n, uint64_t *sum) {
    if (!has(way)) return false;
    *sum = backups_sum(way == KVT__FOLD_AVX512, tag, pages, l2, k, n);
    return true;
}
