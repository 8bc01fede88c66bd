// fsdp.h: sharded model state (ZeRO-3 / FSDP full shard, DDP, HSDP) over the flat layout.
//
// Ranks form a grid: a shard group of S ranks splits every unit into S equal slices (the
// layout is padded so that S divides each unit), and a replica group of R ranks holds the
// same slice. FSDP = (S = world, R = 1); DDP / --no_fsdp = (S = 1, R = world); HSDP =
// (S = --dp_shard, R = world / S). One process is S = R = 1.
//
// Each rank keeps, for its slice only: the working parameters (backend dtype), fp32 master
// weights, AdamW moments and fp32 gradients. The unit_provider gathers a unit's full
// parameters before use (all-gather in the shard group; nothing when S = 1) and, when a
// unit's gradients of a micro-batch are complete, reduce-scatters them into the fp32
// gradient slice (+=). With R > 1, a unit's slice is all-reduced across replicas as soon as
// it is final (its last contribution of the step's last micro-batch: fsdp.c grad_final),
// non-blocking, overlapping the rest of the backward; fsdp_finish_grads waits for them all.
// The optimizer then updates the slice in place: a shard is a slice.
//
// The root unit (embeddings, final norm, lm_head) is gathered once per optimizer step: its
// parameters change only in the optimizer step (and when loading), so the gathered copy is
// kept across micro-batches (and evaluations) until fsdp_invalidate_gathered. Its gradient
// (FSDP_GRADS_ROOT_ONCE, see plan.h) is summed over the micro-batches in an fp32 buffer and
// reduce-scattered once per step, in fp32.
//
// The per-micro-batch gradient buffers and their reduce-scatters are in the backend dtype
// (bf16 on a GPU: FSDP's reduce_dtype=bf16), or in fp32 with reduce_f32 (--reduce_dtype fp32,
// torchtitan's default: the backward's dW GEMMs write fp32, the ranks' sums are not rounded
// to bf16; twice the gradient buffers and reduce-scatter bytes).
#pragma once
#include "comm.h"
#include "model.h"

// The padding every unit of a layout sharded over shard_size ranks needs (param_layout_init's
// pad_multiple): 16 x S elements, so S divides each unit and every slice starts 16 elements
// (64 bytes of fp32 master weights) aligned.
size_t fsdp_pad_multiple(int shard_size);

// The grid's name in logs and plans: "FSDP full shard" (S = world), "HSDP" (1 < S < world),
// "none (DDP)" (S = 1 < world) or "none (single device)".
const char *fsdp_sharding_name(int shard_size, int world_size);

// How gradients reach the fp32 slices (src/plan.c chooses: plan.grad_mode).
typedef enum {
    FSDP_GRADS_PER_MICRO_BATCH = 0,   // every unit reduce-scattered after each micro-batch
    FSDP_GRADS_LOCAL = 1,             // --accumulate_grads_locally: full-size fp32 gradients summed
                                      // over micro-batches, every unit reduce-scattered once (fp32)
    FSDP_GRADS_ROOT_ONCE = 2,         // layers per micro-batch; the root's gradient summed in
                                      // fp32 over micro-batches, reduce-scattered once (S > 1)
    FSDP_GRADS_DIRECT = 3,            // one shard (S = 1): nothing to reduce per micro-batch, so
                                      // the backward adds into the fp32 slice (= the unit) itself
} fsdp_grad_mode;

// The mode a state runs in for the mode asked for: with a shard group of 1 every mode is
// FSDP_GRADS_DIRECT (no per-micro-batch gradient buffers, no zero/add passes); else ROOT_ONCE
// and LOCAL as asked. fsdp_init and the planner both resolve through this.
fsdp_grad_mode fsdp_resolve_grad_mode(fsdp_grad_mode asked, int shard_size);
// 1 when a (resolved) mode hands the backward fp32 gradient units whatever the backend dtype
// (FSDP_GRADS_DIRECT: the step's slices; FSDP_GRADS_LOCAL: the full-size fp32 sums; any mode
// with reduce_f32: fp32 per-micro-batch buffers).
static inline int fsdp_grads_f32(fsdp_grad_mode mode, int reduce_f32) {
    return reduce_f32 || mode == FSDP_GRADS_DIRECT || mode == FSDP_GRADS_LOCAL;
}

