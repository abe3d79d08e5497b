/*
 * http: the server's HTTP front (contract in http.h): routing, dispatch to
 * the route's handler, the listeners and their lifecycle.
 *
 * The module's files (what they share is in http_priv.h, private to them):
 *   - http.c (this file): routes, dispatch, binding, pausing accept (out
 *     of descriptors, or libevent's memory reserve spent: evmem.h);
 *   - http_reply.c: replies in a dialect, request helpers, the peer-close
 *     watch;
 *   - http_head.c: a request head parsed and checked (pure);
 *   - http_gate.c: the gate of a connection: the bytes of a request vetted
 *     before evhttp reads them (head, Content-Length and chunked bodies,
 *     deadlines, the in-flight byte budget, refusals);
 *   - http_admit.c: the gate's decision on a complete head (route, auth,
 *     home mode, pool loops, the client's address, body caps);
 *   - http_conn.c: a gate's life with its evhttp connection (attach,
 *     completion, lingering closes of refused connections).
 */
#include "server/http/http_priv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <openssl/ssl.h>
#include "common/gp_log.h"
#include "common/gp_util.h"
#include "server/http/errors.h"
#include "server/http/evmem.h"
#include "server/http/ids.h"

/* A process-wide list only to map a listener back to its gps_http (the
 * listener's user data belongs to evhttp). Loop thread only. */
static gps_http *pause_owners[8];

/* ------------------------------------------------------------------ */
/* Routing                                                             */
/* ------------------------------------------------------------------ */

/* Match one pattern against a path. Segments are compared literally except
 * "{name}", which takes one non-empty segment into params. */
bool http_pattern_match(const char *pat, const char *path, char params[][GPS_ROUTE_PARAM_MAX],
                        int *nparams)
{
    int np = 0;
    while (*pat && *path) {
        if (*pat == '{') {
            const char *pe = strchr(pat, '}');
            if (!pe)
                return false;
            size_t sl = strcspn(path, "/");
            if (sl == 0 || sl >= GPS_ROUTE_PARAM_MAX || np >= GPS_ROUTE_MAX_PARAMS)
                return false;
            if (params) {
                memcpy(params[np], path, sl);
                params[np][sl] = '\0';
            }
            np++;
            pat = pe + 1;
            path += sl;
            continue;
        }
        if (*pat != *path)
            return false;
        pat++;
        path++;
    }
    /* Tolerate one trailing slash on the path ("/v1/models/"). */
    if (*pat == '\0' && path[0] == '/' && path[1] == '\0')
        path++;
    if (*pat || *path)
        return false;
    if (nparams)
        *nparams = np;
    return true;
}

int gps_route_lookup(const gps_route *routes, size_t n, unsigned method, const char *path,
                     const gps_route **out, char params[][GPS_ROUTE_PARAM_MAX], int *nparams)
{
    const gps_route *wrong_method = NULL;
    for (size_t i = 0; i < n; i++) {
        int np = 0;
        if (!http_pattern_match(routes[i].pattern, path, params, &np))
            continue;
        if (routes[i].methods & method) {
            *out = &routes[i];
            if (nparams)
                *nparams = np;
            return 0;
        }
        if (!wrong_method)
            wrong_method = &routes[i];
    }
    *out = wrong_method;
    return wrong_method ? 405 : 404;
}

gps_dialect gps_dialect_for_path(const char *path)
{
    if (strncmp(path, "/v1/messages", 12) == 0)
        return GPS_DIALECT_ANTHROPIC;
    if (strncmp(path, "/v1/", 4) == 0 || strcmp(path, "/v1") == 0)
        return GPS_DIALECT_OPENAI;
    return GPS_DIALECT_NATIVE;
}

/* ------------------------------------------------------------------ */
/* Dispatch                                                            */
/* ------------------------------------------------------------------ */

