/* Fault campaigns on the L3 store (tests/faults/run): a writer to kill, and
 * a checker that reads back what a killed writer or a full disk left.
 *
 *   faults-store write URL --first K --count N [--batch B] [--until-full]
 *   faults-store check URL --first K --count N [--acked FILE]
 *
 * Object i (K <= i < K+N) is the page whose hash is key(i) and whose content
 * is kvt_pattern_fill of that hash: the content model, independent of the
 * store. The writer puts them in batches of B, and after each batch prints
 * one line per key the store acknowledged ("ok I") or failed ("failed I"),
 * flushed, so that whoever kills it knows what was acknowledged. With
 * --until-full it stops (exit 3) two batches after the first that failed.
 *
 * The checker opens the store afresh (a dir store removes a dead writer's
 * temporary files on open), gets every object of the range and holds each
 * to the rules: a served object holds exactly its content; an object the
 * writer acknowledged (a line "ok I" in FILE) is there; nothing is served
 * damaged (a refused object is one a reader could see half written); no
 * temporary file is left in a dir store. It prints what it found and exits 1
 * on any violation. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kvtier/testing.h"
#include "kvtier/error.h"
#include "kvtier/store.h"
#include "kvtier/tier.h"

#define LAYERS 2
#define LAYER_BYTES 4096
#define MAX_BATCH 64

static kvt_hash128_t key(uint64_t i) {
    return (kvt_hash128_t){.lo = 0x9e3779b97f4a7c15ull * (i + 1) ^ 0x5151, .hi = i * 0xff51afd7ed558ccdull + 7};
}

static void quiet(void *arg, const char *msg) { (void)arg, (void)msg; }

static int open_store(const char *url, uint32_t pages, kvt_tier_t **tier, kvt_store_t **s) {
    kvt_tier_config_t tc = {.size = sizeof(tc), .kind = KVT_TIER_HOST,
                            .geom = {pages, LAYERS, LAYER_BYTES, KVT_LAYOUT_PAGE_FIRST}};
    int rc = kvt_tier_create(tier, &tc);
    if (rc != KVT_OK) return fprintf(stderr, "faults-store: tier: %s\n", kvt_strerror(rc)), -1;
    kvt_store_config_t sc;
    kvt_store_config_default(&sc);
    sc.tier = *tier;
    sc.model = "faults-store";
    sc.page_tokens = 16;
    sc.threads = 2;
    sc.timeout_ms = 2000;
    sc.log = quiet;
    rc = kvt_store_open(s, url, &sc);
    if (rc != KVT_OK) {
        fprintf(stderr, "faults-store: open %s: %s (%s)\n", url, kvt_strerror(rc), kvt_store_last_error(NULL));
        kvt_tier_destroy(*tier);
        return -1;
    }
    return 0;
}

/* Submits one batch and waits for it. */
static int batch(kvt_store_t *s, int (*op)(kvt_store_t *, const kvt_store_page_t *, size_t, uint64_t, uint64_t *),
                 const kvt_store_page_t *p, size_t n, uint8_t *results) {
    uint64_t t;
    int rc = op(s, p, n, 0, &t);
    if (rc != KVT_OK) return fprintf(stderr, "faults-store: submit: %s\n", kvt_strerror(rc)), -1;
    kvt_store_done_t d;
    if (kvt_store_poll(s, &d, 1, 120ull * 1000000000ull) != 1 || d.ticket != t)
        return fprintf(stderr, "faults-store: the batch was not reported\n"), -1;
    memcpy(results, d.results, n);
    return 0;
}

static int cmd_write(const char *url, uint64_t first, uint64_t count, uint32_t b, bool until_full) {
    kvt_tier_t *tier;
    kvt_store_t *s;
    if (open_store(url, b, &tier, &s) != 0) return 2;
    static uint8_t scratch[LAYER_BYTES];
    kvt_store_page_t p[MAX_BATCH];
    uint8_t res[MAX_BATCH];
    int after_full = -1, code = 0;
    for (uint64_t i = first; i < first + count && after_full != 0; i += b) {
        size_t n = first + count - i < b ? (size_t)(first + count - i) : b;
        for (size_t j = 0; j < n; j++) {
            p[j] = (kvt_store_page_t){.hash = key(i + j), .page = (uint32_t)j};
            kvt_tier_pattern_fill(tier, j, p[j].hash.lo, p[j].hash.hi, scratch);
        }
        if (batch(s, kvt_store_put, p, n, res) != 0) {
            code = 2;
            break;
        }
        bool failed = false;
        for (size_t j = 0; j < n; j++) {
            printf("%s %" PRIu64 "\n", res[j] == KVT_STORE_OK ? "ok" : "failed", i + j);
            failed |= res[j] != KVT_STORE_OK;
        }
        fflush(stdout);
        if (until_full && after_full < 0 && failed) after_full = 3;
        if (after_full > 0) after_full--;
    }
    kvt_store_close(s);
    kvt_tier_destroy(tier);
    return code ? code : after_full >= 0 ? 3 : 0;
}

/* Temporary files (".tmp.") anywhere under root. */
static uint64_t temp_files(const char *root) {
    DIR *d = opendir(root);
    if (d == NULL) return 0;
    uint64_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", root, e->d_name);
        struct stat st;
        if (lstat(path, &st) != 0) continue;
        if (S_ISDIR(st.st_mode)) n += temp_files(path);
        else if (strncmp(e->d_name, ".tmp.", 5) == 0) n++;
    }
    closedir(d);
    return n;
}

