// plan.c: the --dry_run memory and step-time planner (see plan.h).
//
// The memory plan is not a mirror: it walks the very buffer tables that model_init,
// fsdp_init and the MFU benchmark allocate from (model_buffer_table, fsdp_buffer_table,
// mfu_bench_buffer_table), so a buffer added there is planned here with no edit.
#include "plan.h"

#include <stdlib.h>
#include <string.h>

#include "attention_cudnn.h"
#include "attention_ws.h"
#include "common.h"
#include "fsdp.h"
#include "fp8_linear.h"
#include "fsutil.h"
#include "mfu.h"

// (the devices' table: src/plan_price.c)

static size_t arena_of(size_t planned, size_t sample) {
    return planned + sample + planned / PLAN_ARENA_MARGIN_DIVISOR + PLAN_ARENA_MARGIN_FIXED;
}
size_t plan_arena_bytes(const plan *p) { return arena_of(p->total, p->sample_bytes); }

// device memory the arena may take: all of it but the context and the communicators
static size_t arena_room(const plan *p, const plan_device *d) {
    const size_t outside = PLAN_CONTEXT_BYTES + p->nccl_bytes;
    return d->memory_bytes > outside ? d->memory_bytes - outside : 0;
}

int plan_fits(const plan *p, const plan_device *d) { return plan_arena_bytes(p) <= arena_room(p, d); }

size_t plan_device_budget(const plan *p, const plan_device *d) {
    const size_t room = arena_room(p, d), fixed = arena_of(0, p->sample_bytes);
    if (room < fixed) return 0;
    // t + t / D <= room - fixed, then exact
    size_t t = (size_t)((double)(room - fixed) / (1.0 + 1.0 / PLAN_ARENA_MARGIN_DIVISOR));
    while (t > 0 && arena_of(t, p->sample_bytes) > room) t--;
    while (arena_of(t + 1, p->sample_bytes) <= room) t++;
    return t;
}

// The NCCL communicators src/launch.c creates for a GPU rank of this grid.
static int plan_nccl_comms(const plan_request *r) {
    const int W = r->world_size, S = r->shard_size, R = W / S;
    if (r->elem_bytes != 2 || W == 1) return 0;
    return 1 + (S > 1 && S < W) + (R > 1 && R < W) + (S > 1);
}

// ----------------------------------------------------------------------------
// memory

// One report line per run of consecutive buffers with the same description; every byte counts
// even if the line table is full.
static void add_item(plan *p, mem_category cat, size_t bytes, const char *what) {
    p->bytes[cat] += bytes;
    if (cat != MEM_HOST) p->total += bytes;   // total: device memory, as the tracker counts it
    plan_item *last = p->n_items ? &p->items[p->n_items - 1] : NULL;
    if (last && last->cat == cat && strcmp(last->what, what) == 0) last->bytes += bytes;
    else if (p->n_items < PLAN_MAX_ITEMS) p->items[p->n_items++] = (plan_item){cat, bytes, what};
}

static int plan_table_add(mem_table *t, const mem_buffer *b) {
    add_item(t->ctx, b->cat, b->bytes, b->what);
    return 0;
}

static int plan_sum_add(mem_table *t, const mem_buffer *b) {   // ctx: a size_t sum
    *(size_t *)t->ctx += b->bytes;
    return 0;
}

// The buffers of job_setup in its allocation order: model_init, then fsdp_init (in
// p->grad_mode, which names the fp32 unit buffer's second use), with LoRA (ll not NULL) the
// frozen base's state and then the adapters' state, then the MFU benchmark.
int plan_model_buffers(const plan_request *r) {
    return r->eval_only ? MODEL_FORWARD_ONLY : r->gradient_checkpointing ? MODEL_TRAIN_CKPT : MODEL_TRAIN;
}

// --fp8: the one scratch buffer of the FP8 wrapper, sized for its largest call: the decoder
// linears at B x len rows for every length a micro-batch runs at (backend_seq_len's buckets up
// to T: the backward's layout holds dW's FP8 operands only at B len a multiple of 16, so a
// shorter bucket can take more than B x T rows; forward, and the backward unless
// --eval_only), and after training the sampler's (1, T) inference model: its linears (the
// lm_head's logits and the MFU benchmark's GEMM skip the wrapper: fp8_linear_unwrap). Call
// after p->sample_alloc_seq is set.
static size_t plan_fp8_bytes(const plan *p, const llama_config *c) {
    const plan_request *r = &p->req;
    if (!r->fp8 || r->elem_bytes != 2) return 0;
    const lora_config *lc = r->lora.rank ? &r->lora : NULL;
    const backend gpu = {.seq_bucket = BACKEND_GPU_SEQ_BUCKET};
    size_t b = 0;
    for (int len = 1, T = r->seq_len; len <= T; len = backend_seq_len(&gpu, len, T) + 1) {
        const size_t s = fp8_linear_model_bytes(c, lc, r->batch_size_per_device * backend_seq_len(&gpu, len, T),
                                                !r->eval_only);
        if (s > b) b = s;
    }
    if (r->sample_seq > 0) {
        const size_t s = fp8_linear_model_bytes(c, lc, p->sample_alloc_seq, 0);
        if (s > b) b = s;
    }
    return b ? b + FP8_LINEAR_SLOT_BYTES : 0;   // (and the fused amax's slot)
}

