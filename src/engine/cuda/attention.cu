/*
 * attention (attention.cuh). Three kernels, chosen by shape:
 *
 * - decode (at most AT_D_MAX_TOK tokens, or more with decode_rows: the
 *   batches of a decode step):
 *   one block per (token, KV head, key split). The block's rows are the
 *   query heads of the token that share the KV head (GQA: K/V rows are read
 *   once for all of them); its AT_D_WARPS warps take interleaved tiles of
 *   AT_KEYS keys of the split and are merged in shared memory. A context of
 *   n_ctx positions is cut into splits of at least AT_D_CHUNK_MIN keys, so a
 *   long context keeps every SM busy (one token of a 7B model is 32 blocks
 *   without splits); the splits' partial results go to the caller's scratch
 *   and at_combine_kernel merges them. The split count depends on n_ctx and
 *   n_tok only, so a captured CUDA graph stays valid as positions grow;
 *   splits past a token's position exit at once.
 * - prefill (more tokens): one block of AT_P_WARPS warps per tile of
 *   (token, head) rows of one KV head; each warp owns RW rows. The block
 *   loads AT_KEYS keys at a time into shared memory (K, then V into the
 *   same buffer), so every K/V element is read once per tile of 8 x RW rows
 *   instead of once per row. Rows of another sequence in the same tile are
 *   done in a further pass over that sequence's keys.
 * - legacy (GPUPOOL_CUDA_ATTN=legacy, head sizes not a multiple of 4): one
 *   block per (token, head), one key per warp per step.
 *
 * Both tiled kernels share the per-warp step (at_scores, at_pv): lane j
 * computes the score of key j of the tile for each of the warp's rows (q
 * rows broadcast from shared memory, float4 at a time), then an online
 * softmax per row over the tile (running max m, sum l, weighted sum acc of
 * V rows; lane j holds dims 4j..4j+3 and 128+4j..), so the warp reductions
 * happen once per 32 keys instead of once per key. Merging partial states
 * (warps, splits) uses
 *
 *   M = max_w m_w,  L = sum_w l_w e^(m_w - M),  out = sum_w acc_w e^(m_w - M) / L
 *
 * where a part that saw no key has m = -inf and contributes 0. All math is
 * F32 with expf, as the CPU; q is rounded to F16 for q.k with an F16 cache.
 * Keys are read only up to the largest position of the rows, which the
 * batch or earlier ones have written (positions 0..pos of a sequence are
 * always filled before pos is decoded).
 */
#include "engine/cuda/attention.cuh"

#include <math.h>
#include <string.h>
#include <stdlib.h>
#include <climits>

/* ---------------------------------------------------------------- legacy
 *
 * One block of ATTN_WARPS warps per (token, head). Warp w visits keys w,
 * w + ATTN_WARPS, ... with an online softmax
 * (running max m, running sum l, running weighted sum acc of V rows), lane
 * j holding dims j, j+32, ... of q and acc. The warps' partial results are
 * then merged in shared memory:
 *
 *   M = max_w m_w,  L = sum_w l_w e^(m_w - M),  out = sum_w acc_w e^(m_w - M) / L
 *
 * Warp 0 always sees the first visible key, so M is finite; a warp that saw no key has
 * m = -inf and contributes e^-inf = 0.
 */

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
__global__ void __launch_bounds__(ATTN_WARPS *GPE_WARP) at_legacy_kernel(gpe_cuda_attn_args a)
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


/* ------------------------------------------------------- tiled kernels */

#define AT_KEYS 32           /* keys per tile: one per lane for q.k */
#define AT_P_WARPS 8         /* prefill: warps per block, each with its own rows */
#define AT_D_WARPS 4         /* decode: warps per block, splitting the keys */
#define AT_D_MAX_TOK 8       /* batches up to this many tokens take the decode kernel */
#define AT_D_CHUNK_MIN 256   /* decode: fewest keys per split */
#define AT_FULL 0xffffffffu

/* Four consecutive cache values as floats (p is 8- or 16-byte aligned:
 * head_dim and the offsets are multiples of 4). */
