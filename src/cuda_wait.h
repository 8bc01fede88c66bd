// cuda_wait.h: the host's wait for a CUDA stream, bounded by --collective_timeout (built with
// the CUDA toolkit only). The compute stream waits on NCCL collectives (src/comm_nccl.c), so a
// hung peer stalls every stream behind it; with a timeout set, each host wait polls under the
// watchdog's deadline (src/watchdog.h) instead of blocking in cudaStreamSynchronize. Used by
// the CUDA backend, the NCCL transport and the cuDNN attention engine; it holds no state.
#pragma once
#include <cuda_runtime_api.h>
#include <stddef.h>

// Wait on the host until `stream` (a cudaStream_t) has done all its work: without a
// --collective_timeout, cudaStreamSynchronize; with one, polled under the watchdog's deadline,
// `op`, `what` and `bytes` naming the wait in its timeout message (e.g. "all_reduce of host
// doubles", "compute stream", 8). 0, or -1 with ft_error (the CUDA error, or the timeout).
int cuda_wait_stream(void *stream, const char *op, const char *what, size_t bytes);
// A watchdog poll's verdict on the status of a CUDA query (cudaStreamQuery, cudaEventQuery)
// named `call`: 1 done, 0 not yet (cudaErrorNotReady), or any error (the queued work failed:
// an illegal address, an ECC error, sticky) recorded as "CUDA error: <reason> (<name>, from
// <call>)" and WATCHDOG_POLL_FATAL: the wait ends the job (src/watchdog.h).
int cuda_wait_poll_status(cudaError_t e, const char *call);
