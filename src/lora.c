// lora.c: LoRA target parsing, validation and the adapters' flat layout (see lora.h).
#include "lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "rng.h"

// ----------------------------------------------------------------------------
// targets

// flag spelling and PEFT module name of each projection, in layer storage order
static const struct { int t; const char *flag; const char *module; const char *block; } lora_projs[] = {
    {LT_WQ, "q", "q_proj", "self_attn"},   {LT_WK, "k", "k_proj", "self_attn"},
    {LT_WV, "v", "v_proj", "self_attn"},   {LT_WO, "o", "o_proj", "self_attn"},
    {LT_WGATE, "gate", "gate_proj", "mlp"}, {LT_WUP, "up", "up_proj", "mlp"},
    {LT_WDOWN, "down", "down_proj", "mlp"},
};
#define LORA_N_PROJS ((int)(sizeof lora_projs / sizeof lora_projs[0]))

static int proj_index(int t) {
    for (int i = 0; i < LORA_N_PROJS; i++)
        if (lora_projs[i].t == t) return i;
    return -1;
}

int lora_parse_targets(const char *list, unsigned *targets) {
    unsigned mask = 0;
    const char *p = list;
    for (;;) {
        const char *end = strchr(p, ',');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        int found = -1;
        for (int i = 0; i < LORA_N_PROJS && found < 0; i++)
            if (strlen(lora_projs[i].flag) == len && strncmp(p, lora_projs[i].flag, len) == 0) found = i;
        if (found < 0)
            return ft_error("--lora_targets: unknown target '%.*s' in '%s' (known: q,k,v,o,gate,up,down)", (int)len, p,
                            list);
        mask |= 1u << lora_projs[found].t;
        if (!end) break;
        p = end + 1;
    }
    *targets = mask;
    return 0;
}

void lora_targets_string(unsigned targets, char *buf, size_t n) {
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < LORA_N_PROJS && k < n; i++)
        if (targets & (1u << lora_projs[i].t))
            k += (size_t)snprintf(buf + k, n - k, "%s%s", k ? "," : "", lora_projs[i].flag);
}

const char *lora_module_name(int t) {
    const int i = proj_index(t);
    return i < 0 ? NULL : lora_projs[i].module;
}

void lora_proj_dims(const llama_config *c, int t, int *in, int *out) {
    const int C = c->hidden_size, F = c->intermediate_size;
    const int QD = c->num_attention_heads * c->head_dim, KVD = c->num_key_value_heads * c->head_dim;
    switch (t) {
    case LT_WQ: *in = C; *out = QD; break;
    case LT_WK: case LT_WV: *in = C; *out = KVD; break;
    case LT_WO: *in = QD; *out = C; break;
    case LT_WGATE: case LT_WUP: *in = C; *out = F; break;
    default: *in = F; *out = C; break;   // LT_WDOWN
    }
}

int lora_validate(const lora_config *lc, const llama_config *cfg) {
    if (lc->rank < 1) return ft_error("--lora_rank: %d is not a positive rank", lc->rank);
    if (!(lc->alpha > 0.0f) || !isfinite(lc->alpha))
        return ft_error("--lora_alpha: %g is not a positive finite number", (double)lc->alpha);
    if (!lc->targets) return ft_error("--lora_targets: no target projection");
    for (int i = 0; i < LORA_N_PROJS; i++) {
        if (!(lc->targets & (1u << lora_projs[i].t))) continue;
        int in, out;
        lora_proj_dims(cfg, lora_projs[i].t, &in, &out);
        const int lim = in < out ? in : out;
        if (lc->rank > lim)
            return ft_error("--lora_rank: %d is larger than %s's min(in %d, out %d) = %d", lc->rank,
                            lora_projs[i].module, in, out, lim);
    }
    return 0;
}

float lora_scaling(const lora_config *lc) { return lc->alpha / (float)lc->rank; }

double lora_layer_params(const llama_config *cfg, const lora_config *lc) {
    double n = 0;
    for (int t = 0; t < LT_COUNT; t++) {
        if (!(lc->targets & (1u << t))) continue;
        int in, out;
        lora_proj_dims(cfg, t, &in, &out);
        n += (double)lc->rank * (in + out);   // A (r, in) and B (out, r)
    }
    return n;
}

// ----------------------------------------------------------------------------
// layout

static size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

static void lora_entry_set(param_entry *e, int layer, int i, const char *ab, size_t base, size_t off, int64_t rows,
                           int64_t cols) {
    snprintf(e->name, sizeof e->name, "base_model.model.model.layers.%d.%s.%s.%s.weight", layer,
             lora_projs[i].block, lora_projs[i].module, ab);
    e->unit = layer;
    e->unit_offset = off;
    e->offset = base + off;
    e->ndim = 2;
    e->shape[0] = rows;
    e->shape[1] = cols;
    e->numel = (size_t)rows * (size_t)cols;
    e->decay = 1;
}

