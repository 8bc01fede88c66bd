// fsdp.c: sharded parameters, gradients and optimizer state (see fsdp.h).
#include "fsdp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

// ----------------------------------------------------------------------------
// setup

size_t fsdp_pad_multiple(int shard_size) { return (size_t)shard_size * 16; }

const char *fsdp_sharding_name(int S, int W) {
    if (S > 1) return S < W ? "HSDP" : "FSDP full shard";
    return W > 1 ? "none (DDP)" : "none (single device)";
}

fsdp_grad_mode fsdp_resolve_grad_mode(fsdp_grad_mode asked, int shard_size) {
    return shard_size == 1 ? FSDP_GRADS_DIRECT : asked;
}

// Global element range [lo, hi) of unit u held by this rank.
static void fsdp_unit_range(const fsdp_state *s, int u, size_t *lo, size_t *hi) {
    *lo = s->layout->unit_offset[u] + (size_t)s->shard->rank * s->slice[u];
    *hi = *lo + s->slice[u];
}

// address of field f of *s for the table's slot, or NULL when only planning (s NULL)
#define SLOT(s, f) ((s) ? (void *)&(s)->f : NULL)

// The --dry_run lines of a state's buffers, per role (the adapters' are told apart from the model's).
typedef struct {
    const char *params, *opt, *opt_host, *grad_host, *param_host, *grads, *root, *layers, *rs, *rs2, *rs_layers, *full,
        *micro_s, *micro_1,
        *micro_s_f32, *micro_layers_f32, *f32, *f32_root, *kept, *norm;
} fsdp_lines;
static const fsdp_lines model_lines = {
    "working parameters, this rank's slice", "fp32 master weights + AdamW exp_avg, exp_avg_sq (slice)",
    "offloaded optimizer: fp32 master weights + AdamW exp_avg, exp_avg_sq (slice), host memory",
    "offloaded optimizer: two units' fp32 gradient slices, host memory (largest slice)",
    "offloaded optimizer: two units' updated working parameters, host memory (largest slice)",
    "fp32 gradients of the step (slice)", "root unit (embeddings, norm, lm_head), gathered",
    "two layer units: in use + prefetched", "reduce-scatter output (largest slice)",
    "second layer reduce-scatter output (one in flight)",
    "two layer reduce-scatter outputs (one in flight; the root's goes to its gradient slice once per step)",
    "full-size fp32 gradients summed over micro-batches",
    "one micro-batch's root + two layer gradients (one reducing while the next computes)",
    "one micro-batch's root + layer gradients",
    "one micro-batch's root + two layer gradients, fp32 (--reduce_dtype fp32; one reducing while the next computes)",
    "one micro-batch's two layer gradients, fp32 (one reducing while the next computes; the root's add into the fp32 sum)",
    "fp32 unit buffer (checkpoint gathers)",
    "fp32 unit buffer (checkpoint gathers; during a step the root gradient sum)",
    "every unit, gathered once per optimizer step and kept (--keep_params_gathered)",
    "gradient norm: each unit's sum of squares (one double per unit)"};
static const fsdp_lines adapter_lines = {
    "LoRA adapters: working parameters (slice)", "LoRA adapters: fp32 master + AdamW moments (slice)",
    "LoRA adapters: offloaded fp32 master + AdamW moments (slice), host memory",
    "LoRA adapters: two units' fp32 gradient slices, host memory (largest slice)",
    "LoRA adapters: two units' updated working parameters, host memory (largest slice)",
    "LoRA adapters: fp32 gradients of the step (slice)", "LoRA adapters: root unit (empty), gathered",
    "LoRA adapters: two layer units, gathered", "LoRA adapters: reduce-scatter outputs",
    "LoRA adapters: reduce-scatter outputs", "LoRA adapters: reduce-scatter outputs", "LoRA adapters: full-size fp32 gradients summed over micro-batches",
    "LoRA adapters: one micro-batch's gradients", "LoRA adapters: one micro-batch's gradients",
    "LoRA adapters: one micro-batch's gradients, fp32", "LoRA adapters: one micro-batch's gradients, fp32",
    "LoRA adapters: fp32 unit buffer (checkpoint gathers)", "LoRA adapters: fp32 unit buffer (checkpoint gathers)",
    "LoRA adapters: every unit, gathered once per optimizer step and kept (--keep_params_gathered)",
    "LoRA adapters: gradient norm, each unit's sum of squares"};

// A state set up as `setup` holds the working parameters (and gathers) only.
static int setup_params_only(const fsdp_setup *setup) { return setup->role == FSDP_FROZEN || setup->eval_only; }
int fsdp_params_only(const fsdp_state *s) { return setup_params_only(&s->setup); }

// The dtype of a state's per-micro-batch gradient buffers and reduce-scatters (fsdp_state.gdt).
static st_dtype grad_dtype(const fsdp_setup *setup, st_dtype working) {
    return setup->reduce_f32 && !setup_params_only(setup) ? ST_F32 : working;
}
// Whether the root's micro-batch gradients go straight into the fp32 step sum (root_acc):
// FSDP_GRADS_ROOT_ONCE with fp32 gradient buffers (no root buffer, no add pass).
static int root_into_acc(fsdp_grad_mode resolved, size_t gesz) {
    return resolved == FSDP_GRADS_ROOT_ONCE && gesz == sizeof(float);
}

