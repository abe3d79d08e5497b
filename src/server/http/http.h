/*
 * http: listeners, the routing table, request limits and error replies in
 * the dialect of each endpoint.
 *
 * Handler contract (as in libevent's sample): a handler must eventually call
 * evhttp_send_reply / evhttp_send_error / gps_http_send_* on its request, or
 * take the chunked path (evhttp_send_reply_start ... _end). It may do so
 * later (long-poll, streaming): then it must watch the connection's close
 * callback, because the request is freed by evhttp when the peer goes away.
 *
 * Every response carries X-Correlation-Id (taken from the request when it is
 * a sane token, otherwise generated) and X-Content-Type-Options: nosniff,
 * except those on the agents' own routes (/agents/... but enroll and check),
 * whose reader is the agent, not a client or a browser.
 *
 * Error shapes:
 *   native    {"error":{"code":"STABLE_CODE","message":"...","correlation_id":"..."}}
 *   openai    {"error":{"message":"...","type":"invalid_request_error","param":..,"code":".."}}
 *   anthropic {"type":"error","error":{"type":"invalid_request_error","message":"..."}}
 */
#ifndef GPS_HTTP_H
#define GPS_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>
#include <event2/http.h>
#include <jansson.h>

typedef struct gps_tls gps_tls; /* server/tls.h */

typedef enum { GPS_DIALECT_NATIVE = 0, GPS_DIALECT_OPENAI, GPS_DIALECT_ANTHROPIC } gps_dialect;

/* Who may call a route. The http layer checks the Bearer key (via the auth
 * hook) before calling the handler. */
typedef enum {
    GPS_ROLE_NONE = 0,  /* public: /health, /metrics */
    GPS_ROLE_CLIENT,
    GPS_ROLE_AGENT,
    GPS_ROLE_ADMIN,
} gps_role;

#define GPS_ROUTE_MAX_PARAMS 4
/* Pools of pools (issue 25): every pool a request passes through appends
 * its id (16 hex) to X-Pool-Via, which an agent whose upstream is a pool
 * passes on. A request that names this pool already (a loop: an agent's
 * upstream leads back into a pool it came through) or passed through more
 * than GPS_POOL_MAX_HOPS pools is refused at the head (508 POOL_LOOP). */
#define GPS_POOL_MAX_HOPS 4
#define GPS_POOL_VIA_MAX 128
#define GPS_ROUTE_PARAM_MAX 128

typedef struct gps_http gps_http;
typedef struct gps_req gps_req;
typedef void (*gps_handler_fn)(gps_req *r, void *arg);

typedef struct gps_route {
    unsigned methods;       /* EVHTTP_REQ_* mask */
    const char *pattern;    /* "/agents/jobs/{id}/events": {x} matches one segment */
    gps_dialect dialect;
    gps_role role;
    gps_handler_fn fn;
    void *arg;
} gps_route;

/* Per-request context, valid only during the handler call (it lives on the
 * stack of the dispatcher): copy what outlives it. */
struct gps_req {
    struct evhttp_request *req;
    gps_http *http;
    const gps_route *route;
    unsigned method;
    const char *path;                 /* decoded path without query */
    char correlation_id[65];
    char key_id[65];                  /* id of the key that authenticated ("" when auth off) */
    char params[GPS_ROUTE_MAX_PARAMS][GPS_ROUTE_PARAM_MAX];
    int nparams;
    uint64_t start_us;                /* gp_now_mono_us() when dispatched */
    char pool_via[GPS_POOL_VIA_MAX];  /* X-Pool-Via of the request + this pool's id */
};

/* Auth hook: decide whether `credential` may use a route of `role`.
 * credential is the Authorization header value ("Bearer ...") or, for the
 * Anthropic dialect, the x-api-key value; NULL when absent. Return 0 and
 * fill key_id (may be "") to allow, or the HTTP status to refuse with
 * (401, 403). Installed by main; without one every request is allowed. */
