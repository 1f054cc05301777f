/* kvtier — the library's version.
 *
 * KVT_VERSION_* say what a program was compiled against; kvt_version() says
 * what it runs against (the shared library may be newer). A program built
 * against an older header runs on a newer library of the same major
 * version: structs that start with a `size` field take the caller's size,
 * and fields past it take their defaults (docs/engine.md, "ABI").
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
#define KVT_VERSION_MINOR 3
#define KVT_VERSION_PATCH 0
/* major * 10000 + minor * 100 + patch, for #if */
#define KVT_VERSION_NUMBER (KVT_VERSION_MAJOR * 10000 + KVT_VERSION_MINOR * 100 + KVT_VERSION_PATCH)

/* The library's KVT_VERSION_NUMBER. */
KVT_API unsigned kvt_version(void);
/* "0.2.0", and the optional backends this build has: "0.2.0 (cuda: no, ucx: yes)". */
KVT_API const char *kvt_version_string(void);

#ifdef __cplusplus
}
#endif
#endif