static __device__ __forceinline__ float4 ld4(const float *p)
{
    return *reinterpret_cast<const float4 *>(p);
}
static __device__ __forceinline__ float4 ld4(const __half *p)
{
    const uint2 u = *reinterpret_cast<const uint2 *>(p);
    const float2 a = __half22float2(*reinterpret_cast<const __half2 *>(&u.x));
    const float2 b = __half22float2(*reinterpret_cast<const __half2 *>(&u.y));
    return make_float4(a.x, a.y, b.x, b.y);
}

static __device__ __forceinline__ float4 f4_zero(void)
{
    return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

/* q[t][h][d..d+3] as q.k uses it (F16-rounded with an F16 cache). */
template <typename T>
static __device__ __forceinline__ float4 at_qload(const float *q, const T *)
{
    const float4 v = *reinterpret_cast<const float4 *>(q);
    return make_float4(qval(v.x, static_cast<const T *>(nullptr)),
                       qval(v.y, static_cast<const T *>(nullptr)),
                       qval(v.z, static_cast<const T *>(nullptr)),
                       qval(v.w, static_cast<const T *>(nullptr)));
}

/* The online-softmax state of a warp's RW rows; lane j holds dims
 * 128 c + 4 j .. +3 of acc for c < NC. */
template <int RW, int NC> struct at_state {
    float m[RW], l[RW];
    float4 acc[RW][NC];

    __device__ __forceinline__ void init()
    {
#pragma unroll
        for (int r = 0; r < RW; r++) {
            m[r] = -INFINITY;
            l[r] = 0.0f;
#pragma unroll
            for (int c = 0; c < NC; c++)
                acc[r][c] = f4_zero();
        }
    }
};

/* The key range [lo, hi] of token t's rows (hi < lo: none). */
static __device__ __forceinline__ void at_range(const gpe_cuda_attn_args &a, int t, int *lo,
                                                int *hi)
{
    const int p = a.pos[t];
    *lo = a.window > 0 && p - a.window + 1 > 0 ? p - a.window + 1 : 0;
    *hi = p;
}

/* The softmax update of at_scores (below) for the raw scores s of lane
 * key i. */
template <int RW, int NC>
static __device__ __forceinline__ void at_softmax(at_state<RW, NC> &st, float (&p)[RW],
                                                  const float (&s)[RW], const int (&lo)[RW],
                                                  const int (&hi)[RW], int i, float scale,
                                                  float softcap)
{
    const float inv_cap = softcap > 0.0f ? 1.0f / softcap : 0.0f;
#pragma unroll
    for (int r = 0; r < RW; r++) {
        const bool ok = i >= lo[r] && i <= hi[r];
        float sc = s[r] * scale;
        if (softcap > 0.0f)
            sc = softcap * tanhf(sc * inv_cap);
        sc = ok ? sc : -INFINITY;
        const float mn = fmaxf(st.m[r], warp_max(sc));
        p[r] = 0.0f;
        if (mn == -INFINITY)    /* warp-uniform: no key of this row yet */
            continue;
        const float corr = expf(st.m[r] - mn);   /* 0 on the row's first keys */
        p[r] = ok ? expf(sc - mn) : 0.0f;
        st.l[r] = st.l[r] * corr + warp_sum(p[r]);
        st.m[r] = mn;
#pragma unroll
        for (int c = 0; c < NC; c++) {
            st.acc[r][c].x *= corr;
            st.acc[r][c].y *= corr;
            st.acc[r][c].z *= corr;
            st.acc[r][c].w *= corr;
        }
    }
}

/* Scores of the tile's keys kb .. kb+31 (lane j: key kb + j, its K row read
 * by kf(d) as float4) for the warp's rows (q rows at qs, stride qstride
 * floats), and the softmax update: p[r] is this lane's key's weight, acc
 * is rescaled to the new maximum. Rows whose range misses the tile keep
 * p = 0. */
template <int RW, int NC, typename KF>
static __device__ __forceinline__ void at_scores(at_state<RW, NC> &st, float (&p)[RW],
                                                 const float *qs, int qstride,
                                                 const int (&lo)[RW], const int (&hi)[RW],
                                                 int kb, int hd, float scale, float softcap,
                                                 KF kf)
{
    float s[RW];
#pragma unroll
    for (int r = 0; r < RW; r++)
        s[r] = 0.0f;
    for (int d = 0; d < hd; d += 4) {
        const float4 k = kf(d);
#pragma unroll
        for (int r = 0; r < RW; r++) {
            const float4 q = *reinterpret_cast<const float4 *>(qs + r * qstride + d);
            s[r] += q.x * k.x + q.y * k.y + q.z * k.z + q.w * k.w;
        }
    }
    at_softmax(st, p, s, lo, hi, kb + threadIdx.x % GPE_WARP, scale, softcap);
}

/* at_scores with the K loads KU at a time ahead of their products (QS: the
 * largest head size, a multiple of 4 * KU): the loop above waits for each
 * load before it issues the next, so one tile of a 128-dim head cost 32
 * memory round trips; this costs QS / (4 KU). Same products in the same
 * order. */
template <int RW, int NC, int QS, typename KF>
static __device__ __forceinline__ void at_scores_u(at_state<RW, NC> &st, float (&p)[RW],
                                                   const float *qs, int qstride,
                                                   const int (&lo)[RW], const int (&hi)[RW],
                                                   int kb, int hd, float scale, float softcap,
                                                   KF kf)
{
    constexpr int KU = RW >= 4 ? 8 : 16;   /* fewer with many rows: registers */
    static_assert(QS % (4 * KU) == 0, "whole rounds of KU loads");
    float s[RW];
#pragma unroll
    for (int r = 0; r < RW; r++)
        s[r] = 0.0f;
#pragma unroll
    for (int d0 = 0; d0 < QS; d0 += 4 * KU) {
        if (d0 >= hd)   /* warp-uniform */
            break;
        float4 k[KU];
#pragma unroll
        for (int u = 0; u < KU; u++)
            k[u] = d0 + 4 * u < hd ? kf(d0 + 4 * u) : f4_zero();
#pragma unroll
        for (int u = 0; u < KU; u++) {
            if (d0 + 4 * u >= hd)   /* q past hd is not loaded */
                break;
#pragma unroll
            for (int r = 0; r < RW; r++) {
                const float4 q =
                    *reinterpret_cast<const float4 *>(qs + r * qstride + d0 + 4 * u);
                s[r] += q.x * k[u].x + q.y * k[u].y + q.z * k[u].z + q.w * k[u].w;
            }
        }
    }
    at_softmax(st, p, s, lo, hi, kb + threadIdx.x % GPE_WARP, scale, softcap);
}

/* acc += sum over the tile's keys kb .. min(kb+31, whi) of p_j V_j (V row
 * of key kb + j read by vf(j, d) as float4). */
template <int RW, int NC, typename VF>
static __device__ __forceinline__ void at_pv(at_state<RW, NC> &st, const float (&p)[RW], int kb,
                                             int whi, int hd, VF vf)
{
    const int lane = threadIdx.x % GPE_WARP;
    const int jn = whi - kb + 1 < AT_KEYS ? whi - kb + 1 : AT_KEYS;
    for (int j = 0; j < jn; j++) {
        float pj[RW];
#pragma unroll
        for (int r = 0; r < RW; r++)
            pj[r] = __shfl_sync(AT_FULL, p[r], j);
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int d = 128 * c + 4 * lane;
            if (d >= hd)
                continue;
            const float4 v = vf(j, d);
#pragma unroll
            for (int r = 0; r < RW; r++) {
                st.acc[r][c].x += pj[r] * v.x;
                st.acc[r][c].y += pj[r] * v.y;
                st.acc[r][c].z += pj[r] * v.z;
                st.acc[r][c].w += pj[r] * v.w;
            }
        }
    }
}

