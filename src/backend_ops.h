// backend_ops.h: struct backend's ops on backend memory as X-macro lists, for the wrappers
// that forward every op (src/profile.c times them, src/fp8_linear.c watches them). Each entry
// is X(op, params, args): the member's name, its parameter list with names, and those names
// as a call's arguments, so `static int w_##op params { ...; return inner->op args; }` forwards
// it. An op added to struct backend that takes backend memory belongs in one of the lists.
#pragma once
#include "backend.h"

// the ops --profile times (its report's rows), in table order (the FP8 ops: --fp8's wrapper
// sits above --profile's, src/train.c, so its quantisations and FP8 GEMMs get rows of their own)
#define BACKEND_OPS_TIMED(X)                                                                                        \
    X(copy_h2d, (void *d, const void *s, size_t n), (d, s, n))                                                   \
    X(copy_d2h, (void *d, const void *s, size_t n), (d, s, n))                                                   \
    X(copy_d2d, (void *d, const void *s, size_t n), (d, s, n))                                                   \
    X(zero, (void *p, size_t n), (p, n))                                                                         \
    X(embedding_fwd, (void *o, const int32_t *t, const void *w, int N, int C, int V), (o, t, w, N, C, V))        \
    X(embedding_bwd, (void *dw, st_dtype g, const void *d, const int32_t *t, int N, int C, int V),               \
      (dw, g, d, t, N, C, V))                                                                                    \
    X(rmsnorm_fwd, (void *o, float *r, float *am, const void *x, const void *w, int N, int C, float e),          \
      (o, r, am, x, w, N, C, e))                                                                                 \
    X(rmsnorm_bwd, (void *dx, void *dw, st_dtype g, const void *d, const void *x, const void *w, const float *r, \
                    int N, int C),                                                                               \
      (dx, dw, g, d, x, w, r, N, C))                                                                             \
    X(rope_fwd, (void *o, const void *x, const float *c, const float *s, int B, int T, int NH, int D,            \
                 const int32_t *sg),                                                                             \
      (o, x, c, s, B, T, NH, D, sg))                                                                             \
    X(rope_bwd, (void *dx, const void *d, const float *c, const float *s, int B, int T, int NH, int D,           \
                 const int32_t *sg),                                                                             \
      (dx, d, c, s, B, T, NH, D, sg))                                                                            \
    X(rope_qkv_fwd, (void *q, void *k, void *v, const void *x, const float *c, const float *s, int B, int T,     \
                     int H, int KVH, int D, const int32_t *sg),                                                  \
      (q, k, v, x, c, s, B, T, H, KVH, D, sg))                                                                   \
    X(rope_qkv_bwd, (void *dx, const void *dq, const void *dk, const void *dv, const float *c, const float *s,   \
                     int B, int T, int H, int KVH, int D, const int32_t *sg),                                    \
      (dx, dq, dk, dv, c, s, B, T, H, KVH, D, sg))                                                               \
    X(matmul_fwd, (void *o, const void *x, const void *w, const void *r, int N, int IC, int OC),                 \
      (o, x, w, r, N, IC, OC))                                                                                   \
    X(matmul_bwd, (void *dx, void *dw, st_dtype g, const void *d, const void *x, const void *w, int N, int IC,   \
                   int OC, int acc, int acc_dw),                                                                 \
      (dx, dw, g, d, x, w, N, IC, OC, acc, acc_dw))                                                              \
    X(attention_fwd, (void *o, float *l, const void *q, const void *k, const void *v, int B, int T, int H,       \
                      int KVH, int D, const int32_t *sg),                                                        \
      (o, l, q, k, v, B, T, H, KVH, D, sg))                                                                      \
    X(attention_bwd, (void *dq, void *dk, void *dv, const void *d, const void *o, const float *l, const void *q,  \
                      const void *k, const void *v, int B, int T, int H, int KVH, int D, const int32_t *sg),     \
      (dq, dk, dv, d, o, l, q, k, v, B, T, H, KVH, D, sg))                                                       \
    X(swiglu_fwd, (void *o, float *am, const void *g, const void *u, int N, int F, int ld),                      \
      (o, am, g, u, N, F, ld))                                                                                   \
    X(swiglu_bwd, (void *dg, void *du, const void *d, const void *g, const void *u, int N, int F, int ld),       \
      (dg, du, d, g, u, N, F, ld))                                                                               \
    X(scale, (void *o, const void *a, float s, size_t n), (o, a, s, n))                                          \
    X(lmhead_xent, (float *l, void *dx, void *dw, st_dtype g, const void *x, const void *w, const int32_t *t,    \
                    int N, int C, int V, float dl, int rows, float *ws, float *acc),                             \
      (l, dx, dw, g, x, w, t, N, C, V, dl, rows, ws, acc))                                                       \
    X(adamw, (float *m, void *p, const float *g, void *a, void *v, st_dtype mdt, size_t n,                       \
              const adamw_params *ap),                                                                           \
      (m, p, g, a, v, mdt, n, ap))                                                                               \
    X(sum_squares, (double *o, const float *x, size_t n), (o, x, n))                                             \
    X(sum_squares_accumulate, (double *o, const float *x, size_t n), (o, x, n))                                  \
    X(accumulate, (float *d, const void *s, st_dtype sdt, size_t n, float a), (d, s, sdt, n, a))                 \
    X(cast_from_f32, (void *d, const float *s, size_t n), (d, s, n))                                           \
    X(fp8_quantize, (void *o, void *ot, float *st, const void *x, int rows, int cols, fp8_format f),             \
      (o, ot, st, x, rows, cols, f))                                                                             \
    X(fp8_cast, (void *o, void *ot, float *st, const float *am, const void *x, int rows, int cols, fp8_format f), \
      (o, ot, st, am, x, rows, cols, f))                                                                         \
    X(matmul_fp8, (void *o, const void *a, fp8_format af, const float *as, const void *b, fp8_format bf,         \
                   const float *bs, int M, int N, int K, int acc, st_dtype odt),                                 \
      (o, a, af, as, b, bf, bs, M, N, K, acc, odt))

// the other ops that write backend memory: the asynchronous copies and the loss accumulator
#define BACKEND_OPS_UNTIMED(X)                                                                                      \
    X(copy_async, (void *d, const void *s, size_t n, int to_device, int ticket), (d, s, n, to_device, ticket))  \
    X(upload, (void *d, const void *s, size_t n, int ticket), (d, s, n, ticket))                                \
    X(loss_accumulate, (double *a, const float *l, const int32_t *t, int N), (a, l, t, N))

