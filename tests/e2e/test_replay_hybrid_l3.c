/* kvtier replay on a hybrid model with a store (--l3 URL): the full groups'
 * pages and each window or state group's pieces as objects in a dir store
 * and in a real Redis (started here on 127.0.0.1). A second process
 * continues a request from the first one's objects alone (known figures:
 * every whole page, and the W / P window pages its end needs); a piece
 * the store refuses is never served (the hit is recomputed); two instances
 * share pieces through Redis. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/json.h"
#include "common/redis.h"
#include "common/run.h"

#define TRACE KVT_SOURCE_DIR "/data/mooncake_synthetic_trace.jsonl"
/* room for all of request 1 (2510 pages of 16 tokens, 40160 tokens); every piece written through to the store */
#define SHAPE "--l1-pages", "4096", "--l2-pages", "8192", "--write-policy", "write_through", "--l3-write-policy", \
              "write_through", "--prefetch-policy", "wait_complete", "--json"
#define PAYLOAD 64               /* a metadata-only run's stand-in page (replay_l3.h) */

static char dir_[128], url_[160];
static redis_srv_t S;

static void setup(void) {
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(dir_, sizeof(dir_), "%s/kvt-e2e-hybrid-l3-%d", base, (int)getpid());
    snprintf(url_, sizeof(url_), "dir:%s", dir_);
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *f) {
    (void)st, (void)flag, (void)f;
    return remove(path), 0;
}

static void teardown(void) {
    redis_stop(&S);
    nftw(dir_, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

TestSuite(replay_hybrid_l3, .init = setup, .fini = teardown, .timeout = 240);

static cJSON *replay(run_result_t *r, const char *const *argv) {
    *r = run_argv(argv);
    return json_of(r);
}

static const cJSON *hybrid_of(const cJSON *o) {
    const cJSON *h = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "runs"), 0), "hybrid");
    cr_assert_not_null(h, "no runs[0].hybrid");
    return h;
}

/* h.l3[what][op][field]; 0 for an operation never called (not printed) */
static double store_stat(const cJSON *h, const char *what, const char *op, const char *field) {
    const cJSON *s = cJSON_GetObjectItem(cJSON_GetObjectItem(h, "l3"), what);
    cr_assert_not_null(s, "no l3.%s", what);
    const cJSON *x = cJSON_GetObjectItem(s, op);
    return x ? num(x, field) : 0;
}

/* Flips a payload byte of every object in the dir store of `payload` bytes
 * whose header names the model identity `model` (docs/store.md: the
 * identity digest is XXH3-128 of the identity text, at offset P + 32).
 * Returns how many. */
static int corrupt_identity(const char *root, const char *model, int payload) {
    char id[512];
    snprintf(id, sizeof(id),
             "kvtier-l3-id/1;model=%s;page_tokens=16;layers=1;layer_bytes=%d;dtype_bytes=2;tp=0/1;cp=0/1;ns=default", model,
             payload);
    XXH128_hash_t want = XXH3_128bits(id, strlen(id));
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "find %s -type f -name '[0-9a-f]*'", root);
    FILE *list = popen(cmd, "r");
    cr_assert_not_null(list);
    int n = 0;
    char path[512];
    while (fgets(path, sizeof(path), list)) {
        path[strcspn(path, "\n")] = 0;
        int fd = open(path, O_RDWR);
        cr_assert_geq(fd, 0, "%s", path);
        struct stat st;
        cr_assert_eq(fstat(fd, &st), 0);
        if (st.st_size != payload + 80) { /* another geometry's object */
            close(fd);
            continue;
        }
        uint8_t head[16];
        cr_assert_eq(pread(fd, head, sizeof(head), payload + 32), (ssize_t)sizeof(head), "%s", path);
        uint64_t lo, hi;
        memcpy(&lo, head, 8);
        memcpy(&hi, head + 8, 8);
        if (lo == want.low64 && hi == want.high64) {
            uint8_t b;
            cr_assert_eq(pread(fd, &b, 1, 7), 1);
            b ^= 0x5a;
            cr_assert_eq(pwrite(fd, &b, 1, 7), 1);
            n++;
        }
        close(fd);
    }
    pclose(list);
    return n;
}

/* Process A serves request 1 and puts its pages and pieces; process B, cold,
 * serves it again from those objects alone: every whole page, with the
 * pieces its end needs from the store (gemma-3-like: the W / P = 1024 / 16
 * window pages before it; qwen3-next-like: the checkpoint at it). With those
 * pieces' objects damaged, B's gets are refused and it recomputes: no hit
 * served. model: a preset, or groups (--groups) whose pieces are payload
 * bytes; with data, the objects are the pages' and pieces' real bytes, and
 * B checks every one it reads (--data --verify). */
