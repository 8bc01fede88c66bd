// hf_checkpoint.c: Hugging Face checkpoint directories, input side (see hf_checkpoint.h).
#include "hf_checkpoint.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common.h"

// ----------------------------------------------------------------------------
// opening: single file or sharded index

static char *path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = ft_malloc(n, "path");
    if (p && ft_path(p, n, "%s/%s", dir, name) != 0) { free(p); return NULL; }   // cannot fail: n fits
    return p;
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

// index file names must stay inside the checkpoint directory
static int shard_name_ok(const char *name) {
    return name[0] && !strchr(name, '/') && strcmp(name, ".") && strcmp(name, "..");
}

static int open_indexed(hf_checkpoint *ck, const char *index_path) {
    json_error_t jerr;
    json_t *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return ft_error("%s: invalid JSON at line %d: %s", index_path, jerr.line, jerr.text);
    int rc = -1;
    json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(root) || !json_is_object(map)) {
        ft_error("%s: field 'weight_map': missing or not an object", index_path);
        goto done;
    }
    // distinct file names, in first-seen order
    size_t n_names = json_object_size(map);
    const char **names = ft_calloc(n_names ? n_names : 1, sizeof(char *), "shard names");
    if (!names) goto done;
    int n_files = 0;
    const char *key;
    json_t *val;
    json_object_foreach(map, key, val) {
        const char *fname = json_string_value(val);
        if (!json_is_string(val) || !shard_name_ok(fname)) {
            ft_error("%s: weight_map['%s']: not a plain file name inside the checkpoint directory",
                     index_path, key);
            free(names);
            goto done;
        }
        int seen = 0;
        for (int i = 0; i < n_files; i++) seen |= strcmp(names[i], fname) == 0;
        if (!seen) names[n_files++] = fname;
    }
    if (n_files == 0) { ft_error("%s: weight_map is empty", index_path); free(names); goto done; }
    ck->files = ft_calloc((size_t)n_files, sizeof(st_file), "shard table");
    if (!ck->files) { free(names); goto done; }
    for (int i = 0; i < n_files; i++) {
        char *p = path_join(ck->dir, names[i]);
        if (!p) { free(names); goto done; }
        int r = st_open(&ck->files[i], p);
        free(p);
        if (r != 0) { free(names); goto done; }
        ck->n_files = i + 1;
    }
    free(names);
    // every mapped tensor must be in the file the index names
    json_object_foreach(map, key, val) {
        const char *where = NULL;
        const st_tensor *t = hf_checkpoint_find(ck, key, &where);
        if (!t) {
            ft_error("%s: tensor '%s' is mapped to %s, but no file the index names holds it", index_path, key,
                     json_string_value(val) ? json_string_value(val) : "(not a file name)");
            goto done;
        }
        const char *base = strrchr(where, '/');
        if (strcmp(base ? base + 1 : where, json_string_value(val)) != 0) {
            ft_error("%s: tensor '%s' is listed in %s but found in %s", index_path, key,
                     json_string_value(val), where);
            goto done;
        }
    }
    rc = 0;
done:
    json_decref(root);
    return rc;
}

int hf_checkpoint_open(hf_checkpoint *ck, const char *dir) {
    memset(ck, 0, sizeof *ck);
    ck->dir = ft_strdup(dir);
    char *single = path_join(dir, "model.safetensors");
    char *index = path_join(dir, "model.safetensors.index.json");
    int rc = -1;
    if (!ck->dir || !single || !index) goto done;
    if (file_exists(index)) {
        rc = open_indexed(ck, index);
    } else if (file_exists(single)) {
        ck->files = ft_calloc(1, sizeof(st_file), "shard table");
        if (ck->files && st_open(&ck->files[0], single) == 0) { ck->n_files = 1; rc = 0; }
    } else {
        ft_error("%s: no model.safetensors or model.safetensors.index.json", dir);
    }
done:
    free(single);
    free(index);
    if (rc != 0) hf_checkpoint_close(ck);
    return rc;
}

void hf_checkpoint_close(hf_checkpoint *ck) {
    for (int i = 0; i < ck->n_files; i++) st_close(&ck->files[i]);
    free(ck->files);
    free(ck->dir);
    memset(ck, 0, sizeof *ck);
}

// The base name of file i of `ck` (its path without the directory)
static const char *file_base(const hf_checkpoint *ck, int i) {
    const char *slash = strrchr(ck->files[i].path, '/');
    return slash ? slash + 1 : ck->files[i].path;
}

