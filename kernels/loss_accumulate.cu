// loss_accumulate.cu: acc (2, double) += {the sum of losses (N, fp32) over the rows whose
// target is not -100, the number of those rows}: a micro-batch's loss added on the device,
// so that the host reads the step's (or the evaluation's) once (src/model.h, model_loss_read)
// instead of copying every micro-batch's losses back.
//   launch: one block of 256 threads. Tiles of LA_TILE rows: each thread stages its rows in
//     shared memory as doubles (0 for an ignored row) and counts its valid rows; thread 0 then
//     adds the tile's doubles one by one in row order. After the last tile thread 0 does
//     acc[0] += sum, acc[1] += count.
//   numerics: exactly the host loop it replaces (and the CPU backend's op): s = 0, then
//     s += (double)loss[i] for each valid i in increasing order, then acc[0] += s. Adding 0.0
//     for an ignored row leaves s unchanged bit for bit (s starts at +0 and so is never -0).
//     The order is the point: no tree, so the printed losses stay those of the host sum. The
//     cost is one dependent double add per row on one thread (a 64K-row micro-batch: a few
//     hundred microseconds, once per micro-batch, on the stream, with no host wait).
#include "common.cuh"

#define LA_THREADS 256
#define LA_PER_THREAD 4
#define LA_TILE (LA_THREADS * LA_PER_THREAD)

__global__ void __launch_bounds__(LA_THREADS)
loss_accumulate_kernel(double *acc, const float *losses, const int32_t *targets, int N) {
    __shared__ double tile[LA_TILE];
    __shared__ int counts[LA_THREADS];
    double s = 0.0;   // thread 0's sum
    int count = 0;    // this thread's valid rows
    for (int base = 0; base < N; base += LA_TILE) {
        for (int k = 0; k < LA_PER_THREAD; k++) {
            const int j = k * LA_THREADS + threadIdx.x, i = base + j;
            const bool valid = i < N && targets[i] != -100;
            tile[j] = valid ? (double)losses[i] : 0.0;
            count += valid;
        }
        __syncthreads();   // the tile is staged
        if (threadIdx.x == 0) {
            const int n = N - base < LA_TILE ? N - base : LA_TILE;
            for (int j = 0; j < n; j++) s += tile[j];
        }
        __syncthreads();   // the tile is rewritten next
    }
    // the valid count: an exact integer sum (any order gives it)
    counts[threadIdx.x] = count;
    __syncthreads();
    if (threadIdx.x == 0) {
        int total = 0;
        for (int t = 0; t < LA_THREADS; t++) total += counts[t];
        acc[0] += s;
        acc[1] += (double)total;
    }
}

extern "C" int ftk_loss_accumulate(double *acc, const float *losses, const int32_t *targets, int N,
                                   ftk_stream stream) {
    if (N < 0) return ft_error("loss_accumulate: N = %d", N);
    if (N == 0) return 0;   // adds 0 and 0
    LAUNCH_KERNEL(dim3(1), dim3(LA_THREADS), 0, stream, loss_accumulate_kernel)(acc, losses, targets, N);
    return launch_check("loss_accumulate");
}
