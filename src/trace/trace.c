/* Mooncake traces (kvtier/trace.h): the strict JSONL parser and the trace's
 * storage. cJSON reads each line; what it accepts that a trace must not have
 * (control bytes, bytes that are not UTF-8, \u0000, numbers such as 007,
 * nesting past its limit, content after the object, duplicate keys) is
 * refused here, each with its own message. */
#include "kvtier/trace.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include <cjson/cJSON.h>

#include "kvtier/error.h"
#include "../core/mem-int.h"

void kvt_trace_free(kvt_trace_t *t) {
    if (t == NULL) return;
    for (size_t i = 0; i < t->n; i++) kvt__free(t->req[i].hash_ids, t->req[i].nblocks * sizeof(uint32_t));
    kvt__free(t->req, t->cap * sizeof(kvt_trace_req_t));
    memset(t, 0, sizeof(*t));
}

/* Takes r (its ids the trace's from now on), or KVT_ENOMEM with t unchanged. */
static int push(kvt_trace_t *t, const kvt_trace_req_t *r) {
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 1024;
        kvt_trace_req_t *nr = kvt__realloc(t->req, t->cap * sizeof(*nr), cap * sizeof(*nr));
        if (nr == NULL) return KVT_ENOMEM;
        t->req = nr;
        t->cap = cap;
    }
    t->req[t->n++] = *r;
    t->input_tokens += r->input_length;
    if (r->nblocks > t->max_blocks) t->max_blocks = r->nblocks;
    return KVT_OK;
}

static bool fits(uint64_t length, uint32_t nblocks) {
    return nblocks > 0 && length > (uint64_t)(nblocks - 1) * KVT_TRACE_BLOCK_TOKENS &&
           length <= (uint64_t)nblocks * KVT_TRACE_BLOCK_TOKENS;
}

int kvt_trace_append(kvt_trace_t *t, const kvt_trace_req_t *r) {
    if (t == NULL || r == NULL || r->hash_ids == NULL || !fits(r->input_length, r->nblocks)) return KVT_EINVAL;
    kvt_trace_req_t c = *r;
    if ((c.hash_ids = kvt__malloc(r->nblocks * sizeof(uint32_t))) == NULL) return KVT_ENOMEM;
    memcpy(c.hash_ids, r->hash_ids, r->nblocks * sizeof(uint32_t));
    int rc = push(t, &c);
    if (rc != KVT_OK) kvt__free(c.hash_ids, r->nblocks * sizeof(uint32_t));
    return rc;
}

/* ---- one line ---- */

static int line_error(char *err, size_t errlen, int rc, const char *name, size_t line, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static int line_error(char *err, size_t errlen, int rc, const char *name, size_t line, const char *fmt, ...) {
    int n = snprintf(err, errlen, "%s:%zu: ", name, line);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < errlen) vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return rc;
}

/* A JSON number that is a whole number in [0, max]. */
static int whole(const cJSON *v, double max, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= max) || floor(d) != d) return -1;
    *out = (uint64_t)d;
    return 0;
}

/* The length of the UTF-8 character at s (at most n bytes), or 0 when it
 * is not one: an overlong form, a surrogate, past U+10FFFF, cut short. */
static size_t utf8_char(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t k = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
    if (k == 0 || c > 0xF4 || n < k) return 0;
    for (size_t i = 1; i < k; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    if ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] > 0x9F) || (c == 0xF0 && s[1] < 0x90) ||
        (c == 0xF4 && s[1] > 0x8F))
        return 0;
    return k;
}

/* The length of the JSON number at s (n bytes on), 0 when the run of
 * number characters there is not one (-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?:
 * cJSON's strtod also takes 007 and 5.). */
static size_t json_number(const char *s, size_t n) {
    size_t i = 0, d;
    if (i < n && s[i] == '-') i++;
    if (i < n && s[i] == '0') i++;
    else if (i < n && s[i] >= '1' && s[i] <= '9')
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    else return 0;
    if (i < n && s[i] == '.') {
        for (d = ++i; i < n && s[i] >= '0' && s[i] <= '9';) i++;
        if (i == d) return 0;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        if (++i < n && (s[i] == '+' || s[i] == '-')) i++;
        for (d = i; i < n && s[i] >= '0' && s[i] <= '9';) i++;
        if (i == d) return 0;
    }
    return i < n && s[i] && strchr("0123456789+-.eE", s[i]) ? 0 : i; /* (more of a number: 01, 1.2.3, 1e5e5) */
}

/* Whether the number at s (k bytes of JSON's grammar) is not a whole number
 * while the double it reads as is one (0.99999999999999999 reads as 1, 1e-400
 * as 0): a trace's integers must not be rounded into being. *oom when the
 * copy strtod needs could not be made. */
