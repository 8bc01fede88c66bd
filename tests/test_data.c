// test_data.c: the token shard reader on a valid shard and on corrupt ones (a table of
// byte-level corruptions, each expected to fail with a message naming the file and the
// problem), plus the row filling contract (truncation, padding labels -100), and a table of
// shards with nothing to learn from (empty documents, only bos/eos), refused by name, and the
// loader's rows over shards with games of fewer than 2 tokens (left out: no step without a target).
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "token_shard.h"
#include "loader.h"
#include "test.h"

static char dir[] = "/tmp/ft_test_data_XXXXXX";

// a 3-document shard: docs of length 4, 1 and 6 tokens (vocab 50, bos 1, eos 2)
static size_t make_shard(unsigned char *buf, uint32_t token_bytes) {
    const uint64_t offs[4] = {0, 4, 5, 11};
    const uint32_t toks[11] = {1, 10, 11, 2, 1, 1, 20, 21, 22, 23, 2};
    memset(buf, 0, 64);
    memcpy(buf, "FTTOKSHD", 8);
    uint32_t h32[6] = {1, token_bytes, 50, 1, 2, 0};
    memcpy(buf + 8, h32, sizeof h32);
    uint64_t n_docs = 3, n_tokens = 11;
    memcpy(buf + 32, &n_docs, 8);
    memcpy(buf + 40, &n_tokens, 8);
    memcpy(buf + 64, offs, sizeof offs);
    size_t p = 64 + sizeof offs;
    for (int i = 0; i < 11; i++) {
        if (token_bytes == 2) { uint16_t t = (uint16_t)toks[i]; memcpy(buf + p, &t, 2); }
        else memcpy(buf + p, &toks[i], 4);
        p += token_bytes;
    }
    return p;
}

static void write_file(const char *path, const unsigned char *buf, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(buf, 1, n, f);
    fclose(f);
}

typedef struct {
    const char *name;
    size_t at;          // byte offset to overwrite (or SIZE_MAX: truncate by `value` bytes)
    uint64_t value;
    int width;          // bytes written at `at`
    const char *expect; // substring of the error
    int model_vocab;
} corruption;

static const corruption cases[] = {
    {"bad magic", 0, 0x58, 1, "bad magic", 0},
    {"version 2", 8, 2, 4, "unsupported shard version", 0},
    {"token_bytes 3", 12, 3, 4, "token_bytes", 0},
    {"truncated by 1", SIZE_MAX, 1, 0, "truncated", 0},
    {"n_docs huge", 32, (uint64_t)1 << 62, 8, "overflow", 0},
    {"n_tokens wrong", 40, 12, 8, "header implies", 0},
    {"offsets[0] != 0", 64, 1, 8, "doc_offsets[0]", 0},
    {"offsets decrease", 72, 7, 8, "decrease", 0},
    {"token >= vocab", 64 + 32 + 2, 60, 2, "vocab_size", 0},
    {"vocab > model", 16, 50, 4, "exceeds the model", 40},
    {"eos_id = vocab", 24, 50, 4, "eos_id 50 is >= vocab_size", 0},       // the pad of short rows
    {"eos_id negative as int32", 24, 0xFFFFFFFEu, 4, "eos_id 4294967294", 0},
    {"bos_id >= vocab", 20, 4096, 4, "bos_id 4096 is >= vocab_size", 0},
};

// Shards with nothing to learn from (token_shard_check_nonempty), vocab 50, bos 1, eos 2:
// documents of up to 4 tokens, checked as whole-document rows and as a packed stream.
typedef struct {
    const char *name;
    int n_docs;
    int len[8];
    uint32_t tok[8][4];
    const char *whole;   // error substring with one document per row; NULL = accepted
    const char *packed;  // error substring for --pack; NULL = accepted
} content_case;

#define NO_TARGET "no document has a token to predict (each of its"
#define ALL_EMPTY "every document is empty (each of its"
static const content_case content_cases[] = {
    {"no documents", 0, {0}, {{0}}, "the shard holds no documents", "the shard holds no documents"},
    {"empty documents", 3, {0, 0, 0}, {{0}}, NO_TARGET " 3 has fewer than 2", ALL_EMPTY " 3 holds no token"},
    {"only bos / eos", 4, {1, 2, 1, 0}, {{1}, {1, 2}, {2}, {0}}, NO_TARGET, ALL_EMPTY},
    {"bos bos, eos eos", 2, {2, 2}, {{1, 1}, {2, 2}}, NO_TARGET, ALL_EMPTY},
    {"one-token games", 2, {1, 1}, {{7}, {8}}, NO_TARGET " 2 has fewer than 2", NULL},
    {"one game with a move", 3, {1, 0, 3}, {{1}, {0}, {1, 7, 2}}, NULL, NULL},
    {"move then eos", 2, {2, 2}, {{1, 2}, {7, 2}}, NULL, NULL},
};