static void plan_memory(plan *p, const llama_config *c, const param_layout *l, const lora_layout *ll) {
    const plan_request *r = &p->req;
    mem_table t = {plan_table_add, p, 0};
    const fsdp_grad_mode mode = (fsdp_grad_mode)p->grad_mode;
    model_buffer_table(&t, c, ll ? &r->lora : NULL, r->batch_size_per_device, r->seq_len, plan_model_buffers(r),
                       fsdp_grads_f32(mode, r->reduce_f32), r->elem_bytes, NULL);
    fsdp_setup setup = {mode, ll ? FSDP_FROZEN : FSDP_TRAINED, r->offload_optimizer, r->keep_params_gathered,
                        r->reduce_f32, r->eval_only, r->moments_bf16};
    fsdp_buffer_table(&t, l, r->shard_size, &setup, r->elem_bytes, NULL);
    setup.role = FSDP_ADAPTERS;
    if (ll) fsdp_buffer_table(&t, &ll->layout, r->shard_size, &setup, r->elem_bytes, NULL);
    if (r->mfu_benchmark) mfu_bench_buffer_table(&t, r->elem_bytes, NULL);
    // --sample_tokens: after training, sampler_continue builds a (1, T) inference model beside
    // the training buffers, with the forward's buffers only (MODEL_FORWARD_ONLY: one residual
    // buffer, one activation set; its attention takes the training calls' per-call workspace,
    // idle then)
    if (r->sample_seq > 0) {
        const backend gpu = {.seq_bucket = r->elem_bytes == 2 ? BACKEND_GPU_SEQ_BUCKET : 1};
        p->sample_alloc_seq = backend_seq_len(&gpu, r->sample_seq, c->max_position_embeddings);
        mem_table s = {plan_sum_add, &p->sample_bytes, 0};
        model_buffer_table(&s, c, ll ? &r->lora : NULL, 1, p->sample_alloc_seq, MODEL_FORWARD_ONLY, 0, r->elem_bytes,
                           NULL);
    }
    if ((p->fp8_bytes = plan_fp8_bytes(p, c)))
        add_item(p, MEM_WORKSPACE, p->fp8_bytes, "--fp8: FP8 copies of the largest linear call's operands "
                                                 "(one arena buffer, reserved at setup) and the fused amax's slot");
    // cuDNN attention takes its workspace from the device arena around each call (the largest
    // shape is the full batch at seq_len); the CUDA backend refuses a plan that wants more. The
    // native tensor-core backward takes its bf16 dS^T workspace likewise (src/attention_ws.h),
    // and a cuDNN job falls back to it when the startup check or a call fails: the larger.
    // --eval_only: no backward. A cuDNN forward takes its engine's workspace from the arena
    // likewise, at most the bound the front lets a plan ask (attn_cudnn_front: a plan past it
    // falls back to the native forward, which takes none)
    if (r->elem_bytes == 2 && r->eval_only) {
        if (r->attention_cudnn)
            add_item(p, MEM_WORKSPACE, attn_cudnn_workspace_bound(r->batch_size_per_device, r->seq_len,
                                                                  c->num_attention_heads, c->num_key_value_heads,
                                                                  c->head_dim, 0),
                     "cuDNN attention forward workspace (the engine's, at most this bound)");
    } else if (r->elem_bytes == 2) {
        const size_t native = attention_bwd_ds_bytes(r->batch_size_per_device, r->seq_len, c->num_attention_heads,
                                                     c->num_key_value_heads, ATTN_DS_CAP_BYTES, NULL, NULL);
        const size_t cudnn = attn_cudnn_workspace_bound(r->batch_size_per_device, r->seq_len, c->num_attention_heads,
                                                        c->num_key_value_heads, c->head_dim, r->deterministic);
        if (!r->attention_cudnn) add_item(p, MEM_WORKSPACE, native, "native attention backward dS^T workspace (bf16, one launch)");
        else if (cudnn >= native)
            add_item(p, MEM_WORKSPACE, cudnn, r->deterministic
                                                  ? "cuDNN attention workspace (bf16 dP for --deterministic, row sums, engine)"
                                                  : "cuDNN attention workspace (fp32 dQ accumulator, row sums, engine)");
        else
            add_item(p, MEM_WORKSPACE, native, "cuDNN attention workspace, sized for the native backward's dS^T "
                                               "(bf16, one launch: larger, and the fallback)");
    }
}

// ----------------------------------------------------------------------------
// FLOPs and collective bytes of one optimizer step

// One layer's LoRA adapter parameters (the MFU numerator's count), 0 without LoRA.
static double plan_adapter_layer_params(const plan_request *r, const llama_config *c) {
    return r->lora.rank ? lora_layer_params(c, &r->lora) : 0;
}

// --eval_only: one forward micro-batch per rank; its model FLOPs are the forward's (2 x matmul
// params, adapters included, + causal attention: model_forward_flops_per_token). Sharded, every layer is gathered
// in each forward (but for a model of 2 layers or fewer: still in the two layer buffers from
// the forward before) and the root once for the whole evaluation (kept: nothing changes the
// parameters); with --keep_params_gathered every unit once. The plan gives the steady state:
// the root's gather and, kept, every unit's come with the first micro-batch only. No
// gradients, so no reduce-scatter, all-reduce or optimizer traffic.
static void plan_eval_work(plan *p, const llama_config *c) {
    const plan_request *r = &p->req;
    p->tokens = (double)r->batch_size_per_device * plan_row_tokens(r);
    p->model_flops = p->tokens * model_forward_flops_per_token(c, plan_row_tokens(r), plan_adapter_layer_params(r, c));
    const size_t S = (size_t)r->shard_size, Lu = (size_t)c->num_hidden_layers;
    if (S == 1 || r->keep_params_gathered || Lu <= 2) return;
    const size_t adapter_layer = r->lora.rank ? p->trained_layer_numel : 0;
    p->all_gather_bytes = (S - 1) * Lu * ((p->layer_numel + adapter_layer) / S) * r->elem_bytes;
}