static bool rounds_to_whole(const char *s, size_t k, bool *oom) {
    size_t i = s[0] == '-', j = i;
    while (j < k && isdigit((unsigned char)s[j])) j++;
    size_t nint = j - i, fs = j, nfrac = 0;
    if (j < k && s[j] == '.') {
        for (fs = ++j; j < k && isdigit((unsigned char)s[j]);) j++;
        nfrac = j - fs;
    }
    long e = 0; /* the exponent; once past k it moves the point past every digit, and grows no more */
    if (j < k) {
        bool neg = s[++j] == '-';
        if (s[j] == '-' || s[j] == '+') j++;
        for (; j < k; j++)
            if (e <= (long)k) e = e * 10 + (s[j] - '0');
        if (neg) e = -e;
    }
    /* whole when every digit at or past the decimal point, once the exponent moved it, is 0 */
    long point = (long)nint + e;
    bool whole = true;
    for (size_t t = point > 0 ? (size_t)point : 0; t < nint + nfrac && whole; t++)
        whole = (t < nint ? s[i + t] : s[fs + t - nint]) == '0';
    if (whole) return false;
    char buf[128], *z = k < sizeof(buf) ? buf : kvt__malloc(k + 1);
    if (z == NULL) return *oom = true, false;
    memcpy(z, s, k);
    z[k] = '\0';
    double d = strtod(z, NULL);
    if (z != buf) kvt__free(z, k + 1);
    return floor(d) == d;
}

/* What strict JSON refuses that cJSON takes, found before it reads the line:
 * a control byte outside a string (cJSON skips every byte <= 0x20) or a raw
 * one inside, \u0000 or a \u without four hex digits (it reads both as a
 * NUL, which cuts a key short: "timestamp\u0000x" read as "timestamp"), an
 * escape JSON has not, bytes that are not UTF-8, a number outside JSON's
 * grammar or one a double rounds to a whole one, a byte-order mark (the
 * caller lets the file's first line start with one). NULL, or what, with its 0-based column in *col. Also the deepest
 * nesting of arrays and objects, strings skipped, into *deepest: cJSON
 * refuses past CJSON_NESTING_LIMIT, and "not valid JSON" would be wrong. */
static const char *not_strict(const char *text, size_t len, size_t *col, size_t *deepest) {
    const unsigned char *u = (const unsigned char *)text;
    bool in_string = false;
    size_t depth = 0;
    *deepest = 0;
    for (size_t i = 0; i < len;) {
        unsigned c = u[i];
        *col = i;
        if (c == 0) return "a NUL byte";
        if (!in_string && c == 0xEF && i + 2 < len && u[i + 1] == 0xBB && u[i + 2] == 0xBF)
            return "a byte-order mark (one may start the file, nowhere else)";
        if (c >= 0x80) {
            size_t k = utf8_char(u + i, len - i);
            if (k == 0) return "a byte that is not UTF-8";
            i += k;
            continue;
        }
        if (in_string) {
            if (c < 0x20) return "a control character inside a string (escape it)";
            if (c == '"') in_string = false;
            if (c == '\\') { /* cJSON reads \u with other than four hex digits as a NUL too */
                if (i + 1 == len || !text[i + 1] || !strchr("\"\\/bfnrtu", text[i + 1])) return "an invalid escape in a string";
                if (text[i + 1] == 'u') {
                    for (size_t h = 2; h < 6; h++)
                        if (i + h >= len || !isxdigit((unsigned char)text[i + h])) return "an invalid \\u escape in a string";
                    if (memcmp(text + i + 2, "0000", 4) == 0) return "\\u0000 in a string";
                }
                i++;
            }
            i++;
            continue;
        }
        if (c < 0x20 && c != '\t' && c != '\r') return "a control byte";
        if (c == '"') in_string = true;
        if ((c == '[' || c == '{') && ++depth > *deepest) *deepest = depth;
        if ((c == ']' || c == '}') && depth > 0) depth--;
        if (c == '-' || (c >= '0' && c <= '9')) {
            size_t k = json_number(text + i, len - i);
            if (k == 0) return "a malformed number";
            bool oom = false;
            if (rounds_to_whole(text + i, k, &oom)) return "a number that is not whole but reads as one (write it exactly)";
            if (oom) return "out of memory";
            i += k;
            continue;
        }
        i++;
    }
    return NULL;
}

