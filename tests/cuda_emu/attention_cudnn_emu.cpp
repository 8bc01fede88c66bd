// attention_cudnn_emu.cpp: the CPU stand-in of the cuDNN attention engine (src/attn_engine.h,
// attn_engine_*) for the emulated build (finetune_emu, test_backend_emu). Same signatures and
// layouts as src/attention_cudnn_graph.c: each call is queued on the emulated stream as one
// operation with its exact byte ranges (checked for ordering hazards like a kernel), and
// computes causal GQA attention in fp32 from the bf16 device buffers, writing bf16 outputs
// and the fp32 logsumexp (B, H, T). Its workspace mirrors the real graph's: the fp32 dQ
// accumulator (B, H, T, D) and the row sums of dO * O (B, H, T), both used here.
//
// TEST-ONLY fault injection (never in a real build: this file is linked only into emulated
// binaries), FT_TEST_CUDNN_FAULT=
//   plan      every plan build fails, as when cuDNN has no engine for the graph
//   mismatch  the forward scales scores by 1/D instead of 1/sqrt(D) (a wrong graph)
//   late_fwd  the startup check's plans build, every later forward plan fails (a shape no
//             engine supports, met only in training)
//   late_bwd  the same for backward plans: the forward runs on cuDNN, the backward does not
#include <dlfcn.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "cuda_emu_async.h"

extern "C" {
#include "attn_engine.h"
#include "common.h"
}

struct attn_graph {
    attn_key key;
    float scale;
};

static cudaStream_t g_stream;
static int g_open;

static const char *fault() {
    const char *e = getenv("FT_TEST_CUDNN_FAULT");
    return e ? e : "";
}

static float ld(const void *p, size_t i) { return __bfloat162float(((const __nv_bfloat16 *)p)[i]); }
static void st(void *p, size_t i, float v) { ((__nv_bfloat16 *)p)[i] = __float2bfloat16(v); }

// ----------------------------------------------------------------------------
// host math (fp32, one (batch, head) at a time)

struct dims {
    size_t B, T, H, KVH, D;
    size_t qi(size_t b, size_t t, size_t h, size_t d) const { return ((b * T + t) * H + h) * D + d; }
    size_t ki(size_t b, size_t t, size_t h, size_t d) const { return ((b * T + t) * KVH + h) * D + d; }
};
static dims dims_of(const attn_key &k) {
    return {(size_t)k.B, (size_t)k.T, (size_t)k.H, (size_t)k.KVH, (size_t)k.D};
}

// sc[j] = scale q_t . k_j for the keys j <= t the causal mask keeps
static void scores(const dims &s, const void *q, const void *k, size_t b, size_t h, size_t t, float scale, float *sc) {
    const size_t kh = h / (s.H / s.KVH);
    for (size_t j = 0; j <= t; j++) {
        float dot = 0;
        for (size_t d = 0; d < s.D; d++) dot += ld(q, s.qi(b, t, h, d)) * ld(k, s.ki(b, j, kh, d));
        sc[j] = scale * dot;
    }
}

static void fwd_run(const attn_graph g, void *out, float *lse, const void *q, const void *k, const void *v) {
    const dims s = dims_of(g.key);
    std::vector<float> p(s.T), o(s.D);
    for (size_t b = 0; b < s.B; b++)
        for (size_t h = 0; h < s.H; h++)
            for (size_t t = 0; t < s.T; t++) {
                scores(s, q, k, b, h, t, g.scale, p.data());
                float mx = -INFINITY;
                for (size_t j = 0; j <= t; j++) mx = fmaxf(mx, p[j]);
                double sum = 0;
                for (size_t j = 0; j <= t; j++) sum += exp((double)(p[j] - mx));
                const float L = mx + (float)log(sum);
                lse[(b * s.H + h) * s.T + t] = L;
                for (size_t j = 0; j <= t; j++) p[j] = expf(p[j] - L);
                const size_t kh = h / (s.H / s.KVH);
                for (size_t d = 0; d < s.D; d++) o[d] = 0;
                for (size_t j = 0; j <= t; j++)
                    for (size_t d = 0; d < s.D; d++) o[d] += p[j] * ld(v, s.ki(b, j, kh, d));
                for (size_t d = 0; d < s.D; d++) st(out, s.qi(b, t, h, d), o[d]);
            }
}

struct bwd_args {
    attn_graph g;
    void *dq, *dk, *dv;
    const void *dout, *out, *q, *k, *v;
    const float *lse;
    float *dq_acc, *rowsum;   // workspace: (B, H, T, D) and (B, H, T)
};

