// test_fp8_gpu.c: the CUDA backend's FP8 ops (fp8_quantize, matmul_fp8: kernels/fp8_quantize.cu
// and cuBLASLt's scaled FP8 GEMM) against the CPU backend's (src/backend_cpu_fp8.c). Two builds,
// as test_backend_gpu.c: build/tests/gpu/test_fp8_gpu (a real GPU, make test-gpu; the GEMM
// cases need compute capability 8.9+, else they are skipped with a line) and
// build/tests/test_fp8_emu (the emulator, an emulated sm_90: the fast tier).
//
// Each case: bf16 inputs a (M, K) and b (N, K) on both backends; both quantise them (codes
// and stats must agree bit for bit: the same fp32 product and one correctly rounded
// conversion), then multiply. Every product of two FP8 values is exact in fp32 (4 x 4
// significant bits), so the two sides differ only by the order of K fp32 additions (a
// relative error of at most ~K 2^-24 of the sum of |terms|, NMSE ~1e-10 at K = 1024 on random
// signs) and the GPU's one bf16 rounding of the result (NMSE <= u^2 = 1.5e-5, u = 2^-8): the
// threshold is THR_BF16 = 2e-5, as for the bf16 GEMMs. With accumulate, D = C + the product,
// C read in bf16 on both. An fp32 output (the weight gradient's: out_dtype ST_F32) has no
// rounding to bf16; the two sides differ by the summation order (~K 2^-48 times the
// cancellation: NMSE ~1e-12 here, the emulator's case) and, on a real Hopper or Ada GPU, by its
// FP8 tensor cores' accumulator: partial sums kept to about 14 significant bits between
// cuBLASLt's promotions to fp32 (with fast accumulation off), a relative error near 2^-14 per
// partial sum, NMSE of order (2^-14)^2 = 3.7e-9. THR_F32 = 1e-6 sits ~270x above that and 5x
// below what one rounding through bf16 gives (uniform relative error within 2^-8: NMSE
// 2^-16 / 3 = 5.1e-6), so an fp32 GEMM that rounded through bf16 fails it. Then, as a check
// that the operands really were quantised, the FP8
// result against the unquantised product (CPU matmul_fwd on the bf16 values): each operand
// carries a relative rounding error of at most 2^-4 (e4m3) or 2^-3 (e5m2), uniform on random
// data, so the NMSE lies below 2 (u_a^2 + u_b^2) / 3 (0.013 for e5m2 x e4m3, 0.0052 for e4m3
// x e4m3; measured about half of that) and above 1e-4 (1e-5 with "+=": C dilutes it), where
// operands left unquantised would give only fp32 noise (~1e-12).
// Then --fp8's backend wrapper (src/fp8_linear.h): its matmul_fwd and matmul_bwd against the
// CPU's linear (case_wrapper's bounds), its weight gradient against the CPU's FP8 GEMM fed
// the same FP8 codes (dY^T in E5M2, X^T in E4M3: check_dw), and its bf16 fallbacks for widths
// the FP8 GEMM does not take and for dW at a row count that is not a multiple of 16, and its
// fused amax (case_fused).
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backend_cuda.h"
#include "common.h"
#include "fp8.h"
#include "fp8_linear.h"
#include "test.h"

#define THR_BF16 2e-5
#define THR_F32 1e-6   // (the header: FP8 tensor cores' ~14-bit partial sums)

static const backend *CPU, *GPU;
static uint64_t rng = 0x9e3779b97f4a7c15ull;

// n bf16-representable values of magnitude `scale` on both backends (cpu fp32, gpu in gdt:
// bf16, or fp32 for an fp32 gradient or output)
static void upload_as(float *host, void **cpu, void **gpu, size_t n, float scale, st_dtype gdt) {
    uint16_t *b = malloc(n * 2);
    for (size_t i = 0; i < n; i++) {
        b[i] = ft_f32_to_bf16(scale * test_rand_normal(&rng));
        host[i] = ft_bf16_to_f32(b[i]);
    }
    *cpu = CPU->alloc(n * 4);
    *gpu = GPU->alloc(n * st_dtype_size(gdt));
    CPU->copy_h2d(*cpu, host, n * 4);
    GPU->copy_h2d(*gpu, gdt == ST_F32 ? (const void *)host : b, n * st_dtype_size(gdt));
    free(b);
}
static void upload(float *host, void **cpu, void **gpu, size_t n, float scale) {
    upload_as(host, cpu, gpu, n, scale, ST_BF16);
}

