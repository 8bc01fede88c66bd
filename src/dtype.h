// dtype.h: element types of tensors (storage dtypes of backends, safetensors dtypes), their
// sizes and names. The bottom of the include graph: the backend interface, the file formats
// and the collectives all name dtypes through this header alone.
#pragma once
#include <stddef.h>

typedef enum {
    ST_F64, ST_F32, ST_F16, ST_BF16, ST_I64, ST_I32, ST_I16, ST_I8, ST_U8, ST_BOOL,
    ST_DTYPE_COUNT
} st_dtype;

// Bytes per element of a dtype (0 for an unknown value).
size_t st_dtype_size(st_dtype dt);
// Its safetensors name: "F32", "BF16", ... ("?" for an unknown value).
const char *st_dtype_name(st_dtype dt);
// The dtype whose safetensors name is `name`: 0, or -1 (no error recorded) when none is.
int st_dtype_parse(const char *name, st_dtype *out);
