/* The lane allocator: CP owner lanes over one L1 page space.
 *
 * Under context parallelism of size C, logical page p is owned by lane
 * p mod C and sits at local page p div C of that lane. Each lane has its own
 * extent allocator over its local pages. A request of n pages is dealt out in
 * rotation, starting at the lane after the one where the previous request
 * stopped; each lane reserves its share contiguous-preferred:
 *
 *   C = 4, next = 1, n = 6        request page:  0  1  2  3  4  5
 *                                 lane:          1  2  3  0  1  2
 *   lane 1 share 2 -> local [7,9)   logical:  7*4+1=29, 8*4+1=33
 *   next becomes 3
 *
 * Shares differ by at most one page and the start rotates, so lanes that are
 * filled and emptied request by request stay within one page of each other.
 * A cache evicts pages in its own order, not lane by lane, so lanes drift:
 * a lane short of its share then gives the difference to the next lanes in
 * rotation that have room, and the request's pages are dealt in rotation
 * over the lanes that still have some of their share. Ownership does not
 * change (page p is always on lane p mod C); only the balance does.
 *
 * A reserve checks every lane's share and sets aside every lane's metadata
 * before it reserves anything, so it either succeeds on all lanes or changes
 * nothing. A free groups its pages by lane, validates all lanes, then frees.
 */
#include <stdlib.h>
#include <string.h>

#include "../core/abi-int.h"
#include "alloc-int.h"
#include "kvtier/alloc.h"
#include "kvtier/error.h"
#include "../core/mem-int.h"
#include "../core/sort-int.h"

struct kvt_laneal {
    uint32_t lanes;
    uint32_t next;
    uint64_t pages;
    kvt_extalloc_t **lane;
    uint64_t *dealt; /* pages each lane has been dealt, ever */
    uint64_t reserves, reserve_failures, frees;
    void *scratch; /* the work arrays of reserve and free, kept between calls up to SCRATCH_KEEP (a free */
    size_t scratch_bytes; /* of an eviction round's pages needs ~40 B a page: kept, it is not faulted in anew each call) */
};

/* Scratch is kept up to this size between calls; a larger call's goes back
 * when the call returns (a free of a whole large cache would otherwise keep
 * ~40 B a page for good). */
#define SCRATCH_KEEP (4u << 20)

/* At least `bytes` of scratch, or NULL (no memory: the old scratch stays). */
static void *scratch(kvt_laneal_t *la, size_t bytes) {
    if (bytes <= la->scratch_bytes) return la->scratch;
    size_t want = bytes > 2 * la->scratch_bytes ? bytes : 2 * la->scratch_bytes;
    void *p = kvt__malloc(want);
    if (p == NULL) return NULL;
    kvt__free(la->scratch, la->scratch_bytes);
    la->scratch = p;
    la->scratch_bytes = want;
    return p;
}

/* Passes rc through, after giving back scratch over SCRATCH_KEEP. */
static int scratch_done(kvt_laneal_t *la, int rc) {
    if (la->scratch_bytes > SCRATCH_KEEP) {
        kvt__free(la->scratch, la->scratch_bytes);
        la->scratch = NULL;
        la->scratch_bytes = 0;
    }
    return rc;
}

int kvt_laneal_create(kvt_laneal_t **out, uint64_t npages, uint32_t lanes) {
    if (out == NULL || lanes == 0 || npages < lanes || npages > KVT_ALLOC_MAX_PAGES) return KVT_EINVAL;
    kvt_laneal_t *la = KVT_NEW(kvt_laneal_t);
    if (la == NULL) return KVT_ENOMEM;
    la->lanes = lanes;
    la->pages = npages;
    la->lane = kvt__calloc(lanes, sizeof(*la->lane));
    la->dealt = kvt__calloc(lanes, sizeof(uint64_t));
    if (la->lane == NULL || la->dealt == NULL) {
        kvt__free(la->lane, lanes * sizeof(*la->lane));
        kvt__free(la->dealt, lanes * sizeof(uint64_t));
        KVT_DELETE(la);
        return KVT_ENOMEM;
    }
    for (uint32_t l = 0; l < lanes; l++) {
        if (kvt_extalloc_create(&la->lane[l], kvt_lane_pages(npages, lanes, l)) != KVT_OK) {
            kvt_laneal_destroy(la);
            return KVT_ENOMEM;
        }
    }
    *out = la;
    return KVT_OK;
}

