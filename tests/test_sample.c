// test_sample.c: the sampler's decoder (sample_vocab_load + sample_vocab_decode, src/sample.c)
// against Hugging Face `tokenizers`: tests/golden/decode/cases.json, written by
// tests/oracle/gen_decode_golden.py, holds id sequences and the text transformers' decode
// (skip_special_tokens=True) gives for them, with a byte-fallback decoder (CodeLlama's kind:
// "<0xHH>" pieces joined into UTF-8, U+FFFD per byte of an invalid run, a special token inside a
// run), without one ("<0xHH>" stays text), ids outside the vocabulary, and validation games of
// the bundled chess tokenizer (whose decoder strips one leading space, as the sampler's prompt
// does). Every decoded text must also be valid UTF-8 (jansson refuses anything else in
// samples.jsonl). A "<0x00>" piece makes its run U+FFFD (a NUL would cut the text short); a
// tokenizer.json that is not JSON is refused naming the file.
// Runtime: well under a second.
#include <jansson.h>
#include <unistd.h>

#include "common.h"
#include "sample.h"
#include "test.h"

#define GOLDEN_DIR "tests/golden/decode"
#define MAX_TOKENIZERS 4
#define VOCAB_N 4096   // ids past a tokenizer's vocabulary have no piece (dropped, like unknown ids)

typedef struct {
    const char *name;
    sample_vocab v;
} loaded;

static sample_vocab *vocab_for(loaded *tab, int *n, const char *name) {
    for (int i = 0; i < *n; i++)
        if (strcmp(tab[i].name, name) == 0) return &tab[i].v;
    if (*n == MAX_TOKENIZERS) return NULL;
    char path[FT_PATH_MAX];
    if (ft_path(path, sizeof path, "%s/%s", GOLDEN_DIR, name) != 0) return NULL;
    if (sample_vocab_load(&tab[*n].v, path, VOCAB_N) != 0) return NULL;
    tab[*n].name = name;
    return &tab[(*n)++].v;
}

int main(void) {
    json_error_t jerr;
    json_t *root = json_load_file(GOLDEN_DIR "/cases.json", 0, &jerr);
    EXPECT(root != NULL, "%s/cases.json: %s", GOLDEN_DIR, jerr.text);
    if (!root) TEST_SUMMARY("test_sample");
    json_t *cases = json_object_get(root, "cases");
    EXPECT(json_array_size(cases) >= 400, "cases.json holds %zu cases", json_array_size(cases));
    loaded tab[MAX_TOKENIZERS];
    int n_tab = 0, n_joined = 0, n_fffd = 0;
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *tname = json_string_value(json_object_get(c, "tokenizer"));
        const char *want = json_string_value(json_object_get(c, "text"));
        json_t *jids = json_object_get(c, "ids");
        sample_vocab *v = tname ? vocab_for(tab, &n_tab, tname) : NULL;
        EXPECT(v && want && json_is_array(jids), "case %zu: tokenizer '%s' not loaded (%s)", i, tname ? tname : "?",
               ft_error_message());
        if (!v || !want || !json_is_array(jids)) continue;
        int32_t ids[64];
        const int n = (int)json_array_size(jids);
        EXPECT(n <= 64, "case %zu: %d ids, more than this test's 64", i, n);
        if (n > 64) continue;
        for (int t = 0; t < n; t++) ids[t] = (int32_t)json_integer_value(json_array_get(jids, (size_t)t));
        char *got = NULL;
        EXPECT(sample_vocab_decode(v, ids, n, &got) == 0, "case %zu: decode failed", i);
        if (!got) continue;
        const char *cmp = got + (json_is_true(json_object_get(c, "strips_leading_space")) && got[0] == ' ');
        EXPECT(strcmp(cmp, want) == 0, "case %zu (%s): decoded '%s', transformers '%s'", i, tname, cmp, want);
        json_t *js = json_string(got);   // NULL for invalid UTF-8
        EXPECT(js != NULL, "case %zu: the decoded text is not valid UTF-8", i);
        json_decref(js);
        if (strcmp(tname, "bytes.json") == 0) {   // byte pieces that became text: é, €, an emoji, '\n', 'A'
            static const char *joined[] = {"\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80", "\n", "A"};
            int any = 0;
            for (size_t k = 0; k < sizeof joined / sizeof *joined; k++) any |= strstr(want, joined[k]) != NULL;
            n_joined += any;
            n_fffd += strstr(want, "\xEF\xBF\xBD") != NULL;
        }
        free(got);
    }
    // the table covers what it claims: joined bytes and replaced ones both occur
    EXPECT(n_joined >= 10 && n_fffd >= 50, "%d cases with joined bytes, %d with U+FFFD", n_joined, n_fffd);
    for (int k = 0; k < n_tab; k++) sample_vocab_free(&tab[k].v);
    json_decref(root);

    // a "<0x00>" piece (CodeLlama's id 3): its run counts as invalid, U+FFFD per byte, rather
    // than a NUL cutting the text short (transformers would keep the NUL; the golden cases
    // leave byte 0 out)
    char path[] = "/tmp/test_sample_XXXXXX";
    int fd = mkstemp(path);
    static const char nul_tok[] = "{\"model\":{\"vocab\":{\"a\":0,\"<0x00>\":1,\"<0x41>\":2}},"
                                  "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"ByteFallback\"}]}}";
    EXPECT(fd >= 0 && write(fd, nul_tok, sizeof nul_tok - 1) == (ssize_t)(sizeof nul_tok - 1), "temp file");
    if (fd >= 0) close(fd);
    sample_vocab v;
    char *got = NULL;
    const int32_t nul_ids[] = {0, 1, 2, 0};
    EXPECT(sample_vocab_load(&v, path, 3) == 0 && sample_vocab_decode(&v, nul_ids, 4, &got) == 0 && got &&
               strcmp(got, "a\xEF\xBF\xBD\xEF\xBF\xBD" "a") == 0,
           "<0x00> <0x41>: '%s' (%s)", got ? got : "?", ft_error_message());
    free(got);
    sample_vocab_free(&v);
    unlink(path);

    // a tokenizer.json that is not JSON: one error naming the file
    char broken[] = "/tmp/test_sample_XXXXXX";
    fd = mkstemp(broken);
    EXPECT(fd >= 0 && write(fd, "{\"model\":", 9) == 9, "temp file");
    if (fd >= 0) close(fd);
    EXPECT(sample_vocab_load(&v, broken, 16) != 0 && strstr(ft_error_message(), broken), "broken tokenizer.json: '%s'",
           ft_error_message());
    unlink(broken);
    TEST_SUMMARY("test_sample");
}
