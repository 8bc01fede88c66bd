// fsdp.c: sharded parameters, gradients and optimizer state (see fsdp.h).
#include "fsdp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

// ----------------------------------------------------------------------------
// setup

void fsdp_unit_range(const fsdp_state *s, int u, size_t *lo, size_t *hi) {
    *lo = s->layout->unit_offset[u] + (size_t)s->shard->rank * s->slice[u];
    *hi = *lo + s->slice[u];
}

static void *take(fsdp_state *s, mem_category cat, size_t nbytes, int *failed) {
    if (*failed || nbytes == 0) return NULL;
    void *p = mem_alloc(s->mem, cat, nbytes);
    if (!p) *failed = 1;
    return p;
}

int fsdp_init(fsdp_state *s, const param_layout *l, const backend *be, mem_tracker *mem,
              comm *shard, comm *replica, int accumulate_locally) {
    memset(s, 0, sizeof *s);
    s->layout = l;
    s->be = be;
    s->mem = mem;
    s->shard = shard;
    s->replica = replica;
    s->esz = st_dtype_size(be->dtype);
    s->accumulate_locally = accumulate_locally;
    s->micro_first = s->micro_last = 1;
    const size_t S = (size_t)shard->size;
    s->slice = ft_calloc((size_t)l->n_units, sizeof(size_t), "slice table");
    s->local_off = ft_calloc((size_t)l->n_units, sizeof(size_t), "slice offsets");
    if (!s->slice || !s->local_off) { fsdp_free(s); return -1; }
    size_t max_slice = 0;
    for (int u = 0; u < l->n_units; u++) {
        if (l->unit_numel[u] % S != 0) {
            fsdp_free(s);
            return ft_error("fsdp: unit %d has %zu elements, not a multiple of the shard group size %zu "
                            "(layout padding is wrong)", u, l->unit_numel[u], S);
        }
        s->slice[u] = l->unit_numel[u] / S;
        s->local_off[u] = s->n_local;
        s->n_local += s->slice[u];
        if (s->slice[u] > max_slice) max_slice = s->slice[u];
        if (l->unit_numel[u] > s->max_unit) s->max_unit = l->unit_numel[u];
    }
    const int L = l->n_layers;
    const size_t nf = s->n_local * sizeof(float), layer = l->unit_numel[0], root = l->unit_numel[L];
    int failed = 0;
    s->params = take(s, MEM_PARAMS, s->n_local * s->esz, &failed);
    s->master = take(s, MEM_OPTIMIZER, nf, &failed);
    s->exp_avg = take(s, MEM_OPTIMIZER, nf, &failed);
    s->exp_avg_sq = take(s, MEM_OPTIMIZER, nf, &failed);
    s->grads = take(s, MEM_GRADS, nf, &failed);
    if (S > 1) {
        s->root_full = take(s, MEM_GATHERED, root * s->esz, &failed);
        s->layer_full[0] = take(s, MEM_GATHERED, layer * s->esz, &failed);
        s->layer_full[1] = take(s, MEM_GATHERED, layer * s->esz, &failed);
        s->rs_out[0] = take(s, MEM_WORKSPACE, max_slice * s->esz, &failed);
        if (!accumulate_locally) s->rs_out[1] = take(s, MEM_WORKSPACE, s->slice[0] * s->esz, &failed);
    }
    if (accumulate_locally) {
        s->grad_full = take(s, MEM_GRADS, l->total * s->esz, &failed);
    } else {
        s->root_grad = take(s, MEM_GRADS, root * s->esz, &failed);
        s->layer_grad[0] = take(s, MEM_GRADS, layer * s->esz, &failed);
        if (S > 1) s->layer_grad[1] = take(s, MEM_GRADS, layer * s->esz, &failed);
    }
    s->rs_unit[0] = s->rs_unit[1] = -1;
    s->unit_f32 = take(s, MEM_WORKSPACE, s->max_unit * sizeof(float), &failed);
    if (failed) { fsdp_free(s); return -1; }
    s->held[0] = s->held[1] = -1;
    if (be->zero(s->params, s->n_local * s->esz) || be->zero(s->master, nf) || be->zero(s->exp_avg, nf) ||
        be->zero(s->exp_avg_sq, nf) || be->zero(s->grads, nf)) {
        fsdp_free(s);
        return -1;
    }
    return 0;
}

