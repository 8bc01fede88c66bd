// memory.h: backend allocations counted by category, with current and peak bytes, so runs
// and tests can report where memory goes (params, grads, optimizer, activations, ...).
#pragma once
#include <stddef.h>

#include "backend.h"

typedef enum {
    MEM_PARAMS,      // parameters (full, or this rank's shard)
    MEM_GATHERED,    // FSDP: gathered unit buffers
    MEM_GRADS,       // parameter gradients
    MEM_OPTIMIZER,   // fp32 master weights and AdamW moments
    MEM_ACTIVATIONS, // forward activations kept for backward
    MEM_WORKSPACE,   // scratch: activation grads, recompute buffers, logits chunk, comm
    MEM_CATEGORY_COUNT
} mem_category;

typedef struct {
    const backend *be;
    size_t current[MEM_CATEGORY_COUNT];
    size_t peak[MEM_CATEGORY_COUNT];
    size_t current_total, peak_total;
} mem_tracker;

void mem_tracker_init(mem_tracker *t, const backend *be);
// Allocate nbytes of backend memory counted under `cat`. NULL + ft_error on failure.
void *mem_alloc(mem_tracker *t, mem_category cat, size_t nbytes);
// Release memory obtained from mem_alloc with the same category and size. NULL is a no-op.
void mem_free(mem_tracker *t, mem_category cat, void *p, size_t nbytes);
const char *mem_category_name(mem_category cat);
