// test_lora_golden.c: LoRA (rank 4, alpha 8, all seven projections) on the CPU backend
// against PEFT (tests/golden/lora, written by tests/oracle/gen_lora_golden.py): the loss and
// the gradient of every adapter tensor of the first step, then 3 AdamW steps over the adapters
// only (the trainer's schedule_adamw, no clipping) and every adapter tensor after them.
// The base is a one-rank frozen FSDP state (FSDP_FROZEN: working parameters only; a model that
// asked it for gradients fails the step). The adapters live in a one-rank FSDP state over
// their own layout (lora.h), loaded from the PEFT adapter file. Also: the same gradients with
// --gradient_checkpointing, lora_validate's bad input, and the fused gate|up GEMM and q|k|v
// pass under LoRA (check_fused: no gate/up (q/k/v) adapter, against the seven-target model
// with those adapters' B zeroed). Runtime: well under a second.
//
// Thresholds, derived as in test_golden.c / test_train_golden.c: both sides are fp32 with
// different summation orders; gradients agree to NMSE ~1e-12 there, so 1e-9 here leaves
// margin while a missing term is O(1): dropping the scaling s = 2 from B's gradient makes its
// NMSE 1 (0.25 for a factor of 2 on every dB); 3 steps of AdamW at lr 1e-2 amplify rounding
// noise where a gradient is ~0 (test_train_golden.c: NMSE 4e-9 after 5 steps), so final
// adapters 1e-7 NMSE; losses 1e-5 relative.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ckpt.h"
#include "common.h"
#include "fsdp.h"
#include "lora.h"
#include "safetensors.h"
#include "schedule.h"
#include "test.h"

#define DIR "tests/golden/lora"
#define STEPS 3

static const float *golden_f32(const st_file *f, const char *name, size_t numel) {
    const st_tensor *t = st_find(f, name);
    EXPECT(t && t->dtype == ST_F32 && t->numel == numel, "%s: '%s' missing, not F32 or not %zu elements", f->path,
           name, numel);
    return t && t->dtype == ST_F32 && t->numel == numel ? t->data : NULL;
}

// The adapters of the PEFT file into the FSDP state's master weights, unit by unit. 0 / -1.
static int load_adapter(fsdp_state *s, const lora_layout *ll, const st_file *f) {
    const param_layout *l = &ll->layout;
    float *unit = ft_calloc(s->max_unit, sizeof(float), "adapter unit");
    if (!unit) return -1;
    int rc = 0;
    for (int u = 0; u < l->n_units && rc == 0; u++) {
        memset(unit, 0, s->max_unit * sizeof(float));
        for (int i = 0; i < l->n_entries && rc == 0; i++) {
            const param_entry *e = &l->entries[i];
            const float *src = e->unit == u ? golden_f32(f, e->name, e->numel) : NULL;
            if (e->unit == u && !src) rc = -1;
            if (src) memcpy(unit + e->unit_offset, src, e->numel * sizeof(float));
        }
        if (rc == 0) rc = fsdp_set_unit(s, FSDP_MASTER, u, unit);
    }
    free(unit);
    return rc;
}

// Worst NMSE of the adapter tensors in `flat` (the layout's total elements, host fp32)
// against the golden tensors "<prefix><name>"; every tensor must be within max.
static void check_adapters(const lora_layout *ll, const float *flat, const st_file *g, const char *prefix,
                           double max, const char *what) {
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < ll->layout.n_entries; i++) {
        const param_entry *e = &ll->layout.entries[i];
        char name[160];
        snprintf(name, sizeof name, "%s%s", prefix, e->name);
        const float *ref = golden_f32(g, name, e->numel);
        const double err = ref ? test_nmse(flat + e->offset, ref, e->numel) : INFINITY;
        EXPECT(err <= max, "%s: %s NMSE %.3e > %.0e", what, name, err, max);
        if (err >= worst) { worst = err; worst_name = e->name; }
    }
    printf("  %-28s worst %-62s NMSE %.2e (max %.0e)\n", what, worst_name, worst, max);
}

// The fp32 gradient slices (one rank: the whole flat layout) to host memory.
static int grads_to_host(const fsdp_state *s, float *host) {
    return s->be->copy_d2h(host, s->grads, s->n_local * sizeof(float));
}

