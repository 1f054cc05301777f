/* The PD hand-off in one process: a receiver on a pool tier and C sender
 * threads over tcp on 127.0.0.1. Page j of hand-off h carries the content
 * its hash (h, j) gives (kvt_tier_pattern_fill), and every page reported
 * complete is checked byte for byte against that model; the page lists are
 * checked to be distinct pages of the pool, and the pool is whole again
 * (free pages == pool pages) once every reported hand-off is released. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvtier/testing.h"
#include "kvtier/error.h"
#include "kvtier/pd.h"
#include "kvtier/tier.h"
#include "core/mem-int.h"
#include "sock/wire.h"
#include "pd/wire.h"

#define POOL 160
#define LAYERS 2
#define LB 512
#define MAXN 48
#define TOKEN 0x5eed5eed12345678ull

static uint64_t nof(uint64_t h, uint32_t C) { return C + (h * 7) % (MAXN - C); } /* pages of hand-off h */
static uint64_t hash_lo(uint64_t h, uint64_t j) { return (h << 20 | j) * 0x9e3779b97f4a7c15ull + 1; }
static uint64_t hash_hi(uint64_t h) { return h ^ 0xabcdefull; }

static kvt_tier_t *arena(uint64_t pages) {
    kvt_tier_t *t = NULL;
    kvt_tier_config_t c = {.size = sizeof(c), .kind = KVT_TIER_ARENA, .geom = {pages, LAYERS, LB, KVT_LAYOUT_PAGE_FIRST}};
    cr_assert_eq(kvt_tier_create(&t, &c), KVT_OK);
    return t;
}

typedef struct env {
    kvt_tier_t *pool;
    kvt_pd_receiver_t *rx;
    uint32_t C;
    kvt_pd_stats_t *st;
} env_t;

static void env_init(env_t *e, uint32_t C, uint32_t window, uint64_t pool_pages) {
    memset(e, 0, sizeof(*e));
    e->C = C;
    e->pool = arena(pool_pages);
    kvt_pd_receiver_config_t rc = {.size = sizeof(rc), .pool = e->pool, .ranks = C, .token = TOKEN, .window = window};
    cr_assert_eq(kvt_pd_receiver_create(&e->rx, &rc), KVT_OK);
    e->st = calloc(1, sizeof(kvt_pd_stats_t));
    e->st->size = sizeof(kvt_pd_stats_t);
}

static void env_stats(env_t *e) { cr_assert_eq(kvt_pd_receiver_stats(e->rx, e->st), KVT_OK); }

static void env_fini(env_t *e) {
    kvt_pd_receiver_destroy(e->rx);
    kvt_tier_destroy(e->pool);
    free(e->st);
}

/* ---- sender threads --------------------------------------------------------------- */

typedef struct job {
    env_t *e;
    uint32_t rank;
    uint64_t nh;
    uint64_t vanish_at; /* closes after its begin of this hand-off (UINT64_MAX: never) */
    uint64_t delay_us;  /* before each send */
    int create_rc, sent, refused, failed;
    kvt_pd_rank_stats_t st;
    pthread_t th;
} job_t;

static kvt_pd_sender_t *connect_rank(env_t *e, kvt_tier_t *src, uint32_t rank, uint64_t token, int *rc) {
    kvt_pd_sender_config_t sc = {.size = sizeof(sc), .src = src, .rank = rank, .ranks = e->C, .token = token,
                                 .data_port = kvt_pd_receiver_data_port(e->rx),
                                 .control_port = kvt_pd_receiver_control_port(e->rx), .welcome_timeout_ms = 5000};
    kvt_pd_sender_t *s = NULL;
    *rc = kvt_pd_sender_create(&s, &sc);
    return s;
}

/* A group of one rank, joined on this thread, over a pool of 64 pages: the
 * rank's sender, over a source tier of its own (*src). */
static kvt_pd_sender_t *lone_rank(env_t *e, kvt_tier_t **src) {
    env_init(e, 1, 4, 64);
    *src = arena(MAXN);
    int rc;
    kvt_pd_sender_t *s = connect_rank(e, *src, 0, TOKEN, &rc);
    cr_assert_eq(rc, KVT_OK);
    return s;
}

