// attention_cudnn.c: the front of cuDNN attention (see attention_cudnn.h): the plan cache, the
// per-call workspace, and the startup check against the native kernels. Engine-independent: the
// same object runs over the real cuDNN engine (src/attention_cudnn_graph.c) and over the CPU
// stand-in of the emulated build (tests/cuda_emu/attention_cudnn_emu.cpp).
#include "attention_cudnn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_engine.h"
#include "common.h"

// ----------------------------------------------------------------------------
// the plan cache

typedef struct {
    attn_key key;
    attn_graph *graph;
    size_t workspace;                   // device bytes one execution needs
    uint64_t last_use;                  // A.clock at its last lookup (LRU order)
} attn_plan;

static int g_det;   // --deterministic (kept across open / close)
static int g_limit = ATTN_CUDNN_PLANS;   // attn_cudnn_set_plan_limit (idem); below the default it
                                         // caps the cache, else the cache holds A.cap plans

void attn_cudnn_set_deterministic(int det) { g_det = det != 0; }
void attn_cudnn_set_plan_limit(int n) { g_limit = n < 1 ? 1 : n > ATTN_CUDNN_PLANS ? ATTN_CUDNN_PLANS : n; }

static struct {
    int open;
    void *(*alloc)(size_t);
    void (*release)(void *);
    attn_plan *plans;                   // A.cap slots (ATTN_CUDNN_PLANS, or what attn_cudnn_prepare needs)
    int n_plans, cap;
    uint64_t clock;
    long built, evictions;              // plans built and evicted since open
} A;

// Plans the cache holds now: a test's lower limit, else its capacity.
static int plan_limit(void) { return g_limit < ATTN_CUDNN_PLANS ? g_limit : A.cap; }

int attn_cudnn_open(void *stream, void *(*alloc)(size_t), void (*release)(void *)) {
    if (A.open) return ft_error("cudnn attention: already open");
    size_t v = 0;
    TRY(attn_engine_version(&v));
    if (v < ATTN_CUDNN_MIN_VERSION)
        return ft_error("cudnn attention: libcudnn %zu.%zu.%zu at run time, its graphs here need %d.%d or newer", v / 10000,
                        v / 100 % 100, v % 100, ATTN_CUDNN_MIN_VERSION / 10000, ATTN_CUDNN_MIN_VERSION / 100 % 100);
    if (!(A.plans = ft_malloc(ATTN_CUDNN_PLANS * sizeof *A.plans, "cudnn attention plan cache"))) return -1;
    if (attn_engine_open(stream) != 0) {
        free(A.plans);
        A.plans = NULL;
        return -1;
    }
    A.cap = ATTN_CUDNN_PLANS;
    A.open = 1;
    A.alloc = alloc;
    A.release = release;
    return 0;
}

void attn_cudnn_close(void) {
    for (int i = 0; i < A.n_plans; i++) (void)attn_engine_destroy(A.plans[i].graph);   // (the backend waited)
    attn_engine_close();
    free(A.plans);
    memset(&A, 0, sizeof A);
}

void attn_cudnn_stats(int *cached, long *evictions) {
    *cached = A.n_plans;
    *evictions = A.evictions;
}

void attn_cudnn_counts(long *built, long *evicted) {
    *built = A.built;
    *evicted = A.evictions;
}

