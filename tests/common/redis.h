/* Test fixture: real Redis servers on 127.0.0.1, started and always stopped.
 *
 *   redis_start(&srv, extra)     one server on a free port (no persistence)
 *   redis_prepare + redis_launch the same in two steps, for a cluster node
 *                                whose nodes.conf the test writes
 *   cluster_start(&c)            six nodes, three masters + three replicas,
 *                                joined by `redis-cli --cluster create`
 *   cluster_start_opts(&c, m, r, extra, password)
 *                                m masters with r replicas each, extra
 *                                arguments for every node, and a password
 *                                (requirepass and masterauth) or NULL
 *   redis_cmd_as(port, user, password, fmt, ...)  a command after AUTH
 *   redis_stop / cluster_stop    SIGKILL, reap, remove the data directory
 *
 * A free port is found by binding port 0 (redis has no --port 0), checking
 * that port + 10000 (the cluster bus) is free too. Servers die with the test
 * process even when it crashes (PR_SET_PDEATHSIG), and in a process group
 * of their own so that a stop takes any child with them. Tests call the
 * stop functions from a Criterion .fini, which runs when an assertion fails. */
#ifndef KVTIER_TESTS_REDIS_H
#define KVTIER_TESTS_REDIS_H

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

typedef struct redis_srv {
    pid_t pid;
    int port;
    char dir[128];
} redis_srv_t;

static inline bool redis_port_free_(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    if (fd >= 0) close(fd);
    return ok;
}

/* A port p with p and p + 10000 free, not 6379. */
static inline int redis_free_port(void) {
    for (int tries = 0; tries < 200; tries++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t l = sizeof(a);
        if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 || getsockname(fd, (struct sockaddr *)&a, &l) != 0) {
            close(fd);
            continue;
        }
        close(fd);
        int p = ntohs(a.sin_port);
        if (p == 6379 || p > 55535 || p < 1024) continue;
        if (redis_port_free_(p) && redis_port_free_(p + 10000)) return p;
    }
    return -1;
}

