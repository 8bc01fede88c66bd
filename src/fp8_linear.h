// fp8_linear.h: --fp8, the decoder linears' forward GEMMs in FP8 (backend.h's fp8_quantize and
// matmul_fp8). A backend wrapper, as --profile's (src/profile.h): its matmul_fwd quantises the
// activation and the weight to E4M3 with per-tensor scales from their current amax (both on
// the device) and multiplies them with the FP8 GEMM; every other op is the inner backend's.
// The model's matmul_fwd calls are exactly the decoder linears (q|k|v, o, gate|up, down, and
// LoRA's small factors): lm_head runs in lmhead_xent, attention and the norms in their ops,
// so they stay bf16. In matmul_bwd the input gradient dX = dY W runs in FP8 too (dY in E5M2,
// W in E4M3), and so does the weight gradient dW = dY^T X (dY^T in E5M2, X^T in E4M3: the
// transposed layouts fp8_quantize writes, the one dY quantisation serving both GEMMs), its
// fp32 sum rounded once to the gradient's dtype (bf16 or fp32) or added to it
// (accumulate_dw), as torchao's float8 training does. dW's reduction runs over the N token
// rows, so it needs N a multiple of 16 (fp8_linear_dw_ok; the CUDA backend's micro-batches are
// padded to multiples of 64, but a batch of one at a seq_len cap that is not a multiple of 16
// is not): otherwise dW is the inner backend's bf16 GEMM.
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
// The scratch the wrapper holds now (the FP8 copies of the largest call's operands so far,
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
// 1 when such a linear's weight gradient at N token rows runs in FP8 too: fp8_linear_shape_ok
// and N (the GEMM's reduction length) a positive multiple of 16; else dW is a bf16 GEMM. The
// counter takes this rule too.
int fp8_linear_dw_ok(int N, int IC, int OC);
// What one linear call runs (fp8_linear_call_bytes): the forward only; the forward and the
// backward's dX (a frozen weight, dweight NULL: LoRA's base); the forward, dX and dW.
typedef enum { FP8_CALL_FWD, FP8_CALL_BWD_DX, FP8_CALL_BWD_DW } fp8_call;
// The scratch one FP8 linear call takes, in bytes, each buffer of codes 256-byte aligned, 3
// stats floats per buffer: the largest of its passes' layouts: forward [(N, IC) activation
// | (OC, IC) weight | 6 floats]; backward [(N, OC) output gradient | (IC, OC) weight
// transposed | 6 floats], or with dW in FP8 (fp8_linear_dw_ok) [(N, OC) output gradient |
// (OC, N) its transpose | the larger of the (IC, OC) weight transposed and the (IC, N) input
// transposed (one after the other) | 9 floats]. 0 for a shape that runs in bf16.
size_t fp8_linear_call_bytes(int N, int IC, int OC, fp8_call pass);
// The largest fp8_linear_call_bytes over the decoder linears the model's matmul_fwd (and,
// `backward`, matmul_bwd) calls take at N rows: q|k|v, o, gate|up (apart when LoRA targets
// gate or up), down (with dW, or, LoRA's frozen base, without), and LoRA's factors (with dW;
// lc NULL or rank 0: none).
size_t fp8_linear_model_bytes(const llama_config *c, const lora_config *lc, int N, int backward);
