// test_golden.c: the CPU backend against Hugging Face transformers (fp32, CPU), on the
// tiny checkpoints and golden files written by tests/oracle/gen_golden.py:
//   1. logits (B, T, V), the loss, and the gradient of every parameter;
//   2. activation checkpointing: gradients and losses bitwise identical to the plain run,
//      and the activation memory of both runs reported, the saving asserted.
//
// Thresholds (NMSE = sum (ours - ref)^2 / sum ref^2): both sides compute in fp32 with
// different summation orders. Each output is a chain of dot products of length K <= ~200
// (and softmax sums), so the relative error per element is ~sqrt(K) * 2^-24 ~ 1e-6 at most,
// NMSE ~ 1e-12; gradients pass through ~2L more such products, a few times that. We allow
// 1e-9 for logits and gradients (1000x margin; a real bug — a wrong RoPE frequency, a
// missed GQA head mapping, a dropped -100 — gives 1e-4 or more) and 1e-6 relative on the
// scalar loss.
#include <stdio.h>
#include <stdlib.h>

#include "hf_checkpoint.h"
#include "common.h"
#include "model.h"
#include "model_util.h"
#include "test.h"

#define LOGITS_NMSE_MAX 1e-9
#define GRAD_NMSE_MAX 1e-9
#define LOSS_REL_MAX 1e-6

// packed: --pack --pack_attention per_game rows (games found by their BOS; model_set_segments)
// against transformers given the per-game position_ids and a block-diagonal 4D mask
static const char *configs[] = {"mha", "gqa", "tied", "odd", "headdim", "llama3", "sharded", "bf16", "packed"};

typedef struct {
    llama_config cfg;
    hf_checkpoint ck;
    st_file golden;
    int B, T;
    int32_t *tokens, *targets;
    int n_valid;
    int packed;   // the "packed" case: per-game segments
} golden_case;

static const st_tensor *need(const st_file *f, const char *name) {
    const st_tensor *t = st_find(f, name);
    if (!t) fprintf(stderr, "%s: missing '%s'\n", f->path, name);
    return t;
}

static int case_open(golden_case *g, const char *dir) {
    char path[1100];
    memset(g, 0, sizeof *g);
    snprintf(path, sizeof path, "%s/config.json", dir);
    TRY(llama_config_load(&g->cfg, path));
    TRY(hf_checkpoint_open(&g->ck, dir));
    snprintf(path, sizeof path, "%s/golden.safetensors", dir);
    TRY(st_open(&g->golden, path));
    const st_tensor *ids = need(&g->golden, "input_ids"), *labels = need(&g->golden, "labels");
    if (!ids || !labels || ids->dtype != ST_I32 || ids->ndim != 2) return ft_error("bad golden inputs");
    g->packed = strstr(dir, "packed") != NULL;
    g->B = (int)ids->shape[0];
    g->T = (int)ids->shape[1];
    size_t N = (size_t)g->B * g->T;
    g->tokens = malloc(N * sizeof(int32_t));
    g->targets = malloc(N * sizeof(int32_t));
    memcpy(g->tokens, ids->data, N * sizeof(int32_t));
    // transformers shifts inside the model: position t predicts labels[t + 1]
    const int32_t *lab = labels->data;
    for (int b = 0; b < g->B; b++)
        for (int t = 0; t < g->T; t++) {
            int32_t y = t + 1 < g->T ? lab[b * g->T + t + 1] : -100;
            g->targets[b * g->T + t] = y;
            g->n_valid += y != -100;
        }
    return 0;
}

static void case_close(golden_case *g) {
    hf_checkpoint_close(&g->ck);
    st_close(&g->golden);
    free(g->tokens);
    free(g->targets);
}

