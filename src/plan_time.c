// plan_time.c: the --dry_run step-time ESTIMATE per op class (see plan.h).
//
// One optimizer step is a list of ops (plan_ops_compute), each with its FLOPs or HBM bytes, a
// class that says at what rate it runs, and a phase that says what collectives it can hide.
// The model's ops are not retyped here: one micro-batch of the model code runs over a backend
// that only counts (src/backend_count.h), and its tally, per phase and kind, becomes the rows;
// the gradient schedule's and the optimizer's traffic come from the plan's bytes. A device
// turns the list into times (plan_estimate_step_time): every rate is a published peak times a
// fraction, each fraction with its source (the GEMM fraction and the per-operation floor
// measured on one H200).
#include "plan.h"

#include <math.h>
#include <string.h>

#include "backend_count.h"
#include "common.h"
#include "fsdp.h"
#include "model.h"

// (the rates and fractions: src/plan_price.h)

const char *plan_op_class_name(plan_op_class k) {
    static const char *names[PLAN_OP_CLASS_COUNT] = {"gemm", "attention", "simt", "memory"};
    return names[k];
}

// ----------------------------------------------------------------------------
// the op list of one optimizer step (per rank)

static void op_add(plan *p, const char *what, plan_op_class k, plan_op_phase ph, double flops, double bytes,
                   double rate, double launches) {
    if (flops == 0 && bytes == 0) return;
    if (p->n_ops < PLAN_MAX_OPS) p->ops[p->n_ops++] = (plan_op){what, k, ph, flops, bytes, rate, launches};
}

// The model's ops of one micro-batch of this job, counted: model_forward_backward run once over
// a backend whose ops only tally their FLOPs, bytes and device operations (src/backend_count.h),
// so the sequence (checkpointing's recompute, LoRA's adapter paths and split passes, the
// lm_head's chunks) is the model code's own, not a copy of it.
static int count_model_ops(const plan *p, const llama_config *c, count_result *k) {
    const plan_request *r = &p->req;
    const count_job job = {r->batch_size_per_device, plan_row_tokens(r), r->elem_bytes, plan_model_buffers(r),
                           r->lora.rank ? &r->lora : NULL,
                           fsdp_grads_f32((fsdp_grad_mode)p->grad_mode, r->reduce_f32), r->attention_segments,
                           !r->eval_only, r->fp8 && r->elem_bytes == 2};
    return count_micro_batch(c, &job, k);
}

// The memory-bound bytes and operations of a phase, over every kind of op: kernels, memsets,
// and what a GEMM's epilogue (a residual) or the attention backward's row pass reads.
static count_tally phase_memory(const count_result *k, count_phase ph) {
    count_tally s = {0};
    for (int i = 0; i < COUNT_KIND_COUNT; i++) {
        s.bytes += k->t[ph][i].bytes;
        s.byte_ops += k->t[ph][i].byte_ops;
    }
    return s;
}