// What a state's parameters are (the buffers it holds, and their --dry_run lines).
typedef enum {
    FSDP_TRAINED = 0,             // all of it: working parameters, fp32 master, moments, gradients
    FSDP_FROZEN = 1,              // the frozen base under LoRA: working parameters (and gathers) only
    FSDP_ADAPTERS = 2,            // LoRA adapters: like FSDP_TRAINED, named as adapters in the plan
} fsdp_role;

// How a state is set up beyond its layout, backend and groups (fsdp_init_role, fsdp_buffer_table).
typedef struct {
    fsdp_grad_mode mode;          // as asked (resolved by fsdp_resolve_grad_mode)
    fsdp_role role;
    int offload;                  // --offload_optimizer (ignored for FSDP_FROZEN)
    int keep_gathered;            // --keep_params_gathered (ignored unless S > 1)
    int reduce_f32;               // --reduce_dtype fp32: per-micro-batch gradients in fp32
    int eval_only;                // --eval_only: whatever the role, the working parameters and
                                  // the gather buffers only, as FSDP_FROZEN (no master, moments,
                                  // gradients or optimizer offload; fsdp_params_only)
    int moments_bf16;             // --optimizer_moments bf16: exp_avg and exp_avg_sq stored in bf16
                                  // (2 bytes each, not 4); not with offload (fsdp_init_role refuses)
} fsdp_setup;

typedef struct {
    const param_layout *layout;   // padded: shard->size divides every unit_numel
    fsdp_role role;
    fsdp_setup setup;             // as fsdp_init_role resolved it (the buffer table's input)
    int offload;                  // --offload_optimizer: master + moments in host memory (MEM_HOST),
                                  // AdamW on the host, unit by unit (fsdp_optimizer_step)
    const backend *be;
    mem_tracker *mem;
    comm *shard;                  // S ranks splitting each unit
    comm *replica;                // R ranks holding the same slice
    size_t esz;                   // bytes per backend element
    st_dtype gdt;                 // per-micro-batch gradient buffers and their reduce-scatters:
                                  // the backend dtype, or ST_F32 (reduce_f32)
    size_t n_local;               // elements of this rank's slice of all units
    size_t *slice;                // (n_units) unit_numel[u] / S
    size_t *local_off;            // (n_units) where unit u's slice starts in local buffers
    size_t max_unit;              // largest unit_numel

    void *params;                 // (n_local) backend dtype, what the forward reads
    float *master;                // (n_local) fp32 master weights
    void *exp_avg, *exp_avg_sq;   // (n_local) AdamW moments in mdt
    st_dtype mdt;                 // the moments' dtype: ST_F32, or ST_BF16 (setup.moments_bf16)
    float *grads;                 // (n_local) fp32 gradients of the current optimizer step

    int keep_gathered;            // --keep_params_gathered (S > 1): every unit gathered into
                                  // all_full at its first use, kept until the parameters change
    void *all_full;               // (layout->total) backend dtype, every unit gathered (keep_gathered)
    unsigned char *kept;          // (n_units) 1: unit u's copy in all_full is current (keep_gathered)
    void *root_full;              // gathered root unit (S > 1), backend dtype
    int root_held;                // root_full holds the current parameters (gathered this step)
    void *layer_full[2];          // two gathered layer buffers (S > 1): in use + prefetched
    int held[2];                  // which layer each holds (-1 = none / stale)
    void *pending[2];             // outstanding non-blocking gather into each, or NULL
    void *root_grad;              // one micro-batch's root gradients, gdt (none when gdt is fp32
                                  // in FSDP_GRADS_ROOT_ONCE: the backward adds into root_acc)
    void *layer_grad[2];          // layer gradients; two when S > 1 (per micro-batch mode): while
                                  // one layer's reduce-scatter runs, the next layer computes
    void *rs_pending[2];          // outstanding non-blocking reduce-scatter of each, or NULL
    int rs_unit[2];               // the layer it reduces (-1 = none)
    void **ar_req;                // (n_units) R > 1: unit u's all-reduce across replicas, started
                                  // when its slice became final in the step (fsdp.c grad_final)
    unsigned char *ar_live;       // (n_units) 1: ar_req[u] outstanding (fsdp_finish_grads waits)
    double *norm_acc;             // (n_units) backend memory: each unit's gradient sum of squares
                                  // of the step, taken as its slice became final (R = 1; fsdp.c norm_add)
    unsigned char *norm_done;     // (n_units) 1: norm_acc[u] holds unit u's sum of this step
    int norm_stale;               // a slice changed after its sum was taken: the whole slice at finish
    fsdp_grad_mode mode;
    int accumulate_locally;       // mode == FSDP_GRADS_LOCAL
    float *root_acc;              // (root unit_numel) fp32 root gradient summed over the step's
                                  // micro-batches (FSDP_GRADS_ROOT_ONCE), reduce-scattered once;
                                  // = unit_f32, which checkpoints use only between steps
    int root_acc_live;            // root_acc holds a partial sum (first to last micro-batch)
    float *grad_full;             // (layout->total) fp32, when accumulate_locally
    int micro_first, micro_last;  // position of the current micro-batch in the step
    int poison_fresh;             // FT_TEST_POISON_FRESH_GRADS set (test-only): NaN-fill fresh buffers
    void *rs_out[2];              // reduce-scatter outputs (S > 1), gdt: [0] the largest slice
                                  // (root, or layers with even index; a layer slice when the root
                                  // is reduced once per step: ROOT_ONCE), [1] a layer slice
    float *unit_f32;              // (max_unit) fp32 gather buffer for checkpoints
    float *grad_host[2];          // (largest slice each) --offload_optimizer: host copies of two
                                  // units' fp32 gradient slices (one arriving while the host AdamW
                                  // updates the other), MEM_HOST (pinned on a GPU)
    void *param_host[2];          // (largest slice each, backend dtype) the updated working
                                  // parameters of two units on their way back to the device;
                                  // only when that dtype is not fp32 (fp32 goes from master)
    // the offload pipeline (src/fsdp.c offload_push): units go through it in any order
    int off_slot;                 // the host buffer pair (grad_host, param_host) the next unit takes
    int off_pending;              // the unit whose gradient slice is on its way down (-1 none),
                                  // in buffer pair off_slot ^ 1 (the last one taken)
    unsigned char *off_done;      // (n_units) 1: unit updated (or on its way) in this step (offloaded,
                                  // or on the device by fsdp_update_early)
    int off_early;                // fsdp_offload_early / fsdp_update_early armed this step: layers
                                  // update in the backward (on the host, or on the device)
    adamw_params off_params;      // the step's AdamW parameters (decaying entries)
    int upd_pending;              // armed on the device: the layer whose early AdamW waits for the next
                                  // reduce-scatter to start (-1 none; fsdp.c early_update)
} fsdp_state;

