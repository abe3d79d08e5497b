/*
 * backend_openai: relay jobs to an existing OpenAI-compatible server
 * (llama.cpp's llama-server, vLLM, Ollama, another gpupool-server).
 *
 * One loop thread for every job, as nginx's upstream module runs: a
 * libevent event_base and one libcurl multi handle driven through
 * curl_multi_socket_action, so an agent with --slots 1024 holds 1,024
 * upstream streams on one thread and a few KiB each (a job, its easy
 * handle, its parser buffers). Connections to the upstream are kept alive
 * and reused between jobs. Other threads never touch curl: job_start and
 * job_cancel queue their work under the backend's mutex and wake the loop
 * through a pipe; the loop starts transfers, and a cancel drops the
 * transfer at once (the upstream sees its client go away and stops
 * generating). Handles are removed only outside libcurl's callbacks (a
 * stream that said [DONE] is finished after curl_multi_socket_action
 * returns). The request is always streamed (stream: true,
 * stream_options.include_usage) so tokens are relayed as they arrive; the
 * server turns them back into one body for non-streaming clients.
 *
 * Tools: a job's `tools`/`tool_choice` go upstream as they are (the model
 * facts say supports_tools: the upstream decides); the reply's tool_calls
 * (streamed pieces or a whole message) become tool_call events, and a reply
 * that called tools ends with finish_reason "tool_calls".
 *
 * Failures become one error event with a stable code:
 *   UPSTREAM_ERROR      HTTP status >= 400, connection refused/reset/dropped,
 *                       stream ended before [DONE], error object in the stream
 *   UPSTREAM_MALFORMED  a chunk that is not JSON or not the expected shape,
 *                       an unexpected Content-Type, an overlong line
 *   UPSTREAM_TIMEOUT    no byte from the upstream for upstream-timeout-sec
 *   CANCELLED           job_cancel
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <curl/curl.h>
#include <event2/event.h>
#include <jansson.h>

#include "agent/agent_util.h"
#include "agent/backend.h"
#include "agent/openai_count.h"
#include "common/gp_log.h"
#include "common/gp_count.h"
#include "common/gp_util.h"

#ifndef AGENT_VERSION
#define AGENT_VERSION "0.0.0"
#endif

#define MAX_ERRBODY (64u << 10)     /* error bodies: kept for the message only */
#define MAX_JSONBODY (16u << 20)    /* a non-streamed reply (lenient path) */
#define MAX_SSE_LINE (4u << 20)     /* one SSE line / event */
/* libcurl's receive buffer per transfer (its default is 16 KiB): a stream's
 * events are a few hundred bytes, and 1,024 streams hold 1,024 of these. */
#define OAI_RECV_BUFFER 4096L

typedef struct oai_backend oai_backend;

typedef enum { BODY_UNKNOWN, BODY_SSE, BODY_JSON, BODY_ERROR } body_mode;

typedef struct oai_job {
    struct oai_job *prev, *next; /* b->jobs (under b->mu) */
    struct oai_job *in_next;     /* b->inbox, then the loop's work lists */
    oai_backend *b;
    char id[128];
    agent_job_sink sink;
    bool chat;
    bool count;             /* count_tokens: no generation (openai_count.h) */
    char *body;             /* request JSON (owned); count: the /tokenize body */
    char *count_body;       /* count: the messages/count_tokens body (owned) */
    json_t *stops;          /* the job's params.stop (owned), or NULL */
    char *stop_seq;         /* the stop string the upstream said it stopped on (owned) */
    long long count_estimate; /* count: method 3's answer */
    char *correlation_id;   /* owned, may be NULL */
    char *pool_options;     /* X-Pool-Options header line (owned), or NULL */
    char pool_via[160];     /* X-Pool-Via header line, or "" */
    atomic_bool cancel;     /* job_cancel asked (set under b->mu) */
    bool cancel_taken;      /* under b->mu: the loop has it in hand */

    /* --- loop thread only --- */
    CURL *easy;             /* the transfer in flight, or NULL */
    struct curl_slist *hdrs; /* request headers (owned), for every transfer */
    int count_m;            /* count: the method being tried (oai_count_method) */
    int count_first;        /* count: the method tried first */
    bool done_queued;       /* on the loop's [DONE] list */
    bool completed;         /* libcurl said the transfer ended (result) */
    CURLcode result;
    struct oai_job *fin_next; /* loop_settle's list of completed transfers */
    body_mode mode;
    long status;
    agent_sse sse;
    gp_buf raw;             /* error body or non-streamed JSON body */
    bool done_seen;         /* data: [DONE] */
    bool failed;            /* err_code/err_msg set */
    char err_code[32];
    char err_msg[300];
    char finish[32];
    long long prompt_tokens, completion_tokens;
    long long ntokens;
    int ntool_calls;        /* tool call indices announced (id+name sent) */
    bool started_sent;
    uint64_t t_start_us, t_first_us, last_byte_ms;
} oai_job;

struct oai_backend {
    agent_backend base;     /* first: the agent sees only this */
    const agent_options *o;
    char *url_chat;
    char *url_completions;
    char *url_tokenize;     /* server root + /tokenize (llama-server, vLLM) */
    char *url_count;        /* server root + /v1/messages/count_tokens (gpupool, Anthropic) */
    atomic_int count_method; /* the count method that answered last (oai_count_method) */
    char *public_id;
    char *auth_header;

    /* --- shared with the agent's thread, under mu --- */
    pthread_mutex_t mu;
    oai_job *jobs;          /* every job not yet finished (doubly linked) */
    oai_job *inbox, **inbox_tail; /* started, not yet taken by the loop */
    bool cancel_pending;    /* some job in jobs has cancel set, not yet taken */
    bool stopping;          /* destroy: cancel everything, then leave the loop */
    int wake_fd[2];         /* a byte on [1] wakes the loop */
    atomic_bool wake_sent;  /* a byte is in the pipe, not yet drained */
    pthread_t th;
    bool th_started;

    /* --- loop thread only --- */
    struct event_base *evb;
    struct event *wake_ev, *curl_timer, *sweep_timer;
    CURLM *multi;
    oai_job *done_list;     /* streams that said [DONE] inside a libcurl callback */
    int nrunning;           /* jobs begun and not yet finished */
    bool leaving;           /* stopping taken: break out when nrunning is 0 */
};

/* ======================================================================== */
/* Stream parsing (job thread)                                              */
/* ======================================================================== */

static void job_fail(oai_job *j, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void job_fail(oai_job *j, const char *code, const char *fmt, ...)
{
    if (j->failed)
        return; /* keep the first cause */
    j->failed = true;
    snprintf(j->err_code, sizeof j->err_code, "%s", code);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->err_msg, sizeof j->err_msg, fmt, ap);
    va_end(ap);
}

