/* Pure functions of the store: CRC16 and key slots against known vectors
 * (the Redis Cluster specification's), redirection replies, URL and config
 * errors (no server needed). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/redis.h"
#include "helpers.h"
#include "store/store-int.h"

Test(store_pure, crc16_vectors) {
    cr_assert_eq(kvt_store_crc16("123456789", 9), 0x31C3);
    cr_assert_eq(kvt_store_crc16("", 0), 0);
    cr_assert_eq(kvt_store_cluster_slot("foo", 3), 12182u);
    cr_assert_eq(kvt_store_cluster_slot("bar", 3), 5061u);
    cr_assert_eq(kvt_store_cluster_slot("hello", 5), 866u);
    /* hash tags: only the part between the first { and the next } counts */
    /* the expected slots are CRC16-XMODEM & 16383 computed apart from this
     * code (Python's binascii.crc_hqx(key, 0) & 16383) */
    cr_assert_eq(kvt_store_cluster_slot("user1000", 8), 3443u);
    cr_assert_eq(kvt_store_cluster_slot("{user1000}.following", 20), 3443u);
    cr_assert_eq(kvt_store_cluster_slot("foo{user1000}bar{x}", 19), 3443u);
    /* an empty tag, or no closing brace, hashes the whole key */
    cr_assert_eq(kvt_store_cluster_slot("foo{}{bar}", 10), 8363u);
    cr_assert_eq(kvt_store_cluster_slot("{foo", 4), 13308u);
}

