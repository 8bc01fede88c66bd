// test_ops.c: central finite-difference checks of every CPU backend op's backward, on
// small random inputs of odd shapes, plus the ops' accumulate/overwrite contracts. Every op
// call's status is checked (OP(): a failing op fails its case, named), and invalid arguments
// must be refused with an error naming the op (check_op_errors).
//
// For each case the scalar objective is J = sum(out * R) with a fixed random R, so
// dJ/dout = R is what the backward receives. The analytic gradient of each input is
// compared with (J(x + e) - J(x - e)) / 2e at up to FD_SAMPLES coordinates per input, spread
// over the whole input (one in each of FD_SAMPLES equal strata of its elements, the last
// element always among them), so every attention tile and lm_head chunk holds some: a bug
// confined to a late tile or chunk passed 48 uniformly random coordinates. The ops with tiles
// or chunks (attention, lm_head) also have their full gradients compared with a textbook
// reference in double (check_attention_backward, check_lmhead_reference).
//
// Threshold (NMSE over sampled coordinates): J is accumulated in double from fp32 outputs,
// each with relative rounding ~6e-8; with |out|, |R| ~ 1 and n outputs the rounding noise
// in J is ~6e-8 * sqrt(n) <= 1e-5 (n <= 3e4), divided by 2e = 2e-2 -> ~5e-4 absolute on
// gradients of size ~1, i.e. NMSE <= ~2.5e-7; the O(e^2) truncation term adds ~1e-4
// relative (NMSE 1e-8). We allow 1e-5. A wrong backward (missing term, wrong sign, wrong
// index) produces NMSE of order 1e-2..1, far above it.
#include "backend.h"
#include "backend_cpu_internal.h"
#include "bf16_sr.h"
#include "common.h"
#include "model.h"
#include "test.h"

#define FD_EPS 1e-2f
#define FD_SAMPLES 48
#define FD_NMSE_MAX 1e-5

// ----------------------------------------------------------------------------
// deterministic random numbers

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rng_u32(void) { return test_rand_u32(&rng_state); }
static float rng_normal(void) { return test_rand_normal(&rng_state); }   // Irwin-Hall is enough here
static float *randn(size_t n, float scale) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) p[i] = scale * rng_normal();
    return p;
}
static float *filled(size_t n, float v) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) p[i] = v;
    return p;
}
static float *copy_of(const float *src, size_t n) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    memcpy(p, src, sizeof(float) * n);
    return p;
}

// ----------------------------------------------------------------------------
// op status: every backend op call goes through OP(be->op, args...), which logs a non-zero
// status (the first failing op of the case, its status and ft_error message); at the end of
// each case expect_ops_ok() fails the case when any op call failed, naming that op.

typedef struct {
    int failures;          // op calls that returned non-zero since the last expect_ops_ok
    const char *first_op;  // the first of them, as written ("be->matmul_fwd")
    int first_rc;
    char first_msg[256];   // its ft_error message
} op_log;
static op_log g_ops;

// rc of the op call `op`, logged in g_ops when non-zero (the error message is taken and cleared).
static int op_status(int rc, const char *op) {
    if (rc == 0) return 0;
    if (g_ops.failures++ == 0) {
        g_ops.first_op = op;
        g_ops.first_rc = rc;
        snprintf(g_ops.first_msg, sizeof g_ops.first_msg, "%s", ft_error_message());
    }
    ft_error_clear();
    return rc;
}
#define OP(fn, ...) op_status((fn)(__VA_ARGS__), #fn)

// One check for the op calls of case `name` since the last call: fails when any returned
// non-zero, naming the first; then clears the log.
static void expect_ops_ok(const char *name) {
    EXPECT(g_ops.failures == 0, "%s: %d backend op call%s failed, the first %s with status %d: %s", name,
           g_ops.failures, g_ops.failures == 1 ? "" : "s", g_ops.first_op ? g_ops.first_op : "?", g_ops.first_rc,
           g_ops.first_msg);
    memset(&g_ops, 0, sizeof g_ops);
}

// Coordinate k of `samples` FD samples of an input of n elements: all of them when n is small,
// else one at random in each of `samples` equal strata, the last sample the last element (the
// last row of a tiled or chunked input: a partial tile or chunk is always at the end).
static size_t fd_coord(size_t k, size_t samples, size_t n) {
    if (samples == n) return k;
    if (k + 1 == samples) return n - 1;
    const size_t lo = k * n / samples, hi = (k + 1) * n / samples;
    return lo + rng_u32() % (hi - lo);
}

// ----------------------------------------------------------------------------
// cases

typedef enum { OP_EMBEDDING, OP_RMSNORM, OP_ROPE, OP_ROPE_QKV, OP_MATMUL, OP_ATTENTION, OP_SWIGLU, OP_LMHEAD } op_kind;

typedef struct {
    op_kind op;
    const char *name;
    int B, T, H, KVH, D;   // attention / rope shapes (N = B*T)
    int N, C, V, F;        // rows, width, vocab / out-width
    int chunk, chunks;     // lm_head: rows per chunk (0: the trainer's, model_lmhead_chunk_rows(N,
                           // V)) and how many chunks that makes (checked, so the case keeps them)
    const char *games;     // rope / attention with segment starts (--pack_attention per_game):
                           // each batch row's game starts, rows separated by '|' (the last
                           // repeats), e.g. "0,5|9" (row 1 starts mid-game); NULL = no segments
} op_case;

