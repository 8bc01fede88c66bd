// test_emu.cu: the CUDA emulator's own tests (built as C++ with cuda_emu.h, see emu.mk).
// Barriers, every shuffle kind and width, votes, dynamic and static shared memory with its
// poisoning, a missing barrier caught, and errors (deadlock, exit before a barrier,
// divergent barriers, lanes exited from a collective, bad launch configuration) reported
// instead of hanging. Every functional test runs in forward, reverse and random order.
// wmma (tensor-core) fragments: products against a CPU GEMM in every operand layout, the
// per-launch opaque element layout, and misuse (a lane missing, lanes disagreeing, a
// misaligned pointer or ldm, a partial warp) reported as launch errors.
#include "cuda_emu.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

static const int ORDERS[3] = {CUEMU_FORWARD, CUEMU_REVERSE, CUEMU_RANDOM};

// ---------------------------------------------------------------- kernels

// rotate a block's values twice through shared memory, barrier-separated phases
__global__ void k_barrier(int *out, int rounds) {
    __shared__ int s[1024];
    const int n = blockDim.x * blockDim.y * blockDim.z;
    const int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    int v = t + 1000 * (int)(blockIdx.x + gridDim.x * blockIdx.y);
    for (int r = 0; r < rounds; r++) {
        s[t] = v;
        __syncthreads();
        v = s[(t + 1) % n] + s[(t + n - 1) % n];
        __syncthreads();
    }
    out[(blockIdx.x + gridDim.x * blockIdx.y) * n + t] = v;
}

// the same without the barriers: reads neighbours that may not have written yet
__global__ void k_missing_barrier(int *out) {
    __shared__ int s[1024];
    const int n = blockDim.x, t = threadIdx.x;
    s[t] = t;
    out[blockIdx.x * n + t] = s[(t + 1) % n];
}

__global__ void k_barrier_votes(int *out) {
    int t = threadIdx.x;
    out[4 * t + 0] = __syncthreads_count(t % 3 == 0);
    out[4 * t + 1] = __syncthreads_and(t < 1000);
    out[4 * t + 2] = __syncthreads_or(t == 17);
    out[4 * t + 3] = __syncthreads_and(t != 5);
}

template <class T>
__global__ void k_shfl(T *out, const T *in, int kind, int arg, int width) {
    int t = threadIdx.x;
    T v = in[t], r;
    switch (kind) {
    case 0: r = __shfl_sync(0xffffffffu, v, arg, width); break;
    case 1: r = __shfl_up_sync(0xffffffffu, v, arg, width); break;
    case 2: r = __shfl_down_sync(0xffffffffu, v, arg, width); break;
    default: r = __shfl_xor_sync(0xffffffffu, v, arg, width); break;
    }
    out[t] = r;
}

// per-lane source index: idx shuffle where each lane reads a different lane
__global__ void k_shfl_perm(float *out, const float *in) {
    int t = threadIdx.x, lane = t % 32;
    out[t] = __shfl_sync(0xffffffffu, in[t], (lane * 7 + 3) % 32);
}

// warp sum by butterfly, then block sum through shared memory
__global__ void k_reduce(float *out, const float *in, int n) {
    __shared__ float warp_sums[32];
    float v = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) v += in[i];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        int nw = (blockDim.x + 31) / 32;
        float w = (int)threadIdx.x < nw ? warp_sums[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) w += __shfl_down_sync(0xffffffffu, w, o);
        if (threadIdx.x == 0) out[blockIdx.x] = w;
    }
}

// only the low half of each warp takes part (mask 0x0000ffff)
__global__ void k_half_mask(int *out) {
    int t = threadIdx.x, lane = t % 32;
    int r = -7;
    if (lane < 16) r = __shfl_down_sync(0x0000ffffu, t, 1, 16);
    out[t] = r;
}

__global__ void k_votes(unsigned *out) {
    int t = threadIdx.x, lane = t % 32;
    out[4 * t + 0] = __ballot_sync(0xffffffffu, lane % 3 == 0);
    out[4 * t + 1] = (unsigned)__any_sync(0xffffffffu, t == 40);
    out[4 * t + 2] = (unsigned)__all_sync(0xffffffffu, lane < 40);
    __syncwarp();
    out[4 * t + 3] = __activemask();
}