void fsdp_free(fsdp_state *s) {
    if (s->layout && s->slice) {
        const param_layout *l = s->layout;
        const size_t nf = s->n_local * sizeof(float), layer = l->unit_numel[0], root = l->unit_numel[l->n_layers];
        size_t max_slice = 0;
        for (int u = 0; u < l->n_units; u++) if (s->slice[u] > max_slice) max_slice = s->slice[u];
        mem_free(s->mem, MEM_PARAMS, s->params, s->n_local * s->esz);
        mem_free(s->mem, MEM_OPTIMIZER, s->master, nf);
        mem_free(s->mem, MEM_OPTIMIZER, s->exp_avg, nf);
        mem_free(s->mem, MEM_OPTIMIZER, s->exp_avg_sq, nf);
        mem_free(s->mem, MEM_GRADS, s->grads, nf);
        mem_free(s->mem, MEM_GATHERED, s->root_full, root * s->esz);
        for (int b = 0; b < 2; b++) {
            if (s->pending[b]) comm_wait(s->shard, s->pending[b]);
            mem_free(s->mem, MEM_GATHERED, s->layer_full[b], layer * s->esz);
        }
        for (int b = 0; b < 2; b++) {
            if (s->rs_pending[b]) comm_wait(s->shard, s->rs_pending[b]);
            mem_free(s->mem, MEM_GRADS, s->layer_grad[b], layer * s->esz);
        }
        mem_free(s->mem, MEM_WORKSPACE, s->rs_out[0], max_slice * s->esz);
        mem_free(s->mem, MEM_WORKSPACE, s->rs_out[1], s->slice[0] * s->esz);
        mem_free(s->mem, MEM_GRADS, s->grad_full, l->total * s->esz);
        mem_free(s->mem, MEM_GRADS, s->root_grad, root * s->esz);
        mem_free(s->mem, MEM_WORKSPACE, s->unit_f32, s->max_unit * sizeof(float));
    }
    free(s->slice);
    free(s->local_off);
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
    for (int b = 0; b < 2; b++) {
        if (s->pending[b]) gather_finish(s, b);
        s->held[b] = -1;
    }
}

