/*
 * mmvq: dp4a mat-vec kernels (see mmvq.cuh for the scheme and numerics).
 */
#include "engine/cuda/mmvq.cuh"

#include <stdlib.h>
#include <string.h>

#include "engine/cuda/dequant.cuh"

#define MMVQ_WARPS 4   /* output rows (warps) per thread block */

bool gpe_cuda_mmvq_takes(gpe_type t)
{
    /* Read once (thread-safe static initialisation): the choice must not
     * change under a running model. */
    static const bool legacy = [] {
        const char *e = getenv("GPUPOOL_CUDA_MMV");
        return e && strcmp(e, "legacy") == 0;
    }();
    if (legacy)
        return false;
    return t == GPE_TYPE_Q4_0 || t == GPE_TYPE_Q8_0 || t == GPE_TYPE_Q4_K ||
           t == GPE_TYPE_Q6_K;
}

/* ------------------------------------------------ activation rounding */

/* One warp per block of 32 values (n % 32 == 0, so a warp is wholly in or
 * out of range and the full-mask shuffles are safe). */
static __global__ void q8_kernel(const float *__restrict__ x, int64_t n,
                                 int8_t *__restrict__ xq, float *__restrict__ xqd)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    gpe_cuda_q8_put(x[i], i, xq, xqd);
}

/* ------------------------------------------------------ weight readers */

/* Each reader handles one "unit" of a weight row (UPB units per block of
 * BLK values) for NC activation rows: xq/xqd point at the block's first
 * column in activation row 0; row j is ldq values (ldq / 32 scales)
 * further. The activation bytes of a unit are 16-byte aligned (xq starts
 * 256-byte aligned, ldq and the column offsets are multiples of 16). */

static __device__ __forceinline__ int4 ld_i4(const int8_t *p)
{
    return *reinterpret_cast<const int4 *>(p);
}

static __device__ __forceinline__ int dot4(int w0, int w1, int w2, int w3, int4 a)
{
    return __dp4a(w0, a.x, __dp4a(w1, a.y, __dp4a(w2, a.z, __dp4a(w3, a.w, 0))));
}

static __device__ __forceinline__ int sum4(int4 a)
{
    return dot4(0x01010101, 0x01010101, 0x01010101, 0x01010101, a);
}

/* Q4_0 (18 bytes, 2-byte aligned): one unit per block; low nibbles of
 * qs[i] are value i, high nibbles value 16 + i; x = d * (q - 8). */
struct qk_q4_0 {
    static constexpr gpe_type TYPE = GPE_TYPE_Q4_0;
    static constexpr int BLK = 32, BYTES = 18, UPB = 1;
    template <int NC>
    static __device__ __forceinline__ void dot(const uint8_t *b, int, const int8_t *xq,
                                               const float *xqd, int64_t ldq, float *acc)
    {
        const float d = f16_bits_to_f32(ld_u16(b));
        int lo[4], hi[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint32_t q = ld_u32_a2(b + 2 + 4 * k);
            lo[k] = (int)(q & 0x0F0F0F0Fu);
            hi[k] = (int)((q >> 4) & 0x0F0F0F0Fu);
        }
#pragma unroll
        for (int j = 0; j < NC; j++) {
            const int4 a0 = ld_i4(xq + j * ldq), a1 = ld_i4(xq + j * ldq + 16);
            const int s = dot4(lo[0], lo[1], lo[2], lo[3], a0) +
                          dot4(hi[0], hi[1], hi[2], hi[3], a1);
            const int sa = sum4(a0) + sum4(a1);
            acc[j] += d * xqd[j * (ldq / GPE_CUDA_Q8_BLK)] * (float)(s - 8 * sa);
        }
    }
};

/* Q8_0 (34 bytes, 2-byte aligned): one unit per block; x = d * q. */
struct qk_q8_0 {
    static constexpr gpe_type TYPE = GPE_TYPE_Q8_0;
    static constexpr int BLK = 32, BYTES = 34, UPB = 1;
    template <int NC>
    static __device__ __forceinline__ void dot(const uint8_t *b, int, const int8_t *xq,
                                               const float *xqd, int64_t ldq, float *acc)
    {
        const float d = f16_bits_to_f32(ld_u16(b));
        int q[8];
#pragma unroll
        for (int k = 0; k < 8; k++)
            q[k] = (int)ld_u32_a2(b + 2 + 4 * k);
#pragma unroll
        for (int j = 0; j < NC; j++) {
            const int4 a0 = ld_i4(xq + j * ldq), a1 = ld_i4(xq + j * ldq + 16);
            const int s = dot4(q[0], q[1], q[2], q[3], a0) + dot4(q[4], q[5], q[6], q[7], a1);
            acc[j] += d * xqd[j * (ldq / GPE_CUDA_Q8_BLK)] * (float)s;
        }
    }
};