static void plan_step_work(plan *p, const llama_config *c) {
    const plan_request *r = &p->req;
    if (r->eval_only) {
        plan_eval_work(p, c);
        return;
    }
    p->tokens = (double)p->accum * r->batch_size_per_device * plan_row_tokens(r);
    p->model_flops = p->tokens * model_flops_per_token(c, plan_row_tokens(r), plan_adapter_layer_params(r, c));   // executed: plan_ops_compute

    // collectives: the byte counters of src/comm.c (ring: a rank sends (n-1)/n of the data)
    const size_t S = (size_t)r->shard_size, R = (size_t)p->replica_size, esz = r->elem_bytes;
    const size_t Lu = (size_t)c->num_hidden_layers, A = (size_t)p->accum;
    if (S > 1) {
        // fsdp.c's provider: the root once per step (kept across micro-batches until the
        // optimizer step changes it); the first forward gathers every layer; a backward
        // starts with the last two forward layers still gathered, and the next micro-batch's
        // forward starts with layers 0 and 1 still gathered from the backward; the optimizer
        // step invalidates them. A frozen LoRA base is never invalidated: in a steady step
        // its root and layers 0 and 1 are still gathered from the step before.
        const size_t reuse = Lu > 2 ? Lu - 2 : 0;
        const size_t layer_gathers = Lu + reuse + (A - 1) * 2 * reuse;
        const size_t tl = p->trained_layer_numel, tr = p->trained_root_numel, tt = p->trained_padded_total;
        p->root_all_gather_bytes = (S - 1) * (tr / S) * esz;
        p->all_gather_bytes = (S - 1) * (tr / S + layer_gathers * (tl / S)) * esz;
        if (r->lora.rank) p->all_gather_bytes += (S - 1) * (A * 2 * reuse * (p->layer_numel / S)) * esz;
        // --keep_params_gathered: every trained unit once per step; the frozen base once per run
        if (r->keep_params_gathered) p->all_gather_bytes = (S - 1) * (tt / S) * esz;
        // gradients of the trained state: every unit per micro-batch (in gesz: the working
        // dtype, or fp32 with --reduce_dtype fp32), or once per step (locally accumulated);
        // the root once per step in fp32 when FSDP_GRADS_ROOT_ONCE
        const size_t layers = tt - tr, gesz = r->reduce_f32 ? sizeof(float) : esz;
        if (p->grad_mode == FSDP_GRADS_LOCAL) {   // the fp32 sums, once per step
            p->reduce_scatter_bytes = (S - 1) * (tt / S) * sizeof(float);
            p->root_reduce_scatter_bytes = (S - 1) * (tr / S) * sizeof(float);
        } else if (p->grad_mode == FSDP_GRADS_ROOT_ONCE) {
            p->root_reduce_scatter_bytes = (S - 1) * (tr / S) * sizeof(float);
            p->reduce_scatter_bytes = (S - 1) * A * (layers / S) * gesz + p->root_reduce_scatter_bytes;
        } else {
            p->reduce_scatter_bytes = A * (S - 1) * (tt / S) * gesz;
            p->root_reduce_scatter_bytes = A * (S - 1) * (tr / S) * gesz;
        }
    }
    const size_t n_trained_local = p->trained_padded_total / S;
    // fp32 slices across replicas, one all-reduce per unit (fsdp.c grad_final): each counts
    // 2 (R - 1) x (its slice / R) elements (comm.c), the layers' slices and the root's
    if (R > 1) {
        const size_t tl = p->trained_layer_numel / S, tr = p->trained_root_numel / S;
        p->all_reduce_bytes = 2 * (R - 1) * (Lu * (tl / R) + tr / R) * sizeof(float);
    }
    // per slice element: zero the gradient (4), its norm (4), AdamW reads master, grad, m, v
    // (16) and writes master, m, v (12) and the working parameter (esz); bf16 moments: m, v 2
    // bytes each way (8 fewer)
    p->optimizer_hbm_bytes = (double)n_trained_local * ((r->moments_bf16 ? 28.0 : 36.0) + (double)esz);
    if (p->req.offload_optimizer) {
        // the device keeps the zeroing and the norm (8); the host AdamW reads grad, master, m,
        // v (16), writes master, m, v (12) and the working parameter (esz); over PCIe the fp32
        // gradient slice goes down (4) and the working parameter up (esz)
        p->optimizer_hbm_bytes = (double)n_trained_local * 8.0;
        p->offload_host_bytes = (double)n_trained_local * (28.0 + (double)esz);
        p->offload_d2h_bytes = (double)n_trained_local * 4.0;
        p->offload_h2d_bytes = (double)n_trained_local * (double)esz;
    }
}

// ----------------------------------------------------------------------------
// the plan

int plan_validate_grid(int W, int S) {
    if (W < 1) return ft_error("plan: world size %d is not positive", W);
    if (S < 1 || W % S != 0) return ft_error("flag --dp_shard: %d does not divide the world size %d", S, W);
    return 0;
}

int plan_row_tokens(const plan_request *r) { return r->row_tokens > 0 ? r->row_tokens : r->seq_len; }

int plan_gpus_per_node(const plan_request *r, const plan_device *d) {
    return r->gpus_per_node > 0 ? r->gpus_per_node : d->gpus_per_node;
}

