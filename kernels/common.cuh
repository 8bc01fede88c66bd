// common.cuh: what every kernel file shares. With nvcc it includes the CUDA headers; on the
// host (no __CUDACC__) it includes the CPU emulator, tests/cuda_emu/cuda_emu.h, so the same
// source runs under the emulator in the tests.
//
// Conventions of the launch functions (declared in kernels.h, called by the CUDA backend):
//   - Same arguments as the backend.h op, plus the stream last; `void *` tensors are bf16
//     device pointers, `float *` fp32. Return 0, or -1 with ft_error() naming the op.
//   - bf16 storage, fp32 math; 16-byte vector loads (8 bf16 / 4 fp32) when every pointer
//     involved is 16-byte aligned and the row/element count allows, scalar code otherwise.
//   - Deterministic: no float atomics; every reduction has a fixed order for given shapes.
#pragma once

#if defined(__CUDACC__)
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <mma.h>   // nvcuda::wmma (the emulator has its own, tests/cuda_emu/cuda_emu_wmma.h)
// LAUNCH_KERNEL(grid, block, smem, stream, kernel)(args...): the emulator maps it onto its
// scheduler; here it is the usual triple-chevron launch.
#define LAUNCH_KERNEL(grid, block, smem, stream, ...) __VA_ARGS__<<<(grid), (block), (smem), (stream)>>>
// dynamic shared memory as `T *name` (128-byte aligned: wmma needs 32)
#define DYNAMIC_SMEM(T, name)                                      \
    extern __shared__ __align__(128) unsigned char ft_dyn_smem_[]; \
    T *name = reinterpret_cast<T *>(ft_dyn_smem_)
#else
#include "cuda_emu.h"
#endif

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

typedef __nv_bfloat16 bf16;

extern "C" int ft_error(const char *fmt, ...);

// after a launch: 0, or -1 with the op named
static inline int launch_check(const char *op) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return ft_error("%s: CUDA launch failed: %s", op, cudaGetErrorString(e));
    return 0;
}
static inline int cuda_check(cudaError_t e, const char *op, const char *what) {
    if (e != cudaSuccess) return ft_error("%s: %s failed: %s", op, what, cudaGetErrorString(e));
    return 0;
}

// short-lived device workspace on `stream` (kernels/scratch.cu): 0, or -1 with op named
int ftk_scratch_get(void **p, size_t nbytes, ftk_stream stream, const char *op);
void ftk_scratch_put(void *p, ftk_stream stream);

static inline bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }
static inline unsigned ceil_div(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }

// grid size for grid-stride element-wise kernels: enough blocks to fill a large GPU, capped
// (the result never depends on it: each element is independent)
static inline unsigned elementwise_blocks(size_t work_items, unsigned threads) {
    size_t b = (work_items + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > 65535) b = 65535;
    return (unsigned)b;
}

// ---------------------------------------------------------------- device helpers

__device__ __forceinline__ float bf2f(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ bf16 f2bf(float x) { return __float2bfloat16_rn(x); }

// 8 bf16 <-> one uint4 (16 bytes)
__device__ __forceinline__ void load8(float out[8], const bf16 *p) {
    uint4 u = *reinterpret_cast<const uint4 *>(p);
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = __bfloat1622float2(h[i]);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
    }
}
__device__ __forceinline__ void store8(bf16 *p, const float v[8]) {
    uint4 u;
    __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&u);
#pragma unroll
    for (int i = 0; i < 4; i++) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    *reinterpret_cast<uint4 *>(p) = u;
}
__device__ __forceinline__ void load4f(float out[4], const float *p) {
    float4 f = *reinterpret_cast<const float4 *>(p);
    out[0] = f.x; out[1] = f.y; out[2] = f.z; out[3] = f.w;
}
__device__ __forceinline__ void store4f(float *p, const float v[4]) {
    *reinterpret_cast<float4 *>(p) = make_float4(v[0], v[1], v[2], v[3]);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Reduce over the block with a warp reduction (warp_sum, warp_max) whose identity is `id`
// (blockDim.x a multiple of 32, <= 1024); every thread gets the result. `scratch` is 32
// floats of shared memory; the function has two __syncthreads, so it can be called
// repeatedly with the same scratch.
template <float (*WARP_OP)(float)>
__device__ __forceinline__ float block_reduce(float v, float *scratch, float id) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    v = WARP_OP(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < nwarps ? scratch[lane] : id;
    t = WARP_OP(t);
    __syncthreads();
    return t;
}
// sum and max over the block (block_reduce's rules)
__device__ __forceinline__ float block_sum(float v, float *scratch) { return block_reduce<warp_sum>(v, scratch, 0.0f); }
__device__ __forceinline__ float block_max(float v, float *scratch) { return block_reduce<warp_max>(v, scratch, -INFINITY); }

// An output's amax (max |y| over the tensor, --fp8's scale, backend.h rmsnorm_fwd): *amax (one
// fp32, device memory, zeroed by amax_zero before the launch) = max(*amax, the block's max of
// m). Every thread's m is a max from 0 of |y| (fmaxf: NaNs do not count), so it is >= 0 and
// its bits order as its value: the integer atomicMax is exact and order-free (deterministic).
__device__ __forceinline__ void block_amax_publish(float *amax, float m, float *scratch) {
    m = block_max(m, scratch);
    if (threadIdx.x == 0) atomicMax(reinterpret_cast<int *>(amax), __float_as_int(m));
}
// *amax = 0 on `stream` (nothing when amax is NULL): 0, or -1 with op named
static inline int amax_zero(float *amax, ftk_stream stream, const char *op) {
    return amax ? cuda_check(cudaMemsetAsync(amax, 0, sizeof(float), stream), op, "cudaMemsetAsync (amax)") : 0;
}
