/*
 * fixture_agents_http: a real agents_api on a real gps_http bound to
 * loopback, over a real registry, scheduler and jobs (fixture_fleet.h),
 * for the sweeps that fail allocations while the server handles a request
 * (test_agents_poll_oom.c, test_agents_work_oom.c, test_http_early_oom.c,
 * test_http_evmem_oom.c);
 * the client is plain sockets.
 *
 * The failing allocator itself stays in each test (fixture_oom.h is
 * header-only, its state per file): a test hands its arm function to
 * agents_http_start, and the auth hook calls it with arm_at, so that the
 * failures start at the request's handling, past the HTTP gate's own.
 * Nothing here allocates while a reply is awaited (fixed storage), so the
 * sweep counts the server's allocations alone. Failures are cmocka
 * assertions (the caller's test stops there).
 */
#ifndef FIXTURE_AGENTS_HTTP_H
#define FIXTURE_AGENTS_HTTP_H

#include <stddef.h>

#include <event2/event.h>

#include "fixture_fleet.h"
#include "server/agents_api.h"
#include "server/http/http.h"

#define AGENTS_HTTP_AGENT "00000000-0000-4000-8000-000000000001"
/* Agent AGENTS_HTTP_AGENT's poll: model m1, two slots. */
#define AGENTS_HTTP_POLL_BODY                                                                  \
    "{\"agent_id\":\"" AGENTS_HTTP_AGENT "\",\"name\":\"a1\",\"models\":[{\"id\":\"m1\"}],"   \
    "\"slots\":{\"total\":2}}"

/* How a wait for a reply ended, when not with a whole reply's status:
 * the server closed the connection, or nothing came within the rounds. */
enum { AGENTS_HTTP_CLOSED = -1, AGENTS_HTTP_NONE = 0 };

typedef struct agents_http {
    struct event_base *base;
    fleet f;
    gps_agents *g;
    gps_http *h;
    int port;
    int c; /* the agent's connection for the next poll (agents_http_poll's) */
    /* The auth hook (every key allowed) calls arm(arm_at) when both are
     * set, then clears arm_at: one request armed. */
    void (*arm)(size_t n);
    size_t arm_at;
} agents_http;

/* The run a sweep is at, named when a pass of the event loop does not
 * return (a callback that spins: the process exits 1 after 10 s). */
extern size_t agents_http_run;

/* Start the server; arm may be NULL (a test that arms by itself). */
void agents_http_start(agents_http *s, void (*arm)(size_t n));
void agents_http_stop(agents_http *s);

/* A new connection (made before the sweep is armed). */
int agents_http_connect(agents_http *s);
/* s->c closed if open, and a new connection in its place. */
void agents_http_reconnect(agents_http *s);
/* All of bytes sent on c. */
void agents_http_send(int c, const char *bytes, size_t n);
/* POST path with a JSON body on c. */
void agents_http_send_post(int c, const char *path, const char *body);
/* One pass of the event loop, none blocking, watched by the alarm. */
void agents_http_turn(agents_http *s);

/* The reply on c within rounds turns of the loop (about a millisecond
 * each): its status, its body into *body (within out); or
 * AGENTS_HTTP_CLOSED / AGENTS_HTTP_NONE, *body then out (what came). A
 * reply without Content-Length (204) ends with its head. */
int agents_http_reply(agents_http *s, int c, char *out, size_t cap, const char **body,
                      int rounds);
/* POST /agents/poll (AGENTS_HTTP_POLL_BODY) on s->c: its reply as
 * agents_http_reply. */
int agents_http_poll(agents_http *s, char *out, size_t cap, const char **body, int rounds);

/* Run n of a sweep's poll ended with st (its reply in out): a 500 counted
 * in *failed, a closed connection in *closed (the same counter may serve
 * both), a 200 passed, anything else (no reply on a connection left open,
 * another status) a problem, printed. Then the server goes on: the next
 * poll, on a new connection, is answered 200 within rounds. Returns the
 * problems. */
size_t agents_http_poll_then_next(agents_http *s, size_t n, int st, char *out, size_t cap,
                                  int rounds, size_t *failed, size_t *closed);

#endif
