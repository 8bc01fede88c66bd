// fp8_linear.h: --fp8, the decoder linears' GEMMs in FP8 (backend.h's fp8_quantize and
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
//
// Fused amax: the forward's linear inputs that rmsnorm_fwd (q|k|v's and gate|up's) and
// swiglu_fwd (down's) produce come with their amax, which those kernels compute as they write
// the tensor (backend.h's amax argument: the wrapper passes a slot of its own); the wrapper
// remembers that output (pointer and size), and a matmul_fwd on exactly it quantises it with
// fp8_cast from that amax, skipping the quantisation's read pass: the same number, so the same
// bits as quantising it whole. Conservative: the memory stays remembered only until the next
// op through the wrapper that is not a matmul_fwd on it (every op of the table is watched,
// src/backend_ops.h), or a matmul_fwd whose output overlaps it; so LoRA's A factor and the
// separate gate and up GEMMs on the same input use it, and a recomputed forward
// (--gradient_checkpointing) gets a fresh one from its own rmsnorm_fwd. Not seen by the
// wrapper: writes outside the backend table (the collectives), which go to parameter and
// gradient buffers, never to a linear's input between its producer and its GEMM, and the
// calls on fp8_linear_unwrap's inner backend (the logits GEMM, the MFU benchmark), which
// write buffers of their own.
// FT_TEST_FP8_UNFUSED (test-only) turns it off: every amax by its own pass.
// Stays unfused, each with the quantisation's own amax pass:
//   - o_proj's input, attention's output: attention_fwd would have to emit it, on both of its
//     paths (the cuDNN graph, src/attention_cudnn_graph.c, which would need a reduction node
//     of its own, and kernels/attention.cu); not done;
//   - LoRA's B factor input (u = s x A^T, scaled in place by `scale` after its GEMM);
//   - the backward's output gradients dY (E5M2): a different producer per linear (the next
//     linear's dX GEMM, attention_bwd, swiglu_bwd, rope_qkv_bwd), GEMMs among them, whose
//     bf16 output would need an amax from cuBLASLt's epilogue; not done;
//   - the weights (E4M3, and transposed for dX): written once per step (adamw's parameter
//     cast, or FSDP's all-gather, a collective no kernel of ours runs) but quantised in every
//     micro-batch's forward, recompute and backward: an amax kept per weight from the
//     optimizer would have to follow the shards through the all-gather; not done.
#pragma once
#include "backend.h"
#include "config.h"

typedef struct lora_config lora_config;

// The wrapper over `inner` in *out. -1 with a one-line reason when inner has no FP8 GEMM (the
// CPU backend, a GPU of compute capability below 8.9). One wrapper per process (its FP8
// scratch is static); calling again rewraps, releasing the previous wrapping's memory first
// (fp8_linear_release).
int fp8_linear_backend(const backend *inner, const backend **out);
// Free the wrapper's scratch and amax slot to its inner backend; call before closing that
// backend when the process may wrap one again (a closed backend's memory is gone, and the
// CUDA backend reopens under the same table). Safe to call with none.
void fp8_linear_release(void);
// The backend without the FP8 wrapper: its inner one when `be` is the wrapper, else `be`. For
// the GEMMs that stay bf16 under --fp8 though they are matmul_fwd calls: the lm_head's logits
// (model_logits_rows: sampling) and the MFU benchmark's GEMM. (Under --profile the wrapper
// wraps --profile's, src/train.c: the inner backend is the timed one.)
const backend *fp8_linear_unwrap(const backend *be);
// The activations the wrapper's FP8 forward GEMMs quantised so far from their producer's amax
// (*fused), and all of them (*all): the fused amax at work (train_log.c prints both).
void fp8_linear_fused_counts(long *fused, long *all);
// The fused amax's slot (4 bytes) as the device arena holds it: one 256-byte unit, counted in
// the scratch figures below and the plan's FP8 line.
#define FP8_LINEAR_SLOT_BYTES 256
// The scratch the wrapper holds now (the FP8 copies of the largest call's operands so far,
// their scales), in bytes, plus FP8_LINEAR_SLOT_BYTES once the amax slot is taken: backend
// memory outside the tracker (the memory plan's "FP8 copies" workspace line, src/plan.c).
size_t fp8_linear_scratch_bytes(void);
// The largest scratch layout a call has asked for so far, in bytes (<= the scratch's size),
// plus FP8_LINEAR_SLOT_BYTES once the amax slot is taken: what the plan's line must equal
// (tests/test_cuda_emu_train.sh).
size_t fp8_linear_scratch_used(void);
// Take `bytes` (the plan's line: the planned scratch and the amax slot) now, at setup: one
// buffer, not a series of growing ones, and the slot (none when the fused amax is off). 0, or -1
// with ft_error (no wrapper yet, no device memory).
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