// two different __syncwarp call sites with the same mask synchronise together (sm_70+)
__global__ void k_syncwarp_sites(int *out) {
    __shared__ int s[32];
    int lane = threadIdx.x;
    s[lane] = lane * 2;
    if (lane & 1) __syncwarp();
    else __syncwarp();
    out[lane] = s[31 - lane];
}

__global__ void k_dyn_smem(float *out, const float *in, int n) {
    DYNAMIC_SMEM(float, buf);
    int t = threadIdx.x;
    if (t < n) buf[t] = in[blockIdx.x * n + t];
    __syncthreads();
    if (t < n) out[blockIdx.x * n + t] = buf[n - 1 - t];
}

__global__ void k_poison(unsigned *out) {
    __shared__ unsigned s[64];
    if (blockIdx.x == 0) s[threadIdx.x] = 5;
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = s[threadIdx.x];
}

__global__ void k_dyn_poison(unsigned *out) {
    DYNAMIC_SMEM(unsigned, s);
    if (blockIdx.x == 0) s[threadIdx.x] = 5;
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = s[threadIdx.x];
}

// parameters are per-thread copies
__global__ void k_params(int *out, int x) {
    x += threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = x;
}

template <int A, int B>
__global__ void k_template(int *out) { out[threadIdx.x] = A * 100 + B + (int)threadIdx.x; }

// ---- deliberately broken kernels
__global__ void k_deadlock(int *out) {
    int t = threadIdx.x;
    if (t == 0) out[0] = __shfl_sync(0xffffffffu, t, 1);   // lanes 1..31 never come
    else __syncthreads();
}
__global__ void k_exit_before_barrier(int *out) {
    if (threadIdx.x == 3) return;
    __syncthreads();
    out[threadIdx.x] = 1;
}
__global__ void k_divergent_barrier(int *out) {
    if (threadIdx.x < 16) __syncthreads();
    else __syncthreads();
    out[threadIdx.x] = 1;
}
__global__ void k_lane_exited(int *out) {
    if (threadIdx.x == 0) return;
    out[threadIdx.x] = __shfl_sync(0xffffffffu, (int)threadIdx.x, 0);
}
__global__ void k_mixed_collectives(int *out) {
    int t = threadIdx.x;
    if (t < 8) out[t] = __ballot_sync(0xffffffffu, 1);
    else out[t] = __shfl_sync(0xffffffffu, t, 0);
}
__global__ void k_spin(int *out, int n) {
    // a long-running block: threads only synchronise through barriers
    int acc = 0;
    for (int i = 0; i < n; i++) {
        acc += __syncthreads_count(((int)threadIdx.x + i) % 2);
    }
    out[threadIdx.x] = acc;
}

// ---- wmma
using namespace nvcuda;
// C (16 x 16, fp32, ldc) = A (16 x 32) B (32 x 16) + C, each warp of the block on its own
// matrices (offset by warp * stride); A, B bf16 in the layouts chosen by the template
template <class LA, class LB>
__global__ void k_wmma_gemm(float *c, const __nv_bfloat16 *a, const __nv_bfloat16 *b, int lda,
                            int ldb, int ldc, int c_col_major, size_t stride) {
    const int w = threadIdx.x / 32;
    const __nv_bfloat16 *aw = a + w * stride, *bw = b + w * stride;
    float *cw = c + w * stride;
    const wmma::layout_t cl = c_col_major ? wmma::mem_col_major : wmma::mem_row_major;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, LA> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, LB> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::load_matrix_sync(acc, cw, ldc, cl);
    for (int k = 0; k < 32; k += 16) {
        // element (m, k) of A and (k, n) of B in their memory layouts
        const bool a_col = std::is_same<LA, wmma::col_major>::value;
        const bool b_col = std::is_same<LB, wmma::col_major>::value;
        wmma::load_matrix_sync(fa, aw + (a_col ? k * lda : k), lda);
        wmma::load_matrix_sync(fb, bw + (b_col ? k : k * ldb), ldb);
        wmma::mma_sync(acc, fa, fb, acc);
    }
    for (int i = 0; i < acc.num_elements; i++) acc.x[i] *= 2.0f;   // layout-independent
    wmma::store_matrix_sync(cw, acc, ldc, cl);
}
// dumps lane-owned elements in "x[] order": depends on the (opaque) layout
__global__ void k_wmma_dump(float *out, const float *m) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::load_matrix_sync(acc, m, 16, wmma::mem_row_major);
    for (int i = 0; i < acc.num_elements; i++) out[threadIdx.x * acc.num_elements + i] = acc.x[i];
}
__global__ void k_wmma_bad(float *m, int what) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 1.0f);
    if (what == 0 && threadIdx.x == 5) return;                   // a lane never comes
    if (what == 0) wmma::store_matrix_sync(m, acc, 16, wmma::mem_row_major);
    if (what == 1) wmma::store_matrix_sync(m + 4, acc, 16, wmma::mem_row_major);   // 16 B only
    if (what == 2) wmma::store_matrix_sync(m, acc, 18, wmma::mem_row_major);       // ldm % 4
    if (what == 3) wmma::store_matrix_sync(m + (threadIdx.x & 1) * 32, acc, 16, wmma::mem_row_major);
    if (what == 4) wmma::store_matrix_sync(m, acc, 16, wmma::mem_row_major);       // 48 threads
}