int plan_validate(const llama_config *c, const plan_request *r) {
    TRY(plan_validate_grid(r->world_size, r->shard_size));
    if (r->batch_size_per_device < 1 || r->seq_len < 1 || r->total_batch_size < 1)
        return ft_error("plan: batch %d, seq_len %d, total batch %d must be positive", r->batch_size_per_device,
                        r->seq_len, r->total_batch_size);
    if (r->seq_len > c->max_position_embeddings)
        return ft_error("flag --seq_len: %d exceeds the model's max_position_embeddings %d", r->seq_len,
                        c->max_position_embeddings);
    if (r->row_tokens < 0 || r->row_tokens > r->seq_len)
        return ft_error("flag --dry_run_row_tokens: %d is not within 0..--seq_len %d", r->row_tokens, r->seq_len);
    const int per_step = r->batch_size_per_device * r->world_size;
    if (r->total_batch_size % per_step != 0)
        return ft_error("flag --total_batch_size: %d is not a multiple of --batch_size_per_device %d x %d ranks = %d",
                        r->total_batch_size, r->batch_size_per_device, r->world_size, per_step);
    if (r->elem_bytes != 2 && r->elem_bytes != 4) return ft_error("plan: element size %zu is not 2 or 4", r->elem_bytes);
    if (r->elem_bytes == 2 && r->attention_segments && c->head_dim > ATTN_NATIVE_MAX_HEAD_DIM)
        return ft_error("flag --pack_attention per_game: it runs the native GPU attention kernels, which take "
                        "head_dim up to %d, the model's is %d (--pack_attention row runs cuDNN)",
                        ATTN_NATIVE_MAX_HEAD_DIM, c->head_dim);
    if (r->elem_bytes == 2 && !r->attention_cudnn && c->head_dim > ATTN_NATIVE_MAX_HEAD_DIM)
        return ft_error("flag --attention native: the native GPU attention kernels take head_dim up to %d, the "
                        "model's is %d (--attention cudnn runs it through cuDNN)", ATTN_NATIVE_MAX_HEAD_DIM,
                        c->head_dim);
    return r->lora.rank ? lora_validate(&r->lora, c) : 0;
}

// The plan of `r`; with_ops 0: its memory and step work without the step's op list (the batch
// search asks only whether the memory fits, and the op count runs the model once).
static int plan_build(plan *p, const llama_config *c, const plan_request *r, int with_ops) {
    memset(p, 0, sizeof *p);
    p->req = *r;
    TRY(plan_validate(c, r));
    const int per_step = r->batch_size_per_device * r->world_size;
    p->replica_size = r->world_size / r->shard_size;
    p->accum = r->total_batch_size / per_step;

    // the layout as the trainer builds it
    param_layout l;
    TRY(param_layout_init(&l, c, fsdp_pad_multiple(r->shard_size)));
    p->n_params = l.n_params;
    p->layer_numel = l.unit_numel[0];
    p->root_numel = l.unit_numel[l.n_layers];
    p->padded_total = l.total;
    p->n_local = p->padded_total / (size_t)r->shard_size;

    p->nccl_comms = plan_nccl_comms(r);
    p->nccl_comm_bytes = r->nccl_comm_bytes ? r->nccl_comm_bytes : PLAN_NCCL_COMM_BYTES;
    p->nccl_bytes = (size_t)p->nccl_comms * p->nccl_comm_bytes;
    p->grad_mode = r->accumulate_grads_locally ? FSDP_GRADS_LOCAL : FSDP_GRADS_PER_MICRO_BATCH;
    if (!r->accumulate_grads_locally && r->shard_size > 1 && p->accum > 1) p->grad_mode = FSDP_GRADS_ROOT_ONCE;
    p->grad_mode = fsdp_resolve_grad_mode((fsdp_grad_mode)p->grad_mode, r->shard_size);
    lora_layout ll;
    p->n_trainable = p->n_params;
    p->trained_layer_numel = p->layer_numel;
    p->trained_root_numel = p->root_numel;
    p->trained_padded_total = p->padded_total;
    if (r->lora.rank) {
        if (lora_layout_init(&ll, c, &r->lora, fsdp_pad_multiple(r->shard_size)) != 0) { param_layout_free(&l); return -1; }
        p->n_trainable = ll.layout.n_params;
        p->trained_layer_numel = ll.layout.unit_numel[0];
        p->trained_root_numel = ll.layout.unit_numel[ll.layout.n_layers];
        p->trained_padded_total = ll.layout.total;
    }
    plan_memory(p, c, &l, r->lora.rank ? &ll : NULL);
    if (r->lora.rank) lora_layout_free(&ll);
    param_layout_free(&l);
    plan_step_work(p, c);
    return with_ops ? plan_ops_compute(p, c) : 0;
}

int plan_compute(plan *p, const llama_config *c, const plan_request *r) { return plan_build(p, c, r, 1); }

// ----------------------------------------------------------------------------
// batch search

static int batch_fits(const llama_config *c, plan_request r, int B, size_t budget) {
    r.batch_size_per_device = B;
    r.total_batch_size = B * r.world_size;   // memory does not depend on the accumulation
    plan p;
    if (plan_build(&p, c, &r, 0) != 0) { ft_error_clear(); return 0; }
    return p.total <= budget;
}

