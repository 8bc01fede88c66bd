// backend.h: the one backend interface. The model, the FSDP schedule and the training loop
// are written once over this table; the CPU backend (backend_cpu.c, fp32, the numerical
// oracle) and the CUDA backend (kernels/, bf16 storage, fp32 math) fill it.
//
// Conventions for every op:
//   - Returns 0, or -1 with ft_error set naming the op (e.g. a failed CUDA launch).
//   - `void *` tensors live in the backend's memory, in the backend's storage dtype
//     (`backend.dtype`: ST_F32 on CPU, ST_BF16 on CUDA). `float *` tensors are always fp32
//     (statistics, losses, optimizer state); `int32_t *` are token ids / targets.
//   - N = B*T rows; C = hidden; H/KVH = query/key-value heads; D = head dim; F = MLP
//     width; V = vocab. Row-major, last dimension contiguous. Shapes are in comments.
//   - "+=" in a contract means the op accumulates into its output; otherwise it overwrites.
//   - A parameter gradient (dwte, dweight) is in dtype `gdt`: the storage dtype (a
//     micro-batch's unit gradient, reduced afterwards) or ST_F32 (the step's fp32 gradient
//     itself, added into directly when nothing is reduced: one shard, src/fsdp.c). The CPU
//     backend stores fp32 only, so both are ST_F32 there.
//   - Ops are deterministic: same inputs, same bits (no float atomics in reductions).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "fp8.h"

// The fused lm_head + cross-entropy op materialises the (N, V) logits `chunk_rows` rows at a
// time; the memory plan picks the chunk (model_lmhead_chunk_rows, src/model.h): as many rows
// as fit in LMHEAD_CHUNK_BYTES of fp32 logits, at most LMHEAD_CHUNK_ROWS_MAX.
#define LMHEAD_CHUNK_ROWS_MAX 2048
#define LMHEAD_CHUNK_BYTES ((size_t)256 << 20)

// Independent asynchronous copies in flight at once (backend.copy_async's and upload's
// tickets): 0 .. 3 --offload_optimizer's (src/fsdp.c), BACKEND_TICKET_UPLOAD and the one after
// it the model's two micro-batch staging slots (src/model.c).
#define BACKEND_COPY_TICKETS 6
#define BACKEND_TICKET_UPLOAD 4

typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    float bias_correction1;   // 1 - beta1^step
    float bias_correction2;   // 1 - beta2^step
    float grad_scale;         // gradients are multiplied by this first (clipping)
    // bf16 moments only (stochastic rounding, src/bf16_sr.h): the random bits of element i
    // hash (seed, step, the moment, offset + i); fp32 moments ignore them
    uint32_t seed;            // --seed
    uint32_t step;            // the optimizer step, 1-based
    uint64_t offset;          // index of the slice's element 0 among the parameters (no padding)
} adamw_params;

typedef struct backend backend;
struct backend {
    const char *name;        // "cpu" or "cuda"
    st_dtype dtype;          // storage dtype of params, activations and their grads
    // Sequence bucket: the model runs a micro-batch (training, eval, sampling) at its
    // longest row rounded up to a bucket boundary, capped at the allocated length (see
    // backend_seq_len). 1 = exact trimming (CPU: no per-shape cost); a GPU backend caches a
    // GEMM plan and a cuDNN attention plan per shape, so it buckets to keep the shapes few:
    // multiples of seq_bucket up to 16 x seq_bucket, then 8 lengths per doubling (64: 16
    // lengths up to 1024, 32 up to 4096, 40 up to 8192).
    int seq_bucket;
    // The largest head_dim attention_fwd / attention_bwd take as the backend stands now (after
    // its startup choices: a GPU backend whose cuDNN attention did not start runs the native
    // kernels, ATTN_NATIVE_MAX_HEAD_DIM), 0 = any; NULL = any (the CPU).
    int (*attention_max_head_dim)(void);
    // Build ahead whatever per-shape state attention keeps (the GPU's cuDNN plans) for
    // micro-batches of B rows at every length backend_seq_len gives up to T, forward and
    // backward, so that nothing is built inside the step loop. *built = plans built;
    // *grown = the plan cache's new size when it had to grow to hold them, else 0. 0 / -1
    // (only when no fallback is left). NULL = nothing to build (the CPU).
    int (*attention_prepare)(int B, int T, int H, int KVH, int D, int *built, int *grown);
    // Attention plans built and evicted since open (NULL: the backend keeps none).
    void (*attention_plan_counts)(long *built, long *evicted);

