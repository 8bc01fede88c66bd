// config.c: LlamaForCausalLM config.json -> llama_config, validated (see config.h).
//
// Field spellings accepted, across transformers versions:
//   dtype:  "torch_dtype" (<= 4.x) or "dtype" (5.x)
//   rope:   "rope_scaling" {"rope_type"|"type", "factor", ...} + top-level "rope_theta" (4.x),
//           or "rope_parameters" {"rope_type", "rope_theta", "factor", ...} (5.x); with both,
//           rope_scaling counts (as in transformers 5)
#include "config.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

// Bounds far beyond any real Llama (405B: hidden 16384, 126 layers, vocab 128256); they stop
// a hostile config from driving huge allocations or int overflow in B*T*C style products.
#define MAX_HIDDEN (1 << 17)
#define MAX_INTERMEDIATE (1 << 19)
#define MAX_LAYERS 1024
#define MAX_HEADS 1024
#define MAX_HEAD_DIM 1024
#define MAX_VOCAB (1 << 22)
#define MAX_POSITIONS (1 << 24)

// ----------------------------------------------------------------------------
// field readers: each names the file and the field (parent.field inside an object) in its error

typedef struct { const char *path; json_t *root; } cfg_ctx;

// The key path an error names: "field" at the top level, "parent.field" inside the object
// `parent` (NULL: top level), e.g. "rope_parameters.factor".
static const char *key_path(char *buf, size_t n, const char *parent, const char *field) {
    if (!parent) return field;
    snprintf(buf, n, "%s.%s", parent, field);
    return buf;
}

static int get_int(const cfg_ctx *x, json_t *obj, const char *parent, const char *field, int required, int dflt,
                   int lo, int hi, int *out) {
    char kb[128];
    const char *key = key_path(kb, sizeof kb, parent, field);
    json_t *v = json_object_get(obj, field);
    if (!v || json_is_null(v)) {
        if (required) return ft_error("%s: field '%s' is missing", x->path, key);
        *out = dflt;
        return 0;
    }
    if (!json_is_integer(v)) return ft_error("%s: field '%s' is not an integer", x->path, key);
    json_int_t i = json_integer_value(v);
    if (i < lo || i > hi)
        return ft_error("%s: field '%s' = %lld is out of range [%d, %d]", x->path, key, (long long)i, lo, hi);
    *out = (int)i;
    return 0;
}

static int get_num(const cfg_ctx *x, json_t *obj, const char *parent, const char *field, int required, double dflt,
                   double *out) {
    char kb[128];
    const char *key = key_path(kb, sizeof kb, parent, field);
    json_t *v = json_object_get(obj, field);
    if (!v || json_is_null(v)) {
        if (required) return ft_error("%s: field '%s' is missing", x->path, key);
        *out = dflt;
        return 0;
    }
    if (!json_is_number(v)) return ft_error("%s: field '%s' is not a number", x->path, key);
    *out = json_number_value(v);
    if (!isfinite(*out)) return ft_error("%s: field '%s' is not finite", x->path, key);
    return 0;
}

static int get_bool(const cfg_ctx *x, const char *field, int dflt, int *out) {
    json_t *v = json_object_get(x->root, field);
    if (!v || json_is_null(v)) { *out = dflt; return 0; }
    if (!json_is_boolean(v)) return ft_error("%s: field '%s' is not true/false", x->path, field);
    *out = json_is_true(v);
    return 0;
}

static int get_positive(const cfg_ctx *x, json_t *obj, const char *parent, const char *field, double *out) {
    TRY(get_num(x, obj, parent, field, 1, 0, out));
    char kb[128];
    if (!(*out > 0)) return ft_error("%s: field '%s' must be positive", x->path, key_path(kb, sizeof kb, parent, field));
    return 0;
}

// ----------------------------------------------------------------------------
// rope

// An object field that counts: present, not null and not {} (transformers tests truthiness).
static int given(json_t *v) { return v && !json_is_null(v) && !(json_is_object(v) && json_object_size(v) == 0); }