/* The 6-bit scale and min of sub-block j (0..7) from scales[12] held as
 * three words (scale_min_k4's unpacking, on registers instead of bytes). */
static __device__ __forceinline__ void scale_min_k4_w(int j, uint32_t s0, uint32_t s1,
                                                      uint32_t s2, float &sc, float &m)
{
    /* byte k of scales[]: s0 holds 0..3, s1 4..7, s2 8..11 */
    if (j < 4) {
        sc = (float)(byte_of(s0, j) & 63);
        m = (float)(byte_of(s1, j) & 63);
    } else {
        const uint32_t bj = byte_of(s2, j - 4);   /* scales[j + 4] */
        sc = (float)((bj & 0xF) | ((byte_of(s0, j - 4) >> 6) << 4));
        m = (float)((bj >> 4) | ((byte_of(s1, j - 4) >> 6) << 4));
    }
}

/* Q4_K (144 bytes, 16-byte aligned): unit p (0..3) is the 64-value group
 * qs[32p .. 32p+31], two 128-bit loads: the low nibbles of its first
 * (second) 16 bytes are columns 64p .. +15 (64p + 16 .. +31), sub-block 2p;
 * the high nibbles columns 64p + 32 .. +15 (64p + 48 .. +63), sub-block
 * 2p + 1. x = (d*sc)*q - dmin*m, so sum x*a = d1 * sum q*a - m1 * sum a per
 * sub-block. d/dmin are one 32-bit load and the 12 scale bytes three: a
 * unit of 64 values costs 11 loads (a 32-value unit with byte loads of the
 * scales cost 13: the load units, not DRAM, bounded the kernel). */
struct qk_q4_k {
    static constexpr gpe_type TYPE = GPE_TYPE_Q4_K;
    static constexpr int BLK = 256, BYTES = 144, UPB = 4;
    template <int NC>
    static __device__ __forceinline__ void dot(const uint8_t *b, int p, const int8_t *xq,
                                               const float *xqd, int64_t ldq, float *acc)
    {
        const uint4 q0 = *reinterpret_cast<const uint4 *>(b + 16 + 32 * p);
        const uint4 q1 = *reinterpret_cast<const uint4 *>(b + 16 + 32 * p + 16);
        const uint32_t dm = ld_u32_a4(b);
        const float d = f16_bits_to_f32((uint16_t)(dm & 0xffffu));
        const float dmin = f16_bits_to_f32((uint16_t)(dm >> 16));
        const uint32_t s0 = ld_u32_a4(b + 4), s1 = ld_u32_a4(b + 8), s2 = ld_u32_a4(b + 12);
        float sc, m;
        scale_min_k4_w(2 * p, s0, s1, s2, sc, m);
        const float d1 = __fmul_rn(d, sc), m1 = __fmul_rn(dmin, m);
        scale_min_k4_w(2 * p + 1, s0, s1, s2, sc, m);
        const float d2 = __fmul_rn(d, sc), m2 = __fmul_rn(dmin, m);
        const uint32_t m4 = 0x0F0F0F0Fu;
        const int l0 = (int)(q0.x & m4), l1 = (int)(q0.y & m4), l2 = (int)(q0.z & m4),
                  l3 = (int)(q0.w & m4), l4 = (int)(q1.x & m4), l5 = (int)(q1.y & m4),
                  l6 = (int)(q1.z & m4), l7 = (int)(q1.w & m4);
        const int h0 = (int)((q0.x >> 4) & m4), h1 = (int)((q0.y >> 4) & m4),
                  h2 = (int)((q0.z >> 4) & m4), h3 = (int)((q0.w >> 4) & m4),
                  h4 = (int)((q1.x >> 4) & m4), h5 = (int)((q1.y >> 4) & m4),
                  h6 = (int)((q1.z >> 4) & m4), h7 = (int)((q1.w >> 4) & m4);
#pragma unroll
        for (int j = 0; j < NC; j++) {
            const int8_t *a = xq + j * ldq + 64 * p;
            const float2 ad =
                *reinterpret_cast<const float2 *>(xqd + j * (ldq / GPE_CUDA_Q8_BLK) + 2 * p);
            const int4 a0 = ld_i4(a), a1 = ld_i4(a + 16), a2 = ld_i4(a + 32),
                       a3 = ld_i4(a + 48);
            const int dl = dot4(l0, l1, l2, l3, a0) + dot4(l4, l5, l6, l7, a1);
            const int dh = dot4(h0, h1, h2, h3, a2) + dot4(h4, h5, h6, h7, a3);
            const float vl = d1 * (float)dl - m1 * (float)(sum4(a0) + sum4(a1));
            const float vh = d2 * (float)dh - m2 * (float)(sum4(a2) + sum4(a3));
            acc[j] += ad.x * vl + ad.y * vh;
        }
    }
};

