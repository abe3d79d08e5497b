/*
 * matmul: dequantizing mat-vec kernels (decode) and the cuBLAS GEMM path
 * (prefill). See matmul.cuh for the scheme and dequant.cuh for the block
 * readers.
 */
#include "engine/cuda/matmul.cuh"

#include "engine/cuda/dequant.cuh"
#include "engine/cuda/elementwise.cuh"
#include "engine/cuda/mmq.cuh"
#include "engine/cuda/mmq_i8.cuh"
#include "engine/cuda/mmvq.cuh"

#define MMV_WARPS 4   /* output rows (warps) per thread block */

bool gpe_cuda_weight_ok(gpe_type t, int64_t n_cols)
{
    bool ok = false;
    gpe_cuda_dispatch_type(t, [&](auto tr) {
        using T = decltype(tr);
        ok = n_cols > 0 && n_cols % T::BLK == 0;
    });
    return ok;
}

/* ------------------------------------------------------------- mat-vec */

/* One warp per output row: lane i takes chunks i, i+32, ... of the row,
 * accumulates NC dot products (one per activation row) and the warp sums
 * them. A warp whose row is out of range leaves as a whole, so the full-mask
 * shuffles in warp_sum are safe. */
template <typename T, int NC>
__global__ void __launch_bounds__(MMV_WARPS * GPE_WARP)
    mmv_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int64_t n_rows, int n_chunks,
               const float *__restrict__ x, int64_t ldx, float *__restrict__ y, int64_t ldy)
{
    const int lane = threadIdx.x;
    const int64_t row = (int64_t)blockIdx.x * MMV_WARPS + threadIdx.y;
    if (row >= n_rows)
        return;
    const uint8_t *wr = W + (size_t)row * row_bytes;
    float acc[NC];
#pragma unroll
    for (int j = 0; j < NC; j++)
        acc[j] = 0.0f;

    for (int ci = lane; ci < n_chunks; ci += GPE_WARP) {
        const int blk = ci / T::CPB, c = ci % T::CPB;
        float v[T::VALS];
        int col[T::VALS / 4];
        T::load(wr + (size_t)blk * T::BYTES, c, v, col);
        const int64_t base = (int64_t)blk * T::BLK;
#pragma unroll
        for (int g = 0; g < T::VALS / 4; g++) {
#pragma unroll
            for (int j = 0; j < NC; j++) {
                const float4 a =
                    *reinterpret_cast<const float4 *>(x + j * ldx + base + col[g]);
                acc[j] += v[4 * g] * a.x + v[4 * g + 1] * a.y + v[4 * g + 2] * a.z +
                          v[4 * g + 3] * a.w;
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NC; j++) {
        const float s = warp_sum(acc[j]);
        if (lane == 0)
            y[j * ldy + row] = s;
    }
}

template <typename T, int NC>
static void mmv_launch(const gpe_cuda_weight *w, const float *x, float *y, int64_t ldy,
                       cudaStream_t stream)
{
    const int n_chunks = (int)(w->n_cols / T::BLK * T::CPB);
    const dim3 block(GPE_WARP, MMV_WARPS);
    const dim3 grid(gpe_cuda_div_up((size_t)w->n_rows, MMV_WARPS));
    mmv_kernel<T, NC><<<grid, block, 0, stream>>>(w->data, w->row_bytes, w->n_rows, n_chunks,
                                                  x, w->n_cols, y, ldy);
}

template <typename T>
static void mmv_dispatch(const gpe_cuda_weight *w, const float *x, int n_tok, float *y,
                         int64_t ldy, cudaStream_t stream)
{
    switch (n_tok) {
    case 1: mmv_launch<T, 1>(w, x, y, ldy, stream); break;
    case 2: mmv_launch<T, 2>(w, x, y, ldy, stream); break;
    case 3: mmv_launch<T, 3>(w, x, y, ldy, stream); break;
    case 4: mmv_launch<T, 4>(w, x, y, ldy, stream); break;
    case 5: mmv_launch<T, 5>(w, x, y, ldy, stream); break;
    case 6: mmv_launch<T, 6>(w, x, y, ldy, stream); break;
    case 7: mmv_launch<T, 7>(w, x, y, ldy, stream); break;
    default: mmv_launch<T, 8>(w, x, y, ldy, stream); break;
    }
}
static_assert(GPE_CUDA_MMV_MAX == 8, "mmv_dispatch instantiates 1..8 columns");

/* -------------------------------------------------------- dequantize */

static __device__ __forceinline__ void store_val(float *p, float v) { *p = v; }
static __device__ __forceinline__ void store_val(__half *p, float v) { *p = __float2half_rn(v); }

/* One thread per chunk of rows [0, n_rows): writes VALS values of the
 * dequantized matrix (row-major, n_cols per row) as OUT. */
template <typename T, typename OUT>
__global__ void dequant_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int64_t n_rows,
                               int64_t n_cols, OUT *__restrict__ out)
{
    const int64_t chunks_per_row = n_cols / T::BLK * T::CPB;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_rows * chunks_per_row)
        return;
    const int64_t r = i / chunks_per_row;
    const int ci = (int)(i % chunks_per_row);
    const int blk = ci / T::CPB, c = ci % T::CPB;
    float v[T::VALS];
    int col[T::VALS / 4];
    T::load(W + (size_t)r * row_bytes + (size_t)blk * T::BYTES, c, v, col);
    OUT *o = out + r * n_cols + (int64_t)blk * T::BLK;
#pragma unroll
    for (int g = 0; g < T::VALS / 4; g++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            store_val(o + col[g] + e, v[4 * g + e]);
}

template <typename OUT>
static bool dequant_launch(const gpe_cuda_weight *w, int64_t row0, int64_t n_rows, OUT *out,
                           cudaStream_t stream)
{
    return gpe_cuda_dispatch_type(w->type, [&](auto tr) {
        using T = decltype(tr);
        const int64_t n = n_rows * (w->n_cols / T::BLK * T::CPB);
        dequant_kernel<T, OUT><<<gpe_cuda_div_up((size_t)n, 256), 256, 0, stream>>>(
            w->data + (size_t)row0 * w->row_bytes, w->row_bytes, n_rows, w->n_cols, out);
    });
}

gpe_status gpe_cuda_dequant_f32(const gpe_cuda_weight *w, float *out, cudaStream_t stream,
                                char *err, size_t errlen)
{
    if (!gpe_cuda_weight_ok(w->type, w->n_cols))
        return gpe_cuda_seterr(err, errlen, "dequantize: type %s with %lld columns unsupported",
                               gpe_type_name(w->type), (long long)w->n_cols);
    dequant_launch<float>(w, 0, w->n_rows, out, stream);
    CUDA_CHECK_LAUNCH();
    return GPE_OK;
}

/* ---------------------------------------------------------------- GEMM */

/* Column-major view (cuBLAS): W row-major [R][C] is C x R with ld C, so
 * Y^T (R x T, ld ldy) = op(W)^T (R x C) * X^T (C x T, ld C). */
static gpe_status gemm(const gpe_cuda_mm *mm, const gpe_cuda_weight *w, const float *x,
                       int n_tok, float *y, int64_t ldy, char *err, size_t errlen)
{
    const float one = 1.0f, zero = 0.0f;
    const int64_t C = w->n_cols;
    CUBLAS_CHECK(cublasSetStream(mm->blas, mm->stream));
    if (w->type == GPE_TYPE_F32) {
        CUBLAS_CHECK(cublasGemmEx(mm->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->n_rows, n_tok,
                                  (int)C, &one, w->data, CUDA_R_32F, (int)C, x, CUDA_R_32F,
                                  (int)C, &zero, y, CUDA_R_32F, (int)ldy, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
        return GPE_OK;
    }
    const bool f32 = w->type == GPE_TYPE_BF16;   /* BF16 may exceed the F16 range */
    const size_t esz = f32 ? sizeof(float) : sizeof(__half);
    int64_t slice = (int64_t)(mm->wbuf_bytes / esz / (size_t)C);
    if (slice < 1)
        return gpe_cuda_seterr(err, errlen, "GEMM: dequantization buffer too small");
    if (!f32) {
        if ((size_t)n_tok * (size_t)C > mm->xh_elems)
            return gpe_cuda_seterr(err, errlen, "GEMM: F16 activation buffer too small");
        gpe_cuda_f32_to_f16(x, mm->xh, (int64_t)n_tok * C, mm->stream);
        CUDA_CHECK_LAUNCH();
    }
    for (int64_t r0 = 0; r0 < w->n_rows; r0 += slice) {
        const int64_t nr = w->n_rows - r0 < slice ? w->n_rows - r0 : slice;
        if (f32)
            dequant_launch<float>(w, r0, nr, (float *)mm->wbuf, mm->stream);
        else
            dequant_launch<__half>(w, r0, nr, (__half *)mm->wbuf, mm->stream);
        CUDA_CHECK_LAUNCH();
        const cudaDataType_t dt = f32 ? CUDA_R_32F : CUDA_R_16F;
        const void *B = f32 ? (const void *)x : (const void *)mm->xh;
        CUBLAS_CHECK(cublasGemmEx(mm->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, n_tok, (int)C,
                                  &one, mm->wbuf, dt, (int)C, B, dt, (int)C, &zero, y + r0,
                                  CUDA_R_32F, (int)ldy, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
    }
    return GPE_OK;
}

/* The dp4a kernels take this product (mat-vec sizes, a type they know, room
 * for the rounded activations). */
static bool use_mmvq(const gpe_cuda_mm *mm, const gpe_cuda_weight *w, int n_tok)
{
    return n_tok >= 1 && n_tok <= GPE_CUDA_MMV_MAX && mm->xq && gpe_cuda_mmvq_takes(w->type) &&
           (size_t)n_tok * (size_t)w->n_cols <= mm->xq_elems;
}

bool gpe_cuda_matmul_rounds(const gpe_cuda_mm *mm, const gpe_cuda_weight *w, int n_tok)
{
    return gpe_cuda_weight_ok(w->type, w->n_cols) && use_mmvq(mm, w, n_tok);
}

/* The small-batch GEMM (mmq.cuh) takes this product: its sizes and type,
 * and room for the F16 activations and the split sums. */
static bool use_mmq(const gpe_cuda_mm *mm, const gpe_cuda_weight *w, int n_tok)
{
    return gpe_cuda_mmq_takes(w, n_tok) && mm->xh &&
           (size_t)n_tok * (size_t)w->n_cols <= mm->xh_elems &&
           gpe_cuda_mmq_part_floats(w->n_rows, w->n_cols, n_tok) <= mm->mmq_part_elems;
}

/* The int8 small-batch GEMM (mmq_i8.cuh) takes this product: the batch
 * sizes of the F16 one, a type it knows, room for the rounded activations
 * and the split sums. */
static bool use_mmq_i8(const gpe_cuda_mm *mm, const gpe_cuda_weight *w, int n_tok)
{
    return gpe_cuda_mmq_takes(w, n_tok) && gpe_cuda_mmq_i8_takes(w->type) && mm->xq &&
           (size_t)n_tok * (size_t)w->n_cols <= mm->xq_elems &&
           gpe_cuda_mmq_i8_part_floats(w->n_rows, w->n_cols, n_tok) <= mm->mmq_part_elems;
}

gpe_status gpe_cuda_matmul(const gpe_cuda_mm *mm, const gpe_cuda_weight *w, const float *x,
                           int n_tok, float *y, int64_t ldy, bool force_gemm, char *err,
                           size_t errlen)
{
    if (n_tok <= 0)
        return GPE_OK;
    if (!gpe_cuda_weight_ok(w->type, w->n_cols))
        return gpe_cuda_seterr(err, errlen, "matmul: type %s with %lld columns unsupported",
                               gpe_type_name(w->type), (long long)w->n_cols);
    if (!force_gemm && use_mmq_i8(mm, w, n_tok)) {
        gpe_cuda_mmvq_quantize(mm, x, n_tok, w->n_cols);
        gpe_cuda_mmq_i8(mm, w, n_tok, y, ldy);
        CUDA_CHECK_LAUNCH();
        return GPE_OK;
    }
    if (!force_gemm && use_mmq(mm, w, n_tok)) {
        gpe_cuda_f32_to_f16(x, mm->xh, (int64_t)n_tok * w->n_cols, mm->stream);
        gpe_cuda_mmq(mm, w, n_tok, y, ldy);
        CUDA_CHECK_LAUNCH();
        return GPE_OK;
    }
    if (n_tok > GPE_CUDA_MMV_MAX || force_gemm)
        return gemm(mm, w, x, n_tok, y, ldy, err, errlen);
    if (use_mmvq(mm, w, n_tok)) {
        gpe_cuda_mmvq_quantize(mm, x, n_tok, w->n_cols);
        gpe_cuda_mmvq(mm, w, n_tok, y, ldy, false);
        CUDA_CHECK_LAUNCH();
        return GPE_OK;
    }
    gpe_cuda_dispatch_type(w->type, [&](auto tr) {
        mmv_dispatch<decltype(tr)>(w, x, n_tok, y, ldy, mm->stream);
    });
    CUDA_CHECK_LAUNCH();
    return GPE_OK;
}

gpe_status gpe_cuda_matmul_n(const gpe_cuda_mm *mm, const gpe_cuda_weight *const *w, int n_w,
                             const float *x, int n_tok, float *const *y, const int64_t *ldy,
                             char *err, size_t errlen)
{
    bool rounded = false;   /* mm->xq holds x */
    for (int i = 0; i < n_w; i++) {
        /* 9..64 tokens on the int8 small-batch GEMM: x rounded once too
         * (n_tok is the same for every weight, so the rounded x is never
         * shared with the mat-vec branch below) */
        if (n_tok > 0 && gpe_cuda_weight_ok(w[i]->type, w[i]->n_cols) &&
            use_mmq_i8(mm, w[i], n_tok) && (i == 0 || w[i]->n_cols == w[0]->n_cols)) {
            if (!rounded)
                gpe_cuda_mmvq_quantize(mm, x, n_tok, w[i]->n_cols);
            rounded = true;
            gpe_cuda_mmq_i8(mm, w[i], n_tok, y[i], ldy[i]);
            CUDA_CHECK_LAUNCH();
            continue;
        }
        if (n_tok <= 0 || !gpe_cuda_weight_ok(w[i]->type, w[i]->n_cols) ||
            !use_mmvq(mm, w[i], n_tok) || (i > 0 && w[i]->n_cols != w[0]->n_cols)) {
            gpe_status st = gpe_cuda_matmul(mm, w[i], x, n_tok, y[i], ldy[i], false, err, errlen);
            if (st)
                return st;
            rounded = false;   /* it may have rounded x itself: not relied upon */
            continue;
        }
        if (!rounded)
            gpe_cuda_mmvq_quantize(mm, x, n_tok, w[i]->n_cols);
        rounded = true;
        gpe_cuda_mmvq(mm, w[i], n_tok, y[i], ldy[i], false);
        CUDA_CHECK_LAUNCH();
    }
    return GPE_OK;
}
