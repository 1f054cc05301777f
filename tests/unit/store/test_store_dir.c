/* The dir backend against its model: what was put is what a get serves,
 * byte for byte (kvt_tier_pattern_*); a wrong object on disk is refused and
 * counted; capacity evicts least recently used objects and the order
 * survives a reopen; a put that died mid-write leaves nothing readable. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "common/engine_model.h"
#include "core/mem-int.h"
#include "helpers.h"
#include "kvtier/testing.h"
#include "kvtier/rng.h"
#include "store/store-int.h"

static senv_t E;
static char root[64];
static char url[160];

static void setup(void) {
    snprintf(root, sizeof(root), "/tmp/kvt-store-dir-XXXXXX");
    cr_assert_not_null(mkdtemp(root));
    snprintf(url, sizeof(url), "dir:%s", root);
}
static void teardown(void) {
    senv_fini(&E);
    rmtree(root);
}

static void obj_path(const kvt_hash128_t *h, char *out, size_t cap) {
    char hex[33];
    kvt_store_key(E.store, h, hex);
    snprintf(out, cap, "%s/%.2s/%s", root, hex, hex);
}

TestSuite(store_dir, .init = setup, .fini = teardown);

Test(store_dir, roundtrip_page_first) {
    senv_init(&E, 64, 4, 1024, KVT_LAYOUT_PAGE_FIRST);
    cr_assert_eq(senv_open(&E, url), KVT_OK, "%s", kvt_store_last_error(NULL));
    cr_assert_str_eq(kvt_store_backend(E.store), "dir");
    roundtrip(&E, 32);
}

/* A relative root is the folder it named at open: after the process moves
 * (chdir), gets find what was put, and puts land in that tree, not one
 * under the new working directory that its index and bound never see. */
Test(store_dir, a_relative_root_stays_where_it_was_opened) {
    char a[200], b[200];
    snprintf(a, sizeof(a), "%s/a", root);
    snprintf(b, sizeof(b), "%s/b", root);
    cr_assert_eq(mkdir(a, 0700), 0);
    cr_assert_eq(mkdir(b, 0700), 0);
    cr_assert_eq(chdir(a), 0); /* (each test runs in a process of its own) */
    senv_init(&E, 8, 2, 256, KVT_LAYOUT_PAGE_FIRST);
    cr_assert_eq(senv_open(&E, "dir:l3"), KVT_OK, "%s", kvt_store_last_error(NULL));
    kvt_store_page_t p[4];
    put_filled(&E, p, 2, 100);
    cr_assert_eq(chdir(b), 0);
    wipe(&E, 0, 2);
    cr_assert_eq(run_op(E.store, kvt_store_get, p, 2).count, 2, "what was put before the chdir is found");
    cr_assert(check(&E, 100, 0) && check(&E, 101, 1));
    pages_of(p, 2, 200, 2);
    fill(&E, 200, 2, 2);
    cr_assert_eq(run_op(E.store, kvt_store_put, p, 2).count, 2);
    cr_assert_eq(sstats(E.store, KVT_STORE_PUT).stored_objects, 4);
    struct stat st;
    cr_assert_neq(stat("l3", &st), 0, "no tree under the new working directory");
    char hex[33], path[300];
    kvt_store_key(E.store, &p[0].hash, hex);
    snprintf(path, sizeof(path), "%s/l3/%.2s/%s", a, hex, hex);
    cr_assert_eq(stat(path, &st), 0, "the put after the chdir is in the tree opened");
}

/* Objects are ROOT/<2 hex>/<32 hex>. One in the two-level layout earlier
 * builds wrote (ROOT/<2 hex>/<2 hex>/<32 hex>) is not read, and the open
 * says where such objects are, once. */
static char opened_log[2048];
static void keep_open_log(void *arg, const char *msg) {
    (void)arg;
    size_t n = strlen(opened_log);
    snprintf(opened_log + n, sizeof(opened_log) - n, "%s\n", msg);
}

Test(store_dir, objects_of_the_two_level_layout_are_not_read) {
    senv_init(&E, 8, 1, 256, KVT_LAYOUT_PAGE_FIRST);
    cr_assert_eq(senv_open(&E, url), KVT_OK);
    kvt_store_page_t p[2];
    put_filled(&E, p, 2, 40);
    char now[300], old[400], hex[33];
    obj_path(&p[1].hash, now, sizeof(now));
    kvt_store_key(E.store, &p[1].hash, hex);
    kvt_store_close(E.store);
    E.store = NULL;
    char dir[300];
    snprintf(dir, sizeof(dir), "%s/%.2s/%.2s", root, hex, hex + 2);
    cr_assert_eq(mkdir(dir, 0755), 0);
    snprintf(old, sizeof(old), "%s/%s", dir, hex);
    cr_assert_eq(rename(now, old), 0);
    opened_log[0] = 0;
    E.cfg.log = keep_open_log;
    cr_assert_eq(senv_open(&E, url), KVT_OK);
    cr_assert(strstr(opened_log, "two-level layout") && strstr(opened_log, dir), "%s", opened_log);
    sres_t r = run_op(E.store, kvt_store_exists, p, 2);
    cr_assert_eq(r.r[0], KVT_STORE_OK);
    cr_assert_eq(r.r[1], KVT_STORE_MISS, "an object of the old layout was read");
}

Test(store_dir, roundtrip_layer_first) {
    senv_init(&E, 64, 3, 512, KVT_LAYOUT_LAYER_FIRST);
    cr_assert_eq(senv_open(&E, url), KVT_OK);
    roundtrip(&E, 20);
}

