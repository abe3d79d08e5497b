/* attn: batched causal attention over the KV cache (see attn.h). */
#include "engine/attn.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/attn_impl.h"
#include "engine/quant.h"

#define ROWS_MAX 32   /* query rows (token x head) per unit */
#define K_CHUNK 4     /* K blocks converted / scored together (64 keys) */
#define V_CHUNK 64    /* V rows converted / summed together */

/* ====================================================== portable kernels */

static void c_f16_to_f32(const uint16_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = gpe_fp16_to_fp32(src[i]);
}

static void c_round_f16(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = gpe_fp16_to_fp32(gpe_fp32_to_fp16(x[i]));
}

static void c_qk(const float *q, int nr, int hd, const float *kt, size_t kbs, int nb, float scale,
                 float *s, size_t ss)
{
    for (int r = 0; r < nr; r++)
        for (int b = 0; b < nb; b++)
            for (int l = 0; l < GPE_ATTN_KB; l++) {
                float acc = 0.0f;
                for (int d = 0; d < hd; d++)
                    acc = fmaf(q[(size_t)r * hd + d], kt[b * kbs + (size_t)d * GPE_ATTN_KB + l], acc);
                s[r * ss + (size_t)b * GPE_ATTN_KB + l] = acc * scale;
            }
}

static void c_softmax(float *s, int lo, int hi, int n, bool f16)
{
    float mx = -INFINITY;
    for (int i = lo; i <= hi; i++)
        mx = s[i] > mx ? s[i] : mx;
    double lane[GPE_ATTN_KB] = { 0 };
    for (int i = lo; i <= hi; i++) {
        s[i] = gpe__attn_exp(s[i] - mx);
        lane[i % GPE_ATTN_KB] += (double)s[i];
    }
    const float inv = (float)(1.0 / gpe__attn_sum16(lane));
    for (int i = 0; i < n; i++) {
        if (i < lo || i > hi) {
            s[i] = 0.0f;
            continue;
        }
        s[i] *= inv;
        if (f16)
            s[i] = gpe_fp16_to_fp32(gpe_fp32_to_fp16(s[i]));
    }
}

static void c_pv(const float *w, size_t ws, int nr, const float *v, size_t vs, int nk, int hd,
                 float *const *out)
{
    for (int r = 0; r < nr; r++)
        for (int j = 0; j < nk; j++) {
            const float wj = w[r * ws + (size_t)j];
            for (int d = 0; d < hd; d++)
                out[r][d] = fmaf(wj, v[j * vs + (size_t)d], out[r][d]);
        }
}

static const gpe__attn_kern kern_c = { c_f16_to_f32, c_round_f16, c_qk, c_softmax, c_pv };

/* The kernel set of the ISA the quant module uses (GPUPOOL_ISA caps both). */
static const gpe__attn_kern *kernels(void)
{
    const gpe__attn_kern *k = gpe__attn_kern_x86(gpe_quant_isa());
    return k ? k : &kern_c;
}

/* ============================================================ workspace */

/* Scratch floats per worker: scores [ROWS_MAX][n_ctx rounded up to whole
 * blocks] (a unit's key span is block-aligned and ends before n_ctx),
 * query rows [ROWS_MAX][hd], converted K [K_CHUNK][hd][16] and V
 * [V_CHUNK][hd]. Each part starts on a 64-byte boundary. */
static size_t up16(size_t n) { return (n + 15) / 16 * 16; }

static size_t score_stride_max(int n_ctx)
{
    return up16((size_t)n_ctx);
}

int gpe_attn_ws_init(gpe_attn_ws *ws, int n_batch, int n_ctx, int head_dim, int n_threads)
{
    memset(ws, 0, sizeof *ws);
    if (n_batch <= 0 || n_ctx <= 0 || head_dim <= 0 || n_threads <= 0)
        return -1;
    const size_t hd = (size_t)head_dim;
    const size_t per = ROWS_MAX * score_stride_max(n_ctx) + up16(ROWS_MAX * hd) +
                       up16(K_CHUNK * GPE_ATTN_KB * hd) + up16(V_CHUNK * hd);
    if (per > SIZE_MAX / sizeof(float) / (size_t)n_threads)
        return -1;
    ws->scratch = aligned_alloc(64, per * (size_t)n_threads * sizeof(float));
    ws->tiles = malloc(((size_t)n_batch + 1) * sizeof(int));
    if (!ws->scratch || !ws->tiles) {
        gpe_attn_ws_free(ws);
        return -1;
    }
    ws->n_batch = n_batch;
    ws->n_ctx = n_ctx;
    ws->head_dim = head_dim;
    ws->n_threads = n_threads;
    ws->per_thread = per;
    return 0;
}

