// plan_timeline.c: one optimizer step on the program's own schedule (see plan_timeline.h).
#include "plan_timeline.h"

#include <math.h>
#include <string.h>

#include "backend.h"
#include "common.h"
#include "fsdp.h"

const char *plan_tl_lane_name(plan_tl_lane l) {
    static const char *names[PLAN_TL_LANES] = {"compute", "all-gather", "reduce-scatter", "all-reduce", "offload",
                                               "host"};
    return names[l];
}

plan_tl_schedule plan_tl_program_schedule(void) {
    // (no host wait per micro-batch: its rows go up from pinned slots, src/model.c inputs_upload,
    // and the losses are read once per step)
    return (plan_tl_schedule){.prefetch = 1, .host_wait_per_micro = 0, .rs_flush_per_micro = 1, .ar_per_unit = 1,
                              .offload_early = 0, .norm_per_unit = 1, .update_early = 0};
}

// ----------------------------------------------------------------------------
// the simulator's state

typedef struct {
    const plan_tl_costs *c;
    const plan_tl_schedule *s;
    plan_tl_result *r;
    plan_tl_phase phase;
    double host;                         // when the host issues its next operation
    double free[PLAN_TL_LANES];          // when each device lane has done what is queued on it
    double link_free;                    // when the shard group's link has carried what is issued
    double pace[BACKEND_PACE_LAG + 1];   // compute-stream marks of the last layers (cu_pace)
    long paced;
    int micro, last_micro;               // the micro-batch and whether it is the step's last
    // gathers: units still gathered (or on their way), by buffer
    int held[PLAN_TL_MAX_LAYERS + 1];    // 1: unit u's gathered copy is current
    double ag_done[PLAN_TL_MAX_LAYERS + 1];
    int buf_unit[PLAN_TL_MAX_PREFETCH + 1];   // the layer each gather buffer holds (-1 none)
    long buf_use[PLAN_TL_MAX_PREFETCH + 1];   // when its unit is (to be) used: the least is refilled
    long uses;
    // reduce-scatters in flight by buffer parity, the replica all-reduce, offload
    int rs_unit[2];
    double rs_done[2];
    double ar_done;
    int off_pending;                     // the unit whose gradient is on its way down (-1 none)
    double off_down;                     // when that copy is done
    unsigned char off_done[PLAN_TL_MAX_LAYERS + 1];
    unsigned char norm_done[PLAN_TL_MAX_LAYERS + 1];   // unit's sum of squares taken (norm_per_unit)
    unsigned char upd_done[PLAN_TL_MAX_LAYERS + 1];    // unit updated on the device (update_early)
    int upd_pending;                     // an early AdamW waiting for the next reduce-scatter's start (0/1)
} tl_sim;

// The compute stream waits until t, for `lane`: its idle time is exposed.
static void wait_for(tl_sim *m, double t, plan_tl_lane lane) {
    const double idle = t - m->free[PLAN_TL_COMPUTE];
    if (idle <= 0) return;
    m->r->exposed_s[m->phase] += idle;
    m->r->exposed_by[lane] += idle;
    m->free[PLAN_TL_COMPUTE] = t;
}

// Work on the compute stream, issued by the host now.
static void compute(tl_sim *m, double seconds) {
    wait_for(m, m->host, PLAN_TL_HOST);
    m->free[PLAN_TL_COMPUTE] += seconds;
    m->r->busy_s[PLAN_TL_COMPUTE] += seconds;
}

// Whether a lane's collectives use the shard group's link (which the other of them share).
static int on_shard_link(const tl_sim *m, plan_tl_lane lane) {
    return lane == PLAN_TL_GATHER || lane == PLAN_TL_REDUCE || (lane == PLAN_TL_REPLICA && m->c->replica_shares_link);
}

