/*
 * gpupool-run info: a model file's metadata, tensors and memory needs.
 */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "run/run.h"

static const char *NAME = "info";

static void usage(FILE *out)
{
    fprintf(out, "usage: gpupool-run info -m FILE [--no-tensors] [-c N] [--slots N]\n\n"
                 "  -m, --model FILE     GGUF model file (required)\n"
                 "      --no-tensors     do not list the tensors\n"
                 "  -c, --ctx N          context length for the memory estimate (default: training)\n"
                 "      --slots N        sequences for the memory estimate (default 1)\n"
                 "  -h, --help           this help\n");
}

static int exec_info(int argc, char **argv)
{
    enum { O_NOT = 256, O_SLOTS };
    static const struct option lo[] = {
        { "model", required_argument, 0, 'm' }, { "no-tensors", no_argument, 0, O_NOT },
        { "ctx", required_argument, 0, 'c' },   { "slots", required_argument, 0, O_SLOTS },
        { "help", no_argument, 0, 'h' },        { 0, 0, 0, 0 },
    };
    const char *model = NULL;
    bool tensors = true;
    long n_ctx = 0, slots = 1;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "m:c:h", lo, NULL)) != -1) {
        bool ok = true;
        switch (c) {
        case 'm': model = optarg; break;
        case O_NOT: tensors = false; break;
        case 'c': ok = gpr_parse_int(NAME, "--ctx", optarg, 1, 1 << 22, &n_ctx); break;
        case O_SLOTS: ok = gpr_parse_int(NAME, "--slots", optarg, 1, 4096, &slots); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (!ok)
            return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "gpupool-run %s: unexpected argument '%s'\n", NAME, argv[optind]);
        return 2;
    }
    if (!model) {
        fprintf(stderr, "gpupool-run %s: -m FILE is required\n\n", NAME);
        usage(stderr);
        return 2;
    }
    gpe_model *m = gpr_load_model(NAME, model, false);
    if (!m)
        return 1;
    gpe_model_info in;
    gpe_model_get_info(m, &in);
    char b1[32], b2[32], b3[32];

    printf("model:        %s\n", in.name);
    printf("file:         %s (%s)\n", model, gpr_bytes(in.file_bytes, b1, sizeof b1));
    printf("architecture: %s\n", in.arch);
    printf("quantization: %s\n", in.quant);
    printf("parameters:   %llu (%.2f M)\n", (unsigned long long)in.n_params, in.n_params / 1e6);
    printf("shape:        n_vocab %d, n_ctx_train %d, n_embd %d, n_layer %d, n_head %d, "
           "n_head_kv %d, n_ff %d\n",
           in.n_vocab, in.n_ctx_train, in.n_embd, in.n_layer, in.n_head, in.n_head_kv, in.n_ff);
    printf("tokenizer:    %s (bos %d, eos %d)\n", in.tokenizer ? in.tokenizer : "?", (int)in.bos,
           (int)in.eos);
    printf("chat format:  %s%s\n", in.chat_format,
           in.chat_template ? "" : " (no tokenizer.chat_template)");
    printf("cpu path:     %s\n", gpe_cpu_features());

    /* memory: weights are mapped from the file; the KV cache is F32 */
    if (n_ctx == 0)
        n_ctx = in.n_ctx_train;
    uint64_t head_dim = in.n_head ? (uint64_t)in.n_embd / (uint64_t)in.n_head : 0;
    uint64_t kv = 2ull * (uint64_t)in.n_layer * (uint64_t)n_ctx * (uint64_t)in.n_head_kv *
                  head_dim * 4ull * (uint64_t)slots;
    printf("memory:       weights %s (mapped), KV cache %s (F32, %ld positions x %ld slots), "
           "total %s\n",
           gpr_bytes(in.weight_bytes, b1, sizeof b1), gpr_bytes(kv, b2, sizeof b2), n_ctx, slots,
           gpr_bytes(in.weight_bytes + kv, b3, sizeof b3));
    printf("bytes read per generated token: about %s (all weights once)\n",
           gpr_bytes(in.weight_bytes, b1, sizeof b1));

    int nkv = gpe_model_meta_count(m);
    printf("\nmetadata (%d keys):\n", nkv);
    char val[160];
    for (int i = 0; i < nkv; i++) {
        const char *k = gpe_model_meta_key(m, i);
        if (!k)
            continue;
        gpe_model_meta_str(m, k, val, sizeof val);
        /* one line per key: newlines in values (chat templates) are shown as \n */
        printf("  %-44s ", k);
        for (const char *p = val; *p; p++) {
            if (*p == '\n')
                fputs("\\n", stdout);
            else
                putchar(*p);
        }
        putchar('\n');
    }
    if (tensors) {
        int nt = gpe_model_tensor_count(m);
        printf("\ntensors (%d):\n", nt);
        for (int i = 0; i < nt; i++) {
            const char *name, *type;
            int64_t dims[4];
            int nd;
            uint64_t bytes;
            if (!gpe_model_tensor_info(m, i, &name, &type, dims, &nd, &bytes))
                continue;
            char shape[96];
            int off = 0;
            for (int d = 0; d < nd && off < (int)sizeof shape; d++)
                off += snprintf(shape + off, sizeof shape - (size_t)off, "%s%lld", d ? " x " : "",
                                (long long)dims[d]);
            printf("  %-32s %-6s %-20s %s\n", name, type, shape, gpr_bytes(bytes, b1, sizeof b1));
        }
    }
    gpe_model_free(m);
    return 0;
}

const gpr_cmd gpr_cmd_info = {
    "info", "show a model's metadata, tensors and memory needs", exec_info, usage,
};