static const op_case cases[] = {
    {OP_EMBEDDING, "embedding 7x5 V11", .N = 7, .C = 5, .V = 11},
    {OP_EMBEDDING, "embedding 70x13 V3 (repeats)", .N = 70, .C = 13, .V = 3},
    {OP_RMSNORM, "rmsnorm 5x13", .N = 5, .C = 13},
    {OP_RMSNORM, "rmsnorm 3x130", .N = 3, .C = 130},
    {OP_ROPE, "rope B2 T7 H3 D8", .B = 2, .T = 7, .H = 3, .D = 8},
    {OP_ROPE, "rope B1 T13 H1 D2", .B = 1, .T = 13, .H = 1, .D = 2},
    // the fused q|k|v projection split into q, k (rotated) and v (copied): GQA and MHA
    {OP_ROPE_QKV, "rope_qkv B2 T5 H4 KV2 D6", .B = 2, .T = 5, .H = 4, .KVH = 2, .D = 6},
    {OP_ROPE_QKV, "rope_qkv B1 T3 H1 KV1 D2", .B = 1, .T = 3, .H = 1, .KVH = 1, .D = 2},
    {OP_MATMUL, "matmul 5x7->11", .N = 5, .C = 7, .F = 11},
    {OP_MATMUL, "matmul 1x33->3", .N = 1, .C = 33, .F = 3},
    {OP_ATTENTION, "attention MHA B2 T7 H3 D8", .B = 2, .T = 7, .H = 3, .KVH = 3, .D = 8},
    {OP_ATTENTION, "attention GQA4 B1 T13 H8 KV2 D4", .B = 1, .T = 13, .H = 8, .KVH = 2, .D = 4},
    {OP_ATTENTION, "attention GQA8 B2 T5 H8 KV1 D6", .B = 2, .T = 5, .H = 8, .KVH = 1, .D = 6},
    {OP_ATTENTION, "attention T1 B3 H2 KV1 D4", .B = 3, .T = 1, .H = 2, .KVH = 1, .D = 4},
    // longer than one CPU tile of 64 query rows: off-diagonal key blocks, a partial last tile
    // (T130: tiles of 64, 64, 2 rows; T197: 64, 64, 64, 5 rows over 2 batches and a GQA group)
    {OP_ATTENTION, "attention tiles B1 T130 H2 KV1 D4", .B = 1, .T = 130, .H = 2, .KVH = 1, .D = 4},
    {OP_ATTENTION, "attention tiles MHA B2 T70 H2 KV2 D6", .B = 2, .T = 70, .H = 2, .KVH = 2, .D = 6},
    {OP_ATTENTION, "attention tiles B2 T197 H2 KV1 D3", .B = 2, .T = 197, .H = 2, .KVH = 1, .D = 3},
    // segment starts (packed games, each attending to itself; RoPE positions restart): a row
    // starting mid-game, a one-token game, starts mid-tile and at a tile boundary (CPU tiles of
    // 64 rows), a single game, a game starting at the last row, T = 1
    {OP_ROPE, "rope games B2 T17 H3 D8", .B = 2, .T = 17, .H = 3, .D = 8, .games = "5,9|0,16"},
    {OP_ROPE_QKV, "rope_qkv games B2 T13 H4 KV2 D6", .B = 2, .T = 13, .H = 4, .KVH = 2, .D = 6, .games = "0,7|3"},
    {OP_ATTENTION, "attention games B3 T130 H2 KV1 D4", .B = 3, .T = 130, .H = 2, .KVH = 1, .D = 4,
     .games = "0,1,64,100|37|0"},
    {OP_ATTENTION, "attention games B2 T17 H4 KV2 D6", .B = 2, .T = 17, .H = 4, .KVH = 2, .D = 6, .games = "5,9,16|0,16"},
    {OP_ATTENTION, "attention games B1 T63 MHA H2 D8", .B = 1, .T = 63, .H = 2, .KVH = 2, .D = 8, .games = "0,20,21,50"},
    {OP_ATTENTION, "attention games T1 B2 H2 KV1 D4", .B = 2, .T = 1, .H = 2, .KVH = 1, .D = 4, .games = "0|"},
    {OP_SWIGLU, "swiglu 37", .N = 37, .F = 1},
    {OP_SWIGLU, "swiglu 4x9 separate", .N = 4, .F = 9},
    // .C = 1: gate and up are the halves of one (N, 2F) buffer (the fused gate|up GEMM output)
    {OP_SWIGLU, "swiglu 5x6 fused (N,2F)", .N = 5, .F = 6, .C = 1},
    {OP_LMHEAD, "lmhead_xent 5x7 V11", .N = 5, .C = 7, .V = 11, .chunks = 1},
    {OP_LMHEAD, "lmhead_xent 131x6 V5 (128+3)", .N = 131, .C = 6, .V = 5, .chunk = 128, .chunks = 2},
    {OP_LMHEAD, "lmhead_xent 131x6 V5 (48+48+35)", .N = 131, .C = 6, .V = 5, .chunk = 48, .chunks = 3},
    // the trainer's chunk (model_lmhead_chunk_rows: LMHEAD_CHUNK_ROWS_MAX = 2048 rows at this
    // vocab), so the rows past 2048 are a second chunk as in a real step of B*T > 2048
    {OP_LMHEAD, "lmhead_xent 2053x3 V7 (2048+5)", .N = 2053, .C = 3, .V = 7, .chunks = 2},
};

// Inputs of one case (fp32 host buffers; the CPU backend works on them directly).
typedef struct {
    const op_case *c;
    const backend *be;
    int n_in;
    float *in[3];       // differentiable inputs
    size_t in_n[3];
    const char *in_name[3];
    float *grad[3];     // analytic gradients
    int32_t *tokens;    // embedding tokens / lmhead targets
    float *cos, *sin;   // rope tables
    int32_t *seg;       // (B, T) segment starts of c->games, or NULL
    float *R;           // dJ/dout
    size_t out_n;
    int chunk_rows;     // lm_head: rows per chunk (the case's, or the trainer's)
} state;

static double objective(state *s) {
    const op_case *c = s->c;
    const backend *be = s->be;
    float *out = malloc(sizeof(float) * s->out_n);
    double J = 0;
    switch (c->op) {
    case OP_EMBEDDING: OP(be->embedding_fwd, out, s->tokens, s->in[0], c->N, c->C, c->V); break;
    case OP_RMSNORM: {
        float *rstd = malloc(sizeof(float) * c->N);
        OP(be->rmsnorm_fwd, out, rstd, NULL, s->in[0], s->in[1], c->N, c->C, 1e-5f);
        free(rstd);
        break;
    }
    case OP_ROPE: OP(be->rope_fwd, out, s->in[0], s->cos, s->sin, c->B, c->T, c->H, c->D, s->seg); break;
    case OP_ROPE_QKV: {   // out = [q (B,T,H,D) | k (B,T,KVH,D) | v (B,T,KVH,D)]
        size_t nq = (size_t)c->B * c->T * c->H * c->D, nkv = (size_t)c->B * c->T * c->KVH * c->D;
        OP(be->rope_qkv_fwd, out, out + nq, out + nq + nkv, s->in[0], s->cos, s->sin, c->B, c->T, c->H, c->KVH, c->D, s->seg);
        break;
    }
    case OP_MATMUL: OP(be->matmul_fwd, out, s->in[0], s->in[1], NULL, c->N, c->C, c->F); break;
    case OP_ATTENTION: {
        float *lse = malloc(sizeof(float) * c->B * c->H * c->T);
        OP(be->attention_fwd, out, lse, s->in[0], s->in[1], s->in[2], c->B, c->T, c->H, c->KVH, c->D, s->seg);
        free(lse);
        break;
    }
    case OP_SWIGLU:
        if (c->C) OP(be->swiglu_fwd, out, NULL, s->in[0], s->in[0] + c->F, c->N, c->F, 2 * c->F);
        else OP(be->swiglu_fwd, out, NULL, s->in[0], s->in[1], c->N, c->F, c->F);
        break;
    case OP_LMHEAD: {
        float *ws = malloc(sizeof(float) * s->chunk_rows * c->V);
        OP(be->lmhead_xent, out, NULL, NULL, ST_F32, s->in[0], s->in[1], s->tokens, c->N, c->C, c->V, 1.0f, s->chunk_rows,
                        ws, NULL);
        free(ws);
        break;
    }
    }
    for (size_t i = 0; i < s->out_n; i++) J += (double)out[i] * s->R[i];
    free(out);
    return J;
}

