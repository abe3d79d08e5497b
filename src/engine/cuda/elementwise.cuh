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

/* The values gpe_cuda_swiglu would leave in gate, rounded to int8 blocks of
 * 32 for the dp4a mat-vec instead of stored: xq[i], xqd[i / 32] (the bytes
 * gpe_cuda_mmvq_quantize of them writes). gate is left as it is. n % 32 ==
 * 0. */
void gpe_cuda_swiglu_q8(const float *gate, const float *up, int64_t n, int8_t *xq, float *xqd,
                        cudaStream_t stream);

/* x[i] += y[i]. */
void gpe_cuda_add(float *x, const float *y, int64_t n, cudaStream_t stream);

/* gate[i] = gelu(gate[i]) * up[i], GELU in its tanh form evaluated through
 * F16 (input and result rounded to F16; exact tails beyond +-10), as
 * model.c and llama.cpp's CPU backend do (gemma). */
void gpe_cuda_geglu(float *gate, const float *up, int64_t n, cudaStream_t stream);

/* x[r][c] += b[c] for r < n_rows, c < n_cols (attention biases). */
void gpe_cuda_add_bias(float *x, const float *b, int n_rows, int n_cols, cudaStream_t stream);

/* x[i] *= s (gemma's embedding scale). */
void gpe_cuda_scale(float *x, float s, int64_t n, cudaStream_t stream);

/* x[i] = cap * tanh(x[i] / cap) (gemma2's final logit soft-capping). */
void gpe_cuda_softcap(float *x, float cap, int64_t n, cudaStream_t stream);

/* dst[i] = (half)src[i], round to nearest even. */
void gpe_cuda_f32_to_f16(const float *src, __half *dst, int64_t n, cudaStream_t stream);

#endif
