// plan.h: the memory and step-time planner behind `finetune --dry_run`.
//
// From a model config and the job's shape (world size, shard group, batch, sequence length,
// checkpointing, accumulation mode, storage dtype) it computes, without allocating anything,
// the bytes each rank's mem_tracker will record per category, and an estimate of one
// optimizer step per op class on A100, H100 and H200 GPUs.
//
// The memory plan walks the same buffer tables that model_init (src/model.c), fsdp_init
// (src/fsdp.c) and the MFU benchmark (src/mfu.c) allocate from, so on the CPU backend it is
// exact by construction; tests/test_plan.sh still compares it with the allocator's measured
// peaks. Every buffer is allocated once at setup and kept to the
// end of training, so the peak total is the sum of the categories. One planned workspace line
// is not a tracked buffer: the GPU attention backward's per-call workspace, cuDNN's (--attention
// cudnn) or the native kernels' dS^T (src/attention_ws.h), taken from the arena around each call;
// with --fp8 a second: the FP8 wrapper's scratch (src/fp8_linear.h), one arena buffer reserved at
// setup (tests/test_cuda_emu_train.sh compares it with the run's largest call). Not planned: what the
// mem_tracker does not see (a CUDA context and the libraries' handles: PLAN_CONTEXT_BYTES in
// the fit check; NCCL communicators: counted in the fit check at nccl_comm_bytes each)
// and the inference model that --sample_tokens builds after training (sample_bytes, beside the
// total: plan_arena_bytes adds it).
//
// The step-time estimate (src/plan_time.c) prices each op of the step by its class: tensor-core
// GEMMs and attention at a stated fraction of the peak bf16 rate, the fp32 SIMT kernels at
// their shared-memory-bound rate, memory-bound kernels at HBM bandwidth (bytes from the
// shapes), collectives over NVLink or InfiniBand, hidden behind layer compute where the FSDP
// schedule overlaps them. An estimate labelled as one: the GEMM fraction and the per-operation
// floor were measured on one H200 (2026-11-26), the other fractions are the GPU review's
// estimates (src/plan_time.c says which is which).
#pragma once
#include <stddef.h>
#include <stdio.h>

#include "config.h"
#include "lora.h"
#include "memory.h"
#include "plan_price.h"

// ----------------------------------------------------------------------------
// the request: one job's shape

