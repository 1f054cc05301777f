/* kvtier — error codes.
 *
 * Every kvtier function that can fail returns int: 0 on success or one of the
 * negative KVT_E* codes below. The list is one X-macro, so the enum, the names
 * and the messages cannot drift apart. Never read errno to learn what failed.
 *
 * Threads: pure functions on static strings; any thread, any time.
 */
#ifndef KVTIER_ERROR_H
#define KVTIER_ERROR_H

#include "kvtier/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, value, message) */
#define KVT_ERRNO_MAP(X)                                                       \
    X(OK,          0,  "success")                                              \
    X(EINVAL,     -1,  "invalid argument")                                     \
    X(ENOMEM,     -2,  "out of memory")                                        \
    X(ENOSPC,     -3,  "not enough free pages")                                \
    X(EFRAG,      -4,  "free pages too fragmented for the allowed number of runs") \
    X(ERANGE,     -5,  "page or size out of range")                            \
    X(ENOTRESV,   -6,  "page is not reserved")                                 \
    X(EBUSY,      -7,  "locked, pinned or in flight")                          \
    X(ENOENT,     -8,  "not found")                                            \
    X(EEXIST,     -9,  "already exists")                                       \
    X(EIO,        -10, "input/output error")                                   \
    X(ECORRUPT,   -11, "corrupt: a checksum or an invariant failed")           \
    X(EPARSE,     -12, "malformed input")                                      \
    X(ENOTSUP,    -13, "not supported")                                        \
    X(ETIMEDOUT,  -14, "timed out")                                            \
    X(EAGAIN,     -15, "resource temporarily unavailable")                     \
    X(ERESERVED,  -16, "page is already reserved")

typedef enum kvt_err {
#define KVT_ERR_ENUM_(name, val, msg) KVT_##name = (val),
    KVT_ERRNO_MAP(KVT_ERR_ENUM_)
#undef KVT_ERR_ENUM_
} kvt_err_t;

/* A human-readable message for err; "unknown error" for codes not in the list. */
KVT_API const char *kvt_strerror(int err);

/* The symbolic name ("KVT_ENOSPC"); "KVT_UNKNOWN" for codes not in the list. */
KVT_API const char *kvt_err_name(int err);

#ifdef __cplusplus
}
#endif
#endif