int plan_find_max_batch(const llama_config *c, const plan_request *req, size_t budget, int dividing,
                        int max_batch) {
    // memory grows with B: bisect for the largest fitting B
    int lo = 0, hi = max_batch;   // invariant: lo fits (or is 0), everything above hi does not
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (batch_fits(c, *req, mid, budget)) lo = mid;
        else hi = mid - 1;
    }
    if (dividing)
        while (lo > 0 && req->total_batch_size % (lo * req->world_size) != 0) lo--;
    return lo;
}

// ----------------------------------------------------------------------------
// host memory (--offload_optimizer)

// --offload_optimizer: the planned host bytes of the ranks on this node, pinned (never swapped
// out), must fit in the host memory this job may use, less HOST_MEMORY_RESERVE of it for
// everything else the processes hold: the smaller of the machine's memory and the job's cgroup
// memory limits (a Slurm job's --mem: going past it gets the job killed while pinning, not
// refused) (fs_host_memory_limit: limits, not free memory, so that ranks checking at slightly
// different times do not count each other's pinned buffers). FT_HOST_MEMORY_BYTES replaces
// that figure (taken as is, no reserve): a cap, and the tests' way to plan a small host.
// Checked before anything is allocated (plan.h). 0 / -1.
#define HOST_MEMORY_RESERVE 0.10
int plan_check_host_memory(const plan *p, int ranks_on_node) {
    const size_t need = p->bytes[MEM_HOST] * (size_t)ranks_on_node;
    if (need == 0) return 0;
    const char *env = ft_getenv("FT_HOST_MEMORY_BYTES");
    char what[FT_PATH_MAX + 32] = "FT_HOST_MEMORY_BYTES";
    double have = env ? strtod(env, NULL) : 0;
    if (!env) {
        if (fs_host_memory_limit("", &have, what, sizeof what) != 0) {   // unknown: let the allocation decide
            ft_error_clear();
            return 0;
        }
        have *= 1 - HOST_MEMORY_RESERVE;
    }
    if ((double)need > have)
        return ft_error("flag --offload_optimizer: the optimizer state needs %.2f GiB of pinned host memory on this node "
                        "(%.2f GiB per rank x %d rank(s)), this job may use %.2f GiB (%s%s)", need / 1073741824.0,
                        p->bytes[MEM_HOST] / 1073741824.0, ranks_on_node, have / 1073741824.0, what,
                        env ? "" : ", less the share kept for the rest of the job");
    return 0;
}

// ----------------------------------------------------------------------------
// the report

static double gib(double bytes) { return bytes / (double)(1ull << 30); }

// --reduce_dtype fp32 changes something: a bf16 job that reduce-scatters per micro-batch
static int plan_reduces_f32(const plan *p) {
    return p->req.reduce_f32 && p->req.elem_bytes != sizeof(float) && p->req.shard_size > 1 &&
           p->grad_mode != FSDP_GRADS_LOCAL;
}

static void print_max_batch(FILE *out, const plan *p, const llama_config *c, size_t budget, int max_batch) {
    if (p->req.eval_only) {   // one forward micro-batch: no checkpointing, no total batch to divide
        const int b = plan_find_max_batch(c, &p->req, budget, 0, max_batch);
        fprintf(out, "largest batch_size_per_device that fits (seq %d, same grid, --eval_only: forward only): ",
                p->req.seq_len);
        if (b == 0) fprintf(out, "none (batch 1 does not fit)\n");
        else fprintf(out, "%d%s\n", b, b == max_batch ? " (the flag's maximum)" : "");
        return;
    }
    int best[2][2];   // [checkpointing][dividing]
    for (int ck = 0; ck < 2; ck++)
        for (int dv = 0; dv < 2; dv++) {
            plan_request r = p->req;
            r.gradient_checkpointing = ck;
            best[ck][dv] = plan_find_max_batch(c, &r, budget, dv, max_batch);
        }
    fprintf(out, "largest batch_size_per_device that fits (seq %d, %s, same grid):\n", p->req.seq_len,
            p->grad_mode == FSDP_GRADS_LOCAL    ? "accumulating locally"
            : p->grad_mode == FSDP_GRADS_DIRECT ? "one shard: gradients added into the fp32 step gradient"
                                                : "per-micro-batch reduce-scatter");
    for (int ck = 0; ck < 2; ck++) {
        fprintf(out, "  %-32s", ck ? "with --gradient_checkpointing" : "without gradient checkpointing");
        if (best[ck][0] == 0) fprintf(out, " none (batch 1 does not fit)\n");
        else
            fprintf(out, " %d%s; %d dividing --total_batch_size %d over %d rank(s)\n", best[ck][0],
                    best[ck][0] == max_batch ? " (the flag's maximum)" : "", best[ck][1], p->req.total_batch_size,
                    p->req.world_size);
    }
}

// One changed request against the 80 GB budget: 1 fits, 0 does not, -1 not a valid job (the
// planner's error cleared). *q gets the plan.
static int alternative_fits(const llama_config *c, const plan_request *r, plan *q) {
    if (plan_compute(q, c, r) != 0) {
        ft_error_clear();
        return -1;
    }
    return plan_fits(q, PLAN_FIT_DEVICE);
}

static void print_alternative(FILE *out, const char *change, int fits, const plan *q) {
    if (fits < 0) {
        fprintf(out, "  %-54s not a valid job\n", change);
        return;
    }
    fprintf(out, "  %-54s total %15zu bytes %8.2f GiB of %6.2f: %s", change, q->total, gib(q->total),
            gib(plan_device_budget(q, PLAN_FIT_DEVICE)), fits ? "fits" : "NO");
    if (q->bytes[MEM_HOST]) fprintf(out, " (+ %.2f GiB host memory per rank)", gib(q->bytes[MEM_HOST]));
    fprintf(out, "\n");
}

