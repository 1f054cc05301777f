/* The transfer engine against two models: a plain byte array per tier (what
 * every page must hold after each batch) and a brute-force count of runs and
 * work items from the coalescing rule of xfer.h. Faults, checksums, submit
 * errors, threads, the callback and the emitter. Randomised tests print
 * their seed. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "common/emit.h"
#include "core/mem-int.h"
#include "kvtier/testing.h"
#include "kvtier/rng.h"
#include "kvtier/error.h"
#include "kvtier/mem.h"
#include "kvtier/stats.h"
#include "kvtier/tier.h"
#include "kvtier/xfer.h"

#define MAXT 4
#define MAXC 256 /* copies per test batch */
#define MS 1000000ull

/* ---- the byte model: a plain array of logical pages per tier ---- */

typedef struct env {
    kvt_tier_t *t[MAXT];
    uint8_t *m[MAXT]; /* page p of tier i: m[i] + p * pb, layers in order */
    uint64_t pages[MAXT];
    unsigned nt;
    uint32_t layers;
    size_t lb, pb;
    kvt_xfer_t *x;
    kvt_xfer_config_t cfg;
} env_t;

static void env_tier(env_t *e, kvt_tier_kind_t kind, uint64_t pages, kvt_layout_t lay, uint32_t flags, const char *name) {
    kvt_tier_config_t c;
    memset(&c, 0, sizeof(c));
    c.size = sizeof(c);
    c.kind = kind;
    c.geom = (kvt_geom_t){pages, e->layers, e->lb, lay};
    c.flags = flags;
    c.name = name;
    unsigned i = e->nt++;
    int rc = kvt_tier_create(&e->t[i], &c);
    cr_assert_eq(rc, KVT_OK, "tier %u: %s", i, kvt_err_name(rc));
    e->pages[i] = pages;
    e->m[i] = calloc(pages, e->pb);
}

static void env_init(env_t *e, uint32_t layers, size_t lb) {
    memset(e, 0, sizeof(*e));
    e->layers = layers;
    e->lb = lb;
    e->pb = layers * lb;
    kvt_xfer_config_default(&e->cfg);
}

static void env_start(env_t *e) {
    int rc = kvt_xfer_create(&e->x, &e->cfg, e->t, e->nt);
    cr_assert_eq(rc, KVT_OK, "xfer create: %s", kvt_err_name(rc));
}

static void env_fini(env_t *e) {
    kvt_xfer_destroy(e->x);
    for (unsigned i = 0; i < e->nt; i++) {
        kvt_tier_destroy(e->t[i]);
        free(e->m[i]);
    }
}

static uint8_t *mpage(env_t *e, unsigned i, uint64_t p) { return e->m[i] + p * e->pb; }

/* Writes a distinct pattern into every page of tier i, through the tier API,
 * and the same bytes into the model. */
static void env_fill(env_t *e, unsigned i, uint64_t salt) {
    for (uint64_t p = 0; p < e->pages[i]; p++)
        for (uint32_t l = 0; l < e->layers; l++) {
            uint8_t *dst = mpage(e, i, p) + l * e->lb;
            kvt_pattern_fill(dst, e->lb, p * 1000003 + salt, salt * 31 + i, l);
            cr_assert_eq(kvt_tier_write(e->t[i], p, l, dst), KVT_OK);
        }
}

/* Every page of tier i, read layer by layer, equals the model. */
static void env_verify(env_t *e, unsigned i, const char *ctx) {
    uint8_t *buf = malloc(e->pb);
    for (uint64_t p = 0; p < e->pages[i]; p++) {
        for (uint32_t l = 0; l < e->layers; l++) cr_assert_eq(kvt_tier_read(e->t[i], p, l, buf + l * e->lb), KVT_OK);
        if (memcmp(buf, mpage(e, i, p), e->pb) != 0) {
            size_t b = 0;
            while (buf[b] == mpage(e, i, p)[b]) b++;
            cr_assert_fail("%s: tier %u page %" PRIu64 " differs from the model at layer %zu byte %zu", ctx, i, p,
                           b / e->lb, b % e->lb);
        }
    }
    free(buf);
}

/* ---- test batches ---- */

typedef struct tbatch {
    unsigned src, dst;
    size_t n;
    kvt_xfer_copy_t c[MAXC];
    uint64_t ticket;
    bool done;
    int status;
    uint64_t bad_page;
} tbatch_t;

static void sort_by_dst(kvt_xfer_copy_t *c, size_t n) { /* insertion sort: obviously right */
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && c[j - 1].dst_page > c[j].dst_page; j--) {
            kvt_xfer_copy_t t = c[j];
            c[j] = c[j - 1];
            c[j - 1] = t;
        }
}

/* Applies a completed batch to the model. */
static void env_apply(env_t *e, const tbatch_t *b) {
    for (size_t i = 0; i < b->n; i++)
        memcpy(mpage(e, b->dst, b->c[i].dst_page), mpage(e, b->src, b->c[i].src_page), e->pb);
}

