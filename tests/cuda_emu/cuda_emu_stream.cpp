// cuda_emu_stream.cpp: the emulated runtime's streams, events, copies, memsets and device
// memory (see README.md, "Streams and ordering hazards").
//
// Synchronous mode (the default of the bare emulator, FT_EMU_SYNC=1): every operation runs
// before its call returns, as before. Asynchronous mode (cuemu_set_async(1); the default
// once cuda_emu_host.cpp is linked, i.e. in finetune_emu and test_backend_emu):
//   - each stream is a FIFO queue run by its own worker thread, which waits a seeded random
//     while (FT_EMU_SEED, FT_EMU_MAX_DELAY_US) before each operation, then runs it: kernel
//     launches (the grid runs on the block workers under the device lock, launch_run),
//     cudaMemcpyAsync/cudaMemsetAsync, cuBLASLt matmuls and NCCL collectives
//     (cuda_emu_host.cpp) all run there, later than the call that issued them;
//   - events record a stream's position; cudaStreamWaitEvent queues a wait for it;
//     cudaEventQuery/Synchronize, cudaStreamQuery/Synchronize and cudaDeviceSynchronize
//     are the only ways the host learns that work finished. Nothing else orders streams;
//   - the legacy default stream (0, cudaStreamLegacy) waits for the blocking streams'
//     earlier work and they wait for its (streams created without cudaStreamNonBlocking);
//     cudaStreamPerThread is one more blocking stream;
//   - host memory is treated as pinned: an async copy reads or writes it when it runs, not
//     at the call (CUDA stages pageable memory, a guarantee code should not lean on);
//     cudaMemcpy follows the documented synchronous behaviour per direction;
//   - a failed kernel leaves a sticky error, returned by the next synchronising call and
//     by cudaGetLastError (as a GPU fault does);
//   - cuStreamWaitValue32 (the driver's stream memory wait, reached through
//     cudaGetDriverEntryPointByVersion as CUDA 12+ programs do; tests/nccl_standin uses it):
//     the stream's worker polls a 32-bit word of pinned or device memory until the condition
//     holds; the host copies queued behind such a gate, not yet known passed, have sources the
//     host may still fill (the gate orders them), so the checker does not checksum them.
// With FT_EMU_VCLOCK (README.md, "Virtual clock") each stream and the host also keep a virtual
// time: an operation starts at max(its stream's, the host's after issuing it, awaited events')
// and ends its price later (cuda_emu_vclock.cpp); host syncs and event records carry the times.
// Every operation is checked for ordering hazards when it is issued (cuda_emu_shadow.cpp),
// with vector clocks kept here: each stream's clock says which operations of every stream
// come before its next one (stream order, event waits, legacy-stream order, and what the
// host knew complete when it issued it), so the verdict does not depend on the timing.
#include "cuda_emu.h"   // first: it must precede the CUDA headers
#include <cuda.h>       // (cuStreamWaitValue32)
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <atomic>
#include <string>

#include "cuda_emu_async.h"

