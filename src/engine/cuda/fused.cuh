/*
 * fused: the steps of a decode layer that run as fewer kernels when the
 * mat-vec after them is the dp4a one (mmvq.cuh), each with the separate
 * sequence as its fallback:
 *
 *   - RMSNorm and the int8 rounding of the mat-vec input in one kernel
 *     (gpe_cuda_rmsnorm_q8) instead of rmsnorm then q8_kernel;
 *   - the residual add folded into the mat-vec (y += W x written into the
 *     residual) instead of a mat-vec into scratch then gpe_cuda_add;
 *   - SwiGLU and the rounding of the down projection's input in one kernel
 *     (gpe_cuda_swiglu_q8) instead of swiglu then q8_kernel;
 *   - the mat-vecs after a norm (Q/K/V, gate/up) of one weight type in one
 *     launch (gpe_cuda_mmvq_n) instead of one launch each.
 *
 * Numerics: none change. The fused kernels compute each value with the
 * same operations in the same order (same thread counts for the RMSNorm
 * sums, the same rounding function gpe_cuda_q8_put, x + s as the add
 * kernel's), so the results are bit-identical to the separate kernels'
 * (the self-test checks it). fuse false (GPUPOOL_CUDA_FUSE=0, see
 * gpe_cuda_fuse_default) always takes the separate sequence.
 *
 * Internal to src/engine/cuda/.
 */
#ifndef GPE_CUDA_FUSED_CUH
#define GPE_CUDA_FUSED_CUH

#include "engine/cuda/matmul.cuh"

/* false when GPUPOOL_CUDA_FUSE=0 (read once per process: a running model's
 * captured graphs must not change under it). */
bool gpe_cuda_fuse_default(void);

/* xn[t] = rmsnorm(x[src]) * nw (n values; src = rows ? rows[t] : t, as
 * gpe_cuda_rmsnorm) for t < n_tok, then y[i] = xn w[i]^T for the n_w
 * weights (gpe_cuda_matmul_n; every w[i]->n_cols == n). Fused when every
 * weight takes the dp4a path: one kernel writes xn and its rounding, and
 * consecutive weights of one type share a mat-vec launch.
 * *fused (may be NULL) tells which sequence ran. */
gpe_status gpe_cuda_norm_matmul_n(const gpe_cuda_mm *mm, const float *x, const int *rows,
                                  const float *nw, int n, float eps, float *xn,
                                  const gpe_cuda_weight *const *w, int n_w, int n_tok,
                                  float *const *y, const int64_t *ldy, bool fuse, bool *fused,
                                  char *err, size_t errlen);

/* res[t][r] += (x w^T)[t][r] for t < n_tok, r < w->n_rows (res: rows of
 * w->n_rows values, the residual). Fused when w takes the dp4a path: the
 * mat-vec adds into res; otherwise the product goes to tmp (n_tok x
 * n_rows) and gpe_cuda_add adds it. */
gpe_status gpe_cuda_matmul_add(const gpe_cuda_mm *mm, const gpe_cuda_weight *w, const float *x,
                               int n_tok, float *res, float *tmp, bool fuse, bool *fused,
                               char *err, size_t errlen);

/* res += swiglu(gate, up) w^T (gate, up: n_tok rows of w->n_cols values).
 * Fused when w takes the dp4a path: one kernel computes SwiGLU and rounds
 * it for the mat-vec (gate is left unchanged), and the mat-vec adds into
 * res; otherwise gpe_cuda_swiglu into gate and gpe_cuda_matmul_add. */
gpe_status gpe_cuda_swiglu_matmul_add(const gpe_cuda_mm *mm, const gpe_cuda_weight *w,
                                      float *gate, const float *up, int n_tok, float *res,
                                      float *tmp, bool fuse, bool *fused, char *err,
                                      size_t errlen);

#endif
