/* The stats emitter: record once, write as a table, JSON or Prometheus text.
 *
 * Building calls append entries to a flat list (begin/end bracket sections);
 * kvt_emitter_write walks the list once in the chosen format. Keeping the
 * list, rather than printing as we go, lets JSON be built through cJSON and
 * lets a failed allocation surface once, at write time.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kvtier/error.h"
#include "kvtier/stats.h"
#include "../core/mem-int.h"

#define NAME_MAX_LEN 63
#define MAX_DEPTH 16

typedef enum { ENT_BEGIN, ENT_END, ENT_COUNTER, ENT_GAUGE, ENT_HIST } ent_kind_t;

typedef struct hist_summary {
    uint64_t count, p50, p90, p99, p999, max;
    double mean;
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
    for (int i = 0; s && i < 3; i++)
        if (strcmp(s, names[i]) == 0) return *fmt = (kvt_fmt_t)i, KVT_OK;
    return KVT_EINVAL;
}

static int valid_name(const char *s) {
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > NAME_MAX_LEN) return 0;
    for (size_t i = 0; i < n; i++)
        if (!(islower((unsigned char)s[i]) || isdigit((unsigned char)s[i]) || s[i] == '_')) return 0;
    return 1;
}

int kvt_emitter_create(kvt_emitter_t **out, kvt_fmt_t fmt, const char *prefix) {
    if (out == NULL || (unsigned)fmt > KVT_FMT_PROM || !valid_name(prefix)) return KVT_EINVAL;
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
                              kvt_hist_mean(h)};
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

static void write_table(const kvt_emitter_t *e, FILE *f) {
    int depth = 0;
    for (size_t i = 0; i < e->n; i++) {
        const entry_t *x = &e->ent[i];
        int ind = 2 * depth, w = 34 - ind;
        switch (x->kind) {
        case ENT_BEGIN: fprintf(f, "%*s%s\n", ind, "", x->name), depth++; break;
        case ENT_END: depth--; break;
        case ENT_COUNTER: fprintf(f, "%*s%-*s %16llu\n", ind, "", w, x->name, (unsigned long long)x->v.u); break;
        case ENT_GAUGE: fprintf(f, "%*s%-*s %16.6g\n", ind, "", w, x->name, x->v.d); break;
        case ENT_HIST:
            fprintf(f, "%*s%-*s %16llu  p50 %llu  p90 %llu  p99 %llu  p999 %llu  max %llu\n", ind, "", w,
                    x->name, (unsigned long long)x->v.h.count, (unsigned long long)x->v.h.p50,
                    (unsigned long long)x->v.h.p90, (unsigned long long)x->v.h.p99,
                    (unsigned long long)x->v.h.p999, (unsigned long long)x->v.h.max);
            break;
        }
    }
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
        case ENT_COUNTER: ok = cJSON_AddNumberToObject(o, x->name, (double)x->v.u) != NULL; break;
        case ENT_GAUGE: ok = cJSON_AddNumberToObject(o, x->name, x->v.d) != NULL; break;
        case ENT_HIST:
            v = cJSON_AddObjectToObject(o, x->name);
            ok = v && cJSON_AddNumberToObject(v, "count", (double)x->v.h.count) &&
                 cJSON_AddNumberToObject(v, "mean", x->v.h.mean) &&
                 cJSON_AddNumberToObject(v, "p50", (double)x->v.h.p50) &&
                 cJSON_AddNumberToObject(v, "p90", (double)x->v.h.p90) &&
                 cJSON_AddNumberToObject(v, "p99", (double)x->v.h.p99) &&
                 cJSON_AddNumberToObject(v, "p999", (double)x->v.h.p999) &&
                 cJSON_AddNumberToObject(v, "max", (double)x->v.h.max);
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

static void prom_header(FILE *f, const char *full, const entry_t *x, const char *type) {
    if (x->help) {
        fprintf(f, "# HELP %s ", full);
        for (const char *c = x->help; *c; c++) { /* escape per the text format */
            if (*c == '\\') fputs("\\\\", f);
            else if (*c == '\n') fputs("\\n", f);
            else fputc(*c, f);
        }
        fputc('\n', f);
    }
    fprintf(f, "# TYPE %s %s\n", full, type);
}

static void write_prom(const kvt_emitter_t *e, FILE *f) {
    char path[(NAME_MAX_LEN + 1) * (MAX_DEPTH + 2)];
    size_t len[MAX_DEPTH + 2];
    int depth = 0;
    len[0] = (size_t)snprintf(path, sizeof(path), "%s", e->prefix);
    for (size_t i = 0; i < e->n; i++) {
        const entry_t *x = &e->ent[i];
        char full[sizeof(path) + NAME_MAX_LEN + 2];
        if (x->kind == ENT_END) {
            depth--;
            path[len[depth]] = 0;
            continue;
        }
        snprintf(full, sizeof(full), "%s_%s", path, x->name);
        switch (x->kind) {
        case ENT_BEGIN: {
            size_t at = len[depth];
            len[++depth] = at + (size_t)snprintf(path + at, sizeof(path) - at, "_%s", x->name);
            break;
        }
        case ENT_COUNTER:
            prom_header(f, full, x, "counter");
            fprintf(f, "%s %llu\n", full, (unsigned long long)x->v.u);
            break;
        case ENT_GAUGE:
            prom_header(f, full, x, "gauge");
            fprintf(f, "%s %.17g\n", full, x->v.d);
            break;
        case ENT_HIST: {
            const hist_summary_t *h = &x->v.h;
            const struct { const char *q; uint64_t v; } qs[] = {
                {"0.5", h->p50}, {"0.9", h->p90}, {"0.99", h->p99}, {"0.999", h->p999}, {"1", h->max}};
            prom_header(f, full, x, "summary");
            for (size_t k = 0; k < sizeof(qs) / sizeof(qs[0]); k++)
                fprintf(f, "%s{quantile=\"%s\"} %llu\n", full, qs[k].q, (unsigned long long)qs[k].v);
            fprintf(f, "%s_sum %.17g\n%s_count %llu\n", full, h->mean * (double)h->count, full,
                    (unsigned long long)h->count);
            break;
        }
        default: break;
        }
    }
}

int kvt_emitter_write(kvt_emitter_t *e, FILE *f) {
    if (e == NULL || f == NULL) return KVT_EINVAL;
    if (e->err) return e->err;
    if (check_balance(e) != KVT_OK) return KVT_EINVAL;
    int rc = KVT_OK;
    switch (e->fmt) {
    case KVT_FMT_TABLE: write_table(e, f); break;
    case KVT_FMT_JSON: rc = write_json(e, f); break;
    case KVT_FMT_PROM: write_prom(e, f); break;
    }
    if (rc == KVT_OK && ferror(f)) rc = KVT_EIO;
    return rc;
}
