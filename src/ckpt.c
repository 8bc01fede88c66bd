// ckpt.c: resumable checkpoints and the Hugging Face export (see train.h).
//
// A checkpoint directory is itself a Hugging Face checkpoint (config.json + model.safetensors
// holding the fp32 master weights under HF names), plus optimizer.safetensors
// (exp_avg.<name>, exp_avg_sq.<name>) and trainer_state.json. Tensors are consolidated
// (not per-rank shards), so a checkpoint saved at one world size resumes at any other.
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "common.h"
#include "train.h"

#define CKPT_FORMAT "finetune-checkpoint-v1"

// ----------------------------------------------------------------------------
// filesystem helpers

int ckpt_mkdirs(const char *path) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return ft_error("%s: path too long", path);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return ft_error("%s: cannot create directory: %s", buf, strerror(errno));
            *p = c;
            if (c == '\0') break;
        }
    }
    if (access(path, W_OK) != 0) return ft_error("%s: directory is not writable: %s", path, strerror(errno));
    return 0;
}

static int remove_tree(const char *path) {
    DIR *d = opendir(path);
    if (!d) return unlink(path) == 0 || errno == ENOENT ? 0 : -1;
    struct dirent *e;
    char sub[4096];
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
        remove_tree(sub);
    }
    closedir(d);
    return rmdir(path);
}

static int fsync_path(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ft_error("%s: cannot open to fsync: %s", path, strerror(errno));
    int rc = fsync(fd);
    close(fd);
    return rc == 0 ? 0 : ft_error("%s: fsync failed: %s", path, strerror(errno));
}

static int copy_file(const char *src, const char *dst) {
    FILE *in = fopen(src, "rb");
    if (!in) return ft_error("%s: cannot read: %s", src, strerror(errno));
    FILE *out = fopen(dst, "wb");
    if (!out) { fclose(in); return ft_error("%s: cannot create: %s", dst, strerror(errno)); }
    char buf[65536];
    size_t n;
    int rc = 0;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n) { rc = ft_error("%s: write failed: %s", dst, strerror(errno)); break; }
    if (ferror(in)) rc = ft_error("%s: read failed", src);
    fclose(in);
    if (fflush(out) != 0 || fsync(fileno(out)) != 0) rc = rc ? rc : ft_error("%s: flush failed: %s", dst, strerror(errno));
    fclose(out);
    return rc;
}

// write `text` to `path` atomically (temp file, fsync, rename, fsync dir)
static int write_text_atomic(const char *path, const char *text) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return ft_error("%s: cannot create: %s", tmp, strerror(errno));
    int ok = fputs(text, f) >= 0 && fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok &= fclose(f) == 0;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return ft_error("%s: cannot write: %s", path, strerror(errno));
    }
    return st_fsync_parent_dir(path);
}

// Move the finished temporary directory `tmp` to `dst`, replacing an existing `dst`.
static int publish_dir(const char *tmp, const char *dst) {
    TRY(fsync_path(tmp));
    char old[4200];
    snprintf(old, sizeof old, "%s.old.%d", dst, (int)getpid());
    struct stat sb;
    int had = stat(dst, &sb) == 0;
    if (had && rename(dst, old) != 0) return ft_error("%s: cannot move aside: %s", dst, strerror(errno));
    if (rename(tmp, dst) != 0) return ft_error("%s: cannot rename %s into place: %s", dst, tmp, strerror(errno));
    TRY(st_fsync_parent_dir(dst));
    if (had) remove_tree(old);
    return 0;
}

// ----------------------------------------------------------------------------
// gathering consolidated tensors (collective), writing on rank 0

// Gather `which` for every unit into one host fp32 buffer of layout->total elements.
static float *gather_all(fsdp_state *s, fsdp_buffer which) {
    const param_layout *l = s->layout;
    float *host = ft_malloc(l->total * sizeof(float), "checkpoint gather buffer");
    if (!host) return NULL;
    for (int u = 0; u < l->n_units; u++)
        if (fsdp_get_unit(s, which, u, host + l->unit_offset[u]) != 0) { free(host); return NULL; }
    return host;
}