/* client: the request's client address for logs: the peer's IP, or, when
 * the peer is one of opts.trusted_proxies, the nearest untrusted address of
 * its X-Forwarded-For ("?" when unknown). */
typedef int (*gps_auth_fn)(void *arg, const char *credential, gps_role role, char key_id[65],
                           const char *client);

/* Limits (0 = no limit for the last three). See docs/operations.md,
 * "Limits and hostile peers". */
typedef struct gps_http_opts {
    size_t max_body_bytes;
    size_t max_header_bytes;
    int idle_timeout_sec;
    size_t max_inflight_body_bytes; /* body bytes being received, all connections */
    int header_timeout_sec;         /* whole request head, from its first byte */
    int body_timeout_sec;           /* whole body, from the end of the head */
    /* A request without credentials (a route of role NONE: enrollment) may
     * send at most this body (0: 65536), and such bodies together take at
     * most a quarter of max_inflight_body_bytes: the rest is reserved for
     * agents and clients whose key was checked at the head. */
    size_t max_unauth_body_bytes;
    /* Comma-separated IP addresses of reverse proxies whose X-Forwarded-For
     * is believed for the client address in logs (borrowed; NULL or "":
     * none, the peer's address is the client's). */
    const char *trusted_proxies;
} gps_http_opts;
/* One peer address may have this many max_unauth_body_bytes in flight in
 * requests without credentials (a peer cannot take the whole quarter). */
#define GPS_HTTP_PEER_UNAUTH_BODIES 4

/* New server on base. Returns NULL on allocation failure. */
gps_http *gps_http_new(struct event_base *base, const gps_http_opts *opts);
void gps_http_free(gps_http *h);
/* Add a route (the pattern string must outlive h). 0 or -1 when the table is full. */
int gps_http_add_route(gps_http *h, unsigned methods, const char *pattern, gps_dialect d,
                       gps_role role, gps_handler_fn fn, void *arg);
/* Every route of a table (a dialect's routes), each with arg instead of
 * the table's (NULL) arg. 0 or -1. */
int gps_http_add_routes(gps_http *h, const gps_route *table, size_t n, void *arg);
void gps_http_set_auth(gps_http *h, gps_auth_fn fn, void *arg);
/* Admission of new work (a POST on a client route: a completion, a
 * message, a task...): fn returns 0 to admit, or the seconds to wait,
 * with the reason in msg; the request is then answered 503 SERVER_BUSY in
 * its dialect with Retry-After (the server's lease on its database
 * expired: server/cluster.h). Other routes (agents, admin, reads) always
 * pass. NULL fn: everything is admitted. */
typedef int (*gps_admit_fn)(void *arg, char *msg, size_t msglen);
void gps_http_set_admit(gps_http *h, gps_admit_fn fn, void *arg);
/* Home mode (auth off: loopback listeners and no key) asked per request:
 * while fn(arg) is true, a browser page from elsewhere must not be able to
 * use the API (cross-site requests, DNS rebinding). Such requests are
 * refused at the head: a Host that is not a loopback name or address, an
 * Origin other than the server's own (http or https + the Host), and a
 * body whose Content-Type is not application/json. */
void gps_http_set_home_check(gps_http *h, bool (*fn)(void *arg), void *arg);
/* Bind host:port (port 0 = ephemeral). *bound_port receives the real port.
 * 0 or -1 with a message in err. */
int gps_http_bind(gps_http *h, const char *host, int port, int *bound_port, char *err,
                  size_t errlen);
/* HTTPS listener on host:port with the TLS context of tls (borrowed; it
 * must outlive h; a reload of tls applies to new connections). Same routes,
 * limits, auth and peer-close watch as the HTTP listener; both may run
 * together, and gps_http_bind need not be called at all. 0 or -1 with err. */
int gps_http_bind_tls(gps_http *h, const char *host, int port, gps_tls *tls, int *bound_port,
                      char *err, size_t errlen);
/* Stop accepting new connections (SIGTERM) on both listeners; open ones
 * keep working. */
