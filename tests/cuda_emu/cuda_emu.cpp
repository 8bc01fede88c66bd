// cuda_emu.cpp: the CUDA emulator's runtime (see cuda_emu.h and README.md).
//
// Workers are OS threads; each runs whole blocks. A block's threads are fibers with their own
// mmap'ed stacks (guard page below), switched by cuemu_ctx_switch (saves the six callee-saved
// registers and the stack pointer: about 20 ns per switch). The scheduler resumes runnable
// fibers in the configured order until every fiber has finished; a fiber gives control back
// only at __syncthreads, at a warp collective that is still waiting for lanes, at its end,
// or on an error. Under AddressSanitizer every switch is announced with
// __sanitizer_start/finish_switch_fiber.
#include "cuda_emu.h"
#include "cuda_emu_async.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define CUEMU_ASAN 1
#else
#define CUEMU_ASAN 0
#endif

// ----------------------------------------------------------------------------
// context switch: cuemu_ctx_switch(void **save_sp, void *new_sp)
//   pushes rbp rbx r12-r15, stores rsp to *save_sp, loads new_sp, pops, returns there.
// A new fiber's stack holds [r15 r14 r13=entry r12=arg rbx rbp=0 ret=cuemu_ctx_start];
// cuemu_ctx_start calls entry(arg) with a 16-byte aligned stack; entry never returns.
extern "C" void cuemu_ctx_switch(void **save_sp, void *new_sp);
extern "C" void cuemu_ctx_start(void);
asm(R"(
    .text
    .globl cuemu_ctx_switch
    .hidden cuemu_ctx_switch
    .type cuemu_ctx_switch, @function
cuemu_ctx_switch:
    .cfi_startproc
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .cfi_endproc
    .size cuemu_ctx_switch, .-cuemu_ctx_switch

    .globl cuemu_ctx_start
    .hidden cuemu_ctx_start
    .type cuemu_ctx_start, @function
cuemu_ctx_start:
    .cfi_startproc
    .cfi_undefined rip
    movq %r12, %rdi
    callq *%r13
    ud2
    .cfi_endproc
    .size cuemu_ctx_start, .-cuemu_ctx_start
)");

