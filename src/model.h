// model.h: the Llama decoder written once over the backend table.
//
// Parameters live in one flat buffer divided into padded units, described by the size table
// of param_layout.h (unit u < L is decoder layer u, unit L the root).
//
// The forward/backward never touches parameter storage directly: it asks a unit_provider
// for each unit's full parameters and gradient buffer. The FSDP provider (fsdp.h) gathers
// and reduce-scatters; the golden tests use a flat one over two buffers (tests/model_util.h).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "config.h"
#include "memory.h"
#include "param_layout.h"

typedef struct lora_config lora_config;   // lora.h
typedef struct lora_layout lora_layout;   // lora.h

// ----------------------------------------------------------------------------
// FLOPs (the one definition: the MFU of the log and the --dry_run estimate use these)

// Parameters of one decoder layer that take part in a matmul (q, k, v, o, gate, up, down).
double model_layer_matmul_params(const llama_config *cfg);
// Forward FLOPs of causal attention per token per layer at sequence length T: QK^T and PV
// over on average T/2 keys, 2 FLOPs per multiply-add, for H heads of dimension D.
double model_attention_fwd_flops(const llama_config *cfg, double T);
// Model FLOPs per trained token at sequence length T, forward and backward, no recompute.
// A full fine-tune (adapter_layer_params 0): 6 x (L x layer matmul params + the lm_head's
// V x C, tied or not: the matmul is done either way; the embedding is a lookup and norm
// weights are elementwise) + 3 x L x attention. LoRA (adapter_layer_params: one layer's
// adapter parameters, lora_layer_params): the base is frozen, so its matmul parameters count
// 4 (forward, and the backward's dX that reaches the adapters below; no dW), and the adapters
// 6 each, L x adapter_layer_params of them.
double model_flops_per_token(const llama_config *cfg, double T, double adapter_layer_params);
// Model FLOPs of the forward alone per token (--eval_only's numerator): 2 x (matmul params +
// L x adapter_layer_params) + L x attention.
double model_forward_flops_per_token(const llama_config *cfg, double T, double adapter_layer_params);

// ----------------------------------------------------------------------------
// unit provider: where the forward/backward gets parameters and puts gradients

// A unit's gradient buffer for one backward (grad_begin's answer).
typedef struct {
    void *data;       // unit_numel[u] elements of `dtype`
    st_dtype dtype;   // the backend dtype, or ST_F32 when it is the step's fp32 gradient itself
    int fresh;        // 0: the backward adds (+=) into it. 1: its contents are arbitrary and the
                      // backward overwrites every element (its GEMMs with beta 0, the norm
                      // weights and the padding zeroed first): no pass to zero it beforehand
} unit_grad;

typedef struct unit_provider unit_provider;
struct unit_provider {
    void *ctx;
    // Make unit u's full parameters (unit_numel[u] elements, backend dtype) available at
    // *params until release(u). `for_backward` says which pass asks.
    int (*acquire)(void *ctx, int u, int for_backward, void **params);
    int (*release)(void *ctx, int u);
    // Gradient buffer of unit u (*g: unit_grad above), written by the backward between
    // grad_begin(u) and grad_end(u). grad_end(u) = unit u's gradients of this micro-batch are
    // complete (FSDP reduce-scatters there). Only a layer unit of a fully trained model
    // (no LoRA) may be fresh.
    int (*grad_begin)(void *ctx, int u, unit_grad *g);
    int (*grad_end)(void *ctx, int u);
};


// ----------------------------------------------------------------------------
// the model

typedef struct {
    void *ln1; float *ln1_rstd;     // (N, C), (N)
    void *q;                        // (N, H*D) after RoPE
    void *k, *v;                    // (N, KVH*D) (k after RoPE)
    void *att; float *lse;          // (N, H*D), (B, H, T)
    void *h;                        // (N, C) residual stream after attention
    void *ln2; float *ln2_rstd;     // (N, C), (N)
    void *gu;                       // (N, 2F): gate | up per row (one fused GEMM; see layer_forward)
    void *act;                      // (N, F)
    void *lora_u[LT_COUNT];         // (N, r) s x A^T of each LoRA target (lora.h), else NULL
} layer_acts;

