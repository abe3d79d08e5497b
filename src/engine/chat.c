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

static const struct family *family_find(const char *name)
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

char *gpe_chat_apply_format(const char *family, const char *bos, const char *eos,
                            const gpe_chat_msg *msgs, size_t n, bool add_assistant, char *err,
                            size_t errlen)
{
    const struct family *f = family_find(family);
    if (!f) {
        set_err(err, errlen, "unknown chat format '%s' (known: chatml, llama-2, llama-3, "
                             "mistral, zephyr, gemma, phi-3, fallback)", family);
        return NULL;
    }
    if (n > 0 && !msgs) {
        set_err(err, errlen, "chat: %zu messages but no message array", n);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].role[0]) {
            set_err(err, errlen, "chat: message %zu has no role", i);
            return NULL;
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

    if (!b.oom && !b.p)
        b.p = calloc(1, 1);     /* empty prompt: still a string */
    if (b.oom || !b.p) {
        free(b.p);
        set_err(err, errlen, "chat: out of memory rendering the prompt");
        return NULL;
    }
    return b.p;
}