// The attention ops of A micro-batches (k: one micro-batch's calls and forward FLOPs) on the
// path this job takes. Operations: one cuDNN graph per call, forward and backward; the native
// backward is 3 kernels (delta, dK|dV, dQ).
static void attention_ops_add(plan *p, const llama_config *c, const count_result *k, double A) {
    const char *fwd, *rec, *bwd;
    plan_op_class cls = PLAN_OP_ATTENTION;
    const int cudnn = p->req.attention_cudnn && !p->req.attention_segments;   // (segments: native kernels)
    double rate, bwd_factor = PLAN_ATTN_BWD_TC, bwd_ops = cudnn ? 1 : 3;
    if (cudnn) {   // every head_dim (backend_cuda.c cu_attention_fwd)
        rate = PLAN_ATTN_CUDNN_FRACTION;
        fwd = "attention forward (cuDNN graph)", rec = "attention forward recomputed (cuDNN)";
        bwd = "attention backward (cuDNN graph, 5 products)";
    } else if (c->head_dim % 16 != 0) {   // kernels/attention.cu: the SIMT kernels
        cls = PLAN_OP_SIMT, rate = PLAN_SIMT_ATTN_FLOP_PER_SM_CLK, bwd_factor = PLAN_ATTN_BWD_SIMT;
        fwd = "attention forward (SIMT, head_dim % 16)", rec = "attention forward recomputed (SIMT)";
        bwd = "attention backward (SIMT, 7 products)";
    } else {
        rate = PLAN_ATTN_NATIVE_FRACTION;
        fwd = "attention forward (native wmma)", rec = "attention forward recomputed (native)";
        bwd = "attention backward (native wmma, 5 products)";
    }
    const count_tally *f = &k->t[COUNT_LAYER_FWD][COUNT_ATTN_FWD], *re = &k->t[COUNT_LAYER_RECOMPUTE][COUNT_ATTN_FWD];
    const count_tally *b = &k->t[COUNT_LAYER_BWD][COUNT_ATTN_BWD];
    op_add(p, fwd, cls, PLAN_PHASE_FWD, A * f->flops, 0, rate, A * f->calls);
    op_add(p, rec, cls, PLAN_PHASE_BWD, A * re->flops, 0, rate, A * re->calls);
    op_add(p, bwd, cls, PLAN_PHASE_BWD, A * bwd_factor * b->flops, 0, rate, A * bwd_ops * b->calls);
}

// The model's rows for A micro-batches (k: one micro-batch's ops; --eval_only: the forward's):
// the layers' GEMMs (LoRA: the frozen base's forward and dX, the adapters' 2 GEMMs forward and 4
// backward), attention, the lm_head's GEMMs per row chunk (K = C or the chunk's rows, both >=
// 2048 for 7B at seq 512: taken to run at the layers' GEMM rate, an assumption), and the
// memory-bound kernels of the layers (forward, backward, recomputed) and of the root.
static void model_ops_add(plan *p, const llama_config *c, const count_result *k, double A) {
    const int lora = p->req.lora.rank != 0, train = !p->req.eval_only;
    const count_tally *gf = &k->t[COUNT_LAYER_FWD][COUNT_GEMM], *gb = &k->t[COUNT_LAYER_BWD][COUNT_GEMM];
    const count_tally *gr = &k->t[COUNT_LAYER_RECOMPUTE][COUNT_GEMM];
    const count_tally *lm = &k->t[COUNT_ROOT][COUNT_LMHEAD], *rg = &k->t[COUNT_ROOT][COUNT_GEMM];
    op_add(p, lora ? "layer GEMMs forward (base + adapters)" : "layer GEMMs forward (q k v o gate|up down)",
           PLAN_OP_GEMM, PLAN_PHASE_FWD, A * gf->flops, 0, 0, A * gf->flop_ops);
    op_add(p, lora ? "layer GEMMs backward (base dX, adapters)" : p->req.fp8 ? "layer GEMMs backward (shapes not in FP8)"
                                                                           : "layer GEMMs backward (dX, dW)",
           PLAN_OP_GEMM, PLAN_PHASE_BWD, A * gb->flops, 0, 0, A * gb->flop_ops);
    op_add(p, "layer GEMMs recomputed (checkpointing)", PLAN_OP_GEMM, PLAN_PHASE_BWD, A * gr->flops, 0, 0,
           A * gr->flop_ops);
    // --fp8: the decoder linears' forward, dX and dW GEMMs (rate PLAN_GEMM_RATE_FP8: the FP8
    // peak; a dW at a row count not a multiple of 16 stays in the bf16 row above); their
    // quantisations are in the phases' memory rows below
    const count_tally *ff = &k->t[COUNT_LAYER_FWD][COUNT_GEMM_FP8], *fb = &k->t[COUNT_LAYER_BWD][COUNT_GEMM_FP8];
    const count_tally *fr = &k->t[COUNT_LAYER_RECOMPUTE][COUNT_GEMM_FP8];
    op_add(p, "layer GEMMs forward in FP8 (--fp8)", PLAN_OP_GEMM, PLAN_PHASE_FWD, A * ff->flops, 0, PLAN_GEMM_RATE_FP8,
           A * ff->flop_ops);
    op_add(p, "layer GEMMs backward dX, dW in FP8 (--fp8)", PLAN_OP_GEMM, PLAN_PHASE_BWD, A * fb->flops, 0,
           PLAN_GEMM_RATE_FP8, A * fb->flop_ops);
    op_add(p, "layer GEMMs recomputed in FP8 (--fp8)", PLAN_OP_GEMM, PLAN_PHASE_BWD, A * fr->flops, 0,
           PLAN_GEMM_RATE_FP8, A * fr->flop_ops);
    attention_ops_add(p, c, k, A);
    op_add(p, !train ? "lm_head GEMM: logits" : lora ? "lm_head GEMMs: logits, dX (frozen)" : "lm_head GEMMs: logits, dX, dW",
           PLAN_OP_GEMM, PLAN_PHASE_ROOT, A * (lm->flops + rg->flops), 0, 0, A * (lm->flop_ops + rg->flop_ops));
    const struct { count_phase ph; plan_op_phase at; const char *what; } mem[] = {
        {COUNT_LAYER_FWD, PLAN_PHASE_FWD, "layer norms, RoPE + q|k|v split, SwiGLU forward"},
        {COUNT_LAYER_BWD, PLAN_PHASE_BWD, "layer norms, RoPE, SwiGLU, delta backward"},
        {COUNT_LAYER_RECOMPUTE, PLAN_PHASE_BWD, "layer memory-bound forward recomputed"},
        {COUNT_ROOT, PLAN_PHASE_ROOT,
         train ? "embedding, final norm, softmax/xent rows" : "embedding, final norm, softmax/xent rows (forward)"},
    };
    for (size_t i = 0; i < sizeof mem / sizeof mem[0]; i++) {
        const count_tally t = phase_memory(k, mem[i].ph);
        op_add(p, mem[i].what, PLAN_OP_MEMORY, mem[i].at, 0, A * t.bytes, 0, A * t.byte_ops);
    }
}