// Work on `lane` after everything queued on the compute stream (comm_after_compute, and
// copy_async's compute mark); returns when it is done. Collectives on one link take it in
// the order they are issued (a ring all-gather and a ring reduce-scatter each load every
// link of the ring in both directions: run together, each would get about half).
static double after_compute(tl_sim *m, plan_tl_lane lane, double seconds) {
    double start = fmax(fmax(m->free[lane], m->free[PLAN_TL_COMPUTE]), m->host);
    if (on_shard_link(m, lane)) {
        start = fmax(start, m->link_free);
        m->link_free = start + seconds;
    }
    m->free[lane] = start + seconds;
    m->r->busy_s[lane] += seconds;
    return m->free[lane];
}

// A blocking collective: the compute stream waits for it.
static void blocking(tl_sim *m, plan_tl_lane lane, double seconds) {
    if (seconds > 0) wait_for(m, after_compute(m, lane, seconds), lane);
}

// The host waits for every lane of the device, then needs host_gap to issue again.
static void host_drain(tl_sim *m) {
    double t = m->host;
    for (int l = 0; l < PLAN_TL_HOST; l++) t = fmax(t, m->free[l]);
    m->host = t + m->c->host_gap;
    m->r->busy_s[PLAN_TL_HOST] += m->c->host_gap;
}

// cu_pace after each layer: the host at most BACKEND_PACE_LAG layers ahead of the device.
static void pace(tl_sim *m) {
    const int n = BACKEND_PACE_LAG + 1;
    if (m->paced >= BACKEND_PACE_LAG) m->host = fmax(m->host, m->pace[(m->paced - BACKEND_PACE_LAG) % n]);
    m->pace[m->paced % n] = m->free[PLAN_TL_COMPUTE];
    m->paced++;
}

// ----------------------------------------------------------------------------
// gathers (fsdp.c prov_acquire, kept_acquire)

// Start gathering layer v (non-blocking) into the least recently used buffer not holding
// `current`; `when` orders its use (the buffer refilled next is the one used longest ago).
static void gather_layer(tl_sim *m, int v, int current, long when) {
    const int nbuf = m->c->keep_gathered ? 0 : m->s->prefetch + 1;
    if (nbuf) {
        int b = -1;
        for (int i = 0; i < nbuf; i++)
            if (m->buf_unit[i] != current && (b < 0 || m->buf_use[i] < m->buf_use[b])) b = i;
        if (m->buf_unit[b] >= 0) m->held[m->buf_unit[b]] = 0;
        m->buf_unit[b] = v;
        m->buf_use[b] = when;
    }
    m->held[v] = 1;
    m->ag_done[v] = after_compute(m, PLAN_TL_GATHER, m->c->ag_layer);
}

// Unit v's buffer will be used at `when` (a buffer is refilled in order of its unit's use).
static void buffer_use(tl_sim *m, int v, long when) {
    for (int i = 0; i <= m->s->prefetch && !m->c->keep_gathered; i++)
        if (m->buf_unit[i] == v) m->buf_use[i] = when;
}

// Gathers ahead of unit u in direction dir (+1 forward, -1 backward): `prefetch` layers, one
// with --keep_params_gathered; u == L (the root) starts the forward at layer 0.
static void prefetch_after(tl_sim *m, int u, int dir) {
    const int L = m->c->layers, ahead = m->c->keep_gathered ? 1 : m->s->prefetch;
    const int first = u == L ? 0 : u + dir;
    for (int k = 0; k < ahead; k++) {
        const int v = first + dir * k;
        if (v < 0 || v >= L || (u == L && dir < 0)) break;
        if (!m->held[v]) gather_layer(m, v, u, m->uses + k + 1);
        else buffer_use(m, v, m->uses + k + 1);
    }
}

// Acquire layer u for a pass in direction dir: gathered now unless held or on its way, the
// compute stream waits for it, the gathers ahead start.
static void acquire_layer(tl_sim *m, int u, int dir) {
    if (m->c->sharded) {
        m->uses++;
        if (!m->held[u]) gather_layer(m, u, -1, m->uses);
        buffer_use(m, u, m->uses);
        wait_for(m, m->ag_done[u], PLAN_TL_GATHER);
        prefetch_after(m, u, dir);
    }
}

