/*
 * forward: the CUDA backend's model (placement over one or more devices, a
 * VRAM preflight per device, upload), the forward pass (same steps as
 * gpe_llama_forward in model.c) and the device queries. See backend_cuda.h.
 *
 * Placement: the layers are split into stages, one per entry of the
 * placement (llama.cpp's --split-mode layer). Stage i holds layers
 * [l0, l1) with their K/V, a full set of activation buffers, its own
 * stream and cuBLAS handle; stage 0 also holds the token embeddings and
 * the last stage the output norm and head (a copy of the embeddings when
 * the output is tied and there are several stages). The residual stream
 * x moves from one stage to the next with cudaMemcpyPeerAsync after the
 * previous stage's stream has finished: between two devices with peer
 * access (enabled when cudaDeviceCanAccessPeer says so) it is a direct
 * copy, otherwise the runtime stages it through host memory; between two
 * stages on the same device (the tests' "split over device 0 twice") it
 * is a device-to-device copy. One device = one stage: the old layout.
 *
 * Memory: three cudaMalloc regions per stage: weights (every tensor at a
 * 256-byte aligned offset), KV cache (K then V, F32 or F16), scratch
 * (activations, logits, GEMM buffers, the batch's token/pos/seq/row
 * arrays).
 *
 * Errors: a failure inside forward marks the model broken (every later
 * forward fails) and the message starts "CUDA device N: ".
 */
#include "engine/cuda/backend_cuda.h"

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "engine/cuda/attention.cuh"
#include "engine/cuda/mmq.cuh"
#include "engine/cuda/common.cuh"
#include "engine/cuda/elementwise.cuh"
#include "engine/cuda/fused.cuh"
#include "engine/cuda/matmul.cuh"
#include "engine/cuda/norm.cuh"
#include "engine/cuda/rope.cuh"

#define ALIGN 256
#define OUT_CHUNK 32                         /* logits rows computed per output matmul */
#define GEMM_SLICE_ELEMS (16ull << 20)       /* dequantized elements per GEMM slice */
#define RESERVE_BYTES (64ull << 20)          /* cuBLAS workspace, allocator slack */

static gpe_status vseterr(gpe_status st, char *err, size_t errlen, const char *fmt, va_list ap)
{
    if (err && errlen > 0)
        vsnprintf(err, errlen, fmt, ap);
    return st;
}

gpe_status gpe_cuda_seterr(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    gpe_status st = vseterr(GPE_ERR_BACKEND, err, errlen, fmt, ap);
    va_end(ap);
    return st;
}

gpe_status gpe_cuda_seterr_st(gpe_status st, char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vseterr(st, err, errlen, fmt, ap);
    va_end(ap);
    return st;
}