static int prov_acquire(void *ctx, int u, int for_backward, void **params) {
    fsdp_state *s = ctx;
    if (s->shard->size == 1) { *params = local_params(s, u); return 0; }
    const int L = s->layout->n_layers;
    int next;
    if (u == L) {   // the root: gathered whole, kept for the step; the forward starts at layer 0
        TRY(comm_all_gather(s->shard, s->root_full, local_params(s, u), s->slice[u], s->be->dtype));
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
static int grad_buffer(const fsdp_state *s, int u) { return overlapped(s) ? u % 2 : 0; }

static void *unit_grad(fsdp_state *s, int u) {
    if (s->accumulate_locally) return (char *)s->grad_full + s->layout->unit_offset[u] * s->esz;
    return u == s->layout->n_layers ? s->root_grad : s->layer_grad[grad_buffer(s, u)];
}

// complete the outstanding reduce-scatter of buffer pair b, if any
static int rs_finish(fsdp_state *s, int b) {
    if (s->rs_unit[b] < 0) return 0;
    const int u = s->rs_unit[b];
    void *req = s->rs_pending[b];
    s->rs_unit[b] = -1;
    s->rs_pending[b] = NULL;
    TRY(comm_wait(s->shard, req));
    return s->be->accumulate(s->grads + s->local_off[u], s->rs_out[b], s->slice[u], 1.0f);
}

int fsdp_flush_grads(fsdp_state *s) {
    TRY(rs_finish(s, 0));
    return rs_finish(s, 1);
}

static int prov_grad_begin(void *ctx, int u, void **grads) {
    fsdp_state *s = ctx;
    const int L = s->layout->n_layers;
    if (overlapped(s)) TRY(u == L ? fsdp_flush_grads(s) : rs_finish(s, grad_buffer(s, u)));
    void *g = unit_grad(s, u);
    // per micro-batch buffers start from zero; local accumulation only at the step's start
    if (!s->accumulate_locally || s->micro_first) TRY(s->be->zero(g, s->layout->unit_numel[u] * s->esz));
    *grads = g;
    return 0;
}

static int prov_grad_end(void *ctx, int u) {
    fsdp_state *s = ctx;
    if (s->accumulate_locally && !s->micro_last) return 0;   // reduced after the last micro-batch
    const void *g = unit_grad(s, u);
    if (overlapped(s) && u < s->layout->n_layers) {
        const int b = grad_buffer(s, u);
        TRY(rs_finish(s, b));   // normally done by grad_begin already
        TRY(comm_ireduce_scatter(s->shard, s->rs_out[b], g, s->slice[u], s->be->dtype, &s->rs_pending[b]));
        s->rs_unit[b] = u;
        return 0;
    }
    if (overlapped(s)) TRY(fsdp_flush_grads(s));   // the root ends the backward
    if (s->shard->size > 1) {
        TRY(comm_reduce_scatter(s->shard, s->rs_out[0], g, s->slice[u], s->be->dtype));
        g = s->rs_out[0];
    }
    return s->be->accumulate(s->grads + s->local_off[u], g, s->slice[u], 1.0f);
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

static float *buffer_of(fsdp_state *s, fsdp_buffer which) {
    return which == FSDP_MASTER ? s->master : which == FSDP_EXP_AVG ? s->exp_avg : s->exp_avg_sq;
}

int fsdp_set_unit(fsdp_state *s, fsdp_buffer which, int u, const float *host_full) {
    float *dst = buffer_of(s, which) + s->local_off[u];
    const float *src = host_full + (size_t)s->shard->rank * s->slice[u];
    TRY(s->be->copy_h2d(dst, src, s->slice[u] * sizeof(float)));
    if (which == FSDP_MASTER) {
        fsdp_invalidate_gathered(s);
        TRY(s->be->cast_from_f32(local_params(s, u), dst, s->slice[u]));
    }
    return 0;
}

int fsdp_get_unit(fsdp_state *s, fsdp_buffer which, int u, float *host_full) {
    const float *src = buffer_of(s, which) + s->local_off[u];
    if (s->shard->size == 1) return s->be->copy_d2h(host_full, src, s->slice[u] * sizeof(float));
    TRY(comm_all_gather(s->shard, s->unit_f32, src, s->slice[u], ST_F32));
    return s->be->copy_d2h(host_full, s->unit_f32, s->layout->unit_numel[u] * sizeof(float));
}

int fsdp_load_hf(fsdp_state *s, const hf_checkpoint *ck) {
    TRY(hf_checkpoint_validate(ck, s->layout));
    float *host = ft_malloc(s->max_unit * sizeof(float), "checkpoint unit buffer");
    if (!host) return -1;
    int rc = 0;
    for (int u = 0; u < s->layout->n_units && rc == 0; u++) {
        rc = hf_checkpoint_read_unit(ck, s->layout, u, host);
        if (rc == 0) rc = fsdp_set_unit(s, FSDP_MASTER, u, host);
    }
    free(host);
    const size_t nf = s->n_local * sizeof(float);
    if (rc == 0) rc = s->be->zero(s->exp_avg, nf) || s->be->zero(s->exp_avg_sq, nf) ? -1 : 0;
    return rc;
}

// ----------------------------------------------------------------------------
// optimizer step

int fsdp_zero_grads(fsdp_state *s) { return s->be->zero(s->grads, s->n_local * sizeof(float)); }

int fsdp_finish_grads(fsdp_state *s, double *norm) {
    TRY(fsdp_flush_grads(s));   // nothing is outstanding after a full backward; cheap check
    if (s->replica->size > 1) TRY(comm_all_reduce(s->replica, s->grads, s->n_local, ST_F32));
    double sq = 0;
    TRY(s->be->sum_squares(&sq, s->grads, s->n_local));
    TRY(comm_all_reduce_f64(s->shard, &sq, 1));
    *norm = sqrt(sq);
    return 0;
}

int fsdp_optimizer_step(fsdp_state *s, const adamw_params *p) {
    const param_layout *l = s->layout;
    fsdp_invalidate_gathered(s);
    adamw_params nodecay = *p;
    nodecay.weight_decay = 0.0f;
    for (int i = 0; i < l->n_entries; i++) {
        const param_entry *e = &l->entries[i];
        size_t lo, hi;
        fsdp_unit_range(s, e->unit, &lo, &hi);
        size_t a = e->offset > lo ? e->offset : lo, b = e->offset + e->numel < hi ? e->offset + e->numel : hi;
        if (a >= b) continue;
        size_t k = s->local_off[e->unit] + (a - lo);   // local index of global element a
        TRY(s->be->adamw(s->master + k, (char *)s->params + k * s->esz, s->grads + k, s->exp_avg + k,
                         s->exp_avg_sq + k, b - a, e->decay ? p : &nodecay));
    }
    return 0;
}
