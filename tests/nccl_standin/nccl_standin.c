// tests/nccl_standin/nccl_standin.c: a TEST-ONLY stand-in for libnccl, so that several ranks
// can share ONE real GPU (NCCL refuses that: "Duplicate GPU detected"). It implements exactly
// the NCCL calls src/comm_nccl.c resolves (NCCL_FUNCTIONS there) and is loaded only when
// FT_NCCL_LIBRARY names its file; nothing loads it by default. A communicator's ncclConfig_t
// CTA bounds are checked and kept as NCCL's (../cuda_emu/nccl_config_emu.h; FT_EMU_NCCL_CONFIG
// prints them).
//
//   build/tests/libnccl_standin.so       against the real CUDA runtime (GPU machines:
//                                        tests/gpu/multi_rank_gpu.sh, first light's multi_rank)
//   build/tests/libnccl_standin_emu.so   the same source against the emulated runtime
//                                        (tests/cuda_emu; its CUDA calls resolve to those
//                                        finetune_emu exports): tests/test_nccl_standin.sh
//
// Ranks and data go over MPI: the job runs under mpiexec, and a communicator made from a
// unique id is MPI_COMM_WORLD (finetune makes exactly that one, then splits it). The MPI
// library must give MPI_THREAD_MULTIPLE (each communicator's helper thread calls MPI; MPICH:
// MPIR_CVAR_DEFAULT_THREAD_LEVEL=MPI_THREAD_MULTIPLE; the emulator asks for it itself).
//
// A collective returns at once and happens in stream order, as NCCL's do. On its stream:
//   1. cudaMemcpyAsync device -> the communicator's pinned send staging, then an event
//   2. cuStreamWaitValue32 on a pinned 32-bit counter, the communicator's "gate": the stream
//      goes on only once the counter reaches this collective's sequence number
//   3. cudaMemcpyAsync the pinned receive staging -> device
// The communicator's helper thread takes its collectives in issue order: it waits (polling,
// never blocking in CUDA) for the event of step 1, runs the MPI collective of the same meaning
// on the staged bytes, then stores the sequence number into the gate (release order), which
// lets step 3 run. No host function (cudaLaunchHostFunc) is used: CUDA may run those of all
// streams on one thread, and a host function blocked on a peer could then hold up another
// stream that the peer itself waits for. The stream waits on memory instead, and only the
// helper, which needs nothing from any other stream, releases it.
//
// Each communicator has two MPI communicators: `data` for its helper alone (collectives in
// issue order) and `ctl` for the host thread (ncclCommSplit), so a split never races a
// collective in flight. One staging pair per communicator suffices: its collectives run on
// one stream (a call on another stream first makes that stream wait for the previous one),
// so collective k+1's copy out runs only after collective k's copy back.
//
// Arithmetic as the emulated NCCL (tests/cuda_emu/cuda_emu_host.cpp), the same MPI calls:
// bf16 summed in fp32 and rounded once (round to nearest even), fp32/fp64/int32 summed in
// their own type; float16 sums are refused (finetune makes none). So over the emulated
// runtime the losses equal the emulated NCCL's bitwise.
//
// Errors: an MPI failure makes the communicator's asynchronous error ncclSystemError
// (ncclCommGetAsyncError), its gate is opened so the streams drain (with wrong data, as an
// aborted NCCL kernel leaves it), and later calls on it return that error. ncclCommAbort
// gives up the collective in flight (its MPI request abandoned), opens the gate and frees the
// communicator, leaking its MPI communicators and staging (the process is expected to end).
// ncclGetLastError says why the last call failed.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <limits.h>
#include <mpi.h>
#include <nccl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../cuda_emu/nccl_config_emu.h"   // (header-only: NCCL's checks of a config's CTA bounds)

// what ncclGetVersion reports: the API level whose semantics it provides (2.26: concurrent
// communicators are safe; here each has its own helper thread and MPI communicator)
#define STANDIN_VERSION 22600

enum { OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_ALL_REDUCE, OP_BROADCAST };

typedef struct op {
    int kind;
    size_t count;             // elements per rank (all-gather, reduce-scatter) or in all
    ncclDataType_t type;
    int root;                 // broadcast
    unsigned seq;             // the gate value that releases it
    char *send, *recv;        // the staging it was issued with (a later one may be larger)
    cudaEvent_t staged;       // recorded after the copy out
    struct op *next;
} op;

