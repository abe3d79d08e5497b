/*
 * sampler: choosing the next token from logits (gpe_sampler_*), and the
 * streaming stop-string matcher (gpe_stop_*). Interface in engine.h.
 *
 * Sampling pipeline, in this fixed order:
 *
 *   1. penalties   over the last repeat_last_n accepted tokens (all three
 *                  share that window, as in llama.cpp):
 *                    repetition (llama.cpp): logit > 0 ? logit / r : logit * r
 *                    frequency/presence (OpenAI): logit -= c * f + (c > 0) * p
 *                  where c is the token's count in the window
 *   2. greedy      temperature < 1e-5: argmax, lowest id on ties; stop here
 *   3. top-k       keep the k largest (ties broken by lower id)
 *   4. temperature divide by T
 *   5. top-p       keep the smallest prefix of the sorted candidates whose
 *                  probability (renormalised over what is left) reaches p
 *   6. min-p       keep candidates with prob >= min_p * max prob
 *   7. draw        one uniform draw from a seeded xoshiro256** generator
 *
 * Every call of gpe_sampler_sample that returns a token consumes exactly
 * one draw, taken first, whatever path it follows (greedy, or every
 * candidate masked out, included). So the generator's position is the
 * number of tokens sampled, and gpe_sampler_advance can put a new sampler
 * where an old one was (token-exact continuation after a failover).
 *
 * Everything runs on the calling thread, in a fixed order of float
 * operations, so a given seed and logits sequence always give the same
 * tokens whatever the thread count of the context.
 *
 * Cost for a 150k vocabulary: one copy of the logits, one O(n) pass with a
 * k-entry min-heap for top-k (no full sort), exp() over the survivors only
 * (a vectorisable polynomial, see exp_neg). Without top-k, top-p finds its
 * nucleus with a histogram of log-probabilities and sorts only the one
 * bucket where the cumulative mass crosses p. All buffers belong to the
 * sampler; the scratch grows only when n_vocab does, the accepted tokens'
 * history (kept only while a penalty is on) with the text. Measured with
 * bench_sampler.
 *
 * Parameters out of range mean "off": top_k <= 0 or >= n_vocab, top_p <= 0
 * or >= 1, min_p <= 0 or > 1, repeat_penalty <= 0 or == 1, repeat_last_n ==
 * 0 (no penalties at all; -1 = every accepted token). A zero-initialised
 * gpe_sampler_params is therefore plain greedy decoding.
 */
#include <gpupool/engine.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ================================================================ rng */

/* splitmix64 (Steele, Lea, Flood 2014) expands the 64-bit seed into the
 * 256-bit xoshiro256** state (Blackman, Vigna 2018); constants from the
 * papers' public-domain reference descriptions. */
static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t xoshiro_next(uint64_t s[4])
{
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* Uniform double in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t s[4])
{
    return (double)(xoshiro_next(s) >> 11) * 0x1.0p-53;
}

/* ============================================================ sampler */

typedef struct cand {
    float logit;       /* after penalties (and temperature, once applied) */
    int32_t id;
    float p;           /* exp(logit - max), unnormalised */
} cand;

/* top-p without top-k: histogram of (max - logit) in TOPP_BUCKETS buckets of
 * TOPP_RANGE / TOPP_BUCKETS nats each; the last one holds the far tail. */
#define TOPP_BUCKETS 1024
#define TOPP_RANGE 32.0f

struct gpe_sampler {
    gpe_sampler_params p;
    uint64_t rng[4];

    /* Accepted tokens, oldest first, kept only when a penalty reads them
     * (penalties_on). Trimmed to the window when it grows to twice the
     * window (repeat_last_n > 0); unbounded for -1. */
    int32_t *hist;
    size_t hist_len, hist_cap;
    /* A token could not be kept: the penalties would count a window that
     * is not the text's, a quietly different distribution. Every sample
     * says -1 (out of memory) until gpe_sampler_reset. */
    bool hist_lost;