void fsdp_buffer_table(mem_table *t, const param_layout *l, int shard_size, const fsdp_setup *setup, size_t esz,
                       fsdp_state *s) {
    const fsdp_grad_mode mode = fsdp_resolve_grad_mode(setup->mode, shard_size);
    const fsdp_role role = setup->role;
    const int params_only = setup_params_only(setup);
    const int offload = setup->offload && !params_only, keep_gathered = setup->keep_gathered;
    const size_t S = (size_t)shard_size, n_local = l->total / S, nf = n_local * sizeof(float);
    const size_t nm = n_local * (setup->moments_bf16 ? 2 : sizeof(float));   // each moment's bytes
    const int accumulate_locally = mode == FSDP_GRADS_LOCAL, root_once = mode == FSDP_GRADS_ROOT_ONCE && S > 1;
    // per-micro-batch gradients and reduce-scatter outputs: esz, or fp32 (grad_dtype)
    const size_t gesz = setup->reduce_f32 && !params_only ? sizeof(float) : esz;
    const fsdp_lines *w = role == FSDP_ADAPTERS ? &adapter_lines : &model_lines;
    const size_t layer = l->unit_numel[0], root = l->unit_numel[l->n_layers];
    size_t max_unit = 0;
    for (int u = 0; u < l->n_units; u++) max_unit = l->unit_numel[u] > max_unit ? l->unit_numel[u] : max_unit;
    const size_t max_slice = max_unit / S;   // S divides every unit

    if (params_only) {   // --eval_only: the role's own line
        const char *what = role == FSDP_FROZEN ? "frozen base (LoRA): working parameters only, this rank's slice"
                                               : w->params;
        mem_table_add(t, MEM_PARAMS, n_local * esz, what, SLOT(s, params));
    } else {
        // --offload_optimizer: the optimizer state lives in host memory, the rest stays put
        const mem_category oc = offload ? MEM_HOST : MEM_OPTIMIZER;
        const char *opt = offload ? w->opt_host : w->opt;
        mem_table_add(t, MEM_PARAMS, n_local * esz, w->params, SLOT(s, params));
        mem_table_add(t, oc, nf, opt, SLOT(s, master));
        mem_table_add(t, oc, nm, opt, SLOT(s, exp_avg));
        mem_table_add(t, oc, nm, opt, SLOT(s, exp_avg_sq));
        mem_table_add(t, MEM_GRADS, nf, w->grads, SLOT(s, grads));
        mem_table_add(t, MEM_WORKSPACE, (size_t)l->n_units * sizeof(double), w->norm, SLOT(s, norm_acc));
    }
    if (S > 1 && keep_gathered) {
        const char *kept = role == FSDP_FROZEN ? "frozen base (LoRA): every unit, gathered once and kept "
                                                 "(--keep_params_gathered)"
                           : params_only ? "every unit, gathered once and kept (--keep_params_gathered)" : w->kept;
        mem_table_add(t, MEM_GATHERED, l->total * esz, kept, SLOT(s, all_full));
    } else if (S > 1) {
        mem_table_add(t, MEM_GATHERED, root * esz, w->root, SLOT(s, root_full));
        mem_table_add(t, MEM_GATHERED, layer * esz, w->layers, SLOT(s, layer_full[0]));
        mem_table_add(t, MEM_GATHERED, layer * esz, w->layers, SLOT(s, layer_full[1]));
    }
    if (params_only) return;
    if (S > 1 && !accumulate_locally) {   // (local accumulation reduce-scatters into the fp32 slices)
        // [0] takes the root's slice too, unless the root is reduce-scattered once per step
        // from its fp32 sum straight into its gradient slice (ROOT_ONCE): then layers only
        const size_t rs0 = root_once ? layer / S : max_slice;
        mem_table_add(t, MEM_WORKSPACE, rs0 * gesz, root_once ? w->rs_layers : w->rs, SLOT(s, rs_out[0]));
        mem_table_add(t, MEM_WORKSPACE, layer / S * gesz, root_once ? w->rs_layers : w->rs2, SLOT(s, rs_out[1]));
    }
    if (accumulate_locally) {   // fp32 whatever the backend: A micro-batches summed without rounding
        mem_table_add(t, MEM_GRADS, l->total * sizeof(float), w->full, SLOT(s, grad_full));
    } else if (mode != FSDP_GRADS_DIRECT) {
        const int f32 = gesz != esz, into_acc = root_into_acc(mode, gesz);
        const char *g = into_acc ? w->micro_layers_f32 : f32 ? w->micro_s_f32 : S > 1 ? w->micro_s : w->micro_1;
        if (!into_acc) mem_table_add(t, MEM_GRADS, root * gesz, g, SLOT(s, root_grad));
        mem_table_add(t, MEM_GRADS, layer * gesz, g, SLOT(s, layer_grad[0]));
        if (S > 1) mem_table_add(t, MEM_GRADS, layer * gesz, g, SLOT(s, layer_grad[1]));
    }
    // (one shard: a checkpoint copies the fp32 slices, which are whole units, straight to the host)
    if (S > 1) mem_table_add(t, MEM_WORKSPACE, max_unit * sizeof(float), root_once ? w->f32_root : w->f32, SLOT(s, unit_f32));
    if (offload) {
        mem_table_add(t, MEM_HOST, max_slice * sizeof(float), w->grad_host, SLOT(s, grad_host[0]));
        mem_table_add(t, MEM_HOST, max_slice * sizeof(float), w->grad_host, SLOT(s, grad_host[1]));
        if (esz != sizeof(float)) {
            mem_table_add(t, MEM_HOST, max_slice * esz, w->param_host, SLOT(s, param_host[0]));
            mem_table_add(t, MEM_HOST, max_slice * esz, w->param_host, SLOT(s, param_host[1]));
        }
    }
}

int fsdp_init(fsdp_state *s, const param_layout *l, const backend *be, mem_tracker *mem,
              comm *shard, comm *replica, fsdp_grad_mode mode) {
    return fsdp_init_role(s, l, be, mem, shard, replica, &(fsdp_setup){.mode = mode, .role = FSDP_TRAINED});
}

