// hf_checkpoint.h: Hugging Face checkpoint directories (input side).
//
// A directory holds config.json and either model.safetensors or shards
// model-0000i-of-0000n.safetensors listed by model.safetensors.index.json. Files are
// mmapped (st_open); tensors are converted to fp32 one unit at a time, so loading never
// holds more than one unit in host memory besides the mappings.
#pragma once
#include "config.h"
#include "param_layout.h"
#include "safetensors.h"

typedef struct {
    char *dir;
    st_file *files;
    int n_files;
} hf_checkpoint;

// Open the safetensors file(s) of `dir`. Validates the index (JSON object with an object
// "weight_map" of string values, file names that are plain names inside `dir`, every
// listed tensor present in the file named for it). Returns 0 or -1 with ft_error set.
int hf_checkpoint_open(hf_checkpoint *ck, const char *dir);
void hf_checkpoint_close(hf_checkpoint *ck);

// The content fingerprint of the weights in `dir` (opened as hf_checkpoint_open opens it):
// st_fingerprint continued over its safetensors file(s) in the order of their file names (so
// not the order of an index), never 0 (0 stands for "not recorded" in trainer_state.json).
// Reads the headers and ~200 KiB of samples per file; see st_fingerprint for what it tells
// apart and what it does not. Every rank computes the same value from the same files. 0 / -1.
int hf_checkpoint_fingerprint(const char *dir, uint64_t *fp);

// The tensor `name` and the file holding it, or NULL (no error recorded).
const st_tensor *hf_checkpoint_find(const hf_checkpoint *ck, const char *name, const char **path);

// Check the checkpoint against the layout: every expected tensor present with the expected
// shape and a dtype of F32, BF16 or F16; no duplicates across shards; no unexpected tensor
// (rotary inv_freq buffers are ignored; lm_head.weight is ignored when tied, but when it is
// stored beside model.embed_tokens.weight it must pass its checksum, st_verify, and equal
// them). 0 or -1.
int hf_checkpoint_validate(const hf_checkpoint *ck, const param_layout *l);

// Convert unit u's tensors to fp32 into host `out` (unit_numel[u] elements; padding is
// zeroed). Call hf_checkpoint_validate first. 0, or -1 (also for a tensor whose bytes fail the
// checksum its file records, st_verify: "checksum mismatch (the file is corrupted)", and for a
// NaN or infinite value, naming the file, tensor and element).
int hf_checkpoint_read_unit(const hf_checkpoint *ck, const param_layout *l, int u, float *out);

// What one rank of a sharded job reads of unit u: elements [lo, hi) of the unit converted to
// fp32 into out + lo (out holds the whole unit; the rest is left as it was; padding in the
// range is zeroed), the NaN / infinite check over that range only, and the checksum of every
// tensor whose index among the unit's tensors is verify_index mod verify_count, read whole
// (st_verify), whether it overlaps the range or not. Over ranks that split the unit's range
// between them and take every verify_index, each byte is converted once and each tensor
// verified once: a rank reads its slice plus 1/verify_count of the checksummed bytes, not the
// whole model. (0, unit_numel[u], 0, 1) is hf_checkpoint_read_unit. 0 / -1 as it.
int hf_checkpoint_read_range(const hf_checkpoint *ck, const param_layout *l, int u, size_t lo, size_t hi,
                             int verify_index, int verify_count, float *out);