// One st_write_tensor per parameter, data from `flat` (element type `dt`, element size esz).
static void describe(const param_layout *l, const void *flat, st_dtype dt, char (*names)[128],
                     const char *prefix, st_write_tensor *out) {
    size_t esz = st_dtype_size(dt);
    for (int i = 0; i < l->n_entries; i++) {
        const param_entry *e = &l->entries[i];
        snprintf(names[i], 128, "%s%s", prefix, e->name);
        out[i].name = names[i];
        out[i].dtype = dt;
        out[i].ndim = e->ndim;
        out[i].shape[0] = e->shape[0];
        out[i].shape[1] = e->shape[1];
        out[i].data = (const char *)flat + e->offset * esz;
    }
}

static int write_params(const char *path, const param_layout *l, const void *flat, st_dtype dt,
                        const char *prefix, const char *prefix2, const void *flat2) {
    int n = l->n_entries * (flat2 ? 2 : 1);
    st_write_tensor *ts = ft_calloc((size_t)n, sizeof *ts, "tensor list");
    char (*names)[128] = ft_calloc((size_t)n, 128, "tensor names");
    int rc = -1;
    if (ts && names) {
        describe(l, flat, dt, names, prefix, ts);
        if (flat2) describe(l, flat2, dt, names + l->n_entries, prefix2, ts + l->n_entries);
        static const char *const meta[] = {"format", "pt", NULL};
        rc = st_write(path, ts, n, meta);
    }
    free(ts);
    free(names);
    return rc;
}

// ----------------------------------------------------------------------------
// save

int ckpt_save(const char *out_dir, const char *model_dir, fsdp_state *s, const trainer_state *ts,
              int world_rank) {
    float *master = gather_all(s, FSDP_MASTER);
    float *m = master ? gather_all(s, FSDP_EXP_AVG) : NULL;
    float *v = m ? gather_all(s, FSDP_EXP_AVG_SQ) : NULL;
    int rc = -1;
    if (!v) goto done;
    if (world_rank != 0) { rc = 0; goto done; }
    char root[4096], tmp[4200], dst[4200], p[4400];
    snprintf(root, sizeof root, "%s/checkpoints", out_dir);
    TRY_GOTO(ckpt_mkdirs(root), done);
    snprintf(dst, sizeof dst, "%s/step_%08d", root, ts->step);
    snprintf(tmp, sizeof tmp, "%s/.tmp.step_%08d.%d", root, ts->step, (int)getpid());
    remove_tree(tmp);
    if (mkdir(tmp, 0755) != 0) { ft_error("%s: cannot create: %s", tmp, strerror(errno)); goto done; }
    snprintf(p, sizeof p, "%s/model.safetensors", tmp);
    TRY_GOTO(write_params(p, s->layout, master, ST_F32, "", NULL, NULL), fail);
    snprintf(p, sizeof p, "%s/optimizer.safetensors", tmp);
    TRY_GOTO(write_params(p, s->layout, m, ST_F32, "exp_avg.", "exp_avg_sq.", v), fail);
    char src[4200];
    snprintf(src, sizeof src, "%s/config.json", model_dir);
    snprintf(p, sizeof p, "%s/config.json", tmp);
    TRY_GOTO(copy_file(src, p), fail);
    char state[1024];
    snprintf(state, sizeof state,
             "{\n  \"format\": \"" CKPT_FORMAT "\",\n  \"step\": %d,\n  \"epoch\": %d,\n  \"row\": %llu,\n"
             "  \"seed\": %d,\n  \"total_batch_size\": %d,\n  \"seq_len\": %d,\n  \"pack\": %s,\n"
             "  \"total_steps\": %d,\n  \"n_params\": %lld\n}\n",
             ts->step, ts->epoch, (unsigned long long)ts->row, ts->seed, ts->total_batch_size, ts->seq_len,
             ts->pack ? "true" : "false", ts->total_steps, ts->n_params);
    snprintf(p, sizeof p, "%s/trainer_state.json", tmp);
    TRY_GOTO(write_text_atomic(p, state), fail);
    TRY_GOTO(publish_dir(tmp, dst), fail);
    snprintf(p, sizeof p, "%s/latest", root);
    snprintf(state, sizeof state, "step_%08d\n", ts->step);
    TRY_GOTO(write_text_atomic(p, state), done);
    rc = 0;
    goto done;
fail:
    remove_tree(tmp);
done:
    free(master);
    free(m);
    free(v);
    return rc;
}

