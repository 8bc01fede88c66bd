// common.h: status codes, the one error record, and the CHECK macro family.
//
// Contract used everywhere in src/:
//   - Library functions return 0 on success and -1 on failure; they never exit.
//   - The first failure records ONE human-readable line with ft_error(); outer layers
//     just propagate -1 (TRY). Only main() prints it (once, rank 0) and exits non-zero.
//   - Foreign APIs (libc files, allocation, CUDA, cuBLAS, NCCL, MPI, PMI2) are wrapped by
//     CHECK_* macros that record the failing expression, file:line and the API's reason.
//     A failure about a file the user named says so in their terms instead:
//     ft_error("%s: cannot open: %s", path, strerror(errno)).
//   - Memory comes from ft_malloc / ft_calloc / ft_strdup (or CHECK_ALLOC), paths from
//     ft_path: neither an allocation nor a path can fail without its one line.
//   - Cleanup: a function that owns nothing on failure returns through TRY / CHECK_*. One
//     that does has ONE label at its end, reached by TRY_GOTO / CHECK_*_GOTO: `done:` when
//     success and failure both run the cleanup (rc says which), `fail:` when only failure
//     does (success returns above it). Code that must keep every rank in step carries rc
//     to the agreement (comm_agree) instead of returning early.
#pragma once
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

// ----------------------------------------------------------------------------
// error record

// Record an error message (printf-style). Keeps the FIRST message until ft_error_clear(),
// so the root cause survives while callers unwind. Always returns -1, so that
// `return ft_error("%s: bad magic", path);` reads naturally.
int ft_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// The recorded message, or "" when none.
const char *ft_error_message(void);
// Forget the recorded message (tests use this between cases).
void ft_error_clear(void);

// ----------------------------------------------------------------------------
// CHECK family: each records "<expr> failed at file:line: <reason>" and returns -1 from the
// enclosing function. Use the _GOTO forms where the function must release resources.

#define FT_WHERE __FILE__, __LINE__

// propagate a failure from one of our own functions (the callee already recorded why)
#define TRY(call) do { if ((call) != 0) return -1; } while (0)
#define TRY_GOTO(call, label) do { if ((call) != 0) goto label; } while (0)

