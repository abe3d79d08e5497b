/*
 * backend_openai: relay jobs to an existing OpenAI-compatible server
 * (llama.cpp's llama-server, vLLM, Ollama, another gpupool-server).
 *
 * Every job on the agent's own loop, as nginx's upstream module runs
 * (bind_loop, backend.h): one libcurl multi handle driven through
 * curl_multi_socket_action on the agent's event_base, so an agent with
 * --slots 1024 holds 1,024 upstream streams on the one thread that also
 * talks to the server, about 15 KiB each (mostly libcurl's easy handle,
 * its 4 KiB receive buffer and connection; docs/scaling.md). A job, its
 * tokens and its upload never cross a thread (issue 24: the two hand-offs
 * between a loop thread here and the agent's were ~73 us a request at one
 * client).
 * Connections to the upstream are kept alive and reused between jobs (a
 * stream that said [DONE] still reads its body's end: xfer_done_early).
 * New work goes ahead of relaying: new jobs, and transfers whose reply has
 * not begun, at a higher libevent priority than the streams (AGENT_PRI_*),
 * and a new transfer starts in the turn that takes its job.
 * job_start and job_cancel (the agent, between two of the loop's
 * callbacks) queue their work and activate the backend's wake event; its
 * callback starts transfers, and a cancel drops the transfer at once (the
 * upstream sees its client go away and stops generating). The embeddings
 * probe thread never touches curl's multi handle or the loop. Handles are
 * removed only outside libcurl's callbacks (a
 * stream that said [DONE] is finished after curl_multi_socket_action
 * returns). The request is always streamed (stream: true,
 * stream_options.include_usage) so tokens are relayed as they arrive; the
 * server turns them back into one body for non-streaming clients.
 *
 * Stop strings are the agent's: params.stop is not sent upstream (an
 * upstream that stops on one rarely says which, and the Anthropic dialect
 * must name it); openai_stream.c matches them and a match drops the
 * transfer, as a cancel does. A job with prompt_tokens_first (an Anthropic
 * stream: message_start shows the prompt's size) counts its prompt first
 * with the count_tokens methods (openai_count.h) and reports it as a
 * progress event before generating.
 *
 * Structured output: a job's `response_format` goes upstream as it is, and
 * what comes back is checked against it, as are the arguments of calls of
 * tools with "strict": true (openai_schema.h): a reply that does not
 * satisfy the schema fails with UPSTREAM_INVALID_OUTPUT.
 * Tools: a job's `tools`/`tool_choice` go upstream as they are (the model
 * facts say supports_tools: the upstream decides); the reply's tool_calls
 * (streamed pieces or a whole message) become tool_call events, and a reply
 * that called tools ends with finish_reason "tool_calls".
 *
 * Embeddings jobs (openai_embed.h) are one non-streamed POST /v1/embeddings
 * each, read whole as a count's reply is (16 MiB at most); the model facts
 * offer them only once the upstream answered a probe (at start-up, then
 * again on the probe thread while it gives no answer).
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
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <event2/event.h>
#include <jansson.h>

#include "agent/backend.h"
#include "agent/curl_loop.h"
#include "agent/openai_count.h"
#include "agent/openai_embed.h"
#include "agent/openai_schema.h"
#include "agent/openai_stream.h"
#include "agent/relay_set.h"
#include "common/gp_log.h"
#include "common/gp_count.h"
#include "common/gp_json.h"
#include "common/gp_util.h"

#ifndef AGENT_VERSION
#define AGENT_VERSION "0.0.0"
#endif

#define MAX_SSE_LINE (4u << 20)     /* one SSE line / event */
/* libcurl's receive buffer per transfer (its default is 16 KiB): a stream's
 * events are a few hundred bytes, and 1,024 streams hold 1,024 of these. */
#define OAI_RECV_BUFFER 4096L
#define COUNT_NONE_MS 60000 /* see count_none_ms */
/* An upstream that gave the embeddings probe no answer (down, loading) is
 * asked again after this, doubling up to PROBE_RETRY_MAX_S. */
#define PROBE_RETRY_FIRST_S 10
#define PROBE_RETRY_MAX_S 300
/* The loop's event priorities are backend.h's AGENT_PRI_* (issue 24). New
 * work goes first: the wake event (new jobs, cancels), libcurl's timer,
 * and the sockets of transfers whose reply has not begun; then the streams
 * already relaying. At 1,000 paced streams a turn of the loop carried
 * ~2,000 token reads, and a new job waited behind one turn to be taken and
 * two more for its request and its first reply (~150 ms of a ~220 ms time
 * to first token). */
/* How long a transfer whose stream said [DONE] waits for the body's end
 * (see xfer_done_early) before its connection is closed instead. */
#define OAI_LINGER_MS 1000

typedef struct oai_backend oai_backend;

#define HDR_JOB_ID "X-Gpupool-Job-Id: "
#define HDR_CORR "X-Correlation-Id: "

typedef struct oai_job {
    struct oai_job *prev, *next; /* b->jobs (under b->mu) */
    struct oai_job *in_next;     /* b->inbox, then the loop's work lists */
    oai_backend *b;
    /* The job's own header lines (job_lines), which hold its id and
     * correlation id: each kept once, as the line sent (issue 24). */
    char h_job_id[sizeof HDR_JOB_ID + 127]; /* HDR_JOB_ID and the id (< 128 bytes) */
    const char *id;         /* the job id: the tail of h_job_id */
    char *h_corr;           /* HDR_CORR and the correlation id (owned), or NULL */
    const char *correlation_id; /* the tail of h_corr, or NULL */
    char *pool_via;         /* X-Pool-Via header line (owned), or NULL */
    char *body;             /* the generation request JSON (owned); NULL for a count job */
    char *tok_body;         /* count: the /tokenize body (owned), or NULL */
    char *count_body;       /* count: the messages/count_tokens body (owned), or NULL */
    char *tmpl_body;        /* count: the /apply-template body (owned), or NULL */
    char *tmpl_tok;         /* count: the /tokenize body of the template's text (owned) */
    bool count_chat;        /* count: the job has messages (its own remembered method) */
    json_t *stops;          /* the job's params.stop (owned), or NULL */
    oai_schema *check;      /* what the reply is held to (owned), or NULL */
    long long count_estimate; /* count: method 4's answer (the estimate) */
    bool precount;          /* count the prompt, report it, then generate (prompt_tokens_first) */
    bool embed;             /* an embeddings job: body goes to url_embed (openai_embed.h) */
    int n_inputs;           /* embed: the job's inputs */
    char *pool_options;     /* X-Pool-Options header line (owned), or NULL */
    bool cancel;            /* under b->mu: job_cancel asked */
    bool cancel_taken;      /* under b->mu: the loop has it in hand */

    /* --- loop thread only --- */
    CURL *easy;             /* the transfer in flight, or NULL */
    /* The transfer's reply has not begun: its socket's events go ahead of
     * the streams already relaying (AGENT_PRI_NEW) until its first bytes. */
    bool unanswered;
    bool demote_queued;     /* on the loop's demote list */
    /* The socket libcurl last asked us to watch for this transfer
     * (on_curl_socket), or CURL_SOCKET_BAD: libcurl's ACTIVESOCKET names
     * a transfer's connection only once it has ended. */
    curl_socket_t sock;
    /* The job ended at [DONE] (its terminal events are sent; nothing
     * reaches the sink again) and its transfer only reads the body's end,
     * so that the connection is kept for the next job. */
    bool lingering;
    uint64_t linger_since_ms;
    struct oai_job *demote_next;
    /* Request headers, for every transfer of the job: the job's own lines
     * (hnode, whose data is in the strings below) ahead of the backend's
     * fixed list, which they link to (issue 24: no list built per job).
     * libcurl only reads the list. */
    struct curl_slist *hdrs;
    struct curl_slist hnode[4];
    int count_m;            /* count: the method being tried (oai_count_method) */
    bool tmpl_step;         /* count: method 2 is at its /tokenize step */
    int count_first;        /* count: the method tried first */
    bool done_queued;       /* on the loop's [DONE] list */
    bool completed;         /* libcurl said the transfer ended (result) */
    CURLcode result;
    struct oai_job *fin_next; /* loop_settle's list of completed transfers */
    oai_stream st;          /* the reply being read (sink, parser, usage) */
} oai_job;

