// test_config.c: config.json parsing. A valid base config is mutated one field at a time
// (set to a JSON value, or deleted); each case either loads and checks the parsed value or
// must fail with one line naming the file and the field.
#include <jansson.h>
#include <unistd.h>

#include "common.h"
#include "config.h"
#include "lora.h"
#include "model.h"
#include "test.h"

static const char *base_json =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"hidden_size\":64,"
    "\"intermediate_size\":128,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
    "\"vocab_size\":100,\"rms_norm_eps\":1e-5,\"max_position_embeddings\":128,\"rope_theta\":10000.0,"
    "\"tie_word_embeddings\":false,\"bos_token_id\":1,\"eos_token_id\":2,\"hidden_act\":\"silu\","
    "\"attention_bias\":false,\"mlp_bias\":false,\"torch_dtype\":\"float32\"}";

#define DELETE "<delete>"

typedef struct {
    const char *name;
    const char *field;     // top-level key to change; NULL = whole document is `value`
    const char *value;     // JSON text, or DELETE
    const char *want;      // error substring; NULL = must load
    int (*check)(const llama_config *c);  // for loading cases: extra checks (1 = ok)
} cfg_case;

static int chk_base(const llama_config *c) {
    return c->hidden_size == 64 && c->head_dim == 16 && c->num_key_value_heads == 2 && c->n_eos == 1 &&
           c->eos_token_ids[0] == 2 && c->rope_scaling == ROPE_SCALING_NONE && c->rope_theta == 10000.0 &&
           c->rms_norm_eps == 1e-5f && !c->tie_word_embeddings && strcmp(c->torch_dtype, "float32") == 0;
}
static int chk_kv_default(const llama_config *c) { return c->num_key_value_heads == 4; }
static int chk_head_dim(const llama_config *c) { return c->head_dim == 32; }
static int chk_eos_list(const llama_config *c) { return c->n_eos == 3 && c->eos_token_ids[2] == 9; }
static int chk_linear(const llama_config *c) { return c->rope_scaling == ROPE_SCALING_LINEAR && c->rope_factor == 4.0; }
static int chk_llama3(const llama_config *c) {
    return c->rope_scaling == ROPE_SCALING_LLAMA3 && c->rope_factor == 8.0 && c->rope_low_freq_factor == 1.0 &&
           c->rope_high_freq_factor == 4.0 && c->rope_original_max_position_embeddings == 8192;
}
static int chk_linear10k(const llama_config *c) { return chk_linear(c) && c->rope_theta == 10000.0; }
static int chk_params5(const llama_config *c) { return c->rope_theta == 500000.0 && c->rope_scaling == ROPE_SCALING_NONE; }
static int chk_tied(const llama_config *c) { return c->tie_word_embeddings == 1; }
static int chk_nobos(const llama_config *c) { return c->bos_token_id == -1; }

