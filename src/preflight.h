// preflight.h: what every rank of a job runs on, and how fast its collectives are, checked
// before step 1 (docs/cluster.md, "Preflight").
//
// Every rank reports its host, device (name, memory, compute capability, PCI bus id), the
// versions of the driver, CUDA runtime, cuDNN, cuBLASLt, NCCL and MPI it loaded and the files
// they came from; rank 0 prints them as one table (a value shared by every rank once, what
// differs per rank). Then one unit of this job's model (a decoder layer, in the working
// dtype) is all-gathered and reduce-scattered over the shard group and its slice (fp32, as
// fsdp.c sums it) all-reduced over the replica group, on the job's own communicators: a few
// warm-up iterations, then the median of the timed ones, printed as algorithm and bus
// bandwidth (nccl-tests' definitions) with the communication time per optimizer step that
// they imply for this job (the planner's per-step bytes, src/plan.c). A rank whose versions,
// device or own timing stand out from the others is named in one line.
//
// Runs before step 1 of every multi-rank GPU job, and alone with --preflight (any device).
#pragma once
#include "backend.h"
#include "train.h"

// The tunables of a run (tests may shrink them).
#define PREFLIGHT_WARMUP 5
#define PREFLIGHT_ITERS 20
// A rank stands out when its own timing exceeds the median of all ranks by this factor ...
#define PREFLIGHT_SLOW_FACTOR 1.5
// ... and by at least this many seconds (timer noise on small units is not a finding)
#define PREFLIGHT_SLOW_FLOOR_S 1e-4

// Whether job `o` at world size W on a GPU (gpu = 1) runs the preflight: always with
// --preflight, else before step 1 of every multi-rank GPU job.
int preflight_wanted(const train_options *o, int world_size, int gpu);

// Run the preflight of job `o` on the job's groups `cc` (collective over cc->world: every
// rank calls it), on backend `be` (the data plane's device); `build` names this binary
// (its --version revision). Rank 0 prints the report on stdout. *stood_out (every rank):
// the number of ranks named as standing out. 0, or -1 with ft_error; a failure of some ranks
// is agreed where it can be (comm_agree: -1 on the lowest failing rank, COMM_PEER_FAILED on
// the others, *failure_agreed set to 1), as train_run's.
int preflight_run(const train_options *o, const train_comms *cc, const backend *be, const char *build,
                  int *stood_out, int *failure_agreed);
