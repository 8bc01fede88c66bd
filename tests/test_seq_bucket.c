// test_seq_bucket.c: a micro-batch padded to the backend's sequence bucket gives the same
// per-token losses and gradients as the same rows at their exact length (issue 11: a GPU
// backend rounds every micro-batch length up to a multiple of 64 so its GEMM shapes stay
// few; the padding carries target -100 and causal attention keeps it out of real tokens).
//
// On the CPU backend (fp32, the oracle), the bundled model data/model (4 layers, hidden 128,
// max_position_embeddings 512), each case builds B rows whose real lengths (number of
// targets) are given, compacts them with train_micro_batch_rows (the trainer's own
// function) once with seq_bucket 1 (exact) and once with seq_bucket 64, checks the returned
// lengths (rounded up, capped at seq_len) and the padding's targets (-100), runs forward and
// backward on both and compares:
//   - every real token's loss, and that every padded position's loss is 0
//   - the step's loss sum and the full fp32 gradient (every parameter)
// Lengths include 1, 63, 64, 65, 127, 128, mixed rows, and seq_len 300 (not a multiple of
// 64: 260 -> 300, the cap) and a full row. The rule past 512 positions (coarser steps past
// 1024) is checked on its own, as a table and over every length (check_rule).
//
// Tolerances, derived: padding changes no value a real token reads (causal attention; the
// rows' own ops are row-wise; padded rows have dlogits 0, so they add exact zeros to every
// gradient sum). What can change is the ORDER of fp32 summation: OpenBLAS picks its blocking
// and thread split from the matrix sizes, so a dot product over K terms or a gradient sum
// over N rows may be grouped differently. Two groupings of the same sum differ by at most
// 2 gamma_K sum|terms| with gamma_K ~ K u, u = 2^-24 = 6e-8; K <= 2048 (vocab) gives 1.2e-4
// worst case, ~sqrt(K) u = 3e-6 for random-signed terms. Through 4 layers the per-token loss
// (~1-8 nats) therefore may move by ~1e-5 relative at most in practice; we allow 1e-4 relative
// per token (and on the loss sum). The gradient is compared by NMSE: relative errors of ~1e-5
// give NMSE ~1e-10; we allow 1e-8. Measured here (printed): most cases bitwise equal, the worst
// (a 1-token row: N = 1 takes another BLAS path) token loss rel 6e-8 and gradient NMSE 3e-13.
// Bugs are far outside (measured by mutation): padded positions with a real target give
// loss sum rel 6e1 and gradient NMSE 3e3 (and fail the target and count checks); attention
// that lets a position see the next one changes a real token's loss by rel 7e-4 .. 4e-2 and
// the gradient by NMSE 1e-5 .. 0.7; rounding down instead of up drops real tokens (length,
// count, loss sum rel 1.5e-2, gradient NMSE 1.8e-2).
// Runtime: 7 s of CPU (20 s wall on the shared 2-core machine under load).
#include "attention_cudnn.h"
#include "ckpt.h"
#include "common.h"
#include "fsdp.h"
#include "test.h"
#include "train.h"

#define LOSS_REL 1e-4
#define GRAD_NMSE 1e-8
#define MAX_B 3

typedef struct {
    const char *name;
    int T;              // allocated sequence length (--seq_len)
    int B;
    int len[MAX_B];     // real targets of each row (positions 0 .. len-1 have a target)
    int want_used;      // expected bucketed length (bucket 64, capped at T)
} bucket_case;

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static int32_t rand_token(int V) {
    return (int32_t)(4 + test_rand(&rng) % (uint64_t)(V - 4));   // past the special ids
}

// Rows as the loader fills them: tokens of the game, then EOS (id 2); targets shifted by one
// and -100 after the game's last target.
static void fill_rows(const bucket_case *c, int V, int32_t *tok, int32_t *tgt) {
    for (int b = 0; b < c->B; b++) {
        int32_t *tk = tok + (size_t)b * c->T, *tg = tgt + (size_t)b * c->T;
        for (int t = 0; t < c->T; t++) tk[t] = t <= c->len[b] ? rand_token(V) : 2;
        for (int t = 0; t < c->T; t++)   // a full row's last target lies past the row
            tg[t] = t >= c->len[b] ? -100 : t + 1 < c->T ? tk[t + 1] : rand_token(V);
    }
}

typedef struct { double sum; int n; float *losses; float *grads; } run_out;

