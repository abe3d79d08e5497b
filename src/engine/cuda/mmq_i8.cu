/*
 * mmq_i8 (mmq_i8.cuh): small-batch GEMM on int8 tensor cores.
 *
 * Block: MI_WARPS warps, a tile of MI_BM weight rows x BN tokens (32, or 64
 * for batches past 32); warp w owns rows 16w..16w+15 and all BN tokens
 * (BN / 8 m16n8 accumulator tiles, F32 in registers). Per step of MI_BK =
 * 256 columns (one K-quant super-block per row, eight 32-value blocks) the
 * block
 *   1. unpacks W[row0 .. +MI_BM][k0 .. +MI_BK] into s_w (int8) and the
 *      per-32 (per-16) scales / per-32 minimums into s_wd / s_wm;
 *   2. copies the int8 activations' tile into s_x, their scales into s_xd
 *      and, for Q4_K, each 32-value block's sum of int8 values into s_xs;
 *   3. per block of 32 columns: one mma.sync m16n8k32 (two m16n8k16 for
 *      Q6_K) per token tile, s32 results scaled into the F32 accumulators.
 * Every shared entry is written each step (zeros past n_rows, n_tok,
 * n_cols), so no stale value enters a product; rows and tokens past the
 * ends are not stored.
 *
 * Fragments (PTX ISA, mma.m16n8k32 .s8; g = lane / 4, t = lane % 4; each
 * register holds 4 consecutive k values):
 *   A (16x32, row): a0 = A[g][4t..], a1 = A[g+8][4t..], a2 = A[g][16+4t..],
 *                   a3 = A[g+8][16+4t..]
 *   B (32x8, col):  b0 = B[4t..][g],  b1 = B[16+4t..][g]
 *   C (16x8):       c0 = C[g][2t], c1 = C[g][2t+1], c2 = C[g+8][2t],
 *                   c3 = C[g+8][2t+1]
 * and m16n8k16 .s8: a0 = A[g][4t..], a1 = A[g+8][4t..], b0 = B[4t..][g],
 * C as above. A is the weight tile (rows x k: s_w rows), B the activation
 * tile (k x tokens: s_x rows are tokens, so B's columns are contiguous in
 * k), both read as aligned 32-bit words. Rows of MI_LD = 272 bytes (68
 * words) put the 8 rows x 4 words of a fragment load in 32 distinct banks.
 */
#include "engine/cuda/mmq_i8.cuh"

#include <stdlib.h>
#include <string.h>

#include "engine/cuda/dequant.cuh"
#include "engine/cuda/mmq.cuh"

#define MI_BM 64
#define MI_BK 256
#define MI_LD (MI_BK + 16)   /* bytes per tile row (bank spread) */
#define MI_WARPS (MI_BM / 16)
#define MI_NB (MI_BK / 32)   /* activation blocks per step */

/* ------------------------------------------------------ weight tiles */

/* Each unpacker fills s_w[r][0 .. MI_BK) with int8 values and s_wd[r][i]
 * with the F32 scale of values 32i .. (16i .. for KS 16), s_wm[r][i] with
 * the minimum (MIN types), for rows row0 + r, columns k0 + ..; zeros for
 * rows past n_rows and blocks past n_cols. */
#define MI_FILL_ARGS                                                                         \
    int8_t(*s_w)[MI_LD], float(*s_wd)[16], float(*s_wm)[MI_NB], const uint8_t *W,            \
        size_t row_bytes, int64_t n_rows, int64_t n_cols, int64_t row0, int64_t k0

static __device__ __forceinline__ void st_u4(int8_t *p, uint32_t x, uint32_t y, uint32_t z,
                                             uint32_t w)
{
    *reinterpret_cast<uint4 *>(p) = make_uint4(x, y, z, w);
}

/* Q4_0 (18 bytes): low nibbles of qs[i] are value i, high value 16 + i;
 * stored q - 8 (-8..7), scale d. Unit: one block of one row. */
