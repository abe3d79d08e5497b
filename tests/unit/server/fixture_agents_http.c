/* fixture_agents_http.h: the server and its plain-socket client. */
#include "fixture_agents_http.h"

#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

size_t agents_http_run;

/* Set around each event_base_loop pass: the alarm tells a callback that
 * spins from a test stuck elsewhere. */
static volatile sig_atomic_t in_loop;

static void on_alarm(int sig)
{
    (void)sig;
    char msg[128];
    int n = snprintf(msg, sizeof msg, "run %zu: the event loop did not return (%s)\n",
                     agents_http_run, in_loop ? "spinning in a callback" : "in the test");
    if (n > 0)
        (void)!write(2, msg, (size_t)n);
    _exit(1);
}

/* Every key allowed; arms the sweep when the test asked for it, so that
 * its failures start at the request's handling, past the HTTP gate's own. */
static int auth_arming(void *arg, const char *credential, gps_role role, char key_id[65],
                       const char *client)
{
    agents_http *s = arg;
    (void)credential, (void)role, (void)client;
    key_id[0] = '\0';
    if (s->arm && s->arm_at)
        s->arm(s->arm_at);
    s->arm_at = 0;
    return 0;
}

void agents_http_start(agents_http *s, void (*arm)(size_t n))
{
    memset(s, 0, sizeof *s);
    signal(SIGALRM, on_alarm);
    s->arm = arm;
    s->base = event_base_new();
    assert_non_null(s->base);
    gps_agents_opts ao = {.poll_interval_sec = 15, .work_wait_sec = 25,
                          .agent_timeout_sec = 90, .disconnect_grace_ms = 1000};
    s->g = gps_agents_new(s->base, &ao, NULL, NULL);
    assert_non_null(s->g);
    registry_config rc;
    registry_config_default(&rc);
    rc.listener = gps_agents_on_transition;
    rc.listener_ud = s->g;
    fleet_init_on(&s->f, s->base, NULL, &rc, NULL);
    assert_int_equal(gps_agents_attach(s->g, s->f.reg, s->f.s, s->f.jobs), 0);
    gps_http_opts o = {.max_body_bytes = 1 << 20, .max_header_bytes = 1 << 16,
                       .idle_timeout_sec = 30, .max_inflight_body_bytes = 1 << 24,
                       .header_timeout_sec = 30, .body_timeout_sec = 30};
    s->h = gps_http_new(s->base, &o);
    assert_non_null(s->h);
    assert_int_equal(gps_agents_register(s->h, s->g), 0);
    gps_http_set_auth(s->h, auth_arming, s);
    char err[128];
    assert_int_equal(gps_http_bind(s->h, "127.0.0.1", 0, &s->port, err, sizeof err), 0);
    s->c = -1;
}

void agents_http_stop(agents_http *s)
{
    if (s->c >= 0)
        close(s->c);
    gps_http_free(s->h);
    gps_agents_free(s->g);
    fleet_free(&s->f);
    event_base_free(s->base);
}

int agents_http_connect(agents_http *s)
{
    int c = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(c >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(c, (struct sockaddr *)&a, sizeof a), 0);
    return c;
}

void agents_http_reconnect(agents_http *s)
{
    if (s->c >= 0)
        close(s->c);
    s->c = agents_http_connect(s);
}

void agents_http_send(int c, const char *bytes, size_t n)
{
    assert_int_equal(send(c, bytes, n, 0), (ssize_t)n);
}

void agents_http_send_post(int c, const char *path, const char *body)
{
    char req[512];
    int n = snprintf(req, sizeof req,
                     "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n%s",
                     path, strlen(body), body);
    assert_true(n > 0 && (size_t)n < sizeof req);
    agents_http_send(c, req, (size_t)n);
}

void agents_http_turn(agents_http *s)
{
    alarm(10);
    in_loop = 1;
    event_base_loop(s->base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    in_loop = 0;
    alarm(0);
}

int agents_http_reply(agents_http *s, int c, char *out, size_t cap, const char **body,
                      int rounds)
{
    size_t got = 0;
    out[0] = '\0';
    *body = out;
    for (int round = 0; round < rounds; round++) {
        agents_http_turn(s);
        ssize_t k = recv(c, out + got, cap - 1 - got, MSG_DONTWAIT);
        if (k > 0) {
            got += (size_t)k;
            out[got] = '\0';
        }
        const char *end = strstr(out, "\r\n\r\n"), *cl = strstr(out, "Content-Length: ");
        if (end && (!cl || got >= (size_t)(end + 4 - out) + strtoul(cl + 16, NULL, 10))) {
            *body = end + 4;
            return (int)strtol(out + 9, NULL, 10);
        }
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
            return AGENTS_HTTP_CLOSED;
        if (k < 0)
            usleep(1000);
    }
    return AGENTS_HTTP_NONE;
}

int agents_http_poll(agents_http *s, char *out, size_t cap, const char **body, int rounds)
{
    agents_http_send_post(s->c, "/agents/poll", AGENTS_HTTP_POLL_BODY);
    return agents_http_reply(s, s->c, out, cap, body, rounds);
}

size_t agents_http_poll_then_next(agents_http *s, size_t n, int st, char *out, size_t cap,
                                  int rounds, size_t *failed, size_t *closed)
{
    size_t bad = 0;
    if (st == 500) {
        (*failed)++;
    } else if (st == AGENTS_HTTP_CLOSED) {
        (*closed)++;
    } else if (st != 200) {
        print_message("run %zu: the poll %s%d: %.300s\n", n,
                      st == AGENTS_HTTP_NONE ? "got no reply and was not closed " : "answered ",
                      st, out);
        bad++;
    }
    agents_http_reconnect(s);
    const char *body;
    st = agents_http_poll(s, out, cap, &body, rounds);
    if (st != 200) {
        print_message("run %zu: the next poll answered %d: %.300s\n", n, st, out);
        bad++;
    }
    return bad;
}
