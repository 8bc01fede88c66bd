// ckpt.c: resumable checkpoints, the start of a run (fresh or resumed), and the Hugging
// Face export (see ckpt.h).
//
// A checkpoint directory is itself a Hugging Face checkpoint (config.json + model.safetensors
// holding the fp32 master weights under HF names), plus optimizer.safetensors
// (exp_avg.<name>, exp_avg_sq.<name>) and trainer_state.json. Tensors are consolidated
// (not per-rank shards), so a checkpoint saved at one world size resumes at any other. Rank 0
// writes every file from the gathered units, so the checksum the writer records per tensor
// (safetensors.h) is over the whole tensor. A rank that loads one reads only its slice of each
// unit, and verifies the checksums of 1/(S x R) of the tensors, read whole, the ranks of the
// grid splitting them (hf_checkpoint_read_range, load_moments): over the job each byte is read
// R + 1 times (each of R replica groups reads it once, one rank verifies it), not once per
// rank (a 70B resume on 64 FSDP ranks read 847 GB per rank). A damaged tensor is reported by
// the rank that verified it; the load is agreed by every rank.
#include "ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hf_checkpoint.h"
#include "common.h"
#include "fsutil.h"
#include "lora.h"

#define CKPT_FORMAT "finetune-checkpoint-v1"

// ----------------------------------------------------------------------------
// trainer_state.json: every field once, by name

typedef enum { FIELD_INT, FIELD_I64, FIELD_U64, FIELD_BOOL, FIELD_F64, FIELD_HEX64, FIELD_STR } field_kind;

static const struct {
    const char *name;        // the JSON key
    size_t offset;           // in trainer_state
    field_kind kind;
    const char *must_match;  // resume refuses another value (it changes the data order): what to name
    int optional;            // absent in older checkpoints: 0
    int training_order;      // only the order of the training rows: not checked for an evaluation
} state_fields[] = {
    {"step", offsetof(trainer_state, step), FIELD_INT, NULL, 0, 0},
    {"epoch", offsetof(trainer_state, epoch), FIELD_INT, NULL, 0, 0},   // for people: resume derives the
    {"row", offsetof(trainer_state, row), FIELD_U64, NULL, 0, 0},       // data position from step
    {"seed", offsetof(trainer_state, seed), FIELD_INT, "--seed", 0, 1},
    {"total_batch_size", offsetof(trainer_state, total_batch_size), FIELD_INT, "--total_batch_size", 0, 1},
    {"seq_len", offsetof(trainer_state, seq_len), FIELD_INT, "--seq_len", 0, 0},
    {"pack", offsetof(trainer_state, pack), FIELD_BOOL, "--pack", 0, 1},
    {"total_steps", offsetof(trainer_state, total_steps), FIELD_INT, NULL, 0, 0},
    {"lora_rank", offsetof(trainer_state, lora_rank), FIELD_INT, "--lora_rank", 1, 0},
    {"lora_targets", offsetof(trainer_state, lora_targets), FIELD_INT, "--lora_targets", 1, 0},   // a mask
    {"lora_alpha", offsetof(trainer_state, lora_alpha), FIELD_F64, "--lora_alpha", 1, 0},
    {"n_params", offsetof(trainer_state, n_params), FIELD_I64, "a trained parameter count of", 0, 0},
    // 16 hex digits (a JSON integer is signed); written when not 0; compared by the caller
    {"base_fingerprint", offsetof(trainer_state, base_fingerprint), FIELD_HEX64, NULL, 1, 0},
    {"data_fingerprint", offsetof(trainer_state, data_fingerprint), FIELD_HEX64, NULL, 1, 0},
    // the optimizer's settings, compared by the caller (a warning): optional, NaN / "" when absent
    {"learning_rate", offsetof(trainer_state, opt[0]), FIELD_F64, NULL, 1, 0},
    {"lr_schedule", offsetof(trainer_state, lr_schedule), FIELD_STR, NULL, 1, 0},
    {"pack_attention", offsetof(trainer_state, pack_attention), FIELD_STR, NULL, 1, 0},   // (compared by the caller)
    {"warmup_fraction", offsetof(trainer_state, opt[1]), FIELD_F64, NULL, 1, 0},
    {"beta1", offsetof(trainer_state, opt[2]), FIELD_F64, NULL, 1, 0},
    {"beta2", offsetof(trainer_state, opt[3]), FIELD_F64, NULL, 1, 0},
    {"adam_eps", offsetof(trainer_state, opt[4]), FIELD_F64, NULL, 1, 0},
    {"weight_decay", offsetof(trainer_state, opt[5]), FIELD_F64, NULL, 1, 0},
    {"max_grad_norm", offsetof(trainer_state, opt[6]), FIELD_F64, NULL, 1, 0},
};
#define N_STATE_FIELDS (int)(sizeof state_fields / sizeof state_fields[0])
// (state_read copies every FIELD_STR into sizeof lr_schedule bytes)
_Static_assert(sizeof ((trainer_state *)0)->pack_attention == sizeof ((trainer_state *)0)->lr_schedule,
               "FIELD_STR fields are char[16]");

// An integer field's value (FIELD_F64: see field_real).
static long long field_get(const trainer_state *ts, int i) {
    const char *p = (const char *)ts + state_fields[i].offset;
    switch (state_fields[i].kind) {
    case FIELD_F64:
    case FIELD_STR: return 0;
    case FIELD_I64: return *(const long long *)p;
    case FIELD_U64:
    case FIELD_HEX64: return (long long)*(const uint64_t *)p;
    default: return *(const int *)p;
    }
}

static void field_set(trainer_state *ts, int i, long long v) {
    char *p = (char *)ts + state_fields[i].offset;
    switch (state_fields[i].kind) {
    case FIELD_I64: *(long long *)p = v; break;
    case FIELD_U64:
    case FIELD_HEX64: *(uint64_t *)p = (uint64_t)v; break;
    case FIELD_F64:
    case FIELD_STR: break;
    default: *(int *)p = (int)v; break;
    }
}

// The largest value an integer field holds (an int field never wraps).
static long long field_max(field_kind k) { return k == FIELD_INT ? INT_MAX : LLONG_MAX; }

static double *field_real(trainer_state *ts, int i) { return (double *)((char *)ts + state_fields[i].offset); }
static double field_real_get(const trainer_state *ts, int i) {
    return *(const double *)((const char *)ts + state_fields[i].offset);
}

