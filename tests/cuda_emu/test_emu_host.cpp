// test_emu_host.cpp: what the emulated cuBLASLt and NCCL (cuda_emu_host.cpp) reject because a
// GPU would give wrong numbers without an error: a GEMM whose D overlaps A, B or (other than
// in place) C; a collective whose send and receive buffers overlap other than in NCCL's
// in-place forms. The accepted forms (in place, disjoint) must still run. NCCL over MPI with
// one rank (a singleton MPI_Init, no mpiexec); without MPI only the cuBLASLt part runs.
#include "cuda_emu.h"

#include <cublasLt.h>
#include <nccl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#ifdef FT_HAVE_MPI
#include <mpi.h>
#endif

#include "test.h"

static cublasLtHandle_t lt;

// D (m, n) = A (m, k) B (k, n) + beta C, bf16, column-major, packed; the status
static cublasStatus_t gemm(int m, int n, int k, const void *A, const void *B, const void *C, void *D, float beta) {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, m, k, m);
    cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, k, n, k);
    cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, m, n, m);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
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
