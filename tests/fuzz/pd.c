/* The PD control messages (src/pd/wire.h): the input is what the other end
 * of a control connection sends, fed through a socketpair.
 *
 *   first byte even: kvt__pd_recv in a loop with an accepted-type mask from
 *     the input, what the decode receiver and the sender's join read; the
 *     model reads the same headers independently and must agree on every
 *     message taken (type, payload) and on where the stream is refused.
 *   first byte odd: kvt__pd_recv_dst, the sender's read of decode's answer
 *     to REQ{h, n} (h and n from the input): accepted only as a DST for h
 *     of this version whose page list is exactly n pages when its status is
 *     0 (those pages in dst), or no list and a kvtier error code otherwise;
 *     anything else is a broken link. */
#include <sys/socket.h>

#include "fuzz.h"
#include "pd/wire.h"
#include "sock/wire.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet();
    return 0;
}

static uint64_t le(const uint8_t *p, unsigned n) {
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static size_t payload_of(unsigned type) {
    switch (type) {
    case KVT_PD_HELLO: return 16;
    case KVT_PD_WELCOME: return 40;
    case KVT_PD_REQ:
    case KVT_PD_DST:
    case KVT_PD_DONE: return 24;
    case KVT_PD_BYE: return 0;
    default: return SIZE_MAX;
    }
}

/* The model's header check: 0 not a header it takes, else the payload size. */
static bool header_ok(const uint8_t *h, unsigned mask, size_t *payload, size_t *extra) {
    uint32_t type = (uint32_t)le(h + 6, 2), len = (uint32_t)le(h + 8, 4);
    if (le(h, 4) != KVT_PD_MAGIC || le(h + 4, 2) != KVT_PD_VERSION || type >= 32 || !(mask & (1u << type))) return false;
    size_t want = payload_of(type);
    if (want == SIZE_MAX) return false;
    *payload = want;
    *extra = 0;
    if (type == KVT_PD_DST) {
        if (len < want || (len - want) % 4) return false;
        *extra = len - want;
        return true;
    }
    return len == want;
}

static int pair(const uint8_t *d, size_t n) {
    int sv[2];
    FZ_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair");
    FZ_ASSERT(n == 0 || kvt__write_full(sv[1], d, n) == 0, "write");
    close(sv[1]);
    return sv[0];
}

static void frames(const uint8_t *d, size_t n) {
    if (n < 4) return;
    unsigned mask = (unsigned)le(d, 4);
    d += 4, n -= 4;
    int fd = pair(d, n);
    size_t at = 0;
    for (;;) {
        unsigned type = 99;
        uint8_t payload[64];
        int rc = kvt__pd_recv(fd, mask, &type, payload, KVT__PD_UNBOUND);
        size_t want, extra;
        bool ok = n - at >= 16 && header_ok(d + at, mask, &want, &extra) && n - at - 16 >= want;
        FZ_ASSERT((rc == 0) == ok, "kvt__pd_recv %d, the model %s at byte %zu", rc, ok ? "takes it" : "refuses", at);
        if (!ok) break;
        FZ_ASSERT(type == le(d + at + 6, 2), "type %u", type);
        FZ_ASSERT(memcmp(payload, d + at + 16, want) == 0, "the payload differs");
        at += 16 + want;
        if (extra) { /* a DST's page list is its reader's: take it */
            uint8_t skip[4096];
            size_t k = extra < sizeof(skip) ? extra : sizeof(skip);
            if (kvt__read_full(fd, skip, k) != 0 || k != extra) break;
            at += k;
        }
    }
    close(fd);
}

static void dst(const uint8_t *d, size_t n) {
    if (n < 9) return;
    uint64_t h = le(d, 8) & 0xff, np = 1 + d[8] % 16;
    d += 9, n -= 9;
    int fd = pair(d, n);
    uint32_t pages[16];
    memset(pages, 0xee, sizeof(pages));
    int32_t status = 12345;
    int rc = kvt__pd_recv_dst(fd, h, np, pages, &status, 1000000000ull);
    close(fd);
    size_t want, extra;
    bool hdr = n >= 40 && header_ok(d, 1u << KVT_PD_DST, &want, &extra) && le(d + 16, 8) == h;
    int32_t st = hdr ? (int32_t)le(d + 32, 4) : 0;
    bool ok = hdr && (st == 0 ? le(d + 24, 8) == np && extra == np * 4 && n >= 40 + np * 4 : fz_kvt_err(st) && extra == 0);
    FZ_ASSERT((rc == 0) == ok, "kvt__pd_recv_dst %d (status %d), the model %s", rc, (int)status, ok ? "takes it" : "refuses");
    if (!ok) return;
    FZ_ASSERT(status == st, "status %d, sent %d", (int)status, (int)st);
    if (st == 0) FZ_ASSERT(memcmp(pages, d + 40, np * 4) == 0, "the page list differs");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0 || size > 1 << 16) return 0;
    if (data[0] & 1) dst(data + 1, size - 1);
    else frames(data + 1, size - 1);
    return 0;
}
