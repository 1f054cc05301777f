/* The stats emitter: record once, write as a table, JSON or Prometheus text.
 *
 * Building calls append entries to a flat list (begin/end bracket sections);
 * kvt_emitter_write walks the list once in the chosen format. Keeping the
 * list, rather than printing as we go, lets JSON be built through cJSON and
 * lets a failed allocation surface once, at write time.
 *
 * Prometheus text follows Prometheus's naming conventions, which the table
 * and JSON do not need (promtool check metrics holds us to them):
 *
 *   emitted as             table / JSON name     Prometheus family
 *   counter                reserves              kvtier_alloc_reserves_total
 *   counter in ns          busy_ns               kvtier_..._busy_seconds_total (value / 1e9)
 *   counter in µs          wait_micros           kvtier_..._wait_seconds_total (value / 1e6)
 *   gauge                  free_pages            kvtier_alloc_free_pages
 *   gauge in ns            x_ns                  kvtier_..._x_seconds (value / 1e9)
 *   histogram (ns)         e2e_ns                kvtier_..._e2e_seconds, TYPE histogram
 *
 * Sections are name prefixes, joined by '_'. A histogram's buckets are the
 * fixed le set below, in seconds, so histograms from many processes add up.
 * A log-linear bucket counts towards le only if its whole range is <= le:
 * no count ever includes a sample above its le, and the one bucket that
 * straddles le (at most 1/64 of le wide) counts from the next le up, so a
 * sample within 1.6 % below an le may be reported under the next one.
 */
#include <inttypes.h>
#include <locale.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kvtier/error.h"
#include "kvtier/stats.h"
#include "../core/mem-int.h"

#define NAME_MAX_LEN 63
#define MAX_DEPTH 16
#define FULL_MAX ((NAME_MAX_LEN + 1) * (MAX_DEPTH + 2) + 16) /* prefix, sections, name and suffixes */

/* The Prometheus le set: 1-2-5 from 1 us to 1000 s, written as Go's client
 * writes them (strconv 'g', shortest). */
static const struct {
    uint64_t ns;
    const char *le;
} prom_le[] = {
    {1000ull, "1e-06"},       {2000ull, "2e-06"},       {5000ull, "5e-06"},       {10000ull, "1e-05"},
    {20000ull, "2e-05"},      {50000ull, "5e-05"},      {100000ull, "0.0001"},    {200000ull, "0.0002"},
    {500000ull, "0.0005"},    {1000000ull, "0.001"},    {2000000ull, "0.002"},    {5000000ull, "0.005"},
    {10000000ull, "0.01"},    {20000000ull, "0.02"},    {50000000ull, "0.05"},    {100000000ull, "0.1"},
    {200000000ull, "0.2"},    {500000000ull, "0.5"},    {1000000000ull, "1"},     {2000000000ull, "2"},
    {5000000000ull, "5"},     {10000000000ull, "10"},   {20000000000ull, "20"},   {50000000000ull, "50"},
    {100000000000ull, "100"}, {200000000000ull, "200"}, {500000000000ull, "500"}, {1000000000000ull, "1000"},
};
#define PROM_LE_N (sizeof(prom_le) / sizeof(prom_le[0]))

typedef enum { ENT_BEGIN, ENT_END, ENT_COUNTER, ENT_GAUGE, ENT_HIST } ent_kind_t;

typedef struct hist_summary {
    uint64_t count, p50, p90, p99, p999, max;
    double mean;
    uint64_t sum;            /* ns */
    uint64_t le[PROM_LE_N]; /* samples in the buckets wholly <= prom_le[i] */
} hist_summary_t;

typedef struct entry {
    ent_kind_t kind;
    char name[NAME_MAX_LEN + 1];
    char *help; /* owned copy, may be NULL */
    union {
        uint64_t u;
        double d;
        hist_summary_t h;
    } v;
} entry_t;

struct kvt_emitter {
    kvt_fmt_t fmt;
    char prefix[NAME_MAX_LEN + 1];
    entry_t *ent;
    size_t n, cap;
    int err; /* first building error */
};

int kvt_fmt_parse(const char *s, kvt_fmt_t *fmt) {
    static const char *names[] = {"table", "json", "prom"};
    for (int i = 0; s && fmt && i < 3; i++)
        if (strcmp(s, names[i]) == 0) return *fmt = (kvt_fmt_t)i, KVT_OK;
    return KVT_EINVAL;
}

static int valid_name(const char *s) {
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > NAME_MAX_LEN) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_')) return 0;
    return 1;
}

