// backend_count.c: the counting backend and provider (see backend_count.h).
//
// Per-op costs, as the step-time estimate has always assumed them (e bytes per storage
// element; N = B T rows): every kernel reads each input and writes each output once from
// HBM (a row re-read inside a kernel is taken to hit the cache; weights of C elements and
// the RoPE tables are left out); fp32 statistics (rstd, lse, the attention delta) 4 bytes;
// token ids and targets 4 bytes. Device operations per call: the CUDA backend's.
#include "backend_count.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "fp8_linear.h"
#include "lora.h"
#include "model.h"

static struct {
    count_result *out;
    count_phase phase;
    int n_layers;
    double e;             // bytes per storage element
    int grads_f32;        // the gradient units are fp32
    int fp8;              // --fp8 (count_job.fp8)
    int fp8_fused;        // and its producers' amax used (not FT_TEST_FP8_UNFUSED)
    uintptr_t next;       // the next address alloc hands out
    const void *fused;    // --fp8: the output whose amax its producer computed (fp8_linear.h), NULL none
    size_t fused_n;       // its elements
} g;

// (every op tallies: like --fp8's wrapper, any op forgets the fused amax; matmul_fwd restores it)
static void tally(count_kind k, double flops, double flop_ops, double bytes, double byte_ops) {
    count_tally *t = &g.out->t[g.phase][k];
    g.fused = NULL;
    t->calls += 1;
    t->flops += flops;
    t->flop_ops += flop_ops;
    t->bytes += bytes;
    t->byte_ops += byte_ops;
}

// a memory-bound op: `elems` storage elements moved plus `extra` bytes, in `ops` device operations
static int mem_op(double elems, double extra, double ops) {
    tally(COUNT_MEMORY, 0, 0, elems * g.e + extra, ops);
    return 0;
}

// ----------------------------------------------------------------------------
// memory: addresses only

// Addresses from 4 GiB up, 256-byte aligned, never dereferenced (a plan's buffers fit well
// below the 47-bit user address limit).
static void *count_alloc(size_t n) {
    const uintptr_t p = g.next;
    g.next += (n + 255) / 256 * 256;
    return (void *)p;
}
static void count_free(void *p) { (void)p; }
static int count_copy_h2d(void *d, const void *s, size_t n) { (void)d, (void)s, (void)n; g.fused = NULL; return 0; }
// host memory is real: the model reads what it copies back (the losses), so zeros
static int count_copy_d2h(void *d, const void *s, size_t n) { (void)s; memset(d, 0, n); return 0; }
static int count_copy_d2d(void *d, const void *s, size_t n) { (void)d, (void)s, (void)n; g.fused = NULL; return 0; }
static int count_zero(void *p, size_t n) { (void)p; return mem_op(0, (double)n, 1); }   // a memset
static int count_sync(void) { return 0; }
static void *count_host_alloc(size_t n) {
    (void)n;
    ft_error("op counting: the model asked for pinned host memory");
    return NULL;
}

// ----------------------------------------------------------------------------
// layers

