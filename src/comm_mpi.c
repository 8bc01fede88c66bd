// comm_mpi.c: the MPI transport for CPU ranks (built when MPICH is found; see comm.h).
//
// Launch: `mpirun -n N build/finetune ...` or `srun --mpi=pmi2 build/finetune ...` (Debian's
// MPICH speaks PMI2 to Slurm). Buffers are host memory (the CPU backend's), so the data
// collectives map one to one onto MPI's. Errors return (MPI_ERRORS_RETURN) and are recorded
// through CHECK_MPI with the call, file:line and MPI's error string.
#define _GNU_SOURCE   // dladdr
#include <dlfcn.h>
#include <mpi.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "common.h"
#include "watchdog.h"

#define CHECK_MPI(call) do { int mpi_rc_ = (call); if (mpi_rc_ != MPI_SUCCESS) { \
    char msg_[MPI_MAX_ERROR_STRING]; int len_ = 0; MPI_Error_string(mpi_rc_, msg_, &len_); \
    return ft_error("%s failed at %s:%d: %s", #call, FT_WHERE, msg_); } } while (0)

typedef struct { MPI_Comm comm; } mpi_impl;

static MPI_Comm mc(comm *c) { return ((mpi_impl *)c->impl)->comm; }

// ----------------------------------------------------------------------------
// completion: every collective is started non-blocking and completed here, under the
// watchdog's deadline when --collective_timeout is set (MPI_Test polled; MPI makes progress
// only inside such calls, so the first WATCHDOG_SPIN_S of every wait polls without pause)

// a non-blocking collective's request: n MPI requests (an all-reduce in chunks: mpi_max_count)
typedef struct { const char *op; size_t bytes; int n; MPI_Request r[]; } mpi_request;

static mpi_request *request_new(int n, const char *op, size_t bytes) {
    mpi_request *m = ft_malloc(sizeof *m + (size_t)n * sizeof(MPI_Request), "mpi request");
    if (!m) return NULL;
    m->op = op;
    m->bytes = bytes;
    m->n = n;
    for (int i = 0; i < n; i++) m->r[i] = MPI_REQUEST_NULL;
    return m;
}

static int poll_request(void *ctx) {
    int done = 0;
    CHECK_MPI(MPI_Test((MPI_Request *)ctx, &done, MPI_STATUS_IGNORE));
    return done;
}

// complete *r, operation `op` over `bytes` of data (the whole buffer, for the message)
static int complete(comm *c, MPI_Request *r, const char *op, size_t bytes) {
    if (!watchdog_enabled()) {
        CHECK_MPI(MPI_Wait(r, MPI_STATUS_IGNORE));
        return 0;
    }
    char group[64];
    snprintf(group, sizeof group, "%s of %d ranks", c->label ? c->label : "world", c->size);
    return watchdog_wait(poll_request, r, op, group, bytes);
}

// the MPI type and the int count of n elements of dt (MPI counts are int)
static int mpi_args(const char *op, size_t n, st_dtype dt, MPI_Datatype *t, int *count) {
    switch (dt) {
    case ST_F32: *t = MPI_FLOAT; break;
    case ST_F64: *t = MPI_DOUBLE; break;
    case ST_I32: *t = MPI_INT; break;
    default: return ft_error("mpi: dtype %s is not supported by the MPI transport", st_dtype_name(dt));
    }
    if (n > (size_t)INT32_MAX) return ft_error("mpi: %s of %zu elements exceeds MPI's int count", op, n);
    *count = (int)n;
    return 0;
}

// ----------------------------------------------------------------------------
// collectives

static int start_all_gather(comm *c, void *recv, const void *send, size_t n, st_dtype dt, MPI_Request *r) {
    MPI_Datatype t;
    int k;
    TRY(mpi_args("all_gather", n, dt, &t, &k));
    CHECK_MPI(MPI_Iallgather(send, k, t, recv, k, t, mc(c), r));
    return 0;
}

static int start_reduce_scatter(comm *c, void *recv, const void *send, size_t n, st_dtype dt, MPI_Request *r) {
    MPI_Datatype t;
    int k;
    TRY(mpi_args("reduce_scatter", n, dt, &t, &k));
    CHECK_MPI(MPI_Ireduce_scatter_block(send, recv, k, t, MPI_SUM, mc(c), r));
    return 0;
}

static int mpi_all_gather(comm *c, void *recv, const void *send, size_t n, st_dtype dt) {
    MPI_Request r;
    TRY(start_all_gather(c, recv, send, n, dt, &r));
    return complete(c, &r, "all_gather", (size_t)c->size * n * st_dtype_size(dt));
}

static int mpi_reduce_scatter(comm *c, void *recv, const void *send, size_t n, st_dtype dt) {
    MPI_Request r;
    TRY(start_reduce_scatter(c, recv, send, n, dt, &r));
    return complete(c, &r, "reduce_scatter", (size_t)c->size * n * st_dtype_size(dt));
}

// the non-blocking forms: the request carries what complete() names
static int mpi_istart(comm *c, void *recv, const void *send, size_t n, st_dtype dt, void **req, int gather) {
    mpi_request *m = request_new(1, gather ? "all_gather" : "reduce_scatter", (size_t)c->size * n * st_dtype_size(dt));
    if (!m) return -1;
    if ((gather ? start_all_gather : start_reduce_scatter)(c, recv, send, n, dt, &m->r[0]) != 0) {
        free(m);
        return -1;
    }
    *req = m;
    return 0;
}

static int mpi_iall_gather(comm *c, void *recv, const void *send, size_t n, st_dtype dt, void **req) {
    return mpi_istart(c, recv, send, n, dt, req, 1);
}

static int mpi_ireduce_scatter(comm *c, void *recv, const void *send, size_t n, st_dtype dt, void **req) {
    return mpi_istart(c, recv, send, n, dt, req, 0);
}

// every part completed (the first failure is the status; the rest are still waited for:
// MPI's requests must not be left behind)
static int mpi_wait(comm *c, void *req) {
    mpi_request *m = req;
    int rc = 0;
    for (int i = 0; i < m->n; i++)
        if (complete(c, &m->r[i], m->op, m->bytes) != 0 && rc == 0) rc = -1;
    free(m);
    return rc;
}

// The most elements one MPI call moves: MPI counts are int, and DDP's gradient all-reduce of a
// 7B model holds 6.7e9 elements, so all-reduces and broadcasts go in chunks of at most this.
// FT_MPI_MAX_COUNT (test-only) lowers it. 0 / -1 (the variable is not a count).
static int mpi_max_count(size_t *out) {
    *out = (size_t)INT32_MAX;
    const char *s = ft_getenv("FT_MPI_MAX_COUNT");
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    const unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < 1 || v > (unsigned long long)INT32_MAX || s[0] == '-')
        return ft_error("environment variable FT_MPI_MAX_COUNT: '%s' is not a count in [1, %d] (test-only)", s, INT32_MAX);
    *out = (size_t)v;
    return 0;
}