static int cmd_check(const char *url, uint64_t first, uint64_t count, const char *acked_path) {
    bool *acked = calloc(count ? count : 1, 1);
    if (acked == NULL) return 2;
    uint64_t nacked = 0;
    if (acked_path) {
        FILE *f = fopen(acked_path, "r");
        if (f == NULL) return fprintf(stderr, "faults-store: %s: %s\n", acked_path, strerror(errno)), 2;
        char line[64];
        uint64_t i;
        /* a line cut short by the kill is no acknowledgement */
        while (fgets(line, sizeof(line), f))
            if (strchr(line, '\n') && sscanf(line, "ok %" SCNu64, &i) == 1 && i >= first && i - first < count)
                nacked += !acked[i - first], acked[i - first] = true;
        fclose(f);
    }
    kvt_tier_t *tier;
    kvt_store_t *s;
    if (open_store(url, MAX_BATCH, &tier, &s) != 0) return 2;
    static uint8_t scratch[LAYER_BYTES];
    kvt_store_page_t p[MAX_BATCH];
    uint8_t res[MAX_BATCH];
    uint64_t present = 0, missing = 0, lost = 0, wrong = 0, damaged = 0, failed = 0;
    for (uint64_t i = first; i < first + count; i += MAX_BATCH) {
        size_t n = first + count - i < MAX_BATCH ? (size_t)(first + count - i) : MAX_BATCH;
        for (size_t j = 0; j < n; j++) p[j] = (kvt_store_page_t){.hash = key(i + j), .page = (uint32_t)j};
        if (batch(s, kvt_store_get, p, n, res) != 0) return 2;
        for (size_t j = 0; j < n; j++) {
            uint64_t k = i + j;
            switch (res[j]) {
            case KVT_STORE_OK:
                present++;
                if (!kvt_tier_pattern_check(tier, j, p[j].hash.lo, p[j].hash.hi, scratch) && wrong++ < 5)
                    fprintf(stderr, "faults-store: object %" PRIu64 " was served with other bytes\n", k);
                break;
            case KVT_STORE_MISS:
                missing++;
                if (acked[k - first] && lost++ < 5)
                    fprintf(stderr, "faults-store: object %" PRIu64 " was acknowledged and is gone\n", k);
                break;
            case KVT_STORE_BAD:
                if (damaged++ < 5) fprintf(stderr, "faults-store: object %" PRIu64 " is there damaged (refused)\n", k);
                break;
            default:
                if (failed++ < 5) fprintf(stderr, "faults-store: the get of object %" PRIu64 " failed\n", k);
            }
        }
    }
    kvt_store_close(s);
    kvt_tier_destroy(tier);
    uint64_t tmp = strncmp(url, "dir:", 4) == 0 ? temp_files(url + 4) : 0;
    if (tmp) fprintf(stderr, "faults-store: %" PRIu64 " temporary files left after a fresh open\n", tmp);
    printf("faults-store: %" PRIu64 " objects: %" PRIu64 " present (%" PRIu64 " acknowledged), %" PRIu64
           " missing; %" PRIu64 " acknowledged but lost, %" PRIu64 " served wrong, %" PRIu64 " damaged, %" PRIu64
           " failed gets, %" PRIu64 " temporary files\n",
           count, present, nacked, missing, lost, wrong, damaged, failed, tmp);
    free(acked);
    return lost || wrong || damaged || failed || tmp ? 1 : 0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: faults-store write URL --first K --count N [--batch 1..%d] [--until-full]\n"
               "       faults-store check URL --first K --count N [--acked FILE]\n",
            MAX_BATCH);
}

int main(int argc, char **argv) {
    if (argc < 3) return usage(stderr), 2;
    const char *cmd = argv[1], *url = argv[2], *acked = NULL;
    uint64_t first = 0, count = 1000, b = 16;
    bool until_full = false;
    static const struct option lo[] = {{"first", 1, 0, 'f'}, {"count", 1, 0, 'n'}, {"batch", 1, 0, 'b'},
                                       {"until-full", 0, 0, 'u'}, {"acked", 1, 0, 'a'}, {0, 0, 0, 0}};
    optind = 3;
    for (int ch; (ch = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        char *end = NULL;
        uint64_t v = optarg ? strtoull(optarg, &end, 10) : 0;
        if (optarg && ch != 'a' && (*optarg == '\0' || *end != '\0'))
            return fprintf(stderr, "faults-store: %s: not a number\n", optarg), 2;
        switch (ch) {
        case 'f': first = v; break;
        case 'n': count = v; break;
        case 'b':
            if (v < 1 || v > MAX_BATCH) return fprintf(stderr, "faults-store: --batch: 1..%d\n", MAX_BATCH), 2;
            b = v;
            break;
        case 'u': until_full = true; break;
        case 'a': acked = optarg; break;
        default: return usage(stderr), 2;
        }
    }
    if (strcmp(cmd, "write") == 0) return cmd_write(url, first, count, (uint32_t)b, until_full);
    if (strcmp(cmd, "check") == 0) return cmd_check(url, first, count, acked);
    return usage(stderr), 2;
}