static void le_put(unsigned char *p, uint64_t v, unsigned n) {
    for (unsigned i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* The object on disk, every byte pinned against one built here from
 * docs/store.md alone (its identity text, key scheme and header table; XXH3
 * from libxxhash): the page page-first although the tier is layer-first,
 * then the 80-byte header (format version 2), and the file's name from the
 * key's hex. */
Test(store_dir, object_format) {
    enum { LAYERS = 3, LB = 136, PAGES = 4 };
    senv_init(&E, PAGES, LAYERS, LB, KVT_LAYOUT_LAYER_FIRST);
    E.cfg.tp_rank = 1, E.cfg.tp_size = 2; /* non-default fields show in the identity */
    E.cfg.ns = "tenant-a";
    cr_assert_eq(senv_open(&E, url), KVT_OK);
    /* the page: byte i of layer l is (7i + 31l + 5) mod 256, written where the tier keeps it */
    unsigned char payload[LAYERS * LB];
    for (uint32_t l = 0; l < LAYERS; l++) {
        unsigned char *pg = kvt_tier_addr(E.tier, 2, l);
        for (size_t i = 0; i < LB; i++) pg[i] = payload[l * LB + i] = (unsigned char)(7 * i + 31 * l + 5);
    }
    kvt_hash128_t h = {.lo = 0x0123456789abcdefull, .hi = 0xfedcba9876543210ull};
    kvt_store_page_t p = {.hash = h, .page = 2};
    cr_assert_eq(run_op(E.store, kvt_store_put, &p, 1).count, 1u);

    const char *id = "kvtier-l3-id/1;model=test-model;page_tokens=16;layers=3;layer_bytes=136;dtype_bytes=2;tp=1/2;cp=0/1;"
                     "ns=tenant-a";
    XXH128_hash_t ih = XXH3_128bits(id, strlen(id));
    unsigned char ident[16], kin[32], key[16];
    le_put(ident, ih.low64, 8), le_put(ident + 8, ih.high64, 8);
    memcpy(kin, ident, 16);
    le_put(kin + 16, h.lo, 8), le_put(kin + 24, h.hi, 8);
    XXH128_hash_t kh = XXH3_128bits(kin, 32);
    le_put(key, kh.low64, 8), le_put(key + 8, kh.high64, 8);
    enum { P = sizeof(payload) }; /* the header's offset */
    unsigned char want[sizeof(payload) + 80], *hd = want + P;
    memcpy(want, payload, sizeof(payload));
    memset(hd, 0, 80);
    memcpy(hd, "KVT3", 4);
    le_put(hd + 4, 2, 2);          /* version */
    le_put(hd + 6, 80, 2);         /* header bytes */
    le_put(hd + 8, LAYERS, 4);
    le_put(hd + 12, 16, 4);        /* page_tokens */
    le_put(hd + 16, LB, 8);        /* layer_bytes */
    le_put(hd + 24, sizeof(payload), 8);
    memcpy(hd + 32, ident, 16);
    memcpy(hd + 48, key, 16);
    le_put(hd + 64, XXH3_64bits(payload, sizeof(payload)), 8);
    le_put(hd + 72, XXH3_64bits(hd, 72), 8);

    char hex[33], path[256];
    for (int i = 0; i < 16; i++) snprintf(hex + 2 * i, 3, "%02x", key[i]);
    snprintf(path, sizeof(path), "%s/%.2s/%s", root, hex, hex);
    char lib_hex[33];
    kvt_store_key(E.store, &h, lib_hex);
    cr_assert_str_eq(lib_hex, hex, "the key");
    unsigned char got[sizeof(want) + 1];
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "no file %s", path);
    size_t n = fread(got, 1, sizeof(got), f);
    fclose(f);
    cr_assert_eq(n, sizeof(want), "object of %zu bytes", n);
    for (size_t i = 0; i < sizeof(want); i++) cr_assert_eq(got[i], want[i], "byte %zu: %02x, expected %02x", i, got[i], want[i]);
    /* and an object built here is served: the format is the one gets read */
    want[0] ^= 0xff, payload[0] ^= 0xff;
    le_put(hd + 64, XXH3_64bits(payload, sizeof(payload)), 8);
    le_put(hd + 72, XXH3_64bits(hd, 72), 8);
    f = fopen(path, "wb");
    cr_assert_eq(fwrite(want, 1, sizeof(want), f), sizeof(want));
    fclose(f);
    kvt_store_page_t q = {.hash = h, .page = 3};
    cr_assert_eq(run_op(E.store, kvt_store_get, &q, 1).count, 1u, "%s", kvt_store_last_error(E.store));
    for (uint32_t l = 0; l < LAYERS; l++)
        cr_assert(memcmp(kvt_tier_addr(E.tier, 3, l), payload + l * LB, LB) == 0, "layer %u", l);
    /* a version 1 object of this page (the header first, the payload after
     * it; same length): refused as such, a miss, and the page zeroed */
    unsigned char v1[sizeof(want)];
    memcpy(v1, hd, 80);
    le_put(v1 + 4, 1, 2);
    le_put(v1 + 72, XXH3_64bits(v1, 72), 8);
    memcpy(v1 + 80, payload, sizeof(payload));
    f = fopen(path, "wb");
    cr_assert_eq(fwrite(v1, 1, sizeof(v1), f), sizeof(v1));
    fclose(f);
    cr_assert_eq(run_op(E.store, kvt_store_get, &q, 1).r[0], KVT_STORE_BAD);
    cr_assert(strstr(kvt_store_last_error(E.store), "object format version 1") != NULL, "%s", kvt_store_last_error(E.store));
    for (uint32_t l = 0; l < LAYERS; l++)
        for (size_t i = 0; i < LB; i++) cr_assert_eq(((unsigned char *)kvt_tier_addr(E.tier, 3, l))[i], 0, "layer %u byte %zu", l, i);
}

static void write_file(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(b, 1, n, f), n);
    fclose(f);
}

static size_t read_file(const char *path, void *b, size_t cap) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    size_t n = fread(b, 1, cap, f);
    fclose(f);
    return n;
}

/* Garbage, another key's object, a truncated one, a flipped payload byte:
 * each a miss, counted as a bad object, and nothing of it in the tier page:
 * the page is as it was (an object refused before it reached the page) or
 * zeroed (one read straight into the page and refused there), never
 * anything else. */
Test(store_dir, wrong_objects_refused) {
    senv_init(&E, 16, 2, 1024, KVT_LAYOUT_PAGE_FIRST);
    cr_assert_eq(senv_open(&E, url), KVT_OK);
    kvt_store_page_t p[2];
    put_filled(&E, p, 2, 100);
    char a[256], b[256];
    obj_path(&p[0].hash, a, sizeof(a));
    obj_path(&p[1].hash, b, sizeof(b));
    size_t ob = kvt_store_object_bytes(E.store);
    unsigned char *good = malloc(ob), *other = malloc(ob), *junk = malloc(ob);
    cr_assert_eq(read_file(a, good, ob), ob);
    cr_assert_eq(read_file(b, other, ob), ob);
    for (size_t i = 0; i < ob; i++) junk[i] = (unsigned char)(i * 31 + 7);
    struct {
        const void *bytes;
        size_t n;
        const char *what;
    } bad[] = {{junk, ob, "bad magic"},     {other, ob, "another key"},      {good, ob - 100, "truncated"}, {good, 40, "shorter than an object"},
               {NULL, ob, "payload checksum"}, {NULL, ob + 1, "longer than an object"}, {NULL, ob + 4096, "longer than an object"},
               {NULL, ob, "header checksum"}};
    unsigned char *flipped = malloc(ob), *longer = malloc(ob + 4096), *hflip = malloc(ob);
    memcpy(flipped, good, ob);
    flipped[ob - 81] ^= 1; /* the payload's last byte (the header follows it) */
    bad[4].bytes = flipped;
    memcpy(hflip, good, ob);
    hflip[ob - 80 + 12] ^= 1; /* page_tokens in the header, its checksum left */
    bad[7].bytes = hflip;
    memcpy(longer, good, ob); /* a good object with bytes after it */
    memset(longer + ob, 0x33, 4096);
    bad[5].bytes = bad[6].bytes = longer;
    kvt_store_page_t q = {.hash = p[0].hash, .page = 5};
    const kvt_geom_t *g = kvt_tier_geom(E.tier);
    size_t zeroed = 0;
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        write_file(a, bad[k].bytes, bad[k].n);
        fill(&E, 777, 5, 1); /* what the page held before the get */
        sres_t r = run_op(E.store, kvt_store_get, &q, 1);
        cr_assert_eq(r.r[0], KVT_STORE_BAD, "%s served", bad[k].what);
        cr_assert_eq(r.count, 0u);
        cr_assert(strstr(kvt_store_last_error(E.store), bad[k].what) != NULL, "%s: logged '%s'", bad[k].what,
                  kvt_store_last_error(E.store));
        bool zero = true;
        for (uint32_t l = 0; l < g->layers; l++) {
            const unsigned char *pg = kvt_tier_addr(E.tier, 5, l);
            for (size_t i = 0; i < g->layer_bytes; i++) zero &= pg[i] == 0;
        }
        cr_assert(zero || check(&E, 777, 5), "%s: the page holds something other than its old bytes or zeros", bad[k].what);
        /* one of an object's length was read into the page: refused there, zeroed */
        if (bad[k].n == ob) cr_assert(zero, "%s: a refused object left in the page", bad[k].what);
        zeroed += zero;
    }
    cr_assert_geq(zeroed, 3u); /* at least garbage, another key's, the flipped byte */
    cr_assert_eq(sstats(E.store, KVT_STORE_GET).bad_objects, sizeof(bad) / sizeof(bad[0]));
    /* a well-formed header (its checksum recomputed) of another geometry */
    memcpy(flipped, good, ob);
    unsigned char *hd = flipped + ob - 80; /* the header, after the payload */
    hd[8] = 3; /* layers */
    uint64_t hs = XXH3_64bits(hd, 72);
    for (int i = 0; i < 8; i++) hd[72 + i] = (unsigned char)(hs >> (8 * i));
    write_file(a, flipped, ob);
    cr_assert_eq(run_op(E.store, kvt_store_get, &q, 1).r[0], KVT_STORE_BAD);
    cr_assert(strstr(kvt_store_last_error(E.store), "wrong geometry") != NULL, "%s", kvt_store_last_error(E.store));
    /* restored, it is served again */
    write_file(a, good, ob);
    cr_assert_eq(run_op(E.store, kvt_store_get, &q, 1).r[0], KVT_STORE_OK);
    cr_assert(check(&E, 100, 5));
    free(good), free(other), free(junk), free(flipped), free(longer), free(hflip);
}