// A job that does not fit 80 GB: what each single change would need, planned exactly like
// the job itself (same batch, seq_len and micro-batches per step): the memory-saving flags it
// does not use yet, LoRA at rank 16 on the default targets, and full sharding over the fewest
// GPUs (a power of two up to 1024, more than this job has or with sharding it lacks) that fit.
static void print_fit_alternatives(FILE *out, const plan *p, const llama_config *c) {
    const plan_request *r = &p->req;
    plan q;
    fprintf(out, "what one change would need (each planned like this job: batch %d x seq %d per device, "
            "%d micro-batch(es) per step):\n", r->batch_size_per_device, r->seq_len, p->accum);
    // --eval_only holds no optimizer state, no backward activations and no trained state that
    // LoRA would shrink: only sharding the parameters over more GPUs changes its memory
    if (!r->offload_optimizer && !r->eval_only) {
        plan_request a = *r;
        a.offload_optimizer = 1;
        print_alternative(out, "--offload_optimizer", alternative_fits(c, &a, &q), &q);
    }
    if (!r->gradient_checkpointing && !r->eval_only) {
        plan_request a = *r;
        a.gradient_checkpointing = 1;
        print_alternative(out, "--gradient_checkpointing", alternative_fits(c, &a, &q), &q);
    }
    if (!r->lora.rank && !r->eval_only) {
        plan_request a = *r;
        a.lora = (lora_config){.rank = 16, .alpha = 16.0f};
        if (lora_parse_targets("q,k,v,o", &a.lora.targets) == 0)
            print_alternative(out, "--lora_rank 16 (targets q,k,v,o)", alternative_fits(c, &a, &q), &q);
        else ft_error_clear();
    }
    // full sharding: this world size when the job shards less, else the next powers of two
    for (int W = r->shard_size < r->world_size ? r->world_size : 2 * r->world_size; W <= 1024; W *= 2) {
        plan_request a = *r;
        a.world_size = a.shard_size = W;
        a.total_batch_size = p->accum * r->batch_size_per_device * W;
        const int fits = alternative_fits(c, &a, &q);
        if (fits != 1) continue;
        // the flag that keeps this job from sharding fully must go too: --world_size W alone
        // keeps --no_fsdp (DDP; at one rank it cannot be told from no flag) or --dp_shard
        const char *drop = r->shard_size == 1 ? " without --no_fsdp" : r->shard_size < r->world_size ? " without --dp_shard" : "";
        char change[96];
        snprintf(change, sizeof change, "FSDP over %d GPUs (--world_size %d%s)", W, W, drop);
        print_alternative(out, change, fits, &q);
        return;
    }
    fprintf(out, "  %-54s none up to 1024 GPUs fits\n", "FSDP over more GPUs");
}

// A sharded job whose layer gathers outrun its compute (collectives exposed, predicted for the
// 80 GB device): what --keep_params_gathered (every layer gathered once per step and kept)
// would predict instead, and whether it still fits. Printed only when that is faster by at
// least PLAN_FASTER_MIN of the step, after the step-time table.
#define PLAN_FASTER_MIN 0.05
static void print_faster_alternative(FILE *out, const plan *p, const llama_config *c) {
    const plan_request *r = &p->req;
    if (r->shard_size < 2 || r->keep_params_gathered || r->elem_bytes != 2) return;
    plan_request a = *r;
    a.keep_params_gathered = 1;
    plan q;
    const int fits = alternative_fits(c, &a, &q);
    if (fits < 0) return;
    plan_step_time now, then;
    plan_estimate_step_time(p, PLAN_FIT_DEVICE, &now);
    plan_estimate_step_time(&q, PLAN_FIT_DEVICE, &then);
    if (then.total_s > now.total_s * (1 - PLAN_FASTER_MIN)) return;
    fprintf(out, "\nfaster, predicted on the %s: --keep_params_gathered (every layer gathered once per step and kept, not "
            "once per micro-batch): step %.2f -> %.2f ms (collectives exposed %.2f -> %.2f ms, MFU %.1f%% -> %.1f%%), "
            "total %.2f GiB of %.2f: %s\n", PLAN_FIT_DEVICE->name, 1e3 * now.total_s, 1e3 * then.total_s,
            1e3 * now.comm_exposed_s, 1e3 * then.comm_exposed_s, 100 * now.mfu, 100 * then.mfu, gib(q.total),
            gib(plan_device_budget(&q, PLAN_FIT_DEVICE)), fits ? "fits" : "NO");
}

// The host memory of --offload_optimizer: per rank (the category line, for scripts) and per node.
static void print_host_memory(FILE *out, const plan *p) {
    const size_t h = p->bytes[MEM_HOST];
    const int W = p->req.world_size, per_node = W < plan_devices[0].gpus_per_node ? W : plan_devices[0].gpus_per_node;
    fprintf(out, "  %-12s %15zu %9.3f   %s\n", mem_category_name(MEM_HOST), h, gib(h),
            h ? "host memory per rank, not device (pinned on a GPU): --offload_optimizer" : "(none: no --offload_optimizer)");
    if (h)
        fprintf(out, "  host memory per node: %zu bytes (%.3f GiB) for %d rank(s) per node (up to %d GPUs per node); "
                "the step-time estimate below prices the host AdamW and the PCIe copies (row offload)%s\n",
                h * (size_t)per_node, gib((double)(h * (size_t)per_node)), per_node, plan_devices[0].gpus_per_node, p->req.elem_bytes == 2 ? "; the GPU path ran once on an H200 (the bundled model), its speed unmeasured" : "");
}

