// arena.h: one block of (device) memory obtained once, carved into aligned allocations.
//
// The CUDA backend allocates its whole arena with one cudaMalloc when it starts, sized from
// the memory plan, and serves every backend alloc()/free() from it, so the step loop never
// calls cudaMalloc/cudaFree. The arena itself is plain bookkeeping over offsets from `base`
// (it never dereferences the memory), so the CPU tests exercise it with host memory.
//
// Policy: first fit over a free list kept sorted by offset; freed blocks coalesce with
// their neighbours. Allocation counts are small (hundreds), so lists are arrays.
#pragma once
#include <stddef.h>

typedef struct { size_t off, size; } arena_block;

typedef struct {
    char *base;              // start of the memory (not owned)
    size_t capacity;         // bytes
    size_t align;            // every allocation's offset and size are multiples of this
    arena_block *free_list;  // (n_free) sorted by offset, never adjacent (coalesced)
    int n_free, cap_free;
    arena_block *live;       // (n_live) allocations in use, unordered
    int n_live, cap_live;
    size_t used, peak;       // bytes in live blocks (after alignment), and their maximum
    size_t top;              // the highest end offset ever handed out: the bytes the arena's users
                             // ever reached (>= peak: first fit may leave holes below it)
} arena;

// Manage `capacity` bytes at `base`; align must be a power of two (256 for CUDA). 0 / -1.
int arena_init(arena *a, void *base, size_t capacity, size_t align);
// Release the bookkeeping (not the memory at base).
void arena_destroy(arena *a);
// An aligned block of at least nbytes (nbytes 0 counts as 1), or NULL with ft_error naming
// the request, the free bytes and the largest free block.
void *arena_alloc(arena *a, size_t nbytes);
// Return a block obtained from arena_alloc. NULL is a no-op; any other pointer the arena
// did not hand out is an error (-1), never silent corruption.
int arena_free(arena *a, void *p);
// Size of the largest free block, for messages and tests.
size_t arena_largest_free(const arena *a);