// The HBM bytes of the unit gradients over a step, and the row's name. The root unit's
// gradient zeroed (grad_begin; a layer's is fresh: its dW GEMMs overwrite it with beta 0,
// nothing to zero but the norm weights and padding) and every unit's added into the fp32 slice
// (grad_end), on the compute stream during the backward; with FSDP_GRADS_ROOT_ONCE the root's
// is added into its full fp32 sum instead (zeroed once per step) and the step's one fp32
// reduce-scatter writes the root's slice. The dW GEMMs' epilogue (at most a read and a write of
// each gradient element, 2e bytes) is taken as hidden under their compute. FSDP_GRADS_DIRECT
// (one shard) has no zero or add pass: the epilogues read and write the fp32 slice, 8 bytes,
// and the 8 - 2e beyond a bf16 epilogue are counted here (an upper bound: at batch 1 x 512 a
// 7B dW GEMM does 1024 FLOPs per gradient element, 1.5 ps at 0.69 of an H100's peak, against
// 2.7 ps for 8 bytes at 0.9 of its HBM bandwidth: the fp32 epilogue is partly exposed at small
// batches, hidden at large ones).
static double unit_grad_bytes(const plan *p, const char **what) {
    const plan_request *r = &p->req;
    const double A = p->accum, e = (double)r->elem_bytes;
    *what = "unit gradients: zero root, add into fp32 slice";
    if (p->grad_mode == FSDP_GRADS_DIRECT) {
        // (the first micro-batch's epilogues only write: its layers come fresh, beta 0)
        *what = "unit gradients: fp32 dW epilogues (one shard)";
        return (double)p->padded_total * (A * (8 - 2 * e) - 4);
    }
    if (p->grad_mode == FSDP_GRADS_LOCAL) {
        // the full-size fp32 sums: the same fp32 epilogues, the root zeroed once; the step's
        // reduce-scatter writes the slices (no add pass)
        *what = "unit gradients: fp32 dW epilogues (local sums)";
        return A * (double)p->padded_total * (8 - 2 * e) + 4.0 * (double)p->root_numel;
    }
    // per-micro-batch buffers of g bytes an element (--reduce_dtype fp32: 4); fp32 ones make
    // every dW epilogue write 4 - e bytes more than the bf16 one taken as hidden
    const double g = r->reduce_f32 ? 4 : e;
    double bytes = A * ((double)p->root_numel * g + (double)p->n_local * (g + 8)) + A * (double)p->padded_total * (g - e);
    if (p->grad_mode == FSDP_GRADS_ROOT_ONCE) {
        const double root = (double)p->root_numel, root_slice = root / r->shard_size;
        // fp32 micro-batch gradients add into the root's fp32 sum directly (fsdp.c
        // root_into_acc): no per-micro-batch zero and no add of the root's slice (the base
        // term counted both), the sum zeroed once; else a bf16 root buffer added into the sum
        if (g == 4) bytes += 4 * root - A * root * g - A * root_slice * (g + 8);
        else bytes += A * (root - root_slice) * (e + 8) + 4 * root;
    }
    return bytes;
}

