/*
 * chat: recognising a chat-template family from its Jinja text and rendering
 * messages the way that family's official template does. No Jinja engine:
 * each family is a small hand-written renderer, checked by unit tests
 * against the prompt strings the real templates produce.
 *
 * Families and sources (formats are facts about those models; see
 * docs/chat-templates.md for rendered examples):
 *   chatml   <|im_start|>{role}\n{content}<|im_end|>\n ... (OpenHermes, Qwen)
 *   llama-2  meta-llama/Llama-2-*-chat tokenizer_config.json chat_template
 *   llama-3  meta-llama/Meta-Llama-3-*-Instruct tokenizer_config.json
 *   mistral  mistralai/Mistral-7B-Instruct-v0.1/v0.2 chat_template; system
 *            prompt prepended to the first user message as mistral-common
 *            does for tokenizer v1 (mistralai/cookbook, chat_templates.md)
 *   zephyr   HuggingFaceH4/zephyr-7b-beta chat_template (rendered with
 *            transformers' trim_blocks, so each turn ends "</s>\n")
 *   gemma    google/gemma-7b-it chat_template; system folded into the first
 *            user turn as the Gemma 3 template does (system + "\n\n")
 *   phi-3    microsoft/Phi-3-mini-4k-instruct chat_template
 *
 * Role handling beyond the templates (which raise exceptions instead): the
 * single-system families (llama-2, mistral, gemma) take the first system
 * message as their system prompt; any later system message, and any role
 * they do not know, is rendered as a user turn. zephyr and phi-3 skip roles
 * they do not know, as their templates do. chatml and llama-3 write any
 * role name as given.
 */
#include "engine/chat.h"

#include <gpupool/engine.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ================================================================ families */

static const char F_CHATML[] = "chatml";
static const char F_LLAMA2[] = "llama-2";
static const char F_LLAMA3[] = "llama-3";
static const char F_MISTRAL[] = "mistral";
static const char F_ZEPHYR[] = "zephyr";
static const char F_GEMMA[] = "gemma";
static const char F_PHI3[] = "phi-3";
static const char F_FALLBACK[] = "fallback";

static const struct family {
    const char *name;
    const char *alias;
    const char *bos, *eos, *eot;
    bool writes_bos;
} families[] = {
    {F_CHATML, "chatml", "", "<|im_end|>", "<|im_end|>", false},
    {F_LLAMA2, "llama2", "<s>", "</s>", "</s>", true},
    {F_LLAMA3, "llama3", "<|begin_of_text|>", "<|eot_id|>", "<|eot_id|>", true},
    {F_MISTRAL, "mistral-v1", "<s>", "</s>", "</s>", true},
    {F_ZEPHYR, "zephyr", "<s>", "</s>", "</s>", false},
    {F_GEMMA, "gemma2", "<bos>", "<eos>", "<end_of_turn>", true},
    {F_PHI3, "phi3", "<s>", "<|endoftext|>", "<|end|>", false},
    {F_FALLBACK, "plain", "", "", "", false},
};

/* noinline: at -O3 GCC 12 inlines this into callers that pass a literal and
 * then warns (-Wstring-compare, an error here) that a 10-char literal never
 * equals the 9-byte F_FALLBACK array, which is the point of the loop. */
__attribute__((noinline)) static const struct family *family_find(const char *name)
{
    if (!name)
        name = F_FALLBACK;
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (strcmp(name, families[i].name) == 0 || strcmp(name, families[i].alias) == 0)
            return &families[i];
    return NULL;
}

const char *gpe_chat_family_name(const char *name)
{
    const struct family *f = family_find(name);
    return f ? f->name : NULL;
}

const char *gpe_chat_default_bos(const char *family)
{
    const struct family *f = family_find(family);
    return f ? f->bos : "";
}

const char *gpe_chat_default_eos(const char *family)
{
    const struct family *f = family_find(family);
    return f ? f->eos : "";
}

bool gpe_chat_writes_bos(const char *family)
{
    const struct family *f = family_find(family);
    return f && f->writes_bos;
}

const char *gpe_chat_end_of_turn(const char *family)
{
    const struct family *f = family_find(family);
    return f ? f->eot : "";
}

/* Distinctive markers of each family's Jinja text, as found in the
 * tokenizer.chat_template of real GGUF files. The order matters: a llama-3
 * or gemma template never contains "<|im_start|>", but several families
 * contain "[INST]" or "<|user|>", so those are told apart last. */
const char *gpe_chat_detect(const char *t)
{
    if (!t)
        return F_FALLBACK;
    if (strstr(t, "<|im_start|>"))
        return F_CHATML;
    if (strstr(t, "<|start_header_id|>"))
        return F_LLAMA3;
    if (strstr(t, "<start_of_turn>"))
        return F_GEMMA;
    if (strstr(t, "<|user|>")) {
        /* phi-3 closes turns with <|end|>; zephyr with eos_token / "</s>" */
        if (strstr(t, "<|end|>"))
            return F_PHI3;
        return F_ZEPHYR;
    }
    if (strstr(t, "[INST]"))
        return strstr(t, "<<SYS>>") ? F_LLAMA2 : F_MISTRAL;
    return F_FALLBACK;
}

