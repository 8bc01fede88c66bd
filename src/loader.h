// loader.h: rows of training data from a set of token shards (train_*.bin or val_*.bin).
//
// A "row" is one sequence of T input tokens and T targets. Two modes:
//   games (default): row i of an epoch = game perm[i], truncated to T + 1 tokens, padded
//                    with targets -100 (the tutorial's format); games of fewer than 2
//                    tokens have no target and are left out.
//   pack (--pack):   the epoch's games, in perm order, are one stream ([bos] game [eos] ...);
//                    row i = stream[i*T .. i*T + T] (T inputs, T shifted targets).
// perm is a seeded Fisher-Yates permutation per epoch (identity when shuffle is off), so row
// i of epoch e is a pure function of (seed, e, i): ranks read disjoint rows by index, and a
// resumed run continues exactly. Shards are mmapped; nothing is loaded whole.
#pragma once
#include <stdint.h>

#include "token_shard.h"

typedef struct {
    token_shard *shards;
    int n_shards;
    uint64_t *doc_base;      // (n_shards + 1) global index of each shard's first game
    uint64_t n_docs;
    int T, pack, shuffle;
    uint64_t seed;
    int epoch;               // epoch the tables below are built for (-1 = none)
    uint64_t n_perm;         // games permuted: n_docs with pack, else the games of >= 2 tokens
    uint64_t n_skipped;      // games: those of fewer than 2 tokens (no target; never a row)
    uint64_t *row_doc;       // games, when n_skipped > 0: (n_perm) global index of each row's game
    uint64_t *perm;          // (n_perm) order of `epoch`: of games (pack), else of row_doc's
    uint64_t *stream_off;    // pack: (n_docs + 1) stream offset of each perm position
    uint64_t n_rows;         // rows per epoch
    int32_t ignore_target;   // pack: a target equal to this id becomes -100 (-1 = none; loader_set_ignore_target)
} loader;

// Open every `<dir>/<prefix>_*.bin` (sorted by name), validating each against model_vocab and
// refusing one with nothing to learn from (token_shard_check_nonempty: whole documents per row
// unless `pack`). 0, or -1 with ft_error naming the directory or file.
int loader_open(loader *ld, const char *dir, const char *prefix, int model_vocab, int T, int pack,
                int shuffle, uint64_t seed);
void loader_close(loader *ld);

// Content fingerprint of the shards (ft_fingerprint_sampled over each file in name order: its
// header with the document and token counts, and samples of its offsets and tokens), never 0:
// what a checkpoint records of the data it was trained on (trainer_state.json).
uint64_t loader_fingerprint(const loader *ld);

// Rows per epoch (the same for every epoch).
uint64_t loader_rows(const loader *ld);
// Games that are no row because they have no target (fewer than 2 tokens; games mode only, a
// packed stream joins them to their neighbours): without them a step could have no target.
uint64_t loader_skipped_games(const loader *ld);

// Games of the shards (global index g: shard by shard in name order, then in file order), the
// length of game g < loader_games in tokens, and its token t < that length.
uint64_t loader_games(const loader *ld);
uint64_t loader_game_len(const loader *ld, uint64_t g);
int32_t loader_game_token(const loader *ld, uint64_t g, uint64_t t);

// Pack mode, --pack_attention per_game: every target equal to `id` (the BOS id: a game's last
// token would predict the next game's first) becomes -100 and is not counted. -1: none.
void loader_set_ignore_target(loader *ld, int32_t id);

// Fill tokens (T), targets (T) with row `row` of epoch `epoch`; returns the number of valid
// targets, or -1 with ft_error (row out of range, allocation failure).
int loader_fill_row(loader *ld, int epoch, uint64_t row, int32_t *tokens, int32_t *targets);
