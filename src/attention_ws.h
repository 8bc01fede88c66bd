// attention_ws.h: the device workspace of the native tensor-core attention backward
// (kernels/attention.cu, attention_bwd_wmma), as one formula that the kernel's launcher and
// the memory plan (src/plan.c) both use, so the plan line is the bytes the kernel asks for.
#pragma once
#include <stddef.h>

#define ATTN_DS_CAP_BYTES ((size_t)32 << 20)   // default cap of one launch's dS^T workspace

// The largest head_dim the native kernels take (forward and backward, SIMT and tensor cores):
// a larger one fails at the first attention call, so the plan (src/plan.c plan_validate)
// refuses it for `--attention native` before a GPU job starts.
#define ATTN_NATIVE_MAX_HEAD_DIM 128

// The backward keeps dS^T in bf16 for `group` = H / KVH query heads of one kv head of one
// sequence: per_kv = group * Tp^2 * 2 bytes, Tp = T rounded up to 16. A launch covers *nb
// whole sequences (all KVH kv heads) while they fit in `cap` bytes, else *nkv kv heads of
// one sequence (at least one, even past the cap). Returns the workspace bytes of a launch
// (per_kv * nkv * nb); nb / nkv may be NULL.
static inline size_t attention_bwd_ds_bytes(int B, int T, int H, int KVH, size_t cap, int *nb, int *nkv) {
    const size_t Tp = ((size_t)T + 15) / 16 * 16;
    const size_t per_kv = (size_t)(H / KVH) * Tp * Tp * 2;
    int b = 1, k = KVH;
    if (per_kv * (size_t)KVH <= cap) {
        const size_t fit = cap / (per_kv * (size_t)KVH);
        b = fit < (size_t)B ? (int)fit : B;
    } else {
        k = cap / per_kv > 0 ? (int)(cap / per_kv) : 1;
    }
    if (nb) *nb = b;
    if (nkv) *nkv = k;
    return per_kv * (size_t)k * (size_t)b;
}