struct mi_q4_0 {
    static constexpr int KS = 32;
    static constexpr bool MIN = false;
    static __device__ __forceinline__ void fill(MI_FILL_ARGS)
    {
        const int64_t nblk = n_cols / 32, b0 = k0 / 32;
        for (int idx = threadIdx.x; idx < MI_BM * MI_NB; idx += blockDim.x) {
            const int r = idx / MI_NB, i = idx % MI_NB;
            uint32_t lo[4] = { 0, 0, 0, 0 }, hi[4] = { 0, 0, 0, 0 };
            float d = 0.0f;
            if (row0 + r < n_rows && b0 + i < nblk) {
                const uint8_t *b = W + (size_t)(row0 + r) * row_bytes + (size_t)(b0 + i) * 18;
                d = f16_bits_to_f32(ld_u16(b));
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const uint32_t q = ld_u32_a2(b + 2 + 4 * k);
                    lo[k] = __vsubss4(q & 0x0F0F0F0Fu, 0x08080808u);
                    hi[k] = __vsubss4((q >> 4) & 0x0F0F0F0Fu, 0x08080808u);
                }
            }
            st_u4(&s_w[r][32 * i], lo[0], lo[1], lo[2], lo[3]);
            st_u4(&s_w[r][32 * i + 16], hi[0], hi[1], hi[2], hi[3]);
            s_wd[r][i] = d;
        }
    }
};

/* Q8_0 (34 bytes): q as stored, scale d. Unit: one block of one row. */
struct mi_q8_0 {
    static constexpr int KS = 32;
    static constexpr bool MIN = false;
    static __device__ __forceinline__ void fill(MI_FILL_ARGS)
    {
        const int64_t nblk = n_cols / 32, b0 = k0 / 32;
        for (int idx = threadIdx.x; idx < MI_BM * MI_NB; idx += blockDim.x) {
            const int r = idx / MI_NB, i = idx % MI_NB;
            uint32_t q[8] = { 0, 0, 0, 0, 0, 0, 0, 0 };
            float d = 0.0f;
            if (row0 + r < n_rows && b0 + i < nblk) {
                const uint8_t *b = W + (size_t)(row0 + r) * row_bytes + (size_t)(b0 + i) * 34;
                d = f16_bits_to_f32(ld_u16(b));
#pragma unroll
                for (int k = 0; k < 8; k++)
                    q[k] = ld_u32_a2(b + 2 + 4 * k);
            }
            st_u4(&s_w[r][32 * i], q[0], q[1], q[2], q[3]);
            st_u4(&s_w[r][32 * i + 16], q[4], q[5], q[6], q[7]);
            s_wd[r][i] = d;
        }
    }
};

/* Q4_K (144 bytes, 16-byte aligned; n_cols % 256 == 0, so a step is one
 * block per row): unit p (0..3) of a row is qs[32p .. 32p+31]: its low
 * nibbles are columns 64p .. +31 (sub-block 2p), its high nibbles columns
 * 64p + 32 .. +31 (sub-block 2p + 1); stored q (0..15), scale d*sc and
 * minimum dmin*m per sub-block (x = d*sc*q - dmin*m, gpe_dequantize_row's
 * products). */
