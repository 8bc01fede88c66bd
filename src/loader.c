// loader.c: epoch permutation, game rows and packed rows over mmapped shards (see loader.h).
#include "loader.h"

#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common.h"
#include "rng.h"

int loader_open(loader *ld, const char *dir, const char *prefix, int model_vocab, int T, int pack,
                int shuffle, uint64_t seed) {
    memset(ld, 0, sizeof *ld);
    ld->T = T;
    ld->pack = pack;
    ld->ignore_target = -1;
    ld->shuffle = shuffle;
    ld->seed = seed;
    ld->epoch = -1;
    struct stat sb;   // glob finds nothing in a missing directory too: say which it is
    if (stat(dir, &sb) != 0) return ft_error("%s: cannot open the data directory: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return ft_error("%s: not a directory (the data directory holds the token shards)", dir);
    char pattern[FT_PATH_MAX];
    TRY(ft_path(pattern, sizeof pattern, "%s/%s_*.bin", dir, prefix));
    glob_t g;
    int grc = glob(pattern, 0, NULL, &g);
    if (grc != 0 || g.gl_pathc == 0) {
        if (grc == 0) globfree(&g);
        return ft_error("%s: no %s shards (%s_*.bin)", dir, prefix, prefix);
    }
    int rc = -1;
    ld->shards = ft_calloc(g.gl_pathc, sizeof(token_shard), "shard table");
    ld->doc_base = ft_calloc(g.gl_pathc + 1, sizeof(uint64_t), "shard bases");
    if (!ld->shards || !ld->doc_base) goto done;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        TRY_GOTO(token_shard_open(&ld->shards[i], g.gl_pathv[i], model_vocab), done);
        ld->n_shards = (int)i + 1;
        TRY_GOTO(token_shard_check_nonempty(&ld->shards[i], !pack), done);   // so n_docs >= 1 below
        ld->doc_base[i + 1] = ld->doc_base[i] + ld->shards[i].n_docs;
    }
    ld->n_docs = ld->doc_base[ld->n_shards];
    if (!pack) {   // a game of fewer than 2 tokens has no target: it is never a row
        for (uint64_t g = 0; g < ld->n_docs; g++) ld->n_skipped += loader_game_len(ld, g) < 2;
        if (ld->n_skipped) {
            ld->row_doc = ft_malloc((ld->n_docs - ld->n_skipped) * sizeof(uint64_t), "row table");
            if (!ld->row_doc) goto done;
            for (uint64_t g = 0, r = 0; g < ld->n_docs; g++)
                if (loader_game_len(ld, g) >= 2) ld->row_doc[r++] = g;
        }
    }
    ld->n_perm = pack ? ld->n_docs : ld->n_docs - ld->n_skipped;
    ld->perm = ft_malloc(ld->n_perm * sizeof(uint64_t), "epoch permutation");
    if (!ld->perm) goto done;
    if (pack) {
        ld->stream_off = ft_malloc((ld->n_docs + 1) * sizeof(uint64_t), "packed stream offsets");
        if (!ld->stream_off) goto done;
        uint64_t total = 0;
        for (int s = 0; s < ld->n_shards; s++) total += ld->shards[s].n_tokens;
        ld->n_rows = total > 1 ? (total - 1) / (uint64_t)T : 0;
    } else {
        ld->n_rows = ld->n_perm;
    }
    if (ld->n_rows == 0) { ft_error("%s: the %s shards are too small for one row of %d tokens", dir, prefix, T); goto done; }
    rc = 0;
done:
    globfree(&g);
    if (rc != 0) loader_close(ld);
    return rc;
}

void loader_close(loader *ld) {
    for (int i = 0; i < ld->n_shards; i++) token_shard_close(&ld->shards[i]);
    free(ld->shards);
    free(ld->doc_base);
    free(ld->perm);
    free(ld->stream_off);
    free(ld->row_doc);
    memset(ld, 0, sizeof *ld);
}

uint64_t loader_fingerprint(const loader *ld) {
    uint64_t h = FT_FNV_INIT;
    for (int i = 0; i < ld->n_shards; i++) h = ft_fingerprint_sampled(h, ld->shards[i].map, ld->shards[i].size);
    return h ? h : 1;
}

