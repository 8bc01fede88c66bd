// ckpt.c: resumable checkpoints and the start of a run, fresh or resumed (see ckpt.h).
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
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "fsutil.h"
#include "hf_checkpoint.h"
#include "hf_export.h"

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
// save (the files written through hf_export_stream)

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
    // the moments as they are stored (fp32, or bf16 with --optimizer_moments bf16: the widened
    // gather rounds back exactly), their dtype recorded in the safetensors header
    const hf_param_file files[] = {{model_prefix, model_which, 1, ST_F32}, {optim_prefix, optim_which, 2, s->mdt}};
    static const char *const names[] = {"model.safetensors", "optimizer.safetensors"};
    char root[FT_PATH_MAX] = "", tmp[FT_PATH_MAX] = "";
    char *state = NULL;
    int rc = 0;
    if (world_rank == 0)
        rc = (state = state_to_json(ts)) ? save_dir_create(out_dir, ts->step, root, sizeof root, tmp, sizeof tmp) : -1;
    const int write = world_rank == 0 && rc == 0;
    if (hf_export_stream(s, tmp, files, names, 2, write) != 0) rc = -1;
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

// An optimizer.safetensors tensor for entry e: F32 or BF16 (the moments as a run with
// --optimizer_moments fp32 or bf16 stored them; a resume with the other setting converts), of
// e's shape.
static int moment_fits(const st_tensor *t, const param_entry *e) {
    if (!t || (t->dtype != ST_F32 && t->dtype != ST_BF16) || t->ndim != e->ndim) return 0;
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

// dst (n, fp32) = elements [k, k + n) of moment tensor t (F32, or BF16 widened exactly). A
// bf16 run resuming fp32 moments rounds them when fsdp_set_unit stores them (to nearest even,
// as its AdamW op stores them); an fp32 run resuming bf16 ones continues from their values.
static void moment_widen(float *dst, const st_tensor *t, size_t k, size_t n) {
    if (t->dtype == ST_F32) {
        memcpy(dst, (const float *)t->data + k, n * sizeof(float));
        return;
    }
    const uint16_t *h = (const uint16_t *)t->data + k;
    for (size_t i = 0; i < n; i++) dst[i] = ft_bf16_to_f32(h[i]);
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
                return ft_error("%s: tensor '%s' missing, not F32 or BF16, or of the wrong shape", p, name);
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
    if (rc == 0 && index == 0 && f.n_tensors > 0 && f.tensors[0].dtype != s->mdt)
        printf("finetune: note: %s holds %s moments; this run stores them in %s (--optimizer_moments %s): "
               "converted\n", p, st_dtype_name(f.tensors[0].dtype), st_dtype_name(s->mdt),
               s->mdt == ST_BF16 ? "bf16" : "fp32");
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
                moment_widen(unit + a, t, a - e->unit_offset, b - a);
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