/* Four words from 2-byte aligned p: four aligned 32-bit loads, a fifth
 * when p is not 4-byte aligned, joined by funnel shifts (eight 16-bit
 * loads otherwise). The fifth word ends 2 bytes past the 16: callers keep
 * that inside the block. */
static __device__ __forceinline__ void ld16_a2(const uint8_t *p, uint32_t (&w)[4])
{
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    const uint32_t *base = reinterpret_cast<const uint32_t *>(a & ~(uintptr_t)3);
    const unsigned sh = (unsigned)(a & 2u) * 8u;   /* 0 or 16 */
    uint32_t x[5];
#pragma unroll
    for (int i = 0; i < 4; i++)
        x[i] = base[i];
    x[4] = sh ? base[4] : 0u;
#pragma unroll
    for (int i = 0; i < 4; i++)
        w[i] = __funnelshift_r(x[i], x[i + 1], sh);
}

/* The rest of a Q6_K unit once its words are in registers (qa/qb: ql
 * bytes 64n + l0 .. and 64n + 32 + l0 .., qh: qh bytes 32n + l0 ..; sc: the
 * four groups' scales): the 6-bit values rebuilt four bytes at a time and
 * offset by -32 per byte, then acc[j] += d * sum_g ad[4n + g] * sc[g] *
 * (values of group g . activations). */
template <int NC>
static __device__ __forceinline__ void q6_acc(const uint32_t (&qa)[4], const uint32_t (&qb)[4],
                                              const uint32_t (&qh)[4], const int (&sc)[4],
                                              float d, int n, int l0, const int8_t *xq,
                                              const float *xqd, int64_t ldq, float *acc)
{
    int w[4][4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        /* unsigned: the shifts move bits across bytes, masked after */
        const uint32_t m4 = 0x0F0F0F0Fu, m2 = 0x30303030u, off = 0x20202020u;
        w[0][k] = (int)__vsubss4((qa[k] & m4) | ((qh[k] << 4) & m2), off);
        w[1][k] = (int)__vsubss4((qb[k] & m4) | ((qh[k] << 2) & m2), off);
        w[2][k] = (int)__vsubss4(((qa[k] >> 4) & m4) | (qh[k] & m2), off);
        w[3][k] = (int)__vsubss4(((qb[k] >> 4) & m4) | ((qh[k] >> 2) & m2), off);
    }
#pragma unroll
    for (int j = 0; j < NC; j++) {
        const int8_t *a = xq + j * ldq;
        const float *ad = xqd + j * (ldq / GPE_CUDA_Q8_BLK);
        float s = 0.0f;
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const int4 av = ld_i4(a + 128 * n + 32 * g + l0);
            s += ad[4 * n + g] * (float)(sc[g] * dot4(w[g][0], w[g][1], w[g][2], w[g][3], av));
        }
        acc[j] += d * s;
    }
}

/* Q6_K (210 bytes, 2-byte aligned): unit u = 2n + lh reads ql[64n + 16lh
 * ..+15], ql[64n + 32 + 16lh ..+15] and qh[32n + 16lh ..+15] (48 bytes) for
 * 64 values: group g (0..3) is columns 128n + 32g + 16lh .. +15, one scale
 * (index 8n + 2g + lh) and one activation block (4n + g) each; the 6-bit
 * values are rebuilt four bytes at a time and offset by -32 per byte. The
 * bytes come through aligned words (ld16_a2; every extra word stays before
 * the block's scale bytes end), the four scales from scales[8n .. 8n+7]
 * likewise (ending at most at the block's last byte). */
