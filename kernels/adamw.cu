// adamw.cu: AdamW on an fp32 master slice, writing the bf16 parameter copy
// (torch.optim.AdamW single-tensor formula, the CPU op's exact expression order):
//   g = grad * grad_scale; w = master * (1 - lr * wd)
//   m += (1 - beta1) (g - m); v = beta2 v + (1 - beta2) g^2
//   w -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps); master = w; param = bf16(w)
//   launch: grid-stride, 256 threads; groups of 4 with float4 loads/stores (and two bf16x2
//   stores) while master/grad/m/v are 16-byte and param 8-byte aligned, else single
//   elements. param may be NULL (only the master is updated).
//   numerics: fp32, IEEE sqrtf and division (no fast-math), one bf16 rounding for param.
#include "common.cuh"

#define ADAMW_THREADS 256

struct AdamwConsts {
    float beta1, beta2, eps, grad_scale, step_size, bc2_sqrt, decay;
};

__device__ __forceinline__ float adamw_one(float &w, float g, float &m, float &v,
                                           const AdamwConsts &k) {
    g *= k.grad_scale;
    float x = w * k.decay;
    m += (1.0f - k.beta1) * (g - m);
    v = k.beta2 * v + (1.0f - k.beta2) * g * g;
    float denom = sqrtf(v) / k.bc2_sqrt + k.eps;
    x -= k.step_size * (m / denom);
    w = x;
    return x;
}

__global__ void __launch_bounds__(ADAMW_THREADS)
adamw_kernel(float *master, bf16 *param, const float *grad, float *m, float *v, size_t n,
             size_t nvec, AdamwConsts k) {
    const size_t items = nvec + (n - nvec * 4);
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < items;
         idx += (size_t)gridDim.x * blockDim.x) {
        if (idx < nvec) {
            const size_t i = idx * 4;
            float w[4], g[4], mm[4], vv[4];
            load4f(w, master + i);
            load4f(g, grad + i);
            load4f(mm, m + i);
            load4f(vv, v + i);
#pragma unroll
            for (int j = 0; j < 4; j++) adamw_one(w[j], g[j], mm[j], vv[j], k);
            store4f(master + i, w);
            store4f(m + i, mm);
            store4f(v + i, vv);
            if (param) {
                __nv_bfloat162 *p = reinterpret_cast<__nv_bfloat162 *>(param + i);
                p[0] = __floats2bfloat162_rn(w[0], w[1]);
                p[1] = __floats2bfloat162_rn(w[2], w[3]);
            }
        } else {
            const size_t i = nvec * 4 + (idx - nvec);
            float w = master[i], mm = m[i], vv = v[i];
            adamw_one(w, grad[i], mm, vv, k);
            master[i] = w;
            m[i] = mm;
            v[i] = vv;
            if (param) param[i] = f2bf(w);
        }
    }
}

extern "C" int ftk_adamw(float *master, void *param, const float *grad, float *m, float *v,
                         size_t n, const adamw_params *p, ftk_stream stream) {
    if (n == 0) return 0;
    AdamwConsts k;
    k.beta1 = p->beta1;
    k.beta2 = p->beta2;
    k.eps = p->eps;
    k.grad_scale = p->grad_scale;
    k.step_size = p->lr / p->bias_correction1;
    k.bc2_sqrt = sqrtf(p->bias_correction2);
    k.decay = 1.0f - p->lr * p->weight_decay;
    bool al = aligned16(master) && aligned16(grad) && aligned16(m) && aligned16(v) &&
              (!param || ((uintptr_t)param & 7u) == 0);
    size_t nvec = al ? n / 4 : 0;
    unsigned blocks = elementwise_blocks(nvec + (n - nvec * 4), ADAMW_THREADS);
    LAUNCH_KERNEL(dim3(blocks), dim3(ADAMW_THREADS), 0, stream, adamw_kernel)(
        master, (bf16 *)param, grad, m, v, n, nvec, k);
    return launch_check("adamw");
}
