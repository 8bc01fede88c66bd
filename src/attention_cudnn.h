// attention_cudnn.h: causal scaled dot-product attention (GQA, bf16 I/O, fp32 logsumexp) through
// cuDNN's graph API, behind a small C interface used by the CUDA backend (src/backend_cuda.c,
// `--attention cudnn`). This is the front (src/attention_cudnn.c): a bounded cache of built
// plans per shape, least recently used evicted, the workspace taken from the caller's
// allocator around each call, and the startup check against the native kernels
// (attn_cudnn_selfcheck). It drives an engine (src/attn_engine.h) that builds and runs one
// graph per shape: src/attention_cudnn_graph.c in the CUDA build (the cuDNN backend C API),
// tests/cuda_emu/attention_cudnn_emu.cpp in the emulated build.
// Layouts are those of backend.h's attention ops: q, out, dq, dout (B, T, H, D); k, v, dk, dv
// (B, T, KVH, D); lse (B, H, T) fp32, natural-log logsumexp of each query row's scaled scores
// (scale 1/sqrt(D)); query head h uses kv head h / (H / KVH).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "backend.h"

// ----------------------------------------------------------------------------
// the front

// Plans the front keeps (forward and backward count separately); a new shape beyond this
// evicts the least recently used one (draining the stream, then NVRTC-compiling the new
// plan: 0.3-0.45 s). 128: the training lengths of --seq_len 8192 (40 buckets, forward and
// backward: 80) plus sampling's forward at its own batch size (40) fit, so a job does not
// cycle through evictions every step (64 held 4096's 32 lengths, not 8192's 40).
#define ATTN_CUDNN_PLANS 128

// Workspace the memory plan reserves for one attention call (src/plan.c), in bytes: the fp32
// dQ accumulator (B, H, T, D) and the fp32 row sums of dO * O (B, H, T) the backward graph keeps
// in memory, once more the dQ accumulator's size for the engine's own workspace (with GQA it
// holds per-query-head dK and dV: 2 x B H T D bf16), and 16 MiB of slack; `det` (the
// deterministic backward) adds the bf16 dP the engine keeps instead of summing dQ: B H T^2 x 2
// (planned with cuDNN 9.19 for an H100: 7B at B 1, T 512: 16 MiB + 256 bytes; T 4096, GQA
// 32/8: 1 GiB + 64 MiB; tests/test_cudnn_plan.c). A plan asking for more fails to build (the
// caller falls back to native) instead of overrunning the arena.
static inline size_t attn_cudnn_workspace_bound(int B, int T, int H, int KVH, int D, int det) {
    (void)KVH;
    const size_t rows = (size_t)B * (size_t)H * (size_t)T;
    return 2 * rows * (size_t)D * sizeof(float) + rows * sizeof(float) + ((size_t)16 << 20) +
           (det ? rows * (size_t)T * 2 : 0);
}

// Open the front over an opened engine's stream; alloc / release carve each call's workspace
// (the backend's arena: stream-ordered reuse is safe on the one compute stream). 0 / -1.
int attn_cudnn_open(void *stream, void *(*alloc)(size_t), void (*release)(void *));
// Destroy every cached plan and close the engine.
void attn_cudnn_close(void);
// The backend table's attention_fwd / attention_bwd (backend.h) through cached plans. 0 / -1.
int attn_cudnn_fwd(void *out, float *lse, const void *q, const void *k, const void *v, int B, int T, int H, int KVH,
                   int D);
int attn_cudnn_bwd(void *dq, void *dk, void *dv, const void *dout, const void *out, const float *lse, const void *q,
                   const void *k, const void *v, int B, int T, int H, int KVH, int D);
// For tests: plans cached now and evictions since open.
void attn_cudnn_stats(int *cached, long *evictions);
// Plans built (startup check included) and evicted since open.
void attn_cudnn_counts(long *built, long *evicted);
// Build now the forward and backward plans of B rows at each of the n lengths `lens` (H, KVH,
// D), so that no plan is built inside the step loop. A cache too small for them (or a test's
// lower limit) grows to hold them with the plans cached now (*grown = its new size, else 0);
// *built = plans built (those cached already are not).
// 0, or -1 with ft_error naming the shape (the caller falls back to the native kernels).
int attn_cudnn_prepare(int B, const int *lens, int n, int H, int KVH, int D, int *built, int *grown);
// For tests: hold at most n plans (1 .. ATTN_CUDNN_PLANS; kept across open / close), so that
// the eviction path runs without building ATTN_CUDNN_PLANS plans first. With more than n
// cached, each new plan replaces the least recently used one (the count does not drop).
void attn_cudnn_set_plan_limit(int n);
// --deterministic: backward plans built from now on use the deterministic graph (attn_key.det).
void attn_cudnn_set_deterministic(int det);

// NMSE threshold of the startup check (see attention_cudnn.c for its derivation).
#define ATTN_CUDNN_CHECK_NMSE 1e-4
// The startup check: one small attention (B 2, T 37, H 4, KVH 2, D 64: odd length, GQA)
// through cuDNN and through `native` (the backend table with its native attention ops; its
// alloc / copy / free are used for the buffers), comparing out, lse, dq, dk, dv by NMSE.
// Returns 0 when they agree (*worst_nmse: the largest of the five NMSEs, for the bootstrap
// line); -1 with ft_error naming the reason (plan failure, or the tensor and its NMSE) when
// cuDNN must not be used.
int attn_cudnn_selfcheck(const backend *native, double *worst_nmse);
