/*
 * mmq (mmq.cuh): small-batch GEMM on dequantized shared-memory tiles.
 *
 * Block: MQ_WARPS warps, a tile of MQ_BM weight rows x BN tokens (32, or
 * 64 for batches past 32, so that 64 sequences dequantize W once); warp w
 * owns rows 16w..16w+15 and all BN tokens (BN / 16 accumulator
 * fragments). Per step of MQ_BK columns the block
 *   1. dequantizes W[row0 .. +MQ_BM][k0 .. +MQ_BK] into s_w (F16): a step
 *      is whole blocks of the 32-value types and half a block of the
 *      256-value K-quants, whose chunks are ordered so that the first half
 *      of a block's chunks covers its first 128 columns (dequant.cuh);
 *   2. copies the activations' tile into s_x (already F16 in mm->xh);
 *   3. runs MQ_BK / 16 wmma steps.
 * Tails (rows past n_rows, tokens past n_tok, columns past n_cols) are
 * zeros in the tiles and are not stored.
 */
#include "engine/cuda/mmq.cuh"

#include <mma.h>
#include <stdlib.h>

#include "engine/cuda/dequant.cuh"
#include "engine/cuda/mmq_i8.cuh"

#define MQ_BM 64
#define MQ_BK 128
#define MQ_PAD 8            /* halves of padding per tile row (bank spread) */
#define MQ_LD (MQ_BK + MQ_PAD)
#define MQ_WARPS (MQ_BM / 16)
#define MQ_TARGET_BLOCKS 512   /* enough blocks for the largest GPUs' SMs */
#define MQ_MAX_SPLITS 8

int gpe_cuda_mmq_max(void)
{
    static const int v = [] {
        const char *e = getenv("GPUPOOL_CUDA_MMQ_MAX");
        if (!e || !*e)
            return GPE_CUDA_MMQ_MAX;
        const long n = strtol(e, NULL, 10);
        return n < 0 ? 0 : (n > 4096 ? 4096 : (int)n);
    }();
    return v;
}

static bool mmq_type(gpe_type t)
{
    return t == GPE_TYPE_F16 || t == GPE_TYPE_Q4_0 || t == GPE_TYPE_Q8_0 ||
           t == GPE_TYPE_Q4_K || t == GPE_TYPE_Q5_K || t == GPE_TYPE_Q6_K;
}

bool gpe_cuda_mmq_takes(const gpe_cuda_weight *w, int n_tok)
{
    return n_tok > GPE_CUDA_MMV_MAX && n_tok <= gpe_cuda_mmq_max() && mmq_type(w->type) &&
           w->n_cols % 8 == 0 && w->n_rows <= (int64_t)INT32_MAX;
}

int gpe_cuda_mmq_tile_tokens(int n_tok)
{
    return n_tok > 32 ? 64 : 32;
}

int gpe_cuda_mmq_splits(int64_t n_rows, int64_t n_cols, int n_tok, int bm, int bk,
                        int *steps_per)
{
    const int64_t blocks = (int64_t)gpe_cuda_div_up((size_t)n_rows, (size_t)bm) *
                           (int64_t)gpe_cuda_div_up((size_t)n_tok,
                                                    (size_t)gpe_cuda_mmq_tile_tokens(n_tok));
    const int steps = (int)gpe_cuda_div_up((size_t)n_cols, (size_t)bk);
    int s = (int)((MQ_TARGET_BLOCKS + blocks - 1) / blocks);
    if (s > MQ_MAX_SPLITS)
        s = MQ_MAX_SPLITS;
    if (s > steps)
        s = steps;
    if (s < 1)
        s = 1;
    *steps_per = (steps + s - 1) / s;
    return (steps + *steps_per - 1) / *steps_per;
}

size_t gpe_cuda_mmq_part_floats(int64_t n_rows, int64_t n_cols, int n_tok)
{
    int per;
    const int s = gpe_cuda_mmq_splits(n_rows, n_cols, n_tok, MQ_BM, MQ_BK, &per);
    const size_t f16 = s > 1 ? (size_t)s * (size_t)n_tok * (size_t)n_rows : 0;
    /* the int8 path (mmq_i8.cuh) shares the scratch */
    const size_t i8 = gpe_cuda_mmq_i8_part_floats(n_rows, n_cols, n_tok);
    return f16 > i8 ? f16 : i8;
}