/* Easy handles kept for reuse (issue 24): curl_easy_init and cleanup per
 * job were ~5 % of the agent's instructions per zero-delay request. A
 * handle keeps nothing of its transfer once reset; connections live in the
 * multi handle's cache either way. */
#define OAI_EASY_IDLE_MAX 64
#define OAI_URLS 8              /* the url_* below */

struct oai_backend {
    agent_backend base;     /* first: the agent sees only this */
    const agent_options *o;
    char *url_chat;
    char *url_completions;
    char *url_tokenize;     /* server root + /tokenize (llama-server, vLLM) */
    char *url_count;        /* server root + /v1/messages/count_tokens (gpupool, Anthropic) */
    char *url_template;     /* server root + /apply-template (llama-server) */
    char *url_embed;        /* /v1/embeddings */
    atomic_bool embeddings; /* a probe said the upstream embeds (then it stays so) */
    atomic_bool probe_stop; /* destroy: the probe thread leaves */
    pthread_cond_t probe_cv; /* with mu: wakes the probe thread's wait */
    pthread_t probe_th;     /* re-probes an upstream that gave no answer yet */
    bool probe_started;
    /* The count method that answered last (oai_count_method), for prompts
     * [0] and chat jobs [1] apart: method 2 is for chats only. */
    atomic_int count_method[2];
    /* When no count endpoint answered last (monotonic ms, 0: one did). A
     * count that comes first skips the endpoints for COUNT_NONE_MS after
     * that, rather than delay every first token by failed requests. */
    atomic_ullong count_none_ms;
    char *public_id;
    char *auth_header;
    /* The header lines every request carries (Content-Type, Accept,
     * Expect, Authorization), built once: for generation and
     * count requests [0], embeddings [1] (Accept differs). A job's own
     * lines link to one of them (job_headers). */
    struct curl_slist *fixed_hdrs[2];

    /* --- the loop's thread; mu is kept for them (uncontended now: the
     * agent calls job_start and job_cancel on the loop's thread) and for
     * the probe thread's wait --- */
    pthread_mutex_t mu;
    oai_job *jobs;          /* every job not yet finished (doubly linked) */
    oai_job *inbox, **inbox_tail; /* started, not yet taken by the loop */
    bool cancel_pending;    /* some job in jobs has cancel set, not yet taken */

    /* --- the loop's thread only --- */
    struct event_base *evb; /* the agent's (bind_loop; not owned), or NULL */
    struct event *wake_ev, *curl_timer, *sweep_timer;
    CURLM *multi;
    oai_job *done_list;     /* streams that said [DONE] inside a libcurl callback */
    oai_job *demote_list;   /* transfers whose reply began inside a libcurl callback */
    /* The event libcurl holds for each socket, by descriptor (the socket
     * a transfer's reply began on is found again: sock_demote). While the
     * reply has not begun it watches the socket on the base at
     * AGENT_PRI_NEW; after, the socket is in `relay` and the event only
     * remembers what libcurl asked for. */
    struct event **sock_ev;
    int n_sock_ev;
    relay_set *relay;       /* the relaying streams' sockets (relay_set.h) */
    int nrunning;           /* jobs begun and not yet finished */
    CURL *easy_idle[OAI_EASY_IDLE_MAX]; /* ended transfers' handles, reset, for the next */
    int n_easy_idle;
    struct {
        const char *url;    /* one of the url_* above (borrowed) */
        CURLU *u;           /* it parsed (owned) */
    } parsed[OAI_URLS];     /* the upstream URLs parsed once (url_parsed) */
    int n_parsed;
};

/* ======================================================================== */
/* libcurl's callbacks: the reply goes to the job's parser (openai_stream.h) */
/* ======================================================================== */

/* A stream said [DONE] inside a libcurl callback: the loop finishes the job
 * once curl_multi_socket_action returns (never from inside libcurl). The
 * transfer goes on meanwhile, so that the chunked body's end, usually in
 * the same read, lets the connection be reused. */
static void queue_done(oai_job *j)
{
    if (j->done_queued)
        return;
    j->done_queued = true;
    j->in_next = j->b->done_list;
    j->b->done_list = j;
}

/* Returning anything but n aborts the transfer. */
static size_t on_write(char *p, size_t sz, size_t nm, void *ud)
{
    oai_job *j = ud;
    size_t n = sz * nm;
    if (j->lingering)
        return n; /* the body's end after [DONE] */
    if (j->unanswered) {
        j->unanswered = false;
        if (!j->demote_queued) {
            j->demote_queued = true;
            j->demote_next = j->b->demote_list;
            j->b->demote_list = j;
        }
    }
    int rc = oai_stream_body(&j->st, p, n);
    if (rc == 1)
        queue_done(j);
    return rc < 0 ? 0 : n;
}

static size_t on_header(char *p, size_t sz, size_t nm, void *ud)
{
    oai_job *j = ud;
    size_t n = sz * nm;
    if (j->lingering)
        return n;
    return oai_stream_header(&j->st, p, n) == 0 ? n : 0;
}

/* The fixed header lines of the backend's requests ([0] SSE, [1] JSON
 * replies), built once. NULL on ENOMEM. */
static struct curl_slist *fixed_headers(const oai_backend *b, bool embed)
{
    struct curl_slist *h = NULL, *n;
    const char *lines[] = {"Content-Type: application/json",
                           embed ? "Accept: application/json" : "Accept: text/event-stream",
                           "Expect:", b->auth_header};
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        if (!lines[i])
            continue;
        if (!(n = curl_slist_append(h, lines[i]))) {
            curl_slist_free_all(h);
            return NULL;
        }
        h = n;
    }
    return h;
}

/* The job's id, correlation id (cid, may be NULL) and the pools it came
 * through (via, may be NULL) as its header lines; j->id and
 * j->correlation_id point into them. The caller checked id (< 128 bytes)
 * and cid (no CR or LF); via is taken when it is ids and separators only,
 * bounded by the server. 0, or -1 on ENOMEM. */
static int job_lines(oai_job *j, const char *id, const char *cid, const char *via)
{
    snprintf(j->h_job_id, sizeof j->h_job_id, HDR_JOB_ID "%s", id);
    j->id = j->h_job_id + sizeof HDR_JOB_ID - 1;
    if (cid) {
        size_t n = sizeof HDR_CORR + strlen(cid);
        if (!(j->h_corr = malloc(n)))
            return -1;
        snprintf(j->h_corr, n, HDR_CORR "%s", cid);
        j->correlation_id = j->h_corr + sizeof HDR_CORR - 1;
    }
    if (via && strlen(via) < 128 && strspn(via, "0123456789abcdefABCDEF, ") == strlen(via)) {
        size_t n = sizeof "X-Pool-Via: " + strlen(via);
        if (!(j->pool_via = malloc(n)))
            return -1;
        snprintf(j->pool_via, n, "X-Pool-Via: %s", via);
    }
    return 0;
}