void gpe_attn_ws_free(gpe_attn_ws *ws)
{
    if (!ws)
        return;
    free(ws->scratch);
    free(ws->tiles);
    memset(ws, 0, sizeof *ws);
}

/* ================================================================ units */

typedef struct attn_job {
    const gpe_attn_args *a;
    const gpe__attn_kern *k;
    gpe_attn_ws *ws;
    int n_tiles;
    int heads_per_unit;   /* query heads of one KV head in a unit */
    int head_splits;      /* units per (tile, KV head) */
    int n_units;
    atomic_int next;      /* next unit to hand out */
} attn_job;

/* First key a query at position p sees. */
static int first_key(const gpe_attn_args *a, int p)
{
    return a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
}

/* Unit u: tokens tiles[ti] .. tiles[ti + 1] - 1 (one sequence, consecutive
 * positions), KV head g, query heads g * group + h0 .. + nh - 1. Rows are
 * (token, head) in token-major order. */
static void unit_run(const attn_job *j, int u, float *scr)
{
    const gpe_attn_args *a = j->a;
    const gpe__attn_kern *K = j->k;
    const gpe_kv *kv = a->kv;
    const int hd = a->head_dim, group = a->n_head / a->n_head_kv;
    const size_t qd = (size_t)a->n_head * (size_t)hd;
    const size_t kvd = (size_t)kv->kv_dim;

    /* latest tiles first: under causality they are the most expensive */
    const int per_tile = a->n_head_kv * j->head_splits;
    const int ti = j->n_tiles - 1 - u / per_tile;
    const int g = (u % per_tile) / j->head_splits;
    const int h0 = (u % j->head_splits) * j->heads_per_unit;
    const int nh = group - h0 < j->heads_per_unit ? group - h0 : j->heads_per_unit;
    const int t0 = j->ws->tiles[ti], nt = j->ws->tiles[ti + 1] - t0;
    const int nr = nt * nh, s = a->seq[t0];
    const int key_lo = first_key(a, a->pos[t0]), key_hi = a->pos[t0] + nt - 1;
    const int b0 = key_lo / GPE_ATTN_KB, b1 = key_hi / GPE_ATTN_KB;
    const size_t ss = (size_t)(b1 - b0 + 1) * GPE_ATTN_KB;   /* score row stride */

    float *S = scr;
    float *Q = S + ROWS_MAX * score_stride_max(j->ws->n_ctx);
    float *KT = Q + up16(ROWS_MAX * (size_t)hd);
    float *VC = KT + up16(K_CHUNK * GPE_ATTN_KB * (size_t)hd);
    float *outs[ROWS_MAX];

    for (int r = 0; r < nr; r++) {
        const int t = t0 + r / nh, h = g * group + h0 + r % nh;
        memcpy(Q + (size_t)r * hd, a->q + (size_t)t * qd + (size_t)h * hd, (size_t)hd * sizeof(float));
        outs[r] = a->out + (size_t)t * qd + (size_t)h * hd;
        memset(outs[r], 0, (size_t)hd * sizeof(float));
    }
    if (kv->f16)
        K->round_f16(Q, (size_t)nr * hd);

    /* Scores of every row against every key block of the tile's span; keys
     * outside a row's own range are computed and then masked. */
    const size_t kbs = kvd * GPE_ATTN_KB;   /* between a sequence's blocks */
    for (int cb = b0; cb <= b1; cb += K_CHUNK) {
        const int nb = b1 - cb + 1 < K_CHUNK ? b1 - cb + 1 : K_CHUNK;
        const char *blk = (const char *)gpe_kv_kblock(kv, a->layer, s, cb) +
                          (size_t)g * hd * GPE_ATTN_KB * gpe_kv_esize(kv);
        const float *kt = (const float *)blk;
        size_t stride = kbs;
        if (kv->f16) {
            for (int b = 0; b < nb; b++)
                K->f16_to_f32((const uint16_t *)blk + b * kbs, KT + (size_t)b * hd * GPE_ATTN_KB,
                              (size_t)hd * GPE_ATTN_KB);
            kt = KT;
            stride = (size_t)hd * GPE_ATTN_KB;
        }
        K->qk(Q, nr, hd, kt, stride, nb, a->scale, S + (size_t)(cb - b0) * GPE_ATTN_KB, ss);
    }

    const float cap = a->softcap, inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    for (int r = 0; r < nr; r++) {
        const int p = a->pos[t0 + r / nh];
        const int lo = first_key(a, p) - b0 * GPE_ATTN_KB, hi = p - b0 * GPE_ATTN_KB;
        float *sr = S + (size_t)r * ss;
        if (cap > 0.0f) /* gemma2 */
            for (int i = lo; i <= hi; i++)
                sr[i] = cap * tanhf(sr[i] * inv_cap);
        K->softmax(sr, lo, hi, (int)ss, kv->f16);
    }

    /* out += w v over the span; a row's weights outside its range are 0,
     * which leaves its sums exactly as they were. */
    for (int j0 = key_lo; j0 <= key_hi; j0 += V_CHUNK) {
        const int nk = key_hi - j0 + 1 < V_CHUNK ? key_hi - j0 + 1 : V_CHUNK;
        const char *row = (const char *)gpe_kv_v(kv, a->layer, s, j0) +
                          (size_t)g * hd * gpe_kv_esize(kv);
        const float *v = (const float *)row;
        size_t vs = kvd;
        if (kv->f16) {
            for (int i = 0; i < nk; i++)
                K->f16_to_f32((const uint16_t *)row + i * kvd, VC + (size_t)i * hd, (size_t)hd);
            v = VC;
            vs = (size_t)hd;
        }
        K->pv(S + (j0 - b0 * GPE_ATTN_KB), ss, nr, v, vs, nk, hd, outs);
    }
}

