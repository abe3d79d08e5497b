/*
 * forward: the CUDA backend's model (upload with a VRAM preflight), the
 * forward pass (same steps as gpe_llama_forward in model.c), and the public
 * gpe_cuda_available / gpe_cuda_selftest. See backend_cuda.h.
 *
 * Memory: three cudaMalloc regions per model: weights (every tensor at a
 * 256-byte aligned offset), KV cache (K then V), scratch (activations,
 * logits, GEMM buffers, the batch's token/pos/seq/row arrays).
 */
#include "engine/cuda/backend_cuda.h"

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "engine/cuda/attention.cuh"
#include "engine/cuda/common.cuh"
#include "engine/cuda/elementwise.cuh"
#include "engine/cuda/matmul.cuh"
#include "engine/cuda/norm.cuh"
#include "engine/cuda/rope.cuh"

#define ALIGN 256
#define OUT_CHUNK 32                         /* logits rows computed per output matmul */
#define GEMM_SLICE_ELEMS (16ull << 20)       /* dequantized elements per GEMM slice */
#define RESERVE_BYTES (64ull << 20)          /* cuBLAS workspace, allocator slack */

gpe_status gpe_cuda_seterr(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return GPE_ERR_BACKEND;
}

static gpe_status fail(gpe_status st, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static gpe_status fail(gpe_status st, char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return st;
}

static uint64_t align_up(uint64_t n)
{
    return (n + ALIGN - 1) / ALIGN * ALIGN;
}

/* ================================================================ model */

typedef struct cuda_layer {
    const float *attn_norm, *ffn_norm;
    gpe_cuda_weight wq, wk, wv, wo, w_gate, w_up, w_down;
    /* optional per family (NULL when absent): see model.h */
    const float *bq, *bk, *bv, *bo, *q_norm, *k_norm, *post_attn_norm, *post_ffn_norm;
    bool swa;                   /* sliding-window layer */
    float rope_base, rope_freq_scale;
} cuda_layer;

struct gpe_cuda_model {
    int device;
    gpe_hparams hp;
    int n_ctx, n_seq, n_batch;
    cudaStream_t stream;
    cublasHandle_t blas;
    gpe_cuda_mm mm;

    uint8_t *wmem;              /* weights region */
    uint64_t wmem_bytes;
    gpe_cuda_weight tok_embd, output;
    const float *output_norm;
    const float *rope_freqs;    /* NULL when absent */
    cuda_layer *layers;         /* host array [n_layer] of device pointers */

    float *kv;                  /* K region then V region */
    float *k_cache, *v_cache;   /* [n_layer][n_seq][n_ctx][kv_dim] each */

    uint8_t *smem;              /* scratch region */
    float *x, *xn, *q, *k, *v, *att, *gate, *up, *logits;
    int *d_ints;                /* [4][n_batch]: tokens, pos, seq, rows */
    int *h_ints;                /* host staging of the same */
};

static int64_t max3(int64_t a, int64_t b, int64_t c)
{
    int64_t m = a > b ? a : b;
    return m > c ? m : c;
}

/* Calls f(weight) for every 2-D weight of m (output only when untied). */
template <typename F> static void each_weight(const gpe_llama *m, F &&f)
{
    f(m->tok_embd);
    if (!m->tied_output)
        f(m->output);
    for (int l = 0; l < m->hp.n_layer; l++) {
        const gpe_layer *L = &m->layers[l];
        f(L->wq); f(L->wk); f(L->wv); f(L->wo);
        f(L->w_gate); f(L->w_up); f(L->w_down);
    }
}

/* Calls f(host vector, n floats, device slot) for every optional 1-D tensor
 * of layer L (biases, per-head and post norms), in one fixed order shared by
 * the budget and the upload; C is NULL for the budget. */
template <typename F>
static void each_opt_vec(const gpe_hparams *hp, const gpe_layer *L, cuda_layer *C, F &&f)
{
    const size_t E = (size_t)hp->n_embd, hd = (size_t)hp->head_dim;
    const size_t qd = (size_t)hp->n_head * hd, kvd = (size_t)hp->n_head_kv * hd;
    f(L->bq, qd, C ? &C->bq : NULL);
    f(L->bk, kvd, C ? &C->bk : NULL);
    f(L->bv, kvd, C ? &C->bv : NULL);
    f(L->bo, E, C ? &C->bo : NULL);
    f(L->q_norm, hd, C ? &C->q_norm : NULL);
    f(L->k_norm, hd, C ? &C->k_norm : NULL);
    f(L->post_attn_norm, E, C ? &C->post_attn_norm : NULL);
    f(L->post_ffn_norm, E, C ? &C->post_ffn_norm : NULL);
}

/* Scratch layout (offsets in a region of *total bytes); the same function
 * sizes the preflight and carves the allocation, so they cannot disagree. */
typedef struct scratch_plan {
    uint64_t x, xn, q, k, v, att, gate, up, logits, xh, wbuf, ints, total;
    uint64_t wbuf_bytes, xh_elems;
} scratch_plan;

static void plan_scratch(const gpe_llama *m, int n_batch, scratch_plan *p)
{
    const gpe_hparams *hp = &m->hp;
    const uint64_t B = (uint64_t)n_batch, E = (uint64_t)hp->n_embd;
    const uint64_t qd = (uint64_t)hp->n_head * hp->head_dim;
    const uint64_t kvd = (uint64_t)hp->n_head_kv * hp->head_dim;
    const uint64_t F = (uint64_t)hp->n_ff, V = (uint64_t)hp->n_vocab;
    const uint64_t maxc = (uint64_t)max3((int64_t)E, (int64_t)qd, (int64_t)F);
    const uint64_t out_rows = B < OUT_CHUNK ? B : OUT_CHUNK;
    uint64_t wbuf = 0;
    each_weight(m, [&](const gpe_weight &w) {
        if (w.type == GPE_TYPE_F32)
            return;
        uint64_t rows = GEMM_SLICE_ELEMS / (uint64_t)w.n_cols;
        if (rows < 1)
            rows = 1;
        if (rows > (uint64_t)w.n_rows)
            rows = (uint64_t)w.n_rows;
        const uint64_t bytes = rows * (uint64_t)w.n_cols * sizeof(float);
        if (bytes > wbuf)
            wbuf = bytes;
    });
    if (B <= GPE_CUDA_MMV_MAX)
        wbuf = 0;   /* batches this small always take the mat-vec path */
    uint64_t off = 0;
#define TAKE(field, bytes)       \
    do {                         \
        p->field = off;          \
        off += align_up(bytes);  \
    } while (0)
    TAKE(x, B * E * 4);
    TAKE(xn, B * E * 4);
    TAKE(q, B * qd * 4);
    TAKE(k, B * kvd * 4);
    TAKE(v, B * kvd * 4);
    TAKE(att, B * qd * 4);
    TAKE(gate, B * F * 4);
    TAKE(up, B * F * 4);
    TAKE(logits, out_rows * V * 4);
    TAKE(xh, wbuf ? B * maxc * 2 : 0);
    TAKE(wbuf, wbuf);
    TAKE(ints, 4 * B * sizeof(int));
#undef TAKE
    p->total = off;
    p->wbuf_bytes = wbuf;
    p->xh_elems = wbuf ? B * maxc : 0;
}

gpe_status gpe_cuda_model_bytes(const gpe_llama *m, int n_ctx, int n_seq, int n_batch,
                                gpe_cuda_budget *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (!m || !m->layers || n_ctx <= 0 || n_seq <= 0 || n_batch <= 0)
        return fail(GPE_ERR_ARG, err, errlen,
                    "CUDA backend: bad model or sizes (n_ctx %d, n_seq %d, n_batch %d)", n_ctx,
                    n_seq, n_batch);
    const gpe_hparams *hp = &m->hp;
    /* Every dense family's operations have kernels here; the MoE FFN does
     * not: refuse it rather than run a model without its experts. */
    if (hp->n_expert > 0)
        return fail(GPE_ERR_UNSUPPORTED, err, errlen,
                    "CUDA backend: mixture-of-experts layers (%s, expert_count %d) are not "
                    "implemented; use the CPU backend",
                    hp->arch, hp->n_expert);
    if (hp->head_dim > GPE_CUDA_MAX_HEAD_DIM || hp->n_rot > GPE_CUDA_MAX_ROT)
        return fail(GPE_ERR_UNSUPPORTED, err, errlen,
                    "CUDA backend: head size %d / rope dims %d exceed the kernels' limit %d",
                    hp->head_dim, hp->n_rot, GPE_CUDA_MAX_HEAD_DIM);
    gpe_status st = GPE_OK;
    uint64_t wbytes = 0;
    each_weight(m, [&](const gpe_weight &w) {
        if (st != GPE_OK)
            return;
        if (!gpe_cuda_weight_ok(w.type, w.n_cols) || w.n_rows <= 0 || w.n_rows > INT32_MAX ||
            w.n_cols > INT32_MAX) {
            st = fail(GPE_ERR_UNSUPPORTED, err, errlen,
                      "CUDA backend: weight of type %s, %lld x %lld, is not supported",
                      gpe_type_name(w.type), (long long)w.n_rows, (long long)w.n_cols);
            return;
        }
        wbytes += align_up((uint64_t)w.row_bytes * (uint64_t)w.n_rows);
    });
    if (st != GPE_OK)
        return st;
    const uint64_t E = (uint64_t)hp->n_embd;
    wbytes += align_up(E * 4) * (1 + 2 * (uint64_t)hp->n_layer);   /* norms */
    for (int l = 0; l < hp->n_layer; l++)
        each_opt_vec(hp, &m->layers[l], NULL, [&](const float *v, size_t n, const float **) {
            if (v)
                wbytes += align_up((uint64_t)n * 4);
        });
    if (m->rope_freqs)
        wbytes += align_up((uint64_t)(hp->n_rot / 2) * 4);
    const uint64_t kvd = (uint64_t)hp->n_head_kv * hp->head_dim;
    out->weights = wbytes;
    out->kv = 2 * align_up((uint64_t)hp->n_layer * (uint64_t)n_seq * (uint64_t)n_ctx * kvd * 4);
    scratch_plan sp;
    plan_scratch(m, n_batch, &sp);
    out->scratch = sp.total;
    out->reserve = RESERVE_BYTES;
    out->total = out->weights + out->kv + out->scratch + out->reserve;
    return GPE_OK;
}

bool gpe_cuda_device_count(int *n)
{
    int c = 0;
    if (cudaGetDeviceCount(&c) != cudaSuccess) {
        (void)cudaGetLastError();   /* clear the error state */
        c = 0;
    }
    if (n)
        *n = c;
    return c > 0;
}

void gpe_cuda_model_free(gpe_cuda_model *cm)
{
    if (!cm)
        return;
    cudaSetDevice(cm->device);
    if (cm->stream)
        cudaStreamSynchronize(cm->stream);
    if (cm->blas)
        cublasDestroy(cm->blas);
    if (cm->stream)
        cudaStreamDestroy(cm->stream);
    cudaFree(cm->wmem);
    cudaFree(cm->kv);
    cudaFree(cm->smem);
    free(cm->layers);
    free(cm->h_ints);
    free(cm);
}

/* Copies one tensor to the next slot of the weights region. */
static gpe_status put(gpe_cuda_model *cm, uint64_t *off, const void *src, size_t bytes,
                      const uint8_t **dst, char *err, size_t errlen)
{
    /* The budget and the copies walk the same tensors; this guard makes a
     * broken invariant an error instead of an overrun. */
    if (*off + bytes > cm->wmem_bytes)
        return gpe_cuda_seterr(err, errlen, "internal: weights exceed the planned %llu bytes",
                               (unsigned long long)cm->wmem_bytes);
    uint8_t *d = cm->wmem + *off;
    CUDA_CHECK(cudaMemcpyAsync(d, src, bytes, cudaMemcpyHostToDevice, cm->stream));
    *off += align_up(bytes);
    *dst = d;
    return GPE_OK;
}

static gpe_status put_weight(gpe_cuda_model *cm, uint64_t *off, const gpe_weight &w,
                             gpe_cuda_weight *out, char *err, size_t errlen)
{
    out->type = w.type;
    out->n_cols = w.n_cols;
    out->n_rows = w.n_rows;
    out->row_bytes = w.row_bytes;
    return put(cm, off, w.data, w.row_bytes * (size_t)w.n_rows, &out->data, err, errlen);
}

static gpe_status put_vec(gpe_cuda_model *cm, uint64_t *off, const float *v, size_t n,
                          const float **out, char *err, size_t errlen)
{
    const uint8_t *d = NULL;
    gpe_status st = put(cm, off, v, n * sizeof(float), &d, err, errlen);
    *out = reinterpret_cast<const float *>(d);
    return st;
}

static gpe_status upload(gpe_cuda_model *cm, const gpe_llama *m, const gpe_cuda_budget *b,
                         char *err, size_t errlen)
{
    const gpe_hparams *hp = &m->hp;
    gpe_status st;
    CUDA_CHECK(cudaStreamCreateWithFlags(&cm->stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&cm->blas));
    CUBLAS_CHECK(cublasSetStream(cm->blas, cm->stream));
    /* Full FP32 for F32 GEMMs (no TF32): results comparable to the CPU. */
    CUBLAS_CHECK(cublasSetMathMode(cm->blas, CUBLAS_DEFAULT_MATH));

    CUDA_CHECK(cudaMalloc(reinterpret_cast<void **>(&cm->wmem), b->weights));
    cm->wmem_bytes = b->weights;
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void **>(&cm->kv), b->kv));
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void **>(&cm->smem), b->scratch));
    CUDA_CHECK(cudaMemsetAsync(cm->kv, 0, b->kv, cm->stream));
    cm->k_cache = cm->kv;
    cm->v_cache = reinterpret_cast<float *>(reinterpret_cast<uint8_t *>(cm->kv) + b->kv / 2);

    uint64_t off = 0;
    const size_t E = (size_t)hp->n_embd;
    if ((st = put_weight(cm, &off, m->tok_embd, &cm->tok_embd, err, errlen)))
        return st;
    if (m->tied_output)
        cm->output = cm->tok_embd;
    else if ((st = put_weight(cm, &off, m->output, &cm->output, err, errlen)))
        return st;
    if ((st = put_vec(cm, &off, m->output_norm, E, &cm->output_norm, err, errlen)))
        return st;
    if (m->rope_freqs &&
        (st = put_vec(cm, &off, m->rope_freqs, (size_t)hp->n_rot / 2, &cm->rope_freqs, err,
                      errlen)))
        return st;
    for (int l = 0; l < hp->n_layer; l++) {
        const gpe_layer *L = &m->layers[l];
        cuda_layer *C = &cm->layers[l];
        if ((st = put_vec(cm, &off, L->attn_norm, E, &C->attn_norm, err, errlen)) ||
            (st = put_vec(cm, &off, L->ffn_norm, E, &C->ffn_norm, err, errlen)) ||
            (st = put_weight(cm, &off, L->wq, &C->wq, err, errlen)) ||
            (st = put_weight(cm, &off, L->wk, &C->wk, err, errlen)) ||
            (st = put_weight(cm, &off, L->wv, &C->wv, err, errlen)) ||
            (st = put_weight(cm, &off, L->wo, &C->wo, err, errlen)) ||
            (st = put_weight(cm, &off, L->w_gate, &C->w_gate, err, errlen)) ||
            (st = put_weight(cm, &off, L->w_up, &C->w_up, err, errlen)) ||
            (st = put_weight(cm, &off, L->w_down, &C->w_down, err, errlen)))
            return st;
        C->swa = L->swa;
        C->rope_base = L->rope_base;
        C->rope_freq_scale = L->rope_freq_scale;
        each_opt_vec(hp, L, C, [&](const float *v, size_t n, const float **slot) {
            *slot = NULL;
            if (v && st == GPE_OK)
                st = put_vec(cm, &off, v, n, slot, err, errlen);
        });
        if (st)
            return st;
    }
    scratch_plan sp;
    plan_scratch(m, cm->n_batch, &sp);
    uint8_t *s = cm->smem;
    cm->x = reinterpret_cast<float *>(s + sp.x);
    cm->xn = reinterpret_cast<float *>(s + sp.xn);
    cm->q = reinterpret_cast<float *>(s + sp.q);
    cm->k = reinterpret_cast<float *>(s + sp.k);
    cm->v = reinterpret_cast<float *>(s + sp.v);
    cm->att = reinterpret_cast<float *>(s + sp.att);
    cm->gate = reinterpret_cast<float *>(s + sp.gate);
    cm->up = reinterpret_cast<float *>(s + sp.up);
    cm->logits = reinterpret_cast<float *>(s + sp.logits);
    cm->d_ints = reinterpret_cast<int *>(s + sp.ints);
    cm->mm.blas = cm->blas;
    cm->mm.stream = cm->stream;
    cm->mm.wbuf = sp.wbuf_bytes ? s + sp.wbuf : NULL;
    cm->mm.wbuf_bytes = sp.wbuf_bytes;
    cm->mm.xh = sp.xh_elems ? reinterpret_cast<__half *>(s + sp.xh) : NULL;
    cm->mm.xh_elems = sp.xh_elems;
    /* The host memory may be released once the copies are done. */
    CUDA_CHECK(cudaStreamSynchronize(cm->stream));
    return GPE_OK;
}

