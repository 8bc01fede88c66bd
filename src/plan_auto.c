// plan_auto.c: --auto, the fastest plan that fits (see plan_auto.h).
#include "plan_auto.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "options.h"
#include "plan_timeline.h"

// ----------------------------------------------------------------------------
// the device and the estimate

int plan_auto_device(size_t elem_bytes, const char *name, const plan_device *real, plan_device *d,
                     int *memory_tested) {
    const plan_device *named = real ? real : name ? plan_device_find(name) : PLAN_FIT_DEVICE;
    if (!named) return ft_error("flag --dry_run_device: '%s' names no one device of the estimate's table", name);
    *d = *named;
    *memory_tested = elem_bytes == 2;
    const char *mib = ft_getenv("FT_TEST_DEVICE_MIB");
    if (!mib) return 0;
    char *end;
    const double v = strtod(mib, &end);
    if (end == mib || *end || !(v > 0) || v > 1e9)
        return ft_error("FT_TEST_DEVICE_MIB: '%s' is not a positive number of MiB", mib);
    d->memory_bytes = (size_t)(v * 1048576.0);
    return 0;
}

void plan_auto_estimate(const plan *p, const plan_device *d, plan_auto_candidate *c) {
    plan_step_time t;
    plan_estimate_step_time(p, d, &t);
    // the timeline (the program's own schedule); the per-phase sum only if it cannot price p
    const double tl = plan_tl_step_seconds(p, d, NULL, NULL, NULL);
    if (!(tl > 0)) ft_error_clear();   // (the fallback: its message is not the job's)
    c->step_s = tl > 0 ? tl : t.total_s;
    c->mfu = c->step_s > 0 ? t.mfu * t.total_s / c->step_s : 0;   // (the same model FLOPs over another time)
    c->tokens_per_s = c->step_s > 0 ? p->tokens / c->step_s : 0;
}

// ----------------------------------------------------------------------------
// the search

// Plan r and weigh it into *c. 0; -1 with ft_error when r is not a valid job.
static int candidate_eval(const llama_config *cfg, const plan_request *r, const plan_device *d, int memory_tested,
                          plan_auto_candidate *c) {
    plan *p = malloc(sizeof *p);   // (a plan is tens of KiB: not on the stack of a deep search)
    if (!p) return ft_error("--auto: out of memory");
    int rc = plan_compute(p, cfg, r);
    if (rc == 0) {
        memset(c, 0, sizeof *c);
        c->req = *r;
        c->total = p->total;
        c->budget = memory_tested ? plan_device_budget(p, d) : 0;
        c->fits = memory_tested ? plan_fits(p, d) : 1;
        plan_auto_estimate(p, d, c);
    }
    free(p);
    return rc;
}

// a is preferred over b: faster (relative 1e-9, beyond rounding), or as fast with fewer bytes
static int better(const plan_auto_candidate *a, const plan_auto_candidate *b) {
    if (a->tokens_per_s > b->tokens_per_s * (1 + 1e-9)) return 1;
    if (b->tokens_per_s > a->tokens_per_s * (1 + 1e-9)) return 0;
    return a->total < b->total;
}

// The valid candidates of a search (a growing array).
typedef struct {
    plan_auto_candidate *c;
    int n, cap;
} candidates;

static int candidates_add(candidates *v, const plan_auto_candidate *c) {
    if (v->n == v->cap) {
        const int cap = v->cap ? 2 * v->cap : 64;
        plan_auto_candidate *grown = realloc(v->c, (size_t)cap * sizeof *grown);
        if (!grown) return ft_error("--auto: out of memory");
        v->c = grown, v->cap = cap;
    }
    v->c[v->n++] = *c;
    return 0;
}

// as fast as each other, within rounding
static int as_fast(const plan_auto_candidate *a, const plan_auto_candidate *b) {
    return !(a->tokens_per_s > b->tokens_per_s * (1 + 1e-6)) && !(b->tokens_per_s > a->tokens_per_s * (1 + 1e-6));
}

