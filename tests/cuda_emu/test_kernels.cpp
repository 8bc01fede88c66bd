// test_kernels.cpp: every kernel of kernels/ run under the CPU emulator and compared with the
// CPU backend's op (backend_cpu(), fp32) on fp32 copies of the same bf16-rounded inputs.
//
// For each case (op, shape) and each thread order (forward, reverse, random):
//   - inputs are fresh copies; outputs are poisoned with 0xFF bytes (NaN) before the launch,
//     or hold known values for "+=" outputs; every buffer has 256-byte sentinel guards
//     before and after it, checked after the launch;
//   - NMSE = sum((out - ref)^2) / sum(ref^2) against the reference (NaN/inf = fail);
//   - the outputs of the three orders must be bitwise identical (determinism, no races).
// A case passes when all of that holds in all three orders. The table prints the worst
// NMSE over the orders.
//
// Two binaries run this file (kernels/kernels.mk): test_kernels, with the kernels built with
// exact host math, and test_kernels_gpumath, with the same kernel sources built with FMA
// contraction (-mfma -ffp-contract=fast, as nvcc contracts) and every approximate function
// moved by the GPU's documented worst-case error (__expf 2 ulp + .ftz, rsqrtf 2 ulp, logf
// 1 ulp; see "device functions" in cuda_emu.h). The same thresholds must hold in both: they
// are meant for a real GPU, not for the emulator's exact math.
//
// Thresholds (NMSE):
//   bf16 has 8 significant bits: unit roundoff u = 2^-8. Rounding x to bf16 (nearest even)
//   errs by at most u|x|, so for outputs computed exactly and rounded once
//   NMSE = sum e_i^2 / sum x_i^2 <= u^2 = 1.53e-5, whatever n is. On random data the error
//   is uniform in +-ulp/2, giving NMSE ~ u^2/6 = 2.5e-6 on average (u^2/3 = 5.1e-6 for values
//   at the bottom of a binade), which is what large cases show; tiny cases (n = 1..8) can
//   approach u^2. The kernels compute in fp32 from the same bf16 inputs as the reference;
//   the GPU's approximate math (ex2.approx in __expf, rsqrt.approx, FMA contraction) and other
//   summation orders move the fp32 value by <~1e-6 relative, negligible in NMSE (~1e-12), but
//   can flip a rounding (error up to 2u on that element). THR_BF16 = 2e-5 = 1.3 u^2. A wrong
//   index, a missing term or a race gives NMSE 1e-3..1, or NaN from the poisoned outputs.
//   fp32 outputs (rstd, optimizer state, fp32 accumulation): only fp32 math differences,
//   up to ~30 ulp with approximate transcendentals and a different summation order over
//   C = 4096 terms: (30 * 2^-24)^2 = 3e-12; THR_F32 = 1e-9 leaves a wide margin and still
//   catches any real error (one wrong element in 1000 gives ~1e-3).
//   Copies (embedding forward, cast bits vs the host round-to-nearest-even) must be exact:
//   threshold 0 (any NaN matches any NaN: the GPU produces the canonical 0x7fff).
//   sum_squares returns a double: relative error^2 <= 1e-20; sum_squares_accumulate too
//   (added into a double holding 2.5), and from 0.0 bit for bit ftk_sum_squares' value.
//   loss_accumulate must equal the CPU backend's op bit for bit (threshold 0): both add in
//   row order from 0.0, in double (the printed training loss depends on it).
//   Attention forward on tensor cores (THR_ATT_TC): P = exp(s - m) is rounded to bf16
//   before the P V product (as FlashAttention does) while l sums the fp32 P, so
//   out = sum_j p_j (1 + d_j) v_j / l with |d_j| <= u: the extra error e = sum_j d_j p_j v_j / l
//   has E[e^2] = E[d^2] sum_j p_j^2 v_j^2 / l^2 and, for v independent of p with mean 0,
//   E[out^2] = sum_j p_j^2 E[v^2] / l^2: NMSE u^2/3 (uniform d) up to u^2 (worst d) on top
//   of the output rounding (u^2/6 .. u^2). THR_ATT_TC = 2.6 u^2 = 4e-5. S = Q K^T is a sum
//   of exact bf16 products in fp32 (tensor cores may add in another order or truncate
//   inside the adder tree: a few fp32 ulp), so lse keeps THR_F32.
//   Attention backward on tensor cores (THR_ATT_TC as well): P and dS are computed in fp32
//   as on the SIMT path (S and dP from exact bf16 products summed in fp32) and each is
//   rounded to bf16 once, as the A operand of its product: dV = P^T dout with P (1 + d),
//   dK = dS^T Q and dQ = dS K with dS (1 + d'), |d|, |d'| <= u, independent per element.
//   Each output therefore carries exactly the forward's extra term (sum_j d_j a_j x_j with
//   a = P or dS, x = dout, Q or K, the two factors uncorrelated in sign): NMSE u^2/3 .. u^2
//   on top of the output rounding, the same bound 2.6 u^2. Measured: worst 9.6e-6 (dq at
//   T = 16, H = 4) over the table, 4x below it.
//
// Edge inputs: every op also runs in the regimes where one of its constants or bounds
// decides the result (the case tables in cases_*(); tests/mutate_kernels.sh checks that a
// one-line change to each is caught). The thresholds above hold there unchanged:
//   - all-zero references (fully masked lm_head rows: loss 0, dlogits 0; AdamW's zero
//     gradients with zero state: m = v = 0): test_nmse returns the plain sum of squared
//     errors, and the kernels produce exact zeros (0 times finite values, 0 / (0 + eps)).
//   - scores and logits ~100 (attention with q scaled by 40, lm_head logits ~ N(0, 50^2)):
//     the fp32 dot products of D (C) bf16 products err by ~sqrt(D) 2^-24 |terms| ~ 1e-5
//     absolute, i.e. 1e-5 relative in p = exp(s - m): NMSE ~1e-10 << THR_BF16; lse ~ 100
//     moves by ~1e-7 relative: NMSE ~1e-14 << THR_F32.
//   - RMSNorm rows with mean square 0, 0.1, 1 and 10 eps: rstd = rsqrt(ms + eps) is as well
//     conditioned there as elsewhere (both terms positive), out = w x rstd is O(0.3..1) and
//     rounded once as before.
//   - AdamW with sqrt(v) ~ eps (gradients ~1e-9: v ~ 1e-19, normal in fp32) or v = 0: the
//     denominator sqrt(v) / sqrt(bc2) + eps adds two positive terms, no cancellation, so the
//     fp32 evaluation order still moves the result by a few ulp.
//   - SwiGLU with |gate| > 88: exp(-gate) is 0 or inf on both sides, the sigmoid exactly 0
//     or 1; the outputs are exact zeros or gate * up rounded once.
//   - sum_squares over magnitudes 1e-25 .. 1e25: squares of fp32 values are exact in double
//     (48-bit products), the sum errs by ~n 2^-53 relative as before.
//   - attention backward at T = 1: dq = dk = 0 in exact arithmetic (one key: dP = dout.v and
//     delta = dout.out = dout.v cancel), so both sides return the fp32 noise of that
//     difference, |dP - delta| <= D 2^-24 sum|dout_d v_d| ~ 6e-4 at D = 128 (typically
//     ~1e-5), times scale |k| <~ 0.4: an absolute RMS of at most ~2e-4 in the worst case and
//     ~1e-6 typically. THR_T1_RMS = 1e-4 (absolute); a real error (a wrong delta, a missing
//     scale or mask) gives O(0.1..1).
#include "cuda_emu.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

#include "kernels.h"
extern "C" {
#include "common.h"
#include "model.h"   // rope_tables_compute: the model's own RoPE tables (llama3 scaling)
}
#include "test.h"

#define THR_BF16 2e-5
#define THR_F32 1e-9
#define THR_EXACT 0.0
#define THR_F64 1e-20
#define THR_ATT_TC 4e-5
#define THR_T1_RMS 1e-4

#include "kernel_test_harness.h"

// ----------------------------------------------------------------------------
// embedding

// token patterns: random ids; the first and last ids (0, V-1) among heavy repeats; ids unique
// except repeats of row 0's id placed at the ends of the backward's 128-row ballot tiles
// (rows 128 and 129: the last row of the first tile scanned from row 1 and the first of the
// next) and in the last row; one id in every row (one block gathers all N rows)
enum { TOK_RANDOM, TOK_EDGES, TOK_TILES, TOK_SAME };
static std::vector<int32_t> make_tokens(int N, int V, int pattern) {
    std::vector<int32_t> tok(N);
    for (int i = 0; i < N; i++) {
        int32_t r = (int32_t)(rng_u32() % (uint32_t)V);
        if (pattern == TOK_EDGES) tok[i] = i % 3 == 0 ? 0 : i % 3 == 1 ? V - 1 : r;
        else if (pattern == TOK_TILES) tok[i] = (i + 1) % V;
        else if (pattern == TOK_SAME) tok[i] = V - 1;
        else tok[i] = r;
    }
    if (pattern == TOK_TILES)
        for (int i : {128, 129, N - 1})
            if (i < N) tok[i] = tok[0];
    return tok;
}

// `mis`: out, dout and dwte 2 bytes past 16-byte alignment (the element-wise paths)
static void test_embedding(int N, int C, int V, int pattern, size_t mis) {
    std::vector<float> wte = randn_bf((size_t)V * C, 1.0f);
    std::vector<float> dout = randn_bf((size_t)N * C, 1.0f);
    std::vector<float> dwte0 = randn_bf((size_t)V * C, 0.5f);
    std::vector<int32_t> tok = make_tokens(N, V, pattern);
    static const char *pname[] = {"", " first/last ids", " tile repeats", " one id"};
    std::string shape = fmt("N=%d C=%d V=%d%s%s", N, C, V, pname[pattern], mis ? " misal" : "");

    std::vector<float> out_ref((size_t)N * C), dwte_ref = dwte0;
    CPU->embedding_fwd(out_ref.data(), tok.data(), wte.data(), N, C, V);
    CPU->embedding_bwd(dwte_ref.data(), ST_F32, dout.data(), tok.data(), N, C, V);

    run_case("embedding_fwd", shape, {nmse_ref("out", out_ref, THR_EXACT)}, [&](Run &r) {
        Dev d;
        void *out = d.alloc((size_t)N * C * 2, mis);
        r.rc = ftk_embedding_fwd(out, d.i32(tok), d.bf16(wte), N, C, V, 0);
        r.guards = d.guards_ok();
        r.outs = {read_bf16(out, (size_t)N * C)};
    });
    run_case("embedding_bwd", shape, {nmse_ref("dwte", dwte_ref, THR_BF16)}, [&](Run &r) {
        Dev d;
        void *dwte = d.bf16(dwte0, mis);
        r.rc = ftk_embedding_bwd(dwte, 0, d.bf16(dout, mis), d.i32(tok), N, C, V, 0);
        r.guards = d.guards_ok();
        r.outs = {read_bf16(dwte, (size_t)V * C)};
    });
    // into an fp32 gradient (one shard: the step's gradient itself): no bf16 rounding left,
    // only the order of the fp32 adds differs from the CPU's (THR_F32)
    run_case("embedding_bwd fp32 dwte", shape, {nmse_ref("dwte", dwte_ref, THR_F32)}, [&](Run &r) {
        Dev d;
        float *dwte = d.f32(dwte0, mis ? 4 : 0);
        r.rc = ftk_embedding_bwd(dwte, 1, d.bf16(dout, mis), d.i32(tok), N, C, V, 0);
        r.guards = d.guards_ok();
        r.outs = {read_f32(dwte, (size_t)V * C)};
    });
}

