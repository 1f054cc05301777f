/* The ABI rule for structs that start with a `size` field (docs/engine.md,
 * "ABI"), in one place.
 *
 * In (configurations the caller fills): the caller's first `size` bytes are
 * laid over the library's defaults, so a program built against an older,
 * smaller struct gets the defaults for the fields it does not know. A
 * caller built against a newer, larger struct is accepted only if every
 * byte past what this library knows is zero (a field it set cannot be
 * honoured). A size smaller than the size field itself is refused. This is
 * the rule of Linux's extensible system calls (openat2, clone3).
 *
 * Out (statistics and info the library fills): the first min(size, ours)
 * bytes are written, nothing past them; the caller's size is kept. */
#ifndef KVTIER_CORE_ABI_INT_H
#define KVTIER_CORE_ABI_INT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kvtier/error.h"

/* dst (n bytes) holds the defaults; src is the caller's struct of *(const
 * uint32_t *)src bytes. KVT_OK, or KVT_EINVAL with dst unchanged. dst's own
 * size field is set to n. */
static inline int kvt__abi_in(void *dst, size_t n, const void *src) {
    uint32_t size;
    memcpy(&size, src, sizeof(size));
    if (size < sizeof(uint32_t)) return KVT_EINVAL;
    for (size_t i = n; i < size; i++)
        if (((const unsigned char *)src)[i] != 0) return KVT_EINVAL;
    memcpy(dst, src, size < n ? size : n);
    uint32_t ours = (uint32_t)n;
    memcpy(dst, &ours, sizeof(ours));
    return KVT_OK;
}

/* Copies the first min(caller's size, n) bytes of the full struct src to the
 * caller's dst, keeping dst's size field. KVT_EINVAL for a size smaller than
 * the size field. */
static inline int kvt__abi_out(void *dst, const void *src, size_t n) {
    uint32_t size;
    memcpy(&size, dst, sizeof(size));
    if (size < sizeof(uint32_t)) return KVT_EINVAL;
    size_t k = size < n ? size : n;
    if (k > sizeof(uint32_t)) memcpy((unsigned char *)dst + sizeof(uint32_t), (const unsigned char *)src + sizeof(uint32_t), k - sizeof(uint32_t));
    return KVT_OK;
}

#endif