struct ncclComm {
    MPI_Comm ctl, data;
    int rank, size;
    int device;               // the creating thread's current device (the helper's too)
    pthread_t helper;
    int helper_running;
    pthread_mutex_t mu;
    pthread_cond_t cv;        // the queue changed, or a collective finished
    op *head, *tail;          // issued, not finished (the helper works on head)
    op *spare;                // finished ops, their events reusable
    unsigned issued, finished;
    int stop;
    volatile uint32_t *gate;  // pinned, mapped: the last finished (or released) sequence number
    void *gate_dev;           // its device address (cuStreamWaitValue32 reads it)
    char *send, *recv;        // pinned staging
    size_t send_cap, recv_cap;
    void *retired[64];        // outgrown staging, freed with the communicator
    int n_retired;
    float *acc;               // the helper's fp32 sums (bf16)
    size_t acc_cap;
    cudaStream_t last_stream;
    cudaEvent_t switched;     // orders a call on a new stream after the previous stream
    int error;                // ncclResult_t, written by the helper (atomics)
    int aborted;
    emu_ctas ctas;            // its config's CTA bounds, kept (nothing here runs CTAs)
};

static char g_last_error[512];
static pthread_mutex_t g_last_mu = PTHREAD_MUTEX_INITIALIZER;

// remember why a call failed (ncclGetLastError); returns `rc`
static ncclResult_t fail(ncclResult_t rc, const char *fmt, ...) {
    pthread_mutex_lock(&g_last_mu);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_error, sizeof g_last_error, fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&g_last_mu);
    return rc;
}

static CUresult (*g_wait_value)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

// the driver's cuStreamWaitValue32 through the runtime (no link against libcuda)
static ncclResult_t load_wait_value(void) {
    if (g_wait_value) return ncclSuccess;
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    cudaError_t e = cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess || !fn || q != cudaDriverEntryPointSuccess)
        return fail(ncclSystemError, "NCCL stand-in: the driver has no cuStreamWaitValue32 (%s)", cudaGetErrorString(e));
    g_wait_value = (CUresult(*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int))fn;
    return ncclSuccess;
}

static size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

static void sleep_ns(long *ns) {
    struct timespec ts = {0, *ns};
    nanosleep(&ts, NULL);
    if (*ns < 200000) *ns *= 2;
}

// ----------------------------------------------------------------------------
// the helper thread

// finish a started nonblocking MPI operation, polling gently; gives up once aborted
static int mpi_finish(ncclComm_t c, int rc, MPI_Request *req) {
    long ns = 1000;
    for (int done = 0; rc == MPI_SUCCESS;) {
        rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (done) break;
        if (__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE)) return MPI_ERR_OTHER;
        sleep_ns(&ns);
    }
    return rc;
}

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// round to nearest even (NaN stays NaN)
static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static int grow_acc(ncclComm_t c, size_t n) {
    if (n <= c->acc_cap) return 0;
    float *p = realloc(c->acc, n * sizeof(float));
    if (!p) return -1;
    c->acc = p;
    c->acc_cap = n;
    return 0;
}

static MPI_Datatype mpi_type(ncclDataType_t t) {
    switch (t) {
    case ncclFloat32: return MPI_FLOAT;
    case ncclFloat64: return MPI_DOUBLE;
    case ncclInt32: return MPI_INT;
    default: return MPI_DATATYPE_NULL;
    }
}

// a sum (reduce-scatter or all-reduce) on the staged bytes; bf16 through fp32
static int exchange_sum(ncclComm_t c, const op *o) {
    MPI_Request r;
    const int n = (int)o->count;
    const int rs = o->kind == OP_REDUCE_SCATTER;
    const size_t in_n = rs ? o->count * (size_t)c->size : o->count;
    if (o->type != ncclBfloat16) {
        const MPI_Datatype t = mpi_type(o->type);
        if (rs) return mpi_finish(c, MPI_Ireduce_scatter_block(o->send, o->recv, n, t, MPI_SUM, c->data, &r), &r);
        return mpi_finish(c, MPI_Iallreduce(o->send, o->recv, n, t, MPI_SUM, c->data, &r), &r);
    }
    if (grow_acc(c, in_n + o->count) != 0) return MPI_ERR_NO_MEM;
    const uint16_t *in = (const uint16_t *)o->send;
    for (size_t i = 0; i < in_n; i++) c->acc[i] = bf16_to_f32(in[i]);
    float *out = c->acc + in_n;
    int rc;
    if (rs) {
        rc = mpi_finish(c, MPI_Ireduce_scatter_block(c->acc, out, n, MPI_FLOAT, MPI_SUM, c->data, &r), &r);
    } else {
        rc = mpi_finish(c, MPI_Iallreduce(MPI_IN_PLACE, c->acc, n, MPI_FLOAT, MPI_SUM, c->data, &r), &r);
        out = c->acc;
    }
    uint16_t *dst = (uint16_t *)o->recv;
    for (size_t i = 0; i < o->count; i++) dst[i] = f32_to_bf16(out[i]);
    return rc;
}

