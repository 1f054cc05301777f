/* The transfer engine's host copies (src/xfer/copy.c) against memcpy and
 * XXH3_64bits: the streaming copy byte for byte at odd sizes, unaligned
 * ends and both sides of the streaming thresholds, nothing written outside
 * the destination; the fused copy + checksum equal to a hash of what landed;
 * and the engine streaming into a checksummed host tier (runs of small
 * pages, pages past the threshold, a span past KVT__STREAM_HUGE each way), every byte and every recorded sum checked against the source.
 * Randomised: the seed is printed. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "xfer/copy-int.h"
#include "kvtier/error.h"
#include "kvtier/rng.h"
#include "kvtier/tier.h"
#include "kvtier/xfer.h"

#define GUARD 256

static void fill(kvt_rng_t *r, uint8_t *p, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = kvt_rng_next(r);
        memcpy(p + i, &v, 8);
    }
    for (; i < n; i++) p[i] = (uint8_t)kvt_rng_next(r);
}

/* Sizes around every edge the copy has: the body's 64-byte lines, the
 * 64-byte head, a body long enough to go as four quarters (16 KiB, with and without
 * a head, quarters of whole lines with lines left past them),
 * KVT__SUM_BLOCK, KVT__STREAM_MIN and KVT__STREAM_HUGE. */
static const size_t SIZES[] = {0, 1, 63, 64, 65, 127, 128, 129, 191, 255, 256, 1000, 4095, 4096, 16383, 16385,
                               16384 + 63, 16384 + 64 + 128, 16384 + 3 * 64 + 5, 2 * 16384 + 4096 + 200,
                               KVT__SUM_BLOCK * 3 + 17, KVT__STREAM_MIN - 1, KVT__STREAM_MIN, KVT__STREAM_MIN + 1,
                               KVT__STREAM_MIN + 4099, (1u << 20) + 77, KVT__STREAM_HUGE - 3, KVT__STREAM_HUGE + 129};
#define NSIZES (sizeof(SIZES) / sizeof(SIZES[0]))
static const size_t OFFS[] = {0, 1, 7, 16, 33, 63};
#define NOFFS (sizeof(OFFS) / sizeof(OFFS[0]))

typedef struct bufs {
    uint8_t *src, *dst, *want;
    size_t cap;
} bufs_t;

static void bufs_init(bufs_t *b, size_t n) {
    b->cap = (n + 2 * GUARD + 64 + 63) & ~(size_t)63; /* aligned_alloc: a multiple of the alignment */
    b->src = aligned_alloc(64, b->cap);
    b->dst = aligned_alloc(64, b->cap);
    b->want = aligned_alloc(64, b->cap);
    cr_assert(b->src && b->dst && b->want);
}

static void bufs_fini(bufs_t *b) {
    free(b->src);
    free(b->dst);
    free(b->want);
}

/* Checks dst against want over the whole buffer: the copy and the guards. */
static void check_same(const bufs_t *b, size_t n, size_t so, size_t dof, const char *what) {
    if (memcmp(b->dst, b->want, b->cap) == 0) return;
    size_t i = 0;
    while (b->dst[i] == b->want[i]) i++;
    cr_assert_fail("%s: n %zu, src +%zu, dst +%zu: first difference at byte %zd of the copy", what, n, so, dof,
                   (ssize_t)i - (ssize_t)(GUARD + dof));
}

typedef enum { VIA_STREAM, VIA_COPY_STREAMING, VIA_COPY_PLAIN } via_t;

static void copy_case(kvt_rng_t *r, bufs_t *b, size_t n, size_t so, size_t dof, via_t via) {
    uint8_t *s = b->src + GUARD + so, *d = b->dst + GUARD + dof;
    fill(r, b->src, b->cap);
    fill(r, b->dst, b->cap);
    memcpy(b->want, b->dst, b->cap);
    memcpy(b->want + GUARD + dof, s, n); /* the model: memcpy */
    if (via == VIA_STREAM) kvt__copy_stream(d, s, n);
    else kvt__copy(d, s, n, via == VIA_COPY_STREAMING);
    check_same(b, n, so, dof, via == VIA_STREAM ? "kvt__copy_stream" : "kvt__copy");
}

