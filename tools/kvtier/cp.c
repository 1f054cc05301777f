/* kvtier cp — a context-parallel group of C rank processes sharing one
 * node's KV (docs/cp.md), over the library's CP group
 * (include/kvtier/cp.h), which does every cross-process step:
 *
 *   kvtier cp --ranks C ...                     forks C ranks of the group
 *                                               kvtier-cp-<pid> and watches them
 *   kvtier cp --ranks C --rank R --group NAME   one rank of group NAME, started
 *                                               by anyone (a shell loop, a launcher)
 *
 * Each rank replays the same requests through its own cache (C owner lanes
 * in the group's L1 segment, one L2 segment), writes the new pages it owns
 * (the content model: kvt_tier_pattern_fill of the page hash) and checks
 * those it loads back; rank 0 prints the group's result.
 */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "commands.h"
#include "cp_print.h"
#include "group.h"
#include "kvtier/cp.h"
#include "kvtier/error.h"
#include "kvtier/testing.h"
#include "kvtier/radix.h"
#include "replay.h"
#include "util.h"

#define MAX_RANKS 64

typedef struct rank {
    const opts_t *o;
    const kvt_trace_t *t;
    const char *name; /* the group */
    uint32_t r, C;
    bool forked;
    uint64_t n, digest_every, stopped_at; /* stopped_at: rank 0 stopped the group at this divergence */
    kvt_cp_group_t *g;
    kvt_tier_t *l1, *l2;
    kvt_xfer_t *x;
    kvt_cache_t *c;
    cp_result_t me;
    uint8_t *buf; int32_t *tok; uint32_t *ids; kvt_hash128_t *h; /* one layer of a page; a request's tokens, ids, hashes */
} rank_t;

static kvt_cp_group_t *volatile g_group; /* for the signal handler */
static volatile sig_atomic_t g_sig;

/* SIGTERM (the coordinator's, or its death's), SIGINT, SIGHUP: the group unwinds and cleans up. */
static void on_signal(int sig) {
    g_sig = sig;
    if (g_group) kvt_cp_group_interrupt(g_group, sig); /* while joining, config.cancel (g_sig) ends the join */
}

static uint64_t mix(uint64_t h, uint64_t v) { return (h ^ v) * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull; }

/* What else the ranks must agree on: the options that steer decisions, the requests. */
static uint64_t options_tag(const opts_t *o, const kvt_trace_t *t, uint64_t n) {
    uint64_t h = mix(mix(mix(mix(0, (uint64_t)o->policy), (uint64_t)o->write_policy), o->write_hits), o->seed);
    h = mix(mix(h, (uint64_t)(o->l1_room * 1e9)), (uint64_t)(o->l2_room * 1e9));
    for (uint64_t i = 0; i < n; i++)
        for (uint32_t b = 0; b < t->req[i].nblocks; b++) h = mix(h, t->req[i].hash_ids[b]);
    return h;
}