/* One hand-off, this rank's part: fill its pages, ask, send. */
static int one(job_t *j, kvt_pd_sender_t *s, kvt_tier_t *src, uint64_t h, uint8_t *scratch, bool *vanish) {
    uint64_t n = nof(h, j->e->C), np = 0;
    uint32_t dst[MAXN];
    kvt_xfer_copy_t cp[MAXN];
    for (uint64_t p = j->rank; p < n; p += j->e->C, np++) kvt_tier_pattern_fill(src, np, hash_lo(h, p), hash_hi(h), scratch);
    int rc = kvt_pd_sender_begin(s, h, n, dst);
    if (h == j->vanish_at) return *vanish = true, rc;
    if (rc != KVT_OK) return j->refused++, rc;
    np = 0;
    for (uint64_t p = j->rank; p < n; p += j->e->C, np++) cp[np] = (kvt_xfer_copy_t){(uint32_t)np, dst[p]};
    if (j->delay_us) usleep((useconds_t)j->delay_us);
    rc = kvt_pd_sender_send(s, h, cp, np);
    if (rc == KVT_OK) j->sent++;
    else j->failed++;
    return rc;
}

static void *sender_main(void *arg) {
    job_t *j = arg;
    kvt_tier_t *src = NULL;
    kvt_tier_config_t c = {.size = sizeof(c), .kind = KVT_TIER_ARENA, .geom = {MAXN, LAYERS, LB, KVT_LAYOUT_PAGE_FIRST}};
    uint8_t scratch[LB];
    if (kvt_tier_create(&src, &c) != KVT_OK) return j->create_rc = KVT_ENOMEM, NULL;
    kvt_pd_sender_t *s = connect_rank(j->e, src, j->rank, TOKEN, &j->create_rc);
    bool vanish = false;
    for (uint64_t h = 0; s && h < j->nh && !vanish; h++) one(j, s, src, h, scratch, &vanish);
    if (s && !vanish) kvt_pd_sender_finish(s);
    if (s) kvt_pd_sender_stats(s, &j->st);
    kvt_pd_sender_destroy(s); /* a vanishing rank closes without a goodbye */
    kvt_tier_destroy(src);
    return NULL;
}

static void start(job_t *jobs, env_t *e, uint64_t nh) {
    for (uint32_t r = 0; r < e->C; r++) {
        if (!jobs[r].nh) jobs[r] = (job_t){.vanish_at = UINT64_MAX};
        jobs[r].e = e, jobs[r].rank = r, jobs[r].nh = nh;
        cr_assert_eq(pthread_create(&jobs[r].th, NULL, sender_main, &jobs[r]), 0);
    }
}

static void join_all(job_t *jobs, uint32_t C) {
    for (uint32_t r = 0; r < C; r++) pthread_join(jobs[r].th, NULL);
}

/* ---- the decode side: every event checked against the model ------------------------ */

typedef struct seen {
    int complete[256], failed[256];
    int32_t fail_rank[256];
    uint64_t mismatched, events;
    bool ended;
    int end_status;
} seen_t;

static void check_pages(env_t *e, const kvt_pd_event_t *ev, seen_t *m, bool content) {
    static bool held[POOL];
    memset(held, 0, sizeof(held));
    cr_assert_eq(ev->npages, nof(ev->handoff, e->C), "hand-off %llu: its page list", (unsigned long long)ev->handoff);
    uint8_t scratch[LB];
    for (uint64_t p = 0; p < ev->npages; p++) {
        cr_assert_lt(ev->pages[p], POOL);
        cr_assert(!held[ev->pages[p]], "page %u twice in hand-off %llu", ev->pages[p], (unsigned long long)ev->handoff);
        held[ev->pages[p]] = true;
        if (content) m->mismatched += !kvt_tier_pattern_check(e->pool, ev->pages[p], hash_lo(ev->handoff, p), hash_hi(ev->handoff), scratch);
    }
}

/* Polls until END (or 30 s), checking and releasing every hand-off reported. */
static void drain(env_t *e, seen_t *m) {
    memset(m, 0, sizeof(*m));
    for (int tries = 0; tries < 300 && !m->ended; tries++) {
        kvt_pd_event_t ev[8];
        int n = kvt_pd_receiver_poll(e->rx, ev, 8, 100000000ull);
        cr_assert_geq(n, 0);
        for (int i = 0; i < n; i++, m->events++) {
            if (ev[i].type == KVT_PD_EV_END) {
                m->ended = true;
                m->end_status = ev[i].status;
                continue;
            }
            cr_assert_lt(ev[i].handoff, 256);
            check_pages(e, &ev[i], m, ev[i].type == KVT_PD_EV_COMPLETE);
            if (ev[i].type == KVT_PD_EV_COMPLETE) m->complete[ev[i].handoff]++;
            else m->failed[ev[i].handoff]++, m->fail_rank[ev[i].handoff] = ev[i].rank;
            cr_assert_eq(kvt_pd_receiver_release(e->rx, ev[i].handoff), KVT_OK);
            cr_assert_eq(kvt_pd_receiver_release(e->rx, ev[i].handoff), KVT_ENOENT, "released once");
        }
    }
    cr_assert(m->ended, "the receiver reported its end");
}