static const cfg_case cases[] = {
    {"base", NULL, NULL, NULL, chk_base},
    {"kv heads default to heads", "num_key_value_heads", DELETE, NULL, chk_kv_default},
    {"explicit head_dim", "head_dim", "32", NULL, chk_head_dim},
    {"eos list", "eos_token_id", "[2, 5, 9]", NULL, chk_eos_list},
    {"rope_scaling linear", "rope_scaling", "{\"type\":\"linear\",\"factor\":4.0}", NULL, chk_linear},
    {"rope_scaling llama3", "rope_scaling",
     "{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
     "\"original_max_position_embeddings\":8192}", NULL, chk_llama3},
    {"rope_parameters (transformers 5)", "rope_parameters", "{\"rope_type\":\"default\",\"rope_theta\":500000.0}",
     NULL, chk_params5},
    {"rope_scaling null", "rope_scaling", "null", NULL, chk_base},
    {"rope_scaling {}", "rope_scaling", "{}", NULL, chk_base},
    // transformers 5: rope_parameters = rope_scaling or rope_parameters, the theta of neither
    // object from the top level
    {"rope_scaling beside rope_parameters: rope_scaling counts", NULL,
     "{\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
     "\"vocab_size\":100,\"rope_theta\":10000.0,\"rope_parameters\":{\"rope_type\":\"default\","
     "\"rope_theta\":500000.0},\"rope_scaling\":{\"type\":\"linear\",\"factor\":4.0}}",
     NULL, chk_linear10k},
    {"rope_scaling {} beside rope_parameters", NULL,
     "{\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
     "\"vocab_size\":100,\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":500000.0},"
     "\"rope_scaling\":{}}", NULL, chk_params5},
    {"nested rope_theta null: the top-level one counts", NULL,
     "{\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
     "\"vocab_size\":100,\"rms_norm_eps\":1e-5,\"max_position_embeddings\":128,\"rope_theta\":500000.0,"
     "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":null}}",
     NULL, chk_params5},
    {"tied", "tie_word_embeddings", "true", NULL, chk_tied},
    {"bos null", "bos_token_id", "null", NULL, chk_nobos},
    {"dtype spelled dtype", "torch_dtype", DELETE, NULL, NULL},

    {"not an object", NULL, "[1, 2]", "not a JSON object", NULL},
    {"invalid JSON", NULL, "{\"hidden_size\": ", "invalid JSON", NULL},
    {"duplicate key", NULL, "{\"hidden_size\": 64, \"hidden_size\": 64}", "invalid JSON", NULL},
    {"hidden_size missing", "hidden_size", DELETE, "field 'hidden_size' is missing", NULL},
    {"vocab_size missing", "vocab_size", DELETE, "field 'vocab_size' is missing", NULL},
    {"hidden_size string", "hidden_size", "\"64\"", "field 'hidden_size' is not an integer", NULL},
    {"hidden_size float", "hidden_size", "64.5", "field 'hidden_size' is not an integer", NULL},
    {"hidden_size zero", "hidden_size", "0", "field 'hidden_size' = 0 is out of range", NULL},
    {"layers negative", "num_hidden_layers", "-3", "field 'num_hidden_layers' = -3", NULL},
    {"vocab absurd", "vocab_size", "100000000000", "field 'vocab_size'", NULL},
    {"intermediate absurd", "intermediate_size", "2147483648", "field 'intermediate_size'", NULL},
    {"kv does not divide heads", "num_key_value_heads", "3", "does not divide num_attention_heads", NULL},
    {"hidden not divisible by heads", "num_attention_heads", "6", "not divisible by num_attention_heads", NULL},
    {"odd head_dim", "head_dim", "15", "field 'head_dim' = 15 must be even", NULL},
    {"absurd head_dim", "head_dim", "4096", "field 'head_dim' = 4096 is out of range", NULL},
    {"attention_bias", "attention_bias", "true", "field 'attention_bias' = true is not supported", NULL},
    {"mlp_bias", "mlp_bias", "true", "field 'mlp_bias' = true is not supported", NULL},
    {"gelu", "hidden_act", "\"gelu\"", "field 'hidden_act'", NULL},
    {"not llama", "model_type", "\"mistral\"", "field 'model_type'", NULL},
    {"wrong architecture", "architectures", "[\"GPT2LMHeadModel\"]", "field 'architectures'", NULL},
    {"unknown rope type", "rope_scaling", "{\"rope_type\":\"yarn\",\"factor\":4.0}",
     "field 'rope_scaling.rope_type' = 'yarn' is not supported", NULL},
    {"rope type missing", "rope_scaling", "{\"factor\":4.0}", "rope_scaling.rope_type", NULL},
    // keys inside rope_scaling (4.x) / rope_parameters (5.x) are named with the object's prefix
    {"linear without factor", "rope_scaling", "{\"rope_type\":\"linear\"}", "field 'rope_scaling.factor' is missing",
     NULL},
    {"factor not a number (5.x)", "rope_parameters", "{\"rope_type\":\"linear\",\"factor\":\"4\"}",
     "field 'rope_parameters.factor' is not a number", NULL},
    {"factor negative", "rope_scaling", "{\"type\":\"linear\",\"factor\":-2}",
     "field 'rope_scaling.factor' must be positive", NULL},
    {"llama3 without low_freq_factor (5.x)", "rope_parameters",
     "{\"rope_type\":\"llama3\",\"factor\":8.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192}",
     "field 'rope_parameters.low_freq_factor' is missing", NULL},
    {"llama3 high <= low freq factor", "rope_scaling",
     "{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":4.0,\"high_freq_factor\":4.0,"
     "\"original_max_position_embeddings\":8192}",
     "field 'rope_scaling.high_freq_factor' must exceed rope_scaling.low_freq_factor", NULL},
    {"llama3 original not an integer (5.x)", "rope_parameters",
     "{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
     "\"original_max_position_embeddings\":81.5}",
     "field 'rope_parameters.original_max_position_embeddings' is not an integer", NULL},
    {"nested rope_theta <= 1 (5.x)", "rope_parameters", "{\"rope_type\":\"default\",\"rope_theta\":0.5}",
     "field 'rope_parameters.rope_theta' must be > 1", NULL},
    {"nested rope_theta not a number (5.x)", "rope_parameters", "{\"rope_type\":\"default\",\"rope_theta\":[1]}",
     "field 'rope_parameters.rope_theta' is not a number", NULL},
    {"legacy type not a string", "rope_scaling", "{\"type\":5,\"factor\":4.0}",
     "field 'rope_scaling.type' is missing or not a string", NULL},
    {"legacy type unknown", "rope_scaling", "{\"type\":\"yarn\",\"factor\":4.0}",
     "field 'rope_scaling.type' = 'yarn' is not supported", NULL},
    {"rope_type missing (5.x)", "rope_parameters", "{\"rope_theta\":500000.0}",
     "field 'rope_parameters.rope_type' is missing or not a string", NULL},
    {"llama3 without original", "rope_scaling",
     "{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0}",
     "original_max_position_embeddings", NULL},
    {"rope_scaling not object", "rope_scaling", "\"linear\"", "field 'rope_scaling' is not an object", NULL},
    {"negative rope_theta", "rope_theta", "-1", "field 'rope_theta' must be > 1", NULL},
    {"eps zero", "rms_norm_eps", "0", "rms_norm_eps", NULL},
    {"eos out of vocab", "eos_token_id", "100", "field 'eos_token_id'", NULL},
    {"eos list bad", "eos_token_id", "[2, \"x\"]", "eos_token_id[1]", NULL},
    {"eos object", "eos_token_id", "{}", "eos_token_id", NULL},
    {"bad dtype", "torch_dtype", "\"float8\"", "torch_dtype", NULL},
    {"tie not bool", "tie_word_embeddings", "1", "field 'tie_word_embeddings' is not true/false", NULL},
    {"pretraining_tp 2", "pretraining_tp", "2", "pretraining_tp", NULL},
};