static void send_started(oai_job *j)
{
    if (j->started_sent)
        return;
    j->started_sent = true;
    j->sink.started(j->sink.ctx);
}

static void emit_text(oai_job *j, const char *text, size_t len)
{
    if (len == 0)
        return;
    send_started(j); /* the contract: started before the first token */
    if (!j->t_first_us)
        j->t_first_us = gp_now_mono_us();
    j->ntokens++;
    j->sink.token(j->sink.ctx, text, len, -1);
}

static void take_usage(oai_job *j, json_t *usage)
{
    if (!json_is_object(usage))
        return;
    json_t *pt = json_object_get(usage, "prompt_tokens");
    json_t *ct = json_object_get(usage, "completion_tokens");
    if (json_is_integer(pt))
        j->prompt_tokens = json_integer_value(pt);
    if (json_is_integer(ct))
        j->completion_tokens = json_integer_value(ct);
}

/* Which stop string an upstream stopped on, when it says so: vLLM puts it
 * in the choice's "stop_reason", llama-server in "stopping_word". Taken
 * only when it is one of the job's own (an upstream cannot name others). */
static void take_stop_word(oai_job *j, const json_t *v)
{
    const char *w = json_string_value(v);
    size_t i;
    const json_t *s;
    if (!w || !*w || j->stop_seq)
        return;
    json_array_foreach(j->stops, i, s)
    {
        if (json_is_string(s) && strcmp(json_string_value(s), w) == 0) {
            j->stop_seq = strdup(w);
            return;
        }
    }
}

static void take_finish(oai_job *j, json_t *c0)
{
    const char *fr = json_string_value(json_object_get(c0, "finish_reason"));
    if (fr && *fr)
        snprintf(j->finish, sizeof j->finish, "%s", fr);
    take_stop_word(j, json_object_get(c0, "stop_reason"));
    take_stop_word(j, json_object_get(c0, "stopping_word"));
}

#define MAX_TOOL_CALLS 128

/* The tool_calls array of a delta (streamed: pieces with an index; the
 * first piece of a call carries id and name) or of a message (whole
 * calls). Each piece becomes one tool_call event. Returns 0, or 2 with the
 * job failed. */
static int take_tool_calls(oai_job *j, json_t *calls, bool streamed)
{
    if (!calls || json_is_null(calls))
        return 0;
    if (!json_is_array(calls)) {
        job_fail(j, "UPSTREAM_MALFORMED", "upstream tool_calls is not an array");
        return 2;
    }
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c)
    {
        json_t *ix = json_object_get(c, "index");
        json_t *fn = json_object_get(c, "function");
        json_t *args = json_object_get(fn, "arguments");
        /* Without an index (whole messages; some servers' streams): a
         * piece with a function name starts the next call, one without
         * continues the last. */
        long long index = json_is_integer(ix) ? json_integer_value(ix)
                          : !streamed || json_string_value(json_object_get(fn, "name"))
                              ? j->ntool_calls
                              : j->ntool_calls - 1;
        if (!json_is_object(c) || (ix && !json_is_integer(ix)) || index < 0 ||
            index >= MAX_TOOL_CALLS || (fn && !json_is_object(fn)) ||
            (args && !json_is_null(args) && !json_is_string(args))) {
            job_fail(j, "UPSTREAM_MALFORMED", "upstream sent a malformed tool call");
            return 2;
        }
        const char *id = json_string_value(json_object_get(c, "id"));
        const char *name = json_string_value(json_object_get(fn, "name"));
        bool first = index >= j->ntool_calls;
        if (first) {
            /* A call starts: it must say which function (ids are made up
             * when the upstream gives none). Calls arrive in index order. */
            if (!name || index != j->ntool_calls) {
                job_fail(j, "UPSTREAM_MALFORMED",
                         "upstream tool call %lld starts without a function name", index);
                return 2;
            }
            j->ntool_calls++;
        }
        char made[160];
        if (first && !id) {
            snprintf(made, sizeof made, "call_%s_%lld", j->id, index);
            id = made;
        }
        if (!j->t_first_us)
            j->t_first_us = gp_now_mono_us();
        send_started(j);
        if (j->sink.tool_call)
            j->sink.tool_call(j->sink.ctx, (int)index, first ? id : NULL, first ? name : NULL,
                          json_string_value(args) ? json_string_value(args) : "",
                          json_string_value(args) ? json_string_length(args) : 0);
    }
    return 0;
}

/* One parsed chunk object (streamed), or the whole reply (not streamed). */
static int handle_object(oai_job *j, json_t *obj, bool streamed)
{
    if (!json_is_object(obj)) {
        job_fail(j, "UPSTREAM_MALFORMED", "upstream sent a chunk that is not a JSON object");
        return 2;
    }
    json_t *err = json_object_get(obj, "error");
    if (err && !json_is_null(err)) {
        const char *m = json_string_value(json_object_get(err, "message"));
        if (!m)
            m = json_string_value(err);
        job_fail(j, "UPSTREAM_ERROR", "upstream reported an error: %.200s", m ? m : "(no message)");
        return 2;
    }
    json_t *choices = json_object_get(obj, "choices");
    if (choices && !json_is_array(choices)) {
        job_fail(j, "UPSTREAM_MALFORMED", "upstream chunk has a 'choices' that is not an array");
        return 2;
    }
    json_t *c0 = json_array_get(choices, 0);
    if (c0) {
        if (!json_is_object(c0)) {
            job_fail(j, "UPSTREAM_MALFORMED", "upstream choice is not an object");
            return 2;
        }
        json_t *t;
        if (j->chat)
            t = json_object_get(json_object_get(c0, streamed ? "delta" : "message"), "content");
        else
            t = json_object_get(c0, "text");
        if (t && !json_is_null(t) && !json_is_string(t)) {
            job_fail(j, "UPSTREAM_MALFORMED", "upstream text is not a string");
            return 2;
        }
        if (json_is_string(t))
            emit_text(j, json_string_value(t), json_string_length(t));
        if (j->chat && take_tool_calls(j,
                                       json_object_get(json_object_get(c0, streamed ? "delta"
                                                                                    : "message"),
                                                       "tool_calls"),
                                       streamed) != 0)
            return 2;
        take_finish(j, c0);
    } else if (!streamed) {
        job_fail(j, "UPSTREAM_MALFORMED", "upstream reply has no choices");
        return 2;
    }
    take_usage(j, json_object_get(obj, "usage"));
    take_stop_word(j, json_object_get(obj, "stopping_word"));
    /* An upstream that is itself a pool says how it ran the request (the
     * last stream chunk or the body); the end event passes it on. */
    json_t *meta = json_object_get(obj, "x_pool_meta");
    if (json_is_object(meta) && j->sink.upstream_meta)
        j->sink.upstream_meta(j->sink.ctx, meta);
    return 0;
}