/* Read in place and refused there: a layer-first page (a piece per layer)
 * whose payload was damaged is zeroed in every layer, and only that page. */
Test(store_dir, refused_in_place_zeroes_every_layer) {
    senv_init(&E, 8, 3, 512, KVT_LAYOUT_LAYER_FIRST);
    cr_assert_eq(senv_open(&E, url), KVT_OK);
    kvt_store_page_t p[1];
    put_filled(&E, p, 1, 9);
    char path[256];
    obj_path(&p[0].hash, path, sizeof(path));
    size_t ob = kvt_store_object_bytes(E.store);
    cr_assert_eq(ob, 80u + 3 * 512);
    unsigned char *o = malloc(ob);
    cr_assert_eq(read_file(path, o, ob), ob);
    o[2 * 512 + 100] ^= 0x40; /* layer 2 (the payload starts the object) */
    write_file(path, o, ob);
    fill(&E, 20, 3, 3); /* pages 3, 4, 5 */
    kvt_store_page_t q = {.hash = p[0].hash, .page = 4};
    sres_t r = run_op(E.store, kvt_store_get, &q, 1);
    cr_assert_eq(r.r[0], KVT_STORE_BAD);
    cr_assert(strstr(kvt_store_last_error(E.store), "payload checksum mismatch") != NULL, "%s", kvt_store_last_error(E.store));
    for (uint32_t l = 0; l < 3; l++) {
        const unsigned char *pg = kvt_tier_addr(E.tier, 4, l);
        for (size_t i = 0; i < 512; i++) cr_assert_eq(pg[i], 0, "layer %u byte %zu", l, i);
    }
    cr_assert(check(&E, 20, 3) && check(&E, 22, 5), "a neighbouring page was touched");
    free(o);
}

/* A host tier that keeps page checksums (KVT_TIER_CHECKSUM): a get sets the
 * checksum of the page it fills (read in place as through memory) to what
 * the tier itself computes over the page, and a put refuses a page that no
 * longer matches its checksum (a corrupt host page never reaches L3). */
Test(store_dir, checksum_tier) {
    for (int layout = 0; layout < 2; layout++) {
        kvt_tier_config_t tc = {.size = sizeof(tc), .kind = KVT_TIER_HOST, .flags = KVT_TIER_CHECKSUM,
                                .geom = {8, 3, 1024, layout ? KVT_LAYOUT_LAYER_FIRST : KVT_LAYOUT_PAGE_FIRST}};
        memset(&E, 0, sizeof(E));
        cr_assert_eq(kvt_tier_create(&E.tier, &tc), KVT_OK);
        E.scratch = malloc(1024);
        kvt_store_config_default(&E.cfg);
        E.cfg.tier = E.tier, E.cfg.model = "test-model", E.cfg.page_tokens = 16, E.cfg.log = quiet_log;
        cr_assert_eq(senv_open(&E, url), KVT_OK);
        uint64_t *sums = kvt_tier_sums(E.tier);
        cr_assert_not_null(sums);
        kvt_store_page_t p[2];
        pages_of(p, 2, 40 + 10 * (uint64_t)layout, 0);
        fill(&E, 40 + 10 * (uint64_t)layout, 0, 2);
        for (uint32_t i = 0; i < 2; i++) sums[i] = kvt_tier_page_sum(E.tier, i);
        ((unsigned char *)kvt_tier_addr(E.tier, 1, 2))[7] ^= 1; /* page 1 no longer matches its checksum */
        sres_t r = run_op(E.store, kvt_store_put, p, 2);
        cr_assert_eq(r.r[0], KVT_STORE_OK);
        cr_assert_eq(r.r[1], KVT_STORE_FAILED, "a page failing its checksum was stored");
        cr_assert(strstr(kvt_store_last_error(E.store), "failed its checksum") != NULL, "%s", kvt_store_last_error(E.store));
        cr_assert_eq(run_op(E.store, kvt_store_exists, &p[1], 1).count, 0u);
        sums[5] = 12345;
        kvt_store_page_t q = {.hash = p[0].hash, .page = 5};
        cr_assert_eq(run_op(E.store, kvt_store_get, &q, 1).count, 1u);
        cr_assert(check(&E, 40 + 10 * (uint64_t)layout, 5));
        cr_assert_eq(sums[5], kvt_tier_page_sum(E.tier, 5), "layout %d: the page's checksum not set by the get", layout);
        senv_fini(&E);
    }
}

static void store_obj_path(kvt_store_t *s, const kvt_hash128_t *h, char *out, size_t cap) {
    char hex[33];
    kvt_store_key(s, h, hex);
    snprintf(out, cap, "%s/%.2s/%s", root, hex, hex);
}

/* Every tier makes the same object: an engine tier of each engine's layout
 * (one plane: read and written where its bytes lie; several: gathered and
 * scattered through kvt_tier_read/write) writes, byte for byte, the file a
 * page-first host tier holding the same logical page writes, and gets it
 * back into its own layout. */
Test(store_dir, engine_tiers_make_the_same_object) {
    for (int k = 0; k < EM_KIND_COUNT; k++) {
        const em_shape_t *sh = &EM_SHAPES[k];
        em_mem_t m;
        em_ptrs_t pp;
        kvt_tier_engine_t e;
        em_alloc(sh, &m, 0);
        describe(sh, &m, &pp, &e);
        kvt_tier_config_t tc = em_config(sh, &e);
        kvt_tier_t *et = NULL;
        cr_assert_eq(kvt_tier_create(&et, &tc), KVT_OK, "%s", sh->name);
        const kvt_geom_t *g = kvt_tier_geom(et);
        kvt_tier_t *ht = make_tier(g->pages, g->layers, g->layer_bytes, KVT_LAYOUT_PAGE_FIRST);
        void *scratch = malloc(g->layer_bytes);
        kvt_hash128_t h = hkey(300 + (uint64_t)k);
        cr_assert_eq(kvt_tier_pattern_fill(et, 2, h.lo, h.hi, scratch), KVT_OK);
        cr_assert_eq(kvt_tier_pattern_fill(ht, 2, h.lo, h.hi, scratch), KVT_OK);
        kvt_store_config_t c;
        kvt_store_config_default(&c);
        c.model = "test-model";
        c.page_tokens = 16;
        c.log = quiet_log;
        kvt_store_t *se = NULL, *sh_ = NULL;
        c.tier = et;
        cr_assert_eq(kvt_store_open(&se, url, &c), KVT_OK, "%s: %s", sh->name, kvt_store_last_error(NULL));
        c.tier = ht;
        cr_assert_eq(kvt_store_open(&sh_, url, &c), KVT_OK);
        kvt_store_page_t p = {.hash = h, .page = 2};
        char path[256];
        store_obj_path(se, &h, path, sizeof(path));
        size_t ob = kvt_store_object_bytes(se);
        unsigned char *from_host = malloc(ob + 1), *from_engine = malloc(ob + 1);
        cr_assert_eq(run_op(sh_, kvt_store_put, &p, 1).count, 1u);
        cr_assert_eq(read_file(path, from_host, ob + 1), ob);
        cr_assert_eq(run_op(se, kvt_store_put, &p, 1).count, 1u);
        cr_assert_eq(read_file(path, from_engine, ob + 1), ob);
        cr_assert(memcmp(from_host, from_engine, ob) == 0, "%s: the engine tier's object differs", sh->name);
        kvt_store_page_t q = {.hash = h, .page = 7};
        cr_assert_eq(run_op(se, kvt_store_get, &q, 1).count, 1u, "%s", sh->name);
        cr_assert(kvt_tier_pattern_check(et, 7, h.lo, h.hi, scratch), "%s: page 7 differs from what was put", sh->name);
        kvt_store_close(se);
        kvt_store_close(sh_);
        kvt_tier_destroy(et);
        kvt_tier_destroy(ht);
        em_free(&m);
        free(scratch), free(from_host), free(from_engine);
    }
}

