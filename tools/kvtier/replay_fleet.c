/* kvtier replay --instances N: a fleet of N serving instances, each its own
 * process with its own L1 and L2, sharing one L3 store.
 *
 * Routing (the documented rule): requests are dealt to instances by session,
 * round robin in the order sessions first appear. A request continues the
 * session of the latest earlier request whose blocks are a prefix of its own
 * (the next turn of a conversation carries the whole history); any other
 * request starts a session. So a conversation stays on one instance, while
 * different conversations that share only a system prompt or a document
 * usually land on different ones: what they share, each instance finds in
 * the store once another has put it. That is the fleet-level effect the
 * shared L3 is for (the instances' L1 and L2 cannot see each other).
 *
 * Each instance runs its share of the requests, in trace order, at the same
 * time as the others (replay_instances: replay_run_one here, the hybrid
 * cache's run in replay_hybrid.c), and writes its result into memory shared
 * with the coordinator, which adds them up. */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "group.h"
#include "replay_run.h"

typedef struct first {
    uint64_t id;  /* the request's first block */
    uint32_t req;
} first_t;

static int by_first(const void *a, const void *b) {
    const first_t *x = a, *y = b;
    if (x->id != y->id) return x->id < y->id ? -1 : 1;
    return (x->req > y->req) - (x->req < y->req);
}

/* Whether request p's blocks are a prefix of request r's. */
static bool extends(const kvt_trace_req_t *r, const kvt_trace_req_t *p) {
    if (p->nblocks > r->nblocks) return false;
    return memcmp(r->hash_ids, p->hash_ids, p->nblocks * sizeof(r->hash_ids[0])) == 0;
}

uint64_t replay_route(const kvt_trace_t *t, uint64_t n, uint32_t instances, uint32_t *route) {
    first_t *f = malloc((n ? n : 1) * sizeof(*f));
    uint32_t *session = malloc((n ? n : 1) * sizeof(*session));
    if (f == NULL || session == NULL) {
        free(f);
        free(session);
        for (uint64_t i = 0; i < n; i++) route[i] = (uint32_t)(i % instances); /* no memory for the rule: plain round robin */
        return n;
    }
    uint64_t m = 0, sessions = 0;
    for (uint64_t i = 0; i < n; i++)
        if (t->req[i].nblocks) f[m++] = (first_t){t->req[i].hash_ids[0], (uint32_t)i};
    qsort(f, m, sizeof(*f), by_first);
    /* session[i]: first the request it continues (its latest earlier prefix within its group) */
    for (uint64_t i = 0; i < n; i++) session[i] = UINT32_MAX;
    for (uint64_t g = 0; g < m;) {
        uint64_t e = g;
        while (e < m && f[e].id == f[g].id) e++;
        for (uint64_t k = g; k < e; k++)
            for (uint64_t j = k; j-- > g;)
                if (extends(&t->req[f[k].req], &t->req[f[j].req])) {
                    session[f[k].req] = f[j].req;
                    break;
                }
        g = e;
    }
    /* then, in trace order, its session: numbered as they first appear, dealt round robin */
    for (uint64_t i = 0; i < n; i++) {
        session[i] = session[i] == UINT32_MAX ? (uint32_t)sessions++ : session[session[i]];
        route[i] = session[i] % instances;
    }
    free(f);
    free(session);
    return sessions;
}

/* ---- adding up ---- */

void replay_store_add(kvt_store_stats_t *d, const kvt_store_stats_t *s) {
#define ADD_(name, kind, help) d->name += s->name;
    KVT_STORE_STATS_FIELDS(ADD_)
#undef ADD_
    kvt_hist_merge(&d->latency_ns, &s->latency_ns);
}

static void add_result(result_t *d, const result_t *s, bool first) {
    if (first) {
        *d = *s;
        return;
    }
#define ADD_(name, kind, help) d->cs.name += s->cs.name;
    KVT_CACHE_STATS_FIELDS(ADD_)
#undef ADD_
#define ADDR_(name, kind, help) d->rs.name += s->rs.name;
    KVT_RADIX_STATS_FIELDS(ADDR_)
#undef ADDR_
    d->l1_pages += s->l1_pages;
    d->l2_pages += s->l2_pages;
    d->nreq += s->nreq;
    if (s->wall_s > d->wall_s) d->wall_s = s->wall_s;
    d->data.filled_pages += s->data.filled_pages;
    d->data.verified_hits += s->data.verified_hits;
    d->data.verified_loads += s->data.verified_loads;
    d->data.mismatches += s->data.mismatches;
    for (int op = 0; op < KVT_STORE_OP_COUNT_; op++) replay_store_add(&d->l3.op[op], &s->l3.op[op]);
}