namespace cuemu {

__thread Worker *tls;

namespace {

enum FiberState { F_RUNNABLE, F_WAIT_BAR, F_WAIT_WARP, F_DONE };

struct FiberImpl : Fiber {
    void *sp;                      // saved stack pointer while not running
    char *stack_lo;                // usable stack [stack_lo, stack_lo + stack_size)
    size_t stack_size;
    int linear, warp, lane;
    int state;
    const char *file;              // where it waits
    int line;
    int wait_op;                   // warp op it waits in
    unsigned long long wres;       // result of its last warp op
    int bres;                      // result of its last barrier (count / and / or)
    bool used;                     // ran since its stack was last cleaned
    void *asan_fake;
};

const int MAX_SLOTS = 4;           // concurrent warp collectives per warp (distinct masks)
struct WarpSlot {
    bool active;
    int op, width;
    unsigned mask, expect, arrived;
    const char *file;
    int line;
    int first_lane;
    CollectiveFn fn;               // OP_COLLECTIVE: the action and its name
    const char *what;
    unsigned long long val[32];
    int arg[32];
};
struct WarpState {
    WarpSlot slot[MAX_SLOTS];
};

struct Job;

struct WorkerImpl : Worker {
    int index;
    pthread_t thread;
    FiberImpl *fibers;             // up to 1024, stacks created on demand
    int nstacks;
    void *sched_sp;
    void *dead_sp;                 // where a finished fiber's last switch stores its sp
    void *sched_fake;
    const void *sched_lo;
    size_t sched_size;
    // block state
    int nthreads, live, nexited, ndone;
    int bar_arrived, bar_kind, bar_sum;
    const char *bar_file;
    int bar_line;
    WarpState warps[32];
    bool aborted;                  // the running block failed: stop it
    bool stacks_dirty;             // a block was abandoned: clean stack shadow (ASan)
    // TLS of the module holding the kernels (poisoned at block start, except `tls`)
    unsigned char *tls_lo;
    size_t tls_size;
    unsigned char *dyn_buf;
    size_t dyn_cap;
    unsigned long long rng;
    int *perm;
    Job *job;
};

struct Job {
    LaunchSpec spec;
    const std::function<void()> *body;
    unsigned long long nblocks;
    unsigned long long *block_order;   // nblocks entries (linear block ids)
    std::atomic<unsigned long long> next;
    std::atomic<int> failed;
    char msg[2048];
    unsigned char wmma_layout[3][256];   // per fragment kind: element (lane*8+i) -> position
    int order;
    unsigned long long seed;
    int pending_workers;
};

// ---------------------------------------------------------------- configuration
int g_order = -1;                  // -1 = not read from the environment yet
unsigned long long g_seed = 12345;
int g_quiet = 0;
size_t g_stack_size = 0;
int g_nworkers = 0;
char g_last_msg[2048];
cudaError_t g_last_error = cudaSuccess;
std::atomic<unsigned long long> g_launches{0}, g_blocks{0}, g_switches{0};

pthread_mutex_t g_launch_mu = PTHREAD_MUTEX_INITIALIZER;   // one launch at a time
pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t g_work_cv = PTHREAD_COND_INITIALIZER;
pthread_cond_t g_done_cv = PTHREAD_COND_INITIALIZER;
WorkerImpl *g_workers;
Job *g_job;
unsigned long long g_job_gen;

void read_env() {
    if (g_order >= 0) return;
    g_order = CUEMU_FORWARD;
    const char *o = getenv("CUEMU_ORDER");
    if (o && !strcmp(o, "reverse")) g_order = CUEMU_REVERSE;
    else if (o && !strcmp(o, "random")) g_order = CUEMU_RANDOM;
    const char *s = getenv("CUEMU_SEED");
    if (s) g_seed = strtoull(s, nullptr, 0);
}

void read_pool_env() {
    const char *kb = getenv("CUEMU_STACK_KB");
    g_stack_size = (size_t)(kb ? atoi(kb) : (CUEMU_ASAN ? 1024 : 256)) * 1024;
    if (g_stack_size < 64 * 1024) g_stack_size = 64 * 1024;
    const char *w = getenv("CUEMU_WORKERS");
    int n = w ? atoi(w) : 0;
    if (n <= 0) {
        cpu_set_t set;
        n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
        if (n > 4) n = 4;
    }
    if (n < 1) n = 1;
    if (n > 64) n = 64;
    g_nworkers = n;
}

unsigned long long splitmix(unsigned long long x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
unsigned long long next_rand(unsigned long long *s) {
    *s = splitmix(*s);
    return *s;
}
void shuffle(int *a, int n, unsigned long long *rng) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(next_rand(rng) % (unsigned long long)(i + 1));
        int t = a[i]; a[i] = a[j]; a[j] = t;
    }
}

// ---------------------------------------------------------------- ASan fiber hooks
inline void asan_start(void **fake, const void *lo, size_t size) {
#if CUEMU_ASAN
    __sanitizer_start_switch_fiber(fake, lo, size);
#else
    (void)fake; (void)lo; (void)size;
#endif
}
inline void asan_finish(void *fake, const void **lo, size_t *size) {
#if CUEMU_ASAN
    __sanitizer_finish_switch_fiber(fake, lo, size);
#else
    (void)fake; (void)lo; (void)size;
#endif
}

inline WorkerImpl *W() { return static_cast<WorkerImpl *>(tls); }
inline FiberImpl *F() { return static_cast<FiberImpl *>(tls->cur); }

// ---------------------------------------------------------------- errors
void describe_thread(char *buf, size_t n, const WorkerImpl *w, const FiberImpl *f) {
    snprintf(buf, n, "block (%u,%u,%u) thread (%u,%u,%u)", w->block_idx.x, w->block_idx.y,
             w->block_idx.z, f->tid.x, f->tid.y, f->tid.z);
}

// record the first error of the job (later ones are dropped)
void job_error(WorkerImpl *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void job_error(WorkerImpl *w, const char *fmt, ...) {
    Job *j = w->job;
    w->stacks_dirty = true;
    int expected = 0;
    if (j->failed.compare_exchange_strong(expected, 1)) {
        int k = snprintf(j->msg, sizeof j->msg, "cuda_emu: kernel %s (%s:%d): ", j->spec.name,
                         j->spec.file, j->spec.line);
        va_list ap;
        va_start(ap, fmt);
        if (k > 0 && (size_t)k < sizeof j->msg) vsnprintf(j->msg + k, sizeof j->msg - k, fmt, ap);
        va_end(ap);
    }
    w->aborted = true;
}

// ---------------------------------------------------------------- switching
void yield_to_scheduler(WorkerImpl *w, FiberImpl *f) {
    asan_start(&f->asan_fake, w->sched_lo, w->sched_size);
    cuemu_ctx_switch(&f->sp, w->sched_sp);
    asan_finish(f->asan_fake, nullptr, nullptr);
}

// leave the fiber for good (finished, or abandoned after an error)
[[noreturn]] void exit_to_scheduler(WorkerImpl *w) {
    asan_start(nullptr, w->sched_lo, w->sched_size);   // (frees this fiber's fake stack:
    cuemu_ctx_switch(&w->dead_sp, w->sched_sp);        //  no locals from here on)
    __builtin_unreachable();
}

// an error inside a thread: record it and abandon the block
[[noreturn]] void fail_in_thread(WorkerImpl *w) {
    w->aborted = true;
    exit_to_scheduler(w);
}

void resume(WorkerImpl *w, FiberImpl *f) {
    w->cur = f;
    f->used = true;
    g_switches.fetch_add(1, std::memory_order_relaxed);
    asan_start(&w->sched_fake, f->stack_lo, f->stack_size);
    cuemu_ctx_switch(&w->sched_sp, f->sp);
    asan_finish(w->sched_fake, nullptr, nullptr);
    w->cur = nullptr;
}

void thread_exited(WorkerImpl *w, FiberImpl *f);

void fiber_main(FiberImpl *f) {
    WorkerImpl *w = W();
    asan_finish(nullptr, &w->sched_lo, &w->sched_size);
    (*w->job->body)();
    thread_exited(w, f);
    exit_to_scheduler(w);
}

void init_fiber_stack(FiberImpl *f) {
    uintptr_t top = ((uintptr_t)f->stack_lo + f->stack_size) & ~(uintptr_t)15;
    void **sp = (void **)top;
    *--sp = (void *)cuemu_ctx_start;         // return address of the first switch
    *--sp = nullptr;                         // rbp
    *--sp = nullptr;                         // rbx
    *--sp = (void *)f;                       // r12: argument
    *--sp = (void *)fiber_main;              // r13: entry
    *--sp = nullptr;                         // r14
    *--sp = nullptr;                         // r15
    f->sp = sp;
}

bool ensure_stacks(WorkerImpl *w, int n) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    while (w->nstacks < n) {
        FiberImpl *f = &w->fibers[w->nstacks];
        size_t total = g_stack_size + page;
        void *m = mmap(nullptr, total, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) return false;
        mprotect(m, page, PROT_NONE);        // guard page: stack overflow faults
        f->stack_lo = (char *)m + page;
        f->stack_size = g_stack_size;
        w->nstacks++;
    }
    return true;
}

// ---------------------------------------------------------------- shared memory poison
struct TlsFind {
    const void *addr;
    unsigned char *lo;
    size_t size;
};
int find_tls_cb(struct dl_phdr_info *info, size_t size, void *data) {
    TlsFind *t = (TlsFind *)data;
    if (size < offsetof(struct dl_phdr_info, dlpi_tls_data) + sizeof(void *)) return 0;
    if (!info->dlpi_tls_data) return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_TLS) continue;
        unsigned char *lo = (unsigned char *)info->dlpi_tls_data;
        if ((const unsigned char *)t->addr >= lo && (const unsigned char *)t->addr < lo + ph->p_memsz) {
            t->lo = lo;
            t->size = ph->p_memsz;
            return 1;
        }
    }
    return 0;
}

