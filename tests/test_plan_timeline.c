// test_plan_timeline.c: the step-time timeline (src/plan_timeline.c).
//
// The timeline's LOGIC on hand-built unit costs (seconds as plain numbers, a layer's forward
// 1 and backward 2): each case states what the program's schedule implies and derives the
// expected step from the costs, so a wrong dependency (a gather not waited for, a buffer
// reused early, a reduce-scatter never exposed) fails a case. Then the costs of real plans:
// on one GPU (no collectives) the timeline is the compute sum, which must stay within 5% of
// the steps measured on one H100 and one H200 (docs/results/2026-11-26-h100.md, -h200.md).
#include "plan_timeline.h"

#include "common.h"
#include "fsdp.h"
#include "test.h"

#define NEAR(a, b, tol) (fabs((a) - (b)) <= (tol) * fmax(1.0, fabs(b)))

// A sharded job of L layers and A micro-batches with fast collectives.
static plan_tl_costs base_costs(int L, int A, int grad_mode) {
    return (plan_tl_costs){.layers = L, .micro_batches = A, .sharded = 1, .grad_mode = grad_mode, .layer_fwd = 1,
                           .layer_bwd = 2, .root_fwd = 0.25, .root_head = 0.5, .root_bwd = 0.25, .optimizer = 3,
                           .ag_layer = 0.01, .ag_root = 0.02, .rs_layer = 0.03, .rs_root = 0.04,
                           .rs_layer_f32 = 0.06, .rs_root_f32 = 0.08};
}
static double compute_sum(const plan_tl_costs *c) {
    return c->micro_batches * (c->layers * (c->layer_fwd + c->layer_bwd) + c->root_fwd + c->root_head + c->root_bwd) +
           c->optimizer + c->layers * (c->norm_layer + c->adamw_layer) + c->norm_root + c->adamw_root;
}
static plan_tl_result run(const plan_tl_costs *c, const plan_tl_schedule *s) {
    plan_tl_result r;
    const int rc = plan_tl_run(c, s, &r);
    EXPECT(rc == 0, "plan_tl_run failed: %s", ft_error_message());
    double exposed = 0;
    for (int k = 0; k < PLAN_TL_PHASES; k++) exposed += r.exposed_s[k];
    EXPECT(NEAR(r.step_s, r.busy_s[PLAN_TL_COMPUTE] + exposed, 1e-12), "step %.6f != compute %.6f + exposed %.6f",
           r.step_s, r.busy_s[PLAN_TL_COMPUTE], exposed);
    EXPECT(NEAR(r.busy_s[PLAN_TL_COMPUTE], compute_sum(c), 1e-12), "compute busy %.6f, costs say %.6f",
           r.busy_s[PLAN_TL_COMPUTE], compute_sum(c));
    return r;
}

// Layer gathers of a step: the first forward gathers every layer; each later pass starts
// with the prefetch + 1 layers the pass before left in the buffers.
static double layer_gathers(int L, int A, int prefetch) {
    const int reuse = L > prefetch + 1 ? L - prefetch - 1 : 0;
    return L + (2.0 * A - 1) * reuse;
}

