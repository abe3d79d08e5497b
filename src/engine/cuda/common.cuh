/*
 * common.cuh: shared helpers of the CUDA backend (host and device).
 *
 * Error handling: host functions of the backend return gpe_status and write
 * a message to the caller's err buffer. CUDA_CHECK / CUBLAS_CHECK turn a
 * failed runtime or cuBLAS call into GPE_ERR_BACKEND with the call's text
 * and the library's message (GPE_ERR_INSUFFICIENT_VRAM when it was out of
 * memory), and return from the enclosing function (which
 * must have `char *err, size_t errlen` in scope and return gpe_status).
 * Callers free what they own on that path (see forward.cu).
 *
 * Internal to src/engine/cuda/.
 */
#ifndef GPE_CUDA_COMMON_CUH
#define GPE_CUDA_COMMON_CUH

#include <cstddef>
#include <cstdint>

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "gpupool/engine.h"

/* Writes "what: message" into err (printf-style); returns GPE_ERR_BACKEND. */
gpe_status gpe_cuda_seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Same, with the status to return (GPE_ERR_INSUFFICIENT_VRAM for
 * out-of-memory errors, GPE_ERR_BACKEND for the rest). */
gpe_status gpe_cuda_seterr_st(gpe_status st, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define CUDA_CHECK(call)                                                                  \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess)                                                            \
            return gpe_cuda_seterr_st(e_ == cudaErrorMemoryAllocation                     \
                                          ? GPE_ERR_INSUFFICIENT_VRAM : GPE_ERR_BACKEND,  \
                                      err, errlen, "%s (%s:%d): %s", #call, __FILE__,     \
                                      __LINE__, cudaGetErrorString(e_));                  \
    } while (0)

#define CUBLAS_CHECK(call)                                                                \
    do {                                                                                  \
        cublasStatus_t s_ = (call);                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                  \
            return gpe_cuda_seterr_st(s_ == CUBLAS_STATUS_ALLOC_FAILED                    \
                                          ? GPE_ERR_INSUFFICIENT_VRAM : GPE_ERR_BACKEND,  \
                                      err, errlen, "%s (%s:%d): %s", #call, __FILE__,     \
                                      __LINE__, cublasGetStatusString(s_));               \
    } while (0)

/* Kernel launch check: launch-configuration errors surface immediately,
 * execution errors at the next synchronizing call. */
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

#define GPE_WARP 32

static inline unsigned gpe_cuda_div_up(size_t a, size_t b)
{
    return (unsigned)((a + b - 1) / b);
}

/* Sum over the 32 lanes of a warp; every lane gets the result. */
static __device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* IEEE half bits -> float (exact). */
static __device__ __forceinline__ float f16_bits_to_f32(uint16_t h)
{
    return __half2float(__ushort_as_half(h));
}

/* bfloat16 bits -> float (exact: the upper half of a float). */
static __device__ __forceinline__ float bf16_bits_to_f32(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

#endif
