// fp8_linear.c: --fp8's backend wrapper (see fp8_linear.h).
#include "fp8_linear.h"

#include <string.h>

#include "backend_ops.h"
#include "common.h"
#include "lora.h"
#ifdef FT_HAVE_CUDA
#include "backend_cuda.h"
#endif

#define FP8_ALIGN 256   // the FP8 operands' offsets in the scratch (cuBLASLt wants 16 bytes at least)

static const backend *g_inner;
static backend g_table;
static struct {
    unsigned char *buf;   // one call's FP8 codes and stats (fp8_linear_call_bytes' layouts), backend memory
    size_t cap;
    size_t used;          // the largest layout a call asked for
} g_scratch;

// The fused amax (fp8_linear.h): the output of the latest rmsnorm_fwd or swiglu_fwd the model
// called through the wrapper, whose amax that op wrote into `slot`; forgotten by every other op
static struct {
    float *slot;          // one fp32 of the inner backend's memory (fuse_slot_ready)
    const void *buf;      // the output; NULL: nothing remembered
    size_t n;             // its elements
    int off;              // FT_TEST_FP8_UNFUSED, or no fp8_cast: every amax by its own pass
    long fused, all;      // activations quantised from their producer's amax / all (FP8 GEMMs)
} g_fuse;

static size_t round_up(size_t n) { return (n + FP8_ALIGN - 1) / FP8_ALIGN * FP8_ALIGN; }

// (the FP8 GEMM's reduction length and its output rows' stride must be multiples of 16)
int fp8_linear_shape_ok(int IC, int OC) { return IC % 16 == 0 && OC % 16 == 0; }

// (dW's reduction runs over the N token rows: a multiple of 16 too)
int fp8_linear_dw_ok(int N, int IC, int OC) { return fp8_linear_shape_ok(IC, OC) && N > 0 && N % 16 == 0; }

// room for one call's layout, grown (never shrunk) on demand: the old buffer is released first
// (ops on the one compute stream run in order, so the GEMM still queued on it has read it
// before anything reuses its memory)
static int scratch_reserve(size_t bytes) {
    if (bytes <= g_scratch.cap) return 0;
    if (g_scratch.buf) g_inner->free(g_scratch.buf);
    g_scratch.cap = 0;
    if (!(g_scratch.buf = g_inner->alloc(bytes)))
        return ft_error("flag --fp8: no device memory for the FP8 copies of a linear's operands (%.1f MiB)",
                        bytes / 1048576.0);
    g_scratch.cap = bytes;
    return 0;
}

// the scratch as n consecutive slots of sizes[i] codes (each 256-byte aligned), then 3 stats
// floats per slot: its bytes; and, reserved, the slots' addresses and *stats
static size_t slots_bytes(const size_t *sizes, int n) {
    size_t b = 3 * sizeof(float) * (size_t)n;
    for (int i = 0; i < n; i++) b += round_up(sizes[i]);
    return b;
}
static int scratch_slots(const size_t *sizes, int n, unsigned char **slot, float **stats) {
    const size_t bytes = slots_bytes(sizes, n);
    if (bytes > g_scratch.used) g_scratch.used = bytes;
    TRY(scratch_reserve(bytes));
    unsigned char *p = g_scratch.buf;
    for (int i = 0; i < n; i++) slot[i] = p, p += round_up(sizes[i]);
    *stats = (float *)p;
    return 0;
}

// two FP8 operands of na and nb codes: *qa, *qb and *stats (6 floats: a's, then b's)
static size_t pair_bytes(size_t na, size_t nb) { return slots_bytes((const size_t[]){na, nb}, 2); }
static int scratch_pair(size_t na, size_t nb, unsigned char **qa, unsigned char **qb, float **stats) {
    unsigned char *slot[2];
    TRY(scratch_slots((const size_t[]){na, nb}, 2, slot, stats));
    *qa = slot[0], *qb = slot[1];
    return 0;
}

// 1 when an FP8 GEMM may write its output at p: 16-byte aligned (what the emulated cuBLASLt
// demands of C and D with FP8 operands, tests/cuda_emu/cuda_emu_host.cpp, to be safe on every
// GPU). The arena's buffers are 256-byte aligned and a unit's tensors sit at multiples of 16
// elements when their widths pass fp8_linear_shape_ok, so the model's outputs always are (the
// step-time estimate, src/backend_count.c, assumes so); a caller's odd pointer runs in bf16.
static int out_aligned(const void *p) { return (uintptr_t)p % 16 == 0; }