// The cached plan of this key, built on a miss; a full cache evicts its least recently used
// plan (the cuDNN engine waits for the plan's queued work before destroying it).
static int plan_get(const attn_key *key, attn_plan **out) {
    if (!A.open) return ft_error("cudnn attention: not open");
    attn_plan *lru = NULL;
    A.clock++;
    for (int i = 0; i < A.n_plans; i++) {
        attn_plan *p = &A.plans[i];
        if (memcmp(&p->key, key, sizeof *key) == 0) {
            p->last_use = A.clock;
            *out = p;
            return 0;
        }
        if (!lru || p->last_use < lru->last_use) lru = p;
    }
    attn_plan fresh = {.key = *key, .last_use = A.clock};
    TRY(attn_engine_build(key, &fresh.graph, &fresh.workspace));
    const size_t bound = attn_cudnn_workspace_bound(key->B, key->T, key->H, key->KVH, key->D, key->det);
    if (fresh.workspace > bound) {
        (void)attn_engine_destroy(fresh.graph);   // never executed: no wait
        return ft_error("cudnn attention: the %s plan for B %d T %d H %d KVH %d D %d wants %zu bytes of workspace, "
                        "more than the %zu the memory plan reserves", key->bwd ? "backward" : "forward", key->B,
                        key->T, key->H, key->KVH, key->D, fresh.workspace, bound);
    }
    A.built++;
    attn_plan *slot = &A.plans[A.n_plans];
    if (A.n_plans >= plan_limit()) {
        slot = lru;
        if (attn_engine_destroy(slot->graph) != 0) {   // its queued work did not finish: keep it
            (void)attn_engine_destroy(fresh.graph);
            return -1;
        }
        A.evictions++;
    } else {
        A.n_plans++;
    }
    *slot = fresh;
    *out = slot;
    return 0;
}

// 1 when the cache holds a plan of this key.
static int plan_cached(const attn_key *key) {
    for (int i = 0; i < A.n_plans; i++)
        if (memcmp(&A.plans[i].key, key, sizeof *key) == 0) return 1;
    return 0;
}

int attn_cudnn_prepare(int B, const int *lens, int n, int H, int KVH, int D, int *built, int *grown) {
    *built = 0;
    *grown = 0;
    if (!A.open) return ft_error("cudnn attention: not open");
    int need = A.n_plans;
    for (int i = 0; i < n; i++)
        for (int bwd = 0; bwd < 2; bwd++) {
            const attn_key key = {B, lens[i], H, KVH, D, bwd, bwd ? g_det : 0};
            need += !plan_cached(&key);
        }
    if (need > plan_limit()) {   // (a test's lower limit rises too)
        if (need > A.cap) {
            attn_plan *more = realloc(A.plans, (size_t)need * sizeof *A.plans);
            if (!more) return ft_error("cudnn attention: out of host memory for a cache of %d plans", need);
            A.plans = more;
            A.cap = need;
        }
        if (g_limit < ATTN_CUDNN_PLANS) g_limit = need < ATTN_CUDNN_PLANS ? need : ATTN_CUDNN_PLANS;
        *grown = need;
    }
    const long before = A.built;
    for (int i = 0; i < n; i++)
        for (int bwd = 0; bwd < 2; bwd++) {
            const attn_key key = {B, lens[i], H, KVH, D, bwd, bwd ? g_det : 0};
            attn_plan *p = NULL;
            TRY(plan_get(&key, &p));
        }
    *built = (int)(A.built - before);
    return 0;
}

// Workspace of one call from the caller's allocator (NULL for 0 bytes). 0 / -1.
static int workspace_take(size_t bytes, void **ws) {
    *ws = NULL;
    if (bytes == 0) return 0;
    if (!(*ws = A.alloc(bytes))) return ft_error("cudnn attention: no room for %zu bytes of workspace", bytes);
    return 0;
}

int attn_cudnn_fwd(void *out, float *lse, const void *q, const void *k, const void *v, int B, int T, int H, int KVH,
                   int D) {
    const attn_key key = {B, T, H, KVH, D, 0, 0};
    attn_plan *p = NULL;
    void *ws = NULL;
    TRY(plan_get(&key, &p));
    TRY(workspace_take(p->workspace, &ws));
    const int rc = attn_engine_fwd(p->graph, out, lse, q, k, v, ws);
    if (ws) A.release(ws);   // stream-ordered: the next user of these bytes runs after this call
    return rc;
}

