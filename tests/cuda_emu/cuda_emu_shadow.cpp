// cuda_emu_shadow.cpp: the ordering checker of the asynchronous emulated runtime (see
// README.md, "Streams and ordering hazards", and cuda_emu_stream.cpp for the clocks).
//
// Device memory: every cudaMalloc'd allocation keeps shadow state over its bytes, as
// segments holding the last writer and the reads since (the latest per stream). An
// operation's accesses are checked when it is issued, against its vector clock:
//   read-after-write    it reads bytes whose last writer (another stream's) is not ordered
//                       before it
//   write-after-read    it writes bytes an operation not ordered before it still reads
//   write-after-write   it writes bytes whose last writer is not ordered before it
// Kernels access whole blocks: the arena block (cuemu_block_alloc, from the CUDA backend)
// or else the allocation that holds each pointer argument; copies, memsets, cuBLASLt and
// NCCL give exact byte ranges. Arena blocks: a block freed while an operation that uses it
// is not ordered before the free (free-while-in-use), and a kernel or copy touching arena
// memory in no live block (use-after-free), are reported too. History survives a free, so
// a reuse of the bytes that is not ordered after the old users is a plain conflict.
//
// Host memory: a copy's host side is pending until the host knows the copy complete. The
// destination of a copy to the host is filled with 0xFF bytes when the copy is issued and
// watched (hardware watchpoint on its first bytes, perf_event_open, where the kernel lets
// us): the host touching it early is reported (host-read-before-complete). The source of a
// copy from the host is watched for writes and checksummed: changed before the copy is
// known complete = host-write-before-complete. Copies queued behind a cuStreamWaitValue32
// gate that the host has not yet seen passed are not judged (the host fills their sources
// and then opens the gate: tests/nccl_standin).
//
// Each distinct hazard (kind and the two operations' names and streams) prints one line,
// "cuda_emu: HAZARD <kind>: ...", to stderr (FT_EMU_MAX_REPORTS, default 20, distinct
// lines); all are counted, and a process that reported any exits with CUEMU_HAZARD_EXIT.
#include "cuda_emu.h"   // first: it must precede the CUDA headers
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>

#include "cuda_emu_async.h"