int fsdp_init_role(fsdp_state *s, const param_layout *l, const backend *be, mem_tracker *mem, comm *shard,
                   comm *replica, const fsdp_setup *setup) {
    const fsdp_role role = setup->role;
    const int offload = setup->offload, keep_gathered = setup->keep_gathered;
    memset(s, 0, sizeof *s);
    s->layout = l;
    s->role = role;
    s->offload = !setup_params_only(setup) && offload;
    if (s->offload && setup->moments_bf16) {   // the host AdamW and its staging keep fp32 moments
        memset(s, 0, sizeof *s);
        return ft_error("flags --offload_optimizer and --optimizer_moments bf16 do not combine (the offloaded "
                        "moments are fp32 in host memory; use one or the other)");
    }
    s->mdt = setup->moments_bf16 ? ST_BF16 : ST_F32;
    // the host casts the updated weights to the working dtype itself (host_cast_from_f32)
    if (s->offload && be->dtype != ST_F32 && be->dtype != ST_BF16) {
        memset(s, 0, sizeof *s);
        return ft_error("flag --offload_optimizer: backend dtype %s is not supported", st_dtype_name(be->dtype));
    }
    s->be = be;
    s->mem = mem;
    s->shard = shard;
    s->replica = replica;
    s->esz = st_dtype_size(be->dtype);
    s->gdt = grad_dtype(setup, be->dtype);
    s->keep_gathered = keep_gathered && shard->size > 1;
    s->poison_fresh = ft_getenv("FT_TEST_POISON_FRESH_GRADS") != NULL;
    s->mode = fsdp_resolve_grad_mode(setup->mode, shard->size);
    s->accumulate_locally = s->mode == FSDP_GRADS_LOCAL;
    s->micro_first = s->micro_last = 1;
    s->held[0] = s->held[1] = -1;
    s->rs_unit[0] = s->rs_unit[1] = -1;
    const size_t S = (size_t)shard->size;
    s->slice = ft_calloc((size_t)l->n_units, sizeof(size_t), "slice table");
    s->local_off = ft_calloc((size_t)l->n_units, sizeof(size_t), "slice offsets");
    s->off_done = ft_calloc((size_t)l->n_units, 1, "offload unit flags");
    s->kept = ft_calloc((size_t)l->n_units, 1, "gathered unit flags");
    s->ar_req = ft_calloc((size_t)l->n_units, sizeof(void *), "all-reduce requests");
    s->ar_live = ft_calloc((size_t)l->n_units, 1, "all-reduce flags");
    s->norm_done = ft_calloc((size_t)l->n_units, 1, "gradient norm flags");
    s->off_pending = s->upd_pending = -1;
    if (!s->slice || !s->local_off || !s->off_done || !s->kept || !s->ar_req || !s->ar_live || !s->norm_done) {
        fsdp_free(s);
        return -1;
    }
    for (int u = 0; u < l->n_units; u++) {
        if (l->unit_numel[u] % S != 0) {
            fsdp_free(s);
            return ft_error("fsdp: unit %d has %zu elements, not a multiple of the shard group size %zu "
                            "(layout padding is wrong)", u, l->unit_numel[u], S);
        }
        s->slice[u] = l->unit_numel[u] / S;
        s->local_off[u] = s->n_local;
        s->n_local += s->slice[u];
        if (l->unit_numel[u] > s->max_unit) s->max_unit = l->unit_numel[u];
    }
    s->setup = (fsdp_setup){s->mode, role, s->offload, s->keep_gathered, setup->reduce_f32, setup->eval_only,
                            setup->moments_bf16};
    mem_table t = mem_table_allocator(mem);
    fsdp_buffer_table(&t, l, shard->size, &s->setup, s->esz, s);
    if (t.failed) { fsdp_free(s); return -1; }
    // the checkpoint gather buffer (max_unit >= the root's elements) is idle during a step
    if (s->mode == FSDP_GRADS_ROOT_ONCE) s->root_acc = s->unit_f32;
    const size_t nf = fsdp_params_only(s) ? 0 : s->n_local * sizeof(float);
    const size_t nm = fsdp_params_only(s) ? 0 : s->n_local * st_dtype_size(s->mdt);
    if (s->offload) {   // host memory: the host zeroes it
        memset(s->master, 0, nf);
        memset(s->exp_avg, 0, nm);
        memset(s->exp_avg_sq, 0, nm);
    }
    if (be->zero(s->params, s->n_local * s->esz) || (nf && be->zero(s->grads, nf)) ||
        (nf && be->zero(s->norm_acc, (size_t)l->n_units * sizeof(double))) ||
        (nf && !s->offload && (be->zero(s->master, nf) || be->zero(s->exp_avg, nm) || be->zero(s->exp_avg_sq, nm)))) {
        fsdp_free(s);
        return -1;
    }
    return 0;
}

static int replica_drain(fsdp_state *s);

void fsdp_free(fsdp_state *s) {
    if (s->layout && s->slice) {
        for (int b = 0; b < 2; b++) {   // nothing may be in flight into a buffer being freed
            if (s->pending[b]) comm_wait(s->shard, s->pending[b]);
            if (s->rs_pending[b]) comm_wait(s->shard, s->rs_pending[b]);
        }
        (void)replica_drain(s);
        if (s->offload)
            for (int k = 0; k < BACKEND_COPY_TICKETS; k++) (void)s->be->copy_wait(k);
        mem_table t = mem_table_releaser(s->mem);
        fsdp_buffer_table(&t, s->layout, s->shard->size, &s->setup, s->esz, s);
    }
    free(s->slice);
    free(s->local_off);
    free(s->off_done);
    free(s->kept);
    free(s->ar_req);
    free(s->ar_live);
    free(s->norm_done);
    memset(s, 0, sizeof *s);
}

// ----------------------------------------------------------------------------
// the provider: gather before use, reduce-scatter finished gradients

static char *local_params(fsdp_state *s, int u) { return (char *)s->params + s->local_off[u] * s->esz; }

// Start gathering layer u into buffer b (non-blocking).
static int gather_start(fsdp_state *s, int u, int b) {
    TRY(comm_iall_gather(s->shard, s->layer_full[b], local_params(s, u), s->slice[u], s->be->dtype, &s->pending[b]));
    s->held[b] = u;
    return 0;
}

static int gather_finish(fsdp_state *s, int b) {
    if (!s->pending[b]) return 0;
    void *req = s->pending[b];
    s->pending[b] = NULL;
#ifdef FT_FAULT_SKIP_PREFETCH_WAIT
    // TEST-ONLY FAULT (tests/test_cuda_emu_hazards.sh): use the prefetched unit without
    // waiting for its all-gather (its event leaks); the emulated runtime must report the read
    (void)req;
    return 0;
#else
    return comm_wait(s->shard, req);
#endif
}

void fsdp_invalidate_gathered(fsdp_state *s) {
    s->root_held = 0;
    for (int b = 0; b < 2; b++) {
        if (s->pending[b]) gather_finish(s, b);
        s->held[b] = -1;
    }
    if (s->kept) memset(s->kept, 0, (size_t)s->layout->n_units);
}

// keep_gathered: unit u's place in all_full
static void *kept_params(fsdp_state *s, int u) { return (char *)s->all_full + s->layout->unit_offset[u] * s->esz; }

// keep_gathered: unit u from all_full, gathered there first unless kept since the parameters
// last changed; then the next unit of the pass (forward: root, 0, 1, ..; backward: down) is
// gathered non-blocking unless kept. One prefetch in flight at a time (pending[0], held[0]).
static int kept_acquire(fsdp_state *s, int u, int for_backward, void **params) {
    const int L = s->layout->n_layers;
    if (s->held[0] == u) {   // prefetched: wait for it
        TRY(gather_finish(s, 0));
        s->held[0] = -1;
        s->kept[u] = 1;
    }
    if (!s->kept[u]) {
        TRY(comm_all_gather(s->shard, kept_params(s, u), local_params(s, u), s->slice[u], s->be->dtype));
        s->kept[u] = 1;
    }
    *params = kept_params(s, u);
    const int next = u == L ? (for_backward ? -1 : 0) : for_backward ? u - 1 : (u + 1 < L ? u + 1 : -1);
    if (next < 0 || s->kept[next] || s->held[0] == next) return 0;
    if (s->held[0] >= 0) {   // an older prefetch still in flight: complete it first
        TRY(gather_finish(s, 0));
        s->kept[s->held[0]] = 1;
    }
    TRY(comm_iall_gather(s->shard, kept_params(s, next), local_params(s, next), s->slice[next], s->be->dtype,
                         &s->pending[0]));
    s->held[0] = next;
    return 0;
}