// (1) collectives much faster than compute: the step is the compute, the first gathers (the
// root's, blocking, then layer 0's beyond the embedding that hides it) and each micro-batch's reduce-scatter tail (layer 0's,
// which the root's backward waits for, less the root's backward that hides it; then the
// root's own blocking one; ROOT_ONCE: the root's fp32 one at the end, LOCAL: every unit's).
static void test_comm_fast(void) {
    static const struct { int L, A, mode; } cases[] = {
        {8, 1, FSDP_GRADS_PER_MICRO_BATCH}, {8, 4, FSDP_GRADS_PER_MICRO_BATCH}, {3, 2, FSDP_GRADS_PER_MICRO_BATCH},
        {8, 4, FSDP_GRADS_ROOT_ONCE}, {6, 3, FSDP_GRADS_LOCAL},
    };
    const plan_tl_schedule s = plan_tl_program_schedule();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const plan_tl_costs c = base_costs(cases[i].L, cases[i].A, cases[i].mode);
        const plan_tl_result r = run(&c, &s);
        const double first = c.ag_root + fmax(0, c.ag_layer - c.root_fwd), tail = fmax(0, c.rs_layer - c.root_bwd);
        double expect = compute_sum(&c) + first;
        if (cases[i].mode == FSDP_GRADS_PER_MICRO_BATCH) expect += c.micro_batches * (tail + c.rs_root);
        if (cases[i].mode == FSDP_GRADS_ROOT_ONCE) expect += c.micro_batches * tail + c.rs_root_f32;
        if (cases[i].mode == FSDP_GRADS_LOCAL) expect += c.layers * c.rs_layer_f32 + c.rs_root_f32;
        EXPECT(NEAR(r.step_s, expect, 1e-9), "comm fast L %d A %d mode %d: step %.6f, expected %.6f", cases[i].L,
               cases[i].A, cases[i].mode, r.step_s, expect);
        EXPECT(r.binding == PLAN_TL_COMPUTE, "comm fast case %zu: binding %s", i, plan_tl_lane_name(r.binding));
        EXPECT(NEAR(r.busy_s[PLAN_TL_GATHER], c.ag_root + c.ag_layer * layer_gathers(c.layers, c.micro_batches, 1), 1e-9),
               "comm fast case %zu: gather busy %.6f", i, r.busy_s[PLAN_TL_GATHER]);
    }
}

// (2) one lane slower than compute: the step is bound by it and the report names it.
static void test_lane_bound(void) {
    static const struct { double ag, rs, ar, off_host, off_copy; plan_tl_lane lane; } cases[] = {
        {4, 0.03, 0, 0, 0, PLAN_TL_GATHER},      // a layer's gather 4 vs its forward 1, backward 2
        {0.01, 5, 0, 0, 0, PLAN_TL_REDUCE},      // its reduce-scatter 5
        {0.01, 0.03, 40, 0, 0, PLAN_TL_REPLICA}, // the replica all-reduce of a layer 40
        {0.01, 0.03, 0, 30, 0, PLAN_TL_HOST},    // the host's AdamW of a layer 30
        {0.01, 0.03, 0, 0, 30, PLAN_TL_OFFLOAD}, // its copies 30 each way
    };
    const plan_tl_schedule s = plan_tl_program_schedule();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        plan_tl_costs c = base_costs(8, 2, FSDP_GRADS_PER_MICRO_BATCH);
        c.ag_layer = cases[i].ag, c.rs_layer = cases[i].rs;
        c.replicas = cases[i].ar > 0, c.ar_layer = cases[i].ar, c.ar_all = c.layers * cases[i].ar;
        c.offload = cases[i].off_host > 0 || cases[i].off_copy > 0;
        c.off_host_layer = cases[i].off_host, c.off_down_layer = c.off_up_layer = cases[i].off_copy;
        const plan_tl_result r = run(&c, &s);
        const double lane = r.busy_s[cases[i].lane];
        EXPECT(r.binding == cases[i].lane, "lane case %zu: binding %s, expected %s", i, plan_tl_lane_name(r.binding),
               plan_tl_lane_name(cases[i].lane));
        EXPECT(r.step_s >= lane && r.step_s > compute_sum(&c) * 1.5, "lane case %zu: step %.3f, lane busy %.3f", i,
               r.step_s, lane);
    }
    // the gather-bound step: the lane's time plus at most a layer's compute per pass and the tails
    plan_tl_costs c = base_costs(8, 2, FSDP_GRADS_PER_MICRO_BATCH);
    c.ag_layer = 4;
    const plan_tl_result r = run(&c, &s);
    const double slack = 2 * c.micro_batches * (c.layer_fwd + c.layer_bwd + c.root_head + c.root_fwd + c.root_bwd) +
                         c.optimizer + 1;
    EXPECT(r.step_s <= r.busy_s[PLAN_TL_GATHER] + slack, "gather-bound step %.3f > lane %.3f + %.3f", r.step_s,
           r.busy_s[PLAN_TL_GATHER], slack);
}

