/* The PD control protocol's messages (docs/pd.md, "The control path"): one
 * versioned header, then a payload of the type's own size. Little-endian.
 *
 *   header  magic u32 = "kvpd", version u16, type u16, length u32 (payload
 *           bytes), pad u32                                            16 B
 *   HELLO   rank u32, ranks u32, token u64                 sender -> decode
 *   WELCOME pages u64, layer_bytes u64, layers u32, layout u32,
 *           generation u32, pad u32, resume_from u64       decode -> sender
 *   REQ     handoff u64, npages u64                        sender -> decode
 *   DST     handoff u64, npages u64, status i32, pad u32,
 *           then npages u32 page ids when status is 0      decode -> sender
 *   DONE    handoff u64, npages u64, status i32, pad u32   sender -> decode
 *   BYE     (none)                                         sender -> decode
 *
 * A peer whose first 32 bytes are not a HELLO of this version with the
 * group's token is dropped. A header with a wrong magic, version, type or
 * length ends the connection (a rank sending one has vanished). */
#ifndef KVTIER_PD_WIRE_H
#define KVTIER_PD_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVT_PD_MAGIC 0x6470766bu /* "kvpd" little-endian */
#define KVT_PD_VERSION 3

enum { KVT_PD_HELLO = 1, KVT_PD_WELCOME = 2, KVT_PD_REQ = 3, KVT_PD_DST = 4, KVT_PD_DONE = 5, KVT_PD_BYE = 6 };

typedef struct kvt__pd_hdr {
    uint32_t magic;
    uint16_t version, type;
    uint32_t length, pad;
} kvt__pd_hdr_t;

typedef struct kvt__pd_hello {
    uint32_t rank, ranks;
    uint64_t token;
} kvt__pd_hello_t;

typedef struct kvt__pd_welcome {
    uint64_t pages, layer_bytes;
    uint32_t layers, layout, generation, pad;
    uint64_t resume_from;
} kvt__pd_welcome_t;

/* REQ, DST and DONE. */
typedef struct kvt__pd_op {
    uint64_t handoff, npages;
    int32_t status, pad;
} kvt__pd_op_t;

/* Rank r's share of a hand-off of n pages under C ranks: the pages j with
 * j mod C == r. Both ends lay the destination list out by it. */
static inline uint64_t kvt__pd_share(uint64_t n, uint32_t ranks, uint32_t r) { return n / ranks + (r < n % ranks); }
/* How long a message may take (kvt__read_by): its last byte by deadline_ns
 * (0: no bound), given up when *halt turns true (NULL: never). */
typedef struct kvt__pd_by {
    uint64_t deadline_ns;
    const _Atomic(bool) *halt;
} kvt__pd_by_t;
#define KVT__PD_UNBOUND ((kvt__pd_by_t){0, NULL})

/* Writes header + payload (+ extra, extra_len bytes). 0 or -1 (an error,
 * or not all written in time). */
int kvt__pd_send(int fd, unsigned type, const void *payload, const void *extra, size_t extra_len, kvt__pd_by_t by);
/* Reads one message of an expected type set (bit 1 << type) into payload
 * (which holds kvt__pd_payload(type) bytes); *type gets it. A DST's page
 * list is left to the caller. 0, or -1 (EOF, error, a bad header, or not
 * all read in time). */
int kvt__pd_recv(int fd, unsigned accept_mask, unsigned *type, void *payload, kvt__pd_by_t by);
/* The answer to REQ{h, n} (sender side): a DST for hand-off h. 0 with
 * *status set (KVT_OK: its n pages in dst; else a KVT_E* code, no pages),
 * or -1 for a broken link (EOF, an error, a bad header, another hand-off's
 * answer, a page list that is not n pages, a status that is not a kvtier
 * error code, a refusal that carries pages, or the rest of the answer not
 * in within rest_ns of its first byte: the first may take as long as decode
 * waits for room). */
int kvt__pd_recv_dst(int fd, uint64_t h, uint64_t n, uint32_t *dst, int32_t *status, uint64_t rest_ns);
/* True when h is a header of this protocol, version, a type in mask and the right length. */
int kvt__pd_header_ok(const kvt__pd_hdr_t *h, unsigned accept_mask);
/* The header of a message of `type` with `length` bytes after it. */
kvt__pd_hdr_t kvt__pd_header(unsigned type, size_t length);

#endif
