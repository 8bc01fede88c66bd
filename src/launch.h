// launch.h: the process grid a job runs on. Detects the launcher (mpirun / srun with MPI,
// srun with Slurm's PMI2 and no MPI, or a single process), brings up the control plane (MPI
// groups or one process), splits ranks into shard and replica groups, opens the device of
// this rank and, for GPU ranks, the data plane (NCCL groups), and tears it all down.
#pragma once
#include "bootstrap.h"
#include "comm.h"
#include "plan_auto.h"
#include "train.h"

typedef struct {
    const backend *cpu;             // the control plane's backend (host memory)
    const backend *be;              // this rank's device (NULL until opened)
    comm world, shard, replica;     // control plane: MPI groups, or one process (world)
    comm dworld, dshard, dreplica;  // data plane of GPU ranks: NCCL groups, or one process
    train_comms cc;                 // what the job runs on (control or data plane groups)
    boot_info boot;                 // PMI2's view (or one process)
    const char *launcher;           // for the bootstrap line
    int W, rank, local_rank, local_size;
    int gpu_index;                // this rank's place among the ranks of its node that see the same
                                  // GPUs (device_select; = local_rank without MPI): picks its device
    int mpi, pmi2_open, pmi2_ranks; // MPI is up; PMI2 is up; PMI2 without MPI started > 1 rank
    int mpi_split, nccl;            // which groups exist (to destroy): MPI splits; dworld is NCCL
    int dshard_own, dreplica_own;   // dshard / dreplica were created (not the world group)
    int n_nccl;                     // NCCL communicators created (the bootstrap line; the plan's count)
    size_t nccl_bytes;              // device memory they took (cudaMemGetInfo before - after; bootstrap line)
    size_t nccl_comm_bytes;         // the plan's assumption per communicator (the bootstrap line)
    int nccl_max_ctas;              // --nccl_max_ctas their collectives were bounded to (0 = NCCL's choice)
    int nccl_setup;                 // the NCCL id was shared: a later setup failure is not agreed
    int ready;                      // launch_open succeeded
    int auto_done;                  // --auto chose the job's flags (auto_choice: what and why)
    plan_auto_result auto_choice;
} launch;

// Rank and world size from the launcher's environment (PMI_RANK / SLURM_PROCID / OMPI_...),
// before anything is up: flag errors print once; --dry_run plans for the launcher's ranks.
int launch_env_rank(void);
int launch_env_world_size(void);
// The launchers this binary was built with, in one line (--version): MPI, Slurm PMI2.
const char *launch_build_description(void);

// Bring up the grid of the job `o` (the MPI runtime may rewrite argc/argv); with --auto the
// flags it chooses are written into *o first (plan_auto_apply, every rank alike). Setup failures
// are agreed over the control plane: 0, or -1 on the lowest failing rank (with ft_error to
// print) and COMM_PEER_FAILED on the others. Call launch_close in every case.
int launch_open(launch *L, train_options *o, int *argc, char ***argv);

// rank 0: one line naming the launcher, the grid and the device.
void launch_print(const launch *L);

// End every rank now, without teardown (the watchdog's way out, src/watchdog.h): MPI_Abort
// under MPI (the launcher kills the other ranks, stopped ones included), else _exit(1).
// L may be NULL (before the grid exists). Does not return.
void launch_abort(const launch *L) __attribute__((noreturn));

// Tear down after the job returned rc: a failure this rank saw but not every rank knows
// (rc == -1, several ranks, !failure_agreed) would leave the others waiting in a collective,
// so it ends the job at once (launch_abort: MPI_Abort, or _exit(1) under PMI2, before any
// communicator is destroyed, which would wait for them), and so does a setup failure once the
// NCCL communicators were being created (the others wait in NCCL's init or split, which have
// no deadline); otherwise the groups are destroyed, the device closed and the runtime finalized.
void launch_close(launch *L, int rc, int failure_agreed);