// The ranking of the valid candidates v: the best that fits; the runner-up, the fastest that
// fits and is slower than the best (plans as fast, which differ only in bytes, are counted in
// res->ties); the fastest that does not fit; the smallest.
static void rank_candidates(plan_auto_result *res, const candidates *v) {
    for (int i = 0; i < v->n; i++) {
        const plan_auto_candidate *c = &v->c[i];
        if (res->valid++ == 0 || c->total < res->smallest.total) res->smallest = *c;
        if (!c->fits && (!res->has_blocked || better(c, &res->blocked))) res->blocked = *c, res->has_blocked = 1;
        if (c->fits && (res->fitting++ == 0 || better(c, &res->best))) res->best = *c;
    }
    for (int i = 0; i < v->n && res->fitting; i++) {
        const plan_auto_candidate *c = &v->c[i];
        if (!c->fits || c == &res->best) continue;
        if (as_fast(c, &res->best)) res->ties += memcmp(&c->req, &res->best.req, sizeof c->req) != 0;
        else if (!res->has_runner_up || better(c, &res->runner_up)) res->runner_up = *c, res->has_runner_up = 1;
    }
}

// Set r's four switches from `bits` (checkpointing, kept gathers, local accumulation, offload:
// bits 0-3), each fixed one as base has it. 0 when this combination is to be skipped: a fixed
// flag that differs, kept gathers without a shard group (no effect), offload on the CPU or
// with bf16 moments.
static int set_switches(plan_request *r, const plan_request *base, const plan_auto_fixed *f, int bits) {
    const int want[4] = {bits & 1, (bits >> 1) & 1, (bits >> 2) & 1, (bits >> 3) & 1};
    const int have[4] = {base->gradient_checkpointing, base->keep_params_gathered, base->accumulate_grads_locally,
                         base->offload_optimizer};
    const int fixed[4] = {f->checkpointing, f->keep_gathered, f->local, f->offload};
    for (int i = 0; i < 4; i++)
        if (fixed[i] && want[i] != have[i]) return 0;
    if (!fixed[1] && want[1] && r->shard_size == 1) return 0;
    if (!fixed[3] && want[3] && (r->elem_bytes != 2 || base->moments_bf16)) return 0;   // (offload: fp32 moments)
    r->gradient_checkpointing = want[0];
    r->keep_params_gathered = want[1];
    r->accumulate_grads_locally = want[2];
    r->offload_optimizer = want[3];
    return 1;
}

// The combinations of one batch B and shard group S, the valid ones added to v. 0, or -1 out of
// memory. *first_error keeps the first validation message.
static int search_grid(const llama_config *cfg, const plan_request *base, const plan_auto_fixed *fixed, int B, int S,
                       const plan_device *d, int memory_tested, plan_auto_result *res, candidates *v,
                       char *first_error, size_t n) {
    for (int bits = 0; bits < 16; bits++) {
        plan_request r = *base;
        r.batch_size_per_device = B;
        r.shard_size = S;
        if (!set_switches(&r, base, fixed, bits)) continue;
        res->tried++;
        plan_auto_candidate c;
        if (candidate_eval(cfg, &r, d, memory_tested, &c) == 0) {
            TRY(candidates_add(v, &c));
            continue;
        }
        if (!first_error[0]) snprintf(first_error, n, "%s", ft_error_message());
        ft_error_clear();
    }
    return 0;
}

// The flags held fixed that bound the search, for the error when nothing fits.
static void fixed_names(const plan_auto_fixed *f, char *buf, size_t n) {
    snprintf(buf, n, "%s%s%s%s%s%s", f->batch ? " --batch_size_per_device" : "",
             f->checkpointing ? " --gradient_checkpointing" : "", f->keep_gathered ? " --keep_params_gathered" : "",
             f->shard ? " --dp_shard/--no_fsdp" : "", f->local ? " --accumulate_grads_locally" : "",
             f->offload ? " --offload_optimizer" : "");
}