struct mi_q4_k {
    static constexpr int KS = 32;
    static constexpr bool MIN = true;
    static __device__ __forceinline__ void fill(MI_FILL_ARGS)
    {
        const uint32_t m4 = 0x0F0F0F0Fu;
        for (int idx = threadIdx.x; idx < MI_BM * 4; idx += blockDim.x) {
            const int r = idx / 4, p = idx % 4;
            uint4 q0 = make_uint4(0, 0, 0, 0), q1 = q0;
            float d1 = 0.0f, m1 = 0.0f, d2 = 0.0f, m2 = 0.0f;
            if (row0 + r < n_rows) {
                const uint8_t *b =
                    W + (size_t)(row0 + r) * row_bytes + (size_t)(k0 / 256) * 144;
                q0 = *reinterpret_cast<const uint4 *>(b + 16 + 32 * p);
                q1 = *reinterpret_cast<const uint4 *>(b + 16 + 32 * p + 16);
                const float d = f16_bits_to_f32(ld_u16(b)), dmin = f16_bits_to_f32(ld_u16(b + 2));
                float sc, m;
                scale_min_k4(2 * p, b + 4, sc, m);
                d1 = __fmul_rn(d, sc);
                m1 = __fmul_rn(dmin, m);
                scale_min_k4(2 * p + 1, b + 4, sc, m);
                d2 = __fmul_rn(d, sc);
                m2 = __fmul_rn(dmin, m);
            }
            int8_t *o = &s_w[r][64 * p];
            st_u4(o, q0.x & m4, q0.y & m4, q0.z & m4, q0.w & m4);
            st_u4(o + 16, q1.x & m4, q1.y & m4, q1.z & m4, q1.w & m4);
            st_u4(o + 32, (q0.x >> 4) & m4, (q0.y >> 4) & m4, (q0.z >> 4) & m4,
                  (q0.w >> 4) & m4);
            st_u4(o + 48, (q1.x >> 4) & m4, (q1.y >> 4) & m4, (q1.z >> 4) & m4,
                  (q1.w >> 4) & m4);
            s_wd[r][2 * p] = d1;
            s_wm[r][2 * p] = m1;
            s_wd[r][2 * p + 1] = d2;
            s_wm[r][2 * p + 1] = m2;
        }
    }
};

/* Q6_K (210 bytes, 2-byte aligned; a step is one block per row): unit
 * (n, l0) with n = 0..1, l0 = 0, 4, .., 28 reads ql[64n + l0 ..+3],
 * ql[64n + 32 + l0 ..+3] and qh[32n + l0 ..+3] and rebuilds the four
 * bytes of columns 128n + 32g + l0 .. +3, g = 0..3 (gpe_dequantize_row's
 * unpacking, four bytes at a time), stored q - 32; scale d*sc per 16
 * columns (ggml's (d * sc) * q). */
struct mi_q6_k {
    static constexpr int KS = 16;
    static constexpr bool MIN = false;
    static __device__ __forceinline__ void fill(MI_FILL_ARGS)
    {
        const uint32_t m4 = 0x0F0F0F0Fu, m2 = 0x30303030u, off = 0x20202020u;
        const size_t boff = (size_t)(k0 / 256) * 210;
        for (int idx = threadIdx.x; idx < MI_BM * 16; idx += blockDim.x) {
            const int r = idx / 16, u = idx % 16, n = u / 8, l0 = 4 * (u % 8);
            uint32_t w[4] = { 0, 0, 0, 0 };
            float d = 0.0f;
            if (row0 + r < n_rows) {
                const uint8_t *b = W + (size_t)(row0 + r) * row_bytes + boff;
                const uint32_t qa = ld_u32_a2(b + 64 * n + l0);
                const uint32_t qb = ld_u32_a2(b + 64 * n + 32 + l0);
                const uint32_t qh = ld_u32_a2(b + 128 + 32 * n + l0);
                /* unsigned shifts move bits across bytes: masked per byte after */
                w[0] = __vsubss4((qa & m4) | ((qh << 4) & m2), off);
                w[1] = __vsubss4((qb & m4) | ((qh << 2) & m2), off);
                w[2] = __vsubss4(((qa >> 4) & m4) | (qh & m2), off);
                w[3] = __vsubss4(((qb >> 4) & m4) | ((qh >> 2) & m2), off);
                /* unit u of the row also sets the scale of 16 columns u */
                d = __fmul_rn(f16_bits_to_f32(ld_u16(b + 208)),
                              (float)(int8_t)b[192 + u]);
            }
#pragma unroll
            for (int g = 0; g < 4; g++)
                *reinterpret_cast<uint32_t *>(&s_w[r][128 * n + 32 * g + l0]) = w[g];
            s_wd[r][u] = d;
        }
    }
};

