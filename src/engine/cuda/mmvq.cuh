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

/* The rounding of one activation value v, element i of the rounded rows:
 * xq[i] = round(v / d), and xqd[i / 32] = d from the lane holding the
 * block's first value, d = max|x| / 127 over the block. The 32 lanes of a
 * full warp must call it together, lane k with element 32m + k of the same
 * block m (full-mask shuffles). The division is the IEEE one (__fdiv_rn)
 * and roundf rounds half away from zero, as the host reference q8_round
 * (selftest.c) does, so both give the same bytes. q8_kernel (mmvq.cu) and
 * the fused RMSNorm / SwiGLU kernels (norm.cu, elementwise.cu) share it, so
 * a fused kernel rounds exactly as the separate kernel would. */
static __device__ __forceinline__ void gpe_cuda_q8_put(float v, int64_t i, int8_t *xq,
                                                       float *xqd)
{
    float a = fabsf(v);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, off));
    const float d = __fdiv_rn(a, 127.0f);
    int q = d == 0.0f ? 0 : (int)roundf(__fdiv_rn(v, d));
    q = q > 127 ? 127 : (q < -127 ? -127 : q);
    xq[i] = (int8_t)q;
    if ((i & (GPE_CUDA_Q8_BLK - 1)) == 0)
        xqd[i / GPE_CUDA_Q8_BLK] = d;
}

/* true when the dp4a kernels take weights of type t (and the legacy kernel
 * was not asked for with GPUPOOL_CUDA_MMV=legacy, read once per process). */
bool gpe_cuda_mmvq_takes(gpe_type t);

/* Rounds the n_tok activation rows x (n_cols each, n_cols % 32 == 0) into
 * mm->xq / mm->xqd. The caller checked that mm->xq holds n_tok * n_cols
 * values. */
void gpe_cuda_mmvq_quantize(const gpe_cuda_mm *mm, const float *x, int n_tok, int64_t n_cols);

/* y = x W^T as gpe_cuda_matmul, from the activations gpe_cuda_mmvq_quantize
 * left in mm->xq (n_cols = w->n_cols); add: y += x W^T instead (the
 * residual add folded into the mat-vec: each output is y + s, the value
 * and rounding of a separate gpe_cuda_add of s). The caller checked
 * gpe_cuda_mmvq_takes(w->type) and 1 <= n_tok <= GPE_CUDA_MMV_MAX. */
void gpe_cuda_mmvq(const gpe_cuda_mm *mm, const gpe_cuda_weight *w, int n_tok, float *y,
                   int64_t ldy, bool add);

#define GPE_CUDA_MMVQ_GROUP 3   /* most weights of one gpe_cuda_mmvq_n launch */

/* gpe_cuda_mmvq of n_w (1..GPE_CUDA_MMVQ_GROUP) weights of one type and
 * one n_cols on the same rounded activations, y[k] = x w[k]^T with leading
 * dimension ldy[k], in one launch (Q/K/V, gate/up): the grid covers the
 * weights' rows in order, each row computed as gpe_cuda_mmvq computes it
 * (the same bits). */
void gpe_cuda_mmvq_n(const gpe_cuda_mm *mm, const gpe_cuda_weight *const *w, int n_w,
                     int n_tok, float *const *y, const int64_t *ldy, bool add);

#endif