/* Send the gate's refusal in its dialect. */
static void send_refusal(gps_req *r, const gps_conn *c)
{
    struct evkeyvalq *oh = evhttp_request_get_output_headers(r->req);
    if (c->allow[0])
        evhttp_add_header(oh, "Allow", c->allow);
    if (c->www_auth)
        evhttp_add_header(oh, "WWW-Authenticate", "Bearer");
    /* The Stainless SDKs honour this header before their own rules;
     * without it Claude Code retries a 401 ten times with backoff
     * (minutes) before telling the user the key is wrong. */
    if (c->no_retry)
        evhttp_add_header(oh, "x-should-retry", "false");
    if (c->retry_after)
        evhttp_add_header(oh, "Retry-After", "1");
    /* A body we did not read, or framing we could not trust: the
     * connection cannot carry another request. CONNECT too (evhttp
     * would keep a CONNECT connection open). */
    if (c->close_after || c->refuse == 501) {
        evhttp_add_header(oh, "Connection", "close");
        if (c->close_after)
            evhttp_request_set_on_complete_cb(r->req, http_on_complete_linger, r->http);
    }
    json_t *body = gps_error_body(c->dialect, c->refuse, c->code, c->msg, NULL,
                                  r->correlation_id, NULL);
    gps_http_send_json(r->req, c->refuse, body);
}

/* A path of the agents' protocol (docs/protocol.md) but enroll and check,
 * which take no agent key: what the agent's own requests use. */
static bool agent_path(const char *path)
{
    return strncmp(path, "/agents/", 8) == 0 && strcmp(path, "/agents/enroll") != 0 &&
           strcmp(path, "/agents/check") != 0;
}

/* r filled from the request: the request itself, its method and path. */
static void req_init(gps_req *r, gps_http *h, struct evhttp_request *req)
{
    memset(r, 0, sizeof *r);
    r->req = req;
    r->http = h;
    r->start_us = gp_now_mono_us();
    r->method = (unsigned)evhttp_request_get_command(req);
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    r->path = path && *path ? path : "/";
}

/* r's X-Pool-Via chain (with this pool's id) and correlation id (the
 * request's when well-formed, else a new one). */
static void req_ids(gps_req *r)
{
    gps_http *h = r->http;
    struct evhttp_request *req = r->req;
    /* The chain this pool passes on (the gate checked the header). */
    const char *via = evhttp_find_header(evhttp_request_get_input_headers(req), "X-Pool-Via");
    snprintf(r->pool_via, sizeof r->pool_via, "%s%s%s", via && *via ? via : "",
             via && *via ? ", " : "", h->pool_id);

    const char *corr = evhttp_find_header(evhttp_request_get_input_headers(req),
                                          "X-Correlation-Id");
    if (corr && http_corr_ok(corr))
        gp_copy_str(r->correlation_id, sizeof r->correlation_id, corr);
    else
        gps_id_hex(r->correlation_id, 16);
}

/* The headers every reply carries: the correlation id, nosniff and, in the
 * Anthropic dialect, request-id. */
static void add_reply_headers(gps_req *r, const gps_conn *c)
{
    struct evkeyvalq *oh = evhttp_request_get_output_headers(r->req);
    /* The agents' routes (their long-polls and uploads: a few per relayed
     * request) carry neither header: the agent reads no header of the
     * server's replies, its errors carry the id in the body, and nosniff
     * is for browsers. A header costs ~2,000 instructions (evhttp's list
     * and its printf of the reply head). */
    if (!agent_path(r->path)) {
        evhttp_add_header(oh, "X-Correlation-Id", r->correlation_id);
        evhttp_add_header(oh, "X-Content-Type-Options", "nosniff");
    }
    if ((c && c->refuse ? c->dialect : gps_dialect_for_path(r->path)) == GPS_DIALECT_ANTHROPIC) {
        /* The Anthropic SDKs surface `request-id` in errors and logs. */
        char rid[72];
        snprintf(rid, sizeof rid, "req_%s", r->correlation_id);
        evhttp_add_header(oh, "request-id", rid);
    }
}

