// adamw.cu: AdamW on an fp32 master slice, writing the bf16 parameter copy
// (torch.optim.AdamW single-tensor formula, the CPU op's exact expression order):
//   g = grad * grad_scale; w = master * (1 - lr * wd)
//   m += (1 - beta1) (g - m); v = beta2 v + (1 - beta2) g^2
//   w -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps); master = w; param = bf16(w)
//   launch: grid-stride, 256 threads; groups of 4 with float4 loads/stores (and two bf16x2
//   stores) while master/grad/m/v are 16-byte and param 8-byte aligned, else single
//   elements. param may be NULL (only the master is updated).
//   moments: fp32, or bf16 (--optimizer_moments bf16: m, v read widened to fp32, the update
//   computed on the unrounded fp32 values, m, v stored with stochastic rounding; groups of 4
//   need m, v 8-byte aligned). The rounding's bits are a hash of (seed, step, moment, global
//   index p->offset + i) (src/bf16_sr.h, the CPU op's very bits): deterministic and the same
//   at any sharding. Not round to nearest even: with beta2 0.999 it loses every decrease of
//   v (under half an ulp), docs/results/2026-11-28-bf16-moments.md.
//   numerics: fp32, IEEE sqrtf and division (no fast-math), one bf16 rounding for param.
#include "common.cuh"
#include "bf16_sr.h"

#define ADAMW_THREADS 256

struct AdamwConsts {
    float beta1, beta2, eps, grad_scale, step_size, bc2_sqrt, decay;
    uint32_t key_m, key_v;   // the stochastic rounding's streams (bf16 moments)
    uint64_t offset;         // global index of element 0
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

// moments in fp32 or bf16: four (aligned) or one of them in and out as fp32
__device__ __forceinline__ void load4m(float out[4], const float *p) { load4f(out, p); }
__device__ __forceinline__ void store4m(float *p, const float v[4], uint32_t, uint64_t) { store4f(p, v); }
__device__ __forceinline__ void load4m(float out[4], const bf16 *p) {
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(p);
    const float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
    out[0] = a.x; out[1] = a.y; out[2] = b.x; out[3] = b.y;
}
// bf16: stochastic rounding of element gi + j with the stream `key`
__device__ __forceinline__ void store4m(bf16 *p, const float v[4], uint32_t key, uint64_t gi) {
    uint16_t b[4];
#pragma unroll
    for (int j = 0; j < 4; j++) b[j] = ft_f32_to_bf16_sr(__float_as_uint(v[j]), ft_sr_bits(key, gi + j));
    uint2 u;
    u.x = (uint32_t)b[0] | ((uint32_t)b[1] << 16);
    u.y = (uint32_t)b[2] | ((uint32_t)b[3] << 16);
    *reinterpret_cast<uint2 *>(p) = u;
}
__device__ __forceinline__ float load1m(const float *p) { return *p; }
__device__ __forceinline__ float load1m(const bf16 *p) { return bf2f(*p); }
__device__ __forceinline__ void store1m(float *p, float x, uint32_t, uint64_t) { *p = x; }
__device__ __forceinline__ void store1m(bf16 *p, float x, uint32_t key, uint64_t gi) {
    *reinterpret_cast<uint16_t *>(p) = ft_f32_to_bf16_sr(__float_as_uint(x), ft_sr_bits(key, gi));
}

template <typename M>
__global__ void __launch_bounds__(ADAMW_THREADS)
adamw_kernel(float *master, bf16 *param, const float *grad, M *m, M *v, size_t n,
             size_t nvec, AdamwConsts k) {
    const size_t items = nvec + (n - nvec * 4);
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < items;
         idx += (size_t)gridDim.x * blockDim.x) {
        if (idx < nvec) {
            const size_t i = idx * 4;
            float w[4], g[4], mm[4], vv[4];
            load4f(w, master + i);
            load4f(g, grad + i);
            load4m(mm, m + i);
            load4m(vv, v + i);
#pragma unroll
            for (int j = 0; j < 4; j++) adamw_one(w[j], g[j], mm[j], vv[j], k);
            store4f(master + i, w);
            store4m(m + i, mm, k.key_m, k.offset + i);
            store4m(v + i, vv, k.key_v, k.offset + i);
            if (param) {
                __nv_bfloat162 *p = reinterpret_cast<__nv_bfloat162 *>(param + i);
                p[0] = __floats2bfloat162_rn(w[0], w[1]);
                p[1] = __floats2bfloat162_rn(w[2], w[3]);
            }
        } else {
            const size_t i = nvec * 4 + (idx - nvec);
            float w = master[i], mm = load1m(m + i), vv = load1m(v + i);
            adamw_one(w, grad[i], mm, vv, k);
            master[i] = w;
            store1m(m + i, mm, k.key_m, k.offset + i);
            store1m(v + i, vv, k.key_v, k.offset + i);
            if (param) param[i] = f2bf(w);
        }
    }
}

extern "C" int ftk_adamw(float *master, void *param, const float *grad, void *m, void *v,
                         int moments_bf16, size_t n, const adamw_params *p, ftk_stream stream) {
    if (n == 0) return 0;
    AdamwConsts k;
    k.beta1 = p->beta1;
    k.beta2 = p->beta2;
    k.eps = p->eps;
    k.grad_scale = p->grad_scale;
    k.step_size = p->lr / p->bias_correction1;
    k.bc2_sqrt = sqrtf(p->bias_correction2);
    k.decay = 1.0f - p->lr * p->weight_decay;
    k.key_m = ft_sr_key(p->seed, p->step, 0);
    k.key_v = ft_sr_key(p->seed, p->step, 1);
    k.offset = p->offset;
    const uintptr_t malign = moments_bf16 ? 7u : 15u;
    bool al = aligned16(master) && aligned16(grad) && ((uintptr_t)m & malign) == 0 &&
              ((uintptr_t)v & malign) == 0 && (!param || ((uintptr_t)param & 7u) == 0);
    size_t nvec = al ? n / 4 : 0;
    unsigned blocks = elementwise_blocks(nvec + (n - nvec * 4), ADAMW_THREADS);
    if (moments_bf16)
        LAUNCH_KERNEL(dim3(blocks), dim3(ADAMW_THREADS), 0, stream, adamw_kernel<bf16>)(
            master, (bf16 *)param, grad, (bf16 *)m, (bf16 *)v, n, nvec, k);
    else
        LAUNCH_KERNEL(dim3(blocks), dim3(ADAMW_THREADS), 0, stream, adamw_kernel<float>)(
            master, (bf16 *)param, grad, (float *)m, (float *)v, n, nvec, k);
    return launch_check("adamw");
}
