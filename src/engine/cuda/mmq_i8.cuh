/*
 * mmq_i8: Y = X W^T for batches of 9..GPE_CUDA_MMQ_MAX tokens on Q4_0,
 * Q8_0, Q4_K and Q6_K weights, on the int8 tensor cores.
 *
 * The F16 small-batch GEMM (mmq.cuh) dequantizes weight tiles to F16 and
 * multiplies them with F16 activations (wmma). Here the activations are
 * the int8 blocks of the dp4a mat-vec (gpe_cuda_mmvq_quantize: 32 values,
 * one F32 scale each) and the weights stay integers too: a block unpacks
 * a 64-row x 256-column tile of W into int8 in shared memory (Q4_0: q - 8,
 * Q8_0: q, Q4_K: q in 0..15, Q6_K: q - 32) with one F32 scale per 32
 * values (per 16 for Q6_K) and, for Q4_K, one F32 minimum per 32, and
 * multiplies it with the int8 activations with mma.sync (m16n8k32 s8;
 * m16n8k16 for Q6_K's 16-value scales), s32 results per block of 32 (16)
 * columns, scaled and added in F32:
 *
 *   y += xd * (d_sub * sum(q * a) - m_sub * sum(a))
 *
 * (xd: the activation block's scale, a its int8 values; m_sub = 0 but for
 * Q4_K). Half the shared-memory bytes of the F16 tiles and twice the
 * tensor-core rate. The same column splits as mmq.cu, summed in a fixed
 * order: results are deterministic.
 *
 * Numerics: those of the dp4a mat-vec (the weights exact, the activations
 * rounded to int8 per 32 values; F32 sums), not the F16 GEMM's.
 *
 * Needs compute capability 8.0 (mma.sync s8 m16n8k32); GPUPOOL_CUDA_MMQ_I8=0
 * (read once) turns the path off and restores the F16 one.
 *
 * Internal to src/engine/cuda/.
 */
#ifndef GPE_CUDA_MMQ_I8_CUH
#define GPE_CUDA_MMQ_I8_CUH

#include "engine/cuda/matmul.cuh"

/* true when the int8 path takes weights of type t for batches the F16
 * small-batch GEMM would take (gpe_cuda_mmq_takes): a type it knows, a
 * device of compute capability >= 8.0, not turned off with
 * GPUPOOL_CUDA_MMQ_I8=0. */
bool gpe_cuda_mmq_i8_takes(gpe_type t);

/* Floats of split scratch the product needs (0: none); never more than
 * gpe_cuda_mmq_part_floats() of the same shape, which sizes mm->mmq_part. */
size_t gpe_cuda_mmq_i8_part_floats(int64_t n_rows, int64_t n_cols, int n_tok);

/* y = x w^T on mm->stream from the int8 activations that
 * gpe_cuda_mmvq_quantize left in mm->xq / mm->xqd (n_tok rows of
 * w->n_cols). The caller checked gpe_cuda_mmq_i8_takes(w->type), 1 <= n_tok
 * <= 64 and the room in mm->mmq_part. */
void gpe_cuda_mmq_i8(const gpe_cuda_mm *mm, const gpe_cuda_weight *w, int n_tok, float *y,
                     int64_t ldy);

#endif