/* The request's route (r->route and r->params set), or NULL when no route
 * takes it (404 or 405 sent). */
static const gps_route *find_route(gps_req *r)
{
    gps_http *h = r->http;
    const gps_route *route = NULL;
    int rc = gps_route_lookup(h->routes, h->nroutes, r->method, r->path, &route, r->params,
                              &r->nparams);
    if (rc != 0 && r->method == EVHTTP_REQ_HEAD) /* HEAD is GET without the body */
        rc = gps_route_lookup(h->routes, h->nroutes, EVHTTP_REQ_GET, r->path, &route, r->params,
                              &r->nparams);
    /* see http_decide() */
    unsigned shown = r->method == EVHTTP_REQ_HEAD ? EVHTTP_REQ_GET : r->method;
    if (rc == 404) {
        char msg[200];
        snprintf(msg, sizeof msg, "no route for %s %.120s", http_method_name(shown), r->path);
        gps_req_error(r, 404, "NOT_FOUND", msg, NULL);
        return NULL;
    }
    r->route = route;
    if (rc == 405) {
        char msg[200], allow[64];
        snprintf(msg, sizeof msg, "method %s is not allowed on %.120s", http_method_name(shown),
                 r->path);
        http_allow_methods(h, r->path, allow, sizeof allow);
        gps_req_add_header(r, "Allow", allow);
        gps_req_error(r, 405, "METHOD_NOT_ALLOWED", msg, NULL);
        return NULL;
    }
    return route;
}

/* r->key_id: the gate's, or the auth hook's when the gate did not check
 * the key; -1 when the hook refuses (401 or 403 sent). */
static int authorize(gps_req *r, const gps_conn *c, const gps_route *route)
{
    gps_http *h = r->http;
    struct evhttp_request *req = r->req;
    if (c && c->authed) {
        gp_copy_str(r->key_id, sizeof r->key_id, c->key_id);
    } else if (route->role != GPS_ROLE_NONE && h->auth) {
        struct evkeyvalq *ih = evhttp_request_get_input_headers(req);
        const char *cred = evhttp_find_header(ih, "Authorization");
        if (!cred && route->dialect == GPS_DIALECT_ANTHROPIC)
            cred = evhttp_find_header(ih, "x-api-key");
        if (cred && !cred[strspn(cred, " \t")])
            cred = NULL; /* blank: missing, not invalid */
        char *peer = NULL, client[256];
        ev_uint16_t pport = 0;
        struct evhttp_connection *evc = evhttp_request_get_connection(req);
        if (evc)
            evhttp_connection_get_peer(evc, &peer, &pport);
        http_client_addr(h, peer, evhttp_find_header(ih, "X-Forwarded-For"), client, sizeof client);
        int st = h->auth(h->auth_arg, cred, route->role, r->key_id, client);
        if (st != 0) {
            struct evkeyvalq *oh = evhttp_request_get_output_headers(req);
            if (st == 401 && route->dialect != GPS_DIALECT_NATIVE)
                evhttp_add_header(oh, "WWW-Authenticate", "Bearer");
            evhttp_add_header(oh, "x-should-retry", "false");
            if (st == 403)
                gps_req_error(r, 403, "FORBIDDEN", "this key's role may not use this endpoint",
                              NULL);
            else
                gps_req_error(r, 401, cred ? "INVALID_API_KEY" : "UNAUTHORIZED",
                              cred ? "invalid API key"
                                   : "missing API key (Authorization: Bearer <key>)",
                              NULL);
            return -1;
        }
    }
    return 0;
}

/* Whether the server cannot take the request now (503 sent): the admit
 * hook refuses a client's POST, or the server is shutting down. */
