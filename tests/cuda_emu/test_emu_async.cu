// test_emu_async.cu: the asynchronous emulated runtime's own tests (cuda_emu_stream.cpp,
// cuda_emu_shadow.cpp): what it must report and what it must not.
//   reported: an unordered cross-stream read (read-after-write), write-after-read,
//             write-after-write, a host read of a copy's destination before a sync, a host
//             write to a copy's source before a sync, an arena block freed while another
//             stream's work uses it, a kernel using a freed block, a reuse of freed bytes
//             not ordered after their old users, a non-blocking stream not ordered by the
//             legacy stream, a kernel whose pointer's extent hint (cuemu_launch_extent)
//             overlaps another stream's copy, or without the hint; a kernel or a memset on
//             pageable host memory (host-memory-on-device); a copy against its kind (an
//             error, cudaErrorInvalidMemcpyDirection);
//   not reported: the same accesses ordered by an event, by a host synchronisation, by
//             stream order, by the legacy stream's implicit synchronisation, a hinted
//             kernel on bytes disjoint from a copy in flight, a kernel on pinned host memory;
//   semantics: kernel arguments are copied at launch; work really runs later (a gated
//             stream leaves cudaEventQuery/cudaStreamQuery not ready until released); a
//             failing kernel's error is sticky and surfaces at the next synchronisation.
// Each hazard test checks the count and that the report names both operations. A run with
// any hazard left unreset exits with CUEMU_HAZARD_EXIT, so the clean cases are checked
// twice. Host-read detection needs hardware watchpoints (perf_event_open): without them
// that case is a skip, and a FAIL when CI=true.
#include "cuda_emu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <atomic>

#include "test.h"

// ---------------------------------------------------------------- kernels

__global__ void k_fill(float *out, float v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = v;
}
__global__ void k_copy(float *out, const float *in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i];
}
__global__ void k_stuck(float *out) {   // thread 0 skips the barrier: a launch failure
    if (threadIdx.x != 0) __syncthreads();
    out[threadIdx.x] = 1.0f;
}

// ---------------------------------------------------------------- helpers

static const int N = 1000;
static cudaStream_t s1, s2;
static float *a, *b;

static void fill(float *p, float v, cudaStream_t s) { LAUNCH_KERNEL(dim3(4), dim3(256), 0, s, k_fill)(p, v, N); }
static void copy(float *dst, const float *src, cudaStream_t s) {
    LAUNCH_KERNEL(dim3(4), dim3(256), 0, s, k_copy)(dst, src, N);
}

// `want` hazards since the last check, the latest naming every string in `names`
static void expect_hazards(const char *what, unsigned long long want, const char *const *names) {
    cudaDeviceSynchronize();
    unsigned long long got = cuemu_hazard_count();
    const char *last = cuemu_last_hazard();
    bool named = true;
    for (int i = 0; names && names[i]; i++)
        if (!strstr(last, names[i])) named = false;
    EXPECT(got == want && named, "%s: %llu hazard(s), want %llu; last: '%s'", what, got, want, last);
    cuemu_hazard_reset();
}

// ---------------------------------------------------------------- device memory

static void test_cross_stream(void) {
    fill(a, 1.0f, s1);
    copy(b, a, s2);    // nothing orders the fill before the copy
    const char *raw[] = {"HAZARD read-after-write", "kernel k_copy", "kernel k_fill", "on stream", nullptr};
    expect_hazards("unordered cross-stream read", 1, raw);

    cudaEvent_t e;
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    fill(a, 2.0f, s1);
    cudaEventRecord(e, s1);
    cudaStreamWaitEvent(s2, e, 0);
    copy(b, a, s2);
    expect_hazards("event-ordered cross-stream read", 0, nullptr);
    float h = 0;
    cudaMemcpy(&h, b + N - 1, sizeof h, cudaMemcpyDeviceToHost);
    EXPECT(h == 2.0f, "event-ordered copy gave %g, want 2", h);

    fill(a, 3.0f, s1);
    cudaStreamSynchronize(s1);   // the host knows it finished: later work is ordered after
    copy(b, a, s2);
    expect_hazards("host-synchronised cross-stream read", 0, nullptr);

    copy(b, a, s1);    // reads a ...
    fill(a, 4.0f, s2); // ... which another stream overwrites meanwhile
    const char *war[] = {"HAZARD write-after-read", "kernel k_fill", "kernel k_copy", nullptr};
    expect_hazards("write while another stream reads", 1, war);

    cudaMemsetAsync(a, 0, N * sizeof(float), s1);
    cudaMemsetAsync(a, 0, 16, s2);
    const char *waw[] = {"HAZARD write-after-write", "cudaMemsetAsync (16 bytes)", "cudaMemsetAsync (4000 bytes)", nullptr};
    expect_hazards("unordered writes", 1, waw);

    // a wait recorded before the write does not order it
    cudaEventRecord(e, s1);
    fill(a, 5.0f, s1);
    cudaStreamWaitEvent(s2, e, 0);
    copy(b, a, s2);
    expect_hazards("event recorded before the write", 1, raw);
    cudaEventDestroy(e);
}

