// attention.cu: causal softmax attention with GQA, flash style (the T x T probabilities are
// never stored), bf16 in and out. Two forward paths, one backward:
//   - SIMT (any D <= 128): fp32 math on fp32 tiles in shared memory;
//   - tensor cores (D % 16 == 0, chosen at run time; ftk_attention_set_tensor_cores(0) forces
//     SIMT): nvcuda::wmma bf16 16x16x16 fragments with fp32 accumulation, see "tensor-core
//     forward" below. The backward is SIMT only.
// Global tiles are read with 16-byte loads (8 bf16) when D % 8 == 0 and the tensors are
// 16-byte aligned, element by element otherwise.
//
// Shapes: q, out, dq, dout (B, T, H, D); k, v, dk, dv (B, T, KVH, D); lse (B, H, T) fp32.
// Query head h reads kv head h / (H / KVH); scale = 1/sqrt(D); D <= 128, H % KVH == 0.
//
// forward: grid (ceil(T/16), H, B), 256 threads; a block owns 16 query rows of one head.
//   Loop over 16-key tiles up to its last row (causal): S = Q K^T * scale on the tile
//   (1 entry per thread), online softmax per row (running max m and sum l, one thread
//   per row), O = O * exp(m_old - m_new) + P V (8 (row, d) entries per thread).
//   out = O / l (one bf16 rounding), lse = m + log(l).
// backward (three kernels, no atomics, bitwise deterministic):
//   1. delta (B, H, T) = rowsum(dout * out), one thread per row (fp32 workspace).
//   2. dK, dV: grid (ceil(T/16), KVH, B); a block owns 16 keys of one kv head and loops over
//      the heads of its group and the query tiles at or after its keys: recompute
//      P = exp(S - lse), dS = P (dout V^T - delta) * scale; dV += P^T dout, dK += dS^T Q in
//      registers; written once.
//   3. dQ: grid (ceil(T/16), H, B); a block owns 16 query rows, loops over key tiles:
//      the same P and dS, dQ += dS K.
// shared memory (dynamic, fp32): forward (16 D + 16 (D+1) + 16 D + 16*16 + 32) * 4 bytes
//   (25.8 KB at D = 128); backward kernels (2*16 (D+1) + 2*16 D + 2*16*16 + 32) * 4 (35 KB).
//   K and V rows are padded to D+1 floats so that the score loops are free of bank conflicts.
// numerics: fp32 dot products in d order, exp via __expf (ex2.approx), one bf16 rounding per
//   output; lse fp32.
//
// tensor-core forward: grid (ceil(T/64), H, B), 128 threads = 4 warps; warp w owns query
//   rows q0 + 16w .. +15. Per 16-key tile (K, V copied to shared memory as bf16, rows padded
//   to D + 8): S = Q K^T (D/16 mma_sync, fp32 accumulate) stored to the warp's fp32 score
//   tile; online softmax in SIMT with 2 lanes per row (8 columns each, one shuffle to
//   combine); P rounded to bf16 into the warp's P tile; then per 16-column slice of O:
//   P V (one mma_sync) is stored to the score tile and added, O = O * alpha + PV, into the
//   lane's own fp32 O entries (row lane/2, columns slice + (lane%2)*8 .. +7, registers).
//   The fragment element layout is opaque and never relied on: all row-wise work goes
//   through shared memory in a layout of our own. Warps whose rows all precede a key tile
//   skip it (warp-uniform, no collective is split).
//   shared memory: (64 + 2*16) (D + 8) * 2 + 4 * 16 * (20 * 4 + 24 * 2) bytes (34.3 KB at
//   D = 128). numerics: S from exact bf16 products summed in fp32; P rounded to bf16 before
//   P V (as in FlashAttention) while l sums the fp32 P; out = O / l, one bf16 rounding.
#include "common.cuh"

#define ATT_BQ 16
#define ATT_BK 16
#define ATT_THREADS 256
#define ATT_DMAX 128
#define ATT_EPT (ATT_BQ * ATT_DMAX / ATT_THREADS)   // (row, d) entries per thread
#define ATT_SPT (ATT_BQ * ATT_BK / ATT_THREADS)     // score entries per thread

static_assert(ATT_BQ == ATT_BK, "the (row, d) entry maps assume square tiles");
static_assert(ATT_BQ * ATT_BK % ATT_THREADS == 0, "score entries must divide evenly");

