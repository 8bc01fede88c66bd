// safetensors.c: validating mmap reader and atomic writer (see safetensors.h).
//
// File layout: u64 little-endian N | N bytes of JSON header | data area. The header maps
// tensor names to {"dtype", "shape", "data_offsets": [begin, end]} relative to the data
// area, plus an optional "__metadata__" object of string values.
#include "safetensors.h"

#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

// Limits that no real checkpoint reaches; they bound work done on hostile input.
#define ST_MAX_HEADER_BYTES (100u << 20)   // 100 MB of JSON (the format's own limit)
#define ST_MAX_DIM_VALUE ((int64_t)1 << 40)

// ----------------------------------------------------------------------------
// reader

void st_close(st_file *f) {
    if (!f) return;
    if (f->map) munmap(f->map, f->map_size);
    for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    free(f->path);
    memset(f, 0, sizeof *f);
}

// Parse one header entry into *t (name already set). `data_size` is the size of the data
// area. Records the error naming path and tensor.
static int parse_entry(const char *path, const char *name, json_t *v, size_t data_size,
                       size_t *begin, size_t *end, st_tensor *t) {
    if (!json_is_object(v)) return ft_error("%s: tensor '%s': header entry is not an object", path, name);
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd)) return ft_error("%s: tensor '%s': field 'dtype' missing or not a string", path, name);
    if (st_dtype_parse(json_string_value(jd), &t->dtype) != 0)
        return ft_error("%s: tensor '%s': unknown dtype '%s'", path, name, json_string_value(jd));
    if (!json_is_array(js)) return ft_error("%s: tensor '%s': field 'shape' missing or not an array", path, name);
    if (json_array_size(js) > ST_MAX_DIMS)
        return ft_error("%s: tensor '%s': %zu dimensions (at most %d supported)", path, name,
                        json_array_size(js), ST_MAX_DIMS);
    t->ndim = (int)json_array_size(js);
    size_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        json_t *x = json_array_get(js, (size_t)d);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > ST_MAX_DIM_VALUE)
            return ft_error("%s: tensor '%s': shape[%d] is not a sane non-negative integer", path, name, d);
        t->shape[d] = json_integer_value(x);
        if (ft_mul_size(numel, (size_t)t->shape[d], &numel) != 0)
            return ft_error("%s: tensor '%s': shape overflows", path, name);
    }
    t->numel = numel;
    if (ft_mul_size(numel, st_dtype_size(t->dtype), &t->nbytes) != 0)
        return ft_error("%s: tensor '%s': byte size overflows", path, name);
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) ||
        !json_is_integer(json_array_get(jo, 1)))
        return ft_error("%s: tensor '%s': field 'data_offsets' is not [begin, end]", path, name);
    json_int_t b = json_integer_value(json_array_get(jo, 0)), e = json_integer_value(json_array_get(jo, 1));
    if (b < 0 || e < b || (unsigned long long)e > data_size)
        return ft_error("%s: tensor '%s': data_offsets [%lld, %lld] out of range (data area is %zu bytes)",
                        path, name, (long long)b, (long long)e, data_size);
    *begin = (size_t)b;
    *end = (size_t)e;
    if (*end - *begin != t->nbytes) {
        char shp[160] = "";
        size_t n = 0;
        for (int d = 0; d < t->ndim && n < sizeof shp - 24; d++)
            n += (size_t)snprintf(shp + n, sizeof shp - n, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
        return ft_error("%s: tensor '%s': data_offsets [%zu, %zu] do not match shape [%s] x %s = %zu bytes",
                        path, name, *begin, *end, shp, st_dtype_name(t->dtype), t->nbytes);
    }
    return 0;
}

typedef struct { size_t begin, end; int index; } st_span;

