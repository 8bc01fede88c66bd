// comm_nccl.c: the NCCL transport for GPU ranks (built when the CUDA toolkit is found; see
// comm.h). UNVERIFIED ON GPU: it compiles and links in CI; no machine here can run it.
//
// Data collectives run on the transport's own stream (the comm stream). A non-blocking
// all-gather records an event on it; comm_wait makes the legacy default stream (where the
// CUDA backend computes) wait for that event, so compute and communication overlap and
// ordering is kept without a host synchronisation. Blocking collectives synchronise the comm
// stream before returning. Host doubles (losses, norms) travel through a small device buffer.
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "cuda_check.h"

typedef struct {
    ncclComm_t comm;
    cudaStream_t stream;
    double *dev_f64;        // (F64_SLOTS) staging for all_reduce_f64
} nccl_impl;

#define F64_SLOTS 4096

static nccl_impl *impl(comm *c) { return c->impl; }

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

static int nccl_all_gather(comm *c, void *recv, const void *send, size_t n, st_dtype dt) {
    ncclDataType_t t = ncclFloat32;
    TRY(nccl_dtype(dt, &t));
    CHECK_NCCL(ncclAllGather(send, recv, n, t, impl(c)->comm, impl(c)->stream));
    CHECK_CUDA(cudaStreamSynchronize(impl(c)->stream));
    return 0;
}

static int nccl_iall_gather(comm *c, void *recv, const void *send, size_t n, st_dtype dt, void **req) {
    ncclDataType_t t = ncclFloat32;
    TRY(nccl_dtype(dt, &t));
    // the gather must not start before the compute stream has produced `send`
    cudaEvent_t ready, done;
    CHECK_CUDA(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    CHECK_CUDA(cudaEventRecord(ready, 0));
    CHECK_CUDA(cudaStreamWaitEvent(impl(c)->stream, ready, 0));
    CHECK_CUDA(cudaEventDestroy(ready));
    CHECK_NCCL(ncclAllGather(send, recv, n, t, impl(c)->comm, impl(c)->stream));
    CHECK_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CHECK_CUDA(cudaEventRecord(done, impl(c)->stream));
    *req = (void *)done;
    return 0;
}

static int nccl_wait(comm *c, void *req) {
    (void)c;
    cudaEvent_t done = (cudaEvent_t)req;
    CHECK_CUDA(cudaStreamWaitEvent(0, done, 0));
    CHECK_CUDA(cudaEventDestroy(done));
    return 0;
}

static int nccl_reduce_scatter(comm *c, void *recv, const void *send, size_t n, st_dtype dt) {
    ncclDataType_t t = ncclFloat32;
    TRY(nccl_dtype(dt, &t));
    CHECK_NCCL(ncclReduceScatter(send, recv, n, t, ncclSum, impl(c)->comm, impl(c)->stream));
    CHECK_CUDA(cudaStreamSynchronize(impl(c)->stream));
    return 0;
}

static int nccl_all_reduce(comm *c, void *buf, size_t n, st_dtype dt) {
    ncclDataType_t t = ncclFloat32;
    TRY(nccl_dtype(dt, &t));
    CHECK_NCCL(ncclAllReduce(buf, buf, n, t, ncclSum, impl(c)->comm, impl(c)->stream));
    CHECK_CUDA(cudaStreamSynchronize(impl(c)->stream));
    return 0;
}

static int nccl_all_reduce_f64(comm *c, double *host, size_t n) {
    for (size_t off = 0; off < n; off += F64_SLOTS) {
        size_t k = n - off < F64_SLOTS ? n - off : F64_SLOTS;
        CHECK_CUDA(cudaMemcpyAsync(impl(c)->dev_f64, host + off, k * sizeof(double), cudaMemcpyHostToDevice,
                                   impl(c)->stream));
        CHECK_NCCL(ncclAllReduce(impl(c)->dev_f64, impl(c)->dev_f64, k, ncclFloat64, ncclSum, impl(c)->comm,
                                 impl(c)->stream));
        CHECK_CUDA(cudaMemcpyAsync(host + off, impl(c)->dev_f64, k * sizeof(double), cudaMemcpyDeviceToHost,
                                   impl(c)->stream));
        CHECK_CUDA(cudaStreamSynchronize(impl(c)->stream));
    }
    return 0;
}

static int nccl_broadcast(comm *c, void *buf, size_t bytes, int root) {
    CHECK_NCCL(ncclBroadcast(buf, buf, bytes, ncclUint8, root, impl(c)->comm, impl(c)->stream));
    CHECK_CUDA(cudaStreamSynchronize(impl(c)->stream));
    return 0;
}

static int nccl_barrier(comm *c) {
    double one = 1.0;
    return nccl_all_reduce_f64(c, &one, 1);
}

static void nccl_destroy(comm *c) {
    nccl_impl *m = c->impl;
    if (!m) return;
    if (m->comm) ncclCommDestroy(m->comm);
    if (m->dev_f64) cudaFree(m->dev_f64);
    if (m->stream) cudaStreamDestroy(m->stream);
    free(m);
    c->impl = NULL;
}

int comm_nccl_unique_id(void *id, size_t n) {
    if (n != sizeof(ncclUniqueId)) return ft_error("nccl: unique id is %zu bytes, not %zu", sizeof(ncclUniqueId), n);
    CHECK_NCCL(ncclGetUniqueId((ncclUniqueId *)id));
    return 0;
}

int comm_nccl_init(comm *c, const backend *be, int rank, int size, const void *id, int device) {
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
    c->all_reduce = nccl_all_reduce;
    c->all_reduce_f64 = nccl_all_reduce_f64;
    c->broadcast = nccl_broadcast;
    c->barrier = nccl_barrier;
    c->destroy = nccl_destroy;
    ncclUniqueId uid;
    memcpy(&uid, id, sizeof uid);
    CHECK_CUDA(cudaSetDevice(device));
    CHECK_CUDA(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking));
    CHECK_CUDA(cudaMalloc((void **)&m->dev_f64, F64_SLOTS * sizeof(double)));
    CHECK_NCCL(ncclCommInitRank(&m->comm, size, uid, rank));
    return 0;
}
