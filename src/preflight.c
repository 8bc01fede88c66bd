// preflight.c: the environment table and the timed collectives before step 1 (see preflight.h).
#define _GNU_SOURCE   // dladdr, dlinfo
#include "preflight.h"

#include <dlfcn.h>
#include <link.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "attn_engine.h"
#include "comm.h"
#include "common.h"
#include "config.h"
#include "plan.h"
#ifdef FT_HAVE_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#endif

// ----------------------------------------------------------------------------
// what a rank runs on: one fixed-size record of strings per rank ("" = not applicable)

enum { K_HOST, K_PCI, K_BUILD, K_DEVICE, K_DRIVER, K_RUNTIME, K_CUDNN, K_CUBLASLT, K_NCCL, K_MPI, K_COUNT };
static const char *const key_name[K_COUNT] = {"host", "pci bus", "finetune", "device", "driver", "cuda runtime",
                                              "cudnn", "cublaslt", "nccl", "mpi"};
// values that differ between ranks by nature: listed per rank, never a finding
static const int key_per_rank[K_COUNT] = {[K_HOST] = 1, [K_PCI] = 1};
#define VALUE_LEN 256
typedef struct { char v[K_COUNT][VALUE_LEN]; } rank_record;   // (a multiple of 4 bytes: gathered as int32)

static void cpu_device(char *out) {
    char model[128] = "unknown CPU", line[256];
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "model name", 10) == 0 && strchr(line, ':')) {
            snprintf(model, sizeof model, "%s", strchr(line, ':') + 2);
            model[strcspn(model, "\n")] = 0;
            break;
        }
    if (f) fclose(f);
    const double mem = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    snprintf(out, VALUE_LEN, "cpu: %s, %ld cores, %.1f GiB", model, sysconf(_SC_NPROCESSORS_ONLN), mem / 1073741824.0);
}

#ifdef FT_HAVE_CUDA
// The file the code at `sym` was loaded from ("?" when the loader does not say).
static const char *file_of(const void *sym) {
    Dl_info info;
    return sym && dladdr(sym, &info) && info.dli_fname && info.dli_fname[0] ? info.dli_fname : "?";
}

// the driver (libcuda, loaded by the runtime, not linked): its path from the loader's map
static const char *driver_file(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    struct link_map *lm = NULL;
    const char *name = h && dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name[0] ? lm->l_name : "not loaded";
    if (h) dlclose(h);   // (NOLOAD took a reference; the runtime keeps its own)
    return name;
}

// The GPU rows of this rank's record: the current device and the CUDA libraries. 0 / -1.
static int gpu_record(rank_record *r) {
    int dev = 0, drv = 0, rt = 0;
    struct cudaDeviceProp p;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess)
        return ft_error("preflight: the current CUDA device cannot be queried");
    snprintf(r->v[K_DEVICE], VALUE_LEN, "%.120s, %.1f GiB, sm_%d%d", p.name, p.totalGlobalMem / 1073741824.0, p.major, p.minor);
    if (cudaDeviceGetPCIBusId(r->v[K_PCI], VALUE_LEN, dev) != cudaSuccess) snprintf(r->v[K_PCI], VALUE_LEN, "?");
    if (cudaDriverGetVersion(&drv) != cudaSuccess) drv = 0;
    if (cudaRuntimeGetVersion(&rt) != cudaSuccess) rt = 0;
    snprintf(r->v[K_DRIVER], VALUE_LEN, "CUDA %d.%d, %s", drv / 1000, drv % 1000 / 10, driver_file());
    snprintf(r->v[K_RUNTIME], VALUE_LEN, "%d.%d, %s", rt / 1000, rt % 1000 / 10, file_of((const void *)cudaRuntimeGetVersion));
    // cuDNN is loaded at run time (src/attention_cudnn_graph.c); not there: the row says so
    size_t dnn = 0;
    const size_t lt = cublasLtGetVersion();   // (both major x 10000 + minor x 100 + patch)
    if (attn_engine_version(&dnn) == 0)
        snprintf(r->v[K_CUDNN], VALUE_LEN, "%zu.%zu.%zu, %s", dnn / 10000, dnn / 100 % 100, dnn % 100,
                 attn_engine_library());
    else {   // (not this job's error: the row says it, and the record is cleared for what follows)
        snprintf(r->v[K_CUDNN], VALUE_LEN, "not loaded (%.200s)", ft_error_message());
        ft_error_clear();
    }
    snprintf(r->v[K_CUBLASLT], VALUE_LEN, "%zu.%zu.%zu, %s", lt / 10000, lt / 100 % 100, lt % 100,
             file_of((const void *)cublasLtGetVersion));
    return 0;
}
#endif