// embedding: rows of wte read, out written; backward: dout read, dwte rows read and written; token ids
static int count_embedding_fwd(void *o, const int32_t *t, const void *w, int N, int C, int V) {
    (void)o, (void)t, (void)w, (void)V;
    return mem_op(2.0 * N * C, 4.0 * N, 1);
}
static int count_embedding_bwd(void *dw, st_dtype gdt, const void *d, const int32_t *t, int N, int C, int V) {
    (void)dw, (void)gdt, (void)d, (void)t, (void)V;
    return mem_op(3.0 * N * C, 4.0 * N, 1);
}
// --fp8 (fp8_linear.c): a producer of a linear's input computes its amax too: the slot's
// memset first (4 bytes, one more operation); the output remembered for count_matmul_fwd
static int fused_producer(const void *out, size_t n) {
    if (!g.fp8_fused) return 0;
    mem_op(0, 4, 1);
    g.fused = out, g.fused_n = n;
    return 0;
}
// RMSNorm: in and out (2 N C) + rstd; backward: dout, inp, dinp read and written, the weight
// gradient's partial sums (6 N C) + rstd, in 3 kernels (dinp, partial sums, their sum)
static int count_rmsnorm_fwd(void *o, float *r, float *am, const void *x, const void *w, int N, int C, float eps) {
    (void)r, (void)am, (void)x, (void)w, (void)eps;
    mem_op(2.0 * N * C, 4.0 * N, 1);
    return fused_producer(o, (size_t)N * C);
}
static int count_rmsnorm_bwd(void *dx, void *dw, st_dtype gdt, const void *d, const void *x, const void *w,
                             const float *r, int N, int C) {
    (void)dx, (void)dw, (void)gdt, (void)d, (void)x, (void)w, (void)r;
    return mem_op(6.0 * N * C, 4.0 * N, 3);
}
// RoPE: in and out; the fused q|k|v pass is 3 launches (q, k, v)
static int count_rope(void *o, const void *x, const float *c, const float *s, int B, int T, int NH, int D,
                      const int32_t *sg) {
    (void)o, (void)x, (void)c, (void)s, (void)sg;
    return mem_op(2.0 * B * T * NH * D, 0, 1);
}
static int count_rope_qkv_fwd(void *q, void *k, void *v, const void *x, const float *c, const float *s, int B, int T,
                              int H, int KVH, int D, const int32_t *sg) {
    (void)q, (void)k, (void)v, (void)x, (void)c, (void)s, (void)sg;
    return mem_op(2.0 * B * T * (H + 2.0 * KVH) * D, 0, 3);
}
static int count_rope_qkv_bwd(void *dx, const void *dq, const void *dk, const void *dv, const float *c, const float *s,
                              int B, int T, int H, int KVH, int D, const int32_t *sg) {
    (void)dx, (void)dq, (void)dk, (void)dv, (void)c, (void)s, (void)sg;
    return mem_op(2.0 * B * T * (H + 2.0 * KVH) * D, 0, 3);
}
static int count_fp8_quantize(void *o, void *ot, float *st, const void *x, int rows, int cols, fp8_format f);
static int count_fp8_cast(void *o, void *ot, float *st, const float *am, const void *x, int rows, int cols,
                          fp8_format f);