// Runs the backward into s->grad. "+=" outputs start from `base` values that are
// subtracted again afterwards (checks accumulation); overwritten outputs start as NaN.
static void analytic(state *s, int *contract_ok) {
    const op_case *c = s->c;
    const backend *be = s->be;
    float *base[3] = {0};
    *contract_ok = 1;
    switch (c->op) {
    case OP_EMBEDDING:
        base[0] = randn(s->in_n[0], 1.0f);
        s->grad[0] = copy_of(base[0], s->in_n[0]);
        OP(be->embedding_bwd, s->grad[0], ST_F32, s->R, s->tokens, c->N, c->C, c->V);
        break;
    case OP_RMSNORM: {
        float *rstd = malloc(sizeof(float) * c->N), *tmp = malloc(sizeof(float) * s->out_n);
        OP(be->rmsnorm_fwd, tmp, rstd, NULL, s->in[0], s->in[1], c->N, c->C, 1e-5f);
        base[0] = randn(s->in_n[0], 1.0f);
        base[1] = randn(s->in_n[1], 1.0f);
        s->grad[0] = copy_of(base[0], s->in_n[0]);
        s->grad[1] = copy_of(base[1], s->in_n[1]);
        OP(be->rmsnorm_bwd, s->grad[0], s->grad[1], ST_F32, s->R, s->in[0], s->in[1], rstd, c->N, c->C);
        free(rstd); free(tmp);
        break;
    }
    case OP_ROPE:
        s->grad[0] = filled(s->in_n[0], NAN);
        OP(be->rope_bwd, s->grad[0], s->R, s->cos, s->sin, c->B, c->T, c->H, c->D, s->seg);
        break;
    case OP_ROPE_QKV: {
        size_t nq = (size_t)c->B * c->T * c->H * c->D, nkv = (size_t)c->B * c->T * c->KVH * c->D;
        s->grad[0] = filled(s->in_n[0], NAN);
        OP(be->rope_qkv_bwd, s->grad[0], s->R, s->R + nq, s->R + nq + nkv, s->cos, s->sin, c->B, c->T, c->H, c->KVH,
                         c->D, s->seg);
        break;
    }
    case OP_MATMUL:
        s->grad[0] = filled(s->in_n[0], NAN);
        base[1] = randn(s->in_n[1], 1.0f);
        s->grad[1] = copy_of(base[1], s->in_n[1]);
        OP(be->matmul_bwd, s->grad[0], s->grad[1], ST_F32, s->R, s->in[0], s->in[1], c->N, c->C, c->F, 0, 1);
        {   // accumulate_dinp = 1 must add to what is there; accumulate_dw = 0 must overwrite
            // (a NaN start stays NaN if any element is only added into)
            float *acc = filled(s->in_n[0], 1.0f), *dw = filled(s->in_n[1], NAN);
            OP(be->matmul_bwd, acc, dw, ST_F32, s->R, s->in[0], s->in[1], c->N, c->C, c->F, 1, 0);
            for (size_t i = 0; i < s->in_n[0]; i++)
                if (fabsf(acc[i] - 1.0f - s->grad[0][i]) > 1e-5f * (1 + fabsf(s->grad[0][i]))) *contract_ok = 0;
            for (size_t i = 0; i < s->in_n[1]; i++) {
                const float g = s->grad[1][i] - base[1][i];
                if (!(fabsf(dw[i] - g) <= 1e-5f * (1 + fabsf(g)))) *contract_ok = 0;
            }
            free(acc); free(dw);
        }
        break;
    case OP_ATTENTION: {
        float *lse = malloc(sizeof(float) * c->B * c->H * c->T), *out = malloc(sizeof(float) * s->out_n);
        OP(be->attention_fwd, out, lse, s->in[0], s->in[1], s->in[2], c->B, c->T, c->H, c->KVH, c->D, s->seg);
        for (int i = 0; i < 3; i++) s->grad[i] = filled(s->in_n[i], NAN);
        OP(be->attention_bwd, s->grad[0], s->grad[1], s->grad[2], s->R, out, lse, s->in[0], s->in[1],
                          s->in[2], c->B, c->T, c->H, c->KVH, c->D, s->seg);
        free(lse); free(out);
        break;
    }
    case OP_SWIGLU:
        for (int i = 0; i < s->n_in; i++) s->grad[i] = filled(s->in_n[i], NAN);
        if (c->C)
            OP(be->swiglu_bwd, s->grad[0], s->grad[0] + c->F, s->R, s->in[0], s->in[0] + c->F, c->N, c->F, 2 * c->F);
        else
            OP(be->swiglu_bwd, s->grad[0], s->grad[1], s->R, s->in[0], s->in[1], c->N, c->F, c->F);
        break;
    case OP_LMHEAD: {
        // J = sum(losses * R) is only linear in the losses when R is constant per row;
        // the op takes one scalar dloss, so R is set to that constant in setup()
        float *ws = malloc(sizeof(float) * s->chunk_rows * c->V), *losses = malloc(sizeof(float) * c->N);
        s->grad[0] = filled(s->in_n[0], NAN);
        base[1] = randn(s->in_n[1], 1.0f);
        s->grad[1] = copy_of(base[1], s->in_n[1]);
        OP(be->lmhead_xent, losses, s->grad[0], s->grad[1], ST_F32, s->in[0], s->in[1], s->tokens, c->N, c->C,
                        c->V, s->R[0], s->chunk_rows, ws, NULL);
        free(ws); free(losses);
        break;
    }
    }
    for (int i = 0; i < s->n_in; i++) {
        if (!base[i]) continue;
        for (size_t j = 0; j < s->in_n[i]; j++) s->grad[i][j] -= base[i][j];
        free(base[i]);
    }
}

// (B, T) segment starts of a case's `games` (test_games_tokens)
static int32_t *segments_of(const char *games, int B, int T) {
    int32_t *tok = malloc(sizeof(int32_t) * B * T), *seg = malloc(sizeof(int32_t) * B * T);
    test_games_tokens(games, B, T, tok);
    model_segment_starts(tok, B, T, 1, seg);
    free(tok);
    return seg;
}

static void setup(state *s, const op_case *c, const backend *be) {
    memset(s, 0, sizeof *s);
    s->c = c;
    s->be = be;
    if (c->games) s->seg = segments_of(c->games, c->B, c->T);
    size_t N = (size_t)c->N;
    switch (c->op) {
    case OP_EMBEDDING:
        s->n_in = 1; s->in_n[0] = (size_t)c->V * c->C; s->in_name[0] = "wte";
        s->tokens = malloc(sizeof(int32_t) * N);
        for (size_t i = 0; i < N; i++) s->tokens[i] = (int32_t)(rng_u32() % c->V);
        s->out_n = N * c->C;
        break;
    case OP_RMSNORM:
        s->n_in = 2; s->in_n[0] = N * c->C; s->in_n[1] = c->C;
        s->in_name[0] = "inp"; s->in_name[1] = "weight";
        s->out_n = N * c->C;
        break;
    case OP_ROPE:
    case OP_ROPE_QKV: {
        int half = c->D / 2;
        const int heads = c->op == OP_ROPE ? c->H : c->H + 2 * c->KVH;   // qkv: (B, T, (H + 2 KVH) D)
        s->n_in = 1; s->in_n[0] = (size_t)c->B * c->T * heads * c->D; s->in_name[0] = c->op == OP_ROPE ? "inp" : "qkv";
        s->cos = malloc(sizeof(float) * c->T * half); s->sin = malloc(sizeof(float) * c->T * half);
        for (int t = 0; t < c->T; t++)
            for (int i = 0; i < half; i++) {
                double a = t * pow(10000.0, -2.0 * i / c->D);
                s->cos[t * half + i] = (float)cos(a); s->sin[t * half + i] = (float)sin(a);
            }
        s->out_n = s->in_n[0];
        break;
    }
    case OP_MATMUL:
        s->n_in = 2; s->in_n[0] = N * c->C; s->in_n[1] = (size_t)c->F * c->C;
        s->in_name[0] = "inp"; s->in_name[1] = "weight";
        s->out_n = N * c->F;
        break;
    case OP_ATTENTION: {
        size_t nq = (size_t)c->B * c->T * c->H * c->D, nkv = (size_t)c->B * c->T * c->KVH * c->D;
        s->n_in = 3; s->in_n[0] = nq; s->in_n[1] = nkv; s->in_n[2] = nkv;
        s->in_name[0] = "q"; s->in_name[1] = "k"; s->in_name[2] = "v";
        s->out_n = nq;
        break;
    }
    case OP_SWIGLU:
        if (c->C) { s->n_in = 1; s->in_n[0] = 2 * N * c->F; s->in_name[0] = "gate|up"; }
        else { s->n_in = 2; s->in_n[0] = s->in_n[1] = N * c->F; s->in_name[0] = "gate"; s->in_name[1] = "up"; }
        s->out_n = N * c->F;
        break;
    case OP_LMHEAD:
        s->n_in = 2; s->in_n[0] = N * c->C; s->in_n[1] = (size_t)c->V * c->C;
        s->in_name[0] = "x"; s->in_name[1] = "weight";
        s->tokens = malloc(sizeof(int32_t) * N);
        for (size_t i = 0; i < N; i++) s->tokens[i] = (i % 4 == 3) ? -100 : (int32_t)(rng_u32() % c->V);
        s->out_n = N;
        s->chunk_rows = c->chunk ? c->chunk : model_lmhead_chunk_rows(c->N, c->V);
        break;
    }
    for (int i = 0; i < s->n_in; i++) s->in[i] = randn(s->in_n[i], 1.0f);
    s->R = randn(s->out_n, 1.0f);
    if (c->op == OP_LMHEAD)
        for (size_t i = 0; i < s->out_n; i++) s->R[i] = 0.37f;  // one dloss for every row
}