// ----------------------------------------------------------------------------
// resume

int ckpt_resolve(const char *out_dir, const char *resume, char *dir, size_t n) {
    if (strcmp(resume, "latest") != 0) {
        snprintf(dir, n, "%s", resume);
        return 0;
    }
    char p[4200], name[256] = "";
    snprintf(p, sizeof p, "%s/checkpoints/latest", out_dir);
    FILE *f = fopen(p, "r");
    if (!f) return ft_error("--resume latest: %s: no checkpoint to resume (%s)", p, strerror(errno));
    int ok = fgets(name, sizeof name, f) != NULL;
    fclose(f);
    name[strcspn(name, "\r\n")] = '\0';
    if (!ok || !name[0] || strchr(name, '/')) return ft_error("%s: does not name a checkpoint directory", p);
    snprintf(dir, n, "%s/checkpoints/%s", out_dir, name);
    return 0;
}

static int state_int(const char *path, json_t *root, const char *key, long long *out) {
    json_t *v = json_object_get(root, key);
    if (json_is_boolean(v)) { *out = json_is_true(v); return 0; }
    if (!json_is_integer(v)) return ft_error("%s: field '%s' missing or not an integer", path, key);
    *out = json_integer_value(v);
    return 0;
}

static int read_state(const char *dir, trainer_state *ts) {
    char p[4200];
    snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    json_error_t jerr;
    json_t *root = json_load_file(p, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return ft_error("%s: not a finetune checkpoint: %s", p, jerr.text);
    int rc = -1;
    json_t *fmt = json_object_get(root, "format");
    long long v[9];
    static const char *keys[9] = {"step", "epoch", "row", "seed", "total_batch_size", "seq_len", "pack",
                                  "total_steps", "n_params"};
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), CKPT_FORMAT) != 0) {
        ft_error("%s: field 'format' is not \"" CKPT_FORMAT "\"", p);
        goto done;
    }
    for (int i = 0; i < 9; i++) TRY_GOTO(state_int(p, root, keys[i], &v[i]), done);
    if (v[0] < 0 || v[1] < 0 || v[2] < 0) { ft_error("%s: negative step/epoch/row", p); goto done; }
    *ts = (trainer_state){(int)v[0], (int)v[1], (uint64_t)v[2], (int)v[3], (int)v[4], (int)v[5], (int)v[6],
                          (int)v[7], v[8]};
    rc = 0;
done:
    json_decref(root);
    return rc;
}

int ckpt_load_weights(fsdp_state *s, const char *dir) {
    hf_checkpoint ck;
    TRY(hf_checkpoint_open(&ck, dir));
    int rc = hf_checkpoint_validate(&ck, s->layout);   // names and shapes against this model
    float *host = rc == 0 ? ft_malloc(s->max_unit * sizeof(float), "checkpoint unit buffer") : NULL;
    if (rc == 0 && !host) rc = -1;
    for (int u = 0; u < s->layout->n_units && rc == 0; u++) {
        rc = hf_checkpoint_read_unit(&ck, s->layout, u, host);
        if (rc == 0) rc = fsdp_set_unit(s, FSDP_MASTER, u, host);
    }
    free(host);
    hf_checkpoint_close(&ck);
    return rc;
}