int attn_cudnn_bwd(void *dq, void *dk, void *dv, const void *dout, const void *out, const float *lse, const void *q,
                   const void *k, const void *v, int B, int T, int H, int KVH, int D) {
    const attn_key key = {B, T, H, KVH, D, 1, g_det};
    attn_plan *p = NULL;
    void *ws = NULL;
    TRY(plan_get(&key, &p));
    TRY(workspace_take(p->workspace, &ws));
    const int rc = attn_engine_bwd(p->graph, dq, dk, dv, dout, out, lse, q, k, v, ws);
    if (ws) A.release(ws);
    return rc;
}

// ----------------------------------------------------------------------------
// the startup check
//
// Threshold ATTN_CUDNN_CHECK_NMSE = 1e-4. Both paths read the same bf16 inputs and accumulate
// in fp32; their bf16 outputs are each rounded once (relative error <= u = 2^-8, NMSE <= u^2 =
// 1.5e-5 per side, the bound tests/cuda_emu/test_kernels.cpp derives). cuDNN also feeds P (and
// in the backward dP / dS) to its tensor-core matmuls as bf16: one more rounding of each
// operand, averaged over at least one key per row, NMSE <= u^2 more. Independent errors add:
// <= 3 u^2 = 4.6e-5; 1e-4 leaves a factor two of margin. lse is fp32 on both sides (far below).
// A wrong mask, scale, head mapping or layout gives NMSE of order 1e-2 to 1.

#define CHECK_B 2
#define CHECK_T 37
#define CHECK_H 4
#define CHECK_KVH 2
#define CHECK_D 64

enum { T_Q, T_K, T_V, T_DOUT, T_OUT, T_LSE, T_DQ, T_DK, T_DV, N_INPUTS = T_OUT, N_TENSORS = T_DV + 1 };
static const char *const TENSOR_NAMES[N_TENSORS] = {"q", "k", "v", "dout", "out", "lse", "dq", "dk", "dv"};

typedef struct {
    const backend *be;
    size_t n[N_TENSORS];
    void *dev[2][N_TENSORS];             // [0] native, [1] cudnn (inputs shared: [1] = [0])
} check_bufs;

static double nmse(const float *ref, const float *got, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? num / den : num;
}

// Allocate every tensor and upload random bf16 inputs in [-1, 1). 0 / -1.
static int check_alloc(check_bufs *c) {
    const size_t q = (size_t)CHECK_B * CHECK_T * CHECK_H * CHECK_D, kv = (size_t)CHECK_B * CHECK_T * CHECK_KVH * CHECK_D;
    const size_t sizes[N_TENSORS] = {q, kv, kv, q, q, (size_t)CHECK_B * CHECK_H * CHECK_T, q, kv, kv};
    memcpy(c->n, sizes, sizeof sizes);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int t = 0; t < N_TENSORS; t++) {
        const size_t esz = t == T_LSE ? sizeof(float) : sizeof(uint16_t);
        for (int w = 0; w < 2; w++) {
            if (w == 1 && t < N_INPUTS) { c->dev[1][t] = c->dev[0][t]; continue; }
            if (!(c->dev[w][t] = c->be->alloc(c->n[t] * esz))) return -1;
        }
        if (t >= N_INPUTS) continue;
        uint16_t *h = ft_malloc(c->n[t] * sizeof(uint16_t), "attention check input");
        if (!h) return -1;
        for (size_t i = 0; i < c->n[t]; i++) {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            h[i] = ft_f32_to_bf16((float)((s >> 40) * (1.0 / 8388608.0)) - 1.0f);
        }
        const int rc = c->be->copy_h2d(c->dev[0][t], h, c->n[t] * sizeof(uint16_t));
        free(h);
        TRY(rc);
    }
    return 0;
}

static void check_free(check_bufs *c) {
    for (int t = N_TENSORS - 1; t >= 0; t--) {
        if (c->dev[1][t] && t >= N_INPUTS) c->be->free(c->dev[1][t]);
        if (c->dev[0][t]) c->be->free(c->dev[0][t]);
    }
}

