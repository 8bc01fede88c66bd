// test_emu_host.cpp: what the emulated cuBLASLt and NCCL (cuda_emu_host.cpp) reject because a
// GPU would give wrong numbers without an error: a GEMM whose D overlaps A, B or (other than
// in place) C; a collective whose send and receive buffers overlap other than in NCCL's
// in-place forms. The accepted forms (in place, disjoint) must still run. NCCL over MPI with
// one rank (a singleton MPI_Init, no mpiexec); without MPI only the cuBLASLt part runs. The
// emulated FP8 GEMM's arithmetic (scale pointers) and Hopper's FP8 rules are checked too.
#include "cuda_emu.h"

#include <cublasLt.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef FT_HAVE_MPI
#include <mpi.h>
#endif

#include "test.h"

static cublasLtHandle_t lt;

// D = alpha op(A) op(B) + beta C with alpha 1, C and D of layout c, by the heuristic's first
// algorithm (NOT_SUPPORTED when it finds none), waited for; then the descriptors are destroyed
static uint32_t g_align_cd;   // 0: the preference's default; else C's and D's alignment in bytes

static cublasStatus_t run_gemm(cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                               cublasLtMatrixLayout_t c, const void *A, const void *B, const void *C, void *D,
                               float beta) {
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    if (g_align_cd) {   // what C and D are known to guarantee (the backend sets it from its pointers)
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &g_align_cd, sizeof g_align_cd);
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &g_align_cd, sizeof g_align_cd);
    }
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, c, pref, 1, &res, &found);
    const float alpha = 1.0f;
    cublasStatus_t st = found ? cublasLtMatmul(lt, op, &alpha, A, a, B, b, &beta, C, c, D, c, &res.algo, nullptr, 0,
                                               nullptr)
                              : CUBLAS_STATUS_NOT_SUPPORTED;
    cudaDeviceSynchronize();
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatmulDescDestroy(op);
    return st;
}

// D (m, n) = A (m, k) B (k, n) + beta C, bf16, column-major, packed; the status
static cublasStatus_t gemm(int m, int n, int k, const void *A, const void *B, const void *C, void *D, float beta) {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, m, k, m);
    cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, k, n, k);
    cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, m, n, m);
    return run_gemm(op, a, b, c, A, B, C, D, beta);
}

static void test_gemm_aliasing(void) {
    char *buf = nullptr;
    cudaMalloc((void **)&buf, 4096);
    cudaMemset(buf, 0, 4096);
    char *A = buf, *B = buf + 1024, *C = buf + 2048, *D = buf + 3072;   // 16 x 16 bf16 = 512 bytes each
    EXPECT(gemm(16, 16, 16, A, B, C, D, 1.0f) == CUBLAS_STATUS_SUCCESS, "disjoint operands run");
    EXPECT(gemm(16, 16, 16, A, B, D, D, 1.0f) == CUBLAS_STATUS_SUCCESS, "in place (C == D) runs");
    cuemu_set_quiet(1);
    EXPECT(gemm(16, 16, 16, A, B, C, A + 256, 0.0f) == CUBLAS_STATUS_INVALID_VALUE, "D overlapping A is rejected");
    EXPECT(gemm(16, 16, 16, A, B, C, B, 0.0f) == CUBLAS_STATUS_INVALID_VALUE, "D == B is rejected");
    EXPECT(gemm(16, 16, 16, A, B, C, C + 256, 1.0f) == CUBLAS_STATUS_INVALID_VALUE,
           "D overlapping C (C != D, beta 1) is rejected");
    cuemu_set_quiet(0);
    cudaFree(buf);
}