// ----------------------------------------------------------------------------
// rmsnorm

// `small`: row n has scale {0, 1e-3, 3.2e-3, 1e-2, 1}[n % 5], i.e. a mean square of 0 (an
// all-zero row), 0.1, 1 and 10 times eps, and ~1: the rows where eps decides rstd
static void test_rmsnorm(int N, int C, size_t mis, bool small) {
    const float eps = 1e-5f;
    std::vector<float> x = randn_f((size_t)N * C, 1.0f), w = randn_bf(C, 1.0f);
    const float row_scale[5] = {0.0f, 1e-3f, 3.16e-3f, 1e-2f, 1.0f};
    for (size_t i = 0; i < x.size(); i++) x[i] = bfround(x[i] * (small ? row_scale[i / C % 5] : 1.0f));
    for (auto &v : w) v = bfround(1.0f + 0.2f * v);
    std::vector<float> dy = randn_bf((size_t)N * C, 1.0f);
    std::vector<float> dx0 = randn_bf((size_t)N * C, 0.5f), dw0 = randn_bf(C, 0.5f);
    std::string shape = fmt("N=%d C=%d%s%s", N, C, mis ? " misaligned" : "", small ? " ms~eps" : "");

    std::vector<float> y_ref((size_t)N * C), rstd_ref(N), dx_ref = dx0, dw_ref = dw0;
    CPU->rmsnorm_fwd(y_ref.data(), rstd_ref.data(), NULL, x.data(), w.data(), N, C, eps);
    CPU->rmsnorm_bwd(dx_ref.data(), dw_ref.data(), ST_F32, dy.data(), x.data(), w.data(), rstd_ref.data(),
                     N, C);

    run_case("rmsnorm_fwd", shape, {nmse_ref("out", y_ref, THR_BF16), nmse_ref("rstd", rstd_ref, THR_F32)},
             [&](Run &r) {
                 Dev d;
                 void *y = d.alloc((size_t)N * C * 2, mis);
                 float *rstd = (float *)d.alloc((size_t)N * 4);
                 r.rc = ftk_rmsnorm_fwd(y, rstd, NULL, d.bf16(x, mis), d.bf16(w), N, C, eps, 0);
                 r.guards = d.guards_ok();
                 r.outs = {read_bf16(y, (size_t)N * C), read_f32(rstd, N)};
             });
    run_case("rmsnorm_bwd", shape, {nmse_ref("dinp", dx_ref, THR_BF16), nmse_ref("dweight", dw_ref, THR_BF16)},
             [&](Run &r) {
                 Dev d;
                 void *dx = d.bf16(dx0, mis), *dw = d.bf16(dw0);
                 r.rc = ftk_rmsnorm_bwd(dx, dw, 0, d.bf16(dy), d.bf16(x), d.bf16(w), d.f32(rstd_ref),
                                        N, C, 0);
                 r.guards = d.guards_ok();
                 r.outs = {read_bf16(dx, (size_t)N * C), read_bf16(dw, C)};
             });
    // dweight fp32 (the step's gradient itself): the column sums in a different order than
    // the CPU's, no bf16 rounding (THR_F32)
    run_case("rmsnorm_bwd fp32 dweight", shape,
             {nmse_ref("dinp", dx_ref, THR_BF16), nmse_ref("dweight", dw_ref, THR_F32)}, [&](Run &r) {
                 Dev d;
                 void *dx = d.bf16(dx0, mis);
                 float *dw = d.f32(dw0);
                 r.rc = ftk_rmsnorm_bwd(dx, dw, 1, d.bf16(dy), d.bf16(x), d.bf16(w), d.f32(rstd_ref), N, C, 0);
                 r.guards = d.guards_ok();
                 r.outs = {read_bf16(dx, (size_t)N * C), read_f32(dw, C)};
             });
}

// ----------------------------------------------------------------------------
// rope

// RoPE tables from the model's code path (src/model.c rope_tables_compute, what the model
// uploads): theta 10000 unscaled (the default), or Llama 3.1's llama3 frequency scaling
// (theta 5e5, factor 8, low/high frequency factors 1 and 4, original context 8192).
enum { ROPE_DEFAULT, ROPE_LLAMA3 };
static void rope_tables(int kind, int T, int D, std::vector<float> &cs, std::vector<float> &sn) {
    llama_config c;
    memset(&c, 0, sizeof c);
    c.head_dim = D;
    c.rope_theta = 10000.0;
    c.rope_scaling = ROPE_SCALING_NONE;
    if (kind == ROPE_LLAMA3) {
        c.rope_theta = 500000.0;
        c.rope_scaling = ROPE_SCALING_LLAMA3;
        c.rope_factor = 8.0;
        c.rope_low_freq_factor = 1.0;
        c.rope_high_freq_factor = 4.0;
        c.rope_original_max_position_embeddings = 8192;
    }
    cs.resize((size_t)T * (D / 2));
    sn.resize((size_t)T * (D / 2));
    rope_tables_compute(&c, T, cs.data(), sn.data());
}

// The llama3 tables really are scaled: at position 1 the angle is inv_freq itself; against
// the unscaled inv_freq of theta 5e5, high-frequency pairs keep it, low-frequency pairs are
// divided by the factor 8, and the band in between is blended (all three occur at D = 128).
static void test_rope_llama3_tables(int D) {
    std::vector<float> cs, sn;
    rope_tables(ROPE_LLAMA3, 2, D, cs, sn);
    int same = 0, divided = 0, blended = 0, half = D / 2;
    for (int i = 0; i < half; i++) {
        double inv = pow(500000.0, -2.0 * i / D);
        double angle = atan2((double)sn[half + i], (double)cs[half + i]);
        double ratio = angle / inv;
        if (fabs(ratio - 1.0) < 1e-4) same++;
        else if (fabs(ratio - 0.125) < 1e-4) divided++;
        else if (ratio > 0.125 && ratio < 1.0) blended++;
    }
    EXPECT(same > 0 && divided > 0 && blended > 0 && same + divided + blended == half,
           "llama3 RoPE tables D=%d: %d unscaled, %d divided by 8, %d blended of %d", D, same,
           divided, blended, half);
}

// Segment starts (--pack_attention per_game; backend.h) of `games` (test_games_tokens, e.g.
// "0,5|9"); empty for NULL (no segments).
static std::vector<int32_t> segments_of(const char *games, int B, int T) {
    std::vector<int32_t> seg;
    if (!games) return seg;
    std::vector<int32_t> tok((size_t)B * T);
    test_games_tokens(games, B, T, tok.data());
    seg.resize((size_t)B * T);
    model_segment_starts(tok.data(), B, T, 1, seg.data());
    return seg;
}
static const int32_t *seg_host(const std::vector<int32_t> &seg) { return seg.empty() ? nullptr : seg.data(); }
static const int32_t *seg_dev(Dev &d, const std::vector<int32_t> &seg) { return seg.empty() ? nullptr : d.i32(seg); }

static void test_rope(int B, int T, int NH, int D, bool inplace, size_t mis, int kind, const char *games = nullptr) {
    size_t n = (size_t)B * T * NH * D;
    std::vector<float> x = randn_bf(n, 1.0f), cs, sn;
    rope_tables(kind, T, D, cs, sn);
    std::string shape = fmt("B=%d T=%d NH=%d D=%d%s%s%s%s%s", B, T, NH, D, inplace ? " inplace" : "",
                            mis ? " misal" : "", kind == ROPE_LLAMA3 ? " llama3" : "", games ? " games=" : "",
                            games ? games : "");
    const std::vector<int32_t> seg = segments_of(games, B, T);
    std::vector<float> yf(n), yb(n);
    CPU->rope_fwd(yf.data(), x.data(), cs.data(), sn.data(), B, T, NH, D, seg_host(seg));
    CPU->rope_bwd(yb.data(), x.data(), cs.data(), sn.data(), B, T, NH, D, seg_host(seg));
    for (int dir = 0; dir < 2; dir++)
        run_case(dir ? "rope_bwd" : "rope_fwd", shape, {nmse_ref("out", dir ? yb : yf, THR_BF16)},
                 [&](Run &r) {
                     Dev d;
                     void *in = d.bf16(x, mis);
                     void *out = inplace ? in : d.alloc(n * 2, mis);
                     const float *c = d.f32(cs), *s = d.f32(sn);
                     const int32_t *sg = seg_dev(d, seg);
                     r.rc = dir ? ftk_rope_bwd(out, in, c, s, B, T, NH, D, sg, 0)
                                : ftk_rope_fwd(out, in, c, s, B, T, NH, D, sg, 0);
                     r.guards = d.guards_ok();
                     r.outs = {read_bf16(out, n)};
                 });
}

