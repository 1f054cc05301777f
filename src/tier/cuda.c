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
 * Or by the SMs: a copy engine pays a fixed cost a span, so a batch of many small
 * spans (scattered pages, or a layer_first tier's pieces) goes to the copy
 * kernel (cuda_copy.cu) instead: its spans are written to a page-locked
 * staging array, copied to the device in one DMA, and the kernel copies them,
 * one warp a span, reading and writing the registered host memory directly.
 * The kernel may only touch host memory this process registered and has not
 * unregistered since: the ranges are kept here (host_ranges), and a batch with
 * a span whose host side is outside them (memory someone else pinned, say)
 * goes by DMA, as does every batch on a device that cannot use the host's
 * pointers for registered memory (cudaDevAttrCanUseHostPointerForRegisteredMem).
 * Which way a batch goes:
 * KVT_TIER_COPY_DMA, KVT_TIER_COPY_KERNEL, or by its average span
 * (CUDA_COPY_MAX_AVG) where neither flag is set.
 *
 * The calls made on the caller's thread (open, close, read, write, register)
 * give its current device back, and a CUDA error kvtier met, tolerated or
 * reported as its own code, is not left in the thread's last error, where
 * the engine's next launch check (torch's) would take it for its own.
 *
 * Built when CMake finds the CUDA toolkit (KVT_CUDA=auto|on); without it the
 * ops below report KVT_ENOTSUP. Run by the kernels suite when a GPU exists.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "kvtier/error.h"
#include "tier-int.h"
#include "../core/mem-int.h"

#ifdef KVT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda-copy-int.h"

bool kvt_tier_cuda_built(void) { return true; }

/* A batch whose spans average at most this goes to the kernel (neither flag
 * set). Below it the kernel reaches more of the link than the copy engines;
 * at 1 MiB spans the two are level. A few large spans are the kernel's worst
 * case (a warp a span), so past this average the copy engines take them
 * (docs/performance.md, *A GPU L1*). */
#define CUDA_COPY_MAX_AVG (256u << 10)

/* The host memory this process registered (cuda_register_host), which the
 * kernel may read and write through the same pointers (unified addressing).
 * Process-wide, as registration is; a copy snapshots it under the lock. */
#define MAX_HOST_RANGES 64
static pthread_mutex_t host_mu = PTHREAD_MUTEX_INITIALIZER;
static kvt__region_t host_ranges[MAX_HOST_RANGES];
static size_t nhost_ranges;
static _Atomic uint64_t kernel_spans; /* spans the kernel copied, for the tests */

uint64_t kvt__cuda_kernel_spans(void) { return atomic_load(&kernel_spans); }

typedef struct cuda_ctx {
    cudaStream_t stream;
    cudaEvent_t done;
    void **dsts;
    const void **srcs;
    size_t *sizes;
    size_t cap;
    bool kernel_ok;              /* the device reads registered host memory through the host's pointers */
    kvt__cuda_span_t *kspans;    /* the kernel's spans: page-locked staging ... */
    kvt__cuda_span_t *dev_spans; /* ... and their copy on the device */
    size_t kcap;
} cuda_ctx_t;

/* The caller's thread as kvtier found it: its current device (-1: none to
 * give back), and whether an error of its own was pending. */
typedef struct caller {
    int device;
    bool pending;
} caller_t;

/* ... before any CUDA call of kvtier's. */
static caller_t caller_now(void) { return (caller_t){-1, cudaPeekAtLastError() != cudaSuccess}; }

/* On the caller's thread: the tier's device made current; false when it
 * cannot be. The caller's is given back when it differs. (A thread that
 * never chose one reads 0, and setting 0 back makes device 0's context,
 * which that thread's next CUDA call would make anyway; one that never
 * makes another pays it for nothing: the runtime API cannot tell.) */
static bool enter(int device, caller_t *was) {
    *was = caller_now();
    if (cudaGetDevice(&was->device) != cudaSuccess || was->device == device) was->device = -1;
    return cudaSetDevice(device) == cudaSuccess;
}

/* ... and left: the caller's device back, and no error of kvtier's left in
 * the thread's last error (one of the caller's, pending before, is left for
 * it to read). Returns rc. */
static int leave(caller_t was, int rc) {
    if (was.device >= 0) cudaSetDevice(was.device);
    if (!was.pending) (void)cudaGetLastError();
    return rc;
}

