/* kvtier replay --data on a hybrid model: the window pages and checkpoints
 * are real bytes that follow the cache's moves (replay_pieces.c). Every
 * piece a hit reads in L1 must be the one the match rule says, byte for
 * byte (--verify; a mismatch fails the run), the copies' timing must steer
 * no decision, and a copy that fails costs the hit, never a wrong piece. The store's side (real objects of
 * the pieces' bytes): test_replay_hybrid_l3.c. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <stdio.h>

#include "common/json.h"
#include "common/run.h"

/* the built-in workload: its sessions come back often, so that small tiers both evict and hit */
#define WORKLOAD "--requests", "1000", "--groups", "full:2:64,window:64:4:64,state:2:1024", "--l1-pages", "128", \
                 "--l2-pages", "512", "--check-every", "50", "--json"
#define WINDOW_PIECE 4096 /* 4 layers x 64 bytes x 16 tokens */

static const cJSON *hybrid_of(const cJSON *o) {
    const cJSON *h = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "runs"), 0), "hybrid");
    cr_assert_not_null(h, "no runs[0].hybrid");
    return h;
}

static double data_of(const cJSON *h, const char *what, const char *field) {
    return sub(cJSON_GetObjectItem(h, "data"), what, field);
}

/* Under both write policies the pieces go down to L2 and come back into
 * L1, and every one a hit reads is its own (the content of its key and
 * group); the full pages too; the same hits as without bytes. */
Test(replay_hybrid_data, the_bytes_follow_the_moves_through_l1_and_l2, .timeout = 120) {
    static const char *const POLICIES[] = {"write_back", "write_through"};
    for (int p = 0; p < (kvt_sanitized_run() ? 1 : 2); p++) { /* sanitized: the bytes of one policy */
        run_result_t r = run_argv((const char *const[]){NULL, "replay", WORKLOAD, "--write-policy", POLICIES[p], "--data",
                                                        "--verify", NULL});
        cJSON *o = json_of(&r);
        const cJSON *h = hybrid_of(o);
        cr_assert_eq(data_of(h, "pieces", "mismatches"), 0, "%s", POLICIES[p]);
        cr_assert_eq(data_of(h, "full_pages", "mismatches"), 0, "%s", POLICIES[p]);
        cr_assert_gt(data_of(h, "pieces", "verified"), 1000, "%s: pieces of hits checked", POLICIES[p]);
        double loaded = sub(h, "stats", "pieces_loaded");
        cr_assert_gt(loaded, 50, "%s: pieces loaded back from L2", POLICIES[p]);
        cr_assert_geq(data_of(h, "pieces", "bytes_up"), loaded * 2048, "%s: each load copied", POLICIES[p]);
        cr_assert_leq(data_of(h, "pieces", "bytes_up"), loaded * WINDOW_PIECE, "%s", POLICIES[p]);
        cr_assert_gt(data_of(h, "pieces", "bytes_down"), 0);
        cr_assert_eq(data_of(h, "pieces", "copy_failures"), 0);

        if (kvt_sanitized_run()) { /* the comparisons are figures: the plain run holds them */
            cJSON_Delete(o);
            run_free(&r);
            continue;
        }
        /* the copies' timing steers nothing: three workers per engine decide as one does */
        run_result_t t = run_argv((const char *const[]){NULL, "replay", WORKLOAD, "--write-policy", POLICIES[p], "--data",
                                                        "--threads", "3", NULL});
        cJSON *to = json_of(&t);
        const cJSON *th = hybrid_of(to);
        static const char *const same[] = {"hit_tokens", "pieces_loaded", "round_evictions", "pieces_refused"};
        for (int i = 0; i < 4; i++)
            cr_assert_eq(sub(h, "stats", same[i]), sub(th, "stats", same[i]), "%s: %s", POLICIES[p], same[i]);
        /* and the full groups' pages decide as without bytes (the pieces' copies, run out of order, are
         * waited for: their decisions can differ from the in-order moves of a metadata-only run) */
        run_result_t m = run_argv((const char *const[]){NULL, "replay", WORKLOAD, "--write-policy", POLICIES[p], NULL});
        cJSON *mo = json_of(&m);
        cr_assert_eq(sub(h, "stats", "full_hit_tokens"), sub(hybrid_of(mo), "stats", "full_hit_tokens"), "%s", POLICIES[p]);
        cJSON_Delete(o), cJSON_Delete(to), cJSON_Delete(mo);
        run_free(&r), run_free(&t), run_free(&m);
    }
}