int hf_checkpoint_fingerprint(const char *dir, uint64_t *fp) {
    hf_checkpoint ck;
    TRY(hf_checkpoint_open(&ck, dir));
    int *order = ft_calloc((size_t)ck.n_files, sizeof *order, "shard order");
    if (!order) { hf_checkpoint_close(&ck); return -1; }
    for (int i = 0; i < ck.n_files; i++) {   // insertion sort by file name: a handful of shards
        int k = i;
        for (; k > 0 && strcmp(file_base(&ck, order[k - 1]), file_base(&ck, i)) > 0; k--) order[k] = order[k - 1];
        order[k] = i;
    }
    uint64_t h = FT_FNV_INIT;
    for (int i = 0; i < ck.n_files; i++) h = st_fingerprint(&ck.files[order[i]], h);
    *fp = h ? h : 1;
    free(order);
    hf_checkpoint_close(&ck);
    return 0;
}

const st_tensor *hf_checkpoint_find(const hf_checkpoint *ck, const char *name, const char **path) {
    for (int i = 0; i < ck->n_files; i++) {
        const st_tensor *t = st_find(&ck->files[i], name);
        if (t) { if (path) *path = ck->files[i].path; return t; }
    }
    return NULL;
}

// ----------------------------------------------------------------------------
// validation against the layout

static int tied(const param_layout *l) { return !param_layout_find(l, "lm_head.weight"); }

static int ignorable(const char *name, const param_layout *l) {
    const char *suffix = "rotary_emb.inv_freq";
    size_t n = strlen(name), s = strlen(suffix);
    if (n >= s && strcmp(name + n - s, suffix) == 0) return 1;
    // tied embeddings: a stored lm_head.weight equal to the embeddings is ignored (checked in
    // hf_checkpoint_validate), as transformers does
    return strcmp(name, "lm_head.weight") == 0 && tied(l);
}

// The stored tensor of layout entry `name`. With tied embeddings and no
// model.embed_tokens.weight stored, a stored lm_head.weight is the shared matrix (transformers
// ties to whichever of the two the checkpoint holds).
static const st_tensor *find_entry(const hf_checkpoint *ck, const param_layout *l, const char *name,
                                   const char **path) {
    const st_tensor *t = hf_checkpoint_find(ck, name, path);
    if (!t && tied(l) && strcmp(name, "model.embed_tokens.weight") == 0) t = hf_checkpoint_find(ck, "lm_head.weight", path);
    return t;
}

// Element i of a float tensor (F32, BF16 or F16) as fp32.
static float elem_f32(const st_tensor *t, size_t i) {
    const unsigned char *p = (const unsigned char *)t->data;
    if (t->dtype == ST_F32) { float x; memcpy(&x, p + 4 * i, 4); return x; }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return t->dtype == ST_BF16 ? ft_bf16_to_f32(h) : ft_f16_to_f32(h);
}