// out (N, OC) = inp (N, IC) @ weight (OC, IC)^T (+ residual): both operands quantised to E4M3,
// the product by the FP8 GEMM; a shape outside fp8_shape_ok (or an unaligned out) runs in
// bf16. amax: NULL, or max |inp| as its producer computed it (the activation's scale from it:
// no pass for it)
static int fp8_linear_fwd(void *out, const void *inp, const void *weight, const void *residual, int N, int IC, int OC,
                          const float *amax) {
    if (!fp8_linear_shape_ok(IC, OC) || !out_aligned(out))
        return g_inner->matmul_fwd(out, inp, weight, residual, N, IC, OC);
    unsigned char *qa, *qw;
    float *stats;
    TRY(scratch_pair((size_t)N * IC, (size_t)OC * IC, &qa, &qw, &stats));
    if (amax) TRY(g_inner->fp8_cast(qa, NULL, stats, amax, inp, N, IC, FP8_E4M3));
    else TRY(g_inner->fp8_quantize(qa, NULL, stats, inp, N, IC, FP8_E4M3));
    g_fuse.fused += amax != NULL;
    g_fuse.all++;
    TRY(g_inner->fp8_quantize(qw, NULL, stats + 3, weight, OC, IC, FP8_E4M3));
    if (residual && residual != out)
        TRY(g_inner->copy_d2d(out, residual, (size_t)N * OC * st_dtype_size(g_inner->dtype)));
    return g_inner->matmul_fp8(out, qa, FP8_E4M3, stats, qw, FP8_E4M3, stats + 3, N, OC, IC, residual != NULL,
                             g_inner->dtype);
}

// The backward's scratch slots (their sizes in codes; the count returned). With an FP8 dW
// (dw8): dout's codes (N, OC), their transpose (OC, N), and one slot for the weight's
// transposed codes (IC, OC) for dX, then (the dX GEMM queued before on the one stream, so done
// reading them) the input's transposed codes (IC, N) for dW; stats: dout's, the weight's, the
// input's. Without: dout's codes and the weight's transposed ones (stats: dout's, the weight's).
static int bwd_sizes(int N, int IC, int OC, int dw8, size_t sizes[3]) {
    const size_t nd = (size_t)N * OC, nw = (size_t)OC * IC, nx = (size_t)N * IC;
    sizes[0] = nd;
    if (!dw8) {
        sizes[1] = nw;
        return 2;
    }
    sizes[1] = nd;
    sizes[2] = nw > nx ? nw : nx;
    return 3;
}

static int fp8_matmul_fwd(void *out, const void *inp, const void *weight, const void *residual, int N, int IC, int OC) {
    return fp8_linear_fwd(out, inp, weight, residual, N, IC, OC, NULL);
}

// dinp (N, IC) = (+=) dout (N, OC) @ weight (OC, IC) in FP8: dout quantised to E5M2 (a
// gradient: range over precision), the weight to E4M3 in its transposed layout (IC, OC),
// which is what the FP8 GEMM's "a b^T" form takes. dweight (OC, IC) = (+=) dout^T (OC, N) @
// inp (N, IC) in FP8 too when fp8_linear_dw_ok (N a multiple of 16): a = dout's E5M2 codes
// transposed (the same quantisation's second layout), b = inp's E4M3 codes transposed (IC,
// N), into the gradient's dtype gdt (bf16 or fp32: the GEMM's output dtype); else the inner
// backend's bf16 GEMM (so too for an unaligned dweight). A shape outside fp8_linear_shape_ok
// (or an unaligned dinp) runs the inner backward whole.
static int fp8_matmul_bwd(void *dinp, void *dweight, st_dtype gdt, const void *dout, const void *inp,
                          const void *weight, int N, int IC, int OC, int accumulate_dinp, int accumulate_dw) {
    const int dw8 = dweight && fp8_linear_dw_ok(N, IC, OC) && out_aligned(dweight);
    if (!fp8_linear_shape_ok(IC, OC) || (dinp && !out_aligned(dinp)) || (!dinp && !dw8))
        return g_inner->matmul_bwd(dinp, dweight, gdt, dout, inp, weight, N, IC, OC, accumulate_dinp, accumulate_dw);
    size_t sizes[3];
    const int n = bwd_sizes(N, IC, OC, dw8, sizes);
    unsigned char *q[3];
    float *st;
    TRY(scratch_slots(sizes, n, q, &st));
    unsigned char *qd = q[0], *qdt = dw8 ? q[1] : NULL, *qw = q[n - 1];
    TRY(g_inner->fp8_quantize(dinp ? qd : NULL, qdt, st, dout, N, OC, FP8_E5M2));
    if (dinp) {
        TRY(g_inner->fp8_quantize(NULL, qw, st + 3, weight, OC, IC, FP8_E4M3));
        TRY(g_inner->matmul_fp8(dinp, qd, FP8_E5M2, st, qw, FP8_E4M3, st + 3, N, IC, OC, accumulate_dinp,
                                g_inner->dtype));
    }
    if (!dweight) return 0;
    if (!dw8) return g_inner->matmul_bwd(NULL, dweight, gdt, dout, inp, weight, N, IC, OC, 0, accumulate_dw);
    TRY(g_inner->fp8_quantize(NULL, qw, st + 6, inp, N, IC, FP8_E4M3));
    return g_inner->matmul_fp8(dweight, qdt, FP8_E5M2, st, qw, FP8_E4M3, st + 6, OC, IC, N, accumulate_dw, gdt);
}

