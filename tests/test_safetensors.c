// test_safetensors.c: the safetensors reader against a table of hostile files (each must
// be rejected with one message naming the file and the field/tensor at fault, and must
// never read outside the mapping: run under ASan in `make test-asan`), the writer's
// round trip and atomicity, the streaming writer (any put order gives st_write's bytes; a
// missing tensor refused), the per-tensor checksums (ft_hash64 pinned and blind to no single
// flipped bit; recorded by the writer, a flipped byte found by st_verify, malformed checksum
// metadata refused), and the checkpoint directory layer (single file, sharded index,
// missing/duplicate/unexpected tensors, wrong shapes, NaN/infinite values, a flipped byte; with
// tied embeddings a stored lm_head.weight equal, different, or damaged: its checksum),
// and the content fingerprint (st_fingerprint, hf_checkpoint_fingerprint: the same bytes give the same
// value, one byte changed in a sampled region another, bytes outside the samples are not read;
// tiny files and an empty data area are fine; shard order does not matter).
#include <jansson.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hf_checkpoint.h"
#include "common.h"
#include "config.h"
#include "model.h"
#include "safetensors.h"
#include "test.h"

static char dir[] = "/tmp/ft_test_st_XXXXXX";

// Write a safetensors file from a header string (length field computed unless
// `hlen_override` >= 0) followed by `data_bytes` bytes of data.
static void write_raw(const char *path, const char *header, long long hlen_override, size_t data_bytes) {
    FILE *f = fopen(path, "wb");
    uint64_t hlen = hlen_override >= 0 ? (uint64_t)hlen_override : strlen(header);
    fwrite(&hlen, 8, 1, f);  // little-endian host (x86-64)
    fwrite(header, 1, strlen(header), f);
    for (size_t i = 0; i < data_bytes; i++) fputc((int)(i & 0xff), f);
    fclose(f);
}

typedef struct {
    const char *name;
    const char *header;
    long long hlen;        // -1 = real length
    size_t data_bytes;
    const char *want;      // substring of the error; NULL = must open
} st_case;