// D (m, n, d_type: bf16 or fp32) = scales * op(A) op(B) + beta D with FP8 A (type ta_type,
// transposed when ta) and B (not transposed), packed; the status (NOT_SUPPORTED when the
// heuristic finds no algorithm)
static cublasStatus_t gemm_fp8_d(bool ta, int m, int n, int k, cudaDataType_t a_type, cudaDataType_t b_type,
                                 const void *A, const void *B, void *D, const float *scales, cudaDataType_t d_type,
                                 float beta) {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    const cublasOperation_t t = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    const float *sa = scales, *sb = scales + 1;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb);
    cublasLtMatrixLayoutCreate(&a, a_type, ta ? k : m, ta ? m : k, ta ? k : m);
    cublasLtMatrixLayoutCreate(&b, b_type, k, n, k);
    cublasLtMatrixLayoutCreate(&d, d_type, m, n, m);
    return run_gemm(op, a, b, d, A, B, D, D, beta);
}
// ... into a bf16 D, beta 0
static cublasStatus_t gemm_fp8(bool ta, int m, int n, int k, cudaDataType_t a_type, cudaDataType_t b_type,
                               const void *A, const void *B, void *D, const float *scales) {
    return gemm_fp8_d(ta, m, n, k, a_type, b_type, A, B, D, scales, CUDA_R_16BF, 0.0f);
}

// The emulated FP8 GEMM: codes decoded, scales applied when it runs, a bf16 or an fp32 D
// (beta 1: added to); Hopper's rules refused (an sm_80 device, NN layout, ld not a multiple
// of 16, E5M2 x E5M2, a D not 16-byte aligned)
static void test_gemm_fp8(void) {
    unsigned char *A = nullptr, *B = nullptr;
    uint16_t *D = nullptr;
    float *scales = nullptr;
    cudaMalloc((void **)&A, 1024), cudaMalloc((void **)&B, 1024), cudaMalloc((void **)&D, 1024);
    cudaMalloc((void **)&scales, 8);
    memset(A, 0x38, 1024);   // e4m3 1.0
    memset(B, 0x40, 1024);   // e4m3 2.0 (e5m2 0x40: 2.0 as well)
    const float sc[2] = {0.5f, 3.0f};
    memcpy(scales, sc, sizeof sc);
    setenv("FT_EMU_COMPUTE_CAPABILITY", "9.0", 1);
    EXPECT(gemm_fp8(true, 16, 16, 32, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, A, B, D, scales) == CUBLAS_STATUS_SUCCESS,
           "TN e4m3 GEMM runs");
    const uint16_t want = 0x42c0;   // bf16 96 = 0.5 * 3 * (32 terms of 1 * 2)
    EXPECT(D[0] == want && D[255] == want, "D = scaleA scaleB sum: 0x%04x 0x%04x, want 0x%04x", D[0], D[255], want);
    EXPECT(gemm_fp8(true, 16, 16, 32, CUDA_R_8F_E5M2, CUDA_R_8F_E4M3, A, B, D, scales) == CUBLAS_STATUS_SUCCESS,
           "TN e5m2 x e4m3 runs");
    // an fp32 C = D added to (beta 1): the weight gradient's GEMM into an fp32 gradient
    float *F = (float *)(void *)D;
    for (int i = 0; i < 256; i++) F[i] = 1.5f;
    EXPECT(gemm_fp8_d(true, 16, 16, 32, CUDA_R_8F_E5M2, CUDA_R_8F_E4M3, A, B, F, scales, CUDA_R_32F, 1.0f) ==
           CUBLAS_STATUS_SUCCESS, "TN e5m2 x e4m3 into fp32, beta 1, runs");
    // (A's 0x38 read as e5m2 is 0.5: 0.5 * 3 * (32 terms of 0.5 * 2) + 1.5, exact in fp32)
    EXPECT(F[0] == 49.5f && F[255] == 49.5f, "fp32 D = scaleA scaleB sum + C: %g %g, want 49.5", F[0], F[255]);
    EXPECT(gemm_fp8(false, 16, 16, 32, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, A, B, D, scales) == CUBLAS_STATUS_NOT_SUPPORTED,
           "NN FP8 has no algorithm");
    EXPECT(gemm_fp8(true, 16, 16, 24, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, A, B, D, scales) == CUBLAS_STATUS_NOT_SUPPORTED,
           "lda 24 has no algorithm");
    EXPECT(gemm_fp8(true, 16, 16, 32, CUDA_R_8F_E5M2, CUDA_R_8F_E5M2, A, B, D, scales) == CUBLAS_STATUS_NOT_SUPPORTED,
           "e5m2 x e5m2 has no algorithm");
    g_align_cd = 2;   // a D one bf16 element past an aligned one: the heuristic finds no FP8 algorithm
    EXPECT(gemm_fp8(true, 16, 16, 32, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, A, B, D + 1, scales) == CUBLAS_STATUS_NOT_SUPPORTED,
           "D not 16-byte aligned has no FP8 algorithm");
    g_align_cd = 8;
    EXPECT(gemm_fp8(true, 16, 16, 32, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, A, B, D + 4, scales) == CUBLAS_STATUS_NOT_SUPPORTED,
           "D 8-byte aligned has no FP8 algorithm");
    g_align_cd = 16;
    EXPECT(gemm_fp8(true, 16, 16, 32, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, A, B, D + 8, scales) == CUBLAS_STATUS_SUCCESS,
           "D 16-byte aligned runs");
    g_align_cd = 0;
    unsetenv("FT_EMU_COMPUTE_CAPABILITY");
    EXPECT(gemm_fp8(true, 16, 16, 32, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, A, B, D, scales) == CUBLAS_STATUS_NOT_SUPPORTED,
           "no FP8 on the default sm_80");
    cudaFree(A), cudaFree(B), cudaFree(D), cudaFree(scales);
}