// ---------------------------------------------------------------- helpers

static void set_order(int o) { cuemu_set_order(o, 777 + (unsigned)o); }

static void test_barrier(void) {
    const dim3 blocks[] = {dim3(1), dim3(33), dim3(256), dim3(1024), dim3(8, 4, 2), dim3(5, 7)};
    for (int o = 0; o < 3; o++)
        for (const dim3 &b : blocks) {
            int n = (int)(b.x * b.y * b.z);
            dim3 g(3, 2);
            int nb = 6, rounds = 3;
            int *out = (int *)malloc(sizeof(int) * n * nb);
            set_order(ORDERS[o]);
            LAUNCH_KERNEL(g, b, 0, 0, k_barrier)(out, rounds);
            cudaError_t e = cudaGetLastError();
            // CPU model of the same rounds
            int bad = 0;
            int *cur = (int *)malloc(sizeof(int) * n), *nxt = (int *)malloc(sizeof(int) * n);
            for (int blk = 0; blk < nb; blk++) {
                for (int t = 0; t < n; t++) cur[t] = t + 1000 * blk;
                for (int r = 0; r < rounds; r++) {
                    for (int t = 0; t < n; t++) nxt[t] = cur[(t + 1) % n] + cur[(t + n - 1) % n];
                    memcpy(cur, nxt, sizeof(int) * n);
                }
                for (int t = 0; t < n; t++) bad += out[blk * n + t] != cur[t];
            }
            EXPECT(e == cudaSuccess && bad == 0, "barrier block (%u,%u,%u) order %s: %d wrong, %s",
                   b.x, b.y, b.z, cuemu_order_name(ORDERS[o]), bad, cudaGetErrorString(e));
            free(cur); free(nxt); free(out);
        }
}

static void test_missing_barrier(void) {
    // without __syncthreads, thread t reads s[t+1] before thread t+1 wrote it in forward
    // order (and s[0] is unwritten for the last thread in reverse order): the poisoned
    // shared memory makes the result wrong in every order, and so the bug is caught
    for (int o = 0; o < 3; o++) {
        const int n = 64, nb = 3;
        int out[n * nb];
        set_order(ORDERS[o]);
        LAUNCH_KERNEL(dim3(nb), dim3(n), 0, 0, k_missing_barrier)(out);
        int wrong = 0, poison = 0;
        for (int b = 0; b < nb; b++)
            for (int t = 0; t < n; t++) {
                wrong += out[b * n + t] != (t + 1) % n;
                poison += out[b * n + t] == -1;
            }
        EXPECT(cudaGetLastError() == cudaSuccess && wrong > 0 && poison > 0,
               "missing barrier not detected in %s order (%d wrong, %d poisoned)",
               cuemu_order_name(ORDERS[o]), wrong, poison);
    }
}

