// cuda_emu_wmma.cpp: the warp-collective actions behind nvcuda::wmma in the emulator (see
// cuda_emu_wmma.h). Each runs once per collective, in the last lane to arrive, with every
// lane's request; it checks that the lanes agree and touches all 32 lanes' fragments.
#include "cuda_emu.h"

#include <stdio.h>

namespace cuemu {

namespace {

// position (0..255, row * 16 + col) of element i of `lane`'s fragment of kind k
inline int pos_of(int kind, int lane, int i) {
    return tls->wmma_layout[kind * 256 + lane * 8 + i];
}

inline float bf16_bits_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// the same memory operation on every lane, and a legal one
const char *check_mem_args(void *const *lanes, char *err, size_t n) {
    const WmmaReq *r0 = (const WmmaReq *)lanes[0];
    for (int l = 1; l < 32; l++) {
        const WmmaReq *r = (const WmmaReq *)lanes[l];
        if (r->ptr != r0->ptr || r->ldm != r0->ldm || r->col_major != r0->col_major ||
            r->kind != r0->kind) {
            snprintf(err, n, "lane %d passes (ptr %p, ldm %u, %s) but lane 0 (ptr %p, ldm %u, %s):"
                     " every lane must pass the same arguments", l, r->ptr, r->ldm,
                     r->col_major ? "col_major" : "row_major", r0->ptr, r0->ldm,
                     r0->col_major ? "col_major" : "row_major");
            return err;
        }
    }
    if ((uintptr_t)r0->ptr % 32 != 0) {
        snprintf(err, n, "pointer %p is not 256-bit (32-byte) aligned", r0->ptr);
        return err;
    }
    if (r0->ldm < 16 || (r0->ldm * (unsigned)r0->elem_bytes) % 16 != 0) {
        snprintf(err, n, "ldm %u must be >= 16 and a multiple of %d elements", r0->ldm,
                 16 / r0->elem_bytes);
        return err;
    }
    return nullptr;
}

// byte address of logical element (row, col) of the matrix in memory
inline unsigned char *elem_addr(const WmmaReq *r, int row, int col) {
    size_t off = r->col_major ? (size_t)col * r->ldm + row : (size_t)row * r->ldm + col;
    return (unsigned char *)r->ptr + off * (size_t)r->elem_bytes;
}

} // namespace

const char *wmma_load(void *const *lanes, char *err, size_t n) {
    if (const char *e = check_mem_args(lanes, err, n)) return e;
    for (int l = 0; l < 32; l++) {
        const WmmaReq *r = (const WmmaReq *)lanes[l];
        for (int i = 0; i < 8; i++) {
            int p = pos_of(r->kind, l, i);
            memcpy((unsigned char *)r->frag + (size_t)i * r->elem_bytes, elem_addr(r, p / 16, p % 16),
                   (size_t)r->elem_bytes);
        }
    }
    return nullptr;
}

const char *wmma_store(void *const *lanes, char *err, size_t n) {
    if (const char *e = check_mem_args(lanes, err, n)) return e;
    for (int l = 0; l < 32; l++) {
        const WmmaReq *r = (const WmmaReq *)lanes[l];
        for (int i = 0; i < 8; i++) {
            int p = pos_of(r->kind, l, i);
            memcpy(elem_addr(r, p / 16, p % 16), (const unsigned char *)r->frag + (size_t)i * 4, 4);
        }
    }
    return nullptr;
}

const char *wmma_mma(void *const *lanes, char *err, size_t n) {
    (void)err;
    (void)n;
    float A[256], B[256], C[256];
    for (int l = 0; l < 32; l++) {
        const WmmaReq *r = (const WmmaReq *)lanes[l];
        const uint16_t *a = (const uint16_t *)r->a, *b = (const uint16_t *)r->b;
        const float *c = (const float *)r->c;
        for (int i = 0; i < 8; i++) {
            A[pos_of(0, l, i)] = bf16_bits_to_float(a[i]);
            B[pos_of(1, l, i)] = bf16_bits_to_float(b[i]);
            C[pos_of(2, l, i)] = c[i];
        }
    }
    // (all inputs gathered before any output is written: D may alias C)
    float Dm[256];
    for (int m = 0; m < 16; m++)
        for (int nn = 0; nn < 16; nn++) {
            float acc = C[m * 16 + nn];
            for (int k = 0; k < 16; k++) {
                float prod = A[m * 16 + k] * B[k * 16 + nn];   // exact: 8-bit x 8-bit significands
                acc = acc + prod;
            }
            Dm[m * 16 + nn] = acc;
        }
    for (int l = 0; l < 32; l++) {
        const WmmaReq *r = (const WmmaReq *)lanes[l];
        float *d = (float *)r->frag;
        for (int i = 0; i < 8; i++) d[i] = Dm[pos_of(2, l, i)];
    }
    return nullptr;
}

} // namespace cuemu
