/*
 * libFuzzer target: tool calls read out of generated text
 * (src/engine/toolcall.c) on arbitrary bytes.
 *
 * Input: byte 0 picks the family (chatml, llama-3, mistral), byte 1 the
 * piece size the text is fed in (1..16, 0: whole); the rest is the text.
 * Checked, beyond no crash:
 *   - the content and the calls do not depend on how the text was cut;
 *   - without a call, the content is exactly the text (nothing lost,
 *     nothing added);
 *   - with calls, the content is no longer than the text.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gpupool/engine.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const families[] = {"chatml", "llama-3", "mistral"};

typedef struct run_out {
    char *content;
    size_t len;
    size_t n_calls;
    char *calls;   /* name \0 args \0 ... */
    size_t calls_len;
} run_out;

static void add(char **b, size_t *len, const char *s, size_t n)
{
    char *p = realloc(*b, *len + n + 1);
    if (!p)
        abort();
    memcpy(p + *len, s, n);
    *len += n;
    p[*len] = '\0';
    *b = p;
}

static void run(const char *fam, const char *text, size_t n, size_t step, run_out *o)
{
    memset(o, 0, sizeof *o);
    gpe_toolparse *p = gpe_toolparse_new(fam);
    if (!p)
        abort();
    const char *emit;
    size_t elen;
    for (size_t at = 0; at < n;) {
        size_t k = step && n - at > step ? step : n - at;
        if (gpe_toolparse_feed(p, text + at, k, &emit, &elen) != GPE_OK)
            abort();
        add(&o->content, &o->len, emit, elen);
        at += k;
    }
    gpe_toolparse_finish(p, &emit, &elen);
    add(&o->content, &o->len, emit, elen);
    o->n_calls = gpe_toolparse_n_calls(p);
    for (size_t i = 0; i < o->n_calls; i++) {
        const char *nm, *a;
        if (!gpe_toolparse_call(p, i, &nm, &a))
            abort();
        add(&o->calls, &o->calls_len, nm, strlen(nm) + 1);
        add(&o->calls, &o->calls_len, a, strlen(a) + 1);
    }
    gpe_toolparse_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    const char *fam = families[data[0] % 3];
    size_t step = data[1] % 17;
    /* a copy without its terminator: ASan sees any read past the text */
    size_t n = size - 2;
    char *text = malloc(n ? n : 1);
    if (!text)
        return 0;
    memcpy(text, data + 2, n);
    run_out whole, cut;
    run(fam, text, n, 0, &whole);
    run(fam, text, n, step, &cut);
    if (whole.len != cut.len || (whole.len && memcmp(whole.content, cut.content, whole.len)) ||
        whole.n_calls != cut.n_calls || whole.calls_len != cut.calls_len ||
        (whole.calls_len && memcmp(whole.calls, cut.calls, whole.calls_len)))
        abort();
    if (whole.n_calls == 0 && (whole.len != n || (n && memcmp(whole.content, text, n))))
        abort();
    if (whole.len > n)
        abort();
    free(whole.content);
    free(whole.calls);
    free(cut.content);
    free(cut.calls);
    free(text);
    return 0;
}
