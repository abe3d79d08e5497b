/*
 * rope: RoPE + KV store (rope.cuh). One block per token: thread 0 builds the
 * cos/sin table in shared memory exactly as model.c does (sequential
 * multiplication keeps the angles' rounding identical), then the block
 * rotates q in place (one thread per pair) and writes rotated k and plain v
 * to the cache (one thread per element, reading the scratch k, so no thread
 * reads what another writes).
 */
#include "engine/cuda/rope.cuh"

#define ROPE_THREADS 128

/* x0*c - x1*s and x0*s + x1*c without FMA contraction (as the CPU). */
static __device__ __forceinline__ float rot0(float x0, float x1, float c, float s)
{
    return __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
}
static __device__ __forceinline__ float rot1(float x0, float x1, float c, float s)
{
    return __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

static __device__ __forceinline__ void store(float *c, float x) { *c = x; }
static __device__ __forceinline__ void store(__half *c, float x) { *c = __float2half_rn(x); }

template <typename T>
__global__ void __launch_bounds__(ROPE_THREADS) rope_store_kernel(gpe_cuda_rope_args a)
{
    __shared__ float cs[GPE_CUDA_MAX_ROT];
    const int t = blockIdx.x;
    const int p = a.pos[t], s = a.seq[t];
    const int hd = a.head_dim, n_rot = a.n_rot;
    if (threadIdx.x == 0) {
        float theta = (float)p;
        for (int i = 0; i < n_rot; i += 2) {
            float th = theta;
            if (a.freqs)
                th = __fdiv_rn(th, a.freqs[i / 2]);
            th = __fmul_rn(th, a.freq_scale);
            cs[i] = cosf(th);
            cs[i + 1] = sinf(th);
            theta = __fmul_rn(theta, a.theta_scale);
        }
    }
    __syncthreads();

    const int half_rot = n_rot / 2;
    float *q = a.q + (size_t)t * (size_t)a.n_head * hd;
    for (int u = threadIdx.x; u < a.n_head * half_rot; u += ROPE_THREADS) {
        const int h = u / half_rot, i = 2 * (u % half_rot);
        float *v = q + (size_t)h * hd;
        /* pair i/2 uses cs[i], cs[i+1]; its elements are adjacent (normal)
         * or half a rotation apart (NEOX) */
        const int i0 = a.neox ? i / 2 : i, i1 = a.neox ? i / 2 + half_rot : i + 1;
        const float x0 = v[i0], x1 = v[i1], c = cs[i], sn = cs[i + 1];
        v[i0] = rot0(x0, x1, c, sn);
        v[i1] = rot1(x0, x1, c, sn);
    }

    const int kvd = a.n_head_kv * hd;
    const float *k = a.k + (size_t)t * kvd;
    const float *vv = a.v + (size_t)t * kvd;
    const size_t row = ((size_t)s * (size_t)a.n_ctx + (size_t)p) * (size_t)kvd;
    T *kc = static_cast<T *>(a.k_cache) + row, *vc = static_cast<T *>(a.v_cache) + row;
    for (int e = threadIdx.x; e < kvd; e += ROPE_THREADS) {
        const int d = e % hd;
        float out = k[e];
        if (d < n_rot && !a.neox) {
            const int e0 = e - (d & 1);            /* first element of the pair */
            const float x0 = k[e0], x1 = k[e0 + 1], c = cs[d & ~1], sn = cs[(d & ~1) + 1];
            out = (d & 1) ? rot1(x0, x1, c, sn) : rot0(x0, x1, c, sn);
        } else if (d < n_rot) {
            const bool second = d >= half_rot;     /* x1 of pair d - half_rot */
            const int pi = second ? d - half_rot : d;
            const int e0 = e - d + pi;
            const float x0 = k[e0], x1 = k[e0 + half_rot], c = cs[2 * pi], sn = cs[2 * pi + 1];
            out = second ? rot1(x0, x1, c, sn) : rot0(x0, x1, c, sn);
        }
        store(kc + e, out);
        store(vc + e, vv[e]);
    }
}

void gpe_cuda_rope_store(const gpe_cuda_rope_args *a, cudaStream_t stream)
{
    if (a->n_tok <= 0)
        return;
    if (a->f16)
        rope_store_kernel<__half><<<a->n_tok, ROPE_THREADS, 0, stream>>>(*a);
    else
        rope_store_kernel<float><<<a->n_tok, ROPE_THREADS, 0, stream>>>(*a);
}
