/* The transfer engine (see include/kvtier/xfer.h for the contract).
 *
 *   submit (any thread)                      workers (per destination tier)
 *   ------------------                       ------------------------------
 *   sort copies by destination               take an item from its queue
 *   merge runs (src and dst both +1)         verify source checksums
 *   cut runs into items (byte/copy caps) --> make spans (the pair's plan: plan.c)
 *   push items on queue[dst]                 inject faults, copy (streaming
 *                                            stores into host tiers: copy.c),
 *                                            fence; destination checksums,
 *                                            hashed from each source block
 *                                            while it is copied
 *   poll (any thread)                        last item of a batch: stats,
 *   <-- done queue <------------------------ done queue, callback
 *
 * Ownership: a batch is allocated at submit with its sorted copies, runs and
 * items in one block; it is freed by the poll after the one that returned it
 * (so `copies` stays valid until the next poll), or by destroy.
 *
 * Invariants: a batch is on exactly one of {its items' queues, in progress,
 * the done queue, the retired list}; `remaining` counts its items not yet
 * finished; the pair's inflight gauges count batches between submit and the
 * last item's end.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core/doneq-int.h"
#include "../core/abi-int.h"
#include "kvtier/stats.h"
#include "kvtier/error.h"
#include "kvtier/xfer.h"
#include "../core/mem-int.h"
#include "../core/mix-int.h"
#include "xfer-int.h"
#include "copy-int.h" /* and core/sum-int.h: XXH3_state_t on the stack */

typedef struct run {
    uint32_t src, dst, len;
} run_t;

typedef struct batch batch_t;

typedef struct item {
    batch_t *b;
    struct item *next;
    uint32_t run_lo, run_hi; /* runs [lo, hi) of the batch */
    uint64_t t_submit;
    bool verify;             /* the batch's checksum pass: runs the others once it passes */
} item_t;

struct batch {
    kvt_xfer_done_t done;
    kvt__doneq_link_t link; /* the done queue, then the retired list */
    kvt_xfer_copy_t *copies;
    run_t *runs;
    item_t *items;
    size_t nruns, nitems, alloc_bytes;
    uint64_t ncopies; /* contiguous copies its runs make */
    uint64_t bytes, t_submit;
    _Atomic int status;
    _Atomic uint64_t bad_page;
    _Atomic size_t remaining;
    _Atomic uint64_t busy_ns; /* its items' copy time: the pair's busy_ns when it completes */
};

typedef struct pair {
    pthread_mutex_t mu;
    kvt_xfer_stats_t st;
    bool seen;
} pair_t;

typedef struct queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    item_t *head, *tail;
    bool stop; /* under mu: the workers exit once the queue is empty */
} queue_t;

typedef struct worker {
    kvt_xfer_t *x;
    unsigned dst;
    pthread_t th;
    kvt__span_t *spans;
    size_t cap;
    void *ctx[KVT_XFER_MAX_TIERS]; /* device copy contexts, opened on first use */
} worker_t;

struct kvt_xfer {
    kvt_xfer_config_t cfg;
    kvt_tier_t *tiers[KVT_XFER_MAX_TIERS];
    unsigned ntiers;
    queue_t q[KVT_XFER_MAX_TIERS];
    worker_t *workers;
    unsigned nworkers;
    pair_t pairs[KVT_XFER_MAX_TIERS][KVT_XFER_MAX_TIERS];
    kvt__doneq_t done; /* finished batches, to poll */
    _Atomic uint64_t next_ticket;
    pthread_mutex_t fault_mu;
    _Atomic bool faults_on; /* fast path: no lock per copy when no fault is armed */
    kvt__xfer_faults_t faults;
    uint64_t fault_count;
    kvt_tier_t *device; /* a device tier host tiers were registered with, or NULL */
    bool *registered[KVT_XFER_MAX_TIERS]; /* per region of each host tier: this engine registered it (and unregisters) */
    kvt__plan_t plans[KVT_XFER_MAX_TIERS][KVT_XFER_MAX_TIERS]; /* how runs of each pair become spans */
    bool stream[KVT_XFER_MAX_TIERS][KVT_XFER_MAX_TIERS];        /* host copies of the pair stream past the cache */
};


void kvt_xfer_config_default(kvt_xfer_config_t *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->size = sizeof(*cfg);
    cfg->threads = 1;
    cfg->max_batch_bytes = 64ull << 20;
    cfg->max_batch_copies = 4096;
    cfg->checksum = true;
}

/* ---- workers ------------------------------------------------------------------ */