static inline void redis_sleep_ms(unsigned ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A connection to the server with a 2 s timeout, or NULL. */
static inline redisContext *redis_connect_(int port) {
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c == NULL || c->err) {
        if (c) redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    return c;
}

/* A command on the server, its reply (caller frees), or NULL. */
static inline redisReply *redis_cmd(int port, const char *fmt, ...) {
    redisContext *c = redis_connect_(port);
    if (c == NULL) return NULL;
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    redisFree(c);
    return r;
}

/* The same after AUTH [user] password (user NULL: the default user). */
static inline redisReply *redis_cmd_as(int port, const char *user, const char *pass, const char *fmt, ...) {
    redisContext *c = redis_connect_(port);
    if (c == NULL) return NULL;
    redisReply *a = user ? redisCommand(c, "AUTH %s %s", user, pass) : redisCommand(c, "AUTH %s", pass);
    bool ok = a && a->type == REDIS_REPLY_STATUS;
    if (a) freeReplyObject(a);
    redisReply *r = NULL;
    if (ok) {
        va_list ap;
        va_start(ap, fmt);
        r = redisvCommand(c, fmt, ap);
        va_end(ap);
    }
    redisFree(c);
    return r;
}

/* The port of slot's master, from a CLUSTER SLOTS reply (reply freed), or -1. */
static inline int redis_slot_port(redisReply *slots, unsigned slot) {
    int port = -1;
    for (size_t k = 0; slots && slots->type == REDIS_REPLY_ARRAY && k < slots->elements; k++) {
        redisReply *e = slots->element[k];
        if ((unsigned)e->element[0]->integer <= slot && slot <= (unsigned)e->element[1]->integer)
            port = (int)e->element[2]->element[1]->integer;
    }
    if (slots) freeReplyObject(slots);
    return port;
}

/* Up: PONG, or NOAUTH from a server that wants a password. */
static inline bool redis_up_(int port) {
    redisReply *r = redis_cmd(port, "PING");
    bool ok = r && ((r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0) ||
                    (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOAUTH", 6) == 0));
    if (r) freeReplyObject(r);
    return ok;
}

static inline bool redis_reply_has_(int port, const char *cmd, const char *want) {
    redisReply *r = redis_cmd(port, cmd);
    bool ok = r && (r->type == REDIS_REPLY_STATUS || r->type == REDIS_REPLY_STRING) && strstr(r->str, want) != NULL;
    if (r) freeReplyObject(r);
    return ok;
}

static inline void redis_rmrf_(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[512];
    while (d && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
        unlink(p);
    }
    if (d) closedir(d);
    rmdir(dir);
}

/* A data directory and a free port for s (redis_launch starts it). */
static inline int redis_prepare(redis_srv_t *s) {
    memset(s, 0, sizeof(*s));
    snprintf(s->dir, sizeof(s->dir), "/tmp/kvt-redis-XXXXXX");
    if (mkdtemp(s->dir) == NULL) return -1;
    s->port = redis_free_port();
    return s->port < 0 ? -1 : 0;
}

/* Starts the server of a prepared s (a cluster node reads s->dir/nodes.conf,
 * which the caller may have written); extra: NULL-terminated further
 * arguments (e.g. "--maxmemory", "2mb"). */
static inline int redis_launch(redis_srv_t *s, bool cluster, const char *const *extra) {
    char port[16], log[200], conf[200];
    snprintf(port, sizeof(port), "%d", s->port);
    snprintf(log, sizeof(log), "%s/redis.log", s->dir);
    snprintf(conf, sizeof(conf), "%s/nodes.conf", s->dir);
    const char *argv[48] = {"redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                            "--dir", s->dir, "--logfile", log, "--daemonize", "no", "--protected-mode", "no"};
    int n = 17;
    if (cluster) {
        const char *c[] = {"--cluster-enabled", "yes", "--cluster-config-file", conf, "--cluster-node-timeout", "1000",
                           "--cluster-require-full-coverage", "no", "--cluster-replica-validity-factor", "0"};
        for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) argv[n++] = c[i];
    }
    for (int i = 0; extra && extra[i] && n < 46; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int nul = open("/dev/null", O_RDWR);
        if (nul >= 0) dup2(nul, 1), dup2(nul, 2);
        execvp("redis-server", (char *const *)argv);
        _exit(127);
    }
    s->pid = pid;
    for (int i = 0; i < 500; i++) { /* up to 5 s */
        if (redis_up_(s->port)) return 0;
        if (waitpid(pid, NULL, WNOHANG) == pid) {
            s->pid = 0;
            return -1;
        }
        redis_sleep_ms(10);
    }
    return -1;
}

static inline int redis_start_args(redis_srv_t *s, bool cluster, const char *const *extra) {
    return redis_prepare(s) == 0 ? redis_launch(s, cluster, extra) : -1;
}

static inline int redis_start(redis_srv_t *s, const char *const *extra) { return redis_start_args(s, false, extra); }

/* Kills the server (SIGKILL, its group), reaps it; keep_dir for a restart. */
static inline void redis_kill(redis_srv_t *s) {
    if (s->pid > 0) {
        kill(-s->pid, SIGKILL);
        kill(s->pid, SIGKILL);
        waitpid(s->pid, NULL, 0);
    }
    s->pid = 0;
}

static inline void redis_stop(redis_srv_t *s) {
    redis_kill(s);
    if (s->dir[0]) redis_rmrf_(s->dir);
    s->dir[0] = 0;
}

/* ---- a six-node cluster ---- */

#define CLUSTER_NODES 6

typedef struct redis_cluster {
    redis_srv_t n[CLUSTER_NODES];
    char url[512];
} redis_cluster_t;

static inline void cluster_stop(redis_cluster_t *c) {
    for (int i = 0; i < CLUSTER_NODES; i++) redis_stop(&c->n[i]);
}

static inline bool cluster_ok_(int port, const char *pass) {
    redisReply *r = pass ? redis_cmd_as(port, NULL, pass, "CLUSTER INFO") : redis_cmd(port, "CLUSTER INFO");
    bool ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok") != NULL;
    if (r) freeReplyObject(r);
    return ok;
}

/* How many nodes answer ROLE as masters, and node 0's CLUSTER NODES counts as many masters: a
 * replica just created reads "master" until its REPLICATE takes hold, and a test that picks a
 * master by either view must not pick it (-1 when the two views differ). */
static inline int cluster_masters_(const redis_cluster_t *c, int nodes, const char *pass) {
    int roles = 0, listed = 0;
    for (int i = 0; i < nodes; i++) {
        redisReply *r = pass ? redis_cmd_as(c->n[i].port, NULL, pass, "ROLE") : redis_cmd(c->n[i].port, "ROLE");
        roles += r && r->type == REDIS_REPLY_ARRAY && r->elements > 0 && r->element[0]->type == REDIS_REPLY_STRING &&
                 strcmp(r->element[0]->str, "master") == 0;
        if (r) freeReplyObject(r);
    }
    redisReply *r = pass ? redis_cmd_as(c->n[0].port, NULL, pass, "CLUSTER NODES") : redis_cmd(c->n[0].port, "CLUSTER NODES");
    for (const char *l = r && r->type == REDIS_REPLY_STRING ? r->str : NULL; l && *l;) {
        const char *end = strchr(l, '\n');
        size_t n = end ? (size_t)(end - l) : strlen(l);
        char line[512];
        snprintf(line, sizeof(line), "%.*s", (int)(n < sizeof(line) - 1 ? n : sizeof(line) - 1), l);
        char id[64], addr[128], flags[128];
        if (sscanf(line, "%63s %127s %127s", id, addr, flags) == 3 && strstr(flags, "master")) listed++;
        l = end ? end + 1 : NULL;
    }
    if (r) freeReplyObject(r);
    return roles == listed ? roles : -1;
}

static inline int cluster_start_opts(redis_cluster_t *c, int masters, int replicas, const char *const *extra, const char *pass) {
    memset(c, 0, sizeof(*c));
    int nodes = masters * (1 + replicas);
    if (masters < 1 || nodes > CLUSTER_NODES) return -1;
    const char *args[24];
    int na = 0;
    if (pass) args[na++] = "--requirepass", args[na++] = pass, args[na++] = "--masterauth", args[na++] = pass;
    for (int i = 0; extra && extra[i] && na < 23; i++) args[na++] = extra[i];
    args[na] = NULL;
    for (int i = 0; i < nodes; i++)
        if (redis_start_args(&c->n[i], true, args) != 0) return -1;
    char cmd[1024];
    int k = snprintf(cmd, sizeof(cmd), "%s%s redis-cli --cluster create", pass ? "REDISCLI_AUTH=" : "", pass ? pass : "");
    for (int i = 0; i < nodes; i++) k += snprintf(cmd + k, sizeof(cmd) - (size_t)k, " 127.0.0.1:%d", c->n[i].port);
    snprintf(cmd + k, sizeof(cmd) - (size_t)k, " --cluster-replicas %d --cluster-yes >%s/create.log 2>&1", replicas, c->n[0].dir);
    if (system(cmd) != 0) return -1;
    k = snprintf(c->url, sizeof(c->url), "redis-cluster://127.0.0.1:%d,127.0.0.1:%d", c->n[0].port, c->n[nodes > 1].port);
    for (int t = 0; t < 1000; t++) { /* up to 10 s: every node agrees the cluster is up, and the roles settled */
        bool all = true;
        for (int i = 0; i < nodes && all; i++) all = cluster_ok_(c->n[i].port, pass);
        if (all && cluster_masters_(c, nodes, pass) == masters) return 0;
        redis_sleep_ms(10);
    }
    return -1;
}

static inline int cluster_start(redis_cluster_t *c) { return cluster_start_opts(c, 3, 1, NULL, NULL); }

#endif
