// backend_cpu.c: the CPU backend, fp32 everywhere: the numerical oracle of the project.
//
// Plain C with OpenMP; GEMMs go through CBLAS (OpenBLAS, OpenMP build: the fastest CPU BLAS
// Debian ships for x86-64, and its OpenMP flavour shares our thread pool instead of
// oversubscribing the cores). Attention is in backend_cpu_attention.c. Every reduction runs
// in a fixed order (per-row loops, fixed column blocks, fixed chunk partials) so results are
// bitwise reproducible for a given thread count, which the gradient-checkpointing and resume
// tests rely on. Elementwise loops are written for `omp simd` (exp through cpu_expf), and
// run on one thread below PAR_MIN elements, where a parallel region costs more than it saves.
// Scratch lives in per-purpose buffers grown on first use (cpu_scratch): a step allocates
// nothing once the first step has run.
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backend_cpu_internal.h"
#include "bf16_sr.h"
#include "common.h"

// elementwise loops shorter than this run on the calling thread
#define PAR_MIN 32768

// ----------------------------------------------------------------------------
// memory

static void *cpu_alloc(size_t nbytes) {
    size_t rounded = (nbytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p) ft_error("cpu backend: out of memory allocating %zu bytes", nbytes);
    return p;
}
static void cpu_free(void *p) { free(p); }
static int cpu_copy(void *dst, const void *src, size_t nbytes) {
    if (nbytes) memmove(dst, src, nbytes);
    return 0;
}
static int cpu_zero(void *p, size_t nbytes) {
    if (nbytes) memset(p, 0, nbytes);
    return 0;
}
static int cpu_synchronize(void) { return 0; }
// host memory is the CPU's memory: the same allocator; copies happen at once
static int cpu_copy_async(void *dst, const void *src, size_t nbytes, int to_device, int ticket) {
    (void)to_device;
    if (ticket < 0 || ticket >= BACKEND_COPY_TICKETS) return ft_error("cpu backend: copy ticket %d out of range", ticket);
    return cpu_copy(dst, src, nbytes);
}
static int cpu_copy_wait(int ticket) {
    return ticket < 0 || ticket >= BACKEND_COPY_TICKETS ? ft_error("cpu backend: copy ticket %d out of range", ticket) : 0;
}

static struct { float *p; size_t n; } g_scratch[CPU_SCRATCH_COUNT];

float *cpu_scratch(int slot, size_t nfloats) {
    if (nfloats <= g_scratch[slot].n) return g_scratch[slot].p;
    float *p = cpu_alloc(nfloats * sizeof(float));
    if (!p) return NULL;
    free(g_scratch[slot].p);
    g_scratch[slot].p = p;
    g_scratch[slot].n = nfloats;
    return p;
}

// columns are processed in blocks of this many floats when reducing over rows
#define COL_BLOCK 64

// ----------------------------------------------------------------------------
// embedding

static int cpu_embedding_fwd(void *out_, const int32_t *tokens, const void *wte_, int N, int C,
                             int V) {
    float *out = out_;             // (N, C)
    const float *wte = wte_;       // (V, C)
    for (int n = 0; n < N; n++)
        if (tokens[n] < 0 || tokens[n] >= V)
            return ft_error("embedding_fwd: token %d at row %d is outside the vocab (%d)",
                            tokens[n], n, V);
#pragma omp parallel for if ((size_t)N * C >= PAR_MIN)
    for (int n = 0; n < N; n++)
        memcpy(out + (size_t)n * C, wte + (size_t)tokens[n] * C, sizeof(float) * C);
    return 0;
}

// fp32 storage: a parameter gradient is fp32 in either role (backend.h, gdt)
static int cpu_check_gdt(const char *op, st_dtype gdt) {
    return gdt == ST_F32 ? 0 : ft_error("%s: gradient dtype %s on the fp32 CPU backend", op, st_dtype_name(gdt));
}

static int cpu_embedding_bwd(void *dwte_, st_dtype gdt, const void *dout_, const int32_t *tokens, int N, int C,
                             int V) {
    float *dwte = dwte_;           // (V, C)
    const float *dout = dout_;     // (N, C)
    (void)V;
    TRY(cpu_check_gdt("embedding_bwd", gdt));
    // parallel over column blocks, rows in order: deterministic, no atomics
#pragma omp parallel for if ((size_t)N * C >= PAR_MIN)
    for (int c0 = 0; c0 < C; c0 += COL_BLOCK) {
        int c1 = c0 + COL_BLOCK < C ? c0 + COL_BLOCK : C;
        for (int n = 0; n < N; n++) {
            float *d = dwte + (size_t)tokens[n] * C;
            const float *g = dout + (size_t)n * C;
            for (int c = c0; c < c1; c++) d[c] += g[c];
        }
    }
    return 0;
}

