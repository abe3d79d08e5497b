/*
 * synth_gguf: build a GGUF v3 file in memory, byte for byte the way
 * llama.cpp's gguf-py (and ggml's gguf writer) lays it out: header, the
 * key/value pairs in the order they were added, the tensor infos in the
 * order they were added, zero padding to the alignment (32), then each
 * tensor's data at offsets rounded up to 32 with zero padding after every
 * tensor, the last one included.
 *
 * Key/value pairs are added either as literal values or as the raw bytes of
 * an entry copied from another GGUF file (synth_src), so that a tokenizer
 * (arrays of 50k strings) is reproduced exactly without being re-encoded.
 *
 * Ownership: a synth_gguf owns its key bytes and its tensors' data (added
 * with synth_gguf_add_tensor, which takes the malloc'd buffer). A synth_src
 * owns the file's bytes; entries found in it are copied into the builder.
 * Errors: functions return false with a message in err (caller's buffer).
 */
#ifndef GPUPOOL_TESTS_SYNTH_SYNTH_GGUF_H
#define GPUPOOL_TESTS_SYNTH_SYNTH_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SYNTH_ALIGN 32
#define SYNTH_MAX_DIMS 4

/* GGUF value types (numbering of the format). */
enum {
    SYNTH_V_U32 = 4, SYNTH_V_I32 = 5, SYNTH_V_F32 = 6, SYNTH_V_BOOL = 7,
    SYNTH_V_STRING = 8, SYNTH_V_U64 = 10,
};
/* ggml tensor types used here. */
enum { SYNTH_T_F32 = 0, SYNTH_T_F16 = 1, SYNTH_T_Q8_0 = 8 };

typedef struct synth_tensor {
    char *name;
    int n_dims;
    int64_t ne[SYNTH_MAX_DIMS];
    uint32_t type;
    void *data;          /* owned */
    size_t nbytes;
} synth_tensor;

typedef struct synth_gguf {
    uint8_t *kv;         /* encoded key/value entries, back to back */
    size_t kv_len, kv_cap;
    uint64_t n_kv;
    synth_tensor *t;
    size_t n_t, cap_t;
} synth_gguf;

typedef struct synth_src synth_src;

void synth_gguf_init(synth_gguf *g);
void synth_gguf_free(synth_gguf *g);

bool synth_gguf_add_str(synth_gguf *g, const char *key, const char *val, char *err, size_t errlen);
bool synth_gguf_add_u32(synth_gguf *g, const char *key, uint32_t val, char *err, size_t errlen);
bool synth_gguf_add_i32(synth_gguf *g, const char *key, int32_t val, char *err, size_t errlen);
bool synth_gguf_add_u64(synth_gguf *g, const char *key, uint64_t val, char *err, size_t errlen);
bool synth_gguf_add_f32(synth_gguf *g, const char *key, float val, char *err, size_t errlen);
bool synth_gguf_add_bool(synth_gguf *g, const char *key, bool val, char *err, size_t errlen);
/* Append src's entry for key, unchanged. */
bool synth_gguf_copy_kv(synth_gguf *g, const synth_src *src, const char *key, char *err,
                        size_t errlen);
/* Move src's key/value entries to dst (which must have none yet); src is
 * left with none. */
void synth_gguf_move_kv(synth_gguf *dst, synth_gguf *src);
/* Append a tensor; takes ownership of data (malloc'd, nbytes long) even on
 * failure. */
bool synth_gguf_add_tensor(synth_gguf *g, const char *name, int n_dims, const int64_t *ne,
                           uint32_t type, void *data, size_t nbytes, char *err, size_t errlen);

/* Serialise into a new malloc'd buffer (*out, *len; caller frees). */
bool synth_gguf_serialise(const synth_gguf *g, uint8_t **out, size_t *len, char *err,
                          size_t errlen);

/* IEEE half <-> single. To half: round to nearest, ties to even, with
 * subnormals and overflow to infinity, as numpy's astype and F16C do (a NaN
 * stays a quiet NaN; its payload may differ: none is ever generated). To
 * single: exact. */
uint16_t synth_f32_to_f16(float f);
float synth_f16_to_f32(uint16_t h);

/* Read a GGUF file and index its key/value entries. */
bool synth_src_open(const char *path, synth_src **out, char *err, size_t errlen);
void synth_src_close(synth_src *s);   /* NULL is fine */

#endif