void kvt_laneal_destroy(kvt_laneal_t *la) {
    if (la == NULL) return;
    for (uint32_t l = 0; l < la->lanes; l++) kvt_extalloc_destroy(la->lane[l]);
    kvt__free(la->lane, la->lanes * sizeof(*la->lane));
    kvt__free(la->dealt, la->lanes * sizeof(uint64_t));
    kvt__free(la->scratch, la->scratch_bytes);
    KVT_DELETE(la);
}

uint64_t kvt_laneal_lane_dealt(const kvt_laneal_t *la, uint32_t lane) {
    return la == NULL || lane >= la->lanes ? 0 : la->dealt[lane];
}

uint64_t kvt_laneal_lane_free(const kvt_laneal_t *la, uint32_t lane) {
    kvt_extalloc_stats_t st = {.size = sizeof(st)};
    if (la == NULL || lane >= la->lanes) return 0;
    kvt_extalloc_stats(la->lane[lane], &st);
    return st.free_pages;
}

/* Pages lane l gets out of n when the rotation starts at `next`. */
static uint64_t share_of(const kvt_laneal_t *la, uint64_t n, uint32_t l) {
    uint32_t off = (l + la->lanes - la->next) % la->lanes;
    return n / la->lanes + (off < n % la->lanes ? 1 : 0);
}

/* Each lane's share of n pages: the rotation's, except that a lane short of
 * its share gives the difference to the next lanes, in rotation order, that
 * have room. false when fewer than n pages are free in all. */
static bool plan_shares(const kvt_laneal_t *la, uint64_t n, uint64_t *share) {
    uint64_t deficit = 0, total = 0;
    for (uint32_t j = 0; j < la->lanes; j++) {
        uint32_t l = (la->next + j) % la->lanes;
        uint64_t free_l = kvt_laneal_lane_free(la, l);
        total += free_l;
        share[l] = share_of(la, n, l);
        if (share[l] > free_l) deficit += share[l] - free_l, share[l] = free_l;
    }
    if (total < n) return false;
    for (uint32_t j = 0; j < la->lanes && deficit > 0; j++) {
        uint32_t l = (la->next + j) % la->lanes;
        uint64_t room = kvt_laneal_lane_free(la, l) - share[l], take = room < deficit ? room : deficit;
        share[l] += take;
        deficit -= take;
    }
    return true;
}

int kvt_laneal_reserve(kvt_laneal_t *la, uint64_t n, uint32_t *pages) {
    if (la == NULL || pages == NULL || n == 0) return KVT_EINVAL;
    uint64_t total = 0; /* too few free pages: ENOSPC, before sizing the scratch by n (ENOMEM for a huge n) */
    for (uint32_t l = 0; l < la->lanes; l++) total += kvt_laneal_lane_free(la, l);
    if (total < n) {
        la->reserve_failures++;
        return KVT_ENOSPC;
    }
    size_t sbytes = 2 * (size_t)la->lanes * sizeof(uint64_t);
    uint64_t *share = n <= (SIZE_MAX - sbytes) / sizeof(kvt_run_t) ? scratch(la, sbytes + n * sizeof(kvt_run_t)) : NULL;
    uint64_t *first = share ? share + la->lanes : NULL;
    kvt_run_t *runs = share ? (kvt_run_t *)(void *)(share + 2 * (size_t)la->lanes) : NULL;
    int rc = share ? KVT_OK : KVT_ENOMEM;
    if (share) memset(share, 0, sbytes);
    if (rc == KVT_OK && !plan_shares(la, n, share)) rc = KVT_ENOSPC;
    for (uint32_t l = 0; l < la->lanes && rc == KVT_OK; l++)
        if (share[l] > 0) rc = kvt__extalloc_prepare_reserve(la->lane[l]);
    if (rc != KVT_OK) {
        la->reserve_failures++;
        return scratch_done(la, rc);
    }
    /* Reserve every lane's share (prepared: cannot fail), runs lane by lane. */
    size_t nruns = 0;
    for (uint32_t l = 0; l < la->lanes; l++) {
        size_t k = 0;
        first[l] = nruns;
        la->dealt[l] += share[l];
        if (share[l]) kvt_extalloc_reserve(la->lane[l], share[l], runs + nruns, share[l], &k);
        nruns += k;
    }
    /* Deal the pages out in rotation, skipping lanes whose share is used up
     * (with the rotation's shares this is exactly page i -> lane next + i). */
    uint32_t l = la->next;
    for (uint64_t i = 0; i < n; l = l + 1 == la->lanes ? 0 : l + 1) { /* (not a division a page) */
        if (share[l] == 0) continue;
        kvt_run_t *r = &runs[first[l]];
        pages[i++] = (uint32_t)((uint64_t)r->start * la->lanes + l);
        share[l]--;
        if (--r->len == 0) first[l]++; /* the lane's next run */
        else r->start++;
    }
    la->next = (uint32_t)((la->next + n) % la->lanes);
    la->reserves++;
    return scratch_done(la, KVT_OK);
}