// buf (n <= mpi_max_count) summed in place, started
static int start_all_reduce(comm *c, void *buf, size_t n, st_dtype dt, MPI_Request *r) {
    MPI_Datatype t;
    int k;
    TRY(mpi_args("all_reduce", n, dt, &t, &k));
    CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, buf, k, t, MPI_SUM, mc(c), r));
    return 0;
}

static int mpi_all_reduce(comm *c, void *buf, size_t n, st_dtype dt) {
    size_t chunk;
    TRY(mpi_max_count(&chunk));
    const size_t esz = st_dtype_size(dt);
    size_t off = 0;
    do {   // (one call for n = 0, as before)
        const size_t m = n - off < chunk ? n - off : chunk;
        MPI_Request r;
        TRY(start_all_reduce(c, (char *)buf + off * esz, m, dt, &r));
        TRY(complete(c, &r, dt == ST_F64 ? "all_reduce of host doubles" : "all_reduce", m * esz));
        off += m;
    } while (off < n);
    return 0;
}

// non-blocking, in the same chunks as mpi_all_reduce (one MPI request each, all in flight)
static int mpi_iall_reduce(comm *c, void *buf, size_t n, st_dtype dt, void **req) {
    size_t chunk;
    TRY(mpi_max_count(&chunk));
    const size_t esz = st_dtype_size(dt), parts = n == 0 ? 1 : (n + chunk - 1) / chunk;
    if (parts > (size_t)INT32_MAX) return ft_error("mpi: all_reduce of %zu elements in too many chunks", n);
    mpi_request *m = request_new((int)parts, "all_reduce", n * esz);
    if (!m) return -1;
    for (size_t p = 0, off = 0; p < parts; p++, off += chunk) {
        const size_t k = n - off < chunk ? n - off : chunk;
        if (start_all_reduce(c, (char *)buf + off * esz, k, dt, &m->r[p]) != 0) {
            m->n = (int)p;   // the parts already started complete first (their status aside)
            (void)mpi_wait(c, m);
            return -1;
        }
    }
    *req = m;
    return 0;
}

