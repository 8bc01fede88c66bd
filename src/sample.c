// sample.c: decode token ids with the checkpoint's tokenizer.json and sample continuations
// of validation games (see sample.h).
#include "sample.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "rng.h"

// ----------------------------------------------------------------------------
// tokenizer.json: id -> piece, for decoding only

typedef sample_vocab vocab;

void sample_vocab_free(vocab *v) {
    for (int i = 0; v->piece && i < v->n; i++) free(v->piece[i]);
    free(v->piece);
    free(v->special);
    free(v->byte);
    memset(v, 0, sizeof *v);
}

// The byte a byte-fallback piece "<0xHH>" stands for, or -1 for any other piece.
static short piece_byte(const char *p) {
    if (strlen(p) != 6 || p[0] != '<' || p[1] != '0' || p[2] != 'x' || p[5] != '>') return -1;
    int b = 0;
    for (int i = 3; i < 5; i++) {
        const char c = p[i];
        const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        b = b * 16 + d;
    }
    return (short)b;
}

// Whether a tokenizer.json decoder (one, or a Sequence of them) turns "<0xHH>" pieces into
// bytes: transformers does so by its decoder's ByteFallback step, whatever model.byte_fallback says.
static int decoder_has_byte_fallback(const json_t *dec) {
    const char *type = json_string_value(json_object_get(dec, "type"));
    if (type && strcmp(type, "ByteFallback") == 0) return 1;
    size_t i;
    json_t *d;
    json_array_foreach(json_object_get(dec, "decoders"), i, d) if (decoder_has_byte_fallback(d)) return 1;
    return 0;
}

int sample_vocab_load(vocab *v, const char *path, int n) {
    memset(v, 0, sizeof *v);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) return ft_error("%s: %s", path, jerr.text);
    v->n = n;
    v->piece = ft_calloc((size_t)n, sizeof(char *), "vocab");
    v->special = ft_calloc((size_t)n, sizeof(int), "vocab flags");
    v->byte = ft_malloc((size_t)n * sizeof(short), "vocab bytes");
    json_t *vmap = json_object_get(json_object_get(root, "model"), "vocab");
    int rc = 0;
    if (!v->piece || !v->special || !v->byte) rc = -1;
    else if (!json_is_object(vmap)) rc = ft_error("%s: field 'model.vocab' missing or not an object", path);
    else {
        const char *key;
        json_t *val;
        json_object_foreach(vmap, key, val) {
            json_int_t id = json_integer_value(val);
            if (json_is_integer(val) && id >= 0 && id < n && !v->piece[id]) v->piece[id] = ft_strdup(key);
        }
        size_t i;
        json_t *tok;
        json_array_foreach(json_object_get(root, "added_tokens"), i, tok) {
            json_int_t id = json_integer_value(json_object_get(tok, "id"));
            const char *content = json_string_value(json_object_get(tok, "content"));
            if (id < 0 || id >= n || !content) continue;
            if (!v->piece[id]) v->piece[id] = ft_strdup(content);
            v->special[id] = json_is_true(json_object_get(tok, "special"));
        }
        const int fallback = decoder_has_byte_fallback(json_object_get(root, "decoder"));
        for (int id = 0; id < n; id++) v->byte[id] = fallback && v->piece[id] ? piece_byte(v->piece[id]) : -1;
    }
    json_decref(root);
    if (rc != 0) sample_vocab_free(v);
    return rc;
}

// Length of the valid UTF-8 sequence at s[0 .. n-1], or 0 if it is not one (overlong forms,
// surrogates and code points above U+10FFFF are invalid, as in transformers' decoder; so is
// NUL here, which would end the C string: a "<0x00>" piece, CodeLlama's id 3, makes its run
// U+FFFD rather than cut the sample short).
static int utf8_seq_len(const unsigned char *s, size_t n) {
    const unsigned c = s[0];
    if (c == 0) return 0;
    const int len = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (len == 0 || (size_t)len > n) return 0;
    for (int i = 1; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    if ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] > 0x9F) || (c == 0xF0 && s[1] < 0x90) || (c == 0xF4 && s[1] > 0x8F))
        return 0;
    return len;
}

static int utf8_valid(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        const int len = utf8_seq_len(s + i, n - i);
        if (len == 0) return 0;
        i += (size_t)len;
    }
    return 1;
}

