/* The host copy of one span: ordinary or streaming stores, and the fused
 * copy + XXH3 (see copy-int.h).
 *
 * Streaming copy of n bytes:
 *
 *   dst  |head|  q  |  q  |  q  |  q  |rest|tail|     dst 64-aligned after head
 *         memcpy  \    \    \    \   lines  memcpy, then sfence
 *                  line k of each quarter in turn, k = 0, 1, ...
 *
 * A body of 16 KiB or more goes as four quarters side by side: a 64-byte
 * line of the first, of the second, the third, the fourth, then the next
 * line of each, so that four streams of loads and of stores are in flight
 * instead of one (a body under 16 KiB, and the few lines past the quarters,
 * go one line after the other). Loads are unaligned (src keeps whatever
 * offset it has against dst); the stores are aligned, whole cache lines, so
 * each line leaves the write-combining buffer once. Why four: one core
 * copying one stream waits on one sequence of DRAM rows, and four keep more
 * rows busy (glibc's own non-temporal memcpy of a large block interleaves
 * four pages for the same reason); two streams are not enough, and six or
 * eight are no better than four below 1 MiB. The figures are in
 * docs/performance.md, *Four streams of lines*.
 *
 * Short spans from scattered places (the pieces of a page of separate K and
 * V planes, a block of each of a model's layers) go two at a time, a line of
 * one span, then of the other:
 *
 *   dst0 |head| line 0 | line 1 | ... |tail|      two streams, each a span
 *   dst1 |head| line 0 | line 1 | ... |tail|      long (whole lines, both heads equal)
 *
 * Each span starts a sequence of loads on a page of its own, cold; two in
 * flight overlap one's start with the other's lines (docs/performance.md,
 * *Short spans two at a time*). */
#include <stdint.h>
#include <string.h>

#include "copy-int.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define KVT__HAVE_STREAM 1

#define QUARTERS_MIN (16u << 10) /* a body this long goes as four quarters */

/* One 64-byte line, dst 64-aligned. */
__attribute__((target("avx"))) static inline void line_avx(uint8_t *d, const uint8_t *s) {
    __m256i a = _mm256_loadu_si256((const __m256i *)s), b = _mm256_loadu_si256((const __m256i *)(s + 32));
    _mm256_stream_si256((__m256i *)d, a);
    _mm256_stream_si256((__m256i *)(d + 32), b);
}

/* n a multiple of 64. */
__attribute__((target("avx"))) static void stream_avx(uint8_t *d, const uint8_t *s, size_t n) {
    size_t q = n >= QUARTERS_MIN ? n / 4 & ~(size_t)63 : 0, i = 4 * q;
    for (size_t k = 0; k < q; k += 64) {
        line_avx(d + k, s + k);
        line_avx(d + q + k, s + q + k);
        line_avx(d + 2 * q + k, s + 2 * q + k);
        line_avx(d + 3 * q + k, s + 3 * q + k);
    }
    for (; i < n; i += 64) line_avx(d + i, s + i);
}

/* Two bodies of n bytes side by side, a line of each in turn (n a multiple
 * of 64, both destinations 64-aligned). */
__attribute__((target("avx"))) static void stream2_avx(uint8_t *d0, const uint8_t *s0, uint8_t *d1, const uint8_t *s1,
                                                       size_t n) {
    for (size_t k = 0; k < n; k += 64) {
        line_avx(d0 + k, s0 + k);
        line_avx(d1 + k, s1 + k);
    }
}

/* One 64-byte line, dst 64-aligned. */
static inline void line_sse2(uint8_t *d, const uint8_t *s) {
    for (int k = 0; k < 64; k += 32) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + k)), b = _mm_loadu_si128((const __m128i *)(s + k + 16));
        _mm_stream_si128((__m128i *)(d + k), a);
        _mm_stream_si128((__m128i *)(d + k + 16), b);
    }
}