// One forward+backward; fills grads (zeroed first) and returns the mean loss in *loss.
// fresh: the layer units' gradients are fresh (NaN-filled, overwritten by the backward).
static int run(golden_case *g, const param_layout *layout, const backend *be, int grad_ckpt, int fresh, void *params,
               float *grads, double *loss, float *logits, size_t *act_bytes) {
    mem_tracker mem;
    mem_tracker_init(&mem, be);
    model m;
    TRY(model_init(&m, layout, be, &mem, g->B, g->T, grad_ckpt));
    if (g->packed) model_set_segments(&m, g->cfg.bos_token_id);
    flat_provider_state st = {layout, be, params, grads, fresh};
    unit_provider p = unit_provider_flat(&st);
    memset(grads, 0, layout->total * sizeof(float));
    double sum;
    int n_valid;
    int rc = model_forward_backward(&m, &p, g->tokens, g->targets, 1, 1.0f / g->n_valid, &sum, &n_valid);
    if (rc == 0 && logits) rc = model_logits(&m, &p, g->tokens, logits);
    *loss = sum / n_valid;
    *act_bytes = mem.peak[MEM_ACTIVATIONS];
    model_free(&m);
    return rc;
}

// Fresh layer gradient units (what FSDP's per-micro-batch layer buffers are: no zero pass,
// the dW GEMMs with beta 0, the norm weights and the padding zeroed by the model): in a layout
// padded to multiples of 112 (every unit gets padding), with every layer unit NaN-filled
// before its backward, each tensor's gradient equals the accumulate path's (`ref`, unpadded
// layout) and every padding element is exactly 0. Derived tolerance: the same arithmetic
// but beta 0 instead of beta 1 onto zeros (adding 0 is exact), so bitwise; NMSE 0 required.
// A NaN left anywhere fails both checks.
static void check_fresh(golden_case *g, const char *name, const backend *be, const float *ref) {
    param_layout lp;
    if (param_layout_init(&lp, &g->cfg, 112) != 0) {
        EXPECT(0, "%s: padded layout: %s", name, ft_error_message());
        return;
    }
    float *params = malloc(lp.total * sizeof(float)), *grads = malloc(lp.total * sizeof(float));
    double loss;
    size_t act;
    int ok = hf_checkpoint_load_params(&g->ck, &lp, be, params) == 0 &&
             run(g, &lp, be, 0, 1, params, grads, &loss, NULL, &act) == 0;
    EXPECT(ok, "%s: fresh-unit step: %s", name, ft_error_message());
    if (ok) {
        param_layout l1;
        ok = param_layout_init(&l1, &g->cfg, 1) == 0;
        double worst = 0;
        for (int i = 0; ok && i < lp.n_entries; i++) {
            const param_entry *pe = &lp.entries[i], *pr = param_layout_find(&l1, pe->name);
            double e = pr ? test_nmse(grads + pe->offset, ref + pr->offset, pe->numel) : INFINITY;
            worst = e > worst || e != e ? e : worst;
        }
        size_t pad = 0, pad_bad = 0;
        for (int u = 0; u < lp.n_units; u++) {
            const size_t used = u < lp.n_layers ? lp.layer_numel : lp.root_numel;
            for (size_t k = used; k < lp.unit_numel[u]; k++, pad++) pad_bad += grads[lp.unit_offset[u] + k] != 0.0f;
        }
        printf("  %-8s fresh layer gradient units (NaN before, padded to 112): worst tensor NMSE %.1e, "
               "%zu padding elements, %zu not 0\n", name, worst, pad, pad_bad);
        EXPECT(ok && worst == 0.0, "%s: fresh gradient units: worst tensor NMSE %.3e", name, worst);
        EXPECT(pad > 0 && pad_bad == 0, "%s: fresh gradient units: %zu of %zu padding elements not 0", name, pad_bad, pad);
        if (ok) param_layout_free(&l1);
    }
    free(params);
    free(grads);
    param_layout_free(&lp);
}