/* A store of another geometry under the same root never serves ours. */
Test(store_dir, other_geometry_is_another_key) {
    senv_init(&E, 8, 2, 1024, KVT_LAYOUT_PAGE_FIRST);
    cr_assert_eq(senv_open(&E, url), KVT_OK);
    kvt_store_page_t p[4];
    put_filled(&E, p, 4, 1);
    kvt_tier_t *t2 = make_tier(8, 2, 512, KVT_LAYOUT_PAGE_FIRST);
    kvt_store_config_t c = E.cfg;
    c.tier = t2;
    kvt_store_t *s2 = NULL;
    cr_assert_eq(kvt_store_open(&s2, url, &c), KVT_OK);
    cr_assert_eq(run_op(s2, kvt_store_exists, p, 4).count, 0u);
    cr_assert_eq(run_op(s2, kvt_store_get, p, 4).count, 0u);
    kvt_store_close(s2);
    kvt_tier_destroy(t2);
}

/* The store's clock, stepped by the tests of recency (kvt_store_set_clock):
 * file times that differ by whole seconds, with no sleep. */
static _Atomic uint64_t clock_ns = 1700000000ull * 1000000000ull;
static uint64_t stepped_clock(void *arg) {
    (void)arg;
    return atomic_load(&clock_ns);
}
static void touch_order(void) { atomic_fetch_add(&clock_ns, 1000000000ull); } /* a second on */

static int open_clocked(const char *u) {
    int rc = senv_open(&E, u);
    if (rc == KVT_OK) cr_assert_eq(kvt_store_set_clock(E.store, stepped_clock, NULL), KVT_OK);
    return rc;
}

Test(store_dir, lru_eviction_and_rebuild) {
    senv_init(&E, 32, 1, 4016, KVT_LAYOUT_PAGE_FIRST); /* objects of 4096 bytes: one 4 KiB block each */
    char u[200];
    /* room for 5 objects */
    snprintf(u, sizeof(u), "%s,max=%d", url, 5 * 4096 + 100);
    cr_assert_eq(open_clocked(u), KVT_OK, "%s", kvt_store_last_error(NULL));
    kvt_store_page_t p[8];
    pages_of(p, 8, 50, 0);
    fill(&E, 50, 0, 8);
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(run_op(E.store, kvt_store_put, &p[i], 1).count, 1u);
        touch_order();
    }
    /* use 0 and 1: 2 is now the least recently used */
    kvt_store_page_t g[2] = {{.hash = p[0].hash, .page = 20}, {.hash = p[1].hash, .page = 21}};
    cr_assert_eq(run_op(E.store, kvt_store_get, g, 2).count, 2u);
    touch_order();
    cr_assert_eq(run_op(E.store, kvt_store_put, &p[5], 1).count, 1u);
    kvt_store_stats_t st = sstats(E.store, KVT_STORE_PUT);
    cr_assert_eq(st.evictions, 1u);
    cr_assert_eq(st.stored_objects, 5u);
    sres_t r = run_op(E.store, kvt_store_exists, p, 6);
    bool want[6] = {1, 1, 0, 1, 1, 1};
    for (int i = 0; i < 6; i++) cr_assert_eq(r.r[i] == KVT_STORE_OK, want[i], "object %d", i);
    /* reopen: the order comes back from the file times (3 is oldest now) */
    kvt_store_close(E.store);
    E.store = NULL;
    cr_assert_eq(open_clocked(u), KVT_OK);
    st = sstats(E.store, KVT_STORE_PUT);
    cr_assert_eq(st.stored_objects, 5u);
    cr_assert_eq(st.stored_bytes, 5u * 4096);
    touch_order();
    cr_assert_eq(run_op(E.store, kvt_store_put, &p[6], 1).count, 1u);
    r = run_op(E.store, kvt_store_exists, p, 7);
    bool want2[7] = {1, 1, 0, 0, 1, 1, 1};
    for (int i = 0; i < 7; i++) cr_assert_eq(r.r[i] == KVT_STORE_OK, want2[i], "after reopen: object %d", i);
    /* a smaller max at open evicts down to it */
    kvt_store_close(E.store);
    E.store = NULL;
    snprintf(u, sizeof(u), "%s,max=%d", url, 2 * 4096);
    cr_assert_eq(senv_open(&E, u), KVT_OK);
    cr_assert_eq(sstats(E.store, KVT_STORE_GET).stored_objects, 2u);
    r = run_op(E.store, kvt_store_exists, &p[5], 2);
    cr_assert_eq(r.count, 2u, "the two most recent survive");
}

static uint64_t atime_ns(const char *path) {
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "%s", path);
    return (uint64_t)st.st_atim.tv_sec * 1000000000ull + (uint64_t)st.st_atim.tv_nsec;
}

/* The LRU time a get leaves in the file's access time, the same under each
 * of the kernel's atime modes (a tmpfs mounted with it; skipped where
 * mounting is not allowed), since the store sets it itself and reads with
 * O_NOATIME: the first get after a put sets it, a get again within the same
 * second leaves it, one a second later sets it again. */
Test(store_dir, access_times_under_each_mount_mode) {
    static const char *modes[] = {"noatime", "relatime", "strictatime"};
    for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
        char mnt[128], cmd[300];
        snprintf(mnt, sizeof(mnt), "%s/%s", root, modes[m]);
        cr_assert_eq(mkdir(mnt, 0755), 0);
        snprintf(cmd, sizeof(cmd), "mount -t tmpfs -o size=1m,%s kvt-store-test %s 2>/dev/null", modes[m], mnt);
        if (system(cmd) != 0) cr_skip_test("cannot mount a tmpfs here (needs root): skipped");
        /* everything measured first, checked once unmounted (a failed check leaves no mount behind) */
        senv_init(&E, 4, 1, 4096, KVT_LAYOUT_PAGE_FIRST);
        /* one worker: it writes a get's access time once the get is reported, before it takes the
         * next batch, so the exists after each get (sync) says the time is written */
        E.cfg.threads = 1;
        char u[200], hex[33], path[300];
        snprintf(u, sizeof(u), "dir:%s", mnt);
        int rc = open_clocked(u);
        uint64_t t[4] = {0}, served = 0, at[4] = {0};
        if (rc == KVT_OK) {
            kvt_store_page_t p = {.hash = hkey(70), .page = 0}, q = {.hash = hkey(70), .page = 1};
            fill(&E, 70, 0, 1);
            served += run_op(E.store, kvt_store_put, &p, 1).count;
            kvt_store_key(E.store, &p.hash, hex);
            snprintf(path, sizeof(path), "%s/%.2s/%s", mnt, hex, hex);
            t[0] = atime_ns(path);
            at[0] = atomic_load(&clock_ns);
            atomic_store(&clock_ns, (at[0] / 1000000000ull + 1) * 1000000000ull); /* the start of a second */
            served += run_op(E.store, kvt_store_get, &q, 1).count;
            run_op(E.store, kvt_store_exists, &p, 1);
            t[1] = atime_ns(path);
            at[1] = atomic_load(&clock_ns);
            atomic_fetch_add(&clock_ns, 400000000ull); /* still within the second */
            served += run_op(E.store, kvt_store_get, &q, 1).count;
            run_op(E.store, kvt_store_exists, &p, 1);
            t[2] = atime_ns(path);
            touch_order();
            served += run_op(E.store, kvt_store_get, &q, 1).count;
            run_op(E.store, kvt_store_exists, &p, 1);
            t[3] = atime_ns(path);
            at[3] = atomic_load(&clock_ns);
        }
        senv_fini(&E);
        snprintf(cmd, sizeof(cmd), "umount %s", mnt);
        cr_assert_eq(system(cmd), 0);
        cr_assert_eq(rc, KVT_OK);
        cr_assert_eq(served, 4u);
        cr_assert_eq(t[0], at[0], "%s: a put's file has the store's time", modes[m]);
        cr_assert_eq(t[1], at[1], "%s: the first get after a put did not set the access time", modes[m]);
        cr_assert_eq(t[2], t[1], "%s: a get again in the same second moved the access time", modes[m]);
        cr_assert_eq(t[3], at[3], "%s: a get a second later did not set the access time", modes[m]);
    }
}

