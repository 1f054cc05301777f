/* Redis Cluster, the parts of it that are ours (Debian 12 packages no
 * cluster client): key slots, redirection replies and the slot map.
 *
 *   slot(key) = CRC16-XMODEM(key or its {hash tag}) mod 16384
 *
 *   slot map (from CLUSTER SHARDS, Redis 7):
 *     slot 0 .. 16383  ->  node index  ->  host:port of the shard's master
 *     e.g.  [0..5460] -> n0   [5461..10922] -> n1   [10923..16383] -> n2
 *
 * A MOVED reply says the map is stale (a reshard or a failover): the key is
 * retried where it points and the map reloaded. ASK is a one-off (the slot
 * is migrating): ASKING then the command at the named node, no map change.
 * Both are parsed here, as pure functions with their own tests. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "kvtier/error.h"
#include "kvtier/store.h"
#include "cluster-int.h"

uint16_t kvt_store_crc16(const void *buf, size_t len) {
    const uint8_t *p = buf;
    uint16_t crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)(p[i] << 8);
        for (int b = 0; b < 8; b++) crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

unsigned kvt_store_cluster_slot(const char *key, size_t len) {
    const char *open = memchr(key, '{', len);
    if (open) {
        size_t at = (size_t)(open - key) + 1;
        const char *close = memchr(key + at, '}', len - at);
        if (close && close > key + at) return kvt_store_crc16(key + at, (size_t)(close - (key + at))) & 16383;
    }
    return kvt_store_crc16(key, len) & 16383;
}

int kvt_store_parse_redirect(const char *reply, bool *ask, unsigned *slot, char *host, size_t cap, int *port) {
    if (reply == NULL || ask == NULL || slot == NULL || host == NULL || port == NULL || cap == 0) return KVT_EINVAL;
    const char *p;
    if (strncmp(reply, "MOVED ", 6) == 0) *ask = false, p = reply + 6;
    else if (strncmp(reply, "ASK ", 4) == 0) *ask = true, p = reply + 4;
    else return KVT_EPARSE;
    char *end;
    if (*p < '0' || *p > '9') return KVT_EPARSE;
    unsigned long s = strtoul(p, &end, 10);
    if (*end != ' ' || s > 16383) return KVT_EPARSE;
    const char *addr = end + 1;
    size_t alen = strcspn(addr, " \r\n");
    if (addr[alen] != 0) return KVT_EPARSE;
    if (addr[0] == ':' && memchr(addr + 1, ':', alen - 1) == NULL) { /* ":port" (not "::1:port"): the node that sent it, on that
                                                                     * port (Redis 7, its endpoint unknown) */
        char any[8], h[2];
        if (alen > 6) return KVT_EPARSE;
        snprintf(any, sizeof(any), "h%.*s", (int)alen, addr);
        if (kvt__parse_hostport(any, alen + 1, h, sizeof(h), port) != KVT_OK) return KVT_EPARSE;
        host[0] = 0;
    } else if (kvt__parse_hostport(addr, alen, host, cap, port) != KVT_OK) {
        return KVT_EPARSE;
    }
    *slot = (unsigned)s;
    return KVT_OK;
}

int kvt__parse_hostport(const char *s, size_t len, char *host, size_t cap, int *port) {
    const char *colon = NULL;
    for (size_t i = 0; i < len; i++)
        if (s[i] == ':') colon = s + i;
    if (colon == NULL) return KVT_EINVAL;
    size_t plen = len - (size_t)(colon + 1 - s);
    if (plen == 0 || plen > 5) return KVT_EINVAL;
    int pt = 0;
    for (size_t i = 0; i < plen; i++) {
        char c = colon[1 + i];
        if (c < '0' || c > '9') return KVT_EINVAL;
        pt = pt * 10 + (c - '0');
    }
    if (pt < 1 || pt > 65535) return KVT_EINVAL;
    const char *h = s;
    size_t hlen = (size_t)(colon - s);
    if (hlen >= 2 && h[0] == '[' && h[hlen - 1] == ']') h++, hlen -= 2;
    if (hlen == 0 || hlen >= cap) return KVT_EINVAL;
    for (size_t i = 0; i < hlen; i++)
        if (h[i] == '/' || h[i] == ',' || h[i] == ' ' || h[i] == '@' || h[i] == '[' || h[i] == ']')
            return KVT_EINVAL; /* (brackets only around the whole host: "[[1]]:3" would name "[1]", printed back "[1]:3", "1") */
    memcpy(host, h, hlen);
    host[hlen] = 0;
    *port = pt;
    return KVT_OK;
}

static redisReplyObjectFunctions capped_fns;
static void *(*hiredis_array)(const redisReadTask *, int);
static pthread_once_t capped_once = PTHREAD_ONCE_INIT;
static bool capped_ready;

static void *capped_array(const redisReadTask *t, int n) {
    return n > KVT__REDIS_MAX_ELEMENTS ? NULL : hiredis_array(t, n);
}

/* hiredis's default functions, learnt from a reader of its own (hiredis
 * does not export the table; every reader it makes points at it). */
