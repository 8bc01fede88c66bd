// test_fp8.c: the host FP8 formats (src/fp8.c).
//   1. a table of codes and their values (both formats: zero, subnormals, normals, the
//      largest, infinities and NaN), each decoded and encoded back
//   2. all 256 codes of each format: decode, then encode gives the same code (every finite
//      value and infinity round-trips; NaN codes give NaN), values increase with the code
//   3. rounding: every midpoint between neighbouring codes goes to the even code, a float
//      step either side of it to the nearer code; overflow and underflow by each rule
#include <float.h>
#include <math.h>
#include <stdint.h>

#include "fp8.h"
#include "test.h"

typedef struct { fp8_format f; uint8_t code; float value; } code_case;

static const code_case CODES[] = {
    {FP8_E4M3, 0x00, 0.0f},          {FP8_E4M3, 0x80, -0.0f},
    {FP8_E4M3, 0x01, 0x1p-9f},       {FP8_E4M3, 0x07, 7 * 0x1p-9f},   // subnormals
    {FP8_E4M3, 0x08, 0x1p-6f},       {FP8_E4M3, 0x38, 1.0f},          // smallest normal, one
    {FP8_E4M3, 0x39, 1.125f},        {FP8_E4M3, 0xC0, -2.0f},
    {FP8_E4M3, 0x7E, 448.0f},        {FP8_E4M3, 0xFE, -448.0f},       // the largest finite
    {FP8_E4M3, 0x77, 240.0f},        {FP8_E4M3, 0x78, 256.0f},
    {FP8_E5M2, 0x00, 0.0f},          {FP8_E5M2, 0x01, 0x1p-16f},
    {FP8_E5M2, 0x03, 3 * 0x1p-16f},  {FP8_E5M2, 0x04, 0x1p-14f},
    {FP8_E5M2, 0x3C, 1.0f},          {FP8_E5M2, 0x3D, 1.25f},
    {FP8_E5M2, 0x7B, 57344.0f},      {FP8_E5M2, 0xFB, -57344.0f},
    {FP8_E5M2, 0x7C, INFINITY},      {FP8_E5M2, 0xFC, -INFINITY},
};

static int same_float(float a, float b) {
    return (isnan(a) && isnan(b)) || (a == b && signbit(a) == signbit(b));
}

static void test_table(void) {
    for (size_t i = 0; i < sizeof CODES / sizeof CODES[0]; i++) {
        const code_case *c = &CODES[i];
        const float v = fp8_to_float(c->code, c->f);
        EXPECT(same_float(v, c->value), "%s 0x%02X decodes to %g, want %g", fp8_name(c->f), c->code, v, c->value);
        EXPECT(fp8_from_float(c->value, c->f) == c->code, "%s %g encodes to 0x%02X, want 0x%02X", fp8_name(c->f),
               c->value, fp8_from_float(c->value, c->f), c->code);
    }
    EXPECT(fp8_max(FP8_E4M3) == 448.0f && fp8_max(FP8_E5M2) == 57344.0f, "largest finite values");
    // the NaN codes
    EXPECT(isnan(fp8_to_float(0x7F, FP8_E4M3)) && isnan(fp8_to_float(0xFF, FP8_E4M3)), "e4m3 NaN codes");
    for (int c = 0x7D; c <= 0x7F; c++) EXPECT(isnan(fp8_to_float((uint8_t)c, FP8_E5M2)), "e5m2 0x%02X is NaN", c);
    EXPECT((fp8_from_float(NAN, FP8_E4M3) & 0x7F) == 0x7F, "NaN to e4m3");
    EXPECT(isnan(fp8_to_float(fp8_from_float(NAN, FP8_E5M2), FP8_E5M2)), "NaN to e5m2");
    EXPECT(isnan(fp8_to_float(fp8_from_float_sat(-NAN, FP8_E5M2), FP8_E5M2)), "NaN to e5m2 (saturating)");
}

static int is_nan_code(uint8_t c, fp8_format f) { return isnan(fp8_to_float(c, f)); }

static void test_all_codes(fp8_format f) {
    int nan = 0;
    float prev = -INFINITY;
    for (int c = 0; c < 256; c++) {
        const float v = fp8_to_float((uint8_t)c, f);
        if (isnan(v)) { nan++; continue; }
        EXPECT(fp8_from_float(v, f) == c, "%s 0x%02X (%g) re-encodes to 0x%02X", fp8_name(f), c, v, fp8_from_float(v, f));
        if (isfinite(v))
            EXPECT(fp8_from_float_sat(v, f) == c, "%s 0x%02X (%g) saturating re-encode", fp8_name(f), c, v);
    }
    EXPECT(nan == (f == FP8_E4M3 ? 2 : 6), "%s has %d NaN codes", fp8_name(f), nan);
    // positive codes in order give increasing values
    for (int c = 0; c < 0x80; c++) {
        if (is_nan_code((uint8_t)c, f)) continue;
        const float v = fp8_to_float((uint8_t)c, f);
        EXPECT(v > prev || c == 0, "%s 0x%02X (%g) not above the previous code (%g)", fp8_name(f), c, v, prev);
        prev = v;
    }
}