static gpe_status fail(gpe_status st, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static gpe_status fail(gpe_status st, char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vseterr(st, err, errlen, fmt, ap);
    va_end(ap);
    return st;
}

/* Prefixes err with "CUDA device N: " unless it already names a device. */
static gpe_status on_device(gpe_status st, int device, char *err, size_t errlen)
{
    if (st == GPE_OK || !err || errlen == 0 || strncmp(err, "CUDA device ", 12) == 0)
        return st;
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s", err);
    snprintf(err, errlen, "CUDA device %d: %s", device, tmp);
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

/* One device's part of the model: layers [l0, l1). */
typedef struct cuda_stage {
    int device;
    int l0, l1;
    bool first, last;           /* holds the embeddings / the output */
    gpe_vram_need need;         /* planned bytes */
    cudaStream_t stream;
    cublasHandle_t blas;
    gpe_cuda_mm mm;

    uint8_t *wmem;              /* weights region */
    uint64_t wmem_bytes;
    const float *rope_freqs;    /* NULL when absent */

    void *kv;                   /* K region then V region */
    uint8_t *k_cache, *v_cache; /* [l1 - l0][n_seq][n_ctx][kv_dim] each, F32 or F16 */

    uint8_t *smem;              /* scratch region */
    float *x, *xn, *q, *k, *v, *att, *attp, *gate, *up, *logits;
    int *d_ints;                /* [4][n_batch]: tokens, pos, seq, rows */

    /* Decode steps as CUDA graphs (stage_graph): one per batch shape
     * [n][n_out], n <= GPE_CUDA_MMV_MAX, captured on the shape's first
     * step. Valid for the model's life: the kernels read positions,
     * sequences and rows from d_ints and every buffer stays in place. */
    cudaGraphExec_t graph[GPE_CUDA_MMV_MAX + 1][GPE_CUDA_MMV_MAX + 1];
    bool no_graph;              /* a capture failed: plain launches from then on */
} cuda_stage;

struct gpe_cuda_model {
    gpe_hparams hp;
    int n_ctx, n_seq, n_batch;
    bool kv_f16;
    int n_stage;
    cuda_stage st[GPE_MAX_DEVICES];
    gpe_cuda_weight tok_embd, output;   /* on the first / last stage */
    const float *output_norm;           /* last stage */
    cuda_layer *layers;         /* host array [n_layer] of device pointers */
    int *h_ints;                /* host staging of the batch's ints */
    bool decode_rows;           /* this batch's tokens are mostly single rows of different
                                   sequences (attention.cuh) */
    bool broken;                /* a forward failed: unusable */
    char broken_msg[256];
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
    uint64_t x, xn, q, k, v, att, attp, gate, up, logits, xh, wbuf, xq, xqd, mmqp, ints, total;
    uint64_t wbuf_bytes, xh_elems, xq_elems, mmqp_elems;
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
    /* split sums of the small-batch GEMM: the most any weight needs at any
     * batch size it may see (mmq.cuh) */
    uint64_t mmqp = 0;
    const int mq_max = (int)(B < (uint64_t)gpe_cuda_mmq_max() ? B : gpe_cuda_mmq_max());
    each_weight(m, [&](const gpe_weight &w) {
        for (int n = GPE_CUDA_MMV_MAX + 1; n <= mq_max; n++) {
            const uint64_t f = gpe_cuda_mmq_part_floats(w.n_rows, w.n_cols, n);
            if (f > mmqp)
                mmqp = f;
        }
    });
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
    /* partial results of the split decode attention (attention.cuh) */
    TAKE(attp, gpe_cuda_attn_part_floats(hp->n_head, hp->head_dim) * 4);
    TAKE(gate, B * F * 4);
    TAKE(up, B * F * 4);
    TAKE(logits, out_rows * V * 4);
    TAKE(xh, wbuf ? B * maxc * 2 : 0);
    TAKE(wbuf, wbuf);
    /* int8 activations of the dp4a mat-vec (mmvq.cuh) and of the int8
     * small-batch GEMM (mmq_i8.cuh): up to max(GPE_CUDA_MMV_MAX, mmq batch)
     * rows of the widest input, one F32 scale per 32 */
    const uint64_t xq_cap =
        mq_max > GPE_CUDA_MMV_MAX ? (uint64_t)mq_max : (uint64_t)GPE_CUDA_MMV_MAX;
    const uint64_t xq_rows = B < xq_cap ? B : xq_cap;
    TAKE(xq, xq_rows * maxc);
    TAKE(xqd, xq_rows * (maxc / 32 + 1) * 4);
    TAKE(mmqp, mmqp * 4);
    TAKE(ints, 4 * B * sizeof(int));
#undef TAKE
    p->total = off;
    p->wbuf_bytes = wbuf;
    p->xh_elems = wbuf ? B * maxc : 0;
    p->xq_elems = xq_rows * maxc;
    p->mmqp_elems = mmqp;
}

/* The checks of a model and sizes this backend can run (no device needed). */
static gpe_status check_model(const gpe_llama *m, int n_ctx, int n_seq, int n_batch, char *err,
                              size_t errlen)
{
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
    each_weight(m, [&](const gpe_weight &w) {
        if (st != GPE_OK)
            return;
        if (!gpe_cuda_weight_ok(w.type, w.n_cols) || w.n_rows <= 0 || w.n_rows > INT32_MAX ||
            w.n_cols > INT32_MAX)
            st = fail(GPE_ERR_UNSUPPORTED, err, errlen,
                      "CUDA backend: weight of type %s, %lld x %lld, is not supported",
                      gpe_type_name(w.type), (long long)w.n_rows, (long long)w.n_cols);
    });
    return st;
}

static uint64_t weight_bytes(const gpe_weight &w)
{
    return align_up((uint64_t)w.row_bytes * (uint64_t)w.n_rows);
}

/* Weights of a stage holding layers [l0, l1), the embeddings (first) and
 * the output (last); the same tensors upload_stage copies. */
static uint64_t stage_weight_bytes(const gpe_llama *m, int l0, int l1, bool first, bool last)
{
    const gpe_hparams *hp = &m->hp;
    const uint64_t E = (uint64_t)hp->n_embd;
    uint64_t b = 0;
    if (first)
        b += weight_bytes(m->tok_embd);
    if (last) {
        if (!m->tied_output)
            b += weight_bytes(m->output);
        else if (!first)
            b += weight_bytes(m->tok_embd);   /* the tied head's own copy */
        b += align_up(E * 4);                 /* output norm */
    }
    if (m->rope_freqs)
        b += align_up((uint64_t)(hp->n_rot / 2) * 4);
    for (int l = l0; l < l1; l++) {
        const gpe_layer *L = &m->layers[l];
        b += weight_bytes(L->wq) + weight_bytes(L->wk) + weight_bytes(L->wv) +
             weight_bytes(L->wo) + weight_bytes(L->w_gate) + weight_bytes(L->w_up) +
             weight_bytes(L->w_down);
        b += 2 * align_up(E * 4);             /* attention and FFN norms */
        each_opt_vec(hp, L, NULL, [&](const float *v, size_t n, const float **) {
            if (v)
                b += align_up((uint64_t)n * 4);
        });
    }
    return b;
}

static uint64_t kv_bytes(const gpe_hparams *hp, int n_layers, int n_ctx, int n_seq, bool f16)
{
    const uint64_t kvd = (uint64_t)hp->n_head_kv * hp->head_dim;
    return 2 * align_up((uint64_t)n_layers * (uint64_t)n_seq * (uint64_t)n_ctx * kvd *
                        (f16 ? 2u : 4u));
}

/* Layers per stage: in proportion to share[] (all 0 = evenly), in order,
 * the last stage taking the rest. */
static void split_layers(int n_layer, int n, const double *share, int *l0, int *l1)
{
    double tot = 0.0;
    for (int i = 0; i < n; i++)
        tot += share[i];
    double cum = 0.0;
    int prev = 0;
    for (int i = 0; i < n; i++) {
        cum += tot > 0.0 ? share[i] : 1.0;
        int end = i == n - 1 ? n_layer : (int)llround((double)n_layer * cum / (tot > 0.0 ? tot : n));
        if (end < prev)
            end = prev;
        if (end > n_layer)
            end = n_layer;
        l0[i] = prev;
        l1[i] = end;
        prev = end;
    }
}

/* The per-stage plan of a placement. query: read each device's free
 * memory (needed for a split by free memory and for the report). */
static gpe_status plan(const gpe_llama *m, const gpe_bplace *pl, const gpe_bsizes *sz,
                       bool query, gpe_vram_need *out, char *err, size_t errlen)
{
    gpe_status st;
    if ((st = check_model(m, sz->n_ctx, sz->n_seq, sz->n_batch, err, errlen)))
        return st;
    if (pl->n < 1 || pl->n > GPE_MAX_DEVICES)
        return fail(GPE_ERR_ARG, err, errlen, "CUDA backend: %d devices in the placement", pl->n);
    double share[GPE_MAX_DEVICES];
    bool by_free = true;
    for (int i = 0; i < pl->n; i++)
        if (pl->split[i] > 0.0f)
            by_free = false;
    for (int i = 0; i < pl->n; i++) {
        memset(&out[i], 0, sizeof out[i]);
        out[i].device = pl->device[i];
        size_t fb = 0, tb = 0;
        if (query) {
            cudaError_t ce;
            if ((ce = cudaSetDevice(pl->device[i])) != cudaSuccess ||
                (ce = cudaMemGetInfo(&fb, &tb)) != cudaSuccess)
                return fail(GPE_ERR_BACKEND, err, errlen, "CUDA device %d: %s", pl->device[i],
                            cudaGetErrorString(ce));
        }
        out[i].free_bytes = fb;
        share[i] = by_free ? (double)fb : (double)pl->split[i];
    }
    int l0[GPE_MAX_DEVICES], l1[GPE_MAX_DEVICES];
    split_layers(m->hp.n_layer, pl->n, share, l0, l1);
    scratch_plan sp;
    plan_scratch(m, sz->n_batch, &sp);
    for (int i = 0; i < pl->n; i++) {
        gpe_vram_need *v = &out[i];
        v->layer_begin = l0[i];
        v->layer_end = l1[i];
        v->weights = stage_weight_bytes(m, l0[i], l1[i], i == 0, i == pl->n - 1);
        v->kv = kv_bytes(&m->hp, l1[i] - l0[i], sz->n_ctx, sz->n_seq, sz->kv_f16);
        v->scratch = sp.total;
        v->reserve = RESERVE_BYTES;
        v->total = v->weights + v->kv + v->scratch + v->reserve;
    }
    return GPE_OK;
}

gpe_status gpe_cuda_model_bytes(const gpe_llama *m, int n_ctx, int n_seq, int n_batch,
                                gpe_cuda_budget *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    gpe_bplace pl;
    memset(&pl, 0, sizeof pl);
    pl.n = 1;
    gpe_bsizes sz = {n_ctx, n_seq, n_batch, 1, false};
    gpe_vram_need v;
    gpe_status st = plan(m, &pl, &sz, false, &v, err, errlen);
    if (st != GPE_OK)
        return st;
    out->weights = v.weights;
    out->kv = v.kv;
    out->scratch = v.scratch;
    out->reserve = v.reserve;
    out->total = v.total;
    return GPE_OK;
}

gpe_status gpe_cuda_plan_devices(const gpe_llama *m, const gpe_bplace *pl, const gpe_bsizes *sz,
                           gpe_vram_need *out, int *n_out, char *err, size_t errlen)
{
    int n_dev = 0;
    *n_out = 0;
    if (!gpe_cuda_device_count(&n_dev))
        return fail(GPE_ERR_BACKEND, err, errlen, "no CUDA device is visible");
    for (int i = 0; i < pl->n; i++)
        if (pl->device[i] < 0 || pl->device[i] >= n_dev)
            return fail(GPE_ERR_ARG, err, errlen, "CUDA device %d does not exist (%d visible)",
                        pl->device[i], n_dev);
    gpe_status st = plan(m, pl, sz, true, out, err, errlen);
    if (st == GPE_OK)
        *n_out = pl->n;
    return st;
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

int gpe_cuda_device_count_why(char *why, size_t whylen)
{
    int c = 0;
    cudaError_t e = cudaGetDeviceCount(&c);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        fail(GPE_ERR_BACKEND, why, whylen, "no CUDA device is visible (cudaGetDeviceCount: %s)",
             cudaGetErrorString(e));
        return 0;
    }
    if (c <= 0)
        fail(GPE_ERR_BACKEND, why, whylen, "no CUDA device is visible (cudaGetDeviceCount: 0)");
    return c > 0 ? c : 0;
}

gpe_status gpe_cuda_device_info(int device, gpe_gpu_info *out, char *err, size_t errlen)
{
    int n_dev = 0;
    cudaError_t ce;
    cudaDeviceProp prop;
    size_t fb = 0, tb = 0;
    memset(out, 0, sizeof *out);
    if (!gpe_cuda_device_count(&n_dev))
        return fail(GPE_ERR_BACKEND, err, errlen, "no CUDA device is visible");
    if (device < 0 || device >= n_dev)
        return fail(GPE_ERR_ARG, err, errlen, "CUDA device %d does not exist (%d visible)",
                    device, n_dev);
    if ((ce = cudaGetDeviceProperties(&prop, device)) != cudaSuccess ||
        (ce = cudaDeviceGetPCIBusId(out->pci_bus_id, (int)sizeof out->pci_bus_id, device)) !=
            cudaSuccess ||
        (ce = cudaSetDevice(device)) != cudaSuccess || (ce = cudaMemGetInfo(&fb, &tb)) != cudaSuccess)
        return fail(GPE_ERR_BACKEND, err, errlen, "CUDA device %d: %s", device,
                    cudaGetErrorString(ce));
    out->index = device;
    snprintf(out->name, sizeof out->name, "%.95s", prop.name);
    out->cc_major = prop.major;
    out->cc_minor = prop.minor;
    out->total_bytes = tb;
    out->free_bytes = fb;
    return GPE_OK;
}

void gpe_cuda_model_free(gpe_cuda_model *cm)
{
    if (!cm)
        return;
    /* Errors are ignored: after a device fault these calls fail, and what
     * they could not release goes with the process's CUDA context. */
    for (int i = 0; i < cm->n_stage; i++) {
        cuda_stage *S = &cm->st[i];
        cudaSetDevice(S->device);
        if (S->stream)
            cudaStreamSynchronize(S->stream);
        for (int a = 0; a <= GPE_CUDA_MMV_MAX; a++)
            for (int b = 0; b <= GPE_CUDA_MMV_MAX; b++)
                if (S->graph[a][b])
                    cudaGraphExecDestroy(S->graph[a][b]);
        if (S->blas)
            cublasDestroy(S->blas);
        if (S->stream)
            cudaStreamDestroy(S->stream);
        cudaFree(S->wmem);
        cudaFree(S->kv);
        cudaFree(S->smem);
    }
    (void)cudaGetLastError();
    free(cm->layers);
    free(cm->h_ints);
    free(cm);
}

/* Copies one tensor to the next slot of a stage's weights region. */
static gpe_status put(cuda_stage *S, uint64_t *off, const void *src, size_t bytes,
                      const uint8_t **dst, char *err, size_t errlen)
{
    /* The budget and the copies walk the same tensors; this guard makes a
     * broken invariant an error instead of an overrun. */
    if (*off + bytes > S->wmem_bytes)
        return gpe_cuda_seterr(err, errlen, "internal: weights exceed the planned %llu bytes",
                               (unsigned long long)S->wmem_bytes);
    uint8_t *d = S->wmem + *off;
    CUDA_CHECK(cudaMemcpyAsync(d, src, bytes, cudaMemcpyHostToDevice, S->stream));
    *off += align_up(bytes);
    *dst = d;
    return GPE_OK;
}

static gpe_status put_weight(cuda_stage *S, uint64_t *off, const gpe_weight &w,
                             gpe_cuda_weight *out, char *err, size_t errlen)
{
    out->type = w.type;
    out->n_cols = w.n_cols;
    out->n_rows = w.n_rows;
    out->row_bytes = w.row_bytes;
    return put(S, off, w.data, w.row_bytes * (size_t)w.n_rows, &out->data, err, errlen);
}

static gpe_status put_vec(cuda_stage *S, uint64_t *off, const float *v, size_t n,
                          const float **out, char *err, size_t errlen)
{
    const uint8_t *d = NULL;
    gpe_status st = put(S, off, v, n * sizeof(float), &d, err, errlen);
    *out = reinterpret_cast<const float *>(d);
    return st;
}

static gpe_status put_layers(gpe_cuda_model *cm, cuda_stage *S, uint64_t *off,
                             const gpe_llama *m, char *err, size_t errlen)
{
    const gpe_hparams *hp = &m->hp;
    const size_t E = (size_t)hp->n_embd;
    gpe_status st = GPE_OK;
    for (int l = S->l0; l < S->l1; l++) {
        const gpe_layer *L = &m->layers[l];
        cuda_layer *C = &cm->layers[l];
        if ((st = put_vec(S, off, L->attn_norm, E, &C->attn_norm, err, errlen)) ||
            (st = put_vec(S, off, L->ffn_norm, E, &C->ffn_norm, err, errlen)) ||
            (st = put_weight(S, off, L->wq, &C->wq, err, errlen)) ||
            (st = put_weight(S, off, L->wk, &C->wk, err, errlen)) ||
            (st = put_weight(S, off, L->wv, &C->wv, err, errlen)) ||
            (st = put_weight(S, off, L->wo, &C->wo, err, errlen)) ||
            (st = put_weight(S, off, L->w_gate, &C->w_gate, err, errlen)) ||
            (st = put_weight(S, off, L->w_up, &C->w_up, err, errlen)) ||
            (st = put_weight(S, off, L->w_down, &C->w_down, err, errlen)))
            return st;
        C->swa = L->swa;
        C->rope_base = L->rope_base;
        C->rope_freq_scale = L->rope_freq_scale;
        each_opt_vec(hp, L, C, [&](const float *v, size_t n, const float **slot) {
            *slot = NULL;
            if (v && st == GPE_OK)
                st = put_vec(S, off, v, n, slot, err, errlen);
        });
        if (st)
            return st;
    }
    return GPE_OK;
}

static void carve_scratch(gpe_cuda_model *cm, cuda_stage *S, const gpe_llama *m)
{
    scratch_plan sp;
    plan_scratch(m, cm->n_batch, &sp);
    uint8_t *s = S->smem;
    S->x = reinterpret_cast<float *>(s + sp.x);
    S->xn = reinterpret_cast<float *>(s + sp.xn);
    S->q = reinterpret_cast<float *>(s + sp.q);
    S->k = reinterpret_cast<float *>(s + sp.k);
    S->v = reinterpret_cast<float *>(s + sp.v);
    S->att = reinterpret_cast<float *>(s + sp.att);
    S->attp = reinterpret_cast<float *>(s + sp.attp);
    S->gate = reinterpret_cast<float *>(s + sp.gate);
    S->up = reinterpret_cast<float *>(s + sp.up);
    S->logits = reinterpret_cast<float *>(s + sp.logits);
    S->d_ints = reinterpret_cast<int *>(s + sp.ints);
    S->mm.blas = S->blas;
    S->mm.stream = S->stream;
    S->mm.wbuf = sp.wbuf_bytes ? s + sp.wbuf : NULL;
    S->mm.wbuf_bytes = sp.wbuf_bytes;
    S->mm.xh = sp.xh_elems ? reinterpret_cast<__half *>(s + sp.xh) : NULL;
    S->mm.xh_elems = sp.xh_elems;
    S->mm.xq = reinterpret_cast<int8_t *>(s + sp.xq);
    S->mm.xqd = reinterpret_cast<float *>(s + sp.xqd);
    S->mm.xq_elems = sp.xq_elems;
    S->mm.mmq_part = sp.mmqp_elems ? reinterpret_cast<float *>(s + sp.mmqp) : NULL;
    S->mm.mmq_part_elems = sp.mmqp_elems;
}

/* Allocates a stage's regions on its device and copies its tensors. */
static gpe_status upload_stage(gpe_cuda_model *cm, cuda_stage *S, const gpe_llama *m,
                               char *err, size_t errlen)
{
    gpe_status st;
    CUDA_CHECK(cudaSetDevice(S->device));
    CUDA_CHECK(cudaStreamCreateWithFlags(&S->stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&S->blas));
    CUBLAS_CHECK(cublasSetStream(S->blas, S->stream));
    /* Full FP32 for F32 GEMMs (no TF32): results comparable to the CPU. */
    CUBLAS_CHECK(cublasSetMathMode(S->blas, CUBLAS_DEFAULT_MATH));

    if (S->need.weights > 0)
        CUDA_CHECK(cudaMalloc(reinterpret_cast<void **>(&S->wmem), S->need.weights));
    S->wmem_bytes = S->need.weights;
    if (S->need.kv > 0) {   /* 0 for a stage given no layers */
        CUDA_CHECK(cudaMalloc(&S->kv, S->need.kv));
        CUDA_CHECK(cudaMemsetAsync(S->kv, 0, S->need.kv, S->stream));
    }
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void **>(&S->smem), S->need.scratch));
    S->k_cache = static_cast<uint8_t *>(S->kv);
    S->v_cache = S->k_cache + S->need.kv / 2;

    uint64_t off = 0;
    const size_t E = (size_t)m->hp.n_embd;
    if (S->first && (st = put_weight(S, &off, m->tok_embd, &cm->tok_embd, err, errlen)))
        return st;
    if (S->last) {
        if (m->tied_output && S->first)
            cm->output = cm->tok_embd;
        else if ((st = put_weight(S, &off, m->tied_output ? m->tok_embd : m->output,
                                  &cm->output, err, errlen)))
            return st;
        if ((st = put_vec(S, &off, m->output_norm, E, &cm->output_norm, err, errlen)))
            return st;
    }
    if (m->rope_freqs &&
        (st = put_vec(S, &off, m->rope_freqs, (size_t)m->hp.n_rot / 2, &S->rope_freqs, err,
                      errlen)))
        return st;
    if ((st = put_layers(cm, S, &off, m, err, errlen)))
        return st;
    carve_scratch(cm, S, m);
    /* The host memory may be released once the copies are done. */
    CUDA_CHECK(cudaStreamSynchronize(S->stream));
    return GPE_OK;
}