/* SSE event data. Returns 0 to go on, 1 at [DONE], 2 on failure. */
static int on_sse_data(void *ud, const char *data, size_t len)
{
    oai_job *j = ud;
    if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
        j->done_seen = true;
        return 1;
    }
    json_error_t je;
    json_t *obj = json_loadb(data, len, 0, &je);
    if (!obj) {
        job_fail(j, "UPSTREAM_MALFORMED", "upstream sent a chunk that is not JSON (%s)", je.text);
        return 2;
    }
    int rc = handle_object(j, obj, true);
    json_decref(obj);
    return rc;
}

/* A stream said [DONE] inside a libcurl callback: the loop finishes the job
 * once curl_multi_socket_action returns (never from inside libcurl). The
 * transfer goes on meanwhile, so that the chunked body's end, usually in
 * the same read, lets the connection be reused. */
static void queue_done(oai_job *j)
{
    if (!j->b || j->done_queued)
        return;
    j->done_queued = true;
    j->in_next = j->b->done_list;
    j->b->done_list = j;
}

/* libcurl write callback. Returning anything but n aborts the transfer. */
static size_t on_write(char *p, size_t sz, size_t nm, void *ud)
{
    oai_job *j = ud;
    size_t n = sz * nm;
    j->last_byte_ms = gp_now_mono_ms();
    if (j->done_seen)
        return n; /* after [DONE]: the rest of the body is not read */
    if (j->mode == BODY_UNKNOWN) {
        job_fail(j, "UPSTREAM_MALFORMED", "upstream reply has no Content-Type");
        return 0;
    }
    switch (j->mode) {
    case BODY_ERROR:
        if (j->raw.len < MAX_ERRBODY)
            gp_buf_append(&j->raw, p, n < MAX_ERRBODY - j->raw.len ? n : MAX_ERRBODY - j->raw.len);
        return n;
    case BODY_JSON:
        if (j->raw.len + n > MAX_JSONBODY) {
            job_fail(j, "UPSTREAM_MALFORMED", "upstream reply larger than %u bytes", MAX_JSONBODY);
            return 0;
        }
        gp_buf_append(&j->raw, p, n);
        return n;
    case BODY_SSE: {
        int rc = agent_sse_feed(&j->sse, p, n, on_sse_data, j);
        if (rc == 0)
            return n;
        if (rc == 1) {
            queue_done(j);
            return n;
        }
        if (rc < 0)
            job_fail(j, "UPSTREAM_MALFORMED", "upstream sent an SSE line longer than %u bytes",
                     MAX_SSE_LINE);
        return 0; /* failure: stop reading */
    }
    default:
        return 0;
    }
}

/* Decide how to read the body, once the status and headers are in. */
static size_t on_header(char *p, size_t sz, size_t nm, void *ud)
{
    oai_job *j = ud;
    size_t n = sz * nm;
    j->last_byte_ms = gp_now_mono_ms();
    if (n >= 5 && strncmp(p, "HTTP/", 5) == 0) {
        /* status line: parse the code */
        const char *sp = memchr(p, ' ', n);
        j->status = sp ? strtol(sp + 1, NULL, 10) : 0;
        j->mode = j->status >= 200 && j->status < 300 ? BODY_UNKNOWN : BODY_ERROR;
        return n;
    }
    if ((n == 2 && p[0] == '\r' && p[1] == '\n') || (n == 1 && p[0] == '\n')) {
        /* The headers are in: a usable generation reply has started. */
        if (!j->count && j->status >= 200 && j->status < 300 &&
            (j->mode == BODY_SSE || j->mode == BODY_JSON))
            send_started(j);
        return n;
    }
    if (n > 13 && strncasecmp(p, "content-type:", 13) == 0 && j->status >= 200 &&
        j->status < 300) {
        const char *v = p + 13;
        while (*v == ' ' || *v == '\t')
            v++;
        if (strncasecmp(v, "text/event-stream", 17) == 0)
            j->mode = BODY_SSE;
        else if (strncasecmp(v, "application/json", 16) == 0)
            j->mode = BODY_JSON;
        else {
            char ct[64];
            size_t l = strcspn(v, "\r\n;");
            snprintf(ct, sizeof ct, "%.*s", (int)(l < 60 ? l : 60), v);
            job_fail(j, "UPSTREAM_MALFORMED", "upstream replied with Content-Type '%s'", ct);
            return 0;
        }
    }
    return n;
}

/* Fills err/msg for a finished non-2xx reply. */
static void fail_status(oai_job *j)
{
    json_t *b = json_loadb(j->raw.data ? j->raw.data : "", j->raw.len, 0, NULL);
    const char *m = json_string_value(json_object_get(json_object_get(b, "error"), "message"));
    if (!m)
        m = json_string_value(json_object_get(b, "error"));
    if (!m)
        m = json_string_value(json_object_get(b, "message"));
    if (m)
        job_fail(j, "UPSTREAM_ERROR", "upstream replied HTTP %ld: %.200s", j->status, m);
    else
        job_fail(j, "UPSTREAM_ERROR", "upstream replied HTTP %ld", j->status);
    json_decref(b);
}

/* ======================================================================== */
/* Job thread                                                               */
/* ======================================================================== */

/* After the transfer (or a failure to start it): turn what was read into the
 * job's terminal events. Kept apart from the curl loop so that the fuzz
 * target (tests/fuzz/fuzz_agent_stream.c) runs exactly this code. */
