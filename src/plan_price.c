// plan_price.c: the devices' peaks and the prices of device work (see plan_price.h).
#include "plan_price.h"

#include <math.h>
#include <strings.h>
#include <string.h>

// ----------------------------------------------------------------------------
// devices
//
// Peak dense bf16 rates and HBM bandwidths from the NVIDIA A100, H100 and H200 (SXM)
// datasheets, as torchtitan uses for MFU (312e12, 989e12; the H200 is the same GH100 die at
// 4.8 TB/s). NVLink: 600 GB/s (A100, NVLink 3) and 900 GB/s (H100/H200, NVLink 4) per GPU in
// both directions together, i.e. 300 / 450 GB/s each way, which is what a ring collective's
// bytes sent per rank move over. Across nodes: one InfiniBand NIC per GPU, HDR 200 Gb/s (25
// GB/s) on A100 systems, NDR 400 Gb/s (50 GB/s) on H100/H200 systems; 8 GPUs per node. fp32
// SIMT peak, SM count and boost clock (the SIMT kernels' rate, src/plan_time.c): 19.5e12, 108,
// 1.41 GHz (A100); 67e12, 132, 1.98 GHz (H100, H200). Memory: the total CUDA reports
// (nvidia-smi): 81920 MiB (A100 80GB), 81559 MiB (H100 80GB HBM3: 79.65 GiB, not 80), 141 GB
// on the H200; of it the fit check leaves PLAN_CONTEXT_BYTES and nccl_comm_bytes per NCCL
// communicator (--nccl_gib_per_comm, else PLAN_NCCL_COMM_BYTES) outside the arena (plan.h).
// Dense FP8 (E4M3/E5M2): 1979e12 on the H100 and H200 (twice bf16, the same datasheets); the
// A100 has none.

const plan_device plan_devices[] = {
    {"A100-SXM4-80GB", 312e12, 2.0e12, 300e9, 25e9, 8, (size_t)81920 << 20, 19.5e12, 108, 1.41e9, 0},
    {"H100-SXM5-80GB", 989e12, 3.35e12, 450e9, 50e9, 8, (size_t)81559 << 20, 67e12, 132, 1.98e9, 1979e12},
    {"H200-SXM-141GB", 989e12, 4.8e12, 450e9, 50e9, 8, (size_t)141000000000, 67e12, 132, 1.98e9, 1979e12},
};
const int plan_n_devices = (int)(sizeof plan_devices / sizeof plan_devices[0]);

const plan_device *plan_device_find(const char *name) {
    const plan_device *found = NULL;
    const size_t n = name ? strlen(name) : 0;
    if (n == 0) return NULL;
    for (int i = 0; i < plan_n_devices; i++) {
        const char *s = plan_devices[i].name;
        for (; *s; s++)
            if (strncasecmp(s, name, n) == 0) break;
        if (!*s) continue;
        if (found) return NULL;   // ambiguous
        found = &plan_devices[i];
    }
    return found;
}

// ----------------------------------------------------------------------------
// prices

double plan_price_tensor(const plan_device *d, double flops, double fraction) { return flops / (fraction * d->peak_flops); }

double plan_price_gemm(const plan_device *d, double flops) { return plan_price_tensor(d, flops, PLAN_GEMM_FRACTION); }
double plan_price_gemm_fp8(const plan_device *d, double flops) {
    if (d->fp8_flops <= 0) return plan_price_gemm(d, flops);
    return flops / (PLAN_GEMM_FRACTION * d->fp8_flops);
}

double plan_price_attention(const plan_device *d, double flops, int cudnn) {
    return plan_price_tensor(d, flops, cudnn ? PLAN_ATTN_CUDNN_FRACTION : PLAN_ATTN_NATIVE_FRACTION);
}

double plan_price_simt(const plan_device *d, double flops, double flop_per_sm_clk) {
    const double rate = flop_per_sm_clk * d->sm_count * d->clock_hz;
    return flops / (rate < d->fp32_flops ? rate : d->fp32_flops);
}

double plan_price_memory(const plan_device *d, double bytes) { return bytes / (PLAN_HBM_FRACTION * d->hbm_bytes_per_s); }

double plan_price_pcie(double bytes) { return bytes / PLAN_PCIE_BYTES_PER_S; }

double plan_price_host_memory(double bytes) { return bytes / PLAN_HOST_BYTES_PER_S; }

double plan_price_link_bytes_per_s(const plan_device *d, int cross_node) {
    return cross_node ? d->internode_bytes_per_s : d->nvlink_bytes_per_s;
}

double plan_price_busbw(const plan_device *d, int cross_node) {
    return (cross_node ? PLAN_BUSBW_INTER_FRACTION : PLAN_BUSBW_INTRA_FRACTION) * plan_price_link_bytes_per_s(d, cross_node);
}

int plan_group_nodes(int first, int stride, int n, int gpus_per_node) {
    if (n <= 1 || gpus_per_node <= 0) return 1;
    int nodes = 1;   // members' nodes never decrease along the group (stride >= 0): count changes
    for (int k = 1, prev = first / gpus_per_node; k < n; k++) {
        const int node = (first + k * stride) / gpus_per_node;
        if (node != prev) nodes++, prev = node;
    }
    return nodes;
}

double plan_price_collective_latency(plan_coll_kind kind, int n, int nodes) {
    if (n <= 1) return 0;
    if (nodes < 1) nodes = 1;
    if (nodes > n) nodes = n;
    const double per = kind == PLAN_COLL_ALL_REDUCE ? 2.0 : 1.0;   // ring passes
    const double steps = per * (n - 1), net = per * (nodes - 1);
    return PLAN_COLL_BASE_LATENCY_S + (steps - net) * PLAN_COLL_STEP_NVLINK_S + net * PLAN_COLL_STEP_NET_S;
}

double plan_price_collective_at(plan_coll_kind kind, double bytes, int n, int nodes, double busbw) {
    if (n <= 1) return 0;
    double sent = (n - 1) * bytes;
    if (kind == PLAN_COLL_ALL_REDUCE) sent = 2.0 * (n - 1) * bytes / n;
    if (kind == PLAN_COLL_BROADCAST) sent = bytes;
    return sent / busbw + plan_price_collective_latency(kind, n, nodes);
}

double plan_price_collective(const plan_device *d, plan_coll_kind kind, double bytes, int n, int nodes) {
    return plan_price_collective_at(kind, bytes, n, nodes, plan_price_busbw(d, nodes > 1));
}

double plan_price_op(double work_s, double ops) { return fmax(work_s, ops * PLAN_OP_FLOOR_S); }