// a GPU tensor (n, bf16 or fp32) read back as fp32
static float *gpu_floats(const void *gpu, size_t n, st_dtype dt) {
    float *g = malloc(n * 4);
    if (dt == ST_F32) {
        GPU->copy_d2h(g, gpu, n * 4);
        return g;
    }
    uint16_t *b = malloc(n * 2);
    GPU->copy_d2h(b, gpu, n * 2);
    for (size_t i = 0; i < n; i++) g[i] = ft_bf16_to_f32(b[i]);
    free(b);
    return g;
}

// both backends quantise x (rows, cols): 1 when the codes (and transposed codes) and the stats agree bitwise
static int quantize_both(void *cpu_x, void *gpu_x, int rows, int cols, fp8_format f, void **q_cpu, void **q_gpu,
                         float **s_cpu, float **s_gpu) {
    const size_t n = (size_t)rows * cols;
    *q_cpu = CPU->alloc(n), *q_gpu = GPU->alloc(n);
    void *t_cpu = CPU->alloc(n), *t_gpu = GPU->alloc(n);
    *s_cpu = CPU->alloc(12), *s_gpu = GPU->alloc(12);
    EXPECT(CPU->fp8_quantize(*q_cpu, t_cpu, *s_cpu, cpu_x, rows, cols, f) == 0, "cpu fp8_quantize: %s", ft_error_message());
    EXPECT(GPU->fp8_quantize(*q_gpu, t_gpu, *s_gpu, gpu_x, rows, cols, f) == 0, "cuda fp8_quantize: %s", ft_error_message());
    unsigned char *h = malloc(4 * n);
    float st[6];
    GPU->copy_d2h(h, *q_gpu, n);
    GPU->copy_d2h(h + n, t_gpu, n);
    CPU->copy_d2h(h + 2 * n, *q_cpu, n);
    CPU->copy_d2h(h + 3 * n, t_cpu, n);
    GPU->copy_d2h(st, *s_gpu, 12);
    CPU->copy_d2h(st + 3, *s_cpu, 12);
    const int same = memcmp(h, h + 2 * n, 2 * n) == 0 && memcmp(st, st + 3, 12) == 0;
    free(h);
    CPU->free(t_cpu);
    GPU->free(t_gpu);
    return same;
}

// out (M, N) on the GPU (odt) against the CPU's (fp32), and the CPU's FP8 result against exact
static void compare(const char *shape, void *out_cpu, void *out_gpu, st_dtype odt, const float *exact, size_t n,
                    double lo, double hi) {
    float *c = malloc(n * 4), *g = gpu_floats(out_gpu, n, odt);
    CPU->copy_d2h(c, out_cpu, n * 4);
    const double e = test_nmse(g, c, n), q = test_nmse(c, exact, n), thr = odt == ST_F32 ? THR_F32 : THR_BF16;
    printf("%-12s %-34s %-9s %10.3e %8.1e  %s\n", "matmul_fp8", shape, "out", e, thr, e <= thr ? "pass" : "FAIL");
    printf("%-12s %-34s %-9s %10.3e %8.1e  %s (FP8 vs bf16 operands, within [%.0e, %.1e])\n", "matmul_fp8", shape,
           "quantised", q, hi, q >= lo && q <= hi ? "pass" : "FAIL", lo, hi);
    EXPECT(e <= thr, "matmul_fp8 %s: NMSE %.3e", shape, e);
    EXPECT(q >= lo && q <= hi, "matmul_fp8 %s: FP8 vs exact NMSE %.3e outside [%.0e, %.1e]", shape, q, lo, hi);
    free(c), free(g);
}

