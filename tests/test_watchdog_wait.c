// test_watchdog_wait.c: the deadline on a rank's waits (src/watchdog.c), without MPI or a GPU.
// About 2 s (three deliberate timeouts and one 1-s wait).
//   1. a wait whose poll completes returns 0; a failing poll returns -1 with its own error
//   2. with --collective_timeout off, a slow operation is waited for to the end
//   3. a poll that never completes: after the timeout (not before) one line naming the rank,
//      the phase, the operation, its group and size, the oldest unfinished operation of the
//      registered transports (the one with the smallest sequence number); main's report
//      callback runs once, then the end callback, with no transport aborted before it (an
//      ncclCommAbort can hang on a stream that waits on another stuck communicator); every
//      later wait fails at once
//   4. back-off: past WATCHDOG_SPIN_S, a 1-s wait polls at most a few thousand times
//      (without the sleeps it polls millions of times, even on a loaded machine)
//   5. a transport's health check failing (an NCCL asynchronous error) ends the wait with
//      that transport's message behind the rank and the phase; without an end callback (a
//      library caller) every transport's abort hook runs and the wait returns -1
//   6. a grace (rank 0 writing a checkpoint) lengthens every wait's deadline by its seconds,
//      is named in the line, and is gone once set to 0
//   7. a guarded blocking call (NCCL's init): one that returns in time leaves no trace; one
//      blocked past the timeout gets the line and main's callbacks from the guard's thread
//      while it still blocks, and watchdog_guard_end returns -1 with the line recorded on the
//      caller's thread (the error record is per thread); with the timeout off, no guard
//   8. a poll's fatal failure (WATCHDOG_POLL_FATAL: a sticky CUDA error) ends the job at once
//      with one line naming the rank, the phase, the operation and the poll's error; a
//      transport failing while the operation completed (its work skipped) does the same
#include <time.h>

#include "common.h"
#include "test.h"
#include "watchdog.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// ----------------------------------------------------------------------------
// polls

typedef struct { int calls, complete_after, fail, fatal; double until; long late_polls; double t0; } poll_state;

static int poll_fn(void *ctx) {
    poll_state *p = ctx;
    p->calls++;
    if (p->fail) return ft_error("MPI_Test failed: broken pipe");
    if (p->fatal) {
        ft_error("CUDA error: an illegal memory access was encountered (cudaErrorIllegalAddress, from cudaStreamQuery)");
        return WATCHDOG_POLL_FATAL;
    }
    if (p->until > 0) {
        const double t = now() - p->t0;
        if (t > WATCHDOG_SPIN_S + 0.01) p->late_polls++;
        return t >= p->until;
    }
    return p->complete_after > 0 && p->calls >= p->complete_after;
}

// ----------------------------------------------------------------------------
// fake transports and main's callbacks

typedef struct { int aborted, fail_check; unsigned long seq; const char *what; } transport;

static int t_check(void *ctx, char *buf, size_t n) {
    transport *t = ctx;
    if (!t->fail_check) return 0;
    snprintf(buf, n, "nccl: the shard group reports an asynchronous error: remote process exited");
    return -1;
}
static int t_describe(void *ctx, char *buf, size_t n, unsigned long *seq) {
    transport *t = ctx;
    if (!t->what) return 0;
    snprintf(buf, n, "%s", t->what);
    *seq = t->seq;
    return 1;
}
static void t_abort(void *ctx) { ((transport *)ctx)->aborted++; }

static _Atomic int g_reports, g_ends, g_aborts_at_end;   // (test_guard: set on the guard's thread)
static char g_reported[1024];
static transport g_t[2];
static void on_report(void) {
    g_reports++;
    snprintf(g_reported, sizeof g_reported, "%s", ft_error_message());
}
static void on_end(void) {
    g_ends++;
    g_aborts_at_end = g_t[0].aborted + g_t[1].aborted;
}

