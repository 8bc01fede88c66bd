// model.c: FLOPs, RoPE tables, and the Llama forward/backward over the backend
// table (see model.h). Written once for every backend and every precision: tensors are
// addressed in elements of the backend's storage dtype through `at()`.
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "fp8_linear.h"
#include "lora.h"

// ----------------------------------------------------------------------------
// FLOPs

double model_layer_matmul_params(const llama_config *c) {
    const double C = c->hidden_size, F = c->intermediate_size;
    const double QD = (double)c->num_attention_heads * c->head_dim;
    const double KVD = (double)c->num_key_value_heads * c->head_dim;
    return 2 * QD * C + 2 * KVD * C + 3 * F * C;
}

double model_attention_fwd_flops(const llama_config *c, double T) {
    return 2.0 * 2.0 * (double)c->num_attention_heads * c->head_dim * (T / 2.0);
}

static double matmul_params_of(const llama_config *c) {
    return c->num_hidden_layers * model_layer_matmul_params(c) + (double)c->vocab_size * c->hidden_size;
}

double model_flops_per_token(const llama_config *c, double T, double adapter_layer_params) {
    const double L = c->num_hidden_layers, attention = 3 * L * model_attention_fwd_flops(c, T);   // bwd = 2 x fwd
    // forward 2, backward 4 (dX, dW) FLOPs per trained parameter per token
    if (adapter_layer_params <= 0) return 6 * matmul_params_of(c) + attention;
    // LoRA: the frozen base has no dW products
    return 4 * matmul_params_of(c) + 6 * L * adapter_layer_params + attention;
}

double model_forward_flops_per_token(const llama_config *c, double T, double adapter_layer_params) {
    const double L = c->num_hidden_layers;
    return 2 * (matmul_params_of(c) + L * (adapter_layer_params > 0 ? adapter_layer_params : 0)) +
           L * model_attention_fwd_flops(c, T);
}

// ----------------------------------------------------------------------------
// RoPE tables, following transformers' fp32 arithmetic

void rope_tables_compute(const llama_config *c, int T, float *cos_out, float *sin_out) {
    const int D = c->head_dim, half = D / 2;
    for (int i = 0; i < half; i++) {
        // inv_freq = 1 / base ** (2i / D), each step in fp32 as torch does
        float expo = (float)(2 * i) / (float)D;
        float inv = 1.0f / powf((float)c->rope_theta, expo);
        if (c->rope_scaling == ROPE_SCALING_LINEAR) {
            inv = inv / (float)c->rope_factor;
        } else if (c->rope_scaling == ROPE_SCALING_LLAMA3) {
            const double factor = c->rope_factor, lo = c->rope_low_freq_factor,
                         hi = c->rope_high_freq_factor,
                         old_len = c->rope_original_max_position_embeddings;
            const double lo_wavelen = old_len / lo, hi_wavelen = old_len / hi;
            const double wavelen = 2.0 * M_PI / inv;
            double scaled = wavelen > lo_wavelen ? inv / factor : inv;   // low frequencies
            if (!(wavelen < hi_wavelen) && !(wavelen > lo_wavelen)) {   // medium: blend
                double smooth = (old_len / wavelen - lo) / (hi - lo);
                scaled = (1.0 - smooth) * scaled / factor + smooth * scaled;
            }
            inv = (float)scaled;
        }
        for (int t = 0; t < T; t++) {
            float angle = (float)t * inv;
            cos_out[(size_t)t * half + i] = (float)cos((double)angle);
            sin_out[(size_t)t * half + i] = (float)sin((double)angle);
        }
    }
}

// ----------------------------------------------------------------------------
// the buffer table: every activation and scratch buffer, described once

// element `i` of a backend-dtype buffer
static inline void *at(const model *m, void *base, size_t i) { return (char *)base + i * m->esz; }

// address of field f of *obj for the table's slot, or NULL when only planning (obj NULL)
#define SLOT(obj, f) ((obj) ? (void *)&(obj)->f : NULL)

// One layer_acts set: what a decoder layer's forward keeps for its backward.
static void layer_acts_table(mem_table *t, mem_category cat, const char *what, const llama_config *c,
                             const lora_config *lc, size_t B, size_t T, size_t esz, layer_acts *s) {
    const size_t N = B * T, C = c->hidden_size, F = c->intermediate_size, H = c->num_attention_heads;
    const size_t QD = H * c->head_dim, KVD = (size_t)c->num_key_value_heads * c->head_dim;
    mem_table_add(t, cat, N * C * esz, what, SLOT(s, ln1));              // (N, C)
    mem_table_add(t, cat, N * sizeof(float), what, SLOT(s, ln1_rstd));  // (N)
    mem_table_add(t, cat, N * QD * esz, what, SLOT(s, q));               // (N, H*D)
    mem_table_add(t, cat, N * KVD * esz, what, SLOT(s, k));              // (N, KVH*D)
    mem_table_add(t, cat, N * KVD * esz, what, SLOT(s, v));              // (N, KVH*D)
    mem_table_add(t, cat, N * QD * esz, what, SLOT(s, att));             // (N, H*D)
    mem_table_add(t, cat, B * H * T * sizeof(float), what, SLOT(s, lse)); // (B, H, T)
    mem_table_add(t, cat, N * C * esz, what, SLOT(s, h));                // (N, C)
    mem_table_add(t, cat, N * C * esz, what, SLOT(s, ln2));              // (N, C)
    mem_table_add(t, cat, N * sizeof(float), what, SLOT(s, ln2_rstd));  // (N)
    mem_table_add(t, cat, N * 2 * F * esz, what, SLOT(s, gu));           // (N, 2F) gate | up
    mem_table_add(t, cat, N * F * esz, what, SLOT(s, act));              // (N, F)
    for (int k = 0; lc && k < LT_COUNT; k++)
        if (lc->targets & (1u << k))
            mem_table_add(t, cat, N * (size_t)lc->rank * esz, what, SLOT(s, lora_u[k]));   // (N, r)
}