// The step's rows beyond the model's ops (k: one micro-batch's): cuDNN's deterministic dP
// traffic, the unit gradients (the gradient schedule of src/fsdp.c) and the optimizer.
static void step_ops_add(plan *p, const llama_config *c, const count_result *k) {
    const plan_request *r = &p->req;
    const double A = p->accum, L = c->num_hidden_layers, units = L + 1, lora = r->lora.rank ? 1 : 0;
    // --deterministic with cuDNN attention: the backward writes dP (B, H, T, T) bf16 to its
    // workspace and reads it back, per attention backward (no operation of its own: inside the
    // cuDNN graph)
    if (r->attention_cudnn && !r->attention_segments && r->deterministic)
        op_add(p, "attention dP through HBM (--deterministic)", PLAN_OP_MEMORY, PLAN_PHASE_BWD, 0,
               A * k->t[COUNT_LAYER_BWD][COUNT_ATTN_BWD].calls * 2 * 2 * (double)r->batch_size_per_device *
                   c->num_attention_heads * (double)r->seq_len * r->seq_len,
               0, 0);
    // operations: sharded, each unit's gradient is zeroed or added per micro-batch (an add
    // kernel, two memsets: a fresh layer's norm weights); one shard writes the step gradient
    // directly, its layers fresh in the first micro-batch (the two norm weights of each
    // zeroed: two memsets per layer)
    const char *grad_what;
    const double grad_bytes = unit_grad_bytes(p, &grad_what);
    op_add(p, grad_what, PLAN_OP_MEMORY, PLAN_PHASE_BWD, 0, grad_bytes, 0,
           p->grad_mode == FSDP_GRADS_DIRECT ? (lora ? 0 : 2 * L) : A * 3 * units);
    // AdamW: one kernel per trained tensor in this rank's slice (a sharded slice cuts up to one
    // tensor per unit); the grad norm's 2 kernels per unit as each becomes final (fsdp.c
    // norm_add; with replicas 2 over the whole slice after their all-reduces); memsets of the
    // gradient, the norm's per-unit doubles and the loss accumulator
    const double nt = r->lora.rank ? __builtin_popcount(r->lora.targets) : 0;
    const double tensors = lora ? 2 * nt * L : 9 * L + 3 - (c->tie_word_embeddings ? 1 : 0);
    const double adamw = r->shard_size == 1 ? tensors : tensors / r->shard_size + units;
    const double norm = p->replica_size > 1 ? 2 : 2 * units;
    op_add(p, "optimizer: grad norm, AdamW", PLAN_OP_MEMORY, PLAN_PHASE_STEP, 0, p->optimizer_hbm_bytes, 0,
           (r->offload_optimizer ? 0 : adamw) + norm + 3);   // (offloaded: AdamW runs on the host)
}