// Tied embeddings with both model.embed_tokens.weight and lm_head.weight stored: transformers
// 5 ties them only when they are equal and otherwise loads two matrices (with a warning), so a
// different lm_head.weight would train another model than transformers loads: refused.
// lm_head.weight is read here only, so its checksum is verified here (st_verify), before the
// comparison; the embeddings' is verified when their unit is read (by one rank of a sharded
// job: hf_checkpoint_read_range), and here too when the two differ, so that damage is named as
// such rather than as a different lm_head. Every rank reads both whole here (a base that
// stores both; not split over the ranks like the units). 0 / -1 naming the file and tensor.
static int check_tied_lm_head(const hf_checkpoint *ck, const param_layout *l) {
    const char *epath = NULL, *hpath = NULL;
    const st_tensor *emb = hf_checkpoint_find(ck, "model.embed_tokens.weight", &epath);
    const st_tensor *head = hf_checkpoint_find(ck, "lm_head.weight", &hpath);
    if (!tied(l) || !emb || !head) return 0;
    if (head->dtype != ST_F32 && head->dtype != ST_BF16 && head->dtype != ST_F16)
        return ft_error("%s: tensor 'lm_head.weight': dtype %s is not supported (F32, BF16, F16)", hpath,
                        st_dtype_name(head->dtype));
    TRY(st_verify(head, hpath));
    int same = head->ndim == emb->ndim && head->numel == emb->numel;   // (emb: validated, a float dtype)
    for (int d = 0; same && d < emb->ndim; d++) same = head->shape[d] == emb->shape[d];
    // bitwise equal, else equal as values (-0 == 0, another dtype), as torch.equal compares
    if (same && !(head->dtype == emb->dtype && memcmp(head->data, emb->data, emb->nbytes) == 0))
        for (size_t i = 0; same && i < emb->numel; i++) same = elem_f32(head, i) == elem_f32(emb, i);
    if (!same && st_verify(emb, epath) != 0) return -1;
    if (!same)
        return ft_error("%s: tensor 'lm_head.weight' differs from model.embed_tokens.weight, but config.json has "
                        "tie_word_embeddings true (transformers would not tie them): set it to false to train both",
                        hpath);
    return 0;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

int hf_checkpoint_validate(const hf_checkpoint *ck, const param_layout *l) {
    for (int i = 0; i < l->n_entries; i++) {
        const param_entry *e = &l->entries[i];
        const char *path = NULL;
        const st_tensor *t = find_entry(ck, l, e->name, &path);
        if (!t) {
            // a LoRA run's checkpoint (adapters only, PEFT names) where a model was expected
            static const char peft[] = "base_model.model.";
            const int want_adapter = strncmp(e->name, peft, sizeof peft - 1) == 0;
            for (int f = 0; !want_adapter && f < ck->n_files; f++)
                for (int k = 0; k < ck->files[f].n_tensors; k++)
                    if (strncmp(ck->files[f].tensors[k].name, peft, sizeof peft - 1) == 0)
                        return ft_error("%s: missing tensor '%s': this is a LoRA run's checkpoint (its adapters only, "
                                        "not a model): continue it with --resume and that run's --lora_* flags on its "
                                        "base --model_dir, or use the run's merged export (--merge_lora: "
                                        "OUT/final_merged)", ck->dir, e->name);
            return ft_error("%s: missing tensor '%s'", ck->dir, e->name);
        }
        if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16)
            return ft_error("%s: tensor '%s': dtype %s is not supported (F32, BF16, F16)", path,
                            e->name, st_dtype_name(t->dtype));
        int same = t->ndim == e->ndim;
        for (int d = 0; same && d < e->ndim; d++) same = t->shape[d] == e->shape[d];
        if (!same) {
            char got[96], want[96];
            shape_str(got, sizeof got, t->ndim, t->shape);
            shape_str(want, sizeof want, e->ndim, e->shape);
            return ft_error("%s: tensor '%s': shape %s, config.json implies %s", path, e->name, got, want);
        }
    }
    for (int f = 0; f < ck->n_files; f++) {
        const st_file *sf = &ck->files[f];
        for (int i = 0; i < sf->n_tensors; i++) {
            const char *name = sf->tensors[i].name;
            if (!param_layout_find(l, name) && !ignorable(name, l))
                return ft_error("%s: unexpected tensor '%s' (not part of a LlamaForCausalLM with this config)",
                                sf->path, name);
            for (int g = f + 1; g < ck->n_files; g++)
                if (st_find(&ck->files[g], name))
                    return ft_error("%s: tensor '%s' is also stored in %s", sf->path, name,
                                    ck->files[g].path);
        }
    }
    return check_tied_lm_head(ck, l);
}

// ----------------------------------------------------------------------------
// conversion to fp32

// Elements [from, from + n) of tensor t as fp32 into out.
static void tensor_to_f32(const st_tensor *t, size_t from, size_t n, float *out) {
    if (t->dtype == ST_F32) {
        memcpy(out, (const float *)t->data + from, n * sizeof(float));
    } else {
        // the header length need not keep data 2-byte aligned: read through memcpy
        const unsigned char *src = (const unsigned char *)t->data + 2 * from;
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            out[i] = t->dtype == ST_BF16 ? ft_bf16_to_f32(h) : ft_f16_to_f32(h);
        }
    }
}

int hf_checkpoint_read_range(const hf_checkpoint *ck, const param_layout *l, int u, size_t lo, size_t hi,
                             int verify_index, int verify_count, float *out) {
    if (hi > l->unit_numel[u]) hi = l->unit_numel[u];
    if (lo < hi) memset(out + lo, 0, (hi - lo) * sizeof(float));   // padding
    for (int i = 0, k = 0; i < l->n_entries; i++) {
        const param_entry *e = &l->entries[i];
        if (e->unit != u) continue;
        const int verify = k++ % verify_count == verify_index;
        const size_t a = e->unit_offset > lo ? e->unit_offset : lo;   // [a, b): this entry's part of the range
        const size_t b = e->unit_offset + e->numel < hi ? e->unit_offset + e->numel : hi;
        if (!verify && a >= b) continue;
        const char *path = NULL;
        const st_tensor *t = find_entry(ck, l, e->name, &path);
        if (!t || t->numel != e->numel)
            return ft_error("%s: tensor '%s' missing or mis-sized (validate first)", ck->dir, e->name);
        if (verify) TRY(st_verify(t, path));   // its bytes against the checksum the file records, if any
        if (a >= b) continue;
        float *x = out + a;
        tensor_to_f32(t, a - e->unit_offset, b - a, x);
        const size_t bad = ft_first_nonfinite(x, b - a);   // NaN / inf weights: a corrupt file
        if (bad < b - a)
            return ft_error("%s: tensor '%s': element %zu is %g (not finite)", path, e->name,
                            a - e->unit_offset + bad, x[bad]);
    }
    return 0;
}

int hf_checkpoint_read_unit(const hf_checkpoint *ck, const param_layout *l, int u, float *out) {
    return hf_checkpoint_read_range(ck, l, u, 0, l->unit_numel[u], 0, 1, out);
}
