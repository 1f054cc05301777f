/* UCX (UCP) helpers shared by the ucx tier and the UCX page server
 * (src/sock/ucx-int.h): a context and worker, active-message handlers,
 * closing an endpoint. Empty without UCX. */
#include "ucx-int.h"

#ifdef KVT_HAVE_UCX
#include "kvtier/error.h"
#include "kvtier/stats.h"

int kvt__ucx_worker(ucp_context_h *ctx, ucp_worker_h *worker, ucs_thread_mode_t mode) {
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP};
    *ctx = NULL;
    *worker = NULL;
    if (ucp_init(&p, NULL, ctx) != UCS_OK) return KVT_EIO;
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE, .thread_mode = mode};
    if (ucp_worker_create(*ctx, &wp, worker) != UCS_OK) {
        ucp_cleanup(*ctx);
        *ctx = NULL;
        return KVT_EIO;
    }
    return KVT_OK;
}

int kvt__ucx_on(ucp_worker_h worker, unsigned id, ucp_am_recv_callback_t cb, void *arg) {
    ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                                               UCP_AM_HANDLER_PARAM_FIELD_ARG,
                                 .id = id, .cb = cb, .arg = arg};
    return ucp_worker_set_am_recv_handler(worker, &hp) == UCS_OK ? KVT_OK : KVT_EIO;
}

void kvt__ucx_fini(ucp_context_h ctx, ucp_worker_h worker) {
    if (worker) ucp_worker_destroy(worker);
    if (ctx) ucp_cleanup(ctx);
}

void kvt__ucx_close_ep(ucp_worker_h worker, ucp_ep_h ep) {
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_EP_CLOSE_FLAG_FORCE};
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
    if (r == NULL || UCS_PTR_IS_ERR(r)) return;
    uint64_t t0 = kvt_now_ns();
    while (ucp_request_check_status(r) == UCS_INPROGRESS && kvt_now_ns() - t0 < 2000000000ull) ucp_worker_progress(worker);
    ucp_request_free(r);
}
#else
typedef int kvt__no_ucx_t; /* an empty file is not ISO C */
#endif