static void check_validation(const llama_config *cfg) {
    const lora_config bad[] = {{0, 8, LORA_DEFAULT_TARGETS}, {-2, 8, LORA_DEFAULT_TARGETS},
                               {33, 8, 1u << LT_WK},   // k_proj: min(64, 32) = 32
                               {4, 0, LORA_DEFAULT_TARGETS}, {4, 8, 0}};
    const char *flag[] = {"--lora_rank", "--lora_rank", "--lora_rank", "--lora_alpha", "--lora_targets"};
    for (int i = 0; i < 5; i++) {
        ft_error_clear();
        EXPECT(lora_validate(&bad[i], cfg) != 0 && strstr(ft_error_message(), flag[i]),
               "bad LoRA config %d accepted or error without %s: %s", i, flag[i], ft_error_message());
    }
    const lora_config ok32 = {32, 8, 1u << LT_WK};
    EXPECT(lora_validate(&ok32, cfg) == 0, "rank 32 on k_proj (min 32) rejected: %s", ft_error_message());
    unsigned mask = 0;
    EXPECT(lora_parse_targets("q,gate,down,q", &mask) == 0 &&
               mask == ((1u << LT_WQ) | (1u << LT_WGATE) | (1u << LT_WDOWN)),
           "parse q,gate,down: %s", ft_error_message());
    ft_error_clear();
    EXPECT(lora_parse_targets("q,lm_head", &mask) != 0 && strstr(ft_error_message(), "'lm_head'"),
           "unknown target accepted or not named: %s", ft_error_message());
    char buf[64];
    lora_targets_string(LORA_DEFAULT_TARGETS | (1u << LT_WUP), buf, sizeof buf);
    EXPECT(strcmp(buf, "q,k,v,o,up") == 0, "targets string '%s'", buf);
}

// One forward/backward of the golden batch; the loss (mean over valid targets) into *loss.
static int step(model *m, const unit_provider *base, fsdp_state *s, const int32_t *tok, const int32_t *tgt, int valid,
                double *loss, double *norm) {
    double sum;
    int n;
    TRY(fsdp_zero_grads(s));
    TRY(model_forward_backward(m, base, tok, tgt, 1, 1.0f / (float)valid, &sum, &n));
    *loss = sum / n;
    return fsdp_finish_grads(s, norm);
}