Test(pd, handoffs_land_byte_for_byte, .timeout = 60) {
    env_t e;
    env_init(&e, 4, 8, POOL);
    job_t jobs[4] = {{0}};
    start(jobs, &e, 60);
    seen_t m;
    drain(&e, &m);
    join_all(jobs, 4);
    cr_assert_eq(m.end_status, KVT_OK);
    for (int h = 0; h < 60; h++) cr_assert_eq(m.complete[h], 1, "hand-off %d completed once", h);
    cr_assert_eq(m.mismatched, 0, "every page holds what its hash says");
    env_stats(&e);
    cr_assert_eq(e.st->handoffs, 60);
    cr_assert_eq(e.st->failed, 0);
    cr_assert_eq(e.st->free_pages, POOL, "every page back in the pool");
    cr_assert_eq(e.st->joined, 4);
    uint64_t pages = 0, landed = 0;
    for (int h = 0; h < 60; h++) pages += nof((uint64_t)h, 4);
    cr_assert_eq(e.st->pages, pages);
    for (uint32_t r = 0; r < 4; r++) {
        cr_assert_eq(jobs[r].create_rc, KVT_OK);
        cr_assert_eq(jobs[r].sent, 60);
        cr_assert_eq(jobs[r].st.handoffs, 60);
        cr_assert_leq(jobs[r].st.runs, jobs[r].st.pages);
        landed += e.st->rank[r].landed_last;
    }
    cr_assert_eq(landed, 60, "one rank landed last per hand-off");
    env_fini(&e);
}

/* Rank 2 closes after asking for hand-off 5: only the hand-offs that needed
 * it fail, reported with their pages, and the pool is whole again. */
Test(pd, a_vanished_rank_fails_only_what_needed_it, .timeout = 60) {
    env_t e;
    env_init(&e, 3, 4, POOL);
    job_t jobs[3] = {{0}};
    jobs[2] = (job_t){.nh = 1, .vanish_at = 5};
    start(jobs, &e, 12);
    seen_t m;
    drain(&e, &m);
    join_all(jobs, 3);
    for (int h = 0; h < 5; h++) cr_assert_eq(m.complete[h], 1, "hand-off %d did not need the rank that vanished", h);
    cr_assert_eq(m.failed[5], 1, "hand-off 5 failed, with its page list");
    cr_assert_eq(m.fail_rank[5], 2);
    for (int h = 5; h < 12; h++) cr_assert_eq(m.complete[h], 0);
    cr_assert_eq(m.mismatched, 0);
    env_stats(&e);
    cr_assert_eq(e.st->vanished, 1);
    cr_assert_eq(e.st->first_vanished, 2);
    cr_assert_eq(e.st->handoffs, 5);
    cr_assert_geq(e.st->failed, 1);
    cr_assert_eq(e.st->free_pages, POOL, "the failed hand-offs' pages came back");
    cr_assert_eq(jobs[0].sent + jobs[0].refused + jobs[0].failed, 12);
    cr_assert_gt(jobs[0].refused, 0, "later hand-offs are refused: they could never complete");
    env_fini(&e);
}

/* Bad peers first in line: a silent connection, a hello without the token
 * (by hand, and through the API). They are dropped; the real ranks join. */
Test(pd, bad_peers_are_dropped_while_the_ranks_join, .timeout = 60) {
    env_t e;
    env_init(&e, 2, 4, POOL);
    char addr[32];
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", kvt_pd_receiver_control_port(e.rx));
    int silent = kvt__tcp_connect(addr), impostor = kvt__tcp_connect(addr);
    cr_assert(silent >= 0 && impostor >= 0);
    kvt__pd_hello_t fake = {0, 2, TOKEN ^ 1};
    cr_assert_eq(kvt__pd_send(impostor, KVT_PD_HELLO, &fake, NULL, 0, KVT__PD_UNBOUND), 0);
    kvt_tier_t *src = arena(4);
    int rc;
    cr_assert_null(connect_rank(&e, src, 1, TOKEN + 1, &rc));
    cr_assert_eq(rc, KVT_EIO, "a sender without the token is dropped: %s", kvt_err_name(rc));
    job_t jobs[2] = {{0}};
    start(jobs, &e, 10);
    seen_t m;
    drain(&e, &m);
    join_all(jobs, 2);
    for (int h = 0; h < 10; h++) cr_assert_eq(m.complete[h], 1);
    env_stats(&e);
    cr_assert_eq(e.st->control_bad_peers, 3, "silent, impostor, the API's impostor");
    cr_assert_neq(e.st->control_last_error[0], 0);
    close(silent);
    close(impostor);
    kvt_tier_destroy(src);
    env_fini(&e);
}

