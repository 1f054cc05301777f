/* L3 store objects as read back (src/store/store.c): what a dir file or a
 * Redis value holds when the store gets a page — possibly truncated, torn,
 * another model's, another key's, or hostile.
 *
 * A valid object for the key is made once by the store itself (the header
 * of kvt__store_put_iov over a tier page with known bytes). Each input is
 * either raw bytes, or that object patched: truncated or extended, bytes
 * flipped, and then, on request, its payload and header checksums made
 * right again (so the checks behind the checksums are reached too). It is
 * delivered the two ways a backend does: kvt__store_deliver (read into
 * memory, checked, copied into the tier) and kvt__store_deliver_in_place
 * (read straight into the tier page, checked there), over a page-first
 * and a layer-first tier.
 *
 * The model is the format (docs/store.md, version 2: the payload, then the
 * 80-byte header): an object is served exactly when it has the object's
 * length, the first 64 bytes of its header are the key's (magic, version,
 * geometry, model identity, key), and both XXH3-64 checksums hold. Served: the page holds its payload. Refused: KVT_STORE_BAD,
 * and the page is untouched (deliver) or zeroed (in place) — never served.
 * The size parser of dir:PATH,max=SIZE is checked against a model too. */
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/uio.h>
#include <xxhash.h>

#include "fuzz.h"
#include "kvtier/store.h"
#include "kvtier/tier.h"
#include "store/store-int.h"

#define LAYERS 2
#define LB 24
#define PB (LAYERS * LB)
#define OB (KVT__STORE_HDR + PB)

typedef struct env {
    kvt_tier_t *tier;
    kvt_store_t *s;
    uint8_t ref[OB];
} env_t;