/* max= with a suffix is that many KiB: 12K holds three objects of 4096
 * bytes (a 4 KiB block each: 12288 <= 12288), not four. */
Test(store_dir, max_with_suffix) {
    senv_init(&E, 8, 1, 4016, KVT_LAYOUT_PAGE_FIRST);
    char u[200];
    snprintf(u, sizeof(u), "%s,max=12K", url);
    cr_assert_eq(senv_open(&E, u), KVT_OK, "%s", kvt_store_last_error(NULL));
    kvt_store_page_t p[5];
    pages_of(p, 5, 60, 0);
    fill(&E, 60, 0, 5);
    for (int i = 0; i < 5; i++) cr_assert_eq(run_op(E.store, kvt_store_put, &p[i], 1).count, 1u);
    kvt_store_stats_t st = sstats(E.store, KVT_STORE_PUT);
    cr_assert_eq(st.stored_objects, 3u);
    cr_assert_eq(st.stored_bytes, 12288u);
    cr_assert_eq(st.evictions, 2u);
    cr_assert_eq(run_op(E.store, kvt_store_exists, &p[2], 3).count, 3u, "the three last puts are kept");
}

/* An object larger than max alone is not kept: the root would stay over
 * max however much else went (the put fails, counted; nothing evicted). */
Test(store_dir, an_object_over_max_is_not_kept) {
    senv_init(&E, 8, 1, 4016, KVT_LAYOUT_PAGE_FIRST);
    char u[200];
    snprintf(u, sizeof(u), "%s,max=1K", url);
    cr_assert_eq(senv_open(&E, u), KVT_OK, "%s", kvt_store_last_error(NULL));
    kvt_store_page_t p[2];
    pages_of(p, 2, 70, 0);
    fill(&E, 70, 0, 2);
    cr_assert_eq(run_op(E.store, kvt_store_put, p, 2).count, 0u);
    kvt_store_stats_t st = sstats(E.store, KVT_STORE_PUT);
    cr_assert_eq(st.failures, 2u);
    cr_assert_eq(st.evictions, 0u);
    cr_assert_eq(st.stored_objects, 0u);
    cr_assert_eq(run_op(E.store, kvt_store_exists, p, 2).count, 0u, "not kept");
}

/* The stores a process opens on one root share what it knows of it (a put
 * store beside a get store, a store a model, the root however spelled):
 * their puts count against one limit, the smallest max they were opened
 * with, and a get through one keeps an object another put. Each on its own
 * index, the root held every object here (16K, then 20K, over max=12K) and
 * evicted the one just read. */
Test(store_dir, stores_on_one_root_share_its_limit) {
    senv_init(&E, 8, 1, 4016, KVT_LAYOUT_PAGE_FIRST);
    senv_t F, G;
    senv_init(&F, 8, 1, 4016, KVT_LAYOUT_PAGE_FIRST);
    senv_init(&G, 8, 1, 4016, KVT_LAYOUT_PAGE_FIRST);
    G.cfg.model = "another-model";
    char u[200], v[200];
    snprintf(u, sizeof(u), "%s,max=16K", url);
    snprintf(v, sizeof(v), "dir:%s/,max=12K", root);
    cr_assert_eq(senv_open(&E, u), KVT_OK, "%s", kvt_store_last_error(NULL));
    cr_assert_eq(senv_open(&F, v), KVT_OK, "%s", kvt_store_last_error(NULL));
    cr_assert_eq(senv_open(&G, url), KVT_OK, "%s", kvt_store_last_error(NULL));
    kvt_store_page_t p[4], g[2];
    pages_of(p, 4, 60, 0);
    fill(&E, 60, 0, 4);
    pages_of(g, 2, 90, 0);
    fill(&G, 90, 0, 2);
    cr_assert_eq(run_op(E.store, kvt_store_put, p, 3).count, 3u);
    kvt_store_page_t first = {.hash = p[0].hash, .page = 5};
    cr_assert_eq(run_op(F.store, kvt_store_get, &first, 1).count, 1u, "F gets what E put");
    cr_assert(check(&F, 60, 5));
    cr_assert_eq(run_op(E.store, kvt_store_put, &p[3], 1).count, 1u);
    cr_assert_eq(run_op(E.store, kvt_store_exists, p, 4).r[1], KVT_STORE_MISS, "the least recently used goes");
    cr_assert_eq(run_op(E.store, kvt_store_exists, &p[0], 1).count, 1u, "the object F read was evicted");
    cr_assert_eq(run_op(E.store, kvt_store_exists, &p[2], 2).count, 2u);
    cr_assert_eq(sstats(E.store, KVT_STORE_PUT).stored_bytes, 12288u);
    cr_assert_eq(sstats(F.store, KVT_STORE_PUT).stored_objects, 3u, "one index: every store sees the root's");
    /* another model's puts count against the same limit */
    cr_assert_eq(run_op(G.store, kvt_store_put, g, 1).count, 1u);
    cr_assert_eq(sstats(G.store, KVT_STORE_PUT).stored_objects, 3u);
    cr_assert_eq(run_op(E.store, kvt_store_exists, &p[2], 1).count, 0u);
    /* F closed: the limit is E's 16K */
    senv_fini(&F);
    cr_assert_eq(run_op(G.store, kvt_store_put, &g[1], 1).count, 1u);
    cr_assert_eq(sstats(E.store, KVT_STORE_PUT).stored_objects, 4u);
    cr_assert_eq(sstats(G.store, KVT_STORE_PUT).evictions, 1u);
    senv_fini(&G);
}