// rope_theta, and the scaling in rope_parameters (5.x) or rope_scaling (4.x). A key inside
// either object is named with its prefix in errors ("rope_scaling.factor"). With both, the
// rope_scaling counts, as in transformers 5 (`rope_parameters = rope_scaling or
// rope_parameters`) and 4.x (which knows no rope_parameters): a 5.x config.json edited the
// 4.x way keeps its old rope_parameters beside the new rope_scaling.
static int parse_rope(const cfg_ctx *x, llama_config *c) {
    json_t *params = json_object_get(x->root, "rope_parameters");
    json_t *scaling = json_object_get(x->root, "rope_scaling");
    json_t *r = NULL;
    const char *field = NULL;
    if (given(scaling)) { r = scaling; field = "rope_scaling"; }
    else if (given(params)) { r = params; field = "rope_parameters"; }
    if (r && !json_is_object(r)) return ft_error("%s: field '%s' is not an object", x->path, field);

    // theta: rope_parameters.rope_theta wins over the top-level field (a null one does not)
    json_t *nested_theta = r ? json_object_get(r, "rope_theta") : NULL;
    const int nested = nested_theta && !json_is_null(nested_theta);
    const char *theta_parent = nested ? field : NULL;
    TRY(get_num(x, nested ? r : x->root, theta_parent, "rope_theta", 0, 10000.0, &c->rope_theta));
    char kb[128];
    if (!(c->rope_theta > 1.0))
        return ft_error("%s: field '%s' must be > 1", x->path, key_path(kb, sizeof kb, theta_parent, "rope_theta"));

    c->rope_scaling = ROPE_SCALING_NONE;
    c->rope_factor = 1.0;
    if (!r) return 0;
    const char *type_key = json_object_get(r, "rope_type") || !json_object_get(r, "type") ? "rope_type" : "type";
    json_t *jt = json_object_get(r, type_key);
    const char *type = json_is_string(jt) ? json_string_value(jt) : NULL;
    if (!type) return ft_error("%s: field '%s.%s' is missing or not a string", x->path, field, type_key);
    if (strcmp(type, "default") == 0) return 0;
    if (strcmp(type, "linear") == 0) {
        c->rope_scaling = ROPE_SCALING_LINEAR;
        return get_positive(x, r, field, "factor", &c->rope_factor);
    }
    if (strcmp(type, "llama3") == 0) {
        c->rope_scaling = ROPE_SCALING_LLAMA3;
        TRY(get_positive(x, r, field, "factor", &c->rope_factor));
        TRY(get_positive(x, r, field, "low_freq_factor", &c->rope_low_freq_factor));
        TRY(get_positive(x, r, field, "high_freq_factor", &c->rope_high_freq_factor));
        if (!(c->rope_high_freq_factor > c->rope_low_freq_factor))
            return ft_error("%s: field '%s.high_freq_factor' must exceed %s.low_freq_factor", x->path, field, field);
        return get_int(x, r, field, "original_max_position_embeddings", 1, 0, 1, MAX_POSITIONS,
                       &c->rope_original_max_position_embeddings);
    }
    return ft_error("%s: field '%s.%s' = '%s' is not supported (default, linear, llama3)", x->path, field, type_key,
                    type);
}

// ----------------------------------------------------------------------------
// the whole config

// model_type and architectures, when present, must name a Llama causal LM.
static int parse_architecture(const cfg_ctx *x) {
    json_t *root = x->root;
    json_t *mt = json_object_get(root, "model_type");
    if (mt && (!json_is_string(mt) || strcmp(json_string_value(mt), "llama") != 0))
        return ft_error("%s: field 'model_type' is not \"llama\"", x->path);
    json_t *arch = json_object_get(root, "architectures");
    if (arch && !json_is_null(arch)) {
        json_t *a0 = json_is_array(arch) ? json_array_get(arch, 0) : NULL;
        if (!json_is_string(a0) || strcmp(json_string_value(a0), "LlamaForCausalLM") != 0)
            return ft_error("%s: field 'architectures' is not [\"LlamaForCausalLM\"]", x->path);
    }
    return 0;
}

