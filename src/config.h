// config.h: the Llama model configuration, read from a Hugging Face config.json.
#pragma once

typedef enum { ROPE_SCALING_NONE, ROPE_SCALING_LINEAR, ROPE_SCALING_LLAMA3 } rope_scaling_type;

#define CONFIG_MAX_EOS 8

typedef struct {
    int hidden_size;              // C
    int intermediate_size;        // F
    int num_hidden_layers;        // L
    int num_attention_heads;      // H
    int num_key_value_heads;      // KVH (defaults to H when absent)
    int head_dim;                 // D (defaults to C / H when absent)
    int vocab_size;               // V
    int max_position_embeddings;
    float rms_norm_eps;
    double rope_theta;            // default 10000
    rope_scaling_type rope_scaling;
    double rope_factor;           // linear and llama3
    double rope_low_freq_factor;  // llama3
    double rope_high_freq_factor; // llama3
    int rope_original_max_position_embeddings; // llama3
    int tie_word_embeddings;      // default 0 (LlamaConfig default)
    int bos_token_id;             // -1 when absent/null
    int n_eos;                    // eos_token_id may be an int or a list
    int eos_token_ids[CONFIG_MAX_EOS];
    char torch_dtype[16];         // "float32", "bfloat16", "float16" or "" when absent
} llama_config;

// Parse and validate a LlamaForCausalLM config.json. Accepts "torch_dtype" or "dtype".
// Rejects, with one ft_error line naming the file and field: unreadable file, non-object
// JSON, wrong model_type/architectures, missing or non-integer required fields, values out
// of sane ranges (non-positive, absurdly large, products that overflow), heads not divisible
// by kv heads, hidden_size not divisible by heads when head_dim is absent, odd head_dim,
// attention_bias/mlp_bias true, hidden_act other than "silu", unknown rope_scaling type or
// missing rope_scaling parameters. Returns 0 or -1.
int llama_config_load(llama_config *c, const char *path);