// FT_LMHEAD_CHUNK_ROWS (test-only): the row cap it sets, 0 when unset; -1 when not an integer
// in [1, LMHEAD_CHUNK_ROWS_MAX]
static int lmhead_chunk_env(const char **text) {
    const char *s = ft_getenv("FT_LMHEAD_CHUNK_ROWS");
    *text = s;
    if (!s) return 0;
    char *end;
    const long v = strtol(s, &end, 10);
    return end == s || *end || v < 1 || v > LMHEAD_CHUNK_ROWS_MAX ? -1 : (int)v;
}

int model_lmhead_chunk_env_check(void) {
    const char *s;
    if (lmhead_chunk_env(&s) < 0)
        return ft_error("environment variable FT_LMHEAD_CHUNK_ROWS: '%s' is not a row count in [1, %d] (test-only)", s,
                        LMHEAD_CHUNK_ROWS_MAX);
    return 0;
}

int model_lmhead_chunk_rows(int N, int V) {
    const char *text;
    const int cap = lmhead_chunk_env(&text);
    size_t rows = LMHEAD_CHUNK_BYTES / ((size_t)(V > 0 ? V : 1) * sizeof(float));
    if (rows > LMHEAD_CHUNK_ROWS_MAX) rows = LMHEAD_CHUNK_ROWS_MAX;
    if (rows > 128) rows -= rows % 128;   // whole GEMM tiles
    if (cap > 0 && rows > (size_t)cap) rows = (size_t)cap;
    if (rows < 1) rows = 1;
    return N < (int)rows ? (N > 0 ? N : 1) : (int)rows;
}

// The workspace of the step's inputs and outputs: RoPE tables, tokens, targets, losses, and the
// fp32 logits of one lm_head row chunk (model_lmhead_chunk_rows).
static void io_table(mem_table *t, const llama_config *c, int B, int T, model *m) {
    const size_t N = (size_t)B * T, V = c->vocab_size;
    const size_t rope = (size_t)T * (size_t)(c->head_dim / 2) * sizeof(float);   // (T, D/2)
    const size_t chunk = (size_t)model_lmhead_chunk_rows((int)N, (int)V);
    const char *io = "RoPE tables, tokens, targets, losses";
    mem_table_add(t, MEM_WORKSPACE, rope, io, SLOT(m, rope_cos));
    mem_table_add(t, MEM_WORKSPACE, rope, io, SLOT(m, rope_sin));
    mem_table_add(t, MEM_WORKSPACE, N * sizeof(int32_t), io, SLOT(m, tokens));
    mem_table_add(t, MEM_WORKSPACE, N * sizeof(int32_t), io, SLOT(m, targets));
    mem_table_add(t, MEM_WORKSPACE, N * sizeof(int32_t), "segment starts (--pack_attention per_game)", SLOT(m, seg));
    mem_table_add(t, MEM_WORKSPACE, N * sizeof(float), io, SLOT(m, losses));
    mem_table_add(t, MEM_WORKSPACE, 2 * sizeof(double), "loss accumulator: sum and valid count (2 doubles)",
                  SLOT(m, loss_acc));
    if (m) m->lmhead_rows = (int)chunk;
    mem_table_add(t, MEM_WORKSPACE, chunk * V * sizeof(float), "fp32 logits of one lm_head row chunk",
                  SLOT(m, logits_ws));
}

// --eval_only's buffers (MODEL_FORWARD_ONLY): what layer_forward and the lm_head's loss read
// and write, nothing kept for a backward. One residual buffer: a layer reads its input x for
// the first norm and the o_proj's residual, then writes its output over it (the down GEMM's
// residual is h, not x); one set of layer activations, reused by every layer; the fused q|k|v
// GEMM's (N, (H + 2 KVH) D) output in the dgu slot (attn_qkv_fwd); the tables and the logits
// chunk as in training (the same rows per chunk: the same arithmetic).
static void forward_only_table(mem_table *t, const llama_config *c, const lora_config *lc, int B, int T, size_t esz,
                               model *m) {
    const size_t N = (size_t)B * T, C = c->hidden_size;
    const size_t QKV = (size_t)(c->num_attention_heads + 2 * c->num_key_value_heads) * c->head_dim;
    mem_table_add(t, MEM_ACTIVATIONS, N * C * esz,
                  "residual stream: one (N, C) buffer, each layer's output over its input",
                  m ? (void *)&m->resid[0] : NULL);
    layer_acts_table(t, MEM_ACTIVATIONS, "one layer's activations, reused by every layer (forward only)", c, lc,
                     (size_t)B, (size_t)T, esz, m ? &m->acts[0] : NULL);
    mem_table_add(t, MEM_ACTIVATIONS, N * C * esz, "final norm output + rstd", SLOT(m, lnf));
    mem_table_add(t, MEM_ACTIVATIONS, N * sizeof(float), "final norm output + rstd", SLOT(m, lnf_rstd));
    io_table(t, c, B, T, m);
    mem_table_add(t, MEM_WORKSPACE, N * QKV * esz, "fused q|k|v projection output (N, (H + 2 KVH) D)", SLOT(m, dgu));
}