namespace cuemu {

void stats_price(const std::string &name, double cost);   // (FT_EMU_STATS with the clock)

// ----------------------------------------------------------------------------
// state

namespace {

enum { IT_WORK, IT_WAIT };
struct Stream;
struct Item {
    uint64_t seq;
    int kind;
    Stream *wait_on;       // IT_WAIT: until this stream has finished wait_seq
    uint64_t wait_seq;
    std::function<void()> fn;
    double vt_host = 0, cost = 0;   // (virtual clock) the host's time when issued; the cost
};
struct Stream {
    int id;
    bool legacy, blocking;
    bool destroyed = false, has_thread = false;
    std::deque<Item> q;
    uint64_t enq = 0, done = 0;      // last issued / last finished position
    Clock clock;                     // what comes before its next operation
    unsigned long long rng = 0;
    pthread_cond_t work_cv = PTHREAD_COND_INITIALIZER;
    double vt = 0;                   // (virtual clock) when its last finished operation ends
    std::vector<double> vt_at{0.0};  // ... and each one, by position (grows while it runs)
};
struct Event {
    Stream *s = nullptr;
    uint64_t seq = 0;
    Clock clock;
    bool recorded = false;
    double vt_host = 0;              // (virtual clock) the host's time when recorded
};

struct Runtime {
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;
    std::vector<Stream *> streams;   // by id; never freed (queued waits refer to them)
    std::set<Stream *> live;         // valid handles
    std::set<Event *> events;
    Clock host;                      // what the host knows finished
    Stream *legacy = nullptr, *per_thread = nullptr;
    unsigned long long seed = 1;
    unsigned max_delay_us = 200;
    bool async = false, announced = false;
    cudaError_t sticky = cudaSuccess;
    char sticky_msg[2048] = "";
    bool vclock = false;             // FT_EMU_VCLOCK names a device (vc_on: and asynchronous)
    double host_vt = 0;              // the host thread's virtual time (seconds)
};
Runtime *R;                          // never destroyed: workers may outlive main()
int g_explicit = -1;                 // cuemu_set_async (wins over the environment)
int g_default = 0;                   // the program's default (set_async_default)

unsigned long long splitmix(unsigned long long x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

struct Lock {   // (the emulator's own code runs while it is held: EmuInside)
    Lock() {
        ++t_emu_inside;
        pthread_mutex_lock(&R->mu);
    }
    ~Lock() {
        pthread_mutex_unlock(&R->mu);
        --t_emu_inside;
    }
};

Stream *new_stream(bool legacy, bool blocking) {
    Stream *s = new Stream();
    s->id = (int)R->streams.size();
    s->legacy = legacy;
    s->blocking = blocking;
    const char *rank = getenv("PMI_RANK");
    s->rng = splitmix(R->seed * 0x9e3779b97f4a7c15ull + (unsigned long long)s->id * 7919 +
                      (rank ? strtoull(rank, nullptr, 10) : 0) * 104729);
    R->streams.push_back(s);
    if (!legacy) R->live.insert(s);
    return s;
}

Runtime *runtime() {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, [] {
        R = new Runtime();
        const char *seed = getenv("FT_EMU_SEED"), *delay = getenv("FT_EMU_MAX_DELAY_US");
        if (seed) R->seed = strtoull(seed, nullptr, 0);
        if (delay) R->max_delay_us = (unsigned)atoi(delay);
        R->legacy = new_stream(true, false);
        const char *sync = getenv("FT_EMU_SYNC");
        R->async = g_explicit >= 0 ? g_explicit == 1 : !(sync && !strcmp(sync, "1")) && g_default;
        R->vclock = vclock_device() != nullptr;
    });
    return R;
}

// the virtual clock runs (FT_EMU_VCLOCK, asynchronous mode only)
bool vc_on() { return R->vclock && R->async; }

// the first stream operation of an asynchronous run says so, once per process
void announce() {
    if (R->announced || !R->async) return;
    R->announced = true;
    shadow_init_once(R->seed);
    // stdout: stderr is for errors (tests count its lines); the hazard summary repeats the seed
    printf("cuda_emu: asynchronous streams, seed %llu (FT_EMU_SEED), delays up to %u us; "
           "ordering hazards are reported (FT_EMU_SYNC=1: synchronous)\n", R->seed, R->max_delay_us);
    if (R->vclock) vclock_announce();
    fflush(stdout);
}

Stream *resolve(cudaStream_t h) {
    if (h == nullptr || h == cudaStreamLegacy) return R->legacy;
    if (h == cudaStreamPerThread) {
        if (!R->per_thread) R->per_thread = new_stream(false, true);
        return R->per_thread;
    }
    Stream *s = (Stream *)h;
    return R->live.count(s) ? s : nullptr;
}

// ----------------------------------------------------------------------------
// workers

// (virtual clock) the start of the operation this stream worker runs: max(its stream's time,
// the host's when it issued it); a collective replaces it with the start all ranks agree on
thread_local double t_op_start;

void delay(Stream *s) {
    unsigned long long r = splitmix(s->rng++);
    unsigned pick = (unsigned)(r % 100);
    if (pick < 50 || R->max_delay_us == 0) return;
    if (pick < 80) { sched_yield(); return; }
    long us = (long)((r >> 8) % R->max_delay_us);
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, nullptr);
}

void *stream_main(void *arg) {
    Stream *s = (Stream *)arg;
    pthread_mutex_lock(&R->mu);
    for (;;) {
        while (s->q.empty() && !s->destroyed) pthread_cond_wait(&s->work_cv, &R->mu);
        if (s->q.empty()) break;     // destroyed and drained
        Item it = std::move(s->q.front());
        s->q.pop_front();
        if (it.kind == IT_WAIT) {
            while (it.wait_on->done < it.wait_seq) pthread_cond_wait(&R->done_cv, &R->mu);
            if (vc_on()) s->vt = std::max(s->vt, it.wait_on->vt_at[it.wait_seq]);
        } else {
            t_op_start = std::max(s->vt, it.vt_host);   // (read only with the clock on)
            pthread_mutex_unlock(&R->mu);
            delay(s);
            it.fn();
            pthread_mutex_lock(&R->mu);
            if (vc_on()) s->vt = t_op_start + it.cost;
        }
        if (vc_on()) s->vt_at.push_back(s->vt);   // (position it.seq: items finish in order)
        s->done = it.seq;
        pthread_cond_broadcast(&R->done_cv);
    }
    s->has_thread = false;
    pthread_mutex_unlock(&R->mu);
    return nullptr;
}

void push(Stream *s, Item it) {
    s->q.push_back(std::move(it));
    if (!s->has_thread) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &attr, stream_main, s) != 0) {
            fprintf(stderr, "cuda_emu: cannot start a stream worker\n");
            abort();
        }
        pthread_attr_destroy(&attr);
        s->has_thread = true;
    }
    pthread_cond_signal(&s->work_cv);
}