static void teardown(state *s) {
    for (int i = 0; i < s->n_in; i++) { free(s->in[i]); free(s->grad[i]); }
    free(s->tokens); free(s->cos); free(s->sin); free(s->R); free(s->seg);
}

// matmul_fwd's residual: out = x W^T + r with r a separate buffer, and with r = out (+=),
// against the plain product plus r. fp32: the sum x W^T + r rounds once more or in another
// order (beta = 1 accumulates r into the K blocks' partial sums), so 1e-6 relative per
// element (a few ulps of |x W^T| + |r| ~ 10 here); a dropped or doubled residual is O(1) off.
static void check_matmul_residual(const backend *be, const state *s) {
    const op_case *c = s->c;
    const size_t n = s->out_n;
    float *plain = malloc(sizeof(float) * n), *res = randn(n, 1.0f), *sep = malloc(sizeof(float) * n);
    float *inplace = copy_of(res, n);
    OP(be->matmul_fwd, plain, s->in[0], s->in[1], NULL, c->N, c->C, c->F);
    OP(be->matmul_fwd, sep, s->in[0], s->in[1], res, c->N, c->C, c->F);
    OP(be->matmul_fwd, inplace, s->in[0], s->in[1], inplace, c->N, c->C, c->F);
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        const float want = plain[i] + res[i], tol = 1e-6f * (fabsf(plain[i]) + fabsf(res[i]) + 1.0f);
        ok &= fabsf(sep[i] - want) <= tol && fabsf(inplace[i] - want) <= tol;
    }
    printf("%-36s %-7s %12s %10s %s\n", c->name, "resid", "x W^T + r", "", ok ? "pass" : "FAIL");
    EXPECT(ok, "%s: matmul_fwd with a residual (separate or in place) is not x W^T + r", c->name);
    free(plain); free(res); free(sep); free(inplace);
}

// rope_qkv_fwd against rope_fwd on q, k gathered from the fused rows, and v copied: bitwise
// the same (the same products per element), so a wrong head offset or row stride shows.
// Without tables (NULL) the split alone, and rope_qkv_bwd's gather alone undoes it.
static void check_rope_qkv_split(const backend *be, const state *s) {
    const op_case *c = s->c;
    const int N = c->B * c->T, QD = c->H * c->D, KVD = c->KVH * c->D, W = QD + 2 * KVD;
    float *got = malloc(sizeof(float) * s->out_n), *want = malloc(sizeof(float) * s->out_n);
    float *q = want, *k = want + (size_t)N * QD, *v = k + (size_t)N * KVD;
    for (int r = 0; r < N; r++) {
        memcpy(q + (size_t)r * QD, s->in[0] + (size_t)r * W, sizeof(float) * QD);
        memcpy(k + (size_t)r * KVD, s->in[0] + (size_t)r * W + QD, sizeof(float) * KVD);
        memcpy(v + (size_t)r * KVD, s->in[0] + (size_t)r * W + QD + KVD, sizeof(float) * KVD);
    }
    // without tables: the split alone
    OP(be->rope_qkv_fwd, got, got + (size_t)N * QD, got + (size_t)N * (QD + KVD), s->in[0], NULL, NULL, c->B, c->T,
                     c->H, c->KVH, c->D, NULL);
    int ok = memcmp(got, want, sizeof(float) * s->out_n) == 0;
    // and back: the gather alone restores the fused rows
    float *back = malloc(sizeof(float) * s->out_n);
    OP(be->rope_qkv_bwd, back, got, got + (size_t)N * QD, got + (size_t)N * (QD + KVD), NULL, NULL, c->B, c->T, c->H,
                     c->KVH, c->D, NULL);
    ok &= memcmp(back, s->in[0], sizeof(float) * s->out_n) == 0;
    free(back);
    OP(be->rope_fwd, q, q, s->cos, s->sin, c->B, c->T, c->H, c->D, NULL);
    OP(be->rope_fwd, k, k, s->cos, s->sin, c->B, c->T, c->KVH, c->D, NULL);
    OP(be->rope_qkv_fwd, got, got + (size_t)N * QD, got + (size_t)N * (QD + KVD), s->in[0], s->cos, s->sin, c->B, c->T,
                     c->H, c->KVH, c->D, NULL);
    ok &= memcmp(got, want, sizeof(float) * s->out_n) == 0;
    printf("%-36s %-7s %12s %10s %s\n", c->name, "split", "bitwise", "", ok ? "pass" : "FAIL");
    EXPECT(ok, "%s: rope_qkv_fwd differs from rope_fwd on the gathered q, k and the copied v", c->name);
    free(got); free(want);
}

// rope_fwd / rope_qkv_fwd with segment starts against the rotation written out: row t of
// batch b rotated by the angles of position t - seg[b, t] (the tables' row of that position);
// bitwise (the same products). A row left at position t shows as an O(1) difference.
static void check_rope_segments(const backend *be, const state *s) {
    const op_case *c = s->c;
    const int half = c->D / 2, heads = c->op == OP_ROPE ? c->H : c->H + 2 * c->KVH;
    const int rotated = c->op == OP_ROPE ? c->H : c->H + c->KVH;   // v is copied
    const size_t nq = (size_t)c->B * c->T * c->H * c->D, nkv = (size_t)c->B * c->T * c->KVH * c->D;
    float *got = malloc(sizeof(float) * s->out_n);
    if (c->op == OP_ROPE) OP(be->rope_fwd, got, s->in[0], s->cos, s->sin, c->B, c->T, c->H, c->D, s->seg);
    else OP(be->rope_qkv_fwd, got, got + nq, got + nq + nkv, s->in[0], s->cos, s->sin, c->B, c->T, c->H, c->KVH, c->D, s->seg);
    int ok = 1;
    for (int b = 0; b < c->B; b++)
        for (int t = 0; t < c->T; t++) {
            const size_t row = (size_t)b * c->T + t, pos = (size_t)(t - s->seg[row]);
            const float *ct = s->cos + pos * half, *st = s->sin + pos * half, *x = s->in[0] + row * heads * c->D;
            for (int h = 0; h < heads; h++) {
                // where head h of this row went: q (or the rope output) | k | v
                const int part = h < c->H ? 0 : h < rotated ? 1 : 2, hh = part == 0 ? h : part == 1 ? h - c->H : h - rotated;
                const int nh = part == 0 ? c->H : c->KVH;
                const float *y = got + (part == 0 ? 0 : part == 1 ? nq : nq + nkv) + (row * nh + hh) * c->D;
                for (int i = 0; i < half; i++) {
                    const float x1 = x[h * c->D + i], x2 = x[h * c->D + i + half];
                    const float y1 = part == 2 ? x1 : x1 * ct[i] - x2 * st[i], y2 = part == 2 ? x2 : x2 * ct[i] + x1 * st[i];
                    ok &= y[i] == y1 && y[i + half] == y2;
                }
            }
        }
    printf("%-36s %-7s %12s %10s %s\n", c->name, "fwd/pos", "bitwise", "", ok ? "pass" : "FAIL");
    EXPECT(ok, "%s: rotation with segment starts is not that of position t - seg[t]", c->name);
    free(got);
}