// 1 when `be` runs FP8 GEMMs: it has the ops, and (the CUDA backend) its device has FP8 tensor cores
static int has_fp8(const backend *be) {
    if (!be->fp8_quantize || !be->matmul_fp8 || strcmp(be->name, "cuda") != 0) return 0;
#ifdef FT_HAVE_CUDA
    return backend_cuda_fp8_capable();
#else
    return 0;
#endif
}

// ----------------------------------------------------------------------------
// the fused amax: every op of the table watched (backend_ops.h), the producers and matmul_fwd
// remembering and using it

static backend g_next;   // the inner backend with the FP8 GEMMs: what the watching wrappers call

static void fuse_forget(void) { g_fuse.buf = NULL; }

#define FUSE_WATCH(op, params, args) \
    static int watch_##op params {   \
        fuse_forget();               \
        return g_next.op args;       \
    }
BACKEND_OPS_TIMED(FUSE_WATCH)
BACKEND_OPS_UNTIMED(FUSE_WATCH)

// the amax slot, taken from the inner backend once per wrapping (fp8_linear_reserve at setup,
// else at the first producer)
static int fuse_slot_ready(void) {
    if (g_fuse.slot) return 0;
    if (!(g_fuse.slot = g_inner->alloc(sizeof(float))))
        return ft_error("flag --fp8: no device memory for an activation's amax (4 bytes)");
    return 0;
}

// the producers: run with the slot as their amax, their output remembered (a caller's own
// amax, or fusion off: plain, watched)
static int fused_rmsnorm_fwd(void *o, float *r, float *am, const void *x, const void *w, int N, int C, float e) {
    if (am || g_fuse.off) return watch_rmsnorm_fwd(o, r, am, x, w, N, C, e);
    fuse_forget();
    TRY(fuse_slot_ready());
    TRY(g_next.rmsnorm_fwd(o, r, g_fuse.slot, x, w, N, C, e));
    g_fuse.buf = o, g_fuse.n = (size_t)N * C;
    return 0;
}
static int fused_swiglu_fwd(void *o, float *am, const void *g, const void *u, int N, int F, int ld) {
    if (am || g_fuse.off) return watch_swiglu_fwd(o, am, g, u, N, F, ld);
    fuse_forget();
    TRY(fuse_slot_ready());
    TRY(g_next.swiglu_fwd(o, g_fuse.slot, g, u, N, F, ld));
    g_fuse.buf = o, g_fuse.n = (size_t)N * F;
    return 0;
}

// 1 when the element ranges [a, a + na) and [b, b + nb) of the storage dtype overlap
static int overlaps(const void *a, size_t na, const void *b, size_t nb) {
    const uintptr_t e = st_dtype_size(g_inner->dtype), pa = (uintptr_t)a, pb = (uintptr_t)b;
    return pa < pb + nb * e && pb < pa + na * e;
}

// matmul_fwd on the remembered output, the whole of it: quantised from its producer's amax,
// and it stays remembered for the next linear on it (LoRA's factors, q|k|v's or gate's and
// up's separate GEMMs) unless this one wrote into it; any other input: forgotten
static int fused_matmul_fwd(void *o, const void *x, const void *w, const void *r, int N, int IC, int OC) {
    if (!g_fuse.buf || x != g_fuse.buf || (size_t)N * IC != g_fuse.n) return watch_matmul_fwd(o, x, w, r, N, IC, OC);
    const int rc = fp8_linear_fwd(o, x, w, r, N, IC, OC, g_fuse.slot);
    if (rc != 0 || overlaps(o, (size_t)N * OC, g_fuse.buf, g_fuse.n)) fuse_forget();
    return rc;
}

void fp8_linear_release(void) {
    if (g_inner && g_scratch.buf) g_inner->free(g_scratch.buf);
    if (g_inner && g_fuse.slot) g_inner->free(g_fuse.slot);
    memset(&g_scratch, 0, sizeof g_scratch);
    g_fuse.slot = NULL;
    fuse_forget();
}