// The fused paths under LoRA: with no adapter on gate or up the model runs the MLP's gate and
// up as one (2F, C) GEMM (src/model.c, mlp_gate_up_fwd/bwd), with one as two. q, k, v are
// always one GEMM (attn_qkv_fwd/bwd); without a q/k/v adapter one pass splits and rotates,
// with one the pass only splits, the adapters add, and RoPE follows in place (backward: RoPE's
// backward, then the gather). The seven-target model `m` over `s` with the adapters in
// `fused` given B = 0 computes the same function as a model without those targets, so the
// adapter gradients they share must agree: fp32 on both sides; for gate|up only the dX sum's
// order differs (one GEMM over 2F against two), for q|k|v the same products in the same
// order (bitwise in practice); NMSE 1e-9 as for the golden gradients above. A wrong stride,
// half or head offset in either path makes the other adapters' gradients O(1) off.
static void check_fused(model *m, const unit_provider *base, fsdp_state *s, const lora_layout *ll,
                        const st_file *adapter, const int32_t *tok, const int32_t *tgt, int valid, unsigned fused,
                        const char *what) {
    const llama_config *cfg = &ll->layout.cfg;
    const lora_config lc2 = {ll->lc.rank, ll->lc.alpha, ll->lc.targets & ~fused};
    comm one;
    comm_init_single(&one, s->be);
    mem_tracker mem;
    mem_tracker_init(&mem, s->be);
    lora_layout ll2;
    fsdp_state s2;
    model m2;
    memset(&s2, 0, sizeof s2);
    memset(&m2, 0, sizeof m2);
    float *unit = calloc(s->max_unit, sizeof(float));
    float *ga = calloc(ll->layout.total, sizeof(float)), *gb = NULL;
    int ok = unit && ga && load_adapter(s, ll, adapter) == 0;
    for (int u = 0; ok && u < ll->layout.n_layers; u++) {   // B of the fused targets := 0
        ok = fsdp_get_unit(s, FSDP_MASTER, u, unit) == 0;
        for (int t = 0; t < LT_COUNT; t++)
            if (fused & (1u << t)) memset(unit + ll->b_off[t], 0, (size_t)ll->out[t] * ll->lc.rank * sizeof(float));
        if (ok) ok = fsdp_set_unit(s, FSDP_MASTER, u, unit) == 0;
    }
    ok = ok && lora_layout_init(&ll2, cfg, &lc2, fsdp_pad_multiple(1)) == 0 &&
         fsdp_init_role(&s2, &ll2.layout, s->be, &mem, &one, &one, &(fsdp_setup){.role = FSDP_ADAPTERS}) == 0 &&
         load_adapter(&s2, &ll2, adapter) == 0;
    unit_provider ad2 = fsdp_provider(&s2);
    ok = ok && model_init_lora(&m2, m->layout, &ll2, &ad2, s->be, &mem, m->B, m->T_alloc, 0, 0) == 0 &&
         (gb = calloc(ll2.layout.total, sizeof(float))) != NULL;
    double la = 0, lb = 0, norm;
    ok = ok && step(m, base, s, tok, tgt, valid, &la, &norm) == 0 && grads_to_host(s, ga) == 0 &&
         step(&m2, base, &s2, tok, tgt, valid, &lb, &norm) == 0 && grads_to_host(&s2, gb) == 0;
    EXPECT(ok, "fused %s under LoRA: %s", what, ft_error_message());
    double worst = 0;
    for (int i = 0; ok && i < ll2.layout.n_entries; i++) {
        const param_entry *e = &ll2.layout.entries[i], *f = param_layout_find(&ll->layout, e->name);
        const double err = f ? test_nmse(gb + e->offset, ga + f->offset, e->numel) : INFINITY;
        EXPECT(err <= 1e-9, "fused %s under LoRA: %s gradient NMSE %.3e > 1e-9", what, e->name, err);
        worst = err > worst ? err : worst;
    }
    EXPECT(ok && fabs(la - lb) <= 1e-6 * la, "fused %s under LoRA: loss %.9f vs %.9f", what, lb, la);
    printf("  %s without adapters (the other targets) vs with them at B = 0 (all seven): loss %.7f vs "
           "%.7f, worst shared adapter gradient NMSE %.2e (max 1e-9)\n", what, lb, la, worst);
    free(unit);
    free(ga);
    free(gb);
    model_free(&m2);
    fsdp_free(&s2);
    lora_layout_free(&ll2);
}

