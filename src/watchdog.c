// watchdog.c: deadlines on a rank's waits (see watchdog.h).
#include "watchdog.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common.h"

// ----------------------------------------------------------------------------
// state (one per process; waits happen on the main thread, a guard's thread acts only while
// the main thread is blocked in the guarded call)

#define MAX_HOOKS 16
#define CHECK_EVERY 256   // polls between two health checks of the transports

static struct {
    double timeout;               // seconds; 0 = off
    double grace;                 // seconds added to it (watchdog_set_grace)
    char grace_why[96];
    int rank;
    int fired;
    char phase[64];
    void (*report)(void);
    void (*end)(void);
    watchdog_hook hooks[MAX_HOOKS];
    int n_hooks;
} W = {.phase = "setup"};

void watchdog_configure(double timeout_s, int rank) {
    W.timeout = timeout_s > 0 ? timeout_s : 0;
    W.rank = rank;
    W.fired = 0;
    W.grace = 0;
}

void watchdog_set_grace(double seconds, const char *why) {
    W.grace = seconds > 0 ? seconds : 0;
    snprintf(W.grace_why, sizeof W.grace_why, "%s", W.grace > 0 && why ? why : "");
}

int watchdog_enabled(void) { return W.timeout > 0; }
int watchdog_fired(void) { return W.fired; }
const char *watchdog_phase(void) { return W.phase; }

unsigned long watchdog_next_seq(void) {
    static unsigned long seq;
    return ++seq;
}

void watchdog_set_phase(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(W.phase, sizeof W.phase, fmt, ap);
    va_end(ap);
}

void watchdog_set_fatal(void (*report)(void), void (*end)(void)) {
    W.report = report;
    W.end = end;
}

int watchdog_register(const watchdog_hook *h) {
    if (W.n_hooks == MAX_HOOKS) return ft_error("watchdog: more than %d transports registered", MAX_HOOKS);
    W.hooks[W.n_hooks++] = *h;
    return 0;
}

void watchdog_unregister(void *ctx) {
    for (int i = 0; i < W.n_hooks; i++)
        if (W.hooks[i].ctx == ctx) {
            W.hooks[i] = W.hooks[--W.n_hooks];
            i--;
        }
}

// ----------------------------------------------------------------------------
// ending the job

static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void watchdog_format_bytes(char *buf, size_t n, size_t bytes) {
    if (bytes < 1024) snprintf(buf, n, "%zu B", bytes);
    else if (bytes < ((size_t)1 << 20)) snprintf(buf, n, "%.1f KiB", bytes / 1024.0);
    else if (bytes < ((size_t)1 << 30)) snprintf(buf, n, "%.1f MiB", bytes / 1048576.0);
    else snprintf(buf, n, "%.2f GiB", bytes / 1073741824.0);
}

// The error is recorded: report it, then end the job through main's end callback (MPI_Abort
// or _exit; the process's exit takes its CUDA context and NCCL kernels with it). The
// transports' abort hooks are not run before that: ncclCommAbort synchronises the
// communicator's internal stream, whose last kernel can wait (through our events) on compute
// that waits on another communicator's stuck collective, so the abort, and the rank, would
// hang instead of ending (NVIDIA/nccl issues 829 and 1013). Without an end callback (library
// tests) the hooks abandon the transports' work and -1 is returned; every later wait fails
// at once.
// from_guard: on a guard's thread (watchdog_guard_begin), where the transports' hooks are not
// run (they belong to the main thread, blocked inside the guarded call on one of them).
static int fire(int from_guard) {
    W.fired = 1;
    if (W.report) W.report();
    if (W.end) W.end();
    for (int i = 0; !from_guard && i < W.n_hooks; i++)
        if (W.hooks[i].abort) W.hooks[i].abort(W.hooks[i].ctx);
    if (!from_guard) W.n_hooks = 0;
    return -1;
}

static int timed_out(const char *op, const char *group, size_t bytes, double waited, int from_guard) {
    char size[32] = "", pending[256] = "";
    if (bytes) {
        size[0] = ',';
        size[1] = ' ';
        watchdog_format_bytes(size + 2, sizeof size - 2, bytes);
    }
    unsigned long oldest = ~0ul;
    for (int i = 0; !from_guard && i < W.n_hooks; i++) {
        char d[200];
        unsigned long seq = 0;
        if (W.hooks[i].describe && W.hooks[i].describe(W.hooks[i].ctx, d, sizeof d, &seq) && seq < oldest) {
            oldest = seq;
            snprintf(pending, sizeof pending, "; oldest unfinished: %s", d);
        }
    }
    char grace[160] = "";
    if (W.grace > 0) snprintf(grace, sizeof grace, " + %g s for %s", (double)(long)(W.grace * 10 + 0.5) / 10, W.grace_why);
    ft_error_clear();
    ft_error("rank %d: %s: %s (%s%s) made no progress for %g s (--collective_timeout %g%s%s); aborting", W.rank,
             W.phase, op, group ? group : "world", size, (double)(long)(waited * 10 + 0.5) / 10, W.timeout, grace,
             pending);
    return fire(from_guard);
}

