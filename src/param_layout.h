// param_layout.h: the parameter layout (the size table) of a Llama model: every tensor's
// Hugging Face name, unit, offset and shape in one flat buffer.
//
// Parameters live in one flat buffer divided into units: unit u < L is decoder layer u, unit
// L is the root (embedding, final norm, lm_head). Each unit is padded to a multiple of
// `pad_multiple` elements so FSDP can cut it into equal shards: a shard is a slice. The
// model (model.h), the LoRA adapters (lora.h: a layout of their own), the Hugging Face
// reader (hf_checkpoint.h) and the checkpoints all address tensors through it; it depends on
// the config alone.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "config.h"

// tensors of one decoder layer, in storage order (q,k,v adjacent; gate,up adjacent)
enum { LT_ATTN_NORM, LT_WQ, LT_WK, LT_WV, LT_WO, LT_MLP_NORM, LT_WGATE, LT_WUP, LT_WDOWN,
       LT_COUNT };
// tensors of the root unit (RT_LMHEAD has numel 0 when embeddings are tied)
enum { RT_EMBED, RT_NORM, RT_LMHEAD, RT_COUNT };

typedef struct {
    char name[96];       // Hugging Face name, e.g. "model.layers.3.mlp.up_proj.weight"
    int unit;            // which unit holds it
    size_t offset;       // element offset in the flat buffer (global)
    size_t unit_offset;  // element offset inside its unit
    size_t numel;
    int ndim;            // 1 (norm weights) or 2
    int64_t shape[2];
    int decay;           // 1 if AdamW weight decay applies (matrices), 0 for norm weights
} param_entry;

typedef struct {
    llama_config cfg;            // the config it was built for (the model takes it from here)
    int n_layers;
    int n_units;                 // n_layers + 1
    size_t pad_multiple;
    size_t layer_numel;          // real elements of one layer unit
    size_t root_numel;           // real elements of the root unit
    size_t *unit_numel;          // (n_units) padded sizes
    size_t *unit_offset;         // (n_units) offsets in the flat buffer
    size_t total;                // padded flat size, sum of unit_numel
    size_t n_params;             // real parameter count (no padding)
    param_entry *entries;        // (n_entries) in flat order
    int n_entries;
    size_t layer_off[LT_COUNT];  // offsets inside a layer unit
    size_t root_off[RT_COUNT];   // offsets inside the root unit
} param_layout;

// Build the layout for `cfg`, padding every unit to a multiple of pad_multiple (>= 1).
int param_layout_init(param_layout *l, const llama_config *cfg, size_t pad_multiple);
void param_layout_free(param_layout *l);
// Entry called `name`, or NULL.
const param_entry *param_layout_find(const param_layout *l, const char *name);
// (The layout is the parameter count's one definition: n_params.)
