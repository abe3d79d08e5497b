/*
 * optest: single-kernel entry points for the self-test (optest.h). Device
 * buffers live in a small arena freed on every return path.
 */
#include "engine/cuda/optest.h"

#include <cmath>
#include <cstring>

#include "engine/cuda/attention.cuh"
#include "engine/cuda/backend_cuda.h"
#include "engine/cuda/common.cuh"
#include "engine/cuda/fused.cuh"
#include "engine/cuda/matmul.cuh"
#include "engine/cuda/mmq.cuh"
#include "engine/cuda/mmq_i8.cuh"
#include "engine/cuda/mmvq.cuh"
#include "engine/cuda/norm.cuh"
#include "engine/cuda/rope.cuh"

namespace {

/* Device allocations of one call, freed by the destructor. */
struct arena {
    void *p[16] = {};
    int n = 0;
    cudaStream_t stream = NULL;
    cublasHandle_t blas = NULL;
    ~arena()
    {
        if (stream)
            cudaStreamSynchronize(stream);
        for (int i = 0; i < n; i++)
            cudaFree(p[i]);
        if (blas)
            cublasDestroy(blas);
        if (stream)
            cudaStreamDestroy(stream);
    }
    template <typename T> cudaError_t alloc(T **out, size_t bytes)
    {
        *out = NULL;
        if (n == 16)
            return cudaErrorMemoryAllocation;
        void *q = NULL;
        cudaError_t e = cudaMalloc(&q, bytes ? bytes : 1);
        if (e == cudaSuccess)
            p[n++] = q;
        *out = static_cast<T *>(q);
        return e;
    }
};

/* Device copy of n bytes of host memory. */
template <typename T>
static gpe_status upload(arena &a, T **dst, const void *src, size_t bytes, char *err,
                         size_t errlen)
{
    CUDA_CHECK(a.alloc(dst, bytes));
    CUDA_CHECK(cudaMemcpy(*dst, src, bytes, cudaMemcpyHostToDevice));
    return GPE_OK;
}

static gpe_status begin(arena &a, bool with_blas, char *err, size_t errlen)
{
    if (!gpe_cuda_device_count(NULL))
        return gpe_cuda_seterr(err, errlen, "no CUDA device");
    CUDA_CHECK(cudaSetDevice(0));
    /* A blocking stream: it is ordered after the synchronous cudaMemcpy /
     * cudaMemset calls below (legacy default stream), whose device-side
     * work may still be in flight when they return. */
    CUDA_CHECK(cudaStreamCreate(&a.stream));
    if (with_blas) {
        CUBLAS_CHECK(cublasCreate(&a.blas));
        CUBLAS_CHECK(cublasSetMathMode(a.blas, CUBLAS_DEFAULT_MATH));
    }
    return GPE_OK;
}

static gpe_status finish(arena &a, void *host, const void *dev, size_t bytes, char *err,
                         size_t errlen)
{
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, a.stream));
    CUDA_CHECK(cudaStreamSynchronize(a.stream));
    return GPE_OK;
}

static gpe_status weight(arena &a, gpe_type t, const void *w, int64_t n_rows, int64_t n_cols,
                         gpe_cuda_weight *out, char *err, size_t errlen)
{
    out->type = t;
    out->n_cols = n_cols;
    out->n_rows = n_rows;
    out->row_bytes = gpe_row_size(t, n_cols);
    if (out->row_bytes == 0 || !gpe_cuda_weight_ok(t, n_cols))
        return gpe_cuda_seterr(err, errlen, "type %s with %lld columns unsupported",
                               gpe_type_name(t), (long long)n_cols);
    uint8_t *d = NULL;
    gpe_status st = upload(a, &d, w, out->row_bytes * (size_t)n_rows, err, errlen);
    out->data = d;
    return st;
}

} // namespace

gpe_status gpe_cuda_test_dequant(gpe_type t, const void *w, int64_t n_rows, int64_t n_cols,
                                 float *out, char *err, size_t errlen)
{
    arena a;
    gpe_status st;
    gpe_cuda_weight cw;
    float *d_out = NULL;
    const size_t bytes = (size_t)n_rows * (size_t)n_cols * sizeof(float);
    if ((st = begin(a, false, err, errlen)) || (st = weight(a, t, w, n_rows, n_cols, &cw, err,
                                                            errlen)))
        return st;
    CUDA_CHECK(a.alloc(&d_out, bytes));
    if ((st = gpe_cuda_dequant_f32(&cw, d_out, a.stream, err, errlen)))
        return st;
    return finish(a, out, d_out, bytes, err, errlen);
}

