#include "cli.h"

#include "kvtier/store.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

bool cli_parse_only = false;

void cli_init(cli_t *c, const char *cmd, int argc, char **argv) {
    memset(c, 0, sizeof(*c));
    c->cmd = cmd;
    c->argc = argc;
    c->argv = argv;
}

static void env_name(const char *name, char *out, size_t cap);

/* A refusal of an option the environment set names the variable too. */
static void verror(const cli_t *c, const char *fmt, va_list ap) {
    if (c->quiet) return;
    fprintf(stderr, "%s: ", c->cmd);
    if (c->flag) fprintf(stderr, "%s: ", c->flag);
    if (c->flag && cli_from_env(c, c->flag)) {
        char env[64];
        env_name(c->flag + 2, env, sizeof(env));
        fprintf(stderr, "(set by %s) ", env);
    }
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

int cli_error(const cli_t *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    verror(c, fmt, ap);
    va_end(ap);
    return -1;
}

int cli_usage(const cli_t *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    verror(c, fmt, ap);
    va_end(ap);
    return 2;
}

int cli_next(cli_t *c) {
    static char flagbuf[64];
    c->flag = NULL;
    c->value = NULL;
    c->inline_value = NULL;
    if (c->i >= c->argc) return 0;
    char *a = c->argv[c->i++];
    if (strcmp(a, "-h") == 0) { /* the short help every command also takes, not a path */
        c->flag = "--help";
        return 1;
    }
    if (strncmp(a, "--", 2) != 0 || a[2] == 0) {
        c->value = a;
        return 2;
    }
    char *eq = strchr(a, '=');
    if (eq) {
        size_t n = (size_t)(eq - a) < sizeof(flagbuf) - 1 ? (size_t)(eq - a) : sizeof(flagbuf) - 1;
        memcpy(flagbuf, a, n);
        flagbuf[n] = 0;
        c->flag = flagbuf;
        c->inline_value = eq + 1;
    } else {
        c->flag = a;
    }
    return 1;
}

bool cli_is(cli_t *c, const char *name) { return c->flag && strcmp(c->flag, name) == 0; }

int cli_flag(cli_t *c, bool *out) {
    const char *s = c->inline_value;
    if (s == NULL || strcmp(s, "1") == 0 || strcmp(s, "true") == 0 || strcmp(s, "yes") == 0) return *out = true, 0;
    if (strcmp(s, "0") == 0 || strcmp(s, "false") == 0 || strcmp(s, "no") == 0) return *out = false, 0;
    return cli_error(c, "'%s' is not one of 1|0|true|false|yes|no", s);
}

int cli_value(cli_t *c, const char **out) {
    if (c->inline_value) {
        c->value = c->inline_value;
    } else if (c->i < c->argc) {
        c->value = c->argv[c->i++];
    } else {
        return cli_error(c, "missing value");
    }
    *out = c->value;
    return 0;
}

/* Decimal digits only: strtoull alone would skip leading blanks and take a
 * minus sign, so that " -1" became 2^64 - 1. */
int cli_parse_u64(const char *s, uint64_t *out) {
    if (s == NULL || !isdigit((unsigned char)*s)) return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

int cli_parse_pair(const char *s, uint64_t *a, uint64_t *b) {
    char buf[64];
    const char *colon = s ? strchr(s, ':') : NULL;
    if (colon == NULL || (size_t)(colon - s) >= sizeof(buf)) return -1;
    memcpy(buf, s, (size_t)(colon - s));
    buf[colon - s] = 0;
    return cli_parse_u64(buf, a) || cli_parse_u64(colon + 1, b) ? -1 : 0;
}

void cli_json_stat(cJSON *o, const char *name, double v) {
    if (name[0] == 'l' && name[1] >= '1' && name[1] <= '3' && name[2] == '_') {
        cJSON *tiers = cJSON_GetObjectItemCaseSensitive(o, name + 3);
        if (tiers == NULL) tiers = cJSON_AddObjectToObject(o, name + 3);
        const char key[3] = {'l', name[1], 0};
        cJSON_AddNumberToObject(tiers, key, v);
        return;
    }
    cJSON_AddNumberToObject(o, name, v);
}

bool cli_env_pair(const char *name, uint64_t *a, uint64_t *b) {
    const char *v = getenv(name);
    return v && cli_parse_pair(v, a, b) == 0;
}

double cli_machine_memory(void) { return (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE); }

/* "a|b|c" */
static void join_choices(const char *const *choices, char *buf, size_t cap) {
    buf[0] = 0;
    for (int i = 0; choices[i]; i++) {
        if (i) strncat(buf, "|", cap - strlen(buf) - 1);
        strncat(buf, choices[i], cap - strlen(buf) - 1);
    }
}

/* The parsers behind both the flag helpers and the options table: each
 * takes the value text, and says what is allowed when it is refused. */
static int u64_in(cli_t *c, const char *s, uint64_t lo, uint64_t hi, const char *word, uint64_t word_value,
                  uint64_t *out) {
    uint64_t v;
    if (word && strcmp(s, word) == 0) return *out = word_value, 0;
    if (cli_parse_u64(s, &v) || v < lo || v > hi)
        return cli_error(c, "'%s' is not an integer in [%" PRIu64 ", %" PRIu64 "]%s%s%s", s, lo, hi,
                         word ? " or '" : "", word ? word : "", word ? "'" : "");
    *out = v;
    return 0;
}

static int double_in(cli_t *c, const char *s, double lo, double hi, bool lo_open, bool hi_open, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    /* decimal only (strtod also reads hex: 0x.8 is 0.5), and no sign where none is allowed (-0) */
    bool bad = !(isdigit((unsigned char)*s) || *s == '.' || *s == '-') || s[strspn(s, "0123456789.eE+-")] ||
               (*s == '-' && lo >= 0) || errno || *end || !isfinite(v) || (lo_open ? v <= lo : v < lo) ||
               (hi_open ? v >= hi : v > hi);
    if (bad)
        return cli_error(c, "'%s' is not a number in %c%g, %g%c", s, lo_open ? '(' : '[', lo, hi, hi_open ? ')' : ']');
    *out = v;
    return 0;
}

static int choice_in(cli_t *c, const char *s, const char *const *choices, int *out) {
    char allowed[512];
    for (int i = 0; choices[i]; i++)
        if (strcmp(s, choices[i]) == 0) return *out = i, 0;
    join_choices(choices, allowed, sizeof(allowed));
    return cli_error(c, "'%s' is not one of %s", s, allowed);
}

int cli_u64(cli_t *c, uint64_t lo, uint64_t hi, uint64_t *out) {
    const char *s = NULL;
    return cli_value(c, &s) ? -1 : u64_in(c, s, lo, hi, NULL, 0, out);
}

int cli_double(cli_t *c, double lo, double hi, bool lo_open, bool hi_open, double *out) {
    const char *s = NULL;
    return cli_value(c, &s) ? -1 : double_in(c, s, lo, hi, lo_open, hi_open, out);
}

int cli_choice(cli_t *c, const char *const *choices, int *out) {
    const char *s = NULL;
    return cli_value(c, &s) ? -1 : choice_in(c, s, choices, out);
}

int cli_u64_list(cli_t *c, uint64_t lo, uint64_t hi, uint64_t *out, size_t cap, size_t *n) {
    const char *s = NULL;
    if (cli_value(c, &s)) return -1;
    char buf[512];
    if (strlen(s) >= sizeof(buf)) return cli_error(c, "list too long");
    strcpy(buf, s);
    size_t k = 0;
    for (char *rest = buf, *tok; (tok = strsep(&rest, ",")) != NULL;) { /* (strtok would skip empty elements) */
        if (*tok == '\0') return cli_error(c, "'%s': expected a comma-separated list of integers (an element is empty)", s);
        if (k == cap) return cli_error(c, "at most %zu values", cap);
        if (u64_in(c, tok, lo, hi, NULL, 0, &out[k])) return -1;
        k++;
    }
    *n = k;
    return 0;
}

bool cli_from_env(const cli_t *c, const char *flag) {
    for (size_t i = 0; c->table && strncmp(flag, "--", 2) == 0 && i < 64 && c->table[i].name; i++)
        if (strcmp(flag + 2, c->table[i].name) == 0) return c->from_env >> i & 1;
    return false;
}

int cli_refuse_idle(cli_t *c, const cli_idle_t *rows, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (rows[i].set && !cli_from_env(c, rows[i].flag)) {
            c->flag = rows[i].flag;
            return cli_error(c, "%s", rows[i].needs);
        }
    return 0;
}

int cli_unknown(const cli_t *c) {
    if (c->flag) return cli_error(c, "unknown flag (see --help)");
    return cli_error(c, "unexpected argument '%s' (see --help)", c->value);
}

/* ---- options tables ---- */

static void env_name(const char *name, char *out, size_t cap) {
    size_t k = (size_t)snprintf(out, cap, "KVT_");
    for (const char *p = name; *p && k + 1 < cap; p++) out[k++] = *p == '-' ? '_' : (char)(*p >= 'a' && *p <= 'z' ? *p - 32 : *p);
    out[k] = 0;
}

/* Parses one value for opt; c->flag names it in messages. */
static int set_value(cli_t *c, const cli_opt_t *o, const char *s) {
    switch (o->type) {
    case OPT_FLAG: {
        if (strcmp(s, "1") == 0 || strcmp(s, "true") == 0 || strcmp(s, "yes") == 0) return *(bool *)o->dst = true, 0;
        if (strcmp(s, "0") == 0 || strcmp(s, "false") == 0 || strcmp(s, "no") == 0) return *(bool *)o->dst = false, 0;
        return cli_error(c, "'%s' is not one of 1|0|true|false|yes|no", s);
    }
    case OPT_U64: return u64_in(c, s, o->lo, o->hi, o->word, o->word_value, (uint64_t *)o->dst);
    case OPT_DOUBLE: return double_in(c, s, o->dlo, o->dhi, false, false, (double *)o->dst);
    case OPT_CHOICE: return choice_in(c, s, o->choices, (int *)o->dst);
    case OPT_TEXT:
        if (*s == 0) return cli_error(c, "empty value");
        *(const char **)o->dst = s;
        return 0;
    }
    return -1;
}

/* Each option the command line did not give (bit i of given: opts[i]) from
 * its environment variable; -1 at a bad value (quiet: skipped). */
static int apply_env(cli_t *c, const cli_opt_t *opts, uint64_t given, bool quiet) {
    char env[64];
    c->quiet = quiet;
    for (const cli_opt_t *o = opts; o->name; o++) {
        size_t i = (size_t)(o - opts);
        env_name(o->name, env, sizeof(env));
        const char *v = i < 64 && (given >> i & 1) ? NULL : getenv(env);
        if (v == NULL) continue;
        c->flag = env;
        if (set_value(c, o, v) != 0) {
            if (quiet) continue;
            return -1;
        }
        if (i < 64) c->from_env |= UINT64_C(1) << i;
    }
    c->quiet = false;
    c->flag = NULL;
    return 0;
}

/* The command line first, then each option it did not set from its
 * environment variable (the command line wins, and --help answers whatever
 * the environment holds). */
int cli_parse_table(cli_t *c, const cli_opt_t *opts, const char *usage, const char **positional) {
    uint64_t given = 0; /* bit i: opts[i] on the command line (tables hold fewer than 64) */
    *positional = NULL;
    c->table = opts;
    c->from_env = 0;
    int kind;
    while ((kind = cli_next(c)) != 0) {
        if (kind == 2) {
            if (*positional) return cli_unknown(c);
            *positional = c->value;
            continue;
        }
        if (cli_is(c, "--help")) {
            apply_env(c, opts, given, true); /* the defaults shown are the environment's */
            fputs(usage, stdout);
            cli_print_table(stdout, opts);
            return 1;
        }
        const cli_opt_t *o = opts;
        while (o->name && !(strncmp(c->flag, "--", 2) == 0 && strcmp(c->flag + 2, o->name) == 0)) o++;
        if (o->name == NULL) return cli_unknown(c);
        if (o - opts < 64) given |= UINT64_C(1) << (o - opts);
        if (o->type == OPT_FLAG && c->inline_value == NULL) {
            *(bool *)o->dst = true;
            continue;
        }
        const char *v = NULL;
        if (cli_value(c, &v) || set_value(c, o, v)) return -1;
    }
    return apply_env(c, opts, given, false);
}

void cli_print_table(FILE *f, const cli_opt_t *opts) {
    char env[64], def[64], allowed[256];
    fputs("\noptions (default; allowed; environment variable):\n", f);
    for (const cli_opt_t *o = opts; o->name; o++) {
        env_name(o->name, env, sizeof(env));
        allowed[0] = 0;
        switch (o->type) {
        case OPT_FLAG: snprintf(def, sizeof(def), "%s", *(bool *)o->dst ? "on" : "off"); break;
        case OPT_U64:
            if (o->word && *(uint64_t *)o->dst == o->word_value) snprintf(def, sizeof(def), "%s", o->word);
            else snprintf(def, sizeof(def), "%" PRIu64, *(uint64_t *)o->dst);
            snprintf(allowed, sizeof(allowed), "%" PRIu64 "..%" PRIu64 "%s%s", o->lo, o->hi, o->word ? " or " : "",
                     o->word ? o->word : "");
            break;
        case OPT_DOUBLE:
            snprintf(def, sizeof(def), "%g", *(double *)o->dst);
            snprintf(allowed, sizeof(allowed), "%g..%g", o->dlo, o->dhi);
            break;
        case OPT_CHOICE:
            snprintf(def, sizeof(def), "%s", o->choices[*(int *)o->dst]);
            join_choices(o->choices, allowed, sizeof(allowed));
            break;
        case OPT_TEXT: /* a store URL from the environment: never its password */
            kvt_store_url_redact(*(const char **)o->dst ? *(const char **)o->dst : "none", def, sizeof(def));
            break;
        }
        fprintf(f, "  --%s (%s%s%s; %s)\n      %s\n", o->name, def, allowed[0] ? "; " : "", allowed, env, o->help);
    }
}

void cli_print_json(cJSON *o) {
    char *txt = cJSON_Print(o);
    if (txt) puts(txt);
    cJSON_free(txt);
    cJSON_Delete(o);
}
