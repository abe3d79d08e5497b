/*
 * Architecture tests against llama.cpp (tests/data/arch, see its README):
 * one tiny random-weight GGUF per architecture (qwen2 F16 and Q8_0, qwen3,
 * llama3 with rope_freqs, phi3, gemma2, gemma3, Mixtral-style MoE), each
 * with llama.cpp's prompt ids, last-prompt-position logits and 32 greedy ids
 * for 3 prompts (F32 KV cache). For every file and prompt:
 *   - gpe_tokenize (add_special, no special parsing) gives llama.cpp's ids;
 *   - every logit at the last prompt position is within the file's tolerance
 *     (1e-2 for F16 files; 2e-2 for the Q8_0 one, whose README bound is 0.25
 *     for F32 activations: this engine quantizes activations to Q8_0 as
 *     llama.cpp does and lands within 1e-5);
 *   - the 32 greedy ids are identical. The only allowed difference is the
 *     README's near-tie: at a step whose reference margin (top1 - runner-up)
 *     is below twice the tolerance, picking llama.cpp's runner-up ends the
 *     comparison (later ids are no longer comparable); anything else fails.
 * Each file's worst logit difference and greedy match count are printed.
 *
 * Then crafted GGUFs that the engine must refuse at load with one line
 * naming what is missing: an unknown architecture, a tensor type without a
 * dot product, a tensor no supported architecture uses (a feature the
 * forward pass would skip), qwen2 without its biases, and Mixtral's old
 * one-tensor-per-expert layout; and the agent's gguf backend refusing the
 * model with that line.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cmocka.h>
#include <jansson.h>

#include <unistd.h>

#ifdef HAVE_AGENT_GGUF
#include "agent/backend.h"
#endif
#include "gpupool/engine.h"

#define N_GEN 32
#define MAX_PROMPT 128

static json_t *load_ref(const char *base)
{
    char path[512];
    snprintf(path, sizeof path, "%s/arch/%s.json", GP_TEST_DATA, base);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j)
        fail_msg("cannot load %s: %s (line %d)", path, je.text, je.line);
    return j;
}

static int32_t argmax(const float *v, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

static int json_ids(json_t *arr, int32_t *out, int max)
{
    int n = (int)json_array_size(arr);
    assert_true(n <= max);
    for (int i = 0; i < n; i++)
        out[i] = (int32_t)json_integer_value(json_array_get(arr, (size_t)i));
    return n;
}

static double jnum(json_t *arr, size_t i)
{
    return json_number_value(json_array_get(arr, i));
}

/* Runs one architecture file: arch name expected in the model info, logit
 * tolerance. Returns nothing; fails the test on any mismatch. */
static void check_arch_on(const char *base, const char *arch, double tol,
                          gpe_backend_kind backend);
static void check_arch(const char *base, const char *arch, double tol)
{
    check_arch_on(base, arch, tol, GPE_BACKEND_CPU);
}

