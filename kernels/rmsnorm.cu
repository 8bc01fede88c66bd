// rmsnorm.cu: RMSNorm (HF LlamaRMSNorm) forward and backward.
//
// forward  out (N, C) = w * (x * r), r = rsqrt(mean(x^2) + eps); rstd (N) = r (fp32);
//   amax (when not NULL) = max |out| over the stored bf16 values (--fp8: the scale of the
//   linear's input, without a pass over it): zeroed, then each block's max of its row joins
//   it by an integer atomicMax (common.cuh block_amax_publish: exact, order-free)
//   launch: grid N (one block per row), T = clamp(roundup32(ceil(C / 8)), 32, 256) threads;
//   16-byte loads of 8 bf16 when C % 8 == 0 and the pointers are aligned, else scalar.
//   numerics: fp32 sum of squares (per-thread partials, then a warp-shuffle tree and a
//   fixed cross-warp order), rsqrtf (rsqrt.approx on the GPU: ~2 ulp), one bf16 rounding.
//
// backward dinp (N, C) += r * w * dy - (r^3 / C) * x * sum(w * dy * x)
//          dweight (C) += sum_n dy * x * r_n   (dweight bf16, or fp32 when dw_f32)
//   kernel 1 (dinp): one block per row as in the forward; fp32 math, one bf16 rounding of
//     (dinp + dx).
//   kernel 2 (dweight partials): grid (ceil(C / 32), ceil(N / 64)), 32 x 8 threads; each
//     block sums its 64-row chunk for 32 columns (thread rows y, y+8, ... then the 8 row
//     groups in order) into an fp32 workspace (ceil(N/64), C) from ftk_scratch_get (scratch.cu).
//   kernel 3 (dweight): one thread per column sums the chunk partials in chunk order and
//     adds to dweight with one rounding to its dtype. No atomics: bitwise deterministic.
#include "common.cuh"

#define RMS_MAX_THREADS 256
#define DW_COLS 32
#define DW_ROWGROUPS 8
#define DW_CHUNK_ROWS 64

static unsigned rms_threads(int C) {
    unsigned t = ((unsigned)(C + 7) / 8 + 31) / 32 * 32;
    return t < 32 ? 32 : (t > RMS_MAX_THREADS ? RMS_MAX_THREADS : t);
}

__global__ void __launch_bounds__(RMS_MAX_THREADS)
rmsnorm_fwd_kernel(bf16 *out, float *rstd, float *amax, const bf16 *inp, const bf16 *weight, int C,
                   float eps, int vec) {
    __shared__ float scratch[32];
    const size_t row = blockIdx.x;
    const bf16 *x = inp + row * C;
    bf16 *y = out + row * C;
    float ss = 0.0f;
    if (vec) {
        for (int c = threadIdx.x * 8; c < C; c += blockDim.x * 8) {
            float v[8];
            load8(v, x + c);
#pragma unroll
            for (int k = 0; k < 8; k++) ss += v[k] * v[k];
        }
    } else {
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float v = bf2f(x[c]);
            ss += v * v;
        }
    }
    ss = block_sum(ss, scratch);
    const float r = rsqrtf(ss / (float)C + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    float m = 0.0f;   // max |y| of this thread's stored (rounded) outputs
    if (vec) {
        for (int c = threadIdx.x * 8; c < C; c += blockDim.x * 8) {
            float v[8], w[8];
            load8(v, x + c);
            load8(w, weight + c);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                v[k] = w[k] * (v[k] * r);
                m = fmaxf(m, fabsf(bf2f(f2bf(v[k]))));
            }
            store8(y + c, v);
        }
    } else {
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            const bf16 q = f2bf(bf2f(weight[c]) * (bf2f(x[c]) * r));
            y[c] = q;
            m = fmaxf(m, fabsf(bf2f(q)));
        }
    }
    if (amax) block_amax_publish(amax, m, scratch);
}

__global__ void __launch_bounds__(RMS_MAX_THREADS)
rmsnorm_bwd_dinp_kernel(bf16 *dinp, const bf16 *dout, const bf16 *inp, const bf16 *weight,
                        const float *rstd, int C, int vec) {
    __shared__ float scratch[32];
    const size_t row = blockIdx.x;
    const bf16 *x = inp + row * C, *dy = dout + row * C;
    bf16 *dx = dinp + row * C;
    const float r = rstd[row];
    float dot = 0.0f;
    if (vec) {
        for (int c = threadIdx.x * 8; c < C; c += blockDim.x * 8) {
            float xv[8], gv[8], wv[8];
            load8(xv, x + c);
            load8(gv, dy + c);
            load8(wv, weight + c);
#pragma unroll
            for (int k = 0; k < 8; k++) dot += wv[k] * gv[k] * xv[k];
        }
    } else {
        for (int c = threadIdx.x; c < C; c += blockDim.x)
            dot += bf2f(weight[c]) * bf2f(dy[c]) * bf2f(x[c]);
    }
    dot = block_sum(dot, scratch);
    const float k = dot * r * r * r / (float)C;
    if (vec) {
        for (int c = threadIdx.x * 8; c < C; c += blockDim.x * 8) {
            float xv[8], gv[8], wv[8], dv[8];
            load8(xv, x + c);
            load8(gv, dy + c);
            load8(wv, weight + c);
            load8(dv, dx + c);
#pragma unroll
            for (int j = 0; j < 8; j++) dv[j] += r * wv[j] * gv[j] - k * xv[j];
            store8(dx + c, dv);
        }
    } else {
        for (int c = threadIdx.x; c < C; c += blockDim.x)
            dx[c] = f2bf(bf2f(dx[c]) + (r * bf2f(weight[c]) * bf2f(dy[c]) - k * bf2f(x[c])));
    }
}