typedef struct {
    int world_size;                 // W ranks
    int shard_size;                 // S ranks per shard group (1 = DDP / one device); S divides W
    int batch_size_per_device;      // B sequences per micro-batch
    int seq_len;                    // T: buffers are sized for it (runs trim compute, not memory)
    int total_batch_size;           // sequences per optimizer step over all ranks; B x W divides it
    int gradient_checkpointing;     // 1: keep each layer's input only, recompute in backward
    int accumulate_grads_locally;   // 1: full-size gradients summed locally, reduced once per step
    int keep_params_gathered;       // 1: every unit gathered once per step and kept (S > 1)
    int reduce_f32;                 // 1: --reduce_dtype fp32: per-micro-batch gradient buffers
                                    // and their reduce-scatters in fp32 (no effect at elem_bytes 4)
    size_t elem_bytes;              // storage dtype of the backend: 4 (CPU, fp32), 2 (CUDA, bf16)
    int attention_cudnn;            // 1: GPU attention through cuDNN (--attention cudnn, bf16): its
                                    // per-call workspace (attn_cudnn_workspace_bound) is planned
    int attention_segments;         // 1: --pack_attention per_game: the step's attention runs the
                                    // native kernels (segment starts), whatever attention_cudnn says
    int deterministic;              // 1: cuDNN's deterministic backward (--deterministic: + B H T^2 x 2)
    int mfu_benchmark;              // 1: train.c measures the matmul rate (--peak_tflops 0), whose
                                    // buffers (src/mfu.h) are workspace
    int offload_optimizer;          // 1: fp32 master + AdamW moments in host memory (MEM_HOST, not
                                    // in `total`), AdamW on the host
    int moments_bf16;               // 1: --optimizer_moments bf16: the two moments 2 bytes an element
                                    // each, not 4 (never with offload_optimizer)
    lora_config lora;               // rank 0: full fine-tuning; else LoRA: a frozen base (working
                                    // parameters only) and the adapters' own sharded state
    int sample_seq;                 // --sample_tokens: the sampled sequence's length (prompt +
                                    // tokens; the inference model is built for it after training,
                                    // padded to the GPU's bucket); 0 = no sampling
    int eval_only;                  // --eval_only: the forward's buffers (MODEL_FORWARD_ONLY) and
                                    // the working parameters only (no gradients, optimizer state,
                                    // backward scratch or attention backward workspace); the
                                    // "step" is one forward micro-batch; gradient checkpointing,
                                    // offload and the gradient modes change nothing
    size_t nccl_comm_bytes;         // GPU memory each NCCL communicator takes (--nccl_gib_per_comm;
                                    // 0 = PLAN_NCCL_COMM_BYTES)
    int row_tokens;                 // the step-time estimates' tokens per row (--dry_run_row_tokens:
                                    // the micro-batches' mean trimmed length; 0 = seq_len): compute,
                                    // tokens and model FLOPs, not memory (sized for seq_len)
    double fabric_intra_busbw;      // bytes/s: the step-time timeline's collectives within a node
    double fabric_inter_busbw;      // and across nodes (--fabric_intra_gbps, --fabric_inter_gbps;
                                    // 0 = plan_fabric_of's defaults, src/plan_timeline.c)
    int gpus_per_node;              // the step-time estimates' GPUs per node (--dry_run_gpus_per_node;
                                    // 0 = the device's): which groups span nodes
    int fp8;                        // --fp8 (elem_bytes 2): the FP8 copies of the largest linear's
                                    // operands, one arena buffer (src/fp8_linear.h), are workspace
} plan_request;

// The tokens per row the step-time estimates take: r->row_tokens, or seq_len when that is 0.
int plan_row_tokens(const plan_request *r);
// The GPUs per node the step-time estimates place r's ranks on: r->gpus_per_node, or d's when 0.
int plan_gpus_per_node(const plan_request *r, const plan_device *d);

// The model buffers (model.h: MODEL_TRAIN, MODEL_TRAIN_CKPT, MODEL_FORWARD_ONLY) a job of `r`
// allocates: the planner and the trainer both take them from here.
int plan_model_buffers(const plan_request *r);

// ----------------------------------------------------------------------------
// the plan

// How an op of the step-time estimate runs (src/plan_time.c has the rates).
typedef enum {
    PLAN_OP_GEMM,       // tensor cores through cuBLASLt
    PLAN_OP_ATTENTION,  // attention on tensor cores (cuDNN graph or the native wmma kernels)
    PLAN_OP_SIMT,       // fp32 SIMT code (the attention kernels when head_dim % 16 != 0)
    PLAN_OP_MEMORY,     // bound by HBM bytes
    PLAN_OP_CLASS_COUNT
} plan_op_class;
// What collectives an op can hide: layer forward / backward ops hide the layer gathers and
// reduce-scatters of their phase; root and per-step ops hide nothing.
typedef enum { PLAN_PHASE_FWD, PLAN_PHASE_BWD, PLAN_PHASE_ROOT, PLAN_PHASE_STEP, PLAN_PHASE_COUNT } plan_op_phase;
typedef struct {
    const char *what;
    plan_op_class cls;
    plan_op_phase phase;
    double flops;                   // per rank per optimizer step (0 for memory-bound ops)
    double bytes;                   // HBM bytes per rank per step (memory-bound ops only)
    double rate;                    // PLAN_OP_ATTENTION: fraction of the peak bf16 rate;
                                    // PLAN_OP_SIMT: FLOPs per SM per clock; PLAN_OP_GEMM: 0
                                    // (bf16) or PLAN_GEMM_RATE_FP8 (at the FP8 peak: --fp8)
    double launches;                // device operations it issues per rank per step (kernels,
                                    // GEMMs, cuDNN graph executions, memsets): each takes at
                                    // least PLAN_OP_FLOOR_S (src/plan_price.h)
} plan_op;
#define PLAN_MAX_OPS 20
#define PLAN_GEMM_RATE_FP8 8.0   // plan_op.rate of an FP8 GEMM (--fp8)