Test(store_pure, redirect_parser) {
    bool ask;
    unsigned slot;
    char host[64];
    int port;
    cr_assert_eq(kvt_store_parse_redirect("MOVED 3999 127.0.0.1:6381", &ask, &slot, host, sizeof(host), &port), KVT_OK);
    cr_assert(!ask);
    cr_assert_eq(slot, 3999u);
    cr_assert_str_eq(host, "127.0.0.1");
    cr_assert_eq(port, 6381);
    cr_assert_eq(kvt_store_parse_redirect("ASK 16383 10.0.0.2:7000", &ask, &slot, host, sizeof(host), &port), KVT_OK);
    cr_assert(ask);
    cr_assert_eq(slot, 16383u);
    cr_assert_eq(port, 7000);
    cr_assert_eq(kvt_store_parse_redirect("MOVED 1 [::1]:30001", &ask, &slot, host, sizeof(host), &port), KVT_OK);
    cr_assert_str_eq(host, "::1");
    cr_assert_eq(kvt_store_parse_redirect("MOVED 1 ::1:30001", &ask, &slot, host, sizeof(host), &port), KVT_OK);
    cr_assert_str_eq(host, "::1");
    cr_assert_eq(port, 30001);
    cr_assert_eq(kvt_store_parse_redirect("MOVED 1 node-a.example:7001", &ask, &slot, host, sizeof(host), &port), KVT_OK);
    cr_assert_str_eq(host, "node-a.example");
    cr_assert_eq(kvt_store_parse_redirect("MOVED 5 :7000", &ask, &slot, host, sizeof(host), &port), KVT_OK); /* the sender, that port */
    cr_assert(host[0] == 0 && port == 7000 && slot == 5);
    const char *bad[] = {"ERR wrong", "MOVED", "MOVED 16384 127.0.0.1:1", "MOVED x 127.0.0.1:1", "MOVED 5 127.0.0.1",
                         "MOVED 5 127.0.0.1:", "MOVED 5 :", "MOVED 5 :70000", "MOVED 5 :1234567", "ASK 5 h:70000", "MOVED 5 h:1 extra", "moved 5 h:1",
                         "ASK 16333 [[1]]:3", "MOVED 5 h[1]:7",
                         "TRYAGAIN Multiple keys request during rehashing of slot", "CLUSTERDOWN The cluster is down"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_assert_eq(kvt_store_parse_redirect(bad[i], &ask, &slot, host, sizeof(host), &port), KVT_EPARSE, "%s", bad[i]);
    cr_assert_eq(kvt_store_parse_redirect("MOVED 1 averyveryverylonghostname:1", &ask, &slot, host, 8, &port), KVT_EPARSE);
}

Test(store_pure, malformed_urls) {
    senv_t e;
    senv_init(&e, 4, 2, 256, KVT_LAYOUT_PAGE_FIRST);
    struct {
        const char *url, *says;
    } cases[] = {
        {"", "unknown scheme"},
        {"ftp://x", "unknown scheme"},
        {"dir:", "no path"},
        {"dir:/tmp/x,max=lots", "bad max="},
        {"dir:/tmp/x,max=", "bad max="},
        {"dir:/tmp/x,max=1.5G", "bad max= '1.5G': digits, then K, M, G or T"},
        {"dir:/tmp/x,max=16777216T", "bad max= '16777216T': more than 2^64-1 bytes"},
        {"redis://", "no HOST:PORT"},
        {"redis://localhost", "not HOST:PORT"},
        {"redis://127.0.0.1:0", "not HOST:PORT"},
        {"redis://127.0.0.1:99999", "not HOST:PORT"},
        {"redis://127.0.0.1:12ab", "not HOST:PORT"},
        {"redis://a:1,b:2", "use redis-cluster://"},
        {"redis-cluster://a:1,", "trailing ','"},
        {"redis-cluster://a:1,b", "'b' is not HOST:PORT"},
        {"redis-cluster://:7000", "not HOST:PORT"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kvt_store_t *s = (kvt_store_t *)0x1;
        cr_assert_eq(kvt_store_open(&s, cases[i].url, &e.cfg), KVT_EINVAL, "%s", cases[i].url);
        cr_assert_null(s);
        cr_assert(strstr(kvt_store_last_error(NULL), cases[i].says) != NULL, "'%s': message '%s' lacks '%s'", cases[i].url,
                  kvt_store_last_error(NULL), cases[i].says);
        char said[512]; /* the check, which opens nothing, refuses it alike */
        snprintf(said, sizeof(said), "%s", kvt_store_last_error(NULL));
        cr_assert_eq(kvt_store_url_check(cases[i].url), KVT_EINVAL, "%s", cases[i].url);
        cr_assert_str_eq(kvt_store_last_error(NULL), said);
    }
    cr_assert_eq(kvt_store_url_check(NULL), KVT_EINVAL);
    senv_fini(&e);
}

/* A URL the check passes is only read: no directory made, no server asked
 * (nothing listens on port 1), the last error cleared. */
Test(store_pure, a_url_check_reaches_and_creates_nothing) {
    char dir[64];
    snprintf(dir, sizeof(dir), "/tmp/kvt-url-check-%d/a/b", (int)getpid());
    char url[96];
    snprintf(url, sizeof(url), "dir:%s,max=1G", dir);
    cr_assert_eq(kvt_store_url_check("ftp://x"), KVT_EINVAL);
    const char *good[] = {url, "redis://127.0.0.1:1", "redis://u:p%40ss@127.0.0.1:1", "redis-cluster://a:1,b:2"};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        cr_assert_eq(kvt_store_url_check(good[i]), KVT_OK, "%s: %s", good[i], kvt_store_last_error(NULL));
        cr_assert_str_eq(kvt_store_last_error(NULL), "");
    }
    cr_assert_neq(access(dir, F_OK), 0, "the check made the directory");
}

/* max=SIZE: digits and one power-of-1024 suffix, against values worked out
 * by hand (2^10 = 1024, 2^40 = 1099511627776, 2^64 - 1 =
 * 18446744073709551615); everything else refused with the reason. */
Test(store_pure, size_parser) {
    static const struct {
        const char *text;
        uint64_t bytes;
    } good[] = {
        {"0", 0},
        {"7", 7},
        {"0007", 7},
        {"123", 123},
        {"1K", 1024},
        {"64K", 65536},
        {"64k", 65536},
        {"1M", 1048576},
        {"5m", 5242880},
        {"3G", 3221225472ull},
        {"2T", 2199023255552ull},
        {"0T", 0},
        {"18446744073709551615", 18446744073709551615ull},    /* 2^64 - 1 */
        {"16777215T", 18446742974197923840ull},               /* (2^24 - 1) x 2^40 */
        {"17179869183G", 18446744072635809792ull},            /* (2^34 - 1) x 2^30 */
        {"18014398509481983K", 18446744073709550592ull},      /* (2^54 - 1) x 2^10 */
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        uint64_t v = 42;
        const char *why = NULL;
        cr_assert_eq(kvt__store_parse_size(good[i].text, strlen(good[i].text), &v, &why), KVT_OK, "'%s': %s", good[i].text, why);
        cr_assert_eq(v, good[i].bytes, "'%s' gave %llu", good[i].text, (unsigned long long)v);
    }
    static const struct {
        const char *text, *why;
    } bad[] = {
        {"", "digits"},           {"K", "digits"},        {"1.5G", "digits"},
        {"-1", "digits"},         {"+1", "digits"},       {" 1", "digits"},
        {"1 ", "digits"},         {"0x10", "digits"},     {"1e3", "digits"},
        {"12KB", "digits"},       {"12KiB", "digits"},    {"1KK", "digits"},
        {"1P", "digits"},         {"inf", "digits"},      {"nan", "digits"},
        {"18446744073709551616", "2^64"},                 /* 2^64 */
        {"99999999999999999999999", "2^64"},
        {"16777216T", "2^64"},                            /* 2^24 x 2^40 = 2^64 */
        {"17179869184G", "2^64"},
        {"18014398509481984K", "2^64"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint64_t v = 42;
        const char *why = NULL;
        cr_assert_eq(kvt__store_parse_size(bad[i].text, strlen(bad[i].text), &v, &why), KVT_EINVAL, "'%s' accepted", bad[i].text);
        cr_assert_eq(v, 42u, "'%s': *out set on failure", bad[i].text);
        cr_assert(why && strstr(why, bad[i].why), "'%s': reason '%s'", bad[i].text, why ? why : "(none)");
    }
    /* only len bytes are read: "64K" out of "64Kjunk" */
    uint64_t v = 0;
    const char *why = NULL;
    cr_assert_eq(kvt__store_parse_size("64Kjunk", 3, &v, &why), KVT_OK);
    cr_assert_eq(v, 65536u);
}

Test(store_pure, bad_configs) {
    senv_t e;
    senv_init(&e, 4, 2, 256, KVT_LAYOUT_PAGE_FIRST);
    kvt_store_t *s = NULL;
    e.cfg.model = NULL;
    cr_assert_eq(kvt_store_open(&s, "dir:/tmp/kvt-never", &e.cfg), KVT_EINVAL);
    cr_assert(strstr(kvt_store_last_error(NULL), "model") != NULL);
    /* the identity's separator: model "m;...;ns=x" would name model m's namespace x, and share its objects */
    e.cfg.model = "m;page_tokens=16;layers=2;layer_bytes=256;dtype_bytes=2;tp=0/1;cp=0/1;ns=x";
    e.cfg.ns = "y";
    cr_assert_eq(kvt_store_open(&s, "dir:/tmp/kvt-never", &e.cfg), KVT_EINVAL);
    cr_assert(strstr(kvt_store_last_error(NULL), "may not hold ';'") != NULL);
    e.cfg.ns = NULL;
    e.cfg.model = "m";
    e.cfg.page_tokens = 0;
    cr_assert_eq(kvt_store_open(&s, "dir:/tmp/kvt-never", &e.cfg), KVT_EINVAL);
    cr_assert(strstr(kvt_store_last_error(NULL), "page_tokens") != NULL);
    e.cfg.page_tokens = 16;
    e.cfg.layers = 3;
    cr_assert_eq(kvt_store_open(&s, "dir:/tmp/kvt-never", &e.cfg), KVT_EINVAL);
    cr_assert(strstr(kvt_store_last_error(NULL), "geometry") != NULL);
    e.cfg.layers = 0;
    e.cfg.tp_rank = 2;
    e.cfg.tp_size = 2;
    cr_assert_eq(kvt_store_open(&s, "dir:/tmp/kvt-never", &e.cfg), KVT_EINVAL);
    cr_assert(strstr(kvt_store_last_error(NULL), "shard") != NULL);
    cr_assert_null(s);
    senv_fini(&e);
}

Test(store_pure, unreachable) {
    senv_t e;
    senv_init(&e, 4, 2, 256, KVT_LAYOUT_PAGE_FIRST);
    int port = redis_free_port();
    char url[128];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d", port);
    kvt_store_t *s = NULL;
    cr_assert_eq(kvt_store_open(&s, url, &e.cfg), KVT_EIO);
    cr_assert(strstr(kvt_store_last_error(NULL), "unreachable") != NULL, "%s", kvt_store_last_error(NULL));
    snprintf(url, sizeof(url), "redis-cluster://127.0.0.1:%d", port);
    cr_assert_eq(kvt_store_open(&s, url, &e.cfg), KVT_EIO);
    cr_assert(strstr(kvt_store_last_error(NULL), "unreachable") != NULL, "%s", kvt_store_last_error(NULL));
    cr_assert_null(s);
    senv_fini(&e);
}

/* Two identities give two keys for one page hash: model, shard, namespace, geometry. */
Test(store_pure, keys_separate_identities) {
    senv_t e;
    senv_init(&e, 4, 2, 256, KVT_LAYOUT_PAGE_FIRST);
    char dir[] = "/tmp/kvt-store-keys-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char url[128];
    snprintf(url, sizeof(url), "dir:%s", dir);
    kvt_hash128_t h = hkey(7);
    char base[33], other[33];
    cr_assert_eq(senv_open(&e, url), KVT_OK);
    kvt_store_key(e.store, &h, base);
    kvt_store_close(e.store);
    e.store = NULL;
    const char *models[] = {"other-model", NULL};
    for (int v = 0; v < 5; v++) {
        kvt_store_config_t c = e.cfg;
        if (v == 0) c.model = models[0];
        if (v == 1) c.tp_size = 2, c.tp_rank = 1;
        if (v == 2) c.ns = "tenant-b";
        if (v == 3) c.dtype_bytes = 1;
        if (v == 4) c.page_tokens = 32;
        kvt_store_t *s = NULL;
        cr_assert_eq(kvt_store_open(&s, url, &c), KVT_OK);
        kvt_store_key(s, &h, other);
        cr_assert_str_neq(base, other, "variant %d shares a key", v);
        kvt_store_close(s);
    }
    rmdir(dir);
    senv_fini(&e);
}