void model_buffer_table(mem_table *t, const llama_config *c, const lora_config *lc, int B, int T, int buffers,
                        int grads_f32, size_t esz, model *m) {
    if (buffers == MODEL_FORWARD_ONLY) {
        forward_only_table(t, c, lc, B, T, esz, m);
        return;
    }
    const int grad_ckpt = buffers == MODEL_TRAIN_CKPT;
    const size_t N = (size_t)B * T, C = c->hidden_size, V = c->vocab_size, F = c->intermediate_size;
    const size_t QD = (size_t)c->num_attention_heads * c->head_dim;
    const size_t KVD = (size_t)c->num_key_value_heads * c->head_dim;
    const size_t chunk = (size_t)model_lmhead_chunk_rows((int)N, (int)V);
    const int L = c->num_hidden_layers;

    // activations: what the forward keeps for the backward
    for (int l = 0; l <= L; l++)
        mem_table_add(t, MEM_ACTIVATIONS, N * C * esz, "residual stream: every layer's input + the output",
                      m ? (void *)&m->resid[l] : NULL);
    for (int l = 0; l < L && !grad_ckpt; l++)
        layer_acts_table(t, MEM_ACTIVATIONS, "every layer's saved activations (norms, q, k, v, attention, MLP)", c,
                         lc, (size_t)B, (size_t)T, esz, m ? &m->acts[l] : NULL);
    mem_table_add(t, MEM_ACTIVATIONS, N * C * esz, "final norm output + rstd", SLOT(m, lnf));
    mem_table_add(t, MEM_ACTIVATIONS, N * sizeof(float), "final norm output + rstd", SLOT(m, lnf_rstd));

    // workspace: the recompute set (checkpointing), tables, the logits chunk, backward scratch
    if (grad_ckpt)
        layer_acts_table(t, MEM_WORKSPACE, "one layer's activations, recomputed in backward", c, lc, (size_t)B,
                         (size_t)T, esz, m ? &m->acts[0] : NULL);
    io_table(t, c, B, T, m);
    // several chunks on a bf16 backend: lm_head's dW summed over them in fp32, rounded once
    // (none for a frozen lm_head: LoRA; none when the gradient is fp32 itself)
    if (N > chunk && esz != sizeof(float) && !lc && !grads_f32)
        mem_table_add(t, MEM_WORKSPACE, V * C * sizeof(float), "fp32 lm_head weight gradient over the row chunks",
                      SLOT(m, lmhead_dw_acc));
    const char *bwd = "backward scratch of one layer";
    mem_table_add(t, MEM_WORKSPACE, N * C * esz, bwd, SLOT(m, dresid));
    mem_table_add(t, MEM_WORKSPACE, N * C * esz, bwd, SLOT(m, dln));
    mem_table_add(t, MEM_WORKSPACE, N * QD * esz, bwd, SLOT(m, dq));
    mem_table_add(t, MEM_WORKSPACE, N * QD * esz, bwd, SLOT(m, datt));
    mem_table_add(t, MEM_WORKSPACE, N * KVD * esz, bwd, SLOT(m, dk));
    mem_table_add(t, MEM_WORKSPACE, N * KVD * esz, bwd, SLOT(m, dv));
    // (N, 2F) dgate | dup; also the fused q|k|v projection (N, QD + 2 KVD) and its gradient
    // (attn_qkv_fwd/bwd), which a layer never needs while its MLP part does
    const size_t gu_cols = 2 * F > QD + 2 * KVD ? 2 * F : QD + 2 * KVD;
    mem_table_add(t, MEM_WORKSPACE, N * gu_cols * esz, bwd, SLOT(m, dgu));
    mem_table_add(t, MEM_WORKSPACE, N * F * esz, bwd, SLOT(m, dact));
    if (lc) {
        const char *lw = "LoRA: one target's (N, r) gradient, the frozen norms' gradient sink";
        mem_table_add(t, MEM_WORKSPACE, N * (size_t)lc->rank * esz, lw, SLOT(m, lora_du));  // (N, r)
        mem_table_add(t, MEM_WORKSPACE, C * esz, lw, SLOT(m, norm_sink));                  // (C)
    }
}

// RoPE tables computed on the host and copied into the backend's (T, D/2) buffers.
static int model_upload_rope(model *m) {
    const size_t bytes = (size_t)m->T_alloc * (size_t)(m->cfg.head_dim / 2) * sizeof(float);
    float *cos_h = ft_malloc(bytes, "rope cos"), *sin_h = ft_malloc(bytes, "rope sin");
    int rc = -1;
    if (cos_h && sin_h) {
        rope_tables_compute(&m->cfg, m->T_alloc, cos_h, sin_h);
        rc = m->be->copy_h2d(m->rope_cos, cos_h, bytes);
        if (rc == 0) rc = m->be->copy_h2d(m->rope_sin, sin_h, bytes);
    }
    free(cos_h);
    free(sin_h);
    return rc;
}

int model_init(model *m, const param_layout *layout, const backend *be, mem_tracker *mem, int B, int T,
               int buffers) {
    return model_init_lora(m, layout, NULL, NULL, be, mem, B, T, buffers, 0);
}

int model_init_lora(model *m, const param_layout *layout, const lora_layout *lora, const unit_provider *adapters,
                    const backend *be, mem_tracker *mem, int B, int T, int buffers, int grads_f32) {
    memset(m, 0, sizeof *m);
    const llama_config *cfg = &layout->cfg;
    m->lora = lora;
    if (lora) m->adapters = *adapters;
    m->cfg = *cfg;
    m->layout = layout;
    m->be = be;
    m->mem = mem;
    m->B = B;
    m->T = T;
    m->T_alloc = T;
    m->buffers = buffers;
    m->grad_ckpt = buffers == MODEL_TRAIN_CKPT;
    m->grads_f32 = grads_f32;
    m->esz = st_dtype_size(be->dtype);
    const int L = cfg->num_hidden_layers;
    m->resid = ft_calloc((size_t)L + 1, sizeof(void *), "residual table");
    m->n_act_sets = buffers == MODEL_TRAIN ? L : 1;
    m->acts = ft_calloc((size_t)m->n_act_sets, sizeof(layer_acts), "activation table");
    m->losses_host = ft_malloc((size_t)B * T * sizeof(float), "host losses");
    m->seg_host = ft_malloc((size_t)B * T * sizeof(int32_t), "host segment starts");
    m->seg_bos = -1;
    if (!m->resid || !m->acts || !m->losses_host || !m->seg_host) { model_free(m); return -1; }
    for (int k = 0; be->upload && k < 2; k++)   // (host memory: no device bytes counted)
        if (!(m->up_host[k] = be->host_alloc(3 * (size_t)B * T * sizeof(int32_t)))) { model_free(m); return -1; }
    mem_table t = mem_table_allocator(mem);
    model_buffer_table(&t, cfg, lora ? &lora->lc : NULL, B, T, buffers, grads_f32, m->esz, m);
    if (t.failed || model_upload_rope(m) != 0 || model_loss_reset(m) != 0) { model_free(m); return -1; }
    if (buffers == MODEL_FORWARD_ONLY)   // one residual buffer (forward_only_table)
        for (int l = 1; l <= L; l++) m->resid[l] = m->resid[0];
    return 0;
}

