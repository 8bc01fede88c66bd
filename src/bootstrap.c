// bootstrap.c: launcher-independent helpers (see bootstrap.h).
#include "bootstrap.h"

#include <stdint.h>
#include <string.h>

void boot_hex_encode(const void *in, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    const uint8_t *p = in;
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[p[i] >> 4];
        out[2 * i + 1] = digits[p[i] & 15];
    }
    out[2 * n] = '\0';
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

int boot_hex_decode(const char *in, void *out, size_t n) {
    if (strlen(in) != 2 * n) return -1;
    uint8_t *p = out;
    for (size_t i = 0; i < n; i++) {
        int hi = hex_value(in[2 * i]), lo = hex_value(in[2 * i + 1]);
        if (hi < 0 || lo < 0) return -1;
        p[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}
