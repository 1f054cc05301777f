/* The library's version (include/kvtier/version.h). */
#include "kvtier/version.h"

#define KVT_STR_(x) #x
#define KVT_STR(x) KVT_STR_(x)
#define KVT_VERSION_TEXT KVT_STR(KVT_VERSION_MAJOR) "." KVT_STR(KVT_VERSION_MINOR) "." KVT_STR(KVT_VERSION_PATCH)

unsigned kvt_version(void) { return KVT_VERSION_NUMBER; }

/* What this build has, from the build's own definitions (core calls no
 * module above it). */
#ifdef KVT_HAVE_CUDA
#define KVT_CUDA_TEXT "yes"
#else
#define KVT_CUDA_TEXT "no"
#endif
#ifdef KVT_HAVE_UCX
#define KVT_UCX_TEXT "yes"
#else
#define KVT_UCX_TEXT "no"
#endif

const char *kvt_version_string(void) { return KVT_VERSION_TEXT " (cuda: " KVT_CUDA_TEXT ", ucx: " KVT_UCX_TEXT ")"; }
