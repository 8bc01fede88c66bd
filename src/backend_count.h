// backend_count.h: the op sequence of one micro-batch, counted from the model code itself.
//
// A backend table whose ops compute nothing and touch no memory: each call only adds its
// work to a tally, the FLOPs of its tensor-core products, the HBM bytes its memory-bound part
// reads and writes, and how many device operations (kernels, GEMMs, memsets) the CUDA
// backend issues for it (src/backend_cuda.c, kernels/). Its alloc hands out addresses that
// are never dereferenced. model_forward_backward (src/model.c) runs over it with a unit
// provider that hands out such addresses too, so the tally is the real sequence of ops of a
// micro-batch: checkpointing's recompute, LoRA's adapter paths and split passes, the chunked
// lm_head. The --dry_run step-time estimate (src/plan_time.c) prices the tally; the rates
// and the per-op costs (bytes per element an op moves) are the planner's assumptions, stated
// in src/backend_count.c and src/plan_time.c. Single-threaded (one static table).
#pragma once
#include <stddef.h>

#include "config.h"

typedef struct lora_config lora_config;   // lora.h

// What an op's work is priced as.
typedef enum {
    COUNT_GEMM,       // matmul_fwd / matmul_bwd: cuBLASLt GEMMs
    COUNT_GEMM_FP8,   // --fp8: the decoder linears' forward, dX and dW GEMMs in FP8 (src/fp8_linear.h)
    COUNT_ATTN_FWD,   // attention_fwd
    COUNT_ATTN_BWD,   // attention_bwd (flops: its forward's two products over the same shape; the
                      // attention path decides how many products its backward forms)
    COUNT_LMHEAD,     // the fused lm_head + softmax/cross-entropy (its GEMMs and row kernels)
    COUNT_MEMORY,     // every other kernel and memset
    COUNT_KIND_COUNT
} count_kind;

// Where in the micro-batch an op ran: inside a decoder layer's forward, its forward recomputed
// in the backward (gradient checkpointing), its backward; or outside the layers (the root
// unit's work: embedding, final norm, lm_head and loss, the zeroed residual gradient).
typedef enum { COUNT_LAYER_FWD, COUNT_LAYER_RECOMPUTE, COUNT_LAYER_BWD, COUNT_ROOT, COUNT_PHASE_COUNT } count_phase;

typedef struct {
    double calls;      // backend op calls
    double flops;      // tensor-core FLOPs (GEMMs, attention products)
    double flop_ops;   // device operations doing those FLOPs (GEMMs, attention calls)
    double bytes;      // HBM bytes of memory-bound work: kernels, memsets, and what a GEMM's
                       // epilogue or the attention backward's row pass reads beside its FLOPs
    double byte_ops;   // memory-bound device operations (kernels, memsets)
} count_tally;

typedef struct {
    count_tally t[COUNT_PHASE_COUNT][COUNT_KIND_COUNT];
} count_result;

// One micro-batch to count.
typedef struct {
    int B, T;                  // micro-batch shape (the buffers' and the ops')
    size_t elem_bytes;         // storage dtype: 2 (bf16, the GPU) or 4 (fp32, the CPU)
    int buffers;               // MODEL_TRAIN, MODEL_TRAIN_CKPT or MODEL_FORWARD_ONLY (model.h)
    const lora_config *lora;   // NULL: full fine-tuning; else the adapters (a frozen base)
    int grads_f32;             // the gradient units are fp32 (fsdp_grads_f32)
    int segments;              // --pack_attention per_game: segment starts handed to the ops
    int backward;              // 0: the forward only (--eval_only)
    int fp8;                   // --fp8: matmul_fwd and matmul_bwd's dX and dW count as the FP8
                               // wrapper runs them (quantisations, FP8 GEMMs; a residual copied
                               // first; the shapes outside fp8_linear_shape_ok / _dw_ok in bf16)
} count_job;

// Run one micro-batch of `job` of the model `cfg` (model_forward_backward) over the counting
// backend and a counting unit provider, and tally its ops into *out. The provider's gradient
// units are never fresh (unit_grad): zeroing a fresh unit's norm weights is the gradient
// schedule's cost, priced with it. 0, or -1 with ft_error (host memory, or the model calling
// an op the counter does not know: adamw, sum_squares, accumulate, cast_from_f32).
int count_micro_batch(const llama_config *cfg, const count_job *job, count_result *out);
