/* The node-array pool: where the tree keeps its nodes' tokens, page states
 * and page hashes.
 *
 * Each node has arrays sized by its page count, and a replay makes and drops
 * them by the million (an insert, a split, a trim to nothing). Straight from
 * malloc, arrays of 128 KiB and more are mmap'd one by one and unmapped on
 * free, so every insert of a long request would fault its memory in afresh,
 * 4 KiB at a time. The pool
 * carves arrays out of chunks (2 MiB, doubling to 16 MiB) and keeps freed
 * ones on a free list per size class for the next node:
 *
 *   chunk:  [ a 96 | b 160 | free 96 | c 640 | ......... bump -> end ]
 *   free[class 96] -> (the freed 96) -> NULL
 *
 * Size classes: 16, 32, 48, 64 bytes, then four per doubling (80, 96, 112,
 * 128, 160, ...), so rounding wastes at most a quarter. An array over 4 MiB
 * goes to the allocation hook directly. A request whose class list is empty
 * takes the smallest free block of a larger class (a bitmap of the lists
 * that hold one) and splits it: the rest goes onto the lists in the largest
 * pieces it holds (under 16 bytes is lost); only when no list can
 * serve it is a new block carved. (Without the split, a long run whose node
 * sizes drift would leave blocks of classes no longer asked for on the lists
 * and carve new chunks without end: radix/pool_reuses_what_it_holds.) A
 * block on list c is at least class c's size.
 *
 * A chunk is a whole number of 2 MiB from a 2 MiB boundary, asked for
 * transparent huge pages (kvt__malloc_huge): the tree's memory comes in one
 * fault per 2 MiB. Its slack is address space never touched, and is not
 * counted in the tree's bytes. (A chunk from plain malloc starts just past a
 * page boundary, so a 1 or 2 MiB one holds no aligned 2 MiB and a larger
 * one's ends none either: those would fault in 4 KiB at a time as the tree
 * grows.)
 *
 * Invariants: every block on a free list lies in a chunk, and is at least
 * its class's size; bit c of `nonempty` is set exactly when list c has a
 * block; `free_bytes` is the lists' blocks at their classes' sizes; `held` is
 * the chunks' bytes. Chunks go back only when the tree is destroyed: the
 * pool holds what the tree held at its peak, plus the rounding, plus the
 * pieces too small to be asked for again.
 *
 * Every pooled allocation is still an allocation point for the test hook
 * (kvt__mem_pooled_fails): an injected failure fails it as it would fail
 * malloc.
 *
 * Cost: allocate and free O(1) (a bitmap scan of two words); no memory is
 * touched but the first word of a block on a free list.
 */
#include <stdint.h>
#include <string.h>

#include "radix-impl.h"
#include "../core/mem-int.h"

#define POOL_FIRST (2u << 20)
#define POOL_LAST (16u << 20)
#if defined(__SANITIZE_ADDRESS__)
#define POOL_MAX 0 /* under AddressSanitizer every array is an allocation of its own: an overrun is caught */
#else
#define POOL_MAX (4u << 20)
#endif

/* The class of an n-byte array (n > 0), and the class's block size. */
static unsigned class_of(size_t n, size_t *size) {
    if (n <= 64) {
        *size = (n + 15) & ~(size_t)15;
        return (unsigned)(*size / 16 - 1);
    }
    unsigned e = 63u - (unsigned)__builtin_clzll((unsigned long long)(n - 1)); /* 2^e < n <= 2^(e+1), e >= 6 */
    size_t step = (size_t)1 << (e - 2), k = (n - 1 - ((size_t)1 << e)) / step;
    *size = ((size_t)1 << e) + (k + 1) * step;
    return 4 + (e - 6) * 4 + (unsigned)k;
}

/* Class c's block size (the inverse of class_of). */
static size_t size_of(unsigned c) {
    if (c < 4) return 16 * ((size_t)c + 1);
    unsigned e = 6 + (c - 4) / 4, k = (c - 4) % 4;
    return ((size_t)1 << e) + ((size_t)k + 1) * ((size_t)1 << (e - 2));
}

/* The largest class whose size is at most n (n >= 16). */
static unsigned floor_class(size_t n) {
    size_t size;
    unsigned c = class_of(n, &size);
    return size > n ? c - 1 : c;
}