static void test_legacy_stream(void) {
    cudaStream_t blocking, nonblocking;
    cudaStreamCreate(&blocking);
    cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking);
    fill(a, 6.0f, 0);
    copy(b, a, blocking);   // the legacy stream orders blocking streams
    expect_hazards("legacy stream then a blocking stream", 0, nullptr);
    fill(a, 7.0f, blocking);
    copy(b, a, 0);          // and the other way round
    expect_hazards("blocking stream then the legacy stream", 0, nullptr);
    fill(a, 8.0f, 0);
    copy(b, a, nonblocking);
    const char *raw[] = {"HAZARD read-after-write", "kernel k_copy", "on stream 0", nullptr};
    expect_hazards("legacy stream then a non-blocking stream", 1, raw);
    cudaStreamDestroy(blocking);
    cudaStreamDestroy(nonblocking);
}

// ---------------------------------------------------------------- host memory

static void test_host_read(void) {
    const char *why = "";
    if (!cuemu_host_watch_available(&why)) {
        const char *ci = getenv("CI");
        if (ci && !strcmp(ci, "true")) EXPECT(0, "host-read watchpoints unavailable in CI: %s", why);
        else printf("skip: host read before a sync (no hardware watchpoints: %s)\n", why);
        return;
    }
    static double host_d;   // its own 8 bytes: the watchpoint covers all of it
    fill(a, 9.0f, s1);
    cudaMemcpyAsync(&host_d, a, sizeof(float), cudaMemcpyDeviceToHost, s1);
    volatile double early = host_d;   // before any synchronisation: a hazard
    (void)early;
    cudaStreamSynchronize(s1);
    const char *hr[] = {"HAZARD host-read-before-complete", "cudaMemcpyAsync device-to-host (4 bytes)", nullptr};
    expect_hazards("host read of a pending copy", 1, hr);

    cudaMemcpyAsync(&host_d, a, sizeof(float), cudaMemcpyDeviceToHost, s1);
    cudaStreamSynchronize(s1);
    float v;
    memcpy(&v, &host_d, sizeof v);
    expect_hazards("host read after the sync", 0, nullptr);
    EXPECT(v == 9.0f, "copy to the host gave %g, want 9", v);
}

static void test_host_write_source(void) {
    static float src[64];
    for (int i = 0; i < 64; i++) src[i] = (float)i;
    cudaMemcpyAsync(a, src, sizeof src, cudaMemcpyHostToDevice, s1);
    src[63] = -1.0f;   // the copy may not have read it yet
    cudaStreamSynchronize(s1);
    const char *hw[] = {"HAZARD host-write-before-complete", "cudaMemcpyAsync host-to-device (256 bytes)", nullptr};
    expect_hazards("host write to a pending copy's source", 1, hw);

    cudaMemcpyAsync(a, src, sizeof src, cudaMemcpyHostToDevice, s1);
    cudaStreamSynchronize(s1);
    src[63] = 63.0f;
    expect_hazards("host write after the sync", 0, nullptr);
}

// ---------------------------------------------------------------- arena blocks

