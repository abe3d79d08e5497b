/* Unit tests for src/engine/sampler.c (included, to reach the static
 * penalty and selection helpers): greedy, top-k/top-p/min-p candidate sets,
 * penalties arithmetic, seeded reproducibility, distribution sanity, and
 * the streaming stop-string matcher. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/sampler.c"

/* ------------------------------------------------------------ helpers */

static gpe_sampler *mk(float temp, int top_k, float top_p, float min_p, uint64_t seed)
{
    gpe_sampler_params p = gpe_sampler_default_params();
    p.temperature = temp;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.seed = seed;
    gpe_sampler *s = gpe_sampler_init(&p);
    assert_non_null(s);
    return s;
}

/* Draw `draws` tokens (fresh seeds by reset with a moving seed) and return a
 * bitmask of the ids seen (n <= 64). Every draw is checked to be in range. */
static uint64_t seen_set(gpe_sampler *s, const float *l, int n, int draws)
{
    uint64_t mask = 0;
    for (int i = 0; i < draws; i++) {
        int32_t t = gpe_sampler_sample(s, l, n);
        assert_true(t >= 0 && t < n);
        mask |= 1ULL << t;
    }
    return mask;
}

/* probabilities 0.5, 0.3, 0.15, 0.05 at temperature 1 */
static float P4[4];
static void init_p4(void)
{
    P4[0] = logf(0.5f);
    P4[1] = logf(0.3f);
    P4[2] = logf(0.15f);
    P4[3] = logf(0.05f);
}

/* ------------------------------------------------------------ sampler */

static void test_greedy_ties(void **state)
{
    (void)state;
    gpe_sampler *s = mk(0, 0, 1, 0, 1);
    const float a[] = {1, 3, 3, 2};
    assert_int_equal(gpe_sampler_sample(s, a, 4), 1);
    const float b[] = {7, 7, 7};
    assert_int_equal(gpe_sampler_sample(s, b, 3), 0);
    const float c[] = {-INFINITY, -5, NAN, -5, -1};
    assert_int_equal(gpe_sampler_sample(s, c, 5), 4);
    const float d[] = {-INFINITY, -INFINITY};
    assert_int_equal(gpe_sampler_sample(s, d, 2), 0);
    /* top-k etc. do not change greedy */
    gpe_sampler_free(s);
    s = mk(0, 1, 0.1f, 0.9f, 1);
    assert_int_equal(gpe_sampler_sample(s, a, 4), 1);
    /* bad arguments */
    assert_int_equal(gpe_sampler_sample(s, a, 0), -1);
    assert_int_equal(gpe_sampler_sample(s, NULL, 4), -1);
    assert_int_equal(gpe_sampler_sample(NULL, a, 4), -1);
    gpe_sampler_free(s);
    /* zero-initialised params, as in engine.h's example: greedy, all off */
    s = gpe_sampler_init(&(gpe_sampler_params){.temperature = 0});
    assert_int_equal(gpe_sampler_sample(s, a, 4), 1);
    gpe_sampler_accept(s, 1);
    assert_int_equal(gpe_sampler_sample(s, a, 4), 1);
    gpe_sampler_free(s);
}

static void test_top_k_set(void **state)
{
    (void)state;
    const float l[] = {5, 4, 3, 2, 1, 0, -1, -2, -3, -4};
    /* high temperature flattens what is left, so excluded ids would show */
    gpe_sampler *s = mk(50, 3, 1, 0, 7);
    assert_int_equal(seen_set(s, l, 10, 3000), 0x7);
    gpe_sampler_free(s);
    /* ties at the boundary: lower ids win */
    const float t[] = {1, 2, 2, 2, 0};
    s = mk(50, 2, 1, 0, 7);
    assert_int_equal(seen_set(s, t, 5, 2000), (1 << 1) | (1 << 2));
    gpe_sampler_free(s);
    /* k = 1 is greedy */
    s = mk(1, 1, 1, 0, 7);
    assert_int_equal(seen_set(s, l, 10, 200), 0x1);
    gpe_sampler_free(s);
    /* k >= n: off */
    s = mk(50, 10, 1, 0, 7);
    assert_int_equal(seen_set(s, l, 10, 5000), 0x3FF);
    gpe_sampler_free(s);
}