static size_t make_docs_shard(unsigned char *buf, const content_case *c) {
    uint64_t n_docs = (uint64_t)c->n_docs, n_tokens = 0;
    memset(buf, 0, 64);
    memcpy(buf, "FTTOKSHD", 8);
    const uint32_t h32[6] = {1, 2, 50, 1, 2, 0};
    memcpy(buf + 8, h32, sizeof h32);
    size_t p = 64 + 8 * (n_docs + 1);
    memset(buf + 64, 0, 8);
    for (int d = 0; d < c->n_docs; d++) {
        for (int j = 0; j < c->len[d]; j++) {
            const uint16_t t = (uint16_t)c->tok[d][j];
            memcpy(buf + p, &t, 2);
            p += 2;
        }
        n_tokens += (uint64_t)c->len[d];
        memcpy(buf + 64 + 8 * (d + 1), &n_tokens, 8);
    }
    memcpy(buf + 32, &n_docs, 8);
    memcpy(buf + 40, &n_tokens, 8);
    return p;
}

static void test_content(void) {
    char path[256];
    unsigned char buf[256];
    for (size_t i = 0; i < sizeof content_cases / sizeof content_cases[0]; i++) {
        const content_case *c = &content_cases[i];
        snprintf(path, sizeof path, "%s/content%zu.bin", dir, i);
        write_file(path, buf, make_docs_shard(buf, c));
        token_shard s;
        ft_error_clear();
        if (token_shard_open(&s, path, 50) != 0) { EXPECT(0, "%s: open: %s", c->name, ft_error_message()); continue; }
        for (int whole = 1; whole >= 0; whole--) {
            const char *want = whole ? c->whole : c->packed;
            ft_error_clear();
            const int rc = token_shard_check_nonempty(&s, whole);
            const char *msg = ft_error_message();
            if (!want) EXPECT(rc == 0, "%s (%s): refused: %s", c->name, whole ? "rows" : "pack", msg);
            else EXPECT(rc == -1 && strstr(msg, path) && strstr(msg, want),
                        "%s (%s): rc %d, message '%s' (expected '%s')", c->name, whole ? "rows" : "pack", rc, msg, want);
        }
        token_shard_close(&s);
        unlink(path);
    }
}

// The loader's rows (games mode and packed) over one shard with games of 0 and 1 tokens among
// longer ones: games mode leaves those out (each row has a target, every other game is a row
// exactly once per shuffled epoch); the packed stream keeps every token.
typedef struct {
    const char *name;
    content_case shard;
    int rows, skipped;       // games mode: rows per epoch, games left out
    int packed_rows;         // --pack with T = 2: (tokens - 1) / 2
} loader_case;

static const loader_case loader_cases[] = {
    {"short games among long ones", {"", 7, {3, 1, 0, 4, 1, 2, 4}, {{1, 10, 2}, {11}, {0}, {1, 13, 14, 2}, {1}, {15, 2},
                                                                  {1, 16, 17, 2}}, NULL, NULL}, 4, 3, 7},
    {"no short game", {"", 2, {2, 2}, {{1, 2}, {7, 2}}, NULL, NULL}, 2, 0, 1},
    {"one game with a move", {"", 3, {1, 0, 3}, {{1}, {0}, {1, 7, 2}}, NULL, NULL}, 1, 2, 1},
};

static void test_loader(void) {
    char sub[300], path[400];
    unsigned char buf[256];
    for (size_t i = 0; i < sizeof loader_cases / sizeof loader_cases[0]; i++) {
        const loader_case *c = &loader_cases[i];
        snprintf(sub, sizeof sub, "%s/loader%zu", dir, i);
        EXPECT(mkdir(sub, 0700) == 0, "mkdir %s", sub);
        snprintf(path, sizeof path, "%s/train_000.bin", sub);
        write_file(path, buf, make_docs_shard(buf, &c->shard));
        loader ld;
        ft_error_clear();
        if (loader_open(&ld, sub, "train", 50, 4, 0, 1, 7) != 0) {
            EXPECT(0, "%s: open: %s", c->name, ft_error_message());
        } else {
            EXPECT((int)loader_rows(&ld) == c->rows && (int)loader_skipped_games(&ld) == c->skipped,
                   "%s: %llu rows, %llu skipped (expected %d, %d)", c->name, (unsigned long long)loader_rows(&ld),
                   (unsigned long long)loader_skipped_games(&ld), c->rows, c->skipped);
            for (int epoch = 0; epoch < 3; epoch++) {
                int seen[8] = {0};
                for (uint64_t r = 0; r < loader_rows(&ld); r++) {
                    int32_t tok[4], tgt[4];
                    const int valid = loader_fill_row(&ld, epoch, r, tok, tgt);
                    EXPECT(valid >= 1, "%s: epoch %d row %llu has %d targets", c->name, epoch, (unsigned long long)r,
                           valid);
                    for (int d = 0; d < c->shard.n_docs; d++)   // which game: its tokens
                        if (c->shard.len[d] >= 2 && (uint32_t)tok[0] == c->shard.tok[d][0] &&
                            (uint32_t)tok[1] == c->shard.tok[d][1])
                            seen[d]++;
                }
                for (int d = 0; d < c->shard.n_docs; d++)
                    EXPECT(seen[d] == (c->shard.len[d] >= 2), "%s: epoch %d: game %d was a row %d time(s)", c->name,
                           epoch, d, seen[d]);
            }
            loader_close(&ld);
        }
        ft_error_clear();
        if (loader_open(&ld, sub, "train", 50, 2, 1, 1, 7) != 0) {
            EXPECT(0, "%s: open packed: %s", c->name, ft_error_message());
        } else {
            EXPECT((int)loader_rows(&ld) == c->packed_rows && loader_skipped_games(&ld) == 0,
                   "%s: packed: %llu rows (expected %d)", c->name, (unsigned long long)loader_rows(&ld),
                   c->packed_rows);
            loader_close(&ld);
        }
        unlink(path);
        rmdir(sub);
    }
}

