// st_nmse A.safetensors B.safetensors: for every F32 tensor of B (the reference), the NMSE
// of A's tensor of the same name; prints "worst <name> <nmse>" and exits 0, or prints
// "worst <name> FAILED" and exits 1 when a file cannot be read or a tensor is missing or
// mis-shaped (a test tool for tests/test_dist.sh and the emulated-GPU suites: their checks
// read the last field as a number, and FAILED is none, so a caller that ignores the exit
// status still fails).
//
// st_nmse --lora_products A B: the same over LoRA adapters, compared as what the model uses:
// for every "...lora_B.weight" (out, r) of B and its "...lora_A.weight" (r, in), the NMSE of
// A's product B A (out, in) against B's. The alpha / r scale is common to both and cancels.
// (Per tensor, lora_B is a poor measure: it starts at zero, so after a few AdamW steps it is
// mostly lr-sized sign-like moves, and bf16 noise on near-zero gradients flips some of them.)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "safetensors.h"
#include "test.h"

// the F32 tensor `name` of f with the given shape, or NULL (with a message naming path)
static const float *st_f32(const st_file *f, const char *path, const char *name, const st_tensor *like) {
    const st_tensor *t = st_find(f, name);
    if (!t || t->dtype != ST_F32 || t->ndim != like->ndim || t->numel != like->numel) {
        fprintf(stderr, "st_nmse: %s: '%s' missing or mis-shaped\n", path, name);
        return NULL;
    }
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] != like->shape[d]) {
            fprintf(stderr, "st_nmse: %s: '%s' mis-shaped\n", path, name);
            return NULL;
        }
    return t->data;
}

// (out, in) = B (out, r) A (r, in), in float (the NMSE is of floats anyway)
static float *lora_product(const float *B, const float *A, int64_t out, int64_t r, int64_t in) {
    float *p = calloc((size_t)(out * in), sizeof(float));
    if (!p) return NULL;
    for (int64_t o = 0; o < out; o++)
        for (int64_t k = 0; k < r; k++) {
            const double b = B[o * r + k];
            for (int64_t i = 0; i < in; i++) p[o * in + i] += (float)(b * A[k * in + i]);
        }
    return p;
}

int main(int argc, char **argv) {
    const int products = argc == 4 && strcmp(argv[1], "--lora_products") == 0;
    if (argc != 3 && !products) {
        fprintf(stderr, "usage: st_nmse [--lora_products] A.safetensors B.safetensors\n");
        return 2;
    }
    const char *pa = argv[argc - 2], *pb = argv[argc - 1];
    st_file a, b;
    if (st_open(&a, pa) || st_open(&b, pb)) {
        fprintf(stderr, "st_nmse: %s\n", ft_error_message());
        printf("worst - FAILED\n");
        return 1;
    }
    double worst = 0;
    char worst_name[256] = "";
    int rc = 0, compared = 0;
    for (int i = 0; i < b.n_tensors; i++) {
        const st_tensor *tb = &b.tensors[i];
        if (tb->dtype != ST_F32) continue;
        double e;
        if (!products) {
            const float *xa = st_f32(&a, pa, tb->name, tb);
            if (!xa) { rc = 1; continue; }
            e = test_nmse(xa, tb->data, tb->numel);
        } else {
            // pair each lora_B with its lora_A
            char *at = strstr(tb->name, "lora_B.weight");
            if (!at || tb->ndim != 2) continue;
            char name_a[256];
            snprintf(name_a, sizeof name_a, "%.*slora_A.weight%s", (int)(at - tb->name), tb->name,
                     at + strlen("lora_B.weight"));
            const st_tensor *tba = st_find(&b, name_a);
            if (!tba || tba->dtype != ST_F32 || tba->ndim != 2 || tba->shape[0] != tb->shape[1]) {
                fprintf(stderr, "st_nmse: %s: no lora_A (r, in) for '%s'\n", pb, tb->name);
                rc = 1;
                continue;
            }
            const float *xb = st_f32(&a, pa, tb->name, tb), *xa = st_f32(&a, pa, name_a, tba);
            if (!xb || !xa) { rc = 1; continue; }
            const int64_t out = tb->shape[0], r = tb->shape[1], in = tba->shape[1];
            float *got = lora_product(xb, xa, out, r, in), *ref = lora_product(tb->data, tba->data, out, r, in);
            if (!got || !ref) { fprintf(stderr, "st_nmse: out of memory\n"); return 1; }
            e = test_nmse(got, ref, (size_t)(out * in));
            free(got);
            free(ref);
        }
        compared++;
        if (e >= worst) { worst = e; snprintf(worst_name, sizeof worst_name, "%s", tb->name); }
    }
    if (compared == 0) { fprintf(stderr, "st_nmse: %s: nothing to compare\n", pb); rc = 1; }
    if (rc) printf("worst %s FAILED\n", worst_name[0] ? worst_name : "-");
    else printf("worst %s %.3e\n", worst_name, worst);
    st_close(&a);
    st_close(&b);
    return rc;
}