static int setup(rank_t *k, uint64_t timeout_ms) {
    const opts_t *o = k->o;
    uint64_t layer_bytes = o->bpt / o->layers * o->page_tokens; /* the data plane: rank 0 creates, the others attach */
    kvt_cp_group_config_t gc = {.size = sizeof(gc), .name = k->name, .rank = k->r, .ranks = k->C, .l1_pages = o->l1_pages,
                                .l2_pages = o->l2_pages, .page_tokens = (uint32_t)o->page_tokens, .layers = o->layers,
                                .layer_bytes = o->data ? layer_bytes : 0, .layout = (uint32_t)o->layout, .requests = k->n,
                                .tag = options_tag(o, k->t, k->n), .timeout_ms = (uint32_t)timeout_ms, .cancel = &g_sig};
    const char *why = NULL;
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL), sigaction(SIGINT, &sa, NULL), sigaction(SIGHUP, &sa, NULL);
    int rc = kvt_cp_group_join(&k->g, &gc, &why);
    if (rc != KVT_OK && !(g_sig && k->forked)) fprintf(stderr, "kvtier cp: %s\n", why ? why : kvt_strerror(rc));
    if (rc != KVT_OK) return rc;
    if ((g_group = k->g) != NULL && g_sig) kvt_cp_group_interrupt(k->g, g_sig);
    kvt_tier_config_t l1 = {.size = sizeof(l1), .geom = {o->l1_pages, o->layers, layer_bytes, (kvt_layout_t)o->layout}};
    kvt_tier_config_t l2 = {.size = sizeof(l2), .flags = KVT_TIER_CHECKSUM, .geom = {o->l2_pages, o->layers, layer_bytes, (kvt_layout_t)o->layout}};
    if (o->data && ((rc = kvt_cp_group_open_tier(k->g, "l1", &l1, &k->l1)) != KVT_OK ||
                    (rc = kvt_cp_group_open_tier(k->g, "l2", &l2, &k->l2)) != KVT_OK))
        return rc;
    if ((rc = kvt_cp_group_wait_joined(k->g)) != KVT_OK) return rc;
    kvt_cache_config_t cfg;
    replay_cache_config(o, o->l1_pages, &cfg);
    cfg.l1_lanes = k->C;
    cfg.decision_digest = true; /* the ranks compare it */
    if ((rc = kvt_cache_create(&k->c, &cfg)) != KVT_OK || !o->data) return rc;
    kvt_xfer_config_t xc;
    kvt_xfer_config_default(&xc);
    xc.threads = (uint32_t)o->threads;
    kvt_cp_group_xfer_config(k->g, &xc, 0); /* rank 0's workers publish the backups that land */
    if ((rc = kvt_xfer_create(&k->x, &xc, (kvt_tier_t *[]){k->l1, k->l2}, 2)) != KVT_OK) return rc;
    return kvt_cp_group_attach(k->g, k->c, k->x, k->l1, 0, k->l2, 1);
}

/* The request's pages this rank owns: check what it loaded, write what is new (the forward pass). */
static void own_pages(rank_t *k, uint64_t i, const kvt_cache_req_t *req) {
    uint64_t old = req->pages - req->new_pages;
    kvt_cp_layout_t lay = {k->C, k->o->l1_pages / k->C, k->o->page_tokens};
    if (k->o->data) kvt_page_hash_chain(0, k->tok, req->pages, (uint32_t)k->o->page_tokens, k->h);
    for (uint64_t j = 0; j < req->pages; j++) {
        if (kvt_lane_of(k->ids[j], k->C) != k->r) continue;
        uint64_t page = kvt_cp_read_page(&lay, k->ids[j]);
        if (j < req->l1_hit_pages) {
            k->me.l1_hit_pages++;
        } else if (j < old) { /* loaded from L2 into our lane */
            k->me.loads++;
            if (!k->o->data) continue;
            k->me.load_bytes += kvt_geom_page_bytes(kvt_tier_geom(k->l1));
            k->me.verified += k->o->verify;
            if (k->o->verify && !kvt_tier_pattern_check(k->l1, page, k->h[j].lo, k->h[j].hi, k->buf) && k->me.mismatches++ < 3)
                fprintf(stderr, "kvtier cp: rank %u: request %" PRIu64 " page %" PRIu64 " (L1 %u) differs after its load\n",
                        k->r, i + 1, j, k->ids[j]);
        } else if (k->o->data) {
            kvt_tier_pattern_fill(k->l1, page, k->h[j].lo, k->h[j].hi, k->buf);
        }
    }
}

/* Test hooks, read by kvtier-test only (KVT_TESTING): KVT_CP_KILL="R:N" kills rank R at
 * request N; KVT_CP_DIVERGE="R:N" makes rank R admit one extra request before request N (its
 * decisions, and digest, part from the others'). */
static void test_hooks(rank_t *k, uint64_t i) {
#ifndef KVT_TESTING
    (void)k, (void)i;
#else
    static int read; /* the environment is read once, not per request */
    static uint64_t kill_r = UINT64_MAX, kill_at, div_r = UINT64_MAX, div_at;
    if (!read) {
        read = 1;
        if (!cli_env_pair("KVT_CP_KILL", &kill_r, &kill_at)) kill_r = UINT64_MAX;
        if (!cli_env_pair("KVT_CP_DIVERGE", &div_r, &div_at)) div_r = UINT64_MAX;
    }
    if (kill_r == k->r && i + 1 == kill_at) raise(SIGKILL);
    if (div_r == k->r && i + 1 == div_at) {
        int32_t odd[64];
        for (int j = 0; j < 64; j++) odd[j] = -1 - j;
        kvt_cache_req_t extra;
        if (kvt_cache_admit(k->c, 0, odd, 64, 0, NULL, &extra) == KVT_OK) kvt_cache_release(k->c, &extra);
    }
#endif
}