static void test_barrier_votes(void) {
    for (int o = 0; o < 3; o++) {
        const int n = 100;
        int out[4 * n];
        set_order(ORDERS[o]);
        LAUNCH_KERNEL(dim3(1), dim3(n), 0, 0, k_barrier_votes)(out);
        int bad = 0;
        for (int t = 0; t < n; t++)
            bad += out[4 * t] != 34 || out[4 * t + 1] != 1 || out[4 * t + 2] != 1 ||
                   out[4 * t + 3] != 0;
        EXPECT(bad == 0, "__syncthreads_count/and/or wrong in %s order (%d)",
               cuemu_order_name(ORDERS[o]), bad);
    }
}

// reference for one shuffle kind on a full warp (the blocks here are whole warps)
static int shfl_src(int kind, int lane, int arg, int width) {
    int seg = lane & ~(width - 1), src = lane;
    switch (kind) {
    case 0: src = seg + (arg & (width - 1)); break;
    case 1: src = lane - arg; if (src < seg) src = lane; break;
    case 2: src = lane + arg; if (src >= seg + width) src = lane; break;
    default: src = lane ^ arg; if (src >= seg + width) src = lane; break;
    }
    return src;
}

template <class T>
static void test_shfl_type(const char *tname, T (*make)(int), bool (*eq)(T, T)) {
    static const char *kinds[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
                                  "__shfl_xor_sync"};
    const int n = 64;
    T in[n], out[n];
    for (int i = 0; i < n; i++) in[i] = make(i * 3 + 1);
    const int widths[] = {32, 16, 8, 2};
    const int args[] = {0, 1, 3, 5, 17};
    for (int o = 0; o < 3; o++)
        for (int kind = 0; kind < 4; kind++) {
            int bad = 0, runs = 0;
            for (int w : widths)
                for (int a : args) {
                    set_order(ORDERS[o]);
                    LAUNCH_KERNEL(dim3(1), dim3(n), 0, 0, k_shfl<T>)(out, in, kind, a, w);
                    if (cudaGetLastError() != cudaSuccess) bad++;
                    for (int t = 0; t < n; t++) {
                        int lane = t % 32, src = (t / 32) * 32 + shfl_src(kind, lane, a, w);
                        if (!eq(out[t], in[src])) bad++;
                    }
                    runs++;
                }
            EXPECT(bad == 0, "%s<%s> %s order: %d wrong of %d runs", kinds[kind], tname,
                   cuemu_order_name(ORDERS[o]), bad, runs);
        }
}

static float mk_f(int i) { return (float)i * 0.5f - 3.0f; }
static bool eq_f(float a, float b) { return a == b; }
static int mk_i(int i) { return i * 7 - 100; }
static bool eq_i(int a, int b) { return a == b; }
static double mk_d(int i) { return (double)i * 1e10 + 0.25; }
static bool eq_d(double a, double b) { return a == b; }
static __nv_bfloat16 mk_b(int i) { return __float2bfloat16((float)i - 20.0f); }
static bool eq_b(__nv_bfloat16 a, __nv_bfloat16 b) {
    return __bfloat162float(a) == __bfloat162float(b);
}

static void test_shuffles(void) {
    test_shfl_type<float>("float", mk_f, eq_f);
    test_shfl_type<int>("int", mk_i, eq_i);
    test_shfl_type<double>("double", mk_d, eq_d);
    test_shfl_type<__nv_bfloat16>("bf16", mk_b, eq_b);
    for (int o = 0; o < 3; o++) {
        float in[96], out[96];
        for (int i = 0; i < 96; i++) in[i] = (float)i;
        set_order(ORDERS[o]);
        LAUNCH_KERNEL(dim3(1), dim3(96), 0, 0, k_shfl_perm)(out, in);
        int bad = 0;
        for (int t = 0; t < 96; t++) bad += out[t] != in[(t / 32) * 32 + (t % 32 * 7 + 3) % 32];
        EXPECT(bad == 0, "per-lane __shfl_sync sources, %s order: %d wrong",
               cuemu_order_name(ORDERS[o]), bad);
    }
}

