/*
 * rope: RoPE + KV store (rope.cuh). One block per (token, head): blocks
 * 0..n_head-1 rotate a head of q in place (one thread per pair), blocks
 * n_head.. write a KV head: rotated k and plain v (one thread per element,
 * reading the scratch k, so no thread reads what another writes). A decode
 * step is n_head + n_head_kv blocks instead of one (a single block walking
 * every head serially was a quarter of a 7B decode step).
 *
 * Each block builds the cos/sin table of its token in shared memory, one
 * thread per pair: thread i runs the CPU's recurrence theta *= theta_scale
 * i times from pos, so the angles' rounding is model.c's exactly.
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
    const int t = blockIdx.x, head = blockIdx.y;
    const int p = a.pos[t], s = a.seq[t];
    const int hd = a.head_dim, n_rot = a.n_rot, half_rot = n_rot / 2;
    for (int j = threadIdx.x; j < half_rot; j += ROPE_THREADS) {
        float th = (float)p;
        for (int k = 0; k < j; k++)
            th = __fmul_rn(th, a.theta_scale);
        if (a.freqs)
            th = __fdiv_rn(th, a.freqs[j]);
        th = __fmul_rn(th, a.freq_scale);
        cs[2 * j] = cosf(th);
        cs[2 * j + 1] = sinf(th);
    }
    __syncthreads();

    if (head < a.n_head) {
        float *v = a.q + ((size_t)t * a.n_head + head) * hd;
        for (int u = threadIdx.x; u < half_rot; u += ROPE_THREADS) {
            const int i = 2 * u;
            /* pair i/2 uses cs[i], cs[i+1]; its elements are adjacent
             * (normal) or half a rotation apart (NEOX) */
            const int i0 = a.neox ? u : i, i1 = a.neox ? u + half_rot : i + 1;
            const float x0 = v[i0], x1 = v[i1], c = cs[i], sn = cs[i + 1];
            v[i0] = rot0(x0, x1, c, sn);
            v[i1] = rot1(x0, x1, c, sn);
        }
        return;
    }

    const int kvh = head - a.n_head, kvd = a.n_head_kv * hd;
    const float *k = a.k + (size_t)t * kvd + (size_t)kvh * hd;
    const float *vv = a.v + (size_t)t * kvd + (size_t)kvh * hd;
    const size_t row = ((size_t)s * (size_t)a.n_ctx + (size_t)p) * (size_t)kvd +
                       (size_t)kvh * hd;
    T *kc = static_cast<T *>(a.k_cache) + row, *vc = static_cast<T *>(a.v_cache) + row;
    for (int d = threadIdx.x; d < hd; d += ROPE_THREADS) {
        float out = k[d];
        if (d < n_rot && !a.neox) {
            const int d0 = d & ~1;                 /* first element of the pair */
            const float x0 = k[d0], x1 = k[d0 + 1], c = cs[d0], sn = cs[d0 + 1];
            out = (d & 1) ? rot1(x0, x1, c, sn) : rot0(x0, x1, c, sn);
        } else if (d < n_rot) {
            const bool second = d >= half_rot;     /* x1 of pair d - half_rot */
            const int pi = second ? d - half_rot : d;
            const float x0 = k[pi], x1 = k[pi + half_rot], c = cs[2 * pi], sn = cs[2 * pi + 1];
            out = second ? rot1(x0, x1, c, sn) : rot0(x0, x1, c, sn);
        }
        store(kc + d, out);
        store(vc + d, vv[d]);
    }
}

void gpe_cuda_rope_store(const gpe_cuda_rope_args *a, cudaStream_t stream)
{
    if (a->n_tok <= 0)
        return;
    const dim3 grid((unsigned)a->n_tok, (unsigned)(a->n_head + a->n_head_kv));
    if (a->f16)
        rope_store_kernel<__half><<<grid, ROPE_THREADS, 0, stream>>>(*a);
    else
        rope_store_kernel<float><<<grid, ROPE_THREADS, 0, stream>>>(*a);
}
