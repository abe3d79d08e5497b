/*
 * attention (attention.cuh). One block of ATTN_WARPS warps per (token,
 * head). Warp w visits keys w, w + ATTN_WARPS, ... with an online softmax
 * (running max m, running sum l, running weighted sum acc of V rows), lane
 * j holding dims j, j+32, ... of q and acc. The warps' partial results are
 * then merged in shared memory:
 *
 *   M = max_w m_w,  L = sum_w l_w e^(m_w - M),  out = sum_w acc_w e^(m_w - M) / L
 *
 * Warp 0 always sees the first visible key, so M is finite; a warp that saw no key has
 * m = -inf and contributes e^-inf = 0.
 */
#include "engine/cuda/attention.cuh"

#include <math.h>

#define ATTN_WARPS 4
#define ATTN_DPL (GPE_CUDA_MAX_HEAD_DIM / GPE_WARP)   /* dims per lane */

static __device__ __forceinline__ float load(const float *p) { return *p; }
static __device__ __forceinline__ float load(const __half *p) { return __half2float(*p); }
/* q as the dot product sees it: F16-rounded with an F16 cache. */
static __device__ __forceinline__ float qval(float x, const float *) { return x; }
static __device__ __forceinline__ float qval(float x, const __half *)
{
    return __half2float(__float2half_rn(x));
}

template <typename T>
__global__ void __launch_bounds__(ATTN_WARPS *GPE_WARP) attention_kernel(gpe_cuda_attn_args a)
{
    __shared__ float s_m[ATTN_WARPS], s_l[ATTN_WARPS];
    __shared__ float s_acc[ATTN_WARPS][GPE_CUDA_MAX_HEAD_DIM];
    const int t = blockIdx.x, h = blockIdx.y;
    const int lane = threadIdx.x % GPE_WARP, warp = threadIdx.x / GPE_WARP;
    const int hd = a.head_dim, group = a.n_head / a.n_head_kv, kvh = h / group;
    const int kvd = a.n_head_kv * hd;
    const int p = a.pos[t], s = a.seq[t];
    const float scale = a.scale;
    const float inv_cap = a.softcap > 0.0f ? 1.0f / a.softcap : 0.0f;
    const int i0 = a.window > 0 && p - a.window + 1 > 0 ? p - a.window + 1 : 0;

    const float *q = a.q + ((size_t)t * a.n_head + h) * hd;
    float qv[ATTN_DPL], acc[ATTN_DPL];
#pragma unroll
    for (int k = 0; k < ATTN_DPL; k++) {
        const int d = lane + GPE_WARP * k;
        qv[k] = d < hd ? qval(q[d], static_cast<const T *>(nullptr)) : 0.0f;
        acc[k] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const size_t base = (size_t)s * (size_t)a.n_ctx * (size_t)kvd + (size_t)kvh * hd;
    for (int i = i0 + warp; i <= p; i += ATTN_WARPS) {
        const T *kr = static_cast<const T *>(a.k_cache) + base + (size_t)i * kvd;
        const T *vr = static_cast<const T *>(a.v_cache) + base + (size_t)i * kvd;
        float dot = 0.0f;
#pragma unroll
        for (int k = 0; k < ATTN_DPL; k++) {
            const int d = lane + GPE_WARP * k;
            if (d < hd)
                dot += qv[k] * load(kr + d);
        }
        float sc = warp_sum(dot) * scale;
        if (a.softcap > 0.0f)
            sc = a.softcap * tanhf(sc * inv_cap);
        const float m_new = fmaxf(m, sc);
        const float corr = expf(m - m_new);     /* 0 on the first key (m = -inf) */
        const float e = expf(sc - m_new);
        l = l * corr + e;
#pragma unroll
        for (int k = 0; k < ATTN_DPL; k++) {
            const int d = lane + GPE_WARP * k;
            if (d < hd)
                acc[k] = acc[k] * corr + e * load(vr + d);
        }
        m = m_new;
    }
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int k = 0; k < ATTN_DPL; k++) {
        const int d = lane + GPE_WARP * k;
        if (d < hd)
            s_acc[warp][d] = acc[k];
    }
    __syncthreads();

    float M = s_m[0];
    for (int w = 1; w < ATTN_WARPS; w++)
        M = fmaxf(M, s_m[w]);
    float L = 0.0f, f[ATTN_WARPS];
    for (int w = 0; w < ATTN_WARPS; w++) {
        f[w] = expf(s_m[w] - M);
        L += s_l[w] * f[w];
    }
    const float inv = 1.0f / L;
    float *out = a.out + ((size_t)t * a.n_head + h) * hd;
    for (int d = threadIdx.x; d < hd; d += ATTN_WARPS * GPE_WARP) {
        float o = 0.0f;
        for (int w = 0; w < ATTN_WARPS; w++)
            o += s_acc[w][d] * f[w];
        out[d] = o * inv;
    }
}

void gpe_cuda_attention(const gpe_cuda_attn_args *a, cudaStream_t stream)
{
    if (a->n_tok <= 0)
        return;
    const dim3 grid((unsigned)a->n_tok, (unsigned)a->n_head);
    if (a->f16)
        attention_kernel<__half><<<grid, ATTN_WARPS * GPE_WARP, 0, stream>>>(*a);
    else
        attention_kernel<float><<<grid, ATTN_WARPS * GPE_WARP, 0, stream>>>(*a);
}
