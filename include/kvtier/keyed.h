/* kvtier — the keyed page cache: host pages found by a 128-bit key.
 *
 * An engine that names its KV blocks itself (a vLLM block hash with its group
 * index, an SGLang storage key, an LMCache chunk key) never shows kvtier
 * tokens, so the radix tree has nothing to match. The keyed cache keeps the
 * tier below the engine's own prefix cache: each key owns one page of a host
 * tier (an L2 page id, handed out by an extent allocator), and the cache
 * answers which keys are there, reserves pages for new ones, and chooses what
 * to evict.
 *
 * A key's life:
 *
 *   absent --prepare_store--> PENDING --complete_store(ok)--> READY (pins 0)
 *                                 |                            |  ^
 *                 complete_store(failed): absent          pin  |  | unpin
 *                                                              v  |
 *                                                          READY (pins > 0)
 *
 * Only a READY key with no pins can be evicted; a PENDING key answers
 * KVT_KEYED_PENDING to lookup (its bytes are still being written).
 *
 * Eviction order. Every key carries a recency score, a uint64 the caller sets
 * (at prepare_store, and by touch): the evictable key with the smallest score
 * goes first, ties to the smaller key ((hi, lo) compared as unsigned
 * integers). A caller that wants plain LRU passes a counter it increments per
 * use; vLLM's manager passes its request-ordered ranks (kvtier.vllm). The
 * order is kept in an indexed binary heap: insert, remove and re-score are
 * O(log E), E the evictable keys; a lookup is one hash probe.
 *
 * Free room. A prepare_store whose m new keys do not fit the F free pages
 * must evict m - F keys; it then evicts up to T = ceil(free_room * pages)
 * more (computed in double, as Python's math.ceil(free_room * pages); fewer
 * when fewer are evictable), so that T pages are free after the store and
 * the next stores find room without evicting on their critical path. A
 * store that fits evicts nothing, whatever the free room. Keys given as
 * protected (the request's own) are never evicted: the eviction takes the
 * smallest (score, hi, lo) evictable keys that are not protected.
 *
 * Pages. Deterministic: the same calls give the same pages. The new keys of
 * a prepare_store, in the order of keys[], take first the recycled pages:
 * those of keys whose store failed or that kvt_keyed_remove took out since
 * the last successful prepare_store or reset (in the order they left), then
 * those of the keys this call evicts (in eviction order); the rest come
 * from one reserve of the extent
 * allocator (kvt_extalloc_reserve, contiguous-preferred, alloc.h), its runs
 * in order, each run's pages ascending. Recycled pages the new keys do not
 * take go back to the allocator, also when there are no new keys. (So a
 * store that evicts reuses the evicted pages.)
 *
 * Failure leaves nothing changed: a prepare_store that cannot fit every new
 * key (too few evictable pages outside the protected keys) returns
 * KVT_ENOSPC with the cache exactly as it was, save its store_refusals
 * counter; pin on a key that is absent or pending returns KVT_ENOENT /
 * KVT_EBUSY and pins nothing. KVT_ENOMEM leaves nothing changed either;
 * only prepare_store, remove and reset can run out of memory (the cache keeps
 * room for what complete_store, pin, unpin and touch may need).
 *
 * Events. With cfg.events, each key stored (complete_store ok) and each key
 * removed (evicted, a failed store, kvt_keyed_remove, reset) is recorded in
 * order: evictions inside prepare_store, in eviction order; stores and failed
 * stores at complete_store, in the order of its keys; kvt_keyed_remove's in
 * the order of its keys; a reset's removals in eviction order.
 * kvt_keyed_take_events hands them out and forgets them.
 *
 * ARC (cfg.policy KVT_KEYED_ARC): the order of vLLM's ARC policy
 * (vllm/v1/kv_offload/cpu/policies/arc.py, vLLM 0.33) step for step, so that
 * a vLLM offloading manager over this cache decides as vLLM's own does. Every
 * present key is in T1 (stored, not used again) or T2 (used again), each in
 * recency order; two ghosts, B1 and B2, remember up to `pages` keys each that
 * were evicted from T1 and T2; a target size of T1 lies in [0, pages]. Scores
 * play no part (prepare_store takes NULL; kvt_keyed_touch does nothing).
 *   - prepare_store: the new keys join T1 as its most recent, in the order of
 *     keys[], and leave the ghosts. Eviction is on demand only (free_room must
 *     be 0): each victim is T1's least recent evictable unprotected key while
 *     T1's keys (this call's new ones not counted, the victims taken so far
 *     taken off) number at least floor(target), else T2's; either list is the
 *     other's fallback. A victim joins its list's ghost as its most recent;
 *     a ghost past `pages` keys forgets its oldest.
 *   - a key taken out otherwise (a failed store, kvt_keyed_remove, reset)
 *     leaves its list and joins no ghost; reset also empties the ghosts and
 *     sets the target to 0.
 *   - the hooks below: kvt_keyed_arc_touch, _missed and _finish.
 *
 * Threads: none inside; one thread at a time calls a cache.
 */
