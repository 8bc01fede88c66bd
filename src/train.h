// train.h: the training job (loop, evaluation, logs, checkpoints, export, sampling).
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
    int eval_only;
    // batch
    int batch_size_per_device;
    int total_batch_size;         // sequences per optimizer step, all ranks together
    int seq_len;
    int pack;
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
    int stop_at_step;             // 0 = never; else save and stop after this step (preemption drill)
    const char *save_dtype;       // export dtype: "bf16" or "fp32"
    int sample_tokens;            // tokens to sample after training (0 = none)
    int sample_games;             // validation games to continue (prompts), default 1
    double peak_tflops;           // for MFU; 0 = measure the backend's matmul rate
    // sharding
    int no_fsdp;
    int dp_shard;                 // HSDP shard group size (0 = all ranks)
    int accumulate_grads_locally; // reduce gradients once per step instead of per micro-batch
    // planning (src/plan.h): print the memory / step-time plan and exit, without training
    int dry_run;
    int world_size;               // --dry_run: ranks to plan for (0 = the launcher's)
    const char *device;           // "cpu" (fp32 storage) or "cuda" (bf16); the plan's dtype
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
} train_comms;

// Run the job described by `o` (already validated by the CLI). Returns 0 on success (also
// when stopped by a signal after saving), -1 with ft_error set when this rank failed, or
// TRAIN_PEER_FAILED when another rank failed first (that rank reports the error).
#define TRAIN_PEER_FAILED (-2)
// 1 when the failure was agreed by all ranks (they all return; no abort needed).
int train_failure_agreed(void);
int train_run(const train_options *o, const train_comms *comms);

// Trainer state saved with every checkpoint (trainer_state.json).
typedef struct {
    int step;                     // optimizer steps completed
    int epoch;                    // epoch of the next row
    uint64_t row;                 // next row within that epoch
    int seed, total_batch_size, seq_len, pack, total_steps;
    long long n_params;
} trainer_state;

// ----------------------------------------------------------------------------
// checkpoints (ckpt.c)

// Save a resumable checkpoint <out_dir>/checkpoints/step_%08d (fp32 master weights as a
// Hugging Face model.safetensors, AdamW moments in optimizer.safetensors, config.json and
// trainer_state.json), written to a temporary directory, fsync'ed and renamed into place;
// then <out_dir>/checkpoints/latest is replaced atomically. Collective over the shard group
// (gathers); rank 0 of the world writes. 0 / -1.
int ckpt_save(const char *out_dir, const char *model_dir, fsdp_state *s, const trainer_state *ts,
              int world_rank);

// Resolve --resume ("latest" or a path) to a checkpoint directory in `dir` (size n). 0 / -1.
int ckpt_resolve(const char *out_dir, const char *resume, char *dir, size_t n);

// Load the weights of the Hugging Face checkpoint directory `dir` (pretrained, or a
// checkpoint of ours) into the master and working parameters of `s`: validated against
// s->layout first, then one unit at a time, every rank reading its slices through the mmap.
// The moments are left alone. 0 / -1.
int ckpt_load_weights(fsdp_state *s, const char *dir);

// Load a checkpoint saved by ckpt_save into `s` and `ts`, checking that it fits this run
// (same model shapes, seed, total batch, sequence length and packing). 0 / -1.
int ckpt_load(const char *dir, fsdp_state *s, const trainer_state *expect, trainer_state *ts);

// Export the current weights in Hugging Face layout to <dir> (config.json with the dtype,
// model.safetensors in `dtype` ("bf16" or "fp32"), tokenizer files copied from model_dir),
// atomically (temporary directory + rename). Collective over the shard group. 0 / -1.
int ckpt_export_hf(const char *dir, const char *model_dir, fsdp_state *s, const char *dtype,
                   int world_rank);

// mkdir -p; 0 or -1 with ft_error naming the path.
int ckpt_mkdirs(const char *path);

// ----------------------------------------------------------------------------
// sampling (sample.c)

// Print a continuation of the first `prompt_tokens` tokens of validation game `game` (the
// caller checks it exists in val_000.bin): the
// model samples `n_tokens` tokens (temperature 0.8, seeded by seed and game) with full
// recomputation per token. Collective (FSDP gathers); rank 0 prints it and appends it to
// OUT/samples.jsonl (scripts/legal_moves.py checks the moves with Stockfish). 0 / -1.
int sample_continuation(const llama_config *cfg, fsdp_state *s, mem_tracker *mem,
                        const char *model_dir, const char *data_dir, const char *out_dir, int game,
                        int prompt_tokens, int n_tokens, uint64_t seed, int world_rank);
