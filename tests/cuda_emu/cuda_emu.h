// cuda_emu.h: run CUDA kernel sources on the CPU. The same .cu file compiles with nvcc and,
// as C++ (g++ -x c++ -std=gnu++17 -fno-strict-aliasing) with this header, on the host.
//
// Model (see tests/cuda_emu/README.md for the full semantics):
//   - A launch runs the grid's blocks one at a time per emulator worker (an OS thread; the
//     workers take blocks from a shared queue, CUEMU_WORKERS, default min(#cpus, 4)).
//   - The threads of a block are fibers on that worker, switched by a small x86-64
//     context switch (cuda_emu.cpp). They run cooperatively: a fiber runs until it reaches
//     __syncthreads, a warp collective or its end.
//   - __syncthreads() is a barrier over the block's threads. Reaching one after some thread
//     of the block exited, or with threads waiting at different __syncthreads call sites,
//     is reported as an error (CUDA requires every thread to reach the same barrier).
//   - Warp shuffles, votes and __syncwarp are one rendezvous per operation: every lane of
//     the mask deposits its value, the last to arrive computes all results at once.
//   - No runnable thread while some wait = deadlock: reported (which threads wait where),
//     the launch fails with cudaErrorLaunchFailure instead of hanging.
//   - `__shared__` variables are `static thread_local`: one copy per worker, i.e. per
//     running block. At every block start the emulator fills all of this executable's
//     thread-local storage on the worker with 0xFF bytes (NaN for floats, -1 for ints), and
//     the dynamic shared memory too, so reads before writes and missing barriers show up.
//     Dynamic shared memory must be declared with DYNAMIC_SMEM(T, name), not extern.
//   - Thread order (forward, reverse, random) applies to the order in which runnable
//     threads are resumed and to the order of blocks: CUEMU_ORDER / cuemu_set_order().
//   - nvcuda::wmma (bf16 16x16x16, fp32 accumulate; cuda_emu_wmma.h): loads, stores and
//     mma_sync are full-warp collectives; the fragment element layout is an opaque random
//     permutation per launch.
//   - Device pointers are host pointers. Streams: by default a launch runs before it
//     returns; with the asynchronous runtime (cuda_emu_stream.cpp, on in finetune_emu and
//     test_backend_emu, cuemu_set_async()) it is queued on its stream and runs later on
//     that stream's worker, its arguments copied at launch and its pointer parameters
//     recorded as accesses (`const T *` = read, `T *` = read + write, of the whole device
//     block that contains the pointer) for the ordering checker (cuda_emu_shadow.cpp).
#pragma once
#if defined(__CUDACC__)
#error "cuda_emu.h is for host (emulated) builds only; nvcc builds use the real CUDA"
#endif
#if !defined(__x86_64__)
#error "cuda_emu needs x86-64 (hand-written context switch)"
#endif

// Must precede every CUDA header: crt/host_defines.h keeps a __shared__ defined before it.
#define __shared__ static thread_local
#define __launch_bounds__(...)

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

// ----------------------------------------------------------------------------
// emulator control (C linkage so C test code can use it too)
extern "C" {
enum { CUEMU_FORWARD = 0, CUEMU_REVERSE = 1, CUEMU_RANDOM = 2 };
// Thread/block order for the following launches; seed only matters for CUEMU_RANDOM.
void cuemu_set_order(int order, unsigned long long seed);
int cuemu_get_order(void);
const char *cuemu_order_name(int order);
// Do not print launch errors or ordering hazards to stderr (tests that provoke them).
void cuemu_set_quiet(int quiet);
// The message of the most recent failed launch ("" if none since the last clear).
const char *cuemu_last_error_message(void);
// Forget the last launch error and the sticky error of a failed asynchronous operation.
void cuemu_clear_error(void);
// Counters since start: launches, blocks, fiber switches.
void cuemu_stats(unsigned long long *launches, unsigned long long *blocks,
                 unsigned long long *switches);

// The asynchronous runtime (tests/cuda_emu/README.md, "Streams and ordering hazards").
// on = 1: launches, async copies/memsets, cuBLASLt and NCCL are queued on their streams;
// 0: they run before returning. Set before the first stream operation (the environment,
// FT_EMU_SYNC=1, overrides the program's default). Returns the mode now in force.
int cuemu_set_async(int on);
int cuemu_async(void);
// Ordering hazards reported so far (each also printed to stderr as one "cuda_emu: HAZARD"
// line); a process that reported any exits with status CUEMU_HAZARD_EXIT at exit.
unsigned long long cuemu_hazard_count(void);
const char *cuemu_last_hazard(void);     // the latest report's text ("" if none)
void cuemu_hazard_reset(void);           // forget them (tests that provoke hazards)
// 1 if host reads of pending D2H results are watched (hardware watchpoints), else 0 and
// `why` says why not
int cuemu_host_watch_available(const char **why);
// Sub-allocations of a cudaMalloc'd arena (weak hooks called by src/backend_cuda.c): a
// kernel's pointer argument then stands for the block it points into, and a block freed
// (ordered on `stream`) while an operation not ordered before that point still uses it is
// reported.
void cuemu_block_alloc(void *p, size_t nbytes);
void cuemu_block_free(void *p, void *stream);
// Until a call with p NULL, kernels launched by this thread touch exactly [p, p + nbytes)
// through a pointer argument equal to p instead of its whole block (a weak hook the CUDA
// backend calls around ops on one slice of a flat buffer).
void cuemu_launch_extent(const void *p, size_t nbytes);
}
enum { CUEMU_HAZARD_EXIT = 86 };

