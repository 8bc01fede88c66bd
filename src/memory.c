// memory.c: categorized allocation accounting (see memory.h).
#include "memory.h"

#include <string.h>

void mem_tracker_init(mem_tracker *t, const backend *be) {
    memset(t, 0, sizeof *t);
    t->be = be;
}

void *mem_alloc(mem_tracker *t, mem_category cat, size_t nbytes) {
    void *p = cat == MEM_HOST ? t->be->host_alloc(nbytes) : t->be->alloc(nbytes);
    if (!p) return NULL;
    t->current[cat] += nbytes;
    if (t->current[cat] > t->peak[cat]) t->peak[cat] = t->current[cat];
    if (cat == MEM_HOST) return p;   // not device memory
    t->current_total += nbytes;
    if (t->current_total > t->peak_total) t->peak_total = t->current_total;
    return p;
}

void mem_free(mem_tracker *t, mem_category cat, void *p, size_t nbytes) {
    if (!p) return;
    if (cat == MEM_HOST) t->be->host_free(p);
    else t->be->free(p);
    t->current[cat] -= nbytes;
    if (cat != MEM_HOST) t->current_total -= nbytes;
}

const char *mem_category_name(mem_category cat) {
    static const char *names[MEM_CATEGORY_COUNT] = {
        "params", "gathered", "grads", "optimizer", "activations", "workspace", "host"};
    return cat < MEM_CATEGORY_COUNT ? names[cat] : "?";
}

// ----------------------------------------------------------------------------
// buffer tables

void mem_table_add(mem_table *t, mem_category cat, size_t bytes, const char *what, void *slot) {
    if (t->failed || bytes == 0) return;
    mem_buffer b = {cat, bytes, what, slot};
    if (t->add(t, &b) != 0) t->failed = 1;
}

// slots are pointer fields of any object type: moved through memcpy, not a cast lvalue
static int table_alloc(mem_table *t, const mem_buffer *b) {
    void *p = mem_alloc(t->ctx, b->cat, b->bytes);
    if (!p) return -1;
    memcpy(b->slot, &p, sizeof p);
    return 0;
}

static int table_free(mem_table *t, const mem_buffer *b) {
    void *p;
    memcpy(&p, b->slot, sizeof p);
    mem_free(t->ctx, b->cat, p, b->bytes);
    p = NULL;
    memcpy(b->slot, &p, sizeof p);
    return 0;
}

mem_table mem_table_allocator(mem_tracker *mem) { return (mem_table){table_alloc, mem, 0}; }
mem_table mem_table_releaser(mem_tracker *mem) { return (mem_table){table_free, mem, 0}; }