void model_free(model *m) {
    if (m->resid && m->acts) {   // the same table as model_init, so the same sizes
        mem_table t = mem_table_releaser(m->mem);
        model_buffer_table(&t, &m->cfg, m->lora ? &m->lora->lc : NULL, m->B, m->T_alloc, m->buffers, m->grads_f32,
                           m->esz, m);
    }
    free(m->resid);
    free(m->acts);
    free(m->losses_host);
    free(m->seg_host);
    for (int k = 0; k < 2; k++)
        if (m->up_host[k]) {
            (void)m->be->copy_wait(BACKEND_TICKET_UPLOAD + k);   // (its upload may still read it)
            m->be->host_free(m->up_host[k]);
        }
    memset(m, 0, sizeof *m);
}

// ----------------------------------------------------------------------------
// LoRA (lora.h): the adapter path of a targeted projection, after its base GEMM

static int lora_on(const model *m, int t) { return m->lora && (m->lora->lc.targets & (1u << t)); }

// A weight's gradient slot: element `off` of the gradient unit dw, in its dtype m->gdt (the
// backend dtype, or fp32: grad_begin says); NULL for a frozen base (LoRA; the matmuls skip it).
static void *grad_at(const model *m, void *dw, size_t off) { return dw ? (char *)dw + off * m->gesz : NULL; }
// A base RMSNorm weight's gradient: the discarded sink for a frozen base.
static void *norm_grad_at(const model *m, void *dw, size_t off) { return dw ? grad_at(m, dw, off) : m->norm_sink; }
// ... and its dtype (the sink is in the backend dtype)
static st_dtype norm_gdt(const model *m, const void *dw) { return dw ? m->gdt : m->be->dtype; }

// y (N, out) += s B (A x) for projection t, when targeted; aw = the layer's adapter unit
static int lora_fwd(model *m, int t, void *aw, layer_acts *s, void *y, const void *x) {
    if (!lora_on(m, t)) return 0;
    const lora_layout *ll = m->lora;
    return lora_proj_fwd(m->be, lora_scaling(&ll->lc), y, s->lora_u[t], x, at(m, aw, ll->a_off[t]),
                         at(m, aw, ll->b_off[t]), m->B * m->T, ll->in[t], ll->out[t], ll->lc.rank);
}

// dx (N, in) += the adapter's share of projection t's input gradient; its A and B gradients
// into the adapter gradient unit daw
static int lora_bwd(model *m, int t, void *aw, void *daw, layer_acts *s, void *dx, const void *dy, const void *x) {
    if (!lora_on(m, t)) return 0;
    const lora_layout *ll = m->lora;
    return lora_proj_bwd(m->be, lora_scaling(&ll->lc), dx, grad_at(m, daw, ll->a_off[t]), grad_at(m, daw, ll->b_off[t]),
                         m->gdt, m->lora_du, dy, x, s->lora_u[t], at(m, aw, ll->a_off[t]), at(m, aw, ll->b_off[t]),
                         m->B * m->T, ll->in[t], ll->out[t], ll->lc.rank);
}

// ----------------------------------------------------------------------------
// gate and up: one GEMM

// gate_proj (F, C) and up_proj (F, C) are adjacent in a layer unit, so together they are one
// (2F, C) weight and one GEMM gives gu (N, 2F) = [gate | up] per row, which the SwiGLU kernel
// reads at row stride 2F; backward is one dX and one dW GEMM over dgu (N, 2F) likewise.
// With a LoRA adapter on gate or up the two GEMMs stay separate (gu = [gate (N, F); up (N, F)],
// row stride F): the adapter path adds its (N, F) output into, and reads its gradient from,
// contiguous rows (lora_proj_fwd/bwd), which the strided halves are not. The base is frozen
// there, so only the dX GEMM is given up.
static int mlp_fused(const model *m) { return !lora_on(m, LT_WGATE) && !lora_on(m, LT_WUP); }

// s->gu from s->ln2 (+ the adapters' share when unfused)
static int mlp_gate_up_fwd(model *m, void *w, void *aw, layer_acts *s) {
    const int N = m->B * m->T, C = m->cfg.hidden_size, F = m->cfg.intermediate_size;
    const size_t *o = m->layout->layer_off;
    if (mlp_fused(m)) return m->be->matmul_fwd(s->gu, s->ln2, at(m, w, o[LT_WGATE]), NULL, N, C, 2 * F);   // (N, 2F)
    void *up = at(m, s->gu, (size_t)N * F);
    TRY(m->be->matmul_fwd(s->gu, s->ln2, at(m, w, o[LT_WGATE]), NULL, N, C, F));   // (N, F)
    TRY(m->be->matmul_fwd(up, s->ln2, at(m, w, o[LT_WUP]), NULL, N, C, F));        // (N, F)
    TRY(lora_fwd(m, LT_WGATE, aw, s, s->gu, s->ln2));
    return lora_fwd(m, LT_WUP, aw, s, up, s->ln2);
}

// SwiGLU backward from m->dact into m->dgu (gu's layout), then m->dln = dL/d ln2 and the
// gate/up weight (or adapter) gradients
static int mlp_gate_up_bwd(model *m, void *w, void *dw, void *aw, void *daw, layer_acts *s) {
    const backend *be = m->be;
    const int N = m->B * m->T, C = m->cfg.hidden_size, F = m->cfg.intermediate_size;
    const size_t *o = m->layout->layer_off;
    if (mlp_fused(m)) {
        TRY(be->swiglu_bwd(m->dgu, at(m, m->dgu, F), m->dact, s->gu, at(m, s->gu, F), N, F, 2 * F));
        return be->matmul_bwd(m->dln, grad_at(m, dw, o[LT_WGATE]), m->gdt, m->dgu, s->ln2, at(m, w, o[LT_WGATE]), N, C,
                              2 * F, 0, !m->gfresh);
    }
    void *dup = at(m, m->dgu, (size_t)N * F);
    TRY(be->swiglu_bwd(m->dgu, dup, m->dact, s->gu, at(m, s->gu, (size_t)N * F), N, F, F));
    TRY(be->matmul_bwd(m->dln, grad_at(m, dw, o[LT_WGATE]), m->gdt, m->dgu, s->ln2, at(m, w, o[LT_WGATE]), N, C, F, 0, !m->gfresh));
    TRY(be->matmul_bwd(m->dln, grad_at(m, dw, o[LT_WUP]), m->gdt, dup, s->ln2, at(m, w, o[LT_WUP]), N, C, F, 1, !m->gfresh));
    TRY(lora_bwd(m, LT_WGATE, aw, daw, s, m->dln, m->dgu, s->ln2));
    return lora_bwd(m, LT_WUP, aw, daw, s, m->dln, dup, s->ln2);
}

