/* CP slot translation (include/kvtier/cp.h). */
#include "kvtier/cp.h"
#include "kvtier/error.h"

int kvt_cp_layout_check(const kvt_cp_layout_t *l, const char **why) {
    const char *w = l == NULL                                                           ? "no layout"
                    : l->ranks == 0 || l->pages_per_rank == 0 || l->slots_per_page == 0 ? "a zero size"
                    : l->pages_per_rank > UINT64_MAX / l->ranks / l->slots_per_page     ? "C x R x P overflows 64 bits"
                                                                                        : NULL;
    if (why) *why = w;
    return w ? KVT_EINVAL : KVT_OK;
}

uint64_t kvt_cp_read_slot(const kvt_cp_layout_t *l, uint64_t s) {
    if (s == KVT_CP_PAD) return KVT_CP_PAD;
    return kvt_cp_read_page(l, kvt_cp_page(l, s)) * l->slots_per_page + kvt_cp_offset(l, s);
}

uint64_t kvt_cp_write_slot(const kvt_cp_layout_t *l, uint64_t s) {
    if (s == KVT_CP_PAD) return KVT_CP_PAD;
    return kvt_cp_local(l, kvt_cp_page(l, s)) * l->slots_per_page + kvt_cp_offset(l, s);
}

bool kvt_cp_owns(const kvt_cp_layout_t *l, uint32_t rank, uint64_t s) {
    return s != KVT_CP_PAD && kvt_cp_owner(l, kvt_cp_page(l, s)) == rank;
}

size_t kvt_cp_owned_mask(const kvt_cp_layout_t *l, uint32_t rank, const uint64_t *slots, size_t n, uint8_t *mask) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += mask[i] = kvt_cp_owns(l, rank, slots[i]);
    return k;
}

size_t kvt_cp_select_loads(const kvt_cp_layout_t *l, uint32_t rank, const kvt_cp_pair_t *pairs, size_t n,
                           kvt_cp_pair_t *out) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (pairs[i].device != KVT_CP_PAD && kvt_cp_owner(l, pairs[i].device) == rank)
            out[k++] = (kvt_cp_pair_t){pairs[i].host, kvt_cp_local(l, pairs[i].device)};
    return k;
}

size_t kvt_cp_select_backups(const kvt_cp_layout_t *l, const kvt_cp_pair_t *pairs, size_t n, kvt_cp_pair_t *out) {
    for (size_t i = 0; i < n; i++) out[i] = (kvt_cp_pair_t){pairs[i].host, kvt_cp_read_page(l, pairs[i].device)};
    return n;
}
