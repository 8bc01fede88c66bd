// backend_cuda.h: the CUDA backend (src/backend_cuda.c, built with the CUDA toolkit only).
// Reached through backend_open("cuda", ...) in backend.h; comm_nccl.c uses the stream.
#pragma once
#include <stddef.h>

#include "backend.h"

// Number of CUDA devices, or -1 with a clear "no usable GPU" error (no driver, no device).
int backend_cuda_device_count(int *count);
// Make device local_rank modulo the visible GPUs current (*device: its index) without opening
// the backend: NCCL communicators are created on it before the arena is sized. local_rank:
// the rank's place among its node's ranks that see the same GPUs (launch.c). 0 / -1.
int backend_cuda_select_device(int local_rank, int *device);
// Total memory (bytes) and name of device local_rank modulo the visible GPUs, read without
// selecting it or opening the backend (--auto's fit, launch.c, before the arena is sized).
// name: at least 64 bytes. 0 / -1 (no usable GPU).
int backend_cuda_device_memory(int local_rank, size_t *total_bytes, char *name, size_t name_len);
// Bytes free on the current device now (cudaMemGetInfo): the bootstrap line's measure of the
// memory NCCL's communicators took (free before them minus free after). 0 / -1.
int backend_cuda_free_bytes(size_t *free_bytes);
// Open the device of this local rank and its arena (arena_bytes; 0 = 92% of free memory,
// checked against what is free now, after the NCCL communicators took theirs).
int backend_cuda_open(int local_rank, size_t arena_bytes, const backend **out);
// The table's lifecycle entries (callers use backend_close / backend_describe /
// backend_peak_tflops from backend.h): release the device; "cuda device 0 (NVIDIA H100 ...,
// sm_90, arena ...)" once open; the published dense bf16 tensor-core peak of the open device
// by name (A100 312, H100 SXM/H200 989, H100 PCIe 756 TFLOP/s), or 0 when the name is not
// one of these.
void backend_cuda_close(void);
const char *backend_cuda_describe(void);
double backend_cuda_peak_tflops(void);
// GEMM plans (cuBLASLt descriptors + algorithm) the backend keeps; a new shape beyond this
// evicts the least recently used one.
#define BACKEND_CUDA_GEMM_PLANS 256
// 1 when the open device has FP8 tensor cores (compute capability 8.9 or newer: the FP8
// GEMMs of matmul_fp8 run there), else 0 (also when not open).
int backend_cuda_fp8_capable(void);
// For tests: plans cached now and evictions since open.
void backend_cuda_gemm_stats(int *cached, long *evictions);
// Attention implementation of the next open (`--attention`): "cudnn" (cuDNN's flash attention,
// used when its plan builds and the startup check agrees with the native kernels; otherwise one
// warning line and native) or "native" (kernels/attention.cu). 0, or -1 with ft_error naming
// the flag for any other value. `deterministic` (--deterministic): cuDNN's backward plans use
// its deterministic graph (attention_cudnn.h, attn_key.det).
int backend_cuda_set_attention(const char *mode, int deterministic);
// What attention runs on now: "cudnn" or "native".
const char *backend_cuda_attention(void);
// For tests: switch the open backend's attention to cuDNN (1: only when its startup check
// passed; else -1 with ft_error) or to the native kernels (0).
int backend_cuda_attention_use(int cudnn);
// The compute stream (a cudaStream_t) every op runs on; NULL before open.
void *backend_cuda_stream(void);