static void test_reduce(void) {
    const int sizes[] = {32, 64, 96, 256, 1024};
    for (int o = 0; o < 3; o++)
        for (int bs : sizes) {
            const int n = 1000;
            float in[n], out[2];
            double ref = 0;
            for (int i = 0; i < n; i++) { in[i] = (float)(i % 17) - 8.0f; ref += in[i]; }
            set_order(ORDERS[o]);
            LAUNCH_KERNEL(dim3(2), dim3(bs), 0, 0, k_reduce)(out, in, n);
            EXPECT(cudaGetLastError() == cudaSuccess && out[0] == (float)ref && out[1] == (float)ref,
                   "block reduce %d threads %s: %g %g vs %g", bs, cuemu_order_name(ORDERS[o]),
                   out[0], out[1], ref);
        }
}

// a full-mask butterfly in a partial warp reads lanes that do not exist: undefined on a
// GPU, the poison value (NaN) here, so the classic "blockDim must be a multiple of 32"
// bug is caught
static void test_partial_warp_undefined(void) {
    for (int o = 0; o < 3; o++) {
        const int n = 1000;
        float in[n], out[2];
        for (int i = 0; i < n; i++) in[i] = 1.0f;
        set_order(ORDERS[o]);
        LAUNCH_KERNEL(dim3(2), dim3(40), 0, 0, k_reduce)(out, in, n);
        EXPECT(cudaGetLastError() == cudaSuccess && isnan(out[0]) && isnan(out[1]),
               "shuffle from a missing lane should give NaN, got %g (%s order)", out[0],
               cuemu_order_name(ORDERS[o]));
    }
}

static void test_half_mask_and_votes(void) {
    for (int o = 0; o < 3; o++) {
        set_order(ORDERS[o]);
        int out[64];
        LAUNCH_KERNEL(dim3(1), dim3(64), 0, 0, k_half_mask)(out);
        int bad = cudaGetLastError() != cudaSuccess;
        for (int t = 0; t < 64; t++) {
            int lane = t % 32;
            int want = lane < 16 ? (lane < 15 ? t + 1 : t) : -7;
            bad += out[t] != want;
        }
        EXPECT(bad == 0, "mask 0x0000ffff width 16 shuffle, %s order: %d wrong",
               cuemu_order_name(ORDERS[o]), bad);

        // 45 threads: warp 1 has lanes 0..12 only
        const int n = 45;
        unsigned v[4 * n];
        LAUNCH_KERNEL(dim3(1), dim3(n), 0, 0, k_votes)(v);
        bad = cudaGetLastError() != cudaSuccess;
        for (int t = 0; t < n; t++) {
            int warp = t / 32, nl = warp == 0 ? 32 : n - 32;
            unsigned lanes = nl == 32 ? 0xffffffffu : ((1u << nl) - 1);
            unsigned ballot = 0;
            for (int l = 0; l < nl; l++) if (l % 3 == 0) ballot |= 1u << l;
            bad += v[4 * t] != ballot;
            bad += v[4 * t + 1] != (unsigned)(warp == 1 && nl > 8);   // t == 40 is lane 8 of warp 1
            bad += v[4 * t + 2] != 1u;
            // __activemask: the warp's live lanes (own lane included, only existing lanes)
            bad += !(v[4 * t + 3] >> (t % 32) & 1u) || (v[4 * t + 3] & ~lanes) != 0;
        }
        EXPECT(bad == 0, "ballot/any/all/activemask on a partial warp, %s order: %d wrong",
               cuemu_order_name(ORDERS[o]), bad);

        int s[32];
        LAUNCH_KERNEL(dim3(1), dim3(32), 0, 0, k_syncwarp_sites)(s);
        bad = cudaGetLastError() != cudaSuccess;
        for (int l = 0; l < 32; l++) bad += s[l] != (31 - l) * 2;
        EXPECT(bad == 0, "__syncwarp from two call sites, %s order: %d wrong",
               cuemu_order_name(ORDERS[o]), bad);
    }
}

