// test_plan_auto.c: the search of --auto (src/plan_auto.c) against an oracle that plans every
// combination of the six flags itself (plan_compute, plan_fits, plan_tl_step_seconds) and
// keeps the fastest that fits and honours the fixed flags. For the bundled model and the
// CodeLlama-7b config, GPU storage at several device memories and CPU storage:
//   - the choice's tokens/s equals the oracle's best (relative 1e-9: the same arithmetic), it
//     fits, and it keeps every fixed flag;
//   - the runner-up fits and is slower; the "blocked" plan does not fit and is faster; the
//     smallest plan has the fewest bytes of all valid ones;
//   - the CPU never gets --offload_optimizer, a lone rank never --keep_params_gathered;
//   - nothing fitting, or no batch dividing the total, is -1 with a message saying so.
// Runtime: about a second (a few hundred plans, each counting one micro-batch of the model).
#include "common.h"
#include "config.h"
#include "plan.h"
#include "plan_auto.h"
#include "plan_timeline.h"
#include "test.h"

typedef struct {
    double tokens_per_s;
    size_t smallest;
    int valid;
} oracle_result;

// Every combination, planned here: the best tokens/s of those that fit and keep the fixed flags.
static void oracle(const llama_config *c, const plan_request *base, const plan_auto_fixed *f, const plan_device *d,
                   int tested, oracle_result *o) {
    memset(o, 0, sizeof *o);
    const int W = base->world_size;
    static plan p;
    for (int B = 1; B <= base->total_batch_size / W; B++)
        for (int S = 1; S <= W; S++)
            for (int bits = 0; bits < 16; bits++) {
                plan_request r = *base;
                r.batch_size_per_device = B, r.shard_size = S;
                r.gradient_checkpointing = bits & 1, r.keep_params_gathered = bits >> 1 & 1;
                r.accumulate_grads_locally = bits >> 2 & 1, r.offload_optimizer = bits >> 3 & 1;
                if ((f->batch && B != base->batch_size_per_device) || (f->shard && S != base->shard_size) ||
                    (f->checkpointing && r.gradient_checkpointing != base->gradient_checkpointing) ||
                    (f->keep_gathered && r.keep_params_gathered != base->keep_params_gathered) ||
                    (f->local && r.accumulate_grads_locally != base->accumulate_grads_locally) ||
                    (f->offload && r.offload_optimizer != base->offload_optimizer) ||
                    (!f->offload && r.offload_optimizer && base->elem_bytes != 2))
                    continue;
                if (plan_compute(&p, c, &r) != 0) { ft_error_clear(); continue; }
                if (o->valid++ == 0 || p.total < o->smallest) o->smallest = p.total;
                if (tested && !plan_fits(&p, d)) continue;
                plan_step_time t;   // the timeline's step, the per-phase sum where it cannot price p
                plan_estimate_step_time(&p, d, &t);
                const double tl = plan_tl_step_seconds(&p, d, NULL, NULL, NULL), step = tl > 0 ? tl : t.total_s;
                if (!(tl > 0)) ft_error_clear();
                if (p.tokens / step > o->tokens_per_s) o->tokens_per_s = p.tokens / step;
            }
}

static int keeps(const plan_request *r, const plan_request *base, const plan_auto_fixed *f) {
    return (!f->batch || r->batch_size_per_device == base->batch_size_per_device) &&
           (!f->shard || r->shard_size == base->shard_size) &&
           (!f->checkpointing || r->gradient_checkpointing == base->gradient_checkpointing) &&
           (!f->keep_gathered || r->keep_params_gathered == base->keep_params_gathered) &&
           (!f->local || r->accumulate_grads_locally == base->accumulate_grads_locally) &&
           (!f->offload || r->offload_optimizer == base->offload_optimizer);
}