static int mpi_all_reduce_f64(comm *c, double *buf, size_t n) { return mpi_all_reduce(c, buf, n, ST_F64); }

static int mpi_broadcast(comm *c, void *buf, size_t bytes, int root) {
    size_t chunk;
    TRY(mpi_max_count(&chunk));
    size_t off = 0;
    do {
        const size_t m = bytes - off < chunk ? bytes - off : chunk;
        MPI_Request r;
        CHECK_MPI(MPI_Ibcast((char *)buf + off, (int)m, MPI_BYTE, root, mc(c), &r));
        TRY(complete(c, &r, "broadcast", m));
        off += m;
    } while (off < bytes);
    return 0;
}

static int mpi_barrier(comm *c) {
    MPI_Request r;
    CHECK_MPI(MPI_Ibarrier(mc(c), &r));
    return complete(c, &r, "barrier", 0);
}

static void mpi_destroy(comm *c) {
    mpi_impl *m = c->impl;
    if (m && m->comm != MPI_COMM_WORLD && m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
    free(m);
    c->impl = NULL;
}

static int wrap(comm *c, MPI_Comm mcomm, const backend *be) {
    memset(c, 0, sizeof *c);
    mpi_impl *m = ft_malloc(sizeof *m, "mpi comm");
    if (!m) return -1;
    m->comm = mcomm;
    c->impl = m;
    c->name = "mpi";
    c->be = be;
    CHECK_MPI(MPI_Comm_set_errhandler(mcomm, MPI_ERRORS_RETURN));
    CHECK_MPI(MPI_Comm_rank(mcomm, &c->rank));
    CHECK_MPI(MPI_Comm_size(mcomm, &c->size));
    c->all_gather = mpi_all_gather;
    c->iall_gather = mpi_iall_gather;
    c->wait = mpi_wait;
    c->reduce_scatter = mpi_reduce_scatter;
    c->ireduce_scatter = mpi_ireduce_scatter;
    c->all_reduce = mpi_all_reduce;
    c->iall_reduce = mpi_iall_reduce;
    c->all_reduce_f64 = mpi_all_reduce_f64;
    c->broadcast = mpi_broadcast;
    c->barrier = mpi_barrier;
    c->destroy = mpi_destroy;
    return 0;
}

// ----------------------------------------------------------------------------
// bootstrap

int comm_mpi_launched(void) {
    // set by MPICH's hydra (mpirun/mpiexec), Open MPI, and Slurm's PMI2 plugin under srun
    static const char *vars[] = {"PMI_RANK", "PMI_SIZE", "PMI_FD", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", NULL};
    for (int i = 0; vars[i]; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

int comm_mpi_init_world(comm *world, const backend *be, int *argc, char ***argv) {
    // Every collective is non-blocking here (the watchdog's deadline). MPICH 4.0's default
    // algorithm for the non-blocking reduce-scatter (recursive halving) measured 10x slower
    // than the blocking call (2 ranks, 721 KiB: 650 us vs 60 us); pairwise exchange, which
    // the blocking call uses for long messages, matches it. A user's setting wins.
    setenv("MPIR_CVAR_IREDUCE_SCATTER_BLOCK_INTRA_ALGORITHM", "sched_pairwise", 0);
    CHECK_MPI(MPI_Init(argc, argv));
    return wrap(world, MPI_COMM_WORLD, be);
}

int comm_mpi_split(comm *parent, int color, int key, comm *out) {
    MPI_Comm sub;
    CHECK_MPI(MPI_Comm_split(mc(parent), color, key, &sub));
    return wrap(out, sub, parent->be);
}

void comm_mpi_abort(int code) { MPI_Abort(MPI_COMM_WORLD, code); }

void comm_mpi_finalize(void) { MPI_Finalize(); }

int comm_mpi_local_info(int *local_rank, int *local_size) {
    MPI_Comm node;
    CHECK_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    MPI_Comm_rank(node, local_rank);
    MPI_Comm_size(node, local_size);
    MPI_Comm_free(&node);
    return 0;
}

void comm_mpi_library(char *version, size_t n, char *file, size_t fn) {
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    if (MPI_Get_library_version(v, &len) != MPI_SUCCESS) snprintf(v, sizeof v, "unknown");
    v[strcspn(v, "\n")] = 0;   // the first line: name and version
    snprintf(version, n, "%s", v);
    Dl_info info;
    const int found = dladdr((void *)MPI_Get_library_version, &info);
    snprintf(file, fn, "%s", found && info.dli_fname ? info.dli_fname : "?");
}