// the MPI collective of o's meaning, from the send staging into the receive staging
static int exchange(ncclComm_t c, const op *o) {
    MPI_Request r;
    const size_t bytes = o->count * type_size(o->type);
    switch (o->kind) {
    case OP_ALL_GATHER:
        return mpi_finish(c, MPI_Iallgather(o->send, (int)bytes, MPI_BYTE, o->recv, (int)bytes, MPI_BYTE, c->data, &r),
                          &r);
    case OP_BROADCAST:   // (the root staged its data in the receive staging)
        return mpi_finish(c, MPI_Ibcast(o->recv, (int)bytes, MPI_BYTE, o->root, c->data, &r), &r);
    default:
        return exchange_sum(c, o);
    }
}

// wait until the stream has staged o's data: 0, or -1 when the event fails or on abort
static int wait_staged(ncclComm_t c, const op *o) {
    long ns = 1000;
    for (;;) {
        if (__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE)) return -1;
        const cudaError_t e = cudaEventQuery(o->staged);
        if (e == cudaSuccess) return 0;
        if (e != cudaErrorNotReady) {
            fail(ncclUnhandledCudaError, "NCCL stand-in: the stream failed before a collective: %s",
                 cudaGetErrorString(e));
            return -1;
        }
        sleep_ns(&ns);
    }
}

// (TEST-ONLY FT_STANDIN_FAULT=nccl_async@RANK:N, tests/test_gpu_faults.sh: on the process whose
// PMI_RANK is RANK, the Nth collective run by any of its communicators fails as an MPI failure
// would: the communicator's asynchronous error becomes ncclSystemError)
static int injected_fault(void) {
    static long count;
    const char *f = getenv("FT_STANDIN_FAULT"), *pmi = getenv("PMI_RANK");
    int rank = 0;
    long n = 0;
    if (!f || sscanf(f, "nccl_async@%d:%ld", &rank, &n) != 2 || (pmi ? atoi(pmi) : 0) != rank) return 0;
    if (__atomic_add_fetch(&count, 1, __ATOMIC_RELAXED) != n) return 0;
    fprintf(stderr, "nccl stand-in: injected fault (FT_STANDIN_FAULT): collective %ld fails\n", n);
    return 1;
}

static void *helper_main(void *arg) {
    ncclComm_t c = arg;
    cudaSetDevice(c->device);   // (its events' device: a new thread starts on device 0)
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->head && !c->stop) pthread_cond_wait(&c->cv, &c->mu);
        if (!c->head) break;
        op *o = c->head;
        pthread_mutex_unlock(&c->mu);
        const int ok = __atomic_load_n(&c->error, __ATOMIC_ACQUIRE) == ncclSuccess && wait_staged(c, o) == 0;
        if (ok && !__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE)) {
            const int rc = injected_fault() ? MPI_ERR_OTHER : exchange(c, o);
            if (rc != MPI_SUCCESS && !__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE)) {
                char why[MPI_MAX_ERROR_STRING] = "";
                int len = 0;
                MPI_Error_string(rc, why, &len);
                fail(ncclSystemError, "NCCL stand-in: an MPI collective failed on rank %d of %d: %s", c->rank, c->size,
                     why);
                __atomic_store_n(&c->error, ncclSystemError, __ATOMIC_RELEASE);
            }
        } else if (!ok && !__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE)) {
            __atomic_store_n(&c->error, ncclUnhandledCudaError, __ATOMIC_RELEASE);
        }
        // the stream may go on (the receive staging is written, or the collective failed)
        __atomic_store_n(c->gate, o->seq, __ATOMIC_RELEASE);
        pthread_mutex_lock(&c->mu);
        c->head = o->next;
        if (!c->head) c->tail = NULL;
        o->next = c->spare;
        c->spare = o;
        c->finished = o->seq;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

