// cuda_emu_host.cpp: the rest of the CUDA host API the CUDA backend calls, on the CPU, so
// that src/backend_cuda.c, compiled unchanged against the real CUDA headers, runs the whole
// training loop with the emulated kernels (build/tests/finetune_emu; tests/test_cuda_emu_train.sh).
//
// What is here, and how faithful:
//   - device queries: one emulated device, "sm_80", 8 GiB; FT_EMU_DEVICES=0 emulates a
//     machine without a device (cudaErrorNoDevice), to test that path too,
//     FT_EMU_DEVICE_NAME sets the device name, FT_EMU_COMPUTE_CAPABILITY ("7.5", "10.0") its
//     architecture and FT_EMU_MEMORY_MIB its memory, for the bad-input tests
//     (tests/test_cuda_bad_input.sh). Free memory (cudaMemGetInfo) is all of it less
//     FT_EMU_CONTEXT_MIB (what a CUDA context and the libraries would hold; default 0) and
//     less FT_EMU_NCCL_COMM_BYTES for each live emulated NCCL communicator (default 0): the
//     memory plan's fit edge against the startup check (tests/test_plan.sh); allocations
//     themselves are not subtracted
//   - streams and events: cuda_emu_stream.cpp. Linking this file makes the runtime
//     asynchronous by default (each stream a queue with its own worker; the ordering checker
//     of cuda_emu_shadow.cpp reports hazards; FT_EMU_SYNC=1 runs everything synchronously)
//   - cuBLASLt: descriptors hold what cublasLtMatmul needs (types, transposes, layouts), and
//     cublasLtMatmul computes D = alpha op(A) op(B) + beta C from the documented column-major
//     definition (element (i, j) of a rows x cols layout with leading dimension ld is at
//     i + j * ld; op(X) = X or X^T), with fp32 accumulation and bf16/fp32 storage. FP8 A and B
//     (CUDA_R_8F_E4M3 / _E5M2, not both E5M2; a device of compute capability 8.9 or newer,
//     FT_EMU_COMPUTE_CAPABILITY) follow the Hopper FP8 rules: "TN" only (A
//     transposed, B not), lda and ldb multiples of 16 elements, A and B 16-byte aligned, else
//     the heuristic finds no algorithm and cublasLtMatmul returns NOT_SUPPORTED; the products
//     are exact and summed in fp32, then D = alpha * scaleA * scaleB * sum + beta C, scaleA /
//     scaleB read from the device pointers of CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER (1 when
//     unset) when the GEMM runs. The codes are decoded by cuda_fp8.h's conversions, not the
//     project's src/fp8.c, so the two check each other. CUBLASLT_MATMUL_DESC_FAST_ACCUM is
//     accepted and changes nothing here (fp32 sums always). It is
//     written from that definition, independently of how backend_cuda.c maps row-major
//     tensors onto it, so a wrong transpose or leading dimension there shows up as a wrong
//     loss in the training test. The heuristic's algorithm requires the pointer alignments
//     the preference allowed (cuBLASLt's default: 256 bytes), as a real one may, so a
//     backend that does not state its operands' real alignment fails here too.
//   - NCCL: over MPI when built with MPICH (collectives of the same meaning on host memory,
//     bf16 summed in fp32), so FSDP/DDP/HSDP with --device cuda run as emulated ranks under
//     mpiexec; without MPI every call fails with a clear status. A collective is queued on its
//     stream and its MPI call runs on that stream's worker (outside the device lock, so the
//     compute stream goes on meanwhile, as on a GPU); MPI_Init is wrapped (PMPI) to ask for
//     MPI_THREAD_MULTIPLE. cublasLtMatmul and the collectives are checked for ordering
//     hazards with their exact byte ranges. With the virtual clock (FT_EMU_VCLOCK) a
//     collective's ranks first agree on its start (the latest of theirs) over the same
//     communicator, and the matmuls and collectives carry their prices (src/plan_price.c).
//     A communicator's ncclConfig_t CTA bounds are checked and kept as NCCL does
//     (nccl_config_emu.h; FT_EMU_NCCL_CONFIG prints them).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "cuda_emu_async.h"
#include "nccl_config_emu.h"

// finetune_emu and test_backend_emu run the asynchronous runtime unless FT_EMU_SYNC=1
__attribute__((constructor)) static void emu_host_async_default() { cuemu::set_async_default(1); }

// ----------------------------------------------------------------------------
// runtime: devices, streams, events

static int emu_device_count() {
    const char *e = getenv("FT_EMU_DEVICES");
    return e ? atoi(e) : 1;
}
static size_t emu_memory_bytes() {
    const char *e = getenv("FT_EMU_MEMORY_MIB");
    return e ? (size_t)atoll(e) << 20 : (size_t)8 << 30;
}

