// main.c: the finetune command line. Parses and validates flags, prints the resolved
// configuration once, runs the job, and is the only place that prints errors and exits.
//
// This foundation release runs evaluation: the model's mean next-token loss on the
// validation shards (--eval_only). The training loop arrives with the training issue.
#include <glob.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checkpoint.h"
#include "common.h"
#include "data.h"
#include "model.h"

// ----------------------------------------------------------------------------
// flags: one table drives parsing, validation and --help

typedef struct {
    const char *model_dir;
    const char *data_dir;
    int eval_only;
    int batch_size_per_device;
    int seq_len;
    int gradient_checkpointing;
    int max_eval_docs;
} options;

typedef enum { FLAG_STR, FLAG_INT, FLAG_BOOL } flag_kind;
typedef struct {
    const char *name;
    flag_kind kind;
    size_t offset;
    long min, max;       // for FLAG_INT
    const char *help;
} flag_spec;

#define OPT(field) offsetof(options, field)
static const flag_spec flags[] = {
    {"--model_dir", FLAG_STR, OPT(model_dir), 0, 0, "Hugging Face Llama checkpoint directory (config.json + safetensors)"},
    {"--data_dir", FLAG_STR, OPT(data_dir), 0, 0, "directory with token shards train_*.bin / val_*.bin"},
    {"--eval_only", FLAG_BOOL, OPT(eval_only), 0, 1, "evaluate the validation loss and exit"},
    {"--batch_size_per_device", FLAG_INT, OPT(batch_size_per_device), 1, 4096, "sequences per forward pass on each device"},
    {"--seq_len", FLAG_INT, OPT(seq_len), 2, 1 << 20, "tokens per sequence; longer games are truncated"},
    {"--gradient_checkpointing", FLAG_BOOL, OPT(gradient_checkpointing), 0, 1, "keep only each layer's input, recompute in backward"},
    {"--max_eval_docs", FLAG_INT, OPT(max_eval_docs), 0, 1 << 30, "evaluate at most this many validation games (0 = all)"},
};
#define N_FLAGS (int)(sizeof flags / sizeof flags[0])

static options options_default(void) {
    options o = {.model_dir = "data/model", .data_dir = "data/chess", .eval_only = 0,
                 .batch_size_per_device = 8, .seq_len = 512, .gradient_checkpointing = 0,
                 .max_eval_docs = 0};
    return o;
}

static void print_value(const options *o, const flag_spec *f) {
    const char *base = (const char *)o + f->offset;
    if (f->kind == FLAG_STR) printf("%s", *(const char *const *)base);
    else if (f->kind == FLAG_INT) printf("%d", *(const int *)base);
    else printf("%s", *(const int *)base ? "true" : "false");
}

static void print_help(void) {
    options d = options_default();
    printf("usage: finetune [flags]\n\nFine-tunes a Hugging Face Llama checkpoint on token shards.\n\nflags:\n");
    for (int i = 0; i < N_FLAGS; i++) {
        printf("  %-26s %s (default: ", flags[i].name, flags[i].help);
        print_value(&d, &flags[i]);
        printf(")\n");
    }
    printf("  %-26s print this help\n", "--help");
}

// Parse argv into *o. Accepts "--flag value", "--flag=value", and bare boolean flags.
static int options_parse(options *o, int argc, char **argv, int *want_help) {
    *o = options_default();
    *want_help = 0;
    for (int i = 1; i < argc; i++) {
        char *arg = argv[i], *val = NULL, *eq = strchr(arg, '=');
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) { *want_help = 1; return 0; }
        size_t name_len = eq ? (size_t)(eq - arg) : strlen(arg);
        const flag_spec *f = NULL;
        for (int k = 0; k < N_FLAGS; k++)
            if (strlen(flags[k].name) == name_len && strncmp(flags[k].name, arg, name_len) == 0) f = &flags[k];
        if (!f) return ft_error("unknown flag '%s' (see --help)", arg);
        char *base = (char *)o + f->offset;
        if (eq) val = eq + 1;
        else if (f->kind != FLAG_BOOL) {
            if (i + 1 >= argc) return ft_error("flag %s needs a value", f->name);
            val = argv[++i];
        }
        if (f->kind == FLAG_STR) {
            if (!val[0]) return ft_error("flag %s: empty value", f->name);
            *(const char **)base = val;
        } else if (f->kind == FLAG_BOOL) {
            if (!val || strcmp(val, "true") == 0 || strcmp(val, "1") == 0) *(int *)base = 1;
            else if (strcmp(val, "false") == 0 || strcmp(val, "0") == 0) *(int *)base = 0;
            else return ft_error("flag %s: '%s' is not true/false", f->name, val);
        } else {
            char *end;
            errno = 0;
            long v = strtol(val, &end, 10);
            if (errno || end == val || *end) return ft_error("flag %s: '%s' is not an integer", f->name, val);
            if (v < f->min || v > f->max)
                return ft_error("flag %s: %ld is out of range [%ld, %ld]", f->name, v, f->min, f->max);
            *(int *)base = (int)v;
        }
    }
    return 0;
}

// ----------------------------------------------------------------------------
// evaluation