/* Both ways a long body streams (one stream of lines, four quarters), whichever
 * this machine chose. */
Test(xfer_copy, stream_matches_memcpy, .timeout = 60) {
    uint64_t seed = 0x5eed0001;
    fprintf(stderr, "xfer_copy/stream_matches_memcpy seed %" PRIu64 " (this machine streams %s)\n", seed,
            kvt__copy_quarters() ? "four quarters" : "one stream");
    kvt_rng_t r;
    kvt_rng_seed(&r, seed);
    for (int four = 0; four < 2; four++) {
        kvt__copy_set_quarters(four);
        for (size_t k = 0; k < NSIZES; k++) {
            bufs_t b;
            bufs_init(&b, SIZES[k]);
            bool big = SIZES[k] > (1u << 20); /* fewer offset pairs where each case is megabytes */
            for (size_t i = 0; i < NOFFS; i += big ? 3 : 1)
                for (size_t j = 0; j < NOFFS; j += big ? 2 : 1)
                    for (int via = 0; via < 3; via++) copy_case(&r, &b, SIZES[k], OFFS[i], OFFS[j], (via_t)via);
            bufs_fini(&b);
        }
    }
}

/* KVT_COPY_STREAMS decides instead of the timing (this test's process has
 * streamed nothing before: criterion runs each test in one of its own). */
Test(xfer_copy, the_environment_chooses_the_streams) {
    setenv("KVT_COPY_STREAMS", "4", 1);
    cr_assert(kvt__copy_quarters(), "KVT_COPY_STREAMS=4: four quarters");
    cr_assert_eq(kvt_xfer_copy_streams(), 4);
    kvt__copy_set_quarters(false);
    cr_assert_not(kvt__copy_quarters());
    cr_assert_eq(kvt_xfer_copy_streams(), 1);
}

/* A value the variable cannot hold refuses every transfer engine (nothing
 * says it was ignored otherwise); the copies stream as one. */
Test(xfer_copy, a_bad_streams_variable_is_refused) {
    setenv("KVT_COPY_STREAMS", "2", 1);
    kvt_tier_t *t[2];
    for (int i = 0; i < 2; i++) {
        kvt_tier_config_t tc = {.size = sizeof(tc), .kind = KVT_TIER_HOST, .name = "h", .geom = {4, 1, 4096, KVT_LAYOUT_PAGE_FIRST}};
        cr_assert_eq(kvt_tier_create(&t[i], &tc), KVT_OK);
    }
    kvt_xfer_config_t cfg;
    kvt_xfer_config_default(&cfg);
    kvt_xfer_t *x = NULL;
    cr_assert_eq(kvt_xfer_create(&x, &cfg, t, 2), KVT_EINVAL);
    cr_assert_null(x);
    cr_assert_eq(kvt_xfer_copy_streams(), 1);
    for (int i = 0; i < 2; i++) kvt_tier_destroy(t[i]);
}

/* Two copies side by side against two memcpys: both destinations checked
 * whole (guards too), at every size and offset pair; equal offsets against a
 * line take the side-by-side loop, unequal ones the copies one by one. The
 * two spans' bytes sit in one buffer each, the second GUARD + n past the
 * first. */
static void pair_case(kvt_rng_t *r, bufs_t *b, size_t n, size_t so, size_t dof0, size_t dof1, bool stream) {
    size_t gap = GUARD + n + 64;
    uint8_t *s0 = b->src + GUARD + so, *s1 = s0 + gap, *d0 = b->dst + GUARD + dof0, *d1 = b->dst + GUARD + gap + dof1;
    fill(r, b->src, b->cap);
    fill(r, b->dst, b->cap);
    memcpy(b->want, b->dst, b->cap);
    memcpy(b->want + GUARD + dof0, s0, n); /* the model: two memcpys */
    memcpy(b->want + GUARD + gap + dof1, s1, n);
    bool streamed = kvt__copy_pair_unfenced(d0, s0, d1, s1, n, stream);
    kvt__copy_fence();
    cr_assert_eq(streamed, kvt__copy_streams(n, stream), "n %zu, stream %d: streamed %d", n, stream, streamed);
    check_same(b, n, so, dof0, stream ? "kvt__copy_pair_unfenced, streaming" : "kvt__copy_pair_unfenced");
}

