// AdamW's second moment under bf16 RNE storage vs fp32: g ~ N(0, 1), 4096 elements
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static float bf16(float f) {   // round to nearest even
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}
static uint64_t h = 0x9e3779b97f4a7c15ull;
static float bf16_sr(float f) {   // stochastic rounding: add 16 random low bits, truncate
    uint32_t u; memcpy(&u, &f, 4); h ^= h << 13; h ^= h >> 7; h ^= h << 17;
    u = (u + (uint32_t)(h & 0xffff)) & 0xffff0000u; memcpy(&f, &u, 4); return f; }
static uint64_t s = 88172645463325252ull;
static double unif(void) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; return ((s >> 11) + 0.5) / 9007199254740992.0; }
static float gauss(void) { return (float)(sqrt(-2 * log(unif())) * cos(6.283185307179586 * unif())); }
int main(void) {
    enum { N = 4096 };
    static float v32[N], v16[N], vsr[N];
    const float b2 = 0.999f;
    const int marks[] = {10, 50, 136, 300, 500, 1000, 2000, 5000};
    for (int t = 1, k = 0; t <= 5000; t++) {
        for (int i = 0; i < N; i++) {
            float g = gauss();
            v32[i] = b2 * v32[i] + (1.0f - b2) * g * g;
            v16[i] = bf16(b2 * v16[i] + (1.0f - b2) * g * g);
            vsr[i] = bf16_sr(b2 * vsr[i] + (1.0f - b2) * g * g);
        }
        if (t == marks[k]) {
            double a = 0, b = 0, r = 0, c = 0, bc2 = 1 - pow(0.999, t);
            for (int i = 0; i < N; i++) a += v32[i], b += v16[i], c += vsr[i], r += sqrt(v32[i]) / sqrt(v16[i]);
            printf("| %d | %.4f | %.4f | %.3f | %.3f | %.3f |\n", t, a / N / bc2, b / N / bc2, b / a, r / N, c / a);
            k++;
        }
    }
    return 0;
}
