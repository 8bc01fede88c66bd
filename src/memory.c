// memory.c: categorized allocation accounting (see memory.h).
#include "memory.h"

#include <string.h>

void mem_tracker_init(mem_tracker *t, const backend *be) {
    memset(t, 0, sizeof *t);
    t->be = be;
}

void *mem_alloc(mem_tracker *t, mem_category cat, size_t nbytes) {
    void *p = t->be->alloc(nbytes);
    if (!p) return NULL;
    t->current[cat] += nbytes;
    if (t->current[cat] > t->peak[cat]) t->peak[cat] = t->current[cat];
    t->current_total += nbytes;
    if (t->current_total > t->peak_total) t->peak_total = t->current_total;
    return p;
}

void mem_free(mem_tracker *t, mem_category cat, void *p, size_t nbytes) {
    if (!p) return;
    t->be->free(p);
    t->current[cat] -= nbytes;
    t->current_total -= nbytes;
}

const char *mem_category_name(mem_category cat) {
    static const char *names[MEM_CATEGORY_COUNT] = {
        "params", "gathered", "grads", "optimizer", "activations", "workspace"};
    return cat < MEM_CATEGORY_COUNT ? names[cat] : "?";
}
