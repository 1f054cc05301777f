/* L1 `cuda`: GPU memory from cudaMalloc.
 *
 * Every transfer-engine worker opens its own context: a non-blocking stream
 * and an event. A batch of spans is issued on the worker's stream — with
 * cudaMemcpyBatchAsync where the runtime has it (CUDA 13), else one
 * cudaMemcpyAsync per span — then an event is recorded and waited for, so a
 * batch returns only once every byte is in place. Directions come from
 * unified addressing (cudaMemcpyDefault). Host memory the engine copies to or
 * from is registered (cudaHostRegister) so copies are true DMA.
 *
 * Built when CMake finds the CUDA toolkit (KVT_CUDA=auto|on); without it the
 * ops below report KVT_ENOTSUP. Run by the kernels suite when a GPU exists.
 */
#include <string.h>

#include "kvtier/error.h"
#include "tier-int.h"
#include "../core/mem-int.h"

#ifdef KVT_HAVE_CUDA
#include <cuda_runtime_api.h>

bool kvt_tier_cuda_built(void) { return true; }

typedef struct cuda_ctx {
    cudaStream_t stream;
    cudaEvent_t done;
    void **dsts;
    const void **srcs;
    size_t *sizes;
    size_t cap;
} cuda_ctx_t;

static int cuda_open(kvt_tier_t *t) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || t->cfg.device < 0 || t->cfg.device >= n) return KVT_ENOTSUP;
    if (cudaSetDevice(t->cfg.device) != cudaSuccess) return KVT_ENOTSUP;
    void *p = NULL;
    if (cudaMalloc(&p, t->bytes) != cudaSuccess) return KVT_ENOMEM;
    t->base = p;
    return KVT_OK;
}

static void cuda_close(kvt_tier_t *t) {
    cudaSetDevice(t->cfg.device);
    cudaFree(t->base);
}

static int cuda_write(kvt_tier_t *t, void *dst, const void *src, size_t len) {
    if (cudaSetDevice(t->cfg.device) != cudaSuccess) return KVT_EIO;
    return cudaMemcpy(dst, src, len, cudaMemcpyHostToDevice) == cudaSuccess ? KVT_OK : KVT_EIO;
}

static int cuda_read(const kvt_tier_t *t, void *dst, const void *src, size_t len) {
    if (cudaSetDevice(t->cfg.device) != cudaSuccess) return KVT_EIO;
    return cudaMemcpy(dst, src, len, cudaMemcpyDeviceToHost) == cudaSuccess ? KVT_OK : KVT_EIO;
}

static int cuda_ctx_open(kvt_tier_t *t, void **out) {
    cuda_ctx_t *x = KVT_NEW(cuda_ctx_t);
    if (x == NULL) return KVT_ENOMEM;
    if (cudaSetDevice(t->cfg.device) != cudaSuccess ||
        cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking) != cudaSuccess) {
        KVT_DELETE(x);
        return KVT_EIO;
    }
    if (cudaEventCreateWithFlags(&x->done, cudaEventDisableTiming) != cudaSuccess) {
        cudaStreamDestroy(x->stream);
        KVT_DELETE(x);
        return KVT_EIO;
    }
    *out = x;
    return KVT_OK;
}

static void cuda_ctx_close(kvt_tier_t *t, void *ctx) {
    (void)t;
    cuda_ctx_t *x = ctx;
    cudaEventDestroy(x->done);
    cudaStreamDestroy(x->stream);
    kvt__free(x->dsts, x->cap * sizeof(void *));
    kvt__free(x->srcs, x->cap * sizeof(void *));
    kvt__free(x->sizes, x->cap * sizeof(size_t));
    KVT_DELETE(x);
}

#if CUDART_VERSION >= 13000
static int grow(cuda_ctx_t *x, size_t n) {
    if (n <= x->cap) return KVT_OK;
    void **d = kvt__malloc(n * sizeof(void *));
    const void **s = kvt__malloc(n * sizeof(void *));
    size_t *z = kvt__malloc(n * sizeof(size_t));
    if (d == NULL || s == NULL || z == NULL) {
        kvt__free(d, n * sizeof(void *));
        kvt__free((void *)s, n * sizeof(void *));
        kvt__free(z, n * sizeof(size_t));
        return KVT_ENOMEM;
    }
    kvt__free(x->dsts, x->cap * sizeof(void *));
    kvt__free((void *)x->srcs, x->cap * sizeof(void *));
    kvt__free(x->sizes, x->cap * sizeof(size_t));
    x->dsts = d;
    x->srcs = s;
    x->sizes = z;
    x->cap = n;
    return KVT_OK;
}
#endif