/* Peer access between consecutive stages on different devices, where the
 * hardware has it (faster activation copies); best effort: without it
 * cudaMemcpyPeerAsync goes through host memory. */
static void enable_peers(const gpe_cuda_model *cm)
{
    for (int i = 1; i < cm->n_stage; i++) {
        const int a = cm->st[i - 1].device, b = cm->st[i].device;
        int can = 0;
        if (a == b || cudaDeviceCanAccessPeer(&can, b, a) != cudaSuccess || !can)
            continue;
        if (cudaSetDevice(b) == cudaSuccess)
            cudaDeviceEnablePeerAccess(a, 0);   /* "already enabled" is fine */
    }
    (void)cudaGetLastError();
}

/* Preflight: what all stages on a device need together must fit its free
 * memory, else GPE_ERR_INSUFFICIENT_VRAM naming the device and numbers. */
static gpe_status preflight(const gpe_vram_need *need, int n, char *err, size_t errlen)
{
    for (int i = 0; i < n; i++) {
        gpe_vram_need sum;
        memset(&sum, 0, sizeof sum);
        bool seen = false;
        for (int j = 0; j < n; j++) {
            if (need[j].device != need[i].device)
                continue;
            if (j < i)
                seen = true;
            sum.weights += need[j].weights;
            sum.kv += need[j].kv;
            sum.scratch += need[j].scratch;
            sum.reserve += need[j].reserve;
            sum.total += need[j].total;
        }
        if (seen || sum.total <= need[i].free_bytes)
            continue;
        size_t fb = 0, tb = 0;
        cudaSetDevice(need[i].device);
        cudaMemGetInfo(&fb, &tb);
        (void)cudaGetLastError();
        return fail(GPE_ERR_INSUFFICIENT_VRAM, err, errlen,
                    "CUDA device %d: model needs %.1f MiB of VRAM on it (weights %.1f, KV "
                    "cache %.1f, scratch %.1f, reserve %.1f) but only %.1f MiB of %.1f MiB are "
                    "free (%llu > %llu bytes)",
                    need[i].device, sum.total / 1048576.0, sum.weights / 1048576.0,
                    sum.kv / 1048576.0, sum.scratch / 1048576.0, sum.reserve / 1048576.0,
                    need[i].free_bytes / 1048576.0, tb / 1048576.0,
                    (unsigned long long)sum.total, (unsigned long long)need[i].free_bytes);
    }
    return GPE_OK;
}