// ----------------------------------------------------------------------------
// forward references: the attention tiles and the vectorised exp against double precision

// Causal GQA attention in double, the textbook loop nest. out (B, T, H, D); lse (B, H, T).
// With dout (B, T, H, D) also the backward, row by row from the exact probabilities P:
// dP = dO V^T, dS = P (dP - dO . O), dq = dS K / sqrt(D), dk += dS^T q / sqrt(D), dv += P^T dO
// (dq, dk, dv like q, k, v; zeroed here).
// seg (B, T) or NULL: query t sees keys seg[b, t] .. t only (the others have P = 0).
static void attention_ref(double *out, double *lse, const float *q, const float *k, const float *v,
                          int B, int T, int H, int KVH, int D, const float *dout, double *dq, double *dk,
                          double *dv, const int32_t *seg) {
    double *p = malloc(sizeof(double) * T);
    if (dout) {
        memset(dq, 0, sizeof(double) * B * T * H * D);
        memset(dk, 0, sizeof(double) * B * T * KVH * D);
        memset(dv, 0, sizeof(double) * B * T * KVH * D);
    }
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                const float *qt = q + (((size_t)b * T + t) * H + h) * D;
                const int j0 = seg ? seg[(size_t)b * T + t] : 0;
                double m = -INFINITY, sum = 0;
                for (int j = j0; j <= t; j++) {
                    const float *kj = k + (((size_t)b * T + j) * KVH + h / (H / KVH)) * D;
                    double dot = 0;
                    for (int d = 0; d < D; d++) dot += (double)qt[d] * kj[d];
                    p[j] = dot / sqrt((double)D);
                    m = p[j] > m ? p[j] : m;
                }
                for (int j = j0; j <= t; j++) sum += exp(p[j] - m);
                double *o = out + (((size_t)b * T + t) * H + h) * D;
                for (int d = 0; d < D; d++) o[d] = 0;
                for (int j = j0; j <= t; j++) {
                    const float *vj = v + (((size_t)b * T + j) * KVH + h / (H / KVH)) * D;
                    for (int d = 0; d < D; d++) o[d] += exp(p[j] - m) / sum * vj[d];
                }
                lse[((size_t)b * H + h) * T + t] = m + log(sum);
                if (!dout) continue;
                const float *g = dout + (((size_t)b * T + t) * H + h) * D;
                double delta = 0;   // dO . O of this row
                for (int d = 0; d < D; d++) delta += (double)g[d] * o[d];
                double *dqt = dq + (((size_t)b * T + t) * H + h) * D;
                for (int j = j0; j <= t; j++) {
                    const size_t kv = (((size_t)b * T + j) * KVH + h / (H / KVH)) * D;
                    const double pj = exp(p[j] - m) / sum;
                    double dp = 0;
                    for (int d = 0; d < D; d++) dp += (double)g[d] * v[kv + d];
                    const double ds = pj * (dp - delta) / sqrt((double)D);
                    for (int d = 0; d < D; d++) {
                        dqt[d] += ds * k[kv + d];
                        dk[kv + d] += ds * qt[d];
                        dv[kv + d] += pj * g[d];
                    }
                }
            }
    free(p);
}

// NMSE of n fp32 values against a double reference (test_nmse with the reference rounded to
// fp32 would add its own rounding, ~1e-15, to what is measured: negligible either way)
static double nmse_vs_double(const float *a, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        const double d = (double)a[i] - ref[i];
        num += d * d; den += ref[i] * ref[i];
    }
    return den > 0 ? num / den : num;
}

// Threshold: each output is a convex combination of v rows (|v| ~ 1) with weights from fp32
// dot products of length D and sums of <= T terms; relative rounding error per element is at
// most ~(D + T) * 6e-8 < 1e-5 for these shapes and typically ~1e-6 (NMSE ~1e-12). We allow
// NMSE 1e-10 on out and 1e-5 absolute on lse. A mask off by one key or a tile reading the
// wrong key block gives NMSE 1e-3 or more.
#define ATT_REF_NMSE_MAX 1e-10
#define ATT_REF_LSE_MAX 1e-5
static void check_attention_forward(const backend *be, const state *s) {
    const op_case *c = s->c;
    size_t nl = (size_t)c->B * c->H * c->T;
    float *out = malloc(sizeof(float) * s->out_n), *lse = malloc(sizeof(float) * nl), *ref32 = malloc(sizeof(float) * s->out_n);
    double *ref = malloc(sizeof(double) * s->out_n), *lse_ref = malloc(sizeof(double) * nl);
    OP(be->attention_fwd, out, lse, s->in[0], s->in[1], s->in[2], c->B, c->T, c->H, c->KVH, c->D, s->seg);
    attention_ref(ref, lse_ref, s->in[0], s->in[1], s->in[2], c->B, c->T, c->H, c->KVH, c->D, NULL, NULL, NULL, NULL,
                  s->seg);
    for (size_t i = 0; i < s->out_n; i++) ref32[i] = (float)ref[i];
    double e = test_nmse(out, ref32, s->out_n), lse_err = 0;
    for (size_t i = 0; i < nl; i++) lse_err = fmax(lse_err, fabs(lse[i] - lse_ref[i]));
    int ok = e <= ATT_REF_NMSE_MAX && lse_err <= ATT_REF_LSE_MAX;
    printf("%-36s %-7s %12.3e %10.1e %s (lse max err %.1e)\n", c->name, "fwd/ref", e, ATT_REF_NMSE_MAX,
           ok ? "pass" : "FAIL", lse_err);
    EXPECT(ok, "%s forward vs double reference: NMSE %.3e, lse max error %.3e", c->name, e, lse_err);
    free(out); free(lse); free(ref32); free(ref); free(lse_ref);
}

// Full gradients against a reference in double: every element, so a bug confined to one
// attention tile or one lm_head chunk (a few rows of many) cannot hide between the FD samples.
// Threshold, derived: each analytic element is an fp32 sum of K products (K: the keys of a
// query row, <= 197 here; for dW the rows of a chunk, <= 2048), every product and partial sum
// rounded to ~6e-8 relative. Rounding errors of random sign grow like sqrt(K) * 6e-8, <= 3e-6
// relative -> NMSE <= ~1e-11 (all of one sign, K * 6e-8 = 1.2e-4 at 2048 rows, NMSE ~1.5e-8:
// sgemm's blocked partial sums are far from that); the backward also reads the forward's fp32
// out and lse (~1e-7 relative), and cpu_expf is within 2 ulp: the same order or less. We allow
// 1e-9; measured at most 1.1e-13 (T197 dk). Audit mutants: dq of the rows past 128 x1.5 gives
// NMSE 9e-4 (T130) and 3e-2 (T197); dx of the chunks after the first x1.5 gives 7e-4 (2048+5)
// to 0.16 (48+48+35).
#define GRAD_REF_NMSE_MAX 1e-9

static void check_attention_backward(const state *s) {
    const op_case *c = s->c;
    double *ref = malloc(sizeof(double) * s->out_n), *lse_ref = malloc(sizeof(double) * c->B * c->H * c->T);
    double *dref[3];
    for (int i = 0; i < 3; i++) dref[i] = malloc(sizeof(double) * s->in_n[i]);
    attention_ref(ref, lse_ref, s->in[0], s->in[1], s->in[2], c->B, c->T, c->H, c->KVH, c->D, s->R, dref[0], dref[1],
                  dref[2], s->seg);
    for (int i = 0; i < 3; i++) {
        double e = nmse_vs_double(s->grad[i], dref[i], s->in_n[i]);
        int ok = e <= GRAD_REF_NMSE_MAX;
        char what[16];
        snprintf(what, sizeof what, "d%s/ref", s->in_name[i]);
        printf("%-36s %-7s %12.3e %10.1e %s\n", c->name, what, e, GRAD_REF_NMSE_MAX, ok ? "pass" : "FAIL");
        EXPECT(ok, "%s d%s vs double reference (every element): NMSE %.3e", c->name, s->in_name[i], e);
        free(dref[i]);
    }
    free(ref); free(lse_ref);
}

