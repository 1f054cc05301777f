/* kvtier cp's output (docs/cp.md, "Output"). */
#include "cp_print.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "kvtier/error.h"

void cp_result_fill(cp_result_t *me, const kvt_cache_t *c, const kvt_cp_group_t *g, uint32_t rank, uint64_t l2_page_bytes) {
    kvt_cache_stats_t st = {.size = sizeof(st)};
    kvt_cache_stats(c, &st);
    kvt_cp_group_info_t gi = {.size = sizeof(gi)};
    kvt_cp_group_info(g, &gi);
    me->owned_pages = kvt_cache_lane_pages(c, rank);
    me->dealt_pages = kvt_cache_lane_dealt(c, rank);
    me->tokens = st.tokens;
    me->hit_tokens = st.l1_hit_tokens + st.l2_hit_tokens;
    me->backups = rank == 0 ? st.backups : 0; /* the I/O rank makes them all */
    me->backup_bytes = rank == 0 ? st.backups * l2_page_bytes : 0;
    me->wait_ns = gi.wait_ns;
}

static void add(cJSON *o, const char *k, uint64_t v) { cJSON_AddNumberToObject(o, k, (double)v); }

static cJSON *rank_json(uint32_t r, const cp_result_t *s) {
    cJSON *e = cJSON_CreateObject();
    add(e, "rank", r);
    CLI_JSON_FIELDS(e, s, CP_RESULT_FIELDS); /* the result's own list */
    cJSON_AddNumberToObject(e, "wait_s", (double)s->wait_ns / 1e9);
    return e;
}

static void minmax(const cp_result_t *all, uint32_t C, uint64_t lo[2], uint64_t hi[2]) {
    lo[0] = lo[1] = UINT64_MAX, hi[0] = hi[1] = 0;
    for (uint32_t r = 0; r < C; r++) {
        uint64_t v[2] = {all[r].dealt_pages, all[r].owned_pages};
        for (int i = 0; i < 2; i++) lo[i] = v[i] < lo[i] ? v[i] : lo[i], hi[i] = v[i] > hi[i] ? v[i] : hi[i];
    }
}

static void group_json(uint32_t C, uint64_t n, double wall, uint64_t divergence, const cp_result_t *all, double hit,
                       uint64_t mism) {
    uint64_t lo[2], hi[2];
    minmax(all, C, lo, hi);
    cJSON *x = cJSON_CreateObject();
    add(x, "ranks", C);
    add(x, "requests", n);
    cJSON_AddNumberToObject(x, "hit_rate", hit);
    cJSON_AddBoolToObject(x, "digests_agree", divergence == 0);
    if (divergence) add(x, "first_divergence", divergence);
    cJSON *lp = cJSON_AddObjectToObject(x, "lane_pages"), *lr = cJSON_AddObjectToObject(x, "lane_resident");
    add(lp, "min", lo[0]), add(lp, "max", hi[0]); /* dealt by the allocator over the run */
    add(lr, "min", lo[1]), add(lr, "max", hi[1]); /* in use at the end */
    cJSON *b = cJSON_AddArrayToObject(x, "backups_by_rank"), *l = cJSON_AddArrayToObject(x, "loads_by_rank");
    cJSON *per = cJSON_AddArrayToObject(x, "per_rank");
    for (uint32_t r = 0; r < C; r++) {
        cJSON_AddItemToArray(b, cJSON_CreateNumber((double)all[r].backups));
        cJSON_AddItemToArray(l, cJSON_CreateNumber((double)all[r].loads));
        cJSON_AddItemToArray(per, rank_json(r, &all[r]));
    }
    add(x, "mismatches", mism);
    cJSON_AddNumberToObject(x, "wall_s", wall);
    cli_print_json(x);
}

static void group_table(uint32_t C, uint64_t n, double wall, uint64_t divergence, const cp_result_t *all, double hit,
                        uint64_t mism) {
    uint64_t lo[2], hi[2];
    minmax(all, C, lo, hi);
    printf("kvtier cp: %u ranks, %" PRIu64 " requests in %.3f s; hit rate %.4f; digests %s\n", C, n, wall, hit,
           divergence ? "DISAGREE" : "agree");
    printf("%6s %12s %12s %12s %10s %12s %12s %10s %9s\n", "rank", "pages dealt", "resident", "L1 hits", "loads",
           "load MB", "backups", "backup MB", "wait s");
    for (uint32_t r = 0; r < C; r++) {
        const cp_result_t *s = &all[r];
        printf("%6u %12" PRIu64 " %12" PRIu64 " %12" PRIu64 " %10" PRIu64 " %12.1f %12" PRIu64 " %10.1f %9.3f\n", r,
               s->dealt_pages, s->owned_pages, s->l1_hit_pages, s->loads, (double)s->load_bytes / 1e6, s->backups,
               (double)s->backup_bytes / 1e6, (double)s->wait_ns / 1e9);
    }
    printf("lane pages dealt min %" PRIu64 " max %" PRIu64 ", resident min %" PRIu64 " max %" PRIu64 "; %" PRIu64
           " mismatches\n", lo[0], hi[0], lo[1], hi[1], mism);
}