// The run of byte pieces at the end of the text, s[start .. *len), as its bytes if they are
// valid UTF-8, else one U+FFFD (3 bytes) per byte: the buffer has room for 3 per byte.
static void flush_byte_run(char *s, size_t start, size_t *len) {
    const size_t n = *len - start;
    if (n == 0 || utf8_valid((const unsigned char *)s + start, n)) return;
    for (size_t i = 0; i < n; i++) memcpy(s + start + 3 * i, "\xEF\xBF\xBD", 3);
    *len = start + 3 * n;
}

int sample_vocab_decode(const vocab *v, const int32_t *ids, int n, char **out) {
    size_t cap = 1;   // each piece's bytes, a byte piece at most 3 (U+FFFD), and the NUL
    for (int t = 0; t < n; t++)
        if (ids[t] >= 0 && ids[t] < v->n && v->piece[ids[t]]) cap += v->byte[ids[t]] >= 0 ? 3 : strlen(v->piece[ids[t]]);
    char *s = ft_malloc(cap, "decoded sample text");
    if (!s) return -1;
    size_t len = 0, run = 0;   // s[run .. len): the current run of byte pieces
    for (int t = 0; t < n; t++) {
        const int id = ids[t];
        if (id < 0 || id >= v->n || v->special[id] || !v->piece[id]) continue;
        if (v->byte[id] >= 0) {
            s[len++] = (char)v->byte[id];
            continue;
        }
        flush_byte_run(s, run, &len);
        for (const char *p = v->piece[id]; *p; p++) {
            if ((unsigned char)p[0] == 0xE2 && (unsigned char)p[1] == 0x96 && (unsigned char)p[2] == 0x81) {
                s[len++] = ' ';   // the Metaspace marker U+2581
                p += 2;
            } else {
                s[len++] = *p;
            }
        }
        run = len;
    }
    flush_byte_run(s, run, &len);
    s[len] = '\0';
    *out = s;
    return 0;
}

// ----------------------------------------------------------------------------
// sampling

static int rank_descending(const void *a, const void *b) {
    const sample_rank *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    // equal logits: the higher id first, the reverse of torch's stable ascending sort that
    // transformers' top-p walks (so of tied ids at its boundary the same ones are dropped)
    return (x->id < y->id) - (x->id > y->id);
}

int sample_probs(const float *logits, int V, const sample_params *p, sample_rank *order, double *probs) {
    int top = 0;
    for (int i = 1; i < V; i++) top = logits[i] > logits[top] ? i : top;
    if (p->temperature == 0) {   // greedy: transformers' argmax (the first maximum)
        memset(probs, 0, (size_t)V * sizeof *probs);
        probs[top] = 1;
        return 1;
    }
    const double inv_t = 1.0 / p->temperature;
    const double mx = logits[top];
    if (!(p->top_k > 0 && p->top_k < V) && !(p->top_p < 1)) {   // every id: no sort
        double sum = 0;
        for (int i = 0; i < V; i++) sum += probs[i] = exp((logits[i] - mx) * inv_t);
        for (int i = 0; i < V; i++) probs[i] /= sum;
        return V;
    }
    for (int i = 0; i < V; i++) order[i] = (sample_rank){logits[i], i};
    qsort(order, (size_t)V, sizeof *order, rank_descending);
    int kept = V;
    if (p->top_k > 0 && p->top_k < V) {   // the k-th largest and every logit equal to it
        kept = p->top_k;
        while (kept < V && order[kept].logit >= order[p->top_k - 1].logit) kept++;
    }
    double sum = 0;
    for (int j = 0; j < kept; j++) sum += exp((order[j].logit - mx) * inv_t);
    if (p->top_p < 1) {   // ascending from the least likely kept id: drop while the sum is <= 1 - top_p
        double cum = 0;
        while (kept > 1) {
            cum += exp((order[kept - 1].logit - mx) * inv_t) / sum;
            if (cum > 1 - p->top_p) break;
            kept--;
        }
        sum = 0;
        for (int j = 0; j < kept; j++) sum += exp((order[j].logit - mx) * inv_t);
    }
    memset(probs, 0, (size_t)V * sizeof *probs);
    for (int j = 0; j < kept; j++) probs[order[j].id] = exp((order[j].logit - mx) * inv_t) / sum;
    return kept;
}

int sample_draw(const double *probs, int V, double u) {
    double total = 0;
    for (int i = 0; i < V; i++) total += probs[i];
    const double r = u * total;
    double acc = 0;
    int last = 0;
    for (int i = 0; i < V; i++) {
        if (probs[i] <= 0) continue;
        acc += probs[i];
        last = i;
        if (acc > r) return i;
    }
    return last;   // rounding left r at the very end
}