typedef struct {
    llama_config cfg;               // layout->cfg
    const backend *be;
    mem_tracker *mem;
    const param_layout *layout;     // borrowed from the parameters' owner (the unit provider's)
    int B, T;                       // current micro-batch shape (T <= T_alloc)
    int T_alloc;                    // sequence length the buffers were sized for
    int buffers;                    // MODEL_TRAIN, MODEL_TRAIN_CKPT or MODEL_FORWARD_ONLY
    int grad_ckpt;                  // 1: keep only each layer's input, recompute in backward
    int grads_f32;                  // the base's gradient units are fp32 (model_init_lora)
    size_t esz;                     // bytes per element of the backend dtype
    st_dtype gdt;                   // dtype of the gradient unit being written (grad_begin's)
    size_t gesz;                    // its bytes per element
    int gfresh;                     // it is fresh (unit_grad): weights' gradients overwritten

    float *rope_cos, *rope_sin;     // (T, D/2) backend memory
    int32_t *tokens, *targets;      // (N) backend memory
    int32_t *seg;                   // (N) backend memory: segment starts (model_set_segments)
    int32_t *seg_host;              // (N) host: the same, built from the tokens
    int seg_bos;                    // model_set_segments' BOS id, -1 = off
    const int32_t *seg_cur;         // what the rope/attention ops get now: seg or NULL
    int32_t *up_host[2];            // backend.upload's pinned staging slots, 3 (B, T_alloc) int32 each:
                                    // tokens | targets | segment starts; NULL: copy_h2d (the CPU)
    int up_slot;                    // the slot the next micro-batch's rows go through
    void **resid;                   // (L + 1) x (N, C): input of each layer + final output
                                    // (MODEL_FORWARD_ONLY: all L + 1 are one buffer)
    layer_acts *acts;               // L sets, or 1 set reused (grad_ckpt, MODEL_FORWARD_ONLY)
    int n_act_sets;
    void *lnf; float *lnf_rstd;     // (N, C), (N)
    float *losses;                  // (N) backend memory
    float *losses_host;             // (N)
    double *loss_acc;               // (2) backend memory: the loss accumulator (model_loss_read)
    int lmhead_rows;                // rows per lm_head chunk (model_lmhead_chunk_rows of B*T_alloc)
    float *logits_ws;               // (lmhead_rows, V) fp32 workspace
    float *lmhead_dw_acc;           // (V, C) fp32, bf16 backends with B*T_alloc > lmhead_rows; else NULL
    // backward scratch, one set
    void *dresid, *dln;             // (N, C)
    void *dq, *datt;                // (N, H*D)
    void *dk, *dv;                  // (N, KVH*D)
    void *dgu;                      // (N, max(2F, (H + 2 KVH) D)): dgate | dup (gu's layout); also
                                    // the fused q|k|v projection and its gradient (model.c)
    void *dact;                     // (N, F)
    // LoRA (lora != NULL): the base is frozen (no gradients asked of the base provider), the
    // adapters come from their own provider over lora->layout
    const lora_layout *lora;
    unit_provider adapters;
    void *lora_du;                  // (N, r) backward scratch
    void *norm_sink;                // (C) the frozen RMSNorm weights' gradient, discarded
} model;

// Rows of logits the lm_head materialises at once for N = B*T rows and vocab V: as many as
// fit in LMHEAD_CHUNK_BYTES of fp32 (a multiple of 128 when over 128), at most
// LMHEAD_CHUNK_ROWS_MAX and at most N (at least 1). The memory plan and the model both take
// it through model_buffer_table (the logits chunk, and with several chunks on a bf16 backend
// the (V, C) fp32 dW accumulator).
// TEST-ONLY: the environment variable FT_LMHEAD_CHUNK_ROWS=R (1 <= R <= LMHEAD_CHUNK_ROWS_MAX)
// lowers the cap to R rows, so a small test job crosses chunk boundaries (several chunks per
// micro-batch, as a 7B job with over 2048 rows per micro-batch does); --dry_run and the
// trainer both see it. Not for production use.
int model_lmhead_chunk_rows(int N, int V);

// 0 when FT_LMHEAD_CHUNK_ROWS is unset or a valid row count; -1 with one error naming it
// otherwise (options_parse calls it; model_lmhead_chunk_rows ignores an invalid value).
int model_lmhead_chunk_env_check(void);

// What a model's buffers are for (model_buffer_table's and model_init's `buffers`; 0 and 1 are
// the grad_ckpt flag's values): training keeping every layer's activations; training with
// gradient checkpointing (each layer's input kept, one set recomputed in the backward); the
// forward only (--eval_only: one residual buffer and one activation set reused by every
// layer, no backward scratch; model_forward_backward refuses a backward).
enum { MODEL_TRAIN = 0, MODEL_TRAIN_CKPT = 1, MODEL_FORWARD_ONLY = 2 };

