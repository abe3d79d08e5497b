/*
 * attn: batched causal attention over the KV cache, against a
 * straightforward reference (double sums, one (token, head) at a time) on
 * random q, k, v: grouped and plain heads, head sizes that fill no whole
 * vector, sliding windows, soft-capping, F32 and F16 caches, several
 * sequences in one batch. Then the invariance the prefix cache relies on:
 * the same bits whatever the batch split, the thread count and the ISA.
 * Cache rows past a sequence's length hold NaN, so a key lane that should
 * be masked and is not poisons the result.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cmocka.h>

#include "engine/attn.h"
#include "engine/kv.h"
#include "engine/quant.h"
#include "engine/threadpool.h"

#define N_LAYER 2
#define LAYER 1
#define N_SEQ 3
#define N_CTX 90      /* not a whole number of K blocks */
#define MAX_TOK 64
#define N_THREADS 4

typedef struct cfg {
    int n_head, n_head_kv, hd;
    bool f16;
    int window;
    float softcap;
    float q_amp;      /* query magnitude: large values make peaked softmaxes */
} cfg;

/* The batch: sequence 0 a 37-token prompt from position 0, sequence 1 five
 * tokens after 20 cached positions, sequence 2 one token at 60 (decode),
 * interleaved so that runs of consecutive positions break in places. */
typedef struct batch {
    int n;
    int pos[MAX_TOK], seq[MAX_TOK];
    int len[N_SEQ];   /* positions each sequence holds after the batch */
} batch;

static void batch_make(batch *b)
{
    memset(b, 0, sizeof *b);
    int p0 = 0, p1 = 20;
    for (int i = 0; i < 37; i++) {
        b->seq[b->n] = 0;
        b->pos[b->n++] = p0++;
        if (i % 9 == 4 && p1 < 25) {
            b->seq[b->n] = 1;
            b->pos[b->n++] = p1++;
        }
        if (i == 30) {
            b->seq[b->n] = 2;
            b->pos[b->n++] = 60;
        }
    }
    b->len[0] = p0;
    b->len[1] = p1;
    b->len[2] = 61;
}

static uint32_t rng_state;
static float frand(void)   /* uniform in [-1, 1) */
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return (float)((rng_state >> 8) & 0xffffff) / 8388608.0f - 1.0f;
}

static float as_cached(const cfg *c, float x)
{
    return c->f16 ? gpe_fp16_to_fp32(gpe_fp32_to_fp16(x)) : x;
}

typedef struct world {
    cfg c;
    batch b;
    gpe_kv kv;
    float *kref, *vref;   /* [N_SEQ][N_CTX][kv_dim] as cached */
    float *q;             /* [MAX_TOK][n_head * hd] */
} world;

static void world_make(world *w, const cfg *c)
{
    memset(w, 0, sizeof *w);
    w->c = *c;
    batch_make(&w->b);
    const int kvd = c->n_head_kv * c->hd;
    assert_int_equal(gpe_kv_init(&w->kv, N_LAYER, N_SEQ, N_CTX, kvd, c->f16), 0);
    w->kref = calloc((size_t)N_SEQ * N_CTX * kvd, sizeof(float));
    w->vref = calloc((size_t)N_SEQ * N_CTX * kvd, sizeof(float));
    w->q = calloc((size_t)MAX_TOK * c->n_head * c->hd, sizeof(float));
    assert_non_null(w->kref);
    assert_non_null(w->vref);
    assert_non_null(w->q);
    rng_state = 12345u + (uint32_t)(c->hd * 7 + c->n_head);
    float *k = malloc((size_t)kvd * sizeof(float)), *v = malloc((size_t)kvd * sizeof(float));
    assert_non_null(k);
    assert_non_null(v);
    for (int s = 0; s < N_SEQ; s++)
        for (int p = 0; p < N_CTX; p++) {
            const bool held = p < w->b.len[s];
            for (int i = 0; i < kvd; i++) {
                k[i] = held ? 2.0f * frand() : NAN;
                v[i] = held ? frand() : NAN;
                w->kref[((size_t)s * N_CTX + p) * kvd + i] = as_cached(c, k[i]);
                w->vref[((size_t)s * N_CTX + p) * kvd + i] = as_cached(c, v[i]);
            }
            gpe_kv_put(&w->kv, LAYER, s, p, k, v);
        }
    free(k);
    free(v);
    for (int i = 0; i < w->b.n * c->n_head * c->hd; i++)
        w->q[i] = c->q_amp * frand();
}

static void world_free(world *w)
{
    gpe_kv_free(&w->kv);
    free(w->kref);
    free(w->vref);
    free(w->q);
}