// rows [t0, t0 + 16) of a (B, T, NH, D) tensor, head h, into smem (row stride ld), fp32;
// rows beyond T are zero. vec: D % 8 == 0 and x 16-byte aligned (8 bf16 per load).
__device__ __forceinline__ void load_tile(float *s, int ld, const bf16 *x, int b, int t0, int T,
                                          int NH, int h, int D, bool vec) {
    if (vec) {
        const int D8 = D / 8;
        for (int e = threadIdx.x; e < ATT_BQ * D8; e += ATT_THREADS) {
            const int r = e / D8, d = e % D8 * 8, t = t0 + r;
            float f[8];
            if (t < T) {
                load8(f, x + (((size_t)b * T + t) * NH + h) * D + d);
            } else {
#pragma unroll
                for (int i = 0; i < 8; i++) f[i] = 0.0f;
            }
#pragma unroll
            for (int i = 0; i < 8; i++) s[r * ld + d + i] = f[i];
        }
        return;
    }
    for (int e = threadIdx.x; e < ATT_BQ * D; e += ATT_THREADS) {
        const int r = e / D, d = e % D, t = t0 + r;
        s[r * ld + d] = t < T ? bf2f(x[(((size_t)b * T + t) * NH + h) * D + d]) : 0.0f;
    }
}

__device__ __forceinline__ float dot_smem(const float *a, const float *b, int D) {
    float s = 0.0f;
    for (int d = 0; d < D; d++) s += a[d] * b[d];
    return s;
}

__global__ void __launch_bounds__(ATT_THREADS)
attention_fwd_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int T,
                     int H, int KVH, int D, float scale, bool vec) {
    DYNAMIC_SMEM(float, smem);
    float *sQ = smem;                          // [BQ][D]
    float *sK = sQ + ATT_BQ * D;               // [BK][D+1]
    float *sV = sK + ATT_BK * (D + 1);         // [BK][D]
    float *sS = sV + ATT_BK * D;               // [BQ][BK] scores, then probabilities
    float *sAlpha = sS + ATT_BQ * ATT_BK;      // [BQ] rescale factor of this tile
    float *sL = sAlpha + ATT_BQ;               // [BQ] final row sums
    const int q0 = blockIdx.x * ATT_BQ, h = blockIdx.y, b = blockIdx.z;
    const int kh = h / (H / KVH);
    const int tid = threadIdx.x;

    load_tile(sQ, D, q, b, q0, T, H, h, D, vec);
    float acc[ATT_EPT];
#pragma unroll
    for (int i = 0; i < ATT_EPT; i++) acc[i] = 0.0f;
    float m_run = -INFINITY, l_run = 0.0f;     // row statistics (threads tid < BQ)
    const int kend = T < q0 + ATT_BQ ? T : q0 + ATT_BQ;

    for (int k0 = 0; k0 < kend; k0 += ATT_BK) {
        __syncthreads();                       // previous tile fully used
        load_tile(sK, D + 1, k, b, k0, T, KVH, kh, D, vec);
        load_tile(sV, D, v, b, k0, T, KVH, kh, D, vec);
        __syncthreads();
#pragma unroll
        for (int i = 0; i < ATT_SPT; i++) {
            const int e = tid + ATT_THREADS * i, r = e / ATT_BK, j = e % ATT_BK;
            const int tq = q0 + r, tk = k0 + j;
            float s = -INFINITY;
            if (tk <= tq && tq < T) s = dot_smem(sQ + r * D, sK + j * (D + 1), D) * scale;
            sS[e] = s;
        }
        __syncthreads();
        if (tid < ATT_BQ) {
            float *row = sS + tid * ATT_BK;
            float mx = m_run;
            for (int j = 0; j < ATT_BK; j++) mx = fmaxf(mx, row[j]);
            float alpha = 1.0f, sum = 0.0f;
            if (mx != -INFINITY) {             // (a row with no valid key yet stays empty)
                alpha = __expf(m_run - mx);
                for (int j = 0; j < ATT_BK; j++) {
                    float p = __expf(row[j] - mx);
                    row[j] = p;
                    sum += p;
                }
            } else {
                for (int j = 0; j < ATT_BK; j++) row[j] = 0.0f;
            }
            l_run = l_run * alpha + sum;
            m_run = mx;
            sAlpha[tid] = alpha;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < ATT_EPT; i++) {
            const int e = tid + ATT_THREADS * i;
            if (e < ATT_BQ * D) {
                const int r = e / D, d = e % D;
                float a = acc[i] * sAlpha[r];
                const float *p = sS + r * ATT_BK;
                for (int j = 0; j < ATT_BK; j++) a += p[j] * sV[j * D + d];
                acc[i] = a;
            }
        }
    }
    if (tid < ATT_BQ) {
        sL[tid] = l_run;
        if (q0 + tid < T) lse[((size_t)b * H + h) * T + q0 + tid] = m_run + logf(l_run);
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < ATT_EPT; i++) {
        const int e = tid + ATT_THREADS * i;
        if (e < ATT_BQ * D) {
            const int r = e / D, d = e % D, t = q0 + r;
            if (t < T) out[(((size_t)b * T + t) * H + h) * D + d] = f2bf(acc[i] / sL[r]);
        }
    }
}

