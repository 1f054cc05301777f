/* kvtier pd: the summary as a table, --json and --stats. Per-rank figures
 * come from the library's field list (KVT_PD_RANK_STATS_FIELDS), for the
 * JSON as for the emitter; the names docs/pd.md lists are kept. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "kvtier/error.h"
#include "pd_cmd.h"

static double ms(const kvt_hist_t *h, double q) { return (double)kvt_hist_percentile(h, q) / 1e6; }

static void json_rank(cJSON *per, const kvt_pd_rank_stats_t *q, uint32_t r) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "rank", r);
    cJSON_AddNumberToObject(e, "gbps", q->gbps);
    cJSON_AddNumberToObject(e, "p99_ms", ms(&q->batch_ns, 0.99));
    cJSON_AddNumberToObject(e, "p50_ms", ms(&q->batch_ns, 0.5));
    cJSON_AddNumberToObject(e, "max_ms", ms(&q->batch_ns, 1));
#define JSON_FIELD_(f, kind, help) cJSON_AddNumberToObject(e, #f, (double)q->f);
    KVT_PD_RANK_STATS_FIELDS(JSON_FIELD_)
#undef JSON_FIELD_
    cJSON_AddItemToArray(per, e);
}

static void json_bad_peers(cJSON *x, const kvt_pd_stats_t *a) {
    cJSON *bp = cJSON_AddObjectToObject(x, "bad_peers");
    cJSON_AddNumberToObject(bp, "data_refused", (double)a->data_refused_hellos);
    cJSON_AddNumberToObject(bp, "data_malformed", (double)a->data_bad_peers);
    cJSON_AddNumberToObject(bp, "data_silent", (double)a->data_silent_peers);
    cJSON_AddNumberToObject(bp, "control_dropped", (double)a->control_bad_peers);
    cJSON_AddStringToObject(bp, "data_last_error", a->data_last_error);
    cJSON_AddStringToObject(bp, "control_last_error", a->control_last_error);
}

static void print_json(const pd_result_t *res, const ctl_t *c, const pd_opts_t *o, double gbps) {
    const kvt_pd_stats_t *a = &res->all;
    cJSON *x = cJSON_CreateObject();
    cJSON_AddNumberToObject(x, "ranks", (double)o->ranks);
    cJSON_AddStringToObject(x, "transport", PD_TRANSPORTS[o->transport]);
    cJSON_AddNumberToObject(x, "requests", (double)res->completed);
    cJSON_AddNumberToObject(x, "bytes", (double)a->bytes);
    cJSON_AddNumberToObject(x, "gbps", gbps);
    cJSON *h = cJSON_AddObjectToObject(x, "handoff_ms");
    cJSON_AddNumberToObject(h, "p50", ms(&a->handoff_ns, 0.5));
    cJSON_AddNumberToObject(h, "p99", ms(&a->handoff_ns, 0.99));
    cJSON_AddNumberToObject(h, "max", ms(&a->handoff_ns, 1));
    cJSON *per = cJSON_AddArrayToObject(x, "per_rank");
    for (uint32_t r = 0; r < o->ranks; r++) json_rank(per, &a->rank[r], r);
    if (a->straggler >= 0) {
        cJSON *s = cJSON_AddObjectToObject(x, "straggler");
        cJSON_AddNumberToObject(s, "rank", a->straggler);
        cJSON_AddNumberToObject(s, "factor", a->straggler_factor);
    } else {
        cJSON_AddNullToObject(x, "straggler");
    }
    cJSON_AddNumberToObject(x, "mismatches", (double)c->mismatches);
    cJSON_AddNumberToObject(x, "failed", (double)res->failed);
    cJSON_AddNumberToObject(x, "not_attempted", (double)res->not_attempted);
    cJSON_AddNumberToObject(x, "too_short", (double)res->too_short);
    json_bad_peers(x, a);
    cJSON_AddNumberToObject(x, "decode_restarts", res->restarts);
    cJSON_AddNumberToObject(x, "released_pages", (double)res->released);
    cJSON_AddNumberToObject(x, "wall_s", res->wall);
    cli_print_json(x);
}

void pd_print(const pd_result_t *res, const ctl_t *c, const pd_opts_t *o) {
    const kvt_pd_stats_t *a = &res->all;
    double gbps = res->wall > 0 ? (double)a->bytes / res->wall / 1e9 : 0;
    if (o->json) return print_json(res, c, o, gbps);
    printf("kvtier pd: %u prefill ranks -> decode over %s: %" PRIu64 " hand-offs, %.1f MB, %.2f GB/s; "
           "hand-off p50 %.2f ms p99 %.2f ms max %.2f ms; %" PRIu64 " mismatches, %" PRIu64 " failed, %" PRIu64 " not attempted\n",
           (unsigned)o->ranks, PD_TRANSPORTS[o->transport], res->completed, (double)a->bytes / 1e6, gbps, ms(&a->handoff_ns, 0.5),
           ms(&a->handoff_ns, 0.99), ms(&a->handoff_ns, 1), c->mismatches, res->failed, res->not_attempted);
    if (res->too_short)
        printf("%" PRIu64 " requests had fewer pages than ranks: not handed off\n", res->too_short);
    if (res->restarts)
        printf("decode restarted %u time(s); the ranks released %" PRIu64 " pinned pages of the hand-offs lost with it\n",
               res->restarts, res->released);
    printf("%6s %10s %8s %10s %9s %9s %9s %9s %9s %8s %8s\n", "rank", "MB", "runs", "pages", "GB/s", "p50 ms", "p90 ms",
           "p99 ms", "max ms", "last", "flagged");
    for (uint32_t r = 0; r < o->ranks; r++) {
        const kvt_pd_rank_stats_t *q = &a->rank[r];
        printf("%6u %10.1f %8" PRIu64 " %10" PRIu64 " %9.2f %9.3f %9.3f %9.3f %9.3f %8" PRIu64 " %8" PRIu64 "\n", r,
               (double)q->bytes / 1e6, q->runs, q->pages, q->gbps, ms(&q->batch_ns, 0.5), ms(&q->batch_ns, 0.9),
               ms(&q->batch_ns, 0.99), ms(&q->batch_ns, 1), q->landed_last, q->straggler_flags);
    }
    if (a->straggler >= 0) printf("straggler: rank %d (%.1fx the group's median)\n", a->straggler, a->straggler_factor);
    else printf("straggler: none\n");
}

/* --stats: the library's sections (every rank, decode), then the run's own figures. */
void pd_emit(const pd_result_t *res, const ctl_t *c, const pd_opts_t *o) {
    kvt_emitter_t *e;
    if (kvt_emitter_create(&e, (kvt_fmt_t)(o->stats - 1), "kvtier_pd") != KVT_OK) return;
    kvt_pd_stats_emit(&res->all, e);
    kvt_emit_begin(e, "run");
    kvt_emit_counter(e, "failed", res->failed, "hand-offs some rank started that did not complete");
    kvt_emit_counter(e, "not_attempted", res->not_attempted, "hand-offs no rank started");
    kvt_emit_counter(e, "mismatches", c->mismatches, "pages that differed from their content");
    kvt_emit_counter(e, "decode_restarts", res->restarts, "decodes restarted");
    kvt_emit_end(e);
    if (kvt_emitter_write(e, stderr) != KVT_OK) fprintf(stderr, "kvtier pd: --stats: could not write\n");
    kvt_emitter_destroy(e);
}

