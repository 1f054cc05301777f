/* UCX (UCP) pieces shared by the ucx tier (the writer, src/tier/ucx.c) and
 * the UCX page server (src/net/ucx_server.c). Active message ids:
 *
 *   HELLO  writer -> server  header: kvt__wire_hello_t, no data
 *   REPLY  server -> writer  header: kvt__wire_reply_t
 *   DATA   writer -> server  header: kvt__wire_data_t, data: the run (eager
 *                            or rendezvous; received straight into place)
 *   ACK    server -> writer  header: u64 len, once the run is in the tier
 *
 * Every writer message asks for a reply endpoint (UCP_AM_SEND_FLAG_REPLY).
 */
#ifndef KVTIER_SOCK_UCX_INT_H
#define KVTIER_SOCK_UCX_INT_H

#ifdef KVT_HAVE_UCX
#include <ucp/api/ucp.h>

enum { KVT_UCX_AM_HELLO = 10, KVT_UCX_AM_REPLY = 11, KVT_UCX_AM_DATA = 12, KVT_UCX_AM_ACK = 13 };

/* A context with active messages and wake-up, and one worker. KVT_EIO. */
int kvt__ucx_worker(ucp_context_h *ctx, ucp_worker_h *worker, ucs_thread_mode_t mode);
void kvt__ucx_fini(ucp_context_h ctx, ucp_worker_h worker);
/* Sets the handler of active message `id`. KVT_EIO. */
int kvt__ucx_on(ucp_worker_h worker, unsigned id, ucp_am_recv_callback_t cb, void *arg);
/* Closes an endpoint, progressing the worker until it is closed. */
void kvt__ucx_close_ep(ucp_worker_h worker, ucp_ep_h ep);
#endif

#endif