gpe_status gpe_cuda_model_create(const gpe_llama *m, const gpe_bplace *pl, const gpe_bsizes *sz,
                                 gpe_cuda_model **out, char *err, size_t errlen)
{
    gpe_vram_need need[GPE_MAX_DEVICES];
    int n_need = 0;
    gpe_status st;

    *out = NULL;
    if ((st = gpe_cuda_plan_devices(m, pl, sz, need, &n_need, err, errlen)))
        return st;
    if ((st = preflight(need, n_need, err, errlen)))
        return st;
    gpe_cuda_model *cm = static_cast<gpe_cuda_model *>(calloc(1, sizeof *cm));
    if (!cm)
        return fail(GPE_ERR_NOMEM, err, errlen, "out of memory");
    cm->hp = m->hp;
    cm->n_ctx = sz->n_ctx;
    cm->n_seq = sz->n_seq;
    cm->n_batch = sz->n_batch;
    cm->kv_f16 = sz->kv_f16;
    cm->layers = static_cast<cuda_layer *>(calloc((size_t)m->hp.n_layer, sizeof *cm->layers));
    cm->h_ints = static_cast<int *>(calloc(4 * (size_t)sz->n_batch, sizeof(int)));
    if (!cm->layers || !cm->h_ints) {
        gpe_cuda_model_free(cm);
        return fail(GPE_ERR_NOMEM, err, errlen, "out of memory");
    }
    cm->n_stage = n_need;
    for (int i = 0; i < n_need; i++) {
        cuda_stage *S = &cm->st[i];
        S->device = need[i].device;
        S->l0 = need[i].layer_begin;
        S->l1 = need[i].layer_end;
        S->first = i == 0;
        S->last = i == n_need - 1;
        S->need = need[i];
    }
    for (int i = 0; i < n_need; i++)
        if ((st = upload_stage(cm, &cm->st[i], m, err, errlen)) != GPE_OK) {
            on_device(st, cm->st[i].device, err, errlen);
            gpe_cuda_model_free(cm);
            return st;
        }
    enable_peers(cm);
    *out = cm;
    return GPE_OK;
}