static int request(rank_t *k, uint64_t i) {
    const kvt_trace_req_t *q = &k->t->req[i];
    for (uint32_t b = 0; b < q->nblocks; b++) kvt_trace_block_tokens(q->hash_ids[b], k->tok + (size_t)b * KVT_TRACE_BLOCK_TOKENS);
    kvt_cache_req_t req;
    int rc = kvt_cache_admit(k->c, 0, k->tok, q->input_length, 0, k->ids, &req);
    if (rc != KVT_OK) return rc;
    if ((rc = kvt_cp_group_admitted(k->g, &req, k->ids)) == KVT_OK) own_pages(k, i, &req);
    if (rc == KVT_OK) rc = kvt_cp_group_filled(k->g, i);
    if (rc == KVT_OK) rc = kvt_cache_commit(k->c, &req);
    kvt_cache_release(k->c, &req);
    uint64_t d = mix(mix(mix(kvt_cache_digest(k->c), i), req.pages), req.l1_hit_pages << 32 | req.l2_hit_pages);
    return rc == KVT_OK ? kvt_cp_group_step(k->g, i, d) : rc;
}

static int replay_requests(rank_t *k, uint64_t *divergence) {
    size_t max_tokens = (size_t)k->t->max_blocks * KVT_TRACE_BLOCK_TOKENS, pages = max_tokens / k->o->page_tokens + 1;
    k->tok = malloc(max_tokens * sizeof(int32_t)), k->ids = malloc(pages * sizeof(uint32_t));
    k->h = malloc(pages * sizeof(kvt_hash128_t)), k->buf = malloc(k->o->bpt / k->o->layers * k->o->page_tokens + 1);
    if (!k->tok || !k->ids || !k->h || !k->buf) return KVT_ENOMEM;
    int rc = KVT_OK;
    for (uint64_t i = 0; i < k->n && rc == KVT_OK && !k->stopped_at; i++) {
        test_hooks(k, i);
        rc = request(k, i);
        const char *why;
        if (rc == KVT_OK && k->o->check_every && (i + 1) % k->o->check_every == 0 && kvt_cache_check(k->c, &why) != KVT_OK)
            return fprintf(stderr, "kvtier cp: rank %u: check failed after request %" PRIu64 ": %s\n", k->r, i + 1, why), KVT_ECORRUPT;
        if (rc == KVT_OK && k->r == 0 && k->digest_every && (i + 1) % k->digest_every == 0)
            rc = kvt_cp_group_check_digests(k->g, i + 1, &k->stopped_at);
    }
    if (rc == KVT_OK && !k->stopped_at) rc = kvt_cache_sync(k->c);
    return rc == KVT_OK && !k->stopped_at ? kvt_cp_group_check_digests(k->g, k->n, divergence) : rc;
}

/* Publishes this rank's result; rank 0 gathers everyone's. */
static int finish(rank_t *k, cp_result_t *all) {
    cp_result_fill(&k->me, k->c, k->g, k->r, k->o->data ? kvt_geom_page_bytes(kvt_tier_geom(k->l2)) : 0);
    int rc = kvt_cp_group_finish(k->g, &k->me, sizeof(k->me));
    for (uint32_t r = 0; r < k->C && rc == KVT_OK; r++) all[r] = k->me;
    for (uint32_t r = 0; r < k->C && rc == KVT_OK && k->r == 0; r++) rc = kvt_cp_group_result(k->g, r, &all[r], sizeof(all[r]));
    return rc;
}

