/* Private to cuda.c and cuda_copy.cu (and the kernels suite): the copy kernel's spans and its launch. */
#ifndef KVTIER_CUDA_COPY_INT_H
#define KVTIER_CUDA_COPY_INT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One copy the kernel makes: both addresses the device may dereference (its
 * own memory, or host memory this process registered). */
typedef struct kvt__cuda_span {
    void *dst;
    const void *src;
    size_t len;
} kvt__cuda_span_t;

/* Launches the copy of n spans (the array in device memory) on stream (a
 * cudaStream_t; void * keeps this header free of CUDA's, for the tests): 0,
 * or -1 when the launch failed. The copies are done when the stream reaches
 * what is recorded after. */
int kvt__cuda_copy_spans(const kvt__cuda_span_t *dev_spans, size_t n, void *stream);

/* Spans the kernel has copied in this process (cuda.c), for the tests. */
uint64_t kvt__cuda_kernel_spans(void);

#ifdef __cplusplus
}
#endif

#endif