Test(xfer_copy, pair_matches_two_memcpys, .timeout = 60) {
    uint64_t seed = 0x5eed0003;
    fprintf(stderr, "xfer_copy/pair_matches_two_memcpys seed %" PRIu64 "\n", seed);
    kvt_rng_t r;
    kvt_rng_seed(&r, seed);
    static const size_t sizes[] = {0, 1, 100, 4095, KVT__STREAM_MIN, KVT__STREAM_MIN + 1, 8192, 8192 + 63, 16384,
                                   16384 + 129, KVT__PAIR_MAX - 1, KVT__PAIR_MAX, KVT__PAIR_MAX + 65};
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        bufs_t b;
        bufs_init(&b, 2 * (sizes[k] + GUARD + 64));
        for (size_t i = 0; i < NOFFS; i++)
            for (size_t j = 0; j < NOFFS; j++)
                for (int stream = 0; stream < 2; stream++) {
                    pair_case(&r, &b, sizes[k], OFFS[i], OFFS[j], OFFS[j], stream); /* side by side */
                    pair_case(&r, &b, sizes[k], OFFS[i], OFFS[j], OFFS[NOFFS - 1 - j], stream);
                }
        bufs_fini(&b);
    }
}

/* Pairs whose stores run just ahead of their loads (mod 4 KiB) go down
 * from their last lines, or one by one when no way suits both: every way
 * copies what two memcpys would, nothing outside. The spans' places are
 * chosen inside one buffer so that each way is taken. */
Test(xfer_copy, pairs_copy_alike_whichever_way_they_go) {
    enum { N = 16384 + 64, SPAN = 6 * 4096 }; /* each span in a slot of its own */
    static const size_t ahead[][2] = {{0, 0}, {64, 64}, {4032, 4032}, {64, 4032}, {1024, 2048}, {960, 3200}};
    uint8_t *buf = aligned_alloc(4096, 8 * SPAN), *want = aligned_alloc(4096, 8 * SPAN);
    cr_assert(buf && want);
    kvt_rng_t r;
    kvt_rng_seed(&r, 11);
    for (size_t k = 0; k < sizeof(ahead) / sizeof(ahead[0]); k++) {
        uint8_t *s0 = buf, *s1 = buf + SPAN; /* page-aligned sources; destinations ahead[k] past pages */
        uint8_t *d0 = buf + 2 * SPAN + ahead[k][0], *d1 = buf + 4 * SPAN + ahead[k][1];
        fill(&r, buf, 8 * SPAN);
        memcpy(want, buf, 8 * SPAN);
        memcpy(want + (d0 - buf), s0, N);
        memcpy(want + (d1 - buf), s1, N);
        cr_assert(kvt__copy_pair_unfenced(d0, s0, d1, s1, N, true));
        kvt__copy_fence();
        cr_assert(memcmp(buf, want, 8 * SPAN) == 0, "destinations %zu and %zu past a page: the bytes differ", ahead[k][0],
                  ahead[k][1]);
    }
    free(buf);
    free(want);
}

Test(xfer_copy, streams_by_the_thresholds) {
    cr_assert(!kvt__copy_streams(KVT__STREAM_MIN - 1, true));
    cr_assert(kvt__copy_streams(KVT__STREAM_MIN, true));
    cr_assert(!kvt__copy_streams(KVT__STREAM_MIN, false), "a pair that does not stream keeps memcpy");
    cr_assert(!kvt__copy_streams(KVT__STREAM_HUGE - 1, false));
    cr_assert(kvt__copy_streams(KVT__STREAM_HUGE, false), "a span past the cache streams anywhere");
    cr_assert(kvt__copy_pairs(KVT__STREAM_MIN, true));
    cr_assert(!kvt__copy_pairs(KVT__STREAM_MIN - 1, true), "too short to stream: one by one");
    cr_assert(!kvt__copy_pairs(KVT__PAIR_MAX, true), "long enough for its own quarters");
    cr_assert(!kvt__copy_pairs(8192, false), "a pair that does not stream keeps memcpy");
}

