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
// The next-token distribution (sample_probs) against transformers' own warpers:
// tests/golden/sample/cases.json (tests/oracle/gen_sample_golden.py) holds logits, a
// temperature (0 = greedy), top-k and top-p, and the ids and probabilities generate(do_sample)
// draws from; sample_draw against a table, and draws against the probabilities they follow.
// Runtime: well under a second.
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "common.h"
#include "rng.h"
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

// ----------------------------------------------------------------------------
// the next-token distribution

// Probabilities: transformers computes the softmax in float32, we in double. Over 2048 ids a
// float32 sum carries a relative error of a few 1e-7 (one ulp 6e-8 per addition, pairwise
// sums), so each probability (<= 1) differs by well under 1e-6 absolute. A kept id's
// probability may be 0 in float32 where ours is not: exp below 2^-149 underflows there
// (temperature 0.05: logits 8 apart); we accept such an id when ours is below 1e-30.
#define PROB_TOL 1e-6
#define UNDERFLOW 1e-30

static void test_probs(void) {
    json_error_t jerr;
    json_t *root = json_load_file("tests/golden/sample/cases.json", 0, &jerr);
    EXPECT(root != NULL, "tests/golden/sample/cases.json: %s", jerr.text);
    json_t *cases = json_object_get(root, "cases");
    EXPECT(json_array_size(cases) >= 100, "sample cases.json holds %zu cases", json_array_size(cases));
    size_t i;
    json_t *c;
    int n_filtered = 0;
    double worst = 0;
    json_array_foreach(cases, i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        const int V = (int)json_integer_value(json_object_get(c, "V"));
        json_t *jl = json_object_get(c, "logits"), *jk = json_object_get(c, "kept"), *jp = json_object_get(c, "probs");
        const int ok = name && V >= 1 && (int)json_array_size(jl) == V && json_array_size(jk) == json_array_size(jp);
        EXPECT(ok, "sample case %zu malformed", i);
        if (!ok) continue;
        const sample_params p = {json_number_value(json_object_get(c, "temperature")),
                                 (int)json_integer_value(json_object_get(c, "top_k")),
                                 json_number_value(json_object_get(c, "top_p"))};
        float *logits = malloc((size_t)V * sizeof *logits);
        double *ref = calloc((size_t)V, sizeof *ref), *got = malloc((size_t)V * sizeof *got);
        sample_rank *order = malloc((size_t)V * sizeof *order);
        for (int v = 0; v < V; v++) logits[v] = (float)json_number_value(json_array_get(jl, (size_t)v));
        for (size_t k = 0; k < json_array_size(jk); k++)
            ref[json_integer_value(json_array_get(jk, k))] = json_number_value(json_array_get(jp, k));
        const int kept = sample_probs(logits, V, &p, order, got);
        int n_got = 0, bad = 0;
        for (int v = 0; v < V; v++) {
            n_got += got[v] > 0;
            const double d = fabs(got[v] - ref[v]);
            worst = d > worst ? d : worst;
            const int same_set = (got[v] > 0) == (ref[v] > 0) || (ref[v] == 0 && got[v] < UNDERFLOW);
            if (!bad && (d > PROB_TOL || !same_set)) {
                bad = 1;
                EXPECT(0, "%s: id %d: probability %.9g, transformers %.9g", name, v, got[v], ref[v]);
            }
        }
        EXPECT(kept == n_got, "%s: returned %d kept ids, %d have a probability", name, kept, n_got);
        n_filtered += (int)json_array_size(jk) < V;
        free(logits); free(ref); free(got); free(order);
    }
    EXPECT(n_filtered >= 50, "only %d cases filter any id", n_filtered);   // the table tests filtering
    printf("  sample_probs: %zu cases (%d filter), worst |p - transformers| %.1e\n", json_array_size(cases),
           n_filtered, worst);
    json_decref(root);
}

// sample_draw: the first id whose cumulative probability passes u x sum, never one of
// probability 0; and 200000 seeded draws from a top-k distribution follow it (5 sigma of a
// binomial frequency: sqrt(p (1 - p) / n) <= 1.2e-3, so 6e-3)
static void test_draw(void) {
    static const struct { double probs[4], u; int want; } dc[] = {
        {{0, 0.5, 0, 0.5}, 0, 1},       {{0, 0.5, 0, 0.5}, 0.49, 1}, {{0, 0.5, 0, 0.5}, 0.5, 3},
        {{0, 0.5, 0, 0.5}, 0.999999, 3}, {{0, 0, 1, 0}, 0, 2},        {{0, 0, 1, 0}, 0.9999999, 2},
        {{0.25, 0.25, 0.25, 0.25}, 0.74, 2}, {{2, 0, 0, 2}, 0.5, 3},  {{0.1, 0.2, 0.3, 0}, 0.9999999999, 2}};
    for (size_t i = 0; i < sizeof dc / sizeof dc[0]; i++) {
        const int got = sample_draw(dc[i].probs, 4, dc[i].u);
        EXPECT(got == dc[i].want, "sample_draw case %zu (u %g): id %d, expected %d", i, dc[i].u, got, dc[i].want);
    }
    enum { V = 9, N = 200000 };
    const float logits[V] = {0.5f, 2, -1, 1.5f, 0, 1, -3, 1.75f, 0.25f};
    const sample_params p = {0.9, 4, 1};
    sample_rank order[V];
    double probs[V];
    EXPECT(sample_probs(logits, V, &p, order, probs) == 4, "top-k 4 of 9");
    int count[V] = {0};
    uint64_t rng = 42;
    for (int n = 0; n < N; n++) count[sample_draw(probs, V, rng_uniform(&rng))]++;
    for (int v = 0; v < V; v++)
        EXPECT(fabs((double)count[v] / N - probs[v]) < 6e-3, "id %d drawn %.4f of the time, probability %.4f", v,
               (double)count[v] / N, probs[v]);
}

int main(void) {
    test_probs();
    test_draw();
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