// Allocate this rank's state for `layout` (which must be padded to a multiple of
// shard->size). Parameters are zero until loaded. 0 or -1.
// mode FSDP_GRADS_LOCAL: keep full-size fp32 gradients and reduce-scatter them (in fp32) once
// per optimizer step instead of after every micro-batch (4 P more bytes of memory, 2 / (e x
// accum) the traffic, the micro-batches summed without rounding);
// FSDP_GRADS_ROOT_ONCE: the same for the root unit only, summed in fp32 in the checkpoint
// gather buffer (idle during a step: no extra memory), (accum - 1) fewer root reduce-scatters
// per step; it needs S > 1 (with S = 1 every mode is FSDP_GRADS_DIRECT).
int fsdp_init(fsdp_state *s, const param_layout *layout, const backend *be, mem_tracker *mem,
              comm *shard, comm *replica, fsdp_grad_mode mode);
// The same set up as `setup` says (fsdp_init: FSDP_TRAINED, no offload, not kept gathered,
// gradients reduced in the backend dtype). A FSDP_FROZEN state holds the
// working parameters and the gather buffers only: its provider gives no gradients (grad_begin
// fails), fsdp_set_unit(FSDP_MASTER) converts on the host straight into the working
// parameters, fsdp_zero_moments does nothing, and the gradient/optimizer calls and
// fsdp_get_unit fail. offload (--offload_optimizer; ignored for FSDP_FROZEN): the fp32
// master weights and AdamW moments are host memory (MEM_HOST, be->host_alloc), updated there
// unit by unit (fsdp_optimizer_step). keep_gathered (--keep_params_gathered; S > 1, else
// ignored): one buffer holds every unit gathered; a unit is gathered at its first use and
// kept until the parameters change (fsdp_invalidate_gathered: the optimizer step), so a step
// gathers each unit once instead of twice per micro-batch (a frozen LoRA base: once per run),
// for the memory of the whole model's working parameters instead of root + two layers.
// reduce_f32 (--reduce_dtype fp32): the per-micro-batch gradient buffers, their
// reduce-scatters and the reduce-scatter outputs in fp32 (see the top of this file).
// eval_only (--eval_only): any role is set up as FSDP_FROZEN is, with the plan lines of its
// role (the model's working parameters, or the adapters'): nothing but what a forward reads.
int fsdp_init_role(fsdp_state *s, const param_layout *layout, const backend *be, mem_tracker *mem, comm *shard,
                   comm *replica, const fsdp_setup *setup);
