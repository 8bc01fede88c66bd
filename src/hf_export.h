// hf_export.h: a run's weights written as Hugging Face directories: the full model
// (config.json + model.safetensors), LoRA adapters as a PEFT adapter directory, and a merged
// LoRA model; and the streaming writer of parameter-shaped safetensors files under it, which
// the resumable checkpoints (ckpt.h) use as well. Every writer is collective over the FSDP
// shard group: units are gathered one at a time (one unit of host memory, not the model),
// rank 0 of the world writes, into a temporary directory published by rename.
#pragma once
#include "fsdp.h"
#include "lora.h"

// ----------------------------------------------------------------------------
// streaming parameter files

// One safetensors file of parameter-shaped tensors: n_parts blocks of the layout's entries,
// block k named prefix[k] + <HF name> with its data from fsdp buffer which[k]; tensor
// k * n_entries + i is entry i of block k (the order st_write was given before streaming).
typedef struct {
    const char *const *prefix;
    const fsdp_buffer *which;
    int n_parts;
    st_dtype dtype;   // ST_F32, or ST_BF16 (converted from the fp32 gather)
} hf_param_file;

// Stream the n files `pf[i]` to <dir>/<name[i]> through one unit buffer of s->max_unit floats.
// Collective: every rank gathers every unit of every block in the same order, whatever happens
// to the writing, so a failure on the writer cannot leave the others waiting in a gather.
// `write`: this rank writes (rank 0 of the world, and nothing failed before). 0 / -1 (on -1 no
// complete file; every rank gathers regardless).
int hf_export_stream(fsdp_state *s, const char *dir, const hf_param_file *pf, const char *const *name, int n,
                     int write);

// ----------------------------------------------------------------------------
// exports

// Export the current weights in Hugging Face layout to <dir> (config.json with the dtype,
// model.safetensors in `dtype` ("bf16" or "fp32"), tokenizer files copied from model_dir),
// atomically (temporary directory + rename). Collective over the shard group; streams one
// unit at a time (hf_export_stream). 0 / -1.
int hf_export_model(const char *dir, const char *model_dir, fsdp_state *s, const char *dtype, int world_rank);

// Export LoRA adapters `s` (over lora layout `ll`) as a PEFT adapter directory <dir>:
// adapter_config.json (LORA, CAUSAL_LM, r, lora_alpha, target_modules, no dropout/bias) and
// adapter_model.safetensors (PEFT's tensor names, `dtype` "bf16" or "fp32"), atomically, for
// peft.PeftModel.from_pretrained(base of model_dir, dir). Collective over the shard group like
// hf_export_model. 0 / -1.
int hf_export_peft(const char *dir, const char *model_dir, fsdp_state *s, const lora_layout *ll, const char *dtype,
                   int world_rank);

// Export a merged full checkpoint in the Hugging Face layout to <dir> (as hf_export_model):
// every base weight from model_dir (read in fp32 on rank 0) with the LoRA adapters `adapters`
// (over `ll`) merged, W + (alpha / r) B A, in `dtype`. Collective over the shard group (the
// adapters are gathered one unit at a time); rank 0 writes. 0 / -1 (nothing left behind).
int hf_export_merged(const char *dir, const char *model_dir, const param_layout *base, fsdp_state *adapters,
                     const lora_layout *ll, const char *dtype, int world_rank);
