// comm_nccl.c: the NCCL transport for GPU ranks (built when the CUDA toolkit is found; see
// comm.h).
//
// Streams: collectives run on the transport's own comm stream; the CUDA backend computes on
// its compute stream (backend_cuda_stream()). Ordering without host synchronisation:
//   - before a collective, the comm stream waits for an event recorded on the compute
//     stream (the data it sends has been produced, the buffer it overwrites is no longer read)
//   - after a blocking collective, the compute stream waits for an event recorded on the
//     comm stream (later kernels see the result); the host does not wait
//   - a non-blocking all-gather returns its event as the request; comm_wait makes the
//     compute stream wait for it, so the next unit's gather overlaps the current compute
// Only all_reduce_f64 (host doubles: losses, norms) synchronises the host. broadcast needs
// device memory.
//
// Lanes: a group given a reduce-scatter lane (comm_nccl_add_reduce_scatter_lane; the FSDP
// shard group) runs its reduce-scatters on a second NCCL communicator over the same ranks,
// with its own comm stream and events, and everything else on the first. So a layer's
// gradient reduce-scatter and the next layer's parameter all-gather (both non-blocking in
// the backward) overlap each other and the compute instead of queuing on one stream. Each
// lane is ordered against the compute stream only, by the events above; the two lanes never
// touch the same buffers (fsdp.c: gathered units vs gradients and reduce-scatter outputs).
// The replica group (HSDP, DDP) is a third lane: fsdp.c starts each unit's all-reduce of its
// fp32 gradient slice there (iall_reduce) once the slice is final, while the backward goes
// on with other units' slices, and the compute stream waits for them all before the norm.
// Lanes need NCCL 2.26+ (comm_nccl_choose_lanes): with NCCL 2.18-2.25 (or the user's
// NCCL_LAUNCH_ORDER_IMPLICIT=0) every communicator enqueues on ONE shared comm stream and the
// shard group gets no reduce-scatter lane, so the GPU runs collectives of all communicators
// one at a time, in the host's issue order, which is the same on every rank (NCCL's guide:
// concurrent communicators are safe only when their operations cannot interleave
// differently on different ranks). Every wait is still for an event recorded earlier in that
// order, so no cycle can form. Cost: a layer's reduce-scatter and the next layer's gather no
// longer run beside each other (both still overlap the compute), and the host's all-reduces
// of losses and norms queue behind prefetched gathers.
//
// Hangs (src/watchdog.h): the host never blocks in an NCCL call after setup; it waits only in
// stream synchronisations, which poll under the watchdog's deadline. Each communicator
// registers with the watchdog: its asynchronous errors (ncclCommGetAsyncError) end a wait
// at once, the oldest of its collectives not yet complete (an event recorded after each)
// is named in the timeout message. On a timeout the job ends through main's end callback
// (the process's exit ends the NCCL kernels); the abort hook (ncclCommAbort) runs only where
// there is none (library tests): it could hang on a stream waiting on another communicator.
//
// SMs: every communicator (init, splits, the lane) is created with an ncclConfig_t whose
// maxCTAs bounds the thread blocks one of its collectives takes beside the compute
// (comm_nccl_set_max_ctas, --nccl_max_ctas; src/comm.h says why 16).
//
// NCCL is loaded at run time (nccl_load), not linked: it is not part of the CUDA toolkit and
// only GPU jobs of more than one rank need it, so a machine without it still runs CPU and
// single-GPU jobs, and a multi-GPU job says in one line what is missing.
#define _GNU_SOURCE   // dladdr
#include <dlfcn.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cuda.h"
#include "comm.h"
#include "cuda_check.h"
#include "cuda_wait.h"
#include "watchdog.h"
#include "wheel_lib.h"

// ----------------------------------------------------------------------------
// NCCL, loaded at run time: the functions linked into the executable when there are any (the
// emulated build links its own, tests/cuda_emu; the references are weak, so they are NULL in a
// real build), else libnccl.so.2 from the library path (or the file FT_NCCL_LIBRARY names),
// else the one the nvidia-nccl wheel put beside the Python on PATH (src/wheel_lib.h).
// ncclCommSplit needs NCCL 2.18.

