// options.c: the finetune command line (see options.h).
#include "options.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "common.h"
#include "lora.h"
#include "model.h"
#include "plan_price.h"
#include "sample.h"
#include "watchdog.h"

// ----------------------------------------------------------------------------
// flags: one table drives parsing, validation, --help (and docs/flags.md) and the config echo

typedef enum { FLAG_STR, FLAG_INT, FLAG_FLOAT, FLAG_BOOL } flag_kind;
typedef struct {
    const char *name;
    flag_kind kind;
    size_t offset;
    double min, max;         // FLAG_INT / FLAG_FLOAT range (inclusive)
    const char *choices;     // FLAG_STR: "a|b|c", or NULL for any non-empty value
    const char *help;
} flag_spec;

#define OPT(field) offsetof(train_options, field)
static const flag_spec flags[] = {
    {"--model_dir", FLAG_STR, OPT(model_dir), 0, 0, NULL,
     "Hugging Face Llama checkpoint directory (config.json + safetensors)"},
    {"--data_dir", FLAG_STR, OPT(data_dir), 0, 0, NULL, "directory with token shards train_*.bin / val_*.bin"},
    {"--out_dir", FLAG_STR, OPT(out_dir), 0, 0, NULL,
     "where metrics.jsonl, checkpoints/ and final/ (the HF export) go"},
    {"--resume", FLAG_STR, OPT(resume), 0, 0, NULL,
     "continue from a checkpoint: 'latest' (in --out_dir), 'auto' (latest when --out_dir has one, else fresh: for "
     "requeued jobs) or a checkpoint directory; 'none' = fresh"},
    {"--overwrite_out_dir", FLAG_BOOL, OPT(overwrite_out_dir), 0, 1, NULL,
     "start over in an --out_dir that holds an earlier run's checkpoints (removes its checkpoints/, final/ and "
     "final_merged/ first; without it such a fresh run is refused)"},
    {"--eval_only", FLAG_BOOL, OPT(eval_only), 0, 1, NULL, "evaluate the validation loss and exit"},
    {"--batch_size_per_device", FLAG_INT, OPT(batch_size_per_device), 1, 4096, NULL,
     "sequences per forward pass on each device"},
    {"--total_batch_size", FLAG_INT, OPT(total_batch_size), 1, 1 << 24, NULL,
     "sequences per optimizer step over all ranks (gradient accumulation fills the rest)"},
    {"--seq_len", FLAG_INT, OPT(seq_len), 2, 1 << 20, NULL, "tokens per sequence; longer games are truncated"},
    {"--pack", FLAG_BOOL, OPT(pack), 0, 1, NULL,
     "pack games back to back (separated by EOS/BOS) instead of one padded game per row; attention as "
     "--pack_attention says"},
    {"--pack_attention", FLAG_STR, OPT(pack_attention), 0, 0, "row|per_game",
     "with --pack: row = attention crosses games within a row and positions run over the row (transformers' run_clm "
     "group_texts); per_game = each game attends only to itself, positions restart at each game's BOS and a game's "
     "last token does not predict the next game's BOS (TRL's padding-free packing, DataCollatorWithFlattening)"},
    {"--gradient_checkpointing", FLAG_BOOL, OPT(gradient_checkpointing), 0, 1, NULL,
     "keep only each layer's input, recompute in backward"},
    {"--learning_rate", FLAG_FLOAT, OPT(learning_rate), 0, 10, NULL, "peak AdamW learning rate"},
    {"--lr_schedule", FLAG_STR, OPT(lr_schedule), 0, 0, "linear|cosine|constant", "decay after warmup"},
    {"--warmup_fraction", FLAG_FLOAT, OPT(warmup_fraction), 0, 1, NULL, "fraction of the steps spent in linear warmup"},
    {"--beta1", FLAG_FLOAT, OPT(beta1), 0, 0.999999, NULL, "AdamW beta1"},
    {"--beta2", FLAG_FLOAT, OPT(beta2), 0, 0.999999999, NULL, "AdamW beta2"},
    {"--adam_eps", FLAG_FLOAT, OPT(adam_eps), 1e-30, 1, NULL, "AdamW epsilon"},
    {"--weight_decay", FLAG_FLOAT, OPT(weight_decay), 0, 10, NULL,
     "AdamW decoupled weight decay (matrices and embeddings only)"},
    {"--max_grad_norm", FLAG_FLOAT, OPT(max_grad_norm), 0, 1e30, NULL,
     "clip the global gradient norm to this (0 = no clipping)"},
    {"--max_steps", FLAG_INT, OPT(max_steps), 0, 1 << 30, NULL, "optimizer steps to run (0 = --epochs over the data)"},
    {"--epochs", FLAG_INT, OPT(epochs), 1, 100000, NULL, "passes over the training rows when --max_steps is 0"},
    {"--seed", FLAG_INT, OPT(seed), 0, 2147483647, NULL, "data order and sampling seed"},
    {"--eval_every", FLAG_INT, OPT(eval_every), 0, 1 << 30, NULL,
     "validation loss every N steps (0 = only before and after)"},
    {"--max_eval_docs", FLAG_INT, OPT(max_eval_docs), 0, 1 << 30, NULL,
     "evaluate at most this many validation games (0 = all)"},
    {"--save_every", FLAG_INT, OPT(save_every), 0, 1 << 30, NULL,
     "checkpoint every N steps (0 = only at the end); SIGTERM/SIGINT also save"},
    {"--save_total_limit", FLAG_INT, OPT(save_total_limit), 0, 1 << 30, NULL,
     "keep only the newest N checkpoints (up to the step just saved; older ones are removed after each save; 0 = keep "
     "all)"},
    {"--stop_at_step", FLAG_INT, OPT(stop_at_step), 0, 1 << 30, NULL,
     "save and stop after this step, as if preempted (0 = never)"},
    {"--save_dtype", FLAG_STR, OPT(save_dtype), 0, 0, "bf16|fp32", "dtype of the final Hugging Face export"},
    {"--sample_tokens", FLAG_INT, OPT(sample_tokens), 0, 100000, NULL,
     "after training, sample this many tokens continuing a validation game"},
    {"--sample_games", FLAG_INT, OPT(sample_games), 1, 10000, NULL,
     "with --sample_tokens: continue this many validation games (OUT/samples.jsonl)"},
    {"--sample_temperature", FLAG_FLOAT, OPT(sample_temperature), 0, 100, NULL,
     "with --sample_tokens: softmax temperature (0 = greedy: the most likely token)"},
    {"--sample_top_k", FLAG_INT, OPT(sample_top_k), 0, 1 << 30, NULL,
     "with --sample_tokens: draw from the k most likely tokens only (0 = all; transformers' generate defaults to 50)"},
    {"--sample_top_p", FLAG_FLOAT, OPT(sample_top_p), 0, 1, NULL,
     "with --sample_tokens: draw from the smallest set of most likely tokens whose probability reaches p (1 = all)"},
    {"--peak_tflops", FLAG_FLOAT, OPT(peak_tflops), 0, 1e6, NULL,
     "device peak for MFU in TFLOP/s (0 = the GPU's published bf16 peak when known, else the measured matmul rate)"},
    {"--profile", FLAG_BOOL, OPT(profile), 0, 1, NULL,
     "print milliseconds per op per step (forward, backward, optimizer, comm; rank 0)"},
    {"--no_fsdp", FLAG_BOOL, OPT(no_fsdp), 0, 1, NULL,
     "replicate the model on every rank (DDP); with one rank: the single-device mode"},
    {"--accumulate_grads_locally", FLAG_BOOL, OPT(accumulate_grads_locally), 0, 1, NULL,
     "sum gradients of all micro-batches locally and reduce once per step (more memory, less traffic)"},
    {"--reduce_dtype", FLAG_STR, OPT(reduce_dtype), 0, 0, "bf16|fp32",
     "with FSDP or HSDP on a GPU: the dtype of each micro-batch's gradients and their reduce-scatter (bf16: FSDP "
     "MixedPrecision(reduce_dtype=bf16); fp32: torchtitan's default and the reference workload's autocast, twice the "
     "gradient buffers and reduce-scatter bytes). Gradients are summed into fp32 either way; on the CPU and without "
     "sharding they are fp32 throughout"},
    {"--keep_params_gathered", FLAG_BOOL, OPT(keep_params_gathered), 0, 1, NULL,
     "with FSDP: keep every unit's parameters gathered from its first use until the optimizer step (like FSDP2's "
     "reshard_after_forward=False during accumulation): one all-gather per unit per step instead of two per "
     "micro-batch, for the memory of the whole model's working parameters per GPU (no effect without sharding)"},
    {"--dp_shard", FLAG_INT, OPT(dp_shard), 0, 1 << 20, NULL,
     "HSDP: shard within groups of this many ranks, replicate across groups (0 = all ranks)"},
    {"--lora_rank", FLAG_INT, OPT(lora_rank), 1, 65536, NULL,
     "train LoRA adapters of this rank on a frozen base instead of every weight; the final export is a PEFT adapter "
     "(0 = full fine-tuning)"},
    {"--lora_alpha", FLAG_FLOAT, OPT(lora_alpha), 1e-6, 1e6, NULL,
     "with --lora_rank: LoRA alpha; the adapter output is scaled by alpha / rank"},
    {"--lora_targets", FLAG_STR, OPT(lora_targets), 0, 0, NULL,
     "with --lora_rank: comma-separated projections to adapt, of q,k,v,o,gate,up,down"},
    {"--merge_lora", FLAG_BOOL, OPT(merge_lora), 0, 1, NULL,
     "with --lora_rank: also export OUT/final_merged, the base with the adapters merged (W + alpha/r B A) in the "
     "Hugging Face layout"},
    {"--allow_other_base", FLAG_BOOL, OPT(allow_other_base), 0, 1, NULL,
     "with --lora_rank and --resume: continue the checkpoint's adapters on a --model_dir whose weights differ from "
     "the base they were trained on (its fingerprint in trainer_state.json; refused without this flag), with a "
     "warning"},
    {"--offload_optimizer", FLAG_BOOL, OPT(offload_optimizer), 0, 1, NULL,
     "keep the fp32 master weights and AdamW moments in host memory (pinned on a GPU) and run AdamW there, unit by "
     "unit, while the next unit's gradients and the last unit's new weights cross on a copy stream; with "
     "--max_grad_norm 0 the layers' updates start during the last micro-batch's backward"},
    {"--optimizer_moments", FLAG_STR, OPT(optimizer_moments), 0, 0, "fp32|bf16",
     "the dtype AdamW's moments (exp_avg, exp_avg_sq) are stored in: fp32 (exact, the default) or bf16 (4 bytes "
     "of optimizer state per parameter instead of 8; the update is computed in fp32 and the moments stored with "
     "stochastic rounding, its bits a hash of --seed, the step and the element, the same at any world size; "
     "the loss effect is measured in docs/results/2026-11-28-bf16-moments.md). A "
     "checkpoint records the moments in their dtype; a resume with the other setting converts them. Not with "
     "--offload_optimizer"},
    {"--device", FLAG_STR, OPT(device), 0, 0, "cpu|cuda",
     "backend: cpu (fp32, OpenMP; the reference) or cuda (bf16 storage, fp32 math; one GPU per rank by local rank)"},
    {"--attention", FLAG_STR, OPT(attention), 0, 0, "cudnn|native",
     "GPU attention: cudnn (cuDNN flash attention, checked against native at startup; on a failure one warning and "
     "native) or native (the hand-written kernels: bitwise reproducible; cuDNN's backward is not, it sums dQ in an "
     "fp32 accumulator, unless --deterministic)"},
    {"--deterministic", FLAG_BOOL, OPT(deterministic), 0, 1, NULL,
     "bitwise-reproducible runs with --attention cudnn: its backward keeps dP in its workspace (batch x heads x "
     "seq_len^2 x 2 bytes more, in the memory plan) instead of summing dQ across thread blocks (the CPU, the native "
     "kernels and the rest are deterministic already)"},
    {"--fp8", FLAG_BOOL, OPT(fp8), 0, 1, NULL,
     "FP8 training on GPUs of compute capability 8.9+ (Hopper, Ada): the decoder layers' linear layers run their "
     "forward, input-gradient and weight-gradient GEMMs in FP8 (E4M3 weights and activations, E5M2 output "
     "gradients; per-tensor scales from each tensor's current amax, computed on the device; cuBLASLt, fp32 "
     "accumulation, outputs in bf16 or the gradient's dtype; a weight gradient over a row count that is not a "
     "multiple of 16 stays bf16); lm_head, attention, norms, master weights and optimizer stay as they are. "
     "Refused on the CPU backend and on older GPUs"},
    {"--nccl_gib_per_comm", FLAG_FLOAT, OPT(nccl_gib_per_comm), 0, 1024, NULL,
     "GPU memory each NCCL communicator is assumed to take, in GiB, for the memory plan's fit check and --dry_run's "
     "largest batch (0 = 0.98 GiB, measured on one H100; NVLS on NVSwitch nodes takes more: docs/planning.md)"},
    {"--nccl_max_ctas", FLAG_INT, OPT(nccl_max_ctas), 0, 64, NULL,
     "GPU ranks: the most thread blocks (CTAs, one SM each while they run) one collective of each NCCL communicator "
     "may take beside the compute (ncclConfig_t maxCTAs; NCCL_MAX_CTAS in the environment overrides it); 0 = NCCL's "
     "own choice, up to its channel limit (why 16: docs/cluster.md)"},
    {"--dry_run", FLAG_BOOL, OPT(dry_run), 0, 1, NULL,
     "print the per-rank memory plan, the largest batch that fits 80 GB and a roofline step-time estimate, then exit "
     "(reads only config.json)"},
    {"--preflight", FLAG_BOOL, OPT(preflight), 0, 1, NULL,
     "check the ranks and exit: each rank's host, device, driver, CUDA, cuDNN, NCCL and MPI versions in one table, "
     "this job's all-gather, reduce-scatter and all-reduce timed on its own communicators with the communication per "
     "step they imply, and any rank that stands out named (exit 0: nothing stands out; 3: a rank stands out); "
     "multi-rank GPU jobs run it before step 1 anyway"},
    {"--auto", FLAG_BOOL, OPT(auto_plan), 0, 1, NULL,
     "choose --batch_size_per_device, --gradient_checkpointing, --keep_params_gathered, --dp_shard, "
     "--accumulate_grads_locally and --offload_optimizer, those not given, for the most predicted tokens/s among "
     "the plans that fit the device (with --dry_run too; docs/planning.md)"},
    {"--dry_run_row_tokens", FLAG_INT, OPT(dry_run_row_tokens), 0, 1 << 20, NULL,
     "with --dry_run: the tokens per row the step-time estimates compute (unpacked rows: the mean of each "
     "micro-batch's longest row, which a run trims to; 0 = --seq_len); memory stays planned for --seq_len"},
    {"--dry_run_gpus_per_node", FLAG_INT, OPT(dry_run_gpus_per_node), 0, 4096, NULL,
     "with --dry_run: the GPUs per node the step-time estimates place the ranks on (consecutive ranks share a node, "
     "as the launcher places them; a collective group spanning nodes runs over the network: 0 = the device's 8)"},
    {"--dry_run_device", FLAG_STR, OPT(dry_run_device), 0, 0, NULL,
     "with --dry_run --auto: the device it plans for (the fit test and the step time): any part of one name in the "
     "estimate's device table (a100, h100, h200; the report's fit line stays the H100 80GB)"},
    {"--fabric_intra_gbps", FLAG_FLOAT, OPT(fabric_intra_gbps), 0, 1e6, NULL,
     "with --dry_run: the bus bandwidth of a collective within a node, GB/s per GPU (nccl-tests' busbw, as --preflight "
     "prints it), for the step-time timeline (0 = 0.8 of the device's NVLink)"},
    {"--fabric_inter_gbps", FLAG_FLOAT, OPT(fabric_inter_gbps), 0, 1e6, NULL,
     "with --dry_run: the bus bandwidth of a collective across nodes, GB/s per GPU (--preflight's busbw of a group "
     "spanning nodes), for the step-time timeline (0 = 0.92 of the device's InfiniBand)"},
    {"--world_size", FLAG_INT, OPT(world_size), 0, 1 << 20, NULL,
     "with --dry_run: ranks to plan for (0 = the ranks the launcher started)"},
    {"--collective_timeout", FLAG_FLOAT, OPT(collective_timeout), 0, 1e6, NULL,
     "seconds a collective or a wait for the GPU may make no progress before the job is aborted with a message naming "
     "the rank, step and operation (0 = wait forever)"},
};
#define N_FLAGS (int)(sizeof flags / sizeof flags[0])
_Static_assert(N_FLAGS <= (int)sizeof(((train_options *)0)->given), "train_options.given: one byte per flag");

