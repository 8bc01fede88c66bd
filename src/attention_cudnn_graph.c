// attention_cudnn_graph.c: the cuDNN attention engine (src/attn_engine.h) on cuDNN 9's backend C
// API (cudnn_graph.h), driven by the front of src/attention_cudnn.h. A GPU run checks it at backend startup (attn_cudnn_selfcheck against the native kernels, with
// a fall back to native on any failure) and in `make test-gpu` (tests/gpu/test_backend_gpu.c).
// Without a GPU, CI checks that cuDNN accepts the graphs: tests/test_cudnn_plan.c plans them
// (graph_plan with a DEVICEPROP descriptor of an H100) as far as loading the compiled kernels.
//
// The graphs are the flash-attention pattern that cuDNN's fused attention engines match (the
// same operation sequence the cuDNN frontend's sdpa nodes emit; written here from that
// sequence against the backend API), with every intermediate virtual unless noted:
//   forward:  S = Q KT; S *= scale; causal mask (GEN_INDEX row >= col, else -inf);
//             M = max_j S; E = exp(S - M); Z = sum_j E; lse = M + log Z (fp32, (B, H, T, 1));
//             P = E / Z (bf16); O = P V
//   backward: Dsum = sum_d dO * O (fp32 in memory, (B, H, T, 1)); S = scale Q KT - lse, causal
//             mask, P = exp(S); dV = PT dO; dP = dO VT; dS = scale P (dP - Dsum);
//             dK = dST Q; dQacc = dS K (fp32 in memory, (B, H, T, D)); dQ = dQacc;
//             deterministic (--deterministic, attn_key.det): dQ = dS K straight into dq, which
//             cuDNN runs with dP kept in its workspace (B H T^2 bf16) rather than summing dQ
//             in the fp32 accumulator across thread blocks (the cuDNN frontend's
//             "deterministic algorithm" on Hopper makes the same graph)
//   GQA: the matmuls broadcast KVH kv heads over H query heads; dK and dV are computed per query
//   head and summed over each group by a reduction.
// Tensors use cuDNN's (b, h, s, d) dims with our (B, T, H, D) memory through strides; KT and VT
// are K and V with the last two dims and strides swapped. The two in-memory fp32 intermediates
// live in the workspace the front hands over, after the engine's own (dQacc first: 256-byte
// aligned; Dsum after it).
#define _GNU_SOURCE   // dladdr
#include <cudnn_graph.h>
#include <dlfcn.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_engine.h"
#include "common.h"
#include "cuda_check.h"
#include "cuda_wait.h"
#include "wheel_lib.h"

// ----------------------------------------------------------------------------
// cuDNN, loaded at run time (cudnn_load), not linked: libcudnn.so.<major> from the library
// path, else the one the nvidia-cudnn-cu12/cu13 wheel put beside the Python on PATH
// (src/wheel_lib.h), so that a machine without cuDNN still starts (native attention after one
// warning) and one with only PyTorch's wheels finds it. The calls below go through D (the
// names are macros for its members from here on).
#define CUDNN_FUNCTIONS(X) X(cudnnGetVersion) X(cudnnCreate) X(cudnnDestroy) X(cudnnSetStream) \
    X(cudnnGetErrorString) X(cudnnGetLastErrorString) X(cudnnBackendCreateDescriptor) \
    X(cudnnBackendDestroyDescriptor) X(cudnnBackendSetAttribute) X(cudnnBackendGetAttribute) \
    X(cudnnBackendFinalize) X(cudnnBackendExecute)