// s's next operation waits until t has finished position tseq
void push_wait(Stream *s, Stream *t, uint64_t tseq, const Clock &tclock) {
    Clock c = tclock;
    s->clock.join(c);
    uint64_t seq = ++s->enq;
    s->clock.set(s->id, seq);
    push(s, Item{seq, IT_WAIT, t, tseq, nullptr});
}

// the legacy default stream and the blocking streams wait for each other's earlier work
void order_legacy(Stream *s) {
    if (s->legacy) {
        for (Stream *b : R->streams)
            if (b != s && b->blocking && b->enq > s->clock.get(b->id)) push_wait(s, b, b->enq, b->clock);
    } else if (s->blocking) {
        Stream *L = R->legacy;
        if (L->enq > s->clock.get(L->id)) push_wait(s, L, L->enq, L->clock);
    }
}

// issue an operation on s (lock held); returns its position
// (cost: its virtual seconds; < 0: a kernel's, priced from the bytes its accesses span)
uint64_t issue(Stream *s, std::string name, const std::vector<Access> &acc, std::function<void()> fn,
               double cost = 0) {
    announce();
    order_legacy(s);
    s->clock.join(R->host);   // what the host knew finished comes before it
    uint64_t seq = ++s->enq;
    s->clock.set(s->id, seq);
    OpRef op = std::make_shared<OpInfo>(OpInfo{s->id, seq, std::move(name)});
    shadow_poll_watches();
    shadow_access(op, s->clock, acc);
    Item it{seq, IT_WORK, nullptr, 0, std::move(fn)};
    if (vc_on()) {
        if (cost < 0) {
            double bytes = 0;
            for (const Access &x : acc) bytes += (double)(x.whole_block ? shadow_extent(x.p) : x.n);
            cost = vclock_price_kernel(bytes);
        }
        R->host_vt += vclock_issue_s();
        it.vt_host = R->host_vt;
        it.cost = cost;
        stats_price(op->name, cost);
    }
    push(s, std::move(it));
    return seq;
}

// the host waits until s has finished position seq and then knows what s knew there
void host_wait(Stream *s, uint64_t seq, const Clock &c) {
    while (s->done < seq) pthread_cond_wait(&R->done_cv, &R->mu);
    if (vc_on()) R->host_vt = std::max(R->host_vt, s->vt_at[seq]);
    R->host.join(c);
    shadow_host_retire(R->host);
    shadow_poll_watches();
}

void sync_all() {
    for (Stream *s : R->streams) {
        Clock c = s->clock;
        host_wait(s, s->enq, c);
    }
}

// A host wait that ended (a synchronize, or a poll that found the work done): FT_EMU_STATS
// counts it as "host wait: stream" / "host wait: event" (tests/test_host_waits.sh).
void stats_count_wait(const char *name);

// the host waits for everything issued on h so far, or (poll) finds it finished: the sticky
// error or cudaSuccess; cudaErrorNotReady when polling unfinished work
cudaError_t stream_finish(cudaStream_t h, bool poll) {
    runtime();
    Lock l;
    Stream *s = resolve(h);
    if (!s) return cudaErrorInvalidResourceHandle;
    if (!R->async) return cudaSuccess;
    if (!poll) order_legacy(s);   // the legacy stream also waits for the blocking streams
    if (poll && s->done < s->enq) return cudaErrorNotReady;
    stats_count_wait("host wait: stream");
    Clock c = s->clock;
    host_wait(s, s->enq, c);
    return R->sticky;
}

// the same for an event's latest record (never recorded: complete)
cudaError_t event_finish(cudaEvent_t e, bool poll) {
    runtime();
    Lock l;
    Event *ev = (Event *)e;
    if (!R->events.count(ev)) return cudaErrorInvalidResourceHandle;
    if (!R->async || !ev->recorded) return cudaSuccess;
    if (poll && ev->s->done < ev->seq) return cudaErrorNotReady;
    stats_count_wait("host wait: event");
    host_wait(ev->s, ev->seq, ev->clock);
    return R->sticky;
}

