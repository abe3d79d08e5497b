/*
 * scalesim: the project's own load generator and simulated-agent driver,
 * one libevent loop (docs/scaling.md "One server's figures").
 *
 * Agents: M simulated agents speaking the real protocol (docs/protocol.md):
 * POST /agents/poll heartbeats at the interval the server asks for, a
 * POST /agents/work long-poll parked while a slot is free, and per job
 * paced token events, uploaded as the real agent does: all of an agent's
 * jobs in one POST /agents/events, one in flight, with what accumulated
 * meanwhile (--no-batch: one /agents/jobs/{id}/events upload in flight per
 * job, the agents before batching).
 * Each agent has its own long-poll connection; polls and uploads share
 * pools of keep-alive connections, so 10,000 agents cost about 10,000
 * descriptors here and at the server, not three times that.
 *
 * Clients: N streaming clients, each making R chat completions requests
 * one after the other (stream: true, max_tokens = --tokens), started over
 * --ramp-ms. Each request carries X-Correlation-Id "sim-<n>", which the job
 * the agent receives carries too: since both sides are in this process
 * (one clock), scheduling latency is measured exactly: the client's send
 * to the work reply's arrival at the agent.
 *
 * Vanish: --vanish-pct P --vanish-at-ms T: at T, P % of the agents close
 * every connection and stop (their running jobs' clients then see the
 * server's failover or error).
 *
 * Output: a table on stderr and one JSON line on stdout (counts, errors by
 * HTTP status, TTFT, total time and scheduling latency p50/p99, token
 * events uploaded). Bounded by --max-sec. bench/scale.py runs it beside a
 * server and adds the server's CPU and RSS.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>

#define MAX_STATUS 600

typedef struct opts {
    char host[256];
    int port;
    int agents, slots, clients, requests, tokens, vanish_pct;
    double tps;            /* tokens per second per stream (0 = all at once) */
    int ramp_ms, max_sec, vanish_at_ms, idle_sec, poll_conns, upload_conns;
    int batch;             /* one POST /agents/events per agent in flight (the real agent) */
    int batch_ms;          /* with 2+ jobs running, wait this long to fill one (agent default) */
    const char *model, *agent_key, *client_key;
} opts;

static opts O = {
    .port = 8080, .agents = 10, .slots = 100, .clients = 100, .requests = 1, .tokens = 64,
    .tps = 50, .ramp_ms = 1000, .max_sec = 120, .poll_conns = 32, .upload_conns = 64,
    .model = "m1", .batch = 1, .batch_ms = 0,
};

static struct event_base *base;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ---------------------------------------------------------------- stats */

typedef struct samples {
    double *v;
    size_t n, cap;
} samples;

static void sample_add(samples *s, double v)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 1024;
        double *nv = realloc(s->v, cap * sizeof *nv);
        if (!nv)
            return;
        s->v = nv;
        s->cap = cap;
    }
    s->v[s->n++] = v;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(samples *s, double p)
{
    if (!s->n)
        return 0;
    qsort(s->v, s->n, sizeof *s->v, cmp_d);
    size_t i = (size_t)(p * (double)(s->n - 1) + 0.5);
    return s->v[i];
}

static struct {
    long sent, ok, failed, by_status[MAX_STATUS + 1], transport_errors, stream_errors;
    long tokens_received, jobs_received, token_events_uploaded, uploads, upload_errors;
    long polls, poll_errors, work_errors, jobs_cancelled;
    samples ttft, total, sched;
    double first_send_ms, last_done_ms;
} st;

/* ---------------------------------------------------------- connections */

static struct evhttp_connection *conn_new(void)
{
    struct evhttp_connection *c = evhttp_connection_base_new(base, NULL, O.host,
                                                             (unsigned short)O.port);
    if (c) {
        evhttp_connection_set_timeout(c, 600);
        evhttp_connection_set_retries(c, 0);
    }
    return c;
}