// ----------------------------------------------------------------------------
// q, k and v: one GEMM

// q_proj (H D, C), k_proj and v_proj (KVH D, C) are adjacent in a layer unit: one
// ((H + 2 KVH) D, C) weight, one GEMM into the (N, (H + 2 KVH) D) scratch m->dgu, and one
// pass (rope_qkv_fwd) that rotates q and k into s->q, s->k and copies v into s->v, the
// packed per-head layouts attention reads. Backward: rope_qkv_bwd gathers [dq | dk | dv]
// rows into m->dgu and one dX and one dW GEMM follow. With a LoRA adapter on q, k or v the
// pass only splits (no tables), the adapters add into the packed q, k, v, and RoPE runs
// after them in place; backward likewise (RoPE's backward first, then the plain gather).
static int attn_lora(const model *m) { return lora_on(m, LT_WQ) || lora_on(m, LT_WK) || lora_on(m, LT_WV); }

// s->q, s->k (after RoPE), s->v from s->ln1 (+ the adapters' share)
static int attn_qkv_fwd(model *m, void *w, void *aw, layer_acts *s) {
    const backend *be = m->be;
    const llama_config *c = &m->cfg;
    const int B = m->B, T = m->T, N = B * T, C = c->hidden_size;
    const int H = c->num_attention_heads, KVH = c->num_key_value_heads, D = c->head_dim;
    TRY(be->matmul_fwd(m->dgu, s->ln1, at(m, w, m->layout->layer_off[LT_WQ]), NULL, N, C,
                       (H + 2 * KVH) * D));                                   // (N, (H + 2 KVH) D)
    if (!attn_lora(m)) return be->rope_qkv_fwd(s->q, s->k, s->v, m->dgu, m->rope_cos, m->rope_sin, B, T, H, KVH, D, m->seg_cur);
    TRY(be->rope_qkv_fwd(s->q, s->k, s->v, m->dgu, NULL, NULL, B, T, H, KVH, D, NULL));   // split only
    TRY(lora_fwd(m, LT_WQ, aw, s, s->q, s->ln1));
    TRY(lora_fwd(m, LT_WK, aw, s, s->k, s->ln1));
    TRY(lora_fwd(m, LT_WV, aw, s, s->v, s->ln1));
    TRY(be->rope_fwd(s->q, s->q, m->rope_cos, m->rope_sin, B, T, H, D, m->seg_cur));
    return be->rope_fwd(s->k, s->k, m->rope_cos, m->rope_sin, B, T, KVH, D, m->seg_cur);
}

// From m->dq, m->dk, m->dv (attention's input gradients, before RoPE's backward): m->dln =
// dL/d ln1 and the q/k/v weight (or adapter) gradients
static int attn_qkv_bwd(model *m, void *w, void *dw, void *aw, void *daw, layer_acts *s) {
    const backend *be = m->be;
    const llama_config *c = &m->cfg;
    const int B = m->B, T = m->T, N = B * T, C = c->hidden_size;
    const int H = c->num_attention_heads, KVH = c->num_key_value_heads, D = c->head_dim;
    const size_t wq = m->layout->layer_off[LT_WQ];
    if (!attn_lora(m)) {
        TRY(be->rope_qkv_bwd(m->dgu, m->dq, m->dk, m->dv, m->rope_cos, m->rope_sin, B, T, H, KVH, D, m->seg_cur));
        return be->matmul_bwd(m->dln, grad_at(m, dw, wq), m->gdt, m->dgu, s->ln1, at(m, w, wq), N, C, (H + 2 * KVH) * D, 0, !m->gfresh);
    }
    TRY(be->rope_bwd(m->dq, m->dq, m->rope_cos, m->rope_sin, B, T, H, D, m->seg_cur));
    TRY(be->rope_bwd(m->dk, m->dk, m->rope_cos, m->rope_sin, B, T, KVH, D, m->seg_cur));
    TRY(be->rope_qkv_bwd(m->dgu, m->dq, m->dk, m->dv, NULL, NULL, B, T, H, KVH, D, NULL));   // gather only
    TRY(be->matmul_bwd(m->dln, grad_at(m, dw, wq), m->gdt, m->dgu, s->ln1, at(m, w, wq), N, C, (H + 2 * KVH) * D, 0, !m->gfresh));
    TRY(lora_bwd(m, LT_WQ, aw, daw, s, m->dln, m->dq, s->ln1));
    TRY(lora_bwd(m, LT_WK, aw, daw, s, m->dln, m->dk, s->ln1));
    return lora_bwd(m, LT_WV, aw, daw, s, m->dln, m->dv, s->ln1);
}

// ----------------------------------------------------------------------------
// forward

