// dtype.c: dtype sizes and names (see dtype.h).
#include "dtype.h"

#include <string.h>

static const struct { const char *name; size_t size; } st_dtypes[ST_DTYPE_COUNT] = {
    [ST_F64] = {"F64", 8}, [ST_F32] = {"F32", 4}, [ST_F16] = {"F16", 2}, [ST_BF16] = {"BF16", 2},
    [ST_I64] = {"I64", 8}, [ST_I32] = {"I32", 4}, [ST_I16] = {"I16", 2}, [ST_I8] = {"I8", 1},
    [ST_U8] = {"U8", 1},   [ST_BOOL] = {"BOOL", 1},
};

size_t st_dtype_size(st_dtype dt) { return dt < ST_DTYPE_COUNT ? st_dtypes[dt].size : 0; }
const char *st_dtype_name(st_dtype dt) { return dt < ST_DTYPE_COUNT ? st_dtypes[dt].name : "?"; }

int st_dtype_parse(const char *name, st_dtype *out) {
    for (int i = 0; i < ST_DTYPE_COUNT; i++)
        if (strcmp(name, st_dtypes[i].name) == 0) { *out = (st_dtype)i; return 0; }
    return -1;
}