/* The job's request headers: its own lines (job id, correlation id, the
 * pools it came through, its pool options) in j->hnode, then the fixed
 * list. Nothing is allocated; the list lives as long as the job. */
static void job_headers(oai_job *j)
{
    const char *own[4];
    int n = 0;
    own[n++] = j->h_job_id;
    if (j->h_corr)
        own[n++] = j->h_corr;
    if (j->pool_via)
        own[n++] = j->pool_via;
    if (j->pool_options)
        own[n++] = j->pool_options;
    struct curl_slist *next = j->b->fixed_hdrs[j->embed];
    for (int i = n - 1; i >= 0; i--) {
        j->hnode[i].data = (char *)own[i];
        j->hnode[i].next = next;
        next = &j->hnode[i];
    }
    j->hdrs = next;
}

/* ======================================================================== */
/* The loop thread: libevent + curl_multi_socket_action                     */
/* ======================================================================== */

static void job_free(oai_job *j)
{
    if (j->easy)
        curl_easy_cleanup(j->easy);
    oai_stream_free(&j->st);
    free(j->body);
    free(j->tok_body);
    free(j->count_body);
    free(j->tmpl_body);
    free(j->tmpl_tok);
    json_decref(j->stops);
    oai_schema_free(j->check);
    free(j->h_corr);
    free(j->pool_via);
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
    if (b->n_easy_idle < OAI_EASY_IDLE_MAX) {
        /* Kept as it is: the options every transfer shares stay set, and
         * xfer_start sets every one that differs between transfers. */
        b->easy_idle[b->n_easy_idle++] = j->easy;
    } else {
        curl_easy_cleanup(j->easy);
    }
    j->easy = NULL;
}

/* url (one of b->url_*) parsed once, or NULL (then CURLOPT_URL parses it).
 * libcurl parses a CURLOPT_URL string again for every transfer and writes
 * it back out (curl_url_set and curl_url_get, ~9,000 instructions a
 * transfer, issue 24); given a CURLU it starts from a copy. Parsed with
 * the flags libcurl gives a CURLOPT_URL, so the transfer is the same. */
static CURLU *url_parsed(oai_backend *b, const char *url)
{
    for (int i = 0; i < b->n_parsed; i++)
        if (b->parsed[i].url == url)
            return b->parsed[i].u;
    if (b->n_parsed == OAI_URLS)
        return NULL;
    CURLU *u = curl_url();
    if (!u || curl_url_set(u, CURLUPART_URL, url, CURLU_GUESS_SCHEME | CURLU_NON_SUPPORT_SCHEME) !=
                  CURLUE_OK) {
        curl_url_cleanup(u);
        return NULL;
    }
    b->parsed[b->n_parsed].url = url;
    b->parsed[b->n_parsed++].u = u;
    return u;
}

/* A new handle with the options every transfer of the backend shares
 * (xfer_start sets the rest), or NULL. */
static CURL *easy_new(oai_backend *b)
{
    const agent_options *o = b->o;
    CURL *easy = curl_easy_init();
    if (!easy)
        return NULL;
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy, CURLOPT_USERAGENT, "gpupool-agent/" AGENT_VERSION);
    curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, (long)o->upstream_connect_timeout_sec * 1000);
    curl_easy_setopt(easy, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(easy, CURLOPT_BUFFERSIZE, OAI_RECV_BUFFER);
    if (o->ca_file)
        curl_easy_setopt(easy, CURLOPT_CAINFO, o->ca_file);
    return easy;
}

/* Start one POST of body to url, read through on_header/on_write into j.
 * Returns 0, or -1 with the job failed (nothing started).
 *
 * A handle an ended transfer left (xfer_drop) is used again as it is, not
 * reset (issue 24: curl_easy_reset and setting every option again were
 * ~4,000 instructions a transfer): the options below are every one that
 * differs between transfers, and each is set here for every transfer, so
 * nothing of the previous job (its URL, headers, body, the job its
 * callbacks write to) can carry over. What libcurl keeps of a transfer
 * itself (status, headers read, progress) it starts afresh for each. */
static int xfer_start(oai_backend *b, oai_job *j, const char *url, const char *body)
{
    CURL *easy = b->n_easy_idle ? b->easy_idle[--b->n_easy_idle] : easy_new(b);
    if (!easy) {
        oai_stream_fail(&j->st, "INTERNAL_ERROR", "cannot create an HTTP handle");
        return -1;
    }
    j->st.last_byte_ms = gp_now_mono_ms();
    CURLU *u = url_parsed(b, url);
    /* A CURLU set takes precedence over CURLOPT_URL: one or the other. */
    curl_easy_setopt(easy, CURLOPT_CURLU, u);
    curl_easy_setopt(easy, CURLOPT_URL, u ? NULL : url);
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, j->hdrs);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, j);
    curl_easy_setopt(easy, CURLOPT_HEADERDATA, j);
    curl_easy_setopt(easy, CURLOPT_PRIVATE, j);
    if (curl_multi_add_handle(b->multi, easy) != CURLM_OK) {
        oai_stream_fail(&j->st, "INTERNAL_ERROR", "cannot start the upstream request");
        curl_easy_cleanup(easy);
        return -1;
    }
    j->easy = easy;
    j->unanswered = true;
    j->sock = CURL_SOCKET_BAD;
    return 0;
}

/* The metrics event that marks a count as an estimate (the sink copies it). */
static void mark_estimated(oai_job *j)
{
    json_t *m = json_pack("{s:i}", "count_estimated", 1);
    if (m)
        j->st.sink.metrics(j->st.sink.ctx, m);
    json_decref(m);
}

static void count_try(oai_backend *b, oai_job *j);
static void count_step_done(oai_backend *b, oai_job *j, bool done, CURLcode result);
static void xfer_end(oai_backend *b, oai_job *j, bool done, CURLcode result);

/* The prompt's count is known (n; est: the estimate of method 4). A
 * count_tokens job ends with it; so does a reply that a stop string ended
 * before the upstream's usage came. A job that counts first (precount)
 * reports it as a progress event, before any token (an Anthropic stream's
 * message_start shows it), then starts its generation. */
static void count_answer(oai_backend *b, oai_job *j, long long n, bool est)
{
    if (!j->body) {
        oai_stream_started(&j->st);
        if (est)
            mark_estimated(j);
        j->st.sink.end(j->st.sink.ctx, "stop", n, 0);
        job_release(b, j);
        return;
    }
    if (j->st.stop_seq) {
        oai_stream_finish_counted(&j->st, n);
        job_release(b, j);
        return;
    }
    if (n > 0 && j->st.sink.progress)
        j->st.sink.progress(j->st.sink.ctx, 0, n);
    j->st.prompt_tokens = n; /* the usage unless the upstream's comes */
    oai_stream_reset(&j->st, false);
    if (xfer_start(b, j, j->st.chat ? b->url_chat : b->url_completions, j->body) != 0)
        xfer_end(b, j, false, CURLE_OK);
}

/* The URL a count method (its current step) posts to. */
static const char *count_url(const oai_backend *b, const oai_job *j)
{
    if (j->count_m == OAI_COUNT_MESSAGES)
        return b->url_count;
    return j->count_m == OAI_COUNT_TEMPLATE && !j->tmpl_step ? b->url_template : b->url_tokenize;
}

/* Memory ran out counting the prompt (a reply that could not be read, a
 * body that could not be written): the job ends AGENT_OUT_OF_MEMORY, the
 * agent's own failure, which the server fails over. Not the next method
 * nor the estimate: either would answer another number (or skip the
 * remembered method) for want of the agent's memory. */
