/* The child map: finds a node's child from the child's first page in O(1)
 * expected, whatever the number of siblings.
 *
 * One table for the whole tree, keyed by (parent, namespace, digest of the
 * child's first page). The digest only narrows the search: a hit is confirmed
 * by comparing the first page's tokens, so two pages whose digests collide
 * are still told apart. Linear probing, load at most 1/2, and backward-shift
 * deletion (no tombstones). The key uses the parent's seq, not its address,
 * so the table's layout is the same in every run.
 */
#include <string.h>

#include "kvtier/error.h"
#include "radix-impl.h"

uint64_t kvt__cm_hash(const kvt_rnode_t *parent, uint32_t ns, uint64_t digest) {
    uint64_t h = digest ^ (parent->seq * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)ns * 0xc2b2ae3d27d4eb4full);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

static void place(kvt__cm_entry_t *e, size_t mask, uint64_t h, kvt_rnode_t *node) {
    size_t i = h & mask;
    while (e[i].node) i = (i + 1) & mask;
    e[i] = (kvt__cm_entry_t){h, node};
}

int kvt__cm_reserve(kvt_radix_t *r, size_t extra) {
    kvt__childmap_t *cm = &r->cm;
    if ((cm->n + extra) * 2 <= cm->cap) return KVT_OK;
    size_t cap = cm->cap ? cm->cap : 64;
    while ((cm->n + extra) * 2 > cap) cap *= 2;
    kvt__cm_entry_t *e = kvt__radix_alloc(r, cap * sizeof(*e));
    if (e == NULL) return KVT_ENOMEM;
    memset(e, 0, cap * sizeof(*e));
    for (size_t i = 0; i < cm->cap; i++)
        if (cm->e[i].node) place(e, cap - 1, cm->e[i].h, cm->e[i].node);
    kvt__radix_free(r, cm->e, cm->cap * sizeof(*e));
    cm->e = e;
    cm->cap = cap;
    return KVT_OK;
}

void kvt__cm_insert(kvt_radix_t *r, uint64_t h, kvt_rnode_t *node) {
    place(r->cm.e, r->cm.cap - 1, h, node);
    r->cm.n++;
}

kvt_rnode_t *kvt__cm_find(const kvt_radix_t *r, uint64_t h, const kvt_rnode_t *parent, uint32_t ns,
                          const int32_t *page) {
    const kvt__childmap_t *cm = &r->cm;
    if (cm->cap == 0) return NULL;
    size_t mask = cm->cap - 1;
    for (size_t i = h & mask; cm->e[i].node; i = (i + 1) & mask) {
        kvt_rnode_t *c = cm->e[i].node;
        if (cm->e[i].h == h && c->parent == parent && c->ns == ns &&
            memcmp(c->tokens, page, r->page_tokens * sizeof(int32_t)) == 0)
            return c;
    }
    return NULL;
}

static size_t slot_of(const kvt_radix_t *r, uint64_t h, const kvt_rnode_t *node) {
    size_t mask = r->cm.cap - 1, i = h & mask;
    while (r->cm.e[i].node != node) i = (i + 1) & mask; /* present by contract */
    return i;
}

void kvt__cm_replace(kvt_radix_t *r, uint64_t h, kvt_rnode_t *old, kvt_rnode_t *node) {
    r->cm.e[slot_of(r, h, old)].node = node;
}

void kvt__cm_remove(kvt_radix_t *r, uint64_t h, kvt_rnode_t *node) {
    kvt__cm_entry_t *e = r->cm.e;
    size_t mask = r->cm.cap - 1, i = slot_of(r, h, node);
    e[i].node = NULL;
    /* Shift back every entry of the probe run that the hole would hide. */
    for (size_t j = (i + 1) & mask; e[j].node; j = (j + 1) & mask) {
        size_t home = e[j].h & mask;
        if (((j - home) & mask) >= ((j - i) & mask)) {
            e[i] = e[j];
            e[j].node = NULL;
            i = j;
        }
    }
    r->cm.n--;
}

void kvt__cm_fini(kvt_radix_t *r) {
    kvt__radix_free(r, r->cm.e, r->cm.cap * sizeof(kvt__cm_entry_t));
    memset(&r->cm, 0, sizeof(r->cm));
}