static void test_arena(void) {
    char *arena = nullptr;
    cudaMalloc((void **)&arena, 1 << 16);
    float *blk = (float *)(arena + 4096);
    cuemu_block_alloc(blk, N * sizeof(float));
    fill(blk, 1.0f, s2);
    cuemu_block_free(blk, s1);   // the free is ordered on s1; s2's fill is not before it
    const char *fr[] = {"HAZARD free-while-in-use", "kernel k_fill", "arena block", nullptr};
    expect_hazards("free while another stream uses the block", 1, fr);

    cuemu_block_alloc(blk, N * sizeof(float));
    fill(blk, 1.0f, s1);
    cuemu_block_free(blk, s1);   // same stream: ordered (the kernels' scratch pattern)
    expect_hazards("free ordered after its users", 0, nullptr);

    fill(blk, 1.0f, s1);         // no live block there any more
    const char *uaf[] = {"HAZARD use-after-free", "kernel k_fill", nullptr};
    expect_hazards("kernel on a freed block", 1, uaf);

    cuemu_block_alloc(blk, N * sizeof(float));
    fill(blk, 2.0f, s1);
    cuemu_block_free(blk, s1);
    cuemu_block_alloc(blk, 64);  // the same bytes handed out again, used on s2 at once
    fill(blk, 3.0f, s2);
    const char *reuse[] = {"HAZARD read-after-write", "kernel k_fill", "on stream", nullptr};
    expect_hazards("reuse not ordered after the old users", 1, reuse);
    cuemu_block_free(blk, s2);
    cudaFree(arena);
}

// ---------------------------------------------------------------- launch extents

// cuemu_launch_extent narrows a kernel's pointer argument from its whole allocation to the
// given bytes: a kernel on one slice of a buffer while a copy reads another slice is fine;
// without the hint, or with a hint that overlaps the copy, it is a hazard.
static void test_extent(void) {
    float *c = nullptr;
    cudaMalloc((void **)&c, 2 * N * sizeof(float));
    float *host = (float *)malloc(N * sizeof(float));
    const char *war[] = {"HAZARD write-after-read", "kernel k_fill", "cudaMemcpyAsync device-to-host", nullptr};

    cudaMemcpyAsync(host, c + N, N * sizeof(float), cudaMemcpyDeviceToHost, s2);   // reads the second half
    fill(c, 1.0f, s1);                                                            // writes the first half
    expect_hazards("kernel on the whole allocation, no hint", 1, war);

    cudaMemcpyAsync(host, c + N, N * sizeof(float), cudaMemcpyDeviceToHost, s2);
    cuemu_launch_extent(c, N * sizeof(float));
    fill(c, 2.0f, s1);
    cuemu_launch_extent(nullptr, 0);
    expect_hazards("kernel hinted to the first half, copy of the second", 0, nullptr);

    cudaMemcpyAsync(host, c + N, N * sizeof(float), cudaMemcpyDeviceToHost, s2);
    cuemu_launch_extent(c, N * sizeof(float) + 4);   // one float into the copied half
    fill(c, 3.0f, s1);
    cuemu_launch_extent(nullptr, 0);
    expect_hazards("hint overlapping the copy", 1, war);

    cudaMemcpyAsync(host, c + N, N * sizeof(float), cudaMemcpyDeviceToHost, s2);
    fill(c, 4.0f, s1);   // the hint was cleared: the whole allocation again
    expect_hazards("after the hint is cleared", 1, war);
    free(host);
    cudaFree(c);
}

// ---------------------------------------------------------------- memory spaces