static int cuda_open(kvt_tier_t *t) {
    int n = 0;
    caller_t prev = caller_now(); /* (no device: nothing to give back) */
    if (cudaGetDeviceCount(&n) != cudaSuccess || t->cfg.device < 0 || t->cfg.device >= n) return leave(prev, KVT_ENOTSUP);
    if (!enter(t->cfg.device, &prev)) return leave(prev, KVT_ENOTSUP);
    void *p = NULL;
    if (cudaMalloc(&p, t->bytes) != cudaSuccess) return leave(prev, KVT_ENOMEM);
    t->base = p;
    return leave(prev, KVT_OK);
}

static void cuda_close(kvt_tier_t *t) {
    caller_t prev;
    enter(t->cfg.device, &prev);
    cudaFree(t->base);
    leave(prev, KVT_OK);
}

/* cudaMemcpy from pageable memory returns once the bytes are staged, the
 * DMA maybe still running on the legacy stream, which the workers' streams
 * (non-blocking) do not wait for: it is waited for here. */
static int cuda_write(kvt_tier_t *t, void *dst, const void *src, size_t len) {
    caller_t prev;
    if (!enter(t->cfg.device, &prev)) return leave(prev, KVT_EIO);
    bool ok = cudaMemcpy(dst, src, len, cudaMemcpyHostToDevice) == cudaSuccess &&
              cudaStreamSynchronize(cudaStreamLegacy) == cudaSuccess;
    return leave(prev, ok ? KVT_OK : KVT_EIO);
}

static int cuda_read(const kvt_tier_t *t, void *dst, const void *src, size_t len) {
    caller_t prev;
    if (!enter(t->cfg.device, &prev)) return leave(prev, KVT_EIO);
    bool ok = cudaMemcpy(dst, src, len, cudaMemcpyDeviceToHost) == cudaSuccess;
    return leave(prev, ok ? KVT_OK : KVT_EIO);
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
    int direct = 0;
    x->kernel_ok = !(t->cfg.flags & KVT_TIER_COPY_DMA) &&
                   cudaDeviceGetAttribute(&direct, cudaDevAttrCanUseHostPointerForRegisteredMem, t->cfg.device) == cudaSuccess &&
                   direct;
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
    cudaFreeHost(x->kspans);
    cudaFree(x->dev_spans);
    KVT_DELETE(x);
}

/* Room for n kernel spans (the previous batch is done: every copy ends synchronized). */
static bool kgrow(cuda_ctx_t *x, size_t n) {
    if (n <= x->kcap) return true;
    size_t cap = x->kcap ? x->kcap : 1024;
    while (cap < n) cap *= 2;
    kvt__cuda_span_t *h = NULL, *d = NULL;
    if (cudaMallocHost((void **)&h, cap * sizeof(*h)) != cudaSuccess) return (void)cudaGetLastError(), false;
    if (cudaMalloc((void **)&d, cap * sizeof(*d)) != cudaSuccess) { /* (the batch goes by DMA: not an error) */
        cudaFreeHost(h);
        (void)cudaGetLastError();
        return false;
    }
    cudaFreeHost(x->kspans);
    cudaFree(x->dev_spans);
    x->kspans = h;
    x->dev_spans = d;
    x->kcap = cap;
    return true;
}

static bool in_ranges(const kvt__region_t *r, size_t nr, const void *p, size_t len) {
    uintptr_t a = (uintptr_t)p;
    for (size_t i = 0; i < nr; i++)
        if (a >= (uintptr_t)r[i].p && a - (uintptr_t)r[i].p <= r[i].len && len <= r[i].len - (a - (uintptr_t)r[i].p)) return true;
    return false;
}

/* The kernel's way, where the batch may take it: every span with exactly one
 * side in registered host memory (the other is the GPU's), staged. */
static bool kernel_stage(cuda_ctx_t *x, const kvt__span_t *spans, size_t n) {
    kvt__region_t r[MAX_HOST_RANGES];
    pthread_mutex_lock(&host_mu);
    size_t nr = nhost_ranges;
    memcpy(r, host_ranges, nr * sizeof(r[0]));
    pthread_mutex_unlock(&host_mu);
    if (nr == 0 || !kgrow(x, n)) return false;
    for (size_t i = 0; i < n; i++) {
        bool s = in_ranges(r, nr, spans[i].src, spans[i].len), d = in_ranges(r, nr, spans[i].dst, spans[i].len);
        if (s == d) return false;
        x->kspans[i] = (kvt__cuda_span_t){spans[i].dst, spans[i].src, spans[i].len};
    }
    return true;
}