// dS_tj = P_tj (dO_t . V_j - rowsum_t); dQ += scale dS K, dK += scale dS^T Q, dV += P^T dO
static void bwd_run(const bwd_args &a) {
    const dims s = dims_of(a.g.key);
    std::vector<float> p(s.T), dk(s.B * s.T * s.KVH * s.D, 0.0f), dv(dk.size(), 0.0f);
    for (size_t b = 0; b < s.B; b++)
        for (size_t h = 0; h < s.H; h++) {
            const size_t kh = h / (s.H / s.KVH), bh = b * s.H + h;
            for (size_t t = 0; t < s.T; t++) {
                float rs = 0;
                for (size_t d = 0; d < s.D; d++) rs += ld(a.dout, s.qi(b, t, h, d)) * ld(a.out, s.qi(b, t, h, d));
                a.rowsum[bh * s.T + t] = rs;
                float *acc = a.dq_acc + (bh * s.T + t) * s.D;
                for (size_t d = 0; d < s.D; d++) acc[d] = 0;
                scores(s, a.q, a.k, b, h, t, a.g.scale, p.data());
                for (size_t j = 0; j <= t; j++) p[j] = expf(p[j] - a.lse[bh * s.T + t]);
                for (size_t j = 0; j <= t; j++) {
                    float dp = 0;
                    for (size_t d = 0; d < s.D; d++) dp += ld(a.dout, s.qi(b, t, h, d)) * ld(a.v, s.ki(b, j, kh, d));
                    const float ds = p[j] * (dp - rs) * a.g.scale;
                    for (size_t d = 0; d < s.D; d++) {
                        acc[d] += ds * ld(a.k, s.ki(b, j, kh, d));
                        dk[s.ki(b, j, kh, d)] += ds * ld(a.q, s.qi(b, t, h, d));
                        dv[s.ki(b, j, kh, d)] += p[j] * ld(a.dout, s.qi(b, t, h, d));
                    }
                }
                for (size_t d = 0; d < s.D; d++) st(a.dq, s.qi(b, t, h, d), acc[d]);
            }
        }
    for (size_t i = 0; i < dk.size(); i++) {
        st(a.dk, i, dk[i]);
        st(a.dv, i, dv[i]);
    }
}

// ----------------------------------------------------------------------------
// the engine interface

