/*
 * gguf-random: write a GGUF v3 llama model with random weights, for
 * benchmarks and tests that need a model of a real shape without
 * downloading one.
 *
 *   gguf-random --shape tinyllama-1.1b --type q4_k --seed 1 -o tl.gguf
 *   gguf-random --shape llama2-7b --type q4_k_m --seed 7 -o 7b.gguf   (3.8 GiB)
 *   gguf-random --shape custom --n-embd 256 --n-layer 2 --n-head 4 --n-head-kv 2 \
 *               --n-ff 768 --n-vocab 512 --type q8_0 -o small.gguf
 *
 * The vocabulary is a synthetic SentencePiece-style ('llama') one: <unk>,
 * <s>, </s>, the 256 byte tokens <0x00>..<0xFF>, then made-up pieces, so
 * that the engine's tokenizer loads it. Tensors whose row length is not a
 * multiple of the chosen type's block size fall back to Q8_0, then F16 (as
 * llama.cpp's quantizer does with other fallbacks); norms are F32. q4_k
 * is Q4_K throughout; q4_k_m mixes in Q6_K where llama.cpp's Q4_K_M does
 * (output, and attn_v / ffn_down of some layers).
 * Data is generated and written row by row: memory stays small even for
 * multi-GB files.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/quant.h"

typedef struct opts {
    const char *shape, *type, *out;
    uint64_t seed;
    int n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, n_ctx;
    int pooling;    /* llama.pooling_type to write; -1 = none (the key is absent) */
} opts;

typedef struct tensor {
    char name[64];
    int n_dims;
    int64_t ne[2];
    gpe_type type;
    uint64_t offset, nbytes;
    float scale, bias;   /* value = bias + scale * uniform(-1, 1) */
} tensor;

static uint64_t g_rng;
static float rnd_uniform(void)
{
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    const uint64_t r = g_rng * 2685821657736338717ull;
    return (float)((double)(r >> 40) / 16777216.0) * 2.0f - 1.0f;
}

/* ----------------------------------------------------------- file writer */

typedef struct wr {
    FILE *f;
    uint64_t off;
    bool bad;
} wr;

static void w_raw(wr *w, const void *p, size_t n)
{
    if (!w->bad && n && fwrite(p, 1, n, w->f) != n)
        w->bad = true;
    w->off += n;
}
static void w_u32(wr *w, uint32_t v) { w_raw(w, &v, 4); }
static void w_u64(wr *w, uint64_t v) { w_raw(w, &v, 8); }
static void w_str(wr *w, const char *s)
{
    w_u64(w, strlen(s));
    w_raw(w, s, strlen(s));
}
static void w_pad(wr *w)
{
    static const uint8_t z[32];
    w_raw(w, z, (32 - w->off % 32) % 32);
}
enum { V_U32 = 4, V_I32 = 5, V_F32 = 6, V_BOOL = 7, V_STR = 8, V_ARR = 9 };
static void kv_u32(wr *w, const char *k, uint32_t v) { w_str(w, k); w_u32(w, V_U32); w_u32(w, v); }
static void kv_f32(wr *w, const char *k, float v) { w_str(w, k); w_u32(w, V_F32); w_raw(w, &v, 4); }
static void kv_bool(wr *w, const char *k, bool v)
{
    uint8_t b = v;
    w_str(w, k);
    w_u32(w, V_BOOL);
    w_raw(w, &b, 1);
}
static void kv_str(wr *w, const char *k, const char *v) { w_str(w, k); w_u32(w, V_STR); w_str(w, v); }

/* ------------------------------------------------------------ vocabulary */

/* Token i's text into buf (distinct for every i). */
static void token_text(int i, char *buf, size_t len)
{
    if (i == 0) { snprintf(buf, len, "<unk>"); return; }
    if (i == 1) { snprintf(buf, len, "<s>"); return; }
    if (i == 2) { snprintf(buf, len, "</s>"); return; }
    if (i < 259) { snprintf(buf, len, "<0x%02X>", i - 3); return; }
    /* bijective base-26 of k: a..z, aa..zz, ... (unique), some with the
     * SentencePiece word-start mark U+2581 */
    int k = i - 259;
    char tmp[16];
    int n = 0;
    for (int v = k + 1; v > 0 && n < 15; v = (v - 1) / 26)
        tmp[n++] = (char)('a' + (v - 1) % 26);
    size_t o = 0;
    if (k % 3 == 0) {
        memcpy(buf, "\xe2\x96\x81", 3);
        o = 3;
    }
    while (n > 0 && o + 1 < len)
        buf[o++] = tmp[--n];
    buf[o] = '\0';
}

/* ---------------------------------------------------------------- shapes */

