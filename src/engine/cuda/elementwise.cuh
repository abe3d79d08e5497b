/*
 * elementwise: embedding lookup (dequantized rows of token_embd), SwiGLU,
 * residual add and F32 -> F16 conversion. Launched on the given stream;
 * launch errors are checked by the caller (CUDA_CHECK_LAUNCH).
 *
 * Internal to src/engine/cuda/.
 */
#ifndef GPE_CUDA_ELEMENTWISE_CUH
#define GPE_CUDA_ELEMENTWISE_CUH

#include "engine/cuda/common.cuh"
#include "engine/cuda/matmul.cuh"

/* x[t][:] = row tokens[t] of w, dequantized (F32), t < n_tok. tokens is a
 * device array of ids already checked to be in [0, w->n_rows). */
gpe_status gpe_cuda_embed(const gpe_cuda_weight *w, const int32_t *tokens, int n_tok, float *x,
                          cudaStream_t stream, char *err, size_t errlen);

/* gate[i] = silu(gate[i]) * up[i] = gate / (1 + exp(-gate)) * up. */
void gpe_cuda_swiglu(float *gate, const float *up, int64_t n, cudaStream_t stream);

/* x[i] += y[i]. */
void gpe_cuda_add(float *x, const float *y, int64_t n, cudaStream_t stream);

/* dst[i] = (half)src[i], round to nearest even. */
void gpe_cuda_f32_to_f16(const float *src, __half *dst, int64_t n, cudaStream_t stream);

#endif