gpe_status gpe_cuda_model_upload(const gpe_llama *m, int device, int n_ctx, int n_seq,
                                 int n_batch, gpe_cuda_model **out, char *err, size_t errlen)
{
    gpe_cuda_budget b;
    gpe_status st;
    gpe_cuda_model *cm = NULL;
    int n_dev = 0;
    size_t free_b = 0, total_b = 0;
    cudaError_t ce;

    *out = NULL;
    if ((st = gpe_cuda_model_bytes(m, n_ctx, n_seq, n_batch, &b, err, errlen)))
        return st;
    if (!gpe_cuda_device_count(&n_dev))
        return fail(GPE_ERR_BACKEND, err, errlen, "no CUDA device");
    if (device < 0 || device >= n_dev)
        return fail(GPE_ERR_ARG, err, errlen, "CUDA device %d does not exist (%d visible)",
                    device, n_dev);
    if ((ce = cudaSetDevice(device)) != cudaSuccess ||
        (ce = cudaMemGetInfo(&free_b, &total_b)) != cudaSuccess)
        return fail(GPE_ERR_BACKEND, err, errlen, "CUDA device %d: %s", device,
                    cudaGetErrorString(ce));
    /* Preflight: nothing is allocated unless everything fits. */
    if (b.total > free_b)
        return fail(GPE_ERR_INSUFFICIENT_VRAM, err, errlen,
                    "CUDA device %d: model needs %.1f MiB of VRAM (weights %.1f, KV cache "
                    "%.1f, scratch %.1f, reserve %.1f) but only %.1f MiB of %.1f MiB are free "
                    "(%llu > %llu bytes)",
                    device, b.total / 1048576.0, b.weights / 1048576.0, b.kv / 1048576.0,
                    b.scratch / 1048576.0, b.reserve / 1048576.0, free_b / 1048576.0,
                    total_b / 1048576.0, (unsigned long long)b.total,
                    (unsigned long long)free_b);

    cm = static_cast<gpe_cuda_model *>(calloc(1, sizeof *cm));
    if (!cm)
        return fail(GPE_ERR_NOMEM, err, errlen, "out of memory");
    cm->device = device;
    cm->hp = m->hp;
    cm->n_ctx = n_ctx;
    cm->n_seq = n_seq;
    cm->n_batch = n_batch;
    cm->layers = static_cast<cuda_layer *>(calloc((size_t)m->hp.n_layer, sizeof *cm->layers));
    cm->h_ints = static_cast<int *>(calloc(4 * (size_t)n_batch, sizeof(int)));
    if (!cm->layers || !cm->h_ints) {
        gpe_cuda_model_free(cm);
        return fail(GPE_ERR_NOMEM, err, errlen, "out of memory");
    }
    if ((st = upload(cm, m, &b, err, errlen)) != GPE_OK) {
        gpe_cuda_model_free(cm);
        return st;
    }
    *out = cm;
    return GPE_OK;
}