struct qk_q6_k {
    static constexpr gpe_type TYPE = GPE_TYPE_Q6_K;
    static constexpr int BLK = 256, BYTES = 210, UPB = 4;
    template <int NC>
    static __device__ __forceinline__ void dot(const uint8_t *b, int u, const int8_t *xq,
                                               const float *xqd, int64_t ldq, float *acc)
    {
        const int n = u / 2, lh = u % 2, l0 = 16 * lh;
        uint32_t qa[4], qb[4], qh[4];
        ld16_a2(b + 64 * n + l0, qa);
        ld16_a2(b + 64 * n + 32 + l0, qb);
        ld16_a2(b + 128 + 32 * n + l0, qh);
        /* scales[8n + 2g + lh]: bytes lh and 2 + lh of the two words */
        uint32_t sw[2];
        {
            const uintptr_t a = reinterpret_cast<uintptr_t>(b + 192 + 8 * n);
            const uint32_t *base = reinterpret_cast<const uint32_t *>(a & ~(uintptr_t)3);
            const unsigned sh = (unsigned)(a & 2u) * 8u;
            const uint32_t x0 = base[0], x1 = base[1], x2 = sh ? base[2] : 0u;
            sw[0] = __funnelshift_r(x0, x1, sh);
            sw[1] = __funnelshift_r(x1, x2, sh);
        }
        int sc[4];
#pragma unroll
        for (int g = 0; g < 4; g++)
            sc[g] = (int)(int8_t)byte_of(sw[g / 2], 2 * (g % 2) + lh);
        q6_acc<NC>(qa, qb, qh, sc, f16_bits_to_f32(ld_u16(b + 208)), n, l0, xq, xqd, ldq, acc);
    }
};

/* The units of batches of 2..8 columns (the 64-value Q4_K unit and the
 * funnel-shift Q6_K loads below ran 8 sequences of a 7B Q4_K_M file at
 * 0.68x of these on an H200, while one column gained): */

/* Q4_K (144 bytes, 16-byte aligned): unit u = 2p + h (p: 64-value group,
 * h: half) is qs[32p + 16h .. +15], one 128-bit load: low nibbles are
 * columns 64p + 16h .. +15 (sub-block 2p), high nibbles columns
 * 64p + 32 + 16h .. +15 (sub-block 2p + 1); x = (d*sc)*q - dmin*m, so
 * sum x*a = d1 * sum q*a - m1 * sum a per sub-block. */
struct qk_q4_k_32 {
    static constexpr gpe_type TYPE = GPE_TYPE_Q4_K;
    static constexpr int BLK = 256, BYTES = 144, UPB = 8;
    template <int NC>
    static __device__ __forceinline__ void dot(const uint8_t *b, int u, const int8_t *xq,
                                               const float *xqd, int64_t ldq, float *acc)
    {
        const int p = u / 2, h = u % 2;
        const uint4 q = *reinterpret_cast<const uint4 *>(b + 16 + 32 * p + 16 * h);
        const float d = f16_bits_to_f32(ld_u16(b)), dmin = f16_bits_to_f32(ld_u16(b + 2));
        float sc, m;
        scale_min_k4(2 * p, b + 4, sc, m);
        const float d1 = __fmul_rn(d, sc), m1 = __fmul_rn(dmin, m);
        scale_min_k4(2 * p + 1, b + 4, sc, m);
        const float d2 = __fmul_rn(d, sc), m2 = __fmul_rn(dmin, m);
        const uint32_t m4 = 0x0F0F0F0Fu;
        const int lo0 = (int)(q.x & m4), lo1 = (int)(q.y & m4), lo2 = (int)(q.z & m4),
                  lo3 = (int)(q.w & m4);
        const int hi0 = (int)((q.x >> 4) & m4), hi1 = (int)((q.y >> 4) & m4),
                  hi2 = (int)((q.z >> 4) & m4), hi3 = (int)((q.w >> 4) & m4);
        const int c_lo = 64 * p + 16 * h, c_hi = c_lo + 32;
#pragma unroll
        for (int j = 0; j < NC; j++) {
            const int8_t *a = xq + j * ldq;
            const float *ad = xqd + j * (ldq / GPE_CUDA_Q8_BLK);
            const int4 al = ld_i4(a + c_lo), ah = ld_i4(a + c_hi);
            const float vl = d1 * (float)dot4(lo0, lo1, lo2, lo3, al) - m1 * (float)sum4(al);
            const float vh = d2 * (float)dot4(hi0, hi1, hi2, hi3, ah) - m2 * (float)sum4(ah);
            acc[j] += ad[2 * p] * vl + ad[2 * p + 1] * vh;
        }
    }
};

