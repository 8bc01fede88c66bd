// rope.cu: rotary position embedding, HF rotate_half convention (pairs (i, i + D/2)).
//
// forward  y[i] = x[i] cos[t][i] - x[i+D/2] sin[t][i]; y[i+D/2] = x[i+D/2] cos + x[i] sin
// backward the transpose rotation (sin negated). out may equal inp (in place).
// cos/sin (T, D/2) fp32 are given (llama3 frequency scaling is applied by whoever builds
// them), positions are 0..T-1 for every batch row, or t - seg[b, t] with segment starts
// (seg (B, T) int32, --pack_attention per_game; backend.h).
// qkv_fwd/bwd: the same on the fused (B, T, (H + 2 KVH) D) q|k|v projection, split into (or
// gathered from) packed q (B, T, H, D), k and v (B, T, KVH, D); v is copied, not rotated;
// with cos = sin = NULL nothing is rotated (the split / gather alone).
//   launch: grid-stride, 256 threads, one thread per (b, t, head, group of pairs); a group
//   is 8 pairs with 16-byte loads (D/2 % 8 == 0, rows and pointers 16-byte aligned), else 1.
//   Each thread reads its whole group before writing it, so in-place is safe.
//   numerics: fp32, one bf16 rounding per output (the same products as the CPU op).
#include "common.cuh"

#define ROPE_THREADS 256

// One launch handles NH heads of D per token row; rows are ld_inp / ld_out elements apart
// (NH * D when packed; the fused q|k|v projection's row when strided), so q, k and v of the
// fused (N, (H + 2 KVH) D) projection are three launches. rotate = 0 copies (v).
__global__ void __launch_bounds__(ROPE_THREADS)
rope_kernel(bf16 *out, size_t ld_out, const bf16 *inp, size_t ld_inp, const float *cos,
            const float *sin, int T, int NH, int D, float sign, int vec, int rotate,
            const int32_t *seg) {
    const int half = D / 2;
    const int G = vec ? 8 : 1;                   // pairs per thread
    const int groups = half / G;
    const size_t per_batch = (size_t)T * NH * groups;
    const size_t b = blockIdx.y;                            // batch row
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < per_batch;
         idx += (size_t)gridDim.x * blockDim.x) {
        const int g = (int)(idx % groups);
        const size_t head_row = idx / groups;              // t * NH + h
        const int t = (int)(head_row / NH), h = (int)(head_row % NH);
        const size_t row = b * T + t;
        const size_t o_in = row * ld_inp + (size_t)h * D, o_out = row * ld_out + (size_t)h * D;
        const int i = g * G;
        const size_t pos = seg ? (size_t)(t - seg[row]) : (size_t)t;
        const float *ct = rotate ? cos + pos * half + i : nullptr;
        const float *st = rotate ? sin + pos * half + i : nullptr;
        if (vec) {
            float x1[8], x2[8], c[8], s[8];
            load8(x1, inp + o_in + i);
            load8(x2, inp + o_in + i + half);
            float y1[8], y2[8];
            if (rotate) {
                load4f(c, ct);
                load4f(c + 4, ct + 4);
                load4f(s, st);
                load4f(s + 4, st + 4);
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    float sk = sign * s[k];
                    y1[k] = x1[k] * c[k] - x2[k] * sk;
                    y2[k] = x2[k] * c[k] + x1[k] * sk;
                }
            } else {
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    y1[k] = x1[k];
                    y2[k] = x2[k];
                }
            }
            store8(out + o_out + i, y1);
            store8(out + o_out + i + half, y2);
        } else if (rotate) {
            float x1 = bf2f(inp[o_in + i]), x2 = bf2f(inp[o_in + i + half]);
            float c = ct[0], s = sign * st[0];
            out[o_out + i] = f2bf(x1 * c - x2 * s);
            out[o_out + i + half] = f2bf(x2 * c + x1 * s);
        } else {
            out[o_out + i] = inp[o_in + i];
            out[o_out + i + half] = inp[o_in + i + half];
        }
    }
}