const char *direction(const void *dst, const void *src) {
    bool d = shadow_is_device(dst), s = shadow_is_device(src);
    return s ? (d ? "device-to-device" : "device-to-host") : (d ? "host-to-device" : "host-to-host");
}

} // namespace

// ----------------------------------------------------------------------------
// the internal interface (cuda_emu_async.h)

bool async_on() { return runtime()->async; }

void set_async_default(int on) { g_default = on; }

// FT_EMU_STATS=1: count the device operations issued, by name (up to its " (": "kernel
// rmsnorm_fwd", "cublasLtMatmul", "cudnn attention forward", "ncclAllGather",
// "cudaMemsetAsync" ...), and print one line per name to stderr at exit ("cuda_emu: issued
// <name> <count>"). tests/test_plan.sh compares the operations per optimizer step with
// --dry_run's count (src/plan_time.c).
// With the virtual clock (FT_EMU_VCLOCK) also the virtual seconds priced per name, summed over
// the run: "cuda_emu: priced <name> <seconds>" (busy time, not the schedule's overlap).
static pthread_mutex_t g_stats_mu = PTHREAD_MUTEX_INITIALIZER;
static std::map<std::string, unsigned long long> *g_stats;
static std::map<std::string, double> g_priced;

static void stats_print() {
    EmuInside in;
    pthread_mutex_lock(&g_stats_mu);
    fflush(nullptr);
    for (const auto &kv : *g_stats) fprintf(stderr, "cuda_emu: issued %s %llu\n", kv.first.c_str(), kv.second);
    for (const auto &kv : g_priced) fprintf(stderr, "cuda_emu: priced %s %.9f\n", kv.first.c_str(), kv.second);
    pthread_mutex_unlock(&g_stats_mu);
}

static pthread_once_t g_stats_once = PTHREAD_ONCE_INIT;
static void stats_init() {
    const char *e = getenv("FT_EMU_STATS");
    if (!e || !*e || strcmp(e, "0") == 0) return;
    g_stats = new std::map<std::string, unsigned long long>();
    atexit(stats_print);
}

static void stats_count(const std::string &name) {
    EmuInside in;
    pthread_once(&g_stats_once, stats_init);
    if (!g_stats) return;
    pthread_mutex_lock(&g_stats_mu);
    (*g_stats)[name.substr(0, name.find(" ("))]++;
    pthread_mutex_unlock(&g_stats_mu);
}

void stats_price(const std::string &name, double cost) {
    EmuInside in;
    pthread_once(&g_stats_once, stats_init);
    if (!g_stats) return;
    pthread_mutex_lock(&g_stats_mu);
    g_priced[name.substr(0, name.find(" ("))] += cost;
    pthread_mutex_unlock(&g_stats_mu);
}

namespace {
void stats_count_wait(const char *name) { stats_count(name); }
} // namespace

cudaError_t enqueue(cudaStream_t stream, std::string name, const std::vector<Access> &acc,
                    std::function<void()> fn, double cost) {
    EmuInside in;
    runtime();
    stats_count(name);
    if (!R->async) {
        fn();
        return cudaSuccess;
    }
    Lock l;
    Stream *s = resolve(stream);
    if (!s) return cudaErrorInvalidResourceHandle;
    // FT_EMU_MAX_QUEUE=N (tests): a stream holds at most N unfinished operations, and issuing
    // one more blocks the host, with no deadline, until one finishes: a real device's launch
    // queue (about a thousand) does that. Host-issued work only (a worker never issues).
    static const long max_queue = getenv("FT_EMU_MAX_QUEUE") ? atol(getenv("FT_EMU_MAX_QUEUE")) : 0;
    while (max_queue > 0 && s->enq - s->done >= (uint64_t)max_queue) pthread_cond_wait(&R->done_cv, &R->mu);
    issue(s, std::move(name), acc, std::move(fn), cost);
    return cudaSuccess;
}

// cuemu_launch_extent's hints: pointer -> bytes, for this thread's launches
static thread_local std::vector<std::pair<const void *, size_t>> g_extents;