static void register_transports(void) {
    for (int i = 0; i < 2; i++) {
        watchdog_hook h = {&g_t[i], t_check, t_describe, t_abort};
        EXPECT(watchdog_register(&h) == 0, "register");
    }
}

// ----------------------------------------------------------------------------
// cases

static void test_complete_and_fail(void) {
    watchdog_configure(5, 0);
    poll_state p = {.complete_after = 3};
    EXPECT(watchdog_wait(poll_fn, &p, "all_gather", "world", 8) == 0 && p.calls == 3, "completes after 3 polls: %d", p.calls);
    ft_error_clear();
    poll_state f = {.fail = 1};
    EXPECT(watchdog_wait(poll_fn, &f, "all_gather", "world", 8) == -1, "a failing poll fails the wait");
    EXPECT(strcmp(ft_error_message(), "MPI_Test failed: broken pipe") == 0, "its own error: %s", ft_error_message());
    EXPECT(!watchdog_fired(), "an ordinary failure does not fire the watchdog");
    ft_error_clear();
    watchdog_configure(0, 0);
    poll_state slow = {.until = 0.3, .t0 = now()};
    EXPECT(!watchdog_enabled() && watchdog_wait(poll_fn, &slow, "barrier", "world", 0) == 0,
           "timeout off: a 0.3-s operation completes");
}

static void test_timeout(void) {
    watchdog_configure(0.2, 3);
    watchdog_set_phase("step %d", 7);
    watchdog_set_fatal(on_report, on_end);
    g_t[0] = (transport){.seq = 12, .what = "reduce_scatter on the shard group, 1.2 MiB, step 7"};
    g_t[1] = (transport){.seq = 9, .what = "all_gather on the shard group, 3.0 MiB, step 7"};
    register_transports();
    poll_state p = {0};
    const double t0 = now();
    int rc = watchdog_wait(poll_fn, &p, "all_gather", "shard group of 2 ranks", (size_t)1258291);
    const double took = now() - t0;
    EXPECT(rc == -1 && took >= 0.2 && took < 0.7, "times out after the deadline: rc %d after %.3f s", rc, took);
    // the seconds waited (0.2 s, printed to 0.1 s) are compared apart, with room for a loaded machine
    const char *head = "rank 3: step 7: all_gather (shard group of 2 ranks, 1.2 MiB) made no progress for ",
               *tail = " s (--collective_timeout 0.2; oldest unfinished: all_gather on the shard group, 3.0 MiB, step 7); "
                       "aborting";
    const char *msg = ft_error_message();
    const size_t nh = strlen(head), nt = strlen(tail), nm = strlen(msg);
    double secs = -1;
    const int shape = nm > nh + nt && strncmp(msg, head, nh) == 0 && strcmp(msg + nm - nt, tail) == 0 &&
                      sscanf(msg + nh, "%lf", &secs) == 1;
    EXPECT(shape && secs >= 0.2 && secs < 0.7, "the line:\n  got  %s\n  want %s<0.2 .. 0.6>%s", msg, head, tail);
    EXPECT(g_reports == 1 && strcmp(g_reported, msg) == 0, "main's report ran once with the line (%d)", g_reports);
    EXPECT(g_ends == 1 && g_aborts_at_end == 0, "ended with no transport aborted first (%d ends, %d aborts)", g_ends,
           g_aborts_at_end);
    EXPECT(watchdog_fired(), "fired");
    poll_state q = {.complete_after = 1};
    EXPECT(watchdog_wait(poll_fn, &q, "barrier", "world", 0) == -1 && q.calls == 0, "later waits fail at once");
}

static void test_backoff(void) {
    watchdog_configure(0, 0);
    poll_state p = {.until = 1.0, .t0 = now()};
    EXPECT(watchdog_wait(poll_fn, &p, "all_reduce", "world", 8) == 0, "a 1-s wait completes");
    // past the spin phase: at most (1 s - spin) / WATCHDOG_SLEEP_MIN_NS polls even if every
    // sleep were the shortest; with the doubling, about 1 s / WATCHDOG_SLEEP_MAX_NS
    EXPECT(p.late_polls > 0 && p.late_polls < 5000, "%ld polls after the spin phase of a 1-s wait (%d in all)",
           p.late_polls, p.calls);
    printf("     back-off: %ld polls after the spin phase of a 1-s wait, %d in all\n", p.late_polls, p.calls);
}