// lm_head + cross-entropy in double: logits = x W^T, loss = logsumexp - logit[target] (0 when
// ignored), dlogits = dloss (softmax - onehot(target)), dx = dlogits W, dW = dlogits^T x. The
// op's losses (forward) and both gradients (from analytic(), chunk by chunk) against it, and
// the number of chunks the case's rows make.
static void check_lmhead_reference(const backend *be, const state *s) {
    const op_case *c = s->c;
    const int N = c->N, C = c->C, V = c->V;
    const float *x = s->in[0], *w = s->in[1];
    const double dloss = s->R[0];
    double *loss = calloc((size_t)N, sizeof(double)), *dx = calloc((size_t)N * C, sizeof(double));
    double *dw = calloc((size_t)V * C, sizeof(double)), *l = malloc(sizeof(double) * V);
    for (int n = 0; n < N; n++) {
        if (s->tokens[n] == -100) continue;
        double m = -INFINITY, sum = 0;
        for (int j = 0; j < V; j++) {
            l[j] = 0;
            for (int i = 0; i < C; i++) l[j] += (double)x[(size_t)n * C + i] * w[(size_t)j * C + i];
            m = l[j] > m ? l[j] : m;
        }
        for (int j = 0; j < V; j++) sum += exp(l[j] - m);
        loss[n] = m + log(sum) - l[s->tokens[n]];
        for (int j = 0; j < V; j++) {
            const double g = dloss * (exp(l[j] - m) / sum - (j == s->tokens[n]));
            for (int i = 0; i < C; i++) {
                dx[(size_t)n * C + i] += g * w[(size_t)j * C + i];
                dw[(size_t)j * C + i] += g * x[(size_t)n * C + i];
            }
        }
    }
    float *losses = malloc(sizeof(float) * N), *ws = malloc(sizeof(float) * s->chunk_rows * V);
    int rc = OP(be->lmhead_xent, losses, NULL, NULL, ST_F32, x, w, s->tokens, N, C, V, 1.0f, s->chunk_rows, ws, NULL);
    const double e[3] = {rc ? INFINITY : nmse_vs_double(losses, loss, N), nmse_vs_double(s->grad[0], dx, (size_t)N * C),
                         nmse_vs_double(s->grad[1], dw, (size_t)V * C)};
    static const char *what[3] = {"fwd/ref", "dx/ref", "dW/ref"};
    const int chunks = (N + s->chunk_rows - 1) / s->chunk_rows;
    for (int i = 0; i < 3; i++) {
        int ok = e[i] <= GRAD_REF_NMSE_MAX;
        printf("%-36s %-7s %12.3e %10.1e %s (%d chunk%s of %d rows)\n", c->name, what[i], e[i], GRAD_REF_NMSE_MAX,
               ok ? "pass" : "FAIL", chunks, chunks > 1 ? "s" : "", s->chunk_rows);
        EXPECT(ok, "%s %s vs double reference (every element, %d chunks): NMSE %.3e", c->name, what[i], chunks, e[i]);
    }
    EXPECT(chunks == c->chunks, "%s: %d rows in chunks of %d make %d chunks, the case is meant for %d", c->name, N,
           s->chunk_rows, chunks, c->chunks);
    free(loss); free(dx); free(dw); free(l); free(losses); free(ws);
}

// A call the backend must refuse (status rc): non-zero, with an ft_error message naming `op`.
// One table line; clears the error.
static void expect_refused(const char *op, const char *what, int rc) {
    const char *msg = ft_error_message();
    const int ok = rc != 0 && strstr(msg, op) != NULL;
    char name[64];
    snprintf(name, sizeof name, "%s, %s", op, what);
    printf("%-36s %-7s %12s %10s %s\n", name, "status", "refused", "", ok ? "pass" : "FAIL");
    EXPECT(ok, "%s with %s: status %d, error '%s' (wanted non-zero, an error naming the op)", op, what, rc, msg);
    ft_error_clear();
}

// Invalid arguments the CPU backend refuses: each call must return non-zero with an error
// naming the op, and the same call with valid arguments 0 (so the argument is what it refused).
// Then OP() itself on a refused call: logged once, under the op's name (what expect_ops_ok
// reports), so a failing op in the cases above cannot pass unseen.
static void check_op_errors(const backend *be) {
    enum { N = 3, C = 4, V = 5 };
    float *x = randn(N * C, 1.0f), *w = randn(V * C, 1.0f), *out = filled(N * C, 0.5f);
    float *dw = filled(V * C, 0.0f), *dx = malloc(sizeof(float) * N * C), *ws = malloc(sizeof(float) * N * V);
    float losses[N] = {1, 1, 1};   // (also the rstd rmsnorm_bwd is refused before reading)
    const int32_t tok[N] = {0, 4, 1}, targets[N] = {0, 4, -100}, too_high[N] = {0, V, 1}, negative[N] = {-1, 0, 1};
    const uint16_t bf16[N * C] = {0};
    ft_error_clear();
    expect_refused("embedding_fwd", "token = V", be->embedding_fwd(out, too_high, w, N, C, V));
    expect_refused("embedding_fwd", "token -1", be->embedding_fwd(out, negative, w, N, C, V));
    EXPECT(be->embedding_fwd(out, tok, w, N, C, V) == 0, "embedding_fwd refused valid tokens: %s", ft_error_message());
    expect_refused("embedding_bwd", "bf16 gradient", be->embedding_bwd(dw, ST_BF16, x, tok, N, C, V));
    EXPECT(be->embedding_bwd(dw, ST_F32, x, tok, N, C, V) == 0, "embedding_bwd refused fp32: %s", ft_error_message());
    expect_refused("rmsnorm_bwd", "bf16 gradient", be->rmsnorm_bwd(dx, dw, ST_BF16, x, x, w, losses, N, C));
    expect_refused("matmul_bwd", "bf16 gradient", be->matmul_bwd(dx, dw, ST_BF16, out, x, w, N, C, C, 0, 0));
    EXPECT(be->matmul_bwd(dx, dw, ST_F32, out, x, w, N, C, C, 0, 0) == 0, "matmul_bwd refused fp32: %s",
           ft_error_message());
    expect_refused("lmhead_xent", "chunk of 0 rows",
                   be->lmhead_xent(losses, NULL, NULL, ST_F32, x, w, targets, N, C, V, 1.0f, 0, ws, NULL));
    expect_refused("lmhead_xent", "target = V",
                   be->lmhead_xent(losses, dx, dw, ST_F32, x, w, too_high, N, C, V, 1.0f, N, ws, NULL));
    expect_refused("lmhead_xent", "bf16 gradient",
                   be->lmhead_xent(losses, dx, dw, ST_BF16, x, w, targets, N, C, V, 1.0f, N, ws, NULL));
    EXPECT(be->lmhead_xent(losses, dx, dw, ST_F32, x, w, targets, N, C, V, 1.0f, N, ws, NULL) == 0,
           "lmhead_xent refused valid targets and chunk: %s", ft_error_message());
    expect_refused("accumulate", "bf16 source", be->accumulate(dw, bf16, ST_BF16, N * C, 1.0f));
    EXPECT(be->accumulate(dw, x, ST_F32, N * C, 1.0f) == 0, "accumulate refused fp32: %s", ft_error_message());
    ft_error_clear();

    // OP() on a refused call and then a valid one: one failure logged, the refused op's
    memset(&g_ops, 0, sizeof g_ops);
    OP(be->embedding_fwd, out, too_high, w, N, C, V);
    OP(be->embedding_fwd, out, tok, w, N, C, V);
    const int logged = g_ops.failures == 1 && g_ops.first_op && strcmp(g_ops.first_op, "be->embedding_fwd") == 0 &&
                       g_ops.first_rc != 0 && strstr(g_ops.first_msg, "outside the vocab") != NULL;
    memset(&g_ops, 0, sizeof g_ops);   // that refusal was the point here, not a failure
    printf("%-36s %-7s %12s %10s %s\n", "OP() on a refused call", "status", "logged", "", logged ? "pass" : "FAIL");
    EXPECT(logged, "OP() did not log the refused embedding_fwd as one failure of be->embedding_fwd");
    free(x); free(w); free(out); free(dw); free(dx); free(ws);
}

