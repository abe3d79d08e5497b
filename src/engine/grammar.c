/*
 * grammar: JSON-Schema-constrained sampling over a model's vocabulary
 * (engine.h gpe_grammar_*, gpe_schema_check). A compiled schema
 * (jschema.c), a matcher state (jsongram.c), and each token's bytes.
 *
 * The mask of one step: the 256 first bytes are tried once on the state;
 * a token whose first byte fails is out at once (most of the vocabulary in
 * structural positions). Inside a string, a token of plain text (whole
 * UTF-8 characters, no quote, backslash or control byte) needs only its
 * character count (most of the vocabulary there). Inside a pattern string
 * such a token's characters step the pattern's automaton directly, from the
 * state after its first byte (one step per first byte, shared by the tokens
 * that start with it). Only the rest is fed byte by byte on a copy of the
 * state. Every accepted token must also leave the
 * value completable in the tokens that remain (gpe_jg_remaining <= left -
 * 1, one byte per token being always possible: byte-fallback or byte-level
 * vocabularies), which is how a string without maxLength still closes
 * before max_tokens.
 */
#include <gpupool/engine.h>

#include "jschema.h"
#include "jsongram.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Each token's bytes and what the mask needs to know of them: built once
 * per model, read-only, shared by every grammar of that model. */
struct gpe_grammar_vocab {
    int n_vocab;
    uint32_t *off;         /* [n_vocab + 1] into bytes */
    uint8_t *bytes;
    uint8_t *plain;        /* [n_vocab] chars of a plain-text token (0: not plain) */
    bool *eog;
    int32_t *by_first;     /* token ids grouped by first byte (non-empty, not eog) */
    int first_at[257];     /* group of byte c: by_first[first_at[c] .. first_at[c + 1]) */
    int32_t *nonplain;     /* non-empty, non-eog tokens that are not plain text */
    int n_nonplain;
    int32_t *eogs;         /* end-of-generation ids */
    int n_eogs;
};

struct gpe_grammar {
    gpe_jschema *prog;
    const gpe_grammar_vocab *v;
    gpe_grammar_vocab *owned;   /* gpe_grammar_init's own vocab, else NULL */
    gpe_jg_state st;
    bool ended;            /* an end-of-generation token was accepted */
    float *masked;         /* [n_vocab] */
    gpe_jg_state trial;
    gpe_jg_state after1;   /* the state after a first byte (second-byte filter) */
};

static void seterr(char *err, size_t errlen, const char *msg)
{
    if (err && errlen)
        snprintf(err, errlen, "%s", msg);
}

/* Characters of a plain-text token (whole UTF-8 characters, nothing a JSON
 * string must escape), 0 when it is not one. */
static uint8_t plain_chars(const uint8_t *b, int n)
{
    int chars = 0;
    for (int i = 0; i < n;) {
        uint8_t c = b[i];
        int len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3
                : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (!len || c < 0x20 || c == '"' || c == '\\' || i + len > n)
            return 0;
        /* validity of the continuation bytes is left to the full check */
        if (len > 1) {
            for (int k = 1; k < len; k++)
                if ((b[i + k] & 0xC0) != 0x80)
                    return 0;
            if (c < 0xC2 || c > 0xF4 || (c == 0xE0 && b[i + 1] < 0xA0) ||
                (c == 0xED && b[i + 1] > 0x9F) || (c == 0xF0 && b[i + 1] < 0x90) ||
                (c == 0xF4 && b[i + 1] > 0x8F))
                return 0;
        }
        i += len;
        if (++chars > 255)
            return 0;
    }
    return (uint8_t)chars;
}