// one line of the memory table: a buffer (or a group of equal buffers) of one category
#define PLAN_MAX_ITEMS 48
typedef struct {
    mem_category cat;
    size_t bytes;
    const char *what;
} plan_item;

typedef struct {
    plan_request req;
    int replica_size;               // R = W / S
    int accum;                      // micro-batches per rank per optimizer step
    // parameter layout, as param_layout_init pads it (fsdp_pad_multiple: 16 S)
    size_t n_params;                // real parameters
    size_t n_trainable;             // = n_params, or the LoRA adapters' parameter count
    size_t trained_layer_numel, trained_root_numel, trained_padded_total;   // the trained state's
                                    // padded units: the model's, or with LoRA the adapters'
                                    // (gradients, reduce-scatters, the optimizer)
    size_t layer_numel, root_numel; // padded unit sizes
    size_t padded_total;            // L x layer + root
    size_t n_local;                 // elements of this rank's slice of all units
    int grad_mode;                  // fsdp_grad_mode the trainer runs with (see "room" below)
    // NCCL communicators of a GPU rank (elem_bytes 2, W > 1; src/launch.c): the world group,
    // the shard and replica groups where they are neither the world nor one rank, and the
    // shard group's reduce-scatter lane (S > 1). Outside the tracker; created before the
    // device arena, and counted in the fit check at nccl_comm_bytes each
    int nccl_comms;
    size_t nccl_comm_bytes;         // req.nccl_comm_bytes, or PLAN_NCCL_COMM_BYTES when that is 0
    size_t nccl_bytes;              // nccl_comms x nccl_comm_bytes

    // memory per rank (bytes)
    size_t bytes[MEM_CATEGORY_COUNT];
    size_t total;                   // device bytes: peak of the sum (= the sum: nothing is freed
                                    // early) of every category but MEM_HOST (bytes[MEM_HOST])
    size_t sample_bytes;            // the inference model --sample_tokens builds after training
                                    // beside the training buffers (sampler_continue); not in total
    int sample_alloc_seq;           // its length: sample_seq padded to the GPU's bucket
    size_t fp8_bytes;               // --fp8: the FP8 scratch (in bytes[MEM_WORKSPACE] and total);
                                    // the trainer reserves it at setup (fp8_linear_reserve)
    plan_item items[PLAN_MAX_ITEMS];
    int n_items;

    // one optimizer step, per rank (tokens at the full seq_len: an upper bound, since runs
    // trim each micro-batch to its longest row)
    double tokens;                  // accum x B x T
    double model_flops;             // model_flops_per_token (training; LoRA counts the frozen base 4x) or
                                    // model_forward_flops_per_token (--eval_only), x tokens
    double exec_flops;              // the FLOPs of ops[] (recompute, this build's attention backward)
    double launches;                // the device operations of ops[] (tests/test_plan.sh compares
                                    // them with the emulated device's count)
    size_t all_gather_bytes;        // sent by this rank (ring), as the comm counters record
    size_t reduce_scatter_bytes;
    size_t root_all_gather_bytes;   // the root unit's share of the two above (blocking in fsdp.c)
    size_t root_reduce_scatter_bytes;
    size_t all_reduce_bytes;        // gradient all-reduce across replicas (scalars not counted)
    double optimizer_hbm_bytes;     // AdamW reads and writes over this rank's slice
    double offload_host_bytes;      // --offload_optimizer: host memory traffic of the host AdamW
    double offload_d2h_bytes, offload_h2d_bytes;   // and PCIe bytes each way (0 without)
    plan_op ops[PLAN_MAX_OPS];      // the step's ops for the time estimate (plan_ops_compute)
    int n_ops;
} plan;

