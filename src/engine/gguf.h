/*
 * gguf: read-only GGUF (v2/v3, little endian) reader over mmap.
 *
 * Format facts (from the GGUF spec in ggml's docs): magic "GGUF", u32
 * version, u64 n_tensors, u64 n_kv, then n_kv key/value pairs, then n_tensors
 * tensor infos (name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset),
 * then padding to general.alignment (default 32), then tensor data; each
 * tensor's offset is relative to the start of the data section. Strings are
 * u64 length + bytes (no NUL).
 *
 * gpe_gguf_open validates everything before returning: every length, count
 * and offset is checked against the file size, counts are capped, tensor
 * dims (1..4, each >= 0, element count without overflow, ne[0] a multiple
 * of the block size), types (known ggml numbers), offsets aligned and data
 * inside the file, no duplicate keys or tensor names, general.alignment a
 * u32 power of two. A file that opens is safe to walk with the accessors
 * below without further bounds checks. Errors name the culprit, e.g.
 *   "tensor 'blk.0.attn_q.weight': data [4096, 69632) extends past end of file (size 65536)".
 * Tensor types that are known but not supported by quant (Q2_K, IQ*, ...)
 * open fine; the model loader reports them as unsupported.
 *
 * Ownership: the gpe_gguf owns the mapping (or borrows the caller's buffer
 * for gpe_gguf_open_buffer) and all strings; every pointer returned is valid
 * until gpe_gguf_close. Strings returned are NUL-terminated copies; their
 * byte length is also given where embedded NULs might matter.
 *
 * Threading: a gpe_gguf is immutable after open; accessors are thread-safe.
 */
#ifndef GPUPOOL_ENGINE_GGUF_H
#define GPUPOOL_ENGINE_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpupool/engine.h"   /* gpe_status */
#include "engine/quant.h"     /* gpe_type */

typedef struct gpe_gguf gpe_gguf;

/* Metadata value types (GGUF numbering). */
typedef enum gpe_gguf_vtype {
    GPE_GGUF_U8 = 0,
    GPE_GGUF_I8 = 1,
    GPE_GGUF_U16 = 2,
    GPE_GGUF_I16 = 3,
    GPE_GGUF_U32 = 4,
    GPE_GGUF_I32 = 5,
    GPE_GGUF_F32 = 6,
    GPE_GGUF_BOOL = 7,
    GPE_GGUF_STRING = 8,
    GPE_GGUF_ARRAY = 9,
    GPE_GGUF_U64 = 10,
    GPE_GGUF_I64 = 11,
    GPE_GGUF_F64 = 12,
} gpe_gguf_vtype;

/* Caps on counts (a file beyond them is rejected as hostile). */
#define GPE_GGUF_MAX_KV 65536
#define GPE_GGUF_MAX_TENSORS 65536
#define GPE_GGUF_MAX_NAME 256        /* tensor names are shorter than this; keys <= 65535 bytes */
#define GPE_GGUF_MAX_DIMS 4

/* One tensor, as described by the file (validated). */
typedef struct gpe_gguf_tensor {
    const char *name;          /* NUL-terminated */
    gpe_type type;             /* a known type number; check gpe_type_supported() */
    int n_dims;                /* 1..4 */
    int64_t ne[GPE_GGUF_MAX_DIMS]; /* ne[0] = elements per row (contiguous); unused dims = 1 */
    int64_t n_elements;        /* product of ne */
    uint64_t offset;           /* absolute offset of the data in the file */
    uint64_t nbytes;           /* bytes of data */
    const void *data;          /* base + offset, inside the mapping */
} gpe_gguf_tensor;

/* Open and validate a file (mmap, read-only). On error *out is NULL and err
 * holds a message; GPE_ERR_IO for open/stat/mmap failures, GPE_ERR_FORMAT
 * for a malformed file, GPE_ERR_NOMEM. */
gpe_status gpe_gguf_open(const char *path, gpe_gguf **out, char *err, size_t errlen);
/* Same over a caller's buffer (borrowed: must outlive the gpe_gguf). Used by
 * the fuzzer and by tests that build files in memory. */
gpe_status gpe_gguf_open_buffer(const void *buf, size_t size, gpe_gguf **out, char *err,
                                size_t errlen);
void gpe_gguf_close(gpe_gguf *g);   /* NULL is fine */

uint32_t gpe_gguf_version(const gpe_gguf *g);
uint64_t gpe_gguf_file_size(const gpe_gguf *g);
uint32_t gpe_gguf_alignment(const gpe_gguf *g);
/* Start of the data section (absolute file offset). */
uint64_t gpe_gguf_data_offset(const gpe_gguf *g);

