// cuda_check.h: the CHECK family for CUDA, cuBLAS(Lt) and NCCL calls in host C files (see
// common.h): each records "<call> failed at file:line: <library's reason>" and returns -1.
#pragma once
#include <cuda_runtime_api.h>

#include "common.h"

#define CHECK_CUDA(call) do { cudaError_t cuda_rc_ = (call); if (cuda_rc_ != cudaSuccess) \
    return ft_error("%s failed at %s:%d: %s", #call, FT_WHERE, cudaGetErrorString(cuda_rc_)); } while (0)

#define CHECK_NCCL(call) do { ncclResult_t nccl_rc_ = (call); if (nccl_rc_ != ncclSuccess) \
    return ft_error("%s failed at %s:%d: %s", #call, FT_WHERE, ncclGetErrorString(nccl_rc_)); } while (0)

#define CHECK_CUBLAS(call) do { cublasStatus_t cublas_rc_ = (call); if (cublas_rc_ != CUBLAS_STATUS_SUCCESS) \
    return ft_error("%s failed at %s:%d: cuBLAS status %d", #call, FT_WHERE, (int)cublas_rc_); } while (0)