static void test_select_top_exact(void **state)
{
    (void)state;
    enum { N = 1000 };
    float w[N];
    for (int i = 0; i < N; i++)
        w[i] = (float)((i * 7919) % 101);       /* many ties */
    cand out[50];
    select_top(w, N, 50, out);
    /* best first, ties by id, and nothing better left out */
    for (int i = 1; i < 50; i++)
        assert_true(better(out[i - 1], out[i]));
    for (int i = 0; i < N; i++) {
        bool in = false;
        for (int j = 0; j < 50; j++)
            in |= out[j].id == i;
        if (!in)
            assert_true(better(out[49], (cand){w[i], i, 0}));
    }
}

static void test_top_p_set(void **state)
{
    (void)state;
    init_p4();
    gpe_sampler *s = mk(1, 0, 0.4f, 0, 3);
    assert_int_equal(seen_set(s, P4, 4, 500), 0x1);
    gpe_sampler_free(s);
    s = mk(1, 0, 0.75f, 0, 3);
    assert_int_equal(seen_set(s, P4, 4, 2000), 0x3);
    gpe_sampler_free(s);
    s = mk(1, 0, 0.85f, 0, 3);
    assert_int_equal(seen_set(s, P4, 4, 3000), 0x7);
    gpe_sampler_free(s);
    /* with top-k first: renormalised over the top 3 (0.5/0.95 = .526...),
     * p = 0.5 keeps one token, p = 0.6 two */
    s = mk(1, 3, 0.5f, 0, 3);
    assert_int_equal(seen_set(s, P4, 4, 500), 0x1);
    gpe_sampler_free(s);
    s = mk(1, 3, 0.6f, 0, 3);
    assert_int_equal(seen_set(s, P4, 4, 2000), 0x3);
    gpe_sampler_free(s);
    /* temperature before top-p: T = 3 flattens 0.5/0.3/0.15/0.05 to about
     * .336/.283/.225/.156, so p = 0.65 now needs three tokens */
    s = mk(3, 0, 0.65f, 0, 3);
    assert_int_equal(seen_set(s, P4, 4, 3000), 0x7);
    gpe_sampler_free(s);
}

/* Large vocabulary without top-k: the growing-prefix nucleus search. */
static void test_top_p_large_vocab(void **state)
{
    (void)state;
    enum { N = 150000 };
    float *l = malloc(N * sizeof *l);
    assert_non_null(l);
    for (int i = 0; i < N; i++)
        l[i] = i < 300 ? 0.0f : -30.0f;
    /* 300 equal tokens: p = 0.49 needs ceil(0.49 * 300.0...) = 148 of them,
     * ids 0..147 (ties by id) */
    gpe_sampler *s = mk(1, 0, 0.49f, 0, 11);
    int maxid = -1, distinct = 0;
    bool hit[300] = {0};
    for (int i = 0; i < 400; i++) {
        int32_t t = gpe_sampler_sample(s, l, N);
        assert_true(t >= 0 && t < 148);
        if (!hit[t]) {
            hit[t] = true;
            distinct++;
        }
        if (t > maxid)
            maxid = t;
    }
    assert_true(distinct > 80);   /* ~138 expected */
    gpe_sampler_free(s);
    /* top-k on the same vocabulary: random logits, result is in the top 40 */
    uint64_t x = 42;
    for (int i = 0; i < N; i++)
        l[i] = (float)(splitmix64(&x) >> 40) / (float)(1 << 24) * 20.0f;
    cand ref[40];
    select_top(l, N, 40, ref);
    s = mk(0.8f, 40, 0.95f, 0.05f, 5);
    for (int i = 0; i < 50; i++) {
        int32_t t = gpe_sampler_sample(s, l, N);
        bool in = false;
        for (int j = 0; j < 40; j++)
            in |= ref[j].id == t;
        assert_true(in);
    }
    gpe_sampler_free(s);
    free(l);
}

