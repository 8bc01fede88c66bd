// token_shard.h: token shards (binary, written by scripts/tokenize_shards.py) and batches.
//
// Shard layout, little-endian:
//   0  magic "FTTOKSHD"      8  u32 version (1)     12 u32 token_bytes (2 or 4)
//   16 u32 vocab_size        20 u32 bos_id          24 u32 eos_id   (0xFFFFFFFF: no such token)
//   28 u32 reserved          32 u64 n_docs          40 u64 n_tokens     48..63 zero
//   64 u64 doc_offsets[n_docs + 1]   then   tokens[n_tokens] (token_bytes each)
// Each document is one game: [bos] + tokens + [eos]. The file is mmapped, never read whole.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct {
    char *path;
    const unsigned char *map;
    size_t size;
    uint32_t token_bytes, vocab_size, bos_id, eos_id;
    uint64_t n_docs, n_tokens;
    const unsigned char *offsets;   // (n_docs + 1) u64, possibly unaligned: read via memcpy
    const unsigned char *tokens;    // (n_tokens) of token_bytes
} token_shard;

// Map and validate a shard: magic, version, token width, bos_id and eos_id < vocab_size (or
// none), exact file size, monotone offsets ending at n_tokens, every token < vocab_size.
// `model_vocab` (if > 0) must be >= the shard's vocab. 0, or -1 with ft_error naming the file
// and what is wrong.
int token_shard_open(token_shard *s, const char *path, int model_vocab);
void token_shard_close(token_shard *s);

// Refuse a shard with nothing to learn from: every document empty (no token but bos / eos,
// e.g. [], [bos], [bos, eos]) or, when each row is one document (`whole_docs`: validation,
// and training without --pack), every document also without the 2 tokens a row needs for a
// target. A shard of no documents is refused too. 0, or -1 with ft_error naming the file and
// what is wrong (token_shard_open does not check this: it reads the format).
int token_shard_check_nonempty(const token_shard *s, int whole_docs);

// Length of document i in tokens.
uint64_t token_shard_doc_len(const token_shard *s, uint64_t i);

// Token j of document i (j < token_shard_doc_len(s, i)).
int32_t token_shard_doc_token(const token_shard *s, uint64_t i, uint64_t j);

// Fill one training row from document i, truncated to T + 1 tokens as the tutorial does:
// tokens (T) = doc[0..T-1] padded with the pad id, targets (T): targets[t] = doc[t + 1]
// while t + 1 < len, else -100. Returns the number of valid targets.
int token_shard_fill_row(const token_shard *s, uint64_t i, int T, int32_t *tokens, int32_t *targets);

// Whether data_dir's shards were tokenized with model_dir's tokenizer: the sha256
// data_dir/shards.json records (tokenizer_sha256, scripts/tokenize_shards.py) against that of
// model_dir/tokenizer.json. 1 when both are there and differ, with one warning sentence in
// msg (n bytes); 0 when they match or either is missing or unreadable (nothing to compare:
// shards.json is not needed to train).
int token_shard_tokenizer_differs(const char *data_dir, const char *model_dir, char *msg, size_t n);
