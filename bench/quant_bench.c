/*
 * quant-bench: dot-product throughput per weight type and SIMD path
 * (scalar, AVX2, AVX-512), printed only. One thread; a weight matrix of
 * about 1 MiB (mostly cache-resident: this measures the kernels, not memory
 * bandwidth) times one activation row through gpe_matmul_rows. Rates are
 * per second of thread CPU time.
 *
 *   quant-bench [--n N] [--mib M] [--ms T] [--tok K]
 *
 * The last column is K tokens (default 4) through one gpe_matmul_rows call:
 * --tok 64 measures the prompt-batch kernels.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/quant.h"

/* Thread CPU time: the machine is shared, and wall time would mostly
 * measure the other tenants. */
static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    int64_t n = 4096;
    double mib = 1.0, ms = 300;
    int ntok = 4;
    static const struct option lo[] = {{"n", required_argument, 0, 'n'},
                                       {"mib", required_argument, 0, 'm'},
                                       {"ms", required_argument, 0, 't'},
                                       {"tok", required_argument, 0, 'k'},
                                       {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'n': n = atoll(optarg); break;
        case 'm': mib = atof(optarg); break;
        case 't': ms = atof(optarg); break;
        case 'k': ntok = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: quant-bench [--n COLS] [--mib WEIGHT_MIB] [--ms TIME_PER_CASE] [--tok K]\n");
            return 2;
        }
    }
    if (ntok < 1 || ntok > 4096) {
        fprintf(stderr, "quant-bench: --tok must be 1..4096\n");
        return 2;
    }
    if (n <= 0 || n % 256 != 0) {
        fprintf(stderr, "quant-bench: --n must be a positive multiple of 256\n");
        return 2;
    }
    static const gpe_type types[] = {GPE_TYPE_F32, GPE_TYPE_F16, GPE_TYPE_BF16, GPE_TYPE_Q8_0,
                                     GPE_TYPE_Q4_0, GPE_TYPE_Q4_K, GPE_TYPE_Q5_K, GPE_TYPE_Q6_K};
    const gpe_isa best = gpe_quant_best_isa();
    printf("quant-bench: n=%lld, ~%.1f MiB of weights per type, 1 thread, best ISA %s\n",
           (long long)n, mib, gpe_isa_name(best));
    char colk[32];
    snprintf(colk, sizeof colk, "Gelem/s(x%d)", ntok);
    printf("%-6s %-7s %10s %10s %9s %13s\n", "type", "isa", "Gelem/s", "GB/s(w)", "speedup", colk);
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const gpe_type t = types[ti];
        const size_t rs = gpe_row_size(t, n);
        int64_t rows = (int64_t)(mib * 1048576.0 / (double)rs);
        if (rows < 16)
            rows = 16;
        uint8_t *W = malloc(rs * (size_t)rows);
        const bool have_quantizer = t != GPE_TYPE_Q5_K && t != GPE_TYPE_Q6_K;
        for (int64_t r = 0; r < rows && have_quantizer; r++)
            gpe_quantize_row(t, x, W + rs * r, n);
        if (!have_quantizer) {
            /* no quantizer for these: pseudo-random blocks with sane scales */
            uint64_t s = 88172645463325252ull;
            for (size_t i = 0; i < rs * (size_t)rows; i++) {
                s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                W[i] = (uint8_t)s;
            }
            const size_t bb = gpe_type_block_bytes(t);
            const uint16_t h = gpe_fp32_to_fp16(0.01f);
            for (size_t b = 0; b < rs * (size_t)rows / bb; b++) {
                if (t == GPE_TYPE_Q5_K) {
                    memcpy(W + b * bb, &h, 2);
                    memcpy(W + b * bb + 2, &h, 2);
                } else {
                    memcpy(W + b * bb + 208, &h, 2);
                }
            }
        }
        /* ntok activation rows (the same values) for the last column */
        const size_t ars = gpe_row_size(gpe_vec_dot_type(t), n);
        uint8_t *act = malloc(ars * (size_t)ntok);
        for (int k = 0; k < ntok; k++)
            gpe_quantize_row_act(t, x, act + ars * (size_t)k, n);
        float *out = malloc((size_t)rows * (size_t)ntok * sizeof *out);
        double base = 0;
        for (int isa = 0; isa <= (int)best; isa++) {
            gpe_quant_set_isa((gpe_isa)isa);
            double rate[2];
            for (int m = 0; m < 2; m++) {
                const int nt = m ? ntok : 1;
                gpe_matmul_rows(t, W, 0, rows, n, act, nt, ars, out, rows);   /* warm up */
                long iters = 0;
                const double t0 = now();
                double el;
                do {
                    gpe_matmul_rows(t, W, 0, rows, n, act, nt, ars, out, rows);
                    iters++;
                    el = now() - t0;
                } while (el < ms / 1000.0);
                rate[m] = (double)iters * nt * (double)rows * (double)n / el;
            }
            if (isa == 0)
                base = rate[0];
            printf("%-6s %-7s %10.2f %10.2f %8.1fx %13.2f\n", gpe_type_name(t),
                   gpe_isa_name((gpe_isa)isa), rate[0] / 1e9, rate[0] / 1e9 * (double)rs / (double)n,
                   rate[0] / base, rate[1] / 1e9);
        }
        gpe_quant_set_isa(best);
        free(W);
        free(act);
        free(out);
    }
    free(x);
    return 0;
}
