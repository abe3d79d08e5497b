/*
 * quant: tensor element types (ggml numbering), block layouts, dequantization
 * and the dot products the CPU matmul is built from.
 *
 * Type numbers and block layouts are the GGUF/ggml facts (ggml.h, ggml-common.h
 * of llama.cpp); the code here is our own. Quantities:
 *
 *   type    block  bytes  layout of one block (little endian, no padding)
 *   F32       1      4    float
 *   F16       1      2    IEEE half
 *   BF16      1      2    upper 16 bits of a float
 *   Q4_0     32     18    f16 d; u8 qs[16]  x[j] = d*((qs[j]&15)-8), x[j+16] = d*((qs[j]>>4)-8)
 *   Q8_0     32     34    f16 d; i8 qs[32]  x[j] = d*qs[j]
 *   Q4_K    256    144    f16 d; f16 dmin; u8 scales[12]; u8 qs[128]
 *                         8 sub-blocks of 32 with 6-bit scale sc and min m packed in
 *                         scales (see get_scale_min_k4 in quant.c);
 *                         x = d*sc*q - dmin*m, q = 4-bit; per 64 values: 32 bytes of qs,
 *                         low nibbles = first 32 values, high nibbles = next 32
 *   Q5_K    256    176    f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]
 *                         as Q4_K plus a fifth bit from qh (bit 2*i / 2*i+1 per 64-chunk i)
 *   Q6_K    256    210    u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d
 *                         x = d*scales[k]*(q-32), q = 6-bit, 16 sub-blocks of 16
 *   Q8_K    256    292    f32 d; i8 qs[256]; i16 bsums[16] (sum of each 16 qs)
 *                         activation type only (for the K-quants)
 *
 * Other ggml types (Q4_1, Q5_0, Q2_K, IQ*, ...) are known by number, name,
 * block size and byte size so that a GGUF with them parses, but
 * gpe_type_supported() is false for them: no dequantize or dot product.
 *
 * Matmul building blocks (llama.cpp's scheme): each weight type has a
 * "vec_dot type" into which an activation row is converted once:
 *   F32 -> F32, F16 -> F16, BF16 -> F32, Q4_0 -> Q8_0, Q8_0 -> Q8_0,
 *   Q4_K / Q5_K / Q6_K -> Q8_K.
 * The activation quantizers follow ggml's x86 CPU rounding so that results
 * land close to llama.cpp's (Q8_0: d = amax/127 stored as f16, q =
 * round-half-even(x*127/amax); Q8_K: iscale = -127/max (max = the signed
 * value of largest magnitude), q = min(127, round-half-even(iscale*x)),
 * d = 1/iscale).
 *
 * Alignment: none required. Blocks are read through 2-byte (f16) and 4-byte
 * (f32 d of Q8_K, F32 data) fields; GGUF tensor data is 32-aligned and rows
 * are whole blocks, which satisfies that. Activation buffers should be
 * allocated with malloc (or better, 64-byte aligned) and rows laid out
 * act_row_bytes apart.
 *
 * Threading: everything here is pure and thread-safe except gpe_quant_set_isa
 * (tests only; call it while no other thread uses this module).
 */
#ifndef GPUPOOL_ENGINE_QUANT_H
#define GPUPOOL_ENGINE_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ggml type numbers (stable: they are what GGUF files store). */
typedef enum gpe_type {
    GPE_TYPE_F32 = 0,
    GPE_TYPE_F16 = 1,
    GPE_TYPE_Q4_0 = 2,
    GPE_TYPE_Q4_1 = 3,
    /* 4, 5: removed Q4_2 / Q4_3 */
    GPE_TYPE_Q5_0 = 6,
    GPE_TYPE_Q5_1 = 7,
    GPE_TYPE_Q8_0 = 8,
    GPE_TYPE_Q8_1 = 9,
    GPE_TYPE_Q2_K = 10,
    GPE_TYPE_Q3_K = 11,
    GPE_TYPE_Q4_K = 12,
    GPE_TYPE_Q5_K = 13,
    GPE_TYPE_Q6_K = 14,
    GPE_TYPE_Q8_K = 15,
    GPE_TYPE_IQ2_XXS = 16,
    GPE_TYPE_IQ2_XS = 17,
    GPE_TYPE_IQ3_XXS = 18,
    GPE_TYPE_IQ1_S = 19,
    GPE_TYPE_IQ4_NL = 20,
    GPE_TYPE_IQ3_S = 21,
    GPE_TYPE_IQ2_S = 22,
    GPE_TYPE_IQ4_XS = 23,
    GPE_TYPE_I8 = 24,
    GPE_TYPE_I16 = 25,
    GPE_TYPE_I32 = 26,
    GPE_TYPE_I64 = 27,
    GPE_TYPE_F64 = 28,
    GPE_TYPE_IQ1_M = 29,
    GPE_TYPE_BF16 = 30,
    /* 31..33: removed Q4_0_4_4 / Q4_0_4_8 / Q4_0_8_8 */
    GPE_TYPE_TQ1_0 = 34,
    GPE_TYPE_TQ2_0 = 35,
    /* 36..38: removed IQ4_NL_4_4 / _4_8 / _8_8 */
    GPE_TYPE_MXFP4 = 39,
    GPE_TYPE_COUNT = 40,
} gpe_type;