namespace cuemu {

// (__thread, not thread_local: under UBSan the thread_local read as a null load on the
// emulator's fiber stacks, 2026-11-28; the cause not pinned down)
__thread int t_emu_inside = 0;

namespace {

// ----------------------------------------------------------------------------
// state

struct Seg {
    size_t end;                  // covers [key, end) of its allocation
    OpRef w;                     // last writer
    std::vector<OpRef> r;        // reads since, the latest per stream
};
struct Alloc {
    uintptr_t lo, hi;
    std::map<size_t, Seg> segs;
    bool arena = false;          // blocks were handed out of it (cuemu_block_alloc)
};
struct Block {
    uintptr_t hi;
    int id;
};
struct HostPending {
    uintptr_t lo, hi;
    OpRef op;
    bool dest;                   // destination of a copy to the host (else a source)
    bool overwritten = false;    // a source a later copy to the host wrote into
    uint64_t sum = 0;            // a source's checksum when issued
    int watch = -1;
};

std::map<uintptr_t, Alloc *> g_allocs;
std::map<uintptr_t, Block> g_blocks;
int g_next_block = 1;
std::vector<HostPending> g_host;

std::atomic<unsigned long long> g_count{0};
std::map<std::string, unsigned long long> g_seen;
std::string g_last;
int g_max_reports = 20;

Alloc *find_alloc(uintptr_t a) {
    auto it = g_allocs.upper_bound(a);
    if (it == g_allocs.begin()) return nullptr;
    --it;
    return a < it->second->hi ? it->second : nullptr;
}
std::pair<const uintptr_t, Block> *find_block(uintptr_t a) {
    auto it = g_blocks.upper_bound(a);
    if (it == g_blocks.begin()) return nullptr;
    --it;
    return a < it->second.hi ? &*it : nullptr;
}

// ----------------------------------------------------------------------------
// reports

std::string op_text(const OpInfo &op) {
    char b[64];
    snprintf(b, sizeof b, " on stream %d (op #%llu)", op.stream, (unsigned long long)op.seq);
    return op.name + b;
}

// one hazard: counted always, printed once per distinct key
void report(const std::string &key, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void report(const std::string &key, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    g_count++;
    g_last = msg;
    unsigned long long n = g_seen[key]++;
    if (quiet()) return;
    if (n == 0 && (int)g_seen.size() <= g_max_reports) fprintf(stderr, "%s\n", msg);
    if (n == 0 && (int)g_seen.size() == g_max_reports + 1)
        fprintf(stderr, "cuda_emu: more distinct hazards; not printing them (FT_EMU_MAX_REPORTS)\n");
}

// where [lo, hi) is, for a report
std::string where_text(uintptr_t lo, uintptr_t hi, const Alloc *al) {
    char b[192];
    auto *blk = find_block(lo);
    if (blk)
        snprintf(b, sizeof b, "bytes [%zu, %zu) of arena block #%d (%zu bytes)", (size_t)(lo - blk->first),
                 (size_t)(hi - blk->first), blk->second.id, (size_t)(blk->second.hi - blk->first));
    else
        snprintf(b, sizeof b, "bytes [%zu, %zu) of a cudaMalloc allocation of %zu bytes", (size_t)(lo - al->lo),
                 (size_t)(hi - al->lo), (size_t)(al->hi - al->lo));
    return b;
}

void report_conflict(const char *kind, const OpInfo &op, const OpInfo &other, const std::string &where) {
    std::string a = op_text(op), b = op_text(other);
    char key[64];
    snprintf(key, sizeof key, "%s|%d|%d|", kind, op.stream, other.stream);
    const char *verb = !strcmp(kind, "read-after-write") ? "reads" : "writes";
    const char *rel = !strcmp(kind, "write-after-read") ? "still read by" : "last written by";
    report(key + op.name + "|" + other.name,
           "cuda_emu: HAZARD %s: %s %s %s %s %s, which is not ordered before it (no event wait or "
           "host synchronisation between the streams)",
           kind, a.c_str(), verb, where.c_str(), rel, b.c_str());
}

// ----------------------------------------------------------------------------
// device memory: segments

void split_at(Alloc *al, size_t x) {
    auto it = al->segs.upper_bound(x);
    if (it == al->segs.begin()) return;
    --it;
    if (it->first < x && x < it->second.end) {
        Seg tail = it->second;
        it->second.end = x;
        al->segs.emplace(x, tail);
    }
}

// segments covering [a, b) exactly (gaps filled with fresh ones)
void cover(Alloc *al, size_t a, size_t b) {
    split_at(al, a);
    split_at(al, b);
    size_t pos = a;
    auto it = al->segs.lower_bound(a);
    while (pos < b) {
        if (it != al->segs.end() && it->first == pos) {
            pos = it->second.end;
            ++it;
            continue;
        }
        size_t next = it != al->segs.end() && it->first < b ? it->first : b;
        it = al->segs.emplace_hint(it, pos, Seg{next, nullptr, {}});
        pos = next;
        ++it;
    }
}

void coalesce(Alloc *al, size_t a, size_t b) {
    auto it = al->segs.lower_bound(a);
    if (it != al->segs.begin()) --it;
    while (it != al->segs.end() && it->first < b) {
        auto nx = std::next(it);
        if (nx != al->segs.end() && nx->first == it->second.end && nx->second.w == it->second.w &&
            nx->second.r == it->second.r) {
            it->second.end = nx->second.end;
            al->segs.erase(nx);
        } else {
            it = nx;
        }
    }
}

void check_range(const OpRef &op, const Clock &clock, Alloc *al, uintptr_t lo, uintptr_t hi, int kind) {
    if (hi > al->hi) hi = al->hi;
    if (lo >= hi) return;
    const size_t a = lo - al->lo, b = hi - al->lo;
    cover(al, a, b);
    std::vector<std::pair<const OpInfo *, int>> said;   // one report per (other op, kind)
    auto conflict = [&](const char *what, const OpRef &other, int k) {
        for (auto &s : said) if (s.first == other.get() && s.second == k) return;
        said.push_back({other.get(), k});
        report_conflict(what, *op, *other, where_text(lo, hi, al));
    };
    for (auto it = al->segs.lower_bound(a); it != al->segs.end() && it->first < b; ++it) {
        Seg &sg = it->second;
        bool unordered_w = sg.w && sg.w != op && !clock.after(*sg.w);
        if ((kind & ACC_READ) && unordered_w) conflict("read-after-write", sg.w, 0);
        if (kind & ACC_WRITE) {
            if (unordered_w && !(kind & ACC_READ)) conflict("write-after-write", sg.w, 1);
            for (auto &r : sg.r)
                if (r != op && !clock.after(*r)) conflict("write-after-read", r, 2);
            sg.w = op;
            sg.r.clear();
        } else {
            bool replaced = false;
            for (auto &r : sg.r)
                if (r->stream == op->stream) { r = op; replaced = true; }
            if (!replaced) sg.r.push_back(op);
        }
    }
    coalesce(al, a, b);
}

// ----------------------------------------------------------------------------
// host memory: watchpoints and checksums

const int NWATCH = 4;                        // x86 has four debug registers
const int NFRAMES = 12;                      // the stack kept of a hit
struct Watch {
    volatile int fd;
    volatile sig_atomic_t fired;
    uintptr_t lo;                            // the watched address
    void *stack[NFRAMES];                    // where the host touched the watched bytes
    int depth;
};
Watch g_watch[NWATCH] = {{-1, 0, 0, {}, 0}, {-1, 0, 0, {}, 0}, {-1, 0, 0, {}, 0}, {-1, 0, 0, {}, 0}};
int g_watch_state = 0;                       // 0 untried, 1 working, -1 unavailable
char g_watch_why[160] = "";
// Hits while the emulator's own code ran on the watched thread (t_emu_inside): not the
// program's touches, so not reported; counted, and the first one's stack, watched address and
// rdi kept (FT_EMU_STATS prints them at exit).
// Found (2026-11-28, the rare host-read-before-complete reports on the NCCL stand-in's staging
// that got the first pinned upload slots reverted): every such hit was glibc's __memchr_evex,
// called by std::string::find(" (") in the emulator's own FT_EMU_STATS counting (stats_count,
// for "host wait: event" from an event poll). It loads 32 bytes from where the search resumes:
// the 16-character name sat in the 32-byte heap chunk right before a 256-aligned pinned block
// (the stand-in's send staging, the destination of a pending copy, watched for reads), and the
// load from 27 bytes before the block reached its first bytes (6 of 40 stand-in FSDP 2 runs
// at FT_EMU_SEED=2 had hits, all with this stack; the 5 with the address kept: rdi = watched
// - 27, the block 256-aligned). Without the uploads'
// stream drains such copies stay pending across those polls, hence the link to the slots. With
// the guard and no padding of pinned blocks (the former PIN_PAD stop-gap), 0 reports in those
// 40 runs and 20 single-GPU upload runs: no real early touch by the program was found.
volatile sig_atomic_t g_ignored_hits = 0;
void *g_ignored_stack[NFRAMES];
int g_ignored_depth = 0;
uintptr_t g_ignored_lo = 0, g_ignored_rdi = 0;   // its watched address; rdi then (a string op's buffer)

void on_watch(int, siginfo_t *si, void *uc) {
    for (int i = 0; i < NWATCH; i++)
        if (si->si_fd >= 0 && g_watch[i].fd == si->si_fd) {
            if (t_emu_inside > 0) {   // (the watchpoint stays on: the program may touch it later)
                if (g_ignored_hits++ == 0) {
                    g_ignored_depth = backtrace(g_ignored_stack, NFRAMES);
                    g_ignored_lo = g_watch[i].lo;
#if defined(__x86_64__)
                    g_ignored_rdi = (uintptr_t)((ucontext_t *)uc)->uc_mcontext.gregs[REG_RDI];
#endif
                }
                continue;
            }
            g_watch[i].depth = backtrace(g_watch[i].stack, NFRAMES);
            g_watch[i].fired = 1;
            ioctl(si->si_fd, PERF_EVENT_IOC_DISABLE, 0);   // one report is enough
        }
}

// a hit's stack, without its two innermost frames (on_watch and the signal return)
void print_stack(void *const *stack, int depth) {
    fflush(stderr);
    if (depth > 2) backtrace_symbols_fd(stack + 2, depth - 2, 2);
}

int watch_signal() { return SIGRTMIN + 7; }

// a watchpoint on this thread over the widest aligned 1/2/4/8 bytes at the start of
// [lo, lo + n); the slot, or -1
int watch_add(uintptr_t lo, size_t n, bool reads_too) {
    if (g_watch_state < 0 || n == 0) return -1;
    int slot = -1;
    for (int i = 0; i < NWATCH && slot < 0; i++) if (g_watch[i].fd < 0) slot = i;
    if (slot < 0) return -1;
    if (g_watch_state == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_watch;
        sa.sa_flags = SA_SIGINFO | SA_RESTART;
        sigaction(watch_signal(), &sa, nullptr);
        void *warm[2];
        backtrace(warm, 2);   // (loads the unwinder now, not first inside the handler)
    }
    unsigned len = 1;
    for (unsigned l = 8; l > 1; l /= 2)
        if (lo % l == 0 && n >= l) { len = l; break; }
    struct perf_event_attr at;
    memset(&at, 0, sizeof at);
    at.type = PERF_TYPE_BREAKPOINT;
    at.size = sizeof at;
    at.bp_type = reads_too ? HW_BREAKPOINT_RW : HW_BREAKPOINT_W;
    at.bp_addr = lo;
    at.bp_len = len;
    at.sample_period = 1;
    at.wakeup_events = 1;
    at.exclude_kernel = 1;
    at.exclude_hv = 1;
    at.disabled = 1;
    int fd = (int)syscall(SYS_perf_event_open, &at, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0) {
        if (errno != ENOSPC && g_watch_state == 0) {
            g_watch_state = -1;
            snprintf(g_watch_why, sizeof g_watch_why, "perf_event_open (hardware breakpoint): %s", strerror(errno));
            fprintf(stderr, "cuda_emu: note: no hardware watchpoints (%s): host reads of pending copies to the "
                    "host are not reported\n", g_watch_why);
        }
        return -1;
    }
    struct f_owner_ex owner = {F_OWNER_TID, (pid_t)syscall(SYS_gettid)};
    if (fcntl(fd, F_SETFL, O_ASYNC) != 0 || fcntl(fd, F_SETSIG, watch_signal()) != 0 ||
        fcntl(fd, F_SETOWN_EX, &owner) != 0) {
        close(fd);
        return -1;
    }
    g_watch_state = 1;
    g_watch[slot].fired = 0;
    g_watch[slot].lo = lo;
    g_watch[slot].fd = fd;
    ioctl(fd, PERF_EVENT_IOC_ENABLE, 0);
    return slot;
}

void watch_del(int slot) {
    if (slot < 0) return;
    int fd = g_watch[slot].fd;
    ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
    g_watch[slot].fd = -1;
    close(fd);
}

uint64_t checksum(uintptr_t lo, uintptr_t hi) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)lo; p < (const unsigned char *)hi; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    return h;
}

void report_host_touch(const HostPending &h) {
    std::string a = op_text(*h.op);
    const unsigned long long before = g_count.load();
    report(std::string(h.dest ? "host|" : "hostw|") + h.op->name,   // (a source: as the checksum's)
           "cuda_emu: HAZARD host-%s-before-complete: the host touched the %s of %s (host "
           "address %p) before that copy was known complete (no stream, event or device synchronisation "
           "covering it); the touch (innermost first):", h.dest ? "read" : "write",
           h.dest ? "destination" : "source", a.c_str(), (void *)h.lo);
    if (g_count.load() > before && !quiet()) print_stack(g_watch[h.watch].stack, g_watch[h.watch].depth);
}

// cuStreamWaitValue32 gates not yet known passed by the host: stream -> its latest (op #)
std::map<int, uint64_t> g_gates;

void host_access(const OpRef &op, const Access &x) {
    // behind a gate the host opens, the host may fill a source (or read a destination's
    // earlier contents) until it opens the gate: what the gate orders is not judged here
    auto gate = g_gates.find(op->stream);
    if (gate != g_gates.end() && gate->second < op->seq) return;
    HostPending h;
    h.lo = (uintptr_t)x.p;
    h.hi = h.lo + x.n;
    h.op = op;
    h.dest = (x.kind & ACC_WRITE) != 0;
    bool staged_source = false;
    for (auto &o : g_host)
        if (o.lo < h.hi && h.lo < o.hi && !o.dest) {
            if (h.dest) o.overwritten = true;
            staged_source = true;
        }
    if (h.dest) {
        if (!staged_source) memset((void *)x.p, 0xff, x.n);   // poison: early reads see NaN / -1
    } else {
        h.sum = checksum(h.lo, h.hi);
    }
    if (g_host.size() >= 4096) {                // never synchronised: stop tracking the oldest
        watch_del(g_host.front().watch);
        g_host.erase(g_host.begin());
    }
    h.watch = watch_add(h.lo, x.n, h.dest);
    g_host.push_back(h);
}

} // namespace