cudaError_t enqueue_kernel(const LaunchSpec &spec, cudaStream_t stream, const KernelPtr *ptrs,
                           int nptrs, std::function<void()> body) {
    EmuInside in;
    std::vector<Access> acc;
    for (int i = 0; i < nptrs; i++) {
        if (!ptrs[i].p) continue;
        const AccessKind kind = ptrs[i].is_const ? ACC_READ : ACC_RW;
        bool exact = false;
        for (const auto &e : g_extents)
            if (e.first == ptrs[i].p) {
                acc.push_back({ptrs[i].p, e.second, kind, false, true});
                exact = true;
                break;
            }
        if (!exact) acc.push_back({ptrs[i].p, 0, kind, true, true});
    }
    char name[512];
    snprintf(name, sizeof name, "kernel %s (%s:%d)", spec.name, spec.file, spec.line);
    const bool ill = fault_hit("illegal_address"), ecc = !ill && fault_hit("ecc");
    if (ill || ecc) {   // (FT_EMU_FAULT) the kernel faults when it runs: a sticky error
        std::string what = name;
        return enqueue(stream, name, acc, [ill, what]() {
            char msg[640];
            snprintf(msg, sizeof msg, "cuda_emu: injected fault (FT_EMU_FAULT) in %s: %s", what.c_str(),
                     ill ? "illegal address" : "uncorrectable ECC error");
            async_fail(ill ? cudaErrorIllegalAddress : cudaErrorECCUncorrectable, msg);
        });
    }
    LaunchSpec sp = spec;
    return enqueue(stream, name, acc, [sp, body]() {
        char msg[2048];
        if (launch_run(sp, body, msg, sizeof msg) != cudaSuccess) async_fail(cudaErrorLaunchFailure, msg);
    });
}

bool fault_hit(const char *kind) {
    static std::atomic<long> counts[2];   // kernel launches, collectives
    const char *f = getenv("FT_EMU_FAULT");
    const size_t k = strlen(kind);
    if (!f || strncmp(f, kind, k) != 0 || f[k] != '@') return false;
    int rank = 0;
    long n = 0;
    if (sscanf(f + k + 1, "%d:%ld", &rank, &n) != 2) return false;
    const char *pmi = getenv("PMI_RANK");
    if ((pmi ? atoi(pmi) : 0) != rank) return false;
    return ++counts[strcmp(kind, "nccl_async") == 0] == n;
}

void async_fail(cudaError_t e, const char *msg) {
    Lock l;
    if (R->sticky != cudaSuccess) return;
    R->sticky = e;
    snprintf(R->sticky_msg, sizeof R->sticky_msg, "%s", msg);
    if (!quiet()) fprintf(stderr, "%s\n", msg);
}
void async_clear_error() {
    runtime();
    Lock l;
    R->sticky = cudaSuccess;
    R->sticky_msg[0] = 0;
}
cudaError_t async_error() {
    runtime();
    Lock l;
    return R->sticky;
}
const char *async_error_message() { return runtime()->sticky_msg; }

bool vclock_on() { return runtime()->vclock && R->async; }
double vclock_op_start() { return t_op_start; }
void vclock_set_op_start(double t) { t_op_start = t; }

int stream_id(cudaStream_t stream) {
    runtime();
    Lock l;
    Stream *s = resolve(stream);
    return s ? s->id : -1;
}

} // namespace cuemu

// ----------------------------------------------------------------------------
// control and the arena hooks (cuda_emu.h)

using namespace cuemu;

extern "C" int cuemu_set_async(int on) {
    g_explicit = on ? 1 : 0;
    runtime();
    if (R->async && !on) {
        Lock l;
        sync_all();
    }
    R->async = on != 0;
    return R->async;
}
extern "C" int cuemu_async(void) { return async_on(); }

// The host thread's virtual time in seconds with the clock on (FT_EMU_VCLOCK), else -1: the
// trainer's step timer reads it (src/train.c, a weak reference as backend_cuda.c's hooks).
extern "C" double cuemu_vclock_now(void) {
    runtime();
    Lock l;
    return vc_on() ? R->host_vt : -1;
}

// The host's own work over `bytes` of host memory (the offloaded optimizer's AdamW,
// src/fsdp.c): the host's virtual time moves on by its price, plan_price_host_memory (clock
// on only; the real time it took is not counted).
extern "C" void cuemu_vclock_host_bytes(double bytes) {
    runtime();
    Lock l;
    if (vc_on() && bytes > 0) R->host_vt += plan_price_host_memory(bytes);
}

extern "C" void cuemu_block_alloc(void *p, size_t nbytes) {
    runtime();
    Lock l;
    shadow_block_alloc(p, nbytes);
}

extern "C" void cuemu_launch_extent(const void *p, size_t nbytes) {
    if (!p) g_extents.clear();
    else g_extents.push_back({p, nbytes});
}

extern "C" void cuemu_block_free(void *p, void *stream) {
    runtime();
    Lock l;
    Stream *s = resolve((cudaStream_t)stream);
    if (!s) s = R->legacy;
    Clock c = s->clock;
    c.join(R->host);
    OpInfo where{s->id, s->enq, "arena free"};
    shadow_block_free(p, where, c);
}

// ----------------------------------------------------------------------------
// the runtime API: streams and events