void fsdp_free(fsdp_state *s);
// 1 when `s` holds the working parameters only (FSDP_FROZEN, or set up eval_only): no fp32
// master, moments or gradients; fsdp_set_unit(FSDP_MASTER) converts on the host into the
// working parameters, unit by unit (no fp32 copy of the model kept).
int fsdp_params_only(const fsdp_state *s);

// Every backend buffer fsdp_init_role allocates for `layout` set up as `setup` over a shard
// group of shard_size ranks (S divides every unit), offered to `t` in allocation order with
// esz bytes per storage element; moments_bf16 2-byte moments; offload moves master + moments
// to MEM_HOST; keep_gathered one gather buffer of the whole layout; reduce_f32 fp32 gradient
// buffers. `s` NULL: only sizes (the planner); otherwise slots are s's fields.
void fsdp_buffer_table(mem_table *t, const param_layout *layout, int shard_size, const fsdp_setup *setup,
                       size_t esz, fsdp_state *s);

// The provider the model uses for forward/backward over this state. With S > 1 it gathers a
// layer while the previous one computes: acquiring layer l (forward) starts the gather of
// l + 1, acquiring it for backward starts l - 1; the last forward layer is still gathered
// when the backward begins and is not gathered again. With keep_gathered a unit already
// gathered since the last fsdp_invalidate_gathered is not gathered again at all.
unit_provider fsdp_provider(fsdp_state *s);
// Forget the gathered root and layers (their parameters changed). The optimizer step and
// loading call it.
void fsdp_invalidate_gathered(fsdp_state *s);

// Which slice buffer: the fp32 master weights or the two AdamW moments (fp32, or bf16 with
// setup.moments_bf16: fsdp_set_unit rounds them to nearest even, fsdp_get_unit widens them
// exactly, so the host side is fp32 either way).
typedef enum { FSDP_MASTER, FSDP_EXP_AVG, FSDP_EXP_AVG_SQ } fsdp_buffer;

// Set unit u of `which` from the full unit in host fp32 memory (unit_numel[u] elements; this
// rank takes its slice). Setting FSDP_MASTER also refreshes the working parameters. 0 / -1.
int fsdp_set_unit(fsdp_state *s, fsdp_buffer which, int u, const float *host_full);
// The elements [*lo, *hi) of unit u that fsdp_set_unit reads of host_full on this rank (its
// slice), and this rank's place in the grid: *index in [0, *count) with count = S x R, a
// different one on every rank (for splitting work every rank would otherwise repeat, such as
// verifying a checkpoint's checksums).
void fsdp_slice_range(const fsdp_state *s, int u, size_t *lo, size_t *hi);
void fsdp_grid_place(const fsdp_state *s, int *index, int *count);
// Gather unit u of `which` into host fp32 memory on every rank of the shard group
// (collective). Only between optimizer steps (its buffer holds the root gradient sum from a
// step's first micro-batch to its last; with offload over S > 1 the host slice is staged
// through the device gradient slice, idle between steps): -1 otherwise. 0 / -1.
int fsdp_get_unit(fsdp_state *s, fsdp_buffer which, int u, float *host_full);

// Zero the AdamW moments (a fresh start from pretrained weights). 0 / -1.
int fsdp_zero_moments(fsdp_state *s);