// One forward + backward of the compact rows at length `used`; fills *o (caller frees).
static int run_rows(model *m, fsdp_state *s, const int32_t *tok, const int32_t *tgt, int B, int used, int valid,
                    run_out *o) {
    unit_provider prov = fsdp_provider(s);
    double norm, acc_sum, acc_n;
    if (model_set_seq_len(m, used) || fsdp_zero_grads(s) || model_loss_reset(m) ||
        model_forward_backward(m, &prov, tok, tgt, 1, 1.0f / (float)valid, &o->sum, &o->n) ||
        fsdp_finish_grads(s, &norm) || model_loss_read(m, &acc_sum, &acc_n))
        return -1;
    // the device loss accumulator (what the training step reads) holds the host sum's bits
    EXPECT(memcmp(&acc_sum, &o->sum, sizeof acc_sum) == 0 && acc_n == o->n,
           "loss accumulator %.17g / %.0f vs the host sum %.17g / %d", acc_sum, acc_n, o->sum, o->n);
    o->losses = malloc((size_t)B * used * sizeof(float));
    o->grads = malloc(s->n_local * sizeof(float));
    memcpy(o->losses, m->losses_host, (size_t)B * used * sizeof(float));
    memcpy(o->grads, s->grads, s->n_local * sizeof(float));   // CPU backend: host memory
    return 0;
}

static void run_case(const bucket_case *c, const llama_config *cfg, const char *model_dir) {
    const backend *cpu = backend_cpu();
    backend bucketed = *cpu;   // the CPU backend, bucketing as the CUDA backend does
    bucketed.seq_bucket = 64;
    comm one;
    comm_init_single(&one, cpu);
    mem_tracker mem;
    mem_tracker_init(&mem, cpu);
    param_layout layout;
    model m;
    fsdp_state s;
    if (param_layout_init(&layout, cfg, fsdp_pad_multiple(1)) || model_init(&m, &layout, cpu, &mem, c->B, c->T, 0) ||
        fsdp_init(&s, &layout, cpu, &mem, &one, &one, 0) || ckpt_load_weights(&s, model_dir)) {
        EXPECT(0, "%s: setup: %s", c->name, ft_error_message());
        return;
    }
    const size_t BT = (size_t)c->B * c->T;
    int32_t *tok = malloc(BT * 4), *tgt = malloc(BT * 4);
    int32_t *etok = malloc(BT * 4), *etgt = malloc(BT * 4), *ptok = malloc(BT * 4), *ptgt = malloc(BT * 4);
    fill_rows(c, cfg->vocab_size, tok, tgt);
    int exact_T = 1, valid = 0;
    for (int b = 0; b < c->B; b++) {
        exact_T = c->len[b] > exact_T ? c->len[b] : exact_T;
        valid += c->len[b];
    }
    const int te = train_micro_batch_rows(cpu, tok, tgt, c->B, c->T, etok, etgt);
    const int tp = train_micro_batch_rows(&bucketed, tok, tgt, c->B, c->T, ptok, ptgt);
    EXPECT(te == exact_T, "%s: exact length %d, want %d", c->name, te, exact_T);
    EXPECT(tp == c->want_used, "%s: bucketed length %d, want %d", c->name, tp, c->want_used);
    int pad_ok = 1;
    for (int b = 0; b < c->B; b++)
        for (int t = 0; t < tp; t++) pad_ok &= ptgt[b * tp + t] == (t < c->len[b] ? tgt[b * c->T + t] : -100);
    EXPECT(pad_ok, "%s: the padded rows' targets are not the real ones followed by -100", c->name);

    run_out e = {0}, p = {0};
    if (run_rows(&m, &s, etok, etgt, c->B, te, valid, &e) || run_rows(&m, &s, ptok, ptgt, c->B, tp, valid, &p)) {
        EXPECT(0, "%s: model step: %s", c->name, ft_error_message());
    } else {
        double worst = 0;
        int pad_zero = 1;
        for (int b = 0; b < c->B; b++)
            for (int t = 0; t < tp; t++) {
                const float lp = p.losses[b * tp + t];
                if (t >= c->len[b]) { pad_zero &= lp == 0.0f; continue; }
                const float le = e.losses[b * te + t];
                const double r = fabs((double)lp - le) / fmax(fabs((double)le), 1e-30);
                worst = r > worst ? r : worst;
            }
        const double sum_rel = fabs(p.sum - e.sum) / e.sum;
        const double g = test_nmse(p.grads, e.grads, s.n_local);
        printf("  %-34s T_used %3d -> %3d: token loss worst rel %.1e, loss sum rel %.1e, gradient NMSE %.1e\n",
               c->name, te, tp, worst, sum_rel, g);
        EXPECT(e.n == valid && p.n == valid, "%s: %d / %d valid tokens, want %d", c->name, e.n, p.n, valid);
        EXPECT(worst <= LOSS_REL, "%s: a real token's loss differs by rel %.2e", c->name, worst);
        EXPECT(pad_zero, "%s: a padded position has a non-zero loss", c->name);
        EXPECT(sum_rel <= LOSS_REL, "%s: loss sum rel %.2e", c->name, sum_rel);
        EXPECT(g <= GRAD_NMSE, "%s: gradient NMSE %.2e", c->name, g);
    }
    free(e.losses); free(e.grads); free(p.losses); free(p.grads);
    free(tok); free(tgt); free(etok); free(etgt); free(ptok); free(ptgt);
    fsdp_free(&s);
    model_free(&m);
    param_layout_free(&layout);
}