static int vocab_build(gpe_grammar_vocab *g, const gpe_model *m)
{
    int n = gpe_model_n_vocab(m);
    g->n_vocab = n;
    g->off = malloc(((size_t)n + 1) * sizeof *g->off);
    g->plain = calloc((size_t)n, 1);
    g->eog = calloc((size_t)n, sizeof *g->eog);
    size_t cap = (size_t)n * 4 + 64, len = 0;
    g->bytes = malloc(cap);
    if (!g->off || !g->plain || !g->eog || !g->bytes)
        return -1;
    for (int t = 0; t < n; t++) {
        g->off[t] = (uint32_t)len;
        g->eog[t] = gpe_token_is_eog(m, t);
        if (g->eog[t])
            continue;
        /* rendered in place, the room grown to what the piece needs: a
         * fixed buffer left a token longer than it out of the vocabulary
         * (never allowed under a schema, though its text may fit) */
        int k = gpe_token_to_piece(m, t, (char *)g->bytes + len, cap - len, false);
        if (k < 0 && k != INT32_MIN) {
            cap = (cap + (size_t)-(int64_t)k) * 2;
            uint8_t *nb = realloc(g->bytes, cap);
            if (!nb)
                return -1;
            g->bytes = nb;
            k = gpe_token_to_piece(m, t, (char *)g->bytes + len, cap - len, false);
        }
        if (k < 0)   /* INT32_MIN: the tokenizer's scratch could not be had */
            return -1;
        if (k == 0)
            continue;
        g->plain[t] = plain_chars(g->bytes + len, k);
        len += (size_t)k;
    }
    g->off[n] = (uint32_t)len;
    /* counting sort by first byte */
    g->by_first = malloc((size_t)n * sizeof *g->by_first);
    g->eogs = malloc((size_t)n * sizeof *g->eogs);
    g->nonplain = malloc((size_t)n * sizeof *g->nonplain);
    if (!g->by_first || !g->eogs || !g->nonplain)
        return -1;
    int count[257] = {0};
    for (int t = 0; t < n; t++) {
        if (g->eog[t])
            g->eogs[g->n_eogs++] = t;
        else if (g->off[t + 1] > g->off[t])
            count[g->bytes[g->off[t]] + 1]++;
        if (!g->eog[t] && g->off[t + 1] > g->off[t] && !g->plain[t])
            g->nonplain[g->n_nonplain++] = t;
    }
    for (int c = 0; c < 256; c++)
        count[c + 1] += count[c];
    memcpy(g->first_at, count, sizeof g->first_at);
    for (int t = 0; t < n; t++)
        if (!g->eog[t] && g->off[t + 1] > g->off[t])
            g->by_first[count[g->bytes[g->off[t]]]++] = t;
    return 0;
}

gpe_status gpe_grammar_vocab_init(const gpe_model *m, gpe_grammar_vocab **out)
{
    *out = NULL;
    if (!m)
        return GPE_ERR_ARG;
    gpe_grammar_vocab *v = calloc(1, sizeof *v);
    if (!v)
        return GPE_ERR_NOMEM;
    if (vocab_build(v, m) < 0) {
        gpe_grammar_vocab_free(v);
        return GPE_ERR_NOMEM;
    }
    *out = v;
    return GPE_OK;
}

void gpe_grammar_vocab_free(gpe_grammar_vocab *v)
{
    if (!v)
        return;
    free(v->off);
    free(v->bytes);
    free(v->plain);
    free(v->eog);
    free(v->by_first);
    free(v->eogs);
    free(v->nonplain);
    free(v);
}

gpe_status gpe_grammar_init_vocab(const gpe_grammar_vocab *v, const char *schema,
                                  gpe_grammar **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!v) {
        seterr(err, errlen, "no vocabulary");
        return GPE_ERR_ARG;
    }
    gpe_status st;
    gpe_grammar *g = calloc(1, sizeof *g);
    if (!g) {
        seterr(err, errlen, "out of memory");
        return GPE_ERR_NOMEM;
    }
    g->v = v;
    g->prog = gpe_jschema_compile_text(schema, err, errlen, &st);
    if (!g->prog)
        goto fail;
    g->masked = malloc((size_t)v->n_vocab * sizeof *g->masked);
    if (!g->masked) {
        seterr(err, errlen, "out of memory");
        st = GPE_ERR_NOMEM;
        goto fail;
    }
    gpe_jg_init(&g->st, g->prog);
    *out = g;
    return GPE_OK;