static void check_config(const char *root, const char *name, const backend *be) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    golden_case g;
    ft_error_clear();
    if (case_open(&g, dir) != 0) {
        EXPECT(0, "%s: cannot open golden case: %s", name, ft_error_message());
        case_close(&g);
        return;
    }
    param_layout layout;
    if (param_layout_init(&layout, &g.cfg, 1) != 0) {
        EXPECT(0, "%s: layout: %s", name, ft_error_message());
        case_close(&g);
        return;
    }
    float *params = malloc(layout.total * sizeof(float));
    float *grads = malloc(layout.total * sizeof(float)), *grads_ck = malloc(layout.total * sizeof(float));
    size_t nlogits = (size_t)g.B * g.T * g.cfg.vocab_size;
    float *logits = malloc(nlogits * sizeof(float));
    int ok = hf_checkpoint_load_params(&g.ck, &layout, be, params) == 0;
    EXPECT(ok, "%s: load: %s", name, ft_error_message());

    double loss = 0, loss_ck = 0;
    size_t act = 0, act_ck = 0;
    if (ok) ok = run(&g, &layout, be, 0, 0, params, grads, &loss, logits, &act) == 0;
    EXPECT(ok, "%s: step: %s", name, ft_error_message());
    if (ok) {
        const st_tensor *ref_logits = need(&g.golden, "logits"), *ref_loss = need(&g.golden, "loss");
        double e = ref_logits && ref_logits->numel == nlogits ? test_nmse(logits, ref_logits->data, nlogits) : INFINITY;
        printf("  %-8s %-44s NMSE %.2e (max %.0e)\n", name, "logits", e, LOGITS_NMSE_MAX);
        EXPECT(e <= LOGITS_NMSE_MAX, "%s: logits NMSE %.3e", name, e);
        double ref = ref_loss ? ((const float *)ref_loss->data)[0] : NAN;
        double rel = fabs(loss - ref) / fabs(ref);
        printf("  %-8s %-44s %.7f vs %.7f (rel %.1e)\n", name, "loss", loss, ref, rel);
        EXPECT(rel <= LOSS_REL_MAX, "%s: loss %.8f vs %.8f", name, loss, ref);
        double worst = 0;
        const char *worst_name = "";
        for (int i = 0; i < layout.n_entries; i++) {
            const param_entry *pe = &layout.entries[i];
            char key[128];
            snprintf(key, sizeof key, "grad.%s", pe->name);
            const st_tensor *rg = need(&g.golden, key);
            double ge = rg && rg->numel == pe->numel ? test_nmse(grads + pe->offset, rg->data, pe->numel) : INFINITY;
            EXPECT(ge <= GRAD_NMSE_MAX, "%s: %s NMSE %.3e", name, key, ge);
            if (ge >= worst) { worst = ge; worst_name = pe->name; }
        }
        printf("  %-8s grads (%d tensors), worst %-24s NMSE %.2e (max %.0e)\n", name, layout.n_entries,
               worst_name, worst, GRAD_NMSE_MAX);

        // activation checkpointing: the same gradients to the bit, with less memory
        ok = run(&g, &layout, be, 1, 0, params, grads_ck, &loss_ck, NULL, &act_ck) == 0;
        EXPECT(ok, "%s: checkpointed step: %s", name, ft_error_message());
        int same = ok && memcmp(grads, grads_ck, layout.total * sizeof(float)) == 0 && loss == loss_ck;
        printf("  %-8s gradient checkpointing: grads bitwise %s; activations %zu -> %zu bytes (%.0f%%)\n",
               name, same ? "identical" : "DIFFERENT", act, act_ck, 100.0 * act_ck / (double)act);
        EXPECT(same, "%s: checkpointed gradients differ from the plain run", name);
        EXPECT(act_ck < act, "%s: checkpointing saved no activation memory (%zu vs %zu)", name, act_ck, act);
        if (ok) check_fresh(&g, name, be, grads);
    }
    free(params); free(grads); free(grads_ck); free(logits);
    param_layout_free(&layout);
    case_close(&g);
}