#define NCCL_FUNCTIONS(X) X(ncclGetUniqueId) X(ncclCommInitRank) X(ncclCommInitRankConfig) X(ncclCommSplit) \
    X(ncclCommUserRank) \
    X(ncclCommCount) X(ncclCommDestroy) X(ncclCommAbort) X(ncclCommGetAsyncError) X(ncclGetErrorString) \
    X(ncclAllGather) X(ncclReduceScatter) X(ncclAllReduce) X(ncclBroadcast) X(ncclGetVersion) X(ncclGetLastError)

typedef struct {
#define NCCL_POINTER(f) __typeof__(f) *f;
    NCCL_FUNCTIONS(NCCL_POINTER)
#undef NCCL_POINTER
} nccl_functions;

static nccl_functions N;   // all NULL until comm_nccl_load succeeds
static int nccl_version;   // NCCL_VERSION_CODE of the loaded library (2.26.0 = 22600)
static const char *nccl_file = "the linked NCCL";
static char nccl_python[FT_PATH_MAX];   // the Python whose wheel nccl_file is ("": not a wheel's)
static int one_lane;       // comm_nccl_choose_lanes: every communicator on shared_stream
static cudaStream_t shared_stream;   // (one lane) created by the first communicator
static int shared_users;             // communicators using it (destroyed with the last)
static int max_ctas;                 // comm_nccl_set_max_ctas (0: no config, NCCL's defaults)

#define NCCL_PRAGMA(text) _Pragma(#text)
#define NCCL_WEAK(f) NCCL_PRAGMA(weak f)
NCCL_FUNCTIONS(NCCL_WEAK)
#undef NCCL_WEAK

// NCCL's own words on its last error ("" when it has none): the reason behind a status as
// general as "unhandled system error" (which interface, which peer, which call)
static const char *nccl_last_error(void) {
    const char *s = N.ncclGetLastError ? N.ncclGetLastError(NULL) : NULL;
    return s ? s : "";
}

#define CHECK_NCCL(call) CHECK_NCCL_AS(#call, call)
#define CHECK_NCCL_AS(text, call) do { ncclResult_t nccl_rc_ = (call); if (nccl_rc_ != ncclSuccess) { \
    const char *nccl_last_ = nccl_last_error(); \
    return ft_error("%s failed at %s:%d: %s%s%s%s", text, FT_WHERE, N.ncclGetErrorString(nccl_rc_), \
                    nccl_last_[0] ? " (" : "", nccl_last_, nccl_last_[0] ? ")" : ""); } } while (0)