static bool refuse_unavailable(gps_req *r, const gps_route *route)
{
    gps_http *h = r->http;
    if (h->admit && route->role == GPS_ROLE_CLIENT && r->method == EVHTTP_REQ_POST) {
        char msg[300];
        int sec = h->admit(h->admit_arg, msg, sizeof msg);
        if (sec > 0) {
            gps_send_error_retry(r->req, route->dialect, 503, "SERVER_BUSY", msg, NULL,
                                 r->correlation_id, sec);
            return true;
        }
    }
    if (h->shutting_down && (route->role == GPS_ROLE_CLIENT || route->role == GPS_ROLE_ADMIN)) {
        gps_req_add_header(r, "Retry-After", "1");
        gps_req_add_header(r, "Connection", "close");
        gps_req_error(r, 503, "SHUTTING_DOWN", "the server is shutting down", NULL);
        return true;
    }
    return false;
}

static void dispatch(struct evhttp_request *req, void *arg)
{
    gps_http *h = arg;
    gps_req r;
    req_init(&r, h, req);

    /* The gate decided on the head; take its decision and end it. */
    gps_conn gc;
    gps_conn *c = http_conn_of(h, evhttp_request_get_connection(req));
    if (c) {
        gc = *c;
        http_conn_detach(c);
        c = &gc;
    }
    evhttp_request_set_on_complete_cb(req, http_on_complete, h);
    req_ids(&r);
    add_reply_headers(&r, c);
    if (c && c->refuse) {
        send_refusal(&r, c);
        return;
    }

    const gps_route *route = find_route(&r);
    if (!route)
        return;

    /* Without a gate (never expected) the old checks still hold. */
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    if (in && evbuffer_get_length(in) > h->opts.max_body_bytes) {
        char msg[128];
        snprintf(msg, sizeof msg, "request body exceeds %zu bytes", h->opts.max_body_bytes);
        gps_req_error(&r, 413, "BODY_TOO_LARGE", msg, NULL);
        return;
    }
    if (authorize(&r, c, route) != 0)
        return;
    if (refuse_unavailable(&r, route))
        return;
    route->fn(&r, route->arg);
}

void gps_http_set_shutting_down(gps_http *h, bool on)
{
    h->shutting_down = on;
}

/* ------------------------------------------------------------------ */
/* Lifecycle                                                           */
/* ------------------------------------------------------------------ */

/* Limits and dispatcher shared by the HTTP and the HTTPS evhttp. */
static void evhttp_setup(gps_http *h, struct evhttp *evh)
{
    /* Twice our limit: bodies between the two get our JSON 413; only a body
     * more than twice too large meets evhttp's bare 413 (still a 413). */
    size_t evmax = h->opts.max_body_bytes * 2 + 65536;
    evhttp_set_max_body_size(evh, (ev_ssize_t)evmax);
    evhttp_set_max_headers_size(evh, (ev_ssize_t)h->opts.max_header_bytes);
    evhttp_set_timeout(evh, h->opts.idle_timeout_sec);
    /* Let every common method reach the dispatcher so that 405 comes in
     * the endpoint's dialect. */
    evhttp_set_allowed_methods(evh, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD |
                                        EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE |
                                        EVHTTP_REQ_OPTIONS | EVHTTP_REQ_PATCH);
    evhttp_set_default_content_type(evh, "application/json");
    evhttp_set_gencb(evh, dispatch, h);
    /* Every connection through the request gate (the HTTPS evhttp
     * replaces this with tls_bevcb, which does the same). */
    evhttp_set_bevcb(evh, http_plain_bevcb, h);
}

/* ------------------------------------------------------------------ */
/* Memory low: libevent's reserve spent (evmem.h)                      */
/* ------------------------------------------------------------------ */

/* Once libevent's reserve is spent, the next failure of its allocations
 * may crash it, and a new connection is where most of them happen (its
 * bufferevent, evhttp connection, watermark entries, the head's parse):
 * the listeners pause (the kernel keeps new connections in the backlog)
 * until the reserve can be allocated again, tried every MEM_RETRY_MS.
 * Connections already open go on. One log line when the reserve is
 * spent, one when it is back, whatever the number of gps_https. */