Test(xfer_copy, copy_sum_is_the_hash_of_the_destination, .timeout = 60) {
    uint64_t seed = 0x5eed0002;
    fprintf(stderr, "xfer_copy/copy_sum_is_the_hash_of_the_destination seed %" PRIu64 "\n", seed);
    kvt_rng_t r;
    kvt_rng_seed(&r, seed);
    for (size_t k = 0; k < 2 * NSIZES; k++) {
        size_t n = SIZES[k % NSIZES];
        kvt__copy_set_quarters(k >= NSIZES); /* each size both ways */
        bufs_t b;
        bufs_init(&b, n);
        for (size_t i = 0; i < NOFFS; i += n > (1u << 20) ? 5 : 1)
            for (int stream = 0; stream < 2; stream++) {
                size_t so = OFFS[i], dof = OFFS[NOFFS - 1 - i];
                uint8_t *s = b.src + GUARD + so, *d = b.dst + GUARD + dof;
                fill(&r, b.src, b.cap);
                fill(&r, b.dst, b.cap);
                memcpy(b.want, b.dst, b.cap);
                memcpy(b.want + GUARD + dof, s, n);
                XXH3_state_t st;
                XXH3_64bits_reset(&st);
                kvt__copy_sum(d, s, n, stream, &st);
                if (stream) kvt__copy_fence();
                check_same(&b, n, so, dof, stream ? "kvt__copy_sum, streaming" : "kvt__copy_sum");
                cr_assert_eq(XXH3_64bits_digest(&st), XXH3_64bits(d, n), "n %zu, stream %d: the sum is not the destination's", n, stream);
            }
        bufs_fini(&b);
    }
}

/* Two pages in one state: a page's sum is the stream of its blocks, so a
 * state fed twice is the hash of both halves together. */
Test(xfer_copy, copy_sum_streams_across_calls) {
    size_t n = KVT__SUM_BLOCK * 2 + 300;
    uint8_t *s = malloc(2 * n), *d = malloc(2 * n);
    kvt_rng_t r;
    kvt_rng_seed(&r, 7);
    fill(&r, s, 2 * n);
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    kvt__copy_sum(d, s, n, true, &st);
    kvt__copy_sum(d + n, s + n, n, false, &st);
    kvt__copy_fence();
    cr_assert_eq(memcmp(d, s, 2 * n), 0);
    cr_assert_eq(XXH3_64bits_digest(&st), XXH3_64bits(s, 2 * n));
    free(s);
    free(d);
}

/* ---- through the engine: L1 arena <-> L2 host with checksums ---- */

static kvt_tier_t *tier(kvt_tier_kind_t kind, uint64_t pages, uint64_t page_bytes, uint32_t flags, const char *name) {
    kvt_tier_config_t c = {.size = sizeof(c), .kind = kind, .geom = {pages, 1, page_bytes, KVT_LAYOUT_PAGE_FIRST},
                           .name = name, .flags = flags};
    kvt_tier_t *t = NULL;
    cr_assert_eq(kvt_tier_create(&t, &c), KVT_OK);
    return t;
}

static void one(kvt_xfer_t *x, unsigned src, unsigned dst, const kvt_xfer_copy_t *c, size_t n) {
    cr_assert_eq(kvt_xfer_submit(x, src, dst, c, n, 0, NULL), KVT_OK);
    kvt_xfer_done_t d;
    int got;
    while ((got = kvt_xfer_poll(x, &d, 1, 1000000000ull)) == 0) {
    }
    cr_assert_eq(got, 1);
    cr_assert_eq(d.status, KVT_OK, "%s", kvt_err_name(d.status));
}

/* Copies c[0..n) from tier s to tier d and checks every destination page
 * against its source page, and (where d keeps them) its recorded sum
 * against XXH3 of the source page. */
