// plan_auto.h: --auto, the choice of a job's batch and sharding flags (docs/planning.md).
//
// For the job's model, world size W, --total_batch_size, --seq_len and the rest of its flags,
// --auto plans every combination of --batch_size_per_device B (B x W dividing the total
// batch), --gradient_checkpointing, --keep_params_gathered, --dp_shard S (S dividing W),
// --accumulate_grads_locally and --offload_optimizer that the user did not give, keeps those
// that fit the device by the test a GPU run makes at startup (plan_fits), and takes the one the
// step-time estimate gives the most tokens/s per GPU (plan_auto_estimate: one function, so that
// another estimator can replace it). Ties go to the plan with fewer bytes. The choice depends only
// on the request, so every rank of a job makes the same one.
//
// The device: the one --dry_run's fit line uses (PLAN_FIT_DEVICE, an H100 80GB), or in a dry
// run the one --dry_run_device names (A100, H100, H200: plan_devices), whose memory
// FT_TEST_DEVICE_MIB replaces (test-only). A real GPU run plans for the H100 80GB whatever GPU
// it runs on: on a larger GPU the choice leaves memory unused, on a smaller one the startup
// check refuses it.
// On the CPU backend (fp32 storage, elem_bytes 4) the buffers are host memory, which --auto
// does not test (no plan is refused for memory), the candidates are ranked by the same
// estimate on that GPU's rates (the only time model there is), and --offload_optimizer is
// not chosen (it moves the optimizer state from host memory to host memory).
#pragma once
#include <stdio.h>

#include "plan.h"
#include "train.h"

// The flags --auto may choose; a field is 1 when the command line gave that flag (it stays).
typedef struct {
    int batch, checkpointing, keep_gathered, shard, local, offload;
} plan_auto_fixed;

// One plan as --auto weighed it.
typedef struct {
    plan_request req;
    size_t total;               // planned device bytes per rank (plan.total)
    size_t budget;              // the largest total that fits the device (plan_device_budget)
    int fits;                   // plan_fits on the device, or 1 when memory is not tested (CPU)
    double tokens_per_s;        // per GPU, the estimate's (plan_auto_estimate)
    double mfu;                 // the estimate's MFU
    double step_s;              // the estimate's step time
} plan_auto_candidate;

typedef struct {
    plan_device device;         // what the estimate and the fit test use
    int memory_tested;          // 1: GPU storage (elem_bytes 2), plans must fit; 0: the CPU
    plan_auto_fixed fixed;
    int tried, valid, fitting;  // combinations planned, valid (plan_validate), fitting
    plan_auto_candidate best;              // the fastest that fits (ties: the fewest bytes)
    plan_auto_candidate runner_up;         // the fastest that fits and is slower than best
    int ties;                              // other plans that fit, as fast as best (more bytes)
    plan_auto_candidate blocked;           // the fastest that does not fit, when it beats best
    plan_auto_candidate smallest;          // the valid plan of fewest bytes (the error's figure)
    plan_auto_candidate given;             // the job as its flags say without --auto
    int has_runner_up, has_blocked, given_valid;
} plan_auto_result;

// The device --auto plans for, into *d: `real` when not NULL (the probed GPU), else the one of
// plan_devices `name` picks (plan_device_find; NULL: PLAN_FIT_DEVICE), with FT_TEST_DEVICE_MIB's
// memory when that is set (a positive number of MiB). *memory_tested = 1 for GPU storage
// (elem_bytes 2). 0, or -1 with ft_error naming --dry_run_device (no such device) or
// FT_TEST_DEVICE_MIB (not a positive number).
int plan_auto_device(size_t elem_bytes, const char *name, const plan_device *real, plan_device *d,
                     int *memory_tested);

// THE estimate --auto ranks by: tokens/s per GPU, MFU and step time of plan p on d, into *c
// (the timeline, plan_tl_step_seconds of src/plan_timeline.c, with the per-phase sum of
// plan_estimate_step_time only where the timeline cannot price p; swap the estimator here only).
void plan_auto_estimate(const plan *p, const plan_device *d, plan_auto_candidate *c);

// Choose among the plans of `base` with the flags not in *fixed varied (see above); *res
// holds the choice (res->best), the runner-up (slower: plans as fast are counted in ties), the
// fastest plan that does not fit, the smallest and the counts. 0; -1 with ft_error when no combination is valid (the first
// validation error, or no B dividing the total batch) or none fits (naming the smallest plan's
// bytes, the budget and the flags held fixed).
int plan_auto_choose(const llama_config *cfg, const plan_request *base, const plan_auto_fixed *fixed,
                     const plan_device *d, int memory_tested, plan_auto_result *res);

// The flags of plan request r that --auto sets, as a command line would give them, into buf.
void plan_auto_describe(const plan_request *r, char *buf, size_t n);

// Print the choice: the device, the counts, the chosen plan, the runner-up, the fastest plan
// that does not fit (the binding reason), the job without --auto, the flags held fixed.
void plan_auto_print(FILE *out, const plan_auto_result *res);

// A real run's --auto (not --dry_run): one line naming the estimate-only flags of o it ranked
// the plans with (--fabric_intra_gbps, --fabric_inter_gbps, --dry_run_row_tokens,
// --dry_run_gpus_per_node) and their values, or nothing when none was given.
void plan_auto_print_estimate_flags(FILE *out, const train_options *o);

// --auto for job `o` at world size W with elem_bytes per storage element: reads the model's
// config.json, chooses (plan_auto_choose, the flags given on the command line fixed) and
// writes the chosen flags into *o, before anything is planned or allocated from them. 0 / -1.
// real: the GPU the job runs on (a real run: launch.c's probe, the smallest of the ranks'
// memories, the rates of the table's device of that family), or NULL (--dry_run: the table's
// --dry_run_device, the H100 80GB by default). FT_TEST_DEVICE_MIB replaces either's memory.
int plan_auto_apply(train_options *o, int world_size, size_t elem_bytes, const plan_device *real,
                    plan_auto_result *res);
