// fp8_quantize.cu: per-tensor FP8 quantisation of a bf16 tensor (--fp8; backend.h
// fp8_quantize): amax = max |x|, scale = fp8_max / amax (1 when amax is 0 or not finite),
// codes = cvt.rn.satfinite(x * scale), optionally also transposed.
//   pass 1: G = min(ceil(n / (256 * 16)), 1024) blocks of 256 threads, grid-stride over the
//     elements: each thread's max of |x| (fmaxf: NaNs do not count), warp and block max ->
//     partial[b] (fp32, scratch).
//   pass 2: one block: the max of the partials -> stats = {amax, scale, 1 / scale}.
//   (ftk_fp8_cast: no pass 1; pass 2 takes the one amax the tensor's producer computed,
//     rmsnorm_fwd's or swiglu_fwd's, as its single partial: the same stats, bit for bit)
//   pass 3, out only: grid-stride cast, one element per thread (coalesced both ways).
//   pass 3 with out_t: a tiled transpose: grid (ceil(cols / 32), min(ceil(rows / 32), 65535),
//     looping over the tile rows past that), 32 x 8 threads; a block casts a 32 x 32 tile read
//     along its rows (a warp: 32 consecutive bf16 of one row; out written there too when
//     asked), keeps the codes transposed in shared memory (36-byte rows: conflict-free byte
//     stores), then writes out_t 4 codes per thread: one 32-bit word when rows % 4 == 0 and
//     out_t is 4-byte aligned, else 4 bytes with the bound checked, so a warp writes 4 rows of
//     32 contiguous bytes (whole 32-byte sectors) instead of 32 scattered bytes. Tiles past
//     the last row or column are cut at the edge.
//   numerics: max is exact and order-free; scale is one IEEE division, the product x * scale
//     one fp32 rounding, the conversion one more (ties to even, saturating), bitwise the host's
//     fp8_from_float_sat(x * fp8_scale_from_amax(amax)) (src/fp8.c).
#include "common.cuh"

#include <cuda_fp8.h>   // __nv_cvt_float_to_fp8 (cvt.rn.satfinite on sm_89+, its exact software path elsewhere)

#define Q_THREADS 256
#define Q_MAX_BLOCKS 1024
#define T_TILE 32    // the transposing cast's tile: T_TILE x T_TILE codes
#define T_ROWS 8     // its threads: T_TILE x T_ROWS, each T_TILE / T_ROWS elements of a column
#define T_PITCH 36   // bytes per row of the shared tile (9 words: the byte stores hit 32 banks)

// the format's largest finite value (fmt: fp8_format, 0 = e4m3, 1 = e5m2)
__device__ __forceinline__ float fp8_fmt_max(int fmt) { return fmt == 1 ? 57344.0f : 448.0f; }

__device__ __forceinline__ unsigned char fp8_cvt_sat(float x, int fmt) {
    return (unsigned char)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, fmt == 1 ? __NV_E5M2 : __NV_E4M3);
}

__global__ void __launch_bounds__(Q_THREADS)
fp8_amax_partial_kernel(float *partial, const bf16 *x, size_t n) {
    __shared__ float scratch[32];
    float m = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        m = fmaxf(m, fabsf(bf2f(x[i])));
    m = block_max(m, scratch);
    if (threadIdx.x == 0) partial[blockIdx.x] = m;
}

__global__ void __launch_bounds__(Q_THREADS)
fp8_amax_final_kernel(float *stats, const float *partial, int G, int fmt) {
    __shared__ float scratch[32];
    float m = 0.0f;
    for (int i = threadIdx.x; i < G; i += blockDim.x) m = fmaxf(m, partial[i]);
    m = block_max(m, scratch);
    if (threadIdx.x == 0) {
        // (a tiny amax, below the format's max / FLT_MAX, would make the scale inf: clamped)
        const float scale = m > 0.0f && isfinite(m) ? fminf(fp8_fmt_max(fmt) / m, 3.40282347e38f) : 1.0f;
        stats[0] = m;
        stats[1] = scale;
        stats[2] = 1.0f / scale;
    }
}

// out only: grid-stride, one element per thread (reads and writes both coalesced)
__global__ void __launch_bounds__(Q_THREADS)
fp8_cast_kernel(unsigned char *out, const float *stats, const bf16 *x, size_t n, int fmt) {
    const float scale = stats[1];
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = fp8_cvt_sat(bf2f(x[i]) * scale, fmt);
}

