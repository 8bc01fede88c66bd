// test_backend_gpu.c: every op of the CUDA backend (kernels + cuBLASLt, through the backend
// table) against the CPU backend. Two builds of this one source:
//   - build/tests/gpu/test_backend_gpu, linked with libcudart/cuBLASLt and the nvcc kernels:
//     part of `make test-gpu`, run only where a GPU exists (tests/gpu/test_gpu.sh skips it)
//   - build/tests/test_backend_emu, linked with the CPU emulator (tests/cuda_emu: the same
//     kernel sources, an emulated cuBLASLt): part of `make test-slow`, so the backend's host code
//     (GEMM operand mapping, "+=" contracts, copies, the arena) is checked in CI.
//
// Each case rounds random inputs to bf16 once, gives the CPU backend the fp32 values of
// those bf16 numbers and the CUDA backend the bf16 numbers, runs the op on both and
// compares each output by NMSE. Thresholds are those derived in tests/cuda_emu/
// test_kernels.cpp (the same kernels under the emulator): bf16 outputs rounded once from
// fp32 math, NMSE <= u^2 = 1.5e-5 for u = 2^-8, plus rounding flips from the GPU's
// approximate math: THR_BF16 = 2e-5; fp32 outputs differ only by fp32 summation order and
// approximate transcendentals: THR_F32 = 1e-9. cuBLASLt GEMMs accumulate in fp32 and round
// once to bf16, so they share THR_BF16. Output: a table (op, shape, output, NMSE, threshold).
// Shapes: small and odd ones, seq 512, V = 32016 and the bundled model at B*T = 513 in both
// builds (about 100 s emulated); `--large` adds CodeLlama-7b's (C 4096, F 11008, 32 x 128
// heads, V 32016) at seq 512 with B*T = 1000, and element-wise ops over 150M elements (past
// 65535 blocks: the grid-stride loops turn), for a real GPU (make test-gpu passes it).
// The GEMM plan cache (bounded, least recently used evicted) is checked with more distinct
// shapes than it holds: every result correct, a hot shape kept, an evicted shape rebuilt.
// Attention runs on cuDNN (src/attention_cudnn.h; the emulated build: its CPU stand-in) and on
// the native kernels, each against the CPU; cuDNN must have passed the backend's startup check.
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "attention_cudnn.h"
#include "backend.h"
#include "backend_cuda.h"
#include "common.h"
#include "kernels.h"   // ftk_attention_set_tensor_cores, ftk_attention_set_ds_cap
#include "model.h"
#include "test.h"

#define THR_BF16 2e-5
#define THR_F32 1e-9
// cuDNN attention (src/attention_cudnn.h) also rounds P, dP and dS to bf16 as tensor-core
// operands: one more rounding, NMSE <= u^2 more than the native kernels' u^2 plus approximate
// math (2e-5): 2e-5 + 1.5e-5 -> 3.5e-5; ATTN_CUDNN_CHECK_NMSE (1e-4) keeps a factor of about 3
#define THR_CUDNN ATTN_CUDNN_CHECK_NMSE
static double thr_bf16 = THR_BF16;   // THR_CUDNN while the attention cases run on cuDNN
// attention on tensor cores (D % 16 == 0): P (and in the backward dS) rounded to bf16 as a
// product operand, an extra NMSE of at most u^2 on top of the output rounding; derivation in
// tests/cuda_emu/test_kernels.cpp (THR_ATT_TC)
#define THR_ATT_TC 4e-5

static const backend *CPU, *GPU;
static uint64_t rng = 0x2545f4914f6cdd1dull;
static float frand(void) { return test_rand_pm1(&rng); }

// ----------------------------------------------------------------------------
// tensors on both backends

typedef struct { float *host; void *cpu, *gpu; size_t n; int f32; } pair;

// copy p->host (bf16-representable values) to both backends
static void pair_upload(pair *p) {
    CPU->copy_h2d(p->cpu, p->host, p->n * sizeof(float));
    if (p->f32) {
        GPU->copy_h2d(p->gpu, p->host, p->n * sizeof(float));
        return;
    }
    uint16_t *b = malloc(p->n * 2);
    for (size_t i = 0; i < p->n; i++) b[i] = ft_f32_to_bf16(p->host[i]);
    GPU->copy_h2d(p->gpu, b, p->n * 2);
    free(b);
}

// random (or zero) bf16-representable values, uploaded to both backends; f32 = the op takes
// a `float *` (fp32 on both backends) rather than a storage-dtype tensor
static pair pair_new(size_t n, int f32, float scale, int zero) {
    pair p = {calloc(n, sizeof(float)), NULL, NULL, n, f32};
    for (size_t i = 0; i < n; i++) p.host[i] = zero ? 0.0f : ft_bf16_to_f32(ft_f32_to_bf16(scale * frand()));
    p.cpu = CPU->alloc(n * sizeof(float));
    p.gpu = GPU->alloc(n * (f32 ? sizeof(float) : 2));
    pair_upload(&p);
    return p;
}

// set every element of both copies to `v`
static void pair_fill(pair *p, float v) {
    for (size_t i = 0; i < p->n; i++) p->host[i] = v;
    pair_upload(p);
}

static void pair_free(pair *p) {
    CPU->free(p->cpu);
    GPU->free(p->gpu);
    free(p->host);
}

// NMSE of the GPU result against the CPU result
static double pair_nmse(const pair *p) {
    float *c = malloc(p->n * sizeof(float)), *g = malloc(p->n * sizeof(float));
    CPU->copy_d2h(c, p->cpu, p->n * sizeof(float));
    if (p->f32) GPU->copy_d2h(g, p->gpu, p->n * sizeof(float));
    else {
        uint16_t *b = malloc(p->n * 2);
        GPU->copy_d2h(b, p->gpu, p->n * 2);
        for (size_t i = 0; i < p->n; i++) g[i] = ft_bf16_to_f32(b[i]);
        free(b);
    }
    double e = test_nmse(g, c, p->n);
    free(c);
    free(g);
    return e;
}

static void report_thr(const char *op, const char *shape, const char *out, const pair *p, double thr) {
    double e = pair_nmse(p);
    printf("%-14s %-28s %-9s %10.3e %8.1e  %s\n", op, shape, out, e, thr, e <= thr ? "pass" : "FAIL");
    EXPECT(e <= thr, "%s %s %s: NMSE %.3e > %.1e", op, shape, out, e, thr);
}
static void report(const char *op, const char *shape, const char *out, const pair *p) {
    report_thr(op, shape, out, p, p->f32 ? THR_F32 : thr_bf16);
}