    /* Scratch, sized for the largest n_vocab seen. */
    int cap;
    float *work;       /* [cap] logits after penalties */
    float *prob;       /* [cap] exp(work - max) when sampling the whole vocabulary */
    int32_t *count;    /* [cap] zero between calls */
    cand *cands;       /* [cap] selected candidates */
    double mass[TOPP_BUCKETS + 1];
};

gpe_sampler_params gpe_sampler_default_params(void)
{
    /* The same defaults as llama.cpp's common sampling parameters. */
    return (gpe_sampler_params){
        .temperature = 0.8f,
        .top_k = 40,
        .top_p = 0.95f,
        .min_p = 0.05f,
        .repeat_penalty = 1.0f,
        .repeat_last_n = 64,
        .frequency_penalty = 0.0f,
        .presence_penalty = 0.0f,
        .seed = 0,
    };
}

static void seed_rng(gpe_sampler *s)
{
    uint64_t x = s->p.seed;
    for (int i = 0; i < 4; i++)
        s->rng[i] = splitmix64(&x);
}

gpe_sampler *gpe_sampler_init(const gpe_sampler_params *p)
{
    gpe_sampler *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->p = p ? *p : gpe_sampler_default_params();
    /* NaN parameters would make every comparison false; treat them as off. */
    if (!(s->p.temperature == s->p.temperature))
        s->p.temperature = 0;
    if (!(s->p.top_p == s->p.top_p))
        s->p.top_p = 1;
    if (!(s->p.min_p == s->p.min_p))
        s->p.min_p = 0;
    if (!(s->p.repeat_penalty == s->p.repeat_penalty))
        s->p.repeat_penalty = 1;
    if (!(s->p.frequency_penalty == s->p.frequency_penalty))
        s->p.frequency_penalty = 0;
    if (!(s->p.presence_penalty == s->p.presence_penalty))
        s->p.presence_penalty = 0;
    seed_rng(s);
    return s;
}

void gpe_sampler_free(gpe_sampler *s)
{
    if (!s)
        return;
    free(s->hist);
    free(s->work);
    free(s->prob);
    free(s->count);
    free(s->cands);
    free(s);
}

/* Forget the history and restart the generator from the seed. */
void gpe_sampler_reset(gpe_sampler *s)
{
    if (!s)
        return;
    s->hist_len = 0;
    s->hist_lost = false;
    seed_rng(s);
}

void gpe_sampler_advance(gpe_sampler *s, uint64_t n_sampled)
{
    if (!s)
        return;
    /* One draw per sampled token (see the top of this file); a few
     * thousand steps of xoshiro cost microseconds. */
    for (uint64_t i = 0; i < n_sampled; i++)
        (void)xoshiro_next(s->rng);
}

/* Whether any penalty is on (and so reads the accepted tokens). */
static bool penalties_on(const gpe_sampler_params *p)
{
    bool rep = p->repeat_penalty > 0 && p->repeat_penalty != 1.0f;
    return p->repeat_last_n != 0 &&
           (rep || p->frequency_penalty != 0 || p->presence_penalty != 0);
}

void gpe_sampler_accept(gpe_sampler *s, int32_t token)
{
    if (!s || s->hist_lost)
        return;
    if (!penalties_on(&s->p))
        return;                     /* nothing reads the history: nothing to remember */
    size_t win = s->p.repeat_last_n > 0 ? (size_t)s->p.repeat_last_n : 0;
    if (win && s->hist_len >= 2 * win) {
        memmove(s->hist, s->hist + s->hist_len - win, win * sizeof *s->hist);
        s->hist_len = win;
    }
    if (s->hist_len == s->hist_cap) {
        size_t nc = s->hist_cap ? s->hist_cap * 2 : 256;
        int32_t *nh = realloc(s->hist, nc * sizeof *nh);
        if (!nh) {
            s->hist_lost = true;    /* gpe_sampler_sample says so */
            return;
        }
        s->hist = nh;
        s->hist_cap = nc;
    }
    s->hist[s->hist_len++] = token;
}

