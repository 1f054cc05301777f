/* PD statistics (include/kvtier/pd.h): one X-macro list per struct makes the
 * merge and the emitter's lines, so the command's --stats and --json and a
 * C caller see the same fields.
 *
 *   sender r: kvt_pd_sender_stats ----+
 *                                     +--> rank[r] (kvt_pd_rank_stats_merge)
 *   receiver: kvt_pd_receiver_stats --+    + the decode fields
 *
 * Merging: counters add, gauges take the larger (each gauge is set by one
 * side only, or is a level that the larger describes), histograms merge
 * bucket-wise; the straggler is picked again from the merged flags. */
#include <stdio.h>
#include <string.h>

#include "kvtier/pd.h"
#include "pd-int.h"

#define MERGE_COUNTER(d, s, f) (d)->f += (s)->f
#define MERGE_GAUGE(d, s, f) (d)->f = (s)->f > (d)->f ? (s)->f : (d)->f
#define MERGE_ONE_(f, kind, help) MERGE_##kind(dst, src, f);

void kvt_pd_stats_init(kvt_pd_stats_t *st, uint32_t ranks) {
    memset(st, 0, sizeof(*st));
    st->size = sizeof(*st);
    st->ranks = ranks;
    st->straggler = st->first_vanished = -1;
    kvt_hist_init(&st->handoff_ns);
    for (uint32_t r = 0; r < KVT_PD_MAX_RANKS; r++) kvt_hist_init(&st->rank[r].batch_ns);
}

void kvt_pd_rank_stats_merge(kvt_pd_rank_stats_t *dst, const kvt_pd_rank_stats_t *src) {
    KVT_PD_RANK_STATS_FIELDS(MERGE_ONE_)
    kvt_hist_merge(&dst->batch_ns, &src->batch_ns);
    dst->gbps = dst->busy_ns ? (double)dst->bytes / (double)dst->busy_ns : 0;
    if (src->straggler_factor > 0) dst->straggler_factor = src->straggler_factor;
}

void kvt__pd_pick_straggler(kvt_pd_stats_t *st) {
    st->straggler = -1;
    st->straggler_factor = 0;
    for (uint32_t r = 0; r < st->ranks && r < KVT_PD_MAX_RANKS; r++)
        if (st->rank[r].straggler_flags && (st->straggler < 0 || st->rank[r].straggler_flags > st->rank[st->straggler].straggler_flags))
            st->straggler = (int32_t)r;
    if (st->straggler >= 0) st->straggler_factor = st->rank[st->straggler].straggler_factor;
}

void kvt_pd_stats_merge(kvt_pd_stats_t *dst, const kvt_pd_stats_t *src) {
    KVT_PD_STATS_FIELDS(MERGE_ONE_)
    kvt_hist_merge(&dst->handoff_ns, &src->handoff_ns);
    if (src->ranks > dst->ranks) dst->ranks = src->ranks;
    if (dst->first_vanished < 0) dst->first_vanished = src->first_vanished;
    if (src->first_failed && (!dst->first_failed || src->first_failed < dst->first_failed)) dst->first_failed = src->first_failed;
    if (src->data_last_error[0]) memcpy(dst->data_last_error, src->data_last_error, sizeof(dst->data_last_error));
    if (src->control_last_error[0]) memcpy(dst->control_last_error, src->control_last_error, sizeof(dst->control_last_error));
    for (uint32_t r = 0; r < KVT_PD_MAX_RANKS; r++) kvt_pd_rank_stats_merge(&dst->rank[r], &src->rank[r]);
    kvt__pd_pick_straggler(dst);
}

void kvt_pd_stats_emit(const kvt_pd_stats_t *st, kvt_emitter_t *e) {
    for (uint32_t r = 0; r < st->ranks && r < KVT_PD_MAX_RANKS; r++) {
        const kvt_pd_rank_stats_t *q = &st->rank[r];
        char name[32];
        snprintf(name, sizeof(name), "rank%u", r);
        kvt_emit_begin(e, name);
        KVT_EMIT_STATS(e, q, KVT_PD_RANK_STATS_FIELDS);
        kvt_emit_gauge(e, "gbps", q->gbps, "GB/s while sending");
        kvt_emit_hist(e, "batch_ns", &q->batch_ns, "submit to acknowledged, per batch");
        kvt_emit_end(e);
    }
    kvt_emit_begin(e, "decode");
    KVT_EMIT_STATS(e, st, KVT_PD_STATS_FIELDS);
    kvt_emit_gauge(e, "straggler", st->straggler, "the rank flagged most as the straggler (-1: none)");
    kvt_emit_gauge(e, "straggler_factor", st->straggler_factor, "its median over the group's median");
    kvt_emit_hist(e, "handoff_ns", &st->handoff_ns, "first REQ to last DONE");
    kvt_emit_end(e);
}