// The JSON text of `ts` (malloc'ed, ends with a newline), or NULL with ft_error.
static char *state_to_json(const trainer_state *ts) {
    json_t *root = json_object();
    int ok = root && json_object_set_new(root, "format", json_string(CKPT_FORMAT)) == 0;
    for (int i = 0; ok && i < N_STATE_FIELDS; i++) {
        const long long v = field_get(ts, i);
        const field_kind k = state_fields[i].kind;
        char hex[17];
        if (k == FIELD_HEX64 && v == 0) continue;   // not recorded
        if (k == FIELD_F64 && isnan(field_real_get(ts, i))) continue;
        const char *str = (const char *)ts + state_fields[i].offset;
        if (k == FIELD_STR && !str[0]) continue;
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)v);
        ok = json_object_set_new(root, state_fields[i].name,
                                 k == FIELD_STR     ? json_string(str)
                                 : k == FIELD_F64   ? json_real(field_real_get(ts, i))   // %.17g: exact round trip
                                 : k == FIELD_BOOL  ? json_boolean(v)
                                 : k == FIELD_HEX64 ? json_string(hex)
                                                    : json_integer(v)) == 0;
    }
    char *body = ok ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    char *text = body ? ft_malloc(strlen(body) + 2, "trainer state") : NULL;
    if (text) snprintf(text, strlen(body) + 2, "%s\n", body);
    free(body);
    if (!text) ft_error("trainer_state.json: cannot serialise");
    return text;
}

// A FIELD_HEX64 value: exactly 16 hex digits. 0 / -1 naming file p and the field.
static int hex64_parse(const char *p, const char *name, json_t *v, uint64_t *out) {
    const char *s = json_string_value(v);
    int ok = s && strlen(s) == 16;
    for (int i = 0; ok && i < 16; i++) ok = strchr("0123456789abcdefABCDEF", s[i]) != NULL;
    if (!ok) return ft_error("%s: field '%s' is not a string of 16 hex digits", p, name);
    *out = strtoull(s, NULL, 16);
    return 0;
}

// Parse <dir>/trainer_state.json: every field present, an integer (pack: a boolean), >= 0 and
// within its C type.
static int state_read(const char *dir, trainer_state *ts) {
    char p[FT_PATH_MAX];
    TRY(ft_path(p, sizeof p, "%s/trainer_state.json", dir));
    json_error_t jerr;
    json_t *root = json_load_file(p, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return ft_error("%s: not a finetune checkpoint: %s", p, jerr.text);
    json_t *fmt = json_object_get(root, "format");
    int rc = 0;
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), CKPT_FORMAT) != 0)
        rc = ft_error("%s: field 'format' is not \"" CKPT_FORMAT "\"", p);
    memset(ts, 0, sizeof *ts);
    for (int k = 0; k < (int)(sizeof ts->opt / sizeof ts->opt[0]); k++) ts->opt[k] = NAN;   // not recorded
    for (int i = 0; rc == 0 && i < N_STATE_FIELDS; i++) {
        json_t *v = json_object_get(root, state_fields[i].name);
        if (!v && state_fields[i].optional) continue;   // memset: 0, NaN, ""
        if (state_fields[i].kind == FIELD_STR) {
            char *dst = (char *)ts + state_fields[i].offset;
            const char *str = json_string_value(v);
            if (!str || !str[0] || strlen(str) >= sizeof ts->lr_schedule)
                rc = ft_error("%s: field '%s' is not a name of 1 to %zu characters", p, state_fields[i].name,
                              sizeof ts->lr_schedule - 1);
            else snprintf(dst, sizeof ts->lr_schedule, "%s", str);
            continue;
        }
        const int is_bool = state_fields[i].kind == FIELD_BOOL;
        if (state_fields[i].kind == FIELD_HEX64) {
            uint64_t x = 0;
            rc = hex64_parse(p, state_fields[i].name, v, &x);
            field_set(ts, i, (long long)x);
        } else if (state_fields[i].kind == FIELD_F64) {
            if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) < 0)
                rc = ft_error("%s: field '%s' is not a finite number >= 0", p, state_fields[i].name);
            else *field_real(ts, i) = json_number_value(v);
        } else if (is_bool ? !json_is_boolean(v) : !json_is_integer(v))
            rc = ft_error("%s: field '%s' missing or not %s", p, state_fields[i].name, is_bool ? "a boolean" : "an integer");
        else if (!is_bool && json_integer_value(v) < 0)
            rc = ft_error("%s: field '%s' is negative", p, state_fields[i].name);
        else if (!is_bool && json_integer_value(v) > field_max(state_fields[i].kind))
            rc = ft_error("%s: field '%s' = %lld is too large (at most %lld)", p, state_fields[i].name,
                          (long long)json_integer_value(v), field_max(state_fields[i].kind));
        else field_set(ts, i, is_bool ? json_is_true(v) : json_integer_value(v));
    }
    json_decref(root);
    return rc;
}

// Refuse a checkpoint that would continue on other data than this run's.
static int state_check(const char *dir, const trainer_state *got, const trainer_state *want) {
    for (int i = 0; i < N_STATE_FIELDS; i++) {
        if (state_fields[i].kind == FIELD_STR || (state_fields[i].kind == FIELD_F64 && !state_fields[i].must_match))
            continue;   // compared by the caller
        if (state_fields[i].kind == FIELD_F64) {
            const double g = field_real_get(got, i), w = field_real_get(want, i);
            // lora_alpha 0 in a LoRA checkpoint: written before the field existed, not known
            if (g != w && !(g == 0 && got->lora_rank > 0))
                return ft_error("%s: incompatible checkpoint: it was trained with %s %g, this run has %g", dir,
                                state_fields[i].must_match, g, w);
            continue;
        }
        if (state_fields[i].must_match && !(want->eval_only && state_fields[i].training_order) &&
            field_get(got, i) != field_get(want, i) && strcmp(state_fields[i].name, "lora_targets") == 0) {
            char g[64], w[64];   // the flag's spelling, not the mask's number
            lora_targets_string((unsigned)got->lora_targets, g, sizeof g);
            lora_targets_string((unsigned)want->lora_targets, w, sizeof w);
            return ft_error("%s: incompatible checkpoint: it was trained with --lora_targets %s, this run has %s", dir,
                            g[0] ? g : "(none)", w[0] ? w : "(none)");
        }
        if (state_fields[i].must_match && !(want->eval_only && state_fields[i].training_order) &&
            field_get(got, i) != field_get(want, i))
        {
            const char *name = state_fields[i].name;
            const char *hint = strcmp(name, "lora_rank") == 0 ? " (0 = full fine-tuning)"
                               : strcmp(name, "n_params") == 0
                                   ? (want->lora_rank ? " (the adapters of another base model's shape)"
                                                      : " (another model: --model_dir's config.json differs)")
                                   : "";
            return ft_error("%s: incompatible checkpoint: it was trained with %s %lld, this run has %lld%s", dir,
                            state_fields[i].must_match, field_get(got, i), field_get(want, i), hint);
        }
    }
    if (want->total_steps > 0 && got->step > want->total_steps)
        return ft_error("%s: checkpoint is at step %d, past this run's %d total steps", dir, got->step,
                        want->total_steps);
    return 0;
}