static void job_finish(oai_job *j, bool transfer_done, CURLcode result)
{
    if (atomic_load(&j->cancel)) {
        j->sink.error(j->sink.ctx, "CANCELLED", "the job was cancelled");
        return;
    }
    if (!j->failed && transfer_done && result != CURLE_OK && !j->done_seen) {
        if (result == CURLE_OPERATION_TIMEDOUT)
            job_fail(j, "UPSTREAM_TIMEOUT", "upstream: %s", curl_easy_strerror(result));
        else
            job_fail(j, "UPSTREAM_ERROR", "upstream connection failed: %s",
                     curl_easy_strerror(result));
    }
    if (!j->failed && (j->status < 200 || j->status >= 300))
        fail_status(j);
    if (!j->failed && j->mode == BODY_SSE && !j->done_seen) {
        int rc = agent_sse_finish(&j->sse, on_sse_data, j);
        if (rc == 0 && !j->done_seen && !j->failed)
            job_fail(j, "UPSTREAM_ERROR", "upstream stream ended before [DONE]");
    }
    if (!j->failed && j->mode == BODY_JSON) {
        json_error_t je;
        json_t *obj = json_loadb(j->raw.data ? j->raw.data : "", j->raw.len, 0, &je);
        if (!obj) {
            job_fail(j, "UPSTREAM_MALFORMED", "upstream reply is not JSON (%s)", je.text);
        } else {
            send_started(j);
            handle_object(j, obj, false);
        }
        json_decref(obj);
    }
    if (!j->failed && j->mode != BODY_SSE && j->mode != BODY_JSON)
        job_fail(j, "UPSTREAM_MALFORMED", "upstream reply has no usable body");
    if (j->failed) {
        j->sink.error(j->sink.ctx, j->err_code, j->err_msg);
        return;
    }
    send_started(j);
    {
        uint64_t now = gp_now_mono_us();
        long long ct = j->completion_tokens >= 0 ? j->completion_tokens : j->ntokens;
        json_t *m = json_object();
        if (j->t_first_us)
            json_object_set_new(m, "ttft_ms", json_real((double)(j->t_first_us - j->t_start_us) / 1000.0));
        if (j->t_first_us && now > j->t_first_us && ct > 1)
            json_object_set_new(m, "tokens_per_sec",
                                json_real((double)(ct - 1) * 1e6 / (double)(now - j->t_first_us)));
        json_object_set_new(m, "total_ms", json_real((double)(now - j->t_start_us) / 1000.0));
        j->sink.metrics(j->sink.ctx, m);
        json_decref(m);
        /* A reply that called tools ends with tool_calls whatever the
         * upstream said (some say "stop"), unless it ran out of tokens. */
        const char *fr = strcmp(j->finish, "length") == 0 ? "length"
                         : j->ntool_calls > 0 || strcmp(j->finish, "tool_calls") == 0
                             ? "tool_calls"
                             : "stop";
        if (j->stop_seq && strcmp(fr, "stop") == 0 && j->sink.stop_sequence)
            j->sink.stop_sequence(j->sink.ctx, j->stop_seq);
        j->sink.end(j->sink.ctx, fr, j->prompt_tokens, ct);
    }
}

/* Headers every upstream request carries. NULL on ENOMEM. */
static struct curl_slist *job_headers(oai_job *j)
{
    struct curl_slist *h = NULL, *n;
    char hv[300];
    const char *fixed[] = {"Content-Type: application/json", "Accept: text/event-stream",
                           "Expect:", j->b->auth_header};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
        if (!fixed[i])
            continue;
        if (!(n = curl_slist_append(h, fixed[i])))
            goto oom;
        h = n;
    }
    snprintf(hv, sizeof hv, "X-Gpupool-Job-Id: %s", j->id);
    if (!(n = curl_slist_append(h, hv)))
        goto oom;
    h = n;
    if (j->correlation_id) {
        snprintf(hv, sizeof hv, "X-Correlation-Id: %s", j->correlation_id);
        if (!(n = curl_slist_append(h, hv)))
            goto oom;
        h = n;
    }
    if (j->pool_via[0]) {
        if (!(n = curl_slist_append(h, j->pool_via)))
            goto oom;
        h = n;
    }
    if (j->pool_options) {
        if (!(n = curl_slist_append(h, j->pool_options)))
            goto oom;
        h = n;
    }
    return h;
oom:
    curl_slist_free_all(h);
    return NULL;
}

/* ======================================================================== */
/* The loop thread: libevent + curl_multi_socket_action                     */
/* ======================================================================== */

static void job_free(oai_job *j)
{
    if (j->easy)
        curl_easy_cleanup(j->easy);
    curl_slist_free_all(j->hdrs);
    agent_sse_free(&j->sse);
    gp_buf_free(&j->raw);
    free(j->body);
    free(j->count_body);
    json_decref(j->stops);
    free(j->stop_seq);
    free(j->correlation_id);
    free(j->pool_options);
    free(j);
}

/* The job's terminal event has been delivered: forget it (job_cancel no
 * longer finds it) and free it. */
static void job_release(oai_backend *b, oai_job *j)
{
    pthread_mutex_lock(&b->mu);
    if (j->prev)
        j->prev->next = j->next;
    else
        b->jobs = j->next;
    if (j->next)
        j->next->prev = j->prev;
    pthread_mutex_unlock(&b->mu);
    b->nrunning--;
    if (b->nrunning == 0)
        evtimer_del(b->sweep_timer); /* nothing to watch for stalls */
    job_free(j);
}

/* Stop the job's transfer, if one runs. Removing an unfinished transfer
 * closes its connection: the upstream sees the client go away. */
static void xfer_drop(oai_backend *b, oai_job *j)
{
    if (!j->easy)
        return;
    curl_multi_remove_handle(b->multi, j->easy);
    curl_easy_cleanup(j->easy);
    j->easy = NULL;
}

/* Start one POST of body to url, read through on_header/on_write into j.
 * Returns 0, or -1 with the job failed (nothing started). */
static int xfer_start(oai_backend *b, oai_job *j, const char *url, const char *body)
{
    const agent_options *o = b->o;
    CURL *easy = curl_easy_init();
    if (!easy) {
        job_fail(j, "INTERNAL_ERROR", "cannot create an HTTP handle");
        return -1;
    }
    j->last_byte_ms = gp_now_mono_ms();
    curl_easy_setopt(easy, CURLOPT_URL, url);
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, j->hdrs);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, j);
    curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(easy, CURLOPT_HEADERDATA, j);
    curl_easy_setopt(easy, CURLOPT_PRIVATE, j);
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, (long)o->upstream_connect_timeout_sec * 1000);
    curl_easy_setopt(easy, CURLOPT_USERAGENT, "gpupool-agent/" AGENT_VERSION);
    curl_easy_setopt(easy, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(easy, CURLOPT_BUFFERSIZE, OAI_RECV_BUFFER);
    if (o->ca_file)
        curl_easy_setopt(easy, CURLOPT_CAINFO, o->ca_file);
    if (curl_multi_add_handle(b->multi, easy) != CURLM_OK) {
        job_fail(j, "INTERNAL_ERROR", "cannot start the upstream request");
        curl_easy_cleanup(easy);
        return -1;
    }
    j->easy = easy;
    return 0;
}

/* Forget what one count attempt read, before the next method. */
static void count_reset(oai_job *j)
{
    j->failed = false;
    j->err_code[0] = j->err_msg[0] = '\0';
    j->status = 0;
    j->mode = BODY_UNKNOWN;
    j->raw.len = 0;
}

