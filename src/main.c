// main.c: the finetune command line. Parses and validates flags, prints the resolved
// configuration once (rank 0), runs the job, and is the only place that prints errors and
// exits.
#include <errno.h>
#include <omp.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "common.h"
#include "comm.h"
#include "plan.h"
#include "train.h"

// ----------------------------------------------------------------------------
// flags: one table drives parsing, validation and --help

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
    {"--model_dir", FLAG_STR, OPT(model_dir), 0, 0, NULL, "Hugging Face Llama checkpoint directory (config.json + safetensors)"},
    {"--data_dir", FLAG_STR, OPT(data_dir), 0, 0, NULL, "directory with token shards train_*.bin / val_*.bin"},
    {"--out_dir", FLAG_STR, OPT(out_dir), 0, 0, NULL, "where metrics.jsonl, checkpoints/ and final/ (the HF export) go"},
    {"--resume", FLAG_STR, OPT(resume), 0, 0, NULL, "continue from a checkpoint: 'latest' (in --out_dir) or a checkpoint directory; 'none' = fresh"},
    {"--eval_only", FLAG_BOOL, OPT(eval_only), 0, 1, NULL, "evaluate the validation loss and exit"},
    {"--batch_size_per_device", FLAG_INT, OPT(batch_size_per_device), 1, 4096, NULL, "sequences per forward pass on each device"},
    {"--total_batch_size", FLAG_INT, OPT(total_batch_size), 1, 1 << 24, NULL, "sequences per optimizer step over all ranks (gradient accumulation fills the rest)"},
    {"--seq_len", FLAG_INT, OPT(seq_len), 2, 1 << 20, NULL, "tokens per sequence; longer games are truncated"},
    {"--pack", FLAG_BOOL, OPT(pack), 0, 1, NULL, "pack games back to back (separated by EOS/BOS) instead of one padded game per row"},
    {"--gradient_checkpointing", FLAG_BOOL, OPT(gradient_checkpointing), 0, 1, NULL, "keep only each layer's input, recompute in backward"},
    {"--learning_rate", FLAG_FLOAT, OPT(learning_rate), 0, 10, NULL, "peak AdamW learning rate"},
    {"--lr_schedule", FLAG_STR, OPT(lr_schedule), 0, 0, "linear|cosine|constant", "decay after warmup"},
    {"--warmup_fraction", FLAG_FLOAT, OPT(warmup_fraction), 0, 1, NULL, "fraction of the steps spent in linear warmup"},
    {"--beta1", FLAG_FLOAT, OPT(beta1), 0, 0.999999, NULL, "AdamW beta1"},
    {"--beta2", FLAG_FLOAT, OPT(beta2), 0, 0.999999999, NULL, "AdamW beta2"},
    {"--adam_eps", FLAG_FLOAT, OPT(adam_eps), 1e-30, 1, NULL, "AdamW epsilon"},
    {"--weight_decay", FLAG_FLOAT, OPT(weight_decay), 0, 10, NULL, "AdamW decoupled weight decay (matrices and embeddings only)"},
    {"--max_grad_norm", FLAG_FLOAT, OPT(max_grad_norm), 0, 1e30, NULL, "clip the global gradient norm to this (0 = no clipping)"},
    {"--max_steps", FLAG_INT, OPT(max_steps), 0, 1 << 30, NULL, "optimizer steps to run (0 = --epochs over the data)"},
    {"--epochs", FLAG_INT, OPT(epochs), 1, 100000, NULL, "passes over the training rows when --max_steps is 0"},
    {"--seed", FLAG_INT, OPT(seed), 0, 2147483647, NULL, "data order and sampling seed"},
    {"--eval_every", FLAG_INT, OPT(eval_every), 0, 1 << 30, NULL, "validation loss every N steps (0 = only before and after)"},
    {"--max_eval_docs", FLAG_INT, OPT(max_eval_docs), 0, 1 << 30, NULL, "evaluate at most this many validation games (0 = all)"},
    {"--save_every", FLAG_INT, OPT(save_every), 0, 1 << 30, NULL, "checkpoint every N steps (0 = only at the end); SIGTERM/SIGINT also save"},
    {"--stop_at_step", FLAG_INT, OPT(stop_at_step), 0, 1 << 30, NULL, "save and stop after this step, as if preempted (0 = never)"},
    {"--save_dtype", FLAG_STR, OPT(save_dtype), 0, 0, "bf16|fp32", "dtype of the final Hugging Face export"},
    {"--sample_tokens", FLAG_INT, OPT(sample_tokens), 0, 100000, NULL, "after training, sample this many tokens continuing a validation game"},
    {"--sample_games", FLAG_INT, OPT(sample_games), 1, 10000, NULL, "with --sample_tokens: continue this many validation games (OUT/samples.jsonl)"},
    {"--peak_tflops", FLAG_FLOAT, OPT(peak_tflops), 0, 1e6, NULL, "device peak for MFU in TFLOP/s (0 = the GPU's published bf16 peak when known, else the measured matmul rate)"},
    {"--no_fsdp", FLAG_BOOL, OPT(no_fsdp), 0, 1, NULL, "replicate the model on every rank (DDP); with one rank: the single-device mode"},
    {"--accumulate_grads_locally", FLAG_BOOL, OPT(accumulate_grads_locally), 0, 1, NULL, "sum gradients of all micro-batches locally and reduce once per step (more memory, less traffic)"},
    {"--dp_shard", FLAG_INT, OPT(dp_shard), 0, 1 << 20, NULL, "HSDP: shard within groups of this many ranks, replicate across groups (0 = all ranks)"},
    {"--device", FLAG_STR, OPT(device), 0, 0, "cpu|cuda", "backend: cpu (fp32, OpenMP; the reference) or cuda (bf16 storage, fp32 math; one GPU per rank by local rank; unverified on GPU)"},
    {"--dry_run", FLAG_BOOL, OPT(dry_run), 0, 1, NULL, "print the per-rank memory plan, the largest batch that fits 80 GB and a roofline step-time estimate, then exit (reads only config.json)"},
    {"--world_size", FLAG_INT, OPT(world_size), 0, 1 << 20, NULL, "with --dry_run: ranks to plan for (0 = the ranks the launcher started)"},
};
#define N_FLAGS (int)(sizeof flags / sizeof flags[0])