static bool wants_kernel(const kvt_tier_t *t, const kvt__span_t *spans, size_t n) {
    if (n < 2) return false;
    if (t->cfg.flags & KVT_TIER_COPY_KERNEL) return true;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += spans[i].len;
    return total / n <= CUDA_COPY_MAX_AVG;
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
    size_t by_kernel = 0;
    if (x->kernel_ok && wants_kernel(t, spans, n) && kernel_stage(x, spans, n)) {
        e = cudaMemcpyAsync(x->dev_spans, x->kspans, n * sizeof(kvt__cuda_span_t), cudaMemcpyHostToDevice, x->stream);
        if (e == cudaSuccess && kvt__cuda_copy_spans(x->dev_spans, n, (void *)x->stream) != 0) {
            /* not launched (no kernel image for this GPU: an architecture the build left out): the copy
             * engines take this batch, and every later one of this worker */
            (void)cudaGetLastError();
            x->kernel_ok = false;
        } else {
            by_kernel = n;
            n = 0; /* issued */
        }
    }
#if CUDART_VERSION >= 13000
    if (e == cudaSuccess && n > 1 && grow(x, n) == KVT_OK) {
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
        (void)cudaGetLastError();
        return KVT_EIO;
    }
    atomic_fetch_add(&kernel_spans, by_kernel);
    return KVT_OK;
}

static int cuda_register_host(kvt_tier_t *t, void *p, size_t len) {
    caller_t prev;
    if (!enter(t->cfg.device, &prev)) return leave(prev, KVT_EIO);
    cudaError_t e = cudaHostRegister(p, len, cudaHostRegisterDefault);
    if (e == cudaErrorHostMemoryAlreadyRegistered) return leave(prev, KVT_EEXIST); /* someone else's: not ours to unregister */
    if (e != cudaSuccess) return leave(prev, KVT_EIO);
    pthread_mutex_lock(&host_mu);
    if (nhost_ranges < MAX_HOST_RANGES) host_ranges[nhost_ranges++] = (kvt__region_t){p, len}; /* else: DMA for it */
    pthread_mutex_unlock(&host_mu);
    return leave(prev, KVT_OK);
}

static void cuda_unregister_host(kvt_tier_t *t, void *p) {
    pthread_mutex_lock(&host_mu); /* out of the kernel's reach before it is unpinned */
    for (size_t i = 0; i < nhost_ranges; i++)
        if (host_ranges[i].p == p) {
            host_ranges[i] = host_ranges[--nhost_ranges];
            break;
        }
    pthread_mutex_unlock(&host_mu);
    caller_t prev;
    enter(t->cfg.device, &prev);
    cudaHostUnregister(p);
    leave(prev, KVT_OK);
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
/* Whether every plane's memory is the tier's device's (or managed): the
 * copy kernel reads another GPU's only with peer access (else an illegal
 * address, which ends the CUDA context, the engine's with it), and a host
 * pointer is no GPU's at all. */
static bool on_device(const kvt_tier_t *t) {
    const kvt_tier_engine_t *e = t->cfg.engine;
    for (uint32_t i = 0; i < e->planes; i++) {
        const kvt_tier_plane_t *p = &e->plane[i];
        for (uint32_t l = 0; l < (p->layer_base ? t->cfg.geom.layers : 1); l++) {
            struct cudaPointerAttributes a;
            const void *ptr = p->layer_base ? p->layer_base[l] : p->base;
            if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess ||
                (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) || a.device != t->cfg.device)
                return false;
        }
    }
    return true;
}

static int engine_cuda_open(kvt_tier_t *t) {
    int n = 0;
    caller_t none = caller_now();
    if (cudaGetDeviceCount(&n) != cudaSuccess || t->cfg.device < 0 || t->cfg.device >= n) return leave(none, KVT_ENOTSUP);
    if (!on_device(t)) return leave(none, KVT_EINVAL);
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