/* at_pv with the V loads of VU keys issued ahead of their products (at_pv
 * waits for each key's row before it loads the next: a 10-key context
 * cost 10 round trips); same products in the same order. */
template <int RW, int NC, typename VF>
static __device__ __forceinline__ void at_pv_u(at_state<RW, NC> &st, const float (&p)[RW],
                                               int kb, int whi, int hd, VF vf)
{
    constexpr int VU = RW >= 4 || NC > 1 ? 4 : 8;   /* registers */
    const int lane = threadIdx.x % GPE_WARP;
    const int jn = whi - kb + 1 < AT_KEYS ? whi - kb + 1 : AT_KEYS;
    for (int j0 = 0; j0 < jn; j0 += VU) {   /* jn is warp-uniform */
        float4 v[VU][NC];
#pragma unroll
        for (int u = 0; u < VU; u++)
#pragma unroll
            for (int c = 0; c < NC; c++) {
                const int d = 128 * c + 4 * lane;
                v[u][c] = j0 + u < jn && d < hd ? vf(j0 + u, d) : f4_zero();
            }
#pragma unroll
        for (int u = 0; u < VU; u++) {
            if (j0 + u >= jn)
                break;
            float pj[RW];
#pragma unroll
            for (int r = 0; r < RW; r++)
                pj[r] = __shfl_sync(AT_FULL, p[r], j0 + u);
#pragma unroll
            for (int c = 0; c < NC; c++) {
                if (128 * c + 4 * lane >= hd)
                    continue;
#pragma unroll
                for (int r = 0; r < RW; r++) {
                    st.acc[r][c].x += pj[r] * v[u][c].x;
                    st.acc[r][c].y += pj[r] * v[u][c].y;
                    st.acc[r][c].z += pj[r] * v[u][c].z;
                    st.acc[r][c].w += pj[r] * v[u][c].w;
                }
            }
        }
    }
}

