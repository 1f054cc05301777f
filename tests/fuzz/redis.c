/* The Redis and Redis Cluster reply handling (src/store/cluster.c): the
 * input is what a node sends, RESP2/RESP3 as hiredis's reader parses it
 * off the socket, and the same bytes as one reply line.
 *
 *   an error reply: kvt_store_parse_redirect (MOVED / ASK). Accepted only
 *     as "MOVED|ASK SLOT HOST:PORT" with a slot below 16384 and a port in
 *     1..65535; the redirect it names must print back to a reply that
 *     parses to the same redirect.
 *   any reply: kvt__slotmap_parse as a CLUSTER SHARDS reply. Accepted:
 *     every slot names a node of the map or none, `covered` is the number
 *     of slots with a node, every node is a host and a port the client
 *     could connect to, and the nodes are distinct (a refused map is never
 *     used).
 *   the bytes as text: kvt__parse_hostport and kvt_store_parse_redirect. */
#include <hiredis/hiredis.h>
#include <hiredis/read.h>

#include "fuzz.h"
#include "kvtier/store.h"
#include "store/cluster-int.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet();
    return 0;
}

static void check_redirect(const char *text) {
    bool ask = false;
    unsigned slot = 99999;
    char host[256];
    int port = -1;
    int rc = kvt_store_parse_redirect(text, &ask, &slot, host, sizeof(host), &port);
    if (rc != KVT_OK) {
        FZ_ASSERT(rc == KVT_EPARSE || rc == KVT_EINVAL, "parse_redirect: %d", rc);
        return;
    }
    FZ_ASSERT(strncmp(text, ask ? "ASK " : "MOVED ", ask ? 4 : 6) == 0, "the kind");
    FZ_ASSERT(slot < 16384 && port >= 1 && port <= 65535 && (host[0] || strstr(text, " :")), "slot %u port %d host '%s'", slot, port, host);
    char again[400];
    snprintf(again, sizeof(again), strchr(host, ':') ? "%s %u [%s]:%d" : "%s %u %s:%d", ask ? "ASK" : "MOVED", slot, host, port);
    bool ask2;
    unsigned slot2;
    char host2[256];
    int port2;
    FZ_ASSERT(kvt_store_parse_redirect(again, &ask2, &slot2, host2, sizeof(host2), &port2) == KVT_OK, "'%s' printed back is refused", again);
    FZ_ASSERT(ask2 == ask && slot2 == slot && port2 == port && strcmp(host2, host) == 0, "'%s' is another redirect", again);
}

static kvt__slotmap_t map;

static void check_map(const redisReply *r) {
    char why[160];
    int rc = kvt__slotmap_parse(r, &map, why, sizeof(why));
    FZ_ASSERT(rc == KVT_OK || rc == KVT_EPARSE, "slotmap_parse: %d", rc);
    FZ_ASSERT(rc == KVT_OK || (why[0] && memchr(why, 0, sizeof(why))), "a map refused without a reason");
    if (rc != KVT_OK) return; /* a refused map is never used (load_map) */
    FZ_ASSERT(map.nnodes <= KVT__MAX_NODES, "nodes %u", map.nnodes);
    unsigned with = 0;
    for (unsigned s = 0; s < 16384; s++) {
        FZ_ASSERT(map.slot[s] == KVT__NO_NODE || map.slot[s] < map.nnodes, "slot %u names node %u of %u", s, map.slot[s], map.nnodes);
        with += map.slot[s] != KVT__NO_NODE;
    }
    FZ_ASSERT(map.covered == with && with > 0, "covered %u, slots with a node %u", map.covered, with);
    for (unsigned i = 0; i < map.nnodes; i++) {
        const kvt__rnode_t *n = &map.nodes[i];
        FZ_ASSERT(n->port >= 1 && n->port <= 65535, "node %u: port %d", i, n->port);
        FZ_ASSERT(n->host[0] != 0 && memchr(n->host, 0, sizeof(n->host)) != NULL, "node %u: no host", i);
        for (unsigned j = 0; j < i; j++)
            FZ_ASSERT(n->port != map.nodes[j].port || strcmp(n->host, map.nodes[j].host) != 0, "nodes %u and %u", j, i);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 1 << 16) return 0;
    /* the bytes as text */
    char *txt = malloc(size + 1);
    memcpy(txt, data, size);
    txt[size] = 0;
    check_redirect(txt);
    char host[64];
    int port = -1;
    if (kvt__parse_hostport(txt, strlen(txt), host, sizeof(host), &port) == KVT_OK)
        FZ_ASSERT(port >= 1 && port <= 65535 && host[0] && strlen(host) < sizeof(host), "hostport");
    free(txt);
    /* the bytes as replies */
    redisReader *rd = redisReaderCreate();
    FZ_ASSERT(rd != NULL, "reader");
    FZ_ASSERT(kvt__redis_cap_reader(rd) == KVT_OK, "cap"); /* as every connection of the store */
    redisReaderFeed(rd, (const char *)data, size);
    for (int k = 0; k < 16; k++) {
        void *reply = NULL;
        if (redisReaderGetReply(rd, &reply) != REDIS_OK || reply == NULL) break;
        const redisReply *r = reply;
        if (r->type == REDIS_REPLY_ERROR && r->str) check_redirect(r->str);
        if (r->type == REDIS_REPLY_ARRAY) check_map(r);
        freeReplyObject(reply);
    }
    redisReaderFree(rd);
    return 0;
}
