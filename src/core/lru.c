/* An exact LRU set of 64-bit keys: the modeled L3 of metadata-only runs (a
 * store of cap pages whose calls complete at once).
 *
 * Slots 0..cap-1 hold the keys, on a doubly linked list from the most to the
 * least recently used; an open-addressing index (linear probing, deletion by
 * backward shift) maps a key to its slot. Putting into a full set evicts the
 * least recently used key. 24 bytes a slot plus the index; every operation
 * O(1) expected.
 */
#include <string.h>

#include "lru-int.h"
#include "kvtier/error.h"
#include "mem-int.h"

#define NIL UINT32_MAX

static size_t home(const kvt__lru_t *l, uint64_t key) {
    key ^= key >> 31;
    key *= 0x94d049bb133111ebull;
    return (size_t)(key ^ (key >> 29)) & l->mask;
}

int kvt__lru_init(kvt__lru_t *l, size_t cap) {
    memset(l, 0, sizeof(*l));
    if (cap == 0 || cap >= NIL) return cap == 0 ? KVT_OK : KVT_EINVAL;
    size_t tsize = 16;
    while (tsize < 2 * cap) tsize *= 2;
    l->cap = cap;
    l->mask = tsize - 1;
    l->head = l->tail = NIL;
    l->key = kvt__malloc(cap * sizeof(uint64_t));
    l->prev = kvt__malloc(cap * sizeof(uint32_t));
    l->next = kvt__malloc(cap * sizeof(uint32_t));
    l->index = kvt__malloc(tsize * sizeof(uint32_t));
    if (l->key == NULL || l->prev == NULL || l->next == NULL || l->index == NULL) {
        kvt__lru_fini(l);
        return KVT_ENOMEM;
    }
    memset(l->index, 0xff, tsize * sizeof(uint32_t));
    return KVT_OK;
}

void kvt__lru_fini(kvt__lru_t *l) {
    if (l->cap) {
        kvt__free(l->key, l->cap * sizeof(uint64_t));
        kvt__free(l->prev, l->cap * sizeof(uint32_t));
        kvt__free(l->next, l->cap * sizeof(uint32_t));
        kvt__free(l->index, (l->mask + 1) * sizeof(uint32_t));
    }
    memset(l, 0, sizeof(*l));
}

/* The index position of key, or the empty position where its probe ends. */
static size_t find(const kvt__lru_t *l, uint64_t key) {
    size_t i = home(l, key);
    while (l->index[i] != NIL && l->key[l->index[i]] != key) i = (i + 1) & l->mask;
    return i;
}

static void unlink_slot(kvt__lru_t *l, uint32_t s) {
    if (l->prev[s] != NIL) l->next[l->prev[s]] = l->next[s];
    else l->head = l->next[s];
    if (l->next[s] != NIL) l->prev[l->next[s]] = l->prev[s];
    else l->tail = l->prev[s];
}

static void push_front(kvt__lru_t *l, uint32_t s) {
    l->prev[s] = NIL;
    l->next[s] = l->head;
    if (l->head != NIL) l->prev[l->head] = s;
    l->head = s;
    if (l->tail == NIL) l->tail = s;
}

static void unindex(kvt__lru_t *l, size_t i) {
    l->index[i] = NIL;
    for (size_t j = (i + 1) & l->mask; l->index[j] != NIL; j = (j + 1) & l->mask) {
        size_t h = home(l, l->key[l->index[j]]);
        if (((j - h) & l->mask) >= ((j - i) & l->mask)) {
            l->index[i] = l->index[j];
            l->index[j] = NIL;
            i = j;
        }
    }
}

bool kvt__lru_has(const kvt__lru_t *l, uint64_t key) { return l->cap && l->index[find(l, key)] != NIL; }

bool kvt__lru_touch(kvt__lru_t *l, uint64_t key) {
    if (l->cap == 0) return false;
    uint32_t s = l->index[find(l, key)];
    if (s == NIL) return false;
    unlink_slot(l, s);
    push_front(l, s);
    return true;
}

bool kvt__lru_put(kvt__lru_t *l, uint64_t key) {
    if (l->cap == 0 || kvt__lru_touch(l, key)) return false;
    uint32_t s;
    bool evicted = false;
    if (l->n == l->cap) { /* the least recently used key makes room */
        s = l->tail;
        unindex(l, find(l, l->key[s]));
        unlink_slot(l, s);
        evicted = true;
    } else {
        s = (uint32_t)l->n++;
    }
    l->key[s] = key;
    l->index[find(l, key)] = s;
    push_front(l, s);
    return evicted;
}

bool kvt__lru_remove(kvt__lru_t *l, uint64_t key) {
    if (l->cap == 0) return false;
    size_t i = find(l, key);
    uint32_t s = l->index[i];
    if (s == NIL) return false;
    unindex(l, i);
    unlink_slot(l, s);
    uint32_t last = (uint32_t)--l->n; /* keep slots dense: the last one moves into s */
    if (s != last) {
        l->key[s] = l->key[last];
        l->prev[s] = l->prev[last];
        l->next[s] = l->next[last];
        if (l->prev[s] != NIL) l->next[l->prev[s]] = s;
        else l->head = s;
        if (l->next[s] != NIL) l->prev[l->next[s]] = s;
        else l->tail = s;
        l->index[find(l, l->key[s])] = s;
    }
    return true;
}

void kvt__lru_clear(kvt__lru_t *l) {
    if (l->cap == 0) return;
    memset(l->index, 0xff, (l->mask + 1) * sizeof(uint32_t));
    l->n = 0;
    l->head = l->tail = NIL;
}