static train_options options_default(void) {
    train_options o = {
        .model_dir = "data/model", .data_dir = "data/chess", .out_dir = "out", .resume = "none",
        .batch_size_per_device = 1, .total_batch_size = 64, .seq_len = 512,
        .learning_rate = 1e-5, .lr_schedule = "linear", .warmup_fraction = 0.1,
        .beta1 = 0.9, .beta2 = 0.999, .adam_eps = 1e-8, .weight_decay = 0.01, .max_grad_norm = 1.0,
        .max_steps = 0, .epochs = 1, .seed = 42, .eval_every = 0, .max_eval_docs = 0, .save_every = 0,
        .save_dtype = "bf16", .reduce_dtype = "bf16", .optimizer_moments = "fp32", .sample_tokens = 0,
        .sample_games = 1,
        .sample_temperature = SAMPLE_TEMPERATURE,
        .sample_top_k = 0, .sample_top_p = 1, .device = "cpu", .pack_attention = "row",
        .attention = "cudnn", .collective_timeout = WATCHDOG_DEFAULT_TIMEOUT_S, .lora_alpha = 16,
        .nccl_max_ctas = COMM_NCCL_MAX_CTAS, .dry_run_device = "h100",
        .lora_targets = "q,k,v,o",
    };
    return o;
}