int lora_layout_init(lora_layout *ll, const llama_config *cfg, const lora_config *lc, size_t pad_multiple) {
    memset(ll, 0, sizeof *ll);
    TRY(lora_validate(lc, cfg));
    ll->lc = *lc;
    param_layout *l = &ll->layout;
    const int L = cfg->num_hidden_layers;
    const size_t r = (size_t)lc->rank;
    l->cfg = *cfg;
    l->n_layers = L;
    l->n_units = L + 1;
    l->pad_multiple = pad_multiple ? pad_multiple : 1;
    int per_layer = 0;
    size_t off = 0;
    for (int i = 0; i < LORA_N_PROJS; i++) {
        const int t = lora_projs[i].t;
        if (!(lc->targets & (1u << t))) continue;
        lora_proj_dims(cfg, t, &ll->in[t], &ll->out[t]);
        if (ll->out[t] > ll->max_out) ll->max_out = ll->out[t];
        ll->a_off[t] = off;
        off += r * (size_t)ll->in[t];
        ll->b_off[t] = off;
        off += (size_t)ll->out[t] * r;
        per_layer += 2;
    }
    l->layer_numel = off;
    l->root_numel = 0;
    l->unit_numel = ft_calloc((size_t)l->n_units, sizeof(size_t), "adapter unit sizes");
    l->unit_offset = ft_calloc((size_t)l->n_units, sizeof(size_t), "adapter unit offsets");
    l->n_entries = L * per_layer;
    l->entries = ft_calloc((size_t)l->n_entries, sizeof(param_entry), "adapter table");
    if (!l->unit_numel || !l->unit_offset || !l->entries) { lora_layout_free(ll); return -1; }
    size_t base = 0;
    int e = 0;
    for (int u = 0; u < l->n_units; u++) {
        l->unit_offset[u] = base;
        l->unit_numel[u] = u < L ? round_up(l->layer_numel, l->pad_multiple) : l->pad_multiple;
        for (int i = 0; u < L && i < LORA_N_PROJS; i++) {
            const int t = lora_projs[i].t;
            if (!(lc->targets & (1u << t))) continue;
            lora_entry_set(&l->entries[e++], u, i, "lora_A", base, ll->a_off[t], (int64_t)r, ll->in[t]);
            lora_entry_set(&l->entries[e++], u, i, "lora_B", base, ll->b_off[t], ll->out[t], (int64_t)r);
        }
        base += l->unit_numel[u];
    }
    l->total = base;
    l->n_params = (size_t)L * l->layer_numel;
    return 0;
}

void lora_init_unit(const lora_layout *ll, int u, uint64_t seed, float *host) {
    const param_layout *l = &ll->layout;
    memset(host, 0, l->unit_numel[u] * sizeof(float));
    if (u >= l->n_layers) return;
    uint64_t state = seed * 0x9e3779b97f4a7c15ull + (uint64_t)u + 1;
    for (int t = 0; t < LT_COUNT; t++) {
        if (!(ll->lc.targets & (1u << t))) continue;
        const double bound = 1.0 / sqrt((double)ll->in[t]);
        float *a = host + ll->a_off[t];   // (r, in); B stays 0
        for (size_t i = 0; i < (size_t)ll->lc.rank * (size_t)ll->in[t]; i++)
            a[i] = (float)((2.0 * rng_uniform(&state) - 1.0) * bound);
    }
}

void lora_merge_unit(const lora_layout *ll, const param_layout *base_layout, int u, const float *adapters,
                     float *base) {
    if (u >= ll->layout.n_layers) return;
    const int r = ll->lc.rank;
    const float s = lora_scaling(&ll->lc);
    for (int t = 0; t < LT_COUNT; t++) {
        if (!(ll->lc.targets & (1u << t))) continue;
        const int in = ll->in[t], out = ll->out[t];
        const float *A = adapters + ll->a_off[t], *B = adapters + ll->b_off[t];   // (r, in), (out, r)
        float *W = base + base_layout->layer_off[t];                               // (out, in)
#pragma omp parallel for
        for (int o = 0; o < out; o++)
            for (int k = 0; k < r; k++) {
                const float b = s * B[(size_t)o * r + k];
                for (int i = 0; i < in; i++) W[(size_t)o * in + i] += b * A[(size_t)k * in + i];
            }
    }
}

void lora_layout_free(lora_layout *ll) {
    param_layout_free(&ll->layout);
    memset(ll, 0, sizeof *ll);
}

// ----------------------------------------------------------------------------
// the adapter path of one projection

int lora_proj_fwd(const backend *be, float s, void *y, void *u, const void *x, const void *A, const void *B, int N,
                  int in, int out, int r) {
    TRY(be->matmul_fwd(u, x, A, NULL, N, in, r));     // (N, r) = x A^T
    TRY(be->scale(u, u, s, (size_t)N * r));           // u = s x A^T
    return be->matmul_fwd(y, u, B, y, N, r, out);     // (N, out) y += u B^T
}

int lora_proj_bwd(const backend *be, float s, void *dx, void *dA, void *dB, st_dtype gdt, void *du, const void *dy,
                  const void *x, const void *u, const void *A, const void *B, int N, int in, int out, int r) {
    TRY(be->matmul_bwd(du, dB, gdt, dy, u, B, N, r, out, 0, 1));   // du = dy B (N, r); dB += dy^T u
    TRY(be->scale(du, du, s, (size_t)N * r));                   // d(x A^T) = s dy B
    return be->matmul_bwd(dx, dA, gdt, du, x, A, N, in, r, 1, 1);  // dx += du A; dA += du^T x
}
