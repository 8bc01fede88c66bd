// token_shard.c: the token shard reader (see token_shard.h).
#include "token_shard.h"

#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

#define SHARD_HEADER_BYTES 64
#define SHARD_NO_TOKEN 0xFFFFFFFFu   // bos_id / eos_id of a shard without that token

static uint32_t rd32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t rd64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static uint64_t offset_at(const token_shard *s, uint64_t i) { return rd64(s->offsets + 8 * i); }

static int32_t token_at(const token_shard *s, uint64_t i) {
    if (s->token_bytes == 2) { uint16_t v; memcpy(&v, s->tokens + 2 * i, 2); return v; }
    return (int32_t)rd32(s->tokens + 4 * i);
}

// bos_id / eos_id: a token of the shard's vocab, or SHARD_NO_TOKEN (none)
static int special_id_ok(uint32_t id, uint32_t vocab_size) { return id == SHARD_NO_TOKEN || id < vocab_size; }

static int shard_validate(token_shard *s, int model_vocab) {
    const char *p = s->path;
    if (s->size < SHARD_HEADER_BYTES) return ft_error("%s: file too short for a shard header (%zu bytes)", p, s->size);
    if (memcmp(s->map, "FTTOKSHD", 8) != 0) return ft_error("%s: bad magic (not a token shard)", p);
    uint32_t version = rd32(s->map + 8);
    if (version != 1) return ft_error("%s: unsupported shard version %u (expected 1)", p, version);
    s->token_bytes = rd32(s->map + 12);
    s->vocab_size = rd32(s->map + 16);
    s->bos_id = rd32(s->map + 20);
    s->eos_id = rd32(s->map + 24);
    s->n_docs = rd64(s->map + 32);
    s->n_tokens = rd64(s->map + 40);
    if (s->token_bytes != 2 && s->token_bytes != 4)
        return ft_error("%s: token_bytes %u is not 2 or 4", p, s->token_bytes);
    if (model_vocab > 0 && s->vocab_size > (uint32_t)model_vocab)
        return ft_error("%s: shard vocab %u exceeds the model's vocab_size %d", p, s->vocab_size, model_vocab);
    // eos pads short rows (token_shard_fill_row): an id outside the vocab would reach the embedding
    if (!special_id_ok(s->bos_id, s->vocab_size))
        return ft_error("%s: bos_id %u is >= vocab_size %u (and not 0xFFFFFFFF = none)", p, s->bos_id, s->vocab_size);
    if (!special_id_ok(s->eos_id, s->vocab_size))
        return ft_error("%s: eos_id %u is >= vocab_size %u (and not 0xFFFFFFFF = none)", p, s->eos_id, s->vocab_size);
    // exact size, computed without overflow
    size_t need, a, b;
    if (s->n_docs > SIZE_MAX / 8 - 1 || ft_mul_size((size_t)s->n_docs + 1, 8, &a) ||
        s->n_tokens > SIZE_MAX / s->token_bytes || ft_mul_size((size_t)s->n_tokens, s->token_bytes, &b) ||
        ft_add_size(a, b, &need) || ft_add_size(need, SHARD_HEADER_BYTES, &need))
        return ft_error("%s: header counts overflow (n_docs %llu, n_tokens %llu)", p,
                        (unsigned long long)s->n_docs, (unsigned long long)s->n_tokens);
    if (need != s->size)
        return ft_error("%s: size %zu bytes, header implies %zu (truncated or corrupt)", p, s->size, need);
    s->offsets = s->map + SHARD_HEADER_BYTES;
    s->tokens = s->offsets + a;
    if (offset_at(s, 0) != 0) return ft_error("%s: doc_offsets[0] is not 0", p);
    for (uint64_t i = 0; i < s->n_docs; i++)
        if (offset_at(s, i + 1) < offset_at(s, i))
            return ft_error("%s: doc_offsets decrease at document %llu", p, (unsigned long long)i);
    if (offset_at(s, s->n_docs) != s->n_tokens) return ft_error("%s: doc_offsets do not end at n_tokens", p);
    for (uint64_t i = 0; i < s->n_tokens; i++) {
        int32_t t = token_at(s, i);
        if (t < 0 || (uint32_t)t >= s->vocab_size)
            return ft_error("%s: token %d at position %llu is >= vocab_size %u", p, t, (unsigned long long)i, s->vocab_size);
    }
    return 0;
}