// delta (B, H, T) = sum_d dout * out
__global__ void __launch_bounds__(256)
attention_delta_kernel(float *delta, const bf16 *dout, const bf16 *out, int B, int T, int H,
                       int D) {
    const size_t rows = (size_t)B * T * H;
    for (size_t row = (size_t)blockIdx.x * blockDim.x + threadIdx.x; row < rows;
         row += (size_t)gridDim.x * blockDim.x) {
        const bf16 *g = dout + row * D, *o = out + row * D;
        float s = 0.0f;
        for (int d = 0; d < D; d++) s += bf2f(g[d]) * bf2f(o[d]);
        const size_t bt = row / H, h = row % H, b = bt / T, t = bt % T;
        delta[(b * H + h) * T + t] = s;
    }
}

// P and dS of one (query row, key) pair; 0 outside the causal triangle / the sequence
__device__ __forceinline__ void prob_and_dscore(float *p_out, float *ds_out, const float *sQ,
                                                const float *sdO, const float *sK,
                                                const float *sV, float lse, float delta,
                                                bool valid, int D, float scale) {
    float p = 0.0f, ds = 0.0f;
    if (valid) {
        const float s = dot_smem(sQ, sK, D) * scale;
        p = __expf(s - lse);
        const float dp = dot_smem(sdO, sV, D);
        ds = p * (dp - delta) * scale;
    }
    *p_out = p;
    *ds_out = ds;
}