/* Rank 1 waits before every send: it is named the straggler. */
Test(pd, the_delayed_rank_is_the_straggler, .timeout = 60) {
    env_t e;
    env_init(&e, 3, 4, POOL);
    job_t jobs[3] = {{0}};
    jobs[1] = (job_t){.nh = 1, .vanish_at = UINT64_MAX, .delay_us = 30000};
    start(jobs, &e, 12);
    seen_t m;
    drain(&e, &m);
    join_all(jobs, 3);
    env_stats(&e);
    cr_assert_eq(e.st->handoffs, 12);
    cr_assert_eq(e.st->straggler, 1, "straggler %d", e.st->straggler);
    cr_assert_gt(e.st->straggler_factor, 3);
    cr_assert_gt(e.st->rank[1].straggler_flags, 0);
    cr_assert_eq(e.st->rank[0].straggler_flags + e.st->rank[2].straggler_flags, 0);
    cr_assert_gt(e.st->rank[1].median_ns, 25000000ull);
    env_fini(&e);
}

/* A hand-off larger than the pool is refused with KVT_ERANGE; the link
 * stays, and the next hand-off completes. One rank, on this thread. */
Test(pd, a_handoff_larger_than_the_pool_is_refused, .timeout = 30) {
    env_t e;
    kvt_tier_t *src;
    kvt_pd_sender_t *s = lone_rank(&e, &src);
    static uint32_t dst[65];
    cr_assert_eq(kvt_pd_sender_begin(s, 0, 65, dst), KVT_ERANGE);
    cr_assert(kvt_pd_sender_linked(s));
    cr_assert_eq(kvt_pd_sender_begin(s, 1, 0, dst), KVT_EINVAL);
    uint8_t scratch[LB];
    uint64_t n = 10;
    kvt_xfer_copy_t cp[10];
    for (uint64_t p = 0; p < n; p++) kvt_tier_pattern_fill(src, p, hash_lo(1, p), hash_hi(1), scratch);
    cr_assert_eq(kvt_pd_sender_begin(s, 1, n, dst), KVT_OK);
    for (uint64_t p = 0; p < n; p++) cp[p] = (kvt_xfer_copy_t){(uint32_t)p, dst[p]};
    cr_assert_eq(kvt_pd_sender_send(s, 1, cp, n), KVT_OK);
    kvt_pd_event_t ev;
    cr_assert_eq(kvt_pd_receiver_poll(e.rx, &ev, 1, 5000000000ull), 1);
    cr_assert_eq(ev.type, KVT_PD_EV_COMPLETE);
    cr_assert_eq(ev.handoff, 1);
    for (uint64_t p = 0; p < n; p++) cr_assert(kvt_tier_pattern_check(e.pool, ev.pages[p], hash_lo(1, p), hash_hi(1), scratch));
    /* a send for a hand-off not begun (or sent already), or to pages begin did not give it, is refused: it wrote
     * over hand-off 1's pages, which are the decode caller's now */
    kvt_xfer_copy_t stray = {0, ev.pages[0]};
    cr_assert_eq(kvt_pd_sender_send(s, 99, &stray, 1), KVT_EINVAL);
    cr_assert_eq(kvt_pd_sender_send(s, 1, &stray, 1), KVT_EINVAL, "sent already");
    static uint32_t dst2[10];
    cr_assert_eq(kvt_pd_sender_begin(s, 2, n, dst2), KVT_OK);
    cr_assert_eq(kvt_pd_sender_send(s, 2, &stray, 1), KVT_EINVAL, "a page of hand-off 1");
    for (uint64_t p = 0; p < n; p++) cr_assert(kvt_tier_pattern_check(e.pool, ev.pages[p], hash_lo(1, p), hash_hi(1), scratch));
    for (uint64_t p = 0; p < n; p++) kvt_tier_pattern_fill(src, p, hash_lo(2, p), hash_hi(2), scratch);
    for (uint64_t p = 0; p < n; p++) cp[p] = (kvt_xfer_copy_t){(uint32_t)p, dst2[p]};
    cr_assert_eq(kvt_pd_sender_send(s, 2, cp, n), KVT_OK, "the hand-off begun still goes");
    kvt_pd_event_t ev2;
    cr_assert_eq(kvt_pd_receiver_poll(e.rx, &ev2, 1, 5000000000ull), 1);
    cr_assert(ev2.type == KVT_PD_EV_COMPLETE && ev2.handoff == 2);
    for (uint64_t p = 0; p < n; p++) cr_assert(kvt_tier_pattern_check(e.pool, ev2.pages[p], hash_lo(2, p), hash_hi(2), scratch));
    cr_assert_eq(kvt_pd_receiver_release(e.rx, 2), KVT_OK);
    cr_assert_eq(kvt_pd_receiver_release(e.rx, 1), KVT_OK);
    env_stats(&e);
    cr_assert_eq(e.st->refused, 1, "too large (n == 0 never leaves the sender)");
    cr_assert_eq(e.st->free_pages, 64);
    kvt_pd_rank_stats_t rs;
    cr_assert_eq(kvt_pd_sender_stats(s, &rs), KVT_OK);
    cr_assert_eq(rs.failed, 1);
    cr_assert_eq(rs.handoffs, 2, "hand-offs 1 and 2; the refused sends counted nothing");
    cr_assert_eq(kvt_pd_sender_finish(s), KVT_OK);
    kvt_pd_sender_destroy(s);
    kvt_tier_destroy(src);
    env_fini(&e);
}