static void print_value(FILE *out, const train_options *o, const flag_spec *f) {
    const char *base = (const char *)o + f->offset;
    if (f->kind == FLAG_STR) fprintf(out, "%s", *(const char *const *)base);
    else if (f->kind == FLAG_INT) fprintf(out, "%d", *(const int *)base);
    else if (f->kind == FLAG_FLOAT) fprintf(out, "%g", *(const double *)base);
    else fprintf(out, "%s", *(const int *)base ? "true" : "false");
}

static const char help_intro[] =
    "Fine-tunes a Hugging Face Llama checkpoint on token shards (AdamW, gradient accumulation,\n"
    "checkpoints, HF export). With no flags it trains the bundled tiny model on the bundled chess\n"
    "games with the tutorial's hyperparameters; `make run` uses settings that finish in minutes.\n";

// The flags that do something else than run (not in the table: they take no value to store).
static const struct { const char *name, *help; } other_flags[] = {
    {"--help", "print this help"},
    {"--help=markdown", "print this help as Markdown (docs/flags.md)"},
    {"--help=env", "print the environment variables read, as Markdown (docs/environment.md)"},
    {"--version", "print the source revision and what this binary was built with"},
};
#define N_OTHER_FLAGS (int)(sizeof other_flags / sizeof other_flags[0])

