// watchdog.h: a deadline on everything a rank waits for (--collective_timeout).
//
// A rank waits for its peers in collectives and for its GPU in host synchronisations. When a
// peer hangs (SIGSTOP, a dead node, a hung kernel), that wait would never end: the job would
// sit until the scheduler's time limit. Every such wait goes through watchdog_wait(): it
// polls the operation (without pause for WATCHDOG_SPIN_S, then with short sleeps that back
// off to WATCHDOG_SLEEP_MAX_NS, so a long wait does not burn a core) and, when the operation
// has not completed within the timeout, it
//   1. records ONE error line naming this rank, the phase (setup, step N, eval, checkpoint,
//      ...), the operation, its group and size, and how long it waited,
//   2. lets main print it (the report callback; main is the only place that prints),
//   3. ends the job through main's end callback (MPI_Abort, or _exit), which does not return;
//      the transports' abort hooks (ncclCommAbort) are not run first: an abort synchronises
//      a stream that may wait on another communicator's stuck collective, and would hang.
// Without an end callback (library tests) it runs the abort hooks and returns -1 instead,
// and every later wait fails at once. A failing GPU ends the job the same way, at once: a
// poll that finds a sticky device error (an illegal address, an uncorrectable ECC error:
// WATCHDOG_POLL_FATAL, src/cuda_wait.h), or a transport's health check that fails, records
// "rank R: <phase>: <operation> (<group>): <error>; aborting" instead of returning into code
// where the peers would wait for this rank in their next collective. Transports may also register a health check (NCCL's asynchronous errors), polled
// during waits, and a description of their oldest unfinished operation (added to the line).
//
// Calls that block inside a library and cannot be polled (ncclCommInitRank, ncclCommSplit,
// the PMI2 exchange of the NCCL id under srun without MPI) run under a guard instead
// (watchdog_guard_begin/end): a thread watches the clock while the caller blocks and, past
// the timeout, records the same line and ends the job from that thread (main's end callback:
// MPI_Abort while the main thread is inside NCCL or PMI2, not MPI; under the CPU emulator's
// NCCL, whose init is an MPI collective, MPICH has taken that abort from a second thread in
// every test run; the transports' hooks are neither described nor aborted from it: they
// belong to the blocked main thread). NCCL's init waits
// without a deadline of its own for every rank's bootstrap connection (a rank that died or
// stopped after the last barrier, a network NCCL cannot reach: NCCL_SOCKET_IFNAME).
//
// Not covered: MPI_Init's PMI fence (before the timeout is known), file I/O, and a rank stuck
// in its own host code with no peer waiting for it (a single rank: nothing waits on it).
// Setup collectives that block (MPI_Comm_split, NCCL init and split) are entered only after a
// deadline-bound barrier has shown that every rank reached them.
#pragma once
#include <stddef.h>

// Default --collective_timeout in seconds, as PyTorch's NCCL default (10 min). The longest
// legitimate wait in a job, the other ranks waiting while world rank 0 alone writes a
// checkpoint (12 bytes per parameter: fp32 master + two AdamW moments, 81 GB for CodeLlama-7b,
// 847 GB for 70B), gets a grace on top, sized by the bytes (WATCHDOG_MIN_WRITE_BPS below).
#define WATCHDOG_DEFAULT_TIMEOUT_S 600.0
// The slowest write rate a checkpoint or an export is granted (bytes/s): while world rank 0
// alone writes one, the other ranks wait for it in their collectives, for bytes / rate more
// than --collective_timeout (watchdog_set_grace). 50 MB/s: a loaded network filesystem client;
// a 70B checkpoint (847 GB) is granted 4.7 h, CodeLlama-7b's (81 GB) 27 min. Also while
// every rank reads its part of a checkpoint at the start (a rank that failed early waits).
#define WATCHDOG_MIN_WRITE_BPS 50e6
// Busy polling at the start of every wait (a collective's rounds progress only while MPI is
// polled, so the normal, short waits must not sleep) ...
#define WATCHDOG_SPIN_S 0.1
// ... then sleeps between polls, doubling from the first to the last value.
#define WATCHDOG_SLEEP_MIN_NS 20000L
#define WATCHDOG_SLEEP_MAX_NS 500000L

