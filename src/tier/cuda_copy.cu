/* The cuda tier's copy kernel: many small spans between GPU memory and host
 * memory mapped into the device's address space (page-locked by
 * cudaHostRegister: under unified addressing the host pointer is the device
 * one), copied by the SMs instead of the copy engines.
 *
 * Why: a copy engine pays a fixed cost a span, so scattered pieces of a few
 * KiB reach a small part of the PCIe link through cudaMemcpyBatchAsync
 * (docs/performance.md, *A GPU L1*); SM threads keep thousands of loads and
 * stores in flight at once across the link, whatever the spans' sizes.
 * cuda.c decides which path a batch takes (CUDA_COPY_MAX_AVG; the tier flags
 * KVT_TIER_COPY_DMA and KVT_TIER_COPY_KERNEL).
 *
 * One warp a span, spans strided over the grid. A span whose ends and length
 * are 16-byte aligned moves 16 bytes a lane, four loads in flight before the
 * stores (2 KiB a warp a step); any other is copied a byte a lane.
 */
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "cuda-copy-int.h"

static __global__ void copy_spans(const kvt__cuda_span_t *sp, size_t n) {
    const unsigned lane = threadIdx.x & 31u, warps = blockDim.x >> 5;
    const size_t stride = (size_t)gridDim.x * warps;
    for (size_t w = (size_t)blockIdx.x * warps + (threadIdx.x >> 5); w < n; w += stride) {
        char *d = (char *)sp[w].dst;
        const char *s = (const char *)sp[w].src;
        const size_t len = sp[w].len;
        if ((((uintptr_t)d | (uintptr_t)s | (uintptr_t)len) & 15u) == 0) {
            uint4 *d4 = (uint4 *)d;
            const uint4 *s4 = (const uint4 *)s;
            const size_t m = len >> 4;
            size_t i = lane;
            for (; i + 96 < m; i += 128) {
                uint4 a = s4[i], b = s4[i + 32], c = s4[i + 64], e = s4[i + 96];
                d4[i] = a;
                d4[i + 32] = b;
                d4[i + 64] = c;
                d4[i + 96] = e;
            }
            for (; i < m; i += 32) d4[i] = s4[i];
        } else {
            for (size_t i = lane; i < len; i += 32) d[i] = s[i];
        }
    }
}

extern "C" int kvt__cuda_copy_spans(const kvt__cuda_span_t *dev_spans, size_t n, void *stream) {
    if (n == 0) return 0;
    const unsigned threads = 256, warps = threads / 32;
    size_t blocks = (n + warps - 1) / warps;
    if (blocks > 4096) blocks = 4096; /* the rest by striding: ~30 blocks an SM is already the most that run */
    (void)cudaGetLastError(); /* an earlier call's error would be read as this launch's */
    copy_spans<<<(unsigned)blocks, threads, 0, (cudaStream_t)stream>>>(dev_spans, n);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}