/* The metrics event that marks a count as an estimate (the sink copies it). */
static void mark_estimated(oai_job *j)
{
    json_t *m = json_pack("{s:i}", "count_estimated", 1);
    if (m)
        j->sink.metrics(j->sink.ctx, m);
    json_decref(m);
}

static void count_try(oai_backend *b, oai_job *j);

/* count_tokens: one method's transfer ended (done: it ran to its end,
 * result its code). A count never fails for want of an endpoint: the next
 * method, and the estimate last (openai_count.h). */
static void count_step_done(oai_backend *b, oai_job *j, bool done, CURLcode result)
{
    int m = j->count_m;
    const char *url = m == OAI_COUNT_MESSAGES ? b->url_count : b->url_tokenize;
    long long n = 0;
    bool est = false;
    if (done && result == CURLE_OK && j->status >= 200 && j->status < 300 &&
        oai_count_parse((oai_count_method)m, j->raw.data, j->raw.len, &n, &est) == 0) {
        atomic_store(&b->count_method, m);
        send_started(j);
        if (est)
            mark_estimated(j);
        j->sink.end(j->sink.ctx, "stop", n, 0);
        job_release(b, j);
        return;
    }
    gp_log_write(GP_LOG_DEBUG, "count_method_failed", j->correlation_id,
                 json_pack("{s:s,s:s,s:i}", "job_id", j->id, "url", url, "status",
                           (int)j->status),
                 "job %s: %s gave no count (HTTP %ld%s%s); trying the next method", j->id, url,
                 j->status, j->failed ? ": " : "", j->failed ? j->err_msg : "");
    j->count_m++;
    count_try(b, j);
}

/* count_tokens: start the method j->count_m or the next one that has a
 * body; past the last, the estimate (marked as such). */
static void count_try(oai_backend *b, oai_job *j)
{
    for (; j->count_m < OAI_COUNT_ESTIMATE; j->count_m++) {
        int m = j->count_m;
        const char *body = m == OAI_COUNT_MESSAGES ? j->count_body : j->body;
        if (!body)
            continue;
        count_reset(j);
        if (xfer_start(b, j, m == OAI_COUNT_MESSAGES ? b->url_count : b->url_tokenize, body) == 0)
            return; /* count_step_done when it ends */
        count_step_done(b, j, false, CURLE_OK);
        return;
    }
    /* Neither endpoint answered (none there, or the upstream is down):
     * estimate, and say so. */
    atomic_store(&b->count_method, j->count_first == OAI_COUNT_MESSAGES ? OAI_COUNT_MESSAGES
                                                                         : OAI_COUNT_TOKENIZE);
    send_started(j);
    mark_estimated(j);
    j->sink.end(j->sink.ctx, "stop", j->count_estimate, 0);
    job_release(b, j);
}

/* A transfer is over (done: it ran to its end with result; else it was
 * stopped, the job failed): drop it and report, or try the next count
 * method. */
static void xfer_end(oai_backend *b, oai_job *j, bool done, CURLcode result)
{
    xfer_drop(b, j);
    if (j->count) {
        count_step_done(b, j, done, result);
        return;
    }
    job_finish(j, done, result);
    job_release(b, j);
}

/* A job taken from the inbox: build its headers and start its first
 * transfer. */
static void job_begin(oai_backend *b, oai_job *j)
{
    b->nrunning++;
    if (b->nrunning == 1) {
        struct timeval tv = {0, 200 * 1000};
        evtimer_add(b->sweep_timer, &tv);
    }
    j->t_start_us = gp_now_mono_us();
    j->last_byte_ms = gp_now_mono_ms();
    j->hdrs = job_headers(j);
    if (!j->hdrs) {
        job_fail(j, "INTERNAL_ERROR", "out of memory");
        if (!j->count) {
            xfer_end(b, j, false, CURLE_OK);
            return;
        }
    }
    if (j->count) {
        j->count_first = j->count_m = atomic_load(&b->count_method);
        count_try(b, j);
        return;
    }
    if (xfer_start(b, j, j->chat ? b->url_chat : b->url_completions, j->body) != 0)
        xfer_end(b, j, false, CURLE_OK);
}

/* A cancelled job: stop its transfer and report it over. */
static void job_stop(oai_backend *b, oai_job *j)
{
    xfer_drop(b, j);
    j->sink.error(j->sink.ctx, "CANCELLED", "the job was cancelled");
    job_release(b, j);
}

/* After libcurl ran: finish the transfers it completed and the streams
 * that said [DONE] while their transfer still runs (the upstream has not
 * ended the body yet: nothing more is wanted from it; dropping the
 * transfer closes that connection). Completed ones are collected first so
 * that no job is freed while the [DONE] list still points at it. */
static void loop_settle(oai_backend *b)
{
    oai_job *completed = NULL;
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(b->multi, &left))) {
        char *priv = NULL;
        if (m->msg != CURLMSG_DONE)
            continue;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, &priv);
        oai_job *j = (oai_job *)priv;
        if (!j || j->completed)
            continue;
        j->completed = true;
        j->result = m->data.result;
        j->fin_next = completed;
        completed = j;
    }
    oai_job *list = b->done_list;
    b->done_list = NULL;
    while (list) {
        oai_job *j = list;
        list = j->in_next;
        bool was_queued = j->done_queued;
        j->done_queued = false;
        if (was_queued && !j->completed)
            xfer_end(b, j, true, CURLE_OK);
    }
    while (completed) {
        oai_job *j = completed;
        completed = j->fin_next;
        j->completed = false;
        xfer_end(b, j, true, j->result);
    }
}

static void on_sock_event(evutil_socket_t fd, short what, void *arg)
{
    oai_backend *b = arg;
    int action = ((what & EV_READ) ? CURL_CSELECT_IN : 0) | ((what & EV_WRITE) ? CURL_CSELECT_OUT : 0);
    int running = 0;
    curl_multi_socket_action(b->multi, fd, action, &running);
    loop_settle(b);
}

