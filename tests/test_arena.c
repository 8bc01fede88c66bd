// test_arena.c: the device arena's bookkeeping (src/arena.c) over host memory.
//   1. a table of scripted cases: exact fits, exhaustion with a clear message, coalescing
//      of freed neighbours (left, right, both), bad frees, alignment of odd bases/sizes
//   2. random alloc/free against a byte-ownership map: blocks never overlap, stay inside
//      the arena, are aligned; after freeing everything one free block spans the arena
#include <stdint.h>

#include "arena.h"
#include "common.h"
#include "test.h"

// ----------------------------------------------------------------------------
// scripted cases: ops are "a<slot> <bytes>" (expect success), "x <bytes>" (expect failure),
// "f<slot>" (free), "F <n_free> <largest>" (check the free list)

typedef struct { const char *name; size_t capacity, align; const char *script; } arena_case;

static const arena_case CASES[] = {
    {"fill exactly", 1024, 256, "a0 256 a1 256 a2 256 a3 256 x 1 F 0 0"},
    {"round up to alignment", 1024, 256, "a0 1 a1 257 x 512 F 1 256"},
    {"zero bytes takes one unit", 512, 256, "a0 0 a1 0 x 1"},
    {"coalesce left", 1024, 256, "a0 256 a1 256 a2 256 f0 f1 F 2 512 a3 512 F 1 256"},
    {"coalesce right", 1024, 256, "a0 256 a1 256 a2 256 f1 f0 F 2 512"},
    {"coalesce both", 1024, 256, "a0 256 a1 256 a2 256 a3 256 f0 f2 F 2 256 f1 F 1 768 f3 F 1 1024"},
    {"first fit reuses hole", 1024, 256, "a0 256 a1 256 a2 512 f0 a3 256 F 0 0"},
    {"fragmentation reported", 1024, 256, "a0 256 a1 256 a2 256 a3 256 f0 f2 x 512 F 2 256"},
    {"bad free is an error", 1024, 256, "a0 256 B"},
    {"odd alignment 64", 1000, 64, "a0 100 a1 100 F 1 704"},
};

static int run_case(const arena_case *c) {
    // an odd base: the arena must align it itself
    char *mem = malloc(c->capacity + 512);
    char *base = mem + 3;
    arena a;
    void *slot[8] = {0};
    size_t skew = (size_t)(-(uintptr_t)base) & (c->align - 1);   // bytes the arena skips to align
    int ok = arena_init(&a, base, c->capacity + skew, c->align) == 0 && a.capacity == c->capacity / c->align * c->align;
    if (!ok) { free(mem); return 0; }
    const char *s = c->script;
    while (ok && *s) {
        char op = *s++;
        char *end;
        if (op == ' ') continue;
        if (op == 'a') {
            int k = (int)strtol(s, &end, 10);
            size_t n = strtoul(end, &end, 10);
            slot[k] = arena_alloc(&a, n);
            ok = slot[k] != NULL && ((uintptr_t)slot[k] & (c->align - 1)) == 0;
            if (!ok) fprintf(stderr, "  %s: alloc %zu failed: %s\n", c->name, n, ft_error_message());
        } else if (op == 'x') {
            size_t n = strtoul(s, &end, 10);
            ft_error_clear();
            ok = arena_alloc(&a, n) == NULL && strstr(ft_error_message(), "device arena exhausted") != NULL;
            if (!ok) fprintf(stderr, "  %s: alloc %zu should fail with a clear message\n", c->name, n);
        } else if (op == 'f') {
            int k = (int)strtol(s, &end, 10);
            ok = arena_free(&a, slot[k]) == 0;
            slot[k] = NULL;
        } else if (op == 'F') {
            int nf = (int)strtol(s, &end, 10);
            size_t largest = strtoul(end, &end, 10);
            ok = a.n_free == nf && arena_largest_free(&a) == largest;
            if (!ok) fprintf(stderr, "  %s: free list %d blocks largest %zu, expected %d / %zu\n", c->name, a.n_free,
                             arena_largest_free(&a), nf, largest);
        } else if (op == 'B') {
            end = (char *)s;
            ft_error_clear();
            ok = arena_free(&a, (char *)slot[0] + a.align) == -1 && arena_free(&a, mem + c->capacity + 500) == -1;
        } else {
            end = (char *)s;
        }
        s = end;
    }
    arena_destroy(&a);
    free(mem);
    ft_error_clear();
    return ok;
}

// ----------------------------------------------------------------------------
// random alloc/free against an ownership map

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_rand(void) { return test_rand(&rng); }

static int random_run(size_t capacity, size_t align, int ops) {
    char *mem = malloc(capacity);
    short *owner = calloc(capacity, sizeof *owner);   // slot+1 owning each byte, 0 = free
    arena a;
    enum { SLOTS = 64 };
    void *p[SLOTS] = {0};
    size_t sz[SLOTS] = {0};
    int ok = arena_init(&a, mem, capacity, align) == 0;
    size_t skew = (size_t)(a.base - mem);
    size_t top = 0;
    for (int it = 0; ok && it < ops; it++) {
        int k = (int)(next_rand() % SLOTS);
        if (p[k]) {
            size_t off = (size_t)((char *)p[k] - a.base);
            for (size_t i = 0; i < sz[k]; i++) owner[skew + off + i] = 0;
            ok = arena_free(&a, p[k]) == 0;
            p[k] = NULL;
            continue;
        }
        size_t n = 1 + next_rand() % (capacity / 16);
        p[k] = arena_alloc(&a, n);
        if (!p[k]) { ft_error_clear(); continue; }
        size_t off = (size_t)((char *)p[k] - a.base);
        if (off + n > top) top = off + n;   // the high-water mark, by hand
        ok = ((uintptr_t)p[k] & (align - 1)) == 0 && off + n <= a.capacity;
        for (size_t i = 0; ok && i < n; i++) {
            if (owner[skew + off + i]) ok = 0;
            owner[skew + off + i] = (short)(k + 1);
        }
        sz[k] = n;
    }
    for (int k = 0; ok && k < SLOTS; k++)
        if (p[k]) ok = arena_free(&a, p[k]) == 0;
    ok = ok && a.used == 0 && a.n_free == 1 && arena_largest_free(&a) == a.capacity && a.peak > 0;
    // top: the highest end offset handed out, aligned up (the arena rounds sizes to align)
    ok = ok && a.top >= top && a.top < top + align && a.top >= a.peak;
    arena_destroy(&a);
    free(owner);
    free(mem);
    return ok;
}

int main(void) {
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++)
        EXPECT(run_case(&CASES[i]), "arena case '%s'", CASES[i].name);
    EXPECT(random_run(1 << 20, 256, 20000), "random alloc/free, 1 MiB, align 256");
    EXPECT(random_run(100003, 64, 20000), "random alloc/free, odd capacity, align 64");
    arena a;
    EXPECT(arena_init(&a, NULL, 1024, 48) == -1, "alignment 48 rejected");
    ft_error_clear();
    TEST_SUMMARY("test_arena");
}
