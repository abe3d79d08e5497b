/*
 * selftest: the CUDA backend's self-test (gpe_cuda_selftest_run) and its
 * host-side helpers (optest.h).
 *
 * 1. Per-op checks on random inputs, each against a CPU reference:
 *    dequantization of every type (must be bit-exact: NMSE 0), mat-vec with
 *    1, 3 and 8 columns and GEMM with 8 (forced) and 13 columns for every
 *    type (reference: the dequantized row times x in double; for the dp4a
 *    mat-vec also times x rounded as the kernel rounds it), RMSNorm, RoPE
 *    (with n_rot < head size, rope_freqs and linear scaling) and attention
 *    (several sequences, GQA, in double).
 * 2. Whole models: a random llama of each weight type runs the same batch
 *    script (prefill of two sequences, batched decode, a mixed batch) on the
 *    CPU forward (gpe_llama_forward) and on the CUDA backend; the largest
 *    per-step NMSE of the logits must stay under the type's threshold. Then
 *    the same with F16 models given the qwen2, qwen3, gemma2 and gemma3
 *    feature sets (gpe_st_model_variant).
 *
 * NMSE = sum (a - ref)^2 / sum ref^2 (the measure of llama.cpp's
 * test-backend-ops). Thresholds and why: docs/cuda.md.
 */
#include "engine/cuda/optest.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cuda/backend_cuda.h"
#include "engine/kv.h"
#include "engine/threadpool.h"

/* Per-op thresholds. Dequantization is exact. Mat-vec, RMSNorm, RoPE and
 * attention compute in F32 what the references compute in double: only
 * rounding of sums, ~1e-14..1e-12. The GEMM path of F16/quantized weights
 * rounds weights and activations to F16 (relative error <= 2^-11 each:
 * NMSE ~1e-7). */
/* The dp4a mat-vec (mmvq.cuh) rounds the activations to int8 blocks: its
 * check uses a reference built from the same rounded activations (q8_round,
 * bit-identical to the kernel's), so only F32 sums remain and TH_F32
 * holds. Against the unrounded activations (uniform in [-1, 1)) the
 * rounding error of a value is uniform in +-d/2 with d ~ 1/127, so the
 * NMSE of a product is ~(1/127)^2 / 12 / (1/3) ~ 1.6e-5 whatever the
 * weights: TH_Q8_ACT (6x) catches a rounding that agrees with q8_round but
 * is wrong (a scale too small that clips, say). */
#define TH_EXACT 0.0
#define TH_F32 1e-9
#define TH_GEMM_F16 2e-5
#define TH_Q8_ACT 1e-4
#define GPE_CUDA_MMV_MAX_ST 8   /* the widest mat-vec batch (matmul.cuh) */

/* ------------------------------------------------------------- random */

typedef struct rng { uint64_t s; } rng;