void poison_shared(WorkerImpl *w) {
    if (w->tls_lo) {
        unsigned char *skip = (unsigned char *)&tls;
        unsigned char *end = w->tls_lo + w->tls_size;
        if (skip > w->tls_lo) memset(w->tls_lo, 0xff, (size_t)(skip - w->tls_lo));
        if (skip + sizeof(tls) < end) memset(skip + sizeof(tls), 0xff, (size_t)(end - skip - sizeof(tls)));
    }
    if (w->job->spec.smem) memset(w->dyn_buf, 0xff, w->job->spec.smem);
}

// ---------------------------------------------------------------- block barrier
void complete_barrier(WorkerImpl *w) {
    // every live thread is at a barrier: same call site?
    const char *file = nullptr;
    int line = 0;
    for (int i = 0; i < w->nthreads; i++) {
        FiberImpl *f = &w->fibers[i];
        if (f->state != F_WAIT_BAR) continue;
        if (!file) { file = f->file; line = f->line; continue; }
        if (f->line != line || strcmp(f->file, file) != 0) {
            char a[96], b[96];
            describe_thread(a, sizeof a, w, &w->fibers[i]);
            FiberImpl *g = nullptr;
            for (int k = 0; k < w->nthreads; k++)
                if (w->fibers[k].state == F_WAIT_BAR) { g = &w->fibers[k]; break; }
            describe_thread(b, sizeof b, w, g);
            job_error(w, "divergent __syncthreads: %s waits at %s:%d but %s at %s:%d", a,
                      f->file, f->line, b, g->file, g->line);
            return;
        }
    }
    int res = w->bar_sum;
    if (w->bar_kind == BAR_AND) res = w->bar_sum == w->bar_arrived;
    else if (w->bar_kind == BAR_OR) res = w->bar_sum > 0;
    for (int i = 0; i < w->nthreads; i++) {
        FiberImpl *f = &w->fibers[i];
        if (f->state == F_WAIT_BAR) { f->state = F_RUNNABLE; f->bres = res; }
    }
    w->bar_arrived = 0;
    w->bar_sum = 0;
}

