// st_nmse A.safetensors B.safetensors: for every F32 tensor of B (the reference), the NMSE
// of A's tensor of the same name; prints "worst <name> <nmse>" and exits 0, or 1 when a
// tensor is missing or mis-shaped (a test tool for tests/test_dist.sh).
#include <stdio.h>

#include "common.h"
#include "safetensors.h"
#include "test.h"

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: st_nmse A.safetensors B.safetensors\n"); return 2; }
    st_file a, b;
    if (st_open(&a, argv[1]) || st_open(&b, argv[2])) { fprintf(stderr, "st_nmse: %s\n", ft_error_message()); return 1; }
    double worst = 0;
    const char *worst_name = "";
    int rc = 0;
    for (int i = 0; i < b.n_tensors; i++) {
        const st_tensor *tb = &b.tensors[i], *ta = st_find(&a, tb->name);
        if (tb->dtype != ST_F32) continue;
        if (!ta || ta->dtype != ST_F32 || ta->numel != tb->numel) {
            fprintf(stderr, "st_nmse: %s: '%s' missing or mis-shaped\n", argv[1], tb->name);
            rc = 1;
            continue;
        }
        double e = test_nmse(ta->data, tb->data, tb->numel);
        if (e >= worst) { worst = e; worst_name = tb->name; }
    }
    printf("worst %s %.3e\n", worst_name, worst);
    st_close(&a);
    st_close(&b);
    return rc;
}