static void on_curl_timer(evutil_socket_t fd, short what, void *arg)
{
    oai_backend *b = arg;
    int running = 0;
    (void)fd;
    (void)what;
    curl_multi_socket_action(b->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    loop_settle(b);
}

/* CURLMOPT_SOCKETFUNCTION: watch s as libcurl asks (socketp: its event). */
static int on_curl_socket(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp)
{
    oai_backend *b = userp;
    struct event *ev = socketp;
    (void)easy;
    if (what == CURL_POLL_REMOVE) {
        if (ev)
            event_free(ev);
        return 0;
    }
    short kind = (short)(((what & CURL_POLL_IN) ? EV_READ : 0) |
                         ((what & CURL_POLL_OUT) ? EV_WRITE : 0) | EV_PERSIST);
    if (ev) {
        event_del(ev);
        event_assign(ev, b->evb, s, kind, on_sock_event, b);
    } else {
        ev = event_new(b->evb, s, kind, on_sock_event, b);
        if (!ev)
            return -1;
        curl_multi_assign(b->multi, s, ev);
    }
    event_add(ev, NULL);
    return 0;
}

/* CURLMOPT_TIMERFUNCTION: one timer for libcurl's next timeout. */
static int on_curl_timeout(CURLM *multi, long timeout_ms, void *userp)
{
    oai_backend *b = userp;
    (void)multi;
    if (timeout_ms < 0) {
        evtimer_del(b->curl_timer);
        return 0;
    }
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    evtimer_add(b->curl_timer, &tv);
    return 0;
}

/* Every 200 ms while jobs run: a transfer with no byte from the upstream
 * for upstream-timeout-sec fails with UPSTREAM_TIMEOUT. */
static void on_sweep(evutil_socket_t fd, short what, void *arg)
{
    oai_backend *b = arg;
    (void)fd;
    (void)what;
    uint64_t now = gp_now_mono_ms(), stall_ms = (uint64_t)b->o->upstream_timeout_sec * 1000;
    oai_job *stalled = NULL;
    pthread_mutex_lock(&b->mu); /* the list; its transfers are the loop's */
    for (oai_job *j = b->jobs; j; j = j->next)
        if (j->easy && !j->done_queued && now - j->last_byte_ms > stall_ms) {
            j->in_next = stalled;
            stalled = j;
        }
    pthread_mutex_unlock(&b->mu);
    while (stalled) {
        oai_job *j = stalled;
        stalled = j->in_next;
        job_fail(j, "UPSTREAM_TIMEOUT", "no data from the upstream for %lld s",
                 (long long)b->o->upstream_timeout_sec);
        xfer_end(b, j, false, CURLE_OK);
    }
}

/* The pipe says other threads queued work: new jobs, cancels, a stop. */
static void on_wake(evutil_socket_t fd, short what, void *arg)
{
    oai_backend *b = arg;
    char buf[64];
    (void)what;
    while (read(fd, buf, sizeof buf) > 0)
        ;
    atomic_store(&b->wake_sent, false); /* before reading the state: no wake lost */
    oai_job *in = NULL, *cancelled = NULL;
    pthread_mutex_lock(&b->mu);
    in = b->inbox;
    b->inbox = NULL;
    b->inbox_tail = &b->inbox;
    if (b->cancel_pending) {
        b->cancel_pending = false;
        for (oai_job *j = b->jobs; j; j = j->next)
            if (atomic_load(&j->cancel) && !j->cancel_taken)
                j->cancel_taken = true;
    }
    if (b->stopping)
        b->leaving = true;
    pthread_mutex_unlock(&b->mu);
    /* New jobs in arrival order; one cancelled before it began never starts. */
    while (in) {
        oai_job *j = in;
        in = j->in_next;
        if (j->cancel_taken) {
            b->nrunning++;
            job_stop(b, j);
        } else {
            job_begin(b, j);
        }
    }
    /* Cancelled jobs that had begun (a job is freed only on this thread). */
    pthread_mutex_lock(&b->mu);
    for (oai_job *j = b->jobs; j; j = j->next)
        if (j->cancel_taken) {
            j->cancel_taken = false; /* listed once */
            j->in_next = cancelled;
            cancelled = j;
        }
    pthread_mutex_unlock(&b->mu);
    while (cancelled) {
        oai_job *j = cancelled;
        cancelled = j->in_next;
        job_stop(b, j);
    }
    loop_settle(b);
    if (b->leaving && b->nrunning == 0)
        event_base_loopbreak(b->evb);
}

static void *loop_main(void *arg)
{
    oai_backend *b = arg;
    event_base_dispatch(b->evb);
    return NULL;
}

/* Another thread: make the loop look at the shared state. */
static void loop_wake(oai_backend *b)
{
    if (!atomic_exchange(&b->wake_sent, true)) {
        ssize_t w;
        do
            w = write(b->wake_fd[1], "x", 1);
        while (w < 0 && errno == EINTR);
    }
}

/* ======================================================================== */
/* Request building (agent thread)                                          */
/* ======================================================================== */

static const char *const pass_params[] = {"max_tokens", "temperature", "top_p", "top_k",
                                          "min_p", "stop", "seed", "presence_penalty",
                                          "frequency_penalty", "repeat_penalty"};

/* The upstream request body for a job, or NULL with err set. New reference. */
static json_t *build_request(oai_backend *b, json_t *job, bool *chat, bool *count, char *err,
                             size_t errlen)
{
    *count = false;
    const char *kind = json_string_value(json_object_get(job, "kind"));
    const char *cont = json_string_value(json_object_get(job, "continuation"));
    json_t *req = json_pack("{s:s,s:b,s:{s:b}}", "model", b->o->upstream_model, "stream", 1,
                            "stream_options", "include_usage", 1);
    if (!req) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (kind && strcmp(kind, "completion") == 0) {
        const char *prompt = json_string_value(json_object_get(job, "prompt"));
        if (!prompt) {
            snprintf(err, errlen, "completion job without a string prompt");
            goto fail;
        }
        *chat = false;
        size_t pl = strlen(prompt), cl = cont ? strlen(cont) : 0;
        char *full = malloc(pl + cl + 1);
        if (!full) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
        memcpy(full, prompt, pl);
        if (cl)
            memcpy(full + pl, cont, cl);
        full[pl + cl] = '\0';
        json_object_set_new(req, "prompt", json_string(full));
        free(full);
    } else if (kind && strcmp(kind, "chat") == 0) {
        json_t *msgs = json_object_get(job, "messages");
        if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
            snprintf(err, errlen, "chat job without messages");
            goto fail;
        }
        *chat = true;
        json_t *copy = json_deep_copy(msgs); /* forwarded as they are */
        if (cont && *cont) {
            /* Failover: the assistant's partial answer; servers that support
             * assistant prefill (llama-server, vLLM) continue from it. */
            json_array_append_new(copy, json_pack("{s:s,s:s}", "role", "assistant", "content", cont));
        }
        json_object_set_new(req, "messages", copy);
        /* Tools go upstream as they are (already OpenAI function tools);
         * the upstream decides whether its model can call them. */
        json_t *tools = json_object_get(job, "tools");
        if (json_is_array(tools) && json_array_size(tools) > 0) {
            json_object_set(req, "tools", tools);
            json_t *tc = json_object_get(job, "tool_choice");
            if (tc && !json_is_null(tc))
                json_object_set(req, "tool_choice", tc);
        }
    } else if (kind && strcmp(kind, "count_tokens") == 0) {
        /* The /tokenize body (llama-server reads "content", vLLM "prompt");
         * oai_job_start adds the other methods' (openai_count.h). */
        char *text = gp_count_text(job);
        json_decref(req);
        if (!text) {
            snprintf(err, errlen, "count_tokens job without a prompt or messages");
            return NULL;
        }
        json_t *t = json_string(text);
        free(text);
        if (!t) {
            snprintf(err, errlen, "count_tokens text is not valid UTF-8");
            return NULL;
        }
        *count = true;
        return json_pack("{s:s,s:O,s:o,s:b}", "model", b->o->upstream_model, "content", t,
                         "prompt", t, "add_special", 1);
    } else {
        snprintf(err, errlen, "job kind '%s' is not supported by the openai backend",
                 kind ? kind : "(none)");
        goto fail;
    }
    json_t *params = json_object_get(job, "params");
    for (size_t i = 0; i < sizeof pass_params / sizeof pass_params[0]; i++) {
        json_t *v = json_object_get(params, pass_params[i]);
        if (!v || json_is_null(v))
            continue;
        if (strcmp(pass_params[i], "top_k") == 0 && json_integer_value(v) <= 0)
            continue; /* 0 = disabled; some servers reject it */
        json_object_set(req, pass_params[i], v);
    }
    return req;
fail:
    json_decref(req);
    return NULL;
}