// ----------------------------------------------------------------------------
// communicators

// a communicator over `ctl` (taken over), with its data communicator, gate and helper
static ncclResult_t comm_create(MPI_Comm ctl, ncclComm_t *out) {
    ncclResult_t rc = load_wait_value();
    if (rc != ncclSuccess) return rc;
    ncclComm_t c = calloc(1, sizeof *c);
    if (!c) return fail(ncclSystemError, "NCCL stand-in: out of host memory");
    c->ctl = ctl;
    c->ctas = emu_ctas_default();   // (a config, if any, is applied by the caller)
    MPI_Comm_rank(ctl, &c->rank);
    MPI_Comm_size(ctl, &c->size);
    if (MPI_Comm_dup(ctl, &c->data) != MPI_SUCCESS) {
        free(c);
        return fail(ncclSystemError, "NCCL stand-in: MPI_Comm_dup failed");
    }
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    // the gate: mapped pinned memory, which the GPU reads at the address the runtime gives
    cudaError_t e = cudaGetDevice(&c->device);
    if (e == cudaSuccess) e = cudaHostAlloc((void **)&c->gate, sizeof *c->gate, cudaHostAllocMapped);
    if (e == cudaSuccess) e = cudaHostGetDevicePointer(&c->gate_dev, (void *)c->gate, 0);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->switched, cudaEventDisableTiming);
    if (e != cudaSuccess) return fail(ncclUnhandledCudaError, "NCCL stand-in: %s", cudaGetErrorString(e));
    *c->gate = 0;
    if (pthread_create(&c->helper, NULL, helper_main, c) != 0)
        return fail(ncclSystemError, "NCCL stand-in: cannot start a helper thread");
    c->helper_running = 1;
    *out = c;
    return ncclSuccess;
}

// ---- the NCCL API below: each call keeps nccl.h's contract (NCCL's documentation), within the
// limits in this file's header comment

ncclResult_t ncclGetVersion(int *version) {
    if (!version) return ncclInvalidArgument;
    *version = STANDIN_VERSION;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (NCCL stand-in)";
    case ncclSystemError: return "unhandled system error (NCCL stand-in: an MPI call failed, or the communicator was aborted)";
    case ncclInternalError: return "internal error (NCCL stand-in)";
    case ncclInvalidArgument: return "invalid argument (NCCL stand-in)";
    case ncclInvalidUsage: return "invalid usage (NCCL stand-in)";
    case ncclRemoteError: return "remote process exited or there was a network error (NCCL stand-in)";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code (NCCL stand-in)";
    }
}

const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    return g_last_error;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    if (!id) return ncclInvalidArgument;
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "nccl stand-in id (MPI world)");
    return ncclSuccess;
}

// the world communicator, with NCCL's default CTA bounds (ncclCommInitRank logs them)
static ncclResult_t init_rank(ncclComm_t *comm, int nranks, int rank) {
    int init = 0, level = MPI_THREAD_SINGLE, wr = -1, ws = 0;
    MPI_Initialized(&init);
    if (!init) return fail(ncclInvalidUsage, "NCCL stand-in: MPI is not initialized (run the job under mpiexec)");
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_MULTIPLE)
        return fail(ncclInvalidUsage, "NCCL stand-in: MPI gives thread level %d, not MPI_THREAD_MULTIPLE (MPICH: "
                    "export MPIR_CVAR_DEFAULT_THREAD_LEVEL=MPI_THREAD_MULTIPLE)", level);
    MPI_Comm_rank(MPI_COMM_WORLD, &wr);
    MPI_Comm_size(MPI_COMM_WORLD, &ws);
    if (wr != rank || ws != nranks)
        return fail(ncclInvalidUsage, "NCCL stand-in: rank %d of %d is not MPI's rank %d of %d (only the world is "
                    "supported)", rank, nranks, wr, ws);
    MPI_Comm ctl;
    if (MPI_Comm_dup(MPI_COMM_WORLD, &ctl) != MPI_SUCCESS) return fail(ncclSystemError, "NCCL stand-in: MPI_Comm_dup failed");
    return comm_create(ctl, comm);
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    (void)id;
    const ncclResult_t r = init_rank(comm, nranks, rank);
    if (r == ncclSuccess) emu_ctas_log("nccl_standin", "init", rank, nranks, &(*comm)->ctas);
    return r;
}