// Append {"game":g,"prompt":...,"continuation":...,"eos":0|1} to OUT/samples.jsonl. 0 / -1.
static int sample_write_jsonl(const char *out_dir, int game, const char *prompt, const char *cont, int eos) {
    char path[FT_PATH_MAX];
    TRY(ft_path(path, sizeof path, "%s/samples.jsonl", out_dir));
    json_t *o = json_pack("{s:i, s:s, s:s, s:b}", "game", game, "prompt", prompt, "continuation", cont, "eos", eos);
    char *line = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!line) return ft_error("%s: cannot encode a sample as JSON", path);
    FILE *f = fopen(path, "a");
    int rc = f && fprintf(f, "%s\n", line) > 0 ? 0 : -1;
    if (f && fclose(f) != 0) rc = -1;
    free(line);
    if (rc != 0) return ft_error("%s: cannot append: %s", path, strerror(errno));
    return 0;
}

// ----------------------------------------------------------------------------
// the sampler

int sampler_open(sampler *sp, fsdp_state *s, const lora_layout *lora, const unit_provider *adapters,
                 mem_tracker *mem, const loader *val, const char *model_dir, const char *out_dir, comm *world,
                 int n_tokens, int n_games, const sample_params *params) {
    memset(sp, 0, sizeof *sp);
    const llama_config *cfg = &s->layout->cfg;
    if ((uint64_t)n_games > loader_games(val))
        return ft_error("flag --sample_games: %d exceeds the %llu games of the validation shards", n_games,
                        (unsigned long long)loader_games(val));
    uint64_t *games = ft_malloc((size_t)n_games * sizeof *games, "sampled games");
    if (!games) return -1;
    int found = 0;
    for (uint64_t g = 0; g < loader_games(val) && found < n_games; g++)
        if (loader_game_len(val, g) > 0) games[found++] = g;
    if (found < n_games) {
        free(games);
        return ft_error("flag --sample_games: %d exceeds the %d validation games that hold a token (the others give "
                        "no prompt)", n_games, found);
    }
    if (n_tokens > cfg->max_position_embeddings - SAMPLE_PROMPT_TOKENS) {   // (it was capped without a word)
        free(games);
        return ft_error("flag --sample_tokens: %d tokens after the %d-token prompt exceed the model's "
                        "max_position_embeddings %d (at most %d)", n_tokens, SAMPLE_PROMPT_TOKENS,
                        cfg->max_position_embeddings, cfg->max_position_embeddings - SAMPLE_PROMPT_TOKENS);
    }
    *sp = (sampler){.s = s, .lora = lora, .adapters = adapters, .mem = mem, .val = val, .out_dir = out_dir,
                    .world = world, .rank = world->rank, .skew_test = ft_getenv("FT_TEST_SAMPLE_SKEW") != NULL,
                    .n_tokens = n_tokens, .games = games, .params = *params};
    sp->T = SAMPLE_PROMPT_TOKENS + n_tokens;   // <= max_position_embeddings
    // The context runs padded to the backend's bucket (causal attention: the padding does
    // not change the real positions), so decoding adds no GEMM shape per token.
    sp->T_alloc = backend_seq_len(s->be, sp->T, cfg->max_position_embeddings);
    char path[FT_PATH_MAX];
    TRY(ft_path(path, sizeof path, "%s/tokenizer.json", model_dir));
    if (access(path, R_OK) != 0)   // a checkpoint without one: say which flag needs it
        return ft_error("flag --sample_tokens: %s: %s (samples are decoded with --model_dir's tokenizer.json)", path,
                        strerror(errno));
    TRY(sample_vocab_load(&sp->vocab, path, cfg->vocab_size));
    sp->tokens = ft_calloc((size_t)sp->T_alloc, sizeof(int32_t), "sample tokens");   // padding: any valid id
    sp->logits = ft_malloc((size_t)cfg->vocab_size * sizeof(float), "sample logits");   // (V) one row
    sp->order = ft_malloc((size_t)cfg->vocab_size * sizeof(sample_rank), "sample order");   // (V)
    sp->probs = ft_malloc((size_t)cfg->vocab_size * sizeof(double), "sample probabilities");   // (V)
    if (!sp->tokens || !sp->logits || !sp->order || !sp->probs) { sampler_close(sp); return -1; }
    return 0;
}

void sampler_close(sampler *sp) {
    model_free(&sp->m);
    sample_vocab_free(&sp->vocab);
    free(sp->tokens);
    free(sp->logits);
    free(sp->order);
    free(sp->probs);
    free(sp->games);
    memset(sp, 0, sizeof *sp);
}

