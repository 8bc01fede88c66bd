// kernels.h: the C entry points of the hand-written CUDA kernels (kernels/*.cu), one per
// backend.h op (for lmhead_xent: the step between its GEMMs). Each takes the op's arguments
// (same order and meaning as in backend.h; `void *` = bf16 device tensor, `float *` = fp32
// device tensor) followed by the stream, and returns 0 or -1 with ft_error() set naming the
// op. All are asynchronous on `stream` except ftk_sum_squares, which returns its result to
// the host and so synchronises the stream. The same sources run on the CPU under the
// emulator (tests/cuda_emu) and compile for sm_80/sm_90 with nvcc (`make nvcc-check`).
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "backend.h"   // adamw_params

struct CUstream_st;                   // cudaStream_t is `struct CUstream_st *`
typedef struct CUstream_st *ftk_stream;

// embedding.cu
int ftk_embedding_fwd(void *out, const int32_t *tokens, const void *wte, int N, int C, int V,
                      ftk_stream stream);
// dwte bf16, or fp32 when dw_f32 (likewise rmsnorm_bwd's dweight)
int ftk_embedding_bwd(void *dwte, int dw_f32, const void *dout, const int32_t *tokens, int N, int C,
                      int V, ftk_stream stream);
// rmsnorm.cu
// amax: NULL, or one fp32 = max |out| (backend.h rmsnorm_fwd, swiglu_fwd); zeroed first
int ftk_rmsnorm_fwd(void *out, float *rstd, float *amax, const void *inp, const void *weight, int N, int C,
                    float eps, ftk_stream stream);
int ftk_rmsnorm_bwd(void *dinp, void *dweight, int dw_f32, const void *dout, const void *inp,
                    const void *weight, const float *rstd, int N, int C, ftk_stream stream);
// rope.cu
// seg (B, T) int32 device memory or NULL: segment starts, position t - seg[b, t] (backend.h)
int ftk_rope_fwd(void *out, const void *inp, const float *cos, const float *sin, int B, int T,
                 int NH, int D, const int32_t *seg, ftk_stream stream);
int ftk_rope_bwd(void *dinp, const void *dout, const float *cos, const float *sin, int B, int T,
                 int NH, int D, const int32_t *seg, ftk_stream stream);
// q (B, T, H, D), k, v (B, T, KVH, D) from the fused projection qkv (B, T, (H + 2 KVH) D):
// q and k rotated, v copied; the backward gathers dqkv from dq, dk (rotated back) and dv;
// cos = sin = NULL: the split / gather without rotation
int ftk_rope_qkv_fwd(void *q, void *k, void *v, const void *qkv, const float *cos,
                     const float *sin, int B, int T, int H, int KVH, int D, const int32_t *seg,
                     ftk_stream stream);
int ftk_rope_qkv_bwd(void *dqkv, const void *dq, const void *dk, const void *dv,
                     const float *cos, const float *sin, int B, int T, int H, int KVH, int D,
                     const int32_t *seg, ftk_stream stream);
// attention.cu (head dim D <= 128). Forward and backward use tensor cores (wmma) when
// D % 16 == 0, the SIMT kernels otherwise; ftk_attention_set_tensor_cores(0) forces SIMT
// (tests, comparisons), (1) restores the default. The tensor-core backward takes a bf16 dS
// workspace of up to 32 MiB from ftk_scratch_get (more when one kv head of one sequence
// needs more: group * ceil16(T)^2 * 2 bytes); ftk_attention_set_ds_cap(bytes) changes that
// cap (tests: 1 = one kv head of one sequence per launch), 0 restores it. Process-wide, not
// thread-safe. seg (B, T) int32 device memory or NULL: segment starts (backend.h), query t
// sees keys seg[b, t] .. t only.
void ftk_attention_set_tensor_cores(int on);
void ftk_attention_set_ds_cap(size_t bytes);
int ftk_attention_fwd(void *out, float *lse, const void *q, const void *k, const void *v, int B,
                      int T, int H, int KVH, int D, const int32_t *seg, ftk_stream stream);