// ncclCommInitRank with a configuration: its CTA bounds checked and kept as NCCL's are
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config) {
    (void)id;
    emu_ctas ctas;
    if (emu_ctas_from_config(config, NULL, &ctas) != 0)
        return fail(ncclInvalidArgument, "NCCL stand-in: invalid ncclConfig_t (magic, or its CTA bounds)");
    const ncclResult_t r = init_rank(comm, nranks, rank);
    if (r == ncclSuccess) emu_ctas_take(&(*comm)->ctas, &ctas, "nccl_standin", "init", rank, nranks);
    return r;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
    if (!comm || !newcomm) return ncclInvalidArgument;
    emu_ctas ctas;
    if (emu_ctas_from_config(config, &comm->ctas, &ctas) != 0)
        return fail(ncclInvalidArgument, "NCCL stand-in: invalid ncclConfig_t (magic, or its CTA bounds)");
    MPI_Comm ctl;
    if (MPI_Comm_split(comm->ctl, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &ctl) != MPI_SUCCESS)
        return fail(ncclSystemError, "NCCL stand-in: MPI_Comm_split failed");
    *newcomm = NULL;
    if (ctl == MPI_COMM_NULL) return ncclSuccess;
    const ncclResult_t r = comm_create(ctl, newcomm);
    if (r == ncclSuccess)
        emu_ctas_take(&(*newcomm)->ctas, &ctas, "nccl_standin", "split", (*newcomm)->rank, (*newcomm)->size);
    return r;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    if (!comm || !rank) return ncclInvalidArgument;
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    if (!comm || !count) return ncclInvalidArgument;
    *count = comm->size;
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err) {
    if (!comm || !err) return ncclInvalidArgument;
    *err = (ncclResult_t)__atomic_load_n(&comm->error, __ATOMIC_ACQUIRE);
    return ncclSuccess;
}

// stop the helper once its queue is empty (drain: wait for the queued collectives; else the
// communicator is aborted and they are dropped)
static void helper_stop(ncclComm_t c) {
    if (!c->helper_running) return;
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->helper, NULL);
    c->helper_running = 0;
}

static void ops_free(op *o) {
    while (o) {
        op *n = o->next;
        cudaEventDestroy(o->staged);
        free(o);
        o = n;
    }
}

// waits for the communicator's queued collectives (as NCCL's does), then frees it
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    helper_stop(comm);
    ops_free(comm->spare);
    MPI_Comm_free(&comm->data);
    MPI_Comm_free(&comm->ctl);
    for (int i = 0; i < comm->n_retired; i++) cudaFreeHost(comm->retired[i]);
    cudaFreeHost(comm->send);
    cudaFreeHost(comm->recv);
    cudaFreeHost((void *)comm->gate);
    cudaEventDestroy(comm->switched);
    free(comm->acc);
    pthread_mutex_destroy(&comm->mu);
    pthread_cond_destroy(&comm->cv);
    free(comm);
    return ncclSuccess;
}

// gives up the collective in flight, drops the queued ones, opens the gate for every issued
// collective (the streams drain), frees the communicator; MPI communicators and pinned
// buffers are leaked (an abandoned MPI request may still refer to them)
ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    __atomic_store_n(&comm->aborted, 1, __ATOMIC_RELEASE);
    helper_stop(comm);
    __atomic_store_n(comm->gate, comm->issued, __ATOMIC_RELEASE);
    ops_free(comm->spare);
    free(comm->acc);
    free(comm);
    return ncclSuccess;
}

// ----------------------------------------------------------------------------
// collectives

// pinned staging of at least `need` bytes; the old buffer is kept until the communicator
// goes (a collective already issued may still copy through it)
static ncclResult_t stage_reserve(ncclComm_t c, char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return ncclSuccess;
    size_t n = *cap * 2 > need ? *cap * 2 : need;
    if (*buf) {
        if (c->n_retired == (int)(sizeof c->retired / sizeof c->retired[0]))
            return fail(ncclInternalError, "NCCL stand-in: staging grew too often");
        c->retired[c->n_retired++] = *buf;
    }
    *buf = NULL;
    *cap = 0;
    const cudaError_t e = cudaMallocHost((void **)buf, n);
    if (e != cudaSuccess) return fail(ncclUnhandledCudaError, "NCCL stand-in: cudaMallocHost of %zu bytes: %s", n,
                                      cudaGetErrorString(e));
    *cap = n;
    return ncclSuccess;
}

