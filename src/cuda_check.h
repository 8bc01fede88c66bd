// cuda_check.h: the CHECK family for CUDA, cuBLAS(Lt) and cuDNN calls in host C files (see
// common.h): each records "<call> failed at file:line: <library's reason>" and returns -1.
// (CHECK_NCCL lives in src/comm_nccl.c, which loads NCCL at run time.)
#pragma once
#include <cuda_runtime_api.h>

#include "common.h"

#define CHECK_CUDA(call) do { cudaError_t cuda_rc_ = (call); if (cuda_rc_ != cudaSuccess) \
    return ft_error("%s failed at %s:%d: %s", #call, FT_WHERE, cudaGetErrorString(cuda_rc_)); } while (0)

// the same for a status already in hand (a call whose one status is handled first, e.g. a
// poll's cudaErrorNotReady), naming the call that returned it
#define CHECK_CUDA_STATUS(rc, call_name) do { cudaError_t cuda_rc_ = (rc); if (cuda_rc_ != cudaSuccess) \
    return ft_error("%s failed at %s:%d: %s", call_name, FT_WHERE, cudaGetErrorString(cuda_rc_)); } while (0)

#define CHECK_CUBLAS(call) do { cublasStatus_t cublas_rc_ = (call); if (cublas_rc_ != CUBLAS_STATUS_SUCCESS) \
    return ft_error("%s failed at %s:%d: cuBLAS status %d", #call, FT_WHERE, (int)cublas_rc_); } while (0)

// (cudnnGetErrorString: include cudnn_graph.h before using it)
#define CHECK_CUDNN(call) do { cudnnStatus_t cudnn_rc_ = (call); if (cudnn_rc_ != CUDNN_STATUS_SUCCESS) \
    return ft_error("%s failed at %s:%d: %s", #call, FT_WHERE, cudnnGetErrorString(cudnn_rc_)); } while (0)
