// backend_cpu_attention.c: causal softmax attention with GQA on the CPU, as BLAS tiles.
//
// A tile is ATT_ROWS query rows [i0, i1) of one (batch, head) against the keys [k0, i1) it
// may see: key blocks above the diagonal are never computed, and only the upper triangle of
// the diagonal block is (then masked). k0 = 0, or with segment starts (seg, backend.h) the
// first row's seg: keys before it are never computed, and those of a later row's earlier
// segments are masked like the upper triangle (zero probability). Per tile the forward is two sgemm calls with the
// softmax between them (scores -> probabilities in place, the row's logsumexp saved); the
// backward recomputes the probabilities from the saved logsumexp (the (T, T) matrix is never
// stored, as in a flash kernel) and makes four sgemm calls: dP = dO V^T, dQ = dS K,
// dK += dS^T Q, dV += P^T dO.
//
// Threads: tiles run in parallel (OpenBLAS, OpenMP build, runs each call single-threaded
// inside our parallel region: one pool, no oversubscription). Every output element is
// written by one task in a fixed order, so results do not depend on the schedule:
//   forward   one task per (tile, batch, head), largest tiles first
//   backward  one task per (batch, kv head): it owns dK, dV of that head and accumulates
//             the group's query heads and tiles into them in order
// Scratch: ATT_ROWS x T floats per thread for the forward, twice that for the backward, in
// the CPU backend's attention scratch slot (allocated once, reused every step).
#include <cblas.h>
#include <math.h>
#include <omp.h>

#include "backend_cpu_internal.h"
#include "common.h"

// query rows per tile: enough rows for sgemm to run near its peak, few enough that the
// masked half of the diagonal block (ATT_ROWS/2 wasted columns per row) stays small
#define ATT_ROWS 64
// below this many multiply-adds (B*H*T*T*D) one thread does it all: a parallel region costs
// more than ~20 us of work saves, far more when the cores are shared
#define ATT_PAR_MIN (1 << 20)

typedef struct {
    int B, T, H, KVH, D, group;
    size_t ldq, ldk;       // row strides of q/out/dq (H*D) and of k/v/dk/dv (KVH*D)
    float scale;           // 1/sqrt(D)
} att_shape;

// the op's tensors; each pass sets those it uses
typedef struct {
    const float *q, *k, *v;     // q (B, T, H, D); k, v (B, T, KVH, D)
    float *out, *lse;           // forward outputs: (B, T, H, D), (B, H, T)
    const float *o, *l;         // the same, as backward inputs
    const float *dout;          // (B, T, H, D)
    float *dq, *dk, *dv;        // like q, k, v
    const int32_t *seg;         // (B, T) segment starts, or NULL (backend.h)
} att_io;

static att_shape att_shape_of(int B, int T, int H, int KVH, int D) {
    att_shape s = {B, T, H, KVH, D, H / KVH, (size_t)H * D, (size_t)KVH * D, 1.0f / sqrtf((float)D)};
    return s;
}

// offsets of row t of head h (query side) / kv head kh (key side) in batch b
static size_t q_at(const att_shape *s, int b, int t, int h) { return ((size_t)b * s->T + t) * s->ldq + (size_t)h * s->D; }
static size_t k_at(const att_shape *s, int b, int t, int kh) { return ((size_t)b * s->T + t) * s->ldk + (size_t)kh * s->D; }

// ----------------------------------------------------------------------------
// forward

// Row r of a score tile (`lo` masked keys of earlier segments, scaled scores of the visible
// keys lo .. n - 1, then `width - n` masked ones) -> probabilities, zeros where masked;
// returns the row's logsumexp.
CPU_VECTOR_CLONES static float softmax_row(float *row, int lo, int n, int width) {
    const float m = cpu_row_max(row + lo, n - lo);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = lo; j < n; j++) {
        row[j] = cpu_expf(row[j] - m);
        sum += row[j];
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int j = lo; j < n; j++) row[j] *= inv;
    for (int j = 0; j < lo; j++) row[j] = 0.0f;
    for (int j = n; j < width; j++) row[j] = 0.0f;
    return m + logf(sum);
}