int gpe_cuda_model_n_batch(const gpe_cuda_model *cm)
{
    return cm ? cm->n_batch : 0;
}

void gpe_cuda_seq_clear(gpe_cuda_model *cm, int seq)
{
    if (!cm || seq < 0 || seq >= cm->n_seq)
        return;
    cudaSetDevice(cm->device);
    const size_t kvd = (size_t)cm->hp.n_head_kv * cm->hp.head_dim;
    const size_t per_seq = (size_t)cm->n_ctx * kvd;
    for (int l = 0; l < cm->hp.n_layer; l++) {
        const size_t off = ((size_t)l * cm->n_seq + (size_t)seq) * per_seq;
        cudaMemsetAsync(cm->k_cache + off, 0, per_seq * sizeof(float), cm->stream);
        cudaMemsetAsync(cm->v_cache + off, 0, per_seq * sizeof(float), cm->stream);
    }
    /* Errors here are sticky and surface at the next forward's checks. */
}

/* ============================================================== forward */

static gpe_status forward(gpe_cuda_model *cm, int n, int n_out, float *logits_host, char *err,
                          size_t errlen)
{
    const gpe_hparams *hp = &cm->hp;
    const int64_t E = hp->n_embd, qd = (int64_t)hp->n_head * hp->head_dim;
    const int64_t kvd = (int64_t)hp->n_head_kv * hp->head_dim, F = hp->n_ff;
    const int64_t V = hp->n_vocab;
    const size_t layer_kv = (size_t)cm->n_seq * (size_t)cm->n_ctx * (size_t)kvd;
    cudaStream_t s = cm->stream;
    const int *d_tok = cm->d_ints, *d_pos = cm->d_ints + cm->n_batch;
    const int *d_seq = cm->d_ints + 2 * cm->n_batch, *d_rows = cm->d_ints + 3 * cm->n_batch;
    gpe_status st;

    CUDA_CHECK(cudaMemcpyAsync(cm->d_ints, cm->h_ints, 4 * (size_t)cm->n_batch * sizeof(int),
                               cudaMemcpyHostToDevice, s));
    if ((st = gpe_cuda_embed(&cm->tok_embd, d_tok, n, cm->x, s, err, errlen)))
        return st;
    if (hp->embd_scale != 1.0f) {
        gpe_cuda_scale(cm->x, hp->embd_scale, (int64_t)n * E, s);
        CUDA_CHECK_LAUNCH();
    }

    for (int l = 0; l < hp->n_layer; l++) {
        const cuda_layer *L = &cm->layers[l];

        gpe_cuda_rmsnorm(cm->x, NULL, L->attn_norm, cm->xn, n, (int)E, hp->rms_eps, s);
        CUDA_CHECK_LAUNCH();
        if ((st = gpe_cuda_matmul(&cm->mm, &L->wq, cm->xn, n, cm->q, qd, false, err, errlen)) ||
            (st = gpe_cuda_matmul(&cm->mm, &L->wk, cm->xn, n, cm->k, kvd, false, err, errlen)) ||
            (st = gpe_cuda_matmul(&cm->mm, &L->wv, cm->xn, n, cm->v, kvd, false, err, errlen)))
            return st;
        /* biases, then per-head Q/K norms, before RoPE (as model.c) */
        if (L->bq)
            gpe_cuda_add_bias(cm->q, L->bq, n, (int)qd, s);
        if (L->bk)
            gpe_cuda_add_bias(cm->k, L->bk, n, (int)kvd, s);
        if (L->bv)
            gpe_cuda_add_bias(cm->v, L->bv, n, (int)kvd, s);
        CUDA_CHECK_LAUNCH();
        if (L->q_norm) {
            gpe_cuda_rmsnorm(cm->q, NULL, L->q_norm, cm->q, n * hp->n_head, hp->head_dim,
                             hp->rms_eps, s);
            gpe_cuda_rmsnorm(cm->k, NULL, L->k_norm, cm->k, n * hp->n_head_kv, hp->head_dim,
                             hp->rms_eps, s);
            CUDA_CHECK_LAUNCH();
        }

        gpe_cuda_rope_args ra;
        ra.q = cm->q;
        ra.k = cm->k;
        ra.v = cm->v;
        ra.pos = d_pos;
        ra.seq = d_seq;
        ra.k_cache = cm->k_cache + (size_t)l * layer_kv;
        ra.v_cache = cm->v_cache + (size_t)l * layer_kv;
        ra.n_tok = n;
        ra.n_head = hp->n_head;
        ra.n_head_kv = hp->n_head_kv;
        ra.head_dim = hp->head_dim;
        ra.n_rot = hp->n_rot;
        ra.n_ctx = cm->n_ctx;
        ra.theta_scale = powf(L->rope_base, -2.0f / (float)hp->n_rot);   /* as model.c */
        ra.freq_scale = L->rope_freq_scale;
        ra.freqs = cm->rope_freqs;
        ra.neox = hp->rope_neox;
        gpe_cuda_rope_store(&ra, s);
        CUDA_CHECK_LAUNCH();

        gpe_cuda_attn_args aa;
        aa.q = cm->q;
        aa.k_cache = ra.k_cache;
        aa.v_cache = ra.v_cache;
        aa.pos = d_pos;
        aa.seq = d_seq;
        aa.out = cm->att;
        aa.n_tok = n;
        aa.n_head = hp->n_head;
        aa.n_head_kv = hp->n_head_kv;
        aa.head_dim = hp->head_dim;
        aa.n_ctx = cm->n_ctx;
        aa.scale = hp->attn_scale;
        aa.softcap = hp->attn_softcap;
        aa.window = L->swa ? hp->n_swa : 0;
        gpe_cuda_attention(&aa, s);
        CUDA_CHECK_LAUNCH();

        if ((st = gpe_cuda_matmul(&cm->mm, &L->wo, cm->att, n, cm->xn, E, false, err, errlen)))
            return st;
        if (L->bo)
            gpe_cuda_add_bias(cm->xn, L->bo, n, (int)E, s);
        if (L->post_attn_norm)
            gpe_cuda_rmsnorm(cm->xn, NULL, L->post_attn_norm, cm->xn, n, (int)E, hp->rms_eps, s);
        gpe_cuda_add(cm->x, cm->xn, (int64_t)n * E, s);
        CUDA_CHECK_LAUNCH();

        gpe_cuda_rmsnorm(cm->x, NULL, L->ffn_norm, cm->xn, n, (int)E, hp->rms_eps, s);
        CUDA_CHECK_LAUNCH();
        if ((st = gpe_cuda_matmul(&cm->mm, &L->w_gate, cm->xn, n, cm->gate, F, false, err,
                                  errlen)) ||
            (st = gpe_cuda_matmul(&cm->mm, &L->w_up, cm->xn, n, cm->up, F, false, err, errlen)))
            return st;
        if (hp->gelu)
            gpe_cuda_geglu(cm->gate, cm->up, (int64_t)n * F, s);
        else
            gpe_cuda_swiglu(cm->gate, cm->up, (int64_t)n * F, s);
        CUDA_CHECK_LAUNCH();
        if ((st = gpe_cuda_matmul(&cm->mm, &L->w_down, cm->gate, n, cm->xn, E, false, err,
                                  errlen)))
            return st;
        if (L->post_ffn_norm)
            gpe_cuda_rmsnorm(cm->xn, NULL, L->post_ffn_norm, cm->xn, n, (int)E, hp->rms_eps, s);
        gpe_cuda_add(cm->x, cm->xn, (int64_t)n * E, s);
        CUDA_CHECK_LAUNCH();
    }

    /* Output: final norm of the wanted rows (gathered through d_rows) and
     * logits, OUT_CHUNK rows at a time so the device buffer stays small. */
    const int out_cap = cm->n_batch < OUT_CHUNK ? cm->n_batch : OUT_CHUNK;
    for (int r0 = 0; r0 < n_out; r0 += out_cap) {
        const int nr = n_out - r0 < out_cap ? n_out - r0 : out_cap;
        gpe_cuda_rmsnorm(cm->x, d_rows + r0, cm->output_norm, cm->xn, nr, (int)E, hp->rms_eps,
                         s);
        CUDA_CHECK_LAUNCH();
        if ((st = gpe_cuda_matmul(&cm->mm, &cm->output, cm->xn, nr, cm->logits, V, false, err,
                                  errlen)))
            return st;
        if (hp->final_softcap > 0.0f) {
            gpe_cuda_softcap(cm->logits, hp->final_softcap, (int64_t)nr * V, s);
            CUDA_CHECK_LAUNCH();
        }
        CUDA_CHECK(cudaMemcpyAsync(logits_host + (size_t)r0 * (size_t)V, cm->logits,
                                   (size_t)nr * (size_t)V * sizeof(float),
                                   cudaMemcpyDeviceToHost, s));
    }
    CUDA_CHECK(cudaStreamSynchronize(s));
    return GPE_OK;
}