// The bucket rule itself (backend_seq_len), past what the bundled model's 512 positions
// reach: a table of lengths, then over every length up to 16384 the properties the GPU
// relies on: the result covers the row (>= len, or the cap), is a multiple of 64 (tensor
// tiles) unless capped, grows with len, pads under 1/8 of the row past 1024, and the number
// of distinct lengths of a job stays within what the plan caches hold (ATTN_CUDNN_PLANS 128
// = 40 lengths x forward and backward at seq 8192, plus sampling's 40 forward plans).
static void check_rule(void) {
    backend b = *backend_cpu();
    b.seq_bucket = 64;
    static const struct { int len, cap, want; } t[] = {
        {1, 512, 64}, {64, 512, 64}, {65, 512, 128}, {450, 500, 500}, {1000, 8192, 1024},
        {1024, 8192, 1024}, {1025, 8192, 1152}, {2048, 8192, 2048}, {2049, 8192, 2304},
        {4000, 4096, 4096}, {4097, 8192, 4608}, {8191, 8192, 8192}, {3000, 3000, 3000},
        {16385, 32768, 18432},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        const int got = backend_seq_len(&b, t[i].len, t[i].cap);
        EXPECT(got == t[i].want, "rule: len %d cap %d -> %d, want %d", t[i].len, t[i].cap, got, t[i].want);
    }
    backend one = *backend_cpu();   // seq_bucket 1: exact
    EXPECT(backend_seq_len(&one, 1025, 8192) == 1025, "rule: seq_bucket 1 must trim exactly");
    static const struct { int cap, max_lengths; } jobs[] = {{512, 8}, {1024, 16}, {4096, 32}, {8192, 40}, {16384, 48}};
    for (size_t j = 0; j < sizeof jobs / sizeof jobs[0]; j++) {
        const int cap = jobs[j].cap;
        int prev = 0, distinct = 0, bad = 0, bad_r = 0, bad_prev = 0;
        for (int len = 1; len <= cap && !bad; len++) {
            const int r = backend_seq_len(&b, len, cap);
            if (!(r >= len && r <= cap && r >= prev && (r == cap || r % 64 == 0) && (len <= 1024 || 8 * (r - len) < len)))
                bad = len, bad_r = r, bad_prev = prev;
            distinct += r != prev;
            prev = r;
        }
        EXPECT(!bad, "rule: cap %d, len %d -> %d (previous length's %d)", cap, bad, bad_r, bad_prev);
        EXPECT(distinct <= jobs[j].max_lengths, "rule: cap %d gives %d lengths, want <= %d", cap, distinct,
               jobs[j].max_lengths);
        printf("  rule: seq_len %5d: %2d bucketed lengths\n", cap, distinct);
        // the cuDNN plan cache holds a job at seq 8192: a forward and a backward plan per
        // training length, and sampling's forward plans (another batch size) per length
        if (cap == 8192)
            EXPECT(3 * distinct <= ATTN_CUDNN_PLANS, "rule: seq 8192's %d lengths need %d attention plans, the cache "
                   "holds %d", distinct, 3 * distinct, ATTN_CUDNN_PLANS);
    }
}

int main(void) {
    check_rule();
    const char *dir = "data/model";
    llama_config cfg;
    char path[256];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (llama_config_load(&cfg, path)) {
        EXPECT(0, "open %s: %s", dir, ft_error_message());
        TEST_SUMMARY("test_seq_bucket");
    }
    static const bucket_case cases[] = {
        {"one row, 1 token", 512, 1, {1}, 64},
        {"one row, 63 tokens", 512, 1, {63}, 64},
        {"one row, 64 tokens (no padding)", 512, 1, {64}, 64},
        {"one row, 65 tokens", 512, 1, {65}, 128},
        {"one row, 127 tokens", 512, 1, {127}, 128},
        {"rows of 1, 63, 127 tokens", 512, 3, {1, 63, 127}, 128},
        {"rows of 128, 5 tokens", 512, 2, {128, 5}, 128},
        {"seq_len 300, rows of 260, 65", 300, 2, {260, 65}, 300},
        {"seq_len 300, a full row", 300, 1, {300}, 300},
        {"seq_len 100, rows of 70, 3, 99", 100, 3, {70, 3, 99}, 100},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], &cfg, dir);
    TEST_SUMMARY("test_seq_bucket");
}