// The shapes: sizes, heads, head_dim (given, or hidden / heads).
static int parse_shape(const cfg_ctx *x, llama_config *c) {
    json_t *root = x->root;
    TRY(get_int(x, root, NULL, "hidden_size", 1, 0, 1, MAX_HIDDEN, &c->hidden_size));
    TRY(get_int(x, root, NULL, "intermediate_size", 1, 0, 1, MAX_INTERMEDIATE, &c->intermediate_size));
    TRY(get_int(x, root, NULL, "num_hidden_layers", 1, 0, 1, MAX_LAYERS, &c->num_hidden_layers));
    TRY(get_int(x, root, NULL, "num_attention_heads", 1, 0, 1, MAX_HEADS, &c->num_attention_heads));
    TRY(get_int(x, root, NULL, "num_key_value_heads", 0, c->num_attention_heads, 1, MAX_HEADS,
                &c->num_key_value_heads));
    TRY(get_int(x, root, NULL, "vocab_size", 1, 0, 1, MAX_VOCAB, &c->vocab_size));
    TRY(get_int(x, root, NULL, "max_position_embeddings", 0, 2048, 1, MAX_POSITIONS, &c->max_position_embeddings));
    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return ft_error("%s: field 'num_key_value_heads' = %d does not divide num_attention_heads = %d",
                        x->path, c->num_key_value_heads, c->num_attention_heads);
    json_t *hd = json_object_get(root, "head_dim");
    if (hd && !json_is_null(hd)) {
        TRY(get_int(x, root, NULL, "head_dim", 1, 0, 1, MAX_HEAD_DIM, &c->head_dim));
    } else {
        if (c->hidden_size % c->num_attention_heads != 0)
            return ft_error("%s: field 'hidden_size' = %d is not divisible by num_attention_heads = %d "
                            "(and no head_dim is given)", x->path, c->hidden_size, c->num_attention_heads);
        c->head_dim = c->hidden_size / c->num_attention_heads;
    }
    if (c->head_dim % 2 != 0)
        return ft_error("%s: field 'head_dim' = %d must be even for rotary embeddings", x->path, c->head_dim);
    if ((long long)c->head_dim * c->num_attention_heads > MAX_HIDDEN)
        return ft_error("%s: head_dim x num_attention_heads = %lld is absurd", x->path,
                        (long long)c->head_dim * c->num_attention_heads);
    return 0;
}

// Norm epsilon, RoPE, and the variants we do not implement (biases, other activations,
// pretraining_tp), refused by name.
static int parse_numerics(const cfg_ctx *x, llama_config *c) {
    json_t *root = x->root;
    double eps;
    TRY(get_num(x, root, NULL, "rms_norm_eps", 0, 1e-6, &eps));
    if (!(eps > 0 && eps < 1)) return ft_error("%s: field 'rms_norm_eps' must be in (0, 1)", x->path);
    c->rms_norm_eps = (float)eps;
    TRY(parse_rope(x, c));

    int bias;
    TRY(get_bool(x, "attention_bias", 0, &bias));
    if (bias) return ft_error("%s: field 'attention_bias' = true is not supported", x->path);
    TRY(get_bool(x, "mlp_bias", 0, &bias));
    if (bias) return ft_error("%s: field 'mlp_bias' = true is not supported", x->path);
    TRY(get_bool(x, "tie_word_embeddings", 0, &c->tie_word_embeddings));
    json_t *act = json_object_get(root, "hidden_act");
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0))
        return ft_error("%s: field 'hidden_act' must be \"silu\"", x->path);
    json_t *tp = json_object_get(root, "pretraining_tp");
    if (tp && !json_is_null(tp) && (!json_is_integer(tp) || json_integer_value(tp) != 1))
        return ft_error("%s: field 'pretraining_tp' other than 1 is not supported", x->path);
    return 0;
}

