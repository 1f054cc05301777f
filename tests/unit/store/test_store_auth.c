/* Redis authentication against real servers (tests/common/redis.h): a
 * password (requirepass) and an ACL user, from the URL (percent-decoded) or
 * the environment; a wrong or missing password fails the open with a
 * message that names AUTH and never holds the password; the store's URL
 * and messages never hold it either; a cluster whose every node wants the
 * password, reached through one seed, the other masters found from its
 * slot map and one through a MOVED. Every server is stopped in .fini. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/redis.h"
#include "helpers.h"

static senv_t E;
static redis_srv_t S;
static redis_cluster_t C;
static char said[8192]; /* every message the store logged */

static void teardown(void) {
    senv_fini(&E);
    redis_stop(&S);
    cluster_stop(&C);
    unsetenv("KVT_REDIS_USER");
    unsetenv("KVT_REDIS_PASSWORD");
}

TestSuite(store_auth, .fini = teardown, .timeout = 60);

static void keep_log(void *arg, const char *msg) {
    (void)arg;
    size_t n = strlen(said);
    snprintf(said + n, sizeof(said) - n, "%s\n", msg);
}

#define PASSWORD "pa:ss@w%rd" /* ':' '@' and '%': the URL gives it percent-encoded */
#define PASSWORD_URL "pa%3Ass%40w%25rd"

/* Opens scheme_creds (e.g. "redis://:pw@") followed by 127.0.0.1:port. */
static int open_url(const char *scheme_creds, int port) {
    char u[256];
    snprintf(u, sizeof(u), "%s127.0.0.1:%d", scheme_creds, port);
    return senv_open(&E, u);
}

static void no_password_in(const char *what, const char *text) {
    cr_assert(strstr(text, "pa:ss") == NULL && strstr(text, PASSWORD_URL) == NULL && strstr(text, "s3cret") == NULL,
              "%s holds the password: %s", what, text);
}

Test(store_auth, requirepass) {
    const char *extra[] = {"--requirepass", PASSWORD, NULL};
    cr_assert_eq(redis_start(&S, extra), 0);
    senv_init(&E, 64, 1, 1024, KVT_LAYOUT_PAGE_FIRST);
    E.cfg.log = keep_log;
    /* no password: refused, and the message says how to give one */
    cr_assert_eq(open_url("redis://", S.port), KVT_EIO);
    cr_assert(strstr(kvt_store_last_error(NULL), "NOAUTH") != NULL, "%s", kvt_store_last_error(NULL));
    /* a wrong one: an AUTH failure, neither password in the message */
    cr_assert_eq(open_url("redis://:s3cret@", S.port), KVT_EIO);
    const char *why = kvt_store_last_error(NULL);
    cr_assert(strstr(why, "AUTH") != NULL && strstr(why, "WRONGPASS") != NULL, "%s", why);
    no_password_in("the open error", why);
    /* the right one, percent-decoded */
    cr_assert_eq(open_url("redis://:" PASSWORD_URL "@", S.port), KVT_OK, "%s", kvt_store_last_error(NULL));
    no_password_in("kvt_store_url", kvt_store_url(E.store));
    cr_assert(strstr(kvt_store_url(E.store), "127.0.0.1") != NULL, "%s", kvt_store_url(E.store));
    roundtrip(&E, 16);
    /* connections dropped: every new one authenticates */
    redisReply *r = redis_cmd_as(S.port, NULL, PASSWORD, "CLIENT KILL TYPE normal");
    cr_assert_not_null(r);
    freeReplyObject(r);
    kvt_store_page_t p[4];
    put_filled(&E, p, 4, 90);
    cr_assert_eq(run_op(E.store, kvt_store_exists, p, 4).count, 4u);
    no_password_in("a message", said);
    /* the environment, when the URL has no password; the URL wins over it */
    kvt_store_close(E.store);
    E.store = NULL;
    setenv("KVT_REDIS_PASSWORD", PASSWORD, 1);
    cr_assert_eq(open_url("redis://", S.port), KVT_OK, "%s", kvt_store_last_error(NULL));
    cr_assert_eq(run_op(E.store, kvt_store_exists, p, 4).count, 4u);
    kvt_store_close(E.store);
    E.store = NULL;
    cr_assert_eq(open_url("redis://:s3cret@", S.port), KVT_EIO, "the environment won over the URL");
    setenv("KVT_REDIS_PASSWORD", "s3cret", 1);
    cr_assert_eq(open_url("redis://:" PASSWORD_URL "@", S.port), KVT_OK, "%s", kvt_store_last_error(NULL));
}