static int run_eval(const options *o) {
    char path[4096];
    llama_config cfg;
    snprintf(path, sizeof path, "%s/config.json", o->model_dir);
    TRY(llama_config_load(&cfg, path));
    if (o->seq_len > cfg.max_position_embeddings)
        return ft_error("flag --seq_len: %d exceeds the model's max_position_embeddings %d",
                        o->seq_len, cfg.max_position_embeddings);

    printf("finetune: model %s: %lld params, %d layers, hidden %d, heads %d/%d (q/kv), vocab %d\n",
           o->model_dir, llama_config_param_count(&cfg), cfg.num_hidden_layers, cfg.hidden_size,
           cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size);
    printf("finetune: config:");
    for (int i = 0; i < N_FLAGS; i++) { printf(" %s=", flags[i].name + 2); print_value(o, &flags[i]); }
    printf("\n");

    const backend *be = backend_cpu();
    mem_tracker mem;
    mem_tracker_init(&mem, be);
    int rc = -1;
    hf_checkpoint ck = {0};
    model m = {0};
    void *params = NULL;
    token_shard shard = {0};
    int32_t *tokens = NULL, *targets = NULL;
    glob_t g = {0};

    snprintf(path, sizeof path, "%s/val_*.bin", o->data_dir);
    if (glob(path, 0, NULL, &g) != 0 || g.gl_pathc == 0) {
        ft_error("%s: no validation shards (val_*.bin)", o->data_dir);
        goto done;
    }
    TRY_GOTO(hf_checkpoint_open(&ck, o->model_dir), done);
    const int B = o->batch_size_per_device, T = o->seq_len;
    TRY_GOTO(model_init(&m, &cfg, be, &mem, B, T, o->gradient_checkpointing, 1), done);
    params = mem_alloc(&mem, MEM_PARAMS, m.layout.total * m.esz);
    if (!params) goto done;
    TRY_GOTO(hf_checkpoint_load_params(&ck, &m.layout, be, params), done);
    flat_provider_state st = {&m.layout, be, params, NULL};
    unit_provider prov = unit_provider_flat(&st);
    tokens = ft_malloc((size_t)B * T * sizeof(int32_t), "batch tokens");
    targets = ft_malloc((size_t)B * T * sizeof(int32_t), "batch targets");
    if (!tokens || !targets) goto done;

    double total_loss = 0;
    long long total_tokens = 0, docs = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (size_t f = 0; f < g.gl_pathc; f++) {
        TRY_GOTO(token_shard_open(&shard, g.gl_pathv[f], cfg.vocab_size), done);
        for (uint64_t d = 0; d < shard.n_docs;) {
            int rows = 0;
            for (; rows < B && d < shard.n_docs; rows++, d++) {
                if (o->max_eval_docs && docs >= o->max_eval_docs) break;
                token_shard_fill_row(&shard, d, T, tokens + (size_t)rows * T, targets + (size_t)rows * T);
                docs++;
            }
            if (rows == 0) break;
            for (int r = rows; r < B; r++)   // an incomplete last batch: padding rows
                for (int t = 0; t < T; t++) { tokens[r * T + t] = 0; targets[r * T + t] = -100; }
            double sum;
            int n_valid;
            TRY_GOTO(model_step(&m, &prov, tokens, targets, 0, 0.0f, &sum, &n_valid), done);
            total_loss += sum;
            total_tokens += n_valid;
        }
        token_shard_close(&shard);
        if (o->max_eval_docs && docs >= o->max_eval_docs) break;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (total_tokens == 0) { ft_error("%s: validation shards hold no predictable tokens", o->data_dir); goto done; }
    printf("finetune: validation loss %.4f (perplexity %.2f) over %lld tokens in %lld games, %.1f s (%.0f tokens/s)\n",
           total_loss / total_tokens, exp(total_loss / total_tokens), total_tokens, docs, secs,
           total_tokens / secs);
    printf("finetune: peak memory %.1f MiB (params %.1f, activations %.1f, workspace %.1f)\n",
           mem.peak_total / 1048576.0, mem.peak[MEM_PARAMS] / 1048576.0,
           mem.peak[MEM_ACTIVATIONS] / 1048576.0, mem.peak[MEM_WORKSPACE] / 1048576.0);
    rc = 0;
done:
    token_shard_close(&shard);
    free(tokens);
    free(targets);
    if (params) mem_free(&mem, MEM_PARAMS, params, m.layout.total * m.esz);
    model_free(&m);
    hf_checkpoint_close(&ck);
    globfree(&g);
    return rc;
}

int main(int argc, char **argv) {
    options o;
    int want_help;
    if (options_parse(&o, argc, argv, &want_help) != 0) {
        fprintf(stderr, "finetune: error: %s\n", ft_error_message());
        return 2;
    }
    if (want_help) { print_help(); return 0; }
    if (!o.eval_only) {
        fprintf(stderr, "finetune: error: training is not available in this build yet; run with --eval_only\n");
        return 2;
    }
    if (run_eval(&o) != 0) {
        fprintf(stderr, "finetune: error: %s\n", ft_error_message());
        return 1;
    }
    return 0;
}