int kvt_emitter_create(kvt_emitter_t **out, kvt_fmt_t fmt, const char *prefix) {
    if (out == NULL || (unsigned)fmt > KVT_FMT_PROM || !valid_name(prefix)) return KVT_EINVAL;
    if (fmt == KVT_FMT_PROM && prefix[0] >= '0' && prefix[0] <= '9') return KVT_EINVAL; /* not a metric name */
    kvt_emitter_t *e = KVT_NEW(kvt_emitter_t);
    if (e == NULL) return KVT_ENOMEM;
    e->fmt = fmt;
    strcpy(e->prefix, prefix);
    *out = e;
    return KVT_OK;
}

static void free_help(entry_t *x) {
    if (x->help) kvt__free(x->help, strlen(x->help) + 1);
}

void kvt_emitter_destroy(kvt_emitter_t *e) {
    if (e == NULL) return;
    for (size_t i = 0; i < e->n; i++) free_help(&e->ent[i]);
    kvt__free(e->ent, e->cap * sizeof(entry_t));
    KVT_DELETE(e);
}

static entry_t *push(kvt_emitter_t *e, ent_kind_t kind, const char *name, const char *help) {
    if (e == NULL || e->err) return NULL;
    if (kind != ENT_END && !valid_name(name)) {
        e->err = KVT_EINVAL;
        return NULL;
    }
    if (e->n == e->cap) {
        size_t ncap = e->cap ? e->cap * 2 : 32;
        entry_t *ne = kvt__realloc(e->ent, e->cap * sizeof(entry_t), ncap * sizeof(entry_t));
        if (ne == NULL) {
            e->err = KVT_ENOMEM;
            return NULL;
        }
        e->ent = ne;
        e->cap = ncap;
    }
    entry_t *x = &e->ent[e->n];
    memset(x, 0, sizeof(*x));
    x->kind = kind;
    if (name) strcpy(x->name, name);
    if (help) {
        size_t len = strlen(help) + 1;
        x->help = kvt__malloc(len);
        if (x->help == NULL) {
            e->err = KVT_ENOMEM;
            return NULL;
        }
        memcpy(x->help, help, len);
    }
    e->n++;
    return x;
}

void kvt_emit_begin(kvt_emitter_t *e, const char *section) { push(e, ENT_BEGIN, section, NULL); }
void kvt_emit_end(kvt_emitter_t *e) { push(e, ENT_END, NULL, NULL); }

void kvt_emit_counter(kvt_emitter_t *e, const char *name, uint64_t v, const char *help) {
    entry_t *x = push(e, ENT_COUNTER, name, help);
    if (x) x->v.u = v;
}

void kvt_emit_gauge(kvt_emitter_t *e, const char *name, double v, const char *help) {
    entry_t *x = push(e, ENT_GAUGE, name, help);
    if (x) x->v.d = v;
}

void kvt_emit_hist(kvt_emitter_t *e, const char *name, const kvt_hist_t *h, const char *help) {
    entry_t *x = push(e, ENT_HIST, name, help);
    if (x == NULL) return;
    x->v.h = (hist_summary_t){h->count,
                              kvt_hist_percentile(h, 0.50),
                              kvt_hist_percentile(h, 0.90),
                              kvt_hist_percentile(h, 0.99),
                              kvt_hist_percentile(h, 0.999),
                              h->count ? h->max : 0,
                              kvt_hist_mean(h),
                              h->sum,
                              {0}};
    uint64_t seen = 0;
    size_t i = 0;
    for (unsigned b = 0; b < KVT_HIST_BUCKETS && i < PROM_LE_N; b++) {
        uint64_t lo, hi;
        kvt_hist_bucket_range(b, &lo, &hi);
        for (; i < PROM_LE_N && hi > prom_le[i].ns; i++) x->v.h.le[i] = seen;
        seen += h->bucket[b];
    }
    for (; i < PROM_LE_N; i++) x->v.h.le[i] = seen;
}

/* ---- writers ---- */

static int check_balance(const kvt_emitter_t *e) {
    int depth = 0;
    for (size_t i = 0; i < e->n; i++) {
        depth += e->ent[i].kind == ENT_BEGIN ? 1 : e->ent[i].kind == ENT_END ? -1 : 0;
        if (depth < 0 || depth > MAX_DEPTH) return KVT_EINVAL;
    }
    return depth == 0 ? KVT_OK : KVT_EINVAL;
}

typedef struct sibling {
    size_t parent; /* the entry index of the section holding it; SIZE_MAX: the top */
    const char *name;
} sibling_t;