uint64_t loader_rows(const loader *ld) { return ld->n_rows; }

uint64_t loader_skipped_games(const loader *ld) { return ld->n_skipped; }

// global game index -> (shard, local index)
static const token_shard *game_at(const loader *ld, uint64_t g, uint64_t *local) {
    int lo = 0, hi = ld->n_shards - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (ld->doc_base[mid] <= g) lo = mid; else hi = mid - 1;
    }
    *local = g - ld->doc_base[lo];
    return &ld->shards[lo];
}

uint64_t loader_games(const loader *ld) { return ld->n_docs; }

uint64_t loader_game_len(const loader *ld, uint64_t g) {
    uint64_t local;
    const token_shard *s = game_at(ld, g, &local);
    return token_shard_doc_len(s, local);
}

int32_t loader_game_token(const loader *ld, uint64_t g, uint64_t t) {
    uint64_t local;
    const token_shard *s = game_at(ld, g, &local);
    return token_shard_doc_token(s, local, t);
}

static void build_epoch(loader *ld, int epoch) {
    for (uint64_t i = 0; i < ld->n_perm; i++) ld->perm[i] = i;
    if (ld->shuffle) {
        uint64_t st = ld->seed * 0x100000001b3ull ^ (uint64_t)epoch * 0x9e3779b97f4a7c15ull;
        for (uint64_t i = ld->n_perm - 1; i > 0; i--) {
            uint64_t j = rng_next(&st) % (i + 1);
            uint64_t t = ld->perm[i]; ld->perm[i] = ld->perm[j]; ld->perm[j] = t;
        }
    }
    if (ld->pack) {
        ld->stream_off[0] = 0;
        for (uint64_t i = 0; i < ld->n_docs; i++) {
            uint64_t local;
            const token_shard *s = game_at(ld, ld->perm[i], &local);
            ld->stream_off[i + 1] = ld->stream_off[i] + token_shard_doc_len(s, local);
        }
    }
    ld->epoch = epoch;
}

// token at position p of the packed stream of the current epoch
static int32_t stream_token(const loader *ld, uint64_t p, uint64_t *hint) {
    uint64_t i = *hint;
    if (!(ld->stream_off[i] <= p && p < ld->stream_off[i + 1])) {
        uint64_t lo = 0, hi = ld->n_docs - 1;   // last i with stream_off[i] <= p
        while (lo < hi) {
            uint64_t mid = (lo + hi + 1) / 2;
            if (ld->stream_off[mid] <= p) lo = mid; else hi = mid - 1;
        }
        i = lo;
        while (ld->stream_off[i + 1] <= p) i++;   // skip empty games
        *hint = i;
    }
    uint64_t local;
    const token_shard *s = game_at(ld, ld->perm[i], &local);
    return token_shard_doc_token(s, local, p - ld->stream_off[i]);
}

int loader_fill_row(loader *ld, int epoch, uint64_t row, int32_t *tokens, int32_t *targets) {
    if (row >= ld->n_rows) return ft_error("loader: row %llu out of range (%llu rows per epoch)",
                                           (unsigned long long)row, (unsigned long long)ld->n_rows);
    if (ld->epoch != epoch) build_epoch(ld, epoch);
    const int T = ld->T;
    if (!ld->pack) {
        uint64_t local;
        const uint64_t i = ld->perm[row];
        const token_shard *s = game_at(ld, ld->row_doc ? ld->row_doc[i] : i, &local);
        return token_shard_fill_row(s, local, T, tokens, targets);
    }
    uint64_t base = row * (uint64_t)T, hint = 0;
    int valid = T;
    for (int t = 0; t < T; t++) {
        tokens[t] = stream_token(ld, base + t, &hint);
        targets[t] = stream_token(ld, base + t + 1, &hint);
        if (ld->ignore_target >= 0 && targets[t] == ld->ignore_target) {
            targets[t] = -100;
            valid--;
        }
    }
    return valid;
}

void loader_set_ignore_target(loader *ld, int32_t id) { ld->ignore_target = id; }
