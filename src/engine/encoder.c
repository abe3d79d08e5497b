/*
 * encoder: the forward pass of BERT-style encoders (bert, nomic-bert), the
 * embedding models people use for retrieval. Weights are bound by model.c
 * (hp.encoder); this file only computes hidden states:
 *
 *   x = LayerNorm(token_embd[tok] + token_types[0] [+ position_embd[pos]: bert])
 *   for each layer:
 *     q, k, v = W x [+ b]       (nomic-bert: one fused qkv, RoPE NEOX on q, k)
 *     a = softmax(q k^T / sqrt(hd)) v over every token of the same sequence
 *         (bidirectional: no causal mask, no KV cache)
 *     x = LayerNorm(x + Wo a [+ bo])                       (post-norm)
 *     f = bert: Wdown gelu(Wup x + bu) + bd;  nomic-bert: Wdown(silu(Wg x) * Wup x)
 *     x = LayerNorm(x + f)
 *   hidden = x (no output norm; pooling happens in engine.c)
 *
 * Token type is always 0 ("sentence A"), as in llama.cpp. The matmuls are
 * model.c's (activations converted to the weight's vec_dot type, so F16
 * files round activations to F16 as llama.cpp does); LayerNorm and GELU
 * follow ggml's CPU arithmetic (sums in double, GELU through F16) so that
 * llama.cpp's pooled vectors are matched closely.
 */
#include "engine/model.h"

#include <math.h>
#include <string.h>

/* y = (x - mean) / sqrt(var + eps) * w + b over n values (sums in double,
 * as ggml_norm). In place is fine. */
static void layer_norm(float *y, const float *x, const float *w, const float *b, int n,
                       float eps)
{
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        sum += (double)x[i];
    const float mean = (float)(sum / n);
    double sum2 = 0.0;
    for (int i = 0; i < n; i++) {
        const float d = x[i] - mean;
        y[i] = d;
        sum2 += (double)(d * d);
    }
    const float scale = 1.0f / sqrtf((float)(sum2 / n) + eps);
    for (int i = 0; i < n; i++)
        y[i] = y[i] * scale * w[i] + b[i];
}

static void add_vec(float *x, const float *b, int n)
{
    if (b)
        for (int i = 0; i < n; i++)
            x[i] += b[i];
}

static void add_row(float *x, const gpe_weight *w, int64_t row, float *tmp, int n)
{
    gpe_dequantize_row(w->type, (const char *)w->data + (size_t)row * w->row_bytes, tmp, n);
    for (int i = 0; i < n; i++)
        x[i] += tmp[i];
}

/* Input embeddings of the n tokens into f->x, normalised. Uses f->xn as
 * a row buffer. */
static void embed_inputs(const gpe_llama *m, gpe_fwd *f, const int32_t *tokens, const int *pos,
                         int n)
{
    const int E = m->hp.n_embd;
    for (int t = 0; t < n; t++) {
        float *xr = f->x + (size_t)t * E;
        gpe_dequantize_row(m->tok_embd.type,
                           (const char *)m->tok_embd.data +
                               (size_t)tokens[t] * m->tok_embd.row_bytes,
                           xr, E);
        if (m->type_embd.data)
            add_row(xr, &m->type_embd, 0, f->xn, E);
        if (m->pos_embd.data)
            add_row(xr, &m->pos_embd, pos[t], f->xn, E);
        layer_norm(xr, xr, m->tok_norm, m->tok_norm_b, E, m->hp.norm_eps);
    }
}

/* ---- biases and RoPE on q, k, v (per token) ---- */

typedef struct qkv_job {
    const gpe_llama *m;
    const gpe_layer *L;
    gpe_fwd *f;
    const int *pos;
    int n;
} qkv_job;

/* NEOX rotation of the first n_rot dims of each head: pairs (i, i + n_rot/2),
 * angle pos * base^(-2i/n_rot), accumulated by multiplication in float
 * like ggml's rope cache. */
static void rope_neox(float *x, int n_heads, int hd, int n_rot, float base, float scale,
                      int pos)
{
    const float theta_scale = powf(base, -2.0f / (float)n_rot);
    const int half = n_rot / 2;
    float theta = (float)pos;
    for (int i = 0; i < half; i++) {
        const float c = cosf(theta * scale), s = sinf(theta * scale);
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (size_t)h * hd;
            const float x0 = v[i], x1 = v[i + half];
            v[i] = x0 * c - x1 * s;
            v[i + half] = x0 * s + x1 * c;
        }
        theta *= theta_scale;
    }
}