/* A release the pool cannot take back for memory (the freed run lies
 * between two reserved ones: a new free extent) says KVT_ENOMEM and
 * changes nothing: the hand-off is still the caller's, released again it
 * goes, and the pool is whole in the end. */
Test(pd, a_release_short_of_memory_changes_nothing, .timeout = 30) {
    env_t e;
    kvt_tier_t *src;
    kvt_pd_sender_t *s = lone_rank(&e, &src);
    uint8_t scratch[LB];
    for (uint64_t h = 1; h <= 3; h++) { /* three hand-offs of 8 pages, side by side in the pool */
        uint32_t dst[8];
        kvt_xfer_copy_t cp[8];
        cr_assert_eq(kvt_pd_sender_begin(s, h, 8, dst), KVT_OK);
        for (uint32_t p = 0; p < 8; p++) {
            kvt_tier_pattern_fill(src, p, hash_lo(h, p), hash_hi(h), scratch);
            cp[p] = (kvt_xfer_copy_t){p, dst[p]};
        }
        cr_assert_eq(kvt_pd_sender_send(s, h, cp, 8), KVT_OK);
        kvt_pd_event_t ev;
        cr_assert_eq(kvt_pd_receiver_poll(e.rx, &ev, 1, 5000000000ull), 1);
        cr_assert(ev.type == KVT_PD_EV_COMPLETE && ev.handoff == h);
    }
    int refused = 0;
    for (uint64_t nth = 1;; nth++) {
        kvt__mem_fail_nth(nth);
        int rc = kvt_pd_receiver_release(e.rx, 2);
        int fired = kvt__mem_fail_fired();
        kvt__mem_fail_nth(0);
        env_stats(&e);
        if (rc == KVT_OK) {
            cr_assert_eq(e.st->free_pages, 64 - 16, "hand-off 2's pages are free");
            break;
        }
        cr_assert_eq(rc, KVT_ENOMEM, "allocation %" PRIu64 ": %s", nth, kvt_err_name(rc));
        cr_assert(fired);
        cr_assert_eq(e.st->free_pages, 64 - 24, "a refused release freed nothing");
        refused++;
    }
    cr_assert_gt(refused, 0, "the release allocated");
    cr_assert_eq(kvt_pd_receiver_release(e.rx, 2), KVT_ENOENT, "released once");
    cr_assert_eq(kvt_pd_receiver_release(e.rx, 1), KVT_OK);
    cr_assert_eq(kvt_pd_receiver_release(e.rx, 3), KVT_OK);
    env_stats(&e);
    cr_assert_eq(e.st->free_pages, 64);
    cr_assert_eq(kvt_pd_sender_finish(s), KVT_OK);
    kvt_pd_sender_destroy(s);
    kvt_tier_destroy(src);
    env_fini(&e);
}