/* Step 1: chunk g of a row is value chunk g % CPB of block g / CPB; a step
 * of MQ_BK columns starting at k0 holds chunks k0 CPB / BLK .. + CH - 1. */
template <typename Q>
static __device__ __forceinline__ void mmq_fill_w(__half (*s_w)[MQ_LD], const uint8_t *W,
                                                  size_t row_bytes, int64_t n_rows,
                                                  int64_t n_cols, int64_t row0, int64_t k0)
{
    constexpr int CH = Q::CPB * MQ_BK / Q::BLK;   /* chunks of a row in a step */
    static_assert(Q::CPB * MQ_BK % Q::BLK == 0, "a step is whole chunks");
    const int64_t n_blocks = n_cols / Q::BLK;
    const int64_t g0 = k0 * Q::CPB / Q::BLK;
    for (int idx = threadIdx.x; idx < MQ_BM * CH; idx += blockDim.x) {
        const int r = idx / CH;
        const int64_t g = g0 + idx % CH, b = g / Q::CPB;
        if (row0 + r >= n_rows || b >= n_blocks)
            continue;   /* zeroed before */
        float v[Q::VALS];
        int col[Q::VALS / 4];
        Q::load(W + (size_t)(row0 + r) * row_bytes + (size_t)b * Q::BYTES, (int)(g % Q::CPB),
                v, col);
        const int c0 = (int)(b * Q::BLK - k0);
#pragma unroll
        for (int gi = 0; gi < Q::VALS / 4; gi++) {
            const __half2 h01 = __floats2half2_rn(v[4 * gi], v[4 * gi + 1]);
            const __half2 h23 = __floats2half2_rn(v[4 * gi + 2], v[4 * gi + 3]);
            __half2 *dst = reinterpret_cast<__half2 *>(&s_w[r][c0 + col[gi]]);
            dst[0] = h01;
            dst[1] = h23;
        }
    }
}

template <typename Q, int MQ_BN>
__global__ void __launch_bounds__(MQ_WARPS *GPE_WARP)
    mmq_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int64_t n_rows, int64_t n_cols,
               const __half *__restrict__ xh, int n_tok, int steps_per, float *__restrict__ y,
               int64_t ldy, float *__restrict__ part)
{
    using namespace nvcuda;
    __shared__ __align__(32) __half s_w[MQ_BM][MQ_LD];
    __shared__ __align__(32) __half s_x[MQ_BN][MQ_LD];
    const int warp = threadIdx.x / GPE_WARP;
    const int64_t row0 = (int64_t)blockIdx.x * MQ_BM;
    const int tok0 = blockIdx.y * MQ_BN, split = blockIdx.z;
    const int steps = (int)((n_cols + MQ_BK - 1) / MQ_BK);
    const int st0 = split * steps_per, st1 = min(st0 + steps_per, steps);
    const bool row_tail = row0 + MQ_BM > n_rows;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[MQ_BN / 16];
#pragma unroll
    for (int j = 0; j < MQ_BN / 16; j++)
        wmma::fill_fragment(acc[j], 0.0f);

    for (int st = st0; st < st1; st++) {
        const int64_t k0 = (int64_t)st * MQ_BK;
        if (row_tail || k0 + MQ_BK > n_cols) {
            for (int i = threadIdx.x; i < MQ_BM * MQ_LD / 2; i += blockDim.x)
                reinterpret_cast<__half2 *>(&s_w[0][0])[i] = __float2half2_rn(0.0f);
            __syncthreads();
        }
        mmq_fill_w<Q>(s_w, W, row_bytes, n_rows, n_cols, row0, k0);
        for (int i = threadIdx.x; i < MQ_BN * (MQ_BK / 8); i += blockDim.x) {
            const int t = i / (MQ_BK / 8), c = 8 * (i % (MQ_BK / 8));
            uint4 v = make_uint4(0, 0, 0, 0);
            if (tok0 + t < n_tok && k0 + c < n_cols)
                v = *reinterpret_cast<const uint4 *>(xh + (size_t)(tok0 + t) * n_cols + k0 + c);
            *reinterpret_cast<uint4 *>(&s_x[t][c]) = v;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < MQ_BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
            wmma::load_matrix_sync(a, &s_w[16 * warp][kk], MQ_LD);
#pragma unroll
            for (int j = 0; j < MQ_BN / 16; j++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
                wmma::load_matrix_sync(b, &s_x[16 * j][kk], MQ_LD);
                wmma::mma_sync(acc[j], a, b, acc[j]);
            }
        }
        __syncthreads();
    }

    /* Stage the tile through shared memory (s_w is free now): element
     * (row m, token n) at s_c[n * MQ_BM + m]. */
    float *s_c = reinterpret_cast<float *>(&s_w[0][0]);
    static_assert(MQ_BM * MQ_BN * sizeof(float) <= sizeof(s_w), "staging fits in s_w");
#pragma unroll
    for (int j = 0; j < MQ_BN / 16; j++)
        wmma::store_matrix_sync(s_c + 16 * j * MQ_BM + 16 * warp, acc[j], MQ_BM,
                                wmma::mem_col_major);
    __syncthreads();
    for (int i = threadIdx.x; i < MQ_BM * MQ_BN; i += blockDim.x) {
        const int n = i / MQ_BM, m = i % MQ_BM;
        const int64_t r = row0 + m;
        const int t = tok0 + n;
        if (r >= n_rows || t >= n_tok)
            continue;
        if (part)
            part[((size_t)split * n_tok + t) * (size_t)n_rows + r] = s_c[i];
        else
            y[(size_t)t * ldy + r] = s_c[i];
    }
}