static int prov_acquire(void *ctx, int u, int for_backward, void **params) {
    fsdp_state *s = ctx;
    if (s->shard->size == 1) { *params = local_params(s, u); return 0; }
    if (s->keep_gathered) return kept_acquire(s, u, for_backward, params);
    const int L = s->layout->n_layers;
    int next;
    if (u == L) {   // the root: gathered once, kept until the parameters change; the forward starts at layer 0
        if (!s->root_held) TRY(comm_all_gather(s->shard, s->root_full, local_params(s, u), s->slice[u], s->be->dtype));
        s->root_held = 1;
        *params = s->root_full;
        next = for_backward ? -1 : 0;
    } else {
        int b = s->held[0] == u ? 0 : s->held[1] == u ? 1 : -1;
        if (b < 0) {                 // not prefetched: gather now into the other buffer
            b = s->held[0] == -1 ? 0 : 1;
            TRY(gather_finish(s, b));
            TRY(gather_start(s, u, b));
        }
        TRY(gather_finish(s, b));
        *params = s->layer_full[b];
        next = for_backward ? u - 1 : (u + 1 < L ? u + 1 : -1);
    }
    if (next >= 0 && s->held[0] != next && s->held[1] != next) {
        // the buffer not holding the unit in use (for the root: either free one)
        int b = (u != L && s->layer_full[0] == *params) ? 1 : (u != L ? 0 : (s->held[0] == -1 ? 0 : 1));
        TRY(gather_finish(s, b));
        TRY(gather_start(s, next, b));
    }
    return 0;
}

static int prov_release(void *ctx, int u) { (void)ctx; (void)u; return 0; }

// Per-micro-batch mode with S > 1 overlaps gradient reduction with compute: a layer's
// reduce-scatter starts (non-blocking) when its backward is done, into the buffer pair of
// its parity; it is finished (waited for and added into the fp32 slice) only when that
// buffer pair is needed again two layers later, or when the root unit ends the backward.
static int overlapped(const fsdp_state *s) { return s->shard->size > 1 && !s->accumulate_locally; }
static int offload_grad_final(fsdp_state *s, int u);
static int early_update(fsdp_state *s, int u);
static int update_pending(fsdp_state *s);

// ----------------------------------------------------------------------------
// the sums across replicas (R > 1), unit by unit
//
// A unit's gradient slice is final once the step's last micro-batch made its last
// contribution to it (grad_final): after its backward (one shard: the backward writes the
// slice), after its reduce-scatter was waited for and added (per micro-batch, rs_finish), or
// after its blocking reduce-scatter (the root, local accumulation). Its all-reduce across
// replicas starts there, non-blocking, in place: on the replica group's own comm stream
// (nccl) behind everything the compute stream was given so far, so it overlaps the rest of
// the backward, which touches only other units' slices. fsdp_finish_grads makes the compute
// stream wait for all of them before the gradient norm and the optimizer read the slices.
// In NCCL's one-lane mode (comm.h comm_nccl_choose_lanes: every collective on one stream, in
// issue order) a unit's all-reduce queues behind the prefetch already issued (the layer
// computed next) and in front of the one after, which has a layer's backward to arrive in:
// starting them all in fsdp_finish_grads instead would expose every one of them. The timeline
// (src/plan_timeline.c, a shared link taken in issue order: that mode) agrees: per unit is
// faster at every all-reduce size tried, 16 layers, from compute-bound to link-bound.

static int replica_start(fsdp_state *s, int u) {
    if (s->ar_live[u])
        return ft_error("fsdp: unit %d's gradient slice changed after its sum across replicas started", u);
    TRY(comm_iall_reduce(s->replica, s->grads + s->local_off[u], s->slice[u], ST_F32, &s->ar_req[u]));
    s->ar_live[u] = 1;
    return 0;
}

// wait for every all-reduce in flight (all are waited for even when one fails). 0 / -1.
static int replica_drain(fsdp_state *s) {
    int rc = 0;
    for (int u = 0; s->ar_live && u < s->layout->n_units; u++) {
        if (!s->ar_live[u]) continue;
        s->ar_live[u] = 0;
#ifdef FT_FAULT_SKIP_AR_WAIT
        // TEST-ONLY FAULT (tests/test_cuda_emu_hazards.sh): the gradient norm and the optimizer
        // read the slices without waiting for their all-reduces (the events leak); the
        // emulated runtime must report the read
        continue;
#endif
        if (comm_wait(s->replica, s->ar_req[u]) != 0) rc = -1;
    }
    return rc;
}

// ----------------------------------------------------------------------------
// the gradient norm, unit by unit (R = 1)
//
// With one replica a unit's slice is final on this rank when grad_final says so, and its sum
// of squares is added (on the device, no host wait) into its own double of norm_acc then;
// fsdp_finish_grads adds the units' doubles in unit order on the host after one read. So the
// norm no longer waits for the tail of the backward (the last reduce-scatters) and does not
// read the whole slice again after it, and its value does not depend on the order in which
// units become final (backward order, the reduce-scatters' parity). With R > 1 a unit's
// slice changes again in its all-reduce (on the replica stream), so fsdp_finish_grads takes
// the whole slice after them, as one sum_squares (the order of before).

// unit u's sum of squares into norm_acc[u], once per step; a second time (a slice changed
// after it was final: a caller running several last micro-batches without fsdp_zero_grads)
// marks the per-unit sums stale, and fsdp_finish_grads takes the whole slice instead
static int norm_add(fsdp_state *s, int u) {
    if (s->norm_done[u]) {
        s->norm_stale = 1;
        return 0;
    }
    s->norm_done[u] = 1;
    return s->be->sum_squares_accumulate(s->norm_acc + u, s->grads + s->local_off[u], s->slice[u]);
}

// a new step's sums: zero, none taken
static int norm_reset(fsdp_state *s) {
    memset(s->norm_done, 0, (size_t)s->layout->n_units);
    s->norm_stale = 0;
    return s->be->zero(s->norm_acc, (size_t)s->layout->n_units * sizeof(double));
}

// this rank's sum of squares of its slice (R = 1: per unit, the units not taken yet first)
static int norm_local(fsdp_state *s, double *sq) {
    const int n = s->layout->n_units;
    if (s->replica->size > 1 || s->norm_stale) return s->be->sum_squares(sq, s->grads, s->n_local);
    for (int u = 0; u < n; u++)
        if (!s->norm_done[u]) TRY(norm_add(s, u));
    double *part = ft_malloc((size_t)n * sizeof(double), "per-unit gradient norms");
    if (!part) return -1;
    const int rc = s->be->copy_d2h(part, s->norm_acc, (size_t)n * sizeof(double));
    *sq = 0;
    for (int u = 0; u < n; u++) *sq += part[u];
    free(part);
    return rc;
}

