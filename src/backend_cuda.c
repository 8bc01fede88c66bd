// backend_cuda.c: the CUDA backend's host side.
// This same file runs in CI against the CPU emulator of the CUDA runtime, cuBLASLt and NCCL
// (tests/cuda_emu): every op against the CPU backend (test_backend_emu, built from
// tests/gpu/test_backend_gpu.c), the trainer on emulated GPUs (tests/test_cuda_emu_train.sh,
// _soak, _hazards), and the clean failures of `--device cuda`: no driver or device
// (test_plan.sh; an emulated machine without devices in test_cuda_emu_train.sh), an old
// compute capability, a full arena, a missing NCCL (test_cuda_bad_input.sh). The arena's
// bookkeeping: tests/test_arena.c.
//
// Layout of the backend:
//   - storage dtype bf16; every `float *` tensor (statistics, optimizer state) is fp32
//   - ONE device arena: a single cudaMalloc at open, sized by the caller from the memory
//     plan; alloc()/free() carve it (src/arena.c), and the kernels' scratch comes from it
//     too (ftk_set_scratch_allocator), so the step loop never calls cudaMalloc
//   - one compute stream (non-blocking) for kernels, GEMMs, copies and memsets; the NCCL
//     transport runs collectives on its own comm stream and orders itself against this one
//     with events (src/comm_nccl.c, backend_cuda_stream())
//   - one copy stream for copy_async (--offload_optimizer's gradient and parameter slices
//     to and from pinned host memory), ordered by events against the compute stream
//   - GEMMs on cuBLASLt: bf16 inputs, bf16 (or, in the lm_head, fp32) outputs, fp32
//     accumulation (CUBLAS_COMPUTE_32F), descriptors and the heuristic's algorithm cached per
//     (m, n, k, transposes, leading dimensions, output type, pointer alignments: the
//     heuristic is told the real ones), at most BACKEND_CUDA_GEMM_PLANS plans, least
//     recently used evicted; one workspace from the arena. The row counts are few because
//     the model runs micro-batches at bucketed lengths (seq_bucket 64, backend_seq_len).
//   - lm_head + cross-entropy: per row chunk, cuBLASLt GEMMs around one fused softmax kernel
//   - attention: cuDNN's fused flash attention (src/attention_cudnn.h) under `--attention cudnn`
//     (the default) once the startup check agreed with the native kernels, else the native
//     kernels (kernels/attention.cu); attention_select() below
//   - everything else: the hand-written kernels (kernels/kernels.h)
// Every CUDA / cuBLASLt call goes through CHECK_CUDA / CHECK_CUBLAS, naming the call.
#include <cublasLt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "arena.h"
#include "attention_cudnn.h"
#include "attention_ws.h"
#include "backend.h"
#include "backend_cuda.h"
#include "cuda_check.h"
#include "cuda_wait.h"
#include "kernels.h"
#include "watchdog.h"

// ----------------------------------------------------------------------------
// state (one device per process)

#define LT_WORKSPACE_BYTES ((size_t)32 << 20)   // cuBLASLt workspace (Hopper wants 32 MiB)
#define ARENA_ALIGN 256

// what a plan is cached by: the column-major view of the product, the leading dimensions, the
// C/D storage type and the alignment of the A, B, C/D pointers (no padding: memcmp compares)
typedef struct {
    int m, n, k, ta, tb;
    int lda, ldb, ldc;
    int c_f32;                             // C/D fp32 (else bf16)
    int a_fp8, b_fp8;                      // A / B: 0 bf16, else 1 + its fp8_format (--fp8's GEMMs)
    uint32_t align[3];
} gemm_key;

typedef struct {
    gemm_key key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
    uint64_t last_use;                     // g_cuda.gemm_clock at its last lookup (LRU order)
} gemm_plan;

static struct {
    int open, device;
    int cc;                                // compute capability, major * 10 + minor
    cudaStream_t stream;
    cudaStream_t copy_stream;              // copy_async's copies (--offload_optimizer)
    cudaEvent_t compute_mark;              // the compute stream's position when a copy is issued
    cudaEvent_t pace_mark[BACKEND_PACE_LAG + 1];   // the compute stream's position at the last pace() calls
    long pace_calls;                       // pace() calls so far (call k records pace_mark[k % (LAG + 1)])
    cudaEvent_t copy_done[BACKEND_COPY_TICKETS];
    int copy_live[BACKEND_COPY_TICKETS];   // a copy under this ticket is not yet waited for
    cublasLtHandle_t lt;
    void *lt_workspace;
    void *arena_mem;
    arena ar;
    gemm_plan plans[BACKEND_CUDA_GEMM_PLANS];
    int n_plans;
    uint64_t gemm_clock;                   // lookups so far
    long gemm_evictions;
    int attention_native;                  // --attention native asked (set before open)
    int deterministic;                     // --deterministic (set before open; attention_cudnn.c has it too)
    int attention_cudnn;                   // attention runs through cuDNN now
    int attention_checked;                 // cuDNN opened and passed the startup check
    double check_seconds, check_nmse;      // its wall time (plans built, NVRTC included) and worst NMSE
    char name[256];
    char device_name[256];
} g_cuda;

// ----------------------------------------------------------------------------
// host waits: bounded by --collective_timeout (src/cuda_wait.h)

static int compute_wait(const char *op, size_t bytes) {
    return cuda_wait_stream(g_cuda.stream, op, "compute stream", bytes);
}

// ----------------------------------------------------------------------------
// memory

// Test hooks: the emulated CUDA runtime (tests/cuda_emu) tracks the arena's blocks to check
// the ordering of the work that uses them. Weak and undefined in a real build (NULL: skipped).
// A block is freed on the host at once; the free counts as ordered on the compute stream.
extern void cuemu_block_alloc(void *p, size_t nbytes) __attribute__((weak));
extern void cuemu_block_free(void *p, void *stream) __attribute__((weak));
// Kernels launched until the next call with p NULL touch exactly [p, p + nbytes) through a
// pointer argument equal to p, not the whole block: for ops on one unit's slice of a flat
// buffer (--offload_optimizer copies other units' slices of it meanwhile).
extern void cuemu_launch_extent(const void *p, size_t nbytes) __attribute__((weak));
static void emu_extent(const void *p, size_t nbytes) {
    if (cuemu_launch_extent) cuemu_launch_extent(p, nbytes);
}