// (odt: the output's dtype on the GPU, ST_BF16 or ST_F32; the CPU's is fp32)
static void case_matmul(int M, int N, int K, fp8_format fa, fp8_format fb, int accumulate, st_dtype odt) {
    char shape[96];
    snprintf(shape, sizeof shape, "%dx%dx%d %s x %s%s%s", M, N, K, fp8_name(fa), fp8_name(fb), accumulate ? " +=" : "",
             odt == ST_F32 ? " f32" : "");
    float *ha = malloc(sizeof(float) * M * K), *hb = malloc(sizeof(float) * N * K), *hc = malloc(sizeof(float) * M * N);
    void *a_cpu, *a_gpu, *b_cpu, *b_gpu, *c_cpu, *c_gpu, *qa_c, *qa_g, *qb_c, *qb_g;
    float *sa_c, *sa_g, *sb_c, *sb_g;
    upload(ha, &a_cpu, &a_gpu, (size_t)M * K, 3.0f);     // activations ~3, weights ~0.02: scales far from 1
    upload(hb, &b_cpu, &b_gpu, (size_t)N * K, 0.02f);
    upload_as(hc, &c_cpu, &c_gpu, (size_t)M * N, accumulate ? 1.0f : 0.0f, odt);
    EXPECT(quantize_both(a_cpu, a_gpu, M, K, fa, &qa_c, &qa_g, &sa_c, &sa_g), "%s: a's codes or stats differ", shape);
    EXPECT(quantize_both(b_cpu, b_gpu, N, K, fb, &qb_c, &qb_g, &sb_c, &sb_g), "%s: b's codes or stats differ", shape);
    // the unquantised product, the same C added
    float *exact = CPU->alloc(sizeof(float) * M * N);
    memcpy(exact, hc, sizeof(float) * M * N);
    CPU->matmul_fwd(exact, a_cpu, b_cpu, accumulate ? exact : NULL, M, K, N);
    EXPECT(CPU->matmul_fp8(c_cpu, qa_c, fa, sa_c, qb_c, fb, sb_c, M, N, K, accumulate, ST_F32) == 0,
           "cpu matmul_fp8: %s", ft_error_message());
    EXPECT(GPU->matmul_fp8(c_gpu, qa_g, fa, sa_g, qb_g, fb, sb_g, M, N, K, accumulate, odt) == 0, "cuda matmul_fp8: %s",
           ft_error_message());
    const double ua = fa == FP8_E4M3 ? 0x1p-4 : 0x1p-3, ub = fb == FP8_E4M3 ? 0x1p-4 : 0x1p-3;
    compare(shape, c_cpu, c_gpu, odt, exact, (size_t)M * N, accumulate ? 1e-5 : 1e-4, 2 * (ua * ua + ub * ub) / 3);
    void *cpu_bufs[] = {a_cpu, b_cpu, c_cpu, qa_c, qb_c, sa_c, sb_c, exact}, *gpu_bufs[] = {a_gpu, b_gpu, c_gpu, qa_g, qb_g, sa_g, sb_g};
    for (size_t i = 0; i < sizeof cpu_bufs / sizeof *cpu_bufs; i++) CPU->free(cpu_bufs[i]);
    for (size_t i = 0; i < sizeof gpu_bufs / sizeof *gpu_bufs; i++) GPU->free(gpu_bufs[i]);
    free(ha), free(hb), free(hc);
}

// NMSE of a GPU tensor (bf16 or fp32: dt) against a CPU fp32 one, reported within [lo, hi]
static void report_range(const char *what, const char *shape, void *cpu, void *gpu, st_dtype dt, size_t n, double lo,
                         double hi) {
    float *c = malloc(n * 4), *g = gpu_floats(gpu, n, dt);
    CPU->copy_d2h(c, cpu, n * 4);
    const double e = test_nmse(g, c, n);
    const int ok = e >= lo && e <= hi;
    printf("%-12s %-34s %-9s %10.3e %8.1e  %s (within [%.0e, %.1e])\n", "fp8_linear", shape, what, e, hi,
           ok ? "pass" : "FAIL", lo, hi);
    EXPECT(ok, "fp8_linear %s %s: NMSE %.3e outside [%.0e, %.1e]", shape, what, e, lo, hi);
    free(c), free(g);
}