namespace cuemu {

enum WarpOp { OP_SHFL_IDX, OP_SHFL_UP, OP_SHFL_DOWN, OP_SHFL_XOR, OP_BALLOT, OP_ANY, OP_ALL,
              OP_SYNCWARP, OP_COLLECTIVE };
enum BarKind { BAR_PLAIN, BAR_COUNT, BAR_AND, BAR_OR };

struct Fiber;
// per-worker state; the only thread-local the emulator itself uses (it is exempt from the
// shared-memory poisoning)
struct Worker {
    Fiber *cur;          // running fiber (thread)
    uint3 block_idx;
    dim3 block_dim, grid_dim;
    unsigned char *dyn_smem;
    const unsigned char *wmma_layout;   // [3][256] fragment element -> matrix position (wmma)
};
extern __thread Worker *tls;

struct Fiber {
    uint3 tid;           // threadIdx
    // (the rest is private to cuda_emu.cpp)
};

// device-side entry points (implemented in cuda_emu.cpp)
int syncthreads_at(const char *file, int line, int kind, int pred);
unsigned long long warp_op(int op, const char *file, int line, unsigned mask,
                           unsigned long long value, int arg, int width);
unsigned activemask();
// A full-warp collective with an arbitrary action (used by wmma): every lane of the warp
// deposits `lane_arg`; the last to arrive runs fn(lane_args[32], err, errlen) once, which
// returns nullptr or an error message (written to err) that fails the launch. All 32 lanes
// must exist and call it from the same call site.
typedef const char *(*CollectiveFn)(void *const *lane_args, char *err, size_t errlen);
void warp_collective(const char *what, const char *file, int line, void *lane_arg,
                     CollectiveFn fn);
void *dynamic_smem();

template <class T>
static inline T shfl_at(int op, const char *file, int line, unsigned mask, T var, int arg,
                        int width = 32) {
    static_assert(sizeof(T) <= 8, "cuda_emu: shuffle of a type wider than 8 bytes");
    static_assert(std::is_trivially_copyable<T>::value, "cuda_emu: shuffle of a non-POD");
    unsigned long long bits = 0;
    memcpy(&bits, (const void *)&var, sizeof(T));
    bits = warp_op(op, file, line, mask, bits, arg, width);
    T out;
    memcpy((void *)&out, &bits, sizeof(T));
    return out;
}

// ---------------------------------------------------------------- launches
struct LaunchSpec {
    dim3 grid, block;
    size_t smem;
    const char *name, *file;
    int line;
};
// A kernel's pointer parameter, recorded for the ordering checker.
struct KernelPtr {
    const void *p;
    bool is_const;       // `const T *`: read only; otherwise read and write
};
// Launch `body` (one call = one thread) on `stream`: before returning (synchronous mode) or
// queued (asynchronous mode; `body` owns copies of the arguments).
cudaError_t launch_on(const LaunchSpec &spec, cudaStream_t stream, const KernelPtr *ptrs,
                      int nptrs, std::function<void()> body);

// the kernel's parameter types, so arguments convert as CUDA converts them and pointer
// parameters can be told apart by constness
template <class K>
struct KernelParams {
    template <class... A>
    using tuple = std::tuple<typename std::decay<A>::type...>;   // not a plain function
    template <class... A>
    static tuple<A...> make(A &&...args) { return tuple<A...>(std::forward<A>(args)...); }
};
template <class... P>
struct KernelParams<void (*)(P...)> {
    template <class... A>
    static std::tuple<typename std::decay<P>::type...> make(A &&...args) {
        return std::tuple<typename std::decay<P>::type...>(std::forward<A>(args)...);
    }
};

template <class T>
static inline void add_kernel_ptr(KernelPtr *out, int *n, const T &v) {
    if constexpr (std::is_pointer<T>::value) {
        out[(*n)++] = {(const void *)v, std::is_const<typename std::remove_pointer<T>::type>::value};
    } else {
        (void)out; (void)n; (void)v;
    }
}
template <class Tuple, size_t... I>
static inline int kernel_ptrs(const Tuple &t, KernelPtr *out, std::index_sequence<I...>) {
    int n = 0;
    (add_kernel_ptr(out, &n, std::get<I>(t)), ...);
    return n;
}

template <class K>
struct Launcher {
    LaunchSpec spec;
    cudaStream_t stream;
    K kernel;
    template <class... A>
    void operator()(A &&...args) const {
        // arguments are copied once at launch (as CUDA copies them to the parameter
        // space); every thread's call gets its own copies of the by-value parameters
        auto params = std::make_shared<decltype(KernelParams<K>::make(std::forward<A>(args)...))>(
            KernelParams<K>::make(std::forward<A>(args)...));
        constexpr size_t np = std::tuple_size<typename decltype(params)::element_type>::value;
        KernelPtr ptrs[np + 1];
        int n = kernel_ptrs(*params, ptrs, std::make_index_sequence<np>());
        K k = kernel;
        launch_on(spec, stream, ptrs, n, [params, k]() { std::apply(k, *params); });
    }
};
template <class K>
static inline Launcher<K> make_launcher(dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                        K kernel, const char *name, const char *file,
                                        int line) {
    return Launcher<K>{{grid, block, smem, name, file, line}, stream, kernel};
}

} // namespace cuemu

