// train_log.c: what the training job prints and records: its opening and closing lines, a
// line and a metrics.jsonl record per step and per evaluation (metrics.jsonl rewound on a
// resume), and the watch on --out_dir (see train_job.h).
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "fp8_linear.h"
#include "fsutil.h"
#include "mfu.h"
#include "out_dir.h"
#include "profile.h"
#include "train_job.h"

// ----------------------------------------------------------------------------
// lines and records

static void format_eta(char *buf, size_t n, double secs) {
    long s = (long)(secs + 0.5);
    if (s >= 3600) snprintf(buf, n, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
    else snprintf(buf, n, "%ld:%02ld", s / 60, s % 60);
}

// Append one record (a whole line) to rank 0's metrics.jsonl. A failed write (a full disk)
// does not stop training: one warning, the first time, and the file is cut back to its last
// complete record (a part written before the failure would otherwise glue the next record to
// it, mid-file), so the next record starts a line of its own; when even that fails, no more
// records are written this run. TEST-ONLY: FT_TEST_METRICS_TEAR=N writes half of the N-th
// record and fails it, as a disk that filled up mid-record would (tests/test_train.sh).
static void metrics_put(job *j, const char *rec) {
    FILE *f = j->metrics;
    if (!f) return;
    const size_t n = strlen(rec);
    const char *tear = ft_getenv("FT_TEST_METRICS_TEAR");
    const int torn = tear && ++j->metrics_records == atoi(tear);
    int e = ENOSPC;
    if (!torn && fwrite(rec, 1, n, f) == n && fflush(f) == 0) {
        j->metrics_ok = ftell(f);
        return;
    }
    if (torn) {
        (void)!fwrite(rec, 1, n / 2, f);
        fflush(f);
    } else e = errno;
    if (!j->metrics_failed)
        fprintf(stderr, "finetune: warning: %s/metrics.jsonl: writing failed (%s); training goes on, records that "
                "cannot be written are lost\n", j->o->out_dir, strerror(e));
    j->metrics_failed = 1;
    clearerr(f);
    if (j->metrics_ok < 0 || ftruncate(fileno(f), j->metrics_ok) != 0 || fseek(f, j->metrics_ok, SEEK_SET) != 0) {
        fclose(f);   // cannot cut back: stop here rather than glue records together
        j->metrics = NULL;
    }
}

void job_log_eval(job *j, int step, double loss, double ntok, double secs) {
    if (!is_main(j)) return;
    printf("eval  step %d | val loss %.6f | perplexity %.2f | %.0f tokens | %.1f s\n", step, loss, exp(loss), ntok, secs);
    char rec[256];
    // val_loss_exact: the double itself (%a), for comparing runs bitwise (tests/test_train.sh)
    snprintf(rec, sizeof rec, "{\"type\":\"eval\",\"step\":%d,\"val_loss\":%.6f,\"tokens\":%.0f,"
             "\"val_loss_exact\":\"%a\"}\n", step, loss, ntok, loss);
    metrics_put(j, rec);
}

// ----------------------------------------------------------------------------
// the watch on --out_dir

int job_out_dir_still_there(job *j, const char *after) {
    const int metrics_fd = j->metrics ? fileno(j->metrics) : -1;   // -1: closed
    return agree(j, out_dir_watch(j->o->out_dir, j->out_dir_fd, j->out_lock, metrics_fd, after));
}

// ----------------------------------------------------------------------------
// opening, per step, closing

void job_print_summary(job *j) {
    if (!is_main(j)) return;
    const train_options *o = j->o;
    const llama_config *c = &j->cfg;
    printf("finetune: model %s: %lld params, %d layers, hidden %d, heads %d/%d (q/kv), head_dim %d, vocab %d%s\n",
           o->model_dir, (long long)j->layout.n_params, c->num_hidden_layers, c->hidden_size,
           c->num_attention_heads, c->num_key_value_heads, c->head_dim, c->vocab_size,
           c->tie_word_embeddings ? ", tied embeddings" : "");
    printf("finetune: data %s: %llu training rows (%s), %llu validation games\n", o->data_dir,
           o->eval_only ? 0ull : (unsigned long long)loader_rows(&j->train), o->pack ? "packed" : "one game per row",
           (unsigned long long)loader_rows(&j->val));
    const unsigned long long skipped = o->eval_only ? 0 : loader_skipped_games(&j->train),
                             left = o->eval_only ? 0 : loader_rows(&j->train) % (uint64_t)o->total_batch_size;
    if (skipped)
        printf("finetune: note: %llu training game(s) of fewer than 2 tokens have no target and are left out\n",
               skipped);
    if (left)   // as a DataLoader with drop_last: every epoch reshuffles, so other rows are left each time
        printf("finetune: note: %llu row(s) of each epoch beyond its last full --total_batch_size of %d are not "
               "trained in it (each epoch reshuffles: other rows each time)\n", left, o->total_batch_size);
    printf("finetune: %d rank(s), backend %s, sharding %s (shard group %d x replica group %d); "
           "%d micro-batch(es) of %d per rank per step; %d steps (%d per epoch)\n",
           j->world, j->be->name, fsdp_sharding_name(j->cc->shard->size, j->world),
           j->cc->shard->size, j->cc->replica->size, j->accum, o->batch_size_per_device, j->total_steps,
           j->steps_per_epoch);
    if (o->eval_only)   // (the optimizer's flags, offload and checkpointing change nothing)
        printf("finetune: --eval_only: the forward only, over the working parameters (no gradients or optimizer "
               "state allocated)\n");
    else
        printf("finetune: AdamW lr %g (%s, warmup %.0f%%), betas %g/%g, eps %g, weight decay %g on matrices and "
               "embeddings (not RMSNorm weights), grad clip %g\n", o->learning_rate, o->lr_schedule,
               100 * o->warmup_fraction, o->beta1, o->beta2, o->adam_eps, o->weight_decay, o->max_grad_norm);
    if (o->offload_optimizer && !o->eval_only)
        printf("finetune: optimizer offload: fp32 master + AdamW moments in host memory; the host AdamW %s\n",
               !fsdp_offload_can_overlap(j->opt) ? "runs after the backward (replicas or local accumulation reduce first)"
               : o->max_grad_norm == 0 ? "overlaps the last micro-batch's backward (no clipping)"
                                       : "runs after the backward (clipping needs the global gradient norm; "
                                         "--max_grad_norm 0 overlaps it)");
    if (j->lora)
        printf("finetune: LoRA rank %d, alpha %g, targets %s: %lld trainable parameters; the base is frozen\n",
               o->lora_rank, o->lora_alpha, o->lora_targets, (long long)j->ll.layout.n_params);
}

void job_log_step(job *j, int step, const step_stats *st, double avg_secs) {
    if (!is_main(j)) return;
    const double tps = st->tokens / st->secs;
    // MFU over the padded compute actually done (B x T_used tokens per micro-batch)
    const double computed = (double)j->o->total_batch_size * st->avg_T;
    const double adapters = j->lora ? lora_layer_params(&j->cfg, &j->ll.lc) : 0;
    const double mfu = j->peak_flops > 0 ? computed * model_flops_per_token(&j->cfg, st->avg_T, adapters) / st->secs /
                                               (j->peak_flops * j->world) : 0;
    char eta[32];
    format_eta(eta, sizeof eta, avg_secs * (j->total_steps - step - 1));
    if (isatty(STDOUT_FILENO)) printf("\r");
    printf("step %4d/%d | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | %.0f ms | MFU %.1f%% | "
           "peak mem %.1f MiB | eta %s\n",
           step + 1, j->total_steps, st->loss, st->lr, st->norm, tps, 1000 * st->secs, 100 * mfu,
           j->mem.peak_total / 1048576.0, eta);
    fflush(stdout);
    if (j->metrics) {
        char rec[2048];
        int len = snprintf(rec, sizeof rec,
                "{\"type\":\"train\",\"step\":%d,\"loss\":%.6f,\"lr\":%.6e,\"grad_norm\":%.6f,\"tokens\":%.0f,"
                "\"tokens_per_s\":%.1f,\"ms\":%.4f,\"mfu\":%.5f,\"peak_mem_bytes\":%zu,\"all_gather_bytes\":%zu,"
                "\"reduce_scatter_bytes\":%zu,\"all_reduce_bytes\":%zu,\"model_state_bytes\":%zu",
                step + 1, st->loss, st->lr, st->norm, st->tokens, tps, 1000 * st->secs, mfu, j->mem.peak_total,
                st->gather_bytes, st->rs_bytes, st->ar_bytes,
                j->mem.peak[MEM_PARAMS] + j->mem.peak[MEM_GRADS] + j->mem.peak[MEM_OPTIMIZER]);
        // exact peaks per category so far, for comparison with the --dry_run plan (tests/test_plan.sh)
        for (int c = 0; c < MEM_CATEGORY_COUNT && len > 0 && (size_t)len < sizeof rec; c++)
            len += snprintf(rec + len, sizeof rec - (size_t)len, "%s\"%s\":%zu", c ? "," : ",\"peak_bytes\":{",
                            mem_category_name((mem_category)c), j->mem.peak[c]);
        if (len > 0 && (size_t)len < sizeof rec) len += snprintf(rec + len, sizeof rec - (size_t)len, "}");
        if (j->be->arena_usage && len > 0 && (size_t)len < sizeof rec) {   // a GPU: its arena's reach so far
            size_t cap, top;
            j->be->arena_usage(&cap, &top);
            len += snprintf(rec + len, sizeof rec - (size_t)len, ",\"arena_bytes\":%zu,\"arena_high_water_bytes\":%zu", cap,
                            top);
        }
        if (len > 0 && (size_t)len < sizeof rec) snprintf(rec + len, sizeof rec - (size_t)len, "}\n");
        metrics_put(j, rec);
    }
    if (j->o->profile) profile_step_report(stdout, step + 1);
}

// The "step" of a metrics.jsonl record, or -1 when it has none.
static long metrics_record_step(const char *line) {
    const char *s = strstr(line, "\"step\":");
    return s ? strtol(s + 7, NULL, 10) : -1;
}

// Rewind metrics.jsonl (path) to a resume at step `start`: records of later steps (written by
// the interrupted run after the checkpoint it resumes from) go, and so does the final
// evaluation at `start` when that was the last step (job_finish logs it again); a checkpoint
// at step s follows step s's train record and its periodic evaluation, so those stay. A
// missing file is fine (nothing to rewind). A last record without its newline (torn: the
// writer was killed or the disk was full) goes as well, with a warning: kept, the next record
// would be appended to it on the same line. Written to path.tmp and renamed over. 0 / -1.
static int metrics_rewind(const char *path, int start, int total_steps) {
    FILE *in = fopen(path, "r");
    if (!in) return errno == ENOENT ? 0 : ft_error("%s: cannot read: %s", path, strerror(errno));
    char tmp[FT_PATH_MAX];
    int rc = ft_path(tmp, sizeof tmp, "%s.tmp", path);
    FILE *out = rc == 0 ? fopen(tmp, "w") : NULL;
    if (rc == 0 && !out) rc = ft_error("%s: cannot open for writing: %s", tmp, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while (rc == 0 && (len = getline(&line, &cap, in)) >= 0) {
        if (len == 0 || line[len - 1] != '\n') {   // getline's last line: torn
            fprintf(stderr, "finetune: warning: %s: its last record is incomplete (%zd bytes without a newline: the "
                    "writer was killed or the disk was full); dropped\n", path, len);
            break;
        }
        const long step = metrics_record_step(line);
        const int final_eval = step == start && start >= total_steps && strstr(line, "\"type\":\"eval\"");
        if ((step <= start && !final_eval) && fputs(line, out) == EOF) rc = ft_error("%s: write failed", tmp);
    }
    free(line);
    fclose(in);
    if (out && fclose(out) != 0 && rc == 0) rc = ft_error("%s: write failed: %s", tmp, strerror(errno));
    if (rc == 0 && rename(tmp, path) != 0) rc = ft_error("%s: cannot replace: %s", path, strerror(errno));
    if (rc != 0 && out) remove(tmp);
    return rc;
}

// Rank 0's metrics.jsonl (on resume rewound to the checkpoint's step, then appended to; the
// samples of an earlier run go: sampling appends to samples.jsonl after the last step; a
// fresh start with --overwrite_out_dir first removes the earlier run's checkpoints/ and final/),
// agreed; then the MFU denominator: --peak_tflops, else the device's published dense bf16
// peak when known, else this backend's measured dense matmul rate.
int job_open_outputs(job *j, int start) {
    const train_options *o = j->o;
    char path[FT_PATH_MAX];
    int rc = 0;
    if (is_main(j)) {
        if (start == 0 && o->overwrite_out_dir) rc = out_dir_clear(o->out_dir);
        if (rc == 0) rc = ft_path(path, sizeof path, "%s/metrics.jsonl", o->out_dir);
        if (rc == 0 && start > 0) rc = metrics_rewind(path, start, j->total_steps);
        if (rc == 0 && !(j->metrics = fopen(path, start > 0 ? "a" : "w")))
            rc = ft_error("%s: cannot open for writing: %s", path, strerror(errno));
        if (rc == 0) j->metrics_ok = fseek(j->metrics, 0, SEEK_END) == 0 ? ftell(j->metrics) : -1;
        if (rc == 0) rc = ft_path(path, sizeof path, "%s/samples.jsonl", o->out_dir);
        if (rc == 0) remove(path);
    }
    if ((rc = agree(j, rc)) != 0) return rc;
    const double known = backend_peak_tflops(j->be);
    j->peak_flops = o->peak_tflops > 0 ? o->peak_tflops * 1e12
                    : known > 0        ? known * 1e12
                                       : mfu_measure_matmul_flops(fp8_linear_unwrap(j->be), &j->mem);
    if (is_main(j))
        printf("finetune: MFU denominator %.1f GFLOP/s per rank (%s)\n", j->peak_flops / 1e9,
               o->peak_tflops > 0 ? "--peak_tflops"
               : known > 0        ? "published dense bf16 peak of this GPU"
                                  : "measured dense matmul rate of this backend");
    return 0;
}

// The closing lines of a finished run (rank 0): what it trained, how fast, where it went.
void job_print_run_summary(const job *j, int step) {
    const train_options *o = j->o;
    char wall[32];
    format_eta(wall, sizeof wall, j->run_secs);
    if (step == j->run_start)   // resumed a finished run: nothing trained
        printf("finetune: done: no step to train (resumed at step %d of %d); val loss %.4f", step, j->total_steps,
               j->val_first);
    else
        printf("finetune: done: trained steps %d-%d of %d: %.0f target tokens in %s of steps, %.0f tokens/s; val loss %.4f",
               j->run_start + 1, step, j->total_steps, j->run_tokens, wall,
               j->run_secs > 0 ? j->run_tokens / j->run_secs : 0.0, j->val_first);
    if (j->n_evals > 1) printf(" -> %.4f", j->val_last);
    printf("\nfinetune: outputs in %s: metrics.jsonl, checkpoints/, %s%s%s\n", o->out_dir,
           j->lora ? "final/ (PEFT adapter)" : "final/ (Hugging Face)", o->merge_lora ? ", final_merged/" : "",
           o->sample_tokens > 0 ? ", samples.jsonl" : "");
}

// Rank 0: the tracker's peak device memory, in all and per category (MiB).
void job_print_peak_memory(const job *j) {
    printf("finetune: peak memory %.1f MiB (%zu bytes):", j->mem.peak_total / 1048576.0, j->mem.peak_total);
    for (int c = 0; c < MEM_CATEGORY_COUNT; c++)   // host (--offload_optimizer): not in the total
        if (c != MEM_HOST || j->mem.peak[c])
            printf("%s %s %.1f", c == MEM_HOST ? ";" : "", mem_category_name((mem_category)c),
                   j->mem.peak[c] / 1048576.0);
    printf("\n");
    if (j->be->arena_usage) {   // a GPU: what of its one arena (sized from the plan) the job reached
        size_t cap, top;
        j->be->arena_usage(&cap, &top);
        printf("finetune: device arena: high-water %.1f MiB (%zu bytes) of %.1f MiB\n", top / 1048576.0, top,
               cap / 1048576.0);
    }
    if (j->o->fp8) {   // outside the tracker: the plan's workspace line for it
        printf("finetune: --fp8 scratch: largest call %zu bytes, buffer %zu bytes (the amax slot included)\n",
               fp8_linear_scratch_used(), fp8_linear_scratch_bytes());
        long fused, all;
        fp8_linear_fused_counts(&fused, &all);
        printf("finetune: --fp8 activations: %ld of %ld quantised with their producer's amax\n", fused, all);
    }
}