// (2b) the gathers and reduce-scatters share the shard group's link: each alone hides under a
// layer's backward (1.5 < 2), together they do not (3 > 2), and the backward shows it;
// the replica all-reduce shares it only when told to (replica_shares_link).
static void test_shared_link(void) {
    const plan_tl_schedule s = plan_tl_program_schedule();
    plan_tl_costs c = base_costs(16, 1, FSDP_GRADS_PER_MICRO_BATCH);
    c.rs_layer = 1.5;
    const plan_tl_result alone = run(&c, &s);
    c.ag_layer = 1.5;
    const plan_tl_result both = run(&c, &s);
    const double excess = (c.layers - 3) * (c.ag_layer + c.rs_layer - c.layer_bwd);
    EXPECT(alone.exposed_s[PLAN_TL_BWD] < c.rs_layer + 1e-9, "reduce-scatters alone: backward exposed %.3f",
           alone.exposed_s[PLAN_TL_BWD]);
    EXPECT(both.exposed_s[PLAN_TL_BWD] >= 0.8 * excess, "gathers + reduce-scatters on one link: backward exposed %.3f, "
           "expected at least %.3f", both.exposed_s[PLAN_TL_BWD], 0.8 * excess);
    plan_tl_costs h = base_costs(8, 1, FSDP_GRADS_PER_MICRO_BATCH);
    h.replicas = 1, h.ar_layer = 1.5, h.rs_layer = 1.5;
    plan_tl_schedule per_unit = s;
    per_unit.ar_per_unit = 1;
    const plan_tl_result apart = run(&h, &per_unit);
    h.replica_shares_link = 1;
    const plan_tl_result shared = run(&h, &per_unit);
    EXPECT(shared.step_s > apart.step_s + 1, "replica all-reduce on the shard link: step %.3f vs %.3f apart",
           shared.step_s, apart.step_s);
}