// ----------------------------------------------------------------------------
// streaming consolidated tensors: gathered one unit at a time (collective), written on rank 0

// One safetensors file of parameter-shaped tensors: n_parts blocks of the layout's entries,
// block k named prefix[k] + <HF name> with its data from fsdp buffer which[k]; tensor
// k * n_entries + i is entry i of block k (the order st_write was given before streaming).
typedef struct {
    const char *const *prefix;
    const fsdp_buffer *which;
    int n_parts;
    st_dtype dtype;   // ST_F32, or ST_BF16 (converted from the fp32 gather)
} param_file;

// Open `w` on `path` for the tensors of `pf`. 0 / -1 (nothing left behind).
static int param_file_open(st_writer *w, const char *path, const param_layout *l, const param_file *pf) {
    const int n = l->n_entries * pf->n_parts;
    st_write_tensor *ts = ft_calloc((size_t)n, sizeof *ts, "tensor list");
    char (*names)[128] = ft_calloc((size_t)n, 128, "tensor names");
    int rc = -1;
    if (ts && names) {
        for (int k = 0; k < pf->n_parts; k++)
            for (int i = 0; i < l->n_entries; i++) {
                const param_entry *e = &l->entries[i];
                st_write_tensor *t = &ts[k * l->n_entries + i];
                snprintf(names[k * l->n_entries + i], 128, "%s%s", pf->prefix[k], e->name);
                t->name = names[k * l->n_entries + i];
                t->dtype = pf->dtype;
                t->ndim = e->ndim;
                t->shape[0] = e->shape[0];
                t->shape[1] = e->shape[1];
            }
        static const char *const meta[] = {"format", "pt", NULL};
        rc = st_writer_open(w, path, ts, n, meta);
    }
    free(ts);
    free(names);
    return rc;
}

// A host fp32 unit of n elements into pf->dtype, in place (bf16: element i's 2 bytes land at
// 2i, after 4i.. was read).
static void unit_to_dtype(const param_file *pf, float *host, size_t n) {
    if (pf->dtype != ST_BF16) return;
    uint16_t *h = (uint16_t *)host;
    for (size_t i = 0; i < n; i++) h[i] = ft_f32_to_bf16(host[i]);
}

// Put the tensors of unit u, block k, from `unit` (the unit's unit_numel[u] elements in pf->dtype).
static int param_file_put_unit(st_writer *w, const param_layout *l, const param_file *pf, int k, int u,
                               const void *unit) {
    const size_t esz = st_dtype_size(pf->dtype);
    for (int i = 0; i < l->n_entries; i++)
        if (l->entries[i].unit == u)
            TRY(st_writer_put(w, k * l->n_entries + i, (const char *)unit + l->entries[i].unit_offset * esz));
    return 0;
}

// Write `pf` to `path`, one unit at a time through `host` (max_unit floats). Collective:
// every rank gathers every unit of every block in the same order, whatever happens to the
// writing, so a failure on the writer cannot leave the others waiting in a gather; nor can
// a gather that failed after its collective on this rank (a copy to the host: it goes on
// with the next one, so that its collectives keep pairing with the other ranks': on NCCL a
// rank leaving the sequence early would pair its next collective, an all-reduce, with their
// all-gathers; a failure before the collective, as a sticky device error, fails them too).
// `write`: this rank writes (rank 0 of the world, and nothing failed before). 0 / -1 (on -1
// no file).
static int param_file_stream(fsdp_state *s, const char *path, const param_file *pf, int write, float *host) {
    const param_layout *l = s->layout;
    st_writer w = {.fd = -1};
    int rc = write ? param_file_open(&w, path, l, pf) : 0;
    int writing = write && rc == 0;
    for (int k = 0; k < pf->n_parts; k++)
        for (int u = 0; u < l->n_units; u++) {
            if (fsdp_get_unit(s, pf->which[k], u, host) != 0) {   // unit: (unit_numel[u],)
                if (writing) st_writer_abort(&w);
                writing = 0;
                rc = -1;
                continue;
            }
            if (!writing) continue;
            unit_to_dtype(pf, host, l->unit_numel[u]);
            if (param_file_put_unit(&w, l, pf, k, u, host) != 0) { st_writer_abort(&w); writing = 0; rc = -1; }
        }
    return writing ? st_writer_commit(&w) : rc;
}

// Stream the n files `pf[i]` to <dir>/<name[i]> through one unit buffer (collective, see
// param_file_stream); this rank writes when `write`. 0 / -1 (every rank gathers regardless).
static int param_files_stream(fsdp_state *s, const char *dir, const param_file *pf, const char *const *name,
                              int n, int write) {
    float *host = ft_malloc(s->max_unit * sizeof(float), "checkpoint unit buffer");   // (max_unit,)
    if (!host) return -1;
    int rc = 0;
    for (int i = 0; i < n; i++) {
        char p[FT_PATH_MAX];
        if (ft_path(p, sizeof p, "%s/%s", dir, name[i]) != 0) rc = -1;
        if (param_file_stream(s, p, &pf[i], write && rc == 0, host) != 0) rc = -1;
    }
    free(host);
    return rc;
}

// ----------------------------------------------------------------------------
// save