gpe_status gpe_cuda_model_upload(const gpe_llama *m, int device, int n_ctx, int n_seq,
                                 int n_batch, gpe_cuda_model **out, char *err, size_t errlen)
{
    gpe_bplace pl;
    memset(&pl, 0, sizeof pl);
    pl.n = 1;
    pl.device[0] = device;
    gpe_bsizes sz = {n_ctx, n_seq, n_batch, 1, false};
    return gpe_cuda_model_create(m, &pl, &sz, out, err, errlen);
}

int gpe_cuda_model_n_batch(const gpe_cuda_model *cm)
{
    return cm ? cm->n_batch : 0;
}

int gpe_cuda_model_devices(const gpe_cuda_model *cm, gpe_vram_need *out)
{
    if (!cm)
        return 0;
    for (int i = 0; i < cm->n_stage; i++) {
        size_t fb = 0, tb = 0;
        out[i] = cm->st[i].need;
        if (cudaSetDevice(cm->st[i].device) != cudaSuccess ||
            cudaMemGetInfo(&fb, &tb) != cudaSuccess)
            fb = 0;
        out[i].free_bytes = fb;
    }
    (void)cudaGetLastError();
    return cm->n_stage;
}

void gpe_cuda_seq_clear(gpe_cuda_model *cm, int seq)
{
    if (!cm || cm->broken || seq < 0 || seq >= cm->n_seq)
        return;
    const size_t kvd = (size_t)cm->hp.n_head_kv * cm->hp.head_dim;
    const size_t per_seq = (size_t)cm->n_ctx * kvd * (cm->kv_f16 ? 2u : 4u);
    for (int i = 0; i < cm->n_stage; i++) {
        cuda_stage *S = &cm->st[i];
        cudaSetDevice(S->device);
        for (int l = 0; l < S->l1 - S->l0; l++) {
            const size_t off = ((size_t)l * cm->n_seq + (size_t)seq) * per_seq;
            cudaMemsetAsync(S->k_cache + off, 0, per_seq, S->stream);
            cudaMemsetAsync(S->v_cache + off, 0, per_seq, S->stream);
        }
    }
    /* Errors here are sticky and surface at the next forward's checks. */
}