/* out[d..] = acc / l for this lane's dims of row r. */
template <int RW, int NC>
static __device__ __forceinline__ void at_store(const at_state<RW, NC> &st, int r, float *out,
                                                int hd)
{
    const int lane = threadIdx.x % GPE_WARP;
    const float inv = 1.0f / st.l[r];
#pragma unroll
    for (int c = 0; c < NC; c++) {
        const int d = 128 * c + 4 * lane;
        if (d < hd) {
            const float4 v = st.acc[r][c];
            *reinterpret_cast<float4 *>(out + d) =
                make_float4(v.x * inv, v.y * inv, v.z * inv, v.w * inv);
        }
    }
}

/* ------------------------------------------------------------- prefill */

/* Block-wide: keys kb .. kb+nk-1 of one sequence's cache slice (src: the
 * sequence's position 0 at this KV head) into dst rows as F32; rows past nk
 * are zero. */
template <typename T, int QS>
static __device__ __forceinline__ void at_load_tile(float (*dst)[QS + 4], const T *src, int kb,
                                                    int nk, int kvd, int hd)
{
    const int n4 = hd / 4;
    for (int idx = threadIdx.x; idx < AT_KEYS * n4; idx += blockDim.x) {
        const int j = idx / n4, d = 4 * (idx % n4);
        const float4 v = j < nk ? ld4(src + (size_t)(kb + j) * kvd + d) : f4_zero();
        *reinterpret_cast<float4 *>(&dst[j][d]) = v;
    }
}

/* Rows of the block: g = blockIdx.x * 8 RW + warp * RW + r is (token
 * g / group, head kvh * group + g % group). QS: the largest head size of
 * the instance (q row stride). */
