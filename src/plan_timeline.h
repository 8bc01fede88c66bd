// plan_timeline.h: the --dry_run step time on the program's own schedule (a timeline).
//
// plan_estimate_step_time (src/plan_time.c) prices a step as per-phase sums; this prices the
// same ops unit by unit, in the order src/model.c and src/fsdp.c issue them, on the lanes they
// run on: the compute stream, the all-gather lane, the reduce-scatter lane, the replica
// all-reduce, the offload copy stream and the host. Each operation starts when its lane is
// free and its dependencies are done, the dependencies the program itself makes:
// - a collective waits for everything queued on the compute stream before it (comm_nccl.c
//   comm_after_compute), so a prefetched gather into a buffer waits for that buffer's last
//   user; the compute stream waits for a gather when it acquires the unit (comm_wait), for a
//   blocking collective at once;
// - `prefetch` layers are gathered ahead of the one computing, into prefetch + 1 buffers
//   (fsdp.c: 1, two buffers; the least recently used buffer is the one refilled), and units
//   still held from the pass before are not gathered again; --keep_params_gathered gathers
//   each unit once per step, one prefetch in flight;
// - a layer's reduce-scatter starts after its backward, on two buffers by parity: the
//   backward of the layer two below waits for it (rs_finish); the root's backward waits for
//   every one (fsdp_flush_grads); the root's own reduce-scatter and every reduction of
//   --accumulate_grads_locally block the compute stream;
// - the replica all-reduce runs after the backward, blocking, or per unit as each unit's
//   slice is final in the last micro-batch (a schedule option);
// - collectives of one group's link (the all-gather and reduce-scatter lanes, and the replica
//   all-reduce where it crosses the same kind of link) take the link in the order they are
//   issued: two lanes hide a collective behind compute, not behind each other;
// - --offload_optimizer: each unit's gradient slice goes down on the copy stream, the host
//   updates it (the host waits for that copy first), its parameters come back; the next
//   step's forward waits for every copy;
// - the host: at most BACKEND_PACE_LAG layers ahead of the device; where it waits for the
//   device (per micro-batch or per step: a schedule option) the device then idles for
//   PLAN_TL_HOST_GAP_S while the host issues work again.
// The compute stream's idle time is the exposed time, per phase (forward: the root's head
// included; backward; optimizer) and per lane it waited on; step = compute busy + exposed.
#pragma once
#include <stdio.h>

#include "plan.h"

// ----------------------------------------------------------------------------
// lanes, phases, the schedule

typedef enum {
    PLAN_TL_COMPUTE,     // the compute stream (kernels, GEMMs)
    PLAN_TL_GATHER,      // the all-gather lane (the shard group's communicator)
    PLAN_TL_REDUCE,      // the reduce-scatter lane
    PLAN_TL_REPLICA,     // the replica group's all-reduce (HSDP, DDP)
    PLAN_TL_OFFLOAD,     // the copy stream of --offload_optimizer (PCIe, both directions)
    PLAN_TL_HOST,        // the host: its own work (the offloaded AdamW) and its waits
    PLAN_TL_LANES
} plan_tl_lane;
typedef enum { PLAN_TL_FWD, PLAN_TL_BWD, PLAN_TL_OPT, PLAN_TL_PHASES } plan_tl_phase;

// The name the report gives a lane ("compute", "all-gather", "reduce-scatter", "all-reduce",
// "offload", "host").
const char *plan_tl_lane_name(plan_tl_lane l);

// How the program orders a step: what other changes to src/fsdp.c, model.c and train.c move.
typedef struct {
    int prefetch;              // layers gathered ahead of the computing one (1..PLAN_TL_MAX_PREFETCH)
    int host_wait_per_micro;   // 1: the host waits for the device after each micro-batch (it read the
                               // losses, its uploads drained the stream); 0: once per step (today)
    int rs_flush_per_micro;    // 1: each micro-batch's root backward waits for every layer reduce-scatter
                               // (fsdp.c today); 0: they finish during the next micro-batch
    int ar_per_unit;           // 1: a unit's replica all-reduce starts when its slice is final in the
                               // last micro-batch (fsdp.c's grad_final); 0: one all-reduce after the backward
    int offload_early;         // 1: offloaded layers update during the last backward (fsdp_offload_early:
                               // --max_grad_norm 0, one replica, no local accumulation)
    int norm_per_unit;         // 1: a unit's gradient sum of squares is taken on the compute stream when its
                               // slice is final in the last micro-batch (fsdp.c norm_add; one replica),
                               // 0: the whole slice's after the backward
    int update_early;          // 1: a layer's AdamW runs on the compute stream when its slice is final in the
                               // last micro-batch (fsdp_update_early: --max_grad_norm 0, one replica, the
                               // optimizer on the device); the root's and the rest after the backward
} plan_tl_schedule;
#define PLAN_TL_MAX_PREFETCH 8
#define PLAN_TL_MAX_LAYERS 1024

// The schedule of the program as it is at this commit: prefetch 1, host waits per step (none
// per micro-batch), the flush per micro-batch, the replica all-reduce per unit, the gradient
// norm per unit, no early offload or device update (they need --max_grad_norm 0; the default
// clips).
plan_tl_schedule plan_tl_program_schedule(void);