gpe_status gpe_cuda_forward(gpe_cuda_model *cm, const int32_t *tokens, const int *pos,
                            const int *seq, const bool *want, int n, float *logits_host,
                            char *err, size_t errlen)
{
    if (!cm)
        return fail(GPE_ERR_ARG, err, errlen, "CUDA forward: no model");
    if (n <= 0)
        return GPE_OK;
    if (n > cm->n_batch)
        return fail(GPE_ERR_ARG, err, errlen, "CUDA forward: %d tokens exceed n_batch %d", n,
                    cm->n_batch);
    int *h_tok = cm->h_ints, *h_pos = h_tok + cm->n_batch, *h_seq = h_pos + cm->n_batch;
    int *h_rows = h_seq + cm->n_batch;
    int n_out = 0;
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= cm->hp.n_vocab)
            return fail(GPE_ERR_ARG, err, errlen, "CUDA forward: token %d of entry %d out of "
                        "range [0, %d)", (int)tokens[i], i, cm->hp.n_vocab);
        if (seq[i] < 0 || seq[i] >= cm->n_seq || pos[i] < 0 || pos[i] >= cm->n_ctx)
            return fail(GPE_ERR_ARG, err, errlen, "CUDA forward: entry %d: seq %d / pos %d "
                        "out of range (n_seq %d, n_ctx %d)", i, seq[i], pos[i], cm->n_seq,
                        cm->n_ctx);
        h_tok[i] = tokens[i];
        h_pos[i] = pos[i];
        h_seq[i] = seq[i];
        if (want[i])
            h_rows[n_out++] = i;
    }
    if (n_out > 0 && !logits_host)
        return fail(GPE_ERR_ARG, err, errlen, "CUDA forward: logits requested, no buffer");
    CUDA_CHECK(cudaSetDevice(cm->device));
    return forward(cm, n, n_out, logits_host, err, errlen);
}

/* =============================================================== public */

bool gpe_cuda_available(void)
{
    return gpe_cuda_device_count(NULL);
}

gpe_status gpe_cuda_selftest(char *err, size_t errlen)
{
    return gpe_cuda_selftest_run(err, errlen);
}