static ncclResult_t cuda_fail(const char *what, cudaError_t e) {
    return fail(ncclUnhandledCudaError, "NCCL stand-in: %s: %s", what, cudaGetErrorString(e));
}

// an op record with its event (a finished one reused)
static ncclResult_t op_new(ncclComm_t c, op **out) {
    pthread_mutex_lock(&c->mu);
    op *o = c->spare;
    if (o) c->spare = o->next;
    pthread_mutex_unlock(&c->mu);
    if (!o) {
        if (!(o = calloc(1, sizeof *o))) return fail(ncclSystemError, "NCCL stand-in: out of host memory");
        const cudaError_t e = cudaEventCreateWithFlags(&o->staged, cudaEventDisableTiming);
        if (e != cudaSuccess) {
            free(o);
            return cuda_fail("cudaEventCreateWithFlags", e);
        }
    }
    *out = o;
    return ncclSuccess;
}

// Issue one collective on `stream`: copy `sbytes` from `sendbuff` out to the staging `stage`,
// record o->staged, queue o for the helper, gate the stream on o's sequence number, copy
// `rbytes` of the receive staging back to `recvbuff`.
static ncclResult_t issue(ncclComm_t c, op *o, const void *sendbuff, size_t sbytes, char *stage, void *recvbuff,
                          size_t rbytes, cudaStream_t stream) {
    cudaError_t e;
    o->send = c->send;
    o->recv = c->recv;
    if (c->last_stream && c->last_stream != stream) {   // collectives of one communicator stay in order
        if ((e = cudaEventRecord(c->switched, c->last_stream)) != cudaSuccess) return cuda_fail("cudaEventRecord", e);
        if ((e = cudaStreamWaitEvent(stream, c->switched, 0)) != cudaSuccess) return cuda_fail("cudaStreamWaitEvent", e);
    }
    c->last_stream = stream;
    if (sbytes && (e = cudaMemcpyAsync(stage, sendbuff, sbytes, cudaMemcpyDeviceToHost, stream)) != cudaSuccess)
        return cuda_fail("cudaMemcpyAsync to the staging", e);
    if ((e = cudaEventRecord(o->staged, stream)) != cudaSuccess) return cuda_fail("cudaEventRecord", e);
    o->seq = ++c->issued;
    o->next = NULL;
    pthread_mutex_lock(&c->mu);
    if (c->tail) c->tail->next = o;
    else c->head = o;
    c->tail = o;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
#ifndef FT_FAULT_SKIP_GATE
    // (TEST-ONLY FAULT FT_FAULT_SKIP_GATE, tests/test_nccl_standin.sh: no gate, so the copy back
    // may run before the exchange wrote the receive staging)
    const CUresult w = g_wait_value((CUstream)stream, (CUdeviceptr)(uintptr_t)c->gate_dev, o->seq, CU_STREAM_WAIT_VALUE_GEQ);
    if (w != CUDA_SUCCESS) return fail(ncclUnhandledCudaError, "NCCL stand-in: cuStreamWaitValue32 failed (CUresult %d)", (int)w);
#endif
    if ((e = cudaMemcpyAsync(recvbuff, o->recv, rbytes, cudaMemcpyHostToDevice, stream)) != cudaSuccess)
        return cuda_fail("cudaMemcpyAsync from the staging", e);
    return ncclSuccess;
}