/* A put that died mid-write: a temporary file, never an object. */
Test(store_dir, crash_mid_write_invisible) {
    senv_init(&E, 8, 2, 1024, KVT_LAYOUT_PAGE_FIRST);
    cr_assert_eq(senv_open(&E, url), KVT_OK);
    kvt_store_page_t p[1];
    pages_of(p, 1, 9, 0);
    fill(&E, 9, 0, 1);
    char fin[256], dirp[256], tmp[400];
    obj_path(&p[0].hash, fin, sizeof(fin));
    cr_assert_eq(run_op(E.store, kvt_store_put, p, 1).count, 1u);
    size_t ob = kvt_store_object_bytes(E.store);
    unsigned char *good = malloc(ob);
    cr_assert_eq(read_file(fin, good, ob), ob);
    cr_assert_eq(run_op(E.store, kvt_store_remove, p, 1).count, 1u);
    /* a child that starts the write and dies before the rename; its temporary
     * file is named for this machine and PID namespace (tag), as the store's own */
    char tag[17];
    kvt__dir_tmp_tag(tag);
    snprintf(dirp, sizeof(dirp), "%.*s", (int)(strrchr(fin, '/') - fin), fin);
    pid_t pid = fork();
    if (pid == 0) {
        char t[400];
        snprintf(t, sizeof(t), "%s/.tmp.h%s.%ld.0.%s", dirp, tag, (long)getpid(), strrchr(fin, '/') + 1);
        int fd = open(t, O_WRONLY | O_CREAT, 0644);
        if (write(fd, good, ob / 2) < 0) _exit(2);
        _exit(0);
    }
    int stt;
    waitpid(pid, &stt, 0);
    snprintf(tmp, sizeof(tmp), "%s/.tmp.h%s.%ld.0.%s", dirp, tag, (long)pid, strrchr(fin, '/') + 1);
    cr_assert_eq(access(tmp, F_OK), 0);
    /* a live writer's (this process), and two of another machine or PID
     * namespace, whose pids mean nothing here: one a put might still be
     * writing, one left an hour and more ago (in the form without a tag);
     * and one of this machine an hour old whose pid is a live process's now
     * (its writer died long ago and the pid was given again: this one's) */
    char live[400], theirs[400], stale[400], reused[400];
    snprintf(live, sizeof(live), "%s/.tmp.h%s.%ld.7.%s", dirp, tag, (long)getpid(), strrchr(fin, '/') + 1);
    snprintf(theirs, sizeof(theirs), "%s/.tmp.h0123456789abcdef.%ld.0.%s", dirp, (long)pid, strrchr(fin, '/') + 1);
    snprintf(stale, sizeof(stale), "%s/.tmp.%ld.0.%s", dirp, (long)pid, strrchr(fin, '/') + 1);
    snprintf(reused, sizeof(reused), "%s/.tmp.h%s.%ld.9.%s", dirp, tag, (long)getpid(), strrchr(fin, '/') + 1);
    const char *made[] = {live, theirs, stale, reused};
    for (int i = 0; i < 4; i++) {
        int fd = open(made[i], O_WRONLY | O_CREAT | O_EXCL, 0644);
        cr_assert(fd >= 0 && write(fd, good, ob / 2) == (ssize_t)(ob / 2));
        close(fd);
    }
    struct timespec old[2] = {{time(NULL) - 3700, 0}, {time(NULL) - 3700, 0}};
    cr_assert_eq(utimensat(AT_FDCWD, stale, old, 0), 0);
    cr_assert_eq(utimensat(AT_FDCWD, reused, old, 0), 0);
    cr_assert_eq(run_op(E.store, kvt_store_exists, p, 1).count, 0u);
    kvt_store_page_t q = {.hash = p[0].hash, .page = 3};
    cr_assert_eq(run_op(E.store, kvt_store_get, &q, 1).r[0], KVT_STORE_MISS);
    /* the next open removes the dead writer's and the old one, and leaves the others */
    kvt_store_close(E.store);
    E.store = NULL;
    cr_assert_eq(senv_open(&E, url), KVT_OK);
    cr_assert_neq(access(tmp, F_OK), 0, "a dead writer's temporary file survived open");
    cr_assert_neq(access(stale, F_OK), 0, "another machine's temporary file of an hour ago survived open");
    cr_assert_neq(access(reused, F_OK), 0, "a temporary file of an hour ago whose pid is alive again survived open");
    cr_assert_eq(access(live, F_OK), 0, "a live writer's temporary file was removed");
    cr_assert_eq(access(theirs, F_OK), 0, "another machine's recent temporary file was removed (its put in flight)");
    cr_assert_eq(sstats(E.store, KVT_STORE_GET).stored_objects, 0u);
    free(good);
}

/* Two processes share a root: what one puts the other gets. */
Test(store_dir, two_processes_share_a_root) {
    senv_init(&E, 16, 2, 2048, KVT_LAYOUT_PAGE_FIRST);
    pid_t pid = fork();
    if (pid == 0) {
        senv_t c;
        senv_init(&c, 16, 2, 2048, KVT_LAYOUT_PAGE_FIRST);
        if (senv_open(&c, url) != KVT_OK) _exit(1);
        kvt_store_page_t p[8];
        pages_of(p, 8, 300, 0);
        fill(&c, 300, 0, 8);
        sres_t r = run_op(c.store, kvt_store_put, p, 8);
        senv_fini(&c);
        _exit(r.count == 8 ? 0 : 3);
    }
    int st;
    waitpid(pid, &st, 0);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    cr_assert_eq(senv_open(&E, url), KVT_OK);
    kvt_store_page_t q[8];
    pages_of(q, 8, 300, 8);
    cr_assert_eq(run_op(E.store, kvt_store_get, q, 8).count, 8u);
    for (int i = 0; i < 8; i++) cr_assert(check(&E, 300 + (uint64_t)i, 8 + (uint32_t)i));
}

Test(store_dir, submit_errors_queue_nothing) {
    senv_init(&E, 8, 1, 64, KVT_LAYOUT_PAGE_FIRST);
    cr_assert_eq(senv_open(&E, url), KVT_OK);
    kvt_store_page_t p[2];
    pages_of(p, 2, 0, 0);
    cr_assert_eq(kvt_store_get(E.store, p, 0, 0, NULL), KVT_EINVAL);
    p[1].page = 8;
    cr_assert_eq(kvt_store_put(E.store, p, 2, 0, NULL), KVT_EINVAL);
    p[1].page = 0;
    cr_assert_eq(kvt_store_get(E.store, p, 2, 0, NULL), KVT_EINVAL, "a page twice in one get");
    cr_assert_eq(kvt_store_pending(E.store), 0u);
    kvt_store_done_t d;
    cr_assert_eq(kvt_store_poll(E.store, &d, 1, 0), 0);
}

Test(store_dir, emit) {
    senv_init(&E, 8, 1, 64, KVT_LAYOUT_PAGE_FIRST);
    cr_assert_eq(senv_open(&E, url), KVT_OK);
    kvt_store_page_t p[2];
    pages_of(p, 2, 0, 0);
    run_op(E.store, kvt_store_put, p, 2);
    run_op(E.store, kvt_store_get, p, 1);
    kvt_emitter_t *em;
    cr_assert_eq(kvt_emitter_create(&em, KVT_FMT_JSON, "kvtier"), KVT_OK);
    kvt_store_emit(E.store, em);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_eq(kvt_emitter_write(em, f), KVT_OK);
    fclose(f);
    cr_assert(strstr(buf, "store_put") && strstr(buf, "store_get") && strstr(buf, "latency_ns") && strstr(buf, "p999"), "%s", buf);
    cr_assert_null(strstr(buf, "store_remove"));
    free(buf);
    kvt_emitter_destroy(em);
    /* Prometheus text: one family per metric, histograms in seconds; promtool agrees where it is installed */
    cr_assert_eq(kvt_emitter_create(&em, KVT_FMT_PROM, "kvtier"), KVT_OK);
    kvt_store_emit(E.store, em);
    char path[128];
    snprintf(path, sizeof(path), "%s/metrics.prom", root);
    f = fopen(path, "w");
    cr_assert_eq(kvt_emitter_write(em, f), KVT_OK);
    fclose(f);
    kvt_emitter_destroy(em);
    char cmd[300], text[65536];
    cr_assert_gt(read_file(path, text, sizeof(text) - 1), 0u);
    cr_assert(strstr(text, "kvtier_store_get_latency_seconds_bucket") && strstr(text, "kvtier_store_put_hits_total"), "%.2000s", text);
    snprintf(cmd, sizeof(cmd), "! command -v promtool >/dev/null || promtool check metrics < %s", path);
    cr_assert_eq(system(cmd), 0, "promtool check metrics failed on %s", path);
}

/* A full filesystem (a 256 KiB tmpfs; skipped where mounting is not
 * allowed): puts fail cleanly, counted, no temporary file is left, and
 * what was stored is served whole. */