fail:
    gpe_grammar_free(g);
    return st;
}

gpe_status gpe_grammar_init(const gpe_model *m, const char *schema, gpe_grammar **out,
                            char *err, size_t errlen)
{
    *out = NULL;
    gpe_grammar_vocab *v = NULL;
    gpe_status st = gpe_grammar_vocab_init(m, &v);
    if (st != GPE_OK) {
        seterr(err, errlen, m ? "out of memory" : "no model");
        return st;
    }
    st = gpe_grammar_init_vocab(v, schema, out, err, errlen);
    if (st != GPE_OK) {
        gpe_grammar_vocab_free(v);
        return st;
    }
    (*out)->owned = v;
    return GPE_OK;
}

void gpe_grammar_free(gpe_grammar *g)
{
    if (!g)
        return;
    gpe_jschema_free(g->prog);
    gpe_grammar_vocab_free(g->owned);
    free(g->masked);
    free(g);
}

/* Would token t keep the value completable within limit more bytes? */
static bool token_ok(gpe_grammar *g, int t, int64_t limit)
{
    const uint8_t *b = g->v->bytes + g->v->off[t];
    int n = (int)(g->v->off[t + 1] - g->v->off[t]);
    gpe_jg_copy(&g->trial, &g->st);
    for (int i = 0; i < n; i++)
        if (!gpe_jg_feed(&g->trial, g->prog, b[i]))
            return false;
    return gpe_jg_remaining(&g->trial, g->prog) <= limit;
}

/* token_ok for a plain-text token t inside a pattern string (nd, chars so
 * far), from s1, the automaton's state after t's first byte: its other
 * characters step the automaton by their first bytes, its length must fit
 * maxLength, and the string must still be completable within limit (below:
 * the bytes the frames under the string need). The same verdict as feeding
 * t's bytes to a copy of the state, without the copy and the matcher's
 * dispatch on every byte. */
static bool plain_pattern_ok(const gpe_grammar *g, int t, const gpe_js_node *nd, int64_t chars,
                             uint64_t s1, int64_t below, int64_t limit)
{
    const gpe_jre *re = nd->re;
    const uint8_t *b = g->v->bytes + g->v->off[t];
    int n = (int)(g->v->off[t + 1] - g->v->off[t]);
    int64_t after = chars + g->v->plain[t];
    if (nd->max_chars >= 0 && after > nd->max_chars)
        return false;
    uint64_t st = s1;
    for (int i = 1; i < n && st; i++)
        if ((b[i] & 0xC0) != 0x80)   /* a continuation byte steps nothing */
            st = gpe_jre_step(re, st, b[i]);
    if (!st)
        return false;
    int32_t r = gpe_jre_remaining(re, st);
    if (r == GPE_JRE_DEAD || (nd->max_chars >= 0 && after + r > nd->max_chars))
        return false;
    int64_t more = nd->min_chars > after ? nd->min_chars - after : 0;
    more = r > more ? r : more;
    return more < GPE_JS_INF && below + more + 1 <= limit;   /* + 1: the closing quote */
}

/* Inside a pattern string: the tokens grouped by first byte, each group's
 * first character stepped once (256 steps). A group whose first byte the
 * automaton refuses is out whole (but '"', which closes the string);
 * plain-text tokens in the others take plain_pattern_ok, the rest (a
 * closing quote and what follows it, escapes) token_ok. */