#define BOTH(call_cpu, call_gpu) do { \
    EXPECT((call_cpu) == 0, "cpu op failed: %s", ft_error_message()); \
    EXPECT((call_gpu) == 0, "cuda op failed: %s", ft_error_message()); } while (0)

// ----------------------------------------------------------------------------
// cases

// off: every operand starts `off` elements into its buffer (weights inside a flat unit
// buffer, row chunks of activations are not 256-byte aligned; cuBLASLt must be told)
static void case_matmul(int N, int IC, int OC, int off) {
    char s[64];
    snprintf(s, sizeof s, "N=%d IC=%d OC=%d%s", N, IC, OC, off ? " offset 1" : "");
    const size_t o = (size_t)off;
    pair x = pair_new((size_t)N * IC + o, 0, 1, 0), w = pair_new((size_t)OC * IC + o, 0, 0.1f, 0);
    pair y = pair_new((size_t)N * OC + o, 0, 1, 1), dy = pair_new((size_t)N * OC + o, 0, 1, 0);
    pair dx = pair_new((size_t)N * IC + o, 0, 1, 1), dw = pair_new((size_t)OC * IC + o, 0, 1, 1);
#define C_(p) ((float *)(p).cpu + o)
#define G_(p) ((char *)(p).gpu + o * 2)
    BOTH(CPU->matmul_fwd(C_(y), C_(x), C_(w), NULL, N, IC, OC), GPU->matmul_fwd(G_(y), G_(x), G_(w), NULL, N, IC, OC));
    report("matmul_fwd", s, "out", &y);
    // the residual epilogue: y2 = x W^T + r (r, a separate buffer) and y += x W^T (in place)
    pair r = pair_new((size_t)N * OC + o, 0, 1, 0), y2 = pair_new((size_t)N * OC + o, 0, 1, 1);
    BOTH(CPU->matmul_fwd(C_(y2), C_(x), C_(w), C_(r), N, IC, OC), GPU->matmul_fwd(G_(y2), G_(x), G_(w), G_(r), N, IC, OC));
    report("matmul_fwd", s, "out+res", &y2);
    BOTH(CPU->matmul_fwd(C_(r), C_(x), C_(w), C_(r), N, IC, OC), GPU->matmul_fwd(G_(r), G_(x), G_(w), G_(r), N, IC, OC));
    report("matmul_fwd", s, "out+=", &r);
    pair_free(&r); pair_free(&y2);
    BOTH(CPU->matmul_bwd(C_(dx), C_(dw), ST_F32, C_(dy), C_(x), C_(w), N, IC, OC, 0, 1),
         GPU->matmul_bwd(G_(dx), G_(dw), ST_BF16, G_(dy), G_(x), G_(w), N, IC, OC, 0, 1));
    report("matmul_bwd", s, "dinp", &dx);
    report("matmul_bwd", s, "dweight", &dw);
    // the "+=" contracts: dinp accumulates when asked, dweight always
    BOTH(CPU->matmul_bwd(C_(dx), C_(dw), ST_F32, C_(dy), C_(x), C_(w), N, IC, OC, 1, 1),
         GPU->matmul_bwd(G_(dx), G_(dw), ST_BF16, G_(dy), G_(x), G_(w), N, IC, OC, 1, 1));
    report("matmul_bwd", s, "dinp+=", &dx);
    report("matmul_bwd", s, "dweight+=", &dw);
    // accumulate_dw 0 (a fresh gradient unit, FSDP): dweight overwritten (beta 0), NaN before
    // (the `off` elements in front of it, which nothing writes, zero)
    for (size_t i = 0; i < dw.n; i++) dw.host[i] = i < o ? 0.0f : NAN;
    pair_upload(&dw);
    BOTH(CPU->matmul_bwd(NULL, C_(dw), ST_F32, C_(dy), C_(x), C_(w), N, IC, OC, 0, 0),
         GPU->matmul_bwd(NULL, G_(dw), ST_BF16, G_(dy), G_(x), G_(w), N, IC, OC, 0, 0));
    report("matmul_bwd", s, "dweight=", &dw);
    // an fp32 dweight (one shard: the step's gradient itself), random before: "+=" in fp32,
    // only the summation order differs from the CPU (THR_F32)
    pair dwf = pair_new((size_t)OC * IC + o, 1, 1, 0);
    BOTH(CPU->matmul_bwd(NULL, (float *)dwf.cpu + o, ST_F32, C_(dy), C_(x), C_(w), N, IC, OC, 0, 1),
         GPU->matmul_bwd(NULL, (float *)dwf.gpu + o, ST_F32, G_(dy), G_(x), G_(w), N, IC, OC, 0, 1));
#undef C_
#undef G_
    report("matmul_bwd", s, "dW f32+=", &dwf);
    pair_free(&dwf);
    pair_free(&x); pair_free(&w); pair_free(&y); pair_free(&dy); pair_free(&dx); pair_free(&dw);
}