/* ======================================================================== */
/* vtable                                                                   */
/* ======================================================================== */

static json_t *oai_models(agent_backend *base)
{
    oai_backend *b = (oai_backend *)base;
    /* supports_tools: the upstream decides what its model does with them. */
    return json_pack("[{s:s,s:[],s:n,s:n,s:n,s:n,s:n,s:b,s:s,s:s,s:b}]", "id", b->public_id,
                     "aliases", "quantization", "context_length", "bytes", "vram_bytes",
                     "architecture", "loaded", 1, "backend", "openai", "upstream_model",
                     b->o->upstream_model, "supports_tools", 1);
}

/* The pool options that matter to an upstream pool (docs/protocol.md): the
 * job's session key (its affinity there too) and a batch priority, as an
 * X-Pool-Options header line. A header, not a body field: a plain
 * OpenAI-compatible server ignores it, where some refuse unknown fields.
 * *out stays NULL when there is nothing to say. -1: out of memory. */
static int pool_options_header(json_t *job, char **out)
{
    *out = NULL;
    const char *session = json_string_value(json_object_get(job, "session"));
    const char *prio = json_string_value(json_object_get(job, "priority"));
    json_t *o = json_object();
    if (!o)
        return -1;
    /* The server bounded the session (256 bytes); JSON escaping keeps CR/LF
     * out of the header line. */
    if (session && *session)
        json_object_set_new(o, "session", json_string(session));
    if (prio && strcmp(prio, "batch") == 0)
        json_object_set_new(o, "priority", json_string("batch"));
    int rc = 0;
    if (json_object_size(o) > 0) {
        char *v = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
        size_t n = v ? strlen(v) + sizeof "X-Pool-Options: " : 0;
        if (v && (*out = malloc(n)))
            snprintf(*out, n, "X-Pool-Options: %s", v);
        else
            rc = -1;
        free(v);
    }
    json_decref(o);
    return rc;
}

