// fp8_linear.h: --fp8, the decoder linears' forward GEMMs in FP8 (backend.h's fp8_quantize and
// matmul_fp8). A backend wrapper, as --profile's (src/profile.h): its matmul_fwd quantises the
// activation and the weight to E4M3 with per-tensor scales from their current amax (both on
// the device) and multiplies them with the FP8 GEMM; every other op is the inner backend's.
// The model's matmul_fwd calls are exactly the decoder linears (q|k|v, o, gate|up, down, and
// LoRA's small factors): lm_head runs in lmhead_xent, attention and the norms in their ops,
// so they stay bf16. In matmul_bwd the input gradient dX = dY W runs in FP8 too (dY in E5M2,
// W in E4M3); the weight gradient dW = dY^T X stays a bf16 GEMM for now.
#pragma once
#include "backend.h"
#include "config.h"

typedef struct lora_config lora_config;

// The wrapper over `inner` in *out. -1 with a one-line reason when inner has no FP8 GEMM (the
// CPU backend, a GPU of compute capability below 8.9). One wrapper per process (its FP8
// scratch is static); calling again rewraps.
int fp8_linear_backend(const backend *inner, const backend **out);
// The backend without the FP8 wrapper: its inner one when `be` is the wrapper, else `be`. For
// the GEMMs that stay bf16 under --fp8 though they are matmul_fwd calls: the lm_head's logits
// (model_logits_rows: sampling) and the MFU benchmark's GEMM. (Under --profile the wrapper is
// wrapped again and these calls keep the FP8 path.)
const backend *fp8_linear_unwrap(const backend *be);
// The scratch the wrapper holds now (FP8 copies of the largest activation and weight so far,
// their scales), in bytes: one buffer from the backend's arena, outside the tracker (the
// memory plan's "FP8 copies" workspace line, src/plan.c).
size_t fp8_linear_scratch_bytes(void);
// The largest scratch layout a call has asked for so far, in bytes (<= the scratch's size):
// what the plan's line must equal (tests/test_cuda_emu_train.sh).
size_t fp8_linear_scratch_used(void);
// Take `bytes` of scratch now (the planned size, at setup: one buffer, not a series of growing
// ones). 0, or -1 with ft_error (no wrapper yet, no device memory).
int fp8_linear_reserve(size_t bytes);
// 1 when a linear of IC inputs and OC outputs runs in FP8 (both multiples of 16; LoRA's factors
// at a rank that is not run in bf16); the step-time estimate's counter (src/backend_count.c)
// takes the same rule.
int fp8_linear_shape_ok(int IC, int OC);
// The scratch one FP8 linear call takes: an (N, IC) activation and an (OC, IC) weight
// (backward: the (N, OC) output gradient when that is wider, and the weight transposed), each
// 256-byte aligned, and the two scales' stats; 0 for a shape that runs in bf16.
size_t fp8_linear_call_bytes(int N, int IC, int OC, int backward);
// The largest fp8_linear_call_bytes over the decoder linears the model's matmul_fwd (and,
// `backward`, matmul_bwd) calls take at N rows: q|k|v, o, gate|up (apart when LoRA targets
// gate or up), down, and LoRA's factors (lc NULL or rank 0: none).
size_t fp8_linear_model_bytes(const llama_config *cfg, const lora_config *lc, int N, int backward);