// --eval_only's collectives (plan_eval_work): the layer gathers of each forward; nothing else.
static void print_eval_collectives(FILE *out, const plan *p) {
    const plan_request *r = &p->req;
    fprintf(out, "\ncollectives: sent per rank per evaluation micro-batch (ring; steady state: the first micro-batch "
            "also gathers the root%s):\n", r->keep_params_gathered ? " and every layer" : "");
    fprintf(out, "  %-14s %15zu bytes %9.3f GB   %s\n", "all_gather", p->all_gather_bytes, p->all_gather_bytes / 1e9,
            r->shard_size == 1 ? "none (one shard)"
            : r->keep_params_gathered ? "none (every unit gathered once and kept: nothing changes the parameters)"
            : p->all_gather_bytes ? "every layer's parameters, each forward (the root gathered once and kept)"
                                  : "none (the model's two layers stay gathered between forwards)");
    fprintf(out, "  %-14s %15d bytes %9.3f GB   %s\n", "reduce_scatter", 0, 0.0, "none (no gradients)");
    fprintf(out, "  %-14s %15d bytes %9.3f GB   %s\n", "all_reduce", 0, 0.0,
            "none (no gradients; the loss sums are scalars)");
}

// The report's "job:" line: the grid, the micro-batch, how gradients travel (--eval_only: none).
static void print_job_line(FILE *out, const plan *p, const char *dtype, const char *device) {
    const plan_request *r = &p->req;
    if (r->eval_only) {
        fprintf(out, "job: --eval_only, the forward only: %d rank(s), sharding %s (shard group %d x replica group "
                "%d), batch %d x seq %d per device; no gradients, optimizer state or backward buffers%s; storage %s "
                "(--device %s)\n", r->world_size, fsdp_sharding_name(r->shard_size, r->world_size), r->shard_size,
                p->replica_size, r->batch_size_per_device, r->seq_len,
                r->keep_params_gathered && r->shard_size > 1 ? ", parameters gathered once and kept" : "", dtype,
                device);
        return;
    }
    fprintf(out, "job: %d rank(s), sharding %s (shard group %d x replica group %d), batch %d x seq %d per device, "
            "%d micro-batch(es) per step (total batch %d), gradient checkpointing %s%s%s%s; storage %s (--device %s)\n",
            r->world_size, fsdp_sharding_name(r->shard_size, r->world_size), r->shard_size, p->replica_size, r->batch_size_per_device, r->seq_len,
            p->accum, r->total_batch_size, r->gradient_checkpointing ? "on" : "off",
            p->grad_mode == FSDP_GRADS_LOCAL       ? ", gradients accumulated locally in fp32"
            : p->grad_mode == FSDP_GRADS_ROOT_ONCE ? ", root gradient summed over micro-batches in fp32, reduced once per step"
            : p->grad_mode == FSDP_GRADS_DIRECT    ? ", gradients added into the fp32 step gradient directly (one shard)"
                                                   : "",
            r->keep_params_gathered && r->shard_size > 1 ? ", parameters gathered once per step and kept" : "",
            plan_reduces_f32(p) ? ", per-micro-batch gradients reduce-scattered in fp32 (--reduce_dtype fp32)" : "", dtype,
            device);
}

// The report's head: the model, the job, LoRA's adapters.
static void print_head(FILE *out, const plan *p, const llama_config *c, const char *model_dir, const char *device) {
    const plan_request *r = &p->req;
    const char *dtype = r->elem_bytes == 2 ? "bf16" : "fp32";
    fprintf(out, "finetune: dry run: a plan, nothing allocated, no weights read\n");
    fprintf(out, "model %s: %zu params (%zu with units padded to multiples of %zu), %d layers, hidden %d, heads %d/%d, "
            "intermediate %d, vocab %d\n", model_dir, p->n_params, p->padded_total, fsdp_pad_multiple(r->shard_size),
            c->num_hidden_layers, c->hidden_size, c->num_attention_heads, c->num_key_value_heads,
            c->intermediate_size, c->vocab_size);
    print_job_line(out, p, dtype, device);
    if (r->lora.rank) {
        char targets[64];
        lora_targets_string(r->lora.targets, targets, sizeof targets);
        fprintf(out, "LoRA: rank %d, alpha %g, targets %s: %zu trainable parameters (%.3f%% of the model); the base is "
                "frozen (working parameters only, no gradients or optimizer state); %s\n", r->lora.rank,
                (double)r->lora.alpha, targets, p->n_trainable, 100.0 * (double)p->n_trainable / (double)p->n_params,
                r->eval_only ? "--eval_only: the adapters' working parameters only, and their forward in the estimate"
                             : "the step-time estimate below prices the base's forward and dX GEMMs (no dW) and "
                               "the adapters' products");
    }
}