static void qkv_fn(void *arg, int ith, int nth)
{
    qkv_job *j = arg;
    const gpe_hparams *hp = &j->m->hp;
    const int hd = hp->head_dim, qd = hp->n_head * hd, kvd = hp->n_head_kv * hd;
    int64_t lo, hi;
    gpe_pool_split(j->n, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        float *q = j->f->q + (size_t)t * qd, *k = j->f->k + (size_t)t * kvd;
        add_vec(q, j->L->bq, qd);
        add_vec(k, j->L->bk, kvd);
        add_vec(j->f->v + (size_t)t * kvd, j->L->bv, kvd);
        if (hp->kind != GPE_ARCH_NOMIC_BERT)
            continue;
        rope_neox(q, hp->n_head, hd, hp->n_rot, j->L->rope_base, j->L->rope_freq_scale,
                  j->pos[t]);
        rope_neox(k, hp->n_head_kv, hd, hp->n_rot, j->L->rope_base, j->L->rope_freq_scale,
                  j->pos[t]);
    }
}

/* ---- bidirectional attention within each sequence ---- */

typedef struct enc_attn_job {
    const gpe_hparams *hp;
    gpe_fwd *f;
    const int *seq;
    int n;
} enc_attn_job;

/* One query head against keys [k0, k1): softmax computed online (running
 * maximum and sum), so no score buffer is needed whatever the length. */
static void attend_head(const enc_attn_job *j, const float *q, int kvh, int k0, int k1,
                        float *out)
{
    const int hd = j->hp->head_dim, kvd = j->hp->n_head_kv * hd;
    const float scale = j->hp->attn_scale;
    float mx = -INFINITY, sum = 0.0f;
    memset(out, 0, (size_t)hd * sizeof *out);
    for (int s = k0; s < k1; s++) {
        const float *k = j->f->k + (size_t)s * kvd + (size_t)kvh * hd;
        const float *v = j->f->v + (size_t)s * kvd + (size_t)kvh * hd;
        float d = 0.0f;
        for (int i = 0; i < hd; i++)
            d += q[i] * k[i];
        d *= scale;
        if (d > mx) {
            const float c = expf(mx - d);
            sum *= c;
            for (int i = 0; i < hd; i++)
                out[i] *= c;
            mx = d;
        }
        const float w = expf(d - mx);
        sum += w;
        for (int i = 0; i < hd; i++)
            out[i] += w * v[i];
    }
    const float inv = 1.0f / sum;
    for (int i = 0; i < hd; i++)
        out[i] *= inv;
}

static void enc_attn_fn(void *arg, int ith, int nth)
{
    enc_attn_job *j = arg;
    const gpe_hparams *hp = j->hp;
    const int hd = hp->head_dim, qd = hp->n_head * hd, grp = hp->n_head / hp->n_head_kv;
    int64_t lo, hi;
    gpe_pool_split(j->n, ith, nth, &lo, &hi);
    int k0 = 0, k1 = 0;
    for (int64_t t = lo; t < hi; t++) {
        if (t == lo || j->seq[t] != j->seq[t - 1]) {
            /* this token's sequence: the run of equal seq ids around it */
            for (k0 = (int)t; k0 > 0 && j->seq[k0 - 1] == j->seq[t]; k0--)
                ;
            for (k1 = (int)t + 1; k1 < j->n && j->seq[k1] == j->seq[t]; k1++)
                ;
        }
        for (int h = 0; h < hp->n_head; h++)
            attend_head(j, j->f->q + (size_t)t * qd + (size_t)h * hd, h / grp, k0, k1,
                        j->f->att + (size_t)t * qd + (size_t)h * hd);
    }
}

/* ---- FFN activation ---- */

typedef struct act_job {
    float *a;
    const float *b;      /* SwiGLU: the up projection; NULL: GELU alone */
    const float *bias;   /* GELU: bias added first (per row of n_ff) or NULL */
    int64_t n;
    int n_ff;
} act_job;

