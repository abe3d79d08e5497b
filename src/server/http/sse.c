/* sse: see sse.h. */
#include "server/http/sse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/keyvalq_struct.h>

#include "server/http/http.h" /* gps_http_add_date */

/* "name: value\n" (no printf: this runs for every event of every stream). */
static int field(gp_buf *out, const char *name, size_t nlen, const char *value)
{
    if (gp_buf_append(out, name, nlen) < 0 || gp_buf_append(out, value, strlen(value)) < 0)
        return -1;
    return gp_buf_append(out, "\n", 1);
}

int gps_sse_format(gp_buf *out, const char *event, const char *id, const char *data)
{
    if (event && field(out, "event: ", 7, event) < 0)
        return -1;
    if (id && field(out, "id: ", 4, id) < 0)
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
    size_t at = out->len; /* a failure leaves out as it was */
    /* Compact JSON never contains a raw newline (strings escape it): one
     * data line, dumped straight into out (no copy of the text). */
    if (!(json_is_object(j) || json_is_array(j)) || (event && field(out, "event: ", 7, event) < 0) ||
        (id && field(out, "id: ", 4, id) < 0) || gp_buf_append(out, "data: ", 6) < 0 ||
        gp_json_dump_append(out, j) < 0 || gp_buf_append(out, "\n\n", 2) < 0) {
        gp_buf_truncate(out, at);
        return -1;
    }
    return 0;
}

int gps_json_escape_append(gp_buf *out, const char *text, size_t n)
{
    return gp_json_escape_append(out, text, n);
}

int gps_sse_tpl_init(gps_sse_tpl *t, const char *event, const json_t *obj, const char *marker)
{
    memset(t, 0, sizeof *t);
    char *s = gp_json_dumps(obj);
    gp_buf q;
    gp_buf_init(&q);
    int rc = -1;
    if (!s || gp_buf_append(&q, "\"", 1) < 0 ||
        gps_json_escape_append(&q, marker, strlen(marker)) < 0 || gp_buf_append(&q, "\"", 1) < 0)
        goto done;
    char *at = strstr(s, q.data);
    if (!at || strstr(at + 1, q.data))
        goto done; /* the marker must be the one open field */
    gp_buf pre;
    gp_buf_init(&pre);
    if ((event && gp_buf_appendf(&pre, "event: %s\n", event) < 0) ||
        gp_buf_appendf(&pre, "data: %.*s", (int)(at - s) + 1, s) < 0) {
        gp_buf_free(&pre);
        goto done;
    }
    const char *tail = at + q.len - 1; /* the closing quote */
    t->npre = pre.len;
    t->pre = gp_buf_steal(&pre);
    t->post = malloc(strlen(tail) + 3);
    if (!t->pre || !t->post) {
        gps_sse_tpl_free(t);
        goto done;
    }
    t->npost = (size_t)sprintf(t->post, "%s\n\n", tail);
    rc = 0;
done:
    free(s);
    gp_buf_free(&q);
    return rc;
}

int gps_sse_tpl_emit(gp_buf *out, const gps_sse_tpl *t, const char *text, size_t n)
{
    size_t at = out->len;
    if (gp_buf_append(out, t->pre, t->npre) < 0 || gps_json_escape_append(out, text, n) < 0 ||
        gp_buf_append(out, t->post, t->npost) < 0) {
        gp_buf_truncate(out, at); /* a failure leaves out as it was */
        return -1;
    }
    return 0;
}

void gps_sse_tpl_free(gps_sse_tpl *t)
{
    free(t->pre);
    free(t->post);
    memset(t, 0, sizeof *t);
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
    gps_http_add_date(req);
    evhttp_send_reply_start(req, 200, "OK");
}

void gps_sse_send(struct evhttp_request *req, gp_buf *buf)
{
    /* HEAD: the stream's headers went out, its events do not. */
    if (buf->len == 0 || evhttp_request_get_command(req) == EVHTTP_REQ_HEAD) {
        gp_buf_truncate(buf, 0);
        return;
    }
    struct evbuffer *eb = evbuffer_new();
    if (!eb)
        return;
    evbuffer_add(eb, buf->data, buf->len);
    evhttp_send_reply_chunk(req, eb);
    evbuffer_free(eb);
    gp_buf_truncate(buf, 0);
}

void gps_sse_end(struct evhttp_request *req)
{
    evhttp_send_reply_end(req);
}