void thread_exited(WorkerImpl *w, FiberImpl *f) {
    f->state = F_DONE;
    w->live--;
    w->nexited++;
    w->ndone++;
    if (w->bar_arrived > 0) {
        char a[96];
        describe_thread(a, sizeof a, w, f);
        job_error(w, "%s exited while %d threads wait at __syncthreads (%s:%d): every thread "
                  "of a block must reach __syncthreads", a, w->bar_arrived, w->bar_file,
                  w->bar_line);
        return;
    }
    WarpState *ws = &w->warps[f->warp];
    for (int s = 0; s < MAX_SLOTS; s++) {
        WarpSlot *sl = &ws->slot[s];
        if (sl->active && (sl->expect >> f->lane & 1u)) {
            char a[96];
            describe_thread(a, sizeof a, w, f);
            job_error(w, "%s exited while lanes of its warp wait for it in a warp collective "
                      "(%s:%d, mask 0x%08x)", a, sl->file, sl->line, sl->mask);
            return;
        }
    }
}

// ---------------------------------------------------------------- warp collectives
unsigned existing_lanes(const WorkerImpl *w, int warp) {
    int n = w->nthreads - warp * 32;
    return n >= 32 ? 0xffffffffu : ((1u << n) - 1u);
}

unsigned exited_lanes(const WorkerImpl *w, int warp) {
    unsigned m = 0;
    int base = warp * 32;
    for (int l = 0; l < 32 && base + l < w->nthreads; l++)
        if (w->fibers[base + l].state == F_DONE) m |= 1u << l;
    return m;
}

const char *op_name(int op) {
    static const char *names[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
                                  "__shfl_xor_sync", "__ballot_sync", "__any_sync",
                                  "__all_sync", "__syncwarp", "warp collective"};
    return op >= 0 && op < 9 ? names[op] : "?";
}

void compute_warp_results(WorkerImpl *w, int warp, WarpSlot *sl) {
    const unsigned long long UNDEF = ~0ull;  // value read from a non-participating lane
    unsigned p = sl->expect;
    unsigned ballot = 0;
    for (int l = 0; l < 32; l++)
        if ((p >> l & 1u) && sl->val[l]) ballot |= 1u << l;
    for (int l = 0; l < 32; l++) {
        if (!(p >> l & 1u)) continue;
        FiberImpl *f = &w->fibers[warp * 32 + l];
        unsigned long long r = 0;
        int wd = sl->width, seg = l & ~(wd - 1), src = l;
        switch (sl->op) {
        case OP_SHFL_IDX: src = seg + (sl->arg[l] & (wd - 1)); break;
        case OP_SHFL_UP: src = l - sl->arg[l]; if (src < seg) src = l; break;
        case OP_SHFL_DOWN: src = l + sl->arg[l]; if (src >= seg + wd) src = l; break;
        case OP_SHFL_XOR: src = l ^ sl->arg[l]; if (src >= seg + wd || src > 31) src = l; break;
        case OP_BALLOT: r = ballot; break;
        case OP_ANY: r = ballot != 0; break;
        case OP_ALL: r = ballot == p; break;
        default: break;
        }
        if (sl->op == OP_COLLECTIVE) break;
        if (sl->op <= OP_SHFL_XOR) r = (src >= 0 && src < 32 && (p >> src & 1u)) ? sl->val[src] : UNDEF;
        f->wres = r;
        if (f->state == F_WAIT_WARP) f->state = F_RUNNABLE;
    }
    if (sl->op == OP_COLLECTIVE) {
        void *args[32];
        for (int l = 0; l < 32; l++) args[l] = (void *)(uintptr_t)sl->val[l];
        char err[512];
        const char *e = sl->fn(args, err, sizeof err);
        for (int l = 0; l < 32; l++) {
            FiberImpl *f = &w->fibers[warp * 32 + l];
            if (f->state == F_WAIT_WARP) f->state = F_RUNNABLE;
        }
        if (e) job_error(w, "%s at %s:%d (warp %d): %s", sl->what, sl->file, sl->line, warp, e);
    }
    sl->active = false;
}

} // namespace

static unsigned long long warp_op_impl(int op, const char *file, int line, unsigned mask,
                                      unsigned long long value, int arg, int width,
                                      CollectiveFn fn, const char *what);

unsigned long long warp_op(int op, const char *file, int line, unsigned mask,
                           unsigned long long value, int arg, int width) {
    return warp_op_impl(op, file, line, mask, value, arg, width, nullptr, nullptr);
}

void warp_collective(const char *what, const char *file, int line, void *lane_arg,
                     CollectiveFn fn) {
    WorkerImpl *w = W();
    FiberImpl *f = F();
    if (existing_lanes(w, f->warp) != 0xffffffffu) {
        char a[96];
        describe_thread(a, sizeof a, w, f);
        job_error(w, "%s: %s at %s:%d in a partial warp (blockDim %u x %u x %u is not a "
                  "multiple of 32 threads)", a, what, file, line, w->block_dim.x,
                  w->block_dim.y, w->block_dim.z);
        fail_in_thread(w);
    }
    warp_op_impl(OP_COLLECTIVE, file, line, 0xffffffffu, (unsigned long long)(uintptr_t)lane_arg,
                 0, 32, fn, what);
}