/* Q6_K, the units of qk_q6_k, the words read 16 bits at a time. */
struct qk_q6_k_a2 {
    static constexpr gpe_type TYPE = GPE_TYPE_Q6_K;
    static constexpr int BLK = 256, BYTES = 210, UPB = 4;
    template <int NC>
    static __device__ __forceinline__ void dot(const uint8_t *b, int u, const int8_t *xq,
                                               const float *xqd, int64_t ldq, float *acc)
    {
        const int n = u / 2, lh = u % 2, l0 = 16 * lh;
        const int8_t *scales = reinterpret_cast<const int8_t *>(b + 192);
        uint32_t qa[4], qb[4], qh[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            qa[k] = ld_u32_a2(b + 64 * n + l0 + 4 * k);
            qb[k] = ld_u32_a2(b + 64 * n + 32 + l0 + 4 * k);
            qh[k] = ld_u32_a2(b + 128 + 32 * n + l0 + 4 * k);
        }
        int sc[4];
#pragma unroll
        for (int g = 0; g < 4; g++)
            sc[g] = scales[8 * n + 2 * g + lh];
        q6_acc<NC>(qa, qb, qh, sc, f16_bits_to_f32(ld_u16(b + 208)), n, l0, xq, xqd, ldq, acc);
    }
};

/* ------------------------------------------------------------- kernel */

/* One output row, by the calling warp: lane i takes units i, i+32, ...
 * (consecutive lanes read consecutive weight bytes) of weight row wr, and
 * the sum for activation row j goes to o[j * ldy] (is added to it when
 * add). The whole warp must call it (warp_sum's full-mask shuffles). */
template <typename Q, int NC>
static __device__ __forceinline__ void mmvq_row(const uint8_t *wr, int n_units,
                                                const int8_t *xq, const float *xqd,
                                                int64_t ldq, float *o, int64_t ldy, bool add)
{
    const int lane = threadIdx.x;
    float acc[NC];
#pragma unroll
    for (int j = 0; j < NC; j++)
        acc[j] = 0.0f;
#pragma unroll 2
    for (int ui = lane; ui < n_units; ui += GPE_WARP) {
        const int blk = ui / Q::UPB;
        const int64_t col0 = (int64_t)blk * Q::BLK;
        Q::template dot<NC>(wr + (size_t)blk * Q::BYTES, ui % Q::UPB, xq + col0,
                            xqd + col0 / GPE_CUDA_Q8_BLK, ldq, acc);
    }
#pragma unroll
    for (int j = 0; j < NC; j++) {
        const float s = warp_sum(acc[j]);
        if (lane == 0)
            o[j * ldy] = add ? o[j * ldy] + s : s;
    }
}

/* One warp per output row. A warp whose row is out of range leaves as a
 * whole. */
template <typename Q, int NC>
__global__ void __launch_bounds__(MMVQ_WARPS * GPE_WARP)
    mmvq_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int64_t n_rows, int n_units,
                const int8_t *__restrict__ xq, const float *__restrict__ xqd, int64_t ldq,
                float *__restrict__ y, int64_t ldy, bool add)
{
    const int64_t row = (int64_t)blockIdx.x * MMVQ_WARPS + threadIdx.y;
    if (row >= n_rows)
        return;
    mmvq_row<Q, NC>(W + (size_t)row * row_bytes, n_units, xq, xqd, ldq, y + row, ldy, add);
}

/* Up to GPE_CUDA_MMVQ_GROUP weights of one type and row length on the same
 * activations, one launch: weight k has the blocks [blk_end[k-1],
 * blk_end[k]) (each starts a block, so a block's warps are one weight's);
 * the unused entries repeat the last blk_end. */
struct mmvq_group {
    const uint8_t *W[GPE_CUDA_MMVQ_GROUP];
    float *y[GPE_CUDA_MMVQ_GROUP];
    int64_t ldy[GPE_CUDA_MMVQ_GROUP];
    int64_t n_rows[GPE_CUDA_MMVQ_GROUP];
    unsigned blk_end[GPE_CUDA_MMVQ_GROUP];
    int n;
};
static_assert(GPE_CUDA_MMVQ_GROUP == 3, "mmvq_group_kernel selects among 3 weights");