// The fused q|k|v split (forward: q, k rotated, v copied out of (B, T, (H + 2 KVH) D) rows)
// and gather (backward), on the vector path (D/2 % 8 == 0, rows 16-byte aligned) and the
// scalar one; `mis` misaligns the fused buffer by 2 bytes.
static void test_rope_qkv(int B, int T, int H, int KVH, int D, size_t mis, int kind, bool norot = false,
                          const char *games = nullptr) {
    const size_t N = (size_t)B * T, nq = N * H * D, nkv = N * KVH * D, n = nq + 2 * nkv;
    std::vector<float> x = randn_bf(n, 1.0f), cs, sn;
    rope_tables(kind, T, D, cs, sn);
    std::string shape = fmt("B=%d T=%d H=%d KVH=%d D=%d%s%s%s%s%s", B, T, H, KVH, D, mis ? " misal" : "",
                            kind == ROPE_LLAMA3 ? " llama3" : "", norot ? " no tables" : "", games ? " games=" : "",
                            games ? games : "");
    const std::vector<int32_t> seg = segments_of(games, B, T);
    std::vector<float> yf(n), yb(n);   // fwd: [q | k | v] packed; bwd: the fused rows
    const float *hc = norot ? nullptr : cs.data(), *hs = norot ? nullptr : sn.data();
    CPU->rope_qkv_fwd(yf.data(), yf.data() + nq, yf.data() + nq + nkv, x.data(), hc, hs, B, T, H, KVH, D, seg_host(seg));
    CPU->rope_qkv_bwd(yb.data(), x.data(), x.data() + nq, x.data() + nq + nkv, hc, hs, B, T, H, KVH, D, seg_host(seg));
    for (int dir = 0; dir < 2; dir++)
        run_case(dir ? "rope_qkv_bwd" : "rope_qkv_fwd", shape, {nmse_ref("out", dir ? yb : yf, THR_BF16)},
                 [&](Run &r) {
                     Dev d;
                     const float *c = norot ? nullptr : d.f32(cs), *s = norot ? nullptr : d.f32(sn);
                     if (dir) {   // x read as dq | dk | dv (packed), out = the fused rows
                         char *in = (char *)d.bf16(x, 0);
                         void *out = d.alloc(n * 2, mis);
                         r.rc = ftk_rope_qkv_bwd(out, in, in + nq * 2, in + (nq + nkv) * 2, c, s, B, T, H, KVH, D,
                                                 seg_dev(d, seg), 0);
                         r.guards = d.guards_ok();
                         r.outs = {read_bf16(out, n)};
                     } else {     // x read as the fused rows, out = q | k | v (packed)
                         void *in = d.bf16(x, mis);
                         char *out = (char *)d.alloc(n * 2, 0);
                         r.rc = ftk_rope_qkv_fwd(out, out + nq * 2, out + (nq + nkv) * 2, in, c, s, B, T, H, KVH, D,
                                                 seg_dev(d, seg), 0);
                         r.guards = d.guards_ok();
                         r.outs = {read_bf16(out, n)};
                     }
                 });
}

// ----------------------------------------------------------------------------
// attention

// the forward on both paths: SIMT (always) and tensor cores (when D % 16 == 0);
// `mis` misaligns q and out by 2 bytes (the element-by-element loads and stores)
static void test_attention(int B, int T, int H, int KVH, int D, float qscale, size_t mis = 0,
                           const char *games = nullptr) {
    size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * KVH * D;
    std::vector<float> q = randn_bf(nq, qscale), k = randn_bf(nk, 1.0f), v = randn_bf(nk, 1.0f);
    std::vector<float> dout = randn_bf(nq, 1.0f);
    std::string shape = fmt("B=%d T=%d H=%d KVH=%d D=%d%s%s%s%s", B, T, H, KVH, D,
                            qscale > 10 ? " scores~100" : qscale > 1 ? " peaky" : "",
                            mis ? " misal" : "", games ? " games=" : "", games ? games : "");
    const std::vector<int32_t> seg = segments_of(games, B, T);
    std::vector<float> out_ref(nq), lse_ref((size_t)B * H * T);
    CPU->attention_fwd(out_ref.data(), lse_ref.data(), q.data(), k.data(), v.data(), B, T, H, KVH, D, seg_host(seg));
    for (int tc = 0; tc < (D % 16 == 0 ? 2 : 1); tc++) {
        ftk_attention_set_tensor_cores(tc);
        run_case(tc ? "attention_fwd_tc" : "attention_fwd", shape,
                 {nmse_ref("out", out_ref, tc ? THR_ATT_TC : THR_BF16),
                  nmse_ref("lse", lse_ref, THR_F32)},
                 [&](Run &r) {
                     Dev d;
                     void *out = d.alloc(nq * 2, mis);
                     float *lse = (float *)d.alloc(lse_ref.size() * 4);
                     r.rc = ftk_attention_fwd(out, lse, d.bf16(q, mis), d.bf16(k), d.bf16(v), B,
                                              T, H, KVH, D, seg_dev(d, seg), 0);
                     r.guards = d.guards_ok();
                     r.outs = {read_bf16(out, nq), read_f32(lse, lse_ref.size())};
                 });
    }
    ftk_attention_set_tensor_cores(1);
    // backward from the bf16-rounded forward output (what the GPU backward receives) and the
    // reference lse
    std::vector<float> out_bf(nq);
    for (size_t i = 0; i < nq; i++) out_bf[i] = bfround(out_ref[i]);
    std::vector<float> dq_ref(nq), dk_ref(nk), dv_ref(nk);
    CPU->attention_bwd(dq_ref.data(), dk_ref.data(), dv_ref.data(), dout.data(), out_bf.data(),
                       lse_ref.data(), q.data(), k.data(), v.data(), B, T, H, KVH, D, seg_host(seg));
    // T = 1: one key, so P = 1 and dS = P (dout.v - dout.out) scale = 0 exactly; dq and dk
    // are fp32 cancellation noise on both sides (their summation orders differ), checked
    // as an absolute RMS (THR_T1_RMS) instead of relative to noise
    std::vector<Ref> refs = {nmse_ref("dq", dq_ref, THR_BF16), nmse_ref("dk", dk_ref, THR_BF16),
                             nmse_ref("dv", dv_ref, THR_BF16)};
    for (int i = 0; i < 2 && T == 1; i++) {
        refs[i].metric = M_RMS;
        refs[i].thr = THR_T1_RMS;
    }
    // the tensor-core backward (D % 16 == 0): THR_ATT_TC (see the top); also with a dS
    // workspace cap of one kv head of one sequence (cap 1: B * KVH launch pairs) and, for
    // B > 2, of two sequences (chunks of 2 and B - 2)
    const size_t Tp = (size_t)(T + 15) / 16 * 16, per_seq = (size_t)H * Tp * Tp * 2;
    const size_t caps[3] = {0, 1, 2 * per_seq};
    for (int run = 0; run < (D % 16 == 0 ? 4 : 1); run++) {
        const int tc = run > 0;
        if (run == 2 && B * KVH == 1) continue;
        if (run == 3 && B <= 2) continue;
        ftk_attention_set_tensor_cores(tc);
        ftk_attention_set_ds_cap(tc ? caps[run - 1] : 0);
        for (int i = 0; i < 3 && tc; i++)
            if (refs[i].metric != M_RMS) refs[i].thr = THR_ATT_TC;
        const char *name = run == 0 ? "attention_bwd" : run == 1 ? "attention_bwd_tc"
                         : run == 2 ? "attention_bwd_tc_cap1" : "attention_bwd_tc_cap2seq";
        run_case(name, shape, refs, [&](Run &r) {
                     Dev d;
                     void *dq = d.alloc(nq * 2), *dk = d.alloc(nk * 2), *dv = d.alloc(nk * 2);
                     r.rc = ftk_attention_bwd(dq, dk, dv, d.bf16(dout, mis), d.bf16(out_bf),
                                              d.f32(lse_ref), d.bf16(q), d.bf16(k), d.bf16(v), B,
                                              T, H, KVH, D, seg_dev(d, seg), 0);
                     r.guards = d.guards_ok();
                     r.outs = {read_bf16(dq, nq), read_bf16(dk, nk), read_bf16(dv, nk)};
                 });
    }
    ftk_attention_set_tensor_cores(1);
    ftk_attention_set_ds_cap(0);
}

// ----------------------------------------------------------------------------
// lm_head + cross-entropy: the fused softmax step between the backend's GEMMs
//
// The reference is the CPU backend's whole lmhead_xent op on x = the logits (rows, V) and
// weight = the identity (V, V): its logits x I^T are the logits exactly (each a sum of one
// product by 1 and zeros), its dx = dlogits I is the fp32 dlogits, its losses the losses;
// with dloss = 1, as the kernel leaves the dloss scaling to the GEMMs.

// kinds: random targets with 1 in 5 ignored (-100); large logits (N(0, 40^2), ~120 and
// beyond, where exp without the max subtracted overflows fp32, and one 300 per row for the
// first two rows); every row ignored; targets cycling through the first id, the last id,
// -100 and a random id; every logit negative (N(-8, 1): a trained model's usual rows, the
// max below the partial sums of exp(l - max))
enum { LMH_NORMAL, LMH_LARGE, LMH_MASKED, LMH_EDGES, LMH_NEGATIVE };

static void test_lmhead_rows(int rows, int V, bool train, int kind) {
    const float scale = kind == LMH_LARGE ? 40.0f : kind == LMH_NEGATIVE ? 1.0f : 2.0f;   // LARGE: peaky rows
    std::vector<float> logits = randn_f((size_t)rows * V, scale);
    if (kind == LMH_NEGATIVE)
        for (float &v : logits) v -= 8.0f;
    std::vector<int32_t> tgt(rows);
    for (int i = 0; i < rows; i++) {
        const int32_t r = (int32_t)(rng_u32() % V);
        if (kind == LMH_MASKED) tgt[i] = -100;
        else if (kind == LMH_EDGES) tgt[i] = i % 4 == 0 ? 0 : i % 4 == 1 ? V - 1 : i % 4 == 2 ? -100 : r;
        else tgt[i] = rng_u32() % 5 == 0 ? -100 : r;
    }
    if (kind == LMH_LARGE && rows > 1) {   // a row dominated by its target, one by another id
        logits[tgt[0] >= 0 ? (size_t)tgt[0] : 0] = 300.0f;
        logits[(size_t)V + (tgt[1] >= 0 ? (size_t)(tgt[1] + 1) % V : 0)] = 300.0f;
    }
    const float dloss = 1.0f;
    static const char *kinds[] = {"", " large logits", " all masked", " targets 0/V-1/-100", " logits < 0"};
    std::string shape = fmt("rows=%d V=%d%s%s", rows, V, kinds[kind], train ? "" : " eval");
    std::vector<float> eye((size_t)V * V, 0.0f);
    for (int j = 0; j < V; j++) eye[(size_t)j * V + j] = 1.0f;
    std::vector<float> loss_ref(rows), dl_ref((size_t)rows * V), dw_ref((size_t)V * V, 0.0f), ws((size_t)rows * V);
    EXPECT(CPU->lmhead_xent(loss_ref.data(), train ? dl_ref.data() : nullptr, dw_ref.data(), ST_F32, logits.data(),
                            eye.data(), tgt.data(), rows, V, V, dloss, rows, ws.data(), nullptr) == 0,
           "cpu lmhead_xent: %s", ft_error_message());
    const double thr_loss = kind == LMH_MASKED ? THR_EXACT : THR_F32;   // all zero: exactly
    std::vector<Ref> refs = {nmse_ref("losses", loss_ref, thr_loss)};
    if (train) refs.push_back(nmse_ref("dlogits", dl_ref, kind == LMH_MASKED ? THR_EXACT : THR_BF16));
    else refs.push_back(nmse_ref("logits", logits, THR_EXACT));   // untouched in evaluation
    run_case("lmhead_xent_rows", shape, refs, [&](Run &r) {
        Dev d;
        float *loss = (float *)d.alloc((size_t)rows * 4);
        float *l = d.f32(logits);
        r.rc = ftk_lmhead_xent_rows(loss, l, d.i32(tgt), rows, V, train, 0);
        r.guards = d.guards_ok();
        r.outs = {read_f32(loss, rows)};
        if (!train) {
            r.outs.push_back(read_f32(l, (size_t)rows * V));
            return;
        }
        // bf16 dlogits: row i's V values at the start of its own fp32 row (stride 2V bf16)
        std::vector<uint16_t> packed((size_t)rows * V);
        for (int i = 0; i < rows; i++) memcpy(&packed[(size_t)i * V], l + (size_t)i * V, (size_t)V * 2);
        r.outs.push_back(read_bf16(packed.data(), packed.size()));
    });
}