static int mask_pattern(gpe_grammar *g, const float *logits, int n, int64_t limit,
                        const gpe_js_node *nd, int64_t chars, uint64_t st)
{
    const gpe_grammar_vocab *v = g->v;
    int64_t below = 0;   /* summed here, capped as gpe_jg_remaining caps it */
    for (int i = 0; i + 1 < g->st.depth && below < GPE_JS_INF; i++)
        below += gpe_jg_frame_remaining(&g->st.f[i], g->prog);
    below = below < GPE_JS_INF ? below : GPE_JS_INF;
    bool full = nd->max_chars >= 0 && chars >= nd->max_chars;
    int allowed = 0;
    for (int c = 0; c < 256; c++) {
        if (v->first_at[c] == v->first_at[c + 1])
            continue;
        uint64_t s1 = full || c < 0x20 || c == '"' || c == '\\' ? 0
                                                                 : gpe_jre_step(nd->re, st, c);
        if (!s1 && c != '"')
            continue;   /* no token starting with c can go on in this string */
        for (int i = v->first_at[c]; i < v->first_at[c + 1]; i++) {
            int t = v->by_first[i];
            if (t >= n)
                continue;
            bool ok = v->plain[t] ? s1 && plain_pattern_ok(g, t, nd, chars, s1, below, limit)
                                  : token_ok(g, t, limit);
            if (ok) {
                g->masked[t] = logits[t];
                allowed++;
            }
        }
    }
    return allowed;   /* no end of generation inside a string */
}

/* One masking pass over the tokens whose first byte the state takes (the
 * masked buffer is all -inf on entry); returns how many it allowed. */
static int mask_pass(gpe_grammar *g, const float *logits, int n, int64_t limit)
{
    int64_t rem = gpe_jg_remaining(&g->st, g->prog);
    int64_t chars = 0, mn = 0, mx = -1, below = 0;
    bool in_str = gpe_jg_in_string(&g->st, g->prog, &chars, &mn, &mx);
    if (in_str)
        below = rem - gpe_jg_frame_remaining(&g->st.f[g->st.depth - 1], g->prog);
    int allowed = 0;
    const gpe_js_node *pnode;
    uint64_t pstate;
    if (!in_str && gpe_jg_in_pattern(&g->st, g->prog, &pnode, &chars, &pstate))
        return mask_pattern(g, logits, n, limit, pnode, chars, pstate);
    if (in_str) {
        /* Inside a string most of the vocabulary is plain text: a token of
         * p characters fits when lb <= p <= ub (maxLength; minLength within
         * the budget), one sequential pass; then the few other tokens. */
        int64_t ub = mx < 0 ? 255 : mx - chars;
        int64_t lb = mn - chars - (limit - below - 1);
        ub = ub > 255 ? 255 : ub;
        lb = lb < 1 ? 1 : lb;
        if (below + 1 > limit)
            ub = 0;
        uint8_t lo8 = (uint8_t)(lb > 255 ? 255 : lb), hi8 = (uint8_t)(ub < 0 ? 0 : ub);
        /* local restrict pointers: the loop vectorises */
        const uint8_t *restrict plain = g->v->plain;
        const float *restrict in = logits;
        float *restrict out = g->masked;
        uint8_t span = (uint8_t)(hi8 - lo8);   /* lo8 >= 1: plain 0 never fits */
        if (hi8 >= lo8)
            for (int t = 0; t < n; t++) {
                int ok = (uint8_t)(plain[t] - lo8) <= span;
                float x = in[t];   /* read unconditionally: if-converted */
                out[t] = ok ? x : -INFINITY;
                allowed += ok;
            }
        for (int i = 0; i < g->v->n_nonplain; i++) {
            int t = g->v->nonplain[i];
            if (t < n && token_ok(g, t, limit)) {
                g->masked[t] = logits[t];
                allowed++;
            }
        }
        return allowed;   /* no end of generation inside a string */
    }
    for (int i = 0; i < g->v->n_eogs; i++)
        if (rem == 0 && g->v->eogs[i] < n) {
            g->masked[g->v->eogs[i]] = logits[g->v->eogs[i]];
            allowed++;
        }
    for (int c = 0; c < 256; c++) {
        if (g->v->first_at[c] == g->v->first_at[c + 1])
            continue;
        gpe_jg_copy(&g->after1, &g->st);
        if (!gpe_jg_feed(&g->after1, g->prog, (unsigned char)c))
            continue;
        /* A large group (words after 't', 'n', 'f', '"'): filter on the
         * second byte too, 256 tries instead of thousands of tokens. */
        bool second_ok[256];
        bool big = g->v->first_at[c + 1] - g->v->first_at[c] > 256;
        for (int d = 0; big && d < 256; d++) {
            gpe_jg_copy(&g->trial, &g->after1);
            second_ok[d] = gpe_jg_feed(&g->trial, g->prog, (unsigned char)d);
        }
        for (int i = g->v->first_at[c]; i < g->v->first_at[c + 1]; i++) {
            int t = g->v->by_first[i];
            if (big && g->v->off[t + 1] - g->v->off[t] >= 2 &&
                !second_ok[g->v->bytes[g->v->off[t] + 1]])
                continue;
            if (t < n && token_ok(g, t, limit)) {
                g->masked[t] = logits[t];
                allowed++;
            }
        }
    }
    return allowed;
}