// the first key row t of batch b sees (seg: backend.h)
static int seg_of(const int32_t *seg, const att_shape *s, int b, int t) { return seg ? seg[(size_t)b * s->T + t] : 0; }

// Query rows [i0, i1) of head h in batch b against keys [k0, i1). S: (ATT_ROWS, T) scratch.
static void attention_fwd_tile(const att_io *io, const att_shape *s, int b, int h, int i0, int i1, float *S) {
    const int k0 = seg_of(io->seg, s, b, i0), rows = i1 - i0, keys = i1 - k0, kh = h / s->group;
    const float *Q = io->q + q_at(s, b, i0, h), *K = io->k + k_at(s, b, k0, kh), *V = io->v + k_at(s, b, k0, kh);
    // S (rows, keys) = scale * Q (rows, D) @ K (keys, D)^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, s->D, s->scale, Q, (int)s->ldq, K,
                (int)s->ldk, 0.0f, S, keys);
    float *l = io->lse + ((size_t)b * s->H + h) * s->T;   // (T) of this (b, h)
    for (int r = 0; r < rows; r++)
        l[i0 + r] = softmax_row(S + (size_t)r * keys, seg_of(io->seg, s, b, i0 + r) - k0, i0 + r + 1 - k0, keys);
    // out (rows, D) = P (rows, keys) @ V (keys, D)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, s->D, keys, 1.0f, S, keys, V, (int)s->ldk,
                0.0f, io->out + q_at(s, b, i0, h), (int)s->ldq);
}

int cpu_attention_fwd(void *out, float *lse, const void *q, const void *k, const void *v, int B, int T,
                      int H, int KVH, int D, const int32_t *seg) {
    const att_io io = {.q = q, .k = k, .v = v, .out = out, .lse = lse, .seg = seg};
    const att_shape s = att_shape_of(B, T, H, KVH, D);
    const int tiles = (T + ATT_ROWS - 1) / ATT_ROWS, heads = B * H;
    float *ws = cpu_scratch(CPU_SCRATCH_ATTENTION, (size_t)omp_get_max_threads() * ATT_ROWS * T);
    if (!ws) return -1;
    const int par = (double)heads * T * T * D >= ATT_PAR_MIN;
#pragma omp parallel for schedule(dynamic, 1) if (par)
    for (int task = 0; task < tiles * heads; task++) {
        const int tile = tiles - 1 - task / heads, bh = task % heads;   // largest tiles first
        const int i0 = tile * ATT_ROWS, i1 = i0 + ATT_ROWS < T ? i0 + ATT_ROWS : T;
        attention_fwd_tile(&io, &s, bh / H, bh % H, i0, i1, ws + (size_t)omp_get_thread_num() * ATT_ROWS * T);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// backward

// Row of a tile: S holds scaled scores, dP holds dO . V; on return S = P (probabilities,
// zeros where masked) and dP = dS = P * (dP - delta) * scale (the gradient of the
// pre-scale score; zeros where masked). Visible keys lo .. n - 1 of `width`.
CPU_VECTOR_CLONES static void softmax_bwd_row(float *S, float *dP, int lo, int n, int width, float lse, float delta,
                                              float scale) {
#pragma omp simd
    for (int j = lo; j < n; j++) {
        const float p = cpu_expf(S[j] - lse);
        S[j] = p;
        dP[j] = p * (dP[j] - delta) * scale;
    }
    for (int j = 0; j < lo; j++) S[j] = dP[j] = 0.0f;
    for (int j = n; j < width; j++) S[j] = dP[j] = 0.0f;
}

// Query rows [i0, i1) of head h in batch b: dQ of those rows overwritten, dK/dV of keys
// [k0, i1) of h's kv head accumulated (k0 as in the forward). S, dP: (ATT_ROWS, T) scratch each.
static void attention_bwd_tile(const att_io *io, const att_shape *s, int b, int h, int i0, int i1, float *S,
                               float *dP) {
    const int k0 = seg_of(io->seg, s, b, i0), rows = i1 - i0, keys = i1 - k0, kh = h / s->group, D = s->D;
    const int ldq = (int)s->ldq, ldk = (int)s->ldk;
    const size_t qo = q_at(s, b, i0, h), ko = k_at(s, b, k0, kh);
    const float *Q = io->q + qo, *dO = io->dout + qo, *K = io->k + ko, *V = io->v + ko;
    // S (rows, keys) = scale * Q K^T; dP (rows, keys) = dO V^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, D, s->scale, Q, ldq, K, ldk, 0.0f, S, keys);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, D, 1.0f, dO, ldq, V, ldk, 0.0f, dP, keys);
    const float *l = io->l + ((size_t)b * s->H + h) * s->T + i0;
    for (int r = 0; r < rows; r++) {
        const float *o = io->o + qo + (size_t)r * ldq, *g = dO + (size_t)r * ldq;
        float delta = 0.0f;   // sum_d dO * O of this row
#pragma omp simd reduction(+ : delta)
        for (int d = 0; d < D; d++) delta += g[d] * o[d];
        softmax_bwd_row(S + (size_t)r * keys, dP + (size_t)r * keys, seg_of(io->seg, s, b, i0 + r) - k0, i0 + r + 1 - k0,
                        keys, l[r], delta, s->scale);
    }
    // dQ (rows, D) = dS @ K; dK (keys, D) += dS^T @ Q; dV (keys, D) += P^T @ dO
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, D, keys, 1.0f, dP, keys, K, ldk, 0.0f, io->dq + qo, ldq);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, D, rows, 1.0f, dP, keys, Q, ldq, 1.0f, io->dk + ko, ldk);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, D, rows, 1.0f, S, keys, dO, ldq, 1.0f, io->dv + ko, ldk);
}