static void *cu_alloc(size_t nbytes) {
    void *p = arena_alloc(&g_cuda.ar, nbytes);
    if (p && cuemu_block_alloc) cuemu_block_alloc(p, nbytes);
    return p;
}
// a pointer the arena did not hand out is a programming error: arena_free records it with
// ft_error (the table's free returns nothing, and library code does not print)
static void cu_free(void *p) {
    if (p && cuemu_block_free) cuemu_block_free(p, g_cuda.stream);
    (void)arena_free(&g_cuda.ar, p);
}
static void scratch_release(void *p) { cu_free(p); }
// Host buffers here are pageable (RoPE tables, losses, checkpoint slices; a micro-batch's
// tokens and targets go through cu_upload's pinned slots instead): CUDA's
// cudaMemcpyAsync from or to pageable memory may block the host until the work queued before
// it is done, where the watchdog cannot see it (a dead peer's collective would hang the job
// with no message). So drain the stream first, in the polled wait; the copy then finishes at
// once. The wait after it keeps the contract: the host buffer may be reused at once.
static int cu_copy_h2d(void *dst, const void *src, size_t n) {
    TRY(compute_wait("work before a copy to the device", n));
    CHECK_CUDA(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, g_cuda.stream));
    return compute_wait("copy to the device", n);
}
static int cu_copy_d2h(void *dst, const void *src, size_t n) {
    TRY(compute_wait("work before a copy to the host", n));
    CHECK_CUDA(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, g_cuda.stream));
    return compute_wait("copy to the host", n);
}
static int cu_copy_d2d(void *dst, const void *src, size_t n) {
    CHECK_CUDA(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, g_cuda.stream));
    return 0;
}
static int cu_zero(void *p, size_t n) {
    CHECK_CUDA(cudaMemsetAsync(p, 0, n, g_cuda.stream));
    return 0;
}
static int cu_synchronize(void) { return compute_wait("synchronize", 0); }

// Pinned host memory and the copy stream. A copy waits (on the device) for the work issued
// so far on the compute stream (e.g. the gradients it reads), runs on the copy stream, and
// records its ticket's event; copy_wait blocks the host on that event and makes the compute
// stream wait for it, so later kernels see what a host-to-device copy wrote.
static void *cu_host_alloc(size_t nbytes) {
    void *p = NULL;
    const cudaError_t e = cudaMallocHost(&p, nbytes ? nbytes : 1);
    if (e != cudaSuccess) {
        ft_error("cuda backend: cudaMallocHost of %zu bytes (pinned host memory) failed: %s", nbytes,
                 cudaGetErrorString(e));
        return NULL;
    }
    return p;
}
static void cu_host_free(void *p) {
    if (p) (void)cudaFreeHost(p);
}
static int poll_event(void *ctx) { return cuda_wait_poll_status(cudaEventQuery((cudaEvent_t)ctx), "cudaEventQuery"); }
static int cu_copy_wait(int ticket) {
    if (ticket < 0 || ticket >= BACKEND_COPY_TICKETS) return ft_error("cuda backend: copy ticket %d out of range", ticket);
    if (!g_cuda.copy_live[ticket]) return 0;
    g_cuda.copy_live[ticket] = 0;
    const int up = ticket >= BACKEND_TICKET_UPLOAD;   // (cu_upload's: on the compute stream)
    if (watchdog_enabled())
        TRY(watchdog_wait(poll_event, g_cuda.copy_done[ticket], up ? "micro-batch upload" : "offload copy",
                          up ? "compute stream" : "copy stream", 0));
    else CHECK_CUDA(cudaEventSynchronize(g_cuda.copy_done[ticket]));
    if (!up) CHECK_CUDA(cudaStreamWaitEvent(g_cuda.stream, g_cuda.copy_done[ticket], 0));
    return 0;
}
static int cu_copy_async(void *dst, const void *src, size_t n, int to_device, int ticket) {
    TRY(cu_copy_wait(ticket));   // its event and buffers are reused
    CHECK_CUDA(cudaEventRecord(g_cuda.compute_mark, g_cuda.stream));
    CHECK_CUDA(cudaStreamWaitEvent(g_cuda.copy_stream, g_cuda.compute_mark, 0));
    CHECK_CUDA(cudaMemcpyAsync(dst, src, n, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, g_cuda.copy_stream));
    CHECK_CUDA(cudaEventRecord(g_cuda.copy_done[ticket], g_cuda.copy_stream));
    g_cuda.copy_live[ticket] = 1;
    return 0;
}
// A micro-batch's rows from a pinned staging slot (src/model.c), on the compute stream: no
// drain, no host wait (pinned memory, so cudaMemcpyAsync returns at once). The ticket's event
// is recorded again after each upload; the stream runs in order, so it covers earlier ones.
static int cu_upload(void *dst, const void *src, size_t n, int ticket) {
    if (ticket < BACKEND_TICKET_UPLOAD || ticket >= BACKEND_COPY_TICKETS)
        return ft_error("cuda backend: upload ticket %d out of range", ticket);
    if (n == 0) return 0;
    CHECK_CUDA(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, g_cuda.stream));
    CHECK_CUDA(cudaEventRecord(g_cuda.copy_done[ticket], g_cuda.stream));
    g_cuda.copy_live[ticket] = 1;
    return 0;
}

// ----------------------------------------------------------------------------
// GEMM: D (m, n) = alpha op(A) op(B) + beta C, column-major, bf16 in/out, fp32 accumulate.
// Row-major X (R, K) is column-major X^T (K, R), which is how the three matmuls below map.

// Alignment of a pointer in bytes, capped at 256 (cuBLASLt's default assumption). Weights
// sit at arbitrary element offsets inside flat unit buffers and activation row chunks start
// mid-buffer, so the heuristic must be told, or it may pick an algorithm that faults.
static uint32_t ptr_align(const void *p) {
    uintptr_t a = (uintptr_t)p & (uintptr_t)(-(intptr_t)(uintptr_t)p);   // lowest set bit
    return a == 0 || a > 256 ? 256 : (uint32_t)a;
}

// Destroy a plan's descriptors and layouts (those created; also after a partial build).
static void gemm_plan_destroy(gemm_plan *p) {
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->c) cublasLtMatrixLayoutDestroy(p->c);
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    p->a = p->b = p->c = NULL;
    p->op = NULL;
}