static void count_nomem(oai_backend *b, oai_job *j)
{
    j->st.sink.error(j->st.sink.ctx, "AGENT_OUT_OF_MEMORY",
                     "the agent ran out of memory counting the prompt");
    job_release(b, j);
}

/* Method 2's template came: count its text with /tokenize. Returns true
 * when that step started (or ended the job already). */
static bool template_step(oai_backend *b, oai_job *j)
{
    bool nomem;
    free(j->tmpl_tok);
    j->tmpl_tok = oai_count_template_tokenize(j->st.raw.data, j->st.raw.len, &nomem);
    if (nomem) {
        count_nomem(b, j);
        return true;
    }
    if (!j->tmpl_tok)
        return false;
    j->tmpl_step = true;
    oai_stream_reset(&j->st, true);
    if (xfer_start(b, j, b->url_tokenize, j->tmpl_tok) != 0)
        count_step_done(b, j, false, CURLE_OK);
    return true;
}

/* count_tokens: one method's transfer ended (done: it ran to its end,
 * result its code). A count never fails for want of an endpoint: the next
 * method, and the estimate last (openai_count.h). */
static void count_step_done(oai_backend *b, oai_job *j, bool done, CURLcode result)
{
    int m = j->count_m;
    const char *url = count_url(b, j);
    long long n = 0;
    bool est = false;
    bool ok = done && result == CURLE_OK && j->st.status >= 200 && j->st.status < 300;
    if (ok && m == OAI_COUNT_TEMPLATE && !j->tmpl_step && template_step(b, j))
        return;
    int pr = ok ? oai_count_parse((oai_count_method)m, j->st.raw.data, j->st.raw.len, &n, &est)
                : -1;
    if (pr == OAI_COUNT_NOMEM) {
        count_nomem(b, j);
        return;
    }
    if (pr == 0) {
        atomic_store(&b->count_method[j->count_chat], m);
        atomic_store(&b->count_none_ms, 0);
        count_answer(b, j, n, est);
        return;
    }
    gp_log_write(GP_LOG_DEBUG, "count_method_failed", j->correlation_id,
                 json_pack("{s:s,s:s,s:i}", "job_id", j->id, "url", url, "status",
                           (int)j->st.status),
                 "job %s: %s gave no count (HTTP %ld%s%s); trying the next method", j->id, url,
                 j->st.status, j->st.failed ? ": " : "", j->st.failed ? j->st.err_msg : "");
    j->count_m++;
    j->tmpl_step = false;
    count_try(b, j);
}

/* Count the job's prompt, starting from the method that answered last. */
static void count_begin(oai_backend *b, oai_job *j)
{
    j->count_first = j->count_m = atomic_load(&b->count_method[j->count_chat]);
    j->tmpl_step = false;
    count_try(b, j);
}

/* count_tokens: start the method j->count_m or the next one that has a
 * body; past the last, the estimate (marked as such). A generation job
 * skips the endpoints for COUNT_NONE_MS after they failed. */
static void count_try(oai_backend *b, oai_job *j)
{
    uint64_t none = atomic_load(&b->count_none_ms);
    bool skip = j->body && none && gp_now_mono_ms() - none < COUNT_NONE_MS;
    if (skip)
        j->count_m = OAI_COUNT_ESTIMATE; /* the endpoints failed a moment ago */
    for (; j->count_m < OAI_COUNT_ESTIMATE; j->count_m++) {
        int m = j->count_m;
        const char *body = m == OAI_COUNT_MESSAGES ? j->count_body
                           : m == OAI_COUNT_TEMPLATE ? j->tmpl_body
                                                     : j->tok_body;
        if (!body)
            continue;
        oai_stream_reset(&j->st, true);
        if (xfer_start(b, j, count_url(b, j), body) == 0)
            return; /* count_step_done when it ends */
        count_step_done(b, j, false, CURLE_OK);
        return;
    }
    /* No endpoint answered (none there, or the upstream is down):
     * estimate, and say so. The next count starts where this one did
     * (only a method that answered is remembered). */
    if (j->count_first < OAI_COUNT_ESTIMATE)
        atomic_store(&b->count_method[j->count_chat], j->count_first);
    if (!skip)
        atomic_store(&b->count_none_ms, gp_now_mono_ms());
    count_answer(b, j, j->count_estimate, true);
}

/* The reply's terminal events after a transfer that libcurl ended with an
 * error (ignored by the parser once [DONE] was read). */
static void xfer_fail(oai_job *j, const char *code, const char *prefix, CURLcode result)
{
    char msg[200];
    snprintf(msg, sizeof msg, "%s%s", prefix, curl_easy_strerror(result));
    oai_stream_finish(&j->st, code, msg);
}

/* An embeddings job's reply has come whole (done, result): a 2xx JSON
 * reply becomes its vectors and end (true: the job is over). Anything else
 * (false) takes the generation's error path in xfer_end: an error status
 * with the upstream's message, a transport failure, a malformed reply. */
static bool embed_end(oai_job *j, bool done, CURLcode result)
{
    oai_stream *s = &j->st;
    if (!done || result != CURLE_OK || s->failed || s->status < 200 || s->status >= 300)
        return false;
    char err[200];
    int rc = 0;
    if (s->mode != OAI_BODY_JSON)
        oai_stream_fail(s, "UPSTREAM_MALFORMED", "upstream embeddings reply is not JSON");
    else if ((rc = oai_embed_deliver(s->raw.data, s->raw.len, j->n_inputs, &s->sink, err,
                                     sizeof err)) != 0)
        oai_stream_fail(s, rc == -2 ? "AGENT_OUT_OF_MEMORY" : "UPSTREAM_MALFORMED", "%s", err);
    else
        return true;
    s->sink.error(s->sink.ctx, s->err_code, s->err_msg);
    return true;
}

/* A transfer is over (done: it ran to its end with result; else it was
 * stopped, the job failed): drop it and report, or try the next count
 * method. */
static void xfer_end(oai_backend *b, oai_job *j, bool done, CURLcode result)
{
    xfer_drop(b, j);
    if (j->lingering) { /* its terminal events went at [DONE] */
        job_release(b, j);
        return;
    }
    if (j->embed && embed_end(j, done, result)) {
        job_release(b, j);
        return;
    }
    if (j->st.count && !j->embed) {
        count_step_done(b, j, done, result);
        return;
    }
    if (j->st.stop_seq && !j->st.failed && j->st.prompt_tokens < 0) {
        /* The agent ended the stream on a stop string, so the upstream's
         * usage never came: count the prompt as count_tokens does, then
         * end (count_answer). */
        count_begin(b, j);
        return;
    }
    if (!done || result == CURLE_OK)
        oai_stream_finish(&j->st, NULL, NULL); /* not done: the job failed already */
    else if (result == CURLE_OPERATION_TIMEDOUT)
        xfer_fail(j, "UPSTREAM_TIMEOUT", "upstream: ", result);
    else
        xfer_fail(j, "UPSTREAM_ERROR", "upstream connection failed: ", result);
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
    j->st.t_start_us = gp_now_mono_us();
    j->st.last_byte_ms = j->st.t_start_us / 1000;
    job_headers(j);
    if (j->st.count && !j->embed) {
        count_begin(b, j);
        return;
    }
    const char *url = j->embed ? b->url_embed : j->st.chat ? b->url_chat : b->url_completions;
    if (xfer_start(b, j, url, j->body) != 0)
        xfer_end(b, j, false, CURLE_OK);
}