static void print_help_text(void) {
    train_options d = options_default();
    printf("usage: finetune [flags]\n\n%s\nflags:\n", help_intro);
    for (int i = 0; i < N_FLAGS; i++) {
        printf("  %-26s %s", flags[i].name, flags[i].help);
        if (flags[i].choices) printf(" [%s]", flags[i].choices);
        printf(" (default: ");
        print_value(stdout, &d, &flags[i]);
        printf(")\n");
    }
    for (int i = 0; i < N_OTHER_FLAGS; i++) printf("  %-26s %s\n", other_flags[i].name, other_flags[i].help);
}

// `s` in a Markdown table cell: '|' (a cell's end) and '*', '<', '>' (emphasis, HTML) escaped.
static void md_text(const char *s) {
    for (; *s; s++) {
        if (strchr("|*<>", *s)) putchar('\\');
        putchar(*s);
    }
}

// A flag's Value cell: its choices, or its kind and range.
static void md_value(const flag_spec *f) {
    if (f->kind == FLAG_BOOL) printf("true/false");
    else if (f->kind == FLAG_STR && !f->choices) printf("text");
    else if (f->kind != FLAG_STR)
        printf("%s in [%.15g, %.15g]", f->kind == FLAG_INT ? "integer" : "number", f->min, f->max);
    else
        for (const char *p = f->choices; *p; p++) {
            const char *bar = strchr(p, '|');
            const int len = bar ? (int)(bar - p) : (int)strlen(p);
            printf("%s`%.*s`", p == f->choices ? "" : " \\| ", len, p);
            p += len - (bar ? 0 : 1);
        }
}