/* Attention of batch tokens [t0, t0 + n) into out (rows of the whole batch). */
static void run(world *w, gpe_attn_ws *ws, gpe_pool *pool, int nth, int t0, int n, float *out)
{
    const cfg *c = &w->c;
    const size_t qd = (size_t)c->n_head * c->hd;
    const gpe_attn_args a = {
        .kv = &w->kv, .layer = LAYER, .q = w->q + t0 * qd, .out = out + t0 * qd,
        .pos = w->b.pos + t0, .seq = w->b.seq + t0, .n_tok = n,
        .n_head = c->n_head, .n_head_kv = c->n_head_kv, .head_dim = c->hd,
        .scale = 1.0f / sqrtf((float)c->hd), .softcap = c->softcap, .window = c->window,
    };
    gpe_attn_run(ws, pool, nth, &a);
}

static void reference(const world *w, int t, int h, float *out)
{
    const cfg *c = &w->c;
    const int kvd = c->n_head_kv * c->hd, g = h / (c->n_head / c->n_head_kv);
    const int s = w->b.seq[t], p = w->b.pos[t];
    const int lo = c->window > 0 && p - c->window + 1 > 0 ? p - c->window + 1 : 0;
    const float *q = w->q + ((size_t)t * c->n_head + h) * c->hd;
    double sc[N_CTX], mx = -INFINITY, sum = 0.0;
    for (int i = lo; i <= p; i++) {
        const float *k = w->kref + ((size_t)s * N_CTX + i) * kvd + (size_t)g * c->hd;
        double d = 0.0;
        for (int j = 0; j < c->hd; j++)
            d += (double)as_cached(c, q[j]) * k[j];
        d *= 1.0 / sqrt((double)c->hd);
        if (c->softcap > 0.0f)
            d = c->softcap * tanh(d / c->softcap);
        sc[i] = d;
        mx = d > mx ? d : mx;
    }
    for (int i = lo; i <= p; i++)
        sum += sc[i] = exp(sc[i] - mx);
    double acc[1024] = { 0 };
    for (int i = lo; i <= p; i++) {
        const double wi = as_cached(c, (float)(sc[i] / sum));
        const float *v = w->vref + ((size_t)s * N_CTX + i) * kvd + (size_t)g * c->hd;
        for (int j = 0; j < c->hd; j++)
            acc[j] += wi * v[j];
    }
    for (int j = 0; j < c->hd; j++)
        out[j] = (float)acc[j];
}

static void check_config(const cfg *c)
{
    world w;
    world_make(&w, c);
    const size_t qd = (size_t)c->n_head * c->hd, rows = (size_t)w.b.n * qd;
    gpe_pool *pool = gpe_pool_create(N_THREADS);
    assert_non_null(pool);
    gpe_attn_ws ws;
    assert_int_equal(gpe_attn_ws_init(&ws, MAX_TOK, N_CTX, c->hd, N_THREADS), 0);
    float *all = calloc(rows, sizeof(float)), *other = calloc(rows, sizeof(float));
    assert_non_null(all);
    assert_non_null(other);

    /* Against the reference. The F16 cache rounds each weight to F16 in
     * both, from slightly different values: allow a rounding step there. */
    run(&w, &ws, pool, N_THREADS, 0, w.b.n, all);
    const double tol = c->f16 ? 2e-3 : 2e-5;
    float ref[1024];
    for (int t = 0; t < w.b.n; t++)
        for (int h = 0; h < c->n_head; h++) {
            reference(&w, t, h, ref);
            const float *got = all + t * qd + (size_t)h * c->hd;
            for (int j = 0; j < c->hd; j++)
                if (!(fabs((double)got[j] - ref[j]) <= tol))
                    fail_msg("hd %d heads %d/%d f16 %d window %d cap %g: token %d head %d dim %d: "
                             "%.8g, reference %.8g",
                             c->hd, c->n_head, c->n_head_kv, c->f16, c->window, c->softcap, t, h, j,
                             got[j], ref[j]);
        }

    /* The same bits one token at a time, in runs of 7, on 1 and 3 workers
     * (fewer workers split the query heads of a KV head differently). */
    const int splits[] = { 1, 7 };
    for (size_t si = 0; si < sizeof splits / sizeof splits[0]; si++)
        for (int nth = 1; nth <= 3; nth += 2) {
            memset(other, 0xff, rows * sizeof(float));
            for (int t0 = 0; t0 < w.b.n; t0 += splits[si]) {
                const int n = w.b.n - t0 < splits[si] ? w.b.n - t0 : splits[si];
                run(&w, &ws, pool, nth, t0, n, other);
            }
            if (memcmp(all, other, rows * sizeof(float)) != 0)
                fail_msg("hd %d f16 %d: runs of %d on %d workers differ from one batch", c->hd,
                         c->f16, splits[si], nth);
        }

    /* The same bits on every ISA this CPU has. */
    const gpe_isa best = gpe_quant_best_isa();
    for (int isa = 0; isa <= (int)best; isa++) {
        assert_true(gpe_quant_set_isa((gpe_isa)isa));
        memset(other, 0xff, rows * sizeof(float));
        run(&w, &ws, pool, 2, 0, w.b.n, other);
        if (memcmp(all, other, rows * sizeof(float)) != 0)
            fail_msg("hd %d f16 %d: ISA %s differs from %s", c->hd, c->f16,
                     gpe_isa_name((gpe_isa)isa), gpe_isa_name(best));
    }
    assert_true(gpe_quant_set_isa(best));

    free(all);
    free(other);
    gpe_attn_ws_free(&ws);
    gpe_pool_destroy(pool);
    world_free(&w);
}

