/* Private to the transfer engine: the host copy of one span.
 *
 * Two ways to store, chosen per pair by where the bytes go next:
 *
 *   ordinary   memcpy: the destination lines land in cache. Right where the
 *              data is read next (loads into L1, the engine's own buffers).
 *   streaming  non-temporal stores (x86-64: AVX _mm256_stream_si256 where the
 *              CPU has it, else SSE2 _mm_stream_si128; then sfence): the lines
 *              go to memory through write-combining buffers without being read
 *              for ownership or evicting the cache. Right for large copies into
 *              a tier that is not read back soon (backups into host L2;
 *              docs/performance.md, *Transfer engine*, has the figures).
 *              Elsewhere it is memcpy.
 *
 * A span of KVT__STREAM_HUGE or more streams whatever the pair, and so does
 * every span of a batch of KVT__STREAM_HUGE bytes or more (the transfer
 * engine decides that, xfer.c): ordinary stores of it would keep only its
 * last few MiB in cache (the rest is evicted by the copy itself before
 * anyone reads it), so they buy nothing and cost the read-for-ownership of
 * every line.
 *
 * The engine fences once after the last span of a work item, not after each
 * span: a batch of many short spans streams as cheaply per byte as one long
 * one.
 *
 * A copy that also hashes (tiers with checksums) hashes the source block by
 * block right after copying it, while the block is still in L1: the
 * destination is never read back, so streaming and hashing stay one pass.
 */
#ifndef KVTIER_XFER_COPY_INT_H
#define KVTIER_XFER_COPY_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "../core/sum-int.h" /* XXH3_state_t, kvt__sum_update */

/* Spans shorter than this are copied with memcpy even when streaming: the
 * aligned head and tail cost more than the read-for-ownership saves. */
#define KVT__STREAM_MIN (4u << 10)

/* Streaming spans shorter than this go two at a time (kvt__copy_pair_unfenced);
 * longer ones are long enough to keep their own four quarters in flight. */
#define KVT__PAIR_MAX (64u << 10)

/* Spans this long stream into any tier (see above): well past a core's
 * private cache and a fair share of a shared L3. */
#define KVT__STREAM_HUGE (8u << 20)

/* The block a fused copy hashes at a time: well inside any L1d. */
#define KVT__SUM_BLOCK (16u << 10)

/* Whether a streamed body of 16 KiB or more goes as four quarters side by
 * side or as one stream of lines: which this machine streams faster, timed
 * once per process (copy.c), or KVT_COPY_STREAMS (1 or 4) when set.
 * kvt__copy_init times it now (the transfer engine's create does, so that
 * no copy waits for it), KVT_EINVAL when KVT_COPY_STREAMS holds anything
 * else (one stream then); kvt__copy_set_quarters forces a way (tests). */
int kvt__copy_init(void);
bool kvt__copy_quarters(void);
void kvt__copy_set_quarters(bool four);

/* n bytes src -> dst (not overlapping) with non-temporal stores, fenced
 * before it returns; any alignment, any n (memcpy where streaming is not
 * built or not worth it). */
void kvt__copy_stream(void *dst, const void *src, size_t n);

/* Whether a copy of n bytes streams: the pair streams (stream) and n >=
 * KVT__STREAM_MIN, or n >= KVT__STREAM_HUGE. */
static inline bool kvt__copy_streams(size_t n, bool stream) {
    return n >= KVT__STREAM_HUGE || (stream && n >= KVT__STREAM_MIN);
}

/* kvt__copy_stream where kvt__copy_streams(n, stream), else memcpy. */
void kvt__copy(void *dst, const void *src, size_t n, bool stream);

/* kvt__copy without the fence; returns whether it streamed (then the caller
 * fences once after its last span: kvt__copy_fence). */
bool kvt__copy_unfenced(void *dst, const void *src, size_t n, bool stream);

/* Whether two spans of n bytes each go side by side: they stream and are
 * shorter than KVT__PAIR_MAX. */
static inline bool kvt__copy_pairs(size_t n, bool stream) { return kvt__copy_streams(n, stream) && n < KVT__PAIR_MAX; }

/* Two copies of n bytes each (src0 -> dst0, src1 -> dst1; none of the four
 * ranges overlapping another's destination), as kvt__copy_unfenced would make
 * them one after the other; where kvt__copy_pairs(n, stream) and both
 * destinations sit alike against a 64-byte line, side by side, a line of each
 * in turn. Returns whether it streamed (the caller fences). */
bool kvt__copy_pair_unfenced(void *dst0, const void *src0, void *dst1, const void *src1, size_t n, bool stream);

/* n bytes src -> dst that also feeds them to st, in KVT__SUM_BLOCK blocks
 * hashed from the source just after each block is copied. With stream the
 * stores are streaming and NOT fenced (a span of many pages fences once:
 * kvt__copy_fence); the caller decides, by the span (kvt__copy_streams). */
void kvt__copy_sum(void *dst, const void *src, size_t n, bool stream, XXH3_state_t *st);

/* Orders the streaming stores before it ahead of the stores after it. */
void kvt__copy_fence(void);

#endif