#define GPE_QK 32     /* elements per block of Q4_0 / Q8_0 */
#define GPE_QK_K 256  /* elements per block of the K-quants */

/* Block structs with the exact on-disk layout (sizes are checked with
 * _Static_assert in quant.c). d fields are f16 bit patterns. */
typedef struct gpe_block_q4_0 { uint16_t d; uint8_t qs[GPE_QK / 2]; } gpe_block_q4_0;
typedef struct gpe_block_q8_0 { uint16_t d; int8_t qs[GPE_QK]; } gpe_block_q8_0;
typedef struct gpe_block_q4_k {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qs[GPE_QK_K / 2];
} gpe_block_q4_k;
typedef struct gpe_block_q5_k {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qh[GPE_QK_K / 8];
    uint8_t qs[GPE_QK_K / 2];
} gpe_block_q5_k;
typedef struct gpe_block_q6_k {
    uint8_t ql[GPE_QK_K / 2];
    uint8_t qh[GPE_QK_K / 4];
    int8_t scales[GPE_QK_K / 16];
    uint16_t d;
} gpe_block_q6_k;
typedef struct gpe_block_q8_k {
    float d;
    int8_t qs[GPE_QK_K];
    int16_t bsums[GPE_QK_K / 16];
} gpe_block_q8_k;

/* --------------------------------------------------------------- traits */

/* true when t is a type number GGUF files may carry (has a size). */
bool gpe_type_known(uint32_t t);
/* true when dequantize_row and vec_dot are implemented for t:
 * F32, F16, BF16, Q4_0, Q8_0, Q4_K, Q5_K, Q6_K. */
bool gpe_type_supported(uint32_t t);
/* "F32", "Q4_K", ...; "unknown" for an unknown number. Static string. */
const char *gpe_type_name(uint32_t t);
/* Elements per block (1 for F32/F16/...); 0 for an unknown type. */
int64_t gpe_type_block_size(uint32_t t);
/* Bytes per block; 0 for an unknown type. */
size_t gpe_type_block_bytes(uint32_t t);
/* Bytes of a row of n elements; 0 when t is unknown or n is not a multiple
 * of the block size (or n < 0). */
size_t gpe_row_size(uint32_t t, int64_t n);
/* The activation type that vec_dot of weight type t expects (see above);
 * only meaningful for supported t (returns F32 otherwise). */
gpe_type gpe_vec_dot_type(gpe_type t);

/* --------------------------------------------------------- conversions */

float gpe_fp16_to_fp32(uint16_t h);
uint16_t gpe_fp32_to_fp16(float f);       /* round to nearest even, like F16C */
float gpe_bf16_to_fp32(uint16_t h);
uint16_t gpe_fp32_to_bf16(float f);       /* round to nearest even, NaN kept quiet */

/* Dequantize n elements (n a multiple of the block size) of a supported
 * type. Bit-exact with ggml's reference dequantization. Returns false (and
 * writes nothing) for an unsupported type or bad n. */
bool gpe_dequantize_row(gpe_type t, const void *src, float *dst, int64_t n);

/* Quantize n floats into type t. Supported targets: F32, F16, BF16, Q8_0,
 * Q4_0, Q4_K, Q5_K, Q6_K, Q8_K (Q8_0/Q8_K as described above; the others
 * with a simple, deterministic per-block scale/min fit: good enough for
 * random test and benchmark models, not llama.cpp's quality search). Returns false otherwise. */
bool gpe_quantize_row(gpe_type t, const float *x, void *dst, int64_t n);

/* ------------------------------------------------------------- matmul */

/* Convert an activation row once for weight type wt: writes
 * gpe_row_size(gpe_vec_dot_type(wt), n) bytes to dst. n must be a multiple
 * of wt's block size. Returns false for an unsupported wt or bad n. */
bool gpe_quantize_row_act(gpe_type wt, const float *x, void *dst, int64_t n);