int main(void) {
    EXPECT(mkdtemp(dir) != NULL, "mkdtemp");
    char path[256];
    unsigned char buf[256];

    // valid shards, both token widths
    for (uint32_t tb = 2; tb <= 4; tb += 2) {
        size_t n = make_shard(buf, tb);
        snprintf(path, sizeof path, "%s/ok%u.bin", dir, tb);
        write_file(path, buf, n);
        token_shard s;
        ft_error_clear();
        int rc = token_shard_open(&s, path, 50);
        EXPECT(rc == 0, "valid shard (token_bytes %u) rejected: %s", tb, ft_error_message());
        if (rc != 0) continue;
        EXPECT(s.n_docs == 3 && token_shard_doc_len(&s, 2) == 6, "doc table");
        int32_t tok[5], tgt[5];
        int valid = token_shard_fill_row(&s, 2, 5, tok, tgt);   // doc 1 20 21 22 23 2 -> truncated
        EXPECT(valid == 5 && tok[0] == 1 && tok[4] == 23 && tgt[0] == 20 && tgt[4] == 2, "truncation row");
        valid = token_shard_fill_row(&s, 0, 5, tok, tgt);        // doc 1 10 11 2 -> padded
        EXPECT(valid == 3 && tgt[2] == 2 && tgt[3] == -100 && tgt[4] == -100 && tok[4] == 2, "padding row");
        valid = token_shard_fill_row(&s, 1, 5, tok, tgt);        // doc of one token: nothing to predict
        EXPECT(valid == 0 && tgt[0] == -100, "one-token row");
        token_shard_close(&s);
    }

    // no bos / eos (0xFFFFFFFF): valid, short rows pad with 0
    {
        size_t n = make_shard(buf, 2);
        const uint32_t none[2] = {0xFFFFFFFFu, 0xFFFFFFFFu};
        memcpy(buf + 20, none, sizeof none);
        snprintf(path, sizeof path, "%s/none.bin", dir);
        write_file(path, buf, n);
        token_shard s;
        ft_error_clear();
        int rc = token_shard_open(&s, path, 50);
        EXPECT(rc == 0, "shard without bos/eos rejected: %s", ft_error_message());
        int32_t tok[5], tgt[5];
        if (rc == 0) {
            token_shard_fill_row(&s, 0, 5, tok, tgt);
            EXPECT(tok[4] == 0 && tgt[4] == -100, "pad without eos: token %d, target %d", tok[4], tgt[4]);
            token_shard_close(&s);
        }
        unlink(path);
    }

    // corruptions of the 2-byte shard
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const corruption *c = &cases[i];
        size_t n = make_shard(buf, 2);
        if (c->at == SIZE_MAX) n -= c->value;
        else memcpy(buf + c->at, &c->value, (size_t)c->width);
        snprintf(path, sizeof path, "%s/bad%zu.bin", dir, i);
        write_file(path, buf, n);
        token_shard s;
        ft_error_clear();
        int rc = token_shard_open(&s, path, c->model_vocab);
        const char *msg = ft_error_message();
        EXPECT(rc == -1 && strstr(msg, path) && strstr(msg, c->expect),
               "%s: rc %d, message '%s' (expected '%s')", c->name, rc, msg, c->expect);
        if (rc == 0) token_shard_close(&s);
        unlink(path);
    }
    test_content();
    test_loader();
    ft_error_clear();
    token_shard s;
    EXPECT(token_shard_open(&s, "/nonexistent/x.bin", 0) == -1 && strstr(ft_error_message(), "/nonexistent/x.bin"),
           "missing file: %s", ft_error_message());
    snprintf(path, sizeof path, "%s/ok2.bin", dir); unlink(path);
    snprintf(path, sizeof path, "%s/ok4.bin", dir); unlink(path);
    rmdir(dir);
    TEST_SUMMARY("test_data");
}