/* y[t][r] = sum over the splits of part[s][t][r], in split order. */
static __global__ void mmq_reduce_kernel(const float *__restrict__ part, int n_split, int n_tok,
                                         int64_t n_rows, float *__restrict__ y, int64_t ldy)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n_tok * n_rows)
        return;
    const int64_t t = i / n_rows, r = i % n_rows;
    float s = 0.0f;
    for (int k = 0; k < n_split; k++)
        s += part[(size_t)k * n_tok * n_rows + i];
    y[t * ldy + r] = s;
}

void gpe_cuda_mmq_reduce(const gpe_cuda_mm *mm, const float *part, int n_split, int n_tok,
                         int64_t n_rows, float *y, int64_t ldy)
{
    const int64_t n = (int64_t)n_tok * n_rows;
    mmq_reduce_kernel<<<gpe_cuda_div_up((size_t)n, 256), 256, 0, mm->stream>>>(
        part, n_split, n_tok, n_rows, y, ldy);
}

void gpe_cuda_mmq(const gpe_cuda_mm *mm, const gpe_cuda_weight *w, int n_tok, float *y,
                  int64_t ldy)
{
    int per;
    const int n_split = gpe_cuda_mmq_splits(w->n_rows, w->n_cols, n_tok, MQ_BM, MQ_BK, &per);
    float *part = n_split > 1 ? mm->mmq_part : NULL;
    const int bn = gpe_cuda_mmq_tile_tokens(n_tok), nt = MQ_WARPS * GPE_WARP;
    const dim3 grid(gpe_cuda_div_up((size_t)w->n_rows, MQ_BM),
                    gpe_cuda_div_up((size_t)n_tok, (size_t)bn), (unsigned)n_split);
#define MQ_LAUNCH(T)                                                                          \
    do {                                                                                      \
        if (bn == 64)                                                                         \
            mmq_kernel<T, 64><<<grid, nt, 0, mm->stream>>>(w->data, w->row_bytes, w->n_rows,  \
                                                           w->n_cols, mm->xh, n_tok, per, y,  \
                                                           ldy, part);                        \
        else                                                                                  \
            mmq_kernel<T, 32><<<grid, nt, 0, mm->stream>>>(w->data, w->row_bytes, w->n_rows,  \
                                                           w->n_cols, mm->xh, n_tok, per, y,  \
                                                           ldy, part);                        \
    } while (0)
    switch (w->type) {   /* the types of mmq_type only */
    case GPE_TYPE_F16: MQ_LAUNCH(tr_f16); break;
    case GPE_TYPE_Q4_0: MQ_LAUNCH(tr_q4_0); break;
    case GPE_TYPE_Q8_0: MQ_LAUNCH(tr_q8_0); break;
    case GPE_TYPE_Q4_K: MQ_LAUNCH(tr_q4_k); break;
    case GPE_TYPE_Q5_K: MQ_LAUNCH(tr_q5_k); break;
    case GPE_TYPE_Q6_K: MQ_LAUNCH(tr_q6_k); break;
    default: return;
    }
#undef MQ_LAUNCH
    if (part)
        gpe_cuda_mmq_reduce(mm, part, n_split, n_tok, w->n_rows, y, ldy);
}