/* A hand-off begun at a decode that went away is not sent to its
 * replacement after reconnect: its pages were the old pool's (the send
 * wrote them into the new pool, at pages it never reserved, returned
 * KVT_OK, and its DONE dropped the rank as vanished). Refused, as is a send
 * on an unlinked sender, with nothing sent and nothing counted. */
Test(pd, a_handoff_begun_at_an_old_decode_is_not_sent_to_the_new_one, .timeout = 30) {
    env_t a, b;
    kvt_tier_t *src;
    kvt_pd_sender_t *s = lone_rank(&a, &src);
    uint32_t dst[4];
    cr_assert_eq(kvt_pd_sender_begin(s, 5, 4, dst), KVT_OK);
    memset(kvt_tier_addr(src, 0, 0), 0xab, 4 * LAYERS * LB);
    kvt_pd_receiver_destroy(a.rx);
    a.rx = NULL;
    b.pool = arena(64);
    memset(kvt_tier_addr(b.pool, 0, 0), 0, 64 * LAYERS * LB);
    kvt_pd_receiver_config_t rc2 = {.size = sizeof(rc2), .pool = b.pool, .ranks = 1, .token = TOKEN, .generation = 1};
    cr_assert_eq(kvt_pd_receiver_create(&b.rx, &rc2), KVT_OK);
    b.C = 1;
    b.st = calloc(1, sizeof(kvt_pd_stats_t));
    b.st->size = sizeof(kvt_pd_stats_t);
    kvt_pd_rank_stats_t before, after;
    cr_assert_eq(kvt_pd_sender_stats(s, &before), KVT_OK);
    cr_assert_eq(kvt_pd_sender_reconnect(s, kvt_pd_receiver_data_port(b.rx), kvt_pd_receiver_control_port(b.rx)), KVT_OK);
    kvt_xfer_copy_t cp[4];
    for (uint32_t i = 0; i < 4; i++) cp[i] = (kvt_xfer_copy_t){i, dst[i]};
    cr_assert_eq(kvt_pd_sender_send(s, 5, cp, 4), KVT_EINVAL, "a hand-off of the old decode sent to the new one");
    cr_assert_eq(kvt_pd_sender_stats(s, &after), KVT_OK);
    cr_assert_eq(after.failed, before.failed);
    cr_assert_eq(after.released_pages, before.released_pages);
    for (uint64_t p = 0; p < 64; p++)
        cr_assert_eq(((const uint8_t *)kvt_tier_addr(b.pool, p, 0))[0], 0, "page %llu of the new pool written",
                     (unsigned long long)p);
    env_stats(&b);
    cr_assert_eq(b.st->vanished, 0);
    cr_assert_eq(kvt_pd_sender_begin(s, 6, 4, dst), KVT_OK, "the new decode's hand-offs go on");
    for (uint32_t i = 0; i < 4; i++) cp[i] = (kvt_xfer_copy_t){i, dst[i]};
    cr_assert_eq(kvt_pd_sender_send(s, 6, cp, 4), KVT_OK);
    kvt_pd_receiver_destroy(b.rx); /* the sender is unlinked at its next call */
    b.rx = NULL;
    cr_assert_eq(kvt_pd_sender_begin(s, 7, 4, dst), KVT_EIO);
    cr_assert(!kvt_pd_sender_linked(s));
    cr_assert_eq(kvt_pd_sender_stats(s, &before), KVT_OK);
    cr_assert_eq(kvt_pd_sender_send(s, 9, cp, 4), KVT_EINVAL, "a hand-off never begun, unlinked");
    cr_assert_eq(kvt_pd_sender_stats(s, &after), KVT_OK);
    cr_assert(after.failed == before.failed && after.released_pages == before.released_pages, "a refused send counted");
    kvt_pd_sender_destroy(s);
    kvt_tier_destroy(src);
    kvt_tier_destroy(a.pool);
    free(a.st);
    kvt_tier_destroy(b.pool);
    free(b.st);
}

typedef struct pair_join {
    env_t *e;
    kvt_tier_t *src;
    kvt_pd_sender_t *s;
    int rc;
} pair_join_t;

static void *join_rank1(void *arg) {
    pair_join_t *j = arg;
    j->s = connect_rank(j->e, j->src, 1, TOKEN, &j->rc);
    return NULL;
}

/* Once a rank has said goodbye, no new hand-off is opened: it would never
 * complete (the rank that left sends no share of it), and its pages were
 * held for good, the receiver ending without reporting it. */