// ----------------------------------------------------------------------------
// RMSNorm (HF LlamaRMSNorm: fp32 variance, x * rsqrt(var + eps), times weight)

static int cpu_rmsnorm_fwd(void *out_, float *rstd, float *amax, const void *inp_, const void *weight_, int N,
                           int C, float eps) {
    float *out = out_;             // (N, C)
    const float *inp = inp_;       // (N, C)
    const float *w = weight_;      // (C)
#pragma omp parallel for if ((size_t)N * C >= PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        double ss = 0.0;
#pragma omp simd reduction(+ : ss)
        for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
        float r = 1.0f / sqrtf((float)(ss / C) + eps);
        rstd[n] = r;
        float *y = out + (size_t)n * C;
#pragma omp simd
        for (int c = 0; c < C; c++) y[c] = w[c] * (x[c] * r);
    }
    if (amax) *amax = cpu_amax(out, (size_t)N * C);
    return 0;
}

static int cpu_rmsnorm_bwd(void *dinp_, void *dweight_, st_dtype gdt, const void *dout_, const void *inp_,
                           const void *weight_, const float *rstd, int N, int C) {
    float *dinp = dinp_;           // (N, C) +=
    float *dw = dweight_;          // (C) +=
    const float *dout = dout_, *inp = inp_, *w = weight_;
    TRY(cpu_check_gdt("rmsnorm_bwd", gdt));
    const int par = (size_t)N * C >= PAR_MIN;
#pragma omp parallel if (par)
    {
        // dx_i = r * w_i dy_i - r^3 / C * x_i * sum_j w_j dy_j x_j
#pragma omp for
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
            float *dx = dinp + (size_t)n * C;
            float r = rstd[n];
            double dot = 0.0;
#pragma omp simd reduction(+ : dot)
            for (int c = 0; c < C; c++) dot += (double)(w[c] * dy[c] * x[c]);
            float k = (float)(dot * r * r * r / C);
#pragma omp simd
            for (int c = 0; c < C; c++) dx[c] += r * w[c] * dy[c] - k * x[c];
        }
        // dw_i += sum_n dy_i x_i r_n, rows in order per column block
#pragma omp for
        for (int c0 = 0; c0 < C; c0 += COL_BLOCK) {
            int c1 = c0 + COL_BLOCK < C ? c0 + COL_BLOCK : C;
            float acc[COL_BLOCK] = {0};
            for (int n = 0; n < N; n++) {
                const float *x = inp + (size_t)n * C + c0, *dy = dout + (size_t)n * C + c0;
                const float r = rstd[n];
#pragma omp simd
                for (int c = 0; c < c1 - c0; c++) acc[c] += dy[c] * x[c] * r;
            }
            for (int c = c0; c < c1; c++) dw[c] += acc[c - c0];
        }
    }
    return 0;
}

// ----------------------------------------------------------------------------
// RoPE, rotate_half convention: pairs (i, i + D/2)

// NH heads of D per row for B*T rows, rows ld_out / ld_inp floats apart; rotate 0 copies.
// Row t of batch b takes the angles of position t, or t - seg[b, t] (seg not NULL).
static void rope_rotate(float *out, size_t ld_out, const float *inp, size_t ld_inp, const float *cos,
                        const float *sin, int B, int T, int NH, int D, float sign, int rotate,
                        const int32_t *seg) {
    int half = D / 2;
#pragma omp parallel for collapse(2) if ((size_t)B * T * NH * D >= PAR_MIN)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const size_t row = (size_t)b * T + t;
            const size_t pos = seg ? (size_t)(t - seg[row]) : (size_t)t;
            const float *ct = rotate ? cos + pos * half : NULL, *st = rotate ? sin + pos * half : NULL;
            for (int h = 0; h < NH; h++) {
                const float *x = inp + row * ld_inp + (size_t)h * D;
                float *y = out + row * ld_out + (size_t)h * D;
                if (!rotate) {
                    memmove(y, x, (size_t)D * sizeof(float));
                    continue;
                }
                for (int i = 0; i < half; i++) {
                    float x1 = x[i], x2 = x[i + half], s = sign * st[i];
                    y[i] = x1 * ct[i] - x2 * s;
                    y[i + half] = x2 * ct[i] + x1 * s;
                }
            }
        }
}