/* n a multiple of 64. */
static void stream_sse2(uint8_t *d, const uint8_t *s, size_t n) {
    size_t q = n >= QUARTERS_MIN ? n / 4 & ~(size_t)63 : 0, i = 4 * q;
    for (size_t k = 0; k < q; k += 64)
        for (size_t w = 0; w < 4; w++) line_sse2(d + w * q + k, s + w * q + k);
    for (; i < n; i += 64) line_sse2(d + i, s + i);
}

static void stream2_sse2(uint8_t *d0, const uint8_t *s0, uint8_t *d1, const uint8_t *s1, size_t n) {
    for (size_t k = 0; k < n; k += 64) {
        line_sse2(d0 + k, s0 + k);
        line_sse2(d1 + k, s1 + k);
    }
}
#endif

/* The copy without the fence: head and tail by memcpy, the aligned body
 * streamed. */
static void stream_unfenced(uint8_t *d, const uint8_t *s, size_t n) {
#ifdef KVT__HAVE_STREAM
    size_t head = (size_t)(-(uintptr_t)d & 63);
    if (n < head + 128) {
        memcpy(d, s, n);
        return;
    }
    memcpy(d, s, head);
    d += head, s += head, n -= head;
    size_t body = n & ~(size_t)63;
    if (__builtin_cpu_supports("avx")) stream_avx(d, s, body);
    else stream_sse2(d, s, body);
    memcpy(d + body, s + body, n - body);
#else
    memcpy(d, s, n);
#endif
}

void kvt__copy_fence(void) {
#ifdef KVT__HAVE_STREAM
    _mm_sfence(); /* the streamed lines are visible before whatever reports the copy done */
#endif
}

void kvt__copy_stream(void *dst, const void *src, size_t n) {
    stream_unfenced(dst, src, n);
    kvt__copy_fence();
}

void kvt__copy(void *dst, const void *src, size_t n, bool stream) {
    if (kvt__copy_unfenced(dst, src, n, stream)) kvt__copy_fence();
}

bool kvt__copy_unfenced(void *dst, const void *src, size_t n, bool stream) {
    if (!kvt__copy_streams(n, stream)) {
        memcpy(dst, src, n);
        return false;
    }
    stream_unfenced(dst, src, n);
    return true;
}

bool kvt__copy_pair_unfenced(void *dst0, const void *src0, void *dst1, const void *src1, size_t n, bool stream) {
#ifdef KVT__HAVE_STREAM
    uint8_t *d0 = dst0, *d1 = dst1;
    const uint8_t *s0 = src0, *s1 = src1;
    size_t head = (size_t)(-(uintptr_t)d0 & 63);
    if (kvt__copy_pairs(n, stream) && head == (size_t)(-(uintptr_t)d1 & 63) && n >= head + 128) {
        memcpy(d0, s0, head);
        memcpy(d1, s1, head);
        size_t body = (n - head) & ~(size_t)63, tail = head + body;
        if (__builtin_cpu_supports("avx")) stream2_avx(d0 + head, s0 + head, d1 + head, s1 + head, body);
        else stream2_sse2(d0 + head, s0 + head, d1 + head, s1 + head, body);
        memcpy(d0 + tail, s0 + tail, n - tail);
        memcpy(d1 + tail, s1 + tail, n - tail);
        return true;
    }
#endif
    bool a = kvt__copy_unfenced(dst0, src0, n, stream);
    return kvt__copy_unfenced(dst1, src1, n, stream) || a;
}

void kvt__copy_sum(void *dst, const void *src, size_t n, bool stream, XXH3_state_t *st) {
    uint8_t *d = dst;
    const uint8_t *s = src;
    for (size_t off = 0; off < n; off += KVT__SUM_BLOCK) {
        size_t len = n - off < KVT__SUM_BLOCK ? n - off : KVT__SUM_BLOCK;
        if (stream) stream_unfenced(d + off, s + off, len);
        else memcpy(d + off, s + off, len);
        kvt__sum_update(st, s + off, len); /* the source block, still in L1: the destination is not read */
    }
}