// Decoder layer l: resid[l] -> resid[l + 1], keeping activations in `s`; aw = the layer's
// adapter unit (NULL without LoRA).
static int layer_forward(model *m, int l, void *w, void *aw, layer_acts *s) {
    const backend *be = m->be;
    const llama_config *c = &m->cfg;
    const int B = m->B, T = m->T, N = B * T, C = c->hidden_size, F = c->intermediate_size;
    const int H = c->num_attention_heads, KVH = c->num_key_value_heads, D = c->head_dim;
    const size_t *o = m->layout->layer_off;
    void *x = m->resid[l];                                           // (N, C)

    TRY(be->rmsnorm_fwd(s->ln1, s->ln1_rstd, NULL, x, at(m, w, o[LT_ATTN_NORM]), N, C, c->rms_norm_eps));
    TRY(attn_qkv_fwd(m, w, aw, s));
    TRY(be->attention_fwd(s->att, s->lse, s->q, s->k, s->v, B, T, H, KVH, D, m->seg_cur));
    TRY(be->matmul_fwd(s->h, s->att, at(m, w, o[LT_WO]), x, N, H * D, C));   // (N, C) h = x + o_proj(att)
    TRY(lora_fwd(m, LT_WO, aw, s, s->h, s->att));

    TRY(be->rmsnorm_fwd(s->ln2, s->ln2_rstd, NULL, s->h, at(m, w, o[LT_MLP_NORM]), N, C, c->rms_norm_eps));
    TRY(mlp_gate_up_fwd(m, w, aw, s));
    if (mlp_fused(m)) TRY(be->swiglu_fwd(s->act, NULL, s->gu, at(m, s->gu, F), N, F, 2 * F));
    else TRY(be->swiglu_fwd(s->act, NULL, s->gu, at(m, s->gu, (size_t)N * F), N, F, F));
    TRY(be->matmul_fwd(m->resid[l + 1], s->act, at(m, w, o[LT_WDOWN]), s->h, N, F, C));   // (N, C) h + down(act)
    TRY(lora_fwd(m, LT_WDOWN, aw, s, m->resid[l + 1], s->act));
    return 0;
}

static layer_acts *acts_of(model *m, int l) { return &m->acts[m->n_act_sets == 1 ? 0 : l]; }

// The adapters' unit u into *aw (LoRA), or *aw = NULL without LoRA.
static int adapters_acquire(model *m, int u, int for_backward, void **aw) {
    *aw = NULL;
    return m->lora ? m->adapters.acquire(m->adapters.ctx, u, for_backward, aw) : 0;
}
static int adapters_release(model *m, int u) { return m->lora ? m->adapters.release(m->adapters.ctx, u) : 0; }

// Release the root units of the base and the adapters (the end of a forward or a step).
static int roots_release(model *m, const unit_provider *p) {
    TRY(adapters_release(m, m->cfg.num_hidden_layers));
    return p->release(p->ctx, m->cfg.num_hidden_layers);
}

// One input array to the backend: through `stage` (a pinned slot, backend.upload under
// `ticket`) or, stage NULL, with copy_h2d.
static int input_put(model *m, int32_t *dst, const int32_t *src, size_t bytes, int32_t *stage, int ticket) {
    if (!stage) return m->be->copy_h2d(dst, src, bytes);
    if (stage != src) memcpy(stage, src, bytes);
    return m->be->upload(dst, stage, bytes, ticket);
}

// A micro-batch's rows to the backend: the tokens, the targets (NULL: none, the logits'
// forward) and, with --pack_attention per_game (model_set_segments), the segment starts built
// from the tokens (handed to the rope and attention ops; otherwise seg_cur NULL, one sequence
// per row). With backend.upload, through the two pinned slots in turn: slot s is refilled only
// after copy_wait of the uploads that last read it, two micro-batches back (long finished:
// a whole micro-batch was issued behind them, and backend.pace keeps the host near the
// device), so the host does not wait for the device here; without it, copy_h2d (the CPU).
static int inputs_upload(model *m, const int32_t *tokens, const int32_t *targets) {
    const size_t N = (size_t)m->B * m->T, bytes = N * sizeof(int32_t);
    int32_t *stage = NULL;
#ifdef FT_FAULT_UPLOAD_NO_WAIT
    // TEST-ONLY FAULT (tests/test_cuda_emu_hazards.sh): one slot, refilled without waiting for
    // the uploads that read it; the emulated runtime must report the host's write
    const int ticket = BACKEND_TICKET_UPLOAD;
    stage = m->up_host[0];
#else
    const int ticket = BACKEND_TICKET_UPLOAD + m->up_slot;
    if (m->up_host[0]) {
        TRY(m->be->copy_wait(ticket));
        stage = m->up_host[m->up_slot];
        m->up_slot ^= 1;
    }
#endif
    TRY(input_put(m, m->tokens, tokens, bytes, stage, ticket));
    if (targets) TRY(input_put(m, m->targets, targets, bytes, stage ? stage + N : NULL, ticket));
    m->seg_cur = NULL;
    if (m->seg_bos < 0) return 0;
    int32_t *seg = stage ? stage + 2 * N : m->seg_host;
    model_segment_starts(tokens, m->B, m->T, m->seg_bos, seg);
    TRY(input_put(m, m->seg, seg, bytes, stage ? seg : NULL, ticket));
    m->seg_cur = m->seg;
    return 0;
}

// Embedding and all decoder layers; leaves the root unit acquired in *root.
static int forward_trunk(model *m, const unit_provider *p, void **root) {
    const llama_config *c = &m->cfg;
    const int N = m->B * m->T, C = c->hidden_size;
    void *aroot;   // the adapters' root is empty; acquiring it starts their layer 0's gather
    TRY(p->acquire(p->ctx, c->num_hidden_layers, 0, root));
    TRY(adapters_acquire(m, c->num_hidden_layers, 0, &aroot));
    TRY(m->be->embedding_fwd(m->resid[0], m->tokens, at(m, *root, m->layout->root_off[RT_EMBED]),
                             N, C, c->vocab_size));
    for (int l = 0; l < c->num_hidden_layers; l++) {
        void *w, *aw;
        TRY(p->acquire(p->ctx, l, 0, &w));
        TRY(adapters_acquire(m, l, 0, &aw));
        TRY(layer_forward(m, l, w, aw, acts_of(m, l)));
        TRY(adapters_release(m, l));
        TRY(p->release(p->ctx, l));
        if (m->be->pace) TRY(m->be->pace());   // the host at most BACKEND_PACE_LAG layers ahead
    }
    TRY(m->be->rmsnorm_fwd(m->lnf, m->lnf_rstd, NULL, m->resid[c->num_hidden_layers],
                           at(m, *root, m->layout->root_off[RT_NORM]), N, C, c->rms_norm_eps));
    return 0;
}

static size_t lm_head_offset(const model *m) {
    return m->cfg.tie_word_embeddings ? m->layout->root_off[RT_EMBED] : m->layout->root_off[RT_LMHEAD];
}