// libc / POSIX calls that signal failure by a false/NULL/-1 result and set errno
#define CHECK_SYS_GOTO(cond, label) do { if (!(cond)) { \
    ft_error("%s failed at %s:%d: %s", #cond, FT_WHERE, strerror(errno)); goto label; } } while (0)

// allocations: `CHECK_ALLOC(p = malloc(n), n)`
#define CHECK_ALLOC(expr, nbytes) do { if ((expr) == NULL) { \
    return ft_error("out of memory allocating %zu bytes (%s) at %s:%d", (size_t)(nbytes), #expr, FT_WHERE); } } while (0)
#define CHECK_ALLOC_GOTO(expr, nbytes, label) do { if ((expr) == NULL) { \
    ft_error("out of memory allocating %zu bytes (%s) at %s:%d", (size_t)(nbytes), #expr, FT_WHERE); goto label; } } while (0)

// ----------------------------------------------------------------------------
// paths

// Every path buffer in src/ is FT_PATH_MAX bytes (Linux's PATH_MAX) and filled by ft_path.
#define FT_PATH_MAX 4096

// Format a path into buf (n bytes), printf-style. 0, or -1 with ft_error "path too long"
// (naming the path's start) when it does not fit: a truncated path must never be opened,
// created or removed.
int ft_path(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

// ----------------------------------------------------------------------------
// checked allocation

// Checked allocation helpers (record the error themselves; return NULL on failure).
void *ft_malloc(size_t nbytes, const char *what);
void *ft_calloc(size_t count, size_t size, const char *what);
char *ft_strdup(const char *s);

// Overflow-checked size arithmetic: 0 on success, -1 (no error recorded) on overflow.
static inline int ft_mul_size(size_t a, size_t b, size_t *out) {
    return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}
static inline int ft_add_size(size_t a, size_t b, size_t *out) {
    return __builtin_add_overflow(a, b, out) ? -1 : 0;
}

// ----------------------------------------------------------------------------
// numeric helpers shared by host code

static inline float ft_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f;
}
// round-to-nearest-even, NaN stays NaN (quiet)
static inline uint16_t ft_f32_to_bf16(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
float ft_f16_to_f32(uint16_t h);

// Content fingerprints (which files a checkpoint was trained from: safetensors.h's
// st_fingerprint, loader_fingerprint): 64-bit FNV-1a continued from h (FT_FNV_INIT to start)
// over all n bytes at p when n <= 3 x FT_FINGERPRINT_SAMPLE, else over FT_FINGERPRINT_SAMPLE
// bytes at the start, the middle and the end: about 200 KiB read of a buffer of any size (an
// mmapped file: only those pages touched). Tells apart files whose bytes differ almost
// everywhere (another model, a fine-tune, other data); not a change confined to unsampled
// bytes. Not cryptographic: it catches mistakes, not tampering.
#define FT_FNV_INIT 0xcbf29ce484222325ull   // the FNV-1a 64-bit offset basis
#define FT_FINGERPRINT_SAMPLE ((size_t)64 << 10)
uint64_t ft_fnv1a(uint64_t h, const void *p, size_t n);
uint64_t ft_fingerprint_sampled(uint64_t h, const void *p, size_t n);

// Checksum of a tensor's bytes (safetensors.h: the writer records one per tensor, the reader
// verifies it on request): 64 bits over all n bytes at p, read as little-endian words by 8
// independent multiply-rotate lanes over 64-byte blocks, then the lanes, the tail words, the
// last partial word and n folded into one. 23 GB/s from memory, 37 GB/s from cache, on one
// core of an AMD EPYC at -O2: faster than the file is written. Every step is a bijection of
// the state for a fixed word and of the word for a fixed state, so two buffers of one length
// that differ within one 8-byte word (any one flipped byte) never give the same value; other
// differences collide with a chance of about 2^-64. Not cryptographic: it catches corruption,
// not tampering.
uint64_t ft_hash64(const void *p, size_t n);

// This machine's host name into buf (n bytes, always terminated; "?" when it cannot be read):
// for the lock file's holder and the lines that name a rank's host.
void ft_hostname(char *buf, size_t n);

// SHA-256 (FIPS 180-4), for comparing files with the digests scripts/*.py record (hashlib's):
// init, update over the bytes in any pieces, final writes the 32-byte digest.
typedef struct {
    uint32_t h[8];
    uint64_t bytes;             // message length so far
    unsigned char block[64];    // a partial block (bytes % 64 of it)
} ft_sha256_ctx;
void ft_sha256_init(ft_sha256_ctx *c);
void ft_sha256_update(ft_sha256_ctx *c, const void *p, size_t n);
void ft_sha256_final(ft_sha256_ctx *c, unsigned char digest[32]);
// The digest of file `path` as 64 lowercase hex digits into hex[65]. 0, or -1 with ft_error.
int ft_sha256_file_hex(const char *path, char hex[65]);

// Index of the first NaN or infinity of x[0..n), or n when every value is finite.
static inline size_t ft_first_nonfinite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!__builtin_isfinite(x[i])) return i;
    return n;
}

// ----------------------------------------------------------------------------
// environment variables: one table (common.c) lists every variable the code reads, with who
// reads it and one line of documentation; `finetune --help=env` prints it as
// docs/environment.md, and tests/test_gen_docs.sh checks that every FT_* name read in src/
// and tests/ is in it and every entry is read somewhere.

// The value of environment variable `name`, or NULL when it is unset. `name` must be in the
// table as a variable finetune reads (its own FT_* ones and the launchers' and system's it
// looks at): any other name is a programming error, reported as one "internal error" line on
// stderr (the suites fail on unexpected stderr), and gives NULL whatever the environment says.
const char *ft_getenv(const char *name);

// Print the table as Markdown (docs/environment.md) to `out`.
void ft_env_print_markdown(FILE *out);