static uint64_t rng_next(rng *r)
{
    /* splitmix64 */
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [-1, 1) */
static float rng_f(rng *r)
{
    return (float)((double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

/* ------------------------------------------------------- NMSE helpers */

double gpe_st_nmse(const float *a, const float *ref, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)a[i] - (double)ref[i];
        if (!isfinite(a[i]))
            return INFINITY;
        num += d * d;
        den += (double)ref[i] * (double)ref[i];
    }
    if (den == 0.0)
        return num == 0.0 ? 0.0 : INFINITY;
    return num / den;
}

double gpe_st_max_nmse(const float *a, const float *ref, const int step_rows[GPE_ST_STEPS],
                       int n_vocab)
{
    double mx = 0.0;
    size_t off = 0;
    for (int s = 0; s < GPE_ST_STEPS; s++) {
        const size_t n = (size_t)step_rows[s] * (size_t)n_vocab;
        const double e = gpe_st_nmse(a + off, ref + off, n);
        if (!(e <= mx))
            mx = e;
        off += n;
    }
    return mx;
}

double gpe_st_model_threshold(gpe_type t)
{
    /* Measured on the CPU (test_cuda: the CPU forward of each type against
     * the same model in F32, which is what the GPU computes) and given a
     * ~10x margin; see docs/cuda.md. */
    switch (t) {
    case GPE_TYPE_F32:
    case GPE_TYPE_BF16: return 1e-6;
    case GPE_TYPE_F16: return 1e-5;
    default: return 5e-3;
    }
}

/* Random block bytes of a type without a quantizer here (Q5_K, Q6_K): any
 * bytes are valid except d/dmin, set to scales that keep values near
 * [-amp, amp] and centred. */
static void fill_kquant(gpe_type t, uint8_t *row, int64_t n_cols, float amp, rng *r)
{
    const int64_t nb = n_cols / GPE_QK_K;
    for (int64_t b = 0; b < nb; b++) {
        if (t == GPE_TYPE_Q5_K) {
            gpe_block_q5_k *k = (gpe_block_q5_k *)(void *)(row + (size_t)b * sizeof *k);
            for (size_t i = 0; i < sizeof *k; i++)
                ((uint8_t *)k)[i] = (uint8_t)rng_next(r);
            /* value = d*sc*q - dmin*m, sc, m in [0, 63], q in [0, 31]:
             * mean d*31.5*15.5 - dmin*31.5 is 0 when dmin = 15.5 d. */
            const float d = amp / (63.0f * 31.0f / 2.0f);
            k->d = gpe_fp32_to_fp16(d);
            k->dmin = gpe_fp32_to_fp16(15.5f * d);
        } else {
            gpe_block_q6_k *k = (gpe_block_q6_k *)(void *)(row + (size_t)b * sizeof *k);
            for (size_t i = 0; i < sizeof *k; i++)
                ((uint8_t *)k)[i] = (uint8_t)rng_next(r);
            /* value = d*scale*(q-32), scale in [-128, 127], q-32 in [-32, 31] */
            k->d = gpe_fp32_to_fp16(amp / (128.0f * 32.0f));
        }
    }
}

/* -------------------------------------------------------- random model */

#define ST_E 256
#define ST_HEAD 4
#define ST_HEAD_KV 2
#define ST_HD 64
#define ST_FF 512
#define ST_LAYER 2
#define ST_VOCAB 300

static void *st_alloc(gpe_st_model *sm, size_t bytes)
{
    if (sm->n_bufs == (int)(sizeof sm->bufs / sizeof sm->bufs[0]))
        return NULL;
    void *p = calloc(1, bytes ? bytes : 1);
    if (p)
        sm->bufs[sm->n_bufs++] = p;
    return p;
}

static bool st_weight(gpe_st_model *sm, gpe_weight *w, gpe_type t, int64_t rows, int64_t cols,
                      rng *r)
{
    w->type = t;
    w->n_rows = rows;
    w->n_cols = cols;
    w->row_bytes = gpe_row_size(t, cols);
    uint8_t *data = st_alloc(sm, w->row_bytes * (size_t)rows);
    float *tmp = malloc((size_t)cols * sizeof(float));
    if (!data || !tmp || w->row_bytes == 0) {
        free(tmp);
        return false;
    }
    const float amp = 1.7f / sqrtf((float)cols);   /* unit-variance outputs for unit inputs */
    bool ok = true;
    for (int64_t i = 0; i < rows && ok; i++) {
        uint8_t *row = data + (size_t)i * w->row_bytes;
        if (t == GPE_TYPE_Q5_K || t == GPE_TYPE_Q6_K) {
            fill_kquant(t, row, cols, amp, r);
            continue;
        }
        for (int64_t c = 0; c < cols; c++)
            tmp[c] = amp * rng_f(r);
        ok = gpe_quantize_row(t, tmp, row, cols);
    }
    free(tmp);
    w->data = data;
    return ok;
}

static const float *st_vec(gpe_st_model *sm, int64_t n, rng *r)
{
    float *v = st_alloc(sm, (size_t)n * sizeof(float));
    if (v)
        for (int64_t i = 0; i < n; i++)
            v[i] = 1.0f + 0.5f * rng_f(r);
    return v;
}

void gpe_st_model_free(gpe_st_model *sm)
{
    for (int i = 0; i < sm->n_bufs; i++)
        free(sm->bufs[i]);
    memset(sm, 0, sizeof *sm);
}

bool gpe_st_model_build(gpe_st_model *sm, gpe_type t, uint64_t seed)
{
    rng r = { seed };
    memset(sm, 0, sizeof *sm);
    gpe_hparams *hp = &sm->m.hp;
    snprintf(hp->arch, sizeof hp->arch, "llama");
    hp->n_vocab = ST_VOCAB;
    hp->n_ctx_train = 64;
    hp->n_embd = ST_E;
    hp->n_layer = ST_LAYER;
    hp->n_head = ST_HEAD;
    hp->n_head_kv = ST_HEAD_KV;
    hp->head_dim = ST_HD;
    hp->n_ff = ST_FF;
    hp->n_rot = ST_HD;
    hp->rope_base = 10000.0f;
    hp->rope_freq_scale = 1.0f;
    hp->rope_base_swa = 10000.0f;
    hp->rms_eps = 1e-5f;
    hp->attn_scale = 1.0f / sqrtf((float)ST_HD);
    hp->embd_scale = 1.0f;
    sm->m.layers = sm->layers;
    const int64_t qd = ST_HEAD * ST_HD, kvd = ST_HEAD_KV * ST_HD;
    bool ok = st_weight(sm, &sm->m.tok_embd, t, ST_VOCAB, ST_E, &r) &&
              (sm->m.output_norm = st_vec(sm, ST_E, &r)) != NULL;
    /* Q8_0 models tie the output to the embedding (the other path). */
    if (ok && t == GPE_TYPE_Q8_0) {
        sm->m.output = sm->m.tok_embd;
        sm->m.tied_output = true;
    } else if (ok) {
        ok = st_weight(sm, &sm->m.output, t, ST_VOCAB, ST_E, &r);
    }
    for (int l = 0; l < ST_LAYER && ok; l++) {
        gpe_layer *L = &sm->layers[l];
        L->rope_base = hp->rope_base;
        L->rope_freq_scale = hp->rope_freq_scale;
        ok = (L->attn_norm = st_vec(sm, ST_E, &r)) != NULL &&
             (L->ffn_norm = st_vec(sm, ST_E, &r)) != NULL &&
             st_weight(sm, &L->wq, t, qd, ST_E, &r) && st_weight(sm, &L->wk, t, kvd, ST_E, &r) &&
             st_weight(sm, &L->wv, t, kvd, ST_E, &r) && st_weight(sm, &L->wo, t, ST_E, qd, &r) &&
             st_weight(sm, &L->w_gate, t, ST_FF, ST_E, &r) &&
             st_weight(sm, &L->w_up, t, ST_FF, ST_E, &r) &&
             st_weight(sm, &L->w_down, t, ST_E, ST_FF, &r);
    }
    if (!ok) {
        gpe_st_model_free(sm);
        return false;
    }
    return true;
}

const char *gpe_st_variant_name(int variant)
{
    static const char *const names[GPE_ST_N_VARIANTS] = { "llama", "qwen2", "qwen3", "gemma2",
                                                          "gemma3" };
    return variant >= 0 && variant < GPE_ST_N_VARIANTS ? names[variant] : "?";
}

/* small random vector around 0 (biases) */
static const float *st_bias(gpe_st_model *sm, int64_t n, rng *r)
{
    float *v = st_alloc(sm, (size_t)n * sizeof(float));
    if (v)
        for (int64_t i = 0; i < n; i++)
            v[i] = 0.3f * rng_f(r);
    return v;
}

bool gpe_st_model_variant(gpe_st_model *sm, int variant, uint64_t seed)
{
    rng r = { seed };
    gpe_hparams *hp = &sm->m.hp;
    const int64_t qd = ST_HEAD * ST_HD, kvd = ST_HEAD_KV * ST_HD;
    if (variant <= 0)
        return true;
    hp->rope_neox = true;
    const bool gemma = variant >= 3;
    if (gemma) {
        hp->kind = variant == 3 ? GPE_ARCH_GEMMA2 : GPE_ARCH_GEMMA3;
        hp->embd_scale = sqrtf((float)ST_E);
        hp->gelu = true;
        hp->n_swa = 3;
        hp->swa_pattern = 2;
        if (variant == 3) {
            hp->attn_softcap = 5.0f;
            hp->final_softcap = 5.0f;
        }
    } else {
        hp->kind = variant == 1 ? GPE_ARCH_QWEN2 : GPE_ARCH_QWEN3;
    }
    for (int l = 0; l < ST_LAYER; l++) {
        gpe_layer *L = &sm->layers[l];
        if (variant == 1 &&
            (!(L->bq = st_bias(sm, qd, &r)) || !(L->bk = st_bias(sm, kvd, &r)) ||
             !(L->bv = st_bias(sm, kvd, &r))))
            return false;
        if ((variant == 2 || variant == 4) &&
            (!(L->q_norm = st_vec(sm, ST_HD, &r)) || !(L->k_norm = st_vec(sm, ST_HD, &r))))
            return false;
        if (gemma && (!(L->post_attn_norm = st_vec(sm, ST_E, &r)) ||
                      !(L->post_ffn_norm = st_vec(sm, ST_E, &r))))
            return false;
        L->swa = gemma && l % 2 == 0;
        if (variant == 4) {
            L->rope_base = L->swa ? 10000.0f : 1000000.0f;
            L->rope_freq_scale = L->swa ? 1.0f : 0.125f;
        }
    }
    return true;
}

static bool to_f32(gpe_st_model *sm, gpe_weight *dst, const gpe_weight *src)
{
    *dst = *src;
    dst->type = GPE_TYPE_F32;
    dst->row_bytes = (size_t)src->n_cols * sizeof(float);
    float *d = st_alloc(sm, dst->row_bytes * (size_t)src->n_rows);
    if (!d)
        return false;
    for (int64_t i = 0; i < src->n_rows; i++)
        if (!gpe_dequantize_row(src->type, (const uint8_t *)src->data + (size_t)i * src->row_bytes,
                                d + (size_t)i * (size_t)src->n_cols, src->n_cols))
            return false;
    dst->data = d;
    return true;
}

bool gpe_st_model_to_f32(gpe_st_model *dst, const gpe_st_model *src)
{
    memset(dst, 0, sizeof *dst);
    dst->m = src->m;
    dst->m.layers = dst->layers;
    memcpy(dst->layers, src->layers, sizeof dst->layers);
    bool ok = to_f32(dst, &dst->m.tok_embd, &src->m.tok_embd);
    if (ok && src->m.tied_output)
        dst->m.output = dst->m.tok_embd;
    else if (ok)
        ok = to_f32(dst, &dst->m.output, &src->m.output);
    for (int l = 0; l < ST_LAYER && ok; l++) {
        gpe_layer *D = &dst->layers[l];
        const gpe_layer *S = &src->layers[l];
        ok = to_f32(dst, &D->wq, &S->wq) && to_f32(dst, &D->wk, &S->wk) &&
             to_f32(dst, &D->wv, &S->wv) && to_f32(dst, &D->wo, &S->wo) &&
             to_f32(dst, &D->w_gate, &S->w_gate) && to_f32(dst, &D->w_up, &S->w_up) &&
             to_f32(dst, &D->w_down, &S->w_down);
    }
    if (!ok)
        gpe_st_model_free(dst);
    return ok;
}

/* ------------------------------------------------------------- script */

#define ST_CTX 32
#define ST_SEQ 2
#define ST_BATCH 16

typedef struct st_step {
    int n;
    int32_t tok[ST_BATCH];
    int pos[ST_BATCH], seq[ST_BATCH];
    bool want[ST_BATCH];
} st_step;

/* The batch script: steps 0-1 prefill (12 tokens: GEMM path; 5 tokens:
 * 5-column mat-vec), 2-4 decode both sequences in one batch (2 columns),
 * 5 a mixed batch (one decode token of seq 0 + 10 prompt tokens of seq 1). */
static void st_script(st_step steps[GPE_ST_STEPS])
{
    rng r = { 42 };
    memset(steps, 0, sizeof(st_step) * GPE_ST_STEPS);
    int len[ST_SEQ] = { 0, 0 };
#define ADD(S, sq, w)                                                                         \
    do {                                                                                      \
        st_step *s_ = (S);                                                                    \
        s_->tok[s_->n] = (int32_t)(rng_next(&r) % ST_VOCAB);                                  \
        s_->seq[s_->n] = (sq);                                                                \
        s_->pos[s_->n] = len[(sq)]++;                                                         \
        s_->want[s_->n] = (w);                                                                \
        s_->n++;                                                                              \
    } while (0)
    for (int i = 0; i < 12; i++)
        ADD(&steps[0], 0, i % 4 == 0 || i == 11);
    for (int i = 0; i < 5; i++)
        ADD(&steps[1], 1, true);
    for (int k = 2; k < 5; k++) {
        ADD(&steps[k], 0, true);
        ADD(&steps[k], 1, true);
    }
    ADD(&steps[5], 0, true);
    for (int i = 0; i < 10; i++)
        ADD(&steps[5], 1, i % 3 == 0);
#undef ADD
}

static int st_total_rows(const st_step *steps, int step_rows[GPE_ST_STEPS])
{
    int total = 0;
    for (int s = 0; s < GPE_ST_STEPS; s++) {
        step_rows[s] = 0;
        for (int i = 0; i < steps[s].n; i++)
            step_rows[s] += steps[s].want[i];
        total += step_rows[s];
    }
    return total;
}

gpe_status gpe_st_run_cpu(const gpe_llama *m, float **logits, int step_rows[GPE_ST_STEPS],
                          char *err, size_t errlen)
{
    return gpe_st_run_cpu_kv(m, false, logits, step_rows, err, errlen);
}

gpe_status gpe_st_run_cpu_kv(const gpe_llama *m, bool kv_f16, float **logits,
                             int step_rows[GPE_ST_STEPS], char *err, size_t errlen)
{
    st_step steps[GPE_ST_STEPS];
    gpe_kv kv;
    gpe_fwd f;
    gpe_pool *pool = NULL;
    float *out = NULL;
    gpe_status st = GPE_ERR_NOMEM;
    bool kv_ok = false, f_ok = false;

    st_script(steps);
    const int total = st_total_rows(steps, step_rows);
    out = malloc((size_t)total * (size_t)m->hp.n_vocab * sizeof(float));
    kv_ok = gpe_kv_init(&kv, m->hp.n_layer, ST_SEQ, ST_CTX,
                        m->hp.n_head_kv * m->hp.head_dim, kv_f16) == 0;
    f_ok = gpe_fwd_init(&f, m, ST_BATCH, ST_CTX, 1) == 0;
    pool = gpe_pool_create(1);
    if (!out || !kv_ok || !f_ok || !pool || gpe_fwd_reserve_logits(&f, m, ST_BATCH) != 0) {
        snprintf(err, errlen, "CPU reference: out of memory");
        goto done;
    }
    size_t off = 0;
    for (int s = 0; s < GPE_ST_STEPS; s++) {
        const st_step *p = &steps[s];
        int rows = gpe_llama_forward(m, &f, &kv, pool, p->tok, p->pos, p->seq, p->want, p->n,
                                     out + off);
        off += (size_t)rows * (size_t)m->hp.n_vocab;
    }
    *logits = out;
    out = NULL;
    st = GPE_OK;
done:
    free(out);
    if (kv_ok)
        gpe_kv_free(&kv);
    if (f_ok)
        gpe_fwd_free(&f);
    gpe_pool_destroy(pool);
    return st;
}

gpe_status gpe_st_run_cuda(const gpe_llama *m, float **logits, int step_rows[GPE_ST_STEPS],
                           char *err, size_t errlen)
{
    return gpe_st_run_cuda_ex(m, 1, false, logits, step_rows, err, errlen);
}

gpe_status gpe_st_run_cuda_ex(const gpe_llama *m, int n_split, bool kv_f16, float **logits,
                              int step_rows[GPE_ST_STEPS], char *err, size_t errlen)
{
    st_step steps[GPE_ST_STEPS];
    gpe_cuda_model *cm = NULL;
    float *out = NULL;
    gpe_status st;

    st_script(steps);
    const int total = st_total_rows(steps, step_rows);
    out = malloc((size_t)total * (size_t)m->hp.n_vocab * sizeof(float));
    if (!out) {
        snprintf(err, errlen, "out of memory");
        return GPE_ERR_NOMEM;
    }
    gpe_bplace pl;
    memset(&pl, 0, sizeof pl);
    pl.n = n_split < 1 ? 1 : n_split > GPE_MAX_DEVICES ? GPE_MAX_DEVICES : n_split;
    gpe_bsizes sz = { ST_CTX, ST_SEQ, ST_BATCH, 1, kv_f16 };
    st = gpe_cuda_model_create(m, &pl, &sz, &cm, err, errlen);
    size_t off = 0;
    for (int s = 0; s < GPE_ST_STEPS && st == GPE_OK; s++) {
        const st_step *p = &steps[s];
        st = gpe_cuda_forward(cm, p->tok, p->pos, p->seq, p->want, p->n, out + off, err,
                              errlen);
        off += (size_t)step_rows[s] * (size_t)m->hp.n_vocab;
    }
    gpe_cuda_model_free(cm);
    if (st != GPE_OK) {
        free(out);
        return st;
    }
    *logits = out;
    return GPE_OK;
}

/* ------------------------------------------------------- the self-test */

typedef struct report {
    char *buf;
    size_t len, cap;
    int n_fail, n_pass;
} report;

static void rep_add(report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void rep_add(report *r, const char *fmt, ...)
{
    if (!r->buf || r->cap == 0 || r->len + 1 >= r->cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(r->buf + r->len, r->cap - r->len, fmt, ap);
    va_end(ap);
    if (k > 0)
        r->len = r->len + (size_t)k < r->cap ? r->len + (size_t)k : r->cap - 1;
}

/* Records a check: name, NMSE, threshold. A backend error counts as a
 * failure with its message. */
static void rep_check(report *r, const char *name, gpe_status st, const char *msg,
                      double nmse, double th)
{
    if (st != GPE_OK) {
        r->n_fail++;
        rep_add(r, "%s FAIL (%s: %s); ", name, gpe_status_name(st), msg);
        return;
    }
    const bool ok = nmse <= th;
    ok ? r->n_pass++ : r->n_fail++;
    rep_add(r, "%s %s nmse=%.2e%s; ", name, ok ? "ok" : "FAIL", nmse,
            ok ? "" : (th == 0.0 ? " (must be exact)" : " (over threshold)"));
}

static const gpe_type k_types[] = { GPE_TYPE_F32,  GPE_TYPE_F16,  GPE_TYPE_BF16,
                                    GPE_TYPE_Q8_0, GPE_TYPE_Q4_0, GPE_TYPE_Q4_K,
                                    GPE_TYPE_Q5_K, GPE_TYPE_Q6_K };
#define N_TYPES (sizeof k_types / sizeof k_types[0])

/* The dp4a kernels' activation rounding (mmvq.cu, q8_kernel) on the host:
 * per 32 values d = max|x| / 127, q = round(x / d) (half away from zero),
 * and out = q * d, the value the kernel multiplies with. */
static void q8_round(const float *x, float *out, size_t n)
{
    for (size_t b = 0; b + 32 <= n; b += 32) {
        float a = 0.0f;
        for (size_t i = 0; i < 32; i++)
            a = fmaxf(a, fabsf(x[b + i]));
        const float d = a / 127.0f;
        for (size_t i = 0; i < 32; i++) {
            int q = d == 0.0f ? 0 : (int)roundf(x[b + i] / d);
            q = q > 127 ? 127 : (q < -127 ? -127 : q);
            out[b + i] = (float)((double)q * (double)d);
        }
    }
}

/* ref[t][i] = sum_c deq[i][c] * x[t][c] in double. */
static void matmul_ref(const float *deq, const float *x, int n_tok, int rows, int cols,
                       float *ref)
{
    for (int t0 = 0; t0 < n_tok; t0++)
        for (int i = 0; i < rows; i++) {
            double s = 0.0;
            for (int c = 0; c < cols; c++)
                s += (double)deq[(size_t)i * cols + c] * (double)x[(size_t)t0 * cols + c];
            ref[(size_t)t0 * rows + i] = (float)s;
        }
}

static void check_matmul_ops(report *rep, rng *r)
{
    enum { ROWS = 37, COLS = 512, MAXT = 64 };
    char msg[256], name[64];
    gpe_weight w;
    gpe_st_model holder;
    memset(&holder, 0, sizeof holder);
    float *x = malloc(sizeof(float) * MAXT * COLS);
    float *y = malloc(sizeof(float) * MAXT * ROWS);
    float *ref = malloc(sizeof(float) * MAXT * ROWS);
    float *deq = malloc(sizeof(float) * ROWS * COLS);
    float *gdeq = malloc(sizeof(float) * ROWS * COLS);
    float *x8 = malloc(sizeof(float) * MAXT * COLS);
    float *ref8 = malloc(sizeof(float) * MAXT * ROWS);
    if (!x || !y || !ref || !deq || !gdeq || !x8 || !ref8) {
        rep_check(rep, "matmul", GPE_ERR_NOMEM, "out of memory", 0, 0);
        goto done;
    }
    for (int i = 0; i < MAXT * COLS; i++)
        x[i] = rng_f(r);
    q8_round(x, x8, (size_t)MAXT * COLS);
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const gpe_type t = k_types[ti];
        gpe_st_model_free(&holder);
        if (!st_weight(&holder, &w, t, ROWS, COLS, r)) {
            rep_check(rep, gpe_type_name(t), GPE_ERR_NOMEM, "out of memory", 0, 0);
            continue;
        }
        for (int i = 0; i < ROWS; i++)
            gpe_dequantize_row(t, (const uint8_t *)w.data + (size_t)i * w.row_bytes,
                               deq + (size_t)i * COLS, COLS);
        snprintf(name, sizeof name, "dequant %s", gpe_type_name(t));
        gpe_status st = gpe_cuda_test_dequant(t, w.data, ROWS, COLS, gdeq, msg, sizeof msg);
        rep_check(rep, name, st, msg, st ? 0 : gpe_st_nmse(gdeq, deq, (size_t)ROWS * COLS),
                  TH_EXACT);

        matmul_ref(deq, x, MAXT, ROWS, COLS, ref);
        const bool q8 = gpe_cuda_test_matvec_q8(t), i8 = gpe_cuda_test_mmq_i8(t);
        if (q8 || i8)
            matmul_ref(deq, x8, MAXT, ROWS, COLS, ref8);
        /* mat-vec up to 8 tokens; the cuBLAS GEMM (forced) at 8 and 13;
         * 9..64 unforced: the small-batch GEMM on F16 and quantized types
         * (mmq.cuh, or mmq_i8.cuh on the types it takes: one and two token
         * tiles, partial and whole, split sums), the cuBLAS GEMM on
         * F32/BF16 */
        static const struct { int n; bool gemm; } cases[] = {
            { 1, false },  { 3, false },  { 8, false },  { 8, true },  { 13, true },
            { 9, false },  { 13, false }, { 32, false }, { 40, false }, { 64, false } };
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            const bool gemm = cases[c].gemm, mv = !gemm && cases[c].n <= GPE_CUDA_MMV_MAX_ST;
            const bool f32 = t == GPE_TYPE_F32 || t == GPE_TYPE_BF16;
            const bool mq = !gemm && !mv && !f32;
            /* the int8 paths: reference on the rounded x, F32 threshold */
            const bool rounded = (q8 && mv) || (i8 && mq);
            snprintf(name, sizeof name, "%s %s x%d",
                     mv ? "matvec" : !mq ? "gemm" : i8 ? "mmq_i8" : "mmq", gpe_type_name(t),
                     cases[c].n);
            st = gpe_cuda_test_matmul(t, w.data, ROWS, COLS, x, cases[c].n, gemm, y, msg,
                                      sizeof msg);
            const double th = rounded ? TH_F32 : (!mv && !f32) ? TH_GEMM_F16 : TH_F32;
            const float *want = rounded ? ref8 : ref;
            rep_check(rep, name, st, msg,
                      st ? 0 : gpe_st_nmse(y, want, (size_t)cases[c].n * ROWS), th);
            if (rounded && st == GPE_OK) {
                snprintf(name, sizeof name, "%s %s x%d vs f32 x", mv ? "matvec" : "mmq_i8",
                         gpe_type_name(t), cases[c].n);
                rep_check(rep, name, st, msg, gpe_st_nmse(y, ref, (size_t)cases[c].n * ROWS),
                          TH_Q8_ACT);
            }
        }
    }
done:
    gpe_st_model_free(&holder);
    free(x);
    free(y);
    free(ref);
    free(deq);
    free(gdeq);
    free(x8);
    free(ref8);
}

/* The small-batch GEMMs' tails: 70 rows (a second, partial tile of 64),
 * 160 columns on the 32-value types (a partial step: of 128 columns in
 * mmq.cu, of 256 in mmq_i8.cu), 768 on the K-quants (three steps of 256:
 * split sums in mmq_i8.cu), and 9, 40 and 64 tokens (partial and whole
 * token tiles of 32 and 64). The int8 path is held to the mat-vec's
 * thresholds: F32 against the rounded x, TH_Q8_ACT against x. */
static void check_mmq_tails(report *rep, rng *r)
{
    enum { ROWS = 70, MAXC = 768, MAXT = 64 };
    static const struct { gpe_type t; int cols; } types[] = {
        { GPE_TYPE_F16, 160 },  { GPE_TYPE_Q8_0, 160 }, { GPE_TYPE_Q4_0, 160 },
        { GPE_TYPE_Q4_K, 768 }, { GPE_TYPE_Q6_K, 768 } };
    static const int toks[] = { 9, 40, 64 };
    char msg[256], name[64];
    gpe_weight w;
    gpe_st_model holder;
    memset(&holder, 0, sizeof holder);
    float *x = malloc(sizeof(float) * MAXT * MAXC), *y = malloc(sizeof(float) * MAXT * ROWS);
    float *ref = malloc(sizeof(float) * MAXT * ROWS), *deq = malloc(sizeof(float) * ROWS * MAXC);
    float *x8 = malloc(sizeof(float) * MAXT * MAXC);
    float *ref8 = malloc(sizeof(float) * MAXT * ROWS);
    if (!x || !y || !ref || !deq || !x8 || !ref8) {
        rep_check(rep, "mmq tails", GPE_ERR_NOMEM, "out of memory", 0, 0);
        goto done;
    }
    for (int i = 0; i < MAXT * MAXC; i++)
        x[i] = rng_f(r);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const gpe_type t = types[ti].t;
        const int cols = types[ti].cols;
        const bool i8 = gpe_cuda_test_mmq_i8(t);
        gpe_st_model_free(&holder);
        if (!st_weight(&holder, &w, t, ROWS, cols, r)) {
            rep_check(rep, "mmq tails", GPE_ERR_NOMEM, "out of memory", 0, 0);
            continue;
        }
        for (int i = 0; i < ROWS; i++)
            gpe_dequantize_row(t, (const uint8_t *)w.data + (size_t)i * w.row_bytes,
                               deq + (size_t)i * cols, cols);
        /* x as MAXT rows of cols values */
        matmul_ref(deq, x, MAXT, ROWS, cols, ref);
        q8_round(x, x8, (size_t)MAXT * cols);
        matmul_ref(deq, x8, MAXT, ROWS, cols, ref8);
        for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++) {
            const int T = toks[k];
            const char *path = i8 ? "mmq_i8" : "mmq";
            snprintf(name, sizeof name, "%s %s %dx%d x%d", path, gpe_type_name(t), ROWS, cols,
                     T);
            gpe_status st =
                gpe_cuda_test_matmul(t, w.data, ROWS, cols, x, T, false, y, msg, sizeof msg);
            const size_t n = (size_t)T * ROWS;
            rep_check(rep, name, st, msg, st ? 0 : gpe_st_nmse(y, i8 ? ref8 : ref, n),
                      i8 ? TH_F32 : TH_GEMM_F16);
            if (i8 && st == GPE_OK) {
                snprintf(name, sizeof name, "%s %s %dx%d x%d vs f32 x", path, gpe_type_name(t),
                         ROWS, cols, T);
                rep_check(rep, name, st, msg, gpe_st_nmse(y, ref, n), TH_Q8_ACT);
            }
        }
    }
done:
    gpe_st_model_free(&holder);
    free(x);
    free(y);
    free(ref);
    free(deq);
    free(x8);
    free(ref8);
}