const float *gpe_grammar_mask(gpe_grammar *g, const float *logits, int n_vocab, int left)
{
    if (!g || !logits || n_vocab != g->v->n_vocab)
        return logits;   /* not this model's logits: nothing sensible to mask */
    int n = n_vocab < g->v->n_vocab ? n_vocab : g->v->n_vocab;
    /* left counts this token: after it, left - 1 tokens remain to finish */
    int64_t limit = left > 0 ? (int64_t)left - 1 : GPE_JS_INF - 1;
    float *restrict out = g->masked;
    for (int t = 0; t < n; t++)
        out[t] = -INFINITY;
    if (mask_pass(g, logits, n, limit) == 0 && limit < GPE_JS_INF - 1 &&
        mask_pass(g, logits, n, GPE_JS_INF - 1) == 0) {
        /* Stuck (a budget too small for the schema, or nesting deeper than
         * the matcher holds): let the model end rather than write garbage. */
        for (int t = 0; t < n; t++)
            g->masked[t] = g->v->eog[t] ? logits[t] : -INFINITY;
    }
    return g->masked;
}

gpe_status gpe_grammar_accept(gpe_grammar *g, int32_t token)
{
    if (!g || token < 0 || token >= g->v->n_vocab)
        return GPE_ERR_ARG;
    if (g->v->eog[token]) {
        g->ended = true;
        return gpe_jg_remaining(&g->st, g->prog) == 0 ? GPE_OK : GPE_ERR_ARG;
    }
    const uint8_t *b = g->v->bytes + g->v->off[token];
    int n = (int)(g->v->off[token + 1] - g->v->off[token]);
    gpe_jg_copy(&g->trial, &g->st);
    for (int i = 0; i < n; i++)
        if (!gpe_jg_feed(&g->trial, g->prog, b[i]))
            return GPE_ERR_ARG;
    gpe_jg_copy(&g->st, &g->trial);
    return GPE_OK;
}

gpe_status gpe_grammar_accept_text(gpe_grammar *g, const char *text, size_t len)
{
    if (!g || (!text && len))
        return GPE_ERR_ARG;
    gpe_jg_copy(&g->trial, &g->st);
    if (!gpe_jg_feed_all(&g->trial, g->prog, text, len))
        return GPE_ERR_ARG;
    gpe_jg_copy(&g->st, &g->trial);
    return GPE_OK;
}

bool gpe_grammar_done(const gpe_grammar *g)
{
    return g && g->st.depth == 0;
}

bool gpe_grammar_complete(const gpe_grammar *g)
{
    return g && gpe_jg_remaining(&g->st, g->prog) == 0;
}
