// mfu.c: the matmul-rate benchmark (see mfu.h).
#include "mfu.h"

#include <time.h>

#include "common.h"

static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void mfu_bench_buffer_table(mem_table *t, size_t esz, mfu_bench *b) {
    const size_t bytes = (size_t)MFU_BENCH_MATMUL_DIM * MFU_BENCH_MATMUL_DIM * esz;
    const char *what = "matmul-rate benchmark for MFU (--peak_tflops 0)";
    mem_table_add(t, MEM_WORKSPACE, bytes, what, b ? (void *)&b->a : NULL);
    mem_table_add(t, MEM_WORKSPACE, bytes, what, b ? (void *)&b->b : NULL);
    mem_table_add(t, MEM_WORKSPACE, bytes, what, b ? (void *)&b->c : NULL);
}

double mfu_measure_matmul_flops(const backend *be, mem_tracker *mem) {
    const int n = MFU_BENCH_MATMUL_DIM;
    const size_t esz = st_dtype_size(be->dtype), bytes = (size_t)n * n * esz;
    mfu_bench b = {0};
    mem_table t = mem_table_allocator(mem);
    mfu_bench_buffer_table(&t, esz, &b);
    double rate = 0;
    if (!t.failed && be->zero(b.a, bytes) == 0 && be->zero(b.b, bytes) == 0) {
        be->matmul_fwd(b.c, b.a, b.b, NULL, n, n, n);   // warm-up (thread pool start)
        double best = 1e30;
        for (int i = 0; i < 5; i++) {
            double t0 = now_seconds();
            be->matmul_fwd(b.c, b.a, b.b, NULL, n, n, n);
            be->synchronize();
            double dt = now_seconds() - t0;
            if (dt < best) best = dt;
        }
        rate = 2.0 * n * n * (double)n / best;
    }
    if (t.failed) ft_error_clear();   // no benchmark memory: MFU is reported as 0, not an error
    mem_table r = mem_table_releaser(mem);
    mfu_bench_buffer_table(&r, esz, &b);
    return rate;
}