// an operand's cuBLASLt type from its key field (0 bf16, 1 + fp8_format)
static cudaDataType_t operand_type(int fp8) {
    return fp8 == 0 ? CUDA_R_16BF : fp8 == 1 + FP8_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

// Create the descriptors of the plan keyed by p->key and ask the heuristic for its
// algorithm. On failure the caller destroys what was created.
static int gemm_plan_build(gemm_plan *p) {
    const gemm_key *key = &p->key;
    const int m = key->m, n = key->n, k = key->k, ta = key->ta, tb = key->tb;
    const uint32_t *align = key->align;
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CHECK_CUBLAS(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    if (key->a_fp8) {   // FP8: the heuristic chooses among scaled kernels (cu_matmul_fp8 sets the real scales per call)
        const void *placeholder = g_cuda.lt_workspace;
        CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &placeholder,
                                                    sizeof placeholder));
        CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &placeholder,
                                                    sizeof placeholder));
    }
    // stored shapes: op(A) is (m, k), op(B) is (k, n)
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&p->a, operand_type(key->a_fp8), ta ? k : m, ta ? m : k, key->lda));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&p->b, operand_type(key->b_fp8), tb ? n : k, tb ? k : n, key->ldb));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&p->c, key->c_f32 ? CUDA_R_32F : CUDA_R_16BF, m, n, key->ldc));
    cublasLtMatmulPreference_t pref;
    CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = LT_WORKSPACE_BYTES;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    const cublasLtMatmulPreferenceAttributes_t which[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; i++)
        st = cublasLtMatmulPreferenceSetAttribute(pref, which[i], &align[i < 3 ? i : 2], sizeof(uint32_t));
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(g_cuda.lt, p->op, p->a, p->b, p->c, p->c, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED) found = 0;   // the heuristic's way to say "none": the line below
    else CHECK_CUBLAS(st);
    if (found < 1)
        return ft_error("cuda: cuBLASLt has no algorithm for a %s GEMM m=%d n=%d k=%d, %s output (leading dimensions "
                        "%d/%d/%d, alignments %u/%u/%u bytes)", key->a_fp8 ? "fp8" : "bf16", m, n, k,
                        key->c_f32 ? "fp32" : "bf16", key->lda, key->ldb, key->ldc, align[0], align[1], align[2]);
    p->algo = res.algo;
    return 0;
}

// The cached plan for this key, built on a miss. A full cache evicts its least recently
// used plan: building one is host-only work (descriptors and a heuristic query, tens of
// microseconds), and cuBLASLt takes what it needs from the descriptors during the
// cublasLtMatmul call, not when the GEMM runs (llm.c creates and destroys them around every
// call), so destroying them while that GEMM is still queued is safe.
static int gemm_plan_get(const gemm_key *key, gemm_plan **out) {
    gemm_plan *lru = NULL;
    g_cuda.gemm_clock++;
    for (int i = 0; i < g_cuda.n_plans; i++) {
        gemm_plan *p = &g_cuda.plans[i];
        if (memcmp(&p->key, key, sizeof *key) == 0) {
            p->last_use = g_cuda.gemm_clock;
            *out = p;
            return 0;
        }
        if (!lru || p->last_use < lru->last_use) lru = p;
    }
    gemm_plan fresh = {.key = *key, .last_use = g_cuda.gemm_clock};
    if (gemm_plan_build(&fresh) != 0) {
        gemm_plan_destroy(&fresh);
        return -1;
    }
    gemm_plan *slot = &g_cuda.plans[g_cuda.n_plans];
    if (g_cuda.n_plans == BACKEND_CUDA_GEMM_PLANS) {
        slot = lru;
        gemm_plan_destroy(slot);
        g_cuda.gemm_evictions++;
    } else {
        g_cuda.n_plans++;
    }
    *slot = fresh;
    *out = slot;
    return 0;
}

int backend_cuda_fp8_capable(void) { return g_cuda.open && g_cuda.cc >= 89; }

void backend_cuda_gemm_stats(int *cached, long *evictions) {
    *cached = g_cuda.n_plans;
    *evictions = g_cuda.gemm_evictions;
}

// D = alpha op(A) op(B) + beta C with explicit leading dimensions, C and D of one layout
// (fp32 when c_f32); C may be D
static int gemm_cd(int ta, int tb, int m, int n, int k, const void *A, int lda, const void *B, int ldb, const void *C,
                   void *D, int ldc, int c_f32, float alpha, float beta) {
    gemm_plan *p = NULL;
    const uint32_t ac = ptr_align(C), ad = ptr_align(D);
    const gemm_key key = {.m = m, .n = n, .k = k, .ta = ta, .tb = tb, .lda = lda, .ldb = ldb, .ldc = ldc,
                          .c_f32 = c_f32, .align = {ptr_align(A), ptr_align(B), ac < ad ? ac : ad}};
    TRY(gemm_plan_get(&key, &p));
    CHECK_CUBLAS(cublasLtMatmul(g_cuda.lt, p->op, &alpha, A, p->a, B, p->b, &beta, C, p->c, D, p->c, &p->algo,
                                g_cuda.lt_workspace, LT_WORKSPACE_BYTES, g_cuda.stream));
    return 0;
}

// D = C = alpha op(A) op(B) + beta C
static int gemm_ld(int ta, int tb, int m, int n, int k, const void *A, int lda, const void *B, int ldb, void *C,
                   int ldc, int c_f32, float alpha, float beta) {
    return gemm_cd(ta, tb, m, n, k, A, lda, B, ldb, C, C, ldc, c_f32, alpha, beta);
}

// the same, bf16 C, packed operands (leading dimension = stored rows)
static int gemm(int ta, int tb, int m, int n, int k, const void *A, const void *B, void *C, float beta) {
    return gemm_ld(ta, tb, m, n, k, A, ta ? k : m, B, tb ? n : k, C, m, 0, 1.0f, beta);
}

// out (N, OC) = inp (N, IC) @ weight (OC, IC)^T  <=>  out^T (OC, N) = W (OC, IC) . inp^T (IC, N);
// + residual (N, OC) as cuBLASLt's C operand with beta = 1 (the add is the GEMM's epilogue)
static int cu_matmul_fwd(void *out, const void *inp, const void *weight, const void *residual, int N, int IC, int OC) {
    if (!residual) return gemm(1, 0, OC, N, IC, weight, inp, out, 0.0f);
    return gemm_cd(1, 0, OC, N, IC, weight, IC, inp, IC, residual, out, OC, 0, 1.0f, 1.0f);
}