extern "C" {

// FT_EMU_CUDNN_VERSION (e.g. 91500: cuDNN 9.15.0) pretends to be another cuDNN, to test the
// front's version gate and the backend's fallback (tests/test_cuda_emu_attention.sh)
// the stand-in is part of the emulated executable: the file its code was loaded from
// the emulated engine is linked in, never a wheel's
const char *attn_engine_wheel_python(void) { return NULL; }

const char *attn_engine_library(void) {
    static char file[4096];
    Dl_info info;
    if (!file[0]) snprintf(file, sizeof file, "%s", dladdr((const void *)attn_engine_library, &info) && info.dli_fname
                                                        ? info.dli_fname : "?");
    return file;
}

int attn_engine_version(size_t *version) {
    const char *e = getenv("FT_EMU_CUDNN_VERSION");
    *version = e && *e ? (size_t)atoll(e) : 91900;
    return 0;
}

int attn_engine_open(void *stream) {
    g_stream = (cudaStream_t)stream;
    g_open = 1;
    return 0;
}

void attn_engine_close(void) {
    g_open = 0;
    g_stream = NULL;
}

int attn_engine_build(const attn_key *key, attn_graph **out, size_t *workspace) {
    *out = NULL;
    if (!g_open) return ft_error("cudnn attention (emulated): engine not open");
    static int builds[2];   // forward, backward plans built so far (the check builds one each)
    const int late = builds[key->bwd]++ > 0 && strcmp(fault(), key->bwd ? "late_bwd" : "late_fwd") == 0;
    if (strcmp(fault(), "plan") == 0 || late)
        return ft_error("cudnn attention: no engine supports the %s graph for B %d T %d H %d KVH %d D %d "
                        "(FT_TEST_CUDNN_FAULT=%s)", key->bwd ? "backward" : "forward", key->B, key->T, key->H,
                        key->KVH, key->D, fault());
    if (key->KVH < 1 || key->H % key->KVH != 0)
        return ft_error("cudnn attention: %d query heads are not a multiple of %d kv heads", key->H, key->KVH);
    const size_t rows = (size_t)key->B * key->H * key->T;
    attn_graph *g = (attn_graph *)malloc(sizeof *g);
    CHECK_ALLOC(g, sizeof *g);
    g->key = *key;
    g->scale = strcmp(fault(), "mismatch") == 0 ? 1.0f / (float)key->D : 1.0f / sqrtf((float)key->D);
    // the backward's workspace as the real graph lays it out (src/attention_cudnn_graph.c): the
    // fp32 dQ accumulator (B, H, T, D) and row sums (B, H, T); deterministic (key->det): the
    // row sums after the engine's bf16 dP (B, H, T, T), which this stand-in only reserves
    *workspace = !key->bwd ? 0 : key->det ? rows * (size_t)key->T * 2 + rows * sizeof(float)
                                          : rows * ((size_t)key->D + 1) * sizeof(float);
    *out = g;
    return 0;
}

int attn_engine_destroy(attn_graph *g) {
    free(g);
    return 0;
}

// (virtual clock) the forward's FLOPs as the estimate counts them (src/backend_count.c):
// Q K^T and P V over T / 2 keys on average; the backward's are PLAN_ATTN_BWD_TC times these
static double causal_flops(const dims &s) { return 4.0 * s.H * s.D * (s.T / 2.0) * s.B * s.T; }

int attn_engine_fwd(attn_graph *g, void *out, float *lse, const void *q, const void *k, const void *v, void *workspace) {
    (void)workspace;
    const dims s = dims_of(g->key);
    const size_t qb = s.B * s.T * s.H * s.D * 2, kb = s.B * s.T * s.KVH * s.D * 2;
    std::vector<cuemu::Access> acc = {{q, qb, cuemu::ACC_READ, false, true}, {k, kb, cuemu::ACC_READ, false, true},
                                      {v, kb, cuemu::ACC_READ, false, true}, {out, qb, cuemu::ACC_WRITE, false, true},
                                      {lse, s.B * s.H * s.T * sizeof(float), cuemu::ACC_WRITE, false, true}};
    const attn_graph gc = *g;
    if (cuemu::enqueue(g_stream, "cudnn attention forward (emulated)", acc,
                       [gc, out, lse, q, k, v]() { fwd_run(gc, out, lse, q, k, v); },
                       cuemu::vclock_price_attention(causal_flops(s))) != cudaSuccess)
        return ft_error("cudnn attention (emulated): enqueue of the forward failed");
    return 0;
}

int attn_engine_bwd(attn_graph *g, void *dq, void *dk, void *dv, const void *dout, const void *out, const float *lse,
                    const void *q, const void *k, const void *v, void *workspace) {
    const dims s = dims_of(g->key);
    const size_t qb = s.B * s.T * s.H * s.D * 2, kb = s.B * s.T * s.KVH * s.D * 2, rows = s.B * s.H * s.T;
    if (!workspace) return ft_error("cudnn attention (emulated): the backward needs its workspace");
    const size_t ws_bytes = g->key.det ? rows * s.T * 2 + rows * sizeof(float) : rows * (s.D + 1) * sizeof(float);
    // deterministic: the dQ accumulator is the stand-in's own (the real graph has none), the
    // row sums after the dP bytes
    float *own_acc = g->key.det ? (float *)malloc(rows * s.D * sizeof(float)) : nullptr;
    if (g->key.det) CHECK_ALLOC(own_acc, rows * s.D * sizeof(float));
    float *rowsum = g->key.det ? (float *)((char *)workspace + rows * s.T * 2) : (float *)workspace + rows * s.D;
    bwd_args a = {*g, dq, dk, dv, dout, out, q, k, v, lse, g->key.det ? own_acc : (float *)workspace, rowsum};
    std::vector<cuemu::Access> acc = {
        {q, qb, cuemu::ACC_READ, false, true},     {k, kb, cuemu::ACC_READ, false, true},
        {v, kb, cuemu::ACC_READ, false, true},     {out, qb, cuemu::ACC_READ, false, true},
        {dout, qb, cuemu::ACC_READ, false, true},  {lse, rows * sizeof(float), cuemu::ACC_READ, false, true},
        {dq, qb, cuemu::ACC_WRITE, false, true},   {dk, kb, cuemu::ACC_WRITE, false, true},
        {dv, kb, cuemu::ACC_WRITE, false, true},   {workspace, ws_bytes, cuemu::ACC_WRITE, false, true}};
    if (cuemu::enqueue(g_stream, "cudnn attention backward (emulated)", acc, [a, own_acc]() {
            bwd_run(a);
            free(own_acc);
        }, cuemu::vclock_price_attention(PLAN_ATTN_BWD_TC * causal_flops(s))) != cudaSuccess) {
        free(own_acc);
        return ft_error("cudnn attention (emulated): enqueue of the backward failed");
    }
    return 0;
}

}   // extern "C"