/* An ACL user, the default user switched off: user:password@ from the URL,
 * or a user in the URL and its password from the environment, or both from
 * the environment; the default user's password (:pw@) is refused. */
Test(store_auth, acl_user) {
    cr_assert_eq(redis_start(&S, NULL), 0);
    redisReply *r = redis_cmd(S.port, "ACL SETUSER kvt on >s3cret ~kvt:* +@all");
    cr_assert(r && r->type == REDIS_REPLY_STATUS, "%s", r ? r->str : "no reply");
    freeReplyObject(r);
    r = redis_cmd(S.port, "ACL SETUSER default off");
    cr_assert(r && r->type == REDIS_REPLY_STATUS);
    freeReplyObject(r);
    senv_init(&E, 64, 1, 1024, KVT_LAYOUT_PAGE_FIRST);
    cr_assert_eq(open_url("redis://:s3cret@", S.port), KVT_EIO);
    cr_assert(strstr(kvt_store_last_error(NULL), "AUTH") != NULL, "%s", kvt_store_last_error(NULL));
    no_password_in("the open error", kvt_store_last_error(NULL));
    cr_assert_eq(open_url("redis://kvt:wrong@", S.port), KVT_EIO);
    cr_assert(strstr(kvt_store_last_error(NULL), "AUTH") && strstr(kvt_store_last_error(NULL), "kvt"), "%s",
              kvt_store_last_error(NULL));
    cr_assert(strstr(kvt_store_last_error(NULL), "wrong") == NULL, "%s", kvt_store_last_error(NULL));
    cr_assert_eq(open_url("redis://kvt:s3cret@", S.port), KVT_OK, "%s", kvt_store_last_error(NULL));
    roundtrip(&E, 8);
    no_password_in("kvt_store_url", kvt_store_url(E.store));
    kvt_store_close(E.store);
    E.store = NULL;
    setenv("KVT_REDIS_PASSWORD", "s3cret", 1);
    cr_assert_eq(open_url("redis://kvt@", S.port), KVT_OK, "%s", kvt_store_last_error(NULL));
    kvt_store_close(E.store);
    E.store = NULL;
    setenv("KVT_REDIS_USER", "kvt", 1);
    cr_assert_eq(open_url("redis://", S.port), KVT_OK, "%s", kvt_store_last_error(NULL));
    roundtrip(&E, 8);
}

/* A user whose ACL has no scripting: exists on the caller's thread (a
 * script where the server allows one) says why once and asks key by key,
 * with the same counts as the workers' exists. */
Test(store_auth, exists_without_scripts) {
    cr_assert_eq(redis_start(&S, NULL), 0);
    redisReply *r = redis_cmd(S.port, "ACL SETUSER kvt on >s3cret ~kvt:* +@all -@scripting");
    cr_assert(r && r->type == REDIS_REPLY_STATUS, "%s", r ? r->str : "no reply");
    freeReplyObject(r);
    senv_init(&E, 32, 1, 256, KVT_LAYOUT_PAGE_FIRST);
    E.cfg.log = keep_log;
    said[0] = 0;
    cr_assert_eq(open_url("redis://kvt:s3cret@", S.port), KVT_OK, "%s", kvt_store_last_error(NULL));
    kvt_store_page_t p[12];
    pages_of(p, 12, 300, 0);
    fill(&E, 300, 0, 12);
    bool stored[12];
    for (int i = 0; i < 12; i++) {
        stored[i] = i != 4 && i != 9;
        if (stored[i]) cr_assert_eq(run_op(E.store, kvt_store_put, &p[i], 1).count, 1u);
    }
    exists_leading_matches(&E, p, stored, 12);
    const char *once = strstr(said, "refused the exists script");
    cr_assert(once != NULL, "%s", said);
    cr_assert(strstr(once + 1, "refused the exists script") == NULL, "said more than once: %s", said);
}

