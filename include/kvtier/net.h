/* kvtier — the page server: the receiving end of `tcp` tiers.
 *
 * A process serves one of its tiers to writers in other processes: it
 * listens on host:port, checks each connection's hello against the tier's
 * geometry (a wrong page size is refused with a message, and the connection
 * closed), then receives each run straight into the tier and acknowledges it
 * once its bytes are in place. One thread per connection; a peer that sends
 * anything malformed is counted, logged in last_error, and disconnected —
 * the server goes on serving the others. The protocol: src/sock/wire.h,
 * docs/pd.md.
 *
 * Threads: create and destroy on one thread; the server runs its own
 * threads (an accept thread and one per connection, or the UCX progress
 * thread). kvt_net_server_port and kvt_net_server_stats may run on any
 * thread at any time; stats is also the read barrier described below.
 */
#ifndef KVTIER_NET_H
#define KVTIER_NET_H

#include "kvtier/export.h"

#include <stdbool.h>
#include <stdint.h>

#include "kvtier/tier.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvt_net_server kvt_net_server_t;

typedef enum kvt_net_transport {
    KVT_NET_TCP = 0, /* plain sockets: writers are `tcp` tiers */
    KVT_NET_UCX = 1  /* UCX active messages (UCP): writers are `ucx` tiers */
} kvt_net_transport_t;

/* True when this build has the UCX transport. */
KVT_API bool kvt_net_ucx_built(void);

/* Serves tier t (host-visible, one region, without per-page checksums:
 * runs land straight in its pages, whose sums would go stale) on host:port
 * (port 0: any free port). A writer's connection may idle between runs for
 * as long as it likes; one that stops in the middle of a run for 30 s
 * (TCP) is closed. KVT_EINVAL, KVT_ENOMEM, KVT_ENOTSUP (UCX not built),
 * KVT_EIO (cannot listen). */
KVT_API int kvt_net_server_create(kvt_net_server_t **out, kvt_net_transport_t tr, kvt_tier_t *t, const char *host,
                          uint16_t port);
/* From now on a writer's hello must carry `token` (its tier's
 * kvt_tier_config_t.token), or it is refused (counted in `refused`); 0 takes
 * any writer again. Set it before the port is given to anyone: a hello
 * checked before the call was checked without it. KVT_EINVAL for NULL. */
KVT_API int kvt_net_server_set_token(kvt_net_server_t *s, uint64_t token);
/* Stops accepting, closes every connection, joins the threads. */
KVT_API void kvt_net_server_destroy(kvt_net_server_t *s);
KVT_API uint16_t kvt_net_server_port(const kvt_net_server_t *s);

typedef struct kvt_net_server_stats {
    uint32_t size;          /* sizeof(kvt_net_server_stats_t), set by the caller */
    uint64_t connections;   /* accepted */
    uint64_t refused;       /* hellos refused, told why (a wrong version, token or geometry), and (UCX)
                             * connections refused with the table full of writers */
    uint64_t bad_peers;     /* connections closed for malformed data (a hello's wrong magic, a bad run), for no
                             * whole hello within 5 s, or for a run that stalled 30 s in the middle (TCP) */
    uint64_t awaiting_hello; /* gauge: connections accepted that have not yet sent a whole hello */
    uint64_t runs, bytes;   /* received and acknowledged */
    char last_error[128];
} kvt_net_server_stats_t;

/* Also the barrier for reading received pages on another thread: every run
 * acknowledged before this call is visible to the caller after it. */
KVT_API int kvt_net_server_stats(kvt_net_server_t *s, kvt_net_server_stats_t *st);

#ifdef __cplusplus
}
#endif
#endif