static void print_help_markdown(void) {
    train_options d = options_default();
    printf("# finetune flags\n\n"
           "Generated by `finetune --help=markdown` from the flag table in `src/options.c` (the one that also\n"
           "parses and checks the flags and prints `--help`): do not edit; `make docs` rewrites it and\n"
           "`tests/test_gen_docs.sh` fails when it is stale. The environment variables are in\n"
           "[environment.md](environment.md).\n\n%s\n"
           "Usage: `finetune [flags]`. A flag's value follows it (`--seq_len 512`) or an `=`\n"
           "(`--seq_len=512`); a boolean flag alone is true (`--pack`), `--pack=false` or `--pack=0` false.\n"
           "A bad flag or value is one line on stderr and exit status 2.\n\n"
           "| Flag | Value | Default | Description |\n|---|---|---|---|\n", help_intro);
    for (int i = 0; i < N_FLAGS; i++) {
        printf("| `%s` | ", flags[i].name);
        md_value(&flags[i]);
        printf(" | `");
        print_value(stdout, &d, &flags[i]);
        printf("` | ");
        md_text(flags[i].help);
        printf(" |\n");
    }
    for (int i = 0; i < N_OTHER_FLAGS; i++) printf("| `%s` | | | %s |\n", other_flags[i].name, other_flags[i].help);
}