static int cpu_rope_fwd(void *out, const void *inp, const float *cos, const float *sin, int B,
                        int T, int NH, int D, const int32_t *seg) {
    const size_t ld = (size_t)NH * D;
    rope_rotate(out, ld, inp, ld, cos, sin, B, T, NH, D, 1.0f, 1, seg);
    return 0;
}

// the backward of a rotation by +theta is a rotation by -theta
static int cpu_rope_bwd(void *dinp, const void *dout, const float *cos, const float *sin, int B,
                        int T, int NH, int D, const int32_t *seg) {
    const size_t ld = (size_t)NH * D;
    rope_rotate(dinp, ld, dout, ld, cos, sin, B, T, NH, D, -1.0f, 1, seg);
    return 0;
}

// q|k|v rows of the fused projection, W = (H + 2 KVH) D floats each
static int cpu_rope_qkv_fwd(void *q, void *k, void *v, const void *qkv, const float *cos,
                            const float *sin, int B, int T, int H, int KVH, int D, const int32_t *seg) {
    const size_t W = (size_t)(H + 2 * KVH) * D, QD = (size_t)H * D, KVD = (size_t)KVH * D;
    const float *x = qkv;
    const int rot = cos != NULL;   // NULL tables: split only
    rope_rotate(q, QD, x, W, cos, sin, B, T, H, D, 1.0f, rot, seg);
    rope_rotate(k, KVD, x + QD, W, cos, sin, B, T, KVH, D, 1.0f, rot, seg);
    rope_rotate(v, KVD, x + QD + KVD, W, cos, sin, B, T, KVH, D, 1.0f, 0, seg);
    return 0;
}

static int cpu_rope_qkv_bwd(void *dqkv, const void *dq, const void *dk, const void *dv,
                            const float *cos, const float *sin, int B, int T, int H, int KVH, int D,
                            const int32_t *seg) {
    const size_t W = (size_t)(H + 2 * KVH) * D, QD = (size_t)H * D, KVD = (size_t)KVH * D;
    float *y = dqkv;
    const int rot = cos != NULL;   // NULL tables: gather only
    rope_rotate(y, W, dq, QD, cos, sin, B, T, H, D, -1.0f, rot, seg);
    rope_rotate(y + QD, W, dk, KVD, cos, sin, B, T, KVH, D, -1.0f, rot, seg);
    rope_rotate(y + QD + KVD, W, dv, KVD, cos, sin, B, T, KVH, D, -1.0f, 0, seg);
    return 0;
}

// ----------------------------------------------------------------------------
// matmul (nn.Linear without bias) through CBLAS

static int cpu_matmul_fwd(void *out, const void *inp, const void *weight, const void *residual,
                          int N, int IC, int OC) {
    // out (N, OC) = inp (N, IC) @ weight (OC, IC)^T (+ residual: copied into out, beta = 1)
    if (residual && residual != out) memcpy(out, residual, (size_t)N * OC * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, inp, IC, weight, IC,
                residual ? 1.0f : 0.0f, out, OC);
    return 0;
}

static int cpu_matmul_bwd(void *dinp, void *dweight, st_dtype gdt, const void *dout, const void *inp,
                          const void *weight, int N, int IC, int OC, int accumulate_dinp, int accumulate_dw) {
    if (dweight) TRY(cpu_check_gdt("matmul_bwd", gdt));
    if (dinp) // dinp (N, IC) = dout (N, OC) @ weight (OC, IC)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC, weight,
                    IC, accumulate_dinp ? 1.0f : 0.0f, dinp, IC);
    // dweight (OC, IC) += (or =) dout^T (OC, N) @ inp (N, IC)
    if (dweight)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, inp, IC,
                    accumulate_dw ? 1.0f : 0.0f, dweight, IC);
    return 0;
}

// ----------------------------------------------------------------------------
// SwiGLU: silu(gate) * up, silu(g) = g / (1 + exp(-g)) as torch computes it

// elements per task of the elementwise loops below
#define SPAN 4096