static int set_shape(opts *o)
{
    if (strcmp(o->shape, "tinyllama-1.1b") == 0) {
        o->n_embd = 2048; o->n_layer = 22; o->n_head = 32; o->n_head_kv = 4;
        o->n_ff = 5632; o->n_vocab = 32000; o->n_ctx = 2048;
    } else if (strcmp(o->shape, "llama2-7b") == 0) {
        o->n_embd = 4096; o->n_layer = 32; o->n_head = 32; o->n_head_kv = 32;
        o->n_ff = 11008; o->n_vocab = 32000; o->n_ctx = 4096;
    } else if (strcmp(o->shape, "stories260k") == 0) {
        o->n_embd = 64; o->n_layer = 5; o->n_head = 8; o->n_head_kv = 4;
        o->n_ff = 172; o->n_vocab = 512; o->n_ctx = 512;
    } else if (strcmp(o->shape, "custom") != 0) {
        fprintf(stderr, "gguf-random: unknown --shape '%s' (tinyllama-1.1b, llama2-7b, "
                        "stories260k, custom)\n",
                o->shape);
        return -1;
    }
    if (o->n_embd <= 0 || o->n_layer <= 0 || o->n_head <= 0 || o->n_head_kv <= 0 ||
        o->n_ff <= 0 || o->n_ctx <= 0) {
        fprintf(stderr, "gguf-random: custom shape needs positive --n-embd --n-layer --n-head "
                        "--n-head-kv --n-ff (and --n-ctx)\n");
        return -1;
    }
    if (o->n_embd % o->n_head != 0 || o->n_head % o->n_head_kv != 0) {
        fprintf(stderr, "gguf-random: n_embd must be a multiple of n_head, and n_head of "
                        "n_head_kv\n");
        return -1;
    }
    if (o->n_vocab < 259) {
        fprintf(stderr, "gguf-random: n_vocab must be >= 259 (3 specials + 256 byte tokens)\n");
        return -1;
    }
    return 0;
}

#define TYPES "f32 | f16 | bf16 | q8_0 | q4_0 | q4_k | q4_k_m | q5_k | q6_k"

static gpe_type pick_type(gpe_type want, int64_t ne0)
{
    if (ne0 % gpe_type_block_size(want) == 0)
        return want;
    if (ne0 % GPE_QK == 0 && want != GPE_TYPE_F32 && want != GPE_TYPE_F16)
        return GPE_TYPE_Q8_0;
    return want == GPE_TYPE_F32 ? GPE_TYPE_F32 : GPE_TYPE_F16;
}

static void add_tensor(tensor *t, int *n, const char *name, int n_dims, int64_t ne0, int64_t ne1,
                       gpe_type type, float scale, float bias)
{
    tensor *x = &t[(*n)++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->n_dims = n_dims;
    x->ne[0] = ne0;
    x->ne[1] = ne1;
    x->type = n_dims == 1 ? GPE_TYPE_F32 : pick_type(type, ne0);
    x->nbytes = gpe_row_size(x->type, ne0) * (uint64_t)ne1;
    x->scale = scale;
    x->bias = bias;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: gguf-random [options] -o FILE\n"
            "  --shape S        tinyllama-1.1b | llama2-7b | stories260k | custom\n"
            "                   (default stories260k)\n"
            "  --type T         " TYPES " (default f16)\n"
            "  --seed N         random seed (default 1)\n"
            "  --n-embd N  --n-layer N  --n-head N  --n-head-kv N  --n-ff N  --n-vocab N\n"
            "  --n-ctx N        custom shape (n-ctx default 512)\n"
            "  --pooling N      write llama.pooling_type N (embeddings: 1 mean, 2 cls,\n"
            "                   3 last); default: no key\n"
            "  -o FILE          output path\n");
}