// (3) prefetch depth: with prefetch + 1 buffers each pass starts with that many layers still
// gathered, so one more buffer saves one gather per pass turn (2A - 1 of them): a gather-bound
// step is shorter by about that much, a compute-bound one does not change.
static void test_prefetch_depth(void) {
    static const struct { double ag; int A; int bound; } cases[] = {{3, 2, 1}, {3, 4, 1}, {0.2, 4, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        plan_tl_costs c = base_costs(8, cases[i].A, FSDP_GRADS_PER_MICRO_BATCH);
        c.ag_layer = cases[i].ag;
        plan_tl_schedule s1 = plan_tl_program_schedule(), s2 = s1;
        s2.prefetch = 2;
        const plan_tl_result r1 = run(&c, &s1), r2 = run(&c, &s2);
        const double saved = (2.0 * c.micro_batches - 1) * c.ag_layer;
        EXPECT(NEAR(r1.busy_s[PLAN_TL_GATHER] - r2.busy_s[PLAN_TL_GATHER], saved, 1e-9),
               "prefetch case %zu: gather busy %.3f vs %.3f, expected %.3f less", i, r1.busy_s[PLAN_TL_GATHER],
               r2.busy_s[PLAN_TL_GATHER], saved);
        const double gain = r1.step_s - r2.step_s;
        if (cases[i].bound)
            EXPECT(gain > 0.8 * saved && gain < 1.2 * saved, "prefetch case %zu: step %.3f -> %.3f, expected ~%.3f less",
                   i, r1.step_s, r2.step_s, saved);
        else
            EXPECT(fabs(gain) < 1e-9, "prefetch case %zu (compute-bound): step %.3f -> %.3f", i, r1.step_s, r2.step_s);
    }
}

// (4) --keep_params_gathered: every unit gathered once, in the first forward; no backward
// re-gather, so a gather-bound backward's exposed time goes to zero.
static void test_keep_gathered(void) {
    static const int As[] = {1, 2, 4};
    const plan_tl_schedule s = plan_tl_program_schedule();
    for (size_t i = 0; i < sizeof As / sizeof As[0]; i++) {
        plan_tl_costs c = base_costs(8, As[i], FSDP_GRADS_PER_MICRO_BATCH);
        c.ag_layer = 3;
        c.rs_layer = c.rs_root = 0;
        const plan_tl_result r0 = run(&c, &s);
        c.keep_gathered = 1;
        const plan_tl_result r1 = run(&c, &s);
        EXPECT(NEAR(r1.busy_s[PLAN_TL_GATHER], c.ag_root + c.layers * c.ag_layer, 1e-9), "keep A %d: gather busy %.3f",
               As[i], r1.busy_s[PLAN_TL_GATHER]);
        EXPECT(r0.exposed_s[PLAN_TL_BWD] > 1 && r1.exposed_s[PLAN_TL_BWD] < 1e-9,
               "keep A %d: backward exposed %.3f without, %.3f with", As[i], r0.exposed_s[PLAN_TL_BWD],
               r1.exposed_s[PLAN_TL_BWD]);
        EXPECT(r1.step_s < r0.step_s, "keep A %d: step %.3f not below %.3f", As[i], r1.step_s, r0.step_s);
    }
}

// (5) a host wait per micro-batch: where the root's backward does not wait for the layers'
// reduce-scatters (rs_flush_per_micro 0), the tail (layer 0's reduce-scatter beyond the root's
// backward) overlaps the next forward unless the host drains the device between micro-batches:
// then it is exposed in every micro-batch but the last (which the optimizer waits for anyway).
// With the flush (the program today) the host wait adds only its gap.
static void test_host_wait(void) {
    static const struct { int A, flush; } cases[] = {{2, 0}, {4, 0}, {4, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        plan_tl_costs c = base_costs(8, cases[i].A, FSDP_GRADS_ROOT_ONCE);
        c.rs_layer = 1.5, c.host_gap = 0.001;
        plan_tl_schedule per_step = plan_tl_program_schedule();
        per_step.rs_flush_per_micro = cases[i].flush, per_step.host_wait_per_micro = 0;
        plan_tl_schedule per_micro = per_step;
        per_micro.host_wait_per_micro = 1;
        const plan_tl_result r0 = run(&c, &per_step), r1 = run(&c, &per_micro);
        const double gaps = (c.micro_batches - 1) * c.host_gap;
        const double expect = gaps + (cases[i].flush ? 0 : (c.micro_batches - 1) * (c.rs_layer - c.root_bwd));
        EXPECT(NEAR(r1.step_s - r0.step_s, expect, 1e-9), "host wait A %d flush %d: %.4f -> %.4f, expected +%.4f",
               cases[i].A, cases[i].flush, r0.step_s, r1.step_s, expect);
    }
}

// (6) HSDP: the replica all-reduce after the backward (blocking, after the root's fp32
// reduce-scatter) against per unit as each slice is final (overlapping the rest of the
// backward): per unit only the last units' all-reduces stay exposed (layers 1 and 0, final at
// the root's flush, then the root's), and the root's blocking reduce-scatter runs under them.
static void test_replica_all_reduce(void) {
    static const int Ls[] = {4, 8, 16};
    for (size_t i = 0; i < sizeof Ls / sizeof Ls[0]; i++) {
        plan_tl_costs c = base_costs(Ls[i], 2, FSDP_GRADS_ROOT_ONCE);
        c.replicas = 1, c.ar_layer = 1.0, c.ar_root = 0.5, c.ar_all = c.layers * c.ar_layer + c.ar_root;
        plan_tl_schedule after = plan_tl_program_schedule(), per_unit = after;
        after.ar_per_unit = 0, per_unit.ar_per_unit = 1;
        const plan_tl_result r0 = run(&c, &after), r1 = run(&c, &per_unit);
        EXPECT(NEAR(r0.exposed_by[PLAN_TL_REPLICA], c.layers * c.ar_layer + c.ar_root, 1e-9),
               "all-reduce after, L %d: exposed %.3f", Ls[i], r0.exposed_by[PLAN_TL_REPLICA]);
        EXPECT(NEAR(r1.exposed_by[PLAN_TL_REPLICA], 2 * c.ar_layer + c.ar_root - c.rs_root_f32, 1e-9),
               "all-reduce per unit, L %d: exposed %.3f", Ls[i], r1.exposed_by[PLAN_TL_REPLICA]);
        EXPECT(NEAR(r0.step_s - r1.step_s, (c.layers - 2) * c.ar_layer + c.rs_root_f32, 1e-9),
               "L %d: step %.3f -> %.3f", Ls[i], r0.step_s, r1.step_s);
        EXPECT(r0.exposed_s[PLAN_TL_OPT] > r1.exposed_s[PLAN_TL_OPT], "L %d: optimizer exposed %.3f -> %.3f", Ls[i],
               r0.exposed_s[PLAN_TL_OPT], r1.exposed_s[PLAN_TL_OPT]);
    }
}

// (6b) the gradient norm per unit and, without clipping, AdamW per layer as each slice is final
// (fsdp.c norm_add, early_update). FSDP, one micro-batch, 8 layers, a layer's AdamW 0.5 and
// its norm 0.05 (the root's 0.1 and 0.01). With reduce-scatters of 1.5 (under a layer's
// backward, 2) the tail is exposed: after layer 0's backward its reduce-scatter (1.5) has
// only the root's backward (0.25) beside it, 1.25 idle. An early AdamW is held back until the
// next layer's reduce-scatter has started (so it runs under it, not before the backward feeding
// it): layer 2's then runs under layer 0's, and the idle tail shrinks by 0.5, the step with it,
// the compute the same. The norms run where the slices become final: the same step (they are
// compute either way). With fast reduce-scatters (0.03, nothing exposed) the step is the same.
static void test_update_early(void) {
    static const double rs[] = {1.5, 0.03};
    for (int i = 0; i < 2; i++) {
        plan_tl_costs c = base_costs(8, 1, FSDP_GRADS_PER_MICRO_BATCH);
        c.rs_layer = rs[i], c.optimizer = 0.2;
        c.adamw_layer = 0.5, c.adamw_root = 0.1, c.norm_layer = 0.05, c.norm_root = 0.01;
        plan_tl_schedule after = plan_tl_program_schedule(), early = after, norm_after = after;
        after.update_early = 0, early.update_early = 1, norm_after.norm_per_unit = 0;
        const plan_tl_result r0 = run(&c, &after), r1 = run(&c, &early), r2 = run(&c, &norm_after);
        const double saved = rs[i] > 1 ? c.adamw_layer : 0;
        EXPECT(NEAR(r0.step_s - r1.step_s, saved, 1e-9), "rs %.2f: step %.3f -> %.3f with the early AdamW (want -%.2f)",
               rs[i], r0.step_s, r1.step_s, saved);
        EXPECT(NEAR(r0.exposed_by[PLAN_TL_REDUCE] - r1.exposed_by[PLAN_TL_REDUCE], saved, 1e-9),
               "rs %.2f: reduce-scatter exposed %.3f -> %.3f", rs[i], r0.exposed_by[PLAN_TL_REDUCE],
               r1.exposed_by[PLAN_TL_REDUCE]);
        EXPECT(NEAR(r0.step_s, r2.step_s, 1e-9), "rs %.2f: norm per unit %.3f, after the backward %.3f", rs[i],
               r0.step_s, r2.step_s);
        // replicas: the norm waits for the all-reduces either way, and nothing updates early
        c.replicas = 1, c.ar_layer = 0.1, c.ar_root = 0.05;
        const plan_tl_result h0 = run(&c, &after), h1 = run(&c, &early);
        EXPECT(NEAR(h0.step_s, h1.step_s, 1e-12), "rs %.2f, replicas: %.3f vs %.3f", rs[i], h0.step_s, h1.step_s);
    }
}

// ----------------------------------------------------------------------------
// real plans

// CodeLlama-7b's config with `layers` layers; plan `req` into *p. 0 / -1.
static int plan_7b(plan *p, int layers, plan_request req) {
    llama_config cfg;
    if (llama_config_load(&cfg, "data/configs/codellama-7b/config.json")) return -1;
    cfg.num_hidden_layers = layers;
    return plan_compute(p, &cfg, &req);
}
static plan_request gpu_request(int W, int S, int B, int total) {
    return (plan_request){.world_size = W, .shard_size = S, .batch_size_per_device = B, .seq_len = 512,
                          .total_batch_size = total, .elem_bytes = 2, .attention_cudnn = 1};
}

// (7) one GPU: no collectives, so the timeline is the compute sum (the per-phase estimate plus
// the host's gaps); within 5% of the steps measured at 7B width, seq 512, one rank
// (scripts/bench_gpu.py; docs/results/2026-11-26-h100.md and -h200.md, finetune's rows).
static void test_measured_one_gpu(void) {
    static const struct { int device, layers, B; double measured_ms; } cases[] = {
        {1, 8, 4, 56.1}, {1, 8, 16, 158.5}, {1, 11, 4, 75.4}, {1, 11, 16, 214.7},   // H100 80GB
        {2, 8, 4, 52.1}, {2, 8, 16, 156.3},                                         // H200
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        plan p;
        const plan_device *d = &plan_devices[cases[i].device];
        if (plan_7b(&p, cases[i].layers, gpu_request(1, 1, cases[i].B, cases[i].B))) {
            EXPECT(0, "plan of case %zu: %s", i, ft_error_message());
            continue;
        }
        plan_tl_result r;
        const double t = plan_tl_step_seconds(&p, d, NULL, NULL, &r);
        plan_step_time old;
        plan_estimate_step_time(&p, d, &old);
        const double ratio = 1e3 * t / cases[i].measured_ms;
        EXPECT(fabs(ratio - 1) <= 0.05, "%s, %d layers, batch %d: timeline %.2f ms vs measured %.1f (%.3fx)", d->name,
               cases[i].layers, cases[i].B, 1e3 * t, cases[i].measured_ms, ratio);
        EXPECT(t >= old.total_s && t - old.total_s < 10 * PLAN_TL_HOST_GAP_S,
               "one GPU case %zu: timeline %.4f ms vs per-phase %.4f ms (only host gaps apart)", i, 1e3 * t,
               1e3 * old.total_s);
        EXPECT(r.binding == PLAN_TL_COMPUTE && r.busy_s[PLAN_TL_GATHER] == 0 && r.busy_s[PLAN_TL_REDUCE] == 0,
               "one GPU case %zu: binding %s, collectives", i, plan_tl_lane_name(r.binding));
    }
}

// NCCL's ring latency (plan_price.h, src/graph/tuning.cc): a base per collective, a network
// step for each ring step that crosses a node boundary (all-gather / reduce-scatter: nodes - 1;
// all-reduce: 2 (nodes - 1)), an NVLink step for every other ring step. Each case states its
// step counts; a rule charging the network step on every step of a group spanning nodes (a
// flat 64-GPU group over 8 nodes: 63 network steps) fails the multi-node cases.
static void test_ring_latency(void) {
    static const struct { plan_coll_kind kind; int n, nodes, nvlink_steps, net_steps; } cases[] = {
        {PLAN_COLL_ALL_GATHER, 1, 1, 0, 0},       {PLAN_COLL_ALL_GATHER, 8, 1, 7, 0},
        {PLAN_COLL_ALL_GATHER, 64, 8, 56, 7},     {PLAN_COLL_REDUCE_SCATTER, 64, 8, 56, 7},
        {PLAN_COLL_REDUCE_SCATTER, 16, 2, 14, 1}, {PLAN_COLL_ALL_REDUCE, 8, 1, 14, 0},
        {PLAN_COLL_ALL_REDUCE, 8, 8, 0, 14},      {PLAN_COLL_ALL_REDUCE, 64, 8, 112, 14},
        {PLAN_COLL_ALL_REDUCE, 2, 2, 0, 2},       {PLAN_COLL_BROADCAST, 4, 2, 2, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const double want = cases[i].n <= 1 ? 0
                                            : PLAN_COLL_BASE_LATENCY_S + cases[i].nvlink_steps * PLAN_COLL_STEP_NVLINK_S +
                                                  cases[i].net_steps * PLAN_COLL_STEP_NET_S;
        const double got = plan_price_collective_latency(cases[i].kind, cases[i].n, cases[i].nodes);
        EXPECT(NEAR(got, want, 1e-12), "latency case %zu (kind %d, %d ranks over %d nodes): %.2f us, want %.2f us "
               "(%d NVLink + %d network steps)", i, (int)cases[i].kind, cases[i].n, cases[i].nodes, 1e6 * got,
               1e6 * want, cases[i].nvlink_steps, cases[i].net_steps);
    }
    // the nodes a group spans, as src/launch.c splits the world: shard groups consecutive
    // ranks, replica groups every S-th rank
    static const struct { int first, stride, n, per_node, nodes; } groups[] = {
        {0, 1, 8, 8, 1}, {0, 1, 64, 8, 8}, {0, 8, 8, 8, 8}, {0, 4, 16, 8, 8}, {4, 1, 8, 8, 2},
        {0, 1, 4, 8, 1}, {0, 2, 2, 2, 2}, {1, 2, 2, 2, 2}, {0, 1, 2, 2, 1}, {0, 1, 1, 8, 1},
    };
    for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++) {
        const int got = plan_group_nodes(groups[i].first, groups[i].stride, groups[i].n, groups[i].per_node);
        EXPECT(got == groups[i].nodes, "group case %zu (ranks %d + k x %d, %d of them, %d per node): %d nodes, want %d",
               i, groups[i].first, groups[i].stride, groups[i].n, groups[i].per_node, got, groups[i].nodes);
    }
}

// The timeline's gathers and reduce-scatters carry the plan's bytes (plan.c counts them by its
// own formula): each lane's busy time is those bytes over the bus bandwidth plus a latency per
// collective (plan_price_collective_latency over the nodes the group spans, the emulator's
// virtual clock's too). Sharded jobs of 8 GPUs (one node) and 64 (HSDP 8 x 8, and flat FSDP
// over 8 nodes: its ring has 7 network steps of 63), and HSDP 8 x 2 on nodes of 4 GPUs
// (--dry_run_gpus_per_node: each shard group spans 2 nodes, each replica group 2).
static void test_plan_bytes(void) {
    static const struct { int W, S, B, total, keep, local, shard_nodes, per_node; } cases[] = {
        {8, 8, 4, 64, 0, 0, 1, 0},   {8, 8, 1, 64, 0, 0, 1, 0},  {8, 8, 2, 64, 1, 0, 1, 0}, {8, 8, 2, 64, 0, 1, 1, 0},
        {64, 8, 1, 128, 0, 0, 1, 0}, {64, 64, 1, 64, 0, 0, 8, 0}, {16, 8, 1, 64, 0, 0, 2, 4},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        plan p;
        plan_request req = gpu_request(cases[i].W, cases[i].S, cases[i].B, cases[i].total);
        req.keep_params_gathered = cases[i].keep, req.accumulate_grads_locally = cases[i].local;
        req.gpus_per_node = cases[i].per_node;
        if (plan_7b(&p, 32, req)) {
            EXPECT(0, "plan of case %zu: %s", i, ft_error_message());
            continue;
        }
        const plan_device *d = PLAN_FIT_DEVICE;
        const plan_fabric f = plan_fabric_of(&req, d);
        const int nodes = cases[i].shard_nodes;
        const double bw = nodes > 1 ? f.inter_busbw : f.intra_busbw;
        // (a gather's and a reduce-scatter's latency alike: S - 1 ring steps, plan_price.h)
        const double lat = plan_price_collective_latency(PLAN_COLL_ALL_GATHER, cases[i].S, nodes);
        plan_tl_result r;
        EXPECT(plan_tl_step_seconds(&p, d, &f, NULL, &r) > 0, "case %zu: %s", i, ft_error_message());
        const double ag = r.busy_s[PLAN_TL_GATHER] - (double)p.all_gather_bytes / bw;
        const double rs = r.busy_s[PLAN_TL_REDUCE] - (double)p.reduce_scatter_bytes / bw;
        const double n_ag = ag / lat, n_rs = rs / lat;   // collectives: whole numbers
        EXPECT(n_ag > 0.5 && fabs(n_ag - round(n_ag)) < 1e-3, "case %zu: gathers %.3f latencies beyond the plan's bytes",
               i, n_ag);
        EXPECT(n_rs > 0.5 && fabs(n_rs - round(n_rs)) < 1e-3,
               "case %zu: reduce-scatters %.3f latencies beyond the plan's bytes", i, n_rs);
        EXPECT(r.step_s > r.busy_s[PLAN_TL_COMPUTE], "case %zu: step %.4f", i, r.step_s);
        if (p.replica_size > 1) {   // HSDP: one all-reduce per unit (L layers + the root), one rank per node
            const double ar = r.busy_s[PLAN_TL_REPLICA] - (double)p.all_reduce_bytes / f.inter_busbw;
            const double ar_lat = plan_price_collective_latency(PLAN_COLL_ALL_REDUCE, p.replica_size, p.replica_size);
            EXPECT(NEAR(ar, 33 * ar_lat, 1e-6), "case %zu: all-reduce busy %.6f s, the plan's bytes say %.6f + "
                   "33 latencies", i, r.busy_s[PLAN_TL_REPLICA], (double)p.all_reduce_bytes / f.inter_busbw);
        }
    }
}

// --dry_run_row_tokens: the estimates compute rows of that length (the GEMMs linear in it,
// attention more than linear), memory stays planned for --seq_len; beyond --seq_len refused.
static void test_row_tokens(void) {
    static const int rows[] = {128, 256, 384};
    plan full;
    if (plan_7b(&full, 8, gpu_request(1, 1, 4, 4))) {
        EXPECT(0, "plan: %s", ft_error_message());
        return;
    }
    const double t_full = plan_tl_step_seconds(&full, PLAN_FIT_DEVICE, NULL, NULL, NULL);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        plan p;
        plan_request req = gpu_request(1, 1, 4, 4);
        req.row_tokens = rows[i];
        if (plan_7b(&p, 8, req)) {
            EXPECT(0, "plan at %d tokens per row: %s", rows[i], ft_error_message());
            continue;
        }
        const double t = plan_tl_step_seconds(&p, PLAN_FIT_DEVICE, NULL, NULL, NULL), f = rows[i] / 512.0;
        EXPECT(p.total == full.total, "%d tokens per row: memory %zu, at --seq_len %zu", rows[i], p.total, full.total);
        EXPECT(p.tokens == full.tokens * f, "%d tokens per row: %.0f tokens", rows[i], p.tokens);
        EXPECT(t < t_full && t > 0.3 * t_full, "%d tokens per row: step %.2f ms vs %.2f at 512", rows[i], 1e3 * t,
               1e3 * t_full);
    }
    plan p;
    plan_request req = gpu_request(1, 1, 4, 4);
    req.row_tokens = 513;
    EXPECT(plan_7b(&p, 8, req) != 0 && strstr(ft_error_message(), "--dry_run_row_tokens"),
           "513 tokens per row at --seq_len 512 accepted (%s)", ft_error_message());
}

int main(void) {
    test_comm_fast();
    test_lane_bound();
    test_shared_link();
    test_prefetch_depth();
    test_keep_gathered();
    test_host_wait();
    test_replica_all_reduce();
    test_update_early();
    test_measured_one_gpu();
    test_ring_latency();
    test_plan_bytes();
    test_row_tokens();
    TEST_SUMMARY("test_plan_timeline");
}