static unsigned long long warp_op_impl(int op, const char *file, int line, unsigned mask,
                                      unsigned long long value, int arg, int width,
                                      CollectiveFn fn, const char *what) {
    WorkerImpl *w = W();
    FiberImpl *f = F();
    char a[96];
    if (!(mask >> f->lane & 1u)) {
        describe_thread(a, sizeof a, w, f);
        job_error(w, "%s calls %s at %s:%d with mask 0x%08x that does not include its lane %d",
                  a, op_name(op), file, line, mask, f->lane);
        fail_in_thread(w);
    }
    if (width < 1 || width > 32 || (width & (width - 1))) {
        describe_thread(a, sizeof a, w, f);
        job_error(w, "%s: %s at %s:%d with width %d (must be a power of two <= 32)", a,
                  op_name(op), file, line, width);
        fail_in_thread(w);
    }
    unsigned expect = mask & existing_lanes(w, f->warp);
    unsigned gone = expect & exited_lanes(w, f->warp);
    if (gone) {
        describe_thread(a, sizeof a, w, f);
        job_error(w, "%s: %s at %s:%d names lanes that have exited (0x%08x of mask 0x%08x)", a,
                  op_name(op), file, line, gone, mask);
        fail_in_thread(w);
    }
    WarpState *ws = &w->warps[f->warp];
    WarpSlot *sl = nullptr;
    for (int s = 0; s < MAX_SLOTS; s++)
        if (ws->slot[s].active && ws->slot[s].mask == mask) { sl = &ws->slot[s]; break; }
    if (!sl) {
        for (int s = 0; s < MAX_SLOTS; s++)
            if (!ws->slot[s].active) { sl = &ws->slot[s]; break; }
        if (!sl) {
            describe_thread(a, sizeof a, w, f);
            job_error(w, "%s: more than %d different masks pending in one warp (%s at %s:%d)", a,
                      MAX_SLOTS, op_name(op), file, line);
            fail_in_thread(w);
        }
        sl->active = true;
        sl->op = op;
        sl->width = width;
        sl->mask = mask;
        sl->expect = expect;
        sl->arrived = 0;
        sl->file = file;
        sl->line = line;
        sl->first_lane = f->lane;
        sl->fn = fn;
        sl->what = what;
    } else {
        // same mask: must be the same collective (and, except __syncwarp, the same call site)
        bool same = sl->op == op && sl->width == width && sl->fn == fn &&
                    (op == OP_SYNCWARP || (sl->line == line && !strcmp(sl->file, file)));
        if (!same) {
            describe_thread(a, sizeof a, w, f);
            job_error(w, "divergent warp collectives in warp %d: %s is at %s (%s:%d) while lane "
                      "%d is at %s (%s:%d), mask 0x%08x", f->warp, a, what ? what : op_name(op),
                      file, line, sl->first_lane, sl->what ? sl->what : op_name(sl->op),
                      sl->file, sl->line, mask);
            fail_in_thread(w);
        }
    }
    sl->val[f->lane] = value;
    sl->arg[f->lane] = arg;
    sl->arrived |= 1u << f->lane;
    if (sl->arrived == sl->expect) {
        compute_warp_results(w, f->warp, sl);
        if (w->aborted) fail_in_thread(w);
    } else {
        f->state = F_WAIT_WARP;
        f->file = file;
        f->line = line;
        f->wait_op = op;
        yield_to_scheduler(w, f);
        if (w->aborted) fail_in_thread(w);
    }
    return f->wres;
}

int syncthreads_at(const char *file, int line, int kind, int pred) {
    WorkerImpl *w = W();
    FiberImpl *f = F();
    if (w->nexited > 0) {
        char a[96];
        describe_thread(a, sizeof a, w, f);
        job_error(w, "%s reached __syncthreads (%s:%d) after %d threads of its block exited: "
                  "every thread of a block must reach __syncthreads", a, file, line, w->nexited);
        fail_in_thread(w);
    }
    if (w->bar_arrived == 0) {
        w->bar_kind = kind;
        w->bar_file = file;
        w->bar_line = line;
    }
    f->state = F_WAIT_BAR;
    f->file = file;
    f->line = line;
    w->bar_arrived++;
    w->bar_sum += pred != 0;
    if (w->bar_arrived == w->live) {
        complete_barrier(w);
        if (w->aborted) fail_in_thread(w);
    } else {
        yield_to_scheduler(w, f);
        if (w->aborted) fail_in_thread(w);
    }
    return f->bres;
}