// midpoints of neighbouring positive finite codes c, c + 1: ties to the even code; one float
// step below / above: the lower / upper code (and the same mirrored for negatives)
static void test_ties(fp8_format f) {
    for (int c = 0; c + 1 < 0x80; c++) {
        const float lo = fp8_to_float((uint8_t)c, f), hi = fp8_to_float((uint8_t)(c + 1), f);
        if (!isfinite(lo) || !isfinite(hi)) continue;
        const float mid = (lo + hi) / 2;   // exact: fp8 values have 4 significant bits at most
        const uint8_t even = (uint8_t)(c % 2 == 0 ? c : c + 1);
        EXPECT(fp8_from_float(mid, f) == even, "%s tie %g -> 0x%02X, want 0x%02X", fp8_name(f), mid,
               fp8_from_float(mid, f), even);
        EXPECT(fp8_from_float(-mid, f) == (0x80 | even), "%s tie %g (negative)", fp8_name(f), -mid);
        EXPECT(fp8_from_float(nextafterf(mid, 0.0f), f) == c, "%s below the tie %g", fp8_name(f), mid);
        EXPECT(fp8_from_float(nextafterf(mid, INFINITY), f) == c + 1, "%s above the tie %g", fp8_name(f), mid);
    }
}

static void test_range(void) {
    // E4M3 saturates: above 448, at the would-be next code's midpoint (464), far beyond, inf
    const float e4[] = {449.0f, 464.0f, 480.0f, 1e30f, INFINITY};
    for (size_t i = 0; i < sizeof e4 / sizeof e4[0]; i++) {
        EXPECT(fp8_from_float(e4[i], FP8_E4M3) == 0x7E, "e4m3 %g saturates", e4[i]);
        EXPECT(fp8_from_float(-e4[i], FP8_E4M3) == 0xFE, "e4m3 %g saturates", -e4[i]);
    }
    // E5M2, IEEE: below the midpoint to 2^16 stays 57344; the midpoint (61440) rounds to even: inf
    EXPECT(fp8_from_float(61439.0f, FP8_E5M2) == 0x7B, "e5m2 61439");
    EXPECT(fp8_from_float(61440.0f, FP8_E5M2) == 0x7C, "e5m2 61440 overflows to inf");
    EXPECT(fp8_from_float(-1e30f, FP8_E5M2) == 0xFC, "e5m2 -1e30 overflows to -inf");
    EXPECT(fp8_from_float_sat(61440.0f, FP8_E5M2) == 0x7B, "e5m2 61440 saturating");
    EXPECT(fp8_from_float_sat(-INFINITY, FP8_E5M2) == 0xFB, "e5m2 -inf saturating");
    EXPECT(fp8_from_float_sat(INFINITY, FP8_E4M3) == 0x7E, "e4m3 inf saturating");
    // underflow: half the smallest subnormal is a tie to zero (even), just above it rounds up
    EXPECT(fp8_from_float(0x1p-10f, FP8_E4M3) == 0x00, "e4m3 2^-10 -> 0");
    EXPECT(fp8_from_float(nextafterf(0x1p-10f, 1.0f), FP8_E4M3) == 0x01, "e4m3 just above 2^-10");
    EXPECT(fp8_from_float(-0x1p-17f, FP8_E5M2) == 0x80, "e5m2 -2^-17 -> -0");
    EXPECT(fp8_from_float(1e-30f, FP8_E5M2) == 0x00, "e5m2 1e-30 -> 0");
    // a subnormal that rounds up into the smallest normal
    EXPECT(fp8_from_float(15 * 0x1p-10f, FP8_E4M3) == 0x08, "e4m3 7.5 * 2^-9 -> 2^-6");
}

static void test_scale(void) {
    EXPECT(fp8_scale_from_amax(448.0f, FP8_E4M3) == 1.0f, "scale at amax 448");
    EXPECT(fp8_scale_from_amax(2.0f, FP8_E4M3) == 224.0f, "scale at amax 2");
    EXPECT(fp8_scale_from_amax(0.5f, FP8_E5M2) == 114688.0f, "e5m2 scale at amax 0.5");
    EXPECT(fp8_scale_from_amax(0.0f, FP8_E4M3) == 1.0f, "amax 0");
    EXPECT(fp8_scale_from_amax(INFINITY, FP8_E4M3) == 1.0f, "amax inf");
    EXPECT(fp8_scale_from_amax(NAN, FP8_E5M2) == 1.0f, "amax NaN");
    // a tiny amax: the format's max / amax overflows fp32; the scale stays finite (FLT_MAX) and
    // the largest value still lands within the format (amax x FLT_MAX < 448)
    EXPECT(fp8_scale_from_amax(1e-37f, FP8_E4M3) == FLT_MAX, "e4m3 scale at amax 1e-37 clamped to FLT_MAX");
    EXPECT(fp8_scale_from_amax(1e-36f, FP8_E5M2) == FLT_MAX, "e5m2 scale at amax 1e-36 clamped to FLT_MAX");
    EXPECT(fp8_from_float(1e-37f * FLT_MAX, FP8_E4M3) != 0 && fp8_to_float(fp8_from_float(1e-37f * FLT_MAX, FP8_E4M3), FP8_E4M3) <= 448.0f,
           "amax x clamped scale is a finite nonzero e4m3 code");
}

int main(void) {
    test_table();
    for (int f = 0; f < FP8_FORMAT_COUNT; f++) {
        test_all_codes((fp8_format)f);
        test_ties((fp8_format)f);
    }
    test_range();
    test_scale();
    TEST_SUMMARY("test_fp8");
}