#define MEM_RETRY_MS 100
/* mem_retry's period while memory is not low: it stays in libevent's timer
 * heap from gps_http_new on, so that shortening it when the reserve is
 * spent moves it within the heap and allocates nothing (adding a timer
 * that is not there may have to grow the heap: the very allocation that
 * may fail then). */
#define MEM_IDLE_SEC 3600

static bool mem_spent;      /* the reserve was spent; memory_reserve_used not written */
static bool mem_logged;     /* memory_reserve_used written, memory_reserve_restored not */
static uint64_t mem_low_ms; /* when memory_reserve_used was written */

/* Inside libevent's allocator (evmem.h gps_evmem_on_low): only flags and
 * event_active, which touches the base's active queue and allocates
 * nothing; the loop thread is the only one that allocates through libevent
 * here (docs/architecture.md "Threads"). */
static void mem_low_hook(void *arg)
{
    (void)arg;
    mem_spent = true;
    for (size_t i = 0; i < sizeof pause_owners / sizeof pause_owners[0]; i++)
        if (pause_owners[i] && pause_owners[i]->mem_ev)
            event_active(pause_owners[i]->mem_ev, EV_TIMEOUT, 0);
}

static void mem_log_used(void)
{
    if (!mem_spent)
        return;
    mem_spent = false;
    mem_logged = true;
    mem_low_ms = gp_now_mono_ms();
    size_t kib = gps_evmem_reserve_bytes() / 1024;
    gp_log_write(GP_LOG_WARN, "memory_reserve_used", NULL,
                 json_pack("{s:I}", "reserve_kib", (json_int_t)kib),
                 "an allocation of libevent failed: its memory reserve (%zu KiB) was used; "
                 "not accepting new connections until it can be allocated again",
                 kib);
}

static void mem_log_restored(void)
{
    mem_log_used(); /* restored before the loop came to the pause */
    if (!mem_logged)
        return;
    mem_logged = false;
    uint64_t ms = gp_now_mono_ms() - mem_low_ms;
    gp_log_write(GP_LOG_INFO, "memory_reserve_restored", NULL,
                 json_pack("{s:I}", "low_ms", (json_int_t)ms),
                 "libevent's memory reserve is allocated again after %llu ms: accepting "
                 "new connections",
                 (unsigned long long)ms);
}

static void mem_listeners(gps_http *h, bool on)
{
    for (int k = 0; k < 2; k++) {
        if (!h->pause[k].lev)
            continue;
        /* Out of descriptors too: accept_resume enables it. */
        if (on && !(h->pause[k].resume && evtimer_pending(h->pause[k].resume, NULL)))
            evconnlistener_enable(h->pause[k].lev);
        else if (on)
            continue;
        else
            evconnlistener_disable(h->pause[k].lev);
    }
}

static void mem_resume(gps_http *h)
{
    struct timeval idle = {MEM_IDLE_SEC, 0};
    event_add(h->mem_retry, &idle); /* (in the heap: allocates nothing) */
    h->mem_paused = false;
    mem_listeners(h, true);
    mem_log_restored();
}

static void mem_retry_cb(evutil_socket_t fd, short what, void *arg)
{
    gps_http *h = arg;
    if (h->mem_paused && gps_evmem_restore() >= 0)
        mem_resume(h);
}

static void mem_low_cb(evutil_socket_t fd, short what, void *arg)
{
    gps_http *h = arg;
    mem_log_used();
    if (!gps_evmem_low() || h->mem_paused)
        return;
    struct timeval tv = {0, MEM_RETRY_MS * 1000};
    /* mem_retry is in the timer heap already (MEM_IDLE_SEC): this moves
     * it, allocating nothing. The listeners pause whatever it says: at
     * worst the idle period's tick ends the pause. */
    event_add(h->mem_retry, &tv);
    h->mem_paused = true;
    mem_listeners(h, false);
}

