// test_schedule.c: the trainer's learning-rate schedule (src/schedule.c) against transformers'
// schedulers: tests/golden/schedule/lr.json holds, per case, the rate of every optimizer step
// from get_linear_schedule_with_warmup / get_cosine_schedule_with_warmup /
// get_constant_schedule_with_warmup (written by tests/oracle/gen_schedule.py). Then the
// per-step AdamW parameters: clip factor and bias corrections.
//
// Threshold, derived: both sides evaluate the same closed form in IEEE double (a division,
// a product, cos for cosine), each rounding within an ulp or so, so they agree to a few ulps
// of the peak rate (~1e-16 relative); we allow 1e-14 x peak (~45 ulps). A real bug is far
// above: an off-by-one step or a warmup of one step more/less moves a rate by peak / total
// (>= 1e-3 of the peak for these totals); a linear decay where cosine is due by up to 10% of
// the peak. Runtime: milliseconds.
#include <jansson.h>

#include "common.h"
#include "schedule.h"
#include "test.h"

static void check_case(json_t *c, int idx) {
    const char *name = json_string_value(json_object_get(c, "schedule"));
    json_t *lrs = json_object_get(c, "lr");
    schedule s = {.learning_rate = json_number_value(json_object_get(c, "learning_rate")),
                  .total_steps = (int)json_integer_value(json_object_get(c, "total_steps")),
                  .warmup_steps = (int)json_integer_value(json_object_get(c, "warmup_steps"))};
    if (!name || !json_is_array(lrs) || schedule_kind_parse(name, &s.kind) != 0 ||
        json_array_size(lrs) != (size_t)s.total_steps) {
        EXPECT(0, "case %d: malformed (%s)", idx, ft_error_message());
        return;
    }
    double worst = 0;
    int worst_step = 0;
    for (int k = 0; k < s.total_steps; k++) {
        const double ref = json_number_value(json_array_get(lrs, (size_t)k)), got = schedule_lr(&s, k);
        const double err = fabs(got - ref) / s.learning_rate;
        EXPECT(err <= 1e-14, "%s total %d warmup %d step %d: lr %.17g, transformers %.17g", name, s.total_steps,
               s.warmup_steps, k, got, ref);
        if (err >= worst) { worst = err; worst_step = k; }
    }
    printf("  %-8s total %3d warmup %2d peak %-7g: %3d steps, worst |diff| / peak %.1e (step %d)\n", name,
           s.total_steps, s.warmup_steps, s.learning_rate, s.total_steps, worst, worst_step);
}

// clip factor min(1, max_norm / (norm + 1e-6)) as torch.nn.utils.clip_grad_norm_ applies it;
// bias corrections 1 - beta^t of the 1-based step t, as torch.optim.AdamW
static void check_adamw(void) {
    schedule s = {.learning_rate = 1e-3, .kind = SCHEDULE_CONSTANT, .total_steps = 10, .beta1 = 0.9,
                  .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .max_grad_norm = 1.0};
    adamw_params p = schedule_adamw(&s, 0, 4.0);
    EXPECT(p.grad_scale == (float)(1.0 / (4.0 + 1e-6)), "clip of norm 4 to 1: %.9g", p.grad_scale);
    EXPECT(p.bias_correction1 == (float)0.1 && p.bias_correction2 == (float)(1 - 0.95),
           "step 1 bias corrections %.9g %.9g", p.bias_correction1, p.bias_correction2);
    p = schedule_adamw(&s, 2, 0.5);
    EXPECT(p.grad_scale == 1.0f, "norm below the clip: scale %.9g", p.grad_scale);
    EXPECT(p.bias_correction1 == (float)(1 - 0.9 * 0.9 * 0.9), "step 3 bias correction1 %.9g", p.bias_correction1);
    EXPECT(p.lr == 1e-3f && p.beta1 == 0.9f && p.eps == 1e-8f && p.weight_decay == 0.1f, "copied fields");
    s.max_grad_norm = 0;
    EXPECT(schedule_adamw(&s, 0, 1e9).grad_scale == 1.0f, "max_grad_norm 0 = no clipping");
    schedule_kind k;
    EXPECT(schedule_kind_parse("polynomial", &k) != 0 && strstr(ft_error_message(), "--lr_schedule"),
           "unknown schedule: '%s'", ft_error_message());
    ft_error_clear();
    // transformers' Trainer: math.ceil(total * warmup_ratio) (values from Python; 0.1 x 120 is 12.0 exactly)
    static const struct { double fraction; int total, warmup; } wc[] = {
        {0.1, 120, 12}, {0.1, 37, 4}, {0.1, 154, 16}, {0.1, 30, 3}, {0, 50, 0}, {0.5, 1, 1}, {1, 7, 7}};
    for (size_t i = 0; i < sizeof wc / sizeof wc[0]; i++)
        EXPECT(schedule_warmup_steps(wc[i].fraction, wc[i].total) == wc[i].warmup, "warmup %g x %d: %d steps, not %d",
               wc[i].fraction, wc[i].total, schedule_warmup_steps(wc[i].fraction, wc[i].total), wc[i].warmup);
}

int main(void) {
    const char *path = "tests/golden/schedule/lr.json";
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    json_t *cases = json_object_get(root, "cases");
    EXPECT(json_is_array(cases) && json_array_size(cases) > 0, "%s: no cases (%s)", path, jerr.text);
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) check_case(c, (int)i);
    json_decref(root);
    check_adamw();
    TEST_SUMMARY("test_schedule");
}