// Rank 0: create <out_dir>/checkpoints (into root) and a fresh temporary directory for
// step `step` (into tmp), after removing the temporary directories of saves that never
// finished (a process killed while writing: a whole checkpoint's bytes each). 0 / -1.
static int save_dir_create(const char *out_dir, int step, char *root, size_t nroot, char *tmp, size_t ntmp) {
    TRY(ft_path(root, nroot, "%s/checkpoints", out_dir));
    TRY(fs_mkdirs(root));
    fs_remove_prefixed(root, ".tmp.step_");
    TRY(ft_path(tmp, ntmp, "%s/.tmp.step_%08d.%d", root, step, (int)getpid()));
    if (mkdir(tmp, 0755) != 0) return ft_error("%s: cannot create: %s", tmp, strerror(errno));
    return 0;
}

// Rank 0, the tensors written into tmp: config.json and trainer_state.json, then publish
// tmp as <root>/step_%08d and point <root>/latest at it. 0 / -1 (tmp removed unless published).
static int save_dir_finish(const char *model_dir, const char *root, const char *tmp, int step, const char *state) {
    char src[FT_PATH_MAX], dst[FT_PATH_MAX], p[FT_PATH_MAX];
    TRY_GOTO(ft_path(src, sizeof src, "%s/config.json", model_dir), fail);
    TRY_GOTO(ft_path(p, sizeof p, "%s/config.json", tmp), fail);
    TRY_GOTO(fs_copy_file(src, p), fail);
    TRY_GOTO(ft_path(p, sizeof p, "%s/trainer_state.json", tmp), fail);
    TRY_GOTO(fs_write_text_atomic(p, state), fail);
    TRY_GOTO(ft_path(dst, sizeof dst, "%s/step_%08d", root, step), fail);
    TRY_GOTO(fs_publish_dir(tmp, dst), fail);
    TRY(ft_path(p, sizeof p, "%s/latest", root));
    char latest[64];
    snprintf(latest, sizeof latest, "step_%08d\n", step);
    return fs_write_text_atomic(p, latest);
fail:
    fs_remove_tree(tmp);
    return -1;
}

static int step_desc(const void *a, const void *b) {
    const int x = *(const int *)a, y = *(const int *)b;
    return (x < y) - (x > y);
}

// Rank 0, step `step` published in root (latest points at it): remove the step_%08d
// checkpoints of steps <= step beyond the newest `keep`. 0 / -1 naming the directory.
static int prune_checkpoints(const char *root, int step, int keep) {
    DIR *d = opendir(root);
    if (!d) return ft_error("%s: cannot list (--save_total_limit): %s", root, strerror(errno));
    int *steps = NULL, s;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strlen(e->d_name) != 13 || strncmp(e->d_name, "step_", 5) != 0 ||
            strspn(e->d_name + 5, "0123456789") != 8 || (s = atoi(e->d_name + 5)) > step)
            continue;
        if (n == cap) {
            int *grown = realloc(steps, (cap = cap ? 2 * cap : 16) * sizeof *steps);
            if (!grown) { free(steps); closedir(d); return ft_error("out of memory listing %s", root); }
            steps = grown;
        }
        steps[n++] = s;
    }
    closedir(d);
    qsort(steps, n, sizeof *steps, step_desc);
    int rc = 0;
    for (size_t i = (size_t)keep; i < n && rc == 0; i++) {
        char dir[FT_PATH_MAX], gone[FT_PATH_MAX];
        rc = ft_path(dir, sizeof dir, "%s/step_%08d", root, steps[i]);
        if (rc == 0) rc = ft_path(gone, sizeof gone, "%s/.tmp.step_%08d.pruned", root, steps[i]);
        if (rc == 0 && rename(dir, gone) != 0)
            rc = ft_error("%s: cannot remove (--save_total_limit %d): %s", dir, keep, strerror(errno));
        if (rc == 0) fs_remove_tree(gone);
    }
    free(steps);
    return rc;
}

int ckpt_save(const char *out_dir, const char *model_dir, fsdp_state *s, const trainer_state *ts,
              int world_rank, int keep) {
    static const char *const model_prefix[] = {""}, *const optim_prefix[] = {"exp_avg.", "exp_avg_sq."};
    static const fsdp_buffer model_which[] = {FSDP_MASTER}, optim_which[] = {FSDP_EXP_AVG, FSDP_EXP_AVG_SQ};
    static const param_file files[] = {{model_prefix, model_which, 1, ST_F32}, {optim_prefix, optim_which, 2, ST_F32}};
    static const char *const names[] = {"model.safetensors", "optimizer.safetensors"};
    char root[FT_PATH_MAX] = "", tmp[FT_PATH_MAX] = "";
    char *state = NULL;
    int rc = 0;
    if (world_rank == 0)
        rc = (state = state_to_json(ts)) ? save_dir_create(out_dir, ts->step, root, sizeof root, tmp, sizeof tmp) : -1;
    const int write = world_rank == 0 && rc == 0;
    if (param_files_stream(s, tmp, files, names, 2, write) != 0) rc = -1;
    if (write && rc == 0) rc = save_dir_finish(model_dir, root, tmp, ts->step, state);
    else if (write) fs_remove_tree(tmp);
    if (write && rc == 0 && keep > 0) rc = prune_checkpoints(root, ts->step, keep);
    free(state);
    return rc;
}

// ----------------------------------------------------------------------------
// resume