extern "C" {

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
    runtime();
    Lock l;
    *s = (cudaStream_t)new_stream(false, !(flags & cudaStreamNonBlocking));
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
// Priorities order the scheduling of thread blocks on a real device; one worker per stream
// here runs everything in order anyway, so the priority is checked against the range and dropped.
cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
    if (least) *least = 0;
    if (greatest) *greatest = -5;   // (an H100's range)
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned int flags, int priority) {
    if (priority > 0 || priority < -5)
        return cudaErrorInvalidValue;   // (a real device clamps; our callers ask the range)
    return cudaStreamCreateWithFlags(s, flags);
}

// returns at once; the worker finishes the queued work, then ends
cudaError_t cudaStreamDestroy(cudaStream_t h) {
    runtime();
    Lock l;
    Stream *s = resolve(h);
    if (!s || s->legacy || s == R->per_thread) return cudaErrorInvalidResourceHandle;
    R->live.erase(s);
    s->destroyed = true;
    pthread_cond_signal(&s->work_cv);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t h) { return stream_finish(h, false); }
cudaError_t cudaStreamQuery(cudaStream_t h) { return stream_finish(h, true); }

cudaError_t cudaDeviceSynchronize(void) {
    runtime();
    Lock l;
    if (R->async) sync_all();
    return R->sticky;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int) {
    runtime();
    Lock l;
    Event *ev = new Event();
    R->events.insert(ev);
    *e = (cudaEvent_t)ev;
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

// legal while a wait for it is queued: the wait holds the position, not the event
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    runtime();
    Lock l;
    Event *ev = (Event *)e;
    if (!R->events.erase(ev)) return cudaErrorInvalidResourceHandle;
    delete ev;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t h) {
    runtime();
    Lock l;
    Event *ev = (Event *)e;
    Stream *s = resolve(h);
    if (!R->events.count(ev) || !s) return cudaErrorInvalidResourceHandle;
    if (R->async) {
        announce();
        order_legacy(s);
        s->clock.join(R->host);
    }
    ev->s = s;
    ev->seq = s->enq;
    ev->clock = s->clock;
    ev->recorded = true;
    ev->vt_host = R->host_vt;
    return cudaSuccess;
}

// s waits for the event's latest record (none yet: no wait), as CUDA defines it
cudaError_t cudaStreamWaitEvent(cudaStream_t h, cudaEvent_t e, unsigned int) {
    runtime();
    Lock l;
    Event *ev = (Event *)e;
    Stream *s = resolve(h);
    if (!R->events.count(ev) || !s) return cudaErrorInvalidResourceHandle;
    if (!R->async || !ev->recorded || ev->s == s) return cudaSuccess;
    if (s->clock.get(ev->s->id) >= ev->seq) return cudaSuccess;   // already ordered
    push_wait(s, ev->s, ev->seq, ev->clock);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) { return event_finish(e, true); }

// Virtual milliseconds from a's record to b's with the clock on (FT_EMU_VCLOCK): an event's
// time is the later of its stream's time at that point and the host's when it was recorded.
// Without the clock the emulator has no device time: cudaErrorNotSupported.
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    runtime();
    Lock l;
    Event *ea = (Event *)a, *eb = (Event *)b;
    if (!R->events.count(ea) || !R->events.count(eb)) return cudaErrorInvalidResourceHandle;
    if (!vc_on()) return cudaErrorNotSupported;
    if (!ea->recorded || !eb->recorded) return cudaErrorInvalidResourceHandle;
    if (ea->s->done < ea->seq || eb->s->done < eb->seq) return cudaErrorNotReady;
    const double ta = std::max(ea->s->vt_at[ea->seq], ea->vt_host), tb = std::max(eb->s->vt_at[eb->seq], eb->vt_host);
    *ms = (float)(1e3 * (tb - ta));
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return event_finish(e, false); }

cudaError_t cudaLaunchHostFunc(cudaStream_t h, cudaHostFn_t fn, void *data) {
    return enqueue(h, "host function (cudaLaunchHostFunc)", {}, [fn, data]() { fn(data); }, 0);
}

// ----------------------------------------------------------------------------
// the runtime API: memory

cudaError_t cudaMalloc(void **p, size_t n) {
    // exact size (ASan sees overruns), 256-byte aligned like cudaMalloc
    if (posix_memalign(p, 256, n ? n : 1) != 0) { *p = nullptr; return cudaErrorMemoryAllocation; }
    runtime();
    Lock l;
    shadow_alloc(*p, n ? n : 1);
    return cudaSuccess;
}