// ----------------------------------------------------------------------------
// element-wise ops

// `wide`: gate ~ N(0, 40^2), so that exp(-gate) overflows fp32 (|gate| > 88) on some elements.
// `fused`: the kernel reads gate and up as the two halves of one (N, 2F) buffer (ld = 2F, the
// fused gate|up GEMM output) and writes dgate|dup likewise; the reference is the CPU op on
// separate contiguous (N, F) buffers (ld = F), so a stride bug on either side shows.
static std::vector<float> rows_interleave(const std::vector<float> &a, const std::vector<float> &b, int N, int F) {
    std::vector<float> ab((size_t)N * 2 * F);
    for (size_t r = 0; r < (size_t)N; r++)
        for (size_t j = 0; j < (size_t)F; j++) {
            ab[r * 2 * F + j] = a[r * F + j];
            ab[r * 2 * F + F + j] = b[r * F + j];
        }
    return ab;
}
// the gate (half 0) or up (half 1) columns of a read-back bf16 (N, 2F) buffer
static Output rows_half(const Output &ab, int N, int F, int half) {
    Output h;
    h.vals.resize((size_t)N * F);
    h.raw.resize((size_t)N * F * 2);
    for (size_t r = 0; r < (size_t)N; r++)
        for (size_t j = 0; j < (size_t)F; j++) {
            const size_t src = r * 2 * F + (size_t)half * F + j, dst = r * F + j;
            h.vals[dst] = ab.vals[src];
            memcpy(&h.raw[dst * 2], &ab.raw[src * 2], 2);
        }
    return h;
}

static void test_swiglu(int N, int F, size_t mis, bool alias, bool wide = false, bool fused = false) {
    const size_t n = (size_t)N * F;
    std::vector<float> g = randn_bf(n, wide ? 40.0f : 2.0f), u = randn_bf(n, 1.0f), dy = randn_bf(n, 1.0f);
    std::string shape = fmt("N=%d F=%d%s%s%s%s", N, F, fused ? " fused (N,2F)" : "", mis ? " misaligned" : "",
                            alias ? " dgate=dout" : "", wide ? " |gate|>88" : "");
    std::vector<float> y_ref(n), dg_ref(n), du_ref(n);
    CPU->swiglu_fwd(y_ref.data(), NULL, g.data(), u.data(), N, F, F);
    CPU->swiglu_bwd(dg_ref.data(), du_ref.data(), dy.data(), g.data(), u.data(), N, F, F);
    const std::vector<float> gu = fused ? rows_interleave(g, u, N, F) : std::vector<float>();
    const int ld = fused ? 2 * F : F;
    if (!alias)
        run_case("swiglu_fwd", shape, {nmse_ref("out", y_ref, THR_BF16)}, [&](Run &r) {
            Dev d;
            void *y = d.alloc(n * 2, mis);
            const uint16_t *gp = (const uint16_t *)(fused ? d.bf16(gu, mis) : d.bf16(g));
            const void *up = fused ? (const void *)(gp + F) : d.bf16(u, mis);
            r.rc = ftk_swiglu_fwd(y, NULL, gp, up, N, F, ld, 0);
            r.guards = d.guards_ok();
            r.outs = {read_bf16(y, n)};
        });
    run_case("swiglu_bwd", shape, {nmse_ref("dgate", dg_ref, THR_BF16), nmse_ref("dup", du_ref, THR_BF16)},
             [&](Run &r) {
                 Dev d;
                 void *dyp = d.bf16(dy, mis);
                 if (fused) {
                     uint16_t *dgu = (uint16_t *)d.alloc(2 * n * 2, mis);
                     const uint16_t *gp = (const uint16_t *)d.bf16(gu);
                     r.rc = ftk_swiglu_bwd(dgu, dgu + F, dyp, gp, gp + F, N, F, ld, 0);
                     r.guards = d.guards_ok();
                     const Output both = read_bf16(dgu, 2 * n);
                     r.outs = {rows_half(both, N, F, 0), rows_half(both, N, F, 1)};
                     return;
                 }
                 void *dg = alias ? dyp : d.alloc(n * 2, mis), *du = d.alloc(n * 2);
                 r.rc = ftk_swiglu_bwd(dg, du, dyp, d.bf16(g), d.bf16(u), N, F, F, 0);
                 r.guards = d.guards_ok();
                 r.outs = {read_bf16(dg, n), read_bf16(du, n)};
             });
}

static void test_scale(size_t n, size_t mis, bool alias) {
    const float alpha = 2.5f;   // the LoRA scaling alpha / r (e.g. 16 / 8 = 2, 20 / 8 = 2.5)
    std::vector<float> a = randn_bf(n, 1.0f), ref(n);
    CPU->scale(ref.data(), a.data(), alpha, n);
    std::string shape = fmt("n=%zu%s%s", n, mis ? " misaligned" : "", alias ? " out=inp" : "");
    run_case("scale", shape, {nmse_ref("out", ref, THR_BF16)}, [&](Run &r) {
        Dev d;
        void *ap = d.bf16(a, mis);
        void *out = alias ? ap : d.alloc(n * 2);
        r.rc = ftk_scale(out, ap, alpha, n, 0);
        r.guards = d.guards_ok();
        r.outs = {read_bf16(out, n)};
    });
}

// src bf16 (a bf16 gradient or reduce-scatter output) or fp32 (--reduce_dtype fp32's)
static void test_accumulate(size_t n, size_t mis, int src_f32) {
    const float alpha = 0.37f;
    std::vector<float> dst0 = randn_f(n, 1.0f), src = src_f32 ? randn_f(n, 1.0f) : randn_bf(n, 1.0f), ref = dst0;
    CPU->accumulate(ref.data(), src.data(), ST_F32, n, alpha);
    run_case("accumulate", fmt("n=%zu %s%s", n, src_f32 ? "f32" : "bf16", mis ? " misaligned" : ""),
             {nmse_ref("dst", ref, THR_F32)}, [&](Run &r) {
                 Dev d;
                 float *dst = d.f32(dst0);
                 // (misalignment in bytes: one element of the source's type, as a real
                                 // buffer can be; a float at a 2-byte offset cannot)
                 r.rc = ftk_accumulate(dst, src_f32 ? (const void *)d.f32(src, mis * 2) : d.bf16(src, mis), src_f32,
                                       n, alpha, 0);
                 r.guards = d.guards_ok();
                 r.outs = {read_f32(dst, n)};
             });
}

static void test_cast(size_t n, size_t mis, bool specials) {
    std::vector<float> src = randn_f(n, 3.0f);
    if (specials) {
        const float sp[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, -3e-39f, 3.4e38f,
                            1.00390625f /* tie */, 1.01171875f /* tie */, 65504.0f, 1e-30f};
        for (size_t i = 0; i < n && i < sizeof sp / sizeof sp[0]; i++) src[i * 3 % n] = sp[i];
    }
    // the CPU op (an fp32 copy) for NMSE, and the host round-to-nearest-even bit patterns,
    // which the kernel must match exactly (NaN, inf, subnormals, ties included)
    std::vector<float> ref(n);
    CPU->cast_from_f32(ref.data(), src.data(), n);
    Ref bits;
    bits.name = "bits!=";
    bits.thr = 0;
    bits.metric = M_BITS;
    for (size_t i = 0; i < n; i++) {
        uint16_t h = ft_f32_to_bf16(src[i]);
        bits.bits.push_back((unsigned char)(h & 0xff));
        bits.bits.push_back((unsigned char)(h >> 8));
    }
    std::vector<Ref> refs;
    if (!specials) refs.push_back(nmse_ref("dst", ref, THR_BF16));   // NaN/inf: bits only
    refs.push_back(bits);
    std::string shape = fmt("n=%zu%s%s", n, mis ? " misaligned" : "", specials ? " specials" : "");
    run_case("cast_from_f32", shape, refs, [&](Run &r) {
        Dev d;
        void *dst = d.alloc(n * 2, mis);
        r.rc = ftk_cast_from_f32(dst, d.f32(src), n, 0);
        r.guards = d.guards_ok();
        Output o = read_bf16(dst, n);
        r.outs.clear();
        if (!specials) r.outs.push_back(o);
        r.outs.push_back(o);
    });
}

// FP8 codes read back: their values (exact in fp32) and their bytes
static Output read_fp8(const void *p, size_t n, fp8_format f) {
    Output o;
    o.raw.assign((const unsigned char *)p, (const unsigned char *)p + n);
    for (size_t i = 0; i < n; i++) o.vals.push_back(fp8_to_float(o.raw[i], f));
    return o;
}