int ftk_attention_bwd(void *dq, void *dk, void *dv, const void *dout, const void *out,
                      const float *lse, const void *q, const void *k, const void *v, int B, int T,
                      int H, int KVH, int D, const int32_t *seg, ftk_stream stream);
// lmhead_xent.cu: the softmax + cross-entropy step of backend.h's lmhead_xent, between the
// backend's cuBLASLt GEMMs, for one chunk of rows: losses (rows) from logits (rows, V) fp32;
// when `backward`, the logits are overwritten in place by bf16 softmax - onehot(target)
// (not scaled by dloss: the GEMMs do that) of row stride 2V elements (row r's values in
// the first half of its fp32 bytes), 0 on ignored rows.
int ftk_lmhead_xent_rows(float *losses, float *logits, const int32_t *targets, int rows, int V,
                         int backward, ftk_stream stream);
// swiglu.cu: gate/up (and dgate/dup) (N, F) at row stride ld, out/dout (N, F) contiguous
int ftk_swiglu_fwd(void *out, float *amax, const void *gate, const void *up, int N, int F, int ld,
                   ftk_stream stream);
int ftk_swiglu_bwd(void *dgate, void *dup, const void *dout, const void *gate, const void *up,
                   int N, int F, int ld, ftk_stream stream);
// scale.cu: out (n) = alpha * inp, bf16; out may alias inp
int ftk_scale(void *out, const void *inp, float alpha, size_t n, ftk_stream stream);
// adamw.cu: m, v (n) fp32, or bf16 when moments_bf16 (backend.h adamw)
int ftk_adamw(float *master, void *param, const float *grad, void *m, void *v, int moments_bf16, size_t n,
              const adamw_params *p, ftk_stream stream);
// sum_squares.cu (synchronises `stream`)
int ftk_sum_squares(double *host_out, const float *x, size_t n, ftk_stream stream);
// sum_squares_accumulate.cu: *acc (device double) += sum of x (n)^2, in double; asynchronous
int ftk_sum_squares_accumulate(double *acc, const float *x, size_t n, ftk_stream stream);
// accumulate.cu: src is bf16, or fp32 when src_f32
int ftk_accumulate(float *dst, const void *src, int src_f32, size_t n, float alpha, ftk_stream stream);
// loss_accumulate.cu: acc (2) double += {sum of valid losses (N), their count}, in row order
int ftk_loss_accumulate(double *acc, const float *losses, const int32_t *targets, int N, ftk_stream stream);
// cast.cu
int ftk_cast_from_f32(void *dst, const float *src, size_t n, ftk_stream stream);
// fp8_quantize.cu: inp (rows, cols) bf16 -> out (rows, cols) and/or out_t (cols, rows) FP8 codes
// (one byte each; either may be NULL), stats (3) fp32 = {amax, scale, 1 / scale}; fmt 0 e4m3,
// 1 e5m2 (fp8.h's fp8_format). Takes (G) floats of scratch (scratch.cu).
int ftk_fp8_quantize(void *out, void *out_t, float *stats, const void *inp, int rows, int cols, int fmt,
                     ftk_stream stream);
// the same with the amax given (one fp32, device memory: rmsnorm_fwd's or swiglu_fwd's of inp):
// no pass over inp for it, no scratch; stats and codes as ftk_fp8_quantize's when it is max |inp|
int ftk_fp8_cast(void *out, void *out_t, float *stats, const float *amax, const void *inp, int rows, int cols,
                 int fmt, ftk_stream stream);
// scratch.cu: workspace of the kernels that need some (attention_bwd, rmsnorm_bwd,
// sum_squares, sum_squares_accumulate) comes from `alloc`/`release` once set (the backend's arena), else from
// cudaMallocAsync. Set it before launching; NULLs restore the default.
void ftk_set_scratch_allocator(void *(*alloc)(size_t nbytes), void (*release)(void *p));

#ifdef __cplusplus
}
#endif
