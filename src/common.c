// common.c: the error record, checked allocation, checked paths and fp16 conversion (see common.h).
#include "common.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// error record (one per thread; the first error wins)

static _Thread_local char g_error[1024];
static _Thread_local int g_error_set;

int ft_error(const char *fmt, ...) {
    if (g_error_set) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_error, sizeof g_error, fmt, ap);
    va_end(ap);
    g_error_set = 1;
    return -1;
}

const char *ft_error_message(void) { return g_error_set ? g_error : ""; }

void ft_error_clear(void) { g_error_set = 0; g_error[0] = '\0'; }

// ----------------------------------------------------------------------------
// checked allocation

void *ft_malloc(size_t nbytes, const char *what) {
    void *p = malloc(nbytes ? nbytes : 1);
    if (!p) ft_error("out of memory allocating %zu bytes for %s", nbytes, what);
    return p;
}

void *ft_calloc(size_t count, size_t size, const char *what) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) ft_error("out of memory allocating %zu x %zu bytes for %s", count, size, what);
    return p;
}

char *ft_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = ft_malloc(n, "string");
    if (p) memcpy(p, s, n);
    return p;
}

// ----------------------------------------------------------------------------
// paths

int ft_path(char *buf, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const int k = vsnprintf(buf, n, fmt, ap);
    va_end(ap);
    if (k >= 0 && (size_t)k < n) return 0;
    return ft_error("path too long (%d bytes, the limit is %zu): %.120s...", k, n ? n - 1 : 0, buf);
}

// ----------------------------------------------------------------------------
// IEEE half precision

uint64_t ft_fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;   // the FNV 64-bit prime
    return h;
}

uint64_t ft_fingerprint_sampled(uint64_t h, const void *p, size_t n) {
    const size_t S = FT_FINGERPRINT_SAMPLE;
    if (n <= 3 * S) return ft_fnv1a(h, p, n);
    const size_t at[3] = {0, (n - S) / 2, n - S};
    for (int k = 0; k < 3; k++) h = ft_fnv1a(h, (const unsigned char *)p + at[k], S);
    return h;
}

// ft_hash64's two odd multipliers: 2^64 / the golden ratio, and the first 64 fractional bits
// of sqrt(2) with the low bit set
#define H64_K1 0x9e3779b97f4a7c15ull
#define H64_K2 0x6a09e667f3bcc909ull

static inline uint64_t h64_load(const unsigned char *p) {   // 8 bytes as a little-endian word
    uint64_t w;
    memcpy(&w, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    return w;
}

// One step: a bijection of v for fixed w, and of w for fixed v (xor, odd multiply, rotate).
static inline uint64_t h64_step(uint64_t v, uint64_t w) {
    const uint64_t x = (v ^ w) * H64_K1;
    return (x << 27) | (x >> 37);
}

void ft_hostname(char *buf, size_t n) {
    if (n == 0) return;
    if (gethostname(buf, n - 1) != 0) snprintf(buf, n, "?");
    buf[n - 1] = '\0';
}

uint64_t ft_hash64(const void *p, size_t n) {
    const unsigned char *b = p;
    // lane i takes words i, i + 8, i + 16, ...: eight independent chains, in registers
    uint64_t v0 = H64_K2, v1 = 3 * H64_K2, v2 = 5 * H64_K2, v3 = 7 * H64_K2, v4 = 9 * H64_K2, v5 = 11 * H64_K2,
             v6 = 13 * H64_K2, v7 = 15 * H64_K2;
    size_t k = 0;
    for (; k + 64 <= n; k += 64) {
        const unsigned char *q = b + k;
        v0 = h64_step(v0, h64_load(q));
        v1 = h64_step(v1, h64_load(q + 8));
        v2 = h64_step(v2, h64_load(q + 16));
        v3 = h64_step(v3, h64_load(q + 24));
        v4 = h64_step(v4, h64_load(q + 32));
        v5 = h64_step(v5, h64_load(q + 40));
        v6 = h64_step(v6, h64_load(q + 48));
        v7 = h64_step(v7, h64_load(q + 56));
    }
    const uint64_t lanes[8] = {v0, v1, v2, v3, v4, v5, v6, v7};
    uint64_t h = (uint64_t)n * H64_K2;
    for (int i = 0; i < 8; i++) h = h64_step(h, lanes[i]);
    for (; k + 8 <= n; k += 8) h = h64_step(h, h64_load(b + k));
    if (k < n) {   // the last 1..7 bytes, zero-extended (n tells them from trailing zeros)
        unsigned char last[8] = {0};
        memcpy(last, b + k, n - k);
        h = h64_step(h, h64_load(last));
    }
    h ^= h >> 31;   // spread the high bits over the low ones: a bijection, too
    h *= H64_K2;
    return h ^ (h >> 29);
}

float ft_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) & 1u, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    float v;
    if (exp == 0) v = ldexpf((float)man, -24);                     // zero / subnormal
    else if (exp == 31) v = man ? NAN : INFINITY;                   // inf / nan
    else v = ldexpf((float)(man | 0x400u), (int)exp - 25);          // normal
    return sign ? -v : v;
}