/* A cancelled job: stop its transfer and report it over. */
static void job_stop(oai_backend *b, oai_job *j)
{
    xfer_drop(b, j);
    if (!j->lingering) /* else it has ended already */
        j->st.sink.error(j->st.sink.ctx, "CANCELLED", "the job was cancelled");
    job_release(b, j);
}

/* A stream said [DONE] before its body ended (an upstream that writes
 * the chunked body's last chunk apart from the [DONE] event, as most
 * do). Dropping the transfer would close the connection: the next job
 * would open another (issue 24). A plain generation ends now and lingers
 * until the body's end (then its connection returns to libcurl's cache)
 * or OAI_LINGER_MS. A stop string's end still drops it: the upstream is
 * still generating and must see the client go. */
static void xfer_done_early(oai_backend *b, oai_job *j)
{
    if (j->embed || j->st.count || j->st.stop_seq || j->st.failed) {
        xfer_end(b, j, true, CURLE_OK);
        return;
    }
    oai_stream_finish(&j->st, NULL, NULL);
    j->lingering = true;
    j->linger_since_ms = gp_now_mono_ms();
}

/* The reply of j's transfer began: its socket leaves the base for the
 * streams relaying (level-triggered both: whatever is readable shows again
 * in the relay set). If the set refuses it (out of memory), it stays on
 * the base, ahead of the others but served. */
static void sock_demote(oai_backend *b, oai_job *j)
{
    const curl_socket_t s = j->sock;
    if (!j->easy || s == CURL_SOCKET_BAD || s < 0 || s >= b->n_sock_ev)
        return;
    struct event *ev = b->sock_ev[s];
    if (!ev || !b->relay || relay_set_has(b->relay, s))
        return;
    short what = event_get_events(ev) & (EV_READ | EV_WRITE);
    if (relay_set_watch(b->relay, s, what) == 0)
        event_del(ev);
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
    /* First, while every job listed is still there. */
    while (b->demote_list) {
        oai_job *j = b->demote_list;
        b->demote_list = j->demote_next;
        j->demote_queued = false;
        sock_demote(b, j);
    }
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
            xfer_done_early(b, j);
    }
    while (completed) {
        oai_job *j = completed;
        completed = j->fin_next;
        j->completed = false;
        xfer_end(b, j, true, j->result);
    }
}

/* libcurl's turn on socket fd, ready for what (EV_READ / EV_WRITE),
 * watched on the base or in the relay set. */
static void sock_run(oai_backend *b, int fd, short what)
{
    int action = ((what & EV_READ) ? CURL_CSELECT_IN : 0) |
                 ((what & EV_WRITE) ? CURL_CSELECT_OUT : 0);
    int running = 0;
    agent_sink_hold(); /* what this read delivers goes in one upload */
    curl_multi_socket_action(b->multi, fd, action, &running);
    loop_settle(b);
    agent_sink_release();
}

static void on_sock_event(evutil_socket_t fd, short what, void *arg)
{
    sock_run(arg, fd, what);
}

/* The relay set's ready sockets, one burst, each run as the base's would
 * be (one hold a socket: holding the whole burst made no difference). */
static void on_relay_ready(void *arg, const relay_ready *r, int n)
{
    oai_backend *b = arg;
    for (int i = 0; i < n; i++)
        /* An earlier entry's handling may have unwatched this one (its
         * transfer ended, its socket was closed or taken by a new one). */
        if (relay_set_has(b->relay, r[i].fd))
            sock_run(b, r[i].fd, r[i].what);
}