// fp8_quantize: bf16 values of magnitude `mag` (an inf at element 0 when `inf`; all zeros when
// mag is 0), quantised in `fmt` into out, out_t or both (layouts: 1 out, 2 out_t, 3 both).
// Codes, amax and the scales must equal the CPU backend's (src/fp8.c's conversions) exactly:
// the same fp32 product, one correctly rounded conversion, an order-free max.
// cast: through ftk_fp8_cast with the amax given (the CPU's, exact: the inputs are bf16 values)
static void test_fp8_quantize(int rows, int cols, fp8_format f, float mag, bool inf, int layouts, size_t mis,
                              bool cast = false) {
    const size_t n = (size_t)rows * cols;
    std::vector<float> x = randn_bf(n, mag);
    if (inf && n) x[0] = -INFINITY;
    std::vector<unsigned char> q(n), qt(n);
    float st[3];
    CPU->fp8_quantize(q.data(), qt.data(), st, x.data(), rows, cols, f);
    std::vector<Ref> refs;
    auto codes = [&](const char *name, const std::vector<unsigned char> &c) {
        std::vector<float> v(n);
        for (size_t i = 0; i < n; i++) v[i] = fp8_to_float(c[i], f);
        refs.push_back(nmse_ref(name, v, THR_EXACT));
    };
    if (layouts & 1) codes("out", q);
    if (layouts & 2) codes("out_t", qt);
    // amax as "is it infinite" when it is (NMSE takes no infinities), then the two scales
    refs.push_back(nmse_ref("stats", {inf ? 1.0f : st[0], st[1], st[2]}, THR_EXACT));
    std::string shape = fmt("%dx%d %s |x|~%g%s%s%s", rows, cols, fp8_name(f), mag, inf ? " inf" : "",
                            layouts == 1 ? "" : layouts == 2 ? " out_t only" : " +out_t", mis ? " misaligned" : "");
    run_case(cast ? "fp8_cast" : "fp8_quantize", shape, refs, [&](Run &r) {
        Dev d;
        void *o = layouts & 1 ? d.alloc(n, mis) : nullptr, *ot = layouts & 2 ? d.alloc(n, mis) : nullptr;
        float *stats = (float *)d.alloc(3 * sizeof(float));
        if (cast) r.rc = ftk_fp8_cast(o, ot, stats, d.f32({st[0]}), d.bf16(x, mis), rows, cols, (int)f, 0);
        else r.rc = ftk_fp8_quantize(o, ot, stats, d.bf16(x, mis), rows, cols, (int)f, 0);
        r.guards = d.guards_ok();
        r.outs.clear();
        if (o) r.outs.push_back(read_fp8(o, n, f));
        if (ot) r.outs.push_back(read_fp8(ot, n, f));
        Output so = read_f32(stats, 3);
        if (inf) so.vals[0] = isinf(so.vals[0]) ? 1.0f : 0.0f;
        r.outs.push_back(so);
    });
}

// --fp8's fused amax (backend.h rmsnorm_fwd, swiglu_fwd): on the device, the producer's
// output y (rows, cols) quantised twice, by fp8_quantize (its own amax pass) and by fp8_cast
// from the producer's amax, both layouts. The output: that amax minus fp8_quantize's, the
// three stats' differences and the number of differing codes: all exactly 0 when the fused
// path gives the unfused one's bits.
static Output fused_vs_unfused(Dev &d, const float *amax, const void *y, int rows, int cols, int *rc) {
    const size_t n = (size_t)rows * cols;
    unsigned char *q[2], *t[2];
    float *st[2];
    for (int k = 0; k < 2; k++) {
        q[k] = (unsigned char *)d.alloc(n), t[k] = (unsigned char *)d.alloc(n);
        st[k] = (float *)d.alloc(3 * sizeof(float));
    }
    *rc |= ftk_fp8_quantize(q[0], t[0], st[0], y, rows, cols, FP8_E4M3, 0);
    *rc |= ftk_fp8_cast(q[1], t[1], st[1], amax, y, rows, cols, FP8_E4M3, 0);
    float bad = 0;
    for (size_t i = 0; i < n; i++) bad += (q[0][i] != q[1][i]) + (t[0][i] != t[1][i]);
    std::vector<float> v = {*amax - st[0][0], st[1][0] - st[0][0], st[1][1] - st[0][1], st[1][2] - st[0][2], bad};
    return read_f32(v.data(), v.size());
}
// its reference: 5 zeros, exactly (absolute RMS, threshold 0)
static Ref fused_ref() {
    Ref r = nmse_ref("fused=", std::vector<float>(5, 0.0f), 0.0);
    r.metric = M_RMS;
    return r;
}

// rmsnorm_fwd with an amax slot (filled with 1e30 first: a slot not zeroed shows): the output
// and amax against the CPU's (bf16: the device's output is rounded), then fused_vs_unfused
static void test_rmsnorm_amax(int N, int C, size_t mis) {
    const float eps = 1e-5f;
    std::vector<float> x = randn_bf((size_t)N * C, 1.0f), w = randn_bf(C, 1.0f), y_ref((size_t)N * C), rstd_ref(N);
    for (auto &v : w) v = bfround(1.0f + 0.5f * v);
    float amax_ref = 0;
    CPU->rmsnorm_fwd(y_ref.data(), rstd_ref.data(), &amax_ref, x.data(), w.data(), N, C, eps);
    std::string shape = fmt("N=%d C=%d%s", N, C, mis ? " misaligned" : "");
    run_case("rmsnorm_fwd amax", shape,
             {nmse_ref("out", y_ref, THR_BF16), nmse_ref("amax", {amax_ref}, THR_BF16), fused_ref()}, [&](Run &r) {
                 Dev d;
                 void *y = d.alloc((size_t)N * C * 2, mis);
                 float *rstd = (float *)d.alloc((size_t)N * 4), *amax = d.f32({1e30f});
                 r.rc = ftk_rmsnorm_fwd(y, rstd, amax, d.bf16(x, mis), d.bf16(w), N, C, eps, 0);
                 Output f = fused_vs_unfused(d, amax, y, N, C, &r.rc);
                 r.guards = d.guards_ok();
                 r.outs = {read_bf16(y, (size_t)N * C), read_f32(amax, 1), f};
             });
}

// swiglu_fwd with an amax slot, as test_rmsnorm_amax; `fused`: the (N, 2F) gate|up layout
static void test_swiglu_amax(int N, int F, size_t mis, bool fused) {
    const size_t n = (size_t)N * F;
    std::vector<float> g = randn_bf(n, 2.0f), u = randn_bf(n, 1.0f), y_ref(n);
    float amax_ref = 0;
    CPU->swiglu_fwd(y_ref.data(), &amax_ref, g.data(), u.data(), N, F, F);
    const std::vector<float> gu = fused ? rows_interleave(g, u, N, F) : std::vector<float>();
    std::string shape = fmt("N=%d F=%d%s%s", N, F, fused ? " fused (N,2F)" : "", mis ? " misaligned" : "");
    run_case("swiglu_fwd amax", shape,
             {nmse_ref("out", y_ref, THR_BF16), nmse_ref("amax", {amax_ref}, THR_BF16), fused_ref()}, [&](Run &r) {
                 Dev d;
                 void *y = d.alloc(n * 2, mis);
                 float *amax = d.f32({1e30f});
                 const uint16_t *gp = (const uint16_t *)(fused ? d.bf16(gu, mis) : d.bf16(g));
                 const void *up = fused ? (const void *)(gp + F) : d.bf16(u, mis);
                 r.rc = ftk_swiglu_fwd(y, amax, gp, up, N, F, fused ? 2 * F : F, 0);
                 Output f = fused_vs_unfused(d, amax, y, N, F, &r.rc);
                 r.guards = d.guards_ok();
                 r.outs = {read_bf16(y, n), read_f32(amax, 1), f};
             });
}

// gradients: random at step 3; at step 1 (the largest bias corrections) a mix per element of
// zero gradient with zero state (an embedding row no token used yet), zero gradient with
// earlier state, gradients ~1e-9 (sqrt(v) ~ eps) with zero state, and random ones; or zero
// gradients and zero state everywhere. Where sqrt(v) ~ eps, eps decides the step size; with
// v = 0 it is all that keeps 0/0 out.
enum { GRAD_RANDOM, GRAD_MIXED, GRAD_ZERO };
static void test_adamw(size_t n, size_t mis, bool with_param, int grads = GRAD_RANDOM) {
    const int step = grads == GRAD_RANDOM ? 3 : 1;
    adamw_params p = {};
    p.lr = 1e-3f; p.beta1 = 0.9f; p.beta2 = 0.95f; p.eps = 1e-8f; p.weight_decay = 0.1f;
    p.bias_correction1 = 1.0f - powf(0.9f, step);
    p.bias_correction2 = 1.0f - powf(0.95f, step);
    p.grad_scale = 0.5f;
    std::vector<float> w0 = randn_f(n, 1.0f), g = randn_f(n, 1.0f), m0 = randn_f(n, 0.1f),
                       v0 = randn_f(n, 0.1f);
    for (auto &v : v0) v = v * v;
    for (size_t i = 0; i < n && grads != GRAD_RANDOM; i++) {
        const uint32_t kind = grads == GRAD_ZERO ? 0 : rng_u32() % 4;
        if (kind <= 1) g[i] = 0.0f;
        if (kind == 2) g[i] *= 1e-9f;
        if (kind == 0 || kind == 2) m0[i] = v0[i] = 0.0f;
    }
    std::vector<float> w = w0, m = m0, v = v0, param(n);
    CPU->adamw(w.data(), param.data(), g.data(), m.data(), v.data(), ST_F32, n, &p);
    std::vector<Ref> refs = {nmse_ref("master", w, THR_F32), nmse_ref("m", m, THR_F32), nmse_ref("v", v, THR_F32)};
    if (with_param) refs.push_back(nmse_ref("param", w, THR_BF16));
    static const char *gname[] = {"", " zero/1e-9 grads", " zero grads+state"};
    run_case("adamw", fmt("n=%zu%s%s%s", n, mis ? " misaligned" : "", with_param ? "" : " param=NULL", gname[grads]),
             refs, [&](Run &r) {
                 Dev d;
                 float *mw = d.f32(w0, mis), *mm = d.f32(m0, mis), *mv = d.f32(v0, mis);
                 void *pp = with_param ? d.alloc(n * 2) : nullptr;
                 r.rc = ftk_adamw(mw, pp, d.f32(g, mis), mm, mv, 0, n, &p, 0);
                 r.guards = d.guards_ok();
                 r.outs = {read_f32(mw, n), read_f32(mm, n), read_f32(mv, n)};
                 if (with_param) r.outs.push_back(read_bf16(pp, n));
             });
}