// The root at the start of a forward: gathered (blocking) once per step, then layer 0 on.
static void acquire_root(tl_sim *m) {
    const int L = m->c->layers;
    if (!m->c->sharded) return;
    if (!m->held[L]) {
        blocking(m, PLAN_TL_GATHER, m->c->ag_root);
        m->held[L] = 1;
    }
    prefetch_after(m, L, +1);
}

// ----------------------------------------------------------------------------
// gradients (fsdp.c prov_grad_begin / prov_grad_end), the replica all-reduce, offload

static void offload_push(tl_sim *m, int u);
static int overlapped(const tl_sim *m);

// fsdp.c update_pending: the early AdamW held back for the next reduce-scatter's start.
static void update_pending(tl_sim *m) {
    if (m->upd_pending) compute(m, m->c->adamw_layer);
    m->upd_pending = 0;
}

// Unit u's gradient slice got its last contribution of this micro-batch: in the last one,
// its replica all-reduce (per unit) or its early offload may start.
static void grad_final(tl_sim *m, int u) {
    const plan_tl_costs *c = m->c;
    const int root = u == c->layers;
    if (!m->last_micro) return;
    if (c->replicas && m->s->ar_per_unit) m->ar_done = after_compute(m, PLAN_TL_REPLICA, root ? c->ar_root : c->ar_layer);
    if (!c->replicas && m->s->norm_per_unit) {   // fsdp.c norm_add
        compute(m, root ? c->norm_root : c->norm_layer);
        m->norm_done[u] = 1;
    }
    // fsdp_offload_can_overlap: one replica, no local accumulation; the root waits for the step
    if (c->offload && m->s->offload_early && !c->replicas && c->grad_mode != FSDP_GRADS_LOCAL && !root)
        offload_push(m, u);
    if (!c->offload && m->s->update_early && !c->replicas && !root) {   // fsdp.c early_update
        m->upd_done[u] = 1;
        update_pending(m);
        if (overlapped(m)) m->upd_pending = 1;   // held back behind the next reduce-scatter
        else compute(m, c->adamw_layer);
    }
}

// Complete the reduce-scatter in flight in buffer pair b (rs_finish): the compute stream waits.
static void rs_finish(tl_sim *m, int b) {
    if (m->rs_unit[b] < 0) return;
    const int u = m->rs_unit[b];
    m->rs_unit[b] = -1;
    wait_for(m, m->rs_done[b], PLAN_TL_REDUCE);
    grad_final(m, u);
}

static int overlapped(const tl_sim *m) { return m->c->sharded && m->c->grad_mode != FSDP_GRADS_LOCAL; }

// Layer u's backward between grad_begin and grad_end.
static void layer_backward(tl_sim *m, int u) {
    const plan_tl_costs *c = m->c;
    if (overlapped(m)) rs_finish(m, u % 2);
    compute(m, c->layer_bwd);
    if (overlapped(m)) {
        m->rs_done[u % 2] = after_compute(m, PLAN_TL_REDUCE, c->rs_layer);
        m->rs_unit[u % 2] = u;
        update_pending(m);
    } else if (c->grad_mode == FSDP_GRADS_LOCAL && c->sharded) {   // the step's fp32 sums, once
        if (m->last_micro) {
            blocking(m, PLAN_TL_REDUCE, c->rs_layer_f32);
            grad_final(m, u);
        }
    } else {   // one shard: the backward wrote the slice itself
        grad_final(m, u);
    }
}

// The root's gradient at the end of a micro-batch's backward (prov_grad_end for u == L).
static void root_grad_end(tl_sim *m) {
    const plan_tl_costs *c = m->c;
    const int L = c->layers;
    if (overlapped(m) && m->s->rs_flush_per_micro) {
        update_pending(m);   // (under the tail's reduce-scatters)
        rs_finish(m, 0);
        rs_finish(m, 1);
    }
    if (!c->sharded) {
        grad_final(m, L);
    } else if (c->grad_mode == FSDP_GRADS_PER_MICRO_BATCH) {
        blocking(m, PLAN_TL_REDUCE, c->rs_root);
        grad_final(m, L);
    } else if (m->last_micro) {   // ROOT_ONCE and LOCAL: the root's fp32 sum, once per step
        blocking(m, PLAN_TL_REDUCE, c->rs_root_f32);
        grad_final(m, L);
    }
}