static void test_shared_memory(void) {
    for (int o = 0; o < 3; o++) {
        set_order(ORDERS[o]);
        const int n = 77, nb = 4;
        float in[n * nb], out[n * nb];
        for (int i = 0; i < n * nb; i++) in[i] = (float)i;
        LAUNCH_KERNEL(dim3(nb), dim3(96), n * sizeof(float), 0, k_dyn_smem)(out, in, n);
        int bad = cudaGetLastError() != cudaSuccess;
        for (int b = 0; b < nb; b++)
            for (int t = 0; t < n; t++) bad += out[b * n + t] != in[b * n + n - 1 - t];
        EXPECT(bad == 0, "dynamic shared memory, %s order: %d wrong", cuemu_order_name(ORDERS[o]),
               bad);

        // shared memory is poisoned at every block start: blocks > 0 see 0xffffffff
        unsigned p[64 * 3], q[64 * 3];
        LAUNCH_KERNEL(dim3(3), dim3(64), 0, 0, k_poison)(p);
        LAUNCH_KERNEL(dim3(3), dim3(64), 64 * sizeof(unsigned), 0, k_dyn_poison)(q);
        bad = 0;
        for (int i = 0; i < 64 * 3; i++) {
            unsigned want = i < 64 ? 5u : 0xffffffffu;
            bad += p[i] != want;
            bad += q[i] != want;
        }
        EXPECT(bad == 0, "shared memory poisoned at block start, %s order: %d wrong",
               cuemu_order_name(ORDERS[o]), bad);

        int r[40];
        LAUNCH_KERNEL(dim3(1), dim3(40), 0, 0, k_params)(r, 1000);
        bad = 0;
        for (int t = 0; t < 40; t++) bad += r[t] != 1000 + t;
        EXPECT(bad == 0, "per-thread parameter copies, %s order", cuemu_order_name(ORDERS[o]));

        LAUNCH_KERNEL(dim3(1), dim3(8), 0, 0, k_template<3, 4>)(r);
        bad = 0;
        for (int t = 0; t < 8; t++) bad += r[t] != 304 + t;
        EXPECT(bad == 0, "template kernel through LAUNCH_KERNEL, %s order",
               cuemu_order_name(ORDERS[o]));
    }
}

// each broken kernel must fail its launch with a message containing `what`
static void expect_launch_error(const char *name, const char *what, cudaError_t want) {
    cudaError_t e = cudaGetLastError();
    const char *msg = cuemu_last_error_message();
    EXPECT(e == want && strstr(msg, what) != NULL, "%s: got %s, message '%s' (want '%s')", name,
           cudaGetErrorName(e), msg, what);
}

static void test_errors(void) {
    cuemu_set_quiet(1);
    int out[1024];
    for (int o = 0; o < 3; o++) {
        set_order(ORDERS[o]);
        LAUNCH_KERNEL(dim3(2), dim3(64), 0, 0, k_deadlock)(out);
        expect_launch_error("deadlock", "deadlock", cudaErrorLaunchFailure);
        LAUNCH_KERNEL(dim3(2), dim3(64), 0, 0, k_exit_before_barrier)(out);
        expect_launch_error("exit before barrier", "must reach __syncthreads", cudaErrorLaunchFailure);
        LAUNCH_KERNEL(dim3(1), dim3(32), 0, 0, k_divergent_barrier)(out);
        expect_launch_error("divergent barrier", "divergent __syncthreads", cudaErrorLaunchFailure);
        LAUNCH_KERNEL(dim3(1), dim3(32), 0, 0, k_lane_exited)(out);
        expect_launch_error("lane exited", "exited", cudaErrorLaunchFailure);
        LAUNCH_KERNEL(dim3(1), dim3(32), 0, 0, k_mixed_collectives)(out);
        expect_launch_error("mixed collectives", "divergent warp collectives", cudaErrorLaunchFailure);
    }
    LAUNCH_KERNEL(dim3(1), dim3(2048), 0, 0, k_params)(out, 0);
    expect_launch_error("block of 2048", "invalid block", cudaErrorInvalidConfiguration);
    LAUNCH_KERNEL(dim3(0), dim3(32), 0, 0, k_params)(out, 0);
    expect_launch_error("empty grid", "invalid grid", cudaErrorInvalidConfiguration);
    LAUNCH_KERNEL(dim3(1), dim3(32), 64 * 1024, 0, k_params)(out, 0);
    expect_launch_error("64 KiB dynamic smem", "dynamic shared memory", cudaErrorInvalidValue);
    cuemu_set_quiet(0);
    cuemu_clear_error();
    // the emulator keeps working after failed launches (stacks reused)
    test_barrier_votes();
}

