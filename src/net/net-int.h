/* Private to the page servers (server.c: tcp; ucx_server.c: UCX). */
#ifndef KVTIER_NET_INT_H
#define KVTIER_NET_INT_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>

#include "kvtier/net.h"
#include "wire.h"
#include "../tier/tier-int.h"

typedef struct sconn sconn_t;

struct kvt_net_server {
    kvt_tier_t *t;
    kvt_net_transport_t tr;
    int lfd;
    uint16_t port;
    pthread_t accept_th;
    pthread_mutex_t mu;
    bool stopping;
    sconn_t *conns;
    void *ucx; /* the UCX server's state */
    kvt_net_server_stats_t st;
};

/* Counts (counter may be NULL) and records an error, under s->mu. */
void kvt__net_note(kvt_net_server_t *s, uint64_t *counter, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A run received and in the tier: counted before it is acknowledged. */
void kvt__net_count(kvt_net_server_t *s, uint64_t len);
/* A writer's hello (len bytes) against the tier: 0 accepted, 1 refused (a
 * wrong geometry: *r says why), -1 not a kvtier peer. Counts and notes. */
int kvt__net_check_hello(kvt_net_server_t *s, const kvt__wire_hello_t *h, size_t len, kvt__wire_reply_t *r);
/* A run that lies inside the tier. */
bool kvt__net_run_ok(const kvt_net_server_t *s, const kvt__wire_data_t *d);
/* ucx_server.c: listens on a (port 0: any), sets s->port. */
int kvt__ucx_server_start(kvt_net_server_t *s, const struct sockaddr_in *a);
void kvt__ucx_server_stop(kvt_net_server_t *s);

#endif
