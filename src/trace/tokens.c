/* A trace block's tokens: token j of block id is
 * splitmix64(id << 9 | j) & 0x7fffffff (kvtier/trace.h).
 *
 * Every token a replay hands the cache passes through here, so the
 * definition is computed the fastest way the machine has, with the same
 * values every way:
 *
 * - KVT__TRACE_TOKENS_SPLIT: one multiply a token instead of two. splitmix64's
 *   first round multiplies y = z ^ (z >> 30) by C1, with
 *   z = (id << 9) + G + j. Over a run of j in which z's bits from 10 up stay
 *   the same (a block has one run, or two when the low bits wrap), y is a
 *   constant `hi` whose low 10 bits are (z & 1023) ^ ((z >> 30) & 1023). So
 *   y * C1 is hi * C1 + MUL_C1[those bits]: one load and one add.
 * - KVT__TRACE_TOKENS_SSE41: the split, 4 tokens at a time. The second multiply
 *   needs only the low 62 bits of x * C2, and those come from 32-bit
 *   pieces. With x = xh 2^32 + xl, and P = xl * C2l as a 64-bit product, and
 *   Q = xh * C2l + xl * C2h mod 2^32, the low 31 bits of z ^ (z >> 31) are
 *   those of P ^ ((P >> 31) + 2Q). That takes one pmuludq and one pmulld a
 *   pair of tokens.
 * - KVT__TRACE_TOKENS_AVX512: the split, 8 tokens at a time with AVX-512's 64-bit
 *   multiply (vpmullq) for the second round. Eight tokens from a low value
 *   L with L % 8 == 0 take table entries ((L ^ hl) & ~7) + (i ^ (hl & 7)),
 *   i = 0..7: one aligned 64-byte load, permuted (vpermq) by i ^ (hl & 7).
 *   One vpmullq a token where the plain loop vectorised the same way takes
 *   two.
 *
 * A machine without AVX-512 has no vector 64-bit multiply: AVX2's is three
 * 32-bit ones, so there the plain loop vectorised with AVX2 loses to the
 * scalar one, and the split with SSE4.1 is the fastest way. There is no AVX2
 * split: on CPUs that split 256-bit operations in two (Zen 1) it loses to
 * SSE4.1's. */
#include <stdbool.h>
#include <stdint.h>

#include "kvtier/trace.h"
#include "trace-int.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define KVT__TRACE_TOKENS_X86 1 /* (gcc's target("arch=...") names) */
#include <immintrin.h>
#endif

#define G 0x9e3779b97f4a7c15ull
#define C1 0xbf58476d1ce4e5b9ull
#define C2 0x94d049bb133111ebull

#define MUL1(i) ((uint64_t)(i) * C1)
#define MUL4(i) MUL1(i), MUL1((i) + 1), MUL1((i) + 2), MUL1((i) + 3)
#define MUL16(i) MUL4(i), MUL4((i) + 4), MUL4((i) + 8), MUL4((i) + 12)
#define MUL64(i) MUL16(i), MUL16((i) + 16), MUL16((i) + 32), MUL16((i) + 48)
#define MUL256(i) MUL64(i), MUL64((i) + 64), MUL64((i) + 128), MUL64((i) + 192)
static const _Alignas(64) uint64_t MUL_C1[1024] = {MUL256(0), MUL256(256), MUL256(512), MUL256(768)};

/* The run of block tokens from j: z's bits from 10 up fixed until `end`. */
typedef struct run {
    uint64_t hi_c1; /* hi * C1 */
    uint64_t hl;    /* (z >> 30) & 1023: the shifted bits that land on the low 10 */
    uint64_t low;   /* z & 1023 at j */
    int end;
} run_t;

static inline run_t run_at(uint64_t z0, int j) {
    uint64_t z = z0 + (uint64_t)j, h = z >> 30, low = z & 1023;
    int end = j + (int)(1024 - low); /* until z's low 10 bits wrap */
    return (run_t){(((z & ~(uint64_t)1023) ^ h) & ~(uint64_t)1023) * C1, h & 1023, low,
                   end < KVT_TRACE_BLOCK_TOKENS ? end : KVT_TRACE_BLOCK_TOKENS};
}

/* The token whose first-round product is hi * C1 + MUL_C1[idx]. */
static inline int32_t split_token(uint64_t hi_c1, uint64_t idx) {
    uint64_t x = hi_c1 + MUL_C1[idx];
    x = (x ^ (x >> 27)) * C2;
    return (int32_t)((x ^ (x >> 31)) & 0x7fffffff);
}

static void block_split(uint32_t id, int32_t *out) {
    uint64_t z0 = ((uint64_t)id << 9) + G; /* splitmix64's first add, at j = 0 */
    for (int j = 0; j < KVT_TRACE_BLOCK_TOKENS;) {
        run_t r = run_at(z0, j);
        for (; j < r.end; j++, r.low++) out[j] = split_token(r.hi_c1, r.low ^ r.hl);
    }
}

#ifdef KVT__TRACE_TOKENS_X86
/* The eight tokens whose first-round products are hi * C1 (each lane of
 * hi_c1) plus tab[perm[i]]: tab 64-byte aligned, perm a permutation of 0..7. */