// with_end: main's end callback is set (it returns here; the real one does not)
static void test_check_fails(int with_end) {
    watchdog_configure(5, 1);
    watchdog_set_fatal(on_report, with_end ? on_end : NULL);
    watchdog_set_phase("eval at step %d", 4);
    g_reports = g_ends = 0;
    g_t[0] = (transport){0};
    g_t[1] = (transport){.fail_check = 1};
    register_transports();
    poll_state p = {0};
    const double t0 = now();
    EXPECT(watchdog_wait(poll_fn, &p, "device synchronize", "compute stream", 0) == -1 && now() - t0 < 1,
           "a failed transport ends the wait at once");
    const char *want = "rank 1: eval at step 4: device synchronize (compute stream): nccl: the shard group reports "
                       "an asynchronous error: remote process exited; aborting";
    EXPECT(strcmp(ft_error_message(), want) == 0, "the line:\n  got  %s\n  want %s", ft_error_message(), want);
    if (with_end)   // (the real end does not return: the aborts after it never run)
        EXPECT(g_reports == 1 && g_ends == 1 && g_aborts_at_end == 0, "reported, ended, nothing aborted first (%d %d %d)",
               g_reports, g_ends, g_aborts_at_end);
    else
        EXPECT(g_reports == 1 && g_ends == 0 && g_t[0].aborted == 1 && g_t[1].aborted == 1,
               "no end callback: reported, both transports aborted (%d %d %d %d)", g_reports, g_ends, g_t[0].aborted,
               g_t[1].aborted);
    watchdog_unregister(&g_t[0]);
    watchdog_unregister(&g_t[1]);
}

static void test_fatal_poll(void) {
    watchdog_configure(5, 1);
    watchdog_set_fatal(on_report, on_end);
    watchdog_set_phase("step %d", 3);
    g_reports = g_ends = 0;
    poll_state p = {.fatal = 1};
    ft_error_clear();   // (the cases before left their lines)
    const double t0 = now();
    EXPECT(watchdog_wait(poll_fn, &p, "all_reduce of host doubles", "shard group of 2 ranks", 8) == -1 &&
           now() - t0 < 1, "a fatal poll ends the wait at once");
    const char *want = "rank 1: step 3: all_reduce of host doubles (shard group of 2 ranks): CUDA error: an illegal "
                       "memory access was encountered (cudaErrorIllegalAddress, from cudaStreamQuery); aborting";
    EXPECT(strcmp(ft_error_message(), want) == 0, "the line:\n  got  %s\n  want %s", ft_error_message(), want);
    EXPECT(g_reports == 1 && g_ends == 1 && watchdog_fired(), "reported and ended (%d %d)", g_reports, g_ends);
    // a transport that failed while the wait's operation completed at the first poll
    watchdog_configure(5, 1);
    g_reports = g_ends = 0;
    g_t[0] = (transport){.fail_check = 1};
    watchdog_hook h = {&g_t[0], t_check, t_describe, t_abort};
    EXPECT(watchdog_register(&h) == 0, "register");
    poll_state q = {.complete_after = 1};
    EXPECT(watchdog_wait(poll_fn, &q, "compute stream", "step", 0) == -1 && g_reports == 1 && g_ends == 1,
           "a transport failed by the time its operation completed: the job ends (%d %d)", g_reports, g_ends);
    watchdog_unregister(&g_t[0]);
}

