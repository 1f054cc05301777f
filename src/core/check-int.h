/* Internal asserts (STYLE.md habit 8): active at KVT_CHECK_LEVEL >= 1 (debug
 * and sanitizer builds), compiled out otherwise. */
#ifndef KVTIER_CHECK_INT_H
#define KVTIER_CHECK_INT_H

#if KVT_CHECK_LEVEL >= 1
#include <assert.h>
#define KVT_ASSERT(x) assert(x)
#else
#define KVT_ASSERT(x) ((void)0)
#endif

#endif