extern "C" {

cudaError_t cudaGetDeviceCount(int *count) {
    *count = emu_device_count();
    return *count > 0 ? cudaSuccess : cudaErrorNoDevice;
}
static int g_current_device;   // cudaSetDevice's (the emulated NCCL's duplicate check reads it)
cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= emu_device_count()) return cudaErrorInvalidDevice;
    g_current_device = device;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *device) {
    *device = g_current_device;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    if (device < 0 || device >= emu_device_count()) return cudaErrorInvalidDevice;
    memset(prop, 0, sizeof *prop);
    // FT_EMU_DEVICE_NAME pretends to be a given GPU (tests of name-based lookups)
    // (with the virtual clock, FT_EMU_VCLOCK, the clock's device by default: the MFU denominator
    // is then that device's published peak)
    const char *name = getenv("FT_EMU_DEVICE_NAME");
    const plan_device *vd = cuemu::vclock_device();
    if (name) snprintf(prop->name, sizeof prop->name, "%s", name);
    else if (vd) snprintf(prop->name, sizeof prop->name, "CPU emulation (tests/cuda_emu) priced as %s", vd->name);
    else snprintf(prop->name, sizeof prop->name, "CPU emulation (tests/cuda_emu)");
    const char *cc = getenv("FT_EMU_COMPUTE_CAPABILITY");
    prop->major = 8;
    prop->minor = 0;
    if (cc && sscanf(cc, "%d.%d", &prop->major, &prop->minor) != 2) return cudaErrorInvalidValue;
    prop->totalGlobalMem = emu_memory_bytes();
    prop->multiProcessorCount = 1;
    prop->warpSize = 32;
    return cudaSuccess;
}
// versions and the PCI address (src/preflight.c's table): a CUDA 12.4 driver and runtime;
// a bus id per device index, as real GPUs have
cudaError_t cudaDriverGetVersion(int *v) { *v = 12040; return cudaSuccess; }
cudaError_t cudaRuntimeGetVersion(int *v) { *v = 12040; return cudaSuccess; }
cudaError_t cudaDeviceGetPCIBusId(char *bus, int len, int device) {
    if (device < 0 || device >= emu_device_count()) return cudaErrorInvalidDevice;
    snprintf(bus, (size_t)len, "0000:%02x:00.0", 0x10 + device);
    return cudaSuccess;
}
// cuBLASLt 12.4.5 as its version function encodes it (no library linked; cuDNN's version is the
// attention stand-in's, attn_engine_version)
size_t cublasLtGetVersion(void) { return 120405; }
static size_t emu_env_mib(const char *e) {   // an environment variable's value in MiB, as bytes
    return e ? (size_t)atoll(e) << 20 : 0;
}
static size_t emu_nccl_comm_bytes() {
    const char *e = getenv("FT_EMU_NCCL_COMM_BYTES");
    return e ? (size_t)atoll(e) : 0;
}
static std::atomic<int> g_nccl_live;   // emulated NCCL communicators not yet destroyed
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
    *total = emu_memory_bytes();
    const size_t held = emu_env_mib(getenv("FT_EMU_CONTEXT_MIB")) + (size_t)g_nccl_live.load() * emu_nccl_comm_bytes();
    *free_bytes = *total > held ? *total - held : 0;
    return cudaSuccess;
}

// ----------------------------------------------------------------------------
// cuBLASLt

struct cublasLtContext { int unused; };

// what the emulated descriptors hold, stored inside the headers' semi-opaque structs
struct emu_layout { cudaDataType type; uint64_t rows, cols; int64_t ld; };
struct emu_desc {
    cublasComputeType_t compute; cudaDataType_t scale; cublasOperation_t ta, tb;
    const float *a_scale, *b_scale;   // FP8 A / B scale factors (device pointers; NULL = 1)
    int8_t fast_accum;
};
// the minimum alignments a search may assume (the preference; cuBLASLt's default is 256 bytes
// each), which the emulated algorithm then requires of the A, B, C, D pointers, as a real
// algorithm chosen under them may
struct emu_align { uint32_t a, b, c, d; };
static_assert(sizeof(emu_align) <= sizeof(cublasLtMatmulPreferenceOpaque_t), "preference fits");
static_assert(sizeof(emu_align) <= sizeof(cublasLtMatmulAlgo_t), "algo fits");
static_assert(sizeof(emu_layout) <= sizeof(cublasLtMatrixLayoutOpaque_t), "layout fits");
static_assert(sizeof(emu_desc) <= sizeof(cublasLtMatmulDescOpaque_t), "desc fits");

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    *h = new cublasLtContext();
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
    if (ld < (int64_t)rows) return CUBLAS_STATUS_INVALID_VALUE;   // column-major: ld >= rows
    auto *o = new cublasLtMatrixLayoutOpaque_t();
    emu_layout v;
    memset(&v, 0, sizeof v);   // padding too: layouts are compared with memcmp (C == D in place)
    v.type = type, v.rows = rows, v.cols = cols, v.ld = ld;
    memcpy(o, &v, sizeof v);
    *l = o;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute, cudaDataType_t scale) {
    auto *o = new cublasLtMatmulDescOpaque_t();
    emu_desc v;
    memset(&v, 0, sizeof v);
    v.compute = compute, v.scale = scale, v.ta = v.tb = CUBLAS_OP_N;
    memcpy(o, &v, sizeof v);
    *d = o;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t n) {
    emu_desc v;
    memcpy(&v, d, sizeof v);
    void *field = attr == CUBLASLT_MATMUL_DESC_TRANSA ? (void *)&v.ta : attr == CUBLASLT_MATMUL_DESC_TRANSB ? (void *)&v.tb
                : attr == CUBLASLT_MATMUL_DESC_A_SCALE_POINTER ? (void *)&v.a_scale
                : attr == CUBLASLT_MATMUL_DESC_B_SCALE_POINTER ? (void *)&v.b_scale
                : attr == CUBLASLT_MATMUL_DESC_FAST_ACCUM ? (void *)&v.fast_accum : nullptr;
    const size_t want = attr == CUBLASLT_MATMUL_DESC_FAST_ACCUM ? sizeof(int8_t)
                      : attr == CUBLASLT_MATMUL_DESC_TRANSA || attr == CUBLASLT_MATMUL_DESC_TRANSB ? sizeof(cublasOperation_t)
                      : sizeof(void *);
    if (!field) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (n != want) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(field, buf, n);
    memcpy(d, &v, sizeof v);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    *p = new cublasLtMatmulPreferenceOpaque_t();
    emu_align def = {256, 256, 256, 256};
    memcpy(*p, &def, sizeof def);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t n) {
    emu_align al;
    memcpy(&al, p, sizeof al);
    uint32_t v = 0;
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
        if (n != sizeof v) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&v, buf, n);
        if (attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES) al.a = v;
        if (attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES) al.b = v;
        if (attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES) al.c = v;
        if (attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES) al.d = v;
        memcpy(p, &al, sizeof al);
        return CUBLAS_STATUS_SUCCESS;
    default:
        return CUBLAS_STATUS_SUCCESS;   // workspace size and the rest: nothing to emulate
    }
}