// More distinct GEMM shapes than the plan cache holds (N = 1 .. PLANS + 44 rows), each
// compared with the CPU; a hot shape (N = 7) used between them must stay cached (LRU), and
// an evicted one (N = 2) must run correctly again on a rebuilt plan.
static void case_gemm_cache(void) {
    const int IC = 8, OC = 8, shapes = BACKEND_CUDA_GEMM_PLANS + 44;
    pair x = pair_new((size_t)shapes * IC, 0, 1, 0), w = pair_new((size_t)OC * IC, 0, 0.1f, 0);
    pair y = pair_new((size_t)shapes * OC, 0, 1, 1);
    const size_t ybytes = (size_t)shapes * OC;
    double worst = 0;
    // run N rows on both backends from zeroed outputs; NMSE of the whole output buffer
    #define GEMM_ROWS(N) do { \
        BOTH(CPU->zero(y.cpu, ybytes * 4), GPU->zero(y.gpu, ybytes * 2)); \
        BOTH(CPU->matmul_fwd(y.cpu, x.cpu, w.cpu, NULL, N, IC, OC), GPU->matmul_fwd(y.gpu, x.gpu, w.gpu, NULL, N, IC, OC)); \
        double e_ = pair_nmse(&y); worst = e_ > worst ? e_ : worst; } while (0)
    for (int n = 1; n <= shapes; n++) {
        GEMM_ROWS(n);
        GEMM_ROWS(7);   // the hot shape
    }
    int cached;
    long ev0, ev1, ev2;
    backend_cuda_gemm_stats(&cached, &ev0);
    EXPECT(cached == BACKEND_CUDA_GEMM_PLANS && ev0 > 0, "gemm cache: %d plans cached, %ld evictions", cached, ev0);
    GEMM_ROWS(7);
    backend_cuda_gemm_stats(&cached, &ev1);
    EXPECT(ev1 == ev0, "gemm cache: the recently used shape N=7 was evicted (%ld -> %ld evictions)", ev0, ev1);
    GEMM_ROWS(2);   // evicted long ago: rebuilt, evicting another
    backend_cuda_gemm_stats(&cached, &ev2);
    EXPECT(ev2 == ev1 + 1, "gemm cache: N=2 should have been evicted and rebuilt (%ld -> %ld evictions)", ev1, ev2);
    GEMM_ROWS(2);   // and now a hit
    #undef GEMM_ROWS
    char s[64];
    snprintf(s, sizeof s, "N=1..%d IC=%d OC=%d", shapes, IC, OC);
    printf("%-14s %-28s %-9s %10.3e %8.1e  %s (%d plans kept, %ld evictions)\n", "gemm cache", s, "out", worst,
           THR_BF16, worst <= THR_BF16 ? "pass" : "FAIL", cached, ev2);
    EXPECT(worst <= THR_BF16, "gemm cache: worst NMSE %.3e over %d shapes", worst, shapes);
    pair_free(&x); pair_free(&w); pair_free(&y);
}

// Segment starts of `games` (test_games_tokens; --pack_attention per_game) in both backends'
// memory, or NULL twice for NULL; seg_free releases them.
static void seg_new(const char *games, int B, int T, int32_t **cpu, int32_t **gpu) {
    *cpu = *gpu = NULL;
    if (!games) return;
    const size_t bytes = (size_t)B * T * sizeof(int32_t);
    int32_t *tok = malloc(bytes), *seg = malloc(bytes);
    test_games_tokens(games, B, T, tok);
    model_segment_starts(tok, B, T, 1, seg);
    *cpu = CPU->alloc(bytes);
    *gpu = GPU->alloc(bytes);
    CPU->copy_h2d(*cpu, seg, bytes);
    GPU->copy_h2d(*gpu, seg, bytes);
    free(tok);
    free(seg);
}
static void seg_free(int32_t *cpu, int32_t *gpu) {
    if (cpu) CPU->free(cpu);
    if (gpu) GPU->free(gpu);
}

// games: segment starts (NULL = none); with them attention takes the native kernels also
// when the backend is on cuDNN (backend_cuda.c)
static void case_attention(int B, int T, int H, int KVH, int D, const char *games) {
    char s[96];
    snprintf(s, sizeof s, "%s B=%d T=%d H=%d KVH=%d D=%d%s%s", games ? "native" : backend_cuda_attention(), B, T, H,
             KVH, D, games ? " games=" : "", games ? games : "");
    int32_t *sc, *sg;
    seg_new(games, B, T, &sc, &sg);
    size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * KVH * D;
    pair q = pair_new(nq, 0, 1, 0), k = pair_new(nk, 0, 1, 0), v = pair_new(nk, 0, 1, 0);
    pair o = pair_new(nq, 0, 1, 1), lse = pair_new((size_t)B * H * T, 1, 1, 1), dout = pair_new(nq, 0, 1, 0);
    pair dq = pair_new(nq, 0, 1, 1), dk = pair_new(nk, 0, 1, 1), dv = pair_new(nk, 0, 1, 1);
    BOTH(CPU->attention_fwd(o.cpu, lse.cpu, q.cpu, k.cpu, v.cpu, B, T, H, KVH, D, sc),
         GPU->attention_fwd(o.gpu, lse.gpu, q.gpu, k.gpu, v.gpu, B, T, H, KVH, D, sg));
    // native on tensor cores when D % 16 == 0; on cuDNN thr_bf16 is THR_CUDNN, the larger
    const double thr = fmax(thr_bf16, D % 16 == 0 ? THR_ATT_TC : THR_BF16);
    report_thr("attention_fwd", s, "out", &o, thr);
    report("attention_fwd", s, "lse", &lse);
    // backward from the GPU's own forward output on both sides (bf16 `out` is an input): the
    // default path (tensor cores when D % 16 == 0), then for D % 16 == 0 the SIMT kernels
    // (ftk_attention_set_tensor_cores(0)) and the tensor-core path with its dS workspace
    // capped to one kv head of one sequence per launch (ftk_attention_set_ds_cap(1))
    static const char *names[3] = {"attention_bwd", "attention_bwd_simt", "attention_bwd_cap1"};
    for (int run = 0; run < (D % 16 == 0 ? 3 : 1); run++) {
        ftk_attention_set_tensor_cores(run != 1);
        ftk_attention_set_ds_cap(run == 2 ? 1 : 0);
        BOTH(CPU->attention_bwd(dq.cpu, dk.cpu, dv.cpu, dout.cpu, o.cpu, lse.cpu, q.cpu, k.cpu, v.cpu, B, T, H, KVH, D, sc),
             GPU->attention_bwd(dq.gpu, dk.gpu, dv.gpu, dout.gpu, o.gpu, lse.gpu, q.gpu, k.gpu, v.gpu, B, T, H, KVH, D, sg));
        const double t = run == 1 ? thr_bf16 : thr;
        report_thr(names[run], s, "dq", &dq, t);
        report_thr(names[run], s, "dk", &dk, t);
        report_thr(names[run], s, "dv", &dv, t);
    }
    ftk_attention_set_tensor_cores(1);
    ftk_attention_set_ds_cap(0);
    pair *all[] = {&q, &k, &v, &o, &lse, &dout, &dq, &dk, &dv};
    for (int i = 0; i < 9; i++) pair_free(all[i]);
    seg_free(sc, sg);
}