// On a GPU a kernel (or cuBLASLt, NCCL, a memset) given pageable host memory faults, and a
// copy whose kind contradicts its pointers is undefined; pinned host memory is reachable.
static void test_memory_spaces(void) {
    float *host = (float *)malloc(N * sizeof(float)), *pinned = nullptr;
    cudaMallocHost((void **)&pinned, N * sizeof(float));
    fill(host, 1.0f, s1);
    const char *hm[] = {"HAZARD host-memory-on-device", "kernel k_fill", "neither device memory", nullptr};
    expect_hazards("kernel on pageable host memory", 1, hm);
    cudaMemsetAsync(host, 0, 16, s1);
    const char *ms[] = {"HAZARD host-memory-on-device", "cudaMemsetAsync", nullptr};
    expect_hazards("memset of pageable host memory", 1, ms);
    fill(pinned, 1.0f, s1);
    expect_hazards("kernel on pinned host memory", 0, nullptr);
    cuemu_set_quiet(1);
    const cudaError_t wrong = cudaMemcpyAsync(host, a, 16, cudaMemcpyHostToDevice, s1);
    const cudaError_t wrong2 = cudaMemcpyAsync(a, b, 16, cudaMemcpyHostToDevice, s1);
    cuemu_set_quiet(0);
    EXPECT(wrong == cudaErrorInvalidMemcpyDirection && wrong2 == cudaErrorInvalidMemcpyDirection,
           "copies against their kind: %s, %s (want cudaErrorInvalidMemcpyDirection)", cudaGetErrorName(wrong),
           cudaGetErrorName(wrong2));
    EXPECT(cudaMemcpyAsync(pinned, a, 16, cudaMemcpyDeviceToHost, s1) == cudaSuccess &&
           cudaMemcpyAsync(b, a, 16, cudaMemcpyDefault, s1) == cudaSuccess, "copies of the right kind");
    expect_hazards("copies of the right kind", 0, nullptr);
    cudaStreamSynchronize(s1);
    cudaFreeHost(pinned);
    free(host);
}

// ---------------------------------------------------------------- semantics

static std::atomic<int> g_gate{0};
static void CUDART_CB gate(void *) {
    while (!g_gate.load()) usleep(100);
}

static void test_semantics(void) {
    cudaEvent_t e;
    cudaEventCreate(&e);
    EXPECT(cudaEventQuery(e) == cudaSuccess, "an event never recorded counts as complete");
    g_gate = 0;
    cudaLaunchHostFunc(s1, gate, nullptr);
    float v = 10.0f;
    fill(a, v, s1);
    v = 11.0f;                   // the launch already copied its arguments
    cudaEventRecord(e, s1);
    usleep(20000);
    EXPECT(cudaEventQuery(e) == cudaErrorNotReady && cudaStreamQuery(s1) == cudaErrorNotReady,
           "work behind a closed gate is not complete");
    g_gate = 1;
    EXPECT(cudaEventSynchronize(e) == cudaSuccess && cudaEventQuery(e) == cudaSuccess, "event completes");
    float h = 0;
    cudaMemcpy(&h, a + 5, sizeof h, cudaMemcpyDeviceToHost);
    EXPECT(h == 10.0f, "kernel argument captured at launch: %g, want 10", h);
    cudaEventDestroy(e);
    expect_hazards("semantics", 0, nullptr);

    cuemu_set_quiet(1);
    g_gate = 0;
    cudaLaunchHostFunc(s2, gate, nullptr);   // so that the kernel cannot have run yet
    LAUNCH_KERNEL(dim3(1), dim3(64), 0, s2, k_stuck)(b);
    cudaError_t at_launch = cudaGetLastError();
    g_gate = 1;
    cudaError_t at_sync = cudaStreamSynchronize(s2);
    EXPECT(at_launch == cudaSuccess && at_sync == cudaErrorLaunchFailure &&
           cudaStreamSynchronize(s1) == cudaErrorLaunchFailure,
           "kernel failure: %s at launch, %s at the sync (want success, then a sticky launch failure)",
           cudaGetErrorName(at_launch), cudaGetErrorName(at_sync));
    cuemu_clear_error();
    cuemu_set_quiet(0);
    EXPECT(cudaStreamSynchronize(s1) == cudaSuccess, "cuemu_clear_error clears the sticky error");
}

int main(void) {
    alarm(120);
    cuemu_set_async(1);
    cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    cudaMalloc((void **)&a, N * sizeof(float));
    cudaMalloc((void **)&b, N * sizeof(float));
    test_cross_stream();
    test_legacy_stream();
    test_host_read();
    test_host_write_source();
    test_arena();
    test_extent();
    test_memory_spaces();
    test_semantics();
    cudaFree(a);
    cudaFree(b);
    EXPECT(cuemu_hazard_count() == 0, "hazards left: %llu", cuemu_hazard_count());
    TEST_SUMMARY("test_emu_async");
}