static bool is_fp8(cudaDataType t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }
static size_t elem_bytes(cudaDataType t) { return t == CUDA_R_32F ? 4 : is_fp8(t) ? 1 : 2; }

// The Hopper FP8 GEMM's rules (cuBLASLt's documented requirements for FP8 A/B): both A and B
// FP8, not both E5M2, A transposed and B not ("TN"), lda and ldb multiples of 16, A and B
// 16-byte aligned (`al`: what the pointers or the preference guarantee). Perhaps stricter than
// the library, to be safe on every GPU: C and D 16-byte aligned too (the weight gradient's FP8
// GEMM writes into a gradient buffer at an offset). true when the operands are not FP8 at all
// or meet these.
// The emulated device has FP8 tensor cores when FT_EMU_COMPUTE_CAPABILITY is 8.9 or newer
// (the default 8.0, an A100, has none: its cuBLASLt finds no FP8 algorithm).
static bool fp8_device() {
    const char *cc = getenv("FT_EMU_COMPUTE_CAPABILITY");
    int major = 8, minor = 0;
    if (cc && sscanf(cc, "%d.%d", &major, &minor) != 2) return false;
    return major * 10 + minor >= 89;
}
static bool fp8_rules_ok(const emu_desc &v, const emu_layout &la, const emu_layout &lb, const emu_align &al) {
    if (!is_fp8(la.type) && !is_fp8(lb.type)) return true;
    if (!is_fp8(la.type) || !is_fp8(lb.type) || !fp8_device()) return false;
    if (la.type == CUDA_R_8F_E5M2 && lb.type == CUDA_R_8F_E5M2) return false;
    if (v.ta != CUBLAS_OP_T || v.tb != CUBLAS_OP_N) return false;
    return la.ld % 16 == 0 && lb.ld % 16 == 0 && al.a % 16 == 0 && al.b % 16 == 0 && al.c % 16 == 0 &&
           al.d % 16 == 0;
}

// shape of op(X) for a layout and a transpose
static void op_shape(const emu_layout &l, cublasOperation_t t, uint64_t *r, uint64_t *c) {
    *r = t == CUBLAS_OP_N ? l.rows : l.cols;
    *c = t == CUBLAS_OP_N ? l.cols : l.rows;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t dd, cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int *found) {
    emu_desc v;
    emu_layout la, lb, lc, ld;
    memcpy(&v, d, sizeof v); memcpy(&la, a, sizeof la); memcpy(&lb, b, sizeof lb);
    memcpy(&lc, c, sizeof lc); memcpy(&ld, dd, sizeof ld);
    uint64_t m, k, k2, n;
    op_shape(la, v.ta, &m, &k);
    op_shape(lb, v.tb, &k2, &n);
    *found = 0;
    if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
    // like the library: inconsistent shapes have no algorithm
    if (k != k2 || lc.rows != m || lc.cols != n || ld.rows != m || ld.cols != n) return CUBLAS_STATUS_SUCCESS;
    emu_align al;
    memcpy(&al, pref, sizeof al);
    if (!fp8_rules_ok(v, la, lb, al)) return CUBLAS_STATUS_NOT_SUPPORTED;   // no FP8 kernel for this
    memset(&results[0], 0, sizeof results[0]);
    memcpy(&results[0].algo, pref, sizeof(emu_align));   // the algorithm needs what was allowed
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *found = 1;
    return CUBLAS_STATUS_SUCCESS;
}

static float load_elem(const void *p, cudaDataType t, uint64_t i) {
    if (t == CUDA_R_32F) return ((const float *)p)[i];
    if (is_fp8(t))   // exact: every E4M3 / E5M2 value is a half
        return __half2float(__half(__nv_cvt_fp8_to_halfraw(((const __nv_fp8_storage_t *)p)[i],
                                                           t == CUDA_R_8F_E4M3 ? __NV_E4M3 : __NV_E5M2)));
    uint16_t h = ((const uint16_t *)p)[i];
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static void store_elem(void *p, cudaDataType t, uint64_t i, float f) {
    if (t == CUDA_R_32F) { ((float *)p)[i] = f; return; }
    ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(f);   // round to nearest even, as the GPU does
}

}   // extern "C"

// what one matmul needs, copied at the call (descriptors may be destroyed before it runs)
struct emu_matmul {
    emu_desc v;
    emu_layout la, lb, lc, ld;
    float alpha, beta;
    float scale_ab;   // FP8: scaleA * scaleB, read when the GEMM runs; else 1
    const void *A, *B, *C;
    void *D;
};

