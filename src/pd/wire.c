/* The PD control messages (wire.h): framing on blocking sockets. */
#include "wire.h"

#include <string.h>

#include "kvtier/error.h"
#include "../core/clock-int.h"
#include "../core/error-int.h"
#include "../sock/wire.h"

/* The payload size of a type (DST: without its page list); 0 for BYE,
 * SIZE_MAX for an unknown type. */
static size_t kvt__pd_payload(unsigned type) {
    switch (type) {
    case KVT_PD_HELLO: return sizeof(kvt__pd_hello_t);
    case KVT_PD_WELCOME: return sizeof(kvt__pd_welcome_t);
    case KVT_PD_REQ:
    case KVT_PD_DST:
    case KVT_PD_DONE: return sizeof(kvt__pd_op_t);
    case KVT_PD_BYE: return 0;
    default: return SIZE_MAX;
    }
}

/* A header as it should be for (type, payload length). */
kvt__pd_hdr_t kvt__pd_header(unsigned type, size_t length) {
    return (kvt__pd_hdr_t){KVT_PD_MAGIC, KVT_PD_VERSION, (uint16_t)type, (uint32_t)length, 0};
}

int kvt__pd_header_ok(const kvt__pd_hdr_t *h, unsigned accept_mask) {
    if (h->magic != KVT_PD_MAGIC || h->version != KVT_PD_VERSION || h->type >= 32 || !(accept_mask & (1u << h->type)))
        return 0;
    size_t want = kvt__pd_payload(h->type);
    if (h->type == KVT_PD_DST) return h->length >= want && (h->length - want) % sizeof(uint32_t) == 0;
    return h->length == want;
}

int kvt__pd_send(int fd, unsigned type, const void *payload, const void *extra, size_t extra_len, kvt__pd_by_t by) {
    size_t len = kvt__pd_payload(type);
    uint8_t buf[sizeof(kvt__pd_hdr_t) + 64];
    kvt__pd_hdr_t h = kvt__pd_header(type, len + extra_len);
    memcpy(buf, &h, sizeof(h));
    if (len) memcpy(buf + sizeof(h), payload, len);
    if (kvt__write_by(fd, buf, sizeof(h) + len, by.deadline_ns, by.halt) != 0) return -1;
    return extra_len ? kvt__write_by(fd, extra, extra_len, by.deadline_ns, by.halt) : 0;
}

/* The page list's length is the header's, and must be what npages and the
 * status say: a list of another length would leave the stream out of step
 * (the next message read from inside this one), and a status that is not a
 * kvtier error code would reach the caller as a result. */
int kvt__pd_recv_dst(int fd, uint64_t h, uint64_t n, uint32_t *dst, int32_t *status, uint64_t rest_ns) {
    kvt__pd_hdr_t hd;
    kvt__pd_op_t rep;
    /* the first byte whenever decode has room (it answers a REQ once pages come free); the rest of
     * the answer follows at once, or decode stopped mid-message */
    if (kvt__read_full(fd, &hd, 1) != 0) return -1;
    uint64_t by = kvt_now_ns() + rest_ns;
    if (kvt__read_by(fd, (uint8_t *)&hd + 1, sizeof(hd) - 1, by, NULL) != 0 || !kvt__pd_header_ok(&hd, 1u << KVT_PD_DST) ||
        kvt__read_by(fd, &rep, sizeof(rep), by, NULL) != 0 || rep.handoff != h)
        return -1;
    size_t list = hd.length - sizeof(rep);
    if (rep.status != KVT_OK) { /* decode will not complete it: an error code, and no page list */
        if (!kvt__err_known(rep.status) || list != 0) return -1;
        *status = rep.status;
        return 0;
    }
    if (rep.npages != n || list != n * sizeof(uint32_t) || kvt__read_by(fd, dst, list, by, NULL) != 0) return -1;
    *status = KVT_OK;
    return 0;
}

int kvt__pd_recv(int fd, unsigned accept_mask, unsigned *type, void *payload, kvt__pd_by_t by) {
    kvt__pd_hdr_t h;
    if (kvt__read_by(fd, &h, sizeof(h), by.deadline_ns, by.halt) != 0 || !kvt__pd_header_ok(&h, accept_mask)) return -1;
    *type = h.type;
    size_t len = kvt__pd_payload(h.type);
    return len ? kvt__read_by(fd, payload, len, by.deadline_ns, by.halt) : 0;
}