/* Malformed credentials are malformed URLs. */
Test(store_auth, malformed_credentials) {
    senv_init(&E, 4, 1, 256, KVT_LAYOUT_PAGE_FIRST);
    const char *bad[] = {"redis://:pw%4@127.0.0.1:1", "redis://:pw%zz@127.0.0.1:1", "redis://@127.0.0.1:1",
                         "redis://u:pw@", "redis-cluster://:pw@", "rediss://:pw@127.0.0.1:1", "Redis://u:pw@h:1",
                         "redis:/:pw@h:1"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kvt_store_t *s = NULL;
        cr_assert_eq(kvt_store_open(&s, bad[i], &E.cfg), KVT_EINVAL, "%s", bad[i]);
        cr_assert(strstr(kvt_store_last_error(NULL), "malformed store URL") != NULL, "%s: %s", bad[i], kvt_store_last_error(NULL));
        cr_assert(strstr(kvt_store_last_error(NULL), "pw") == NULL, "%s: %s", bad[i], kvt_store_last_error(NULL));
    }
}

/* What tools print for a URL: the password replaced, nothing else changed. */
Test(store_auth, url_redaction) {
    char out[128];
    cr_assert_str_eq(kvt_store_url_redact("redis://u:pw@h:1", out, sizeof(out)), "redis://u:***@h:1");
    cr_assert_str_eq(kvt_store_url_redact("redis-cluster://:p@w@a:1,b:2", out, sizeof(out)), "redis-cluster://:***@a:1,b:2");
    cr_assert_str_eq(kvt_store_url_redact("redis://h:1", out, sizeof(out)), "redis://h:1");
    cr_assert_str_eq(kvt_store_url_redact("dir:/tmp/a@b", out, sizeof(out)), "dir:/tmp/a@b");
    cr_assert_str_eq(kvt_store_url_redact("redis://u:pw@h:1", out, 10), "redis://u", "cut short, never the password");
    /* mistyped schemes, which the open refuses naming the URL */
    cr_assert_str_eq(kvt_store_url_redact("rediss://:pw@h:1", out, sizeof(out)), "rediss://:***@h:1");
    cr_assert_str_eq(kvt_store_url_redact("Redis://u:pw@h:1", out, sizeof(out)), "Redis://u:***@h:1");
    cr_assert_str_eq(kvt_store_url_redact("redis:/:pw@h:1", out, sizeof(out)), "redis:/:***@h:1");
    cr_assert_str_eq(kvt_store_url_redact("redis://pw@h:1", out, sizeof(out)), "redis://***@h:1");
    cr_assert_str_eq(kvt_store_url_redact("pw@h:1", out, sizeof(out)), "***@h:1");
}

/* The slot of a page's key, from a node (CLUSTER KEYSLOT). */
static unsigned slot_of(int port, const kvt_hash128_t *h) {
    char hex[33];
    kvt_store_key(E.store, h, hex);
    redisReply *r = redis_cmd_as(port, NULL, "s3cret", "CLUSTER KEYSLOT kvt:%s", hex);
    cr_assert(r && r->type == REDIS_REPLY_INTEGER);
    unsigned s = (unsigned)r->integer;
    freeReplyObject(r);
    return s;
}

static void node_id(int port, char id[64]) {
    redisReply *r = redis_cmd_as(port, NULL, "s3cret", "CLUSTER MYID");
    cr_assert(r && r->type == REDIS_REPLY_STRING);
    snprintf(id, 64, "%s", r->str);
    freeReplyObject(r);
}