// The checkpoint directory name held by the latest pointer `p` (open as f): one line as
// save_dir_finish writes it ("step_00000006\n"), a plain directory name of 1..NAME_MAX bytes,
// ended by "\n", "\r\n" or the end of the file, nothing after it. 0 / -1 naming p and the defect.
static int latest_read_name(FILE *f, const char *p, char name[NAME_MAX + 1]) {
    char buf[NAME_MAX + 4];   // the longest name, "\r\n", and one byte more: a longer file is refused
    const size_t len = fread(buf, 1, sizeof buf, f);
    if (ferror(f)) return ft_error("%s: cannot read: %s", p, strerror(errno));
    size_t k = 0;   // the name: buf[0, k)
    while (k < len && buf[k] != '\n' && buf[k] != '\r') k++;
    if (k > NAME_MAX)
        return ft_error("%s: does not name a checkpoint directory (the name is longer than %d bytes)", p, NAME_MAX);
    const char *why = NULL;
    if (!(len == k || (len == k + 1 && buf[k] == '\n') || (len == k + 2 && buf[k] == '\r' && buf[k + 1] == '\n')))
        why = "more than one line";
    else if (k == 0) why = "empty";
    else if (memchr(buf, '\0', k)) why = "a NUL byte in the name";
    if (why) return ft_error("%s: does not name a checkpoint directory (%s)", p, why);
    memcpy(name, buf, k);
    name[k] = '\0';
    if (strchr(name, '/') || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return ft_error("%s: does not name a checkpoint directory ('%s' is not a plain directory name)", p, name);
    return 0;
}

int ckpt_check_fresh_out_dir(const char *out_dir, int overwrite) {
    static const struct { const char *path, *what; } earlier[] = {
        {"checkpoints/latest", "checkpoints"}, {"final", "export"}, {"final_merged", "merged export"}};
    for (size_t i = 0; i < sizeof earlier / sizeof earlier[0] && !overwrite; i++) {
        char p[FT_PATH_MAX];
        struct stat sb;
        TRY(ft_path(p, sizeof p, "%s/%s", out_dir, earlier[i].path));
        if (lstat(p, &sb) != 0) continue;
        return ft_error("%s: --out_dir holds an earlier run's %s: %s--overwrite_out_dir starts over (removing its "
                        "checkpoints/, final/ and final_merged/), or choose another --out_dir",
                        p, earlier[i].what, i == 0 ? "--resume latest continues it, " : "");
    }
    return 0;
}

// A node-local path (a job's --out_dir under /tmp, or a filesystem mounted on some nodes
// only) gives each node its own directory: one rank resumed at step 3 while another started
// fresh and mixed their weights, then the job hung until the watchdog blamed the network.
// Rank 0's lock file names it ("pid P on host H"): each rank reads OUT/.lock and compares its
// hash with rank 0's (sent as 16-bit pieces through a sum, exact in doubles). Skipped when
// rank 0 holds no lock (a filesystem without locks: warned about already).
// OUT/.lock's text (up to n - 1 bytes, "" when it cannot be read) and its hash (0: none).
static uint64_t lock_text(const char *path, char *text, size_t n) {
    text[0] = '\0';
    const int f = path[0] ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    const ssize_t got = f >= 0 ? read(f, text, n - 1) : -1;
    if (f >= 0) close(f);
    text[got > 0 ? got : 0] = '\0';
    return got > 0 ? ft_hash64(text, (size_t)got) : 0;
}

int ckpt_check_out_dir_shared(const char *out_dir, int rank0_locked, comm *world) {
    char path[FT_PATH_MAX] = "", text[256];
    const int path_rc = ft_path(path, sizeof path, "%s/.lock", out_dir);   // (its error kept for after the collective)
    uint64_t mine = path_rc == 0 ? lock_text(path, text, sizeof text) : 0;
    double theirs[5] = {0};   // rank 0's hash in four 16-bit pieces, and whether it holds a lock
    if (world->rank == 0) {
        for (int k = 0; k < 4; k++) theirs[k] = (double)((mine >> (16 * k)) & 0xffff);
        theirs[4] = rank0_locked;
    }
    TRY(comm_all_reduce_f64(world, theirs, 5));
    if (path_rc != 0) return -1;
    if (theirs[4] == 0 || world->rank == 0) return 0;
    uint64_t want = 0;
    for (int k = 0; k < 4; k++) want |= (uint64_t)theirs[k] << (16 * k);
    // A network filesystem may answer from its cache for a while (NFS keeps a directory's
    // attributes, and a name it found missing, up to acdirmax, 60 s by default): look again,
    // once a second, before calling the directory another (FT_TEST_OUT_DIR_WAIT_S: test-only)
    const char *wait_env = getenv("FT_TEST_OUT_DIR_WAIT_S");
    const int wait_s = wait_env ? atoi(wait_env) : 60;
    for (int t = 0; mine != want && t < wait_s; t++) {
        sleep(1);
        mine = lock_text(path, text, sizeof text);
    }
    if (mine == want) return 0;
    text[strcspn(text, "\r\n")] = '\0';
    // (the line main prints names this rank and its host)
    return ft_error("--out_dir %s: this rank does not see the lock rank 0 holds in it (%s%s, after %d s): every rank "
                    "must see the same directory (a filesystem shared by all nodes, not a node-local path), or "
                    "checkpoints and --resume differ between nodes", out_dir,
                    text[0] ? "it finds another job's: " : "no .lock there", text, wait_s);
}

int ckpt_clear_out_dir(const char *out_dir) {
    static const char *const sub[] = {"checkpoints", "final", "final_merged"};
    for (size_t i = 0; i < sizeof sub / sizeof sub[0]; i++) {
        char p[FT_PATH_MAX];
        struct stat sb;
        TRY(ft_path(p, sizeof p, "%s/%s", out_dir, sub[i]));
        if (lstat(p, &sb) == 0 && fs_remove_tree(p) != 0)
            return ft_error("%s: cannot remove (--overwrite_out_dir): %s", p, strerror(errno));
    }
    return 0;
}

int ckpt_resolve(const char *out_dir, const char *resume, char *dir, size_t n) {
    const int latest = strcmp(resume, "latest") == 0, automatic = strcmp(resume, "auto") == 0;
    if (!latest && !automatic) {
        TRY(ft_path(dir, n, "%s", resume));
        struct stat sb;
        if (stat(dir, &sb) != 0) return ft_error("--resume %s: no such checkpoint directory (%s)", resume, strerror(errno));
        if (!S_ISDIR(sb.st_mode))
            return ft_error("--resume %s: not a checkpoint directory (for the newest checkpoint in --out_dir: --resume latest)",
                            resume);
        return 0;
    }
    char p[FT_PATH_MAX], name[NAME_MAX + 1];
    TRY(ft_path(p, sizeof p, "%s/checkpoints/latest", out_dir));
    FILE *f = fopen(p, "r");
    if (!f && automatic && errno == ENOENT) {   // nothing saved yet: a fresh start
        if (n) dir[0] = '\0';
        return 0;
    }
    if (!f) return ft_error("--resume %s: %s: no checkpoint to resume (%s)", resume, p, strerror(errno));
    const int rc = latest_read_name(f, p, name);
    fclose(f);
    TRY(rc);
    TRY(ft_path(dir, n, "%s/checkpoints/%s", out_dir, name));
    struct stat sb;   // a checkpoint removed by hand (or by a cleanup) after latest named it
    const int missing = stat(dir, &sb) != 0;
    if (missing || !S_ISDIR(sb.st_mode))
        return ft_error("--resume %s: %s names %s, which is not a checkpoint directory (%s); --resume DIR starts from "
                        "another checkpoint", resume, p, name, missing ? strerror(errno) : "not a directory");
    return 0;
}

// The weights of `dir` fit layout `l` (names, shapes, dtypes; no tensor data read). 0 / -1.
static int check_weights(const char *dir, const param_layout *l) {
    hf_checkpoint ck;
    TRY(hf_checkpoint_open(&ck, dir));
    const int rc = hf_checkpoint_validate(&ck, l);
    hf_checkpoint_close(&ck);
    return rc;
}

int ckpt_load_weights(fsdp_state *s, const char *dir) {
    hf_checkpoint ck;
    TRY(hf_checkpoint_open(&ck, dir));
    int rc = hf_checkpoint_validate(&ck, s->layout);   // names and shapes against this model
    float *host = rc == 0 ? ft_malloc(s->max_unit * sizeof(float), "checkpoint unit buffer") : NULL;
    if (rc == 0 && !host) rc = -1;
    int index, count;
    fsdp_grid_place(s, &index, &count);
    for (int u = 0; u < s->layout->n_units && rc == 0; u++) {
        size_t lo, hi;   // this rank's slice: all it reads of the unit, besides the tensors it verifies
        fsdp_slice_range(s, u, &lo, &hi);
        rc = hf_checkpoint_read_range(&ck, s->layout, u, lo, hi, (index + u) % count, count, host);
        if (rc == 0) rc = fsdp_set_unit(s, FSDP_MASTER, u, host);
    }
    free(host);
    hf_checkpoint_close(&ck);
    return rc;
}

// An optimizer.safetensors tensor for entry e: F32 of e's shape.
static int moment_fits(const st_tensor *t, const param_entry *e) {
    if (!t || t->dtype != ST_F32 || t->ndim != e->ndim) return 0;
    for (int d = 0; d < e->ndim; d++)
        if (t->shape[d] != e->shape[d]) return 0;
    return 1;
}

// A moment's n values: finite, and (exp_avg_sq, `squares`) >= 0, or AdamW's first step
// turns them into NaN weights. 0 / -1 naming the file and tensor.
static int moment_check_values(const char *path, const char *name, const float *x, size_t n, int squares) {
    const size_t bad = ft_first_nonfinite(x, n);
    if (bad < n) return ft_error("%s: tensor '%s': element %zu is %g (not finite)", path, name, bad, x[bad]);
    for (size_t i = 0; squares && i < n; i++)
        if (x[i] < 0) return ft_error("%s: tensor '%s': element %zu is %g (a mean square must be >= 0)", path, name, i, x[i]);
    return 0;
}

// Every tensor of optimizer.safetensors `f` (at path p) is exp_avg.<name> or exp_avg_sq.<name>
// of an entry of `l`: one more is refused naming it, as hf_checkpoint_validate refuses one in
// the weights (it would be a checkpoint of another model, or a damaged one). Header only. 0 / -1.
static int moments_check_names(const st_file *f, const char *p, const param_layout *l) {
    static const char *const prefix[] = {"exp_avg.", "exp_avg_sq."};
    for (int i = 0; i < f->n_tensors; i++) {
        const char *name = f->tensors[i].name, *entry = NULL;
        for (int k = 0; k < 2 && !entry; k++)
            if (strncmp(name, prefix[k], strlen(prefix[k])) == 0) entry = name + strlen(prefix[k]);
        if (!entry || !param_layout_find(l, entry))
            return ft_error("%s: unexpected tensor '%s' (not exp_avg.<name> or exp_avg_sq.<name> of a parameter "
                            "this run trains)", p, name);
    }
    return 0;
}

// The header of optimizer.safetensors `f` (at path p) against the trained layout `l`: nothing
// but the moments (moments_check_names), and both moments of every entry present, F32, of the
// entry's shape. 0 / -1 naming the file and tensor.
static int moments_check_header(const st_file *f, const char *p, const param_layout *l) {
    TRY(moments_check_names(f, p, l));
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < l->n_entries; i++) {
            char name[160];
            snprintf(name, sizeof name, "%s%s", k == 0 ? "exp_avg." : "exp_avg_sq.", l->entries[i].name);
            if (!moment_fits(st_find(f, name), &l->entries[i]))
                return ft_error("%s: tensor '%s' missing, not F32, or of the wrong shape", p, name);
        }
    return 0;
}

