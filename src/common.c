// common.c: the error record, checked allocation, checked paths and fp16 conversion (see common.h).
#include "common.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// error record (one per thread; the first error wins)

static _Thread_local char g_error[1024];
static _Thread_local int g_error_set;

int ft_error(const char *fmt, ...) {
    if (g_error_set) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_error, sizeof g_error, fmt, ap);
    va_end(ap);
    g_error_set = 1;
    return -1;
}

const char *ft_error_message(void) { return g_error_set ? g_error : ""; }

void ft_error_clear(void) { g_error_set = 0; g_error[0] = '\0'; }

// ----------------------------------------------------------------------------
// checked allocation

void *ft_malloc(size_t nbytes, const char *what) {
    void *p = malloc(nbytes ? nbytes : 1);
    if (!p) ft_error("out of memory allocating %zu bytes for %s", nbytes, what);
    return p;
}

void *ft_calloc(size_t count, size_t size, const char *what) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) ft_error("out of memory allocating %zu x %zu bytes for %s", count, size, what);
    return p;
}

char *ft_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = ft_malloc(n, "string");
    if (p) memcpy(p, s, n);
    return p;
}

// ----------------------------------------------------------------------------
// paths

int ft_path(char *buf, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const int k = vsnprintf(buf, n, fmt, ap);
    va_end(ap);
    if (k >= 0 && (size_t)k < n) return 0;
    return ft_error("path too long (%d bytes, the limit is %zu): %.120s...", k, n ? n - 1 : 0, buf);
}

// ----------------------------------------------------------------------------
// IEEE half precision

uint64_t ft_fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;   // the FNV 64-bit prime
    return h;
}

uint64_t ft_fingerprint_sampled(uint64_t h, const void *p, size_t n) {
    const size_t S = FT_FINGERPRINT_SAMPLE;
    if (n <= 3 * S) return ft_fnv1a(h, p, n);
    const size_t at[3] = {0, (n - S) / 2, n - S};
    for (int k = 0; k < 3; k++) h = ft_fnv1a(h, (const unsigned char *)p + at[k], S);
    return h;
}

// ft_hash64's two odd multipliers: 2^64 / the golden ratio, and the first 64 fractional bits
// of sqrt(2) with the low bit set
#define H64_K1 0x9e3779b97f4a7c15ull
#define H64_K2 0x6a09e667f3bcc909ull

static inline uint64_t h64_load(const unsigned char *p) {   // 8 bytes as a little-endian word
    uint64_t w;
    memcpy(&w, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    return w;
}

// One step: a bijection of v for fixed w, and of w for fixed v (xor, odd multiply, rotate).
static inline uint64_t h64_step(uint64_t v, uint64_t w) {
    const uint64_t x = (v ^ w) * H64_K1;
    return (x << 27) | (x >> 37);
}

void ft_hostname(char *buf, size_t n) {
    if (n == 0) return;
    if (gethostname(buf, n - 1) != 0) snprintf(buf, n, "?");
    buf[n - 1] = '\0';
}

uint64_t ft_hash64(const void *p, size_t n) {
    const unsigned char *b = p;
    // lane i takes words i, i + 8, i + 16, ...: eight independent chains, in registers
    uint64_t v0 = H64_K2, v1 = 3 * H64_K2, v2 = 5 * H64_K2, v3 = 7 * H64_K2, v4 = 9 * H64_K2, v5 = 11 * H64_K2,
             v6 = 13 * H64_K2, v7 = 15 * H64_K2;
    size_t k = 0;
    for (; k + 64 <= n; k += 64) {
        const unsigned char *q = b + k;
        v0 = h64_step(v0, h64_load(q));
        v1 = h64_step(v1, h64_load(q + 8));
        v2 = h64_step(v2, h64_load(q + 16));
        v3 = h64_step(v3, h64_load(q + 24));
        v4 = h64_step(v4, h64_load(q + 32));
        v5 = h64_step(v5, h64_load(q + 40));
        v6 = h64_step(v6, h64_load(q + 48));
        v7 = h64_step(v7, h64_load(q + 56));
    }
    const uint64_t lanes[8] = {v0, v1, v2, v3, v4, v5, v6, v7};
    uint64_t h = (uint64_t)n * H64_K2;
    for (int i = 0; i < 8; i++) h = h64_step(h, lanes[i]);
    for (; k + 8 <= n; k += 8) h = h64_step(h, h64_load(b + k));
    if (k < n) {   // the last 1..7 bytes, zero-extended (n tells them from trailing zeros)
        unsigned char last[8] = {0};
        memcpy(last, b + k, n - k);
        h = h64_step(h, h64_load(last));
    }
    h ^= h >> 31;   // spread the high bits over the low ones: a bijection, too
    h *= H64_K2;
    return h ^ (h >> 29);
}

float ft_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) & 1u, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    float v;
    if (exp == 0) v = ldexpf((float)man, -24);                     // zero / subnormal
    else if (exp == 31) v = man ? NAN : INFINITY;                   // inf / nan
    else v = ldexpf((float)(man | 0x400u), (int)exp - 25);          // normal
    return sign ? -v : v;
}