/* The activations of a fused step on the host, in double, before the
 * rounding: rmsnorm(x) * nw, x itself, or swiglu(x, up). */
static void fused_act(int op, const float *x, const float *aux, int n_tok, int cols, float *act)
{
    for (int t = 0; t < n_tok; t++) {
        const float *xr = x + (size_t)t * cols;
        double sc = 1.0;
        if (op == GPE_CUDA_TEST_FUSE_NORM) {
            double ss = 0.0;
            for (int c = 0; c < cols; c++)
                ss += (double)xr[c] * xr[c];
            sc = 1.0 / sqrt(ss / cols + 1e-5);
        }
        for (int c = 0; c < cols; c++) {
            const double v = xr[c];
            const size_t i = (size_t)t * cols + c;
            if (op == GPE_CUDA_TEST_FUSE_NORM)
                act[i] = (float)(v * sc * aux[c]);
            else if (op == GPE_CUDA_TEST_FUSE_ADD)
                act[i] = (float)v;
            else
                act[i] = (float)(v / (1.0 + exp(-v)) * aux[i]);
        }
    }
}

/* One fused step (op) on weights of type t: for two shapes (the row
 * widths not multiples of the RMSNorm block, 256 or 1024 threads; 37 rows
 * a weight, not a multiple of the mat-vec's 4 rows per block, so a group
 * launch has a partial block in each weight) and 1, 3 and 8 activation
 * rows, the fused kernels against the separate ones (must be
 * bit-identical, and the fused ones must have run where the dp4a path
 * takes t) and against a double reference of the unrounded activations
 * (TH_Q8_ACT: catches a fused kernel that agrees with a broken separate
 * one). */
