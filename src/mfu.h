// mfu.h: the matmul-rate benchmark behind MFU when no peak is known (--peak_tflops 0 on a
// device without a published peak, e.g. the CPU).
#pragma once
#include "memory.h"

// Side of the three square matrices the benchmark multiplies (backend dtype, MEM_WORKSPACE,
// freed right after).
#define MFU_BENCH_MATMUL_DIM 384

typedef struct { void *a, *b, *c; } mfu_bench;

// The benchmark's buffers (see memory.h's buffer tables): `b` NULL when only planning.
void mfu_bench_buffer_table(mem_table *t, size_t esz, mfu_bench *b);

// The backend's dense matmul rate in FLOP/s, measured on (MFU_BENCH_MATMUL_DIM)^2 matrices
// (best of 5 after a warm-up); 0 when its buffers cannot be allocated.
double mfu_measure_matmul_flops(const backend *be, mem_tracker *mem);