/* The master of slot, by index into C.n. */
static int owner(unsigned slot) {
    int port = redis_slot_port(redis_cmd_as(C.n[0].port, NULL, "s3cret", "CLUSTER SLOTS"), slot);
    cr_assert_neq(port, -1, "no master for slot %u", slot);
    for (int i = 0; i < 3; i++)
        if (C.n[i].port == port) return i;
    return -1;
}

/* Three masters that want a password; the URL names one. One worker: its
 * first batch is one key whose slot was moved after the store loaded its
 * map, so it connects to the old owner, is sent to the new one by MOVED,
 * and opens that connection after the redirect. Then a batch over the
 * three masters (two known only from the slot map). */
Test(store_auth, cluster_every_connection_authenticates) {
    cr_assert_eq(cluster_start_opts(&C, 3, 0, NULL, "s3cret"), 0, "the cluster did not come up (see %s/create.log)", C.n[0].dir);
    senv_init(&E, 64, 1, 1024, KVT_LAYOUT_PAGE_FIRST);
    E.cfg.threads = 1;
    char u[128];
    snprintf(u, sizeof(u), "redis-cluster://:s3cret@127.0.0.1:%d", C.n[0].port);
    kvt_store_t *s = NULL;
    snprintf(u, sizeof(u), "redis-cluster://:wrong@127.0.0.1:%d", C.n[0].port);
    cr_assert_eq(kvt_store_open(&s, u, &E.cfg), KVT_EIO);
    cr_assert(strstr(kvt_store_last_error(NULL), "AUTH") != NULL, "%s", kvt_store_last_error(NULL));
    cr_assert(strstr(kvt_store_last_error(NULL), "wrong") == NULL, "%s", kvt_store_last_error(NULL));
    snprintf(u, sizeof(u), "redis-cluster://:s3cret@127.0.0.1:%d", C.n[0].port);
    cr_assert_eq(senv_open(&E, u), KVT_OK, "%s", kvt_store_last_error(NULL));
    /* move the first key's (empty) slot to another master, behind the store's back */
    kvt_store_page_t k = {.hash = hkey(4242), .page = 0};
    unsigned slot = slot_of(C.n[0].port, &k.hash);
    int from = owner(slot), to = (from + 1) % 3;
    cr_assert_geq(from, 0);
    char id[64];
    node_id(C.n[to].port, id);
    for (int i = 0; i < 3; i++) {
        redisReply *r = redis_cmd_as(C.n[i].port, NULL, "s3cret", "CLUSTER SETSLOT %u NODE %s", slot, id);
        cr_assert(r && r->type == REDIS_REPLY_STATUS, "SETSLOT on node %d: %s", i, r ? r->str : "no reply");
        freeReplyObject(r);
    }
    sres_t r = run_op(E.store, kvt_store_exists, &k, 1);
    cr_assert_eq(r.r[0], KVT_STORE_MISS, "the key after MOVED: %d (%s)", r.r[0], kvt_store_last_error(E.store));
    cr_assert_eq(sstats(E.store, KVT_STORE_EXISTS).moved, 1u);
    /* puts and gets on every master */
    kvt_store_page_t p[32], q[32];
    put_filled(&E, p, 32, 5000);
    bool on[3] = {false, false, false};
    for (int i = 0; i < 32; i++) on[owner(slot_of(C.n[0].port, &p[i].hash))] = true;
    cr_assert(on[0] && on[1] && on[2], "32 keys on fewer than three masters");
    pages_of(q, 32, 5000, 32);
    wipe(&E, 32, 32);
    cr_assert_eq(run_op(E.store, kvt_store_get, q, 32).count, 32u);
    for (int i = 0; i < 32; i++) cr_assert(check(&E, 5000 + (uint64_t)i, 32 + (uint32_t)i));
    cr_assert_eq(sstats(E.store, KVT_STORE_GET).failures, 0u);
    no_password_in("kvt_store_url", kvt_store_url(E.store));
}