// This rank's record on `be`, with the transports of `cc`. 0 / -1.
static int rank_record_fill(rank_record *r, const train_comms *cc, const backend *be, const char *build) {
    memset(r, 0, sizeof *r);
    const char *fake = ft_getenv("FT_TEST_HOST");   // test-only: the host name every rank reports
    if (fake) snprintf(r->v[K_HOST], VALUE_LEN, "%s", fake);
    else ft_hostname(r->v[K_HOST], VALUE_LEN);
    snprintf(r->v[K_BUILD], VALUE_LEN, "%s", build);
    // TEST-ONLY (tests/test_preflight.sh): FT_TEST_PREFLIGHT_FAKE_VERSION=R makes world rank R
    // report another build of finetune, as a node with an older install would
    const char *fv = ft_getenv("FT_TEST_PREFLIGHT_FAKE_VERSION");
    if (fv && atoi(fv) == cc->world->rank) snprintf(r->v[K_BUILD], VALUE_LEN, "%s-fake", build);
    if (strcmp(be->name, "cuda") != 0) cpu_device(r->v[K_DEVICE]);
#ifdef FT_HAVE_CUDA
    else TRY(gpu_record(r));
    if (strcmp(cc->world->name, "nccl") == 0) {
        int v = 0;
        char file[VALUE_LEN - 32];
        TRY(comm_nccl_library(&v, file, sizeof file));
        snprintf(r->v[K_NCCL], VALUE_LEN, "%d.%d.%d, %s", v / 10000, v / 100 % 100, v % 100, file);
    }
#endif
#ifdef FT_HAVE_MPI
    if (comm_mpi_launched()) {
        char v[VALUE_LEN - 64], file[VALUE_LEN - 64];
        comm_mpi_library(v, sizeof v, file, sizeof file);
        for (char *c = v; *c; c++) if (*c == '\t') *c = ' ';   // ("MPICH Version:\t4.0.2")
        snprintf(r->v[K_MPI], VALUE_LEN, "%.100s, %.140s", v, file);
    }
#endif
    return 0;
}

// Every rank's record to every rank (*all: malloc'ed, W records), through backend memory on
// the world group. 0 / -1 (agreed).
static int records_gather(const train_comms *cc, const backend *be, const rank_record *mine, rank_record **all,
                          int *agreed) {
    comm *w = cc->world;
    const size_t n = sizeof *mine, words = n / 4;
    void *send = be->alloc(n), *recv = be->alloc(n * (size_t)w->size);
    *all = ft_malloc(n * (size_t)w->size, "preflight records");
    int rc = send && recv && *all ? 0 : -1;
    if (rc == 0) rc = be->copy_h2d(send, mine, n);
    if ((rc = comm_agree(w, rc, agreed)) == 0) {
        rc = comm_all_gather(w, recv, send, words, ST_I32);
        if (rc == 0) rc = be->copy_d2h(*all, recv, n * (size_t)w->size);
        if (rc == 0) rc = be->synchronize();
        rc = comm_agree(w, rc, agreed);
    }
    be->free(send);
    be->free(recv);
    return rc;
}

// ----------------------------------------------------------------------------
// the report of the records (rank 0)

// The value most ranks share for key k (ties: the value of the lowest rank among them).
static int majority_rank(const rank_record *all, int W, int k) {
    int best = 0, best_n = 0;
    for (int r = 0; r < W; r++) {
        int n = 0;
        for (int q = 0; q < W; q++) n += strcmp(all[q].v[k], all[r].v[k]) == 0;
        if (n > best_n) best = r, best_n = n;
    }
    return best;
}