static int cuda_copy(kvt_tier_t *t, void *ctx, const kvt__span_t *spans, size_t n) {
    cuda_ctx_t *x = ctx;
    if (cudaSetDevice(t->cfg.device) != cudaSuccess) return KVT_EIO;
    cudaError_t e = cudaSuccess;
#if CUDART_VERSION >= 13000
    if (n > 1 && grow(x, n) == KVT_OK) {
        for (size_t i = 0; i < n; i++) {
            x->dsts[i] = spans[i].dst;
            x->srcs[i] = spans[i].src;
            x->sizes[i] = spans[i].len;
        }
        struct cudaMemcpyAttributes attr;
        memset(&attr, 0, sizeof(attr));
        attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        size_t idx0 = 0;
        e = cudaMemcpyBatchAsync(x->dsts, x->srcs, x->sizes, n, &attr, &idx0, 1, x->stream);
        n = 0; /* issued */
    }
#endif
    for (size_t i = 0; i < n && e == cudaSuccess; i++)
        e = cudaMemcpyAsync(spans[i].dst, spans[i].src, spans[i].len, cudaMemcpyDefault, x->stream);
    if (e == cudaSuccess) e = cudaEventRecord(x->done, x->stream);
    if (e == cudaSuccess) e = cudaEventSynchronize(x->done);
    if (e != cudaSuccess) {
        cudaStreamSynchronize(x->stream); /* nothing may still be writing when we report */
        return KVT_EIO;
    }
    return KVT_OK;
}

static int cuda_register_host(kvt_tier_t *t, void *p, size_t len) {
    if (cudaSetDevice(t->cfg.device) != cudaSuccess) return KVT_EIO;
    cudaError_t e = cudaHostRegister(p, len, cudaHostRegisterDefault);
    if (e == cudaErrorHostMemoryAlreadyRegistered) return KVT_EEXIST; /* someone else's: not ours to unregister */
    return e == cudaSuccess ? KVT_OK : KVT_EIO;
}

static void cuda_unregister_host(kvt_tier_t *t, void *p) {
    cudaSetDevice(t->cfg.device);
    cudaHostUnregister(p);
}

const kvt__tier_ops_t kvt__tier_cuda_ops = {
    .name = "cuda",
    .host_visible = false,
    .open = cuda_open,
    .close = cuda_close,
    .write = cuda_write,
    .read = cuda_read,
    .ctx_open = cuda_ctx_open,
    .ctx_close = cuda_ctx_close,
    .copy = cuda_copy,
    .register_host = cuda_register_host,
    .unregister_host = cuda_unregister_host,
};

/* An engine tier on device memory: the engine's cudaMalloc'ed (or torch's)
 * buffers, addressed by engine.c's planes, copied like the cuda tier's. */
static int engine_cuda_open(kvt_tier_t *t) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || t->cfg.device < 0 || t->cfg.device >= n) return KVT_ENOTSUP;
    return kvt__engine_open(t);
}

const kvt__tier_ops_t kvt__tier_engine_cuda_ops = {
    .name = "engine",
    .host_visible = false,
    .open = engine_cuda_open,
    .close = kvt__engine_close,
    .write = cuda_write,
    .read = cuda_read,
    .ctx_open = cuda_ctx_open,
    .ctx_close = cuda_ctx_close,
    .copy = cuda_copy,
    .register_host = cuda_register_host,
    .unregister_host = cuda_unregister_host,
};

#else /* no CUDA in this build */

bool kvt_tier_cuda_built(void) { return false; }

static int cuda_open(kvt_tier_t *t) {
    (void)t;
    return KVT_ENOTSUP;
}

static void cuda_close(kvt_tier_t *t) { (void)t; }

const kvt__tier_ops_t kvt__tier_cuda_ops = {
    .name = "cuda",
    .host_visible = false,
    .open = cuda_open,
    .close = cuda_close,
};

const kvt__tier_ops_t kvt__tier_engine_cuda_ops = {
    .name = "engine",
    .host_visible = false,
    .open = cuda_open, /* KVT_ENOTSUP */
    .close = cuda_close,
};
#endif