// Attention on both implementations, cuDNN (--attention cudnn, the default: it must have passed
// the startup check, or the cases fail naming why) then native, against the CPU. Seq 512: one
// full row of the bundled job's sequence length, two query-block and many key tiles; T = 257
// (one past a power of two); odd T and GQA throughout. The backend is left on cuDNN.
static void cases_attention(void) {
    const int at[][5] = {{1, 1, 1, 1, 16}, {1, 13, 4, 4, 16}, {2, 64, 8, 2, 64}, {1, 100, 8, 1, 128},
                         {2, 257, 16, 2, 128}, {1, 512, 2, 1, 64}};
    for (int cudnn = 1; cudnn >= 0; cudnn--) {
        const int rc = backend_cuda_attention_use(cudnn);
        EXPECT(rc == 0, "attention %s: %s", cudnn ? "cudnn" : "native", ft_error_message());
        if (rc != 0) { ft_error_clear(); continue; }
        thr_bf16 = cudnn ? THR_CUDNN : THR_BF16;
        for (int i = 0; i < 6; i++) case_attention(at[i][0], at[i][1], at[i][2], at[i][3], at[i][4], NULL);
    }
    thr_bf16 = THR_BF16;
    (void)backend_cuda_attention_use(1);
}

// Segment starts (--pack_attention per_game: attention on the native kernels, also with the
// backend on cuDNN as here): starts mid-tile, at a 16-key block's last key, on tile
// boundaries, a row starting mid-game, a game at the last row; the SIMT path at D 24; RoPE.
static void case_rope(int B, int T, int NH, int D, const char *games);
static void cases_segments(void) {
    (void)backend_cuda_attention_use(1);
    case_attention(2, 130, 4, 2, 64, "0,5,31,64,100|37,129");
    case_attention(1, 77, 2, 1, 16, "9,31,47");
    case_attention(2, 33, 4, 1, 24, "3,16|0,1");
    case_rope(2, 40, 4, 64, "0,17|5");
}

// More distinct attention shapes than the cuDNN plan cache holds, its limit lowered to 32
// plans (attn_cudnn_set_plan_limit; T = 1 .. 20, a forward and a backward plan each): every
// output correct against the CPU, evictions counted.
#define CACHE_TEST_PLANS 32
static void case_attention_cache(void) {
    if (backend_cuda_attention_use(1) != 0) { ft_error_clear(); return; }   // cases_attention reported it
    // past the limit by 4 shapes (8 plans): every plan of a runtime-compiled cuDNN engine costs
    // an NVRTC compile (~0.3 s each on a 2-core host, measured device-less), so no more
    const int shapes = CACHE_TEST_PLANS / 2 + 4, B = 1, H = 2, KVH = 1, D = 16;
    attn_cudnn_set_plan_limit(CACHE_TEST_PLANS);
    double worst = 0;
    struct timespec t0, t1;   // the first GPU run's figure for NVRTC per plan (docs/results/2026-11-26-h100.md)
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int T = 1; T <= shapes; T++) {
        const size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * KVH * D;
        pair q = pair_new(nq, 0, 1, 0), k = pair_new(nk, 0, 1, 0), v = pair_new(nk, 0, 1, 0);
        pair o = pair_new(nq, 0, 1, 1), lse = pair_new((size_t)B * H * T, 1, 1, 1), dout = pair_new(nq, 0, 1, 0);
        pair dq = pair_new(nq, 0, 1, 1), dk = pair_new(nk, 0, 1, 1), dv = pair_new(nk, 0, 1, 1);
        BOTH(CPU->attention_fwd(o.cpu, lse.cpu, q.cpu, k.cpu, v.cpu, B, T, H, KVH, D, NULL),
             GPU->attention_fwd(o.gpu, lse.gpu, q.gpu, k.gpu, v.gpu, B, T, H, KVH, D, NULL));
        BOTH(CPU->attention_bwd(dq.cpu, dk.cpu, dv.cpu, dout.cpu, o.cpu, lse.cpu, q.cpu, k.cpu, v.cpu, B, T, H, KVH, D, NULL),
             GPU->attention_bwd(dq.gpu, dk.gpu, dv.gpu, dout.gpu, o.gpu, lse.gpu, q.gpu, k.gpu, v.gpu, B, T, H, KVH, D, NULL));
        pair *all[] = {&q, &k, &v, &o, &lse, &dout, &dq, &dk, &dv};
        for (int i = 3; i < 9; i++) {
            const double e = pair_nmse(all[i]);
            if (i != 5 && e > worst) worst = e;   // (dout is an input)
        }
        for (int i = 0; i < 9; i++) pair_free(all[i]);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    int cached = 0;
    long evictions = 0;
    attn_cudnn_stats(&cached, &evictions);
    char s[64];
    snprintf(s, sizeof s, "T=1..%d H=%d KVH=%d D=%d", shapes, H, KVH, D);
    printf("%-14s %-28s %-9s %10.3e %8.1e  %s (%d plans kept, %ld evictions; %.2f s per plan built, NVRTC "
           "included)\n", "cudnn cache", s, "all", worst, THR_CUDNN, worst <= THR_CUDNN && evictions > 0 ? "pass" : "FAIL",
           cached, evictions, secs / (2.0 * shapes));
    EXPECT(worst <= THR_CUDNN, "cudnn attention cache: worst NMSE %.3e over %d shapes", worst, shapes);
    // building ahead the plans of every length (attn_cudnn_prepare, before a job's step 1) grows
    // the full cache to hold them with those cached: the plans evicted above come back (T 1..4
    // when the earlier cases left fewer than the limit), nothing is evicted; a second time
    // builds nothing
    int lens[CACHE_TEST_PLANS / 2 + 4], built = 0, grown = 0, built2 = -1, grown2 = -1;
    long b0 = 0, e0 = 0, b1 = 0, e1 = 0;
    for (int T = 1; T <= shapes; T++) lens[T - 1] = T;
    attn_cudnn_counts(&b0, &e0);
    int prc = attn_cudnn_prepare(B, lens, shapes, H, KVH, D, &built, &grown);
    if (prc == 0) prc = attn_cudnn_prepare(B, lens, shapes, H, KVH, D, &built2, &grown2);
    attn_cudnn_counts(&b1, &e1);
    const int want = cached == CACHE_TEST_PLANS ? 8 : built;
    const int good = prc == 0 && built == want && b1 - b0 == built && (built == 0 || grown == cached + built) &&
                     built2 == 0 && grown2 == 0 && e1 == e0;
    printf("%-14s %-28s %-9s %s (%d plans built, the cache grown to %d, %ld evicted; again: %d built)\n",
           "cudnn prepare", s, "all", good ? "pass" : "FAIL", built, grown, e1 - e0, built2);
    EXPECT(good, "cudnn attention prepare: rc %d, %d built (want %d), grown to %d, %ld evicted; again %d built, "
           "grown %d", prc, built, want, grown, e1 - e0, built2, grown2);
    attn_cudnn_set_plan_limit(ATTN_CUDNN_PLANS);
    // (the earlier cases' plans, if they were more than the limit, go one per new plan)
    EXPECT(cached >= CACHE_TEST_PLANS && cached <= ATTN_CUDNN_PLANS && evictions > 0,
           "cudnn attention cache: %d plans kept, %ld evictions", cached, evictions);
}

