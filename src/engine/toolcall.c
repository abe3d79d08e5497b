/*
 * toolcall: tool calls parsed out of a model's generated text (engine.h
 * gpe_toolparse_*), in the format of the chat-template family that
 * rendered the tools (chat.c writes them; this reads what the model answers).
 *
 * Facts about the published templates (see chat.c "tools"):
 *   chatml   Qwen2.5 / Qwen3 (Hermes style): any number of
 *            <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
 *            blocks, usually after some text.
 *   llama-3  Llama 3.1: the whole assistant message is one JSON object
 *            {"name": ..., "parameters": {...}}, optionally after the
 *            <|python_tag|> marker.
 *   mistral  Mistral v0.3: [TOOL_CALLS] then a JSON array of
 *            {"name": ..., "arguments": {...}, "id"?: ...} to the end.
 *
 * A format is a row of a table (opener, closer, whole-message), not code
 * per family. Text that could be the start of an opener is held back (as
 * the stop matcher holds a possible stop string), so an opener never reaches
 * the client as content. A call whose body is not a call (bad JSON, no
 * name) is given back as text, opener and all: the model's words are never
 * lost, only not promoted to a call.
 */
#include <gpupool/engine.h>

#include <jansson.h>

#include "jcheck.h"
#include <stdlib.h>
#include <string.h>

typedef struct tool_format {
    const char *family;     /* gpe_chat_detect's name */
    const char *opener;     /* starts a call ("" for a whole-message format) */
    const char *alt_opener; /* a second way to start one (NULL: none) */
    const char *closer;     /* ends a call; NULL: the call runs to the end */
    const char *args_key;   /* "arguments" or "parameters" (the other is accepted) */
    bool whole_message;     /* only a message that starts with '{' is a call */
    bool array;             /* the body is an array of calls */
    const char *forced;     /* prompt text that starts a forced call */
} tool_format;

static const tool_format formats[] = {
    {"chatml", "<tool_call>", NULL, "</tool_call>", "arguments", false, false, "<tool_call>\n"},
    {"llama-3", "", "<|python_tag|>", NULL, "parameters", true, false, ""},
    {"mistral", "[TOOL_CALLS]", NULL, NULL, "arguments", false, true, "[TOOL_CALLS]"},
};

typedef struct tbuf {
    char *p;
    size_t len, cap;
} tbuf;

typedef struct tcall {
    char *name;
    char *args;
} tcall;

typedef enum { TP_START, TP_TEXT, TP_CALL } tp_state;

struct gpe_toolparse {
    const tool_format *f;
    tp_state st;
    tbuf held;      /* TP_TEXT: a possible opener start; TP_CALL: the body so far */
    tbuf out;       /* text to emit (returned borrowed) */
    tbuf ws;        /* whitespace after a call, emitted only if text follows */
    bool after_call;/* nothing but whitespace since the last call */
    size_t open_len;/* bytes of the opener in held (TP_CALL) */
    tcall *calls;
    size_t n_calls;
    bool oom;
};

static bool tb_add(tbuf *b, const char *s, size_t n)
{
    if (n == 0)
        return true;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return false;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return true;
}

static const tool_format *format_of(const char *family)
{
    for (size_t i = 0; family && i < sizeof formats / sizeof formats[0]; i++)
        if (strcmp(formats[i].family, family) == 0)
            return &formats[i];
    return NULL;
}

gpe_toolparse *gpe_toolparse_new(const char *family)
{
    const tool_format *f = format_of(family);
    if (!f)
        return NULL;
    gpe_toolparse *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->f = f;
    p->st = f->whole_message ? TP_START : TP_TEXT;
    return p;
}

void gpe_toolparse_free(gpe_toolparse *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->n_calls; i++) {
        free(p->calls[i].name);
        free(p->calls[i].args);
    }
    free(p->calls);
    free(p->held.p);
    free(p->out.p);
    free(p->ws.p);
    free(p);
}

const char *gpe_toolparse_opener(const char *family)
{
    const tool_format *f = format_of(family);
    return f ? f->opener : NULL;
}

const char *gpe_toolparse_forced_prefix(const char *family)
{
    const tool_format *f = format_of(family);
    return f ? f->forced : NULL;
}

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* An object with a non-empty string name. */
static bool is_call(const json_t *o)
{
    const char *name = json_string_value(json_object_get(o, "name"));
    return json_is_object(o) && name && *name;
}

