// cuda_wait.c: the host's bounded wait for a CUDA stream (see cuda_wait.h).
#include "cuda_wait.h"

#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "watchdog.h"

// The watchdog's poll: 1 when the stream is idle, 0 while it still has work, -1 on an error.
static int poll_stream(void *ctx) {
    const cudaError_t e = cudaStreamQuery((cudaStream_t)ctx);
    if (e == cudaErrorNotReady) return 0;
    CHECK_CUDA_STATUS(e, "cudaStreamQuery");
    return 1;
}

int cuda_wait_stream(void *stream, const char *op, const char *what, size_t bytes) {
    if (!watchdog_enabled()) {
        CHECK_CUDA(cudaStreamSynchronize((cudaStream_t)stream));
        return 0;
    }
    return watchdog_wait(poll_stream, stream, op, what, bytes);
}