/* ============================================================== forward */

/* The feed-forward half of a layer on stage S (model.c): x += down(act(
 * gate(norm x), up(norm x))). */
static gpe_status run_ffn(gpe_cuda_model *cm, cuda_stage *S, const cuda_layer *L, int n,
                          bool fuse, char *err, size_t errlen)
{
    const gpe_hparams *hp = &cm->hp;
    const int64_t E = hp->n_embd, F = hp->n_ff;
    cudaStream_t s = S->stream;
    const gpe_cuda_mm *mm = &S->mm;
    gpe_status st;
    {
        const gpe_cuda_weight *const w[2] = {&L->w_gate, &L->w_up};
        float *const y[2] = {S->gate, S->up};
        const int64_t ld[2] = {F, F};
        if ((st = gpe_cuda_norm_matmul_n(mm, S->x, NULL, L->ffn_norm, (int)E, hp->rms_eps,
                                         S->xn, w, 2, n, y, ld, fuse, NULL, err, errlen)))
            return st;
    }
    /* SwiGLU, the rounding and the residual add fold into the down mat-vec
     * where nothing comes between */
    if (!hp->gelu && !L->post_ffn_norm)
        return gpe_cuda_swiglu_matmul_add(mm, &L->w_down, S->gate, S->up, n, S->x, S->xn, fuse,
                                          NULL, err, errlen);
    if (hp->gelu)
        gpe_cuda_geglu(S->gate, S->up, (int64_t)n * F, s);
    else
        gpe_cuda_swiglu(S->gate, S->up, (int64_t)n * F, s);
    CUDA_CHECK_LAUNCH();
    if (!L->post_ffn_norm)   /* GELU without a post-norm: the add still folds */
        return gpe_cuda_matmul_add(mm, &L->w_down, S->gate, n, S->x, S->xn, fuse, NULL, err,
                                   errlen);
    if ((st = gpe_cuda_matmul(mm, &L->w_down, S->gate, n, S->xn, E, false, err, errlen)))
        return st;
    gpe_cuda_rmsnorm(S->xn, NULL, L->post_ffn_norm, S->xn, n, (int)E, hp->rms_eps, s);
    gpe_cuda_add(S->x, S->xn, (int64_t)n * E, s);
    CUDA_CHECK_LAUNCH();
    return GPE_OK;
}

/* One layer on stage S: the steps of model.c. */
static gpe_status run_layer(gpe_cuda_model *cm, cuda_stage *S, int l, int n, char *err,
                            size_t errlen)
{
    const gpe_hparams *hp = &cm->hp;
    const int64_t E = hp->n_embd, qd = (int64_t)hp->n_head * hp->head_dim;
    const int64_t kvd = (int64_t)hp->n_head_kv * hp->head_dim;
    const size_t layer_kv = (size_t)cm->n_seq * (size_t)cm->n_ctx * (size_t)kvd *
                            (cm->kv_f16 ? 2u : 4u);
    cudaStream_t s = S->stream;
    const gpe_cuda_mm *mm = &S->mm;
    const int *d_pos = S->d_ints + cm->n_batch, *d_seq = S->d_ints + 2 * cm->n_batch;
    const cuda_layer *L = &cm->layers[l];
    const bool fuse = gpe_cuda_fuse_default();
    gpe_status st;

    {
        const gpe_cuda_weight *const w[3] = {&L->wq, &L->wk, &L->wv};
        float *const y[3] = {S->q, S->k, S->v};
        const int64_t ld[3] = {qd, kvd, kvd};
        if ((st = gpe_cuda_norm_matmul_n(mm, S->x, NULL, L->attn_norm, (int)E, hp->rms_eps,
                                         S->xn, w, 3, n, y, ld, fuse, NULL, err, errlen)))
            return st;
    }
    /* biases, then per-head Q/K norms, before RoPE (as model.c) */
    if (L->bq)
        gpe_cuda_add_bias(S->q, L->bq, n, (int)qd, s);
    if (L->bk)
        gpe_cuda_add_bias(S->k, L->bk, n, (int)kvd, s);
    if (L->bv)
        gpe_cuda_add_bias(S->v, L->bv, n, (int)kvd, s);
    CUDA_CHECK_LAUNCH();
    if (L->q_norm) {
        gpe_cuda_rmsnorm(S->q, NULL, L->q_norm, S->q, n * hp->n_head, hp->head_dim,
                         hp->rms_eps, s);
        gpe_cuda_rmsnorm(S->k, NULL, L->k_norm, S->k, n * hp->n_head_kv, hp->head_dim,
                         hp->rms_eps, s);
        CUDA_CHECK_LAUNCH();
    }

    uint8_t *kc = S->k_cache + (size_t)(l - S->l0) * layer_kv;
    uint8_t *vc = S->v_cache + (size_t)(l - S->l0) * layer_kv;
    gpe_cuda_rope_args ra;
    memset(&ra, 0, sizeof ra);
    ra.q = S->q;
    ra.k = S->k;
    ra.v = S->v;
    ra.pos = d_pos;
    ra.seq = d_seq;
    ra.k_cache = kc;
    ra.v_cache = vc;
    ra.f16 = cm->kv_f16;
    ra.n_tok = n;
    ra.n_head = hp->n_head;
    ra.n_head_kv = hp->n_head_kv;
    ra.head_dim = hp->head_dim;
    ra.n_rot = hp->n_rot;
    ra.n_ctx = cm->n_ctx;
    ra.theta_scale = powf(L->rope_base, -2.0f / (float)hp->n_rot);   /* as model.c */
    ra.freq_scale = L->rope_freq_scale;
    ra.freqs = S->rope_freqs;
    ra.neox = hp->rope_neox;
    gpe_cuda_rope_store(&ra, s);
    CUDA_CHECK_LAUNCH();

    gpe_cuda_attn_args aa;
    memset(&aa, 0, sizeof aa);
    aa.q = S->q;
    aa.k_cache = kc;
    aa.v_cache = vc;
    aa.f16 = cm->kv_f16;
    aa.pos = d_pos;
    aa.seq = d_seq;
    aa.out = S->att;
    aa.n_tok = n;
    aa.n_head = hp->n_head;
    aa.n_head_kv = hp->n_head_kv;
    aa.head_dim = hp->head_dim;
    aa.n_ctx = cm->n_ctx;
    aa.scale = hp->attn_scale;
    aa.softcap = hp->attn_softcap;
    aa.window = L->swa ? hp->n_swa : 0;
    aa.part = S->attp;
    aa.decode_rows = cm->decode_rows;
    gpe_cuda_attention(&aa, s);
    CUDA_CHECK_LAUNCH();

    /* the residual add folds into the mat-vec where nothing comes between */
    if (!L->bo && !L->post_attn_norm) {
        if ((st = gpe_cuda_matmul_add(mm, &L->wo, S->att, n, S->x, S->xn, fuse, NULL, err,
                                      errlen)))
            return st;
    } else {
        if ((st = gpe_cuda_matmul(mm, &L->wo, S->att, n, S->xn, E, false, err, errlen)))
            return st;
        if (L->bo)
            gpe_cuda_add_bias(S->xn, L->bo, n, (int)E, s);
        if (L->post_attn_norm)
            gpe_cuda_rmsnorm(S->xn, NULL, L->post_attn_norm, S->xn, n, (int)E, hp->rms_eps,
                             s);
        gpe_cuda_add(S->x, S->xn, (int64_t)n * E, s);
        CUDA_CHECK_LAUNCH();
    }
    return run_ffn(cm, S, L, n, fuse, err, errlen);
}

