/* CP slot translation against the formulas of docs/cp.md (Layout),
 * exhaustively for small C, P, R, and against a brute-force picture of the
 * views: the read view is every lane's shard laid out rank-major, the write
 * view one shard. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "kvtier/cp.h"
#include "kvtier/error.h"

Test(cp, the_example_of_the_issue) {
    kvt_cp_layout_t l = {4, 8, 64};
    cr_assert_eq(kvt_cp_read_slot(&l, 64), 512);
    cr_assert_eq(kvt_cp_write_slot(&l, 64), 0);
    cr_assert(kvt_cp_owns(&l, 1, 64) && !kvt_cp_owns(&l, 0, 64));
}

Test(cp, formulas_exhaustively) {
    for (uint32_t C = 1; C <= 5; C++)
        for (uint64_t P = 1; P <= 6; P++)
            for (uint64_t R = 1; R <= 5; R++) {
                kvt_cp_layout_t l = {C, R, P};
                cr_assert_eq(kvt_cp_layout_check(&l, NULL), KVT_OK);
                uint64_t slots = C * R * P;
                /* the read view as a picture: shard of each rank, rank-major */
                uint8_t *seen = calloc(slots, 1), *seen_w = calloc((size_t)C * R * P, 1);
                for (uint64_t s = 0; s < slots; s++) {
                    uint64_t page = s / P, off = s % P, owner = page % C, local = page / C;
                    cr_assert_eq(kvt_cp_page(&l, s), page);
                    cr_assert_eq(kvt_cp_offset(&l, s), off);
                    cr_assert_eq(kvt_cp_owner(&l, page), owner);
                    cr_assert_eq(kvt_cp_local(&l, page), local);
                    uint64_t rd = kvt_cp_read_slot(&l, s), wr = kvt_cp_write_slot(&l, s);
                    cr_assert_eq(rd, (owner * R + local) * P + off, "C %u P %lu R %lu slot %lu", C, P, R, s);
                    cr_assert_eq(wr, local * P + off);
                    cr_assert_lt(rd, slots);
                    cr_assert_eq(seen[rd]++, 0, "two slots share read slot %lu", rd);
                    cr_assert_eq(rd / (R * P), owner, "the read slot is in its owner's shard");
                    cr_assert_eq(rd % (R * P), wr, "and at its write slot there");
                    cr_assert_eq(seen_w[owner * R * P + wr]++, 0);
                    for (uint32_t r = 0; r < C; r++) cr_assert_eq(kvt_cp_owns(&l, r, s), r == owner);
                }
                free(seen);
                free(seen_w);
            }
}

Test(cp, padding_passes_through) {
    kvt_cp_layout_t l = {4, 8, 64};
    cr_assert_eq(kvt_cp_read_slot(&l, KVT_CP_PAD), KVT_CP_PAD);
    cr_assert_eq(kvt_cp_write_slot(&l, KVT_CP_PAD), KVT_CP_PAD);
    cr_assert_eq(kvt_cp_page(&l, KVT_CP_PAD), KVT_CP_PAD);
    cr_assert_eq(kvt_cp_read_page(&l, KVT_CP_PAD), KVT_CP_PAD);
    for (uint32_t r = 0; r < 4; r++) cr_assert(!kvt_cp_owns(&l, r, KVT_CP_PAD));
    uint64_t slots[] = {0, KVT_CP_PAD, 64, 65, KVT_CP_PAD, 128, 192, 256};
    uint8_t mask[8];
    /* rank 1 owns pages 1 and 5 (slots 64, 65 are page 1; 256 is page 4) */
    cr_assert_eq(kvt_cp_owned_mask(&l, 1, slots, 8, mask), 2);
    const uint8_t want[] = {0, 0, 1, 1, 0, 0, 0, 0};
    for (int i = 0; i < 8; i++) cr_assert_eq(mask[i], want[i], "slot %d", i);
}

Test(cp, selections) {
    kvt_cp_layout_t l = {3, 10, 16};
    kvt_cp_pair_t pairs[12], out[12];
    for (int i = 0; i < 12; i++) pairs[i] = (kvt_cp_pair_t){100 + (uint64_t)i, i == 5 ? KVT_CP_PAD : (uint64_t)i};
    size_t total = 0;
    for (uint32_t r = 0; r < 3; r++) {
        size_t k = kvt_cp_select_loads(&l, r, pairs, 12, out);
        for (size_t j = 0; j < k; j++) {
            uint64_t dev = out[j].host - 100; /* the logical page it came from */
            cr_assert_eq(dev % 3, r, "rank %u loads only its own pages", r);
            cr_assert_eq(out[j].device, dev / 3, "into its local page");
        }
        total += k;
    }
    cr_assert_eq(total, 11, "every page but the padding is loaded by exactly one rank");
    cr_assert_eq(kvt_cp_select_backups(&l, pairs, 12, out), 12);
    for (int i = 0; i < 12; i++) {
        cr_assert_eq(out[i].host, pairs[i].host);
        cr_assert_eq(out[i].device, i == 5 ? KVT_CP_PAD : (uint64_t)(i % 3) * 10 + (uint64_t)i / 3);
    }
}

Test(cp, bad_layouts) {
    kvt_cp_layout_t bad[] = {{0, 1, 1}, {1, 0, 1}, {1, 1, 0}, {4, UINT64_MAX / 2, 64}};
    for (int i = 0; i < 4; i++) cr_assert_eq(kvt_cp_layout_check(&bad[i], NULL), KVT_EINVAL, "case %d", i);
    cr_assert_eq(kvt_cp_layout_check(NULL, NULL), KVT_EINVAL);
}