static void matmul_run(emu_matmul x) {
    x.scale_ab = (x.v.a_scale ? *x.v.a_scale : 1.0f) * (x.v.b_scale ? *x.v.b_scale : 1.0f);
    uint64_t m, k, k2, n;
    op_shape(x.la, x.v.ta, &m, &k);
    op_shape(x.lb, x.v.tb, &k2, &n);
    std::vector<float> col(k);
    for (uint64_t j = 0; j < n; j++) {
        // column j of op(B): op(B)(p, j) = B(p, j) or B(j, p)
        for (uint64_t p = 0; p < k; p++)
            col[p] = load_elem(x.B, x.lb.type, x.v.tb == CUBLAS_OP_N ? p + j * x.lb.ld : j + p * x.lb.ld);
        for (uint64_t i = 0; i < m; i++) {
            float acc = 0.0f;
            for (uint64_t p = 0; p < k; p++)
                acc += load_elem(x.A, x.la.type, x.v.ta == CUBLAS_OP_N ? i + p * x.la.ld : p + i * x.la.ld) * col[p];
            float out = x.alpha * x.scale_ab * acc;
            if (x.beta != 0.0f) out += x.beta * load_elem(x.C, x.lc.type, i + j * x.lc.ld);
            store_elem(x.D, x.ld.type, i + j * x.ld.ld, out);
        }
    }
}

// bytes a column-major layout spans from its base pointer
static bool overlaps(const void *p, size_t n, const void *q, size_t m) {
    const uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
    return n && m && a < b + m && b < a + n;
}
static size_t layout_bytes(const emu_layout &l) {
    if (l.rows == 0 || l.cols == 0) return 0;
    return ((l.cols - 1) * (uint64_t)l.ld + l.rows) * elem_bytes(l.type);
}

extern "C" {

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t d, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t a, const void *B, cublasLtMatrixLayout_t b, const void *beta,
                              const void *C, cublasLtMatrixLayout_t c, void *D, cublasLtMatrixLayout_t dd,
                              const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
    // an algorithm chosen for stricter alignment than these pointers have fails (on a GPU:
    // an error or a misaligned-address fault)
    emu_align need;
    memcpy(&need, algo, sizeof need);
    if ((uintptr_t)A % need.a || (uintptr_t)B % need.b || (uintptr_t)C % need.c || (uintptr_t)D % need.d)
        return CUBLAS_STATUS_INVALID_VALUE;
    emu_matmul x;
    memcpy(&x.v, d, sizeof x.v); memcpy(&x.la, a, sizeof x.la); memcpy(&x.lb, b, sizeof x.lb);
    memcpy(&x.lc, c, sizeof x.lc); memcpy(&x.ld, dd, sizeof x.ld);
    if (x.v.compute != CUBLAS_COMPUTE_32F || x.v.scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    for (cudaDataType t : {x.lc.type, x.ld.type})
        if (t != CUDA_R_16BF && t != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    for (cudaDataType t : {x.la.type, x.lb.type})
        if (t != CUDA_R_16BF && t != CUDA_R_32F && !is_fp8(t)) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!fp8_rules_ok(x.v, x.la, x.lb, need)) return CUBLAS_STATUS_NOT_SUPPORTED;
    if ((x.v.a_scale || x.v.b_scale) && !is_fp8(x.la.type)) return CUBLAS_STATUS_INVALID_VALUE;   // scales: FP8 only
    uint64_t m, k, k2, n;
    op_shape(x.la, x.v.ta, &m, &k);
    op_shape(x.lb, x.v.tb, &k2, &n);
    if (k != k2 || x.lc.rows != m || x.lc.cols != n || x.ld.rows != m || x.ld.cols != n) return CUBLAS_STATUS_INVALID_VALUE;
    // alpha and beta are host scalars (the default pointer mode): read now
    x.alpha = *(const float *)alpha;
    x.beta = *(const float *)beta;
    // Aliasing: cuBLASLt computes D in tiles while it still reads A, B and C, so D may not
    // overlap A or B, and C only as C == D with one layout (in place). The real library does
    // not check: it returns wrong numbers. (This emulation, a column at a time, would often
    // get them right.)
    {
        const size_t na = layout_bytes(x.la), nb = layout_bytes(x.lb), nc = layout_bytes(x.lc),
                     nd = layout_bytes(x.ld);
        const char *bad = overlaps(D, nd, A, na) ? "A" : overlaps(D, nd, B, nb) ? "B"
                        : x.beta != 0.0f && C != D && overlaps(D, nd, C, nc) ? "C (C != D)"
                        : C == D && x.beta != 0.0f && memcmp(&x.lc, &x.ld, sizeof x.lc) != 0 ? "C (C == D, other layout)"
                        : nullptr;
        if (bad) {
            if (!cuemu::quiet()) fprintf(stderr, "cuda_emu: cublasLtMatmul (m %llu, n %llu, k %llu): D [%p, +%zu bytes) overlaps operand "
                    "%s: undefined on a GPU\n", (unsigned long long)m, (unsigned long long)n, (unsigned long long)k, D,
                    nd, bad);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    }
    x.A = A; x.B = B; x.C = C; x.D = D;
    std::vector<cuemu::Access> acc = {{A, layout_bytes(x.la), cuemu::ACC_READ, false, true},
                                      {B, layout_bytes(x.lb), cuemu::ACC_READ, false, true}};
    if (x.beta != 0.0f) acc.push_back({C, layout_bytes(x.lc), cuemu::ACC_READ, false, true});
    for (const float *sc : {x.v.a_scale, x.v.b_scale})
        if (sc) acc.push_back({sc, sizeof(float), cuemu::ACC_READ, false, true});
    acc.push_back({D, layout_bytes(x.ld), cuemu::ACC_WRITE, false, true});
    if (workspace && workspace_bytes) acc.push_back({workspace, workspace_bytes, cuemu::ACC_WRITE, false, true});
    char name[128];
    snprintf(name, sizeof name, "cublasLtMatmul (m %llu, n %llu, k %llu)", (unsigned long long)m,
             (unsigned long long)n, (unsigned long long)k);
    const double cost = cuemu::vclock_price_gemm((double)m, (double)n, (double)k);
    return cuemu::enqueue(stream, name, acc, [x]() { matmul_run(x); }, cost) == cudaSuccess ? CUBLAS_STATUS_SUCCESS
                                                                                            : CUBLAS_STATUS_INVALID_VALUE;
}

// ----------------------------------------------------------------------------
// NCCL over MPI (when built with MPI): "device" memory is host memory here, so each
// collective is the MPI collective of the same meaning; bf16 sums are taken in fp32 and
// rounded once (NCCL also accumulates bf16 in fp32). A communicator made from a unique id
// is the whole MPI world (finetune makes exactly that one, then splits it). Without MPI
// every call fails with a clear status.

// ncclGetLastError: the reason of the last failed init (the duplicate-GPU check), else ""
static char g_nccl_last_error[256];
const char *ncclGetLastError(ncclComm_t) { return g_nccl_last_error; }

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclSystemError: return "emulated NCCL: system error (an MPI call failed, or the communicator was aborted)";
    case ncclInvalidArgument: return "emulated NCCL: invalid argument (an unknown stream)";
    default: return "emulated NCCL: invalid usage (see tests/cuda_emu/cuda_emu_host.cpp)";
    }
}