// --optimizer_moments bf16: moments stored in bf16 (misaligned by `mis` bytes: 2 breaks their
// 8-byte groups), against the CPU op on the same bf16 moments. The stored moments are compared
// bit for bit, allowing a rounding flip in 1 element of 1000 (+1): the fp32 math may differ by
// FMA contraction (~1e-7 relative, a flip only where the random bits fall within that of the
// threshold, ~1e-5 of the elements); a store that rounds to nearest or truncates, takes other
// random bits (another moment's, step's, seed's or element's), or reads the moments as fp32,
// differs in about half of them. The stochastic rounding's counters: seed, step and the
// slice's global offset (one above 2^32: both halves of the index). Master fp32 (THR_F32 on
// the unrounded update), param bf16.
static void test_adamw_bf16_moments(size_t n, size_t mis, int grads, uint64_t offset = 12345) {
    adamw_params p = {};
    p.seed = 20261128u; p.step = 3; p.offset = offset;
    p.lr = 1e-3f; p.beta1 = 0.9f; p.beta2 = 0.999f; p.eps = 1e-8f; p.weight_decay = 0.1f;
    p.bias_correction1 = 1.0f - powf(0.9f, 3);
    p.bias_correction2 = 1.0f - powf(0.999f, 3);
    p.grad_scale = 0.5f;
    std::vector<float> w0 = randn_f(n, 1.0f), g = randn_f(n, 1.0f), m0 = randn_f(n, 0.1f), v0 = randn_f(n, 0.1f);
    for (auto &v : v0) v = v * v;
    for (size_t i = 0; i < n && grads == GRAD_MIXED; i++) {
        const uint32_t kind = rng_u32() % 4;
        if (kind <= 1) g[i] = 0.0f;
        if (kind == 2) g[i] *= 1e-9f;
        if (kind == 0 || kind == 2) m0[i] = v0[i] = 0.0f;
    }
    std::vector<uint16_t> m16(n), v16(n);
    for (size_t i = 0; i < n; i++) m16[i] = ft_f32_to_bf16(m0[i]), v16[i] = ft_f32_to_bf16(v0[i]);
    std::vector<float> mb(n), vb(n);   // the bf16 inputs, widened: what the device gets
    for (size_t i = 0; i < n; i++) mb[i] = ft_bf16_to_f32(m16[i]), vb[i] = ft_bf16_to_f32(v16[i]);
    std::vector<float> w = w0, param(n);
    CPU->adamw(w.data(), param.data(), g.data(), m16.data(), v16.data(), ST_BF16, n, &p);
    std::vector<Ref> refs = {nmse_ref("master", w, THR_F32), nmse_ref("param", w, THR_BF16)};
    for (int k = 0; k < 2; k++) {
        Ref bits;
        bits.name = k ? "v bits!=" : "m bits!=";
        bits.thr = 1.0 + (double)(n / 1000);
        bits.metric = M_BITS;
        const std::vector<uint16_t> &h = k ? v16 : m16;
        bits.bits.assign((const unsigned char *)h.data(), (const unsigned char *)h.data() + 2 * n);
        refs.push_back(bits);
    }
    const char *what = grads == GRAD_MIXED ? " zero/1e-9 grads" : "";
    run_case("adamw bf16 moments", fmt("n=%zu%s%s off=%llu", n, mis ? " misaligned" : "", what, (unsigned long long)offset),
             refs, [&](Run &r) {
        Dev d;
        float *mw = d.f32(w0);
        void *mm = d.bf16(mb, mis), *mv = d.bf16(vb, mis), *pp = d.alloc(n * 2);
        r.rc = ftk_adamw(mw, pp, d.f32(g), mm, mv, 1, n, &p, 0);
        r.guards = d.guards_ok();
        r.outs = {read_f32(mw, n), read_bf16(pp, n), read_bf16(mm, n), read_bf16(mv, n)};
    });
}

// `wide`: magnitudes from 1e-25 to 1e25 (squares outside fp32's range both ways)
static void test_sum_squares(size_t n, size_t mis, bool wide = false) {
    std::vector<float> x = randn_f(n, 1.0f);
    const float mag[4] = {1e-25f, 1.0f, 1e12f, 1e25f};
    for (auto &v : x) v *= wide ? mag[rng_u32() % 4] : 1.0f;
    Ref ref;
    ref.name = "sum";
    ref.thr = THR_F64;
    ref.metric = M_F64;
    CPU->sum_squares(&ref.d, x.data(), n);
    run_case("sum_squares", fmt("n=%zu%s%s", n, mis ? " misaligned" : "", wide ? " 1e+-25" : ""), {ref}, [&](Run &r) {
        Dev d;
        double got = -1;
        r.rc = ftk_sum_squares(&got, d.f32(x, mis), n, 0);
        r.guards = d.guards_ok();
        Output o;
        o.raw.assign((unsigned char *)&got, (unsigned char *)&got + sizeof got);
        r.outs = {o};
    });
}

// sum_squares_accumulate into a device double holding `start`, against the CPU backend's op
// (relative error^2 <= THR_F64), and from 0 against ftk_sum_squares of the same n: bit for
// bit (the same reduction order; one add into 0 is exact). `special`: one element NaN (1) or
// +-inf (2) at a random place: the sum must come out NaN, or +inf (a square is never negative).
static void test_sum_squares_accumulate(size_t n, size_t mis, bool wide, int special = 0) {
    std::vector<float> x = randn_f(n, 1.0f);
    const float mag[4] = {1e-25f, 1.0f, 1e12f, 1e25f};
    for (auto &v : x) v *= wide ? mag[rng_u32() % 4] : 1.0f;
    if (special) x[rng_u32() % n] = special == 1 ? NAN : (rng_u32() % 2 ? INFINITY : -INFINITY);
    const double start = 2.5;
    double want = start;
    CPU->sum_squares_accumulate(&want, x.data(), n);
    std::vector<Ref> refs(2);
    refs[0].name = special ? "class" : "acc";
    refs[0].thr = special ? 0 : THR_F64;
    refs[0].metric = M_F64;
    refs[0].d = special ? (double)special : want;   // special: 1 NaN, 2 +inf
    refs[1].name = "vs sum_sq";
    refs[1].thr = 0;
    refs[1].metric = M_F64;
    refs[1].d = 0;   // (from 0) minus ftk_sum_squares: exactly 0 (NaN: both NaN, 0 given)
    const char *sp = special == 1 ? " NaN" : special == 2 ? " inf" : "";
    run_case("sum_squares_accumulate", fmt("n=%zu%s%s%s", n, mis ? " misaligned" : "", wide ? " 1e+-25" : "", sp), refs,
             [&](Run &r) {
                 Dev d;
                 double *acc = (double *)d.alloc(2 * sizeof(double));
                 acc[0] = start;
                 acc[1] = 0.0;
                 const float *dx = d.f32(x, mis);
                 r.rc = ftk_sum_squares_accumulate(acc, dx, n, 0) || ftk_sum_squares_accumulate(acc + 1, dx, n, 0);
                 double whole = -1;
                 if (r.rc == 0) r.rc = ftk_sum_squares(&whole, dx, n, 0);
                 cudaDeviceSynchronize();
                 r.guards = d.guards_ok();
                 double got = acc[0], diff = acc[1] - whole;
                 if (special) {
                     got = isnan(got) ? 1.0 : isinf(got) && got > 0 ? 2.0 : -1.0;
                     const bool both = special == 1 ? isnan(acc[1]) && isnan(whole) : acc[1] == whole;
                     diff = both ? 0.0 : 1.0;   // (inf - inf is NaN)
                 }
                 r.outs.resize(2);
                 r.outs[0].raw.assign((unsigned char *)&got, (unsigned char *)&got + sizeof got);
                 r.outs[1].raw.assign((unsigned char *)&diff, (unsigned char *)&diff + sizeof diff);
             });
}

// losses over magnitudes 1e-4 .. 30 (so that another summation order changes the double's
// last bits), about `ignored` of the rows with target -100 and a loss there that must not be
// added (a NaN or an infinity on some of them), added into an accumulator holding {2.5, 7}
static void test_loss_accumulate(int N, double ignored) {
    std::vector<float> losses((size_t)N);
    std::vector<int32_t> targets((size_t)N);
    const float mag[4] = {1e-4f, 0.3f, 3.0f, 30.0f};
    for (int i = 0; i < N; i++) {
        losses[i] = fabsf(rng_normal()) * mag[rng_u32() % 4];
        targets[i] = (double)(rng_u32() % 1000) < ignored * 1000 ? -100 : (int32_t)(rng_u32() % 50);
        if (targets[i] == -100 && i % 3 == 0) losses[i] = i % 2 ? NAN : INFINITY;
    }
    double ref[2] = {2.5, 7.0};
    CPU->loss_accumulate(ref, losses.data(), targets.data(), N);
    std::vector<Ref> refs(2);
    for (int k = 0; k < 2; k++) {
        refs[k].name = k ? "count" : "sum";
        refs[k].thr = 0;
        refs[k].metric = M_F64;
        refs[k].d = ref[k];
    }
    run_case("loss_accumulate", fmt("N=%d ignored~%.0f%%", N, ignored * 100), refs, [&](Run &r) {
        Dev d;
        double *acc = (double *)d.alloc(2 * sizeof(double));
        acc[0] = 2.5;
        acc[1] = 7.0;
        r.rc = ftk_loss_accumulate(acc, d.f32(losses), d.i32(targets), N, 0);
        r.guards = d.guards_ok();
        r.outs.resize(2);
        for (int k = 0; k < 2; k++)
            r.outs[k].raw.assign((unsigned char *)&acc[k], (unsigned char *)&acc[k] + sizeof(double));
    });
}

// ----------------------------------------------------------------------------


// ----------------------------------------------------------------------------
// the cases, one function per kernel file (the unit that `test_kernels OP` selects)

static bool g_san;   // FT_SANITIZED: smaller shapes under ASan

static void cases_embedding() {
    // (N, C, V, tokens, misalign): odd sizes, C % 8 == 0 (16-byte path) and not, C = 1,
    // N > 128 (several token tiles), C > 1024 (two and three column chunks, the last one
    // partial), heavy token repetition (V small, V = 1), the token patterns above
    const int emb[][5] = {{1, 8, 5, TOK_RANDOM, 0},     {7, 33, 11, TOK_RANDOM, 0},
                          {64, 128, 50, TOK_RANDOM, 0}, {37, 1000, 13, TOK_RANDOM, 0},
                          {100, 24, 3, TOK_RANDOM, 0},  {200, 64, 7, TOK_RANDOM, 0},
                          {5, 1030, 9, TOK_RANDOM, 0},  {5, 1, 1, TOK_RANDOM, 0},
                          {50, 40, 10, TOK_EDGES, 0},   {9, 1025, 13, TOK_EDGES, 0},
                          {6, 2056, 5, TOK_RANDOM, 0},  {260, 24, 1000, TOK_TILES, 0},
                          {300, 16, 7, TOK_SAME, 0},    {33, 64, 9, TOK_EDGES, 2}};
    for (auto &s : emb) test_embedding(s[0], s[1], s[2], s[3], (size_t)s[4]);
}