// Print the table: keys every rank agrees on once, the others per rank. Marks in odd[] the
// ranks whose value of a key that should agree differs from the majority's, with the reason
// appended to why[r].
static void records_print(const rank_record *all, int W, int *odd, char (*why)[512]) {
    int differs[K_COUNT] = {0}, hosts = 0, any_differs = 0;
    for (int r = 0; r < W; r++) {
        int first = 1;
        for (int q = 0; q < r && first; q++) first = strcmp(all[q].v[K_HOST], all[r].v[K_HOST]) != 0;
        hosts += first;
    }
    printf("preflight: %d rank(s) on %d host(s); shared by every rank:\n", W, hosts);
    for (int k = 0; k < K_COUNT; k++) {
        for (int r = 1; r < W; r++) differs[k] |= strcmp(all[r].v[k], all[0].v[k]) != 0;
        any_differs |= differs[k];
        if (!differs[k] && all[0].v[k][0]) printf("preflight:   %-13s %s\n", key_name[k], all[0].v[k]);
        if (!differs[k] || key_per_rank[k]) continue;
        const int m = majority_rank(all, W, k);
        for (int r = 0; r < W; r++) {
            if (strcmp(all[r].v[k], all[m].v[k]) == 0) continue;
            odd[r] = 1;
            size_t len = strlen(why[r]);
            snprintf(why[r] + len, 512 - len, "%s%s '%.60s' (rank %d and most others: '%.60s')", len ? "; " : "",
                     key_name[k], all[r].v[k], m, all[m].v[k]);
        }
    }
    if (!any_differs) return;
    printf("preflight: per rank:\n");
    for (int r = 0; r < W; r++) {
        printf("preflight:   rank %d:", r);
        for (int k = 0, n = 0; k < K_COUNT; k++)
            if (differs[k]) printf("%s %s %s", n++ ? ";" : "", key_name[k], all[r].v[k][0] ? all[r].v[k] : "-");
        printf("\n");
    }
}

// ----------------------------------------------------------------------------
// the timed collectives

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median(const double *v, int n) {
    double *s = malloc((size_t)n * sizeof *s);
    if (!s) return v[0];
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    const double m = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    free(s);
    return m;
}

enum { OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_ALL_REDUCE, OP_COUNT };
static const char *const op_name[OP_COUNT] = {"all-gather", "reduce-scatter", "all-reduce"};

// The buffers and sizes of the timed collectives.
typedef struct {
    const train_comms *cc;
    const backend *be;
    int S, R, W;                  // shard group size, replica group size, world size
    size_t numel;                 // one unit (a decoder layer, padded as the job pads it)
    size_t esz;                   // working dtype's bytes per element
    st_dtype dt;
    void *full, *copy, *shard;    // numel x esz (or more: the all-reduce's fp32 slice), numel x esz, numel / S x esz
    int slow_rank;                // FT_TEST_PREFLIGHT_SLOW_RANK (test-only), -1 = none
    double *t_op[OP_COUNT];       // (W x PREFLIGHT_ITERS) every rank's time of each iteration (0 elsewhere)
    double *t_own;                // (W x PREFLIGHT_ITERS) every rank's own part (its local copy of the unit)
} timing;

// One iteration of collective `op` (-1: none, the own part alone): the group aligned (a
// barrier), with `own` the rank's own part (a local copy of one unit: its device's memory
// bandwidth), then the collective, waited for on the host. Times into *own_s and *coll_s.
static int run_once(timing *x, int op, int own, double *own_s, double *coll_s) {
    comm *c = op == OP_ALL_REDUCE ? x->cc->replica : x->cc->shard;
    const size_t slice = x->numel / (size_t)x->S;
    if (op >= 0) TRY(comm_barrier(c));
    const double t0 = now_s();
    if (own) {
        TRY(x->be->copy_d2d(x->copy, x->full, x->numel * x->esz));
        TRY(x->be->synchronize());
        // TEST-ONLY (tests/test_preflight.sh): world rank FT_TEST_PREFLIGHT_SLOW_RANK takes 20 ms
        // more for its own part, as a rank on a throttled or shared device would
        if (x->slow_rank == x->cc->world->rank) nanosleep(&(struct timespec){0, 20000000L}, NULL);
    }
    const double t1 = now_s();
    if (op == OP_ALL_GATHER) TRY(comm_all_gather(c, x->full, x->shard, slice, x->dt));
    else if (op == OP_REDUCE_SCATTER) TRY(comm_reduce_scatter(c, x->shard, x->full, slice, x->dt));
    else if (op == OP_ALL_REDUCE) TRY(comm_all_reduce(c, x->full, slice, ST_F32));
    TRY(x->be->synchronize());
    *own_s = t1 - t0;
    *coll_s = now_s() - t1;
    return 0;
}