#ifndef KVTIER_KEYED_H
#define KVTIER_KEYED_H

#include "kvtier/export.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvt_keyed kvt_keyed_t;

typedef struct kvt_key128 {
    uint64_t hi, lo;
} kvt_key128_t;

enum { KVT_KEYED_SCORES = 0, KVT_KEYED_ARC = 1 }; /* eviction orders (kvt_keyed_config_t.policy) */

typedef struct kvt_keyed_config {
    uint32_t size;     /* sizeof(kvt_keyed_config_t), set by the caller */
    uint32_t events;   /* 1: record stored and removed events */
    uint64_t pages;    /* host pages the cache hands out, [0, pages); 1 .. 2^32 - 1 (ARC: 2^32 - 2) */
    double free_room;  /* fraction of pages kept free after an eviction, [0, 1); ARC: 0 */
    uint32_t policy;   /* KVT_KEYED_SCORES (0: the caller's scores) or KVT_KEYED_ARC */
    uint32_t reserved; /* 0 */
} kvt_keyed_config_t;

enum { KVT_KEYED_MISS = 0, KVT_KEYED_HIT = 1, KVT_KEYED_PENDING = 2 };
enum { KVT_KEYED_STORED = 0, KVT_KEYED_REMOVED = 1 };

typedef struct kvt_keyed_event {
    kvt_key128_t key;
    uint32_t kind; /* KVT_KEYED_STORED or KVT_KEYED_REMOVED */
    uint32_t why;  /* removed: 0 evicted, 1 failed store, 2 reset, 3 kvt_keyed_remove */
} kvt_keyed_event_t;

#define KVT_KEYED_STATS_FIELDS(X)                                        \
    X(pages, GAUGE, "host pages the cache hands out")                    \
    X(free_pages, GAUGE, "pages held by no key")                         \
    X(keys, GAUGE, "keys present (pending or ready)")                    \
    X(pending, GAUGE, "keys whose store has not completed")              \
    X(pinned, GAUGE, "ready keys with at least one pin")                 \
    X(lookups, COUNTER, "lookup calls")                                  \
    X(hits, COUNTER, "lookups that found a ready key")                   \
    X(stores_prepared, COUNTER, "keys given pages by prepare_store")     \
    X(stores_completed, COUNTER, "keys made ready by complete_store")    \
    X(stores_failed, COUNTER, "keys dropped by a failed complete_store") \
    X(store_refusals, COUNTER, "prepare_store calls refused for room")   \
    X(evictions, COUNTER, "keys evicted")                                \
    X(loads, COUNTER, "keys pinned for a load")                          \
    X(removed, COUNTER, "keys removed by the caller (kvt_keyed_remove)")