static void submit(env_t *e, tbatch_t *b, uint64_t user) {
    b->done = false;
    int rc = kvt_xfer_submit(e->x, b->src, b->dst, b->c, b->n, user, &b->ticket);
    cr_assert_eq(rc, KVT_OK, "submit: %s", kvt_err_name(rc));
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Polls until every batch of b[0..nb) (user = index) has completed, each
 * exactly once, with its ticket, tiers and its copies sorted by destination.
 * A batch that never completes fails the test by its timeout
 * (tests/common/main.c), not by a bound on the clock here. */
static void collect(env_t *e, tbatch_t *b, size_t nb) {
    size_t left = 0;
    for (size_t i = 0; i < nb; i++) left += !b[i].done;
    kvt_xfer_copy_t *want = malloc(MAXC * sizeof(*want));
    while (left > 0) {
        kvt_xfer_done_t d[8];
        int k = kvt_xfer_poll(e->x, d, 8, 100 * MS);
        cr_assert_geq(k, 0);
        for (int j = 0; j < k; j++) {
            cr_assert_lt(d[j].user, nb, "unknown user %" PRIu64, d[j].user);
            tbatch_t *t = &b[d[j].user];
            cr_assert_not(t->done, "batch %" PRIu64 " reported twice", d[j].user);
            cr_assert_eq(d[j].ticket, t->ticket);
            cr_assert_eq(d[j].src, t->src);
            cr_assert_eq(d[j].dst, t->dst);
            cr_assert_eq(d[j].n, t->n);
            memcpy(want, t->c, t->n * sizeof(*want));
            sort_by_dst(want, t->n);
            for (size_t i = 0; i < t->n; i++)
                cr_assert(d[j].copies[i].src_page == want[i].src_page && d[j].copies[i].dst_page == want[i].dst_page,
                          "batch %" PRIu64 " copy %zu: the batch sorted by destination", d[j].user, i);
            t->done = true;
            t->status = d[j].status;
            t->bad_page = d[j].bad_page;
            left--;
        }
    }
    free(want);
}

/* A random batch of up to maxn copies into pages of dst not yet in used[]:
 * short stretches where source and destination advance together, some cut by
 * a source jump, submitted in shuffled order. */
static size_t gen_batch(kvt_rng_t *r, kvt_xfer_copy_t *out, size_t maxn, uint8_t *used, uint64_t src_pages,
                        uint64_t dst_pages) {
    size_t target = 1 + (size_t)kvt_rng_below(r, maxn), n = 0;
    for (size_t tries = 0; n < target && tries < 4 * target; tries++) {
        uint64_t len = 1 + kvt_rng_below(r, 8), d = kvt_rng_below(r, dst_pages), s = kvt_rng_below(r, src_pages);
        for (uint64_t j = 0; j < len && n < target; j++, d++, s++) {
            if (kvt_rng_below(r, 8) == 0) s += 1 + kvt_rng_below(r, 3);
            if (d >= dst_pages || s >= src_pages || used[d]) break;
            used[d] = 1;
            out[n++] = (kvt_xfer_copy_t){(uint32_t)s, (uint32_t)d};
        }
    }
    for (uint64_t d = 0; n == 0 && d < dst_pages; d++)
        if (!used[d]) used[d] = 1, out[n++] = (kvt_xfer_copy_t){(uint32_t)kvt_rng_below(r, src_pages), (uint32_t)d};
    for (size_t i = n; i > 1; i--) { /* Fisher-Yates */
        size_t j = (size_t)kvt_rng_below(r, i);
        kvt_xfer_copy_t t = out[i - 1];
        out[i - 1] = out[j];
        out[j] = t;
    }
    return n;
}

/* ---- the coalescing model ---- */

typedef struct expect {
    uint64_t batches, failures, corrupt, pages, runs, copies, items, bytes;
} expect_t;

/* Contiguous copies a run of len pages takes: one block (both page_first),
 * one per layer (both layer_first), one per page per layer (mixed layouts:
 * nothing lines up). */
static uint64_t model_spans(kvt_layout_t s, kvt_layout_t d, uint64_t len, uint32_t layers) {
    if (s != d) return len * layers;
    return s == KVT_LAYOUT_PAGE_FIRST ? 1 : layers;
}

/* Runs: sorted by destination, a copy joins the run before it when source and
 * destination both advance by one and the run is below max_pages (the pages
 * of max_bytes, at least one; mixed layouts also the pages whose copies fit
 * max_copies). Items: runs taken in order, a new item when the next run would
 * pass either cap. */
static void model_batch(expect_t *ex, const kvt_xfer_copy_t *copies, size_t n, size_t pb, uint32_t layers,
                        kvt_layout_t sl, kvt_layout_t dl, uint64_t max_bytes, uint32_t max_copies) {
    kvt_xfer_copy_t *c = malloc(n * sizeof(*c));
    memcpy(c, copies, n * sizeof(*c));
    sort_by_dst(c, n);
    uint64_t max_pages = max_bytes / pb > 0 ? max_bytes / pb : 1;
    if (sl != dl && max_pages > max_copies / layers) max_pages = max_copies / layers;
    uint64_t *len = calloc(n, sizeof(*len)), runs = 0;
    for (size_t i = 0; i < n; i++) {
        bool joins = i > 0 && c[i].dst_page == c[i - 1].dst_page + 1 && c[i].src_page == c[i - 1].src_page + 1 &&
                     len[runs - 1] < max_pages;
        if (joins) len[runs - 1]++;
        else len[runs++] = 1;
    }
    uint64_t items = 0, ib = 0, ic = 0, spans = 0;
    for (uint64_t r = 0; r < runs; r++) {
        uint64_t rb = len[r] * pb, rs = model_spans(sl, dl, len[r], layers);
        if (items == 0 || ib + rb > max_bytes || ic + rs > max_copies) items++, ib = 0, ic = 0;
        ib += rb;
        ic += rs;
        spans += rs;
    }
    /* the caps, as lower bounds any cutting must respect */
    if (max_bytes >= pb) cr_assert_geq(items * max_bytes, n * pb);
    cr_assert_geq(items * max_copies, spans);
    ex->batches++;
    ex->pages += n;
    ex->runs += runs;
    ex->copies += spans;
    ex->items += items;
    ex->bytes += n * pb;
    free(len);
    free(c);
}

static void check_stats(env_t *e, unsigned s, unsigned d, const expect_t *ex, const char *ctx) {
    kvt_xfer_stats_t st = {.size = sizeof(st)};
    cr_assert_eq(kvt_xfer_stats(e->x, s, d, &st), KVT_OK);
    cr_assert_eq(st.src, s);
    cr_assert_eq(st.dst, d);
#define EQ(f) cr_assert_eq(st.f, ex->f, "%s: %u->%u " #f " %" PRIu64 ", model %" PRIu64, ctx, s, d, st.f, ex->f)
    EQ(batches);
    EQ(failures);
    EQ(corrupt);
    EQ(pages);
    EQ(runs);
    EQ(copies);
    EQ(items);
    EQ(bytes);
#undef EQ
    cr_assert_eq(st.inflight_batches, 0, "%s", ctx);
    cr_assert_eq(st.inflight_bytes, 0, "%s", ctx);
    cr_assert_eq(st.e2e_ns.count, ex->batches + ex->failures, "%s: one e2e sample per batch", ctx);
    cr_assert_eq(st.copy_ns.count, ex->items, "%s", ctx);
    cr_assert_eq(st.queue_ns.count, ex->items, "%s", ctx);
}

/* ---- coalescing ---- */

static void coalesce_case(kvt_layout_t sl, kvt_layout_t dl, uint64_t max_bytes_pages, uint64_t max_bytes_extra,
                          uint32_t max_copies, uint64_t seed) {
    fprintf(stderr, "xfer coalesce: %s -> %s max_bytes %" PRIu64 " pages + %" PRIu64 " max_copies %u seed=%" PRIu64 "\n",
            kvt_layout_name(sl), kvt_layout_name(dl), max_bytes_pages, max_bytes_extra, max_copies, seed);
    env_t e;
    env_init(&e, 3, 16);
    env_tier(&e, KVT_TIER_ARENA, 200, sl, 0, "l1");
    env_tier(&e, KVT_TIER_HOST, 256, dl, 0, "l2");
    if (max_bytes_pages) e.cfg.max_batch_bytes = max_bytes_pages * e.pb + max_bytes_extra;
    if (max_copies) e.cfg.max_batch_copies = max_copies;
    env_start(&e);
    env_fill(&e, 0, seed);
    env_fill(&e, 1, seed + 1);
    kvt_rng_t r;
    kvt_rng_seed(&r, seed);
    expect_t ex = {0};
    tbatch_t *b = calloc(8, sizeof(*b));
    uint8_t used[256];
    for (int round = 0; round < 6; round++) {
        memset(used, 0, sizeof(used));
        for (size_t i = 0; i < 8; i++) {
            b[i].src = 0;
            b[i].dst = 1;
            b[i].n = gen_batch(&r, b[i].c, 48, used, 200, 256);
            model_batch(&ex, b[i].c, b[i].n, e.pb, e.layers, sl, dl, e.cfg.max_batch_bytes, e.cfg.max_batch_copies);
            submit(&e, &b[i], i);
        }
        collect(&e, b, 8);
        for (size_t i = 0; i < 8; i++) {
            cr_assert_eq(b[i].status, KVT_OK);
            env_apply(&e, &b[i]);
        }
        char ctx[96];
        snprintf(ctx, sizeof(ctx), "seed %" PRIu64 " round %d", seed, round);
        check_stats(&e, 0, 1, &ex, ctx);
        env_verify(&e, 1, ctx);
    }
    if (sl == dl) cr_assert_eq(ex.copies, ex.runs * (sl == KVT_LAYOUT_PAGE_FIRST ? 1 : e.layers));
    else cr_assert_eq(ex.copies, ex.pages * e.layers);
    expect_t none = {0};
    check_stats(&e, 1, 0, &none, "the reverse pair saw nothing");
    env_verify(&e, 0, "the source is unchanged");
    cr_assert_eq(kvt_xfer_pending(e.x), 0);
    free(b);
    env_fini(&e);
}

Test(xfer, coalescing_matches_model, .timeout = 20) {
    uint64_t seed = 1;
    for (int k = 0; k < 4; k++) { /* pf->pf, lf->lf, pf->lf, lf->pf */
        kvt_layout_t sl = (kvt_layout_t)(k == 1 || k == 3), dl = (kvt_layout_t)(k == 1 || k == 2);
        coalesce_case(sl, dl, 0, 0, 0, seed++); /* defaults: nothing cut */
        coalesce_case(sl, dl, 5, 0, 0, seed++); /* runs cut at 5 pages */
        coalesce_case(sl, dl, 4, 7, 0, seed++); /* a cap that is not a page multiple */
        coalesce_case(sl, dl, 1, 0, 0, seed++); /* one page per run */
        coalesce_case(sl, dl, 0, 0, 7, seed++); /* the copy cap */
        coalesce_case(sl, dl, 6, 0, 4, seed++); /* both */
        coalesce_case(sl, dl, 0, 0, 3, seed++); /* the smallest copy cap: one layer's worth */
    }
}

Test(xfer, coalescing_the_header_example) {
    for (int lay = 0; lay < 2; lay++) {
        env_t e;
        env_init(&e, 4, 8);
        env_tier(&e, KVT_TIER_ARENA, 64, (kvt_layout_t)lay, 0, NULL);
        env_tier(&e, KVT_TIER_HOST, 64, (kvt_layout_t)lay, 0, NULL);
        env_start(&e);
        env_fill(&e, 0, 9);
        tbatch_t *b = calloc(1, sizeof(*b));
        static const uint32_t src[] = {12, 4, 9, 7, 3, 8}, dst[] = {50, 44, 42, 40, 43, 41};
        for (int i = 0; i < 6; i++) b->c[i] = (kvt_xfer_copy_t){src[i], dst[i]};
        b->n = 6;
        b->dst = 1;
        submit(&e, b, 0);
        collect(&e, b, 1);
        env_apply(&e, b);
        env_verify(&e, 1, "header example");
        kvt_xfer_stats_t st = {.size = sizeof(st)};
        kvt_xfer_stats(e.x, 0, 1, &st);
        cr_assert_eq(st.runs, 3, "[7..9]->[40..42] [3..4]->[43..44] [12]->[50]");
        cr_assert_eq(st.copies, lay == 0 ? 3 : 3 * 4);
        cr_assert_eq(st.pages, 6);
        cr_assert_eq(st.bytes, 6 * e.pb);
        cr_assert_eq(st.items, 1);
        free(b);
        env_fini(&e);
    }
}

/* ---- bytes ---- */

static void bytes_case(kvt_layout_t src_lay, kvt_layout_t dst_lay, uint64_t seed) {
    fprintf(stderr, "xfer bytes: %s -> %s seed=%" PRIu64 "\n", kvt_layout_name(src_lay), kvt_layout_name(dst_lay), seed);
    env_t e;
    env_init(&e, 3, 40);
    env_tier(&e, KVT_TIER_ARENA, 64, src_lay, 0, "src");
    env_tier(&e, KVT_TIER_HOST, 64, dst_lay, 0, "dst");
    e.cfg.max_batch_bytes = 5 * e.pb; /* several items per batch */
    env_start(&e);
    env_fill(&e, 0, seed);
    env_fill(&e, 1, seed + 100);
    kvt_rng_t r;
    kvt_rng_seed(&r, seed);
    tbatch_t *b = calloc(6, sizeof(*b));
    uint8_t used[64];
    for (int round = 0; round < 10; round++) {
        memset(used, 0, sizeof(used));
        size_t nb = 1 + (size_t)kvt_rng_below(&r, 6);
        for (size_t i = 0; i < nb; i++) {
            b[i].src = 0;
            b[i].dst = 1;
            b[i].n = gen_batch(&r, b[i].c, 16, used, 64, 64);
            submit(&e, &b[i], i);
        }
        collect(&e, b, nb);
        for (size_t i = 0; i < nb; i++) {
            cr_assert_eq(b[i].status, KVT_OK);
            env_apply(&e, &b[i]);
        }
        char ctx[96];
        snprintf(ctx, sizeof(ctx), "%s -> %s seed %" PRIu64 " round %d", kvt_layout_name(src_lay),
                 kvt_layout_name(dst_lay), seed, round);
        env_verify(&e, 1, ctx);
        env_verify(&e, 0, ctx);
    }
    free(b);
    env_fini(&e);
}

Test(xfer, bytes_page_first) { bytes_case(KVT_LAYOUT_PAGE_FIRST, KVT_LAYOUT_PAGE_FIRST, 11); }
Test(xfer, bytes_layer_first) { bytes_case(KVT_LAYOUT_LAYER_FIRST, KVT_LAYOUT_LAYER_FIRST, 12); }
Test(xfer, bytes_mixed_page_first_to_layer_first) { bytes_case(KVT_LAYOUT_PAGE_FIRST, KVT_LAYOUT_LAYER_FIRST, 13); }
Test(xfer, bytes_mixed_layer_first_to_page_first) { bytes_case(KVT_LAYOUT_LAYER_FIRST, KVT_LAYOUT_PAGE_FIRST, 14); }

/* ---- caps ---- */

static void caps_case(kvt_layout_t sl, kvt_layout_t dl, uint64_t max_pages_bytes, uint32_t max_copies,
                      bool contiguous) {
    env_t e;
    env_init(&e, 3, 24);
    env_tier(&e, KVT_TIER_ARENA, 256, sl, 0, NULL);
    env_tier(&e, KVT_TIER_HOST, 256, dl, 0, NULL);
    e.cfg.max_batch_bytes = max_pages_bytes * e.pb;
    e.cfg.max_batch_copies = max_copies;
    env_start(&e);
    env_fill(&e, 0, 5);
    env_fill(&e, 1, 6);
    tbatch_t *b = calloc(1, sizeof(*b));
    b->dst = 1;
    b->n = 100;
    for (uint32_t i = 0; i < 100; i++) /* contiguous: 10..109 -> 20..119; else every other page */
        b->c[i] = contiguous ? (kvt_xfer_copy_t){10 + i, 20 + i} : (kvt_xfer_copy_t){2 * i, 2 * i + 1};
    expect_t ex = {0};
    model_batch(&ex, b->c, b->n, e.pb, e.layers, sl, dl, e.cfg.max_batch_bytes, max_copies);
    submit(&e, b, 0);
    collect(&e, b, 1);
    cr_assert_eq(b->status, KVT_OK);
    env_apply(&e, b);
    char ctx[96];
    snprintf(ctx, sizeof(ctx), "%s -> %s cap %" PRIu64 " pages %u copies %s", kvt_layout_name(sl),
             kvt_layout_name(dl), max_pages_bytes, max_copies, contiguous ? "contiguous" : "scattered");
    check_stats(&e, 0, 1, &ex, ctx);
    /* what the caps alone demand of any cutting */
    uint64_t by_bytes = (100 + max_pages_bytes - 1) / max_pages_bytes;
    cr_assert_geq(ex.items, by_bytes, "%s", ctx);
    cr_assert_geq(ex.items * max_copies, ex.copies, "%s", ctx);
    env_verify(&e, 1, ctx);
    free(b);
    env_fini(&e);
}

Test(xfer, caps_cut_batches_into_items) {
    for (int k = 0; k < 4; k++) { /* pf->pf, lf->lf, pf->lf, lf->pf */
        kvt_layout_t sl = (kvt_layout_t)(k == 1 || k == 3), dl = (kvt_layout_t)(k == 1 || k == 2);
        /* max_batch_copies >= layers (3): one layer_first run must fit an item */
        caps_case(sl, dl, 3, 3, true);
        caps_case(sl, dl, 3, 6, true);
        caps_case(sl, dl, 10, 3, true);
        caps_case(sl, dl, 10, 8, true);
        caps_case(sl, dl, 7, 7, false);
        caps_case(sl, dl, 1000, 4, false);
        caps_case(sl, dl, 1000, 1000, true);
    }
}

/* ---- faults ---- */

static void two_tiers(env_t *e, unsigned threads) {
    env_init(e, 2, 32);
    env_tier(e, KVT_TIER_ARENA, 32, KVT_LAYOUT_LAYER_FIRST, 0, "l1");
    env_tier(e, KVT_TIER_HOST, 32, KVT_LAYOUT_LAYER_FIRST, 0, "l2");
    e->cfg.threads = threads;
    env_start(e);
    env_fill(e, 0, 1);
    env_fill(e, 1, 2);
}

static void one_batch(tbatch_t *b, uint32_t src0, uint32_t dst0, uint32_t n) {
    memset(b, 0, sizeof(*b));
    b->dst = 1;
    b->n = n;
    for (uint32_t i = 0; i < n; i++) b->c[i] = (kvt_xfer_copy_t){src0 + i, dst0 + i};
}

Test(xfer, fault_fail_nth_fails_one_batch, .timeout = 10) {
    env_t e;
    two_tiers(&e, 1);
    kvt_xfer_faults_t f = {.size = sizeof(kvt_xfer_faults_t), .fail_nth = 1};
    cr_assert_eq(kvt_xfer_set_faults(e.x, &f), KVT_OK);
    tbatch_t *b = calloc(2, sizeof(*b));
    one_batch(&b[0], 0, 4, 3);
    submit(&e, &b[0], 0);
    collect(&e, b, 1);
    cr_assert_eq(b[0].status, KVT_EIO);
    kvt_xfer_stats_t st = {.size = sizeof(st)};
    kvt_xfer_stats(e.x, 0, 1, &st);
    cr_assert_eq(st.failures, 1);
    cr_assert_eq(st.batches, 0);
    cr_assert_eq(st.pages, 0);
    cr_assert_eq(st.corrupt, 0);
    cr_assert_eq(st.inflight_batches, 0);
    /* the first copy failed: nothing of that batch may have landed */
    env_verify(&e, 1, "the failed first copy");
    one_batch(&b[1], 10, 20, 5);
    submit(&e, &b[1], 1);
    collect(&e, b, 2);
    cr_assert_eq(b[1].status, KVT_OK, "%s", kvt_err_name(b[1].status));
    env_apply(&e, &b[1]);
    env_verify(&e, 1, "the next batch");
    kvt_xfer_stats(e.x, 0, 1, &st);
    cr_assert_eq(st.failures, 1);
    cr_assert_eq(st.batches, 1);
    cr_assert_eq(st.pages, 5);
    free(b);
    env_fini(&e);
}

/* A batch held in flight by an injected delay: long enough that no stall of
 * a loaded machine between the submit and the next check lets it complete
 * first (20 ms was not, on a shared 2-core VM). */
#define HOLD_NS (250 * MS)

Test(xfer, fault_delay_nth_holds_completion, .timeout = 10) {
    env_t e;
    two_tiers(&e, 1);
    kvt_xfer_faults_t f = {.size = sizeof(kvt_xfer_faults_t), .delay_nth = 1, .delay_ns = HOLD_NS};
    cr_assert_eq(kvt_xfer_set_faults(e.x, &f), KVT_OK);
    tbatch_t *b = calloc(1, sizeof(*b));
    one_batch(b, 3, 7, 4);
    uint64_t t0 = now_ns();
    submit(&e, b, 0);
    kvt_xfer_done_t d;
    cr_assert_eq(kvt_xfer_poll(e.x, &d, 1, 0), 0, "not done before the delay");
    cr_assert_eq(kvt_xfer_pending(e.x), 1);
    collect(&e, b, 1);
    uint64_t elapsed = now_ns() - t0;
    cr_assert_eq(b->status, KVT_OK);
    cr_assert_geq(elapsed, HOLD_NS, "completed after %" PRIu64 " ns", elapsed);
    kvt_xfer_stats_t st = {.size = sizeof(st)};
    kvt_xfer_stats(e.x, 0, 1, &st);
    cr_assert_geq(st.e2e_ns.max, HOLD_NS);
    cr_assert_geq(st.copy_ns.max, HOLD_NS);
    cr_assert_eq(kvt_xfer_pending(e.x), 0);
    env_apply(&e, b);
    env_verify(&e, 1, "delayed batch");
    free(b);
    env_fini(&e);
}

/* gbps is bytes / busy_ns: a batch that failed counts neither its bytes nor
 * its copy time (a slow failing copy once cut gbps by its share), and the
 * items it skipped after its failure are no work (not counted as items). */
Test(xfer, a_failed_batch_counts_neither_its_bytes_nor_its_time, .timeout = 10) {
    env_t e;
    env_init(&e, 2, 32);
    env_tier(&e, KVT_TIER_ARENA, 32, KVT_LAYOUT_LAYER_FIRST, 0, "l1");
    env_tier(&e, KVT_TIER_HOST, 32, KVT_LAYOUT_LAYER_FIRST, 0, "l2");
    e.cfg.threads = 1;            /* the items run in order: the ones after the failure are skipped */
    e.cfg.max_batch_bytes = e.pb; /* a page an item */
    env_start(&e);
    kvt_xfer_faults_t f = {.size = sizeof(kvt_xfer_faults_t), .fail_nth = 1, .delay_nth = 1, .delay_ns = HOLD_NS};
    cr_assert_eq(kvt_xfer_set_faults(e.x, &f), KVT_OK);
    tbatch_t *b = calloc(2, sizeof(*b));
    one_batch(&b[0], 0, 4, 4);
    submit(&e, &b[0], 0);
    collect(&e, b, 1);
    cr_assert_eq(b[0].status, KVT_EIO);
    kvt_xfer_stats_t st = {.size = sizeof(st)};
    kvt_xfer_stats(e.x, 0, 1, &st);
    cr_assert_eq(st.items, 1, "%" PRIu64 " items counted: the three skipped ones are no work", st.items);
    cr_assert_eq(st.busy_ns, 0, "the failed batch's %" PRIu64 " ns counted", st.busy_ns);
    cr_assert_geq(st.copy_ns.max, HOLD_NS, "the item that ran is in the copy times");
    one_batch(&b[1], 10, 20, 5);
    submit(&e, &b[1], 1);
    collect(&e, b, 2);
    cr_assert_eq(b[1].status, KVT_OK);
    kvt_xfer_stats(e.x, 0, 1, &st);
    cr_assert_eq(st.items, 6);
    cr_assert_eq(st.bytes, 5 * e.pb);
    cr_assert(st.busy_ns > 0 && st.busy_ns < HOLD_NS, "busy %" PRIu64 " ns: the good batch's alone", st.busy_ns);
    cr_assert_float_eq(st.gbps, (double)st.bytes / (double)st.busy_ns, 1e-12);
    free(b);
    env_fini(&e);
}

Test(xfer, fault_fail_p_one_fails_every_batch, .timeout = 10) {
    env_t e;
    two_tiers(&e, 2);
    kvt_xfer_faults_t f = {.size = sizeof(kvt_xfer_faults_t), .fail_p = 1.0, .seed = 3};
    cr_assert_eq(kvt_xfer_set_faults(e.x, &f), KVT_OK);
    tbatch_t *b = calloc(6, sizeof(*b));
    for (uint32_t i = 0; i < 5; i++) {
        one_batch(&b[i], i * 5, i * 5 + 1, 1 + i);
        submit(&e, &b[i], i);
    }
    collect(&e, b, 5);
    for (int i = 0; i < 5; i++) cr_assert_eq(b[i].status, KVT_EIO, "batch %d", i);
    kvt_xfer_stats_t st = {.size = sizeof(st)};
    kvt_xfer_stats(e.x, 0, 1, &st);
    cr_assert_eq(st.failures, 5);
    cr_assert_eq(st.batches, 0);
    cr_assert_eq(st.bytes, 0);
    /* cleared, copies go through again */
    cr_assert_eq(kvt_xfer_set_faults(e.x, NULL), KVT_OK);
    one_batch(&b[5], 0, 0, 2);
    submit(&e, &b[5], 5);
    collect(&e, b, 6);
    cr_assert_eq(b[5].status, KVT_OK);
    env_apply(&e, &b[5]);
    uint8_t *buf = malloc(e.pb);
    for (uint64_t p = 0; p < 2; p++) {
        for (uint32_t l = 0; l < e.layers; l++) kvt_tier_read(e.t[1], p, l, buf + l * e.lb);
        cr_assert(memcmp(buf, mpage(&e, 1, p), e.pb) == 0);
    }
    free(buf);
    free(b);
    env_fini(&e);
}

Test(xfer, set_faults_einval) {
    env_t e;
    two_tiers(&e, 1);
    kvt_xfer_faults_t f = {.size = sizeof(kvt_xfer_faults_t), .fail_p = 1.5};
    cr_assert_eq(kvt_xfer_set_faults(e.x, &f), KVT_EINVAL);
    f = (kvt_xfer_faults_t){.size = sizeof(kvt_xfer_faults_t), .delay_p = -0.1};
    cr_assert_eq(kvt_xfer_set_faults(e.x, &f), KVT_EINVAL);
    f = (kvt_xfer_faults_t){.size = sizeof(kvt_xfer_faults_t), .fail_p = NAN};
    cr_assert_eq(kvt_xfer_set_faults(e.x, &f), KVT_EINVAL);
    f = (kvt_xfer_faults_t){.fail_nth = 1};
    cr_assert_eq(kvt_xfer_set_faults(e.x, &f), KVT_EINVAL, "no size");
    struct {
        kvt_xfer_faults_t f;
        uint64_t newer;
    } big = {{.size = sizeof(big), .fail_nth = 1}, 1};
    cr_assert_eq(kvt_xfer_set_faults(e.x, &big.f), KVT_EINVAL, "a field this library does not know, set");
    big.newer = 0;
    cr_assert_eq(kvt_xfer_set_faults(e.x, &big.f), KVT_OK, "a larger struct, zero past what this library knows");
    cr_assert_eq(kvt_xfer_set_faults(NULL, NULL), KVT_EINVAL);
    env_fini(&e);
}

/* ---- checksums ---- */

static void check_sums(env_t *e, unsigned i, uint64_t p0, uint64_t n) {
    uint64_t *sums = kvt_tier_sums(e->t[i]);
    cr_assert_not_null(sums);
    for (uint64_t p = p0; p < p0 + n; p++) {
        cr_assert_eq(sums[p], kvt_tier_page_sum(e->t[i], p), "page %" PRIu64, p);
        cr_assert_eq(sums[p], XXH3_64bits(mpage(e, i, p), e->pb), "page %" PRIu64 " against the model", p);
    }
}

Test(xfer, checksums_recorded_and_verified, .timeout = 10) {
    for (int lay = 0; lay < 2; lay++) {
        env_t e;
        env_init(&e, 3, 40);
        env_tier(&e, KVT_TIER_ARENA, 64, (kvt_layout_t)lay, 0, "l1");
        env_tier(&e, KVT_TIER_HOST, 64, (kvt_layout_t)lay, KVT_TIER_CHECKSUM, "l2");
        env_tier(&e, KVT_TIER_ARENA, 64, (kvt_layout_t)lay, 0, "l1b");
        env_start(&e);
        env_fill(&e, 0, 1);
        env_fill(&e, 2, 3);
        tbatch_t *b = calloc(4, sizeof(*b));
        /* L1 -> L2: 0..9 -> 20..29; sums recorded */
        one_batch(&b[0], 0, 20, 10);
        submit(&e, &b[0], 0);
        collect(&e, b, 1);
        cr_assert_eq(b[0].status, KVT_OK);
        env_apply(&e, &b[0]);
        env_verify(&e, 1, "into L2");
        check_sums(&e, 1, 20, 10);
        /* L2 -> L1b, clean: verified and copied */
        b[1] = b[0];
        b[1].src = 1, b[1].dst = 2, b[1].n = 5;
        for (uint32_t i = 0; i < 5; i++) b[1].c[i] = (kvt_xfer_copy_t){20 + i, 40 + i};
        submit(&e, &b[1], 1);
        collect(&e, b, 2);
        cr_assert_eq(b[1].status, KVT_OK);
        env_apply(&e, &b[1]);
        env_verify(&e, 2, "clean copy back");
        /* one corrupt byte in L2 page 25 */
        ((uint8_t *)kvt_tier_addr(e.t[1], 25, 1))[7] ^= 0x40;
        mpage(&e, 1, 25)[1 * e.lb + 7] ^= 0x40;
        b[2] = b[1];
        b[2].n = 1;
        b[2].c[0] = (kvt_xfer_copy_t){25, 50};
        submit(&e, &b[2], 2);
        collect(&e, b, 3);
        cr_assert_eq(b[2].status, KVT_ECORRUPT, "%s", kvt_err_name(b[2].status));
        cr_assert_eq(b[2].bad_page, 25);
        env_verify(&e, 2, "the corrupt page was not copied");
        kvt_xfer_stats_t st = {.size = sizeof(st)};
        kvt_xfer_stats(e.x, 1, 2, &st);
        cr_assert_eq(st.corrupt, 1);
        cr_assert_eq(st.failures, 1);
        cr_assert_eq(st.batches, 1);
        cr_assert_eq(st.pages, 5);
        /* a page into L2 is re-summed: copying 25 again repairs it */
        b[3] = b[0];
        b[3].n = 1;
        b[3].c[0] = (kvt_xfer_copy_t){5, 25};
        submit(&e, &b[3], 3);
        collect(&e, b, 4);
        cr_assert_eq(b[3].status, KVT_OK);
        env_apply(&e, &b[3]);
        check_sums(&e, 1, 20, 10);
        b[2].done = false;
        submit(&e, &b[2], 2);
        collect(&e, b, 4);
        cr_assert_eq(b[2].status, KVT_OK);
        env_apply(&e, &b[2]);
        env_verify(&e, 2, "after the repair");
        free(b);
        env_fini(&e);
    }
}

Test(xfer, checksum_option_off_skips_sums, .timeout = 10) {
    env_t e;
    env_init(&e, 2, 16);
    env_tier(&e, KVT_TIER_ARENA, 16, KVT_LAYOUT_PAGE_FIRST, 0, NULL);
    env_tier(&e, KVT_TIER_HOST, 16, KVT_LAYOUT_PAGE_FIRST, KVT_TIER_CHECKSUM, NULL);
    e.cfg.checksum = false;
    env_start(&e);
    env_fill(&e, 0, 1);
    uint64_t *sums = kvt_tier_sums(e.t[1]);
    for (int p = 0; p < 16; p++) sums[p] = 0x5eed0000u + (uint64_t)p; /* wrong for every page */
    tbatch_t *b = calloc(2, sizeof(*b));
    one_batch(&b[0], 0, 0, 4);
    submit(&e, &b[0], 0);
    collect(&e, b, 1);
    cr_assert_eq(b[0].status, KVT_OK);
    env_apply(&e, &b[0]);
    for (int p = 0; p < 16; p++) cr_assert_eq(sums[p], 0x5eed0000u + (uint64_t)p, "no sum recorded");
    b[1] = b[0];
    b[1].src = 1, b[1].dst = 0;
    for (uint32_t i = 0; i < 4; i++) b[1].c[i] = (kvt_xfer_copy_t){i, 8 + i};
    submit(&e, &b[1], 1);
    collect(&e, b, 2);
    cr_assert_eq(b[1].status, KVT_OK, "not verified: %s", kvt_err_name(b[1].status));
    env_apply(&e, &b[1]);
    env_verify(&e, 0, "copied back unverified");
    free(b);
    env_fini(&e);
}

/* xfer.h: "a mismatch fails the batch with KVT_ECORRUPT before anything is
 * copied" — also when the batch is cut into several items. */
Test(xfer, corrupt_batch_copies_nothing_across_items, .timeout = 10) {
    env_t e;
    env_init(&e, 2, 16);
    env_tier(&e, KVT_TIER_ARENA, 32, KVT_LAYOUT_PAGE_FIRST, 0, NULL);
    env_tier(&e, KVT_TIER_HOST, 32, KVT_LAYOUT_PAGE_FIRST, KVT_TIER_CHECKSUM, NULL);
    e.cfg.max_batch_bytes = e.pb; /* one page per item */
    env_start(&e);
    env_fill(&e, 0, 1);
    tbatch_t *b = calloc(2, sizeof(*b));
    one_batch(&b[0], 0, 0, 8);
    submit(&e, &b[0], 0);
    collect(&e, b, 1);
    cr_assert_eq(b[0].status, KVT_OK);
    env_apply(&e, &b[0]);
    ((uint8_t *)kvt_tier_addr(e.t[1], 7, 0))[0] ^= 1; /* the last page of the next batch */
    mpage(&e, 1, 7)[0] ^= 1;
    b[1] = b[0];
    b[1].src = 1, b[1].dst = 0;
    for (uint32_t i = 0; i < 8; i++) b[1].c[i] = (kvt_xfer_copy_t){i, 16 + i};
    submit(&e, &b[1], 1);
    collect(&e, b, 2);
    cr_assert_eq(b[1].status, KVT_ECORRUPT);
    cr_assert_eq(b[1].bad_page, 7);
    env_verify(&e, 0, "nothing of the corrupt batch was copied");
    free(b);
    env_fini(&e);
}

/* ---- submit and create errors ---- */

static uint64_t live_bytes(void) {
    kvt_mem_stats_t st = {.size = sizeof(st)};
    kvt_mem_stats(&st);
    return st.live_bytes;
}

Test(xfer, submit_errors_change_nothing, .timeout = 10) {
    env_t e;
    env_init(&e, 2, 16);
    env_tier(&e, KVT_TIER_ARENA, 16, KVT_LAYOUT_PAGE_FIRST, 0, NULL);
    env_tier(&e, KVT_TIER_HOST, 8, KVT_LAYOUT_LAYER_FIRST, 0, NULL);
    env_start(&e);
    env_fill(&e, 0, 1);
    env_fill(&e, 1, 2);
    /* one batch held in flight, so pending is not trivially zero */
    kvt_xfer_faults_t f = {.size = sizeof(kvt_xfer_faults_t), .delay_nth = 1, .delay_ns = HOLD_NS};
    kvt_xfer_set_faults(e.x, &f);
    tbatch_t *b = calloc(1, sizeof(*b));
    one_batch(b, 0, 0, 2);
    submit(&e, b, 0);
    cr_assert_eq(kvt_xfer_pending(e.x), 1);
    kvt_xfer_stats_t before = {.size = sizeof(before)}, after = {.size = sizeof(after)};
    kvt_xfer_stats(e.x, 0, 1, &before);
    uint64_t mem = live_bytes();

    kvt_xfer_copy_t ok[2] = {{0, 5}, {1, 6}}, dup[3] = {{0, 5}, {1, 6}, {2, 5}};
    kvt_xfer_copy_t src_oob[1] = {{16, 0}}, dst_oob[1] = {{0, 8}}, src8[1] = {{8, 0}};
    kvt_xfer_copy_t big_oob[1] = {{UINT32_MAX, UINT32_MAX}};
    struct { unsigned s, d; const kvt_xfer_copy_t *c; size_t n; const char *what; } bad[] = {
        {0, 0, ok, 2, "src == dst"},     {0, 2, ok, 2, "dst tier out of range"},
        {2, 1, ok, 2, "src tier out of range"}, {0, KVT_XFER_MAX_TIERS, ok, 2, "dst past the max"},
        {0, 1, src_oob, 1, "src page out of range"}, {0, 1, dst_oob, 1, "dst page out of range"},
        {1, 0, src8, 1, "src page 8 of an 8-page tier"}, {0, 1, big_oob, 1, "UINT32_MAX pages"},
        {0, 1, dup, 3, "a destination page twice"}, {0, 1, ok, 0, "n == 0"}, {0, 1, NULL, 2, "no copies"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint64_t ticket = 0xfeedface;
        int rc = kvt_xfer_submit(e.x, bad[i].s, bad[i].d, bad[i].c, bad[i].n, 99, &ticket);
        cr_assert_eq(rc, KVT_EINVAL, "%s: %s", bad[i].what, kvt_err_name(rc));
        cr_assert_eq(ticket, 0xfeedface, "%s wrote the ticket", bad[i].what);
        cr_assert_eq(kvt_xfer_pending(e.x), 1, "%s", bad[i].what);
    }
    cr_assert_eq(kvt_xfer_submit(NULL, 0, 1, ok, 2, 0, NULL), KVT_EINVAL);
    /* out of memory at each allocation of a submit */
    for (uint64_t nth = 1; nth <= 4; nth++) {
        kvt__mem_fail_nth(nth);
        int rc = kvt_xfer_submit(e.x, 0, 1, ok, 2, 99, NULL);
        bool fired = kvt__mem_fail_fired();
        kvt__mem_fail_nth(0);
        if (!fired) { /* no nth allocation: it went through */
            cr_assert_eq(rc, KVT_OK);
            cr_assert_geq(nth, 2, "a submit allocates");
            break;
        }
        cr_assert_eq(rc, KVT_ENOMEM, "nth %" PRIu64 ": %s", nth, kvt_err_name(rc));
        cr_assert_eq(kvt_xfer_pending(e.x), 1);
        cr_assert_eq(live_bytes(), mem, "nth %" PRIu64 " leaked", nth);
    }
    kvt_xfer_stats(e.x, 0, 1, &after);
    uint64_t extra = kvt_xfer_pending(e.x) - 1; /* a submit that got through after the injected failures */
    /* copies are counted when a batch completes, and nothing has (the first is held) */
    cr_assert_eq(after.copies, before.copies, "copies");
    kvt_xfer_stats_t other = {.size = sizeof(other)};
    kvt_xfer_stats(e.x, 1, 0, &other);
    cr_assert_eq(other.copies + other.inflight_batches, 0, "the rejected 1->0 batch left no trace");
    /* exactly the good batches complete, nothing else */
    size_t nb = 1 + (size_t)extra;
    kvt_xfer_done_t d[4];
    size_t got = 0;
    while (got < nb) { /* a batch that never completes: the test's timeout */
        int k = kvt_xfer_poll(e.x, d, 4, 100 * MS);
        cr_assert_geq(k, 0);
        for (int j = 0; j < k; j++) cr_assert_eq(d[j].status, KVT_OK);
        got += (size_t)k;
    }
    cr_assert_eq(got, nb);
    cr_assert_eq(kvt_xfer_poll(e.x, d, 4, 50 * MS), 0, "a rejected batch completed");
    cr_assert_eq(kvt_xfer_pending(e.x), 0);
    cr_assert_eq(kvt_xfer_poll(e.x, NULL, 1, 0), KVT_EINVAL);
    cr_assert_eq(kvt_xfer_poll(e.x, NULL, 0, 0), 0);
    cr_assert_eq(kvt_xfer_poll(NULL, d, 1, 0), KVT_EINVAL);
    kvt_xfer_stats_t st = {.size = 0};
    cr_assert_eq(kvt_xfer_stats(e.x, 0, 1, &st), KVT_EINVAL);
    st.size = sizeof(st);
    cr_assert_eq(kvt_xfer_stats(e.x, 0, 2, &st), KVT_EINVAL);
    cr_assert_eq(kvt_xfer_stats(e.x, 1, 1, &st), KVT_EINVAL, "a tier to itself is no pair");
    free(b);
    env_fini(&e);
}

Test(xfer, create_bad_config_einval) {
    env_t e;
    env_init(&e, 3, 16);
    env_tier(&e, KVT_TIER_ARENA, 8, KVT_LAYOUT_PAGE_FIRST, 0, NULL);
    env_tier(&e, KVT_TIER_HOST, 8, KVT_LAYOUT_LAYER_FIRST, 0, NULL);
    kvt_tier_t *odd;
    kvt_tier_config_t tc;
    memset(&tc, 0, sizeof(tc));
    tc.size = sizeof(tc);
    tc.kind = KVT_TIER_HOST;
    tc.geom = (kvt_geom_t){8, 3, 17, KVT_LAYOUT_PAGE_FIRST}; /* another page shape */
    cr_assert_eq(kvt_tier_create(&odd, &tc), KVT_OK);
    kvt_tier_t *with_odd[3] = {e.t[0], e.t[1], odd}, *with_null[2] = {e.t[0], NULL}, *twice[3] = {e.t[0], e.t[1], e.t[0]};
    kvt_xfer_t *sentinel = (kvt_xfer_t *)(uintptr_t)0x1234, *x;
    kvt_xfer_config_t c;
#define EXPECT_BAD(mutate, tiers, n)                                            \
    do {                                                                        \
        kvt_xfer_config_default(&c);                                            \
        mutate;                                                                 \
        x = sentinel;                                                           \
        cr_assert_eq(kvt_xfer_create(&x, &c, (tiers), (n)), KVT_EINVAL, #mutate " " #tiers " " #n); \
        cr_assert_eq(x, sentinel);                                              \
    } while (0)
    EXPECT_BAD(c.threads = 0, e.t, 2);
    EXPECT_BAD(c.threads = 65, e.t, 2);
    EXPECT_BAD(c.max_batch_bytes = 0, e.t, 2);
    EXPECT_BAD(c.max_batch_copies = 0, e.t, 2);
    EXPECT_BAD(c.max_batch_copies = 2, e.t, 2); /* < layers */
    EXPECT_BAD(c.size = 2, e.t, 2); /* smaller than the size field (the ABI rule: test_abi.c) */
    EXPECT_BAD((void)0, e.t, 1);
    EXPECT_BAD((void)0, e.t, 0);
    EXPECT_BAD((void)0, e.t, KVT_XFER_MAX_TIERS + 1);
    EXPECT_BAD((void)0, NULL, 2);
    EXPECT_BAD((void)0, with_null, 2);
    EXPECT_BAD((void)0, with_odd, 3);
    EXPECT_BAD((void)0, twice, 3); /* its copies between the two indices would overlap themselves */
#undef EXPECT_BAD
    kvt_xfer_config_default(&c);
    cr_assert_eq(kvt_xfer_create(NULL, &c, e.t, 2), KVT_EINVAL);
    cr_assert_eq(kvt_xfer_create(&x, NULL, e.t, 2), KVT_EINVAL);
    c.threads = 64;
    c.max_batch_copies = 3;
    cr_assert_eq(kvt_xfer_create(&x, &c, e.t, 2), KVT_OK, "the limits themselves are fine");
    kvt_xfer_destroy(x);
    kvt_xfer_destroy(NULL);
    kvt_tier_destroy(odd);
    env_fini(&e);
}

/* ---- threads ---- */

Test(xfer, many_threads_each_batch_once, .timeout = 20) {
    uint64_t seed = 77;
    fprintf(stderr, "xfer threads: seed=%" PRIu64 "\n", seed);
    env_t e;
    env_init(&e, 3, 24);
    env_tier(&e, KVT_TIER_ARENA, 128, KVT_LAYOUT_LAYER_FIRST, 0, "l1");
    env_tier(&e, KVT_TIER_HOST, 128, KVT_LAYOUT_LAYER_FIRST, 0, "l2");
    env_tier(&e, KVT_TIER_HOST, 96, KVT_LAYOUT_LAYER_FIRST, KVT_TIER_CHECKSUM, "l2b");
    e.cfg.threads = 4;
    e.cfg.max_batch_bytes = 4 * e.pb;
    env_start(&e);
    env_fill(&e, 0, seed);
    env_fill(&e, 1, seed + 1);
    env_fill(&e, 2, seed + 2);
    kvt_xfer_faults_t f = {.size = sizeof(kvt_xfer_faults_t), .delay_p = 0.5, .delay_max_ns = 200000, .seed = seed};
    cr_assert_eq(kvt_xfer_set_faults(e.x, &f), KVT_OK);
    kvt_rng_t r;
    kvt_rng_seed(&r, seed);
    enum { ROUNDS = 8, PER = 24 };
    tbatch_t *b = calloc(PER, sizeof(*b));
    uint64_t *tickets = calloc(ROUNDS * PER, sizeof(uint64_t));
    size_t nt = 0;
    uint8_t used[2][128];
    for (int round = 0; round < ROUNDS; round++) {
        memset(used, 0, sizeof(used));
        for (size_t i = 0; i < PER; i++) {
            b[i].src = 0;
            b[i].dst = 1 + (unsigned)(i % 2);
            b[i].n = gen_batch(&r, b[i].c, 10, used[i % 2], 128, e.pages[b[i].dst]);
            submit(&e, &b[i], i);
            tickets[nt++] = b[i].ticket;
        }
        collect(&e, b, PER);
        for (size_t i = 0; i < PER; i++) {
            cr_assert_eq(b[i].status, KVT_OK);
            env_apply(&e, &b[i]);
        }
        char ctx[64];
        snprintf(ctx, sizeof(ctx), "seed %" PRIu64 " round %d", seed, round);
        env_verify(&e, 1, ctx);
        env_verify(&e, 2, ctx);
        for (size_t i = 0; i < PER; i++)
            for (size_t j = 0; b[i].dst == 2 && j < b[i].n; j++) check_sums(&e, 2, b[i].c[j].dst_page, 1);
    }
    /* tickets are distinct (each batch had its own, and collect saw each once) */
    for (size_t i = 0; i < nt; i++)
        for (size_t j = i + 1; j < nt; j++) cr_assert_neq(tickets[i], tickets[j]);
    kvt_xfer_done_t d;
    cr_assert_eq(kvt_xfer_poll(e.x, &d, 1, 20 * MS), 0, "no extra completion");
    cr_assert_eq(kvt_xfer_pending(e.x), 0);
    free(tickets);
    free(b);
    env_fini(&e);
}

Test(xfer, destroy_waits_for_batches_in_flight, .timeout = 10) {
    uint64_t mem = live_bytes();
    env_t e;
    env_init(&e, 2, 32);
    env_tier(&e, KVT_TIER_ARENA, 64, KVT_LAYOUT_PAGE_FIRST, 0, NULL);
    env_tier(&e, KVT_TIER_HOST, 64, KVT_LAYOUT_PAGE_FIRST, 0, NULL);
    e.cfg.threads = 2;
    env_start(&e);
    env_fill(&e, 0, 4);
    kvt_xfer_faults_t f = {.size = sizeof(kvt_xfer_faults_t), .delay_p = 1, .delay_max_ns = 2 * MS, .seed = 5};
    kvt_xfer_set_faults(e.x, &f);
    tbatch_t *b = calloc(8, sizeof(*b));
    for (uint32_t i = 0; i < 8; i++) {
        one_batch(&b[i], i * 8, 63 - i * 8 - 7, 8);
        submit(&e, &b[i], i);
        env_apply(&e, &b[i]);
    }
    kvt_xfer_done_t d[2];
    kvt_xfer_poll(e.x, d, 2, 0); /* some taken, the rest dropped by destroy */
    kvt_xfer_destroy(e.x);
    e.x = NULL;
    env_verify(&e, 1, "every byte in place after destroy");
    free(b);
    env_fini(&e);
    cr_assert_eq(live_bytes(), mem, "the engine freed everything");
}

/* ---- callback ---- */

typedef struct cb_log {
    atomic_size_t n;
    uint64_t ticket[64];
    int status[64];
    uint64_t user[64];
} cb_log_t;

static void on_done(void *arg, const kvt_xfer_done_t *d) {
    cb_log_t *log = arg;
    size_t i = atomic_fetch_add(&log->n, 1);
    if (i < 64) {
        log->ticket[i] = d->ticket;
        log->status[i] = d->status;
        log->user[i] = d->user;
    }
}

Test(xfer, callback_once_per_batch, .timeout = 10) {
    static cb_log_t log;
    atomic_init(&log.n, 0);
    env_t e;
    env_init(&e, 2, 16);
    env_tier(&e, KVT_TIER_ARENA, 64, KVT_LAYOUT_LAYER_FIRST, 0, NULL);
    env_tier(&e, KVT_TIER_HOST, 64, KVT_LAYOUT_LAYER_FIRST, 0, NULL);
    e.cfg.threads = 3;
    e.cfg.on_done = on_done;
    e.cfg.arg = &log;
    e.cfg.max_batch_bytes = 2 * e.pb;
    env_start(&e);
    env_fill(&e, 0, 8);
    kvt_xfer_faults_t f = {.size = sizeof(kvt_xfer_faults_t), .fail_nth = 9, .delay_p = 0.3, .delay_max_ns = 100000, .seed = 2};
    kvt_xfer_set_faults(e.x, &f);
    enum { NB = 40 };
    tbatch_t *b = calloc(NB, sizeof(*b));
    for (uint32_t i = 0; i < NB; i++) {
        one_batch(&b[i], i, i, 1 + i % 3);
        submit(&e, &b[i], i);
    }
    collect(&e, b, NB);
    cr_assert_eq(atomic_load(&log.n), NB, "one call per batch");
    int failed = 0;
    for (size_t i = 0; i < NB; i++) {
        uint64_t u = log.user[i];
        cr_assert_lt(u, NB);
        cr_assert_eq(log.ticket[i], b[u].ticket, "the callback's ticket is the one poll returned");
        cr_assert_eq(log.status[i], b[u].status);
        failed += b[u].status != KVT_OK;
        for (size_t j = 0; j < i; j++) cr_assert_neq(log.user[j], u, "batch %" PRIu64 " called back twice", u);
    }
    cr_assert_eq(failed, 1, "fail_nth fails exactly one batch");
    free(b);
    env_fini(&e);
}

/* ---- emitter ---- */

Test(xfer, emit_json_sections) {
    env_t e;
    env_init(&e, 2, 16);
    env_tier(&e, KVT_TIER_ARENA, 32, KVT_LAYOUT_PAGE_FIRST, 0, "l1");
    env_tier(&e, KVT_TIER_HOST, 32, KVT_LAYOUT_PAGE_FIRST, 0, "L2-Host");
    env_tier(&e, KVT_TIER_HOST, 32, KVT_LAYOUT_PAGE_FIRST, 0, "l2.host"); /* idle; l2_host too: both indexed */
    env_start(&e);
    env_fill(&e, 0, 1);
    tbatch_t *b = calloc(3, sizeof(*b));
    one_batch(&b[0], 0, 0, 7);
    one_batch(&b[1], 10, 20, 2);
    submit(&e, &b[0], 0);
    submit(&e, &b[1], 1);
    collect(&e, b, 2);
    kvt_xfer_stats_t st = {.size = sizeof(st)};
    kvt_xfer_stats(e.x, 0, 1, &st);
    cr_assert_eq(st.bytes, 9 * e.pb);
    kvt_emitter_t *em;
    cr_assert_eq(kvt_emitter_create(&em, KVT_FMT_JSON, "kvtier"), KVT_OK);
    kvt_xfer_emit(e.x, em);
    FILE *f = tmpfile();
    cr_assert_not_null(f);
    cr_assert_eq(kvt_emitter_write(em, f), KVT_OK);
    kvt_emitter_destroy(em);
    long len = ftell(f);
    rewind(f);
    char *txt = calloc(1, (size_t)len + 1);
    cr_assert_eq(fread(txt, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    cJSON *o = cJSON_Parse(txt);
    cr_assert_not_null(o, "valid JSON: %s", txt);
    cJSON *sec = cJSON_GetObjectItem(o, "l1_to_l2_host1");
    cr_assert_not_null(sec, "a section per pair with traffic: %s", txt);
    cr_assert_eq(cJSON_GetObjectItem(sec, "bytes")->valuedouble, (double)st.bytes);
    cr_assert_eq(cJSON_GetObjectItem(sec, "batches")->valuedouble, 2);
    cr_assert_eq(cJSON_GetObjectItem(sec, "pages")->valuedouble, 9);
    cr_assert_eq(cJSON_GetObjectItem(sec, "runs")->valuedouble, (double)st.runs);
    cJSON *e2e = cJSON_GetObjectItem(sec, "e2e_ns");
    cr_assert_not_null(e2e);
    cr_assert_eq(cJSON_GetObjectItem(e2e, "count")->valuedouble, 2);
    int sections = 0;
    for (cJSON *it = o->child; it; it = it->next) sections++;
    cr_assert_eq(sections, 1, "no section for pairs without traffic: %s", txt);
    cJSON_Delete(o);
    free(txt);
    free(b);
    env_fini(&e);
}

/* Tiers of these names, traffic from 0 to 1 and from 2 to dst2: every
 * format's write goes through (two sections alike made the emitter refuse
 * the whole write), and the JSON has the two pairs' sections apart. */
static void emit_two_pairs(const char *const *names, unsigned ntiers, unsigned dst2, const char *want1,
                           const char *want2) {
    env_t e;
    env_init(&e, 2, 16);
    for (unsigned i = 0; i < ntiers; i++) env_tier(&e, KVT_TIER_HOST, 32, KVT_LAYOUT_PAGE_FIRST, 0, names[i]);
    env_start(&e);
    env_fill(&e, 0, 1);
    env_fill(&e, 2, 3);
    tbatch_t *b = calloc(2, sizeof(*b));
    one_batch(&b[0], 0, 0, 3);
    one_batch(&b[1], 0, 5, 2);
    b[1].src = 2, b[1].dst = dst2;
    submit(&e, &b[0], 0);
    submit(&e, &b[1], 1);
    collect(&e, b, 2);
    for (int fmt = 0; fmt < 3; fmt++) {
        kvt_emitter_t *em;
        cr_assert_eq(kvt_emitter_create(&em, (kvt_fmt_t)fmt, "kvtier"), KVT_OK);
        kvt_xfer_emit(e.x, em);
        int rc;
        char *txt = emit_text(em, &rc);
        cr_assert_eq(rc, KVT_OK, "format %d: the write was refused", fmt);
        if (fmt == KVT_FMT_JSON) {
            cJSON *o = cJSON_Parse(txt);
            cr_assert_not_null(o, "valid JSON: %s", txt);
            cr_assert_not_null(cJSON_GetObjectItem(o, want1), "%s", txt);
            cr_assert_not_null(cJSON_GetObjectItem(o, want2), "%s", txt);
            cJSON_Delete(o);
        }
        free(txt);
    }
    free(b);
    env_fini(&e);
}

/* Tiers named host, host and host0: the two hosts indexed would be host0
 * twice; every tier is indexed then, each pair's section its own (the old
 * names gave two sections host0_to_host1, one lost to a JSON reader). */
Test(xfer, emit_names_every_pair_apart) {
    static const char *const names[] = {"host", "host", "host0"};
    emit_two_pairs(names, 3, 1, "host0_to_host1", "host02_to_host1");
}

/* Names with "_to_" in them: a_to_b to c and a to b_to_c would both be
 * a_to_b_to_c (the emitter refused the whole write, every other statistic
 * in it lost); every tier is indexed then. */
Test(xfer, emit_names_pairs_apart_when_a_name_holds_to) {
    static const char *const names[] = {"a_to_b", "c", "a", "b_to_c"};
    emit_two_pairs(names, 4, 3, "a_to_b0_to_c1", "a2_to_b_to_c3");
}