#ifdef FT_HAVE_MPI
}   // extern "C"
#include <mpi.h>
#include <pthread.h>
#include <time.h>

#include <atomic>

struct ncclComm {
    MPI_Comm comm;
    int rank, size;
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;   // one MPI operation on it at a time
    std::atomic<int> pending{0};                      // collectives issued, not finished
    std::atomic<bool> aborted{false};
    std::atomic<int> error{ncclSuccess};              // a collective failed (GetAsyncError)
    int nodes = 1;                                    // (virtual clock) the nodes its ranks span
    emu_ctas ctas = emu_ctas_default();               // its config's CTA bounds (nccl_config_emu.h)
};

// (virtual clock) the nodes c's ranks span: the distinct world rank / FT_EMU_VCLOCK_GPUS_PER_NODE
// (the device's GPUs per node) among them. Collective over c (called by every rank).
static void vclock_nodes(ncclComm *c) {
    if (!cuemu::vclock_device()) return;
    int wr = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &wr);
    const int node = wr / cuemu::vclock_gpus_per_node();
    std::vector<int> all((size_t)c->size);
    MPI_Allgather(&node, 1, MPI_INT, all.data(), 1, MPI_INT, c->comm);
    std::sort(all.begin(), all.end());
    c->nodes = (int)(std::unique(all.begin(), all.end()) - all.begin());
}

static int mpi_finish(ncclComm_t c, int rc, MPI_Request *req);

// (virtual clock) the links: this rank's collectives over each kind of link (within a node,
// across nodes) take it one at a time, in the order the host issued them (a ring all-gather and
// a ring reduce-scatter each load every link of the ring: run together each would get about
// half), as the step-time timeline has them (src/plan_timeline.c). The host takes a ticket
// when it issues a collective; its stream worker waits for its turn (every collective issued
// before it on that link priced: they depend only on work issued before them, so the wait
// ends), starts no earlier than the link is free, and hands the link on.
static struct {
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    long issued[2] = {0, 0}, priced[2] = {0, 0};
    double free_at[2] = {0, 0};
} g_link;

static long link_ticket(int cross) {
    if (!cuemu::vclock_on()) return -1;
    pthread_mutex_lock(&g_link.mu);
    const long t = g_link.issued[cross]++;
    pthread_mutex_unlock(&g_link.mu);
    return t;
}
// Wait for ticket t's turn; returns when the link is free.
static double link_turn(int cross, long t) {
    pthread_mutex_lock(&g_link.mu);
    while (g_link.priced[cross] < t) pthread_cond_wait(&g_link.cv, &g_link.mu);
    const double f = g_link.free_at[cross];
    pthread_mutex_unlock(&g_link.mu);
    return f;
}
// The collective of the current turn ends at `end` (0: it did not run).
static void link_done(int cross, double end) {
    pthread_mutex_lock(&g_link.mu);
    if (end > g_link.free_at[cross]) g_link.free_at[cross] = end;
    g_link.priced[cross]++;
    pthread_cond_broadcast(&g_link.cv);
    pthread_mutex_unlock(&g_link.mu);
}

// (virtual clock, on a stream worker inside a collective) the ranks agree on the collective's
// start: the latest of theirs (each no earlier than its link is free, `link_free`), as a ring
// cannot move before its last member joins
static int vclock_agree(ncclComm_t c, double link_free) {
    if (!cuemu::vclock_on()) return MPI_SUCCESS;
    double mine = std::max(cuemu::vclock_op_start(), link_free), latest = mine;
    MPI_Request r;
    int rc = mpi_finish(c, MPI_Iallreduce(&mine, &latest, 1, MPI_DOUBLE, MPI_MAX, c->comm, &r), &r);
    cuemu::vclock_set_op_start(latest);
    return rc;
}

// the collectives' MPI calls run on stream workers, concurrently with the host's own MPI
// calls: ask for MPI_THREAD_MULTIPLE whatever the program asks for (PMPI interposition)
extern "C" int MPI_Init(int *argc, char ***argv) {
    int provided = MPI_THREAD_SINGLE;
    int rc = PMPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    if (rc == MPI_SUCCESS && provided < MPI_THREAD_MULTIPLE && cuemu_async()) {
        fprintf(stderr, "cuda_emu: this MPI has no MPI_THREAD_MULTIPLE: the emulated device runs synchronously\n");
        cuemu_set_async(0);
    }
    return rc;
}