// Unit u's gradient slice received its last contribution of this micro-batch: in the step's
// last micro-batch it is final, so its sum across replicas starts (R > 1) or its sum of
// squares is taken (R = 1), and an armed early update starts (offload_grad_final; on the
// device, early_update).
static int grad_final(fsdp_state *s, int u) {
    if (!s->micro_last) return 0;
    TRY(s->replica->size > 1 ? replica_start(s, u) : norm_add(s, u));
    return s->offload ? offload_grad_final(s, u) : early_update(s, u);
}
static int grad_buffer(const fsdp_state *s, int u) { return overlapped(s) ? u % 2 : 0; }

// the buffer unit u's micro-batch gradient goes to (gdt; the fp32 root sum when root_into_acc)
static void *unit_grad_buffer(fsdp_state *s, int u) {
    if (s->accumulate_locally) return (float *)s->grad_full + s->layout->unit_offset[u];
    if (u == s->layout->n_layers) return root_into_acc(s->mode, st_dtype_size(s->gdt)) ? s->root_acc : s->root_grad;
    return s->layer_grad[grad_buffer(s, u)];
}

// complete the outstanding reduce-scatter of buffer pair b, if any
static int rs_finish(fsdp_state *s, int b) {
    if (s->rs_unit[b] < 0) return 0;
    const int u = s->rs_unit[b];
    void *req = s->rs_pending[b];
    s->rs_unit[b] = -1;
    s->rs_pending[b] = NULL;
    TRY(comm_wait(s->shard, req));
    TRY(s->be->accumulate(s->grads + s->local_off[u], s->rs_out[b], s->gdt, s->slice[u], 1.0f));
    return grad_final(s, u);
}

// Complete every outstanding non-blocking reduce-scatter of layer gradients into the fp32
// slices (the root unit's grad_end and fsdp_finish_grads call it). 0 / -1.
static int fsdp_flush_grads(fsdp_state *s) {
    TRY(rs_finish(s, 0));
    return rs_finish(s, 1);
}

// -1 with ft_error: `what` asked of a frozen state (the LoRA base has no gradients or optimizer state)
static int frozen_error(const char *what) {
    return ft_error("fsdp: %s of a state holding working parameters only (a frozen LoRA base, or --eval_only)", what);
}

// FT_TEST_POISON_FRESH_GRADS (test-only): a fresh gradient buffer is filled with 0xFF bytes
// (NaN in fp32 and bf16) first, so an element the backward fails to overwrite turns the
// gradient norm into NaN instead of carrying another layer's stale value.
static int poison(fsdp_state *s, void *g, size_t nbytes) {
    static unsigned char *ff;   // (max_unit x esz) 0xFF bytes on the host, kept for the run
    static size_t ff_bytes;
    if (ff_bytes < nbytes) {
        free(ff);
        ff = ft_malloc(nbytes, "gradient poison");
        if (!ff) { ff_bytes = 0; return -1; }
        memset(ff, 0xFF, nbytes);
        ff_bytes = nbytes;
    }
    return s->be->copy_h2d(g, ff, nbytes);
}

static int prov_grad_begin(void *ctx, int u, unit_grad *ug) {
    fsdp_state *s = ctx;
    if (fsdp_params_only(s)) return frozen_error("gradients");
    const int L = s->layout->n_layers;
    ug->fresh = 0;
    if (s->mode == FSDP_GRADS_DIRECT) {   // the step's fp32 gradient itself (one shard)
        ug->data = s->grads + s->local_off[u];
        ug->dtype = ST_F32;
        // a trained layer is handed over fresh in the step's first micro-batch: its dW GEMMs
        // write it with beta 0 and the model zeroes the rest, so fsdp_zero_grads zeroes only
        // the root (the embedding's scatter-add, the tied lm_head); later micro-batches add
        if (s->micro_first && u < L && s->role == FSDP_TRAINED) {
            ug->fresh = 1;
            return s->poison_fresh ? poison(s, ug->data, s->layout->unit_numel[u] * sizeof(float)) : 0;
        }
        return 0;
    }
    ug->dtype = s->accumulate_locally ? ST_F32 : s->gdt;
    const size_t gesz = st_dtype_size(ug->dtype);
    if (overlapped(s)) TRY(u == L ? fsdp_flush_grads(s) : rs_finish(s, grad_buffer(s, u)));
    void *g = unit_grad_buffer(s, u);
    ug->data = g;
    // per micro-batch buffers start anew; local accumulation only at the step's start. A
    // trained layer is overwritten by its backward (fresh: no zero pass); the root (the
    // embedding's scatter-add, the tied lm_head) and LoRA adapters are zeroed and added into.
    if (s->accumulate_locally && !s->micro_first) return 0;
    if (u < L && s->role == FSDP_TRAINED) {
        ug->fresh = 1;
        return s->poison_fresh ? poison(s, g, s->layout->unit_numel[u] * gesz) : 0;
    }
    if (g == s->root_acc) {   // root_into_acc: the backward adds into the step's fp32 sum
        if (s->micro_first) {
            TRY(s->be->zero(s->root_acc, s->layout->unit_numel[u] * sizeof(float)));
            s->root_acc_live = 1;
        }
        return 0;
    }
    TRY(s->be->zero(g, s->layout->unit_numel[u] * gesz));
    if (u == L && s->root_acc && s->micro_first) {
        TRY(s->be->zero(s->root_acc, s->layout->unit_numel[u] * sizeof(float)));
        s->root_acc_live = 1;
    }
    return 0;
}

// FSDP_GRADS_ROOT_ONCE: the root's micro-batch gradient is added into the fp32 sum (unless
// the backward added it there itself: root_into_acc); after the last micro-batch the sum is
// reduce-scattered, in fp32, straight into the root's gradient slice (its only contribution
// of the step, so = is +=)
static int root_grad_end(fsdp_state *s) {
    const int L = s->layout->n_layers;
    if (s->root_grad) TRY(s->be->accumulate(s->root_acc, s->root_grad, s->gdt, s->layout->unit_numel[L], 1.0f));
    if (!s->micro_last) return 0;
    s->root_acc_live = 0;
    TRY(comm_reduce_scatter(s->shard, s->grads + s->local_off[L], s->root_acc, s->slice[L], ST_F32));
    return grad_final(s, L);
}