/* Output on the last stage: final norm of the wanted rows (gathered
 * through d_rows) and logits, OUT_CHUNK rows at a time so the device
 * buffer stays small. logits_host NULL (graph capture): one chunk only,
 * left in S->logits for the caller to copy. */
static gpe_status run_output(gpe_cuda_model *cm, cuda_stage *S, int n_out, float *logits_host,
                             char *err, size_t errlen)
{
    const gpe_hparams *hp = &cm->hp;
    const int64_t E = hp->n_embd, V = hp->n_vocab;
    const int *d_rows = S->d_ints + 3 * cm->n_batch;
    cudaStream_t s = S->stream;
    gpe_status st;
    const int out_cap = cm->n_batch < OUT_CHUNK ? cm->n_batch : OUT_CHUNK;
    for (int r0 = 0; r0 < n_out; r0 += out_cap) {
        const int nr = n_out - r0 < out_cap ? n_out - r0 : out_cap;
        const gpe_cuda_weight *const w[1] = {&cm->output};
        float *const y[1] = {S->logits};
        const int64_t ld[1] = {V};
        if ((st = gpe_cuda_norm_matmul_n(&S->mm, S->x, d_rows + r0, cm->output_norm, (int)E,
                                         hp->rms_eps, S->xn, w, 1, nr, y, ld,
                                         gpe_cuda_fuse_default(), NULL, err, errlen)))
            return st;
        if (hp->final_softcap > 0.0f) {
            gpe_cuda_softcap(S->logits, hp->final_softcap, (int64_t)nr * V, s);
            CUDA_CHECK_LAUNCH();
        }
        if (logits_host)
            CUDA_CHECK(cudaMemcpyAsync(logits_host + (size_t)r0 * (size_t)V, S->logits,
                                       (size_t)nr * (size_t)V * sizeof(float),
                                       cudaMemcpyDeviceToHost, s));
    }
    return GPE_OK;
}

/* Embeddings on the last stage: every token's hidden state through the
 * output norm (model.c's gpe_llama_hidden), copied to the host. */
static gpe_status run_hidden(gpe_cuda_model *cm, cuda_stage *S, int n, float *hidden_host,
                             char *err, size_t errlen)
{
    const gpe_hparams *hp = &cm->hp;
    const int64_t E = hp->n_embd;
    gpe_cuda_rmsnorm(S->x, NULL, cm->output_norm, S->xn, n, (int)E, hp->rms_eps, S->stream);
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaMemcpyAsync(hidden_host, S->xn, (size_t)n * (size_t)E * sizeof(float),
                               cudaMemcpyDeviceToHost, S->stream));
    return GPE_OK;
}

/* The kernels of stage S for a batch of n tokens, after its inputs are on
 * the device: embedding (first stage), layers, output (last stage). */
static gpe_status stage_kernels(gpe_cuda_model *cm, cuda_stage *S, int n, int n_out,
                                float *logits_host, float *hidden_host, char *err,
                                size_t errlen)
{
    const int64_t E = cm->hp.n_embd;
    gpe_status st;
    if (S->first) {
        if ((st = gpe_cuda_embed(&cm->tok_embd, S->d_ints, n, S->x, S->stream, err, errlen)))
            return st;
        if (cm->hp.embd_scale != 1.0f) {
            gpe_cuda_scale(S->x, cm->hp.embd_scale, (int64_t)n * E, S->stream);
            CUDA_CHECK_LAUNCH();
        }
    }
    for (int l = S->l0; l < S->l1; l++)
        if ((st = run_layer(cm, S, l, n, err, errlen)))
            return st;
    if (S->last && hidden_host)
        return run_hidden(cm, S, n, hidden_host, err, errlen);
    if (S->last && (st = run_output(cm, S, n_out, logits_host, err, errlen)))
        return st;
    return GPE_OK;
}

/* CUDA graphs for decode steps, unless GPUPOOL_CUDA_GRAPHS=0 (read once). */
static bool graphs_enabled(void)
{
    static const bool on = [] {
        const char *e = getenv("GPUPOOL_CUDA_GRAPHS");
        return !(e && strcmp(e, "0") == 0);
    }();
    return on;
}

/* Runs stage S's kernels for a decode batch (n <= GPE_CUDA_MMV_MAX, so no
 * cuBLAS and one logits chunk) as a CUDA graph: ~13 kernel launches per
 * layer become one graph launch per step. The graph of the shape is
 * captured on first use. *done false: the capture failed (S->no_graph is
 * set, the error cleared) and the caller launches the kernels itself,
 * which reports any real device fault. */
