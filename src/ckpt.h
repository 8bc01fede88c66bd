// ckpt.h: where a run's weights come from and go to: the start (pretrained Hugging Face
// weights, or a resumable checkpoint of ours) and resumable checkpoints. The Hugging Face
// export is hf_export.h; the checks on --out_dir are out_dir.h.
//
// A checkpoint directory is itself a Hugging Face checkpoint (config.json + model.safetensors
// holding the fp32 master weights under HF names), plus optimizer.safetensors
// (exp_avg.<name>, exp_avg_sq.<name>) and trainer_state.json. Tensors are consolidated (not
// per-rank shards), so a checkpoint saved at one world size resumes at any other.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "fsdp.h"
#include "lora.h"

// Trainer state saved with every checkpoint (trainer_state.json, one key per field).
typedef struct {
    int step;                     // optimizer steps completed
    int epoch;                    // epoch of the next row (for people: resume derives it from step)
    uint64_t row;                 // next row within that epoch (idem)
    int seed, total_batch_size, seq_len, pack, total_steps;
    long long n_params;           // trained parameters (with LoRA: the adapters')
    int lora_rank;                // 0: full fine-tuning (absent in older checkpoints: 0)
    int lora_targets;             // LoRA target mask (lora.h), 0 without LoRA
    double lora_alpha;            // --lora_alpha, 0 without LoRA (absent in older checkpoints:
                                  // 0, and then not checked on resume)
    uint64_t base_fingerprint;    // LoRA: hf_checkpoint_fingerprint of the frozen base the
                                  // adapters were trained on; 0: not recorded (full fine-tuning,
                                  // older checkpoints; then not written). Not checked by
                                  // ckpt_check_start / ckpt_load_start: the caller compares it.
    uint64_t data_fingerprint;    // loader_fingerprint of the training shards; 0: not recorded
                                  // (older checkpoints). A resume on other data is warned
                                  // about by the caller, not refused (a changed dataset can be
                                  // meant); not checked by ckpt_check_start.
    // The optimizer's settings (--learning_rate, --warmup_fraction, --beta1, --beta2,
    // --adam_eps, --weight_decay, --max_grad_norm; --lr_schedule's name). NaN / "": not
    // recorded (older checkpoints). Not checked by ckpt_check_start: a resume with other ones
    // is warned about by the caller (a deliberate change is common; a silent one surprises).
    double opt[7];
    char lr_schedule[16];
    char pack_attention[16];      // --pack_attention ("row", "per_game"); "": not recorded (older
                                  // checkpoints). A resume with another is warned about by the
                                  // caller (the loss changes, the data order does not).
    int eval_only;                // `expect` only (never saved): an evaluation, which reads no
                                  // training rows: --seed, --total_batch_size and --pack are not
                                  // checked against the checkpoint's
} trainer_state;

// Resolve --resume ("latest", "auto" or a path) to a checkpoint directory in `dir` (size n):
// latest and auto read OUT/checkpoints/latest, which must hold one line naming a directory
// beside it (at most NAME_MAX bytes; anything else is an error naming that file); auto without
// that file (nothing saved yet) resolves to "" (a fresh start); a path must be a directory. 0 / -1.
int ckpt_resolve(const char *out_dir, const char *resume, char *dir, size_t n);

// Before anything model-sized is allocated: the weights a run will read fit config.json's
// layouts, so that a config.json that disagrees with its checkpoint fails at once (not after
// allocating the model it describes). Checked: model_dir against `base` when it is read (no
// resume_dir, or LoRA: `trained` is then the adapters' layout, not `base`); resume_dir's
// trainer state against `expect` as ckpt_load_start checks it, then its weights and its
// optimizer.safetensors (both moments of every entry, nothing else) against `trained`.
// Headers only (no tensor data read). When resuming, *got is resume_dir's trainer state (left
// alone otherwise), for checks the caller makes (base_fingerprint). 0 / -1.
int ckpt_check_start(const char *model_dir, const char *resume_dir, const param_layout *base,
                     const param_layout *trained, const trainer_state *expect, trainer_state *got);

// The weights a run starts from, into `s`: with resume_dir NULL or "", the pretrained
// weights of model_dir and zero moments (*got = *expect); else checkpoint resume_dir: its
// trainer state, refused unless it fits this run (the same seed, total batch, sequence
// length, packing and parameter count as `expect`; with expect->eval_only only the sequence
// length and the parameters, and a step within expect->total_steps
// when that is > 0), then its weights and moments into *got and `s`; a state of working
// parameters only (fsdp_params_only: --eval_only) takes the fp32 weights converted unit by
// unit, and the moments are not read (their header is ckpt_check_start's). Collective only in
// the sense that every rank reads. 0 / -1.
int ckpt_load_start(fsdp_state *s, const char *model_dir, const char *resume_dir, const trainer_state *expect,
                    trainer_state *got);

// Load the weights of the Hugging Face checkpoint directory `dir` (pretrained, or a
// checkpoint of ours) into the master and working parameters of `s`: validated against
// s->layout first, then one unit at a time, every rank reading its slices through the mmap.
// The moments are left alone. 0 / -1.
int ckpt_load_weights(fsdp_state *s, const char *dir);

// Save a resumable checkpoint <out_dir>/checkpoints/step_%08d (fp32 master weights as a
// Hugging Face model.safetensors, AdamW moments in optimizer.safetensors, config.json and
// trainer_state.json), written to a temporary directory, fsync'ed and renamed into place;
// then <out_dir>/checkpoints/latest is replaced atomically. Collective over the shard group
// (gathers); rank 0 of the world writes. Streams: each unit of each buffer is gathered into
// one host buffer of s->max_unit floats and its tensors written at their file offsets, so
// saving needs one unit of host memory, not the model; every rank gathers every unit even
// when rank 0 fails to write (no rank is left waiting). 0 / -1.
// keep > 0: then the checkpoints of steps up to ts->step beyond the newest `keep` go (each
// renamed to a .tmp.step_* name first, so a kill mid-removal leaves what the next save
// clears; checkpoints of later steps, from a run this one resumed before the end of, stay).
int ckpt_save(const char *out_dir, const char *model_dir, fsdp_state *s, const trainer_state *ts,
              int world_rank, int keep);