static void push(kvt__pool_t *p, unsigned c, void *b) {
    memcpy(b, &p->free_[c], sizeof(void *));
    p->free_[c] = b;
    p->nonempty[c / 64] |= 1ull << (c % 64);
    p->free_bytes += size_of(c);
}

static void *pop(kvt__pool_t *p, unsigned c) {
    void *b = p->free_[c];
    memcpy(&p->free_[c], b, sizeof(void *));
    if (p->free_[c] == NULL) p->nonempty[c / 64] &= ~(1ull << (c % 64));
    p->free_bytes -= size_of(c);
    return b;
}

/* The smallest class >= c with a free block, or KVT__POOL_CLASSES. */
static unsigned first_nonempty(const kvt__pool_t *p, unsigned c) {
    for (unsigned w = c / 64; w < (KVT__POOL_CLASSES + 63) / 64; w++) {
        uint64_t bits = p->nonempty[w] & (w == c / 64 ? ~0ull << (c % 64) : ~0ull);
        if (bits) return w * 64 + (unsigned)__builtin_ctzll(bits);
    }
    return KVT__POOL_CLASSES;
}

/* A fresh chunk of at least `need` bytes to carve from (what is left of the
 * last one stays unused); false when the hook has no memory. */
static bool new_chunk(kvt_radix_t *r, size_t need) {
    kvt__pool_t *p = &r->pool;
    if (p->nchunks == p->chunk_cap) {
        size_t cap = p->chunk_cap ? 2 * p->chunk_cap : 8;
        kvt__pool_chunk_t *c = kvt__radix_alloc(r, cap * sizeof(*c));
        if (c == NULL) return false;
        if (p->nchunks) memcpy(c, p->chunk, p->nchunks * sizeof(*c));
        kvt__radix_free(r, p->chunk, p->chunk_cap * sizeof(*c));
        p->chunk = c;
        p->chunk_cap = cap;
    }
    size_t size = p->nchunks < 3 ? (size_t)POOL_FIRST << p->nchunks : POOL_LAST;
    if (size < need) size = (need + KVT__HUGE_PAGE - 1) & ~(KVT__HUGE_PAGE - 1);
    void *raw;
    char *at = kvt__malloc_huge(size, &raw);
    if (at == NULL) return false;
    r->bytes += (int64_t)size; /* the slack is never touched */
    p->chunk[p->nchunks++] = (kvt__pool_chunk_t){raw, size};
    p->bump = at;
    p->end = at + size;
    p->held += size;
    return true;
}

void *kvt__pool_alloc(kvt_radix_t *r, size_t n) {
    if (n == 0) n = 1;
    if (n > POOL_MAX) return kvt__radix_alloc(r, n);
    if (kvt__mem_pooled_fails()) return NULL; /* a test's injected failure reaches pooled arrays too */
    kvt__pool_t *p = &r->pool;
    size_t size;
    unsigned c = class_of(n, &size);
    unsigned d = first_nonempty(p, c);
    if (d < KVT__POOL_CLASSES) {
        char *b = pop(p, d), *at = b + size;
        /* the rest of a larger block, for later: in the largest pieces it holds (each at least 4/5 of what is left) */
        for (size_t rest = size_of(d) - size; rest >= 16;) {
            unsigned k = floor_class(rest);
            push(p, k, at);
            at += size_of(k);
            rest -= size_of(k);
        }
        return b;
    }
    if ((size_t)(p->end - p->bump) < size && !new_chunk(r, size)) return NULL;
    void *b = p->bump;
    p->bump += size;
    return b;
}

void kvt__pool_free(kvt_radix_t *r, void *b, size_t n) {
    if (b == NULL) return;
    if (n == 0) n = 1;
    if (n > POOL_MAX) {
        kvt__radix_free(r, b, n);
        return;
    }
    size_t size;
    push(&r->pool, class_of(n, &size), b);
}

void kvt__pool_fini(kvt_radix_t *r) {
    kvt__pool_t *p = &r->pool;
    for (size_t i = 0; i < p->nchunks; i++) {
        r->bytes -= (int64_t)p->chunk[i].n;
        kvt__free_huge(p->chunk[i].m, p->chunk[i].n);
    }
    kvt__radix_free(r, p->chunk, p->chunk_cap * sizeof(*p->chunk));
    memset(p, 0, sizeof(*p));
}