static struct {
#define CUDNN_POINTER(f) __typeof__(f) *f;
    CUDNN_FUNCTIONS(CUDNN_POINTER)
#undef CUDNN_POINTER
} D;
static char cudnn_file[FT_PATH_MAX];   // the libcudnn.so.<major> loaded ("" until then)
static char cudnn_python[FT_PATH_MAX];   // the Python whose wheel it came from ("": none)
// libcudnn.so.<major>: the library path's, else a wheel's (full path). 0 / -1 (ft_error).
static int cudnn_open_shim(char *dir, size_t n) {
    char soname[32], wheel[FT_PATH_MAX], python[FT_PATH_MAX], rel[64];
    snprintf(soname, sizeof soname, "libcudnn.so.%d", CUDNN_MAJOR);
    void *lib = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    const char *file = soname;
    if (!lib) {
        const char *why = dlerror();
        snprintf(rel, sizeof rel, "nvidia/cudnn/lib/%s", soname);
        if (!wheel_lib_find(rel, getenv("PATH"), getenv("HOME"), wheel, sizeof wheel, python, sizeof python))
            return ft_error("cudnn attention: no %s on the library path (%s), and no Python on PATH has the "
                            "nvidia-cudnn-cu12/cu13 wheel", soname, why);
        if (!(lib = dlopen(wheel, RTLD_NOW | RTLD_LOCAL)))
            return ft_error("cudnn attention: %s (the wheel of %s) does not load: %s", wheel, python, dlerror());
        file = wheel;
        snprintf(cudnn_python, sizeof cudnn_python, "%s", python);   // (launch.c names it once, on rank 0)
    }
    typeof(D) f;
#define CUDNN_RESOLVE(name) if (!(f.name = (__typeof__(f.name))dlsym(lib, #name))) \
    return ft_error("cudnn attention: %s has no %s", file, #name);
    CUDNN_FUNCTIONS(CUDNN_RESOLVE)
#undef CUDNN_RESOLVE
    // the folder it was loaded from (dladdr of one of its functions: taking the address runs no
    // cuDNN code), where its sub-libraries are
    Dl_info info = {0};
    dir[0] = 0;
    if (dladdr((const void *)f.cudnnGetVersion, &info) && info.dli_fname && strrchr(info.dli_fname, '/')) {
        const size_t len = (size_t)(strrchr(info.dli_fname, '/') - info.dli_fname);
        if (len < n) {
            memcpy(dir, info.dli_fname, len);
            dir[len] = 0;
        }
    }
    snprintf(cudnn_file, sizeof cudnn_file, "%s", info.dli_fname && dir[0] ? info.dli_fname : file);
    D = f;
    return 0;
}

// cuDNN 9's libcudnn.so.<major> is a shim: its first call loads libcudnn_graph.so.<major> and,
// for the runtime-compiled engines these graphs use, libcudnn_engines_runtime_compiled.so.<major>
// by name (searched in LD_LIBRARY_PATH, its own folder through its RUNPATH $ORIGIN, the loader
// cache), and when one is missing it ABORTS the process ("Invalid handle. Cannot load symbol
// cudnnGetVersion"; e.g. a links folder that holds only libcudnn.so*, as built from a pip
// wheel). cudnn_load opens the shim (cudnn_open_shim), then loads each sub-library first, from
// the shim's folder or else by name, so that a missing one is an error and the backend falls
// back to native attention. What it loads stays loaded: the shim's own load of the same soname
// then gets that library. Loads once; 0, or -1 with ft_error naming the library and the
// loader's reason (a failure is kept: later calls repeat its message without trying again,
// so the wheel search runs at most once per process).
static int cudnn_load_once(void);
static int cudnn_load(void) {
    static int state;   // 0 not tried, 1 loaded, -1 failed (message in why)
    static char why[512];
    if (state == 1) return 0;
    if (state == -1) return ft_error("%s", why);
    state = -1;
    if (cudnn_load_once() != 0) {
        snprintf(why, sizeof why, "%s", ft_error_message());
        return -1;
    }
    state = 1;
    return 0;
}

static int cudnn_load_once(void) {
    static const char *const names[] = {"libcudnn_graph", "libcudnn_engines_runtime_compiled"};
    char dir[FT_PATH_MAX];
    TRY(cudnn_open_shim(dir, sizeof dir));
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char soname[64], path[FT_PATH_MAX + 64];
        snprintf(soname, sizeof soname, "%s.so.%d", names[i], CUDNN_MAJOR);
        void *lib = NULL;
        if (dir[0]) {
            snprintf(path, sizeof path, "%s/%s", dir, soname);
            lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        }
        if (!lib) lib = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
        if (!lib)
            return ft_error("cudnn attention: cuDNN's %s cannot be loaded (%s needs it beside it or on the library "
                            "path): %s", soname, cudnn_file, dlerror());
    }
    return 0;
}

// from here on the cuDNN names are D's members
#define cudnnGetVersion D.cudnnGetVersion
#define cudnnCreate D.cudnnCreate
#define cudnnDestroy D.cudnnDestroy
#define cudnnSetStream D.cudnnSetStream
#define cudnnGetErrorString D.cudnnGetErrorString
#define cudnnGetLastErrorString D.cudnnGetLastErrorString
#define cudnnBackendCreateDescriptor D.cudnnBackendCreateDescriptor
#define cudnnBackendDestroyDescriptor D.cudnnBackendDestroyDescriptor
#define cudnnBackendSetAttribute D.cudnnBackendSetAttribute
#define cudnnBackendGetAttribute D.cudnnBackendGetAttribute
#define cudnnBackendFinalize D.cudnnBackendFinalize
#define cudnnBackendExecute D.cudnnBackendExecute