/* ================================================================ builder */

typedef struct sb {
    char *p;
    size_t len, cap;
    bool oom;
} sb;

static void sb_addn(sb *b, const char *s, size_t n)
{
    if (b->oom || n == 0)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->len + n + 1) {
            if (nc > SIZE_MAX / 2) {
                b->oom = true;
                return;
            }
            nc *= 2;
        }
        char *np = realloc(b->p, nc);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sb_add(sb *b, const char *s)
{
    sb_addn(b, s, strlen(s));
}

/* Jinja's trim / Python's str.strip(), for ASCII whitespace. */
static void sb_add_trimmed(sb *b, const char *s)
{
    size_t n = strlen(s);
    while (n && strchr(" \t\n\r\f\v", s[0])) {
        s++;
        n--;
    }
    while (n && strchr(" \t\n\r\f\v", s[n - 1]))
        n--;
    sb_addn(b, s, n);
}

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* A render that gives no prompt, and why in *st (may be NULL): GPE_ERR_ARG
 * for what the caller gave, GPE_ERR_NOMEM when memory ran out. */
static char *no_prompt(gpe_status *st, gpe_status why)
{
    if (st)
        *st = why;
    return NULL;
}

/* The builder's text as the prompt (an empty one still a string), or out
 * of memory. */
static char *prompt_of(sb *b, char *err, size_t errlen, gpe_status *st)
{
    if (!b->oom && !b->p)
        b->p = calloc(1, 1);
    if (b->oom || !b->p) {
        free(b->p);
        set_err(err, errlen, "chat: out of memory rendering the prompt");
        return no_prompt(st, GPE_ERR_NOMEM);
    }
    if (st)
        *st = GPE_OK;
    return b->p;
}

static const char *content_of(const gpe_chat_msg *m)
{
    return m->content ? m->content : "";
}

static bool is_role(const gpe_chat_msg *m, const char *r)
{
    return strcmp(m->role, r) == 0;
}

/* Index of the system message a single-system family folds into the first
 * user turn: the first message, when it is a system message; -1 otherwise. */
static long leading_system(const gpe_chat_msg *msgs, size_t n)
{
    return n > 0 && is_role(&msgs[0], "system") ? 0 : -1;
}

/* ================================================================ renderers */

static void render_chatml(sb *b, const gpe_chat_msg *msgs, size_t n, bool add)
{
    for (size_t i = 0; i < n; i++) {
        sb_add(b, "<|im_start|>");
        sb_add(b, msgs[i].role);
        sb_add(b, "\n");
        sb_add(b, content_of(&msgs[i]));
        sb_add(b, "<|im_end|>\n");
    }
    if (add)
        sb_add(b, "<|im_start|>assistant\n");
}

/* Meta's template: bos + "[INST] " + content.strip() + " [/INST]" per user
 * turn, where the first carries "<<SYS>>\n{system}\n<</SYS>>\n\n" in front
 * (stripped as a whole); " " + answer.strip() + " " + eos per assistant
 * turn. It has no generation prompt: the text already ends at [/INST]. */
static void render_llama2(sb *b, const char *bos, const char *eos, const gpe_chat_msg *msgs,
                          size_t n)
{
    long sys = leading_system(msgs, n);
    bool sys_pending = sys >= 0;
    for (size_t i = sys >= 0 ? 1 : 0; i < n; i++) {
        if (is_role(&msgs[i], "assistant")) {
            sb_add(b, " ");
            sb_add_trimmed(b, content_of(&msgs[i]));
            sb_add(b, " ");
            sb_add(b, eos);
            continue;
        }
        sb_add(b, bos);
        sb_add(b, "[INST] ");
        if (sys_pending) {
            sb inner = {0};
            sb_add(&inner, "<<SYS>>\n");
            sb_add(&inner, content_of(&msgs[sys]));
            sb_add(&inner, "\n<</SYS>>\n\n");
            sb_add(&inner, content_of(&msgs[i]));
            if (inner.oom)
                b->oom = true;
            else
                sb_add_trimmed(b, inner.p);
            free(inner.p);
            sys_pending = false;
        } else {
            sb_add_trimmed(b, content_of(&msgs[i]));
        }
        sb_add(b, " [/INST]");
    }
    if (sys_pending) {
        /* Only a system message: render it as the first instruction. */
        sb_add(b, bos);
        sb_add(b, "[INST] <<SYS>>\n");
        sb_add(b, content_of(&msgs[sys]));
        sb_add(b, "\n<</SYS>> [/INST]");
    }
}