bool http_mem_refuse(gps_http *h)
{
    (void)h;
    if (!gps_evmem_low())
        return false;
    if (gps_evmem_restore() < 0)
        return true;
    mem_log_restored();
    return false;
}

gps_http *gps_http_new(struct event_base *base, const gps_http_opts *opts)
{
    gps_http *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->base = base;
    h->opts = *opts;
    gp_random_hex(h->pool_id, 8);
    h->evh = evhttp_new(base);
    h->orphan_ev = event_new(base, -1, 0, http_orphans_cb, h);
    h->mem_ev = event_new(base, -1, 0, mem_low_cb, h);
    h->mem_retry = event_new(base, -1, EV_PERSIST, mem_retry_cb, h);
    struct timeval idle = {MEM_IDLE_SEC, 0};
    if (!h->evh || !h->orphan_ev || !h->mem_ev || !h->mem_retry ||
        event_add(h->mem_retry, &idle) < 0) {
        if (h->evh)
            evhttp_free(h->evh);
        if (h->orphan_ev)
            event_free(h->orphan_ev);
        if (h->mem_ev)
            event_free(h->mem_ev);
        if (h->mem_retry)
            event_free(h->mem_retry);
        free(h);
        return NULL;
    }
    gps_evmem_on_low(mem_low_hook, NULL); /* the same for every gps_http */
    evhttp_setup(h, h->evh);
    return h;
}

void gps_http_free(gps_http *h)
{
    if (!h)
        return;
    for (int i = 0; i < 2; i++)
        if (h->pause[i].resume)
            event_free(h->pause[i].resume);
    for (size_t i = 0; i < sizeof pause_owners / sizeof pause_owners[0]; i++)
        if (pause_owners[i] == h)
            pause_owners[i] = NULL;
    if (h->evh)
        evhttp_free(h->evh);
    if (h->evh_tls)
        evhttp_free(h->evh_tls);
    /* Gates of connections accepted in the last loop pass (not attached
     * yet; evhttp_free freed the others through their close callbacks). */
    while (h->conns_all)
        http_conn_free(h->conns_all);
    http_orphans_free(h);
    event_free(h->orphan_ev);
    event_free(h->mem_ev);
    event_free(h->mem_retry);
    while (h->lingers)
        http_linger_free(h->lingers);
    free(h->conn_by_fd);
    free(h);
}

int gps_http_add_route(gps_http *h, unsigned methods, const char *pattern, gps_dialect d,
                       gps_role role, gps_handler_fn fn, void *arg)
{
    if (h->nroutes >= MAX_ROUTES)
        return -1;
    h->routes[h->nroutes++] = (gps_route){methods, pattern, d, role, fn, arg};
    return 0;
}

int gps_http_add_routes(gps_http *h, const gps_route *table, size_t n, void *arg)
{
    for (size_t i = 0; i < n; i++)
        if (gps_http_add_route(h, table[i].methods, table[i].pattern, table[i].dialect,
                               table[i].role, table[i].fn, arg) < 0)
            return -1;
    return 0;
}

void gps_http_set_auth(gps_http *h, gps_auth_fn fn, void *arg)
{
    h->auth = fn;
    h->auth_arg = arg;
}

void gps_http_set_admit(gps_http *h, gps_admit_fn fn, void *arg)
{
    h->admit = fn;
    h->admit_arg = arg;
}

void gps_http_set_home_check(gps_http *h, bool (*fn)(void *arg), void *arg)
{
    h->home = fn;
    h->home_arg = arg;
}