// ----------------------------------------------------------------------------
// the interface (cuda_emu_async.h)

static unsigned long long g_report_seed;   // FT_EMU_SEED, for the summary line

void shadow_init_once(unsigned long long seed) {
    static bool done = false;
    if (done) return;
    done = true;
    g_report_seed = seed;
    const char *m = getenv("FT_EMU_MAX_REPORTS");
    if (m) g_max_reports = atoi(m);
    atexit([] {
        shadow_poll_watches();
        const char *st = getenv("FT_EMU_STATS");
        if (g_ignored_hits > 0 && st && *st && strcmp(st, "0") != 0) {
            fprintf(stderr, "cuda_emu: watch: %d hit(s) inside the emulator's own code ignored; the first on "
                    "%#lx (rdi %#lx), innermost first:\n", (int)g_ignored_hits, (unsigned long)g_ignored_lo,
                    (unsigned long)g_ignored_rdi);
            print_stack(g_ignored_stack, g_ignored_depth);
        }
        if (g_count.load() == 0) return;
        fflush(nullptr);
        fprintf(stderr, "cuda_emu: %llu ordering hazard(s) reported (%zu distinct, FT_EMU_SEED=%llu); failing the "
                "run (exit %d)\n", g_count.load(), g_seen.size(), g_report_seed, (int)CUEMU_HAZARD_EXIT);
        _exit(CUEMU_HAZARD_EXIT);
    });
}