// ----------------------------------------------------------------------------
// SHA-256 (FIPS 180-4, section 6.2)

static const uint32_t sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t ror32(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

// one 64-byte block into the state
static void sha256_block(uint32_t h[8], const unsigned char *b) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)b[4 * i] << 24 | (uint32_t)b[4 * i + 1] << 16 | (uint32_t)b[4 * i + 2] << 8 | b[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        const uint32_t s0 = ror32(w[i - 15], 7) ^ ror32(w[i - 15], 18) ^ (w[i - 15] >> 3);
        const uint32_t s1 = ror32(w[i - 2], 17) ^ ror32(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], bb = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; i++) {
        const uint32_t t1 = hh + (ror32(e, 6) ^ ror32(e, 11) ^ ror32(e, 25)) + ((e & f) ^ (~e & g)) + sha256_k[i] + w[i];
        const uint32_t t2 = (ror32(a, 2) ^ ror32(a, 13) ^ ror32(a, 22)) + ((a & bb) ^ (a & c) ^ (bb & c));
        hh = g; g = f; f = e; e = d + t1; d = c; c = bb; bb = a; a = t1 + t2;
    }
    h[0] += a; h[1] += bb; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
}

void ft_sha256_init(ft_sha256_ctx *c) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, h0, sizeof h0);
    c->bytes = 0;
}

void ft_sha256_update(ft_sha256_ctx *c, const void *p, size_t n) {
    const unsigned char *b = p;
    while (n > 0) {
        const size_t used = (size_t)(c->bytes % 64), take = n < 64 - used ? n : 64 - used;
        memcpy(c->block + used, b, take);
        c->bytes += take;
        b += take;
        n -= take;
        if (c->bytes % 64 == 0) sha256_block(c->h, c->block);
    }
}

void ft_sha256_final(ft_sha256_ctx *c, unsigned char digest[32]) {
    const uint64_t bits = c->bytes * 8;
    const unsigned char one = 0x80, zero = 0;
    ft_sha256_update(c, &one, 1);   // then zeros up to 56 mod 64, then the length (big-endian)
    while (c->bytes % 64 != 56) ft_sha256_update(c, &zero, 1);
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)(bits >> (56 - 8 * i));
    ft_sha256_update(c, len, 8);
    for (int i = 0; i < 32; i++) digest[i] = (unsigned char)(c->h[i / 4] >> (24 - 8 * (i % 4)));
}

int ft_sha256_file_hex(const char *path, char hex[65]) {
    FILE *f = fopen(path, "rb");
    if (!f) return ft_error("%s: %s", path, strerror(errno));
    ft_sha256_ctx c;
    ft_sha256_init(&c);
    unsigned char buf[1 << 16];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) ft_sha256_update(&c, buf, got);
    const int failed = ferror(f);
    fclose(f);
    if (failed) return ft_error("%s: read error", path);
    unsigned char d[32];
    ft_sha256_final(&c, d);
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
    return 0;
}