static void copy_check(kvt_xfer_t *x, kvt_tier_t *const *t, unsigned s, unsigned d, const kvt_xfer_copy_t *c, size_t n,
                       uint64_t pb) {
    one(x, s, d, c, n);
    uint64_t *sums = kvt_tier_sums(t[d]);
    for (size_t i = 0; i < n; i++) {
        const void *sp = kvt_tier_addr(t[s], c[i].src_page, 0), *dp = kvt_tier_addr(t[d], c[i].dst_page, 0);
        cr_assert_eq(memcmp(dp, sp, pb), 0, "%u -> %u: page %u -> %u", s, d, c[i].src_page, c[i].dst_page);
        if (sums) cr_assert_eq(sums[c[i].dst_page], XXH3_64bits(sp, pb), "%u -> %u: the sum of page %u", s, d, c[i].dst_page);
    }
}

static void engine_case(uint64_t pb, uint64_t pages, uint64_t seed) {
    fprintf(stderr, "xfer_copy engine: %" PRIu64 " pages of %" PRIu64 " B, seed %" PRIu64 "\n", pages, pb, seed);
    kvt_tier_t *t[2] = {tier(KVT_TIER_ARENA, pages, pb, 0, "l1"), tier(KVT_TIER_HOST, pages, pb, KVT_TIER_CHECKSUM, "l2")};
    kvt_xfer_config_t xc;
    kvt_xfer_config_default(&xc);
    xc.threads = 2;
    kvt_xfer_t *x = NULL;
    cr_assert_eq(kvt_xfer_create(&x, &xc, t, 2), KVT_OK);
    kvt_rng_t r;
    kvt_rng_seed(&r, seed);
    for (unsigned k = 0; k < 2; k++) fill(&r, kvt_tier_addr(t[k], 0, 0), pages * pb);
    kvt_xfer_copy_t *c = calloc(pages, sizeof(*c));
    size_t n = 0;
    /* d2h: one long run (streams), then singletons (a page each) in the upper half */
    uint64_t half = pages / 2;
    for (uint64_t p = 0; p < half; p++) c[n++] = (kvt_xfer_copy_t){(uint32_t)p, (uint32_t)p};
    for (uint64_t p = half; p + 1 < pages; p += 2) c[n++] = (kvt_xfer_copy_t){(uint32_t)p, (uint32_t)(pages - 1 - (p - half))};
    copy_check(x, t, 0, 1, c, n, pb);
    /* h2d: what landed in L2 back to where it came from (the only L2 pages with sums), the first quarter
       reversed (pages), the rest of the first half one run */
    for (size_t i = 0; i < n; i++) {
        uint32_t from = c[i].dst_page, to = i < pages / 4 ? (uint32_t)(pages / 4 - 1 - i) : c[i].src_page;
        c[i] = (kvt_xfer_copy_t){from, to};
    }
    fill(&r, kvt_tier_addr(t[0], 0, 0), pages * pb);
    copy_check(x, t, 1, 0, c, n, pb);
    free(c);
    kvt_xfer_destroy(x);
    kvt_tier_destroy(t[0]);
    kvt_tier_destroy(t[1]);
}

Test(xfer_copy, engine_runs_of_small_pages_stream, .timeout = 60) { engine_case(16384, 64, 11); }
Test(xfer_copy, engine_odd_pages_past_the_threshold, .timeout = 60) { engine_case(KVT__STREAM_MIN + 192, 16, 12); }
Test(xfer_copy, engine_a_span_past_huge, .timeout = 60) { engine_case(1u << 20, 40, 13); }

/* ---- through the engine: separate K and V planes <-> a host tier, no checksums ---- */

/* An engine tier over kv (K plane: pages x k bytes, then V plane: pages x v)
 * and a page_first host tier of k + v bytes a page: a page is two spans each
 * way, never a run on the host side. A batch of pages copies in both
 * directions, checked byte for byte against the planes' arithmetic: every
 * span of a big batch streams (past KVT__STREAM_HUGE), spans of one length go
 * two at a time, and odd lengths put the two destinations of a pair at
 * different offsets against a line. */
