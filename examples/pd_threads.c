/* A PD hand-off between threads of one process, on the library alone: a
 * decode-side receiver serving a pool tier, and a prefill CP group of two
 * ranks (one sender thread each) handing off 20 requests' pages over TCP on
 * 127.0.0.1. Page j of a request belongs to rank j mod 2; each rank writes
 * its own pages (the "forward pass": content from the page's hash) into its
 * own tier and sends them; decode checks every page of every completed
 * hand-off byte for byte, then releases it.
 *
 *   cc pd_threads.c $(pkg-config --cflags --libs kvtier) -o pd_threads
 *
 * Decode's calls in order: kvt_pd_receiver_create (tell the ranks its two
 * ports and the token), kvt_pd_receiver_poll (COMPLETE / FAILED events with
 * the pages, then END), kvt_pd_receiver_release per hand-off, destroy. A
 * rank's: kvt_pd_sender_create, per hand-off kvt_pd_sender_begin (the
 * destination pages) and kvt_pd_sender_send (its own pages), finish,
 * destroy. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include <kvtier/kvtier.h>

#include "content.h"

#define RANKS 2
#define HANDOFFS 20
#define PAGES 8 /* per hand-off */
#define LAYERS 2
#define LB 1024 /* bytes of a page in a layer */
#define TOKEN 0x5eed5eed1234ull

static uint16_t g_dport, g_cport;

static kvt_hash128_t page_hash(uint64_t h, uint64_t j) { return (kvt_hash128_t){h * 1000003u + j, ~h}; }

static void *rank_main(void *arg) {
    uint32_t r = (uint32_t)(uintptr_t)arg;
    kvt_tier_t *src = NULL;
    kvt_tier_config_t tc = {.size = sizeof(tc), .kind = KVT_TIER_ARENA, .geom = {PAGES, LAYERS, LB, KVT_LAYOUT_PAGE_FIRST}};
    unsigned char scratch[LB];
    kvt_pd_sender_t *s = NULL;
    kvt_pd_sender_config_t sc = {.size = sizeof(sc), .rank = r, .ranks = RANKS, .token = TOKEN,
                                 .data_port = g_dport, .control_port = g_cport};
    if (kvt_tier_create(&src, &tc) != KVT_OK) return (void *)1;
    sc.src = src;
    int rc = kvt_pd_sender_create(&s, &sc);
    for (uint64_t h = 0; rc == KVT_OK && h < HANDOFFS; h++) {
        uint32_t dst[PAGES];
        kvt_xfer_copy_t cp[PAGES];
        size_t n = 0;
        for (uint64_t j = r; j < PAGES; j += RANKS, n++) { /* our pages, into our tier */
            kvt_hash128_t ph = page_hash(h, j);
            content_fill(src, n, ph.lo, ph.hi, scratch);
        }
        if ((rc = kvt_pd_sender_begin(s, h, PAGES, dst)) != KVT_OK) break;
        n = 0;
        for (uint64_t j = r; j < PAGES; j += RANKS, n++) cp[n] = (kvt_xfer_copy_t){(uint32_t)n, dst[j]};
        rc = kvt_pd_sender_send(s, h, cp, n);
    }
    if (rc == KVT_OK) rc = kvt_pd_sender_finish(s);
    kvt_pd_sender_destroy(s);
    kvt_tier_destroy(src);
    if (rc != KVT_OK) fprintf(stderr, "pd_threads: rank %u: %s\n", r, kvt_strerror(rc));
    return (void *)(uintptr_t)(rc != KVT_OK);
}

int main(void) {
    kvt_tier_t *pool = NULL;
    kvt_tier_config_t pc = {.size = sizeof(pc), .kind = KVT_TIER_ARENA, .name = "decode",
                            .geom = {64, LAYERS, LB, KVT_LAYOUT_PAGE_FIRST}};
    kvt_pd_receiver_t *rx = NULL;
    kvt_pd_receiver_config_t rcfg = {.size = sizeof(rcfg), .ranks = RANKS, .token = TOKEN};
    if (kvt_tier_create(&pool, &pc) != KVT_OK) return 1;
    rcfg.pool = pool;
    int rc = kvt_pd_receiver_create(&rx, &rcfg);
    if (rc != KVT_OK) {
        fprintf(stderr, "pd_threads: receiver: %s\n", kvt_strerror(rc));
        return 1;
    }
    g_dport = kvt_pd_receiver_data_port(rx);
    g_cport = kvt_pd_receiver_control_port(rx);
    pthread_t th[RANKS];
    for (uintptr_t r = 0; r < RANKS; r++) pthread_create(&th[r], NULL, rank_main, (void *)r);
    unsigned complete = 0, failed = 0, wrong = 0;
    unsigned char scratch[LB];
    for (int ended = 0, tries = 0; !ended && tries < 600; tries++) {
        kvt_pd_event_t ev[8];
        int n = kvt_pd_receiver_poll(rx, ev, 8, 50000000ull);
        for (int i = 0; i < n; i++) {
            if (ev[i].type == KVT_PD_EV_END) {
                ended = 1;
                continue;
            }
            if (ev[i].type == KVT_PD_EV_COMPLETE) {
                complete++;
                for (uint64_t j = 0; j < ev[i].npages; j++) {
                    kvt_hash128_t ph = page_hash(ev[i].handoff, j);
                    wrong += !content_check(pool, ev[i].pages[j], ph.lo, ph.hi, scratch);
                }
            } else {
                failed++;
            }
            kvt_pd_receiver_release(rx, ev[i].handoff);
        }
    }
    int bad = 0;
    for (int r = 0; r < RANKS; r++) {
        void *v;
        pthread_join(th[r], &v);
        bad |= v != NULL;
    }
    kvt_pd_stats_t st = {.size = sizeof(st)};
    kvt_pd_receiver_stats(rx, &st);
    kvt_pd_receiver_destroy(rx);
    kvt_tier_destroy(pool);
    printf("pd_threads: %u hand-offs complete, %u failed, %u pages wrong; straggler %d\n", complete, failed, wrong,
           st.straggler);
    if (bad || failed || wrong || complete != HANDOFFS) return 1;
    puts("ok");
    return 0;
}
