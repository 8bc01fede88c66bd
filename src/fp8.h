// fp8.h: the two 8-bit floating-point formats of FP8 training (--fp8) on the host: the
// reference the device kernels (kernels/fp8_quantize.cu) and the emulated cuBLASLt FP8 GEMM
// (tests/cuda_emu/cuda_emu_host.cpp) are checked against.
//
//   E4M3 (OCP "FN"): sign, 4 exponent bits (bias 7), 3 mantissa bits. No infinities; the
//     codes S.1111.111 (0x7F, 0xFF) are NaN, so the largest finite value is 0x7E = 448.
//     Subnormals: exponent field 0, value M/8 * 2^-6 (smallest 2^-9). Weights, activations.
//   E5M2: sign, 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like: exponent field 31 is
//     infinity (M = 0) or NaN. Largest finite 0x7B = 57344, smallest subnormal 2^-16.
//     Gradients (more range, less precision).
//
// Rounding is to nearest, ties to even (the mantissa's last bit 0), as the GPU's
// cvt.rn.*.f32 does.
#pragma once
#include <stdint.h>

typedef enum { FP8_E4M3 = 0, FP8_E5M2 = 1, FP8_FORMAT_COUNT } fp8_format;

// The largest finite value of a format (448 or 57344); 0 for an unknown format.
float fp8_max(fp8_format f);
// "e4m3" / "e5m2" ("?" for an unknown format).
const char *fp8_name(fp8_format f);
// The value of code `c` (exact in fp32): NaN for the NaN codes, +-inf for E5M2's infinities.
float fp8_to_float(uint8_t c, fp8_format f);
// x rounded to the nearest code, ties to even, by the format's own overflow rule: E4M3
// saturates (|x| beyond 448, infinities included, gives +-448), E5M2 follows IEEE (a value
// that rounds past 57344 gives +-inf, infinities stay infinite). NaN gives the NaN code 0x7F
// (0xFF with the sign set). -0.0 gives 0x80.
uint8_t fp8_from_float(float x, fp8_format f);
// The same with saturation to the largest finite value in both formats (infinities too),
// NaN still NaN: the conversion of scaled tensors (cvt.rn.satfinite on the GPU).
uint8_t fp8_from_float_sat(float x, fp8_format f);
// The per-tensor scale of FP8 quantisation from a tensor's amax (the largest |x|):
// fp8_max(f) / amax, so the largest value maps onto the format's largest; 1 when amax is 0,
// negative or not finite (nothing to scale, or a tensor the step will reject anyway). The
// device computes exactly this expression (kernels/fp8_quantize.cu).
float fp8_scale_from_amax(float amax, fp8_format f);
