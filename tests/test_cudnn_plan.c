// test_cudnn_plan.c: cuDNN accepts the attention graphs of src/attention_cudnn_graph.c, checked
// without a GPU. Each case builds the forward or backward graph of one shape with the engine's
// own builders (this file includes the source) and plans it with graph_plan for the device that
// tests/golden/cudnn/h100.json describes (a CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR: an H100 SXM,
// sm_90, 132 SMs; no handle, no GPU). The toolkit's stub libcuda.so.1 stands in for the driver:
// a graph cuDNN accepts gets engine configurations from heuristics mode A, NVRTC compiles the
// first one's kernels for sm_90, and its plan finalize stops only where the kernels would be
// loaded (CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER, cuLibraryLoadData). A wrong graph gets an
// error at an earlier finalize, no configuration, or a failed compilation. Not checked here:
// whether the numbers are right (the startup check on a GPU does, attn_cudnn_selfcheck). Mask
// direction or axis, a missing mask, or a stride that is wrong but still a valid layout all
// plan as well as the right graph; wrong dims or data types, a KT not transposed, stats or
// Dsum of the wrong shape do not (or, for a KT not transposed, crash inside cuDNN 9.19).
//
// Cases: one table, one row per shape and direction. usable 1: the operations and the
// operation graph finalize, the heuristic offers >= 1 configuration, and one plan gets as far
// as the driver (or finalizes: a cuDNN that needs no driver there); the workspace the chosen
// configuration states, plus the backward's in-memory intermediates, must fit the memory
// plan's reservation (attn_cudnn_workspace_bound; a plan past it falls back to native).
// Deterministic rows (--deterministic): the backward whose dQ = dS K goes straight to dq; its
// stated workspace must be at least the bf16 dP, B H T^2 x 2 (else cuDNN did not pick the
// dP-workspace kernel, which is what makes it deterministic) and within the reservation.
// usable 0: head dims cuDNN 9's fused attention engines refuse (a multiple of 8 is required;
// the backward also refuses D > 256, the forward has an engine for D 264): no plan may get
// that far. Printed per case: the configurations offered and, per one tried, its engine
// (CUDNN_ATTR_ENGINE_GLOBAL_INDEX), stated workspace and status. Then attn_engine_destroy of a
// plan whose work was queued: it waits through cuda_wait_stream (check_destroy_waits).
//
// Prerequisites: cuDNN 9.16+ whose sub-libraries load (cudnn_load, the engine's own
// check at open) and the stub $(CUDA_HOME)/lib64/stubs/libcuda.so (FT_CUDA_STUB_LIBCUDA from
// the Makefile; the environment variable of that name overrides it). The stub is loaded by
// path before cuDNN asks for libcuda.so.1, so cuDNN gets the stub (same soname) even where a
// real driver is installed. A missing prerequisite prints "skip: ..." (a failure under
// CI=true). Runtime: 0.3-0.5 s per usable case (NVRTC compiles one engine configuration),
// about 7 s in all on 2 cores.
#define _GNU_SOURCE   // RTLD_NOLOAD
#include <dlfcn.h>

#include "../src/attention_cudnn_graph.c"

#include "attention_cudnn.h"   // attn_cudnn_workspace_bound

#include "test.h"
#include "watchdog.h"

#ifndef FT_CUDA_STUB_LIBCUDA
#define FT_CUDA_STUB_LIBCUDA "/usr/local/cuda/lib64/stubs/libcuda.so"
#endif
#define DEVICEPROP_JSON "tests/golden/cudnn/h100.json"

typedef struct {
    const char *what;
    int bwd, B, T, H, KVH, D;
    int usable;   // 1: cuDNN must plan it; 0: it must not
    int det;      // the backward's deterministic graph (--deterministic)
} plan_case;

