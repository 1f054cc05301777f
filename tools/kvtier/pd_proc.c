/* kvtier pd: the decode process and a prefill rank process, as clients of
 * include/kvtier/pd.h (docs/pd.md).
 *
 * Decode: a pool tier served by a kvt_pd_receiver; every completed hand-off
 * is checked page by page against the content its page hashes give, counted
 * and released; a failed one is named and released. Its statistics are
 * copied to the control block after every event (so a decode that dies
 * leaves its figures behind). A rank: its lane tier and a kvt_pd_sender; per
 * request it fills the pages it owns, asks for their destinations and sends
 * them; when decode goes away it releases them and waits for a new decode.
 *
 * Test hooks, read by kvtier-test only (KVT_TESTING): KVT_PD_KILL=R:N (rank
 * R dies in hand-off N, after decode answered it), KVT_PD_DECODE_KILL=N (the
 * first decode dies once N hand-offs completed), KVT_PD_TEST_PEERS (bad
 * peers: the testing library's kvt_pd_receiver_test_peers). */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvtier/error.h"
#include "kvtier/testing.h"
#include "kvtier/radix.h"
#include "kvtier/tier.h"
#include "cli.h"
#include "pd_cmd.h"
#include "util.h"

uint64_t pd_handoff_pages(const kvt_trace_t *t, uint64_t i, const pd_opts_t *o) {
    uint64_t n = t->req[i].input_length / o->page_tokens;
    return n < o->max_pages ? n : o->max_pages;
}

static void page_hashes(const kvt_trace_t *t, uint64_t i, const pd_opts_t *o, int32_t *tok, kvt_hash128_t *h, uint64_t n) {
    const kvt_trace_req_t *q = &t->req[i];
    for (uint32_t b = 0; b < q->nblocks; b++) kvt_trace_block_tokens(q->hash_ids[b], tok + (size_t)b * KVT_TRACE_BLOCK_TOKENS);
    kvt_page_hash_chain(0, tok, n, (uint32_t)o->page_tokens, h);
}

static kvt_tier_t *arena(const char *name, uint64_t pages, const pd_opts_t *o) {
    kvt_tier_t *t = NULL;
    kvt_tier_config_t tc = {.size = sizeof(tc), .kind = KVT_TIER_ARENA, .name = name,
                            .geom = {pages, 1, o->bytes_per_token * o->page_tokens, KVT_LAYOUT_PAGE_FIRST}};
    return kvt_tier_create(&t, &tc) == KVT_OK ? t : NULL;
}

/* ---- decode ------------------------------------------------------------------------ */

typedef struct decode {
    const pd_opts_t *o;
    const kvt_trace_t *t;
    ctl_t *ctl;
    kvt_tier_t *pool;
    kvt_pd_receiver_t *rx;
    int32_t *tok;
    kvt_hash128_t *h;
    uint8_t *buf;
    uint64_t mine; /* hand-offs this decode checked */
} decode_t;

static const char *const WHY[] = {"", "vanished", "could not send its pages", "sent nothing for --timeout-ms (the first such rank)",
                                   "said goodbye before its DONE"};

/* One event; false at the end. */
static bool on_event(decode_t *d, const kvt_pd_event_t *ev) {
    if (ev->type == KVT_PD_EV_END) return false;
    if (ev->type == KVT_PD_EV_FAILED)
        fprintf(stderr, "kvtier pd: decode: hand-off %" PRIu64 " failed: rank %d %s; its %" PRIu64 " pages are discarded\n",
                ev->handoff + 1, ev->rank, WHY[ev->reason], ev->npages);
    if (ev->type == KVT_PD_EV_COMPLETE) { /* the page check: every page, byte for byte */
        page_hashes(d->t, ev->handoff, d->o, d->tok, d->h, ev->npages);
        for (uint64_t j = 0; j < ev->npages; j++)
            d->ctl->mismatches += !kvt_tier_pattern_check(d->pool, ev->pages[j], d->h[j].lo, d->h[j].hi, d->buf);
        d->ctl->checked++;
        d->mine++;
    }
#ifdef KVT_TESTING
    static int read; /* KVT_PD_DECODE_KILL=N, the first decode dies after N hand-offs; read once */
    static uint64_t kill_after = UINT64_MAX;
    const char *kill = read ? NULL : getenv("KVT_PD_DECODE_KILL");
    if (kill && cli_parse_u64(kill, &kill_after) != 0) kill_after = UINT64_MAX;
    read = 1;
    if (atomic_load(&d->ctl->gen) == 0 && d->mine == kill_after) {
        kvt_pd_receiver_stats(d->rx, &d->ctl->cur); /* what the coordinator reads of a decode about to die */
        raise(SIGKILL);
    }
#endif
    kvt_pd_receiver_release(d->rx, ev->handoff); /* served and let go */
    return true;
}

