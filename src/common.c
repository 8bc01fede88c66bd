// common.c: the error record, checked allocation, checked paths and fp16 conversion (see common.h).
#include "common.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

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

float ft_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) & 1u, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    float v;
    if (exp == 0) v = ldexpf((float)man, -24);                     // zero / subnormal
    else if (exp == 31) v = man ? NAN : INFINITY;                   // inf / nan
    else v = ldexpf((float)(man | 0x400u), (int)exp - 25);          // normal
    return sign ? -v : v;
}