static int run_rank(rank_t *k, uint64_t timeout_ms) {
    uint64_t t0 = now_ns(), divergence = 0;
    cp_result_t all[MAX_RANKS];
    int rc = setup(k, timeout_ms), code = 0;
    if (rc == KVT_OK) rc = replay_requests(k, &divergence);
    if (rc == KVT_OK && k->stopped_at) { /* rank 0 stopped the group at a digest check */
        fprintf(stderr, "kvtier cp: the group stopped: the ranks disagree from request %" PRIu64 "\n", k->stopped_at);
        char text[96];
        snprintf(text, sizeof(text), "rank 0: the ranks' digests differ from request %" PRIu64, k->stopped_at);
        kvt_cp_group_fail(k->g, text);
        code = k->forked ? CP_QUIET : 1;
    } else if (rc == KVT_OK && (rc = finish(k, all)) == KVT_OK) {
        int printed = k->r == 0 || !k->forked ? cp_print(k->o, k->r, k->C, k->n, (double)(now_ns() - t0) / 1e9, divergence, all) : 0;
        uint64_t mism = 0;
        for (uint32_t r = 0; r < (k->r == 0 ? k->C : 1); r++) mism += all[r].mismatches;
        if (divergence || mism) code = !k->forked ? 1 : k->r == 0 ? CP_QUIET : 0; /* forked: rank 0 reports it */
        if (printed != 0) code = 1; /* (cp_print said why; forked, the parent names the rank) */
    }
    if (rc != KVT_OK) code = k->g ? cp_print_failure(k->g, k->r, rc, k->forked, g_sig != 0) : 1; /* (a join says why) */
    const char *bad;
    if (rc != KVT_OK && rc != KVT_ECORRUPT && k->c && kvt_cache_check(k->c, &bad) != KVT_OK) /* a stop breaks nothing */
        code = (fprintf(stderr, "kvtier cp: rank %u: check failed after the group stopped: %s\n", k->r, bad), 1);
    kvt_cache_destroy(k->c), kvt_xfer_destroy(k->x), kvt_tier_destroy(k->l1), kvt_tier_destroy(k->l2);
    const char *why;
    g_group = NULL;
    if (kvt_cp_group_leave(k->g, &why) != KVT_OK && code == 0) code = (fprintf(stderr, "kvtier cp: %s\n", why), 1);
    free(k->tok), free(k->ids), free(k->h), free(k->buf);
    return code;
}

/* The convenient form: C forked ranks of group kvtier-cp-<pid>, watched. */
static int fork_group(rank_t *k, uint64_t timeout_ms) {
    char name[64];
    snprintf(name, sizeof(name), "kvtier-cp-%d", (int)getpid());
    k->name = name;
    fflush(stdout), fflush(stderr);
    group_catch_signals();
    child_t ch[MAX_RANKS] = {{0}};
    uint32_t started = 0;
    for (; started < k->C; started++) {
        pid_t pid = fork();
        if (pid == 0) {
            group_child_signals();
            k->r = started;
            _exit(run_rank(k, timeout_ms));
        }
        if (pid < 0) break;
        ch[started].pid = pid;
    }
    _Atomic int stop = started < k->C;
    int why = 0, dead = started ? group_watch(ch, started, &stop, &why, 2000000000ull, NULL, NULL) : -1;
    kvt_cp_group_remove_stale(name, (const char *const[]){"l1", "l2", NULL}); /* after a crash of rank 0 */
    return started < k->C ? (fprintf(stderr, "kvtier cp: could not start every rank\n"), 1) : cp_print_outcome(ch, started, dead, why);
}

static const char USAGE[] =
    "usage: kvtier cp --ranks C [--rank R --group NAME] [TRACE.jsonl] [replay options]\n\n"
    "A context-parallel group of C ranks on this machine: every rank replays the same\n"
    "requests through its own cache, L1 split into C owner lanes (--l1-pages is the\n"
    "group's total), one shared L2 segment; rank 0 backs up every page, each rank\n"
    "loads only its own; the ranks' decision digests are compared. Without --rank it\n"
    "forks the C ranks; with --rank R --group NAME it is rank R of group NAME, whose\n"
    "other ranks are started separately with the same options.\n";