int sampler_continue(sampler *sp, int i, uint64_t seed) {
    const int game = (int)sp->games[i];   // (validation games: far fewer than 2^31)
    const llama_config *cfg = &sp->s->layout->cfg;
    const int V = cfg->vocab_size;
    if (!sp->m.layout)
        TRY(model_init_lora(&sp->m, sp->s->layout, sp->lora, sp->adapters, sp->s->be, sp->mem, 1, sp->T_alloc,
                             MODEL_FORWARD_ONLY, 0));   // (the forward's buffers: no backward)
    unit_provider prov = fsdp_provider(sp->s);
    int len = (int)loader_game_len(sp->val, (uint64_t)game);
    if (len > SAMPLE_PROMPT_TOKENS) len = SAMPLE_PROMPT_TOKENS;
    const int T = len + sp->n_tokens < sp->T ? len + sp->n_tokens : sp->T;
    int32_t *tokens = sp->tokens;
    for (int t = 0; t < len; t++) tokens[t] = loader_game_token(sp->val, (uint64_t)game, (uint64_t)t);
    uint64_t rng = seed ^ 0x5eed5eedull ^ ((uint64_t)game * 0x9e3779b97f4a7c15ull);
    int rc = 0, n = len, ended = 0;   // ended: the model sampled EOS (any of the config's)
    while (rc == 0 && n < T) {
        rc = model_set_seq_len(&sp->m, backend_seq_len(sp->s->be, n, sp->T_alloc));
        if (rc == 0) rc = model_logits_rows(&sp->m, &prov, tokens, n - 1, 1, sp->logits);   // the last real position
        if (rc != 0) break;
        sample_probs(sp->logits, V, &sp->params, sp->order, sp->probs);
        int next = sample_draw(sp->probs, V, sp->params.temperature == 0 ? 0 : rng_uniform(&rng));
        // Every rank draws from its own logits with the same seed, so normally the same token;
        // but a rank whose logits differ in the last bit (one rank's GPU fell back to another
        // attention kernel) could draw another and stop at another length, leaving the others
        // in the next forward's collectives: every rank takes rank 0's token.
        // TEST-ONLY (tests/test_dist.sh): FT_TEST_SAMPLE_SKEW makes the other ranks draw EOS,
        // as a rank whose draw differs would; without the agreement their sampling would end
        // there and the ranks' collectives would no longer pair up
        if (sp->skew_test && sp->rank != 0 && cfg->n_eos > 0) next = cfg->eos_token_ids[0];
        double agreed = sp->rank == 0 ? next : 0;
        rc = comm_all_reduce_f64(sp->world, &agreed, 1);
        if (rc != 0) break;
        next = (int)agreed;
        tokens[n++] = next;
        for (int e = 0; e < cfg->n_eos; e++) ended |= next == cfg->eos_token_ids[e];
        if (ended) break;
    }
    const int n_cont = n - len - ended;   // the sampled tokens, without the EOS that ended them
    // (decoded apart: a character whose byte pieces straddle the prompt's end shows as U+FFFD
    // on both sides, where transformers decoding the whole game would join it)
    char *ptext = NULL, *ctext = NULL;
    if (rc == 0 && sp->rank == 0) rc = sample_vocab_decode(&sp->vocab, tokens, len, &ptext);
    if (rc == 0 && sp->rank == 0) rc = sample_vocab_decode(&sp->vocab, tokens + len, n_cont, &ctext);
    if (rc == 0 && sp->rank == 0) {
        const char *prompt = ptext + (ptext[0] == ' '), *cont = ctext;
        char how[96];
        const sample_params *p = &sp->params;
        int hl = p->temperature == 0 ? snprintf(how, sizeof how, "greedy")
                                     : snprintf(how, sizeof how, "temperature %g", p->temperature);
        if (p->temperature > 0 && p->top_k > 0) hl += snprintf(how + hl, sizeof how - (size_t)hl, ", top-k %d", p->top_k);
        if (p->temperature > 0 && p->top_p < 1) snprintf(how + hl, sizeof how - (size_t)hl, ", top-p %g", p->top_p);
        printf("sample (validation game %d, %d prompt tokens, %s):\n  prompt:      %s\n"
               "  continuation:%s%s\n", game, len, how, prompt, cont, ended ? " <eos>" : "");
        fflush(stdout);   // a log file (Slurm's) shows each sample as it comes
        rc = sample_write_jsonl(sp->out_dir, game, prompt, cont, ended);
    }
    free(ptext);
    free(ctext);
    return rc;
}