typedef struct kvt_keyed_stats {
    uint32_t size; /* sizeof(kvt_keyed_stats_t), set by the caller */
#define KVT_STATS_FIELD_(name, kind, help) uint64_t name;
    KVT_KEYED_STATS_FIELDS(KVT_STATS_FIELD_)
#undef KVT_STATS_FIELD_
} kvt_keyed_stats_t;

/* KVT_EINVAL for a bad config (size below 4, or bytes past this library's
 * struct that are not zero; pages 0 or above 2^32 - 1; free_room NaN or
 * outside [0, 1); an unknown policy, reserved not 0; ARC with free_room not
 * 0 or pages 2^32 - 1), KVT_ENOMEM (ARC's two ghosts take 48 to 64 bytes
 * a page, allocated here). */
KVT_API int kvt_keyed_create(kvt_keyed_t **out, const kvt_keyed_config_t *cfg);
KVT_API void kvt_keyed_destroy(kvt_keyed_t *c);

/* KVT_KEYED_MISS, _HIT (ready) or _PENDING (store in flight); counted in
 * the lookups and hits stats. KVT_EINVAL for a NULL cache. */
KVT_API int kvt_keyed_lookup(kvt_keyed_t *c, kvt_key128_t key);
/* The page of a present key (pending or ready), or KVT_ENOENT. */
KVT_API int kvt_keyed_page(const kvt_keyed_t *c, kvt_key128_t key, uint64_t *page);

/* Gives the keys of keys[0..n) that are absent a page each, in order, and
 * scores them scores[i] (keys already present, pending or ready, keep
 * theirs: touch them to change it). Evicts, smallest score first, what they
 * need and then the free-room target, never a key of protect[0..nprotect)
 * (a present key of keys[] is not protected unless listed there). Out:
 * pages[i] is the new page of keys[i], or UINT64_MAX when keys[i] was
 * already present (or repeats an earlier key of the call); evicted[0..*nevicted)
 * the keys evicted, in order. capacity is the room evicted has; n + T
 * (essay) always suffices. Under ARC scores is not read (NULL will do).
 * Fails with nothing changed: KVT_EINVAL (a NULL pointer with a nonzero
 * count: nothing written); with pages[] all UINT64_MAX and *nevicted 0,
 * KVT_ENOSPC when the new
 * keys do not fit (store_refusals counts it), KVT_ERANGE when the keys to
 * evict exceed capacity, KVT_ENOMEM. */
KVT_API int kvt_keyed_prepare_store(kvt_keyed_t *c, const kvt_key128_t *keys, const uint64_t *scores, size_t n,
                                    const kvt_key128_t *protect, size_t nprotect, uint64_t *pages,
                                    kvt_key128_t *evicted, size_t capacity, size_t *nevicted);
/* The pending keys of keys[0..n) become ready (ok) or absent, their pages
 * free (!ok). Keys absent or already ready are skipped. Never fails. */
KVT_API void kvt_keyed_complete_store(kvt_keyed_t *c, const kvt_key128_t *keys, size_t n, int ok);

/* Pins keys[0..n) for a load (each must be ready: KVT_ENOENT when one is
 * absent, KVT_EBUSY when one is pending, KVT_ERANGE when one would hold
 * more than 2^32 - 1 pins, the first such key deciding; nothing pinned
 * then) and writes their pages to pages[0..n) (NULL: not
 * written). A pinned key is not evicted. A key may be pinned many times,
 * also within one call; each counts in the loads stat. */
KVT_API int kvt_keyed_pin(kvt_keyed_t *c, const kvt_key128_t *keys, size_t n, uint64_t *pages);
/* Drops one pin of each of keys[0..n) (complete_load); a key whose last pin
 * goes is evictable again, at its current score. KVT_EINVAL, nothing
 * changed, when one is not pinned (absent, pending, or listed more times
 * than it has pins). */
KVT_API int kvt_keyed_unpin(kvt_keyed_t *c, const kvt_key128_t *keys, size_t n);