void shadow_alloc(void *p, size_t n) {
    Alloc *al = new Alloc();
    al->lo = (uintptr_t)p;
    al->hi = al->lo + n;
    g_allocs[al->lo] = al;
}

void shadow_release(void *p) {
    auto it = g_allocs.find((uintptr_t)p);
    if (it == g_allocs.end()) return;
    Alloc *al = it->second;
    g_blocks.erase(g_blocks.lower_bound(al->lo), g_blocks.lower_bound(al->hi));
    g_allocs.erase(it);
    delete al;
}

bool shadow_is_device(const void *p) { return find_alloc((uintptr_t)p) != nullptr; }
size_t shadow_extent(const void *p) {
    const Alloc *al = find_alloc((uintptr_t)p);
    if (!al) return 0;
    const auto *blk = find_block((uintptr_t)p);
    return blk ? (size_t)(blk->second.hi - blk->first) : (size_t)(al->hi - al->lo);
}

// pinned host memory: start -> end (a GPU reaches it through unified addressing)
static std::map<uintptr_t, uintptr_t> g_pinned;
void shadow_pinned(void *p, size_t n, bool add) {
    if (add) g_pinned[(uintptr_t)p] = (uintptr_t)p + n;
    else g_pinned.erase((uintptr_t)p);
}
bool shadow_is_pinned(const void *p) {
    auto it = g_pinned.upper_bound((uintptr_t)p);
    if (it == g_pinned.begin()) return false;
    --it;
    return (uintptr_t)p < it->second;
}