// NH heads of D per row for B*T rows, rows ld_out / ld_inp elements apart; rotate 0: copy
static int rope_launch(void *out, size_t ld_out, const void *inp, size_t ld_inp, const float *cos,
                       const float *sin, int B, int T, int NH, int D, float sign, int rotate,
                       const int32_t *seg, ftk_stream stream, const char *op) {
    if (B <= 0 || T <= 0 || NH <= 0 || D <= 0) return 0;
    if (D % 2) return ft_error("%s: head dim %d is odd", op, D);
    if (B > 65535) return ft_error("%s: batch %d too large", op, B);
    // 16-byte groups; with D % 16 == 0 every row stride (a multiple of D) keeps rows aligned
    int vec = (D / 2) % 8 == 0 && aligned16(out) && aligned16(inp) && aligned16(cos) &&
              aligned16(sin);
    size_t per_batch = (size_t)T * NH * (D / 2) / (vec ? 8 : 1);
    unsigned blocks = elementwise_blocks(per_batch, ROPE_THREADS);
    LAUNCH_KERNEL(dim3(blocks, B), dim3(ROPE_THREADS), 0, stream, rope_kernel)(
        (bf16 *)out, ld_out, (const bf16 *)inp, ld_inp, cos, sin, T, NH, D, sign, vec, rotate, seg);
    return launch_check(op);
}

extern "C" int ftk_rope_fwd(void *out, const void *inp, const float *cos, const float *sin,
                            int B, int T, int NH, int D, const int32_t *seg, ftk_stream stream) {
    const size_t ld = (size_t)NH * D;
    return rope_launch(out, ld, inp, ld, cos, sin, B, T, NH, D, 1.0f, 1, seg, stream, "rope_fwd");
}

extern "C" int ftk_rope_bwd(void *dinp, const void *dout, const float *cos, const float *sin,
                            int B, int T, int NH, int D, const int32_t *seg, ftk_stream stream) {
    const size_t ld = (size_t)NH * D;
    return rope_launch(dinp, ld, dout, ld, cos, sin, B, T, NH, D, -1.0f, 1, seg, stream, "rope_bwd");
}

// q|k|v rows of the fused projection, W = (H + 2 KVH) D elements each
extern "C" int ftk_rope_qkv_fwd(void *q, void *k, void *v, const void *qkv, const float *cos,
                                const float *sin, int B, int T, int H, int KVH, int D,
                                const int32_t *seg, ftk_stream stream) {
    const size_t W = (size_t)(H + 2 * KVH) * D, QD = (size_t)H * D, KVD = (size_t)KVH * D;
    const bf16 *x = (const bf16 *)qkv;
    const char *op = "rope_qkv_fwd";
    const int rot = cos != NULL;   // NULL tables: split only
    if (rope_launch(q, QD, x, W, cos, sin, B, T, H, D, 1.0f, rot, seg, stream, op) != 0) return -1;
    if (rope_launch(k, KVD, x + QD, W, cos, sin, B, T, KVH, D, 1.0f, rot, seg, stream, op) != 0) return -1;
    return rope_launch(v, KVD, x + QD + KVD, W, cos, sin, B, T, KVH, D, 1.0f, 0, seg, stream, op);
}

extern "C" int ftk_rope_qkv_bwd(void *dqkv, const void *dq, const void *dk, const void *dv,
                                const float *cos, const float *sin, int B, int T, int H, int KVH,
                                int D, const int32_t *seg, ftk_stream stream) {
    const size_t W = (size_t)(H + 2 * KVH) * D, QD = (size_t)H * D, KVD = (size_t)KVH * D;
    bf16 *y = (bf16 *)dqkv;
    const char *op = "rope_qkv_bwd";
    const int rot = cos != NULL;   // NULL tables: gather only
    if (rope_launch(y, W, dq, QD, cos, sin, B, T, H, D, -1.0f, rot, seg, stream, op) != 0) return -1;
    if (rope_launch(y + QD, W, dk, KVD, cos, sin, B, T, KVH, D, -1.0f, rot, seg, stream, op) != 0) return -1;
    return rope_launch(y + QD + KVD, W, dv, KVD, cos, sin, B, T, KVH, D, -1.0f, 0, seg, stream, op);
}