/* Mistral v1: bos once, "[INST] " + content + " [/INST]" per user turn
 * (not stripped), answer + eos per assistant turn. The system prompt goes
 * in front of the first user message, separated by "\n\n". */
static void render_mistral(sb *b, const char *bos, const char *eos, const gpe_chat_msg *msgs,
                           size_t n)
{
    long sys = leading_system(msgs, n);
    bool sys_pending = sys >= 0;
    sb_add(b, bos);
    for (size_t i = sys >= 0 ? 1 : 0; i < n; i++) {
        if (is_role(&msgs[i], "assistant")) {
            sb_add(b, content_of(&msgs[i]));
            sb_add(b, eos);
            continue;
        }
        sb_add(b, "[INST] ");
        if (sys_pending) {
            sb_add(b, content_of(&msgs[sys]));
            sb_add(b, "\n\n");
            sys_pending = false;
        }
        sb_add(b, content_of(&msgs[i]));
        sb_add(b, " [/INST]");
    }
    if (sys_pending) {
        sb_add(b, "[INST] ");
        sb_add(b, content_of(&msgs[sys]));
        sb_add(b, " [/INST]");
    }
}

static void render_llama3(sb *b, const char *bos, const gpe_chat_msg *msgs, size_t n, bool add)
{
    sb_add(b, bos);
    for (size_t i = 0; i < n; i++) {
        sb_add(b, "<|start_header_id|>");
        sb_add(b, msgs[i].role);
        sb_add(b, "<|end_header_id|>\n\n");
        sb_add_trimmed(b, content_of(&msgs[i]));
        sb_add(b, "<|eot_id|>");
    }
    if (add)
        sb_add(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static void render_zephyr(sb *b, const char *eos, const gpe_chat_msg *msgs, size_t n, bool add)
{
    for (size_t i = 0; i < n; i++) {
        const char *tag = is_role(&msgs[i], "user")        ? "<|user|>\n"
                          : is_role(&msgs[i], "system")    ? "<|system|>\n"
                          : is_role(&msgs[i], "assistant") ? "<|assistant|>\n"
                                                           : NULL;
        if (!tag)
            continue;
        sb_add(b, tag);
        sb_add(b, content_of(&msgs[i]));
        sb_add(b, eos);
        sb_add(b, "\n");
    }
    if (add)
        sb_add(b, "<|assistant|>\n");
}

static void render_gemma(sb *b, const char *bos, const gpe_chat_msg *msgs, size_t n, bool add)
{
    long sys = leading_system(msgs, n);
    bool sys_pending = sys >= 0;
    sb_add(b, bos);
    for (size_t i = sys >= 0 ? 1 : 0; i < n; i++) {
        const char *role = msgs[i].role;
        if (is_role(&msgs[i], "assistant"))
            role = "model";
        else if (is_role(&msgs[i], "system"))
            role = "user";
        sb_add(b, "<start_of_turn>");
        sb_add(b, role);
        sb_add(b, "\n");
        if (sys_pending && strcmp(role, "user") == 0) {
            sb_add_trimmed(b, content_of(&msgs[sys]));
            sb_add(b, "\n\n");
            sys_pending = false;
        }
        sb_add_trimmed(b, content_of(&msgs[i]));
        sb_add(b, "<end_of_turn>\n");
    }
    if (sys_pending) {
        sb_add(b, "<start_of_turn>user\n");
        sb_add_trimmed(b, content_of(&msgs[sys]));
        sb_add(b, "<end_of_turn>\n");
    }
    if (add)
        sb_add(b, "<start_of_turn>model\n");
}

/* Phi-3: "<|role|>\n" + content + "<|end|>\n" for the three roles, then the
 * generation prompt, or the EOS text when there is none. */
static void render_phi3(sb *b, const char *eos, const gpe_chat_msg *msgs, size_t n, bool add)
{
    for (size_t i = 0; i < n; i++) {
        const char *tag = is_role(&msgs[i], "user")        ? "<|user|>\n"
                          : is_role(&msgs[i], "system")    ? "<|system|>\n"
                          : is_role(&msgs[i], "assistant") ? "<|assistant|>\n"
                                                           : NULL;
        if (!tag)
            continue;
        sb_add(b, tag);
        sb_add(b, content_of(&msgs[i]));
        sb_add(b, "<|end|>\n");
    }
    sb_add(b, add ? "<|assistant|>\n" : eos);
}

/* Fallback for models without a recognised template, typically small base
 * models (stories260K): the contents alone, one message per line, no role
 * labels and no generation prompt, so that a single user message is passed
 * to the model exactly as written and the model simply continues it. */
static void render_fallback(sb *b, const gpe_chat_msg *msgs, size_t n)
{
    bool first = true;
    for (size_t i = 0; i < n; i++) {
        const char *c = content_of(&msgs[i]);
        if (!c[0])
            continue;
        if (!first)
            sb_add(b, "\n");
        sb_add(b, c);
        first = false;
    }
}

char *gpe_chat_apply_format_status(const char *family, const char *bos, const char *eos,
                                   const gpe_chat_msg *msgs, size_t n, bool add_assistant,
                                   char *err, size_t errlen, gpe_status *st)
{
    const struct family *f = family_find(family);
    if (!f) {
        set_err(err, errlen, "unknown chat format '%s' (known: chatml, llama-2, llama-3, "
                             "mistral, zephyr, gemma, phi-3, fallback)", family);
        return no_prompt(st, GPE_ERR_ARG);
    }
    if (n > 0 && !msgs) {
        set_err(err, errlen, "chat: %zu messages but no message array", n);
        return no_prompt(st, GPE_ERR_ARG);
    }
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].role[0]) {
            set_err(err, errlen, "chat: message %zu has no role", i);
            return no_prompt(st, GPE_ERR_ARG);
        }
    }
    if (!bos)
        bos = f->bos;
    if (!eos)
        eos = f->eos;

    sb b = {0};
    sb_addn(&b, "", 0);
    if (f->name == F_CHATML)
        render_chatml(&b, msgs, n, add_assistant);
    else if (f->name == F_LLAMA2)
        render_llama2(&b, bos, eos, msgs, n);
    else if (f->name == F_LLAMA3)
        render_llama3(&b, bos, msgs, n, add_assistant);
    else if (f->name == F_MISTRAL)
        render_mistral(&b, bos, eos, msgs, n);
    else if (f->name == F_ZEPHYR)
        render_zephyr(&b, eos, msgs, n, add_assistant);
    else if (f->name == F_GEMMA)
        render_gemma(&b, bos, msgs, n, add_assistant);
    else if (f->name == F_PHI3)
        render_phi3(&b, eos, msgs, n, add_assistant);
    else
        render_fallback(&b, msgs, n);
    return prompt_of(&b, err, errlen, st);
}