// ----------------------------------------------------------------------------
// the builder: descriptors created for one graph, the first failure recorded

#define MAX_DESC 192   // the backward graph with 8 engine configurations needs about 110
#define MAX_OPS 48
#define MAX_CFG 8      // engine configurations asked of the heuristic

enum {
    U_Q = 1, U_KT, U_VT, U_O, U_STATS, U_DO, U_DQ, U_DK, U_DV,   // device tensors
    U_SCALE, U_NEGINF, U_ONE,                                    // host scalars (by value)
    U_DSUM, U_DQACC,                                             // fp32 intermediates in the workspace
    U_VIRTUAL = 100                                              // virtual tensors from here on
};

struct attn_graph {
    attn_key key;
    cudnnBackendDescriptor_t desc[MAX_DESC];   // every descriptor, destroyed together
    int n_desc;
    cudnnBackendDescriptor_t ops[MAX_OPS];
    int n_ops;
    cudnnBackendDescriptor_t plan;
    size_t engine_ws;                          // the plan's own workspace (before the intermediates)
    int64_t next_uid;
    float scale, neginf, one;
    cudnnStatus_t st;                          // first failure
    int line;                                  // its source line
    int executed;                              // work of this plan was queued on the stream
    // what planning saw (tests/test_cudnn_plan.c reports it): the heuristic's configurations,
    // and for each one tried in order, its engine (CUDNN_ATTR_ENGINE_GLOBAL_INDEX), the
    // workspace the configuration states (CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE; -1: unknown)
    // and its plan's finalize status
    int n_cfg, n_tried;
    int64_t cfg_engine[MAX_CFG], cfg_ws[MAX_CFG];
    cudnnStatus_t cfg_st[MAX_CFG];
};

static cudnnHandle_t g_handle;
static cudaStream_t g_stream;

// cuDNN's own explanation of the last failure ("" when it has none), for error messages
static const char *last_error(void) {
    static char msg[512];
    msg[0] = 0;
    cudnnGetLastErrorString(msg, sizeof msg);
    return msg;
}

#define GB_OK(g) ((g)->st == CUDNN_STATUS_SUCCESS)
// record the first failing status (and where) of a builder call
#define GB(g, call) do { if (GB_OK(g)) { cudnnStatus_t s_ = (call); if (s_ != CUDNN_STATUS_SUCCESS) { \
    (g)->st = s_; (g)->line = __LINE__; } } } while (0)

static cudnnBackendDescriptor_t gb_new(attn_graph *g, cudnnBackendDescriptorType_t type) {
    cudnnBackendDescriptor_t d = NULL;
    if (!GB_OK(g)) return NULL;
    if (g->n_desc == MAX_DESC) { g->st = CUDNN_STATUS_INTERNAL_ERROR; g->line = __LINE__; return NULL; }
    GB(g, cudnnBackendCreateDescriptor(type, &d));
    if (d) g->desc[g->n_desc++] = d;
    return d;
}

static void gb_set(attn_graph *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                   cudnnBackendAttributeType_t type, int64_t count, const void *value) {
    if (d) GB(g, cudnnBackendSetAttribute(d, name, type, count, value));
}

// A tensor: dims and strides (4-d), its data type; uid 0 = a new virtual tensor.
static cudnnBackendDescriptor_t gb_tensor(attn_graph *g, int64_t uid, cudnnDataType_t dt, const int64_t dims[4],
                                          const int64_t strides[4], int by_value) {
    cudnnBackendDescriptor_t t = gb_new(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const bool virt = uid == 0, byval = by_value != 0;
    const int64_t id = virt ? g->next_uid++ : uid, align = 16;
    gb_set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    gb_set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
    gb_set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides);
    gb_set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id);
    gb_set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    gb_set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
    if (byval) gb_set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &byval);
    if (t) GB(g, cudnnBackendFinalize(t));
    return t;
}

static void gb_op(attn_graph *g, cudnnBackendDescriptor_t op) {
    if (op) GB(g, cudnnBackendFinalize(op));
    if (GB_OK(g) && g->n_ops == MAX_OPS) { g->st = CUDNN_STATUS_INTERNAL_ERROR; g->line = __LINE__; }
    if (GB_OK(g)) g->ops[g->n_ops++] = op;
}

