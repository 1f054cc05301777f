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
 * eight are no better than four below 1 MiB. That holds on some machines
 * only: on others four streams of non-temporal lines run far slower than
 * one. So the first transfer engine of the process (or its first long
 * copy) times both ways and keeps four only when clearly faster
 * (kvt__copy_init; KVT_COPY_STREAMS=1 or 4 decides instead). The figures
 * are in docs/performance.md, *Four streams of lines*.
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
 * *Short spans two at a time*). A pair whose stores would run just ahead of
 * its loads in the low 12 bits of their addresses goes down from its last
 * lines instead (pair_direction, below). */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "copy-int.h"
#include "kvtier/error.h"

/* Whether a long body goes as four quarters (else one stream of lines):
 * set once by choose_quarters, or by a test. */
static atomic_bool quarters_on;
static pthread_once_t quarters_once = PTHREAD_ONCE_INIT;
static int env_bad; /* KVT_COPY_STREAMS set to neither 1 nor 4 */

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

/* n a multiple of 64; four: as quarters when long enough. */
__attribute__((target("avx"))) static void stream_avx(uint8_t *d, const uint8_t *s, size_t n, bool four) {
    size_t q = four && n >= QUARTERS_MIN ? n / 4 & ~(size_t)63 : 0, i = 4 * q;
    for (size_t k = 0; k < q; k += 64) {
        line_avx(d + k, s + k);
        line_avx(d + q + k, s + q + k);
        line_avx(d + 2 * q + k, s + 2 * q + k);
        line_avx(d + 3 * q + k, s + 3 * q + k);
    }
    for (; i < n; i += 64) line_avx(d + i, s + i);
}

/* Two bodies of n bytes side by side, a line of each in turn (n a multiple
 * of 64, both destinations 64-aligned), from the first lines on or (down)
 * from the last. */