/* --layout and --layers shape the full groups' pages as they do a radix
 * replay's (the pieces are one piece each): the bytes follow the moves
 * all the same. */
Test(replay_hybrid_data, the_full_pages_take_the_layout_asked, .timeout = 120) {
    run_result_t r = run_argv((const char *const[]){NULL, "replay", WORKLOAD, "--data", "--verify", "--layout",
                                                    "layer_first", "--layers", "4", NULL});
    cJSON *o = json_of(&r);
    const cJSON *full = cJSON_GetObjectItem(cJSON_GetObjectItem(hybrid_of(o), "data"), "full_pages");
    cr_assert_str_eq(cJSON_GetObjectItem(full, "layout")->valuestring, "layer_first");
    cr_assert_eq(num(full, "layers"), 4);
    cr_assert_eq(num(full, "page_bytes"), 2 * 64 * 16, "the full group's page: 2 layers x 64 bytes x 16 tokens");
    cr_assert_eq(num(full, "mismatches"), 0);
    cr_assert_gt(num(full, "verified_hits"), 1000, "full pages of hits checked");
    cr_assert_gt(num(full, "verified_loads"), 1000, "full pages loaded back from L2 checked");
    cJSON_Delete(o);
    run_free(&r);
}

/* Copies that fail (kvtier-test --copy-faults): the pieces they carried are
 * absent where they were going, a hit that needed one is recomputed (not
 * served), and no piece read is ever wrong; every check of the cache holds. */
Test(replay_hybrid_data, copies_that_fail_cost_hits_never_bytes, .timeout = 120) {
    run_result_t r = run_argv((const char *const[]){kvtier_test_bin(), "replay", WORKLOAD, "--data", "--verify",
                                                    "--copy-faults", "0.05", NULL});
    cJSON *o = json_of(&r);
    const cJSON *h = hybrid_of(o);
    cr_assert_gt(data_of(h, "pieces", "copy_failures"), 0);
    cr_assert_gt(sub(h, "data", "hits_unserved"), 0, "a hit whose piece failed to reach L1");
    cr_assert_gt(data_of(h, "pieces", "verified"), 500);
    cr_assert_eq(data_of(h, "pieces", "mismatches"), 0);
    cr_assert_eq(data_of(h, "full_pages", "mismatches"), 0);
    cJSON_Delete(o);
    run_free(&r);
}

/* --soak on a hybrid model: the hybrid cache alone (not the single-pass
 * comparisons) replays its requests pass after pass, its pieces through the
 * data plane with copies failing, every piece a hit reads still its own;
 * from the middle of the run to its end the same descriptors and threads,
 * and kvtier's bytes in use no higher but for the batches in flight (as the
 * radix replay's soak, test_replay_data.c). */
Test(replay_hybrid_data, soak_passes_with_copy_faults, .timeout = 120) {
    run_result_t r = run_argv((const char *const[]){kvtier_test_bin(), "replay", "--requests", "200", "--groups",
                                                    "full:2:64,window:64:4:64,state:2:1024", "--l1-pages", "128",
                                                    "--l2-pages", "512", "--data", "--verify", "--copy-faults", "0.01",
                                                    "--soak", "3", "--json", NULL});
    cJSON *o = json_of(&r);
    const cJSON *run = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "runs"), 0), *h = hybrid_of(o);
    cr_assert_null(cJSON_GetObjectItem(run, "every_layer_full"), "a soak runs one cache");
    cr_assert_null(cJSON_GetObjectItem(run, "state_at_ends_only"), "a soak runs one cache");
    double passes = soak_held_flat(cJSON_GetObjectItem(h, "soak"), 2, r.out);
    cr_assert_eq(num(h, "requests"), 200 * passes, "every pass replays the 200 requests");
    cr_assert_gt(data_of(h, "pieces", "copy_failures"), 0, "the faults were on");
    cr_assert_gt(data_of(h, "pieces", "verified"), 0);
    cr_assert_eq(data_of(h, "pieces", "mismatches"), 0);
    cr_assert_eq(data_of(h, "full_pages", "mismatches"), 0);
    cJSON_Delete(o);
    run_free(&r);
}