// out_t (and out when not NULL): 32 x 32 tiles, T_TILE x T_ROWS threads (the loop below). The
// word reads of tile_w (36-byte rows) meet 2-way bank conflicts on a few banks; the stores do not.
__global__ void __launch_bounds__(T_TILE *T_ROWS)
fp8_cast_t_kernel(unsigned char *out, unsigned char *out_t, const float *stats, const bf16 *x, int rows, int cols,
                  int fmt, int words) {
    __shared__ unsigned tile_w[T_TILE][T_PITCH / 4];   // tile[c][r]: the codes transposed, 36-byte rows
    unsigned char(*tile)[T_PITCH] = reinterpret_cast<unsigned char(*)[T_PITCH]>(tile_w);
    const float scale = stats[1];
    const int c = blockIdx.x * T_TILE + threadIdx.x;                  // read: column c, rows r0 + y + 8k
    const int tid = threadIdx.y * T_TILE + threadIdx.x, j = tid / 8, w = tid % 8;
    const int cj = blockIdx.x * T_TILE + j;                           // write: out_t row cj, 4 codes from 4w
    for (int r0 = blockIdx.y * T_TILE; r0 < rows; r0 += gridDim.y * T_TILE) {
        for (int k = threadIdx.y; k < T_TILE; k += T_ROWS) {
            const int r = r0 + k;
            if (r >= rows || c >= cols) continue;
            const size_t i = (size_t)r * cols + c;
            const unsigned char q = fp8_cvt_sat(bf2f(x[i]) * scale, fmt);
            if (out) out[i] = q;
            tile[threadIdx.x][k] = q;
        }
        __syncthreads();
        const int rw = r0 + 4 * w;
        if (cj < cols && rw < rows) {
            unsigned char *dst = out_t + (size_t)cj * rows + rw;
            if (words) *reinterpret_cast<unsigned *>(dst) = tile_w[j][w];
            else
                for (int b = 0; b < 4 && rw + b < rows; b++) dst[b] = tile[j][4 * w + b];
        }
        __syncthreads();   // the tile is rewritten next
    }
}

// stats from the G partial maxima, then the codes (out, out_t or both; neither: stats only)
static int scale_and_cast(void *out, void *out_t, float *stats, const float *partial, int G, const void *inp, int rows,
                          int cols, int fmt, ftk_stream stream) {
    LAUNCH_KERNEL(dim3(1), dim3(Q_THREADS), 0, stream, fp8_amax_final_kernel)(stats, partial, G, fmt);
    int rc = launch_check("fp8_quantize (scale)");
    const size_t n = (size_t)rows * cols;
    if (rc != 0 || n == 0) return rc;
    if (out_t) {
        const unsigned tr = ceil_div((size_t)rows, T_TILE);
        const int words = rows % 4 == 0 && ((uintptr_t)out_t & 3u) == 0;
        LAUNCH_KERNEL(dim3(ceil_div((size_t)cols, T_TILE), tr < 65535 ? tr : 65535), dim3(T_TILE, T_ROWS), 0, stream,
                      fp8_cast_t_kernel)((unsigned char *)out, (unsigned char *)out_t, stats, (const bf16 *)inp, rows,
                                         cols, fmt, words);
        return launch_check("fp8_quantize (transposing cast)");
    }
    if (!out) return 0;
    LAUNCH_KERNEL(dim3(elementwise_blocks(n, Q_THREADS)), dim3(Q_THREADS), 0, stream, fp8_cast_kernel)(
        (unsigned char *)out, stats, (const bf16 *)inp, n, fmt);
    return launch_check("fp8_quantize (cast)");
}

static int check_args(const char *op, int rows, int cols, int fmt) {
    if (fmt != 0 && fmt != 1) return ft_error("%s: format %d (0 e4m3, 1 e5m2)", op, fmt);
    if (rows < 0 || cols < 0) return ft_error("%s: shape %d x %d", op, rows, cols);
    return 0;
}

extern "C" int ftk_fp8_quantize(void *out, void *out_t, float *stats, const void *inp, int rows, int cols, int fmt,
                                ftk_stream stream) {
    if (check_args("fp8_quantize", rows, cols, fmt) != 0) return -1;
    const size_t n = (size_t)rows * cols;
    const size_t g = (n + (size_t)Q_THREADS * 16 - 1) / ((size_t)Q_THREADS * 16);
    const int G = g < 1 ? 1 : g > Q_MAX_BLOCKS ? Q_MAX_BLOCKS : (int)g;
    float *partial = NULL;
    if (ftk_scratch_get((void **)&partial, sizeof(float) * G, stream, "fp8_quantize (partials)") != 0) return -1;
    LAUNCH_KERNEL(dim3(G), dim3(Q_THREADS), 0, stream, fp8_amax_partial_kernel)(partial, (const bf16 *)inp, n);
    int rc = launch_check("fp8_quantize (amax)");
    if (rc == 0) rc = scale_and_cast(out, out_t, stats, partial, G, inp, rows, cols, fmt, stream);
    ftk_scratch_put(partial, stream);
    return rc;
}

extern "C" int ftk_fp8_cast(void *out, void *out_t, float *stats, const float *amax, const void *inp, int rows,
                            int cols, int fmt, ftk_stream stream) {
    if (check_args("fp8_cast", rows, cols, fmt) != 0) return -1;
    return scale_and_cast(out, out_t, stats, amax, 1, inp, rows, cols, fmt, stream);
}