unsigned activemask() {
    WorkerImpl *w = W();
    FiberImpl *f = F();
    return existing_lanes(w, f->warp) & ~exited_lanes(w, f->warp);
}

void *dynamic_smem() { return W()->dyn_buf; }

namespace {

void report_deadlock(WorkerImpl *w) {
    char buf[1536];
    size_t k = 0;
    buf[0] = 0;
    // group the waiting threads by (kind, site)
    bool listed[1024] = {false};
    for (int i = 0; i < w->nthreads && k < sizeof buf - 200; i++) {
        FiberImpl *f = &w->fibers[i];
        if (listed[i] || f->state == F_DONE || f->state == F_RUNNABLE) continue;
        int count = 0, first = i, last = i;
        for (int j = i; j < w->nthreads; j++) {
            FiberImpl *g = &w->fibers[j];
            if (!listed[j] && g->state == f->state && g->line == f->line &&
                (g->state == F_WAIT_BAR || g->wait_op == f->wait_op) && !strcmp(g->file, f->file)) {
                listed[j] = true;
                count++;
                last = j;
            }
        }
        k += snprintf(buf + k, sizeof buf - k, "%s%d thread%s (linear %d..%d) wait%s at %s %s:%d",
                      k ? "; " : "", count, count > 1 ? "s" : "", first, last,
                      count > 1 ? "" : "s",
                      f->state == F_WAIT_BAR ? "__syncthreads" : op_name(f->wait_op), f->file,
                      f->line);
    }
    job_error(w, "deadlock in block (%u,%u,%u): %d of %d threads finished; %s", w->block_idx.x,
              w->block_idx.y, w->block_idx.z, w->ndone, w->nthreads, buf);
}

void run_block(WorkerImpl *w, unsigned long long linear_block) {
    Job *j = w->job;
    const dim3 g = j->spec.grid, b = j->spec.block;
    w->block_idx.x = (unsigned)(linear_block % g.x);
    w->block_idx.y = (unsigned)(linear_block / g.x % g.y);
    w->block_idx.z = (unsigned)(linear_block / ((unsigned long long)g.x * g.y));
    int n = (int)(b.x * b.y * b.z);
    w->nthreads = n;
    w->live = n;
    w->nexited = 0;
    w->ndone = 0;
    w->bar_arrived = 0;
    w->bar_sum = 0;
    w->aborted = false;
    memset(w->warps, 0, sizeof w->warps);
    poison_shared(w);
#if CUEMU_ASAN
    // fibers abandoned after an error leave poisoned stack shadow behind: clean every stack
    // used since, not only this block's (a later, bigger block reuses the others)
    if (w->stacks_dirty)
        for (int i = 0; i < w->nstacks; i++)
            if (w->fibers[i].used) ASAN_UNPOISON_MEMORY_REGION(w->fibers[i].stack_lo, w->fibers[i].stack_size);
#endif
    for (int i = 0; i < n; i++) {
        FiberImpl *f = &w->fibers[i];
        f->used = false;
        f->tid.x = (unsigned)(i % b.x);
        f->tid.y = (unsigned)(i / b.x % b.y);
        f->tid.z = (unsigned)(i / (b.x * b.y));
        f->linear = i;
        f->warp = i / 32;
        f->lane = i % 32;
        f->state = F_RUNNABLE;
        f->file = "";
        f->line = 0;
        f->wait_op = -1;
        f->asan_fake = nullptr;
        init_fiber_stack(f);
        w->perm[i] = j->order == CUEMU_REVERSE ? n - 1 - i : i;
    }
    w->stacks_dirty = false;
    w->rng = splitmix(j->seed ^ splitmix(linear_block + 0x51ed27));
    g_blocks.fetch_add(1, std::memory_order_relaxed);
    while (w->ndone < n) {
        if (j->order == CUEMU_RANDOM) shuffle(w->perm, n, &w->rng);
        int progress = 0;
        for (int i = 0; i < n; i++) {
            FiberImpl *f = &w->fibers[w->perm[i]];
            if (f->state != F_RUNNABLE) continue;
            resume(w, f);
            progress++;
            if (w->aborted) return;
        }
        if (!progress) {
            report_deadlock(w);
            return;
        }
    }
}

void *worker_main(void *arg) {
    WorkerImpl *w = (WorkerImpl *)arg;
    tls = w;
    TlsFind t = {&tls, nullptr, 0};
    dl_iterate_phdr(find_tls_cb, &t);
    w->tls_lo = t.lo;
    w->tls_size = t.size;
    unsigned long long seen = 0;
    for (;;) {
        pthread_mutex_lock(&g_mu);
        while (g_job_gen == seen) pthread_cond_wait(&g_work_cv, &g_mu);
        seen = g_job_gen;
        Job *j = g_job;
        pthread_mutex_unlock(&g_mu);

        w->job = j;
        w->block_dim = j->spec.block;
        w->grid_dim = j->spec.grid;
        w->wmma_layout = &j->wmma_layout[0][0];
        if (j->spec.smem != w->dyn_cap) {
            // exactly the launch's size, so that ASan sees overruns of dynamic shared memory
            free(w->dyn_buf);
            void *p = nullptr;
            w->dyn_buf = j->spec.smem && posix_memalign(&p, 128, j->spec.smem) == 0
                             ? (unsigned char *)p : nullptr;
            w->dyn_cap = w->dyn_buf ? j->spec.smem : 0;
        }
        int n = (int)(j->spec.block.x * j->spec.block.y * j->spec.block.z);
        if (!ensure_stacks(w, n) || (j->spec.smem && !w->dyn_buf)) {
            job_error(w, "out of memory for %d fiber stacks", n);
        } else {
            for (;;) {
                if (j->failed.load()) break;
                unsigned long long i = j->next.fetch_add(1);
                if (i >= j->nblocks) break;
                run_block(w, j->block_order[i]);
            }
        }
        w->job = nullptr;
        pthread_mutex_lock(&g_mu);
        if (--j->pending_workers == 0) pthread_cond_signal(&g_done_cv);
        pthread_mutex_unlock(&g_mu);
    }
    return nullptr;
}

bool start_workers() {
    if (g_workers) return true;
    read_pool_env();
    g_workers = (WorkerImpl *)calloc((size_t)g_nworkers, sizeof(WorkerImpl));
    if (!g_workers) return false;
    for (int i = 0; i < g_nworkers; i++) {
        WorkerImpl *w = &g_workers[i];
        w->index = i;
        w->fibers = (FiberImpl *)calloc(1024, sizeof(FiberImpl));
        w->perm = (int *)calloc(1024, sizeof(int));
        if (!w->fibers || !w->perm) return false;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 1 << 20);
        if (pthread_create(&w->thread, &attr, worker_main, w) != 0) return false;
        pthread_attr_destroy(&attr);
    }
    return true;
}

