/* gp_count: see gp_count.h. */
#include "common/gp_count.h"

#include <stdlib.h>
#include <string.h>

/* The text of a message's content: a string, or the text parts of an
 * array of content parts. */
void gp_count_content_text(const json_t *c, gp_buf *out)
{
    if (json_is_string(c)) {
        gp_buf_append(out, json_string_value(c), json_string_length(c));
        return;
    }
    size_t i;
    const json_t *p;
    json_array_foreach((json_t *)c, i, p)
    {
        const json_t *t = json_object_get(p, "text");
        if (json_is_string(t))
            gp_buf_append(out, json_string_value(t), json_string_length(t));
    }
}

/* Tool calls of an assistant message, as "name(arguments)" text. */
void gp_count_calls_text(const json_t *m, gp_buf *out)
{
    size_t i;
    const json_t *tc;
    json_array_foreach(json_object_get(m, "tool_calls"), i, tc)
    {
        const json_t *f = json_object_get(tc, "function");
        const char *name = json_string_value(json_object_get(f, "name"));
        const char *args = json_string_value(json_object_get(f, "arguments"));
        if (out->len)
            gp_buf_append(out, "\n", 1);
        if (name)
            gp_buf_append(out, name, strlen(name));
        if (args)
            gp_buf_append(out, args, strlen(args));
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
    size_t i;
    const json_t *m;
    json_array_foreach((json_t *)msgs, i, m)
    {
        if (i)
            gp_buf_append(&t, "\n", 1);
        gp_count_content_text(json_object_get(m, "content"), &t);
        gp_count_calls_text(m, &t);
    }
    char *out = gp_buf_steal(&t);
    return out ? out : strdup("");
}

long long gp_count_estimate(const json_t *job)
{
    char *text = gp_count_text(job);
    if (!text)
        return 0;
    size_t bytes = strlen(text);
    free(text);
    const json_t *msgs = json_object_get(job, "messages");
    long long n = (long long)((bytes + 3) / 4);
    if (json_is_array(msgs))
        n += 4 * (long long)json_array_size(msgs); /* role and turn markers */
    return n > 0 ? n : 1;
}

