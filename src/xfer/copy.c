/* The host copy of one span: ordinary or streaming stores, and the fused
 * copy + XXH3 (see copy-int.h).
 *
 * Streaming copy of n bytes:
 *
 *   dst  |head|====== 128-byte iterations, dst 64-aligned =====|tail|
 *         memcpy   loadu x4 from src, stream x4 to dst            memcpy
 *                                                           then sfence
 *
 * Loads are unaligned (src keeps whatever offset it has against dst); the
 * stores are aligned, whole cache lines, so each line leaves the
 * write-combining buffer once. */
#include <stdint.h>
#include <string.h>

#include "copy-int.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define KVT__HAVE_STREAM 1

__attribute__((target("avx"))) static void stream_avx(uint8_t *d, const uint8_t *s, size_t n) {
    for (; n >= 128; n -= 128, s += 128, d += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)s), b = _mm256_loadu_si256((const __m256i *)(s + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(s + 64)), e = _mm256_loadu_si256((const __m256i *)(s + 96));
        _mm256_stream_si256((__m256i *)d, a);
        _mm256_stream_si256((__m256i *)(d + 32), b);
        _mm256_stream_si256((__m256i *)(d + 64), c);
        _mm256_stream_si256((__m256i *)(d + 96), e);
    }
}

static void stream_sse2(uint8_t *d, const uint8_t *s, size_t n) {
    for (; n >= 128; n -= 128, s += 128, d += 128)
        for (int k = 0; k < 128; k += 32) {
            __m128i a = _mm_loadu_si128((const __m128i *)(s + k)), b = _mm_loadu_si128((const __m128i *)(s + k + 16));
            _mm_stream_si128((__m128i *)(d + k), a);
            _mm_stream_si128((__m128i *)(d + k + 16), b);
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
    size_t body = n & ~(size_t)127;
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
    if (kvt__copy_streams(n, stream)) kvt__copy_stream(dst, src, n);
    else memcpy(dst, src, n);
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