char *gpe_chat_apply_format(const char *family, const char *bos, const char *eos,
                            const gpe_chat_msg *msgs, size_t n, bool add_assistant, char *err,
                            size_t errlen)
{
    return gpe_chat_apply_format_status(family, bos, eos, msgs, n, add_assistant, err, errlen,
                                        NULL);
}

/* ================================================================ tools */

/* Tool formats of the tool-capable templates (facts about those models'
 * published chat templates, tokenizer_config.json chat_template):
 *   chatml   Qwen/Qwen2.5-*-Instruct and Qwen3 (Hermes style): a "# Tools"
 *            section with one JSON line per tool inside <tools></tools> in
 *            the system turn; calls as <tool_call>{"name", "arguments"}
 *            </tool_call> in the assistant turn; consecutive tool results
 *            as <tool_response> blocks in one user turn. Without a system
 *            message the section starts the system turn (Qwen3; Qwen2.5
 *            would write its default "You are Qwen..." prompt first).
 *   llama-3  meta-llama/Llama-3.1-8B-Instruct: system header with
 *            "Environment: ipython", knowledge and (default) today dates;
 *            tools as indent-4 JSON in the first user message
 *            (tools_in_user_message, the default); a call as
 *            {"name", "parameters"} in an assistant turn; results in an
 *            "ipython" turn, written with tojson (a string gets quoted).
 *   mistral  mistralai/Mistral-7B-Instruct-v0.3: [AVAILABLE_TOOLS] before
 *            the last user message, "[INST] ...[/INST]" (v3 spacing, system
 *            prompt in front of the last user message, as mistral-common),
 *            [TOOL_CALLS] [{"name", "arguments", "id"}] + EOS, and
 *            [TOOL_RESULTS] {"content": ..., "call_id": ...}[/TOOL_RESULTS].
 * The templates raise exceptions on some inputs (mistral: ids of other than
 * 9 characters; llama-3.1: several calls in one message); the engine never
 * fails on them: ids are written as given, each call gets its own turn. */

bool gpe_chat_format_has_tools(const char *family)
{
    const struct family *f = family_find(family);
    return f && (f->name == F_CHATML || f->name == F_LLAMA3 || f->name == F_MISTRAL);
}

bool gpe_chat_template_supports_tools(const char *t)
{
    if (!t)
        return false;
    const char *fam = gpe_chat_detect(t);
    if (fam == F_CHATML)
        return strstr(t, "tools") && strstr(t, "<tool_call>");
    if (fam == F_LLAMA3)
        return strstr(t, "tools") && strstr(t, "ipython");
    if (fam == F_MISTRAL)
        return strstr(t, "[AVAILABLE_TOOLS]") != NULL;
    return false;
}

