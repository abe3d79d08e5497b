/*
 * elementwise: embedding lookup, SwiGLU, GELU-GLU, add, bias, scale,
 * soft-cap, F32 -> F16 (elementwise.cuh).
 * The formulas are the CPU ones of model.c (expf and an IEEE division: no
 * fast-math), so values differ from the CPU only by the last bits of expf.
 */
#include "engine/cuda/elementwise.cuh"

#include "engine/cuda/dequant.cuh"
#include "engine/cuda/mmvq.cuh"

#define EW_THREADS 256

/* Block t dequantizes row tokens[t] into x + t * n_cols, one chunk per
 * thread iteration. */
template <typename T>
__global__ void embed_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int64_t n_cols,
                             const int32_t *__restrict__ tokens, float *__restrict__ x)
{
    const int t = blockIdx.x;
    const uint8_t *wr = W + (size_t)tokens[t] * row_bytes;
    float *o = x + (int64_t)t * n_cols;
    const int n_chunks = (int)(n_cols / T::BLK * T::CPB);
    for (int ci = threadIdx.x; ci < n_chunks; ci += blockDim.x) {
        const int blk = ci / T::CPB, c = ci % T::CPB;
        float v[T::VALS];
        int col[T::VALS / 4];
        T::load(wr + (size_t)blk * T::BYTES, c, v, col);
        float *ob = o + (int64_t)blk * T::BLK;
#pragma unroll
        for (int g = 0; g < T::VALS / 4; g++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                ob[col[g] + e] = v[4 * g + e];
    }
}

gpe_status gpe_cuda_embed(const gpe_cuda_weight *w, const int32_t *tokens, int n_tok, float *x,
                          cudaStream_t stream, char *err, size_t errlen)
{
    if (n_tok <= 0)
        return GPE_OK;
    if (!gpe_cuda_weight_ok(w->type, w->n_cols))
        return gpe_cuda_seterr(err, errlen, "embedding: type %s with %lld columns unsupported",
                               gpe_type_name(w->type), (long long)w->n_cols);
    gpe_cuda_dispatch_type(w->type, [&](auto tr) {
        embed_kernel<decltype(tr)><<<n_tok, 128, 0, stream>>>(w->data, w->row_bytes, w->n_cols,
                                                              tokens, x);
    });
    CUDA_CHECK_LAUNCH();
    return GPE_OK;
}

/* silu(g) * u, shared by the two SwiGLU kernels so the fused one computes
 * the same bits. */
static __device__ __forceinline__ float swiglu_val(float g, float u)
{
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

__global__ void swiglu_kernel(float *__restrict__ gate, const float *__restrict__ up, int64_t n)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        gate[i] = swiglu_val(gate[i], up[i]);
}

/* n % 32 == 0 and EW_THREADS % 32 == 0: each warp is one whole block of 32
 * values, all in range or all out (gpe_cuda_q8_put's shuffles). */
__global__ void swiglu_q8_kernel(const float *__restrict__ gate, const float *__restrict__ up,
                                 int64_t n, int8_t *__restrict__ xq, float *__restrict__ xqd)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    gpe_cuda_q8_put(swiglu_val(gate[i], up[i]), i, xq, xqd);
}

void gpe_cuda_swiglu_q8(const float *gate, const float *up, int64_t n, int8_t *xq, float *xqd,
                        cudaStream_t stream)
{
    if (n > 0)
        swiglu_q8_kernel<<<gpe_cuda_div_up((size_t)n, EW_THREADS), EW_THREADS, 0, stream>>>(
            gate, up, n, xq, xqd);
}

void gpe_cuda_swiglu(float *gate, const float *up, int64_t n, cudaStream_t stream)
{
    if (n > 0)
        swiglu_kernel<<<gpe_cuda_div_up((size_t)n, EW_THREADS), EW_THREADS, 0, stream>>>(gate,
                                                                                         up, n);
}

__global__ void add_kernel(float *__restrict__ x, const float *__restrict__ y, int64_t n)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] += y[i];
}

void gpe_cuda_add(float *x, const float *y, int64_t n, cudaStream_t stream)
{
    if (n > 0)
        add_kernel<<<gpe_cuda_div_up((size_t)n, EW_THREADS), EW_THREADS, 0, stream>>>(x, y, n);
}

__global__ void f32_to_f16_kernel(const float *__restrict__ src, __half *__restrict__ dst,
                                  int64_t n)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dst[i] = __float2half_rn(src[i]);
}

void gpe_cuda_f32_to_f16(const float *src, __half *dst, int64_t n, cudaStream_t stream)
{
    if (n > 0)
        f32_to_f16_kernel<<<gpe_cuda_div_up((size_t)n, EW_THREADS), EW_THREADS, 0, stream>>>(
            src, dst, n);
}

static __device__ __forceinline__ float gelu_f16(float x)
{
    if (x <= -10.0f)
        return 0.0f;
    if (x >= 10.0f)
        return x;
    const float xr = __half2float(__float2half_rn(x));
    const float inner = __fmul_rn(__fmul_rn(0.79788456080286535587989211986876f, xr),
                                  __fadd_rn(1.0f, __fmul_rn(__fmul_rn(0.044715f, xr), xr)));
    const float y = __fmul_rn(__fmul_rn(0.5f, xr), __fadd_rn(1.0f, tanhf(inner)));
    return __half2float(__float2half_rn(y));
}

__global__ void geglu_kernel(float *__restrict__ gate, const float *__restrict__ up, int64_t n)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        gate[i] = __fmul_rn(gelu_f16(gate[i]), up[i]);
}

void gpe_cuda_geglu(float *gate, const float *up, int64_t n, cudaStream_t stream)
{
    if (n > 0)
        geglu_kernel<<<gpe_cuda_div_up((size_t)n, EW_THREADS), EW_THREADS, 0, stream>>>(gate,
                                                                                        up, n);
}

__global__ void add_bias_kernel(float *__restrict__ x, const float *__restrict__ b,
                                int64_t n, int n_cols)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] += b[i % n_cols];
}

void gpe_cuda_add_bias(float *x, const float *b, int n_rows, int n_cols, cudaStream_t stream)
{
    const int64_t n = (int64_t)n_rows * n_cols;
    if (n > 0)
        add_bias_kernel<<<gpe_cuda_div_up((size_t)n, EW_THREADS), EW_THREADS, 0, stream>>>(
            x, b, n, n_cols);
}

__global__ void scale_kernel(float *__restrict__ x, float s, int64_t n)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = __fmul_rn(x[i], s);
}

void gpe_cuda_scale(float *x, float s, int64_t n, cudaStream_t stream)
{
    if (n > 0)
        scale_kernel<<<gpe_cuda_div_up((size_t)n, EW_THREADS), EW_THREADS, 0, stream>>>(x, s, n);
}

__global__ void softcap_kernel(float *__restrict__ x, float cap, float inv, int64_t n)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = __fmul_rn(cap, tanhf(__fmul_rn(x[i], inv)));
}

void gpe_cuda_softcap(float *x, float cap, int64_t n, cudaStream_t stream)
{
    if (n > 0)
        softcap_kernel<<<gpe_cuda_div_up((size_t)n, EW_THREADS), EW_THREADS, 0, stream>>>(
            x, cap, 1.0f / cap, n);
}