// One output tensor of both paths to fp32 on the host (*ref native, *got cudnn). 0 / -1.
static int check_download(const check_bufs *c, int t, float *ref, float *got) {
    const size_t n = c->n[t];
    if (t == T_LSE) {
        TRY(c->be->copy_d2h(ref, c->dev[0][t], n * sizeof(float)));
        return c->be->copy_d2h(got, c->dev[1][t], n * sizeof(float));
    }
    uint16_t *h = ft_malloc(2 * n * sizeof(uint16_t), "attention check output");
    if (!h) return -1;
    int rc = c->be->copy_d2h(h, c->dev[0][t], n * sizeof(uint16_t));
    if (rc == 0) rc = c->be->copy_d2h(h + n, c->dev[1][t], n * sizeof(uint16_t));
    for (size_t i = 0; rc == 0 && i < n; i++) {
        ref[i] = ft_bf16_to_f32(h[i]);
        got[i] = ft_bf16_to_f32(h[n + i]);
    }
    free(h);
    return rc;
}

// Both paths' forward and backward (each backward from its own forward's out and lse).
static int check_run(const check_bufs *c) {
    for (int w = 0; w < 2; w++) {
        void *const *d = c->dev[w];
        if (w == 0) {
            TRY(c->be->attention_fwd(d[T_OUT], d[T_LSE], d[T_Q], d[T_K], d[T_V], CHECK_B, CHECK_T, CHECK_H, CHECK_KVH,
                                     CHECK_D, NULL));
            TRY(c->be->attention_bwd(d[T_DQ], d[T_DK], d[T_DV], d[T_DOUT], d[T_OUT], d[T_LSE], d[T_Q], d[T_K], d[T_V],
                                     CHECK_B, CHECK_T, CHECK_H, CHECK_KVH, CHECK_D, NULL));
        } else {
            TRY(attn_cudnn_fwd(d[T_OUT], d[T_LSE], d[T_Q], d[T_K], d[T_V], CHECK_B, CHECK_T, CHECK_H, CHECK_KVH,
                               CHECK_D));
            TRY(attn_cudnn_bwd(d[T_DQ], d[T_DK], d[T_DV], d[T_DOUT], d[T_OUT], d[T_LSE], d[T_Q], d[T_K], d[T_V],
                               CHECK_B, CHECK_T, CHECK_H, CHECK_KVH, CHECK_D));
        }
    }
    return c->be->synchronize();
}

// Every output compared; -1 with ft_error naming the first one past the threshold.
static int check_compare(const check_bufs *c, double *worst) {
    const size_t most = c->n[T_Q];
    float *ref = ft_malloc(2 * most * sizeof(float), "attention check compare");
    if (!ref) return -1;
    float *got = ref + most;
    int rc = 0;
    for (int t = T_OUT; t < N_TENSORS && rc == 0; t++) {
        rc = check_download(c, t, ref, got);
        const double e = rc == 0 ? nmse(ref, got, c->n[t]) : 0;
        if (rc == 0 && e > *worst) *worst = e;
        if (rc == 0 && !(e <= ATTN_CUDNN_CHECK_NMSE))
            rc = ft_error("cudnn attention disagrees with the native kernels on %s (NMSE %.3g > %.0e; B %d T %d H %d "
                          "KVH %d D %d)", TENSOR_NAMES[t], e, ATTN_CUDNN_CHECK_NMSE, CHECK_B, CHECK_T, CHECK_H,
                          CHECK_KVH, CHECK_D);
    }
    free(ref);
    return rc;
}

int attn_cudnn_selfcheck(const backend *native, double *worst_nmse) {
    check_bufs c;
    memset(&c, 0, sizeof c);
    c.be = native;
    *worst_nmse = 0;
    int rc = check_alloc(&c);
    if (rc == 0) rc = check_run(&c);
    if (rc == 0) rc = check_compare(&c, worst_nmse);
    check_free(&c);
    return rc;
}
