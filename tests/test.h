// test.h: the two-macro test harness. Each test binary ends with TEST_SUMMARY(), which
// prints "<name>: N passed, N failed" and returns non-zero when anything failed.
#pragma once
#include <math.h>
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
