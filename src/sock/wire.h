/* The kvtier page wire protocol (docs/pd.md), shared by the tcp tier (the
 * writer) and the page server (the reader). All integers little-endian: the
 * structs below go on the wire as they are, so kvtier builds only for
 * little-endian hosts (asserted below).
 *
 *   writer                                   server
 *   hello {magic, version, layout, layers,
 *          pages, layer_bytes, token}   -->
 *                                       <--  reply {status, message}
 *                                            (status != 0: refused, closed)
 *   data {off, len} + len bytes         -->  received straight into the tier
 *   data ...                            -->
 *                                       <--  ack {len} per data, in order
 *
 * The server refuses a hello whose geometry is not its tier's, or whose token
 * is not the one it was given (kvt_net_server_set_token: PD decode's pool
 * takes bytes only from its group's ranks), and closes a
 * connection that sends anything malformed (bad magic, a range outside the
 * tier, a length over KVT_WIRE_MAX_DATA) — it never crashes on a peer. */
#ifndef KVTIER_SOCK_WIRE_H
#define KVTIER_SOCK_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the wire's structs are sent as they are: little-endian");

#define KVT_WIRE_MAGIC 0x31307465766b7476ull /* "vtkvet01" little-endian */
#define KVT_WIRE_VERSION 2 /* 2: the hello carries a token */
#define KVT_WIRE_MAX_DATA (1ull << 30)
#define KVT_WIRE_STALL_MS 30000 /* a writer whose peer takes nothing (or answers no hello) this long: it is gone */
#define KVT_WIRE_STALL_NS (KVT_WIRE_STALL_MS * 1000000ull)

typedef struct kvt__wire_hello {
    uint64_t magic;
    uint32_t version;
    uint32_t layout;
    uint32_t layers;
    uint32_t pad;
    uint64_t pages;
    uint64_t layer_bytes;
    uint64_t token;  /* the server's token, or 0 for a server that takes none */
} kvt__wire_hello_t;

typedef struct kvt__wire_reply {
    int32_t status; /* 0 or a KVT_E* code */
    char message[124];
} kvt__wire_reply_t;

typedef struct kvt__wire_data {
    uint64_t off, len;
} kvt__wire_data_t;

/* The token writer w (0, 1 ...) of a group says in its hello, for a server
 * that knows the group's writers (kvt__net_set_writers): the group's token
 * mixed with w, so that the server knows whose each connection is. */
static inline uint64_t kvt__wire_writer_token(uint64_t token, uint32_t w) {
    return token ^ ((uint64_t)(w + 1) * 0x9e3779b97f4a7c15ull);
}

/* Whole reads and writes on a blocking socket; 0 or -1 (EOF or error). */
int kvt__read_full(int fd, void *buf, size_t len);
int kvt__write_full(int fd, const void *buf, size_t len);
/* The same, bounded: every byte moved by deadline_ns (kvt_now_ns's clock;
 * 0: no bound), given up within 100 ms of *halt turning true (NULL: never).
 * A peer that stops mid-message, or stops reading, cannot hold the caller
 * longer. 0, or -1 (EOF, error, the deadline passed, halted). */
int kvt__read_by(int fd, void *buf, size_t len, uint64_t deadline_ns, const _Atomic(bool) *halt);
int kvt__write_by(int fd, const void *buf, size_t len, uint64_t deadline_ns, const _Atomic(bool) *halt);
struct sockaddr_in;
/* "a.b.c.d:port" -> an IPv4 socket address; 0 or -1. */
int kvt__parse_addr(const char *addr, struct sockaddr_in *sa);
/* A listening TCP socket on a (port 0: any), its port in *port; or -1. */
int kvt__tcp_listen(const struct sockaddr_in *a, uint16_t *port);
/* "a.b.c.d:port" -> a connected TCP socket (TCP_NODELAY, blocking), or -1
 * (also when it is not connected within KVT_WIRE_STALL_MS). */
int kvt__tcp_connect(const char *addr);

#endif