static int ensure_cap(gpe_sampler *s, int n)
{
    if (n <= s->cap)
        return 0;
    float *w = malloc((size_t)n * sizeof *w);
    float *pr = malloc((size_t)n * sizeof *pr);
    int32_t *c = calloc((size_t)n, sizeof *c);
    cand *cd = malloc((size_t)n * sizeof *cd);
    if (!w || !pr || !c || !cd) {
        free(w);
        free(pr);
        free(c);
        free(cd);
        return -1;
    }
    free(s->work);
    free(s->prob);
    free(s->count);
    free(s->cands);
    s->work = w;
    s->prob = pr;
    s->count = c;
    s->cands = cd;
    s->cap = n;
    return 0;
}

/* a ranks before b: larger logit, then lower id. */
static inline int better(cand a, cand b)
{
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

/* Min-heap (worst candidate at the root) helpers. */
static void heap_down(cand *h, int n, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && better(h[w], h[l]))
            w = l;
        if (r < n && better(h[w], h[r]))
            w = r;
        if (w == i)
            return;
        cand t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* The k best of work[0..n) into out[0..k), sorted best first. O(n log k). */
static void select_top(const float *work, int n, int k, cand *out)
{
    for (int i = 0; i < k; i++)   /* NaN would break the ordering: rank it as -inf */
        out[i] = (cand){work[i] == work[i] ? work[i] : -INFINITY, i, 0};
    for (int i = k / 2 - 1; i >= 0; i--)
        heap_down(out, k, i);
    float worst = out[0].logit;
    for (int i = k; i < n; i++) {
        /* A later id never beats an equal logit, so only strictly larger
         * values enter; NaN compares false and never enters. */
        if (!(work[i] > worst))
            continue;
        out[0] = (cand){work[i], i, 0};
        heap_down(out, k, 0);
        worst = out[0].logit;
    }
    /* Heap sort in place: repeatedly move the worst to the end. */
    for (int m = k - 1; m > 0; m--) {
        cand t = out[0];
        out[0] = out[m];
        out[m] = t;
        heap_down(out, m, 0);
    }
}

static void apply_penalties(gpe_sampler *s, float *w, int n)
{
    const gpe_sampler_params *p = &s->p;
    bool rep = p->repeat_penalty > 0 && p->repeat_penalty != 1.0f;
    if (!s->hist_len || !penalties_on(p))
        return;
    size_t win = p->repeat_last_n > 0 ? (size_t)p->repeat_last_n : s->hist_len;
    if (win > s->hist_len)
        win = s->hist_len;
    const int32_t *h = s->hist + s->hist_len - win;
    for (size_t i = 0; i < win; i++)
        if (h[i] >= 0 && h[i] < n)
            s->count[h[i]]++;
    /* Each distinct token once: the first visit applies and zeroes its
     * count, which also restores the all-zero invariant of count[]. */
    for (size_t i = 0; i < win; i++) {
        int32_t t = h[i];
        if (t < 0 || t >= n || s->count[t] == 0)
            continue;
        int c = s->count[t];
        s->count[t] = 0;
        float l = w[t];
        if (rep)
            l = l > 0 ? l / p->repeat_penalty : l * p->repeat_penalty;
        l -= (float)c * p->frequency_penalty + p->presence_penalty;
        w[t] = l;
    }
}

/* exp(x) for x <= 0 in float, about 2 ulp, 0 below -87. glibc's expf is
 * correctly rounded but costs ~10 ns here, and the whole-vocabulary paths
 * take 150k of them per token. Method: x = k ln2 + r with |r| <= ln2/2,
 * e^r by its degree-6 Taylor polynomial (error < 3e-8 on that interval),
 * times 2^k built in the exponent bits. Branch-free, so loops over it
 * vectorise. Same code on every thread count, so sampling stays
 * reproducible. */
static inline float exp_neg(float x)
{
    x = x >= -87.0f ? x : -87.0f;    /* also maps NaN to the zero result */
    /* round to nearest by the 1.5 * 2^23 trick: plain SSE2, vectorisable */
    float kf = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - kf * 0.693145751953125f - kf * 1.428606765330187e-06f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.6666667e-1f + r * (4.1666668e-2f
              + r * (8.3333338e-3f + r * 1.3888889e-3f)))));
    union { uint32_t u; float f; } b = {.u = (uint32_t)((int32_t)kf + 127) << 23};
    float v = p * b.f;
    return x <= -87.0f ? 0.0f : v;
}

