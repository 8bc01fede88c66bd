// attention.cu: causal softmax attention with GQA, flash style (the T x T probabilities are
// never stored), bf16 in and out. Two forward paths, one backward:
//   - SIMT (any D <= 128): fp32 math on fp32 tiles in shared memory;
//   - tensor cores (D % 16 == 0, chosen at run time; ftk_attention_set_tensor_cores(0) forces
//     SIMT): nvcuda::wmma bf16 16x16x16 fragments with fp32 accumulation, see "tensor-core
//     forward" below; the backward likewise, see "tensor-core backward".
// Global tiles are read with 16-byte loads (8 bf16) when D % 8 == 0 and the tensors are
// 16-byte aligned, element by element otherwise.
//
// Shapes: q, out, dq, dout (B, T, H, D); k, v, dk, dv (B, T, KVH, D); lse (B, H, T) fp32.
// Query head h reads kv head h / (H / KVH); scale = 1/sqrt(D); D <= 128, H % KVH == 0.
// Segment starts (seg (B, T) int32 or NULL, backend.h; --pack_attention per_game): query t
// sees keys seg[b, t] .. t. seg is nondecreasing along a row, so a query tile's smallest
// start is its first row's: its key loop starts at the tile holding that key, keys before a
// row's start are masked like those past the diagonal (score -inf / probability 0), a
// backward key tile stops at the first query tile that starts after its last key, and a
// 16x16 block no row of which sees a key of is skipped (no work, no dS written or read).
// NULL: start 0 everywhere, the same arithmetic as plain causal attention (bitwise).
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
//   rows q0 + 16w .. +15. The Q tile is staged through shared memory once (over the K/V
//   tiles) and each warp keeps its 16 rows as D/16 matrix_a fragments in registers. Per
//   32-key round (K, V copied to shared memory as bf16, rows padded to D + 8; two barriers
//   per 32 keys), per 16-key sub-tile: S = Q K^T (D/16 mma_sync, fp32 accumulate) stored to
//   the warp's fp32 score tile; online softmax in SIMT with 2 lanes per row (8 columns each,
//   one shuffle to combine); P rounded to bf16 into the warp's P tile; then per 16-column
//   slice of O: P V (one mma_sync) is stored to the score tile and added,
//   O = O * alpha + PV, into the lane's own fp32 O entries (row lane/2, columns
//   slice + (lane%2)*8 .. +7, registers). The fragment element layout is opaque and never
//   relied on: all row-wise work goes through shared memory in a layout of our own. Warps
//   whose rows all precede a sub-tile stop there (warp-uniform, no collective is split).
//   shared memory: 2*32 (D + 8) * 2 + 4 * 16 * (20 * 4 + 24 * 2) bytes (25.6 KB at
//   D = 128). numerics: S from exact bf16 products summed in fp32; P rounded to bf16 before
//   P V (as in FlashAttention) while l sums the fp32 P; out = O / l, one bf16 rounding.
//
// tensor-core backward (FlashAttention-2's five products S, dP, dV, dK, dQ; no atomics,
// bitwise deterministic): after the delta kernel,
//   1. dK, dV: grid (ceil(T/32), kv heads of the chunk, sequences of the chunk), 64 threads =
//      2 warps; warp w owns keys k0 + 16w .. +15 (its K and V rows stay in shared memory).
//      Loop over the heads of the GQA group and 16-row query tiles from k0 on (Q, dout as
//      bf16 rows padded to D + 8, lse and delta): S^T = K_w Q^T and dP^T = V_w dO^T
//      (D/16 mma_sync each, through the warp's fp32 staging tile); per element
//      P^T = exp(S^T scale - lse) (0 outside the causal triangle / the sequence) and
//      dS^T = P^T (dP^T - delta) scale, both rounded to bf16 into the warp's two P tiles;
//      dV += P^T dO and dK += dS^T Q (D/16 mma_sync each) into accumulator fragments held
//      for the whole loop (2 D/16 fragments), written once. The bf16 dS^T tile also goes to
//      the workspace (one 16-byte store per lane).
//   2. dQ: grid (ceil(T/64), query heads of the chunk, sequences), 128 threads = 4 warps;
//      warp w owns query rows q0 + 16w .. +15. Loop over 64-key tiles (K copied to shared
//      memory, zero rows past T): dQ += dS K, dS loaded straight from the workspace as the
//      column-major view of dS^T (ldm = Tp) for every 16-key block at or before the warp's
//      rows; written once.
//   Workspace: bf16 dS^T per (sequence, query head), [Tp][Tp], Tp = T rounded up to 16;
//   only the causal 16x16 blocks are written and read. Per launch pair it is capped at 32
//   MiB (ftk_attention_set_ds_cap): whole sequences while they fit, else chunks of kv heads
//   of one sequence (at least one: group * Tp^2 * 2 bytes, 0.5 MiB for a 7B layer at
//   T = 512). Chunks are independent, so the result does not depend on the cap.
//   Staging layouts: fp32 tiles [16][20], bf16 P tiles [16][24] (wmma ldm multiples of 16
//   bytes; 48-byte bf16 rows make ldmatrix's 8-row phases hit 8 distinct 4-bank groups).
//   The element-wise pass maps lane l to rows l/4 + 8i (i < 2) and columns l%4 + 4e (e < 4):
//   for each (i, e) the 32 fp32 reads (row stride 20 words) and bf16 writes (row stride 12
//   words) fall in 32 distinct banks. The fragment layout itself is never relied on.
//   shared memory: dK/dV (2*32 + 2*16) (D + 8) * 2 + 2 * 16 * (20 * 4 + 2 * 24 * 2) + 2 * 16 * 4
//   bytes (31.9 KB at D = 128); dQ 64 (D + 8) * 2 + 4 * 16 * 20 * 4 (22.5 KB at D = 128).
//   barrier order: after each tile copy, a warp's first wmma collective reads the tile just
//   copied. (Free on a GPU; under the emulator, which completes a warp collective as soon as
//   its 32 lanes arrive, this makes a missing __syncthreads read another warp's unfinished
//   rows, so tests/mutate_kernels.sh's barrier mutants are caught.)
//   numerics: S and dP from exact bf16 products summed in fp32 (as the forward), P and dS in
//   fp32, each rounded to bf16 once as the A operand of its products; dK, dV, dQ fp32 sums,
//   one bf16 rounding. The SIMT kernels above stay for D % 16 != 0 and as the reference.
#include "common.cuh"
#include "attention_ws.h"