static void test_min_p_set(void **state)
{
    (void)state;
    init_p4();
    gpe_sampler *s = mk(1, 0, 1, 0.25f, 3);   /* >= 0.125 */
    assert_int_equal(seen_set(s, P4, 4, 3000), 0x7);
    gpe_sampler_free(s);
    s = mk(1, 0, 1, 0.5f, 3);                 /* >= 0.25 */
    assert_int_equal(seen_set(s, P4, 4, 2000), 0x3);
    gpe_sampler_free(s);
    s = mk(1, 0, 1, 0.9f, 3);
    assert_int_equal(seen_set(s, P4, 4, 500), 0x1);
    gpe_sampler_free(s);
    /* min-p on the tempered distribution: T = 2 gives relative probs
     * 1, .77, .55, .32, so min_p = 0.5 keeps three */
    s = mk(2, 0, 1, 0.5f, 3);
    assert_int_equal(seen_set(s, P4, 4, 3000), 0x7);
    gpe_sampler_free(s);
    /* sorted path (with top-k) gives the same set */
    s = mk(2, 4 - 1, 1, 0.5f, 3);
    assert_int_equal(seen_set(s, P4, 4, 3000), 0x7);
    gpe_sampler_free(s);
    s = mk(1, 3, 1, 0.5f, 3);
    assert_int_equal(seen_set(s, P4, 4, 2000), 0x3);
    gpe_sampler_free(s);
}

static void test_penalties_arithmetic(void **state)
{
    (void)state;
    gpe_sampler_params p = gpe_sampler_default_params();
    p.repeat_penalty = 2.0f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    p.repeat_last_n = 64;
    gpe_sampler *s = gpe_sampler_init(&p);
    assert_int_equal(ensure_cap(s, 5), 0);
    const int32_t hist[] = {0, 1, 0, 2, 99, -3};   /* out-of-range ids ignored */
    for (int i = 0; i < 6; i++)
        gpe_sampler_accept(s, hist[i]);
    float w[5] = {2, -2, 1, 0.5f, 3};
    apply_penalties(s, w, 5);
    /* 0: count 2, 2/2 - (2*.5 + .25) ; 1: count 1, -2*2 - .75 ; 2: 1/2 - .75 */
    assert_float_equal(w[0], -0.25f, 1e-6);
    assert_float_equal(w[1], -4.75f, 1e-6);
    assert_float_equal(w[2], -0.25f, 1e-6);
    assert_float_equal(w[3], 0.5f, 0);
    assert_float_equal(w[4], 3.0f, 0);
    for (int i = 0; i < 5; i++)
        assert_int_equal(s->count[i], 0);     /* scratch restored */
    gpe_sampler_free(s);

    /* window: only the last 3 accepted tokens count */
    p.repeat_last_n = 3;
    s = gpe_sampler_init(&p);
    assert_int_equal(ensure_cap(s, 5), 0);
    const int32_t h2[] = {0, 0, 0, 1, 0, 2};
    for (int i = 0; i < 6; i++)
        gpe_sampler_accept(s, h2[i]);
    float v[5] = {2, -2, 1, 0.5f, 3};
    apply_penalties(s, v, 5);
    assert_float_equal(v[0], 1.0f - 0.75f, 1e-6);    /* once in {1,0,2} */
    assert_float_equal(v[1], -4.0f - 0.75f, 1e-6);
    assert_float_equal(v[2], 0.5f - 0.75f, 1e-6);
    /* many accepts keep the window right (trim path) */
    for (int i = 0; i < 1000; i++)
        gpe_sampler_accept(s, 4);
    float u[5] = {2, -2, 1, 0.5f, 3};
    apply_penalties(s, u, 5);
    assert_float_equal(u[0], 2.0f, 0);
    assert_float_equal(u[4], 1.5f - (3 * 0.5f + 0.25f), 1e-6);
    /* reset forgets the history */
    gpe_sampler_reset(s);
    float r[5] = {2, -2, 1, 0.5f, 3};
    apply_penalties(s, r, 5);
    assert_float_equal(r[4], 3.0f, 0);
    gpe_sampler_free(s);

    /* end to end through greedy: 5/1.1 < 4.9 */
    p = (gpe_sampler_params){.temperature = 0, .repeat_penalty = 1.1f, .repeat_last_n = 64};
    s = gpe_sampler_init(&p);
    const float l[] = {5, 4.9f};
    assert_int_equal(gpe_sampler_sample(s, l, 2), 0);
    gpe_sampler_accept(s, 0);
    assert_int_equal(gpe_sampler_sample(s, l, 2), 1);
    gpe_sampler_free(s);
    /* negative logit multiplied: -1 * 3 < -2 */
    p = (gpe_sampler_params){.temperature = 0, .repeat_penalty = 3, .repeat_last_n = 64};
    s = gpe_sampler_init(&p);
    const float m[] = {-1, -2};
    gpe_sampler_accept(s, 0);
    assert_int_equal(gpe_sampler_sample(s, m, 2), 1);
    gpe_sampler_free(s);
}