static int oai_job_start(agent_backend *base, json_t *job, const agent_job_sink *sink, char *err,
                         size_t errlen)
{
    oai_backend *b = (oai_backend *)base;
    const char *id = json_string_value(json_object_get(job, "job_id"));
    if (!id || strlen(id) >= 128) {
        snprintf(err, errlen, "job without a valid job_id");
        return -1;
    }
    bool chat = false, count = false;
    json_t *req = build_request(b, job, &chat, &count, err, errlen);
    if (!req)
        return -1;
    oai_job *j = calloc(1, sizeof *j);
    if (!j) {
        json_decref(req);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    snprintf(j->id, sizeof j->id, "%s", id);
    j->b = b;
    j->sink = *sink;
    j->chat = chat;
    j->count = count;
    j->prompt_tokens = -1;
    j->completion_tokens = -1;
    atomic_init(&j->cancel, false);
    agent_sse_init(&j->sse, MAX_SSE_LINE);
    gp_buf_init(&j->raw);
    j->body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    json_t *stops = json_object_get(json_object_get(job, "params"), "stop");
    if (json_is_array(stops) && json_array_size(stops) > 0)
        j->stops = json_deep_copy(stops);
    if (count) {
        json_t *cb = oai_count_messages_body(job, b->o->upstream_model);
        j->count_body = cb ? json_dumps(cb, JSON_COMPACT) : NULL;
        json_decref(cb);
        j->count_estimate = gp_count_estimate(job);
    }
    const char *cid = json_string_value(json_object_get(job, "correlation_id"));
    if (cid && strlen(cid) < 200 && !strpbrk(cid, "\r\n"))
        j->correlation_id = strdup(cid);
    /* The pools the job came through: an upstream pool refuses a loop
     * (docs/protocol.md). Ids and separators only, bounded by the server. */
    const char *via = json_string_value(json_object_get(job, "pool_via"));
    if (via && strlen(via) < 128 && strspn(via, "0123456789abcdefABCDEF, ") == strlen(via))
        snprintf(j->pool_via, sizeof j->pool_via, "X-Pool-Via: %s", via);
    if (pool_options_header(job, &j->pool_options) < 0) {
        job_free(j);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (!j->body) {
        job_free(j);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    /* The loop takes it from the inbox (job_begin); cancel finds it in jobs. */
    pthread_mutex_lock(&b->mu);
    j->next = b->jobs;
    if (b->jobs)
        b->jobs->prev = j;
    b->jobs = j;
    *b->inbox_tail = j;
    b->inbox_tail = &j->in_next;
    pthread_mutex_unlock(&b->mu);
    loop_wake(b);
    return 0;
}

static void oai_job_cancel(agent_backend *base, const char *job_id)
{
    oai_backend *b = (oai_backend *)base;
    bool found = false;
    pthread_mutex_lock(&b->mu);
    for (oai_job *j = b->jobs; j; j = j->next)
        if (strcmp(j->id, job_id) == 0 && !atomic_load(&j->cancel)) {
            atomic_store(&j->cancel, true);
            b->cancel_pending = found = true;
        }
    pthread_mutex_unlock(&b->mu);
    if (found)
        loop_wake(b);
}

static void oai_destroy(agent_backend *base)
{
    oai_backend *b = (oai_backend *)base;
    if (!b)
        return;
    if (b->th_started) {
        /* Cancel everything; the loop delivers each terminal event, then
         * leaves once no job runs. */
        pthread_mutex_lock(&b->mu);
        for (oai_job *j = b->jobs; j; j = j->next)
            atomic_store(&j->cancel, true);
        b->cancel_pending = b->stopping = true;
        pthread_mutex_unlock(&b->mu);
        loop_wake(b);
        pthread_join(b->th, NULL);
    }
    if (b->multi)
        curl_multi_cleanup(b->multi); /* closes the kept-alive connections */
    if (b->wake_ev)
        event_free(b->wake_ev);
    if (b->curl_timer)
        event_free(b->curl_timer);
    if (b->sweep_timer)
        event_free(b->sweep_timer);
    if (b->evb)
        event_base_free(b->evb);
    for (int i = 0; i < 2; i++)
        if (b->wake_fd[i] >= 0)
            close(b->wake_fd[i]);
    pthread_mutex_destroy(&b->mu);
    free(b->url_chat);
    free(b->url_completions);
    free(b->url_tokenize);
    free(b->url_count);
    free(b->public_id);
    free(b->auth_header);
    free(b);
}

/* The loop's event base, wake pipe, timers and multi handle, then its
 * thread. 0, or -1 with err set (oai_destroy frees what was made). */
static int loop_init(oai_backend *b, char *err, size_t errlen)
{
    if (pipe(b->wake_fd) != 0) {
        snprintf(err, errlen, "openai backend: pipe: %s", strerror(errno));
        return -1;
    }
    for (int i = 0; i < 2; i++) {
        fcntl(b->wake_fd[i], F_SETFL, fcntl(b->wake_fd[i], F_GETFL) | O_NONBLOCK);
        fcntl(b->wake_fd[i], F_SETFD, FD_CLOEXEC);
    }
    b->evb = event_base_new();
    b->multi = curl_multi_init();
    if (b->evb) {
        b->wake_ev = event_new(b->evb, b->wake_fd[0], EV_READ | EV_PERSIST, on_wake, b);
        b->curl_timer = evtimer_new(b->evb, on_curl_timer, b);
        b->sweep_timer = event_new(b->evb, -1, EV_PERSIST, on_sweep, b);
    }
    if (!b->evb || !b->multi || !b->wake_ev || !b->curl_timer || !b->sweep_timer ||
        event_add(b->wake_ev, NULL) != 0) {
        snprintf(err, errlen, "openai backend: cannot set up its event loop");
        return -1;
    }
    curl_multi_setopt(b->multi, CURLMOPT_SOCKETFUNCTION, on_curl_socket);
    curl_multi_setopt(b->multi, CURLMOPT_SOCKETDATA, b);
    curl_multi_setopt(b->multi, CURLMOPT_TIMERFUNCTION, on_curl_timeout);
    curl_multi_setopt(b->multi, CURLMOPT_TIMERDATA, b);
    /* Idle connections kept for reuse: one per slot is what a full agent
     * can use again at once. */
    long slots = b->o->slots > 0 ? (long)b->o->slots : 1;
    curl_multi_setopt(b->multi, CURLMOPT_MAXCONNECTS, slots + 4);
    if (pthread_create(&b->th, NULL, loop_main, b) != 0) {
        snprintf(err, errlen, "openai backend: cannot start its loop thread");
        return -1;
    }
    b->th_started = true;
    return 0;
}

static const agent_backend_ops oai_ops = {
    .name = "openai",
    .destroy = oai_destroy,
    .models = oai_models,
    .poll_facts = NULL,
    .job_start = oai_job_start,
    .job_cancel = oai_job_cancel,
};

/* "http://h:p" -> "http://h:p/v1/<ep>"; "http://h:p/v1" -> ".../v1/<ep>". */
static char *endpoint(const char *base, const char *ep)
{
    size_t n = strlen(base);
    while (n > 0 && base[n - 1] == '/')
        n--;
    bool has_v1 = n >= 3 && strncmp(base + n - 3, "/v1", 3) == 0;
    size_t len = n + strlen(ep) + 8;
    char *out = malloc(len);
    if (out)
        snprintf(out, len, "%.*s%s/%s", (int)n, base, has_v1 ? "" : "/v1", ep);
    return out;
}

/* "http://h:p[/v1]" -> "http://h:p/tokenize" (the server root, not /v1). */
static char *root_endpoint(const char *base, const char *ep)
{
    size_t n = strlen(base);
    while (n > 0 && base[n - 1] == '/')
        n--;
    if (n >= 3 && strncmp(base + n - 3, "/v1", 3) == 0)
        n -= 3;
    size_t len = n + strlen(ep) + 2;
    char *out = malloc(len);
    if (out)
        snprintf(out, len, "%.*s/%s", (int)n, base, ep);
    return out;
}

agent_backend *agent_backend_openai_create(const agent_options *o, char *err, size_t errlen)
{
    if (!o->upstream || !o->upstream_model) {
        snprintf(err, errlen, "openai backend: --upstream and --upstream-model are required");
        return NULL;
    }
    oai_backend *b = calloc(1, sizeof *b);
    if (!b) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    b->base.ops = &oai_ops;
    b->o = o;
    pthread_mutex_init(&b->mu, NULL);
    b->inbox_tail = &b->inbox;
    b->wake_fd[0] = b->wake_fd[1] = -1;
    atomic_init(&b->wake_sent, false);
    b->url_chat = endpoint(o->upstream, "chat/completions");
    b->url_completions = endpoint(o->upstream, "completions");
    b->url_tokenize = root_endpoint(o->upstream, "tokenize");
    b->url_count = root_endpoint(o->upstream, "v1/messages/count_tokens");
    atomic_init(&b->count_method, OAI_COUNT_MESSAGES);
    b->public_id = strdup(o->alias && *o->alias ? o->alias : o->upstream_model);
    if (o->upstream_key && *o->upstream_key) {
        size_t n = strlen(o->upstream_key) + 32;
        b->auth_header = malloc(n);
        if (b->auth_header)
            snprintf(b->auth_header, n, "Authorization: Bearer %s", o->upstream_key);
    }
    if (!b->url_chat || !b->url_completions || !b->url_tokenize || !b->url_count ||
        !b->public_id ||
        (o->upstream_key && *o->upstream_key && !b->auth_header)) {
        oai_destroy(&b->base);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (loop_init(b, err, errlen) != 0) {
        oai_destroy(&b->base);
        return NULL;
    }
    gp_log_info("backend_openai", "relaying model '%s' to %s (upstream model '%s')",
                b->public_id, o->upstream, o->upstream_model);
    return &b->base;
}
