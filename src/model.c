// model.c: parameter layout, RoPE tables, and the Llama forward/backward over the backend
// table (see model.h). Written once for every backend and every precision: tensors are
// addressed in elements of the backend's storage dtype through `at()`.
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

// ----------------------------------------------------------------------------
// parameter layout

static size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

static void entry_set(param_entry *e, const char *name, int unit, size_t unit_base,
                      size_t unit_offset, int ndim, int64_t d0, int64_t d1) {
    snprintf(e->name, sizeof e->name, "%s", name);
    e->unit = unit;
    e->unit_offset = unit_offset;
    e->offset = unit_base + unit_offset;
    e->ndim = ndim;
    e->shape[0] = d0;
    e->shape[1] = ndim == 2 ? d1 : 1;
    e->numel = (size_t)d0 * (size_t)(ndim == 2 ? d1 : 1);
    e->decay = ndim == 2;
}

int param_layout_init(param_layout *l, const llama_config *c, size_t pad_multiple) {
    memset(l, 0, sizeof *l);
    l->cfg = *c;
    const size_t C = c->hidden_size, F = c->intermediate_size, V = c->vocab_size;
    const size_t QD = (size_t)c->num_attention_heads * c->head_dim;
    const size_t KVD = (size_t)c->num_key_value_heads * c->head_dim;
    const int L = c->num_hidden_layers;
    l->n_layers = L;
    l->n_units = L + 1;
    l->pad_multiple = pad_multiple ? pad_multiple : 1;

    // sizes of one layer's tensors, in storage order
    const size_t layer_sizes[LT_COUNT] = {C, QD * C, KVD * C, KVD * C, C * QD, C, F * C, F * C, C * F};
    size_t off = 0;
    for (int t = 0; t < LT_COUNT; t++) { l->layer_off[t] = off; off += layer_sizes[t]; }
    l->layer_numel = off;
    const size_t root_sizes[RT_COUNT] = {V * C, C, c->tie_word_embeddings ? 0 : V * C};
    off = 0;
    for (int t = 0; t < RT_COUNT; t++) { l->root_off[t] = off; off += root_sizes[t]; }
    l->root_numel = off;

    l->unit_numel = ft_calloc((size_t)l->n_units, sizeof(size_t), "unit sizes");
    l->unit_offset = ft_calloc((size_t)l->n_units, sizeof(size_t), "unit offsets");
    l->n_entries = L * LT_COUNT + (c->tie_word_embeddings ? 2 : 3);
    l->entries = ft_calloc((size_t)l->n_entries, sizeof(param_entry), "parameter table");
    if (!l->unit_numel || !l->unit_offset || !l->entries) { param_layout_free(l); return -1; }

    size_t base = 0;
    int e = 0;
    char name[96];
    for (int u = 0; u < l->n_units; u++) {
        l->unit_offset[u] = base;
        l->unit_numel[u] = round_up(u < L ? l->layer_numel : l->root_numel, l->pad_multiple);
        if (u < L) {
            static const char *suffix[LT_COUNT] = {
                "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                "mlp.down_proj.weight"};
            const int64_t rows[LT_COUNT] = {C, QD, KVD, KVD, C, C, F, F, C};
            const int64_t cols[LT_COUNT] = {0, C, C, C, QD, 0, C, C, F};
            for (int t = 0; t < LT_COUNT; t++) {
                snprintf(name, sizeof name, "model.layers.%d.%s", u, suffix[t]);
                entry_set(&l->entries[e++], name, u, base, l->layer_off[t], cols[t] ? 2 : 1,
                          rows[t], cols[t]);
            }
        } else {
            entry_set(&l->entries[e++], "model.embed_tokens.weight", u, base, l->root_off[RT_EMBED], 2, V, C);
            entry_set(&l->entries[e++], "model.norm.weight", u, base, l->root_off[RT_NORM], 1, C, 0);
            if (!c->tie_word_embeddings)
                entry_set(&l->entries[e++], "lm_head.weight", u, base, l->root_off[RT_LMHEAD], 2, V, C);
        }
        base += l->unit_numel[u];
    }
    l->total = base;
    l->n_params = (size_t)L * l->layer_numel + l->root_numel;
    return 0;
}

void param_layout_free(param_layout *l) {
    free(l->unit_numel);
    free(l->unit_offset);
    free(l->entries);
    memset(l, 0, sizeof *l);
}

const param_entry *param_layout_find(const param_layout *l, const char *name) {
    for (int i = 0; i < l->n_entries; i++)
        if (strcmp(l->entries[i].name, name) == 0) return &l->entries[i];
    return NULL;
}

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

double model_flops_per_token(const llama_config *c, double T) {
    const double L = c->num_hidden_layers;
    const double matmul_params = L * model_layer_matmul_params(c) + (double)c->vocab_size * c->hidden_size;
    // forward 2, backward 4 FLOPs per parameter per token; attention backward = 2 x forward
    return 6 * matmul_params + 3 * L * model_attention_fwd_flops(c, T);
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
static void layer_acts_table(mem_table *t, mem_category cat, const char *what, const llama_config *c, size_t B,
                             size_t T, size_t esz, layer_acts *s) {
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
    mem_table_add(t, cat, N * F * esz, what, SLOT(s, gate));             // (N, F)
    mem_table_add(t, cat, N * F * esz, what, SLOT(s, up));               // (N, F)
    mem_table_add(t, cat, N * F * esz, what, SLOT(s, act));              // (N, F)
}

// FT_LMHEAD_CHUNK_ROWS (test-only): the row cap it sets, 0 when unset; -1 when not an integer
// in [1, LMHEAD_CHUNK_ROWS_MAX]
static int lmhead_chunk_env(const char **text) {
    const char *s = getenv("FT_LMHEAD_CHUNK_ROWS");
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

void model_buffer_table(mem_table *t, const llama_config *c, int B, int T, int grad_ckpt, size_t esz, model *m) {
    const size_t N = (size_t)B * T, C = c->hidden_size, V = c->vocab_size, F = c->intermediate_size;
    const size_t QD = (size_t)c->num_attention_heads * c->head_dim;
    const size_t KVD = (size_t)c->num_key_value_heads * c->head_dim;
    const size_t rope = (size_t)T * (size_t)(c->head_dim / 2) * sizeof(float);   // (T, D/2)
    const size_t chunk = (size_t)model_lmhead_chunk_rows((int)N, (int)V);
    const int L = c->num_hidden_layers;

    // activations: what the forward keeps for the backward
    for (int l = 0; l <= L; l++)
        mem_table_add(t, MEM_ACTIVATIONS, N * C * esz, "residual stream: every layer's input + the output",
                      m ? (void *)&m->resid[l] : NULL);
    for (int l = 0; l < L && !grad_ckpt; l++)
        layer_acts_table(t, MEM_ACTIVATIONS, "every layer's saved activations (norms, q, k, v, attention, MLP)", c,
                         (size_t)B, (size_t)T, esz, m ? &m->acts[l] : NULL);
    mem_table_add(t, MEM_ACTIVATIONS, N * C * esz, "final norm output + rstd", SLOT(m, lnf));
    mem_table_add(t, MEM_ACTIVATIONS, N * sizeof(float), "final norm output + rstd", SLOT(m, lnf_rstd));

    // workspace: the recompute set (checkpointing), tables, the logits chunk, backward scratch
    if (grad_ckpt)
        layer_acts_table(t, MEM_WORKSPACE, "one layer's activations, recomputed in backward", c, (size_t)B,
                         (size_t)T, esz, m ? &m->acts[0] : NULL);
    const char *io = "RoPE tables, tokens, targets, losses";
    mem_table_add(t, MEM_WORKSPACE, rope, io, SLOT(m, rope_cos));
    mem_table_add(t, MEM_WORKSPACE, rope, io, SLOT(m, rope_sin));
    mem_table_add(t, MEM_WORKSPACE, N * sizeof(int32_t), io, SLOT(m, tokens));
    mem_table_add(t, MEM_WORKSPACE, N * sizeof(int32_t), io, SLOT(m, targets));
    mem_table_add(t, MEM_WORKSPACE, N * sizeof(float), io, SLOT(m, losses));
    if (m) m->lmhead_rows = (int)chunk;
    mem_table_add(t, MEM_WORKSPACE, chunk * V * sizeof(float), "fp32 logits of one lm_head row chunk",
                  SLOT(m, logits_ws));
    // several chunks on a bf16 backend: lm_head's dW summed over them in fp32, rounded once
    if (N > chunk && esz != sizeof(float))
        mem_table_add(t, MEM_WORKSPACE, V * C * sizeof(float), "fp32 lm_head weight gradient over the row chunks",
                      SLOT(m, lmhead_dw_acc));
    const char *bwd = "backward scratch of one layer + branch output";
    mem_table_add(t, MEM_WORKSPACE, N * C * esz, bwd, SLOT(m, proj));
    mem_table_add(t, MEM_WORKSPACE, N * C * esz, bwd, SLOT(m, dresid));
    mem_table_add(t, MEM_WORKSPACE, N * C * esz, bwd, SLOT(m, dln));
    mem_table_add(t, MEM_WORKSPACE, N * QD * esz, bwd, SLOT(m, dq));
    mem_table_add(t, MEM_WORKSPACE, N * QD * esz, bwd, SLOT(m, datt));
    mem_table_add(t, MEM_WORKSPACE, N * KVD * esz, bwd, SLOT(m, dk));
    mem_table_add(t, MEM_WORKSPACE, N * KVD * esz, bwd, SLOT(m, dv));
    mem_table_add(t, MEM_WORKSPACE, N * F * esz, bwd, SLOT(m, dgate));
    mem_table_add(t, MEM_WORKSPACE, N * F * esz, bwd, SLOT(m, dup));
    mem_table_add(t, MEM_WORKSPACE, N * F * esz, bwd, SLOT(m, dact));
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
               int grad_ckpt) {
    memset(m, 0, sizeof *m);
    const llama_config *cfg = &layout->cfg;
    m->cfg = *cfg;
    m->layout = layout;
    m->be = be;
    m->mem = mem;
    m->B = B;
    m->T = T;
    m->T_alloc = T;
    m->grad_ckpt = grad_ckpt;
    m->esz = st_dtype_size(be->dtype);
    const int L = cfg->num_hidden_layers;
    m->resid = ft_calloc((size_t)L + 1, sizeof(void *), "residual table");
    m->n_act_sets = grad_ckpt ? 1 : L;
    m->acts = ft_calloc((size_t)m->n_act_sets, sizeof(layer_acts), "activation table");
    m->losses_host = ft_malloc((size_t)B * T * sizeof(float), "host losses");
    if (!m->resid || !m->acts || !m->losses_host) { model_free(m); return -1; }
    mem_table t = mem_table_allocator(mem);
    model_buffer_table(&t, cfg, B, T, grad_ckpt, m->esz, m);
    if (t.failed || model_upload_rope(m) != 0) { model_free(m); return -1; }
    return 0;
}

void model_free(model *m) {
    if (m->resid && m->acts) {   // the same table as model_init, so the same sizes
        mem_table t = mem_table_releaser(m->mem);
        model_buffer_table(&t, &m->cfg, m->B, m->T_alloc, m->grad_ckpt, m->esz, m);
    }
    free(m->resid);
    free(m->acts);
    free(m->losses_host);
    memset(m, 0, sizeof *m);
}

// ----------------------------------------------------------------------------
// forward

// Decoder layer l: resid[l] -> resid[l + 1], keeping activations in `s`.
static int layer_forward(model *m, int l, void *w, layer_acts *s) {
    const backend *be = m->be;
    const llama_config *c = &m->cfg;
    const int B = m->B, T = m->T, N = B * T, C = c->hidden_size, F = c->intermediate_size;
    const int H = c->num_attention_heads, KVH = c->num_key_value_heads, D = c->head_dim;
    const size_t *o = m->layout->layer_off;
    void *x = m->resid[l];                                           // (N, C)

    TRY(be->rmsnorm_fwd(s->ln1, s->ln1_rstd, x, at(m, w, o[LT_ATTN_NORM]), N, C, c->rms_norm_eps));
    TRY(be->matmul_fwd(s->q, s->ln1, at(m, w, o[LT_WQ]), N, C, H * D));      // (N, H*D)
    TRY(be->matmul_fwd(s->k, s->ln1, at(m, w, o[LT_WK]), N, C, KVH * D));    // (N, KVH*D)
    TRY(be->matmul_fwd(s->v, s->ln1, at(m, w, o[LT_WV]), N, C, KVH * D));    // (N, KVH*D)
    TRY(be->rope_fwd(s->q, s->q, m->rope_cos, m->rope_sin, B, T, H, D));
    TRY(be->rope_fwd(s->k, s->k, m->rope_cos, m->rope_sin, B, T, KVH, D));
    TRY(be->attention_fwd(s->att, s->lse, s->q, s->k, s->v, B, T, H, KVH, D));
    TRY(be->matmul_fwd(m->proj, s->att, at(m, w, o[LT_WO]), N, H * D, C));  // (N, C)
    TRY(be->add(s->h, x, m->proj, (size_t)N * C));

    TRY(be->rmsnorm_fwd(s->ln2, s->ln2_rstd, s->h, at(m, w, o[LT_MLP_NORM]), N, C, c->rms_norm_eps));
    TRY(be->matmul_fwd(s->gate, s->ln2, at(m, w, o[LT_WGATE]), N, C, F));   // (N, F)
    TRY(be->matmul_fwd(s->up, s->ln2, at(m, w, o[LT_WUP]), N, C, F));       // (N, F)
    TRY(be->swiglu_fwd(s->act, s->gate, s->up, (size_t)N * F));
    TRY(be->matmul_fwd(m->proj, s->act, at(m, w, o[LT_WDOWN]), N, F, C));   // (N, C)
    TRY(be->add(m->resid[l + 1], s->h, m->proj, (size_t)N * C));
    return 0;
}

static layer_acts *acts_of(model *m, int l) { return &m->acts[m->grad_ckpt ? 0 : l]; }

// Embedding and all decoder layers; leaves the root unit acquired in *root.
static int forward_trunk(model *m, const unit_provider *p, const int32_t *tokens, void **root) {
    const llama_config *c = &m->cfg;
    const int N = m->B * m->T, C = c->hidden_size;
    TRY(m->be->copy_h2d(m->tokens, tokens, (size_t)N * sizeof(int32_t)));
    TRY(p->acquire(p->ctx, c->num_hidden_layers, 0, root));
    TRY(m->be->embedding_fwd(m->resid[0], m->tokens, at(m, *root, m->layout->root_off[RT_EMBED]),
                             N, C, c->vocab_size));
    for (int l = 0; l < c->num_hidden_layers; l++) {
        void *w;
        TRY(p->acquire(p->ctx, l, 0, &w));
        TRY(layer_forward(m, l, w, acts_of(m, l)));
        TRY(p->release(p->ctx, l));
    }
    TRY(m->be->rmsnorm_fwd(m->lnf, m->lnf_rstd, m->resid[c->num_hidden_layers],
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
    int rc = forward_trunk(m, p, tokens, &root);
    for (int r = 0; rc == 0 && r < nrows; r += chunk) {
        const int rows = nrows - r < chunk ? nrows - r : chunk;
        const size_t n = (size_t)rows * V;
        float *dst = logits + (size_t)r * V;   // (rows, V)
        rc = m->be->matmul_fwd(m->logits_ws, at(m, m->lnf, (size_t)(row0 + r) * C), at(m, root, lm_head_offset(m)),
                               rows, C, V);
        if (rc == 0 && !half) rc = m->be->copy_d2h(dst, m->logits_ws, n * sizeof(float));
        if (rc == 0 && half) {
            rc = m->be->copy_d2h(half, m->logits_ws, n * 2);
            for (size_t i = 0; rc == 0 && i < n; i++)
                dst[i] = m->be->dtype == ST_BF16 ? ft_bf16_to_f32(half[i]) : ft_f16_to_f32(half[i]);
        }
    }
    free(half);
    TRY(rc);
    return p->release(p->ctx, c->num_hidden_layers);
}

int model_logits(model *m, const unit_provider *p, const int32_t *tokens, float *logits) {
    return model_logits_rows(m, p, tokens, 0, m->B * m->T, logits);
}

// ----------------------------------------------------------------------------
// backward

// Decoder layer l: on entry m->dresid holds dL/d resid[l+1]; on exit dL/d resid[l].
static int layer_backward(model *m, int l, void *w, void *dw, layer_acts *s) {
    const backend *be = m->be;
    const llama_config *c = &m->cfg;
    const int B = m->B, T = m->T, N = B * T, C = c->hidden_size, F = c->intermediate_size;
    const int H = c->num_attention_heads, KVH = c->num_key_value_heads, D = c->head_dim;
    const size_t *o = m->layout->layer_off;
    void *x = m->resid[l];

    // MLP branch: resid[l+1] = h + down(swiglu(gate(ln2), up(ln2)))
    TRY(be->matmul_bwd(m->dact, at(m, dw, o[LT_WDOWN]), m->dresid, s->act, at(m, w, o[LT_WDOWN]), N, F, C, 0));
    TRY(be->swiglu_bwd(m->dgate, m->dup, m->dact, s->gate, s->up, (size_t)N * F));
    TRY(be->matmul_bwd(m->dln, at(m, dw, o[LT_WGATE]), m->dgate, s->ln2, at(m, w, o[LT_WGATE]), N, C, F, 0));
    TRY(be->matmul_bwd(m->dln, at(m, dw, o[LT_WUP]), m->dup, s->ln2, at(m, w, o[LT_WUP]), N, C, F, 1));
    TRY(be->rmsnorm_bwd(m->dresid, at(m, dw, o[LT_MLP_NORM]), m->dln, s->h, at(m, w, o[LT_MLP_NORM]),
                        s->ln2_rstd, N, C));                          // dresid = dL/dh

    // attention branch: h = x + o_proj(attention(rope(q(ln1)), rope(k(ln1)), v(ln1)))
    TRY(be->matmul_bwd(m->datt, at(m, dw, o[LT_WO]), m->dresid, s->att, at(m, w, o[LT_WO]), N, H * D, C, 0));
    TRY(be->attention_bwd(m->dq, m->dk, m->dv, m->datt, s->att, s->lse, s->q, s->k, s->v, B, T, H, KVH, D));
    TRY(be->rope_bwd(m->dq, m->dq, m->rope_cos, m->rope_sin, B, T, H, D));
    TRY(be->rope_bwd(m->dk, m->dk, m->rope_cos, m->rope_sin, B, T, KVH, D));
    TRY(be->matmul_bwd(m->dln, at(m, dw, o[LT_WQ]), m->dq, s->ln1, at(m, w, o[LT_WQ]), N, C, H * D, 0));
    TRY(be->matmul_bwd(m->dln, at(m, dw, o[LT_WK]), m->dk, s->ln1, at(m, w, o[LT_WK]), N, C, KVH * D, 1));
    TRY(be->matmul_bwd(m->dln, at(m, dw, o[LT_WV]), m->dv, s->ln1, at(m, w, o[LT_WV]), N, C, KVH * D, 1));
    TRY(be->rmsnorm_bwd(m->dresid, at(m, dw, o[LT_ATTN_NORM]), m->dln, x, at(m, w, o[LT_ATTN_NORM]),
                        s->ln1_rstd, N, C));                          // dresid = dL/dx
    return 0;
}

int model_forward_backward(model *m, const unit_provider *p, const int32_t *tokens, const int32_t *targets,
                           int backward, float dloss, double *loss_sum, int *n_valid) {
    const backend *be = m->be;
    const llama_config *c = &m->cfg;
    const int N = m->B * m->T, C = c->hidden_size, V = c->vocab_size, L = c->num_hidden_layers;
    const int root_u = L;

    TRY(be->copy_h2d(m->targets, targets, (size_t)N * sizeof(int32_t)));
    void *root, *droot = NULL;
    TRY(forward_trunk(m, p, tokens, &root));
    if (backward) {
        TRY(p->grad_begin(p->ctx, root_u, &droot));
        TRY(be->lmhead_xent(m->losses, m->dln, at(m, droot, lm_head_offset(m)), m->lnf,
                            at(m, root, lm_head_offset(m)), m->targets, N, C, V, dloss, m->lmhead_rows,
                            m->logits_ws, m->lmhead_dw_acc));
    } else {
        TRY(be->lmhead_xent(m->losses, NULL, NULL, m->lnf, at(m, root, lm_head_offset(m)),
                            m->targets, N, C, V, dloss, m->lmhead_rows, m->logits_ws, NULL));
    }
    TRY(be->copy_d2h(m->losses_host, m->losses, (size_t)N * sizeof(float)));
    double sum = 0.0;
    int count = 0;
    for (int i = 0; i < N; i++)
        if (targets[i] != -100) { sum += m->losses_host[i]; count++; }
    *loss_sum = sum;
    *n_valid = count;
    if (!backward) return p->release(p->ctx, root_u);

    // final norm
    TRY(be->zero(m->dresid, (size_t)N * C * m->esz));
    TRY(be->rmsnorm_bwd(m->dresid, at(m, droot, m->layout->root_off[RT_NORM]), m->dln, m->resid[L],
                        at(m, root, m->layout->root_off[RT_NORM]), m->lnf_rstd, N, C));
    // decoder layers, last to first; with checkpointing, recompute the layer's forward first
    // from its saved input (the same ops on the same inputs: bitwise the same activations)
    for (int l = L - 1; l >= 0; l--) {
        void *w, *dw;
        TRY(p->acquire(p->ctx, l, 1, &w));
        if (m->grad_ckpt) {
            // layer_forward also rewrites resid[l+1]; it recomputes the identical values
            TRY(layer_forward(m, l, w, acts_of(m, l)));
        }
        TRY(p->grad_begin(p->ctx, l, &dw));
        TRY(layer_backward(m, l, w, dw, acts_of(m, l)));
        TRY(p->grad_end(p->ctx, l));
        TRY(p->release(p->ctx, l));
    }
    TRY(be->embedding_bwd(at(m, droot, m->layout->root_off[RT_EMBED]), m->dresid, m->tokens, N, C, V));
    TRY(p->grad_end(p->ctx, root_u));
    return p->release(p->ctx, root_u);
}

int model_set_seq_len(model *m, int T) {
    if (T < 1 || T > m->T_alloc)
        return ft_error("model: sequence length %d outside [1, %d] (the allocated length)", T, m->T_alloc);
    m->T = T;
    return 0;
}
