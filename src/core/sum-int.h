/* Checksums of page and object bytes: XXH3-64, through libxxhash's x86
 * dispatcher where the library has one (KVT_HAVE_XXH_DISPATCH, found by
 * CMakeLists.txt). The dispatcher runs the widest kernel the CPU has
 * (AVX-512, AVX2, else SSE2); the plain XXH3_64bits of Debian's libxxhash is
 * its SSE2 build. Same values either way (XXH3 does not depend on the vector
 * width). What it buys: the checksum of a fused copy + checksum keeps up with
 * the copy on a CPU with wide vector units, where the SSE2 kernel falls
 * behind it (docs/store.md: 1.3 against 3.4 us a 64 KiB payload).
 *
 * For bulk bytes only: a short key (a page's 64 bytes of tokens) gains
 * nothing from the wide kernels and would pay the dispatch's indirect call,
 * so the radix tree calls XXH3_64bits directly. */
#ifndef KVTIER_SUM_INT_H
#define KVTIER_SUM_INT_H

#include <stddef.h>
#include <stdint.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t */
#include <xxhash.h>
#if KVT_HAVE_XXH_DISPATCH
#define XXH_DISPATCH_DISABLE_REPLACE /* the calls below name the dispatcher; nothing else is renamed */
#include <xxh_x86dispatch.h>
#endif

/* XXH3-64 of n bytes at p. */
static inline uint64_t kvt__sum(const void *p, size_t n) {
#if KVT_HAVE_XXH_DISPATCH
    return XXH3_64bits_dispatch(p, n);
#else
    return XXH3_64bits(p, n);
#endif
}

/* Feeds n bytes at p into st (after XXH3_64bits_reset; XXH3_64bits_digest to finish). */
static inline void kvt__sum_update(XXH3_state_t *st, const void *p, size_t n) {
#if KVT_HAVE_XXH_DISPATCH
    XXH3_64bits_update_dispatch(st, p, n);
#else
    XXH3_64bits_update(st, p, n);
#endif
}

#endif
