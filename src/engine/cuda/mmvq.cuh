/*
 * mmvq: decode mat-vec on quantized weights with 8-bit activations and
 * integer dot products (__dp4a), for Q4_0, Q8_0, Q4_K and Q6_K.
 *
 * The activation rows are first rounded to blocks of 32 int8 values with
 * one F32 scale each (d = max|x| / 127, q = round(x / d); the scheme of
 * ggml's Q8_0/Q8_1 and of the CPU backend's vec-dot paths), then each warp
 * takes one weight row, every lane reading 16 contiguous weight bytes at a
 * time (a 128-bit load where the block layout is 16-byte aligned) and
 * multiplying them with the matching int8 activations in integer
 * arithmetic; only the per-block scales are F32. This is what lets the
 * kernel run at the memory bound: the legacy kernel (matmul.cu) turns
 * every weight into a float first and reads the F32 activations, and is
 * still used for F32/F16/BF16/Q5_K weights and when GPUPOOL_CUDA_MMV=legacy.
 *
 * Numerics: the weights are used exactly (as dequantized by
 * gpe_dequantize_row); the activations carry the 8-bit rounding (relative
 * error up to 1/254 of the block maximum per value). q8_round (selftest.c)
 * is the same rounding on the host, so the self-test can compare the
 * kernel with a double-precision product of the dequantized weights and
 * the rounded activations at the F32 threshold.
 *
 * Internal to src/engine/cuda/.
 */
#ifndef GPE_CUDA_MMVQ_CUH
#define GPE_CUDA_MMVQ_CUH

#include "engine/cuda/matmul.cuh"

#define GPE_CUDA_Q8_BLK 32   /* activation values per int8 block */

/* true when the dp4a kernels take weights of type t (and the legacy kernel
 * was not asked for with GPUPOOL_CUDA_MMV=legacy, read once per process). */
bool gpe_cuda_mmvq_takes(gpe_type t);

/* Rounds the n_tok activation rows x (n_cols each, n_cols % 32 == 0) into
 * mm->xq / mm->xqd. The caller checked that mm->xq holds n_tok * n_cols
 * values. */
void gpe_cuda_mmvq_quantize(const gpe_cuda_mm *mm, const float *x, int n_tok, int64_t n_cols);

/* y = x W^T as gpe_cuda_matmul, from the activations gpe_cuda_mmvq_quantize
 * left in mm->xq (n_cols = w->n_cols). The caller checked
 * gpe_cuda_mmvq_takes(w->type) and 1 <= n_tok <= GPE_CUDA_MMV_MAX. */
void gpe_cuda_mmvq(const gpe_cuda_mm *mm, const gpe_cuda_weight *w, int n_tok, float *y,
                   int64_t ldy);

#endif