int model_logits_rows(model *m, const unit_provider *p, const int32_t *tokens, int row0, int nrows,
                      float *logits) {
    const llama_config *c = &m->cfg;
    const int N = m->B * m->T, C = c->hidden_size, V = c->vocab_size;
    if (row0 < 0 || nrows < 1 || row0 + nrows > N)
        return ft_error("model: logits rows [%d, %d) outside the %d rows of the micro-batch", row0, row0 + nrows, N);
    // logits in row chunks through the workspace (fp32-sized, so a bf16 chunk fits too), in
    // the backend's dtype, widened to fp32 on the host (sampling, golden tests)
    const int chunk = m->lmhead_rows;
    uint16_t *half = NULL;
    if (m->be->dtype != ST_F32) CHECK_ALLOC(half = malloc((size_t)chunk * V * 2), (size_t)chunk * V * 2);
    void *root;
    int rc = inputs_upload(m, tokens, NULL);
    if (rc == 0) rc = forward_trunk(m, p, &root);
    for (int r = 0; rc == 0 && r < nrows; r += chunk) {
        const int rows = nrows - r < chunk ? nrows - r : chunk;
        const size_t n = (size_t)rows * V;
        float *dst = logits + (size_t)r * V;   // (rows, V)
        // (the lm_head in bf16 under --fp8 too: the wrapper's inner backend)
        rc = fp8_linear_unwrap(m->be)->matmul_fwd(m->logits_ws, at(m, m->lnf, (size_t)(row0 + r) * C),
                                                  at(m, root, lm_head_offset(m)), NULL, rows, C, V);
        if (rc == 0 && !half) rc = m->be->copy_d2h(dst, m->logits_ws, n * sizeof(float));
        if (rc == 0 && half) {
            rc = m->be->copy_d2h(half, m->logits_ws, n * 2);
            for (size_t i = 0; rc == 0 && i < n; i++)
                dst[i] = m->be->dtype == ST_BF16 ? ft_bf16_to_f32(half[i]) : ft_f16_to_f32(half[i]);
        }
    }
    free(half);
    TRY(rc);
    return roots_release(m, p);
}

int model_logits(model *m, const unit_provider *p, const int32_t *tokens, float *logits) {
    return model_logits_rows(m, p, tokens, 0, m->B * m->T, logits);
}

// ----------------------------------------------------------------------------
// backward

// Decoder layer l: on entry m->dresid holds dL/d resid[l+1]; on exit dL/d resid[l]. dw is
// the base gradient unit (NULL: frozen base, LoRA), aw / daw the adapter unit and its
// gradient (NULL without LoRA).
static int layer_backward(model *m, int l, void *w, void *dw, void *aw, void *daw, layer_acts *s) {
    const backend *be = m->be;
    const llama_config *c = &m->cfg;
    const int B = m->B, T = m->T, N = B * T, C = c->hidden_size, F = c->intermediate_size;
    const int H = c->num_attention_heads, KVH = c->num_key_value_heads, D = c->head_dim;
    const size_t *o = m->layout->layer_off;
    void *x = m->resid[l];

    // MLP branch: resid[l+1] = h + down(swiglu(gate|up(ln2)))
    TRY(be->matmul_bwd(m->dact, grad_at(m, dw, o[LT_WDOWN]), m->gdt, m->dresid, s->act, at(m, w, o[LT_WDOWN]), N, F, C, 0, !m->gfresh));
    TRY(lora_bwd(m, LT_WDOWN, aw, daw, s, m->dact, m->dresid, s->act));
    TRY(mlp_gate_up_bwd(m, w, dw, aw, daw, s));
    TRY(be->rmsnorm_bwd(m->dresid, norm_grad_at(m, dw, o[LT_MLP_NORM]), norm_gdt(m, dw), m->dln, s->h, at(m, w, o[LT_MLP_NORM]),
                        s->ln2_rstd, N, C));                          // dresid = dL/dh

    // attention branch: h = x + o_proj(attention(rope(q(ln1)), rope(k(ln1)), v(ln1)))
    TRY(be->matmul_bwd(m->datt, grad_at(m, dw, o[LT_WO]), m->gdt, m->dresid, s->att, at(m, w, o[LT_WO]), N, H * D, C, 0, !m->gfresh));
    TRY(lora_bwd(m, LT_WO, aw, daw, s, m->datt, m->dresid, s->att));
    TRY(be->attention_bwd(m->dq, m->dk, m->dv, m->datt, s->att, s->lse, s->q, s->k, s->v, B, T, H, KVH, D, m->seg_cur));
    TRY(attn_qkv_bwd(m, w, dw, aw, daw, s));
    TRY(be->rmsnorm_bwd(m->dresid, norm_grad_at(m, dw, o[LT_ATTN_NORM]), norm_gdt(m, dw), m->dln, x, at(m, w, o[LT_ATTN_NORM]),
                        s->ln1_rstd, N, C));                          // dresid = dL/dx
    return 0;
}

// A fresh layer gradient unit (unit_grad.fresh) holds arbitrary values: every matrix is
// written by its dW GEMM with beta 0, so only what no GEMM writes is zeroed here, on the
// compute stream before the backward: the norm weights (1-D entries, added into by
// rmsnorm_bwd) and the padding past the layer's elements.
static int grads_fresh_layer(model *m, void *dw, int u) {
    const param_layout *l = m->layout;
    for (int i = 0; i < l->n_entries; i++)
        if (l->entries[i].unit == u && l->entries[i].ndim == 1)
            TRY(m->be->zero(grad_at(m, dw, l->entries[i].unit_offset), l->entries[i].numel * m->gesz));
    const size_t pad = l->unit_numel[u] - l->layer_numel;
    return pad ? m->be->zero(grad_at(m, dw, l->layer_numel), pad * m->gesz) : 0;
}

