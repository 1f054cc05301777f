/* The store's threads under ThreadSanitizer (make test-tsan): a dir store
 * with 4 workers, 4 threads submitting puts, gets and exists of their own
 * pages while one thread polls (each thread reuses its pages only once the
 * poller has seen its batch reported: the async contract); every page a get
 * brought back is checked against its content model, and a batch left in
 * flight at close is waited for. Exit 0 when every batch was reported and
 * every page is right.
 *   tsan-store DIR */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier/testing.h"
#include "kvtier/error.h"
#include "kvtier/stats.h"
#include "kvtier/store.h"
#include "kvtier/tier.h"

#define THREADS 4
#define BATCHES 40
#define PER 4 /* pages a batch */
#define LB 2048

static kvt_tier_t *g_tier;
static kvt_store_t *g_store;
static _Atomic int g_bad;
static _Atomic int g_done[THREADS]; /* batches of each thread the poller has seen reported */

static kvt_hash128_t hash_of(int t, int k) { return (kvt_hash128_t){(uint64_t)(t * 1000 + k) * 0x9e3779b97f4a7c15ull, (uint64_t)t}; }

/* Thread t owns tier pages [t*2*PER, t*2*PER + 2*PER): the first PER to put from, the next PER to get into. */
static void *submitter(void *arg) {
    int t = (int)(intptr_t)arg;
    unsigned char scratch[LB];
    for (int b = 0; b < BATCHES; b++) {
        kvt_store_page_t p[PER];
        int op = b % 3; /* put, then get, then exists of the same keys */
        int k0 = (b / 3) * PER;
        for (int i = 0; i < PER; i++) {
            p[i].hash = hash_of(t, k0 + i);
            p[i].page = (uint32_t)(t * 2 * PER + (op == 1 ? PER : 0) + i);
            if (op == 0) kvt_tier_pattern_fill(g_tier, p[i].page, p[i].hash.lo, p[i].hash.hi, scratch);
        }
        uint64_t user = (uint64_t)t << 32 | (uint64_t)b;
        int rc = op == 0 ? kvt_store_put(g_store, p, PER, user, NULL)
               : op == 1 ? kvt_store_get(g_store, p, PER, user, NULL)
                         : kvt_store_exists(g_store, p, PER, user, NULL);
        if (rc != KVT_OK) atomic_fetch_add(&g_bad, 1);
        /* the pages are the store's until the batch is reported (the async
         * contract): the next batch reuses them only after the poller saw it */
        while (rc == KVT_OK && atomic_load_explicit(&g_done[t], memory_order_acquire) <= b) {
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) return fprintf(stderr, "usage: tsan-store DIR\n"), 2;
    char url[512];
    snprintf(url, sizeof(url), "dir:%s", argv[1]);
    kvt_tier_config_t tc = {.size = sizeof(tc), .kind = KVT_TIER_HOST, .geom = {THREADS * 2 * PER, 1, LB, KVT_LAYOUT_PAGE_FIRST}};
    if (kvt_tier_create(&g_tier, &tc) != KVT_OK) return 1;
    kvt_store_config_t sc;
    kvt_store_config_default(&sc);
    sc.tier = g_tier, sc.model = "tsan", sc.page_tokens = 16, sc.threads = 4;
    if (kvt_store_open(&g_store, url, &sc) != KVT_OK) return fprintf(stderr, "open: %s\n", kvt_store_last_error(NULL)), 1;
    pthread_t th[THREADS];
    for (intptr_t t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, submitter, (void *)t);
    int reported = 0, gets_ok = 0;
    uint64_t t0 = kvt_now_ns();
    while (reported < THREADS * BATCHES && kvt_now_ns() - t0 < 60000000000ull) {
        kvt_store_done_t d[16];
        int n = kvt_store_poll(g_store, d, 16, 50000000ull);
        for (int i = 0; i < n; i++) {
            gets_ok += d[i].op == KVT_STORE_GET && d[i].status == KVT_OK;
            atomic_fetch_add_explicit(&g_done[d[i].user >> 32], 1, memory_order_release);
        }
        if (n > 0) reported += n;
    }
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    /* each thread's last get (batch 37: keys 48..51) landed in its get pages */
    int wrong = 0;
    unsigned char scratch[LB];
    for (int t = 0; t < THREADS; t++)
        for (int i = 0; i < PER; i++) {
            kvt_hash128_t h = hash_of(t, (37 / 3) * PER + i);
            wrong += !kvt_tier_pattern_check(g_tier, (uint64_t)(t * 2 * PER + PER + i), h.lo, h.hi, scratch);
        }
    if (wrong) atomic_fetch_add(&g_bad, wrong);
    kvt_store_page_t p = {hash_of(0, 0), 0}; /* in flight at close */
    kvt_store_exists(g_store, &p, 1, 0, NULL);
    kvt_store_close(g_store);
    kvt_tier_destroy(g_tier);
    printf("tsan-store: %d of %d batches reported, %d gets, %d refused submits or wrong pages\n", reported, THREADS * BATCHES, gets_ok,
           atomic_load(&g_bad));
    return reported == THREADS * BATCHES && atomic_load(&g_bad) == 0 ? 0 : 1;
}