// One search against the oracle, at `mib` MiB of device memory (0: the device's own).
static void check_case(const char *name, const llama_config *c, plan_request base, plan_auto_fixed f, double mib) {
    plan_device d = *PLAN_FIT_DEVICE;
    if (mib > 0) d.memory_bytes = (size_t)(mib * 1048576.0);
    const int tested = base.elem_bytes == 2;
    plan_auto_result res;
    const int rc = plan_auto_choose(c, &base, &f, &d, tested, &res);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", rc ? ft_error_message() : "");
    ft_error_clear();
    oracle_result o;
    oracle(c, &base, &f, &d, tested, &o);
    if (o.tokens_per_s == 0) {
        EXPECT(rc != 0 && strstr(msg, "none of"), "%s: nothing fits, yet rc %d (%s)", name, rc, msg);
        return;
    }
    EXPECT(rc == 0, "%s: %s", name, msg);
    if (rc != 0) return;
    const plan_auto_candidate *b = &res.best;
    EXPECT(fabs(b->tokens_per_s / o.tokens_per_s - 1) < 1e-9, "%s: chose %.1f tokens/s, the oracle's best %.1f", name,
           b->tokens_per_s, o.tokens_per_s);
    EXPECT(b->fits && keeps(&b->req, &base, &f), "%s: the choice fits (%d) and keeps the fixed flags", name, b->fits);
    EXPECT(res.smallest.total == o.smallest, "%s: smallest %zu, the oracle's %zu", name, res.smallest.total, o.smallest);
    EXPECT(!res.has_runner_up || (res.runner_up.fits && res.runner_up.tokens_per_s < b->tokens_per_s),
           "%s: the runner-up fits and is slower", name);
    EXPECT(!res.has_blocked || !res.blocked.fits, "%s: the blocked plan does not fit", name);
    EXPECT(base.elem_bytes == 2 || !b->req.offload_optimizer, "%s: no --offload_optimizer on the CPU", name);
    EXPECT(b->req.shard_size > 1 || !b->req.keep_params_gathered || f.keep_gathered,
           "%s: no --keep_params_gathered without a shard group", name);
}

static plan_request job(int W, int total, int seq, size_t elem_bytes) {
    return (plan_request){.world_size = W, .shard_size = W, .batch_size_per_device = 1, .seq_len = seq,
                          .total_batch_size = total, .elem_bytes = elem_bytes, .attention_cudnn = elem_bytes == 2};
}

int main(void) {
    llama_config tiny, big;
    if (llama_config_load(&tiny, "data/model/config.json") != 0 ||
        llama_config_load(&big, "data/configs/codellama-7b/config.json") != 0) {
        fprintf(stderr, "test_plan_auto: %s (run from the repository root)\n", ft_error_message());
        return 1;
    }
    const plan_auto_fixed none = {0};
    // memory binds at each of these for the bundled model (1.3-1.45 GiB: the plans differ by MiB)
    const double tiny_mib[] = {1300, 1340, 1380, 1450, 0};
    for (int i = 0; i < 5; i++) check_case("bundled, 1 GPU", &tiny, job(1, 64, 512, 2), none, tiny_mib[i]);
    check_case("bundled, 4 GPUs", &tiny, job(4, 32, 128, 2), none, 0);
    check_case("bundled, CPU", &tiny, job(1, 16, 128, 4), none, 0);
    plan_request b2 = job(4, 32, 128, 2);
    b2.batch_size_per_device = 2, b2.shard_size = 2, b2.gradient_checkpointing = 1;
    check_case("bundled, 4 GPUs, batch 2, --dp_shard 2, checkpointing fixed", &tiny, b2,
               (plan_auto_fixed){.batch = 1, .shard = 1, .checkpointing = 1}, 0);
    const double big_mib[] = {20000, 40000, 81559, 144000};
    for (int i = 0; i < 4; i++) check_case("7B, 8 GPUs", &big, job(8, 64, 512, 2), none, big_mib[i]);
    check_case("7B, 1 GPU", &big, job(1, 64, 512, 2), none, 0);
    plan_request off = job(1, 64, 512, 2);
    check_case("7B, 1 GPU, no offload: nothing fits", &big, off, (plan_auto_fixed){.offload = 1}, 0);
    // no batch divides: an error naming the total batch
    plan_auto_result res;
    plan_request odd = job(4, 6, 128, 2);
    plan_device d = *PLAN_FIT_DEVICE;
    EXPECT(plan_auto_choose(&tiny, &odd, &none, &d, 1, &res) != 0 && strstr(ft_error_message(), "--total_batch_size 6"),
           "total batch 6 over 4 ranks: %s", ft_error_message());
    ft_error_clear();
    TEST_SUMMARY("test_plan_auto");
}