static void second_process(const char *model, double pieces, int payload, int data) {
    const char *flag = strchr(model, ':') ? "--groups" : "--model", *bytes = data ? "--data" : "--json",
               *verify = data ? "--verify" : "--json";
    run_result_t a, b, c;
    cJSON *ja = replay(&a, (const char *const[]){NULL, "replay", TRACE, flag, model, "--limit", "1", SHAPE, "--l3", url_,
                                                 bytes, NULL});
    const cJSON *ha = hybrid_of(ja);
    cr_assert_eq(num(ha, "hit_rate"), 0, "a cold cache and an empty store");
    double whole = num(cJSON_GetObjectItem(ha, "stats"), "tokens"); /* request 1 is whole pages */
    cr_assert_eq(whole, 40160);
    cr_assert_geq(store_stat(ha, "pieces", "put", "hits"), pieces, "the pieces its end needs are put");

    cJSON *jb = replay(&b, (const char *const[]){NULL, "replay", TRACE, flag, model, "--limit", "1", SHAPE, "--l3", url_,
                                                 bytes, verify, NULL});
    const cJSON *hb = hybrid_of(jb);
    cr_assert_eq(num(hb, "hit_rate"), 1, "%s: every whole page: %.4f", model, num(hb, "hit_rate"));
    cr_assert_eq(num(hb, "l3_hit_rate"), 1, "all of it through the store");
    cr_assert_eq(sub(hb, "l3", "cross_instance_hit_tokens"), whole, "full pages this process never put");
    cr_assert_eq(store_stat(hb, "pieces", "get", "hits"), pieces, "%s: the pieces n needs", model);
    cr_assert_eq(store_stat(hb, "full_pages", "get", "hits"), whole / 16);
    cr_assert_eq(sub(hb, "l3", "hits_unserved"), 0);
    if (data) { /* what B read came from A's objects, byte for byte */
        const cJSON *d = cJSON_GetObjectItem(hb, "data");
        cr_assert_eq(sub(d, "pieces", "verified"), pieces, "%s: the pieces n needs, checked in L1", model);
        cr_assert_eq(sub(d, "pieces", "mismatches"), 0);
        cr_assert_eq(sub(d, "full_pages", "verified_hits") + sub(d, "full_pages", "verified_loads"), whole / 16);
        cr_assert_eq(sub(d, "full_pages", "mismatches"), 0);
    }

    char identity[128], name[40];
    if (strchr(model, ':'))
        snprintf(name, sizeof(name), "groups-%016llx", (unsigned long long)XXH3_64bits(model, strlen(model)));
    else snprintf(name, sizeof(name), "%s", model);
    snprintf(identity, sizeof(identity), "%s/kept-every-0-branches/group-1", name);
    cr_assert_eq(corrupt_identity(dir_, identity, payload), store_stat(ha, "pieces", "put", "hits"),
                 "every piece object A put, and only those");
    cJSON *jc = replay(&c, (const char *const[]){NULL, "replay", TRACE, flag, model, "--limit", "1", SHAPE, "--l3", url_,
                                                 bytes, verify, NULL});
    const cJSON *hc = hybrid_of(jc);
    cr_assert_eq(store_stat(hc, "full_pages", "get", "hits"), whole / 16, "the full pages are whole");
    cr_assert_eq(store_stat(hc, "pieces", "get", "bad_objects"), pieces, "each damaged piece refused");
    cr_assert_eq(sub(hc, "l3", "hits_unserved"), 1);
    cr_assert_eq(sub(hc, "l3", "unserved_hit_tokens"), whole);
    cr_assert_eq(num(hc, "hit_rate"), 0, "a hit with a refused piece is recomputed, never served");
    cJSON_Delete(ja), cJSON_Delete(jb), cJSON_Delete(jc);
    run_free(&a), run_free(&b), run_free(&c);
}

Test(replay_hybrid_l3, a_second_process_continues_from_the_first_ones_window_pages) {
    second_process("gemma-3-like", 1024 / 16, PAYLOAD, 0);
}

Test(replay_hybrid_l3, a_second_process_continues_from_the_first_ones_checkpoint) {
    second_process("qwen3-next-like", 1, PAYLOAD, 0);
}

/* The same with real bytes (--data): the store's objects are the window
 * pages (4 layers x 64 bytes x 16 tokens) and the checkpoint (4 x 1024). */
Test(replay_hybrid_l3, a_second_process_continues_from_the_first_ones_bytes) {
    second_process("full:2:64,window:1024:4:64", 1024 / 16, 4096, 1);
    if (!kvt_sanitized_run()) second_process("full:2:64,state:4:1024", 1, 4096, 1); /* the same path, another kind */
}

