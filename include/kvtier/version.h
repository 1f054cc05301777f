/* kvtier — the library's version.
 *
 * KVT_VERSION_* say what a program was compiled against; kvt_version() says
 * what it runs against (the shared library may be newer). The soname names
 * the ABI: libkvtier.so.MAJOR, and libkvtier.so.0.MINOR before 1.0. A
 * program built against an older header runs on any newer library of the
 * same soname: structs that start with a `size` field take the caller's
 * size, and fields past it take their defaults; every other struct a caller
 * allocates keeps its layout until the soname changes (docs/abi.md).
 *
 * Thread safety: both calls may run on any thread at any time.
 */
#ifndef KVTIER_VERSION_H
#define KVTIER_VERSION_H

#include "kvtier/export.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_VERSION_MAJOR 0
#define KVT_VERSION_MINOR 4
#define KVT_VERSION_PATCH 0
/* major * 10000 + minor * 100 + patch, for #if */
#define KVT_VERSION_NUMBER (KVT_VERSION_MAJOR * 10000 + KVT_VERSION_MINOR * 100 + KVT_VERSION_PATCH)

/* The library's KVT_VERSION_NUMBER. */
KVT_API unsigned kvt_version(void);
/* "0.4.0", and the optional backends this build has: "0.4.0 (cuda: no, ucx: yes)". */
KVT_API const char *kvt_version_string(void);

#ifdef __cplusplus
}
#endif
#endif
