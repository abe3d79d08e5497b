/* Sampler cost per token on a 150k vocabulary (printed only).
 *
 *   bench_sampler [n_vocab=151936] [iterations=200]
 */
#include <gpupool/engine.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void run(const char *name, gpe_sampler_params p, const float *l, int n, int iters)
{
    gpe_sampler *s = gpe_sampler_init(&p);
    if (!s)
        return;
    for (int i = 0; i < 64; i++)
        gpe_sampler_accept(s, (i * 7919) % n);
    double t0 = now_us();
    long sum = 0;
    for (int i = 0; i < iters; i++)
        sum += gpe_sampler_sample(s, l, n);
    double dt = (now_us() - t0) / iters;
    printf("sampler n_vocab=%d %-34s %8.1f us/token (checksum %ld)\n", n, name, dt, sum);
    gpe_sampler_free(s);
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 151936;
    int iters = argc > 2 ? atoi(argv[2]) : 200;
    if (n < 2 || iters < 1)
        return 1;
    float *l = malloc((size_t)n * sizeof *l);
    if (!l)
        return 1;
    /* Roughly model-like logits: a few strong candidates over a broad floor. */
    uint64_t x = 88172645463325252ULL;
    for (int i = 0; i < n; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        double u = (double)(x >> 11) * 0x1.0p-53;
        l[i] = (float)(-4.0 + 8.0 * u * u * u);
    }
    gpe_sampler_params d = gpe_sampler_default_params();
    gpe_sampler_params g = d;
    g.temperature = 0;
    run("greedy", g, l, n, iters);
    run("defaults (k40 p.95 minp.05 T.8)", d, l, n, iters);
    gpe_sampler_params t = d;
    t.top_k = 0; t.top_p = 1; t.min_p = 0;
    run("temperature only", t, l, n, iters);
    t.top_p = 0.95f;
    run("top-p .95 without top-k", t, l, n, iters);
    t.top_p = 1; t.min_p = 0.05f;
    run("min-p .05 without top-k", t, l, n, iters);
    gpe_sampler_params r = d;
    r.repeat_penalty = 1.1f; r.frequency_penalty = 0.2f; r.presence_penalty = 0.1f;
    run("defaults + all penalties", r, l, n, iters);
    free(l);
    return 0;
}
