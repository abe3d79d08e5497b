/*
 * gpupool-run selftest: check a backend on this machine.
 *
 *   --backend cuda   run the CUDA self-test (kernels vs the CPU reference);
 *                    fails (exit 1) when the CUDA backend is not built or no
 *                    device is visible.
 *   --backend cpu    report the CPU path chosen at run time; with -m, also
 *                    load the model and decode a few tokens.
 *   (default auto)   cuda when it is available, else cpu.
 */
#include <getopt.h>
#include <string.h>

#include "run/run.h"

static const char *NAME = "selftest";

static void usage(FILE *out)
{
    fprintf(out, "usage: gpupool-run selftest [--backend auto|cpu|cuda] [-m FILE]\n\n"
                 "      --backend B      backend to test (default auto: cuda when available)\n"
                 "  -m, --model FILE     also load this model and decode a few tokens (cpu)\n"
                 "  -h, --help           this help\n");
}

static int cpu_check(const char *model)
{
    printf("CPU backend: %s\n", gpe_cpu_features());
    if (!model)
        return 0;
    gpe_model *m = gpr_load_model(NAME, model, false);
    if (!m)
        return 1;
    char err[256];
    gpe_ctx *c = NULL;
    gpe_ctx_params cp = gpe_ctx_default_params();
    cp.n_ctx = 16;
    int rc = 1;
    gpe_batch *b = gpe_batch_init(8);
    if (gpe_ctx_init(m, &cp, &c, err, sizeof err) != GPE_OK || !b) {
        fprintf(stderr, "gpupool-run %s: %s\n", NAME, err);
        goto done;
    }
    gpe_model_info in;
    gpe_model_get_info(m, &in);
    for (int i = 0; i < 8; i++)
        gpe_batch_add(b, in.bos >= 0 ? in.bos : 0, i, 0, i == 7);
    if (gpe_decode(c, b, err, sizeof err) != GPE_OK) {
        fprintf(stderr, "gpupool-run %s: decode: %s\n", NAME, err);
        goto done;
    }
    const float *lg = gpe_get_logits(c, 7);
    for (int i = 0; i < in.n_vocab; i++)
        if (!(lg[i] == lg[i]) || lg[i] > 1e30f || lg[i] < -1e30f) {
            fprintf(stderr, "gpupool-run %s: logit %d is not finite\n", NAME, i);
            goto done;
        }
    printf("model %s: decoded 8 tokens, logits finite: ok\n", in.name);
    rc = 0;
done:
    gpe_batch_free(b);
    gpe_ctx_free(c);
    gpe_model_free(m);
    return rc;
}

static int exec_selftest(int argc, char **argv)
{
    static const struct option lo[] = {
        { "backend", required_argument, 0, 'b' }, { "model", required_argument, 0, 'm' },
        { "help", no_argument, 0, 'h' },          { 0, 0, 0, 0 },
    };
    const char *backend = "auto", *model = NULL;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "b:m:h", lo, NULL)) != -1) {
        switch (c) {
        case 'b': backend = optarg; break;
        case 'm': model = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "gpupool-run %s: unexpected argument '%s'\n", NAME, argv[optind]);
        return 2;
    }
    if (strcmp(backend, "auto") != 0 && strcmp(backend, "cpu") != 0 &&
        strcmp(backend, "cuda") != 0) {
        fprintf(stderr, "gpupool-run %s: --backend must be auto, cpu or cuda (got '%s')\n", NAME,
                backend);
        return 2;
    }
    char why[512] = "";
    int n_gpu = gpe_gpu_count(why, sizeof why);
    bool cuda = n_gpu > 0;
    if (strcmp(backend, "cuda") == 0 || (strcmp(backend, "auto") == 0 && cuda)) {
        static char err[16384];
        err[0] = '\0';
        for (int i = 0; i < n_gpu; i++) {
            gpe_gpu_info gi;
            if (gpe_gpu_info_get(i, &gi, err, sizeof err) == GPE_OK)
                printf("CUDA device %d: %s, compute capability %d.%d, %.0f of %.0f MiB free\n",
                       i, gi.name, gi.cc_major, gi.cc_minor, gi.free_bytes / 1048576.0,
                       gi.total_bytes / 1048576.0);
        }
        gpe_status st = gpe_cuda_selftest(err, sizeof err);
        if (st != GPE_OK) {
            fprintf(stderr, "gpupool-run %s: CUDA: %s (%s)\n", NAME, err, gpe_status_name(st));
            return 1;
        }
        printf("CUDA self-test: ok%s%s\n", *err ? ": " : "", err);
        return 0;
    }
    if (!cuda)
        printf("CUDA backend unavailable (%s); testing the CPU backend\n", why);
    return cpu_check(model);
}

const gpr_cmd gpr_cmd_selftest = {
    "selftest", "self-test a backend (CUDA when built; else the CPU path)", exec_selftest, usage,
};
