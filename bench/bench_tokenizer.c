/* Tokenizer throughput on 1 MB inputs (printed only).
 *
 *   bench_tokenizer [vocab.gguf ...]
 *
 * Without arguments it uses the llama-spm, gpt-2, llama-spm and deepseek-llm
 * vocabularies of tests/data/vocab. Inputs: mixed prose/code/emoji/CJK text,
 * and 1 MB runs of one character (the worst cases for merges and splits).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/gguf.h"
#include "engine/tokenizer.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void run(const gpe_tokenizer *t, const char *label, const char *text, size_t len,
                int32_t *ids, int max)
{
    double t0 = now_s();
    int n = gpe_tokenizer_encode(t, text, len, false, false, ids, max);
    double dt = now_s() - t0;
    printf("  %-22s %8d tokens %8.3f s %7.2f MB/s\n", label, n, dt, (double)len / dt / 1e6);
}

static void bench_file(const char *path)
{
    char err[256];
    gpe_gguf *g = NULL;
    double t0 = now_s();
    if (gpe_gguf_open(path, &g, err, sizeof err) != 0) {
        fprintf(stderr, "%s: %s\n", path, err);
        return;
    }
    gpe_tokenizer *t = gpe_tokenizer_load(g, err, sizeof err);
    gpe_gguf_close(g);
    if (!t) {
        fprintf(stderr, "%s: %s\n", path, err);
        return;
    }
    printf("%s (%s, pre %s, %d tokens): load %.3f s\n", path, gpe_tokenizer_kind(t),
           gpe_tokenizer_pre(t), gpe_tokenizer_n_vocab(t), now_s() - t0);
    size_t len = 1 << 20;
    char *text = malloc(len);
    int max = (int)len + 16;
    int32_t *ids = malloc((size_t)max * sizeof *ids);
    static const char sample[] =
        "Once upon a time, there was a little girl named Lily. She loved 3.14159 and "
        "\xF0\x9F\xA6\x99 llamas; \"we'll go\" \t\n  for (int i = 0; i < n; i++) { x[i] = 0; }\n"
        "нещо на Български 我想在apple工作 ";
    for (size_t i = 0; i < len; i++)
        text[i] = sample[i % (sizeof sample - 1)];
    run(t, "1 MB mixed text", text, len, ids, max);
    static const char fills[] = "a 7\n!";
    for (size_t f = 0; f < sizeof fills - 1; f++) {
        char label[32];
        memset(text, fills[f], len);
        snprintf(label, sizeof label, "1 MB of 0x%02x", (unsigned char)fills[f]);
        run(t, label, text, len, ids, max);
    }
    free(ids);
    free(text);
    gpe_tokenizer_free(t);
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        for (int i = 1; i < argc; i++)
            bench_file(argv[i]);
        return 0;
    }
    static const char *const names[] = {"llama-spm", "gpt-2", "deepseek-llm", "mpt"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/tests/data/vocab/ggml-vocab-%s.gguf", GP_SOURCE_DIR,
                 names[i]);
        bench_file(path);
    }
    return 0;
}