static void on_curl_timer(evutil_socket_t fd, short what, void *arg)
{
    oai_backend *b = arg;
    int running = 0;
    (void)fd;
    (void)what;
    agent_sink_hold();
    curl_multi_socket_action(b->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    loop_settle(b);
    agent_sink_release();
}

/* Room in b->sock_ev for descriptor s; false on ENOMEM. */
static bool sock_table_fit(oai_backend *b, curl_socket_t s)
{
    if (s < b->n_sock_ev)
        return true;
    int n = b->n_sock_ev ? b->n_sock_ev : 64;
    while (n <= s)
        n *= 2;
    struct event **t = realloc(b->sock_ev, (size_t)n * sizeof *t);
    if (!t)
        return false;
    memset(t + b->n_sock_ev, 0, (size_t)(n - b->n_sock_ev) * sizeof *t);
    b->sock_ev = t;
    b->n_sock_ev = n;
    return true;
}

/* CURLMOPT_SOCKETFUNCTION: watch s as libcurl asks (socketp: its event),
 * on the base ahead of the relaying streams while easy's reply has not
 * begun, in the relay set after. */
static int on_curl_socket(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp)
{
    oai_backend *b = userp;
    struct event *ev = socketp;
    if (what == CURL_POLL_REMOVE) {
        relay_set_unwatch(b->relay, s); /* libcurl may close it next */
        if (ev) {
            if (s >= 0 && s < b->n_sock_ev && b->sock_ev[s] == ev)
                b->sock_ev[s] = NULL;
            event_free(ev);
        }
        return 0;
    }
    if (s < 0 || !sock_table_fit(b, s))
        return -1;
    char *priv = NULL;
    curl_easy_getinfo(easy, CURLINFO_PRIVATE, &priv);
    oai_job *j = (oai_job *)priv;
    if (j)
        j->sock = s; /* for sock_demote */
    if (!(j && j->unanswered) && b->relay) {
        ev = curl_loop_event(b->evb, b->multi, s, what, ev, on_sock_event, b);
        if (!ev)
            return -1;
        b->sock_ev[s] = ev;
        if (relay_set_watch(b->relay, s, curl_loop_kinds(what)) == 0)
            return 0;
        /* Not in the set (out of memory): on the base, with new work (as
         * sock_demote leaves it), not in bursts but served. */
        ev = curl_loop_watch(b->evb, b->multi, s, what, ev, AGENT_PRI_NEW, on_sock_event, b);
        return ev ? 0 : -1;
    }
    relay_set_unwatch(b->relay, s); /* a pooled connection taken by a new transfer */
    ev = curl_loop_watch(b->evb, b->multi, s, what, ev, AGENT_PRI_NEW, on_sock_event, b);
    if (!ev)
        return -1;
    b->sock_ev[s] = ev;
    return 0;
}

/* CURLMOPT_TIMERFUNCTION: one timer for libcurl's next timeout. */
static int on_curl_timeout(CURLM *multi, long timeout_ms, void *userp)
{
    oai_backend *b = userp;
    (void)multi;
    return curl_loop_timer(b->curl_timer, timeout_ms);
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
        if (j->easy && !j->done_queued &&
            (j->lingering ? now - j->linger_since_ms > OAI_LINGER_MS
                          : oai_stream_idle_ms(&j->st, now) > stall_ms)) {
            j->in_next = stalled;
            stalled = j;
        }
    pthread_mutex_unlock(&b->mu);
    agent_sink_hold();
    while (stalled) {
        oai_job *j = stalled;
        stalled = j->in_next;
        if (!j->lingering) /* else it has ended: its connection is closed */
            oai_stream_fail(&j->st, "UPSTREAM_TIMEOUT", "no data from the upstream for %lld s",
                            (long long)b->o->upstream_timeout_sec);
        xfer_end(b, j, false, CURLE_OK);
    }
    agent_sink_release();
}

/* job_start or job_cancel queued work: new jobs, cancels. */
static void on_wake(evutil_socket_t fd, short what, void *arg)
{
    oai_backend *b = arg;
    (void)fd;
    (void)what;
    oai_job *in = NULL, *cancelled = NULL;
    pthread_mutex_lock(&b->mu);
    in = b->inbox;
    b->inbox = NULL;
    b->inbox_tail = &b->inbox;
    /* cancel_taken is set here only: without a cancel pending no job has
     * it, and the walks over every job (1,000 at --slots 1024, a wake for
     * each new job) are skipped (3 % of the agent at 1,000 streams). */
    const bool cancels = b->cancel_pending;
    if (cancels) {
        b->cancel_pending = false;
        for (oai_job *j = b->jobs; j; j = j->next)
            if (j->cancel && !j->cancel_taken)
                j->cancel_taken = true;
    }
    pthread_mutex_unlock(&b->mu);
    agent_sink_hold();
    bool began = in != NULL;
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
    if (cancels) {
        pthread_mutex_lock(&b->mu);
        for (oai_job *j = b->jobs; j; j = j->next)
            if (j->cancel_taken) {
                j->cancel_taken = false; /* listed once */
                j->in_next = cancelled;
                cancelled = j;
            }
        pthread_mutex_unlock(&b->mu);
    }
    while (cancelled) {
        oai_job *j = cancelled;
        cancelled = j->in_next;
        job_stop(b, j);
    }
    if (began) {
        /* Start the new transfers now (connect, or send the request on a
         * kept-alive connection) rather than at libcurl's timer, a turn of
         * the loop later: curl_multi_add_handle only schedules them. */
        int running = 0;
        curl_multi_socket_action(b->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    }
    loop_settle(b);
    agent_sink_release();
}

/* The agent (on the loop's thread, between two of its callbacks) queued
 * work: on_wake takes it once the callback running now returns. Activating
 * an active event again does nothing. */
static void loop_wake(oai_backend *b)
{
    event_active(b->wake_ev, EV_TIMEOUT, 0);
}

/* ======================================================================== */
/* Request building (the agent, on the loop's thread)                       */
/* ======================================================================== */

/* Not "stop": the agent matches the job's stop strings itself
 * (openai_stream.h), since an upstream that stops on one rarely says which. */
static const char *const pass_params[] = {"max_tokens", "temperature", "top_p", "top_k",
                                          "min_p", "seed", "presence_penalty",
                                          "frequency_penalty", "repeat_penalty"};

/* A count method's body (openai_count.h's builder for it) as the text its
 * transfer posts: 0 with *out, NULL when the job has nothing for that
 * method (it is skipped), or -1 when memory ran out (a method skipped for
 * want of memory would count another way or estimate: the job start is
 * AGENT_JOB_START_NOMEM instead). */
static int count_body(json_t *(*build)(const json_t *, const char *, bool *), const json_t *job,
                      const char *model, char **out)
{
    bool nomem;
    json_t *req = build(job, model, &nomem);
    *out = req ? gp_json_dumps(req) : NULL; /* (UTF-8 strings: NULL is memory) */
    json_decref(req);
    return nomem || (req && !*out) ? -1 : 0;
}

/* The upstream request body for a completion or chat job (new reference),
 * or NULL with err set and *nomem saying whether memory ran out (the
 * agent's failure) or the job is refused. Every member must hold: a
 * request sent without its tools, response_format or a sampling parameter
 * would be another request. */
static json_t *build_request(oai_backend *b, json_t *job, bool *chat, bool *nomem, char *err,
                             size_t errlen)
{
    const char *kind = json_string_value(json_object_get(job, "kind"));
    const char *cont = json_string_value(json_object_get(job, "continuation"));
    int rc = 0; /* the sets' and appends': -1 once one failed */
    *nomem = false;
    json_t *req = json_pack("{s:s,s:b,s:{s:b}}", "model", b->o->upstream_model, "stream", 1,
                            "stream_options", "include_usage", 1);
    if (!req)
        goto nomem;
    if (kind && strcmp(kind, "completion") == 0) {
        const char *prompt = json_string_value(json_object_get(job, "prompt"));
        if (!prompt) {
            snprintf(err, errlen, "completion job without a string prompt");
            goto fail;
        }
        *chat = false;
        size_t pl = strlen(prompt), cl = cont ? strlen(cont) : 0;
        char *full = malloc(pl + cl + 1);
        if (!full)
            goto nomem;
        memcpy(full, prompt, pl);
        if (cl)
            memcpy(full + pl, cont, cl);
        full[pl + cl] = '\0';
        /* (two UTF-8 strings: json_string fails only for memory) */
        rc |= json_object_set_new(req, "prompt", json_string(full));
        free(full);
    } else if (kind && strcmp(kind, "chat") == 0) {
        json_t *msgs = json_object_get(job, "messages");
        if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
            snprintf(err, errlen, "chat job without messages");
            goto fail;
        }
        *chat = true;
        /* Forwarded as they are: the job's own array, shared, not copied
         * (issue 24: the deep copy was ~5,000 instructions a job); req is
         * dumped and dropped before the job is. */
        json_t *fwd = msgs;
        if (cont && *cont) {
            /* Failover: the assistant's partial answer; servers that support
             * assistant prefill (llama-server, vLLM) continue from it. A new
             * array of the same messages, so that the job's stays as it is. */
            fwd = json_array();
            size_t i;
            json_t *m;
            json_array_foreach(msgs, i, m)
            {
                rc |= json_array_append(fwd, m);
            }
            rc |= json_array_append_new(fwd, json_pack("{s:s,s:s}", "role", "assistant",
                                                       "content", cont));
            rc |= json_object_set_new(req, "messages", fwd);
        } else {
            rc |= json_object_set(req, "messages", fwd);
        }
        /* Tools go upstream as they are (already OpenAI function tools);
         * the upstream decides whether its model can call them. */
        json_t *tools = json_object_get(job, "tools");
        if (json_is_array(tools) && json_array_size(tools) > 0) {
            rc |= json_object_set(req, "tools", tools);
            json_t *tc = json_object_get(job, "tool_choice");
            if (tc && !json_is_null(tc))
                rc |= json_object_set(req, "tool_choice", tc);
        }
        /* Structured output: the server checked the schema (docs/api.md);
         * llama-server, vLLM and Ollama enforce OpenAI's form themselves. */
        json_t *rf = json_object_get(job, "response_format");
        if (json_is_object(rf))
            rc |= json_object_set(req, "response_format", rf);
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
        rc |= json_object_set(req, pass_params[i], v);
    }
    if (rc != 0)
        goto nomem;
    return req;
nomem:
    *nomem = true;
    snprintf(err, errlen, "out of memory");
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
    /* supports_embeddings: only once a probe had vectors back,
     * so that a chat-only upstream gets no embeddings job. */
    return json_pack("[{s:s,s:[],s:n,s:n,s:n,s:n,s:n,s:b,s:s,s:s,s:b,s:b}]", "id",
                     b->public_id, "aliases", "quantization", "context_length", "bytes",
                     "vram_bytes", "architecture", "loaded", 1, "backend", "openai",
                     "upstream_model", b->o->upstream_model, "supports_tools", 1,
                     "supports_embeddings", atomic_load(&b->embeddings));
}

/* The pool options that matter to an upstream pool (docs/protocol.md): the
 * job's session key (its affinity there too), a batch priority and the
 * job's tenant tag (so the upstream pool keeps this pool's tenants apart in
 * its prompt-prefix cache, inside the tenant of our upstream key), as an
 * X-Pool-Options header line. A header, not a body field: a plain
 * OpenAI-compatible server ignores it, where some refuse unknown fields.
 * *out stays NULL when there is nothing to say. -1: out of memory. */
static int pool_options_header(json_t *job, char **out)
{
    *out = NULL;
    const char *session = json_string_value(json_object_get(job, "session"));
    const char *prio = json_string_value(json_object_get(job, "priority"));
    const char *tenant = json_string_value(json_object_get(job, "tenant"));
    json_t *o = json_object();
    if (!o)
        return -1;
    /* A field left out for want of memory would run the job as another
     * (no affinity, another tenant's cache): each set must hold. The server
     * bounded the session (256 bytes); JSON escaping keeps CR/LF out of the
     * header line. */
    int rc = 0;
    if (session && *session)
        rc |= json_object_set_new(o, "session", json_string(session));
    if (prio && strcmp(prio, "batch") == 0)
        rc |= json_object_set_new(o, "priority", json_string("batch"));
    /* The server sends 32 hex digits; anything else is not passed on (an
     * upstream pool refuses a tag over 64 bytes). */
    if (tenant && *tenant && strlen(tenant) <= 64)
        rc |= json_object_set_new(o, "tenant", json_string(tenant));
    if (rc == 0 && json_object_size(o) > 0) {
        /* Checked: jansson 2.14's json_dumps can leave a key out (the
         * session, the tenant) and succeed, and the job would run upstream
         * as another; ASCII, as a header line must be. */
        char *v = gp_json_dumps_checked(o, JSON_COMPACT | JSON_ENSURE_ASCII);
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
    if (!b->wake_ev) {
        snprintf(err, errlen, "openai backend: not bound to a loop");
        return -1;
    }
    if (!id || strlen(id) >= 128) {
        snprintf(err, errlen, "job without a valid job_id");
        return -1;
    }
    const char *kind = json_string_value(json_object_get(job, "kind"));
    bool chat = false, count = kind && strcmp(kind, "count_tokens") == 0;
    bool embed = kind && strcmp(kind, "embeddings") == 0;
    int n_inputs = 0;
    json_t *req = NULL;
    char *tok_body = NULL;
    if (embed && !atomic_load(&b->embeddings)) {
        snprintf(err, errlen, "the upstream does not serve embeddings");
        return -1;
    }
    if (embed && !(req = oai_embed_request(b->o->upstream_model, job, &n_inputs, err, errlen)))
        return -1;
    if (count && count_body(oai_count_tokenize_body, job, b->o->upstream_model, &tok_body) < 0) {
        snprintf(err, errlen, "out of memory");
        return AGENT_JOB_START_NOMEM;
    }
    if (count && !tok_body) {
        snprintf(err, errlen, "count_tokens job without a prompt or messages (or its text is "
                              "not valid UTF-8)");
        return -1;
    }
    bool nomem = false;
    if (!count && !embed && !(req = build_request(b, job, &chat, &nomem, err, errlen)))
        return nomem ? AGENT_JOB_START_NOMEM : -1;
    /* A schema the reply cannot be checked against is refused before any
     * upstream work, as the gguf backend refuses one it cannot enforce. */
    oai_schema *check = NULL;
    int src = chat ? oai_schema_new(job, &check, err, errlen) : 0;
    if (src < 0) {
        json_decref(req);
        return src == OAI_SCHEMA_NOMEM ? AGENT_JOB_START_NOMEM : -1;
    }
    oai_job *j = calloc(1, sizeof *j);
    if (!j) {
        json_decref(req);
        free(tok_body);
        oai_schema_free(check);
        snprintf(err, errlen, "out of memory");
        return AGENT_JOB_START_NOMEM;
    }
    j->check = check;
    const char *cid = json_string_value(json_object_get(job, "correlation_id"));
    if (cid && (strlen(cid) >= 200 || strpbrk(cid, "\r\n")))
        cid = NULL;
    /* The pools the job came through: an upstream pool refuses a loop
     * (docs/protocol.md). */
    if (job_lines(j, id, cid, json_string_value(json_object_get(job, "pool_via"))) < 0) {
        job_free(j); /* and check, which it holds */
        json_decref(req);
        free(tok_body);
        snprintf(err, errlen, "out of memory");
        return AGENT_JOB_START_NOMEM;
    }
    j->b = b;
    j->tok_body = tok_body;
    /* A job run without its stop strings would be another job. */
    json_t *stops = json_object_get(json_object_get(job, "params"), "stop");
    if (json_is_array(stops) && json_array_size(stops) > 0 &&
        !(j->stops = json_deep_copy(stops))) {
        job_free(j);
        json_decref(req);
        snprintf(err, errlen, "out of memory");
        return AGENT_JOB_START_NOMEM;
    }
    /* The client sees the prompt's size before the first token (an
     * Anthropic stream): count it first (docs/agent.md "Counting tokens"). */
    j->precount = !count && !embed && json_is_true(json_object_get(job, "prompt_tokens_first"));
    j->embed = embed;
    j->n_inputs = n_inputs;
    /* An embeddings reply is read as a count's is: status and body only. */
    oai_stream_init(&j->st, sink, j->id, chat,
                    count || j->precount || embed, j->stops, MAX_SSE_LINE);
    j->st.check = j->check;
    if (req) {
        j->body = gp_json_dumps(req);
        json_decref(req);
    }
    /* A job with stop strings may have to count after its reply (its end
     * drops the transfer before the usage comes). */
    bool may_count = !embed && (count || j->precount || j->stops);
    if (may_count) {
        /* A body the job has nothing for (NULL) skips its method. */
        const char *um = b->o->upstream_model;
        if ((!count && count_body(oai_count_tokenize_body, job, um, &j->tok_body) < 0) ||
            count_body(oai_count_messages_body, job, um, &j->count_body) < 0 ||
            count_body(oai_count_template_body, job, um, &j->tmpl_body) < 0) {
            job_free(j);
            snprintf(err, errlen, "out of memory");
            return AGENT_JOB_START_NOMEM;
        }
        j->count_chat = json_is_array(json_object_get(job, "messages"));
        j->count_estimate = gp_count_estimate(job);
    }
    if (pool_options_header(job, &j->pool_options) < 0) {
        job_free(j);
        snprintf(err, errlen, "out of memory");
        return AGENT_JOB_START_NOMEM;
    }
    if (!count && !j->body) {
        job_free(j);
        snprintf(err, errlen, "out of memory");
        return AGENT_JOB_START_NOMEM;
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
        if (strcmp(j->id, job_id) == 0 && !j->cancel) {
            j->cancel = true;
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
    if (b->probe_started) {
        pthread_mutex_lock(&b->mu);
        atomic_store(&b->probe_stop, true); /* also aborts a probe in flight */
        pthread_cond_signal(&b->probe_cv);
        pthread_mutex_unlock(&b->mu);
        pthread_join(b->probe_th, NULL);
    }
    if (b->evb) {
        /* The loop no longer runs (agent_run returned): end every job here,
         * each with its terminal event (a lingering one has had it), as a
         * cancel would. Jobs not yet taken from the inbox count as begun. */
        agent_sink_hold();
        for (oai_job *j = b->inbox; j; j = j->in_next)
            b->nrunning++;
        b->inbox = NULL;
        b->inbox_tail = &b->inbox;
        b->demote_list = b->done_list = NULL; /* empty between callbacks */
        while (b->jobs)
            job_stop(b, b->jobs);
        agent_sink_release();
    }
    while (b->n_easy_idle > 0)
        curl_easy_cleanup(b->easy_idle[--b->n_easy_idle]);
    if (b->multi)
        curl_multi_cleanup(b->multi); /* closes the kept-alive connections */
    while (b->n_parsed > 0) /* after every handle that may point at them */
        curl_url_cleanup(b->parsed[--b->n_parsed].u);
    if (b->wake_ev)
        event_free(b->wake_ev);
    if (b->curl_timer)
        event_free(b->curl_timer);
    if (b->sweep_timer)
        event_free(b->sweep_timer);
    for (int i = 0; i < b->n_sock_ev; i++) /* any libcurl did not remove */
        if (b->sock_ev[i])
            event_free(b->sock_ev[i]);
    free(b->sock_ev); /* after curl_multi_cleanup, whose sockets it lists */
    relay_set_free(b->relay); /* after curl_multi_cleanup: its REMOVEs unwatch */
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->probe_cv);
    free(b->url_chat);
    free(b->url_completions);
    free(b->url_tokenize);
    free(b->url_count);
    free(b->url_template);
    free(b->url_embed);
    free(b->public_id);
    free(b->auth_header);
    curl_slist_free_all(b->fixed_hdrs[0]);
    curl_slist_free_all(b->fixed_hdrs[1]);
    free(b);
}

/* Every stream is a socket: with more slots than the open-files soft limit
 * allows (systemd's default is 1024), take it up towards the hard limit. */
static void fd_limit_for_slots(long slots)
{
    struct rlimit rl;
    rlim_t want = (rlim_t)slots + 64; /* the agent's own connections, its eventfd, logs */
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= want)
        return;
    rlim_t before = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
        rl.rlim_cur = before;
    if (rl.rlim_cur < want)
        gp_log_warn("fd_limit", "open files limit %llu is below --slots %ld + 64: streams past it "
                    "fail to connect (raise LimitNOFILE)",
                    (unsigned long long)rl.rlim_cur, slots);
}

/* bind_loop (backend.h): the backend's events on the agent's loop. */
static int oai_bind_loop(agent_backend *base, struct event_base *evb, char *err, size_t errlen)
{
    oai_backend *b = (oai_backend *)base;
    if (b->evb) {
        snprintf(err, errlen, "openai backend: already bound to a loop");
        return -1;
    }
    b->evb = evb;
    b->wake_ev = event_new(evb, -1, 0, on_wake, b);
    b->curl_timer = evtimer_new(evb, on_curl_timer, b);
    b->sweep_timer = event_new(evb, -1, EV_PERSIST, on_sweep, b);
    b->relay = relay_set_new(evb, AGENT_PRI_RELAY, AGENT_RELAY_BURST, on_relay_ready, b);
    if (!b->wake_ev || !b->curl_timer || !b->sweep_timer || !b->relay ||
        event_priority_set(b->wake_ev, AGENT_PRI_NEW) != 0 ||
        event_priority_set(b->curl_timer, AGENT_PRI_NEW) != 0) {
        snprintf(err, errlen, "openai backend: cannot set up its events");
        return -1; /* oai_destroy frees what was made */
    }
    curl_multi_setopt(b->multi, CURLMOPT_SOCKETFUNCTION, on_curl_socket);
    curl_multi_setopt(b->multi, CURLMOPT_SOCKETDATA, b);
    curl_multi_setopt(b->multi, CURLMOPT_TIMERFUNCTION, on_curl_timeout);
    curl_multi_setopt(b->multi, CURLMOPT_TIMERDATA, b);
    return 0;
}

/* The probe thread: asks an upstream that gave the start-up probe no
 * answer again, less and less often, until one answer (yes or no) or
 * destroy. A yes shows in the next poll's model facts. */
static void *probe_main(void *arg)
{
    oai_backend *b = arg;
    int delay_s = PROBE_RETRY_FIRST_S;
    for (;;) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += delay_s;
        pthread_mutex_lock(&b->mu);
        while (!atomic_load(&b->probe_stop) &&
               pthread_cond_timedwait(&b->probe_cv, &b->mu, &until) != ETIMEDOUT)
            ;
        pthread_mutex_unlock(&b->mu);
        if (atomic_load(&b->probe_stop))
            break;
        oai_embed_probe_result r =
            oai_embed_probe(b->o, b->url_embed, b->auth_header, &b->probe_stop);
        if (r != OAI_EMBED_RETRY) {
            atomic_store(&b->embeddings, r == OAI_EMBED_YES);
            gp_log_info("backend_openai", "embeddings probe answered: %s",
                        r == OAI_EMBED_YES ? "passed through" : "not served there");
            break;
        }
        delay_s = delay_s * 2 > PROBE_RETRY_MAX_S ? PROBE_RETRY_MAX_S : delay_s * 2;
    }
    return NULL;
}

static const agent_backend_ops oai_ops = {
    .name = "openai",
    .destroy = oai_destroy,
    .models = oai_models,
    .poll_facts = NULL,
    .job_start = oai_job_start,
    .job_cancel = oai_job_cancel,
    .bind_loop = oai_bind_loop,
    .structured_output = true, /* passed to the upstream, which enforces it; checked */
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
    pthread_cond_init(&b->probe_cv, NULL);
    atomic_init(&b->embeddings, false);
    atomic_init(&b->probe_stop, false);
    b->inbox_tail = &b->inbox;
    b->url_chat = endpoint(o->upstream, "chat/completions");
    b->url_completions = endpoint(o->upstream, "completions");
    b->url_tokenize = root_endpoint(o->upstream, "tokenize");
    b->url_count = root_endpoint(o->upstream, "v1/messages/count_tokens");
    b->url_template = root_endpoint(o->upstream, "apply-template");
    b->url_embed = endpoint(o->upstream, "embeddings");
    atomic_init(&b->count_method[0], OAI_COUNT_MESSAGES);
    atomic_init(&b->count_method[1], OAI_COUNT_MESSAGES);
    atomic_init(&b->count_none_ms, 0);
    b->public_id = strdup(o->alias && *o->alias ? o->alias : o->upstream_model);
    if (o->upstream_key && *o->upstream_key) {
        size_t n = strlen(o->upstream_key) + 32;
        b->auth_header = malloc(n);
        if (b->auth_header)
            snprintf(b->auth_header, n, "Authorization: Bearer %s", o->upstream_key);
    }
    if (!b->url_chat || !b->url_completions || !b->url_tokenize || !b->url_count ||
        !b->url_template || !b->url_embed || !b->public_id ||
        (o->upstream_key && *o->upstream_key && !b->auth_header) ||
        !(b->fixed_hdrs[0] = fixed_headers(b, false)) ||
        !(b->fixed_hdrs[1] = fixed_headers(b, true))) {
        oai_destroy(&b->base);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    /* Before the first poll, so that the model facts say it from the start;
     * an upstream that gave no answer (down, loading) is asked again. */
    oai_embed_probe_result probe = oai_embed_probe(o, b->url_embed, b->auth_header, NULL);
    atomic_store(&b->embeddings, probe == OAI_EMBED_YES);
    /* Idle connections kept for reuse: one per slot is what a full agent
     * can use again at once. */
    long slots = o->slots > 0 ? (long)o->slots : 1;
    b->multi = curl_multi_init();
    if (!b->multi) {
        oai_destroy(&b->base);
        snprintf(err, errlen, "openai backend: cannot create a libcurl multi handle");
        return NULL;
    }
    curl_multi_setopt(b->multi, CURLMOPT_MAXCONNECTS, slots + 4);
    fd_limit_for_slots(slots);
    if (probe == OAI_EMBED_RETRY) {
        if (pthread_create(&b->probe_th, NULL, probe_main, b) == 0)
            b->probe_started = true;
        else
            gp_log_warn("backend_openai", "cannot start the embeddings probe thread");
    }
    gp_log_info("backend_openai", "relaying model '%s' to %s (upstream model '%s', embeddings %s)",
                b->public_id, o->upstream, o->upstream_model,
                probe == OAI_EMBED_YES  ? "passed through"
                : probe == OAI_EMBED_NO ? "not served there"
                                        : "unknown yet: the upstream gave no answer");
    return &b->base;
}
