/*
 * norm: RMSNorm over rows, as model.c: sum of squares accumulated in double,
 * scale = 1 / sqrtf(mean + eps) in float, out = (x * scale) * w.
 *
 * Internal to src/engine/cuda/.
 */
#ifndef GPE_CUDA_NORM_CUH
#define GPE_CUDA_NORM_CUH

#include "engine/cuda/common.cuh"

/* out[t][:] = rmsnorm(x[src][:]) * w for t < n_rows, src = rows ? rows[t]
 * : t (rows: device array, used to gather the rows that want logits). out
 * may be x (in place, rows NULL): per-head Q/K norms and gemma's
 * post-norms. */
void gpe_cuda_rmsnorm(const float *x, const int *rows, const float *w, float *out, int n_rows,
                      int n, float eps, cudaStream_t stream);

/* gpe_cuda_rmsnorm (out not x) that also rounds out's rows to int8 blocks
 * of 32 for the dp4a mat-vec (mmvq.cuh): xq[t * n + i] and xqd[(t * n + i)
 * / 32], the bytes gpe_cuda_mmvq_quantize(out) would write, in the same
 * kernel (one launch and one read of out fewer). n % 32 == 0. */
void gpe_cuda_rmsnorm_q8(const float *x, const int *rows, const float *w, float *out,
                         int8_t *xq, float *xqd, int n_rows, int n, float eps,
                         cudaStream_t stream);

#endif
