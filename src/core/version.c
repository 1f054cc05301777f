/* The library's version (include/kvtier/version.h). */
#include "kvtier/version.h"

#include "kvtier/net.h"
#include "kvtier/tier.h"

#define KVT_STR_(x) #x
#define KVT_STR(x) KVT_STR_(x)
#define KVT_VERSION_TEXT KVT_STR(KVT_VERSION_MAJOR) "." KVT_STR(KVT_VERSION_MINOR) "." KVT_STR(KVT_VERSION_PATCH)

unsigned kvt_version(void) { return KVT_VERSION_NUMBER; }

const char *kvt_version_string(void) {
    /* the four combinations, so that no buffer or lock is needed */
    static const char *const text[2][2] = {
        {KVT_VERSION_TEXT " (cuda: no, ucx: no)", KVT_VERSION_TEXT " (cuda: no, ucx: yes)"},
        {KVT_VERSION_TEXT " (cuda: yes, ucx: no)", KVT_VERSION_TEXT " (cuda: yes, ucx: yes)"},
    };
    return text[kvt_tier_cuda_built()][kvt_net_ucx_built()];
}