// ----------------------------------------------------------------------------
// SHA-256 (FIPS 180-4, section 6.2)

static const uint32_t sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t ror32(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

// one 64-byte block into the state
static void sha256_block(uint32_t h[8], const unsigned char *b) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)b[4 * i] << 24 | (uint32_t)b[4 * i + 1] << 16 | (uint32_t)b[4 * i + 2] << 8 | b[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        const uint32_t s0 = ror32(w[i - 15], 7) ^ ror32(w[i - 15], 18) ^ (w[i - 15] >> 3);
        const uint32_t s1 = ror32(w[i - 2], 17) ^ ror32(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], bb = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; i++) {
        const uint32_t t1 = hh + (ror32(e, 6) ^ ror32(e, 11) ^ ror32(e, 25)) + ((e & f) ^ (~e & g)) + sha256_k[i] + w[i];
        const uint32_t t2 = (ror32(a, 2) ^ ror32(a, 13) ^ ror32(a, 22)) + ((a & bb) ^ (a & c) ^ (bb & c));
        hh = g; g = f; f = e; e = d + t1; d = c; c = bb; bb = a; a = t1 + t2;
    }
    h[0] += a; h[1] += bb; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
}

void ft_sha256_init(ft_sha256_ctx *c) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, h0, sizeof h0);
    c->bytes = 0;
}

void ft_sha256_update(ft_sha256_ctx *c, const void *p, size_t n) {
    const unsigned char *b = p;
    while (n > 0) {
        const size_t used = (size_t)(c->bytes % 64), take = n < 64 - used ? n : 64 - used;
        memcpy(c->block + used, b, take);
        c->bytes += take;
        b += take;
        n -= take;
        if (c->bytes % 64 == 0) sha256_block(c->h, c->block);
    }
}

void ft_sha256_final(ft_sha256_ctx *c, unsigned char digest[32]) {
    const uint64_t bits = c->bytes * 8;
    const unsigned char one = 0x80, zero = 0;
    ft_sha256_update(c, &one, 1);   // then zeros up to 56 mod 64, then the length (big-endian)
    while (c->bytes % 64 != 56) ft_sha256_update(c, &zero, 1);
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)(bits >> (56 - 8 * i));
    ft_sha256_update(c, len, 8);
    for (int i = 0; i < 32; i++) digest[i] = (unsigned char)(c->h[i / 4] >> (24 - 8 * (i % 4)));
}

int ft_sha256_file_hex(const char *path, char hex[65]) {
    FILE *f = fopen(path, "rb");
    if (!f) return ft_error("%s: %s", path, strerror(errno));
    ft_sha256_ctx c;
    ft_sha256_init(&c);
    unsigned char buf[1 << 16];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) ft_sha256_update(&c, buf, got);
    const int failed = ferror(f);
    fclose(f);
    if (failed) return ft_error("%s: read error", path);
    unsigned char d[32];
    ft_sha256_final(&c, d);
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
    return 0;
}

// ----------------------------------------------------------------------------
// environment variables

typedef enum {
    ENV_USER,     // finetune reads it; for users
    ENV_TEST,     // finetune reads it; for the test suites only
    ENV_SYSTEM,   // set by a launcher, Slurm or the user for other programs too; finetune reads it
    ENV_SLURM,    // read by slurm/*.sbatch (not by finetune)
    ENV_TOOLS,    // read by the test programs and the CUDA emulator in tests/ (not by finetune)
} env_kind;
typedef struct {
    const char *name;
    env_kind kind;
    const char *doc;   // one line of Markdown
} env_var;