/* A JSON string as Python's json.dumps(ensure_ascii=False) writes it. */
static void sb_json_str(sb *b, const char *s)
{
    sb_add(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        switch (*p) {
        case '"': sb_add(b, "\\\""); break;
        case '\\': sb_add(b, "\\\\"); break;
        case '\n': sb_add(b, "\\n"); break;
        case '\r': sb_add(b, "\\r"); break;
        case '\t': sb_add(b, "\\t"); break;
        case '\b': sb_add(b, "\\b"); break;
        case '\f': sb_add(b, "\\f"); break;
        default:
            if (*p < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", *p);
                sb_add(b, esc);
            } else {
                sb_addn(b, (const char *)p, 1);
            }
        }
    }
    sb_add(b, "\"");
}

static void sb_newline_indent(sb *b, int indent, int depth)
{
    sb_add(b, "\n");
    for (int i = 0; i < indent * depth; i++)
        sb_add(b, " ");
}

static const char *skip_ws(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    return p;
}

/* Re-space JSON text the way Python's json.dumps does (what the templates'
 * tojson filter calls): inline with ", " and ": " when indent < 0, else one
 * item per line indented by `indent` spaces per level, "," and ": ", empty
 * containers as {} and []. Strings, numbers and literals are copied as
 * written. Returns false for text that is not JSON (a light check: token
 * order, bracket balance, literals); out then holds a partial text the
 * caller discards. */
static bool json_respace(sb *out, const char *s, int indent)
{
    char stack[128];
    int depth = 0;
    bool value = false;   /* the last token ended a value */
    const char *p = skip_ws(s);
    while (*p) {
        char c = *p;
        bool starts_value = c == '{' || c == '[' || c == '"' || !strchr("}],:", c);
        if (starts_value && value)
            return false;   /* two values in a row: "not json" */
        if (c == '{' || c == '[') {
            char close = c == '{' ? '}' : ']';
            const char *q = skip_ws(p + 1);
            value = true;
            if (*q == close) {
                sb_addn(out, p, 1);
                sb_addn(out, q, 1);
                p = q + 1;
            } else {
                if (depth >= (int)sizeof stack)
                    return false;
                stack[depth++] = close;
                sb_addn(out, p, 1);
                if (indent >= 0)
                    sb_newline_indent(out, indent, depth);
                p++;
                value = false;
            }
        } else if (c == '}' || c == ']') {
            if (depth == 0 || stack[depth - 1] != c || !value)
                return false;
            depth--;
            if (indent >= 0)
                sb_newline_indent(out, indent, depth);
            sb_addn(out, p, 1);
            p++;
        } else if (c == ',') {
            if (depth == 0 || !value)
                return false;
            value = false;
            sb_add(out, ",");
            if (indent >= 0)
                sb_newline_indent(out, indent, depth);
            else
                sb_add(out, " ");
            p++;
        } else if (c == ':') {
            if (depth == 0 || stack[depth - 1] != '}' || !value)
                return false;
            value = false;
            sb_add(out, ": ");
            p++;
        } else if (c == '"') {
            const char *q = p + 1;
            while (*q && *q != '"') {
                if (*q == '\\' && q[1])
                    q++;
                q++;
            }
            if (*q != '"')
                return false;
            sb_addn(out, p, (size_t)(q + 1 - p));
            p = q + 1;
            value = true;
        } else {
            const char *q = p;
            while (*q && !strchr(" \t\n\r{}[],:\"", *q))
                q++;
            size_t len = (size_t)(q - p);
            bool word = (len == 4 && (!strncmp(p, "true", 4) || !strncmp(p, "null", 4))) ||
                        (len == 5 && !strncmp(p, "false", 5));
            if (len == 0 || (!word && !strchr("-0123456789", *p)))
                return false;
            sb_addn(out, p, len);
            p = q;
            value = true;
        }
        p = skip_ws(p);
    }
    return depth == 0 && value;
}

/* JSON text re-spaced (see json_respace), or as given when it is not JSON;
 * NULL or empty -> dflt. */
static void sb_add_json(sb *b, const char *text, int indent, const char *dflt)
{
    if (!text || !*skip_ws(text))
        text = dflt;
    sb tmp = {0};
    bool json = json_respace(&tmp, text, indent);
    if (json && tmp.oom)
        b->oom = true;   /* JSON as given would be another prompt */
    else
        sb_add(b, json ? tmp.p : text);
    free(tmp.p);
}

/* {"type": "function", "function": {"name", "description", "parameters"}}
 * as the templates get it from transformers, re-spaced for `indent`. */
static void sb_add_tool(sb *b, const gpe_chat_tool *t, int indent)
{
    sb raw = {0};
    sb_add(&raw, "{\"type\": \"function\", \"function\": {\"name\": ");
    sb_json_str(&raw, t->name);
    if (t->description) {
        sb_add(&raw, ", \"description\": ");
        sb_json_str(&raw, t->description);
    }
    if (t->parameters && *skip_ws(t->parameters)) {
        sb_add(&raw, ", \"parameters\": ");
        sb_add(&raw, t->parameters);
    }
    sb_add(&raw, "}}");
    if (raw.oom)
        b->oom = true;
    else
        sb_add_json(b, raw.p, indent, "{}");
    free(raw.p);
}