static void check_arch_on(const char *base, const char *arch, double tol,
                          gpe_backend_kind backend)
{
    json_t *ref = load_ref(base);
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/arch/%s.gguf", GP_MODEL_DATA, base);
    gpe_model *m = NULL;
    gpe_model_params mp = gpe_model_default_params();
    mp.backend = backend;
    gpe_status st = gpe_model_load(path, &mp, &m, err, sizeof err);
    if (st != GPE_OK)
        fail_msg("load %s: %s: %s", base, gpe_status_name(st), err);
    gpe_model_info info;
    gpe_model_get_info(m, &info);
    assert_string_equal(info.arch, arch);
    const int nv = gpe_model_n_vocab(m);
    assert_int_equal(nv, (int)json_integer_value(json_object_get(ref, "n_vocab")));

    json_t *prompts = json_object_get(ref, "prompts");
    assert_int_equal(json_array_size(prompts), 3);
    double worst = 0.0;
    int matched_total = 0, compared_total = 0;
    for (size_t pi = 0; pi < json_array_size(prompts); pi++) {
        json_t *pj = json_array_get(prompts, pi);
        const char *prompt = json_string_value(json_object_get(pj, "prompt"));
        int32_t want[MAX_PROMPT], ids[MAX_PROMPT], gen[N_GEN];
        int np = json_ids(json_object_get(pj, "prompt_ids"), want, MAX_PROMPT);
        assert_int_equal(json_ids(json_object_get(pj, "greedy_ids"), gen, N_GEN), N_GEN);

        int n = gpe_tokenize(m, prompt, strlen(prompt), true, false, ids, MAX_PROMPT);
        if (n != np || memcmp(ids, want, (size_t)n * sizeof ids[0]) != 0) {
            char got[1024] = "", exp[1024] = "";
            for (int i = 0; i < n && i < 100; i++)
                snprintf(got + strlen(got), sizeof got - strlen(got), " %d", ids[i]);
            for (int i = 0; i < np; i++)
                snprintf(exp + strlen(exp), sizeof exp - strlen(exp), " %d", want[i]);
            fail_msg("%s prompt %zu: tokens [%s ] (n=%d), llama.cpp [%s ] (n=%d)", base, pi, got,
                     n, exp, np);
        }

        gpe_ctx *c = NULL;
        gpe_ctx_params cp = gpe_ctx_default_params();
        cp.n_ctx = 256;
        cp.n_threads = 2;
        st = gpe_ctx_init(m, &cp, &c, err, sizeof err);
        if (st != GPE_OK)
            fail_msg("ctx %s: %s", base, err);
        gpe_batch *b = gpe_batch_init(n);
        assert_non_null(b);
        for (int i = 0; i < n; i++)
            assert_int_equal(gpe_batch_add(b, ids[i], i, 0, i == n - 1), i);
        if (gpe_decode(c, b, err, sizeof err) != GPE_OK)
            fail_msg("decode %s: %s", base, err);
        const float *lg = gpe_get_logits(c, n - 1);
        assert_non_null(lg);

        json_t *last = json_object_get(pj, "last_logits");
        assert_int_equal((int)json_array_size(last), nv);
        double mx = 0.0;
        int at = 0;
        for (int i = 0; i < nv; i++) {
            double d = fabs((double)lg[i] - jnum(last, (size_t)i));
            if (!(d <= mx)) { /* also catches NaN */
                mx = d;
                at = i;
            }
        }
        if (!(mx <= tol))
            fail_msg("%s prompt %zu: logit %d is %g, llama.cpp %g (|diff| %g > %g)", base, pi,
                     at, (double)lg[at], jnum(last, (size_t)at), mx, tol);
        if (mx > worst)
            worst = mx;

        json_t *top1 = json_object_get(pj, "greedy_top1_logit");
        json_t *ru_id = json_object_get(pj, "greedy_runner_up_ids");
        json_t *ru = json_object_get(pj, "greedy_runner_up_logit");
        int32_t tok = argmax(lg, nv);
        int matched = 0;
        for (int g = 0; g < N_GEN; g++) {
            if (tok != gen[g]) {
                double margin = jnum(top1, (size_t)g) - jnum(ru, (size_t)g);
                int32_t runner = (int32_t)json_integer_value(json_array_get(ru_id, (size_t)g));
                if (tok == runner && margin < 2.0 * tol) {
                    print_message("%s prompt %zu: near-tie at step %d (margin %g): %d vs %d\n",
                                  base, pi, g, margin, tok, gen[g]);
                    break;
                }
                fail_msg("%s prompt %zu: greedy step %d is %d, llama.cpp %d (margin %g)", base,
                         pi, g, tok, gen[g], margin);
            }
            matched++;
            if (g == N_GEN - 1)
                break;
            gpe_batch_clear(b);
            gpe_batch_add(b, tok, n + g, 0, true);
            if (gpe_decode(c, b, err, sizeof err) != GPE_OK)
                fail_msg("decode %s step %d: %s", base, g, err);
            tok = argmax(gpe_get_logits(c, 0), nv);
        }
        matched_total += matched;
        compared_total += N_GEN;
        gpe_batch_free(b);
        gpe_ctx_free(c);
    }
    print_message("%-28s %s max |logit diff| %.3g (tol %g), greedy %d/%d\n", base,
                  backend == GPE_BACKEND_CUDA ? "CUDA" : "CPU", worst, tol, matched_total,
                  compared_total);
    gpe_model_free(m);
    json_decref(ref);
}

