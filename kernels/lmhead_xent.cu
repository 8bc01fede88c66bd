// lmhead_xent.cu: fused lm_head + softmax + cross-entropy (+ backward), by row chunks.
//
// For each chunk of at most LMHEAD_CHUNK_ROWS (128) rows of x (N, C), with weight (V, C):
//   1. logits (rows, V) fp32 in `workspace` = x_chunk W^T                 (SIMT GEMM)
//   2. per row: m = max, lse = m + log(sum exp(l - m)), loss = lse - l[target]; when training
//      the row is overwritten by dlogits = dloss * (softmax - onehot(target)); rows with
//      target -100 get loss 0 and dlogits 0; a target outside [0, V) gives a NaN loss
//      (the host validates targets) and dlogits 0.
//   3. if dx: dx_chunk (rows, C) = dlogits W (bf16, overwritten)           (SIMT GEMM)
//   4. dweight (V, C) += dlogits^T x_chunk (bf16 read-add-round per chunk) (SIMT GEMM)
// The full (N, V) probability tensor never exists: at most (128, V) fp32 logits.
//
// launch: the GEMMs use 32x32 output tiles, 256 threads (each 4 outputs: rows ty + 8r,
//   column tx), K in steps of 32 through two 32x33 fp32 shared tiles; operands are read
//   along their contiguous dimension (coalesced). The bf16 operands (x, W) are read 8 at a
//   time with 16-byte loads when C % 8 == 0 and x, W are 16-byte aligned (128 threads load
//   a 32x32 tile), element by element otherwise; the fp32 dlogits element by element.
//   The row kernel is one block of 256
//   threads per row (block max and sum reductions).
// numerics: fp32 GEMM accumulation in k order, exp via __expf, fp32 sums over V; losses fp32;
//   dx one bf16 rounding; dweight one bf16 rounding per chunk (N <= 128: one rounding).
#include "common.cuh"

#define GT 32                    // GEMM tile
#define GEMM_THREADS 256
#define XENT_THREADS 256

// S[r][c] = get(r, c) for a 32x32 tile; c_contig: get(r, c + 1) is the next element in
// memory, so consecutive threads take consecutive c (else consecutive r)
template <class Get>
__device__ __forceinline__ void fill_tile(float (*S)[GT + 1], bool c_contig, Get get) {
#pragma unroll
    for (int q = 0; q < GT * GT / GEMM_THREADS; q++) {
        const int e = threadIdx.x + GEMM_THREADS * q;
        const int r = c_contig ? e / GT : e % GT, c = c_contig ? e % GT : e / GT;
        S[r][c] = get(r, c);
    }
}

// S[r][c] (or S[c][r] when `transpose`) = m[(r0 + r) * ld + c0 + c] for a 32x32 tile, 0 outside
// r0 + r < nr, c0 + c < nc; one 16-byte load of 8 columns per thread (threads 0..127).
// Needs m 16-byte aligned, ld % 8 == 0, c0 % 8 == 0 and nc % 8 == 0.
template <bool transpose>
__device__ __forceinline__ void fill_tile_vec8(float (*S)[GT + 1], const bf16 *m, size_t ld,
                                               int r0, int nr, int c0, int nc) {
    const int e = threadIdx.x;
    if (e >= GT * GT / 8) return;
    const int r = e / (GT / 8), c = e % (GT / 8) * 8;
    float f[8];
    if (r0 + r < nr && c0 + c < nc) {
        load8(f, m + (size_t)(r0 + r) * ld + c0 + c);
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) f[i] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < 8; i++) {
        if (transpose) S[c + i][r] = f[i];
        else S[r][c + i] = f[i];
    }
}

// out(i, j) for i in [i0, i0+32), j in [j0, j0+32) = sum_k a(i, k) b(k, j); `done(i, j, v)`
// stores. fill_a(As, k0) sets As[i][k] = a(i, k0 + k), fill_b(Bs, k0) Bs[k][j] = b(k0 + k, j).
template <class FillA, class FillB, class Done>
__device__ __forceinline__ void gemm_tile(int K, FillA fill_a, FillB fill_b, Done done) {
    __shared__ float As[GT][GT + 1];   // As[i][k]
    __shared__ float Bs[GT][GT + 1];   // Bs[k][j]
    const int tx = threadIdx.x % GT, ty = threadIdx.x / GT;
    float acc[GT * GT / GEMM_THREADS];
#pragma unroll
    for (int r = 0; r < GT * GT / GEMM_THREADS; r++) acc[r] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += GT) {
        __syncthreads();                                   // previous tiles fully used
        fill_a(As, k0);
        fill_b(Bs, k0);
        __syncthreads();
#pragma unroll
        for (int r = 0; r < GT * GT / GEMM_THREADS; r++) {
            const int i = ty + (GEMM_THREADS / GT) * r;
            float s = acc[r];
#pragma unroll 8
            for (int k = 0; k < GT; k++) s += As[i][k] * Bs[k][tx];
            acc[r] = s;
        }
    }
