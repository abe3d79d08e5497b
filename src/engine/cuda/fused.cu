/*
 * fused: fused decode steps with their separate fallbacks (fused.cuh).
 */
#include "engine/cuda/fused.cuh"

#include <stdlib.h>
#include <string.h>

#include "engine/cuda/elementwise.cuh"
#include "engine/cuda/mmvq.cuh"
#include "engine/cuda/norm.cuh"

bool gpe_cuda_fuse_default(void)
{
    static const bool on = [] {
        const char *e = getenv("GPUPOOL_CUDA_FUSE");
        return !(e && strcmp(e, "0") == 0);
    }();
    return on;
}

/* Every weight of the group takes the dp4a mat-vec on rows of n values
 * (so n is a multiple of 32: the weights are whole blocks of 32 or 256). */
static bool all_round(const gpe_cuda_mm *mm, const gpe_cuda_weight *const *w, int n_w,
                      int64_t n, int n_tok)
{
    if (n % GPE_CUDA_Q8_BLK != 0)
        return false;
    for (int i = 0; i < n_w; i++)
        if (w[i]->n_cols != n || !gpe_cuda_matmul_rounds(mm, w[i], n_tok))
            return false;
    return true;
}

gpe_status gpe_cuda_norm_matmul_n(const gpe_cuda_mm *mm, const float *x, const int *rows,
                                  const float *nw, int n, float eps, float *xn,
                                  const gpe_cuda_weight *const *w, int n_w, int n_tok,
                                  float *const *y, const int64_t *ldy, bool fuse, bool *fused,
                                  char *err, size_t errlen)
{
    const bool f = fuse && n_w > 0 && all_round(mm, w, n_w, n, n_tok);
    if (fused)
        *fused = f;
    if (n_tok <= 0)
        return GPE_OK;
    if (!f) {
        gpe_cuda_rmsnorm(x, rows, nw, xn, n_tok, n, eps, mm->stream);
        CUDA_CHECK_LAUNCH();
        return gpe_cuda_matmul_n(mm, w, n_w, xn, n_tok, y, ldy, err, errlen);
    }
    gpe_cuda_rmsnorm_q8(x, rows, nw, xn, mm->xq, mm->xqd, n_tok, n, eps, mm->stream);
    CUDA_CHECK_LAUNCH();
    /* consecutive weights of one type share a launch (Q/K of a Q4_K_M
     * file, V often being Q6_K; gate/up) */
    for (int i = 0; i < n_w;) {
        int j = i + 1;
        while (j < n_w && j - i < GPE_CUDA_MMVQ_GROUP && w[j]->type == w[i]->type)
            j++;
        gpe_cuda_mmvq_n(mm, w + i, j - i, n_tok, y + i, ldy + i, false);
        i = j;
    }
    CUDA_CHECK_LAUNCH();
    return GPE_OK;
}

gpe_status gpe_cuda_matmul_add(const gpe_cuda_mm *mm, const gpe_cuda_weight *w, const float *x,
                               int n_tok, float *res, float *tmp, bool fuse, bool *fused,
                               char *err, size_t errlen)
{
    const bool f = fuse && gpe_cuda_matmul_rounds(mm, w, n_tok);
    if (fused)
        *fused = f;
    if (n_tok <= 0)
        return GPE_OK;
    if (!f) {
        gpe_status st = gpe_cuda_matmul(mm, w, x, n_tok, tmp, w->n_rows, false, err, errlen);
        if (st)
            return st;
        gpe_cuda_add(res, tmp, (int64_t)n_tok * w->n_rows, mm->stream);
        CUDA_CHECK_LAUNCH();
        return GPE_OK;
    }
    gpe_cuda_mmvq_quantize(mm, x, n_tok, w->n_cols);
    gpe_cuda_mmvq(mm, w, n_tok, res, w->n_rows, true);
    CUDA_CHECK_LAUNCH();
    return GPE_OK;
}

gpe_status gpe_cuda_swiglu_matmul_add(const gpe_cuda_mm *mm, const gpe_cuda_weight *w,
                                      float *gate, const float *up, int n_tok, float *res,
                                      float *tmp, bool fuse, bool *fused, char *err,
                                      size_t errlen)
{
    const bool f = fuse && gpe_cuda_matmul_rounds(mm, w, n_tok) &&
                   w->n_cols % GPE_CUDA_Q8_BLK == 0;
    if (fused)
        *fused = f;
    if (n_tok <= 0)
        return GPE_OK;
    if (!f) {
        gpe_cuda_swiglu(gate, up, (int64_t)n_tok * w->n_cols, mm->stream);
        CUDA_CHECK_LAUNCH();
        return gpe_cuda_matmul_add(mm, w, gate, n_tok, res, tmp, fuse, NULL, err, errlen);
    }
    gpe_cuda_swiglu_q8(gate, up, (int64_t)n_tok * w->n_cols, mm->xq, mm->xqd, mm->stream);
    CUDA_CHECK_LAUNCH();
    gpe_cuda_mmvq(mm, w, n_tok, res, w->n_rows, true);
    CUDA_CHECK_LAUNCH();
    return GPE_OK;
}