__attribute__((target("arch=x86-64-v4"))) static inline __m256i split8(__m512i hi_c1, __m512i perm, const uint64_t *tab) {
    const __m512i c2 = _mm512_set1_epi64((long long)C2), m31 = _mm512_set1_epi64(0x7fffffff);
    __m512i x = _mm512_add_epi64(_mm512_permutexvar_epi64(perm, _mm512_load_si512((const void *)tab)), hi_c1);
    x = _mm512_mullo_epi64(_mm512_xor_si512(x, _mm512_srli_epi64(x, 27)), c2);
    return _mm512_cvtepi64_epi32(_mm512_and_si512(_mm512_xor_si512(x, _mm512_srli_epi64(x, 31)), m31));
}

__attribute__((target("arch=x86-64-v4"))) static void block_avx512(uint32_t id, int32_t *out) {
    const __m512i iota = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
    uint64_t z0 = ((uint64_t)id << 9) + G;
    for (int j = 0; j < KVT_TRACE_BLOCK_TOKENS;) {
        run_t r = run_at(z0, j);
        for (; j < r.end && (r.low & 7); j++, r.low++) out[j] = split_token(r.hi_c1, r.low ^ r.hl); /* to L % 8 == 0 */
        __m512i hi = _mm512_set1_epi64((long long)r.hi_c1), perm = _mm512_xor_si512(iota, _mm512_set1_epi64((long long)(r.hl & 7)));
        for (; j + 8 <= r.end; j += 8, r.low += 8) /* r.low + 7 < 1024: inside the run */
            _mm256_storeu_si256((__m256i *)(void *)(out + j), split8(hi, perm, &MUL_C1[(r.low ^ r.hl) & ~(uint64_t)7]));
        for (; j < r.end; j++, r.low++) out[j] = split_token(r.hi_c1, r.low ^ r.hl);
    }
}

/* Two tokens' first-round products, one in each 64-bit lane. */
__attribute__((target("sse4.1"))) static inline __m128i pair_at(const run_t *r, uint64_t low) {
    __m128i a = _mm_loadl_epi64((const __m128i *)(const void *)&MUL_C1[low ^ r->hl]);
    a = _mm_castpd_si128(_mm_loadh_pd(_mm_castsi128_pd(a), (const double *)(const void *)&MUL_C1[(low + 1) ^ r->hl]));
    return _mm_add_epi64(a, _mm_set1_epi64x((long long)r->hi_c1));
}

/* The two tokens of x's lanes, in the low 32 bits of each. */
__attribute__((target("sse4.1"))) static inline __m128i pair_tokens(__m128i x) {
    const __m128i c2l = _mm_set1_epi64x((long long)(uint32_t)C2);
    const __m128i c2_hl = _mm_set_epi32((int)(uint32_t)C2, (int)(uint32_t)(C2 >> 32), (int)(uint32_t)C2,
                                        (int)(uint32_t)(C2 >> 32)); /* 32-bit lanes, low first: C2h, C2l, C2h, C2l */
    x = _mm_xor_si128(x, _mm_srli_epi64(x, 27));
    __m128i p = _mm_mul_epu32(x, c2l);     /* P = xl * C2l */
    __m128i q = _mm_mullo_epi32(x, c2_hl); /* xl * C2h, xh * C2l */
    q = _mm_add_epi32(q, _mm_shuffle_epi32(q, 0xB1)); /* Q in both halves of each lane */
    return _mm_xor_si128(p, _mm_add_epi32(_mm_srli_epi64(p, 31), _mm_slli_epi32(q, 1)));
}

__attribute__((target("sse4.1"))) static void block_sse41(uint32_t id, int32_t *out) {
    const __m128i m31 = _mm_set1_epi32(0x7fffffff);
    uint64_t z0 = ((uint64_t)id << 9) + G;
    for (int j = 0; j < KVT_TRACE_BLOCK_TOKENS;) {
        run_t r = run_at(z0, j);
        for (; j + 4 <= r.end; j += 4, r.low += 4) { /* r.low + 3 < 1024: inside the run */
            __m128i a = pair_tokens(pair_at(&r, r.low)), b = pair_tokens(pair_at(&r, r.low + 2));
            __m128i t = _mm_castps_si128(_mm_shuffle_ps(_mm_castsi128_ps(a), _mm_castsi128_ps(b), 0x88));
            _mm_storeu_si128((__m128i *)(void *)(out + j), _mm_and_si128(t, m31));
        }
        for (; j < r.end; j++, r.low++) out[j] = split_token(r.hi_c1, r.low ^ r.hl);
    }
}

static bool have_avx512, have_sse41;

/* before main, one thread: which ways this machine has */
__attribute__((constructor)) static void pick_ways(void) {
    __builtin_cpu_init();
    have_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    have_sse41 = __builtin_cpu_supports("sse4.1");
}
#endif

bool kvt__trace_block_tokens_way(kvt__trace_tokens_way_t way, uint32_t id, int32_t *out) {
    switch (way) {
    case KVT__TRACE_TOKENS_SPLIT: block_split(id, out); return true;
#ifdef KVT__TRACE_TOKENS_X86
    case KVT__TRACE_TOKENS_SSE41:
        if (have_sse41) block_sse41(id, out);
        return have_sse41;
    case KVT__TRACE_TOKENS_AVX512:
        if (have_avx512) block_avx512(id, out);
        return have_avx512;
#endif
    default: return false;
    }
}

void kvt_trace_block_tokens(uint32_t id, int32_t *out) {
#ifdef KVT__TRACE_TOKENS_X86
    if (have_avx512) block_avx512(id, out);
    else if (have_sse41) block_sse41(id, out);
    else block_split(id, out);
#else
    block_split(id, out);
#endif
}