/* Another rank: what it did itself. */
static void own(const opts_t *o, uint32_t rank, uint32_t C, uint64_t n, double wall, uint64_t divergence,
                const cp_result_t *s) {
    double hit = s->tokens ? (double)s->hit_tokens / (double)s->tokens : 0;
    if (o->json) {
        cJSON *x = rank_json(rank, s);
        add(x, "ranks", C);
        add(x, "requests", n);
        cJSON_AddNumberToObject(x, "hit_rate", hit);
        cJSON_AddBoolToObject(x, "digests_agree", divergence == 0);
        add(x, "loads_total", s->loads);
        add(x, "mismatches", s->mismatches);
        cJSON_AddNumberToObject(x, "wall_s", wall);
        cli_print_json(x);
        return;
    }
    printf("kvtier cp: rank %u of %u, %" PRIu64 " requests in %.3f s; hit rate %.4f; digests %s; %" PRIu64
           " pages dealt, %" PRIu64 " loads (%" PRIu64 " verified), %" PRIu64 " mismatches, wait %.3f s\n",
           rank, C, n, wall, hit, divergence ? "DISAGREE" : "agree", s->dealt_pages, s->loads, s->verified, s->mismatches,
           (double)s->wait_ns / 1e9);
}

int cp_print(const opts_t *o, uint32_t rank, uint32_t C, uint64_t n, double wall, uint64_t divergence,
             const cp_result_t *all) {
    if (rank != 0) own(o, rank, C, n, wall, divergence, &all[0]);
    uint64_t mism = 0;
    for (uint32_t r = 0; r < C; r++) mism += all[r].mismatches;
    double hit = all[0].tokens ? (double)all[0].hit_tokens / (double)all[0].tokens : 0;
    if (rank == 0 && o->json) group_json(C, n, wall, divergence, all, hit, mism);
    else if (rank == 0) group_table(C, n, wall, divergence, all, hit, mism);
    errno = 0;
    int failed = fflush(stdout) != 0 || ferror(stdout); /* (a forked rank leaves by _exit: no later flush) */
    if (failed) /* (errno: the flush's; an earlier write's failure left only the error flag) */
        fprintf(stderr, "kvtier cp: the output could not be written: %s\n", errno ? strerror(errno) : "a write failed");
    if (divergence) fprintf(stderr, "kvtier cp: the ranks disagree from request %" PRIu64 "\n", divergence);
    return failed ? -1 : 0;
}

int cp_print_failure(kvt_cp_group_t *g, uint32_t rank, int rc, bool forked, bool interrupted) {
    kvt_cp_group_info_t gi = {.size = sizeof(gi)};
    kvt_cp_group_info(g, &gi);
    char text[160];
    const char *why = kvt_cp_group_why(g);
    if (!why[0]) snprintf(text, sizeof(text), "rank %u: %s", rank, kvt_strerror(rc)), why = text;
    if (!gi.stopped) kvt_cp_group_fail(g, why);
    bool cause = (!gi.stopped || gi.stopped_by == (int32_t)rank) && !(interrupted && forked);
    if (cause || !forked) fprintf(stderr, "kvtier cp: %s\n", why);
    return cause || !forked ? 1 : CP_QUIET;
}

int cp_print_outcome(const child_t *ch, uint32_t n, int dead, int why) {
    if (dead == -2)
        return fprintf(stderr, "kvtier cp: stopped by signal %d; the ranks were stopped and the segments removed\n", why), 128 + why;
    /* The first to exit may be one the group stopped (CP_QUIET): report the cause instead. */
    for (uint32_t r = 0; dead >= 0 && r < n && WIFEXITED(why) && WEXITSTATUS(why) == CP_QUIET; r++)
        if (ch[r].exited && (WIFSIGNALED(ch[r].status) || (WEXITSTATUS(ch[r].status) != 0 && WEXITSTATUS(ch[r].status) != CP_QUIET)))
            dead = (int)r, why = ch[r].status;
    if (dead >= 0 && WIFSIGNALED(why))
        fprintf(stderr, "kvtier cp: rank %d died (signal %d, %s); the group stopped\n", dead, WTERMSIG(why), strsignal(WTERMSIG(why)));
    else if (dead >= 0 && WEXITSTATUS(why) != CP_QUIET)
        fprintf(stderr, "kvtier cp: rank %d failed (exit %d); the group stopped\n", dead, WEXITSTATUS(why));
    else if (dead >= 0) /* every rank left quietly, each taking another for the cause: never exit 1 unexplained */
        fprintf(stderr, "kvtier cp: the group stopped (rank %d left first) and no rank reported why\n", dead);
    return dead >= 0 ? 1 : 0;
}
