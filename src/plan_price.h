// plan_price.h: the prices of device work on a GPU model: one small set of pure functions that
// the --dry_run estimate (src/plan_time.c), the schedule estimate and the CUDA emulator's
// virtual clock (tests/cuda_emu/cuda_emu_vclock.cpp, FT_EMU_VCLOCK) share, so that a time the
// emulator's clock produces and the estimate differ only by the schedule, never by a rate.
// Every function returns seconds and depends only on its arguments (no state, no I/O).
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// ----------------------------------------------------------------------------
// devices (the table: src/plan_price.c)

typedef struct {
    const char *name;
    double peak_flops;              // dense bf16 FLOP/s (tensor cores)
    double hbm_bytes_per_s;
    double nvlink_bytes_per_s;      // per GPU, per direction
    double internode_bytes_per_s;   // per GPU, when a group spans nodes
    int gpus_per_node;
    size_t memory_bytes;
    double fp32_flops;              // fp32 SIMT peak FLOP/s
    int sm_count;
    double clock_hz;                // boost clock
    double fp8_flops;               // dense FP8 FLOP/s (tensor cores); 0: none (--fp8 refused)
} plan_device;

extern const plan_device plan_devices[];
extern const int plan_n_devices;

// The device whose name contains `name`, case-insensitively ("h100", "H200-SXM"); NULL when
// none or more than one does.
const plan_device *plan_device_find(const char *name);

// ----------------------------------------------------------------------------
// rates (fractions of the device peaks in plan_devices)