static void add_json(struct evhttp_request *req, json_t *body, const char *key)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Host", O.host);
    evhttp_add_header(h, "Content-Type", "application/json");
    if (key) {
        char auth[300];
        snprintf(auth, sizeof auth, "Bearer %s", key);
        evhttp_add_header(h, "Authorization", auth);
    }
    char *s = json_dumps(body, JSON_COMPACT);
    if (s) {
        evbuffer_add(evhttp_request_get_output_buffer(req), s, strlen(s));
        free(s);
    }
}

static json_t *reply_json(struct evhttp_request *req)
{
    struct evbuffer *b = req ? evhttp_request_get_input_buffer(req) : NULL;
    size_t n = b ? evbuffer_get_length(b) : 0;
    if (!n)
        return NULL;
    return json_loadb((const char *)evbuffer_pullup(b, (ev_ssize_t)n), n, 0, NULL);
}

/* A small pool of keep-alive connections shared by many senders (polls,
 * uploads): evhttp queues requests on a busy connection. */
typedef struct pool {
    struct evhttp_connection **c;
    int n, next;
} pool;

static struct evhttp_connection *pool_get(pool *p)
{
    int i = p->next++ % p->n;
    if (!p->c[i])
        p->c[i] = conn_new();
    return p->c[i];
}

static pool poll_pool, upload_pool;

/* ----------------------------------------------------------------- agents */

typedef struct sim_agent sim_agent;

typedef struct sim_job {
    struct sim_job *next;
    sim_agent *a;
    char id[64];
    int emitted, total;       /* tokens generated / to generate */
    int seq;                  /* events sent so far */
    int pending_tokens;       /* generated, not yet uploaded */
    bool started_sent, end_pending, end_sent, uploading, cancelled;
    struct event *tick;
} sim_job;

struct sim_agent {
    int idx;
    char id[37];
    struct evhttp_connection *work;
    struct event *poll_timer;
    int poll_interval_sec;
    int busy;
    bool parked, registered, vanished, batch_inflight, flush_pending;
    struct event *flush_ev;
    sim_job *jobs;
};

static sim_agent *agents;
static int agents_vanished;

/* Each client request's send time, by its number (the correlation id). */
static double *client_send_ms;
static long client_req_total;

static void work_park(sim_agent *a);
static void job_upload(sim_job *j);

static void job_free(sim_job *j)
{
    sim_agent *a = j->a;
    for (sim_job **pp = &a->jobs; *pp; pp = &(*pp)->next)
        if (*pp == j) {
            *pp = j->next;
            break;
        }
    if (j->tick)
        event_free(j->tick);
    free(j);
    a->busy--;
    if (!a->vanished && !a->parked)
        work_park(a);
}

static void upload_done(struct evhttp_request *req, void *arg)
{
    sim_job *j = arg;
    j->uploading = false;
    int code = req ? evhttp_request_get_response_code(req) : 0;
    if (j->a->vanished)
        return;
    if (code != 200) {
        st.upload_errors++;
        j->cancelled = true;
    } else {
        json_t *r = reply_json(req);
        if (json_is_true(json_object_get(r, "cancel"))) {
            j->cancelled = true;
            st.jobs_cancelled++;
        }
        json_decref(r);
    }
    if (j->cancelled || j->end_sent) {
        job_free(j);
        return;
    }
    if (j->pending_tokens > 0 || j->end_pending)
        job_upload(j);
}

/* Take what job j has to send as an events array; *first_seq its seq. */
static json_t *job_take_events(sim_job *j, int *first_seq)
{
    json_t *events = json_array();
    *first_seq = j->seq;
    if (!j->started_sent) {
        json_array_append_new(events, json_pack("{s:s}", "type", "started"));
        j->started_sent = true;
    }
    for (int i = 0; i < j->pending_tokens; i++)
        json_array_append_new(events, json_pack("{s:s,s:s}", "type", "token", "text", " tok"));
    st.token_events_uploaded += j->pending_tokens;
    j->pending_tokens = 0;
    if (j->end_pending) {
        json_array_append_new(events,
                              json_pack("{s:s,s:s,s:{s:i,s:i}}", "type", "end", "finish_reason",
                                        "length", "usage", "prompt_tokens", 8,
                                        "completion_tokens", j->total));
        j->end_pending = false;
        j->end_sent = true;
    }
    j->seq += (int)json_array_size(events);
    return events;
}