void shadow_block_alloc(void *p, size_t n) {
    Alloc *al = find_alloc((uintptr_t)p);
    if (!al || n == 0) return;
    uintptr_t lo = (uintptr_t)p, hi = lo + n;
    // blocks never freed (an arena reset) give way to the new one
    g_blocks.erase(g_blocks.lower_bound(lo), g_blocks.lower_bound(hi));
    auto *prev = find_block(lo);
    if (prev) prev->second.hi = lo;
    g_blocks[lo] = Block{hi, g_next_block++};
    al->arena = true;
}

void shadow_block_free(void *p, const OpInfo &where, const Clock &clock) {
    const uintptr_t lo = (uintptr_t)p;
    Alloc *al = find_alloc(lo);
    if (!al) return;
    uintptr_t hi;
    int id = 0;
    auto bit = g_blocks.find(lo);
    if (bit != g_blocks.end()) {
        hi = bit->second.hi;
        id = bit->second.id;
    } else if (lo == al->lo) {
        hi = al->hi;                             // a whole allocation (cudaFreeAsync)
    } else {
        return;
    }
    std::vector<const OpInfo *> said;
    for (auto it = al->segs.lower_bound(lo - al->lo); it != al->segs.end() && it->first < hi - al->lo; ++it) {
        std::vector<OpRef> users = it->second.r;
        if (it->second.w) users.push_back(it->second.w);
        for (auto &u : users) {
            if (clock.after(*u) || std::find(said.begin(), said.end(), u.get()) != said.end()) continue;
            said.push_back(u.get());
            std::string b = op_text(*u);
            char blk[96];
            if (id) snprintf(blk, sizeof blk, "arena block #%d (%zu bytes)", id, (size_t)(hi - lo));
            else snprintf(blk, sizeof blk, "allocation of %zu bytes", (size_t)(hi - lo));
            report(std::string("free|") + u->name, "cuda_emu: HAZARD free-while-in-use: %s freed (ordered on "
                   "stream %d after op #%llu) while %s still uses it, not ordered before the free (the "
                   "memory can be handed out again at once)", blk, where.stream, (unsigned long long)where.seq,
                   b.c_str());
        }
    }
    if (bit != g_blocks.end()) g_blocks.erase(bit);
}

