// comm_mpi.c: the MPI transport for CPU ranks (built when MPICH is found; see comm.h).
//
// Launch: `mpirun -n N build/finetune ...` or `srun --mpi=pmi2 build/finetune ...` (Debian's
// MPICH speaks PMI2 to Slurm). Buffers are host memory (the CPU backend's), so the data
// collectives map one to one onto MPI's. Errors return (MPI_ERRORS_RETURN) and are recorded
// through CHECK_MPI with the call, file:line and MPI's error string.
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "common.h"

#define CHECK_MPI(call) do { int mpi_rc_ = (call); if (mpi_rc_ != MPI_SUCCESS) { \
    char msg_[MPI_MAX_ERROR_STRING]; int len_ = 0; MPI_Error_string(mpi_rc_, msg_, &len_); \
    return ft_error("%s failed at %s:%d: %s", #call, FT_WHERE, msg_); } } while (0)

typedef struct { MPI_Comm comm; } mpi_impl;

static MPI_Comm mc(comm *c) { return ((mpi_impl *)c->impl)->comm; }

static int mpi_dtype(st_dtype dt, MPI_Datatype *out) {
    switch (dt) {
    case ST_F32: *out = MPI_FLOAT; return 0;
    case ST_F64: *out = MPI_DOUBLE; return 0;
    case ST_I32: *out = MPI_INT; return 0;
    default: return ft_error("mpi: dtype %s is not supported by the MPI transport", st_dtype_name(dt));
    }
}

static int mpi_all_gather(comm *c, void *recv, const void *send, size_t n, st_dtype dt) {
    MPI_Datatype t = MPI_BYTE;
    TRY(mpi_dtype(dt, &t));
    if (n > (size_t)INT32_MAX) return ft_error("mpi: all_gather of %zu elements exceeds MPI's int count", n);
    CHECK_MPI(MPI_Allgather(send, (int)n, t, recv, (int)n, t, mc(c)));
    return 0;
}

static int mpi_iall_gather(comm *c, void *recv, const void *send, size_t n, st_dtype dt, void **req) {
    MPI_Datatype t = MPI_BYTE;
    TRY(mpi_dtype(dt, &t));
    if (n > (size_t)INT32_MAX) return ft_error("mpi: all_gather of %zu elements exceeds MPI's int count", n);
    MPI_Request *r = ft_malloc(sizeof *r, "mpi request");
    if (!r) return -1;
    int rc = MPI_Iallgather(send, (int)n, t, recv, (int)n, t, mc(c), r);
    if (rc != MPI_SUCCESS) { free(r); CHECK_MPI(rc); }
    *req = r;
    return 0;
}

static int mpi_wait(comm *c, void *req) {
    (void)c;
    MPI_Request *r = req;
    int rc = MPI_Wait(r, MPI_STATUS_IGNORE);
    free(r);
    CHECK_MPI(rc);
    return 0;
}

static int mpi_reduce_scatter(comm *c, void *recv, const void *send, size_t n, st_dtype dt) {
    MPI_Datatype t = MPI_BYTE;
    TRY(mpi_dtype(dt, &t));
    if (n > (size_t)INT32_MAX) return ft_error("mpi: reduce_scatter of %zu elements exceeds MPI's int count", n);
    CHECK_MPI(MPI_Reduce_scatter_block(send, recv, (int)n, t, MPI_SUM, mc(c)));
    return 0;
}

static int mpi_ireduce_scatter(comm *c, void *recv, const void *send, size_t n, st_dtype dt, void **req) {
    MPI_Datatype t = MPI_BYTE;
    TRY(mpi_dtype(dt, &t));
    if (n > (size_t)INT32_MAX) return ft_error("mpi: reduce_scatter of %zu elements exceeds MPI's int count", n);
    MPI_Request *r = ft_malloc(sizeof *r, "mpi request");
    if (!r) return -1;
    int rc = MPI_Ireduce_scatter_block(send, recv, (int)n, t, MPI_SUM, mc(c), r);
    if (rc != MPI_SUCCESS) { free(r); CHECK_MPI(rc); }
    *req = r;
    return 0;
}

static int mpi_all_reduce(comm *c, void *buf, size_t n, st_dtype dt) {
    MPI_Datatype t = MPI_BYTE;
    TRY(mpi_dtype(dt, &t));
    if (n > (size_t)INT32_MAX) return ft_error("mpi: all_reduce of %zu elements exceeds MPI's int count", n);
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, t, MPI_SUM, mc(c)));
    return 0;
}

static int mpi_all_reduce_f64(comm *c, double *buf, size_t n) { return mpi_all_reduce(c, buf, n, ST_F64); }

static int mpi_broadcast(comm *c, void *buf, size_t bytes, int root) {
    if (bytes > (size_t)INT32_MAX) return ft_error("mpi: broadcast of %zu bytes exceeds MPI's int count", bytes);
    CHECK_MPI(MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, mc(c)));
    return 0;
}

static int mpi_barrier(comm *c) {
    CHECK_MPI(MPI_Barrier(mc(c)));
    return 0;
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