// The error when the search found no plan to run: none valid, or none fitting.
static int search_failed(const plan_request *base, const plan_auto_result *res, const char *first_error) {
    if (res->valid == 0 && first_error[0]) return ft_error("--auto: %s", first_error);
    if (res->valid == 0)
        return ft_error("flag --auto: no --batch_size_per_device B makes B x %d rank(s) divide --total_batch_size %d",
                        base->world_size, base->total_batch_size);
    char held[160], flags[160];
    fixed_names(&res->fixed, held, sizeof held);
    plan_auto_describe(&res->smallest.req, flags, sizeof flags);
    return ft_error("flag --auto: none of %d plans fits the %s: the smallest (%s) needs %.2f GiB, %.2f GiB fit%s%s",
                    res->valid, res->device.name, flags, res->smallest.total / 1073741824.0,
                    res->smallest.budget / 1073741824.0, held[0] ? "; held fixed by your flags:" : "", held);
}

int plan_auto_choose(const llama_config *cfg, const plan_request *base, const plan_auto_fixed *fixed,
                     const plan_device *d, int memory_tested, plan_auto_result *res) {
    memset(res, 0, sizeof *res);
    res->device = *d;
    res->memory_tested = memory_tested;
    res->fixed = *fixed;
    const int W = base->world_size;
    const int bmax = fixed->batch ? base->batch_size_per_device : base->total_batch_size / (W > 0 ? W : 1);
    char first_error[512] = "";
    if (fixed->shard) TRY(plan_validate_grid(W, base->shard_size));
    candidates v = {0};
    int rc = 0;
    for (int B = fixed->batch ? bmax : 1; rc == 0 && B <= bmax && B <= 4096; B++) {
        if (!fixed->batch && base->total_batch_size % (B * W) != 0) continue;
        for (int S = 1; rc == 0 && S <= W; S++)
            if (W % S == 0 && (!fixed->shard || S == base->shard_size))
                rc = search_grid(cfg, base, fixed, B, S, d, memory_tested, res, &v, first_error, sizeof first_error);
    }
    if (rc == 0) rank_candidates(res, &v);
    free(v.c);
    if (rc != 0) return rc;
    if (res->fitting == 0) return search_failed(base, res, first_error);
    plan_auto_candidate g;
    if (candidate_eval(cfg, base, d, memory_tested, &g) == 0) res->given = g, res->given_valid = 1;
    else ft_error_clear();
    return 0;
}

// ----------------------------------------------------------------------------
// the report

void plan_auto_describe(const plan_request *r, char *buf, size_t n) {
    char shard[40] = "";
    if (r->world_size > 1) snprintf(shard, sizeof shard, " --dp_shard %d", r->shard_size);
    snprintf(buf, n, "--batch_size_per_device %d%s%s%s%s%s", r->batch_size_per_device, shard,
             r->gradient_checkpointing ? " --gradient_checkpointing" : "",
             r->keep_params_gathered ? " --keep_params_gathered" : "",
             r->accumulate_grads_locally ? " --accumulate_grads_locally" : "",
             r->offload_optimizer ? " --offload_optimizer" : "");
}

static double gib(size_t b) { return (double)b / 1073741824.0; }

// One candidate's line: its flags, tokens/s, MFU, bytes (of the budget, when tested).
static void print_candidate(FILE *out, const char *label, const plan_auto_candidate *c, int memory_tested) {
    char flags[200];
    plan_auto_describe(&c->req, flags, sizeof flags);
    fprintf(out, "  %-10s %s: %.0f tokens/s/GPU, MFU %.1f%%, step %.2f ms, %.2f GiB", label, flags, c->tokens_per_s,
            100 * c->mfu, 1e3 * c->step_s, gib(c->total));
    if (memory_tested) fprintf(out, " of %.2f GiB: %s\n", gib(c->budget), c->fits ? "fits" : "does NOT fit");
    else fprintf(out, " (host memory, not tested)\n");
}

