/*
 * norm: RMSNorm (norm.cuh). One block per row: 1024 threads for rows of
 * 2048 values or more (a decode step normalises one row of n_embd, and 256
 * threads walking 4096 values serially made it a tenth of the step), 256
 * for shorter rows (per-head Q/K norms).
 */
#include "engine/cuda/norm.cuh"

#include "engine/cuda/mmvq.cuh"


static __device__ __forceinline__ double warp_sum_d(double v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Q8: also round the output rows to int8 blocks (xq/xqd, row t at t * n;
 * n % 32 == 0, so each warp's 32 consecutive values of one pass are one
 * whole block, all in range or all out). The sum and the scale are the
 * same code with the same thread count either way, so out and the rounded
 * bytes equal those of the separate kernels. */
template <int NORM_THREADS, bool Q8>
__global__ void __launch_bounds__(NORM_THREADS)
    rmsnorm_kernel(const float *x, const int *__restrict__ rows, const float *__restrict__ w,
                   float *out, int n, float eps, int8_t *__restrict__ xq,
                   float *__restrict__ xqd)
{
    __shared__ double partial[NORM_THREADS / GPE_WARP];
    __shared__ float s_scale;
    const int t = blockIdx.x;
    const int src = rows ? rows[t] : t;
    const float *xr = x + (size_t)src * (size_t)n;
    double sum = 0.0;
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) {
        const float v = xr[i];
        sum += (double)__fmul_rn(v, v);
    }
    sum = warp_sum_d(sum);
    if (threadIdx.x % GPE_WARP == 0)
        partial[threadIdx.x / GPE_WARP] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        double total = 0.0;
        for (int i = 0; i < NORM_THREADS / GPE_WARP; i++)
            total += partial[i];
        const float mean = (float)(total / n);
        s_scale = 1.0f / sqrtf(mean + eps);
    }
    __syncthreads();
    const float scale = s_scale;
    float *o = out + (size_t)t * (size_t)n;
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) {
        const float v = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
        o[i] = v;
        if (Q8)
            gpe_cuda_q8_put(v, (int64_t)t * n + i, xq, xqd);
    }
}

void gpe_cuda_rmsnorm(const float *x, const int *rows, const float *w, float *out, int n_rows,
                      int n, float eps, cudaStream_t stream)
{
    if (n_rows <= 0)
        return;
    if (n >= 2048)
        rmsnorm_kernel<1024, false><<<n_rows, 1024, 0, stream>>>(x, rows, w, out, n, eps, NULL,
                                                                 NULL);
    else
        rmsnorm_kernel<256, false><<<n_rows, 256, 0, stream>>>(x, rows, w, out, n, eps, NULL,
                                                               NULL);
}

void gpe_cuda_rmsnorm_q8(const float *x, const int *rows, const float *w, float *out,
                         int8_t *xq, float *xqd, int n_rows, int n, float eps,
                         cudaStream_t stream)
{
    if (n_rows <= 0)
        return;
    if (n >= 2048)
        rmsnorm_kernel<1024, true><<<n_rows, 1024, 0, stream>>>(x, rows, w, out, n, eps, xq,
                                                                xqd);
    else
        rmsnorm_kernel<256, true><<<n_rows, 256, 0, stream>>>(x, rows, w, out, n, eps, xq,
                                                              xqd);
}