template <typename T, int RW, int QS>
__global__ void __launch_bounds__(AT_P_WARPS *GPE_WARP) at_prefill_kernel(gpe_cuda_attn_args a)
{
    constexpr int RB = AT_P_WARPS * RW, NC = QS / 128;
    __shared__ __align__(16) float s_q[RB][QS];
    __shared__ __align__(16) float s_kv[AT_KEYS][QS + 4];
    __shared__ int s_seq, s_lo, s_hi;
    const int lane = threadIdx.x % GPE_WARP, warp = threadIdx.x / GPE_WARP;
    const int hd = a.head_dim, group = a.n_head / a.n_head_kv, kvh = blockIdx.y;
    const int kvd = a.n_head_kv * hd, n_rows = a.n_tok * group, g0 = blockIdx.x * RB;

    for (int idx = threadIdx.x; idx < RB * (hd / 4); idx += blockDim.x) {
        const int r = idx / (hd / 4), d = 4 * (idx % (hd / 4)), g = g0 + r;
        float4 v = f4_zero();
        if (g < n_rows) {
            const int t = g / group, h = kvh * group + g % group;
            v = at_qload(a.q + ((size_t)t * a.n_head + h) * hd + d,
                         static_cast<const T *>(nullptr));
        }
        *reinterpret_cast<float4 *>(&s_q[r][d]) = v;
    }
    int rseq[RW], rlo[RW], rhi[RW], rt[RW];
    bool done[RW];
#pragma unroll
    for (int r = 0; r < RW; r++) {
        const int g = g0 + warp * RW + r;
        done[r] = g >= n_rows;
        rt[r] = done[r] ? 0 : g / group;
        rseq[r] = done[r] ? INT_MAX : a.seq[rt[r]];
        at_range(a, rt[r], &rlo[r], &rhi[r]);
    }
    const float *qs = &s_q[warp * RW][0];

    for (;;) {   /* one pass per sequence among the block's rows */
        if (threadIdx.x == 0) {
            s_seq = INT_MAX;
            s_lo = INT_MAX;
            s_hi = -1;
        }
        __syncthreads();
        if (lane == 0)
            for (int r = 0; r < RW; r++)
                if (!done[r])
                    atomicMin(&s_seq, rseq[r]);
        __syncthreads();
        const int cur = s_seq;
        if (cur == INT_MAX)
            break;
        int lo[RW], hi[RW], wlo = INT_MAX, whi = -1;
#pragma unroll
        for (int r = 0; r < RW; r++) {
            const bool act = !done[r] && rseq[r] == cur;
            lo[r] = act ? rlo[r] : 1;
            hi[r] = act ? rhi[r] : 0;
            if (act) {
                wlo = min(wlo, lo[r]);
                whi = max(whi, hi[r]);
            }
        }
        if (lane == 0 && whi >= 0) {
            atomicMin(&s_lo, wlo);
            atomicMax(&s_hi, whi);
        }
        __syncthreads();
        const int blo = s_lo, bhi = s_hi;
        const size_t base = (size_t)cur * a.n_ctx * kvd + (size_t)kvh * hd;
        const T *kc = static_cast<const T *>(a.k_cache) + base;
        const T *vc = static_cast<const T *>(a.v_cache) + base;
        at_state<RW, NC> st;
        st.init();
        float p[RW];
        for (int kb = blo; kb <= bhi; kb += AT_KEYS) {
            const int nk = bhi - kb + 1 < AT_KEYS ? bhi - kb + 1 : AT_KEYS;
            const bool mine = kb <= whi && kb + AT_KEYS - 1 >= wlo;   /* warp-uniform */
            at_load_tile<T, QS>(s_kv, kc, kb, nk, kvd, hd);
            __syncthreads();
            if (mine)
                at_scores<RW, NC>(st, p, qs, QS, lo, hi, kb, hd, a.scale, a.softcap,
                                  [&](int d) { return *reinterpret_cast<const float4 *>(
                                                   &s_kv[lane][d]); });
            __syncthreads();
            at_load_tile<T, QS>(s_kv, vc, kb, nk, kvd, hd);
            __syncthreads();
            if (mine)
                at_pv<RW, NC>(st, p, kb, whi, hd, [&](int j, int d) {
                    return *reinterpret_cast<const float4 *>(&s_kv[j][d]);
                });
            __syncthreads();
        }
#pragma unroll
        for (int r = 0; r < RW; r++)
            if (!done[r] && rseq[r] == cur) {
                const int g = g0 + warp * RW + r;
                const int h = kvh * group + g % group;
                at_store(st, r, a.out + ((size_t)rt[r] * a.n_head + h) * hd, hd);
                done[r] = true;
            }
        __syncthreads();   /* everyone has read s_seq/s_lo/s_hi */
    }
}

/* -------------------------------------------------------------- decode */

/* Block (token t, KV head, split z): the group's query heads RW at a time;
 * keys [max(lo, z chunk), min(hi, z chunk + chunk - 1)], warp w taking
 * tiles w, w + AT_D_WARPS, ... K rows are read by each lane from global
 * memory (a key's row is contiguous: the lane's loads over d walk it, and
 * the cache lines are shared through L1), V rows by the whole warp.
 * n_split 1: rows written to out; else (m, l, unnormalised acc) to the
 * scratch for at_combine_kernel.
 * FAST (GPUPOOL_CUDA_ATTN=short; off by default): a split that holds
 * none of the token's keys returns at once (its part is never read: the
 * combine takes the token's splits only), the split that holds all of them
 * writes out itself (the combine skips the token), and the K and V loads
 * are issued several at a time (at_scores_u, at_pv_u). ncu put a short
 * context (fewer than 10 keys) at 8.5 us per layer on an H200 without it;
 * the code shows why (not yet measured apart): every split loaded q,
 * merged and stored an empty part, and the one busy warp waited on ~40
 * dependent loads. Measured on an H200 (7B Q4_K_M, same run): tg128 356.0
 * with FAST against 347.5 without, but tg128 after 8,192 tokens of
 * context 192.1 against 216.4 (its unrolled loads take 88-179 registers
 * against 40-136: fewer blocks resident over a long context), so the
 * default stays without FAST until a variant wins at both. */
