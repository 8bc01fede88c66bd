// profile.c: the --profile wrappers (see profile.h).
#include "profile.h"

#include <string.h>
#include <time.h>

#include "backend_ops.h"

// ----------------------------------------------------------------------------
// counters

// every timed op of struct backend, in table order (backend_ops.h; alloc, free, synchronize
// are not timed)
#define PROF_OPS(X) BACKEND_OPS_TIMED(X)

#define PROF_ENUM(op, params, args) OP_##op,
#define PROF_NAME(op, params, args) #op,
enum { PROF_OPS(PROF_ENUM) PROF_OP_COUNT };
static const char *const g_op_names[PROF_OP_COUNT] = {PROF_OPS(PROF_NAME)};
static const char *const g_phase_names[PROF_PHASE_COUNT] = {"forward", "backward", "optimizer", "comm"};

static const backend *g_inner;
static backend g_table;
static unit_provider g_inner_provider;

static prof_phase g_phase = PROF_FORWARD;
static int g_depth;              // >0 while an op runs (ops calling ops are timed once)
static double g_ms[PROF_PHASE_COUNT][PROF_OP_COUNT];
static int g_calls[PROF_PHASE_COUNT][PROF_OP_COUNT];
static double g_op_total_ms;     // all op time so far (comm regions subtract what ran inside)
static double g_comm_ms;
static double g_comm_t0, g_comm_ops0;
static double g_step_t0;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return 1e3 * (double)t.tv_sec + 1e-6 * (double)t.tv_nsec;
}

static double op_begin(void) {
    if (g_depth++ > 0) return 0;
    g_inner->synchronize();
    return now_ms();
}

static void op_end(int op, double t0) {
    if (--g_depth > 0) return;
    g_inner->synchronize();
    double ms = now_ms() - t0;
    g_ms[g_phase][op] += ms;
    g_calls[g_phase][op]++;
    g_op_total_ms += ms;
}

// ----------------------------------------------------------------------------
// the wrapping backend: one forwarding function per op

#define PROF_WRAP(op, params, args)                                                            \
    static int prof_##op params {                                                              \
        double t0 = op_begin();                                                                \
        int rc = g_inner->op args;                                                             \
        op_end(OP_##op, t0);                                                                   \
        return rc;                                                                             \
    }

PROF_OPS(PROF_WRAP)

const backend *profile_backend(const backend *inner) {
    g_inner = inner;
    g_table = *inner;   // fields added later pass through untimed
#define PROF_SET(op, params, args) g_table.op = inner->op ? prof_##op : NULL;   // (no FP8 ops: none)
    PROF_OPS(PROF_SET)
    return &g_table;
}

// ----------------------------------------------------------------------------
// the wrapping provider and comm regions

void profile_set_phase(prof_phase phase) { g_phase = phase; }

void profile_comm_begin(void) {
    g_comm_t0 = now_ms();
    g_comm_ops0 = g_op_total_ms;
}

void profile_comm_end(void) {
    g_comm_ms += now_ms() - g_comm_t0 - (g_op_total_ms - g_comm_ops0);
}

static int prof_acquire(void *ctx, int u, int for_backward, void **params) {
    (void)ctx;
    if (!for_backward && g_phase != PROF_FORWARD) g_phase = PROF_FORWARD;
    if (for_backward) g_phase = PROF_BACKWARD;   // a frozen LoRA base asks for no gradients
    profile_comm_begin();
    int rc = g_inner_provider.acquire(g_inner_provider.ctx, u, for_backward, params);
    profile_comm_end();
    return rc;
}

static int prof_release(void *ctx, int u) {
    (void)ctx;
    profile_comm_begin();
    int rc = g_inner_provider.release(g_inner_provider.ctx, u);
    profile_comm_end();
    return rc;
}

static int prof_grad_begin(void *ctx, int u, unit_grad *g) {
    (void)ctx;
    g_phase = PROF_BACKWARD;
    profile_comm_begin();
    int rc = g_inner_provider.grad_begin(g_inner_provider.ctx, u, g);
    profile_comm_end();
    return rc;
}

static int prof_grad_end(void *ctx, int u) {
    (void)ctx;
    profile_comm_begin();
    int rc = g_inner_provider.grad_end(g_inner_provider.ctx, u);
    profile_comm_end();
    return rc;
}

unit_provider profile_provider(const unit_provider *inner) {
    g_inner_provider = *inner;
    unit_provider p = {NULL, prof_acquire, prof_release, prof_grad_begin, prof_grad_end};
    return p;
}

// ----------------------------------------------------------------------------
// the report

void profile_step_begin(void) {
    memset(g_ms, 0, sizeof g_ms);
    memset(g_calls, 0, sizeof g_calls);
    g_op_total_ms = g_comm_ms = 0;
    g_phase = PROF_FORWARD;
    g_step_t0 = now_ms();
}

// the ops of one phase, slowest first: "name ms/calls"
static void print_phase_ops(FILE *out, int ph) {
    int done[PROF_OP_COUNT] = {0};
    fprintf(out, "  %-9s", g_phase_names[ph]);
    for (;;) {
        int best = -1;
        for (int op = 0; op < PROF_OP_COUNT; op++)
            if (!done[op] && g_calls[ph][op] && (best < 0 || g_ms[ph][op] > g_ms[ph][best])) best = op;
        if (best < 0) break;
        done[best] = 1;
        fprintf(out, " %s %.1f/%d", g_op_names[best], g_ms[ph][best], g_calls[ph][best]);
    }
    fprintf(out, "\n");
}

void profile_step_report(FILE *out, int step) {
    double total = now_ms() - g_step_t0, phase_ms[PROF_PHASE_COUNT] = {0}, covered = 0;
    for (int ph = 0; ph < PROF_PHASE_COUNT; ph++)
        for (int op = 0; op < PROF_OP_COUNT; op++) phase_ms[ph] += g_ms[ph][op];
    phase_ms[PROF_COMM] += g_comm_ms;
    fprintf(out, "profile step %d (ms, op ms/calls): %.1f =", step, total);
    for (int ph = 0; ph < PROF_PHASE_COUNT; ph++) {
        fprintf(out, "%s %s %.1f", ph ? " +" : "", g_phase_names[ph], phase_ms[ph]);
        covered += phase_ms[ph];
    }
    fprintf(out, " + other %.1f\n", total - covered);
    for (int ph = 0; ph < PROF_PHASE_COUNT; ph++) {
        int any = 0;
        for (int op = 0; op < PROF_OP_COUNT; op++) any |= g_calls[ph][op] != 0;
        if (any) print_phase_ops(out, ph);
    }
    fflush(out);
}