// ----------------------------------------------------------------------------
// the CUDA built-ins

#define threadIdx (cuemu::tls->cur->tid)
#define blockIdx (cuemu::tls->block_idx)
#define blockDim (cuemu::tls->block_dim)
#define gridDim (cuemu::tls->grid_dim)
#define warpSize 32

#define __syncthreads() cuemu::syncthreads_at(__FILE__, __LINE__, cuemu::BAR_PLAIN, 0)
#define __syncthreads_count(p) cuemu::syncthreads_at(__FILE__, __LINE__, cuemu::BAR_COUNT, (p))
#define __syncthreads_and(p) cuemu::syncthreads_at(__FILE__, __LINE__, cuemu::BAR_AND, (p))
#define __syncthreads_or(p) cuemu::syncthreads_at(__FILE__, __LINE__, cuemu::BAR_OR, (p))

#define __shfl_sync(...) cuemu::shfl_at(cuemu::OP_SHFL_IDX, __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_up_sync(...) cuemu::shfl_at(cuemu::OP_SHFL_UP, __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_down_sync(...) cuemu::shfl_at(cuemu::OP_SHFL_DOWN, __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_xor_sync(...) cuemu::shfl_at(cuemu::OP_SHFL_XOR, __FILE__, __LINE__, __VA_ARGS__)
#define __ballot_sync(mask, pred) \
    ((unsigned)cuemu::warp_op(cuemu::OP_BALLOT, __FILE__, __LINE__, (mask), (pred) != 0, 0, 32))
#define __any_sync(mask, pred) \
    ((int)cuemu::warp_op(cuemu::OP_ANY, __FILE__, __LINE__, (mask), (pred) != 0, 0, 32))
#define __all_sync(mask, pred) \
    ((int)cuemu::warp_op(cuemu::OP_ALL, __FILE__, __LINE__, (mask), (pred) != 0, 0, 32))
#define __syncwarp(...) cuemu::syncwarp_at(__FILE__, __LINE__, ##__VA_ARGS__)
#define __activemask() cuemu::activemask()

namespace cuemu {
static inline void syncwarp_at(const char *file, int line, unsigned mask = 0xffffffffu) {
    warp_op(OP_SYNCWARP, file, line, mask, 0, 0, 32);
}
} // namespace cuemu

// LAUNCH_KERNEL(grid, block, smem_bytes, stream, kernel)(args...)  ==  kernel<<<...>>>(args...)
// (the kernel comes last so that template arguments with commas need no parentheses)
#define LAUNCH_KERNEL(grid, block, smem, stream, ...)                                           \
    cuemu::make_launcher((grid), (block), (smem), (stream), __VA_ARGS__, #__VA_ARGS__, __FILE__, \
                         __LINE__)
// DYNAMIC_SMEM(T, name): `T *name` = the launch's dynamic shared memory (128-byte aligned)
#define DYNAMIC_SMEM(T, name) T *name = reinterpret_cast<T *>(cuemu::dynamic_smem())

