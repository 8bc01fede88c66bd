// cuda_emu_async.h: the emulated runtime's streams and its ordering checker, shared by the
// emulator's own files (cuda_emu.cpp: kernel launches; cuda_emu_stream.cpp: streams, events,
// copies; cuda_emu_shadow.cpp: the checker; cuda_emu_host.cpp: cuBLASLt and NCCL). Kernel
// sources never include it. See README.md, "Streams and ordering hazards".
#pragma once
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "plan_price.h"   // (src/: the prices the estimate uses)

// (also in cuda_emu.h, which must come before any CUDA header and so is not included here)
extern "C" int cuemu_set_async(int on);
extern "C" int cuemu_async(void);

namespace cuemu {

struct LaunchSpec;
struct KernelPtr;

// The emulator's own code runs on this thread (depth > 0): the checker's host watchpoints
// (cuda_emu_shadow.cpp) ignore what it touches: glibc's vectorised memchr in its stats code
// reads up to 31 bytes past a short heap string, into a neighbouring pinned block's watched
// first bytes (what was found there). Entered by Lock (cuda_emu_stream.cpp), enqueue and the
// stats code; an EmuInside object marks a scope.
extern __thread int t_emu_inside;
struct EmuInside {
    EmuInside() { ++t_emu_inside; }
    ~EmuInside() { --t_emu_inside; }
    EmuInside(const EmuInside &) = delete;
    EmuInside &operator=(const EmuInside &) = delete;
};

// ---------------------------------------------------------------- operations
enum AccessKind { ACC_READ = 1, ACC_WRITE = 2, ACC_RW = 3 };
// What an operation touches. Device memory is checked against the other streams' work;
// host memory (a copy's host side) is watched until the host knows the copy complete.
struct Access {
    const void *p;
    size_t n;              // bytes (ignored for whole_block)
    int kind;              // AccessKind
    bool whole_block;      // a kernel pointer: the arena block (or allocation) holding p
    bool device = false;   // the GPU itself dereferences p (a kernel, cuBLASLt, NCCL, a memset):
                           // it must be device memory or pinned host memory (cudaMallocHost)
};

// An operation as the checker names it: "<name> on stream <stream> (op #<seq>)".
struct OpInfo {
    int stream;            // stream id (0 = the legacy default stream)
    uint64_t seq;          // position in that stream, from 1
    std::string name;      // e.g. "kernel scale_kernel (kernels/scale.cu:12)", "ncclAllGather ..."
};
typedef std::shared_ptr<const OpInfo> OpRef;

// Vector clock: for each stream, the last operation of it known to come before.
struct Clock {
    std::vector<uint64_t> c;
    uint64_t get(int s) const { return (size_t)s < c.size() ? c[s] : 0; }
    void set(int s, uint64_t v) {
        if ((size_t)s >= c.size()) c.resize((size_t)s + 1, 0);
        c[s] = v;
    }
    void join(const Clock &o) {
        if (o.c.size() > c.size()) c.resize(o.c.size(), 0);
        for (size_t i = 0; i < o.c.size(); i++) if (o.c[i] > c[i]) c[i] = o.c[i];
    }
    bool after(const OpInfo &op) const { return get(op.stream) >= op.seq; }   // op happens-before
};

// ---------------------------------------------------------------- cuda_emu_stream.cpp
bool async_on();
void set_async_default(int on);   // the program's default mode (cuda_emu_host.cpp: async)
// Queue `fn` on `stream` as operation `name` touching `acc` (checked for hazards now, at
// enqueue, so the verdict does not depend on timing). Synchronous mode: fn runs now.
// cudaErrorInvalidResourceHandle for an unknown stream.
// cost: its virtual seconds on the stream with the clock on (FT_EMU_VCLOCK); < 0: a kernel's,
// priced from the bytes its accesses span (vclock_price_kernel).
cudaError_t enqueue(cudaStream_t stream, std::string name, const std::vector<Access> &acc,
                    std::function<void()> fn, double cost = -1);
cudaError_t enqueue_kernel(const LaunchSpec &spec, cudaStream_t stream, const KernelPtr *ptrs,
                           int nptrs, std::function<void()> body);
// a failed asynchronous operation (called on a stream worker): sticky, printed once
void async_fail(cudaError_t e, const char *msg);
cudaError_t async_error();
const char *async_error_message();
void async_clear_error();
// an operation's stream id (for NCCL's per-communicator bookkeeping); -1 if unknown
int stream_id(cudaStream_t stream);
// Test-only fault injection, FT_EMU_FAULT=KIND@RANK:N (tests/test_gpu_faults.sh): true once,
// for the Nth event of `kind` counted in this process when its PMI_RANK (0 if unset) is RANK.
// Kinds: "illegal_address", "ecc" (the Nth kernel launch fails with cudaErrorIllegalAddress /
// cudaErrorECCUncorrectable, sticky, as a GPU fault), "nccl_async" (the Nth collective
// issued leaves its communicator in an asynchronous error, ncclSystemError). Kernel kinds
// count launches, the NCCL kind collectives.
bool fault_hit(const char *kind);

// The virtual clock (FT_EMU_VCLOCK; README.md, "Virtual clock"): on with a device named and the
// asynchronous mode. Inside an operation a stream worker runs: its virtual start, and (a
// collective) the start all ranks agreed on, from which its cost is counted.
bool vclock_on();
double vclock_op_start();
void vclock_set_op_start(double t);

// ---------------------------------------------------------------- cuda_emu_vclock.cpp
// The prices, in virtual seconds, from src/plan_price.c for FT_EMU_VCLOCK's device; each is
// 0 when the clock is off. vclock_device: that device, or null (FT_EMU_VCLOCK unset, or names
// no device of src/plan_price.c's table: one line says so).
const plan_device *vclock_device();
void vclock_announce();                            // one stdout line: the device, the rates
double vclock_issue_s();                           // the host's cost of issuing one operation
double vclock_price_kernel(double bytes);          // HBM bytes, at least the per-op floor
double vclock_price_gemm(double m, double n, double k);
double vclock_price_attention(double flops);       // the cuDNN graph's rate, with the floor
double vclock_price_copy(double bytes, bool pcie); // a copy: over PCIe, or device to device
// a collective of an n-rank group (kind: 0 all-gather, 1 reduce-scatter, 2 all-reduce,
// 3 broadcast; bytes: NCCL's per-rank buffer) spanning `nodes` nodes (across them when > 1)
double vclock_price_collective(int kind, double bytes, int n, int nodes);
int vclock_gpus_per_node();                        // FT_EMU_VCLOCK_GPUS_PER_NODE, else the device's

// ---------------------------------------------------------------- cuda_emu.cpp
bool quiet();   // cuemu_set_quiet: no launch errors or hazards on stderr
cudaError_t launch_check_config(const LaunchSpec &spec, char *msg, size_t n);
cudaError_t launch_run(const LaunchSpec &spec, const std::function<void()> &body, char *msg,
                       size_t n);

// ---------------------------------------------------------------- cuda_emu_shadow.cpp
// All of these are called with the runtime's lock held, on the host thread.
void shadow_alloc(void *p, size_t n);                   // cudaMalloc'd memory
void shadow_release(void *p);                            // cudaFree (after a device sync)
bool shadow_is_device(const void *p);
size_t shadow_extent(const void *p);   // bytes of the arena block (else allocation) holding p; 0: none
void shadow_pinned(void *p, size_t n, bool add);         // cudaMallocHost / cudaFreeHost
bool shadow_is_pinned(const void *p);
// check op's accesses against the history (reports hazards), then record them; clock =
// the op's vector clock
void shadow_access(const OpRef &op, const Clock &clock, const std::vector<Access> &acc);
// a block returned to the arena, ordered after `clock` (its stream's position)
void shadow_block_free(void *p, const OpInfo &where, const Clock &clock);
void shadow_block_alloc(void *p, size_t n);
// the host now knows everything in `host` complete: stop watching those copies' host
// memory (and check that the host left their sources alone)
void shadow_host_retire(const Clock &host);
// a cuStreamWaitValue32 gate at op #seq of `stream`: host copies issued on that stream behind
// it, before the host knows it passed, may have their sources filled by the host until then
void shadow_gate(int stream, uint64_t seq);
void shadow_poll_watches();
void shadow_init_once(unsigned long long seed);   // the exit check (reports the seed)

} // namespace cuemu