int fp8_linear_backend(const backend *inner, const backend **out) {
    if (!has_fp8(inner))
        return ft_error("flag --fp8: %s has no FP8 tensor cores (FP8 GEMMs need --device cuda on compute capability "
                        "8.9+: Hopper, Ada)", backend_describe(inner));
    fp8_linear_release();   // (the previous wrapping's memory, from its inner backend, still open)
    g_inner = inner;
    g_next = *inner;
    g_next.matmul_fwd = fp8_matmul_fwd;
    g_next.matmul_bwd = fp8_matmul_bwd;
    g_table = *inner;
#define FUSE_SET(op, params, args) g_table.op = g_next.op ? watch_##op : NULL;
    BACKEND_OPS_TIMED(FUSE_SET)
    BACKEND_OPS_UNTIMED(FUSE_SET)
#undef FUSE_SET
    g_table.rmsnorm_fwd = fused_rmsnorm_fwd;
    g_table.swiglu_fwd = fused_swiglu_fwd;
    g_table.matmul_fwd = fused_matmul_fwd;
    g_fuse.off = ft_getenv("FT_TEST_FP8_UNFUSED") != NULL || !inner->fp8_cast;
    fuse_forget();
    g_fuse.fused = g_fuse.all = 0;
    *out = &g_table;
    return 0;
}

void fp8_linear_fused_counts(long *fused, long *all) {
    *fused = g_fuse.fused;
    *all = g_fuse.all;
}

const backend *fp8_linear_unwrap(const backend *be) { return be == &g_table && g_inner ? g_inner : be; }

size_t fp8_linear_scratch_bytes(void) { return g_scratch.cap + (g_fuse.slot ? FP8_LINEAR_SLOT_BYTES : 0); }
size_t fp8_linear_scratch_used(void) { return g_scratch.used + (g_fuse.slot ? FP8_LINEAR_SLOT_BYTES : 0); }

int fp8_linear_reserve(size_t bytes) {
    if (!g_inner) return ft_error("fp8_linear_reserve: no FP8 wrapper (fp8_linear_backend first)");
    TRY(scratch_reserve(bytes > FP8_LINEAR_SLOT_BYTES ? bytes - FP8_LINEAR_SLOT_BYTES : bytes));
    return g_fuse.off ? 0 : fuse_slot_ready();
}

size_t fp8_linear_call_bytes(int N, int IC, int OC, fp8_call pass) {
    if (!fp8_linear_shape_ok(IC, OC)) return 0;
    const size_t fwd = pair_bytes((size_t)N * IC, (size_t)OC * IC);
    if (pass == FP8_CALL_FWD) return fwd;
    size_t sizes[3];
    const int n = bwd_sizes(N, IC, OC, pass == FP8_CALL_BWD_DW && fp8_linear_dw_ok(N, IC, OC), sizes);
    const size_t bwd = slots_bytes(sizes, n);
    return bwd > fwd ? bwd : fwd;
}

// the larger of a and b
static size_t zmax(size_t a, size_t b) { return a > b ? a : b; }

size_t fp8_linear_model_bytes(const llama_config *c, const lora_config *lc, int N, int backward) {
    const int C = c->hidden_size, F = c->intermediate_size;
    const int qkv = (c->num_attention_heads + 2 * c->num_key_value_heads) * c->head_dim;
    const int lora = lc && lc->rank;
    const int mlp_fused = !(lora && (lc->targets & ((1u << LT_WGATE) | (1u << LT_WUP))));
    // the base linears' pass (LoRA: a frozen base, no dW), the adapters' factors' (trained)
    const fp8_call base = !backward ? FP8_CALL_FWD : lora ? FP8_CALL_BWD_DX : FP8_CALL_BWD_DW;
    const fp8_call factor = backward ? FP8_CALL_BWD_DW : FP8_CALL_FWD;
    size_t b = fp8_linear_call_bytes(N, C, qkv, base);
    b = zmax(b, fp8_linear_call_bytes(N, c->num_attention_heads * c->head_dim, C, base));
    b = zmax(b, fp8_linear_call_bytes(N, C, mlp_fused ? 2 * F : F, base));
    b = zmax(b, fp8_linear_call_bytes(N, F, C, base));
    for (int t = LT_WQ; lora && t <= LT_WDOWN; t++) {   // the adapters' two factors
        if (!(lc->targets & (1u << t))) continue;
        int in, out;
        lora_proj_dims(c, t, &in, &out);
        b = zmax(b, zmax(fp8_linear_call_bytes(N, in, lc->rank, factor), fp8_linear_call_bytes(N, lc->rank, out, factor)));
    }
    return b;
}