/* ------------------------------------------------------------------ */
/* Backpressure                                                        */
/* ------------------------------------------------------------------ */

static size_t pace_high_water = 1024 * 1024;
static int pace_slow_sec = 60;

void gps_sse_pace_configure(size_t high_water, int slow_timeout_sec)
{
    if (high_water > 0)
        pace_high_water = high_water;
    if (slow_timeout_sec > 0)
        pace_slow_sec = slow_timeout_sec;
}

size_t gps_sse_pace_high_water(void)
{
    return pace_high_water;
}

struct gps_sse_pace {
    struct evhttp_connection *evcon;
    struct event *slow;           /* armed while blocked */
    struct evbuffer *chunk;       /* each send's chunk: evhttp moves its bytes out,
                                     so one serves the whole reply (an evbuffer_new
                                     and free per send were ~500 instructions) */
    bool direct;                  /* chunked reply on a plain socket: write_now may
                                     write a chunk itself */
    bool blocked;
    gps_sse_pace_fn on_writable, on_slow;
    void *arg;
};

static size_t conn_unsent(struct evhttp_connection *c)
{
    struct bufferevent *bev = c ? evhttp_connection_get_bufferevent(c) : NULL;
    return bev ? evbuffer_get_length(bufferevent_get_output(bev)) : 0;
}

size_t gps_sse_unsent(struct evhttp_request *req)
{
    return req ? conn_unsent(evhttp_request_get_connection(req)) : 0;
}

static size_t unsent(const gps_sse_pace *p)
{
    return conn_unsent(p->evcon);
}

static void slow_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gps_sse_pace *p = arg;
    if (p->blocked && p->on_slow)
        p->on_slow(p->arg); /* may free p */
}

/* evhttp's write-completion callback: the connection's output is empty.
 * evhttp keeps one such callback per connection, set by every chunk; the
 * pace outlives every chunk it sent until the reply ends (see sse.h). */
static void drained_cb(struct evhttp_connection *evcon, void *arg)
{
    (void)evcon;
    gps_sse_pace *p = arg;
    if (!p->blocked)
        return;
    p->blocked = false;
    event_del(p->slow);
    if (p->on_writable)
        p->on_writable(p->arg); /* may free p */
}

gps_sse_pace *gps_sse_pace_new(struct evhttp_request *req, gps_sse_pace_fn on_writable,
                               gps_sse_pace_fn on_slow, void *arg)
{
    struct evhttp_connection *evcon = req ? evhttp_request_get_connection(req) : NULL;
    if (!evcon)
        return NULL;
    gps_sse_pace *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->evcon = evcon;
    p->on_writable = on_writable;
    p->on_slow = on_slow;
    p->arg = arg;
    struct bufferevent *bev = evhttp_connection_get_bufferevent(evcon);
    const char *te = evhttp_find_header(evhttp_request_get_output_headers(req),
                                        "Transfer-Encoding");
    p->direct = bev && !bufferevent_openssl_get_ssl(bev) && bufferevent_getfd(bev) >= 0 &&
                evhttp_request_get_command(req) != EVHTTP_REQ_HEAD && te &&
                strcmp(te, "chunked") == 0;
    p->slow = evtimer_new(evhttp_connection_get_base(evcon), slow_cb, p);
    p->chunk = evbuffer_new();
    if (!p->slow || !p->chunk) {
        gps_sse_pace_free(p);
        return NULL;
    }
    return p;
}

void gps_sse_pace_free(gps_sse_pace *p)
{
    if (!p)
        return;
    if (p->slow)
        event_free(p->slow);
    if (p->chunk)
        evbuffer_free(p->chunk);
    free(p);
}

bool gps_sse_pace_blocked(gps_sse_pace *p)
{
    if (!p)
        return false;
    if (p->blocked)
        return true;
    if (unsent(p) <= pace_high_water)
        return false;
    p->blocked = true;
    struct timeval tv = {pace_slow_sec, 0};
    event_add(p->slow, &tv);
    return true;
}

/* evbuffer_add_reference's cleanup: the bytes were written (or dropped). */
static void free_sent(const void *data, size_t len, void *arg)
{
    (void)data;
    (void)len;
    free(arg);
}

/* Below this, a turn's output is copied: a copy of a token or two costs
 * less than the new block and the reference chain (a paced stream's turn). */
#define HAND_OVER_MIN 2048