static int span_cmp(const void *a, const void *b) {
    const st_span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

// Map the whole file read-only (f->map, f->map_size >= 8). 0 / -1.
static int st_map_file(st_file *f, const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ft_error("%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    int rc = -1;
    CHECK_SYS_GOTO(fstat(fd, &sb) == 0, done);
    if (!S_ISREG(sb.st_mode)) { ft_error("%s: not a regular file", path); goto done; }
    const size_t fsize = (size_t)sb.st_size;
    if (fsize < 8) { ft_error("%s: file is %zu bytes, too short for a safetensors header", path, fsize); goto done; }
    void *map = mmap(NULL, fsize, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) { ft_error("%s: mmap failed: %s", path, strerror(errno)); goto done; }
    f->map = map;
    f->map_size = fsize;
    rc = 0;
done:
    close(fd);
    return rc;
}

// The JSON header of the mapped file: its length bounded, NUL-free, an object. *data_off =
// where the data area starts. 0 / -1 (*root stays NULL).
static int st_read_header(const st_file *f, const char *path, json_t **root, size_t *data_off) {
    const unsigned char *bytes = f->map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | bytes[i];
    if (hlen > f->map_size - 8)
        return ft_error("%s: header length %llu runs past the end of the file (%zu bytes)", path,
                        (unsigned long long)hlen, f->map_size);
    if (hlen > ST_MAX_HEADER_BYTES) return ft_error("%s: header length %llu is absurd", path, (unsigned long long)hlen);
    if (hlen == 0) return ft_error("%s: empty header", path);
    // jansson needs a bounded buffer; the header is not NUL-terminated in the file
    char *header;
    CHECK_ALLOC(header = malloc(hlen + 1), hlen + 1);
    memcpy(header, bytes + 8, hlen);
    header[hlen] = '\0';
    int rc = 0;
    json_error_t jerr;
    if (strlen(header) != hlen) rc = ft_error("%s: header contains a NUL byte", path);
    else if (!(*root = json_loads(header, JSON_REJECT_DUPLICATES, &jerr)))
        rc = ft_error("%s: header is not valid JSON (line %d: %s)", path, jerr.line, jerr.text);
    else if (!json_is_object(*root)) rc = ft_error("%s: header is not a JSON object", path);
    free(header);
    *data_off = 8 + (size_t)hlen;
    return rc;
}

// Every header entry: __metadata__ (string values only) or a tensor, into f->tensors and
// its byte span into spans[] (one per tensor). 0 / -1.
static int st_read_entries(st_file *f, const char *path, json_t *root, size_t data_off, st_span *spans) {
    const size_t data_size = f->map_size - data_off;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(val)) return ft_error("%s: __metadata__ is not an object", path);
            const char *mk;
            json_t *mv;
            json_object_foreach(val, mk, mv) if (!json_is_string(mv))
                return ft_error("%s: __metadata__['%s'] is not a string", path, mk);
            continue;
        }
        st_tensor *t = &f->tensors[f->n_tensors];
        CHECK_ALLOC(t->name = ft_strdup(key), strlen(key));
        st_span *s = &spans[f->n_tensors];
        s->index = f->n_tensors++;
        TRY(parse_entry(path, key, val, data_size, &s->begin, &s->end, t));
        t->data = (const unsigned char *)f->map + data_off + s->begin;
    }
    return 0;
}

// The data area must be covered exactly: no overlap, no holes, nothing trailing. 0 / -1.
static int st_check_coverage(const st_file *f, const char *path, st_span *spans, size_t data_size) {
    qsort(spans, (size_t)f->n_tensors, sizeof *spans, span_cmp);
    size_t pos = 0;
    for (int i = 0; i < f->n_tensors; i++) {
        const st_span *s = &spans[i];
        if (s->begin < pos)
            return ft_error("%s: tensor '%s': data_offsets [%zu, %zu] overlap another tensor", path,
                            f->tensors[s->index].name, s->begin, s->end);
        if (s->begin > pos)
            return ft_error("%s: tensor '%s': hole of %zu bytes before its data_offsets [%zu, %zu]", path,
                            f->tensors[s->index].name, s->begin - pos, s->begin, s->end);
        pos = s->end;
    }
    if (pos != data_size) return ft_error("%s: data area is %zu bytes but the tensors cover %zu", path, data_size, pos);
    return 0;
}