/* Largest value of w[0..n), ignoring NaN; -INFINITY when there is none.
 * Eight independent lanes: a single running maximum is a dependency chain
 * that costs several cycles per element. */
static float max_value(const float *w, int n)
{
    float m[8];
    for (int j = 0; j < 8; j++)
        m[j] = -INFINITY;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            m[j] = w[i + j] > m[j] ? w[i + j] : m[j];
    for (; i < n; i++)
        m[0] = w[i] > m[0] ? w[i] : m[0];
    float r = m[0];
    for (int j = 1; j < 8; j++)
        r = m[j] > r ? m[j] : r;
    return r;
}

/* Lowest id holding the largest value (0 when every value is NaN/-inf). */
static int32_t argmax(const float *w, int n)
{
    float m = max_value(w, n);
    for (int i = 0; i < n; i++)
        if (w[i] == m)
            return i;
    return 0;
}

static int cmp_cand(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    return better(*x, *y) ? -1 : better(*y, *x) ? 1 : 0;
}

/* top-p over the whole vocabulary (no top-k): w holds tempered logits with
 * maximum m and pr their exp(w - m), summing to z. Fills c with the nucleus
 * and returns its size. Instead of sorting 150k entries, a histogram of
 * (m - w) finds the bucket where the cumulative mass crosses p*z: every
 * bucket before it is kept whole, and only that one bucket is sorted. The
 * result is the same set as sorting everything and keeping the shortest
 * prefix that reaches p. */
static int top_p_full(gpe_sampler *s, const float *w, const float *pr, int n, float m, double z,
                      cand *c)
{
    double *mass = s->mass;
    const float scale = TOPP_BUCKETS / TOPP_RANGE;
    memset(mass, 0, sizeof s->mass);
    for (int i = 0; i < n; i++) {
        float d = (m - w[i]) * scale;
        int b = d < TOPP_BUCKETS ? (int)d : TOPP_BUCKETS;   /* -inf: far tail */
        mass[b] += pr[i];
    }
    double target = (double)s->p.top_p * z, cum = 0;
    int cut = 0;
    while (cut < TOPP_BUCKETS && cum + mass[cut] < target)
        cum += mass[cut++];
    /* Buckets before `cut` whole (in id order), then `cut` sorted. */
    int nc = 0, nb;
    for (int i = 0; i < n; i++) {
        float d = (m - w[i]) * scale;
        int b = d < TOPP_BUCKETS ? (int)d : TOPP_BUCKETS;
        if (b < cut)
            c[nc++] = (cand){w[i], i, pr[i]};
    }
    nb = nc;
    for (int i = 0; i < n; i++) {
        float d = (m - w[i]) * scale;
        int b = d < TOPP_BUCKETS ? (int)d : TOPP_BUCKETS;
        if (b == cut)
            c[nb++] = (cand){w[i], i, pr[i]};
    }
    qsort(c + nc, (size_t)(nb - nc), sizeof *c, cmp_cand);
    while (nc < nb && cum < target)
        cum += c[nc++].p;
    return nc > 0 ? nc : 1;
}