Test(pd, no_new_handoff_after_a_rank_said_goodbye, .timeout = 30) {
    env_t e;
    env_init(&e, 2, 4, 64);
    kvt_tier_t *src0 = arena(MAXN), *src1 = arena(MAXN);
    pair_join_t j1 = {&e, src1, NULL, 0};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, join_rank1, &j1), 0);
    int rc;
    kvt_pd_sender_t *s0 = connect_rank(&e, src0, 0, TOKEN, &rc);
    pthread_join(th, NULL);
    cr_assert(rc == KVT_OK && j1.rc == KVT_OK);
    cr_assert_eq(kvt_pd_sender_finish(s0), KVT_OK);
    uint32_t dst[8];
    cr_assert_eq(kvt_pd_sender_begin(j1.s, 5, 8, dst), KVT_EIO, "a hand-off opened after a rank's goodbye");
    cr_assert(kvt_pd_sender_linked(j1.s), "refused with the link intact");
    env_stats(&e);
    cr_assert_eq(e.st->free_pages, 64);
    cr_assert_eq(kvt_pd_sender_finish(j1.s), KVT_OK);
    seen_t m;
    drain(&e, &m);
    cr_assert_eq(m.events, 1, "the end alone");
    kvt_pd_sender_destroy(s0);
    kvt_pd_sender_destroy(j1.s);
    kvt_tier_destroy(src0);
    kvt_tier_destroy(src1);
    env_fini(&e);
}

/* A rank sends its own share of a hand-off only: a page of the list begin
 * gave that is another rank's (page j is rank j mod C's) is refused with
 * nothing sent, so the ranks never race on a page; each rank's share lands
 * whole. */
Test(pd, a_rank_sends_its_own_share_only, .timeout = 30) {
    env_t e;
    env_init(&e, 2, 4, 64);
    kvt_tier_t *src[2] = {arena(MAXN), arena(MAXN)};
    pair_join_t j1 = {&e, src[1], NULL, 0};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, join_rank1, &j1), 0);
    int rc;
    kvt_pd_sender_t *s[2] = {connect_rank(&e, src[0], 0, TOKEN, &rc), NULL};
    pthread_join(th, NULL);
    cr_assert(rc == KVT_OK && j1.rc == KVT_OK);
    s[1] = j1.s;
    uint8_t scratch[LB];
    for (uint32_t r = 0; r < 2; r++) {
        uint32_t dst[8];
        kvt_xfer_copy_t cp[4];
        cr_assert_eq(kvt_pd_sender_begin(s[r], 7, 8, dst), KVT_OK);
        kvt_xfer_copy_t other = {0, dst[1 - r]};
        cr_assert_eq(kvt_pd_sender_send(s[r], 7, &other, 1), KVT_EINVAL, "rank %u: page %u is rank %u's", r, 1 - r,
                     1 - r);
        for (uint32_t k = 0; k < 4; k++) {
            kvt_tier_pattern_fill(src[r], k, hash_lo(7, 2 * k + r), hash_hi(7), scratch);
            cp[k] = (kvt_xfer_copy_t){k, dst[2 * k + r]};
        }
        cr_assert_eq(kvt_pd_sender_send(s[r], 7, cp, 4), KVT_OK, "rank %u's share", r);
    }
    kvt_pd_event_t ev;
    cr_assert_eq(kvt_pd_receiver_poll(e.rx, &ev, 1, 5000000000ull), 1);
    cr_assert(ev.type == KVT_PD_EV_COMPLETE && ev.handoff == 7 && ev.npages == 8);
    for (uint64_t p = 0; p < 8; p++)
        cr_assert(kvt_tier_pattern_check(e.pool, ev.pages[p], hash_lo(7, p), hash_hi(7), scratch), "page %u", (unsigned)p);
    cr_assert_eq(kvt_pd_receiver_release(e.rx, 7), KVT_OK);
    for (uint32_t r = 0; r < 2; r++) {
        kvt_pd_rank_stats_t rs;
        cr_assert_eq(kvt_pd_sender_stats(s[r], &rs), KVT_OK);
        cr_assert(rs.handoffs == 1 && rs.failed == 0, "rank %u: the refused send counted nothing", r);
        cr_assert_eq(kvt_pd_sender_finish(s[r]), KVT_OK);
        kvt_pd_sender_destroy(s[r]);
        kvt_tier_destroy(src[r]);
    }
    env_fini(&e);
}