// Start an optimizer step's fp32 gradient: zero the slices, or with one shard (FSDP_GRADS_DIRECT)
// only the root unit's: the layers are handed to the first micro-batch's backward fresh (written,
// not added into), so a step must run a backward with fsdp_set_micro_batch(s, 1, ...) first.
int fsdp_zero_grads(fsdp_state *s);
// Say which micro-batch of the step comes next (before its model_forward_backward).
void fsdp_set_micro_batch(fsdp_state *s, int first, int last);
// After the last micro-batch: complete the sums of the gradient slices across replicas
// (started unit by unit during the last backward; any unit not started then is started
// here, in unit order), and return the global L2 norm of the gradient in *norm (collective
// over all ranks). The sums are those of one all-reduce of every slice after the backward:
// the same fp32 values, summed per element. With one replica each unit's sum of squares was
// taken on the device as its slice became final (in the last micro-batch); here the host
// reads them once and adds them in unit order (the whole slice in one sum_squares with
// R > 1), so the value does not depend on the order in which units became final. Against one
// sum over the whole slice only the order of the double additions differs: the squares are
// exact in double and positive, so either order is within depth x 2^-53 of the exact sum
// (depth: the longest chain of additions, at most 4096 per CPU chunk or GPU thread plus the
// chunks, partials and units after it), and the norm (a square root: half the relative error)
// moves by at most (4096 + n / 4096 + units) x 2^-53: 1e-12 at 7B, where fp32 (the clipping
// scale) resolves 6e-8. Tests comparing norms across programs or splits allow 1e-6 and more;
// two runs of one job agree bit for bit (in whatever order its units became final). 0 / -1.
int fsdp_finish_grads(fsdp_state *s, double *norm);
// AdamW on this rank's slices; weight decay only on entries with decay = 1 (matrices and
// embeddings, not RMSNorm weights); padding is never touched. `p->weight_decay` is the
// decay for decaying entries. With offload: unit by unit on the host, pipelined (a unit's
// gradient slice comes to the host while the previous unit's AdamW runs there, and the
// updated working parameters go back behind it); bitwise the same result on the CPU backend,
// the same arithmetic in fp32 on a GPU (the host's rounding of the bf16 cast is the
// device's: nearest even). Units already updated by an armed fsdp_offload_early or
// fsdp_update_early are skipped (then `p` must equal the armed parameters). 0 / -1.
int fsdp_optimizer_step(fsdp_state *s, const adamw_params *p);

// --offload_optimizer without clipping: arm this step's update to start during the backward.
// Call before the step's last micro-batch, with the step's AdamW parameters (they must not
// depend on the gradient norm: no clipping). Then each layer unit, as soon as its gradient
// slice is final in the last micro-batch (after its backward, or its reduce-scatter), goes
// down to the host and is updated there while the device runs the remaining backward; the
// root unit (it ends the backward) and anything left wait for fsdp_optimizer_step. Does
// nothing when this state cannot (fsdp_offload_can_overlap: no offload, replicas to
// all-reduce first, local accumulation: its gradients are final only after the backward). Because the
// update starts before the gradient norm is known, a step whose norm comes out non-finite
// has already changed the parameters (the job stops there with an error, as without it).
void fsdp_offload_early(fsdp_state *s, const adamw_params *p);
// 1 when fsdp_offload_early would arm this state (offload, one replica, per-micro-batch
// reduction), else 0.
int fsdp_offload_can_overlap(const fsdp_state *s);

// --max_grad_norm 0 (no clipping): arm this step's update to start during the backward, on
// the host (offloaded: fsdp_offload_early) or on the device: each layer unit, as soon as its
// gradient slice is final in the step's last micro-batch (after its backward, its
// reduce-scatter, or its blocking reduce-scatter with local accumulation), is updated by
// AdamW on the compute stream, so that the tail of the backward (the last layers'
// reduce-scatters, the root) overlaps the update of the units already final; the root
// and anything left wait for fsdp_optimizer_step, which must get the same `p`. AdamW is
// elementwise: the same values as the update after the backward, bit for bit. A unit's
// gathered copies are forgotten when it is updated (nothing of the step reads them again).
// Call before the step's last micro-batch. Does nothing when this state cannot
// (fsdp_update_can_overlap: replicas to all-reduce first, working parameters only, or an
// offload that cannot overlap). As with the offload, a step whose norm comes out non-finite
// has already changed the layers (the job stops there with an error, as without it).
void fsdp_update_early(fsdp_state *s, const adamw_params *p);
// 1 when fsdp_update_early would arm this state, else 0.
int fsdp_update_can_overlap(const fsdp_state *s);
