/*
 * Internal to quant.c / quant_x86.c: the per-ISA kernel table. Not part of
 * the engine's interface (use quant.h).
 */
#ifndef GPUPOOL_ENGINE_QUANT_IMPL_H
#define GPUPOOL_ENGINE_QUANT_IMPL_H

#include "engine/quant.h"

/* Dot of n elements of weight row w with activation row a (already in the
 * weight type's vec_dot type). */
typedef float (*gpe__dot_fn)(int64_t n, const void *w, const void *a);

/* Optional: one weight row against ntok (1..4) activation rows a + k*as,
 * results in out[k]; must give exactly what dot gives for each row. For
 * weight types whose vec_dot type is Q8_0, ad holds the activation rows'
 * block scales as floats (ad[k * n/32 + i], token k, block i), converted
 * once per matmul; other types ignore ad. */
typedef void (*gpe__dotn_fn)(int64_t n, const void *w, const void *a, size_t as, const float *ad,
                             int ntok, float *out);

/* Optional: rows [r0, r1) of W (rows rs bytes apart) against n_tok
 * activation rows act + t*as, out[t*ldo + r] for each; must give exactly
 * what dot gives. Returns the first row it did not do (it may leave a
 * remainder, or do nothing when out of memory); the caller does the rest. */
typedef int64_t (*gpe__gemm_fn)(int64_t n, const void *W, size_t rs, int64_t r0, int64_t r1,
                                const void *act, size_t as, int n_tok, float *out, int64_t ldo);

/* Optional: groups [g0, g1) of 8 rows of a packed matrix P (quant.h's
 * layout) against n_tok activation rows act + t*as; out[t*ldo + 8g + r].
 * Must give exactly what dot gives. Returns false (having written
 * nothing) when out of memory. */
typedef bool (*gpe__packed_fn)(int64_t n, const void *P, int64_t g0, int64_t g1, const void *act,
                               size_t as, int n_tok, float *out, int64_t ldo);

typedef struct gpe__kernels {
    gpe__dot_fn dot[GPE_TYPE_COUNT];     /* NULL for unsupported types */
    gpe__dotn_fn dotn[GPE_TYPE_COUNT];   /* NULL: matmul calls dot per token */
    gpe__gemm_fn gemm[GPE_TYPE_COUNT];   /* NULL: matmul uses dotn / dot */
    gpe__packed_fn packed[GPE_TYPE_COUNT]; /* NULL: packed matmul uses the rows */
    /* Q8_0 quantizer (nb blocks); NULL: the scalar one. Must give its bytes. */
    void (*quant_q8_0)(const float *x, void *dst, int64_t nb);
    /* F32 -> F16 of a prefix of n values, returning how many it did; NULL:
     * the scalar gpe_fp32_to_fp16. Must give its bits (NaN included). */
    int64_t (*quant_f16)(const float *x, void *dst, int64_t n);
} gpe__kernels;

/* Scalar reference kernels (quant.c). */
void gpe__kernels_scalar(gpe__kernels *k);
/* Overwrite the entries the ISA implements (quant_x86.c). Only call when the
 * CPU supports the ISA. */
void gpe__kernels_avx2(gpe__kernels *k);
void gpe__kernels_avx512(gpe__kernels *k);
/* Blocked F16 / BF16 matmuls (quant_x86_f16.c), gemm entries of the AVX2
 * and AVX-512 tables: bit-identical to that ISA's dot. */
int64_t gpe__gemm_f16_avx2(int64_t n, const void *W, size_t rs, int64_t r0, int64_t r1,
                           const void *act, size_t as, int n_tok, float *out, int64_t ldo);
int64_t gpe__gemm_bf16_avx2(int64_t n, const void *W, size_t rs, int64_t r0, int64_t r1,
                            const void *act, size_t as, int n_tok, float *out, int64_t ldo);
int64_t gpe__gemm_f16_avx512(int64_t n, const void *W, size_t rs, int64_t r0, int64_t r1,
                             const void *act, size_t as, int n_tok, float *out, int64_t ldo);
int64_t gpe__gemm_bf16_avx512(int64_t n, const void *W, size_t rs, int64_t r0, int64_t r1,
                              const void *act, size_t as, int n_tok, float *out, int64_t ldo);
/* Whether the build has the x86 kernels at all. */
bool gpe__have_x86_kernels(void);

/* 6-bit scale and min j (0..7) of a Q4_K/Q5_K block (GGUF fact: packed as in
 * ggml's get_scale_min_k4). */
static inline void gpe__scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

#endif