// Gradient unit u of the base (NULL for a frozen base: LoRA) and of the adapters (NULL
// without LoRA), between the providers' grad_begin and grad_end; its dtype and freshness
// in m->gdt, m->gesz, m->gfresh until the next grads_begin.
static int grads_begin(model *m, const unit_provider *p, int u, void **dw, void **daw) {
    *dw = *daw = NULL;
    unit_grad g = {0};
    if (!m->lora) TRY(p->grad_begin(p->ctx, u, &g));
    else TRY(m->adapters.grad_begin(m->adapters.ctx, u, &g));
    *(m->lora ? daw : dw) = g.data;
    m->gdt = g.dtype;
    m->gesz = st_dtype_size(g.dtype);
    m->gfresh = g.fresh;
    if (!g.fresh) return 0;
    if (m->lora || u >= m->layout->n_layers)
        return ft_error("model: a fresh gradient buffer for unit %d (only a trained layer's may be)", u);
    return grads_fresh_layer(m, g.data, u);
}
static int grads_end(model *m, const unit_provider *p, int u) {
    return m->lora ? m->adapters.grad_end(m->adapters.ctx, u) : p->grad_end(p->ctx, u);
}

// The backward from m->dln = dL/d(final norm output) (lmhead_xent's dx): final norm, the
// decoder layers last to first, the embedding. root / droot: the base root unit and its
// gradient (NULL: frozen); with checkpointing each layer's forward is recomputed first from
// its saved input (the same ops on the same inputs: bitwise the same activations).
static int model_backward(model *m, const unit_provider *p, void *root, void *droot) {
    const backend *be = m->be;
    const llama_config *c = &m->cfg;
    const int N = m->B * m->T, C = c->hidden_size, V = c->vocab_size, L = c->num_hidden_layers;
    const st_dtype root_gdt = m->gdt;   // the root's gradient unit (grads_begin before lm_head)
    TRY(be->zero(m->dresid, (size_t)N * C * m->esz));
    TRY(be->rmsnorm_bwd(m->dresid, norm_grad_at(m, droot, m->layout->root_off[RT_NORM]), norm_gdt(m, droot), m->dln, m->resid[L],
                        at(m, root, m->layout->root_off[RT_NORM]), m->lnf_rstd, N, C));
    for (int l = L - 1; l >= 0; l--) {
        void *w, *aw, *dw, *daw;
        TRY(p->acquire(p->ctx, l, 1, &w));
        TRY(adapters_acquire(m, l, 1, &aw));
        // layer_forward also rewrites resid[l+1]; it recomputes the identical values
        if (m->grad_ckpt) TRY(layer_forward(m, l, w, aw, acts_of(m, l)));
        TRY(grads_begin(m, p, l, &dw, &daw));
        TRY(layer_backward(m, l, w, dw, aw, daw, acts_of(m, l)));
        TRY(grads_end(m, p, l));
        TRY(adapters_release(m, l));
        TRY(p->release(p->ctx, l));
        if (be->pace) TRY(be->pace());
    }
    // the root's gradient unit again (the layers' grads_begin replaced the current unit's state)
    m->gdt = root_gdt;
    m->gesz = st_dtype_size(root_gdt);
    m->gfresh = 0;
    if (droot) TRY(be->embedding_bwd(grad_at(m, droot, m->layout->root_off[RT_EMBED]), m->gdt, m->dresid, m->tokens, N, C, V));
    return grads_end(m, p, L);
}

int model_forward_backward(model *m, const unit_provider *p, const int32_t *tokens, const int32_t *targets,
                           int backward, float dloss, double *loss_sum, int *n_valid) {
    const backend *be = m->be;
    const llama_config *c = &m->cfg;
    const int N = m->B * m->T, C = c->hidden_size, V = c->vocab_size, L = c->num_hidden_layers;

    if (backward && m->buffers == MODEL_FORWARD_ONLY)
        return ft_error("model: a backward asked of a model allocated for the forward only (MODEL_FORWARD_ONLY)");
    TRY(inputs_upload(m, tokens, targets));
    void *root, *droot = NULL, *daroot = NULL;
    TRY(forward_trunk(m, p, &root));
    if (backward) {
        TRY(grads_begin(m, p, L, &droot, &daroot));   // the adapters' root gradient is empty
        if (m->lora) TRY(be->zero(m->norm_sink, (size_t)C * m->esz));
    }
    TRY(be->lmhead_xent(m->losses, backward ? m->dln : NULL, grad_at(m, droot, lm_head_offset(m)), m->gdt, m->lnf,
                        at(m, root, lm_head_offset(m)), m->targets, N, C, V, dloss, m->lmhead_rows, m->logits_ws,
                        backward && droot ? m->lmhead_dw_acc : NULL));
    if (backward) TRY(model_backward(m, p, root, droot));
    // (after the backward is queued, which reads neither: on a GPU the lm_head's loss kernel
    // ran long before, and this kernel waits for nothing but its turn on the stream)
    TRY(be->loss_accumulate(m->loss_acc, m->losses, m->targets, N));
    if (loss_sum) {   // a copy to the host waits for the device
        TRY(be->copy_d2h(m->losses_host, m->losses, (size_t)N * sizeof(float)));
        double sum = 0.0;
        int count = 0;
        for (int i = 0; i < N; i++)
            if (targets[i] != -100) { sum += m->losses_host[i]; count++; }
        *loss_sum = sum;
        if (n_valid) *n_valid = count;
    }
    return roots_release(m, p);
}

int model_loss_reset(model *m) { return m->be->zero(m->loss_acc, 2 * sizeof(double)); }

int model_loss_read(model *m, double *sum, double *count) {
    double acc[2];
    TRY(m->be->copy_d2h(acc, m->loss_acc, sizeof acc));
    *sum = acc[0];
    *count = acc[1];
    return 0;
}

void model_segment_starts(const int32_t *tokens, int B, int T, int bos, int32_t *seg) {
    for (int b = 0; b < B; b++) {
        const int32_t *x = tokens + (size_t)b * T;
        int32_t *s = seg + (size_t)b * T, start = 0;   // a row that starts mid-game: a segment at 0
        for (int t = 0; t < T; t++) {
            if (x[t] == bos) start = t;
            s[t] = start;
        }
    }
}

void model_set_segments(model *m, int bos) { m->seg_bos = bos; }

int model_set_seq_len(model *m, int T) {
    if (T < 1 || T > m->T_alloc)
        return ft_error("model: sequence length %d outside [1, %d] (the allocated length)", T, m->T_alloc);
    m->T = T;
    return 0;
}
