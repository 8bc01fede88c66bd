// schedule.c: learning rate and AdamW parameters per step (see schedule.h).
#include "schedule.h"

#include <math.h>
#include <string.h>

#include "common.h"

int schedule_kind_parse(const char *name, schedule_kind *out) {
    static const struct { const char *name; schedule_kind kind; } kinds[] = {
        {"linear", SCHEDULE_LINEAR}, {"cosine", SCHEDULE_COSINE}, {"constant", SCHEDULE_CONSTANT}};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (strcmp(name, kinds[i].name) == 0) { *out = kinds[i].kind; return 0; }
    return ft_error("flag --lr_schedule: '%s' is not one of linear|cosine|constant", name);
}

// transformers' TrainingArguments.get_warmup_steps: math.ceil(total x ratio), in the same double product
int schedule_warmup_steps(double warmup_fraction, int total_steps) {
    return (int)ceil((double)total_steps * warmup_fraction);
}

double schedule_lr(const schedule *s, int step) {
    const int warmup = s->warmup_steps;
    if (step < warmup) return s->learning_rate * (double)step / (double)warmup;
    if (s->kind == SCHEDULE_CONSTANT) return s->learning_rate;
    const int decay = s->total_steps - warmup;
    double progress = (double)(step - warmup) / (double)(decay > 0 ? decay : 1);
    if (progress > 1) progress = 1;
    if (s->kind == SCHEDULE_COSINE) return s->learning_rate * 0.5 * (1.0 + cos(M_PI * progress));
    return s->learning_rate * (1.0 - progress);
}

adamw_params schedule_adamw(const schedule *s, int step, double grad_norm) {
    const double clip = s->max_grad_norm > 0 ? fmin(1.0, s->max_grad_norm / (grad_norm + 1e-6)) : 1.0;
    const int t = step + 1;
    adamw_params p = {
        .lr = (float)schedule_lr(s, step),
        .beta1 = (float)s->beta1,
        .beta2 = (float)s->beta2,
        .eps = (float)s->eps,
        .weight_decay = (float)s->weight_decay,
        .bias_correction1 = (float)(1.0 - pow(s->beta1, t)),
        .bias_correction2 = (float)(1.0 - pow(s->beta2, t)),
        .grad_scale = (float)clip,
        .seed = s->seed,
        .step = (uint32_t)t,
    };
    return p;
}