int cmd_cp(int argc, char **argv) {
    opts_t o;
    replay_opts_default(&o);
    o.threads = 1;
    const opts_t defaults = o;
    uint64_t ranks = 4, digest_every = 0, rank = UINT64_MAX, timeout_ms = 20000;
    const char *gname = NULL;
    cli_opt_t table[40];
    size_t n = 0, nrows = replay_option_rows(&o, table);
    for (size_t i = 0; i < nrows; i++) /* replay's, less what a group does not do */
        if (strcmp(table[i].name, "sweep") && strcmp(table[i].name, "plot") && strcmp(table[i].name, "stats") &&
            strcmp(table[i].name, "soak") && strcmp(table[i].name, "copy-faults"))
            table[n++] = table[i];
    for (size_t i = 0; i < n; i++) /* a group's L1 has a bound */
        if (strcmp(table[i].name, "l1-pages") == 0) table[i].word = NULL;
    table[n++] = (cli_opt_t){"ranks", OPT_U64, &ranks, 1, MAX_RANKS, 0, 0, NULL, NULL, 0, "rank processes in the group (CP size)"};
    table[n++] = (cli_opt_t){"rank", OPT_U64, &rank, 0, MAX_RANKS - 1, 0, 0, NULL, "all", UINT64_MAX, "run only this rank of --group (started separately); all: start every rank here"};
    table[n++] = (cli_opt_t){"group", OPT_TEXT, &gname, 0, 0, 0, 0, NULL, NULL, 0, "the group's name, [A-Za-z0-9._-] (with --rank)"};
    table[n++] = (cli_opt_t){"join-timeout-ms", OPT_U64, &timeout_ms, 1, 3600000, 0, 0, NULL, NULL, 0, "ranks wait this long for each other to join"};
    table[n++] = (cli_opt_t){"digest-every", OPT_U64, &digest_every, 0, UINT64_MAX, 0, 0, NULL, NULL, 0, "debug: rank 0 compares the digests every N requests"};
    table[n] = (cli_opt_t){NULL, 0, NULL, 0, 0, 0, 0, NULL, NULL, 0, NULL};
    cli_t c;
    cli_init(&c, "kvtier cp", argc, argv);
    const char *path;
    int prc = cli_parse_table(&c, table, USAGE, &path);
    if (prc) return prc > 0 ? 0 : 2;
    if (replay_opts_finish(&c, &o, &defaults) != 0 || replay_workload_ok(&c, &o, &defaults, path) != 0) return 2;
    kvt_layer_group_t groups[KVT_MODEL_MAX_GROUPS];
    uint32_t ngroups = 0;
    kvt_model_groups(kvt_model_at((unsigned)o.model), groups, KVT_MODEL_MAX_GROUPS, &ngroups);
    for (uint32_t g = 0; g < ngroups && !o.bytes_per_token; g++)
        if (groups[g].kind != KVT_GROUP_FULL) {
            c.flag = "--model";
            return cli_error(&c, "%s has window or state layers: a group replays full attention only (kvtier replay "
                             "runs the hybrid cache)", kvt_model_at((unsigned)o.model)->name), 2;
        }
    c.flag = "--l1-pages";
    if (o.l1_pages % ranks != 0) return cli_error(&c, "%" PRIu64 " pages do not split into %" PRIu64 " lanes", o.l1_pages, ranks), 2;
    c.flag = rank == UINT64_MAX ? "--group" : "--rank";
    if ((rank == UINT64_MAX) != (gname == NULL)) return cli_error(&c, "--rank and --group go together"), 2;
    if (rank != UINT64_MAX && rank >= ranks) return cli_error(&c, "%" PRIu64 " is not below --ranks %" PRIu64, rank, ranks), 2;
    char seg[96]; /* a valid name makes valid segment names */
    c.flag = "--group";
    if (gname && kvt_cp_group_segment(gname, "ctl", seg, sizeof(seg)) != KVT_OK)
        return cli_error(&c, "'%s' is not a group name: 1 to %d of [A-Za-z0-9._-]", gname, KVT_CP_NAME_MAX), 2;
    if (o.data && replay_check_data_size(&c, &o, &o.l1_pages, 1) != 0) return 2;
    if (cli_parse_only) return 0;
    kvt_trace_t t;
    double parse_s;
    if (replay_load("kvtier cp", path, &o, &t, &parse_s) != 0) return 1;
    rank_t k = {.o = &o, .t = &t, .C = (uint32_t)ranks, .n = o.limit && o.limit < t.n ? o.limit : t.n, .digest_every = digest_every};
    k.name = gname, k.r = gname ? (uint32_t)rank : 0, k.forked = gname == NULL;
    int code = gname ? run_rank(&k, timeout_ms) : fork_group(&k, timeout_ms);
    kvt_trace_free(&t);
    return code;
}