// The checksums __metadata__ records (ST_CHECKSUM_KEY) into f->tensors. A file without any
// (Hugging Face's, an older build's) is read unchecked. One that records them (ST_CHECKSUM_KEY
// present) must name ST_CHECKSUM_ALGO and hold one per tensor, each ST_CHECKSUM_KEY ".<name>"
// naming a tensor of the file and holding 16 hex digits: our writer records one per tensor, so
// a header damaged or edited there (a tensor's name, a digit, a tensor added or its checksum
// dropped) is refused, not read unchecked. 0 / -1 naming path and the key or tensor.
static int st_read_checksums(st_file *f, const char *path, json_t *root) {
    json_t *meta = json_object_get(root, "__metadata__");   // (st_read_entries: an object of strings)
    if (!meta) return 0;
    json_t *algo = json_object_get(meta, ST_CHECKSUM_KEY);
    if (algo && strcmp(json_string_value(algo), ST_CHECKSUM_ALGO) != 0)
        return ft_error("%s: __metadata__['" ST_CHECKSUM_KEY "'] is '%s', a checksum this build does not know (it "
                        "knows " ST_CHECKSUM_ALGO ")", path, json_string_value(algo));
    const size_t plen = strlen(ST_CHECKSUM_KEY ".");
    const char *key;
    json_t *val;
    json_object_foreach(meta, key, val) {
        if (strncmp(key, ST_CHECKSUM_KEY ".", plen) != 0) continue;
        if (!algo) return ft_error("%s: __metadata__['%s'] without __metadata__['" ST_CHECKSUM_KEY "']", path, key);
        st_tensor *t = NULL;
        for (int i = 0; i < f->n_tensors && !t; i++)
            if (strcmp(f->tensors[i].name, key + plen) == 0) t = &f->tensors[i];
        const char *hex = json_string_value(val);
        if (!t) return ft_error("%s: __metadata__['%s'] names no tensor of the file", path, key);
        if (strlen(hex) != 16 || strspn(hex, "0123456789abcdefABCDEF") != 16)
            return ft_error("%s: __metadata__['%s'] is not 16 hex digits", path, key);
        t->checksum = strtoull(hex, NULL, 16);
        t->has_checksum = 1;
    }
    for (int i = 0; algo && i < f->n_tensors; i++)
        if (!f->tensors[i].has_checksum)
            return ft_error("%s: tensor '%s' has no checksum though the file records finetune checksums (edited after "
                            "finetune wrote it?)", path, f->tensors[i].name);
    return 0;
}

int st_open(st_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    json_t *root = NULL;
    st_span *spans = NULL;
    size_t data_off = 0;
    int rc = -1;
    CHECK_ALLOC_GOTO(f->path = ft_strdup(path), strlen(path), done);
    TRY_GOTO(st_map_file(f, path), done);
    TRY_GOTO(st_read_header(f, path, &root, &data_off), done);
    const size_t n_entries = json_object_size(root);
    f->tensors = ft_calloc(n_entries ? n_entries : 1, sizeof(st_tensor), "tensor table");
    spans = ft_calloc(n_entries ? n_entries : 1, sizeof(st_span), "tensor spans");
    if (!f->tensors || !spans) goto done;
    TRY_GOTO(st_read_entries(f, path, root, data_off, spans), done);
    rc = st_check_coverage(f, path, spans, f->map_size - data_off);
    if (rc == 0) rc = st_read_checksums(f, path, root);
done:
    json_decref(root);
    free(spans);
    if (rc != 0) st_close(f);
    return rc;
}

const st_tensor *st_find(const st_file *f, const char *name) {
    for (int i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

int st_verify(const st_tensor *t, const char *path) {
    if (!t->has_checksum || ft_hash64(t->data, t->nbytes) == t->checksum) return 0;
    return ft_error("%s: tensor '%s': checksum mismatch (the file is corrupted)", path, t->name);
}

uint64_t st_fingerprint(const st_file *f, uint64_t h) {
    const unsigned char *bytes = f->map;   // st_open: at least 8 bytes, the header within
    if (!bytes) return h;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | bytes[i];
    const size_t data_off = 8 + (size_t)hlen;
    h = ft_fnv1a(h, bytes, data_off);
    return ft_fingerprint_sampled(h, bytes + data_off, f->map_size - data_off);
}

// ----------------------------------------------------------------------------
// writer

// pwrite all n bytes at file offset `off`
static int write_all_at(int fd, const void *buf, size_t n, size_t off, const char *path) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n > (1u << 30) ? (1u << 30) : n, (off_t)off);
        if (w < 0) {
            if (errno == EINTR) continue;
            return ft_error("%s: write failed: %s", path, strerror(errno));
        }
        p += w;
        off += (size_t)w;
        n -= (size_t)w;
    }
    return 0;
}

// fsync the directory holding `path` so a rename is durable
int st_fsync_parent_dir(const char *path) {
    char *copy = ft_strdup(path);
    if (!copy) return -1;
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(copy);
    if (fd < 0) return ft_error("%s: cannot open its directory to fsync: %s", path, strerror(errno));
    int rc = fsync(fd);
    close(fd);
    if (rc != 0) return ft_error("%s: fsync of its directory failed: %s", path, strerror(errno));
    return 0;
}