/* The port a bound socket really got (port 0 asks for an ephemeral one). */
static int bound_port_of(struct evhttp_bound_socket *b, int port, int *bound_port, char *err,
                         size_t errlen)
{
    evutil_socket_t fd = evhttp_bound_socket_get_fd(b);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
        snprintf(err, errlen, "getsockname failed");
        return -1;
    }
    if (ss.ss_family == AF_INET)
        *bound_port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    else if (ss.ss_family == AF_INET6)
        *bound_port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    else
        *bound_port = port;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Out of descriptors: pause accepting                                 */
/* ------------------------------------------------------------------ */

/* libevent retries a failed accept() at once while the listening socket
 * stays readable: with EMFILE/ENFILE that is a busy loop (issue 9, finding
 * 6: 76 % CPU, 2.95 M log lines in 7 s, /health unanswered). The listener
 * pauses for ACCEPT_PAUSE_MS instead (the kernel keeps new connections in
 * the backlog meanwhile) and the log says so at most once per
 * ACCEPT_LOG_MS, with the count of pauses it did not log. */
#define ACCEPT_PAUSE_MS 100
#define ACCEPT_LOG_MS 10000

static void accept_resume(evutil_socket_t fd, short what, void *arg)
{
    accept_pause *p = arg;
    if (p->lev && !p->h->mem_paused) /* memory low: mem_resume enables it */
        evconnlistener_enable(p->lev);
}

/* Our listeners' user data is the evhttp (evhttp_bind_socket sets it): find
 * the pause record by listener among the gps_https that asked for it. */
static accept_pause *pause_of(struct evconnlistener *lev, void *evh);

static void accept_error(struct evconnlistener *lev, void *evh)
{
    int e = EVUTIL_SOCKET_ERROR();
    accept_pause *p = pause_of(lev, evh);
    if (!p)
        return;
    evconnlistener_disable(lev);
    struct timeval tv = {0, ACCEPT_PAUSE_MS * 1000};
    event_add(p->resume, &tv);
    uint64_t now = gp_now_mono_ms();
    if (p->last_log_ms && now - p->last_log_ms < ACCEPT_LOG_MS) {
        p->suppressed++;
        return;
    }
    gp_log_write(GP_LOG_WARN, "accept_failed", NULL,
                 json_pack("{s:s,s:i,s:k}", "error", strerror(e), "pause_ms", ACCEPT_PAUSE_MS,
                           "suppressed", p->suppressed),
                 "accept failed (%s): not accepting for %d ms; %lu more such pauses since the "
                 "last line",
                 strerror(e), ACCEPT_PAUSE_MS, p->suppressed);
    p->last_log_ms = now;
    p->suppressed = 0;
}

static accept_pause *pause_of(struct evconnlistener *lev, void *evh)
{
    for (size_t i = 0; i < sizeof pause_owners / sizeof pause_owners[0]; i++) {
        gps_http *h = pause_owners[i];
        for (int k = 0; h && k < 2; k++)
            if (h->pause[k].lev == lev)
                return &h->pause[k];
    }
    (void)evh;
    return NULL;
}

static void pause_setup(gps_http *h, int k, struct evhttp_bound_socket *b)
{
    accept_pause *p = &h->pause[k];
    p->h = h;
    p->lev = evhttp_bound_socket_get_listener(b);
    if (!p->resume)
        p->resume = evtimer_new(h->base, accept_resume, p);
    if (!p->lev || !p->resume)
        return;
    size_t i = 0;
    while (i < sizeof pause_owners / sizeof pause_owners[0] && pause_owners[i] &&
           pause_owners[i] != h)
        i++;
    if (i == sizeof pause_owners / sizeof pause_owners[0])
        return; /* more servers than any process of ours runs: default handling */
    pause_owners[i] = h;
    evconnlistener_set_error_cb(p->lev, accept_error);
}

static void pause_forget(gps_http *h, int k)
{
    h->pause[k].lev = NULL;
    if (h->pause[k].resume)
        event_del(h->pause[k].resume);
}

static void set_nodelay(evutil_socket_t fd)
{
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
        gp_log_warn("tcp_nodelay", "cannot set TCP_NODELAY on the listener: %s",
                    strerror(errno));
}