static const plan_case CASES[] = {
    {"startup check: GQA 4/2, odd T", 0, 2, 37, 4, 2, 64, 1, 0},
    {"startup check: GQA 4/2, odd T", 1, 2, 37, 4, 2, 64, 1, 0},
    {"T 1", 0, 1, 1, 4, 4, 64, 1, 0},
    {"T 1", 1, 1, 1, 4, 4, 64, 1, 0},
    {"MQA 4/1, D 16, T 13", 0, 2, 13, 4, 1, 16, 1, 0},
    {"MQA 4/1, D 16, T 13", 1, 2, 13, 4, 1, 16, 1, 0},
    {"T 257, D 32", 0, 2, 257, 4, 4, 32, 1, 0},
    {"T 257, D 32", 1, 2, 257, 4, 4, 32, 1, 0},
    {"bundled model: GQA 4/2, D 32, B 8, T 512", 0, 8, 512, 4, 2, 32, 1, 0},
    {"bundled model: GQA 4/2, D 32, B 8, T 512", 1, 8, 512, 4, 2, 32, 1, 0},
    {"7B: H 32, D 128, T 512", 0, 1, 512, 32, 32, 128, 1, 0},
    {"7B: H 32, D 128, T 512", 1, 1, 512, 32, 32, 128, 1, 0},
    {"7B: H 32, D 128, B 16, T 512", 0, 16, 512, 32, 32, 128, 1, 0},
    {"7B: H 32, D 128, B 16, T 512", 1, 16, 512, 32, 32, 128, 1, 0},
    {"GQA 32/8, D 128, T 4096", 0, 1, 4096, 32, 8, 128, 1, 0},
    {"GQA 32/8, D 128, T 4096", 1, 1, 4096, 32, 8, 128, 1, 0},
    {"D 256", 0, 2, 64, 4, 4, 256, 1, 0},
    {"D 256", 1, 2, 64, 4, 4, 256, 1, 0},
    {"D 36 (not a multiple of 8): refused", 0, 2, 16, 4, 4, 36, 0, 0},
    {"D 36 (not a multiple of 8): refused", 1, 2, 16, 4, 4, 36, 0, 0},
    {"D 264 (> 256): refused by the backward", 1, 2, 16, 4, 4, 264, 0, 0},
    {"deterministic: startup check", 1, 2, 37, 4, 2, 64, 1, 1},
    {"deterministic: T 1", 1, 1, 1, 4, 4, 64, 1, 1},
    {"deterministic: MQA 4/1, D 16, T 13", 1, 2, 13, 4, 1, 16, 1, 1},
    {"deterministic: 7B, T 512", 1, 1, 512, 32, 32, 128, 1, 1},
    {"deterministic: 7B, B 16, T 512", 1, 16, 512, 32, 32, 128, 1, 1},
    {"deterministic: GQA 32/8, D 128, T 4096", 1, 1, 4096, 32, 8, 128, 1, 1},
    {"deterministic: D 256", 1, 2, 64, 4, 4, 256, 1, 1},
};

// ----------------------------------------------------------------------------
// prerequisites

// A missing prerequisite: "skip: ..." (a failure under CI=true, as tests/lib.sh's skip_or_fail).
static void skip_or_fail(const char *why) {
    const char *ci = getenv("CI");
    if (ci && strcmp(ci, "true") == 0) EXPECT(0, "%s (a prerequisite; CI=true)", why);
    else printf("skip: %s\n", why);
}

// The stub driver loaded under its soname, cuDNN's sub-libraries loadable, cuDNN new enough.
// 1 when all hold; else 0 after skip_or_fail.
static int prerequisites(void) {
    char why[1024];
    const char *path = getenv("FT_CUDA_STUB_LIBCUDA") ? getenv("FT_CUDA_STUB_LIBCUDA") : FT_CUDA_STUB_LIBCUDA;
    void *stub = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!stub) {
        snprintf(why, sizeof why, "no stub driver to plan without a GPU: %s", dlerror());
        skip_or_fail(why);
        return 0;
    }
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (driver != stub) {
        snprintf(why, sizeof why, "libcuda.so.1 is not the stub %s after loading it", path);
        skip_or_fail(why);
        return 0;
    }
    if (cudnn_load() != 0) {
        snprintf(why, sizeof why, "%s", ft_error_message());
        ft_error_clear();
        skip_or_fail(why);
        return 0;
    }
    // cudnn_load said 0: both sub-libraries it loads must now be resident (by soname)
    static const char *const subs[] = {"libcudnn_graph", "libcudnn_engines_runtime_compiled"};
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) {
        char soname[64];
        snprintf(soname, sizeof soname, "%s.so.%d", subs[i], CUDNN_MAJOR);
        void *lib = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
        EXPECT(lib, "cudnn_load returned 0 but %s is not loaded", soname);
        if (lib) dlclose(lib);
    }
    const size_t v = cudnnGetVersion();
    if (v < ATTN_CUDNN_MIN_VERSION) {
        snprintf(why, sizeof why, "libcudnn %zu at run time; the graphs are written for %d or newer", v,
                 ATTN_CUDNN_MIN_VERSION);
        skip_or_fail(why);
        return 0;
    }
    printf("cuDNN %zu, stub driver %s\n", v, path);
    return 1;
}

