/* The tcp page server's input (src/net/server.c, src/sock/wire.h): the
 * input is everything a peer sends on one connection — a hello, then runs
 * {off, len} each followed by its bytes — fed through a socketpair to the
 * server's own connection loop (kvt__net_serve_conn) over a tier of 4 pages
 * x 2 layers x 64 B held in malloc'd memory (so ASan sees any byte written
 * outside it).
 *
 * The model is the protocol read independently: the hello accepted only
 * when magic, version, token (the server asks for TOKEN) and geometry are
 * the tier's (refused with a reply when the version, the token or the
 * geometry differs, closed without one on a wrong magic), a run
 * accepted only when 0 < len <= KVT_WIRE_MAX_DATA and it lies inside the
 * tier, its bytes landing at off (a short last run lands what arrived), one
 * ack of len per whole run. The tier's bytes, the bytes sent back and the
 * counters must be exactly the model's. */
#include <sys/socket.h>

#include "fuzz.h"
#include "kvtier/error.h"
#include "net/net-int.h"
#include "sock/wire.h"

#define PAGES 4
#define LAYERS 2
#define LB 64
#define BYTES (PAGES * LAYERS * LB)
#define TOKEN 0x31306e656b6f7476ull /* "vtoken01" */
#define HELLO 48

static kvt_net_server_t S;
static uint8_t *tier, model[BYTES];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet();
    tier = malloc(BYTES);
    S.base = tier;
    S.bytes = BYTES;
    S.geom = (kvt_geom_t){PAGES, LAYERS, LB, KVT_LAYOUT_LAYER_FIRST};
    S.lfd = -1;
    atomic_store(&S.token, TOKEN);
    pthread_mutex_init(&S.mu, NULL);
    return 0;
}

static uint64_t le(const uint8_t *p, unsigned n) {
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* What the server must send back and do: the expected reply stream. */
static size_t expect(const uint8_t *d, size_t n, uint8_t *out, uint64_t *runs, uint64_t *bytes, int *hello) {
    size_t k = 0;
    *runs = *bytes = 0;
    *hello = -1; /* not a peer */
    if (n < HELLO || le(d, 8) != KVT_WIRE_MAGIC) return 0;
    kvt__wire_reply_t r = {KVT_OK, "ok"};
    bool same = le(d + 8, 4) == KVT_WIRE_VERSION && le(d + 12, 4) == KVT_LAYOUT_LAYER_FIRST && le(d + 16, 4) == LAYERS && le(d + 24, 8) == PAGES &&
                le(d + 32, 8) == LB && le(d + 40, 8) == TOKEN;
    if (!same) r.status = KVT_EINVAL;
    memcpy(out, &r.status, 4); /* the message is checked apart */
    memset(out + 4, 0, sizeof(r) - 4);
    k = sizeof(r);
    *hello = same ? 0 : 1;
    if (!same) return k;
    size_t at = HELLO;
    while (n - at >= 16) {
        uint64_t off = le(d + at, 8), len = le(d + at + 8, 8);
        at += 16;
        if (len == 0 || len > KVT_WIRE_MAX_DATA || off > BYTES || len > BYTES - off) break;
        size_t got = n - at < len ? n - at : (size_t)len;
        memcpy(model + off, d + at, got);
        at += got;
        if (got < len) break;
        (*runs)++;
        *bytes += len;
        memcpy(out + k, &len, 8);
        k += 8;
    }
    return k;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 1 << 16) return 0;
    memset(tier, 0xA5, BYTES);
    memset(model, 0xA5, BYTES);
    memset(&S.st, 0, sizeof(S.st));
    S.st.awaiting_hello = 1;
    int sv[2];
    FZ_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair");
    int big = 1 << 20;
    setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
    setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
    FZ_ASSERT(size == 0 || kvt__write_full(sv[1], data, size) == 0, "the peer's bytes do not fit the socket");
    shutdown(sv[1], SHUT_WR);
    kvt__net_serve_conn(&S, sv[0], NULL);
    shutdown(sv[0], SHUT_RDWR);
    static uint8_t got[1 << 17], want[1 << 17];
    size_t ng = 0;
    ssize_t r;
    while ((r = read(sv[1], got + ng, sizeof(got) - ng)) > 0) ng += (size_t)r;
    close(sv[0]);
    close(sv[1]);
    uint64_t runs, bytes;
    int hello;
    size_t nw = expect(data, size, want, &runs, &bytes, &hello);
    FZ_ASSERT(ng == nw, "the server sent %zu bytes back, the model %zu (hello %d)", ng, nw, hello);
    if (nw >= sizeof(kvt__wire_reply_t)) {
        kvt__wire_reply_t rep;
        memcpy(&rep, got, sizeof(rep));
        FZ_ASSERT(memcmp(got, want, 4) == 0, "reply status %d (hello %d)", rep.status, hello);
        FZ_ASSERT(memchr(rep.message, 0, sizeof(rep.message)) != NULL && rep.message[0], "the reply's message");
        FZ_ASSERT(memcmp(got + sizeof(rep), want + sizeof(rep), nw - sizeof(rep)) == 0, "the acks differ");
    }
    FZ_ASSERT(memcmp(tier, model, BYTES) == 0, "the tier's bytes differ from the model's");
    FZ_ASSERT(S.st.runs == runs && S.st.bytes == bytes, "runs %llu bytes %llu, model %llu %llu",
              (unsigned long long)S.st.runs, (unsigned long long)S.st.bytes, (unsigned long long)runs,
              (unsigned long long)bytes);
    FZ_ASSERT(S.st.awaiting_hello == 0, "awaiting_hello");
    FZ_ASSERT(hello != 1 || S.st.refused == 1, "a refused hello not counted");
    return 0;
}