cudaError_t set_error(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
cudaError_t set_error(cudaError_t e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_msg, sizeof g_last_msg, fmt, ap);
    va_end(ap);
    if (!g_quiet) fprintf(stderr, "%s\n", g_last_msg);
    g_last_error = e;
    return e;
}

} // namespace

// the launch's configuration, checked when it is issued: cudaSuccess, or the error with its
// message in msg
cudaError_t launch_check_config(const LaunchSpec &spec, char *msg, size_t n) {
    const dim3 g = spec.grid, b = spec.block;
    unsigned long long nthreads = (unsigned long long)b.x * b.y * b.z;
    if (nthreads == 0 || nthreads > 1024 || b.x > 1024 || b.y > 1024 || b.z > 64) {
        snprintf(msg, n, "cuda_emu: kernel %s (%s:%d): invalid block (%u,%u,%u)", spec.name,
                 spec.file, spec.line, b.x, b.y, b.z);
        return cudaErrorInvalidConfiguration;
    }
    if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > 2147483647u || g.y > 65535 || g.z > 65535) {
        snprintf(msg, n, "cuda_emu: kernel %s (%s:%d): invalid grid (%u,%u,%u)", spec.name,
                 spec.file, spec.line, g.x, g.y, g.z);
        return cudaErrorInvalidConfiguration;
    }
    if (spec.smem > 48 * 1024) {
        snprintf(msg, n, "cuda_emu: kernel %s (%s:%d): %zu bytes of dynamic shared memory "
                 "(more than 48 KiB needs cudaFuncSetAttribute on a GPU)",
                 spec.name, spec.file, spec.line, spec.smem);
        return cudaErrorInvalidValue;
    }
    return cudaSuccess;
}

