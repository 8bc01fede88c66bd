// test_emu_vclock.cu: the emulator's virtual clock (FT_EMU_VCLOCK; README.md, "Virtual clock")
// on small programs whose virtual times follow from the rules by hand; tests/test_emu_vclock.sh
// runs it. The expected times are sums and maxima of the prices of src/plan_price.c (I: the
// host's issue cost per operation, FT_EMU_VCLOCK_ISSUE_US or the 8 us floor; K: a kernel
// touching two 16 MiB allocations, > I on the A100, so an addition and a maximum give
// different answers):
//   1. two kernels on one stream add: I + 2K (and cudaEventElapsedTime around them says so)
//   2. on two streams with no dependency they overlap: 2I + K, not I + 2K
//   3. an event wait serialises them: I + 2K
//   4. a host sync, then a launch: it starts after the sync, 2I + 2K
//   5. a cuBLASLt GEMM of m = n = k = 1024 costs I + 2 m n k / (the GEMM rate)
//   6. (2 ranks, mpiexec) an all-gather that rank 1 joins late (behind a kernel) completes at
//      that late start + the collective's price on both ranks: I + K + C
// FT_EMU_VCLOCK defaults to a100 here. With the clock off ("off" as argument):
// cuemu_vclock_now() is -1 and cudaEventElapsedTime is not supported (the clock changes
// nothing else: the script compares a training run's losses with and without it).
#include "cuda_emu.h"

#include <cublasLt.h>
#include <mpi.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan_price.h"
#include "test.h"

extern "C" double cuemu_vclock_now(void);

__global__ void k_copy(float *out, const float *in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i];
}

static const size_t BIG = (size_t)4 << 20;   // floats per allocation: 16 MiB
static float *a, *b, *c, *d;
static cudaStream_t s1, s2;
static const plan_device *dev;
static double I, K;

// a kernel that reads `in` and writes `out` (1024 elements; its price counts both allocations)
static void kernel(float *out, const float *in, cudaStream_t s) { LAUNCH_KERNEL(dim3(4), dim3(256), 0, s, k_copy)(out, in, 1024); }

static bool near(double x, double want) { return fabs(x - want) <= 1e-9 * fabs(want) + 1e-12; }

// the host's virtual time after a full synchronisation
static double settle(void) {
    cudaDeviceSynchronize();
    return cuemu_vclock_now();
}

static void test_streams(void) {
    double t0 = settle();
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventRecord(e0, s1);
    kernel(a, b, s1);
    kernel(c, d, s1);
    cudaEventRecord(e1, s1);
    cudaStreamSynchronize(s1);
    double dt = cuemu_vclock_now() - t0;
    EXPECT(near(dt, I + 2 * K), "1. two kernels on one stream: %.9f s, want I + 2K = %.9f", dt, I + 2 * K);
    float ms = -1;
    EXPECT(cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess && fabs(ms - 1e3 * (I + 2 * K)) < 1e-6,
           "1. cudaEventElapsedTime %.6f ms, want %.6f", ms, 1e3 * (I + 2 * K));

    t0 = settle();
    kernel(a, b, s1);
    kernel(c, d, s2);
    dt = settle() - t0;
    EXPECT(near(dt, 2 * I + K), "2. two streams overlap: %.9f s, want 2I + K = %.9f", dt, 2 * I + K);

    t0 = settle();
    kernel(a, b, s1);
    cudaEventRecord(e0, s1);
    cudaStreamWaitEvent(s2, e0, 0);
    kernel(c, d, s2);
    dt = settle() - t0;
    EXPECT(near(dt, I + 2 * K), "3. an event wait serialises: %.9f s, want I + 2K = %.9f", dt, I + 2 * K);

    t0 = settle();
    kernel(a, b, s1);
    cudaStreamSynchronize(s1);
    const double mid = cuemu_vclock_now() - t0;
    kernel(c, d, s2);
    dt = settle() - t0;
    EXPECT(near(mid, I + K) && near(dt, 2 * I + 2 * K), "4. host sync at %.9f (want %.9f), then a launch: %.9f s, want %.9f",
           mid, I + K, dt, 2 * I + 2 * K);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}

