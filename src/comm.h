// comm.h: collectives over flat buffers, one interface for every transport.
//
// Implementations: "single" (one process: collectives are copies), "mpi" (CPU ranks) and
// "nccl" (GPU ranks, src/comm_nccl.c). A comm is a group of ranks; the FSDP state holds two of them
// (the shard group and the replica group, for HSDP). Buffers are backend memory for the
// data collectives and host memory for comm_all_reduce_f64 (losses, norms, counts).
//
// Every collective is collective: all ranks of the group call it in the same order with
// the same count and dtype. Byte counters record what this rank SENDS under a ring
// algorithm: all_gather and reduce_scatter (N-1) x count x size, all_reduce twice that,
// broadcast count x size from the root, so tests can compare with the formulas.
//
// Every wait of the mpi and nccl transports (a collective, comm_wait, a barrier) is bounded
// by --collective_timeout through src/watchdog.h: a peer that stops making progress ends
// the job with one line naming this rank, the phase and the operation.
#pragma once
#include <stddef.h>

#include "backend.h"

typedef enum { COMM_ALL_GATHER, COMM_REDUCE_SCATTER, COMM_ALL_REDUCE, COMM_BROADCAST, COMM_KIND_COUNT } comm_kind;

typedef struct comm comm;
struct comm {
    const char *name;        // "single", "mpi", ...
    const char *label;       // the group's role in messages: "shard group", ...; NULL = "world"
    int rank, size;          // within this group
    const backend *be;       // where data buffers live
    void *impl;              // transport state
    size_t bytes_sent[COMM_KIND_COUNT];

    // recv (size * count) = concatenation of every rank's send (count), rank order
    int (*all_gather)(comm *c, void *recv, const void *send, size_t count, st_dtype dt);
    // non-blocking all_gather: starts the transfer, *req identifies it for wait(); recv and
    // send must stay untouched until wait returns (the single transport completes at once)
    int (*iall_gather)(comm *c, void *recv, const void *send, size_t count, st_dtype dt, void **req);
    int (*wait)(comm *c, void *req);
    // recv (count) = sum over ranks of send[rank * count .. (rank + 1) * count)
    int (*reduce_scatter)(comm *c, void *recv, const void *send, size_t count, st_dtype dt);
    // non-blocking reduce_scatter, completed by wait() like iall_gather
    int (*ireduce_scatter)(comm *c, void *recv, const void *send, size_t count, st_dtype dt, void **req);
    // buf (count) = sum over ranks, in place
    int (*all_reduce)(comm *c, void *buf, size_t count, st_dtype dt);
    // non-blocking all_reduce, completed by wait() like iall_gather: buf must stay untouched
    // (neither read nor written) until wait returns; the nccl transport runs it on the
    // group's own stream after the compute issued so far
    int (*iall_reduce)(comm *c, void *buf, size_t count, st_dtype dt, void **req);
    // host doubles summed over ranks, in place (exact same result on every rank)
    int (*all_reduce_f64)(comm *c, double *buf, size_t count);
    // buf (bytes) from `root` to every rank (host or backend memory as the transport allows)
    int (*broadcast)(comm *c, void *buf, size_t bytes, int root);
    int (*barrier)(comm *c);
    void (*destroy)(comm *c);
};

// A one-rank group over backend `be`. Always succeeds.
void comm_init_single(comm *c, const backend *be);

// Counting wrappers: call these, not the function pointers.
int comm_all_gather(comm *c, void *recv, const void *send, size_t count, st_dtype dt);
int comm_iall_gather(comm *c, void *recv, const void *send, size_t count, st_dtype dt, void **req);
int comm_wait(comm *c, void *req);
int comm_reduce_scatter(comm *c, void *recv, const void *send, size_t count, st_dtype dt);
int comm_ireduce_scatter(comm *c, void *recv, const void *send, size_t count, st_dtype dt, void **req);
int comm_all_reduce(comm *c, void *buf, size_t count, st_dtype dt);
int comm_iall_reduce(comm *c, void *buf, size_t count, st_dtype dt, void **req);
int comm_all_reduce_f64(comm *c, double *buf, size_t count);
int comm_broadcast(comm *c, void *buf, size_t bytes, int root);
int comm_barrier(comm *c);
void comm_destroy(comm *c);

// Agree on a status where a failure may hit some ranks only (setup, loading, checkpoint
// writes); collective over `c`. 0 when every rank's rc is 0. Otherwise the lowest failing rank
// returns -1 (its ft_error message is the one printed) and the others COMM_PEER_FAILED with
// ft_error "rank N failed", and *agreed is set to 1: every rank knows, none has to abort the
// job. A one-rank group returns rc unchanged. -1 when the agreement itself fails.
#define COMM_PEER_FAILED (-2)
int comm_agree(comm *c, int rc, int *agreed);

// ----------------------------------------------------------------------------
// MPI transport (src/comm_mpi.c, built only when MPICH is found: `make MPI=1`)

// 1 if this process was started by an MPI/PMI launcher (mpirun, srun --mpi=pmi2).
int comm_mpi_launched(void);
// MPI_Init and the world group. 0 / -1.
int comm_mpi_init_world(comm *world, const backend *be, int *argc, char ***argv);
// Sub-group of `parent`: ranks with the same color, ordered by key (collective). 0 / -1.
int comm_mpi_split(comm *parent, int color, int key, comm *out);
// This rank's index among the ranks of its node, and their number. 0 / -1.
int comm_mpi_local_info(int *local_rank, int *local_size);
void comm_mpi_abort(int code);
// The MPI library this process runs on: the first line of MPI_Get_library_version into
// version (n bytes) and the file its code was loaded from (dladdr) into file (fn bytes).
// Callable before MPI_Init; never fails ("unknown" / "?" when the library does not say).
void comm_mpi_library(char *version, size_t n, char *file, size_t fn);
void comm_mpi_finalize(void);