// offload_push: unit u's gradient slice goes down (after the compute queued so far), then the
// host updates the unit before it (waiting for its copy) and sends its parameters back.
static void offload_update(tl_sim *m) {
    const int u = m->off_pending, root = u == m->c->layers;
    if (u < 0) return;
    m->off_pending = -1;
    m->host = fmax(m->host, m->off_down) + (root ? m->c->off_host_root : m->c->off_host_layer);
    m->r->busy_s[PLAN_TL_HOST] += root ? m->c->off_host_root : m->c->off_host_layer;
    (void)after_compute(m, PLAN_TL_OFFLOAD, root ? m->c->off_up_root : m->c->off_up_layer);
}
static void offload_push(tl_sim *m, int u) {
    const int root = u == m->c->layers;
    m->off_done[u] = 1;
    const double down = after_compute(m, PLAN_TL_OFFLOAD, root ? m->c->off_down_root : m->c->off_down_layer);
    offload_update(m);
    m->off_pending = u;
    m->off_down = down;
}

// ----------------------------------------------------------------------------
// a micro-batch, the optimizer, the step

// One micro-batch's forward and backward (model_forward_backward over the FSDP provider).
static void micro_batch(tl_sim *m) {
    const plan_tl_costs *c = m->c;
    const int L = c->layers;
    m->phase = PLAN_TL_FWD;
    acquire_root(m);
    compute(m, c->root_fwd);
    for (int l = 0; l < L; l++) {
        acquire_layer(m, l, +1);
        compute(m, c->layer_fwd);
        pace(m);
    }
    // the root's grad_begin flushes what the micro-batch before left in flight (fsdp.c)
    if (overlapped(m)) {
        rs_finish(m, 0);
        rs_finish(m, 1);
    }
    compute(m, c->root_head);
    m->phase = PLAN_TL_BWD;
    for (int l = L - 1; l >= 0; l--) {
        acquire_layer(m, l, -1);
        layer_backward(m, l);
        pace(m);
    }
    compute(m, c->root_bwd);
    root_grad_end(m);
    if (m->s->host_wait_per_micro && !m->last_micro) host_drain(m);
}

// The per-unit work of the units whose flag is not set: `layer` each, `root` for the root.
static double units_left(const tl_sim *m, const unsigned char *done, double layer, double root) {
    double s = done[m->c->layers] ? 0 : root;
    for (int u = 0; u < m->c->layers; u++) s += done[u] ? 0 : layer;
    return s;
}

// After the last micro-batch: fsdp_finish_grads (the reduce-scatters left, the replica
// all-reduce, the norms not taken yet, their read by the host), the optimizer (the AdamW not
// run yet), the offload pipeline's rest, the step's end (train.c: synchronize, the loss
// all-reduce).
static void optimizer_step(tl_sim *m) {
    const plan_tl_costs *c = m->c;
    m->phase = PLAN_TL_OPT;
    rs_finish(m, 0);
    rs_finish(m, 1);
    update_pending(m);
    if (c->replicas) {
        if (m->s->ar_per_unit) wait_for(m, m->ar_done, PLAN_TL_REPLICA);
        else blocking(m, PLAN_TL_REPLICA, c->ar_all);
    }
    compute(m, units_left(m, m->norm_done, c->norm_layer, c->norm_root) + c->optimizer);
    host_drain(m);   // the norm's host read
    compute(m, units_left(m, m->upd_done, c->adamw_layer, c->adamw_root));
    if (c->offload) {
        for (int u = 0; u <= c->layers; u++)
            if (!m->off_done[u]) offload_push(m, u);
        offload_update(m);
        m->host = fmax(m->host, m->free[PLAN_TL_OFFLOAD]);
        wait_for(m, m->free[PLAN_TL_OFFLOAD], PLAN_TL_OFFLOAD);
    }
    host_drain(m);
}