// bos_token_id, and eos_token_id as an int or a list.
static int parse_special_tokens(const cfg_ctx *x, llama_config *c) {
    json_t *root = x->root;
    TRY(get_int(x, root, NULL, "bos_token_id", 0, -1, 0, c->vocab_size - 1, &c->bos_token_id));
    json_t *eos = json_object_get(root, "eos_token_id");
    c->n_eos = 0;
    if (json_is_integer(eos)) {
        TRY(get_int(x, root, NULL, "eos_token_id", 1, 0, 0, c->vocab_size - 1, &c->eos_token_ids[0]));
        c->n_eos = 1;
    } else if (json_is_array(eos)) {
        if (json_array_size(eos) > CONFIG_MAX_EOS)
            return ft_error("%s: field 'eos_token_id' lists more than %d ids", x->path, CONFIG_MAX_EOS);
        size_t i;
        json_t *e;
        json_array_foreach(eos, i, e) {
            if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= c->vocab_size)
                return ft_error("%s: field 'eos_token_id[%zu]' is not a token id below vocab_size", x->path, i);
            c->eos_token_ids[c->n_eos++] = (int)json_integer_value(e);
        }
    } else if (eos && !json_is_null(eos)) {
        return ft_error("%s: field 'eos_token_id' is not an integer or a list", x->path);
    }
    return 0;
}

// torch_dtype (or dtype): float32, bfloat16, float16, or absent.
static int parse_dtype(const cfg_ctx *x, llama_config *c) {
    json_t *root = x->root;
    json_t *dt = json_object_get(root, "torch_dtype");
    if (!dt || json_is_null(dt)) dt = json_object_get(root, "dtype");
    c->torch_dtype[0] = '\0';
    if (dt && !json_is_null(dt)) {
        const char *s = json_is_string(dt) ? json_string_value(dt) : "";
        if (strcmp(s, "float32") && strcmp(s, "bfloat16") && strcmp(s, "float16"))
            return ft_error("%s: field 'torch_dtype' must be float32, bfloat16 or float16", x->path);
        snprintf(c->torch_dtype, sizeof c->torch_dtype, "%s", s);
    }
    return 0;
}

static int parse_config(const cfg_ctx *x, llama_config *c) {
    TRY(parse_architecture(x));
    TRY(parse_shape(x, c));
    TRY(parse_numerics(x, c));
    TRY(parse_special_tokens(x, c));
    return parse_dtype(x, c);
}

// A directory whose config.json is missing but holds a PEFT adapter (adapter_config.json, e.g.
// a LoRA run's OUT/final): -1 with an error that says so and names its base; 0 otherwise.
static int refuse_adapter_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash || strcmp(slash, "/config.json") != 0) return 0;
    char dir[FT_PATH_MAX], adapter[FT_PATH_MAX];
    if (ft_path(dir, sizeof dir, "%.*s", (int)(slash - path), path) != 0 ||
        ft_path(adapter, sizeof adapter, "%s/adapter_config.json", dir) != 0) {
        ft_error_clear();
        return 0;
    }
    json_t *a = json_load_file(adapter, 0, NULL);
    if (!a) return 0;
    const char *base = json_string_value(json_object_get(a, "base_model_name_or_path"));
    int rc = ft_error("%s: no config.json: this is a PEFT adapter (adapter_config.json), not a model; pass its base "
                      "model%s%s%s as --model_dir (with --lora_rank to train new adapters on it), or the merged model "
                      "(a LoRA run's --merge_lora writes OUT/final_merged)", dir, base ? " (" : "", base ? base : "",
                      base ? ")" : "");
    json_decref(a);
    return rc;
}

int llama_config_load(llama_config *c, const char *path) {
    memset(c, 0, sizeof *c);
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root && access(path, F_OK) != 0) TRY(refuse_adapter_dir(path));
    if (!root) {
        if (jerr.line < 0 || jerr.position == 0) return ft_error("%s: cannot read: %s", path, jerr.text);
        return ft_error("%s: invalid JSON at line %d: %s", path, jerr.line, jerr.text);
    }
    int rc;
    if (!json_is_object(root)) rc = ft_error("%s: not a JSON object", path);
    else {
        cfg_ctx x = {path, root};
        rc = parse_config(&x, c);
    }
    json_decref(root);
    return rc;
}
