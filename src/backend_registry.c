// backend_registry.c: the one place that knows which backends this binary was built with;
// everything else about a backend goes through its table.
#include <string.h>

#include "backend.h"
#include "common.h"
#ifdef FT_HAVE_CUDA
#include "backend_cuda.h"
#endif

int backend_open(const char *device, int local_rank, size_t arena_bytes, const backend **out) {
    *out = NULL;
    if (strcmp(device, "cpu") == 0) {
        *out = backend_cpu();
        return 0;
    }
    if (strcmp(device, "cuda") == 0) {
#ifdef FT_HAVE_CUDA
        return backend_cuda_open(local_rank, arena_bytes, out);
#else
        (void)local_rank; (void)arena_bytes;
        return ft_error("flag --device cuda: this binary was built without the CUDA toolkit (rebuild with make CUDA=1)");
#endif
    }
    return ft_error("flag --device: unknown device '%s' (cpu or cuda)", device);
}

const char *backend_build_description(void) {
#ifdef FT_HAVE_CUDA
    return "cpu (fp32, OpenMP, OpenBLAS), cuda (kernels for " FT_CUDA_CODES "; cuBLASLt, cuDNN; NCCL loaded at run time)";
#else
    return "cpu (fp32, OpenMP, OpenBLAS); no cuda (built without the CUDA toolkit)";
#endif
}

int backend_set_attention(const char *mode, int deterministic) {
#ifdef FT_HAVE_CUDA
    return backend_cuda_set_attention(mode, deterministic);
#else
    (void)mode; (void)deterministic;   // the CPU backend has one attention
    return 0;
#endif
}

void backend_close(const backend *be) {
    if (be) be->close();
}

const char *backend_describe(const backend *be) { return be ? be->describe() : "none"; }

double backend_peak_tflops(const backend *be) { return be ? be->peak_tflops() : 0; }