static void init_capped(void) {
    redisReader *t = redisReaderCreate();
    if (t == NULL || t->fn == NULL) {
        if (t) redisReaderFree(t);
        return; /* capped_ready stays false: every connection is refused (out of memory, once) */
    }
    capped_fns = *t->fn;
    redisReaderFree(t);
    hiredis_array = capped_fns.createArray;
    capped_fns.createArray = capped_array;
    capped_ready = true;
}

int kvt__redis_cap_reader(struct redisReader *r) {
    pthread_once(&capped_once, init_capped);
    if (!capped_ready) return KVT_ENOMEM;
    if (r != NULL && r->fn != NULL) r->fn = &capped_fns;
    return KVT_OK;
}

static const redisReply *field(const redisReply *map, const char *name) {
    if (map == NULL || (map->type != REDIS_REPLY_ARRAY)) return NULL;
    for (size_t i = 0; i + 1 < map->elements; i += 2) {
        const redisReply *k = map->element[i];
        if ((k->type == REDIS_REPLY_STRING || k->type == REDIS_REPLY_STATUS) && strcmp(k->str, name) == 0) return map->element[i + 1];
    }
    return NULL;
}

static bool str_is(const redisReply *r, const char *v) {
    return r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) && strcmp(r->str, v) == 0;
}

static int node_index(kvt__slotmap_t *m, const char *host, int port) {
    for (unsigned i = 0; i < m->nnodes; i++)
        if (m->nodes[i].port == port && strcmp(m->nodes[i].host, host) == 0) return (int)i;
    if (m->nnodes == KVT__MAX_NODES) return -1;
    snprintf(m->nodes[m->nnodes].host, sizeof(m->nodes[0].host), "%s", host);
    m->nodes[m->nnodes].port = port;
    return (int)m->nnodes++;
}

/* The refusal's reason into why (a kvt__slotmap_parse that fails). */
#define REFUSE(...) (snprintf(why, cap, __VA_ARGS__), KVT_EPARSE)

int kvt__slotmap_parse(const void *reply, kvt__slotmap_t *m, char *why, size_t cap) {
    const redisReply *r = reply;
    memset(m, 0, sizeof(*m));
    for (unsigned i = 0; i < 16384; i++) m->slot[i] = KVT__NO_NODE;
    if (r == NULL || r->type != REDIS_REPLY_ARRAY) return REFUSE("the reply is not an array of shards");
    if (r->elements == 0) return REFUSE("no shards");
    unsigned covered = 0;
    for (size_t si = 0; si < r->elements; si++) {
        const redisReply *sh = r->element[si], *slots = field(sh, "slots"), *nodes = field(sh, "nodes");
        if (slots == NULL || nodes == NULL || slots->type != REDIS_REPLY_ARRAY || nodes->type != REDIS_REPLY_ARRAY)
            return REFUSE("shard %zu has no slots and nodes arrays", si);
        const redisReply *best = NULL;
        for (size_t ni = 0; ni < nodes->elements; ni++) {
            const redisReply *n = nodes->element[ni];
            if (!str_is(field(n, "role"), "master")) continue;
            if (best == NULL || (str_is(field(n, "health"), "online") && !str_is(field(best, "health"), "online"))) best = n;
        }
        if (best == NULL || slots->elements == 0) continue; /* a shard with no master or no slots */
        if (!str_is(field(best, "health"), "online")) continue;
        if (slots->elements % 2) return REFUSE("shard %zu: %zu slot bounds (pairs expected)", si, slots->elements);
        const redisReply *ip = field(best, "endpoint"), *port = field(best, "port");
        if (ip == NULL || ip->type != REDIS_REPLY_STRING || ip->len == 0 || strcmp(ip->str, "?") == 0) ip = field(best, "ip");
        /* a node the client can connect to: a host that fits (whole: no NUL inside) and a TCP port */
        if (ip == NULL || ip->type != REDIS_REPLY_STRING || ip->len >= sizeof(m->nodes[0].host) || strlen(ip->str) != ip->len)
            return REFUSE("shard %zu: its master has no usable endpoint or ip", si);
        if (port == NULL || port->type != REDIS_REPLY_INTEGER || port->integer < 1 || port->integer > 65535)
            return REFUSE("shard %zu: its master's port is not 1..65535", si);
        int idx = node_index(m, ip->str, (int)port->integer);
        if (idx < 0) return REFUSE("more than %d masters (kvtier's limit)", KVT__MAX_NODES);
        for (size_t k = 0; k + 1 < slots->elements; k += 2) {
            if (slots->element[k]->type != REDIS_REPLY_INTEGER || slots->element[k + 1]->type != REDIS_REPLY_INTEGER)
                return REFUSE("shard %zu: slot bounds that are not integers", si);
            long long a = slots->element[k]->integer, b = slots->element[k + 1]->integer;
            if (a < 0 || b > 16383 || a > b) return REFUSE("shard %zu: slots %lld..%lld (expected 0..16383, in order)", si, a, b);
            for (long long x = a; x <= b; x++) { /* a slot two shards claim: not a map of one cluster */
                if (m->slot[x] != KVT__NO_NODE) return REFUSE("slot %lld claimed by two shards", x);
                m->slot[x] = (uint16_t)idx, covered++;
            }
        }
    }
    m->covered = covered;
    return covered ? KVT_OK : REFUSE("no slot served by an online master");
}
