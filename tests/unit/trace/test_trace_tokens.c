/* A trace block's tokens (src/trace/tokens.c) against their
 * definition, token j of block id = splitmix64(id << 9 | j) & 0x7fffffff,
 * computed here the plain way: for kvt_trace_block_tokens and for every way the
 * machine has (the scalar split everywhere; SSE4.1 and AVX-512 where the
 * machine has them), so that a way the machine would not pick is checked too. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "kvtier/rng.h"
#include "kvtier/trace.h"
#include "trace/trace-int.h"

#define G 0x9e3779b97f4a7c15ull

static int ways_run;

static void check_block(uint32_t id) {
    int32_t want[KVT_TRACE_BLOCK_TOKENS], got[KVT_TRACE_BLOCK_TOKENS];
    for (uint32_t j = 0; j < KVT_TRACE_BLOCK_TOKENS; j++) {
        uint64_t s = (uint64_t)id << 9 | j;
        want[j] = (int32_t)(kvt_splitmix64(&s) & 0x7fffffff);
    }
    for (int way = -1; way < KVT__TRACE_TOKENS_WAYS_; way++) { /* -1: the machine's pick */
        memset(got, 0xA5, sizeof(got));
        if (way < 0) kvt_trace_block_tokens(id, got);
        else if (!kvt__trace_block_tokens_way((kvt__trace_tokens_way_t)way, id, got)) continue;
        else ways_run |= 1 << way;
        for (uint32_t j = 0; j < KVT_TRACE_BLOCK_TOKENS; j++)
            cr_assert_eq(got[j], want[j], "way %d: block %u token %u: %d, want %d", way, id, j, got[j], want[j]);
    }
}

Test(trace_tokens, the_first_and_last_ids) {
    for (uint32_t id = 0; id < 2048; id++) check_block(id);
    for (uint32_t id = UINT32_MAX - 2047;; id++) {
        check_block(id);
        if (id == UINT32_MAX) break;
    }
}

Test(trace_tokens, random_ids) {
    uint64_t state = 7;
    for (int i = 0; i < 20000; i++) check_block((uint32_t)(kvt_splitmix64(&state) >> 32));
    cr_assert(ways_run & 1 << KVT__TRACE_TOKENS_SPLIT, "the split runs everywhere");
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
    __builtin_cpu_init(); /* a way the machine has is not skipped */
    if (__builtin_cpu_supports("sse4.1")) cr_assert(ways_run & 1 << KVT__TRACE_TOKENS_SSE41, "SSE4.1 here, its way not run");
    if (__builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        cr_assert(ways_run & 1 << KVT__TRACE_TOKENS_AVX512, "AVX-512 here, its way not run");
#endif
    cr_log_info("ways run: %#x\n", (unsigned)ways_run);
}

/* The split's runs end where z = (id << 9) + G + j wraps its low 10 bits (odd ids, at j = 491);
 * where that wrap also carries into bit 30, z >> 30 differs between the block's two runs. Every
 * such id below 2^32: z is 2^30 k - 491 at j = 0, for k over the 2^41 values z takes. */
Test(trace_tokens, a_carry_into_the_shifted_bits_within_a_block) {
    int crossings = 0;
    for (uint64_t k = G / (1ull << 30) + 1; k <= (G + (1ull << 41)) / (1ull << 30); k++) {
        uint64_t id = ((k << 30) - 491 - G) / 512;
        cr_assert_eq(id * 512 + G, (k << 30) - 491);
        if (id > UINT32_MAX) break;
        uint64_t z0 = ((uint64_t)id << 9) + G;
        crossings += (z0 >> 30) != ((z0 + KVT_TRACE_BLOCK_TOKENS - 1) >> 30);
        check_block((uint32_t)id);
    }
    cr_assert_geq(crossings, 2000, "only %d blocks crossed a 2^30 boundary", crossings);
}