static void check_both_caches(cfg c)
{
    c.f16 = false;
    check_config(&c);
    c.f16 = true;
    check_config(&c);
}

/* TinyLlama's shape: 8 query heads per KV head, 64 dims. */
static void test_grouped(void **state)
{
    (void)state;
    check_both_caches((cfg){ .n_head = 16, .n_head_kv = 2, .hd = 64, .q_amp = 1.0f });
}

/* One query head per KV head, dims not a multiple of 16 (tails). */
static void test_plain_heads(void **state)
{
    (void)state;
    check_both_caches((cfg){ .n_head = 3, .n_head_kv = 3, .hd = 24, .q_amp = 1.0f });
}

/* Three query heads per KV head, 96 dims (phi3), 8-dim heads. */
static void test_odd_groups(void **state)
{
    (void)state;
    check_both_caches((cfg){ .n_head = 6, .n_head_kv = 2, .hd = 96, .q_amp = 1.0f });
    check_both_caches((cfg){ .n_head = 4, .n_head_kv = 2, .hd = 8, .q_amp = 1.0f });
}

/* Sliding windows shorter than a K block and than the prompt. */
static void test_window(void **state)
{
    (void)state;
    check_both_caches((cfg){ .n_head = 8, .n_head_kv = 2, .hd = 32, .window = 5, .q_amp = 1.0f });
    check_both_caches((cfg){ .n_head = 8, .n_head_kv = 2, .hd = 32, .window = 23, .q_amp = 1.0f });
}

/* gemma2's soft-cap, with scores large enough for the cap to bite. */
static void test_softcap(void **state)
{
    (void)state;
    check_both_caches((cfg){ .n_head = 4, .n_head_kv = 2, .hd = 64, .softcap = 5.0f, .q_amp = 8.0f });
}

/* Peaked softmaxes: most weights underflow (exp below -87 gives 0). */
static void test_peaked(void **state)
{
    (void)state;
    check_both_caches((cfg){ .n_head = 8, .n_head_kv = 1, .hd = 128, .q_amp = 60.0f });
}

/* Where gpe_kv_put puts K and V: K in transposed blocks of 16 positions. */
static void test_kv_layout(void **state)
{
    (void)state;
    for (int f16 = 0; f16 < 2; f16++) {
        gpe_kv kv;
        const int kvd = 5;
        assert_int_equal(gpe_kv_init(&kv, 2, 2, 20, kvd, f16), 0);
        float k[5], v[5];
        for (int p = 0; p < 20; p++) {
            for (int i = 0; i < kvd; i++) {
                k[i] = (float)(p * 10 + i);
                v[i] = -(float)(p * 10 + i);
            }
            gpe_kv_put(&kv, 1, 1, p, k, v);
        }
        for (int p = 0; p < 20; p++)
            for (int i = 0; i < kvd; i++) {
                const size_t at = (size_t)i * GPE_KV_KBLOCK + (size_t)(p % GPE_KV_KBLOCK);
                const void *kb = gpe_kv_kblock(&kv, 1, 1, p / GPE_KV_KBLOCK);
                const void *vr = gpe_kv_v(&kv, 1, 1, p);
                const float kg = f16 ? gpe_fp16_to_fp32(((const uint16_t *)kb)[at]) : ((const float *)kb)[at];
                const float vg = f16 ? gpe_fp16_to_fp32(((const uint16_t *)vr)[i]) : ((const float *)vr)[i];
                assert_true(kg == (float)(p * 10 + i));
                assert_true(vg == -(float)(p * 10 + i));
            }
        /* 20 positions take two whole K blocks; the last one ends K */
        const char *end = (const char *)gpe_kv_kblock(&kv, 1, 1, 1) +
                          (size_t)kvd * GPE_KV_KBLOCK * gpe_kv_esize(&kv);
        assert_ptr_equal(end, (const char *)kv.k + (size_t)2 * 2 * 32 * kvd * gpe_kv_esize(&kv));
        gpe_kv_free(&kv);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_layout),
        cmocka_unit_test(test_grouped),
        cmocka_unit_test(test_plain_heads),
        cmocka_unit_test(test_odd_groups),
        cmocka_unit_test(test_window),
        cmocka_unit_test(test_softcap),
        cmocka_unit_test(test_peaked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