#pragma unroll
    for (int r = 0; r < GT * GT / GEMM_THREADS; r++) done(ty + (GEMM_THREADS / GT) * r, tx, acc[r]);
}

// logits (rows, V) = x (rows, C) W^T; tile (blockIdx.y: rows, blockIdx.x: vocab)
__global__ void __launch_bounds__(GEMM_THREADS)
lmhead_logits_kernel(float *logits, const bf16 *x, const bf16 *w, int rows, int C, int V,
                     bool vec) {
    const int i0 = blockIdx.y * GT, j0 = blockIdx.x * GT;
    typedef float(*Tile)[GT + 1];
    gemm_tile(
        C,
        [&](Tile S, int k0) {
            if (vec) fill_tile_vec8<false>(S, x, C, i0, rows, k0, C);
            else fill_tile(S, true, [&](int i, int k) {
                return i0 + i < rows && k0 + k < C ? bf2f(x[(size_t)(i0 + i) * C + k0 + k]) : 0.0f; });
        },
        [&](Tile S, int k0) {
            if (vec) fill_tile_vec8<true>(S, w, C, j0, V, k0, C);
            else fill_tile(S, false, [&](int k, int j) {
                return j0 + j < V && k0 + k < C ? bf2f(w[(size_t)(j0 + j) * C + k0 + k]) : 0.0f; });
        },
        [&](int i, int j, float v) {
            if (i0 + i < rows && j0 + j < V) logits[(size_t)(i0 + i) * V + j0 + j] = v;
        });
}

// dx (rows, C) = dlogits (rows, V) W (V, C); tile (blockIdx.y: rows, blockIdx.x: C)
__global__ void __launch_bounds__(GEMM_THREADS)
lmhead_dx_kernel(bf16 *dx, const float *dlogits, const bf16 *w, int rows, int C, int V,
                 bool vec) {
    const int i0 = blockIdx.y * GT, j0 = blockIdx.x * GT;
    typedef float(*Tile)[GT + 1];
    gemm_tile(
        V,
        [&](Tile S, int k0) {
            fill_tile(S, true, [&](int i, int k) {
                return i0 + i < rows && k0 + k < V ? dlogits[(size_t)(i0 + i) * V + k0 + k] : 0.0f; });
        },
        [&](Tile S, int k0) {
            if (vec) fill_tile_vec8<false>(S, w, C, k0, V, j0, C);
            else fill_tile(S, true, [&](int k, int j) {
                return k0 + k < V && j0 + j < C ? bf2f(w[(size_t)(k0 + k) * C + j0 + j]) : 0.0f; });
        },
        [&](int i, int j, float v) {
            if (i0 + i < rows && j0 + j < C) dx[(size_t)(i0 + i) * C + j0 + j] = f2bf(v);
        });
}

// dweight (V, C) += dlogits^T (V, rows) x (rows, C); tile (blockIdx.y: vocab, blockIdx.x: C)
__global__ void __launch_bounds__(GEMM_THREADS)
lmhead_dweight_kernel(bf16 *dw, const float *dlogits, const bf16 *x, int rows, int C, int V,
                      bool vec) {
    const int i0 = blockIdx.y * GT, j0 = blockIdx.x * GT;
    typedef float(*Tile)[GT + 1];
    gemm_tile(
        rows,
        [&](Tile S, int k0) {
            fill_tile(S, false, [&](int i, int k) {
                return i0 + i < V && k0 + k < rows ? dlogits[(size_t)(k0 + k) * V + i0 + i] : 0.0f; });
        },
        [&](Tile S, int k0) {
            if (vec) fill_tile_vec8<false>(S, x, C, k0, rows, j0, C);
            else fill_tile(S, true, [&](int k, int j) {
                return k0 + k < rows && j0 + j < C ? bf2f(x[(size_t)(k0 + k) * C + j0 + j]) : 0.0f; });
        },
        [&](int i, int j, float v) {
            if (i0 + i < V && j0 + j < C) {
                bf16 *p = dw + (size_t)(i0 + i) * C + j0 + j;
                *p = f2bf(bf2f(*p) + v);
            }
        });
}