int kvt_laneal_free(kvt_laneal_t *la, const uint32_t *pages, size_t n) {
    if (la == NULL || pages == NULL || n == 0) return KVT_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (pages[i] >= la->pages) return KVT_ERANGE;
    /* One pass cuts the pages into runs of each lane's consecutive local pages,
     * in either direction (a node's pages come back tail first, dealt over the
     * lanes in turn: a lane's open run grows at either end); the runs, far
     * fewer than the pages, are then sorted by (lane, start): bucketed by lane,
     * each lane's radix sorted (sort-int.h; no comparison sort). */
    uint32_t lanes = la->lanes;
    size_t per = 2 * sizeof(uint64_t) + sizeof(kvt__free_plan_t), counts = (3 * (size_t)lanes + 1) * sizeof(size_t);
    uint64_t *keys = n <= (SIZE_MAX - counts) / per ? scratch(la, n * per + counts) : NULL, *tmp = keys ? keys + n : NULL;
    kvt__free_plan_t *runs = keys ? (kvt__free_plan_t *)(void *)(keys + 2 * n) : NULL;
    size_t *first = keys ? (size_t *)(void *)(runs + n) : NULL, *merged = first ? first + lanes + 1 : NULL,
           *open = merged ? merged + lanes : NULL;
    int rc = keys ? KVT_OK : KVT_ENOMEM;
    if (rc == KVT_OK) {
        memset(first, 0, (2 * (size_t)lanes + 1) * sizeof(size_t)); /* first and merged */
        for (uint32_t l = 0; l < lanes; l++) open[l] = SIZE_MAX;
        bool pow2 = (lanes & (lanes - 1)) == 0; /* 1, 2, 4, ...: a mask and a shift, not a division a page */
        unsigned shift = kvt__bits_of(lanes - 1);
        size_t nr = 0;
        /* The run of the last page's lane is held in locals (cl, cs, clen; cr its slot): a run of
         * one lane's pages grows in registers, without a store and a reload per page (a chain
         * through memory); it goes to runs[] when another lane's page comes. */
        uint32_t cl = UINT32_MAX, cs = 0, clen = 0;
        size_t cr = 0;
        for (size_t i = 0; i < n; i++) { /* (page ids are 32-bit: a 32-bit division, not kvt_lane_of's 64-bit one) */
            uint32_t l = pow2 ? pages[i] & (lanes - 1) : pages[i] % lanes, x = pow2 ? pages[i] >> shift : pages[i] / lanes;
            if (l != cl) {
                if (cl != UINT32_MAX) runs[cr].run = (kvt_run_t){cs, clen};
                cl = l;
                if (open[l] == SIZE_MAX) goto fresh;
                cr = open[l];
                cs = runs[cr].run.start, clen = runs[cr].run.len;
            }
            if ((uint64_t)cs + clen == x) {
                clen++;
                continue;
            }
            if ((uint64_t)x + 1 == cs) {
                cs--, clen++;
                continue;
            }
            runs[cr].run = (kvt_run_t){cs, clen};
        fresh:
            tmp[nr] = l;
            first[l + 1]++;
            open[l] = cr = nr++;
            cs = x, clen = 1;
        }
        if (cl != UINT32_MAX) runs[cr].run = (kvt_run_t){cs, clen};
        for (uint32_t l = 0; l < lanes; l++) first[l + 1] += first[l]; /* counts -> where each lane's runs begin */
        /* key: the start above the length's bits; merged[] is each lane's fill cursor for now */
        uint64_t lane0 = kvt_lane_pages(la->pages, lanes, 0); /* the longest lane: a run's length is at most this, or n */
        unsigned lenbits = kvt__bits_of(n < lane0 ? n : lane0), bits = kvt__bits_of(lane0 - 1) + lenbits; /* <= 64 */
        for (uint32_t l = 0; l < lanes; l++) merged[l] = first[l];
        for (size_t j = 0; j < nr; j++) keys[merged[tmp[j]]++] = (uint64_t)runs[j].run.start << lenbits | runs[j].run.len;
        for (uint32_t l = 0; l < lanes; l++) {
            size_t cnt = first[l + 1] - first[l];
            if (cnt > 1) kvt__sort_u64(keys + first[l], tmp, cnt, bits); /* nearly in order: a scan, or few runs */
            merged[l] = 0;
        }
        for (size_t j = 0; j < nr; j++)
            runs[j].run = (kvt_run_t){(uint32_t)(keys[j] >> lenbits), (uint32_t)(keys[j] & ((1ull << lenbits) - 1))};
    }
    /* Validate and prepare every lane before freeing on any. Touching runs
     * merge in place; `merged[l]` counts lane l's runs after merging. */
    for (uint32_t l = 0; l < la->lanes && rc == KVT_OK; l++) {
        size_t cnt = first[l + 1] - first[l];
        if (cnt == 0) continue;
        rc = kvt__extalloc_free_validate(la->lane[l], &runs[first[l]], cnt, &merged[l]);
        if (rc == KVT_OK) rc = kvt__extalloc_free_prepare(la->lane[l], merged[l]);
    }
    if (rc == KVT_OK) {
        for (uint32_t l = 0; l < la->lanes; l++)
            if (merged[l]) kvt__extalloc_free_apply(la->lane[l], &runs[first[l]], merged[l]);
        la->frees++;
    }
    return scratch_done(la, rc);
}

