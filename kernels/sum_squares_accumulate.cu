// sum_squares_accumulate.cu: *acc (one double, device memory) += sum of x (n, fp32)^2 in
// double, asynchronous on the stream (no host wait): the gradient norm's sum of squares taken
// unit by unit as each unit's gradient slice becomes final in the backward (src/fsdp.c
// grad_final), read by the host once per optimizer step.
//   The deterministic two-pass reduction of sum_squares.cuh (the same order as sum_squares
//   for the same n); pass 2's thread 0 adds the total into *acc (one add: NaN and inf in x
//   reach *acc as they reach sum_squares' result).
//   Workspace: G doubles from ftk_scratch_get (scratch.cu), returned stream-ordered.
#include "sum_squares.cuh"

extern "C" int ftk_sum_squares_accumulate(double *acc, const float *x, size_t n, ftk_stream stream) {
    if (n == 0) return 0;   // adds 0
    return ss_launch(acc, 1, x, n, stream, "sum_squares_accumulate");
}