// out (M, N) = sa sb a (M, K) b (N, K)^T  <=>  out^T (N, M) = b (N, K) . a^T (K, M): cuBLASLt's A
// is b transposed, its B is a (the "TN" form Hopper's FP8 GEMMs require), the scales are
// device pointers set on the cached descriptor at each call (cuBLASLt reads them when the
// GEMM runs, as it does the operands). Fast accumulation stays off (the default): the tensor
// cores' partial sums (about 14 significant bits on Hopper) are promoted to fp32 at intervals
// rather than kept in the narrow accumulator throughout (tests/gpu/test_fp8_gpu.c's THR_F32
// allows for the difference from the CPU's fp32 sum). C = D
// of out_dtype: bf16, or fp32 (the weight gradient into an fp32 buffer; cuBLASLt's FP8 GEMMs
// take an fp32 C/D with FP8 A/B), which the plan's key holds (c_f32), as for bf16 GEMMs.
static int cu_matmul_fp8(void *out, const void *a, fp8_format a_fmt, const float *a_stats, const void *b,
                         fp8_format b_fmt, const float *b_stats, int M, int N, int K, int accumulate,
                         st_dtype out_dtype) {
    if (a_fmt >= FP8_FORMAT_COUNT || b_fmt >= FP8_FORMAT_COUNT || (a_fmt == FP8_E5M2 && b_fmt == FP8_E5M2))
        return ft_error("matmul_fp8: formats %s x %s (e4m3 x e4m3, e4m3 x e5m2 or e5m2 x e4m3)", fp8_name(a_fmt),
                        fp8_name(b_fmt));
    if (!backend_cuda_fp8_capable())
        return ft_error("matmul_fp8: %s has no FP8 tensor cores (compute capability 8.9 or newer: Ada, Hopper)",
                        g_cuda.device_name);
    if (M <= 0 || N <= 0 || K <= 0 || K % 16 != 0)
        return ft_error("matmul_fp8: shape M %d N %d K %d (K a multiple of 16: the FP8 GEMM's rows)", M, N, K);
    if (out_dtype != ST_BF16 && out_dtype != ST_F32)
        return ft_error("matmul_fp8: output dtype %s (bf16 or fp32 on CUDA)", st_dtype_name(out_dtype));
    gemm_plan *p = NULL;
    const uint32_t ao = ptr_align(out);
    const gemm_key key = {.m = N, .n = M, .k = K, .ta = 1, .tb = 0, .lda = K, .ldb = K, .ldc = N,
                          .c_f32 = out_dtype == ST_F32, .a_fp8 = 1 + (int)b_fmt, .b_fp8 = 1 + (int)a_fmt,
                          .align = {ptr_align(b), ptr_align(a), ao}};
    TRY(gemm_plan_get(&key, &p));
    const float *sa = b_stats + 2, *sb = a_stats + 2, alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa));
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb));
    CHECK_CUBLAS(cublasLtMatmul(g_cuda.lt, p->op, &alpha, b, p->a, a, p->b, &beta, out, p->c, out, p->c, &p->algo,
                                g_cuda.lt_workspace, LT_WORKSPACE_BYTES, g_cuda.stream));
    return 0;
}

static int cu_fp8_quantize(void *out, void *out_t, float *stats, const void *inp, int rows, int cols, fp8_format fmt) {
    return ftk_fp8_quantize(out, out_t, stats, inp, rows, cols, (int)fmt, g_cuda.stream);
}
static int cu_fp8_cast(void *out, void *out_t, float *stats, const float *amax, const void *inp, int rows, int cols,
                       fp8_format fmt) {
    return ftk_fp8_cast(out, out_t, stats, amax, inp, rows, cols, (int)fmt, g_cuda.stream);
}

// a parameter gradient's dtype (backend.h, gdt): 1 for fp32, 0 for bf16, -1 + ft_error otherwise
static int grad_is_f32(const char *op, st_dtype gdt) {
    if (gdt == ST_F32 || gdt == ST_BF16) return gdt == ST_F32;
    return ft_error("%s: gradient dtype %s (bf16 or fp32 on CUDA)", op, st_dtype_name(gdt));
}

static int cu_matmul_bwd(void *dinp, void *dweight, st_dtype gdt, const void *dout, const void *inp,
                         const void *weight, int N, int IC, int OC, int accumulate_dinp, int accumulate_dw) {
    // dinp^T (IC, N) = W^T (IC, OC) . dout^T (OC, N)
    if (dinp) TRY(gemm(0, 0, IC, N, OC, weight, dout, dinp, accumulate_dinp ? 1.0f : 0.0f));
    // dW^T (IC, OC) += (beta 1) or = (beta 0) inp^T (IC, N) . dout (N, OC), a bf16 or fp32 C
    if (!dweight) return 0;
    const int f32 = grad_is_f32("matmul_bwd", gdt);
    if (f32 < 0) return -1;
    return gemm_ld(0, 1, IC, OC, N, inp, IC, dout, OC, dweight, IC, f32, 1.0f, accumulate_dw ? 1.0f : 0.0f);
}

// ----------------------------------------------------------------------------
// lm_head + cross-entropy: three cuBLASLt GEMMs per chunk of rows around the softmax kernel
// (kernels/lmhead_xent.cu). Per chunk of `rows` rows starting at n0, in column-major terms:
//   logits^T (V, rows) fp32 = W^T-view: op_T(W stored (C, V)) . x_c^T (C, rows)
//   [kernel: losses; logits -> bf16 g = softmax - onehot in place, row stride 2V elements]
//   dx_c^T (C, rows)  bf16 = dloss W stored (C, V) . g^T (V, rows, ld 2V)
//   dW^T (C, V)          += dloss x_c^T (C, rows) . op_T(g^T (V, rows, ld 2V))
// (dloss as the GEMMs' fp32 alpha, not folded into the bf16 g: see kernels/lmhead_xent.cu)
// An fp32 dweight (gdt) takes every chunk's dW GEMM directly (beta 1). A bf16 one: with one
// chunk dW's GEMM adds into it directly (one rounding); with several, into the fp32 dw_acc
// (the first chunk with beta 0), which then takes dweight's old value and is rounded into
// dweight once.

static int cu_lmhead_xent(float *losses, void *dx, void *dw, st_dtype gdt, const void *x, const void *w,
                          const int32_t *targets, int N, int C, int V, float dloss, int chunk_rows, float *logits_ws,
                          float *dw_acc) {
    if (N <= 0) return 0;
    if (C <= 0 || V <= 0 || chunk_rows <= 0)
        return ft_error("lmhead_xent: bad shape C=%d V=%d chunk of %d rows", C, V, chunk_rows);
    const int dw_f32 = dx && dw ? grad_is_f32("lmhead_xent", gdt) : 0;
    if (dw_f32 < 0) return -1;
    const int several = N > chunk_rows && !dw_f32;   // the fp32 sum needs a scratch of its own
    if (dx && dw && several && !dw_acc)
        return ft_error("lmhead_xent: N=%d rows in chunks of %d need the fp32 dW accumulator", N, chunk_rows);
    for (int n0 = 0; n0 < N; n0 += chunk_rows) {
        const int rows = N - n0 < chunk_rows ? N - n0 : chunk_rows;
        const char *xc = (const char *)x + (size_t)n0 * C * 2;   // (rows, C) bf16
        TRY(gemm_ld(1, 0, V, rows, C, w, C, xc, C, logits_ws, V, 1, 1.0f, 0.0f));
        TRY(ftk_lmhead_xent_rows(losses + n0, logits_ws, targets + n0, rows, V, dx != NULL, g_cuda.stream));
        if (!dx) continue;
        TRY(gemm_ld(0, 0, C, rows, V, w, C, logits_ws, 2 * V, (char *)dx + (size_t)n0 * C * 2, C, 0, dloss, 0.0f));
        if (!dw) continue;   // a frozen lm_head (LoRA)
        if (several)
            TRY(gemm_ld(0, 1, C, V, rows, xc, C, logits_ws, 2 * V, dw_acc, C, 1, dloss, n0 == 0 ? 0.0f : 1.0f));
        else
            TRY(gemm_ld(0, 1, C, V, rows, xc, C, logits_ws, 2 * V, dw, C, dw_f32, dloss, 1.0f));
    }
    if (!dx || !dw || !several) return 0;
    TRY(ftk_accumulate(dw_acc, dw, 0, (size_t)V * C, 1.0f, g_cuda.stream));   // the sum + dweight's old value
    return ftk_cast_from_f32(dw, dw_acc, (size_t)V * C, g_cuda.stream);
}