/* mmvq_kernel over a group: the block finds its weight by comparisons
 * (selects, no dynamic indexing of the parameter arrays). */
template <typename Q, int NC, bool PDL = false>
__global__ void __launch_bounds__(MMVQ_WARPS * GPE_WARP)
    mmvq_group_kernel(const mmvq_group g, size_t row_bytes, int n_units,
                      const int8_t *__restrict__ xq, const float *__restrict__ xqd, int64_t ldq,
                      bool add)
{
    const unsigned b = blockIdx.x;
    const int k = b < g.blk_end[0] ? 0 : (b < g.blk_end[1] ? 1 : 2);
    const unsigned b0 = k == 0 ? 0u : (k == 1 ? g.blk_end[0] : g.blk_end[1]);
    const int64_t n_rows = k == 0 ? g.n_rows[0] : (k == 1 ? g.n_rows[1] : g.n_rows[2]);
    const int64_t row = (int64_t)(b - b0) * MMVQ_WARPS + threadIdx.y;
    if (row >= n_rows)
        return;
    const uint8_t *W = k == 0 ? g.W[0] : (k == 1 ? g.W[1] : g.W[2]);
    float *y = k == 0 ? g.y[0] : (k == 1 ? g.y[1] : g.y[2]);
    const int64_t ldy = k == 0 ? g.ldy[0] : (k == 1 ? g.ldy[1] : g.ldy[2]);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (PDL) {
        /* Launched before the kernel that rounded x has finished
         * (GPUPOOL_CUDA_PDL=1): the weights are never written, so the
         * warp's row is fetched into L2 meanwhile; x and y only after the
         * wait, which returns once that kernel is complete and its writes
         * are visible. A template argument: the loop costs registers. */
        const uint8_t *wr = W + (size_t)row * row_bytes;
        for (size_t o = (size_t)threadIdx.x * 128; o < row_bytes; o += GPE_WARP * 128)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(wr + o));
        cudaGridDependencySynchronize();
    }
#endif
    mmvq_row<Q, NC>(W + (size_t)row * row_bytes, n_units, xq, xqd, ldq, y + row, ldy, add);
}

/* GPUPOOL_CUDA_PDL=1 (read once per process; default off), on a device of
 * compute capability 9.0 or more (the first one asked: a pool's devices are
 * of one kind): a group of one-column mat-vecs (Q/K/V, gate/up of a decode
 * step of one sequence) is launched with programmatic stream serialization
 * (Hopper's programmatic dependent launch), so its blocks start as the
 * blocks of the kernel before (the rounding, fused or not) finish and
 * prefetch their weight rows before cudaGridDependencySynchronize. Stream
 * capture keeps the attribute as a programmatic edge of the graph. An
 * experiment: the kernel before does not trigger early, so only its tail
 * overlaps. */
static bool mmvq_pdl_on(void)
{
    static const bool on = [] {
        const char *e = getenv("GPUPOOL_CUDA_PDL");
        int dev = 0, major = 0;
        if (!e || strcmp(e, "1") != 0)
            return false;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) !=
                cudaSuccess) {
            (void)cudaGetLastError(); /* not the next launch's error */
            return false;
        }
        return major >= 9;
    }();
    return on;
}

/* mmvq_group_kernel<Q, 1, true> with programmatic stream serialization;
 * an error is left for the caller's cudaGetLastError. */
template <typename Q>
static void mmvq_group_launch_pdl(const gpe_cuda_mm *mm, const gpe_cuda_weight *w,
                                  const mmvq_group &g, int n_units, bool add)
{
    cudaLaunchAttribute attr[1] = {};
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(g.blk_end[g.n - 1]);
    cfg.blockDim = dim3(GPE_WARP, MMVQ_WARPS);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = mm->stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    (void)cudaLaunchKernelEx(&cfg, mmvq_group_kernel<Q, 1, true>, g, w->row_bytes, n_units,
                             (const int8_t *)mm->xq, (const float *)mm->xqd, w->n_cols, add);
}

