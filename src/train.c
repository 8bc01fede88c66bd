// train.c: the training job over the sharded state (see train.h).
//
// One optimizer step = total_batch_size rows of the epoch, split into micro-batches of
// batch_size_per_device rows: micro-batch a of data-parallel rank r takes rows
// row0 + (a * world + r) * B + [0, B). The set of rows in a step therefore does not depend on
// the world size or the per-device batch, and the loss is normalised by the number of valid
// target tokens of the whole step (counted before the forward), so single-rank, DDP, FSDP and
// HSDP runs compute the same step.
#include "train_job.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt.h"
#include "common.h"
#include "fp8_linear.h"
#include "fsutil.h"
#include "hf_checkpoint.h"
#include "hf_export.h"
#include "loader.h"
#include "mfu.h"
#include "out_dir.h"
#include "profile.h"
#include "sample.h"
#include "schedule.h"
#include "watchdog.h"

// ----------------------------------------------------------------------------
// signals: SIGTERM (Slurm before the time limit) and SIGINT save a checkpoint and stop

// The first stops the job at the next step boundary (or, after training, before the export or
// the next sampled game); a SIGINT after an earlier signal (Ctrl-C twice) ends the process at
// once: a save under way is lost (its temporary directory is removed by the next save), the
// checkpoints already published stay.
static volatile sig_atomic_t g_stop_signal;
static void on_signal(int sig) {
    if (sig == SIGINT && g_stop_signal) {
        static const char msg[] = "\nfinetune: SIGINT again: exiting now without saving (--resume latest continues from "
                                  "the last complete checkpoint)\n";
        const ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
        (void)w;
        signal(SIGINT, SIG_DFL);
        raise(SIGINT);
    }
    g_stop_signal = sig;
}

static void install_signal_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

// ----------------------------------------------------------------------------
// small helpers

// The emulated device's virtual clock (tests/cuda_emu, FT_EMU_VCLOCK): the host's virtual
// seconds, or -1 when it is off; absent from a real build (a weak reference, as backend_cuda.c's
// cuemu_* hooks), so the step timer reads the real clock there.
extern double cuemu_vclock_now(void) __attribute__((weak));

