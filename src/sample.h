// sample.h: after training, continue validation games with the trained model and print them
// (and append them to OUT/samples.jsonl, which scripts/legal_moves.py checks with Stockfish).
#pragma once
#include <stdint.h>

#include "fsdp.h"
#include "loader.h"
#include "lora.h"

// Tokens of a validation game the sampler gives the model as its prompt.
#define SAMPLE_PROMPT_TOKENS 12
// Softmax temperature of sampling (the default of --sample_temperature).
#define SAMPLE_TEMPERATURE 0.8

// How a token is drawn from the last position's logits, as transformers' generate(do_sample=True)
// with these warpers in its order: temperature, then top-k, then top-p.
typedef struct {
    double temperature;   // logits / temperature; 0 = greedy (argmax, the first of equal maxima)
    int top_k;            // keep the k largest logits (and any equal to the k-th); 0 = all
    double top_p;         // keep the most likely tokens whose probability reaches top_p (at least one); 1 = all
} sample_params;

// A logit and its id (scratch for sample_probs: sorted by logit, descending).
typedef struct {
    float logit;
    int id;
} sample_rank;

// tokenizer.json, id -> piece, for decoding only
typedef struct {
    char **piece;      // (n) owned strings, NULL for unknown ids
    int *special;      // (n) 1 for added special tokens (not printed)
    short *byte;       // (n) with a ByteFallback decoder, the byte a "<0xHH>" piece stands for, else -1
    int n;
} sample_vocab;

// Load id -> piece from a Hugging Face tokenizer.json (model.vocab, then added_tokens) for
// ids 0 .. n-1. When its decoder has a ByteFallback step (Llama's and CodeLlama's do), the
// pieces "<0x00>" .. "<0xFF>" stand for one byte each. 0 / -1 (an error names the file); sample_vocab_free releases it.
int sample_vocab_load(sample_vocab *v, const char *path, int n);
void sample_vocab_free(sample_vocab *v);

// Decode ids[0 .. n-1] as transformers' decode(skip_special_tokens=True) does for a Metaspace
// (+ ByteFallback) tokenizer: special and unknown ids dropped, U+2581 -> ' ', a run of byte
// pieces joined into its bytes when they form valid UTF-8, else one U+FFFD per byte piece (a
// special token inside a run does not end it), so the text is always valid UTF-8 (samples.jsonl
// needs that). Unlike transformers the leading space is kept, and a run holding a "<0x00>"
// piece counts as invalid (U+FFFD per byte: a NUL would end the C string). *out: malloc'ed,
// NUL-terminated, "" for no text. 0 / -1.
int sample_vocab_decode(const sample_vocab *v, const int32_t *ids, int n, char **out);

// The distribution one token is drawn from: probs[i] (V) is the probability of id i after
// temperature, top-k and top-p as in transformers (TemperatureLogitsWarper, TopKLogitsWarper,
// TopPLogitsWarper: of the tokens sorted by probability ascending, those whose cumulative
// probability is <= 1 - top_p are removed, never the most likely), renormalised over the kept
// ids; 0 elsewhere. Greedy (temperature 0): 1 at the argmax. `order` is scratch of V entries,
// used only when top-k or top-p filter. Returns the number of kept ids (>= 1).
int sample_probs(const float *logits, int V, const sample_params *p, sample_rank *order, double *probs);

// The id whose cumulative probability (ids in increasing order) first reaches u x sum(probs),
// u in [0, 1); never an id of probability 0.
int sample_draw(const double *probs, int V, double u);

typedef struct {
    fsdp_state *s;          // borrowed: the parameters, gathered through fsdp_provider
    const lora_layout *lora;        // borrowed, NULL without LoRA: the adapters' layout
    const unit_provider *adapters;  // borrowed, with lora: serves the trained adapters
    mem_tracker *mem;       // borrowed: counts the inference model's buffers
    const loader *val;      // borrowed: the prompts are its games
    const char *out_dir;    // borrowed: OUT/samples.jsonl
    comm *world;            // borrowed: every rank takes rank 0's sampled token (sampler_continue)
    int rank;               // world rank: rank 0 prints and writes
    int skew_test;          // FT_TEST_SAMPLE_SKEW set (test-only): ranks other than 0 draw EOS
    int n_tokens;           // tokens to sample per game
    uint64_t *games;        // owned (n_games): the validation games continued, those of >= 1 token
    int T;                  // SAMPLE_PROMPT_TOKENS + n_tokens (<= max_position_embeddings)
    int T_alloc;            // T rounded up to the backend's seq_bucket (capped likewise)
    sample_vocab vocab;     // owned, loaded by sampler_open
    model m;                // owned: the inference model (1, T_alloc), made by the first sample
    int32_t *tokens;        // owned (T_alloc); the positions after the context are padding
    float *logits;          // owned (V): the last real position's logits
    sample_params params;   // how tokens are drawn (--sample_temperature / _top_k / _top_p)
    sample_rank *order;     // owned (V): sample_probs' scratch
    double *probs;          // owned (V): the distribution of the next token
} sampler;

// Prepare to continue the first n_games games of `val` that hold a token (an empty one gives no
// prompt) by n_tokens tokens each: loads <model_dir>/tokenizer.json and checks the games exist
// (an error names --sample_games) and
// that prompt + n_tokens fit max_position_embeddings (an error names --sample_tokens).
// The model's buffers are allocated by the first sampler_continue (after training, so they
// are not part of the training's memory). With LoRA, `lora` and `adapters` (as for
// model_init_lora) make the samples come from the base plus the trained adapters; both NULL
// otherwise. `world`: every rank of the job (the sampled tokens are agreed over it; rank 0
// prints and writes). Everything borrowed must outlive the sampler. 0 / -1.
int sampler_open(sampler *sp, fsdp_state *s, const lora_layout *lora, const unit_provider *adapters,
                 mem_tracker *mem, const loader *val, const char *model_dir, const char *out_dir, comm *world,
                 int n_tokens, int n_games, const sample_params *params);

// Continue the first SAMPLE_PROMPT_TOKENS tokens of the i-th game chosen by sampler_open: n_tokens tokens drawn as
// sp->params says (sample_probs; seeded by seed and game), full recomputation per token (no KV
// cache: the cost grows with the square of the length), stopping at any of the config's EOS ids;
// every rank takes world rank 0's token (one scalar all-reduce per token). The context runs padded to the backend's seq_bucket (the GEMM shapes stay few) and
// only the last real position's logits are computed. Collective (FSDP gathers); rank 0 prints it and appends
// {"game", "prompt", "continuation", "eos"} to OUT/samples.jsonl. 0 / -1.
int sampler_continue(sampler *sp, int i, uint64_t seed);

void sampler_close(sampler *sp);