// ckpt_check_start's part for the moments: the header only, before anything is allocated
static int check_moments(const char *dir, const param_layout *l) {
    char p[FT_PATH_MAX];
    TRY(ft_path(p, sizeof p, "%s/optimizer.safetensors", dir));
    st_file f;
    TRY(st_open(&f, p));
    const int rc = moments_check_header(&f, p, l);
    st_close(&f);
    return rc;
}

int ckpt_check_start(const char *model_dir, const char *resume_dir, const param_layout *base,
                     const param_layout *trained, const trainer_state *expect, trainer_state *got) {
    const int resume = resume_dir && resume_dir[0];
    if (!resume || base != trained) TRY(check_weights(model_dir, base));   // read at the start
    if (!resume) return 0;
    TRY(state_read(resume_dir, got));
    TRY(state_check(resume_dir, got, expect));
    TRY(check_weights(resume_dir, trained));
    return check_moments(resume_dir, trained);
}

// The AdamW moments of checkpoint `dir` (optimizer.safetensors: exp_avg.<name>, exp_avg_sq.<name>,
// and nothing else).
static int load_moments(fsdp_state *s, const char *dir) {
    char p[FT_PATH_MAX];
    TRY(ft_path(p, sizeof p, "%s/optimizer.safetensors", dir));
    st_file f;
    TRY(st_open(&f, p));
    const param_layout *l = s->layout;
    float *unit = ft_malloc(s->max_unit * sizeof(float), "optimizer unit buffer");
    int rc = unit ? moments_check_header(&f, p, l) : -1;
    int index, count, c = 0;   // as ckpt_load_weights: this rank's slice, and every count-th checksum
    fsdp_grid_place(s, &index, &count);
    for (int k = 0; k < 2 && rc == 0; k++) {
        const char *prefix = k == 0 ? "exp_avg." : "exp_avg_sq.";
        for (int u = 0; u < l->n_units && rc == 0; u++) {
            size_t lo, hi;
            fsdp_slice_range(s, u, &lo, &hi);
            if (hi > l->unit_numel[u]) hi = l->unit_numel[u];
            memset(unit + lo, 0, (hi - lo) * sizeof(float));   // padding
            for (int i = 0; i < l->n_entries && rc == 0; i++) {
                const param_entry *e = &l->entries[i];
                if (e->unit != u) continue;
                const int verify = c++ % count == index;
                const size_t a = e->unit_offset > lo ? e->unit_offset : lo;   // [a, b): its part of the slice
                const size_t b = e->unit_offset + e->numel < hi ? e->unit_offset + e->numel : hi;
                char name[160];
                snprintf(name, sizeof name, "%s%s", prefix, e->name);
                const st_tensor *t = st_find(&f, name);   // there, of e's shape: checked above
                if (verify) rc = st_verify(t, p);   // the checksum first: a damaged file is named as such
                if (rc != 0 || a >= b) continue;
                memcpy(unit + a, (const float *)t->data + (a - e->unit_offset), (b - a) * sizeof(float));
                rc = moment_check_values(p, name, unit + a, b - a, k == 1);
            }
            if (rc == 0) rc = fsdp_set_unit(s, k == 0 ? FSDP_EXP_AVG : FSDP_EXP_AVG_SQ, u, unit);
        }
    }
    free(unit);
    st_close(&f);
    return rc;
}