#ifdef FT_HAVE_MPI
static void test_nccl_overlap(void) {
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    ncclComm_t comm = nullptr;
    EXPECT(ncclCommInitRank(&comm, 1, id, 0) == ncclSuccess, "one-rank communicator");
    if (!comm) return;
    float *buf = nullptr;
    cudaMalloc((void **)&buf, 64 * sizeof(float));
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    EXPECT(ncclAllGather(buf, buf, 8, ncclFloat32, comm, s) == ncclSuccess, "in-place all-gather (rank 0)");
    EXPECT(ncclAllGather(buf, buf + 16, 8, ncclFloat32, comm, s) == ncclSuccess, "disjoint all-gather");
    EXPECT(ncclReduceScatter(buf, buf, 8, ncclFloat32, ncclSum, comm, s) == ncclSuccess, "in-place reduce-scatter");
    EXPECT(ncclAllReduce(buf, buf, 8, ncclFloat32, ncclSum, comm, s) == ncclSuccess, "in-place all-reduce");
    cuemu_set_quiet(1);
    EXPECT(ncclAllGather(buf + 4, buf, 8, ncclFloat32, comm, s) == ncclInvalidArgument,
           "all-gather with overlapping buffers (not in place) is rejected");
    EXPECT(ncclReduceScatter(buf, buf + 4, 8, ncclFloat32, ncclSum, comm, s) == ncclInvalidArgument,
           "reduce-scatter with overlapping buffers (not in place) is rejected");
    EXPECT(ncclAllReduce(buf, buf + 4, 8, ncclFloat32, ncclSum, comm, s) == ncclInvalidArgument,
           "all-reduce with overlapping buffers (not in place) is rejected");
    cuemu_set_quiet(0);
    cudaStreamSynchronize(s);
    ncclCommDestroy(comm);
    cudaStreamDestroy(s);
    cudaFree(buf);
}
#endif

int main(int argc, char **argv) {
    alarm(60);
#ifdef FT_HAVE_MPI
    MPI_Init(&argc, &argv);
#else
    (void)argc; (void)argv;
#endif
    cublasLtCreate(&lt);
    test_gemm_aliasing();
    test_gemm_fp8();
#ifdef FT_HAVE_MPI
    test_nccl_overlap();
#endif
    cublasLtDestroy(lt);
    EXPECT(cuemu_hazard_count() == 0, "hazards: %llu", cuemu_hazard_count());
#ifdef FT_HAVE_MPI
    MPI_Finalize();
#endif
    TEST_SUMMARY("test_emu_host");
}
