#include "group.h"

#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>

#include <sys/prctl.h>
#include <unistd.h>

#include "util.h"

static volatile sig_atomic_t g_signalled;
static pid_t g_coordinator;

static void on_signal(int sig) { g_signalled = sig; }

void group_catch_signals(void) {
    g_coordinator = getpid();
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

void group_child_signals(void) {
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    /* A child dies with its coordinator, even one killed with SIGKILL (which
     * cannot stop the group): no rank runs on as an orphan. The parent may
     * have died before the prctl: then the check after it catches it. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != g_coordinator) _exit(1);
}

static void signal_all(child_t *ch, uint32_t n, int sig) {
    for (uint32_t s = 0; s < n; s++)
        if (!ch[s].exited) kill(ch[s].pid, sig);
}

int group_watch(child_t *ch, uint32_t n, _Atomic int *stop, int *why, uint64_t grace_ns,
                bool (*revive)(void *arg, uint32_t idx, int status), void *arg) {
    int dead = -1;
    uint64_t term_at = 0, kill_at = 0;
    for (uint32_t left = n; left > 0;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid > 0) {
            for (uint32_t r = 0; r < n; r++)
                if (ch[r].pid == pid) {
                    bool bad = WIFSIGNALED(status) || WEXITSTATUS(status) != 0;
                    if (bad && dead == -1 && revive && revive(arg, r, status)) break; /* replaced: still running */
                    ch[r].exited = true;
                    ch[r].status = status;
                    left--;
                    if (bad && dead == -1) {
                        dead = (int)r;
                        *why = status;
                        term_at = now_ns() + grace_ns;
                        kill_at = term_at + 2000000000ull;
                    }
                }
            continue;
        }
        if (g_signalled && !kill_at) {
            *why = g_signalled;
            dead = -2;
            atomic_store(stop, 1);
            term_at = now_ns();
            kill_at = term_at + 2000000000ull;
        }
        if (term_at && now_ns() > term_at) {
            atomic_store(stop, 1);
            signal_all(ch, n, SIGTERM);
            term_at = UINT64_MAX; /* once */
        }
        if (kill_at && now_ns() > kill_at) signal_all(ch, n, SIGKILL);
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    return dead;
}
