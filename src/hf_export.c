// hf_export.c: the Hugging Face export of a run's weights (full model, PEFT adapters, merged
// LoRA), and the streaming writer of parameter-shaped safetensors files that the exports and
// the resumable checkpoints (src/ckpt.c) share (see hf_export.h).
#include "hf_export.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "fsutil.h"
#include "hf_checkpoint.h"

// ----------------------------------------------------------------------------
// streaming consolidated tensors: gathered one unit at a time (collective), written on rank 0

// Open `w` on `path` for the tensors of `pf`. 0 / -1 (nothing left behind).
static int param_file_open(st_writer *w, const char *path, const param_layout *l, const hf_param_file *pf) {
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
static void unit_to_dtype(const hf_param_file *pf, float *host, size_t n) {
    if (pf->dtype != ST_BF16) return;
    uint16_t *h = (uint16_t *)host;
    for (size_t i = 0; i < n; i++) h[i] = ft_f32_to_bf16(host[i]);
}

// Put the tensors of unit u, block k, from `unit` (the unit's unit_numel[u] elements in pf->dtype).
static int param_file_put_unit(st_writer *w, const param_layout *l, const hf_param_file *pf, int k, int u,
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
static int param_file_stream(fsdp_state *s, const char *path, const hf_param_file *pf, int write, float *host) {
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

int hf_export_stream(fsdp_state *s, const char *dir, const hf_param_file *pf, const char *const *name, int n,
                     int write) {
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

int hf_export_model(const char *dir, const char *model_dir, fsdp_state *s, const char *dtype, int world_rank) {
    static const char *const prefix[] = {""};
    static const fsdp_buffer which[] = {FSDP_MASTER};
    static const char *const names[] = {"model.safetensors"};
    const hf_param_file file = {prefix, which, 1, strcmp(dtype, "bf16") == 0 ? ST_BF16 : ST_F32};
    char tmp[FT_PATH_MAX] = "";
    int rc = world_rank == 0 ? export_dir_create(dir, tmp, sizeof tmp) : 0;
    const int write = world_rank == 0 && rc == 0;
    if (hf_export_stream(s, tmp, &file, names, 1, write) != 0) rc = -1;
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

int hf_export_peft(const char *dir, const char *model_dir, fsdp_state *s, const lora_layout *ll, const char *dtype,
                   int world_rank) {
    static const char *const prefix[] = {""};
    static const fsdp_buffer which[] = {FSDP_MASTER};
    static const char *const names[] = {"adapter_model.safetensors"};
    const hf_param_file file = {prefix, which, 1, strcmp(dtype, "bf16") == 0 ? ST_BF16 : ST_F32};
    char tmp[4200] = "";
    int rc = world_rank == 0 ? export_dir_create(dir, tmp, sizeof tmp) : 0;
    const int write = world_rank == 0 && rc == 0;
    if (hf_export_stream(s, tmp, &file, names, 1, write) != 0) rc = -1;
    if (write && rc == 0) rc = write_adapter_config(tmp, model_dir, ll);
    if (write && rc == 0) rc = copy_export_extra(model_dir, tmp, N_TOKENIZER_FILES);
    if (write && rc == 0) rc = fs_publish_dir(tmp, dir);
    if (write && rc != 0) fs_remove_tree(tmp);
    return rc;
}

// ----------------------------------------------------------------------------
// merged LoRA export

// Rank 0: stream base unit u (from `ck`) with `adapters_unit` merged into it to `w`. 0 / -1.
static int merged_put_unit(st_writer *w, const hf_param_file *pf, const hf_checkpoint *ck, const param_layout *base,
                           const lora_layout *ll, int u, const float *adapters_unit, float *host) {
    TRY(hf_checkpoint_read_unit(ck, base, u, host));   // (unit_numel[u],) fp32
    lora_merge_unit(ll, base, u, adapters_unit, host);
    unit_to_dtype(pf, host, base->unit_numel[u]);
    return param_file_put_unit(w, base, pf, 0, u, host);
}

int hf_export_merged(const char *dir, const char *model_dir, const param_layout *base, fsdp_state *adapters,
                     const lora_layout *ll, const char *dtype, int world_rank) {
    static const char *const prefix[] = {""};
    static const fsdp_buffer which[] = {FSDP_MASTER};
    const hf_param_file file = {prefix, which, 1, strcmp(dtype, "bf16") == 0 ? ST_BF16 : ST_F32};
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