static int cmp_sibling(const void *a, const void *b) {
    const sibling_t *x = a, *y = b;
    if (x->parent != y->parent) return x->parent < y->parent ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Two entries of one section named alike (a section and a counter
 * included) would be two keys of one JSON object, which readers resolve by
 * dropping one, and one name twice in the table: refused in every format. */
static int check_siblings(const kvt_emitter_t *e) {
    sibling_t *s = kvt__calloc(e->n + 1, sizeof(*s));
    if (s == NULL) return KVT_ENOMEM;
    size_t open[MAX_DEPTH + 1], n = 0;
    int depth = 0, rc = KVT_OK;
    open[0] = SIZE_MAX;
    for (size_t i = 0; i < e->n; i++) { /* balanced: check_balance ran first */
        const entry_t *x = &e->ent[i];
        if (x->kind == ENT_END) {
            depth--;
            continue;
        }
        s[n++] = (sibling_t){open[depth], x->name};
        if (x->kind == ENT_BEGIN) open[++depth] = i;
    }
    qsort(s, n, sizeof(*s), cmp_sibling);
    for (size_t i = 1; i < n && rc == KVT_OK; i++)
        if (cmp_sibling(&s[i - 1], &s[i]) == 0) rc = KVT_EINVAL;
    kvt__free(s, (e->n + 1) * sizeof(*s));
    return rc;
}

static void fmt_double(char *out, size_t cap, double v);

static void write_table(const kvt_emitter_t *e, FILE *f) {
    char v[48];
    int depth = 0;
    for (size_t i = 0; i < e->n; i++) {
        const entry_t *x = &e->ent[i];
        int ind = 2 * depth, w = 34 - ind;
        switch (x->kind) {
        case ENT_BEGIN: fprintf(f, "%*s%s\n", ind, "", x->name), depth++; break;
        case ENT_END: depth--; break;
        case ENT_COUNTER: fprintf(f, "%*s%-*s %16llu\n", ind, "", w, x->name, (unsigned long long)x->v.u); break;
        case ENT_GAUGE: fmt_double(v, sizeof(v), x->v.d), fprintf(f, "%*s%-*s %16s\n", ind, "", w, x->name, v); break;
        case ENT_HIST:
            fprintf(f, "%*s%-*s %16llu  p50 %llu  p90 %llu  p99 %llu  p999 %llu  max %llu\n", ind, "", w,
                    x->name, (unsigned long long)x->v.h.count, (unsigned long long)x->v.h.p50,
                    (unsigned long long)x->v.h.p90, (unsigned long long)x->v.h.p99,
                    (unsigned long long)x->v.h.p999, (unsigned long long)x->v.h.max);
            break;
        }
    }
}

/* A uint64 as its digits: a JSON number through a double (cJSON's) loses
 * digits from 2^53 on, and cJSON prints 15 significant digits at first. */
static cJSON *add_u64(cJSON *o, const char *name, uint64_t v) {
    char txt[24];
    snprintf(txt, sizeof(txt), "%" PRIu64, v);
    return cJSON_AddRawToObject(o, name, txt);
}

/* A double as fmt_double writes it (cJSON's own loses digits or reads back
 * as another double); NaN and the infinities, which JSON has not, as null
 * (as cJSON writes them). */
static cJSON *add_double(cJSON *o, const char *name, double v) {
    char txt[48];
    if (!isfinite(v)) return cJSON_AddNullToObject(o, name);
    fmt_double(txt, sizeof(txt), v);
    return cJSON_AddRawToObject(o, name, txt);
}

static int write_json(const kvt_emitter_t *e, FILE *f) {
    cJSON *stack[MAX_DEPTH + 1];
    int depth = 0, ok = 1;
    stack[0] = cJSON_CreateObject();
    if (stack[0] == NULL) return KVT_ENOMEM;
    for (size_t i = 0; i < e->n && ok; i++) {
        const entry_t *x = &e->ent[i];
        cJSON *o = stack[depth], *v = NULL;
        switch (x->kind) {
        case ENT_BEGIN:
            v = cJSON_AddObjectToObject(o, x->name);
            ok = v != NULL;
            if (ok) stack[++depth] = v;
            break;
        case ENT_END: depth--; break;
        case ENT_COUNTER: ok = add_u64(o, x->name, x->v.u) != NULL; break;
        case ENT_GAUGE: ok = add_double(o, x->name, x->v.d) != NULL; break;
        case ENT_HIST:
            v = cJSON_AddObjectToObject(o, x->name);
            ok = v && add_u64(v, "count", x->v.h.count) && add_double(v, "mean", x->v.h.mean) &&
                 add_u64(v, "p50", x->v.h.p50) && add_u64(v, "p90", x->v.h.p90) && add_u64(v, "p99", x->v.h.p99) &&
                 add_u64(v, "p999", x->v.h.p999) && add_u64(v, "max", x->v.h.max);
            break;
        }
    }
    char *txt = ok ? cJSON_Print(stack[0]) : NULL;
    cJSON_Delete(stack[0]);
    if (txt == NULL) return KVT_ENOMEM;
    int rc = fprintf(f, "%s\n", txt) < 0 ? KVT_EIO : KVT_OK;
    cJSON_free(txt);
    return rc;
}

/* ---- Prometheus text ---- */

static void prom_header(FILE *f, const char *family, const entry_t *x, const char *type) {
    if (x->help) {
        fprintf(f, "# HELP %s ", family);
        for (const char *c = x->help; *c; c++) { /* escape per the text format */
            if (*c == '\\') fputs("\\\\", f);
            else if (*c == '\n') fputs("\\n", f);
            else fputc(*c, f);
        }
        fputc('\n', f);
    }
    fprintf(f, "# TYPE %s %s\n", family, type);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* The unit of an entry's values, as the decimal digits of a second it
 * keeps: written in seconds (Prometheus's base unit), or as they are. */
enum { UNIT_AS_IS = 0, UNIT_US = 6, UNIT_NS = 9 };

/* The entry's family name under `path` (the table at the top of the file);
 * returns its unit. */
static int prom_family(char *out, size_t cap, const char *path, const entry_t *x) {
    int unit = strcmp(x->name, "ns") == 0 || ends_with(x->name, "_ns") ? UNIT_NS
               : ends_with(x->name, "_micros")                          ? UNIT_US
                                                                          : UNIT_AS_IS;
    int stem = (int)strlen(x->name) - (unit == UNIT_NS ? 2 : unit == UNIT_US ? 6 : 0); /* keeps the '_' */
    const char *suffix = unit != UNIT_AS_IS ? "seconds" : x->kind == ENT_HIST ? "_seconds" : "";
    const char *total = x->kind == ENT_COUNTER && !ends_with(x->name, "_total") ? "_total" : "";
    snprintf(out, cap, "%s_%.*s%s%s", path, stem, x->name, suffix, total);
    return x->kind == ENT_HIST ? UNIT_NS : unit;
}

/* Calls fn on every counter, gauge and histogram with its family name. */
typedef int (*prom_fn_t)(void *arg, const entry_t *x, const char *family, int unit);

static int prom_walk(const kvt_emitter_t *e, prom_fn_t fn, void *arg) {
    char path[FULL_MAX], family[FULL_MAX + NAME_MAX_LEN + 16];
    size_t len[MAX_DEPTH + 2];
    int depth = 0, rc = KVT_OK;
    len[0] = (size_t)snprintf(path, sizeof(path), "%s", e->prefix);
    for (size_t i = 0; i < e->n && rc == KVT_OK; i++) {
        const entry_t *x = &e->ent[i];
        if (x->kind == ENT_END) {
            path[len[--depth]] = 0;
        } else if (x->kind == ENT_BEGIN) {
            size_t at = len[depth];
            len[++depth] = at + (size_t)snprintf(path + at, sizeof(path) - at, "_%s", x->name);
        } else {
            int unit = prom_family(family, sizeof(family), path, x);
            rc = fn(arg, x, family, unit);
        }
    }
    return rc;
}

typedef struct names {
    char **s;
    size_t n;
} names_t;

/* The family's name, and a histogram's series names too (_bucket, _sum,
 * _count): a gauge named like one of them is a second series of that name. */
static int collect_name(void *arg, const entry_t *x, const char *family, int unit) {
    (void)unit;
    static const char *const SERIES[] = {"", "_bucket", "_sum", "_count"};
    names_t *c = arg;
    for (int k = 0; k < (x->kind == ENT_HIST ? 4 : 1); k++) {
        size_t len = strlen(family) + strlen(SERIES[k]) + 1;
        char *s = kvt__malloc(len);
        if (s == NULL) return KVT_ENOMEM;
        snprintf(s, len, "%s%s", family, SERIES[k]);
        c->s[c->n++] = s;
    }
    return KVT_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* A family written twice makes the whole text unparseable (a second TYPE
 * line), and the renaming can make two names one (busy_ns, busy_seconds); so
 * does a series of one family named as another family (a gauge lat_count
 * beside a histogram lat). */
static int prom_check_unique(const kvt_emitter_t *e) {
    names_t c = {kvt__calloc(4 * e->n + 1, sizeof(char *)), 0};
    if (c.s == NULL) return KVT_ENOMEM;
    int rc = prom_walk(e, collect_name, &c);
    if (rc == KVT_OK) {
        qsort(c.s, c.n, sizeof(char *), cmp_str);
        for (size_t i = 1; i < c.n && rc == KVT_OK; i++)
            if (strcmp(c.s[i - 1], c.s[i]) == 0) rc = KVT_EINVAL;
    }
    for (size_t i = 0; i < c.n; i++) kvt__free(c.s[i], strlen(c.s[i]) + 1);
    kvt__free(c.s, (4 * e->n + 1) * sizeof(char *));
    return rc;
}

/* A count of 10^-digits seconds as exact decimal seconds: 5050 ns ->
 * "0.00000505". */
static void fmt_seconds(char *out, size_t cap, uint64_t v, int digits) {
    uint64_t one = digits == UNIT_NS ? 1000000000u : 1000000u;
    int n = snprintf(out, cap, "%llu.%0*llu", (unsigned long long)(v / one), digits, (unsigned long long)(v % one));
    while (n > 0 && out[n - 1] == '0') out[--n] = 0;
    if (n > 0 && out[n - 1] == '.') out[--n] = 0;
}

/* Integers as integers, else the shortest text that reads back as v; NaN
 * and infinities as Prometheus spells them. With a '.' whatever the
 * process's LC_NUMERIC (printf and strtod both follow it). */
static void fmt_double(char *out, size_t cap, double v) {
    if (isnan(v)) snprintf(out, cap, "NaN");
    else if (isinf(v)) snprintf(out, cap, v > 0 ? "+Inf" : "-Inf");
    else if (v == floor(v) && fabs(v) < 9007199254740992.0) snprintf(out, cap, "%.0f", v); /* below 2^53: exact */
    else {
        for (int p = 1; p <= 17; p++)
            if (snprintf(out, cap, "%.*g", p, v), strtod(out, NULL) == v) break;
        const char *point = localeconv()->decimal_point;
        char *at = point[0] && point[1] == 0 && point[0] != '.' ? strchr(out, point[0]) : NULL;
        if (at) *at = '.';
    }
}

static int prom_write_one(void *arg, const entry_t *x, const char *family, int unit) {
    FILE *f = arg;
    char v[48];
    switch (x->kind) {
    case ENT_COUNTER:
        if (unit) fmt_seconds(v, sizeof(v), x->v.u, unit);
        else snprintf(v, sizeof(v), "%llu", (unsigned long long)x->v.u);
        prom_header(f, family, x, "counter");
        fprintf(f, "%s %s\n", family, v);
        break;
    case ENT_GAUGE:
        fmt_double(v, sizeof(v), unit == UNIT_NS ? x->v.d / 1e9 : unit == UNIT_US ? x->v.d / 1e6 : x->v.d);
        prom_header(f, family, x, "gauge");
        fprintf(f, "%s %s\n", family, v);
        break;
    case ENT_HIST: {
        const hist_summary_t *h = &x->v.h;
        prom_header(f, family, x, "histogram");
        for (size_t k = 0; k < PROM_LE_N; k++)
            fprintf(f, "%s_bucket{le=\"%s\"} %llu\n", family, prom_le[k].le, (unsigned long long)h->le[k]);
        fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n", family, (unsigned long long)h->count);
        fmt_seconds(v, sizeof(v), h->sum, UNIT_NS);
        fprintf(f, "%s_sum %s\n%s_count %llu\n", family, v, family, (unsigned long long)h->count);
        break;
    }
    default: break;
    }
    return KVT_OK;
}

static int write_prom(const kvt_emitter_t *e, FILE *f) {
    int rc = prom_check_unique(e);
    return rc == KVT_OK ? prom_walk(e, prom_write_one, f) : rc;
}

int kvt_emitter_write(kvt_emitter_t *e, FILE *f) {
    if (e == NULL || f == NULL) return KVT_EINVAL;
    if (e->err) return e->err;
    if (check_balance(e) != KVT_OK) return KVT_EINVAL;
    int rc = check_siblings(e);
    if (rc != KVT_OK) return rc;
    switch (e->fmt) {
    case KVT_FMT_TABLE: write_table(e, f); break;
    case KVT_FMT_JSON: rc = write_json(e, f); break;
    case KVT_FMT_PROM: rc = write_prom(e, f); break;
    }
    if (rc == KVT_OK && ferror(f)) rc = KVT_EIO;
    return rc;
}