// The lane with the most busy time.
static plan_tl_lane busiest(const plan_tl_result *r) {
    plan_tl_lane b = PLAN_TL_COMPUTE;
    for (int l = 1; l < PLAN_TL_LANES; l++)
        if (r->busy_s[l] > r->busy_s[b]) b = (plan_tl_lane)l;
    return b;
}

int plan_tl_run(const plan_tl_costs *c, const plan_tl_schedule *s, plan_tl_result *r) {
    if (c->layers < 1 || c->layers > PLAN_TL_MAX_LAYERS)
        return ft_error("plan timeline: %d layers (1 to %d)", c->layers, PLAN_TL_MAX_LAYERS);
    if (s->prefetch < 1 || s->prefetch > PLAN_TL_MAX_PREFETCH)
        return ft_error("plan timeline: prefetch %d (1 to %d)", s->prefetch, PLAN_TL_MAX_PREFETCH);
    if (c->micro_batches < 1) return ft_error("plan timeline: %d micro-batches", c->micro_batches);
    tl_sim m;
    memset(&m, 0, sizeof m);
    memset(r, 0, sizeof *r);
    m.c = c, m.s = s, m.r = r;
    m.rs_unit[0] = m.rs_unit[1] = m.off_pending = -1;
    for (int i = 0; i <= PLAN_TL_MAX_PREFETCH; i++) m.buf_unit[i] = -1;
    host_drain(&m);   // the step starts behind the host's token-count all-reduce (train.c)
    for (int a = 0; a < c->micro_batches; a++) {
        m.micro = a;
        m.last_micro = a == c->micro_batches - 1;
        micro_batch(&m);
    }
    optimizer_step(&m);
    r->step_s = m.host;
    // the device's idle time at the step's edges (the first and last host waits)
    r->exposed_s[PLAN_TL_OPT] += m.host - m.free[PLAN_TL_COMPUTE];
    r->exposed_by[PLAN_TL_HOST] += m.host - m.free[PLAN_TL_COMPUTE];
    r->binding = busiest(r);
    return 0;
}

// ----------------------------------------------------------------------------
// the fabric

// The defaults: plan_price_busbw (src/plan_price.h, with their sources); the latency of a
// collective: plan_price_collective_latency (NCCL's ring model), the emulator's virtual
// clock's prices too, so that the two differ only by the schedule.
plan_fabric plan_fabric_of(const plan_request *r, const plan_device *d) {
    plan_fabric f = {plan_price_busbw(d, 0), plan_price_busbw(d, 1), 0, 0};
    if (r->fabric_intra_busbw > 0) f.intra_busbw = r->fabric_intra_busbw, f.measured_intra = 1;
    if (r->fabric_inter_busbw > 0) f.inter_busbw = r->fabric_inter_busbw, f.measured_inter = 1;
    return f;
}

// ----------------------------------------------------------------------------
// a plan's costs

// Seconds of one ring collective of `kind` over a group of n ranks spanning `nodes` nodes
// (across nodes when more than one), with NCCL's per-rank buffer of `bytes`
// (plan_price_collective_at: the bytes a rank sends over the fabric's bus bandwidth plus the
// ring's latency, network steps only where the ring crosses nodes).
static double collective_s(const plan_fabric *f, plan_coll_kind kind, double bytes, int n, int nodes) {
    if (bytes <= 0 || n <= 1) return 0;
    return plan_price_collective_at(kind, bytes, n, nodes, nodes > 1 ? f->inter_busbw : f->intra_busbw);
}