// --optimizer_moments bf16 on the CPU: the op on bf16 moments is the fp32 op on the same
// values widened, its m and v then stochastically rounded (ft_f32_to_bf16_sr with the bits of
// (seed, step, moment, offset + i), src/bf16_sr.h), the master unchanged by where the moments
// are kept: checked element for element (bits) at odd sizes, one above the op's parallel
// threshold. Second moments of magnitudes 1e-12 .. ~1 (small values are fine in bf16, which
// has fp32's exponent range). Another moment dtype is refused.
static void check_adamw_bf16_moments(const backend *be) {
    const size_t sizes[] = {1, 7, 1001, 70001};
    const adamw_params p = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f,
                            .bias_correction1 = 0.271f, .bias_correction2 = 0.003f, .grad_scale = 0.5f,
                            .seed = 1234, .step = 7, .offset = 5000000123ull};   // above 2^32: both halves
    const uint32_t km = ft_sr_key(p.seed, p.step, 0), kv = ft_sr_key(p.seed, p.step, 1);
    for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; t++) {
        const size_t n = sizes[t];
        float *w32 = randn(n, 1.0f), *g = randn(n, 1.0f), *m32 = randn(n, 0.1f), *v32 = randn(n, 1.0f);
        float *w16 = malloc(n * sizeof(float)), *p16 = malloc(n * sizeof(float)), *p32 = malloc(n * sizeof(float));
        uint16_t *m16 = malloc(n * sizeof(uint16_t)), *v16 = malloc(n * sizeof(uint16_t));
        for (size_t i = 0; i < n; i++) {
            v32[i] = v32[i] * v32[i] * powf(10.0f, -(float)(i % 13));   // 1e-12 .. ~1
            m16[i] = ft_f32_to_bf16(m32[i]), v16[i] = ft_f32_to_bf16(v32[i]);
            m32[i] = ft_bf16_to_f32(m16[i]), v32[i] = ft_bf16_to_f32(v16[i]);
            w16[i] = w32[i];
        }
        const int rc32 = be->adamw(w32, p32, g, m32, v32, ST_F32, n, &p);
        const int rc16 = be->adamw(w16, p16, g, m16, v16, ST_BF16, n, &p);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) {
            uint32_t um, uv;
            memcpy(&um, &m32[i], 4);
            memcpy(&uv, &v32[i], 4);
            bad += w16[i] != w32[i] || p16[i] != p32[i] || m16[i] != ft_f32_to_bf16_sr(um, ft_sr_bits(km, p.offset + i)) ||
                   v16[i] != ft_f32_to_bf16_sr(uv, ft_sr_bits(kv, p.offset + i));
        }
        char name[64];
        snprintf(name, sizeof name, "adamw bf16 moments n=%zu", n);
        printf("%-36s %-7s %12zu %10d %s\n", name, "differ", bad, 0, rc32 == 0 && rc16 == 0 && bad == 0 ? "pass" : "FAIL");
        EXPECT(rc32 == 0 && rc16 == 0 && bad == 0, "%s: %zu elements differ from the fp32 op rounded (rc %d %d)", name,
               bad, rc32, rc16);
        free(w32); free(g); free(m32); free(v32); free(w16); free(p16); free(p32); free(m16); free(v16);
    }
    float w = 1, g = 1, m = 0, v = 0;
    expect_refused("adamw", "fp16 moments", be->adamw(&w, NULL, &g, &m, &v, ST_F16, 1, &p));
}

// The stochastic rounding is unbiased: x = lo + f ulp between two bf16 neighbours (f 0.3,
// 0.5, 0.9; positive and negative), rounded with the bits of N = 65536 consecutive global
// indices. Each result is lo or hi; their mean is x within 6 sigma of a mean of N Bernoulli(f)
// draws, 6 ulp sqrt(f (1 - f) / N) <= 0.012 ulp. Rounding to nearest gives an error of
// min(f, 1 - f) ulp >= 0.1 ulp; bits that repeat or ignore the index, similar.
static void check_sr_unbiased(void) {
    const float fr[] = {0.3f, 0.5f, 0.9f}, base[] = {1.0f, -3.0f, 1e-20f};
    const size_t N = 65536;
    const uint32_t key = ft_sr_key(42, 3, 1);
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            const float lo = ft_bf16_to_f32(ft_f32_to_bf16(base[b]));
            const float ulp = fabsf(ft_bf16_to_f32((uint16_t)(ft_f32_to_bf16(lo) + 1)) - lo);
            const float x = lo + (lo < 0 ? -1.0f : 1.0f) * fr[a] * ulp;
            uint32_t ux;
            memcpy(&ux, &x, 4);
            double sum = 0;
            size_t outside = 0;
            for (size_t i = 0; i < N; i++) {
                const float r = ft_bf16_to_f32(ft_f32_to_bf16_sr(ux, ft_sr_bits(key, (uint64_t)i + 77)));
                outside += fabsf(r - x) >= ulp;
                sum += r;
            }
            const double err = fabs(sum / (double)N - (double)x) / ulp;
            const double bound = 6.0 * sqrt((double)fr[a] * (1.0 - fr[a]) / (double)N);
            char name[64];
            snprintf(name, sizeof name, "bf16 SR mean x=%.3g f=%.1f", (double)x, (double)fr[a]);
            const int ok = err <= bound && outside == 0;
            printf("%-36s %-7s %12.3e %10.1e %s\n", name, "ulp", err, bound, ok ? "pass" : "FAIL");
            EXPECT(ok, "%s: mean off by %.3e ulp (bound %.3e), %zu results not a neighbour", name, err, bound, outside);
        }
}

// With zero gradients and beta2 0.999, v = 1 must decay as 0.999^T: T = 1000 steps of the CPU
// op on 4096 bf16 moments (steps 1..T, so each step draws new bits), the mean of v against
// 0.999^1000 = 0.368. Round to nearest keeps v at 1 (a decrease of 0.1% is under half an
// ulp). Bound: each step's rounding error is zero-mean, independent and at most one ulp
// (2^-7 v <= 2^-7), so one element's error has a standard deviation under
// 2^-7 sqrt(T) / 2 = 0.12 and the mean of 4096 one under 0.0019: 3% of 0.368 is 5.8 sigma.
static void check_sr_v_decays(const backend *be) {
    enum { N = 4096, T = 1000 };
    float *w = calloc(N, sizeof(float)), *g = calloc(N, sizeof(float));
    uint16_t *m = calloc(N, sizeof(uint16_t)), *v = malloc(N * sizeof(uint16_t));
    for (size_t i = 0; i < N; i++) v[i] = ft_f32_to_bf16(1.0f);
    int rc = 0;
    for (int t = 1; t <= T && rc == 0; t++) {
        const adamw_params p = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .bias_correction1 = 1.0f,
                                .bias_correction2 = 1.0f, .grad_scale = 1.0f, .seed = 9, .step = (uint32_t)t, .offset = 100};
        rc = be->adamw(w, NULL, g, m, v, ST_BF16, N, &p);
    }
    double mean = 0;
    for (size_t i = 0; i < N; i++) mean += ft_bf16_to_f32(v[i]) / N;
    const double want = pow(0.999, T), rel = fabs(mean / want - 1.0);
    const int ok = rc == 0 && rel <= 0.03;
    printf("%-36s %-7s %12.3e %10.1e %s\n", "bf16 SR v decays (g=0, 1000 steps)", "rel", rel, 0.03, ok ? "pass" : "FAIL");
    EXPECT(ok, "bf16 moments: mean v %.4f after %d zero-gradient steps, want %.4f within 3%% (rc %d)", mean, T, want, rc);
    free(w); free(g); free(m); free(v);
}

