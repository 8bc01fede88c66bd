// safetensors.h: a validating, mmap-based reader and an atomic writer for the
// safetensors format (8-byte little-endian header length, JSON header, flat data).
//
// Files may come from the internet: st_open() validates everything before any tensor is
// used (header bounds, JSON shape, dtypes, shapes, byte ranges in bounds, no overlap and
// no holes, no duplicate names, shape x dtype == byte length, overflow-safe), so no later
// access can read outside the mapping.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "dtype.h"   // st_dtype, st_dtype_size, st_dtype_name


#define ST_MAX_DIMS 8

// Checksums in "__metadata__" (string values, as the format requires): ST_CHECKSUM_KEY names
// the function (ST_CHECKSUM_ALGO: common.h's ft_hash64), and ST_CHECKSUM_KEY ".<tensor name>"
// holds each tensor's as 16 lowercase hex digits. The writer records them in every file it
// writes; a file without them (Hugging Face's, an older build's) is read unchecked. st_open
// refuses an unknown function, a key that names no tensor, and a file that records the function
// but lacks some tensor's checksum (edited after finetune wrote it).
#define ST_CHECKSUM_KEY "finetune.checksum"
#define ST_CHECKSUM_ALGO "ft_hash64"

typedef struct {
    char *name;                  // owned by the st_file
    st_dtype dtype;
    int ndim;                    // 0 = scalar
    int64_t shape[ST_MAX_DIMS];
    size_t numel;                // product of shape (1 for a scalar)
    size_t nbytes;               // numel * st_dtype_size(dtype)
    const void *data;            // points into the read-only mapping (valid until st_close)
    int has_checksum;            // the header records this tensor's checksum (ST_CHECKSUM_KEY)
    uint64_t checksum;           // then: ft_hash64 of its nbytes as written (st_verify compares)
} st_tensor;

typedef struct {
    char *path;                  // as given to st_open (owned)
    void *map;                   // read-only mmap of the whole file (NULL for an empty data area)
    size_t map_size;
    st_tensor *tensors;          // n_tensors entries, in header order
    int n_tensors;
} st_file;

// Open and validate `path`. On success fills *f (release with st_close) and returns 0.
// On any problem returns -1 with ft_error() set to one line naming the file and the
// offending field/tensor, e.g. "x.safetensors: tensor 'a': data_offsets [0, 12] do not
// match shape [2, 2] x F32 = 16 bytes"; *f is left empty (st_close on it is safe).
int st_open(st_file *f, const char *path);
void st_close(st_file *f);

// The tensor called `name`, or NULL.
const st_tensor *st_find(const st_file *f, const char *name);

// Tensor t of the file at `path`: its bytes (all nbytes read) against the checksum its header
// records. 0 when they match or none is recorded; else -1 with ft_error
// "<path>: tensor '<name>': checksum mismatch (the file is corrupted)".
int st_verify(const st_tensor *t, const char *path);

// Content fingerprint of an open file, continuing `h` (FT_FNV_INIT for the first file): its
// length field and JSON header (every name, dtype, shape and offset) whole, then its data area
// through ft_fingerprint_sampled (common.h: what that tells apart and what it does not). The
// same weights stored differently (another dtype, header or sharding) give another value.
uint64_t st_fingerprint(const st_file *f, uint64_t h);

// One tensor to write: data is host memory of nbytes = numel * dtype size.
typedef struct {
    const char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;
} st_write_tensor;

// Write a safetensors file atomically: the bytes go to "<path>.tmp.<pid>", are fsync'ed,
// then renamed over `path` (and the directory fsync'ed), so `path` is either absent/old or
// complete. Tensors are laid out in the given order, 8-byte aligned header (padded with
// spaces as the format allows). `metadata` is NULL or a NULL-terminated list of
// key, value, key, value, ..., NULL strings written under "__metadata__", followed there by
// the checksums (ST_CHECKSUM_KEY).
// Returns 0, or -1 with ft_error set (no partial file left behind).
int st_write(const char *path, const st_write_tensor *tensors, int n_tensors,
             const char *const *metadata);

// The same file written one tensor at a time, in any order, so that no caller needs all the
// data in memory at once (checkpoints stream one FSDP unit at a time). The bytes are those
// st_write writes for the same tensors, whatever the order of the puts. The header goes out
// first with each checksum 16 zeros; a put computes its tensor's from the bytes it writes, and
// the commit writes the header again with them (the same length) before the rename.
typedef struct {
    char *path;            // destination
    char *tmp;             // "<path>.tmp.<pid>" once created (NULL before, and after the rename)
    int fd;                // open on tmp, or -1
    int n_tensors;
    char **names;          // (n_tensors) copies, for the commit's message
    size_t data_start;     // file offset of the data area (8 + padded header)
    size_t *offset;        // (n_tensors) byte offset of each tensor in the data area
    size_t *nbytes;        // (n_tensors) numel x dtype size
    unsigned char *written;   // (n_tensors) 1 once put
    uint64_t *sum;         // (n_tensors) ft_hash64 of each tensor's bytes, once put
    struct json_t *header; // jansson's: the header (owned), kept for the commit to fill the checksums in
} st_writer;

// Validate `tensors` (names, dtypes and shapes; their data pointers are not read), create
// "<path>.tmp.<pid>" and write the header. 0, or -1 with ft_error set, nothing left behind and
// *w released (st_writer_abort on it is harmless).
int st_writer_open(st_writer *w, const char *path, const st_write_tensor *tensors, int n_tensors,
                   const char *const *metadata);
// Write tensor i (index in the st_writer_open list) from `data` (its full nbytes) at its
// offset, and its checksum from those bytes. 0, or -1 with ft_error set (the writer stays open: st_writer_abort it).
int st_writer_put(st_writer *w, int i, const void *data);
// Refuse unless every tensor was put; write the header with the checksums, fsync, close,
// rename over `path`, fsync the directory.
// Releases *w either way; on failure the temporary file is removed. 0 / -1.
int st_writer_commit(st_writer *w);
// Close and remove the temporary file, release *w. Safe on a released writer.
void st_writer_abort(st_writer *w);

// fsync the directory containing `path` (makes a rename into it durable). 0 or -1.
int st_fsync_parent_dir(const char *path);