__global__ void __launch_bounds__(ATT_THREADS)
attention_bwd_dkdv_kernel(bf16 *dk, bf16 *dv, const bf16 *dout, const float *lse,
                          const float *delta, const bf16 *q, const bf16 *k, const bf16 *v,
                          int T, int H, int KVH, int D, float scale, bool vec) {
    DYNAMIC_SMEM(float, smem);
    float *sK = smem;                          // [BK][D+1]
    float *sV = sK + ATT_BK * (D + 1);         // [BK][D+1]
    float *sQ = sV + ATT_BK * (D + 1);         // [BQ][D]
    float *sdO = sQ + ATT_BQ * D;              // [BQ][D]
    float *sP = sdO + ATT_BQ * D;              // [BQ][BK]
    float *sdS = sP + ATT_BQ * ATT_BK;         // [BQ][BK]
    float *sLse = sdS + ATT_BQ * ATT_BK;       // [BQ]
    float *sDelta = sLse + ATT_BQ;             // [BQ]
    const int k0 = blockIdx.x * ATT_BK, kh = blockIdx.y, b = blockIdx.z;
    const int group = H / KVH;
    const int tid = threadIdx.x;

    load_tile(sK, D + 1, k, b, k0, T, KVH, kh, D, vec);
    load_tile(sV, D + 1, v, b, k0, T, KVH, kh, D, vec);
    float adk[ATT_EPT], adv[ATT_EPT];
#pragma unroll
    for (int i = 0; i < ATT_EPT; i++) adk[i] = adv[i] = 0.0f;

    for (int h = kh * group; h < (kh + 1) * group; h++) {
        for (int q0 = k0 / ATT_BQ * ATT_BQ; q0 < T; q0 += ATT_BQ) {
            __syncthreads();                   // previous query tile fully used
            load_tile(sQ, D, q, b, q0, T, H, h, D, vec);
            load_tile(sdO, D, dout, b, q0, T, H, h, D, vec);
            if (tid < ATT_BQ) {
                const int t = q0 + tid;
                sLse[tid] = t < T ? lse[((size_t)b * H + h) * T + t] : 0.0f;
                sDelta[tid] = t < T ? delta[((size_t)b * H + h) * T + t] : 0.0f;
            }
            __syncthreads();
#pragma unroll
            for (int i = 0; i < ATT_SPT; i++) {
                const int e = tid + ATT_THREADS * i, r = e / ATT_BK, j = e % ATT_BK;
                const int tq = q0 + r, tk = k0 + j;
                prob_and_dscore(&sP[e], &sdS[e], sQ + r * D, sdO + r * D, sK + j * (D + 1),
                                sV + j * (D + 1), sLse[r], sDelta[r], tk <= tq && tq < T, D,
                                scale);
            }
            __syncthreads();
#pragma unroll
            for (int i = 0; i < ATT_EPT; i++) {
                const int e = tid + ATT_THREADS * i;
                if (e < ATT_BK * D) {
                    const int j = e / D, d = e % D;
                    float a = adk[i], c = adv[i];
                    for (int r = 0; r < ATT_BQ; r++) {
                        a += sdS[r * ATT_BK + j] * sQ[r * D + d];
                        c += sP[r * ATT_BK + j] * sdO[r * D + d];
                    }
                    adk[i] = a;
                    adv[i] = c;
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < ATT_EPT; i++) {
        const int e = tid + ATT_THREADS * i;
        if (e < ATT_BK * D) {
            const int j = e / D, d = e % D, t = k0 + j;
            if (t < T) {
                const size_t o = (((size_t)b * T + t) * KVH + kh) * D + d;
                dk[o] = f2bf(adk[i]);
                dv[o] = f2bf(adv[i]);
            }
        }
    }
}

__global__ void __launch_bounds__(ATT_THREADS)
attention_bwd_dq_kernel(bf16 *dq, const bf16 *dout, const float *lse, const float *delta,
                        const bf16 *q, const bf16 *k, const bf16 *v, int T, int H, int KVH,
                        int D, float scale, bool vec) {
    DYNAMIC_SMEM(float, smem);
    float *sK = smem;                          // [BK][D+1]
    float *sV = sK + ATT_BK * (D + 1);         // [BK][D+1]
    float *sQ = sV + ATT_BK * (D + 1);         // [BQ][D]
    float *sdO = sQ + ATT_BQ * D;              // [BQ][D]
    float *sP = sdO + ATT_BQ * D;              // [BQ][BK] (unused here but same layout)
    float *sdS = sP + ATT_BQ * ATT_BK;         // [BQ][BK]
    float *sLse = sdS + ATT_BQ * ATT_BK;       // [BQ]
    float *sDelta = sLse + ATT_BQ;             // [BQ]
    const int q0 = blockIdx.x * ATT_BQ, h = blockIdx.y, b = blockIdx.z;
    const int kh = h / (H / KVH);
    const int tid = threadIdx.x;

    load_tile(sQ, D, q, b, q0, T, H, h, D, vec);
    load_tile(sdO, D, dout, b, q0, T, H, h, D, vec);
    if (tid < ATT_BQ) {
        const int t = q0 + tid;
        sLse[tid] = t < T ? lse[((size_t)b * H + h) * T + t] : 0.0f;
        sDelta[tid] = t < T ? delta[((size_t)b * H + h) * T + t] : 0.0f;
    }
    float adq[ATT_EPT];
#pragma unroll
    for (int i = 0; i < ATT_EPT; i++) adq[i] = 0.0f;
    const int kend = T < q0 + ATT_BQ ? T : q0 + ATT_BQ;

    for (int k0 = 0; k0 < kend; k0 += ATT_BK) {
        __syncthreads();
        load_tile(sK, D + 1, k, b, k0, T, KVH, kh, D, vec);
        load_tile(sV, D + 1, v, b, k0, T, KVH, kh, D, vec);
        __syncthreads();
#pragma unroll
        for (int i = 0; i < ATT_SPT; i++) {
            const int e = tid + ATT_THREADS * i, r = e / ATT_BK, j = e % ATT_BK;
            const int tq = q0 + r, tk = k0 + j;
            prob_and_dscore(&sP[e], &sdS[e], sQ + r * D, sdO + r * D, sK + j * (D + 1),
                            sV + j * (D + 1), sLse[r], sDelta[r], tk <= tq && tq < T, D, scale);
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < ATT_EPT; i++) {
            const int e = tid + ATT_THREADS * i;
            if (e < ATT_BQ * D) {
                const int r = e / D, d = e % D;
                float a = adq[i];
                for (int j = 0; j < ATT_BK; j++) a += sdS[r * ATT_BK + j] * sK[j * (D + 1) + d];
                adq[i] = a;
            }
        }
    }
#pragma unroll
    for (int i = 0; i < ATT_EPT; i++) {
        const int e = tid + ATT_THREADS * i;
        if (e < ATT_BQ * D) {
            const int r = e / D, d = e % D, t = q0 + r;
            if (t < T) dq[(((size_t)b * T + t) * H + h) * D + d] = f2bf(adq[i]);
        }
    }
}

// ---------------------------------------------------------------- tensor-core forward

#define ATT_TC_WARPS 4
#define ATT_TC_BQ (16 * ATT_TC_WARPS)   // query rows per block (16 per warp)
#define ATT_TC_BK 16                    // keys per tile
#define ATT_TC_PAD 8                    // bf16 row padding of Q/K/V tiles (ldm % 8 == 0)
#define ATT_TC_LDS 20                   // fp32 score tile row stride (ldm % 4 == 0)
#define ATT_TC_LDP 24                   // bf16 P tile row stride

// rows [t0, t0 + rows) of head h of a (B, T, NH, D) tensor into smem as bf16 [rows][ld];
// rows beyond T are zero. vec: D % 8 == 0 and x 16-byte aligned.
__device__ __forceinline__ void copy_tile_bf16(bf16 *s, int ld, const bf16 *x, int rows, int b,
                                               int t0, int T, int NH, int h, int D, bool vec) {
    if (vec) {
        const int D8 = D / 8;
        for (int e = threadIdx.x; e < rows * D8; e += blockDim.x) {
            const int r = e / D8, d = e % D8 * 8, t = t0 + r;
            uint4 u = make_uint4(0u, 0u, 0u, 0u);
            if (t < T) u = *reinterpret_cast<const uint4 *>(x + (((size_t)b * T + t) * NH + h) * D + d);
            *reinterpret_cast<uint4 *>(s + r * ld + d) = u;
        }
        return;
    }
    for (int e = threadIdx.x; e < rows * D; e += blockDim.x) {
        const int r = e / D, d = e % D, t = t0 + r;
        s[r * ld + d] = t < T ? x[(((size_t)b * T + t) * NH + h) * D + d] : f2bf(0.0f);
    }
}

__global__ void __launch_bounds__(ATT_TC_WARPS * 32)
attention_fwd_wmma_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v,
                          int T, int H, int KVH, int D, float scale, bool vec, bool vec_out) {
    using namespace nvcuda;
    DYNAMIC_SMEM(unsigned char, smem);
    const int ld = D + ATT_TC_PAD;
    bf16 *sQ = reinterpret_cast<bf16 *>(smem);                          // [BQ][ld]
    bf16 *sK = sQ + ATT_TC_BQ * ld;                                     // [BK][ld]
    bf16 *sV = sK + ATT_TC_BK * ld;                                     // [BK][ld]
    float *sS = reinterpret_cast<float *>(sV + ATT_TC_BK * ld);         // [warps][16][LDS]
    bf16 *sP = reinterpret_cast<bf16 *>(sS + ATT_TC_WARPS * 16 * ATT_TC_LDS);  // [warps][16][LDP]
    const int q0 = blockIdx.x * ATT_TC_BQ, h = blockIdx.y, b = blockIdx.z;
    const int kh = h / (H / KVH);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wq0 = q0 + 16 * warp;                  // this warp's first query row
    const int r = lane >> 1, c0 = (lane & 1) * 8;    // this lane's row and 8 columns per tile
    const int tq = wq0 + r;
    float *wS = sS + warp * 16 * ATT_TC_LDS;
    bf16 *wP = sP + warp * 16 * ATT_TC_LDP;
    const int DT = D / 16;

    copy_tile_bf16(sQ, ld, q, ATT_TC_BQ, b, q0, T, H, h, D, vec);
    float o[ATT_DMAX / 16][8];                       // O[r][ds * 16 + c0 + e]
#pragma unroll
    for (int ds = 0; ds < ATT_DMAX / 16; ds++)
#pragma unroll
        for (int e = 0; e < 8; e++) o[ds][e] = 0.0f;
    float m_run = -INFINITY, l_run = 0.0f;           // statistics of row r (both lanes)
    const int kend = T < q0 + ATT_TC_BQ ? T : q0 + ATT_TC_BQ;

    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fk;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> fv;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;

    for (int k0 = 0; k0 < kend; k0 += ATT_TC_BK) {
        __syncthreads();                             // previous K/V tile fully used
        copy_tile_bf16(sK, ld, k, ATT_TC_BK, b, k0, T, KVH, kh, D, vec);
        copy_tile_bf16(sV, ld, v, ATT_TC_BK, b, k0, T, KVH, kh, D, vec);
        __syncthreads();
        if (wq0 >= T || k0 > wq0 + 15) continue;     // warp-uniform: nothing visible here

        // S = Q K^T (K^T as a column-major view of the row-major K tile)
        wmma::fill_fragment(acc, 0.0f);
        for (int kk = 0; kk < DT; kk++) {
            wmma::load_matrix_sync(fa, sQ + 16 * warp * ld + 16 * kk, ld);
            wmma::load_matrix_sync(fk, sK + 16 * kk, ld);
            wmma::mma_sync(acc, fa, fk, acc);
        }
        wmma::store_matrix_sync(wS, acc, ATT_TC_LDS, wmma::mem_row_major);
        __syncwarp();

        // online softmax of row r over this tile's 16 keys (columns c0..c0+7 here)
        float s[8], p[8], mx = m_run;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const int tk = k0 + c0 + e;
            s[e] = tk <= tq && tq < T ? wS[r * ATT_TC_LDS + c0 + e] * scale : -INFINITY;
            mx = fmaxf(mx, s[e]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        float alpha = 1.0f, sum = 0.0f;
        if (mx != -INFINITY) {                       // (a row with no valid key stays empty)
            alpha = __expf(m_run - mx);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                p[e] = __expf(s[e] - mx);
                sum += p[e];
            }
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) p[e] = 0.0f;
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        l_run = l_run * alpha + sum;
        m_run = mx;
        store8(wP + r * ATT_TC_LDP + c0, p);         // P as bf16 (16-byte aligned store)
        __syncwarp();
        wmma::load_matrix_sync(fa, wP, ATT_TC_LDP);

        // O = O * alpha + P V, one 16-column slice at a time through the score tile
#pragma unroll
        for (int ds = 0; ds < ATT_DMAX / 16; ds++) {
            if (ds < DT) {
                wmma::fill_fragment(acc, 0.0f);
                wmma::load_matrix_sync(fv, sV + 16 * ds, ld);
                wmma::mma_sync(acc, fa, fv, acc);
                __syncwarp();                        // the previous slice has been read
                wmma::store_matrix_sync(wS, acc, ATT_TC_LDS, wmma::mem_row_major);
                __syncwarp();
#pragma unroll
                for (int e = 0; e < 8; e++)
                    o[ds][e] = o[ds][e] * alpha + wS[r * ATT_TC_LDS + c0 + e];
            }
        }
    }
    if (tq < T) {
        bf16 *orow = out + (((size_t)b * T + tq) * H + h) * D;
#pragma unroll
        for (int ds = 0; ds < ATT_DMAX / 16; ds++) {
            if (ds < DT) {
                float y[8];
#pragma unroll
                for (int e = 0; e < 8; e++) y[e] = o[ds][e] / l_run;
                if (vec_out) {
                    store8(orow + 16 * ds + c0, y);
                } else {
#pragma unroll
                    for (int e = 0; e < 8; e++) orow[16 * ds + c0 + e] = f2bf(y[e]);
                }
            }
        }
        if (c0 == 0) lse[((size_t)b * H + h) * T + tq] = m_run + logf(l_run);
    }
}

// ---------------------------------------------------------------- launchers

static int g_attention_tensor_cores = 1;

extern "C" void ftk_attention_set_tensor_cores(int on) { g_attention_tensor_cores = on != 0; }

static int attention_check(const char *op, int B, int H, int KVH, int D) {
    if (D > ATT_DMAX) return ft_error("%s: head dim %d > %d is not supported", op, D, ATT_DMAX);
    if (KVH <= 0 || H % KVH) return ft_error("%s: %d heads not a multiple of %d kv heads", op, H, KVH);
    if (B > 65535 || H > 65535) return ft_error("%s: B=%d or H=%d too large", op, B, H);
    return 0;
}

extern "C" int ftk_attention_fwd(void *out, float *lse, const void *q, const void *k,
                                 const void *v, int B, int T, int H, int KVH, int D,
                                 ftk_stream stream) {
    if (B <= 0 || T <= 0 || H <= 0 || D <= 0) return 0;
    if (attention_check("attention_fwd", B, H, KVH, D) != 0) return -1;
    const bool vec = D % 8 == 0 && aligned16(q) && aligned16(k) && aligned16(v);
    const float scale = 1.0f / sqrtf((float)D);
    if (g_attention_tensor_cores && D % 16 == 0) {
        const size_t smem = (size_t)(ATT_TC_BQ + 2 * ATT_TC_BK) * (D + ATT_TC_PAD) * sizeof(bf16) +
                            (size_t)ATT_TC_WARPS * 16 * (ATT_TC_LDS * sizeof(float) + ATT_TC_LDP * sizeof(bf16));
        LAUNCH_KERNEL(dim3(ceil_div(T, ATT_TC_BQ), H, B), dim3(ATT_TC_WARPS * 32), smem, stream,
                      attention_fwd_wmma_kernel)((bf16 *)out, lse, (const bf16 *)q, (const bf16 *)k,
                                                 (const bf16 *)v, T, H, KVH, D, scale, vec,
                                                 aligned16(out));
        return launch_check("attention_fwd (tensor cores)");
    }
    const size_t smem = sizeof(float) * (size_t)(ATT_BQ * D + ATT_BK * (D + 1) + ATT_BK * D +
                                                 ATT_BQ * ATT_BK + 2 * ATT_BQ);
    LAUNCH_KERNEL(dim3(ceil_div(T, ATT_BQ), H, B), dim3(ATT_THREADS), smem, stream,
                  attention_fwd_kernel)((bf16 *)out, lse, (const bf16 *)q, (const bf16 *)k,
                                        (const bf16 *)v, T, H, KVH, D, scale, vec);
    return launch_check("attention_fwd");
}

extern "C" int ftk_attention_bwd(void *dq, void *dk, void *dv, const void *dout, const void *out,
                                 const float *lse, const void *q, const void *k, const void *v,
                                 int B, int T, int H, int KVH, int D, ftk_stream stream) {
    if (B <= 0 || T <= 0 || H <= 0 || D <= 0) return 0;
    if (attention_check("attention_bwd", B, H, KVH, D) != 0) return -1;
    const float scale = 1.0f / sqrtf((float)D);
    const bool vec = D % 8 == 0 && aligned16(q) && aligned16(k) && aligned16(v) && aligned16(dout);
    float *delta = NULL;
    const size_t rows = (size_t)B * T * H;
    if (ftk_scratch_get((void **)&delta, sizeof(float) * rows, stream, "attention_bwd (delta)") != 0) return -1;
    LAUNCH_KERNEL(dim3(elementwise_blocks(rows, 256)), dim3(256), 0, stream,
                  attention_delta_kernel)(delta, (const bf16 *)dout, (const bf16 *)out, B, T, H, D);
    int rc = launch_check("attention_bwd (delta)");
    const size_t smem = sizeof(float) * (size_t)(2 * ATT_BK * (D + 1) + 2 * ATT_BQ * D +
                                                 2 * ATT_BQ * ATT_BK + 2 * ATT_BQ);
    if (rc == 0) {
        LAUNCH_KERNEL(dim3(ceil_div(T, ATT_BK), KVH, B), dim3(ATT_THREADS), smem, stream,
                      attention_bwd_dkdv_kernel)((bf16 *)dk, (bf16 *)dv, (const bf16 *)dout, lse,
                                                 delta, (const bf16 *)q, (const bf16 *)k,
                                                 (const bf16 *)v, T, H, KVH, D, scale, vec);
        rc = launch_check("attention_bwd (dk, dv)");
    }
    if (rc == 0) {
        LAUNCH_KERNEL(dim3(ceil_div(T, ATT_BQ), H, B), dim3(ATT_THREADS), smem, stream,
                      attention_bwd_dq_kernel)((bf16 *)dq, (const bf16 *)dout, lse, delta,
                                               (const bf16 *)q, (const bf16 *)k, (const bf16 *)v,
                                               T, H, KVH, D, scale, vec);
        rc = launch_check("attention_bwd (dq)");
    }
    ftk_scratch_put(delta, stream);
    return rc;
}