int ckpt_load(const char *dir, fsdp_state *s, const trainer_state *want, trainer_state *got) {
    TRY(read_state(dir, got));
    // the data order depends on these: a mismatch would silently train on other rows
    const struct { const char *flag; long long have, need; } checks[] = {
        {"model parameter count", got->n_params, want->n_params},
        {"--seed", got->seed, want->seed},
        {"--total_batch_size", got->total_batch_size, want->total_batch_size},
        {"--seq_len", got->seq_len, want->seq_len},
        {"--pack", got->pack, want->pack},
    };
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++)
        if (checks[i].have != checks[i].need)
            return ft_error("%s: incompatible checkpoint: it was trained with %s %lld, this run has %lld", dir,
                            checks[i].flag, checks[i].have, checks[i].need);
    if (got->step > want->total_steps)
        return ft_error("%s: checkpoint is at step %d, past this run's %d total steps", dir, got->step,
                        want->total_steps);
    TRY(ckpt_load_weights(s, dir));

    char p[4200];
    snprintf(p, sizeof p, "%s/optimizer.safetensors", dir);
    st_file f;
    TRY(st_open(&f, p));
    const param_layout *l = s->layout;
    float *unit = ft_malloc(s->max_unit * sizeof(float), "optimizer unit buffer");
    int rc = unit ? 0 : -1;
    for (int k = 0; k < 2 && rc == 0; k++) {
        const char *prefix = k == 0 ? "exp_avg." : "exp_avg_sq.";
        for (int u = 0; u < l->n_units && rc == 0; u++) {
            memset(unit, 0, l->unit_numel[u] * sizeof(float));
            for (int i = 0; i < l->n_entries && rc == 0; i++) {
                const param_entry *e = &l->entries[i];
                if (e->unit != u) continue;
                char name[160];
                snprintf(name, sizeof name, "%s%s", prefix, e->name);
                const st_tensor *t = st_find(&f, name);
                if (!t || t->dtype != ST_F32 || t->numel != e->numel)
                    rc = ft_error("%s: tensor '%s' missing, not F32, or of the wrong size", p, name);
                else memcpy(unit + e->unit_offset, t->data, e->numel * sizeof(float));
            }
            if (rc == 0) rc = fsdp_set_unit(s, k == 0 ? FSDP_EXP_AVG : FSDP_EXP_AVG_SQ, u, unit);
        }
    }
    free(unit);
    st_close(&f);
    return rc;
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

int ckpt_export_hf(const char *dir, const char *model_dir, fsdp_state *s, const char *dtype, int world_rank) {
    float *master = gather_all(s, FSDP_MASTER);
    if (!master) return -1;
    int rc = 0;
    if (world_rank != 0) goto done;
    rc = -1;
    char tmp[4200], p[4400], src[4400];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", dir, (int)getpid());
    remove_tree(tmp);
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) { *slash = '\0'; TRY_GOTO(ckpt_mkdirs(parent), done); }
    if (mkdir(tmp, 0755) != 0) { ft_error("%s: cannot create: %s", tmp, strerror(errno)); goto done; }
    const param_layout *l = s->layout;
    st_dtype dt = strcmp(dtype, "bf16") == 0 ? ST_BF16 : ST_F32;
    if (dt == ST_BF16) {
        // in place fp32 -> bf16 (element i's 2 bytes land at 2i, after 4i.. was read)
        uint16_t *h = (uint16_t *)master;
        for (size_t i = 0; i < l->total; i++) h[i] = ft_f32_to_bf16(master[i]);
    }
    snprintf(p, sizeof p, "%s/model.safetensors", tmp);
    TRY_GOTO(write_params(p, l, master, dt, "", NULL, NULL), fail);
    snprintf(src, sizeof src, "%s/config.json", model_dir);
    snprintf(p, sizeof p, "%s/config.json", tmp);
    TRY_GOTO(write_config(src, p, dtype), fail);
    static const char *extra[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                  "generation_config.json", "tokenizer.model"};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
        snprintf(src, sizeof src, "%s/%s", model_dir, extra[i]);
        if (access(src, R_OK) != 0) continue;
        snprintf(p, sizeof p, "%s/%s", tmp, extra[i]);
        TRY_GOTO(copy_file(src, p), fail);
    }
    TRY_GOTO(publish_dir(tmp, dir), fail);
    rc = 0;
    goto done;
fail:
    remove_tree(tmp);
done:
    free(master);
    return rc;
}
