// rope.cu: rotary position embedding, HF rotate_half convention (pairs (i, i + D/2)).
//
// forward  y[i] = x[i] cos[t][i] - x[i+D/2] sin[t][i]; y[i+D/2] = x[i+D/2] cos + x[i] sin
// backward the transpose rotation (sin negated). out may equal inp (in place).
// cos/sin (T, D/2) fp32 are given (llama3 frequency scaling is applied by whoever builds
// them), positions are 0..T-1 for every batch row.
//   launch: grid-stride, 256 threads, one thread per (b, t, head, group of pairs); a group
//   is 8 pairs with 16-byte loads (D/2 % 8 == 0, all pointers 16-byte aligned), else 1 pair.
//   Each thread reads its whole group before writing it, so in-place is safe.
//   numerics: fp32, one bf16 rounding per output (the same products as the CPU op).
#include "common.cuh"

#define ROPE_THREADS 256

__global__ void __launch_bounds__(ROPE_THREADS)
rope_kernel(bf16 *out, const bf16 *inp, const float *cos, const float *sin, int T, int NH,
            int D, float sign, int vec) {
    const int half = D / 2;
    const int G = vec ? 8 : 1;                   // pairs per thread
    const int groups = half / G;
    const size_t per_batch = (size_t)T * NH * groups;
    const size_t b = blockIdx.y;                            // batch row
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < per_batch;
         idx += (size_t)gridDim.x * blockDim.x) {
        const int g = (int)(idx % groups);
        const size_t head_row = idx / groups;              // t * NH + h
        const int t = (int)(head_row / NH);
        const size_t off = (b * T * NH + head_row) * D;
        const int i = g * G;
        const float *ct = cos + (size_t)t * half + i, *st = sin + (size_t)t * half + i;
        if (vec) {
            float x1[8], x2[8], c[8], s[8];
            load8(x1, inp + off + i);
            load8(x2, inp + off + i + half);
            load4f(c, ct);
            load4f(c + 4, ct + 4);
            load4f(s, st);
            load4f(s + 4, st + 4);
            float y1[8], y2[8];
#pragma unroll
            for (int k = 0; k < 8; k++) {
                float sk = sign * s[k];
                y1[k] = x1[k] * c[k] - x2[k] * sk;
                y2[k] = x2[k] * c[k] + x1[k] * sk;
            }
            store8(out + off + i, y1);
            store8(out + off + i + half, y2);
        } else {
            float x1 = bf2f(inp[off + i]), x2 = bf2f(inp[off + i + half]);
            float c = ct[0], s = sign * st[0];
            out[off + i] = f2bf(x1 * c - x2 * s);
            out[off + i + half] = f2bf(x2 * c + x1 * s);
        }
    }
}

static int rope_launch(void *out, const void *inp, const float *cos, const float *sin, int B,
                       int T, int NH, int D, float sign, ftk_stream stream, const char *op) {
    if (B <= 0 || T <= 0 || NH <= 0 || D <= 0) return 0;
    if (D % 2) return ft_error("%s: head dim %d is odd", op, D);
    if (B > 65535) return ft_error("%s: batch %d too large", op, B);
    int vec = (D / 2) % 8 == 0 && aligned16(out) && aligned16(inp) && aligned16(cos) &&
              aligned16(sin);
    size_t per_batch = (size_t)T * NH * (D / 2) / (vec ? 8 : 1);
    unsigned blocks = elementwise_blocks(per_batch, ROPE_THREADS);
    LAUNCH_KERNEL(dim3(blocks, B), dim3(ROPE_THREADS), 0, stream, rope_kernel)(
        (bf16 *)out, (const bf16 *)inp, cos, sin, T, NH, D, sign, vec);
    return launch_check(op);
}

extern "C" int ftk_rope_fwd(void *out, const void *inp, const float *cos, const float *sin,
                            int B, int T, int NH, int D, ftk_stream stream) {
    return rope_launch(out, inp, cos, sin, B, T, NH, D, 1.0f, stream, "rope_fwd");
}

extern "C" int ftk_rope_bwd(void *dinp, const void *dout, const float *cos, const float *sin,
                            int B, int T, int NH, int D, ftk_stream stream) {
    return rope_launch(dinp, dout, cos, sin, B, T, NH, D, -1.0f, stream, "rope_bwd");
}
