// cuda_wait.c: the host's bounded wait for a CUDA stream (see cuda_wait.h).
#include "cuda_wait.h"

#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "watchdog.h"

int cuda_wait_poll_status(cudaError_t e, const char *call) {
    if (e == cudaSuccess) return 1;
    if (e == cudaErrorNotReady) return 0;
    // an error of work already queued (a fault in a kernel, a copy): sticky, the rank cannot
    // go on, and its peers would wait for it in their next collective
    ft_error("CUDA error: %s (%s, from %s)", cudaGetErrorString(e), cudaGetErrorName(e), call);
    return WATCHDOG_POLL_FATAL;
}

// The watchdog's poll: 1 when the stream is idle, 0 while it still has work.
static int poll_stream(void *ctx) { return cuda_wait_poll_status(cudaStreamQuery((cudaStream_t)ctx), "cudaStreamQuery"); }

int cuda_wait_stream(void *stream, const char *op, const char *what, size_t bytes) {
    if (!watchdog_enabled()) {
        CHECK_CUDA(cudaStreamSynchronize((cudaStream_t)stream));
        return 0;
    }
    return watchdog_wait(poll_stream, stream, op, what, bytes);
}
