/* Redis Cluster helpers shared by redis.c and the tests (cluster.c). */
#ifndef KVTIER_STORE_CLUSTER_INT_H
#define KVTIER_STORE_CLUSTER_INT_H

#include <stddef.h>
#include <stdint.h>

#define KVT__MAX_NODES 64
#define KVT__NO_NODE 0xFFFF

typedef struct kvt__rnode {
    char host[256];
    int port;
} kvt__rnode_t;

typedef struct kvt__slotmap {
    uint16_t slot[16384]; /* node index or KVT__NO_NODE */
    kvt__rnode_t nodes[KVT__MAX_NODES];
    unsigned nnodes, covered;
} kvt__slotmap_t;

/* A CLUSTER SHARDS reply (a redisReply *) -> slots to the online master of
 * each shard. KVT_EPARSE with the reason in why (cap bytes): nothing
 * covered, a slot claimed twice, a node that is no host:port, more than
 * KVT__MAX_NODES masters, slot bounds not in pairs, or not that reply's
 * shape. */
int kvt__slotmap_parse(const void *reply, kvt__slotmap_t *m, char *why, size_t cap);
/* Arrays longer than this in a reply are refused (an out-of-memory error of
 * the reader, which fails the connection): hiredis 0.14 (Debian 12) takes an
 * array's declared length on trust, so "*2000000000" from a server would
 * have it calloc 16 GB before one element arrived (the redis fuzz target
 * sends such replies). kvtier's largest reply is a CLUSTER SHARDS of at most
 * a few thousand items. */
#define KVT__REDIS_MAX_ELEMENTS (1 << 20)
struct redisReader;
/* Puts the cap on a reader (a connection's c->reader); safe from any
 * thread. KVT_ENOMEM when the capped table could not be made (then never). */
int kvt__redis_cap_reader(struct redisReader *r);

/* "host:port" / "[v6]:port" of len bytes. KVT_EINVAL. */
int kvt__parse_hostport(const char *s, size_t len, char *host, size_t cap, int *port);

#endif