static int by_key(const void *a, const void *b) {
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

/* The first key of object o that appears twice, or NULL (*oom set when the
 * look ran out of memory). A trace's objects have a handful of keys: up to
 * 16 a quadratic look is cheapest; more are sorted (a hostile line holds
 * tens of thousands of keys, quadratic in pairs). */
static const char *duplicate_key(const cJSON *o, bool *oom) {
    size_t n = 0;
    for (const cJSON *a = o->child; a; a = a->next) n++;
    if (n <= 16) {
        for (const cJSON *a = o->child; a; a = a->next)
            for (const cJSON *b = a->next; b; b = b->next)
                if (strcmp(a->string, b->string) == 0) return a->string;
        return NULL;
    }
    const cJSON **k = kvt__malloc(n * sizeof(*k));
    if (k == NULL) {
        *oom = true;
        return NULL;
    }
    size_t i = 0;
    for (const cJSON *a = o->child; a; a = a->next) k[i++] = a;
    qsort(k, n, sizeof(*k), by_key);
    const char *dup = NULL;
    for (i = 1; i < n && dup == NULL; i++)
        if (strcmp(k[i - 1]->string, k[i]->string) == 0) dup = k[i]->string;
    kvt__free(k, n * sizeof(*k));
    return dup;
}

/* The request of object o into *r (its ids allocated): KVT_OK, or an error
 * with err set and nothing allocated. */
static int request_of(const cJSON *o, const char *name, size_t lineno, kvt_trace_req_t *r, char *err, size_t errlen) {
    memset(r, 0, sizeof(*r));
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(o, "hash_ids");
    const cJSON *il = cJSON_GetObjectItemCaseSensitive(o, "input_length");
    const cJSON *ol = cJSON_GetObjectItemCaseSensitive(o, "output_length");
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(o, "timestamp");
    if (!cJSON_IsObject(o)) return line_error(err, errlen, KVT_EPARSE, name, lineno, "expected a JSON object");
    if (ids == NULL) return line_error(err, errlen, KVT_EPARSE, name, lineno, "missing \"hash_ids\"");
    if (!cJSON_IsArray(ids) || cJSON_GetArraySize(ids) == 0)
        return line_error(err, errlen, KVT_EPARSE, name, lineno, "\"hash_ids\" must be a non-empty array of block ids");
    if (il == NULL) return line_error(err, errlen, KVT_EPARSE, name, lineno, "missing \"input_length\"");
    if (whole(il, 1e12, &r->input_length) || r->input_length == 0)
        return line_error(err, errlen, KVT_EPARSE, name, lineno, "\"input_length\" must be a positive integer");
    if (ol && whole(ol, 1e12, &r->output_length))
        return line_error(err, errlen, KVT_EPARSE, name, lineno, "\"output_length\" must be a non-negative integer");
    if (ts && whole(ts, 1e15, &r->timestamp_ms))
        return line_error(err, errlen, KVT_EPARSE, name, lineno, "\"timestamp\" must be a non-negative integer (ms)");
    int n = cJSON_GetArraySize(ids);
    if (!fits(r->input_length, (uint32_t)n))
        return line_error(err, errlen, KVT_EPARSE, name, lineno,
                          "\"input_length\" %llu does not fit %d blocks of %d tokens (needs %llu < length <= %llu)",
                          (unsigned long long)r->input_length, n, KVT_TRACE_BLOCK_TOKENS,
                          (unsigned long long)(n - 1) * KVT_TRACE_BLOCK_TOKENS,
                          (unsigned long long)n * KVT_TRACE_BLOCK_TOKENS);
    if ((r->hash_ids = kvt__malloc((size_t)n * sizeof(uint32_t))) == NULL)
        return line_error(err, errlen, KVT_ENOMEM, name, lineno, "out of memory");
    r->nblocks = (uint32_t)n;
    int i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, ids) {
        uint64_t id;
        if (whole(v, 4294967295.0, &id)) {
            kvt__free(r->hash_ids, (size_t)n * sizeof(uint32_t));
            r->hash_ids = NULL;
            return line_error(err, errlen, KVT_EPARSE, name, lineno, "\"hash_ids\"[%d] must be an integer in [0, 4294967295]", i);
        }
        r->hash_ids[i++] = (uint32_t)id;
    }
    return KVT_OK;
}

