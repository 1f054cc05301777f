/* Private to the page servers: one backend per transport behind a small
 * table (server.c: tcp; ucx_server.c: UCX). They reach the tier through its
 * public API only: the region [base, base + bytes) of a host-visible tier,
 * taken at create. */
#ifndef KVTIER_NET_INT_H
#define KVTIER_NET_INT_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "kvtier/net.h"
#include "kvtier/tier.h"
#include "../sock/wire.h"

typedef struct sconn sconn_t;

/* A transport: start listens on a (port 0: any) and sets s->port, or fails
 * with nothing left; stop undoes start, joining its threads. */
typedef struct kvt__server_ops {
    const char *name;
    int (*start)(kvt_net_server_t *s, const struct sockaddr_in *a);
    void (*stop)(kvt_net_server_t *s);
} kvt__server_ops_t;

extern const kvt__server_ops_t kvt__server_tcp_ops;
extern const kvt__server_ops_t kvt__server_ucx_ops; /* KVT_ENOTSUP without UCX */

struct kvt_net_server {
    kvt_tier_t *t;
    uint8_t *base;   /* the tier's bytes: page 0, layer 0 */
    uint64_t bytes;  /* how many, contiguous */
    kvt_geom_t geom;
    const kvt__server_ops_t *ops;
    kvt_net_transport_t tr;
    int lfd;
    uint16_t port;
    pthread_t accept_th;
    pthread_mutex_t mu;
    bool stopping;
    sconn_t *conns;
    uint32_t greeting; /* connections in their hello and not cut (server.c's MAX_GREETING) */
    void *ucx;         /* the UCX server's state */
    kvt_net_server_stats_t st;
    _Atomic uint64_t token; /* kvt_net_server_set_token; 0: none asked */
    _Atomic uint32_t writers; /* kvt__net_set_writers: hellos may name writer 0..writers-1 */
    uint64_t barred;          /* kvt__net_bar: writers refused from now on (under mu) */
};

/* Counts (counter may be NULL) and records an error, under s->mu. */
void kvt__net_note(kvt_net_server_t *s, uint64_t *counter, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A run received and in the tier: counted before it is acknowledged. */
void kvt__net_count(kvt_net_server_t *s, uint64_t len);
/* A writer's hello (len bytes) against the tier: 0 accepted, 1 refused (a
 * wrong geometry: *r says why), -1 not a kvtier peer. Counts and notes. */
int kvt__net_check_hello(kvt_net_server_t *s, const kvt__wire_hello_t *h, size_t len, kvt__wire_reply_t *r);
/* One connection, from its hello to its end: the hello checked and
 * answered, then runs received into the tier and acknowledged, until EOF,
 * an error or a malformed run (which closes it: the caller shuts fd down).
 * *writer (may be NULL), under s->mu: the writer its hello named, -1 for
 * none, once it ends. What the tcp server's connection threads run; the
 * fuzz target drives it on a socketpair. */
void kvt__net_serve_conn(kvt_net_server_t *s, int fd, int *writer);
/* A group of n writers, each saying kvt__wire_writer_token(token, w) (the
 * group's token still takes a writer of no name). PD decode: its ranks. */
void kvt__net_set_writers(kvt_net_server_t *s, uint32_t n);
/* Cuts writer w's connections and waits (up to 2 s) until none of them
 * can write another byte into the tier: what a writer that died had in
 * flight lands before this returns, or never. tcp only (a UCX server's
 * writers are not told apart). */
void kvt__net_fence(kvt_net_server_t *s, int w);
/* Writer w left its group for good: its hellos are refused from now on,
 * then it is fenced (a connection it opens after this never writes). */
void kvt__net_bar(kvt_net_server_t *s, int w);
/* A run that lies inside the tier. */
bool kvt__net_run_ok(const kvt_net_server_t *s, const kvt__wire_data_t *d);

#endif