// ----------------------------------------------------------------------------
// the kernels (kernels/*.cu) on the compute stream

static int cu_embedding_fwd(void *out, const int32_t *tokens, const void *wte, int N, int C, int V) {
    emu_extent(wte, (size_t)V * C * 2);   // (V, C) bf16: the root's part of a gathered-units buffer
    const int rc = ftk_embedding_fwd(out, tokens, wte, N, C, V, g_cuda.stream);
    emu_extent(NULL, 0);
    return rc;
}
static int cu_embedding_bwd(void *dwte, st_dtype gdt, const void *dout, const int32_t *tokens, int N, int C, int V) {
    const int f32 = grad_is_f32("embedding_bwd", gdt);
    if (f32 < 0) return -1;
    emu_extent(dwte, (size_t)V * C * (f32 ? 4 : 2));   // the embedding's part of a gradient unit
    const int rc = ftk_embedding_bwd(dwte, f32, dout, tokens, N, C, V, g_cuda.stream);
    emu_extent(NULL, 0);
    return rc;
}
static int cu_rmsnorm_fwd(void *out, float *rstd, float *amax, const void *inp, const void *w, int N, int C,
                          float eps) {
    emu_extent(w, (size_t)C * 2);   // (C,) bf16: one unit's norm weight
    const int rc = ftk_rmsnorm_fwd(out, rstd, amax, inp, w, N, C, eps, g_cuda.stream);
    emu_extent(NULL, 0);
    return rc;
}
static int cu_rmsnorm_bwd(void *dinp, void *dw, st_dtype gdt, const void *dout, const void *inp, const void *w,
                          const float *rstd, int N, int C) {
    const int f32 = grad_is_f32("rmsnorm_bwd", gdt);
    if (f32 < 0) return -1;
    emu_extent(w, (size_t)C * 2);
    emu_extent(dw, (size_t)C * (f32 ? 4 : 2));   // the weight's gradient: C elements of a gradient unit
    const int rc = ftk_rmsnorm_bwd(dinp, dw, f32, dout, inp, w, rstd, N, C, g_cuda.stream);
    emu_extent(NULL, 0);
    return rc;
}
static int cu_rope_fwd(void *out, const void *inp, const float *cos, const float *sin, int B, int T, int NH, int D,
                       const int32_t *seg) {
    return ftk_rope_fwd(out, inp, cos, sin, B, T, NH, D, seg, g_cuda.stream);
}
static int cu_rope_bwd(void *dinp, const void *dout, const float *cos, const float *sin, int B, int T, int NH, int D,
                       const int32_t *seg) {
    return ftk_rope_bwd(dinp, dout, cos, sin, B, T, NH, D, seg, g_cuda.stream);
}
static int cu_rope_qkv_fwd(void *q, void *k, void *v, const void *qkv, const float *cos, const float *sin, int B, int T,
                           int H, int KVH, int D, const int32_t *seg) {
    return ftk_rope_qkv_fwd(q, k, v, qkv, cos, sin, B, T, H, KVH, D, seg, g_cuda.stream);
}
static int cu_rope_qkv_bwd(void *dqkv, const void *dq, const void *dk, const void *dv, const float *cos,
                           const float *sin, int B, int T, int H, int KVH, int D, const int32_t *seg) {
    return ftk_rope_qkv_bwd(dqkv, dq, dk, dv, cos, sin, B, T, H, KVH, D, seg, g_cuda.stream);
}
// cuDNN attention failed on a shape the startup check did not cover (no engine builds its
// plan, a workspace past the memory plan, an execute error): ONE warning line, then the
// native kernels for the rest of the run. Both write the same (B, H, T) logsumexp, so the
// native backward may follow a cuDNN forward.
static void attention_cudnn_failed(const char *pass) {
    fprintf(stderr, "finetune: warning: --attention cudnn: the %s failed at run time: %s; using the native attention "
            "kernels from now on\n", pass, ft_error_message());
    ft_error_clear();
    g_cuda.attention_cudnn = 0;
}
// cuDNN failed on a head_dim the native kernels do not take either: an error, no fallback
static int attention_no_fallback(const char *pass, int D) {
    char why[512];   // (ft_error keeps the first error: this one replaces cuDNN's, which it quotes)
    snprintf(why, sizeof why, "%s", ft_error_message());
    ft_error_clear();
    return ft_error("--attention cudnn: the %s failed at run time (%s) and the native kernels cannot take over: they "
                    "take head_dim up to %d, the model's is %d", pass, why, ATTN_NATIVE_MAX_HEAD_DIM, D);
}
static int cu_attention_max_head_dim(void) { return g_cuda.attention_cudnn ? 0 : ATTN_NATIVE_MAX_HEAD_DIM; }
// backend.h's attention_prepare: every bucketed length up to T (backend_seq_len), forward and
// backward, through the cuDNN plan cache. A failure falls back to the native kernels (one
// warning) like one at run time.
static int cu_attention_prepare(int B, int T, int H, int KVH, int D, int *built, int *grown) {
    *built = 0;
    *grown = 0;
    if (!g_cuda.attention_cudnn) return 0;
    const backend be = {.seq_bucket = BACKEND_GPU_SEQ_BUCKET};
    int lens[256], n = 0;   // (16 + 8 per doubling past 1024: under 200 for any int T)
    for (int len = 1; len <= T && n < 256; len = lens[n - 1] + 1) lens[n++] = backend_seq_len(&be, len, T);
    if (attn_cudnn_prepare(B, lens, n, H, KVH, D, built, grown) == 0) return 0;
    if (D > ATTN_NATIVE_MAX_HEAD_DIM) return attention_no_fallback("plan build before step 1", D);
    attention_cudnn_failed("plan build before step 1");
    return 0;
}
static void cu_attention_plan_counts(long *built, long *evicted) { attn_cudnn_counts(built, evicted); }
// Segment starts (--pack_attention per_game) always take the native kernels: our cuDNN
// graphs are plain causal (train.c says so once at startup); a head_dim they cannot take is
// an error.
static int attention_segments_native(const int32_t *seg, int D) {
    if (seg && D > ATTN_NATIVE_MAX_HEAD_DIM)
        return ft_error("--pack_attention per_game runs the native attention kernels, which take head_dim up to %d; "
                        "the model's is %d", ATTN_NATIVE_MAX_HEAD_DIM, D);
    return 0;
}
static int cu_attention_fwd(void *out, float *lse, const void *q, const void *k, const void *v, int B, int T, int H,
                            int KVH, int D, const int32_t *seg) {
    TRY(attention_segments_native(seg, D));
    if (g_cuda.attention_cudnn && !seg) {
        if (attn_cudnn_fwd(out, lse, q, k, v, B, T, H, KVH, D) == 0) return 0;
        if (D > ATTN_NATIVE_MAX_HEAD_DIM) return attention_no_fallback("forward", D);
        attention_cudnn_failed("forward");
    }
    return ftk_attention_fwd(out, lse, q, k, v, B, T, H, KVH, D, seg, g_cuda.stream);
}
static int cu_attention_bwd(void *dq, void *dk, void *dv, const void *dout, const void *out, const float *lse,
                            const void *q, const void *k, const void *v, int B, int T, int H, int KVH, int D,
                            const int32_t *seg) {
    TRY(attention_segments_native(seg, D));
    if (g_cuda.attention_cudnn && !seg) {
        if (attn_cudnn_bwd(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KVH, D) == 0) return 0;
        if (D > ATTN_NATIVE_MAX_HEAD_DIM) return attention_no_fallback("backward", D);
        attention_cudnn_failed("backward");
    }
    return ftk_attention_bwd(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KVH, D, seg, g_cuda.stream);
}
static int cu_swiglu_fwd(void *out, float *amax, const void *gate, const void *up, int N, int F, int ld) {
    return ftk_swiglu_fwd(out, amax, gate, up, N, F, ld, g_cuda.stream);
}
static int cu_swiglu_bwd(void *dgate, void *dup, const void *dout, const void *gate, const void *up, int N, int F,
                         int ld) {
    return ftk_swiglu_bwd(dgate, dup, dout, gate, up, N, F, ld, g_cuda.stream);
}
static int cu_scale(void *out, const void *inp, float alpha, size_t n) { return ftk_scale(out, inp, alpha, n, g_cuda.stream); }
static int cu_adamw(float *master, void *param, const float *grad, void *m, void *v, st_dtype mdt, size_t n,
                    const adamw_params *p) {
    if (mdt != ST_F32 && mdt != ST_BF16)
        return ft_error("cuda adamw: moments dtype %s is not supported", st_dtype_name(mdt));
    // (n,) of each: one entry of a unit's slice of the flat buffers (a gather reads another
    // unit's working parameters meanwhile when the update runs in the backward: fsdp.c)
    emu_extent(master, n * sizeof *master);
    if (param) emu_extent(param, n * 2);   // bf16
    emu_extent(grad, n * sizeof *grad);
    emu_extent(m, n * st_dtype_size(mdt));
    emu_extent(v, n * st_dtype_size(mdt));
    const int rc = ftk_adamw(master, param, grad, m, v, mdt == ST_BF16, n, p, g_cuda.stream);
    emu_extent(NULL, 0);
    return rc;
}
static int cu_sum_squares(double *host_out, const float *x, size_t n) {
    // the kernel's own host synchronisation then waits for its two kernels only
    TRY(compute_wait("gradient norm", n * sizeof(float)));
    return ftk_sum_squares(host_out, x, n, g_cuda.stream);
}
static int cu_sum_squares_accumulate(double *acc, const float *x, size_t n) {
    emu_extent(x, n * sizeof(float));   // (n,) fp32: one unit's gradient slice
    const int rc = ftk_sum_squares_accumulate(acc, x, n, g_cuda.stream);
    emu_extent(NULL, 0);
    return rc;
}
static int cu_accumulate(float *dst, const void *src, st_dtype src_dtype, size_t n, float alpha) {
    if (src_dtype != ST_BF16 && src_dtype != ST_F32)
        return ft_error("cuda accumulate: source dtype %s (BF16 or F32 only)", st_dtype_name(src_dtype));
    emu_extent(dst, n * sizeof(float));   // (n,) fp32: one unit's gradient slice
    const int rc = ftk_accumulate(dst, src, src_dtype == ST_F32, n, alpha, g_cuda.stream);
    emu_extent(NULL, 0);
    return rc;
}
static int cu_cast_from_f32(void *dst, const float *src, size_t n) { return ftk_cast_from_f32(dst, src, n, g_cuda.stream); }
static int cu_loss_accumulate(double *acc, const float *losses, const int32_t *targets, int N) {
    return ftk_loss_accumulate(acc, losses, targets, N, g_cuda.stream);
}