// The wrapper's weight gradient dw_g (OC, IC; gdt) against the CPU's FP8 GEMM on the same
// codes: dY (N, OC) quantised to E5M2 and X (N, IC) to E4M3, both transposed (quantize_both
// shows the two backends' codes and scales agree bit for bit), dW = s_dy s_x dY^T X added to
// dw_old (fp32 copies of the GPU's old gradient, when acc). The GPU sums the same exact
// products in another order, then rounds once to gdt: within THR_BF16 (bf16) or THR_F32
// (fp32). The bf16 GEMM of the unquantised operands lies ~5e-3 away from this reference (the
// FP8 rounding noise, case_matmul's bound), and a wrong scale or transposition further: all
// fail. dw_old is overwritten with the reference.
static void check_dw(const char *shape, void *dw_old, void *dy_c, void *x_c, void *dw_g, st_dtype gdt, int N, int IC,
                     int OC, int acc) {
    void *dyt = CPU->alloc((size_t)N * OC), *xt = CPU->alloc((size_t)N * IC);
    float *st = CPU->alloc(6 * sizeof(float));
    EXPECT(CPU->fp8_quantize(NULL, dyt, st, dy_c, N, OC, FP8_E5M2) == 0 &&
           CPU->fp8_quantize(NULL, xt, st + 3, x_c, N, IC, FP8_E4M3) == 0 &&
           CPU->matmul_fp8(dw_old, dyt, FP8_E5M2, st, xt, FP8_E4M3, st + 3, OC, IC, N, acc, ST_F32) == 0,
           "cpu dW reference: %s", ft_error_message());
    const double thr = gdt == ST_F32 ? THR_F32 : THR_BF16;
    report_range("dW fp8", shape, dw_old, dw_g, gdt, (size_t)OC * IC, 0, thr);
    CPU->free(dyt), CPU->free(xt), CPU->free(st);
}

// --fp8's wrapper (src/fp8_linear.h) against the CPU's bf16-input linear: the forward (with a
// residual) and dX carry FP8 quantisation noise (e4m3 x e4m3: NMSE <= 5.2e-3; dX, e5m2 dY x
// e4m3 W: <= 1.3e-2; both well above THR_BF16, so the FP8 path ran); dW (into a gradient of
// dtype gdt, added to its old value when acc_dw) likewise (e5m2 dY^T x e4m3 X^T: <= 1.3e-2,
// and >= 1e-5 with the old value diluting it) when N is a multiple of 16 (fp8_linear_dw_ok),
// and then exactly the CPU's FP8 GEMM on the same codes (check_dw); else dW is the bf16
// GEMM's (THR_BF16, or THR_F32 into fp32); widths not multiples of 16 (a LoRA rank of 8) run
// in bf16 throughout
static void case_wrapper(int N, int IC, int OC, st_dtype gdt, int acc_dw) {
    const backend *W = NULL;
    EXPECT(fp8_linear_backend(GPU, &W) == 0, "wrapper: %s", ft_error_message());
    if (!W) return;
    // the lm_head's logits and the MFU benchmark take the inner backend (bf16)
    EXPECT(fp8_linear_unwrap(W) == GPU && fp8_linear_unwrap(GPU) == GPU && W->matmul_fwd != GPU->matmul_fwd,
           "fp8_linear_unwrap: the wrapper's inner backend, any other backend itself");
    const int fp8 = IC % 16 == 0 && OC % 16 == 0, dw8 = fp8 && N % 16 == 0;
    EXPECT(fp8_linear_shape_ok(IC, OC) == fp8 && fp8_linear_dw_ok(N, IC, OC) == dw8, "the FP8 shape rules");
    char shape[64];
    snprintf(shape, sizeof shape, "N %d IC %d OC %d%s%s%s", N, IC, OC, fp8 ? "" : " (bf16)", gdt == ST_F32 ? " f32" : "",
             acc_dw ? " +=" : "");
    float *h = malloc(sizeof(float) * ((size_t)N * IC + (size_t)OC * IC + 2 * (size_t)N * OC));
    void *x_c, *x_g, *w_c, *w_g, *r_c, *r_g, *dy_c, *dy_g, *dw_c, *dw_g;
    upload(h, &x_c, &x_g, (size_t)N * IC, 1.0f);
    upload(h, &w_c, &w_g, (size_t)OC * IC, 0.05f);
    upload(h, &r_c, &r_g, (size_t)N * OC, 0.1f);
    upload(h, &dy_c, &dy_g, (size_t)N * OC, 1e-3f);
    upload_as(h, &dw_c, &dw_g, (size_t)OC * IC, acc_dw ? 1e-2f : 0.0f, gdt);   // dW's old value
    void *o_c = CPU->alloc(4 * (size_t)N * OC), *o_g = GPU->alloc(2 * (size_t)N * OC);
    void *dx_c = CPU->alloc(4 * (size_t)N * IC), *dx_g = GPU->alloc(2 * (size_t)N * IC);
    void *dw_ref = CPU->alloc(4 * (size_t)OC * IC);
    CPU->copy_d2d(dw_ref, dw_c, 4 * (size_t)OC * IC);
    EXPECT(CPU->matmul_fwd(o_c, x_c, w_c, r_c, N, IC, OC) == 0 && W->matmul_fwd(o_g, x_g, w_g, r_g, N, IC, OC) == 0,
           "forward: %s", ft_error_message());
    EXPECT(CPU->matmul_bwd(dx_c, dw_c, ST_F32, dy_c, x_c, w_c, N, IC, OC, 0, acc_dw) == 0 &&
           W->matmul_bwd(dx_g, dw_g, gdt, dy_g, x_g, w_g, N, IC, OC, 0, acc_dw) == 0, "backward: %s", ft_error_message());
    report_range("out", shape, o_c, o_g, ST_BF16, (size_t)N * OC, fp8 ? 1e-5 : 0, fp8 ? 5.2e-3 : THR_BF16);
    report_range("dinp", shape, dx_c, dx_g, ST_BF16, (size_t)N * IC, fp8 ? 1e-4 : 0, fp8 ? 1.3e-2 : THR_BF16);
    report_range("dweight", shape, dw_c, dw_g, gdt, (size_t)OC * IC, dw8 ? (acc_dw ? 1e-5 : 1e-4) : 0,
                 dw8 ? 1.3e-2 : gdt == ST_F32 ? THR_F32 : THR_BF16);
    if (dw8) check_dw(shape, dw_ref, dy_c, x_c, dw_g, gdt, N, IC, OC, acc_dw);
    void *cb[] = {x_c, w_c, r_c, dy_c, o_c, dx_c, dw_c, dw_ref}, *gb[] = {x_g, w_g, r_g, dy_g, o_g, dx_g, dw_g};
    for (int i = 0; i < 8; i++) CPU->free(cb[i]);
    for (int i = 0; i < 7; i++) GPU->free(gb[i]);
    free(h);
}