static void job_upload(sim_job *j)
{
    if (j->uploading || j->a->vanished)
        return;
    int first_seq;
    json_t *events = job_take_events(j, &first_seq);
    json_t *body = json_pack("{s:s,s:i,s:o}", "agent_id", j->a->id, "seq", first_seq, "events",
                             events);
    struct evhttp_request *req = evhttp_request_new(upload_done, j);
    add_json(req, body, O.agent_key);
    json_decref(body);
    char path[128];
    snprintf(path, sizeof path, "/agents/jobs/%s/events", j->id);
    j->uploading = true;
    st.uploads++;
    if (evhttp_make_request(pool_get(&upload_pool), req, EVHTTP_REQ_POST, path) < 0) {
        j->uploading = false;
        st.upload_errors++;
    }
}


/* ------------------------------------------------------- batched uploads */

typedef struct batch_ctx {
    sim_agent *a;
    sim_job **jobs;
    size_t n;
} batch_ctx;

static void agent_flush(sim_agent *a);

static void batch_done(struct evhttp_request *req, void *arg)
{
    batch_ctx *b = arg;
    sim_agent *a = b->a;
    a->batch_inflight = false;
    int code = req ? evhttp_request_get_response_code(req) : 0;
    json_t *r = code == 200 ? reply_json(req) : NULL;
    json_t *list = json_object_get(r, "jobs");
    if (code != 200)
        st.upload_errors++;
    for (size_t i = 0; i < b->n; i++) {
        sim_job *j = b->jobs[i];
        j->uploading = false;
        if (a->vanished)
            continue;
        json_t *e = json_array_get(list, i);
        if (json_integer_value(json_object_get(e, "status")) != 200) {
            j->cancelled = true;
            if (code == 200)
                st.upload_errors++;
        } else if (json_is_true(json_object_get(e, "cancel"))) {
            j->cancelled = true;
            st.jobs_cancelled++;
        }
        if (j->cancelled || j->end_sent)
            job_free(j);
    }
    json_decref(r);
    free(b->jobs);
    free(b);
    if (!a->vanished)
        agent_flush(a);
}

static void agent_flush_now(sim_agent *a);

static void flush_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    sim_agent *a = arg;
    a->flush_pending = false;
    agent_flush_now(a);
}

/* As the real agent: with two or more jobs running the first pending event
 * waits up to batch_ms for the others (a lone job's go at once). */
static void agent_flush(sim_agent *a)
{
    if (a->batch_inflight || a->vanished || a->flush_pending)
        return;
    if (a->busy >= 2 && O.batch_ms > 0) {
        if (!a->flush_ev)
            a->flush_ev = evtimer_new(base, flush_cb, a);
        struct timeval tv = {O.batch_ms / 1000, (O.batch_ms % 1000) * 1000};
        a->flush_pending = true;
        evtimer_add(a->flush_ev, &tv);
        return;
    }
    agent_flush_now(a);
}

static void agent_flush_now(sim_agent *a)
{
    if (a->batch_inflight || a->vanished)
        return;
    size_t n = 0;
    for (sim_job *j = a->jobs; j; j = j->next)
        if (!j->uploading && !j->cancelled && (j->pending_tokens || j->end_pending ||
                                               !j->started_sent))
            n++;
    if (!n)
        return;
    batch_ctx *b = calloc(1, sizeof *b);
    b->a = a;
    b->jobs = calloc(n, sizeof *b->jobs);
    json_t *entries = json_array();
    for (sim_job *j = a->jobs; j && b->n < n; j = j->next) {
        if (j->uploading || j->cancelled ||
            !(j->pending_tokens || j->end_pending || !j->started_sent))
            continue;
        int seq;
        json_t *events = job_take_events(j, &seq);
        json_array_append_new(entries, json_pack("{s:s,s:i,s:o}", "job_id", j->id, "seq", seq,
                                                 "events", events));
        j->uploading = true;
        b->jobs[b->n++] = j;
    }
    json_t *body = json_pack("{s:s,s:o}", "agent_id", a->id, "jobs", entries);
    struct evhttp_request *req = evhttp_request_new(batch_done, b);
    add_json(req, body, O.agent_key);
    json_decref(body);
    a->batch_inflight = true;
    st.uploads++;
    if (evhttp_make_request(pool_get(&upload_pool), req, EVHTTP_REQ_POST, "/agents/events") < 0) {
        a->batch_inflight = false;
        st.upload_errors++;
    }
}

