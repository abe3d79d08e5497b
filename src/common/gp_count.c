/* gp_count: see gp_count.h. */
#include "common/gp_count.h"

#include <stdlib.h>
#include <string.h>

/* Where a count's text goes: appended to buf, or (buf NULL) only measured,
 * so that the estimate needs no memory and cannot come out short. len: the
 * bytes so far; rc: -1 once an append failed (the text is then not whole,
 * and nothing more is appended). */
typedef struct text_sink {
    gp_buf *buf;
    size_t len;
    int rc;
} text_sink;

static void put(text_sink *s, const char *p, size_t n)
{
    s->len += n;
    if (s->buf && s->rc == 0 && gp_buf_append(s->buf, p, n) < 0)
        s->rc = -1;
}

static void content_text(const json_t *c, text_sink *s)
{
    if (json_is_string(c)) {
        put(s, json_string_value(c), json_string_length(c));
        return;
    }
    size_t i;
    const json_t *p;
    json_array_foreach((json_t *)c, i, p)
    {
        const json_t *t = json_object_get(p, "text");
        if (json_is_string(t))
            put(s, json_string_value(t), json_string_length(t));
    }
}

/* Tool calls of an assistant message, as "name(arguments)" text (a newline
 * before each when text came before). */
static void calls_text(const json_t *m, text_sink *s)
{
    size_t i;
    const json_t *tc;
    json_array_foreach(json_object_get(m, "tool_calls"), i, tc)
    {
        const json_t *f = json_object_get(tc, "function");
        const char *name = json_string_value(json_object_get(f, "name"));
        const char *args = json_string_value(json_object_get(f, "arguments"));
        if (s->len)
            put(s, "\n", 1);
        if (name)
            put(s, name, strlen(name));
        if (args)
            put(s, args, strlen(args));
    }
}

int gp_count_content_text(const json_t *c, gp_buf *out)
{
    text_sink s = {.buf = out, .len = out->len};
    content_text(c, &s);
    return s.rc;
}

int gp_count_calls_text(const json_t *m, gp_buf *out)
{
    text_sink s = {.buf = out, .len = out->len};
    calls_text(m, &s);
    return s.rc;
}

/* The messages' text into s, joined by newlines. */
static void messages_text(const json_t *msgs, text_sink *s)
{
    size_t i;
    const json_t *m;
    json_array_foreach((json_t *)msgs, i, m)
    {
        if (i)
            put(s, "\n", 1);
        content_text(json_object_get(m, "content"), s);
        calls_text(m, s);
    }
}

char *gp_count_text(const json_t *job)
{
    const char *prompt = json_string_value(json_object_get(job, "prompt"));
    const json_t *msgs = json_object_get(job, "messages");
    if (prompt)
        return strdup(prompt);
    if (!json_is_array(msgs))
        return NULL;
    gp_buf t;
    gp_buf_init(&t);
    text_sink s = {.buf = &t};
    messages_text(msgs, &s);
    if (s.rc < 0) {
        gp_buf_free(&t); /* a text with a part left out: another count */
        return NULL;
    }
    char *out = gp_buf_steal(&t);
    return out ? out : strdup("");
}

long long gp_count_estimate(const json_t *job)
{
    const char *prompt = json_string_value(json_object_get(job, "prompt"));
    const json_t *msgs = json_object_get(job, "messages");
    size_t bytes;
    if (prompt) {
        bytes = strlen(prompt);
    } else if (json_is_array(msgs)) {
        text_sink s = {.buf = NULL};
        messages_text(msgs, &s);
        bytes = s.len;
    } else {
        return 0;
    }
    long long n = (long long)((bytes + 3) / 4);
    if (json_is_array(msgs))
        n += 4 * (long long)json_array_size(msgs); /* role and turn markers */
    return n > 0 ? n : 1;
}