static size_t n_calls(const gpe_chat_msg_tools *x, size_t i)
{
    return x && x[i].tool_calls ? x[i].n_tool_calls : 0;
}

static const char *call_id(const gpe_chat_msg_tools *x, size_t i)
{
    return x && x[i].tool_call_id ? x[i].tool_call_id : "";
}

static void render_chatml_tools(sb *b, const gpe_chat_tool *tools, size_t nt,
                                const gpe_chat_msg *msgs, const gpe_chat_msg_tools *x, size_t n,
                                bool add)
{
    bool has_sys = n > 0 && is_role(&msgs[0], "system");
    if (nt > 0) {
        sb_add(b, "<|im_start|>system\n");
        if (has_sys) {
            sb_add(b, content_of(&msgs[0]));
            sb_add(b, "\n\n");
        }
        sb_add(b, "# Tools\n\nYou may call one or more functions to assist with the user "
                  "query.\n\nYou are provided with function signatures within <tools></tools> "
                  "XML tags:\n<tools>");
        for (size_t t = 0; t < nt; t++) {
            sb_add(b, "\n");
            sb_add_tool(b, &tools[t], -1);
        }
        sb_add(b, "\n</tools>\n\nFor each function call, return a json object with function "
                  "name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                  "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
                  "</tool_call><|im_end|>\n");
    } else if (has_sys) {
        sb_add(b, "<|im_start|>system\n");
        sb_add(b, content_of(&msgs[0]));
        sb_add(b, "<|im_end|>\n");
    }
    for (size_t i = has_sys ? 1 : 0; i < n; i++) {
        const gpe_chat_msg *m = &msgs[i];
        if (is_role(m, "assistant") && n_calls(x, i) > 0) {
            sb_add(b, "<|im_start|>assistant");
            if (content_of(m)[0]) {
                sb_add(b, "\n");
                sb_add(b, content_of(m));
            }
            for (size_t c = 0; c < x[i].n_tool_calls; c++) {
                const gpe_chat_tool_call *tc = &x[i].tool_calls[c];
                sb_add(b, "\n<tool_call>\n{\"name\": \"");
                sb_add(b, tc->name);
                sb_add(b, "\", \"arguments\": ");
                sb_add_json(b, tc->arguments, -1, "{}");
                sb_add(b, "}\n</tool_call>");
            }
            sb_add(b, "<|im_end|>\n");
        } else if (is_role(m, "tool")) {
            if (i == 0 || !is_role(&msgs[i - 1], "tool"))
                sb_add(b, "<|im_start|>user");
            sb_add(b, "\n<tool_response>\n");
            sb_add(b, content_of(m));
            sb_add(b, "\n</tool_response>");
            if (i + 1 == n || !is_role(&msgs[i + 1], "tool"))
                sb_add(b, "<|im_end|>\n");
        } else {
            sb_add(b, "<|im_start|>");
            sb_add(b, m->role);
            sb_add(b, "\n");
            sb_add(b, content_of(m));
            sb_add(b, "<|im_end|>\n");
        }
    }
    if (add)
        sb_add(b, "<|im_start|>assistant\n");
}