static void test_qwen2(void **s) { (void)s; check_arch("tiny-random-qwen2-f16", "qwen2", 1e-2); }
static void test_qwen2_q8_0(void **s)
{
    (void)s;
    check_arch("tiny-random-qwen2-q8_0", "qwen2", 2e-2);
}
static void test_qwen3(void **s) { (void)s; check_arch("tiny-random-qwen3-f16", "qwen3", 1e-2); }
static void test_llama3(void **s) { (void)s; check_arch("tiny-random-llama3-f16", "llama", 1e-2); }
static void test_phi3(void **s) { (void)s; check_arch("tiny-random-phi3-f16", "phi3", 1e-2); }
static void test_gemma2(void **s) { (void)s; check_arch("tiny-random-gemma2-f16", "gemma2", 1e-2); }
static void test_gemma3(void **s) { (void)s; check_arch("tiny-random-gemma3-f16", "gemma3", 1e-2); }
static void test_mixtral(void **s)
{
    (void)s;
    check_arch("tiny-random-mixtral-f16", "llama", 1e-2);
}

/* On a GPU the CUDA backend is checked the same way (it keeps activations
 * in F32, so the Q8_0 file gets the README's F32-activation bound 0.25 and
 * its near-tie rule), and refuses the MoE file at context creation with one
 * line. Skipped without a device. */
static void test_cuda_archs(void **s)
{
    (void)s;
    if (!gpe_cuda_available()) {
        print_message("skipped: no CUDA device (or backend not built)\n");
        skip();
        return;
    }
    check_arch_on("tiny-random-llama3-f16", "llama", 1e-2, GPE_BACKEND_CUDA);
    check_arch_on("tiny-random-qwen2-f16", "qwen2", 1e-2, GPE_BACKEND_CUDA);
    check_arch_on("tiny-random-qwen2-q8_0", "qwen2", 0.25, GPE_BACKEND_CUDA);
    check_arch_on("tiny-random-qwen3-f16", "qwen3", 1e-2, GPE_BACKEND_CUDA);
    check_arch_on("tiny-random-phi3-f16", "phi3", 1e-2, GPE_BACKEND_CUDA);
    check_arch_on("tiny-random-gemma2-f16", "gemma2", 1e-2, GPE_BACKEND_CUDA);
    check_arch_on("tiny-random-gemma3-f16", "gemma3", 1e-2, GPE_BACKEND_CUDA);

    char path[512], err[256] = "";
    snprintf(path, sizeof path, "%s/arch/tiny-random-mixtral-f16.gguf", GP_MODEL_DATA);
    gpe_model_params mp = gpe_model_default_params();
    mp.backend = GPE_BACKEND_CUDA;
    gpe_model *m = NULL;
    assert_int_equal(gpe_model_load(path, &mp, &m, err, sizeof err), GPE_OK);
    gpe_ctx_params cp = gpe_ctx_default_params();
    cp.n_ctx = 256;
    gpe_ctx *c = NULL;
    assert_int_equal(gpe_ctx_init(m, &cp, &c, err, sizeof err), GPE_ERR_UNSUPPORTED);
    assert_null(c);
    assert_non_null(strstr(err, "mixture-of-experts"));
    gpe_model_free(m);
}

/* ------------------------------------------------------- chat templates */

/* The phi3 file carries Phi-3's chat template (the version in llama.cpp's
 * phi-3 test vocabulary): it is detected as the phi-3 family, and a
 * conversation renders as that template does (its bos_token comes from the
 * tokenizer's add_bos), with <|user|>, <|assistant|> and <|end|> each one
 * special token and <|end|> ending generation. */
static void test_phi3_chat(void **state)
{
    (void)state;
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/arch/tiny-random-phi3-f16.gguf", GP_MODEL_DATA);
    gpe_model_params mp = gpe_model_default_params();
    mp.vocab_only = true;
    gpe_model *m = NULL;
    if (gpe_model_load(path, &mp, &m, err, sizeof err) != GPE_OK)
        fail_msg("load: %s", err);
    gpe_model_info info;
    gpe_model_get_info(m, &info);
    assert_string_equal(info.chat_format, "phi-3");
    const gpe_chat_msg msgs[] = {
        { "user", "Hi" }, { "assistant", "Yo" }, { "user", "Why?" },
    };
    char *txt = gpe_chat_apply(m, msgs, 3, true, err, sizeof err);
    assert_non_null(txt);
    assert_string_equal(txt, "<|user|>\nHi<|end|>\n<|assistant|>\nYo<|end|>\n<|user|>\nWhy?"
                             "<|end|>\n<|assistant|>\n");
    int32_t ids[64];
    int n = gpe_tokenize(m, txt, strlen(txt), true, true, ids, 64);
    assert_true(n > 6);
    assert_int_equal(ids[0], 1);       /* <s>: the template's bos_token */
    assert_int_equal(ids[1], 32010);   /* <|user|> */
    int n_end = 0, n_asst = 0;
    for (int i = 0; i < n; i++) {
        n_end += ids[i] == 32007;
        n_asst += ids[i] == 32001;
    }
    assert_int_equal(n_end, 3);
    assert_int_equal(n_asst, 2);
    assert_true(gpe_token_is_eog(m, 32007));
    free(txt);
    gpe_model_free(m);
}