int gps_http_bind(gps_http *h, const char *host, int port, int *bound_port, char *err,
                  size_t errlen)
{
    h->bound = evhttp_bind_socket_with_handle(h->evh, host, (ev_uint16_t)port);
    if (!h->bound) {
        snprintf(err, errlen, "cannot listen on %s:%d", host, port);
        return -1;
    }
    pause_setup(h, 0, h->bound);
    /* A stream is many small writes (one SSE event each); with Nagle on,
     * each write after the first waits for the peer's delayed ACK (~40 ms)
     * whenever one is unacknowledged: a 64-token reply took 44 ms instead
     * of 4. Accepted sockets inherit TCP_NODELAY from the listener. */
    set_nodelay(evhttp_bound_socket_get_fd(h->bound));
    return bound_port_of(h->bound, port, bound_port, err, errlen);
}

/* evhttp's bufferevent hook for the HTTPS listener: every accepted
 * connection gets a server-side TLS bufferevent (evhttp sets the fd
 * afterwards). If this returns NULL, libevent 2.1 falls back to a plain
 * socket bufferevent: only on allocation failure, and the client's
 * ClientHello then fails to parse as HTTP (a 400, nothing decrypted). */
static struct bufferevent *tls_bevcb(struct event_base *base, void *arg)
{
    gps_http *h = arg;
    SSL *ssl = SSL_new(gps_tls_ctx(h->tls));
    if (!ssl)
        return NULL;
    struct bufferevent *bev = bufferevent_openssl_socket_new(
        base, -1, ssl, BUFFEREVENT_SSL_ACCEPTING, BEV_OPT_CLOSE_ON_FREE);
    if (!bev) {
        SSL_free(ssl);
        return NULL;
    }
    /* Many clients close without close_notify; treat that as a plain EOF
     * rather than an error (HTTP framing already delimits every message). */
    bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    return http_gate_bev(h, bev, true);
}

int gps_http_bind_tls(gps_http *h, const char *host, int port, gps_tls *tls, int *bound_port,
                      char *err, size_t errlen)
{
    if (!h->evh_tls) {
        h->evh_tls = evhttp_new(h->base);
        if (!h->evh_tls) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        evhttp_setup(h, h->evh_tls);
        evhttp_set_bevcb(h->evh_tls, tls_bevcb, h);
    }
    h->tls = tls;
    h->bound_tls = evhttp_bind_socket_with_handle(h->evh_tls, host, (ev_uint16_t)port);
    if (!h->bound_tls) {
        snprintf(err, errlen, "cannot listen (TLS) on %s:%d", host, port);
        return -1;
    }
    pause_setup(h, 1, h->bound_tls);
    /* TLS sends a reply as several records (one per write of the
     * bufferevent), i.e. several small segments: with Nagle on, the second
     * waits for the client's delayed ACK (~40 ms per request). Accepted
     * sockets inherit TCP_NODELAY from the listener on Linux. */
    set_nodelay(evhttp_bound_socket_get_fd(h->bound_tls));
    return bound_port_of(h->bound_tls, port, bound_port, err, errlen);
}

void gps_http_stop_accepting(gps_http *h)
{
    if (h->bound) {
        pause_forget(h, 0);
        evhttp_del_accept_socket(h->evh, h->bound);
        h->bound = NULL;
    }
    if (h->bound_tls) {
        pause_forget(h, 1);
        evhttp_del_accept_socket(h->evh_tls, h->bound_tls);
        h->bound_tls = NULL;
    }
}

struct evhttp *gps_http_evhttp(gps_http *h)
{
    return h->evh;
}

size_t gps_http_max_body(const gps_http *h)
{
    return h->opts.max_body_bytes;
}

int gps_http_idle_timeout(const gps_http *h)
{
    return h->opts.idle_timeout_sec;
}