gpe_status gpe_cuda_test_matmul(gpe_type t, const void *w, int64_t n_rows, int64_t n_cols,
                                const float *x, int n_tok, bool force_gemm, float *y,
                                char *err, size_t errlen)
{
    arena a;
    gpe_status st;
    gpe_cuda_weight cw;
    float *d_x = NULL, *d_y = NULL;
    gpe_cuda_mm mm;
    memset(&mm, 0, sizeof mm);
    const size_t xb = (size_t)n_tok * (size_t)n_cols * sizeof(float);
    const size_t yb = (size_t)n_tok * (size_t)n_rows * sizeof(float);
    if ((st = begin(a, true, err, errlen)) ||
        (st = weight(a, t, w, n_rows, n_cols, &cw, err, errlen)) ||
        (st = upload(a, &d_x, x, xb, err, errlen)))
        return st;
    CUDA_CHECK(a.alloc(&d_y, yb));
    mm.blas = a.blas;
    mm.stream = a.stream;
    /* Room for a third of the rows per slice: exercises the sliced GEMM. */
    int64_t slice = (n_rows + 2) / 3;
    mm.wbuf_bytes = (size_t)slice * (size_t)n_cols * sizeof(float);
    mm.xh_elems = (size_t)n_tok * (size_t)n_cols;
    CUDA_CHECK(a.alloc(&mm.wbuf, mm.wbuf_bytes));
    CUDA_CHECK(a.alloc(&mm.xh, mm.xh_elems * sizeof(__half)));
    mm.xq_elems = (size_t)n_tok * (size_t)n_cols;
    CUDA_CHECK(a.alloc(&mm.xq, mm.xq_elems));
    CUDA_CHECK(a.alloc(&mm.xqd, (mm.xq_elems / 32 + 1) * sizeof(float)));
    mm.mmq_part_elems = gpe_cuda_mmq_part_floats(n_rows, n_cols, n_tok);
    CUDA_CHECK(a.alloc(&mm.mmq_part, mm.mmq_part_elems * sizeof(float)));
    if ((st = gpe_cuda_matmul(&mm, &cw, d_x, n_tok, d_y, n_rows, force_gemm, err, errlen)))
        return st;
    return finish(a, y, d_y, yb, err, errlen);
}

bool gpe_cuda_test_mmq_i8(gpe_type t)
{
    return gpe_cuda_mmq_i8_takes(t);
}

bool gpe_cuda_test_matvec_q8(gpe_type t)
{
    return gpe_cuda_mmvq_takes(t);
}