// The H100's DEVICEPROP descriptor from DEVICEPROP_JSON, finalized; NULL after a failed EXPECT.
static cudnnBackendDescriptor_t deviceprop_load(void) {
    char json[4096];
    FILE *f = fopen(DEVICEPROP_JSON, "r");
    const size_t n = f ? fread(json, 1, sizeof json - 1, f) : 0;
    if (f) fclose(f);
    EXPECT(n > 0 && n < sizeof json - 1, "%s: missing, empty or over %zu bytes", DEVICEPROP_JSON, sizeof json - 2);
    if (n == 0 || n >= sizeof json - 1) return NULL;
    json[n] = 0;
    cudnnBackendDescriptor_t dp = NULL;
    cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &dp);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(dp, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, (int64_t)n + 1,
                                      json);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(dp);
    EXPECT(st == CUDNN_STATUS_SUCCESS, "DEVICEPROP descriptor from %s: %s (%s)", DEVICEPROP_JSON,
           cudnnGetErrorString(st), last_error());
    if (st == CUDNN_STATUS_SUCCESS) return dp;
    if (dp) cudnnBackendDestroyDescriptor(dp);
    return NULL;
}

// ----------------------------------------------------------------------------
// the cases

// cuDNN's last error on one line (its warnings come one a line)
static const char *last_error_line(void) {
    static char line[512];
    snprintf(line, sizeof line, "%s", last_error());
    for (char *p = line; *p; p++)
        if (*p == '\n') *p = p[1] ? '|' : 0;
    return line;
}

static const char *status_name(cudnnStatus_t st) {
    return st == CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER ? "reached the driver" : cudnnGetErrorString(st);
}

static void run_case(const plan_case *c, cudnnBackendDescriptor_t dp) {
    const attn_key key = {c->B, c->T, c->H, c->KVH, c->D, c->bwd, c->det};
    char name[160];
    snprintf(name, sizeof name, "%s B %d T %d H %d KVH %d D %d (%s)", c->bwd ? (c->det ? "bwd det" : "bwd") : "fwd",
             c->B, c->T, c->H, c->KVH, c->D, c->what);
    attn_graph *g = graph_new(&key);
    EXPECT(g != NULL, "%s: %s", name, ft_error_message());
    if (!g) return;
    const bool ops_ok = GB_OK(g);
    const cudnnStatus_t ops_st = g->st;
    const int ops_line = g->line;
    if (ops_ok) graph_plan(g, NULL, dp);
    const char *why = last_error_line();
    const bool planned = g->plan != NULL || g->st == CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER;

    printf("%s: %d configs", name, g->n_cfg);
    for (int i = 0; i < g->n_tried; i++) {
        printf("%s engine %lld", i ? ";" : ":", (long long)g->cfg_engine[i]);
        if (g->cfg_ws[i] >= 0) printf(" ws %lld", (long long)g->cfg_ws[i]);
        printf(" %s", status_name(g->cfg_st[i]));
    }
    if (g->plan) printf(" (plan workspace %zu)", g->engine_ws);
    if (!planned) printf(" [%s at line %d%s%s]", cudnnGetErrorString(g->st), g->line, why[0] ? ": " : "", why);
    printf("\n");

    if (c->usable) {
        EXPECT(ops_ok, "%s: an operation does not finalize: %s at line %d", name, cudnnGetErrorString(ops_st),
               ops_line);
        EXPECT(!ops_ok || g->n_cfg >= 1, "%s: the heuristic offers no engine configuration (%s at line %d%s%s)", name,
               cudnnGetErrorString(g->st), g->line, why[0] ? ": " : "", why);
        EXPECT(!ops_ok || g->n_cfg < 1 || planned, "%s: no configuration's plan reaches the driver (last: %s at line "
               "%d%s%s)", name, cudnnGetErrorString(g->st), g->line, why[0] ? ": " : "", why);
        if (planned) {
            const int i = g->n_tried - 1;
            const int64_t stated = g->cfg_ws[i] >= 0 ? g->cfg_ws[i] : 0;
            const size_t engine_ws = g->plan ? g->engine_ws : (size_t)(stated + 255) / 256 * 256;
            const size_t total = graph_workspace(&key, engine_ws);
            const size_t bound = attn_cudnn_workspace_bound(c->B, c->T, c->H, c->KVH, c->D, c->det);
            EXPECT(total <= bound, "%s: engine %lld's workspace %zu + intermediates = %zu bytes, over the %zu the "
                   "memory plan reserves", name, (long long)g->cfg_engine[i], engine_ws, total, bound);
            const size_t dp_bytes = (size_t)c->B * c->H * c->T * c->T * 2;
            EXPECT(!c->det || engine_ws >= dp_bytes, "%s: engine %lld's workspace %zu is smaller than the bf16 dP (%zu "
                   "bytes) the deterministic kernel keeps: not the dP-workspace kernel", name,
                   (long long)g->cfg_engine[i], engine_ws, dp_bytes);
        }
    } else {
        EXPECT(!planned, "%s: expected no usable engine, but engine %lld %s", name,
               (long long)(g->n_tried ? g->cfg_engine[g->n_tried - 1] : -1), status_name(g->st));
    }
    graph_free(g);
}

