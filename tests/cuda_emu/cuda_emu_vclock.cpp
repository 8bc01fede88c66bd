// cuda_emu_vclock.cpp: the virtual clock's prices (FT_EMU_VCLOCK=<device>; README.md, "Virtual
// clock"). Every operation the emulated runtime queues advances its stream's virtual time by
// what it would cost on that device, priced by src/plan_price.c, the functions the step-time
// estimate uses; the timekeeping itself (streams, events, host syncs) is in cuda_emu_stream.cpp
// and the collectives' agreement across ranks in cuda_emu_host.cpp.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_emu_async.h"

namespace cuemu {

namespace {

const plan_device *g_device;
int g_gpus_per_node;
double g_issue_s;
double g_busbw[2];   // within a node, across nodes (bytes/s)

// A bus bandwidth variable's value `v` in GB/s when set and positive, else `dflt` (bytes/s).
double busbw_env(const char *v, double dflt) { return v && *v && atof(v) > 0 ? 1e9 * atof(v) : dflt; }

void vclock_init() {
    const char *name = getenv("FT_EMU_VCLOCK");
    if (!name || !*name || (name[0] == '0' && !name[1])) return;
    g_device = plan_device_find(name);
    if (!g_device) {
        fprintf(stderr, "cuda_emu: FT_EMU_VCLOCK=%s names no single device of src/plan_price.c (", name);
        for (int i = 0; i < plan_n_devices; i++) fprintf(stderr, "%s%s", i ? ", " : "", plan_devices[i].name);
        fprintf(stderr, "): the virtual clock is off\n");
        return;
    }
    const char *g = getenv("FT_EMU_VCLOCK_GPUS_PER_NODE");
    g_gpus_per_node = g && atoi(g) > 0 ? atoi(g) : g_device->gpus_per_node;
    const char *us = getenv("FT_EMU_VCLOCK_ISSUE_US");
    g_issue_s = us && *us && atof(us) >= 0 ? 1e-6 * atof(us) : PLAN_OP_FLOOR_S;
    g_busbw[0] = busbw_env(getenv("FT_EMU_VCLOCK_INTRA_GBPS"), plan_price_busbw(g_device, 0));
    g_busbw[1] = busbw_env(getenv("FT_EMU_VCLOCK_INTER_GBPS"), plan_price_busbw(g_device, 1));
}

} // namespace

const plan_device *vclock_device() {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, vclock_init);
    return g_device;
}

int vclock_gpus_per_node() { return vclock_device() ? g_gpus_per_node : 0; }

void vclock_announce() {
    const plan_device *d = vclock_device();
    if (!d) return;
    printf("cuda_emu: virtual clock on (FT_EMU_VCLOCK): %s prices from src/plan_price.c, %.1f us per issued "
           "operation on the host, %d GPUs per node, collectives at %.3g / %.3g GB/s bus bandwidth within / across "
           "nodes\n", d->name, 1e6 * vclock_issue_s(), g_gpus_per_node, g_busbw[0] / 1e9, g_busbw[1] / 1e9);
    if (!async_on()) printf("cuda_emu: the virtual clock needs the asynchronous streams: off under FT_EMU_SYNC=1\n");
}

// The host's cost of one cudaLaunchKernel / cublasLtMatmul / copy / collective call: the
// per-operation floor, which was measured as the issue-bound rate of one host thread
// (plan_price.h), unless FT_EMU_VCLOCK_ISSUE_US says otherwise (0: a host that is never the
// bottleneck, to see the device's schedule alone).
double vclock_issue_s() { return vclock_device() ? g_issue_s : 0; }

double vclock_price_kernel(double bytes) {
    const plan_device *d = vclock_device();
    return d ? plan_price_op(plan_price_memory(d, bytes), 1) : 0;
}

double vclock_price_gemm(double m, double n, double k) {
    const plan_device *d = vclock_device();
    return d ? plan_price_op(plan_price_gemm(d, 2 * m * n * k), 1) : 0;
}

double vclock_price_attention(double flops) {
    const plan_device *d = vclock_device();
    return d ? plan_price_op(plan_price_attention(d, flops, 1), 1) : 0;
}

double vclock_price_copy(double bytes, bool pcie) {
    const plan_device *d = vclock_device();
    if (!d) return 0;
    return pcie ? plan_price_pcie(bytes) : plan_price_memory(d, 2 * bytes);   // (read and written)
}

double vclock_price_collective(int kind, double bytes, int n, int nodes) {
    const plan_device *d = vclock_device();
    return d ? plan_price_collective_at((plan_coll_kind)kind, bytes, n, nodes, g_busbw[nodes > 1 ? 1 : 0]) : 0;
}

} // namespace cuemu