static void render_llama31_tools(sb *b, const char *bos, const gpe_chat_tool *tools, size_t nt,
                                 const gpe_chat_msg *msgs, const gpe_chat_msg_tools *x, size_t n,
                                 bool add)
{
    size_t i = 0;
    const char *sys = "";
    if (n > 0 && is_role(&msgs[0], "system")) {
        sys = content_of(&msgs[0]);
        i = 1;
    }
    sb_add(b, bos);
    sb_add(b, "<|start_header_id|>system<|end_header_id|>\n\n");
    if (nt > 0)
        sb_add(b, "Environment: ipython\n");
    /* the template's defaults (date_string is not passed by servers) */
    sb_add(b, "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n");
    sb_add_trimmed(b, sys);
    sb_add(b, "<|eot_id|>");
    if (nt > 0) {
        sb_add(b, "<|start_header_id|>user<|end_header_id|>\n\n"
                  "Given the following functions, please respond with a JSON for a function "
                  "call with its proper arguments that best answers the given prompt.\n\n"
                  "Respond in the format {\"name\": function name, \"parameters\": dictionary "
                  "of argument name and its value}.Do not use variables.\n\n");
        for (size_t t = 0; t < nt; t++) {
            sb_add_tool(b, &tools[t], 4);
            sb_add(b, "\n\n");
        }
        if (i < n)
            sb_add_trimmed(b, content_of(&msgs[i++]));
        sb_add(b, "<|eot_id|>");
    }
    for (; i < n; i++) {
        const gpe_chat_msg *m = &msgs[i];
        if (n_calls(x, i) > 0) {
            for (size_t c = 0; c < x[i].n_tool_calls; c++) {
                const gpe_chat_tool_call *tc = &x[i].tool_calls[c];
                sb_add(b, "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"");
                sb_add(b, tc->name);
                sb_add(b, "\", \"parameters\": ");
                sb_add_json(b, tc->arguments, -1, "{}");
                sb_add(b, "}<|eot_id|>");
            }
        } else if (is_role(m, "tool") || is_role(m, "ipython")) {
            sb_add(b, "<|start_header_id|>ipython<|end_header_id|>\n\n");
            sb_json_str(b, content_of(m));
            sb_add(b, "<|eot_id|>");
        } else {
            sb_add(b, "<|start_header_id|>");
            sb_add(b, m->role);
            sb_add(b, "<|end_header_id|>\n\n");
            sb_add_trimmed(b, content_of(m));
            sb_add(b, "<|eot_id|>");
        }
    }
    if (add)
        sb_add(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static void render_mistral_tools(sb *b, const char *bos, const char *eos,
                                 const gpe_chat_tool *tools, size_t nt, const gpe_chat_msg *msgs,
                                 const gpe_chat_msg_tools *x, size_t n)
{
    long sys = leading_system(msgs, n);
    long last_user = -1;
    for (size_t i = sys >= 0 ? 1 : 0; i < n; i++)
        if (is_role(&msgs[i], "user"))
            last_user = (long)i;
    sb_add(b, bos);
    for (size_t i = sys >= 0 ? 1 : 0; i < n; i++) {
        const gpe_chat_msg *m = &msgs[i];
        if (is_role(m, "assistant") && n_calls(x, i) > 0) {
            sb_add(b, "[TOOL_CALLS] [");
            for (size_t c = 0; c < x[i].n_tool_calls; c++) {
                const gpe_chat_tool_call *tc = &x[i].tool_calls[c];
                if (c)
                    sb_add(b, ", ");
                sb_add(b, "{\"name\": ");
                sb_json_str(b, tc->name);
                sb_add(b, ", \"arguments\": ");
                sb_add_json(b, tc->arguments, -1, "{}");
                sb_add(b, ", \"id\": \"");
                sb_add(b, tc->id ? tc->id : "");
                sb_add(b, "\"}");
            }
            sb_add(b, "]");
            sb_add(b, eos);
        } else if (is_role(m, "assistant")) {
            sb_add(b, " ");
            sb_add_trimmed(b, content_of(m));
            sb_add(b, eos);
        } else if (is_role(m, "tool")) {
            sb_add(b, "[TOOL_RESULTS] {\"content\": ");
            sb_add(b, content_of(m));
            sb_add(b, ", \"call_id\": \"");
            sb_add(b, call_id(x, i));
            sb_add(b, "\"}[/TOOL_RESULTS]");
        } else {
            /* user; later system messages and unknown roles as user turns */
            bool last = (long)i == last_user;
            if (last && nt > 0) {
                /* name and description are written unescaped, as the
                 * template does; parameters through tojson */
                sb_add(b, "[AVAILABLE_TOOLS] [");
                for (size_t t = 0; t < nt; t++) {
                    if (t)
                        sb_add(b, ", ");
                    sb_add(b, "{\"type\": \"function\", \"function\": {\"name\": \"");
                    sb_add(b, tools[t].name);
                    sb_add(b, "\"");
                    if (tools[t].description) {
                        sb_add(b, ", \"description\": \"");
                        sb_add(b, tools[t].description);
                        sb_add(b, "\"");
                    }
                    if (tools[t].parameters && *skip_ws(tools[t].parameters)) {
                        sb_add(b, ", \"parameters\": ");
                        sb_add_json(b, tools[t].parameters, -1, "{}");
                    }
                    sb_add(b, "}}");
                }
                sb_add(b, "][/AVAILABLE_TOOLS]");
            }
            sb_add(b, "[INST] ");
            if (last && sys >= 0) {
                sb_add(b, content_of(&msgs[sys]));
                sb_add(b, "\n\n");
            }
            sb_add(b, content_of(m));
            sb_add(b, "[/INST]");
        }
    }
    if (sys >= 0 && last_user < 0) {
        sb_add(b, "[INST] ");
        sb_add(b, content_of(&msgs[sys]));
        sb_add(b, "[/INST]");
    }
}

/* Tool calls and results as plain text for templates without a tools
 * format: an assistant message gets one "Tool call: name(arguments)" line
 * per call after its content; a "tool" message becomes a user message
 * "Tool result: content". Returns a malloc'd array of n messages whose
 * changed contents are in *texts (n entries, NULL where unchanged). */
static gpe_chat_msg *tools_as_text(const gpe_chat_msg *msgs, const gpe_chat_msg_tools *x, size_t n,
                                   char ***texts_out)
{
    gpe_chat_msg *out = calloc(n ? n : 1, sizeof *out);
    char **texts = calloc(n ? n : 1, sizeof *texts);
    if (!out || !texts) {
        free(out);
        free(texts);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        out[i] = msgs[i];
        bool call = n_calls(x, i) > 0, result = is_role(&msgs[i], "tool");
        if (!call && !result)
            continue;
        sb t = {0};
        if (result) {
            out[i].role = "user";
            sb_add(&t, "Tool result: ");
            sb_add(&t, content_of(&msgs[i]));
        } else {
            sb_add(&t, content_of(&msgs[i]));
            for (size_t c = 0; c < x[i].n_tool_calls; c++) {
                const gpe_chat_tool_call *tc = &x[i].tool_calls[c];
                if (t.len)
                    sb_add(&t, "\n");
                sb_add(&t, "Tool call: ");
                sb_add(&t, tc->name);
                sb_add(&t, "(");
                sb_add(&t, tc->arguments ? tc->arguments : "{}");
                sb_add(&t, ")");
            }
        }
        if (t.oom || !t.p) {
            free(t.p);
            for (size_t k = 0; k < i; k++)
                free(texts[k]);
            free(texts);
            free(out);
            return NULL;
        }
        texts[i] = t.p;
        out[i].content = t.p;
    }
    *texts_out = texts;
    return out;
}

char *gpe_chat_apply_format_tools_status(const char *family, const char *bos, const char *eos,
                                         bool tool_format, const gpe_chat_tool *tools,
                                         size_t n_tools, const gpe_chat_msg *msgs,
                                         const gpe_chat_msg_tools *x, size_t n,
                                         bool add_assistant, char *err, size_t errlen,
                                         gpe_status *st)
{
    const struct family *f = family_find(family);
    if (!f)
        return gpe_chat_apply_format_status(family, bos, eos, msgs, n, add_assistant, err,
                                            errlen, st);
    if (n > 0 && !msgs) {
        set_err(err, errlen, "chat: %zu messages but no message array", n);
        return no_prompt(st, GPE_ERR_ARG);
    }
    if (n_tools > 0 && !tools) {
        set_err(err, errlen, "chat: %zu tools but no tool array", n_tools);
        return no_prompt(st, GPE_ERR_ARG);
    }
    for (size_t t = 0; t < n_tools; t++)
        if (!tools[t].name || !tools[t].name[0]) {
            set_err(err, errlen, "chat: tool %zu has no name", t);
            return no_prompt(st, GPE_ERR_ARG);
        }
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].role[0]) {
            set_err(err, errlen, "chat: message %zu has no role", i);
            return no_prompt(st, GPE_ERR_ARG);
        }
        for (size_t c = 0; c < n_calls(x, i); c++)
            if (!x[i].tool_calls[c].name || !x[i].tool_calls[c].name[0]) {
                set_err(err, errlen, "chat: message %zu: tool call %zu has no name", i, c);
                return no_prompt(st, GPE_ERR_ARG);
            }
    }

    if (!tool_format || !gpe_chat_format_has_tools(f->name)) {
        char **texts = NULL;
        gpe_chat_msg *plain = tools_as_text(msgs, x, n, &texts);
        if (!plain) {
            set_err(err, errlen, "chat: out of memory rendering the prompt");
            return no_prompt(st, GPE_ERR_NOMEM);
        }
        char *out = gpe_chat_apply_format_status(f->name, bos, eos, plain, n, add_assistant,
                                                 err, errlen, st);
        for (size_t i = 0; i < n; i++)
            free(texts[i]);
        free(texts);
        free(plain);
        return out;
    }

    if (!bos)
        bos = f->bos;
    if (!eos)
        eos = f->eos;
    sb b = {0};
    sb_addn(&b, "", 0);
    if (f->name == F_CHATML)
        render_chatml_tools(&b, tools, n_tools, msgs, x, n, add_assistant);
    else if (f->name == F_LLAMA3)
        render_llama31_tools(&b, bos, tools, n_tools, msgs, x, n, add_assistant);
    else
        render_mistral_tools(&b, bos, eos, tools, n_tools, msgs, x, n);
    return prompt_of(&b, err, errlen, st);
}

char *gpe_chat_apply_format_tools(const char *family, const char *bos, const char *eos,
                                  bool tool_format, const gpe_chat_tool *tools, size_t n_tools,
                                  const gpe_chat_msg *msgs, const gpe_chat_msg_tools *x,
                                  size_t n, bool add_assistant, char *err, size_t errlen)
{
    return gpe_chat_apply_format_tools_status(family, bos, eos, tool_format, tools, n_tools,
                                              msgs, x, n, add_assistant, err, errlen, NULL);
}