/* Hand a turn's rendered output to eb as it is, without copying it: eb
 * refers to buf's bytes and frees them once libevent is done with them,
 * and buf gets a new block of the same capacity. Copying a burst's output
 * into the evbuffer cost about 200 instructions a relayed token
 * (relay_cpu, issue 24). Returns -1, leaving buf as it was, when the
 * output is small or memory is short: the caller copies it. */
static int hand_over(struct evbuffer *eb, gp_buf *buf)
{
    if (buf->len < HAND_OVER_MIN)
        return -1;
    /* buf keeps its capacity: the next turn's output is likely as large. */
    size_t len = buf->len;
    char *sent = gp_buf_take(buf);
    if (!sent)
        return -1;
    if (evbuffer_add_reference(eb, sent, len, free_sent, sent) < 0) {
        evbuffer_add(eb, sent, len); /* memory is short: copy, as the caller would */
        free(sent);
    }
    return 0;
}

/* Write buf as one HTTP chunk straight to the socket, as nginx and redis
 * write a reply, when nothing is queued before it: through evhttp a chunk
 * costs a printf of its size, an evbuffer, the write event enabled (an
 * epoll_ctl), a loop turn, the write and the event disabled (another
 * epoll_ctl): 2.6 epoll_ctl and 1.1 writev a token event at 200 paced
 * streams (issue 24). What the socket does not take goes to the
 * connection's output as evhttp would have put it (the write event sends
 * it; a later chunk goes through evhttp behind it, so drained_cb is armed
 * before the output can reach the high-water mark). An error other than
 * EAGAIN also leaves the whole chunk to the output, so that libevent sees
 * the error and closes as before. 1: handled; 0: the caller sends it. */
static int write_now(gps_sse_pace *p, const gp_buf *buf)
{
    if (!p->direct || p->blocked || unsent(p) != 0)
        return 0;
    struct bufferevent *bev = evhttp_connection_get_bufferevent(p->evcon);
    evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
    if (fd < 0)
        return 0;
    char head[24];
    int hl = snprintf(head, sizeof head, "%zx\r\n", buf->len);
    struct iovec iov[3] = {{head, (size_t)hl}, {buf->data, buf->len}, {(char *)"\r\n", 2}};
    size_t total = (size_t)hl + buf->len + 2;
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 3};
    ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == (ssize_t)total)
        return 1;
    if (n < 0) /* full, or an error: libevent writes the rest or reports it */
        n = 0;
    /* The rest, in order, where the write event picks it up. */
    struct evbuffer *out = bufferevent_get_output(bev);
    size_t skip = (size_t)n;
    for (int i = 0; i < 3; i++) {
        if (skip >= iov[i].iov_len) {
            skip -= iov[i].iov_len;
            continue;
        }
        evbuffer_add(out, (char *)iov[i].iov_base + skip, iov[i].iov_len - skip);
        skip = 0;
    }
    bufferevent_enable(bev, EV_WRITE); /* as evhttp does for each chunk */
    return 1;
}

void gps_sse_pace_send(gps_sse_pace *p, struct evhttp_request *req, gp_buf *buf)
{
    if (!p) {
        gps_sse_send(req, buf);
        return;
    }
    if (buf->len == 0)
        return;
    if (write_now(p, buf)) {
        gp_buf_truncate(buf, 0);
        (void)gps_sse_pace_blocked(p);
        return;
    }
    struct evbuffer *eb = p->chunk;
    if (hand_over(eb, buf) < 0)
        evbuffer_add(eb, buf->data, buf->len);
    evhttp_send_reply_chunk_with_cb(req, eb, drained_cb, p);
    /* What evhttp left (a HEAD reply's bytes) is dropped, references freed. */
    evbuffer_drain(eb, evbuffer_get_length(eb));
    gp_buf_truncate(buf, 0);
    (void)gps_sse_pace_blocked(p); /* arm the slow clock at once */
}

void gps_sse_pace_drop(struct evhttp_connection *evcon)
{
    if (evcon)
        evhttp_connection_free(evcon);
}

size_t gps_sse_utf8_slice(const char *s, size_t n, size_t max)
{
    if (n <= max)
        return n;
    size_t k = max;
    /* Back up over continuation bytes to a character start. */
    while (k > 0 && ((unsigned char)s[k] & 0xc0) == 0x80)
        k--;
    return k > 0 ? k : max;
}