static void job_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    sim_job *j = arg;
    if (j->cancelled || j->a->vanished)
        return;
    int n = O.tps > 0 ? 1 : j->total - j->emitted;
    j->emitted += n;
    j->pending_tokens += n;
    if (j->emitted >= j->total) {
        j->end_pending = true;
        event_del(j->tick);
    }
    if (O.batch)
        agent_flush(j->a);
    else
        job_upload(j);
}

static void job_begin(sim_agent *a, json_t *w)
{
    const char *id = json_string_value(json_object_get(w, "job_id"));
    if (!id || strlen(id) >= 64)
        return;
    st.jobs_received++;
    const char *cid = json_string_value(json_object_get(w, "correlation_id"));
    long n = -1;
    if (cid && sscanf(cid, "sim-%ld", &n) == 1 && n >= 0 && n < client_req_total &&
        client_send_ms[n] > 0)
        sample_add(&st.sched, now_ms() - client_send_ms[n]);
    sim_job *j = calloc(1, sizeof *j);
    j->a = a;
    snprintf(j->id, sizeof j->id, "%s", id);
    json_int_t mt = json_integer_value(json_object_get(json_object_get(w, "params"),
                                                       "max_tokens"));
    j->total = mt > 0 && mt < O.tokens ? (int)mt : O.tokens;
    j->next = a->jobs;
    a->jobs = j;
    a->busy++;
    j->tick = event_new(base, -1, EV_PERSIST, job_tick, j);
    struct timeval tv = {0, 0};
    if (O.tps > 0) {
        double ms = 1000.0 / O.tps;
        tv.tv_sec = (long)(ms / 1000);
        tv.tv_usec = (long)((ms - tv.tv_sec * 1000.0) * 1000);
    }
    event_add(j->tick, &tv);
}

static void work_done(struct evhttp_request *req, void *arg)
{
    sim_agent *a = arg;
    a->parked = false;
    if (a->vanished)
        return;
    int code = req ? evhttp_request_get_response_code(req) : 0;
    if (code == 200) {
        json_t *r = reply_json(req);
        size_t i;
        json_t *w;
        json_array_foreach(json_object_get(r, "jobs"), i, w) job_begin(a, w);
        json_decref(r);
    } else if (code != 204) {
        st.work_errors++;
        /* The connection may be gone: a fresh one for the next park. */
        if (a->work)
            evhttp_connection_free_on_completion(a->work);
        a->work = NULL;
    }
    work_park(a);
}

static void work_park(sim_agent *a)
{
    if (a->vanished || a->parked || !a->registered)
        return;
    int free_slots = O.slots - a->busy;
    if (free_slots <= 0)
        return;
    if (!a->work)
        a->work = conn_new();
    json_t *body = json_pack("{s:s,s:i}", "agent_id", a->id, "free_slots", free_slots);
    struct evhttp_request *req = evhttp_request_new(work_done, a);
    add_json(req, body, O.agent_key);
    json_decref(body);
    a->parked = true;
    if (evhttp_make_request(a->work, req, EVHTTP_REQ_POST, "/agents/work") < 0) {
        a->parked = false;
        st.work_errors++;
    }
}

static void poll_send(sim_agent *a);