// GEMMs: 2 FLOPs per multiply-add; a residual added in the epilogue is read (N, OC). --fp8
// (fp8_linear.c): the activation (from its producer's amax when the input is the remembered
// output, which then stays remembered) and the weight quantised, a residual copied into the
// output first (read and written), then the FP8 GEMM
static int count_matmul_fwd(void *o, const void *x, const void *w, const void *r, int N, int IC, int OC) {
    (void)o, (void)w;
    const double epilogue = r ? (double)N * OC * g.e : 0;
    const void *fused = g.fused && x == g.fused && (size_t)N * IC == g.fused_n ? g.fused : NULL;
    if (!g.fp8 || !fp8_linear_shape_ok(IC, OC)) {   // (the wrapper's bf16 path keeps a remembered input)
        tally(COUNT_GEMM, 2.0 * N * IC * OC, 1, epilogue, 0);
        g.fused = fused;
        return 0;
    }
    if (fused) count_fp8_cast(&g, NULL, NULL, NULL, NULL, N, IC, FP8_E4M3);
    else count_fp8_quantize(&g, NULL, NULL, NULL, N, IC, FP8_E4M3);
    count_fp8_quantize(&g, NULL, NULL, NULL, OC, IC, FP8_E4M3);
    if (r) mem_op(2.0 * N * OC, 0, 1);
    tally(COUNT_GEMM_FP8, 2.0 * N * IC * OC, 1, epilogue, 0);
    g.fused = fused;
    return 0;
}
// dX and dW: one GEMM each, the one of a NULL output skipped. --fp8, as fp8_linear.c runs
// them: the output gradient quantised once (E5M2; its plain layout for dX, its transpose for
// dW); dX from it and the weight (transposed) in FP8; dW (fp8_linear_dw_ok: N a multiple of
// 16 too) from its transpose and the input's, in FP8; a dW outside that rule a bf16 GEMM.
// dW's epilogue (the gradient read when added to, in gdt) is not counted here on either path:
// plan_time.c's unit_grad_bytes prices the gradients' traffic beyond a bf16 epilogue and takes
// the rest as hidden under the GEMMs
static int count_matmul_bwd(void *dx, void *dw, st_dtype gdt, const void *d, const void *x, const void *w, int N,
                            int IC, int OC, int acc, int acc_dw) {
    (void)gdt, (void)d, (void)x, (void)w, (void)acc_dw;
    const double flops = 2.0 * N * IC * OC;
    const int dx8 = dx && g.fp8 && fp8_linear_shape_ok(IC, OC), dw8 = dw && g.fp8 && fp8_linear_dw_ok(N, IC, OC);
    if (dx8 || dw8) count_fp8_quantize(dx8 ? &g : NULL, dw8 ? &g : NULL, NULL, NULL, N, OC, FP8_E5M2);
    if (dx8) {
        count_fp8_quantize(NULL, &g, NULL, NULL, OC, IC, FP8_E4M3);
        tally(COUNT_GEMM_FP8, flops, 1, acc ? (double)N * IC * g.e : 0, 0);
        dx = NULL;
    }
    if (dw8) {
        count_fp8_quantize(NULL, &g, NULL, NULL, N, IC, FP8_E4M3);
        tally(COUNT_GEMM_FP8, flops, 1, 0, 0);
        dw = NULL;
    }
    const double products = (dx != NULL) + (dw != NULL);
    if (products > 0) tally(COUNT_GEMM, products * flops, products, 0, 0);
    return 0;
}
// causal attention: Q K^T and P V over on average T / 2 keys (model_attention_fwd_flops);
// one device operation (the path's backward count is the planner's)
static double attention_flops(int B, int T, int H, int D) { return 2.0 * 2.0 * H * D * (T / 2.0) * B * T; }
static int count_attention_fwd(void *o, float *l, const void *q, const void *k, const void *v, int B, int T, int H,
                               int KVH, int D, const int32_t *sg) {
    (void)o, (void)l, (void)q, (void)k, (void)v, (void)KVH, (void)sg;
    tally(COUNT_ATTN_FWD, attention_flops(B, T, H, D), 1, 0, 0);
    return 0;
}
// the backward's row pass: dout and out read, the fp32 delta (B, H, T) written
static int count_attention_bwd(void *dq, void *dk, void *dv, const void *d, const void *o, const float *l,
                               const void *q, const void *k, const void *v, int B, int T, int H, int KVH, int D,
                               const int32_t *sg) {
    (void)dq, (void)dk, (void)dv, (void)d, (void)o, (void)l, (void)q, (void)k, (void)v, (void)KVH, (void)sg;
    tally(COUNT_ATTN_BWD, attention_flops(B, T, H, D), 1, 2.0 * B * T * H * D * g.e + 4.0 * B * H * T, 0);
    return 0;
}
// SwiGLU: gate, up read, act written; backward: dout, gate, up read, dgate, dup written
static int count_swiglu_fwd(void *o, float *am, const void *ga, const void *u, int N, int F, int ld) {
    (void)am, (void)ga, (void)u, (void)ld;
    mem_op(3.0 * N * F, 0, 1);
    return fused_producer(o, (size_t)N * F);
}
static int count_swiglu_bwd(void *dg, void *du, const void *d, const void *ga, const void *u, int N, int F, int ld) {
    (void)dg, (void)du, (void)d, (void)ga, (void)u, (void)ld;
    return mem_op(5.0 * N * F, 0, 1);
}
static int count_scale(void *o, const void *x, float a, size_t n) {
    (void)o, (void)x, (void)a;
    return mem_op(2.0 * (double)n, 0, 1);
}

// The fused lm_head + loss per row chunk (backend_cuda.c cu_lmhead_xent): the logits GEMM, the
// softmax/xent row kernel (fp32 logits read, 4 N V; bf16 dlogits written in place, 2 N V;
// targets and losses 8 N), then the dX and dW GEMMs. With several chunks into a gradient that
// is not fp32, the fp32 (V, C) dW sum is read and written once more and rounded into it
// ((8 + e) V C, an accumulate and a cast kernel).
static int count_lmhead_xent(float *l, void *dx, void *dw, st_dtype gdt, const void *x, const void *w,
                             const int32_t *t, int N, int C, int V, float dl, int rows, float *ws, float *acc) {
    (void)l, (void)x, (void)w, (void)t, (void)dl, (void)ws, (void)acc;
    if (N <= 0 || rows <= 0) return 0;
    const double chunks = (N + rows - 1) / rows, products = 1 + (dx != NULL) + (dx && dw);
    const double nv = (double)N * V, several = dx && dw && N > rows && gdt != ST_F32;
    const double bytes = 4 * nv + (dx ? 2 * nv : 0) + 8.0 * N + several * (8 + g.e) * V * C;
    tally(COUNT_LMHEAD, products * 2.0 * N * C * V, products * chunks, bytes, chunks + 2 * several);
    return 0;
}

