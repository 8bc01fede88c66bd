// arena.c: first-fit allocator over one block of memory (see arena.h).
#include "arena.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"

// ----------------------------------------------------------------------------
// small array helpers

static int blocks_reserve(arena_block **v, int *cap, int need) {
    if (need <= *cap) return 0;
    int n = *cap ? *cap * 2 : 64;
    while (n < need) n *= 2;
    arena_block *p = realloc(*v, (size_t)n * sizeof *p);
    CHECK_ALLOC(p, (size_t)n * sizeof *p);
    *v = p;
    *cap = n;
    return 0;
}

static void blocks_remove(arena_block *v, int *n, int i) {
    memmove(v + i, v + i + 1, (size_t)(*n - i - 1) * sizeof *v);
    (*n)--;
}

// ----------------------------------------------------------------------------
// public

int arena_init(arena *a, void *base, size_t capacity, size_t align) {
    memset(a, 0, sizeof *a);
    if (align == 0 || (align & (align - 1)) != 0) return ft_error("arena: alignment %zu is not a power of two", align);
    a->base = base;
    a->align = align;
    // the usable size starts at an aligned address and is a whole number of alignment units
    size_t skew = (size_t)(-(uintptr_t)base) & (align - 1);
    a->capacity = capacity > skew ? (capacity - skew) & ~(align - 1) : 0;
    a->base += skew;
    if (a->capacity == 0) return 0;
    TRY(blocks_reserve(&a->free_list, &a->cap_free, 1));
    a->free_list[0] = (arena_block){0, a->capacity};
    a->n_free = 1;
    return 0;
}

void arena_destroy(arena *a) {
    free(a->free_list);
    free(a->live);
    memset(a, 0, sizeof *a);
}

size_t arena_largest_free(const arena *a) {
    size_t m = 0;
    for (int i = 0; i < a->n_free; i++)
        if (a->free_list[i].size > m) m = a->free_list[i].size;
    return m;
}

void *arena_alloc(arena *a, size_t nbytes) {
    size_t need = nbytes ? nbytes : 1;
    if (ft_add_size(need, a->align - 1, &need) != 0) {
        ft_error("device arena: request of %zu bytes overflows", nbytes);
        return NULL;
    }
    need &= ~(a->align - 1);
    int i = 0;
    while (i < a->n_free && a->free_list[i].size < need) i++;
    if (i == a->n_free) {
        ft_error("device arena exhausted: %zu bytes requested, %zu of %zu free, largest free block %zu "
                 "(the arena is sized from the memory plan; see --dry_run)",
                 nbytes, a->capacity - a->used, a->capacity, arena_largest_free(a));
        return NULL;
    }
    if (blocks_reserve(&a->live, &a->cap_live, a->n_live + 1) != 0) return NULL;
    arena_block *f = &a->free_list[i];
    const size_t off = f->off;
    f->off += need;
    f->size -= need;
    if (f->size == 0) blocks_remove(a->free_list, &a->n_free, i);
    a->live[a->n_live++] = (arena_block){off, need};
    a->used += need;
    if (a->used > a->peak) a->peak = a->used;
    if (off + need > a->top) a->top = off + need;
    return a->base + off;
}

int arena_free(arena *a, void *p) {
    if (!p) return 0;
    const char *c = p;
    if (c < a->base || c >= a->base + a->capacity) return ft_error("device arena: free of a pointer it does not own");
    const size_t off = (size_t)(c - a->base);
    int j = 0;
    while (j < a->n_live && a->live[j].off != off) j++;
    if (j == a->n_live) return ft_error("device arena: free of offset %zu, which is not a live allocation", off);
    arena_block b = a->live[j];
    a->live[j] = a->live[--a->n_live];
    a->used -= b.size;
    // insert into the sorted free list, merging with the previous and next blocks
    int i = 0;
    while (i < a->n_free && a->free_list[i].off < b.off) i++;
    int merged = 0;
    if (i > 0 && a->free_list[i - 1].off + a->free_list[i - 1].size == b.off) {
        a->free_list[i - 1].size += b.size;
        merged = 1;
        if (i < a->n_free && b.off + b.size == a->free_list[i].off) {
            a->free_list[i - 1].size += a->free_list[i].size;
            blocks_remove(a->free_list, &a->n_free, i);
        }
    } else if (i < a->n_free && b.off + b.size == a->free_list[i].off) {
        a->free_list[i].off = b.off;
        a->free_list[i].size += b.size;
        merged = 1;
    }
    if (!merged) {
        TRY(blocks_reserve(&a->free_list, &a->cap_free, a->n_free + 1));
        memmove(a->free_list + i + 1, a->free_list + i, (size_t)(a->n_free - i) * sizeof *a->free_list);
        a->free_list[i] = b;
        a->n_free++;
    }
    return 0;
}
