/*
 * mmq: Y = X W^T for small batches of 9..GPE_CUDA_MMQ_MAX tokens (a decode
 * step of many sequences, a short prompt) on F16 and quantized weights,
 * without materialising an F16 copy of W.
 *
 * The GEMM path (matmul.cuh) dequantizes every weight to F16 in global
 * memory and hands it to cuBLAS: a 7B step writes and reads back ~13 GB
 * of F16 for ~4 GB of Q4_K, whatever the batch. Here each block
 * dequantizes a 64-row x 128-column tile of W into shared memory (the same
 * readers as the rest of the backend, dequant.cuh, so the F16 values are
 * the GEMM path's), multiplies it with the matching tile of up to 32
 * F16 activation rows on the tensor cores (wmma 16x16x16, F32
 * accumulation) and moves on along K: W is read once per 32 tokens. The
 * columns are cut into splits (blockIdx.z) so that even a 4096-row matrix
 * fills the GPU; the splits' partial sums go to a scratch and are added in
 * a fixed order (deterministic results). Numerics are the GEMM path's (F16
 * weights and activations, F32 accumulation) up to the summation order.
 *
 * Internal to src/engine/cuda/.
 */
#ifndef GPE_CUDA_MMQ_CUH
#define GPE_CUDA_MMQ_CUH

#include "engine/cuda/matmul.cuh"

#define GPE_CUDA_MMQ_MAX 64   /* widest batch this path takes by default */

/* The widest batch the path takes: GPE_CUDA_MMQ_MAX, or
 * GPUPOOL_CUDA_MMQ_MAX when set (read once; 0 turns the path off). */
int gpe_cuda_mmq_max(void);

/* true when the path takes this weight for n_tok tokens (type, shape). */
bool gpe_cuda_mmq_takes(const gpe_cuda_weight *w, int n_tok);

/* The rule both small-batch paths (this one and mmq_i8.cuh) share: tokens
 * per block tile (32, or 64 past 32 tokens), and column splits of a product
 * with tiles of bm rows and steps of bk columns: enough blocks to fill the
 * GPU, at most 8 splits, each a whole number of steps (*steps_per). */
int gpe_cuda_mmq_tile_tokens(int n_tok);
int gpe_cuda_mmq_splits(int64_t n_rows, int64_t n_cols, int n_tok, int bm, int bk,
                        int *steps_per);

/* The splits' sum, both paths': y[t][r] = sum over the n_split parts of
 * part[s][t][r] (n_tok x n_rows each), in split order, on mm->stream. */
void gpe_cuda_mmq_reduce(const gpe_cuda_mm *mm, const float *part, int n_split, int n_tok,
                         int64_t n_rows, float *y, int64_t ldy);

/* Floats of split scratch the product of w with n_tok tokens needs (0:
 * none), on this path or the int8 one (mmq_i8.cuh). The caller sizes
 * mm->mmq_part with the largest over its weights and batch sizes; the
 * launches use the same rules. */
size_t gpe_cuda_mmq_part_floats(int64_t n_rows, int64_t n_cols, int n_tok);

/* y = x w^T on mm->stream; mm->xh must hold x converted to F16 (n_tok x
 * n_cols) and mm->mmq_part gpe_cuda_mmq_part_floats() floats. */
void gpe_cuda_mmq(const gpe_cuda_mm *mm, const gpe_cuda_weight *w, int n_tok, float *y,
                  int64_t ldy);

#endif
