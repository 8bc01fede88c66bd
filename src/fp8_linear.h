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

// The wrapper over `inner` in *out. -1 with a one-line reason when inner has no FP8 GEMM (the
// CPU backend, a GPU of compute capability below 8.9). One wrapper per process (its FP8
// scratch is static); calling again rewraps.
int fp8_linear_backend(const backend *inner, const backend **out);
// The scratch the wrapper holds now (FP8 copies of the largest activation and weight so far,
// their scales), in bytes: memory outside the memory plan, for reports.
size_t fp8_linear_scratch_bytes(void);