static void poll_done(struct evhttp_request *req, void *arg)
{
    sim_agent *a = arg;
    if (a->vanished)
        return;
    int code = req ? evhttp_request_get_response_code(req) : 0;
    struct timeval tv = {1, 0};
    if (code == 200) {
        json_t *r = reply_json(req);
        json_int_t pi = json_integer_value(json_object_get(r, "poll_interval_sec"));
        json_decref(r);
        if (pi > 0)
            a->poll_interval_sec = (int)pi;
        tv.tv_sec = a->poll_interval_sec;
        if (!a->registered) {
            a->registered = true;
            work_park(a);
        }
    } else {
        st.poll_errors++;
    }
    evtimer_add(a->poll_timer, &tv);
}

static void poll_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    poll_send(arg);
}

static void poll_send(sim_agent *a)
{
    json_t *body = json_pack("{s:s,s:s,s:s,s:[{s:s}],s:{s:i,s:i},s:[]}", "agent_id", a->id,
                             "name", "sim", "version", "0.1.0", "models", "id", O.model, "slots",
                             "total", O.slots, "busy", a->busy, "gpus");
    struct evhttp_request *req = evhttp_request_new(poll_done, a);
    add_json(req, body, O.agent_key);
    json_decref(body);
    st.polls++;
    if (evhttp_make_request(pool_get(&poll_pool), req, EVHTTP_REQ_POST, "/agents/poll") < 0) {
        st.poll_errors++;
        struct timeval tv = {1, 0};
        evtimer_add(a->poll_timer, &tv);
    }
}

static void vanish(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    int n = O.agents * O.vanish_pct / 100;
    for (int i = 0; i < n; i++) {
        sim_agent *a = &agents[i];
        a->vanished = true;
        event_del(a->poll_timer);
        for (sim_job *j = a->jobs; j; j = j->next)
            if (j->tick)
                event_del(j->tick);
        /* Closing the long-poll connection is what a dead process does. */
        if (a->work)
            evhttp_connection_free(a->work);
        a->work = NULL;
    }
    agents_vanished = n;
    fprintf(stderr, "scalesim: %d agents vanished at %.0f ms\n", n, now_ms() - st.first_send_ms);
}

/* ---------------------------------------------------------------- clients */

typedef struct sim_client {
    int idx, done_requests;
    struct evhttp_connection *c;
    long cur;                 /* global request number */
    double sent_ms, first_ms;
    bool got_done, failed;
    int tokens;
    char *carry;              /* partial SSE line data */
    size_t carry_len;
} sim_client;

static sim_client *clients;
static long clients_finished;

static void client_next(sim_client *c);

static void sse_scan(sim_client *c, const char *p, size_t n)
{
    /* Count "data: " events: a content delta is a token, [DONE] ends. The
     * carry keeps a line split across chunks. */
    char *buf = malloc(c->carry_len + n + 1);
    memcpy(buf, c->carry, c->carry_len);
    memcpy(buf + c->carry_len, p, n);
    size_t len = c->carry_len + n;
    buf[len] = '\0';
    size_t start = 0;
    for (size_t i = 0; i < len; i++) {
        if (buf[i] != '\n')
            continue;
        buf[i] = '\0';
        const char *line = buf + start;
        if (strncmp(line, "data: ", 6) == 0) {
            if (strcmp(line + 6, "[DONE]") == 0) {
                c->got_done = true;
            } else if ((strstr(line, "\"content\":\"") && !strstr(line, "\"content\":\"\"")) ||
                       (strstr(line, "\"text\":\"") && !strstr(line, "\"text\":\"\""))) {
                if (!c->first_ms)
                    c->first_ms = now_ms();
                c->tokens++;
                st.tokens_received++;
            } else if (strstr(line, "\"error\"")) {
                c->failed = true;
                st.stream_errors++;
            }
        }
        start = i + 1;
    }
    free(c->carry);
    c->carry_len = len - start;
    c->carry = malloc(c->carry_len + 1);
    memcpy(c->carry, buf + start, c->carry_len);
    free(buf);
}