static void run_seq(uint64_t seed, int32_t *out, int n)
{
    enum { V = 1000 };
    static float l[V];
    gpe_sampler_params p = gpe_sampler_default_params();
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1;
    p.min_p = 0;
    p.repeat_penalty = 1.1f;
    p.seed = seed;
    gpe_sampler *s = gpe_sampler_init(&p);
    assert_non_null(s);
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < V; j++)
            l[j] = (float)((j * 31 + i * 17) % 13) * 0.1f;  /* a logits sequence */
        out[i] = gpe_sampler_sample(s, l, V);
        gpe_sampler_accept(s, out[i]);
    }
    /* reset: the same seed starts over */
    gpe_sampler_reset(s);
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < V; j++)
            l[j] = (float)((j * 31 + i * 17) % 13) * 0.1f;
        int32_t t = gpe_sampler_sample(s, l, V);
        assert_int_equal(t, out[i]);
        gpe_sampler_accept(s, t);
    }
    gpe_sampler_free(s);
}

static void test_seed_reproducible(void **state)
{
    (void)state;
    int32_t a[100], b[100], c[100];
    run_seq(1234, a, 100);
    run_seq(1234, b, 100);
    run_seq(1235, c, 100);
    assert_memory_equal(a, b, sizeof a);
    int same = 0;
    for (int i = 0; i < 100; i++)
        same += a[i] == c[i];
    assert_true(same < 50);
}

static void test_distribution(void **state)
{
    (void)state;
    init_p4();
    const double want[4] = {0.5, 0.3, 0.15, 0.05};
    /* unsorted path (no top-k) and sorted path (top-k = 4 of 5) */
    float l5[5] = {P4[0], P4[1], P4[2], P4[3], -INFINITY};
    for (int pass = 0; pass < 2; pass++) {
        gpe_sampler *s = mk(1, pass ? 4 : 0, 1, 0, 99);
        int cnt[5] = {0};
        enum { D = 20000 };
        for (int i = 0; i < D; i++)
            cnt[gpe_sampler_sample(s, l5, 5)]++;
        for (int k = 0; k < 4; k++)
            assert_true(fabs((double)cnt[k] / D - want[k]) < 0.03);
        assert_int_equal(cnt[4], 0);
        gpe_sampler_free(s);
    }
}

/* ------------------------------------------------------------ stop */

struct acc {
    char text[512];
    size_t len;
};

static bool feed(gpe_stop *st, struct acc *a, const char *piece, size_t n)
{
    const char *e;
    size_t el;
    bool m = gpe_stop_feed(st, piece, n, &e, &el);
    assert_true(a->len + el < sizeof a->text);
    memcpy(a->text + a->len, e, el);
    a->len += el;
    a->text[a->len] = 0;
    return m;
}

static void flush(gpe_stop *st, struct acc *a)
{
    const char *e;
    size_t el;
    gpe_stop_flush(st, &e, &el);
    memcpy(a->text + a->len, e, el);
    a->len += el;
    a->text[a->len] = 0;
}

static bool feed_s(gpe_stop *st, struct acc *a, const char *piece)
{
    return feed(st, a, piece, strlen(piece));
}

static void test_stop_basic(void **state)
{
    (void)state;
    const char *stops[] = {"###"};
    gpe_stop *st = gpe_stop_init(stops, 1);
    struct acc a = {0};
    assert_false(feed_s(st, &a, "Hello #"));
    assert_string_equal(a.text, "Hello ");
    assert_false(feed_s(st, &a, "#"));
    assert_string_equal(a.text, "Hello ");
    assert_true(feed_s(st, &a, "# world"));
    assert_string_equal(a.text, "Hello ");
    /* after a match: nothing more, still matched, flush gives nothing */
    assert_true(feed_s(st, &a, "more"));
    flush(st, &a);
    assert_string_equal(a.text, "Hello ");
    gpe_stop_free(st);
}

static void test_stop_false_start(void **state)
{
    (void)state;
    const char *stops[] = {"###"};
    gpe_stop *st = gpe_stop_init(stops, 1);
    struct acc a = {0};
    assert_false(feed_s(st, &a, "ab#"));
    assert_string_equal(a.text, "ab");
    assert_false(feed_s(st, &a, "#x"));
    assert_string_equal(a.text, "ab##x");
    assert_false(feed_s(st, &a, "##"));
    flush(st, &a);
    assert_string_equal(a.text, "ab##x##");
    gpe_stop_free(st);
}