static void case_norm_swiglu(int N, int C) {
    char s[64];
    snprintf(s, sizeof s, "N=%d C=%d", N, C);
    size_t n = (size_t)N * C;
    pair x = pair_new(n, 0, 1, 0), w = pair_new((size_t)C, 0, 1, 0), y = pair_new(n, 0, 1, 1);
    pair rstd = pair_new((size_t)N, 1, 1, 1), dy = pair_new(n, 0, 1, 0), dx = pair_new(n, 0, 1, 1),
         dw = pair_new((size_t)C, 0, 1, 1);
    BOTH(CPU->rmsnorm_fwd(y.cpu, rstd.cpu, NULL, x.cpu, w.cpu, N, C, 1e-5f),
         GPU->rmsnorm_fwd(y.gpu, rstd.gpu, NULL, x.gpu, w.gpu, N, C, 1e-5f));
    report("rmsnorm_fwd", s, "out", &y);
    report("rmsnorm_fwd", s, "rstd", &rstd);
    BOTH(CPU->rmsnorm_bwd(dx.cpu, dw.cpu, ST_F32, dy.cpu, x.cpu, w.cpu, rstd.cpu, N, C),
         GPU->rmsnorm_bwd(dx.gpu, dw.gpu, ST_BF16, dy.gpu, x.gpu, w.gpu, rstd.gpu, N, C));
    report("rmsnorm_bwd", s, "dinp", &dx);
    report("rmsnorm_bwd", s, "dweight", &dw);
    pair dwf = pair_new((size_t)C, 1, 1, 0);   // fp32 dweight, random before (+=)
    BOTH(CPU->rmsnorm_bwd(dx.cpu, dwf.cpu, ST_F32, dy.cpu, x.cpu, w.cpu, rstd.cpu, N, C),
         GPU->rmsnorm_bwd(dx.gpu, dwf.gpu, ST_F32, dy.gpu, x.gpu, w.gpu, rstd.gpu, N, C));
    report("rmsnorm_bwd", s, "dw f32+=", &dwf);
    pair_free(&dwf);
    // swiglu and add on the same sizes: gate = x, up = dy
    pair g = pair_new(n, 0, 1, 1), u = pair_new(n, 0, 1, 1);
    BOTH(CPU->swiglu_fwd(y.cpu, NULL, x.cpu, dy.cpu, N, C, C), GPU->swiglu_fwd(y.gpu, NULL, x.gpu, dy.gpu, N, C, C));
    report("swiglu_fwd", s, "out", &y);
    BOTH(CPU->swiglu_bwd(g.cpu, u.cpu, dx.cpu, x.cpu, dy.cpu, N, C, C),
         GPU->swiglu_bwd(g.gpu, u.gpu, dx.gpu, x.gpu, dy.gpu, N, C, C));
    report("swiglu_bwd", s, "dgate", &g);
    report("swiglu_bwd", s, "dup", &u);
    pair *all[] = {&x, &w, &y, &rstd, &dy, &dx, &dw, &g, &u};
    for (int i = 0; i < 9; i++) pair_free(all[i]);
}

static void case_rope(int B, int T, int NH, int D, const char *games) {
    char s[64];
    snprintf(s, sizeof s, "B=%d T=%d NH=%d D=%d%s%s", B, T, NH, D, games ? " games=" : "", games ? games : "");
    int32_t *sc, *sg;
    seg_new(games, B, T, &sc, &sg);
    llama_config cfg = {0};
    cfg.rope_theta = 10000.0f;
    cfg.head_dim = D;
    cfg.rope_scaling = ROPE_SCALING_LLAMA3;   // the tables come from the host either way
    cfg.rope_factor = 8.0;
    cfg.rope_low_freq_factor = 1.0;
    cfg.rope_high_freq_factor = 4.0;
    cfg.rope_original_max_position_embeddings = 16;
    size_t n = (size_t)B * T * NH * D, half = (size_t)T * D / 2;
    pair cs = pair_new(half, 1, 1, 1), sn = pair_new(half, 1, 1, 1);
    rope_tables_compute(&cfg, T, cs.host, sn.host);
    CPU->copy_h2d(cs.cpu, cs.host, half * 4); GPU->copy_h2d(cs.gpu, cs.host, half * 4);
    CPU->copy_h2d(sn.cpu, sn.host, half * 4); GPU->copy_h2d(sn.gpu, sn.host, half * 4);
    pair x = pair_new(n, 0, 1, 0), y = pair_new(n, 0, 1, 1), dx = pair_new(n, 0, 1, 1);
    BOTH(CPU->rope_fwd(y.cpu, x.cpu, cs.cpu, sn.cpu, B, T, NH, D, sc), GPU->rope_fwd(y.gpu, x.gpu, cs.gpu, sn.gpu, B, T, NH, D, sg));
    report("rope_fwd", s, "out", &y);
    BOTH(CPU->rope_bwd(dx.cpu, x.cpu, cs.cpu, sn.cpu, B, T, NH, D, sc), GPU->rope_bwd(dx.gpu, x.gpu, cs.gpu, sn.gpu, B, T, NH, D, sg));
    report("rope_bwd", s, "dinp", &dx);
    pair *all[] = {&cs, &sn, &x, &y, &dx};
    for (int i = 0; i < 5; i++) pair_free(all[i]);
    seg_free(sc, sg);
}