// ---- wmma
template <class LA, class LB>
static void wmma_gemm_case(int c_col, const char *name) {
    const int lda = 40, ldb = 40, ldc = 20, warps = 2;   // padded leading dimensions
    const size_t stride = 2048;
    __nv_bfloat16 *a, *b;
    float *c, *c0, *ref;
    if (posix_memalign((void **)&a, 256, sizeof *a * stride * warps) ||
        posix_memalign((void **)&b, 256, sizeof *b * stride * warps) ||
        posix_memalign((void **)&c, 256, sizeof *c * stride * warps))
        abort();
    c0 = (float *)malloc(sizeof *c * stride * warps);
    ref = (float *)malloc(sizeof *c * stride * warps);
    const bool a_col = std::is_same<LA, wmma::col_major>::value;
    const bool b_col = std::is_same<LB, wmma::col_major>::value;
    unsigned seed = 99;
    auto rnd = [&]() { seed = seed * 1103515245u + 12345u; return (float)((seed >> 9) % 2001) / 1000.0f - 1.0f; };
    for (size_t i = 0; i < stride * warps; i++) {
        a[i] = __float2bfloat16(rnd());
        b[i] = __float2bfloat16(rnd());
        c0[i] = rnd();
    }
    for (int w = 0; w < warps; w++)
        for (int m = 0; m < 16; m++)
            for (int n = 0; n < 16; n++) {
                size_t ci = w * stride + (c_col ? (size_t)n * ldc + m : (size_t)m * ldc + n);
                double acc = c0[ci];
                for (int k = 0; k < 32; k++) {
                    float av = __bfloat162float(a[w * stride + (a_col ? (size_t)k * lda + m : (size_t)m * lda + k)]);
                    float bv = __bfloat162float(b[w * stride + (b_col ? (size_t)n * ldb + k : (size_t)k * ldb + n)]);
                    acc += (double)av * bv;
                }
                ref[ci] = (float)(2.0 * acc);
            }
    float *first = (float *)malloc(sizeof *c * stride * warps);
    for (int o = 0; o < 3; o++) {
        memcpy(c, c0, sizeof *c * stride * warps);
        set_order(ORDERS[o]);
        LAUNCH_KERNEL(dim3(1), dim3(32 * warps), 0, 0, k_wmma_gemm<LA, LB>)(c, a, b, lda, ldb, ldc, c_col, stride);
        cudaError_t e = cudaGetLastError();
        double worst = 0;
        int untouched_bad = 0;
        for (int w = 0; w < warps; w++)
            for (int m = 0; m < 16; m++)
                for (int n = 0; n < 16; n++) {
                    size_t ci = w * stride + (c_col ? (size_t)n * ldc + m : (size_t)m * ldc + n);
                    double d = fabs((double)c[ci] - ref[ci]);
                    if (d > worst) worst = d;
                }
        // padding between rows/columns (ldc > 16) is not written
        for (int w = 0; w < warps; w++)
            for (int r = 0; r < 16; r++)
                for (int x = 16; x < ldc; x++) untouched_bad += c[w * stride + r * ldc + x] != c0[w * stride + r * ldc + x];
        // fp32 sum of 32 exact products of size <= 1 plus C: error <= 33 * 2^-24 * 34
        EXPECT(e == cudaSuccess && worst < 1e-4 && untouched_bad == 0,
               "wmma gemm %s c_%s order %s: max error %.3g, %d padding writes, %s", name,
               c_col ? "col" : "row", cuemu_order_name(ORDERS[o]), worst, untouched_bad,
               cudaGetErrorString(e));
        if (o == 0) memcpy(first, c, sizeof *c * stride * warps);
        else EXPECT(memcmp(first, c, sizeof *c * stride * warps) == 0,
                    "wmma gemm %s: orders (= different fragment layouts) disagree", name);
    }
    free(a); free(b); free(c); free(c0); free(ref); free(first);
}

