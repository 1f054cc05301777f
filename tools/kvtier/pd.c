/* kvtier pd — prefill/decode hand-off: a CP prefill group of C rank
 * processes sends each request's KV to a decode process over the network
 * (docs/pd.md), through the library's PD hand-off (include/kvtier/pd.h).
 *
 *   coordinator (this file) ----------------------------------------------+
 *     | control block (shared anonymous mapping): ports, results, stop    |
 *     +-- fork --> decode (pd_proc.c): pool tier + kvt_pd_receiver        |
 *     |              (page server and control listener on 127.0.0.1)      |
 *     +-- fork --> prefill rank r < C (pd_proc.c): lane tier + a          |
 *                    kvt_pd_sender                                        |
 *
 * The coordinator parses the options, starts and watches the processes,
 * restarts a decode that dies (--decode-restarts: the ranks reconnect to the
 * new generation and go on from resume_from), and prints the summary
 * (pd_print.c) from every generation's and every rank's statistics merged.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "commands.h"
#include "group.h"
#include "kvtier/alloc.h"
#include "kvtier/error.h"
#include "kvtier/net.h"
#include "pd_cmd.h"
#include "replay.h"
#include "util.h"

#define MAX_DELAY_MS 600000u /* --delay-rank: 10 minutes at most per hand-off */

const char *const PD_TRANSPORTS[] = {"tcp", "ucx", NULL};
static const char *const STATS_FORMATS[] = {"none", "table", "json", "prom", NULL}; /* index - 1 = kvt_fmt_t */

static const char USAGE[] =
    "usage: kvtier pd --ranks C [--transport tcp] [TRACE.jsonl] [options]\n"
    "\n"
    "Prefill/decode hand-off: a CP group of C prefill processes sends each request's\n"
    "pages (each rank the pages it owns) to a decode process over the network; decode\n"
    "checks every page and names the rank that lands last and the straggler.\n";