// "finetune.checksum.<name>" (malloc'ed), or NULL with ft_error.
static char *checksum_key(const char *name) {
    const size_t n = strlen(ST_CHECKSUM_KEY ".") + strlen(name) + 1;
    char *key = ft_malloc(n, "checksum key");
    if (key) snprintf(key, n, ST_CHECKSUM_KEY ".%s", name);
    return key;
}

// The header of `tensors` (data ignored) into w->header: __metadata__ (the caller's pairs, then
// ST_CHECKSUM_KEY and one checksum per tensor, 16 zeros until st_writer_commit fills them in),
// then the tensors in the given order; each tensor's byte range in the data area into
// w->offset / w->nbytes. 0 / -1.
static int header_build(st_writer *w, const st_write_tensor *tensors, int n_tensors, const char *const *metadata) {
    json_t *root = w->header = json_object(), *meta = json_object();
    if (!root || !meta) { json_decref(meta); return ft_error("%s: out of memory building the header", w->path); }
    for (int i = 0; metadata && metadata[i] && metadata[i + 1]; i += 2)
        json_object_set_new(meta, metadata[i], json_string(metadata[i + 1]));
    json_object_set_new(meta, ST_CHECKSUM_KEY, json_string(ST_CHECKSUM_ALGO));
    for (int i = 0; i < n_tensors; i++) {
        char *key = checksum_key(tensors[i].name);
        if (!key) { json_decref(meta); return -1; }
        json_object_set_new(meta, key, json_string("0000000000000000"));
        free(key);
    }
    json_object_set_new(root, "__metadata__", meta);
    size_t off = 0;
    for (int i = 0; i < n_tensors; i++) {
        const st_write_tensor *t = &tensors[i];
        if (t->ndim < 0 || t->ndim > ST_MAX_DIMS || t->dtype >= ST_DTYPE_COUNT)
            return ft_error("%s: tensor '%s': bad dtype or rank", w->path, t->name);
        size_t nbytes = st_dtype_size(t->dtype);
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) {
            nbytes *= (size_t)t->shape[d];
            json_array_append_new(shape, json_integer(t->shape[d]));
        }
        json_t *e = json_object();
        json_object_set_new(e, "dtype", json_string(st_dtype_name(t->dtype)));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets", json_pack("[II]", (json_int_t)off, (json_int_t)(off + nbytes)));
        if (json_object_get(root, t->name)) { json_decref(e); return ft_error("%s: duplicate tensor '%s'", w->path, t->name); }
        json_object_set_new(root, t->name, e);
        w->offset[i] = off;
        w->nbytes[i] = nbytes;
        off += nbytes;
    }
    return 0;
}

// w->header as the file's first bytes: u64 length, compact JSON in insertion order (it reads
// like the data layout), spaces up to 8-byte alignment; malloc'ed into *out (*out_len bytes).
// 0 / -1.
static int header_dump(const st_writer *w, char **out, size_t *out_len) {
    char *hdr = json_dumps(w->header, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!hdr) return ft_error("%s: cannot serialise the header", w->path);
    const size_t hlen = strlen(hdr), padded = (8 + hlen + 7) / 8 * 8 - 8;
    if (!(*out = ft_malloc(8 + padded, "safetensors header"))) { free(hdr); return -1; }
    for (int i = 0; i < 8; i++) (*out)[i] = (char)(unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(*out + 8, hdr, hlen);
    memset(*out + 8 + hlen, ' ', padded - hlen);
    *out_len = 8 + padded;
    free(hdr);
    return 0;
}

// The header again, each tensor's checksum filled in, over the one st_writer_open wrote (the
// same length: 16 hex digits replace 16 zeros). 0 / -1.
static int header_write_checksums(st_writer *w) {
    json_t *meta = json_object_get(w->header, "__metadata__");
    for (int i = 0; i < w->n_tensors; i++) {
        char *key = checksum_key(w->names[i]), hex[17];
        if (!key) return -1;
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)w->sum[i]);
        json_string_set(json_object_get(meta, key), hex);
        free(key);
    }
    char *hdr = NULL;
    size_t hbytes = 0;
    TRY(header_dump(w, &hdr, &hbytes));
    int rc = hbytes == w->data_start ? write_all_at(w->fd, hdr, hbytes, 0, w->tmp)
                                     : ft_error("%s: the header changed length (%zu, was %zu bytes) when its checksums "
                                                "were filled in", w->tmp, hbytes, w->data_start);
    free(hdr);
    return rc;
}