static train_options options_default(void) {
    train_options o = {
        .model_dir = "data/model", .data_dir = "data/chess", .out_dir = "out", .resume = "none",
        .batch_size_per_device = 1, .total_batch_size = 64, .seq_len = 512,
        .learning_rate = 1e-5, .lr_schedule = "linear", .warmup_fraction = 0.1,
        .beta1 = 0.9, .beta2 = 0.999, .adam_eps = 1e-8, .weight_decay = 0.01, .max_grad_norm = 1.0,
        .max_steps = 0, .epochs = 1, .seed = 42, .eval_every = 0, .max_eval_docs = 0, .save_every = 0,
        .save_dtype = "bf16", .sample_tokens = 0, .sample_games = 1, .device = "cpu",
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

static void print_help(void) {
    train_options d = options_default();
    printf("usage: finetune [flags]\n\n"
           "Fine-tunes a Hugging Face Llama checkpoint on token shards (AdamW, gradient accumulation,\n"
           "checkpoints, HF export). With no flags it trains the bundled tiny model on the bundled chess\n"
           "games with the tutorial's hyperparameters; `make run` uses settings that finish in minutes.\n\nflags:\n");
    for (int i = 0; i < N_FLAGS; i++) {
        printf("  %-26s %s", flags[i].name, flags[i].help);
        if (flags[i].choices) printf(" [%s]", flags[i].choices);
        printf(" (default: ");
        print_value(stdout, &d, &flags[i]);
        printf(")\n");
    }
    printf("  %-26s print this help\n", "--help");
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

// Parse argv into *o. Accepts "--flag value", "--flag=value", and bare boolean flags.
static int options_parse(train_options *o, int argc, char **argv, int *want_help) {
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
                return ft_error("flag %s: %s is out of range [%g, %g]", f->name, val, f->min, f->max);
            if (f->kind == FLAG_INT) *(int *)base = (int)v;
            else *(double *)base = v;
        }
    }
    if (strcmp(o->resume, "none") == 0) o->resume = "";
    if (o->no_fsdp && o->dp_shard > 1) return ft_error("flags --no_fsdp and --dp_shard %d contradict each other", o->dp_shard);
    if (o->world_size > 0 && !o->dry_run)
        return ft_error("flag --world_size is for --dry_run (training runs on the ranks the launcher started)");
    return 0;
}

// Rank from the launcher's environment, before MPI is up (flag errors print once).
static int env_rank(void) {
    static const char *vars[] = {"PMI_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", NULL};
    for (int i = 0; vars[i]; i++)
        if (getenv(vars[i])) return atoi(getenv(vars[i]));
    return 0;
}

// World size from the launcher's environment (for --dry_run, which starts no MPI).
static int env_world_size(void) {
    static const char *vars[] = {"PMI_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", NULL};
    for (int i = 0; vars[i]; i++)
        if (getenv(vars[i]) && atoi(getenv(vars[i])) > 0) return atoi(getenv(vars[i]));
    return 1;
}

// --dry_run: plan the job from config.json alone and print the report (rank 0). 0 / -1.
static int dry_run(const train_options *o) {
    llama_config cfg;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", o->model_dir);
    TRY(llama_config_load(&cfg, path));
    const int W = o->world_size > 0 ? o->world_size : env_world_size();
    int max_batch = 1;
    for (int i = 0; i < N_FLAGS; i++)
        if (strcmp(flags[i].name, "--batch_size_per_device") == 0) max_batch = (int)flags[i].max;
    const plan_request req = train_plan_request(o, W, strcmp(o->device, "cuda") == 0 ? 2 : 4);
    plan p;
    TRY(plan_compute(&p, &cfg, &req));
    if (env_rank() == 0) plan_print_report(stdout, &p, &cfg, o->model_dir, o->device, max_batch);
    return 0;
}

// Device memory for --device cuda: the plan of this job (bf16 storage) plus the inference
// model of --sample_tokens and a margin of 5% + 512 MiB for what the plan does not see.
static int device_arena_bytes(const train_options *o, int W, size_t *out) {
    llama_config cfg;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", o->model_dir);
    TRY(llama_config_load(&cfg, path));
    const plan_request req = train_plan_request(o, W, 2);
    plan p;
    TRY(plan_compute(&p, &cfg, &req));
    *out = p.total + p.total / 20 + ((size_t)512 << 20);
    return 0;
}

// Setup agreement over the control plane: 0 when every rank succeeded; otherwise the lowest
// failing rank returns -1 (it prints its message) and the others -2 (quiet).
static int setup_agree(comm *world, int mpi, int rc) {
    if (!mpi || world->size == 1) return rc;
    double *v = calloc((size_t)world->size, sizeof(double));
    if (!v) return -1;
    v[world->rank] = rc != 0;
    if (comm_all_reduce_f64(world, v, (size_t)world->size) != 0) { free(v); return -1; }
    int first = -1;
    for (int r = 0; r < world->size && first < 0; r++) if (v[r] > 0) first = r;
    free(v);
    return first < 0 ? 0 : first == world->rank ? -1 : -2;
}

// The data plane of GPU ranks: one process = the single transport over the device; several
// = NCCL: rank 0's unique id reaches every rank over MPI (or the PMI2 KVS), then the shard
// and replica groups are split from the world group. *nccl = 1 when NCCL groups were made.
static int device_comms(comm *world, int mpi, const boot_info *boot, const backend *be, int S, comm *dworld,
                        comm *dshard, comm *dreplica, int *nccl) {
    const int W = mpi ? world->size : boot->size, rank = mpi ? world->rank : boot->rank;
    *nccl = 0;
    if (W == 1) {
        comm_init_single(dworld, be);
        return 0;
    }
#ifdef FT_HAVE_CUDA
    unsigned char id[128] = {0}, got[128] = {0};
    if (rank == 0) TRY(comm_nccl_unique_id(id, sizeof id));
    if (mpi) {
        memcpy(got, id, sizeof id);
        TRY(comm_broadcast(world, got, sizeof got, 0));
    } else {
#ifdef FT_HAVE_PMI2
        TRY(boot_pmi2_share(boot, 0, "ncclUniqueId", id, sizeof id, got));
#endif
    }
    TRY(comm_nccl_init(dworld, be, rank, W, got, -1));
    TRY(comm_nccl_split(dworld, rank / S, rank % S, dshard));
    TRY(comm_nccl_split(dworld, rank % S, rank / S, dreplica));
    *nccl = 1;
    return 0;
#else
    (void)boot; (void)be; (void)S; (void)rank; (void)dworld; (void)dshard; (void)dreplica;
    return ft_error("GPU ranks need NCCL: this binary was built without the CUDA toolkit");
#endif
}

int main(int argc, char **argv) {
    train_options o;
    int want_help;
    if (options_parse(&o, argc, argv, &want_help) != 0) {
        if (env_rank() == 0) fprintf(stderr, "finetune: error: %s\n", ft_error_message());
        return 2;
    }
    if (want_help) { print_help(); return 0; }
    if (o.dry_run) {
        if (dry_run(&o) == 0) return 0;
        if (env_rank() == 0) fprintf(stderr, "finetune: error: %s\n", ft_error_message());
        return 1;
    }

    // control plane: MPI (or PMI2, or one process); data plane: the same MPI groups for CPU
    // ranks, NCCL groups for GPU ranks
    const backend *cpu = backend_cpu(), *be = NULL;
    comm world, shard, replica;
    const char *launcher = "single process";
    int mpi = 0, pmi2 = 0;
#ifdef FT_HAVE_MPI
    if (comm_mpi_launched()) {
        if (comm_mpi_init_world(&world, cpu, &argc, &argv) != 0) {
            fprintf(stderr, "finetune: error: %s\n", ft_error_message());
            return 1;
        }
        mpi = 1;
        launcher = getenv("SLURM_STEP_ID") ? "MPI over Slurm PMI2 (srun)" : "MPI (mpirun)";
    }
#endif
    boot_info boot = {"single process", 0, 1, 0, 1};
#ifdef FT_HAVE_PMI2
    // a build without MPI under srun --mpi=pmi2: libpmi2 gives rank, size and a KVS, enough to
    // share the NCCL id of GPU ranks (CPU ranks need MPI to move data)
    if (!mpi && boot_pmi2_present()) {
        if (boot_pmi2_init(&boot) != 0) {
            fprintf(stderr, "finetune: error: %s\n", ft_error_message());
            return 1;
        }
        pmi2 = boot.size > 1;
        launcher = "Slurm PMI2 (libpmi2, no MPI)";
    }
#endif
    if (!mpi) comm_init_single(&world, cpu);
    int rc = 0, local_rank = boot.local_rank, local_size = boot.local_size;
    const int W = mpi ? world.size : boot.size, rank = mpi ? world.rank : boot.rank;
    // the process grid: shard groups of S consecutive ranks, replica groups across them
    const int S = train_shard_size(&o, W);
    rc = plan_validate_grid(W, S);
    if (rc == 0 && pmi2 && strcmp(o.device, "cuda") != 0)
        rc = ft_error("launcher: %d ranks under srun but this build has no MPI for CPU ranks (rebuild with MPICH, "
                      "or use --device cuda)", W);
    train_comms cc = {&world, &world, &world};
    int mpi_split = 0;
#ifdef FT_HAVE_MPI
    if (mpi && rc == 0) {
        rc = comm_mpi_local_info(&local_rank, &local_size);
        if (rc == 0) rc = comm_mpi_split(&world, world.rank / S, world.rank % S, &shard);
        if (rc == 0) rc = comm_mpi_split(&world, world.rank % S, world.rank / S, &replica);
        if (rc == 0) { cc.shard = &shard; cc.replica = &replica; mpi_split = 1; }
        // ranks sharing a node split its cores, unless the user chose
        if (rc == 0 && !getenv("OMP_NUM_THREADS")) {
            int t = omp_get_num_procs() / local_size;
            omp_set_num_threads(t > 0 ? t : 1);
        }
    }
#else
    (void)shard; (void)replica; (void)mpi_split;
#endif
    // the device: a GPU's arena is sized from the memory plan of this very job
    size_t arena_bytes = 0;
    if (rc == 0 && strcmp(o.device, "cpu") != 0) rc = device_arena_bytes(&o, W, &arena_bytes);
    if (rc == 0) rc = backend_open(o.device, local_rank, arena_bytes, &be);
    rc = setup_agree(&world, mpi, rc);
    comm dworld, dshard, dreplica;   // NCCL groups (GPU ranks)
    int nccl = 0;
    if (rc == 0 && be != cpu) {
        rc = device_comms(&world, mpi, &boot, be, S, &dworld, &dshard, &dreplica, &nccl);
        if (rc == 0) cc = nccl ? (train_comms){&dworld, &dshard, &dreplica} : (train_comms){&dworld, &dworld, &dworld};
    }
    if (rc != 0) {
        if (rc == -1) fprintf(stderr, "finetune: error: %s\n", ft_error_message());
        backend_close(be);
#ifdef FT_HAVE_MPI
        if (mpi) comm_mpi_finalize();
#endif
        return 1;
    }
    if (rank == 0) {
        printf("finetune: bootstrap: %s; world %d rank(s), %d per node, %s per rank (rank 0: local rank %d, %s)\n",
               launcher, W, local_size, be == cpu ? "cpu" : "one GPU", local_rank, backend_describe(be));
        printf("finetune: config:");
        for (int i = 0; i < N_FLAGS; i++) {
            printf(" %s=", flags[i].name + 2);
            print_value(stdout, &o, &flags[i]);
        }
        printf("\n");
        fflush(stdout);
    }
    rc = train_run(&o, &cc);
    // a failing rank prints its own error (setup failures: only the lowest failing rank);
    // past setup, a failure on one rank would leave the others waiting in a collective, so
    // it takes the job down
    if (rc == -1) fprintf(stderr, "finetune: error: %s\n", ft_error_message());
    if (be != cpu) {
        if (nccl) { comm_destroy(&dshard); comm_destroy(&dreplica); }
        comm_destroy(&dworld);
    }
#ifdef FT_HAVE_MPI
    if (mpi) {
        if (rc == -1 && W > 1 && !train_failure_agreed()) comm_mpi_abort(1);
        if (mpi_split) { comm_destroy(&shard); comm_destroy(&replica); }
        comm_destroy(&world);
        backend_close(be);
        comm_mpi_finalize();
        return rc == 0 ? 0 : 1;
    }
#endif
    comm_destroy(&world);
    backend_close(be);
#ifdef FT_HAVE_PMI2
    if (boot_pmi2_present()) boot_pmi2_finalize();
#endif
    return rc == 0 ? 0 : 1;
}