int kvt_laneal_stats(const kvt_laneal_t *la, kvt_laneal_stats_t *out) {
    if (la == NULL || out == NULL) return KVT_EINVAL;
    kvt_laneal_stats_t full = {.size = sizeof(full)}, *st = &full;
    st->lanes = la->lanes;
    st->pages = la->pages;
    st->free_pages = 0;
    st->lane_free_min = UINT64_MAX;
    st->lane_free_max = 0;
    st->next_lane = la->next;
    st->metadata_bytes = sizeof(*la) + la->lanes * (sizeof(*la->lane) + sizeof(*la->dealt)) + la->scratch_bytes;
    for (uint32_t l = 0; l < la->lanes; l++) {
        kvt_extalloc_stats_t es = {.size = sizeof(es)};
        kvt_extalloc_stats(la->lane[l], &es);
        st->free_pages += es.free_pages;
        st->metadata_bytes += es.metadata_bytes;
        if (es.free_pages < st->lane_free_min) st->lane_free_min = es.free_pages;
        if (es.free_pages > st->lane_free_max) st->lane_free_max = es.free_pages;
    }
    st->reserves = la->reserves;
    st->reserve_failures = la->reserve_failures;
    st->frees = la->frees;
    return kvt__abi_out(out, st, sizeof(*st));
}

int kvt_laneal_check(const kvt_laneal_t *la, const char **why) {
    if (why) *why = NULL;
    if (la == NULL) return KVT_EINVAL;
    if (la->next >= la->lanes) return (why ? *why = "the next lane is out of range" : 0), KVT_ECORRUPT;
    for (uint32_t l = 0; l < la->lanes; l++) {
        kvt_extalloc_stats_t es = {.size = sizeof(es)};
        if (kvt_extalloc_check(la->lane[l], why) != KVT_OK) return KVT_ECORRUPT;
        kvt_extalloc_stats(la->lane[l], &es);
        if (es.pages != kvt_lane_pages(la->pages, la->lanes, l)) return (why ? *why = "a lane's size is wrong" : 0), KVT_ECORRUPT;
    }
    return KVT_OK;
}