int st_writer_open(st_writer *w, const char *path, const st_write_tensor *tensors, int n_tensors,
                   const char *const *metadata) {
    memset(w, 0, sizeof *w);
    w->fd = -1;
    const size_t n = n_tensors > 0 ? (size_t)n_tensors : 1, tmplen = strlen(path) + 32;
    w->n_tensors = n_tensors;
    w->path = ft_strdup(path);
    char *tmp = ft_malloc(tmplen, "safetensors temp name");
    w->offset = ft_calloc(n, sizeof *w->offset, "safetensors offsets");
    w->nbytes = ft_calloc(n, sizeof *w->nbytes, "safetensors sizes");
    w->names = ft_calloc(n, sizeof *w->names, "safetensors names");
    w->written = ft_calloc(n, 1, "safetensors written flags");
    w->sum = ft_calloc(n, sizeof *w->sum, "safetensors checksums");
    char *hdr = NULL;
    size_t hbytes = 0;
    if (!w->path || !tmp || !w->offset || !w->nbytes || !w->names || !w->written || !w->sum) goto fail;
    for (int i = 0; i < n_tensors; i++)
        if (!(w->names[i] = ft_strdup(tensors[i].name))) goto fail;
    TRY_GOTO(header_build(w, tensors, n_tensors, metadata), fail);
    TRY_GOTO(header_dump(w, &hdr, &hbytes), fail);
    TRY_GOTO(ft_path(tmp, tmplen, "%s.tmp.%d", path, (int)getpid()), fail);
    w->fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) { ft_error("%s: cannot create: %s", tmp, strerror(errno)); goto fail; }
    w->tmp = tmp;   // created: from here on, abort unlinks it
    tmp = NULL;
    TRY_GOTO(write_all_at(w->fd, hdr, hbytes, 0, w->tmp), fail);
    w->data_start = hbytes;
    free(hdr);
    return 0;
fail:
    free(hdr);
    free(tmp);
    st_writer_abort(w);
    return -1;
}

int st_writer_put(st_writer *w, int i, const void *data) {
    if (w->fd < 0 || i < 0 || i >= w->n_tensors) return ft_error("%s: tensor %d: no such tensor or writer closed", w->path, i);
    w->sum[i] = ft_hash64(data, w->nbytes[i]);   // the bytes as written: a reader compares (st_verify)
    TRY(write_all_at(w->fd, data, w->nbytes[i], w->data_start + w->offset[i], w->tmp));
    w->written[i] = 1;
    return 0;
}

int st_writer_commit(st_writer *w) {
    int rc = -1;
    if (w->fd < 0) return ft_error("%s: commit of a writer that is not open", w->path ? w->path : "safetensors");
    for (int i = 0; i < w->n_tensors; i++)
        if (!w->written[i]) { ft_error("%s: tensor '%s' was never written", w->path, w->names[i]); goto done; }
    TRY_GOTO(header_write_checksums(w), done);
    if (fsync(w->fd) != 0) { ft_error("%s: fsync failed: %s", w->tmp, strerror(errno)); goto done; }
    const int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0) { ft_error("%s: close failed: %s", w->tmp, strerror(errno)); goto done; }
    if (rename(w->tmp, w->path) != 0) { ft_error("%s: cannot rename %s into place: %s", w->path, w->tmp, strerror(errno)); goto done; }
    rc = st_fsync_parent_dir(w->path);
    free(w->tmp);   // renamed: nothing for abort to unlink
    w->tmp = NULL;
done:
    st_writer_abort(w);
    return rc;
}

void st_writer_abort(st_writer *w) {
    if (w->fd >= 0) close(w->fd);
    if (w->tmp) unlink(w->tmp);
    for (int i = 0; w->names && i < w->n_tensors; i++) free(w->names[i]);
    free(w->names);
    free(w->path);
    free(w->tmp);
    free(w->offset);
    free(w->nbytes);
    free(w->written);
    free(w->sum);
    json_decref(w->header);
    memset(w, 0, sizeof *w);
    w->fd = -1;
}

int st_write(const char *path, const st_write_tensor *tensors, int n_tensors,
             const char *const *metadata) {
    st_writer w;
    TRY(st_writer_open(&w, path, tensors, n_tensors, metadata));
    for (int i = 0; i < n_tensors; i++)
        if (st_writer_put(&w, i, tensors[i].data) != 0) { st_writer_abort(&w); return -1; }
    return st_writer_commit(&w);
}