// Run a (valid) grid to completion on the block workers, one grid at a time (g_launch_mu
// is the device lock: the fiber scheduler's state is not shared between grids). Callable
// from any thread. cudaSuccess, or the error with its message in msg.
cudaError_t launch_run(const LaunchSpec &spec, const std::function<void()> &body, char *msg,
                       size_t n) {
    read_env();
    const dim3 g = spec.grid;
    pthread_mutex_lock(&g_launch_mu);
    if (!start_workers()) {
        pthread_mutex_unlock(&g_launch_mu);
        snprintf(msg, n, "cuda_emu: cannot start worker threads");
        return cudaErrorMemoryAllocation;
    }
    g_launches.fetch_add(1, std::memory_order_relaxed);
    Job *j = new Job();
    j->spec = spec;
    j->body = &body;
    j->nblocks = (unsigned long long)g.x * g.y * g.z;
    j->order = g_order;
    j->seed = splitmix(g_seed ^ g_launches.load());
    j->block_order = (unsigned long long *)malloc(sizeof(unsigned long long) * j->nblocks);
    if (!j->block_order) {
        delete j;
        pthread_mutex_unlock(&g_launch_mu);
        snprintf(msg, n, "cuda_emu: out of memory for the grid");
        return cudaErrorMemoryAllocation;
    }
    for (unsigned long long i = 0; i < j->nblocks; i++)
        j->block_order[i] = j->order == CUEMU_REVERSE ? j->nblocks - 1 - i : i;
    if (j->order == CUEMU_RANDOM) {
        unsigned long long rng = j->seed;
        for (unsigned long long i = j->nblocks - 1; i > 0; i--) {
            unsigned long long k = next_rand(&rng) % (i + 1), t = j->block_order[i];
            j->block_order[i] = j->block_order[k];
            j->block_order[k] = t;
        }
    }
    {
        // opaque wmma fragment layouts: a fresh permutation per launch and fragment kind
        unsigned long long rng = splitmix(j->seed ^ 0x77a1u);
        int perm[256];
        for (int k = 0; k < 3; k++) {
            for (int i = 0; i < 256; i++) perm[i] = i;
            shuffle(perm, 256, &rng);
            for (int i = 0; i < 256; i++) j->wmma_layout[k][i] = (unsigned char)perm[i];
        }
    }
    j->next = 0;
    j->failed = 0;
    j->msg[0] = 0;
    pthread_mutex_lock(&g_mu);
    j->pending_workers = g_nworkers;
    g_job = j;
    g_job_gen++;
    pthread_cond_broadcast(&g_work_cv);
    while (j->pending_workers > 0) pthread_cond_wait(&g_done_cv, &g_mu);
    g_job = nullptr;
    pthread_mutex_unlock(&g_mu);
    cudaError_t rc = cudaSuccess;
    if (j->failed.load()) {
        snprintf(msg, n, "%s", j->msg);
        rc = cudaErrorLaunchFailure;
    }
    free(j->block_order);
    delete j;
    pthread_mutex_unlock(&g_launch_mu);
    return rc;
}

cudaError_t launch_on(const LaunchSpec &spec, cudaStream_t stream, const KernelPtr *ptrs,
                      int nptrs, std::function<void()> body) {
    char msg[2048];
    cudaError_t e = launch_check_config(spec, msg, sizeof msg);
    if (e != cudaSuccess) return set_error(e, "%s", msg);
    if (async_on()) {
        e = enqueue_kernel(spec, stream, ptrs, nptrs, std::move(body));
        return e == cudaSuccess ? e : set_error(e, "cuda_emu: kernel %s (%s:%d): invalid stream",
                                                spec.name, spec.file, spec.line);
    }
    e = launch_run(spec, body, msg, sizeof msg);
    return e == cudaSuccess ? e : set_error(e, "%s", msg);
}

} // namespace cuemu

// ----------------------------------------------------------------------------
// control API

using namespace cuemu;

extern "C" void cuemu_set_order(int order, unsigned long long seed) {
    read_env();
    g_order = order;
    g_seed = seed;
}
extern "C" int cuemu_get_order(void) {
    read_env();
    return g_order;
}
extern "C" const char *cuemu_order_name(int order) {
    return order == CUEMU_FORWARD ? "forward" : order == CUEMU_REVERSE ? "reverse" : "random";
}
extern "C" void cuemu_set_quiet(int quiet) { g_quiet = quiet; }
extern "C" const char *cuemu_last_error_message(void) { return g_last_msg; }
extern "C" void cuemu_clear_error(void) {
    g_last_msg[0] = 0;
    g_last_error = cudaSuccess;
    async_clear_error();
}
bool cuemu::quiet() { return g_quiet != 0; }
extern "C" void cuemu_stats(unsigned long long *launches, unsigned long long *blocks,
                            unsigned long long *switches) {
    if (launches) *launches = g_launches.load();
    if (blocks) *blocks = g_blocks.load();
    if (switches) *switches = g_switches.load();
}

// ----------------------------------------------------------------------------
// the CUDA runtime calls the kernels' host code uses (no libcudart is linked)

extern "C" {
// an asynchronous operation's failure is sticky (as a GPU fault is); a launch's own error
// is returned once
cudaError_t cudaGetLastError(void) {
    cudaError_t e = g_last_error;
    g_last_error = cudaSuccess;
    return e != cudaSuccess ? e : async_error();
}
cudaError_t cudaPeekAtLastError(void) { return g_last_error != cudaSuccess ? g_last_error : async_error(); }
const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorECCUncorrectable: return "cudaErrorECCUncorrectable";
    default: return "cudaError(other)";
    }
}
const char *cudaGetErrorString(cudaError_t e) {
    if (e == cudaErrorLaunchFailure && g_last_msg[0]) return g_last_msg;
    if (e == cudaErrorLaunchFailure && async_error_message()[0]) return async_error_message();
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorECCUncorrectable: return "uncorrectable ECC error encountered";
    default: return "unknown error";
    }
}
}