static void test_stop_multi_earliest(void **state)
{
    (void)state;
    const char *stops[] = {"END", "", NULL, "STOP"};
    gpe_stop *st = gpe_stop_init(stops, 4);
    struct acc a = {0};
    assert_true(feed_s(st, &a, "aSTOPbEND"));
    assert_string_equal(a.text, "a");
    gpe_stop_free(st);

    st = gpe_stop_init(stops, 4);
    struct acc b = {0};
    assert_false(feed_s(st, &b, "xxEN"));
    assert_string_equal(b.text, "xx");
    assert_false(feed_s(st, &b, "S"));      /* "ENS": "S" could start STOP */
    assert_string_equal(b.text, "xxEN");
    assert_false(feed_s(st, &b, "ST"));     /* "SST": "ST" could start STOP */
    assert_string_equal(b.text, "xxENS");
    assert_true(feed_s(st, &b, "OP tail"));
    assert_string_equal(b.text, "xxENS");
    gpe_stop_free(st);
}

static void test_stop_overlap_char_by_char(void **state)
{
    (void)state;
    const char *stops[] = {"abcd", "<|im_end|>"};
    gpe_stop *st = gpe_stop_init(stops, 2);
    struct acc a = {0};
    const char *text = "ababcd";
    bool m = false;
    for (size_t i = 0; text[i] && !m; i++)
        m = feed(st, &a, text + i, 1);
    assert_true(m);
    assert_string_equal(a.text, "ab");
    gpe_stop_free(st);

    st = gpe_stop_init(stops, 2);
    struct acc b = {0};
    text = "Hi there<|im_end|><|im_start|>";
    m = false;
    size_t i;
    for (i = 0; text[i] && !m; i++)
        m = feed(st, &b, text + i, 1);
    assert_true(m);
    assert_int_equal(i, strlen("Hi there<|im_end|>"));
    assert_string_equal(b.text, "Hi there");
    gpe_stop_free(st);
}

static void test_stop_utf8(void **state)
{
    (void)state;
    gpe_stop *st = gpe_stop_init(NULL, 0);      /* no stops: pass-through */
    struct acc a = {0};
    const char *e_acute = "\xc3\xa9";
    assert_false(feed(st, &a, e_acute, 1));
    assert_int_equal(a.len, 0);                  /* half a character held */
    assert_false(feed(st, &a, e_acute + 1, 1));
    assert_string_equal(a.text, "\xc3\xa9");
    const char *emoji = "\xf0\x9f\x98\x80";      /* U+1F600 */
    for (int i = 0; i < 3; i++) {
        assert_false(feed(st, &a, emoji + i, 1));
        assert_string_equal(a.text, "\xc3\xa9");
    }
    assert_false(feed(st, &a, emoji + 3, 1));
    assert_string_equal(a.text, "\xc3\xa9\xf0\x9f\x98\x80");
    /* flush gives out an incomplete tail as it is */
    assert_false(feed(st, &a, "x\xe2\x82", 3));
    assert_string_equal(a.text, "\xc3\xa9\xf0\x9f\x98\x80x");
    flush(st, &a);
    assert_string_equal(a.text, "\xc3\xa9\xf0\x9f\x98\x80x\xe2\x82");
    gpe_stop_free(st);

    /* a UTF-8 stop string arriving byte by byte */
    const char *stops[] = {"\xc3\xbc" "ber"};    /* "über" */
    st = gpe_stop_init(stops, 1);
    struct acc b = {0};
    const char *t = "gr\xc3\xbc\xc3\xbc" "ber";
    bool m = false;
    for (size_t i = 0; t[i] && !m; i++)
        m = feed(st, &b, t + i, 1);
    assert_true(m);
    assert_string_equal(b.text, "gr\xc3\xbc");
    gpe_stop_free(st);
}