void options_print_help(int what) {
    if (what == OPTIONS_HELP_MARKDOWN) print_help_markdown();
    else if (what == OPTIONS_HELP_ENV) ft_env_print_markdown(stdout);
    else print_help_text();
}

static int choice_ok(const char *choices, const char *v) {
    size_t n = strlen(v);
    for (const char *p = choices; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, v, n) == 0) return 1;
        p += len + (bar ? 1 : 0);
    }
    return 0;
}

// The LoRA flags: targets parsed; --lora_alpha / --lora_targets only with --lora_rank; what
// LoRA does not do yet refused. 0 / -1 naming the flag.
static int options_check_lora(train_options *o) {
    const train_options d = options_default();
    TRY(lora_parse_targets(o->lora_targets, &o->lora_target_mask));
    if (!o->lora_rank && (o->lora_alpha != d.lora_alpha || strcmp(o->lora_targets, d.lora_targets) != 0 ||
                          o->merge_lora || o->allow_other_base))
        return ft_error("flag %s needs --lora_rank", o->merge_lora                   ? "--merge_lora"
                                                     : o->allow_other_base           ? "--allow_other_base"
                                                     : o->lora_alpha != d.lora_alpha ? "--lora_alpha"
                                                                                     : "--lora_targets");
    return 0;
}

