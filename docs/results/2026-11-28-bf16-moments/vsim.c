// AdamW's second moment stored in bf16 vs fp32, 4096 elements, beta2 0.999: round to nearest
// even (RNE) against the optimizer's stochastic rounding (SR, src/bf16_sr.h: the bits of
// (seed, step, moment, element index)). Gradients g ~ N(0, s^2): s = 1 throughout, or with
// the argument `drop`, s = 1 until step 2000 and s = 0.1 after it (v must follow g^2 down).
// Build from this directory: gcc -O2 -I../../../src vsim.c -lm && ./a.out [drop]
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bf16_sr.h"
static float bits_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t f_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bf16(float f) {   // round to nearest even
    uint32_t u = f_bits(f);
    return bits_f((u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000u);
}
static float bf16_sr(float f, uint32_t key, uint64_t i) {
    return bits_f((uint32_t)ft_f32_to_bf16_sr(f_bits(f), ft_sr_bits(key, i)) << 16);
}
static uint64_t s = 88172645463325252ull;
static double unif(void) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; return ((s >> 11) + 0.5) / 9007199254740992.0; }
static float gauss(void) { return (float)(sqrt(-2 * log(unif())) * cos(6.283185307179586 * unif())); }
int main(int argc, char **argv) {
    enum { N = 4096 };
    static float v32[N], v16[N], vsr[N];
    const float b2 = 0.999f;
    const int drop = argc > 1 && strcmp(argv[1], "drop") == 0;
    const int marks[] = {10, 136, 300, 500, 1000, 2000, 2500, 3000, 5000};
    printf("| step | v fp32 | RNE / fp32 | step size RNE / fp32 | SR / fp32 | step size SR / fp32 |\n");
    for (int t = 1, k = 0; t <= 5000; t++) {
        const float sc = drop && t > 2000 ? 0.1f : 1.0f;
        const uint32_t key = ft_sr_key(1234, (uint32_t)t, 1);
        for (int i = 0; i < N; i++) {
            float g = gauss() * sc;
            v32[i] = b2 * v32[i] + (1.0f - b2) * g * g;
            v16[i] = bf16(b2 * v16[i] + (1.0f - b2) * g * g);
            vsr[i] = bf16_sr(b2 * vsr[i] + (1.0f - b2) * g * g, key, (uint64_t)i);
        }
        if (t == marks[k]) {
            double a = 0, b = 0, c = 0, r = 0, q = 0, bc2 = 1 - pow(0.999, t);
            for (int i = 0; i < N; i++) {
                a += v32[i], b += v16[i], c += vsr[i];
                r += sqrt(v32[i]) / sqrt(v16[i]), q += sqrt(v32[i]) / sqrt(vsr[i]);
            }
            printf("| %d | %.4f | %.3f | %.3f | %.3f | %.3f |\n", t, a / N / bc2, b / a, r / N, c / a, q / N);
            k++;
        }
    }
    return 0;
}