static void check_fused_op(report *rep, rng *r, int op, gpe_type t)
{
    enum { MAXC = 2304, MAXT = 8 };
    /* the norm step: Q/K/V-like, three weights of 37 rows in one group */
    const int rows = op == GPE_CUDA_TEST_FUSE_NORM ? 3 * 37 : 37;
    static const char *const op_name[] = { "norm", "add", "swiglu" };
    const bool k = t == GPE_TYPE_Q4_K || t == GPE_TYPE_Q5_K || t == GPE_TYPE_Q6_K;
    const int shapes[2] = { k ? 768 : 160, k ? 2304 : 2080 };
    static const int toks[3] = { 1, 3, 8 };
    char msg[256] = "", name[96];
    gpe_weight w;
    gpe_st_model holder;
    memset(&holder, 0, sizeof holder);
    const size_t xn = (size_t)MAXT * MAXC, yn = (size_t)MAXT * (size_t)rows;
    float *x = malloc(sizeof(float) * xn), *aux = malloc(sizeof(float) * xn);
    float *act = malloc(sizeof(float) * xn), *res = malloc(sizeof(float) * yn);
    float *y0 = malloc(sizeof(float) * yn), *y1 = malloc(sizeof(float) * yn);
    float *ref = malloc(sizeof(float) * yn), *deq = malloc(sizeof(float) * rows * (size_t)MAXC);
    double worst_exact = 0.0, worst_ref = 0.0;
    gpe_status st = GPE_OK;
    if (!x || !aux || !act || !res || !y0 || !y1 || !ref || !deq) {
        st = GPE_ERR_NOMEM;
        snprintf(msg, sizeof msg, "out of memory");
    }
    for (int si = 0; si < 2 && st == GPE_OK; si++) {
        const int cols = shapes[si];
        gpe_st_model_free(&holder);
        if (!st_weight(&holder, &w, t, rows, cols, r)) {
            st = GPE_ERR_NOMEM;
            snprintf(msg, sizeof msg, "out of memory");
            break;
        }
        for (int i = 0; i < rows; i++)
            gpe_dequantize_row(t, (const uint8_t *)w.data + (size_t)i * w.row_bytes,
                               deq + (size_t)i * cols, cols);
        for (int ti = 0; ti < 3 && st == GPE_OK; ti++) {
            const int n = toks[ti];
            for (size_t i = 0; i < (size_t)n * cols; i++) {
                x[i] = (op == GPE_CUDA_TEST_FUSE_NORM ? 3.0f : 1.0f) * rng_f(r);
                aux[i] = op == GPE_CUDA_TEST_FUSE_NORM ? 1.0f + 0.5f * rng_f(r) : rng_f(r);
            }
            for (size_t i = 0; i < (size_t)n * rows; i++)
                res[i] = op == GPE_CUDA_TEST_FUSE_NORM ? 0.0f : rng_f(r);
            fused_act(op, x, aux, n, cols, act);
            matmul_ref(deq, act, n, rows, cols, ref);
            for (size_t i = 0; i < (size_t)n * rows; i++)
                ref[i] += res[i];
            bool f0 = false, f1 = false;
            st = gpe_cuda_test_fused(op, t, w.data, rows, cols, x, aux, res, n, false, y0, &f0,
                                     msg, sizeof msg);
            if (st == GPE_OK)
                st = gpe_cuda_test_fused(op, t, w.data, rows, cols, x, aux, res, n, true, y1,
                                         &f1, msg, sizeof msg);
            if (st == GPE_OK && (f0 || f1 != gpe_cuda_test_matvec_q8(t))) {
                st = GPE_ERR_BACKEND;
                snprintf(msg, sizeof msg, "%d columns x%d: fused kernels %s", cols, n,
                         f1 ? "ran where they should not" : "did not run");
            }
            if (st != GPE_OK)
                break;
            const double e = gpe_st_nmse(y1, y0, (size_t)n * rows);
            const double d = gpe_st_nmse(y1, ref, (size_t)n * rows);
            worst_exact = e > worst_exact ? e : worst_exact;
            worst_ref = d > worst_ref ? d : worst_ref;
        }
    }
    snprintf(name, sizeof name, "fused %s %s vs unfused", op_name[op], gpe_type_name(t));
    rep_check(rep, name, st, msg, worst_exact, TH_EXACT);
    if (st == GPE_OK) {
        snprintf(name, sizeof name, "fused %s %s vs f32 x", op_name[op], gpe_type_name(t));
        rep_check(rep, name, st, msg, worst_ref, TH_Q8_ACT);
    }
    gpe_st_model_free(&holder);
    free(x);
    free(aux);
    free(act);
    free(res);
    free(y0);
    free(y1);
    free(ref);
    free(deq);
}