// cudaFree and cudaFreeHost synchronise the device first, as the real ones do
static cudaError_t free_after_sync(void *p, bool shadowed) {
    if (!p) return cudaSuccess;
    runtime();
    {
        Lock l;
        if (R->async) sync_all();
        if (shadowed) shadow_release(p);
    }
    free(p);
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) { return free_after_sync(p, true); }

// Pinned host memory: plain host memory with no shadow state (it is not device memory; the
// async copies already treat all host memory as pinned). The reports once seen at a block's
// first bytes were glibc's vectorised memchr in the emulator's own stats code reading past a
// string into the next block; hits inside the emulator are ignored now (t_emu_inside,
// cuda_emu_shadow.cpp). The program's own string functions over-read the same way (a 32-byte
// vector load that holds a string's last byte reaches at most 31 bytes past it): PIN_GAP free
// bytes before each block keep such a load out of it, so only the program's real touches
// of a block are reported.
#define PIN_GAP 256   // (a multiple of 256: blocks stay 256-byte aligned)
cudaError_t cudaMallocHost(void **p, size_t n) {
    void *base = nullptr;
    if (posix_memalign(&base, 256, PIN_GAP + (n ? n : 1)) != 0) { *p = nullptr; return cudaErrorMemoryAllocation; }
    *p = (char *)base + PIN_GAP;
    runtime();
    Lock l;
    shadow_pinned(*p, n ? n : 1, true);   // kernels may reach it (unified addressing)
    return cudaSuccess;
}

// (the flags change nothing here: all host memory is reachable, and a device pointer is the
// host pointer, as under unified addressing)
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int) { return cudaMallocHost(p, n); }

cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned int flags) {
    runtime();
    Lock l;
    if (flags != 0 || !shadow_is_pinned(host)) return cudaErrorInvalidValue;
    *dev = host;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p) {
    if (p) {
        runtime();
        Lock l;
        shadow_pinned(p, 0, false);
    }
    return free_after_sync(p ? (char *)p - PIN_GAP : p, false);   // (the block began PIN_GAP before)
}

cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t h) {
    runtime();
    {
        Lock l;
        if (!resolve(h)) return cudaErrorInvalidResourceHandle;
    }
    return cudaMalloc(p, n);
}

// stream-ordered: users not ordered before this point on the stream are reported
cudaError_t cudaFreeAsync(void *p, cudaStream_t h) {
    if (!p) return cudaSuccess;
    runtime();
    if (!R->async) {
        Lock l;
        shadow_release(p);
        free(p);
        return cudaSuccess;
    }
    cuemu_block_free(p, h);
    Lock l;
    Stream *s = resolve(h);
    if (!s) return cudaErrorInvalidResourceHandle;
    shadow_release(p);
    issue(s, "cudaFreeAsync", {}, [p]() { free(p); });
    return cudaSuccess;
}

// A copy's explicit kind must match where its pointers are (CUDA: "dst and src pointers that
// do not match the direction of the copy results in an undefined behavior"; a real GPU
// rejects or faults on it). Pinned host memory is host memory. cudaMemcpyDefault: any.
static cudaError_t copy_kind_check(const void *dst, const void *src, enum cudaMemcpyKind kind, const char *call) {
    if (kind == cudaMemcpyDefault) return cudaSuccess;
    bool d, s;
    {
        Lock l;
        d = shadow_is_device(dst);
        s = shadow_is_device(src);
    }
    const bool want_s = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    const bool want_d = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    if (kind > cudaMemcpyDeviceToDevice || (s == want_s && d == want_d)) return cudaSuccess;
    static const char *const names[] = {"cudaMemcpyHostToHost", "cudaMemcpyHostToDevice", "cudaMemcpyDeviceToHost",
                                        "cudaMemcpyDeviceToDevice"};
    if (!quiet())
        fprintf(stderr, "cuda_emu: %s with kind %s, but the source is %s memory and the destination %s memory\n", call,
                names[kind], s ? "device" : "host", d ? "device" : "host");
    return cudaErrorInvalidMemcpyDirection;
}

// (virtual clock) a copy: over PCIe when one side is host memory, else through HBM
static double copy_cost(const void *dst, const void *src, size_t n) {
    if (!vclock_device()) return 0;
    bool d, s;
    {
        Lock l;
        d = shadow_is_device(dst);
        s = shadow_is_device(src);
    }
    return d && s ? vclock_price_copy(n, false) : vclock_price_copy(n, true);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t h) {
    if (n == 0) return cudaSuccess;
    runtime();
    if (R->async) {
        const cudaError_t e = copy_kind_check(dst, src, kind, "cudaMemcpyAsync");
        if (e != cudaSuccess) return e;
    }
    char name[96];
    snprintf(name, sizeof name, "cudaMemcpyAsync %s (%zu bytes)", direction(dst, src), n);
    return enqueue(h, name, {{src, n, ACC_READ, false}, {dst, n, ACC_WRITE, false}},
                   [dst, src, n]() { memmove(dst, src, n); }, copy_cost(dst, src, n));
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t h) {
    if (n == 0) return cudaSuccess;
    char name[96];
    snprintf(name, sizeof name, "cudaMemsetAsync (%zu bytes)", n);
    return enqueue(h, name, {{p, n, ACC_WRITE, false, true}}, [p, v, n]() { memset(p, v, n); });
}