/* The fault (if any) for the next copy: KVT_EIO to fail; *delay set. */
static int next_fault(kvt_xfer_t *x, uint64_t *delay) {
    *delay = 0;
    if (!atomic_load_explicit(&x->faults_on, memory_order_relaxed)) return KVT_OK;
    pthread_mutex_lock(&x->fault_mu);
    const kvt__xfer_faults_t *f = &x->faults;
    uint64_t k = ++x->fault_count;
    int rc = KVT_OK;
    if (f->fail_nth && k == f->fail_nth) rc = KVT_EIO;
    if (f->delay_nth && k == f->delay_nth) *delay = f->delay_ns;
    if (f->fail_p > 0 || f->delay_p > 0) {
        uint64_t r1 = kvt__mix64(f->seed ^ (k * 0x9e3779b97f4a7c15ull)), r2 = kvt__mix64(r1);
        if ((double)(r1 >> 11) * 0x1.0p-53 < f->fail_p) rc = KVT_EIO;
        if ((double)(r2 >> 11) * 0x1.0p-53 < f->delay_p && f->delay_max_ns) *delay += kvt__mix64(r2) % f->delay_max_ns;
    }
    pthread_mutex_unlock(&x->fault_mu);
    return rc;
}

static void sleep_ns(uint64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static bool needs_verify(const kvt_xfer_t *x, unsigned src) { return x->cfg.checksum && x->tiers[src]->sums != NULL; }

/* Verifies every source page of a batch against its checksum. */
static int verify_sources(kvt_xfer_t *x, batch_t *b) {
    kvt_tier_t *s = x->tiers[b->done.src];
    for (uint32_t r = 0; r < b->nruns; r++)
        for (uint32_t p = 0; p < b->runs[r].len; p++) {
            uint32_t page = b->runs[r].src + p;
            if (kvt_tier_page_sum(s, page) != s->sums[page]) {
                atomic_store(&b->bad_page, page);
                return KVT_ECORRUPT;
            }
        }
    return KVT_OK;
}

static void record_sums(kvt_xfer_t *x, batch_t *b, const item_t *it) {
    kvt_tier_t *d = x->tiers[b->done.dst];
    if (!x->cfg.checksum || d->sums == NULL) return;
    for (uint32_t r = it->run_lo; r < it->run_hi; r++)
        for (uint32_t p = 0; p < b->runs[r].len; p++) d->sums[b->runs[r].dst + p] = kvt_tier_page_sum(d, b->runs[r].dst + p);
}

static size_t make_spans(kvt_xfer_t *x, worker_t *w, batch_t *b, const item_t *it) {
    const kvt_tier_t *s = x->tiers[b->done.src], *d = x->tiers[b->done.dst];
    const kvt__plan_t *pl = &x->plans[b->done.src][b->done.dst];
    size_t n = 0;
    for (uint32_t r = it->run_lo; r < it->run_hi; r++)
        n += kvt__plan_emit(pl, d, b->runs[r].dst, s, b->runs[r].src, b->runs[r].len, w->spans + n);
    return n;
}

/* The device tier that drives a pair's copies, or NULL for memcpy. */
static kvt_tier_t *driver(kvt_xfer_t *x, const batch_t *b, unsigned *which) {
    for (unsigned k = 0; k < 2; k++) {
        unsigned t = k ? b->done.dst : b->done.src;
        if (x->tiers[t]->ops->copy) return *which = t, x->tiers[t];
    }
    return NULL;
}

/* Where the next whole-page span of an item starts: page `off` of run `r`. */
typedef struct cursor {
    uint32_t r, off;
} cursor_t;

/* The host copy of one span of whole pages on both sides (PLAN_RUN: one span
 * per run; PLAN_PAGE: one per page; spans in run order), each page's checksum
 * taken from the source block by block as it is copied (copy.c): one pass
 * over memory, the destination never read back. */
static void copy_and_sum(kvt_tier_t *d, const batch_t *b, const kvt__span_t *sp, bool stream, cursor_t *c) {
    uint64_t pb = kvt_geom_page_bytes(&d->cfg.geom);
    uint8_t *dst = sp->dst;
    const uint8_t *src = sp->src;
    XXH3_state_t st;
    stream = kvt__copy_streams(sp->len, stream); /* by the span: a run of small pages is one long copy */
    for (size_t o = 0; o < sp->len; o += pb) {
        XXH3_64bits_reset(&st);
        kvt__copy_sum(dst + o, src + o, (size_t)pb, stream, &st);
        d->sums[b->runs[c->r].dst + c->off] = XXH3_64bits_digest(&st);
        if (++c->off == b->runs[c->r].len) c->r++, c->off = 0;
    }
    if (stream) kvt__copy_fence();
}

/* The injected fault (if any) for the next span, after its delay. */
static int fault_before(kvt_xfer_t *x) {
    uint64_t delay;
    int f = next_fault(x, &delay);
    if (delay) sleep_ns(delay);
    return f;
}

/* The host copies of an item's spans, streaming ones fenced once at the end;
 * streaming spans of one length go two at a time (copy.c). */
static int host_copies(kvt_xfer_t *x, const kvt__span_t *sp, size_t n, bool stream) {
    bool fence = false;
    int f = KVT_OK;
    for (size_t i = 0; i < n && f == KVT_OK; i++) {
        if ((f = fault_before(x)) != KVT_OK) break;
        bool two = i + 1 < n && sp[i + 1].len == sp[i].len && kvt__copy_pairs(sp[i].len, stream);
        if (two && (f = fault_before(x)) != KVT_OK) two = false; /* the second's fault: the first lands alone */
        if (two) fence |= kvt__copy_pair_unfenced(sp[i].dst, sp[i].src, sp[i + 1].dst, sp[i + 1].src, sp[i].len, stream);
        else fence |= kvt__copy_unfenced(sp[i].dst, sp[i].src, sp[i].len, stream);
        i += two;
    }
    if (fence) kvt__copy_fence();
    return f; /* a fault: the copies before it may have landed, and the batch fails as a whole */
}

static int run_item(kvt_xfer_t *x, worker_t *w, batch_t *b, const item_t *it) {
    int rc;
    size_t n = make_spans(x, w, b, it);
    unsigned di = 0;
    kvt_tier_t *drv = driver(x, b, &di), *d = x->tiers[b->done.dst];
    /* a batch past the cache streams wherever it goes, as a span past it does (copy-int.h) */
    bool stream = x->stream[b->done.src][b->done.dst] || b->bytes >= KVT__STREAM_HUGE;
    bool fused = drv == NULL && x->cfg.checksum && d->sums != NULL &&
                 x->plans[b->done.src][b->done.dst].kind != KVT__PLAN_CHUNKS; /* spans are whole pages */
    cursor_t cur = {it->run_lo, 0};
    if (drv && w->ctx[di] == NULL && (rc = drv->ops->ctx_open(drv, &w->ctx[di])) != KVT_OK) return rc;
    if (!drv && !fused && (rc = host_copies(x, w->spans, n, stream)) != KVT_OK) return rc;
    for (size_t i = 0; (drv || fused) && i < n; i++) {
        int f = fault_before(x);
        if (f != KVT_OK) return f; /* the copies before it may have landed: the batch fails as a whole */
        if (fused) copy_and_sum(d, b, &w->spans[i], stream, &cur);
    }
    if (drv && (rc = drv->ops->copy(drv, w->ctx[di], w->spans, n)) != KVT_OK) return rc;
    if (!fused) record_sums(x, b, it);
    return KVT_OK;
}

static void finish_batch(kvt_xfer_t *x, batch_t *b) {
    uint64_t t = kvt_now_ns();
    int status = atomic_load(&b->status);
    b->done.status = status;
    b->done.bad_page = atomic_load(&b->bad_page);
    pair_t *p = &x->pairs[b->done.src][b->done.dst];
    pthread_mutex_lock(&p->mu);
    kvt_xfer_stats_t *st = &p->st;
    st->inflight_batches--;
    st->inflight_bytes -= b->bytes;
    if (status == KVT_OK) {
        st->batches++;
        st->pages += b->done.n;
        st->runs += b->nruns;
        st->copies += b->ncopies;
        st->bytes += b->bytes;
        st->busy_ns += atomic_load(&b->busy_ns); /* with bytes: gbps counts a batch whole or not at all */
    } else {
        st->failures++;
        st->corrupt += status == KVT_ECORRUPT;
    }
    kvt_hist_record(&st->e2e_ns, t - b->t_submit);
    pthread_mutex_unlock(&p->mu);
    if (x->cfg.on_done) x->cfg.on_done(x->cfg.arg, &b->done);
    kvt__doneq_push(&x->done, b);
}

static void enqueue(kvt_xfer_t *x, item_t *first, size_t n) {
    queue_t *q = &x->q[first->b->done.dst];
    pthread_mutex_lock(&q->mu);
    for (size_t i = 0; i < n; i++) {
        item_t *it = &first[i];
        it->next = NULL;
        if (q->tail) q->tail->next = it;
        else q->head = it;
        q->tail = it;
    }
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

/* A batch read from a tier with checksums is checked whole before any of it
 * is copied: a mismatch fails it with nothing copied. */
static void run_verify(kvt_xfer_t *x, batch_t *b) {
    int rc = verify_sources(x, b);
    if (rc == KVT_OK) {
        enqueue(x, b->items, b->nitems);
        if (atomic_fetch_sub(&b->remaining, 1) == 1) finish_batch(x, b);
        return;
    }
    atomic_store(&b->status, rc);
    if (atomic_fetch_sub(&b->remaining, b->nitems + 1) == b->nitems + 1) finish_batch(x, b);
}

static void *worker_main(void *arg) {
    worker_t *w = arg;
    kvt_xfer_t *x = w->x;
    queue_t *q = &x->q[w->dst];
    for (;;) {
        pthread_mutex_lock(&q->mu);
        while (q->head == NULL && !q->stop) pthread_cond_wait(&q->cv, &q->mu);
        item_t *it = q->head;
        if (it == NULL) { /* stopping, and nothing left */
            pthread_mutex_unlock(&q->mu);
            return NULL;
        }
        q->head = it->next;
        if (q->head == NULL) q->tail = NULL;
        pthread_mutex_unlock(&q->mu);

        batch_t *b = it->b;
        if (it->verify) {
            run_verify(x, b);
            continue;
        }
        if (atomic_load(&b->status) == KVT_OK) { /* a failed batch skips the rest: no work, nothing counted */
            uint64_t t0 = kvt_now_ns();
            int rc = run_item(x, w, b, it);
            uint64_t t1 = kvt_now_ns();
            if (rc != KVT_OK) {
                int ok = KVT_OK;
                atomic_compare_exchange_strong(&b->status, &ok, rc);
            }
            atomic_fetch_add(&b->busy_ns, t1 - t0);
            pair_t *p = &x->pairs[b->done.src][b->done.dst];
            pthread_mutex_lock(&p->mu);
            kvt_hist_record(&p->st.queue_ns, t0 - it->t_submit);
            kvt_hist_record(&p->st.copy_ns, t1 - t0);
            p->st.items++;
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_fetch_sub(&b->remaining, 1) == 1) finish_batch(x, b);
    }
}

/* ---- submit ------------------------------------------------------------------- */

static int cmp_dst(const void *a, const void *b) {
    uint32_t x = ((const kvt_xfer_copy_t *)a)->dst_page, y = ((const kvt_xfer_copy_t *)b)->dst_page;
    return (x > y) - (x < y);
}

/* Whether copy c extends run r: source and destination both advance by
 * one, and the run is not yet max_pages long. */
static bool extends(const run_t *r, const kvt_xfer_copy_t *c, uint64_t max_pages) {
    return r->len < max_pages && c->dst_page == r->dst + r->len && c->src_page == r->src + r->len;
}

/* Merges sorted copies into runs; with out NULL only counts them. */
static size_t merge_runs(const kvt_xfer_copy_t *c, size_t n, uint64_t max_pages, run_t *out) {
    run_t cur = {0, 0, 0};
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (k > 0 && extends(&cur, &c[i], max_pages)) {
            cur.len++;
        } else {
            if (k > 0 && out) out[k - 1] = cur;
            cur = (run_t){c[i].src_page, c[i].dst_page, 1};
            k++;
        }
    }
    if (k > 0 && out) out[k - 1] = cur;
    return k;
}

/* Groups runs into b->items: at most max_bytes and max_copies each (a run is
 * already no bigger than max_bytes). Returns the item count. */
static size_t group_items(batch_t *b, uint64_t page_bytes, const kvt__plan_t *pl, uint64_t max_bytes,
                          uint32_t max_copies) {
    size_t k = 0;
    uint64_t bytes = 0, spans = 0;
    for (size_t r = 0; r < b->nruns; r++) {
        uint64_t rb = (uint64_t)b->runs[r].len * page_bytes, rs = kvt__plan_spans(pl, b->runs[r].len);
        if (r == 0 || bytes + rb > max_bytes || spans + rs > max_copies) {
            b->items[k] = (item_t){b, NULL, (uint32_t)r, (uint32_t)r, 0, false};
            k++;
            bytes = spans = 0;
        }
        bytes += rb;
        spans += rs;
        b->items[k - 1].run_hi = (uint32_t)r + 1;
    }
    return k;
}

static void batch_free(void *p) {
    batch_t *b = p;
    kvt__free(b, b->alloc_bytes);
}

/* Submit, step 1: the arguments, every page in range. */
static int validate(const kvt_xfer_t *x, unsigned src, unsigned dst, const kvt_xfer_copy_t *copies, size_t n) {
    if (x == NULL || src >= x->ntiers || dst >= x->ntiers || src == dst || copies == NULL || n == 0 || n > UINT32_MAX ||
        x->tiers[src]->remote || /* a peer's tier (tcp, ucx) is written, never read */
        (x->tiers[dst]->remote && x->tiers[src]->ops->copy)) /* ... from host memory: a GPU's pages go by L2 */
        return KVT_EINVAL;
    const kvt_geom_t *gs = &x->tiers[src]->cfg.geom, *gd = &x->tiers[dst]->cfg.geom;
    for (size_t i = 0; i < n; i++)
        if (copies[i].src_page >= gs->pages || copies[i].dst_page >= gd->pages) return KVT_EINVAL;
    return KVT_OK;
}

/* Step 2: the copies by destination page, into a new array; NULL with *rc
 * set on no memory or a destination page given twice. */
static kvt_xfer_copy_t *sort_copies(const kvt_xfer_copy_t *copies, size_t n, int *rc) {
    kvt_xfer_copy_t *sorted = kvt__malloc(n * sizeof(*sorted));
    if (sorted == NULL) return *rc = KVT_ENOMEM, NULL;
    memcpy(sorted, copies, n * sizeof(*sorted));
    qsort(sorted, n, sizeof(*sorted), cmp_dst);
    for (size_t i = 1; i < n; i++)
        if (sorted[i].dst_page == sorted[i - 1].dst_page) {
            kvt__free(sorted, n * sizeof(*sorted));
            return *rc = KVT_EINVAL, NULL;
        }
    return sorted;
}

/* Step 3: the batch, in one block (header, sorted copies, runs merged where
 * both ends advance by one, then the work items cut from them by the byte
 * and copy caps); NULL on no memory. */
static batch_t *build_batch(kvt_xfer_t *x, unsigned src, unsigned dst, const kvt_xfer_copy_t *sorted, size_t n,
                            uint64_t user) {
    uint64_t pb = kvt_geom_page_bytes(&x->tiers[src]->cfg.geom);
    uint64_t max_pages = x->cfg.max_batch_bytes / pb ? x->cfg.max_batch_bytes / pb : 1;
    const kvt__plan_t *plan = &x->plans[src][dst];
    if (plan->per_page && max_pages > (x->cfg.max_batch_copies - plan->fixed) / plan->per_page) /* a run's copies fit an item */
        max_pages = (x->cfg.max_batch_copies - plan->fixed) / plan->per_page;
    size_t nruns = merge_runs(sorted, n, max_pages, NULL);
    size_t bytes = sizeof(batch_t) + n * sizeof(kvt_xfer_copy_t) + nruns * sizeof(run_t);
    bytes = (bytes + _Alignof(item_t) - 1) & ~(_Alignof(item_t) - 1);
    batch_t *b = kvt__malloc(bytes + (nruns + 1) * sizeof(item_t)); /* items <= runs, + the checksum pass */
    if (b == NULL) return NULL;
    memset(b, 0, sizeof(*b));
    b->alloc_bytes = bytes + (nruns + 1) * sizeof(item_t);
    b->copies = (kvt_xfer_copy_t *)(b + 1);
    memcpy(b->copies, sorted, n * sizeof(*sorted));
    b->runs = (run_t *)(b->copies + n);
    b->nruns = nruns;
    b->done.copies = b->copies;
    b->done.n = n;
    b->done.src = src;
    b->done.dst = dst;
    b->done.user = user;
    merge_runs(b->copies, n, max_pages, b->runs);
    b->items = (item_t *)((uint8_t *)b + bytes);
    b->nitems = group_items(b, pb, plan, x->cfg.max_batch_bytes, x->cfg.max_batch_copies);
    for (size_t r = 0; r < nruns; r++) b->ncopies += kvt__plan_spans(plan, b->runs[r].len);
    b->bytes = n * pb;
    return b;
}

/* Step 4: counted in flight, then handed to the workers (the checksum pass
 * first when the source keeps checksums). From here the batch is theirs. */
static void publish(kvt_xfer_t *x, batch_t *b, uint64_t *ticket) {
    unsigned src = b->done.src, dst = b->done.dst;
    bool verify = needs_verify(x, src);
    b->done.ticket = atomic_fetch_add(&x->next_ticket, 1) + 1;
    b->t_submit = kvt_now_ns();
    atomic_store(&b->remaining, b->nitems + verify);
    atomic_store(&b->status, KVT_OK);
    atomic_store(&b->busy_ns, 0);
    if (ticket) *ticket = b->done.ticket;
    pair_t *p = &x->pairs[src][dst];
    pthread_mutex_lock(&p->mu);
    p->seen = true;
    p->st.inflight_batches++;
    p->st.inflight_bytes += b->bytes;
    pthread_mutex_unlock(&p->mu);
    kvt__doneq_submitted(&x->done);
    for (size_t i = 0; i <= b->nitems; i++) b->items[i].t_submit = b->t_submit;
    if (verify) {
        item_t *v = &b->items[b->nitems];
        *v = (item_t){b, NULL, 0, 0, b->t_submit, true};
        enqueue(x, v, 1);
    } else {
        enqueue(x, b->items, b->nitems);
    }
}

int kvt_xfer_submit(kvt_xfer_t *x, unsigned src, unsigned dst, const kvt_xfer_copy_t *copies, size_t n,
                    uint64_t user, uint64_t *ticket) {
    int rc = validate(x, src, dst, copies, n);
    if (rc != KVT_OK) return rc;
    kvt_xfer_copy_t *sorted = sort_copies(copies, n, &rc);
    if (sorted == NULL) return rc;
    batch_t *b = build_batch(x, src, dst, sorted, n, user);
    kvt__free(sorted, n * sizeof(*sorted));
    if (b == NULL) return KVT_ENOMEM;
    publish(x, b, ticket);
    return KVT_OK;
}

/* ---- poll --------------------------------------------------------------------- */

int kvt_xfer_poll(kvt_xfer_t *x, kvt_xfer_done_t *out, size_t max, uint64_t timeout_ns) {
    if (x == NULL || (out == NULL && max > 0)) return KVT_EINVAL;
    return (int)kvt__doneq_poll(&x->done, out, max, timeout_ns);
}

uint64_t kvt_xfer_pending(kvt_xfer_t *x) { return x ? kvt__doneq_pending(&x->done) : 0; }

int kvt__xfer_set_faults(kvt_xfer_t *x, const kvt__xfer_faults_t *f) {
    if (x == NULL || (f && !(f->fail_p >= 0 && f->fail_p <= 1 && f->delay_p >= 0 && f->delay_p <= 1))) return KVT_EINVAL;
    pthread_mutex_lock(&x->fault_mu);
    if (f) x->faults = *f;
    else memset(&x->faults, 0, sizeof(x->faults));
    x->fault_count = 0;
    atomic_store(&x->faults_on, f != NULL);
    pthread_mutex_unlock(&x->fault_mu);
    return KVT_OK;
}

/* ---- create / destroy ----------------------------------------------------------- */

static void stop_workers(kvt_xfer_t *x, unsigned started) {
    for (unsigned t = 0; t < x->ntiers; t++) {
        pthread_mutex_lock(&x->q[t].mu);
        x->q[t].stop = true;
        pthread_cond_broadcast(&x->q[t].cv);
        pthread_mutex_unlock(&x->q[t].mu);
    }
    for (unsigned i = 0; i < started; i++) {
        worker_t *w = &x->workers[i];
        pthread_join(w->th, NULL);
        for (unsigned t = 0; t < x->ntiers; t++)
            if (w->ctx[t]) x->tiers[t]->ops->ctx_close(x->tiers[t], w->ctx[t]);
        kvt__free(w->spans, w->cap * sizeof(kvt__span_t));
    }
}

static void free_engine(kvt_xfer_t *x) {
    for (unsigned t = 0; t < x->ntiers; t++) {
        pthread_mutex_destroy(&x->q[t].mu);
        pthread_cond_destroy(&x->q[t].cv);
        for (unsigned u = 0; u < x->ntiers; u++) pthread_mutex_destroy(&x->pairs[t][u].mu);
    }
    for (unsigned t = 0; t < x->ntiers; t++) {
        for (size_t r = 0; x->registered[t] && r < x->tiers[t]->nregions; r++)
            if (x->registered[t][r]) x->device->ops->unregister_host(x->device, x->tiers[t]->regions[r].p);
        kvt__free(x->registered[t], x->registered[t] ? x->tiers[t]->nregions * sizeof(bool) : 0);
    }
    kvt__doneq_fini(&x->done);
    pthread_mutex_destroy(&x->fault_mu);
    kvt__free(x->workers, (size_t)x->nworkers * sizeof(worker_t));
    KVT_DELETE(x);
}

/* Copies into host memory (L2, private or node-shared) are backups: read
 * back only on a later hit, by which time they would have left the cache
 * anyway. Streaming stores skip the read-for-ownership and leave the cache
 * to the data the engine reads next; copies into L1 keep ordinary stores. */
static bool streams_into(const kvt_tier_t *d) { return d->cfg.kind == KVT_TIER_HOST || d->cfg.kind == KVT_TIER_SHM; }

unsigned kvt_xfer_copy_streams(void) { return kvt__copy_quarters() ? 4 : 1; }

int kvt_xfer_create(kvt_xfer_t **out, const kvt_xfer_config_t *user, kvt_tier_t *const *tiers, unsigned ntiers) {
    kvt_xfer_config_t full, *cfg = &full;
    kvt_xfer_config_default(&full);
    if (out == NULL || user == NULL || kvt__abi_in(&full, sizeof(full), user) != KVT_OK || tiers == NULL || ntiers < 2 ||
        ntiers > KVT_XFER_MAX_TIERS || cfg->threads == 0 || cfg->threads > 64 || cfg->max_batch_bytes == 0 ||
        cfg->max_batch_copies == 0)
        return KVT_EINVAL;
    for (unsigned t = 0; t < ntiers; t++)
        if (tiers[t] == NULL || tiers[t]->cfg.geom.layers != tiers[0]->cfg.geom.layers ||
            tiers[t]->cfg.geom.layer_bytes != tiers[0]->cfg.geom.layer_bytes)
            return KVT_EINVAL; /* pages must be the same shape everywhere */
    if (kvt__copy_init() != KVT_OK) return KVT_EINVAL; /* (timed here rather than in a copy: KVT_COPY_STREAMS bad) */
    for (unsigned t = 0; t < ntiers; t++)
        for (unsigned u = 0; u < t; u++)
            if (tiers[t] == tiers[u]) return KVT_EINVAL; /* a copy between its two indices would overlap itself */
    uint32_t spr = tiers[0]->cfg.geom.layers;
    if (cfg->max_batch_copies < spr) return KVT_EINVAL; /* one run of a layer_first tier must fit an item */
    kvt_xfer_t *x = KVT_NEW(kvt_xfer_t);
    if (x == NULL) return KVT_ENOMEM;
    for (unsigned s = 0; s < ntiers; s++)
        for (unsigned d = 0; d < ntiers; d++) {
            if (s == d) continue;
            kvt__plan_make(&x->plans[s][d], tiers[s], tiers[d]);
            x->stream[s][d] = streams_into(tiers[d]);
            if (kvt__plan_spans(&x->plans[s][d], 1) > cfg->max_batch_copies) { /* one page's copies must fit an item */
                KVT_DELETE(x);
                return KVT_EINVAL;
            }
        }
    x->cfg = *cfg;
    x->cfg.size = sizeof(x->cfg);
    x->ntiers = ntiers;
    memcpy(x->tiers, tiers, ntiers * sizeof(*tiers));
    for (unsigned t = 0; t < ntiers; t++) {
        pthread_mutex_init(&x->q[t].mu, NULL);
        pthread_cond_init(&x->q[t].cv, NULL);
        for (unsigned u = 0; u < ntiers; u++) {
            pthread_mutex_init(&x->pairs[t][u].mu, NULL);
            kvt_xfer_stats_t *st = &x->pairs[t][u].st;
            st->size = sizeof(*st);
            st->src = t;
            st->dst = u;
            kvt_hist_init(&st->queue_ns);
            kvt_hist_init(&st->copy_ns);
            kvt_hist_init(&st->e2e_ns);
        }
    }
    kvt__doneq_init(&x->done, offsetof(batch_t, link), offsetof(batch_t, done), sizeof(kvt_xfer_done_t), batch_free);
    pthread_mutex_init(&x->fault_mu, NULL);
    x->nworkers = ntiers * cfg->threads;
    x->workers = kvt__calloc(x->nworkers, sizeof(worker_t));
    if (x->workers == NULL) {
        free_engine(x);
        return KVT_ENOMEM;
    }
    for (unsigned t = 0; t < ntiers && x->device == NULL; t++)
        if (tiers[t]->ops->register_host) x->device = tiers[t];
    for (unsigned t = 0; x->device && t < ntiers; t++) {
        if (!tiers[t]->ops->host_visible || tiers[t]->nregions == 0) continue;
        x->registered[t] = kvt__calloc(tiers[t]->nregions, sizeof(bool));
        if (x->registered[t] == NULL) {
            free_engine(x);
            return KVT_ENOMEM;
        }
        for (size_t r = 0; r < tiers[t]->nregions; r++) /* DMA without it still works, staged: not an error */
            x->registered[t][r] = x->device->ops->register_host(x->device, tiers[t]->regions[r].p,
                                                                tiers[t]->regions[r].len) == KVT_OK;
    }
    unsigned started = 0;
    int rc = KVT_OK;
    for (unsigned i = 0; i < x->nworkers && rc == KVT_OK; i++) {
        worker_t *w = &x->workers[i];
        w->x = x;
        w->dst = i / cfg->threads;
        w->cap = cfg->max_batch_copies;
        w->spans = kvt__malloc(w->cap * sizeof(kvt__span_t));
        if (w->spans == NULL) rc = KVT_ENOMEM;
        else if (pthread_create(&w->th, NULL, worker_main, w) != 0) rc = KVT_EIO;
        else started++;
        if (rc != KVT_OK) kvt__free(w->spans, w->cap * sizeof(kvt__span_t));
    }
    if (rc != KVT_OK) {
        stop_workers(x, started);
        free_engine(x);
        return rc;
    }
    *out = x;
    return KVT_OK;
}

void kvt_xfer_destroy(kvt_xfer_t *x) {
    if (x == NULL) return;
    kvt__doneq_wait_landed(&x->done); /* every batch in flight */
    stop_workers(x, x->nworkers);
    free_engine(x); /* and the batches on the done queue or retired */
}

/* ---- statistics ----------------------------------------------------------------- */

int kvt_xfer_stats(kvt_xfer_t *x, unsigned src, unsigned dst, kvt_xfer_stats_t *out) {
    if (x == NULL || out == NULL || src >= x->ntiers || dst >= x->ntiers || src == dst) return KVT_EINVAL;
    pair_t *p = &x->pairs[src][dst];
    kvt_xfer_stats_t st;
    pthread_mutex_lock(&p->mu);
    st = p->st;
    pthread_mutex_unlock(&p->mu);
    st.size = sizeof(st);
    st.gbps = st.busy_ns ? (double)st.bytes / (double)st.busy_ns : 0;
    return kvt__abi_out(out, &st, sizeof(st));
}

/* Tier i's name as a metric name: [a-z0-9_] (upper case lowered, other
 * characters '_'), at most 24 characters, so that a pair's section,
 * "<src>_to_<dst>", stays within the emitter's 63. */
static void metric_part(const kvt_xfer_t *x, unsigned i, char out[32]) {
    size_t n = strnlen(x->tiers[i]->name, 24);
    memcpy(out, x->tiers[i]->name, n);
    out[n] = 0;
    for (char *c = out; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9'))) *c = (*c >= 'A' && *c <= 'Z') ? (char)(*c - 'A' + 'a') : '_';
}

static void section_name(char out[72], const char *src, const char *dst) { snprintf(out, 72, "%s_to_%s", src, dst); }

/* Whether two pairs' sections would be one: two tiers' parts alike, or
 * names with "_to_" in them ("a_to_b" to "c", "a" to "b_to_c"). */
static bool sections_alike(const kvt_xfer_t *x, char part[][32]) {
    char name[KVT_XFER_MAX_TIERS * (KVT_XFER_MAX_TIERS - 1)][72];
    unsigned k = 0;
    for (unsigned s = 0; s < x->ntiers; s++)
        for (unsigned d = 0; d < x->ntiers; d++)
            if (s != d) section_name(name[k++], part[s], part[d]); /* a tier to itself is no pair */
    for (unsigned i = 0; i < k; i++)
        for (unsigned j = i + 1; j < k; j++)
            if (strcmp(name[i], name[j]) == 0) return true;
    return false;
}

/* Every tier's part: its name's, with the tier's index after it where
 * another tier's would be the same (two "host" tiers: host0, host1); and
 * where two pairs' sections are still alike ("host", "host", "host0"; or
 * "_to_" in a name), every tier's name with its index, which makes each
 * pair's section its own (its last character names the destination, and
 * the character before "_to_<dst part>" the source). */
static void metric_tiers(const kvt_xfer_t *x, char out[][32]) {
    char plain[KVT_XFER_MAX_TIERS][32];
    _Static_assert(KVT_XFER_MAX_TIERS <= 10, "a tier index is one digit");
    for (unsigned i = 0; i < x->ntiers; i++) metric_part(x, i, plain[i]);
    for (int all = 0; all < 2; all++) {
        for (unsigned i = 0; i < x->ntiers; i++) {
            bool clash = all;
            for (unsigned j = 0; j < x->ntiers && !clash; j++) clash = j != i && strcmp(plain[i], plain[j]) == 0;
            snprintf(out[i], 32, clash ? "%s%u" : "%s", plain[i], i);
        }
        if (!sections_alike(x, out)) return;
    }
}

void kvt_xfer_emit(kvt_xfer_t *x, kvt_emitter_t *e) {
    char part[KVT_XFER_MAX_TIERS][32];
    if (x) metric_tiers(x, part);
    for (unsigned s = 0; x && s < x->ntiers; s++)
        for (unsigned d = 0; d < x->ntiers; d++) {
            pthread_mutex_lock(&x->pairs[s][d].mu);
            bool seen = x->pairs[s][d].seen;
            pthread_mutex_unlock(&x->pairs[s][d].mu);
            if (!seen) continue;
            kvt_xfer_stats_t st = {.size = sizeof(st)};
            kvt_xfer_stats(x, s, d, &st);
            char name[72];
            section_name(name, part[s], part[d]);
            kvt_emit_begin(e, name);
            KVT_EMIT_STATS(e, &st, KVT_XFER_STATS_FIELDS);
            kvt_emit_gauge(e, "gbps", st.gbps, "one worker's copy throughput while copying, GB/s");
            kvt_emit_hist(e, "queue_ns", &st.queue_ns, "submit to a worker starting the item");
            kvt_emit_hist(e, "copy_ns", &st.copy_ns, "time to copy one work item");
            kvt_emit_hist(e, "e2e_ns", &st.e2e_ns, "submit to batch completion");
            kvt_emit_end(e);
        }
}

kvt_tier_t *kvt__xfer_tier(const kvt_xfer_t *x, unsigned i) { return i < x->ntiers ? x->tiers[i] : NULL; }

bool kvt__xfer_checksums(const kvt_xfer_t *x) { return x->cfg.checksum; }
