// train.h: the training job: options, the process grid it runs on, and the run (setup,
// loop, evaluation, logs; checkpoints through ckpt.h, sampling through sample.h).
#pragma once
#include <stdint.h>

#include "comm.h"
#include "config.h"
#include "fsdp.h"
#include "plan.h"

typedef struct {
    // job
    const char *model_dir;
    const char *data_dir;
    const char *out_dir;
    const char *resume;           // "" = fresh start, "latest", or a checkpoint directory
    int overwrite_out_dir;        // a fresh start may replace an earlier run in out_dir
    int eval_only;
    // batch
    int batch_size_per_device;
    int total_batch_size;         // sequences per optimizer step, all ranks together
    int seq_len;
    int pack;
    const char *pack_attention;   // with pack: "row" (attention over the whole row) or "per_game"
    int gradient_checkpointing;
    // optimizer and schedule
    double learning_rate;
    const char *lr_schedule;      // "linear", "cosine" or "constant"
    double warmup_fraction;
    double beta1, beta2, adam_eps, weight_decay, max_grad_norm;
    int max_steps;                // 0 = run --epochs
    int epochs;
    int seed;
    // evaluation, checkpoints, output
    int eval_every;               // 0 = only at the end
    int max_eval_docs;
    int save_every;               // 0 = only at the end
    int save_total_limit;         // keep the newest N checkpoints of this run's steps (0 = all)
    int stop_at_step;             // 0 = never; else save and stop after this step (preemption drill)
    const char *save_dtype;       // export dtype: "bf16" or "fp32"
    int sample_tokens;            // tokens to sample after training (0 = none)
    int sample_games;             // validation games to continue (prompts), default 1
    double sample_temperature;    // sampling: logits / temperature (0 = greedy), default SAMPLE_TEMPERATURE
    int sample_top_k;             // sampling: keep the k most likely ids (0 = all)
    double sample_top_p;          // sampling: nucleus of this probability (1 = all)
    double peak_tflops;           // for MFU; 0 = measure the backend's matmul rate
    double nccl_gib_per_comm;     // the plan's GPU memory per NCCL communicator (0 = PLAN_NCCL_COMM_BYTES)
    double fabric_intra_gbps;     // --dry_run's timeline: bus bandwidth within a node, GB/s (0 = default)
    double fabric_inter_gbps;     // and across nodes
    int dry_run_row_tokens;       // --dry_run's step-time estimates: tokens per row (0 = seq_len)
    int dry_run_gpus_per_node;    // the step-time estimates' GPUs per node (0 = the device's)
    const char *dry_run_device;   // --dry_run --auto: the device it plans for (plan_device_find)
    int nccl_max_ctas;            // most CTAs of one NCCL collective (ncclConfig_t maxCTAs; 0 = NCCL's choice)
    int profile;                  // print ms per op per step, by phase (src/profile.h)
    // sharding
    int no_fsdp;
    int dp_shard;                 // HSDP shard group size (0 = all ranks)
    int accumulate_grads_locally; // reduce gradients once per step instead of per micro-batch
    const char *reduce_dtype;     // "bf16" or "fp32": per-micro-batch gradients and their
                                  // reduce-scatters on a GPU (the CPU's are fp32 anyway)
    int keep_params_gathered;     // gather each unit once per step and keep it (fsdp keep_gathered)
    // LoRA (src/lora.h): rank 0 = full fine-tuning
    int lora_rank;
    double lora_alpha;
    const char *lora_targets;     // "q,k,v,o,gate,up,down" subset
    unsigned lora_target_mask;    // parsed from lora_targets by options_parse
    int merge_lora;               // also export <out_dir>/final_merged: the base with the adapters merged
    int allow_other_base;         // resume LoRA adapters on a base other than the one they were trained on
    int offload_optimizer;        // fp32 master + AdamW moments in host memory, AdamW on the host
    const char *optimizer_moments;   // "fp32" or "bf16": the dtype AdamW's exp_avg, exp_avg_sq are stored in
    // planning (src/plan.h): print the memory / step-time plan and exit, without training
    int dry_run;
    int preflight;                // run the preflight (src/preflight.h) alone and exit
    int world_size;               // --dry_run: ranks to plan for (0 = the launcher's)
    const char *device;           // "cpu" (fp32 storage) or "cuda" (bf16); the plan's dtype
    const char *attention;        // GPU attention: "cudnn" (default) or "native"
    int deterministic;            // bitwise-reproducible GPU attention backward (cuDNN's dP-workspace graph)
    int fp8;                      // --fp8: the decoder linears' forward GEMMs in FP8 (src/fp8_linear.h)
    int auto_plan;                // --auto: choose the batch and sharding flags not given (src/plan_auto.h)
    unsigned char given[128];     // given[i]: flag i of the flag table was on the command line
                                  // (options_given asks by name)
    // failure detection (src/watchdog.h; configured by main)
    double collective_timeout;    // seconds without progress before the job is aborted (0 = off)
} train_options;

// Shard group size S of the job at world size W: 1 with --no_fsdp, --dp_shard when set, else W.
int train_shard_size(const train_options *o, int world_size);
// The job's shape as the planner sees it (plan.h), at world size W with elem_bytes per
// storage element; plan_validate on it is the job's validation.
plan_request train_plan_request(const train_options *o, int world_size, size_t elem_bytes);

// Everything a rank needs to know about the job's process grid.
typedef struct {
    comm *world;                  // all ranks
    comm *shard;                  // the FSDP shard group of this rank
    comm *replica;                // the replica group of this rank
    int local_size;               // ranks on this rank's node (the host memory check; 0 = 1)
} train_comms;

// Run the job described by `o` (already validated by the CLI). Returns 0 on success (also
// when stopped by a signal after saving), -1 with ft_error set when this rank failed, or
// COMM_PEER_FAILED when another rank failed first (that rank reports the error).
// *failure_agreed = 1 when a failure was agreed by all ranks (they all return: no abort
// needed), 0 otherwise.
int train_run(const train_options *o, const train_comms *comms, int *failure_agreed);

// Compact one micro-batch: tokens, targets host (B, T) with targets -100 = ignored (every
// column after a row's last target is -100, as the loader pads). Copies the first T_used
// columns of each row into rows_tok, rows_tgt (B, T_used) and returns T_used = the longest
// row's real length (last non-ignored target + 1, at least 1) rounded up to the backend's
// bucket (backend_seq_len(be, len, T)). The padded columns keep their -100 targets, so with
// causal attention the losses and gradients of the real tokens do not depend on T_used.
int train_micro_batch_rows(const backend *be, const int32_t *tokens, const int32_t *targets, int B, int T,
                           int32_t *rows_tok, int32_t *rows_tgt);
