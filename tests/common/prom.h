/* Test helper: Prometheus text a kvtier command wrote, held to Prometheus's
 * own rules by its own linter, `promtool check metrics` (Debian's
 * `prometheus` package; scripts/bootstrap installs it). Without promtool the
 * test fails: a check that cannot run is not a check that passed. */
#ifndef KVTIER_TESTS_PROM_H
#define KVTIER_TESTS_PROM_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/run.h"

/* Every histogram's buckets never decrease and its +Inf bucket is its _count. */
static inline void prom_check_histograms(const char *text, const char *what) {
    char fam[512] = "";
    unsigned long long prev = 0, inf = 0;
    int hists = 0;
    for (const char *l = text; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l)) {
        const char *b = strstr(l, "_bucket{le=\""), *nl = strchr(l, '\n');
        unsigned long long v;
        if (*l != '#' && b && (!nl || b < nl)) {
            size_t n = (size_t)(b - l);
            if (n >= sizeof(fam) || strncmp(l, fam, n) != 0 || fam[n]) { /* a new histogram */
                cr_assert_lt(n, sizeof(fam));
                memcpy(fam, l, n), fam[n] = 0, prev = 0, hists++;
            }
            cr_assert_eq(sscanf(strchr(b, '}') + 1, "%llu", &v), 1, "%s: %.80s", what, l);
            cr_assert_geq(v, prev, "%s: %s: buckets must be cumulative: %.80s", what, fam, l);
            prev = v;
            if (strncmp(b, "_bucket{le=\"+Inf\"}", 18) == 0) inf = v;
        } else if (*fam && strncmp(l, fam, strlen(fam)) == 0 && strncmp(l + strlen(fam), "_count ", 7) == 0) {
            cr_assert_eq(sscanf(l + strlen(fam) + 7, "%llu", &v), 1);
            cr_assert_eq(v, inf, "%s: %s: the +Inf bucket (%llu) is not _count (%llu)", what, fam, inf, v);
        }
    }
    cr_assert_gt(hists, 0, "%s: no histogram in: %s", what, text);
}

/* promtool check metrics on `text`: exit 0 and nothing said. */
static inline void promtool_check(const char *text, const char *what) {
    char path[] = "/tmp/kvt-prom-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    size_t len = strlen(text);
    cr_assert_eq(write(fd, text, len), (ssize_t)len);
    close(fd);
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "command -v promtool >/dev/null 2>&1 || exit 127; exec promtool check metrics <%s", path);
    run_result_t r = run_argv((const char *const[]){"/bin/sh", "-c", cmd, NULL});
    unlink(path);
    cr_assert_neq(r.status, 127,
                  "%s: promtool is not installed, so the Prometheus text cannot be checked: "
                  "apt-get install prometheus (scripts/bootstrap does)",
                  what);
    cr_assert_eq(r.status, 0, "%s: promtool check metrics exited %d:\n%s%s", what, r.status, r.out, r.err);
    cr_assert_str_empty(r.out, "%s: promtool said: %s", what, r.out);
    cr_assert_str_empty(r.err, "%s: promtool said: %s", what, r.err);
    run_free(&r);
}

#endif
