// param_layout.c: the parameter layout (see param_layout.h).
#include "param_layout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"


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
