/* kvtier — the testing library: hooks that make the library misbehave on
 * purpose, and the page content model the tests check bytes against.
 *
 * None of this is in libkvtier.so, libkvtier.a or the installed headers.
 * It is built as libkvtier-testing.a (these functions only; link it before
 * libkvtier.a) and libkvtier-testing.so (libkvtier.so's objects plus these,
 * for a Python test run: KVTIER_LIB), both from the same tree as the
 * library they hook into, so its structs need not keep an ABI across
 * versions; kvt_xfer_faults_t still starts with `size`, like every struct a
 * caller fills (docs/abi.md). The tests, the fuzz targets, the fault
 * campaigns, the benchmarks and `kvtier-test` (the command with the
 * test-only options) link it.
 *
 * The content model (kvt_pattern_*, kvt_tier_pattern_*) is also compiled
 * into the command itself, whose --data, --verify and pd hand-offs write
 * and check pages with it; it changes nothing in the library. */
#ifndef KVTIER_TESTING_H
#define KVTIER_TESTING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvtier/export.h"
#include "kvtier/pd.h"
#include "kvtier/store.h"
#include "kvtier/tier.h"
#include "kvtier/xfer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- copy faults ---------------------------------------------------------------- */

/* Copies are counted from the call on, in the order workers start them; the
 * nth fails (KVT_EIO) or is delayed by delay_ns. With fail_p / delay_p, each
 * copy fails / is delayed by a uniform time up to delay_max_ns with that
 * probability, drawn from seed and its number. */
typedef struct kvt_xfer_faults {
    uint32_t size; /* sizeof(kvt_xfer_faults_t) */
    uint64_t fail_nth;
    uint64_t delay_nth, delay_ns;
    double fail_p, delay_p;
    uint64_t delay_max_ns;
    uint64_t seed;
} kvt_xfer_faults_t;

/* Arms f on the transfer engine (NULL disarms) and restarts the count.
 * KVT_EINVAL (a NULL engine, a size below the size field or bytes set past
 * what this library knows, a probability outside [0, 1]): nothing changed. */
KVT_API int kvt_xfer_set_faults(kvt_xfer_t *x, const kvt_xfer_faults_t *f);

/* ---- a store far away ---------------------------------------------------------- */

/* Latency before every batch the store's workers run from now on,
 * microseconds (0: none): what waits on the store (the prefetch policies)
 * under a slow store. KVT_EINVAL (NULL, more than 10 s): nothing changed. */
KVT_API int kvt_store_set_delay(kvt_store_t *s, uint32_t delay_us);

/* The wall clock a dir store keeps recency by (the access times its gets
 * set, at most one a second per object, and the times its puts give new
 * files), nanoseconds since the epoch; NULL: the real one. A test of the
 * order steps the clock instead of sleeping. Set it before the store's
 * first call. KVT_EINVAL for a NULL store. */
KVT_API int kvt_store_set_clock(kvt_store_t *s, uint64_t (*now_ns)(void *arg), void *arg);

/* ---- bad peers at a PD receiver ------------------------------------------------- */

/* Opens bad peers against the receiver's own two ports, before the caller
 * tells any rank the ports (so they are first in line), as spec says:
 * "stall:N,rank0,garbage,data-garbage,data-geometry,data-huge,
 * data-outside,data-wrap,data-stall:N,hold:MS" (docs/pd.md); waits until the
 * page server has judged the data-port ones. *hold_ms gets MS (0 without
 * hold): how long the caller should hold the ports back. The peers stay
 * open until the receiver is destroyed. Called on the receiver's owning
 * thread, not concurrently with its other calls. KVT_EINVAL (a bad word;
 * peers opened so far stay). */
KVT_API int kvt_pd_receiver_test_peers(kvt_pd_receiver_t *r, const char *spec, uint64_t *hold_ms);

/* ---- the page content model ----------------------------------------------------- */

/* Page content derived from a page hash and a layer: what `replay --data`
 * and the tests write into new pages and expect to read back. Word i (8
 * bytes, little-endian; a short tail takes the low bytes) is
 * splitmix64(hash.lo ^ rotl(hash.hi, 17) ^ layer << 48 ^ i). */
KVT_API void kvt_pattern_fill(void *buf, size_t len, uint64_t hash_lo, uint64_t hash_hi, uint32_t layer);
/* True when buf holds exactly that content. */
KVT_API bool kvt_pattern_check(const void *buf, size_t len, uint64_t hash_lo, uint64_t hash_hi, uint32_t layer);
/* The same for a whole page of a tier, every layer, through kvt_tier_write
 * and kvt_tier_read (so for every kind of tier); scratch holds layer_bytes.
 * fill: KVT_OK or kvt_tier_write's error; check: true when it matches. */
KVT_API int kvt_tier_pattern_fill(kvt_tier_t *t, uint64_t page, uint64_t hash_lo, uint64_t hash_hi, void *scratch);
KVT_API bool kvt_tier_pattern_check(const kvt_tier_t *t, uint64_t page, uint64_t hash_lo, uint64_t hash_hi, void *scratch);

#ifdef __cplusplus
}
#endif
#endif