gpe_status gpe_cuda_test_fused(int op, gpe_type t, const void *w, int64_t n_rows,
                               int64_t n_cols, const float *x, const float *aux,
                               const float *res, int n_tok, bool fuse, float *y, bool *fused,
                               char *err, size_t errlen)
{
    arena a;
    gpe_status st;
    gpe_cuda_weight cw;
    float *d_x = NULL, *d_aux = NULL, *d_y = NULL, *d_tmp = NULL, *d_xn = NULL;
    gpe_cuda_mm mm;
    memset(&mm, 0, sizeof mm);
    *fused = false;
    const size_t xb = (size_t)n_tok * (size_t)n_cols * sizeof(float);
    const size_t yb = (size_t)n_tok * (size_t)n_rows * sizeof(float);
    const size_t auxb = op == GPE_CUDA_TEST_FUSE_NORM ? (size_t)n_cols * sizeof(float) : xb;
    /* no cuBLAS: at most 8 rows never take the GEMM (and a handle per call
     * would cost more than the check) */
    if (n_tok < 1 || n_tok > GPE_CUDA_MMV_MAX)
        return gpe_cuda_seterr(err, errlen, "fused test: 1..%d rows", GPE_CUDA_MMV_MAX);
    if ((st = begin(a, false, err, errlen)) ||
        (st = weight(a, t, w, n_rows, n_cols, &cw, err, errlen)) ||
        (st = upload(a, &d_x, x, xb, err, errlen)))
        return st;
    if (op != GPE_CUDA_TEST_FUSE_ADD && (st = upload(a, &d_aux, aux, auxb, err, errlen)))
        return st;
    if (op == GPE_CUDA_TEST_FUSE_NORM)
        CUDA_CHECK(a.alloc(&d_y, yb));
    else if ((st = upload(a, &d_y, res, yb, err, errlen)))
        return st;
    CUDA_CHECK(a.alloc(&d_tmp, yb));
    CUDA_CHECK(a.alloc(&d_xn, xb));
    mm.blas = a.blas;
    mm.stream = a.stream;
    mm.xq_elems = (size_t)n_tok * (size_t)n_cols;
    CUDA_CHECK(a.alloc(&mm.xq, mm.xq_elems));
    CUDA_CHECK(a.alloc(&mm.xqd, (mm.xq_elems / 32 + 1) * sizeof(float)));
    switch (op) {
    case GPE_CUDA_TEST_FUSE_NORM: {
        /* three weights of a third of the rows each, outputs side by side */
        const int64_t r3 = n_rows / 3;
        gpe_cuda_weight cw3[3] = {cw, cw, cw};
        for (int k = 0; k < 3; k++) {
            cw3[k].data = cw.data + (size_t)k * (size_t)r3 * cw.row_bytes;
            cw3[k].n_rows = r3;
        }
        const gpe_cuda_weight *const ws[3] = {&cw3[0], &cw3[1], &cw3[2]};
        float *const ys[3] = {d_y, d_y + r3, d_y + 2 * r3};
        const int64_t ld[3] = {n_rows, n_rows, n_rows};
        if (n_rows % 3 != 0)
            return gpe_cuda_seterr(err, errlen, "fused norm test: rows not a multiple of 3");
        st = gpe_cuda_norm_matmul_n(&mm, d_x, NULL, d_aux, (int)n_cols, 1e-5f, d_xn, ws, 3,
                                    n_tok, ys, ld, fuse, fused, err, errlen);
        break;
    }
    case GPE_CUDA_TEST_FUSE_ADD:
        st = gpe_cuda_matmul_add(&mm, &cw, d_x, n_tok, d_y, d_tmp, fuse, fused, err, errlen);
        break;
    default:
        st = gpe_cuda_swiglu_matmul_add(&mm, &cw, d_x, d_aux, n_tok, d_y, d_tmp, fuse, fused,
                                        err, errlen);
        break;
    }
    if (st)
        return st;
    return finish(a, y, d_y, yb, err, errlen);
}

gpe_status gpe_cuda_test_rmsnorm(const float *x, const float *w, int n_rows, int n, float eps,
                                 float *out, char *err, size_t errlen)
{
    arena a;
    gpe_status st;
    float *d_x = NULL, *d_w = NULL, *d_o = NULL;
    const size_t xb = (size_t)n_rows * (size_t)n * sizeof(float);
    if ((st = begin(a, false, err, errlen)) || (st = upload(a, &d_x, x, xb, err, errlen)) ||
        (st = upload(a, &d_w, w, (size_t)n * sizeof(float), err, errlen)))
        return st;
    CUDA_CHECK(a.alloc(&d_o, xb));
    gpe_cuda_rmsnorm(d_x, NULL, d_w, d_o, n_rows, n, eps, a.stream);
    return finish(a, out, d_o, xb, err, errlen);
}

