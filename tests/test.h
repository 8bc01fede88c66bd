// test.h: the two-macro test harness. Each test binary ends with TEST_SUMMARY(), which
// prints "<name>: N passed, N failed" and returns non-zero when anything failed.
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int t_passed __attribute__((unused)), t_failed __attribute__((unused));

// EXPECT(cond, printf-args...): count a pass, or print the location and message.
#define EXPECT(cond, ...) do { if (cond) t_passed++; else { t_failed++; \
    fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); \
    fputc('\n', stderr); } } while (0)

#define TEST_SUMMARY(name) do { printf("%s: %d passed, %d failed\n", name, t_passed, t_failed); \
    return t_failed ? 1 : 0; } while (0)

// ----------------------------------------------------------------------------
// deterministic test data: xorshift64 (Marsaglia 13/7/17). The state is the caller's (never 0),
// so every test keeps its own seed and the same sequence run after run. Not src/rng.h's
// splitmix64: that one is the trainer's (data order, sampling), these are the tests' inputs.

// Next 64 bits; advances *s.
static inline uint64_t test_rand(uint64_t *s) {
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
    return *s;
}
// 32 bits from the middle of the word.
static inline uint32_t test_rand_u32(uint64_t *s) { return (uint32_t)(test_rand(s) >> 16); }
// Approximately standard normal: Irwin-Hall, 12 uniforms of 24 bits minus 6 (|x| <= 6).
static inline float test_rand_normal(uint64_t *s) {
    float sum = 0;
    for (int i = 0; i < 12; i++) sum += (float)(test_rand_u32(s) & 0xffffff) / 16777216.0f;
    return sum - 6.0f;
}
// Uniform in [-1, 1) from the top 24 bits.
static inline float test_rand_pm1(uint64_t *s) {
    return (float)((test_rand(s) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

// ----------------------------------------------------------------------------
// comparisons

// Normalized mean squared error sum((a-b)^2) / sum(b^2), b the reference. Returns INFINITY
// if either side has a NaN/inf (checked first, as ggml does).
static inline double test_nmse(const float *a, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(ref[i])) return INFINITY;
        double d = (double)a[i] - (double)ref[i];
        num += d * d; den += (double)ref[i] * (double)ref[i];
    }
    return den > 0 ? num / den : num;
}

// ----------------------------------------------------------------------------
// packed games (--pack_attention per_game): tok (B, T) = 2 everywhere but a BOS (1) at each
// game start that `games` lists per batch row, rows separated by '|' (the last repeats; an
// empty row has no BOS: it starts mid-game), e.g. "0,5|9". model_segment_starts(tok, B, T, 1,
// seg) then gives the (B, T) segment starts the rope and attention ops take.
static inline void test_games_tokens(const char *games, int B, int T, int32_t *tok) {
    const char *row = games;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) tok[(size_t)b * T + t] = 2;
        const char *end = strchr(row, '|');
        for (const char *p = row; *p && p != end;) {
            char *next;
            const long t0 = strtol(p, &next, 10);
            if (next == p) break;
            if (t0 >= 0 && t0 < T) tok[(size_t)b * T + t0] = 1;
            p = *next == ',' ? next + 1 : next;
        }
        if (end) row = end + 1;
    }
}