/* Dot product of one weight row (n elements of type wt) with an activation
 * row already converted by gpe_quantize_row_act(wt, ...). wt must be
 * supported and n a multiple of its block size (not checked: this is the
 * hot loop; the GGUF reader guarantees it for tensor rows). */
float gpe_vec_dot(gpe_type wt, int64_t n, const void *wrow, const void *act);

/* out[t*ldo + r] = dot(W row r, activation row t) for r in [row_begin,
 * row_end), t in [0, n_tok). W points at row 0 of a weight matrix of type wt
 * with n_cols elements per row (rows are gpe_row_size(wt, n_cols) apart);
 * act row t starts at (const char *)act + t*act_row_bytes. The loop is
 * blocked so that each weight row is read once for all n_tok activations
 * (decode of several sequences shares the pass over the weights; the
 * AVX-512 kernels take up to 4 tokens per pass). Each out value is
 * bit-identical to gpe_vec_dot of that row and token, whatever n_tok and the
 * row range are: results do not depend on batching or thread split. Thread
 * callers split [0, n_rows) into disjoint ranges. */
void gpe_matmul_rows(gpe_type wt, const void *W, int64_t row_begin, int64_t row_end,
                     int64_t n_cols, const void *act, int n_tok, size_t act_row_bytes,
                     float *out, int64_t ldo);

/* ------------------------------------------------------- packed weights */

/* Row-interleaved copies of a weight matrix for the CPU matmul (what a
 * repack at load buys: the kernel needs no per-call unpacking or
 * transposing, and one-token decode reads 8 rows per vector). Q4_0, Q4_K,
 * Q5_K and Q6_K have a packed form. Per group of 8 rows g and block i, at
 * byte (g * nb + i) * B (nb blocks per row), "words [J][r]" meaning the
 * little-endian 32-bit word J of row r's field, rows innermost:
 *   Q4_0 (B = 144):  d[8] f16; qs words [4][8] (low nibbles of word j:
 *                    values 4j..4j+3, high: 16+4j..16+4j+3)
 *   Q4_K (B = 1184): d[8], dmin[8] f16; scale[8 sub-blocks][8 rows] and
 *                    min[8][8] (6-bit, unpacked to bytes); qs words [32][8]
 *   Q5_K (B = 1440): as Q4_K with qh words [8][8] before the qs words
 *   Q6_K (B = 1680): d[8] f16; scales[16][8] int8; then per half h and
 *                    word j < 8: ql words 16h+j and 16h+8+j, qh word 8h+j
 *                    (each [8 rows]), in the order the kernel reads them
 * The same bytes as the rows (Q4_K/Q5_K: 32 more per group-block, +2.8 %,
 * for the unpacked scales). Rows after the last whole group are not packed.
 *
 * Bytes gpe_pack_rows writes for n_rows x n_cols of type t, or 0 when t
 * has no packed form or there is no whole group of 8 rows. */
size_t gpe_pack_size(gpe_type t, int64_t n_rows, int64_t n_cols);
/* Packs the whole groups of W (rows gpe_row_size(t, n_cols) apart) into dst
 * (gpe_pack_size bytes). Returns false when t has no packed form. */
bool gpe_pack_rows(gpe_type t, const void *W, int64_t n_rows, int64_t n_cols, void *dst);
/* gpe_matmul_rows over [row_begin, row_end) of W, using P (W packed by
 * gpe_pack_rows) for the whole groups inside the range; other rows, and
 * every row when the ISA in use has no packed kernel, come from W. Outputs
 * are bit-identical to gpe_matmul_rows (hence to gpe_vec_dot). Threads
 * should split on multiples of 8 rows. */
void gpe_matmul_packed(gpe_type t, const void *P, const void *W, int64_t row_begin,
                       int64_t row_end, int64_t n_cols, const void *act, int n_tok,
                       size_t act_row_bytes, float *out, int64_t ldo);

/* ---------------------------------------------------------------- ISA */

typedef enum gpe_isa { GPE_ISA_SCALAR = 0, GPE_ISA_AVX2 = 1, GPE_ISA_AVX512 = 2 } gpe_isa;

/* Best ISA this CPU supports (detected once). */
gpe_isa gpe_quant_best_isa(void);
/* ISA currently used by gpe_vec_dot / gpe_matmul_rows. */
gpe_isa gpe_quant_isa(void);
/* For tests and benchmarks: force an ISA path. Returns false (and changes
 * nothing) when the CPU or the build lacks it. Not thread-safe. */
bool gpe_quant_set_isa(gpe_isa isa);
/* "avx512", "avx2" or "scalar". */
const char *gpe_isa_name(gpe_isa isa);

#endif
