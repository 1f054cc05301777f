/* The PD hand-off in one process, as a plain program for ThreadSanitizer:
 * a receiver (its control thread, the page server's threads), C sender
 * threads with their transfer engines, and this thread polling, checking
 * every page against its hash and releasing — concurrently with the control
 * thread's reservations. A second round has a rank vanish mid-hand-off.
 *
 *   tsan-pd [HANDOFFS]     exit 0 when every page checked and the pool is whole */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier/testing.h"
#include "kvtier/error.h"
#include "kvtier/pd.h"

#define C 3
#define POOL 128
#define LB 1024
#define MAXN 40

typedef struct job {
    kvt_pd_receiver_t *rx;
    uint32_t rank;
    uint64_t nh, vanish_at;
} job_t;

static uint64_t nof(uint64_t h) { return C + (h * 11) % (MAXN - C); }
static uint64_t lo(uint64_t h, uint64_t j) { return (h << 20 | j) * 0x9e3779b97f4a7c15ull + 7; }

static void *sender(void *arg) {
    job_t *j = arg;
    kvt_tier_t *src = NULL;
    kvt_tier_config_t tc = {.size = sizeof(tc), .kind = KVT_TIER_ARENA, .geom = {MAXN, 1, LB, KVT_LAYOUT_PAGE_FIRST}};
    kvt_pd_sender_config_t sc = {.size = sizeof(sc), .rank = j->rank, .ranks = C, .token = 42,
                                 .data_port = kvt_pd_receiver_data_port(j->rx), .control_port = kvt_pd_receiver_control_port(j->rx)};
    kvt_pd_sender_t *s = NULL;
    uint8_t scratch[LB];
    if (kvt_tier_create(&src, &tc) != KVT_OK) return NULL;
    sc.src = src;
    if (kvt_pd_sender_create(&s, &sc) != KVT_OK) return kvt_tier_destroy(src), NULL;
    uint32_t dst[MAXN];
    kvt_xfer_copy_t cp[MAXN];
    for (uint64_t h = 0; h < j->nh; h++) {
        uint64_t n = nof(h), np = 0;
        for (uint64_t p = j->rank; p < n; p += C, np++) kvt_tier_pattern_fill(src, np, lo(h, p), h, scratch);
        int rc = kvt_pd_sender_begin(s, h, n, dst);
        if (h == j->vanish_at) break;
        if (rc != KVT_OK) continue;
        for (uint64_t p = j->rank, q = 0; p < n; p += C, q++) cp[q] = (kvt_xfer_copy_t){(uint32_t)q, dst[p]};
        kvt_pd_sender_send(s, h, cp, np);
    }
    if (j->vanish_at == UINT64_MAX) kvt_pd_sender_finish(s);
    kvt_pd_sender_destroy(s);
    kvt_tier_destroy(src);
    return NULL;
}

/* One group; the number of bad pages, or -1 when the run went wrong. */
static int64_t round_(kvt_tier_t *pool, uint64_t nh, uint64_t vanish_at, uint64_t *complete, uint64_t *failed) {
    kvt_pd_receiver_t *rx;
    kvt_pd_receiver_config_t rc = {.size = sizeof(rc), .pool = pool, .ranks = C, .token = 42, .window = 4};
    if (kvt_pd_receiver_create(&rx, &rc) != KVT_OK) return -1;
    job_t jobs[C];
    pthread_t th[C];
    for (uint32_t r = 0; r < C; r++) {
        jobs[r] = (job_t){rx, r, nh, r == 1 ? vanish_at : UINT64_MAX};
        pthread_create(&th[r], NULL, sender, &jobs[r]);
    }
    int64_t bad = 0;
    uint8_t scratch[LB];
    for (int ended = 0, tries = 0; !ended && tries < 600; tries++) {
        kvt_pd_event_t ev[4];
        int n = kvt_pd_receiver_poll(rx, ev, 4, 100000000ull);
        for (int i = 0; i < n; i++) {
            if (ev[i].type == KVT_PD_EV_END) {
                ended = 1;
                continue;
            }
            for (uint64_t p = 0; ev[i].type == KVT_PD_EV_COMPLETE && p < ev[i].npages; p++)
                bad += !kvt_tier_pattern_check(pool, ev[i].pages[p], lo(ev[i].handoff, p), ev[i].handoff, scratch);
            (ev[i].type == KVT_PD_EV_COMPLETE ? (*complete)++ : (*failed)++);
            kvt_pd_receiver_release(rx, ev[i].handoff);
        }
        kvt_pd_stats_t *st = malloc(sizeof(*st)); /* concurrently with the control thread */
        st->size = sizeof(*st);
        kvt_pd_receiver_stats(rx, st);
        free(st);
    }
    for (uint32_t r = 0; r < C; r++) pthread_join(th[r], NULL);
    kvt_pd_stats_t *st = malloc(sizeof(*st));
    st->size = sizeof(*st);
    kvt_pd_receiver_stats(rx, st);
    if (st->free_pages != POOL) bad = -1;
    free(st);
    kvt_pd_receiver_destroy(rx);
    return bad;
}

int main(int argc, char **argv) {
    uint64_t nh = argc > 1 ? strtoull(argv[1], NULL, 10) : 40, complete = 0, failed = 0;
    kvt_tier_t *pool = NULL;
    kvt_tier_config_t tc = {.size = sizeof(tc), .kind = KVT_TIER_ARENA, .geom = {POOL, 1, LB, KVT_LAYOUT_PAGE_FIRST}};
    if (kvt_tier_create(&pool, &tc) != KVT_OK) return 1;
    int64_t a = round_(pool, nh, UINT64_MAX, &complete, &failed);
    uint64_t clean = complete;
    int64_t b = round_(pool, nh, 5, &complete, &failed);
    kvt_tier_destroy(pool);
    if (a != 0 || b != 0 || clean != nh || complete - clean != 5 || failed == 0) {
        fprintf(stderr, "tsan-pd: FAILED: bad pages %" PRId64 "/%" PRId64 ", %" PRIu64 " clean of %" PRIu64 ", %" PRIu64
                " then, %" PRIu64 " failed\n", a, b, clean, nh, complete - clean, failed);
        return 1;
    }
    printf("tsan-pd: %" PRIu64 " hand-offs checked; with a vanished rank %" PRIu64 " completed, %" PRIu64 " failed, pool whole\n",
           clean, complete - clean, failed);
    return 0;
}