// partial[chunk][c] = sum over the chunk's rows of dy * x * r
__global__ void __launch_bounds__(DW_COLS *DW_ROWGROUPS)
rmsnorm_bwd_dw_partial_kernel(float *partial, const bf16 *dout, const bf16 *inp,
                              const float *rstd, int N, int C) {
    __shared__ float acc[DW_ROWGROUPS][DW_COLS];
    const int c = blockIdx.x * DW_COLS + threadIdx.x;
    const int r0 = blockIdx.y * DW_CHUNK_ROWS;
    const int r1 = r0 + DW_CHUNK_ROWS < N ? r0 + DW_CHUNK_ROWS : N;
    float s = 0.0f;
    if (c < C)
        for (int r = r0 + threadIdx.y; r < r1; r += DW_ROWGROUPS)
            s += bf2f(dout[(size_t)r * C + c]) * bf2f(inp[(size_t)r * C + c]) * rstd[r];
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float t = 0.0f;
#pragma unroll
        for (int g = 0; g < DW_ROWGROUPS; g++) t += acc[g][threadIdx.x];
        partial[(size_t)blockIdx.y * C + c] = t;
    }
}

__global__ void rmsnorm_bwd_dw_final_kernel(void *dweight, const float *partial, int nchunks,
                                            int C, int dw_f32) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.0f;
    for (int k = 0; k < nchunks; k++) s += partial[(size_t)k * C + c];
    if (dw_f32) {
        ((float *)dweight)[c] += s;
    } else {
        bf16 *d = (bf16 *)dweight;
        d[c] = f2bf(bf2f(d[c]) + s);
    }
}

extern "C" int ftk_rmsnorm_fwd(void *out, float *rstd, float *amax, const void *inp, const void *weight,
                               int N, int C, float eps, ftk_stream stream) {
    if (amax_zero(amax, stream, "rmsnorm_fwd") != 0) return -1;
    if (N <= 0 || C <= 0) return 0;
    int vec = C % 8 == 0 && aligned16(out) && aligned16(inp) && aligned16(weight);
    LAUNCH_KERNEL(dim3(N), dim3(rms_threads(C)), 0, stream, rmsnorm_fwd_kernel)(
        (bf16 *)out, rstd, amax, (const bf16 *)inp, (const bf16 *)weight, C, eps, vec);
    return launch_check("rmsnorm_fwd");
}

extern "C" int ftk_rmsnorm_bwd(void *dinp, void *dweight, int dw_f32, const void *dout,
                               const void *inp, const void *weight, const float *rstd, int N,
                               int C, ftk_stream stream) {
    if (N <= 0 || C <= 0) return 0;
    int vec = C % 8 == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) &&
              aligned16(weight);
    LAUNCH_KERNEL(dim3(N), dim3(rms_threads(C)), 0, stream, rmsnorm_bwd_dinp_kernel)(
        (bf16 *)dinp, (const bf16 *)dout, (const bf16 *)inp, (const bf16 *)weight, rstd, C, vec);
    if (launch_check("rmsnorm_bwd") != 0) return -1;

    const int nchunks = (N + DW_CHUNK_ROWS - 1) / DW_CHUNK_ROWS;
    if (nchunks > 65535)   // gridDim.y (4.2M rows: far past any batch x seq that fits a GPU)
        return ft_error("rmsnorm_bwd: %d rows are more than %d chunks of %d", N, 65535, DW_CHUNK_ROWS);
    float *partial = NULL;
    if (ftk_scratch_get((void **)&partial, sizeof(float) * (size_t)nchunks * C, stream,
                        "rmsnorm_bwd (dweight partials)") != 0)
        return -1;
    LAUNCH_KERNEL(dim3(ceil_div(C, DW_COLS), nchunks), dim3(DW_COLS, DW_ROWGROUPS), 0, stream,
                  rmsnorm_bwd_dw_partial_kernel)(partial, (const bf16 *)dout, (const bf16 *)inp,
                                                 rstd, N, C);
    int rc = launch_check("rmsnorm_bwd (dweight partials)");
    if (rc == 0) {
        LAUNCH_KERNEL(dim3(ceil_div(C, 256)), dim3(256), 0, stream, rmsnorm_bwd_dw_final_kernel)(
            dweight, partial, nchunks, C, dw_f32);
        rc = launch_check("rmsnorm_bwd (dweight)");
    }
    ftk_scratch_put(partial, stream);
    return rc;
}