static size_t nccl_size(ncclDataType_t t) {
    switch (t) {
    case ncclFloat32: case ncclInt32: return 4;
    case ncclFloat64: return 8;
    case ncclBfloat16: case ncclFloat16: return 2;
    default: return 1;
    }
}
static const char *nccl_type_name(ncclDataType_t t) {
    switch (t) {
    case ncclFloat32: return "f32";
    case ncclInt32: return "i32";
    case ncclFloat64: return "f64";
    case ncclBfloat16: return "bf16";
    case ncclFloat16: return "f16";
    default: return "bytes";
    }
}
static void to_f32(const void *src, ncclDataType_t t, float *dst, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = t == ncclFloat32 ? ((const float *)src)[i] : load_elem(src, CUDA_R_16BF, i);
}
static void from_f32(const float *src, void *dst, ncclDataType_t t, size_t n) {
    for (size_t i = 0; i < n; i++) store_elem(dst, t == ncclFloat32 ? CUDA_R_32F : CUDA_R_16BF, i, src[i]);
}
static bool summable(ncclDataType_t t) { return t == ncclFloat32 || t == ncclBfloat16 || t == ncclFloat64; }

// finish a started nonblocking MPI operation, polling gently: a blocking call would spin a
// core for as long as the peers take, and this worker shares the CPU with the compute
// stream. Gives up (MPI_ERR_OTHER, the request abandoned) once the communicator is aborted.
static int mpi_finish(ncclComm_t c, int rc, MPI_Request *req) {
    long ns = 1000;
    for (int done = 0; rc == MPI_SUCCESS;) {
        rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (done) break;
        if (c->aborted) return MPI_ERR_OTHER;
        struct timespec ts = {0, ns};
        nanosleep(&ts, nullptr);
        if (ns < 200000) ns *= 2;
    }
    return rc;
}

// Queue a collective on `stream`: `run` (the MPI calls) runs on the stream's worker, or now
// in synchronous mode. Accesses are the exact device byte ranges it reads and writes. kind and
// bytes price it for the virtual clock (vclock_price_collective).
static ncclResult_t nccl_issue(ncclComm_t c, cudaStream_t stream, const char *what, size_t n, ncclDataType_t t,
                               const std::vector<cuemu::Access> &acc, int kind, size_t bytes, std::function<int()> run) {
    if (c->aborted) return ncclInvalidUsage;
    if (cuemu::fault_hit("nccl_async")) {   // (FT_EMU_FAULT) this and later runs are skipped
        c->error = ncclSystemError;
        fprintf(stderr, "cuda_emu: injected fault (FT_EMU_FAULT) in %s: an asynchronous NCCL error\n", what);
    }
    char name[128];
    snprintf(name, sizeof name, "%s (%zu x %s)", what, n, nccl_type_name(t));
    c->pending++;
    const double cost = cuemu::vclock_price_collective(kind, (double)bytes, c->size, c->nodes);
    const int cross = c->nodes > 1 ? 1 : 0;
    const long ticket = link_ticket(cross);
    cudaError_t e = cuemu::enqueue(stream, name, acc, [c, run, cross, ticket, cost]() {
        const double link_free = ticket >= 0 ? link_turn(cross, ticket) : 0;
        double end = 0;
        if (!c->aborted && c->error == ncclSuccess) {
            pthread_mutex_lock(&c->mu);
            if (vclock_agree(c, link_free) != MPI_SUCCESS || run() != MPI_SUCCESS) c->error = ncclSystemError;
            else end = cuemu::vclock_op_start() + cost;
            pthread_mutex_unlock(&c->mu);
        }
        if (ticket >= 0) link_done(cross, end);
        c->pending--;
    }, cost);
    if (e != cudaSuccess) {
        if (ticket >= 0) link_done(cross, 0);   // (its turn passes: nothing will run it)
        c->pending--;
        return ncclInvalidArgument;
    }
    return cuemu::async_on() ? ncclSuccess : (ncclResult_t)c->error.load();
}

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    if (getenv("FT_EMU_NCCL_ID_FAIL")) return ncclSystemError;   // tests/test_cuda_bad_input.sh
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "cuda_emu nccl id (MPI world)");
    return ncclSuccess;
}
// the world communicator, with NCCL's default CTA bounds (ncclCommInitRank logs them)
static ncclResult_t init_rank(ncclComm_t *c, int nranks, int rank) {
    int init = 0, wr = 0, ws = 0;
    MPI_Initialized(&init);
    if (!init) return ncclInvalidUsage;
    MPI_Comm_rank(MPI_COMM_WORLD, &wr);
    MPI_Comm_size(MPI_COMM_WORLD, &ws);
    if (wr != rank || ws != nranks) return ncclInvalidUsage;   // only the world group is emulated
    // Two ranks on one GPU: NCCL refuses ("Duplicate GPU detected"). Each emulated process has
    // devices of its own, unless FT_EMU_SHARED_DEVICES (tests) makes the device numbers a
    // node's: then the GPU a rank drives is CUDA_VISIBLE_DEVICES' entry for its current
    // device (all visible without it), and two ranks of a host on one GPU are refused.
    if (getenv("FT_EMU_SHARED_DEVICES")) {
        int phys = g_current_device;
        const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
        for (int i = 0; cvd && *cvd; i++) {
            const int v = atoi(cvd);
            if (i == g_current_device) { phys = v; break; }
            cvd = strchr(cvd, ',');
            if (cvd) cvd++;
        }
        char host[64] = "?";
        gethostname(host, sizeof host - 1);
        long long mine[2] = {(long long)std::hash<std::string>{}(host), phys};
        std::vector<long long> all((size_t)ws * 2);
        MPI_Allgather(mine, 2, MPI_LONG_LONG, all.data(), 2, MPI_LONG_LONG, MPI_COMM_WORLD);
        for (int r = 0; r < ws; r++)
            if (r != wr && all[2 * r] == mine[0] && all[2 * r + 1] == phys) {
                snprintf(g_nccl_last_error, sizeof g_nccl_last_error,
                         "Duplicate GPU detected : rank %d and rank %d both on CUDA device %d (emulated)", wr, r, phys);
                return ncclInvalidUsage;
            }
    }
    ncclComm *m = new ncclComm();
    MPI_Comm_dup(MPI_COMM_WORLD, &m->comm);
    m->rank = rank;
    m->size = nranks;
    vclock_nodes(m);
    *c = m;
    g_nccl_live++;
    return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t *c, int nranks, ncclUniqueId, int rank) {
    const ncclResult_t r = init_rank(c, nranks, rank);
    if (r == ncclSuccess) emu_ctas_log("cuda_emu", "init", rank, nranks, &(*c)->ctas);
    return r;
}
// ncclCommInitRank with a configuration: its CTA bounds checked and kept as NCCL's are
ncclResult_t ncclCommInitRankConfig(ncclComm_t *c, int nranks, ncclUniqueId, int rank, ncclConfig_t *config) {
    emu_ctas ctas;
    if (emu_ctas_from_config(config, nullptr, &ctas) != 0) return ncclInvalidArgument;
    const ncclResult_t r = init_rank(c, nranks, rank);
    if (r == ncclSuccess) emu_ctas_take(&(*c)->ctas, &ctas, "cuda_emu", "init", rank, nranks);
    return r;
}
ncclResult_t ncclCommSplit(ncclComm_t c, int color, int key, ncclComm_t *out, ncclConfig_t *config) {
    emu_ctas ctas;
    if (emu_ctas_from_config(config, &c->ctas, &ctas) != 0) return ncclInvalidArgument;
    ncclComm *m = new ncclComm();
    m->ctas = ctas;
    pthread_mutex_lock(&c->mu);
    int rc = MPI_Comm_split(c->comm, color, key, &m->comm);
    pthread_mutex_unlock(&c->mu);
    if (rc != MPI_SUCCESS) { delete m; return ncclSystemError; }
    MPI_Comm_rank(m->comm, &m->rank);
    MPI_Comm_size(m->comm, &m->size);
    vclock_nodes(m);
    *out = m;
    g_nccl_live++;
    emu_ctas_log("cuda_emu", "split", m->rank, m->size, &m->ctas);
    return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t c, int *rank) { *rank = c->rank; return ncclSuccess; }