template <typename T, int RW, int NC, bool FAST>
__global__ void __launch_bounds__(AT_D_WARPS *GPE_WARP) at_decode_kernel(gpe_cuda_attn_args a,
                                                                        int chunk, int n_split)
{
    constexpr int QS = 128 * NC;   /* the largest head size of the instance */
    __shared__ __align__(16) float s_q[RW][QS];
    __shared__ __align__(16) float s_acc[AT_D_WARPS][RW][QS];
    __shared__ float s_m[AT_D_WARPS][RW], s_l[AT_D_WARPS][RW];
    const int lane = threadIdx.x % GPE_WARP, warp = threadIdx.x / GPE_WARP;
    const int t = blockIdx.x, kvh = blockIdx.y, z = blockIdx.z;
    const int hd = a.head_dim, group = a.n_head / a.n_head_kv, kvd = a.n_head_kv * hd;
    const int seq = a.seq[t];   /* loaded with pos, not after the exit below */
    int klo, khi;
    at_range(a, t, &klo, &khi);
    /* FAST: the token's keys all in this split (so it is the only one) */
    const bool whole = FAST && (n_split == 1 || klo / chunk == khi / chunk);
    klo = max(klo, z * chunk);
    khi = min(khi, z * chunk + chunk - 1);
    if (FAST && klo > khi)   /* block-uniform: no key here, nothing to write */
        return;
    const size_t base = (size_t)seq * a.n_ctx * kvd + (size_t)kvh * hd;
    const T *kc = static_cast<const T *>(a.k_cache) + base;
    const T *vc = static_cast<const T *>(a.v_cache) + base;
    float *part_acc = a.part;
    float2 *part_ml = reinterpret_cast<float2 *>(
        a.part + (size_t)GPE_CUDA_ATTN_PART_CAP * a.n_head * hd);

    for (int r0 = 0; r0 < group; r0 += RW) {
        const int nr = group - r0 < RW ? group - r0 : RW;
        for (int idx = threadIdx.x; idx < RW * (hd / 4); idx += blockDim.x) {
            const int r = idx / (hd / 4), d = 4 * (idx % (hd / 4));
            const int h = kvh * group + r0 + r;
            *reinterpret_cast<float4 *>(&s_q[r][d]) =
                r < nr ? at_qload(a.q + ((size_t)t * a.n_head + h) * hd + d,
                                  static_cast<const T *>(nullptr))
                       : f4_zero();
        }
        __syncthreads();
        int lo[RW], hi[RW];
#pragma unroll
        for (int r = 0; r < RW; r++) {
            lo[r] = r < nr ? klo : 1;
            hi[r] = r < nr ? khi : 0;
        }
        at_state<RW, NC> st;
        st.init();
        float p[RW];
        for (int kb = klo + AT_KEYS * warp; kb <= khi; kb += AT_KEYS * AT_D_WARPS) {
            const int i = kb + lane;
            const T *krow = kc + (size_t)i * kvd;
            const auto kf = [&](int d) { return i <= khi ? ld4(krow + d) : f4_zero(); };
            const auto vf = [&](int j, int d) { return ld4(vc + (size_t)(kb + j) * kvd + d); };
            if (FAST) {
                at_scores_u<RW, NC, QS>(st, p, &s_q[0][0], QS, lo, hi, kb, hd, a.scale,
                                        a.softcap, kf);
                at_pv_u<RW, NC>(st, p, kb, khi, hd, vf);
            } else {
                at_scores<RW, NC>(st, p, &s_q[0][0], QS, lo, hi, kb, hd, a.scale, a.softcap,
                                  kf);
                at_pv<RW, NC>(st, p, kb, khi, hd, vf);
            }
        }
#pragma unroll
        for (int r = 0; r < RW; r++) {
            if (lane == 0) {
                s_m[warp][r] = st.m[r];
                s_l[warp][r] = st.l[r];
            }
#pragma unroll
            for (int c = 0; c < NC; c++) {
                const int d = 128 * c + 4 * lane;
                if (d < hd)
                    *reinterpret_cast<float4 *>(&s_acc[warp][r][d]) = st.acc[r][c];
            }
        }
        __syncthreads();
        for (int idx = threadIdx.x; idx < nr * hd; idx += blockDim.x) {
            const int r = idx / hd, d = idx % hd, h = kvh * group + r0 + r;
            float M = s_m[0][r];
            for (int w = 1; w < AT_D_WARPS; w++)
                M = fmaxf(M, s_m[w][r]);
            float L = 0.0f, o = 0.0f;
            if (M != -INFINITY)   /* else: an empty split */
                for (int w = 0; w < AT_D_WARPS; w++) {
                    const float f = expf(s_m[w][r] - M);
                    L += s_l[w][r] * f;
                    o += s_acc[w][r][d] * f;
                }
            const size_t row = (size_t)t * a.n_head + h;
            if (n_split == 1 || whole) {
                a.out[row * hd + d] = o / L;
            } else {
                const size_t prow = (size_t)z * a.n_tok * a.n_head + row;
                part_acc[prow * hd + d] = o;
                if (d == 0)
                    part_ml[prow] = make_float2(M, L);
            }
        }
        __syncthreads();   /* s_q and s_acc are reused by the next heads */
    }
}