// Every backend buffer model_init allocates for a (B, T) micro-batch with `buffers` (above:
// the activations kept for the backward, the recompute set with checkpointing, and the
// scratch), offered to `t` in allocation order with esz bytes per storage element. `m` NULL:
// only sizes (the planner); otherwise slots are m's fields (m->resid and m->acts must be
// allocated).
// `lc` NULL: no LoRA; else its per-target (N, r) activations and scratch are listed too.
// grads_f32: the gradient units come in fp32 (grad_begin's gdt; fsdp_grads_f32), so
// lm_head's dW needs no fp32 sum buffer of its own.
void model_buffer_table(mem_table *t, const llama_config *cfg, const lora_config *lc, int B, int T, int buffers,
                        int grads_f32, size_t esz, model *m);

// Allocate everything a (B, T) micro-batch needs (model_buffer_table; `buffers` as there) for the model of
// `layout` (its config, its tensor offsets). Parameters are NOT allocated here: they, and
// the layout, belong to whoever owns the unit_provider, whose layout this must be (the FSDP
// state's, the flat provider's); it must outlive the model.
int model_init(model *m, const param_layout *layout, const backend *be, mem_tracker *mem, int B, int T,
               int buffers);
// The same with LoRA adapters over `lora` (borrowed, must outlive the model) served by
// `adapters` (its layout must be lora->layout): the base provider is then asked for
// parameters only, never for gradients (a frozen base), and the adapters' gradients go to
// `adapters`. lora NULL = model_init. grads_f32: the base provider's gradient units are fp32
// (model_buffer_table). 0 / -1.
int model_init_lora(model *m, const param_layout *layout, const lora_layout *lora, const unit_provider *adapters,
                    const backend *be, mem_tracker *mem, int B, int T, int buffers, int grads_f32);
void model_free(model *m);

// One micro-batch. tokens, targets: host (B, T) int32; targets[b, t] is the id to predict
// after position t (already shifted), or -100 to ignore. Always runs the forward; if
// `backward`, runs the backward too, adding d(sum of valid token losses * dloss)/dparam into
// the provider's gradient buffers. Adds the sum of the valid token losses and their count to
// the model's loss accumulator on the device (backend.h's loss_accumulate: no host wait).
// The tokens and targets go up through pinned staging (backend.upload, no host wait; the
// caller may reuse its arrays at once).
// loss_sum / n_valid not NULL: also copies the losses back to m->losses_host (a host wait)
// and outputs their sum (the same bits the accumulator adds) and count there; NULL: neither.
int model_forward_backward(model *m, const unit_provider *p, const int32_t *tokens, const int32_t *targets,
                           int backward, float dloss, double *loss_sum, int *n_valid);

// The loss accumulator: zero after model_init and after model_loss_reset (queued on the
// device, no host wait); each model_forward_backward adds its micro-batch's loss sum s and
// valid-token count c in double (acc += s, s summed from 0.0 in row order). model_loss_read
// copies both back (the host waits for the work queued so far): *sum = the micro-batches'
// s added in call order, *count = their c. 0 / -1.
int model_loss_reset(model *m);
int model_loss_read(model *m, double *sum, double *count);

// --pack_attention per_game: with bos >= 0, model_forward_backward and model_logits treat every `bos` token as the start of a segment: RoPE
// positions restart at 0 there and attention stays within the segment (backend.h, `seg`).
// bos < 0: off (the default; plain causal attention over the row). The targets are the
// caller's: a segment's last token should not predict the next one's `bos` (loader.h).
void model_set_segments(model *m, int bos);
// seg (B, T) = for each row position the last position <= t holding `bos`, 0 when none (a
// row that starts mid-game). E.g. bos 1, tokens [5 1 7 8 1 9] -> seg [0 1 1 1 4 4].
void model_segment_starts(const int32_t *tokens, int B, int T, int bos, int32_t *seg);

// Run the next micro-batches with sequence length T <= the allocated one (a batch whose
// rows all end early needs no compute on the padding: causal attention makes the result
// on real tokens the same). tokens/targets passed to model_forward_backward are then
// (B, T). 0 / -1.
int model_set_seq_len(model *m, int T);

// Forward only, writing logits (B, T, V) fp32 to host memory `logits`.
int model_logits(model *m, const unit_provider *p, const int32_t *tokens, float *logits);
// Forward only, writing the logits of rows [row0, row0 + nrows) of the flattened (B*T)
// micro-batch to host `logits` (nrows, V) fp32; only those rows go through the lm_head
// (sampling needs one). -1 with ft_error if the rows are outside the micro-batch.
int model_logits_rows(model *m, const unit_provider *p, const int32_t *tokens, int row0, int nrows,
                      float *logits);

// RoPE tables as transformers computes them in fp32 (inv_freq with linear/llama3 scaling,
// angle = position * inv_freq): cos, sin (T, D/2) host arrays.
void rope_tables_compute(const llama_config *cfg, int T, float *cos, float *sin);