int32_t gpe_sampler_sample(gpe_sampler *s, const float *logits, int n_vocab)
{
    if (!s || !logits || n_vocab <= 0)
        return -1;
    if (s->hist_lost || ensure_cap(s, n_vocab) != 0)
        return -1;                  /* out of memory, no draw taken */
    /* The one draw of this call, taken before any early return. */
    double u01 = rng_uniform(s->rng);
    const gpe_sampler_params *p = &s->p;
    float *w = s->work;
    memcpy(w, logits, (size_t)n_vocab * sizeof *w);
    apply_penalties(s, w, n_vocab);

    /* greedy; below 1e-5 the tempered distribution is the argmax anyway,
     * and 1/T would approach overflow */
    if (p->temperature < 1e-5f)
        return argmax(w, n_vocab);

    /* From here the candidates are either an explicit list c[0..nc) (after
     * top-k or top-p) or, when list == false, the whole vocabulary read from
     * w and pr in id order. */
    cand *c = s->cands;
    float *pr = s->prob;
    int nc = 0;
    bool list = false;
    float inv_t = 1.0f / p->temperature;
    float m;

    if (p->top_k > 0 && p->top_k < n_vocab) {
        nc = p->top_k;
        select_top(w, n_vocab, nc, c);     /* sorted best first */
        list = true;
        for (int i = 0; i < nc; i++)
            c[i].logit *= inv_t;
        m = c[0].logit;
        if (!(m > -INFINITY) || m == INFINITY)
            return argmax(w, n_vocab);     /* everything masked out, or inf */
        for (int i = 0; i < nc; i++)
            c[i].p = exp_neg(c[i].logit - m);
    } else {
        for (int i = 0; i < n_vocab; i++)
            w[i] = w[i] == w[i] ? w[i] * inv_t : -INFINITY;   /* NaN -> -inf */
        m = max_value(w, n_vocab);
        if (!(m > -INFINITY) || m == INFINITY)
            return argmax(w, n_vocab);     /* nothing finite to weigh */
        for (int i = 0; i < n_vocab; i++)
            pr[i] = exp_neg(w[i] - m);
    }

    /* top-p */
    if (p->top_p > 0 && p->top_p < 1) {
        double z = 0;
        if (list) {
            for (int i = 0; i < nc; i++)
                z += c[i].p;
            double target = (double)p->top_p * z, cum = 0;
            int keep = 0;
            while (keep < nc && cum < target)
                cum += c[keep++].p;
            nc = keep > 0 ? keep : 1;
        } else {
            for (int i = 0; i < n_vocab; i++)
                z += pr[i];
            nc = top_p_full(s, w, pr, n_vocab, m, z, c);
            list = true;
        }
    }

    /* min-p: prob_i >= min_p * prob_max, i.e. exp(l_i - m) >= min_p */
    float floor_p = 0;
    if (p->min_p > 0 && p->min_p <= 1) {
        floor_p = p->min_p;
        if (list) {
            int keep = 0;
            for (int i = 0; i < nc; i++)   /* stable: keeps the list order */
                if (c[i].p >= floor_p)
                    c[keep++] = c[i];
            nc = keep;                      /* the maximum (p = 1) always stays */
        }
    }

    /* draw */
    double z = 0, cum = 0;
    if (list) {
        for (int i = 0; i < nc; i++)
            z += c[i].p;
        double u = u01 * z;
        for (int i = 0; i < nc; i++) {
            cum += c[i].p;
            if (u < cum)
                return c[i].id;
        }
        return c[nc - 1].id;   /* rounding: u landed on the very top */
    }
    for (int i = 0; i < n_vocab; i++)
        if (pr[i] >= floor_p)
            z += pr[i];
    double u = u01 * z;
    int last = 0;
    for (int i = 0; i < n_vocab; i++) {
        if (!(pr[i] >= floor_p) || pr[i] == 0)
            continue;
        cum += pr[i];
        last = i;
        if (u < cum)
            return i;
    }
    return last;
}

/* ======================================================= stop strings */

/* The matcher keeps the text not yet emitted in buf. After each piece it
 * emits everything except (a) the longest tail that is a proper prefix of
 * some stop string, and (b) an incomplete UTF-8 sequence at the end (a
 * byte-fallback token may deliver half a character; clients and JSON
 * encoders want whole characters). On a match, the text before the stop
 * string is emitted and the rest is discarded for good. gpe_stop_flush
 * emits whatever is held, even an incomplete character. Emitted pointers
 * point into buf; the emitted bytes are dropped at the next call. A piece
 * that buf cannot grow for ends the stream (oom): the text after it would
 * have a hole, and the held text before it, flushed, a false end. */