    // ---------------------------------------------------------------- lifecycle
    void (*close)(void);                 // release what opening acquired (device, arena, handles)
    const char *(*describe)(void);       // one line naming the device, for the resolved-config print
    double (*peak_tflops)(void);         // published dense bf16 peak in TFLOP/s, 0 when unknown
    // A GPU backend's one device arena: its bytes and its high-water mark (the highest end
    // offset it ever handed out, arena.h's top): what of the planned arena the job reached.
    // NULL: no arena (the CPU).
    void (*arena_usage)(size_t *capacity, size_t *high_water);

    // ---------------------------------------------------------------- memory
    void *(*alloc)(size_t nbytes);                      // NULL + ft_error on failure
    void (*free)(void *p);
    int (*copy_h2d)(void *dst, const void *src, size_t nbytes);
    int (*copy_d2h)(void *dst, const void *src, size_t nbytes);
    int (*copy_d2d)(void *dst, const void *src, size_t nbytes);
    int (*zero)(void *p, size_t nbytes);
    int (*synchronize)(void);
    // Host memory the device copies to and from asynchronously (--offload_optimizer's
    // master weights, moments and staging): page-locked on a GPU, plain malloc on the CPU.
    void *(*host_alloc)(size_t nbytes);                 // NULL + ft_error on failure
    void (*host_free)(void *p);
    // Asynchronous copy between host memory from host_alloc and backend memory, ordered
    // after all work issued so far (a copy stream on a GPU, so it overlaps what the host
    // and the compute stream do next); to_device 1: dst is backend memory, src host memory;
    // 0: the reverse. `ticket` (0 .. BACKEND_COPY_TICKETS - 1) names the copy: an earlier
    // copy under the same ticket is waited for first. Neither buffer may be touched until
    // copy_wait(ticket). The CPU copies at once.
    int (*copy_async)(void *dst, const void *src, size_t nbytes, int to_device, int ticket);
    // Wait for the copy under `ticket` (none outstanding: nothing): the host may then read
    // or reuse its host buffer, and work issued after this call sees its device result.
    int (*copy_wait)(int ticket);
    // Asynchronous copy from host memory from host_alloc to backend memory, queued on the
    // compute stream after all work issued so far (work issued after it sees what it wrote);
    // the host does not wait. Uploads under one ticket add up: copy_wait(ticket) waits for
    // all of them, and their host buffers may not be touched before it. NULL where copy_h2d
    // costs no wait (the CPU): the model then copies with copy_h2d.
    int (*upload)(void *dst, const void *src, size_t nbytes, int ticket);

    // ---------------------------------------------------------------- layers
    // out (N, C) = wte (V, C)[tokens (N)]
    int (*embedding_fwd)(void *out, const int32_t *tokens, const void *wte, int N, int C, int V);
    // dwte (V, C, gdt) += scatter of dout (N, C) by tokens (N)
    int (*embedding_bwd)(void *dwte, st_dtype gdt, const void *dout, const int32_t *tokens, int N, int C, int V);

    // out (N, C) = inp * rsqrt(mean(inp^2) + eps) * weight (C); rstd (N) saved for backward.
    // amax: NULL, or one fp32 (backend memory) = max |out| over the stored values (NaNs do
    // not count), exactly what fp8_quantize(out) would find: --fp8 takes its scale from it
    // (fp8_cast) instead of reading the tensor again. Computed on the device.
    int (*rmsnorm_fwd)(void *out, float *rstd, float *amax, const void *inp, const void *weight,
                       int N, int C, float eps);
    // dinp (N, C) += d/dinp, dweight (C, gdt) += d/dweight, given dout (N, C)
    int (*rmsnorm_bwd)(void *dinp, void *dweight, st_dtype gdt, const void *dout, const void *inp,
                       const void *weight, const float *rstd, int N, int C);