static void test_stop_whole_piece_and_flush(void **state)
{
    (void)state;
    const char *stops[] = {"<|im_end|>", "\n\nUser:"};
    gpe_stop *st = gpe_stop_init(stops, 2);
    struct acc a = {0};
    assert_false(feed_s(st, &a, "The answer is 4.\n"));
    assert_string_equal(a.text, "The answer is 4.");
    assert_true(feed_s(st, &a, "\nUser: and"));
    assert_string_equal(a.text, "The answer is 4.");
    gpe_stop_free(st);

    st = gpe_stop_init(stops, 2);
    struct acc b = {0};
    assert_false(feed_s(st, &b, "abc<|im_"));
    assert_string_equal(b.text, "abc");
    flush(st, &b);
    assert_string_equal(b.text, "abc<|im_");
    gpe_stop_free(st);

    /* NULL matcher passes through; NULL piece is empty */
    struct acc c = {0};
    assert_false(feed_s(NULL, &c, "raw"));
    assert_string_equal(c.text, "raw");
    st = gpe_stop_init(stops, 2);
    assert_false(feed(st, &c, NULL, 5));
    gpe_stop_free(st);
    gpe_stop_free(NULL);
}

/* ------------------------------------------------ resume (failover) */

#define RV 50        /* vocabulary of the synthetic model */
#define RSTEPS 60    /* tokens generated per run */

/* Logits of a synthetic model that depend on the step and the last token
 * (so penalties and history matter). Every 5th step masks everything out:
 * the sampler's degenerate path must still take its one draw. */
static void synth_logits(int step, int32_t last, float *l)
{
    for (int i = 0; i < RV; i++)
        l[i] = step % 5 == 4 ? -INFINITY
                             : 3.0f * sinf((float)i * 1.3f + (float)step * 0.7f
                                           + (float)last * 0.11f);
}

static const int32_t RPROMPT[] = {3, 9, 9, 17, 42, 3};

/* Generate from step `from` to RSTEPS with s into out[from..]; out[0..from)
 * already holds what was generated before. */
static void synth_run(gpe_sampler *s, int32_t *out, int from)
{
    float l[RV];
    for (int k = from; k < RSTEPS; k++) {
        int32_t last = k ? out[k - 1] : RPROMPT[5];
        synth_logits(k, last, l);
        out[k] = gpe_sampler_sample(s, l, RV);
        assert_true(out[k] >= 0 && out[k] < RV);
        gpe_sampler_accept(s, out[k]);
    }
}

static void check_resume(gpe_sampler_params p)
{
    int32_t ref[RSTEPS], got[RSTEPS];
    gpe_sampler *s = gpe_sampler_init(&p);
    assert_non_null(s);
    for (size_t i = 0; i < sizeof RPROMPT / sizeof RPROMPT[0]; i++)
        gpe_sampler_accept(s, RPROMPT[i]);
    synth_run(s, ref, 0);
    gpe_sampler_free(s);
    static const int cuts[] = {0, 1, 4, 5, 7, 30, RSTEPS - 1};
    for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
        int n = cuts[c];
        /* A fresh sampler given what the first had: prompt + n generated
         * ids accepted, generator advanced by n. */
        s = gpe_sampler_init(&p);
        for (size_t i = 0; i < sizeof RPROMPT / sizeof RPROMPT[0]; i++)
            gpe_sampler_accept(s, RPROMPT[i]);
        for (int k = 0; k < n; k++) {
            got[k] = ref[k];
            gpe_sampler_accept(s, ref[k]);
        }
        gpe_sampler_advance(s, (uint64_t)n);
        synth_run(s, got, n);
        gpe_sampler_free(s);
        assert_memory_equal(got, ref, sizeof ref);
    }
}

static void test_resume_greedy_penalties(void **state)
{
    (void)state;
    gpe_sampler_params p = {0};
    p.repeat_penalty = 1.3f;
    p.repeat_last_n = 8;
    p.frequency_penalty = 0.4f;
    p.presence_penalty = 0.2f;
    check_resume(p);
}

static void test_resume_seeded(void **state)
{
    (void)state;
    gpe_sampler_params p = gpe_sampler_default_params();
    p.seed = 1234;
    p.temperature = 1.1f;
    p.top_k = 20;
    p.top_p = 0.9f;
    p.min_p = 0.02f;
    p.repeat_penalty = 1.2f;
    p.repeat_last_n = 16;
    p.frequency_penalty = 0.3f;
    p.presence_penalty = 0.1f;
    check_resume(p);
    /* whole-vocabulary paths (no top-k), every accepted token penalised */
    p.top_k = 0;
    p.repeat_last_n = -1;
    p.seed = 99;
    check_resume(p);
    /* temperature only */
    p = (gpe_sampler_params){.temperature = 0.7f, .seed = 7};
    check_resume(p);
}