// The memory per rank: one line per category (and its buffers), the total, sampling's model,
// the host memory and the model state's bytes per parameter.
static void print_memory(FILE *out, const plan *p) {
    const plan_request *r = &p->req;
    fprintf(out, "\nmemory per rank (what the allocator's tracker records; exact for this build%s):\n",
            r->elem_bytes == 2 && !r->eval_only ? ", but for the attention backward's workspace line: taken from the "
                                                  "arena around each call, not a tracked buffer; and --fp8's, an "
                                                  "untracked arena buffer"
            : r->elem_bytes == 2 && r->attention_cudnn ? ", but for the cuDNN attention forward workspace line: taken "
                                                         "from the arena around each call, not a tracked buffer"
                                                       : "");
    fprintf(out, "  %-12s %15s %9s\n", "category", "bytes", "GiB");
    for (int cat = 0; cat < MEM_CATEGORY_COUNT; cat++) {
        if (cat == MEM_HOST) continue;   // after the device total
        int n = 0, last = -1;
        for (int i = 0; i < p->n_items; i++)
            if (p->items[i].cat == (mem_category)cat) { n++; last = i; }
        // a category of one buffer says what it is on its own line; larger ones list theirs
        fprintf(out, "  %-12s %15zu %9.3f   %s\n", mem_category_name((mem_category)cat), p->bytes[cat],
                gib(p->bytes[cat]), n == 1 ? p->items[last].what : n == 0 ? "(none)" : "");
        for (int i = 0; i < p->n_items && n > 1; i++)
            if (p->items[i].cat == (mem_category)cat)
                fprintf(out, "  %-12s %15zu %9.3f     %s\n", "", p->items[i].bytes, gib(p->items[i].bytes),
                        p->items[i].what);
    }
    fprintf(out, "  %-12s %15zu %9.3f   peak: every buffer lives from setup to the end of %s\n", "total",
            p->total, gib(p->total), r->eval_only ? "the evaluation" : "training");
    if (p->sample_bytes)
        fprintf(out, "  %-12s %15zu %9.3f   after training, beside the total: the (1, %d) inference model of "
                "--sample_tokens\n", "sampling", p->sample_bytes, gib(p->sample_bytes), p->sample_alloc_seq);
    print_host_memory(out, p);
    const double state = (double)(p->bytes[MEM_PARAMS] + p->bytes[MEM_GRADS] + p->bytes[MEM_OPTIMIZER]);
    fprintf(out, "  model state (params + grads + optimizer): %.2f bytes per parameter over all %d rank(s), %.2f per rank\n",
            state * r->world_size / (double)p->n_params, r->world_size, state / (double)p->n_params);
}

// Whether the plan fits the 80 GB device, its largest batches, and what would fit when it does not.
static void print_fit(FILE *out, const plan *p, const llama_config *c, int max_batch) {
    const plan_request *r = &p->req;
    const plan_device *d = PLAN_FIT_DEVICE;
    const size_t budget = plan_device_budget(p, d);
    fprintf(out, "\nfits an 80 GB GPU (A100/H100 80GB): %s (%.2f GiB of %.2f GiB: the H100's %.2f GiB, less %.0f GiB "
            "assumed for the CUDA context and the libraries, %d NCCL communicator(s) at %.2f GiB each (%s), and "
            "the arena's margin of %d%% + %zu MiB%s)%s\n", plan_fits(p, d) ? "yes" : "NO", gib(p->total), gib(budget),
            gib(d->memory_bytes), gib(PLAN_CONTEXT_BYTES), p->nccl_comms, gib(p->nccl_comm_bytes),
            r->nccl_comm_bytes ? "--nccl_gib_per_comm" : "assumed",
            100 / PLAN_ARENA_MARGIN_DIVISOR, PLAN_ARENA_MARGIN_FIXED >> 20, p->sample_bytes ? ", with sampling's" : "",
            r->elem_bytes == 4 ? "; fp32 storage as on the CPU backend: plan with --device cuda for bf16" : "");
    print_max_batch(out, p, c, budget, max_batch);
    if (!plan_fits(p, d)) print_fit_alternatives(out, p, c);
}

// The training step's collectives per rank.
static void print_collectives(FILE *out, const plan *p) {
    const plan_request *r = &p->req;
    fprintf(out, "\ncollectives: sent per rank per optimizer step (ring; as the comm counters and metrics.jsonl record them):\n");
    const struct { const char *name; size_t bytes; const char *what; } coll[] = {
        {"all_gather", p->all_gather_bytes,
         r->keep_params_gathered ? "every unit's parameters once per step, kept until the optimizer step (a frozen base: once)"
                                 : "parameters of the units not still gathered (the root once per step)"},
        {"reduce_scatter", p->reduce_scatter_bytes,
         p->grad_mode == FSDP_GRADS_LOCAL       ? "gradients, once per step (fp32)"
         : p->grad_mode == FSDP_GRADS_ROOT_ONCE
             ? (plan_reduces_f32(p) ? "layer gradients once per micro-batch (fp32); the root's once per step (fp32)"
                                    : "layer gradients once per micro-batch; the root's once per step (fp32)")
             : (plan_reduces_f32(p) ? "gradients, once per micro-batch (fp32)" : "gradients, once per micro-batch")},
        {"all_reduce", p->all_reduce_bytes, "fp32 gradient slices across replicas (scalars not counted)"},
    };
    for (int i = 0; i < 3; i++)
        fprintf(out, "  %-14s %15zu bytes %9.3f GB   %s\n", coll[i].name, coll[i].bytes, coll[i].bytes / 1e9, coll[i].what);
}

void plan_print_report(FILE *out, const plan *p, const llama_config *c, const char *model_dir, const char *device,
                       int max_batch) {
    print_head(out, p, c, model_dir, device);
    print_memory(out, p);
    print_fit(out, p, c, max_batch);
    if (p->req.eval_only) print_eval_collectives(out, p);
    else print_collectives(out, p);
    plan_print_step_time(out, p);
    plan_tl_print(out, p);
    print_faster_alternative(out, p, c);
}