static const st_case st_cases[] = {
    {"valid two tensors",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
     "\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[16,22]}}", -1, 22, NULL},
    {"valid with metadata and scalar",
     "{\"__metadata__\":{\"format\":\"pt\"},\"s\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]}}", -1, 8, NULL},
    {"valid empty tensor",
     "{\"e\":{\"dtype\":\"F16\",\"shape\":[0,5],\"data_offsets\":[0,0]}}", -1, 0, NULL},
    {"header length past EOF", "{}", 1000, 0, "runs past the end"},
    {"header length huge", "{}", (long long)0x7fffffffffffffffLL, 0, "runs past the end"},
    {"not JSON", "{\"a\": [1, 2", -1, 0, "not valid JSON"},
    {"JSON array", "[1, 2, 3]", -1, 0, "not a JSON object"},
    {"entry not an object", "{\"a\": 5}", -1, 0, "tensor 'a': header entry is not an object"},
    {"unknown dtype", "{\"a\":{\"dtype\":\"F8_E9\",\"shape\":[1],\"data_offsets\":[0,1]}}", -1, 1,
     "tensor 'a': unknown dtype 'F8_E9'"},
    {"dtype missing", "{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 4, "tensor 'a': field 'dtype'"},
    {"shape not array", "{\"a\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,16]}}", -1, 16,
     "tensor 'a': field 'shape'"},
    {"negative dim", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", -1, 4, "shape[0]"},
    {"absurd dim", "{\"a\":{\"dtype\":\"F32\",\"shape\":[100000000000000000],\"data_offsets\":[0,4]}}", -1, 4,
     "shape[0]"},
    {"shape overflows", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],\"data_offsets\":[0,4]}}",
     -1, 4, "overflows"},
    {"too many dims", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", -1, 1,
     "dimensions"},
    {"offsets not pair", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", -1, 4, "data_offsets"},
    {"offsets past data", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", -1, 8,
     "out of range"},
    {"offsets reversed", "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", -1, 8, "out of range"},
    {"negative offset", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", -1, 8, "out of range"},
    {"shape x dtype != bytes", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}", -1, 12,
     "do not match shape [2, 2] x F32 = 16 bytes"},
    {"overlapping tensors",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", -1, 12, "overlap"},
    {"hole between tensors",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", -1, 12, "hole"},
    {"trailing bytes", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 9, "cover 4"},
    {"duplicate tensor name",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", -1, 8, "duplicate"},
    {"metadata not strings", "{\"__metadata__\":{\"x\":1}}", -1, 0, "__metadata__['x']"},
    // checksums in __metadata__ (a wrong value opens: st_verify finds it, test_checksum)
    {"checksum recorded",
     "{\"__metadata__\":{\"finetune.checksum\":\"ft_hash64\",\"finetune.checksum.a\":\"0123456789abcdef\"},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 4, NULL},
    {"checksum of an unknown function",
     "{\"__metadata__\":{\"finetune.checksum\":\"crc32\",\"finetune.checksum.a\":\"01234567\"},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 4,
     "__metadata__['finetune.checksum'] is 'crc32', a checksum this build does not know"},
    {"checksum without its function",
     "{\"__metadata__\":{\"finetune.checksum.a\":\"0123456789abcdef\"},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 4,
     "__metadata__['finetune.checksum.a'] without __metadata__['finetune.checksum']"},
    {"checksum of no tensor",
     "{\"__metadata__\":{\"finetune.checksum\":\"ft_hash64\",\"finetune.checksum.a\":\"0123456789abcdef\","
     "\"finetune.checksum.c\":\"0123456789abcdef\"},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 4, "__metadata__['finetune.checksum.c'] names no tensor"},
    {"checksum not hex",
     "{\"__metadata__\":{\"finetune.checksum\":\"ft_hash64\",\"finetune.checksum.a\":\"0123456789abcdeg\"},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
     -1, 4, "__metadata__['finetune.checksum.a'] is not 16 hex digits"},
    // our writer records one per tensor: a tensor without one was added (or its checksum dropped) since
    {"checksum missing for one tensor",
     "{\"__metadata__\":{\"finetune.checksum\":\"ft_hash64\",\"finetune.checksum.a\":\"0123456789abcdef\"},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
     -1, 8, "tensor 'b' has no checksum though the file records finetune checksums (edited after finetune wrote it?)"},
    {"checksums recorded, none per tensor",
     "{\"__metadata__\":{\"finetune.checksum\":\"ft_hash64\"},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
     -1, 4, "tensor 'a' has no checksum though the file records finetune checksums"},
};

static void test_reader_table(void) {
    char path[256];
    snprintf(path, sizeof path, "%s/case.safetensors", dir);
    for (size_t i = 0; i < sizeof st_cases / sizeof st_cases[0]; i++) {
        const st_case *c = &st_cases[i];
        write_raw(path, c->header, c->hlen, c->data_bytes);
        ft_error_clear();
        st_file f;
        int rc = st_open(&f, path);
        if (!c->want) {
            EXPECT(rc == 0, "%s: should open, got: %s", c->name, ft_error_message());
        } else {
            const char *msg = ft_error_message();
            EXPECT(rc != 0, "%s: should be rejected", c->name);
            EXPECT(strstr(msg, c->want) != NULL && strstr(msg, path) != NULL && !strchr(msg, '\n'),
                   "%s: error '%s' should name the file and contain '%s'", c->name, msg, c->want);
        }
        st_close(&f);
    }
    // short files and a missing file
    const char *tiny[] = {"", "\x01\x00"};
    for (int i = 0; i < 2; i++) {
        FILE *fp = fopen(path, "wb");
        fwrite(tiny[i], 1, strlen(tiny[i]), fp);
        fclose(fp);
        ft_error_clear();
        st_file f;
        EXPECT(st_open(&f, path) != 0 && strstr(ft_error_message(), "too short"), "short file %d: %s", i,
               ft_error_message());
        st_close(&f);
    }
    ft_error_clear();
    st_file f;
    EXPECT(st_open(&f, "/nonexistent/x.safetensors") != 0 && strstr(ft_error_message(), "cannot open"),
           "missing file: %s", ft_error_message());
    st_close(&f);
}

// ----------------------------------------------------------------------------
// writer: round trip, 8-byte alignment, no temp file left behind, failure leaves nothing

static void test_writer(void) {
    char path[256];
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[3] = {0x3f80, 0x4000, 0xc040};
    int32_t s = 7;
    st_write_tensor ts[3] = {
        {"a.weight", ST_F32, 2, {2, 3}, a},
        {"b", ST_BF16, 1, {3}, b},
        {"scalar", ST_I32, 0, {0}, &s},
    };
    const char *meta[] = {"format", "pt", NULL};
    ft_error_clear();
    EXPECT(st_write(path, ts, 3, meta) == 0, "write: %s", ft_error_message());
    st_file f;
    EXPECT(st_open(&f, path) == 0, "reopen: %s", ft_error_message());
    const st_tensor *ta = st_find(&f, "a.weight"), *tb = st_find(&f, "b"), *tsc = st_find(&f, "scalar");
    EXPECT(ta && ta->ndim == 2 && ta->shape[1] == 3 && ta->dtype == ST_F32 && memcmp(ta->data, a, 24) == 0,
           "tensor a round trip");
    EXPECT(tb && tb->dtype == ST_BF16 && memcmp(tb->data, b, 6) == 0, "tensor b round trip");
    // safetensors does not align tensors (this one starts at byte 30): read through memcpy
    int32_t sv = 0;
    if (tsc) memcpy(&sv, tsc->data, sizeof sv);
    EXPECT(tsc && tsc->ndim == 0 && tsc->numel == 1 && sv == 7, "scalar round trip");
    EXPECT(f.n_tensors == 3 && st_find(&f, "nope") == NULL, "tensor count / st_find miss");
    uint64_t hlen;
    memcpy(&hlen, f.map, 8);
    EXPECT((8 + hlen) % 8 == 0, "data area is 8-byte aligned (header %llu)", (unsigned long long)hlen);
    st_close(&f);
    // a failed write (duplicate name) leaves neither the file nor a temp file
    char path2[256], tmp[300];
    snprintf(path2, sizeof path2, "%s/fail.safetensors", dir);
    st_write_tensor dup[2] = {{"x", ST_F32, 1, {1}, a}, {"x", ST_F32, 1, {1}, a}};
    ft_error_clear();
    EXPECT(st_write(path2, dup, 2, NULL) != 0 && strstr(ft_error_message(), "duplicate"), "duplicate write rejected");
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path2, (int)getpid());
    EXPECT(access(path2, F_OK) != 0 && access(tmp, F_OK) != 0, "no partial file after a failed write");
    // an unwritable destination fails cleanly
    ft_error_clear();
    EXPECT(st_write("/nonexistent_dir/x.safetensors", ts, 1, NULL) != 0 && strstr(ft_error_message(), "cannot create"),
           "unwritable path: %s", ft_error_message());
}

// Flip the bits `mask` of byte `off` of `path` in place. 0 / -1.
static int flip_bits(const char *path, long off, int mask) {
    FILE *f = fopen(path, "r+b");
    int c = f && fseek(f, off, SEEK_SET) == 0 ? fgetc(f) : EOF;
    int ok = c != EOF && fseek(f, off, SEEK_SET) == 0 && fputc(c ^ mask, f) != EOF;
    if (f) ok &= fclose(f) == 0;
    return ok ? 0 : -1;
}

// Flip the lowest bit of byte `off` of `path` in place. 0 / -1.
static int flip_byte(const char *path, long off) { return flip_bits(path, off, 1); }

// The whole file at `path` (malloc'ed, *n bytes), or NULL.
static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    rewind(f);
    char *b = malloc(*n + 1);
    if (b && fread(b, 1, *n, f) != *n) { free(b); b = NULL; }
    fclose(f);
    return b;
}

// streaming writer: tensors put in reverse order give st_write's bytes exactly; a tensor
// never put makes the commit fail and leaves no file
static void test_writer_stream(void) {
    char one[256], streamed[256], tmp[300];
    snprintf(one, sizeof one, "%s/one.safetensors", dir);
    snprintf(streamed, sizeof streamed, "%s/streamed.safetensors", dir);
    float a[6] = {1, 2, 3, 4, 5, 6}, c[5] = {-1, -2, -3, -4, -5};
    uint16_t b[3] = {0x3f80, 0x4000, 0xc040};
    st_write_tensor ts[3] = {
        {"a.weight", ST_F32, 2, {2, 3}, a},
        {"b", ST_BF16, 1, {3}, b},
        {"c", ST_F32, 1, {5}, c},
    };
    const char *meta[] = {"format", "pt", NULL};
    ft_error_clear();
    EXPECT(st_write(one, ts, 3, meta) == 0, "st_write: %s", ft_error_message());
    st_writer w;
    int rc = st_writer_open(&w, streamed, ts, 3, meta);
    for (int i = 2; i >= 0 && rc == 0; i--) rc = st_writer_put(&w, i, ts[i].data);
    rc = rc == 0 ? st_writer_commit(&w) : (st_writer_abort(&w), -1);
    EXPECT(rc == 0, "streamed write: %s", ft_error_message());
    size_t n1 = 0, n2 = 0;
    char *b1 = slurp(one, &n1), *b2 = slurp(streamed, &n2);
    EXPECT(b1 && b2 && n1 == n2 && memcmp(b1, b2, n1) == 0, "puts in reverse order give st_write's bytes (%zu vs %zu)", n1, n2);
    free(b1);
    free(b2);
    // tensor "b" never put: the commit refuses, naming it; neither file nor temp file remains
    unlink(streamed);
    ft_error_clear();
    rc = st_writer_open(&w, streamed, ts, 3, meta);
    if (rc == 0) rc = st_writer_put(&w, 0, a) | st_writer_put(&w, 2, c);
    EXPECT(rc == 0 && st_writer_commit(&w) != 0 && strstr(ft_error_message(), "tensor 'b' was never written"),
           "commit with a missing tensor refused: %s", ft_error_message());
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", streamed, (int)getpid());
    EXPECT(access(streamed, F_OK) != 0 && access(tmp, F_OK) != 0, "no file after a refused commit");
    // abort after some puts leaves nothing either
    rc = st_writer_open(&w, streamed, ts, 3, meta);
    if (rc == 0) rc = st_writer_put(&w, 1, b);
    st_writer_abort(&w);
    st_writer_abort(&w);   // harmless twice
    EXPECT(rc == 0 && access(streamed, F_OK) != 0 && access(tmp, F_OK) != 0, "no file after an abort");
}

// checksums: ft_hash64 pinned (a changed function would call every saved checkpoint corrupt)
// and blind to no single flipped bit; the writer records one per tensor, the reader checks it
static void test_checksum(void) {
    unsigned char buf[200];
    for (int i = 0; i < 200; i++) buf[i] = (unsigned char)(i * 37 + 11);
    EXPECT(ft_hash64("finetune", 8) == 0x7af52c0445b49a41ull && ft_hash64(buf, 200) == 0xd747d00f18311fa0ull &&
           ft_hash64(NULL, 0) == 0x4d8a53d1ccca6c0cull,
           "ft_hash64 pinned: %016llx %016llx %016llx", (unsigned long long)ft_hash64("finetune", 8),
           (unsigned long long)ft_hash64(buf, 200), (unsigned long long)ft_hash64(NULL, 0));
    int missed = 0;   // lengths 1..200: blocks, tail words, a partial last word
    for (size_t n = 1; n <= 200; n++) {
        const uint64_t h = ft_hash64(buf, n);
        for (size_t i = 0; i < n; i++)
            for (int bit = 0; bit < 8; bit++) {
                buf[i] ^= (unsigned char)(1u << bit);
                missed += ft_hash64(buf, n) == h;
                buf[i] ^= (unsigned char)(1u << bit);
            }
    }
    unsigned char zeros[9] = {0};
    EXPECT(missed == 0 && ft_hash64(zeros, 8) != ft_hash64(zeros, 9), "every flipped bit changes ft_hash64 (%d missed), "
           "and so does a trailing zero byte", missed);
    char path[256];
    snprintf(path, sizeof path, "%s/sum.safetensors", dir);
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[3] = {0x3f80, 0x4000, 0xc040};
    st_write_tensor ts[2] = {{"a.weight", ST_F32, 2, {2, 3}, a}, {"b", ST_BF16, 1, {3}, b}};
    const char *meta[] = {"format", "pt", NULL};
    ft_error_clear();
    EXPECT(st_write(path, ts, 2, meta) == 0, "write: %s", ft_error_message());
    st_file f;
    int rc = st_open(&f, path);
    const st_tensor *ta = rc == 0 ? st_find(&f, "a.weight") : NULL, *tb = rc == 0 ? st_find(&f, "b") : NULL;
    EXPECT(ta && tb && ta->has_checksum && tb->has_checksum && ta->checksum == ft_hash64(a, sizeof a) &&
           tb->checksum == ft_hash64(b, sizeof b) && st_verify(ta, path) == 0 && st_verify(tb, path) == 0,
           "the writer records each tensor's checksum; they verify (%s)", ft_error_message());
    long off = ta && tb ? (long)((const unsigned char *)tb->data - (const unsigned char *)f.map) + 3 : 0;
    st_close(&f);
    EXPECT(off > 0 && flip_byte(path, off) == 0 && st_open(&f, path) == 0, "one byte of 'b' flipped, still opens");
    ft_error_clear();
    ta = st_find(&f, "a.weight");
    tb = st_find(&f, "b");
    char want[400];
    snprintf(want, sizeof want, "%s: tensor 'b': checksum mismatch (the file is corrupted)", path);
    EXPECT(ta && tb && st_verify(ta, path) == 0 && st_verify(tb, path) != 0 && strcmp(ft_error_message(), want) == 0,
           "the flipped tensor fails st_verify, the other passes: '%s'", ft_error_message());
    st_close(&f);
}

// ----------------------------------------------------------------------------
// checkpoint directories: a tiny config and its tensors, with one defect per case

static const char *tiny_config =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"hidden_size\":8,"
    "\"intermediate_size\":12,\"num_hidden_layers\":1,\"num_attention_heads\":2,\"num_key_value_heads\":1,"
    "\"vocab_size\":10,\"rms_norm_eps\":1e-5,\"max_position_embeddings\":16,\"tie_word_embeddings\":false}";

typedef enum { D_NONE, D_MISSING, D_EXTRA, D_SHAPE, D_DTYPE, D_INDEX_MISSING_FILE, D_INDEX_ESCAPE,
               D_INDEX_WRONG_FILE, D_INDEX_UNLISTED_FILE, D_INDEX_DUP_ACROSS, D_NAN, D_INF, D_FLIPPED,
               // tie_word_embeddings true: lm_head.weight stored too, equal / different / equal with
               // a bit of it or of the embeddings flipped since; or instead of
               // model.embed_tokens.weight (transformers ties to the one stored)
               D_TIED_HEAD_EQUAL, D_TIED_HEAD_DIFF, D_TIED_HEAD_FLIPPED, D_TIED_EMB_FLIPPED, D_TIED_HEAD_ONLY } ck_defect;

typedef struct { const char *name; ck_defect defect; int sharded; const char *want; } ck_case;

static const ck_case ck_cases[] = {
    {"single file ok", D_NONE, 0, NULL},
    {"sharded ok", D_NONE, 1, NULL},
    {"missing tensor", D_MISSING, 0, "model.layers.0.mlp.down_proj.weight"},
    {"unexpected tensor", D_EXTRA, 0, "unexpected tensor 'model.layers.7.mlp.up_proj.weight'"},
    {"wrong shape", D_SHAPE, 0, "model.norm.weight"},
    {"integer dtype", D_DTYPE, 0, "model.norm.weight"},
    {"index names a missing shard", D_INDEX_MISSING_FILE, 1, "cannot open"},
    {"index escapes the directory", D_INDEX_ESCAPE, 1, "not a plain file name"},
    {"index points to the wrong shard", D_INDEX_WRONG_FILE, 1, "is listed in"},
    // lm_head.weight in a third file the index does not name (it maps it to shard 2)
    {"tensor only in a file the index does not name", D_INDEX_UNLISTED_FILE, 1,
     "tensor 'lm_head.weight' is mapped to model-00002-of-00002.safetensors, but no file the index names holds it"},
    {"tensor in two shards", D_INDEX_DUP_ACROSS, 1, "lm_head.weight"},
    // values: found when the units are read
    {"NaN weight", D_NAN, 0, "model.safetensors: tensor 'model.norm.weight': element 3 is nan (not finite)"},
    {"infinite weight (sharded)", D_INF, 1, "tensor 'model.norm.weight': element 3 is -inf (not finite)"},
    {"a byte flipped in a weight", D_FLIPPED, 0,
     "model.safetensors: tensor 'model.norm.weight': checksum mismatch (the file is corrupted)"},
    {"tied, lm_head stored equal", D_TIED_HEAD_EQUAL, 0, NULL},
    {"tied, lm_head stored different", D_TIED_HEAD_DIFF, 1,
     "tensor 'lm_head.weight' differs from model.embed_tokens.weight, but config.json has tie_word_embeddings true"},
    // the stored lm_head is read only to compare it: its checksum is verified there (before, a
    // 0 flipped to -0 in it passed, equal as a value, and damage to the embeddings was called a
    // different lm_head)
    {"tied, a 0 in the stored lm_head flipped to -0", D_TIED_HEAD_FLIPPED, 0,
     "model.safetensors: tensor 'lm_head.weight': checksum mismatch (the file is corrupted)"},
    {"tied, a bit flipped in the embeddings", D_TIED_EMB_FLIPPED, 0,
     "model.safetensors: tensor 'model.embed_tokens.weight': checksum mismatch (the file is corrupted)"},
    {"tied, only lm_head stored", D_TIED_HEAD_ONLY, 0, NULL},
};

// lm_head.weight stored beside the embeddings, as a copy (equal, or flipped afterwards) or not
static int tied_copy_case(ck_defect d) {
    return d == D_TIED_HEAD_EQUAL || d == D_TIED_HEAD_DIFF || d == D_TIED_HEAD_FLIPPED || d == D_TIED_EMB_FLIPPED;
}
static int tied_case(ck_defect d) { return tied_copy_case(d) || d == D_TIED_HEAD_ONLY; }

// The bits a case flips once the file is written: in byte `byte` of tensor `tensor` (element 0, all zeros)
static const struct { ck_defect defect; const char *tensor; long byte; int mask; } ck_flips[] = {
    {D_FLIPPED, "model.norm.weight", 1, 0x01},                // a finite value stays finite
    {D_TIED_HEAD_FLIPPED, "lm_head.weight", 3, 0x80},         // 0 becomes -0: equal as a value
    {D_TIED_EMB_FLIPPED, "model.embed_tokens.weight", 1, 0x01},
};

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

// A tensor to write for layout entry e: its name and shape, `dt`, `data`.
static st_write_tensor entry_tensor(const param_entry *e, st_dtype dt, const void *data) {
    st_write_tensor t;
    memset(&t, 0, sizeof t);
    t.name = e->name;
    t.dtype = dt;
    t.ndim = e->ndim;
    for (int d = 0; d < e->ndim; d++) t.shape[d] = e->shape[d];
    t.data = data;
    return t;
}

// Write the n tensors `ts` of case c as model.safetensors in cdir, then flip the case's bits
// (ck_flips). 0 / -1.
static int write_single(const char *cdir, const st_write_tensor *ts, int n, const ck_case *c) {
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors", cdir);
    int rc = st_write(p, ts, n, NULL);
    st_file f;
    for (size_t k = 0; k < sizeof ck_flips / sizeof ck_flips[0]; k++)
        if (rc == 0 && ck_flips[k].defect == c->defect && (rc = st_open(&f, p)) == 0) {
            const st_tensor *t = st_find(&f, ck_flips[k].tensor);
            const long off = (long)((const unsigned char *)t->data - (const unsigned char *)f.map);
            st_close(&f);
            rc = flip_bits(p, off + ck_flips[k].byte, ck_flips[k].mask);
        }
    return rc;
}

// Write the n tensors `ts` of case c as two shards and their index in cdir, with the case's
// defect of the shards or the index. 0 / -1.
static int write_sharded(const char *cdir, const st_write_tensor *ts, int n, const ck_case *c) {
    char p[512];
    int rc = 0;
    // two shards: first half / second half; index maps each name
    int h = n / 2;
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", cdir);
    rc |= st_write(p, ts, h, NULL);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", cdir);
    rc |= st_write(p, ts + h, n - h, NULL);
    if (c->defect == D_INDEX_UNLISTED_FILE) {   // the last tensor (lm_head.weight) moved to a third file
        snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", cdir);
        rc |= st_write(p, ts + h, n - h - 1, NULL);
        snprintf(p, sizeof p, "%s/model-00003-of-00003.safetensors", cdir);
        rc |= st_write(p, ts + n - 1, 1, NULL);
    }
    if (c->defect == D_INDEX_DUP_ACROSS) {  // shard 1 also holds the last tensor (lm_head.weight)
        st_write_tensor ts1[33];
        memcpy(ts1, ts, (size_t)h * sizeof *ts);
        ts1[h] = ts[n - 1];
        snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", cdir);
        rc |= st_write(p, ts1, h + 1, NULL);
    }
    char *idx = malloc(16384);
    size_t k = (size_t)snprintf(idx, 16384, "{\"metadata\":{},\"weight_map\":{");
    for (int i = 0; i < n; i++) {
        const char *file = i < h ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
        if (i == 0 && c->defect == D_INDEX_MISSING_FILE) file = "model-00009-of-00002.safetensors";
        if (i == 0 && c->defect == D_INDEX_ESCAPE) file = "../../etc/passwd";
        if (i == 0 && c->defect == D_INDEX_WRONG_FILE) file = "model-00002-of-00002.safetensors";
        k += (size_t)snprintf(idx + k, 16384 - k, "%s\"%s\":\"%s\"", i ? "," : "", ts[i].name, file);
    }
    snprintf(idx + k, 16384 - k, "}}");
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", cdir);
    write_text(p, idx);
    free(idx);
    return rc;
}

static int make_checkpoint(const char *cdir, const ck_case *c) {
    char p[512];
    mkdir(cdir, 0755);
    snprintf(p, sizeof p, "%s/config.json", cdir);
    char config[1024];
    snprintf(config, sizeof config, "%s", tiny_config);
    if (tied_case(c->defect)) memcpy(strstr(config, "false}"), "true} ", 6);
    write_text(p, config);
    llama_config cfg;
    if (llama_config_load(&cfg, p) != 0) return -1;
    param_layout l;
    if (param_layout_init(&l, &cfg, 1) != 0) return -1;
    static float zeros[4096], ramp[4096], nan3[8] = {[3] = NAN}, ninf3[8] = {[3] = -INFINITY};
    for (int i = 0; i < 4096; i++) ramp[i] = (float)i;
    st_write_tensor ts[32];
    int n = 0;
    for (int i = 0; i < l.n_entries; i++) {
        const param_entry *e = &l.entries[i];
        if (c->defect == D_MISSING && strstr(e->name, "down_proj")) continue;
        st_write_tensor *t = &ts[n++];
        *t = entry_tensor(e, ST_F32, zeros);
        if (strcmp(e->name, "model.norm.weight") == 0 && c->defect == D_SHAPE) t->shape[0] = 9;
        if (strcmp(e->name, "model.norm.weight") == 0 && c->defect == D_DTYPE) t->dtype = ST_I32;
        if (strcmp(e->name, "model.norm.weight") == 0 && (c->defect == D_NAN || c->defect == D_INF))
            t->data = c->defect == D_NAN ? nan3 : ninf3;
        if (strcmp(e->name, "model.embed_tokens.weight") == 0 && c->defect == D_TIED_HEAD_ONLY) {
            t->name = "lm_head.weight";
            t->data = ramp;
        }
    }
    if (tied_copy_case(c->defect)) {
        for (int i = 0; i < n; i++)   // a copy of model.embed_tokens.weight, maybe with other values
            if (strcmp(ts[i].name, "model.embed_tokens.weight") == 0) ts[n] = ts[i];
        ts[n].name = "lm_head.weight";
        if (c->defect == D_TIED_HEAD_DIFF) ts[n].data = ramp;
        n++;
    }
    if (c->defect == D_EXTRA) ts[n++] = (st_write_tensor){"model.layers.7.mlp.up_proj.weight", ST_F32, 1, {2}, zeros};
    const int rc = c->sharded ? write_sharded(cdir, ts, n, c) : write_single(cdir, ts, n, c);
    param_layout_free(&l);
    return rc;
}

static void test_checkpoint_table(void) {
    for (size_t i = 0; i < sizeof ck_cases / sizeof ck_cases[0]; i++) {
        const ck_case *c = &ck_cases[i];
        char cdir[256];
        snprintf(cdir, sizeof cdir, "%s/ck%zu", dir, i);
        ft_error_clear();
        if (make_checkpoint(cdir, c) != 0) { EXPECT(0, "%s: setup failed: %s", c->name, ft_error_message()); continue; }
        char p[512];
        snprintf(p, sizeof p, "%s/config.json", cdir);
        llama_config cfg;
        llama_config_load(&cfg, p);
        hf_checkpoint ck;
        int rc = hf_checkpoint_open(&ck, cdir);
        param_layout l;
        param_layout_init(&l, &cfg, 1);
        if (rc == 0) rc = hf_checkpoint_validate(&ck, &l);
        float unit[4096];   // (more than either unit of tiny_config)
        for (int u = 0; u < l.n_units && rc == 0; u++) rc = hf_checkpoint_read_unit(&ck, &l, u, unit);
        if (rc == 0 && c->defect == D_TIED_HEAD_ONLY) {   // the embeddings are the stored lm_head.weight
            const param_entry *e = param_layout_find(&l, "model.embed_tokens.weight");
            EXPECT(e && hf_checkpoint_read_unit(&ck, &l, e->unit, unit) == 0 && unit[e->unit_offset + 7] == 7.0f,
                   "%s: model.embed_tokens.weight should hold lm_head.weight's values", c->name);
        }
        param_layout_free(&l);
        if (!c->want) EXPECT(rc == 0, "%s: should load, got: %s", c->name, ft_error_message());
        else EXPECT(rc != 0 && strstr(ft_error_message(), c->want) && !strchr(ft_error_message(), '\n'),
                    "%s: error '%s' should contain '%s'", c->name, ft_error_message(), c->want);
        hf_checkpoint_close(&ck);
    }
}

// ----------------------------------------------------------------------------
// a rank's part of a unit (hf_checkpoint_read_range): tiny_config's tensors hold their position
// in the unit (mod 200: exact in bf16); in F32 and BF16 files, every unit is read in S = 1..4
// ranges: each range converted exactly and nothing outside it touched, their union the whole
// unit (= hf_checkpoint_read_unit); a byte flipped in model.norm.weight (a finite value
// still) is reported by exactly one of verify_count ranks, whether its range holds the tensor
// or not; a NaN in it only by the ranges that hold the element

static int write_positions(const char *cdir, const param_layout *l, st_dtype dt, int nan_at_norm3) {
    static float f32[16][2048];
    static uint16_t b16[16][2048];
    st_write_tensor ts[16];
    int n = 0;
    for (int i = 0; i < l->n_entries && n < 16; i++) {
        const param_entry *e = &l->entries[i];
        if (e->numel > 2048) return -1;
        float *x = f32[n];
        for (size_t j = 0; j < e->numel; j++) x[j] = (float)((e->unit_offset + j) % 200);
        if (nan_at_norm3 && strcmp(e->name, "model.norm.weight") == 0) x[3] = NAN;
        for (size_t j = 0; j < e->numel; j++) b16[n][j] = ft_f32_to_bf16(x[j]);
        ts[n] = entry_tensor(e, dt, dt == ST_F32 ? (const void *)x : (const void *)b16[n]);
        n++;
    }
    if (n != l->n_entries) return -1;   // (16 tensors at most: tiny_config has 12)
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors", cdir);
    return st_write(p, ts, n, NULL);
}

// Unit u of the file open as ck read in S = 1..4 ranges, each checked (see above): `pass` is
// test_read_range's (0 F32, 1 BF16, 2 a byte of `norm` flipped, 3 a NaN in `norm`), norm_index
// norm's index among its unit's tensors (whose rank verifies its checksum).
static void check_unit_ranges(const hf_checkpoint *ck, const param_layout *l, int u, int pass,
                              const param_entry *norm, int norm_index) {
    const int norm_unit = norm ? norm->unit : -1;
    const size_t n = l->unit_numel[u];
    for (int S = 1; S <= 4; S++) {
        float whole[4096], part[4096];
        for (size_t j = 0; j < n; j++) whole[j] = NAN;
        int n_checksum = 0, n_nan = 0;
        for (int r = 0; r < S; r++) {
            const size_t lo = n * (size_t)r / (size_t)S, hi = n * (size_t)(r + 1) / (size_t)S;
            for (size_t j = 0; j < n; j++) part[j] = -1.0f;   // a sentinel outside the range
            ft_error_clear();
            const int rc = hf_checkpoint_read_range(ck, l, u, lo, hi, r, S, part);
            const char *msg = ft_error_message();
            n_checksum += rc != 0 && strstr(msg, "model.norm.weight': checksum mismatch") != NULL;
            n_nan += rc != 0 && strstr(msg, "model.norm.weight': element 3 is nan") != NULL;
            const int holds_nan = pass == 3 && u == norm_unit && lo <= norm->unit_offset + 3 &&
                                  norm->unit_offset + 3 < hi;
            const int verifies_norm = pass == 2 && u == norm_unit && norm_index % S == r;
            EXPECT((rc != 0) == (holds_nan || verifies_norm), "range pass %d unit %d S %d rank %d: rc %d (%s)",
                   pass, u, S, r, rc, msg);
            if (rc != 0) continue;
            int outside = 0, wrong = 0;
            for (size_t j = 0; j < n; j++) {
                if (j < lo || j >= hi) outside += part[j] != -1.0f;
                else whole[j] = part[j];
            }
            for (int i = 0; i < l->n_entries; i++) {   // inside: each entry's position, padding 0
                const param_entry *e = &l->entries[i];
                for (size_t j = 0; e->unit == u && j < e->numel; j++) {
                    const size_t x = e->unit_offset + j;
                    const int flipped = pass == 2 && e == norm && j == 0;   // another value: read as stored
                    if (x >= lo && x < hi && !flipped && part[x] != (float)(x % 200)) wrong++;
                }
            }
            EXPECT(outside == 0 && wrong == 0, "range pass %d unit %d S %d rank %d: %d touched outside, %d wrong",
                   pass, u, S, r, outside, wrong);
        }
        if (pass == 2 && u == norm_unit)
            EXPECT(n_checksum == 1, "range: the flipped tensor reported by %d of %d ranks", n_checksum, S);
        if (pass == 3 && u == norm_unit)
            EXPECT(n_nan == 1, "range: the NaN reported by %d of %d ranks", n_nan, S);
        if (pass == 0) {   // the union is the whole unit
            float full[4096];
            EXPECT(hf_checkpoint_read_unit(ck, l, u, full) == 0 &&
                       memcmp(full, whole, n * sizeof(float)) == 0,
                   "range: unit %d over %d ranges differs from hf_checkpoint_read_unit", u, S);
        }
    }
}

static void test_read_range(void) {
    char cdir[300], p[512];
    snprintf(cdir, sizeof cdir, "%s/range", dir);
    mkdir(cdir, 0755);
    snprintf(p, sizeof p, "%s/config.json", cdir);
    write_text(p, tiny_config);
    llama_config cfg;
    param_layout l;
    if (llama_config_load(&cfg, p) != 0 || param_layout_init(&l, &cfg, 1) != 0) { EXPECT(0, "range: setup"); return; }
    for (int pass = 0; pass < 4; pass++) {   // F32, BF16, F32 with a flipped byte, F32 with a NaN
        const st_dtype dt = pass == 1 ? ST_BF16 : ST_F32;
        if (write_positions(cdir, &l, dt, pass == 3) != 0) { EXPECT(0, "range: writing pass %d", pass); break; }
        long norm_off = -1;
        int norm_index = -1, norm_unit = -1;
        if (pass == 2) {   // flip bit 0 of model.norm.weight's second byte: a finite value still
            st_file f;
            snprintf(p, sizeof p, "%s/model.safetensors", cdir);
            if (st_open(&f, p) == 0) {
                const st_tensor *t = st_find(&f, "model.norm.weight");
                norm_off = t ? (long)((const unsigned char *)t->data - (const unsigned char *)f.map) : -1;
                st_close(&f);
            }
            EXPECT(norm_off > 0 && flip_bits(p, norm_off + 1, 0x01) == 0, "range: flipping a byte");
        }
        const param_entry *norm = param_layout_find(&l, "model.norm.weight");
        norm_unit = norm ? norm->unit : -1;
        for (int i = 0, k = 0; norm && i < l.n_entries; i++)   // its index among its unit's tensors
            if (l.entries[i].unit == norm_unit && (k++, &l.entries[i] == norm)) norm_index = k - 1;
        hf_checkpoint ck;
        ft_error_clear();
        if (hf_checkpoint_open(&ck, cdir) != 0 || hf_checkpoint_validate(&ck, &l) != 0) {
            EXPECT(0, "range pass %d: open: %s", pass, ft_error_message());
            continue;
        }
        for (int u = 0; u < l.n_units; u++) check_unit_ranges(&ck, &l, u, pass, norm, norm_index);
        hf_checkpoint_close(&ck);
    }
    param_layout_free(&l);
}

// ----------------------------------------------------------------------------
// content fingerprints

// The fingerprint of one file (FT_FNV_INIT continued), or 0 when it does not open.
static uint64_t file_fp(const char *path) {
    st_file f;
    if (st_open(&f, path) != 0) return 0;
    const uint64_t h = st_fingerprint(&f, FT_FNV_INIT);
    st_close(&f);
    return h;
}

// A file of one F32 tensor "w" of n elements, value i at i. Its data area starts at *data_off.
static int write_big(const char *path, size_t n, long *data_off) {
    float *x = malloc(n * sizeof *x);
    if (!x) return -1;
    for (size_t i = 0; i < n; i++) x[i] = (float)i;
    st_write_tensor t = {"w", ST_F32, 1, {(int64_t)n}, x};
    const char *meta[] = {"format", "pt", NULL};
    int rc = st_write(path, &t, 1, meta);
    free(x);
    st_file f;
    if (rc == 0 && (rc = st_open(&f, path)) == 0) {
        *data_off = (long)((const unsigned char *)f.tensors[0].data - (const unsigned char *)f.map);
        st_close(&f);
    }
    return rc;
}

static void test_fingerprint(void) {
    // 1 MiB of data: larger than the three samples, so something lies outside them
    const size_t n = 1 << 18, S = FT_FINGERPRINT_SAMPLE, data = n * sizeof(float);
    char a[256], b[256];
    snprintf(a, sizeof a, "%s/fp_a.safetensors", dir);
    snprintf(b, sizeof b, "%s/fp_b.safetensors", dir);
    long off = 0;
    ft_error_clear();
    if (write_big(a, n, &off) != 0 || write_big(b, n, &off) != 0) { EXPECT(0, "fingerprint setup: %s", ft_error_message()); return; }
    const uint64_t fa = file_fp(a);
    EXPECT(fa != 0 && fa == file_fp(b) && fa == file_fp(a), "the same bytes in two files: the same fingerprint");
    EXPECT(fa != FT_FNV_INIT, "the fingerprint hashes something");
    // one byte changed in each sample (start, middle, end of the data area), and in the header
    // (the metadata "pt" becomes "qt", still a valid file)
    size_t nb = 0;
    char *bytes = slurp(b, &nb);
    long in_header = 0;
    for (size_t i = 0; bytes && i + 4 <= nb && !in_header; i++)
        if (memcmp(bytes + i, "\"pt\"", 4) == 0) in_header = (long)i + 1;
    free(bytes);
    const long at[4] = {off + 5, off + (long)((data - S) / 2 + S / 2), off + (long)data - 3, in_header};
    const char *where[4] = {"first sample", "middle sample", "last sample", "header"};
    for (int k = 0; k < 4; k++) {
        uint64_t g = flip_byte(b, at[k]) == 0 ? file_fp(b) : 0;
        EXPECT(g != 0 && g != fa, "one byte changed in the %s: another fingerprint", where[k]);
        EXPECT(flip_byte(b, at[k]) == 0 && file_fp(b) == fa, "restored (%s): the same fingerprint again", where[k]);
    }
    // between the samples: not read (the documented limit of a sampled fingerprint)
    EXPECT(flip_byte(b, off + (long)S + 100) == 0 && file_fp(b) == fa, "a byte between the samples is not read");
    // tiny files: no data area at all, and a data area smaller than one sample (hashed whole)
    char c[256];
    snprintf(c, sizeof c, "%s/fp_empty.safetensors", dir);
    write_raw(c, "{}", -1, 0);
    const uint64_t fe = file_fp(c);
    EXPECT(fe != 0 && fe != fa, "an empty data area: fingerprint %016llx", (unsigned long long)fe);
    const char *h3b = "{\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}";
    write_raw(c, h3b, -1, 3);
    const uint64_t f3 = file_fp(c);
    const uint64_t g3 = flip_byte(c, 8 + (long)strlen(h3b) + 2) == 0 ? file_fp(c) : 0;
    EXPECT(f3 != 0 && g3 != 0 && g3 != f3, "a 3-byte data area is hashed whole");
    // directories: the same weights in another directory give the same value; a sharded set
    // hashes its files in name order (an index listing them in another order: the same value)
    char d1[256], d2[256], p[300];
    snprintf(d1, sizeof d1, "%s/fp_ck1", dir);
    snprintf(d2, sizeof d2, "%s/fp_ck2", dir);
    const ck_case sharded = {"sharded ok", D_NONE, 1, NULL}, single = {"single file ok", D_NONE, 0, NULL};
    uint64_t h1 = 0, h2 = 0, h3 = 0;
    int rc = make_checkpoint(d1, &sharded) | make_checkpoint(d2, &sharded);
    rc |= hf_checkpoint_fingerprint(d1, &h1) | hf_checkpoint_fingerprint(d2, &h2);
    EXPECT(rc == 0 && h1 == h2 && h1 != 0, "two copies of a sharded checkpoint: the same fingerprint (%s)", ft_error_message());
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", d2);   // its weight_map in reverse order
    json_t *idx = json_load_file(p, 0, NULL), *map = json_object_get(idx, "weight_map"), *rev = json_object();
    const char *keys[64];
    size_t nk = 0;
    const char *key;
    json_t *val;
    json_object_foreach(map, key, val) if (nk < 64) keys[nk++] = key;
    for (size_t i = nk; i-- > 0;) json_object_set(rev, keys[i], json_object_get(map, keys[i]));
    json_object_set_new(idx, "weight_map", rev);   // (jansson keeps insertion order)
    EXPECT(nk > 2 && json_dump_file(idx, p, 0) == 0, "index rewritten in reverse order");
    json_decref(idx);
    EXPECT(hf_checkpoint_fingerprint(d2, &h3) == 0 && h3 == h1, "the index's order does not matter: %s",
           ft_error_message());
    snprintf(p, sizeof p, "%s/fp_ck3", dir);
    EXPECT(make_checkpoint(p, &single) == 0 && hf_checkpoint_fingerprint(p, &h3) == 0 && h3 != h1,
           "the same weights in one file instead of two shards: another fingerprint (documented)");
    ft_error_clear();
    EXPECT(hf_checkpoint_fingerprint("/nonexistent_dir", &h3) != 0 && strstr(ft_error_message(), "/nonexistent_dir"),
           "a directory without weights: an error naming it (%s)", ft_error_message());
}

int main(void) {
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    test_reader_table();
    test_writer();
    test_writer_stream();
    test_checksum();
    test_checkpoint_table();
    test_read_range();
    test_fingerprint();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
    TEST_SUMMARY("test_safetensors");
}