static void client_chunk(struct evhttp_request *req, void *arg)
{
    sim_client *c = arg;
    struct evbuffer *b = evhttp_request_get_input_buffer(req);
    size_t n = evbuffer_get_length(b);
    if (n) {
        sse_scan(c, (const char *)evbuffer_pullup(b, (ev_ssize_t)n), n);
        evbuffer_drain(b, n);
    }
}

static void client_done(struct evhttp_request *req, void *arg)
{
    sim_client *c = arg;
    int code = req ? evhttp_request_get_response_code(req) : 0;
    double t = now_ms();
    if (code == 0) {
        st.transport_errors++;
        st.failed++;
        if (c->c)
            evhttp_connection_free_on_completion(c->c);
        c->c = NULL;
    } else {
        st.by_status[code <= MAX_STATUS ? code : MAX_STATUS]++;
        if (code == 200 && c->got_done && !c->failed) {
            st.ok++;
            sample_add(&st.ttft, (c->first_ms ? c->first_ms : t) - c->sent_ms);
            sample_add(&st.total, t - c->sent_ms);
        } else {
            st.failed++;
        }
    }
    st.last_done_ms = t;
    c->done_requests++;
    free(c->carry);
    c->carry = NULL;
    c->carry_len = 0;
    if (c->done_requests < O.requests)
        client_next(c);
    else
        clients_finished++;
    if (clients_finished == O.clients)
        event_base_loopexit(base, NULL);
}

static void client_next(sim_client *c)
{
    if (!c->c)
        c->c = conn_new();
    c->cur = (long)c->idx * O.requests + c->done_requests;
    c->got_done = c->failed = false;
    c->first_ms = 0;
    c->tokens = 0;
    json_t *body = json_pack("{s:s,s:b,s:i,s:[{s:s,s:s}]}", "model", O.model, "stream", 1,
                             "max_tokens", O.tokens, "messages", "role", "user", "content",
                             "Tell me a story about a lighthouse.");
    struct evhttp_request *req = evhttp_request_new(client_done, c);
    evhttp_request_set_chunked_cb(req, client_chunk);
    add_json(req, body, O.client_key);
    json_decref(body);
    char cid[32];
    snprintf(cid, sizeof cid, "sim-%ld", c->cur);
    evhttp_add_header(evhttp_request_get_output_headers(req), "X-Correlation-Id", cid);
    c->sent_ms = now_ms();
    client_send_ms[c->cur] = c->sent_ms;
    if (!st.first_send_ms)
        st.first_send_ms = c->sent_ms;
    st.sent++;
    if (evhttp_make_request(c->c, req, EVHTTP_REQ_POST, "/v1/chat/completions") < 0) {
        st.transport_errors++;
        st.failed++;
        c->done_requests = O.requests;
        clients_finished++;
    }
}

static void client_start(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    client_next(arg);
}

/* ------------------------------------------------------------------- main */

static void deadline(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    fprintf(stderr, "scalesim: --max-sec reached\n");
    event_base_loopexit(base, NULL);
}

static void clients_go(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    for (int i = 0; i < O.clients; i++) {
        double at = O.clients > 1 ? (double)O.ramp_ms * i / (O.clients - 1) : 0;
        struct timeval tv = {(long)(at / 1000), (long)((at - (long)(at / 1000) * 1000) * 1000)};
        event_base_once(base, -1, EV_TIMEOUT, client_start, &clients[i], &tv);
    }
    if (O.vanish_pct > 0) {
        struct timeval tv = {O.vanish_at_ms / 1000, (O.vanish_at_ms % 1000) * 1000};
        event_base_once(base, -1, EV_TIMEOUT, vanish, NULL, &tv);
    }
    if (O.clients == 0 && O.vanish_pct == 0)
        event_base_loopexit(base, NULL);
}

static int registered_count(void)
{
    int n = 0;
    for (int i = 0; i < O.agents; i++)
        n += agents[i].registered && agents[i].parked;
    return n;
}

static double wait_start;