struct gpe_stop {
    char **stops;
    size_t *lens;
    size_t n;
    size_t max_len;
    char *buf;          /* held-back text; the first `drop` bytes were emitted last call */
    size_t len, cap, drop;
    bool matched;
    int which;          /* index of the stop string that matched */
    bool oom;           /* a piece could not be held: the text has a hole, so nothing
                           more comes out (every feed and flush says GPE_ERR_NOMEM) */
};

gpe_stop *gpe_stop_init(const char *const *stops, size_t n)
{
    gpe_stop *st = calloc(1, sizeof *st);
    if (!st)
        return NULL;
    if (n > 0 && stops) {
        st->stops = calloc(n, sizeof *st->stops);
        st->lens = calloc(n, sizeof *st->lens);
        if (!st->stops || !st->lens)
            goto err;
        for (size_t i = 0; i < n; i++) {
            if (!stops[i] || !stops[i][0])
                continue;           /* empty stop strings would match everywhere */
            size_t l = strlen(stops[i]);
            st->stops[st->n] = malloc(l + 1);
            if (!st->stops[st->n])
                goto err;
            memcpy(st->stops[st->n], stops[i], l + 1);
            st->lens[st->n] = l;
            if (l > st->max_len)
                st->max_len = l;
            st->n++;
        }
    }
    return st;
err:
    gpe_stop_free(st);
    return NULL;
}

void gpe_stop_free(gpe_stop *st)
{
    if (!st)
        return;
    for (size_t i = 0; i < st->n; i++)
        free(st->stops[i]);
    free(st->stops);
    free(st->lens);
    free(st->buf);
    free(st);
}

/* Bytes at the end of b[0..n) that form an incomplete UTF-8 sequence (a
 * lead byte still waiting for its continuation bytes), 0 otherwise. */
static size_t utf8_incomplete_tail(const char *b, size_t n)
{
    for (size_t back = 1; back <= 4 && back <= n; back++) {
        unsigned char ch = (unsigned char)b[n - back];
        if ((ch & 0xC0) == 0x80)
            continue;               /* continuation byte: keep looking for the lead */
        size_t need = ch >= 0xF0 && ch <= 0xF4 ? 4 : ch >= 0xE0 && ch < 0xF0 ? 3
                    : ch >= 0xC2 && ch < 0xE0 ? 2 : 1;
        return need > back ? back : 0;
    }
    return 0;
}

/* Longest suffix of b[0..n) that is a proper prefix of some stop string. */
static size_t stop_partial_tail(const gpe_stop *st, const char *b, size_t n)
{
    size_t lim = st->max_len ? st->max_len - 1 : 0;
    if (lim > n)
        lim = n;
    for (size_t k = lim; k > 0; k--) {
        for (size_t i = 0; i < st->n; i++)
            if (st->lens[i] > k && memcmp(b + n - k, st->stops[i], k) == 0)
                return k;
    }
    return 0;
}

/* Forget the bytes emitted by the last call. */
static void stop_compact(gpe_stop *st)
{
    if (st->drop) {
        memmove(st->buf, st->buf + st->drop, st->len - st->drop);
        st->len -= st->drop;
        st->drop = 0;
    }
}

/* Room for len more bytes (and a spare one): 0, or -1 when memory ran out
 * (the matcher is left as it was). */
static int stop_room(gpe_stop *st, size_t len)
{
    if (len > SIZE_MAX / 4 - st->len)
        return -1;                  /* no piece is this long: as good as out of memory */
    if (st->len + len + 1 <= st->cap)
        return 0;
    size_t nc = st->cap ? st->cap : 64;
    while (nc < st->len + len + 1)
        nc *= 2;
    char *nb = realloc(st->buf, nc);
    if (!nb)
        return -1;
    st->buf = nb;
    st->cap = nc;
    return 0;
}