/* ------------------------------------------------------------ kernel */

static __device__ __forceinline__ void mma_k32(int (&c)[4], int a0, int a1, int a2, int a3,
                                               int b0, int b1)
{
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%10,%10,%10};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
#else
    __trap();   /* never launched there (gpe_cuda_mmq_i8_takes) */
#endif
}

static __device__ __forceinline__ void mma_k16(int (&c)[4], int a0, int a1, int b0)
{
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%7,%7,%7,%7};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(0));
#else
    __trap();
#endif
}

static __device__ __forceinline__ int ld_s32(const int8_t *p)
{
    return *reinterpret_cast<const int *>(p);
}

/* Step 2: the activations' tile (int8 rows of n_cols, 16-byte aligned:
 * n_cols % 32 == 0), scales and, for MIN types, block sums. BN * 16 is a
 * multiple of the block size, so every thread runs the same number of
 * iterations and the pair shuffle is whole-warp; threads 2m and 2m + 1
 * hold the two halves of one block. */
template <bool MIN, int BN>
static __device__ __forceinline__ void mi_fill_x(int8_t (*s_x)[MI_LD], float (*s_xd)[MI_NB],
                                                 int (*s_xs)[MI_NB], const int8_t *xq,
                                                 const float *xqd, int n_tok, int64_t n_cols,
                                                 int tok0, int64_t k0)
{
    static_assert(BN * 16 % (MI_WARPS * GPE_WARP) == 0, "uniform trip count");
    for (int i = threadIdx.x; i < BN * 16; i += blockDim.x) {
        const int tk = i / 16, c = 16 * (i % 16);
        int4 v = make_int4(0, 0, 0, 0);
        if (tok0 + tk < n_tok && k0 + c < n_cols)
            v = *reinterpret_cast<const int4 *>(xq + (size_t)(tok0 + tk) * n_cols + k0 + c);
        *reinterpret_cast<int4 *>(&s_x[tk][c]) = v;
        if (MIN) {
            int s = __dp4a(v.x, 0x01010101, __dp4a(v.y, 0x01010101,
                           __dp4a(v.z, 0x01010101, __dp4a(v.w, 0x01010101, 0))));
            s += __shfl_xor_sync(0xffffffffu, s, 1);
            if ((i & 1) == 0)
                s_xs[tk][c / 32] = s;
        }
    }
    const int64_t nb = n_cols / 32;
    for (int i = threadIdx.x; i < BN * MI_NB; i += blockDim.x) {
        const int tk = i / MI_NB, b = i % MI_NB;
        float d = 0.0f;
        if (tok0 + tk < n_tok && k0 + 32 * b < n_cols)
            d = xqd[(size_t)(tok0 + tk) * nb + k0 / 32 + b];
        s_xd[tk][b] = d;
    }
}

