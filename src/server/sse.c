/* sse: see sse.h. */
#include "server/sse.h"

#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/keyvalq_struct.h>

int gps_sse_format(gp_buf *out, const char *event, const char *id, const char *data)
{
    if (event && gp_buf_appendf(out, "event: %s\n", event) < 0)
        return -1;
    if (id && gp_buf_appendf(out, "id: %s\n", id) < 0)
        return -1;
    const char *p = data ? data : "";
    /* A bare CR or CRLF also ends a line for the client: split on all. */
    for (;;) {
        size_t l = strcspn(p, "\r\n");
        if (gp_buf_append(out, "data: ", 6) < 0 || gp_buf_append(out, p, l) < 0 ||
            gp_buf_append(out, "\n", 1) < 0)
            return -1;
        p += l;
        if (*p == '\0')
            break;
        if (p[0] == '\r' && p[1] == '\n')
            p += 2;
        else
            p++;
    }
    return gp_buf_append(out, "\n", 1);
}

int gps_sse_format_json(gp_buf *out, const char *event, const char *id, const json_t *j)
{
    /* Compact JSON never contains a raw newline (strings escape it). */
    char *s = json_dumps(j, JSON_COMPACT);
    if (!s)
        return -1;
    int rc = gps_sse_format(out, event, id, s);
    free(s);
    return rc;
}

int gps_sse_format_comment(gp_buf *out, const char *text)
{
    return gp_buf_appendf(out, ": %s\n\n", text ? text : "");
}

void gps_sse_start(struct evhttp_request *req)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_remove_header(h, "Content-Type");
    evhttp_add_header(h, "Content-Type", "text/event-stream");
    evhttp_add_header(h, "Cache-Control", "no-cache");
    /* Tell reverse proxies (nginx) not to buffer the stream. */
    evhttp_add_header(h, "X-Accel-Buffering", "no");
    evhttp_send_reply_start(req, 200, "OK");
}

void gps_sse_send(struct evhttp_request *req, gp_buf *buf)
{
    /* HEAD: the stream's headers went out, its events do not. */
    if (buf->len == 0 || evhttp_request_get_command(req) == EVHTTP_REQ_HEAD) {
        buf->len = 0;
        if (buf->data)
            buf->data[0] = '\0';
        return;
    }
    struct evbuffer *eb = evbuffer_new();
    if (!eb)
        return;
    evbuffer_add(eb, buf->data, buf->len);
    evhttp_send_reply_chunk(req, eb);
    evbuffer_free(eb);
    buf->len = 0;
    if (buf->data)
        buf->data[0] = '\0';
}

void gps_sse_end(struct evhttp_request *req)
{
    evhttp_send_reply_end(req);
}