// the wait for `op` on `group` failed for good (a transport's failure, or a poll's
// WATCHDOG_POLL_FATAL): `msg`, with this rank, the phase and the operation in front
static int wait_failed(const char *op, const char *group, const char *msg) {
    char m[800];
    snprintf(m, sizeof m, "%s", msg);   // (msg may be the error record itself)
    ft_error_clear();
    ft_error("rank %d: %s: %s (%s): %s; aborting", W.rank, W.phase, op, group ? group : "world", m);
    return fire(0);
}

static int check_hooks(const char *op, const char *group) {
    char msg[800];
    for (int i = 0; i < W.n_hooks; i++)
        if (W.hooks[i].check && W.hooks[i].check(W.hooks[i].ctx, msg, sizeof msg) != 0)
            return wait_failed(op, group, msg);
    return 0;
}

// ----------------------------------------------------------------------------
// the wait

int watchdog_wait(watchdog_poll_fn poll, void *ctx, const char *op, const char *group, size_t bytes) {
    if (W.fired) return ft_error("rank %d: %s: %s after the watchdog ended the job", W.rank, W.phase, op);
    const double t0 = now_seconds();
    long sleep_ns = WATCHDOG_SLEEP_MIN_NS;
    for (unsigned long i = 1;; i++) {
        const int r = poll(ctx);
        // (a transport's asynchronous error can let its work "complete" without running it)
        if (r > 0) return check_hooks(op, group);
        if (r == WATCHDOG_POLL_FATAL) return wait_failed(op, group, ft_error_message());
        if (r < 0) return -1;   // an ordinary error: the caller's path reports it
        if (i % CHECK_EVERY == 0 && check_hooks(op, group) != 0) return -1;
        const double waited = now_seconds() - t0;
        if (W.timeout > 0 && waited >= W.timeout + W.grace) return timed_out(op, group, bytes, waited, 0);
        if (waited < WATCHDOG_SPIN_S) continue;
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
        sleep_ns = sleep_ns * 2 < WATCHDOG_SLEEP_MAX_NS ? sleep_ns * 2 : WATCHDOG_SLEEP_MAX_NS;
        if (check_hooks(op, group) != 0) return -1;
    }
}

// ----------------------------------------------------------------------------
// the guard of a blocking call

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int active, done, fired;
    const char *op, *group;
    double t0;
    char msg[1024];   // the line, recorded on the guard's thread (the error record is per thread)
} G = {.mu = PTHREAD_MUTEX_INITIALIZER};

// The guard's thread: sleeps on the condition until the call returned (done) or the deadline
// passed; then fires while holding the mutex, so that a call returning at that moment waits
// in watchdog_guard_end until the process ends (or, without an end callback, until the
// error is recorded).
static void *guard_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&G.mu);
    for (;;) {
        if (G.done) break;
        const double deadline = G.t0 + W.timeout + W.grace;
        const double left = deadline - now_seconds();
        if (left <= 0) {
            G.fired = 1;
            (void)timed_out(G.op, G.group, 0, now_seconds() - G.t0, 1);
            snprintf(G.msg, sizeof G.msg, "%s", ft_error_message());
            break;
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        const double wake = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + (left < 1.0 ? left : 1.0);
        ts.tv_sec = (time_t)wake;
        ts.tv_nsec = (long)((wake - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&G.cv, &G.mu, &ts);
    }
    pthread_mutex_unlock(&G.mu);
    return NULL;
}

int watchdog_guard_begin(const char *op, const char *group) {
    if (W.timeout <= 0 || W.fired) return 0;
    if (G.active) return ft_error("watchdog: a guard is already active (%s)", G.op);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);   // (the deadline ignores wall-clock jumps)
    pthread_cond_init(&G.cv, &attr);
    pthread_condattr_destroy(&attr);
    G.op = op;
    G.group = group;
    G.done = G.fired = 0;
    G.t0 = now_seconds();
    if (pthread_create(&G.thread, NULL, guard_main, NULL) != 0) {
        pthread_cond_destroy(&G.cv);
        return ft_error("watchdog: could not start the guard of %s", op);
    }
    G.active = 1;
    return 0;
}

int watchdog_guard_end(void) {
    if (!G.active) return 0;
    pthread_mutex_lock(&G.mu);
    G.done = 1;
    pthread_cond_signal(&G.cv);
    pthread_mutex_unlock(&G.mu);
    pthread_join(G.thread, NULL);
    pthread_cond_destroy(&G.cv);
    G.active = 0;
    if (!G.fired) return 0;
    ft_error_clear();   // (this thread's record: the line was recorded on the guard's)
    return ft_error("%s", G.msg);
}