/* The join timed out (a rank never came): the ranks that joined are told
 * (their control connection is shut), not left blocked in begin until the
 * receiver is destroyed. */
Test(pd, ranks_that_joined_learn_that_the_join_failed, .timeout = 20) {
    kvt_tier_t *pool = arena(64), *src = arena(MAXN);
    env_t e = {.pool = pool, .C = 2};
    kvt_pd_receiver_config_t rc = {.size = sizeof(rc), .pool = pool, .ranks = 2, .token = TOKEN, .join_timeout_ms = 300};
    cr_assert_eq(kvt_pd_receiver_create(&e.rx, &rc), KVT_OK);
    int r;
    kvt_pd_sender_t *s = connect_rank(&e, src, 0, TOKEN, &r);
    cr_assert_eq(r, KVT_OK);
    kvt_pd_event_t ev;
    cr_assert_eq(kvt_pd_receiver_poll(e.rx, &ev, 1, 5000000000ull), 1);
    cr_assert(ev.type == KVT_PD_EV_END && ev.status == KVT_ETIMEDOUT);
    uint32_t dst[4];
    cr_assert_eq(kvt_pd_sender_begin(s, 0, 4, dst), KVT_EIO);
    cr_assert(!kvt_pd_sender_linked(s));
    kvt_pd_sender_destroy(s);
    kvt_pd_receiver_destroy(e.rx);
    kvt_tier_destroy(src);
    kvt_tier_destroy(pool);
}

/* A rank that left (goodbye or vanished) cannot come back on the data port:
 * its fence cut the connections it had, and a new one (its tcp tier opens
 * streams again at its next send) wrote into pages the caller held. */
Test(pd, a_rank_that_left_writes_no_more, .timeout = 30) {
    env_t e;
    kvt_tier_t *src;
    kvt_pd_sender_t *s = lone_rank(&e, &src);
    kvt__wire_hello_t h = {KVT_WIRE_MAGIC, KVT_WIRE_VERSION, KVT_LAYOUT_PAGE_FIRST, LAYERS, 0, 64, LB,
                           kvt__wire_writer_token(TOKEN, 0)};
    for (int gone = 0; gone < 2; gone++) {
        if (gone) {
            cr_assert_eq(kvt_pd_sender_finish(s), KVT_OK);
            seen_t m;
            drain(&e, &m); /* its goodbye was read: it has left */
        }
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(kvt_pd_receiver_data_port(e.rx))};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
        kvt__wire_reply_t r;
        cr_assert_eq(kvt__write_full(fd, &h, sizeof(h)), 0);
        cr_assert_eq(kvt__read_full(fd, &r, sizeof(r)), 0);
        if (gone) cr_assert_neq(r.status, 0, "the rank that left was taken back: %s", r.message);
        else cr_assert_eq(r.status, 0, "the rank's own connection: %s", r.message);
        close(fd);
    }
    kvt_pd_sender_destroy(s);
    kvt_tier_destroy(src);
    env_fini(&e);
}

/* The statistics through the emitter: the sections and fields of the lists. */
Test(pd, stats_through_the_emitter) {
    kvt_pd_stats_t *a = calloc(2, sizeof(*a));
    kvt_pd_stats_init(&a[0], 2);
    kvt_pd_stats_init(&a[1], 2);
    a[1].handoffs = 3;
    a[1].rank[1].straggler_flags = 2;
    a[1].rank[1].straggler_factor = 4.5;
    kvt_pd_stats_merge(&a[0], &a[1]);
    kvt_pd_stats_merge(&a[0], &a[1]);
    cr_assert_eq(a[0].handoffs, 6);
    cr_assert_eq(a[0].straggler, 1);
    kvt_emitter_t *em;
    cr_assert_eq(kvt_emitter_create(&em, KVT_FMT_PROM, "kvtier_pd"), KVT_OK);
    kvt_pd_stats_emit(&a[0], em);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_eq(kvt_emitter_write(em, f), KVT_OK);
    fclose(f);
    const char *want[] = {"kvtier_pd_decode_handoffs_total 6", "kvtier_pd_rank1_straggler_flags_total 4",
                          "kvtier_pd_rank0_batch_seconds_count 0", "kvtier_pd_decode_control_bad_peers_total 0"};
    for (int i = 0; i < 4; i++) cr_assert(strstr(buf, want[i]), "'%s' not in: %s", want[i], buf);
    free(buf);
    kvt_emitter_destroy(em);
    free(a);
}