// Call k waits for the mark of call k - LAG (recorded LAG layers ago), then records its own
// in the slot that mark k - LAG - 1 held (waited for by call k - 1). A wait rarely blocks
// for long: the device still has the LAG layers queued since (a 7B layer's backward is
// about 30 launches and milliseconds of work; queueing it takes the host a fraction of one).
static int cu_pace(void) {
    const long k = g_cuda.pace_calls++;
    if (k >= BACKEND_PACE_LAG) {
        cudaEvent_t e = g_cuda.pace_mark[(k - BACKEND_PACE_LAG) % (BACKEND_PACE_LAG + 1)];
        if (watchdog_enabled()) TRY(watchdog_wait(poll_event, e, "pacing: the work of two layers back", "compute stream", 0));
        else CHECK_CUDA(cudaEventSynchronize(e));
    }
    CHECK_CUDA(cudaEventRecord(g_cuda.pace_mark[k % (BACKEND_PACE_LAG + 1)], g_cuda.stream));
    return 0;
}

static void backend_cuda_arena_usage(size_t *capacity, size_t *high_water);

static const backend CUDA_BACKEND = {
    .name = "cuda",
    .dtype = ST_BF16,
    .seq_bucket = BACKEND_GPU_SEQ_BUCKET,   // bounded shapes: 16 lengths up to 1024, 8 more per doubling (backend_seq_len)
    .attention_max_head_dim = cu_attention_max_head_dim,
    .attention_prepare = cu_attention_prepare,
    .attention_plan_counts = cu_attention_plan_counts,
    .close = backend_cuda_close,
    .describe = backend_cuda_describe,
    .peak_tflops = backend_cuda_peak_tflops,
    .arena_usage = backend_cuda_arena_usage,
    .alloc = cu_alloc,
    .free = cu_free,
    .copy_h2d = cu_copy_h2d,
    .copy_d2h = cu_copy_d2h,
    .copy_d2d = cu_copy_d2d,
    .zero = cu_zero,
    .synchronize = cu_synchronize,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .copy_async = cu_copy_async,
    .copy_wait = cu_copy_wait,
    .upload = cu_upload,
    .embedding_fwd = cu_embedding_fwd,
    .embedding_bwd = cu_embedding_bwd,
    .rmsnorm_fwd = cu_rmsnorm_fwd,
    .rmsnorm_bwd = cu_rmsnorm_bwd,
    .rope_fwd = cu_rope_fwd,
    .rope_bwd = cu_rope_bwd,
    .rope_qkv_fwd = cu_rope_qkv_fwd,
    .rope_qkv_bwd = cu_rope_qkv_bwd,
    .matmul_fwd = cu_matmul_fwd,
    .matmul_bwd = cu_matmul_bwd,
    .attention_fwd = cu_attention_fwd,
    .attention_bwd = cu_attention_bwd,
    .swiglu_fwd = cu_swiglu_fwd,
    .swiglu_bwd = cu_swiglu_bwd,
    .scale = cu_scale,
    .lmhead_xent = cu_lmhead_xent,
    .adamw = cu_adamw,
    .sum_squares = cu_sum_squares,
    .sum_squares_accumulate = cu_sum_squares_accumulate,
    .accumulate = cu_accumulate,
    .cast_from_f32 = cu_cast_from_f32,
    .loss_accumulate = cu_loss_accumulate,
    .fp8_quantize = cu_fp8_quantize,
    .fp8_cast = cu_fp8_cast,
    .matmul_fp8 = cu_matmul_fp8,
    .pace = cu_pace,
};