void plan_auto_print(FILE *out, const plan_auto_result *res) {
    const plan_request *r = &res->best.req;
    fprintf(out, "finetune: --auto: %d rank(s), total batch %d, seq %d, predicted on the %s (%.2f GiB; %s): %d "
            "plans, %d valid, %d fit; the most tokens/s per GPU wins\n", r->world_size, r->total_batch_size,
            r->seq_len, res->device.name, gib(res->device.memory_bytes),
            res->memory_tested ? "each plan must fit it as a GPU run's startup check" : "CPU backend: memory not tested",
            res->tried, res->valid, res->fitting);
    print_candidate(out, "chosen:", &res->best, res->memory_tested);
    if (res->has_runner_up) {
        print_candidate(out, "runner-up:", &res->runner_up, res->memory_tested);
        fprintf(out, "  %-10s the runner-up is %.1f%% slower\n", "", 100 * (1 - res->runner_up.tokens_per_s / res->best.tokens_per_s));
    }
    if (res->ties)
        fprintf(out, "  %-10s %d other plan(s) as fast as the choice, with as many bytes or more (ties go to the fewest)\n", "ties:",
                res->ties);
    if (res->has_blocked && better(&res->blocked, &res->best)) {
        char flags[200];
        plan_auto_describe(&res->blocked.req, flags, sizeof flags);
        fprintf(out, "  %-10s the fastest plan, %s (%.0f tokens/s/GPU), does not fit: %.2f GiB > %.2f GiB\n", "binding:",
                flags, res->blocked.tokens_per_s, gib(res->blocked.total), gib(res->blocked.budget));
    } else {
        fprintf(out, "  %-10s none: no faster plan was left out for memory (%d do not fit)\n", "binding:",
                res->valid - res->fitting);
    }
    if (res->given_valid) print_candidate(out, "no --auto:", &res->given, res->memory_tested);
    char held[160];
    fixed_names(&res->fixed, held, sizeof held);
    fprintf(out, "  %-10s%s\n", "held:", held[0] ? held : " nothing (no flag --auto chooses was given)");
}

void plan_auto_print_estimate_flags(FILE *out, const train_options *o) {
    char buf[256] = "";
    size_t n = 0;
    if (options_given(o, "--fabric_intra_gbps"))
        n += (size_t)snprintf(buf + n, sizeof buf - n, " --fabric_intra_gbps %g", o->fabric_intra_gbps);
    if (options_given(o, "--fabric_inter_gbps") && n < sizeof buf)
        n += (size_t)snprintf(buf + n, sizeof buf - n, " --fabric_inter_gbps %g", o->fabric_inter_gbps);
    if (options_given(o, "--dry_run_row_tokens") && n < sizeof buf)
        n += (size_t)snprintf(buf + n, sizeof buf - n, " --dry_run_row_tokens %d", o->dry_run_row_tokens);
    if (options_given(o, "--dry_run_gpus_per_node") && n < sizeof buf)
        snprintf(buf + n, sizeof buf - n, " --dry_run_gpus_per_node %d", o->dry_run_gpus_per_node);
    if (buf[0])
        fprintf(out, "finetune: --auto ranked the plans by the step-time estimate with%s (the estimate's assumptions "
                "about this job, not measured by it)\n", buf);
}

// ----------------------------------------------------------------------------
// the command line

int plan_auto_apply(train_options *o, int W, size_t elem_bytes, const plan_device *real, plan_auto_result *res) {
    llama_config cfg;
    char path[FT_PATH_MAX];
    TRY(ft_path(path, sizeof path, "%s/config.json", o->model_dir));
    TRY(llama_config_load(&cfg, path));
    const plan_auto_fixed fixed = {
        options_given(o, "--batch_size_per_device"), options_given(o, "--gradient_checkpointing"),
        options_given(o, "--keep_params_gathered"), options_given(o, "--dp_shard") || options_given(o, "--no_fsdp"),
        options_given(o, "--accumulate_grads_locally"), options_given(o, "--offload_optimizer"),
    };
    plan_device d;
    int memory_tested;
    TRY(plan_auto_device(elem_bytes, o->dry_run ? o->dry_run_device : NULL, real, &d, &memory_tested));
    const plan_request base = train_plan_request(o, W, elem_bytes);
    TRY(plan_auto_choose(&cfg, &base, &fixed, &d, memory_tested, res));
    const plan_request *r = &res->best.req;
    o->batch_size_per_device = r->batch_size_per_device;
    o->gradient_checkpointing = r->gradient_checkpointing;
    o->keep_params_gathered = r->keep_params_gathered;
    o->accumulate_grads_locally = r->accumulate_grads_locally;
    o->offload_optimizer = r->offload_optimizer;
    if (!fixed.shard) o->dp_shard = r->shard_size == W ? 0 : r->shard_size;
    return 0;
}