Test(store_dir, full_filesystem) {
    char mnt[128];
    snprintf(mnt, sizeof(mnt), "%s/small", root);
    cr_assert_eq(mkdir(mnt, 0755), 0);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "mount -t tmpfs -o size=256k kvt-store-test %s 2>/dev/null", mnt);
    if (system(cmd) != 0) cr_skip_test("cannot mount a tmpfs here (needs root): skipped");
    senv_init(&E, 64, 1, 16384, KVT_LAYOUT_PAGE_FIRST);
    char u[200];
    snprintf(u, sizeof(u), "dir:%s", mnt);
    int rc = senv_open(&E, u);
    kvt_store_page_t p[40];
    pages_of(p, 40, 600, 0);
    fill(&E, 600, 0, 40);
    sres_t r = {0};
    if (rc == KVT_OK) r = run_op(E.store, kvt_store_put, p, 40);
    size_t stored = r.count;
    kvt_store_stats_t st = rc == KVT_OK ? sstats(E.store, KVT_STORE_PUT) : (kvt_store_stats_t){0};
    char find[300];
    snprintf(find, sizeof(find), "test -z \"$(find %s -name '.tmp.*')\"", mnt);
    int no_tmp = system(find);
    kvt_store_page_t q[40];
    pages_of(q, stored, 600, 0);
    wipe(&E, 0, 40);
    sres_t g = stored && rc == KVT_OK ? run_op(E.store, kvt_store_get, q, stored) : (sres_t){0};
    bool same = true;
    for (size_t i = 0; i < stored; i++) same &= check(&E, 600 + i, (uint32_t)i);
    kvt_store_close(E.store);
    E.store = NULL;
    snprintf(cmd, sizeof(cmd), "umount %s", mnt);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(rc, KVT_OK);
    cr_assert_eq(r.status, KVT_EIO);
    cr_assert(stored > 0 && stored < 40, "stored %zu of 40 in 256 KiB", stored);
    cr_assert_eq(st.failures, 40 - stored);
    cr_assert_eq(no_tmp, 0, "a failed put left a temporary file");
    cr_assert_eq(g.count, stored);
    cr_assert(same);
}

/* Injected allocation failures in open: an error and nothing left (ASan
 * checks the leaks), or a store that works. */
Test(store_dir, open_under_allocation_failure) {
    senv_init(&E, 8, 1, 256, KVT_LAYOUT_PAGE_FIRST);
    int fails = 0;
    for (uint64_t nth = 1; nth < 40; nth++) {
        kvt_store_t *s = NULL;
        kvt__mem_fail_nth(nth);
        int rc = kvt_store_open(&s, url, &E.cfg);
        kvt__mem_fail_nth(0);
        if (rc != KVT_OK) {
            cr_assert_eq(rc, KVT_ENOMEM, "nth %llu: %s", (unsigned long long)nth, kvt_err_name(rc));
            cr_assert_null(s);
            fails++;
            continue;
        }
        kvt_store_page_t p[2];
        pages_of(p, 2, 1, 0);
        sres_t r = run_op(s, kvt_store_put, p, 2); /* a worker without memory fails its keys, counted */
        cr_assert(r.count == 2 || r.status == KVT_EIO);
        kvt_store_close(s);
    }
    cr_assert_gt(fails, 0);
}

/* Found by the allocation-failure campaign (tests/faults/alloc.c): a worker
 * whose backend context could not be allocated failed every batch it ever
 * took. Now the failure costs the batch at hand; the worker asks again for
 * the next one, which is served. */
static pthread_t main_thread;
static _Atomic int worker_fails;

static int fail_on_a_worker(void *arg, const void *site) {
    (void)arg, (void)site;
    if (pthread_equal(pthread_self(), main_thread)) return 0;
    int left = atomic_load(&worker_fails);
    while (left > 0)
        if (atomic_compare_exchange_weak(&worker_fails, &left, left - 1)) return 1;
    return 0;
}

Test(store_dir, a_worker_out_of_memory_recovers) {
    senv_init(&E, 8, 2, 256, KVT_LAYOUT_PAGE_FIRST);
    E.cfg.threads = 1;
    kvt_store_page_t p[2];
    pages_of(p, 2, 7, 0);
    fill(&E, 7, 0, 2);
    main_thread = pthread_self();
    /* a fresh worker's first k allocations fail: its context; and a buffer; and both */
    for (int k = 1; k <= 3; k++) {
        if (E.store) kvt_store_close(E.store);
        cr_assert_eq(senv_open(&E, url), KVT_OK);
        atomic_store(&worker_fails, k);
        kvt__mem_set_hook(fail_on_a_worker, NULL);
        sres_t r = run_op(E.store, kvt_store_put, p, 2);
        cr_assert_eq(r.status, KVT_EIO, "%d failed allocations fail the batch", k);
        cr_assert_eq(r.r[0], KVT_STORE_FAILED);
        r = run_op(E.store, kvt_store_put, p, 2);
        kvt__mem_set_hook(NULL, NULL);
        cr_assert_eq(r.status, KVT_OK, "after %d failed allocations the next batch is served", k);
        cr_assert_eq(r.count, 2);
    }
    wipe(&E, 2, 2);
    kvt_store_page_t q[2];
    pages_of(q, 2, 7, 2);
    cr_assert_eq(run_op(E.store, kvt_store_get, q, 2).count, 2);
    cr_assert(check(&E, 7, 2) && check(&E, 8, 3), "what the recovered worker put is served byte for byte");
}

/* A store of keys alone (no tier) whose pages would not fit in memory
 * (1 TiB): exists and remove move no page and are answered, on the
 * workers and on the caller's thread. */
Test(store_dir, keys_of_pages_too_large_for_memory) {
    kvt_store_config_t c;
    kvt_store_config_default(&c);
    c.model = "test-model";
    c.page_tokens = 16;
    c.layers = 1u << 20;
    c.layer_bytes = 1u << 20;
    c.threads = 1;
    c.log = quiet_log;
    cr_assert_eq(kvt_store_open(&E.store, url, &c), KVT_OK, "%s", kvt_store_last_error(NULL));
    kvt_store_page_t p[3];
    pages_of(p, 3, 40, 0);
    sres_t r = run_op(E.store, kvt_store_exists, p, 3);
    cr_assert_eq(r.status, KVT_OK, "%s", kvt_store_last_error(E.store));
    cr_assert(r.r[0] == KVT_STORE_MISS && r.r[1] == KVT_STORE_MISS && r.r[2] == KVT_STORE_MISS);
    cr_assert_eq(run_op(E.store, kvt_store_remove, p, 3).status, KVT_OK);
    size_t n = 9;
    cr_assert_eq(kvt_store_exists_leading(E.store, p, 3, &n), KVT_OK);
    cr_assert_eq(n, 0u);
}

/* Random puts, gets, exists and removes against a model: a plain array of
 * keys with their last use, capacity in objects, evicting the least
 * recently used (put and a get hit are uses; exists is not). After every
 * call the per-key results are the model's, and every hit is byte-exact. */