// ----------------------------------------------------------------------------
// open / close

int backend_cuda_device_count(int *count) {
    *count = 0;
    cudaError_t e = cudaGetDeviceCount(count);
    if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice || e == cudaErrorInitializationError ||
        e == cudaErrorSystemDriverMismatch || e == cudaErrorCompatNotSupportedOnDevice) {
        *count = 0;
        return ft_error("flag --device cuda: no usable GPU on this machine (cudaGetDeviceCount: %s); "
                        "run with --device cpu", cudaGetErrorString(e));
    }
    CHECK_CUDA_STATUS(e, "cudaGetDeviceCount");
    if (*count == 0) return ft_error("flag --device cuda: the CUDA driver sees no device; run with --device cpu");
    return 0;
}

const char *backend_cuda_describe(void) { return g_cuda.open ? g_cuda.name : "cuda (not open)"; }

double backend_cuda_peak_tflops(void) {
    if (!g_cuda.open) return 0;
    if (strstr(g_cuda.device_name, "H100") && strstr(g_cuda.device_name, "PCIe")) return 756;
    if (strstr(g_cuda.device_name, "H100") && strstr(g_cuda.device_name, "NVL")) return 835;   // per GPU of the pair
    if (strstr(g_cuda.device_name, "H100") || strstr(g_cuda.device_name, "H200")) return 989;
    if (strstr(g_cuda.device_name, "A100")) return 312;
    return 0;
}
// the arena's bytes and high-water mark (backend.h's arena_usage; 0 and 0 when not open)
static void backend_cuda_arena_usage(size_t *capacity, size_t *high_water) {
    *capacity = g_cuda.open ? g_cuda.ar.capacity : 0;
    *high_water = g_cuda.open ? g_cuda.ar.top : 0;
}
void *backend_cuda_stream(void) { return (void *)g_cuda.stream; }

// Release whatever open_device created (also after a partial failure).
void backend_cuda_close(void) {
    if (g_cuda.stream) (void)compute_wait("close", 0);
    if (g_cuda.copy_stream) (void)cudaStreamSynchronize(g_cuda.copy_stream);
    ftk_set_scratch_allocator(NULL, NULL);
    attn_cudnn_close();
    for (int i = 0; i < g_cuda.n_plans; i++) gemm_plan_destroy(&g_cuda.plans[i]);
    arena_destroy(&g_cuda.ar);
    if (g_cuda.lt) cublasLtDestroy(g_cuda.lt);
    if (g_cuda.arena_mem) cudaFree(g_cuda.arena_mem);
    for (int i = 0; i < BACKEND_COPY_TICKETS; i++)
        if (g_cuda.copy_done[i]) cudaEventDestroy(g_cuda.copy_done[i]);
    if (g_cuda.compute_mark) cudaEventDestroy(g_cuda.compute_mark);
    for (int i = 0; i <= BACKEND_PACE_LAG; i++)
        if (g_cuda.pace_mark[i]) cudaEventDestroy(g_cuda.pace_mark[i]);
    if (g_cuda.copy_stream) cudaStreamDestroy(g_cuda.copy_stream);
    if (g_cuda.stream) cudaStreamDestroy(g_cuda.stream);
    const int native = g_cuda.attention_native, det = g_cuda.deterministic;   // settings, not state: kept for the next open
    memset(&g_cuda, 0, sizeof g_cuda);
    g_cuda.attention_native = native;
    g_cuda.deterministic = det;
}

// 1 when this build holds code the device can run: a cubin for sm_XY runs on devices X.Z with
// Z >= Y, PTX for compute_XY is compiled by the driver for XY and newer. FT_CUDA_CODES lists
// them ("sm_80 sm_90", from the nvcc flags in kernels/kernels.mk); empty = unknown (let the
// driver decide at the first launch).
static int build_runs_on(int major, int minor) {
    const char *p = FT_CUDA_CODES;
    if (!*p) return 1;
    for (; p; p = strchr(p, ' ')) {
        int v = 0;
        p += *p == ' ';
        if (sscanf(p, "sm_%d", &v) == 1 && v / 10 == major && v % 10 <= minor) return 1;
        if (sscanf(p, "compute_%d", &v) == 1 && v <= major * 10 + minor) return 1;
    }
    return 0;
}

// The device's architecture and free memory against what this build and this job need.
static int check_device(const struct cudaDeviceProp *prop, size_t arena_bytes, size_t free_b) {
    if (prop->major < 8)
        return ft_error("flag --device cuda: device %d (%s) is sm_%d%d; the kernels need sm_80 or newer (bf16)", g_cuda.device,
                        prop->name, prop->major, prop->minor);
    if (!build_runs_on(prop->major, prop->minor))
        return ft_error("flag --device cuda: device %d (%s) is sm_%d%d, and this build has kernels for %s only; add "
                        "-gencode arch=compute_%d%d,code=sm_%d%d to NVCC_ARCH_FLAGS (kernels/kernels.mk) and rebuild",
                        g_cuda.device, prop->name, prop->major, prop->minor, FT_CUDA_CODES, prop->major, prop->minor,
                        prop->major, prop->minor);
    if (arena_bytes > free_b)
        return ft_error("flag --device cuda: the memory plan needs %.2f GiB on device %d (%s) but %.2f GiB are free; "
                        "lower --batch_size_per_device or --seq_len, or add --gradient_checkpointing, --offload_optimizer, "
                        "--lora_rank or GPUs (--dry_run prints the plan and what each of these would need)", arena_bytes / 1073741824.0, g_cuda.device, prop->name,
                        free_b / 1073741824.0);
    return 0;
}