int main(void) {
    const backend *be = backend_cpu();
    llama_config cfg;
    st_file gold, adapter;
    if (llama_config_load(&cfg, DIR "/config.json") || st_open(&gold, DIR "/golden.safetensors") ||
        st_open(&adapter, DIR "/adapter/adapter_model.safetensors")) {
        EXPECT(0, "open: %s", ft_error_message());
        TEST_SUMMARY("test_lora_golden");
    }
    check_validation(&cfg);
    const st_tensor *ids = st_find(&gold, "input_ids");
    const int32_t *lab = st_find(&gold, "labels") ? st_find(&gold, "labels")->data : NULL;
    if (!ids || ids->ndim != 2 || !lab) { EXPECT(0, "golden batch missing"); TEST_SUMMARY("test_lora_golden"); }
    const int B = (int)ids->shape[0], T = (int)ids->shape[1];
    int32_t *tgt = malloc((size_t)B * T * sizeof(int32_t));
    int valid = 0;
    for (int i = 0; i < B * T; i++) {
        tgt[i] = i % T + 1 < T ? lab[i + 1] : -100;
        valid += tgt[i] != -100;
    }
    const lora_config lc = {4, 8.0f, LORA_DEFAULT_TARGETS | (1u << LT_WGATE) | (1u << LT_WUP) | (1u << LT_WDOWN)};
    comm one;
    comm_init_single(&one, be);
    mem_tracker mem;
    mem_tracker_init(&mem, be);
    param_layout layout;
    lora_layout ll;
    fsdp_state s, bs;
    model m[2];
    memset(&s, 0, sizeof s);
    memset(&bs, 0, sizeof bs);
    memset(m, 0, sizeof m);
    int ok = param_layout_init(&layout, &cfg, fsdp_pad_multiple(1)) == 0 &&
             lora_layout_init(&ll, &cfg, &lc, fsdp_pad_multiple(1)) == 0 &&
             fsdp_init_role(&bs, &layout, be, &mem, &one, &one, &(fsdp_setup){.role = FSDP_FROZEN}) == 0 &&
             ckpt_load_weights(&bs, DIR) == 0 &&
             fsdp_init_role(&s, &ll.layout, be, &mem, &one, &one, &(fsdp_setup){.role = FSDP_ADAPTERS}) == 0 &&
             load_adapter(&s, &ll, &adapter) == 0;
    EXPECT(ok && ll.layout.n_entries == 28, "setup: %s (%d adapter tensors)", ft_error_message(), ll.layout.n_entries);
    EXPECT(bs.master == NULL && bs.grads == NULL && bs.exp_avg == NULL, "the frozen base holds fp32 or gradient buffers");
    unit_provider base = fsdp_provider(&bs), ad = fsdp_provider(&s);
    for (int k = 0; ok && k < 2; k++)   // k = 1: with gradient checkpointing
        ok = model_init_lora(&m[k], &layout, &ll, &ad, be, &mem, B, T, k, 0) == 0;
    EXPECT(ok, "model: %s", ft_error_message());
    float *g0 = calloc(ll.layout.total, sizeof(float)), *g1 = calloc(ll.layout.total, sizeof(float));
    double loss, loss_ckpt, norm;
    if (ok) ok = step(&m[1], &base, &s, ids->data, tgt, valid, &loss_ckpt, &norm) == 0 && grads_to_host(&s, g1) == 0;
    if (ok) ok = step(&m[0], &base, &s, ids->data, tgt, valid, &loss, &norm) == 0 && grads_to_host(&s, g0) == 0;
    EXPECT(ok, "step: %s", ft_error_message());
    const float *ref = golden_f32(&gold, "loss", 1), *ref_steps = golden_f32(&gold, "step_losses", STEPS);
    if (ok && ref && ref_steps) {
        const double rel = fabs(loss - ref[0]) / ref[0];
        printf("  loss %.7f vs peft %.7f (rel %.1e)\n", loss, ref[0], rel);
        EXPECT(rel <= 1e-5, "loss rel %.2e", rel);
        check_adapters(&ll, g0, &gold, "grad.", 1e-9, "adapter gradients");
        EXPECT(loss == loss_ckpt && memcmp(g0, g1, ll.layout.total * sizeof(float)) == 0,
               "gradient checkpointing changed the loss or the adapter gradients");
        const schedule sched = {.learning_rate = 1e-2, .kind = SCHEDULE_CONSTANT, .total_steps = STEPS, .beta1 = 0.9,
                                .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .max_grad_norm = 0};
        for (int k = 0; ok && k < STEPS; k++) {
            if (k > 0) ok = step(&m[0], &base, &s, ids->data, tgt, valid, &loss, &norm) == 0;
            const double r = fabs(loss - ref_steps[k]) / ref_steps[k];
            printf("  step %d: loss %.7f vs peft %.7f (rel %.1e)\n", k + 1, loss, ref_steps[k], r);
            EXPECT(r <= 1e-5, "step %d loss rel %.2e", k + 1, r);
            const adamw_params ap = schedule_adamw(&sched, k, norm);
            if (ok) ok = fsdp_optimizer_step(&s, &ap) == 0;
        }
        for (int u = 0; ok && u < ll.layout.n_units; u++)
            ok = fsdp_get_unit(&s, FSDP_MASTER, u, g0 + ll.layout.unit_offset[u]) == 0;
        EXPECT(ok, "optimizer: %s", ft_error_message());
        if (ok) check_adapters(&ll, g0, &gold, "final.", 1e-7, "adapters after 3 AdamW steps");
        if (ok) {
            check_fused(&m[0], &base, &s, &ll, &adapter, ids->data, tgt, valid, (1u << LT_WGATE) | (1u << LT_WUP),
                        "gate|up");
            check_fused(&m[0], &base, &s, &ll, &adapter, ids->data, tgt, valid,
                        (1u << LT_WQ) | (1u << LT_WK) | (1u << LT_WV), "q|k|v");
        }
    }
    free(g0);
    free(g1);
    free(tgt);
    for (int k = 0; k < 2; k++) model_free(&m[k]);
    fsdp_free(&s);
    fsdp_free(&bs);
    lora_layout_free(&ll);
    param_layout_free(&layout);
    st_close(&adapter);
    st_close(&gold);
    TEST_SUMMARY("test_lora_golden");
}
