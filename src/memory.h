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
    MEM_HOST,        // host memory (--offload_optimizer: fp32 master weights and AdamW moments);
                     // not device memory: left out of current_total / peak_total
    MEM_CATEGORY_COUNT
} mem_category;

typedef struct {
    const backend *be;
    size_t current[MEM_CATEGORY_COUNT];
    size_t peak[MEM_CATEGORY_COUNT];
    size_t current_total, peak_total;   // device memory: every category but MEM_HOST
} mem_tracker;

void mem_tracker_init(mem_tracker *t, const backend *be);
// Allocate nbytes of backend memory counted under `cat`. NULL + ft_error on failure.
void *mem_alloc(mem_tracker *t, mem_category cat, size_t nbytes);
// Release memory obtained from mem_alloc with the same category and size. NULL is a no-op.
void mem_free(mem_tracker *t, mem_category cat, void *p, size_t nbytes);
const char *mem_category_name(mem_category cat);

// ----------------------------------------------------------------------------
// buffer tables: every buffer described once, read by the allocator and the planner
//
// A module that allocates at setup (model.c, fsdp.c) writes ONE function listing its
// buffers: category, bytes as a function of the config and the job, the --dry_run line it is
// counted in, and the pointer field that holds it. The same function, handed different
// tables, allocates them (mem_table_allocator), frees them (mem_table_releaser) and plans
// them (plan.c, with no object: slot NULL), so the plan cannot drift from the allocation.

// One buffer. `slot` is the address of the pointer field that holds it (a pointer of any
// object type, e.g. `&m->lse` for a float *); NULL when only planning.
typedef struct {
    mem_category cat;
    size_t bytes;
    const char *what;   // the --dry_run line; equal consecutive `what`s share one line
    void *slot;
} mem_buffer;

typedef struct mem_table mem_table;
struct mem_table {
    int (*add)(mem_table *t, const mem_buffer *b);   // 0, or -1 with ft_error set
    void *ctx;
    int failed;                                      // an add failed; later adds are skipped
};

// Offer one buffer to the table (skipped when bytes is 0 or an earlier add failed).
void mem_table_add(mem_table *t, mem_category cat, size_t bytes, const char *what, void *slot);
// A table that allocates each buffer from `mem` into its slot (failure: ft_error, t->failed).
mem_table mem_table_allocator(mem_tracker *mem);
// A table that frees each non-NULL slot into `mem` with the listed size and sets it NULL.
mem_table mem_table_releaser(mem_tracker *mem);