static int prov_grad_end(void *ctx, int u) {
    fsdp_state *s = ctx;
    if (s->mode == FSDP_GRADS_DIRECT) return grad_final(s, u);   // the slice is the unit's sum
    const void *g = unit_grad_buffer(s, u);
    if (s->accumulate_locally) {   // the step's fp32 sum, reduce-scattered once (= is +=: zeroed slice)
        if (!s->micro_last) return 0;
        TRY(comm_reduce_scatter(s->shard, s->grads + s->local_off[u], g, s->slice[u], ST_F32));
        return grad_final(s, u);
    }
    if (overlapped(s) && u < s->layout->n_layers) {
        const int b = grad_buffer(s, u);
        TRY(rs_finish(s, b));   // normally done by grad_begin already
        TRY(comm_ireduce_scatter(s->shard, s->rs_out[b], g, s->slice[u], s->gdt, &s->rs_pending[b]));
        s->rs_unit[b] = u;
        return update_pending(s);   // (an early AdamW behind the reduce-scatter just started)
    }
    if (overlapped(s)) {   // the root ends the backward: the last early AdamW under the tail's reduce-scatters
        TRY(update_pending(s));
        TRY(fsdp_flush_grads(s));
    }
    if (s->root_acc) return root_grad_end(s);
    if (s->shard->size > 1) {
        TRY(comm_reduce_scatter(s->shard, s->rs_out[0], g, s->slice[u], s->gdt));
        g = s->rs_out[0];
    }
    TRY(s->be->accumulate(s->grads + s->local_off[u], g, s->gdt, s->slice[u], 1.0f));
    return grad_final(s, u);
}

void fsdp_set_micro_batch(fsdp_state *s, int first, int last) {
    s->micro_first = first;
    s->micro_last = last;
}

unit_provider fsdp_provider(fsdp_state *s) {
    unit_provider p = {s, prov_acquire, prov_release, prov_grad_begin, prov_grad_end};
    return p;
}

// ----------------------------------------------------------------------------
// moving whole units in and out (loading, checkpoints)

// Element k of a slice buffer: the master (fp32) or a moment (mdt), and its element size.
static void *buffer_at(fsdp_state *s, fsdp_buffer which, size_t k, size_t *esz) {
    *esz = which == FSDP_MASTER ? sizeof(float) : st_dtype_size(s->mdt);
    char *b = which == FSDP_MASTER ? (char *)s->master : which == FSDP_EXP_AVG ? s->exp_avg : s->exp_avg_sq;
    return b + k * *esz;
}
static void *moment_at(fsdp_state *s, fsdp_buffer which, size_t k) {
    size_t e;
    return buffer_at(s, which, k, &e);
}

// dst (n, dtype) = src (n, fp32) on the host, rounded as the backends' cast_from_f32 rounds
// (nearest even for bf16; fp32 is a copy).
static void host_cast_from_f32(void *dst, const float *src, size_t n, st_dtype dtype) {
    if (dtype == ST_F32) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    uint16_t *h = dst;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) h[i] = ft_f32_to_bf16(src[i]);
}

// Unit u's working parameters (this rank's slice) from `src` (slice, host fp32), converted on
// the host: the frozen base (no fp32 master to cast from) and an offloaded master (on the host).
static int params_from_host(fsdp_state *s, int u, const float *src) {
    fsdp_invalidate_gathered(s);
    if (s->be->dtype == ST_F32) return s->be->copy_h2d(local_params(s, u), src, s->slice[u] * sizeof(float));
    if (s->be->dtype != ST_BF16) return ft_error("fsdp: backend dtype %s is not supported", st_dtype_name(s->be->dtype));
    void *h = ft_malloc(s->slice[u] * s->esz, "unit slice in the working dtype");   // (slice,)
    if (!h) return -1;
    host_cast_from_f32(h, src, s->slice[u], s->be->dtype);
    const int rc = s->be->copy_h2d(local_params(s, u), h, s->slice[u] * s->esz);
    free(h);
    return rc;
}

int fsdp_set_unit(fsdp_state *s, fsdp_buffer which, int u, const float *host_full) {
    const float *src = host_full + (size_t)s->shard->rank * s->slice[u];
    if (fsdp_params_only(s))
        return which == FSDP_MASTER ? params_from_host(s, u, src) : frozen_error("optimizer state");
    size_t bsz;
    void *dst = buffer_at(s, which, s->local_off[u], &bsz);
    if (s->offload) {   // host memory (fp32: offload keeps fp32 moments)
        memcpy(dst, src, s->slice[u] * sizeof(float));
        return which == FSDP_MASTER ? params_from_host(s, u, dst) : 0;
    }
    if (bsz != sizeof(float)) {   // bf16 moments: rounded on the host as the AdamW op stores them
        void *h = ft_malloc(s->slice[u] * bsz, "moment slice in bf16");   // (slice,)
        if (!h) return -1;
        host_cast_from_f32(h, src, s->slice[u], s->mdt);
        const int rc = s->be->copy_h2d(dst, h, s->slice[u] * bsz);
        free(h);
        return rc;
    }
    TRY(s->be->copy_h2d(dst, src, s->slice[u] * sizeof(float)));
    if (which == FSDP_MASTER) {
        fsdp_invalidate_gathered(s);
        TRY(s->be->cast_from_f32(local_params(s, u), dst, s->slice[u]));
    }
    return 0;
}

void fsdp_slice_range(const fsdp_state *s, int u, size_t *lo, size_t *hi) {
    *lo = (size_t)s->shard->rank * s->slice[u];
    *hi = *lo + s->slice[u];
}

void fsdp_grid_place(const fsdp_state *s, int *index, int *count) {
    *index = s->shard->rank + s->shard->size * s->replica->rank;
    *count = s->shard->size * s->replica->size;
}

// fsdp_get_unit of a bf16 moment (src: this rank's slice of unit u, in backend memory; never
// offloaded): gathered as is (into the fp32 unit buffer, which holds twice that), brought to
// the host and widened to fp32 there, exactly.
static int get_unit_bf16(fsdp_state *s, int u, const void *src, float *host_full) {
    const size_t n = s->layout->unit_numel[u];
    uint16_t *h = ft_malloc(n * sizeof(uint16_t), "moment unit in bf16");   // (unit_numel,)
    if (!h) return -1;
    int rc = 0;
    if (s->shard->size == 1) {
        rc = s->be->copy_d2h(h, src, n * sizeof(uint16_t));
    } else {
        // as raw bytes, two bf16 to an fp32 element (a gather copies; slices are multiples of 16
        // elements; the CPU's MPI transport carries no bf16)
        rc = comm_all_gather(s->shard, s->unit_f32, src, s->slice[u] / 2, ST_F32);
        if (rc == 0) rc = s->be->copy_d2h(h, s->unit_f32, n * sizeof(uint16_t));
    }
    for (size_t i = 0; rc == 0 && i < n; i++) host_full[i] = ft_bf16_to_f32(h[i]);
    free(h);
    return rc;
}