// Check the process grid: W >= 1 and S divides W. 0, or -1 with ft_error naming --dp_shard.
int plan_validate_grid(int world_size, int shard_size);
// Check the whole request: the grid, positive sizes, B x W divides the total batch, seq_len
// within max_position_embeddings, element size 2 or 4, on a GPU with `--attention native` a
// head_dim the native kernels take (ATTN_NATIVE_MAX_HEAD_DIM), the LoRA rank and targets (lora.h). 0, or -1 with ft_error naming the
// flag: the one set of job checks (and messages) of both training and --dry_run.
int plan_validate(const llama_config *cfg, const plan_request *req);

// Compute the plan for `cfg` and `req` (validated first, plan_validate). 0 or -1.
// It also chooses how gradients travel (p->grad_mode, which the trainer passes to fsdp_init):
// --accumulate_grads_locally = FSDP_GRADS_LOCAL; else, with S > 1 and more than one
// micro-batch per step, FSDP_GRADS_ROOT_ONCE; otherwise FSDP_GRADS_PER_MICRO_BATCH. "Room"
// for the root's fp32 gradient sum is always there: it lives in the fp32 checkpoint gather
// buffer (one largest unit, at least the root), which is idle during a step, so the memory
// plan is the same in every mode (the report names the buffer's second use). The gathered
// root is kept across micro-batches in its own buffer, which every S > 1 plan has anyway.
// The choice depends only on the request, so --dry_run, the arena's size and the trainer agree.
int plan_compute(plan *p, const llama_config *cfg, const plan_request *req);

// ----------------------------------------------------------------------------
// devices for the step-time estimate and the fit check

// plan_device and plan_devices[]: src/plan_price.h

// What a GPU rank allocates for a plan: one device arena of the planned bytes, the inference
// model of --sample_tokens (p->sample_bytes) and a margin of 1% + 256 MiB for what the plan
// does not see (kernel scratch such as the RMSNorm backward's partial sums, 2 MiB at 8192 x
// 4096; 256-byte alignment of a few hundred buffers; src/launch.c sizes the arena with this).
// It was 5% + 512 MiB with the inference model inside: 2.25 GiB on a 35 GiB plan, which put
// the first H200 run (2026-11-26) 9% above PyTorch's peak memory on the same job.
// Outside the arena the device holds the CUDA context and the libraries' handles and modules
// (cuBLASLt, cuDNN and its runtime-compiled engines; about 0.5 GiB on the H200 run):
// PLAN_CONTEXT_BYTES, an assumption; and p's NCCL communicators, p->nccl_comm_bytes each:
// --nccl_gib_per_comm, else PLAN_NCCL_COMM_BYTES, the one figure measured: on one H100
// (2026-11-26, docs/results/2026-11-26-h100.md) make test-gpu's one-rank job took 1.96 GiB
// for its two communicators, 0.98 GiB each, with NCCL_RUNTIME_CONNECT=0 (comm_nccl.c:
// everything allocated at init). Assumed, not measured: the same for more ranks. NCCL's
// buffers scale with its channels and connections, not with the group's size beyond a node
// or two (NCCL issue 986): 544-688 MB per group were reported on 4 x A100 NVLink (issue 964).
// NVLS (NVLink SHARP, NVSwitch nodes: H100/H200 SXM x 8; on by default where supported) adds
// its multicast buffers: about 1.6 GB for one communicator and 6 GB for three (issue 864);
// NCCL_NVLS_ENABLE=0 avoids them (what NVLS gains for this trainer's collectives is
// unmeasured), else plan with --nccl_gib_per_comm 2. A GPU rank of several has 1-4
// communicators (plan_nccl_comms; it counts the shard group's reduce-scatter lane, which
// NCCL before 2.26 does not get: comm_nccl.c's one-lane mode). A plan fits a device when its
// arena fits what is left: the test the CUDA backend makes at startup (arena <=
// cudaMemGetInfo's free bytes), with the context's and NCCL's shares assumed, so --dry_run's
// "fits" and "largest batch" are what a real run accepts as far as those two assumptions
// hold (tests/test_plan.sh checks that edge on the emulated device, its NCCL holding back the
// planned bytes).
#define PLAN_CONTEXT_BYTES ((size_t)1 << 30)
#define PLAN_NCCL_COMM_BYTES ((size_t)1004 << 20)   // 0.98 GiB
#define PLAN_ARENA_MARGIN_FIXED ((size_t)256 << 20)
#define PLAN_ARENA_MARGIN_DIVISOR 100
size_t plan_arena_bytes(const plan *p);
int plan_fits(const plan *p, const plan_device *d);
// The largest planned total that fits d beside p's NCCL communicators (plan_fits's edge).
size_t plan_device_budget(const plan *p, const plan_device *d);
// The device the "fits an 80 GB GPU" check uses: the H100 80GB, the smaller of the two 80 GB
// cards as CUDA reports them (81559 MiB; the A100 80GB: 81920 MiB).
#define PLAN_FIT_DEVICE (&plan_devices[1])