bool gpe_stop_feed_status(gpe_stop *st, const char *piece, size_t len, const char **emit,
                          size_t *emit_len, gpe_status *status)
{
    const char *e_dummy;
    size_t l_dummy;
    gpe_status s_dummy;
    if (!emit)
        emit = &e_dummy;
    if (!emit_len)
        emit_len = &l_dummy;
    if (!status)
        status = &s_dummy;
    *emit = "";
    *emit_len = 0;
    *status = GPE_OK;
    if (!st) {
        /* No matcher (allocation failed upstream): pass the text through. */
        *emit = piece ? piece : "";
        *emit_len = piece ? len : 0;
        return false;
    }
    if (st->oom) {
        *status = GPE_ERR_NOMEM;
        return false;
    }
    stop_compact(st);
    if (st->matched)
        return true;
    if (!piece)
        len = 0;
    if (stop_room(st, len) != 0) {
        /* Emitting what is held would go on past a piece that never came
         * out: the stream ends here, and says why. */
        st->oom = true;
        *status = GPE_ERR_NOMEM;
        return false;
    }
    if (len)
        memcpy(st->buf + st->len, piece, len);
    st->len += len;

    /* Earliest full match of any stop string. The held-back text contained
     * none, so only a match ending in the new piece is possible; searching
     * the whole (short) buffer keeps this simple. */
    size_t best = SIZE_MAX;
    int which = -1;
    for (size_t i = 0; i < st->n; i++) {
        const char *hit = memmem(st->buf, st->len, st->stops[i], st->lens[i]);
        if (hit && (size_t)(hit - st->buf) < best) {
            best = (size_t)(hit - st->buf);
            which = (int)i;
        }
    }
    if (best != SIZE_MAX) {
        st->matched = true;
        st->which = which;
        *emit = st->buf;
        *emit_len = best;
        st->drop = st->len;         /* everything from the stop string on is discarded */
        return true;
    }

    size_t hold = stop_partial_tail(st, st->buf, st->len);
    size_t inc = utf8_incomplete_tail(st->buf, st->len - hold);
    size_t out = st->len - hold - inc;
    *emit = st->buf;
    *emit_len = out;
    st->drop = out;
    return false;
}

bool gpe_stop_feed(gpe_stop *st, const char *piece, size_t len, const char **emit,
                   size_t *emit_len)
{
    return gpe_stop_feed_status(st, piece, len, emit, emit_len, NULL);
}

int gpe_stop_prime(gpe_stop *st, const char *held, size_t len)
{
    if (!st || (!held && len) || st->oom)
        return -1;
    stop_compact(st);
    if (stop_room(st, len) != 0)
        return -1;                  /* nothing taken: the caller ends the stream */
    if (len)
        memcpy(st->buf + st->len, held, len);
    st->len += len;
    /* No search here: the next feed searches the whole buffer, exactly as
     * the matcher that held this text would have. */
    return 0;
}

void gpe_stop_flush_status(gpe_stop *st, const char **emit, size_t *emit_len,
                           gpe_status *status)
{
    const char *e_dummy;
    size_t l_dummy;
    gpe_status s_dummy;
    if (!emit)
        emit = &e_dummy;
    if (!emit_len)
        emit_len = &l_dummy;
    if (!status)
        status = &s_dummy;
    *emit = "";
    *emit_len = 0;
    *status = GPE_OK;
    if (!st)
        return;
    if (st->oom) {
        /* what is held came before the lost piece: the end of it would
         * read as the end of the text */
        *status = GPE_ERR_NOMEM;
        return;
    }
    stop_compact(st);
    if (st->matched || !st->len)
        return;
    *emit = st->buf;
    *emit_len = st->len;
    st->drop = st->len;
}

void gpe_stop_flush(gpe_stop *st, const char **emit, size_t *emit_len)
{
    gpe_stop_flush_status(st, emit, emit_len, NULL);
}

int gpe_stop_which(const gpe_stop *st)
{
    return st && st->matched ? st->which : -1;
}