// FP8 (--fp8): the quantisation reads the tensor twice (amax, then the cast) and writes one
// byte per element per layout asked for, in 3 kernels (partial maxima, the scale, the cast);
// its GEMM at the FP8 rate (COUNT_GEMM_FP8), an accumulated output read in the epilogue
static int count_fp8_quantize(void *o, void *ot, float *st, const void *x, int rows, int cols, fp8_format f) {
    (void)st, (void)x, (void)f;
    const double n = (double)rows * cols;
    return mem_op(2.0 * n, n * ((o != NULL) + (ot != NULL)) + 12.0, 3);
}
// the amax given (its producer's): one read, 2 kernels (the scale, the cast)
static int count_fp8_cast(void *o, void *ot, float *st, const float *am, const void *x, int rows, int cols,
                          fp8_format f) {
    (void)st, (void)am, (void)x, (void)f;
    const double n = (double)rows * cols;
    return mem_op(n, n * ((o != NULL) + (ot != NULL)) + 16.0, 2);
}
static int count_matmul_fp8(void *o, const void *a, fp8_format af, const float *as, const void *b, fp8_format bf,
                            const float *bs, int M, int N, int K, int acc, st_dtype odt) {
    (void)o, (void)a, (void)af, (void)as, (void)b, (void)bf, (void)bs;
    tally(COUNT_GEMM_FP8, 2.0 * M * N * K, 1, acc ? (double)M * N * st_dtype_size(odt) : 0, 0);
    return 0;
}

// optimizer and utility ops: the model calls none of them
static int not_model(const char *op) { return ft_error("op counting: the model called %s, which it never did", op); }
static int count_adamw(float *m, void *p, const float *gr, void *a, void *v, st_dtype mdt, size_t n,
                       const adamw_params *ap) {
    (void)m, (void)p, (void)gr, (void)a, (void)v, (void)mdt, (void)n, (void)ap;
    return not_model("adamw");
}
static int count_sum_squares(double *o, const float *x, size_t n) { (void)o, (void)x, (void)n; return not_model("sum_squares"); }
static int count_accumulate(float *d, const void *s, st_dtype sdt, size_t n, float a) {
    (void)d, (void)s, (void)sdt, (void)n, (void)a;
    return not_model("accumulate");
}
static int count_cast(void *d, const float *s, size_t n) { (void)d, (void)s, (void)n; return not_model("cast_from_f32"); }
// the gradient norm of a unit's slice into its double (fsdp.c, not the model's): the slice's
// fp32 read once (4 n bytes), two kernels (the partials, their sum added in)
static int count_sum_squares_accumulate(double *acc, const float *x, size_t n) {
    (void)acc, (void)x;
    return mem_op(0, 4.0 * (double)n + 8, 2);
}
// the loss into the accumulator: one kernel reading losses and targets (8 N bytes), 16 bytes.
// Priced as memory-bound, which it is not: kernels/loss_accumulate.cu sums the rows on one
// thread, one dependent double add each, so its time is about N x (a double add's latency,
// ~10 cycles: an assumption, not measured) / the clock, ~20 us for the tutorial's 8 x 512
// rows on an H100, where its bytes price at the per-op floor (8 us). Kept: once per
// micro-batch that is under 0.01% of a 7B step; on the bundled model (16 x 512 rows, ~40 us
// of a measured 1.5 ms step) the floor was calibrated on that very step (plan_price.h), which
// holds this kernel. No count kind prices serial work; one would if a job's rows grew to
// where it shows.
static int count_loss_accumulate(double *acc, const float *l, const int32_t *t, int N) {
    (void)acc, (void)l, (void)t;
    return mem_op(0, 8.0 * N + 16, 1);
}

static backend count_table = {   // (dtype: the job's)
    .name = "count", .seq_bucket = 1,
    .alloc = count_alloc, .free = count_free, .copy_h2d = count_copy_h2d, .copy_d2h = count_copy_d2h,
    .copy_d2d = count_copy_d2d, .zero = count_zero, .synchronize = count_sync, .host_alloc = count_host_alloc,
    .embedding_fwd = count_embedding_fwd, .embedding_bwd = count_embedding_bwd, .rmsnorm_fwd = count_rmsnorm_fwd,
    .rmsnorm_bwd = count_rmsnorm_bwd, .rope_fwd = count_rope, .rope_bwd = count_rope, .rope_qkv_fwd = count_rope_qkv_fwd,
    .rope_qkv_bwd = count_rope_qkv_bwd, .matmul_fwd = count_matmul_fwd, .matmul_bwd = count_matmul_bwd,
    .attention_fwd = count_attention_fwd, .attention_bwd = count_attention_bwd, .swiglu_fwd = count_swiglu_fwd,
    .swiglu_bwd = count_swiglu_bwd, .scale = count_scale, .lmhead_xent = count_lmhead_xent, .adamw = count_adamw,
    .sum_squares = count_sum_squares, .sum_squares_accumulate = count_sum_squares_accumulate,
    .accumulate = count_accumulate, .cast_from_f32 = count_cast, .loss_accumulate = count_loss_accumulate,
    .fp8_quantize = count_fp8_quantize, .fp8_cast = count_fp8_cast, .matmul_fp8 = count_matmul_fp8,
};