/* Every sample call takes one draw, greedy and masked-out ones included. */
static void test_one_draw_per_sample(void **state)
{
    (void)state;
    float l[RV];
    gpe_sampler_params p = {.temperature = 0.9f, .top_k = 5, .seed = 5};
    gpe_sampler *a = gpe_sampler_init(&p), *b = gpe_sampler_init(&p);
    synth_logits(4, 0, l);              /* everything masked */
    (void)gpe_sampler_sample(a, l, RV);
    p.temperature = 0;
    gpe_sampler *g = gpe_sampler_init(&p);
    (void)gpe_sampler_sample(g, l, RV);
    gpe_sampler_advance(b, 1);
    assert_memory_equal(a->rng, b->rng, sizeof a->rng);
    assert_memory_equal(g->rng, b->rng, sizeof g->rng);
    gpe_sampler_free(a);
    gpe_sampler_free(b);
    gpe_sampler_free(g);
}

/* A matcher primed with what another had fed but not emitted continues
 * exactly as that one would: same total output, a stop string straddling
 * the junction still found and never emitted. */
static void test_stop_prime_resume(void **state)
{
    (void)state;
    static const char *const stops[] = {"THE END", "\xe2\x82\xac!"};
    static const char *const pieces[] = {"Once", " upon", " THE", " E", "very", " TH",
                                         "E E", "ND", " more"};
    size_t np = sizeof pieces / sizeof pieces[0];
    char ref[256] = "";
    gpe_stop *st = gpe_stop_init(stops, 2);
    bool ref_stop = false;
    for (size_t i = 0; i < np && !ref_stop; i++) {
        const char *e;
        size_t n;
        ref_stop = gpe_stop_feed(st, pieces[i], strlen(pieces[i]), &e, &n);
        strncat(ref, e, n);
    }
    assert_true(ref_stop);
    assert_string_equal(ref, "Once upon THE Every ");
    gpe_stop_free(st);
    for (size_t cut = 1; cut < np; cut++) {
        /* first matcher: pieces [0, cut) */
        char fed[256] = "", out[256] = "";
        gpe_stop *a = gpe_stop_init(stops, 2);
        bool stopped = false;
        for (size_t i = 0; i < cut && !stopped; i++) {
            const char *e;
            size_t n;
            strcat(fed, pieces[i]);
            stopped = gpe_stop_feed(a, pieces[i], strlen(pieces[i]), &e, &n);
            strncat(out, e, n);
        }
        gpe_stop_free(a);
        if (stopped)
            continue;
        /* second matcher: primed with fed minus emitted, then the rest */
        gpe_stop *b = gpe_stop_init(stops, 2);
        size_t sent = strlen(out);
        assert_int_equal(strncmp(fed, out, sent), 0);
        assert_int_equal(gpe_stop_prime(b, fed + sent, strlen(fed) - sent), 0);
        for (size_t i = cut; i < np && !stopped; i++) {
            const char *e;
            size_t n;
            stopped = gpe_stop_feed(b, pieces[i], strlen(pieces[i]), &e, &n);
            strncat(out, e, n);
        }
        gpe_stop_free(b);
        assert_true(stopped);
        assert_string_equal(out, ref);
    }
    assert_int_equal(gpe_stop_prime(NULL, "x", 1), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_ties),
        cmocka_unit_test(test_top_k_set),
        cmocka_unit_test(test_select_top_exact),
        cmocka_unit_test(test_top_p_set),
        cmocka_unit_test(test_top_p_large_vocab),
        cmocka_unit_test(test_min_p_set),
        cmocka_unit_test(test_penalties_arithmetic),
        cmocka_unit_test(test_seed_reproducible),
        cmocka_unit_test(test_distribution),
        cmocka_unit_test(test_stop_basic),
        cmocka_unit_test(test_stop_false_start),
        cmocka_unit_test(test_stop_multi_earliest),
        cmocka_unit_test(test_stop_overlap_char_by_char),
        cmocka_unit_test(test_stop_utf8),
        cmocka_unit_test(test_stop_whole_piece_and_flush),
        cmocka_unit_test(test_resume_greedy_penalties),
        cmocka_unit_test(test_resume_seeded),
        cmocka_unit_test(test_one_draw_per_sample),
        cmocka_unit_test(test_stop_prime_resume),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
