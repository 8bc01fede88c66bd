// attn_engine.h: the attention engine interface: build, run and destroy one graph of causal
// scaled dot-product attention (GQA, bf16 I/O, fp32 logsumexp) per (shape, direction). The
// front (src/attention_cudnn.h) caches the graphs and hands each call its workspace. Two
// implementations with the same signatures and layouts:
//   - src/attention_cudnn_graph.c in the CUDA build: cuDNN's backend C API (a matmul +
//     pointwise + reduction operation graph);
//   - tests/cuda_emu/attention_cudnn_emu.cpp in the emulated build: a CPU stand-in, so the
//     front and everything around it run in CI without a GPU.
// Layouts are those of backend.h's attention ops: q, out, dq, dout (B, T, H, D); k, v, dk, dv
// (B, T, KVH, D); lse (B, H, T) fp32, natural-log logsumexp of each query row's scaled scores
// (scale 1/sqrt(D)); query head h uses kv head h / (H / KVH).
#pragma once
#include <stddef.h>

typedef struct {
    int B, T, H, KVH, D;
    int bwd;   // 0: forward (out, lse); 1: backward (dq, dk, dv)
    int det;   // backward: 1 = the deterministic graph (dQ = dS K straight into dq, dP in the
               // engine's workspace), 0 = dQ summed in an fp32 accumulator (faster, not
               // bitwise reproducible); always 0 for the forward
} attn_key;

typedef struct attn_graph attn_graph;   // opaque: the engine's built plan

// The oldest cuDNN the graphs of src/attention_cudnn_graph.c are written for: 9.16. Older
// versions need what the cuDNN frontend adds for them and these graphs do not (before 9.6 the
// caller zeroes the dQ accumulator, before 9.10 the causal mask value must be the lowest
// finite number, not -inf; a backward whose T is not a multiple of 128 had an invalid memory
// access without a padding mask until 9.15.1: cuDNN frontend 1.16.0's release notes, and
// cudnn-frontend's SDPA node). Older ones get the native kernels (attn_cudnn_open refuses
// them: the backend warns once).
#define ATTN_CUDNN_MIN_VERSION 91600

// The cuDNN version at run time (cudnnGetVersion: 9.16.0 = 91600; the emulated build's
// stand-in reports FT_EMU_CUDNN_VERSION, default 91900); the real engine first loads the
// libraries cuDNN would otherwise abort without. 0 / -1 (ft_error).
int attn_engine_version(size_t *version);
// The file the engine's library was loaded from (libcudnn.so.9's path; the emulated build's
// executable), or "not loaded" before attn_engine_version / attn_engine_open loaded it.
const char *attn_engine_library(void);
// The Python whose nvidia-cudnn wheel the library came from (none on the library path), else
// NULL. The engine prints nothing itself: src/launch.c names the file once, on rank 0.
const char *attn_engine_wheel_python(void);
// Open the engine on `stream` (a cudaStream_t): the cuDNN handle. 0 / -1 (ft_error; also when
// a library cuDNN loads on its first call is missing, which would otherwise abort the process).
int attn_engine_open(void *stream);
// Release what attn_engine_open created (safe after a partial failure, and when not open).
void attn_engine_close(void);
// Build the graph of `key`; *workspace = device bytes its execution needs (the engine's own
// workspace plus the fp32 intermediates the graph keeps in memory). 0, or -1 with ft_error
// naming the shape and cuDNN's reason (the caller then falls back to the native kernels).
int attn_engine_build(const attn_key *key, attn_graph **out, size_t *workspace);
// Destroy a built graph (NULL is a no-op). Safe while work that used it is still queued: it
// first waits for the stream (polled under --collective_timeout, cuda_wait_stream). 0, or -1
// with ft_error when that wait failed; the graph is then left as it is (not freed).
int attn_engine_destroy(attn_graph *g);
// Enqueue the forward: out (B, T, H, D), lse (B, H, T) from q, k, v. 0 / -1.
int attn_engine_fwd(attn_graph *g, void *out, float *lse, const void *q, const void *k, const void *v,
                    void *workspace);
// Enqueue the backward: dq, dk, dv overwritten. 0 / -1.
int attn_engine_bwd(attn_graph *g, void *dq, void *dk, void *dv, const void *dout, const void *out, const float *lse,
                    const void *q, const void *k, const void *v, void *workspace);
