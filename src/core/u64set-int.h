/* An ordered set of uint64 keys: a B+tree with 512-byte nodes.
 *
 * Used where kvtier needs an ordered index with O(log n) insert, erase,
 * lower-bound and neighbour steps and a small memory cost per key (the extent
 * allocator's two free-extent indexes; the cache's eviction orders). See
 * u64set.c for the structure and its invariants.
 *
 * Nodes come from a kvt__nodepool that several sets may share. A caller that
 * must make several changes atomically first reserves enough spare nodes with
 * kvt__nodepool_reserve(); after that, inserts cannot fail for lack of memory.
 * Every single operation is atomic on its own: it either succeeds or returns
 * an error having changed nothing.
 */
#ifndef KVTIER_U64SET_INT_H
#define KVTIER_U64SET_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVT_U64SET_NODE_BYTES 512u
#define KVT_U64SET_MAX_HEIGHT 16 /* 31^15 keys: far beyond any use */

typedef struct kvt__u64node kvt__u64node_t;

typedef struct kvt__nodepool {
    kvt__u64node_t *spare; /* singly linked free nodes */
    size_t nspare;
    size_t live; /* nodes held by sets */
} kvt__nodepool_t;

typedef struct kvt__u64set {
    kvt__u64node_t *root;
    uint32_t height; /* 0: empty; 1: the root is a leaf */
    size_t count;
    kvt__nodepool_t *pool;
} kvt__u64set_t;

/* A position in a set: the path from the root to one key of a leaf. Valid
 * until the set changes. */
typedef struct kvt__u64cur {
    const kvt__u64set_t *set;
    kvt__u64node_t *node[KVT_U64SET_MAX_HEIGHT];
    uint16_t idx[KVT_U64SET_MAX_HEIGHT];
    bool valid;
} kvt__u64cur_t;

void kvt__nodepool_init(kvt__nodepool_t *pool);
/* Frees every spare node; the sets using the pool must be finished first. */
void kvt__nodepool_fini(kvt__nodepool_t *pool);
/* Ensures at least `n` spare nodes. KVT_ENOMEM leaves the pool as it was. */
int kvt__nodepool_reserve(kvt__nodepool_t *pool, size_t n);
/* Frees spare nodes beyond `keep`. */
void kvt__nodepool_trim(kvt__nodepool_t *pool, size_t keep);
/* Bytes held: live and spare nodes. */
size_t kvt__nodepool_bytes(const kvt__nodepool_t *pool);

void kvt__u64set_init(kvt__u64set_t *s, kvt__nodepool_t *pool);
void kvt__u64set_fini(kvt__u64set_t *s); /* returns every node to the pool */

/* Nodes an insert may need in the worst case (splits up to a new root). */
static inline size_t kvt__u64set_insert_nodes(const kvt__u64set_t *s) { return s->height + 1; }

/* KVT_EEXIST or KVT_ENOMEM leave the set unchanged. */
int kvt__u64set_insert(kvt__u64set_t *s, uint64_t key);
/* Spare nodes that suffice for `inserts` inserts into s, with any erases
 * between them (erases give nodes back): the smaller of a split at every
 * level of each insert and every node a tree of count + inserts keys can
 * have (the first alone would set 6 KB aside a run: 6 GB to free a million). */
size_t kvt__u64set_insert_bound(const kvt__u64set_t *s, size_t inserts);
/* KVT_ENOENT when absent. Never allocates. */
int kvt__u64set_erase(kvt__u64set_t *s, uint64_t key);
/* Erases the key under a valid cursor of s without a second descent (the
 * cursor holds the path); the cursor is invalid afterwards. Never allocates. */
void kvt__u64set_erase_at(kvt__u64set_t *s, kvt__u64cur_t *cur);
/* Replaces `old` by `new` in place. The caller guarantees that no key lies
 * between them (nor equals `new`), so the order is unchanged. KVT_ENOENT when
 * `old` is absent; KVT_EINVAL when `new` is out of order with old's
 * neighbours in its leaf (the ones this can see). Never allocates. */
int kvt__u64set_replace(kvt__u64set_t *s, uint64_t old, uint64_t new_key);
bool kvt__u64set_contains(const kvt__u64set_t *s, uint64_t key);

/* Cursor placement; each returns cur->valid. */
bool kvt__u64set_lower_bound(const kvt__u64set_t *s, uint64_t key, kvt__u64cur_t *cur); /* first >= key */
bool kvt__u64set_last_below(const kvt__u64set_t *s, uint64_t key, kvt__u64cur_t *cur);  /* last < key */
bool kvt__u64set_first(const kvt__u64set_t *s, kvt__u64cur_t *cur);
bool kvt__u64set_last(const kvt__u64set_t *s, kvt__u64cur_t *cur);
bool kvt__u64cur_next(kvt__u64cur_t *cur);
bool kvt__u64cur_prev(kvt__u64cur_t *cur);
uint64_t kvt__u64cur_key(const kvt__u64cur_t *cur);

/* Recomputes order, bounds, occupancy, depth and the count. KVT_ECORRUPT on a
 * violation (and *why names it when non-NULL). */
int kvt__u64set_check(const kvt__u64set_t *s, const char **why);

#endif