/* Bad peers decode turned away, on stderr (nothing when there were none). */
void pd_report_bad_peers(const kvt_pd_stats_t *a) {
    if (a->data_refused_hellos + a->data_bad_peers + a->data_silent_peers + a->control_bad_peers == 0) return;
    fprintf(stderr,
            "kvtier pd: decode turned peers away: data port %" PRIu64 " hellos refused, %" PRIu64 " malformed or silent, %" PRIu64
            " still silent at the end%s%s%s; control port %" PRIu64 " dropped%s%s%s\n",
            a->data_refused_hellos, a->data_bad_peers, a->data_silent_peers, a->data_last_error[0] ? " (last: " : "",
            a->data_last_error, a->data_last_error[0] ? ")" : "", a->control_bad_peers,
            a->control_last_error[0] ? " (last: " : "", a->control_last_error, a->control_last_error[0] ? ")" : "");
}

void pd_report_death(const pd_result_t *res, int dead, int why, uint64_t mismatches) {
    char name[32];
    snprintf(name, sizeof(name), dead == 0 ? "decode" : "prefill rank %d", dead - 1);
    if (WIFSIGNALED(why)) fprintf(stderr, "kvtier pd: %s died (signal %d, %s)", name, WTERMSIG(why), strsignal(WTERMSIG(why)));
    else fprintf(stderr, "kvtier pd: %s failed (exit %d)", name, WEXITSTATUS(why));
    fprintf(stderr, "; %" PRIu64 " hand-offs completed, %" PRIu64 " failed, %" PRIu64 " not attempted", res->completed,
            res->failed, res->not_attempted);
    if (res->all.first_vanished >= 0)
        fprintf(stderr, " (decode: rank %d vanished, first failed hand-off %" PRIu64 ")", res->all.first_vanished,
                res->all.first_failed);
    fprintf(stderr, "; %" PRIu64 " pages mismatched\n", mismatches);
}
