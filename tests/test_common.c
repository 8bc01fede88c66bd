// test_common.c: the error record, checked path formatting and SHA-256 of src/common.c.
//   ft_path: a path that fits is written whole; one byte too long is -1 with one
//   "path too long" line naming the path's start, and the message of an earlier error wins.
//   ft_sha256: FIPS 180-2's examples (one block, two blocks, a million 'a') and the empty
//   message, each fed whole and in pieces of 1, 7, 63 and 65 bytes (the block boundary
//   from both sides); a file's digest against the one scripts/tokenize_shards.py (hashlib)
//   recorded in data/chess/shards.json for data/model/tokenizer.json; a missing file is -1.
//   ft_getenv: a name of the environment table gives its value (NULL when unset); a name not
//   in it, or one only the test tools read, gives NULL although it is set, with one "internal
//   error" line on stderr naming it.
// Runtime: well under a second.
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common.h"
#include "test.h"

static void hex_of(const unsigned char d[32], char hex[65]) {
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
}

static void test_sha256(void) {
    static const struct { const char *what; size_t repeat; const char *digest; } cases[] = {
        {"", 1, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", 1, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 1,
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"a", 1000000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"},
    };
    static const size_t pieces[] = {0, 1, 7, 63, 65};   // 0: the whole message in one update
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const size_t len = strlen(cases[i].what), n = len * cases[i].repeat;
        unsigned char *msg = malloc(n + 1);
        for (size_t r = 0; r < cases[i].repeat; r++) memcpy(msg + r * len, cases[i].what, len);
        for (size_t k = 0; k < sizeof pieces / sizeof pieces[0]; k++) {
            ft_sha256_ctx c;
            ft_sha256_init(&c);
            const size_t step = pieces[k] ? pieces[k] : n + 1;
            for (size_t at = 0; at < n; at += step) ft_sha256_update(&c, msg + at, n - at < step ? n - at : step);
            unsigned char d[32];
            char hex[65];
            ft_sha256_final(&c, d);
            hex_of(d, hex);
            EXPECT(!strcmp(hex, cases[i].digest), "sha256 of %zu bytes ('%.8s'...) in pieces of %zu: %s, want %s", n,
                   cases[i].what, pieces[k], hex, cases[i].digest);
        }
        free(msg);
    }
    char hex[65];
    EXPECT(ft_sha256_file_hex("data/model/tokenizer.json", hex) == 0, "%s", ft_error_message());
    FILE *f = fopen("data/chess/shards.json", "r");
    char text[1 << 16] = "";
    size_t got = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f) fclose(f);
    text[got] = '\0';
    EXPECT(strstr(text, "\"tokenizer_sha256\": \"") && strstr(text, hex),
           "data/model/tokenizer.json: sha256 %s is not the tokenizer_sha256 data/chess/shards.json records", hex);
    ft_error_clear();
    EXPECT(ft_sha256_file_hex("data/model/no-such-file", hex) == -1 && strstr(ft_error_message(), "no-such-file"),
           "a missing file: -1 naming it ('%s')", ft_error_message());
    ft_error_clear();
}

// ft_getenv(name) with stderr captured into err (n bytes): its result.
static const char *getenv_captured(const char *name, char *err, size_t n) {
    fflush(stderr);
    const int saved = dup(2);
    FILE *f = tmpfile();
    if (saved < 0 || !f) return "(cannot capture stderr)";
    dup2(fileno(f), 2);
    const char *v = ft_getenv(name);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(f);
    const size_t got = fread(err, 1, n - 1, f);
    err[got] = '\0';
    fclose(f);
    return v;
}

static void test_getenv(void) {
    char err[512];
    setenv("FT_TEST_HOST", "node-7", 1);
    const char *v = getenv_captured("FT_TEST_HOST", err, sizeof err);
    EXPECT(v && !strcmp(v, "node-7") && !err[0], "a listed variable: its value ('%s'), nothing on stderr ('%s')",
           v ? v : "(null)", err);
    unsetenv("FT_TEST_HOST");
    v = getenv_captured("FT_TEST_HOST", err, sizeof err);
    EXPECT(!v && !err[0], "a listed variable unset: NULL, nothing on stderr ('%s')", err);
    static const char *refused[] = {"FT_NOT_IN_THE_TABLE", "FT_EMU_DEVICES"};   // (the second: the emulator's)
    for (int i = 0; i < 2; i++) {
        setenv(refused[i], "1", 1);
        v = getenv_captured(refused[i], err, sizeof err);
        const int one_line = err[0] && strchr(err, '\n') == err + strlen(err) - 1;
        EXPECT(!v && strstr(err, "internal error") && strstr(err, refused[i]) && one_line,
               "%s, set but not finetune's: NULL and one line naming it (got %s, '%s')", refused[i], v ? v : "(null)",
               err);
        unsetenv(refused[i]);
    }
}

int main(void) {
    char buf[16];
    ft_error_clear();
    EXPECT(ft_path(buf, sizeof buf, "%s/%s", "dir", "name") == 0 && !strcmp(buf, "dir/name"),
           "ft_path of a short path: got '%s'", buf);
    EXPECT(ft_path(buf, sizeof buf, "%s/%s", "0123456", "0123456") == 0 && strlen(buf) == 15,
           "15 characters fit a 16-byte buffer: got '%s'", buf);
    EXPECT(!ft_error_message()[0], "no error recorded for paths that fit: %s", ft_error_message());

    EXPECT(ft_path(buf, sizeof buf, "%s/%s", "0123456", "01234567") == -1, "16 characters in 16 bytes: -1");
    const char *m = ft_error_message();
    EXPECT(strstr(m, "path too long") && strstr(m, "16 bytes") && strstr(m, "0123456/") && !strchr(m, '\n'),
           "one line naming the problem, the length and the path's start: '%s'", m);

    ft_error_clear();
    ft_error("first");
    EXPECT(ft_path(buf, sizeof buf, "%s", "a path much longer than sixteen bytes") == -1 &&
               !strcmp(ft_error_message(), "first"),
           "the first error wins: '%s'", ft_error_message());
    ft_error_clear();
    test_sha256();
    test_getenv();
    TEST_SUMMARY("test_common");
}