// --offload_optimizer: p's host bytes (bytes[MEM_HOST]) times ranks_on_node, pinned, must fit in
// the host memory this job may use (the smaller of the machine's and the job's cgroup limit,
// less 10% for the rest of the processes; FT_HOST_MEMORY_BYTES replaces that figure, taken as
// is). Nothing to check without host bytes, or when the limit is unknown. 0, or -1 with
// ft_error naming the flag and both figures.
int plan_check_host_memory(const plan *p, int ranks_on_node);

// ----------------------------------------------------------------------------
// the step-time estimate (src/plan_time.c)

typedef struct {
    double class_s[PLAN_OP_CLASS_COUNT];  // the ops of each class
    double comm_exposed_s;          // collective time not hidden behind compute
    double offload_s;               // --offload_optimizer: host AdamW and PCIe copies (pipelined:
                                    // the longer of the two), after the backward
    double total_s;                 // sum of class_s + comm_exposed_s + offload_s
    double comm_hidden_s;           // collective time overlapped with layer compute
    double link_s;                  // all collective bytes over the link: exposed + hidden
    double mfu;                     // model_flops / (total_s x peak_flops)
} plan_step_time;

// Fill p->ops (and p->exec_flops, p->launches): the model's ops of a micro-batch as the model
// code issues them, counted over a backend that only counts (src/backend_count.h), priced per
// op class, and the step's gradient and optimizer traffic from p's bytes; plan_compute calls it
// last. 0, or -1 with ft_error.
int plan_ops_compute(plan *p, const llama_config *cfg);
// Name of an op class as the report prints it ("gemm", "attention", "simt", "memory").
const char *plan_op_class_name(plan_op_class k);
// Seconds of op `o` on device `d` at its class's rate.
double plan_op_seconds(const plan_op *o, const plan_device *d);
// Estimated times of one optimizer step of `p` on `d`, per class, into *t.
void plan_estimate_step_time(const plan *p, const plan_device *d, plan_step_time *t);
// Print the step-time part of the --dry_run report: the ops, the per-class table per device,
// tokens/s and predicted MFU, all labelled as estimates.
void plan_print_step_time(FILE *out, const plan *p);
// Print the timeline part of the --dry_run report (src/plan_timeline.c, plan_timeline.h):
// every device's step on the program's schedule beside the per-phase estimate, its exposed
// communication per phase and binding lane, the fabric it assumed. Nothing for --eval_only.
void plan_tl_print(FILE *out, const plan *p);

// Largest batch_size_per_device in [1, max_batch] whose plan fits `budget` bytes, with the
// other fields of `req`; `dividing` = 1 also requires B x W to divide the total batch.
// 0 when even B = 1 does not fit.
int plan_find_max_batch(const llama_config *cfg, const plan_request *req, size_t budget, int dividing,
                        int max_batch);

// ----------------------------------------------------------------------------
// the report

// Print the --dry_run report: memory per rank by category (bytes and GiB; one line per
// category starts with its mem_category_name and the byte count, for scripts), whether it
// fits an 80 GB GPU, the largest batch per device with and without checkpointing, and the
// roofline step time on each device. `model_dir` and `device` are only printed.
void plan_print_report(FILE *out, const plan *p, const llama_config *cfg, const char *model_dir,
                       const char *device, int max_batch);