static void cases_rmsnorm() {
    // (N, C, misalign, small): C = 1, odd C, C % 8 == 0, C > 256 threads * 8 (threads loop),
    // N = 64 and 65, 130 (one, two and three 64-row dweight chunks), rows with mean square
    // near eps on the vector and scalar paths
    const int rms[][4] = {{1, 8, 0, 0},    {3, 33, 0, 0},  {5, 256, 0, 0},  {17, 1000, 0, 0},
                          {4, 4096, 0, 0}, {130, 40, 0, 0}, {6, 64, 2, 0},  {2, 7, 0, 0},
                          {1, 1, 0, 0},    {64, 16, 0, 0}, {3, 2056, 0, 0}, {5, 64, 0, 1},
                          {5, 33, 0, 1},   {10, 4096, 0, 1}, {65, 40, 0, 1}, {7, 1000, 2, 1}};
    for (auto &s : rms) test_rmsnorm(s[0], s[1], (size_t)s[2], s[3] != 0);
}

static void cases_rope() {
    // (B, T, NH, D, inplace, misalign, tables): T = 1 (angle 0) on both paths, D = 2, D = 24
    // (D/2 a multiple of 4, not 8: the scalar path), several batch rows (positions restart);
    // the last two with llama3-scaled tables, one over 1100
    // positions (past the blended band's wavelengths)
    const int rope[][7] = {{1, 1, 1, 2, 0, 0, 0},   {2, 5, 3, 16, 0, 0, 0},  {1, 7, 4, 64, 0, 0, 0},
                           {2, 3, 5, 10, 0, 0, 0},  {1, 9, 2, 128, 1, 0, 0}, {2, 4, 3, 32, 0, 2, 0},
                           {3, 11, 1, 6, 1, 0, 0},  {1, 1, 3, 128, 0, 0, 0}, {4, 1, 2, 16, 1, 0, 0},
                           {2, 3, 1, 2, 0, 2, 0},   {1, 5, 2, 24, 0, 0, 0},
                           {1, 1100, 1, 128, 1, 0, ROPE_LLAMA3},
                           {2, 33, 3, 64, 0, 2, ROPE_LLAMA3}};
    for (auto &s : rope)
        test_rope(s[0], s[1], s[2], s[3], s[4] != 0, (size_t)s[5], s[6] ? ROPE_LLAMA3 : ROPE_DEFAULT);
    test_rope_llama3_tables(128);
    test_rope_llama3_tables(64);
    // fused q|k|v (B, T, H, KVH, D, misalign, tables): GQA and MHA, T = 1, D = 2, the
    // vector path (D = 16, 64, 128) and the scalar one (D = 10, 24; a misaligned buffer)
    const int qkv[][7] = {{1, 1, 1, 1, 2, 0, 0},   {2, 5, 4, 2, 16, 0, 0}, {1, 7, 8, 8, 64, 0, 0},
                          {2, 3, 3, 1, 10, 0, 0},  {1, 9, 4, 1, 128, 0, 1}, {2, 4, 2, 2, 32, 2, 0},
                          {1, 5, 6, 3, 24, 0, 0},  {3, 1, 4, 2, 16, 0, 1}};
    for (auto &q : qkv) test_rope_qkv(q[0], q[1], q[2], q[3], q[4], (size_t)q[5], q[6] ? ROPE_LLAMA3 : ROPE_DEFAULT);
    // no tables (LoRA on q/k/v: the split and gather alone), vector and scalar paths
    test_rope_qkv(2, 5, 4, 2, 16, 0, ROPE_DEFAULT, true);
    test_rope_qkv(1, 3, 3, 1, 10, 2, ROPE_DEFAULT, true);
    // segment starts (--pack_attention per_game: positions restart at each game's BOS; a row
    // starting mid-game), vector and scalar paths, per batch row
    test_rope(2, 17, 3, 16, false, 0, ROPE_DEFAULT, "5,9|0,16");
    test_rope(2, 13, 2, 10, true, 0, ROPE_DEFAULT, "3|0,7");
    test_rope_qkv(2, 9, 4, 2, 16, 0, ROPE_DEFAULT, false, "0,4|2");
}

static void cases_attention() {
    // (B, T, H, KVH, D, qscale, misalign): GQA ratios 1, 2, 4 and 8; T = 1; T a multiple of
    // the 16-row tiles and of the tensor-core path's 64-row blocks, and one past (65, 17);
    // T = 100, 130: several blocks and partly empty warps; D = 1, 2, odd sizes, 127, 128 (the
    // maximum); D % 16 == 0 also runs the tensor-core forward; "peaky": q scaled by 4 so that
    // softmax rows are dominated by few keys and the running max moves; qscale 40: scores up
    // to ~150, where exp without the running max subtracted overflows fp32; misaligned
    // q/out/dout (element-wise loads on both paths). The tensor-core backward's tiles
    // (32-key dK/dV blocks, 16-query steps, 64-query dQ blocks): T = 1, 17, 63, 130 against
    // them, GQA 2 and 4 at D = 64 and 128, scores ~100 at D = 128, B = 3 for the chunked
    // workspace, misaligned dout (element-wise tile loads)
    const int att[][7] = {{1, 1, 1, 1, 8, 1, 0},    {2, 37, 4, 4, 16, 1, 0},  {1, 50, 8, 2, 24, 1, 0},
                          {1, 33, 8, 1, 64, 1, 0},  {2, 17, 4, 1, 40, 1, 0},  {1, 20, 2, 2, 128, 1, 0},
                          {1, 64, 8, 1, 7, 1, 0},   {1, 45, 4, 1, 32, 4, 0},  {1, 100, 4, 1, 48, 1, 0},
                          {2, 130, 8, 8, 16, 4, 0}, {1, 70, 8, 1, 128, 1, 0}, {1, 29, 4, 4, 32, 1, 2},
                          {1, 1, 2, 1, 16, 1, 0},   {3, 1, 8, 1, 128, 1, 0},  {1, 64, 2, 1, 32, 1, 0},
                          {1, 65, 2, 2, 16, 1, 0},  {1, 16, 4, 2, 16, 1, 0},  {1, 5, 2, 1, 1, 1, 0},
                          {1, 19, 2, 1, 2, 1, 0},   {1, 23, 2, 1, 127, 1, 0}, {1, 48, 4, 2, 64, 40, 0},
                          {2, 31, 2, 1, 16, 40, 0},  {1, 63, 4, 2, 64, 1, 0},  {2, 17, 8, 2, 128, 1, 0},
                          {1, 130, 4, 1, 64, 4, 0},  {3, 63, 4, 4, 16, 1, 0},  {1, 1, 4, 4, 64, 1, 0},
                          {1, 17, 2, 1, 128, 40, 0}, {1, 47, 2, 1, 64, 1, 2}};
    for (auto &s : att) test_attention(s[0], s[1], s[2], s[3], s[4], (float)s[5], (size_t)s[6]);
    // segment starts (--pack_attention per_game; `games` per batch row as segments_of reads
    // them): starts mid-tile (5, 9, 37), at a 16-key block's last key (15, 31, 47: a block
    // holding only that one visible key of a query), on tile and block boundaries (16, 64), a
    // one-token game (0, 1), a game starting at the last row (62, 16), rows starting mid-game
    // (the second row of the first case, an empty row spec), a single game; T = 1, 17, 63,
    // 100, 130 against the 16/32/64-row tiles; SIMT (D 8, 24) and tensor cores (D 16, 64), GQA
    // and a chunked dS workspace (B = 3)
    test_attention(3, 130, 2, 1, 16, 1, 0, "0,5,31,64,100|37|0");
    test_attention(2, 63, 4, 2, 64, 1, 0, "15,16,47|0,1,62");
    test_attention(2, 17, 2, 2, 8, 1, 0, "5,9,16|0");
    test_attention(1, 100, 2, 1, 24, 4, 0, "33,47,80");
    test_attention(2, 1, 2, 1, 16, 1, 0, "0|");
    test_attention(1, 70, 2, 2, 16, 1, 0, "9,31");
}

static void cases_lmhead_xent() {
    // (rows, V, kind, train): V = 1, odd sizes, V < and > one in-place stride (256 threads x 4
    // = 1024 values: 1023, 1024, 1025, 2051 = three strides), rows with large logits (peaky,
    // exp underflowing, one row's target dominant), the first and last ids as targets (V = 1:
    // both 0), a chunk with every row masked, evaluation (logits untouched), rows of negative
    // logits
    const int lmh[][4] = {{1, 1, LMH_NORMAL, 1},    {3, 5, LMH_NORMAL, 1},    {7, 97, LMH_NORMAL, 1},
                          {5, 1023, LMH_NORMAL, 1}, {4, 1024, LMH_NORMAL, 1}, {6, 1025, LMH_NORMAL, 1},
                          {9, 2051, LMH_NORMAL, 1}, {5, 300, LMH_LARGE, 1},   {3, 1031, LMH_LARGE, 1},
                          {4, 77, LMH_MASKED, 1},   {33, 77, LMH_NORMAL, 0},  {5, 1031, LMH_LARGE, 0},
                          {8, 1, LMH_EDGES, 1},     {8, 1025, LMH_EDGES, 1},  {6, 40, LMH_EDGES, 0},
                          {4, 30, LMH_MASKED, 0},   {5, 300, LMH_NEGATIVE, 1}, {3, 1031, LMH_NEGATIVE, 0}};
    for (auto &s : lmh) test_lmhead_rows(s[0], s[1], s[3] != 0, s[2]);
}

// element-wise sizes: 1, below and at one 8-element group, one group + 1, large
static const size_t EW_SIZES[] = {1, 7, 8, 9, 1000, 4099, 100000};
static size_t ew_size(size_t n) { return g_san && n > 20000 ? 20000 : n; }

static void cases_swiglu() {
    for (size_t n : EW_SIZES) test_swiglu(1, (int)ew_size(n), 0, false);
    test_swiglu(1, 1001, 2, false);
    test_swiglu(1, 999, 0, true);
    test_swiglu(1, 1003, 0, false, true);
    test_swiglu(1, 1000, 0, false, true);   // |gate| > 88 on the 16-byte path
    test_swiglu(1, 517, 2, true, true);
    // the fused (N, 2F) gate|up layout: 16-byte groups (F % 8 == 0), single elements (F odd,
    // or a misaligned buffer), several rows so that the row stride matters
    test_swiglu(7, 64, 0, false, false, true);
    test_swiglu(5, 13, 0, false, false, true);
    test_swiglu(9, 40, 2, false, true, true);
    test_swiglu(9, 40, 0, false, true, true);
    test_swiglu(300, 24, 0, false, false, true);
    test_swiglu(13, 16, 0, false, false, false);
}