template <typename Q, int BN>
__global__ void __launch_bounds__(MI_WARPS *GPE_WARP)
    mmqi8_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int64_t n_rows,
                 int64_t n_cols, const int8_t *__restrict__ xq, const float *__restrict__ xqd,
                 int n_tok, int steps_per, float *__restrict__ y, int64_t ldy,
                 float *__restrict__ part)
{
    __shared__ __align__(16) int8_t s_w[MI_BM][MI_LD];
    __shared__ __align__(16) int8_t s_x[BN][MI_LD];
    __shared__ float s_wd[MI_BM][16];
    __shared__ float s_wm[MI_BM][MI_NB];
    __shared__ float s_xd[BN][MI_NB];
    __shared__ int s_xs[BN][MI_NB];
    const int warp = threadIdx.x / GPE_WARP, lane = threadIdx.x % GPE_WARP;
    const int g = lane / 4, t = lane % 4;
    const int64_t row0 = (int64_t)blockIdx.x * MI_BM;
    const int tok0 = blockIdx.y * BN, split = blockIdx.z;
    const int steps = (int)((n_cols + MI_BK - 1) / MI_BK);
    const int st0 = split * steps_per, st1 = min(st0 + steps_per, steps);
    const int rl = 16 * warp + g, rh = rl + 8;   /* this thread's tile rows */

    float acc[BN / 8][4];
#pragma unroll
    for (int j = 0; j < BN / 8; j++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            acc[j][i] = 0.0f;

    for (int st = st0; st < st1; st++) {
        const int64_t k0 = (int64_t)st * MI_BK;
        Q::fill(s_w, s_wd, s_wm, W, row_bytes, n_rows, n_cols, row0, k0);
        mi_fill_x<Q::MIN, BN>(s_x, s_xd, s_xs, xq, xqd, n_tok, n_cols, tok0, k0);
        __syncthreads();
#pragma unroll 2
        for (int kb = 0; kb < MI_NB; kb++) {
            const int kc = 32 * kb + 4 * t;
            const int a0 = ld_s32(&s_w[rl][kc]), a1 = ld_s32(&s_w[rh][kc]);
            const int a2 = ld_s32(&s_w[rl][kc + 16]), a3 = ld_s32(&s_w[rh][kc + 16]);
#pragma unroll
            for (int j = 0; j < BN / 8; j++) {
                const int b0 = ld_s32(&s_x[8 * j + g][kc]), b1 = ld_s32(&s_x[8 * j + g][kc + 16]);
                const int t0 = 8 * j + 2 * t, t1 = t0 + 1;   /* this thread's tokens */
                float v[4];   /* weight-scaled block dots: (rl,t0) (rl,t1) (rh,t0) (rh,t1) */
                if (Q::KS == 32) {
                    int c[4];
                    mma_k32(c, a0, a1, a2, a3, b0, b1);
                    const float dl = s_wd[rl][kb], dh = s_wd[rh][kb];
                    v[0] = dl * (float)c[0];
                    v[1] = dl * (float)c[1];
                    v[2] = dh * (float)c[2];
                    v[3] = dh * (float)c[3];
                    if (Q::MIN) {
                        const float ml = s_wm[rl][kb], mh = s_wm[rh][kb];
                        const float x0 = (float)s_xs[t0][kb], x1 = (float)s_xs[t1][kb];
                        v[0] -= ml * x0;
                        v[1] -= ml * x1;
                        v[2] -= mh * x0;
                        v[3] -= mh * x1;
                    }
                } else {   /* KS 16: columns 32kb .. +15 and 32kb + 16 .. +15 */
                    int c[4], e[4];
                    mma_k16(c, a0, a1, b0);
                    mma_k16(e, a2, a3, b1);
                    const float dl0 = s_wd[rl][2 * kb], dl1 = s_wd[rl][2 * kb + 1];
                    const float dh0 = s_wd[rh][2 * kb], dh1 = s_wd[rh][2 * kb + 1];
                    v[0] = dl0 * (float)c[0] + dl1 * (float)e[0];
                    v[1] = dl0 * (float)c[1] + dl1 * (float)e[1];
                    v[2] = dh0 * (float)c[2] + dh1 * (float)e[2];
                    v[3] = dh0 * (float)c[3] + dh1 * (float)e[3];
                }
                const float x0 = s_xd[t0][kb], x1 = s_xd[t1][kb];
                acc[j][0] += x0 * v[0];
                acc[j][1] += x1 * v[1];
                acc[j][2] += x0 * v[2];
                acc[j][3] += x1 * v[3];
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int j = 0; j < BN / 8; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int64_t r = row0 + (i < 2 ? rl : rh);
            const int tk = tok0 + 8 * j + 2 * t + (i & 1);
            if (r >= n_rows || tk >= n_tok)
                continue;
            if (part)
                part[((size_t)split * n_tok + tk) * (size_t)n_rows + r] = acc[j][i];
            else
                y[(size_t)tk * ldy + r] = acc[j][i];
        }
}

/* ------------------------------------------------------------- host */

bool gpe_cuda_mmq_i8_takes(gpe_type t)
{
    /* Read once (thread-safe static initialisation): the choice must not
     * change under a running model. The device is the one current at the
     * first call (a process drives devices of one kind). */
    static const bool on = [] {
        const char *e = getenv("GPUPOOL_CUDA_MMQ_I8");
        if (e && strcmp(e, "0") == 0)
            return false;
        int dev = 0, major = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) !=
                cudaSuccess) {
            (void)cudaGetLastError();   /* not sticky: leave no error for a later check */
            return false;
        }
        return major >= 8;
    }();
    return on && (t == GPE_TYPE_Q4_0 || t == GPE_TYPE_Q8_0 || t == GPE_TYPE_Q4_K ||
                  t == GPE_TYPE_Q6_K);
}

size_t gpe_cuda_mmq_i8_part_floats(int64_t n_rows, int64_t n_cols, int n_tok)
{
    int per;
    const int s = gpe_cuda_mmq_splits(n_rows, n_cols, n_tok, MI_BM, MI_BK, &per);
    return s > 1 ? (size_t)s * (size_t)n_tok * (size_t)n_rows : 0;
}

template <typename Q>
static void mmqi8_launch(const gpe_cuda_mm *mm, const gpe_cuda_weight *w, int n_tok, float *y,
                         int64_t ldy, int per, float *part, dim3 grid)
{
    const int nt = MI_WARPS * GPE_WARP;
    if (gpe_cuda_mmq_tile_tokens(n_tok) == 64)
        mmqi8_kernel<Q, 64><<<grid, nt, 0, mm->stream>>>(w->data, w->row_bytes, w->n_rows,
                                                        w->n_cols, mm->xq, mm->xqd, n_tok, per,
                                                        y, ldy, part);
    else
        mmqi8_kernel<Q, 32><<<grid, nt, 0, mm->stream>>>(w->data, w->row_bytes, w->n_rows,
                                                        w->n_cols, mm->xq, mm->xqd, n_tok, per,
                                                        y, ldy, part);
}

void gpe_cuda_mmq_i8(const gpe_cuda_mm *mm, const gpe_cuda_weight *w, int n_tok, float *y,
                     int64_t ldy)
{
    int per;
    const int n_split = gpe_cuda_mmq_splits(w->n_rows, w->n_cols, n_tok, MI_BM, MI_BK, &per);
    float *part = n_split > 1 ? mm->mmq_part : NULL;
    const dim3 grid(gpe_cuda_div_up((size_t)w->n_rows, MI_BM),
                    gpe_cuda_div_up((size_t)n_tok, (size_t)gpe_cuda_mmq_tile_tokens(n_tok)), (unsigned)n_split);
    switch (w->type) {   /* the types of gpe_cuda_mmq_i8_takes only */
    case GPE_TYPE_Q4_0: mmqi8_launch<mi_q4_0>(mm, w, n_tok, y, ldy, per, part, grid); break;
    case GPE_TYPE_Q8_0: mmqi8_launch<mi_q8_0>(mm, w, n_tok, y, ldy, per, part, grid); break;
    case GPE_TYPE_Q4_K: mmqi8_launch<mi_q4_k>(mm, w, n_tok, y, ldy, per, part, grid); break;
    case GPE_TYPE_Q6_K: mmqi8_launch<mi_q6_k>(mm, w, n_tok, y, ldy, per, part, grid); break;
    default: return;
    }
    if (part) /* (mmq.cu's sum: the same order, bit for bit) */
        gpe_cuda_mmq_reduce(mm, part, n_split, n_tok, w->n_rows, y, ldy);
}
