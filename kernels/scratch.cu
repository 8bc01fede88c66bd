// scratch.cu: where kernels get short-lived device workspace (the attention backward's row
// sums, the RMSNorm backward's dweight partials, the squared-norm partials).
//
// The CUDA backend registers its arena (ftk_set_scratch_allocator), so training never calls
// cudaMalloc/cudaFree after setup. Releasing immediately on the host is safe because every
// kernel runs on the one compute stream: a later request that reuses the bytes belongs to a
// later kernel on that stream, which starts after the earlier one finished. Without a
// registered allocator (kernel tests, other callers) the stream-ordered pool is used
// (cudaMallocAsync / cudaFreeAsync).
#include "common.cuh"

static void *(*g_scratch_alloc)(size_t);
static void (*g_scratch_free)(void *);

extern "C" void ftk_set_scratch_allocator(void *(*alloc)(size_t nbytes), void (*release)(void *p)) {
    g_scratch_alloc = alloc;
    g_scratch_free = release;
}

int ftk_scratch_get(void **p, size_t nbytes, ftk_stream stream, const char *op) {
    if (g_scratch_alloc) {
        *p = g_scratch_alloc(nbytes);
        return *p ? 0 : ft_error("%s: no device scratch of %zu bytes in the arena", op, nbytes);
    }
    return cuda_check(cudaMallocAsync(p, nbytes, stream), op, "cudaMallocAsync of scratch");
}

void ftk_scratch_put(void *p, ftk_stream stream) {
    if (!p) return;
    if (g_scratch_free) g_scratch_free(p);
    else cudaFreeAsync(p, stream);
}