static gpe_status stage_graph(gpe_cuda_model *cm, cuda_stage *S, int n, int n_out, bool *done,
                              char *err, size_t errlen)
{
    *done = false;
    cudaGraphExec_t *ge = &S->graph[n][n_out];
    if (!*ge) {
        cudaGraph_t g = NULL;
        if (cudaStreamBeginCapture(S->stream, cudaStreamCaptureModeThreadLocal) !=
            cudaSuccess) {
            (void)cudaGetLastError();
            S->no_graph = true;
            return GPE_OK;
        }
        const gpe_status st = stage_kernels(cm, S, n, n_out, NULL, NULL, err, errlen);
        cudaError_t e = cudaStreamEndCapture(S->stream, &g);
        if (st == GPE_OK && e == cudaSuccess && g)
            e = cudaGraphInstantiate(ge, g, 0);
        if (g)
            cudaGraphDestroy(g);
        if (st != GPE_OK || e != cudaSuccess || !g) {
            *ge = NULL;
            (void)cudaGetLastError();
            S->no_graph = true;
            return GPE_OK;
        }
    }
    CUDA_CHECK(cudaGraphLaunch(*ge, S->stream));
    *done = true;
    return GPE_OK;
}

/* The stages in order; *dev receives the device being worked on (for the
 * error message). hidden_host: the output-normed hidden states of all n
 * tokens instead of logits (no graph: embeddings are not decode steps). */
static gpe_status forward(gpe_cuda_model *cm, int n, int n_out, float *logits_host,
                          float *hidden_host, int *dev, char *err, size_t errlen)
{
    const int64_t E = cm->hp.n_embd;
    gpe_status st;
    for (int i = 0; i < cm->n_stage; i++) {
        cuda_stage *S = &cm->st[i];
        cudaStream_t s = S->stream;
        *dev = S->device;
        CUDA_CHECK(cudaSetDevice(S->device));
        CUDA_CHECK(cudaMemcpyAsync(S->d_ints, cm->h_ints,
                                   4 * (size_t)cm->n_batch * sizeof(int),
                                   cudaMemcpyHostToDevice, s));
        if (!S->first) {
            /* the previous stage's stream has finished (synchronized below) */
            const cuda_stage *P = &cm->st[i - 1];
            CUDA_CHECK(cudaMemcpyPeerAsync(S->x, S->device, P->x, P->device,
                                           (size_t)n * (size_t)E * sizeof(float), s));
        }
        const int out_cap = cm->n_batch < OUT_CHUNK ? cm->n_batch : OUT_CHUNK;
        bool done = false;
        if (!hidden_host && graphs_enabled() && !S->no_graph && n <= GPE_CUDA_MMV_MAX &&
            n_out <= out_cap && (st = stage_graph(cm, S, n, n_out, &done, err, errlen)))
            return st;
        if (done && S->last && n_out > 0)
            CUDA_CHECK(cudaMemcpyAsync(logits_host, S->logits,
                                       (size_t)n_out * (size_t)cm->hp.n_vocab * sizeof(float),
                                       cudaMemcpyDeviceToHost, s));
        if (!done &&
            (st = stage_kernels(cm, S, n, n_out, logits_host, hidden_host, err, errlen)))
            return st;
        CUDA_CHECK(cudaStreamSynchronize(s));
    }
    return GPE_OK;
}

/* Checks a batch and stages its ints in cm->h_ints (logits rows: the
 * entries with want[i]; want NULL: none); *n_out receives their count. */
static gpe_status stage_batch(gpe_cuda_model *cm, const int32_t *tokens, const int *pos,
                              const int *seq, const bool *want, int n, int *n_out, char *err,
                              size_t errlen)
{
    if (!cm)
        return fail(GPE_ERR_ARG, err, errlen, "CUDA forward: no model");
    if (cm->broken)
        return fail(GPE_ERR_BACKEND, err, errlen, "%s (context unusable)", cm->broken_msg);
    if (n > cm->n_batch)
        return fail(GPE_ERR_ARG, err, errlen, "CUDA forward: %d tokens exceed n_batch %d", n,
                    cm->n_batch);
    int *h_tok = cm->h_ints, *h_pos = h_tok + cm->n_batch, *h_seq = h_pos + cm->n_batch;
    int *h_rows = h_seq + cm->n_batch;
    int runs = 0;
    *n_out = 0;
    for (int i = 0; i < n; i++) {
        if (i == 0 || seq[i] != seq[i - 1])
            runs++;
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
        if (want && want[i])
            h_rows[(*n_out)++] = i;
    }
    /* Runs of fewer than 4 tokens of one sequence on average: a batched
     * decode step (many sequences) rather than a prompt. */
    cm->decode_rows = 4 * runs > n;
    return GPE_OK;
}

/* forward() and, on failure, the context marked unusable: any failure past
 * validation is a device failure (the streams may hold half-done work and
 * a sticky error poisons the context). */
static gpe_status run_batch(gpe_cuda_model *cm, int n, int n_out, float *logits_host,
                            float *hidden_host, char *err, size_t errlen)
{
    int dev = cm->st[0].device;
    gpe_status st = forward(cm, n, n_out, logits_host, hidden_host, &dev, err, errlen);
    if (st != GPE_OK) {
        on_device(st, dev, err, errlen);
        cm->broken = true;
        snprintf(cm->broken_msg, sizeof cm->broken_msg, "%s", err ? err : "CUDA error");
    }
    return st;
}

gpe_status gpe_cuda_forward(gpe_cuda_model *cm, const int32_t *tokens, const int *pos,
                            const int *seq, const bool *want, int n, float *logits_host,
                            char *err, size_t errlen)
{
    int n_out = 0;
    gpe_status st = stage_batch(cm, tokens, pos, seq, want, n, &n_out, err, errlen);
    if (st != GPE_OK || n <= 0)
        return st;
    if (n_out > 0 && !logits_host)
        return fail(GPE_ERR_ARG, err, errlen, "CUDA forward: logits requested, no buffer");
    return run_batch(cm, n, n_out, logits_host, NULL, err, errlen);
}

gpe_status gpe_cuda_hidden(gpe_cuda_model *cm, const int32_t *tokens, const int *pos,
                           const int *seq, int n, float *hidden_host, char *err, size_t errlen)
{
    int n_out = 0;
    gpe_status st = stage_batch(cm, tokens, pos, seq, NULL, n, &n_out, err, errlen);
    if (st != GPE_OK || n <= 0)
        return st;
    if (!hidden_host)
        return fail(GPE_ERR_ARG, err, errlen, "CUDA hidden: no buffer");
    return run_batch(cm, n, 0, NULL, hidden_host, err, errlen);
}