// --pack_attention per_game, end to end through the model on the "packed" checkpoint: row 0
// packs game A (positions 0..19) and game B (20..36), row 1 holds game B alone (0..16, then
// padding without targets). With segments, B's per-token losses in the packed row equal those
// of B alone: the same products, only the key ranges the GEMMs run over differ (row 0's tile
// holds A's keys, masked to probability 0, adding exact zeros), so they may differ in the last
// bits of a sum: we allow 2e-5 absolute on losses of ~5 (~30 ulps of fp32 at 5, where the
// rounding of a chain of ~100 fp32 sums is ~1e-6). Without segments (row attention, the
// control) B sees A and its positions start at 20: the losses differ by 1e-2 or more.
#define PACKED_ALONE_MAX_DIFF 2e-5
static void check_packed_equivalence(const char *root, const backend *be) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/packed", root);
    llama_config cfg;
    hf_checkpoint ck;
    param_layout layout;
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    int ok = llama_config_load(&cfg, path) == 0 && hf_checkpoint_open(&ck, dir) == 0 &&
             param_layout_init(&layout, &cfg, 1) == 0;
    EXPECT(ok, "packed equivalence: open %s: %s", dir, ft_error_message());
    if (!ok) return;
    enum { B = 2, T = 37, A = 20, LB = T - A };
    const int bos = cfg.bos_token_id;
    int32_t tokens[B * T], targets[B * T];
    uint64_t st = 77;
    for (int t = 0; t < T; t++) tokens[t] = bos + 2 + (int32_t)(test_rand_u32(&st) % (uint32_t)(cfg.vocab_size - bos - 2));
    tokens[0] = tokens[A] = bos;
    for (int t = 0; t < T; t++) tokens[T + t] = t < LB ? tokens[A + t] : bos + 2;   // B alone, then padding
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {   // the loader's rule: a target that is a BOS is ignored
            const int32_t y = t + 1 < T ? tokens[b * T + t + 1] : -100;
            targets[b * T + t] = y == bos || (b == 1 && t + 1 >= LB) ? -100 : y;
        }
    float *params = malloc(layout.total * sizeof(float)), *grads = malloc(layout.total * sizeof(float));
    float alone[LB], packed[2][LB];
    ok = hf_checkpoint_load_params(&ck, &layout, be, params) == 0;
    for (int mode = 0; ok && mode < 2; mode++) {   // 0: per_game, 1: row (the control)
        mem_tracker mem;
        mem_tracker_init(&mem, be);
        model m;
        ok = model_init(&m, &layout, be, &mem, B, T, 0) == 0;
        if (!ok) break;
        if (mode == 0) model_set_segments(&m, bos);
        flat_provider_state fs = {&layout, be, params, grads, 0};
        unit_provider p = unit_provider_flat(&fs);
        memset(grads, 0, layout.total * sizeof(float));
        double sum;
        int n;
        ok = model_forward_backward(&m, &p, tokens, targets, 1, 1.0f, &sum, &n) == 0;
        for (int t = 0; ok && t < LB - 1; t++) {
            packed[mode][t] = m.losses_host[A + t];
            if (mode == 0) alone[t] = m.losses_host[T + t];
        }
        model_free(&m);
    }
    EXPECT(ok, "packed equivalence: %s", ft_error_message());
    if (ok) {
        double worst = 0, control = 0;
        for (int t = 0; t < LB - 1; t++) {
            worst = fmax(worst, fabs((double)packed[0][t] - alone[t]));
            control = fmax(control, fabs((double)packed[1][t] - alone[t]));
        }
        printf("  %-8s game B packed after game A vs alone, per-token losses: per_game max diff %.1e (max %.0e); "
               "row attention (control) %.1e\n", "packed", worst, PACKED_ALONE_MAX_DIFF, control);
        EXPECT(worst <= PACKED_ALONE_MAX_DIFF, "packed per_game: game B's losses differ from B alone by %.3e", worst);
        EXPECT(control > 1e-2, "packed control: row attention should change game B's losses (max diff %.3e)", control);
    }
    free(params);
    free(grads);
    param_layout_free(&layout);
    hf_checkpoint_close(&ck);
}

int main(void) {
    const char *root = getenv("FT_GOLDEN_DIR") ? getenv("FT_GOLDEN_DIR") : "tests/golden";
    const backend *be = backend_cpu();
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) check_config(root, configs[i], be);
    check_packed_equivalence(root, be);
    TEST_SUMMARY("test_golden");
}