/* w: the group's first weight (type, n_cols and row_bytes of all). */
template <typename Q, int NC>
static void mmvq_launch(const gpe_cuda_mm *mm, const gpe_cuda_weight *w, const mmvq_group &g,
                        bool add)
{
    const int n_units = (int)(w->n_cols / Q::BLK * Q::UPB);
    const dim3 block(GPE_WARP, MMVQ_WARPS);
    if (g.n == 1)
        mmvq_kernel<Q, NC><<<gpe_cuda_div_up((size_t)g.n_rows[0], MMVQ_WARPS), block, 0,
                             mm->stream>>>(g.W[0], w->row_bytes, g.n_rows[0], n_units, mm->xq,
                                           mm->xqd, w->n_cols, g.y[0], g.ldy[0], add);
    else if (NC == 1 && mmvq_pdl_on())
        mmvq_group_launch_pdl<Q>(mm, w, g, n_units, add);
    else
        mmvq_group_kernel<Q, NC><<<g.blk_end[g.n - 1], block, 0, mm->stream>>>(
            g, w->row_bytes, n_units, mm->xq, mm->xqd, w->n_cols, add);
}

template <typename Q>
static void mmvq_cols(const gpe_cuda_mm *mm, const gpe_cuda_weight *w, const mmvq_group &g,
                      int n_tok, bool add)
{
    switch (n_tok) {
    case 1: mmvq_launch<Q, 1>(mm, w, g, add); break;
    case 2: mmvq_launch<Q, 2>(mm, w, g, add); break;
    case 3: mmvq_launch<Q, 3>(mm, w, g, add); break;
    case 4: mmvq_launch<Q, 4>(mm, w, g, add); break;
    case 5: mmvq_launch<Q, 5>(mm, w, g, add); break;
    case 6: mmvq_launch<Q, 6>(mm, w, g, add); break;
    case 7: mmvq_launch<Q, 7>(mm, w, g, add); break;
    default: mmvq_launch<Q, 8>(mm, w, g, add); break;
    }
}
static_assert(GPE_CUDA_MMV_MAX == 8, "mmvq_cols instantiates 1..8 columns");

void gpe_cuda_mmvq_quantize(const gpe_cuda_mm *mm, const float *x, int n_tok, int64_t n_cols)
{
    const int64_t n = (int64_t)n_tok * n_cols;
    q8_kernel<<<gpe_cuda_div_up((size_t)n, 256), 256, 0, mm->stream>>>(x, n, mm->xq, mm->xqd);
}

void gpe_cuda_mmvq_n(const gpe_cuda_mm *mm, const gpe_cuda_weight *const *w, int n_w,
                     int n_tok, float *const *y, const int64_t *ldy, bool add)
{
    if (n_w < 1 || n_w > GPE_CUDA_MMVQ_GROUP)
        return;   /* the callers keep to 1..GPE_CUDA_MMVQ_GROUP */
    mmvq_group g;
    memset(&g, 0, sizeof g);
    g.n = n_w;
    unsigned blocks = 0;
    for (int k = 0; k < GPE_CUDA_MMVQ_GROUP; k++) {
        if (k < n_w) {
            g.W[k] = w[k]->data;
            g.y[k] = y[k];
            g.ldy[k] = ldy[k];
            g.n_rows[k] = w[k]->n_rows;
            blocks += gpe_cuda_div_up((size_t)w[k]->n_rows, MMVQ_WARPS);
        }
        g.blk_end[k] = blocks;
    }
    const gpe_cuda_weight *w0 = w[0];
    switch (w0->type) {
    case GPE_TYPE_Q4_0: mmvq_cols<qk_q4_0>(mm, w0, g, n_tok, add); break;
    case GPE_TYPE_Q8_0: mmvq_cols<qk_q8_0>(mm, w0, g, n_tok, add); break;
    /* one column (a decode step of one sequence): the units that load
     * least per value; more columns: the units that measured faster there */
    case GPE_TYPE_Q4_K:
        if (n_tok == 1)
            mmvq_launch<qk_q4_k, 1>(mm, w0, g, add);
        else
            mmvq_cols<qk_q4_k_32>(mm, w0, g, n_tok, add);
        break;
    case GPE_TYPE_Q6_K:
        if (n_tok == 1)
            mmvq_launch<qk_q6_k, 1>(mm, w0, g, add);
        else
            mmvq_cols<qk_q6_k_a2>(mm, w0, g, n_tok, add);
        break;
    default: break;   /* the caller checked gpe_cuda_mmvq_takes */
    }
}

void gpe_cuda_mmvq(const gpe_cuda_mm *mm, const gpe_cuda_weight *w, int n_tok, float *y,
                   int64_t ldy, bool add)
{
    gpe_cuda_mmvq_n(mm, &w, 1, n_tok, &y, &ldy, add);
}