// cpu_expf against exp in double: at most 2 ulp (2 * 2^-23 relative) over [-87, 88]. Derived:
// the reduced argument r is exact to ~2^-32, the degree-7 Taylor remainder is below 0.05 ulp,
// the Horner steps round 8 times on values in [0.7, 1.5] (~1.5 ulp at worst), and scaling by
// 2^n is exact. Outside the range: 0 below -87, +inf above 88, NaN stays NaN.
static void check_expf(void) {
    double worst = 0;
    float worst_x = 0;
    for (int i = 0; i <= 1750000; i++) {
        float x = -87.0f + 1e-4f * (float)i;
        double ref = exp((double)x), rel = fabs((double)cpu_expf(x) - ref) / ref;
        if (rel > worst) { worst = rel; worst_x = x; }
    }
    int specials = cpu_expf(0.0f) == 1.0f && cpu_expf(-INFINITY) == 0.0f && cpu_expf(-100.0f) == 0.0f &&
                   isinf(cpu_expf(INFINITY)) && isinf(cpu_expf(100.0f)) && isnan(cpu_expf(NAN));
    printf("%-36s %-7s %12.3e %10.1e %s (at x = %g)\n", "cpu_expf [-87, 88]", "rel", worst, 2.0 / 8388608,
           worst <= 2.0 / 8388608 && specials ? "pass" : "FAIL", worst_x);
    EXPECT(worst <= 2.0 / 8388608, "cpu_expf: relative error %.3e at x = %g", worst, worst_x);
    EXPECT(specials, "cpu_expf: exp(0) != 1, or -inf/-100 not 0, or +inf/100 not inf, or NaN lost");
}

// sum_squares_accumulate (the gradient norm per unit, src/fsdp.c): over odd sizes from 1 to
// 70001 (below, at and past the 4096-element chunks), *acc holding 2.5 gains the sum of
// squares: within 5e-13 relative of a long-double loop (products exact in double; positive
// terms summed in double, at most 4096 in a chunk and then at most 18 chunks: relative error
// <= (4096 + 18) x 2^-53 = 4.6e-13; measured about 1e-14), and from
// 0.0 bit for bit sum_squares of the same slice (the contract: one add of the same total). A NaN
// anywhere makes the sum NaN; an infinity of either sign makes it +inf.
static void check_sum_squares_accumulate(const backend *be) {
    static const size_t ns[] = {1, 2, 3, 7, 4095, 4096, 4097, 8193, 12289, 70001};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        const size_t n = ns[i];
        float *x = randn(n, 3.0f);
        long double want = 2.5L;
        for (size_t j = 0; j < n; j++) want += (long double)x[j] * x[j];
        double acc = 2.5, zero = 0.0, whole = -1.0;
        EXPECT(be->sum_squares_accumulate(&acc, x, n) == 0 && be->sum_squares_accumulate(&zero, x, n) == 0 &&
                   be->sum_squares(&whole, x, n) == 0, "sum_squares_accumulate n %zu: %s", n, ft_error_message());
        const double rel = fabs((double)(((long double)acc - want) / want));
        EXPECT(rel <= 5e-13, "sum_squares_accumulate n %zu: %.17g vs %.17Lg (rel %.2e)", n, acc, want, rel);
        EXPECT(zero == whole, "sum_squares_accumulate n %zu from 0: %.17g, sum_squares %.17g", n, zero, whole);
        for (int k = 0; k < 3; k++) {   // NaN, +inf, -inf at the last element
            const float keep = x[n - 1];
            x[n - 1] = k == 0 ? NAN : k == 1 ? INFINITY : -INFINITY;
            double a = 2.5;
            EXPECT(be->sum_squares_accumulate(&a, x, n) == 0 && (k == 0 ? isnan(a) : isinf(a) && a > 0),
                   "sum_squares_accumulate n %zu with %s: %g", n, k == 0 ? "NaN" : "inf", a);
            x[n - 1] = keep;
        }
        free(x);
    }
    printf("%-36s %-7s %12s %10s %s\n", "sum_squares_accumulate 1..70001", "-", "-", "5e-13", "checked");
}

int main(void) {
    const backend *be = backend_cpu();
    printf("%-36s %-7s %12s %10s %s\n", "case", "input", "NMSE", "threshold", "result");
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        state s;
        setup(&s, &cases[ci], be);
        int contract_ok;
        analytic(&s, &contract_ok);
        if (cases[ci].op == OP_ATTENTION) check_attention_forward(be, &s);
        if (cases[ci].op == OP_ATTENTION) check_attention_backward(&s);
        if (cases[ci].op == OP_LMHEAD) check_lmhead_reference(be, &s);
        if (cases[ci].op == OP_ROPE_QKV && !s.seg) check_rope_qkv_split(be, &s);
        if ((cases[ci].op == OP_ROPE || cases[ci].op == OP_ROPE_QKV) && s.seg) check_rope_segments(be, &s);
        if (cases[ci].op == OP_MATMUL) check_matmul_residual(be, &s);
        if (cases[ci].op == OP_MATMUL)   // the only op with an accumulate_dinp mode
            EXPECT(contract_ok, "%s: accumulate_dinp did not add to the existing values", cases[ci].name);
        for (int i = 0; i < s.n_in; i++) {
            size_t n = s.in_n[i], samples = n < FD_SAMPLES ? n : FD_SAMPLES;
            float *fd = malloc(sizeof(float) * samples), *an = malloc(sizeof(float) * samples);
            for (size_t k = 0; k < samples; k++) {
                size_t j = fd_coord(k, samples, n);
                float keep = s.in[i][j];
                s.in[i][j] = keep + FD_EPS;
                double jp = objective(&s);
                s.in[i][j] = keep - FD_EPS;
                double jm = objective(&s);
                s.in[i][j] = keep;
                fd[k] = (float)((jp - jm) / (2.0 * FD_EPS));
                an[k] = s.grad[i][j];
            }
            int any_nan = 0;
            for (size_t j = 0; j < n; j++) any_nan |= !isfinite(s.grad[i][j]);
            double e = test_nmse(an, fd, samples);
            int ok = !any_nan && e <= FD_NMSE_MAX;
            printf("%-36s %-7s %12.3e %10.1e %s\n", cases[ci].name, s.in_name[i], e, FD_NMSE_MAX,
                   ok ? "pass" : (any_nan ? "FAIL (unwritten/NaN)" : "FAIL"));
            EXPECT(ok, "%s d%s: NMSE %.3e (nan=%d)", cases[ci].name, s.in_name[i], e, any_nan);
            free(fd); free(an);
        }
        expect_ops_ok(cases[ci].name);
        teardown(&s);
    }
    check_op_errors(be);
    check_adamw_bf16_moments(be);
    check_sr_unbiased();
    check_sr_v_decays(be);
    check_expf();
    check_sum_squares_accumulate(be);
    TEST_SUMMARY("test_ops");
}
