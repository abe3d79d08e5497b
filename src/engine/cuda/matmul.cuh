/*
 * matmul: Y = X W^T for one weight matrix on the device.
 *
 *   y[t*ldy + r] = sum_c W[r][c] * x[t*n_cols + c]    t < n_tok, r < n_rows
 *
 * Decode (n_tok <= GPE_CUDA_MMV_MAX): a mat-vec kernel, one warp per output
 * row, dequantizing the weight row on the fly and applying it to all n_tok
 * activation rows at once, so S sequences decoded together read each weight
 * once per step. Activations stay F32 (more precise than the CPU path, which
 * converts them to Q8_0/Q8_K/F16 first).
 *
 * Batches of 9..64 tokens on F16 and quantized weights: mmq.cuh (tiles
 * dequantized in shared memory, tensor cores), same numerics as the GEMM;
 * on Q4_0/Q8_0/Q4_K/Q6_K weights mmq_i8.cuh instead (int8 tensor cores on
 * the mat-vec's int8 activations, its numerics) unless
 * GPUPOOL_CUDA_MMQ_I8=0.
 *
 * Prefill (more tokens): cuBLAS GEMM. F32 weights are used in place (SGEMM
 * precision: cuBLAS default math, no TF32); BF16 weights are dequantized to
 * F32 (SGEMM); F16 and quantized weights are dequantized to F16 and the
 * activations converted to F16, with F32 accumulation (cublasGemmEx, as
 * llama.cpp's CUDA backend does). Dequantization goes through a bounded
 * buffer a slice of rows at a time, so no full F16 copy of a large matrix
 * (the output matrix of a big vocabulary) is ever needed.
 *
 * Internal to src/engine/cuda/.
 */
#ifndef GPE_CUDA_MATMUL_CUH
#define GPE_CUDA_MATMUL_CUH

#include "engine/cuda/common.cuh"

extern "C" {
#include "engine/quant.h"
}

#define GPE_CUDA_MMV_MAX 8   /* widest batch the mat-vec kernels take */

/* A weight matrix in VRAM (same bytes as in the GGUF file). */
typedef struct gpe_cuda_weight {
    const uint8_t *data;
    gpe_type type;
    int64_t n_cols;
    int64_t n_rows;
    size_t row_bytes;
} gpe_cuda_weight;

/* Scratch of the GEMM path (owned by the model; sizes fixed at upload). */
typedef struct gpe_cuda_mm {
    cublasHandle_t blas;
    cudaStream_t stream;
    void *wbuf;            /* dequantized slice of a weight matrix */
    size_t wbuf_bytes;
    __half *xh;            /* activations converted to F16 */
    size_t xh_elems;
    int8_t *xq;            /* activations rounded to int8 (mmvq.cuh), n_tok x n_cols */
    float *xqd;            /* their scales, one per 32 values */
    size_t xq_elems;       /* room in xq (0: the dp4a kernels are not used) */
    float *mmq_part;       /* split partial sums of the small-batch GEMM (mmq.cuh) */
    size_t mmq_part_elems; /* room in mmq_part */
} gpe_cuda_mm;

/* true when the backend has kernels for t and the row length suits them
 * (F32/F16/BF16 need n_cols % 4 == 0; block types whole blocks). */
bool gpe_cuda_weight_ok(gpe_type t, int64_t n_cols);

/* Runs the product on mm->stream. force_gemm: use the GEMM path even for
 * n_tok <= GPE_CUDA_MMV_MAX (self-test). */
gpe_status gpe_cuda_matmul(const gpe_cuda_mm *mm, const gpe_cuda_weight *w, const float *x,
                           int n_tok, float *y, int64_t ldy, bool force_gemm, char *err,
                           size_t errlen);

/* gpe_cuda_matmul of n_w weights (all with the same n_cols) on the same x:
 * y[i] = x w[i]^T with leading dimension ldy[i]. The int8 paths (dp4a
 * mat-vec, int8 small-batch GEMM) round x once for all of them (Q/K/V,
 * gate/up). */
gpe_status gpe_cuda_matmul_n(const gpe_cuda_mm *mm, const gpe_cuda_weight *const *w, int n_w,
                             const float *x, int n_tok, float *const *y, const int64_t *ldy,
                             char *err, size_t errlen);

/* true when gpe_cuda_matmul of n_tok rows would take the dp4a mat-vec
 * (mmvq.cuh): a type it knows, n_tok <= GPE_CUDA_MMV_MAX and room in
 * mm->xq for the rounded rows. */
bool gpe_cuda_matmul_rounds(const gpe_cuda_mm *mm, const gpe_cuda_weight *w, int n_tok);

/* Dequantizes rows [0, n_rows) of w into out (F32, row-major). */
gpe_status gpe_cuda_dequant_f32(const gpe_cuda_weight *w, float *out, cudaStream_t stream,
                                char *err, size_t errlen);

#endif