/* ------------------------------------------------ crafted, refused GGUFs */

typedef struct wbuf { unsigned char *p; size_t n, cap; } wbuf;
static void wput(wbuf *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void w32(wbuf *b, uint32_t v) { wput(b, &v, 4); }
static void w64(wbuf *b, uint64_t v) { wput(b, &v, 8); }
static void wstr(wbuf *b, const char *s) { w64(b, strlen(s)); wput(b, s, strlen(s)); }
static void kv_str(wbuf *b, const char *k, const char *v) { wstr(b, k); w32(b, 8); wstr(b, v); }
static void kv_u32(wbuf *b, const char *k, uint32_t v) { wstr(b, k); w32(b, 4); w32(b, v); }

/* A tensor: name, GGUF type (0 F32, 16 IQ2_XXS), up to 3 dims. */
typedef struct tdesc { const char *name; uint32_t type; int64_t ne[3]; } tdesc;

static size_t tbytes(const tdesc *t)
{
    size_t rows = (size_t)(t->ne[1] ? t->ne[1] : 1) * (size_t)(t->ne[2] ? t->ne[2] : 1);
    size_t row = t->type == 16 ? (size_t)t->ne[0] / 256 * 66 : (size_t)t->ne[0] * 4;
    return rows * row;
}

/* Tiny llama-shaped model (E 32, 4 heads, 1 layer, n_ff 64, 8-token
 * vocabulary with a tokenizer) in arch `arch`; extra_kv / extra tensors are
 * appended and tensor `drop` (if any) left out; tensor `type16` gets type
 * IQ2_XXS (ne0 256). Returns the path (static buffer). */
static const char *write_model(const char *arch, const char *drop, const char *type16,
                               const char *const *kv_keys, const uint32_t *kv_vals, int n_kv_x,
                               const tdesc *extra, int n_extra)
{
    static char path[256];
    snprintf(path, sizeof path, "/tmp/gpe_test_arch_%d.gguf", (int)getpid());
    const int E = type16 ? 256 : 32;
    tdesc base[] = {
        { "token_embd.weight", 0, { E, 8, 0 } },     { "output_norm.weight", 0, { E, 0, 0 } },
        { "blk.0.attn_norm.weight", 0, { E, 0, 0 } }, { "blk.0.attn_q.weight", 0, { E, E, 0 } },
        { "blk.0.attn_k.weight", 0, { E, E, 0 } },    { "blk.0.attn_v.weight", 0, { E, E, 0 } },
        { "blk.0.attn_output.weight", 0, { E, E, 0 } }, { "blk.0.ffn_norm.weight", 0, { E, 0, 0 } },
        { "blk.0.ffn_gate.weight", 0, { E, 64, 0 } }, { "blk.0.ffn_up.weight", 0, { E, 64, 0 } },
        { "blk.0.ffn_down.weight", 0, { 64, E, 0 } },
    };
    tdesc ts[32];
    int nt = 0;
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++) {
        if (drop && strcmp(base[i].name, drop) == 0)
            continue;
        ts[nt] = base[i];
        if (type16 && strcmp(ts[nt].name, type16) == 0)
            ts[nt].type = 16;
        nt++;
    }
    for (int i = 0; i < n_extra; i++)
        ts[nt++] = extra[i];

    wbuf kv = { 0 };
    int n_kv = 0;
    char key[128];
#define KU(suffix, v) (snprintf(key, sizeof key, "%s." suffix, arch), kv_u32(&kv, key, v), n_kv++)
    kv_str(&kv, "general.architecture", arch), n_kv++;
    KU("embedding_length", (uint32_t)E);
    KU("block_count", 1);
    KU("feed_forward_length", 64);
    KU("attention.head_count", 4);
    KU("context_length", 64);
#undef KU
    for (int i = 0; i < n_kv_x; i++) {
        snprintf(key, sizeof key, "%s.%s", arch, kv_keys[i]);
        kv_u32(&kv, key, kv_vals[i]), n_kv++;
    }
    kv_str(&kv, "tokenizer.ggml.model", "llama"), n_kv++;
    static const char *toks[8] = { "<unk>", "<s>", "</s>", ("\xe2\x96\x81" "a"),
                                   "a",     "b",   "c",    "d" };
    wstr(&kv, "tokenizer.ggml.tokens");
    w32(&kv, 9); /* array */
    w32(&kv, 8); /* of string */
    w64(&kv, 8);
    for (int i = 0; i < 8; i++)
        wstr(&kv, toks[i]);
    n_kv++;

    wbuf b = { 0 };
    wput(&b, "GGUF", 4);
    w32(&b, 3);
    w64(&b, (uint64_t)nt);
    w64(&b, (uint64_t)n_kv);
    wput(&b, kv.p, kv.n);
    uint64_t off = 0;
    for (int i = 0; i < nt; i++) {
        int nd = ts[i].ne[2] ? 3 : ts[i].ne[1] ? 2 : 1;
        wstr(&b, ts[i].name);
        w32(&b, (uint32_t)nd);
        for (int d = 0; d < nd; d++)
            w64(&b, (uint64_t)ts[i].ne[d]);
        w32(&b, ts[i].type);
        w64(&b, off);
        off += (tbytes(&ts[i]) + 31) & ~(uint64_t)31;
    }
    while (b.n % 32)
        wput(&b, "", 1);
    for (int i = 0; i < nt; i++) {
        size_t n = (tbytes(&ts[i]) + 31) & ~(size_t)31;
        unsigned char *z = calloc(1, n);
        assert_non_null(z);
        wput(&b, z, n);
        free(z);
    }
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b.p, 1, b.n, f), b.n);
    fclose(f);
    free(b.p);
    free(kv.p);
    return path;
}