// y = mode(x [, b [, t]]); a new virtual y of (dims, strides, dt) unless `y` is given
static cudnnBackendDescriptor_t gb_pw(attn_graph *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec,
                                      cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                                      cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, int64_t axis) {
    cudnnBackendDescriptor_t pw = gb_new(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    gb_set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    gb_set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) gb_set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    if (pw) GB(g, cudnnBackendFinalize(pw));
    cudnnBackendDescriptor_t op = gb_new(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
    gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    if (b) gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    if (t) gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
    gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    gb_op(g, op);
    return y;
}

static cudnnBackendDescriptor_t gb_matmul(attn_graph *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                                          cudnnBackendDescriptor_t c) {
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t mm = gb_new(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    gb_set(g, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    if (mm) GB(g, cudnnBackendFinalize(mm));
    cudnnBackendDescriptor_t op = gb_new(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm);
    gb_op(g, op);
    return c;
}

static cudnnBackendDescriptor_t gb_reduce(attn_graph *g, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x,
                                          cudnnBackendDescriptor_t y) {
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t rd = gb_new(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    gb_set(g, rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    gb_set(g, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    if (rd) GB(g, cudnnBackendFinalize(rd));
    cudnnBackendDescriptor_t op = gb_new(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    gb_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    gb_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    gb_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd);
    gb_op(g, op);
    return y;
}

static cudnnBackendDescriptor_t gb_reshape(attn_graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = gb_new(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    gb_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    gb_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    gb_op(g, op);
    return y;
}

// ----------------------------------------------------------------------------
// shapes: cuDNN (b, h, s, d) dims over our (B, T, H, D) / (B, T, KVH, D) memory

typedef struct {
    int64_t q[4], qs[4];         // Q, O, dO, dQ: (B, H, T, D)
    int64_t kv[4], kvs[4];       // K, V, dK, dV: (B, KVH, T, D)
    int64_t kt[4], kts[4];       // KT, VT: (B, KVH, D, T)
    int64_t full[4], fulls[4];   // per-query-head dK / dV before the group sum: (B, H, T, D) packed
    int64_t st[4], sts[4];       // scores: (B, H, T, T) packed
    int64_t stt[4], stts[4];     // transposed scores view: (B, H, T(kv), T(q))
    int64_t row[4], rows[4];     // per row: lse, Dsum (B, H, T, 1)
    int64_t one[4];              // scalars: (1, 1, 1, 1)
} attn_shapes;

static void shapes_init(attn_shapes *s, const attn_key *k) {
    const int64_t B = k->B, T = k->T, H = k->H, G = k->KVH, D = k->D;
    const int64_t q[4] = {B, H, T, D}, qs[4] = {T * H * D, D, H * D, 1};
    const int64_t kv[4] = {B, G, T, D}, kvs[4] = {T * G * D, D, G * D, 1};
    const int64_t kt[4] = {B, G, D, T}, kts[4] = {T * G * D, D, 1, G * D};
    const int64_t full[4] = {B, H, T, D}, fulls[4] = {H * T * D, T * D, D, 1};
    const int64_t st[4] = {B, H, T, T}, sts[4] = {H * T * T, T * T, T, 1}, stts[4] = {H * T * T, T * T, 1, T};
    const int64_t row[4] = {B, H, T, 1}, rows[4] = {H * T, T, 1, 1}, one[4] = {1, 1, 1, 1};
    memcpy(s->q, q, sizeof q); memcpy(s->qs, qs, sizeof qs);
    memcpy(s->kv, kv, sizeof kv); memcpy(s->kvs, kvs, sizeof kvs);
    memcpy(s->kt, kt, sizeof kt); memcpy(s->kts, kts, sizeof kts);
    memcpy(s->full, full, sizeof full); memcpy(s->fulls, fulls, sizeof fulls);
    memcpy(s->st, st, sizeof st); memcpy(s->sts, sts, sizeof sts);
    memcpy(s->stt, st, sizeof st); memcpy(s->stts, stts, sizeof stts);
    memcpy(s->row, row, sizeof row); memcpy(s->rows, rows, sizeof rows);
    memcpy(s->one, one, sizeof one);
}

#define F32 CUDNN_DATA_FLOAT
#define BF16 CUDNN_DATA_BFLOAT16

// a new virtual fp32 scores tensor
static cudnnBackendDescriptor_t v_scores(attn_graph *g, const attn_shapes *s, cudnnDataType_t dt) {
    return gb_tensor(g, 0, dt, s->st, s->sts, 0);
}

// x with every score of a key after its query replaced by -inf (top-left causal mask)
static cudnnBackendDescriptor_t gb_causal(attn_graph *g, const attn_shapes *s, cudnnBackendDescriptor_t x,
                                          cudnnBackendDescriptor_t neginf) {
    cudnnBackendDescriptor_t row = gb_pw(g, CUDNN_POINTWISE_GEN_INDEX, F32, x, NULL, NULL,
                                         v_scores(g, s, CUDNN_DATA_INT32), 2);
    cudnnBackendDescriptor_t col = gb_pw(g, CUDNN_POINTWISE_GEN_INDEX, F32, x, NULL, NULL,
                                         v_scores(g, s, CUDNN_DATA_INT32), 3);
    cudnnBackendDescriptor_t keep = gb_pw(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, NULL,
                                          v_scores(g, s, CUDNN_DATA_BOOLEAN), -1);
    return gb_pw(g, CUDNN_POINTWISE_BINARY_SELECT, F32, x, neginf, keep, v_scores(g, s, F32), -1);
}

// S = scale Q KT (fp32, virtual)
static cudnnBackendDescriptor_t gb_scores(attn_graph *g, const attn_shapes *s, cudnnBackendDescriptor_t q,
                                          cudnnBackendDescriptor_t kt, cudnnBackendDescriptor_t scale) {
    cudnnBackendDescriptor_t raw = gb_matmul(g, q, kt, v_scores(g, s, F32));
    return gb_pw(g, CUDNN_POINTWISE_MUL, F32, raw, scale, NULL, v_scores(g, s, F32), -1);
}

static void graph_fwd_ops(attn_graph *g, const attn_shapes *s) {
    cudnnBackendDescriptor_t q = gb_tensor(g, U_Q, BF16, s->q, s->qs, 0);
    cudnnBackendDescriptor_t kt = gb_tensor(g, U_KT, BF16, s->kt, s->kts, 0);
    cudnnBackendDescriptor_t v = gb_tensor(g, U_VT, BF16, s->kv, s->kvs, 0);   // V itself (the forward's uid for V)
    cudnnBackendDescriptor_t o = gb_tensor(g, U_O, BF16, s->q, s->qs, 0);
    cudnnBackendDescriptor_t lse = gb_tensor(g, U_STATS, F32, s->row, s->rows, 0);
    cudnnBackendDescriptor_t scale = gb_tensor(g, U_SCALE, F32, s->one, s->one, 1);
    cudnnBackendDescriptor_t neginf = gb_tensor(g, U_NEGINF, F32, s->one, s->one, 1);

    cudnnBackendDescriptor_t sc = gb_causal(g, s, gb_scores(g, s, q, kt, scale), neginf);
    cudnnBackendDescriptor_t mx = gb_reduce(g, CUDNN_REDUCE_TENSOR_MAX, sc, gb_tensor(g, 0, F32, s->row, s->rows, 0));
    cudnnBackendDescriptor_t sub = gb_pw(g, CUDNN_POINTWISE_SUB, F32, sc, mx, NULL, v_scores(g, s, F32), -1);
    cudnnBackendDescriptor_t e = gb_pw(g, CUDNN_POINTWISE_EXP, F32, sub, NULL, NULL, v_scores(g, s, F32), -1);
    cudnnBackendDescriptor_t z = gb_reduce(g, CUDNN_REDUCE_TENSOR_ADD, e, gb_tensor(g, 0, F32, s->row, s->rows, 0));
    cudnnBackendDescriptor_t lz = gb_pw(g, CUDNN_POINTWISE_LOG, F32, z, NULL, NULL,
                                        gb_tensor(g, 0, F32, s->row, s->rows, 0), -1);
    gb_pw(g, CUDNN_POINTWISE_ADD, F32, mx, lz, NULL, lse, -1);
    cudnnBackendDescriptor_t p = gb_pw(g, CUDNN_POINTWISE_DIV, F32, e, z, NULL, v_scores(g, s, BF16), -1);
    gb_matmul(g, p, v, o);
}

// dX (B, KVH, T, D) = a @ b per query head, summed over each head group when KVH < H
static void gb_kv_grad(attn_graph *g, const attn_shapes *s, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                       cudnnBackendDescriptor_t dx) {
    if (g->key.KVH == g->key.H) {
        gb_matmul(g, a, b, dx);
        return;
    }
    cudnnBackendDescriptor_t full = gb_matmul(g, a, b, gb_tensor(g, 0, BF16, s->full, s->fulls, 0));
    gb_reduce(g, CUDNN_REDUCE_TENSOR_ADD, full, dx);
}

static void graph_bwd_ops(attn_graph *g, const attn_shapes *s) {
    cudnnBackendDescriptor_t q = gb_tensor(g, U_Q, BF16, s->q, s->qs, 0);
    cudnnBackendDescriptor_t kt = gb_tensor(g, U_KT, BF16, s->kt, s->kts, 0);
    cudnnBackendDescriptor_t vt = gb_tensor(g, U_VT, BF16, s->kt, s->kts, 0);
    cudnnBackendDescriptor_t o = gb_tensor(g, U_O, BF16, s->q, s->qs, 0);
    cudnnBackendDescriptor_t lse = gb_tensor(g, U_STATS, F32, s->row, s->rows, 0);
    cudnnBackendDescriptor_t dout = gb_tensor(g, U_DO, BF16, s->q, s->qs, 0);
    cudnnBackendDescriptor_t scale = gb_tensor(g, U_SCALE, F32, s->one, s->one, 1);
    cudnnBackendDescriptor_t neginf = gb_tensor(g, U_NEGINF, F32, s->one, s->one, 1);
    cudnnBackendDescriptor_t one = gb_tensor(g, U_ONE, F32, s->one, s->one, 1);

    // Dsum = sum_d dO * O, kept in memory
    cudnnBackendDescriptor_t dod = gb_pw(g, CUDNN_POINTWISE_MUL, F32, dout, o, NULL,
                                         gb_tensor(g, 0, F32, s->q, s->qs, 0), -1);
    cudnnBackendDescriptor_t red = gb_reduce(g, CUDNN_REDUCE_TENSOR_ADD, dod, gb_tensor(g, 0, F32, s->row, s->rows, 0));
    cudnnBackendDescriptor_t dsum = gb_pw(g, CUDNN_POINTWISE_MUL, F32, red, one, NULL,
                                          gb_tensor(g, U_DSUM, F32, s->row, s->rows, 0), -1);
    // P = exp(mask(scale Q KT - lse)); dV = PT dO
    cudnnBackendDescriptor_t sc = gb_pw(g, CUDNN_POINTWISE_SUB, F32, gb_scores(g, s, q, kt, scale), lse, NULL,
                                        v_scores(g, s, F32), -1);
    cudnnBackendDescriptor_t p = gb_pw(g, CUDNN_POINTWISE_EXP, F32, gb_causal(g, s, sc, neginf), NULL, NULL,
                                       v_scores(g, s, F32), -1);
    cudnnBackendDescriptor_t pt = gb_reshape(g, p, gb_tensor(g, 0, BF16, s->stt, s->stts, 0));
    gb_kv_grad(g, s, pt, dout, gb_tensor(g, U_DV, BF16, s->kv, s->kvs, 0));
    // dS = scale P (dO VT - Dsum); dK = dST Q
    cudnnBackendDescriptor_t dp = gb_matmul(g, dout, vt, v_scores(g, s, F32));
    cudnnBackendDescriptor_t d1 = gb_pw(g, CUDNN_POINTWISE_SUB, F32, dp, dsum, NULL, v_scores(g, s, F32), -1);
    cudnnBackendDescriptor_t d2 = gb_pw(g, CUDNN_POINTWISE_MUL, F32, d1, p, NULL, v_scores(g, s, F32), -1);
    cudnnBackendDescriptor_t ds = gb_pw(g, CUDNN_POINTWISE_MUL, F32, d2, scale, NULL, v_scores(g, s, F32), -1);
    cudnnBackendDescriptor_t dst = gb_reshape(g, ds, gb_tensor(g, 0, BF16, s->stt, s->stts, 0));
    gb_kv_grad(g, s, dst, q, gb_tensor(g, U_DK, BF16, s->kv, s->kvs, 0));
    // dQacc = dS K (fp32 in memory); dQ = dQacc. Deterministic: dQ = dS K
    cudnnBackendDescriptor_t k = gb_reshape(g, kt, gb_tensor(g, 0, BF16, s->kv, s->kvs, 0));
    if (g->key.det) {
        gb_matmul(g, ds, k, gb_tensor(g, U_DQ, BF16, s->q, s->qs, 0));
        return;
    }
    cudnnBackendDescriptor_t acc = gb_matmul(g, ds, k, gb_tensor(g, U_DQACC, F32, s->full, s->fulls, 0));
    gb_pw(g, CUDNN_POINTWISE_IDENTITY, F32, acc, NULL, NULL, gb_tensor(g, U_DQ, BF16, s->q, s->qs, 0), -1);
}

// ----------------------------------------------------------------------------
// engine choice: the heuristic's configurations in order, the first that finalizes

// The engine and stated workspace of configuration i, recorded in g (-1 when cuDNN does not
// say). Queries only: a failure here is not the graph's.
static void note_config(attn_graph *g, int i, cudnnBackendDescriptor_t cfg) {
    int64_t got = 0;
    g->cfg_engine[i] = g->cfg_ws[i] = -1;
    cudnnBackendDescriptor_t eng = NULL;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) == CUDNN_STATUS_SUCCESS) {
        if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got, &eng) ==
            CUDNN_STATUS_SUCCESS)
            (void)cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &got,
                                           &g->cfg_engine[i]);
        cudnnBackendDestroyDescriptor(eng);
    }
    (void)cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got, &g->cfg_ws[i]);
}

// Plan g's operations: operation graph, heuristics mode A, then the first configuration whose
// execution plan finalizes (g->plan, g->engine_ws). Exactly one of:
//   handle      the open device (the engine's own path: g_handle);
//   deviceprop  a finalized CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, no GPU and no handle
//               (tests/test_cudnn_plan.c). Without a driver no plan can finalize: it stops at
//               the first configuration whose finalize got as far as loading its kernels
//               (CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER), which is then g->st, no plan.
// On failure g->st / g->line record the first failing call (the last configuration's status
// when none finalized; CUDNN_STATUS_NOT_SUPPORTED when the heuristic offered none).
static void graph_plan(attn_graph *g, cudnnHandle_t handle, cudnnBackendDescriptor_t deviceprop) {
    cudnnBackendDescriptor_t og = gb_new(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    if (handle) gb_set(g, og, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    gb_set(g, og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->n_ops, g->ops);
    if (og) GB(g, cudnnBackendFinalize(og));
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    cudnnBackendDescriptor_t heur = gb_new(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    gb_set(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &og);
    gb_set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (deviceprop) gb_set(g, heur, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &deviceprop);
    if (heur) GB(g, cudnnBackendFinalize(heur));
    cudnnBackendDescriptor_t cfg[MAX_CFG];
    int64_t n_cfg = 0;
    for (int i = 0; i < MAX_CFG; i++) cfg[i] = gb_new(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    if (heur) GB(g, cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, MAX_CFG,
                                             &n_cfg, cfg));
    if (GB_OK(g)) g->n_cfg = (int)n_cfg;
    if (GB_OK(g) && n_cfg == 0) { g->st = CUDNN_STATUS_NOT_SUPPORTED; g->line = __LINE__; }
    for (int64_t i = 0; i < n_cfg && GB_OK(g); i++) {
        note_config(g, (int)i, cfg[i]);   // before the finalize: its failure stays cuDNN's last error
        cudnnBackendDescriptor_t plan = gb_new(g, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        if (handle) gb_set(g, plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
        else gb_set(g, plan, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &deviceprop);
        gb_set(g, plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[i]);
        const cudnnStatus_t st = GB_OK(g) && plan ? cudnnBackendFinalize(plan) : g->st;
        g->cfg_st[i] = st;
        g->n_tried = (int)i + 1;
        if (st == CUDNN_STATUS_SUCCESS) { g->plan = plan; break; }
        const bool driver = st == CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER;
        if (i == n_cfg - 1 || (deviceprop && driver)) { g->st = st; g->line = __LINE__; }   // the last reason
    }
    int64_t ws = 0, got = 0;
    if (g->plan) GB(g, cudnnBackendGetAttribute(g->plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                                &got, &ws));
    g->engine_ws = (size_t)(ws + 255) / 256 * 256;
}

// A new graph of `key` with its operations built (not planned; g->st says whether they all
// finalized), or NULL with ft_error when out of memory.
static attn_graph *graph_new(const attn_key *key) {
    attn_graph *g = ft_calloc(1, sizeof *g, "cudnn attention graph");
    if (!g) return NULL;
    g->key = *key;
    g->next_uid = U_VIRTUAL;
    g->scale = 1.0f / sqrtf((float)key->D);
    g->neginf = -INFINITY;
    g->one = 1.0f;
    attn_shapes s;
    shapes_init(&s, key);
    if (key->bwd) graph_bwd_ops(g, &s);
    else graph_fwd_ops(g, &s);
    return g;
}

// Every descriptor of g, then g (no waiting: see attn_engine_destroy).
static void graph_free(attn_graph *g) {
    for (int i = g->n_desc - 1; i >= 0; i--) cudnnBackendDestroyDescriptor(g->desc[i]);
    free(g);
}

// ----------------------------------------------------------------------------
// the engine interface

const char *attn_engine_library(void) { return cudnn_file[0] ? cudnn_file : "not loaded"; }

const char *attn_engine_wheel_python(void) { return cudnn_python[0] ? cudnn_python : NULL; }

int attn_engine_version(size_t *version) {
    TRY(cudnn_load());   // before any cuDNN call
    *version = cudnnGetVersion();
    return 0;
}

int attn_engine_open(void *stream) {
    TRY(cudnn_load());   // before any cuDNN call
    CHECK_CUDNN(cudnnCreate(&g_handle));
    CHECK_CUDNN(cudnnSetStream(g_handle, (cudaStream_t)stream));
    g_stream = (cudaStream_t)stream;
    return 0;
}

void attn_engine_close(void) {
    if (g_handle) cudnnDestroy(g_handle);
    g_handle = NULL;
    g_stream = NULL;
}

int attn_engine_destroy(attn_graph *g) {
    if (!g) return 0;
    // a plan of a runtime-compiled engine may own its kernels: let its queued work finish
    // first (eviction from the plan cache is rare; nothing documents that it may be skipped),
    // polled under --collective_timeout like every host wait (the stream may wait on NCCL)
    if (g->executed && g_stream)
        TRY(cuda_wait_stream(g_stream, "evicting a cached cudnn attention plan", "compute stream", 0));
    graph_free(g);
    return 0;
}

// the fp32 intermediates after the engine's workspace: dQacc (B, H, T, D; not in the
// deterministic graph), then Dsum (B, H, T)
static size_t rows_of(const attn_key *k) { return (size_t)k->B * (size_t)k->H * (size_t)k->T; }

// A graph's whole workspace: the engine's own (rounded, engine_ws), then for the backward the
// fp32 dQacc (B, H, T, D; deterministic: none) and Dsum (B, H, T)
static size_t graph_workspace(const attn_key *k, size_t engine_ws) {
    return engine_ws + (k->bwd ? rows_of(k) * ((size_t)(k->det ? 0 : k->D) + 1) * sizeof(float) : 0);
}

int attn_engine_build(const attn_key *key, attn_graph **out, size_t *workspace) {
    *out = NULL;
    if (!g_handle) return ft_error("cudnn attention: engine not open");
    attn_graph *g = graph_new(key);
    if (!g) return -1;
    graph_plan(g, g_handle, NULL);
    if (!GB_OK(g)) {
        const cudnnStatus_t st = g->st;
        const int line = g->line;
        const char *why = last_error();   // before the destroy calls can replace it
        graph_free(g);
        return ft_error("cudnn attention: no %s plan for B %d T %d H %d KVH %d D %d (%s at %s:%d%s%s)",
                        key->bwd ? "backward" : "forward", key->B, key->T, key->H, key->KVH, key->D,
                        cudnnGetErrorString(st), __FILE__, line, why[0] ? ": " : "", why);
    }
    *workspace = graph_workspace(key, g->engine_ws);
    *out = g;
    return 0;
}

static int execute(attn_graph *g, int n, const int64_t *uids, void **ptrs, void *workspace) {
    cudnnBackendDescriptor_t vp = NULL;
    CHECK_CUDNN(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp));
    cudnnStatus_t st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(vp);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendExecute(g_handle, g->plan, vp);
    cudnnBackendDestroyDescriptor(vp);
    g->executed = 1;
    if (st != CUDNN_STATUS_SUCCESS)
        return ft_error("cudnn attention: executing the %s plan failed: %s (%s)", g->key.bwd ? "backward" : "forward",
                        cudnnGetErrorString(st), last_error());
    return 0;
}

int attn_engine_fwd(attn_graph *g, void *out, float *lse, const void *q, const void *k, const void *v,
                    void *workspace) {
    const int64_t uids[] = {U_Q, U_KT, U_VT, U_O, U_STATS, U_SCALE, U_NEGINF};
    void *ptrs[] = {(void *)q, (void *)k, (void *)v, out, lse, &g->scale, &g->neginf};
    return execute(g, 7, uids, ptrs, workspace);
}

int attn_engine_bwd(attn_graph *g, void *dq, void *dk, void *dv, const void *dout, const void *out, const float *lse,
                    const void *q, const void *k, const void *v, void *workspace) {
    char *ws = workspace;
    float *dqacc = (float *)(ws + g->engine_ws), *dsum = dqacc + rows_of(&g->key) * (size_t)(g->key.det ? 0 : g->key.D);
    const int64_t uids[] = {U_Q, U_KT, U_VT, U_O, U_STATS, U_DO, U_DQ, U_DK, U_DV, U_SCALE, U_NEGINF, U_ONE, U_DSUM,
                            U_DQACC};
    void *ptrs[] = {(void *)q, (void *)k, (void *)v, (void *)out, (void *)lse, (void *)dout, dq, dk, dv, &g->scale,
                    &g->neginf, &g->one, dsum, dqacc};
    return execute(g, g->key.det ? 13 : 14, uids, ptrs, g->engine_ws ? workspace : NULL);   // (det: no dQacc)
}