void shadow_access(const OpRef &op, const Clock &clock, const std::vector<Access> &acc) {
    for (const Access &x : acc) {
        const uintptr_t p = (uintptr_t)x.p;
        Alloc *al = find_alloc(p);
        if (!al) {
            // Device pointers are host pointers here; on a GPU a kernel, cuBLASLt, NCCL or a
            // memset given pageable host memory (malloc, the stack, a static) faults
            if (x.device && !shadow_is_pinned(x.p))
                report(std::string("hostmem|") + op->name,
                       "cuda_emu: HAZARD host-memory-on-device: %s dereferences %p on the device, which is "
                       "neither device memory (cudaMalloc, the arena) nor pinned host memory (cudaMallocHost): "
                       "a GPU faults (illegal address)", op_text(*op).c_str(), x.p);
            else if (!x.whole_block) host_access(op, x);   // kernels' host pointers: not tracked
            continue;
        }
        auto *blk = find_block(p);
        if (!blk && al->arena) {
            report(std::string("uaf|") + op->name,
                   "cuda_emu: HAZARD use-after-free: %s uses arena memory at offset %zu that is in no live "
                   "block (freed, or never handed out)", op_text(*op).c_str(), (size_t)(p - al->lo));
            continue;
        }
        uintptr_t lo = p, hi = p + x.n;
        if (x.whole_block) {
            lo = blk ? blk->first : al->lo;
            hi = blk ? blk->second.hi : al->hi;
        }
        check_range(op, clock, al, lo, hi, x.kind);
    }
}

void shadow_poll_watches() {
    for (auto &h : g_host)
        if (h.watch >= 0 && g_watch[h.watch].fired) {
            g_watch[h.watch].fired = 0;
            report_host_touch(h);
        }
}

void shadow_gate(int stream, uint64_t seq) { g_gates[stream] = seq; }

void shadow_host_retire(const Clock &host) {
    for (auto it = g_gates.begin(); it != g_gates.end();)
        it = host.get(it->first) >= it->second ? g_gates.erase(it) : std::next(it);
    shadow_poll_watches();
    for (auto &h : g_host)                        // all watches off before reading sources
        if (host.after(*h.op) && h.watch >= 0) {
            watch_del(h.watch);
            h.watch = -1;
        }
    for (size_t i = 0; i < g_host.size();) {
        HostPending &h = g_host[i];
        if (!host.after(*h.op)) { i++; continue; }
        if (!h.dest && !h.overwritten && checksum(h.lo, h.hi) != h.sum)
            report(std::string("hostw|") + h.op->name,
                   "cuda_emu: HAZARD host-write-before-complete: the host changed the source buffer of %s (host "
                   "address %p) before that copy was known complete", op_text(*h.op).c_str(), (void *)h.lo);
        g_host.erase(g_host.begin() + (long)i);
    }
}

} // namespace cuemu

using namespace cuemu;

extern "C" unsigned long long cuemu_hazard_count(void) { return g_count.load(); }
extern "C" const char *cuemu_last_hazard(void) { return g_last.c_str(); }
extern "C" void cuemu_hazard_reset(void) {
    g_count = 0;
    g_seen.clear();
    g_last.clear();
}
extern "C" int cuemu_host_watch_available(const char **why) {
    static volatile double probe;
    if (g_watch_state == 0) {
        int s = watch_add((uintptr_t)&probe, sizeof probe, true);
        watch_del(s);
    }
    if (why) *why = g_watch_why;
    return g_watch_state == 1;
}