// Store flag f's value `val` (NULL: a bare boolean flag) into *o, checked against its kind,
// range and choices. 0 / -1 naming the flag.
static int set_flag(train_options *o, const flag_spec *f, const char *val) {
    char *base = (char *)o + f->offset;
    if (f->kind == FLAG_STR) {
        if (!val[0]) return ft_error("flag %s: empty value", f->name);
        if (f->choices && !choice_ok(f->choices, val))
            return ft_error("flag %s: '%s' is not one of %s", f->name, val, f->choices);
        *(const char **)base = val;
    } else if (f->kind == FLAG_BOOL) {
        if (!val || strcmp(val, "true") == 0 || strcmp(val, "1") == 0) *(int *)base = 1;
        else if (strcmp(val, "false") == 0 || strcmp(val, "0") == 0) *(int *)base = 0;
        else return ft_error("flag %s: '%s' is not true/false", f->name, val);
    } else {
        char *end;
        errno = 0;
        double v = f->kind == FLAG_INT ? (double)strtol(val, &end, 10) : strtod(val, &end);
        if (errno || end == val || *end || !isfinite(v))
            return ft_error("flag %s: '%s' is not %s", f->name, val, f->kind == FLAG_INT ? "an integer" : "a number");
        if (v < f->min || v > f->max)
            return ft_error("flag %s: %s is out of range [%.15g, %.15g]", f->name, val, f->min, f->max);
        if (f->kind == FLAG_INT) *(int *)base = (int)v;
        else *(double *)base = v;
    }
    return 0;
}