int ckpt_load_start(fsdp_state *s, const char *model_dir, const char *resume_dir, const trainer_state *expect,
                    trainer_state *got) {
    if (!resume_dir || !resume_dir[0]) {   // fresh: pretrained weights, zero moments, step 0
        *got = *expect;
        TRY(ckpt_load_weights(s, model_dir));
        return fsdp_zero_moments(s);
    }
    TRY(state_read(resume_dir, got));
    TRY(state_check(resume_dir, got, expect));
    TRY(ckpt_load_weights(s, resume_dir));
    // a state without moments (--eval_only) reads none: their header was checked (ckpt_check_start)
    return fsdp_params_only(s) ? 0 : load_moments(s, resume_dir);
}

// ----------------------------------------------------------------------------
// Hugging Face export

static int write_config(const char *src, const char *dst, const char *dtype) {
    json_error_t jerr;
    json_t *root = json_load_file(src, 0, &jerr);
    if (!root) return ft_error("%s: %s", src, jerr.text);
    const char *name = strcmp(dtype, "bf16") == 0 ? "bfloat16" : "float32";
    int set = 0;
    if (json_object_get(root, "torch_dtype")) { json_object_set_new(root, "torch_dtype", json_string(name)); set = 1; }
    if (json_object_get(root, "dtype") || !set) json_object_set_new(root, "dtype", json_string(name));
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!text) return ft_error("%s: cannot serialise", dst);
    FILE *f = fopen(dst, "w");
    int ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (f) ok &= fclose(f) == 0;
    free(text);
    return ok ? 0 : ft_error("%s: cannot write: %s", dst, strerror(errno));
}

// Rank 0: the export's fresh temporary directory <dir>.tmp.<pid> (into tmp), its parent
// created, the <dir>.tmp.* of exports that never finished (a killed process) removed. 0 / -1.
static int export_dir_create(const char *dir, char *tmp, size_t ntmp) {
    TRY(ft_path(tmp, ntmp, "%s.tmp.%d", dir, (int)getpid()));
    char parent[FT_PATH_MAX], prefix[FT_PATH_MAX];
    TRY(ft_path(parent, sizeof parent, "%s", dir));
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) { *slash = '\0'; TRY(fs_mkdirs(parent)); }
    TRY(ft_path(prefix, sizeof prefix, "%s.tmp.", slash ? slash + 1 : dir));
    fs_remove_prefixed(slash == parent ? "/" : slash ? parent : ".", prefix);
    if (mkdir(tmp, 0755) != 0) return ft_error("%s: cannot create: %s", tmp, strerror(errno));
    return 0;
}

// The tokenizer files an export carries from model_dir (those it has), then, for a model's
// export, generation_config.json: AutoTokenizer.from_pretrained(export) works for both kinds
// (transformers' Trainer saves the tokenizer beside a PEFT adapter too).
static const char *const export_extra[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                           "tokenizer.model", "generation_config.json"};
#define N_TOKENIZER_FILES 4

// Copy the first n of export_extra that model_dir has into tmp. 0 / -1.
static int copy_export_extra(const char *model_dir, const char *tmp, size_t n) {
    char p[FT_PATH_MAX], src[FT_PATH_MAX];
    for (size_t i = 0; i < n; i++) {
        TRY(ft_path(src, sizeof src, "%s/%s", model_dir, export_extra[i]));
        if (access(src, R_OK) != 0) continue;
        TRY(ft_path(p, sizeof p, "%s/%s", tmp, export_extra[i]));
        TRY(fs_copy_file(src, p));
    }
    return 0;
}

// Rank 0, the weights written into tmp: config.json (with the dtype) and the tokenizer
// files, then publish tmp as dir. 0 / -1 (tmp removed unless published).
static int export_dir_finish(const char *dir, const char *model_dir, const char *tmp, const char *dtype) {
    char p[FT_PATH_MAX], src[FT_PATH_MAX];
    TRY_GOTO(ft_path(src, sizeof src, "%s/config.json", model_dir), fail);
    TRY_GOTO(ft_path(p, sizeof p, "%s/config.json", tmp), fail);
    TRY_GOTO(write_config(src, p, dtype), fail);
    TRY_GOTO(copy_export_extra(model_dir, tmp, sizeof export_extra / sizeof export_extra[0]), fail);
    TRY_GOTO(fs_publish_dir(tmp, dir), fail);
    return 0;
fail:
    fs_remove_tree(tmp);
    return -1;
}