static void check_fused(report *rep, rng *r)
{
    static const gpe_type types[] = { GPE_TYPE_Q4_0, GPE_TYPE_Q8_0, GPE_TYPE_Q4_K,
                                      GPE_TYPE_Q6_K, GPE_TYPE_Q5_K };
    for (int op = GPE_CUDA_TEST_FUSE_NORM; op <= GPE_CUDA_TEST_FUSE_SWIGLU; op++)
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
            check_fused_op(rep, r, op, types[ti]);
}

static void check_rmsnorm(report *rep, rng *r)
{
    enum { ROWS = 5, N = 1000 };
    char msg[256];
    static float x[ROWS * N], w[N], out[ROWS * N], ref[ROWS * N];
    for (int i = 0; i < ROWS * N; i++)
        x[i] = 3.0f * rng_f(r);
    for (int i = 0; i < N; i++)
        w[i] = 1.0f + 0.5f * rng_f(r);
    for (int t = 0; t < ROWS; t++) {
        double ss = 0.0;
        for (int i = 0; i < N; i++)
            ss += (double)x[t * N + i] * x[t * N + i];
        const double sc = 1.0 / sqrt(ss / N + 1e-5);
        for (int i = 0; i < N; i++)
            ref[t * N + i] = (float)(x[t * N + i] * sc * w[i]);
    }
    gpe_status st = gpe_cuda_test_rmsnorm(x, w, ROWS, N, 1e-5f, out, msg, sizeof msg);
    rep_check(rep, "rmsnorm", st, msg, st ? 0 : gpe_st_nmse(out, ref, ROWS * N), TH_F32);
}