static void wait_ready(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct event *self = arg;
    int r = registered_count();
    if (r == O.agents || now_ms() - wait_start > 60000) {
        event_free(self);
        fprintf(stderr, "scalesim: %d of %d agents registered and parked in %.0f ms\n", r,
                O.agents, now_ms() - wait_start);
        struct timeval idle = {O.idle_sec, 0};
        event_base_once(base, -1, EV_TIMEOUT, clients_go, NULL, &idle);
        if (O.idle_sec)
            fprintf(stderr, "scalesim: idle for %d s\n", O.idle_sec);
        return;
    }
    struct timeval tv = {0, 100000};
    evtimer_add(self, &tv);
}

static void usage(void)
{
    fprintf(stderr,
            "usage: scalesim --port P [--host H] [--agents M] [--slots S] [--clients N]\n"
            "       [--requests R] [--tokens T] [--tps P] [--ramp-ms MS] [--idle-sec S]\n"
            "       [--vanish-pct P --vanish-at-ms MS] [--max-sec S] [--model NAME]\n"
            "       [--agent-key K] [--client-key K] [--no-batch] [--batch-ms MS]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    snprintf(O.host, sizeof O.host, "127.0.0.1");
    static const struct option lo[] = {
        {"host", 1, 0, 'H'},       {"port", 1, 0, 'p'},         {"agents", 1, 0, 'a'},
        {"slots", 1, 0, 's'},      {"clients", 1, 0, 'c'},      {"requests", 1, 0, 'r'},
        {"tokens", 1, 0, 't'},     {"tps", 1, 0, 'T'},          {"ramp-ms", 1, 0, 'R'},
        {"max-sec", 1, 0, 'm'},    {"vanish-pct", 1, 0, 'v'},   {"vanish-at-ms", 1, 0, 'V'},
        {"idle-sec", 1, 0, 'i'},   {"model", 1, 0, 'M'},        {"agent-key", 1, 0, 'k'},
        {"client-key", 1, 0, 'K'}, {"no-batch", 0, 0, 'B'},  {"batch-ms", 1, 0, 'b'},
        {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (ch) {
        case 'H': snprintf(O.host, sizeof O.host, "%s", optarg); break;
        case 'p': O.port = atoi(optarg); break;
        case 'a': O.agents = atoi(optarg); break;
        case 's': O.slots = atoi(optarg); break;
        case 'c': O.clients = atoi(optarg); break;
        case 'r': O.requests = atoi(optarg); break;
        case 't': O.tokens = atoi(optarg); break;
        case 'T': O.tps = atof(optarg); break;
        case 'R': O.ramp_ms = atoi(optarg); break;
        case 'm': O.max_sec = atoi(optarg); break;
        case 'v': O.vanish_pct = atoi(optarg); break;
        case 'V': O.vanish_at_ms = atoi(optarg); break;
        case 'i': O.idle_sec = atoi(optarg); break;
        case 'M': O.model = optarg; break;
        case 'k': O.agent_key = optarg; break;
        case 'K': O.client_key = optarg; break;
        case 'B': O.batch = 0; break;
        case 'b': O.batch_ms = atoi(optarg); break;
        default: usage();
        }
    }
    if (O.agents < 1 || O.slots < 1 || O.clients < 0 || O.requests < 1 || O.tokens < 1 ||
        O.port <= 0)
        usage();
    /* Every connection is a descriptor: as many as the hard limit allows. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    signal(SIGPIPE, SIG_IGN);
    base = event_base_new();
    poll_pool.n = O.poll_conns;
    poll_pool.c = calloc((size_t)poll_pool.n, sizeof *poll_pool.c);
    upload_pool.n = O.upload_conns;
    upload_pool.c = calloc((size_t)upload_pool.n, sizeof *upload_pool.c);
    agents = calloc((size_t)O.agents, sizeof *agents);
    clients = calloc((size_t)(O.clients ? O.clients : 1), sizeof *clients);
    client_req_total = (long)O.clients * O.requests;
    client_send_ms = calloc((size_t)(client_req_total ? client_req_total : 1), sizeof(double));
    for (int i = 0; i < O.agents; i++) {
        sim_agent *a = &agents[i];
        a->idx = i;
        snprintf(a->id, sizeof a->id, "5c000000-0000-4000-8000-%012d", i);
        a->poll_interval_sec = 15;
        a->poll_timer = evtimer_new(base, poll_tick, a);
        /* Spread the first polls over a second. */
        struct timeval tv = {0, (long)(1000000.0 * i / O.agents)};
        evtimer_add(a->poll_timer, &tv);
    }
    for (int i = 0; i < O.clients; i++)
        clients[i].idx = i;
    wait_start = now_ms();
    struct event *w = evtimer_new(base, wait_ready, event_self_cbarg());
    struct timeval tv = {0, 100000};
    evtimer_add(w, &tv);
    struct timeval dl = {O.max_sec, 0};
    event_base_once(base, -1, EV_TIMEOUT, deadline, NULL, &dl);
    event_base_dispatch(base);

    double span = st.last_done_ms > st.first_send_ms ? (st.last_done_ms - st.first_send_ms) : 0;
    fprintf(stderr,
            "scalesim: %d agents x %d slots, %d clients x %d requests, %d tokens at %.0f/s\n"
            "  requests ok %ld / sent %ld (failed %ld: transport %ld, stream errors %ld)\n"
            "  TTFT p50 %.1f ms p99 %.1f ms; total p50 %.0f ms p99 %.0f ms; %.1f req/s\n"
            "  scheduling latency (client send -> job at agent) p50 %.2f ms p99 %.2f ms\n"
            "  token events uploaded %ld in %ld uploads; received %ld; polls %ld\n",
            O.agents, O.slots, O.clients, O.requests, O.tokens, O.tps, st.ok, st.sent, st.failed,
            st.transport_errors, st.stream_errors, pct(&st.ttft, .5), pct(&st.ttft, .99),
            pct(&st.total, .5), pct(&st.total, .99), span > 0 ? st.ok * 1000.0 / span : 0,
            pct(&st.sched, .5), pct(&st.sched, .99), st.token_events_uploaded, st.uploads,
            st.tokens_received, st.polls);
    json_t *status = json_object();
    for (int i = 0; i <= MAX_STATUS; i++)
        if (st.by_status[i]) {
            char k[8];
            snprintf(k, sizeof k, "%d", i);
            json_object_set_new(status, k, json_integer(st.by_status[i]));
        }
    json_t *out = json_pack(
        "{s:i,s:i,s:i,s:i,s:i,s:f,s:I,s:I,s:I,s:I,s:I,s:o,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:I,s:I,"
        "s:I,s:I,s:I,s:I,s:i,s:I}",
        "agents", O.agents, "slots", O.slots, "clients", O.clients, "requests", O.requests,
        "tokens", O.tokens, "tps", O.tps, "sent", (json_int_t)st.sent, "ok", (json_int_t)st.ok,
        "failed", (json_int_t)st.failed, "transport_errors", (json_int_t)st.transport_errors,
        "stream_errors", (json_int_t)st.stream_errors, "by_status", status, "ttft_p50_ms",
        pct(&st.ttft, .5), "ttft_p99_ms", pct(&st.ttft, .99), "total_p50_ms", pct(&st.total, .5),
        "total_p99_ms", pct(&st.total, .99), "sched_p50_ms", pct(&st.sched, .5), "sched_p99_ms",
        pct(&st.sched, .99), "req_per_sec", span > 0 ? st.ok * 1000.0 / span : 0,
        "token_events_uploaded", (json_int_t)st.token_events_uploaded, "uploads",
        (json_int_t)st.uploads, "tokens_received", (json_int_t)st.tokens_received, "polls",
        (json_int_t)st.polls, "jobs_received", (json_int_t)st.jobs_received, "jobs_cancelled",
        (json_int_t)st.jobs_cancelled, "agents_vanished", agents_vanished, "upload_errors",
        (json_int_t)st.upload_errors);
    char *s = json_dumps(out, JSON_COMPACT);
    printf("%s\n", s);
    free(s);
    json_decref(out);
    return 0;
}