#define ATT_BQ 16
#define ATT_BK 16
#define ATT_THREADS 256
#define ATT_DMAX ATTN_NATIVE_MAX_HEAD_DIM
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

// the segment start of query row t < T of batch b (0 without segments)
__device__ __forceinline__ int seg_start(const int32_t *seg, int b, int T, int t) {
    return seg ? seg[(size_t)b * T + t] : 0;
}

__device__ __forceinline__ float dot_smem(const float *a, const float *b, int D) {
    float s = 0.0f;
    for (int d = 0; d < D; d++) s += a[d] * b[d];
    return s;
}

__global__ void __launch_bounds__(ATT_THREADS)
attention_fwd_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int T,
                     int H, int KVH, int D, float scale, bool vec, const int32_t *seg) {
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
    const int kbeg = seg_start(seg, b, T, q0) / ATT_BK * ATT_BK;   // the tile of the first row's start

    for (int k0 = kbeg; k0 < kend; k0 += ATT_BK) {
        __syncthreads();                       // previous tile fully used
        load_tile(sK, D + 1, k, b, k0, T, KVH, kh, D, vec);
        load_tile(sV, D, v, b, k0, T, KVH, kh, D, vec);
        __syncthreads();
#pragma unroll
        for (int i = 0; i < ATT_SPT; i++) {
            const int e = tid + ATT_THREADS * i, r = e / ATT_BK, j = e % ATT_BK;
            const int tq = q0 + r, tk = k0 + j;
            float s = -INFINITY;
            if (tk <= tq && tq < T && tk >= seg_start(seg, b, T, tq))
                s = dot_smem(sQ + r * D, sK + j * (D + 1), D) * scale;
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
                          int T, int H, int KVH, int D, float scale, bool vec, const int32_t *seg) {
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
            if (seg_start(seg, b, T, q0) >= k0 + ATT_BK) break;   // block-uniform: no later query sees these keys
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
                                sV + j * (D + 1), sLse[r], sDelta[r],
                                tk <= tq && tq < T && tk >= seg_start(seg, b, T, tq), D, scale);
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
                        int D, float scale, bool vec, const int32_t *seg) {
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
    const int kbeg = seg_start(seg, b, T, q0) / ATT_BK * ATT_BK;   // as in the forward

    for (int k0 = kbeg; k0 < kend; k0 += ATT_BK) {
        __syncthreads();
        load_tile(sK, D + 1, k, b, k0, T, KVH, kh, D, vec);
        load_tile(sV, D + 1, v, b, k0, T, KVH, kh, D, vec);
        __syncthreads();
#pragma unroll
        for (int i = 0; i < ATT_SPT; i++) {
            const int e = tid + ATT_THREADS * i, r = e / ATT_BK, j = e % ATT_BK;
            const int tq = q0 + r, tk = k0 + j;
            prob_and_dscore(&sP[e], &sdS[e], sQ + r * D, sdO + r * D, sK + j * (D + 1),
                            sV + j * (D + 1), sLse[r], sDelta[r],
                            tk <= tq && tq < T && tk >= seg_start(seg, b, T, tq), D, scale);
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
#define ATT_TC_BK 32                    // keys per K/V copy round (two 16-key sub-tiles)
#define ATT_TC_PAD 8                    // bf16 row padding of Q/K/V tiles (ldm % 8 == 0)
#define ATT_TC_LDS 20                   // fp32 score tile row stride (ldm % 4 == 0)
#define ATT_TC_LDP 24                   // bf16 P tile row stride
static_assert(ATT_TC_BQ == 2 * ATT_TC_BK, "the forward stages Q over its K and V tiles");

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
                          int T, int H, int KVH, int D, float scale, bool vec, bool vec_out,
                          const int32_t *seg) {
    using namespace nvcuda;
    DYNAMIC_SMEM(unsigned char, smem);
    const int ld = D + ATT_TC_PAD;
    bf16 *sK = reinterpret_cast<bf16 *>(smem);                          // [BK][ld]
    bf16 *sV = sK + ATT_TC_BK * ld;                                     // [BK][ld]
    bf16 *sQ = sK;                                  // [BQ][ld] staged over sK, sV before the loop
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

    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa, fq[ATT_DMAX / 16];
    copy_tile_bf16(sQ, ld, q, ATT_TC_BQ, b, q0, T, H, h, D, vec);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < ATT_DMAX / 16; kk++)     // the warp's 16 Q rows stay in registers
        if (kk < DT) wmma::load_matrix_sync(fq[kk], sQ + 16 * warp * ld + 16 * kk, ld);
    float o[ATT_DMAX / 16][8];                       // O[r][ds * 16 + c0 + e]
#pragma unroll
    for (int ds = 0; ds < ATT_DMAX / 16; ds++)
#pragma unroll
        for (int e = 0; e < 8; e++) o[ds][e] = 0.0f;
    float m_run = -INFINITY, l_run = 0.0f;           // statistics of row r (both lanes)
    const int kend = T < q0 + ATT_TC_BQ ? T : q0 + ATT_TC_BQ;
    const int kbeg = seg_start(seg, b, T, q0) / ATT_TC_BK * ATT_TC_BK;   // the round of the first row's start
    const int wseg = wq0 < T ? seg_start(seg, b, T, wq0) : 0;          // the warp's smallest start
    const int rseg = tq < T ? seg_start(seg, b, T, tq) : 0;            // row r's

    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fk;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> fv;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;

    for (int k0 = kbeg; k0 < kend; k0 += ATT_TC_BK) {
        __syncthreads();                             // previous K/V tile fully used
        copy_tile_bf16(sK, ld, k, ATT_TC_BK, b, k0, T, KVH, kh, D, vec);
        copy_tile_bf16(sV, ld, v, ATT_TC_BK, b, k0, T, KVH, kh, D, vec);
        __syncthreads();
        for (int sub = 0; sub < ATT_TC_BK; sub += 16) {
            const int kt = k0 + sub;                 // this 16-key sub-tile's first key
            if (wq0 >= T || kt > wq0 + 15) break;    // warp-uniform: nothing visible from here
            if (kt + 15 < wseg) continue;            // warp-uniform: before every row's segment

            // S = Q K^T (K^T as a column-major view of the row-major K tile)
            wmma::fill_fragment(acc, 0.0f);
#pragma unroll
            for (int kk = 0; kk < ATT_DMAX / 16; kk++) {
                if (kk < DT) {
                    wmma::load_matrix_sync(fk, sK + sub * ld + 16 * kk, ld);
                    wmma::mma_sync(acc, fq[kk], fk, acc);
                }
            }
            __syncwarp();                            // the previous sub-tile's PV slice was read
            wmma::store_matrix_sync(wS, acc, ATT_TC_LDS, wmma::mem_row_major);
            __syncwarp();

            // online softmax of row r over this tile's 16 keys (columns c0..c0+7 here)
            float s[8], p[8], mx = m_run;
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const int tk = kt + c0 + e;
                s[e] = tk <= tq && tq < T && tk >= rseg ? wS[r * ATT_TC_LDS + c0 + e] * scale : -INFINITY;
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
                    wmma::load_matrix_sync(fv, sV + sub * ld + 16 * ds, ld);
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

// ---------------------------------------------------------------- tensor-core backward

#define ATT_BW_WARPS 2                  // dK/dV kernel: warps per block, 16 keys each
#define ATT_BW_BK (16 * ATT_BW_WARPS)   // keys per dK/dV block
#define ATT_BW_BQ 16                    // query rows per step of the dK/dV loop
#define ATT_DQ_WARPS 4                  // dQ kernel: warps per block, 16 query rows each
#define ATT_DQ_BQ (16 * ATT_DQ_WARPS)   // query rows per dQ block
#define ATT_DQ_BK 64                    // keys per shared K tile of the dQ loop

// the warp's 16x16 accumulator `f` to rows t0 .. t0+15 (those < T), columns col0 .. col0+15
// of the bf16 matrix x (row stride `stride`), through the warp's fp32 staging tile wS.
// vec: x, stride and col0 allow 16-byte stores.
__device__ __forceinline__ void
store_acc_rows(bf16 *x, size_t stride, int t0, int T, int col0, float *wS, bool vec,
               const nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> &f) {
    const int lane = threadIdx.x % 32, r = lane >> 1, c0 = (lane & 1) * 8;
    nvcuda::wmma::store_matrix_sync(wS, f, ATT_TC_LDS, nvcuda::wmma::mem_row_major);
    __syncwarp();
    float y[8];
#pragma unroll
    for (int e = 0; e < 8; e++) y[e] = wS[r * ATT_TC_LDS + c0 + e];
    if (t0 + r < T) {
        bf16 *p = x + (size_t)(t0 + r) * stride + col0 + c0;
        if (vec) {
            store8(p, y);
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) p[e] = f2bf(y[e]);
        }
    }
    __syncwarp();                                    // wS is reused by the next call
}

// S^T (or dP^T) of one warp: the 16 rows of `a` (row-major, ld) times the 16 rows of `b`
// transposed (b read as a column-major view), D/16 steps of 16, fp32 accumulate, into wS
__device__ __forceinline__ void tile_abt(float *wS, const bf16 *a, const bf16 *b, int ld, int DT) {
    using namespace nvcuda;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk < DT; kk++) {
        wmma::load_matrix_sync(fb, b + 16 * kk, ld);   // (b first: see "barrier order" above)
        wmma::load_matrix_sync(fa, a + 16 * kk, ld);
        wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(wS, acc, ATT_TC_LDS, wmma::mem_row_major);
    __syncwarp();
}

// one warp's P^T and dS^T (its 16 keys x 16 query rows) as bf16 into wP and wdS: S^T and dP^T
// on tensor cores through the fp32 staging tile wS (sKw, sVw: the warp's K and V rows),
// element-wise in fp32 with lane l on rows l/4 + 8i, columns l%4 + 4e
__device__ __forceinline__ void warp_p_ds(bf16 *wP, bf16 *wdS, float *wS, const bf16 *sKw,
                                          const bf16 *sVw, const bf16 *sQ, const bf16 *sdO,
                                          const float *sLse, const float *sDelta, int ld, int DT,
                                          int wk0, int q0, int T, float scale, const int32_t *seg,
                                          int b) {
    const int er = (threadIdx.x % 32) >> 2, ec = threadIdx.x & 3;
    // P^T = exp(S^T * scale - lse), S^T = K_w Q^T
    tile_abt(wS, sKw, sQ, ld, DT);
    float p[2][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int j = er + 8 * i, c = ec + 4 * e, tk = wk0 + j, tq = q0 + c;
            p[i][e] = tk <= tq && tq < T && tk >= seg_start(seg, b, T, tq < T ? tq : 0)
                          ? __expf(wS[j * ATT_TC_LDS + c] * scale - sLse[c]) : 0.0f;
        }
    __syncwarp();                                    // S^T read before dP^T overwrites it
    // dS^T = P^T (dP^T - delta) * scale, dP^T = V_w dO^T
    tile_abt(wS, sVw, sdO, ld, DT);
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int j = er + 8 * i, c = ec + 4 * e;
            const float dsv = p[i][e] * (wS[j * ATT_TC_LDS + c] - sDelta[c]) * scale;
            wP[j * ATT_TC_LDP + c] = f2bf(p[i][e]);
            wdS[j * ATT_TC_LDP + c] = f2bf(dsv);
        }
    __syncwarp();
}

__global__ void __launch_bounds__(ATT_BW_WARPS * 32)
attention_bwd_dkdv_wmma_kernel(bf16 *dk, bf16 *dv, bf16 *ds_ws, const bf16 *dout,
                               const float *lse, const float *delta, const bf16 *q,
                               const bf16 *k, const bf16 *v, int T, int Tp, int H, int KVH,
                               int D, float scale, int b0, int kh0, bool vec, bool vec_out,
                               const int32_t *seg) {
    using namespace nvcuda;
    DYNAMIC_SMEM(unsigned char, smem);
    const int ld = D + ATT_TC_PAD;
    bf16 *sK = reinterpret_cast<bf16 *>(smem);                          // [BK][ld]
    bf16 *sV = sK + ATT_BW_BK * ld;                                     // [BK][ld]
    bf16 *sQ = sV + ATT_BW_BK * ld;                                     // [BQ][ld]
    bf16 *sdO = sQ + ATT_BW_BQ * ld;                                    // [BQ][ld]
    float *sS = reinterpret_cast<float *>(sdO + ATT_BW_BQ * ld);        // [warps][16][LDS]
    bf16 *sP = reinterpret_cast<bf16 *>(sS + ATT_BW_WARPS * 16 * ATT_TC_LDS);  // [warps][2][16][LDP]
    float *sLse = reinterpret_cast<float *>(sP + ATT_BW_WARPS * 2 * 16 * ATT_TC_LDP);  // [BQ]
    float *sDelta = sLse + ATT_BW_BQ;                                   // [BQ]
    const int k0 = blockIdx.x * ATT_BW_BK, kh = kh0 + blockIdx.y, b = b0 + blockIdx.z;
    const int group = H / KVH;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wk0 = k0 + 16 * warp;                  // this warp's first key
    float *wS = sS + warp * 16 * ATT_TC_LDS;
    bf16 *wP = sP + warp * 2 * 16 * ATT_TC_LDP, *wdS = wP + 16 * ATT_TC_LDP;
    const size_t slab0 = ((size_t)blockIdx.z * gridDim.y + blockIdx.y) * group;
    const int DT = D / 16;

    copy_tile_bf16(sK, ld, k, ATT_BW_BK, b, k0, T, KVH, kh, D, vec);
    copy_tile_bf16(sV, ld, v, ATT_BW_BK, b, k0, T, KVH, kh, D, vec);
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> adk[ATT_DMAX / 16], adv[ATT_DMAX / 16];
#pragma unroll
    for (int ds = 0; ds < ATT_DMAX / 16; ds++) {
        wmma::fill_fragment(adk[ds], 0.0f);
        wmma::fill_fragment(adv[ds], 0.0f);
    }

    for (int hl = 0; hl < group; hl++) {
        const int h = kh * group + hl;
        bf16 *ws = ds_ws + (slab0 + hl) * Tp * Tp;   // dS^T of (b, h): [Tp keys][Tp queries]
        for (int q0 = k0; q0 < T; q0 += ATT_BW_BQ) {
            const int qseg = seg_start(seg, b, T, q0);   // the query tile's smallest start
            if (qseg >= k0 + ATT_BW_BK) break;       // block-uniform: no later query sees these keys
            __syncthreads();                         // previous query tile fully used
            copy_tile_bf16(sQ, ld, q, ATT_BW_BQ, b, q0, T, H, h, D, vec);
            copy_tile_bf16(sdO, ld, dout, ATT_BW_BQ, b, q0, T, H, h, D, vec);
            if (threadIdx.x < ATT_BW_BQ) {
                const int t = q0 + threadIdx.x;
                sLse[threadIdx.x] = t < T ? lse[((size_t)b * H + h) * T + t] : 0.0f;
                sDelta[threadIdx.x] = t < T ? delta[((size_t)b * H + h) * T + t] : 0.0f;
            }
            __syncthreads();
            if (wk0 >= T || wk0 > q0 + 15) continue; // warp-uniform: no visible (key, query)
            if (qseg > wk0 + 15) continue;           // warp-uniform: before every row's segment
                                                     // (the dQ kernel skips this block too)
            warp_p_ds(wP, wdS, wS, sK + 16 * warp * ld, sV + 16 * warp * ld, sQ, sdO, sLse, sDelta,
                      ld, DT, wk0, q0, T, scale, seg, b);
            {   // dS^T rows wk0 .. +15, columns q0 .. +15 to the workspace (one 16-byte copy per lane)
                const int r = lane >> 1, c0 = (lane & 1) * 8;
                *reinterpret_cast<uint4 *>(ws + (size_t)(wk0 + r) * Tp + q0 + c0) =
                    *reinterpret_cast<const uint4 *>(wdS + r * ATT_TC_LDP + c0);
            }
            // dV += P^T dO, dK += dS^T Q
            wmma::load_matrix_sync(fa, wP, ATT_TC_LDP);
#pragma unroll
            for (int ds = 0; ds < ATT_DMAX / 16; ds++) {
                if (ds < DT) {
                    wmma::load_matrix_sync(fb, sdO + 16 * ds, ld);
                    wmma::mma_sync(adv[ds], fa, fb, adv[ds]);
                }
            }
            wmma::load_matrix_sync(fa, wdS, ATT_TC_LDP);
#pragma unroll
            for (int ds = 0; ds < ATT_DMAX / 16; ds++) {
                if (ds < DT) {
                    wmma::load_matrix_sync(fb, sQ + 16 * ds, ld);
                    wmma::mma_sync(adk[ds], fa, fb, adk[ds]);
                }
            }
        }
    }
    if (wk0 >= T) return;                            // warp-uniform, after the last barrier
    const size_t base = ((size_t)b * T * KVH + kh) * D, stride = (size_t)KVH * D;
#pragma unroll
    for (int ds = 0; ds < ATT_DMAX / 16; ds++) {
        if (ds < DT) {
            store_acc_rows(dv + base, stride, wk0, T, 16 * ds, wS, vec_out, adv[ds]);
            store_acc_rows(dk + base, stride, wk0, T, 16 * ds, wS, vec_out, adk[ds]);
        }
    }
}

__global__ void __launch_bounds__(ATT_DQ_WARPS * 32)
attention_bwd_dq_wmma_kernel(bf16 *dq, const bf16 *ds_ws, const bf16 *k, int T, int Tp, int H,
                             int KVH, int D, int b0, int h0, bool vec, bool vec_out,
                             const int32_t *seg) {
    using namespace nvcuda;
    DYNAMIC_SMEM(unsigned char, smem);
    const int ld = D + ATT_TC_PAD;
    bf16 *sK = reinterpret_cast<bf16 *>(smem);                          // [BK][ld]
    float *sS = reinterpret_cast<float *>(sK + ATT_DQ_BK * ld);         // [warps][16][LDS]
    const int q0 = blockIdx.x * ATT_DQ_BQ, h = h0 + blockIdx.y, b = b0 + blockIdx.z;
    const int kh = h / (H / KVH);
    const int warp = threadIdx.x / 32;
    const int wq0 = q0 + 16 * warp;                  // this warp's first query row
    float *wS = sS + warp * 16 * ATT_TC_LDS;
    const bf16 *ws = ds_ws + ((size_t)blockIdx.z * gridDim.y + blockIdx.y) * Tp * Tp;
    const int DT = D / 16;

    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major> fds;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> fk;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> adq[ATT_DMAX / 16];
#pragma unroll
    for (int ds = 0; ds < ATT_DMAX / 16; ds++) wmma::fill_fragment(adq[ds], 0.0f);
    const int kend = T < q0 + ATT_DQ_BQ ? T : q0 + ATT_DQ_BQ;
    const int kbeg = seg_start(seg, b, T, q0) / ATT_DQ_BK * ATT_DQ_BK;   // the tile of the first row's start
    const int wseg = wq0 < T ? seg_start(seg, b, T, wq0) : 0;           // the warp's smallest start

    for (int k0 = kbeg; k0 < kend; k0 += ATT_DQ_BK) {
        __syncthreads();                             // previous K tile fully used
        copy_tile_bf16(sK, ld, k, ATT_DQ_BK, b, k0, T, KVH, kh, D, vec);
        __syncthreads();
        if (wq0 >= T) continue;                      // warp-uniform
        for (int kb = 0; kb < ATT_DQ_BK / 16; kb++) {
            const int tk0 = k0 + 16 * kb;
            if (tk0 > wq0) break;                    // warp-uniform causal bound (tk0 < T too)
            if (tk0 + 15 < wseg) continue;           // warp-uniform: a block the dK/dV kernel skipped
#pragma unroll
            for (int ds = 0; ds < ATT_DMAX / 16; ds++) {
                if (ds < DT) {
                    wmma::load_matrix_sync(fk, sK + 16 * kb * ld + 16 * ds, ld);
                    // dS (16 queries x 16 keys): the column-major view of the stored dS^T
                    // tile, loaded after the first K fragment (see "barrier order" above)
                    if (ds == 0) wmma::load_matrix_sync(fds, ws + (size_t)tk0 * Tp + wq0, Tp);
                    wmma::mma_sync(adq[ds], fds, fk, adq[ds]);
                }
            }
        }
    }
    if (wq0 >= T) return;
    const size_t base = ((size_t)b * T * H + h) * D, stride = (size_t)H * D;
#pragma unroll
    for (int ds = 0; ds < ATT_DMAX / 16; ds++)
        if (ds < DT) store_acc_rows(dq + base, stride, wq0, T, 16 * ds, wS, vec_out, adq[ds]);
}

// ---------------------------------------------------------------- launchers

static int g_attention_tensor_cores = 1;

static size_t g_attention_ds_cap = ATTN_DS_CAP_BYTES;

extern "C" void ftk_attention_set_tensor_cores(int on) { g_attention_tensor_cores = on != 0; }
extern "C" void ftk_attention_set_ds_cap(size_t bytes) { g_attention_ds_cap = bytes ? bytes : ATTN_DS_CAP_BYTES; }

static int attention_check(const char *op, int B, int H, int KVH, int D) {
    if (D > ATT_DMAX) return ft_error("%s: head dim %d > %d is not supported", op, D, ATT_DMAX);
    if (KVH <= 0 || H % KVH) return ft_error("%s: %d heads not a multiple of %d kv heads", op, H, KVH);
    if (B > 65535 || H > 65535) return ft_error("%s: B=%d or H=%d too large", op, B, H);
    return 0;
}

extern "C" int ftk_attention_fwd(void *out, float *lse, const void *q, const void *k,
                                 const void *v, int B, int T, int H, int KVH, int D,
                                 const int32_t *seg, ftk_stream stream) {
    if (B <= 0 || T <= 0 || H <= 0 || D <= 0) return 0;
    if (attention_check("attention_fwd", B, H, KVH, D) != 0) return -1;
    const bool vec = D % 8 == 0 && aligned16(q) && aligned16(k) && aligned16(v);
    const float scale = 1.0f / sqrtf((float)D);
    if (g_attention_tensor_cores && D % 16 == 0) {
        const size_t smem = (size_t)2 * ATT_TC_BK * (D + ATT_TC_PAD) * sizeof(bf16) +
                            (size_t)ATT_TC_WARPS * 16 * (ATT_TC_LDS * sizeof(float) + ATT_TC_LDP * sizeof(bf16));
        LAUNCH_KERNEL(dim3(ceil_div(T, ATT_TC_BQ), H, B), dim3(ATT_TC_WARPS * 32), smem, stream,
                      attention_fwd_wmma_kernel)((bf16 *)out, lse, (const bf16 *)q, (const bf16 *)k,
                                                 (const bf16 *)v, T, H, KVH, D, scale, vec,
                                                 aligned16(out), seg);
        return launch_check("attention_fwd (tensor cores)");
    }
    const size_t smem = sizeof(float) * (size_t)(ATT_BQ * D + ATT_BK * (D + 1) + ATT_BK * D +
                                                 ATT_BQ * ATT_BK + 2 * ATT_BQ);
    LAUNCH_KERNEL(dim3(ceil_div(T, ATT_BQ), H, B), dim3(ATT_THREADS), smem, stream,
                  attention_fwd_kernel)((bf16 *)out, lse, (const bf16 *)q, (const bf16 *)k,
                                        (const bf16 *)v, T, H, KVH, D, scale, vec, seg);
    return launch_check("attention_fwd");
}

// the tensor-core backward after the delta kernel: dK/dV (and dS^T into the workspace),
// then dQ, over chunks of sequences / kv heads whose dS^T fits ATTN_DS_CAP_BYTES (at least one
// kv head of one sequence per chunk; g_attention_ds_cap)
static int attention_bwd_wmma(bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout, const float *lse,
                              const float *delta, const bf16 *q, const bf16 *k, const bf16 *v,
                              int B, int T, int H, int KVH, int D, float scale, bool vec,
                              const int32_t *seg, ftk_stream stream) {
    const int group = H / KVH, Tp = (int)ceil_div(T, 16) * 16;
    int nkv, nb;   // kv heads and sequences per launch (src/attention_ws.h, shared with the plan)
    const size_t ws_bytes = attention_bwd_ds_bytes(B, T, H, KVH, g_attention_ds_cap, &nb, &nkv);
    bf16 *ws = NULL;
    if (ftk_scratch_get((void **)&ws, ws_bytes, stream, "attention_bwd (dS workspace)") != 0)
        return -1;
    const int ld = D + ATT_TC_PAD;
    const size_t smem_kv = (size_t)(2 * ATT_BW_BK + 2 * ATT_BW_BQ) * ld * sizeof(bf16) +
                           (size_t)ATT_BW_WARPS * 16 * (ATT_TC_LDS * sizeof(float) + 2 * ATT_TC_LDP * sizeof(bf16)) +
                           2 * ATT_BW_BQ * sizeof(float);
    const size_t smem_q = (size_t)ATT_DQ_BK * ld * sizeof(bf16) + (size_t)ATT_DQ_WARPS * 16 * ATT_TC_LDS * sizeof(float);
    int rc = 0;
    for (int b0 = 0; b0 < B && rc == 0; b0 += nb) {
        const int nbc = B - b0 < nb ? B - b0 : nb;
        for (int kh0 = 0; kh0 < KVH && rc == 0; kh0 += nkv) {
            const int nkc = KVH - kh0 < nkv ? KVH - kh0 : nkv;
            LAUNCH_KERNEL(dim3(ceil_div(T, ATT_BW_BK), nkc, nbc), dim3(ATT_BW_WARPS * 32), smem_kv, stream,
                          attention_bwd_dkdv_wmma_kernel)(dk, dv, ws, dout, lse, delta, q, k, v, T, Tp, H,
                                                          KVH, D, scale, b0, kh0, vec,
                                                          aligned16(dk) && aligned16(dv), seg);
            rc = launch_check("attention_bwd (dk, dv; tensor cores)");
            if (rc != 0) break;
            LAUNCH_KERNEL(dim3(ceil_div(T, ATT_DQ_BQ), nkc * group, nbc), dim3(ATT_DQ_WARPS * 32), smem_q,
                          stream, attention_bwd_dq_wmma_kernel)(dq, ws, k, T, Tp, H, KVH, D, b0, kh0 * group,
                                                                vec, aligned16(dq), seg);
            rc = launch_check("attention_bwd (dq; tensor cores)");
        }
    }
    ftk_scratch_put(ws, stream);
    return rc;
}

extern "C" int ftk_attention_bwd(void *dq, void *dk, void *dv, const void *dout, const void *out,
                                 const float *lse, const void *q, const void *k, const void *v,
                                 int B, int T, int H, int KVH, int D, const int32_t *seg,
                                 ftk_stream stream) {
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
    if (rc == 0 && g_attention_tensor_cores && D % 16 == 0) {
        rc = attention_bwd_wmma((bf16 *)dq, (bf16 *)dk, (bf16 *)dv, (const bf16 *)dout, lse, delta,
                                (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, B, T, H, KVH, D,
                                scale, vec, seg, stream);
        ftk_scratch_put(delta, stream);
        return rc;
    }
    const size_t smem = sizeof(float) * (size_t)(2 * ATT_BK * (D + 1) + 2 * ATT_BQ * D +
                                                 2 * ATT_BQ * ATT_BK + 2 * ATT_BQ);
    if (rc == 0) {
        LAUNCH_KERNEL(dim3(ceil_div(T, ATT_BK), KVH, B), dim3(ATT_THREADS), smem, stream,
                      attention_bwd_dkdv_kernel)((bf16 *)dk, (bf16 *)dv, (const bf16 *)dout, lse,
                                                 delta, (const bf16 *)q, (const bf16 *)k,
                                                 (const bf16 *)v, T, H, KVH, D, scale, vec, seg);
        rc = launch_check("attention_bwd (dk, dv)");
    }
    if (rc == 0) {
        LAUNCH_KERNEL(dim3(ceil_div(T, ATT_BQ), H, B), dim3(ATT_THREADS), smem, stream,
                      attention_bwd_dq_kernel)((bf16 *)dq, (const bf16 *)dout, lse, delta,
                                               (const bf16 *)q, (const bf16 *)k, (const bf16 *)v,
                                               T, H, KVH, D, scale, vec, seg);
        rc = launch_check("attention_bwd (dq)");
    }
    ftk_scratch_put(delta, stream);
    return rc;
}