int main(void) {
    char path[] = "/tmp/ft_test_config_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) { perror("mkstemp"); return 1; }
    close(fd);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const cfg_case *c = &cases[i];
        char *text;
        if (!c->field && c->value) {
            text = strdup(c->value);
        } else {
            json_t *root = json_loads(base_json, 0, NULL);
            if (c->field && strcmp(c->value, DELETE) == 0) json_object_del(root, c->field);
            else if (c->field) json_object_set_new(root, c->field, json_loads(c->value, JSON_DECODE_ANY, NULL));
            if (strcmp(c->name, "dtype spelled dtype") == 0) json_object_set_new(root, "dtype", json_string("bfloat16"));
            text = json_dumps(root, 0);
            json_decref(root);
        }
        FILE *f = fopen(path, "w");
        fputs(text, f);
        fclose(f);
        free(text);
        ft_error_clear();
        llama_config cfg;
        int rc = llama_config_load(&cfg, path);
        const char *msg = ft_error_message();
        if (!c->want) {
            EXPECT(rc == 0, "%s: should load, got: %s", c->name, msg);
            if (rc == 0 && c->check) EXPECT(c->check(&cfg), "%s: parsed values wrong", c->name);
            if (rc == 0 && strcmp(c->name, "dtype spelled dtype") == 0)
                EXPECT(strcmp(cfg.torch_dtype, "bfloat16") == 0, "dtype: got '%s'", cfg.torch_dtype);
        } else {
            EXPECT(rc != 0 && strstr(msg, c->want) && strstr(msg, path) && !strchr(msg, '\n'),
                   "%s: error '%s' should name the file and contain '%s'", c->name, msg, c->want);
        }
    }
    // a missing file
    ft_error_clear();
    llama_config cfg;
    EXPECT(llama_config_load(&cfg, "/nonexistent/config.json") != 0 &&
           strstr(ft_error_message(), "/nonexistent/config.json"), "missing file: %s", ft_error_message());
    // parameter count of the base config: embed 6400 + 2 x (q 4096 + k,v 2x2048 + o 4096 + mlp 3x8192 + 128) + 64 + lm_head 6400
    ft_error_clear();
    FILE *f = fopen(path, "w");
    fputs(base_json, f);
    fclose(f);
    llama_config_load(&cfg, path);
    size_t want = 6400 + 2 * (4096 + 4096 + 4096 + 3 * 8192 + 128) + 64 + 6400;
    param_layout l;   // the parameter count's one definition: the layout's size table
    EXPECT(param_layout_init(&l, &cfg, 1) == 0 && l.n_params == want, "param count %zu, want %zu", l.n_params, want);
    param_layout_free(&l);
    // FLOPs per token at T = 128: 6 x (2 layers x 36864 matmul params (q 4096, k, v 2048, o 4096,
    // gate, up, down 8192) + lm_head 100 x 64) + 3 x 2 layers x attention 2 x 2 x 4 heads x 16 x 64;
    // the same with tied embeddings: the lm_head matmul runs either way (norm weights never count)
    const double flops = 6.0 * (2 * 36864 + 6400) + 3.0 * 2 * (2 * 2 * 4 * 16 * 64);
    EXPECT(model_flops_per_token(&cfg, 128, 0) == flops, "FLOPs/token %.0f, want %.0f", model_flops_per_token(&cfg, 128, 0), flops);
    // the forward alone: 2 x the matmul params + the attention forward
    const double fwd = 2.0 * (2 * 36864 + 6400) + 2 * (2 * 2 * 4 * 16 * 64);
    EXPECT(model_forward_flops_per_token(&cfg, 128, 0) == fwd, "forward FLOPs/token %.0f, want %.0f",
           model_forward_flops_per_token(&cfg, 128, 0), fwd);
    // LoRA rank 2 on q (64 -> 64) and v (64 -> 32): 2 x (64 + 64) + 2 x (64 + 32) = 448 adapter
    // params per layer; the frozen base counts 4 per matmul param (no dW), the adapters 6
    lora_config lc = {.rank = 2, .alpha = 4.0f, .targets = (1u << LT_WQ) | (1u << LT_WV)};
    EXPECT(lora_layer_params(&cfg, &lc) == 448, "LoRA params per layer %.0f, want 448", lora_layer_params(&cfg, &lc));
    const double lora_flops = 4.0 * (2 * 36864 + 6400) + 6.0 * 2 * 448 + 3.0 * 2 * (2 * 2 * 4 * 16 * 64);
    EXPECT(model_flops_per_token(&cfg, 128, 448) == lora_flops, "LoRA FLOPs/token %.0f, want %.0f",
           model_flops_per_token(&cfg, 128, 448), lora_flops);
    EXPECT(model_forward_flops_per_token(&cfg, 128, 448) == fwd + 2.0 * 2 * 448, "LoRA forward FLOPs/token %.0f",
           model_forward_flops_per_token(&cfg, 128, 448));
    cfg.tie_word_embeddings = 1;
    EXPECT(model_flops_per_token(&cfg, 128, 0) == flops, "tied FLOPs/token %.0f, want %.0f", model_flops_per_token(&cfg, 128, 0), flops);
    unlink(path);
    TEST_SUMMARY("test_config");
}