// ----------------------------------------------------------------------------
// NCCL transport (src/comm_nccl.c, built with the CUDA toolkit)

// Load NCCL (it is not linked): the functions linked into the executable when there are any
// (the emulated build's), else the file FT_NCCL_LIBRARY names, else libnccl.so.2 from the
// library path, else the one of the nvidia-nccl-cu12/cu13 wheel of the Python on PATH.
// Every function below loads it first. 0, or -1 with one line naming what is missing.
int comm_nccl_load(void);
// Bound the thread blocks (CTAs) one collective of each NCCL communicator created after this
// call may take (comm_nccl_init, comm_nccl_split, the reduce-scatter lane): their
// ncclConfig_t gets maxCTAs = max_ctas and minCTAs = 1 (NCCL's own minimum); 0 = no config,
// NCCL's defaults. NCCL_MAX_CTAS / NCCL_MIN_CTAS in the environment override it (NCCL's rule).
// Every NCCL finetune loads (2.18+) has these fields (2.17+).
//
// The default, COMM_NCCL_MAX_CTAS (--nccl_max_ctas): 16. Unbounded, NCCL's tuner gives a large
// collective up to its channel limit (MAXCHANNELS, 32 or more), one CTA per channel, each CTA
// holding an SM while it runs; here up to three collectives run beside the GEMMs at once (a
// layer's all-gather, the reduce-scatter lane, a unit's all-reduce across replicas), so up to
// 96 of an H100's 132 SMs; at 16, at most 48 (and 32 in the common two-lane overlap). 16
// channels still fill the links: across nodes NCCL drives a NIC with 2 channels by default
// (NCCL_NCHANNELS_PER_NET_PEER), 16 for the 8 NICs of an H100 node; over NVLink a
// Simple-protocol channel moves roughly 20-25 GB/s, so 16 carry about the 350-370 GB/s bus
// bandwidth nccl-tests reports for a ring all-gather on 8 H100 SXM. An estimate, not a
// measurement: a GPU run should compare 16 with 8 and 0. (Megatron-LM lets a YAML file set
// these fields per process group, --nccl-communicator-config-path, and sets none itself;
// torchtitan keeps NCCL's defaults.)
#define COMM_NCCL_MAX_CTAS 16
void comm_nccl_set_max_ctas(int max_ctas);
// Choose how the communicators of this process run their collectives (call before
// comm_nccl_init). Two lanes (*one_lane = 0): each communicator has its own stream and the
// FSDP shard group a reduce-scatter lane, so collectives of several communicators are in
// flight at once, which NCCL orders safely only from 2.26 on (NCCL_LAUNCH_ORDER_IMPLICIT,
// comm_nccl.c). One lane (*one_lane = 1; NCCL 2.18-2.25, or NCCL_LAUNCH_ORDER_IMPLICIT=0 in
// the environment): every communicator enqueues on one shared stream, in the host's issue
// order (the same on every rank), and reduce-scatters stay on the shard group's own
// communicator (comm_nccl_add_reduce_scatter_lane does nothing). Loads NCCL first. 0 / -1.
int comm_nccl_choose_lanes(int *one_lane);
// Run this process in the one-lane mode although its own NCCL could run two: every rank of a
// job must run the same mode (a two-lane rank's reduce-scatter lane would wait forever for the
// one-lane ranks' split), so when any rank chose one lane, all take it (src/launch.c agrees
// over the world before the first communicator). Call before comm_nccl_init.
void comm_nccl_use_one_lane(void);
// "NCCL 2.19.3 (libnccl.so.2)": the loaded library, for messages ("NCCL (not loaded)" before).
const char *comm_nccl_describe(void);
// The Python whose nvidia-nccl wheel the loaded NCCL came from (no libnccl.so.2 on the library
// path: comm_nccl_load looked beside the Python on PATH, src/wheel_lib.h), else NULL.
const char *comm_nccl_wheel_python(void);
// A fresh NCCL unique id (n must be 128, sizeof(ncclUniqueId)); works without a GPU. 0 / -1.
int comm_nccl_unique_id(void *id, size_t n);
// Join the NCCL group `id` as rank/size on CUDA device `device` (-1 = the current device;
// collective). 0 / -1.
int comm_nccl_init(comm *c, const backend *be, int rank, int size, const void *id, int device);
// Sub-group of an NCCL group: ranks with the same color, ordered by key (ncclCommSplit;
// collective over `parent`). 0 / -1.
int comm_nccl_split(comm *parent, int color, int key, comm *out);
// Give NCCL group `c` a second communicator over the same ranks, with its own stream, for its
// reduce-scatters, so they overlap its all-gathers (ncclCommSplit; collective over `c`;
// destroyed with `c`). The FSDP shard group gets one. In the one-lane mode
// (comm_nccl_choose_lanes) nothing is created and *created = 0. 0 / -1.
int comm_nccl_add_reduce_scatter_lane(comm *c, int *created);
// The NCCL this process loaded (loading it first): its NCCL_VERSION_CODE (2.26.2 = 22602)
// and the file its functions came from (dladdr: libnccl.so's path, FT_NCCL_LIBRARY's, or the
// executable when NCCL is linked in) into file (n bytes). 0, or -1 as comm_nccl_load.
int comm_nccl_library(int *version, char *file, size_t n);
