// sum_squares.cu: *host_out = sum of x (n, fp32)^2 in double (the gradient norm over a whole
// slice). The deterministic two-pass reduction of sum_squares.cuh into a scratch double, which
// is copied back with cudaMemcpyAsync; the stream is synchronised.
//   Workspace: (G + 1) doubles from ftk_scratch_get (scratch.cu).
#include "sum_squares.cuh"

extern "C" int ftk_sum_squares(double *host_out, const float *x, size_t n, ftk_stream stream) {
    if (n == 0) {
        *host_out = 0.0;
        return 0;
    }
    double *ws = NULL;
    if (ftk_scratch_get((void **)&ws, sizeof(double), stream, "sum_squares (result)") != 0) return -1;
    int rc = ss_launch(ws, 0, x, n, stream, "sum_squares");
    if (rc == 0)
        rc = cuda_check(cudaMemcpyAsync(host_out, ws, sizeof(double), cudaMemcpyDeviceToHost,
                                        stream), "sum_squares", "cudaMemcpyAsync");
    if (rc == 0) rc = cuda_check(cudaStreamSynchronize(stream), "sum_squares", "cudaStreamSynchronize");
    ftk_scratch_put(ws, stream);
    return rc;
}