ncclResult_t ncclCommCount(const ncclComm_t c, int *count) { *count = c->size; return ncclSuccess; }
// waits for the communicator's queued collectives (as NCCL's does)
ncclResult_t ncclCommDestroy(ncclComm_t c) {
    while (c->pending > 0) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, nullptr);
    }
    MPI_Comm_free(&c->comm);
    delete c;
    g_nccl_live--;
    return ncclSuccess;
}
// Queued collectives of c are dropped and the one in progress gives up (its MPI request
// abandoned: the process is expected to end); returns once none is left running. The
// MPI communicator is not freed (an abandoned request may still refer to it).
ncclResult_t ncclCommAbort(ncclComm_t c) {
    c->aborted = true;
    if (c->error == ncclSuccess) c->error = ncclSystemError;
    while (c->pending > 0 && cuemu_async()) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, nullptr);
    }
    return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *err) {
    *err = (ncclResult_t)c->error.load();
    return ncclSuccess;
}
// NCCL's in-place forms are the only overlaps it allows (all-gather: send == recv + rank *
// count; reduce-scatter: recv == send + rank * count; all-reduce and broadcast: send ==
// recv); any other overlap of send and receive buffers is undefined (wrong data, no error).
static ncclResult_t nccl_overlap(const char *what, const void *send, size_t sbytes, const void *recv, size_t rbytes,
                                 bool in_place) {
    if (in_place || !overlaps(send, sbytes, recv, rbytes)) return ncclSuccess;
    if (!cuemu::quiet()) fprintf(stderr, "cuda_emu: %s: the send buffer [%p, +%zu bytes) overlaps the receive buffer [%p, +%zu bytes) "
            "other than in NCCL's in-place form: undefined on a GPU\n", what, send, sbytes, recv, rbytes);
    return ncclInvalidArgument;
}
ncclResult_t ncclAllGather(const void *send, void *recv, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t s) {
    const size_t bytes = n * nccl_size(t);
    if (nccl_overlap("ncclAllGather", send, bytes, recv, bytes * c->size,
                     (const char *)recv + (size_t)c->rank * bytes == send) != ncclSuccess)
        return ncclInvalidArgument;
    const void *snd = (const char *)recv + (size_t)c->rank * bytes == send ? MPI_IN_PLACE : send;
    MPI_Comm comm = c->comm;
    return nccl_issue(c, s, "ncclAllGather", n, t,
                      {{send, bytes, cuemu::ACC_READ, false, true}, {recv, bytes * c->size, cuemu::ACC_WRITE, false, true}},
                      PLAN_COLL_ALL_GATHER, bytes, [=]() {
                          MPI_Request r;
                          return mpi_finish(c, MPI_Iallgather(snd, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE,
                                                           comm, &r), &r);
                      });
}
ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                               cudaStream_t s) {
    if (op != ncclSum || !summable(t)) return ncclInvalidUsage;
    const size_t es = nccl_size(t);
    const int size = c->size;
    if (nccl_overlap("ncclReduceScatter", send, n * es * size, recv, n * es,
                     (const char *)send + (size_t)c->rank * n * es == recv) != ncclSuccess)
        return ncclInvalidArgument;
    MPI_Comm comm = c->comm;
    return nccl_issue(c, s, "ncclReduceScatter", n, t,
                      {{send, n * es * size, cuemu::ACC_READ, false, true}, {recv, n * es, cuemu::ACC_WRITE, false, true}},
                      PLAN_COLL_REDUCE_SCATTER, n * es, [=]() {
                          MPI_Request r;
                          if (t == ncclFloat64)
                              return mpi_finish(c, MPI_Ireduce_scatter_block(send, recv, (int)n, MPI_DOUBLE, MPI_SUM,
                                                                          comm, &r), &r);
                          std::vector<float> in(n * (size_t)size), out(n);
                          to_f32(send, t, in.data(), in.size());
                          int rc = mpi_finish(c, MPI_Ireduce_scatter_block(in.data(), out.data(), (int)n, MPI_FLOAT,
                                                                        MPI_SUM, comm, &r), &r);
                          from_f32(out.data(), recv, t, n);
                          return rc;
                      });
}
ncclResult_t ncclAllReduce(const void *send, void *recv, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t s) {
    if (op != ncclSum || !summable(t)) return ncclInvalidUsage;
    const size_t es = nccl_size(t);
    if (nccl_overlap("ncclAllReduce", send, n * es, recv, n * es, send == recv) != ncclSuccess)
        return ncclInvalidArgument;
    MPI_Comm comm = c->comm;
    return nccl_issue(c, s, "ncclAllReduce", n, t,
                      {{send, n * es, cuemu::ACC_READ, false, true}, {recv, n * es, cuemu::ACC_WRITE, false, true}},
                      PLAN_COLL_ALL_REDUCE, n * es, [=]() {
                          MPI_Request r;
                          if (t == ncclFloat64)
                              return mpi_finish(c, MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)n,
                                                               MPI_DOUBLE, MPI_SUM, comm, &r), &r);
                          std::vector<float> v(n);
                          to_f32(send, t, v.data(), n);
                          int rc = mpi_finish(c, MPI_Iallreduce(MPI_IN_PLACE, v.data(), (int)n, MPI_FLOAT, MPI_SUM,
                                                             comm, &r), &r);
                          from_f32(v.data(), recv, t, n);
                          return rc;
                      });
}
ncclResult_t ncclBroadcast(const void *send, void *recv, size_t n, ncclDataType_t t, int root, ncclComm_t c,
                           cudaStream_t s) {
    const size_t bytes = n * nccl_size(t);
    const bool is_root = c->rank == root;
    if (is_root && nccl_overlap("ncclBroadcast", send, bytes, recv, bytes, send == recv) != ncclSuccess)
        return ncclInvalidArgument;
    MPI_Comm comm = c->comm;
    std::vector<cuemu::Access> acc = {{recv, bytes, cuemu::ACC_WRITE, false, true}};
    if (is_root) acc.insert(acc.begin(), {send, bytes, cuemu::ACC_READ, false, true});
    return nccl_issue(c, s, "ncclBroadcast", n, t, acc, PLAN_COLL_BROADCAST, bytes, [=]() {
        if (is_root && send != recv) memmove(recv, send, bytes);
        MPI_Request r;
        return mpi_finish(c, MPI_Ibcast(recv, (int)bytes, MPI_BYTE, root, comm, &r), &r);
    });
}