static void check_rope(report *rep, rng *r)
{
    enum { T = 6, H = 4, HKV = 2, HD = 80, ROT = 64, CTX = 2000 };
    const float base = 500000.0f, fscale = 0.25f;
    char msg[256];
    static float q[T * H * HD], q0[T * H * HD], k[T * HKV * HD], v[T * HKV * HD];
    static float kc[CTX * HKV * HD], vc[CTX * HKV * HD], qref[T * H * HD];
    static float kref[T * HKV * HD], kgot[T * HKV * HD], vgot[T * HKV * HD];
    float freqs[ROT / 2];
    const int pos[T] = { 0, 1, 7, 100, 1023, 1999 };
    for (int i = 0; i < T * H * HD; i++)
        q0[i] = q[i] = rng_f(r);
    for (int i = 0; i < T * HKV * HD; i++) {
        k[i] = rng_f(r);
        v[i] = rng_f(r);
    }
    for (int i = 0; i < ROT / 2; i++)
        freqs[i] = 1.0f + (float)i / 8.0f;
    /* Reference in double with model.c's angle recurrence (float). */
    const float ts = powf(base, -2.0f / (float)ROT);
    for (int t = 0; t < T; t++) {
        float theta = (float)pos[t];
        double cs[ROT];
        for (int i = 0; i < ROT; i += 2) {
            const float th = (theta / freqs[i / 2]) * fscale;
            cs[i] = cos((double)th);
            cs[i + 1] = sin((double)th);
            theta *= ts;
        }
        for (int pass = 0; pass < 2; pass++) {
            const int nh = pass ? HKV : H;
            const float *src = pass ? k + t * HKV * HD : q0 + t * H * HD;
            float *dst = pass ? kref + t * HKV * HD : qref + t * H * HD;
            for (int h = 0; h < nh; h++)
                for (int d = 0; d < HD; d++) {
                    const float *e = src + h * HD;
                    if (d >= ROT) {
                        dst[h * HD + d] = e[d];
                        continue;
                    }
                    const int d0 = d & ~1;
                    dst[h * HD + d] = (float)((d & 1) ? e[d0] * cs[d0 + 1] + e[d0 + 1] * cs[d0]
                                                      : e[d0] * cs[d0] - e[d0 + 1] * cs[d0 + 1]);
                }
        }
    }
    gpe_status st = gpe_cuda_test_rope(q, k, v, pos, T, H, HKV, HD, ROT, base, fscale, freqs, CTX,
                                       kc, vc, msg, sizeof msg);
    if (st == GPE_OK)
        for (int t = 0; t < T; t++) {
            memcpy(kgot + t * HKV * HD, kc + (size_t)pos[t] * HKV * HD, sizeof(float) * HKV * HD);
            memcpy(vgot + t * HKV * HD, vc + (size_t)pos[t] * HKV * HD, sizeof(float) * HKV * HD);
        }
    rep_check(rep, "rope q", st, msg, st ? 0 : gpe_st_nmse(q, qref, T * H * HD), TH_F32);
    rep_check(rep, "rope k", st, msg, st ? 0 : gpe_st_nmse(kgot, kref, T * HKV * HD), TH_F32);
    rep_check(rep, "rope v", st, msg, st ? 0 : gpe_st_nmse(vgot, v, T * HKV * HD), TH_EXACT);
}