// A poll: 1 = the operation completed, 0 = not yet, -1 = it failed (ft_error recorded),
// WATCHDOG_POLL_FATAL = it failed in a way this rank cannot go on from (a sticky CUDA error:
// an illegal address, an uncorrectable ECC error; ft_error recorded): the wait ends the job
// as a timeout does, its one line naming the rank, the phase and the operation.
#define WATCHDOG_POLL_FATAL (-2)
typedef int (*watchdog_poll_fn)(void *ctx);

// What a transport registers (any callback may be NULL).
typedef struct {
    void *ctx;
    // -1 with a message in buf (size n) when the transport has failed on its own (e.g. an
    // NCCL asynchronous error: the wait can never complete), else 0
    int (*check)(void *ctx, char *buf, size_t n);
    // 1 and a short description of the oldest operation this transport has not seen
    // complete ("reduce_scatter on the shard group, 1.2 MiB, step 7") with its sequence
    // number (watchdog_next_seq() when it was started), else 0
    int (*describe)(void *ctx, char *buf, size_t n, unsigned long *seq);
    // abandon everything in flight so that nothing waits on it any more (ncclCommAbort)
    void (*abort)(void *ctx);
} watchdog_hook;

// Set the timeout (seconds; 0 = off: waits block without a deadline) and this rank's number
// (world rank, for the message). Call before the first wait; calling it again starts afresh
// (tests: it forgets that the watchdog fired).
void watchdog_configure(double timeout_s, int rank);
// 1 when a timeout is set.
int watchdog_enabled(void);
// Extra seconds every wait may take beyond the timeout, until set again (0 = none), and what
// they are for (named in the timeout's line, e.g. "rank 0 writing the checkpoint, 84.0 GB";
// copied). For the waits on one rank's long, legitimate work, as a checkpoint written by
// world rank 0 alone: a timeout sized for 7B would end a 70B job in every save.
void watchdog_set_grace(double seconds, const char *why);
// The phase named in the message: printf-style, e.g. ("step %d", 7), ("setup").
void watchdog_set_phase(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// The callbacks that end the job (see the top of this file). report prints the recorded
// error; end terminates every rank and should not return (if it does, as in tests, the wait
// returns -1).
void watchdog_set_fatal(void (*report)(void), void (*end)(void));
// Register a transport's hooks (copied) / remove those registered with `ctx`. 0 / -1.
int watchdog_register(const watchdog_hook *h);
void watchdog_unregister(void *ctx);

// Poll `poll(ctx)` until it reports completion (0) or failure (-1). `op` names the operation
// ("all_gather"), `group` its group ("shard group") and `bytes` its size (0 = not shown).
// With a timeout set, an operation that does not complete in time ends the job (or returns
// -1 without callbacks); without one, it polls until completion. A poll's fatal failure
// (WATCHDOG_POLL_FATAL) and a transport's failed health check, also one seen as the
// operation completes, end the job the same way.
int watchdog_wait(watchdog_poll_fn poll, void *ctx, const char *op, const char *group, size_t bytes);
// Guard one blocking call that cannot be polled (see the top of this file): between begin
// and end, a thread ends the job as a timed-out wait would, `op` and `group` naming the call
// in the line. Without a timeout set, nothing is started. One guard at a time, on the main
// thread. begin: 0 / -1 (the thread could not start). end: 0, or -1 when the guard fired
// without ending the process (no end callback: library tests), with the line recorded.
int watchdog_guard_begin(const char *op, const char *group);
int watchdog_guard_end(void);
// 1 after a timeout or a transport failure was reported.
int watchdog_fired(void);
// A process-wide increasing number for transports to order their operations (describe).
unsigned long watchdog_next_seq(void);
// The phase set last ("step 7"), for transports that record where an operation started.
const char *watchdog_phase(void);
// "8 B", "721.0 KiB", "1.2 MiB", "3.50 GiB" (as in the messages).
void watchdog_format_bytes(char *buf, size_t n, size_t bytes);
