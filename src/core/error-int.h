/* Internal to the library: error codes that arrive from outside (a peer's
 * status on the wire). */
#ifndef KVTIER_CORE_ERROR_INT_H
#define KVTIER_CORE_ERROR_INT_H

#include <stdbool.h>

/* True when err is one of the KVT_E* codes (KVT_OK excluded). */
bool kvt__err_known(int err);

#endif