void gps_http_stop_accepting(gps_http *h);
/* While shutting down, client routes answer 503 SHUTTING_DOWN (agent
 * routes keep working so running streams can finish). */
void gps_http_set_shutting_down(gps_http *h, bool on);
/* The plain-HTTP evhttp (the HTTPS one is internal). */
struct evhttp *gps_http_evhttp(gps_http *h);
size_t gps_http_max_body(const gps_http *h);
int gps_http_idle_timeout(const gps_http *h);

/* Pure route lookup (exposed for tests). Returns 0 and the route, 404 when
 * no pattern matches the path, 405 when a pattern matches but not the
 * method (*out then points at that route, for its dialect). */
int gps_route_lookup(const gps_route *routes, size_t n, unsigned method, const char *path,
                     const gps_route **out, char params[][GPS_ROUTE_PARAM_MAX], int *nparams);
/* The request gate (issue 9). Every byte a peer sends passes through a
 * per-connection gate before evhttp sees it: the gate holds the request
 * head back until it is complete, checks it (strict HTTP/1.1 framing,
 * origin-form normalised target, route, method, credentials, declared
 * length, the global cap on body bytes in flight) and hands evhttp either
 * a canonical copy of it or, when the request is refused, a bodiless
 * stand-in whose dispatch sends the refusal in the route's dialect. Bodies
 * pass through counted (chunked ones re-framed without extensions or
 * trailers). So nothing of a refused request's body is ever buffered.
 *
 * Pure head check (exposed for tests): parse the head (request line and
 * header lines, CRLF-terminated, without the final empty line) into out.
 * Returns 0, or the HTTP status to refuse with (400, 501) and a message. */
typedef struct gps_head {
    unsigned method;           /* EVHTTP_REQ_*; 0 for an unknown method */
    char method_name[16];
    char target[2048];         /* as sent (origin-form, checked) */
    int minor;                 /* HTTP/1.x */
    long long content_length;  /* -1 when absent */
    bool chunked;
    bool has_auth, has_api_key;
    char auth[512];            /* Authorization, trimmed ("" when blank) */
    char api_key[512];         /* x-api-key, trimmed */
    char corr[65];             /* X-Correlation-Id when sane, else "" */
    bool has_host, has_origin, has_ctype;
    char host[256];            /* Host (trimmed; "" when longer) */
    char origin[256];          /* Origin (trimmed; "" when longer) */
    char ctype[128];           /* Content-Type (trimmed; "" when longer) */
    bool has_via;
    char via[GPS_POOL_VIA_MAX];  /* X-Pool-Via (trimmed; "" when longer) */
    char xff[256];             /* the last X-Forwarded-For, trimmed ("" when absent) */
    char *canon;               /* the head as evhttp will see it (with CRLFCRLF), NUL-ended */
    size_t canon_len;
} gps_head;
/* canon: the caller's buffer of canon_cap bytes for out->canon; 2 * len +
 * 64 always suffices (one byte per header line is added at most). */
int gps_http_head_parse(const char *head, size_t len, gps_head *out, char *canon,
                        size_t canon_cap, char *msg, size_t msglen);
/* Whether a request target's path is normalised origin-form: starts with
 * "/", no empty segment ("//"), no "." or ".." segment, no control, space
 * or non-ASCII byte. The query is not examined beyond those bytes. */
bool gps_http_target_ok(const char *target);
/* Bytes of request bodies being received right now (all connections). */
size_t gps_http_inflight_bytes(const gps_http *h);

/* Dialect of a path that matched no route: paths under /v1 are OpenAI (the
 * Anthropic messages endpoints excepted), others native. */
gps_dialect gps_dialect_for_path(const char *path);

