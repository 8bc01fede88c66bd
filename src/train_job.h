// train_job.h: the training job's state, shared by train.c (setup, the loop, checkpoints,
// sampling) and train_log.c (what the job prints and appends to metrics.jsonl, and the watch
// on --out_dir). Internal to those two files.
#pragma once
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "loader.h"
#include "lora.h"
#include "sample.h"
#include "schedule.h"
#include "train.h"

// ----------------------------------------------------------------------------
// the job state

typedef struct {
    const train_options *o;
    const train_comms *cc;
    int rank, world;              // data-parallel rank / world (every rank is one)
    llama_config cfg;
    const backend *be;
    mem_tracker mem;
    param_layout layout;
    model m;
    fsdp_state fs;                // the model's parameters (with LoRA: the frozen base)
    unit_provider prov;
    int lora;                     // --lora_rank > 0
    lora_layout ll;               // LoRA: the adapters' layout
    fsdp_state afs;               // LoRA: the adapters' sharded state
    unit_provider aprov;          // LoRA: its provider
    fsdp_state *opt;              // the trained state: &fs, or &afs with LoRA
    loader train, val;
    sampler sampler;              // --sample_tokens: continues validation games after training
    schedule sched;               // learning rate and AdamW parameters per step
    int accum;                    // micro-batches per optimizer step on this rank
    int total_steps, steps_per_epoch;
    int32_t *tokens, *targets;    // (accum, B, T) this rank's rows of the current step
    int32_t *rows_tok, *rows_tgt; // (B, T_used) one micro-batch, compacted
    FILE *metrics;                // rank 0: <out_dir>/metrics.jsonl (check_out_dir: still at that path)
    long metrics_ok;              // its size up to the last complete record (-1: unknown)
    int metrics_failed;           // a write to it failed (warned once)
    int metrics_records;          // records written (FT_TEST_METRICS_TEAR)
    double peak_flops;
    int *failure_agreed;          // train_run's: set when a failure was agreed by every rank
    // the last step's checkpoint failed on some rank (agreed): its status (-1 on the failing
    // rank, COMM_PEER_FAILED elsewhere) and message; job_finish still exports, then fails
    int final_save_rc;
    char final_save_error[1024];
    int exported;                 // job_finish wrote the export (final/)
    // this run, for the closing summary: its start, the seconds and target tokens of its
    // optimizer steps (evaluations and checkpoints not counted), its first and last val loss
    char start_dir[FT_PATH_MAX];  // --resume's checkpoint directory, resolved once; "" = fresh
    uint64_t base_fp;             // LoRA: hf_checkpoint_fingerprint of model_dir (0 without LoRA)
    uint64_t data_fp;             // loader_fingerprint of the training shards (0: --eval_only)
    int test_stop_step;           // FT_TEST_STOP_AT_STEP on world rank 1, else -1 (test-only: train_step)
    int run_start;
    long plans_after_step1[2];    // attention plans built and evicted when this run's first step ended
    double run_secs, run_tokens, val_first, val_last;
    int n_evals;
    int out_lock, out_created;    // rank 0: fs_lock_dir's descriptor of --out_dir/.lock (-1: none; check_out_dir)
    int out_dir_fd;               // rank 0: --out_dir itself, opened once locked (-1: none; check_out_dir)
} job;

static inline int is_main(const job *j) { return j->rank == 0; }
// --pack --pack_attention per_game: each packed game attends to itself only (model_set_segments)
static inline int pack_per_game(const train_options *o) { return o->pack && strcmp(o->pack_attention, "per_game") == 0; }

// Collective status check where a failure may hit some ranks only (comm.h).
static inline int agree(job *j, int rc) { return comm_agree(j->cc->world, rc, j->failure_agreed); }

// One optimizer step's figures (train_step), for its log line and record.
typedef struct { double loss, norm, lr, tokens, avg_T, secs; size_t gather_bytes, rs_bytes, ar_bytes; } step_stats;

// ----------------------------------------------------------------------------
// train_log.c: the job's output

// The job's opening lines (rank 0): model, data, grid, optimizer, LoRA.
void job_print_summary(job *j);
// Rank 0: the validation loss line and its metrics.jsonl record.
void job_log_eval(job *j, int step, double loss, double ntok, double secs);
// Rank 0: the step's line and its metrics.jsonl record (avg_secs: for the ETA).
void job_log_step(job *j, int step, const step_stats *st, double avg_secs);
// Rank 0: the closing lines of a finished run / the tracker's peak memory per category.
void job_print_run_summary(const job *j, int step);
void job_print_peak_memory(const job *j);
// Open rank 0's metrics.jsonl (rewound to `start` on a resume) and set the MFU denominator;
// agreed. 0 / -1.
int job_open_outputs(job *j, int start);
// --out_dir, its lock and metrics.jsonl still the ones this job holds (rank 0 looks; agreed):
// 0, or -1 with the reason, `after` naming where the job is.
int job_out_dir_still_there(job *j, const char *after);