// The collectives of one unit of each kind (the bytes of plan.c plan_step_work, per unit, as
// each rank's buffer: a gather sends its 1/S slice, a reduce-scatter receives one, the replica
// all-reduce sums the fp32 slice). The groups as src/launch.c splits the world: a shard group is
// S consecutive ranks, a replica group every S-th rank; each spans the nodes of its members
// (plan_group_nodes, plan_gpus_per_node: --dry_run_gpus_per_node or d's; the bandwidth across nodes when more than one, and the
// ring's network steps).
static void comm_costs(const plan *p, const plan_device *d, const plan_fabric *f, plan_tl_costs *c) {
    const plan_request *r = &p->req;
    const int S = r->shard_size, R = p->replica_size, G = plan_gpus_per_node(r, d);
    const int shard_nodes = plan_group_nodes(0, 1, S, G), replica_nodes = plan_group_nodes(0, S, R, G);
    const double e = (double)r->elem_bytes, g = r->reduce_f32 ? 4 : e;
    const double tl = (double)p->trained_layer_numel / S, tr = (double)p->trained_root_numel / S;
    const plan_coll_kind AG = PLAN_COLL_ALL_GATHER, RS = PLAN_COLL_REDUCE_SCATTER, AR = PLAN_COLL_ALL_REDUCE;
    c->ag_layer = collective_s(f, AG, (double)p->layer_numel / S * e, S, shard_nodes);
    c->ag_root = collective_s(f, AG, (double)p->root_numel / S * e, S, shard_nodes);
    c->rs_layer = collective_s(f, RS, tl * g, S, shard_nodes);
    c->rs_root = collective_s(f, RS, tr * g, S, shard_nodes);
    c->rs_layer_f32 = collective_s(f, RS, tl * 4, S, shard_nodes);
    c->rs_root_f32 = collective_s(f, RS, tr * 4, S, shard_nodes);
    c->replica_shares_link = S > 1 && R > 1 && (shard_nodes > 1) == (replica_nodes > 1);
    c->ar_layer = collective_s(f, AR, tl * 4, R, replica_nodes);
    c->ar_root = collective_s(f, AR, tr * 4, R, replica_nodes);
    c->ar_all = collective_s(f, AR, (tl * c->layers + tr) * 4, R, replica_nodes);
}

// The step's op (plan_time.c "optimizer: grad norm, AdamW") in its parts, each priced as an
// op of its own: by the bytes per slice element plan.c counts, zeroing the gradient 4, its
// norm 4, AdamW 28 + e (on the host when offloaded: the device keeps 8); by device operations,
// the norm's 2 kernels per unit (2 in all with replicas), AdamW's the op's others but the 3
// memsets, which stay with the zeroing. The norm and AdamW go to the units by slice size.
static void step_costs(const plan *p, const plan_device *d, const plan_op *o, plan_tl_costs *c) {
    const double S = p->req.shard_size, n = (double)p->trained_padded_total / S, units = c->layers + 1.0;
    const double e = (double)p->req.elem_bytes, per = p->req.offload_optimizer ? 8 : 36 + e;
    const double norm_ops = c->replicas ? 2 : 2 * units, adamw_ops = fmax(o->launches - norm_ops - 3, 0);
    plan_op norm = *o, adamw = *o, rest = *o;
    norm.bytes = o->bytes * 4 / per, norm.launches = norm_ops;
    adamw.bytes = o->bytes * (per - 8) / per, adamw.launches = adamw_ops;
    rest.bytes = o->bytes * 4 / per, rest.launches = o->launches - norm_ops - adamw_ops;
    const double fl = (double)p->trained_layer_numel / S / n, fr = (double)p->trained_root_numel / S / n;
    const double ns = plan_op_seconds(&norm, d), as = adamw.launches > 0 ? plan_op_seconds(&adamw, d) : 0;
    c->norm_layer += ns * fl, c->norm_root += ns * fr;
    c->adamw_layer += as * fl, c->adamw_root += as * fr;
    c->optimizer += plan_op_seconds(&rest, d);
}

// The compute of the plan's ops (plan_op_seconds: the calibrated per-op pricing), unit by
// unit: a layer's share of the forward and backward phases per micro-batch, the root's
// phase per micro-batch (embedding, final norm, lm_head: all taken as the root's head), the
// step's phase once (the norm and AdamW per unit: step_costs).
static void compute_costs(const plan *p, const plan_device *d, plan_tl_costs *c) {
    const double LA = (double)c->layers * c->micro_batches;
    for (int i = 0; i < p->n_ops; i++) {
        const double s = plan_op_seconds(&p->ops[i], d);
        switch (p->ops[i].phase) {
        case PLAN_PHASE_FWD: c->layer_fwd += s / LA; break;
        case PLAN_PHASE_BWD: c->layer_bwd += s / LA; break;
        case PLAN_PHASE_ROOT: c->root_head += s / c->micro_batches; break;
        default: step_costs(p, d, &p->ops[i], c); break;
        }
    }
}