/* Sets the score of each present key of keys[0..n) (absent keys are
 * skipped; a key listed twice keeps the later score). A pending or pinned
 * key keeps it for when it becomes evictable. Under ARC: nothing. */
KVT_API void kvt_keyed_touch(kvt_keyed_t *c, const kvt_key128_t *keys, const uint64_t *scores, size_t n);

/* Removes the ready, unpinned keys of keys[0..n) and frees their pages (a
 * removed event each, why 3, in the order of keys[]); absent, pending and
 * pinned keys, and repeats, are skipped. What a caller does with a key whose
 * page it found bad. *nremoved (NULL: not written) counts the keys removed,
 * also in the removed stat. KVT_EINVAL (a NULL pointer with a nonzero
 * count), KVT_ENOMEM; nothing changed then. */
KVT_API int kvt_keyed_remove(kvt_keyed_t *c, const kvt_key128_t *keys, size_t n, size_t *nremoved);

/* Removes every key (a removed event each, in eviction order) and gives
 * every page back. KVT_EBUSY, nothing changed, while a key is pending or
 * pinned; KVT_ENOMEM, nothing changed. Counted in no stat (not evictions). */
KVT_API int kvt_keyed_reset(kvt_keyed_t *c);

/* ARC's hooks, as vLLM's ARC policy has them (the order's text above):
 * KVT_EINVAL, nothing changed, unless the cache's policy is KVT_KEYED_ARC,
 * for a NULL pointer with a nonzero count, or a flag above 2; nothing fails
 * otherwise. Each walks
 * keys[0..n) last first, as vLLM's policy walks a request's keys.
 *
 * A key found in a ghost adapts the target toward that ghost's list: in B1,
 * target += max(1, |B2| / |B1|) (at most pages), in B2, target -= max(1,
 * |B1| / |B2|) (at least 0), each division in double; the key becomes its
 * ghost's most recent and stays there until a store takes it out. */
/* touch: a key in T1 moves to T2 as its most recent when ready (a pending
 * key: T1's most recent); a key in T2 becomes T2's most recent; an absent key
 * in a ghost adapts the target. */
KVT_API int kvt_keyed_arc_touch(kvt_keyed_t *c, const kvt_key128_t *keys, size_t n);
/* on_store_miss: each key in a ghost adapts the target (vLLM's manager calls
 * it once per request for the new keys of a store, before prepare_store). */
KVT_API int kvt_keyed_arc_missed(kvt_keyed_t *c, const kvt_key128_t *keys, size_t n);
enum { KVT_KEYED_ARC_STORED = 1, KVT_KEYED_ARC_REUSED = 2 };
/* on_request_finished: each present key of keys[] by flags[i]:
 * KVT_KEYED_ARC_STORED (the request stored it and did not use it: the most
 * recent of its list), KVT_KEYED_ARC_REUSED (the request used it: from T1
 * to T2, or T2's most recent), 0 nothing; absent keys are skipped. */
KVT_API int kvt_keyed_arc_finish(kvt_keyed_t *c, const kvt_key128_t *keys, const uint8_t *flags, size_t n);

/* Copies up to cap events, oldest first, into out and forgets them; returns
 * how many. */
KVT_API size_t kvt_keyed_take_events(kvt_keyed_t *c, kvt_keyed_event_t *out, size_t cap);

KVT_API int kvt_keyed_stats(const kvt_keyed_t *c, kvt_keyed_stats_t *out);

/* Recomputes every counter and invariant (the heap's order and indexes, the
 * hash table, the pages against the allocator); 0 or KVT_ECORRUPT, naming
 * the first broken one in *why (why may be NULL), as every kvtier check()
 * does. KVT_EINVAL for a NULL cache; KVT_ENOMEM when its work array cannot
 * be had. */
KVT_API int kvt_keyed_check(const kvt_keyed_t *c, const char **why);

#ifdef __cplusplus
}
#endif

#endif