static void test_wmma(void) {
    for (int c_col = 0; c_col < 2; c_col++) {
        wmma_gemm_case<wmma::row_major, wmma::col_major>(c_col, "A row, B col");
        wmma_gemm_case<wmma::row_major, wmma::row_major>(c_col, "A row, B row");
        wmma_gemm_case<wmma::col_major, wmma::col_major>(c_col, "A col, B col");
        wmma_gemm_case<wmma::col_major, wmma::row_major>(c_col, "A col, B row");
    }
    // the element layout is opaque: two launches (different seeds) order x[] differently,
    // but hold the same 256 values
    float *m, d1[256], d2[256];
    if (posix_memalign((void **)&m, 256, 256 * sizeof(float))) abort();
    for (int i = 0; i < 256; i++) m[i] = (float)i;
    cuemu_set_order(CUEMU_FORWARD, 1);
    LAUNCH_KERNEL(dim3(1), dim3(32), 0, 0, k_wmma_dump)(d1, m);
    cuemu_set_order(CUEMU_FORWARD, 2);
    LAUNCH_KERNEL(dim3(1), dim3(32), 0, 0, k_wmma_dump)(d2, m);
    int seen1[256] = {0}, seen2[256] = {0}, same_pos = 0;
    for (int i = 0; i < 256; i++) {
        seen1[(int)d1[i] & 255]++;
        seen2[(int)d2[i] & 255]++;
        same_pos += d1[i] == d2[i];
    }
    int perm_ok = 1;
    for (int i = 0; i < 256; i++) perm_ok &= seen1[i] == 1 && seen2[i] == 1;
    EXPECT(cudaGetLastError() == cudaSuccess && perm_ok && same_pos < 32,
           "wmma layout: permutation %d, %d of 256 elements at the same place in two launches",
           perm_ok, same_pos);
    // misuse
    cuemu_set_quiet(1);
    for (int o = 0; o < 3; o++) {
        set_order(ORDERS[o]);
        LAUNCH_KERNEL(dim3(1), dim3(64), 0, 0, k_wmma_bad)(m, 0);
        expect_launch_error("wmma lane missing", "exited", cudaErrorLaunchFailure);
        LAUNCH_KERNEL(dim3(1), dim3(32), 0, 0, k_wmma_bad)(m, 1);
        expect_launch_error("wmma misaligned", "32-byte) aligned", cudaErrorLaunchFailure);
        LAUNCH_KERNEL(dim3(1), dim3(32), 0, 0, k_wmma_bad)(m, 2);
        expect_launch_error("wmma ldm", "ldm 18", cudaErrorLaunchFailure);
        LAUNCH_KERNEL(dim3(1), dim3(32), 0, 0, k_wmma_bad)(m, 3);
        expect_launch_error("wmma lanes disagree", "every lane must pass the same", cudaErrorLaunchFailure);
        LAUNCH_KERNEL(dim3(1), dim3(48), 0, 0, k_wmma_bad)(m, 4);
        expect_launch_error("wmma partial warp", "partial warp", cudaErrorLaunchFailure);
    }
    cuemu_set_quiet(0);
    cuemu_clear_error();
    free(m);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void test_speed(void) {
    set_order(CUEMU_FORWARD);
    int out[256];
    unsigned long long s0, s1;
    cuemu_stats(NULL, NULL, &s0);
    double t0 = now();
    LAUNCH_KERNEL(dim3(4), dim3(256), 0, 0, k_spin)(out, 200);
    double dt = now() - t0;
    cuemu_stats(NULL, NULL, &s1);
    EXPECT(cudaGetLastError() == cudaSuccess && out[0] == 200 * 128, "spin kernel: %d", out[0]);
    printf("test_emu: %llu fiber switches in %.3f s (%.0f ns per switch incl. barrier work)\n",
           s1 - s0, dt, dt * 1e9 / (double)(s1 - s0));
}

int main(void) {
    alarm(120);   // a hang is a failure even if deadlock detection broke
    test_barrier();
    test_missing_barrier();
    test_barrier_votes();
    test_shuffles();
    test_reduce();
    test_partial_warp_undefined();
    test_half_mask_and_votes();
    test_shared_memory();
    test_errors();
    test_wmma();
    test_speed();
    TEST_SUMMARY("test_emu");
}