// Every environment variable the code reads. tests/test_gen_docs.sh checks both ways against
// the sources; keep each kind's rows together (the Markdown prints them in this order).
static const env_var env_vars[] = {
    {"FT_HOST_MEMORY_BYTES", ENV_USER,
     "bytes of host memory that `--offload_optimizer`'s pinned state of all the ranks of a node may take, "
     "taken as is (default: the smaller of the machine's memory and the job's cgroup limit, less 10%)"},
    {"FT_SIGNAL_MARGIN_S", ENV_USER,
     "seconds a stop signal leaves before Slurm's time limit when the job was submitted with another "
     "`--signal=TERM@N` than `slurm/*.sbatch`'s 300: finetune warns once when a step and a checkpoint "
     "take longer"},
    {"FT_NCCL_LIBRARY", ENV_USER,
     "the NCCL library GPU jobs of several ranks load (default: `libnccl.so.2` from the library path)"},
    {"FT_LMHEAD_CHUNK_ROWS", ENV_TEST,
     "caps the rows of each lm_head + cross-entropy chunk (an integer from 1), so that small models run "
     "the chunked path"},
    {"FT_MPI_MAX_COUNT", ENV_TEST,
     "lowers the most elements one MPI call moves (default 2^31 - 1), so that small jobs run the chunked "
     "all-reduces and broadcasts"},
    {"FT_TEST_STOP_AT_STEP", ENV_TEST,
     "`N`: rank 1 stops itself (SIGSTOP) in step N, for the watchdog's tests"},
    {"FT_TEST_LAZY_ATTN_PLANS", ENV_TEST,
     "`1`: skip building the attention plans before step 1 (they build on first use, inside the step loop), for the "
     "check that such late builds are counted"},
    {"FT_TEST_STOP_BEFORE", ENV_TEST,
     "`nccl_init` or `nccl_split`: rank 1 stops itself (SIGSTOP) right before that NCCL call"},
    {"FT_TEST_NCCL_SONAME", ENV_TEST,
     "the library name NCCL is looked for under on the library path instead of `libnccl.so.2` (a name "
     "nothing has), so that the search in the Python wheels runs"},
    {"FT_TEST_NCCL_SELF", ENV_TEST,
     "a one-rank GPU job runs its collectives through NCCL (one rank's communicators) instead of the "
     "single-process transport"},
    {"FT_TEST_HOST", ENV_TEST,
     "replaces this machine's host name when ranks choose their GPU (several hosts simulated on one)"},
    {"FT_TEST_PREFLIGHT_SLOW_RANK", ENV_TEST,
     "`R`: rank R's own timed part of the preflight sleeps 20 ms more, so that the preflight names it"},
    {"FT_TEST_PREFLIGHT_FAKE_VERSION", ENV_TEST,
     "`R`: rank R reports its build as `<version>-fake` in the preflight, so that the preflight names it"},
    {"FT_TEST_SAMPLE_SKEW", ENV_TEST,
     "ranks other than 0 draw EOS when sampling, as a rank whose draw differs would (rank 0's token must "
     "win)"},
    {"FT_TEST_OUT_DIR_WAIT_S", ENV_TEST,
     "seconds the other ranks look again for rank 0's `--out_dir` lock before calling the directory "
     "another (default 60, a network filesystem's attribute cache)"},
    {"FT_TEST_PUBLISH_KILL", ENV_TEST,
     "`1`: exit (status 9) right after the rename that replaces a published directory, before the old "
     "copy is removed"},
    {"FT_TEST_POISON_FRESH_GRADS", ENV_TEST,
     "fill each fresh gradient buffer with NaN first, so that an element the backward fails to "
     "overwrite shows in the gradient norm"},
    {"FT_TEST_DEVICE_MIB", ENV_TEST,
     "the device memory in MiB that `--auto` plans for instead of the device's (a real run's GPUs, or "
     "`--dry_run_device`'s; a memory sweep)"},
    {"FT_TEST_METRICS_TEAR", ENV_TEST,
     "`N`: write half of the N-th `metrics.jsonl` record and fail it, as a full disk would"},
    {"FT_TEST_FP8_UNFUSED", ENV_TEST,
     "`--fp8` quantises every activation with its own amax pass instead of the amax its producer "
     "(`rmsnorm_fwd`, `swiglu_fwd`) computed, and the step-time estimate prices it so: for the checks "
     "that both give the same bits and that the estimate prices the difference"},

    {"PMI_RANK", ENV_SYSTEM, "this process's rank (MPICH, Slurm PMI2), before the launcher is set up: "
     "which rank prints flag errors and `--dry_run`'s report"},
    {"SLURM_PROCID", ENV_SYSTEM, "the same under srun"},
    {"OMPI_COMM_WORLD_RANK", ENV_SYSTEM, "the same under Open MPI"},
    {"PMI_SIZE", ENV_SYSTEM, "the ranks started (MPICH, Slurm PMI2): `--dry_run` plans for them "
     "without `--world_size`"},
    {"SLURM_NTASKS", ENV_SYSTEM, "the same under Slurm"},
    {"OMPI_COMM_WORLD_SIZE", ENV_SYSTEM, "the same under Open MPI"},
    {"SLURM_STEP_NUM_TASKS", ENV_SYSTEM, "the tasks of an srun step (also `PMI_SIZE`, `OMPI_COMM_WORLD_SIZE`): "
     "a process that is one of several but joined none of the others warns that it trains alone"},
    {"PMI_FD", ENV_SYSTEM, "set by an MPI or Slurm PMI2 launcher: this process is one of its ranks"},
    {"PMIX_RANK", ENV_SYSTEM, "set by a PMIx launcher: this process is one of its ranks"},
    {"SLURM_STEP_ID", ENV_SYSTEM, "under srun: with `PMI_FD`, ranks start through Slurm's PMI2"},
    {"SLURM_LOCALID", ENV_SYSTEM, "under Slurm PMI2: the rank on its node (its GPU)"},
    {"SLURM_STEP_TASKS_PER_NODE", ENV_SYSTEM, "under Slurm PMI2: the tasks on each node"},
    {"SLURM_JOB_ID", ENV_SYSTEM, "inside a Slurm job: the stop signal's margin is checked "
     "(`FT_SIGNAL_MARGIN_S`)"},
    {"OMP_NUM_THREADS", ENV_SYSTEM, "CPU threads per rank (OpenMP); unset, MPI ranks of a node share its "
     "CPUs equally"},
    {"CUDA_VISIBLE_DEVICES", ENV_SYSTEM, "the GPUs a rank sees: ranks of one host with the same value take "
     "its GPUs in rank order"},
    {"NCCL_LAUNCH_ORDER_IMPLICIT", ENV_SYSTEM, "finetune sets `1` when unset (NCCL orders the launches of "
     "its two communicators); `0` runs sharded GPU jobs in one lane, as on NCCL 2.18-2.25 (one warning)"},
    {"NCCL_RUNTIME_CONNECT", ENV_SYSTEM, "finetune sets `0` when unset: NCCL connects its peers at init, "
     "before the device arena is sized"},
    {"NCCL_MAX_CTAS", ENV_SYSTEM, "NCCL's own bound on the CTAs of a collective: it overrides `--nccl_max_ctas` "
     "(rank 0 says so once)"},

    {"FT_ROOT", ENV_SLURM, "the repository the job runs in (default: the submit directory)"},
    {"FT_BIN", ENV_SLURM, "the finetune binary, relative to `FT_ROOT` or absolute (default "
     "`build/finetune`)"},
    {"FT_DEVICE", ENV_SLURM, "the `--device` added when the arguments give none (default `cuda`)"},
    {"FT_SAVE_EVERY", ENV_SLURM, "the `--save_every` added when the arguments give none (default 2000, "
     "multi-node 5000; 0 = only at the end)"},
    {"FT_DP_SHARD", ENV_SLURM, "`finetune_multinode.sbatch`: the `--dp_shard` added when the arguments give "
     "neither it nor `--no_fsdp` (default: the tasks per node)"},
    {"FT_SRUN_ARGS", ENV_SLURM, "more options for srun (e.g. `--cpu-bind=cores`)"},

    {"FT_SANITIZED", ENV_TOOLS, "set by `make test-asan`: the suites skip their slow cases"},
    {"FT_GOLDEN_DIR", ENV_TOOLS, "`test_golden`'s reference directory (default `tests/golden`)"},
    {"FT_CUDA_STUB_LIBCUDA", ENV_TOOLS, "the stub libcuda `test_cudnn_plan` loads (default: the CUDA "
     "toolkit's)"},
    {"FT_PMI2_CORRUPT", ENV_TOOLS, "`R`: rank R of `tests/slurm`'s PMI2 exchange publishes a wrong value"},
    {"FT_TEST_CUDNN_FAULT", ENV_TOOLS, "the emulated cuDNN fails as told: `plan`, `late_fwd`, `late_bwd` "
     "(plans after the first) or `mismatch` (a wrong forward)"},
    {"FT_EMU_DEVICES", ENV_TOOLS, "emulated GPUs (default 1)"},
    {"FT_EMU_MEMORY_MIB", ENV_TOOLS, "memory of each emulated GPU in MiB (default 8192)"},
    {"FT_EMU_DEVICE_NAME", ENV_TOOLS, "the name an emulated GPU reports"},
    {"FT_EMU_COMPUTE_CAPABILITY", ENV_TOOLS, "`MAJOR.MINOR` an emulated GPU reports (default 8.0)"},
    {"FT_EMU_SHARED_DEVICES", ENV_TOOLS, "emulated device numbers are the node's: a rank drives its "
     "`CUDA_VISIBLE_DEVICES` entry, two ranks of a host on one GPU are refused"},
    {"FT_EMU_NCCL_VERSION", ENV_TOOLS, "the version the emulated NCCL reports (`NCCL_VERSION_CODE`, "
     "default 22809)"},
    {"FT_EMU_CUDNN_VERSION", ENV_TOOLS, "the version the emulated cuDNN reports (`cudnnGetVersion`, "
     "default 91900)"},
    {"FT_EMU_CONTEXT_MIB", ENV_TOOLS, "MiB of each emulated GPU taken before the program allocates (what a "
     "CUDA context and the libraries hold; default 0)"},
    {"FT_EMU_NCCL_COMM_BYTES", ENV_TOOLS, "bytes of an emulated GPU each live emulated NCCL communicator "
     "takes (default 0)"},
    {"FT_EMU_NCCL_ID_FAIL", ENV_TOOLS, "the emulated `ncclGetUniqueId` fails"},
    {"FT_EMU_NCCL_CONFIG", ENV_TOOLS, "the emulated NCCL and the NCCL stand-in print each communicator's "
     "`ncclConfig_t` CTA bounds (minCTAs, maxCTAs) as it is created"},
    {"FT_EMU_SEED", ENV_TOOLS, "seed of the emulated streams' random delays"},
    {"FT_EMU_MAX_DELAY_US", ENV_TOOLS, "the longest random delay of an emulated stream operation (us)"},
    {"FT_EMU_SYNC", ENV_TOOLS, "`1`: emulated streams run each operation when it is issued"},
    {"FT_EMU_MAX_QUEUE", ENV_TOOLS, "`N`: an emulated stream holds at most N unfinished operations "
     "(issuing one more blocks the host)"},
    {"FT_EMU_FAULT", ENV_TOOLS, "`KIND@RANK:N`: on rank RANK (`PMI_RANK`) the Nth kernel launch faults "
     "(KIND `illegal_address` or `ecc`: a sticky CUDA error) or the Nth collective leaves its emulated "
     "NCCL communicator in an asynchronous error (`nccl_async`)"},
    {"FT_STANDIN_FAULT", ENV_TOOLS, "`nccl_async@RANK:N`: on rank RANK (`PMI_RANK`) the NCCL stand-in's Nth "
     "collective fails, leaving its communicator in an asynchronous error"},
    {"FT_EMU_STATS", ENV_TOOLS, "print how many operations of each kind were issued, at exit"},
    {"FT_EMU_MAX_REPORTS", ENV_TOOLS, "the most ordering-hazard reports printed (default 20)"},
    {"FT_EMU_VCLOCK", ENV_TOOLS, "a device of the estimate's table (`a100`, `h100`, `h200`): the emulated "
     "runtime keeps a virtual clock priced at that device's rates and the trainer's step times read it "
     "(`tests/cuda_emu/README.md`)"},
    {"FT_EMU_VCLOCK_GPUS_PER_NODE", ENV_TOOLS, "GPUs per node the virtual clock assumes (default the device's, "
     "8): an emulated NCCL group spanning nodes is priced at the network's rate"},
    {"FT_EMU_VCLOCK_ISSUE_US", ENV_TOOLS, "the virtual clock's host cost of issuing one operation in us "
     "(default 8, the per-operation floor)"},
    {"FT_EMU_VCLOCK_INTRA_GBPS", ENV_TOOLS, "the virtual clock's bus bandwidth of a collective within a node, GB/s "
     "per GPU (default the estimate's, 0.8 of NVLink; as `--fabric_intra_gbps` gives the estimate)"},
    {"FT_EMU_VCLOCK_INTER_GBPS", ENV_TOOLS, "the virtual clock's bus bandwidth of a collective across nodes, GB/s "
     "per GPU (default the estimate's, 0.92 of the network; as `--fabric_inter_gbps` gives the estimate)"},
    {"CUEMU_ORDER", ENV_TOOLS, "`forward`, `reverse` or `random`: the order emulated thread blocks run"},
    {"CUEMU_SEED", ENV_TOOLS, "the seed of `CUEMU_ORDER=random`"},
    {"CUEMU_STACK_KB", ENV_TOOLS, "stack of each emulated GPU thread in KiB (default 256, 1024 under "
     "ASan)"},
    {"CUEMU_WORKERS", ENV_TOOLS, "the emulator's worker threads (default: the CPUs available)"},
};
#define N_ENV_VARS (int)(sizeof env_vars / sizeof env_vars[0])