// 1 when the two (N, OC) bf16 outputs of the GPU are bitwise equal
static int same_output(const void *a, const void *b, size_t n) {
    uint16_t *ha = malloc(2 * n), *hb = malloc(2 * n);
    const int ok = GPU->copy_d2h(ha, a, 2 * n) == 0 && GPU->copy_d2h(hb, b, 2 * n) == 0 && memcmp(ha, hb, 2 * n) == 0;
    free(ha), free(hb);
    return ok;
}

// W->matmul_fwd of y twice: first as it comes (*fused_delta: how many activations it
// quantised from a producer's amax), then after W->zero on another buffer (the wrapper
// forgets: its own amax pass); 1 when both outputs are bitwise equal
static int fused_vs_own_pass(const backend *W, const void *y, const void *wt, int N, int IC, int OC,
                             long *fused_delta) {
    const size_t n = (size_t)N * OC;
    void *o1 = GPU->alloc(2 * n), *o2 = GPU->alloc(2 * n);
    long f0, f1, all;
    fp8_linear_fused_counts(&f0, &all);
    EXPECT(W->matmul_fwd(o1, y, wt, NULL, N, IC, OC) == 0, "forward: %s", ft_error_message());
    fp8_linear_fused_counts(&f1, &all);
    EXPECT(W->zero(o2, 2 * n) == 0 && W->matmul_fwd(o2, y, wt, NULL, N, IC, OC) == 0, "forward: %s",
           ft_error_message());
    *fused_delta = f1 - f0;
    fp8_linear_fused_counts(&f0, &all);
    EXPECT(f0 == f1, "the linear after another op used a producer's amax");
    const int same = same_output(o1, o2, n);
    GPU->free(o1), GPU->free(o2);
    return same;
}