// chunk: lm_head rows per chunk (0: the memory plan's, model_lmhead_chunk_rows)
// loss_accumulate over the GPU's losses (device) and targets (device `tg`, host `tgt`, some
// -100) into an accumulator holding {1.5, 3}, against the CPU op over the same fp32 values:
// the same double bits and count (both add in row order from 0.0)
static void case_loss_accumulate(const float *losses, const int32_t *tg, const int32_t *tgt, int N, const char *s) {
    float *lh = malloc((size_t)N * 4);
    double want[2] = {1.5, 3.0}, got[2] = {1.5, 3.0};
    double *acc = GPU->alloc(sizeof got);
    EXPECT(lh && acc && GPU->copy_d2h(lh, losses, (size_t)N * 4) == 0 && GPU->copy_h2d(acc, got, sizeof got) == 0,
           "loss_accumulate setup: %s", ft_error_message());
    BOTH(CPU->loss_accumulate(want, lh, tgt, N), GPU->loss_accumulate(acc, losses, tg, N));
    EXPECT(GPU->copy_d2h(got, acc, sizeof got) == 0, "loss_accumulate read: %s", ft_error_message());
    const int same = memcmp(want, got, sizeof got) == 0;
    printf("%-14s %-28s %-8s %10s %8s  %s\n", "loss_accumulate", s, "sum,n", same ? "bitwise" : "differ", "0",
           same ? "pass" : "FAIL");
    EXPECT(same, "loss_accumulate %s: %.17g, %.0f vs the CPU's %.17g, %.0f", s, got[0], got[1], want[0], want[1]);
    GPU->free(acc);
    free(lh);
}

static void case_embedding_lmhead(int N, int C, int V, int chunk) {
    char s[64];
    if (chunk == 0) chunk = model_lmhead_chunk_rows(N, V);
    snprintf(s, sizeof s, "N=%d C=%d V=%d chunk %d", N, C, V, chunk);
    int32_t *tok = malloc((size_t)N * 4), *tgt = malloc((size_t)N * 4);
    for (int i = 0; i < N; i++) {
        tok[i] = (int32_t)((frand() * 0.5f + 0.5f) * (V - 1));
        tgt[i] = i % 5 == 3 ? -100 : (int32_t)((frand() * 0.5f + 0.5f) * (V - 1));
    }
    int32_t *tc = CPU->alloc((size_t)N * 4), *tg = GPU->alloc((size_t)N * 4);
    int32_t *gc = CPU->alloc((size_t)N * 4), *gg = GPU->alloc((size_t)N * 4);
    CPU->copy_h2d(tc, tok, (size_t)N * 4); GPU->copy_h2d(tg, tok, (size_t)N * 4);
    CPU->copy_h2d(gc, tgt, (size_t)N * 4); GPU->copy_h2d(gg, tgt, (size_t)N * 4);
    pair wte = pair_new((size_t)V * C, 0, 1, 0), x = pair_new((size_t)N * C, 0, 1, 1), dwte = pair_new((size_t)V * C, 0, 1, 1);
    BOTH(CPU->embedding_fwd(x.cpu, tc, wte.cpu, N, C, V), GPU->embedding_fwd(x.gpu, tg, wte.gpu, N, C, V));
    report("embedding_fwd", s, "out", &x);
    BOTH(CPU->embedding_bwd(dwte.cpu, ST_F32, x.cpu, tc, N, C, V), GPU->embedding_bwd(dwte.gpu, ST_BF16, x.gpu, tg, N, C, V));
    report("embedding_bwd", s, "dwte", &dwte);
    pair dwtef = pair_new((size_t)V * C, 1, 1, 0);   // fp32 dwte, random before (+=)
    BOTH(CPU->embedding_bwd(dwtef.cpu, ST_F32, x.cpu, tc, N, C, V), GPU->embedding_bwd(dwtef.gpu, ST_F32, x.gpu, tg, N, C, V));
    report("embedding_bwd", s, "dwte f32+=", &dwtef);
    pair loss = pair_new((size_t)N, 1, 1, 1), dx = pair_new((size_t)N * C, 0, 1, 1), dw = pair_new((size_t)V * C, 0, 1, 1);
    pair ws = pair_new((size_t)chunk * V, 1, 1, 1), acc = pair_new(N > chunk ? (size_t)V * C : 1, 1, 1, 1);
    float *gacc = N > chunk ? acc.gpu : NULL;
    BOTH(CPU->lmhead_xent(loss.cpu, dx.cpu, dw.cpu, ST_F32, x.cpu, wte.cpu, gc, N, C, V, 1.0f / N, chunk, ws.cpu, NULL),
         GPU->lmhead_xent(loss.gpu, dx.gpu, dw.gpu, ST_BF16, x.gpu, wte.gpu, gg, N, C, V, 1.0f / N, chunk, ws.gpu, gacc));
    report("lmhead_xent", s, "losses", &loss);
    report("lmhead_xent", s, "dx", &dx);
    report("lmhead_xent", s, "dweight", &dw);
    case_loss_accumulate(loss.gpu, gg, tgt, N, s);
    // into an fp32 dweight with no dw_acc even over several chunks (from zero: the NMSE is
    // relative to dW itself; "+=" is the GEMM's beta 1, checked in case_matmul); the GPU's
    // dlogits are bf16 GEMM operands, so the sum keeps one bf16 rounding (THR_BF16)
    pair dwf = pair_new((size_t)V * C, 1, 1, 1);
    BOTH(CPU->lmhead_xent(loss.cpu, dx.cpu, dwf.cpu, ST_F32, x.cpu, wte.cpu, gc, N, C, V, 1.0f / N, chunk, ws.cpu, NULL),
         GPU->lmhead_xent(loss.gpu, dx.gpu, dwf.gpu, ST_F32, x.gpu, wte.gpu, gg, N, C, V, 1.0f / N, chunk, ws.gpu, NULL));
    report_thr("lmhead_xent", s, "dw f32", &dwf, THR_BF16);
    pair_free(&dwtef);
    pair_free(&dwf);
    // the "+=" contract of dweight (into dwte's values), and evaluation: losses only (not
    // for the large vocab: the emulated GEMMs are slow, and it adds no path)
    if (V <= 4096) {
        BOTH(CPU->lmhead_xent(loss.cpu, dx.cpu, dwte.cpu, ST_F32, x.cpu, wte.cpu, gc, N, C, V, 0.5f, chunk, ws.cpu, NULL),
             GPU->lmhead_xent(loss.gpu, dx.gpu, dwte.gpu, ST_BF16, x.gpu, wte.gpu, gg, N, C, V, 0.5f, chunk, ws.gpu, gacc));
        report("lmhead_xent", s, "dweight+=", &dwte);
        pair_fill(&loss, 0.0f);
        BOTH(CPU->lmhead_xent(loss.cpu, NULL, NULL, ST_F32, x.cpu, wte.cpu, gc, N, C, V, 1.0f, chunk, ws.cpu, NULL),
             GPU->lmhead_xent(loss.gpu, NULL, NULL, ST_BF16, x.gpu, wte.gpu, gg, N, C, V, 1.0f, chunk, ws.gpu, NULL));
        report("lmhead_xent", s, "eval loss", &loss);
    }
    pair *all[] = {&wte, &x, &dwte, &loss, &dx, &dw, &ws, &acc};
    for (int i = 0; i < 8; i++) pair_free(all[i]);
    CPU->free(tc); GPU->free(tg); CPU->free(gc); GPU->free(gg);
    free(tok); free(tgt);
}