const char *ft_getenv(const char *name) {
    for (int i = 0; i < N_ENV_VARS; i++)
        if (strcmp(env_vars[i].name, name) == 0 && env_vars[i].kind <= ENV_SYSTEM) return getenv(name);
    fprintf(stderr, "finetune: internal error: ft_getenv(\"%s\"): not a variable finetune reads in src/common.c's "
            "table\n", name);
    return NULL;
}

// One section: a heading, a line of text, then the table of the variables of `kind`.
static void env_section(FILE *out, const char *heading, const char *text, env_kind kind) {
    fprintf(out, "\n## %s\n\n%s\n\n| Variable | %sDescription |\n|---|%s---|\n", heading, text,
            kind == ENV_USER ? "Use | " : "", kind == ENV_USER ? "---|" : "");
    for (int i = 0; i < N_ENV_VARS; i++) {
        const env_var *v = &env_vars[i];
        if (v->kind == kind || (kind == ENV_USER && v->kind == ENV_TEST))
            fprintf(out, "| `%s` | %s%s |\n", v->name,
                    kind != ENV_USER ? "" : v->kind == ENV_USER ? "user | " : "test-only | ", v->doc);
    }
}

void ft_env_print_markdown(FILE *out) {
    fprintf(out, "# Environment variables\n\n"
            "Generated by `finetune --help=env` from the table in `src/common.c`: do not edit; `make docs`\n"
            "rewrites it and `tests/test_gen_docs.sh` fails when it is stale. The flags are in\n"
            "[flags.md](flags.md).\n");
    env_section(out, "Read by finetune",
                "Test-only variables are for the test suites (fault injection, small-scale versions of\n"
                "large-scale paths); a real job leaves them unset.", ENV_USER);
    env_section(out, "Set by launchers and the system, read by finetune",
                "finetune reads these; launchers (mpirun, srun) and users set them for other programs too.",
                ENV_SYSTEM);
    env_section(out, "Read by the Slurm scripts",
                "`slurm/finetune_1node.sbatch` and `slurm/finetune_multinode.sbatch` (see `slurm/README.md`).",
                ENV_SLURM);
    env_section(out, "Read by the test programs and the CUDA emulator",
                "`tests/` (the emulated GPU build links the emulator into finetune: its variables act there\n"
                "too).\n"
                "The test scripts' own variables are described at their top.", ENV_TOOLS);
}