int ckpt_export_hf(const char *dir, const char *model_dir, fsdp_state *s, const char *dtype, int world_rank) {
    static const char *const prefix[] = {""};
    static const fsdp_buffer which[] = {FSDP_MASTER};
    static const char *const names[] = {"model.safetensors"};
    const param_file file = {prefix, which, 1, strcmp(dtype, "bf16") == 0 ? ST_BF16 : ST_F32};
    char tmp[FT_PATH_MAX] = "";
    int rc = world_rank == 0 ? export_dir_create(dir, tmp, sizeof tmp) : 0;
    const int write = world_rank == 0 && rc == 0;
    if (param_files_stream(s, tmp, &file, names, 1, write) != 0) rc = -1;
    if (write && rc == 0) rc = export_dir_finish(dir, model_dir, tmp, dtype);
    else if (write) fs_remove_tree(tmp);
    return rc;
}

// ----------------------------------------------------------------------------
// PEFT adapter export

// Rank 0: <tmp>/adapter_config.json for `ll`. 0 / -1.
static int write_adapter_config(const char *tmp, const char *model_dir, const lora_layout *ll) {
    json_t *root = json_object(), *targets = json_array();
    for (int t = 0; t < LT_COUNT; t++)
        if (ll->lc.targets & (1u << t)) json_array_append_new(targets, json_string(lora_module_name(t)));
    json_object_set_new(root, "peft_type", json_string("LORA"));
    json_object_set_new(root, "task_type", json_string("CAUSAL_LM"));
    // absolute: peft's AutoPeftModelForCausalLM loads the base from here, and a relative
    // --model_dir resolved only from the training job's working directory
    char *abs = realpath(model_dir, NULL);
    json_object_set_new(root, "base_model_name_or_path", json_string(abs ? abs : model_dir));
    free(abs);
    json_object_set_new(root, "r", json_integer(ll->lc.rank));
    json_object_set_new(root, "lora_alpha", json_real(ll->lc.alpha));
    json_object_set_new(root, "target_modules", targets);
    json_object_set_new(root, "lora_dropout", json_real(0.0));
    json_object_set_new(root, "bias", json_string("none"));
    json_object_set_new(root, "fan_in_fan_out", json_false());
    json_object_set_new(root, "use_rslora", json_false());
    json_object_set_new(root, "use_dora", json_false());
    json_object_set_new(root, "inference_mode", json_true());
    json_object_set_new(root, "modules_to_save", json_null());
    char p[4400];
    snprintf(p, sizeof p, "%s/adapter_config.json", tmp);
    const int rc = json_dump_file(root, p, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    return rc == 0 ? 0 : ft_error("%s: cannot write", p);
}

int ckpt_export_peft(const char *dir, const char *model_dir, fsdp_state *s, const lora_layout *ll, const char *dtype,
                     int world_rank) {
    static const char *const prefix[] = {""};
    static const fsdp_buffer which[] = {FSDP_MASTER};
    static const char *const names[] = {"adapter_model.safetensors"};
    const param_file file = {prefix, which, 1, strcmp(dtype, "bf16") == 0 ? ST_BF16 : ST_F32};
    char tmp[4200] = "";
    int rc = world_rank == 0 ? export_dir_create(dir, tmp, sizeof tmp) : 0;
    const int write = world_rank == 0 && rc == 0;
    if (param_files_stream(s, tmp, &file, names, 1, write) != 0) rc = -1;
    if (write && rc == 0) rc = write_adapter_config(tmp, model_dir, ll);
    if (write && rc == 0) rc = copy_export_extra(model_dir, tmp, N_TOKENIZER_FILES);
    if (write && rc == 0) rc = fs_publish_dir(tmp, dir);
    if (write && rc != 0) fs_remove_tree(tmp);
    return rc;
}

// ----------------------------------------------------------------------------
// merged LoRA export

// Rank 0: stream base unit u (from `ck`) with `adapters_unit` merged into it to `w`. 0 / -1.
static int merged_put_unit(st_writer *w, const param_file *pf, const hf_checkpoint *ck, const param_layout *base,
                           const lora_layout *ll, int u, const float *adapters_unit, float *host) {
    TRY(hf_checkpoint_read_unit(ck, base, u, host));   // (unit_numel[u],) fp32
    lora_merge_unit(ll, base, u, adapters_unit, host);
    unit_to_dtype(pf, host, base->unit_numel[u]);
    return param_file_put_unit(w, base, pf, 0, u, host);
}

int ckpt_export_merged(const char *dir, const char *model_dir, const param_layout *base, fsdp_state *adapters,
                       const lora_layout *ll, const char *dtype, int world_rank) {
    static const char *const prefix[] = {""};
    static const fsdp_buffer which[] = {FSDP_MASTER};
    const param_file file = {prefix, which, 1, strcmp(dtype, "bf16") == 0 ? ST_BF16 : ST_F32};
    size_t max_base = 0;
    for (int u = 0; u < base->n_units; u++) max_base = base->unit_numel[u] > max_base ? base->unit_numel[u] : max_base;
    float *host = ft_malloc(max_base * sizeof(float), "merge unit buffer");              // (max base unit,)
    float *a = ft_malloc(adapters->max_unit * sizeof(float), "adapter unit buffer");   // (max adapter unit,)
    char tmp[4200] = "", path[4400];
    hf_checkpoint ck;
    int have_ck = 0, rc = host && a ? 0 : -1;
    st_writer w = {.fd = -1};
    if (world_rank == 0 && rc == 0) rc = export_dir_create(dir, tmp, sizeof tmp);
    if (world_rank == 0 && rc == 0) rc = hf_checkpoint_open(&ck, model_dir);
    have_ck = world_rank == 0 && rc == 0;
    if (have_ck) rc = hf_checkpoint_validate(&ck, base);
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    if (world_rank == 0 && rc == 0) rc = param_file_open(&w, path, base, &file);
    int writing = world_rank == 0 && rc == 0;
    for (int u = 0; u < base->n_units && host && a; u++) {
        // collective: every rank gathers every adapter unit whatever happens to the writing
        if (fsdp_get_unit(adapters, FSDP_MASTER, u, a) != 0) { rc = -1; writing = 0; st_writer_abort(&w); break; }
        if (writing && merged_put_unit(&w, &file, &ck, base, ll, u, a, host) != 0) { rc = -1; writing = 0; st_writer_abort(&w); }
    }
    if (writing) rc = st_writer_commit(&w);
    if (have_ck) hf_checkpoint_close(&ck);
    free(host);
    free(a);
    if (world_rank == 0 && tmp[0]) {
        if (rc == 0) rc = export_dir_finish(dir, model_dir, tmp, dtype);
        else fs_remove_tree(tmp);
    }
    return rc;
}