/* Two instances on one real Redis, against the same two with no store: the
 * window pages and full pages that one instance put serve the other, the
 * totals are the instances' sums, every check of the cache holds. */
Test(replay_hybrid_l3, two_instances_share_pieces_through_redis) {
    cr_assert_eq(redis_start(&S, NULL), 0, "cannot start redis-server");
    char url[64];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d", S.port);
#define FLEET "--model", "gemma-3-like", "--l1-pages", "2048", "--l2-pages", "4096", "--limit", "300", "--instances", \
              "2", "--check-every", "50", "--write-policy", "write_through", "--json"
    run_result_t a, b;
    cJSON *ja = replay(&a, (const char *const[]){NULL, "replay", TRACE, FLEET, "--l3-write-policy", "write_through",
                                                 "--prefetch-policy", "wait_complete", "--l3", url, NULL});
    cJSON *jb = replay(&b, (const char *const[]){NULL, "replay", TRACE, FLEET, NULL});
    const cJSON *h = hybrid_of(ja), *inst = cJSON_GetObjectItem(ja, "instances");
    cr_assert_eq(cJSON_GetArraySize(inst), 2);
    double reqs = 0, l3 = 0, cross = 0, got = 0;
    for (int i = 0; i < 2; i++) {
        const cJSON *x = cJSON_GetArrayItem(inst, i);
        reqs += num(x, "requests_replayed");
        l3 += sub(x, "stats", "l3_hit_tokens");
        cross += sub(x, "l3", "cross_instance_hit_tokens");
        got += store_stat(x, "pieces", "get", "hits");
    }
    cr_assert_eq(reqs, 300, "every request went to one instance");
    cr_assert_eq(sub(h, "stats", "l3_hit_tokens"), l3, "the total is the instances' sum");
    cr_assert_eq(sub(h, "l3", "cross_instance_hit_tokens"), cross);
    cr_assert_eq(store_stat(h, "pieces", "get", "hits"), got);
    cr_assert_gt(cross, 0, "no instance found a full page the other put");
    cr_assert_gt(got, 0, "no window page came back from the store");
    cr_assert_gt(l3, 0);
    double with = num(h, "hit_rate"), without = num(hybrid_of(jb), "hit_rate");
    cr_assert_gt(with, without, "the shared store must add hits: %.4f with, %.4f without", with, without);
    /* the fleet's all-full comparison without a store: each cached token's pages in L1, L2 or both of
     * its instance's (the L2's free pages summed over both instances once put it below the model's) */
    const cJSON *full = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(jb, "runs"), 0), "every_layer_full");
    double bpt = num(jb, "all_full_bytes_per_token"), fb = num(full, "bytes_per_cached_token");
    cr_assert(fb >= bpt && fb <= 2 * bpt, "all-full bytes per cached token %.0f for a model of %.0f", fb, bpt);
    cJSON_Delete(ja), cJSON_Delete(jb);
    run_free(&a), run_free(&b);
}

/* A store that cannot be reached from the start: the run says so and goes
 * on with L1 and L2, deciding exactly as with no store at all (the window
 * weight given: its default depends on an L3). */
Test(replay_hybrid_l3, the_store_down_from_the_start_leaves_l1_and_l2_serving) {
    char url[64];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d", redis_free_port());
#define SMALL "--model", "gemma-3-like", "--l1-pages", "4096", "--l2-pages", "4096", "--limit", "600", "--window-weight", \
              "1", "--json"
    run_result_t a, b;
    cJSON *ja = replay(&a, (const char *const[]){NULL, "replay", TRACE, SMALL, "--l3", url, NULL});
    cJSON *jb = replay(&b, (const char *const[]){NULL, "replay", TRACE, SMALL, NULL});
    cr_assert_not_null(strstr(a.err, "going on without L3"), "%s", a.err);
    const cJSON *ha = hybrid_of(ja), *hb = hybrid_of(jb);
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetObjectItem(ha, "l3"), "down")));
    cr_assert(cJSON_IsString(cJSON_GetObjectItem(cJSON_GetObjectItem(ha, "l3"), "error")), "why, under the radix replay's key");
    cr_assert_gt(sub(hb, "stats", "hit_tokens"), 0);
    static const char *const same[] = {"hit_tokens", "round_evictions", "pieces_refused", "window_pages_stored"};
    for (int i = 0; i < 4; i++)
        cr_assert_eq(sub(ha, "stats", same[i]), sub(hb, "stats", same[i]), "%s", same[i]);
    cJSON_Delete(ja), cJSON_Delete(jb);
    run_free(&a), run_free(&b);
}
