// lora.h: LoRA adapters (Hu et al. 2021) in PEFT's layout.
//
// A targeted projection y = x W^T (W (out, in), frozen) becomes y = x W^T + s (x A^T) B^T with
// A (r, in), B (out, r) trainable and s = alpha / r: PEFT's LoraConfig(r, lora_alpha), no
// dropout, no bias, no rsLoRA/DoRA. The forward adds s B (A x) into the target's own output
// slice after the base projection, so the base GEMMs may be fused (q/k/v, gate/up) freely.
//
// The adapters are parameters of their own flat layout (a param_layout): unit l < L holds
// layer l's A and B of every target, unit L is an empty root (padding only) so that the
// FSDP state (fsdp.h), the checkpoints and the optimizer treat it like any model. Entries
// carry PEFT's saved names, e.g.
// "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight".
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "config.h"
#include "param_layout.h"

// bit (1u << LT_WQ) ... (1u << LT_WDOWN) for each targeted projection
#define LORA_DEFAULT_TARGETS ((1u << LT_WQ) | (1u << LT_WK) | (1u << LT_WV) | (1u << LT_WO))

typedef struct lora_config lora_config;   // (model.h declares these two as well)
typedef struct lora_layout lora_layout;

struct lora_config {
    int rank;             // r >= 1 (0 = no LoRA)
    float alpha;          // lora_alpha; scaling = alpha / r
    unsigned targets;     // bit mask over the LT_ projection indices
};

struct lora_layout {
    lora_config lc;
    param_layout layout;          // the adapters' flat layout (see above)
    size_t a_off[LT_COUNT];       // offset of A (r, in) inside a layer unit, targeted projections only
    size_t b_off[LT_COUNT];       // offset of B (out, r)
    int in[LT_COUNT], out[LT_COUNT];   // the projection's dimensions
    int max_out;                  // largest `out` over the targets
};

// Parse a comma-separated target list of q, k, v, o, gate, up, down into *targets (a set:
// repeats are fine). 0, or -1 with ft_error naming --lora_targets and the bad word.
int lora_parse_targets(const char *list, unsigned *targets);
// The --lora_targets spelling of a mask ("q,k,v,o"), written into buf (at most n bytes).
void lora_targets_string(unsigned targets, char *buf, size_t n);
// PEFT's module name of projection t ("q_proj", ..., "down_proj"), NULL when not a projection.
const char *lora_module_name(int t);
// Input and output width of projection t of `cfg` (t one of LT_WQ..LT_WDOWN, not a norm).
void lora_proj_dims(const llama_config *cfg, int t, int *in, int *out);
// Check `lc` against `cfg`: rank >= 1, alpha > 0 and finite, at least one target, rank at
// most min(in, out) of every target. 0, or -1 with ft_error naming the flag.
int lora_validate(const lora_config *lc, const llama_config *cfg);
// alpha / rank
float lora_scaling(const lora_config *lc);
// One layer's adapter parameters, unpadded: rank x (in + out) over the targets (the MFU's
// count, model_flops_per_token; lc validated).
double lora_layer_params(const llama_config *cfg, const lora_config *lc);

// Build the adapters' layout for `cfg` and `lc` (validated first), units padded to a
// multiple of pad_multiple (the root unit is one pad_multiple of padding). 0 or -1.
int lora_layout_init(lora_layout *ll, const llama_config *cfg, const lora_config *lc, size_t pad_multiple);
void lora_layout_free(lora_layout *ll);

// ----------------------------------------------------------------------------
// the adapter path of one projection (the model calls these around the base GEMM)

// y (N, out) += s (x (N, in) A^T) B^T, with u (N, r) = s x A^T kept for the backward.
// A (r, in), B (out, r). 0 / -1.
int lora_proj_fwd(const backend *be, float s, void *y, void *u, const void *x, const void *A, const void *B, int N,
                  int in, int out, int r);
// Given dy (N, out), the saved x (N, in) and u (N, r): dB (out, r) += dy^T u;
// du (N, r) = s dy B (scratch); dA (r, in) += du^T x; dx (N, in) += du A. dA and dB are in
// dtype gdt (backend.h). 0 / -1.
int lora_proj_bwd(const backend *be, float s, void *dx, void *dA, void *dB, st_dtype gdt, void *du, const void *dy,
                  const void *x, const void *u, const void *A, const void *B, int N, int in, int out, int r);

// The initial adapters of layer unit u, PEFT's default: A (r, in) uniform in
// [-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform with a = sqrt(5)), B = 0 (so training starts at
// the base model), padding 0, into host (unit_numel[u] floats). The numbers are a pure
// function of (seed, u): every rank computes the same unit. The root unit is all zeros.
void lora_init_unit(const lora_layout *ll, int u, uint64_t seed, float *host);

// Merge layer unit u's adapters into the base: for every target, W (out, in) += s B A, with
// `adapters` the adapters' unit u (lora layout, host fp32) and `base` the base unit u (host
// fp32, `base_layout`'s offsets). The root unit has no adapters (nothing to do).
void lora_merge_unit(const lora_layout *ll, const param_layout *base_layout, int u, const float *adapters,
                     float *base);