/* ---- the fleet ---- */

/* An instance: its share of the requests, its result into its slot of the
 * shared results; exit 0 once the result is whole. */
static void instance_main(const uint32_t *route, uint64_t n, uint32_t me, replay_instance_fn run, void *arg, void *res,
                          size_t size, void *shared) {
    group_child_signals();
    uint32_t *reqs = malloc((n ? n : 1) * sizeof(*reqs));
    uint64_t k = 0;
    for (uint64_t i = 0; reqs && i < n; i++)
        if (route[i] == me) reqs[k++] = (uint32_t)i;
    memset(res, 0, size);
    int rc = reqs ? run(arg, reqs, k, res) : -1;
    if (rc == 0) memcpy(shared, res, size);
    _exit(rc == 0 ? 0 : 1);
}

int replay_instances(const kvt_trace_t *t, uint64_t n, uint32_t ni, replay_instance_fn run, void *arg, void *each,
                     size_t size) {
    uint32_t *route = malloc((n ? n : 1) * sizeof(*route));
    /* the results come back through memory shared with the instances: the coordinator only watches
     * them (group_watch: the first to die stops the rest, a signal to it stops them all) */
    void *shared = mmap(NULL, ni * size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (route == NULL || shared == MAP_FAILED) {
        free(route);
        if (shared != MAP_FAILED) munmap(shared, ni * size);
        return fprintf(stderr, "kvtier replay: --instances: out of memory\n"), -1;
    }
    replay_route(t, n, ni, route);
    fflush(NULL); /* nothing buffered is written twice */
    group_catch_signals(); /* the instances die with the coordinator, however it dies */
    child_t ch[64];
    uint32_t started = 0;
    int rc = 0;
    for (; started < ni; started++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("kvtier replay: --instances: fork");
            rc = -1;
            break;
        }
        if (pid == 0)
            instance_main(route, n, started, run, arg, (char *)each + started * size, size, (char *)shared + started * size);
        ch[started] = (child_t){.pid = pid};
    }
    if (rc != 0)
        for (uint32_t i = 0; i < started; i++) kill(ch[i].pid, SIGTERM);
    _Atomic int stop = 0;
    int why = 0;
    int dead = group_watch(ch, started, &stop, &why, 0, NULL, NULL);
    if (dead == -2) {
        fprintf(stderr, "kvtier replay: stopped by signal %d (%s); the instances were stopped\n", why, strsignal(why));
        exit(128 + why);
    }
    if (rc == 0 && dead >= 0 && WIFSIGNALED(why))
        fprintf(stderr, "kvtier replay: instance %d died (signal %d, %s); the others were stopped\n", dead, WTERMSIG(why),
                strsignal(WTERMSIG(why)));
    else if (rc == 0 && dead >= 0)
        fprintf(stderr, "kvtier replay: instance %d failed (exit %d); the others were stopped\n", dead, WEXITSTATUS(why));
    if (dead >= 0) rc = -1;
    if (rc == 0) memcpy(each, shared, ni * size);
    munmap(shared, ni * size);
    free(route);
    return rc;
}

typedef struct {
    const kvt_trace_t *t;
    const opts_t *o;
    const l3_opts_t *l;
} radix_arg_t;

static int radix_instance(void *arg, const uint32_t *reqs, uint64_t n, void *res) {
    const radix_arg_t *a = arg;
    return replay_run_one(a->t, a->o, a->l, a->o->l1_pages, reqs, n, res);
}

int replay_fleet(const kvt_trace_t *t, const opts_t *o, const l3_opts_t *l, result_t *each, result_t *total) {
    uint32_t ni = (uint32_t)l->instances;
    uint64_t n = o->limit && o->limit < t->n ? o->limit : t->n;
    radix_arg_t a = {t, o, l};
    if (replay_instances(t, n, ni, radix_instance, &a, each, sizeof(*each)) != 0) return -1;
    uint64_t wait_max = 0; /* a maximum, not a sum */
    for (uint32_t i = 0; i < ni; i++) {
        add_result(total, &each[i], i == 0);
        if (each[i].cs.prefetch_wait_max_micros > wait_max) wait_max = each[i].cs.prefetch_wait_max_micros;
    }
    total->cs.prefetch_wait_max_micros = wait_max;
    return 0;
}
