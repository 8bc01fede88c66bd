// sum_squares.cuh: the deterministic two-pass sum of squares shared by sum_squares.cu (the
// result to the host) and sum_squares_accumulate.cu (added into a device double). Static:
// each including file gets its own copy of the kernels.
//   pass 1: G = ss_blocks(n) blocks of 256 threads; thread t of block b owns the 4-element
//     groups b*256 + t, + G*256, ... (float4 loads when x is 16-byte aligned, the same groups
//     element by element otherwise) and accumulates x*x in double; warp-shuffle tree, then
//     the 8 warp sums in order -> partial[b] (double).
//   pass 2: one block of 256 threads: strided partial sums, the same tree -> *out (= or +=).
//   The order depends only on n (not on the GPU, the pointer's alignment or timing).
//   numerics: products exact in double, double accumulation: ~1e-16 relative.
#pragma once
#include "common.cuh"

#define SS_THREADS 256
#define SS_MAX_BLOCKS 1024

// pass 1's block count for n > 0 elements
static inline int ss_blocks(size_t n) {
    const size_t g = (n + (size_t)SS_THREADS * 32 - 1) / ((size_t)SS_THREADS * 32);
    return (int)(g < SS_MAX_BLOCKS ? g : SS_MAX_BLOCKS);
}

static __device__ __forceinline__ double block_sum_d(double v, double *scratch) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    v = warp_sum_d(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    double t = 0.0;
    for (int w = 0; w < nwarps; w++) t += scratch[w];   // same order in every thread
    __syncthreads();
    return t;
}

static __global__ void __launch_bounds__(SS_THREADS)
sum_squares_partial_kernel(double *partial, const float *x, size_t n, int vec) {
    __shared__ double scratch[32];
    const size_t ngroups = (n + 3) / 4;
    double s = 0.0;
    for (size_t gi = (size_t)blockIdx.x * blockDim.x + threadIdx.x; gi < ngroups;
         gi += (size_t)gridDim.x * blockDim.x) {
        const size_t i = gi * 4;
        if (vec && i + 4 <= n) {
            float v[4];
            load4f(v, x + i);
#pragma unroll
            for (int k = 0; k < 4; k++) s += (double)v[k] * v[k];
        } else {
            for (size_t k = i; k < i + 4 && k < n; k++) s += (double)x[k] * x[k];
        }
    }
    s = block_sum_d(s, scratch);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// *out = (add: *out +) the sum of partial (G)
static __global__ void __launch_bounds__(SS_THREADS)
sum_squares_final_kernel(double *out, const double *partial, int G, int add) {
    __shared__ double scratch[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < G; i += blockDim.x) s += partial[i];
    s = block_sum_d(s, scratch);
    if (threadIdx.x == 0) *out = add ? *out + s : s;
}

// Both passes over x (n > 0) on `stream`: *out = (add: *out +) sum x^2, out a device double.
// The partials' workspace (G doubles) comes from ftk_scratch_get and goes back behind the
// kernels (stream-ordered). `op` names the op in errors. 0 or -1 with ft_error.
static inline int ss_launch(double *out, int add, const float *x, size_t n, ftk_stream stream, const char *op) {
    const int G = ss_blocks(n);
    double *ws = NULL;
    if (ftk_scratch_get((void **)&ws, sizeof(double) * G, stream, op) != 0) return -1;
    LAUNCH_KERNEL(dim3(G), dim3(SS_THREADS), 0, stream, sum_squares_partial_kernel)(ws, x, n, (int)aligned16(x));
    int rc = launch_check(op);
    if (rc == 0) {
        LAUNCH_KERNEL(dim3(1), dim3(SS_THREADS), 0, stream, sum_squares_final_kernel)(out, ws, G, add);
        rc = launch_check(op);
    }
    ftk_scratch_put(ws, stream);
    return rc;
}