// cuBLASLt bf16 GEMMs (and any op moved onto them): MEASURED on one H200 (2026-11-26,
// scripts/bench_gpu.py --profile_finetune, CodeLlama-7b width, 8 layers, seq 512): the
// forward projections ran at 0.72-0.75 of the 989 TFLOP/s peak, their dX + dW at 0.67-0.69,
// the lm_head's three GEMMs at 0.58-0.65; all of a step's GEMM FLOPs over their time 0.69 at
// batch 4 and at batch 16. 0.69 for the H100 too (the same chip and clocks) and the A100 (an
// assumption: not measured). It was 0.55, the GPU review's estimate, before any GPU ran this.
#define PLAN_GEMM_FRACTION 0.69
// Attention, by the path this build takes (assumptions, stated; the one H200 measurement,
// 2026-11-26, profiled per op at seq 512, put the cuDNN graph at 0.16-0.25 of peak, forward and
// backward, 7B width at batch 4 and 16: under 3% of that step, so the estimate was kept):
// - cuDNN (--attention cudnn, the default on a GPU): the FlashAttention-3 paper's H100 SXM5
//   charts show cuDNN's fused SDPA forward at head dim 128 reaching about 0.5-0.6 of the
//   989 TFLOP/s peak at seq 512-2k. Our graph (src/attention_cudnn_graph.c) is built from
//   generic matmul / pointwise / reduction ops, not the fused SDPA node, and whether cuDNN
//   fuses it as well is unknown: half of that, 0.25.
// - native (--attention native, or the fallback): kernels/attention.cu, wmma tiles, forward
//   and a FlashAttention-2 style backward (5 products). FlashAttention-2 itself runs at about
//   0.3 of an H100's peak (same charts); ours has no cp.async pipelining and sends dS through
//   HBM: a third of that, 0.10.
// - native with head_dim not a multiple of 16: the SIMT kernels, bound by shared-memory loads per SM
//   per clock (review H2): 16 x 16 fp32 tiles with bank conflicts, "about 3-5 TF" on an
//   H100 (132 SMs x 1.98 GHz): 15 FLOP/clk/SM = 3.9 TFLOP/s, forward and backward alike.
#define PLAN_ATTN_CUDNN_FRACTION 0.25
#define PLAN_ATTN_NATIVE_FRACTION 0.10
#define PLAN_SIMT_ATTN_FLOP_PER_SM_CLK 15.0
// Backward FLOPs per forward FLOP: the tensor-core paths recompute S = Q K^T and form dV, dP,
// dQ, dK (5 products of the forward's 2: 2.5); the SIMT backward forms 7 (3.5).
#define PLAN_ATTN_BWD_TC 2.5
#define PLAN_ATTN_BWD_SIMT 3.5
// Memory-bound kernels: REFERENCE.md section 7 reads ~3.0 TB/s for a device copy on the lent
// H100 (3.35 peak) and ~4.3 on the H200 (4.8): 0.9 of peak, the best a copy does; ours are
// not faster than a copy, so this part is optimistic.
#define PLAN_HBM_FRACTION 0.9
// --offload_optimizer (assumptions, no measurement): host memory bandwidth per rank 50 GB/s, a
// STREAM-like 0.7 of a dual-socket DDR5-4800 node (2 x 8 channels x 38.4 GB/s = 614 GB/s)
// shared by 8 GPUs (77 GB/s each at peak), rounded down; PCIe Gen5 x16 at 50 GB/s per
// direction (0.8 of 64 GB/s). The copies run behind the host AdamW (src/fsdp.c offload
// pipeline), so the longer of host and PCIe time counts; both directions share one copy stream
// (src/backend_cuda.c), so they do not overlap each other: the PCIe time is their sum.
#define PLAN_HOST_BYTES_PER_S 50e9
#define PLAN_PCIE_BYTES_PER_S 50e9
// Every device operation (kernel, cuBLASLt GEMM, cuDNN graph execution, memset) takes at least
// PLAN_OP_FLOOR_S: one CPU thread issues the step's operations in order, and a
// cudaLaunchKernel / cublasLtMatmul call costs the host microseconds, so a model whose kernels
// are shorter than that runs at the issue rate, not at its FLOP or byte rate. An op class's
// time is the larger of its work and its operations x 8 us. MEASURED on one H200 machine
// (2026-11-26): the bundled model at batch 16 x 512 issues 184 operations per step and took
// 1.5 ms per step, 8.2 us each (the estimate was 0.77 ms with 4 us, an assumption before).
// This only matters for small models; for 7B each op is milliseconds.
#define PLAN_OP_FLOOR_S 8e-6
// Collective latency (an assumption: no NCCL run measured here): NCCL's own tuning model
// (github.com/NVIDIA/nccl src/graph/tuning.cc, ncclTopoTuneModel, as read at commit 01afd20;
// later releases may refine it), for the ring algorithm and Simple protocol, charges a base
// latency of 8.4 us per collective plus a latency per ring step: 3.4 us over NVLink
// (hwLat[NVLINK][RING][SIMPLE]), 14 us over the network (hwLat[NET][RING][SIMPLE]). A ring of n
// ranks over N nodes takes n - 1 steps for an all-gather or reduce-scatter, of which N - 1 cross
// a node boundary (nInterSteps), 2 (n - 1) for an all-reduce, of which 2 (N - 1); the other
// steps are NVLink steps. (A broadcast is taken as n - 1 steps, N - 1 across, like a gather.)
// Not modelled: NCCL's x1.9 "plateau" on multi-node all-reduce latency above a size, and the
// tree algorithm it may pick for small all-reduces.
#define PLAN_COLL_BASE_LATENCY_S 8.4e-6
#define PLAN_COLL_STEP_NVLINK_S 3.4e-6
#define PLAN_COLL_STEP_NET_S 14e-6
// The bus bandwidth a collective reaches by default (nccl-tests' busbw: bytes sent per rank per
// second), as fractions of plan_devices' link peaks (per GPU, per direction); a measured
// fabric (--fabric_intra_gbps / --fabric_inter_gbps, FT_EMU_VCLOCK_INTRA_GBPS / _INTER_GBPS)
// replaces them:
// - within a node (NVLink through NVSwitch): 0.8. NVIDIA's p2pBandwidthLatencyTest reached
//   380 GB/s of the 450 per direction between two H100 SXM (github.com/NVIDIA/nccl/issues/1264,
//   0.84); the GPU review estimated 360 GB/s for an all-gather
//   (../shared/reviews/gpu-review-8a0bfb2.md): 0.8, without NVLink SHARP (all-reduce only).
// - across nodes (InfiniBand, one NIC per GPU): 0.92. An NVIDIA engineer gives 46-48 GB/s per
//   NDR 400 Gb/s NIC for nccl-tests' busbw (github.com/NVIDIA/nccl-tests/issues/290): 46 of 50.
#define PLAN_BUSBW_INTRA_FRACTION 0.8
#define PLAN_BUSBW_INTER_FRACTION 0.92