/* out[t][h] from the n_split partial results of (t, h). FAST: from the
 * splits that hold the token's keys only (the others wrote nothing), and
 * nothing when one split held them all (it wrote out). */
template <bool FAST>
__global__ void at_combine_kernel(gpe_cuda_attn_args a, int chunk, int n_split)
{
    const int t = blockIdx.x, h = blockIdx.y, hd = a.head_dim;
    const size_t row = (size_t)t * a.n_head + h, stride = (size_t)a.n_tok * a.n_head;
    const float2 *ml = reinterpret_cast<const float2 *>(
        a.part + (size_t)GPE_CUDA_ATTN_PART_CAP * a.n_head * hd);
    int z0 = 0, z1 = n_split - 1;
    if (FAST) {
        int lo, hi;
        at_range(a, t, &lo, &hi);
        z0 = lo / chunk;
        z1 = hi / chunk;
        if (z0 == z1)   /* block-uniform */
            return;
    }
    float M = -INFINITY;
    for (int z = z0; z <= z1; z++)
        M = fmaxf(M, ml[z * stride + row].x);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float L = 0.0f, o = 0.0f;
        for (int z = z0; z <= z1; z++) {
            const float2 v = ml[z * stride + row];
            if (v.x == -INFINITY)
                continue;
            const float f = expf(v.x - M);
            L += v.y * f;
            o += a.part[(z * stride + row) * hd + d] * f;
        }
        a.out[row * hd + d] = o / L;
    }
}

/* ---------------------------------------------------------------- host */

size_t gpe_cuda_attn_part_floats(int n_head, int head_dim)
{
    return (size_t)GPE_CUDA_ATTN_PART_CAP * (size_t)n_head * ((size_t)head_dim + 2);
}

/* GPUPOOL_CUDA_ATTN, read once per process: "legacy" (every shape on
 * at_legacy_kernel), "short" (the decode kernel with FAST), else the
 * default (the decode kernel without FAST). */
static const char *at_mode(void)
{
    static const char *mode = [] {
        const char *e = getenv("GPUPOOL_CUDA_ATTN");
        return e && strcmp(e, "legacy") == 0  ? "legacy"
               : e && strcmp(e, "short") == 0 ? "short"
                                              : "";
    }();
    return mode;
}

static bool at_legacy_only(void)
{
    return strcmp(at_mode(), "legacy") == 0;
}

