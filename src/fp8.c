// fp8.c: FP8 E4M3 / E5M2 conversions on the host (see fp8.h).
#include "fp8.h"

#include <float.h>
#include <math.h>

// a format's fields: mantissa bits, exponent bias, the largest finite code (positive)
typedef struct { int mbits, bias; uint8_t max_code; } fp8_spec;
static const fp8_spec SPECS[FP8_FORMAT_COUNT] = {
    [FP8_E4M3] = {3, 7, 0x7E},
    [FP8_E5M2] = {2, 15, 0x7B},
};
#define FP8_NAN 0x7Fu
#define FP8_E5M2_INF 0x7Cu

float fp8_max(fp8_format f) { return f < FP8_FORMAT_COUNT ? fp8_to_float(SPECS[f].max_code, f) : 0.0f; }
const char *fp8_name(fp8_format f) { return f == FP8_E4M3 ? "e4m3" : f == FP8_E5M2 ? "e5m2" : "?"; }

float fp8_to_float(uint8_t c, fp8_format f) {
    if (f >= FP8_FORMAT_COUNT) return NAN;
    const fp8_spec *s = &SPECS[f];
    const int ebits = 7 - s->mbits, e = (c & 0x7F) >> s->mbits, m = c & ((1 << s->mbits) - 1);
    const float sign = c & 0x80 ? -1.0f : 1.0f;
    if (f == FP8_E4M3 && e == (1 << ebits) - 1 && m == (1 << s->mbits) - 1) return NAN;
    if (f == FP8_E5M2 && e == (1 << ebits) - 1) return m ? NAN : sign * INFINITY;
    if (e == 0) return sign * ldexpf((float)m, 1 - s->bias - s->mbits);   // subnormal (and zero)
    return sign * ldexpf((float)((1 << s->mbits) + m), e - s->bias - s->mbits);
}

// |x| (finite, >= 0) rounded to the format's grid, ties to even, with unbounded exponent
// range above: the result may exceed the largest finite value (the callers' overflow rule)
static float round_to_grid(float a, const fp8_spec *s) {
    const int emin = 1 - s->bias;   // exponent of the smallest normal
    int e2;
    frexpf(a, &e2);                 // a = f 2^e2, f in [0.5, 1): floor(log2 a) = e2 - 1
    const int e = a == 0.0f || e2 - 1 < emin ? emin : e2 - 1;
    const int q = e - s->mbits;     // the spacing of codes in a's binade is 2^q
    return ldexpf(rintf(ldexpf(a, -q)), q);   // scaling by powers of two is exact; rintf: ties to even
}

// the code of a grid value a (>= 0, at most the largest finite)
static uint8_t grid_code(float a, const fp8_spec *s) {
    const float min_normal = ldexpf(1.0f, 1 - s->bias);
    if (a < min_normal) return (uint8_t)ldexpf(a, s->bias - 1 + s->mbits);   // subnormal: M
    int e2;
    const float f = frexpf(a, &e2);   // a = f 2^e2, the biased exponent is e2 - 1 + bias
    const int m = (int)ldexpf(f, s->mbits + 1) - (1 << s->mbits);
    return (uint8_t)(((e2 - 1 + s->bias) << s->mbits) | m);
}

// The conversion, saturating (sat) or by the format's own rule (fp8.h)
static uint8_t from_float(float x, fp8_format f, int sat) {
    if (f >= FP8_FORMAT_COUNT || isnan(x)) return signbit(x) ? 0x80u | FP8_NAN : FP8_NAN;
    const fp8_spec *s = &SPECS[f];
    const uint8_t sign = signbit(x) ? 0x80u : 0u;
    const float a = fabsf(x), max = fp8_to_float(s->max_code, f);
    const float r = isinf(a) ? INFINITY : round_to_grid(a, s);
    if (r > max) return sign | (f == FP8_E5M2 && !sat ? FP8_E5M2_INF : s->max_code);
    return sign | grid_code(r, s);
}

uint8_t fp8_from_float(float x, fp8_format f) { return from_float(x, f, 0); }
uint8_t fp8_from_float_sat(float x, fp8_format f) { return from_float(x, f, 1); }

float fp8_scale_from_amax(float amax, fp8_format f) {
    // (a tiny amax, below the format's max / FLT_MAX, would make the scale inf: clamped)
    return amax > 0.0f && isfinite(amax) ? fminf(fp8_max(f) / amax, FLT_MAX) : 1.0f;
}