int plan_ops_compute(plan *p, const llama_config *c) {
    p->n_ops = 0;
    count_result k;
    TRY(count_model_ops(p, c, &k));
    model_ops_add(p, c, &k, p->req.eval_only ? 1 : p->accum);   // (--eval_only: a step is one micro-batch)
    if (!p->req.eval_only) step_ops_add(p, c, &k);
    p->exec_flops = 0;
    p->launches = 0;
    for (int i = 0; i < p->n_ops; i++) {
        p->exec_flops += p->ops[i].flops;
        p->launches += p->ops[i].launches;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// times on a device

static double op_work_seconds(const plan_op *o, const plan_device *d) {
    switch (o->cls) {
    case PLAN_OP_GEMM: return o->rate == PLAN_GEMM_RATE_FP8 ? plan_price_gemm_fp8(d, o->flops) : plan_price_gemm(d, o->flops);
    case PLAN_OP_ATTENTION: return plan_price_tensor(d, o->flops, o->rate);
    case PLAN_OP_SIMT: return plan_price_simt(d, o->flops, o->rate);
    default: return plan_price_memory(d, o->bytes);
    }
}

double plan_op_seconds(const plan_op *o, const plan_device *d) { return plan_price_op(op_work_seconds(o, d), o->launches); }

static double pos(double x) { return x > 0 ? x : 0; }

void plan_estimate_step_time(const plan *p, const plan_device *d, plan_step_time *t) {
    memset(t, 0, sizeof *t);
    double phase[PLAN_PHASE_COUNT] = {0};
    for (int i = 0; i < p->n_ops; i++) {
        const double s = plan_op_seconds(&p->ops[i], d);
        t->class_s[p->ops[i].cls] += s;
        phase[p->ops[i].phase] += s;
    }
    // collectives: ring bytes sent per rank over the link of the group (NVLink within a node)
    const int G = plan_gpus_per_node(&p->req, d);
    const double shard_bw = plan_price_link_bytes_per_s(d, p->req.shard_size > G);
    const double world_bw = plan_price_link_bytes_per_s(d, p->req.world_size > G);
    const double root = (double)(p->root_all_gather_bytes + p->root_reduce_scatter_bytes) / shard_bw;
    const double layer_ag = (double)(p->all_gather_bytes - p->root_all_gather_bytes) / shard_bw;
    const double layer_rs = (double)(p->reduce_scatter_bytes - p->root_reduce_scatter_bytes) / shard_bw;
    const double all_reduce = (double)p->all_reduce_bytes / world_bw;
    t->link_s = root + layer_ag + layer_rs + all_reduce;
    // fsdp.c: the root's gather and reduce-scatter (each once per step, but for the root's
    // reduce-scatter per micro-batch in FSDP_GRADS_PER_MICRO_BATCH) block the compute stream;
    // a layer's gather is prefetched behind the previous layer's compute and its
    // reduce-scatter overlaps the next layer's backward (not with --accumulate_grads_locally:
    // one blocking reduction per step). Layer gathers: half in the forward, half in the backward
    // (exact but for the step's first forward, which gathers 2 more layers).
    // With --keep_params_gathered every layer gather of the step is in the first micro-batch's
    // forward, behind that forward's compute (1/A of the step's).
    const double rs_hidden = p->req.accumulate_grads_locally ? 0 : layer_rs;
    // (--eval_only: every gather in the forward, the only phase)
    const double ag_fwd = p->req.keep_params_gathered || p->req.eval_only ? layer_ag : layer_ag / 2;
    const double ag_bwd = layer_ag - ag_fwd;
    const double fwd_cover = phase[PLAN_PHASE_FWD] / (p->req.keep_params_gathered ? p->accum : 1);
    // The replica all-reduce (fsdp.c grad_final) is one per unit, each started on the replica
    // group's stream as soon as the unit's slice is final in the last micro-batch: the root's
    // and the last layers' (1 and 0 with per-micro-batch reduce-scatters, finished when the
    // root ends the backward; 0 otherwise) come after the backward, exposed; the other layers'
    // overlap the last micro-batch's backward (the backward's own collectives run on other
    // lanes; the link they share is not modelled here)
    const size_t S = (size_t)p->req.shard_size, R = (size_t)p->replica_size;
    const double nl = p->trained_layer_numel ? (double)((p->trained_padded_total - p->trained_root_numel) /
                                                         p->trained_layer_numel) : 0;
    const double ar_layer =
        R > 1 ? 2.0 * (double)(R - 1) * (double)(p->trained_layer_numel / S / R) * sizeof(float) / world_bw : 0;
    const double early = pos(nl - (S > 1 && !p->req.accumulate_grads_locally ? 2 : 1));
    const double ar_exposed = all_reduce - early * ar_layer + pos(early * ar_layer - phase[PLAN_PHASE_BWD] / p->accum);
    t->comm_exposed_s = root + ar_exposed + (layer_rs - rs_hidden) + pos(ag_fwd - fwd_cover) +
                        pos(ag_bwd + rs_hidden - phase[PLAN_PHASE_BWD]);
    t->comm_hidden_s = t->link_s - t->comm_exposed_s;
    const double pcie = plan_price_pcie(p->offload_d2h_bytes + p->offload_h2d_bytes);
    t->offload_s = fmax(plan_price_host_memory(p->offload_host_bytes), pcie);
    t->total_s = t->comm_exposed_s + t->offload_s;
    for (int k = 0; k < PLAN_OP_CLASS_COUNT; k++) t->total_s += t->class_s[k];
    t->mfu = p->model_flops / (t->total_s * d->peak_flops);
}

// ----------------------------------------------------------------------------
// the report's step-time part

static void print_ops(FILE *out, const plan *p) {
    fprintf(out, "  %-44s %-9s %10s %8s", "op (ms per step per device)", "class", "GFLOP", "GB");
    for (int j = 0; j < plan_n_devices; j++) fprintf(out, " %15s", plan_devices[j].name);
    fprintf(out, "\n");
    for (int i = 0; i < p->n_ops; i++) {
        const plan_op *o = &p->ops[i];
        fprintf(out, "  %-44s %-9s %10.0f %8.2f", o->what, plan_op_class_name(o->cls), o->flops / 1e9, o->bytes / 1e9);
        for (int j = 0; j < plan_n_devices; j++) fprintf(out, " %15.2f", 1e3 * plan_op_seconds(o, &plan_devices[j]));
        fprintf(out, "\n");
    }
}

// How the report's token line says the rows' length was taken.
static const char *row_note(const plan *p) {
    return p->req.row_tokens ? "rows at --dry_run_row_tokens; memory at --seq_len" : "every row at full length; runs trim padding";
}

void plan_print_step_time(FILE *out, const plan *p) {
    fprintf(out, "\nstep time ESTIMATE per op class (published peaks x stated fractions; not a measurement, no GPU "
            "ran this):\n");
    if (p->req.eval_only) {   // (a "step" below: one forward micro-batch)
        fprintf(out, "  --eval_only: a step is one evaluation micro-batch, the FORWARD only: %.0f tokens per rank "
                "(%d x %d, %s)\n", p->tokens, p->req.batch_size_per_device, plan_row_tokens(&p->req), row_note(p));
        fprintf(out, "  %.3e model FLOPs (the forward's: 2 x matmul params%s + causal attention, the MFU numerator), "
                "%.3e executed by this build\n", p->model_flops, p->req.lora.rank ? " (adapters included)" : "",
                p->exec_flops);
    } else {
        fprintf(out, "  per rank per optimizer step: %.0f tokens (%d micro-batches x %d x %d, %s)\n", p->tokens, p->accum,
                p->req.batch_size_per_device, plan_row_tokens(&p->req), row_note(p));
        fprintf(out, "  %.3e model FLOPs (%s + causal attention: the MFU numerator), %.3e executed by "
                "this build (recompute, the attention backward's products)\n", p->model_flops,
                p->req.lora.rank ? "LoRA: 4 x frozen matmul params (no dW) + 6 x adapter params" : "6 x matmul params",
                p->exec_flops);
    }
    fprintf(out, "  %.0f device operations (kernels, GEMMs, cuDNN graphs, memsets), each at least %.0f us: an op's "
            "time is the larger of its work and that floor\n", p->launches, PLAN_OP_FLOOR_S * 1e6);
    print_ops(out, p);

    plan_step_time t[8];
    const int nd = plan_n_devices < 8 ? plan_n_devices : 8;
    for (int j = 0; j < nd; j++) plan_estimate_step_time(p, &plan_devices[j], &t[j]);
    _Static_assert(PLAN_GEMM_FRACTION == 0.69, "the gemm line below states the fraction");
    static const char *what[PLAN_OP_CLASS_COUNT] = {
        "tensor-core GEMMs (cuBLASLt) at 0.69 of peak bf16 (measured on an H200); --fp8's at 0.69 of peak FP8",
        "attention on tensor cores: cuDNN graph at 0.25, native wmma at 0.10 of peak bf16",
        "fp32 SIMT kernels (native attention when head_dim % 16 != 0): 15 FLOP/SM-clock",
        "memory-bound kernels at 0.9 of HBM bandwidth",
    };
    // (each op at least its device operations x PLAN_OP_FLOOR_S: the header line says so)
    fprintf(out, "  per class, ms per step (the rows down to total add up):\n  %-13s", "class");
    for (int j = 0; j < nd; j++) fprintf(out, " %15s", plan_devices[j].name);
    fprintf(out, "\n");
#define ROW(key, expr, fmt, note)                                         \
    do {                                                                  \
        fprintf(out, "  %-13s", key);                                     \
        for (int j = 0; j < nd; j++) fprintf(out, " " fmt, (expr));        \
        fprintf(out, "   %s\n", note);                                    \
    } while (0)
    for (int k = 0; k < PLAN_OP_CLASS_COUNT; k++)
        ROW(plan_op_class_name((plan_op_class)k), 1e3 * t[j].class_s[k], "%15.2f", what[k]);
    ROW("comm_exposed", 1e3 * t[j].comm_exposed_s, "%15.2f",
        "collectives not hidden: root gather/reduce, the replica all-reduces of the root and last layers, layer traffic beyond its phase's compute");
    if (p->req.offload_optimizer)
        ROW("offload", 1e3 * t[j].offload_s, "%15.2f",
            "host AdamW at 50 GB/s of host memory, PCIe copies at 50 GB/s, one direction at a time: the longer (assumed; "
            "after the backward with clipping, --max_grad_norm 0 overlaps the layers' part with it)");
    ROW("total", 1e3 * t[j].total_s, "%15.2f", "the step");
    ROW("comm_hidden", 1e3 * t[j].comm_hidden_s, "%15.2f",
        "collectives overlapped with layer compute (prefetched gathers, overlapped reduce-scatters)");
    ROW("link", 1e3 * t[j].link_s, "%15.2f", "all collective bytes over the link (exposed + hidden)");
    ROW("tokens/s/GPU", p->tokens / t[j].total_s, "%15.0f", "");
    ROW("MFU", 100 * t[j].mfu, "%14.1f%%", "predicted: model FLOPs / (step time x peak bf16)");
#undef ROW
    fprintf(out, "  Peaks (bf16 TFLOP/s, HBM TB/s, fp32 TFLOP/s): A100 312/2.0/19.5, H100 989/3.35/67, H200 989/4.8/67;\n"
            "  NVLink 300/450/450 GB/s per direction within 8 GPUs, else InfiniBand 25/50/50 GB/s per GPU. The\n"
            "  GEMM fraction and the 8 us floor were measured on one H200 (2026-11-26: this estimate was 1.16-1.20x\n"
            "  the measured 7B-width steps with the constants before); the others are estimates (src/plan_time.c).\n"
            "  Collectives, the A100 and multi-GPU runs: unmeasured.\n");
}