int backend_cuda_select_device(int local_rank, int *device) {
    int count = 0;
    TRY(backend_cuda_device_count(&count));
    // one GPU per rank: the caller passes the rank's place among the ranks of its node that
    // see the same GPUs (launch.c device_select; the local rank without MPI), taken modulo
    // the visible count. Two ranks left on one GPU are refused by NCCL's init ("Duplicate GPU
    // detected", in its error line: comm_nccl.c nccl_last_error).
    if (local_rank < 0) return ft_error("flag --device cuda: local rank %d", local_rank);
    *device = local_rank % count;
    CHECK_CUDA(cudaSetDevice(*device));
    return 0;
}

int backend_cuda_device_memory(int local_rank, size_t *total_bytes, char *name, size_t name_len) {
    int count = 0;
    TRY(backend_cuda_device_count(&count));
    if (local_rank < 0) return ft_error("flag --device cuda: local rank %d", local_rank);
    struct cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, local_rank % count));
    *total_bytes = prop.totalGlobalMem;
    snprintf(name, name_len, "%s", prop.name);
    return 0;
}

int backend_cuda_free_bytes(size_t *free_bytes) {
    size_t total = 0;
    CHECK_CUDA(cudaMemGetInfo(free_bytes, &total));
    return 0;
}

static int open_device(int local_rank, size_t arena_bytes) {
    TRY(backend_cuda_select_device(local_rank, &g_cuda.device));
    struct cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, g_cuda.device));
    snprintf(g_cuda.device_name, sizeof g_cuda.device_name, "%s", prop.name);
    g_cuda.cc = prop.major * 10 + prop.minor;
    size_t free_b = 0, total_b = 0;
    CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
    // 0 = take most of what is free (leave room for the CUDA context, NCCL and cuBLASLt)
    if (arena_bytes == 0) arena_bytes = free_b / 100 * 92;
    arena_bytes += LT_WORKSPACE_BYTES;
    TRY(check_device(&prop, arena_bytes, free_b));
    CHECK_CUDA(cudaStreamCreateWithFlags(&g_cuda.stream, cudaStreamNonBlocking));
    CHECK_CUDA(cudaStreamCreateWithFlags(&g_cuda.copy_stream, cudaStreamNonBlocking));
    CHECK_CUDA(cudaEventCreateWithFlags(&g_cuda.compute_mark, cudaEventDisableTiming));
    for (int i = 0; i <= BACKEND_PACE_LAG; i++)
        CHECK_CUDA(cudaEventCreateWithFlags(&g_cuda.pace_mark[i], cudaEventDisableTiming));
    for (int i = 0; i < BACKEND_COPY_TICKETS; i++)
        CHECK_CUDA(cudaEventCreateWithFlags(&g_cuda.copy_done[i], cudaEventDisableTiming));
    CHECK_CUDA(cudaMalloc(&g_cuda.arena_mem, arena_bytes));
    TRY(arena_init(&g_cuda.ar, g_cuda.arena_mem, arena_bytes, ARENA_ALIGN));
    if (!(g_cuda.lt_workspace = cu_alloc(LT_WORKSPACE_BYTES))) return -1;
    CHECK_CUBLAS(cublasLtCreate(&g_cuda.lt));
    ftk_set_scratch_allocator(cu_alloc, scratch_release);   // kernels' workspace from the arena too
    snprintf(g_cuda.name, sizeof g_cuda.name, "cuda device %d (%.64s, sm_%d%d, arena %.2f GiB of %.2f)", g_cuda.device, prop.name,
             prop.major, prop.minor, arena_bytes / 1073741824.0, total_b / 1073741824.0);
    return 0;
}

int backend_cuda_set_attention(const char *mode, int deterministic) {
    if (strcmp(mode, "cudnn") != 0 && strcmp(mode, "native") != 0)
        return ft_error("flag --attention: '%s' is not one of cudnn|native", mode);
    g_cuda.attention_native = strcmp(mode, "native") == 0;
    g_cuda.deterministic = deterministic != 0;
    attn_cudnn_set_deterministic(deterministic);
    return 0;
}

const char *backend_cuda_attention(void) { return g_cuda.attention_cudnn ? "cudnn" : "native"; }

// --attention cudnn: open cuDNN and run the startup check (attn_cudnn_selfcheck); on any failure
// ONE warning line names the reason and attention stays on the native kernels.
static void attention_select(void) {
    if (g_cuda.attention_native) return;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = attn_cudnn_open(g_cuda.stream, cu_alloc, scratch_release);
    if (rc == 0) rc = attn_cudnn_selfcheck(&CUDA_BACKEND, &g_cuda.check_nmse);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    g_cuda.check_seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (rc == 0) {
        g_cuda.attention_cudnn = g_cuda.attention_checked = 1;
        return;
    }
    fprintf(stderr, "finetune: warning: --attention cudnn: %s; using the native attention kernels\n",
            ft_error_message());
    ft_error_clear();
    attn_cudnn_close();
}

int backend_cuda_attention_use(int cudnn) {
    if (cudnn && !g_cuda.attention_checked)
        return ft_error("cuda backend: cuDNN attention is not available (--attention native, or its startup check failed)");
    g_cuda.attention_cudnn = cudnn;
    return 0;
}

int backend_cuda_open(int local_rank, size_t arena_bytes, const backend **out) {
    if (g_cuda.open) return ft_error("cuda backend: already open");
    if (open_device(local_rank, arena_bytes) != 0) {
        backend_cuda_close();
        return -1;
    }
    attention_select();
    const size_t len = strlen(g_cuda.name);
    if (g_cuda.attention_cudnn)   // the startup check's cost (cuDNN's plans, compiled by NVRTC) and margin
        snprintf(g_cuda.name + len, sizeof g_cuda.name - len, ", attention cudnn (%sstartup check %.2f s, worst NMSE %.1e)",
                 g_cuda.deterministic ? "deterministic backward; " : "", g_cuda.check_seconds, g_cuda.check_nmse);
    else
        snprintf(g_cuda.name + len, sizeof g_cuda.name - len, ", attention native");
    g_cuda.open = 1;
    *out = &CUDA_BACKEND;
    return 0;
}