static void act_fn(void *arg, int ith, int nth)
{
    act_job *j = arg;
    int64_t lo, hi;
    gpe_pool_split(j->n, ith, nth, &lo, &hi);
    if (j->b) {
        gpe_model_silu_mul_row(j->a + lo, j->b + lo, hi - lo);
        return;
    }
    if (j->bias)
        for (int64_t i = lo; i < hi; i++)
            j->a[i] += j->bias[i % j->n_ff];
    gpe_model_gelu_row(j->a + lo, hi - lo);
}

/* f->xn = FFN(f->x) for n tokens. */
static void encoder_ffn(const gpe_llama *m, const gpe_layer *L, gpe_fwd *f, gpe_pool *pool,
                        int n)
{
    const gpe_hparams *hp = &m->hp;
    act_job aj = { f->up, NULL, L->b_up, (int64_t)n * hp->n_ff, hp->n_ff };
    if (L->w_gate.data) {
        const gpe_weight *ws[2] = { &L->w_gate, &L->w_up };
        float *outs[2] = { f->gate, f->up };
        gpe_model_matmul(f, pool, f->x, n, 2, ws, outs);
        aj = (act_job){ f->gate, f->up, NULL, (int64_t)n * hp->n_ff, hp->n_ff };
    } else {
        const gpe_weight *ws[1] = { &L->w_up };
        float *outs[1] = { f->up };
        gpe_model_matmul(f, pool, f->x, n, 1, ws, outs);
    }
    gpe_pool_run_n(pool, gpe_model_nth(pool, (double)aj.n * 32.0), act_fn, &aj);
    const gpe_weight *wd[1] = { &L->w_down };
    float *od[1] = { f->xn };
    gpe_model_matmul(f, pool, aj.a, n, 1, wd, od);
}

/* x = LayerNorm(x + y + bias) row by row (the post-norm residual). */
static void residual_norm(float *x, const float *y, const float *bias, const float *w,
                          const float *b, int n, int E, float eps)
{
    for (int t = 0; t < n; t++) {
        float *xr = x + (size_t)t * E;
        const float *yr = y + (size_t)t * E;
        for (int i = 0; i < E; i++)
            xr[i] = (yr[i] + (bias ? bias[i] : 0.0f)) + xr[i];
        layer_norm(xr, xr, w, b, E, eps);
    }
}

static void encoder_layer(const gpe_llama *m, int l, gpe_fwd *f, gpe_pool *pool, const int *pos,
                          const int *seq, int n)
{
    const gpe_hparams *hp = &m->hp;
    const gpe_layer *L = &m->layers[l];
    const int E = hp->n_embd;
    const size_t qd = (size_t)hp->n_head * hp->head_dim;
    const gpe_weight *ws[3] = { &L->wq, &L->wk, &L->wv };
    float *outs[3] = { f->q, f->k, f->v };
    gpe_model_matmul(f, pool, f->x, n, 3, ws, outs);
    qkv_job qj = { m, L, f, pos, n };
    gpe_pool_run_n(pool, gpe_model_nth(pool, (double)n * (double)(qd * 8)), qkv_fn, &qj);
    enc_attn_job aj = { hp, f, seq, n };
    gpe_pool_run_n(pool, gpe_model_nth(pool, (double)n * (double)n * (double)qd * 2.0),
                   enc_attn_fn, &aj);
    const gpe_weight *wo[1] = { &L->wo };
    float *oo[1] = { f->xn };
    gpe_model_matmul(f, pool, f->att, n, 1, wo, oo);
    residual_norm(f->x, f->xn, L->bo, L->attn_out_norm, L->attn_out_norm_b, n, E, hp->norm_eps);
    encoder_ffn(m, L, f, pool, n);
    residual_norm(f->x, f->xn, L->b_down, L->out_norm, L->out_norm_b, n, E, hp->norm_eps);
}

void gpe_encoder_hidden(const gpe_llama *m, gpe_fwd *f, gpe_pool *pool, const int32_t *tokens,
                        const int *pos, const int *seq, int n, float *hidden)
{
    embed_inputs(m, f, tokens, pos, n);
    for (int l = 0; l < m->hp.n_layer; l++)
        encoder_layer(m, l, f, pool, pos, seq, n);
    memcpy(hidden, f->x, (size_t)n * (size_t)m->hp.n_embd * sizeof *hidden);
}