#else   // no MPI: one process only

ncclResult_t ncclGetUniqueId(ncclUniqueId *) { return ncclInvalidUsage; }
ncclResult_t ncclCommInitRank(ncclComm_t *, int, ncclUniqueId, int) { return ncclInvalidUsage; }
ncclResult_t ncclCommInitRankConfig(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *) { return ncclInvalidUsage; }
ncclResult_t ncclCommSplit(ncclComm_t, int, int, ncclComm_t *, ncclConfig_t *) { return ncclInvalidUsage; }
ncclResult_t ncclCommUserRank(const ncclComm_t, int *) { return ncclInvalidUsage; }
ncclResult_t ncclCommCount(const ncclComm_t, int *) { return ncclInvalidUsage; }
ncclResult_t ncclCommDestroy(ncclComm_t) { return ncclSuccess; }
ncclResult_t ncclCommAbort(ncclComm_t) { return ncclSuccess; }
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t *err) { *err = ncclSuccess; return ncclSuccess; }
ncclResult_t ncclAllGather(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) {
    return ncclInvalidUsage;
}
ncclResult_t ncclReduceScatter(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) {
    return ncclInvalidUsage;
}
ncclResult_t ncclAllReduce(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) {
    return ncclInvalidUsage;
}
ncclResult_t ncclBroadcast(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) {
    return ncclInvalidUsage;
}
#endif

// the version the emulated NCCL reports: FT_EMU_NCCL_VERSION (NCCL_VERSION_CODE, e.g. 22503 =
// 2.25.3), default 22809 (2.28.9, the one PyTorch 2.11 pins)
ncclResult_t ncclGetVersion(int *version) {
    const char *v = getenv("FT_EMU_NCCL_VERSION");
    *version = v && *v ? atoi(v) : 22809;
    return ncclSuccess;
}

}   // extern "C"