// ----------------------------------------------------------------------------
// destroying a plan whose work was queued

// attn_engine_destroy waits for the engine's stream through cuda_wait_stream
// (src/cuda_wait.c): polled under the watchdog when --collective_timeout is set
// (cudaStreamQuery in poll_stream), cudaStreamSynchronize otherwise. With the stub driver every CUDA call fails at once, which
// shows which wait it took: destroy must return -1 with that error and leave the graph alone
// (freed here afterwards). The poll's error is fatal (a sticky device error, src/watchdog.h):
// the watchdog's line, "... CUDA error: <reason> (<name>, from cudaStreamQuery); aborting"
// (no end callback here: the wait returns -1).
static void check_destroy_waits(void) {
    static const struct { double timeout; int polled; } WAITS[] = {{30, 1}, {0, 0}};
    const attn_key key = {1, 1, 1, 1, 8, 0, 0};
    for (size_t i = 0; i < sizeof WAITS / sizeof WAITS[0]; i++) {
        attn_graph *g = graph_new(&key);   // operations only: destroy does not look further
        if (!g) {
            EXPECT(0, "graph_new: %s", ft_error_message());
            return;
        }
        g->executed = 1;
        g_stream = cudaStreamPerThread;   // a valid handle even where a driver works
        watchdog_configure(WAITS[i].timeout, 0);
        const int rc = attn_engine_destroy(g);
        const char *msg = rc ? ft_error_message() : "";
        const bool sync = strstr(msg, "cudaStreamSynchronize") != NULL && strstr(msg, "src/cuda_wait.c");
        const bool polled = strstr(msg, "from cudaStreamQuery); aborting") != NULL;
        EXPECT(rc == -1 && sync == !WAITS[i].polled && polled == WAITS[i].polled,
               "destroy of an executed plan, --collective_timeout %g: rc %d, '%s' (wanted -1 from cuda_wait_stream's "
               "%s)", WAITS[i].timeout, rc, msg, WAITS[i].polled ? "poll" : "cudaStreamSynchronize");
        printf("destroy of an executed plan, --collective_timeout %g: %s\n", WAITS[i].timeout, rc ? msg : "waited");
        ft_error_clear();
        if (rc) graph_free(g);
    }
    watchdog_configure(0, 0);
    g_stream = NULL;
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);   // every case's line out before a crash inside cuDNN
    if (prerequisites()) {
        cudnnBackendDescriptor_t dp = deviceprop_load();
        for (size_t i = 0; dp && i < sizeof CASES / sizeof CASES[0]; i++) run_case(&CASES[i], dp);
        if (dp) cudnnBackendDestroyDescriptor(dp);
        check_destroy_waits();   // last: its CUDA calls start the runtime on the stub
    }
    TEST_SUMMARY("test_cudnn_plan");
}