cudaError_t cudaMemset(void *p, int v, size_t n) { return cudaMemsetAsync(p, v, n, nullptr); }

// On the legacy stream, with CUDA's documented host synchronisation per direction: a copy
// from the host returns once the source is staged (copied here) and does not wait for the
// device; a copy to the host returns when it is done; device to device does not wait.
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
    runtime();
    bool dev_src, dev_dst;
    {
        Lock l;
        dev_src = shadow_is_device(src);
        dev_dst = shadow_is_device(dst);
    }
    if (R->async && n) {
        const cudaError_t e = copy_kind_check(dst, src, kind, "cudaMemcpy");
        if (e != cudaSuccess) return e;
    }
    if (n == 0 || !R->async || (!dev_src && !dev_dst)) {
        if (n) memmove(dst, src, n);
        return async_error();
    }
    if (!dev_src) {
        auto staged = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + n);
        char name[96];
        snprintf(name, sizeof name, "cudaMemcpy host-to-device (%zu bytes)", n);
        return enqueue(nullptr, name, {{dst, n, ACC_WRITE, false}},
                       [dst, staged, n]() { memcpy(dst, staged->data(), n); }, vclock_price_copy(n, true));
    }
    cudaError_t e = cudaMemcpyAsync(dst, src, n, kind, nullptr);
    if (e != cudaSuccess || dev_dst) return e;
    Lock l;
    Clock c = R->legacy->clock;
    host_wait(R->legacy, R->legacy->enq, c);
    return R->sticky;
}

// ----------------------------------------------------------------------------
// the driver's stream memory wait (tests/nccl_standin: a stream waits for its helper thread)

// cuStreamWaitValue32 (v2, the one cuda.h names): the stream's next operations wait until
// the 32-bit word at addr (pinned host or device memory) meets the condition; GEQ is cyclic,
// (int32_t)(*addr - value) >= 0. NOR is not emulated (CUDA_ERROR_NOT_SUPPORTED).
static bool wait_value_met(uint32_t v, uint32_t want, unsigned flags) {
    switch (flags & 0x3u) {
    case CU_STREAM_WAIT_VALUE_GEQ: return (int32_t)(v - want) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ: return v == want;
    default: return (v & want) != 0;   // CU_STREAM_WAIT_VALUE_AND
    }
}

extern "C" CUresult cuStreamWaitValue32_v2(CUstream h, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
    if ((flags & 0x3u) == CU_STREAM_WAIT_VALUE_NOR || (flags & ~0x3u & ~(unsigned)CU_STREAM_WAIT_VALUE_FLUSH))
        return CUDA_ERROR_NOT_SUPPORTED;
    runtime();
    const uint32_t *p = (const uint32_t *)(uintptr_t)addr;
    {
        Lock l;
        if (!shadow_is_pinned(p) && !shadow_is_device(p)) return CUDA_ERROR_INVALID_VALUE;   // a GPU faults
    }
    auto wait = [p, value, flags]() {
        long ns = 1000;
        while (!wait_value_met(__atomic_load_n(p, __ATOMIC_ACQUIRE), value, flags)) {
            struct timespec ts = {0, ns};
            nanosleep(&ts, nullptr);
            if (ns < 200000) ns *= 2;
        }
    };
    char name[96];
    snprintf(name, sizeof name, "cuStreamWaitValue32 (%p >= %u)", (const void *)p, (unsigned)value);
    stats_count(name);
    if (!R->async) {
        wait();
        return CUDA_SUCCESS;
    }
    Lock l;
    Stream *s = resolve((cudaStream_t)h);
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    const uint64_t seq = issue(s, name, {}, wait);
    shadow_gate(s->id, seq);
    return CUDA_SUCCESS;
}

// the driver entry points the emulator has: cuStreamWaitValue32 (as of CUDA 12: its v2)
cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                             unsigned long long, enum cudaDriverEntryPointQueryResult *status) {
    *fn = nullptr;
    if (symbol && !strcmp(symbol, "cuStreamWaitValue32") && version >= 11070) *fn = (void *)&cuStreamWaitValue32_v2;
    if (status) *status = *fn ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
}

}   // extern "C"
