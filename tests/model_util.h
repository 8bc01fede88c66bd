// model_util.h: test-only helpers for running the model without the sharding layer: a unit
// provider over two flat buffers, and loading a Hugging Face checkpoint into one flat buffer
// (tests/test_golden.c). Not in the library: the trainer always goes through fsdp.h.
#pragma once
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hf_checkpoint.h"
#include "common.h"
#include "model.h"

// A provider over two flat buffers (params, grads: layout->total elements each, backend
// memory). `grads` may be NULL for forward-only use. `state` must outlive the provider.
// fresh_layers 1: the layer units' gradients are handed out fresh (unit_grad.fresh, as FSDP's
// per-micro-batch layer buffers), filled with 0xFF bytes (NaN) first so that an element the
// backward does not overwrite shows
typedef struct { const param_layout *layout; const backend *be; void *params; void *grads; int fresh_layers; } flat_provider_state;

static int flat_acquire(void *ctx, int u, int for_backward, void **params) {
    flat_provider_state *s = ctx;
    (void)for_backward;
    *params = (char *)s->params + s->layout->unit_offset[u] * st_dtype_size(s->be->dtype);
    return 0;
}
static int flat_release(void *ctx, int u) { (void)ctx; (void)u; return 0; }
static int flat_grad_begin(void *ctx, int u, unit_grad *g) {
    flat_provider_state *s = ctx;
    if (!s->grads) return ft_error("model: backward requested without a gradient buffer");
    const size_t esz = st_dtype_size(s->be->dtype), nbytes = s->layout->unit_numel[u] * esz;
    g->data = (char *)s->grads + s->layout->unit_offset[u] * esz;
    g->dtype = s->be->dtype;
    g->fresh = s->fresh_layers && u < s->layout->n_layers;
    if (!g->fresh) return 0;
    unsigned char *nan = ft_malloc(nbytes, "NaN fill");
    if (!nan) return -1;
    memset(nan, 0xFF, nbytes);
    const int rc = s->be->copy_h2d(g->data, nan, nbytes);
    free(nan);
    return rc;
    return 0;
}
static int flat_grad_end(void *ctx, int u) { (void)ctx; (void)u; return 0; }

static unit_provider unit_provider_flat(flat_provider_state *state) {
    unit_provider p = {state, flat_acquire, flat_release, flat_grad_begin, flat_grad_end};
    return p;
}

// Load every unit into `params` (l->total elements of backend memory in be->dtype), one
// unit at a time through a host fp32 buffer (converted to bf16 on the host for bf16
// backends). Validates first. 0 or -1.
static int hf_checkpoint_load_params(const hf_checkpoint *ck, const param_layout *l, const backend *be,
                              void *params) {
    TRY(hf_checkpoint_validate(ck, l));
    size_t max_unit = 0;
    for (int u = 0; u < l->n_units; u++) max_unit = l->unit_numel[u] > max_unit ? l->unit_numel[u] : max_unit;
    float *host = ft_malloc(max_unit * sizeof(float), "checkpoint unit buffer");
    if (!host) return -1;
    const size_t esz = st_dtype_size(be->dtype);
    int rc = 0;
    for (int u = 0; u < l->n_units && rc == 0; u++) {
        const size_t n = l->unit_numel[u];
        void *dst = (char *)params + l->unit_offset[u] * esz;
        rc = hf_checkpoint_read_unit(ck, l, u, host);
        if (rc == 0 && be->dtype == ST_BF16) {
            // in place: bytes [2i, 2i+2) are written only after element i (bytes 4i..) is read
            for (size_t i = 0; i < n; i++) {
                uint16_t b = ft_f32_to_bf16(host[i]);
                memcpy((char *)host + 2 * i, &b, 2);
            }
        } else if (rc == 0 && be->dtype != ST_F32) {
            rc = ft_error("load params: backend dtype %s is not supported", st_dtype_name(be->dtype));
        }
        if (rc == 0) rc = be->copy_h2d(dst, host, n * esz);
    }
    free(host);
    return rc;
}