static int serve(decode_t *d) {
#ifdef KVT_TESTING
    const char *spec = getenv("KVT_PD_TEST_PEERS");
    uint64_t hold_ms = 0;
    if (spec) kvt_pd_receiver_test_peers(d->rx, spec, &hold_ms); /* bad peers, queued before any rank */
    if (hold_ms) usleep((useconds_t)(hold_ms * 1000)); /* silent peers time out while the group forms */
#endif
    atomic_store(&d->ctl->data_port, kvt_pd_receiver_data_port(d->rx));
    atomic_store(&d->ctl->ctl_port, kvt_pd_receiver_control_port(d->rx));
    kvt_pd_event_t ev[16];
    int status = KVT_OK;
    for (bool on = true; on && !atomic_load(&d->ctl->stop);) {
        int n = kvt_pd_receiver_poll(d->rx, ev, 16, 100000000ull);
        for (int i = 0; i < n; i++)
            if (!on_event(d, &ev[i])) on = false, status = ev[i].status;
        kvt_pd_receiver_stats(d->rx, &d->ctl->cur); /* once a round, not once an event */
    }
    if (status != KVT_OK)
        snprintf(d->ctl->decode_err, sizeof(d->ctl->decode_err), "decode: %" PRIu64 " of %" PRIu64 " ranks connected in 20 s",
                 d->ctl->cur.joined, d->o->ranks);
    return status == KVT_OK ? 0 : 1;
}

int pd_decode(const pd_opts_t *o, const kvt_trace_t *t, ctl_t *ctl) {
    static decode_t d;
    d = (decode_t){.o = o, .t = t, .ctl = ctl};
    d.pool = arena("decode", o->decode_pages, o);
    d.tok = malloc((size_t)t->max_blocks * KVT_TRACE_BLOCK_TOKENS * sizeof(int32_t));
    d.h = malloc((o->max_pages + 1) * sizeof(kvt_hash128_t));
    d.buf = malloc(o->bytes_per_token * o->page_tokens);
    kvt_pd_receiver_config_t rc = {.size = sizeof(rc), .pool = d.pool, .transport = (kvt_net_transport_t)o->transport,
                                   .ranks = (uint32_t)o->ranks, .token = ctl->token, .generation = atomic_load(&ctl->gen),
                                   .resume_from = ctl->resume_from, .timeout_ms = o->timeout_ms,
                                   .window = (uint32_t)o->window, .straggler_factor = o->straggler_factor};
    if (!d.pool || !d.tok || !d.h || !d.buf || kvt_pd_receiver_create(&d.rx, &rc) != KVT_OK) {
        snprintf(ctl->decode_err, sizeof(ctl->decode_err), "decode: set-up failed");
        return 1;
    }
    int code = serve(&d);
    kvt_pd_receiver_stats(d.rx, &ctl->cur); /* the data port's silent peers as they are at the end */
    kvt_pd_receiver_destroy(d.rx);
    kvt_tier_destroy(d.pool);
    return code;
}

/* ---- a prefill rank ------------------------------------------------------------------- */

/* The ports of the decode of generation >= after; -1 when the group stops,
 * no decode will come, or 20 s pass. */
static int await_decode(ctl_t *ctl, uint32_t after, uint16_t *dport, uint16_t *cport) {
    for (uint64_t t0 = now_ns(); atomic_load(&ctl->ctl_port) == 0 || atomic_load(&ctl->gen) < after; usleep(1000))
        if (atomic_load(&ctl->stop) || atomic_load(&ctl->decode_lost) || now_ns() - t0 > 20000000000ull) return -1;
    *dport = (uint16_t)atomic_load(&ctl->data_port);
    *cport = (uint16_t)atomic_load(&ctl->ctl_port);
    return 0;
}

static kvt_pd_sender_t *join_decode(uint32_t r, const pd_opts_t *o, ctl_t *ctl, kvt_tier_t *lane) {
    kvt_pd_sender_config_t sc = {.size = sizeof(sc), .src = lane, .transport = (kvt_net_transport_t)o->transport, .rank = r,
                                 .ranks = (uint32_t)o->ranks, .token = ctl->token, .streams = (uint32_t)o->streams};
    kvt_pd_sender_t *s = NULL;
    if (await_decode(ctl, 0, &sc.data_port, &sc.control_port) != 0 || kvt_pd_sender_create(&s, &sc) != KVT_OK) return NULL;
    return s;
}

