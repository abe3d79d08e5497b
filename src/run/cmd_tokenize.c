/*
 * gpupool-run tokenize: show how a text is tokenized.
 *
 * Default output: one line per token, "ID<TAB>'PIECE'" (the piece escaped
 * C-style). --ids prints just the ids as a JSON-style list, e.g. [1, 403].
 */
#include <getopt.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "run/run.h"

static const char *NAME = "tokenize";

static void usage(FILE *out)
{
    fprintf(out, "usage: gpupool-run tokenize -m FILE -p TEXT [--ids] [--no-bos] [--parse-special]\n\n"
                 "  -m, --model FILE     GGUF file (only the vocabulary is read)\n"
                 "  -p, --prompt TEXT    text to tokenize (required)\n"
                 "      --ids            print only the ids, as [a, b, c]\n"
                 "      --no-bos         do not add BOS/EOS (add_special off)\n"
                 "      --parse-special  turn special-token text such as <s> into its id\n"
                 "  -h, --help           this help\n");
}

static void print_escaped(const char *s, int n)
{
    putchar('\'');
    for (int i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') fputs("\\n", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c == '\\') fputs("\\\\", stdout);
        else if (c == '\'') fputs("\\'", stdout);
        else if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
        else putchar(c);
    }
    putchar('\'');
}

/* One line per token, its whole text (gpr_piece: a token may be longer
 * than any fixed buffer). 0, or 1 when a piece could not be rendered for
 * lack of memory: the listing stops there, said on stderr, rather than
 * show a token as '' (the lines before it are already out). */
static int print_pieces(const gpe_model *m, const int32_t *ids, int n)
{
    char *piece = NULL;
    size_t cap = 0;
    int rc = 0;
    for (int i = 0; i < n; i++) {
        int k = gpr_piece(m, ids[i], true, &piece, &cap);
        if (k < 0) {
            fflush(stdout);
            fprintf(stderr, "gpupool-run %s: token %d: out of memory\n", NAME, (int)ids[i]);
            rc = 1;
            break;
        }
        printf("%6d\t", (int)ids[i]);
        print_escaped(piece, k);
        putchar('\n');
    }
    free(piece);
    return rc;
}

static int exec_tokenize(int argc, char **argv)
{
    enum { O_IDS = 256, O_NOBOS, O_PARSE };
    static const struct option lo[] = {
        { "model", required_argument, 0, 'm' }, { "prompt", required_argument, 0, 'p' },
        { "ids", no_argument, 0, O_IDS },       { "no-bos", no_argument, 0, O_NOBOS },
        { "parse-special", no_argument, 0, O_PARSE }, { "help", no_argument, 0, 'h' },
        { 0, 0, 0, 0 },
    };
    const char *model = NULL, *prompt = NULL;
    bool ids_only = false, add_special = true, parse_special = false;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "m:p:h", lo, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'p': prompt = optarg; break;
        case O_IDS: ids_only = true; break;
        case O_NOBOS: add_special = false; break;
        case O_PARSE: parse_special = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "gpupool-run %s: unexpected argument '%s'\n", NAME, argv[optind]);
        return 2;
    }
    if (!model || !prompt) {
        fprintf(stderr, "gpupool-run %s: -m FILE and -p TEXT are required\n\n", NAME);
        usage(stderr);
        return 2;
    }
    gpe_model *m = gpr_load_model(NAME, model, true);
    if (!m)
        return 1;
    size_t len = strlen(prompt);
    int cap = (int)len + 8;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    int n = ids ? gpe_tokenize(m, prompt, len, add_special, parse_special, ids, cap) : INT32_MIN;
    if (n < 0 && n != INT32_MIN) {
        cap = -n;
        int32_t *bigger = realloc(ids, (size_t)cap * sizeof *ids);
        n = INT32_MIN;
        if (bigger) {
            ids = bigger;
            n = gpe_tokenize(m, prompt, len, add_special, parse_special, ids, cap);
        }
    }
    if (n < 0) {
        fprintf(stderr, "gpupool-run %s: tokenization failed%s\n", NAME,
                n == INT32_MIN ? ": out of memory" : "");
        free(ids);
        gpe_model_free(m);
        return 1;
    }
    int rc = 0;
    if (ids_only) {
        putchar('[');
        for (int i = 0; i < n; i++)
            printf("%s%d", i ? ", " : "", (int)ids[i]);
        printf("]\n");
    } else {
        rc = print_pieces(m, ids, n);
    }
    free(ids);
    gpe_model_free(m);
    return rc;
}

const gpr_cmd gpr_cmd_tokenize = {
    "tokenize", "tokenize a text with a model's vocabulary", exec_tokenize, usage,
};