/* ------------------------------------------------------------- metadata */

int64_t gpe_gguf_n_kv(const gpe_gguf *g);
/* Index of key, or -1. */
int64_t gpe_gguf_find_key(const gpe_gguf *g, const char *key);
const char *gpe_gguf_key(const gpe_gguf *g, int64_t i);   /* NULL when i out of range */
/* Value type of entry i (-1 when out of range, cast to the enum). */
gpe_gguf_vtype gpe_gguf_kv_type(const gpe_gguf *g, int64_t i);

/* Typed getters by key. They return false (leaving *out alone) when the key
 * is absent or its value cannot be represented exactly in the requested
 * type. Integer types coerce among themselves when the value fits (a u32
 * key read as i64, an i32 >= 0 read as u32, ...); get_f32 accepts F32, F64
 * and integer values; get_bool accepts BOOL only. */
bool gpe_gguf_get_u32(const gpe_gguf *g, const char *key, uint32_t *out);
bool gpe_gguf_get_i32(const gpe_gguf *g, const char *key, int32_t *out);
bool gpe_gguf_get_u64(const gpe_gguf *g, const char *key, uint64_t *out);
bool gpe_gguf_get_i64(const gpe_gguf *g, const char *key, int64_t *out);
bool gpe_gguf_get_f32(const gpe_gguf *g, const char *key, float *out);
bool gpe_gguf_get_bool(const gpe_gguf *g, const char *key, bool *out);
/* String value (NUL-terminated); NULL when absent or not a string. *len
 * (optional) receives the byte length. */
const char *gpe_gguf_get_str(const gpe_gguf *g, const char *key, size_t *len);

/* Same by index (i from find_key or 0..n_kv-1). */
bool gpe_gguf_kv_i64(const gpe_gguf *g, int64_t i, int64_t *out);
bool gpe_gguf_kv_u64(const gpe_gguf *g, int64_t i, uint64_t *out);
bool gpe_gguf_kv_f64(const gpe_gguf *g, int64_t i, double *out);
const char *gpe_gguf_kv_str(const gpe_gguf *g, int64_t i, size_t *len);

/* Arrays. gpe_gguf_arr_info: false unless entry i is an array; gives the
 * element type (never ARRAY: nested arrays are rejected at open) and the
 * number of elements. */
bool gpe_gguf_arr_info(const gpe_gguf *g, int64_t i, gpe_gguf_vtype *etype, uint64_t *n);
/* Element j of a string array (NUL-terminated, *len optional); NULL when not
 * a string array or j out of range. O(1). */
const char *gpe_gguf_arr_str(const gpe_gguf *g, int64_t i, uint64_t j, size_t *len);
/* Element j of a numeric (or bool) array converted: false when not numeric,
 * j out of range, or (for the integer getter) not an integer that fits. */
bool gpe_gguf_arr_i64(const gpe_gguf *g, int64_t i, uint64_t j, int64_t *out);
bool gpe_gguf_arr_f32(const gpe_gguf *g, int64_t i, uint64_t j, float *out);
/* Raw element bytes of a numeric array (n * element size, little endian, may
 * be unaligned: read with memcpy); NULL for string arrays. */
const void *gpe_gguf_arr_data(const gpe_gguf *g, int64_t i);

/* Render value i as text into buf (always NUL-terminated when buflen > 0):
 * numbers in C notation, bools true/false, strings as they are, arrays as
 * "[a, b, c, ... (N items)]" with at most max_items shown. Returns the
 * number of bytes written (truncated to fit). */
size_t gpe_gguf_kv_render(const gpe_gguf *g, int64_t i, char *buf, size_t buflen,
                          int max_items);
/* "u32", "string", "array", ... */
const char *gpe_gguf_vtype_name(gpe_gguf_vtype t);

/* -------------------------------------------------------------- tensors */

int64_t gpe_gguf_n_tensors(const gpe_gguf *g);
/* Index of tensor name, or -1. */
int64_t gpe_gguf_find_tensor(const gpe_gguf *g, const char *name);
/* Tensor i (NULL when out of range). */
const gpe_gguf_tensor *gpe_gguf_tensor_at(const gpe_gguf *g, int64_t i);
/* Tensor by name, or NULL. */
const gpe_gguf_tensor *gpe_gguf_tensor_get(const gpe_gguf *g, const char *name);

#endif