__attribute__((target("avx"))) static void stream2_avx(uint8_t *d0, const uint8_t *s0, uint8_t *d1, const uint8_t *s1,
                                                       size_t n, bool down) {
    for (size_t j = 0; j < n; j += 64) {
        size_t k = down ? n - 64 - j : j;
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

/* n a multiple of 64; four: as quarters when long enough. */
static void stream_sse2(uint8_t *d, const uint8_t *s, size_t n, bool four) {
    size_t q = four && n >= QUARTERS_MIN ? n / 4 & ~(size_t)63 : 0, i = 4 * q;
    for (size_t k = 0; k < q; k += 64)
        for (size_t w = 0; w < 4; w++) line_sse2(d + w * q + k, s + w * q + k);
    for (; i < n; i += 64) line_sse2(d + i, s + i);
}

static void stream2_sse2(uint8_t *d0, const uint8_t *s0, uint8_t *d1, const uint8_t *s1, size_t n, bool down) {
    for (size_t j = 0; j < n; j += 64) {
        size_t k = down ? n - 64 - j : j;
        line_sse2(d0 + k, s0 + k);
        line_sse2(d1 + k, s1 + k);
    }
}
#endif

#ifdef KVT__HAVE_STREAM
static void stream_body(uint8_t *d, const uint8_t *s, size_t n, bool four) {
    if (__builtin_cpu_supports("avx")) stream_avx(d, s, n, four);
    else stream_sse2(d, s, n, four);
}

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Four quarters when they stream 2 MiB from memory at least 10 % faster
 * than one stream does (the best of three rounds of each, taken in turn, the
 * source flushed from the caches before each: a few ms in all; what differs
 * is how the lines go to and come from DRAM, which 2 MiB shows as well as
 * 256). Else one stream, which is never the slow way by far; so too when the
 * buffers cannot be mapped. They are mapped apart from malloc, whose
 * thresholds a freed 4 MiB block would move for the whole process. */
static bool four_faster(void) {
    enum { N = 2 << 20, ROUNDS = 3 };
    uint8_t *buf = mmap(NULL, 2 * (size_t)N, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) return false;
    memset(buf, 1, 2 * (size_t)N); /* (faulted in before the clock starts) */
    double best[2] = {1e9, 1e9};
    for (int r = 0; r < ROUNDS; r++)
        for (int four = 0; four < 2; four++) {
            for (size_t i = 0; i < N; i += 64) _mm_clflush(buf + i);
            _mm_mfence();
            double t = seconds();
            stream_body(buf + N, buf, N, four);
            _mm_sfence();
            t = seconds() - t;
            if (t < best[four]) best[four] = t;
        }
    munmap(buf, 2 * (size_t)N);
    return best[1] * 1.1 < best[0];
}
#else
static bool four_faster(void) { return false; } /* (nothing streams) */
#endif

/* KVT_COPY_STREAMS's way, else the timed one. */
static void choose_quarters(void) {
    const char *env = getenv("KVT_COPY_STREAMS");
    env_bad = env != NULL && strcmp(env, "1") != 0 && strcmp(env, "4") != 0;
    atomic_store(&quarters_on, env != NULL ? !env_bad && env[0] == '4' : four_faster());
}

int kvt__copy_init(void) {
    pthread_once(&quarters_once, choose_quarters);
    return env_bad ? KVT_EINVAL : KVT_OK;
}

bool kvt__copy_quarters(void) {
    kvt__copy_init();
    return atomic_load_explicit(&quarters_on, memory_order_relaxed);
}

void kvt__copy_set_quarters(bool four) {
    kvt__copy_init();
    atomic_store(&quarters_on, four);
}

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
    stream_body(d, s, body, body >= QUARTERS_MIN && kvt__copy_quarters());
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

#ifdef KVT__HAVE_STREAM
/* Which way two spans go side by side: 0 up, 1 down, -1 not side by side.
 * A load whose address matches a store still in flight in its low 12 bits
 * waits for that store, and a streamed store is long in flight: two streams
 * going up whose stores run less than ALIAS_AHEAD bytes (mod 4 KiB) ahead
 * of a source they load from (a destination 64 bytes past a page boundary,
 * its source on one: a torch tensor's storage and a host tier's page) ran
 * many times slower on an AMD EPYC; going down they do not, but then a
 * store ALIAS_AHEAD behind stalls alike. */
#define ALIAS_AHEAD 1024
static int pair_direction(const uint8_t *d0, const uint8_t *s0, const uint8_t *d1, const uint8_t *s1) {
    const uint8_t *d[2] = {d0, d1}, *s[2] = {s0, s1};
    bool up = true, down = true;
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            size_t ahead = (size_t)((uintptr_t)d[i] - (uintptr_t)s[j]) & 4095;
            up &= ahead == 0 || ahead >= ALIAS_AHEAD;
            down &= ahead <= 4096 - ALIAS_AHEAD;
        }
    return up ? 0 : down ? 1 : -1;
}
#endif

bool kvt__copy_pair_unfenced(void *dst0, const void *src0, void *dst1, const void *src1, size_t n, bool stream) {
#ifdef KVT__HAVE_STREAM
    uint8_t *d0 = dst0, *d1 = dst1;
    const uint8_t *s0 = src0, *s1 = src1;
    size_t head = (size_t)(-(uintptr_t)d0 & 63);
    int way = -1;
    if (kvt__copy_pairs(n, stream) && head == (size_t)(-(uintptr_t)d1 & 63) && n >= head + 128 &&
        (way = pair_direction(d0 + head, s0 + head, d1 + head, s1 + head)) >= 0) {
        memcpy(d0, s0, head);
        memcpy(d1, s1, head);
        size_t body = (n - head) & ~(size_t)63, tail = head + body;
        if (__builtin_cpu_supports("avx")) stream2_avx(d0 + head, s0 + head, d1 + head, s1 + head, body, way);
        else stream2_sse2(d0 + head, s0 + head, d1 + head, s1 + head, body, way);
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