int cpu_attention_bwd(void *dq, void *dk, void *dv, const void *dout, const void *out, const float *lse,
                      const void *q, const void *k, const void *v, int B, int T, int H, int KVH, int D,
                      const int32_t *seg) {
    const att_io io = {.q = q, .k = k, .v = v, .o = out, .l = lse, .dout = dout, .dq = dq, .dk = dk, .dv = dv,
                       .seg = seg};
    const att_shape s = att_shape_of(B, T, H, KVH, D);
    const size_t per_thread = (size_t)2 * ATT_ROWS * T;
    float *ws = cpu_scratch(CPU_SCRATCH_ATTENTION, (size_t)omp_get_max_threads() * per_thread);
    if (!ws) return -1;
    // one task per (b, kv head); with a single one, OpenBLAS threads each call instead
    const int par = B * KVH > 1 && (double)B * H * T * T * D >= ATT_PAR_MIN;
#pragma omp parallel for schedule(dynamic, 1) if (par)
    for (int task = 0; task < B * KVH; task++) {
        const int b = task / KVH, kh = task % KVH;
        float *S = ws + (size_t)omp_get_thread_num() * per_thread, *dP = S + (size_t)ATT_ROWS * T;
        for (int t = 0; t < T; t++) {
            memset(io.dk + k_at(&s, b, t, kh), 0, sizeof(float) * D);
            memset(io.dv + k_at(&s, b, t, kh), 0, sizeof(float) * D);
        }
        for (int h = kh * s.group; h < (kh + 1) * s.group; h++)
            for (int i0 = 0; i0 < T; i0 += ATT_ROWS)
                attention_bwd_tile(&io, &s, b, h, i0, i0 + ATT_ROWS < T ? i0 + ATT_ROWS : T, S, dP);
    }
    return 0;
}