static void cases_scale() {
    for (size_t n : EW_SIZES) test_scale(ew_size(n), 0, false);
    test_scale(1001, 2, true);
}

static void cases_accumulate() {
    for (int f32 = 0; f32 < 2; f32++) {
        for (size_t n : EW_SIZES) test_accumulate(ew_size(n), 0, f32);
        test_accumulate(1003, 2, f32);
    }
}

static void cases_cast() {
    for (size_t n : EW_SIZES) test_cast(ew_size(n), 0, false);
    test_cast(1001, 4, false);
    test_cast(64, 0, true);
    test_cast(13, 4, true);
}

// odd and aligned shapes, both formats, small and large magnitudes (scales far from 1 both
// ways), an all-zero tensor (amax 0: scale 1, zero codes), an infinity (amax inf: scale 1,
// everything saturates or rounds as is), each layout, a misaligned input
// (the transposed layout: 32 x 32 tiles, 32-bit stores when rows % 4 == 0 and out_t is aligned:
// rows and columns below, at and past a tile, one row, one column, both store widths (rows
// % 4 == 0, 1, 2, 3), a misaligned out_t with rows % 4 == 0)
static void cases_fp8_quantize() {
    const int shapes[][2] = {{1, 1},     {3, 5},   {7, 33},   {64, 64},  {129, 257}, {g_san ? 300 : 1000, 1001},
                             {17, 33},   {1, 300}, {300, 1},  {64, 48},  {36, 50},   {50, 36}, {96, 31}};
    for (int f = 0; f < FP8_FORMAT_COUNT; f++) {
        for (auto &sh : shapes) test_fp8_quantize(sh[0], sh[1], (fp8_format)f, 1.0f, false, 3, 0);
        test_fp8_quantize(64, 48, (fp8_format)f, 1.0f, false, 2, 2);
        test_fp8_quantize(33, 17, (fp8_format)f, 1e-3f, false, 1, 0);
        test_fp8_quantize(17, 33, (fp8_format)f, 3e3f, false, 2, 0);
        test_fp8_quantize(16, 48, (fp8_format)f, 0.0f, false, 3, 0);
        test_fp8_quantize(31, 9, (fp8_format)f, 1.0f, true, 3, 0);
        test_fp8_quantize(101, 13, (fp8_format)f, 2.0f, false, 3, 2);
        // amax ~1e-37: the format's max / amax is past FLT_MAX, the scale clamped (else inf, NaN codes)
        test_fp8_quantize(19, 16, (fp8_format)f, 1e-37f, false, 3, 0);
        // the amax given (fp8_cast): the same codes and stats
        test_fp8_quantize(36, 50, (fp8_format)f, 1.0f, false, 3, 0, true);
        test_fp8_quantize(17, 33, (fp8_format)f, 3e3f, false, 1, 0, true);
        test_fp8_quantize(31, 9, (fp8_format)f, 1.0f, true, 3, 0, true);
        test_fp8_quantize(16, 48, (fp8_format)f, 0.0f, false, 2, 0, true);
    }
}

// --fp8's producers' amax (fused_vs_unfused): rmsnorm on its 16-byte and scalar paths (C % 8,
// a misaligned buffer), one block per row; swiglu with several blocks, both layouts
static void cases_fp8_amax() {
    const int rms[][3] = {{3, 33, 0}, {17, 1000, 0}, {130, 40, 0}, {6, 64, 2}, {1, 1, 0}, {5, 300, 0}, {64, 48, 0}};
    for (auto &r : rms) test_rmsnorm_amax(r[0], r[1], (size_t)r[2]);
    test_swiglu_amax(1, 1001, 0, false);
    test_swiglu_amax(300, 17, 0, false);
    test_swiglu_amax(64, 48, 0, false);
    test_swiglu_amax(64, 48, 0, true);
    test_swiglu_amax(5, 13, 0, true);
    test_swiglu_amax(9, 40, 2, true);
}

static void cases_adamw() {
    const size_t aw[] = {1, 3, 4, 5, 1025, 5000, g_san ? 20000u : 100000u};
    for (size_t n : aw) test_adamw(n, 0, true);
    test_adamw(1001, 4, true);
    test_adamw(333, 0, false);
    test_adamw(1, 0, true, GRAD_ZERO);
    test_adamw(5, 0, true, GRAD_ZERO);
    test_adamw(1003, 0, true, GRAD_MIXED);
    test_adamw(1001, 4, true, GRAD_MIXED);
    test_adamw(64, 0, false, GRAD_MIXED);
    const size_t awb[] = {1, 3, 4, 5, 7, 1025, 4099, g_san ? 20000u : 100003u};
    for (size_t n : awb) test_adamw_bf16_moments(n, 0, GRAD_RANDOM);
    test_adamw_bf16_moments(1001, 2, GRAD_RANDOM);
    test_adamw_bf16_moments(1003, 0, GRAD_MIXED);
    test_adamw_bf16_moments(1029, 0, GRAD_RANDOM, (1ull << 32) - 500);
}

static void cases_sum_squares() {
    const size_t ss[] = {1, 3, 4, 5, 1000, 8193, g_san ? 50000u : 300000u};
    for (size_t n : ss) test_sum_squares(n, 0);
    test_sum_squares(8191, 4);
    test_sum_squares(1001, 0, true);
    test_sum_squares(70001, 4, true);
}

// odd sizes from one element to several blocks of partials (8192 elements each), aligned and
// not, wide magnitudes, a NaN or an infinity in the slice
static void cases_sum_squares_accumulate() {
    const size_t ns[] = {1, 2, 3, 5, 7, 63, 1001, 8191, 8193, 24577, g_san ? 30001u : 70001u};
    for (size_t n : ns) test_sum_squares_accumulate(n, 0, false);
    test_sum_squares_accumulate(8193, 4, false);
    test_sum_squares_accumulate(70001, 4, true);
    test_sum_squares_accumulate(1, 0, false, 1);
    test_sum_squares_accumulate(70001, 4, false, 1);
    test_sum_squares_accumulate(3, 0, false, 2);
    test_sum_squares_accumulate(8193, 0, true, 2);
}

// one row, below / at / above one 1024-row tile, several tiles with a partial last one (odd
// sizes); none, some and every row ignored
static void cases_loss_accumulate() {
    const int sizes[] = {1, 7, 1023, 1024, 1025, 4099, g_san ? 20001 : 70001};
    for (int n : sizes) test_loss_accumulate(n, 0.3);
    test_loss_accumulate(3001, 0.0);
    test_loss_accumulate(2049, 1.0);
    test_loss_accumulate(5, 1.0);
}

struct Group { const char *name; void (*run)(); };
static const Group GROUPS[] = {
    {"embedding", cases_embedding},     {"rmsnorm", cases_rmsnorm}, {"rope", cases_rope},
    {"attention", cases_attention},     {"lmhead_xent", cases_lmhead_xent},
    {"swiglu", cases_swiglu},           {"accumulate", cases_accumulate},
    {"cast", cases_cast},               {"adamw", cases_adamw},     {"sum_squares", cases_sum_squares},
    {"scale", cases_scale},             {"loss_accumulate", cases_loss_accumulate},
    {"fp8_quantize", cases_fp8_quantize},  {"fp8_amax", cases_fp8_amax},
    {"sum_squares_accumulate", cases_sum_squares_accumulate}};

// ----------------------------------------------------------------------------

static double now() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#if defined(FT_TEST_GPU_MATH)
#define TEST_NAME "test_kernels_gpumath"
#else
#define TEST_NAME "test_kernels"
#endif

// test_kernels [OP...]: the cases of the named kernel files (kernels/OP.cu), all without
// arguments. Each group's inputs come from its own seed, so a case sees the same numbers
// whether it runs alone or with the others.
int main(int argc, char **argv) {
    alarm(600);
    const size_t ngroups = sizeof GROUPS / sizeof GROUPS[0];
    for (int a = 1; a < argc; a++) {
        bool known = false;
        for (size_t g = 0; g < ngroups; g++) known |= strcmp(argv[a], GROUPS[g].name) == 0;
        if (known) continue;
        fprintf(stderr, TEST_NAME ": unknown op '%s' (one of:", argv[a]);
        for (size_t g = 0; g < ngroups; g++) fprintf(stderr, " %s", GROUPS[g].name);
        fprintf(stderr, ")\n");
        return 2;
    }
#if defined(FT_TEST_GPU_MATH)
    if (!__builtin_cpu_supports("fma")) {
        // a line starting with "skip" (tests/lib.sh's skip_or_fail spelling): tests/run_all.sh
        // then takes the "0 passed, 0 failed" below for a skip, not a suite that ran nothing
        printf("skip: " TEST_NAME ": this CPU has no FMA instructions\n");
        TEST_SUMMARY(TEST_NAME);
    }
    printf(TEST_NAME ": kernels built with FMA contraction and the GPU's worst-case "
           "approximate math\n");
#else
    printf(TEST_NAME ": kernels built with exact host math (no FMA contraction)\n");
#endif
    CPU = backend_cpu();
    g_san = getenv("FT_SANITIZED") != nullptr;
    double t0 = now();
    printf("%-16s %-40s %-8s %10s %9s  %s\n", "op", "shape", "output", "nmse", "threshold",
           "result");
    for (size_t g = 0; g < ngroups; g++) {
        bool on = argc == 1;
        for (int a = 1; a < argc; a++) on |= strcmp(argv[a], GROUPS[g].name) == 0;
        if (!on) continue;
        g_rng = 0x243F6A8885A308D3ull;   // FNV-1a of the name, mixed into the seed
        for (const char *c = GROUPS[g].name; *c; c++) g_rng = (g_rng ^ (unsigned char)*c) * 0x100000001b3ull;
        GROUPS[g].run();
    }

    unsigned long long launches, blocks, switches;
    cuemu_stats(&launches, &blocks, &switches);
    printf(TEST_NAME ": worst NMSE/threshold %.3f; %llu launches, %llu blocks, %llu fiber "
           "switches in %.1f s\n", g_worst_ratio, launches, blocks, switches, now() - t0);
    TEST_SUMMARY(TEST_NAME);
}