static void attn_fn(void *arg, int ith, int nth)
{
    (void)nth;
    attn_job *j = arg;
    float *scr = j->ws->scratch + (size_t)ith * j->ws->per_thread;
    for (;;) {
        const int u = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (u >= j->n_units)
            return;
        unit_run(j, u, scr);
    }
}

void gpe_attn_run(gpe_attn_ws *ws, gpe_pool *pool, int nth, const gpe_attn_args *a)
{
    const int group = a->n_head / a->n_head_kv;
    attn_job j = { .a = a, .k = kernels(), .ws = ws };
    if (nth > ws->n_threads)
        nth = ws->n_threads;
    j.heads_per_unit = group < ROWS_MAX ? group : ROWS_MAX;
    const int max_tok = ROWS_MAX / j.heads_per_unit;

    /* Runs of at most max_tok tokens of one sequence at consecutive
     * positions: they share their keys. */
    for (int t = 0; t < a->n_tok; t++) {
        const int t0 = j.n_tiles ? ws->tiles[j.n_tiles - 1] : -1;
        if (t0 < 0 || t - t0 >= max_tok || a->seq[t] != a->seq[t0] || a->pos[t] != a->pos[t0] + (t - t0))
            ws->tiles[j.n_tiles++] = t;
    }
    ws->tiles[j.n_tiles] = a->n_tok;

    /* Too few units to keep the workers busy (decoding one sequence): fewer
     * query heads per unit; each row's arithmetic stays the same. */
    for (;;) {
        j.head_splits = (group + j.heads_per_unit - 1) / j.heads_per_unit;
        j.n_units = j.n_tiles * a->n_head_kv * j.head_splits;
        if (j.n_units >= 2 * nth || j.heads_per_unit == 1)
            break;
        j.heads_per_unit = (j.heads_per_unit + 1) / 2;
    }
    atomic_init(&j.next, 0);
    gpe_pool_run_n(pool, nth, attn_fn, &j);
}