template <typename T, int NC, bool FAST>
static void at_decode_rw(const gpe_cuda_attn_args *a, dim3 grid, int chunk, int n_split,
                         cudaStream_t stream)
{
    const int group = a->n_head / a->n_head_kv, nt = AT_D_WARPS * GPE_WARP;
    if (group >= 8)
        at_decode_kernel<T, 8, NC, FAST><<<grid, nt, 0, stream>>>(*a, chunk, n_split);
    else if (group >= 4)
        at_decode_kernel<T, 4, NC, FAST><<<grid, nt, 0, stream>>>(*a, chunk, n_split);
    else if (group >= 2)
        at_decode_kernel<T, 2, NC, FAST><<<grid, nt, 0, stream>>>(*a, chunk, n_split);
    else
        at_decode_kernel<T, 1, NC, FAST><<<grid, nt, 0, stream>>>(*a, chunk, n_split);
}

template <typename T, bool FAST>
static void at_decode_fast(const gpe_cuda_attn_args *a, dim3 grid, int chunk, int n_split,
                           cudaStream_t stream)
{
    if (a->head_dim <= 128)
        at_decode_rw<T, 1, FAST>(a, grid, chunk, n_split, stream);
    else
        at_decode_rw<T, 2, FAST>(a, grid, chunk, n_split, stream);
    if (n_split > 1)
        at_combine_kernel<FAST><<<dim3((unsigned)a->n_tok, (unsigned)a->n_head), 128, 0,
                                  stream>>>(*a, chunk, n_split);
}

template <typename T>
static void at_decode(const gpe_cuda_attn_args *a, cudaStream_t stream)
{
    /* Splits of at least AT_D_CHUNK_MIN keys, as many as the scratch holds
     * for this batch; the chunk a multiple of the block's key step. */
    int n_split = 1, chunk = a->n_ctx;
    if (a->part) {
        const int step = AT_KEYS * AT_D_WARPS;
        int want = (a->n_ctx + AT_D_CHUNK_MIN - 1) / AT_D_CHUNK_MIN;
        const int cap = GPE_CUDA_ATTN_PART_CAP / a->n_tok;
        if (want > cap)
            want = cap;
        if (want > 1) {
            chunk = (a->n_ctx + want - 1) / want;
            chunk = (chunk + step - 1) / step * step;
            n_split = (a->n_ctx + chunk - 1) / chunk;
        }
    }
    const dim3 grid((unsigned)a->n_tok, (unsigned)a->n_head_kv, (unsigned)n_split);
    if (strcmp(at_mode(), "short") == 0)
        at_decode_fast<T, true>(a, grid, chunk, n_split, stream);
    else
        at_decode_fast<T, false>(a, grid, chunk, n_split, stream);
}

template <typename T>
static void at_prefill(const gpe_cuda_attn_args *a, cudaStream_t stream)
{
    const int rows = a->n_tok * (a->n_head / a->n_head_kv);
    if (a->head_dim <= 128) {
        const dim3 grid(gpe_cuda_div_up((size_t)rows, AT_P_WARPS * 4), (unsigned)a->n_head_kv);
        at_prefill_kernel<T, 4, 128><<<grid, AT_P_WARPS * GPE_WARP, 0, stream>>>(*a);
    } else {
        const dim3 grid(gpe_cuda_div_up((size_t)rows, AT_P_WARPS), (unsigned)a->n_head_kv);
        at_prefill_kernel<T, 1, 256><<<grid, AT_P_WARPS * GPE_WARP, 0, stream>>>(*a);
    }
}

template <typename T> static void at_launch(const gpe_cuda_attn_args *a, cudaStream_t stream)
{
    if (at_legacy_only() || a->head_dim % 4 != 0) {
        const dim3 grid((unsigned)a->n_tok, (unsigned)a->n_head);
        at_legacy_kernel<T><<<grid, ATTN_WARPS * GPE_WARP, 0, stream>>>(*a);
    } else if (a->n_tok <= AT_D_MAX_TOK || a->decode_rows) {
        at_decode<T>(a, stream);
    } else {
        at_prefill<T>(a, stream);
    }
}

void gpe_cuda_attention(const gpe_cuda_attn_args *a, cudaStream_t stream)
{
    if (a->n_tok <= 0)
        return;
    if (a->f16)
        at_launch<__half>(a, stream);
    else
        at_launch<float>(a, stream);
}