// --fp8's fused amax (src/fp8_linear.h): a linear on rmsnorm_fwd's and swiglu_fwd's output
// through the wrapper is quantised from the producer's amax (counted) and gives the bits of its
// own amax pass; after `scale` rewrote that output in place (x3), the next linear takes the
// new values' amax (not counted as fused; a stale amax would saturate a third of the codes)
static void case_fused(int N, int C, int OC) {
    const backend *W = NULL;
    EXPECT(fp8_linear_backend(GPU, &W) == 0, "wrapper: %s", ft_error_message());
    if (!W) return;
    float *h = malloc(sizeof(float) * ((size_t)N * C * 3 + (size_t)OC * C + C));
    void *x_c, *x_g, *wn_c, *wn_g, *wt_c, *wt_g, *g_c, *g_g, *u_c, *u_g;
    upload(h, &x_c, &x_g, (size_t)N * C, 1.0f);
    upload(h, &wn_c, &wn_g, (size_t)C, 1.0f);
    upload(h, &wt_c, &wt_g, (size_t)OC * C, 0.05f);
    upload(h, &g_c, &g_g, (size_t)N * C, 2.0f);
    upload(h, &u_c, &u_g, (size_t)N * C, 1.0f);
    void *y = GPU->alloc(2 * (size_t)N * C), *a = GPU->alloc(2 * (size_t)N * C);
    float *rstd = GPU->alloc(4 * (size_t)N);
    long d;
    EXPECT(W->rmsnorm_fwd(y, rstd, NULL, x_g, wn_g, N, C, 1e-5f) == 0, "rmsnorm: %s", ft_error_message());
    EXPECT(fused_vs_own_pass(W, y, wt_g, N, C, OC, &d) && d == 1,
           "N %d C %d OC %d: rmsnorm's output: fused %ld, or not the bits of its own amax pass", N, C, OC, d);
    EXPECT(W->rmsnorm_fwd(y, rstd, NULL, x_g, wn_g, N, C, 1e-5f) == 0 && W->scale(y, y, 3.0f, (size_t)N * C) == 0,
           "rmsnorm, scale: %s", ft_error_message());
    EXPECT(fused_vs_own_pass(W, y, wt_g, N, C, OC, &d) && d == 0,
           "N %d C %d OC %d: rewritten by scale: fused %ld, or a stale amax used", N, C, OC, d);
    EXPECT(W->swiglu_fwd(a, NULL, g_g, u_g, N, C, C) == 0, "swiglu: %s", ft_error_message());
    EXPECT(fused_vs_own_pass(W, a, wt_g, N, C, OC, &d) && d == 1,
           "N %d F %d OC %d: swiglu's output: fused %ld, or not the bits of its own amax pass", N, C, OC, d);
    printf("%-12s N %d C %d OC %d: fused amax bitwise its own pass's, a rewritten input not fused\n", "fp8_fused", N, C,
           OC);
    void *cb[] = {x_c, wn_c, wt_c, g_c, u_c}, *gb[] = {x_g, wn_g, wt_g, g_g, u_g, y, a, rstd};
    for (int i = 0; i < 5; i++) CPU->free(cb[i]);
    for (int i = 0; i < 8; i++) GPU->free(gb[i]);
    free(h);
}

// --fp8's wrapper with an output the FP8 GEMM may not write (not 16-byte aligned: one bf16
// element past an aligned buffer): the linear runs in bf16, bitwise the inner backend's
static void case_unaligned(int N, int IC, int OC) {
    const backend *W = NULL;
    EXPECT(fp8_linear_backend(GPU, &W) == 0, "wrapper: %s", ft_error_message());
    if (!W) return;
    float *h = malloc(sizeof(float) * ((size_t)N * IC + (size_t)OC * IC));
    void *x_c, *x_g, *w_c, *w_g;
    upload(h, &x_c, &x_g, (size_t)N * IC, 1.0f);
    upload(h, &w_c, &w_g, (size_t)OC * IC, 0.05f);
    const size_t n = (size_t)N * OC;
    uint16_t *o1 = GPU->alloc(2 * (n + 8)), *o2 = GPU->alloc(2 * n);
    EXPECT(W->matmul_fwd(o1 + 1, x_g, w_g, NULL, N, IC, OC) == 0 && GPU->matmul_fwd(o2, x_g, w_g, NULL, N, IC, OC) == 0,
           "forward: %s", ft_error_message());
    EXPECT(same_output(o1 + 1, o2, n), "N %d IC %d OC %d: an unaligned output: not the bf16 GEMM's bits", N, IC, OC);
    printf("%-12s N %d IC %d OC %d: an output 2 bytes off alignment runs in bf16\n", "fp8_unalign", N, IC, OC);
    CPU->free(x_c), CPU->free(w_c);
    GPU->free(x_g), GPU->free(w_g), GPU->free(o1), GPU->free(o2);
    free(h);
}

// a refusal: rc non-zero, its line printed
static void refused(int rc, const char *what) {
    EXPECT(rc != 0, "%s refused", what);
    printf("refused: %s\n", ft_error_message());
    ft_error_clear();
}