    // Segment starts (the rope and attention ops' last argument, `seg`): NULL = one sequence
    // per row (positions 0..T-1, plain causal attention: bitwise today's results); else
    // seg (B, T) int32 in backend memory, seg[b, t] = the first position of the segment
    // (packed game) holding t: nondecreasing along a row, 0 <= seg[b, t] <= t, and
    // seg[b, t] = t or seg[b, t - 1] (--pack_attention per_game; model.c builds it). RoPE then
    // uses position t - seg[b, t], and query t attends to keys seg[b, t] .. t only.
    //
    // Rotary embedding, HF rotate_half convention, positions 0..T-1 (or t - seg[b, t]).
    // out/inp (B, T, NH, D); cos/sin (T, D/2) fp32. out may equal inp.
    int (*rope_fwd)(void *out, const void *inp, const float *cos, const float *sin,
                    int B, int T, int NH, int D, const int32_t *seg);
    // dinp/dout (B, T, NH, D): the transpose rotation. dinp may equal dout.
    int (*rope_bwd)(void *dinp, const void *dout, const float *cos, const float *sin,
                    int B, int T, int NH, int D, const int32_t *seg);
    // The same on the fused q|k|v projection: qkv (B, T, (H + 2 KVH) D) = [q | k | v] per row
    // in, q (B, T, H, D) and k (B, T, KVH, D) rotated and v (B, T, KVH, D) copied out.
    // cos = sin = NULL (both ops): no rotation, the split (gather) alone.
    int (*rope_qkv_fwd)(void *q, void *k, void *v, const void *qkv, const float *cos,
                        const float *sin, int B, int T, int H, int KVH, int D, const int32_t *seg);
    // dqkv (B, T, (H + 2 KVH) D) = [rope_bwd(dq) | rope_bwd(dk) | dv] per row (overwritten).
    int (*rope_qkv_bwd)(void *dqkv, const void *dq, const void *dk, const void *dv,
                        const float *cos, const float *sin, int B, int T, int H, int KVH, int D,
                        const int32_t *seg);

    // out (N, OC) = inp (N, IC) @ weight (OC, IC)^T      (nn.Linear without bias)
    //               + residual (N, OC) when not NULL (a residual stream, or out itself: +=)
    int (*matmul_fwd)(void *out, const void *inp, const void *weight, const void *residual,
                      int N, int IC, int OC);
    // dinp (N, IC) = (or += when accumulate_dinp) dout (N, OC) @ weight; skipped if dinp NULL
    // dweight (OC, IC, gdt) += (or = unless accumulate_dw) dout^T @ inp; skipped if dweight
    // NULL (a frozen weight)
    int (*matmul_bwd)(void *dinp, void *dweight, st_dtype gdt, const void *dout, const void *inp,
                      const void *weight, int N, int IC, int OC, int accumulate_dinp, int accumulate_dw);

    // Causal softmax attention with GQA (query head h uses kv head h / (H / KVH)),
    // scale 1/sqrt(D). q, out (B, T, H, D); k, v (B, T, KVH, D);
    // lse (B, H, T) fp32 = logsumexp of each query row's scaled scores, saved for backward.
    // seg (B, T) or NULL (above): query t sees keys seg[b, t] .. t (NULL: 0 .. t).
    int (*attention_fwd)(void *out, float *lse, const void *q, const void *k, const void *v,
                         int B, int T, int H, int KVH, int D, const int32_t *seg);
    // dq (B, T, H, D), dk, dv (B, T, KVH, D) overwritten; dout, out (B, T, H, D); seg as
    // given to the forward.
    int (*attention_bwd)(void *dq, void *dk, void *dv, const void *dout, const void *out,
                         const float *lse, const void *q, const void *k, const void *v,
                         int B, int T, int H, int KVH, int D, const int32_t *seg);

    // out (N, F) = silu(gate) * up. gate and up are (N, F) with row stride ld (>= F), so
    // they may be the two halves of the fused (N, 2F) gate|up GEMM output (gate = gu,
    // up = gu + F, ld = 2F) or two separate (N, F) buffers (ld = F). amax: NULL, or
    // max |out| as rmsnorm_fwd's.
    int (*swiglu_fwd)(void *out, float *amax, const void *gate, const void *up, int N, int F, int ld);
    // dgate, dup (N, F) with row stride ld, overwritten from dout (N, F) (contiguous);
    // dgate may alias dout when ld == F
    int (*swiglu_bwd)(void *dgate, void *dup, const void *dout, const void *gate,
                      const void *up, int N, int F, int ld);

    // out (n) = alpha * inp (one rounding to the storage dtype); out may alias inp
    int (*scale)(void *out, const void *inp, float alpha, size_t n);