__device__ __forceinline__ float block_max(float v, float *scratch) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    v = warp_max(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < nwarps ? scratch[lane] : -INFINITY;
    t = warp_max(t);
    __syncthreads();
    return t;
}

// one block per row of the chunk
__global__ void __launch_bounds__(XENT_THREADS)
lmhead_xent_rows_kernel(float *losses, float *logits, const int32_t *targets, int V,
                        float dloss, int backward) {
    __shared__ float scratch[32];
    const int r = blockIdx.x;
    float *l = logits + (size_t)r * V;
    const int tgt = targets[r];
    if (tgt == -100 || tgt < 0 || tgt >= V) {              // uniform over the block
        if (threadIdx.x == 0) losses[r] = tgt == -100 ? 0.0f : __int_as_float(0x7fc00000);
        if (backward)
            for (int j = threadIdx.x; j < V; j += blockDim.x) l[j] = 0.0f;
        return;
    }
    float m = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, l[j]);
    m = block_max(m, scratch);
    float s = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) s += __expf(l[j] - m);
    s = block_sum(s, scratch);
    const float lse = m + logf(s);
    const float lt = l[tgt];
    __syncthreads();                                       // everyone has read l[tgt]
    if (threadIdx.x == 0) losses[r] = lse - lt;
    if (backward)
        for (int j = threadIdx.x; j < V; j += blockDim.x)
            l[j] = dloss * __expf(l[j] - lse) - (j == tgt ? dloss : 0.0f);
}

extern "C" int ftk_lmhead_xent(float *losses, void *dx, void *dweight, const void *x,
                               const void *weight, const int32_t *targets, int N, int C, int V,
                               float dloss, float *workspace, ftk_stream stream) {
    if (N <= 0) return 0;
    if (C <= 0 || V <= 0) return ft_error("lmhead_xent: bad shape C=%d V=%d", C, V);
    const bf16 *xb = (const bf16 *)x, *wb = (const bf16 *)weight;
    // (x chunks start at n0 * C elements: 16-byte aligned too when C % 8 == 0)
    const bool vec = C % 8 == 0 && aligned16(x) && aligned16(weight);
    for (int n0 = 0; n0 < N; n0 += LMHEAD_CHUNK_ROWS) {
        const int rows = N - n0 < LMHEAD_CHUNK_ROWS ? N - n0 : LMHEAD_CHUNK_ROWS;
        const bf16 *xc = xb + (size_t)n0 * C;
        LAUNCH_KERNEL(dim3(ceil_div(V, GT), ceil_div(rows, GT)), dim3(GEMM_THREADS), 0, stream,
                      lmhead_logits_kernel)(workspace, xc, wb, rows, C, V, vec);
        if (launch_check("lmhead_xent (logits)") != 0) return -1;
        LAUNCH_KERNEL(dim3(rows), dim3(XENT_THREADS), 0, stream, lmhead_xent_rows_kernel)(
            losses + n0, workspace, targets + n0, V, dloss, dx != NULL);
        if (launch_check("lmhead_xent (softmax)") != 0) return -1;
        if (!dx) continue;
        LAUNCH_KERNEL(dim3(ceil_div(C, GT), ceil_div(rows, GT)), dim3(GEMM_THREADS), 0, stream,
                      lmhead_dx_kernel)((bf16 *)dx + (size_t)n0 * C, workspace, wb, rows, C, V, vec);
        if (launch_check("lmhead_xent (dx)") != 0) return -1;
        if (!dweight) continue;   // a frozen lm_head (LoRA)
        LAUNCH_KERNEL(dim3(ceil_div(C, GT), ceil_div(V, GT)), dim3(GEMM_THREADS), 0, stream,
                      lmhead_dweight_kernel)((bf16 *)dweight, workspace, xc, rows, C, V, vec);
        if (launch_check("lmhead_xent (dweight)") != 0) return -1;
    }
    return 0;
}
