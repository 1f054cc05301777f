/* Internal: an exact LRU set of 64-bit keys (lru.c). */
#ifndef KVTIER_CORE_LRU_INT_H
#define KVTIER_CORE_LRU_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The cache's modeled L3 (a store of cap pages whose calls complete at once) is one. */
typedef struct kvt__lru {
    uint64_t *key;
    uint32_t *prev, *next, *index; /* list links by slot; index: slot or UINT32_MAX */
    size_t cap, n, mask;
    uint32_t head, tail;           /* most and least recently used slot */
} kvt__lru_t;

int kvt__lru_init(kvt__lru_t *l, size_t cap); /* cap 0: a set that holds nothing */
void kvt__lru_fini(kvt__lru_t *l);
bool kvt__lru_has(const kvt__lru_t *l, uint64_t key);
bool kvt__lru_touch(kvt__lru_t *l, uint64_t key);  /* true (and now most recent) when present */
bool kvt__lru_put(kvt__lru_t *l, uint64_t key);    /* true when it evicted a key to make room */
bool kvt__lru_remove(kvt__lru_t *l, uint64_t key);
void kvt__lru_clear(kvt__lru_t *l); /* holds nothing, its room kept */
static inline size_t kvt__lru_size(const kvt__lru_t *l) { return l->n; }

#endif