int main(int argc, char **argv)
{
    opts o = {.shape = "stories260k", .type = "f16", .seed = 1, .n_ctx = 512, .n_vocab = 512,
              .pooling = -1};
    static const struct option lo[] = {
        {"shape", required_argument, 0, 's'},   {"type", required_argument, 0, 't'},
        {"seed", required_argument, 0, 'S'},    {"n-embd", required_argument, 0, 1},
        {"n-layer", required_argument, 0, 2},   {"n-head", required_argument, 0, 3},
        {"n-head-kv", required_argument, 0, 4}, {"n-ff", required_argument, 0, 5},
        {"n-vocab", required_argument, 0, 6},   {"n-ctx", required_argument, 0, 7},
        {"pooling", required_argument, 0, 8},
        {"output", required_argument, 0, 'o'},  {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "o:h", lo, NULL)) != -1) {
        switch (c) {
        case 's': o.shape = optarg; break;
        case 't': o.type = optarg; break;
        case 'S': o.seed = strtoull(optarg, NULL, 10); break;
        case 1: o.n_embd = atoi(optarg); break;
        case 2: o.n_layer = atoi(optarg); break;
        case 3: o.n_head = atoi(optarg); break;
        case 4: o.n_head_kv = atoi(optarg); break;
        case 5: o.n_ff = atoi(optarg); break;
        case 6: o.n_vocab = atoi(optarg); break;
        case 7: o.n_ctx = atoi(optarg); break;
        case 8: o.pooling = atoi(optarg); break;
        case 'o': o.out = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!o.out) {
        usage(stderr);
        return 2;
    }
    if (set_shape(&o) != 0)
        return 2;
    gpe_type wt;
    uint32_t ftype;
    bool mix = false;
    if (strcmp(o.type, "f32") == 0) { wt = GPE_TYPE_F32; ftype = 0; }
    else if (strcmp(o.type, "f16") == 0) { wt = GPE_TYPE_F16; ftype = 1; }
    else if (strcmp(o.type, "q4_0") == 0) { wt = GPE_TYPE_Q4_0; ftype = 2; }
    else if (strcmp(o.type, "q8_0") == 0) { wt = GPE_TYPE_Q8_0; ftype = 7; }
    else if (strcmp(o.type, "q4_k") == 0) { wt = GPE_TYPE_Q4_K; ftype = 15; }
    else if (strcmp(o.type, "q4_k_m") == 0) { wt = GPE_TYPE_Q4_K; ftype = 15; mix = true; }
    else if (strcmp(o.type, "q5_k") == 0) { wt = GPE_TYPE_Q5_K; ftype = 16; }
    else if (strcmp(o.type, "q6_k") == 0) { wt = GPE_TYPE_Q6_K; ftype = 18; }
    else if (strcmp(o.type, "bf16") == 0) { wt = GPE_TYPE_BF16; ftype = 32; }
    else {
        fprintf(stderr, "gguf-random: unknown --type '%s' (%s)\n", o.type, TYPES);
        return 2;
    }
    g_rng = o.seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;

    const int64_t E = o.n_embd, F = o.n_ff, V = o.n_vocab;
    const int64_t Ekv = E / o.n_head * o.n_head_kv;
    const int n_t = 3 + 9 * o.n_layer;
    tensor *ts = calloc((size_t)n_t, sizeof *ts);
    if (!ts)
        return 1;
    int n = 0;
    char nm[64];
    const float ws = 0.05f;   /* uniform(-0.05, 0.05): std ~0.029, like a trained init */
    add_tensor(ts, &n, "token_embd.weight", 2, E, V, wt, ws, 0);
    for (int l = 0; l < o.n_layer; l++) {
        static const char *const names[] = {"attn_norm", "attn_q", "attn_k", "attn_v",
                                            "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
                                            "ffn_down"};
        const int64_t shape[9][2] = {{E, 1}, {E, E}, {E, Ekv}, {E, Ekv}, {E, E},
                                     {E, 1}, {E, F}, {E, F}, {F, E}};
        /* q4_k_m: attn_v and ffn_down in Q6_K on the first and last
         * eighth of the layers and every third one between (the layer
         * choice llama.cpp's Q4_K_M makes) */
        const int L = o.n_layer;
        const bool more = l < L / 8 || l >= 7 * L / 8 || (l - L / 8) % 3 == 2;
        for (int k = 0; k < 9; k++) {
            snprintf(nm, sizeof nm, "blk.%d.%s.weight", l, names[k]);
            const bool norm = shape[k][1] == 1;
            const gpe_type t = mix && more && (k == 3 || k == 8) ? GPE_TYPE_Q6_K : wt;
            add_tensor(ts, &n, nm, norm ? 1 : 2, shape[k][0], shape[k][1], t, norm ? 0.1f : ws,
                       norm ? 1.0f : 0.0f);
        }
    }
    add_tensor(ts, &n, "output_norm.weight", 1, E, 1, wt, 0.1f, 1.0f);
    add_tensor(ts, &n, "output.weight", 2, E, V, mix ? GPE_TYPE_Q6_K : wt, ws, 0);
    uint64_t data = 0;
    for (int i = 0; i < n; i++) {
        ts[i].offset = data;
        data += (ts[i].nbytes + 31) / 32 * 32;
    }

    wr w = {.f = fopen(o.out, "wb")};
    if (!w.f) {
        fprintf(stderr, "gguf-random: %s: %s\n", o.out, strerror(errno));
        return 1;
    }
    const int n_kv = 25 + (o.pooling >= 0);
    w_raw(&w, "GGUF", 4);
    w_u32(&w, 3);
    w_u64(&w, (uint64_t)n);
    w_u64(&w, (uint64_t)n_kv);
    char name[128];
    snprintf(name, sizeof name, "gguf-random %s %s seed %" PRIu64, o.shape, o.type, o.seed);
    kv_str(&w, "general.architecture", "llama");                              /* 1 */
    kv_str(&w, "general.name", name);
    kv_u32(&w, "general.file_type", ftype);
    kv_u32(&w, "general.quantization_version", 2);
    kv_u32(&w, "llama.context_length", (uint32_t)o.n_ctx);                    /* 5 */
    kv_u32(&w, "llama.embedding_length", (uint32_t)E);
    kv_u32(&w, "llama.block_count", (uint32_t)o.n_layer);
    kv_u32(&w, "llama.feed_forward_length", (uint32_t)F);
    kv_u32(&w, "llama.attention.head_count", (uint32_t)o.n_head);
    kv_u32(&w, "llama.attention.head_count_kv", (uint32_t)o.n_head_kv);     /* 10 */
    kv_f32(&w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    kv_u32(&w, "llama.rope.dimension_count", (uint32_t)(E / o.n_head));
    kv_f32(&w, "llama.rope.freq_base", 10000.0f);
    kv_u32(&w, "llama.vocab_size", (uint32_t)V);
    kv_str(&w, "tokenizer.ggml.model", "llama");                              /* 15 */
    kv_str(&w, "tokenizer.ggml.pre", "default");
    w_str(&w, "tokenizer.ggml.tokens");
    w_u32(&w, V_ARR);
    w_u32(&w, V_STR);
    w_u64(&w, (uint64_t)V);
    for (int i = 0; i < V; i++) {
        char tok[32];
        token_text(i, tok, sizeof tok);
        w_str(&w, tok);
    }
    w_str(&w, "tokenizer.ggml.scores");
    w_u32(&w, V_ARR);
    w_u32(&w, V_F32);
    w_u64(&w, (uint64_t)V);
    for (int i = 0; i < V; i++) {
        float s = i < 259 ? 0.0f : -(float)(i - 259);
        w_raw(&w, &s, 4);
    }
    w_str(&w, "tokenizer.ggml.token_type");                                   /* 19 */
    w_u32(&w, V_ARR);
    w_u32(&w, V_I32);
    w_u64(&w, (uint64_t)V);
    for (int i = 0; i < V; i++) {
        int32_t t = i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1;   /* unknown, control, byte, normal */
        w_raw(&w, &t, 4);
    }
    kv_u32(&w, "tokenizer.ggml.bos_token_id", 1);                             /* 20 */
    kv_u32(&w, "tokenizer.ggml.eos_token_id", 2);
    kv_u32(&w, "tokenizer.ggml.unknown_token_id", 0);
    kv_bool(&w, "tokenizer.ggml.add_bos_token", true);
    kv_bool(&w, "tokenizer.ggml.add_eos_token", false);
    kv_u32(&w, "general.alignment", 32);                                      /* 25 */
    if (o.pooling >= 0)
        kv_u32(&w, "llama.pooling_type", (uint32_t)o.pooling);
    for (int i = 0; i < n; i++) {
        w_str(&w, ts[i].name);
        w_u32(&w, (uint32_t)ts[i].n_dims);
        for (int d = 0; d < ts[i].n_dims; d++)
            w_u64(&w, (uint64_t)ts[i].ne[d]);
        w_u32(&w, ts[i].type);
        w_u64(&w, ts[i].offset);
    }
    w_pad(&w);
    const uint64_t base = w.off;
    float *row = malloc((size_t)(E > F ? E : F) * sizeof *row);
    uint8_t *q = malloc(gpe_row_size(GPE_TYPE_F32, E > F ? E : F));
    if (!row || !q)
        return 1;
    for (int i = 0; i < n && !w.bad; i++) {
        const tensor *t = &ts[i];
        const size_t rs = gpe_row_size(t->type, t->ne[0]);
        if (w.off != base + t->offset) {
            fprintf(stderr, "gguf-random: internal offset mismatch at %s\n", t->name);
            return 1;
        }
        for (int64_t r = 0; r < t->ne[1]; r++) {
            for (int64_t k = 0; k < t->ne[0]; k++)
                row[k] = t->bias + t->scale * rnd_uniform();
            if (!gpe_quantize_row(t->type, row, q, t->ne[0])) {
                fprintf(stderr, "gguf-random: cannot quantize %s to %s\n", t->name,
                        gpe_type_name(t->type));
                return 1;
            }
            w_raw(&w, q, rs);
        }
        w_pad(&w);
    }
    free(row);
    free(q);
    if (fclose(w.f) != 0 || w.bad) {
        fprintf(stderr, "gguf-random: %s: write failed: %s\n", o.out, strerror(errno));
        return 1;
    }
    uint64_t params = 0;
    for (int i = 0; i < n; i++)
        params += (uint64_t)(ts[i].ne[0] * ts[i].ne[1]);
    printf("wrote %s: %s, %d tensors, %" PRIu64 " parameters, %.1f MiB\n", o.out, name, n, params,
           (double)w.off / (1024.0 * 1024.0));
    free(ts);
    return 0;
}