// --offload_optimizer: the plan's offload bytes (plan.c) split by unit slice.
static void offload_costs(const plan *p, plan_tl_costs *c) {
    const double S = p->req.shard_size, n = (double)p->trained_padded_total / S;
    const double parts[2] = {(double)p->trained_layer_numel / S / n, (double)p->trained_root_numel / S / n};
    double *down[2] = {&c->off_down_layer, &c->off_down_root}, *up[2] = {&c->off_up_layer, &c->off_up_root};
    double *host[2] = {&c->off_host_layer, &c->off_host_root};
    for (int k = 0; k < 2; k++) {
        *down[k] = plan_price_pcie(parts[k] * p->offload_d2h_bytes);
        *up[k] = plan_price_pcie(parts[k] * p->offload_h2d_bytes);
        *host[k] = plan_price_host_memory(parts[k] * p->offload_host_bytes);
    }
}

int plan_tl_costs_of(const plan *p, const plan_device *d, const plan_fabric *f, plan_tl_costs *c) {
    const plan_request *r = &p->req;
    if (r->eval_only) return ft_error("plan timeline: --eval_only has no optimizer step to time");
    memset(c, 0, sizeof *c);
    // (the plan's layout: L equal layer units and the root)
    c->layers = (int)((p->padded_total - p->root_numel) / (p->layer_numel ? p->layer_numel : 1));
    c->micro_batches = p->accum;
    c->sharded = r->shard_size > 1;
    c->keep_gathered = c->sharded && r->keep_params_gathered;
    c->grad_mode = p->grad_mode;
    c->replicas = p->replica_size > 1;
    c->offload = r->offload_optimizer;
    c->host_gap = PLAN_TL_HOST_GAP_S;
    compute_costs(p, d, c);   // (after the fields step_costs reads: layers, replicas)
    comm_costs(p, d, f, c);
    if (c->offload) offload_costs(p, c);
    return 0;
}

double plan_tl_step_seconds(const plan *p, const plan_device *d, const plan_fabric *f, const plan_tl_schedule *s,
                            plan_tl_result *r) {
    const plan_fabric fab = f ? *f : plan_fabric_of(&p->req, d);
    const plan_tl_schedule sched = s ? *s : plan_tl_program_schedule();
    plan_tl_costs c;
    plan_tl_result res;
    if (plan_tl_costs_of(p, d, &fab, &c) || plan_tl_run(&c, &sched, &res)) return -1;
    if (r) *r = res;
    return res.step_s;
}

// ----------------------------------------------------------------------------
// the report

// One device's lines: the timeline's step beside the per-phase estimate.
static void print_device(FILE *out, const plan *p, const plan_device *d) {
    plan_tl_result r;
    plan_step_time old;
    const plan_fabric f = plan_fabric_of(&p->req, d);
    if (plan_tl_step_seconds(p, d, &f, NULL, &r) < 0) {
        fprintf(out, "  %-15s (no timeline: %s)\n", d->name, ft_error_message());
        return;
    }
    plan_estimate_step_time(p, d, &old);
    fprintf(out, "  %-15s %9.2f %9.2f %11.0f %6.1f%% %6.1f%% %8.2f %8.2f %8.2f  %s\n", d->name, 1e3 * r.step_s,
            1e3 * old.total_s, p->tokens / r.step_s, 100 * p->model_flops / (r.step_s * d->peak_flops), 100 * old.mfu,
            1e3 * r.exposed_s[PLAN_TL_FWD], 1e3 * r.exposed_s[PLAN_TL_BWD], 1e3 * r.exposed_s[PLAN_TL_OPT],
            plan_tl_lane_name(r.binding));
}