// ---------------------------------------------------------------- device functions
// Two builds of the same kernel source (tests/cuda_emu/emu.mk, kernels/kernels.mk):
//   default          exact host math: __expf = exp2f(x * log2e) (the GPU's product rounding,
//                    exact ex2), rsqrtf = 1/sqrtf, logf/expf from glibc (<= 1 ulp), no FMA
//                    contraction (x86-64 baseline has no FMA);
//   CUEMU_GPU_MATH   the real GPU's documented worst case (CUDA C Programming Guide,
//                    "Mathematical Functions", default nvcc flags: -prec-div=true
//                    -prec-sqrt=true -ftz=false): each approximate result is moved by its
//                    maximum ulp error, sign chosen by a hash of the input (deterministic,
//                    so thread orders still agree bit for bit): __expf 2 ulp on top of the
//                    rounded x * log2e (= the guide's 2 + floor(|1.173 x|)) and flushed to 0
//                    below FLT_MIN (ex2.approx.ftz), expf 2 ulp, logf 1 ulp, __logf 2 ulp,
//                    rsqrtf 2 ulp; sqrtf and '/' stay correctly rounded. Built with
//                    -mfma -ffp-contract=fast, so a * b + c contracts to fma as nvcc does.
// (glibc declares its own __expf, __logf, ... : the device versions are macros)
namespace cuemu {
#if defined(CUEMU_GPU_MATH)
static inline float ulp_nudge(float r, float x, int ulps) {
    if (!(r == r) || r == 0.0f || __builtin_isinf(r)) return r;
    uint32_t h;
    memcpy(&h, &x, 4);
    h ^= h >> 16; h *= 0x7feb352du; h ^= h >> 15; h *= 0x846ca68bu; h ^= h >> 16;
    const float toward = (h & 1u) ? __builtin_huge_valf() : -__builtin_huge_valf();
    for (int i = 0; i < ulps; i++) r = nextafterf(r, toward);
    return r;
}
static inline float expf_(float x) {
    float r = ulp_nudge(exp2f(x * 1.4426950408889634f), x, 2);
    return r < 1.17549435e-38f ? 0.0f : r;                 // .ftz
}
static inline float gpu_expf(float x) { return ulp_nudge(expf(x), x, 2); }
static inline float gpu_logf(float x) { return ulp_nudge(logf(x), x, 1); }
static inline float fast_logf(float x) { return ulp_nudge(logf(x), x, 2); }
static inline float gpu_rsqrtf(float x) { return ulp_nudge(1.0f / sqrtf(x), x, 2); }
#else
static inline float expf_(float x) { return exp2f(x * 1.4426950408889634f); }
static inline float fast_logf(float x) { return logf(x); }
static inline float gpu_rsqrtf(float x) { return 1.0f / sqrtf(x); }
#endif
static inline float exp10f_(float x) { return exp2f(x * 3.3219280948873623f); }
static inline void sincosf_(float x, float *s, float *c) { *s = sinf(x); *c = cosf(x); }
} // namespace cuemu
#if defined(CUEMU_GPU_MATH)
#define expf(x) cuemu::gpu_expf(x)
#define logf(x) cuemu::gpu_logf(x)
#endif
#define __expf(x) cuemu::expf_(x)
#define __exp10f(x) cuemu::exp10f_(x)
#define __logf(x) cuemu::fast_logf(x)
#define __log2f(x) log2f(x)
#define __log10f(x) log10f(x)
#define __powf(x, y) powf((x), (y))
#define __sinf(x) sinf(x)
#define __cosf(x) cosf(x)
#define __tanf(x) tanf(x)
#define __sincosf(x, s, c) cuemu::sincosf_((x), (s), (c))
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fsqrt_rn(float x) { return sqrtf(x); }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
static inline float rsqrtf(float x) { return cuemu::gpu_rsqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline unsigned __float_as_uint(float x) { unsigned u; memcpy(&u, &x, 4); return u; }
static inline float __uint_as_float(unsigned u) { float x; memcpy(&x, &u, 4); return x; }
static inline int __float_as_int(float x) { int u; memcpy(&u, &x, 4); return u; }
static inline float __int_as_float(int u) { float x; memcpy(&x, &u, 4); return x; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline unsigned __brev(unsigned x) {
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
    x = ((x >> 8) & 0x00ff00ffu) | ((x & 0x00ff00ffu) << 8);
    return (x >> 16) | (x << 16);
}
template <class T> static inline T __ldg(const T *p) { return *p; }
template <class T> static inline T __ldcs(const T *p) { return *p; }
template <class T> static inline void __stcs(T *p, T v) { *p = v; }
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
// integer atomics only (float atomics make reductions non-deterministic: not used here)
static inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline unsigned atomicAdd(unsigned *p, unsigned v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
static inline int atomicMax(int *p, int v) {
    int old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED,
                                                   __ATOMIC_RELAXED)) {}
    return old;
}

#include "cuda_emu_wmma.h"