/* One attention shape: tokens (pos, seq), caches of nseq x ctx positions,
 * heads H over HKV KV heads of size HD, soft-cap and window (0: none). */
typedef struct attn_case {
    const char *name;
    int T, nseq, ctx, H, HKV, HD;
    float softcap;
    int window;
    bool decode_rows;   /* more than 8 tokens through the decode kernel */
} attn_case;

/* The attention of token t, head h in double (the kernel's definition,
 * attention.cuh). sc: ctx doubles of scratch. */
static void attn_ref_row(const attn_case *c, const float *q, const float *kc, const float *vc,
                         int t, int h, int pos, int seq, double *sc, float *ref)
{
    const int kvh = h / (c->H / c->HKV);
    const int i0 = c->window > 0 && pos - c->window + 1 > 0 ? pos - c->window + 1 : 0;
    const float *qv = q + ((size_t)t * c->H + h) * c->HD;
    double mx = -INFINITY, sum = 0.0;
    for (int i = i0; i <= pos; i++) {
        const float *kr = kc + ((size_t)(seq * c->ctx + i) * c->HKV + kvh) * c->HD;
        double d = 0.0;
        for (int e = 0; e < c->HD; e++)
            d += (double)qv[e] * kr[e];
        sc[i] = d / sqrt((double)c->HD);
        if (c->softcap > 0.0f)
            sc[i] = c->softcap * tanh(sc[i] / c->softcap);
        if (sc[i] > mx)
            mx = sc[i];
    }
    for (int i = i0; i <= pos; i++)
        sum += (sc[i] = exp(sc[i] - mx));
    for (int e = 0; e < c->HD; e++) {
        double o = 0.0;
        for (int i = i0; i <= pos; i++)
            o += sc[i] * vc[((size_t)(seq * c->ctx + i) * c->HKV + kvh) * c->HD + e];
        ref[((size_t)t * c->H + h) * c->HD + e] = (float)(o / sum);
    }
}

static void check_attention_case(report *rep, rng *r, const attn_case *c, const int *pos,
                                 const int *seq)
{
    char msg[256], name[96];
    const size_t nq = (size_t)c->T * c->H * c->HD;
    const size_t nc = (size_t)c->nseq * c->ctx * c->HKV * c->HD;
    float *q = malloc(nq * sizeof *q), *out = malloc(nq * sizeof *out);
    float *ref = malloc(nq * sizeof *ref), *kc = malloc(nc * sizeof *kc);
    float *vc = malloc(nc * sizeof *vc);
    double *sc = malloc((size_t)c->ctx * sizeof *sc);
    snprintf(name, sizeof name, "attention %s", c->name);
    if (!q || !out || !ref || !kc || !vc || !sc) {
        rep_check(rep, name, GPE_ERR_NOMEM, "no host memory", 0, TH_F32);
        goto done;
    }
    for (size_t i = 0; i < nq; i++)
        q[i] = 2.0f * rng_f(r);
    for (size_t i = 0; i < nc; i++) {
        kc[i] = rng_f(r);
        vc[i] = rng_f(r);
    }
    for (int t = 0; t < c->T; t++)
        for (int h = 0; h < c->H; h++)
            attn_ref_row(c, q, kc, vc, t, h, pos[t], seq[t], sc, ref);
    gpe_status st = gpe_cuda_test_attention(q, kc, vc, pos, seq, c->T, c->nseq, c->ctx, c->H,
                                            c->HKV, c->HD, c->softcap, c->window,
                                            c->decode_rows, out, msg, sizeof msg);
    rep_check(rep, name, st, msg, st ? 0 : gpe_st_nmse(out, ref, nq), TH_F32);
done:
    free(q);
    free(out);
    free(ref);
    free(kc);
    free(vc);
    free(sc);
}

/* Each kernel of attention.cu on the shapes that select it: the decode
 * kernel (<= 8 tokens, and 20 with decode_rows) with 1, 2 and 12 key
 * splits and GQA groups 1, 4, 6 and 16 (RW 1, 4, 8 with a partial and a
 * second pass), the prefill kernel
 * (> 8 tokens) for head sizes 64/96/128 (4 rows per warp) and 256 (1 row),
 * sequences mixed in one tile, soft-cap and sliding window. */
static void check_attention(report *rep, rng *r)
{
    static const attn_case dec = { "decode", 7, 3, 300, 8, 2, 128, 0.0f, 0, false };
    static const int dec_pos[7] = { 0, 1, 2, 299, 5, 150, 37 };
    static const int dec_seq[7] = { 0, 0, 0, 1, 2, 2, 1 };
    static const attn_case dec_long = { "decode long", 3, 2, 3000, 12, 2, 96, 30.0f, 0,
                                        false };
    static const int dl_pos[3] = { 2999, 1000, 257 };
    static const int dl_seq[3] = { 1, 0, 1 };
    static const attn_case dec_g16 = { "decode group 16", 2, 1, 600, 16, 1, 64, 0.0f, 500,
                                       false };
    static const int g16_pos[2] = { 599, 100 };
    static const int g16_seq[2] = { 0, 0 };
    static const attn_case dec_g1 = { "decode group 1", 8, 2, 1200, 4, 4, 256, 0.0f, 0,
                                      false };
    static const int g1_pos[8] = { 1199, 0, 700, 3, 256, 255, 511, 1000 };
    static const int g1_seq[8] = { 0, 1, 1, 0, 0, 1, 0, 1 };
    check_attention_case(rep, r, &dec, dec_pos, dec_seq);
    check_attention_case(rep, r, &dec_long, dl_pos, dl_seq);
    check_attention_case(rep, r, &dec_g16, g16_pos, g16_seq);
    check_attention_case(rep, r, &dec_g1, g1_pos, g1_seq);
    /* short contexts in a long cache (16 splits of 256 keys): positions 0,
     * 1 and 5 (one split, written by the decode kernel itself; the empty
     * splits exit), 300 (two splits merged); with a 10-key window, keys
     * 691..700 (split 2 alone) and 511..520 (splits 1 and 2) */
    static const attn_case dec_short = { "decode short in ctx 4096", 4, 2, 4096, 8, 8, 128,
                                         0.0f, 0, false };
    static const int ds_pos[4] = { 0, 1, 5, 300 };
    static const int ds_seq[4] = { 0, 1, 1, 0 };
    static const attn_case dec_short_w = { "decode short window in ctx 4096", 3, 1, 4096, 8, 2,
                                           64, 0.0f, 10, false };
    static const int dsw_pos[3] = { 5, 700, 520 };
    static const int dsw_seq[3] = { 0, 0, 0 };
    check_attention_case(rep, r, &dec_short, ds_pos, ds_seq);
    check_attention_case(rep, r, &dec_short_w, dsw_pos, dsw_seq);

    /* a batched decode step: 20 sequences, one token each */
    enum { DT = 20 };
    int dpos[DT], dseq[DT];
    for (int t = 0; t < DT; t++) {
        dseq[t] = DT - 1 - t;
        dpos[t] = (37 * t + 11) % 300;
    }
    static const attn_case dec_many = { "decode 20 sequences", DT, DT, 300, 8, 2, 128, 0.0f, 0,
                                        true };
    check_attention_case(rep, r, &dec_many, dpos, dseq);

    /* prefill: a 30-token chunk of sequence 0, then tokens of sequences 1
     * and 2 interleaved (tiles with two sequences) */
    enum { PT = 45 };
    int pos[PT], seq[PT];
    for (int t = 0; t < PT; t++) {
        seq[t] = t < 30 ? 0 : 1 + t % 2;
        pos[t] = t < 30 ? 40 + t : 100 + 3 * t;
    }
    static const attn_case pre[] = {
        { "prefill", PT, 3, 300, 8, 2, 128, 0.0f, 0, false },
        { "prefill head 64 window", PT, 3, 300, 8, 1, 64, 0.0f, 17, false },
        { "prefill head 96", PT, 3, 300, 6, 2, 96, 0.0f, 0, false },
        { "prefill head 256 soft-cap", PT, 3, 300, 4, 2, 256, 20.0f, 9, false },
    };
    for (size_t i = 0; i < sizeof pre / sizeof pre[0]; i++)
        check_attention_case(rep, r, &pre[i], pos, seq);
}