// The report's closing lines: what the columns mean, the fabric and latency, the row length.
static void print_notes(FILE *out, const plan *p, const plan_fabric *f) {
    const plan_request *q = &p->req;
    fprintf(out, "  per-phase: the estimate above (kept for comparison until the timeline is validated); exp: the\n"
            "  compute stream's idle ms per step in the forward (lm_head included), backward and optimizer.\n"
            "  Fabric (%s): bus bandwidth %.0f GB/s within a node (%s), %.0f GB/s across nodes\n"
            "  (%s), latency NCCL's ring model (%.1f us + %.1f us per NVLink ring step, %.0f us per step\n"
            "  that crosses nodes); other devices scale their links alike (src/plan_price.h).\n",
            PLAN_FIT_DEVICE->name, f->intra_busbw / 1e9, f->measured_intra ? "--fabric_intra_gbps" : "0.8 of NVLink",
            f->inter_busbw / 1e9, f->measured_inter ? "--fabric_inter_gbps" : "0.92 of InfiniBand",
            1e6 * PLAN_COLL_BASE_LATENCY_S, 1e6 * PLAN_COLL_STEP_NVLINK_S, 1e6 * PLAN_COLL_STEP_NET_S);
    fprintf(out, "  Ranks on nodes of %d GPUs (%s): shard groups of consecutive ranks, replica groups of every\n"
            "  --dp_shard-th; a group spanning nodes runs over the network.\n", plan_gpus_per_node(q, PLAN_FIT_DEVICE),
            q->gpus_per_node > 0 ? "--dry_run_gpus_per_node" : "the device's");
    if (q->row_tokens > 0 && q->row_tokens != q->seq_len)
        fprintf(out, "  Every row's tokens at --dry_run_row_tokens %d (memory planned for --seq_len %d).\n", q->row_tokens,
                q->seq_len);
    else
        fprintf(out, "  Every row's tokens at the full --seq_len (runs trim padded rows: --dry_run_row_tokens prices\n"
                "  shorter ones).\n");
}

void plan_tl_print(FILE *out, const plan *p) {
    if (p->req.eval_only) return;
    const plan_tl_schedule s = plan_tl_program_schedule();
    fprintf(out, "\nstep time ESTIMATE on the program's schedule (timeline: each unit's compute and collectives on their "
            "lanes,\nin the order src/fsdp.c issues them; an estimate, not a measurement):\n");
    fprintf(out, "  schedule: prefetch %d layer(s) ahead, host waits %s, reduce-scatters flushed %s, replica all-reduce "
            "%s\n", s.prefetch, s.host_wait_per_micro ? "per micro-batch" : "per step",
            s.rs_flush_per_micro ? "per micro-batch" : "per step", s.ar_per_unit ? "per unit" : "after the backward");
    fprintf(out, "  %-15s %9s %9s %11s %7s %7s %8s %8s %8s  %s\n", "device", "step ms", "per-phase", "tokens/s/GPU",
            "MFU", "(phase)", "exp fwd", "exp bwd", "exp opt", "binding (busiest lane)");
    for (int j = 0; j < plan_n_devices; j++) print_device(out, p, &plan_devices[j]);
    const plan_fabric f = plan_fabric_of(&p->req, PLAN_FIT_DEVICE);
    plan_tl_schedule next = s;   // what issue 36's item 1 still changes (the per-unit all-reduce is in)
    next.host_wait_per_micro = 0, next.rs_flush_per_micro = 0;
    plan_tl_result r;
    if (plan_tl_step_seconds(p, PLAN_FIT_DEVICE, &f, &next, &r) > 0)
        fprintf(out, "  %s with reduce-scatters in flight across micro-batches (not the program yet): %.2f ms,\n"
                "  MFU %.1f%%, binding %s\n", PLAN_FIT_DEVICE->name,
                1e3 * r.step_s, 100 * p->model_flops / (r.step_s * PLAN_FIT_DEVICE->peak_flops),
                plan_tl_lane_name(r.binding));
    print_notes(out, p, &f);
}