/* Text goes out; whitespace right after a call waits to see whether more
 * text follows (a newline between or after calls is not content). */
static void emit_text(gpe_toolparse *p, const char *s, size_t n)
{
    if (n == 0)
        return;
    if (p->after_call) {
        size_t k = 0;
        while (k < n && is_ws(s[k]))
            k++;
        p->oom |= !tb_add(&p->ws, s, k);
        if (k == n)
            return;
        p->oom |= !tb_add(&p->out, p->ws.p, p->ws.len);
        p->ws.len = 0;
        p->after_call = false;
        s += k;
        n -= k;
    }
    p->oom |= !tb_add(&p->out, s, n);
}

/* One call object: name and arguments (object or array written compact,
 * a string taken as the arguments' JSON text as some models write it). */
static bool add_call(gpe_toolparse *p, const json_t *o)
{
    if (!is_call(o))
        return false;
    const char *name = json_string_value(json_object_get(o, "name"));
    const json_t *a = json_object_get(o, p->f->args_key);
    if (!a)
        a = json_object_get(o, strcmp(p->f->args_key, "arguments") == 0 ? "parameters"
                                                                         : "arguments");
    char *args = !a || json_is_null(a) ? strdup("{}")
               : json_is_string(a)    ? strdup(json_string_value(a))
                                      : gpe_js_dumps(a, JSON_COMPACT | JSON_ENCODE_ANY);
    char *nm = strdup(name);
    tcall *c = realloc(p->calls, (p->n_calls + 1) * sizeof *c);
    if (!args || !nm || !c) {
        free(args);
        free(nm);
        if (c)
            p->calls = c;
        p->oom = true;
        return true;   /* a call, lost to memory: not text either */
    }
    p->calls = c;
    c[p->n_calls].name = nm;
    c[p->n_calls].args = args;
    p->n_calls++;
    return true;
}

/* A finished body: its calls, or false when it is not one (then the caller
 * gives the text back). Every element of an array must be a call. A body
 * that memory did not let us read is lost to memory (p->oom), not text:
 * jansson's refusal then says nothing of the body, and a body it read with
 * a byte dropped would be another call. */
static bool take_body(gpe_toolparse *p, const char *body, size_t n)
{
    json_error_t jerr;
    json_t *v = NULL;
    if (gpe_js_load(body, n, JSON_DECODE_ANY, &v, &jerr) == GPE_ERR_NOMEM) {
        p->oom = true;
        return true;
    }
    bool ok = false;
    if (p->f->array && json_is_array(v) && json_array_size(v) > 0) {
        size_t i;
        json_t *e;
        ok = true;
        json_array_foreach(v, i, e)
            ok = ok && is_call(e);
        json_array_foreach(v, i, e)
            if (ok)
                add_call(p, e);
    } else if (!p->f->array) {
        ok = add_call(p, v);
    }
    json_decref(v);
    return ok;
}

/* A call was taken: whitespace held before it was between calls. */
static void called(gpe_toolparse *p)
{
    p->ws.len = 0;
    p->after_call = true;
}

/* Longest suffix of s that is a proper prefix of the opener. */
static size_t opener_tail(const char *op, const char *s, size_t n)
{
    size_t ol = strlen(op);
    for (size_t k = ol - 1 < n ? ol - 1 : n; k > 0; k--)
        if (memcmp(s + n - k, op, k) == 0)
            return k;
    return 0;
}

/* TP_TEXT: scan held for the opener; emit what cannot start one. */
static void scan_text(gpe_toolparse *p)
{
    const char *op = p->f->opener;
    /* memmem, not strstr: generated text may hold a NUL byte */
    char *at = p->held.len ? memmem(p->held.p, p->held.len, op, strlen(op)) : NULL;
    if (at) {
        size_t pre = (size_t)(at - p->held.p);
        emit_text(p, p->held.p, pre);
        memmove(p->held.p, at, p->held.len - pre + 1);
        p->held.len -= pre;
        p->open_len = strlen(op);
        p->st = TP_CALL;
        return;
    }
    size_t keep = opener_tail(op, p->held.p, p->held.len);
    emit_text(p, p->held.p, p->held.len - keep);
    memmove(p->held.p, p->held.p + p->held.len - keep, keep + 1);
    p->held.len = keep;
}