gpe_status gpe_cuda_test_rope(float *q, const float *k, const float *v, const int *pos,
                              int n_tok, int n_head, int n_head_kv, int hd, int n_rot,
                              float base, float freq_scale, const float *freqs, int n_ctx,
                              float *k_cache, float *v_cache, char *err, size_t errlen)
{
    arena a;
    gpe_status st;
    float *d_q = NULL, *d_k = NULL, *d_v = NULL, *d_kc = NULL, *d_vc = NULL, *d_f = NULL;
    int *d_pos = NULL, *d_seq = NULL;
    const size_t kvd = (size_t)n_head_kv * hd;
    const size_t qb = (size_t)n_tok * n_head * hd * sizeof(float);
    const size_t kb = (size_t)n_tok * kvd * sizeof(float);
    const size_t cb = (size_t)n_ctx * kvd * sizeof(float);
    if (n_rot > GPE_CUDA_MAX_ROT || n_rot % 2 != 0 || n_rot > hd)
        return gpe_cuda_seterr(err, errlen, "rope: bad n_rot %d", n_rot);
    if ((st = begin(a, false, err, errlen)) || (st = upload(a, &d_q, q, qb, err, errlen)) ||
        (st = upload(a, &d_k, k, kb, err, errlen)) ||
        (st = upload(a, &d_v, v, kb, err, errlen)) ||
        (st = upload(a, &d_pos, pos, (size_t)n_tok * sizeof(int), err, errlen)))
        return st;
    if (freqs && (st = upload(a, &d_f, freqs, (size_t)n_rot / 2 * sizeof(float), err, errlen)))
        return st;
    CUDA_CHECK(a.alloc(&d_seq, (size_t)n_tok * sizeof(int)));
    CUDA_CHECK(cudaMemset(d_seq, 0, (size_t)n_tok * sizeof(int)));
    CUDA_CHECK(a.alloc(&d_kc, cb));
    CUDA_CHECK(a.alloc(&d_vc, cb));
    CUDA_CHECK(cudaMemset(d_kc, 0, cb));
    CUDA_CHECK(cudaMemset(d_vc, 0, cb));
    gpe_cuda_rope_args ra;
    ra.q = d_q;
    ra.k = d_k;
    ra.v = d_v;
    ra.pos = d_pos;
    ra.seq = d_seq;
    ra.k_cache = d_kc;
    ra.v_cache = d_vc;
    ra.f16 = false;
    ra.n_tok = n_tok;
    ra.n_head = n_head;
    ra.n_head_kv = n_head_kv;
    ra.head_dim = hd;
    ra.n_rot = n_rot;
    ra.n_ctx = n_ctx;
    ra.theta_scale = powf(base, -2.0f / (float)n_rot);
    ra.freq_scale = freq_scale;
    ra.freqs = d_f;
    ra.neox = false;
    gpe_cuda_rope_store(&ra, a.stream);
    if ((st = finish(a, q, d_q, qb, err, errlen)) ||
        (st = finish(a, k_cache, d_kc, cb, err, errlen)))
        return st;
    return finish(a, v_cache, d_vc, cb, err, errlen);
}

gpe_status gpe_cuda_test_attention(const float *q, const float *k_cache, const float *v_cache,
                                   const int *pos, const int *seq, int n_tok, int n_seq,
                                   int n_ctx, int n_head, int n_head_kv, int hd,
                                   float softcap, int window, bool decode_rows, float *out,
                                   char *err, size_t errlen)
{
    arena a;
    gpe_status st;
    float *d_q = NULL, *d_kc = NULL, *d_vc = NULL, *d_o = NULL, *d_part = NULL;
    int *d_pos = NULL, *d_seq = NULL;
    const size_t qb = (size_t)n_tok * n_head * hd * sizeof(float);
    const size_t cb = (size_t)n_seq * n_ctx * n_head_kv * hd * sizeof(float);
    if (hd > GPE_CUDA_MAX_HEAD_DIM || n_head % n_head_kv != 0)
        return gpe_cuda_seterr(err, errlen, "attention: bad head size / head counts");
    if ((st = begin(a, false, err, errlen)) || (st = upload(a, &d_q, q, qb, err, errlen)) ||
        (st = upload(a, &d_kc, k_cache, cb, err, errlen)) ||
        (st = upload(a, &d_vc, v_cache, cb, err, errlen)) ||
        (st = upload(a, &d_pos, pos, (size_t)n_tok * sizeof(int), err, errlen)) ||
        (st = upload(a, &d_seq, seq, (size_t)n_tok * sizeof(int), err, errlen)))
        return st;
    CUDA_CHECK(a.alloc(&d_o, qb));
    CUDA_CHECK(a.alloc(&d_part, gpe_cuda_attn_part_floats(n_head, hd) * sizeof(float)));
    gpe_cuda_attn_args aa;
    aa.q = d_q;
    aa.k_cache = d_kc;
    aa.v_cache = d_vc;
    aa.f16 = false;
    aa.pos = d_pos;
    aa.seq = d_seq;
    aa.out = d_o;
    aa.n_tok = n_tok;
    aa.n_head = n_head;
    aa.n_head_kv = n_head_kv;
    aa.head_dim = hd;
    aa.n_ctx = n_ctx;
    aa.scale = 1.0f / sqrtf((float)hd);
    aa.softcap = softcap;
    aa.window = window;
    aa.part = d_part;
    aa.decode_rows = decode_rows;
    gpe_cuda_attention(&aa, a.stream);
    return finish(a, out, d_o, qb, err, errlen);
}