CPU_VECTOR_CLONES static void swiglu_fwd_span(float *out, const float *g, const float *u, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) out[i] = g[i] / (1.0f + cpu_expf(-g[i])) * u[i];
}

// rows of gate/up at stride ld (the fused (N, 2F) layout or separate (N, F) buffers)
static int cpu_swiglu_fwd(void *out_, float *amax, const void *gate_, const void *up_, int N, int F, int ld) {
    float *out = out_;
    const float *g = gate_, *u = up_;
#pragma omp parallel for if ((size_t)N * F >= PAR_MIN)
    for (int r = 0; r < N; r++)
        for (int j = 0; j < F; j += SPAN)
            swiglu_fwd_span(out + (size_t)r * F + j, g + (size_t)r * ld + j, u + (size_t)r * ld + j,
                            F - j < SPAN ? (size_t)(F - j) : SPAN);
    if (amax) *amax = cpu_amax(out, (size_t)N * F);
    return 0;
}

CPU_VECTOR_CLONES static void swiglu_bwd_span(float *dg, float *du, const float *dy, const float *g,
                                              const float *u, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float sig = 1.0f / (1.0f + cpu_expf(-g[i]));
        float silu = g[i] * sig;
        float gi = dy[i];                  // read before writing: dgate may alias dout
        dg[i] = gi * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
        du[i] = gi * silu;
    }
}

static int cpu_swiglu_bwd(void *dgate_, void *dup_, const void *dout_, const void *gate_,
                          const void *up_, int N, int F, int ld) {
    float *dg = dgate_, *du = dup_;
    const float *dy = dout_, *g = gate_, *u = up_;
#pragma omp parallel for if ((size_t)N * F >= PAR_MIN)
    for (int r = 0; r < N; r++)
        for (int j = 0; j < F; j += SPAN) {
            const size_t o = (size_t)r * ld + j;
            swiglu_bwd_span(dg + o, du + o, dy + (size_t)r * F + j, g + o, u + o,
                            F - j < SPAN ? (size_t)(F - j) : SPAN);
        }
    return 0;
}

static int cpu_scale(void *out_, const void *inp_, float alpha, size_t n) {
    float *out = out_;
    const float *inp = inp_;
#pragma omp parallel for simd if (parallel : n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] = alpha * inp[i];
    return 0;
}

// ----------------------------------------------------------------------------
// fused lm_head + cross-entropy over row chunks

// One row of logits (V): returns the row's loss (0 when ignored); with `grad`, the row
// becomes dlogits = dloss * (softmax - onehot(target)) (0 when ignored).
CPU_VECTOR_CLONES static float xent_row(float *l, int tgt, int V, float dloss, int grad) {
    if (tgt == -100) {
        if (grad) memset(l, 0, sizeof(float) * V);
        return 0.0f;
    }
    const float m = cpu_row_max(l, V);
    const float target_logit = l[tgt];
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < V; j++) {
        l[j] = cpu_expf(l[j] - m);
        sum += l[j];
    }
    if (grad) {
        const float k = (float)(dloss / sum);
#pragma omp simd
        for (int j = 0; j < V; j++) l[j] *= k;
        l[tgt] -= dloss;
    }
    return m + (float)log(sum) - target_logit;
}