// lm_head's dW over many chunks whose contributions are small next to the running sum: the
// first chunk's 8 rows of x are random, the 63 chunks after it repeat them scaled by 2^-10
// (same targets), so each later chunk adds about 2^-10 of the first one's dW, the same each
// time. Summed in fp32 and rounded once, dW is within one bf16 rounding of the CPU's (NMSE
// <= u^2, THR_BF16). Rounded to bf16 after every chunk, each of those adds is below half a
// bf16 ulp of the running sum and is lost: about 63/1024 = 6% of dW goes missing, NMSE
// ~4e-3.
static void case_lmhead_many_chunks(void) {
    const int chunk = 8, nchunks = 64, N = chunk * nchunks, C = 16, V = 24;
    const char *s = "N=512 C=16 V=24 64 chunks";
    int32_t *tgt = malloc((size_t)N * 4);
    pair x = pair_new((size_t)N * C, 0, 1, 0), w = pair_new((size_t)V * C, 0, 1, 0);
    for (int i = 0; i < N; i++) tgt[i] = i % chunk == 5 ? -100 : (i % chunk * 7 + 3) % V;
    for (int i = chunk; i < N; i++)
        for (int c = 0; c < C; c++) x.host[(size_t)i * C + c] = x.host[(size_t)(i % chunk) * C + c] / 1024.0f;
    pair_upload(&x);
    int32_t *gc = CPU->alloc((size_t)N * 4), *gg = GPU->alloc((size_t)N * 4);
    CPU->copy_h2d(gc, tgt, (size_t)N * 4); GPU->copy_h2d(gg, tgt, (size_t)N * 4);
    pair loss = pair_new((size_t)N, 1, 1, 1), dx = pair_new((size_t)N * C, 0, 1, 1), dw = pair_new((size_t)V * C, 0, 1, 1);
    pair ws = pair_new((size_t)chunk * V, 1, 1, 1), acc = pair_new((size_t)V * C, 1, 1, 1);
    BOTH(CPU->lmhead_xent(loss.cpu, dx.cpu, dw.cpu, ST_F32, x.cpu, w.cpu, gc, N, C, V, 1.0f, chunk, ws.cpu, NULL),
         GPU->lmhead_xent(loss.gpu, dx.gpu, dw.gpu, ST_BF16, x.gpu, w.gpu, gg, N, C, V, 1.0f, chunk, ws.gpu, acc.gpu));
    report("lmhead_xent", s, "losses", &loss);
    report("lmhead_xent", s, "dx", &dx);
    report("lmhead_xent", s, "dweight", &dw);
    // the same sum straight into an fp32 dweight (one shard), no dw_acc: nothing is lost either
    pair dwf = pair_new((size_t)V * C, 1, 1, 1);
    BOTH(CPU->lmhead_xent(loss.cpu, dx.cpu, dwf.cpu, ST_F32, x.cpu, w.cpu, gc, N, C, V, 1.0f, chunk, ws.cpu, NULL),
         GPU->lmhead_xent(loss.gpu, dx.gpu, dwf.gpu, ST_F32, x.gpu, w.gpu, gg, N, C, V, 1.0f, chunk, ws.gpu, NULL));
    report_thr("lmhead_xent", s, "dw f32", &dwf, THR_BF16);
    pair *all[] = {&x, &w, &loss, &dx, &dw, &ws, &acc, &dwf};
    for (int i = 0; i < 8; i++) pair_free(all[i]);
    CPU->free(gc); GPU->free(gg);
    free(tgt);
}

static void case_optimizer(size_t n) {
    char s[64];
    snprintf(s, sizeof s, "n=%zu", n);
    pair master = pair_new(n, 1, 1, 0), grad = pair_new(n, 1, 1, 0), m = pair_new(n, 1, 0.1f, 0);
    pair v = pair_new(n, 1, 0, 1), param = pair_new(n, 0, 1, 1), src = pair_new(n, 0, 1, 0);
    adamw_params ap = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f,
                       .bias_correction1 = 0.1f, .bias_correction2 = 0.001f, .grad_scale = 0.5f};
    BOTH(CPU->adamw(master.cpu, param.cpu, grad.cpu, m.cpu, v.cpu, ST_F32, n, &ap),
         GPU->adamw(master.gpu, param.gpu, grad.gpu, m.gpu, v.gpu, ST_F32, n, &ap));
    report("adamw", s, "master", &master);
    report("adamw", s, "m", &m);
    report("adamw", s, "v", &v);
    report("adamw", s, "param", &param);
    double sc = 0, sg = 0;
    BOTH(CPU->sum_squares(&sc, grad.cpu, n), GPU->sum_squares(&sg, grad.gpu, n));
    double rel = (sg - sc) / sc;
    printf("%-14s %-28s %-8s %10.3e %8.1e  %s\n", "sum_squares", s, "sum", rel * rel, 1e-20, rel * rel <= 1e-20 ? "pass" : "FAIL");
    EXPECT(rel * rel <= 1e-20, "sum_squares %s: relative error %.3e", s, rel);
    // the same sum added on the device into a double holding 1.5 (the per-unit gradient norm),
    // read back once: the CPU's within the same bound
    double *dacc = GPU->alloc(sizeof(double)), start = 1.5, ca = 1.5, ga = 0;
    EXPECT(dacc && GPU->copy_h2d(dacc, &start, sizeof start) == 0, "sum_squares_accumulate setup: %s", ft_error_message());
    BOTH(CPU->sum_squares_accumulate(&ca, grad.cpu, n), GPU->sum_squares_accumulate(dacc, grad.gpu, n));
    EXPECT(GPU->copy_d2h(&ga, dacc, sizeof ga) == 0, "sum_squares_accumulate read: %s", ft_error_message());
    rel = (ga - ca) / ca;
    printf("%-14s %-28s %-8s %10.3e %8.1e  %s\n", "sum_sq_acc", s, "acc", rel * rel, 1e-20, rel * rel <= 1e-20 ? "pass" : "FAIL");
    EXPECT(rel * rel <= 1e-20, "sum_squares_accumulate %s: relative error %.3e", s, rel);
    GPU->free(dacc);
    BOTH(CPU->accumulate(grad.cpu, src.cpu, ST_F32, n, 0.25f), GPU->accumulate(grad.gpu, src.gpu, ST_BF16, n, 0.25f));
    report("accumulate", s, "dst", &grad);
    // an fp32 source (--reduce_dtype fp32's reduce-scatter output): the master slice
    BOTH(CPU->accumulate(grad.cpu, master.cpu, ST_F32, n, -0.5f), GPU->accumulate(grad.gpu, master.gpu, ST_F32, n, -0.5f));
    report("accumulate", s, "dst (f32 src)", &grad);
    BOTH(CPU->cast_from_f32(param.cpu, master.cpu, n), GPU->cast_from_f32(param.gpu, master.gpu, n));
    report("cast_from_f32", s, "dst", &param);
    pair *all[] = {&master, &grad, &m, &v, &param, &src};
    for (int i = 0; i < 6; i++) pair_free(all[i]);
}