// what matmul_fp8 refuses with a line: two E5M2 operands, K not a multiple of 16, an output
// dtype other than bf16 and fp32 (CUDA) or than fp32 (the CPU)
static void case_refusals(void) {
    void *q = GPU->alloc(4096), *o = GPU->alloc(4096);
    float *s = GPU->alloc(12);
    EXPECT(GPU->fp8_quantize(q, NULL, s, GPU->alloc(2 * 1024), 32, 32, FP8_E5M2) == 0, "quantize: %s", ft_error_message());
    refused(GPU->matmul_fp8(o, q, FP8_E5M2, s, q, FP8_E5M2, s, 32, 32, 32, 0, ST_BF16), "e5m2 x e5m2");
    refused(GPU->matmul_fp8(o, q, FP8_E4M3, s, q, FP8_E4M3, s, 16, 16, 24, 0, ST_BF16), "K 24");
    refused(GPU->matmul_fp8(o, q, FP8_E4M3, s, q, FP8_E4M3, s, 16, 16, 32, 0, ST_F16), "an fp16 output");
    refused(CPU->matmul_fp8(o, q, FP8_E4M3, s, q, FP8_E4M3, s, 16, 16, 32, 0, ST_BF16), "cpu: a bf16 output");
    refused(CPU->matmul_fp8(o, q, FP8_E4M3, s, q, FP8_E4M3, s, 16, 16, 24, 0, ST_F32), "cpu: K 24");
}

int main(void) {
    setenv("FT_EMU_COMPUTE_CAPABILITY", "9.0", 0);   // the emulated build: an H100 (ignored on a GPU)
    CPU = backend_cpu();
    if (backend_open("cuda", 0, (size_t)1 << 30, &GPU) != 0) {
        printf("skip: test_fp8_gpu SKIPPED: %s\n", ft_error_message());
        return 0;
    }
    printf("test_fp8_gpu: %s\n", backend_describe(GPU));
    if (!backend_cuda_fp8_capable()) {
        printf("skip: test_fp8_gpu SKIPPED: no FP8 tensor cores on this device\n");
        backend_close(GPU);
        return 0;
    }
    // (M, N, K): one tile, odd M and N, the bundled model's projections at B*T = 513, a
    // longer K; the three format pairs; "+=" (the backward's accumulating GEMMs); an fp32
    // output, set and added to (the weight gradient into an fp32 buffer), at an odd-but-legal
    // dW shape (OC 7, IC 33, K = 144 token rows: a multiple of 16, not of 64) and E5M2 x E4M3
    const int mm[][3] = {{16, 16, 16}, {7, 33, 64}, {513, 96, 288}, {64, 256, 1024}};
    for (int i = 0; i < 4; i++) case_matmul(mm[i][0], mm[i][1], mm[i][2], FP8_E4M3, FP8_E4M3, 0, ST_BF16);
    case_matmul(65, 48, 128, FP8_E5M2, FP8_E4M3, 0, ST_BF16);
    case_matmul(48, 65, 128, FP8_E4M3, FP8_E5M2, 0, ST_BF16);
    case_matmul(33, 40, 96, FP8_E4M3, FP8_E4M3, 1, ST_BF16);
    case_matmul(7, 33, 144, FP8_E5M2, FP8_E4M3, 0, ST_F32);
    case_matmul(7, 33, 144, FP8_E5M2, FP8_E4M3, 1, ST_F32);
    case_matmul(96, 48, 64, FP8_E5M2, FP8_E4M3, 1, ST_BF16);
    // the wrapper: N 130 (dW in bf16: not a multiple of 16), N 144 (dW in FP8, into bf16 and
    // into fp32, set and added to), N 48 at odd widths, a LoRA rank of 8 (bf16 throughout)
    case_wrapper(130, 96, 64, ST_BF16, 0);
    case_wrapper(130, 96, 64, ST_F32, 1);
    case_wrapper(144, 96, 64, ST_BF16, 0);
    case_wrapper(144, 96, 64, ST_BF16, 1);
    case_wrapper(144, 64, 96, ST_F32, 1);
    case_wrapper(48, 160, 32, ST_F32, 0);
    case_wrapper(64, 8, 48, ST_BF16, 0);
    case_fused(130, 96, 64);
    case_unaligned(64, 96, 48);
    case_refusals();
    fp8_linear_release();
    backend_close(GPU);
    TEST_SUMMARY("test_fp8_gpu");
}