// (fp32 storage: dweight accumulates in fp32 directly, dw_acc is not needed)
static int cpu_lmhead_xent(float *losses, void *dx_, void *dweight, st_dtype gdt, const void *x_,
                           const void *weight, const int32_t *targets, int N, int C, int V,
                           float dloss, int chunk_rows, float *logits_ws, float *dw_acc) {
    (void)dw_acc;
    if (dx_ && dweight) TRY(cpu_check_gdt("lmhead_xent", gdt));
    const float *x = x_;           // (N, C)
    float *dx = dx_;               // (N, C) or NULL
    if (chunk_rows <= 0) return ft_error("lmhead_xent: chunk of %d rows", chunk_rows);
    for (int n = 0; n < N; n++)
        if (targets[n] != -100 && (targets[n] < 0 || targets[n] >= V))
            return ft_error("lmhead_xent: target %d at row %d is outside the vocab (%d)",
                            targets[n], n, V);
    for (int n0 = 0; n0 < N; n0 += chunk_rows) {
        int rows = N - n0 < chunk_rows ? N - n0 : chunk_rows;
        float *logits = logits_ws; // (rows, V)
        cpu_matmul_fwd(logits, x + (size_t)n0 * C, weight, NULL, rows, C, V);
#pragma omp parallel for if ((size_t)rows * V >= PAR_MIN)
        for (int r = 0; r < rows; r++)
            losses[n0 + r] = xent_row(logits + (size_t)r * V, targets[n0 + r], V, dloss, dx != NULL);
        if (dx) cpu_matmul_bwd(dx + (size_t)n0 * C, dweight, ST_F32, logits, x + (size_t)n0 * C, weight,
                               rows, C, V, 0, 1);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// optimizer and utilities (torch.optim.AdamW single-tensor formula)

// --optimizer_moments bf16: the same element formula on moments stored in bf16, each read
// widened to fp32 and written back with stochastic rounding (src/bf16_sr.h; the bits of
// element i from p's seed, step and global index offset + i, as the CUDA kernel's); the
// update itself uses the unrounded fp32 values, as the kernel does
static void cpu_adamw_bf16_moments(float *master, float *param, const float *grad, uint16_t *m16, uint16_t *v16,
                                   size_t n, const adamw_params *p) {
    const float step_size = p->lr / p->bias_correction1, bc2_sqrt = sqrtf(p->bias_correction2);
    const float decay = 1.0f - p->lr * p->weight_decay, b1 = p->beta1, b2 = p->beta2;
    const float scale = p->grad_scale, eps = p->eps;
    const uint32_t km = ft_sr_key(p->seed, p->step, 0), kv = ft_sr_key(p->seed, p->step, 1);
#pragma omp parallel for if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * scale, w = master[i] * decay, m = ft_bf16_to_f32(m16[i]), v = ft_bf16_to_f32(v16[i]);
        m += (1.0f - b1) * (g - m);
        v = b2 * v + (1.0f - b2) * g * g;
        w -= step_size * (m / (sqrtf(v) / bc2_sqrt + eps));
        master[i] = w;
        uint32_t um, uv;
        memcpy(&um, &m, 4);
        memcpy(&uv, &v, 4);
        m16[i] = ft_f32_to_bf16_sr(um, ft_sr_bits(km, p->offset + i));
        v16[i] = ft_f32_to_bf16_sr(uv, ft_sr_bits(kv, p->offset + i));
        if (param) param[i] = w;
    }
}

static int cpu_adamw(float *master, void *param_, const float *grad, void *m_, void *v_, st_dtype mdt, size_t n,
                     const adamw_params *p) {
    float *param = param_ == (void *)master ? NULL : param_;
    if (mdt == ST_BF16) {
        cpu_adamw_bf16_moments(master, param, grad, m_, v_, n, p);
        return 0;
    }
    if (mdt != ST_F32) return ft_error("cpu adamw: moments dtype %s is not supported", st_dtype_name(mdt));
    float *m = m_, *v = v_;
    const float step_size = p->lr / p->bias_correction1, bc2_sqrt = sqrtf(p->bias_correction2);
    const float decay = 1.0f - p->lr * p->weight_decay, b1 = p->beta1, b2 = p->beta2;
    const float scale = p->grad_scale, eps = p->eps;
    // one vectorised pass; the second copy of the weights only when there is one
#define ADAMW_ELEMENT(i)                                                               \
    float g = grad[i] * scale;                                                         \
    float w = master[i] * decay;                                                       \
    m[i] += (1.0f - b1) * (g - m[i]);                                                  \
    v[i] = b2 * v[i] + (1.0f - b2) * g * g;                                            \
    w -= step_size * (m[i] / (sqrtf(v[i]) / bc2_sqrt + eps));                          \
    master[i] = w;
    if (param) {
#pragma omp parallel for simd if (parallel : n >= PAR_MIN)
        for (size_t i = 0; i < n; i++) { ADAMW_ELEMENT(i) param[i] = w; }
    } else {
#pragma omp parallel for simd if (parallel : n >= PAR_MIN)
        for (size_t i = 0; i < n; i++) { ADAMW_ELEMENT(i) }
    }
#undef ADAMW_ELEMENT
    return 0;
}

// fixed-size chunk partials summed in order: independent of the thread count
#define SUMSQ_CHUNK 4096
static int cpu_sum_squares(double *host_out, const float *x, size_t n) {
    size_t nchunks = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    // (nchunks) doubles in the float scratch
    double *part = (double *)cpu_scratch(CPU_SCRATCH_PARTIALS, 2 * (nchunks ? nchunks : 1));
    if (!part) return -1;
#pragma omp parallel for if (n >= PAR_MIN)
    for (size_t c = 0; c < nchunks; c++) {
        size_t i0 = c * SUMSQ_CHUNK, i1 = i0 + SUMSQ_CHUNK < n ? i0 + SUMSQ_CHUNK : n;
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (size_t i = i0; i < i1; i++) s += (double)x[i] * x[i];
        part[c] = s;
    }
    double total = 0.0;
    for (size_t c = 0; c < nchunks; c++) total += part[c];
    *host_out = total;
    return 0;
}

// sum_squares' chunks and order, added into *acc once (the CUDA kernel's contract)
static int cpu_sum_squares_accumulate(double *acc, const float *x, size_t n) {
    double s;
    TRY(cpu_sum_squares(&s, x, n));
    *acc += s;
    return 0;
}

static int cpu_accumulate(float *dst, const void *src_, st_dtype src_dtype, size_t n, float alpha) {
    if (src_dtype != ST_F32) return ft_error("cpu accumulate: source dtype %s, the CPU backend's is F32", st_dtype_name(src_dtype));
    const float *src = src_;
#pragma omp parallel for simd if (parallel : n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) dst[i] += alpha * src[i];
    return 0;
}

static int cpu_cast_from_f32(void *dst, const float *src, size_t n) {
    return cpu_copy(dst, src, n * sizeof(float));
}

// in row order from 0.0, one thread: the CUDA kernel's order (kernels/loss_accumulate.cu)
static int cpu_loss_accumulate(double *acc, const float *losses, const int32_t *targets, int N) {
    double s = 0.0;
    int count = 0;
    for (int i = 0; i < N; i++)
        if (targets[i] != -100) {
            s += (double)losses[i];
            count++;
        }
    acc[0] += s;
    acc[1] += (double)count;
    return 0;
}

// ----------------------------------------------------------------------------
// registration

static void cpu_close(void) {}
static const char *cpu_describe(void) { return "cpu (fp32, OpenMP + OpenBLAS)"; }
static double cpu_peak_tflops(void) { return 0; }   // no published peak: MFU measures the matmul rate

static const backend g_cpu = {
    .name = "cpu",
    .dtype = ST_F32,
    .seq_bucket = 1,   // exact trimming: the CPU has no per-shape cost
    .close = cpu_close,
    .describe = cpu_describe,
    .peak_tflops = cpu_peak_tflops,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy_h2d = cpu_copy,
    .copy_d2h = cpu_copy,
    .copy_d2d = cpu_copy,
    .zero = cpu_zero,
    .synchronize = cpu_synchronize,
    .host_alloc = cpu_alloc,
    .host_free = cpu_free,
    .copy_async = cpu_copy_async,
    .copy_wait = cpu_copy_wait,
    .embedding_fwd = cpu_embedding_fwd,
    .embedding_bwd = cpu_embedding_bwd,
    .rmsnorm_fwd = cpu_rmsnorm_fwd,
    .rmsnorm_bwd = cpu_rmsnorm_bwd,
    .rope_fwd = cpu_rope_fwd,
    .rope_bwd = cpu_rope_bwd,
    .rope_qkv_fwd = cpu_rope_qkv_fwd,
    .rope_qkv_bwd = cpu_rope_qkv_bwd,
    .matmul_fwd = cpu_matmul_fwd,
    .matmul_bwd = cpu_matmul_bwd,
    .attention_fwd = cpu_attention_fwd,
    .attention_bwd = cpu_attention_bwd,
    .swiglu_fwd = cpu_swiglu_fwd,
    .swiglu_bwd = cpu_swiglu_bwd,
    .scale = cpu_scale,
    .lmhead_xent = cpu_lmhead_xent,
    .adamw = cpu_adamw,
    .sum_squares = cpu_sum_squares,
    .sum_squares_accumulate = cpu_sum_squares_accumulate,
    .accumulate = cpu_accumulate,
    .cast_from_f32 = cpu_cast_from_f32,
    .fp8_quantize = cpu_fp8_quantize,
    .fp8_cast = cpu_fp8_cast,
    .matmul_fp8 = cpu_matmul_fp8,
    .loss_accumulate = cpu_loss_accumulate,
};

const backend *backend_cpu(void) { return &g_cpu; }