int fsdp_get_unit(fsdp_state *s, fsdp_buffer which, int u, float *host_full) {
    if (fsdp_params_only(s)) return frozen_error("fp32 units");
    if (s->root_acc_live)
        return ft_error("fsdp: a unit gathered in the middle of an optimizer step (its buffer holds the root gradient sum)");
    size_t bsz;
    const void *src = buffer_at(s, which, s->local_off[u], &bsz);
    if (bsz != sizeof(float)) return get_unit_bf16(s, u, src, host_full);
    const size_t n = s->slice[u] * sizeof(float);
    if (s->offload && s->shard->size == 1) {
        memcpy(host_full, src, n);
        return 0;
    }
    if (s->offload) {   // the collective needs backend memory: stage through the idle gradient slice
        float *stage = s->grads + s->local_off[u];
        TRY(s->be->copy_h2d(stage, src, n));
        src = stage;
    }
    if (s->shard->size == 1) return s->be->copy_d2h(host_full, src, n);
    TRY(comm_all_gather(s->shard, s->unit_f32, src, s->slice[u], ST_F32));
    return s->be->copy_d2h(host_full, s->unit_f32, s->layout->unit_numel[u] * sizeof(float));
}

int fsdp_zero_moments(fsdp_state *s) {
    if (fsdp_params_only(s)) return 0;   // none
    const size_t nm = s->n_local * st_dtype_size(s->mdt);
    if (s->offload) {
        memset(s->exp_avg, 0, nm);
        memset(s->exp_avg_sq, 0, nm);
        return 0;
    }
    return s->be->zero(s->exp_avg, nm) || s->be->zero(s->exp_avg_sq, nm) ? -1 : 0;
}

// ----------------------------------------------------------------------------
// optimizer step

int fsdp_zero_grads(fsdp_state *s) {
    if (fsdp_params_only(s)) return frozen_error("gradients");
    TRY(replica_drain(s));   // (none after fsdp_finish_grads: only a step that failed leaves some)
    TRY(norm_reset(s));
    if (s->mode == FSDP_GRADS_DIRECT && s->role == FSDP_TRAINED) {   // the layers come fresh (prov_grad_begin)
        const int L = s->layout->n_layers;
        return s->be->zero(s->grads + s->local_off[L], s->slice[L] * sizeof(float));
    }
    return s->be->zero(s->grads, s->n_local * sizeof(float));
}

int fsdp_finish_grads(fsdp_state *s, double *norm) {
    if (fsdp_params_only(s)) return frozen_error("gradients");
    TRY(fsdp_flush_grads(s));   // nothing is outstanding after a full backward; cheap check
    TRY(update_pending(s));     // (armed: the last layer's early AdamW, before the norm's read)
    if (s->replica->size > 1) {   // (every unit normally started in the last backward: grad_final)
        for (int u = 0; u < s->layout->n_units; u++)
            if (!s->ar_live[u]) TRY(replica_start(s, u));
        TRY(replica_drain(s));
    }
    double sq = 0;
    TRY(norm_local(s, &sq));
    TRY(comm_all_reduce_f64(s->shard, &sq, 1));
    *norm = sqrt(sq);
    return 0;
}

// The part of entry e in this rank's slice: local index *k and length (0: none).
static size_t entry_local_range(const fsdp_state *s, const param_entry *e, size_t *k) {
    size_t lo, hi;
    fsdp_unit_range(s, e->unit, &lo, &hi);
    size_t a = e->offset > lo ? e->offset : lo, b = e->offset + e->numel < hi ? e->offset + e->numel : hi;
    if (a >= b) return 0;
    *k = s->local_off[e->unit] + (a - lo);   // local index of global element a
    return b - a;
}

// p for the AdamW of the slice at local index k of unit u: .offset its index among the model's
// parameters without the units' padding (the stochastic rounding's counter of bf16 moments:
// the padding is a multiple of 16 x the shard size, so padded offsets would differ by world
// size). Layers come first in the flat buffer, then the root (param_layout.c).
static adamw_params slice_params(const fsdp_state *s, int u, size_t k, const adamw_params *p) {
    const param_layout *l = s->layout;
    size_t lo, hi;
    fsdp_unit_range(s, u, &lo, &hi);
    const size_t in_unit = lo + (k - s->local_off[u]) - l->unit_offset[u];
    const size_t unit_base = (size_t)(u < l->n_layers ? u : l->n_layers) * l->layer_numel;
    adamw_params q = *p;
    q.offset = (uint64_t)(unit_base + in_unit);
    return q;
}

// --offload_optimizer: AdamW on the host, unit by unit, as a three-stage pipeline over two
// host buffer pairs (slots, taken in turn):
//     copy stream:  D2H grads of the next unit -> grad_host[b']    H2D param_host[b] -> params of u
//     host:         AdamW of u on master/moments (grad_host[b]), cast into param_host[b]
// The gradient slice of the next unit travels while the host updates unit u, and unit u's new
// working parameters travel while the host updates the next. Tickets: gradients 0/1,
// parameters 2/3 (per slot), so a buffer is reused only after its last copy is waited for.
// With an fp32 backend the working parameters are the master itself (no param_host, no cast).
// Units enter in any order: 0 .. n-1 at the optimizer step, or layers from the last down as
// their gradients become final in the backward (fsdp_offload_early).
enum { TICKET_GRAD = 0, TICKET_PARAM = 2 };

// The emulated device's virtual clock (tests/cuda_emu, FT_EMU_VCLOCK): charges host work that
// moves `bytes` of host memory to the host's virtual time, at the estimate's host rate; absent
// from a real build (a weak reference, as train.c's cuemu_vclock_now), where the host's time
// passes by itself.
extern void cuemu_vclock_host_bytes(double bytes) __attribute__((weak));

// Unit u (slot b, its gradient slice on its way to grad_host[b]): AdamW on the host, then
// its working parameters back to the device.
static int offload_update(fsdp_state *s, int u, int b) {
    const param_layout *l = s->layout;
    const size_t u0 = s->local_off[u], n = s->slice[u];
    adamw_params nodecay = s->off_params;
    nodecay.weight_decay = 0.0f;
    TRY(s->be->copy_wait(TICKET_GRAD + b));   // unit u's gradient is on the host
    for (int i = 0; i < l->n_entries; i++) {
        const param_entry *e = &l->entries[i];
        size_t k, m;
        if (e->unit != u || (m = entry_local_range(s, e, &k)) == 0) continue;
        const adamw_params q = slice_params(s, u, k, e->decay ? &s->off_params : &nodecay);
        TRY(backend_cpu()->adamw(s->master + k, NULL, s->grad_host[b] + (k - u0), moment_at(s, FSDP_EXP_AVG, k),
                                 moment_at(s, FSDP_EXP_AVG_SQ, k), s->mdt, m, &q));
    }
    // the host AdamW's bytes for the virtual clock, counted as plan.c's offload_host_bytes
    if (cuemu_vclock_host_bytes) cuemu_vclock_host_bytes((double)n * (28.0 + (double)s->esz));
    const void *src = s->master + u0;
    if (s->esz != sizeof(float)) {
        TRY(s->be->copy_wait(TICKET_PARAM + b));   // param_host[b]'s previous unit has left
        host_cast_from_f32(s->param_host[b], s->master + u0, n, s->be->dtype);
        src = s->param_host[b];
    }
    return s->be->copy_async(local_params(s, u), src, n * s->esz, 1, TICKET_PARAM + b);
}