static void kv_case(uint64_t k, uint64_t v, uint32_t pages, uint32_t ncopies, uint64_t seed) {
    fprintf(stderr, "xfer_copy kv: %u pages of K %" PRIu64 " + V %" PRIu64 " B, %u copies, seed %" PRIu64 "\n", pages, k,
            v, ncopies, seed);
    uint64_t pb = k + v;
    uint8_t *kv = malloc((size_t)pages * pb);
    cr_assert(kv);
    kvt_tier_engine_t e = {.size = sizeof(e), .planes = 2};
    e.plane[0] = (kvt_tier_plane_t){.base = kv, .piece_bytes = k, .page_stride = k};
    e.plane[1] = (kvt_tier_plane_t){.base = kv + (size_t)pages * k, .piece_bytes = v, .page_stride = v};
    kvt_tier_config_t ce = {.size = sizeof(ce), .kind = KVT_TIER_ENGINE, .geom = {pages, 1, 0, KVT_LAYOUT_PAGE_FIRST},
                            .name = "kv", .engine = &e};
    kvt_tier_t *t[2] = {NULL, tier(KVT_TIER_HOST, pages, pb, 0, "l2")};
    cr_assert_eq(kvt_tier_create(&t[0], &ce), KVT_OK);
    kvt_xfer_config_t xc;
    kvt_xfer_config_default(&xc);
    xc.checksum = false;
    kvt_xfer_t *x = NULL;
    cr_assert_eq(kvt_xfer_create(&x, &xc, t, 2), KVT_OK);
    kvt_rng_t r;
    kvt_rng_seed(&r, seed);
    uint8_t *host = kvt_tier_addr(t[1], 0, 0);
    kvt_xfer_copy_t *c = calloc(ncopies, sizeof(*c));
    uint32_t *perm = malloc(pages * sizeof(*perm));
    for (int dir = 0; dir < 2; dir++) {
        fill(&r, kv, (size_t)pages * pb);
        fill(&r, host, (size_t)pages * pb);
        for (uint32_t i = 0; i < pages; i++) perm[i] = i;
        for (uint32_t i = pages; i > 10; i--) { /* destinations: pages 0..8 in place (a run), the rest shuffled */
            uint32_t j = 9 + (uint32_t)(kvt_rng_next(&r) % (i - 9)), tmp = perm[i - 1];
            perm[i - 1] = perm[j];
            perm[j] = tmp;
        }
        for (uint32_t i = 0; i < ncopies; i++) c[i] = (kvt_xfer_copy_t){i, perm[i]};
        uint8_t *want_kv = malloc((size_t)pages * pb), *want_host = malloc((size_t)pages * pb);
        memcpy(want_kv, kv, (size_t)pages * pb);
        memcpy(want_host, host, (size_t)pages * pb);
        for (uint32_t i = 0; i < ncopies; i++) { /* the model: page p is K at kv + p k, V at kv + pages k + p v */
            uint32_t sp = c[i].src_page, dp = c[i].dst_page;
            if (dir == 0) {
                memcpy(want_host + (size_t)dp * pb, kv + (size_t)sp * k, k);
                memcpy(want_host + (size_t)dp * pb + k, kv + (size_t)pages * k + (size_t)sp * v, v);
            } else {
                memcpy(want_kv + (size_t)dp * k, host + (size_t)sp * pb, k);
                memcpy(want_kv + (size_t)pages * k + (size_t)dp * v, host + (size_t)sp * pb + k, v);
            }
        }
        one(x, dir == 0 ? 0 : 1, dir == 0 ? 1 : 0, c, ncopies);
        cr_assert_eq(memcmp(host, want_host, (size_t)pages * pb), 0, "dir %d: the host tier", dir);
        cr_assert_eq(memcmp(kv, want_kv, (size_t)pages * pb), 0, "dir %d: the K and V planes", dir);
        free(want_kv);
        free(want_host);
    }
    free(perm);
    free(c);
    kvt_xfer_destroy(x);
    kvt_tier_destroy(t[0]);
    kvt_tier_destroy(t[1]);
    free(kv);
}

Test(xfer_copy, kv_planes_big_batch_streams_in_pairs, .timeout = 60) { kv_case(8192, 8192, 1100, 1100, 21); }
Test(xfer_copy, kv_planes_odd_halves_big_batch, .timeout = 60) { kv_case(8192 + 40, 8192 - 40 + 7, 1100, 1100, 22); }
Test(xfer_copy, kv_planes_small_batch, .timeout = 60) { kv_case(8192, 8192, 300, 200, 23); }