int kvt_trace_parse_line(kvt_trace_t *t, const char *name, size_t lineno, const char *text, size_t len, char *err,
                         size_t errlen) {
    if (t == NULL || name == NULL || (text == NULL && len > 0)) return KVT_EINVAL;
    size_t off = 0; /* the blanks skipped: columns count from the line's start */
    if (lineno <= 1 && len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) text += 3, len -= 3, off += 3;
    while (len > 0 && (text[0] == ' ' || text[0] == '\t')) text++, len--, off++;
    size_t col, depth;
    const char *bad = not_strict(text, len, &col, &depth);
    if (bad) return line_error(err, errlen, KVT_EPARSE, name, lineno, "%s at column %zu", bad, off + col + 1);
    if (depth > CJSON_NESTING_LIMIT)
        return line_error(err, errlen, KVT_EPARSE, name, lineno, "JSON nested %zu levels deep; at most %d are read",
                          depth, CJSON_NESTING_LIMIT);
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (o == NULL) {
        col = end && end >= text ? (size_t)(end - text) + 1 : 1;
        return line_error(err, errlen, KVT_EPARSE, name, lineno, "not valid JSON (near column %zu)", off + col);
    }
    /* One object a line: anything after it (a second object of a trace that
     * lost its newlines, garbage, a NUL byte) would otherwise be dropped. */
    size_t used = end && end >= text ? (size_t)(end - text) : len;
    while (used < len && (text[used] == ' ' || text[used] == '\t')) used++;
    int rc = KVT_OK;
    bool oom = false;
    const char *dup = used == len && cJSON_IsObject(o) ? duplicate_key(o, &oom) : NULL;
    kvt_trace_req_t r;
    if (used < len)
        rc = line_error(err, errlen, KVT_EPARSE, name, lineno,
                        "content after the JSON object at column %zu (one object a line)", off + used + 1);
    else if (oom)
        rc = line_error(err, errlen, KVT_ENOMEM, name, lineno, "out of memory");
    else if (dup)
        rc = line_error(err, errlen, KVT_EPARSE, name, lineno, "duplicate key \"%.40s\"", dup);
    else if ((rc = request_of(o, name, lineno, &r, err, errlen)) == KVT_OK && (rc = push(t, &r)) != KVT_OK) {
        kvt__free(r.hash_ids, r.nblocks * sizeof(uint32_t));
        line_error(err, errlen, rc, name, lineno, "out of memory");
    }
    cJSON_Delete(o);
    return rc;
}

/* ---- a file ---- */

int kvt_trace_load(const char *path, kvt_trace_t *t, char *err, size_t errlen) {
    if (t) memset(t, 0, sizeof(*t));
    if (path == NULL || t == NULL) return KVT_EINVAL;
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return KVT_EIO;
    }
    int rc = kvt_trace_load_stream(f, path, t, err, errlen);
    fclose(f);
    return rc;
}

int kvt_trace_load_stream(FILE *f, const char *name, kvt_trace_t *t, char *err, size_t errlen) {
    if (t) memset(t, 0, sizeof(*t));
    if (f == NULL || name == NULL || t == NULL) return KVT_EINVAL;
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    ssize_t len;
    int rc = KVT_OK;
    errno = 0;
    while (rc == KVT_OK && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        size_t k = (size_t)len;
        while (k > 0 && (line[k - 1] == '\n' || line[k - 1] == '\r' || line[k - 1] == ' ' || line[k - 1] == '\t')) k--;
        size_t s = lineno == 1 && k >= 3 && memcmp(line, "\xEF\xBB\xBF", 3) == 0 ? 3 : 0; /* (a byte-order mark) */
        while (s < k && (line[s] == ' ' || line[s] == '\t')) s++;
        if (s == k) continue; /* blank line */
        rc = kvt_trace_parse_line(t, name, lineno, line, k, err, errlen); /* (it skips the blanks: columns) */
        errno = 0;
    }
    /* getline out of memory for a long line returns -1 as at the end, ferror unset: not the end */
    if (rc == KVT_OK && !feof(f))
        rc = errno == ENOMEM ? KVT_ENOMEM : KVT_EIO,
        snprintf(err, errlen, "%s:%zu: %s", name, lineno + 1,
                 errno == ENOMEM ? "line too long to read (out of memory)" : errno ? strerror(errno) : "read error");
    if (rc == KVT_OK && t->n == 0) rc = KVT_EPARSE, snprintf(err, errlen, "%s: no requests in the file", name);
    free(line); /* (getline's, malloc'd) */
    if (rc != KVT_OK) kvt_trace_free(t);
    return rc;
}

void kvt_trace_request_tokens(const kvt_trace_req_t *r, int32_t *out) {
    int32_t block[KVT_TRACE_BLOCK_TOKENS];
    uint64_t left = r->input_length;
    for (uint32_t b = 0; b < r->nblocks && left > 0; b++) {
        uint64_t k = left < KVT_TRACE_BLOCK_TOKENS ? left : KVT_TRACE_BLOCK_TOKENS;
        if (k == KVT_TRACE_BLOCK_TOKENS) {
            kvt_trace_block_tokens(r->hash_ids[b], out);
        } else {
            kvt_trace_block_tokens(r->hash_ids[b], block);
            memcpy(out, block, k * sizeof(int32_t));
        }
        out += k;
        left -= k;
    }
}