// the bundled model's shapes (C 128, F 352, 4 heads of 32, 2 kv heads, V 2048) at B = 3,
// T = 171: B*T = 513 rows, not a multiple of 64 (the GEMM and attention tiles); the lm_head
// in the plan's one chunk of 513 rows and in chunks of 200 (two and a partial one)
static void cases_default_model(void) {
    case_matmul(513, 128, 352, 0);
    case_matmul(513, 352, 128, 0);
    case_attention(3, 171, 4, 2, 32, NULL);
    case_norm_swiglu(513, 128);
    case_rope(3, 171, 4, 32, NULL);
    case_embedding_lmhead(513, 128, 2048, 0);
    case_embedding_lmhead(513, 128, 2048, 200);
}

// --large: CodeLlama-7b's shapes (C 4096, F 11008, 32 heads of 128, V 32016) at seq 512,
// B*T = 1000 rows (not a multiple of 64); minutes under the emulator, seconds on a GPU
static void cases_7b(void) {
    case_matmul(1000, 4096, 11008, 0);
    case_matmul(1000, 11008, 4096, 1);
    case_attention(2, 512, 32, 32, 128, NULL);
    case_attention(1, 500, 32, 8, 128, NULL);
    case_norm_swiglu(1000, 4096);
    case_norm_swiglu(1000, 11008);
    case_rope(2, 500, 32, 128, NULL);
    case_embedding_lmhead(1000, 4096, 32016, 0);   // the plan's one chunk of 1000 rows
    case_optimizer(150000001);   // > 65535 blocks * 256 threads * 8: the grid-stride loops turn
}

// test_backend_gpu [--large]: --large adds the 7B shapes (make test-gpu passes it)
int main(int argc, char **argv) {
    int large = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--large") == 0) large = 1;
        else { fprintf(stderr, "test_backend_gpu: unknown argument '%s' (only --large)\n", argv[i]); return 2; }
    }
    CPU = backend_cpu();
    if (backend_open("cuda", 0, (size_t)(large ? 16 : 4) << 30, &GPU) != 0) {
        printf("skip: test_backend_gpu SKIPPED: %s\n", ft_error_message());   // (first_light.sh greps SKIPPED)
        return 0;
    }
    printf("test_backend_gpu: %s%s\n", backend_describe(GPU), large ? " (with the 7B shapes)" : "");
    printf("%-14s %-28s %-8s %10s %8s  result\n", "op", "shape", "output", "nmse", "thresh");
    const int mm[][3] = {{1, 8, 8}, {7, 33, 65}, {64, 128, 256}, {100, 288, 768}, {512, 1024, 1024}};
    for (int i = 0; i < 5; i++) case_matmul(mm[i][0], mm[i][1], mm[i][2], 0);
    case_matmul(7, 48, 97, 1);
    case_matmul(64, 128, 256, 1);
    // seq 512: one full row of the bundled job's sequence length, two query-block and many
    // key tiles; T = 257 (one past a power of two)
    cases_attention();
    const int nc[][2] = {{1, 8}, {3, 33}, {17, 1000}, {64, 4096}, {5, 1030}};
    for (int i = 0; i < 5; i++) case_norm_swiglu(nc[i][0], nc[i][1]);
    const int rp[][4] = {{1, 1, 1, 2}, {1, 13, 3, 16}, {2, 64, 8, 64}, {1, 33, 2, 128}, {2, 100, 4, 32}};
    for (int i = 0; i < 5; i++) case_rope(rp[i][0], rp[i][1], rp[i][2], rp[i][3], NULL);
    // (N, C, V, chunk rows; 0 = the plan's): one chunk, a realistic vocab (CodeLlama's
    // 32016), 3 chunks with a partial last one, a last chunk of one row, 7 chunks of odd
    // size, V odd
    const int el[][4] = {{1, 8, 5, 0},       {7, 33, 97, 0},    {64, 128, 1000, 0}, {200, 256, 32016, 0},
                         {300, 48, 300, 128}, {129, 48, 300, 128}, {100, 40, 77, 15}};
    for (int i = 0; i < 7; i++) case_embedding_lmhead(el[i][0], el[i][1], el[i][2], el[i][3]);
    case_lmhead_many_chunks();
    const size_t on[] = {1, 7, 1025, 100000, 1000003};
    for (int i = 0; i < 5; i++) case_optimizer(on[i]);
    cases_default_model();
    if (large) cases_7b();
    case_gemm_cache();   // last: its random inputs do not shift the other cases'
    case_attention_cache();
    cases_segments();    // after the rest: their random inputs do not shift the other cases'
    backend_close(GPU);
    TEST_SUMMARY("test_backend_gpu");
}
