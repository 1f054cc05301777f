/* The testing library's hooks (kvtier/testing.h) over the library's
 * internal fault points: copy faults in the transfer engine, a delay in the
 * store's workers. */
#include <string.h>

#include "../core/abi-int.h"
#include "../store/store-int.h"
#include "../xfer/xfer-int.h"
#include "kvtier/error.h"
#include "kvtier/testing.h"

int kvt_xfer_set_faults(kvt_xfer_t *x, const kvt_xfer_faults_t *user) {
    if (x == NULL) return KVT_EINVAL;
    if (user == NULL) return kvt__xfer_set_faults(x, NULL);
    kvt_xfer_faults_t f;
    memset(&f, 0, sizeof(f));
    if (kvt__abi_in(&f, sizeof(f), user) != KVT_OK) return KVT_EINVAL;
    kvt__xfer_faults_t in = {.fail_nth = f.fail_nth, .delay_nth = f.delay_nth, .delay_ns = f.delay_ns,
                             .fail_p = f.fail_p, .delay_p = f.delay_p, .delay_max_ns = f.delay_max_ns, .seed = f.seed};
    return kvt__xfer_set_faults(x, &in);
}

int kvt_store_set_delay(kvt_store_t *s, uint32_t delay_us) { return kvt__store_set_delay(s, delay_us); }

int kvt_store_set_clock(kvt_store_t *s, uint64_t (*now_ns)(void *arg), void *arg) {
    if (s == NULL) return KVT_EINVAL;
    kvt__store_set_clock(s, now_ns, arg);
    return KVT_OK;
}