// ----------------------------------------------------------------------------
// the provider: addresses, and the phase from the calls model.c makes around each layer

#define COUNT_PARAMS ((void *)(uintptr_t)0x10000000)   // below the allocations, never read
#define COUNT_GRADS ((void *)(uintptr_t)0x20000000)

static int prov_acquire(void *ctx, int u, int for_backward, void **params) {
    (void)ctx;
    *params = COUNT_PARAMS;
    // a layer acquired for the backward: its forward recomputed, if anything runs before grad_begin
    g.phase = u >= g.n_layers ? COUNT_ROOT : for_backward ? COUNT_LAYER_RECOMPUTE : COUNT_LAYER_FWD;
    return 0;
}
static int prov_release(void *ctx, int u) {
    (void)ctx, (void)u;
    g.phase = COUNT_ROOT;
    return 0;
}
static int prov_grad_begin(void *ctx, int u, unit_grad *ug) {
    (void)ctx;
    ug->data = COUNT_GRADS;
    ug->dtype = g.grads_f32 || g.e == 4 ? ST_F32 : ST_BF16;
    ug->fresh = 0;
    g.phase = u >= g.n_layers ? COUNT_ROOT : COUNT_LAYER_BWD;
    return 0;
}
static int prov_grad_end(void *ctx, int u) { (void)ctx, (void)u; return 0; }

// ----------------------------------------------------------------------------
// one micro-batch

// The model of `job` over the counting backend (its adapters over `ll`), run once.
static int count_run(const param_layout *l, const lora_layout *ll, const count_job *job) {
    const unit_provider prov = {NULL, prov_acquire, prov_release, prov_grad_begin, prov_grad_end};
    mem_tracker mem;
    mem_tracker_init(&mem, &count_table);
    model m;
    TRY(model_init_lora(&m, l, ll, &prov, &count_table, &mem, job->B, job->T, job->buffers, job->grads_f32));
    memset(g.out, 0, sizeof *g.out);   // (the setup's ops, e.g. the loss accumulator's memset, are no micro-batch's)
    g.fused = NULL;
    model_set_segments(&m, job->segments ? 0 : -1);
    const size_t n = (size_t)job->B * job->T;
    int32_t *tokens = ft_calloc(n, sizeof(int32_t), "op counting tokens");
    int32_t *targets = ft_calloc(n, sizeof(int32_t), "op counting targets");
    int rc = tokens && targets ? 0 : -1;
    if (rc == 0) {   // as the training step runs it: the loss stays on the device
        g.phase = COUNT_ROOT;
        rc = model_forward_backward(&m, &prov, tokens, targets, job->backward, 1.0f, NULL, NULL);
    }
    free(tokens);
    free(targets);
    model_free(&m);
    return rc;
}

int count_micro_batch(const llama_config *cfg, const count_job *job, count_result *out) {
    memset(out, 0, sizeof *out);
    g.out = out;
    g.n_layers = cfg->num_hidden_layers;
    g.e = (double)job->elem_bytes;
    g.next = (uintptr_t)1 << 32;
    g.grads_f32 = job->grads_f32;
    g.fp8 = job->fp8;
    g.fp8_fused = job->fp8 && !ft_getenv("FT_TEST_FP8_UNFUSED");   // (as the wrapper: fp8_linear_backend)
    count_table.dtype = job->elem_bytes == 2 ? ST_BF16 : ST_F32;
    param_layout l;
    TRY(param_layout_init(&l, cfg, 1));
    lora_layout ll;
    const int lora = job->lora && job->lora->rank;
    if (lora && lora_layout_init(&ll, cfg, job->lora, 1) != 0) {
        param_layout_free(&l);
        return -1;
    }
    const int rc = count_run(&l, lora ? &ll : NULL, job);
    if (lora) lora_layout_free(&ll);
    param_layout_free(&l);
    return rc;
}