    // Fused lm_head + softmax + cross-entropy over row chunks of `chunk_rows`, never holding
    // more than (chunk_rows, V) logits (in `logits_ws`, fp32).
    // x (N, C), weight (V, C), targets (N) with -100 = ignored.
    // losses (N) fp32 = -log softmax(x W^T)[target], 0 for ignored rows.
    // If dx != NULL (training): with dlogits = dloss * (softmax - onehot(target)) on valid
    // rows and 0 on ignored rows: dx (N, C) = dlogits @ weight, dweight (V, C, gdt) +=
    // dlogits^T x, summed over all chunks in fp32 and added to dweight with ONE rounding to
    // gdt. dw_acc (V, C) fp32 is the scratch for that sum: required when training with
    // N > chunk_rows into a gdt that is not fp32 (the CUDA backend's unit gradients), else
    // unused and may be NULL. A target outside [0, V) other than -100 is an error (CPU) or a NaN
    // loss (CUDA: the host validates targets). dweight NULL: a frozen lm_head (LoRA), its
    // gradient skipped (and dw_acc unused).
    int (*lmhead_xent)(float *losses, void *dx, void *dweight, st_dtype gdt, const void *x,
                       const void *weight, const int32_t *targets, int N, int C, int V,
                       float dloss, int chunk_rows, float *logits_ws, float *dw_acc);

    // ---------------------------------------------------------------- FP8 (--fp8)
    // NULL on a backend without FP8. Codes are one byte per element (fp8.h's formats).
    //
    // Per-tensor quantisation of inp (rows, cols): amax = max |inp| (NaN elements do not
    // count); scale = fp8_scale_from_amax(amax, fmt); out (rows, cols) =
    // fp8_from_float_sat(inp * scale, fmt) (an fp32 product, then one rounding: the host
    // functions of fp8.h, bit for bit); out_t (cols, rows) = the same codes transposed (the
    // layout a backward GEMM's operand needs); either may be NULL. stats (3 fp32, backend
    // memory) = {amax, scale, 1 / scale}: [2] is what the GEMM multiplies back. Computed on
    // the device: the host reads nothing.
    int (*fp8_quantize)(void *out, void *out_t, float *stats, const void *inp, int rows, int cols,
                        fp8_format fmt);
    // fp8_quantize with the amax given: *amax (one fp32, backend memory) = max |inp| as the
    // op that wrote inp computed it (rmsnorm_fwd's, swiglu_fwd's amax), read instead of
    // inp's amax pass; stats and codes then exactly fp8_quantize's (the same scale from the
    // same number). amax may be stats itself.
    int (*fp8_cast)(void *out, void *out_t, float *stats, const float *amax, const void *inp, int rows,
                    int cols, fp8_format fmt);
    // out (M, N) = a_stats[2] * b_stats[2] * a (M, K) @ b (N, K)^T (+= when accumulate), a and
    // b FP8 codes of formats a_fmt, b_fmt (e4m3 x e4m3, or one of them e5m2: gradients) with
    // the stats fp8_quantize gave them; products exact, summed in fp32 (with out's old value
    // when accumulate), one rounding to out_dtype: the storage dtype (activations), or ST_F32
    // (an fp32 parameter gradient; the CUDA backend takes ST_BF16 and ST_F32, the fp32 CPU
    // backend ST_F32 only). K a multiple of 16 (Hopper's FP8 rule). The three linear GEMMs
    // are all of this form: forward x W^T (a = x, b = W), dx = dy W (a = dy, b = W^T), dW =
    // dy^T x (a = dy^T, b = x^T; K = the token rows).
    int (*matmul_fp8)(void *out, const void *a, fp8_format a_fmt, const float *a_stats, const void *b,
                      fp8_format b_fmt, const float *b_stats, int M, int N, int K, int accumulate,
                      st_dtype out_dtype);