/* TP_CALL with a closer: take each closed body; back to text after it. */
static void scan_call(gpe_toolparse *p)
{
    const char *cl = p->f->closer;
    char *end = memmem(p->held.p + p->open_len, p->held.len - p->open_len, cl, strlen(cl));
    if (!end)
        return;
    size_t body_len = (size_t)(end - p->held.p) - p->open_len;
    size_t whole = (size_t)(end - p->held.p) + strlen(cl);
    if (!take_body(p, p->held.p + p->open_len, body_len))
        emit_text(p, p->held.p, whole);
    else
        called(p);
    memmove(p->held.p, p->held.p + whole, p->held.len - whole + 1);
    p->held.len -= whole;
    p->st = TP_TEXT;
}

/* TP_START (whole-message formats): decide once the first non-space byte
 * (or the marker) is in: a call runs to the end, anything else is text. */
static void scan_start(gpe_toolparse *p)
{
    const char *s = p->held.p;
    size_t n = p->held.len, k = 0;
    while (k < n && is_ws(s[k]))
        k++;
    if (k == n)
        return;
    const char *alt = p->f->alt_opener;
    size_t al = alt ? strlen(alt) : 0;
    if (al && n - k < al && memcmp(s + k, alt, n - k) == 0)
        return;   /* could still be the marker */
    if (al && n - k >= al && memcmp(s + k, alt, al) == 0) {
        p->open_len = k + al;
        p->st = TP_CALL;
    } else if (s[k] == '{') {
        p->open_len = k;
        p->st = TP_CALL;
    } else {
        emit_text(p, s, n);
        p->held.len = 0;
        p->st = TP_TEXT;   /* text from here on: a whole-message format has no opener */
    }
}

/* What a feed hands back: the content gathered in out, or nothing once
 * memory ran out (oom is sticky: a parser that lost a piece of text or a
 * call says so at every later feed and at the finish). */
static gpe_status give(gpe_toolparse *p, const char **emit, size_t *emit_len)
{
    if (p->oom) {
        /* content beside a lost piece would be a different text */
        p->out.len = 0;
        *emit = "";
        *emit_len = 0;
        return GPE_ERR_NOMEM;
    }
    *emit = p->out.len ? p->out.p : "";
    *emit_len = p->out.len;
    return GPE_OK;
}

gpe_status gpe_toolparse_feed(gpe_toolparse *p, const char *s, size_t n, const char **emit,
                              size_t *emit_len)
{
    p->out.len = 0;
    if (p->oom)
        return give(p, emit, emit_len);
    if (!tb_add(&p->held, s, n)) {
        p->oom = true;   /* the piece is not held: the text has a hole */
        return give(p, emit, emit_len);
    }
    for (;;) {
        tp_state before = p->st;
        size_t len = p->held.len;
        if (p->st == TP_START)
            scan_start(p);
        else if (p->st == TP_CALL && p->f->closer)
            scan_call(p);
        else if (p->st == TP_TEXT && *p->f->opener)
            scan_text(p);
        else if (p->st == TP_TEXT) {   /* whole-message format that was text */
            emit_text(p, p->held.p, p->held.len);
            p->held.len = 0;
        }
        if (p->st == before && p->held.len == len)
            break;
        if (p->held.len == 0)
            break;
    }
    return give(p, emit, emit_len);
}

gpe_status gpe_toolparse_finish(gpe_toolparse *p, const char **emit, size_t *emit_len)
{
    p->out.len = 0;
    if (p->st == TP_CALL) {
        /* No closer (llama-3, mistral) or a model that stopped before it
         * (Qwen often ends with EOS right after the JSON): parse what came. */
        if (!take_body(p, p->held.p + p->open_len, p->held.len - p->open_len))
            emit_text(p, p->held.p, p->held.len);
    } else if (p->held.len) {
        emit_text(p, p->held.p, p->held.len);
    }
    p->held.len = 0;
    p->ws.len = 0;   /* trailing whitespace after the last call is not content */
    p->st = TP_TEXT;
    *emit = p->out.len ? p->out.p : "";
    *emit_len = p->out.len;
    return p->oom ? GPE_ERR_NOMEM : GPE_OK;
}

size_t gpe_toolparse_n_calls(const gpe_toolparse *p)
{
    return p->n_calls;
}

bool gpe_toolparse_call(const gpe_toolparse *p, size_t i, const char **name,
                        const char **arguments)
{
    if (i >= p->n_calls)
        return false;
    *name = p->calls[i].name;
    *arguments = p->calls[i].args;
    return true;
}
