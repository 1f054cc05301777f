/* Private to the transfer engine: how a run of pages between two tiers
 * becomes contiguous copies (spans).
 *
 * Every tier is planes (src/tier/tier-int.h). A pair's plan cuts the logical
 * layer at both sides' plane boundaries and joins neighbouring pieces into
 * one chunk wherever both sides continue contiguously (the same plane, or a
 * plane that starts where the previous one ends). Then, for a run of k pages:
 *
 *   PLAN_RUN     a page is one block on both sides and pages follow each
 *                other on both: one span of k x page_bytes
 *                (page_first <-> page_first)
 *   PLAN_PAGE    a page is one block on both sides, but strides differ or
 *                pad: one span per page
 *   PLAN_CHUNKS  per layer, per chunk: one span of k x len where both sides'
 *                page stride is the chunk's length (layer_first <->
 *                layer_first; a one-plane engine tier without padding against
 *                a layer_first tier), else one span per page
 *                (page_first <-> layer_first: one per page per layer)
 *
 * so a run of k pages takes fixed + per_page x k spans, known at submit.
 * The existing tier pairs are the one-plane case of this, span for span.
 */
#ifndef KVTIER_XFER_INT_H
#define KVTIER_XFER_INT_H

#include "../tier/tier-int.h"
#include "kvtier/xfer.h"

/* Copy faults (the testing library's kvt_xfer_set_faults, kvtier/testing.h,
 * documents them): the nth copy counted from the call fails or is delayed,
 * and each copy fails or is delayed with a probability drawn from seed. */
typedef struct kvt__xfer_faults {
    uint64_t fail_nth;
    uint64_t delay_nth, delay_ns;
    double fail_p, delay_p;
    uint64_t delay_max_ns;
    uint64_t seed;
} kvt__xfer_faults_t;

/* Arms f (NULL disarms) and restarts the copy count. KVT_EINVAL for a
 * probability outside [0, 1], nothing changed. */
int kvt__xfer_set_faults(kvt_xfer_t *x, const kvt__xfer_faults_t *f);

/* The engine's tier at index i, or NULL (out of range): for the callers that
 * name a tier both ways (kvt_cache_attach) to check they agree. */
kvt_tier_t *kvt__xfer_tier(const kvt_xfer_t *x, unsigned i);

/* Whether the engine records and verifies checksums (its config's
 * `checksum`): a store over a checksummed tier it fills refuses every put
 * when it does not (the pages' sums never written). */
bool kvt__xfer_checksums(const kvt_xfer_t *x);

#define KVT__MAX_CHUNKS (2 * KVT_TIER_MAX_PLANES)

typedef struct kvt__chunk {
    uint64_t len;
    uint64_t soff, doff; /* from the start of the source's / destination's plane piece */
    uint8_t sp, dp;      /* the planes it starts in */
    bool runs;           /* both sides' page stride is len: a run is one span per layer */
} kvt__chunk_t;

typedef enum { KVT__PLAN_RUN, KVT__PLAN_PAGE, KVT__PLAN_CHUNKS } kvt__plan_kind_t;

typedef struct kvt__plan {
    kvt__plan_kind_t kind;
    uint32_t layers, nchunks;
    uint64_t page_bytes;
    uint64_t fixed, per_page; /* spans of a run of k pages: fixed + per_page x k */
    kvt__chunk_t chunk[KVT__MAX_CHUNKS];
} kvt__plan_t;

/* The plan of copies from s to d (same layers and layer_bytes). */
void kvt__plan_make(kvt__plan_t *pl, const kvt_tier_t *s, const kvt_tier_t *d);

static inline uint64_t kvt__plan_spans(const kvt__plan_t *pl, uint64_t len) { return pl->fixed + pl->per_page * len; }

/* Writes the kvt__plan_spans(pl, len) spans of the run src..src+len-1 ->
 * dst..dst+len-1 to out; returns how many. */
size_t kvt__plan_emit(const kvt__plan_t *pl, const kvt_tier_t *d, uint32_t dst, const kvt_tier_t *s, uint32_t src,
                      uint32_t len, kvt__span_t *out);

#endif