// Warm-up, then PREFLIGHT_ITERS timed iterations of every collective this grid has, the own
// part in the first one's (alone when there is none: one rank); then every rank's times to
// every rank (all-reduces of doubles over the world group). 0 / -1.
static int time_collectives(timing *x) {
    const int me = x->cc->world->rank, N = PREFLIGHT_ITERS;
    int own_op = x->S > 1 ? OP_ALL_GATHER : x->R > 1 ? OP_ALL_REDUCE : -1;
    for (int op = -1; op < OP_COUNT; op++) {
        if (op >= 0 && (op == OP_ALL_REDUCE ? x->R : x->S) < 2) continue;
        if (op < 0 && own_op >= 0) continue;
        for (int i = 0; i < PREFLIGHT_WARMUP + N; i++) {
            double own, coll;
            TRY(run_once(x, op, op == own_op, &own, &coll));
            if (i < PREFLIGHT_WARMUP) continue;
            if (op >= 0) x->t_op[op][me * N + i - PREFLIGHT_WARMUP] = coll;
            if (op == own_op) x->t_own[me * N + i - PREFLIGHT_WARMUP] = own;
        }
        if (op >= 0) TRY(comm_all_reduce_f64(x->cc->world, x->t_op[op], (size_t)x->W * N));
    }
    return comm_all_reduce_f64(x->cc->world, x->t_own, (size_t)x->W * N);
}

// The time of collective `op`: within a group, an iteration took what its last-arriving rank
// measured (the others include their wait for it: the least time of the group's ranks); its
// median over the iterations; the slowest group's.
static double op_seconds(const timing *x, int op) {
    const int n_in = op == OP_ALL_REDUCE ? x->R : x->S, N = PREFLIGHT_ITERS;
    double worst = 0, per_iter[PREFLIGHT_ITERS];
    for (int g = 0; g < x->W / n_in; g++) {
        for (int i = 0; i < N; i++) {
            double least = INFINITY;
            for (int j = 0; j < n_in; j++) {   // shard group g: ranks g S + j; replica group g: ranks g + j S
                const int r = op == OP_ALL_REDUCE ? g + j * x->S : g * x->S + j;
                least = fmin(least, x->t_op[op][r * N + i]);
            }
            per_iter[i] = least;
        }
        worst = fmax(worst, median(per_iter, N));
    }
    return worst;
}

// Print one collective's line; *busbw its bus bandwidth (bytes/s; 0 when skipped).
static void op_print(const timing *x, int op, double *busbw) {
    const int n = op == OP_ALL_REDUCE ? x->R : x->S;
    const char *group = op == OP_ALL_REDUCE ? "replica group" : "shard group";
    *busbw = 0;
    if (n < 2) {
        printf("preflight: %-14s skipped: %s", op_name[op], op == OP_ALL_REDUCE ? "no replica group (one shard group over every rank: no HSDP)"
                                                                  : "no shard group (every rank holds the whole model: --no_fsdp)");
        printf("\n");
        return;
    }
    // nccl-tests' definitions (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md): algbw = S / t
    // with S the size of the whole array (the gathered buffer; for the reduce-scatter its
    // input, count per rank x n); busbw = algbw x (n-1)/n for all-gather and reduce-scatter,
    // algbw x 2(n-1)/n for all-reduce: the bytes each rank's link carries, comparable across n
    const size_t slice = x->numel / (size_t)x->S;
    const double bytes = op == OP_ALL_REDUCE ? (double)slice * sizeof(float) : (double)x->numel * (double)x->esz;
    const double t = op_seconds(x, op), algbw = bytes / t;
    *busbw = algbw * (op == OP_ALL_REDUCE ? 2.0 : 1.0) * (n - 1) / n;
    printf("preflight: %-14s %s of %d ranks, %s %.2f MB (%s): median %.3f ms of %d (%d warm-up), algbw %.2f GB/s, "
           "busbw %.2f GB/s\n", op_name[op], group, n, op == OP_ALL_REDUCE ? "one unit's slice" : "one decoder layer",
           bytes / 1e6, op == OP_ALL_REDUCE ? "fp32" : st_dtype_name(x->dt), 1e3 * t, PREFLIGHT_ITERS, PREFLIGHT_WARMUP,
           algbw / 1e9, *busbw / 1e9);
}