static void test_grace(void) {
    watchdog_configure(0.2, 0);
    watchdog_set_fatal(NULL, NULL);
    watchdog_set_phase("checkpoint at step %d", 5);
    watchdog_set_grace(0.4, "rank 0 writing the checkpoint, 84.0 GB");
    poll_state p = {.until = 0.45, .t0 = now()};
    EXPECT(watchdog_wait(poll_fn, &p, "all_reduce of host doubles", "world", 0) == 0,
           "a 0.45-s wait within timeout 0.2 + grace 0.4 completes: %s", ft_error_message());
    poll_state q = {0};
    const double t0 = now();
    const int rc = watchdog_wait(poll_fn, &q, "all_reduce of host doubles", "world", 0);
    const double took = now() - t0;
    EXPECT(rc == -1 && took >= 0.6 && took < 1.2, "a stuck wait ends after timeout + grace: rc %d after %.3f s", rc, took);
    // (the seconds waited are left out: a loaded machine can overshoot the deadline's 0.6 s)
    const char *head = "rank 0: checkpoint at step 5: all_reduce of host doubles (world) made no progress for ",
               *tail = " s (--collective_timeout 0.2 + 0.4 s for rank 0 writing the checkpoint, 84.0 GB); aborting";
    const char *msg = ft_error_message();
    EXPECT(strncmp(msg, head, strlen(head)) == 0 && strlen(msg) > strlen(tail) &&
               strcmp(msg + strlen(msg) - strlen(tail), tail) == 0,
           "the line:\n  got  %s\n  want %s<seconds>%s", msg, head, tail);
    watchdog_configure(0.2, 0);   // afresh (it fired); the grace is gone too
    watchdog_set_grace(0.4, "x");
    watchdog_set_grace(0, NULL);
    poll_state r = {.until = 0.45, .t0 = now()};
    EXPECT(watchdog_wait(poll_fn, &r, "barrier", "world", 0) == -1, "grace 0: the 0.45-s wait times out at 0.2 s");
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static void test_guard(void) {
    watchdog_configure(0.3, 2);
    watchdog_set_phase("setup");
    watchdog_set_fatal(on_report, on_end);
    g_reports = g_ends = 0;
    EXPECT(watchdog_guard_begin("ncclCommInitRank", "world of 4 ranks") == 0, "guard starts");
    sleep_s(0.1);   // a call that returns in time
    EXPECT(watchdog_guard_end() == 0 && g_reports == 0 && !watchdog_fired(),
           "a 0.1-s call under a 0.3-s guard: no line");
    const double t0 = now();
    EXPECT(watchdog_guard_begin("ncclCommInitRank", "world of 4 ranks") == 0, "guard starts again");
    while (g_ends == 0 && now() - t0 < 2) sleep_s(0.01);   // the blocked call (the end callback returns here)
    const double fired_after = now() - t0;
    EXPECT(g_reports == 1 && g_ends == 1 && fired_after >= 0.3 && fired_after < 1.0,
           "the guard's thread reported and ended after %.3f s while the call blocked (%d reports, %d ends)",
           fired_after, g_reports, g_ends);
    const char *head = "rank 2: setup: ncclCommInitRank (world of 4 ranks) made no progress for ";
    EXPECT(strncmp(g_reported, head, strlen(head)) == 0, "the reported line: %s", g_reported);
    ft_error_clear();
    EXPECT(watchdog_guard_end() == -1 && strcmp(ft_error_message(), g_reported) == 0 && watchdog_fired(),
           "guard end: -1 with the line on this thread: %s", ft_error_message());
    ft_error_clear();
    watchdog_configure(0, 0);
    g_reports = 0;
    EXPECT(watchdog_guard_begin("ncclCommSplit", "shard group") == 0, "timeout off: begin");
    sleep_s(0.05);
    EXPECT(watchdog_guard_end() == 0 && g_reports == 0, "timeout off: nothing fires");
    watchdog_set_fatal(NULL, NULL);
    g_reports = g_ends = 0;
}

int main(void) {
    test_guard();
    test_grace();
    test_complete_and_fail();
    test_backoff();
    test_timeout();
    test_check_fails(1);
    test_check_fails(0);
    test_fatal_poll();
    TEST_SUMMARY("test_watchdog_wait");
}