static void test_gemm(void) {
    const int m = 1024;
    // zero operands (A, B and D square, bf16, one layout), then the product timed alone
    cudaMemset(a, 0, (size_t)m * m * 2);
    cudaMemset(b, 0, (size_t)m * m * 2);
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t l;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasLtCreate(&lt);
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatrixLayoutCreate(&l, CUDA_R_16BF, m, m, m);
    cublasLtMatmulAlgoGetHeuristic(lt, op, l, l, l, l, pref, 1, &res, &found);
    const double t0 = settle();
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t st = cublasLtMatmul(lt, op, &one, a, l, b, l, &zero, c, l, c, l, &res.algo, nullptr, 0, s1);
    const double dt = settle() - t0;
    const double want = I + plan_price_op(plan_price_gemm(dev, 2.0 * m * m * m), 1);
    EXPECT(found && st == CUBLAS_STATUS_SUCCESS && near(dt, want), "5. GEMM %d^3: %.9f s, want %.9f", m, dt, want);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(l);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(lt);
}

// 6: rank 1 joins the all-gather behind a kernel; both ranks see it end at its late start + C
static void test_collective(int rank, int size) {
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    ncclComm_t comm;
    EXPECT(ncclCommInitRank(&comm, size, id, rank) == ncclSuccess, "6. ncclCommInitRank");
    // first the ranks' clocks meet: a small all-reduce, awaited
    ncclAllReduce(d, d, 16, ncclFloat32, ncclSum, comm, s1);
    const double t0 = settle();
    double lo = 0, hi = 0;
    MPI_Allreduce(&t0, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&t0, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    EXPECT(lo == hi, "6. after an awaited all-reduce the ranks' host clocks agree: %.9f .. %.9f", lo, hi);
    if (rank == 1) kernel(a, b, s1);
    const size_t bytes = 1 << 20;
    ncclAllGather((char *)c + rank * bytes, c, bytes / 2, ncclBfloat16, comm, s1);
    const double dt = settle() - t0;
    const char *g = getenv("FT_EMU_VCLOCK_GPUS_PER_NODE");
    const int per_node = g && atoi(g) > 0 ? atoi(g) : dev->gpus_per_node;
    const double C = plan_price_collective(dev, PLAN_COLL_ALL_GATHER, (double)bytes, size,
                                           plan_group_nodes(0, 1, size, per_node));
    EXPECT(near(dt, I + K + C), "6. rank %d: the all-gather ends at %.9f s, want the late start I + K + C = %.9f "
           "(%s)", rank, dt, I + K + C, size > per_node ? "across nodes" : "within a node");
    ncclCommDestroy(comm);
}

int main(int argc, char **argv) {
    // (before the runtime reads it, which MPI_Init's wrapper does): the A100's prices unless
    // told, the clock off with "off"
    const bool off = argc > 1 && !strcmp(argv[1], "off");
    if (off) unsetenv("FT_EMU_VCLOCK");
    else if (!getenv("FT_EMU_VCLOCK")) setenv("FT_EMU_VCLOCK", "a100", 1);
    MPI_Init(&argc, &argv);
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    cudaMalloc((void **)&a, BIG * 4);
    cudaMalloc((void **)&b, BIG * 4);
    cudaMalloc((void **)&c, BIG * 4);
    cudaMalloc((void **)&d, BIG * 4);
    cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    if (off) {
        cudaEvent_t e;
        cudaEventCreate(&e);
        cudaEventRecord(e, s1);
        cudaEventSynchronize(e);
        float ms = 0;
        EXPECT(cuemu_vclock_now() == -1, "off: cuemu_vclock_now() = %g, want -1", cuemu_vclock_now());
        EXPECT(cudaEventElapsedTime(&ms, e, e) == cudaErrorNotSupported, "off: cudaEventElapsedTime is not supported");
    } else {
        dev = plan_device_find(getenv("FT_EMU_VCLOCK"));
        EXPECT(dev != nullptr && cuemu_vclock_now() >= 0, "FT_EMU_VCLOCK names a device and the clock runs");
        if (!dev) return 1;
        const char *us = getenv("FT_EMU_VCLOCK_ISSUE_US");
        I = us ? 1e-6 * atof(us) : PLAN_OP_FLOOR_S;
        K = plan_price_op(plan_price_memory(dev, 2.0 * BIG * 4), 1);
        EXPECT(K > I * 1.5, "the test kernel's price %.3g s exceeds the issue cost %.3g s (pick a slower device)", K, I);
        if (size == 1) {
            test_streams();
            test_gemm();
        } else {
            test_collective(rank, size);
        }
    }
    MPI_Finalize();
    if (rank == 0 || t_failed) TEST_SUMMARY(size > 1 ? "test_emu_vclock (2 ranks)" : "test_emu_vclock");
    return 0;
}