int token_shard_open(token_shard *s, const char *path, int model_vocab) {
    memset(s, 0, sizeof *s);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return ft_error("%s: cannot open token shard: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) { close(fd); return ft_error("%s: cannot stat: %s", path, strerror(errno)); }
    s->size = (size_t)st.st_size;
    s->path = ft_strdup(path);
    if (s->size > 0) {
        void *m = mmap(NULL, s->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) { close(fd); token_shard_close(s); return ft_error("%s: mmap failed: %s", path, strerror(errno)); }
        s->map = m;
    }
    close(fd);
    if (!s->path || shard_validate(s, model_vocab) != 0) { token_shard_close(s); return -1; }
    return 0;
}

void token_shard_close(token_shard *s) {
    if (s->map) munmap((void *)s->map, s->size);
    free(s->path);
    memset(s, 0, sizeof *s);
}

uint64_t token_shard_doc_len(const token_shard *s, uint64_t i) {
    return offset_at(s, i + 1) - offset_at(s, i);
}

// Document i holds a token other than bos / eos (and, `whole_docs`, at least 2 tokens).
static int doc_learnable(const token_shard *s, uint64_t i, int whole_docs) {
    const uint64_t start = offset_at(s, i), len = token_shard_doc_len(s, i);
    if (whole_docs && len < 2) return 0;
    for (uint64_t j = 0; j < len; j++) {
        const uint32_t t = (uint32_t)token_at(s, start + j);
        if (t != s->bos_id && t != s->eos_id) return 1;
    }
    return 0;
}

int token_shard_check_nonempty(const token_shard *s, int whole_docs) {
    if (s->n_docs == 0) return ft_error("%s: the shard holds no documents", s->path);
    for (uint64_t i = 0; i < s->n_docs; i++)
        if (doc_learnable(s, i, whole_docs)) return 0;
    if (whole_docs)
        return ft_error("%s: no document has a token to predict (each of its %llu has fewer than 2 tokens or only "
                        "bos/eos)", s->path, (unsigned long long)s->n_docs);
    return ft_error("%s: every document is empty (each of its %llu holds no token but bos/eos)", s->path,
                    (unsigned long long)s->n_docs);
}

int token_shard_fill_row(const token_shard *s, uint64_t i, int T, int32_t *tokens, int32_t *targets) {
    uint64_t start = offset_at(s, i), len = token_shard_doc_len(s, i);
    int32_t pad = s->eos_id != SHARD_NO_TOKEN ? (int32_t)s->eos_id : 0;
    int valid = 0;
    for (int t = 0; t < T; t++) {
        tokens[t] = (uint64_t)t < len ? token_at(s, start + t) : pad;
        if ((uint64_t)t + 1 < len) { targets[t] = token_at(s, start + t + 1); valid++; }
        else targets[t] = -100;
    }
    return valid;
}

int32_t token_shard_doc_token(const token_shard *s, uint64_t i, uint64_t j) {
    return token_at(s, offset_at(s, i) + j);
}

// ----------------------------------------------------------------------------
// the tokenizer the shards were made with

int token_shard_tokenizer_differs(const char *data_dir, const char *model_dir, char *msg, size_t n) {
    char manifest[FT_PATH_MAX], tok[FT_PATH_MAX], have[65];
    if (ft_path(manifest, sizeof manifest, "%s/shards.json", data_dir) != 0 ||
        ft_path(tok, sizeof tok, "%s/tokenizer.json", model_dir) != 0) {
        ft_error_clear();
        return 0;
    }
    json_t *root = json_load_file(manifest, 0, NULL);
    const char *want = json_string_value(json_object_get(root, "tokenizer_sha256"));
    int differs = 0, hashed = 0;
    if (want && access(tok, R_OK) == 0) {
        hashed = ft_sha256_file_hex(tok, have) == 0;
        if (!hashed) ft_error_clear();   // an unreadable tokenizer.json is the sampler's to report
    }
    if (hashed && strcmp(want, have) != 0) {
        snprintf(msg, n, "%s: the shards were tokenized with a tokenizer (sha256 %.12s...) other than --model_dir's "
                 "%s (sha256 %.12s...): their token ids mean other tokens to this model, and the exports ship "
                 "--model_dir's tokenizer.json (scripts/tokenize_shards.py --tokenizer %s makes matching shards)",
                 manifest, want, tok, have, tok);
        differs = 1;
    }
    json_decref(root);
    return differs;
}