static int parse(int argc, char **argv, pd_opts_t *out, const char **path) {
    enum { SEED = 42 }; /* the synthetic workload's, when no TRACE is given */
    pd_opts_t o = {.ranks = 4, .requests = 200, .seed = SEED, .page_tokens = 64, .bytes_per_token = 256, .decode_pages = 4096,
                   .streams = 4, .max_pages = 256, .window = 16, .timeout_ms = 10000, .straggler_factor = 3.0,
                   .delay_rank = UINT32_MAX};
    const cli_opt_t table[] = {
        {"ranks", OPT_U64, &o.ranks, 1, MAX_RANKS, 0, 0, NULL, NULL, 0, "prefill rank processes (CP size)"},
        {"transport", OPT_CHOICE, &o.transport, 0, 0, 0, 0, PD_TRANSPORTS, NULL, 0, "how pages travel to decode"},
        {"requests", OPT_U64, &o.requests, 1, 10000000, 0, 0, NULL, NULL, 0, "hand-offs: the first N requests"},
        {"seed", OPT_U64, &o.seed, 0, UINT64_MAX, 0, 0, NULL, NULL, 0, "synthetic workload: seed"},
        {"page-tokens", OPT_U64, &o.page_tokens, 1, 512, 0, 0, NULL, NULL, 0, "tokens per page"},
        {"bytes-per-token", OPT_U64, &o.bytes_per_token, 1, 1u << 20, 0, 0, NULL, NULL, 0, "bytes of KV per token"},
        {"max-pages", OPT_U64, &o.max_pages, 1, 1u << 20, 0, 0, NULL, NULL, 0, "pages handed off per request at most"},
        {"decode-pages", OPT_U64, &o.decode_pages, 1, KVT_ALLOC_MAX_PAGES, 0, 0, NULL, NULL, 0, "decode's receive pool, pages"},
        {"streams", OPT_U64, &o.streams, 1, 64, 0, 0, NULL, NULL, 0, "connections per prefill rank"},
        {"window", OPT_U64, &o.window, 2, 1024, 0, 0, NULL, NULL, 0, "hand-offs over which the straggler is judged"},
        {"straggler-factor", OPT_DOUBLE, &o.straggler_factor, 0, 0, 1, 1000, NULL, NULL, 0, "a rank this many times the group's median latency is the straggler"},
        {"delay-rank", OPT_TEXT, &o.delay, 0, 0, 0, 0, NULL, NULL, 0, "R:MS: rank R waits MS ms before sending each hand-off"},
        {"timeout-ms", OPT_U64, &o.timeout_ms, 10, 3600000, 0, 0, NULL, NULL, 0, "a hand-off without progress this long fails"},
        {"decode-restarts", OPT_U64, &o.decode_restarts, 0, 100, 0, 0, NULL, NULL, 0, "restart a decode that dies, this many times"},
        {"json", OPT_FLAG, &o.json, 0, 0, 0, 0, NULL, NULL, 0, "print one JSON object"},
        {"stats", OPT_CHOICE, &o.stats, 0, 0, 0, 0, STATS_FORMATS, NULL, 0, "also write per-rank and decode statistics to stderr"},
        {NULL, 0, NULL, 0, 0, 0, 0, NULL, NULL, 0, NULL},
    };
    cli_t c;
    cli_init(&c, "kvtier pd", argc, argv);
    int prc = cli_parse_table(&c, table, USAGE, path);
    if (prc) return prc > 0 ? 0 : 2;
    if (*path && o.seed != SEED) {
        c.flag = "--seed";
        return cli_usage(&c, "shapes the built-in synthetic workload: not with a trace (--requests takes its first N requests)");
    }
    if (o.transport == KVT_NET_UCX && !kvt_net_ucx_built()) {
        c.flag = "--transport";
        return cli_usage(&c, "ucx: this build has no UCX (install libucx-dev and rebuild)");
    }
    if (o.delay) {
        uint64_t rank, ms;
        c.flag = "--delay-rank";
        if (cli_parse_pair(o.delay, &rank, &ms) || rank >= o.ranks || ms > MAX_DELAY_MS)
            return cli_usage(&c, "expected R:MS with R < --ranks (%" PRIu64 ") and MS <= %u, got '%s'", o.ranks,
                             MAX_DELAY_MS, o.delay);
        o.delay_rank = (unsigned)rank;
        o.delay_ms = ms;
    }
    if (o.max_pages < o.ranks) {
        c.flag = "--max-pages";
        return cli_usage(&c, "%" PRIu64 " is fewer than --ranks (%" PRIu64 "): a hand-off gives every rank at least one page",
                         o.max_pages, o.ranks);
    }
    if (o.max_pages > o.decode_pages) {
        c.flag = "--decode-pages";
        return cli_usage(&c, "must hold one hand-off (--max-pages %" PRIu64 ")", o.max_pages);
    }
    /* decode's pool and every rank's lane, before anything is started */
    double pb = (double)o.bytes_per_token * (double)o.page_tokens, mem = cli_machine_memory();
    double need = pb * ((double)o.decode_pages + (double)o.ranks * (double)(o.max_pages / o.ranks + 1));
    if (need > 0.6 * mem) {
        c.flag = "--decode-pages";
        return cli_usage(&c,
                         "%.1f GiB of pages (decode's %" PRIu64 " + %" PRIu64 " ranks' lanes of %" PRIu64
                         " pages of %.1f KiB) is more than 60%% of this machine's %.1f GiB; use fewer --decode-pages or "
                         "--max-pages, or a smaller --bytes-per-token or --page-tokens",
                         need / 1073741824.0, o.decode_pages, o.ranks, o.max_pages / o.ranks + 1, pb / 1024,
                         mem / 1073741824.0);
    }
    *out = o;
    return -1;
}

/* ---- the coordinator ----------------------------------------------------------------- */