/* The Q4_K model (a) split over device 0 twice and three times against
 * one device: same kernels and shapes, so NMSE 0 is expected (threshold
 * 1e-10 leaves room for a library choosing another algorithm); (b) with an
 * F16 KV cache against the CPU's F16 KV path, one device and split. */
static void check_split_and_kv_f16(report *rep)
{
    char msg[256], name[64];
    gpe_st_model sm;
    float *one = NULL, *cpu16 = NULL;
    int rows[GPE_ST_STEPS];
    if (!gpe_st_model_build(&sm, GPE_TYPE_Q4_K, 4242)) {
        rep_check(rep, "model Q4_K split", GPE_ERR_NOMEM, "out of memory", 0, 0);
        return;
    }
    gpe_status st = gpe_st_run_cuda_ex(&sm.m, 1, false, &one, rows, msg, sizeof msg);
    for (int k = 2; k <= 3; k++) {
        float *g = NULL;
        gpe_status s2 = st;
        if (s2 == GPE_OK)
            s2 = gpe_st_run_cuda_ex(&sm.m, k, false, &g, rows, msg, sizeof msg);
        snprintf(name, sizeof name, "model Q4_K split %dx device 0 vs one", k);
        rep_check(rep, name, s2, msg, s2 ? 0 : gpe_st_max_nmse(g, one, rows, sm.m.hp.n_vocab),
                  1e-10);
        free(g);
    }
    st = gpe_st_run_cpu_kv(&sm.m, true, &cpu16, rows, msg, sizeof msg);
    for (int k = 1; k <= 2; k++) {
        float *g = NULL;
        gpe_status s2 = st;
        if (s2 == GPE_OK)
            s2 = gpe_st_run_cuda_ex(&sm.m, k, true, &g, rows, msg, sizeof msg);
        snprintf(name, sizeof name, "model Q4_K KV F16%s vs CPU KV F16", k > 1 ? " split" : "");
        rep_check(rep, name, s2, msg,
                  s2 ? 0 : gpe_st_max_nmse(g, cpu16, rows, sm.m.hp.n_vocab),
                  gpe_st_model_threshold(GPE_TYPE_Q4_K) + GPE_ST_KV_F16_THRESHOLD);
        free(g);
    }
    free(one);
    free(cpu16);
    gpe_st_model_free(&sm);
}

static void check_models(report *rep)
{
    char msg[256], name[64];
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const gpe_type t = k_types[ti];
        gpe_st_model sm;
        float *cpu = NULL, *gpu = NULL;
        int rows_c[GPE_ST_STEPS], rows_g[GPE_ST_STEPS];
        snprintf(name, sizeof name, "model %s", gpe_type_name(t));
        if (!gpe_st_model_build(&sm, t, 1000 + ti)) {
            rep_check(rep, name, GPE_ERR_NOMEM, "out of memory", 0, 0);
            continue;
        }
        gpe_status st = gpe_st_run_cpu(&sm.m, &cpu, rows_c, msg, sizeof msg);
        if (st == GPE_OK)
            st = gpe_st_run_cuda(&sm.m, &gpu, rows_g, msg, sizeof msg);
        rep_check(rep, name, st, msg,
                  st ? 0 : gpe_st_max_nmse(gpu, cpu, rows_c, sm.m.hp.n_vocab),
                  gpe_st_model_threshold(t));
        free(cpu);
        free(gpu);
        gpe_st_model_free(&sm);
    }
    check_split_and_kv_f16(rep);
    for (int v = 1; v < GPE_ST_N_VARIANTS; v++) {
        gpe_st_model sm;
        float *cpu = NULL, *gpu = NULL;
        int rows_c[GPE_ST_STEPS], rows_g[GPE_ST_STEPS];
        snprintf(name, sizeof name, "model F16 %s", gpe_st_variant_name(v));
        if (!gpe_st_model_build(&sm, GPE_TYPE_F16, 2000 + v) ||
            !gpe_st_model_variant(&sm, v, 3000 + v)) {
            gpe_st_model_free(&sm);
            rep_check(rep, name, GPE_ERR_NOMEM, "out of memory", 0, 0);
            continue;
        }
        gpe_status st = gpe_st_run_cpu(&sm.m, &cpu, rows_c, msg, sizeof msg);
        if (st == GPE_OK)
            st = gpe_st_run_cuda(&sm.m, &gpu, rows_g, msg, sizeof msg);
        rep_check(rep, name, st, msg,
                  st ? 0 : gpe_st_max_nmse(gpu, cpu, rows_c, sm.m.hp.n_vocab),
                  gpe_st_model_threshold(GPE_TYPE_F16));
        free(cpu);
        free(gpu);
        gpe_st_model_free(&sm);
    }
}

gpe_status gpe_cuda_selftest_run(char *err, size_t errlen)
{
    int n_dev = 0;
    if (!gpe_cuda_device_count(&n_dev)) {
        if (err && errlen)
            snprintf(err, errlen, "no CUDA device");
        return GPE_ERR_BACKEND;
    }
    char *buf = malloc(16384);
    report rep = { buf, 0, buf ? 16384 : 0, 0, 0 };
    if (buf)
        buf[0] = '\0';
    rng r = { 7 };
    check_rmsnorm(&rep, &r);
    check_rope(&rep, &r);
    check_attention(&rep, &r);
    check_matmul_ops(&rep, &r);
    check_mmq_tails(&rep, &r);
    check_fused(&rep, &r);
    check_models(&rep);
    if (err && errlen)
        snprintf(err, errlen, "%d checks, %d failed on %d device(s): %s", rep.n_pass + rep.n_fail,
                 rep.n_fail, n_dev, buf ? buf : "(no memory for the details)");
    free(buf);
    return rep.n_fail ? GPE_ERR_BACKEND : GPE_OK;
}
