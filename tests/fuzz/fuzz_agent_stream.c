/*
 * libFuzzer target: the openai backend's reading of an upstream reply
 * (src/agent/openai_stream.h), driven as the backend's libcurl callbacks
 * drive it: the header lines, the body in pieces (SSE or JSON or error
 * body) until the parser says stop, then oai_stream_finish.
 *
 * Input: byte 0 picks the reply's shape, byte 1 the piece size, the rest is
 * the body.
 *   bit 0-1  Content-Type: text/event-stream, application/json, text/html, none
 *   bit 2    status 500 instead of 200
 *   bit 3    chat job (else completion)      bit 4  a count_tokens reply instead
 *   bit 5    the transfer ended with an error (connection reset)
 * Checked: the backend's contract (backend.h): exactly one terminal event,
 * nothing after it, no token after an error; every error has a code.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "agent/openai_count.h"
#include "agent/openai_stream.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
    int nend, nerror, after_terminal;
    bool started;
} rec;

static void r_started(void *c)
{
    rec *r = c;
    r->after_terminal += r->nend + r->nerror + r->started; /* once, before the end */
    r->started = true;
}
static void r_token(void *c, const char *t, size_t n, int32_t id)
{
    rec *r = c;
    (void)id;
    if (!r->started) /* started comes before the first token */
        abort();
    volatile char x = 0;
    for (size_t i = 0; i < n; i++) /* the whole piece must be readable */
        x ^= t[i];
    (void)x;
    r->after_terminal += r->nend + r->nerror;
}
static void r_metrics(void *c, json_t *m)
{
    if (!json_is_object(m))
        abort();
    ((rec *)c)->after_terminal += ((rec *)c)->nend + ((rec *)c)->nerror;
}
static void r_tool(void *c, int index, const char *id, const char *name, const char *args,
                   size_t n)
{
    rec *r = c;
    if (index < 0 || (n && !args) || !r->started)
        abort();
    r->after_terminal += r->nend + r->nerror;
}
static void r_stop(void *c, const char *seq)
{
    rec *r = c;
    if (!seq || r->nend + r->nerror)
        abort();
}
static void r_end(void *c, const char *fr, long long pt, long long ct)
{
    rec *r = c;
    if (!fr || !*fr)
        abort();
    r->nend++;
}
static void r_error(void *c, const char *code, const char *msg)
{
    rec *r = c;
    if (!code || !*code || !msg)
        abort();
    r->nerror++;
}

static const char *const ctypes[] = {"Content-Type: text/event-stream\r\n",
                                     "Content-Type: application/json; charset=utf-8\r\n",
                                     "Content-Type: text/html\r\n", NULL};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    const unsigned flags = data[0];
    const size_t step = (size_t)data[1] + 1;
    const char *p = (const char *)data + 2;
    size_t n = size - 2;

    rec r = {0};
    if (flags & 16) {
        /* A count_tokens reply: parsed by openai_count.c for each method
         * (count replies do not go through oai_stream_finish). */
        long long cnt = -1;
        bool est = false;
        for (int m = OAI_COUNT_MESSAGES; m < OAI_COUNT_ESTIMATE; m++)
            if (oai_count_parse((oai_count_method)m, p, n, &cnt, &est) == 0 && cnt < 0)
                abort();
        /* An /apply-template reply becomes the body of the next step. */
        bool nomem = false;
        char *next = oai_count_template_tokenize(p, n, &nomem);
        if ((next && !strstr(next, "\"content\"")) || nomem)
            abort();
        free(next);
        return 0;
    }
    const agent_job_sink sink = {.ctx = &r,
                                 .started = r_started,
                                 .token = r_token,
                                 .metrics = r_metrics,
                                 .end = r_end,
                                 .error = r_error,
                                 .tool_call = r_tool,
                                 .stop_sequence = r_stop};
    static const char *const stop_words[] = {"\n\n", "END"};
    json_t *stops = json_pack("[s,s]", stop_words[0], stop_words[1]);
    oai_stream s;
    /* A small line bound so that the overlong-line path is reachable. */
    oai_stream_init(&s, &sink, "fuzz", (flags & 8) != 0, false, stops, 4096);

    char status[] = "HTTP/1.1 200 OK\r\n";
    if (flags & 4)
        memcpy(status + 9, "500", 3);
    bool go = oai_stream_header(&s, status, strlen(status)) == 0;
    const char *ct = ctypes[(flags >> 0) & 3];
    if (go && ct)
        go = oai_stream_header(&s, ct, strlen(ct)) == 0;
    if (go)
        go = oai_stream_header(&s, "\r\n", 2) == 0;
    while (go && n > 0) {
        size_t k = n < step ? n : step;
        if (oai_stream_body(&s, p, k) != 0)
            break;
        p += k;
        n -= k;
    }
    if (flags & 32)
        oai_stream_finish(&s, "UPSTREAM_ERROR", "upstream connection failed: reset");
    else
        oai_stream_finish(&s, NULL, NULL);
    oai_stream_free(&s);
    json_decref(stops);

    if (r.nend + r.nerror != 1 || r.after_terminal != 0)
        abort();
    return 0;
}