static env_t E[2];
static const uint8_t KEY[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
static char HEX[1][33] = {"0102030405060708090a0b0c0d0e0f10"};

static void make_env(env_t *e, kvt_layout_t layout, const char *dir) {
    kvt_tier_config_t tc = {.size = sizeof(tc), .kind = KVT_TIER_HOST, .name = "fuzz", .geom = {2, LAYERS, LB, layout}};
    FZ_ASSERT(kvt_tier_create(&e->tier, &tc) == KVT_OK, "tier");
    kvt_store_config_t sc;
    kvt_store_config_default(&sc);
    sc.tier = e->tier;
    sc.model = "fuzz-model";
    sc.page_tokens = 16;
    sc.threads = 1;
    char url[256];
    snprintf(url, sizeof(url), "dir:%s", dir);
    FZ_ASSERT(kvt_store_open(&e->s, url, &sc) == KVT_OK, "store %s", url);
    for (uint32_t l = 0; l < LAYERS; l++) { /* page 0: known bytes; the reference object is its */
        uint8_t b[LB];
        for (int i = 0; i < LB; i++) b[i] = (uint8_t)(l * 31 + i * 7 + 1);
        kvt_tier_write(e->tier, 0, l, b);
    }
    kvt__sreq_t req = {0};
    uint8_t res[1];
    struct iovec iov[LAYERS + 2], *v;
    kvt_store_page_t pg = {.page = 0};
    req.s = e->s, req.op = KVT_STORE_PUT, req.n = 1, req.hex = (const char(*)[33])HEX, req.key = (const uint8_t(*)[16])KEY;
    req.results = res, req.iov = iov, req.pages = &pg, req.scratch = malloc(OB);
    size_t n = kvt__store_put_iov(&req, 0, &v), k = 0;
    FZ_ASSERT(n >= 2, "put_iov");
    for (size_t i = 0; i < n; i++) memcpy(e->ref + k, v[i].iov_base, v[i].iov_len), k += v[i].iov_len;
    FZ_ASSERT(k == OB && kvt__store_check_object(e->s, KEY, e->ref, OB) == NULL, "the reference object");
    free(req.scratch);
}

static char DIRS[2][128];

/* At the run's end: the stores closed, their (empty) directories gone. */
static void remove_envs(void) {
    for (int i = 0; i < 2; i++) {
        kvt_store_close(E[i].s);
        kvt_tier_destroy(E[i].tier);
        (void)rmdir(DIRS[i]);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet();
    for (int i = 0; i < 2; i++) {
        snprintf(DIRS[i], sizeof(DIRS[i]), "/tmp/kvt-fuzz-store-%d-%d", (int)getpid(), i);
        make_env(&E[i], i ? KVT_LAYOUT_LAYER_FIRST : KVT_LAYOUT_PAGE_FIRST, DIRS[i]);
    }
    atexit(remove_envs);
    return 0;
}

static uint64_t le(const uint8_t *p) {
    uint64_t v = 0;
    for (unsigned i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}
static void put_le(uint8_t *p, uint64_t v) {
    for (unsigned i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static bool model_valid(const env_t *e, const uint8_t *o, size_t len) {
    const uint8_t *h = o + PB; /* the header, after the payload */
    return len == OB && memcmp(h, e->ref + PB, 64) == 0 && le(h + 72) == XXH3_64bits(h, 72) &&
           le(h + 64) == XXH3_64bits(o, PB);
}

/* Page 1 of the tier, page-first. */
static void page_bytes(const env_t *e, uint8_t *out) {
    for (uint32_t l = 0; l < LAYERS; l++) kvt_tier_read(e->tier, 1, l, out + l * LB);
}

/* The size parser against the obvious one. */
static void sizes(const uint8_t *d, size_t n) {
    uint64_t got = 7, want = 0;
    const char *why = NULL;
    int rc = kvt__store_parse_size((const char *)d, n, &got, &why);
    size_t i = 0;
    bool ok = n > 0, over = false;
    for (; i < n && d[i] >= '0' && d[i] <= '9'; i++) {
        if (want > UINT64_MAX / 10 || want * 10 > UINT64_MAX - (uint64_t)(d[i] - '0')) over = true;
        want = want * 10 + (uint64_t)(d[i] - '0');
    }
    unsigned shift = 0;
    if (i == 0) ok = false;
    else if (i + 1 == n) {
        const char *u = strchr("KkMmGgTt", d[i]);
        if (u && d[i]) shift = 10 * (unsigned)(1 + (u - "KkMmGgTt") / 2);
        else ok = false;
    } else if (i != n) ok = false;
    if (ok && !over && shift && want > UINT64_MAX >> shift) over = true;
    ok = ok && !over;
    FZ_ASSERT((rc == KVT_OK) == ok, "parse_size %d, the model %d", rc, ok);
    if (ok) FZ_ASSERT(got == want << shift, "size %llu, the model %llu", (unsigned long long)got,
                      (unsigned long long)(want << shift));
    else FZ_ASSERT(rc == KVT_EINVAL && why != NULL && got == 7, "a refused size must leave *out and say why");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_t f = fz_of(data, size);
    uint8_t mode = fz_u8(&f);
    if ((mode & 0xc0) == 0xc0) {
        sizes(data + 1, size - 1);
        return 0;
    }
    env_t *e = &E[(mode >> 4) & 1];
    static uint8_t obj[OB + 128];
    size_t len;
    if (!(mode & 1)) { /* raw */
        len = fz_left(&f) < sizeof(obj) ? fz_left(&f) : sizeof(obj);
        memcpy(obj, data + f.at, len);
    } else { /* the valid object, patched */
        memcpy(obj, e->ref, OB);
        len = OB;
        uint8_t cut = fz_u8(&f);
        if (cut & 0x80) len = (cut & 0x7f) < OB ? OB - (cut & 0x7f) : 0;
        else if (cut & 0x40) memset(obj + OB, 0x5a, cut & 0x3f), len = OB + (cut & 0x3f);
        while (fz_left(&f) >= 2) {
            uint8_t at = fz_u8(&f), x = fz_u8(&f);
            if (len) obj[at % len] ^= x;
        }
        if (len >= OB && (mode & 2)) put_le(obj + PB + 64, XXH3_64bits(obj, PB));
        if (len >= OB && (mode & 4)) put_le(obj + PB + 72, XXH3_64bits(obj + PB, 72));
    }
    bool valid = model_valid(e, obj, len);
    const char *why = kvt__store_check_object(e->s, KEY, obj, len);
    FZ_ASSERT((why == NULL) == valid, "check_object says '%s', the model %s", why ? why : "valid", valid ? "valid" : "invalid");

    /* delivered into tier page 1 */
    uint8_t before[PB], after[PB], fill[LB];
    memset(fill, 0x33, LB);
    for (uint32_t l = 0; l < LAYERS; l++) kvt_tier_write(e->tier, 1, l, fill);
    page_bytes(e, before);
    kvt__sreq_t req = {0};
    uint8_t res[1] = {99};
    struct iovec iov[LAYERS + 3], *v;
    kvt_store_page_t pg = {.page = 1};
    req.s = e->s, req.op = KVT_STORE_GET, req.n = 1, req.hex = (const char(*)[33])HEX, req.key = (const uint8_t(*)[16])KEY;
    req.results = res, req.iov = iov, req.pages = &pg;
    bool in_place = mode & 8;
    int err = in_place && (mode & 0x20) ? EIO : 0;
    if (!in_place) {
        kvt__store_deliver(&req, 0, obj, len);
    } else {
        size_t nv = kvt__store_get_iov(&req, 0, &v), k = 0;
        FZ_ASSERT(nv >= 2, "get_iov on a host tier");
        uint8_t spare;
        v[nv++] = (struct iovec){.iov_base = &spare, .iov_len = 1};
        for (size_t i = 0; i < nv && k < len; i++) { /* what readv would put where */
            size_t m = len - k < v[i].iov_len ? len - k : v[i].iov_len;
            memcpy(v[i].iov_base, obj + k, m);
            k += m;
        }
        kvt__store_deliver_in_place(&req, 0, k, err);
    }
    page_bytes(e, after);
    if (err) {
        FZ_ASSERT(res[0] == KVT_STORE_FAILED, "a failed read gave result %u", res[0]);
    } else if (valid) {
        FZ_ASSERT(res[0] == KVT_STORE_OK, "a valid object gave result %u", res[0]);
        FZ_ASSERT(memcmp(after, obj, PB) == 0, "served, but the page is not the payload");
    } else {
        FZ_ASSERT(res[0] == KVT_STORE_BAD, "an invalid object gave result %u", res[0]);
    }
    if (res[0] != KVT_STORE_OK) {
        uint8_t zero[PB] = {0};
        FZ_ASSERT(memcmp(after, in_place ? zero : before, PB) == 0, "a refused object left bytes in the page");
    }
    return 0;
}