// Unit u's gradient slice is final: start its copy to the host (ordered after the device
// work issued so far), then update the unit that came before it, whose copy has had that
// long to arrive.
static int offload_push(fsdp_state *s, int u) {
    const int b = s->off_slot;
    s->off_slot ^= 1;
    s->off_done[u] = 1;
    TRY(s->be->copy_async(s->grad_host[b], s->grads + s->local_off[u], s->slice[u] * sizeof(float), 0, TICKET_GRAD + b));
    if (s->off_pending >= 0) TRY(offload_update(s, s->off_pending, b ^ 1));
    s->off_pending = u;   // in slot b = off_slot ^ 1
    return 0;
}

// Update the last unit pushed and wait for every parameter copy: the next forward may run.
static int offload_drain(fsdp_state *s) {
    if (s->off_pending >= 0) {
        const int u = s->off_pending;
        s->off_pending = -1;
        TRY(offload_update(s, u, s->off_slot ^ 1));
    }
    s->off_early = 0;
    memset(s->off_done, 0, (size_t)s->layout->n_units);
#ifdef FT_FAULT_SKIP_OFFLOAD_WAIT
    // TEST-ONLY FAULT (tests/test_offload.sh): the next forward reads the working parameters
    // without waiting for their copies to the device; the emulated runtime must report it
    return 0;
#else
    return s->be->copy_wait(TICKET_PARAM) || s->be->copy_wait(TICKET_PARAM + 1) ? -1 : 0;
#endif
}

// Called wherever a unit's gradient slice receives its last contribution of a micro-batch:
// in an armed step's last micro-batch, layer units start their update now.
static int offload_grad_final(fsdp_state *s, int u) {
    if (!s->off_early || !s->micro_last || u == s->layout->n_layers) return 0;
    return offload_push(s, u);
}

int fsdp_offload_can_overlap(const fsdp_state *s) {
    return s->offload && !fsdp_params_only(s) && s->replica->size == 1 && !s->accumulate_locally;
}

void fsdp_offload_early(fsdp_state *s, const adamw_params *p) {
    if (!fsdp_offload_can_overlap(s)) return;
    s->off_params = *p;
    s->off_early = 1;
}

int fsdp_update_can_overlap(const fsdp_state *s) {
    return fsdp_offload_can_overlap(s) || (!s->offload && !fsdp_params_only(s) && s->replica->size == 1);
}

void fsdp_update_early(fsdp_state *s, const adamw_params *p) {
    if (!fsdp_update_can_overlap(s)) return;
    s->off_params = *p;
    s->off_early = 1;
}

// AdamW of unit u's entries (this rank's slice), decaying ones with p, the others without.
static int unit_adamw(fsdp_state *s, int u, const adamw_params *p) {
    const param_layout *l = s->layout;
    adamw_params nodecay = *p;
    nodecay.weight_decay = 0.0f;
    for (int i = 0; i < l->n_entries; i++) {
        const param_entry *e = &l->entries[i];
        size_t k, m;
        if (e->unit != u || (m = entry_local_range(s, e, &k)) == 0) continue;
        const adamw_params q = slice_params(s, u, k, e->decay ? p : &nodecay);
        TRY(s->be->adamw(s->master + k, (char *)s->params + k * s->esz, s->grads + k,
                         moment_at(s, FSDP_EXP_AVG, k), moment_at(s, FSDP_EXP_AVG_SQ, k), s->mdt, m, &q));
    }
    return 0;
}

// the early AdamW waiting for the next reduce-scatter's start (upd_pending), if any
static int update_pending(fsdp_state *s) {
    const int u = s->upd_pending;
    s->upd_pending = -1;
    return u >= 0 ? unit_adamw(s, u, &s->off_params) : 0;
}

// Armed (fsdp_update_early, on the device): layer u's gradient slice is final in the last
// micro-batch, so AdamW updates it on the compute stream behind its last use: its backward
// is done (grad_end follows it) and no later work of the step reads its parameters. Its
// gathered copies are forgotten (the gather buffers and, kept gathered, all_full): they hold
// the parameters before the update. The root waits for the step. With overlapped
// reduce-scatters (final in rs_finish, at the grad_begin of the layer two below) the update
// waits for the next layer's reduce-scatter to start (prov_grad_end, update_pending), so that
// it runs under that collective instead of delaying the backward feeding it; the last one
// under the tail (the root's grad_end, before its flush).
static int early_update(fsdp_state *s, int u) {
    if (!s->off_early || u == s->layout->n_layers) return 0;
    if (s->off_done[u]) return ft_error("fsdp: unit %d's gradient slice changed after its early update", u);
    s->off_done[u] = 1;
    if (s->kept) s->kept[u] = 0;
    for (int b = 0; b < 2; b++)
        if (s->held[b] == u && !s->pending[b]) s->held[b] = -1;
    if (!overlapped(s)) return unit_adamw(s, u, &s->off_params);
    TRY(update_pending(s));
    s->upd_pending = u;
    return 0;
}

static int offload_step(fsdp_state *s, const adamw_params *p) {
    if (s->off_early && memcmp(p, &s->off_params, sizeof *p) != 0)
        return ft_error("fsdp: the optimizer step's AdamW parameters differ from those armed by fsdp_offload_early");
    s->off_params = *p;
    for (int u = 0; u < s->layout->n_units; u++)
        if (!s->off_done[u]) TRY(offload_push(s, u));
    return offload_drain(s);
}

int fsdp_optimizer_step(fsdp_state *s, const adamw_params *p) {
    if (fsdp_params_only(s)) return frozen_error("an optimizer step");
    fsdp_invalidate_gathered(s);
    if (s->offload) return offload_step(s, p);
    if (s->off_early && memcmp(p, &s->off_params, sizeof *p) != 0)
        return ft_error("fsdp: the optimizer step's AdamW parameters differ from those armed by fsdp_update_early");
    TRY(update_pending(s));
    // unit by unit (AdamW is elementwise: the same values as one pass over the entries)
    for (int u = 0; u < s->layout->n_units; u++)
        if (!s->off_done[u]) TRY(unit_adamw(s, u, p));
    s->off_early = 0;
    memset(s->off_done, 0, (size_t)s->layout->n_units);
    return 0;
}