typedef enum { PLAN_COLL_ALL_GATHER, PLAN_COLL_REDUCE_SCATTER, PLAN_COLL_ALL_REDUCE, PLAN_COLL_BROADCAST } plan_coll_kind;

// ----------------------------------------------------------------------------
// prices (seconds; work only, the per-operation floor is plan_price_op's)

// `flops` on the tensor cores at `fraction` of d's peak bf16 rate.
double plan_price_tensor(const plan_device *d, double flops, double fraction);
// A cuBLASLt GEMM's `flops` (2 m n k) at PLAN_GEMM_FRACTION of the peak.
double plan_price_gemm(const plan_device *d, double flops);
// An FP8 cuBLASLt GEMM's `flops` (--fp8) at PLAN_GEMM_FRACTION of d's FP8 peak (assumed: the
// fraction was measured on bf16 GEMMs only); at the bf16 GEMM's price on a device without FP8.
double plan_price_gemm_fp8(const plan_device *d, double flops);
// Attention `flops` on the tensor cores: the cuDNN graph (cudnn != 0) or the native wmma kernels.
double plan_price_attention(const plan_device *d, double flops, int cudnn);
// fp32 SIMT `flops` at `flop_per_sm_clk` per SM per clock, at most the fp32 peak.
double plan_price_simt(const plan_device *d, double flops, double flop_per_sm_clk);
// `bytes` of HBM traffic (read + written) at PLAN_HBM_FRACTION of d's bandwidth.
double plan_price_memory(const plan_device *d, double bytes);
// `bytes` over PCIe (one direction; host <-> device copies).
double plan_price_pcie(double bytes);
// `bytes` of host memory traffic (the offloaded optimizer's host AdamW).
double plan_price_host_memory(double bytes);
// The link a group's collectives run over: NVLink, or the per-GPU network across nodes.
double plan_price_link_bytes_per_s(const plan_device *d, int cross_node);
// The default bus bandwidth of a group's collectives (PLAN_BUSBW_*_FRACTION of the link).
double plan_price_busbw(const plan_device *d, int cross_node);
// The nodes a group of n ranks spans when its members are world ranks first, first + stride,
// ..., first + (n - 1) stride and each node holds gpus_per_node consecutive ranks (node =
// rank / gpus_per_node): a shard group is consecutive ranks (stride 1), a replica group one rank
// of each shard group (stride the shard size). 1 for n <= 1 or gpus_per_node <= 0.
int plan_group_nodes(int first, int stride, int n, int gpus_per_node);
// The latency of one ring collective of an n-rank group spanning `nodes` nodes (PLAN_COLL_*:
// the base, and per ring step NVLink's or, on the steps that cross nodes, the network's); 0 for
// n <= 1.
double plan_price_collective_latency(plan_coll_kind kind, int n, int nodes);
// One ring collective of an n-rank group over `nodes` nodes at bus bandwidth `busbw`: `bytes`
// is NCCL's per-rank buffer (all-gather: the send buffer; reduce-scatter: the receive buffer;
// all-reduce and broadcast: the buffer); the bytes a rank sends ((n - 1) x bytes; all-reduce
// 2 (n - 1) / n x bytes; broadcast bytes) over busbw, plus the latency. 0 for n <= 1. The
// step-time timeline (src/plan_timeline.c) and the emulator's virtual clock both price
// collectives here.
double plan_price_collective_at(plan_coll_kind kind, double bytes, int n, int nodes, double busbw);
// plan_price_collective_at with d's default bus bandwidth (plan_price_busbw: across nodes when
// nodes > 1).
double plan_price_collective(const plan_device *d, plan_coll_kind kind, double bytes, int n, int nodes);
// A device operation's time: its work, but at least PLAN_OP_FLOOR_S per operation.
double plan_price_op(double work_s, double ops);

#ifdef __cplusplus
}
#endif