// the checks every collective makes: ncclSuccess or why not; *nothing = 1 for a count of 0
// (nothing is queued: NCCL does nothing for it either)
static ncclResult_t prepare(ncclComm_t c, const char *what, size_t count, ncclDataType_t t, int sum, ncclRedOp_t redop,
                            size_t total_bytes, int *nothing) {
    *nothing = 0;
    if (!c) return fail(ncclInvalidArgument, "NCCL stand-in: %s on a NULL communicator", what);
    const int err = __atomic_load_n(&c->error, __ATOMIC_ACQUIRE);
    if (err != ncclSuccess) return (ncclResult_t)err;
    if (type_size(t) == 0) return fail(ncclInvalidArgument, "NCCL stand-in: %s: unknown data type %d", what, (int)t);
    if (sum && (redop != ncclSum || !(t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16 || t == ncclInt32)))
        return fail(ncclInvalidArgument, "NCCL stand-in: %s: only sums of fp32, fp64, bf16 and int32", what);
    if (total_bytes > (size_t)INT_MAX)
        return fail(ncclInvalidArgument, "NCCL stand-in: %s of %zu bytes: more than MPI's int count", what, total_bytes);
    *nothing = count == 0;
    return ncclSuccess;
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    const size_t es = type_size(datatype), bytes = sendcount * es;
    int nothing;
    ncclResult_t rc = prepare(comm, "ncclAllGather", sendcount, datatype, 0, ncclSum, bytes * (comm ? comm->size : 1), &nothing);
    if (rc != ncclSuccess || nothing) return rc;
    op *o = NULL;
    if ((rc = stage_reserve(comm, &comm->send, &comm->send_cap, bytes)) != ncclSuccess ||
        (rc = stage_reserve(comm, &comm->recv, &comm->recv_cap, bytes * comm->size)) != ncclSuccess ||
        (rc = op_new(comm, &o)) != ncclSuccess)
        return rc;
    *o = (op){OP_ALL_GATHER, sendcount, datatype, 0, 0, NULL, NULL, o->staged, NULL};
    return issue(comm, o, sendbuff, bytes, comm->send, recvbuff, bytes * comm->size, stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op_, ncclComm_t comm, cudaStream_t stream) {
    const size_t es = type_size(datatype), bytes = recvcount * es;
    int nothing;
    ncclResult_t rc = prepare(comm, "ncclReduceScatter", recvcount, datatype, 1, op_, bytes * (comm ? comm->size : 1), &nothing);
    if (rc != ncclSuccess || nothing) return rc;
    op *o = NULL;
    if ((rc = stage_reserve(comm, &comm->send, &comm->send_cap, bytes * comm->size)) != ncclSuccess ||
        (rc = stage_reserve(comm, &comm->recv, &comm->recv_cap, bytes)) != ncclSuccess ||
        (rc = op_new(comm, &o)) != ncclSuccess)
        return rc;
    *o = (op){OP_REDUCE_SCATTER, recvcount, datatype, 0, 0, NULL, NULL, o->staged, NULL};
    return issue(comm, o, sendbuff, bytes * comm->size, comm->send, recvbuff, bytes, stream);
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op_,
                           ncclComm_t comm, cudaStream_t stream) {
    const size_t bytes = count * type_size(datatype);
    int nothing;
    ncclResult_t rc = prepare(comm, "ncclAllReduce", count, datatype, 1, op_, bytes, &nothing);
    if (rc != ncclSuccess || nothing) return rc;
    op *o = NULL;
    if ((rc = stage_reserve(comm, &comm->send, &comm->send_cap, bytes)) != ncclSuccess ||
        (rc = stage_reserve(comm, &comm->recv, &comm->recv_cap, bytes)) != ncclSuccess ||
        (rc = op_new(comm, &o)) != ncclSuccess)
        return rc;
    *o = (op){OP_ALL_REDUCE, count, datatype, 0, 0, NULL, NULL, o->staged, NULL};
    return issue(comm, o, sendbuff, bytes, comm->send, recvbuff, bytes, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    const size_t bytes = count * type_size(datatype);
    int nothing;
    ncclResult_t rc = prepare(comm, "ncclBroadcast", count, datatype, 0, ncclSum, bytes, &nothing);
    if (rc != ncclSuccess || nothing) return rc;
    if (root < 0 || root >= comm->size) return fail(ncclInvalidArgument, "NCCL stand-in: ncclBroadcast root %d of %d", root, comm->size);
    op *o = NULL;
    if ((rc = stage_reserve(comm, &comm->recv, &comm->recv_cap, bytes)) != ncclSuccess ||
        (rc = op_new(comm, &o)) != ncclSuccess)
        return rc;
    *o = (op){OP_BROADCAST, count, datatype, root, 0, NULL, NULL, o->staged, NULL};
    // the root stages its data straight into the receive staging (MPI_Bcast works in place)
    return issue(comm, o, sendbuff, comm->rank == root ? bytes : 0, comm->recv, recvbuff, bytes, stream);
}