/* Loads path, expects status st and an error that is one line containing
 * each of the given strings. */
static void expect_refused(const char *path, gpe_status want, const char *s1, const char *s2)
{
    char err[512] = "";
    gpe_model *m = NULL;
    gpe_status st = gpe_model_load(path, NULL, &m, err, sizeof err);
    print_message("refused: %s (%s)\n", err, gpe_status_name(st));
    assert_int_equal(st, want);
    assert_null(m);
    assert_null(strchr(err, '\n'));
    if (s1 && !strstr(err, s1))
        fail_msg("'%s' does not name '%s'", err, s1);
    if (s2 && !strstr(err, s2))
        fail_msg("'%s' does not name '%s'", err, s2);
}

static void test_crafted_loads(void **state)
{
    (void)state;
    /* the base file itself loads: each refusal below is its one change */
    const char *path = write_model("llama", NULL, NULL, NULL, NULL, 0, NULL, 0);
    char err[512] = "";
    gpe_model *m = NULL;
    if (gpe_model_load(path, NULL, &m, err, sizeof err) != GPE_OK)
        fail_msg("base model: %s", err);
    gpe_model_free(m);
    /* expert_count 0 (written by some converters for dense files) is dense */
    static const char *const keys[] = { "expert_count", "expert_used_count" };
    static const uint32_t zeros[] = { 0, 0 };
    path = write_model("llama", NULL, NULL, keys, zeros, 2, NULL, 0);
    if (gpe_model_load(path, NULL, &m, err, sizeof err) != GPE_OK)
        fail_msg("dense model with expert_count 0: %s", err);
    gpe_model_free(m);
    /* the same file as qwen2 loads once its three biases are there */
    const tdesc bias[] = { { "blk.0.attn_q.bias", 0, { 32, 0, 0 } },
                           { "blk.0.attn_k.bias", 0, { 32, 0, 0 } },
                           { "blk.0.attn_v.bias", 0, { 32, 0, 0 } } };
    path = write_model("qwen2", NULL, NULL, NULL, NULL, 0, bias, 3);
    if (gpe_model_load(path, NULL, &m, err, sizeof err) != GPE_OK)
        fail_msg("qwen2 model: %s", err);
    gpe_model_free(m);
    unlink(path);
}