// ----------------------------------------------------------------------------
// costs (seconds) and the timeline

// The cost of each operation of one step (per rank), unit by unit: the input of the timeline.
// Hand-built in tests; plan_tl_costs_of derives them from a plan.
typedef struct {
    int layers;                // L decoder-layer units (the root is one more)
    int micro_batches;         // A
    int sharded;               // S > 1: units are gathered and reduce-scattered
    int keep_gathered;         // --keep_params_gathered (sharded only)
    int grad_mode;             // fsdp_grad_mode (src/fsdp.h), as the plan resolved it
    int replicas;              // R > 1: the fp32 slices are all-reduced across replicas
    int offload;               // --offload_optimizer
    int replica_shares_link;   // 1: the replica group's all-reduce crosses the shard group's link (both
                               // within a node, or both across nodes); the gathers and reduce-scatters
                               // always share theirs
    // compute, per micro-batch: one layer forward; one layer backward (recompute, gradient
    // passes included); the root: embedding before layer 0, final norm + lm_head forward and
    // backward before the layers' backward, embedding backward after it
    double layer_fwd, layer_bwd, root_fwd, root_head, root_bwd;
    double optimizer;          // per step on the compute stream after the backward: what the per-unit
                               // costs below leave (zeroing the gradient; with them 0, the whole
                               // gradient norm and AdamW)
    // per unit on the compute stream: its gradient sum of squares, its AdamW (0 when offloaded)
    double norm_layer, norm_root, adamw_layer, adamw_root;
    // collectives, one each: gathers (working dtype), reduce-scatters (per-micro-batch dtype
    // and fp32), the replica all-reduce of a unit's fp32 slice
    double ag_layer, ag_root, rs_layer, rs_root, rs_layer_f32, rs_root_f32, ar_layer, ar_root;
    double ar_all;             // the replica all-reduce of the whole fp32 slice at once (one latency)
    // offload, per unit: the copy stream (fp32 gradient slice down, working parameters up) and
    // the host's AdamW
    double off_down_layer, off_up_layer, off_down_root, off_up_root, off_host_layer, off_host_root;
    double host_gap;           // the device's idle time after each host wait (PLAN_TL_HOST_GAP_S)
} plan_tl_costs;

// One step on the timeline.
typedef struct {
    double step_s;                       // the step, from the host's first issue to its last wait
    double busy_s[PLAN_TL_LANES];        // time each lane works (the host: its AdamW and its gaps)
    double exposed_s[PLAN_TL_PHASES];    // compute-stream idle time in each phase
    double exposed_by[PLAN_TL_LANES];    // ... by the lane the compute stream (or host) waited on
    plan_tl_lane binding;                // the lane busiest over the step
} plan_tl_result;

// The host's gap after each wait for the device, in seconds: the wait's busy poll notices the
// device within microseconds (watchdog.h: WATCHDOG_SPIN_S of spinning before any sleep), then
// the device idles until the host's next launch reaches it, about one launch (PLAN_OP_FLOOR_S,
// measured: 8 us); 10 us, an assumption.
#define PLAN_TL_HOST_GAP_S 10e-6

// Run one step of `c` on schedule `s` into *r. 0, or -1 with ft_error (more than
// PLAN_TL_MAX_LAYERS layers, a prefetch outside 1..PLAN_TL_MAX_PREFETCH).
int plan_tl_run(const plan_tl_costs *c, const plan_tl_schedule *s, plan_tl_result *r);

// ----------------------------------------------------------------------------
// the fabric and a plan's costs

// Bus bandwidth (bytes/s sent per rank, nccl-tests' busbw: the convention of src/preflight.c
// and of the plan's ring bytes) within a node and across nodes; a collective's latency is
// plan_price_collective_latency's (src/plan_price.h).
typedef struct {
    double intra_busbw, inter_busbw;
    int measured_intra, measured_inter;  // 1: the bandwidth came from the request (--fabric_*_gbps)
} plan_fabric;

// The fabric of device d for request r: r's --fabric_intra_gbps / --fabric_inter_gbps where
// given, else plan_price_busbw's defaults (fractions of d's links, sources in plan_price.h).
plan_fabric plan_fabric_of(const plan_request *r, const plan_device *d);

// The costs of plan p on device d over fabric f (p from plan_compute; not --eval_only).
// 0, or -1 with ft_error.
int plan_tl_costs_of(const plan *p, const plan_device *d, const plan_fabric *f, plan_tl_costs *c);

// The predicted step time in seconds of plan p on device d over fabric f (NULL: plan_fabric_of)
// on schedule s (NULL: plan_tl_program_schedule), with the whole result in *r when r is not
// NULL: the entry point for comparing the timeline with a run. -1 with ft_error on failure.
double plan_tl_step_seconds(const plan *p, const plan_device *d, const plan_fabric *f, const plan_tl_schedule *s,
                            plan_tl_result *r);

// (plan_tl_print, the report's part, is declared in plan.h, which plan.c's report reads.)