// The own part (a local copy of one unit): each rank's fastest iteration (noise, a process
// sharing the core, only ever adds time: a device that is slow is slow in every iteration);
// a rank whose fastest exceeds the median of the ranks' by PREFLIGHT_SLOW_FACTOR (and
// PREFLIGHT_SLOW_FLOOR_S) stands out.
static void own_check(const timing *x, int *odd, char (*why)[512]) {
    const int N = PREFLIGHT_ITERS;
    double *best = malloc((size_t)x->W * sizeof *best);
    if (!best) return;
    for (int r = 0; r < x->W; r++) {
        best[r] = INFINITY;
        for (int i = 0; i < N; i++) best[r] = fmin(best[r], x->t_own[(size_t)r * N + i]);
    }
    const double m = median(best, x->W);
    printf("preflight: %-14s one decoder layer on each rank's device: fastest of %d, median over ranks %.3f ms "
           "(%.2f GB/s read + write)\n", "local copy", N, 1e3 * m, 2.0 * (double)x->numel * (double)x->esz / fmax(m, 1e-9) / 1e9);
    for (int r = 0; r < x->W; r++) {
        if (!(best[r] > PREFLIGHT_SLOW_FACTOR * m && best[r] - m > PREFLIGHT_SLOW_FLOOR_S)) continue;
        odd[r] = 1;
        size_t len = strlen(why[r]);
        snprintf(why[r] + len, 512 - len, "%sits own part (a local copy of one decoder layer) took %.3f ms at best, "
                 "%.1fx the median of all ranks (%.3f ms)", len ? "; " : "", 1e3 * best[r], best[r] / m, 1e3 * m);
    }
    free(best);
}

// The communication of one optimizer step of this job at the measured bus bandwidths: the
// planner's bytes per rank (plan.c: ring bytes sent, (n-1)/n of the whole array, or 2(n-1)/n
// for the all-reduce) over busbw, which is bytes sent per rank per second.
static void step_print(const plan *p, const double busbw[OP_COUNT]) {
    const double bytes[OP_COUNT] = {(double)p->all_gather_bytes, (double)p->reduce_scatter_bytes,
                                    (double)p->all_reduce_bytes};
    double total = 0;
    printf("preflight: per optimizer step of this job (the plan's bytes at these bandwidths, before any overlap):");
    for (int op = 0; op < OP_COUNT; op++) {
        if (bytes[op] <= 0 || busbw[op] <= 0) continue;
        total += bytes[op] / busbw[op];
        printf(" %s %.1f MB %.1f ms,", op_name[op], bytes[op] / 1e6, 1e3 * bytes[op] / busbw[op]);
    }
    printf(" %.1f ms of communication\n", 1e3 * total);
}

// ----------------------------------------------------------------------------
// the run

int preflight_wanted(const train_options *o, int W, int gpu) { return o->preflight || (gpu && W > 1); }

// The job's plan (its unit sizes and per-step bytes). 0 / -1.
static int job_plan(const train_options *o, int W, size_t esz, plan *p) {
    llama_config cfg;
    char path[FT_PATH_MAX];
    TRY(ft_path(path, sizeof path, "%s/config.json", o->model_dir));
    TRY(llama_config_load(&cfg, path));
    const plan_request req = train_plan_request(o, W, esz);
    return plan_compute(p, &cfg, &req);
}

// The buffers of the timed collectives; NULL members on failure (freed by timing_free).
static int timing_open(timing *x, const train_comms *cc, const backend *be, const plan *p) {
    memset(x, 0, sizeof *x);
    x->cc = cc, x->be = be, x->W = cc->world->size, x->S = cc->shard->size, x->R = cc->replica->size;
    x->dt = be->dtype, x->esz = st_dtype_size(be->dtype), x->numel = p->layer_numel;
    const char *slow = ft_getenv("FT_TEST_PREFLIGHT_SLOW_RANK");
    x->slow_rank = slow ? atoi(slow) : -1;
    const size_t full = x->numel * x->esz, ar = x->numel / (size_t)x->S * sizeof(float);
    x->full = be->alloc(full > ar ? full : ar);
    x->copy = be->alloc(full);
    x->shard = be->alloc(full / (size_t)x->S);
    for (int op = 0; op < OP_COUNT; op++) x->t_op[op] = ft_calloc((size_t)x->W * PREFLIGHT_ITERS, sizeof(double), "preflight");
    x->t_own = ft_calloc((size_t)x->W * PREFLIGHT_ITERS, sizeof(double), "preflight");
    if (!x->full || !x->copy || !x->shard || !x->t_op[0] || !x->t_op[1] || !x->t_op[2] || !x->t_own) return -1;
    TRY(be->zero(x->full, full > ar ? full : ar));   // (defined values: sums of zeros)
    TRY(be->zero(x->shard, full / (size_t)x->S));
    return be->synchronize();
}