static void test_refuse_arch(void **state)
{
    (void)state;
    const char *path = write_model("mamba", NULL, NULL, NULL, NULL, 0, NULL, 0);
    expect_refused(path, GPE_ERR_UNSUPPORTED, "unsupported architecture 'mamba'", "qwen2");
    unlink(path);
}

static void test_refuse_type(void **state)
{
    (void)state;
    const char *path = write_model("llama", NULL, "blk.0.attn_q.weight", NULL, NULL, 0, NULL, 0);
    expect_refused(path, GPE_ERR_UNSUPPORTED, "'blk.0.attn_q.weight'", "IQ2_XXS");
    unlink(path);
}

static void test_refuse_unused_tensor(void **state)
{
    (void)state;
    /* per-head q/k norms are qwen3/gemma3's: a llama file with them would
     * run without them, so it is refused naming the tensor */
    const tdesc extra[] = { { "blk.0.attn_q_norm.weight", 0, { 8, 0, 0 } } };
    const char *path = write_model("llama", NULL, NULL, NULL, NULL, 0, extra, 1);
    expect_refused(path, GPE_ERR_UNSUPPORTED, "'blk.0.attn_q_norm.weight'", "not used");
    unlink(path);
}

static void test_refuse_missing_bias(void **state)
{
    (void)state;
    const char *path = write_model("qwen2", NULL, NULL, NULL, NULL, 0, NULL, 0);
    expect_refused(path, GPE_ERR_FORMAT, "'blk.0.attn_q.bias'", "missing");
    unlink(path);
}

static void test_refuse_old_moe_layout(void **state)
{
    (void)state;
    const tdesc extra[] = { { "blk.0.ffn_gate_inp.weight", 0, { 32, 2, 0 } },
                            { "blk.0.ffn_gate.0.weight", 0, { 32, 64, 0 } } };
    static const char *const keys[] = { "expert_count", "expert_used_count" };
    static const uint32_t vals[] = { 2, 1 };
    const char *path = write_model("llama", "blk.0.ffn_gate.weight", NULL, keys, vals, 1, extra, 2);
    /* expert_used_count absent: named */
    expect_refused(path, GPE_ERR_FORMAT, "expert_used_count", NULL);
    path = write_model("llama", "blk.0.ffn_gate.weight", NULL, keys, vals, 2, extra, 2);
    expect_refused(path, GPE_ERR_UNSUPPORTED, "'blk.0.ffn_gate.0.weight'", "ffn_*_exps");
    unlink(path);
}

#ifdef HAVE_AGENT_GGUF
/* The agent's gguf backend does not come up on a model the engine refuses,
 * and says why in the engine's words. */
static void test_agent_refuses(void **state)
{
    (void)state;
    const char *path = write_model("mamba", NULL, NULL, NULL, NULL, 0, NULL, 0);
    agent_options o;
    memset(&o, 0, sizeof o);
    o.model = (char *)path;
    o.slots = 1;
    char err[512] = "";
    assert_null(agent_backend_gguf_create(&o, err, sizeof err));
    print_message("agent: %s\n", err);
    assert_non_null(strstr(err, "unsupported architecture 'mamba'"));
    assert_non_null(strstr(err, "UNSUPPORTED"));
    assert_null(strchr(err, '\n'));
    unlink(path);
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_qwen2),
        cmocka_unit_test(test_qwen2_q8_0),
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_phi3),
        cmocka_unit_test(test_gemma2),
        cmocka_unit_test(test_gemma3),
        cmocka_unit_test(test_mixtral),
        cmocka_unit_test(test_cuda_archs),
        cmocka_unit_test(test_phi3_chat),
        cmocka_unit_test(test_crafted_loads),
        cmocka_unit_test(test_refuse_arch),
        cmocka_unit_test(test_refuse_type),
        cmocka_unit_test(test_refuse_unused_tensor),
        cmocka_unit_test(test_refuse_missing_bias),
        cmocka_unit_test(test_refuse_old_moe_layout),
#ifdef HAVE_AGENT_GGUF
        cmocka_unit_test(test_agent_refuses),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