static double now_seconds(void) {
    if (cuemu_vclock_now) {
        const double v = cuemu_vclock_now();
        if (v >= 0) return v;
    }
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int train_micro_batch_rows(const backend *be, const int32_t *tokens, const int32_t *targets, int B, int T,
                           int32_t *rows_tok, int32_t *rows_tgt) {
    int used = 1;
    for (int b = 0; b < B; b++)
        for (int t = T - 1; t >= used; t--)
            if (targets[(size_t)b * T + t] != -100) { used = t + 1; break; }
    // columns [longest real length, used) are padding in every row: targets -100 already
    used = backend_seq_len(be, used, T);
    for (int b = 0; b < B; b++) {
        memcpy(rows_tok + (size_t)b * used, tokens + (size_t)b * T, (size_t)used * sizeof(int32_t));
        memcpy(rows_tgt + (size_t)b * used, targets + (size_t)b * T, (size_t)used * sizeof(int32_t));
    }
    return used;
}

// Micro-batch a of the step into the compact (B, T_used) buffers; returns T_used.
static int micro_batch(job *j, int a) {
    const int B = j->o->batch_size_per_device, T = j->o->seq_len;
    return train_micro_batch_rows(j->be, j->tokens + (size_t)a * B * T, j->targets + (size_t)a * B * T, B, T,
                                  j->rows_tok, j->rows_tgt);
}

// Validation loss over the first max_eval_docs validation games (all when 0). Every rank
// runs the same number of micro-batches (FSDP gathers are collective); missing rows are
// empty. *tokens_out = number of predicted tokens.
static int evaluate(job *j, double *loss_out, double *tokens_out) {
    const int B = j->o->batch_size_per_device, T = j->o->seq_len;
    uint64_t rows = loader_rows(&j->val);
    if (j->o->max_eval_docs > 0 && (uint64_t)j->o->max_eval_docs < rows) rows = (uint64_t)j->o->max_eval_docs;
    const uint64_t per_round = (uint64_t)B * j->world;
    TRY(model_loss_reset(&j->m));
    for (uint64_t base = 0; base < rows; base += per_round) {
        for (int b = 0; b < B; b++) {
            uint64_t r = base + (uint64_t)j->rank * B + b;
            int32_t *tok = j->tokens + (size_t)b * T, *tgt = j->targets + (size_t)b * T;
            if (r < rows) { if (loader_fill_row(&j->val, 0, r, tok, tgt) < 0) return -1; }
            else for (int t = 0; t < T; t++) { tok[t] = 0; tgt[t] = -100; }
        }
        int used = micro_batch(j, 0);
        TRY(model_set_seq_len(&j->m, used));
        TRY(model_forward_backward(&j->m, &j->prov, j->rows_tok, j->rows_tgt, 0, 0.0f, NULL, NULL));
    }
    double acc[2];   // the loss sum and the predicted tokens, read once (model_loss_read)
    TRY(model_loss_read(&j->m, &acc[0], &acc[1]));
    TRY(comm_all_reduce_f64(j->cc->world, acc, 2));
    if (acc[1] <= 0)   // every rank has the same sums: the same error everywhere
        return ft_error("%s: the %llu validation game(s) evaluated have no token to predict (a game needs at least 2 "
                        "tokens)", j->o->data_dir, (unsigned long long)rows);
    *loss_out = acc[0] / acc[1];
    *tokens_out = acc[1];
    return 0;
}

// ----------------------------------------------------------------------------
// setup and teardown

// The validation shards, and (training) the training shards with the steps they make. 0 / -1.
static int job_open_data(job *j) {
    const train_options *o = j->o;
    TRY(loader_open(&j->val, o->data_dir, "val", j->cfg.vocab_size, o->seq_len, 0, 0, 0));
    char msg[3 * FT_PATH_MAX + 400];   // shards of another tokenizer: trains, but say so
    if (is_main(j) && token_shard_tokenizer_differs(o->data_dir, o->model_dir, msg, sizeof msg))
        fprintf(stderr, "finetune: warning: %s\n", msg);
    char tok[FT_PATH_MAX];   // none at all: nothing to check the shards against, nothing to export
    if (is_main(j) && !o->eval_only && ft_path(tok, sizeof tok, "%s/tokenizer.json", o->model_dir) == 0 &&
        access(tok, R_OK) != 0)
        printf("finetune: note: %s: no tokenizer.json (%s): the shards' tokenizer cannot be checked against the "
               "model's, and the exports will hold no tokenizer.json\n", o->model_dir, strerror(errno));
    if (o->eval_only) {
        j->accum = 1;
        j->steps_per_epoch = 1;
        return 0;
    }
    TRY(loader_open(&j->train, o->data_dir, "train", j->cfg.vocab_size, o->seq_len, o->pack, 1, (uint64_t)o->seed));
    if (pack_per_game(o)) {   // a game's last token does not predict the next game's BOS
        if (j->cfg.bos_token_id < 0)
            return ft_error("flag --pack_attention per_game: %s/config.json has no bos_token_id (games are found by it)",
                            o->model_dir);
        // games are told apart by their BOS: shards tokenized without it would train as `row`
        // silently (no segment would ever start)
        const uint64_t n = loader_games(&j->train) < 64 ? loader_games(&j->train) : 64;
        for (uint64_t g = 0; g < n; g++)
            if (loader_game_len(&j->train, g) > 0 && loader_game_token(&j->train, g, 0) != j->cfg.bos_token_id)
                return ft_error("flag --pack_attention per_game: training game %llu of %s starts with token %d, not "
                                "%s/config.json's bos_token_id %d (games are told apart by it: tokenize with the "
                                "model's BOS)", (unsigned long long)g, o->data_dir,
                                (int)loader_game_token(&j->train, g, 0), o->model_dir, j->cfg.bos_token_id);
        loader_set_ignore_target(&j->train, j->cfg.bos_token_id);
    }
    uint64_t rows = loader_rows(&j->train);
    if (rows < (uint64_t)o->total_batch_size)
        return ft_error("%s: %llu training rows, fewer than one --total_batch_size of %d", o->data_dir,
                        (unsigned long long)rows, o->total_batch_size);
    j->steps_per_epoch = (int)(rows / (uint64_t)o->total_batch_size);
    j->total_steps = o->max_steps > 0 ? o->max_steps : o->epochs * j->steps_per_epoch;
    j->data_fp = loader_fingerprint(&j->train);
    return 0;
}

static trainer_state job_state(const job *j, int step);

// LoRA resume: the frozen base (model_dir, fingerprint j->base_fp) against the one the
// checkpoint's adapters were trained on (got->base_fingerprint). Another base is refused
// naming the checkpoint's trainer_state.json and --model_dir, unless --allow_other_base (then
// one warning on rank 0); a checkpoint that records none (saved before the field existed)
// resumes with a note on rank 0. Every rank decides alike (same files, same state). 0 / -1.
static int check_base(const job *j, const trainer_state *got) {
    const train_options *o = j->o;
    if (!j->lora || !j->start_dir[0] || got->base_fingerprint == j->base_fp) return 0;
    if (!got->base_fingerprint) {
        if (is_main(j))
            printf("finetune: note: %s/trainer_state.json records no base_fingerprint (an older checkpoint): "
                   "--model_dir %s is not checked against the base the adapters were trained on\n", j->start_dir,
                   o->model_dir);
        return 0;
    }
    char what[FT_PATH_MAX * 2 + 200];
    snprintf(what, sizeof what, "%s/trainer_state.json: --model_dir %s is not the base model these LoRA adapters were "
             "trained on (base fingerprint %016llx, the checkpoint's %016llx)", j->start_dir, o->model_dir,
             (unsigned long long)j->base_fp, (unsigned long long)got->base_fingerprint);
    if (!o->allow_other_base) return ft_error("%s; --allow_other_base trains them on it anyway", what);
    if (is_main(j)) fprintf(stderr, "finetune: warning: %s; continuing (--allow_other_base)\n", what);
    return 0;
}

// A resume on training shards other than the checkpoint's (got->data_fingerprint, when it
// records one): one warning on rank 0, not an error (a changed or extended dataset can be
// meant); the data order then continues at the checkpoint's row over the new rows.
static void check_data(const job *j, const trainer_state *got) {
    if (!j->start_dir[0] || !got->data_fingerprint || !j->data_fp || got->data_fingerprint == j->data_fp) return;
    if (is_main(j))
        fprintf(stderr, "finetune: warning: %s/trainer_state.json: the training shards of --data_dir %s are not the ones "
                "this checkpoint was trained on (data fingerprint %016llx, the checkpoint's %016llx); continuing, the "
                "data order resumes at the checkpoint's row over these shards\n", j->start_dir, j->o->data_dir,
                (unsigned long long)j->data_fp, (unsigned long long)got->data_fingerprint);
}

// A resume whose total steps (--max_steps, or --epochs over the rows) differ from the
// checkpoint's: one warning on rank 0, not an error (training longer is a common wish): the
// learning-rate schedule's warmup and decay are recomputed over the new total, so the rate
// changes at the resume step.
static void check_total_steps(const job *j, const trainer_state *got) {
    if (!j->start_dir[0] || j->o->eval_only || got->total_steps <= 0 || got->total_steps == j->total_steps) return;
    if (is_main(j))
        fprintf(stderr, "finetune: warning: %s/trainer_state.json: the checkpoint's run had %d steps in all, this one "
                "has %d: the learning-rate schedule is recomputed over %d steps, so the rate changes at step %d\n",
                j->start_dir, got->total_steps, j->total_steps, j->total_steps, got->step);
}

// A resume with other optimizer settings than the checkpoint's run (--learning_rate,
// --lr_schedule, --warmup_fraction, betas, eps, weight decay, clipping): one warning on rank
// 0 naming each change, not an error (a deliberate change is common). PyTorch users expect
// the optimizer's and scheduler's state_dict to bring them back; here the command line counts,
// so a requeue line edited by mistake would change the training without a word.
static void check_optimizer(const job *j, const trainer_state *got) {
    if (!j->start_dir[0] || j->o->eval_only || !is_main(j)) return;
    static const char *const flag[7] = {"--learning_rate", "--warmup_fraction", "--beta1", "--beta2", "--adam_eps",
                                        "--weight_decay", "--max_grad_norm"};
    const trainer_state now = job_state(j, 0);
    char changes[1024] = "";
    size_t len = 0;
    if (got->lr_schedule[0] && strcmp(got->lr_schedule, now.lr_schedule) != 0)
        len += (size_t)snprintf(changes + len, sizeof changes - len, ", --lr_schedule %s (the checkpoint's: %s)",
                                now.lr_schedule, got->lr_schedule);
    for (int k = 0; k < 7 && len < sizeof changes; k++)
        if (!isnan(got->opt[k]) && got->opt[k] != now.opt[k])
            len += (size_t)snprintf(changes + len, sizeof changes - len, ", %s %g (the checkpoint's: %g)", flag[k],
                                    now.opt[k], got->opt[k]);
    if (len)
        fprintf(stderr, "finetune: warning: %s/trainer_state.json: this run changes the optimizer's settings: %s; "
                "the resumed training uses this run's (the AdamW moments continue)\n", j->start_dir, changes + 2);
    if (got->pack_attention[0] && strcmp(got->pack_attention, now.pack_attention) != 0 && j->o->pack)
        fprintf(stderr, "finetune: warning: %s/trainer_state.json: this run changes --pack_attention to %s (the "
                "checkpoint's: %s): the same rows from here, another attention over them\n", j->start_dir,
                now.pack_attention, got->pack_attention);
}

// Resolve --resume into j->start_dir (once: job_load_start reads from it), then check that the
// checkpoint(s) the run will start from (that one, or model_dir's) fit config.json's layouts
// and this run (headers only, ckpt_check_start), and with LoRA that the base is the one the
// checkpoint's adapters were trained on (check_base: model_dir's fingerprint, into j->base_fp
// for the checkpoints this run saves); a resume on other training shards or over another
// number of steps is warned about (check_data, check_total_steps). 0 / -1.
static int check_start_weights(job *j) {
    j->start_dir[0] = '\0';
    if (j->o->resume[0]) TRY(ckpt_resolve(j->o->out_dir, j->o->resume, j->start_dir, sizeof j->start_dir));
    // a fresh start, also --resume auto's when nothing was saved: not over an earlier run's
    // export (a requeued auto job whose checkpoints were deleted would replace the result)
    if (!j->start_dir[0] && !j->o->eval_only) TRY(out_dir_check_fresh(j->o->out_dir, j->o->overwrite_out_dir));
    const trainer_state expect = job_state(j, 0);
    trainer_state got = expect;
    TRY(ckpt_check_start(j->o->model_dir, j->start_dir, &j->layout, j->lora ? &j->ll.layout : &j->layout, &expect,
                         &got));
    if (j->lora) TRY(hf_checkpoint_fingerprint(j->o->model_dir, &j->base_fp));
    TRY(check_base(j, &got));
    check_data(j, &got);
    check_optimizer(j, &got);
    check_total_steps(j, &got);
    return 0;
}

static int job_setup(job *j, const train_options *o, const train_comms *cc) {
    j->o = o;
    j->cc = cc;
    j->rank = cc->world->rank;
    j->world = cc->world->size;
    j->be = cc->world->be;
    if (o->profile) j->be = profile_backend(j->be);
    // (--fp8 above --profile: its quantisations and FP8 GEMMs timed as ops of their own, and
    // fp8_linear_unwrap's bf16 GEMMs still timed; one line when the device has no FP8)
    if (o->fp8) TRY(fp8_linear_backend(j->be, &j->be));
    mem_tracker_init(&j->mem, j->be);
    char path[FT_PATH_MAX];
    TRY(ft_path(path, sizeof path, "%s/config.json", o->model_dir));
    TRY(llama_config_load(&j->cfg, path));
    const plan_request req = train_plan_request(o, j->world, st_dtype_size(j->be->dtype));
    plan pl;   // validates the job, and chooses how gradients travel (what --dry_run plans)
    TRY(plan_compute(&pl, &j->cfg, &req));   // (--attention native past its head_dim: refused there)
    const int dmax = j->be->attention_max_head_dim ? j->be->attention_max_head_dim() : 0;
    if (dmax > 0 && j->cfg.head_dim > dmax)   // cuDNN attention did not start (its warning above)
        return ft_error("flag --attention cudnn: cuDNN attention did not start (the warning above) and the native "
                        "kernels that would replace it take head_dim up to %d, the model's is %d", dmax, j->cfg.head_dim);
    TRY(plan_check_host_memory(&pl, cc->local_size > 0 ? cc->local_size : 1));
    if (pl.fp8_bytes) TRY(fp8_linear_reserve(pl.fp8_bytes));   // (the arena's first buffer: the plan's line)
    j->accum = o->total_batch_size / (o->batch_size_per_device * j->world);

    TRY(param_layout_init(&j->layout, &j->cfg, fsdp_pad_multiple(cc->shard->size)));
    j->lora = req.lora.rank > 0;
    j->opt = j->lora ? &j->afs : &j->fs;
    if (j->lora) TRY(lora_layout_init(&j->ll, &j->cfg, &req.lora, fsdp_pad_multiple(cc->shard->size)));
    TRY(job_open_data(j));
    TRY(check_start_weights(j));   // before the model config.json describes is allocated
    j->aprov = fsdp_provider(&j->afs);   // (initialised below, after the model: the plan's order)
    // (--eval_only: the forward's buffers and the working parameters only, as planned)
    TRY(model_init_lora(&j->m, &j->layout, j->lora ? &j->ll : NULL, &j->aprov, j->be, &j->mem,
                        o->batch_size_per_device, o->seq_len, plan_model_buffers(&req),
                        fsdp_grads_f32((fsdp_grad_mode)pl.grad_mode, req.reduce_f32)));
    if (pack_per_game(o) && !o->eval_only) {
        model_set_segments(&j->m, j->cfg.bos_token_id);
        if (is_main(j) && strcmp(j->be->name, "cuda") == 0 && strcmp(o->attention, "cudnn") == 0)
            printf("finetune: note: --pack_attention per_game: attention in training and evaluation runs on the "
                   "native kernels (our cuDNN graphs are plain causal; sampling keeps cuDNN)\n");
    }
    fsdp_setup setup = {(fsdp_grad_mode)pl.grad_mode, j->lora ? FSDP_FROZEN : FSDP_TRAINED, o->offload_optimizer,
                        o->keep_params_gathered, req.reduce_f32, o->eval_only, req.moments_bf16};
    TRY(fsdp_init_role(&j->fs, &j->layout, j->be, &j->mem, cc->shard, cc->replica, &setup));
    setup.role = FSDP_ADAPTERS;
    if (j->lora) TRY(fsdp_init_role(&j->afs, &j->ll.layout, j->be, &j->mem, cc->shard, cc->replica, &setup));
    j->prov = fsdp_provider(&j->fs);
    if (o->profile) j->prov = profile_provider(&j->prov);

    if (o->sample_tokens > 0)
        TRY(sampler_open(&j->sampler, &j->fs, j->lora ? &j->ll : NULL, j->lora ? &j->aprov : NULL, &j->mem, &j->val,
                         o->model_dir, o->out_dir, j->cc->world, o->sample_tokens, o->sample_games,
                         &(sample_params){o->sample_temperature, o->sample_top_k, o->sample_top_p}));
    j->sched = (schedule){.learning_rate = o->learning_rate, .total_steps = j->total_steps,
                          .warmup_steps = schedule_warmup_steps(o->warmup_fraction, j->total_steps),
                          .beta1 = o->beta1, .beta2 = o->beta2, .eps = o->adam_eps, .weight_decay = o->weight_decay,
                          .max_grad_norm = o->max_grad_norm,
                          .seed = (uint32_t)o->seed};
    TRY(schedule_kind_parse(o->lr_schedule, &j->sched.kind));

    const size_t BT = (size_t)o->batch_size_per_device * o->seq_len;
    j->tokens = ft_malloc((size_t)j->accum * BT * sizeof(int32_t), "step tokens");
    j->targets = ft_malloc((size_t)j->accum * BT * sizeof(int32_t), "step targets");
    j->rows_tok = ft_malloc(BT * sizeof(int32_t), "micro-batch tokens");
    j->rows_tgt = ft_malloc(BT * sizeof(int32_t), "micro-batch targets");
    if (!j->tokens || !j->targets || !j->rows_tok || !j->rows_tgt) return -1;
    return 0;
}

static void job_teardown(job *j) {
    if (j->metrics) fclose(j->metrics);
    free(j->tokens);
    free(j->targets);
    free(j->rows_tok);
    free(j->rows_tgt);
    sampler_close(&j->sampler);
    loader_close(&j->train);
    loader_close(&j->val);
    fsdp_free(&j->afs);
    fsdp_free(&j->fs);
    model_free(&j->m);
    lora_layout_free(&j->ll);
    param_layout_free(&j->layout);
}

// ----------------------------------------------------------------------------
// one optimizer step

// bytes this rank sent in data collectives, by kind, over its shard and replica groups
static void comm_bytes(const train_comms *cc, size_t *ag, size_t *rs, size_t *ar) {
    *ag = cc->shard->bytes_sent[COMM_ALL_GATHER];
    *rs = cc->shard->bytes_sent[COMM_REDUCE_SCATTER];
    *ar = cc->replica->bytes_sent[COMM_ALL_REDUCE] + (cc->replica != cc->shard ? cc->shard->bytes_sent[COMM_ALL_REDUCE] : 0);
}

static int train_step(job *j, int step, step_stats *st) {
    const train_options *o = j->o;
    const int B = o->batch_size_per_device, T = o->seq_len;
    const double t0 = now_seconds();
    profile_step_begin();
    watchdog_set_phase("step %d", step + 1);
    size_t ag0, rs0, ar0;
    comm_bytes(j->cc, &ag0, &rs0, &ar0);
    const int epoch = step / j->steps_per_epoch;
    const uint64_t row0 = (uint64_t)(step % j->steps_per_epoch) * (uint64_t)o->total_batch_size;

    // this rank's rows, and the valid-token count of the whole step (for the loss scale)
    double counts[1] = {0};
    for (int a = 0; a < j->accum; a++)
        for (int b = 0; b < B; b++) {
            uint64_t r = row0 + ((uint64_t)a * j->world + j->rank) * B + b;
            size_t off = ((size_t)a * B + b) * T;
            int n = loader_fill_row(&j->train, epoch, r, j->tokens + off, j->targets + off);
            if (n < 0) return -1;
            counts[0] += n;
        }
    TRY(comm_all_reduce_f64(j->cc->world, counts, 1));
    if (counts[0] <= 0) return ft_error("step %d: the batch has no target tokens", step + 1);
    const float dloss = (float)(1.0 / counts[0]);

    TRY(fsdp_zero_grads(j->opt));
    // no clipping: the layers' AdamW may start in the last backward. (A step whose norm then
    // proves non-finite has updated those layers already: the job stops below and saves
    // nothing; a "skip the bad step" path would need the update held back.)
    if (o->max_grad_norm == 0) {
        const adamw_params early = schedule_adamw(&j->sched, step, 0.0);
        fsdp_update_early(j->opt, &early);
    }
    double used_sum = 0;
    TRY(model_loss_reset(&j->m));   // the micro-batches' losses add up on the device
    for (int a = 0; a < j->accum; a++) {
        int used = micro_batch(j, a);
        used_sum += used;
        fsdp_set_micro_batch(j->opt, a == 0, a == j->accum - 1);
        TRY(model_set_seq_len(&j->m, used));
        // TEST-ONLY (tests/test_watchdog.sh): FT_TEST_STOP_AT_STEP=N stops world rank 1 (SIGSTOP
        // to itself) as step N's first forward begins, past the step's host all-reduce: the
        // other ranks then queue a whole micro-batch of device work behind their first gather
        if (a == 0 && step + 1 == j->test_stop_step) raise(SIGSTOP);
        TRY(model_forward_backward(&j->m, &j->prov, j->rows_tok, j->rows_tgt, 1, dloss, NULL, NULL));
        if (is_main(j) && isatty(STDOUT_FILENO)) {
            printf("\rstep %d/%d: micro-batch %d/%d", step + 1, j->total_steps, a + 1, j->accum);
            fflush(stdout);
        }
    }
    double norm;
    profile_set_phase(PROF_OPTIMIZER);
    profile_comm_begin();
    TRY(fsdp_finish_grads(j->opt, &norm));
    profile_comm_end();
    if (!isfinite(norm)) return ft_error("step %d: gradient norm is %g (diverged); lower --learning_rate", step + 1, norm);
    const adamw_params ap = schedule_adamw(&j->sched, step, norm);
    TRY(fsdp_optimizer_step(j->opt, &ap));
    // the step's one read of the loss (the micro-batches' sums added on the device in order),
    // after everything is queued: the host waits for the device here
    double sums[2], valid;
    TRY(model_loss_read(&j->m, &sums[0], &valid));
    sums[1] = used_sum;
    TRY(comm_all_reduce_f64(j->cc->world, sums, 2));
    st->loss = sums[0] / counts[0];
    if (!isfinite(st->loss))
        return ft_error("step %d: the training loss is %s (diverged); lower --learning_rate", step + 1,
                        isnan(st->loss) ? "NaN" : "infinite");
    st->norm = norm;
    st->lr = schedule_lr(&j->sched, step);
    st->tokens = counts[0];
    st->avg_T = sums[1] / ((double)j->accum * j->world);
    st->secs = now_seconds() - t0;
    size_t ag1, rs1, ar1;
    comm_bytes(j->cc, &ag1, &rs1, &ar1);
    st->gather_bytes = ag1 - ag0;
    st->rs_bytes = rs1 - rs0;
    st->ar_bytes = ar1 - ar0;
    return 0;
}

// ----------------------------------------------------------------------------
// the job

// The trainer state after `step` optimizer steps (what a checkpoint saved then records).
static trainer_state job_state(const job *j, int step) {
    const train_options *o = j->o;
    trainer_state ts = {
        .step = step, .epoch = step / j->steps_per_epoch,
        .row = (uint64_t)(step % j->steps_per_epoch) * (uint64_t)o->total_batch_size, .seed = o->seed,
        .total_batch_size = o->total_batch_size, .seq_len = o->seq_len, .pack = o->pack,
        .total_steps = j->total_steps, .n_params = (long long)(j->lora ? &j->ll.layout : &j->layout)->n_params,
        .lora_rank = o->lora_rank, .lora_targets = o->lora_rank ? (int)o->lora_target_mask : 0,
        .lora_alpha = o->lora_rank ? o->lora_alpha : 0, .base_fingerprint = j->lora ? j->base_fp : 0,
        .data_fingerprint = j->data_fp,
        .opt = {o->learning_rate, o->warmup_fraction, o->beta1, o->beta2, o->adam_eps, o->weight_decay,
                o->max_grad_norm},
        .eval_only = o->eval_only,
    };
    snprintf(ts.lr_schedule, sizeof ts.lr_schedule, "%s", o->lr_schedule);
    snprintf(ts.pack_attention, sizeof ts.pack_attention, "%s", o->pack_attention);
    return ts;
}

// While ranks move many bytes on their own (world rank 0 alone writes a checkpoint or an
// export; each rank reads its part of one), the others wait for them in their collectives:
// the deadline grows by the time `bytes` take at the slowest rate granted
// (WATCHDOG_MIN_WRITE_BPS), named `who` ... `what` in a timeout's line. Reset with
// watchdog_set_grace(0, NULL).
static void grace_for_io(double bytes, const char *who, const char *what) {
    char why[96], size[32];
    watchdog_format_bytes(size, sizeof size, (size_t)bytes);
    snprintf(why, sizeof why, "%s the %s, %s", who, what, size);
    watchdog_set_grace(bytes / WATCHDOG_MIN_WRITE_BPS, why);
}
static void grace_for_write(double bytes, const char *what) { grace_for_io(bytes, "rank 0 writing", what); }

// trained parameters: the full model's, or with LoRA the adapters'
static double trained_params(const job *j) { return (double)(j->lora ? &j->ll.layout : &j->layout)->n_params; }

// The seconds a stop signal leaves before the time limit under Slurm: slurm/*.sbatch's
// --signal=TERM@300, or FT_SIGNAL_MARGIN_S for a job submitted with another margin.
#define SLURM_SIGNAL_MARGIN_S 300

// Under Slurm, once: a step plus a checkpoint that do not fit in the signal's margin (a
// SIGTERM's checkpoint would be SIGKILLed at the time limit; the run would continue from the
// last periodic one). Rank 0.
static void warn_signal_margin(double step_secs, double save_secs, const char *size) {
    static int warned;
    const char *env = ft_getenv("FT_SIGNAL_MARGIN_S");
    if (env && !(atof(env) > 0)) env = NULL;   // (not a positive number: the scripts' margin)
    const double margin = env ? atof(env) : SLURM_SIGNAL_MARGIN_S;
    if (warned || !getenv("SLURM_JOB_ID") || step_secs + save_secs <= margin) return;
    warned = 1;
    const int want = 60 * (int)ceil(1.5 * (step_secs + save_secs) / 60);
    fprintf(stderr, "finetune: warning: a step (%.1f s) and a checkpoint (%s in %.1f s) take longer than the %g s "
            "a stop signal leaves before Slurm's time limit (%s): a SIGTERM's checkpoint would not finish; submit "
            "with sbatch --signal=TERM@%d and FT_SIGNAL_MARGIN_S=%d, or write --out_dir to faster storage\n", step_secs,
            size, save_secs, margin, env ? "FT_SIGNAL_MARGIN_S" : "slurm/*.sbatch's --signal=TERM@300", want, want);
}

// step_secs: the last step's seconds (for the margin's warning)
static int save_checkpoint(job *j, int step, double step_secs) {
    watchdog_set_phase("checkpoint at step %d", step);
    const trainer_state ts = job_state(j, step);
    const double bytes = 12 * trained_params(j);   // fp32 weights + two fp32 AdamW moments
    grace_for_write(bytes, "checkpoint");
    const double t0 = now_seconds();
    int rc = agree(j, ckpt_save(j->o->out_dir, j->o->model_dir, j->opt, &ts, j->rank, j->o->save_total_limit));
    const double secs = now_seconds() - t0;
    watchdog_set_grace(0, NULL);
    if (rc != 0) return rc;
    if (is_main(j)) {
        char size[32];
        watchdog_format_bytes(size, sizeof size, (size_t)bytes);
        printf("checkpoint: %s/checkpoints/step_%08d (%s in %.1f s, %.0f MB/s)\n", j->o->out_dir, step, size, secs,
               bytes / 1e6 / (secs > 1e-3 ? secs : 1e-3));
        warn_signal_margin(step_secs, secs, size);
    }
    return 0;
}

static int eval_and_log(job *j, int step) {
    watchdog_set_phase("eval at step %d", step);
    double loss = 0, ntok = 0, t0 = now_seconds();
    TRY(evaluate(j, &loss, &ntok));
    // (every rank has the all-reduced loss: the same error everywhere; nothing non-finite
    // reaches metrics.jsonl, whose readers take JSON, which has no NaN)
    if (!isfinite(loss))
        return ft_error("eval at step %d: the validation loss is %s: the model's logits are not finite (%s)", step,
                        isnan(loss) ? "NaN" : "infinite",
                        step > 0 ? "training diverged: lower --learning_rate" : "check the weights in --model_dir");
    job_log_eval(j, step, loss, ntok, now_seconds() - t0);
    if (j->n_evals++ == 0) j->val_first = loss;
    j->val_last = loss;
    return 0;
}

// LoRA: the frozen base from model_dir; the adapters from checkpoint `dir`, or (dir "") PEFT's
// initialisation (lora_init_unit, seeded by --seed) with zero moments. 0 / -1.
static int lora_load_start(job *j, const char *dir, const trainer_state *expect, trainer_state *got) {
    TRY(ckpt_load_weights(&j->fs, j->o->model_dir));
    if (dir[0]) return ckpt_load_start(&j->afs, j->o->model_dir, dir, expect, got);
    *got = *expect;
    float *unit = ft_malloc(j->afs.max_unit * sizeof(float), "adapter unit");   // (max_unit,)
    if (!unit) return -1;
    int rc = 0;
    for (int u = 0; u < j->ll.layout.n_units && rc == 0; u++) {
        lora_init_unit(&j->ll, u, (uint64_t)j->o->seed, unit);
        rc = fsdp_set_unit(&j->afs, FSDP_MASTER, u, unit);
    }
    free(unit);
    return rc == 0 ? fsdp_zero_moments(&j->afs) : -1;
}

// The weights to start from (pretrained, or --resume's checkpoint) and the first step;
// agreed by every rank.
static int job_load_start(job *j, int *start) {
    const train_options *o = j->o;
    const char *dir = j->start_dir;   // resolved by check_start_weights
    watchdog_set_phase("loading");
    int rc = o->eval_only ? 0 : fs_mkdirs(o->out_dir);   // fail before any work if unwritable
    const trainer_state expect = job_state(j, 0);
    trainer_state got = expect;
    // a rank that fails early waits in the agreement for the others still reading: what one
    // rank reads is its slice (1/S) of the weights (and the checkpoint's moments) and 1/W of
    // them whole for the checksums; 4 bytes per weight bounds a pretrained model's dtype
    const double S = j->cc->shard->size, W = j->world;
    const double ck = o->eval_only ? 4.0 : 12.0;   // fp32 weights (+ two moments, not read by --eval_only)
    const double bytes =
        (j->lora || !dir[0] ? 4.0 * (double)j->layout.n_params : 0) + (dir[0] ? ck * trained_params(j) : 0);
    grace_for_io(bytes * (1 / S + 1 / W), "each rank reading its part of", dir[0] ? "checkpoint" : "model");
    if (rc == 0) rc = j->lora ? lora_load_start(j, dir, &expect, &got) : ckpt_load_start(&j->fs, o->model_dir, dir, &expect, &got);
    rc = agree(j, rc);
    watchdog_set_grace(0, NULL);
    if (rc != 0) return rc;
    *start = got.step;
    if (*start > 0 && is_main(j)) printf("finetune: resumed from %s at step %d\n", dir, *start);
    else if (!dir[0] && strcmp(o->resume, "auto") == 0 && is_main(j))
        printf("finetune: --resume auto: no checkpoint in %s/checkpoints yet, starting fresh\n", o->out_dir);
    return 0;
}

// Optimizer steps from `start` until the total or a stop request (a signal on any rank, or
// --stop_at_step), with evaluations and checkpoints on their schedules. *step = steps done.
// Resumed at or past --stop_at_step (the stopped job's command line again), it trains nothing.
// Every attention plan the step loop can need, built before step 1 on every rank (a plan built
// mid-step stalls its rank while the others wait at the next collective): each bucketed length
// up to --seq_len at the micro-batch size, forward and backward; evaluation runs the same
// shapes. Sampling (--sample_tokens) runs its own batch size and builds its plans after the step
// loop. TEST-ONLY FT_TEST_LAZY_ATTN_PLANS=1 skips this (plans then build on first use).
static int prepare_attention(job *j) {
    if (!j->be->attention_prepare || pack_per_game(j->o) || ft_getenv("FT_TEST_LAZY_ATTN_PLANS")) return 0;
    const llama_config *c = &j->cfg;
    const double t0 = now_seconds();
    watchdog_set_phase("building attention plans");
    int built, grown;
    TRY(j->be->attention_prepare(j->o->batch_size_per_device, j->o->seq_len, c->num_attention_heads,
                                 c->num_key_value_heads, c->head_dim, &built, &grown));
    if (is_main(j) && grown)
        printf("finetune: the attention plan cache grows to %d plans to hold every sequence bucket\n", grown);
    if (is_main(j) && built)
        printf("finetune: built %d attention plans (every sequence bucket up to %d, forward and backward) in %.2f s\n",
               built, j->o->seq_len, now_seconds() - t0);
    return 0;
}

// Attention plans built and evicted since this run's first step (rank 0 prints them; none
// expected: prepare_attention built them all). `first`: the first step just ended.
static void plan_counts_after_step1(job *j, int first) {
    long now[2] = {0, 0};
    if (!j->be->attention_plan_counts) return;
    j->be->attention_plan_counts(&now[0], &now[1]);
    if (first) memcpy(j->plans_after_step1, now, sizeof now);
    else if (is_main(j))
        printf("finetune: attention plans after step 1: %ld built, %ld evicted\n", now[0] - j->plans_after_step1[0],
               now[1] - j->plans_after_step1[1]);
}

static int job_train(job *j, int start, int *step_out, int *stopped) {
    const train_options *o = j->o;
    double time_sum = 0;
    int timed = 0, step = start, rc;
    *stopped = o->stop_at_step > 0 && start >= o->stop_at_step && start < j->total_steps;
    *step_out = start;
    j->run_start = start;
    if (*stopped) {
        if (is_main(j))
            printf("finetune: stopping at step %d (resumed at or past --stop_at_step %d): no step to train; continue "
                   "without --stop_at_step or with a later one\n", start, o->stop_at_step);
        return 0;
    }
    if (start < j->total_steps) TRY(prepare_attention(j));   // (a finished run resumed trains nothing)
    if (start == 0) TRY(eval_and_log(j, 0));
    const char *stop_env = ft_getenv("FT_TEST_STOP_AT_STEP");   // (test-only: train_step)
    j->test_stop_step = stop_env && j->rank == 1 ? atoi(stop_env) : -1;
    while (step < j->total_steps) {
        step_stats st = {0};
        TRY(train_step(j, step, &st));
        if (step == start) plan_counts_after_step1(j, 1);
        j->run_tokens += st.tokens;
        j->run_secs += st.secs;
        if (step > start) { time_sum += st.secs; timed++; }   // the first step warms up
        job_log_step(j, step, &st, timed ? time_sum / timed : st.secs);
        step++;
        char after[48];
        snprintf(after, sizeof after, "after step %d", step);
        if ((rc = job_out_dir_still_there(j, after)) != 0) return rc;
        // a signal (the scheduler's warning before its time limit) is agreed before the step's
        // evaluation, which it skips: the margin it leaves is for the checkpoint, not for an
        // evaluation of the whole validation set
        double flag[1] = {g_stop_signal ? 1.0 : 0.0};
        TRY(comm_all_reduce_f64(j->cc->world, flag, 1));
        const int eval_due = o->eval_every > 0 && step % o->eval_every == 0 && step < j->total_steps;
        if (eval_due && flag[0] > 0 && is_main(j))
            printf("finetune: skipping the evaluation at step %d (signal received: the checkpoint first)\n", step);
        else if (eval_due) TRY(eval_and_log(j, step));
        *stopped = flag[0] > 0 || (o->stop_at_step > 0 && step >= o->stop_at_step);
        if ((o->save_every > 0 && step % o->save_every == 0) || *stopped || step == j->total_steps)
            if ((rc = save_checkpoint(j, step, st.secs)) != 0) {
                // the last step's checkpoint (12 bytes per trained parameter) failed, a full
                // disk say: the export (2) may still fit, and is the run's result; every rank
                // knows (an agreed failure: the same path on all), job_finish fails after it
                if (step < j->total_steps || *stopped || (j->world > 1 && !*j->failure_agreed)) return rc;
                j->final_save_rc = rc;
                snprintf(j->final_save_error, sizeof j->final_save_error, "%s", ft_error_message());
                ft_error_clear();
                *j->failure_agreed = 0;   // (a later failure of one rank alone must still end the job)
                if (is_main(j))
                    printf("finetune: the checkpoint of the last step failed (the error follows at the end); "
                           "writing the export\n");
            }
        if (*stopped) {
            if (is_main(j))
                printf("finetune: stopping after step %d (%s); continue with --resume latest\n", step,
                       flag[0] > 0 ? "signal received" : "--stop_at_step");
            break;
        }
    }
    *step_out = step;
    if (step > start) plan_counts_after_step1(j, 0);   // (its baseline was taken at the first step)
    return 0;
}

// --eval_only: the evaluation, then (rank 0) the loss exactly (%a: runs compared bitwise) and
// the peak memory, per category in bytes too (tests/test_plan.sh compares them with the plan).
static int eval_only(job *j, int step) {
    TRY(eval_and_log(j, step));
    if (!is_main(j)) return 0;
    printf("finetune: eval only: val loss exactly %a\n", j->val_last);
    job_print_peak_memory(j);
    printf("finetune: peak bytes:");
    for (int c = 0; c < MEM_CATEGORY_COUNT; c++) printf(" %s %zu", mem_category_name((mem_category)c), j->mem.peak[c]);
    printf(" total %zu\n", j->mem.peak_total);
    return 0;
}

// After the last step: the final evaluation, the Hugging Face export, samples, the memory report.
// A stop signal on any rank (collective). *stop = 1 when one was received.
static int stop_requested(job *j, int *stop) {
    double flag[1] = {g_stop_signal ? 1.0 : 0.0};
    TRY(comm_all_reduce_f64(j->cc->world, flag, 1));
    *stop = flag[0] > 0;
    return 0;
}

static int job_finish(job *j, int step) {
    const train_options *o = j->o;
    char path[FT_PATH_MAX];
    int rc, stop;
    TRY(eval_and_log(j, step));
    // the checkpoint at `step` is saved: a signal now skips the rest (--resume latest redoes it)
    TRY(stop_requested(j, &stop));
    if (stop) {
        if (is_main(j) && !j->final_save_rc)
            printf("finetune: stopping before the export (signal received); the checkpoint of step %d is saved: "
                   "--resume latest writes the export%s\n", step, o->sample_tokens > 0 ? " and the samples" : "");
        return 0;
    }
    if ((rc = job_out_dir_still_there(j, "before the export")) != 0) return rc;
    TRY(ft_path(path, sizeof path, "%s/final", o->out_dir));
    watchdog_set_phase("export");
    const double dtype_bytes = strcmp(o->save_dtype, "fp32") == 0 ? 4 : 2;
    grace_for_write(dtype_bytes * trained_params(j), "export");
    if (j->lora) rc = agree(j, hf_export_peft(path, o->model_dir, &j->afs, &j->ll, o->save_dtype, j->rank));
    else rc = agree(j, hf_export_model(path, o->model_dir, &j->fs, o->save_dtype, j->rank));
    watchdog_set_grace(0, NULL);
    if (rc != 0) return rc;
    j->exported = 1;
    if (is_main(j))
        printf("finetune: exported %s (%s, %s)\n", path, j->lora ? "PEFT LoRA adapter" : "Hugging Face layout",
               o->save_dtype);
    if (o->merge_lora) {
        snprintf(path, sizeof path, "%s/final_merged", o->out_dir);
        grace_for_write(dtype_bytes * (double)j->layout.n_params, "merged export");
        rc = agree(j, hf_export_merged(path, o->model_dir, &j->layout, &j->afs, &j->ll, o->save_dtype, j->rank));
        watchdog_set_grace(0, NULL);
        if (rc != 0) return rc;
        if (is_main(j)) printf("finetune: exported %s (the base with the adapters merged, Hugging Face layout, %s)\n",
                               path, o->save_dtype);
    }
    watchdog_set_phase("sampling");
    for (int g = 0; o->sample_tokens > 0 && g < o->sample_games; g++) {
        TRY(stop_requested(j, &stop));
        if (stop) {
            if (is_main(j))
                printf("finetune: stopping after %d of %d sampled games (signal received); the export is complete, "
                       "--resume latest samples again\n", g, o->sample_games);
            return 0;
        }
        if ((rc = job_out_dir_still_there(j, "while sampling")) != 0) return rc;
        TRY(sampler_continue(&j->sampler, g, (uint64_t)o->seed));
    }
    if (is_main(j)) {
        job_print_peak_memory(j);
        job_print_run_summary(j, step);
    }
    return 0;
}

// The run's status when the last step's checkpoint failed (job_train), after job_finish
// returned rc: that failure, with what became of the export. Every rank ends in failure; when
// job_finish itself went well on all, that is agreed (no rank waits for the others).
static int final_save_failed(job *j, int rc) {
    const char *was = j->final_save_error;
    if (rc == 0) *j->failure_agreed = 1;
    if (j->final_save_rc == COMM_PEER_FAILED) {   // (the rank whose save failed prints the line)
        if (rc != 0) return rc;                    // a failure of its own since (-1: it prints it)
        ft_error("%s", was);
        return COMM_PEER_FAILED;
    }
    if (rc == 0 && !j->exported)   // (a stop signal before the export)
        return ft_error("%s; stopped before the export (signal received): nothing of the last steps was saved", was);
    if (rc == 0)
        return ft_error("%s; the export in %s/final was written after it", was, j->o->out_dir);
    char then[512];
    snprintf(then, sizeof then, "%s", ft_error_message());
    ft_error_clear();
    if (j->exported) return ft_error("%s; the export in %s/final was written, then: %s", was, j->o->out_dir, then);
    return ft_error("%s; then the export: %s", was, then);
}

static int run(job *j) {
    job_print_summary(j);
    int start, step, stopped, rc;
    if ((rc = job_load_start(j, &start)) != 0) return rc;
    if (j->o->eval_only) return eval_only(j, start);
    if ((rc = job_open_outputs(j, start)) != 0) return rc;
    install_signal_handlers();
    if ((rc = job_train(j, start, &step, &stopped)) != 0) return rc;
    rc = stopped ? 0 : job_finish(j, step);
    return j->final_save_rc ? final_save_failed(j, rc) : rc;
}

int train_shard_size(const train_options *o, int W) { return o->no_fsdp ? 1 : o->dp_shard > 0 ? o->dp_shard : W; }

plan_request train_plan_request(const train_options *o, int W, size_t elem_bytes) {
    return (plan_request){
        .world_size = W, .shard_size = train_shard_size(o, W), .batch_size_per_device = o->batch_size_per_device,
        // --eval_only takes no optimizer step: one micro-batch, whatever --total_batch_size says
        .seq_len = o->seq_len, .total_batch_size = o->eval_only ? o->batch_size_per_device * W : o->total_batch_size,
        .gradient_checkpointing = o->gradient_checkpointing, .accumulate_grads_locally = o->accumulate_grads_locally,
        .keep_params_gathered = o->keep_params_gathered, .reduce_f32 = strcmp(o->reduce_dtype, "fp32") == 0,
        .elem_bytes = elem_bytes, .mfu_benchmark = o->peak_tflops <= 0 && !o->eval_only,   // (measured for training)
        .eval_only = o->eval_only,
        .lora = {o->lora_rank, (float)o->lora_alpha, o->lora_rank ? o->lora_target_mask : 0},
        .offload_optimizer = o->offload_optimizer, .moments_bf16 = strcmp(o->optimizer_moments, "bf16") == 0,
        .attention_cudnn = elem_bytes == 2 && strcmp(o->attention, "cudnn") == 0,
        .attention_segments = elem_bytes == 2 && pack_per_game(o) && !o->eval_only,
        .deterministic = o->deterministic,
        .nccl_comm_bytes = (size_t)(o->nccl_gib_per_comm * 1073741824.0),
        .row_tokens = o->dry_run_row_tokens, .gpus_per_node = o->dry_run_gpus_per_node,
        .fabric_intra_busbw = o->fabric_intra_gbps * 1e9, .fabric_inter_busbw = o->fabric_inter_gbps * 1e9,
        .sample_seq = o->sample_tokens > 0 ? SAMPLE_PROMPT_TOKENS + o->sample_tokens : 0,
        .fp8 = o->fp8 && elem_bytes == 2,
    };
}

int train_run(const train_options *o, const train_comms *cc, int *failure_agreed) {
    job j;
    memset(&j, 0, sizeof j);
    *failure_agreed = 0;
    j.cc = cc;
    j.failure_agreed = failure_agreed;
    j.out_lock = -1;
    j.out_dir_fd = -1;
    // one job per --out_dir (rank 0 holds its lock until the end), taken before anything in
    // it is read (--resume latest) or written
    int rc = agree(&j, !o->eval_only && cc->world->rank == 0 ? fs_lock_dir(o->out_dir, "--out_dir", &j.out_lock,
                                                                            &j.out_created) : 0);
    if (rc == 0 && !o->eval_only && cc->world->rank == 0)   // check_out_dir's reference (-1: unchecked)
        j.out_dir_fd = open(o->out_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (rc == 0 && !o->eval_only && cc->world->size > 1)   // (rank 0's lock: its own check)
        rc = agree(&j, out_dir_check_shared(o->out_dir, cc->world->rank == 0 && j.out_lock >= 0, cc->world));
    if (rc == 0) rc = agree(&j, job_setup(&j, o, cc));
    if (rc == 0) rc = run(&j);
    job_teardown(&j);
    // a directory this failed job created: gone if empty (not one made in its place)
    const int ours = j.out_dir_fd < 0 || fs_still_at(j.out_dir_fd, o->out_dir, NULL, 0);
    fs_unlock_dir(o->out_dir, j.out_lock, rc != 0 && j.out_created && ours);
    if (j.out_dir_fd >= 0) close(j.out_dir_fd);
    return rc;
}