// NCCL's init and split wait, without a deadline of their own, for every rank of the group
// (bootstrap connections): they run under the watchdog's guard (src/watchdog.h), `op` and
// `group` naming them in its line
#define CHECK_NCCL_GUARDED(op, group, call) do { TRY(watchdog_guard_begin(op, group)); \
    ncclResult_t guarded_rc_ = (call); \
    TRY(watchdog_guard_end()); \
    CHECK_NCCL_AS(#call, guarded_rc_); } while (0)

// The resolved functions become N once the library says its version (until then N stays
// empty: a later comm_nccl_load tries again rather than running on a half-known library).
static int nccl_take(const nccl_functions *f) {
    int v = 0;
    const ncclResult_t r = f->ncclGetVersion(&v);
    if (r != ncclSuccess) return ft_error("nccl: ncclGetVersion of %s failed: %s", nccl_file, f->ncclGetErrorString(r));
    if (v < 21800)   // (ncclCommSplit)
        return ft_error("GPU ranks need NCCL 2.18 or newer: %s is %d.%d.%d (install a newer libnccl2, or set "
                        "FT_NCCL_LIBRARY to a newer libnccl.so.2)", nccl_file, v / 10000, v / 100 % 100, v % 100);
    N = *f;
    nccl_version = v;
    return 0;
}

int comm_nccl_load(void) {
    if (N.ncclGetUniqueId) return 0;
    // Several communicators per GPU run collectives at once (the reduce-scatter lane, HSDP's
    // groups). NCCL's guide calls concurrent communicators unsafe unless ordered ("might
    // work ... but could break at any time"); NCCL 2.26+ orders their launches by host
    // program order under NCCL_LAUNCH_ORDER_IMPLICIT=1 (still overlapping on CUDA 12.3+).
    // Read at NCCL's first init; a user's own setting wins (0: the one-lane mode, as for an
    // older NCCL, which ignores it: comm_nccl_choose_lanes).
    setenv("NCCL_LAUNCH_ORDER_IMPLICIT", "1", 0);
    // Since 2.22 NCCL connects peers (and allocates their buffers) at a communicator's first
    // collective, i.e. after the arena took what cudaMemGetInfo said was free. Connected at
    // init instead, NCCL's memory is already gone when the arena is sized, as src/launch.c
    // intends (communicators before the arena); a user's own setting wins.
    setenv("NCCL_RUNTIME_CONNECT", "0", 0);
    const char *file = ft_getenv("FT_NCCL_LIBRARY");
    nccl_functions f;
    if (!file && ncclCommInitRank) {   // linked in
#define NCCL_LINKED(name) if (!(f.name = name)) return ft_error("nccl: the linked NCCL has no %s", #name);
        NCCL_FUNCTIONS(NCCL_LINKED)
#undef NCCL_LINKED
        return nccl_take(&f);
    }
    // (TEST-ONLY FT_TEST_NCCL_SONAME, tests/test_lib_compat.sh: another name than libnccl.so.2,
    // a machine whose library path has no NCCL)
    const char *soname_env = ft_getenv("FT_TEST_NCCL_SONAME");
    const char *soname = soname_env ? soname_env : "libnccl.so.2";
    void *lib = dlopen(file ? file : soname, RTLD_NOW | RTLD_LOCAL);
    static char wheel[FT_PATH_MAX];
    if (!lib && !file && wheel_lib_find("nvidia/nccl/lib/libnccl.so.2", getenv("PATH"), getenv("HOME"), wheel,
                                        sizeof wheel, nccl_python, sizeof nccl_python)) {
        // none on the library path: the nvidia-nccl-cu12/cu13 wheel of the Python on PATH
        // (PyTorch's), loaded from its own folder (the bootstrap line names the file)
        if ((lib = dlopen(wheel, RTLD_NOW | RTLD_LOCAL))) file = wheel;
        else return ft_error("GPU ranks need NCCL: no libnccl.so.2 on the library path, and %s (the wheel of %s) "
                             "does not load: %s", wheel, nccl_python, dlerror());
    }
    if (!lib && file) return ft_error("GPU ranks need NCCL 2.18 or newer: %s (FT_NCCL_LIBRARY)", dlerror());
    if (!lib)
        return ft_error("GPU ranks need NCCL 2.18 or newer: %s, and no Python on PATH has the nvidia-nccl-cu12/cu13 "
                        "wheel (install NVIDIA's libnccl2 package or that wheel, or set FT_NCCL_LIBRARY to a "
                        "libnccl.so.2)", dlerror());
#define NCCL_RESOLVE(name) if (!(f.name = (__typeof__(name) *)dlsym(lib, #name))) \
    return ft_error("GPU ranks need NCCL 2.18 or newer: %s has no %s", file ? file : "libnccl.so.2", #name);
    NCCL_FUNCTIONS(NCCL_RESOLVE)
#undef NCCL_RESOLVE
    nccl_file = file ? file : "libnccl.so.2";
    return nccl_take(&f);
}

int comm_nccl_choose_lanes(int *out) {
    TRY(comm_nccl_load());
    const char *order = getenv("NCCL_LAUNCH_ORDER_IMPLICIT");   // comm_nccl_load's default is 1
    one_lane = nccl_version < 22600 || (order && atoi(order) == 0);
    *out = one_lane;
    return 0;
}

void comm_nccl_use_one_lane(void) { one_lane = 1; }

void comm_nccl_set_max_ctas(int n) { max_ctas = n > 0 ? n : 0; }

// The configuration the next communicator is created with: NULL (NCCL's defaults), or *cfg
// with the CTA bounds of comm_nccl_set_max_ctas. The struct is this header's (2.28); an older
// NCCL reads the fields it knows (it copies min(size, its own size), and 2.17+ knows these).
static ncclConfig_t *cta_config(ncclConfig_t *cfg) {
    if (max_ctas <= 0) return NULL;
    const ncclConfig_t init = NCCL_CONFIG_INITIALIZER;
    *cfg = init;
    cfg->minCTAs = 1;
    cfg->maxCTAs = max_ctas;
    return cfg;
}

const char *comm_nccl_describe(void) {
    static char text[FT_PATH_MAX + 64];
    if (!N.ncclGetUniqueId) return "NCCL (not loaded)";
    snprintf(text, sizeof text, "NCCL %d.%d.%d (%s)", nccl_version / 10000, nccl_version / 100 % 100,
             nccl_version % 100, nccl_file);
    return text;
}

const char *comm_nccl_wheel_python(void) { return N.ncclGetUniqueId && nccl_python[0] ? nccl_python : NULL; }

// ----------------------------------------------------------------------------
// the transport

#define F64_SLOTS 4096
#define TRACKED 64          // collectives remembered until seen complete (for the watchdog)
#define EVENT_POOL 256      // spare request events kept per group: fsdp.c has up to 2 gathers and 2
                            // reduce-scatters outstanding on the shard group, and on the replica
                            // group one all-reduce per unit of the model (n_layers + 1: 33 for a
                            // 7B, 81 for a 70B) until the step's gradient is final

// a collective enqueued on the comm stream, for the watchdog's message
typedef struct {
    cudaEvent_t done;       // recorded on the comm stream right after it
    const char *op;
    size_t bytes;
    unsigned long seq;      // watchdog_next_seq() at enqueue: orders them across groups
    char phase[48];         // the watchdog's phase at enqueue ("step 7")
} nccl_op;

typedef struct nccl_impl {
    ncclComm_t comm;        // NULL once aborted
    cudaStream_t stream;    // the comm stream
    cudaEvent_t produced;   // recorded on the compute stream before each collective
    cudaEvent_t finished;   // recorded on the comm stream after each blocking collective
    double *dev_f64;        // (F64_SLOTS) staging for all_reduce_f64, device
    double *host_f64;       // (F64_SLOTS) and its pinned host side (a copy from pageable memory
                            // blocks the host in cudaMemcpyAsync, out of the watchdog's reach)
    struct nccl_impl *rs;   // the reduce-scatter lane, or NULL (reduce-scatters run here)
    cudaEvent_t spare[EVENT_POOL];   // events of completed requests, reused (review L2: no
    int n_spare;                     // create/destroy per non-blocking collective)
    const comm *owner;      // for the group's label and size in messages
    nccl_op ops[TRACKED];   // ring: ops[head % TRACKED] .. ops[tail % TRACKED] not yet seen done
    unsigned head, tail;
    int registered;         // with the watchdog
} nccl_impl;

static nccl_impl *impl(comm *c) { return c->impl; }
static nccl_impl *rs_lane(comm *c) { return impl(c)->rs ? impl(c)->rs : impl(c); }
static cudaStream_t compute_stream(void) { return (cudaStream_t)backend_cuda_stream(); }

static int nccl_dtype(st_dtype dt, ncclDataType_t *out) {
    switch (dt) {
    case ST_F32: *out = ncclFloat32; return 0;
    case ST_BF16: *out = ncclBfloat16; return 0;
    case ST_F16: *out = ncclFloat16; return 0;
    case ST_F64: *out = ncclFloat64; return 0;
    case ST_I32: *out = ncclInt32; return 0;
    default: return ft_error("nccl: dtype %s is not supported", st_dtype_name(dt));
    }
}

// the comm stream waits for everything already queued on the compute stream
static int comm_after_compute(nccl_impl *m) {
    CHECK_CUDA(cudaEventRecord(m->produced, compute_stream()));
    CHECK_CUDA(cudaStreamWaitEvent(m->stream, m->produced, 0));
    return 0;
}

// the compute stream waits for everything already queued on the comm stream
static int compute_after_comm(nccl_impl *m) {
    CHECK_CUDA(cudaEventRecord(m->finished, m->stream));
    CHECK_CUDA(cudaStreamWaitEvent(compute_stream(), m->finished, 0));
    return 0;
}

// ----------------------------------------------------------------------------
// the watchdog's view: unfinished collectives, asynchronous errors, abort

static void group_name(const comm *c, char *buf, size_t n) {
    snprintf(buf, n, "%s of %d ranks", c->label ? c->label : "world", c->size);
}

static void retire_done(nccl_impl *m) {
    while (m->head != m->tail && cudaEventQuery(m->ops[m->head % TRACKED].done) == cudaSuccess) m->head++;
}

// Remember the collective just enqueued on lane `m`'s comm stream; when all TRACKED slots hold
// unfinished ones, the oldest are kept (the first stuck collective is the one to name).
static int track(nccl_impl *m, const char *op, size_t bytes) {
    if (!watchdog_enabled()) return 0;
    retire_done(m);
    if (m->tail - m->head == TRACKED) return 0;
    nccl_op *o = &m->ops[m->tail % TRACKED];
    CHECK_CUDA(cudaEventRecord(o->done, m->stream));
    o->op = op;
    o->bytes = bytes;
    o->seq = watchdog_next_seq();
    snprintf(o->phase, sizeof o->phase, "%s", watchdog_phase());
    m->tail++;
    return 0;
}

static int hook_describe(void *ctx, char *buf, size_t n, unsigned long *seq) {
    nccl_impl *m = ctx;
    retire_done(m);
    if (m->head == m->tail) return 0;
    const nccl_op *o = &m->ops[m->head % TRACKED];
    char group[64], size[32];
    group_name(m->owner, group, sizeof group);
    watchdog_format_bytes(size, sizeof size, o->bytes);
    snprintf(buf, n, "%s on the %s, %s, enqueued in %s", o->op, group, size, o->phase);
    *seq = o->seq;
    return 1;
}

static int hook_check(void *ctx, char *buf, size_t n) {
    nccl_impl *m = ctx;
    ncclResult_t async = ncclSuccess, rc = m->comm ? N.ncclCommGetAsyncError(m->comm, &async) : ncclSuccess;
    if (rc == ncclSuccess && (async == ncclSuccess || async == ncclInProgress)) return 0;
    char group[64];
    group_name(m->owner, group, sizeof group);
    const char *last = nccl_last_error();
    snprintf(buf, n, "nccl: the %s reports an asynchronous error: %s%s%s%s", group,
             N.ncclGetErrorString(rc != ncclSuccess ? rc : async), last[0] ? " (" : "", last, last[0] ? ")" : "");
    return -1;
}

static void hook_abort(void *ctx) {
    nccl_impl *m = ctx;
    if (m->comm) N.ncclCommAbort(m->comm);
    m->comm = NULL;
}

// ----------------------------------------------------------------------------
// collectives

// A non-blocking collective's request: an event recorded on `lane`'s stream right after it,
// from the group's pool of spare events (created when the pool is empty).
static int request_record(comm *c, nccl_impl *lane, void **req) {
    nccl_impl *m = impl(c);
    cudaEvent_t done;
    if (m->n_spare > 0) done = m->spare[--m->n_spare];
    else CHECK_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CHECK_CUDA(cudaEventRecord(done, lane->stream));
    *req = (void *)done;
    return 0;
}

// A collective of 0 elements (LoRA's root unit, which has no adapters) is not handed to NCCL,
// whose pointer checks (NCCL_CHECK_POINTERS=1) refuse its NULL buffers; the event bookkeeping
// around it stays, so the callers' ordering is the same.
static int nccl_all_gather(comm *c, void *recv, const void *send, size_t n, st_dtype dt) {
    ncclDataType_t t = ncclFloat32;
    TRY(nccl_dtype(dt, &t));
    TRY(comm_after_compute(impl(c)));
    if (n > 0) CHECK_NCCL(N.ncclAllGather(send, recv, n, t, impl(c)->comm, impl(c)->stream));
    TRY(track(impl(c), "all_gather", (size_t)c->size * n * st_dtype_size(dt)));
    return compute_after_comm(impl(c));
}

static int nccl_iall_gather(comm *c, void *recv, const void *send, size_t n, st_dtype dt, void **req) {
    ncclDataType_t t = ncclFloat32;
    TRY(nccl_dtype(dt, &t));
    TRY(comm_after_compute(impl(c)));
    if (n > 0) CHECK_NCCL(N.ncclAllGather(send, recv, n, t, impl(c)->comm, impl(c)->stream));
    TRY(track(impl(c), "all_gather", (size_t)c->size * n * st_dtype_size(dt)));
    return request_record(c, impl(c), req);
}

// the compute stream waits for the request's event, which goes back to the pool: a later
// record replaces what it captures, and this wait already took its snapshot (CUDA semantics)
static int nccl_wait(comm *c, void *req) {
    nccl_impl *m = impl(c);
    cudaEvent_t done = (cudaEvent_t)req;
    CHECK_CUDA(cudaStreamWaitEvent(compute_stream(), done, 0));
    if (m->n_spare < EVENT_POOL) m->spare[m->n_spare++] = done;
    else CHECK_CUDA(cudaEventDestroy(done));
    return 0;
}

static int nccl_reduce_scatter(comm *c, void *recv, const void *send, size_t n, st_dtype dt) {
    ncclDataType_t t = ncclFloat32;
    TRY(nccl_dtype(dt, &t));
    nccl_impl *m = rs_lane(c);
    TRY(comm_after_compute(m));
    if (n > 0) CHECK_NCCL(N.ncclReduceScatter(send, recv, n, t, ncclSum, m->comm, m->stream));
    TRY(track(m, "reduce_scatter", (size_t)c->size * n * st_dtype_size(dt)));
    return compute_after_comm(m);
}

// started on the comm stream once the compute stream has produced `send`; comm_wait makes
// the compute stream wait for it, so the reduction overlaps the next unit's backward
static int nccl_ireduce_scatter(comm *c, void *recv, const void *send, size_t n, st_dtype dt, void **req) {
    ncclDataType_t t = ncclFloat32;
    TRY(nccl_dtype(dt, &t));
    nccl_impl *m = rs_lane(c);
#ifndef FT_FAULT_SKIP_RS_WAIT
    // (TEST-ONLY FAULT FT_FAULT_SKIP_RS_WAIT, tests/test_cuda_emu_hazards.sh: the reduce-scatter
    // does not wait for the backward that produces its gradients)
    TRY(comm_after_compute(m));
#endif
    if (n > 0) CHECK_NCCL(N.ncclReduceScatter(send, recv, n, t, ncclSum, m->comm, m->stream));
    TRY(track(m, "reduce_scatter", (size_t)c->size * n * st_dtype_size(dt)));
    return request_record(c, m, req);
}

// an in-place all-reduce of buf on the group's comm stream, after the compute issued so far
static int all_reduce_enqueue(comm *c, void *buf, size_t n, st_dtype dt) {
    ncclDataType_t t = ncclFloat32;
    TRY(nccl_dtype(dt, &t));
    TRY(comm_after_compute(impl(c)));
    if (n > 0) CHECK_NCCL(N.ncclAllReduce(buf, buf, n, t, ncclSum, impl(c)->comm, impl(c)->stream));
    return track(impl(c), "all_reduce", n * st_dtype_size(dt));
}

static int nccl_all_reduce(comm *c, void *buf, size_t n, st_dtype dt) {
    TRY(all_reduce_enqueue(c, buf, n, dt));
    return compute_after_comm(impl(c));
}

// started on the group's comm stream once the compute stream has produced buf (fsdp.c: a
// unit's gradient slice made final); comm_wait makes the compute stream wait for it, so it
// overlaps the compute issued meanwhile, which must not touch buf
static int nccl_iall_reduce(comm *c, void *buf, size_t n, st_dtype dt, void **req) {
    TRY(all_reduce_enqueue(c, buf, n, dt));
    return request_record(c, impl(c), req);
}

// Host doubles through pinned staging: the copies are then truly asynchronous, and the host
// waits only in cuda_wait_stream, which polls under --collective_timeout. (From pageable
// memory, CUDA's D2H cudaMemcpyAsync returns only once the copy is done, i.e. after the
// all-reduce: a dead peer would hang the host there with no message.)
static int nccl_all_reduce_f64(comm *c, double *host, size_t n) {
    nccl_impl *m = impl(c);
    char group[64];
    group_name(c, group, sizeof group);
    for (size_t off = 0; off < n; off += F64_SLOTS) {
        size_t k = n - off < F64_SLOTS ? n - off : F64_SLOTS;
        memcpy(m->host_f64, host + off, k * sizeof(double));   // the last chunk's wait below freed it
        CHECK_CUDA(cudaMemcpyAsync(m->dev_f64, m->host_f64, k * sizeof(double), cudaMemcpyHostToDevice, m->stream));
        CHECK_NCCL(N.ncclAllReduce(m->dev_f64, m->dev_f64, k, ncclFloat64, ncclSum, m->comm, m->stream));
        TRY(track(m, "all_reduce of host doubles", k * sizeof(double)));
        CHECK_CUDA(cudaMemcpyAsync(m->host_f64, m->dev_f64, k * sizeof(double), cudaMemcpyDeviceToHost, m->stream));
        TRY(cuda_wait_stream(m->stream, "all_reduce of host doubles", group, k * sizeof(double)));
        memcpy(host + off, m->host_f64, k * sizeof(double));
    }
    return 0;
}

static int nccl_broadcast(comm *c, void *buf, size_t bytes, int root) {
    TRY(comm_after_compute(impl(c)));
    CHECK_NCCL(N.ncclBroadcast(buf, buf, bytes, ncclUint8, root, impl(c)->comm, impl(c)->stream));
    TRY(track(impl(c), "broadcast", bytes));
    return compute_after_comm(impl(c));
}

static int nccl_barrier(comm *c) {
    double one = 1.0;
    return nccl_all_reduce_f64(c, &one, 1);
}

// A collective's stream: non-blocking, at the device's highest priority, as FSDP2 gives its
// all-gather and reduce-scatter streams, so that a collective's blocks are scheduled ahead of
// the compute kernels queued when it became ready (its peers wait on it; the compute does not
// wait on it until the next layer). Effect on GPU time unmeasured.
static int nccl_stream_create(cudaStream_t *s) {
    if (one_lane && shared_stream) {
        *s = shared_stream;
        shared_users++;
        return 0;
    }
    int least = 0, greatest = 0;
    CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CHECK_CUDA(cudaStreamCreateWithPriority(s, cudaStreamNonBlocking, greatest));
    if (one_lane) {
        shared_stream = *s;
        shared_users = 1;
    }
    return 0;
}

// a comm stream no longer used by its communicator (the shared one: by its last user)
static void nccl_stream_release(cudaStream_t s) {
    if (s && s == shared_stream) {
        if (--shared_users > 0) return;
        shared_stream = NULL;
    }
    if (s) cudaStreamDestroy(s);
}

static void impl_free(nccl_impl *m) {
    if (!m) return;
    impl_free(m->rs);
    if (m->registered) watchdog_unregister(m);
    if (m->comm) N.ncclCommDestroy(m->comm);
    for (int i = 0; i < TRACKED; i++)
        if (m->ops[i].done) cudaEventDestroy(m->ops[i].done);
    for (int i = 0; i < m->n_spare; i++) cudaEventDestroy(m->spare[i]);
    if (m->dev_f64) cudaFree(m->dev_f64);
    if (m->host_f64) cudaFreeHost(m->host_f64);
    if (m->produced) cudaEventDestroy(m->produced);
    if (m->finished) cudaEventDestroy(m->finished);
    nccl_stream_release(m->stream);
    free(m);
}

static void nccl_destroy(comm *c) {
    impl_free(c->impl);
    c->impl = NULL;
}

int comm_nccl_unique_id(void *id, size_t n) {
    TRY(comm_nccl_load());
    if (n != sizeof(ncclUniqueId)) return ft_error("nccl: unique id is %zu bytes, not %zu", sizeof(ncclUniqueId), n);
    CHECK_NCCL(N.ncclGetUniqueId((ncclUniqueId *)id));
    return 0;
}

// the transport's functions and its stream, events and staging buffer; m->comm is set by
// the caller (init from an id, or split)
static int nccl_setup(comm *c, const backend *be, int rank, int size, nccl_impl **out) {
    memset(c, 0, sizeof *c);
    nccl_impl *m = ft_calloc(1, sizeof *m, "nccl comm");
    if (!m) return -1;
    c->impl = m;
    c->name = "nccl";
    c->be = be;
    c->rank = rank;
    c->size = size;
    c->all_gather = nccl_all_gather;
    c->iall_gather = nccl_iall_gather;
    c->wait = nccl_wait;
    c->reduce_scatter = nccl_reduce_scatter;
    c->ireduce_scatter = nccl_ireduce_scatter;
    c->all_reduce = nccl_all_reduce;
    c->iall_reduce = nccl_iall_reduce;
    c->all_reduce_f64 = nccl_all_reduce_f64;
    c->broadcast = nccl_broadcast;
    c->barrier = nccl_barrier;
    c->destroy = nccl_destroy;
    *out = m;
    TRY(nccl_stream_create(&m->stream));
    CHECK_CUDA(cudaEventCreateWithFlags(&m->produced, cudaEventDisableTiming));
    CHECK_CUDA(cudaEventCreateWithFlags(&m->finished, cudaEventDisableTiming));
    CHECK_CUDA(cudaMalloc((void **)&m->dev_f64, F64_SLOTS * sizeof(double)));
    CHECK_CUDA(cudaMallocHost((void **)&m->host_f64, F64_SLOTS * sizeof(double)));
    for (int i = 0; i < TRACKED; i++) CHECK_CUDA(cudaEventCreateWithFlags(&m->ops[i].done, cudaEventDisableTiming));
    m->owner = c;
    return 0;
}

// the communicator exists: let the watchdog see it
static int nccl_register(nccl_impl *m) {
    watchdog_hook h = {m, hook_check, hook_describe, hook_abort};
    TRY(watchdog_register(&h));
    m->registered = 1;
    return 0;
}

int comm_nccl_init(comm *c, const backend *be, int rank, int size, const void *id, int device) {
    TRY(comm_nccl_load());
    nccl_impl *m = NULL;
    if (device >= 0) CHECK_CUDA(cudaSetDevice(device));
    TRY(nccl_setup(c, be, rank, size, &m));
    ncclUniqueId uid;
    memcpy(&uid, id, sizeof uid);
    char group[48];
    snprintf(group, sizeof group, "world of %d ranks", size);
    ncclConfig_t cfg;
    ncclConfig_t *config = cta_config(&cfg);
    if (config)
        CHECK_NCCL_GUARDED("ncclCommInitRankConfig", group, N.ncclCommInitRankConfig(&m->comm, size, uid, rank, config));
    else CHECK_NCCL_GUARDED("ncclCommInitRank", group, N.ncclCommInitRank(&m->comm, size, uid, rank));
    return nccl_register(m);
}

int comm_nccl_split(comm *parent, int color, int key, comm *out) {
    ncclComm_t sub = NULL;
    ncclConfig_t cfg;
    CHECK_NCCL_GUARDED("ncclCommSplit", parent->label,
                       N.ncclCommSplit(impl(parent)->comm, color, key, &sub, cta_config(&cfg)));
    int rank = 0, size = 0;
    CHECK_NCCL(N.ncclCommUserRank(sub, &rank));
    CHECK_NCCL(N.ncclCommCount(sub, &size));
    nccl_impl *m = NULL;
    if (nccl_setup(out, parent->be, rank, size, &m) != 0) {
        N.ncclCommDestroy(sub);
        return -1;
    }
    m->comm = sub;
    return nccl_register(m);
}

int comm_nccl_add_reduce_scatter_lane(comm *c, int *created) {
    nccl_impl *m = impl(c);
    *created = 0;
    if (m->rs || one_lane) return 0;
    nccl_impl *lane = ft_calloc(1, sizeof *lane, "nccl reduce-scatter lane");
    if (!lane) return -1;
    m->rs = lane;   // freed with the group, also when the rest fails
    *created = 1;
    lane->owner = c;
    ncclConfig_t cfg;
    CHECK_NCCL_GUARDED("ncclCommSplit of the reduce-scatter lane", c->label,
                       N.ncclCommSplit(m->comm, 0, c->rank, &lane->comm, cta_config(&cfg)));
    TRY(nccl_stream_create(&lane->stream));
    CHECK_CUDA(cudaEventCreateWithFlags(&lane->produced, cudaEventDisableTiming));
    CHECK_CUDA(cudaEventCreateWithFlags(&lane->finished, cudaEventDisableTiming));
    for (int i = 0; i < TRACKED; i++)
        CHECK_CUDA(cudaEventCreateWithFlags(&lane->ops[i].done, cudaEventDisableTiming));
    return nccl_register(lane);   // tracked, checked for asynchronous errors, aborted on a timeout
}

int comm_nccl_library(int *version, char *file, size_t n) {
    TRY(comm_nccl_load());
    *version = nccl_version;
    // the file the loaded ncclGetVersion lives in: libnccl.so.2's real path, or the
    // executable itself when NCCL is linked in (the emulated build)
    Dl_info info;
    const int found = dladdr((void *)N.ncclGetVersion, &info) && info.dli_fname && info.dli_fname[0];
    snprintf(file, n, "%s", found ? info.dli_fname : nccl_file);
    return 0;
}