Test(store_dir, random_against_lru_model) {
    enum { KEYS = 24, CAP = 7, OPS = 300 };
    const char *fixed = getenv("KVT_TEST_SEED"); /* a failing seed, run again */
    unsigned seed = fixed ? (unsigned)strtoul(fixed, NULL, 0) : (unsigned)time(NULL);
    fprintf(stderr, "store_dir random_against_lru_model: seed %u (KVT_TEST_SEED=%u runs it again)\n", seed, seed);
    kvt_rng_t rng; /* the project's generator: the same stream for a seed on every libc */
    kvt_rng_seed(&rng, seed);
    senv_init(&E, 32, 1, 4016, KVT_LAYOUT_PAGE_FIRST); /* objects of 4096 bytes: one 4 KiB block each */
    E.cfg.threads = 1; /* one batch at a time: the model's order is the store's */
    char u[200];
    snprintf(u, sizeof(u), "%s,max=%d", url, CAP * 4096);
    cr_assert_eq(senv_open(&E, u), KVT_OK);
    fill(&E, 0, 0, KEYS); /* tier page k holds key k's content */
    uint64_t last[KEYS] = {0}, clock = 0; /* 0: absent */
    for (int op = 0; op < OPS; op++) {
        size_t n = 1 + (size_t)kvt_rng_below(&rng, 4), k0 = (size_t)kvt_rng_below(&rng, KEYS - 4);
        kvt_store_page_t p[4];
        for (size_t i = 0; i < n; i++) p[i] = (kvt_store_page_t){.hash = hkey(k0 + i), .page = (uint32_t)(k0 + i)};
        int what = (int)kvt_rng_below(&rng, 4);
        sres_t r;
        if (what == 0) { /* put: each key a use, then evict down to CAP */
            r = run_op(E.store, kvt_store_put, p, n);
            for (size_t i = 0; i < n; i++) {
                cr_assert_eq(r.r[i], KVT_STORE_OK, "seed %u op %d", seed, op);
                last[k0 + i] = ++clock;
                for (;;) {
                    int live = 0, oldest = -1;
                    for (int k = 0; k < KEYS; k++)
                        if (last[k]) {
                            live++;
                            if (oldest < 0 || last[k] < last[oldest]) oldest = k;
                        }
                    if (live <= CAP) break;
                    last[oldest] = 0;
                }
            }
        } else if (what == 1) { /* get into pages 24.. */
            for (size_t i = 0; i < n; i++) p[i].page = 24 + (uint32_t)i;
            wipe(&E, 24, n);
            r = run_op(E.store, kvt_store_get, p, n);
            for (size_t i = 0; i < n; i++) {
                bool want = last[k0 + i] != 0;
                cr_assert_eq(r.r[i], want ? KVT_STORE_OK : KVT_STORE_MISS, "seed %u op %d get key %zu", seed, op, k0 + i);
                if (want) {
                    cr_assert(check(&E, k0 + i, 24 + (uint32_t)i), "seed %u op %d: key %zu served wrong bytes", seed, op, k0 + i);
                    last[k0 + i] = ++clock;
                }
            }
        } else if (what == 2) {
            r = run_op(E.store, kvt_store_exists, p, n);
            size_t lead = 0;
            while (lead < n && last[k0 + lead]) lead++;
            cr_assert_eq(r.count, lead, "seed %u op %d exists", seed, op);
            for (size_t i = 0; i < n; i++) cr_assert_eq(r.r[i] == KVT_STORE_OK, last[k0 + i] != 0, "seed %u op %d", seed, op);
        } else {
            r = run_op(E.store, kvt_store_remove, p, n);
            for (size_t i = 0; i < n; i++) {
                cr_assert_eq(r.r[i], last[k0 + i] ? KVT_STORE_OK : KVT_STORE_MISS, "seed %u op %d remove", seed, op);
                last[k0 + i] = 0;
            }
        }
    }
    int live = 0;
    for (int k = 0; k < KEYS; k++) live += last[k] != 0;
    cr_assert_eq(sstats(E.store, KVT_STORE_GET).stored_objects, (uint64_t)live);
}

/* Four threads submit 50 batches each to a store of four workers; one
 * thread polls. Every batch is reported once, with its own user value,
 * and the statistics add up. Then batches left unpolled at close are
 * waited for and freed (ASan checks). */
typedef struct subarg {
    kvt_store_t *s;
    int id;
} subarg_t;

static void *submitter(void *arg) {
    subarg_t *a = arg;
    for (int b = 0; b < 50; b++) {
        kvt_store_page_t p[4];
        pages_of(p, 4, (uint64_t)(a->id * 1000 + b * 4), (uint32_t)(a->id * 4));
        int rc = b % 2 == 0 ? kvt_store_put(a->s, p, 4, (uint64_t)(a->id << 16 | b), NULL)
                            : kvt_store_exists(a->s, p, 4, (uint64_t)(a->id << 16 | b), NULL);
        if (rc != KVT_OK) return (void *)1;
    }
    return NULL;
}

Test(store_dir, concurrent_submitters_one_poller) {
    senv_init(&E, 16, 1, 512, KVT_LAYOUT_PAGE_FIRST);
    E.cfg.threads = 4;
    cr_assert_eq(senv_open(&E, url), KVT_OK);
    pthread_t th[4];
    subarg_t args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (subarg_t){E.store, i};
        cr_assert_eq(pthread_create(&th[i], NULL, submitter, &args[i]), 0);
    }
    static bool seen[4][50];
    memset(seen, 0, sizeof(seen));
    int got = 0;
    uint64_t t0 = kvt_now_ns();
    while (got < 200 && kvt_now_ns() - t0 < 60ull * 1000000000ull) {
        kvt_store_done_t d[16];
        int k = kvt_store_poll(E.store, d, 16, 100000000ull);
        cr_assert_geq(k, 0);
        for (int j = 0; j < k; j++) {
            int id = (int)(d[j].user >> 16), b = (int)(d[j].user & 0xffff);
            cr_assert(id < 4 && b < 50 && !seen[id][b], "batch %d/%d reported twice or unknown", id, b);
            seen[id][b] = true;
            cr_assert_eq(d[j].op, b % 2 == 0 ? KVT_STORE_PUT : KVT_STORE_EXISTS);
            if (b % 2 == 0) cr_assert_eq(d[j].count, 4u);
        }
        got += k;
    }
    for (int i = 0; i < 4; i++) {
        void *ret;
        pthread_join(th[i], &ret);
        cr_assert_null(ret);
    }
    cr_assert_eq(got, 200);
    cr_assert_eq(kvt_store_pending(E.store), 0u);
    kvt_store_stats_t st = sstats(E.store, KVT_STORE_PUT);
    cr_assert_eq(st.calls, 100u);
    cr_assert_eq(st.keys, 400u);
    cr_assert_eq(st.inflight, 0u);
    cr_assert_eq(sstats(E.store, KVT_STORE_EXISTS).calls, 100u);
    /* left in flight at close */
    kvt_store_page_t p[4];
    pages_of(p, 4, 0, 0);
    for (int b = 0; b < 20; b++) cr_assert_eq(kvt_store_put(E.store, p, 4, 0, NULL), KVT_OK);
    kvt_store_close(E.store);
    E.store = NULL;
}

/* exists on the caller's thread against the worker's exists (the leading
 * count) over every prefix of a chain with holes, and against a plain scan
 * for the first absent key; a directory or FIFO is no object there either. */
Test(store_dir, exists_leading_is_the_batch_exists_count) {
    senv_init(&E, 32, 1, 256, KVT_LAYOUT_PAGE_FIRST);
    cr_assert_eq(senv_open(&E, url), KVT_OK);
    kvt_store_page_t p[24];
    bool stored[24];
    put_with_holes(&E, p, 24, 900, stored);
    char path[300];
    obj_path(&p[12].hash, path, sizeof(path));
    char dir[300];
    snprintf(dir, sizeof(dir), "%.*s", (int)(strrchr(path, '/') - path), path);
    char cmd[700];
    snprintf(cmd, sizeof(cmd), "mkdir -p %s && mkdir %s", dir, path); /* a directory where object 12 would be */
    cr_assert_eq(system(cmd), 0);
    exists_leading_matches(&E, p, stored, 24);
    size_t c;
    cr_assert_eq(kvt_store_exists_leading(E.store, p, 0, &c), KVT_EINVAL);
    cr_assert_eq(kvt_store_exists_leading(E.store, NULL, 1, &c), KVT_EINVAL);
    cr_assert_eq(kvt_store_exists_leading(E.store, p, 1, NULL), KVT_EINVAL);
}

/* A batch on the caller's thread (kvt_store_run) does what a queued one does. */
Test(store_dir, run_on_the_callers_thread) {
    senv_init(&E, 48, 2, 512, KVT_LAYOUT_LAYER_FIRST);
    cr_assert_eq(senv_open(&E, url), KVT_OK);
    run_matches_queued(&E, 4000);
}