/* ---- peer-close detection for held requests ----
 *
 * evhttp stops reading a connection once a request is read, so a client
 * that goes away while its request is held (queued job, parked long-poll,
 * stream waiting for its next token) is only noticed at the next write. A
 * watch puts a read event on the socket and peeks: on EOF or a socket error
 * it frees the evhttp connection, which runs the connection's close
 * callback (evhttp_connection_set_closecb) and frees the request. Data
 * from the peer (a pipelined request) is never consumed: the watch then
 * waits edge-triggered for the peer's FIN or reset behind it (a
 * half-close counts as gone, as the EOF does), on a duplicate of the
 * socket; without epoll's edge-triggered and early-close support it stops.
 * Free the watch before replying, and from the close callback. */
typedef struct gps_conn_watch gps_conn_watch;
/* NULL when the request has no connection or on ENOMEM. */
gps_conn_watch *gps_http_watch_close(struct evhttp_request *req);
void gps_conn_watch_free(gps_conn_watch *w);
/* Call from a connection close callback for a request whose reply was not
 * finished. When evhttp itself saw the failure it detached the request
 * from the connection and left it to us (libevent 2.1: the request
 * survives until the user completes it); free it then. When the
 * connection is being freed with the request still attached, evhttp frees
 * it and this does nothing. Never touch req afterwards. */
void gps_http_drop_request(struct evhttp_request *req);

/* ---- replies ----
 * HEAD: every reply helper below answers a HEAD request with the headers a
 * GET would get (Content-Length included) and no body; a HEAD request is
 * routed to the GET handler of its path. */

/* Add the Date header evhttp would add to the reply (the same bytes:
 * evutil_date_rfc1123 of the current second), unless it has one, from a
 * cache renewed once a second: evhttp formats it afresh for every reply
 * (~12,000 instructions a request, issue 24). Each path that starts a
 * reply calls it last before its send, so the header keeps the place
 * evhttp gave it. An HTTP/1.0 reply gets one too (RFC 9110 lets any
 * reply carry Date; evhttp added it to HTTP/1.1 replies only). */
void gps_http_add_date(struct evhttp_request *req);

/* evhttp_send_reply for handlers that build their own body (borrowed). */
void gps_http_send_reply(struct evhttp_request *req, int status, const char *reason,
                         struct evbuffer *body);

/* Reply with a JSON body (reference stolen). A NULL body (its builder ran
 * out of memory) or one that cannot be rendered or copied is answered
 * 500 with an "out of memory" error instead of status: never a success
 * without its body. */
int gps_http_send_json(struct evhttp_request *req, int status, json_t *body);
/* That 500's body: a fixed text that every dialect's clients read as an
 * error (error.code and error.message, type "error" and error.type). A
 * stream's error event that cannot be built sends it too (relay.c). */
extern const char gps_http_oom_body[];
/* Send n bytes of JSON text (borrowed) rendered by the caller (500 as
 * above when it cannot be copied). Both return 0 when the body went out
 * with status, -1 when the 500 went instead (a caller that must know
 * whether its reply reached the peer: agents_api's poll). */
int gps_http_send_json_text(struct evhttp_request *req, int status, const char *text, size_t n);
/* Send an error in dialect d (body: errors.h, gps_error_body). */
void gps_http_send_error(struct evhttp_request *req, gps_dialect d, int status,
                         const char *code, const char *message, const char *param,
                         const char *correlation_id, json_t *extra);
/* Same, using r's dialect and correlation id. */
void gps_req_error(gps_req *r, int status, const char *code, const char *message,
                   const char *param);

/* The request body as a NUL-terminated string (new, caller frees), or NULL
 * when empty or on allocation failure. *len receives the length. */
char *gps_req_body(struct evhttp_request *req, size_t *len);
/* Parse the body as a JSON object. On failure sends 400 (or 413) in r's
 * dialect, or 500 INTERNAL "out of memory" when the server could not copy
 * or read it (gp_json_load_checked), and returns NULL. New reference. */
json_t *gps_req_json(gps_req *r);
/* Header lookup on the request (borrowed, NULL when absent). */
const char *gps_req_header(gps_req *r, const char *name);
void gps_req_add_header(gps_req *r, const char *name, const char *value);

#endif