static void timing_free(timing *x) {
    x->be->free(x->full);
    x->be->free(x->copy);
    x->be->free(x->shard);
    for (int op = 0; op < OP_COUNT; op++) free(x->t_op[op]);
    free(x->t_own);
}

// Rank 0: the stand-out lines and the verdict; the count to every rank. 0 / -1.
static int verdict(const train_comms *cc, const rank_record *all, int *odd, char (*why)[512], int *stood_out) {
    const int W = cc->world->size;
    double n = 0;
    if (cc->world->rank == 0) {
        for (int r = 0; r < W; r++) {
            if (!odd[r]) continue;
            n++;
            printf("preflight: rank %d (host %s) stands out: %s\n", r, all[r].v[K_HOST], why[r]);
        }
        if (n == 0) printf("preflight: nothing stands out\n");
        else printf("preflight: %d of %d rank(s) stand out (docs/cluster.md, \"Preflight\", says what to do)\n", (int)n, W);
        fflush(stdout);
    }
    TRY(comm_all_reduce_f64(cc->world, &n, 1));   // (0 on the other ranks: rank 0's count)
    *stood_out = (int)n;
    return 0;
}

int preflight_run(const train_options *o, const train_comms *cc, const backend *be, const char *build,
                  int *stood_out, int *failure_agreed) {
    *stood_out = 0;
    comm *w = cc->world;
    size_t saved[3][COMM_KIND_COUNT];   // the job's byte counters (the trainer's step figures) untouched
    memcpy(saved[0], w->bytes_sent, sizeof saved[0]);
    memcpy(saved[1], cc->shard->bytes_sent, sizeof saved[1]);
    memcpy(saved[2], cc->replica->bytes_sent, sizeof saved[2]);
    // each failure that may hit some ranks only is agreed (comm_agree) before the next
    // collective step, so every rank takes the same branch; past the first, rc != 0 everywhere
    rank_record mine, *all = NULL;
    plan *p = ft_calloc(1, sizeof *p, "preflight plan");
    int *odd = ft_calloc((size_t)w->size, sizeof *odd, "preflight");
    char (*why)[512] = ft_calloc((size_t)w->size, sizeof *why, "preflight");
    int rc = p && odd && why ? rank_record_fill(&mine, cc, be, build) : -1;
    if (rc == 0) rc = job_plan(o, w->size, st_dtype_size(be->dtype), p);
    rc = comm_agree(w, rc, failure_agreed);
    if (rc == 0) rc = records_gather(cc, be, &mine, &all, failure_agreed);
    if (rc == 0 && w->rank == 0) records_print(all, w->size, odd, why);
    timing x;
    memset(&x, 0, sizeof x);
    x.be = be;
    if (rc == 0) rc = comm_agree(w, timing_open(&x, cc, be, p), failure_agreed);
    if (rc == 0) rc = time_collectives(&x);   // (a failed collective is not agreed: main ends the job)
    if (rc == 0 && w->rank == 0) {
        double busbw[OP_COUNT];
        if (w->size == 1) printf("preflight: one rank: no collective to time\n");
        else {
            for (int op = 0; op < OP_COUNT; op++) op_print(&x, op, &busbw[op]);
            step_print(p, busbw);
        }
        own_check(&x, odd, why);
    }
    if (rc == 0) rc = verdict(cc, all, odd, why, stood_out);
    timing_free(&x);
    free(odd);
    free(why);
    free(all);
    free(p);
    memcpy(w->bytes_sent, saved[0], sizeof saved[0]);
    memcpy(cc->shard->bytes_sent, saved[1], sizeof saved[1]);
    memcpy(cc->replica->bytes_sent, saved[2], sizeof saved[2]);
    return rc;
}