// --dry_run_device: one device of the estimate's table, and only where --auto plans in a dry
// run (a run plans for the GPU it runs on). 0 / -1 naming the flag and the valid names.
static int options_check_dry_run_device(const train_options *o) {
    if (!plan_device_find(o->dry_run_device)) {
        char names[256] = "";
        for (int i = 0; i < plan_n_devices; i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", plan_devices[i].name);
        return ft_error("flag --dry_run_device: '%s' is part of no device name or of more than one; the devices: %s "
                        "(e.g. h100)", o->dry_run_device, names);
    }
    if (options_given(o, "--dry_run_device") && !(o->dry_run && o->auto_plan))
        return ft_error("flag --dry_run_device is for --dry_run --auto (the device a dry run's --auto plans for)");
    return 0;
}

// The checks across flags once all are parsed. 0 / -1 naming the flags.
static int options_check_combinations(train_options *o) {
    if (strcmp(o->resume, "none") == 0) o->resume = "";
    if (o->overwrite_out_dir && o->resume[0])
        return ft_error("flags --overwrite_out_dir and --resume %s contradict each other (one starts over, the other "
                        "continues)", o->resume);
    if (o->no_fsdp && o->dp_shard > 1)
        return ft_error("flags --no_fsdp and --dp_shard %d contradict each other", o->dp_shard);
    if (o->auto_plan && o->eval_only)
        return ft_error("flag --auto chooses a training step's flags; --eval_only has none to choose (give "
                        "--batch_size_per_device yourself)");
    if (o->offload_optimizer && strcmp(o->optimizer_moments, "bf16") == 0)
        return ft_error("flags --offload_optimizer and --optimizer_moments bf16 do not combine (the offloaded "
                        "optimizer keeps fp32 moments in host memory; use one or the other)");
    if (o->world_size > 0 && !o->dry_run)
        return ft_error("flag --world_size is for --dry_run (training runs on the ranks the launcher started)");
    TRY(options_check_dry_run_device(o));
    TRY(model_lmhead_chunk_env_check());
    const train_options d = options_default();   // sampling flags without sampling: it sampled nothing, silently
    const char *sampling = o->sample_games != d.sample_games ? "--sample_games"
                           : o->sample_temperature != d.sample_temperature ? "--sample_temperature"
                           : o->sample_top_k != d.sample_top_k ? "--sample_top_k"
                           : o->sample_top_p != d.sample_top_p ? "--sample_top_p" : NULL;
    if (sampling && o->sample_tokens == 0)
        return ft_error("flag %s needs --sample_tokens (how many tokens to sample per game)", sampling);
    if (o->eval_only && o->sample_tokens > 0)   // (--eval_only writes nothing: it sampled nothing, silently)
        return ft_error("flag --sample_tokens: --eval_only writes nothing, samples neither; to sample from a finished "
                        "run's checkpoint, rerun it with --resume (it trains nothing more, then samples)");
    if (o->fp8 && strcmp(o->device, "cuda") != 0)
        return ft_error("flag --fp8 needs --device cuda on a GPU with FP8 tensor cores (compute capability 8.9+: Hopper, "
                        "Ada); the CPU backend computes in fp32");
    if (!o->pack && strcmp(o->pack_attention, d.pack_attention) != 0)
        return ft_error("flag --pack_attention %s needs --pack (rows of one game each attend within their game "
                        "already)", o->pack_attention);
    return options_check_lora(o);
}

// --help, -h, --help=WHAT and --version: *want_help set (OPTIONS_*), 1; another flag: 0;
// --help=WHAT of no known WHAT: -1 with ft_error.
static int help_flag(const char *arg, int *want_help) {
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) *want_help = OPTIONS_HELP;
    else if (strcmp(arg, "--version") == 0) *want_help = OPTIONS_VERSION;
    else if (strcmp(arg, "--help=markdown") == 0) *want_help = OPTIONS_HELP_MARKDOWN;
    else if (strcmp(arg, "--help=env") == 0) *want_help = OPTIONS_HELP_ENV;
    else if (strncmp(arg, "--help=", 7) == 0) return ft_error("flag --help: '%s' is not one of markdown|env", arg + 7);
    else return 0;
    return 1;
}

int options_parse(train_options *o, int argc, char **argv, int *want_help) {
    *o = options_default();
    *want_help = OPTIONS_RUN;
    for (int i = 1; i < argc; i++) {
        char *arg = argv[i], *val = NULL, *eq = strchr(arg, '=');
        const int help = help_flag(arg, want_help);
        if (help != 0) return help < 0 ? -1 : 0;
        size_t name_len = eq ? (size_t)(eq - arg) : strlen(arg);
        const flag_spec *f = NULL;
        for (int k = 0; k < N_FLAGS; k++)
            if (strlen(flags[k].name) == name_len && strncmp(flags[k].name, arg, name_len) == 0) f = &flags[k];
        if (!f) return ft_error("unknown flag '%s' (see --help)", arg);
        if (eq) val = eq + 1;
        else if (f->kind != FLAG_BOOL) {
            if (i + 1 >= argc) return ft_error("flag %s needs a value", f->name);
            val = argv[++i];
        }
        TRY(set_flag(o, f, val));
        o->given[f - flags] = 1;
    }
    return options_check_combinations(o);
}

void options_print(FILE *out, const train_options *o) {
    for (int i = 0; i < N_FLAGS; i++) {
        fprintf(out, " %s=", flags[i].name + 2);
        print_value(out, o, &flags[i]);
    }
}

double options_flag_max(const char *name) {
    for (int i = 0; i < N_FLAGS; i++)
        if (strcmp(flags[i].name, name) == 0) return flags[i].max;
    return 0;
}

int options_given(const train_options *o, const char *name) {
    for (int i = 0; i < N_FLAGS; i++)
        if (strcmp(flags[i].name, name) == 0) return o->given[i];
    return 0;
}