typedef struct pd_run {
    const pd_opts_t *o;
    const kvt_trace_t *t;
    ctl_t *ctl;
    uint64_t nreq, restarts_left;
} pd_run_t;

static pd_run_t g_pd;

/* Process p: decode (0) or prefill rank p - 1. */
static pid_t spawn(uint32_t p) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    group_child_signals();
    ctl_t *ctl = g_pd.ctl;
    int code = p == 0 ? pd_decode(g_pd.o, g_pd.t, ctl) : pd_rank(p - 1, g_pd.o, g_pd.t, ctl, g_pd.nreq);
    const char *err = p == 0 ? ctl->decode_err : ctl->rank[p - 1].err;
    if (code && err[0]) fprintf(stderr, "kvtier pd: %s\n", err);
    _exit(code);
}

/* group_watch's hook: a decode that died is restarted (--decode-restarts);
 * the ranks reconnect to the new generation. */
static bool restart_decode(void *arg, uint32_t idx, int status) {
    child_t *ch = arg;
    ctl_t *ctl = g_pd.ctl;
    if (idx != 0) return false;
    bool can = g_pd.restarts_left > 0 && !atomic_load(&ctl->stop);
    for (uint32_t r = 1; r <= g_pd.o->ranks; r++)
        if (ch[r].exited) can = false; /* a new decode could never hear from every rank */
    if (!can) { /* the ranks stop waiting for one, and say so themselves */
        atomic_store(&ctl->decode_lost, 1);
        return false;
    }
    g_pd.restarts_left--;
    uint64_t resume = 0; /* every hand-off up to the furthest rank's had a share at the dead decode */
    for (uint32_t r = 0; r < g_pd.o->ranks; r++) {
        uint64_t p = atomic_load(&ctl->rank[r].pos) + 1;
        resume = p > resume ? p : resume;
    }
    ctl->resume_from = resume;
    fprintf(stderr, "kvtier pd: decode died (%s %d); restarting it\n", WIFSIGNALED(status) ? "signal" : "exit",
            WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    kvt_pd_stats_merge(&ctl->past, &ctl->cur); /* the dead one's figures, as it last left them */
    kvt_pd_stats_init(&ctl->cur, (uint32_t)g_pd.o->ranks);
    atomic_store(&ctl->ctl_port, 0);
    atomic_store(&ctl->data_port, 0);
    atomic_fetch_add(&ctl->gen, 1);
    pid_t pid = spawn(0);
    if (pid < 0) return false;
    ch[0] = (child_t){pid, 0, false};
    return true;
}

/* The run's figures: every generation and every rank merged; hand-offs some
 * rank started (up to the furthest rank's position) that did not complete
 * are failed, the others were never attempted (not the same thing). */
static void result(pd_result_t *res, ctl_t *c, const kvt_trace_t *t, const pd_opts_t *o, uint64_t nreq) {
    res->all = c->past;
    kvt_pd_stats_merge(&res->all, &c->cur);
    uint64_t furthest = 0, attempted = 0;
    bool any = false;
    for (uint32_t r = 0; r < o->ranks; r++) {
        kvt_pd_rank_stats_merge(&res->all.rank[r], &c->rank[r].st);
        uint64_t p = atomic_load(&c->rank[r].pos);
        furthest = p > furthest ? p : furthest;
        any |= p > 0 || c->rank[r].st.handoffs || c->rank[r].st.failed;
        res->released += c->rank[r].st.released_pages;
    }
    for (uint64_t i = 0; any && i < nreq && i <= furthest; i++) attempted += pd_handoff_pages(t, i, o) >= o->ranks;
    res->completed = c->checked;
    if (attempted < res->completed) attempted = res->completed;
    res->failed = attempted - res->completed;
    res->not_attempted = c->total > attempted ? c->total - attempted : 0;
    res->restarts = atomic_load(&c->gen);
}

/* Starts decode and the ranks and watches them; the summary's exit code. */
static int run_group(ctl_t *ctl, const pd_opts_t *o, const kvt_trace_t *t, uint64_t nreq) {
    static child_t ch[MAX_RANKS + 1];
    memset(ch, 0, sizeof(ch));
    uint32_t nproc = (uint32_t)o->ranks + 1, started = 0; /* [0]: decode, [1 + r]: rank r */
    uint64_t t0 = now_ns();
    g_pd = (pd_run_t){o, t, ctl, nreq, o->decode_restarts};
    for (uint32_t p = 0; p < nproc; p++, started++) {
        pid_t pid = spawn(p);
        if (pid < 0) {
            atomic_store(&ctl->stop, 1);
            break;
        }
        ch[p].pid = pid;
    }
    int why = 0;
    /* a prefill rank's death fails the hand-offs that need it; decode goes on
     * serving the others, and the survivors finish (or are stopped in 5 s) */
    int dead = group_watch(ch, started, &ctl->stop, &why, 5000000000ull, restart_decode, ch);
    static pd_result_t res;
    memset(&res, 0, sizeof(res));
    result(&res, ctl, t, o, nreq);
    res.too_short = nreq - ctl->total;
    res.wall = (double)(now_ns() - t0) / 1e9;
    pd_report_bad_peers(&res.all);
    if (started < nproc) return fprintf(stderr, "kvtier pd: could not start every process\n"), 1;
    if (dead == -2) return fprintf(stderr, "kvtier pd: stopped by signal %d\n", why), 128 + why;
    if (dead >= 0) return pd_report_death(&res, dead, why, ctl->mismatches), 1;
    pd_print(&res, ctl, o);
    if (o->stats > 0) pd_emit(&res, ctl, o);
    if (ctl->mismatches == 0 && res.failed + res.not_attempted == 0) return 0;
    fprintf(stderr, /* the last word says why the run failed */
            "kvtier pd: failed: %" PRIu64 " of %" PRIu64 " hand-offs did not complete (%" PRIu64 " failed, %" PRIu64
            " not attempted%s), %" PRIu64 " pages mismatched\n",
            res.failed + res.not_attempted, ctl->total, res.failed, res.not_attempted,
            res.restarts ? "; lost with a decode that died" : "", ctl->mismatches);
    return 1;
}

int cmd_pd(int argc, char **argv) {
    pd_opts_t o;
    const char *path = NULL;
    int prc = parse(argc, argv, &o, &path);
    if (prc >= 0) return prc;
    if (cli_parse_only) return 0;
    opts_t ro;
    replay_opts_default(&ro);
    ro.requests = o.requests;
    ro.seed = o.seed;
    kvt_trace_t t;
    double parse_s;
    if (replay_load("kvtier pd", path, &ro, &t, &parse_s) != 0) return 1;
    uint64_t nreq = o.requests < t.n ? o.requests : t.n;
    ctl_t *ctl = mmap(NULL, sizeof(ctl_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (ctl == MAP_FAILED) {
        kvt_trace_free(&t);
        return 1;
    }
    if (getrandom(&ctl->token, sizeof(ctl->token), 0) != sizeof(ctl->token))
        ctl->token = now_ns() ^ ((uint64_t)getpid() << 32); /* no entropy: still not guessable by rank number */
    kvt_pd_stats_init(&ctl->past, (uint32_t)o.ranks);
    kvt_pd_stats_init(&ctl->cur, (uint32_t)o.ranks);
    for (uint64_t i = 0; i < nreq; i++) ctl->total += pd_handoff_pages(&t, i, &o) >= o.ranks;
    fflush(stdout);
    fflush(stderr);
    group_catch_signals();
    int code = run_group(ctl, &o, &t, nreq);
    munmap(ctl, sizeof(ctl_t));
    kvt_trace_free(&t);
    return code;
}
