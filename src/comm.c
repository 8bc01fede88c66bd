// comm.c: counting wrappers and the single-process transport (see comm.h).
#include "comm.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"

// ----------------------------------------------------------------------------
// counting wrappers

static void count(comm *c, comm_kind k, size_t bytes) {
    c->bytes_sent[k] += bytes;
}

int comm_all_gather(comm *c, void *recv, const void *send, size_t n, st_dtype dt) {
    count(c, COMM_ALL_GATHER, (size_t)(c->size - 1) * n * st_dtype_size(dt));
    return c->all_gather(c, recv, send, n, dt);
}
int comm_iall_gather(comm *c, void *recv, const void *send, size_t n, st_dtype dt, void **req) {
    count(c, COMM_ALL_GATHER, (size_t)(c->size - 1) * n * st_dtype_size(dt));
    return c->iall_gather(c, recv, send, n, dt, req);
}
int comm_wait(comm *c, void *req) { return c->wait(c, req); }
int comm_reduce_scatter(comm *c, void *recv, const void *send, size_t n, st_dtype dt) {
    count(c, COMM_REDUCE_SCATTER, (size_t)(c->size - 1) * n * st_dtype_size(dt));
    return c->reduce_scatter(c, recv, send, n, dt);
}
int comm_ireduce_scatter(comm *c, void *recv, const void *send, size_t n, st_dtype dt, void **req) {
    count(c, COMM_REDUCE_SCATTER, (size_t)(c->size - 1) * n * st_dtype_size(dt));
    return c->ireduce_scatter(c, recv, send, n, dt, req);
}
// ring all-reduce = reduce-scatter + all-gather of count / size each
static size_t all_reduce_bytes(const comm *c, size_t n, st_dtype dt) {
    return c->size > 1 ? 2 * (size_t)(c->size - 1) * (n / c->size) * st_dtype_size(dt) : 0;
}
int comm_all_reduce(comm *c, void *buf, size_t n, st_dtype dt) {
    count(c, COMM_ALL_REDUCE, all_reduce_bytes(c, n, dt));
    return c->all_reduce(c, buf, n, dt);
}
int comm_iall_reduce(comm *c, void *buf, size_t n, st_dtype dt, void **req) {
    count(c, COMM_ALL_REDUCE, all_reduce_bytes(c, n, dt));
    return c->iall_reduce(c, buf, n, dt, req);
}
int comm_all_reduce_f64(comm *c, double *buf, size_t n) {
    count(c, COMM_ALL_REDUCE, c->size > 1 ? 2 * (size_t)(c->size - 1) * n * sizeof(double) / c->size : 0);
    return c->all_reduce_f64(c, buf, n);
}
int comm_broadcast(comm *c, void *buf, size_t bytes, int root) {
    count(c, COMM_BROADCAST, c->rank == root && c->size > 1 ? bytes : 0);
    return c->broadcast(c, buf, bytes, root);
}
int comm_barrier(comm *c) { return c->barrier(c); }
void comm_destroy(comm *c) { if (c && c->destroy) c->destroy(c); }

int comm_agree(comm *c, int rc, int *agreed) {
    const int W = c->size;
    if (W == 1) return rc;
    double *v = ft_calloc((size_t)W, sizeof(double), "status agreement");
    if (!v) return -1;
    v[c->rank] = rc != 0;
    int comm_rc = comm_all_reduce_f64(c, v, (size_t)W);
    int first = -1;
    for (int r = 0; r < W && first < 0; r++) if (v[r] > 0) first = r;
    free(v);
    if (comm_rc != 0) return -1;
    if (first < 0) return 0;
    *agreed = 1;
    if (first == c->rank) return -1;
    ft_error_clear();
    ft_error("rank %d failed", first);
    return COMM_PEER_FAILED;
}

// ----------------------------------------------------------------------------
// single process: every collective is the identity (a copy when buffers differ)

static int single_copy(comm *c, void *recv, const void *send, size_t n, st_dtype dt) {
    if (recv == send) return 0;
    return c->be->copy_d2d(recv, send, n * st_dtype_size(dt));
}
static int single_icopy(comm *c, void *recv, const void *send, size_t n, st_dtype dt, void **req) {
    *req = NULL;
    return single_copy(c, recv, send, n, dt);
}
static int single_wait(comm *c, void *req) { (void)c; (void)req; return 0; }
static int single_all_reduce(comm *c, void *buf, size_t n, st_dtype dt) { (void)c; (void)buf; (void)n; (void)dt; return 0; }
static int single_iall_reduce(comm *c, void *buf, size_t n, st_dtype dt, void **req) {
    *req = NULL;
    return single_all_reduce(c, buf, n, dt);
}
static int single_all_reduce_f64(comm *c, double *buf, size_t n) { (void)c; (void)buf; (void)n; return 0; }
static int single_broadcast(comm *c, void *buf, size_t bytes, int root) { (void)c; (void)buf; (void)bytes; (void)root; return 0; }
static int single_barrier(comm *c) { (void)c; return 0; }
static void single_destroy(comm *c) { (void)c; }

void comm_init_single(comm *c, const backend *be) {
    memset(c, 0, sizeof *c);
    c->name = "single";
    c->rank = 0;
    c->size = 1;
    c->be = be;
    c->all_gather = single_copy;
    c->iall_gather = single_icopy;
    c->wait = single_wait;
    c->reduce_scatter = single_copy;
    c->ireduce_scatter = single_icopy;   // the identity too: a copy, complete at once
    c->all_reduce = single_all_reduce;
    c->iall_reduce = single_iall_reduce;
    c->all_reduce_f64 = single_all_reduce_f64;
    c->broadcast = single_broadcast;
    c->barrier = single_barrier;
    c->destroy = single_destroy;
}