    // ---------------------------------------------------------------- optimizer & utils
    // AdamW on an fp32 master slice (n): g = grad * grad_scale; m,v updated; master updated
    // with decoupled weight decay; param (n, dtype) = master cast, skipped if param NULL.
    // m, v (n) in mdt: ST_F32, or ST_BF16 (--optimizer_moments bf16: read widened to fp32, the
    // math in fp32 on the unrounded values, stored with stochastic rounding whose bits come
    // from p's seed, step and offset, src/bf16_sr.h: the same bits on every backend, world
    // size and shard size); others an error.
    int (*adamw)(float *master, void *param, const float *grad, void *m, void *v, st_dtype mdt, size_t n,
                 const adamw_params *p);
    // *host_out = sum of x (n, fp32)^2, computed in double, returned to the host
    int (*sum_squares)(double *host_out, const float *x, size_t n);
    // *acc (one double, backend memory) += sum of x (n, fp32)^2, computed in double in
    // sum_squares' order for the same n (so one call on a zeroed acc gives sum_squares' value
    // bit for bit), then added once. Asynchronous on a GPU (no host wait): the gradient norm
    // taken unit by unit as each unit's slice becomes final (src/fsdp.c), read once per step.
    int (*sum_squares_accumulate)(double *acc, const float *x, size_t n);
    // dst (n, fp32) += alpha * src (n, src_dtype); src_dtype is the backend's dtype or ST_F32
    // (--reduce_dtype fp32: fp32 reduce-scatter outputs), anything else an error
    int (*accumulate)(float *dst, const void *src, st_dtype src_dtype, size_t n, float alpha);
    // dst (n, dtype) = src (n, fp32) (rounded to nearest even for bf16)
    int (*cast_from_f32)(void *dst, const float *src, size_t n);
    // acc (2, double, backend memory) += {s, c}: s = the sum of losses (N) over the rows whose
    // target (N) is not -100, in double, added in increasing row order from 0.0 (bitwise the
    // host loop `s = 0; for i: if valid: s += (double)losses[i]`), c = the number of those
    // rows. Asynchronous on a GPU (no host wait): the model's loss accumulator (model.h), read
    // once per optimizer step or evaluation instead of once per micro-batch.
    int (*loss_accumulate)(double *acc, const float *losses, const int32_t *targets, int N);

    // ---------------------------------------------------------------- pacing
    // Called after each layer's forward and backward (model.c): a device backend lets the host
    // queue at most BACKEND_PACE_LAG layers of work ahead of the device, waiting (a host wait
    // under --collective_timeout) for the point its compute stream had two calls before. So
    // the host never fills the device's launch queue (about a thousand launches), where a
    // launch blocks the host outside every deadline when the stream is stuck behind a peer's
    // collective. NULL: nothing to pace (the CPU computes as it goes).
    int (*pace)(void);
};

// How many pace() calls (layers) the host may run ahead of the device.
#define BACKEND_PACE_LAG 2

// The compute length for a micro-batch whose longest row has `len` real positions: len
// rounded up to a multiple of a step, at most `cap` (the allocated length). The step is
// be->seq_bucket while len <= 16 steps, and doubles with each doubling of len beyond that,
// so past 16 x seq_bucket the padding stays under one step, itself under len / 8, and a
// job of length L has about 16 + 8 log2(L / (16 seq_bucket)) lengths, not L / seq_bucket
// (64 at L 4096, 128 at 8192): a seq-4096 job's attention plans (32 lengths, forward and
// backward) fit the 64-plan cuDNN cache (attention_cudnn.h).
// E.g. bucket 64, cap 500: 1 -> 64, 64 -> 64, 65 -> 128, 450 -> 500; cap 8192: 1025 -> 1152,
// 2049 -> 2304, 4097 -> 4608.
static inline int backend_seq_len(const backend *be, int len, int cap) {
    long step = be->seq_bucket > 1 ? be->seq_bucket : 1;
    if (step > 1)
        while (len > 16 * step) step *= 2;
    const long r = (len + step - 1) / step * step;
    return r < cap ? (int)r : cap;
}

// The CUDA backend's seq_bucket (the planner pads --sample_tokens' inference model with it).
#define BACKEND_GPU_SEQ_BUCKET 64

// The CPU backend (always available).
const backend *backend_cpu(void);

// ----------------------------------------------------------------------------
// registry

// The backend called `device`: "cpu" (always built) or "cuda" (built when the CUDA toolkit
// was found). For cuda, `local_rank` picks the GPU and `arena_bytes` sizes the one device
// arena (0 = most of the free memory). 0, or -1 with a one-line reason (e.g. no GPU).
// Attention implementation for the GPU backend's next open (`--attention cudnn|native`, see
// backend_cuda.h; `deterministic`: --deterministic); the CPU backend has one (deterministic)
// and ignores both. 0 / -1 (ft_error naming the flag).
int backend_set_attention(const char *mode, int deterministic);
int backend_open(const char *device, int local_rank, size_t arena_bytes, const backend **out);
// The backends this binary was built with, in one line (--version).
const char *backend_build_description(void);
// be->close(), be->describe() and be->peak_tflops(), safe on NULL (a failed open): release
// what backend_open acquired; one line naming the device ("none" for NULL); the device's
// published dense bf16 peak in TFLOP/s when known (A100 312, H100 SXM 989, H100 PCIe 756),
// else 0 (the CPU, unknown GPUs): the MFU denominator.
void backend_close(const backend *be);
const char *backend_describe(const backend *be);
double backend_peak_tflops(const backend *be);
