// schedule.h: the optimizer's per-step numbers: the learning-rate schedule (warmup, then
// linear, cosine or constant, as transformers' get_*_schedule_with_warmup compute it) and
// the AdamW parameters of a step (clip factor from the global gradient norm, bias
// corrections), the one place the trainer and its tests take them from.
#pragma once
#include "backend.h"   // adamw_params

typedef enum { SCHEDULE_LINEAR, SCHEDULE_COSINE, SCHEDULE_CONSTANT } schedule_kind;

typedef struct {
    double learning_rate;         // peak
    schedule_kind kind;           // decay after warmup
    int warmup_steps;             // linear warmup from 0 over steps [0, warmup_steps)
    int total_steps;              // decay reaches 0 at total_steps (linear, cosine)
    double beta1, beta2, eps, weight_decay;
    double max_grad_norm;         // clip the global gradient norm to this; 0 = no clipping
    uint32_t seed;                // --seed: the bf16 moments' stochastic rounding (adamw_params.seed)
} schedule;

// The kind called `name` ("linear", "cosine" or "constant"). 0, or -1 with ft_error naming
// the flag --lr_schedule.
int schedule_kind_parse(const char *name, schedule_kind *out);

// Warmup steps for a fraction of total steps: ceil(total x fraction), as transformers' Trainer
// rounds its warmup_ratio (154 steps at 0.1: 16).
int schedule_warmup_steps(double warmup_fraction, int total_steps);

// Learning rate of optimizer step `step` (0-based): peak x step / warmup during warmup, then
// peak x (1 - p) (linear), peak x (1 + cos(pi p)) / 2 (cosine) or peak (constant), with
// p = (step - warmup) / (total - warmup) capped at 1.
double schedule_lr(const schedule *s, int step);

// AdamW parameters of optimizer step `step` (0-based) whose global gradient norm (before
// clipping) is grad_norm: lr from schedule_lr, grad_scale = min(1, max_grad_norm /
// (grad_norm + 1e-6)) (1 when max_grad_norm is 0), bias corrections 1 - beta^(step + 1),
// .step = step + 1, .seed = s->seed, .offset 0 (the caller's slice sets it).
adamw_params schedule_adamw(const schedule *s, int step, double grad_norm);