/* Hand-off i, this rank's part: KVT_OK, 1 (refused: decode is there but will
 * not complete it) or the failure that lost it with decode. */
static int hand_off(kvt_pd_sender_t *s, uint32_t r, uint64_t i, uint64_t n, const pd_opts_t *o, uint32_t *dst, kvt_xfer_copy_t *cp) {
    int rc = kvt_pd_sender_begin(s, i, n, dst);
    if (rc != KVT_OK) return kvt_pd_sender_linked(s) ? 1 : rc;
    uint64_t np = 0;
    for (uint64_t j = r; j < n; j += o->ranks, np++) cp[np] = (kvt_xfer_copy_t){(uint32_t)np, dst[j]};
    if (r == o->delay_rank && o->delay_ms) usleep((useconds_t)(o->delay_ms * 1000));
#ifdef KVT_TESTING
    static int read; /* KVT_PD_KILL="R:N" kills rank R in hand-off N; read once */
    static uint64_t kill_rank = UINT64_MAX, kill_at;
    if (!read && !cli_env_pair("KVT_PD_KILL", &kill_rank, &kill_at)) kill_rank = UINT64_MAX;
    read = 1;
    if (r == kill_rank && i + 1 == kill_at) raise(SIGKILL);
#endif
    return kvt_pd_sender_send(s, i, cp, np);
}

static int rank_loop(kvt_pd_sender_t *s, uint32_t r, const pd_opts_t *o, const kvt_trace_t *t, ctl_t *ctl, uint64_t nreq, kvt_tier_t *lane) {
    uint64_t pb = o->bytes_per_token * o->page_tokens;
    int32_t *tok = malloc((size_t)t->max_blocks * KVT_TRACE_BLOCK_TOKENS * sizeof(int32_t));
    kvt_hash128_t *h = malloc((o->max_pages + 1) * sizeof(kvt_hash128_t));
    uint32_t *dst = malloc((o->max_pages + 1) * sizeof(uint32_t));
    kvt_xfer_copy_t *cp = malloc((o->max_pages / o->ranks + 2) * sizeof(kvt_xfer_copy_t));
    int code = tok && h && dst && cp ? 0 : 1;
    for (uint64_t i = 0; i < nreq && code == 0; i++) {
        if (atomic_load(&ctl->stop)) return 1;
        atomic_store(&ctl->rank[r].pos, i);
        uint64_t n = pd_handoff_pages(t, i, o), np = 0;
        if (n < o->ranks) continue; /* too short to spread: not handed off */
        page_hashes(t, i, o, tok, h, n);
        for (uint64_t j = r; j < n; j += o->ranks, np++) /* the forward pass: our pages into our lane */
            kvt_pattern_fill(kvt_tier_addr(lane, np, 0), pb, h[j].lo, h[j].hi, 0);
        int rc = hand_off(s, r, i, n, o, dst, cp);
        if (rc == KVT_OK || rc == 1) continue;
        /* decode is gone: the hand-off failed and our pinned pages are released */
        fprintf(stderr, "kvtier pd: rank %u: hand-off %" PRIu64 " lost with decode; %" PRIu64 " pinned pages released\n", r, i + 1, np);
        uint16_t dport, cport;
        if (await_decode(ctl, kvt_pd_sender_generation(s) + 1, &dport, &cport) != 0 || kvt_pd_sender_reconnect(s, dport, cport) != KVT_OK) {
            snprintf(ctl->rank[r].err, sizeof(ctl->rank[r].err), "rank %u: decode went away at hand-off %" PRIu64 "%s; its pages released",
                     r, i + 1, atomic_load(&ctl->decode_lost) ? " and is not restarted" : " and no new one came in 20 s");
            code = 1;
        }
    }
    free(tok), free(h), free(dst), free(cp);
    return code;
}

int pd_rank(uint32_t r, const pd_opts_t *o, const kvt_trace_t *t, ctl_t *ctl, uint64_t nreq) {
    kvt_tier_t *lane = arena("lane", o->max_pages / o->ranks + 1, o);
    kvt_pd_sender_t *s = lane ? join_decode(r, o, ctl, lane) : NULL;
    if (s == NULL) {
        snprintf(ctl->rank[r].err, sizeof(ctl->rank[r].err), "rank %u: set-up failed", r);
        return 1;
    }
    int code = rank_loop(s, r, o, t, ctl, nreq, lane);
    if (code == 0) kvt_pd_sender_finish(s);
    kvt_pd_sender_stats(s, &ctl->rank[r].st);
    kvt_pd_sender_destroy(s);
    kvt_tier_destroy(lane);
    return code;
}
